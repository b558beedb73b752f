/*
 * test_kernels_ex.c: the second suite of test_kernels_cpu, for what kernels/cpu
 * added beyond float32: the float16 / bfloat16 / float64 conversions and the
 * in-place rounding (against hand-picked values and an independent rounding
 * reference that searches the 16-bit formats' value tables, never the
 * compiler's _Float16; the integer float16 conversions for compilers without
 * one against it too), kc_gemm_ex against kc_gemm_ref on operands converted
 * and products rounded here (all transposes, beta 0 and non-zero, no / fp16 /
 * bf16 rounding, overflow to inf, workspace sizing), kc_dgemm, every float64
 * kernel against straightforward double formulas, finite differences and
 * Python literals, the float64 optimizers against the float32 ones, and the
 * thread-count independence of all of them. test_kernels_cpu.c registers it.
 */
#include "cpu_internal.h" /* the integer float16 conversions */
#include "cpu_kernels.h"
#include "half_bits.h"
#include "kt_common.h"

#include <CUnit/CUnit.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern CU_TestInfo kt_ex_cases[];

/* ------------------------------------------------------------- helpers */

static test_rng ex_rng = {0x2545F4914F6CDD1Dull};
static void ex_seed(uint64_t s) { test_rng_seed(&ex_rng, s); }
static uint64_t ex_next(void) { return test_rng_next(&ex_rng); }
static double ex_unit(void) { return (double)(ex_next() >> 11) * (1.0 / 9007199254740992.0); }
static double ex_uniform(double lo, double hi) { return lo + (hi - lo) * ex_unit(); }


/* Counts (and prints the first few) elements outside tolerance. */
static int ex_count_far(const char *what, const double *got, const double *want, size_t n, double rtol, double atol) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!kt_close(got[i], want[i], rtol, atol)) {
            if (bad++ < 5) printf("\n  %s[%zu]: got %.17g want %.17g", what, i, got[i], want[i]);
        }
    return bad;
}

/* ------------------------------------------- independent 16-bit reference */

/*
 * The two 16-bit formats by their parameters, decoded with ldexp and
 * rounded by a binary search over the (monotonic) positive bit patterns
 * (tests/support/half_bits.h): no _Float16, no bit tricks, so it shares
 * nothing with the kernels' code.
 */
enum { FMT_F16 = 0, FMT_BF16 = 1 };
static int fmt_mbits(int fmt) { return fmt == FMT_F16 ? 10 : 7; }
static int fmt_bias(int fmt) { return fmt == FMT_F16 ? 15 : 127; }
static uint16_t fmt_inf(int fmt) { return fmt == FMT_F16 ? 0x7c00 : 0x7f80; }

/* Magnitude of a pattern (sign ignored). The inf pattern gets the value the
 * next binade would start at (2^16, 2^128), which is exactly what IEEE
 * rounding compares with to decide overflow. */
static double ref16_mag(int fmt, uint16_t h) {
    const int mb = fmt_mbits(fmt), bias = fmt_bias(fmt);
    const unsigned e = (unsigned)(h & 0x7fff) >> mb, m = h & ((1u << mb) - 1u);
    if (e == 0) return ldexp((double)m, 1 - bias - mb);
    return ldexp((double)((1u << mb) + m), (int)e - bias - mb);
}

static int ref16_isnan(int fmt, uint16_t h) { return (h & 0x7fff) > fmt_inf(fmt); }

/* The exact value of a pattern as a double (NaN, +-inf included). */
static double ref16_value(int fmt, uint16_t h) {
    if (ref16_isnan(fmt, h)) return NAN;
    const double a = (h & 0x7fff) == fmt_inf(fmt) ? INFINITY : ref16_mag(fmt, h);
    return (h & 0x8000) ? -a : a;
}

/* Round-to-nearest-even of any double into the format; NaN gives the
 * format's quiet NaN with v's sign (callers compare NaN-ness only). The
 * search is tests/support/half_bits.h's, shared with the other suites. */
static uint16_t ref16_round(int fmt, double v) { return hb_round16(fmt == FMT_BF16, v); }

static uint16_t f16_of(float x) {
    uint16_t h;
    kc_f32_to_f16(&h, &x, 1);
    return h;
}
static uint16_t bf16_of(float x) {
    uint16_t h;
    kc_f32_to_bf16(&h, &x, 1);
    return h;
}

/* ------------------------------------------------------ 16-bit known values */

