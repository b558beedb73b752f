/*
 * test_kernels_dtype.c — pins the exact output bits of every CPU kernel that
 * exists in both float32 and float64 (bias add and gradient, ReLU, GELU,
 * tanh, sigmoid and leaky ReLU forward/backward in and out of place, fused
 * softmax + cross-entropy forward/backward, sum / sum of squares /
 * finiteness, scale, axpy, the SGD option sets and AdamW), so that the two
 * dtypes can be generated from one source without changing a bit. Each case
 * runs on fixed pseudo-random inputs (with NaN, infinities, -0, subnormals
 * and huge values sprinkled through the activations' inputs, subnormals
 * through the optimizer state so the flush-to-zero choice shows), at sizes
 * from 1 to past the point where loops split across the pool, and folds every
 * output into a 64-bit FNV-1a digest. The digests must agree at 1, 2, 3 and 5
 * threads and equal the ones recorded in `golden` below from the code before
 * the merge (x86-64, glibc 2.36; the activations' digests fold every NaN to
 * one pattern, so gcc and clang builds agree). Cases whose bits also depend on libm (exp,
 * expf, log, tanh, pow) are compared with the record only when a fingerprint
 * of this libm matches the recorded one; on another libm they print a note
 * and check the thread agreement alone. KILN_DTYPE_DIGEST_PRINT=1 prints the
 * table to paste when a change of bits is intended.
 */
#include "cpu_kernels.h"

#include <CUnit/CUnit.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- helpers */

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

/* FNV-1a over the bytes of p (n bytes), continuing from *h. */
static void dg_bytes(uint64_t *h, const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t x = *h;
    for (size_t i = 0; i < n; i++) {
        x ^= b[i];
        x *= FNV_PRIME;
    }
    *h = x;
}

/* FNV-1a over n float or double values (esz 4 or 8) with every NaN as the
 * one quiet pattern: kiln promises that NaN propagates, not its sign or
 * payload, which follow the operand order a compiler picks (gelu'(NaN) is
 * +NaN from gcc and -NaN from clang, the same instructions otherwise). */
static void dg_vals(uint64_t *h, const void *p, size_t n, size_t esz) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++, b += esz) {
        int nan;
        if (esz == 4) {
            float f;
            memcpy(&f, b, 4);
            nan = isnan(f);
        } else {
            double d;
            memcpy(&d, b, 8);
            nan = isnan(d);
        }
        static const unsigned char qnan4[4] = {0, 0, 0xc0, 0x7f}, qnan8[8] = {0, 0, 0, 0, 0, 0, 0xf8, 0x7f};
        dg_bytes(h, nan ? (esz == 4 ? qnan4 : qnan8) : b, esz);
    }
}

/* xorshift64*: the same sequence everywhere, so inputs are fixed. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

enum { SPEC_NONE, SPEC_ALL, SPEC_TINY };

/* Values the activations must treat right: NaN, infinities, -0, subnormals,
 * huge, and the far tails where exp under/overflows. */
static const float spec_all_f32[] = {NAN, INFINITY, -INFINITY, -0.0f, 1e-40f, -3e-39f, 60.0f, -60.0f, 1e30f, -40.0f};
static const double spec_all_f64[] = {NAN, INFINITY, -INFINITY, -0.0, 1e-310, -3e-309, 60.0, -60.0, 1e200, -40.0};
/* Subnormals and zeros, for optimizer state (flushed under FTZ or not). */
static const float spec_tiny_f32[] = {1e-40f, -1e-41f, 0.0f, -0.0f};
static const double spec_tiny_f64[] = {1e-310, -1e-315, 0.0, -0.0};

/* x: (n) uniform in [lo, hi) from seed; every 1009th element from index 5 a
 * special value (spec), so they land in every thread's range. The float and
 * double fills with the same seed draw the same doubles. */
/* One source for each pair of cases below: T the element type, SFX the
 * kernels' suffix (empty for float32, _f64); every (T) conversion is a no-op
 * for double and the float32 code's own cast, so the digests stay those of
 * the two hand-written copies this replaced. */
