/*
 * tests/support/half_bits.h — the bit-level views of floats that the numeric
 * suites and the CUDA fakes read their 16-bit and float32 results with: a
 * float's bit pattern and back, and the exact value of a float16 or
 * bfloat16 pattern. They are written from the formats' definitions (ldexp
 * and memcpy, no _Float16, no kernel code), so a check that decodes with
 * them shares nothing with what it checks. Header only, so that the fake
 * CUDA libraries (tests/cuda_fake), which link nothing from tests/support,
 * can include it as well.
 */
#ifndef KILN_TESTS_HALF_BITS_H
#define KILN_TESTS_HALF_BITS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The IEEE binary32 pattern of x, and the float of a pattern. */
static inline uint32_t hb_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float hb_f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The exact value of a float16 pattern (subnormals, +-inf, NaN). */
static inline double hb_f16_value(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* The value of a bfloat16 pattern: the top half of a float's. */
static inline float hb_bf16_value(uint16_t b) { return hb_f32_from_bits((uint32_t)b << 16); }

#endif