static void test_f16_known_values(void) {
    /* value -> expected float16 bits */
    const struct { float x; uint16_t want; const char *what; } cases[] = {
        {1.0f, 0x3c00, "1.0 exact"},
        {65504.0f, 0x7bff, "65504 (max) exact"},
        {65519.0f, 0x7bff, "65519 rounds down to 65504"},
        {65520.0f, 0x7c00, "65520 (half an ulp above max) overflows to inf"},
        {-70000.0f, 0xfc00, "-70000 -> -inf"},
        {0x1p-24f, 0x0001, "2^-24, the smallest subnormal, kept"},
        {0x1p-26f, 0x0000, "2^-26 underflows to 0"},
        {-0x1p-26f, 0x8000, "-2^-26 underflows to -0"},
        {0x1p-25f, 0x0000, "2^-25 is a tie: to even 0"},
        {0x3p-25f, 0x0002, "3*2^-25 is a tie: to even 2*2^-24"},
        {1.0f + 0x1p-11f, 0x3c00, "1 + 2^-11 tie: to even 1.0"},
        {1.0f + 0x3p-11f, 0x3c02, "1 + 3*2^-11 tie: to even 1 + 2^-9"},
        {0x1p-14f, 0x0400, "2^-14, the smallest normal"},
        {-0.0f, 0x8000, "-0 keeps its sign"},
        {INFINITY, 0x7c00, "inf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint16_t got = f16_of(cases[i].x);
        if (got != cases[i].want) printf("\n  f16 %s: got 0x%04x want 0x%04x", cases[i].what, got, cases[i].want);
        CU_ASSERT_EQUAL(got, cases[i].want);
    }
    CU_ASSERT_EQUAL(ref16_round(FMT_F16, 65520.0), 0x7c00); /* the reference agrees on the edge */

    /* NaN stays NaN (never inf), whatever its payload or sign. */
    const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7fffffffu, 0xff800001u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        const uint16_t h = f16_of(hb_f32_from_bits(nans[i]));
        CU_ASSERT((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0);
        float back;
        kc_f16_to_f32(&back, &h, 1);
        CU_ASSERT(isnan(back));
    }

    /* Every non-NaN pattern round-trips f16 -> f32 -> f16, and f16 -> f32 is
     * the exact value. */
    int bad = 0;
    for (uint32_t p = 0; p < 65536; p++) {
        const uint16_t h = (uint16_t)p;
        float f;
        kc_f16_to_f32(&f, &h, 1);
        if (ref16_isnan(FMT_F16, h)) {
            bad += !isnan(f);
            continue;
        }
        bad += (double)f != ref16_value(FMT_F16, h);
        bad += f16_of(f) != h;
    }
    CU_ASSERT_EQUAL(bad, 0);

    /* From float64, one rounding: 1 + 2^-11 + 2^-40 is above the tie, so
     * 1 + 2^-10; via float it would become the tie 1 + 2^-11 and then 1.0. */
    const double d[3] = {1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-11, -1e300};
    uint16_t h[3];
    CU_ASSERT_EQUAL(kc_cast(h, KC_F16, d, KC_F64, 3), 0);
    CU_ASSERT_EQUAL(h[0], 0x3c01);
    CU_ASSERT_EQUAL(h[1], 0x3c00);
    CU_ASSERT_EQUAL(h[2], 0xfc00);
}

static void test_bf16_known_values(void) {
    CU_ASSERT_EQUAL(bf16_of(1.0f), 0x3f80);
    CU_ASSERT_EQUAL(bf16_of(1.0f + 0x1p-8f), 0x3f80);  /* tie: to even 1.0 */
    CU_ASSERT_EQUAL(bf16_of(1.0f + 0x3p-8f), 0x3f82);  /* tie: to even 1 + 2^-6 */
    CU_ASSERT_EQUAL(bf16_of(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81); /* above the tie */
    CU_ASSERT_EQUAL(bf16_of(-0.0f), 0x8000);
    CU_ASSERT_EQUAL(bf16_of(0x1p-133f), 0x0001); /* smallest bf16 subnormal */
    CU_ASSERT_EQUAL(bf16_of(0x1p-135f), 0x0000);

    /* The top of the range. bf16's largest finite value is
     * (2 - 2^-7) * 2^127 = 3.3895313892515355e38 (pattern 0x7f7f); values
     * round to inf from half an ulp (2^119) above it: float 0x7f7f8000. */
    const double bf16_max = 3.3895313892515355e38;
    CU_ASSERT_EQUAL(ref16_mag(FMT_BF16, 0x7f7f), bf16_max);
    CU_ASSERT_EQUAL(bf16_of((float)bf16_max), 0x7f7f);
    float back;
    uint16_t h = 0x7f7f;
    kc_bf16_to_f32(&back, &h, 1);
    CU_ASSERT_EQUAL((double)back, bf16_max);
    const float below_mid = hb_f32_from_bits(0x7f7f7fffu), mid = hb_f32_from_bits(0x7f7f8000u);
    CU_ASSERT_EQUAL((double)mid, bf16_max + 0x1p119);
    CU_ASSERT_EQUAL(bf16_of(below_mid), 0x7f7f);  /* just below the boundary: max */
    CU_ASSERT_EQUAL(bf16_of(mid), 0x7f80);        /* the tie goes to even: inf */
    CU_ASSERT_EQUAL(bf16_of(-mid), 0xff80);
    CU_ASSERT_EQUAL(bf16_of(FLT_MAX), 0x7f80);
    const uint16_t h30 = bf16_of(3.0e38f), h34 = bf16_of(3.4e38f);
    CU_ASSERT((h30 & 0x7f80) != 0x7f80);           /* 3.0e38 stays finite */
    CU_ASSERT(fabs(ref16_value(FMT_BF16, h30) - 3.0e38) <= 0x1p119); /* within half an ulp */
    CU_ASSERT(3.4e38 > bf16_max + 0x1p119);
    CU_ASSERT_EQUAL(h34, 0x7f80);                  /* 3.4e38 -> inf */
    CU_ASSERT_EQUAL(bf16_of(INFINITY), 0x7f80);

    /* NaN stays a quiet NaN, including a signalling NaN whose payload is
     * all in the dropped half (the carry would make it inf). */
    const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        const uint16_t b = bf16_of(hb_f32_from_bits(nans[i]));
        CU_ASSERT(ref16_isnan(FMT_BF16, b));
        CU_ASSERT(b & 0x0040); /* quiet */
        CU_ASSERT_EQUAL(b & 0x8000, (nans[i] >> 16) & 0x8000);
    }

    /* Representable values round-trip exactly: every non-NaN pattern. */
    int bad = 0;
    for (uint32_t p = 0; p < 65536; p++) {
        const uint16_t b = (uint16_t)p;
        float f;
        kc_bf16_to_f32(&f, &b, 1);
        if (ref16_isnan(FMT_BF16, b)) {
            bad += !isnan(f);
            continue;
        }
        bad += hb_f32_bits(f) != (uint32_t)p << 16;
        bad += bf16_of(f) != b;
    }
    CU_ASSERT_EQUAL(bad, 0);

    /* From float64, one rounding (the kernels round to odd on the way):
     * 1 + 2^-8 + 2^-30 is above the tie -> 1 + 2^-7. */
    const double d[5] = {1.0 + 0x1p-8 + 0x1p-30, 1.0 + 0x1p-8, 1e300, -1e-300, bf16_max + 0x1p119};
    uint16_t b[5];
    CU_ASSERT_EQUAL(kc_cast(b, KC_BF16, d, KC_F64, 5), 0);
    CU_ASSERT_EQUAL(b[0], 0x3f81);
    CU_ASSERT_EQUAL(b[1], 0x3f80);
    CU_ASSERT_EQUAL(b[2], 0x7f80);
    CU_ASSERT_EQUAL(b[3], 0x8000);
    CU_ASSERT_EQUAL(b[4], 0x7f80);
}

/* ------------------------------- float16 without the compiler's _Float16 */

/* The integer float16 conversions (cpu_internal.h), which the kernels use
 * where the compiler has no _Float16 (clang 14), against the reference and
 * against the compiler's conversion where there is one: every pattern
 * decoded; every float32 at and around each float16 rounding boundary
 * (the low 13 bits 0, 1, 0xfff, 0x1000, 0x1001, 0x1fff under every upper
 * pattern, both signs), random float32 subnormal halves, and float64 just
 * off the ties (one rounding, not two). */
static void test_f16_soft(void) {
    int bad = 0;
    for (uint32_t p = 0; p < 65536; p++) {
        const uint16_t h = (uint16_t)p;
        const float f = kc_f16_value_soft(h);
        if (ref16_isnan(FMT_F16, h)) bad += !isnan(f) || !(hb_f32_bits(f) & 0x400000u) ||
                                            (hb_f32_bits(f) >> 31) != (p >> 15);
        else bad += (double)f != ref16_value(FMT_F16, h) || !signbit(f) != !(p & 0x8000u);
        bad += hb_f32_bits(f) != hb_f32_bits(kc_f16_value(h)) && !isnan(f);
    }
    CU_ASSERT_EQUAL(bad, 0);
    const uint32_t lows[6] = {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu};
    int bad_ref = 0, bad_hw = 0;
    for (uint32_t hi = 0; hi < (1u << 19); hi++)
        for (int l = 0; l < 6; l++) {
            const float x = hb_f32_from_bits((hi << 13) | lows[l]); /* bit 31 of hi << 13: both signs */
            const uint16_t got = kc_f16_bits_soft((double)x);
            if (isnan(x)) bad_ref += !ref16_isnan(FMT_F16, got) || !(got & 0x200u);
            else bad_ref += got != ref16_round(FMT_F16, x);
            if (got != kc_f16_bits(x) && bad_hw++ < 3)
                printf("\n  f16 of %a (0x%08x): integer 0x%04x, kc_f16_bits 0x%04x", (double)x, (hi << 13) | lows[l],
                       got, kc_f16_bits(x));
        }
    ex_seed(77);
    for (int i = 0; i < 200000; i++) {
        const float x = (float)ldexp(ex_uniform(-2.0, 2.0), -13 - (int)(ex_next() % 14)); /* the subnormal halves */
        const uint16_t got = kc_f16_bits_soft((double)x);
        bad_ref += got != ref16_round(FMT_F16, x);
        bad_hw += got != kc_f16_bits(x);
        /* float64 a hair off the float16 rounding boundary: one rounding */
        const double mid = 0.5 * (ref16_value(FMT_F16, got) + ref16_value(FMT_F16, (uint16_t)(got + 1u)));
        if (!isfinite(mid)) continue;
        const double d = (i & 1) ? mid + fabs(mid) * 0x1p-40 : mid - fabs(mid) * 0x1p-40;
        bad_ref += kc_f16_bits_soft(d) != ref16_round(FMT_F16, d);
        bad_hw += kc_f16_bits_soft(d) != kc_f16_bits_f64(d);
    }
    CU_ASSERT_EQUAL(bad_ref, 0);
    CU_ASSERT_EQUAL(bad_hw, 0);
    if (bad_ref || bad_hw) printf("\n  %d differ from the reference, %d from the compiler's", bad_ref, bad_hw);
}

/* ---------------------------------------------- every pair vs reference */

/* A source value of each dtype: random bit patterns (so subnormals, huge
 * values, infinities and NaNs all occur) plus specials. */
static void fill_source(int dt, void *buf, size_t n) {
    for (size_t i = 0; i < n; i++) {
        switch (dt) {
        case KC_F32: {
            uint32_t u = (uint32_t)ex_next();
            if (i % 4 == 1) u = hb_f32_bits((float)ex_uniform(-70000, 70000)); /* the 16-bit ranges */
            if (i % 4 == 2) u = hb_f32_bits((float)ldexp(ex_uniform(-2, 2), (int)(ex_next() % 60) - 30));
            ((float *)buf)[i] = hb_f32_from_bits(u);
            break;
        }
        case KC_F64: {
            double v = ldexp(ex_uniform(-2, 2), (int)(ex_next() % 320) - 160);
            if (i % 7 == 3) v = ex_uniform(-70000, 70000);
            if (i % 97 == 5) v = (i & 8) ? NAN : -INFINITY;
            ((double *)buf)[i] = v;
            break;
        }
        default: ((uint16_t *)buf)[i] = (uint16_t)(i * 40503u + 7u); break; /* covers every pattern */
        }
    }
}

static double src_value(int dt, const void *buf, size_t i) {
    switch (dt) {
    case KC_F32: return ((const float *)buf)[i];
    case KC_F64: return ((const double *)buf)[i];
    case KC_F16: return ref16_value(FMT_F16, ((const uint16_t *)buf)[i]);
    default: return ref16_value(FMT_BF16, ((const uint16_t *)buf)[i]);
    }
}

static const char *dt_name(int dt) {
    return dt == KC_F32 ? "f32" : dt == KC_F64 ? "f64" : dt == KC_F16 ? "f16" : dt == KC_BF16 ? "bf16" : "?";
}

/* Every ordered pair of the four dtypes against the reference: the source's
 * exact value (a double) rounded once into the destination. */
static void test_cast_all_pairs(void) {
    ex_seed(21);
    const int dts[4] = {KC_F32, KC_F64, KC_F16, KC_BF16};
    const size_t n = 70001; /* > 65536: every 16-bit pattern */
    void *src = kt_alloc(n * 8), *dst = kt_alloc(n * 8);
    for (int s = 0; s < 4; s++) {
        fill_source(dts[s], src, n);
        for (int d = 0; d < 4; d++) {
            memset(dst, 0x5a, n * 8);
            CU_ASSERT_EQUAL_FATAL(kc_cast(dst, dts[d], src, dts[s], n), 0);
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                const double v = src_value(dts[s], src, i);
                int ok;
                switch (dts[d]) {
                case KC_F32: {
                    const float got = ((float *)dst)[i], want = (float)v;
                    ok = isnan(v) ? isnan(got) : hb_f32_bits(got) == hb_f32_bits(want);
                    break;
                }
                case KC_F64: {
                    const double got = ((double *)dst)[i];
                    ok = isnan(v) ? isnan(got) : memcmp(&got, &v, sizeof v) == 0;
                    break;
                }
                default: {
                    const int fmt = dts[d] == KC_F16 ? FMT_F16 : FMT_BF16;
                    const uint16_t got = ((uint16_t *)dst)[i];
                    ok = isnan(v) ? ref16_isnan(fmt, got) : got == ref16_round(fmt, v);
                    break;
                }
                }
                if (!ok && bad++ < 3)
                    printf("\n  cast %s -> %s [%zu]: source %.17g converted wrongly", dt_name(dts[s]),
                           dt_name(dts[d]), i, v);
            }
            CU_ASSERT_EQUAL(bad, 0);
        }
    }
    /* Unknown dtypes are refused; dst == src with one dtype is a no-op. */
    CU_ASSERT_EQUAL(kc_cast(dst, 5, src, KC_F32, 4), -1);
    CU_ASSERT_EQUAL(kc_cast(dst, KC_F32, src, 0, 4), -1);
    float same[3] = {1.5f, -2.0f, NAN};
    CU_ASSERT_EQUAL(kc_cast(same, KC_F32, same, KC_F32, 3), 0);
    CU_ASSERT_EQUAL(same[0], 1.5f);
    CU_ASSERT(isnan(same[2]));
    CU_ASSERT_EQUAL(kc_dtype_bytes(KC_BF16), 2);
    CU_ASSERT_EQUAL(kc_dtype_bytes(KC_F64), 8);
    CU_ASSERT_EQUAL(kc_dtype_bytes(7), 0);
    free(src);
    free(dst);
}

