/*
 * test_cuda_math.cu: checks kernels/cuda/kg_math.cuh, the per-element
 * arithmetic of the CUDA kernels, against the CPU reference kernels of
 * kiln_kernels_cpu, on the host (compiled by nvcc as host code; it calls no
 * CUDA runtime function and needs no GPU). Each kg_* function is run on
 * value pools rich in edge cases (signed zeros, infinities, NaNs with
 * payloads, subnormals, the float16 overflow threshold 65520, rounding ties
 * of both 16-bit formats and ties nudged by far-away bits that a double
 * rounding would get wrong, strided sweeps over all float bit patterns) and
 * compared with the kc_* kernel given the same inputs. Tolerances: bit-exact
 * (NaN bits included) for every conversion and rounding; bit-exact for the
 * activations, BLAS-1, the rounded epilogue, the loss backward and the
 * optimizers (kg_math re-states the CPU's operations in the same order and
 * the host compiles both without contraction; any NaN equals any NaN there,
 * since NaN payloads through arithmetic are not part of the contract and a
 * GPU canonicalises them); float64 activations are bit-exact here because
 * host and CPU call the same libm (on a GPU, CUDA's exp/tanh differ by up to
 * ~2 ulp). The softmax forward, emulated with the kernel's 256-lane tree
 * (argmax combination, NaN rule, tree-ordered double sums), allows 4 ulp on
 * float probabilities, 4 + 2C ulp on double ones (a sum of C terms in
 * another order) and 1e-6 (float) / 1e-12 (double) relative on the mean
 * loss; argmax hits are exact.
 * Some absolute facts (65520 -> inf, ties to even, no double rounding) are
 * also asserted directly, so a shared mistake in both cannot pass.
 */
#include <CUnit/CUnit.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "cpu_kernels.h"
#include "kg_internal.cuh"
#include "kg_math.cuh"

/* ------------------------------------------------------------- helpers */

static uint64_t tm_rng = 0x9E3779B97F4A7C15ull;
static void tm_seed(uint64_t s) { tm_rng = s ? s : 1; }
static uint64_t tm_next(void) { /* xorshift64* */
    tm_rng ^= tm_rng >> 12;
    tm_rng ^= tm_rng << 25;
    tm_rng ^= tm_rng >> 27;
    return tm_rng * 0x2545F4914F6CDD1Dull;
}
static double tm_unit(void) { return (double)(tm_next() >> 11) * (1.0 / 9007199254740992.0); }
static double tm_uniform(double lo, double hi) { return lo + (hi - lo) * tm_unit(); }

static float tm_f(uint32_t u) { return kg_f32_from_bits(u); }
static double tm_d(uint64_t u) { return kg_f64_from_bits(u); }

/* Bit-identical values of any storage type. */
template <typename S> static bool tm_same_bits(S a, S b) { return memcmp(&a, &b, sizeof a) == 0; }
/* Bit-identical, or both NaN (results of arithmetic). */
static bool tm_same_val(float a, float b) { return (a != a && b != b) || tm_same_bits(a, b); }
static bool tm_same_val(double a, double b) { return (a != a && b != b) || tm_same_bits(a, b); }

static uint64_t tm_bits_of(float x) { return kg_f32_bits(x); }
static uint64_t tm_bits_of(double x) { return kg_f64_bits(x); }
static uint64_t tm_bits_of(uint16_t x) { return x; }

/* Counts a mismatch and prints the first few (what, input bits, got,
 * expected bits) so a failure says where. */
struct tm_mismatch {
    const char *what;
    size_t count;
    explicit tm_mismatch(const char *w) : what(w), count(0) {}
    template <typename I, typename O> void note(I in, O got, O want) {
        if (count++ < 5)
            printf("\n  %s: input 0x%llx gave 0x%llx, CPU 0x%llx", what, (unsigned long long)tm_bits_of(in),
                   (unsigned long long)tm_bits_of(got), (unsigned long long)tm_bits_of(want));
    }
};

/* ---------------------------------------------------------- value pools */

/* Floats: specials, the 16-bit formats' thresholds and ties, a grid, random
 * values and a strided sweep over every bit pattern (both signs, every
 * exponent). */
static std::vector<float> tm_float_pool(void) {
    std::vector<float> v;
    const uint32_t specials[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,             /* +-0, +-inf */
        0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, /* NaNs, quiet and signalling */
        0x7fc12345u, 0x7f802000u, 0xffffffffu, 0x7fffe000u,
        0x7f7fffffu, 0xff7fffffu, 0x00800000u, 0x00000001u, 0x80000001u, /* FLT_MAX, FLT_MIN, denormals */
        0x007fffffu, 0x00400000u, 0x807fffffu,
        0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u, /* 65504 .. 65536 */
        0xc77fefffu, 0xc77ff000u,
        0x33800000u, 0x33000000u, 0x33000001u, 0x32ffffffu, 0x33400000u, /* 2^-24, 2^-25 ... */
        0x38800000u, 0x387fffffu, 0x387fe000u, 0x387ff000u, 0x38000000u, /* around 2^-14 */
        0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0xbf808000u, /* bf16 ties at 1 */
        0x3f801000u, 0x3f803000u, 0x3f801001u,                           /* fp16 ties at 1 */
        0x7f7f8000u, 0x7f7f7fffu,                                        /* bf16 overflow tie */
        0x42a00000u, 0xc2a00000u, 0x42d00000u, 0xc2d00000u, 0x42b17218u, /* 80, 104, ln(FLT_MAX) */
        0x3ecccccdu, 0x3ecccccbu, 0xbecccccdu,                           /* tanh's 0.4 switch */
        0x501502f9u, 0xd01502f9u, 0x2edbe6ffu,                           /* 1e10, -1e10, 1e-10 */
    };
    for (uint32_t u : specials) v.push_back(tm_f(u));
    for (int i = -30 * 64; i <= 30 * 64; i++) v.push_back((float)i / 64.0f);
    tm_seed(11);
    for (int i = 0; i < 20000; i++) v.push_back((float)tm_uniform(-12.0, 12.0));
    for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) v.push_back(tm_f((uint32_t)u));
    return v;
}

/* Floats at and next to every float16 rounding midpoint and every bfloat16
 * one, plus the subnormal/zero boundary: the cases rounding gets wrong. */
static std::vector<float> tm_tie_pool(void) {
    std::vector<float> v;
    for (uint32_t h = 0; h < 0x7c00u; h++) {
        const double lo = kg_f16_value((uint16_t)h);
        const double hi = h == 0x7bffu ? 65536.0 : (double)kg_f16_value((uint16_t)(h + 1));
        const float mid = (float)((lo + hi) / 2); /* 12 significant bits: exact */
        const uint32_t m = kg_f32_bits(mid);
        for (uint32_t u : {m, m - 1u, m + 1u}) {
            v.push_back(tm_f(u));
            v.push_back(tm_f(u | 0x80000000u));
        }
    }
    for (uint32_t b = 0; b < 0x7f80u; b++) {
        const uint32_t m = (b << 16) | 0x8000u;
        for (uint32_t u : {m, m - 1u, m + 1u, b << 16}) {
            v.push_back(tm_f(u));
            v.push_back(tm_f(u | 0x80000000u));
        }
    }
    return v;
}

