/*
 * kg_math.cuh: the per-element arithmetic of the CUDA kernels, as
 * __host__ __device__ inline functions, so that one definition runs in the
 * kernels and in a host-only test (tests/cuda_math) that compares it with the
 * CPU references of kernels/cpu. The float32 GELU, tanh and sigmoid are not
 * restated: both sides call kernels/common/km_act.h. Every other function
 * here re-states one CPU formula operation for operation (same constants, same order, same float or
 * double choice, no fused multiply-add: the kernels are built with
 * --fmad=false), so that with IEEE division and square root (nvcc's default
 * -prec-div/-prec-sqrt, no -ftz) a float result is the CPU's bit for bit,
 * except where the CPU calls libm (expf and log in the loss, exp and tanh
 * in the float64 activations), where CUDA's versions are within 1-2 ulp
 * (the host test, calling the same libm, is bit-exact there). The 16-bit
 * conversions are written as integer arithmetic on the bits instead of
 * cuda_fp16.h's intrinsics, because those canonicalise NaN (dropping sign
 * and payload) where the CPU (_Float16, x86 F16C or libgcc) keeps them;
 * integer code gives the same bits on host, device and CPU. The scalar
 * coefficients of SGD and AdamW are formed by host functions here, in the
 * CPU's float/double order, and passed to the kernels as structs.
 */
#ifndef KILN_KERNELS_CUDA_KG_MATH_CUH
#define KILN_KERNELS_CUDA_KG_MATH_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../common/km_act.h"
#include "../common/km_optim.h"
#include "kg_kernels.h"

#define KG_HD static __host__ __device__ __forceinline__

/* ----------------------------------------------------------- bit casts */

/* km_act.h has the float32 ones already (its polynomial exps build 2^k
 * with them); the double ones are the same one-line KM_BITCAST */
KG_HD uint32_t kg_f32_bits(float x) { return km_f32_bits(x); }
KG_HD float kg_f32_from_bits(uint32_t u) { return km_f32_from_bits(u); }
KG_HD uint64_t kg_f64_bits(double x) { KM_BITCAST(uint64_t, x, __double_as_longlong); }
KG_HD double kg_f64_from_bits(uint64_t u) { KM_BITCAST(double, u, __longlong_as_double); }

/* The NaN the CPU's NAN macro gives (positive quiet NaN), in each type. */
KG_HD float kg_nan_f32(void) { return kg_f32_from_bits(0x7fc00000u); }
KG_HD double kg_nan_f64(void) { return kg_f64_from_bits(0x7ff8000000000000ull); }

template <typename T> KG_HD T kg_nan(void) {
    if constexpr (sizeof(T) == sizeof(float)) return kg_nan_f32();
    else return kg_nan_f64();
}

/* Inf or NaN: all exponent bits set (the CPU's integer test, which does not
 * depend on floating-point compare semantics). */
