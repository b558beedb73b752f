/*
 * cpu_optim.c: the parameter updates, SGD (momentum, dampening, Nesterov,
 * L2 weight decay) and AdamW (decoupled weight decay), each reproducing the
 * order of floating-point operations of PyTorch's single-tensor
 * implementation (torch/optim/sgd.py _single_tensor_sgd, adamw.py
 * _single_tensor_adamw) so runs can be compared with PyTorch step by step.
 * They touch every parameter every step (1.9M floats for the reference
 * model), so each is one fused pass over memory instead of PyTorch's several
 * tensor ops: the scalar coefficients are formed once per call in double (as
 * Python forms them), and the per-element loop is specialised per option set
 * (no branch inside the loop) so GCC vectorizes it. Large tensors are split
 * across the pool; each element's arithmetic is the same on any thread.
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"
#include "../common/km_optim.h"

#include <math.h>

/* ------------------------------------------------------------------ SGD */

typedef struct {
    float *p;         /* (n) */
    const float *g;   /* (n) */
    float *buf;       /* (n) momentum buffer, or NULL when momentum == 0 */
    float neg_lr;     /* alpha of param.add_(grad, alpha=-lr) */
    float momentum;
    float one_minus_damp;
    float wd;
    int mode;         /* KC_SGD_* bits, normalised: no momentum => no FIRST/NEST */
} kc_sgd_ctx;

enum { KC_SGD_WD = 1, KC_SGD_MOM = 2, KC_SGD_FIRST = 4, KC_SGD_NEST = 8 };

/*
 * One specialised loop; the flags are compile-time constants at every call
 * site below, so after inlining each instance is branch-free. Per element,
 * in PyTorch's order:
 *   d = g + wd * p                      grad.add(param, alpha=wd)
 *   b = first ? d : mom * b + omd * d    clone / buf.mul_(mom).add_(d, alpha=omd)
 *   d = nest ? d + mom * b : b           grad.add(buf, alpha=mom) / buf
 *   p = p + (-lr) * d                    param.add_(d, alpha=-lr)
 */
static KC_ALWAYS_INLINE void kc_sgd_loop(float *restrict p, const float *restrict g,
                                         float *restrict buf, size_t n, float neg_lr,
                                         float mom, float omd, float wd, const int has_wd,
                                         const int has_mom, const int first,
                                         const int nest) {
    for (size_t i = 0; i < n; i++) {
        float d = g[i];
        if (has_wd) d = d + wd * p[i];
        if (has_mom) {
            const float b = first ? d : mom * buf[i] + omd * d;
            buf[i] = b;
            d = nest ? d + mom * b : b;
        }
        p[i] = p[i] + neg_lr * d;
    }
}

int kc_flush_denormal_on = 1;
void kc_set_flush_denormal(int on) { kc_flush_denormal_on = on != 0; }

static KC_ALWAYS_INLINE void kc_sgd_range_impl(void *vc, size_t i0, size_t i1) {
    const unsigned int csr = kc_ftz_begin(); /* a decaying momentum buffer goes subnormal too */
    const kc_sgd_ctx *c = vc;
    float *p = c->p + i0;
    const float *g = c->g + i0;
    float *buf = c->buf ? c->buf + i0 : NULL;
    const size_t n = i1 - i0;
    const float lr = c->neg_lr, mo = c->momentum, od = c->one_minus_damp, wd = c->wd;
#define KC_SGD_CASE(WD, MOM, FIRST, NEST)                                                 \
    case (WD) * KC_SGD_WD + (MOM) * KC_SGD_MOM + (FIRST) * KC_SGD_FIRST + (NEST) * KC_SGD_NEST: \
        kc_sgd_loop(p, g, buf, n, lr, mo, od, wd, WD, MOM, FIRST, NEST);                   \
        break;
    switch (c->mode) {
        KC_SGD_CASE(0, 0, 0, 0)
        KC_SGD_CASE(1, 0, 0, 0)
        KC_SGD_CASE(0, 1, 0, 0)
        KC_SGD_CASE(1, 1, 0, 0)
        KC_SGD_CASE(0, 1, 1, 0)
        KC_SGD_CASE(1, 1, 1, 0)
        KC_SGD_CASE(0, 1, 0, 1)
        KC_SGD_CASE(1, 1, 0, 1)
        KC_SGD_CASE(0, 1, 1, 1)
        KC_SGD_CASE(1, 1, 1, 1)
    default: break; /* unreachable: mode is normalised in kc_sgd_update */
    }
#undef KC_SGD_CASE
    kc_ftz_end(csr);
}
KC_DISPATCHED_RANGE(kc_sgd_range)