#define DEFINE_FILL(T, SFX)                                                                                  \
    static void fill##SFX(T *x, size_t n, double lo, double hi, uint64_t seed, int spec) {                     \
        uint64_t s = seed | 1;                                                                                \
        for (size_t i = 0; i < n; i++) {                                                                      \
            x[i] = (T)(lo + (hi - lo) * rng_unit(&s));                                                        \
            if (spec != SPEC_NONE && i % 1009 == 5) {                                                         \
                const size_t k = i / 1009;                                                                    \
                x[i] = spec == SPEC_ALL ? spec_all##SFX[k % 10] : spec_tiny##SFX[k % 4];                      \
            }                                                                                                 \
        }                                                                                                     \
    }
DEFINE_FILL(float, _f32)
DEFINE_FILL(double, _f64)

static void *xalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

/* Sizes: a single element, sub-vector, odd mid-size, and past every split
 * point (streaming float32 loops split from 512K elements at 2 threads). */
static const size_t ew_sizes[] = {1, 7, 1031, 600011};
#define N_EW (sizeof ew_sizes / sizeof ew_sizes[0])

/* ------------------------------------------------------------ activations */

typedef void (*fwd32)(float *, const float *, size_t);
typedef void (*bwd32)(float *, const float *, const float *, size_t);
typedef void (*fwd64)(double *, const double *, size_t);
typedef void (*bwd64)(double *, const double *, const double *, size_t);

enum { A_RELU, A_GELU, A_TANH, A_SIGMOID, A_LEAKY, A_N };
static const fwd32 act_f32[A_N] = {kc_relu_forward, kc_gelu_forward, kc_tanh_forward, kc_sigmoid_forward,
                                   kc_leaky_relu_forward};
static const bwd32 act_b32[A_N] = {kc_relu_backward, kc_gelu_backward, kc_tanh_backward, kc_sigmoid_backward,
                                   kc_leaky_relu_backward};
static const fwd64 act_f64[A_N] = {kc_relu_forward_f64, kc_gelu_forward_f64, kc_tanh_forward_f64,
                                   kc_sigmoid_forward_f64, kc_leaky_relu_forward_f64};
static const bwd64 act_b64[A_N] = {kc_relu_backward_f64, kc_gelu_backward_f64, kc_tanh_backward_f64,
                                   kc_sigmoid_backward_f64, kc_leaky_relu_backward_f64};

/* y = f(x), f(z) in place, dx = f'(dy, x), and in place on dy; x in
 * [-12, 12) with specials, dy in [-2, 2). */
#define DEFINE_ACT_CASE(T, SFX, FWD, BWD)                                                                    \
    static uint64_t act_case##SFX(int a) {                                                                    \
        uint64_t h = FNV_OFFSET;                                                                              \
        for (size_t k = 0; k < N_EW; k++) {                                                                   \
            const size_t n = ew_sizes[k];                                                                     \
            T *x = xalloc(n * sizeof *x), *y = xalloc(n * sizeof *y), *dy = xalloc(n * sizeof *dy);           \
            fill##SFX(x, n, -12.0, 12.0, 101 + k, SPEC_ALL);                                                  \
            fill##SFX(dy, n, -2.0, 2.0, 202 + k, SPEC_NONE);                                                  \
            FWD[a](y, x, n);                                                                                  \
            dg_vals(&h, y, n, sizeof *y);                                                                     \
            memcpy(y, x, n * sizeof *y);                                                                      \
            FWD[a](y, y, n);                                                                                  \
            dg_vals(&h, y, n, sizeof *y);                                                                     \
            BWD[a](y, dy, x, n);                                                                              \
            dg_vals(&h, y, n, sizeof *y);                                                                     \
            BWD[a](dy, dy, x, n);                                                                             \
            dg_vals(&h, dy, n, sizeof *dy);                                                                   \
            free(x), free(y), free(dy);                                                                       \
        }                                                                                                     \
        return h;                                                                                             \
    }
DEFINE_ACT_CASE(float, _f32, act_f32, act_b32)
DEFINE_ACT_CASE(double, _f64, act_f64, act_b64)