/* Doubles: specials, float16 / bfloat16 / float midpoints as doubles with
 * nudges far below float precision (a double rounding through float would
 * land on the midpoint and round it to even), random bit patterns, a grid. */
static std::vector<double> tm_double_pool(void) {
    std::vector<double> v;
    const uint64_t specials[] = {
        0x0000000000000000ull, 0x8000000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
        0x7ff8000000000000ull, 0xfff8000000000001ull, 0x7ff0000000000001ull, 0x7ff4000000000000ull,
        0x7ff0000020000000ull, 0xfff7ffffffffffffull, 0x7fefffffffffffffull, 0x0010000000000000ull,
        0x0000000000000001ull, 0x8000000000000001ull,
    };
    for (uint64_t u : specials) v.push_back(tm_d(u));
    const double more[] = {65504.0, 65520.0, 65520.0 - 0x1p-30, 65520.0 + 0x1p-30, 65536.0, 1e300, -1e300,
                           1e-300, 0x1p-25, 0x1p-25 + 0x1p-60, 0x1p-24, 0x1p-14, 0x1p-150, 0x1p-149, 0x1p-126,
                           (double)FLT_MAX, (double)FLT_MAX * (1.0 + 0x1p-25), (double)FLT_MAX * (1.0 + 0x1p-23),
                           1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-8 + 0x1p-30, 1.0 + 0x1p-24 + 0x1p-50};
    for (double d : more) {
        v.push_back(d);
        v.push_back(-d);
    }
    for (uint32_t h = 0; h < 0x7c00u; h += 3) {
        const double lo = kg_f16_value((uint16_t)h);
        const double hi = h == 0x7bffu ? 65536.0 : (double)kg_f16_value((uint16_t)(h + 1));
        const double mid = (lo + hi) / 2;
        for (double d : {mid, mid * (1 + 0x1p-40), mid * (1 - 0x1p-40), mid + 0x1p-70}) {
            v.push_back(d);
            v.push_back(-d);
        }
    }
    for (uint32_t b = 0; b < 0x7f80u; b += 5) {
        const double mid = kg_f32_from_bits((b << 16) | 0x8000u);
        for (double d : {mid, mid * (1 + 0x1p-45), mid * (1 - 0x1p-45)}) {
            v.push_back(d);
            v.push_back(-d);
        }
    }
    tm_seed(23);
    for (int i = 0; i < 20000; i++) {
        /* float midpoints: f + ulp/2, exactly, and nudged */
        const float f = (float)tm_uniform(-1e6, 1e6);
        const double half_ulp = ((double)nextafterf(f, INFINITY) - (double)f) / 2;
        v.push_back((double)f + half_ulp);
        v.push_back((double)f + half_ulp * (1 + 0x1p-40));
    }
    for (int i = 0; i < 200000; i++) v.push_back(tm_d(tm_next()));
    for (int i = -40 * 64; i <= 40 * 64; i++) v.push_back((double)i / 64.0);
    for (int i = 0; i < 20000; i++) v.push_back(tm_uniform(-40.0, 40.0));
    return v;
}

static std::vector<uint16_t> tm_all16(void) {
    std::vector<uint16_t> v(65536);
    for (uint32_t i = 0; i < 65536u; i++) v[i] = (uint16_t)i;
    return v;
}

/* ------------------------------------------------------- 16-bit formats */

static void test_f16_exact(void) {
    /* Absolute facts, independent of the CPU. */
    CU_ASSERT_EQUAL(kg_f16_bits(65504.0f), 0x7bffu);
    CU_ASSERT_EQUAL(kg_f16_bits(tm_f(0x477fefffu)), 0x7bffu); /* just below 65520 */
    CU_ASSERT_EQUAL(kg_f16_bits(65520.0f), 0x7c00u);          /* the tie overflows to inf */
    CU_ASSERT_EQUAL(kg_f16_bits(-65520.0f), 0xfc00u);
    CU_ASSERT_EQUAL(kg_f16_bits(INFINITY), 0x7c00u);
    CU_ASSERT_EQUAL(kg_f16_bits(0x1p-24f), 0x0001u);           /* smallest subnormal */
    CU_ASSERT_EQUAL(kg_f16_bits(0x1p-25f), 0x0000u);           /* tie to even: 0 */
    CU_ASSERT_EQUAL(kg_f16_bits(tm_f(0x33000001u)), 0x0001u); /* just above the tie */
    CU_ASSERT_EQUAL(kg_f16_bits(0x3p-25f), 0x0002u);           /* 1.5 units: tie to even 2 */
    CU_ASSERT_EQUAL(kg_f16_bits(1.0f + 0x1p-11f), 0x3c00u);    /* tie to even */
    CU_ASSERT_EQUAL(kg_f16_bits(1.0f + 0x3p-11f), 0x3c02u);    /* tie to even, upwards */
    CU_ASSERT_EQUAL(kg_f16_bits(-0.0f), 0x8000u);
    CU_ASSERT_EQUAL(kg_f16_bits(tm_f(0x7f800001u)) & 0x7e00u, 0x7e00u); /* sNaN -> quiet NaN, not inf */
    CU_ASSERT(kg_f16_value(0x7c01u) != kg_f16_value(0x7c01u));
    CU_ASSERT_EQUAL(kg_f16_value(0x0001u), 0x1p-24f);
    CU_ASSERT_EQUAL(kg_f16_value(0x7bffu), 65504.0f);

    /* Every float16 -> float, against the CPU. */
    const std::vector<uint16_t> all = tm_all16();
    std::vector<float> ref(all.size());
    kc_f16_to_f32(ref.data(), all.data(), all.size());
    tm_mismatch to32("f16 -> f32");
    for (size_t i = 0; i < all.size(); i++)
        if (!tm_same_bits(kg_f16_value(all[i]), ref[i])) to32.note(all[i], kg_f16_value(all[i]), ref[i]);
    CU_ASSERT_EQUAL(to32.count, (size_t)0);

    /* float -> float16 over the sweep and every midpoint, against the CPU. */
    std::vector<float> xs = tm_float_pool();
    const std::vector<float> ties = tm_tie_pool();
    xs.insert(xs.end(), ties.begin(), ties.end());
    std::vector<uint16_t> h(xs.size());
    kc_f32_to_f16(h.data(), xs.data(), xs.size());
    tm_mismatch to16("f32 -> f16");
    for (size_t i = 0; i < xs.size(); i++)
        if (kg_f16_bits(xs[i]) != h[i]) to16.note(xs[i], kg_f16_bits(xs[i]), h[i]);
    CU_ASSERT_EQUAL(to16.count, (size_t)0);

    /* kg_round_f16 == kc_round_f16 */
    std::vector<float> r = xs;
    kc_round_f16(r.data(), r.size());
    tm_mismatch rnd("round f16");
    for (size_t i = 0; i < xs.size(); i++)
        if (!tm_same_bits(kg_round_f16(xs[i]), r[i])) rnd.note(xs[i], kg_round_f16(xs[i]), r[i]);
    CU_ASSERT_EQUAL(rnd.count, (size_t)0);
    if (to32.count || to16.count || rnd.count) printf("\n");
}