KG_HD int kg_nonfinite_f32(float x) { return (kg_f32_bits(x) & 0x7f800000u) == 0x7f800000u; }
KG_HD int kg_nonfinite_f64(double x) {
    return (kg_f64_bits(x) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}
KG_HD int kg_nonfinite_f16(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }
KG_HD int kg_nonfinite_bf16(uint16_t b) { return (b & 0x7f80u) == 0x7f80u; }

/* ------------------------------------------- float32 <-> float64 casts */

/*
 * (float)d, with NaN made explicit: x86's cvtsd2ss (the CPU reference) keeps
 * a NaN's sign and the top 23 payload bits and sets the quiet bit, while a
 * GPU conversion may return the canonical NaN. Everything else is the
 * hardware's round-to-nearest-even conversion, the same on both.
 */
KG_HD float kg_f64_to_f32(double d) {
    if (d != d) {
        const uint64_t u = kg_f64_bits(d);
        return kg_f32_from_bits((uint32_t)(u >> 32 & 0x80000000u) | 0x7fc00000u | (uint32_t)(u >> 29 & 0x7fffffu));
    }
    return (float)d;
}

/* (double)f (exact), NaN likewise made explicit (cvtss2sd's rule). */
KG_HD double kg_f32_to_f64(float f) {
    if (f != f) {
        const uint32_t u = kg_f32_bits(f);
        return kg_f64_from_bits((uint64_t)(u & 0x80000000u) << 32 | 0x7ff8000000000000ull |
                                (uint64_t)(u & 0x7fffffu) << 29);
    }
    return (double)f;
}

/*
 * d rounded to float by rounding to odd (truncate, then set the lowest bit
 * if anything was dropped), cpu_dtype.c's kc_bf16_bits_f64 first step: a
 * later round-to-nearest-even to a format with at least 2 fewer significant
 * bits (bfloat16, float16) then rounds exactly as a single rounding of d
 * would (no double rounding). Beyond float's range it gives +-FLT_MAX (odd),
 * which both 16-bit roundings send to +-inf.
 */
KG_HD float kg_f64_to_f32_odd(double d) {
    float f = kg_f64_to_f32(d);
    if (d == d && (double)f != d) { /* inexact and not NaN */
        uint32_t u = kg_f32_bits(f);
        if (fabs((double)f) > fabs(d)) u -= 1u; /* magnitude one ulp down: truncation */
        u |= 1u;
        f = kg_f32_from_bits(u);
    }
    return f;
}

/* ---------------------------------------------------- float16 (binary16) */

/*
 * float -> float16 bits, round to nearest even; |x| >= 65520 gives inf
 * (65520 is the midpoint between 65504, whose last bit is odd, and 2^16, so
 * the tie goes up);
 * values below 2^-14 become subnormals (steps of 2^-24), 2^-25 and below
 * round to +-0; NaN keeps its sign and top 10 payload bits and gets the
 * quiet bit, as _Float16 conversion (F16C's vcvtps2ph, libgcc) does.
 */
KG_HD uint16_t kg_f16_bits(float x) {
    const uint32_t u = kg_f32_bits(x);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {
        /* Normal: rebias the exponent (127 -> 15), keep 10 mantissa bits;
         * a carry out of the mantissa correctly bumps the exponent. */
        const uint32_t h = (a - 0x38000000u) >> 13;
        const uint32_t rest = a & 0x1fffu;
        const uint32_t up = rest > 0x1000u || (rest == 0x1000u && (h & 1u));
        return (uint16_t)(sign | (h + up));
    }
    if (a <= 0x33000000u) return (uint16_t)sign;
    /* Subnormal: the value in units of 2^-24 is m * 2^(e - 126), e in
     * [102, 112], so shift the 24-bit significand right by 126 - e in
     * [14, 24]; rounding up from 0x3ff gives 0x400, the smallest normal. */
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t s = 126u - e;
    const uint32_t h = m >> s;
    const uint32_t rest = m & ((1u << s) - 1u);
    const uint32_t half = 1u << (s - 1u);
    const uint32_t up = rest > half || (rest == half && (h & 1u));
    return (uint16_t)(sign | (h + up));
}

/* float16 bits -> float (exact); NaN keeps sign and payload, gets the
 * quiet bit (as vcvtph2ps does for a signalling NaN). */
KG_HD float kg_f16_value(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu;
    const uint32_t m = h & 0x3ffu;
    if (e == 0x1fu) return kg_f32_from_bits(sign | 0x7f800000u | (m ? 0x400000u : 0u) | (m << 13));
    if (e == 0u) {
        /* m * 2^-24: both factors and the product are exact in float. */
        const float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return kg_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

/* double -> float16 with one rounding (libgcc's __truncdfhf2 on the CPU):
 * round to odd to float, then to nearest even to float16. */
KG_HD uint16_t kg_f16_bits_f64(double d) { return kg_f16_bits(kg_f64_to_f32_odd(d)); }

/* ------------------------------------------------------------- bfloat16 */

/*
 * float -> bfloat16 bits, round to nearest even: cpu_internal.h's
 * kc_bf16_bits verbatim (adding 0x7fff plus the lowest kept bit carries
 * exactly when the dropped half is above the midpoint, or at it with an odd
 * kept half; finite values past the largest bfloat16 carry into inf; NaN
 * keeps sign and top payload and gets the quiet bit).
 */
KG_HD uint16_t kg_bf16_bits(float x) {
    const uint32_t u = kg_f32_bits(x);
    const uint32_t quiet_nan = (u >> 16) | 0x0040u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* bfloat16 bits -> float (exact: the bits are the top half). */
KG_HD float kg_bf16_value(uint16_t b) { return kg_f32_from_bits((uint32_t)b << 16); }

/* double -> bfloat16 with one rounding (kc_bf16_bits_f64). */
KG_HD uint16_t kg_bf16_bits_f64(double d) { return kg_bf16_bits(kg_f64_to_f32_odd(d)); }

/* x rounded through a 16-bit format and back (kc_round_f16 / _bf16). */
KG_HD float kg_round_f16(float x) { return kg_f16_value(kg_f16_bits(x)); }
KG_HD float kg_round_bf16(float x) { return kg_bf16_value(kg_bf16_bits(x)); }

/* ----------------------------------------- dtype-generic storage access */

/* The storage type of a KG_* dtype: F16 and BF16 are bit patterns. */
template <int DT> struct kg_storage;
template <> struct kg_storage<KG_F32> { typedef float type; };
template <> struct kg_storage<KG_F64> { typedef double type; };
template <> struct kg_storage<KG_F16> { typedef uint16_t type; };
template <> struct kg_storage<KG_BF16> { typedef uint16_t type; };

/* The dtype of a compute type (float or double). */
template <typename T> struct kg_dtype_of;
template <> struct kg_dtype_of<float> { enum { value = KG_F32 }; };
template <> struct kg_dtype_of<double> { enum { value = KG_F64 }; };

/*
 * One element converted from dtype S to dtype D with the CPU's kc_cast
 * rules: narrowing rounds to nearest even once (float64 to the 16-bit
 * formats through round-to-odd; float16 <-> bfloat16 through float, which
 * holds both exactly), widening is exact, NaN keeps its sign.
 */
template <int D, int S>
__host__ __device__ __forceinline__ typename kg_storage<D>::type kg_convert(typename kg_storage<S>::type v) {
    if constexpr (D == S) {
        return v;
    } else if constexpr (D == KG_F32) {
        if constexpr (S == KG_F64) return kg_f64_to_f32(v);
        else if constexpr (S == KG_F16) return kg_f16_value(v);
        else return kg_bf16_value(v);
    } else if constexpr (D == KG_F64) {
        if constexpr (S == KG_F32) return kg_f32_to_f64(v);
        else if constexpr (S == KG_F16) return kg_f32_to_f64(kg_f16_value(v));
        else return kg_f32_to_f64(kg_bf16_value(v));
    } else if constexpr (D == KG_F16) {
        if constexpr (S == KG_F32) return kg_f16_bits(v);
        else if constexpr (S == KG_F64) return kg_f16_bits_f64(v);
        else return kg_f16_bits(kg_bf16_value(v));
    } else {
        if constexpr (S == KG_F32) return kg_bf16_bits(v);
        else if constexpr (S == KG_F64) return kg_bf16_bits_f64(v);
        else return kg_bf16_bits(kg_f16_value(v));
    }
}

/* An element of dtype DT as a double (exact), for the reductions. */
template <int DT> __host__ __device__ __forceinline__ double kg_to_double(typename kg_storage<DT>::type v) {
    if constexpr (DT == KG_F32) return (double)v;
    else if constexpr (DT == KG_F64) return v;
    else if constexpr (DT == KG_F16) return (double)kg_f16_value(v);
    else return (double)kg_bf16_value(v);
}

/* Inf/NaN test on the stored bits of dtype DT. */
template <int DT> __host__ __device__ __forceinline__ int kg_nonfinite(typename kg_storage<DT>::type v) {
    if constexpr (DT == KG_F32) return kg_nonfinite_f32(v);
    else if constexpr (DT == KG_F64) return kg_nonfinite_f64(v);
    else if constexpr (DT == KG_F16) return kg_nonfinite_f16(v);
    else return kg_nonfinite_bf16(v);
}

/* ------------------------------------------------ activation constants */

/* GELU tanh-approximation constants in double (cpu_train_f64.c; float32's are
 * km_act.h's). */
#define KG_GELU64_BETA 0.79788456080286535588
#define KG_GELU64_KAPPA 0.044715
/* Leaky ReLU's negative slope (torch's 0.2), float and double. */
#define KG_LEAKY_SLOPE 0.2f
#define KG_LEAKY64_SLOPE 0.2

/* --------------------------------------------- activations, float32 */

/* torch.relu: x < 0 ? 0 : x (NaN and -0 pass through). */
KG_HD float kg_relu(float x) { return x < 0.0f ? 0.0f : x; }
/* dx = x > 0 ? dy : 0 (NaN x gives 0). */
KG_HD float kg_relu_bwd(float dy, float x) { return x > 0.0f ? dy : 0.0f; }

/* GELU, tanh, sigmoid and their gradients: kernels/common/km_act.h, the
 * cpu kernels' own code, so the GPU gives their bits. */
KG_HD float kg_gelu(float x) { return km_gelu(x); }
KG_HD float kg_gelu_grad(float x) { return km_gelu_grad(x); }
KG_HD float kg_tanh(float x) { return km_tanh(x); }
KG_HD float kg_tanh_grad(float x) { return km_tanh_grad(x); }
KG_HD float kg_sigmoid(float x) { return km_sigmoid(x); }
KG_HD float kg_sigmoid_grad(float x) { return km_sigmoid_grad(x); }

KG_HD float kg_leaky_relu(float x) { return x > 0.0f ? x : x * KG_LEAKY_SLOPE; }
KG_HD float kg_leaky_relu_bwd(float dy, float x) { return x > 0.0f ? dy : dy * KG_LEAKY_SLOPE; }

/* --------------------------------------------- activations, float64 */

KG_HD double kg_relu(double x) { return x < 0.0 ? 0.0 : x; }
KG_HD double kg_relu_bwd(double dy, double x) { return x > 0.0 ? dy : 0.0; }

/* x / (1 + exp(-2u)) with exp (libm on the CPU; CUDA's exp is within 1 ulp
 * of it). */
KG_HD double kg_gelu(double x) {
    const double u = KG_GELU64_BETA * (x + KG_GELU64_KAPPA * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}

/* kc64_gelu_grad_one: s and 1 - s from exp(-|t|), t = -2u, which never
 * overflows, each without cancellation. */
KG_HD double kg_gelu_grad(double x) {
    const double x2 = x * x;
    const double u = KG_GELU64_BETA * (x + KG_GELU64_KAPPA * x2 * x);
    const double t = -2.0 * u;
    const double e = exp(-fabs(t));
    const double r = 1.0 / (1.0 + e);
    const double s = t > 0.0 ? e * r : r;
    const double one_minus_s = t > 0.0 ? r : e * r;
    const double du = KG_GELU64_BETA * (1.0 + 3.0 * KG_GELU64_KAPPA * x2);
    return s + 2.0 * x * du * one_minus_s * s;
}

KG_HD double kg_tanh(double x) { return tanh(x); }

KG_HD double kg_tanh_grad(double x) {
    const double e = exp(-2.0 * fabs(x));
    const double r = 1.0 / (1.0 + e);
    return x != x ? x : 4.0 * e * r * r;
}

KG_HD double kg_sigmoid(double x) {
    const double e = exp(-fabs(x));
    const double r = 1.0 / (1.0 + e);
    return x != x ? x : (x >= 0.0 ? r : e * r);
}

KG_HD double kg_sigmoid_grad(double x) {
    const double e = exp(-fabs(x));
    const double r = 1.0 / (1.0 + e);
    return x != x ? x : e * r * r;
}

KG_HD double kg_leaky_relu(double x) { return x > 0.0 ? x : x * KG_LEAKY64_SLOPE; }
KG_HD double kg_leaky_relu_bwd(double dy, double x) { return x > 0.0 ? dy : dy * KG_LEAKY64_SLOPE; }

/* ------------------------------------------ activations by KG_ACT_* */

/* y = act(x), T float or double. */
template <int ACT, typename T> __host__ __device__ __forceinline__ T kg_act_fwd(T x) {
    if constexpr (ACT == KG_ACT_RELU) return kg_relu(x);
    else if constexpr (ACT == KG_ACT_GELU) return kg_gelu(x);
    else if constexpr (ACT == KG_ACT_TANH) return kg_tanh(x);
    else if constexpr (ACT == KG_ACT_SIGMOID) return kg_sigmoid(x);
    else return kg_leaky_relu(x);
}

/* dx = dy * act'(x): a select for ReLU and leaky ReLU (as torch computes
 * them), dy times the derivative for the others (the CPU's dy[i] * g(x[i])). */
template <int ACT, typename T> __host__ __device__ __forceinline__ T kg_act_bwd(T dy, T x) {
    if constexpr (ACT == KG_ACT_RELU) return kg_relu_bwd(dy, x);
    else if constexpr (ACT == KG_ACT_GELU) return dy * kg_gelu_grad(x);
    else if constexpr (ACT == KG_ACT_TANH) return dy * kg_tanh_grad(x);
    else if constexpr (ACT == KG_ACT_SIGMOID) return dy * kg_sigmoid_grad(x);
    else return kg_leaky_relu_bwd(dy, x);
}

/* --------------------------------------------------------- BLAS-1 */

/* The scalar of scale/axpy/unscale in the element type: rounded once to
 * float for float32 (the CPU plugin passes (float)a). */
template <typename T> KG_HD T kg_scalar(double a) { return (T)a; }

/* y + a * x, the product rounded before the add (no FMA). */
template <typename T> KG_HD T kg_axpy_elem(T y, T a, T x) { return y + a * x; }

/* The rounded-product epilogue of kc_gemm_ex: round_dtype(p) + beta * c
 * (p rounded first, as an autocast output is cast up and then added);
 * c is not read when beta == 0 (the caller passes any value then). */
KG_HD float kg_round_to_dtype(float p, int round_dtype) {
    return round_dtype == KG_F16 ? kg_round_f16(p) : round_dtype == KG_BF16 ? kg_round_bf16(p) : p;
}
KG_HD float kg_round_add_elem(float p, float c, float beta, int round_dtype) {
    const float r = kg_round_to_dtype(p, round_dtype);
    return beta == 0.0f ? r : r + beta * c;
}

/* --------------------------------------------- softmax cross-entropy */

/*
 * Whether (v, j) replaces the running (bv, bi) in the row's argmax: a larger
 * value, or an equal one at a smaller index (so any combination order finds
 * the CPU's first maximum). NaN never wins; start from (-inf, C).
 */
template <typename T> KG_HD bool kg_argmax_take(T v, int j, T bv, int bi) { return v > bv || (v == bv && j < bi); }

/* exp(l - max) of one logit: libm's expf / exp on the CPU, CUDA's
 * (within 2 ulp for float, 1 ulp for double) on the device; the one place
 * float results are not the CPU's bits. */
KG_HD float kg_xent_exp(float x) { return expf(x); }
KG_HD double kg_xent_exp(double x) { return exp(x); }

/* -log p[y] = log(sum exp(l - max)) - (l[y] - max), in double (kc_xent_row;
 * the float version widens l[y] and max first). */
KG_HD double kg_xent_loss(double denom, float ly, float mx) { return log(denom) - ((double)ly - (double)mx); }
KG_HD double kg_xent_loss(double denom, double ly, double mx) { return log(denom) - (ly - mx); }

/* A probability from e = exp(l - max) and the row's denom = sum e (in
 * double): float multiplies by the reciprocal, rounded to float once per row
 * ((float)(1.0 / denom)), double divides by denom (as the CPU does). norm is
 * kg_xent_norm's result for the row. */
template <typename T> KG_HD T kg_xent_norm(double denom) {
    if constexpr (sizeof(T) == sizeof(float)) return (float)(1.0 / denom);
    else return denom;
}
template <typename T> KG_HD T kg_xent_prob(T e, T norm) {
    if constexpr (sizeof(T) == sizeof(float)) return e * norm;
    else return e / norm;
}

/* The backward's dloss / B: for float32 the CPU plugin passes (float)dloss
 * and kc_softmax_xent_backward divides in double and rounds once. */
template <typename T> KG_HD T kg_xent_scale(double dloss, int B) {
    if constexpr (sizeof(T) == sizeof(float)) return (float)((double)(float)dloss / (double)B);
    else return dloss / (double)B;
}

/* dlogits[j] = scale * (p[j] - [j == y]) (the label's entry as
 * scale * (p - 1), the rest scale * p, exactly as the CPU writes them). */
KG_HD float kg_xent_grad(float scale, float p, bool is_label) { return is_label ? scale * (p - 1.0f) : scale * p; }
KG_HD double kg_xent_grad(double scale, double p, bool is_label) { return is_label ? scale * (p - 1.0) : scale * p; }

/* kg_<what>_coef<T>: km_optim.h's struct of one step's scalars for the
 * element type T (km_<what>_coef_f32 or _f64). */
#define KG_COEF_OF(what)                                                                     \
    template <typename T> struct kg_##what##_coef_of;                                        \
    template <> struct kg_##what##_coef_of<float> { typedef km_##what##_coef_f32 type; };    \
    template <> struct kg_##what##_coef_of<double> { typedef km_##what##_coef_f64 type; };   \
    template <typename T> using kg_##what##_coef = typename kg_##what##_coef_of<T>::type

/* ------------------------------------------------------------- SGD */

/* IEEE square root in T (sqrtf for float: never the double one). */
KG_HD float kg_sqrt(float x) { return sqrtf(x); }
KG_HD double kg_sqrt(double x) { return sqrt(x); }

/* The scalars of one torch.optim.SGD step in the element type T, with the
 * option flags normalised: the CPU's own structs and functions
 * (kernels/common/km_optim.h). float32: lr, momentum, dampening and
 * weight_decay rounded to float first, as the plugin passes them to
 * kc_sgd_update; float64: the doubles as they are. have_buf: whether a
 * momentum buffer was passed. */
KG_COEF_OF(sgd);

template <typename T>
static inline __host__ kg_sgd_coef<T> kg_sgd_make_coef(double lr, double momentum, double dampening, int nesterov,
                                                       double weight_decay, int first_step, int have_buf) {
    if constexpr (sizeof(T) == sizeof(float))
        return km_sgd_coef_f32_make((float)lr, (float)momentum, (float)dampening, nesterov, (float)weight_decay,
                                    first_step, have_buf);
    else
        return km_sgd_coef_f64_make(lr, momentum, dampening, nesterov, weight_decay, first_step, have_buf);
}

/* One element in PyTorch's order (kc_sgd_loop):
 *   d = g + wd * p; b = first ? d : mom * b + omd * d;
 *   d = nesterov ? d + mom * b : b; p = p + (-lr) * d
 * buf is read and written only with momentum (it may be NULL otherwise). */
template <typename T> KG_HD void kg_sgd_elem(const kg_sgd_coef<T> &c, T *p, T g, T *buf) {
    T d = g;
    if (c.has_wd) d = d + c.wd * *p;
    if (c.has_mom) {
        const T b = c.first ? d : c.momentum * *buf + c.one_minus_damp * d;
        *buf = b;
        d = c.nesterov ? d + c.momentum * b : b;
    }
    *p = *p + c.neg_lr * d;
}

/* ----------------------------------------------------------- AdamW */

/* The scalars of one torch.optim.AdamW step in the element type T: the
 * CPU's own structs and functions (kernels/common/km_optim.h), so both
 * form them the same way. Host only: pow is then libm's, the CPU's. */
KG_COEF_OF(adamw);

template <typename T>
static inline __host__ kg_adamw_coef<T> kg_adamw_make_coef(double lr, double beta1, double beta2, double eps,
                                                           double weight_decay, int64_t step) {
    if constexpr (sizeof(T) == sizeof(float))
        return km_adamw_coef_f32_make(lr, beta1, beta2, eps, weight_decay, step);
    else
        return km_adamw_coef_f64_make(lr, beta1, beta2, eps, weight_decay, step);
}

/* One element in PyTorch's order (kc_adamw_loop):
 *   m = big ? g - (g - m) * (1 - w1) : m + w1 * (g - m)   (lerp)
 *   v = v * beta2 + (c2 * g) * g
 *   den = sqrt(v) / bc2_sqrt + eps
 *   p = p * decay + (neg_step * m) / den */
template <typename T> KG_HD void kg_adamw_elem(const kg_adamw_coef<T> &c, T *p, T g, T *m, T *v) {
    T mi = *m;
    mi = c.big_weight ? g - (g - mi) * c.one_minus_w1 : mi + c.w1 * (g - mi);
    const T vi = *v * c.beta2 + (c.c2 * g) * g;
    const T den = kg_sqrt(vi) / c.bc2_sqrt + c.eps;
    *m = mi;
    *v = vi;
    *p = *p * c.decay + (c.neg_step * mi) / den;
}

#endif /* KILN_KERNELS_CUDA_KG_MATH_CUH */
