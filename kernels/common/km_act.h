/*
 * km_act.h — the float32 activation math both kernel sets evaluate, written
 * once: the cpu kernels (kernels/cpu, C11) inline it, and the cuda kernels
 * (kernels/cuda/kg_math.cuh) call it on host and device, so a GELU, tanh or
 * sigmoid on the GPU gives the CPU's bits rather than CUDA's expf/tanhf. Each
 * function is a fixed sequence of IEEE float operations: no FMA (the cpu
 * library builds with -ffp-contract=off, the cuda one with --fmad=false), no
 * reassociation, and no libm call, so the result does not depend on which
 * compiler, vector width or device ran it.
 *
 *   km_exp_inline   exp(x), |x| clamped to 80 (GELU)
 *   km_exp_nonpos   exp(x) for x <= 0, down into the subnormals (tanh, sigmoid)
 *   km_gelu, km_gelu_grad, km_tanh, km_tanh_grad, km_sigmoid, km_sigmoid_grad
 */
#ifndef KILN_KERNELS_COMMON_KM_ACT_H
#define KILN_KERNELS_COMMON_KM_ACT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KM_FN static __host__ __device__ __forceinline__
#else
#define KM_FN static inline __attribute__((always_inline))
#endif

#define KM_GELU_BETA 0.7978845608028654f /* sqrt(2 / pi) */
#define KM_GELU_KAPPA 0.044715f
/* Below this, float32 tanh uses the odd polynomial: there exp(-2|x|) > 0.45
 * and (1 - e) / (1 + e) would cancel. */
#define KM_TANH_SMALL 0.4f

/* The body of a bit cast: v's bits as a `To` of the same size, by the CUDA
 * intrinsic on the device and by memcpy on the host (the one cast C allows
 * without aliasing trouble). Every km_ and kg_ bit cast is one line of it. */
#ifdef __CUDA_ARCH__
#define KM_BITCAST(To, v, cuda_intrinsic) return (To)cuda_intrinsic(v)
#else
#define KM_BITCAST(To, v, cuda_intrinsic) \
    do {                                    \
        To km_to_;                          \
        memcpy(&km_to_, &(v), sizeof km_to_); \
        return km_to_;                      \
    } while (0)
#endif

/* The float whose bits are u (a power of two built in the exponent field). */
KM_FN float km_f32_from_bits(uint32_t u) { KM_BITCAST(float, u, __uint_as_float); }

/* float32 bits of x */
KM_FN uint32_t km_f32_bits(float x) { KM_BITCAST(uint32_t, x, __float_as_uint); }

/*
 * exp(x) with |x| clamped to 80 (NaN becomes +-80): Cody-Waite reduction,
 * degree-7 Taylor polynomial, 2^k in the exponent bits; 1-2 ulp for |x| < 80,
 * a normal float and 1/(1+exp(x)) above the denormal range.
 */
KM_FN float km_exp_inline(float x) {
    /* One clamp on |x|, not two on x: with two, GCC's jump threading clones
     * the rest of the computation for each constant bound, which costs two
     * extra vector divisions per GELU element. */
    float a = fabsf(x);
    a = a < 80.0f ? a : 80.0f;
    x = copysignf(a, x);
    /* round(x / ln2) by the 1.5 * 2^23 trick: exact for |value| < 2^22, needs
     * round-to-nearest and no reassociation. */
    const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    /* ln2 split: the high part has 15 significant bits, so k * hi is exact. */
    float r = x - k * 0.693145751953125f;
    r = r - k * 1.42860682030941723e-6f;
    float p = 1.98412698412698413e-4f;   /* 1/7! */
    p = p * r + 1.38888888888888889e-3f; /* 1/6! */
    p = p * r + 8.33333333333333333e-3f; /* 1/5! */
    p = p * r + 4.16666666666666667e-2f; /* 1/4! */
    p = p * r + 1.66666666666666667e-1f; /* 1/3! */
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t ki = (int32_t)k;
    return p * km_f32_from_bits((uint32_t)(ki + 127) << 23);
}

/*
 * exp(x) for x <= 0 (x clamped to [-104, 0]; NaN becomes 0 here, callers
 * pass NaN through themselves): the same reduction and polynomial, with 2^k
 * applied as two normal factors so that only the final multiply rounds into
 * the subnormals. About 2 ulp.
 */