/* Rounding in place gives the value that storing would keep. */
static void test_round_in_place(void) {
    ex_seed(22);
    const size_t n = 50000;
    float *x = kt_alloc(n * sizeof *x), *r16 = kt_alloc(n * sizeof *x), *rbf = kt_alloc(n * sizeof *x);
    fill_source(KC_F32, x, n);
    memcpy(r16, x, n * sizeof *x);
    memcpy(rbf, x, n * sizeof *x);
    kc_round_f16(r16, n);
    kc_round_bf16(rbf, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double w16 = ref16_value(FMT_F16, ref16_round(FMT_F16, x[i]));
        const double wbf = ref16_value(FMT_BF16, ref16_round(FMT_BF16, x[i]));
        /* signbit's non-zero value differs between float and double: !! */
        bad += isnan(x[i]) ? !isnan(r16[i]) : (double)r16[i] != w16 || !!signbit(r16[i]) != !!signbit(w16);
        bad += isnan(x[i]) ? !isnan(rbf[i]) : (double)rbf[i] != wbf || !!signbit(rbf[i]) != !!signbit(wbf);
    }
    CU_ASSERT_EQUAL(bad, 0);
    float k[4] = {65520.0f, 1.0f + 0x1p-11f, 0x1p-26f, 3.0f};
    kc_round_f16(k, 4);
    CU_ASSERT(isinf(k[0]) && k[0] > 0);
    CU_ASSERT_EQUAL(k[1], 1.0f);
    CU_ASSERT_EQUAL(k[2], 0.0f);
    CU_ASSERT_EQUAL(k[3], 3.0f);
    free(x);
    free(r16);
    free(rbf);
}

/* ---------------------------------------------------------------- gemm_ex */

/* Stores v in dtype dt at index i of buf and returns the value it keeps. */
static float store_as(int dt, void *buf, size_t i, float v) {
    if (dt == KC_F32) {
        ((float *)buf)[i] = v;
        return v;
    }
    const int fmt = dt == KC_F16 ? FMT_F16 : FMT_BF16;
    const uint16_t h = ref16_round(fmt, v);
    ((uint16_t *)buf)[i] = h;
    return (float)ref16_value(fmt, h);
}

static float round_as(int dt, float v) {
    if (dt == KC_F32) return v;
    const int fmt = dt == KC_F16 ? FMT_F16 : FMT_BF16;
    return (float)ref16_value(fmt, ref16_round(fmt, v));
}

/*
 * One kc_gemm_ex call against the reference: operands stored in their dtypes
 * by the test's own rounding (a float32 operand rounded through the
 * matmul's 16-bit dtype too: autocast's), the product by kc_gemm_ref (double
 * accumulation) on the values kept, rounded by the test, then + beta * C0.
 * exact: entries are multiples of 1/8 in [-2, 2] (exact in every format) and
 * alpha = 0.75, so every product is exact in float32 whatever the summation
 * order and the comparison is bit for bit; otherwise random values and a
 * tolerance of one unit of the rounding format. C's padding must survive,
 * and with beta == 0 C starts as NaN (must not be read).
 */