static void test_bf16_exact(void) {
    CU_ASSERT_EQUAL(kg_bf16_bits(1.0f + 0x1p-8f), 0x3f80u);   /* tie to even (down) */
    CU_ASSERT_EQUAL(kg_bf16_bits(tm_f(0x3f818000u)), 0x3f82u); /* tie to even (up) */
    CU_ASSERT_EQUAL(kg_bf16_bits(tm_f(0x3f808001u)), 0x3f81u); /* above the tie */
    CU_ASSERT_EQUAL(kg_bf16_bits(FLT_MAX), 0x7f80u);           /* past the largest bf16: inf */
    CU_ASSERT_EQUAL(kg_bf16_bits(tm_f(0x7f7f7fffu)), 0x7f7fu);
    CU_ASSERT_EQUAL(kg_bf16_bits(tm_f(0x7f800001u)), 0x7fc0u); /* sNaN -> quiet, never inf */
    CU_ASSERT_EQUAL(kg_bf16_bits(tm_f(0xff80ffffu)), 0xffc0u);
    CU_ASSERT_EQUAL(kg_bf16_bits(tm_f(0x00008000u)), 0x0000u); /* subnormal tie to even */
    CU_ASSERT_EQUAL(kg_bf16_value(0x3f80u), 1.0f);

    const std::vector<uint16_t> all = tm_all16();
    std::vector<float> ref(all.size());
    kc_bf16_to_f32(ref.data(), all.data(), all.size());
    tm_mismatch to32("bf16 -> f32");
    for (size_t i = 0; i < all.size(); i++)
        if (!tm_same_bits(kg_bf16_value(all[i]), ref[i])) to32.note(all[i], kg_bf16_value(all[i]), ref[i]);
    CU_ASSERT_EQUAL(to32.count, (size_t)0);

    std::vector<float> xs = tm_float_pool();
    const std::vector<float> ties = tm_tie_pool();
    xs.insert(xs.end(), ties.begin(), ties.end());
    std::vector<uint16_t> b(xs.size());
    kc_f32_to_bf16(b.data(), xs.data(), xs.size());
    tm_mismatch to16("f32 -> bf16");
    for (size_t i = 0; i < xs.size(); i++)
        if (kg_bf16_bits(xs[i]) != b[i]) to16.note(xs[i], kg_bf16_bits(xs[i]), b[i]);
    CU_ASSERT_EQUAL(to16.count, (size_t)0);

    std::vector<float> r = xs;
    kc_round_bf16(r.data(), r.size());
    tm_mismatch rnd("round bf16");
    for (size_t i = 0; i < xs.size(); i++)
        if (!tm_same_bits(kg_round_bf16(xs[i]), r[i])) rnd.note(xs[i], kg_round_bf16(xs[i]), r[i]);
    CU_ASSERT_EQUAL(rnd.count, (size_t)0);
    /* round_to F32 is the identity */
    size_t moved = 0;
    for (float x : xs) moved += !tm_same_bits(kg_round_to_dtype(x, KG_F32), x);
    CU_ASSERT_EQUAL(moved, (size_t)0);
    if (to32.count || to16.count || rnd.count) printf("\n");
}

static void test_f64_single_rounding(void) {
    /* One rounding from double, never two through float. */
    CU_ASSERT_EQUAL(kg_f16_bits_f64(1.0 + 0x1p-11 + 0x1p-40), 0x3c01u);
    CU_ASSERT_EQUAL(kg_f16_bits_f64(1.0 + 0x1p-11), 0x3c00u);
    CU_ASSERT_EQUAL(kg_bf16_bits_f64(1.0 + 0x1p-8 + 0x1p-30), 0x3f81u);
    CU_ASSERT_EQUAL(kg_bf16_bits_f64(1.0 + 0x1p-8), 0x3f80u);
    CU_ASSERT_EQUAL(kg_f16_bits_f64(65520.0), 0x7c00u);
    CU_ASSERT_EQUAL(kg_f16_bits_f64(65520.0 - 0x1p-30), 0x7bffu);
    CU_ASSERT_EQUAL(kg_f16_bits_f64(1e300), 0x7c00u);
    CU_ASSERT_EQUAL(kg_bf16_bits_f64(-1e300), 0xff80u);
    CU_ASSERT_EQUAL(kg_f16_bits_f64(0x1p-25 + 0x1p-60), 0x0001u);
    CU_ASSERT_EQUAL(kg_f16_bits_f64(0x1p-25), 0x0000u);
    CU_ASSERT_EQUAL(kg_f16_bits_f64(-1e-300), 0x8000u);
    CU_ASSERT(kg_f64_to_f32(tm_d(0x7ff0000000000001ull)) != kg_f64_to_f32(tm_d(0x7ff0000000000001ull)));
    CU_ASSERT_EQUAL(kg_f32_bits(kg_f64_to_f32(tm_d(0xfff8000000000000ull))), 0xffc00000u); /* sign kept */
    CU_ASSERT_EQUAL(kg_f64_bits(kg_f32_to_f64(tm_f(0xffc00001u))), 0xfff8000020000000ull);
}

/* dst = kg_convert<D, S>(src) for every element, against kc_cast. */
template <int D, int S> static size_t tm_check_cast(const std::vector<typename kg_storage<S>::type> &src,
                                                    const char *what) {
    typedef typename kg_storage<D>::type DT;
    std::vector<DT> ref(src.size());
    CU_ASSERT_EQUAL(kc_cast(ref.data(), D, src.data(), S, src.size()), 0);
    tm_mismatch mm(what);
    for (size_t i = 0; i < src.size(); i++) {
        const DT got = kg_convert<D, S>(src[i]);
        if (!tm_same_bits(got, ref[i])) mm.note(src[i], got, ref[i]);
    }
    if (mm.count) printf("\n");
    return mm.count;
}

static void test_cast_all_pairs(void) {
    const std::vector<float> f = tm_float_pool();
    const std::vector<double> d = tm_double_pool();
    const std::vector<uint16_t> h = tm_all16();
    CU_ASSERT_EQUAL((tm_check_cast<KG_F32, KG_F64>(d, "f64 -> f32")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_F32, KG_F16>(h, "f16 -> f32")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_F32, KG_BF16>(h, "bf16 -> f32")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_F64, KG_F32>(f, "f32 -> f64")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_F64, KG_F16>(h, "f16 -> f64")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_F64, KG_BF16>(h, "bf16 -> f64")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_F16, KG_F32>(f, "f32 -> f16")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_F16, KG_F64>(d, "f64 -> f16")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_F16, KG_BF16>(h, "bf16 -> f16")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_BF16, KG_F32>(f, "f32 -> bf16")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_BF16, KG_F64>(d, "f64 -> bf16")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_BF16, KG_F16>(h, "f16 -> bf16")), (size_t)0);
}