static uint64_t relu_f32(void) { return act_case_f32(A_RELU); }
static uint64_t relu_f64(void) { return act_case_f64(A_RELU); }
static uint64_t gelu_f32(void) { return act_case_f32(A_GELU); }
static uint64_t gelu_f64(void) { return act_case_f64(A_GELU); }
static uint64_t tanh_f32(void) { return act_case_f32(A_TANH); }
static uint64_t tanh_f64(void) { return act_case_f64(A_TANH); }
static uint64_t sigmoid_f32(void) { return act_case_f32(A_SIGMOID); }
static uint64_t sigmoid_f64(void) { return act_case_f64(A_SIGMOID); }
static uint64_t leaky_f32(void) { return act_case_f32(A_LEAKY); }
static uint64_t leaky_f64(void) { return act_case_f64(A_LEAKY); }

/* ------------------------------------------------------------------ bias */

/* (rows, cols): trivial, small odd, and large enough that bias_add splits by
 * rows and bias_grad by columns at 2 threads. rows == 0 for the gradient's
 * "nothing summed" case. */
static const int bias_shapes[][2] = {{1, 1}, {3, 5}, {0, 9}, {613, 1031}};
#define N_BIAS (sizeof bias_shapes / sizeof bias_shapes[0])

/* KSFX: the kernels' suffix (empty for float32). */
#define DEFINE_BIAS(T, SFX, KSFX)                                                                            \
    static uint64_t bias##SFX(void) {                                                                         \
        uint64_t h = FNV_OFFSET;                                                                              \
        for (size_t k = 0; k < N_BIAS; k++) {                                                                 \
            const int R = bias_shapes[k][0], C = bias_shapes[k][1];                                           \
            const size_t n = (size_t)R * (size_t)C;                                                           \
            T *y = xalloc(n * sizeof *y), *b = xalloc((size_t)C * sizeof *b), *db = xalloc((size_t)C * sizeof *db); \
            fill##SFX(y, n, -1.0, 1.0, 301 + k, SPEC_NONE);                                                   \
            fill##SFX(b, (size_t)C, -1.0, 1.0, 302 + k, SPEC_NONE);                                           \
            kc_bias_add##KSFX(y, b, R, C);                                                                    \
            dg_bytes(&h, y, n * sizeof *y);                                                                   \
            kc_bias_grad##KSFX(db, y, R, C, 0);                                                               \
            dg_bytes(&h, db, (size_t)C * sizeof *db);                                                         \
            fill##SFX(db, (size_t)C, -5.0, 5.0, 303 + k, SPEC_NONE);                                          \
            kc_bias_grad##KSFX(db, y, R, C, 1);                                                               \
            dg_bytes(&h, db, (size_t)C * sizeof *db);                                                         \
            free(y), free(b), free(db);                                                                       \
        }                                                                                                     \
        return h;                                                                                             \
    }
DEFINE_BIAS(float, _f32, )
DEFINE_BIAS(double, _f64, _f64)

/* ------------------------------------------------------------------ loss */

/* (B, C): one row of one class, a small batch with two bad labels (C and
 * -1), and a batch large enough that forward (row blocks) and backward
 * (rows) split. */
static const int xent_shapes[][2] = {{1, 1}, {5, 3}, {613, 1031}};
#define N_XENT (sizeof xent_shapes / sizeof xent_shapes[0])

/* labels: (B) in [0, C), with rows 3 and 4 out of range when B == 5. */
static void xent_labels(int32_t *labels, int B, int C, uint64_t seed) {
    uint64_t s = seed | 1;
    for (int i = 0; i < B; i++) labels[i] = (int32_t)(rng_next(&s) % (uint64_t)C);
    if (B == 5) {
        labels[3] = C;
        labels[4] = -1;
    }
}

/* Forward (probs, loss, n_correct), backward into a separate buffer at
 * dloss 0.75, then in place on probs at dloss -1.5. Logits in [-8, 8) with
 * one huge logit (1e4) when C > 7, so the max subtraction matters. */
