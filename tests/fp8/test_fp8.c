/*
 * test_fp8.c — the two OCP 8-bit floating-point formats (OFP8 v1.0, ABI
 * 1.5's KILN_DTYPE_F8E4M3 and KILN_DTYPE_F8E5M2) against a reference written
 * here from the specification (ldexp and a search over the code table, no
 * bit tricks): all 256 codes of each format decode to the spec's value
 * (NaN codes to NaN, E5M2's infinities to inf), every finite code survives
 * encode(decode(c)) (both zeros included); round to nearest even at every
 * midpoint between neighbours (and one float ulp either side), in the
 * subnormals and at the normal boundary; saturation of finite overflow to
 * +-448 / +-57344; NaN kept, inf kept in E5M2 and NaN in E4M3; 200000 random
 * floats over 2^-24 .. 2^20 equal to the reference. Then the same through
 * the cpu accelerator's round_to entry (what precisions call), and the
 * dtype helpers (size 1, PyTorch's names, from_name).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>
#include <kiln/testing.h>

#include "cpu_kernels.h"

/* ------------------------------------------------------------ reference */

typedef struct fmt {
    const char *name;
    uint32_t dtype;
    int M, E, bias; /* mantissa bits, exponent bits, bias */
    int has_inf;    /* E5M2: S.11111.00 is inf; E4M3 has none */
    double max;
} fmt;

static const fmt g_fmts[2] = {
    {"float8_e4m3fn", KILN_DTYPE_F8E4M3, 3, 4, 7, 0, 448.0},
    {"float8_e5m2", KILN_DTYPE_F8E5M2, 2, 5, 15, 1, 57344.0},
};

/* The spec's value of code c (NaN as NAN, inf as INFINITY). */
static double ref_decode(const fmt *f, unsigned c) {
    const int s = c >> 7, e = (int)((c & 0x7f) >> f->M), m = (int)(c & ((1u << f->M) - 1));
    const int emax_field = (1 << f->E) - 1;
    double v;
    if (!f->has_inf && e == emax_field && m == (1 << f->M) - 1) return NAN; /* E4M3: S.1111.111 */
    if (f->has_inf && e == emax_field) {
        if (m != 0) return NAN;
        v = INFINITY;
    } else if (e == 0) {
        v = ldexp(m, 1 - f->bias - f->M);
    } else {
        v = ldexp((1 << f->M) + m, e - f->bias - f->M);
    }
    return s ? -v : v;
}

/* The spec's rounding of x: the nearest finite code value, ties to the
 * even code, finite overflow saturating; NaN -> NaN; inf -> inf (E5M2) or
 * NaN (E4M3). Returns the value. */
static double ref_round(const fmt *f, float x) {
    if (isnan(x)) return NAN;
    if (isinf(x)) return f->has_inf ? (double)x : NAN;
    const double a = fabs((double)x);
    double best = 0;
    unsigned best_c = 0;
    double best_d = INFINITY;
    if (a >= f->max) {
        best = f->max;
    } else {
        for (unsigned c = 0; c < 0x80; c++) {
            const double v = ref_decode(f, c);
            if (!isfinite(v)) continue;
            const double d = fabs(a - v);
            if (d < best_d || (d == best_d && (c & 1u) == 0 && (best_c & 1u) == 1)) {
                best_d = d;
                best = v;
                best_c = c;
            }
        }
    }
    return signbit(x) ? -best : best;
}

static int same(double got, double want) {
    if (isnan(want)) return isnan(got);
    return got == want && signbit(got) == signbit(want);
}

static float kc_round(const fmt *f, float x) {
    return f->dtype == KILN_DTYPE_F8E4M3 ? kc_f8e4m3_value(kc_f8e4m3_bits(x)) : kc_f8e5m2_value(kc_f8e5m2_bits(x));
}

/* ---------------------------------------------------------------- codec */

static void test_decode_all_codes(void) {
    for (int fi = 0; fi < 2; fi++) {
        const fmt *f = &g_fmts[fi];
        int bad = 0, nans = 0, infs = 0;
        for (unsigned c = 0; c < 256; c++) {
            const double want = ref_decode(f, c);
            const float got = f->dtype == KILN_DTYPE_F8E4M3 ? kc_f8e4m3_value((uint8_t)c) : kc_f8e5m2_value((uint8_t)c);
            nans += isnan(want) != 0;
            infs += isinf(want) != 0;
            if (!same(got, want)) {
                if (bad++ < 5) fprintf(stderr, "\n  %s code 0x%02x: got %.9g, want %.9g", f->name, c, got, want);
                continue;
            }
            /* every finite code comes back from its own value */
            if (isfinite(want)) {
                const unsigned back =
                    f->dtype == KILN_DTYPE_F8E4M3 ? kc_f8e4m3_bits(got) : kc_f8e5m2_bits(got);
                if (back != c && bad++ < 5) fprintf(stderr, "\n  %s code 0x%02x re-encodes as 0x%02x", f->name, c, back);
            }
        }
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT_EQUAL(nans, f->has_inf ? 6 : 2); /* E5M2: S.11111.{01,10,11}; E4M3: S.1111.111 */
        CU_ASSERT_EQUAL(infs, f->has_inf ? 2 : 0);
    }
    /* the spec's landmarks */
    CU_ASSERT_EQUAL(kc_f8e4m3_value(0x7e), 448.0f);
    CU_ASSERT_EQUAL(kc_f8e4m3_value(0x08), 0x1p-6f);  /* min normal */
    CU_ASSERT_EQUAL(kc_f8e4m3_value(0x01), 0x1p-9f);  /* min subnormal */
    CU_ASSERT_EQUAL(kc_f8e5m2_value(0x7b), 57344.0f);
    CU_ASSERT_EQUAL(kc_f8e5m2_value(0x04), 0x1p-14f);
    CU_ASSERT_EQUAL(kc_f8e5m2_value(0x01), 0x1p-16f);
    CU_ASSERT(isinf(kc_f8e5m2_value(0xfc)) && kc_f8e5m2_value(0xfc) < 0);
}