static void gemm_ex_case(int ta, int tb, int a_dt, int b_dt, int round_dt, float beta, int exact) {
    const int M = 13, N = 11, K = 9, pad = 2;
    const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
    const size_t na = (size_t)a_rows * lda, nb = (size_t)b_rows * ldb, nc = (size_t)M * ldc;
    void *A = kt_alloc(na * 4), *B = kt_alloc(nb * 4);
    float *Af = kt_alloc(na * 4), *Bf = kt_alloc(nb * 4), *C = kt_alloc(nc * 4), *C0 = kt_alloc(nc * 4);
    float *P = kt_alloc((size_t)M * N * 4);
    for (size_t i = 0; i < na; i++)
        Af[i] = store_as(a_dt, A, i, exact ? (float)((int)(ex_next() % 33) - 16) / 8.0f : (float)ex_uniform(-3, 3));
    for (size_t i = 0; i < nb; i++)
        Bf[i] = store_as(b_dt, B, i, exact ? (float)((int)(ex_next() % 33) - 16) / 8.0f : (float)ex_uniform(-3, 3));
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++)
            C0[(size_t)i * ldc + j] = j >= N ? 12345.0f : beta == 0.0f ? NAN : (float)ex_uniform(-4, 4);
    memcpy(C, C0, nc * 4);
    /* the values the product sees: float32 operands rounded through the
     * matmul's 16-bit dtype (round_dt, else the 16-bit operand's) */
    const int ort = round_dt != KC_F32 ? round_dt : a_dt != KC_F32 ? a_dt : b_dt;
    if (ort != KC_F32) {
        if (a_dt == KC_F32)
            for (size_t i = 0; i < na; i++) Af[i] = round_as(ort, Af[i]);
        if (b_dt == KC_F32)
            for (size_t i = 0; i < nb; i++) Bf[i] = round_as(ort, Bf[i]);
    }
    const float alpha = exact ? 0.75f : -1.3f;
    kc_gemm_ref(ta, tb, M, N, K, alpha, Af, lda, Bf, ldb, 0.0f, P, N);

    const size_t wsb = kc_gemm_ex_workspace(M, N, K, a_dt, b_dt, KC_F32, round_dt, beta);
    void *ws = wsb ? kt_alloc(wsb) : NULL;
    CU_ASSERT_EQUAL_FATAL(kc_gemm_ex(ta, tb, M, N, K, alpha, A, a_dt, lda, B, b_dt, ldb, beta, C, KC_F32, ldc,
                                     round_dt, ws, wsb), 0);
    const double unit = round_dt == KC_F16 ? 0x1p-10 : round_dt == KC_BF16 ? 0x1p-7 : 1e-5;
    int bad = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < ldc; j++) {
            const float got = C[(size_t)i * ldc + j];
            if (j >= N) {
                bad += got != 12345.0f;
                continue;
            }
            const float p = round_as(round_dt, P[(size_t)i * N + j]);
            const float want = beta == 0.0f ? p : p + beta * C0[(size_t)i * ldc + j];
            int ok = exact ? hb_f32_bits(got) == hb_f32_bits(want) : kt_close(got, want, unit, 1e-5 * (K + 1));
            /* with beta == 0, C holds the rounded product: representable */
            if (beta == 0.0f) ok &= round_as(round_dt, got) == got;
            if (!ok && bad++ < 3)
                printf("\n  gemm_ex ta=%d tb=%d a=%s b=%s round=%s beta=%g C[%d,%d]: %.9g want %.9g", ta, tb,
                       dt_name(a_dt), dt_name(b_dt), dt_name(round_dt), (double)beta, i, j, (double)got,
                       (double)want);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    free(A), free(B), free(Af), free(Bf), free(C), free(C0), free(P), free(ws);
}

static void test_gemm_ex_vs_ref(void) {
    ex_seed(23);
    const int pairs[][2] = {{KC_F32, KC_F32}, {KC_F16, KC_F32}, {KC_F32, KC_BF16}, {KC_BF16, KC_F16}, {KC_F16, KC_F16}};
    const int rounds[3] = {KC_F32, KC_F16, KC_BF16};
    const float betas[3] = {0.0f, 1.0f, -0.5f};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
                for (int r = 0; r < 3; r++)
                    for (int b = 0; b < 3; b++) {
                        gemm_ex_case(ta, tb, pairs[p][0], pairs[p][1], rounds[r], betas[b], 1);
                        if (b < 2) gemm_ex_case(ta, tb, pairs[p][0], pairs[p][1], rounds[r], betas[b], 0);
                    }
}

/* Products beyond float16's range become inf when rounded through fp16 (as
 * an fp16 matmul's output does), stay finite through bf16 and float32. */
static void test_gemm_ex_overflow(void) {
    uint16_t A[2], B[2], An[2]; /* A (1, 2) f16, B (2, 1) f16 */
    for (int i = 0; i < 2; i++) {
        A[i] = ref16_round(FMT_F16, 200.0);
        An[i] = ref16_round(FMT_F16, -200.0);
        B[i] = ref16_round(FMT_F16, 200.0);
    }
    float ws[256];
    float C;
    C = 5.0f;
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 1, 1, 2, 1.0, A, KC_F16, 2, B, KC_F16, 1, 0.0, &C, KC_F32, 1, KC_F32, ws,
                               sizeof ws), 0);
    CU_ASSERT_EQUAL(C, 80000.0f); /* > 65504, fine in float32 */
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 1, 1, 2, 1.0, A, KC_F16, 2, B, KC_F16, 1, 0.0, &C, KC_F32, 1, KC_F16, ws,
                               sizeof ws), 0);
    CU_ASSERT(isinf(C) && C > 0);
    C = 5.0f;
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 1, 1, 2, 1.0, An, KC_F16, 2, B, KC_F16, 1, 1.0, &C, KC_F32, 1, KC_F16, ws,
                               sizeof ws), 0);
    CU_ASSERT(isinf(C) && C < 0); /* -inf + 5 */
    C = 5.0f;
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 1, 1, 2, 1.0, A, KC_F16, 2, B, KC_F16, 1, 1.0, &C, KC_F32, 1, KC_BF16, ws,
                               sizeof ws), 0);
    /* bf16 keeps 8 significant bits: 80000 = 156.25 * 2^9 becomes 156 * 2^9 */
    CU_ASSERT_EQUAL(round_as(KC_BF16, 80000.0f), 79872.0f);
    CU_ASSERT_EQUAL(C, 79872.0f + 5.0f);
    /* Just inside the range: 65519 rounds to 65504, not inf (the float32
     * operand is rounded through float16 first, then the product). */
    const float a1 = 65519.0f, b1 = 1.0f;
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 1, 1, 1, 1.0, &a1, KC_F32, 1, &b1, KC_F32, 1, 0.0, &C, KC_F32, 1, KC_F16, ws,
                               sizeof ws), 0);
    CU_ASSERT_EQUAL(C, 65504.0f);
    /* an operand past the range is inf before the product: 65520 * 0.5
     * would be 32760 in float32, but 65520 is inf in float16 */
    const float a2 = 65520.0f, b2 = 0.5f;
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 1, 1, 1, 1.0, &a2, KC_F32, 1, &b2, KC_F32, 1, 0.0, &C, KC_F32, 1, KC_F16, ws,
                               sizeof ws), 0);
    CU_ASSERT_EQUAL(C, INFINITY);
    /* and no workspace is refused once a rounded operand needs a copy */
    CU_ASSERT_NOT_EQUAL(kc_gemm_ex(0, 0, 1, 1, 1, 1.0, &a1, KC_F32, 1, &b1, KC_F32, 1, 0.0, &C, KC_F32, 1, KC_F16,
                                   NULL, 0), 0);
}