/* kg_to_double and kg_nonfinite (the reductions' per-element parts). */
static void test_reduce_terms(void) {
    const std::vector<float> f = tm_float_pool();
    const std::vector<double> d = tm_double_pool();
    const std::vector<uint16_t> h = tm_all16();
    size_t bad = 0;
    for (float x : f) {
        bad += kg_nonfinite<KG_F32>(x) != !kc_all_finite(&x, 1);
        bad += !tm_same_val(kg_to_double<KG_F32>(x), (double)x);
    }
    for (double x : d) {
        bad += kg_nonfinite<KG_F64>(x) != !kc_all_finite_f64(&x, 1);
        bad += !tm_same_val(kg_to_double<KG_F64>(x), x);
    }
    std::vector<float> hf(h.size()), bf(h.size());
    kc_f16_to_f32(hf.data(), h.data(), h.size());
    kc_bf16_to_f32(bf.data(), h.data(), h.size());
    for (size_t i = 0; i < h.size(); i++) {
        bad += kg_nonfinite<KG_F16>(h[i]) != !isfinite(hf[i]);
        bad += kg_nonfinite<KG_BF16>(h[i]) != !isfinite(bf[i]);
        bad += !tm_same_val(kg_to_double<KG_F16>(h[i]), (double)hf[i]);
        bad += !tm_same_val(kg_to_double<KG_BF16>(h[i]), (double)bf[i]);
    }
    CU_ASSERT_EQUAL(bad, (size_t)0);
    CU_ASSERT(kg_nonfinite<KG_F16>(0x7c00u) && !kg_nonfinite<KG_F16>(0x7bffu));
    CU_ASSERT(kg_nonfinite<KG_BF16>(0xff81u) && !kg_nonfinite<KG_BF16>(0xff7fu));
}

/* ---------------------------------------------------------- activations */

/* y = act(x) and dx = dy * act'(x) against the CPU kernels, any NaN equal. */
template <int ACT, typename T, typename FWD, typename BWD>
static size_t tm_check_act(const std::vector<T> &x, FWD cpu_fwd, BWD cpu_bwd, const char *what) {
    const size_t n = x.size();
    std::vector<T> y(n), dy(n), dx(n);
    cpu_fwd(y.data(), x.data(), n);
    tm_mismatch mm(what);
    for (size_t i = 0; i < n; i++) {
        const T got = kg_act_fwd<ACT>(x[i]);
        if (!tm_same_val(got, y[i])) mm.note(x[i], got, y[i]);
    }
    tm_seed(5 + ACT);
    for (size_t i = 0; i < n; i++) dy[i] = (T)tm_uniform(-3.0, 3.0);
    dy[0] = (T)INFINITY;
    dy[1] = (T)NAN;
    dy[2] = (T)0.0;
    dy[3] = (T)-0.0;
    cpu_bwd(dx.data(), dy.data(), x.data(), n);
    for (size_t i = 0; i < n; i++) {
        const T got = kg_act_bwd<ACT>(dy[i], x[i]);
        if (!tm_same_val(got, dx[i])) mm.note(x[i], got, dx[i]);
    }
    if (mm.count) printf("\n");
    return mm.count;
}

static void test_act_f32(void) {
    const std::vector<float> x = tm_float_pool();
    CU_ASSERT_EQUAL((tm_check_act<KG_ACT_RELU>(x, kc_relu_forward, kc_relu_backward, "relu f32")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_act<KG_ACT_GELU>(x, kc_gelu_forward, kc_gelu_backward, "gelu f32")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_act<KG_ACT_TANH>(x, kc_tanh_forward, kc_tanh_backward, "tanh f32")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_act<KG_ACT_SIGMOID>(x, kc_sigmoid_forward, kc_sigmoid_backward, "sigmoid f32")),
                    (size_t)0);
    CU_ASSERT_EQUAL(
        (tm_check_act<KG_ACT_LEAKY_RELU>(x, kc_leaky_relu_forward, kc_leaky_relu_backward, "leaky f32")), (size_t)0);
    /* Absolute facts. */
    CU_ASSERT(kg_relu(NAN) != kg_relu(NAN));
    CU_ASSERT_EQUAL(kg_relu_bwd(1.0f, NAN), 0.0f);
    CU_ASSERT_EQUAL(kg_leaky_relu(-1.0f), -0.2f);
    CU_ASSERT_EQUAL(kg_leaky_relu_bwd(2.0f, -1.0f), 2.0f * 0.2f);
    CU_ASSERT_EQUAL(kg_tanh(INFINITY), 1.0f);
    CU_ASSERT_EQUAL(kg_tanh(-INFINITY), -1.0f);
    CU_ASSERT(kg_sigmoid(-100.0f) > 0.0f && kg_sigmoid(-100.0f) < 1e-43f); /* subnormal, not 0 */
    CU_ASSERT(fabsf(kg_gelu(1.0f) - 0.8411920f) < 1e-6f);
    CU_ASSERT(fabsf(kg_tanh(0.3f) - tanhf(0.3f)) < 1e-7f);
}

static void test_act_f64(void) {
    std::vector<double> x = tm_double_pool();
    CU_ASSERT_EQUAL((tm_check_act<KG_ACT_RELU>(x, kc_relu_forward_f64, kc_relu_backward_f64, "relu f64")),
                    (size_t)0);
    CU_ASSERT_EQUAL((tm_check_act<KG_ACT_GELU>(x, kc_gelu_forward_f64, kc_gelu_backward_f64, "gelu f64")),
                    (size_t)0);
    CU_ASSERT_EQUAL((tm_check_act<KG_ACT_TANH>(x, kc_tanh_forward_f64, kc_tanh_backward_f64, "tanh f64")),
                    (size_t)0);
    CU_ASSERT_EQUAL(
        (tm_check_act<KG_ACT_SIGMOID>(x, kc_sigmoid_forward_f64, kc_sigmoid_backward_f64, "sigmoid f64")), (size_t)0);
    CU_ASSERT_EQUAL(
        (tm_check_act<KG_ACT_LEAKY_RELU>(x, kc_leaky_relu_forward_f64, kc_leaky_relu_backward_f64, "leaky f64")),
        (size_t)0);
    CU_ASSERT_EQUAL(kg_leaky_relu(-1.0), -0.2);
    CU_ASSERT(fabs(kg_gelu(1.0) - 0.8411919906082768) < 1e-15);
}

/* ----------------------------------------------------------- BLAS-1 */