/* Every midpoint between neighbouring finite codes (ties: to the even
 * code), and one float ulp below and above it (no tie: to the nearer). */
static void test_ties_and_neighbours(void) {
    for (int fi = 0; fi < 2; fi++) {
        const fmt *f = &g_fmts[fi];
        int bad = 0, checked = 0;
        for (unsigned c = 0; c + 1 < 0x80; c++) {
            const double lo = ref_decode(f, c), hi = ref_decode(f, c + 1);
            if (!isfinite(lo) || !isfinite(hi)) continue;
            const float mid = (float)((lo + hi) / 2); /* exact: FP8 neighbours' midpoint is a float */
            const float probes[3] = {nextafterf(mid, 0.0f), mid, nextafterf(mid, INFINITY)};
            for (int p = 0; p < 3; p++)
                for (int sgn = 0; sgn < 2; sgn++) {
                    const float x = sgn ? -probes[p] : probes[p];
                    const double want = ref_round(f, x);
                    checked++;
                    if (!same(kc_round(f, x), want) && bad++ < 5)
                        fprintf(stderr, "\n  %s: round(%.9g) = %.9g, want %.9g", f->name, x, kc_round(f, x), want);
                }
            /* the tie goes to the even code: the reference says which */
            const double tie = ref_round(f, mid);
            CU_ASSERT(tie == ((c & 1u) ? hi : lo));
        }
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT(checked > 600);
    }
}

static void test_saturation_and_specials(void) {
    const float big[] = {449.0f, 464.0f, 465.0f, 480.0f, 1e6f, FLT_MAX};
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
        CU_ASSERT_EQUAL(kc_round(&g_fmts[0], big[i]), 448.0f);
        CU_ASSERT_EQUAL(kc_round(&g_fmts[0], -big[i]), -448.0f);
    }
    const float big5[] = {57345.0f, 61439.0f, 61440.0f, 65536.0f, 1e30f, FLT_MAX};
    for (size_t i = 0; i < sizeof big5 / sizeof *big5; i++) {
        CU_ASSERT_EQUAL(kc_round(&g_fmts[1], big5[i]), 57344.0f);
        CU_ASSERT_EQUAL(kc_round(&g_fmts[1], -big5[i]), -57344.0f);
    }
    CU_ASSERT(isnan(kc_round(&g_fmts[0], INFINITY))); /* E4M3 has no inf */
    CU_ASSERT(isnan(kc_round(&g_fmts[0], -INFINITY)));
    CU_ASSERT(isinf(kc_round(&g_fmts[1], INFINITY)) && kc_round(&g_fmts[1], INFINITY) > 0);
    CU_ASSERT(isinf(kc_round(&g_fmts[1], -INFINITY)) && kc_round(&g_fmts[1], -INFINITY) < 0);
    for (int fi = 0; fi < 2; fi++) {
        CU_ASSERT(isnan(kc_round(&g_fmts[fi], NAN)));
        CU_ASSERT(signbit(kc_round(&g_fmts[fi], -NAN)));
        CU_ASSERT(signbit(kc_round(&g_fmts[fi], -0.0f)) && kc_round(&g_fmts[fi], -0.0f) == 0.0f);
        CU_ASSERT(signbit(kc_round(&g_fmts[fi], -1e-30f))); /* underflow keeps the sign */
        CU_ASSERT_EQUAL(kc_round(&g_fmts[fi], 0x1p-140f), 0.0f); /* a float subnormal */
    }
    /* half the smallest subnormal is a tie with 0 (even): 0; above it: the subnormal */
    CU_ASSERT_EQUAL(kc_round(&g_fmts[0], 0x1p-10f), 0.0f);
    CU_ASSERT_EQUAL(kc_round(&g_fmts[0], nextafterf(0x1p-10f, 1.0f)), 0x1p-9f);
    CU_ASSERT_EQUAL(kc_round(&g_fmts[1], 0x1p-17f), 0.0f);
    CU_ASSERT_EQUAL(kc_round(&g_fmts[1], 0x1.8p-16f), 0x1p-15f); /* 1.5 subnormal steps: tie to 2 (even) */
    /* the largest subnormal rounding up into the smallest normal */
    CU_ASSERT_EQUAL(kc_round(&g_fmts[0], 0x1.fp-7f), 0x1p-6f);
}

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