static void test_gemm_ex_workspace_and_errors(void) {
    /* No conversion and no rounding with beta != 0: no workspace; a 16-bit
     * round dtype rounds float32 operands in copies. */
    CU_ASSERT_EQUAL(kc_gemm_ex_workspace(8, 6, 4, KC_F32, KC_F32, KC_F32, KC_F32, 1.0), 0);
    CU_ASSERT(kc_gemm_ex_workspace(8, 6, 4, KC_F32, KC_F32, KC_F32, KC_F16, 0.0) >= (8 * 4 + 4 * 6) * sizeof(float));
    CU_ASSERT(kc_gemm_ex_workspace(8, 6, 4, KC_F16, KC_F32, KC_F32, KC_F32, 1.0) >= 8 * 4 * sizeof(float));
    CU_ASSERT(kc_gemm_ex_workspace(8, 6, 4, KC_F32, KC_F32, KC_F32, KC_BF16, 1.0) >= 8 * 6 * sizeof(float));
    CU_ASSERT(kc_gemm_ex_workspace(8, 6, 4, KC_BF16, KC_F16, KC_F32, KC_F16, 2.0) >=
              (8 * 4 + 4 * 6 + 8 * 6) * sizeof(float));
    CU_ASSERT_EQUAL(kc_gemm_ex_workspace(8, 6, 4, KC_F64, KC_F64, KC_F64, KC_F32, 1.0), 0);

    /* Unsupported combinations and a short workspace: -1, C untouched. */
    float A[4] = {1, 2, 3, 4}, B[4] = {1, 0, 0, 1}, C[4] = {7, 7, 7, 7};
    double D[4] = {1, 2, 3, 4};
    uint16_t H[4] = {0x3c00, 0x3c00, 0x3c00, 0x3c00};
    float wsf[64];
    void *ws = wsf;
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 2, 2, 2, 1.0, D, KC_F64, 2, B, KC_F32, 2, 0.0, C, KC_F32, 2, KC_F32, ws, 256), -1);
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 2, 2, 2, 1.0, A, KC_F32, 2, D, KC_F64, 2, 0.0, D, KC_F64, 2, KC_F32, ws, 256), -1);
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 2, 2, 2, 1.0, A, KC_F32, 2, B, KC_F32, 2, 0.0, H, KC_F16, 2, KC_F32, ws, 256), -1);
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 2, 2, 2, 1.0, D, KC_F64, 2, D, KC_F64, 2, 0.0, D, KC_F64, 2, KC_F16, ws, 256), -1);
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 2, 2, 2, 1.0, A, KC_F32, 2, B, KC_F32, 2, 0.0, C, KC_F32, 2, KC_F64, ws, 256), -1);
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 2, 2, 2, 1.0, H, KC_F16, 2, B, KC_F32, 2, 0.0, C, KC_F32, 2, KC_F32, ws, 8), -1);
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 2, 2, 2, 1.0, H, KC_F16, 2, B, KC_F32, 2, 0.0, C, KC_F32, 2, KC_F32, NULL, 0), -1);
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(C[i], 7.0f);
    CU_ASSERT_EQUAL(D[0], 1.0);
    /* The same call with enough workspace: ones(2,2) * I = ones. */
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 2, 2, 2, 1.0, H, KC_F16, 2, B, KC_F32, 2, 0.0, C, KC_F32, 2, KC_F32, ws, 256), 0);
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(C[i], 1.0f);
    /* K == 0: C = beta * C, rounding a zero product changes nothing. */
    float E[4] = {1, 2, 3, 4};
    CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, 2, 2, 0, 1.0, H, KC_F16, 1, B, KC_F32, 2, 0.5, E, KC_F32, 2, KC_F16, ws, 256), 0);
    CU_ASSERT_EQUAL(E[0], 0.5f);
    CU_ASSERT_EQUAL(E[3], 2.0f);
}

/* float64: kc_gemm_ex's F64 family and kc_dgemm against a double triple loop. */
static void test_gemm_ex_f64(void) {
    ex_seed(24);
    const int M = 17, N = 12, K = 23, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bi = 0; bi < 2; bi++) {
                const double beta = bi ? 1.0 : 0.0, alpha = -0.7;
                const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
                const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
                double *A = kt_alloc((size_t)a_rows * lda * 8), *B = kt_alloc((size_t)b_rows * ldb * 8);
                double *C = kt_alloc((size_t)M * ldc * 8), *C0 = kt_alloc((size_t)M * ldc * 8);
                for (int i = 0; i < a_rows * lda; i++) A[i] = ex_uniform(-1, 1);
                for (int i = 0; i < b_rows * ldb; i++) B[i] = ex_uniform(-1, 1);
                for (int i = 0; i < M * ldc; i++) C0[i] = (i % ldc) >= N ? -999.0 : bi ? ex_uniform(-1, 1) : NAN;
                memcpy(C, C0, (size_t)M * ldc * 8);
                const int round = bi ? KC_F64 : KC_F32; /* both mean "none" for float64 */
                CU_ASSERT_EQUAL(kc_gemm_ex(ta, tb, M, N, K, alpha, A, KC_F64, lda, B, KC_F64, ldb, beta, C, KC_F64,
                                           ldc, round, NULL, 0), 0);
                int bad = 0;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < ldc; j++) {
                        double want = -999.0;
                        if (j < N) {
                            double s = 0;
                            for (int k = 0; k < K; k++)
                                s += (ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                                     (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                            want = alpha * s + (bi ? beta * C0[(size_t)i * ldc + j] : 0.0);
                        }
                        bad += !kt_close(C[(size_t)i * ldc + j], want, 1e-13, 1e-14);
                    }
                CU_ASSERT_EQUAL(bad, 0);
                free(A), free(B), free(C), free(C0);
            }
    /* K == 0 */
    double D[2] = {4.0, NAN}, Z[1] = {0};
    kc_dgemm(0, 0, 1, 2, 0, 1.0, Z, 1, Z, 2, 0.0, D, 2);
    CU_ASSERT_EQUAL(D[0], 0.0);
    CU_ASSERT_EQUAL(D[1], 0.0);
}

/* ------------------------------------------------------- float64 kernels */

static void test_f64_bias_relu(void) {
    double y[6] = {1, 2, 3, 4, 5, 6};
    const double b[3] = {10, 20, 30};
    kc_bias_add_f64(y, b, 2, 3);
    const double wy[6] = {11, 22, 33, 14, 25, 36};
    CU_ASSERT(memcmp(y, wy, sizeof y) == 0);

    ex_seed(25);
    enum { R = 7, Cc = 19 };
    double dy[R * Cc], db[Cc], want[Cc];
    for (int i = 0; i < R * Cc; i++) dy[i] = ex_uniform(-1, 1);
    for (int j = 0; j < Cc; j++) {
        want[j] = 0;
        for (int r = 0; r < R; r++) want[j] += dy[r * Cc + j];
        db[j] = NAN; /* overwritten when not accumulating */
    }
    kc_bias_grad_f64(db, dy, R, Cc, 0);
    CU_ASSERT_EQUAL(ex_count_far("db", db, want, Cc, 1e-15, 0), 0);
    for (int j = 0; j < Cc; j++) want[j] *= 2;
    kc_bias_grad_f64(db, dy, R, Cc, 1);
    CU_ASSERT_EQUAL(ex_count_far("db acc", db, want, Cc, 1e-15, 0), 0);

    const double x[6] = {-2.0, -0.0, 0.0, 0.5, 1e300, NAN};
    double r[6], d[6];
    const double g[6] = {1, 2, 3, 4, 5, 6};
    kc_relu_forward_f64(r, x, 6);
    CU_ASSERT_EQUAL(r[0], 0.0);
    CU_ASSERT_EQUAL(r[3], 0.5);
    CU_ASSERT_EQUAL(r[4], 1e300);
    CU_ASSERT(isnan(r[5]));
    kc_relu_backward_f64(d, g, x, 6);
    const double wd[6] = {0, 0, 0, 4, 5, 0};
    CU_ASSERT(memcmp(d, wd, sizeof d) == 0);
    memcpy(d, g, sizeof d);
    kc_relu_backward_f64(d, d, x, 6); /* in place */
    CU_ASSERT(memcmp(d, wd, sizeof d) == 0);
    memcpy(r, x, sizeof r);
    kc_relu_forward_f64(r, r, 6);
    CU_ASSERT_EQUAL(r[0], 0.0);
    CU_ASSERT(isnan(r[5]));
}

/* The tanh form, written directly (cancels for very negative x, so it is
 * used on [-3, 10] only). */
static double gelu_tanh(double x) {
    const double c = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}