static void test_blas1(void) {
    const std::vector<float> xf = tm_float_pool();
    const size_t n = xf.size();
    std::vector<float> yf(n);
    tm_seed(31);
    for (size_t i = 0; i < n; i++) yf[i] = (float)tm_uniform(-4.0, 4.0);
    size_t bad = 0;
    for (double a : {0.1, -3.0, 1e-30, 65536.5, 1e40}) {
        /* The CPU plugin passes (float)a; kg_scalar forms the same. */
        const float af = kg_scalar<float>(a);
        CU_ASSERT_EQUAL(kg_f32_bits(af), kg_f32_bits((float)a));
        std::vector<float> ref = yf;
        kc_axpy(ref.data(), (float)a, xf.data(), n);
        for (size_t i = 0; i < n; i++) bad += !tm_same_val(kg_axpy_elem(yf[i], af, xf[i]), ref[i]);
        ref = xf;
        kc_scale(ref.data(), (float)a, n);
        for (size_t i = 0; i < n; i++) bad += !tm_same_val(xf[i] * af, ref[i]);
    }
    const std::vector<double> xd = tm_double_pool();
    const size_t nd = xd.size();
    std::vector<double> yd(nd);
    for (size_t i = 0; i < nd; i++) yd[i] = tm_uniform(-4.0, 4.0);
    for (double a : {0.1, -3.0, 1e-300}) {
        std::vector<double> ref = yd;
        kc_axpy_f64(ref.data(), a, xd.data(), nd);
        for (size_t i = 0; i < nd; i++) bad += !tm_same_val(kg_axpy_elem(yd[i], kg_scalar<double>(a), xd[i]), ref[i]);
        ref = xd;
        kc_scale_f64(ref.data(), a, nd);
        for (size_t i = 0; i < nd; i++) bad += !tm_same_val(xd[i] * kg_scalar<double>(a), ref[i]);
    }
    CU_ASSERT_EQUAL(bad, (size_t)0);
    /* no fused multiply-add: 1 + 3 * (1/3) rounds the product first */
    const float third = 1.0f / 3.0f;
    CU_ASSERT_EQUAL(kg_axpy_elem(-1.0f, 3.0f, third), 3.0f * third - 1.0f);
}

/* The rounded gemm_ex epilogue c = round(p) + beta * c against kc_gemm_ex
 * on a rank-1 product (K = 1: p[i][j] = a[i] * b[j], exact with b powers of
 * two; kc_gemm_ex rounds the float32 a through rdt first, as autocast's
 * matmul does, so the test does too), with ldc > N and NaN in C where
 * beta == 0 must ignore it. */
static void test_round_add(void) {
    const int M = 64, N = 24, ldc = 29;
    std::vector<float> a(M), b(N), c0((size_t)M * ldc);
    const float specials[] = {65504.0f, 65520.0f, tm_f(0x477fefffu), 1.0f + 0x1p-11f, 1.0f + 0x1p-8f,
                              tm_f(0x3f818000u), 0x1p-25f, 3e38f, -7.0f, 1e-40f, INFINITY, NAN};
    tm_seed(41);
    for (int i = 0; i < M; i++) a[i] = i < 12 ? specials[i] : (float)tm_uniform(-300.0, 300.0);
    for (int j = 0; j < N; j++) b[j] = ldexpf(1.0f, j - N / 2);
    for (auto &v : c0) v = (float)tm_uniform(-100.0, 100.0);
    size_t bad = 0;
    for (int rdt : {KC_F16, KC_BF16}) {
        for (double beta : {0.0, 1.0, 0.5, -2.0}) {
            std::vector<float> cref = c0, cgot = c0;
            if (beta == 0.0)
                for (auto &v : cref) v = NAN;
            const size_t ws_bytes = kc_gemm_ex_workspace(M, N, 1, KC_F32, KC_F32, KC_F32, rdt, beta);
            std::vector<double> ws(ws_bytes / sizeof(double) + 2);
            CU_ASSERT_EQUAL(kc_gemm_ex(0, 0, M, N, 1, 1.0, a.data(), KC_F32, 1, b.data(), KC_F32, N, beta,
                                       cref.data(), KC_F32, ldc, rdt, ws_bytes ? ws.data() : NULL, ws_bytes),
                            0);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    float &cv = cgot[(size_t)i * ldc + j];
                    const float ar = kg_round_to_dtype(a[i], rdt);
                    cv = kg_round_add_elem(ar * b[j], beta == 0.0 ? NAN : cv, (float)beta, rdt);
                    bad += !tm_same_val(cv, cref[(size_t)i * ldc + j]);
                }
        }
    }
    CU_ASSERT_EQUAL(bad, (size_t)0);
    CU_ASSERT_EQUAL(kg_round_add_elem(65520.0f, NAN, 0.0f, KG_F16), INFINITY);
    CU_ASSERT_EQUAL(kg_round_add_elem(1.0f + 0x1p-11f, 2.0f, 0.5f, KG_F16), 2.0f);
    CU_ASSERT_EQUAL(kg_round_add_elem(1.0f + 0x1p-11f, 2.0f, 0.5f, KG_F32), 2.0f + 0x1p-11f);
}

/* ------------------------------------------------- softmax cross-entropy */

/* One row as kg_xent_fwd_kernel computes it, its 256 threads run in turn:
 * strided argmax per lane, tree combination, the NaN rule, lane sums in
 * double combined by kg_block_tree_sum's tree, then the probabilities. */
template <typename T>
static double tm_emu_xent_row(const T *l, int C, int32_t y, T *p, int *correct) {
    enum { L = 256 };
    T smax[L];
    int sarg[L];
    double ssum[L];
    for (int t = 0; t < L; t++) {
        T bv = (T)-INFINITY;
        int bi = C;
        for (int j = t; j < C; j += L)
            if (kg_argmax_take(l[j], j, bv, bi)) {
                bv = l[j];
                bi = j;
            }
        smax[t] = bv;
        sarg[t] = bi;
    }
    for (int h = L / 2; h > 0; h >>= 1)
        for (int t = 0; t < h; t++)
            if (kg_argmax_take(smax[t + h], sarg[t + h], smax[t], sarg[t])) {
                smax[t] = smax[t + h];
                sarg[t] = sarg[t + h];
            }
    T mx = smax[0];
    int arg = sarg[0];
    if (l[0] != l[0]) {
        mx = l[0];
        arg = 0;
    }
    for (int t = 0; t < L; t++) {
        double acc = 0.0;
        for (int j = t; j < C; j += L) acc += (double)kg_xent_exp(l[j] - mx);
        ssum[t] = acc;
    }
    for (int h = L / 2; h > 0; h >>= 1)
        for (int t = 0; t < h; t++) ssum[t] = ssum[t] + ssum[t + h];
    const double denom = ssum[0];
    const T norm = kg_xent_norm<T>(denom);
    for (int j = 0; j < C; j++) p[j] = kg_xent_prob(kg_xent_exp(l[j] - mx), norm);
    if (y < 0 || y >= C) {
        *correct = 0;
        return kg_nan_f64();
    }
    *correct = arg == y;
    return kg_xent_loss(denom, l[y], mx);
}

/* kg_reduce_rows's order: blocks of ceil(B / 256) rows. */
static double tm_emu_mean(const std::vector<double> &row_loss) {
    const size_t B = row_loss.size(), rpb = (B + 255) / 256, nb = (B + rpb - 1) / rpb;
    double total = 0.0;
    for (size_t b = 0; b < nb; b++) {
        double s = 0.0;
        for (size_t r = b * rpb; r < B && r < (b + 1) * rpb; r++) s += row_loss[r];
        total += s;
    }
    return total / (double)B;
}

