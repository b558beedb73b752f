/*
 * km_ew.h — the per-element arithmetic of the ABI 1.5 elementwise kernel
 * entries (lerp, sign, mul, addcmul, addcdiv, sqrt, clamp; kiln/training.h
 * states each formula), in float32 and float64, written once for both
 * kernel sets: kernels/cpu (cpu_ew.c) inlines it, and kernels/cuda
 * (kg_ew.cu) calls it on the device, so an optimizer built from these
 * entries gives the same bits on the cpu, on a GPU and on the fake CUDA
 * stack. Each function is one fixed sequence of IEEE operations: no fused
 * multiply-add (the cpu library builds with -ffp-contract=off, the cuda one
 * with --fmad=false), and sqrt is the correctly rounded IEEE square root on
 * both (libm's sqrtf/sqrt, CUDA's with --prec-sqrt=true). The scalar
 * arguments arrive as doubles and are rounded to the element type once, on
 * the host, by the *_make functions (km_ew_scalars).
 */
#ifndef KILN_KERNELS_COMMON_KM_EW_H
#define KILN_KERNELS_COMMON_KM_EW_H

#include <math.h>

#include "km_act.h" /* KM_FN */

/* The scalars of one call, rounded to the element type: lerp's weight w,
 * 1 - w formed in that type and which of torch.lerp's two formulas applies;
 * s0/s1 = addcmul/addcdiv's value, or clamp's lo and hi. */
typedef struct km_ew_scalars_f32 {
    float w, one_minus_w, s0, s1;
    int big_weight; /* !(|w| < 0.5): the b - (b - a) * (1 - w) form (NaN w too) */
} km_ew_scalars_f32;

typedef struct km_ew_scalars_f64 {
    double w, one_minus_w, s0, s1;
    int big_weight;
} km_ew_scalars_f64;

/* weight: lerp's; s0, s1: the other entries' (unused ones 0). Host code. */
static inline km_ew_scalars_f32 km_ew_scalars_f32_make(double weight, double s0, double s1) {
    km_ew_scalars_f32 c;
    c.w = (float)weight;
    c.one_minus_w = 1.0f - c.w;
    c.big_weight = !(fabsf(c.w) < 0.5f);
    c.s0 = (float)s0;
    c.s1 = (float)s1;
    return c;
}

static inline km_ew_scalars_f64 km_ew_scalars_f64_make(double weight, double s0, double s1) {
    km_ew_scalars_f64 c;
    c.w = weight;
    c.one_minus_w = 1.0 - weight;
    c.big_weight = !(fabs(weight) < 0.5);
    c.s0 = s0;
    c.s1 = s1;
    return c;
}

/* torch.lerp's CPU formula: exact at both ends (w = 0 gives a, w = 1 b). */
KM_FN float km_lerp_f32(float a, float b, const km_ew_scalars_f32 *c) {
    return c->big_weight ? b - (b - a) * c->one_minus_w : a + c->w * (b - a);
}
KM_FN double km_lerp_f64(double a, double b, const km_ew_scalars_f64 *c) {
    return c->big_weight ? b - (b - a) * c->one_minus_w : a + c->w * (b - a);
}

/* +1, -1, +0 for +-0; a NaN is returned as it came (payload and sign). */
KM_FN float km_sign_f32(float x) { return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : x == x ? 0.0f : x; }
KM_FN double km_sign_f64(double x) { return x > 0.0 ? 1.0 : x < 0.0 ? -1.0 : x == x ? 0.0 : x; }

/* y + (value * a) * b, and y + (value * a) / b: torch's left-to-right order. */
KM_FN float km_addcmul_f32(float y, float value, float a, float b) { return y + (value * a) * b; }
KM_FN double km_addcmul_f64(double y, double value, double a, double b) { return y + (value * a) * b; }
KM_FN float km_addcdiv_f32(float y, float value, float a, float b) { return y + (value * a) / b; }
KM_FN double km_addcdiv_f64(double y, double value, double a, double b) { return y + (value * a) / b; }

/* The comparisons in this order are the host's old value-clipping loop
 * (g > v ? v : g < -v ? -v : g), so clamping through the kernel table
 * keeps its bits: NaN fails both tests and stays, -0 stays -0. */
KM_FN float km_clamp_f32(float x, float lo, float hi) { return x > hi ? hi : x < lo ? lo : x; }
KM_FN double km_clamp_f64(double x, double lo, double hi) { return x > hi ? hi : x < lo ? lo : x; }

KM_FN float km_sqrt_f32(float x) { return sqrtf(x); }
KM_FN double km_sqrt_f64(double x) { return sqrt(x); }

#endif /* KILN_KERNELS_COMMON_KM_EW_H */