static double gelu_tanh_grad(double x) {
    const double c = sqrt(2.0 / 3.14159265358979323846);
    const double t = tanh(c * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

static void test_f64_gelu(void) {
    /* Python: for x in [0,1,-1,2.5,-3]: repr(0.5*x*(1+tanh(u))) */
    const double x5[5] = {0.0, 1.0, -1.0, 2.5, -3.0};
    const double w5[5] = {0.0, 0.8411919906082768, -0.15880800939172324, 2.484915733910001, -0.0036373920817729943};
    double y5[5];
    kc_gelu_forward_f64(y5, x5, 5);
    CU_ASSERT_EQUAL(ex_count_far("gelu64 literals", y5, w5, 5, 1e-14, 0), 0);

    enum { N = 1301 };
    double *x = kt_alloc(N * 8), *y = kt_alloc(N * 8), *g = kt_alloc(N * 8), *one = kt_alloc(N * 8);
    double *wy = kt_alloc(N * 8), *wg = kt_alloc(N * 8);
    for (int i = 0; i < N; i++) {
        x[i] = -3.0 + 13.0 * i / (N - 1);
        one[i] = 1.0;
        wy[i] = gelu_tanh(x[i]);
        wg[i] = gelu_tanh_grad(x[i]);
    }
    kc_gelu_forward_f64(y, x, N);
    kc_gelu_backward_f64(g, one, x, N);
    /* 1 + tanh(u) at x = -3 is ~7e-3: the tanh form loses ~1e-14 there */
    CU_ASSERT_EQUAL(ex_count_far("gelu64 sweep", y, wy, N, 1e-12, 1e-15), 0);
    CU_ASSERT_EQUAL(ex_count_far("gelu64' sweep", g, wg, N, 1e-12, 1e-14), 0);

    /* Central differences in double on [-8, 8], weighted by a random dy. */
    ex_seed(26);
    const double eps = 1e-5;
    for (int i = 0; i < N; i++) {
        x[i] = ex_uniform(-8, 8);
        one[i] = ex_uniform(-1, 1); /* dy */
        double xp = x[i] + eps, xm = x[i] - eps, yp, ym;
        kc_gelu_forward_f64(&yp, &xp, 1);
        kc_gelu_forward_f64(&ym, &xm, 1);
        wg[i] = one[i] * (yp - ym) / (xp - xm);
    }
    kc_gelu_backward_f64(g, one, x, N);
    CU_ASSERT_EQUAL(ex_count_far("gelu64 fd", g, wg, N, 1e-7, 1e-9), 0);
    memcpy(y, one, N * 8);
    kc_gelu_backward_f64(y, y, x, N); /* in place */
    CU_ASSERT(memcmp(y, g, N * 8) == 0);

    /* Far tails: no NaN from exp overflow. */
    const double ex[5] = {-40.0, -1e6, 40.0, NAN, -INFINITY};
    double ey[5], eg[5];
    const double ed[5] = {1, 1, 1, 1, 1};
    kc_gelu_forward_f64(ey, ex, 5);
    kc_gelu_backward_f64(eg, ed, ex, 5);
    CU_ASSERT(!isnan(ey[0]) && fabs(ey[0]) < 1e-300);
    CU_ASSERT(!isnan(ey[1]) && fabs(ey[1]) < 1e-300);
    CU_ASSERT(isfinite(eg[0]) && fabs(eg[0]) < 1e-290);
    CU_ASSERT(isfinite(eg[1]) && fabs(eg[1]) < 1e-290);
    CU_ASSERT_EQUAL(ey[2], 40.0);
    CU_ASSERT_EQUAL(eg[2], 1.0);
    CU_ASSERT(isnan(ey[3]) && isnan(eg[3]));
    free(x), free(y), free(g), free(one), free(wy), free(wg);
}

static void test_f64_softmax_xent(void) {
    /* Reference without the max shift (the logits are small): p = e^l / Z. */
    enum { B = 4, C = 6 };
    ex_seed(27);
    double l[B * C], p[B * C], d[B * C], wp[B * C], num[B * C], scratch[B * C];
    const int32_t y[B] = {0, 5, 2, 2};
    for (int i = 0; i < B * C; i++) l[i] = ex_uniform(-3, 3);
    l[1 * C + 5] = 4.0; /* row 1 predicts its label */
    double wloss = 0;
    int wcorrect = 0;
    for (int b = 0; b < B; b++) {
        double z = 0;
        int arg = 0;
        for (int j = 0; j < C; j++) {
            z += exp(l[b * C + j]);
            if (l[b * C + j] > l[b * C + arg]) arg = j;
        }
        for (int j = 0; j < C; j++) wp[b * C + j] = exp(l[b * C + j]) / z;
        wloss += -log(wp[b * C + y[b]]);
        wcorrect += arg == y[b];
    }
    wloss /= B;
    int nc = -1;
    const double loss = kc_softmax_xent_forward_f64(p, l, y, B, C, &nc);
    CU_ASSERT(kt_close(loss, wloss, 1e-14, 0));
    CU_ASSERT_EQUAL(nc, wcorrect);
    CU_ASSERT(wcorrect >= 1);
    CU_ASSERT_EQUAL(ex_count_far("probs64", p, wp, B * C, 1e-14, 1e-17), 0);
    CU_ASSERT(kt_close(kc_softmax_xent_forward_f64(p, l, y, B, C, NULL), wloss, 1e-14, 0));

    /* Gradient vs central differences of the loss (double: eps 1e-6). */
    const double eps = 1e-6;
    for (int i = 0; i < B * C; i++) {
        const double keep = l[i];
        l[i] = keep + eps;
        const double lp = kc_softmax_xent_forward_f64(scratch, l, y, B, C, NULL);
        l[i] = keep - eps;
        const double lm = kc_softmax_xent_forward_f64(scratch, l, y, B, C, NULL);
        l[i] = keep;
        num[i] = 0.5 * (lp - lm) / eps;
    }
    kc_softmax_xent_backward_f64(d, p, y, B, C, 1.0);
    CU_ASSERT_EQUAL(ex_count_far("dlogits64 fd", d, num, B * C, 1e-6, 1e-9), 0);
    double d2[B * C], scaled[B * C];
    kc_softmax_xent_backward_f64(d2, p, y, B, C, 2.5);
    for (int i = 0; i < B * C; i++) scaled[i] = 2.5 * d[i];
    CU_ASSERT_EQUAL(ex_count_far("dlogits64*2.5", d2, scaled, B * C, 1e-15, 0), 0);
    kc_softmax_xent_backward_f64(p, p, y, B, C, 1.0); /* in place */
    CU_ASSERT(memcmp(p, d, sizeof d) == 0);

    /* Logits of magnitude 1000 stay finite: loss (0 + 2000) / 2. */
    const double big[6] = {1000, 0, -1000, 1000, 0, -1000};
    const int32_t yb[2] = {0, 2};
    double pb[6];
    CU_ASSERT(kt_close(kc_softmax_xent_forward_f64(pb, big, yb, 2, 3, &nc), 1000.0, 1e-15, 0));
    CU_ASSERT_EQUAL(pb[0], 1.0);
    CU_ASSERT_EQUAL(nc, 1);

    /* A bad label: NAN, probs still filled, n_correct counts valid rows;
     * the backward fills the bad row with NaN. */
    const double l2[6] = {0.0, 5.0, 1.0, 3.0, 0.0, 0.0};
    int32_t bad[2] = {1, 3};
    for (int i = 0; i < 6; i++) pb[i] = -1.0;
    CU_ASSERT(isnan(kc_softmax_xent_forward_f64(pb, l2, bad, 2, 3, &nc)));
    CU_ASSERT_EQUAL(nc, 1);
    CU_ASSERT(kt_close(pb[3] + pb[4] + pb[5], 1.0, 1e-15, 0));
    bad[1] = -1;
    CU_ASSERT(isnan(kc_softmax_xent_forward_f64(pb, l2, bad, 2, 3, &nc)));
    double db[6];
    kc_softmax_xent_backward_f64(db, pb, bad, 2, 3, 1.0);
    CU_ASSERT(isfinite(db[0]) && isfinite(db[1]) && isfinite(db[2]));
    CU_ASSERT(isnan(db[3]) && isnan(db[4]) && isnan(db[5]));
    CU_ASSERT(isnan(kc_softmax_xent_forward_f64(pb, l2, bad, 0, 3, &nc)));
    CU_ASSERT_EQUAL(nc, 0);
}

static void test_f64_reductions_blas1(void) {
    const double x[5] = {1.0, -2.0, 3.5, 0.25, -0.75};
    CU_ASSERT_EQUAL(kc_sumsq_f64(x, 5), 1 + 4 + 12.25 + 0.0625 + 0.5625);
    CU_ASSERT_EQUAL(kc_sumsq_f64(x, 0), 0.0);
    ex_seed(28);
    const size_t n = 100003; /* several reduction blocks */
    double *big = kt_alloc(n * 8);
    double want = 0;
    for (size_t i = 0; i < n; i++) {
        big[i] = ex_uniform(-3, 3);
        want += big[i] * big[i];
    }
    CU_ASSERT(kt_close(kc_sumsq_f64(big, n), want, 1e-13, 0));

    double y[5] = {1, 1, 1, 1, 1};
    kc_axpy_f64(y, 2.0, x, 5);
    const double wa[5] = {3.0, -3.0, 8.0, 1.5, -0.5};
    CU_ASSERT(memcmp(y, wa, sizeof y) == 0);
    kc_scale_f64(y, -0.5, 5);
    const double ws[5] = {-1.5, 1.5, -4.0, -0.75, 0.25};
    CU_ASSERT(memcmp(y, ws, sizeof y) == 0);
    /* 0.1 stays 0.1 in double (as float it would be 0.100000001) */
    double t = 1.0;
    kc_scale_f64(&t, 0.1, 1);
    CU_ASSERT_EQUAL(t, 0.1);

    CU_ASSERT_EQUAL(kc_all_finite_f64(x, 5), 1);
    CU_ASSERT_EQUAL(kc_all_finite_f64(x, 0), 1);
    const double specials[3] = {NAN, INFINITY, -INFINITY};
    double z[5];
    for (int s = 0; s < 3; s++)
        for (int pos = 0; pos < 5; pos++) {
            memcpy(z, x, sizeof z);
            z[pos] = specials[s];
            CU_ASSERT_EQUAL(kc_all_finite_f64(z, 5), 0);
        }
    const double edge[4] = {DBL_MAX, -DBL_MAX, 4.9406564584124654e-324, 1e300 * 10};
    CU_ASSERT_EQUAL(kc_all_finite_f64(edge, 4), 1);
    for (size_t i = 0; i < n; i++) big[i] = 1.0;
    CU_ASSERT_EQUAL(kc_all_finite_f64(big, n), 1);
    big[n - 2] = -INFINITY;
    CU_ASSERT_EQUAL(kc_all_finite_f64(big, n), 0);
    free(big);
}

/* ---------------------------------------------------- float64 optimizers */

/* The hand-derived table of test_sgd_hand (p0 = 1, g = 1, lr = 0.1), now in
 * double: agreement to 1e-14 instead of float's 1e-6. */
static void test_f64_sgd_hand(void) {
    const struct { double mom, damp, wd; int nest; double want[3]; } t[] = {
        {0.0, 0.0, 0.0, 0, {0.9, 0.8, 0.7}},
        {0.9, 0.0, 0.0, 0, {0.9, 0.71, 0.439}},
        {0.9, 0.5, 0.0, 0, {0.9, 0.76, 0.584}},
        {0.9, 0.0, 0.0, 1, {0.81, 0.539, 0.1951}},
        {0.9, 0.0, 0.1, 0, {0.89, 0.6821, 0.388169}},
        {0.0, 0.0, 0.1, 0, {0.89, 0.7811, 0.673289}},
    };
    for (size_t c = 0; c < sizeof t / sizeof t[0]; c++) {
        double p = 1.0, g = 1.0, buf = -777.0;
        for (int s = 0; s < 3; s++) {
            kc_sgd_update_f64(&p, &g, t[c].mom != 0.0 ? &buf : NULL, 1, 0.1, t[c].mom, t[c].damp, t[c].nest,
                              t[c].wd, s == 0);
            if (!kt_close(p, t[c].want[s], 1e-14, 1e-15))
                printf("\n  sgd64 case %zu step %d: %.17g want %.17g", c, s + 1, p, t[c].want[s]);
            CU_ASSERT(kt_close(p, t[c].want[s], 1e-14, 1e-15));
        }
    }
}

/* Every option combination, 3 steps: the float64 kernel vs the float32 one
 * on the same (float-representable) values, and vs the textbook algorithm in
 * double. */
static void test_f64_sgd_vs_float(void) {
    ex_seed(29);
    enum { N = 37, T = 3 };
    for (int mode = 0; mode < 16; mode++) {
        const kt_sgd_opts o = kt_sgd_mode(mode);
        float pf[N], bf[N], gf[N];
        double pd[N], bd[N], gd[N], pr[N], br[N], pf_d[N];
        for (int i = 0; i < N; i++) pd[i] = pr[i] = pf[i] = (float)ex_uniform(-1, 1);
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < N; i++) gd[i] = gf[i] = (float)ex_uniform(-1, 1);
            kc_sgd_update(pf, gf, bf, N, o.lr, o.mu, o.damp, o.nest, o.wd, t == 0);
            kc_sgd_update_f64(pd, gd, bd, N, o.lr, o.mu, o.damp, o.nest, o.wd, t == 0);
            kt_sgd_textbook(pr, br, gd, N, o.lr, o.mu, o.damp, o.nest, o.wd, t == 0);
        }
        for (int i = 0; i < N; i++) pf_d[i] = pf[i];
        CU_ASSERT_EQUAL(ex_count_far("sgd64 vs f32", pd, pf_d, N, 1e-6, 1e-6), 0);
        CU_ASSERT_EQUAL(ex_count_far("sgd64 vs textbook", pd, pr, N, 1e-14, 1e-15), 0);
        if (o.mu != 0.0f) CU_ASSERT_EQUAL(ex_count_far("sgd64 buf", bd, br, N, 1e-14, 1e-15), 0);
    }
}