/* Float ulps between a and b (0 when both NaN, huge across signs). */
static uint64_t tm_ulps(float a, float b) {
    if (a != a || b != b) return (a != a && b != b) ? 0 : UINT64_MAX;
    const int64_t ia = (int32_t)kg_f32_bits(a) < 0 ? -(int64_t)(kg_f32_bits(a) & 0x7fffffffu) : kg_f32_bits(a);
    const int64_t ib = (int32_t)kg_f32_bits(b) < 0 ? -(int64_t)(kg_f32_bits(b) & 0x7fffffffu) : kg_f32_bits(b);
    return (uint64_t)(ia > ib ? ia - ib : ib - ia);
}
static uint64_t tm_ulps(double a, double b) {
    if (a != a || b != b) return (a != a && b != b) ? 0 : UINT64_MAX;
    const uint64_t ua = kg_f64_bits(a), ub = kg_f64_bits(b);
    const int64_t ia = (int64_t)ua < 0 ? -(int64_t)(ua & 0x7fffffffffffffffull) : (int64_t)ua;
    const int64_t ib = (int64_t)ub < 0 ? -(int64_t)(ub & 0x7fffffffffffffffull) : (int64_t)ub;
    return ia > ib ? (uint64_t)(ia - ib) : (uint64_t)(ib - ia);
}

/* Logits (B, C) with ties (the label sometimes at the first maximum,
 * sometimes at a later copy), huge and -inf values, NaN first and later. */
template <typename T> static void tm_make_logits(std::vector<T> &l, std::vector<int32_t> &y, int B, int C) {
    l.resize((size_t)B * C);
    y.resize(B);
    tm_seed(1000 + C);
    for (int r = 0; r < B; r++) {
        T *row = &l[(size_t)r * C];
        for (int j = 0; j < C; j++) row[j] = (T)tm_uniform(-8.0, 8.0);
        y[r] = (int32_t)(tm_next() % (uint64_t)C);
        const int kind = r % 8;
        if (kind == 1 && C > 2) { /* tie: max at j0 and j1 > j0; label at one of them */
            const int j0 = (int)(tm_next() % (uint64_t)(C - 1));
            const int j1 = j0 + 1 + (int)(tm_next() % (uint64_t)(C - 1 - j0));
            row[j0] = row[j1] = (T)20;
            y[r] = (r / 8) % 2 ? j0 : j1;
        } else if (kind == 2) {
            row[y[r]] = (T)1e30; /* huge logit: probabilities 0 and 1, finite loss */
        } else if (kind == 3 && C > 1) {
            row[(y[r] + 1) % C] = (T)-INFINITY;
        } else if (kind == 4) {
            row[0] = (T)NAN; /* NaN first: the CPU's max is NaN, argmax 0 */
        } else if (kind == 5 && C > 1) {
            row[C - 1] = (T)NAN;
        } else if (kind == 6) {
            for (int j = 0; j < C; j++) row[j] = (T)3; /* all equal: argmax 0 */
        } else if (kind == 7) {
            row[y[r]] = (T)-1e30; /* the label's probability underflows to 0 */
        }
    }
}

template <typename T> struct tm_xent_cpu;
template <> struct tm_xent_cpu<float> {
    static double fwd(float *p, const float *l, const int32_t *y, int B, int C, int *nc) {
        return kc_softmax_xent_forward(p, l, y, B, C, nc);
    }
    static void bwd(float *d, const float *p, const int32_t *y, int B, int C, double dloss) {
        kc_softmax_xent_backward(d, p, y, B, C, (float)dloss); /* the plugin's (float)dloss */
    }
};
template <> struct tm_xent_cpu<double> {
    static double fwd(double *p, const double *l, const int32_t *y, int B, int C, int *nc) {
        return kc_softmax_xent_forward_f64(p, l, y, B, C, nc);
    }
    static void bwd(double *d, const double *p, const int32_t *y, int B, int C, double dloss) {
        kc_softmax_xent_backward_f64(d, p, y, B, C, dloss);
    }
};

template <typename T> static void tm_check_xent(int B, int C, bool bad_label, double loss_tol) {
    std::vector<T> l, p_cpu((size_t)B * C), p_emu((size_t)B * C);
    std::vector<int32_t> y;
    tm_make_logits(l, y, B, C);
    /* Rows with a NaN logit make the mean NaN; for a finite mean, drop them
     * unless the label check is what is tested. */
    if (!bad_label)
        for (size_t i = 0; i < l.size(); i++)
            if (l[i] != l[i]) l[i] = (T)0.5;
    if (bad_label) y[B / 2] = C; /* outside [0, C) */
    int nc_cpu = -1;
    const double mean_cpu = tm_xent_cpu<T>::fwd(p_cpu.data(), l.data(), y.data(), B, C, &nc_cpu);
    std::vector<double> row_loss(B);
    int nc_emu = 0;
    for (int r = 0; r < B; r++) {
        int hit;
        row_loss[r] = tm_emu_xent_row(&l[(size_t)r * C], C, y[r], &p_emu[(size_t)r * C], &hit);
        nc_emu += hit;
    }
    const double mean_emu = tm_emu_mean(row_loss);
    CU_ASSERT_EQUAL(nc_emu, nc_cpu);
    if (bad_label) {
        CU_ASSERT(mean_cpu != mean_cpu && mean_emu != mean_emu);
    } else {
        CU_ASSERT(isfinite(mean_cpu));
        CU_ASSERT(fabs(mean_emu - mean_cpu) <= loss_tol * fmax(1.0, fabs(mean_cpu)));
    }
    /* The row sums differ only in order: at most (C - 1) roundings of
     * 2^-53 relative each, in both; float probabilities use the sum only
     * through (float)(1 / denom), so stay within an ulp or so, double ones
     * divide by it. */
    const uint64_t max_ulps = sizeof(T) == sizeof(float) ? 4 : 4 + 2 * (uint64_t)C;
    size_t far = 0;
    for (size_t i = 0; i < p_cpu.size(); i++) far += tm_ulps(p_emu[i], p_cpu[i]) > max_ulps;
    CU_ASSERT_EQUAL(far, (size_t)0);
    if (far || nc_emu != nc_cpu)
        printf("\n  xent B=%d C=%d: %zu probabilities beyond %llu ulp, correct %d vs CPU %d\n", B, C, far,
               (unsigned long long)max_ulps, nc_emu, nc_cpu);

    /* Backward from the CPU's probabilities: bit-exact, bad rows NaN. */
    for (double dloss : {1.0, 0.25, 1.0 / 3.0, 1.0 / 7.0, 0.9, 65536.0}) {
        std::vector<T> d_cpu(p_cpu.size());
        tm_xent_cpu<T>::bwd(d_cpu.data(), p_cpu.data(), y.data(), B, C, dloss);
        const T scale = kg_xent_scale<T>(dloss, B);
        size_t bad = 0;
        for (int r = 0; r < B; r++)
            for (int j = 0; j < C; j++) {
                const size_t i = (size_t)r * C + j;
                const T got = y[r] < 0 || y[r] >= C ? kg_nan<T>() : kg_xent_grad(scale, p_cpu[i], j == y[r]);
                bad += !tm_same_val(got, d_cpu[i]);
            }
        CU_ASSERT_EQUAL(bad, (size_t)0);
    }
}