#define DEFINE_XENT(T, SFX, KSFX)                                                                            \
    static uint64_t xent##SFX(void) {                                                                         \
        uint64_t h = FNV_OFFSET;                                                                              \
        for (size_t k = 0; k < N_XENT; k++) {                                                                 \
            const int B = xent_shapes[k][0], C = xent_shapes[k][1];                                           \
            const size_t n = (size_t)B * (size_t)C;                                                           \
            T *l = xalloc(n * sizeof *l), *p = xalloc(n * sizeof *p), *d = xalloc(n * sizeof *d);             \
            int32_t *lab = xalloc((size_t)B * sizeof *lab);                                                   \
            fill##SFX(l, n, -8.0, 8.0, 401 + k, SPEC_NONE);                                                   \
            if (C > 7 && B > 2) l[2 * (size_t)C + 7] = (T)1e4;                                                \
            xent_labels(lab, B, C, 402 + k);                                                                  \
            int correct = -7;                                                                                 \
            const T loss = kc_softmax_xent_forward##KSFX(p, l, lab, B, C, &correct);                          \
            dg_bytes(&h, &loss, sizeof loss);                                                                 \
            dg_bytes(&h, &correct, sizeof correct);                                                           \
            dg_bytes(&h, p, n * sizeof *p);                                                                   \
            kc_softmax_xent_backward##KSFX(d, p, lab, B, C, (T)0.75);                                         \
            dg_bytes(&h, d, n * sizeof *d);                                                                   \
            kc_softmax_xent_backward##KSFX(p, p, lab, B, C, (T)-1.5);                                         \
            dg_bytes(&h, p, n * sizeof *p);                                                                   \
            free(l), free(p), free(d), free(lab);                                                             \
        }                                                                                                     \
        return h;                                                                                             \
    }
DEFINE_XENT(float, _f32, )
DEFINE_XENT(double, _f64, _f64)

/* ------------------------------------------------------------ reductions */

/* Up to 4M elements: more than 256 minimum blocks, so the block size grows
 * with n (kc_red_block_size). */
static const size_t red_sizes[] = {0, 1, 17, 600011, 4194319};
#define N_RED (sizeof red_sizes / sizeof red_sizes[0])

/* sum (float32 only), sum of squares, and finiteness of a finite array,
 * with an inf near the end, and with a NaN in the middle. */
/* The plain sum exists for float32 only: its digest goes first, as the
 * float32 case always hashed it ahead of the sum of squares. */
static void sum_first_f32(uint64_t *h, const float *x, size_t n) {
    const double s = kc_sum(x, n);
    dg_bytes(h, &s, sizeof s);
}
static void sum_first_f64(uint64_t *h, const double *x, size_t n) { (void)h, (void)x, (void)n; }

#define DEFINE_REDUCE(T, SFX, KSFX)                                                                          \
    static uint64_t reduce##SFX(void) {                                                                       \
        uint64_t h = FNV_OFFSET;                                                                              \
        for (size_t k = 0; k < N_RED; k++) {                                                                  \
            const size_t n = red_sizes[k];                                                                    \
            T *x = xalloc(n * sizeof *x);                                                                     \
            fill##SFX(x, n, -3.0, 3.0, 501 + k, SPEC_NONE);                                                   \
            sum_first##SFX(&h, x, n);                                                                         \
            const double s2 = kc_sumsq##KSFX(x, n);                                                           \
            int fin[3];                                                                                       \
            fin[0] = kc_all_finite##KSFX(x, n);                                                               \
            if (n > 1) x[n - 2] = INFINITY;                                                                   \
            fin[1] = kc_all_finite##KSFX(x, n);                                                               \
            if (n > 1) x[n / 2] = NAN, x[n - 2] = 0;                                                          \
            fin[2] = kc_all_finite##KSFX(x, n);                                                               \
            dg_bytes(&h, &s2, sizeof s2);                                                                     \
            dg_bytes(&h, fin, sizeof fin);                                                                    \
            free(x);                                                                                          \
        }                                                                                                     \
        return h;                                                                                             \
    }