/*
 * The Python literals of kt_common.h (textbook AdamW in double), as in
 * test_adamw_literals, now reproduced in double with the script's exact
 * inputs: agreement to ~1e-15 (the kernel's lerp and division order differ
 * from the script's only by rounding).
 */
static void test_f64_adamw_literals(void) {
    KT_ADAMW_LITERALS(double, kc_adamw_update_f64, ex_count_far, "adamw64", 1e-13, 1e-15, 1e-13);
}

/* Same values through kc_adamw_update_d (float storage, double
 * hyperparameters) and kc_adamw_update_f64, plus the textbook formula in
 * double, including lerp's large-weight branch (beta1 < 0.5) and step 0
 * treated as 1. */
static void adamw64_case(double lr, double b1, double b2, double eps, double wd) {
    enum { N = 41, T = 3 };
    float pf[N], mf[N] = {0}, vf[N] = {0}, gf[N];
    double pd[N], md[N] = {0}, vd[N] = {0}, gd[N], pr[N], mr[N] = {0}, vr[N] = {0}, pf_d[N];
    for (int i = 0; i < N; i++) pd[i] = pr[i] = pf[i] = (float)ex_uniform(-2, 2);
    for (int t = 1; t <= T; t++) {
        for (int i = 0; i < N; i++) gd[i] = gf[i] = (float)ex_uniform(-0.5, 0.5);
        kc_adamw_update_d(pf, gf, mf, vf, N, lr, b1, b2, eps, wd, t);
        kc_adamw_update_f64(pd, gd, md, vd, N, lr, b1, b2, eps, wd, t == 1 ? 0 : t);
        kt_adamw_textbook(pr, mr, vr, gd, N, lr, b1, b2, eps, wd, t);
    }
    for (int i = 0; i < N; i++) pf_d[i] = pf[i];
    CU_ASSERT_EQUAL(ex_count_far("adamw64 vs f32", pd, pf_d, N, 2e-6, 2e-6), 0);
    CU_ASSERT_EQUAL(ex_count_far("adamw64 vs textbook p", pd, pr, N, 1e-12, 1e-14), 0);
    CU_ASSERT_EQUAL(ex_count_far("adamw64 vs textbook m", md, mr, N, 1e-12, 1e-16), 0);
    CU_ASSERT_EQUAL(ex_count_far("adamw64 vs textbook v", vd, vr, N, 1e-12, 1e-18), 0);
}

