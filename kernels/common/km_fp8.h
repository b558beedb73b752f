/*
 * km_fp8.h — the two OCP 8-bit floating-point formats (OFP8 v1.0) as
 * integer arithmetic on float32 bits, written once for both kernel sets:
 * kernels/cpu (cpu_fp8.c, round_to on the cpu) and kernels/cuda
 * (kg_elementwise.cu, round_to on the GPU), so a simulated FP8 run gives
 * the same bits everywhere. Integer code, not a hardware conversion,
 * because CPUs have none and CUDA's __nv_cvt_* saturate infinities, which
 * would hide an overflow from the gradient scaler's finiteness check.
 *
 *   E4M3 (float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits;
 *        max 448 (S.1111.110), min normal 2^-6, min subnormal 2^-9;
 *        no infinities; NaN is S.1111.111.
 *   E5M2 (float8_e5m2): 1 sign, 5 exponent (bias 15), 2 mantissa bits;
 *        max 57344 (S.11110.11), min normal 2^-14, min subnormal 2^-16;
 *        infinities S.11111.00, NaNs S.11111.{01,10,11}.
 *
 * Encoding rounds to nearest, ties to even, once (from the float32 bits:
 * no double rounding), including into the subnormals. Overflow uses the
 * spec's SATURATING mode for finite inputs: a finite value beyond the
 * largest normal (after rounding) becomes +-max. Non-finite inputs keep
 * their meaning where the format can carry it: NaN -> NaN (sign kept,
 * payload not: 3 or 2 bits cannot hold it), +-inf -> +-inf in E5M2 and ->
 * NaN in E4M3 (which has no infinity). Why: per-tensor scaling puts amax
 * at the top of the range, so a finite value above it is an outlier to
 * clip, while an infinity is already a divergence that must stay visible.
 * Decoding is exact. -0 encodes to S=1, 0.
 */
#ifndef KILN_KERNELS_COMMON_KM_FP8_H
#define KILN_KERNELS_COMMON_KM_FP8_H

#include <stdint.h>

#include "km_act.h" /* KM_FN, km_f32_bits, km_f32_from_bits */


/*
 * The shared encoder: M mantissa bits, exponent bias BIAS, largest finite
 * code MAXC (without sign), NaN code NANC, infinity code INFC (0: none).
 * a is |x|'s bits, below the float32 infinity.
 */
KM_FN uint32_t km_fp8_encode_mag(uint32_t a, const int M, const int BIAS, const uint32_t MAXC) {
    const int emin = 1 - BIAS;              /* unbiased exponent of the smallest normal */
    const int e = (int)(a >> 23) - 127;     /* float32's unbiased exponent (-127: zero or subnormal) */
    if (e >= emin) {
        /* normal in the target: round the 23-bit mantissa to M bits, ties
         * to even; a carry runs into the exponent, as it should */
        const uint32_t shift = 23u - (uint32_t)M;
        const uint32_t lsb = (a >> shift) & 1u;
        const uint32_t r = (a + ((1u << (shift - 1u)) - 1u) + lsb) >> shift;
        /* rebias: float32's exponent field minus (127 - BIAS) */
        const uint32_t code = r - ((uint32_t)(127 - BIAS) << M);
        return code > MAXC ? MAXC : code; /* saturate finite overflow */
    }
    /* subnormal (or zero) in the target: m = RNE(|x| / 2^(emin - M)); the
     * float32 input is normal here or far below the target's range */
    if (e == -127) return 0u; /* float32 zero or subnormal: < 2^-126, rounds to 0 */
    const uint32_t sig = (a & 0x7fffffu) | 0x800000u; /* |x| = sig * 2^(e - 23) */
    const int s = 23 + emin - M - e;                   /* > 23 - M; m = sig >> s, rounded */
    if (s > 24) return 0u;                             /* below half the smallest subnormal */
    const uint32_t m = sig >> s, rem = sig & ((1u << s) - 1u), half = 1u << (s - 1);
    /* m == 1 << M after rounding up is the smallest normal's code: right */
    return m + (rem > half || (rem == half && (m & 1u)));
}

/* float -> E4M3 code */
KM_FN uint8_t km_f8e4m3_bits(float x) {
    const uint32_t u = km_f32_bits(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint8_t)(sign | 0x7fu); /* NaN, and inf (no inf in E4M3) */
    return (uint8_t)(sign | km_fp8_encode_mag(a, 3, 7, 0x7eu));
}

/* float -> E5M2 code */
KM_FN uint8_t km_f8e5m2_bits(float x) {
    const uint32_t u = km_f32_bits(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7eu); /* NaN (a quiet one: top mantissa bit) */
    if (a == 0x7f800000u) return (uint8_t)(sign | 0x7cu); /* inf */
    return (uint8_t)(sign | km_fp8_encode_mag(a, 2, 15, 0x7bu));
}

/* The float value of a code: M mantissa bits, BIAS; the caller has
 * handled the non-finite codes. Exact (every FP8 value is a float). */
KM_FN float km_fp8_decode_finite(uint32_t c, const int M, const int BIAS) {
    const uint32_t sign = (c & 0x80u) << 24, e = (c & 0x7fu) >> M, m = c & ((1u << M) - 1u);
    if (e == 0) { /* subnormal: m * 2^(1 - BIAS - M), an exact product */
        const float v = (float)m * km_f32_from_bits((uint32_t)(127 + 1 - BIAS - M) << 23);
        return km_f32_from_bits(km_f32_bits(v) | sign);
    }
    return km_f32_from_bits(sign | (e + (uint32_t)(127 - BIAS)) << 23 | m << (23 - M));
}

KM_FN float km_f8e4m3_value(uint8_t c) {
    if ((c & 0x7fu) == 0x7fu) return km_f32_from_bits(((uint32_t)(c & 0x80u) << 24) | 0x7fc00000u);
    return km_fp8_decode_finite(c, 3, 7);
}

KM_FN float km_f8e5m2_value(uint8_t c) {
    const uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    if ((c & 0x7cu) == 0x7cu) return km_f32_from_bits(sign | ((c & 3u) ? 0x7fc00000u : 0x7f800000u));
    return km_fp8_decode_finite(c, 2, 15);
}

/* x rounded through the format: what storing it there keeps. */
KM_FN float km_round_f8e4m3(float x) { return km_f8e4m3_value(km_f8e4m3_bits(x)); }
KM_FN float km_round_f8e5m2(float x) { return km_f8e5m2_value(km_f8e5m2_bits(x)); }

#endif /* KILN_KERNELS_COMMON_KM_FP8_H */