DEFINE_REDUCE(float, _f32, )
DEFINE_REDUCE(double, _f64, _f64)

/* --------------------------------------------------------- scale, axpy */

/* The scalars are written as float32 literals were: -0.37f and 1.3f are
 * the float nearest the decimal, as (float)-0.37 and (float)1.3 are. */
#define DEFINE_BLAS1(T, SFX, KSFX)                                                                           \
    static uint64_t blas1##SFX(void) {                                                                        \
        uint64_t h = FNV_OFFSET;                                                                              \
        for (size_t k = 0; k < N_EW; k++) {                                                                   \
            const size_t n = ew_sizes[k];                                                                     \
            T *x = xalloc(n * sizeof *x), *y = xalloc(n * sizeof *y);                                         \
            fill##SFX(x, n, -4.0, 4.0, 601 + k, SPEC_ALL);                                                    \
            fill##SFX(y, n, -4.0, 4.0, 602 + k, SPEC_NONE);                                                   \
            kc_scale##KSFX(x, (T)-0.37, n);                                                                   \
            dg_bytes(&h, x, n * sizeof *x);                                                                   \
            kc_axpy##KSFX(y, (T)1.3, x, n);                                                                   \
            dg_bytes(&h, y, n * sizeof *y);                                                                   \
            free(x), free(y);                                                                                 \
        }                                                                                                     \
        return h;                                                                                             \
    }
DEFINE_BLAS1(float, _f32, )
DEFINE_BLAS1(double, _f64, _f64)

/* ------------------------------------------------------------ optimizers */

/* Every normalised SGD option set: without momentum (momentum 0, or no
 * buffer), with it plain, dampened, Nesterov, each with and without weight
 * decay; three steps, the first one first_step. */
static const struct {
    double lr, momentum, dampening, wd;
    int nesterov, use_buf;
} sgd_cfg[] = {
    {0.1, 0.0, 0.0, 0.0, 0, 1},   {0.1, 0.0, 0.0, 1e-2, 0, 1},  {0.05, 0.9, 0.0, 0.0, 0, 1},
    {0.05, 0.9, 0.1, 1e-2, 0, 1}, {0.05, 0.9, 0.0, 0.0, 1, 1},  {0.05, 0.9, 0.0, 5e-3, 1, 1},
    {0.05, 0.9, 0.0, 0.0, 0, 0},
};
#define N_SGD (sizeof sgd_cfg / sizeof sgd_cfg[0])
static const size_t opt_sizes[] = {1, 1031, 600011};
#define N_OPT (sizeof opt_sizes / sizeof opt_sizes[0])

#define DEFINE_SGD(T, SFX, KSFX)                                                                             \
    static uint64_t sgd##SFX(void) {                                                                          \
        uint64_t h = FNV_OFFSET;                                                                              \
        for (size_t c = 0; c < N_SGD; c++)                                                                    \
            for (size_t k = 0; k < N_OPT; k++) {                                                              \
                const size_t n = opt_sizes[k];                                                                \
                T *p = xalloc(n * sizeof *p), *g = xalloc(n * sizeof *g), *buf = xalloc(n * sizeof *buf);     \
                fill##SFX(p, n, -1.0, 1.0, 701 + k, SPEC_TINY);                                               \
                memset(buf, 0, n * sizeof *buf);                                                              \
                for (int step = 0; step < 3; step++) {                                                        \
                    fill##SFX(g, n, -1.0, 1.0, 710 + 3 * k + (size_t)step, SPEC_TINY);                        \
                    kc_sgd_update##KSFX(p, g, sgd_cfg[c].use_buf ? buf : NULL, n, (T)sgd_cfg[c].lr,           \
                                        (T)sgd_cfg[c].momentum, (T)sgd_cfg[c].dampening, sgd_cfg[c].nesterov, \
                                        (T)sgd_cfg[c].wd, step == 0);                                         \
                    dg_bytes(&h, p, n * sizeof *p);                                                           \
                    dg_bytes(&h, buf, n * sizeof *buf);                                                       \
                }                                                                                             \
                free(p), free(g), free(buf);                                                                  \
            }                                                                                                 \
        return h;                                                                                             \
    }