KM_FN float km_exp_nonpos(float x) {
    x = x > -104.0f ? x : -104.0f;
    x = x < 0.0f ? x : 0.0f;
    const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - k * 0.693145751953125f;
    r = r - k * 1.42860682030941723e-6f;
    float p = 1.98412698412698413e-4f;
    p = p * r + 1.38888888888888889e-3f;
    p = p * r + 8.33333333333333333e-3f;
    p = p * r + 4.16666666666666667e-2f;
    p = p * r + 1.66666666666666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t ki = (int32_t)k; /* [-150, 0] */
    const int32_t k1 = ki / 2, k2 = ki - k1;
    const float s1 = km_f32_from_bits((uint32_t)(k1 + 127) << 23);
    const float s2 = km_f32_from_bits((uint32_t)(k2 + 127) << 23);
    return (p * s1) * s2;
}

/* tanh(a) for 0 <= a < 0.4: odd Taylor polynomial through a^13 (truncation
 * below 5e-9 relative). */
KM_FN float km_tanh_small(float a) {
    const float a2 = a * a;
    float p = 3.59212803e-3f;    /* 21844/6081075: the coefficients of a^13 .. a^3 */
    p = p * a2 - 8.86323552e-3f; /* -1382/155925 */
    p = p * a2 + 2.18694885e-2f; /* 62/2835 */
    p = p * a2 - 5.39682540e-2f; /* -17/315 */
    p = p * a2 + 1.33333333e-1f; /* 2/15 */
    p = p * a2 - 3.33333333e-1f; /* -1/3 */
    return a + a * (a2 * p);
}

/*
 * gelu(x) = x * sigmoid(2u), u = beta * (x + kappa x^3), which equals
 * 0.5 x (1 + tanh(u)). The sigmoid form needs only exp and, unlike
 * 1 + tanh(u), does not cancel for negative x. NaN x reaches y through the
 * leading x even though km_exp_inline clamps NaN away.
 */
KM_FN float km_gelu(float x) {
    const float u = KM_GELU_BETA * (x + KM_GELU_KAPPA * x * x * x);
    const float e = km_exp_inline(-2.0f * u);
    return x / (1.0f + e);
}

/*
 * d/dx [x s] with s = sigmoid(2u): s + x * 2 s (1 - s) du/dx, where
 * du/dx = beta (1 + 3 kappa x^2). 1 - s is formed as e * s (= e / (1 + e)),
 * exact-ish where 1 - s would cancel (large positive x).
 */
KM_FN float km_gelu_grad(float x) {
    const float x2 = x * x;
    const float u = KM_GELU_BETA * (x + KM_GELU_KAPPA * x2 * x);
    const float e = km_exp_inline(-2.0f * u);
    const float s = 1.0f / (1.0f + e);
    const float one_minus_s = e * s;
    const float du = KM_GELU_BETA * (1.0f + 3.0f * KM_GELU_KAPPA * x2);
    return s + 2.0f * x * du * one_minus_s * s;
}

/* tanh(x): the polynomial for |x| < 0.4, else (1 - e) / (1 + e) with
 * e = exp(-2|x|), sign restored; +-1 from |x| ~ 9 on, never NaN for inf. */
KM_FN float km_tanh(float x) {
    const float a = fabsf(x);
    const float e = km_exp_nonpos(-2.0f * a);
    const float big = (1.0f - e) / (1.0f + e);
    const float t = copysignf(a < KM_TANH_SMALL ? km_tanh_small(a) : big, x);
    return x != x ? x : t;
}

/* tanh'(x) = 1 - tanh^2: computed so for |x| < 0.4 (tanh^2 < 0.15, no
 * cancellation, and never above 1), else as 4e / (1 + e)^2, e = exp(-2|x|),
 * which keeps full relative accuracy in the tails where 1 - y^2 would lose
 * everything. */
KM_FN float km_tanh_grad(float x) {
    const float a = fabsf(x);
    const float e = km_exp_nonpos(-2.0f * a);
    const float r = 1.0f / (1.0f + e);
    const float t = km_tanh_small(a);
    const float g = a < KM_TANH_SMALL ? 1.0f - t * t : 4.0f * e * r * r;
    return x != x ? x : g;
}

/* sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0, e = exp(-|x|):
 * both forms are free of overflow and cancellation. */
KM_FN float km_sigmoid(float x) {
    const float e = km_exp_nonpos(-fabsf(x));
    const float r = 1.0f / (1.0f + e);
    const float s = x >= 0.0f ? r : e * r;
    return x != x ? x : s;
}

/* sigmoid'(x) = s (1 - s) = e / (1 + e)^2 (even in x). */
KM_FN float km_sigmoid_grad(float x) {
    const float e = km_exp_nonpos(-fabsf(x));
    const float r = 1.0f / (1.0f + e);
    const float g = e * r * r;
    return x != x ? x : g;
}

#endif /* KILN_KERNELS_COMMON_KM_ACT_H */