static void test_xent_f32(void) {
    tm_check_xent<float>(64, 10, false, 1e-6);
    tm_check_xent<float>(300, 7, false, 1e-6);  /* more rows than 256: blocked mean */
    tm_check_xent<float>(20, 1000, false, 1e-6); /* several columns per lane */
    tm_check_xent<float>(9, 1, false, 1e-6);
    tm_check_xent<float>(40, 300, true, 1e-6);
    /* the tie rule: first maximum, whatever lane holds it */
    const float l[5] = {1.0f, 7.0f, 2.0f, 7.0f, 7.0f};
    float p[5];
    int hit;
    tm_emu_xent_row(l, 5, 1, p, &hit);
    CU_ASSERT_EQUAL(hit, 1);
    tm_emu_xent_row(l, 5, 3, p, &hit);
    CU_ASSERT_EQUAL(hit, 0);
    CU_ASSERT(kg_argmax_take(1.0f, 3, 1.0f, 5) && !kg_argmax_take(1.0f, 5, 1.0f, 3) &&
              !kg_argmax_take((float)NAN, 0, -INFINITY, 9));
}

static void test_xent_f64(void) {
    tm_check_xent<double>(64, 10, false, 1e-12);
    tm_check_xent<double>(300, 7, false, 1e-12);
    tm_check_xent<double>(20, 1000, false, 1e-12);
    tm_check_xent<double>(40, 300, true, 1e-12);
}

/* ------------------------------------------------------------ optimizers */

/* Parameters and gradients with a few specials. */
template <typename T> static void tm_make_params(std::vector<T> &p, std::vector<T> &g, size_t n, uint64_t seed) {
    p.resize(n);
    g.resize(n);
    tm_seed(seed);
    for (size_t i = 0; i < n; i++) {
        p[i] = (T)tm_uniform(-1.0, 1.0);
        g[i] = (T)tm_uniform(-0.1, 0.1);
    }
    g[0] = (T)0;
    g[1] = (T)1e-30;
    g[2] = (T)-1e4;
    g[3] = (T)INFINITY;
    g[4] = (T)NAN;
    p[5] = (T)0;
    p[6] = (T)-0.0;
}

template <typename T> static void tm_cpu_sgd(T *p, const T *g, T *buf, size_t n, double lr, double mom, double damp,
                                             int nest, double wd, int first);
template <> void tm_cpu_sgd<float>(float *p, const float *g, float *buf, size_t n, double lr, double mom,
                                   double damp, int nest, double wd, int first) {
    kc_sgd_update(p, g, buf, n, (float)lr, (float)mom, (float)damp, nest, (float)wd, first); /* as the plugin */
}
template <> void tm_cpu_sgd<double>(double *p, const double *g, double *buf, size_t n, double lr, double mom,
                                    double damp, int nest, double wd, int first) {
    kc_sgd_update_f64(p, g, buf, n, lr, mom, damp, nest, wd, first);
}

template <typename T> static size_t tm_check_sgd(void) {
    const size_t n = 2048;
    size_t bad = 0;
    for (int wd_on = 0; wd_on < 2; wd_on++)
        for (double mom : {0.0, 0.9})
            for (double damp : {0.0, 0.1})
                for (int nest = 0; nest < 2; nest++) {
                    std::vector<T> p, g;
                    tm_make_params(p, g, n, 77 + (uint64_t)(wd_on * 8 + nest));
                    std::vector<T> pc = p, bc(n, (T)0), pk = p, bk(n, (T)0);
                    const double wd = wd_on ? 0.01 : 0.0;
                    for (int step = 0; step < 3; step++) {
                        tm_cpu_sgd<T>(pc.data(), g.data(), bc.data(), n, 0.1, mom, damp, nest, wd, step == 0);
                        const kg_sgd_coef<T> c = kg_sgd_make_coef<T>(0.1, mom, damp, nest, wd, step == 0, 1);
                        for (size_t i = 0; i < n; i++) {
                            T bi = c.has_mom && !c.first ? bk[i] : (T)0;
                            kg_sgd_elem(c, &pk[i], g[i], &bi);
                            if (c.has_mom) bk[i] = bi;
                        }
                    }
                    for (size_t i = 0; i < n; i++) bad += !tm_same_val(pk[i], pc[i]) + !tm_same_val(bk[i], bc[i]);
                }
    return bad;
}

static void test_sgd(void) {
    CU_ASSERT_EQUAL(tm_check_sgd<float>(), (size_t)0);
    CU_ASSERT_EQUAL(tm_check_sgd<double>(), (size_t)0);
    /* normalisation: no buffer or momentum 0 means plain SGD */
    const kg_sgd_coef<float> c0 = kg_sgd_make_coef<float>(0.1, 0.9, 0.0, 1, 0.0, 1, 0);
    CU_ASSERT(!c0.has_mom && !c0.first && !c0.nesterov && !c0.has_wd);
    const kg_sgd_coef<float> c1 = kg_sgd_make_coef<float>(0.1, 1e-50, 0.0, 1, 1e-3, 0, 1);
    CU_ASSERT(!c1.has_mom && c1.has_wd); /* 1e-50 is 0 as a float */
    /* hand value: p = 1, g = 0.5, lr 0.1, first step with momentum: p = 0.95 */
    float p = 1.0f, b = 0.0f;
    kg_sgd_elem(kg_sgd_make_coef<float>(0.1, 0.9, 0.0, 0, 0.0, 1, 1), &p, 0.5f, &b);
    CU_ASSERT_EQUAL(b, 0.5f);
    CU_ASSERT_EQUAL(p, 1.0f + -0.1f * 0.5f);
}

template <typename T> static void tm_cpu_adamw(T *p, const T *g, T *m, T *v, size_t n, double lr, double b1,
                                               double b2, double eps, double wd, int64_t step);
template <> void tm_cpu_adamw<float>(float *p, const float *g, float *m, float *v, size_t n, double lr, double b1,
                                     double b2, double eps, double wd, int64_t step) {
    kc_adamw_update_d(p, g, m, v, n, lr, b1, b2, eps, wd, step); /* the plugin's float32 path */
}
template <> void tm_cpu_adamw<double>(double *p, const double *g, double *m, double *v, size_t n, double lr,
                                      double b1, double b2, double eps, double wd, int64_t step) {
    kc_adamw_update_f64(p, g, m, v, n, lr, b1, b2, eps, wd, step);
}