DEFINE_SGD(float, _f32, )
DEFINE_SGD(double, _f64, _f64)

/* AdamW: PyTorch's defaults with weight decay, lerp's large-weight form
 * (beta1 0.3, so 1 - beta1 >= 0.5), and a GPT-like set; steps 1, 2, 1000
 * (bias corrections through pow). m and v start small with subnormals. */
static const struct {
    double lr, beta1, beta2, eps, wd;
} adamw_cfg[] = {{1e-3, 0.9, 0.999, 1e-8, 1e-2}, {1e-2, 0.3, 0.99, 1e-6, 0.0}, {3e-4, 0.9, 0.95, 1e-8, 0.1}};
#define N_ADAMW (sizeof adamw_cfg / sizeof adamw_cfg[0])
static const int64_t adamw_steps[] = {1, 2, 1000};

/* One step of case c at step index s. use_float_args (float32 only):
 * through kc_adamw_update (float scalars) instead of kc_adamw_update_d. */
static void adamw_step_f32(float *p, const float *g, float *m, float *v, size_t n, size_t c, int s,
                           int use_float_args) {
    if (use_float_args)
        kc_adamw_update(p, g, m, v, n, (float)adamw_cfg[c].lr, (float)adamw_cfg[c].beta1, (float)adamw_cfg[c].beta2,
                        (float)adamw_cfg[c].eps, (float)adamw_cfg[c].wd, adamw_steps[s]);
    else
        kc_adamw_update_d(p, g, m, v, n, adamw_cfg[c].lr, adamw_cfg[c].beta1, adamw_cfg[c].beta2, adamw_cfg[c].eps,
                          adamw_cfg[c].wd, adamw_steps[s]);
}
static void adamw_step_f64(double *p, const double *g, double *m, double *v, size_t n, size_t c, int s,
                           int use_float_args) {
    (void)use_float_args;
    kc_adamw_update_f64(p, g, m, v, n, adamw_cfg[c].lr, adamw_cfg[c].beta1, adamw_cfg[c].beta2, adamw_cfg[c].eps,
                        adamw_cfg[c].wd, adamw_steps[s]);
}

#define DEFINE_ADAMW(T, SFX)                                                                                 \
    static uint64_t adamw##SFX##_impl(int use_float_args) {                                                   \
        uint64_t h = FNV_OFFSET;                                                                              \
        for (size_t c = 0; c < N_ADAMW; c++)                                                                  \
            for (size_t k = 0; k < N_OPT; k++) {                                                              \
                const size_t n = opt_sizes[k];                                                                \
                T *p = xalloc(n * sizeof *p), *g = xalloc(n * sizeof *g), *m = xalloc(n * sizeof *m),         \
                  *v = xalloc(n * sizeof *v);                                                                 \
                fill##SFX(p, n, -1.0, 1.0, 801 + k, SPEC_TINY);                                               \
                fill##SFX(m, n, -1e-3, 1e-3, 802 + k, SPEC_TINY);                                             \
                fill##SFX(v, n, 0.0, 1e-3, 803 + k, SPEC_TINY);                                               \
                for (int s = 0; s < 3; s++) {                                                                 \
                    fill##SFX(g, n, -1.0, 1.0, 810 + 3 * k + (size_t)s, SPEC_TINY);                           \
                    adamw_step##SFX(p, g, m, v, n, c, s, use_float_args);                                     \
                    dg_bytes(&h, p, n * sizeof *p);                                                           \
                    dg_bytes(&h, m, n * sizeof *m);                                                           \
                    dg_bytes(&h, v, n * sizeof *v);                                                           \
                }                                                                                             \
                free(p), free(g), free(m), free(v);                                                           \
            }                                                                                                 \
        return h;                                                                                             \
    }
DEFINE_ADAMW(float, _f32)
DEFINE_ADAMW(double, _f64)
static uint64_t adamw_f32(void) { return adamw_f32_impl(0); }
static uint64_t adamw_f32_float_args(void) { return adamw_f32_impl(1); }
static uint64_t adamw_f64(void) { return adamw_f64_impl(0); }