static void test_f64_adamw_vs_float(void) {
    ex_seed(30);
    adamw64_case(1e-3, 0.9, 0.999, 1e-8, 0.01);
    adamw64_case(3e-2, 0.3, 0.95, 1e-6, 0.0); /* lerp weight 0.7 >= 0.5 */
    adamw64_case(1e-2, 0.0, 0.5, 1e-3, 0.5);
}

/* ---------------------------------------------------------------- threads */

enum { XN = (3 << 18) + 24, XR = 97, XC = 4099, XB = 601, XK = 769, XG = 160 };

/* Every new kernel that splits, on fresh copies of the same inputs; the
 * results are appended to out (bytes) in a fixed order. */
static size_t run_ex_kernels(const double *x, const double *g, const int32_t *labels, unsigned char *out) {
    unsigned char *o = out;
    const size_t n = XN;
    /* conversions and rounding */
    kc_cast(o, KC_F16, x, KC_F64, n), o += 2 * n;
    kc_cast(o, KC_BF16, x, KC_F64, n), o += 2 * n;
    float *f = (float *)(void *)o;
    kc_f64_to_f32(f, x, n), o += 4 * n;
    uint16_t *h = (uint16_t *)(void *)o;
    kc_f32_to_f16(h, f, n), o += 2 * n;
    kc_f16_to_f32((float *)(void *)o, h, n), o += 4 * n;
    kc_f32_to_bf16((uint16_t *)(void *)o, f, n), o += 2 * n;
    memcpy(o, f, 4 * n), kc_round_f16((float *)(void *)o, n), o += 4 * n;
    memcpy(o, f, 4 * n), kc_round_bf16((float *)(void *)o, n), o += 4 * n;
    /* gemm_ex (fp16 A, bf16-rounded product, beta 1) and dgemm, big enough
     * to split */
    const size_t gg = (size_t)XG * XG;
    static float ws[3 * XG * XG + 64];
    float *Cg = (float *)(void *)o;
    for (size_t i = 0; i < gg; i++) Cg[i] = f[i + 7];
    kc_gemm_ex(0, 1, XG, XG, XG, 0.5, h, KC_F16, XG, f + 3, KC_F32, XG, 1.0, Cg, KC_F32, XG, KC_BF16, ws, sizeof ws);
    o += 4 * gg;
    double *Cd = (double *)(void *)o;
    memcpy(Cd, g, 8 * gg);
    kc_dgemm(1, 0, XG, XG, XG, -0.25, x, XG, g + 11, XG, 1.0, Cd, XG);
    o += 8 * gg;
    /* float64 training kernels */
    double *d = (double *)(void *)o;
    kc_relu_forward_f64(d, x, n), d += n;
    kc_relu_backward_f64(d, g, x, n), d += n;
    kc_gelu_forward_f64(d, x, n), d += n;
    kc_gelu_backward_f64(d, g, x, n), d += n;
    memcpy(d, x, 8 * n), kc_scale_f64(d, 0.37, n), d += n;
    memcpy(d, x, 8 * n), kc_axpy_f64(d, -1.3, g, n), d += n;
    double *p = d, *buf = d + n;
    memcpy(p, x, 8 * n);
    kc_sgd_update_f64(p, g, buf, n, 0.1, 0.9, 0.1, 1, 0.01, 1);
    kc_sgd_update_f64(p, x, buf, n, 0.1, 0.9, 0.1, 1, 0.01, 0);
    d += 2 * n;
    double *ap = d, *am = d + n, *av = d + 2 * n;
    memcpy(ap, x, 8 * n);
    memset(am, 0, 8 * n);
    memset(av, 0, 8 * n);
    kc_adamw_update_f64(ap, g, am, av, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1);
    kc_adamw_update_f64(ap, x, am, av, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 2);
    d += 3 * n;
    memcpy(d, x, 8 * (size_t)XR * XC);
    kc_bias_add_f64(d, g, XR, XC);
    d += (size_t)XR * XC;
    kc_bias_grad_f64(d, x, XR, XC, 0);
    kc_bias_grad_f64(d, g, XR, XC, 1);
    d += XC;
    int nc = -1;
    d[0] = kc_softmax_xent_forward_f64(d + 4, x, labels, XB, XK, &nc);
    d[1] = nc;
    d[2] = kc_sumsq_f64(g, n);
    d[3] = kc_all_finite_f64(x, n);
    kc_softmax_xent_backward_f64(d + 4 + (size_t)XB * XK, d + 4, labels, XB, XK, 0.5);
    d += 4 + 2 * (size_t)XB * XK;
    return (size_t)((unsigned char *)d - out);
}

static void test_ex_threads_bit_identical(void) {
    const size_t n = XN;
    const size_t out_bytes = 24 * n + 12 * (size_t)XG * XG + 8 * (11 * n + (size_t)XR * XC + XC + 4 + 2 * (size_t)XB * XK);
    double *x = kt_alloc(8 * n), *g = kt_alloc(8 * n);
    unsigned char *ref = kt_alloc(out_bytes), *got = kt_alloc(out_bytes);
    int32_t labels[XB];
    ex_seed(31);
    for (size_t i = 0; i < n; i++) {
        x[i] = ex_uniform(-6, 6);
        g[i] = ex_uniform(-1, 1);
    }
    x[12345] = 1e6; /* fp16 overflow inside the cast and the gemm operand */
    for (int i = 0; i < XB; i++) labels[i] = (int32_t)(ex_next() % XK);
    CU_ASSERT_EQUAL(kc_set_num_threads(1), 1);
    memset(ref, 0, out_bytes);
    const size_t used = run_ex_kernels(x, g, labels, ref);
    CU_ASSERT_EQUAL_FATAL(used, out_bytes);
    const int counts[] = {2, 3};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        CU_ASSERT_EQUAL(kc_set_num_threads(counts[k]), counts[k]);
        memset(got, 0, out_bytes);
        run_ex_kernels(x, g, labels, got);
        for (size_t i = 0; i < out_bytes; i++) {
            if (got[i] != ref[i]) {
                printf("\n  %d threads: byte %zu of the results differs", counts[k], i);
                CU_FAIL("threaded result differs from single-threaded");
                break;
            }
        }
    }
    CU_ASSERT_EQUAL(kc_set_num_threads(1), 1);
    free(x), free(g), free(ref), free(got);
}

/* ------------------------------------------------------------------ main */

/* The cases of this suite; test_kernels_cpu.c registers them. */
CU_TestInfo kt_ex_cases[] = {
    {"f16_known_values", test_f16_known_values},
    {"bf16_known_values", test_bf16_known_values},
    {"f16_soft_vs_reference", test_f16_soft},
    {"cast_all_pairs_vs_reference", test_cast_all_pairs},
    {"round_in_place", test_round_in_place},
    {"gemm_ex_vs_ref", test_gemm_ex_vs_ref},
    {"gemm_ex_overflow", test_gemm_ex_overflow},
    {"gemm_ex_workspace_and_errors", test_gemm_ex_workspace_and_errors},
    {"gemm_ex_f64", test_gemm_ex_f64},
    {"f64_bias_relu", test_f64_bias_relu},
    {"f64_gelu", test_f64_gelu},
    {"f64_softmax_xent", test_f64_softmax_xent},
    {"f64_reductions_blas1", test_f64_reductions_blas1},
    {"f64_sgd_hand", test_f64_sgd_hand},
    {"f64_sgd_vs_float", test_f64_sgd_vs_float},
    {"f64_adamw_literals", test_f64_adamw_literals},
    {"f64_adamw_vs_float", test_f64_adamw_vs_float},
    {"ex_threads_bit_identical", test_ex_threads_bit_identical},
    CU_TEST_INFO_NULL,
};
