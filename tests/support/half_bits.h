/*
 * tests/support/half_bits.h — the bit-level views of floats that the numeric
 * suites and the CUDA fakes read their 16-bit and float32 results with: a
 * float's bit pattern and back, and the exact value of a float16 or
 * bfloat16 pattern. They are written from the formats' definitions (ldexp
 * and a union, no _Float16, no kernel code), so a check that decodes with
 * them shares nothing with what it checks. Header only, so that the fake
 * CUDA libraries (tests/cuda_fake), which link nothing from tests/support,
 * can include it as well.
 */
#ifndef KILN_TESTS_HALF_BITS_H
#define KILN_TESTS_HALF_BITS_H

#include <math.h>
#include <stdint.h>

/* The IEEE binary32 pattern of x, and the float of a pattern (through a
 * union, which C11 defines as reinterpreting the bytes). */
typedef union hb_f32 {
    float f;
    uint32_t u;
} hb_f32;
static inline uint32_t hb_f32_bits(float x) { return (hb_f32){.f = x}.u; }
static inline float hb_f32_from_bits(uint32_t u) { return (hb_f32){.u = u}.f; }

/* The exact value of a float16 pattern (subnormals, +-inf, NaN). */
static inline double hb_f16_value(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* The value of a bfloat16 pattern: the top half of a float's. */
static inline float hb_bf16_value(uint16_t b) { return hb_f32_from_bits((uint32_t)b << 16); }

/* The pattern nearest x in float16 (bf16 = 0) or bfloat16 (bf16 = 1), ties
 * to the even pattern; +-inf from half an ulp past the largest finite
 * value, NaN as the format's quiet NaN with x's sign. A binary search over
 * the positive patterns (whose values increase with them), the infinity
 * pattern standing for where the next binade would start (2^16, 2^128),
 * which is what IEEE rounding compares with: no _Float16, which some
 * compilers lack (clang 14 on x86-64), and nothing of the kernels' code. */
static inline double hb_16_mag(int bf16, unsigned h) {
    if (h == (bf16 ? 0x7f80u : 0x7c00u)) return bf16 ? 0x1p128 : 0x1p16;
    return bf16 ? (double)hb_bf16_value((uint16_t)h) : hb_f16_value((uint16_t)h);
}
static inline uint16_t hb_round16(int bf16, double x) {
    const uint16_t sign = signbit(x) ? 0x8000 : 0;
    const unsigned inf = bf16 ? 0x7f80u : 0x7c00u;
    if (isnan(x)) return (uint16_t)(sign | inf | (bf16 ? 0x40u : 0x200u));
    const double a = fabs(x);
    if (a >= hb_16_mag(bf16, inf)) return (uint16_t)(sign | inf);
    unsigned lo = 0, hi = inf; /* mag(lo) <= a < mag(hi) */
    while (hi - lo > 1) {
        const unsigned mid = (lo + hi) / 2;
        if (hb_16_mag(bf16, mid) <= a) lo = mid;
        else hi = mid;
    }
    const double below = a - hb_16_mag(bf16, lo), above = hb_16_mag(bf16, hi) - a;
    return (uint16_t)(sign | (below < above || (below == above && !(lo & 1u)) ? lo : hi));
}
static inline uint16_t hb_f16_bits(double x) { return hb_round16(0, x); }

#endif