/* -------------------------------------------------------- golden table */

/* libm: the case's bits also depend on libm (exp, expf, log, tanh, pow). */
static const struct dcase {
    const char *name;
    uint64_t (*fn)(void);
    int libm;
} cases[] = {
    {"bias_f32", bias_f32, 0},       {"bias_f64", bias_f64, 0},
    {"relu_f32", relu_f32, 0},       {"relu_f64", relu_f64, 0},
    {"gelu_f32", gelu_f32, 0},       {"gelu_f64", gelu_f64, 1},
    {"tanh_f32", tanh_f32, 0},       {"tanh_f64", tanh_f64, 1},
    {"sigmoid_f32", sigmoid_f32, 0}, {"sigmoid_f64", sigmoid_f64, 1},
    {"leaky_f32", leaky_f32, 0},     {"leaky_f64", leaky_f64, 0},
    {"xent_f32", xent_f32, 1},       {"xent_f64", xent_f64, 1},
    {"reduce_f32", reduce_f32, 0},   {"reduce_f64", reduce_f64, 0},
    {"blas1_f32", blas1_f32, 0},     {"blas1_f64", blas1_f64, 0},
    {"sgd_f32", sgd_f32, 0},         {"sgd_f64", sgd_f64, 0},
    {"adamw_f32", adamw_f32, 1},     {"adamw_f32_float_args", adamw_f32_float_args, 1},
    {"adamw_f64", adamw_f64, 1},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Recorded from the kernels as they were before float32 and float64 shared
 * one source (commit 028a601: cpu_f64.c, cpu_act.c, ...), in the same order
 * as cases[]. */
static const uint64_t golden_libm = 0x88d3f03ce2eafa30ull;
static const struct {
    const char *name;
    uint64_t digest;
} golden[] = {
    {"bias_f32", 0x7d07d665ce62b173ull},
    {"bias_f64", 0x6aabf8201061fa17ull},
    {"relu_f32", 0xf208229a716c3719ull},
    {"relu_f64", 0xaa69aadfad764785ull},
    {"gelu_f32", 0x56b18c798306a1fdull},
    {"gelu_f64", 0x93e7f9dbebc5c9c1ull}, /* re-recorded with NaNs folded to one pattern (dg_vals) */
    {"tanh_f32", 0xc29f8cf1716ab9c9ull},
    {"tanh_f64", 0x2604c93b7cf66265ull},
    {"sigmoid_f32", 0x8bb0fbb6d1b8958dull},
    {"sigmoid_f64", 0xc722201f5df85015ull},
    {"leaky_f32", 0x3989a891e76d6ef9ull},
    {"leaky_f64", 0xcef1a6bcc5fbe535ull},
    {"xent_f32", 0xbd13d374ca67def4ull},
    {"xent_f64", 0xd9c141803820ab88ull},
    {"reduce_f32", 0xc3c9743ba9143b15ull},
    {"reduce_f64", 0xc564b3e787a018b8ull},
    {"blas1_f32", 0xae0232d3bc85ecefull},
    {"blas1_f64", 0xa737f9c4482ffc9dull},
    {"sgd_f32", 0xcc721d0947dbcf7cull},
    {"sgd_f64", 0x2316212c19a54980ull},
    {"adamw_f32", 0xe4c5f98e81fd688bull},
    {"adamw_f32_float_args", 0xd1bd99fe80ede21eull},
    {"adamw_f64", 0x7562e28689e4c3e3ull},
};
#define N_GOLDEN (sizeof golden / sizeof golden[0])

/* A digest of libm's results on arguments in the ranges the kernels use:
 * expf (softmax rows), exp (float64 GELU, tanh, sigmoid, softmax), log (the
 * log-sum-exp), tanh, pow (AdamW's bias corrections). */
static uint64_t libm_fingerprint(void) {
    uint64_t h = FNV_OFFSET, s = 0x5eed;
    for (int i = 0; i < 20000; i++) {
        const double u = rng_unit(&s);
        const float ef = expf((float)(-40.0 * u));
        const double e1 = exp(-750.0 * u), e2 = exp(1500.0 * u - 750.0), e3 = exp(-40.0 * u);
        const double lg = log(1.0 + 1e4 * u), th = tanh(40.0 * u - 20.0);
        const double pw = pow(0.3 + 0.6999 * u, (double)(1 + i % 2000));
        dg_bytes(&h, &ef, sizeof ef);
        dg_bytes(&h, &e1, sizeof e1);
        dg_bytes(&h, &e2, sizeof e2);
        dg_bytes(&h, &e3, sizeof e3);
        dg_bytes(&h, &lg, sizeof lg);
        dg_bytes(&h, &th, sizeof th);
        dg_bytes(&h, &pw, sizeof pw);
    }
    return h;
}

/* ----------------------------------------------------------------- tests */

static const int thread_counts[] = {1, 2, 3, 5};
#define N_THREADS (sizeof thread_counts / sizeof thread_counts[0])
static uint64_t digests[N_THREADS][N_CASES];
static int digests_done;

/* Every case at every thread count; the digests must agree across counts. */
static void test_threads_agree(void) {
    for (size_t t = 0; t < N_THREADS; t++) {
        CU_ASSERT_EQUAL_FATAL(kc_set_num_threads(thread_counts[t]), thread_counts[t]);
        for (size_t c = 0; c < N_CASES; c++) digests[t][c] = cases[c].fn();
    }
    kc_set_num_threads(1); /* joins the workers */
    for (size_t c = 0; c < N_CASES; c++)
        for (size_t t = 1; t < N_THREADS; t++)
            if (digests[t][c] != digests[0][c]) {
                fprintf(stderr, "\n  %s: %d threads give %016llx, 1 thread %016llx\n", cases[c].name,
                        thread_counts[t], (unsigned long long)digests[t][c], (unsigned long long)digests[0][c]);
                CU_FAIL("digest depends on the thread count");
            }
    digests_done = 1;
}

static void test_golden(void) {
    CU_ASSERT_FATAL(digests_done);
    const uint64_t fp = libm_fingerprint();
    const int same_libm = fp == golden_libm;
    if (getenv("KILN_DTYPE_DIGEST_PRINT")) {
        printf("\nstatic const uint64_t golden_libm = 0x%016llxull;\n", (unsigned long long)fp);
        for (size_t c = 0; c < N_CASES; c++)
            printf("    {\"%s\", 0x%016llxull},\n", cases[c].name, (unsigned long long)digests[0][c]);
    }
    if (!same_libm)
        printf("\n  note: this libm's fingerprint %016llx is not the recorded %016llx; the cases that call libm "
               "are checked across thread counts only\n",
               (unsigned long long)fp, (unsigned long long)golden_libm);
    CU_ASSERT_EQUAL(N_GOLDEN, N_CASES);
    for (size_t c = 0; c < N_CASES; c++) {
        const uint64_t *want = NULL;
        for (size_t g = 0; g < N_GOLDEN; g++)
            if (strcmp(golden[g].name, cases[c].name) == 0) want = &golden[g].digest;
        if (!want) {
            fprintf(stderr, "\n  %s: no recorded digest\n", cases[c].name);
            CU_FAIL("a case has no recorded digest");
            continue;
        }
        if (cases[c].libm && !same_libm) continue;
        if (digests[0][c] != *want) {
            fprintf(stderr, "\n  %s: digest %016llx, recorded %016llx\n", cases[c].name,
                    (unsigned long long)digests[0][c], (unsigned long long)*want);
            CU_FAIL("output bits differ from the recorded ones");
        }
    }
}

static CU_TestInfo cases_kernels_dtype[] = {
    {"float32/float64 kernels: same digest at 1, 2, 3, 5 threads", test_threads_agree},
    {"float32/float64 kernels: digests equal the recorded ones", test_golden},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    CU_SuiteInfo suites[] = {
        {.pName = "kernels_dtype", .pTests = cases_kernels_dtype},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
