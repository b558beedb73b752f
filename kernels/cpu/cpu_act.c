/*
 * cpu_act.c: the activations GANs use, tanh, sigmoid and leaky ReLU (negative
 * slope 0.2), forward and backward, in float32 and float64. Each backward
 * takes the forward INPUT x (like ReLU and GELU): dx = dy * f'(x). They must
 * stay finite and accurate for any |x|: tanh and sigmoid are evaluated from
 * e = exp(-|x|) (or exp(-2|x|)), which lies in [0, 1] and can never
 * overflow, in forms without cancellation ((1 - e) only where e < 0.45, a
 * short odd polynomial for tanh of small |x|, derivatives as e / (1 + e)^2
 * instead of 1 - y^2); NaN propagates to the output. The float32 loops use
 * kernels/common/km_act.h (an inlined polynomial exp, scaled in two steps so
 * that results down into the subnormal range come out right; the cuda kernels
 * call the same code), so they vectorize and give the same bits on every CPU
 * and GPU; the float64 ones use libm. Large loops split across the pool like the
 * other elementwise kernels, and the in-place case (dx == dy, y == x) has
 * its own body so the out-of-place one keeps restrict.
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"

#include <math.h>

/* Context shared by the range bodies of one dtype. */
typedef struct {
    float *out;       /* (n) y or dx */
    const float *in;  /* (n) x (forward) or dy (backward) */
    const float *in2; /* (n) x (backward), else NULL */
} ka_ctx;

typedef struct {
    double *out;       /* (n) y or dx */
    const double *in;  /* (n) x (forward) or dy (backward) */
    const double *in2; /* (n) x (backward), else NULL */
} ka64_ctx;

#define KA_SLOPE 0.2f  /* leaky ReLU's negative slope, float32 */
#define KA64_SLOPE 0.2 /* and as the double Python would hold  */

/* ------------------------------------------------------- float32 scalars */

/* tanh, sigmoid and their gradients: km_tanh, km_tanh_grad, km_sigmoid,
 * km_sigmoid_grad (kernels/common/km_act.h, shared with the cuda kernels). */

/* torch.nn.functional.leaky_relu: x > 0 ? x : x * slope (NaN stays NaN). */
static KC_ALWAYS_INLINE float ka_leaky_one(float x) { return x > 0.0f ? x : x * KA_SLOPE; }

/* Its backward in torch: x > 0 ? dy : dy * slope (so NaN x gives dy * slope). */
static KC_ALWAYS_INLINE float ka_leaky_bwd_one(float dy, float x) { return x > 0.0f ? dy : dy * KA_SLOPE; }

/* ------------------------------------------------- float32 range bodies */

/* KA_FWD(name, f): y = f(x), out of place and in place, AVX2-dispatched. */
#define KA_FWD(name, f)                                                                        \
    static KC_ALWAYS_INLINE void name##_body(float *restrict y, const float *restrict x,       \
                                             size_t n) {                                       \
        for (size_t i = 0; i < n; i++) y[i] = f(x[i]);                                         \
    }                                                                                          \
    static KC_ALWAYS_INLINE void name##_inplace(float *restrict y, size_t n) {                 \
        for (size_t i = 0; i < n; i++) y[i] = f(y[i]);                                         \
    }                                                                                          \
    static KC_ALWAYS_INLINE void name##_impl(void *vc, size_t i0, size_t i1) {                 \
        const ka_ctx *c = vc;                                                                  \
        if (c->out == c->in) name##_inplace(c->out + i0, i1 - i0);                             \
        else name##_body(c->out + i0, c->in + i0, i1 - i0);                                    \
    }                                                                                          \
    KC_DISPATCHED_RANGE(name)

