/*
 * cpu_train_f32.c: the float32 training kernels, the instance of
 * cpu_train.inc for float (kc_bias_add, kc_relu_forward, ...,
 * kc_adamw_update_d; see cpu_kernels.h), and the float32-only entries that
 * sit on the same machinery: kc_sum, kc_adamw_update (float
 * hyperparameters), the optimizers' flush-to-zero switch and kc_zero. The
 * per-type pieces make these loops vectorize and match the GPU: GELU, tanh
 * and sigmoid are kernels/common/km_act.h's inlined polynomial exp (the cuda
 * kernels evaluate the same code, so both give the same bits), the loss rows
 * use libm's accurate expf (for a small class count the (B, C) matrix is
 * tiny next to the GEMMs), and the optimizer updates run with subnormals
 * flushed (cpu_internal.h, kc_ftz_begin).
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"
#include "../common/km_optim.h"

#include <math.h>
#include <string.h>

#define KC_T float
#define KC_LIT(x) x##f
#define KC_BITS uint32_t
#define KC_EXP_MASK 0x7f800000u
#define KC_PUB(name) name
#define KC_ADAMW_UPDATE kc_adamw_update_d
#define KC_SGD_COEF km_sgd_coef_f32
#define KC_SGD_COEF_MAKE km_sgd_coef_f32_make
#define KC_ADAMW_COEF km_adamw_coef_f32
#define KC_ADAMW_COEF_MAKE km_adamw_coef_f32_make
#define KC_OPT_FTZ 1

/* The activations: kernels/common/km_act.h, shared with the cuda kernels. */
static KC_ALWAYS_INLINE float kc_t_gelu(float x) { return km_gelu(x); }
static KC_ALWAYS_INLINE float kc_t_gelu_grad(float x) { return km_gelu_grad(x); }
static KC_ALWAYS_INLINE float kc_t_tanh(float x) { return km_tanh(x); }
static KC_ALWAYS_INLINE float kc_t_tanh_grad(float x) { return km_tanh_grad(x); }
static KC_ALWAYS_INLINE float kc_t_sigmoid(float x) { return km_sigmoid(x); }
static KC_ALWAYS_INLINE float kc_t_sigmoid_grad(float x) { return km_sigmoid_grad(x); }

static KC_ALWAYS_INLINE float kc_t_exp(float x) { return expf(x); }
static KC_ALWAYS_INLINE float kc_t_sqrt(float x) { return sqrtf(x); }

/* p: (C) *= 1 / denom, the reciprocal rounded to float once: a multiply per
 * logit instead of a division. */
static KC_ALWAYS_INLINE void kc_t_xent_normalize(float *restrict p, size_t C, double denom) {
    const float inv = (float)(1.0 / denom);
    for (size_t j = 0; j < C; j++) p[j] *= inv;
}

#include "cpu_train.inc"

/* x: (n), summed in double. float32 only: the kernel table's sum entry has no
 * float64 form (the reduction itself is cpu_train.inc's, for both types). */
double kc_sum(const float *x, size_t n) { return kc_reduce(x, n, KC_RED_SUM); }

void kc_adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                     float eps, float weight_decay, int64_t step) {
    kc_adamw_update_d(p, g, m, v, n, (double)lr, (double)beta1, (double)beta2, (double)eps, (double)weight_decay,
                      step);
}

int kc_flush_denormal_on = 1;
void kc_set_flush_denormal(int on) { kc_flush_denormal_on = on != 0; }

/* memset split across the pool: zero_grad clears every gradient each step
 * (7.4 MB for 784-1024-1024-10), and one core's memset does not saturate the
 * memory system. Units are bytes; parts start on cache lines. */
static void kc_zero_range(void *vc, size_t b0, size_t b1) { memset((unsigned char *)vc + b0, 0, b1 - b0); }

void kc_zero(void *p, size_t bytes) {
    if (bytes) kc_parallel_for(bytes, KC_GRAIN_STREAM * sizeof(float), 64, kc_zero_range, p);
}