void kc_sgd_update(float *p, const float *g, float *momentum_buf, size_t n,
                   float lr, float momentum, float dampening, int nesterov,
                   float weight_decay, int first_step) {
    if (n == 0) return;
    /* the step's scalars and normalised flags (kernels/common/km_optim.h) */
    const km_sgd_coef_f32 k =
        km_sgd_coef_f32_make(lr, momentum, dampening, nesterov, weight_decay, first_step, momentum_buf != NULL);
    kc_sgd_ctx c;
    c.p = p;
    c.g = g;
    c.buf = momentum_buf;
    c.neg_lr = k.neg_lr;
    c.momentum = k.momentum;
    c.one_minus_damp = k.one_minus_damp;
    c.wd = k.wd;
    c.mode = (k.has_wd ? KC_SGD_WD : 0) | (k.has_mom ? KC_SGD_MOM : 0) | (k.first ? KC_SGD_FIRST : 0) |
             (k.nesterov ? KC_SGD_NEST : 0);
    kc_parallel_for(n, KC_GRAIN_HEAVY, KC_ALIGN_FLOATS, kc_sgd_range_pick(), &c);
}

/* ---------------------------------------------------------------- AdamW */

typedef struct {
    float *p, *m, *v;    /* (n) each */
    const float *g;      /* (n) */
    km_adamw_coef_f32 k; /* the step's scalars (kernels/common/km_optim.h) */
} kc_adamw_ctx;

/*
 * Per element, in PyTorch's order (each line one tensor op there):
 *   p = p * decay                              param.mul_(1 - lr*wd)
 *   m = m + w1 * (g - m)  (w1 < 0.5)           exp_avg.lerp_(grad, 1-beta1)
 *     = g - (g - m) * (1 - w1)  (w1 >= 0.5)     (ATen's lerp formula)
 *   v = v * beta2 + (c2 * g) * g               exp_avg_sq.mul_(beta2)
 *                                                .addcmul_(grad, grad, value=c2)
 *   den = sqrt(v) / bc2_sqrt + eps             (exp_avg_sq.sqrt() / bc2s).add_(eps)
 *   p = p + (neg_step * m) / den               param.addcdiv_(m, den, value=-step_size)
 * sqrtf becomes a vector sqrt because the library is built with
 * -fno-math-errno. The loop runs with subnormals flushed (kc_ftz_begin):
 * results below 2^-126 in magnitude become 0 where PyTorch (without
 * torch.set_flush_denormal) keeps them.
 */
static KC_ALWAYS_INLINE void kc_adamw_loop(float *restrict p, const float *restrict g,
                                           float *restrict m, float *restrict v, size_t n,
                                           const kc_adamw_ctx *c, const int big_weight) {
    const float decay = c->k.decay, w1 = c->k.w1, omw1 = c->k.one_minus_w1, b2 = c->k.beta2,
                c2 = c->k.c2, bc2s = c->k.bc2_sqrt, eps = c->k.eps, ns = c->k.neg_step;
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i];
        float mi = m[i];
        mi = big_weight ? gi - (gi - mi) * omw1 : mi + w1 * (gi - mi);
        const float vi = v[i] * b2 + (c2 * gi) * gi;
        const float den = sqrtf(vi) / bc2s + eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay + (ns * mi) / den;
    }
}

static KC_ALWAYS_INLINE void kc_adamw_range_impl(void *vc, size_t i0, size_t i1) {
    const kc_adamw_ctx *c = vc;
    const unsigned int csr = kc_ftz_begin(); /* see kc_ftz_begin: m goes subnormal */
    if (c->k.big_weight)
        kc_adamw_loop(c->p + i0, c->g + i0, c->m + i0, c->v + i0, i1 - i0, c, 1);
    else
        kc_adamw_loop(c->p + i0, c->g + i0, c->m + i0, c->v + i0, i1 - i0, c, 0);
    kc_ftz_end(csr);
}

KC_DISPATCHED_RANGE(kc_adamw_range)

void kc_adamw_update_d(float *p, const float *g, float *m, float *v, size_t n,
                       double lr, double beta1, double beta2, double eps,
                       double weight_decay, int64_t step) {
    if (n == 0) return;
    kc_adamw_ctx c;
    c.p = p;
    c.g = g;
    c.m = m;
    c.v = v;
    c.k = km_adamw_coef_f32_make(lr, beta1, beta2, eps, weight_decay, step);
    kc_parallel_for(n, KC_GRAIN_HEAVY, KC_ALIGN_FLOATS, kc_adamw_range_pick(), &c);
}

void kc_adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps,
                     float weight_decay, int64_t step) {
    kc_adamw_update_d(p, g, m, v, n, (double)lr, (double)beta1, (double)beta2, (double)eps,
                      (double)weight_decay, step);
}