/* KA_BWD(name, g): dx = dy * g(x), likewise. */
#define KA_BWD(name, g)                                                                        \
    static KC_ALWAYS_INLINE void name##_body(float *restrict dx, const float *restrict dy,     \
                                             const float *restrict x, size_t n) {              \
        for (size_t i = 0; i < n; i++) dx[i] = dy[i] * g(x[i]);                                \
    }                                                                                          \
    static KC_ALWAYS_INLINE void name##_inplace(float *restrict d, const float *restrict x,    \
                                                size_t n) {                                    \
        for (size_t i = 0; i < n; i++) d[i] = d[i] * g(x[i]);                                  \
    }                                                                                          \
    static KC_ALWAYS_INLINE void name##_impl(void *vc, size_t i0, size_t i1) {                 \
        const ka_ctx *c = vc;                                                                  \
        if (c->out == c->in) name##_inplace(c->out + i0, c->in2 + i0, i1 - i0);                \
        else name##_body(c->out + i0, c->in + i0, c->in2 + i0, i1 - i0);                       \
    }                                                                                          \
    KC_DISPATCHED_RANGE(name)

KA_FWD(ka_tanh_fwd, km_tanh)
KA_BWD(ka_tanh_bwd, km_tanh_grad)
KA_FWD(ka_sigmoid_fwd, km_sigmoid)
KA_BWD(ka_sigmoid_bwd, km_sigmoid_grad)
KA_FWD(ka_leaky_fwd, ka_leaky_one)

/* Leaky ReLU's backward is a select, not a product with a derivative, so it
 * gets its own bodies (dy * slope exactly as torch computes it). */
static void ka_leaky_bwd_range(void *vc, size_t i0, size_t i1) {
    const ka_ctx *c = vc;
    const size_t n = i1 - i0;
    const float *restrict x = c->in2 + i0;
    if (c->out == c->in) {
        float *restrict d = c->out + i0;
        for (size_t i = 0; i < n; i++) d[i] = ka_leaky_bwd_one(d[i], x[i]);
    } else {
        float *restrict dx = c->out + i0;
        const float *restrict dy = c->in + i0;
        for (size_t i = 0; i < n; i++) dx[i] = ka_leaky_bwd_one(dy[i], x[i]);
    }
}

/* The cheap loops (leaky ReLU) stream; the exp-based ones are compute-bound
 * and split earlier, like GELU. */
static void ka_run(kc_range_fn fn, size_t grain, float *out, const float *in, const float *in2, size_t n) {
    ka_ctx c = {out, in, in2};
    kc_parallel_for(n, grain, KC_ALIGN_FLOATS, fn, &c);
}

void kc_tanh_forward(float *y, const float *x, size_t n) {
    ka_run(ka_tanh_fwd_pick(), KC_GRAIN_HEAVY, y, x, NULL, n);
}
void kc_tanh_backward(float *dx, const float *dy, const float *x, size_t n) {
    ka_run(ka_tanh_bwd_pick(), KC_GRAIN_HEAVY, dx, dy, x, n);
}
void kc_sigmoid_forward(float *y, const float *x, size_t n) {
    ka_run(ka_sigmoid_fwd_pick(), KC_GRAIN_HEAVY, y, x, NULL, n);
}
void kc_sigmoid_backward(float *dx, const float *dy, const float *x, size_t n) {
    ka_run(ka_sigmoid_bwd_pick(), KC_GRAIN_HEAVY, dx, dy, x, n);
}
void kc_leaky_relu_forward(float *y, const float *x, size_t n) {
    ka_run(ka_leaky_fwd_pick(), KC_GRAIN_STREAM, y, x, NULL, n);
}
void kc_leaky_relu_backward(float *dx, const float *dy, const float *x, size_t n) {
    ka_run(ka_leaky_bwd_range, KC_GRAIN_STREAM, dx, dy, x, n);
}

/* ------------------------------------------------------------- float64 */

/* libm's tanh is accurate to ~1 ulp, gives +-1 for large |x| and keeps NaN. */
static inline double ka64_tanh_one(double x) { return tanh(x); }