static void test_random(void) {
    for (int fi = 0; fi < 2; fi++) {
        const fmt *f = &g_fmts[fi];
        int bad = 0;
        for (int i = 0; i < 200000; i++) {
            const uint64_t r = rnd();
            const int e = (int)(r % 45) - 24; /* 2^-24 .. 2^20 */
            const float x = ldexpf(1.0f + (float)(r >> 40) * 0x1p-24f, e) * ((r >> 39) & 1 ? -1.0f : 1.0f);
            if (!same(kc_round(f, x), ref_round(f, x)) && bad++ < 5)
                fprintf(stderr, "\n  %s: round(%a) = %a, want %a", f->name, x, kc_round(f, x), ref_round(f, x));
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
}

/* ------------------------------------------------- the accelerator entry */

static void test_round_to_entry(void) {
    kiln_test_host *th;
    CU_ASSERT_EQUAL_FATAL(kiln_test_host_new(&th), KILN_OK);
    char path[1024];
    snprintf(path, sizeof path, "%s/libkiln-cpu.so", getenv("KILN_PLUGIN_DIR") ? getenv("KILN_PLUGIN_DIR") : ".");
    if (kiln_test_use_accelerator(th, path, "cpu", NULL, 2) != KILN_OK) {
        CU_FAIL("cannot load the cpu accelerator");
        kiln_test_host_free(th);
        return;
    }
    const kiln_kernels *k = kiln_test_kernels(th);
    kiln_instance *acc = kiln_test_acc(th);
    enum { N = 300001 }; /* above the kernels' thread split */
    float *x, *want = malloc(N * sizeof *want);
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, N * sizeof *x, (void **)&x), KILN_OK);
    for (int fi = 0; fi < 2; fi++) {
        const fmt *f = &g_fmts[fi];
        for (int i = 0; i < N; i++) {
            const uint64_t r = rnd();
            x[i] = ldexpf((float)(r >> 40) * 0x1p-24f, (int)(r % 40) - 20) * ((r >> 39) & 1 ? -1.0f : 1.0f);
            if (i == 7) x[i] = INFINITY;
            if (i == 8) x[i] = NAN;
            if (i == 9) x[i] = 1e9f;
            want[i] = (float)ref_round(f, x[i]);
        }
        CU_ASSERT_EQUAL(k->round_to(acc, x, f->dtype, N), KILN_OK);
        int bad = 0;
        for (int i = 0; i < N; i++) bad += !same(x[i], want[i]);
        CU_ASSERT_EQUAL(bad, 0);
    }
    /* a dtype round_to does not know: one line naming the choices */
    CU_ASSERT_EQUAL(k->round_to(acc, x, KILN_DTYPE_I32, 4), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "float8_e4m3fn or float8_e5m2, got int32"));
    k->free(acc, x);
    free(want);
    kiln_test_host_free(th);
}

static void test_dtype_helpers(void) {
    CU_ASSERT_EQUAL(kiln_dtype_size(KILN_DTYPE_F8E4M3), 1u);
    CU_ASSERT_EQUAL(kiln_dtype_size(KILN_DTYPE_F8E5M2), 1u);
    CU_ASSERT_STRING_EQUAL(kiln_dtype_name(KILN_DTYPE_F8E4M3), "float8_e4m3fn");
    CU_ASSERT_STRING_EQUAL(kiln_dtype_name(KILN_DTYPE_F8E5M2), "float8_e5m2");
    CU_ASSERT_EQUAL(kiln_dtype_from_name("float8_e4m3fn"), (uint32_t)KILN_DTYPE_F8E4M3);
    CU_ASSERT_EQUAL(kiln_dtype_from_name("float8_e5m2"), (uint32_t)KILN_DTYPE_F8E5M2);
    CU_ASSERT_EQUAL(kiln_dtype_from_name("uint8"), (uint32_t)KILN_DTYPE_U8); /* the older ones unchanged */
    CU_ASSERT_EQUAL(KILN_DTYPE_F8E4M3, 8); /* fixed numbers, never renumbered */
    CU_ASSERT_EQUAL(KILN_DTYPE_F8E5M2, 9);
}

static CU_TestInfo cases_fp8[] = {
    {"all 256 codes of each format decode as the spec says, finite ones re-encode", test_decode_all_codes},
    {"midpoints round to the even code, one ulp off to the nearer", test_ties_and_neighbours},
    {"saturation, NaN, inf, zeros, subnormals", test_saturation_and_specials},
    {"200000 random floats = the reference", test_random},
    {"the cpu accelerator's round_to = the reference", test_round_to_entry},
    {"dtype helpers", test_dtype_helpers},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    CU_SuiteInfo suites[] = {
        {.pName = "fp8", .pTests = cases_fp8},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