template <typename T> static size_t tm_check_adamw(void) {
    const size_t n = 2048;
    size_t bad = 0;
    struct hp { double lr, b1, b2, eps, wd; int64_t first_step; };
    const hp cases[] = {{1e-3, 0.9, 0.999, 1e-8, 0.01, 1},
                        {3e-4, 0.3, 0.95, 1e-6, 0.0, 1}, /* w1 = 0.7: lerp's large-weight form */
                        {1e-2, 0.9, 0.999, 1e-8, 0.1, 997},
                        {1e-3, 0.9, 0.999, 1e-8, 0.01, 0}}; /* step 0 treated as 1 */
    for (const hp &h : cases) {
        std::vector<T> p, g;
        tm_make_params(p, g, n, 99 + (uint64_t)h.first_step);
        std::vector<T> pc = p, mc(n, (T)0), vc(n, (T)0), pk = p, mk(n, (T)0), vk(n, (T)0);
        for (int64_t s = h.first_step; s < h.first_step + 4; s++) {
            tm_cpu_adamw<T>(pc.data(), g.data(), mc.data(), vc.data(), n, h.lr, h.b1, h.b2, h.eps, h.wd, s);
            const kg_adamw_coef<T> c = kg_adamw_make_coef<T>(h.lr, h.b1, h.b2, h.eps, h.wd, s);
            for (size_t i = 0; i < n; i++) kg_adamw_elem(c, &pk[i], g[i], &mk[i], &vk[i]);
        }
        for (size_t i = 0; i < n; i++)
            bad += !tm_same_val(pk[i], pc[i]) + !tm_same_val(mk[i], mc[i]) + !tm_same_val(vk[i], vc[i]);
    }
    return bad;
}

static void test_adamw(void) {
    CU_ASSERT_EQUAL(tm_check_adamw<float>(), (size_t)0);
    CU_ASSERT_EQUAL(tm_check_adamw<double>(), (size_t)0);
    const kg_adamw_coef<float> c = kg_adamw_make_coef<float>(1e-3, 0.9, 0.999, 1e-8, 0.01, 1);
    CU_ASSERT_EQUAL(c.neg_step, (float)(-(1e-3 / (1.0 - 0.9)))); /* bias correction in double */
    CU_ASSERT_EQUAL(c.c2, (float)(1.0 - 0.999));                   /* not 1 - (float)0.999 */
    CU_ASSERT(!c.big_weight);
    CU_ASSERT(kg_adamw_make_coef<double>(1e-3, 0.3, 0.999, 1e-8, 0.0, 1).big_weight);
    /* first step from zero state: p moves by about lr * sign(g) */
    float p = 1.0f, m = 0.0f, v = 0.0f;
    kg_adamw_elem(kg_adamw_make_coef<float>(1e-3, 0.9, 0.999, 1e-8, 0.0, 1), &p, 0.5f, &m, &v);
    CU_ASSERT(fabsf(p - (1.0f - 1e-3f)) < 1e-6f);
}

/* The compute copy written by the optimizer kernels is kg_convert of the
 * updated parameter; check it on updated values against kc_cast. */
static void test_compute_copy(void) {
    std::vector<float> p, g;
    tm_make_params(p, g, 4096, 5);
    p[7] = 65520.0f;
    p[8] = 1.0f + 0x1p-11f;
    std::vector<double> pd(p.begin(), p.end());
    pd[9] = 1.0 + 0x1p-11 + 0x1p-40;
    CU_ASSERT_EQUAL((tm_check_cast<KG_F16, KG_F32>(p, "compute f16")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_BF16, KG_F32>(p, "compute bf16")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_F16, KG_F64>(pd, "compute f16 from f64")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_BF16, KG_F64>(pd, "compute bf16 from f64")), (size_t)0);
    CU_ASSERT_EQUAL((tm_check_cast<KG_F32, KG_F64>(pd, "compute f32 from f64")), (size_t)0);
    CU_ASSERT_EQUAL((kg_convert<KG_F16, KG_F32>(65520.0f)), 0x7c00u);
    CU_ASSERT_EQUAL((kg_convert<KG_F16, KG_F64>(1.0 + 0x1p-11 + 0x1p-40)), 0x3c01u);
}

/* A list launch's geometry (kg_internal.cuh; kg_adamw_update_list's):
 * every block of the grid belongs to the tensor whose range holds it, each
 * tensor gets the blocks kg_grid gives its own launch, empty tensors none,
 * and the kernel's per-tensor grid-stride loop (block b - first[t], stride
 * the tensor's blocks x KG_THREADS) visits each element exactly once. */
static void test_list_geometry(void) {
    tm_seed(1010);
    std::vector<unsigned> cover;
    for (int trial = 0; trial < 60; trial++) {
        const int count = 1 + (int)(tm_next() % 48);
        size_t n[48];
        unsigned first[49];
        for (int t = 0; t < count; t++) {
            /* empty, a bias, a matrix, or past the 4096-block cap (the loop strides) */
            const uint64_t r = tm_next() % 10;
            n[t] = r == 0   ? 0
                   : r < 4 ? 1 + tm_next() % 300
                   : r < 9 ? 1 + tm_next() % 100000
                           : 1048577 + tm_next() % 500000;
        }
        if (trial == 0) n[0] = 0, n[count - 1] = 0; /* empty at both ends */
        const unsigned blocks = kg_list_blocks(n, count, first);
        CU_ASSERT_EQUAL(first[count], blocks);
        for (int t = 0; t < count; t++) CU_ASSERT_EQUAL(first[t + 1] - first[t], n[t] ? kg_grid(n[t]) : 0u);
        int bad = 0;
        for (unsigned b = 0; b < blocks; b++) {
            const int t = kg_list_owner(first, count, b);
            bad += !(t >= 0 && t < count && first[t] <= b && b < first[t + 1]);
        }
        CU_ASSERT_EQUAL(bad, 0);
        for (int t = 0; t < count && !bad; t++) {
            cover.assign(n[t], 0);
            const size_t nb = first[t + 1] - first[t], stride = nb * KG_THREADS;
            for (size_t blk = 0; blk < nb; blk++)
                for (unsigned tid = 0; tid < KG_THREADS; tid++)
                    for (size_t i = blk * KG_THREADS + tid; i < n[t]; i += stride) cover[i]++;
            size_t wrong = 0;
            for (size_t i = 0; i < n[t]; i++) wrong += cover[i] != 1;
            CU_ASSERT_EQUAL(wrong, (size_t)0);
        }
    }
}

static void register_tests(void) {
    CU_pSuite s = CU_add_suite("cuda_math", NULL, NULL);
    CU_add_test(s, "f16_exact", test_f16_exact);
    CU_add_test(s, "bf16_exact", test_bf16_exact);
    CU_add_test(s, "f64_single_rounding", test_f64_single_rounding);
    CU_add_test(s, "cast_all_pairs", test_cast_all_pairs);
    CU_add_test(s, "reduce_terms", test_reduce_terms);
    CU_add_test(s, "act_f32", test_act_f32);
    CU_add_test(s, "act_f64", test_act_f64);
    CU_add_test(s, "blas1", test_blas1);
    CU_add_test(s, "round_add", test_round_add);
    CU_add_test(s, "xent_f32", test_xent_f32);
    CU_add_test(s, "xent_f64", test_xent_f64);
    CU_add_test(s, "sgd", test_sgd);
    CU_add_test(s, "adamw", test_adamw);
    CU_add_test(s, "compute_copy", test_compute_copy);
    CU_add_test(s, "list_geometry", test_list_geometry);
}

#include "cunit_main.h"
