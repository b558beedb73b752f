/*
 * cpu_train_f64.c: the float64 training kernels (the *_f64 entries of
 * cpu_kernels.h), the instance of cpu_train.inc for double, for a "64-true"
 * precision that keeps master weights, gradients and activations in double
 * as PyTorch does for a .double() model. The per-type pieces follow from
 * that: GELU, tanh, sigmoid and the loss rows call libm's exp/tanh (accurate
 * in double; no inlined polynomial is needed at this precision), the loss
 * rows divide by their denominator, and the optimizer updates keep IEEE
 * gradual underflow (PyTorch's default; a double decays for thousands of
 * steps before it reaches the subnormals, so the float32 reason for
 * flushing does not arise).
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"
#include "../common/km_optim.h"

#include <math.h>

#define KC_T double
#define KC_LIT(x) x
#define KC_BITS uint64_t
#define KC_EXP_MASK 0x7ff0000000000000ull
#define KC_PUB(name) name##_f64
#define KC_ADAMW_UPDATE kc_adamw_update_f64
#define KC_SGD_COEF km_sgd_coef_f64
#define KC_SGD_COEF_MAKE km_sgd_coef_f64_make
#define KC_ADAMW_COEF km_adamw_coef_f64
#define KC_ADAMW_COEF_MAKE km_adamw_coef_f64_make
#define KC_OPT_FTZ 0

/* GELU tanh-approximation constants in double: sqrt(2/pi) and 0.044715. */
#define KC64_GELU_BETA 0.79788456080286535588
#define KC64_GELU_KAPPA 0.044715

/* gelu(x) = x * sigmoid(2u) = 0.5 x (1 + tanh u), u = beta (x + kappa x^3):
 * the float version's form. For very negative x, exp overflows to inf and
 * x / inf gives -0, the correct limit. NaN propagates through u. */
static inline double kc_t_gelu(double x) {
    const double u = KC64_GELU_BETA * (x + KC64_GELU_KAPPA * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}

/* s + x * 2 s (1 - s) du/dx with s = sigmoid(2u) = 1 / (1 + e^t), t = -2u.
 * Unlike the float version (whose exp is clamped), libm's exp overflows for
 * x below about -21, where e * s would be inf * 0 = NaN; so s and 1 - s come
 * from exp(-|t|), which never overflows, each without cancellation. Far in
 * the negative tail s underflows to 0 and so does the derivative (its true
 * value is below 1e-300). */
static inline double kc_t_gelu_grad(double x) {
    const double x2 = x * x;
    const double u = KC64_GELU_BETA * (x + KC64_GELU_KAPPA * x2 * x);
    const double t = -2.0 * u;
    const double e = exp(-fabs(t)); /* (0, 1] */
    const double r = 1.0 / (1.0 + e);
    const double s = t > 0.0 ? e * r : r;
    const double one_minus_s = t > 0.0 ? r : e * r;
    const double du = KC64_GELU_BETA * (1.0 + 3.0 * KC64_GELU_KAPPA * x2);
    return s + 2.0 * x * du * one_minus_s * s;
}

/* libm's tanh is accurate to ~1 ulp, gives +-1 for large |x| and keeps NaN. */
static inline double kc_t_tanh(double x) { return tanh(x); }

/* 4e / (1 + e)^2, e = exp(-2|x|) (underflows to 0 gracefully). */
static inline double kc_t_tanh_grad(double x) {
    const double e = exp(-2.0 * fabs(x));
    const double r = 1.0 / (1.0 + e);
    return x != x ? x : 4.0 * e * r * r;
}

/* 1 / (1 + e) for x >= 0, e / (1 + e) below, e = exp(-|x|): no overflow, no
 * cancellation. */
static inline double kc_t_sigmoid(double x) {
    const double e = exp(-fabs(x));
    const double r = 1.0 / (1.0 + e);
    return x != x ? x : (x >= 0.0 ? r : e * r);
}

/* e / (1 + e)^2 (even in x). */
static inline double kc_t_sigmoid_grad(double x) {
    const double e = exp(-fabs(x));
    const double r = 1.0 / (1.0 + e);
    return x != x ? x : e * r * r;
}

static inline double kc_t_exp(double x) { return exp(x); }
static KC_ALWAYS_INLINE double kc_t_sqrt(double x) { return sqrt(x); }

/* p: (C) /= denom: the correctly rounded quotient (a reciprocal would add
 * a rounding, and the division is cheap next to the row's exp calls). */
static KC_ALWAYS_INLINE void kc_t_xent_normalize(double *restrict p, size_t C, double denom) {
    for (size_t j = 0; j < C; j++) p[j] /= denom;
}

#include "cpu_train.inc"
