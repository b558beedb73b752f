/*
 * km_optim.h — the scalar coefficients of one torch.optim.SGD and one
 * torch.optim.AdamW step, formed once for both kernel sets: kernels/cpu (cpu_train.inc) and
 * kernels/cuda (kg_math.cuh, which passes them to its kernels by value).
 * Each scalar is a Python float in PyTorch, formed in double and rounded to
 * the parameter's type once where it meets the tensor; the bias corrections
 * use libm's pow in double. Host code only.
 */
#ifndef KILN_KERNELS_COMMON_KM_OPTIM_H
#define KILN_KERNELS_COMMON_KM_OPTIM_H

#include <math.h>
#include <stdint.h>

typedef struct km_adamw_coef_f32 {
    float decay;        /* 1 - lr * wd */
    float w1;           /* lerp weight 1 - beta1 */
    float one_minus_w1; /* 1 - w1 in float, for lerp's large-weight form */
    float beta2, c2;    /* beta2, 1 - beta2 */
    float bc2_sqrt;     /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step;     /* -lr / (1 - beta1^step) */
    int big_weight;     /* w1 >= 0.5 (or NaN): lerp's other formula */
} km_adamw_coef_f32;

typedef struct km_adamw_coef_f64 {
    double decay, w1, one_minus_w1, beta2, c2, bc2_sqrt, eps, neg_step; /* as above, in double */
    int big_weight;
} km_adamw_coef_f64;

/* The coefficients of step `step` (< 1 is treated as 1), float32 parameters. */
static inline km_adamw_coef_f32 km_adamw_coef_f32_make(double lr, double beta1, double beta2, double eps,
                                                       double weight_decay, int64_t step) {
    if (step < 1) step = 1;
    const double bc1 = 1.0 - pow(beta1, (double)step);
    const double bc2 = 1.0 - pow(beta2, (double)step);
    km_adamw_coef_f32 c;
    c.decay = (float)(1.0 - lr * weight_decay);
    c.w1 = (float)(1.0 - beta1);
    c.one_minus_w1 = 1.0f - c.w1;
    c.big_weight = !(fabsf(c.w1) < 0.5f);
    c.beta2 = (float)beta2;
    c.c2 = (float)(1.0 - beta2);
    c.bc2_sqrt = (float)sqrt(bc2);
    c.eps = (float)eps;
    c.neg_step = (float)(-(lr / bc1));
    return c;
}

/* The same for float64 parameters: nothing rounds. */
static inline km_adamw_coef_f64 km_adamw_coef_f64_make(double lr, double beta1, double beta2, double eps,
                                                       double weight_decay, int64_t step) {
    if (step < 1) step = 1;
    km_adamw_coef_f64 c;
    c.decay = 1.0 - lr * weight_decay;
    c.w1 = 1.0 - beta1;
    c.one_minus_w1 = 1.0 - c.w1;
    c.big_weight = !(fabs(c.w1) < 0.5);
    c.beta2 = beta2;
    c.c2 = 1.0 - beta2;
    c.bc2_sqrt = sqrt(1.0 - pow(beta2, (double)step));
    c.eps = eps;
    c.neg_step = -(lr / (1.0 - pow(beta1, (double)step)));
    return c;
}

/* The scalars of one SGD step, with the option flags normalised: without
 * momentum (momentum 0, or no buffer) there is no first-step or Nesterov
 * handling. */
typedef struct km_sgd_coef_f32 {
    float neg_lr;         /* alpha of param.add_(d, alpha=-lr) */
    float momentum;
    float one_minus_damp; /* 1 - dampening: a Python float rounded to float once */
    float wd;
    int has_wd, has_mom, first, nesterov;
} km_sgd_coef_f32;

typedef struct km_sgd_coef_f64 {
    double neg_lr, momentum, one_minus_damp, wd; /* as above, in double */
    int has_wd, has_mom, first, nesterov;
} km_sgd_coef_f64;

/* have_buf: whether a momentum buffer was passed. */
/* The step's switches, alike for both types: weight decay on, momentum on
 * (with a buffer to keep it), the first momentum step, Nesterov. */
#define KM_SGD_SWITCHES(c, weight_decay, momentum, nesterov, first_step, have_buf) \
    do {                                                                         \
        (c).has_wd = (weight_decay) != 0;                                        \
        (c).has_mom = (momentum) != 0 && (have_buf);                             \
        (c).first = (c).has_mom && (first_step);                                 \
        (c).nesterov = (c).has_mom && (nesterov);                                \
    } while (0)

static inline km_sgd_coef_f32 km_sgd_coef_f32_make(float lr, float momentum, float dampening, int nesterov,
                                                   float weight_decay, int first_step, int have_buf) {
    km_sgd_coef_f32 c;
    c.neg_lr = -lr;
    c.momentum = momentum;
    c.one_minus_damp = (float)(1.0 - (double)dampening);
    c.wd = weight_decay;
    KM_SGD_SWITCHES(c, weight_decay, momentum, nesterov, first_step, have_buf);
    return c;
}

static inline km_sgd_coef_f64 km_sgd_coef_f64_make(double lr, double momentum, double dampening, int nesterov,
                                                   double weight_decay, int first_step, int have_buf) {
    km_sgd_coef_f64 c;
    c.neg_lr = -lr;
    c.momentum = momentum;
    c.one_minus_damp = 1.0 - dampening;
    c.wd = weight_decay;
    KM_SGD_SWITCHES(c, weight_decay, momentum, nesterov, first_step, have_buf);
    return c;
}

#endif /* KILN_KERNELS_COMMON_KM_OPTIM_H */