/* 4e / (1 + e)^2, e = exp(-2|x|) (underflows to 0 gracefully). */
static inline double ka64_tanh_grad_one(double x) {
    const double e = exp(-2.0 * fabs(x));
    const double r = 1.0 / (1.0 + e);
    return x != x ? x : 4.0 * e * r * r;
}

static inline double ka64_sigmoid_one(double x) {
    const double e = exp(-fabs(x));
    const double r = 1.0 / (1.0 + e);
    return x != x ? x : (x >= 0.0 ? r : e * r);
}

static inline double ka64_sigmoid_grad_one(double x) {
    const double e = exp(-fabs(x));
    const double r = 1.0 / (1.0 + e);
    return x != x ? x : e * r * r;
}

/* y[i] depends on x[i] only, so one loop serves in place too (as GELU's). */
#define KA64_FWD(name, f)                                                                      \
    static void name(void *vc, size_t i0, size_t i1) {                                         \
        const ka64_ctx *c = vc;                                                                \
        for (size_t i = i0; i < i1; i++) c->out[i] = f(c->in[i]);                              \
    }
#define KA64_BWD(name, g)                                                                      \
    static void name(void *vc, size_t i0, size_t i1) {                                         \
        const ka64_ctx *c = vc;                                                                \
        for (size_t i = i0; i < i1; i++) c->out[i] = c->in[i] * g(c->in2[i]);                  \
    }

KA64_FWD(ka64_tanh_fwd_range, ka64_tanh_one)
KA64_BWD(ka64_tanh_bwd_range, ka64_tanh_grad_one)
KA64_FWD(ka64_sigmoid_fwd_range, ka64_sigmoid_one)
KA64_BWD(ka64_sigmoid_bwd_range, ka64_sigmoid_grad_one)

static void ka64_leaky_fwd_range(void *vc, size_t i0, size_t i1) {
    const ka64_ctx *c = vc;
    for (size_t i = i0; i < i1; i++) {
        const double x = c->in[i];
        c->out[i] = x > 0.0 ? x : x * KA64_SLOPE;
    }
}

static void ka64_leaky_bwd_range(void *vc, size_t i0, size_t i1) {
    const ka64_ctx *c = vc;
    for (size_t i = i0; i < i1; i++) {
        const double d = c->in[i];
        c->out[i] = c->in2[i] > 0.0 ? d : d * KA64_SLOPE;
    }
}

/* Splits on multiples of 8 doubles (a cache line), like cpu_f64.c. */
static void ka64_run(kc_range_fn fn, size_t grain, double *out, const double *in, const double *in2, size_t n) {
    ka64_ctx c = {out, in, in2};
    kc_parallel_for(n, grain, 8, fn, &c);
}

void kc_tanh_forward_f64(double *y, const double *x, size_t n) {
    ka64_run(ka64_tanh_fwd_range, KC_GRAIN_HEAVY, y, x, NULL, n);
}
void kc_tanh_backward_f64(double *dx, const double *dy, const double *x, size_t n) {
    ka64_run(ka64_tanh_bwd_range, KC_GRAIN_HEAVY, dx, dy, x, n);
}
void kc_sigmoid_forward_f64(double *y, const double *x, size_t n) {
    ka64_run(ka64_sigmoid_fwd_range, KC_GRAIN_HEAVY, y, x, NULL, n);
}
void kc_sigmoid_backward_f64(double *dx, const double *dy, const double *x, size_t n) {
    ka64_run(ka64_sigmoid_bwd_range, KC_GRAIN_HEAVY, dx, dy, x, n);
}
void kc_leaky_relu_forward_f64(double *y, const double *x, size_t n) {
    ka64_run(ka64_leaky_fwd_range, KC_GRAIN_STREAM / 2, y, x, NULL, n);
}
void kc_leaky_relu_backward_f64(double *dx, const double *dy, const double *x, size_t n) {
    ka64_run(ka64_leaky_bwd_range, KC_GRAIN_STREAM / 2, dx, dy, x, n);
}
