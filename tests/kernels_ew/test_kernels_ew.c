/*
 * test_kernels_ew.c — the ABI 1.5 elementwise entries of the "cpu"
 * accelerator (lerp, sign, mul, addcmul, addcdiv, sqrt_ex, clamp), loaded
 * through the SDK's test host (kiln/testing.h) as kiln loads it. Each entry, in float32 and
 * float64, at odd lengths (1, 17, 1001) and at one above the kernels'
 * thread split (run with 2 threads), out of place and in place (y = a; y = b
 * where the entry reads b), is compared bit for bit with a reference loop
 * written here from kiln/training.h's formulas (not the kernels' shared
 * header). Also: the edges (NaN kept by sign/clamp/sqrt, -0, infinities,
 * lerp exact at w = 0 and 1), and the refusals: a dtype other than
 * float32/float64, NULL buffers, a y that partly overlaps an input, clamp
 * with lo > hi or a NaN bound — each KILN_E_INVALID_ARG with one line
 * naming the entry.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include <kiln/testing.h>

static kiln_test_host *g_th; /* the SDK's test host: loads the plugin, records set_error */

static const kiln_plugin_desc *g_desc;
static const kiln_accelerator_ops *g_ops;
static kiln_instance *g_acc;
static const kiln_kernels *g_k;

static int suite_init(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return -1;
    const char *dir = getenv("KILN_PLUGIN_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/libkiln-cpu.so", dir ? dir : ".");
    if (kiln_test_load(g_th, path, KILN_KIND_ACCELERATOR, "cpu", &g_desc) != KILN_OK || !g_desc) return -1;
    g_ops = g_desc->ops;
    if (g_ops->base.create(g_desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), NULL, &g_acc) !=
        KILN_OK)
        return -1;
    g_k = g_ops->kernels(g_acc);
    /* two kernel threads, so the longest case is split across the pool */
    if (!g_k || g_ops->configure(g_acc, 2, 0) != KILN_OK) return -1;
    return 0;
}

static int suite_clean(void) {
    if (g_acc) g_ops->base.destroy(g_acc);
    g_acc = NULL;
    kiln_test_host_free(g_th);
    g_th = NULL;
    return 0;
}

enum { OP_LERP, OP_SIGN, OP_MUL, OP_ADDCMUL, OP_ADDCDIV, OP_SQRT, OP_CLAMP, OP_COUNT };
static const char *const g_names[OP_COUNT] = {"lerp", "sign", "mul", "addcmul", "addcdiv", "sqrt_ex", "clamp"};

/* The scalars of the cases: lerp's weight (both of torch.lerp's branches),
 * addcmul/addcdiv's value, clamp's bounds. */
typedef struct ew_case {
    double s0, s1;
} ew_case;

static int32_t call(int op, uint32_t dt, void *y, const void *a, const void *b, ew_case c, size_t n) {
    switch (op) {
    case OP_LERP: return g_k->lerp(g_acc, dt, y, a, b, c.s0, n);
    case OP_SIGN: return g_k->sign(g_acc, dt, y, a, n);
    case OP_MUL: return g_k->mul(g_acc, dt, y, a, b, n);
    case OP_ADDCMUL: return g_k->addcmul(g_acc, dt, y, c.s0, a, b, n);
    case OP_ADDCDIV: return g_k->addcdiv(g_acc, dt, y, c.s0, a, b, n);
    case OP_SQRT: return g_k->sqrt_ex(g_acc, dt, y, a, n);
    default: return g_k->clamp(g_acc, dt, y, a, c.s0, c.s1, n);
    }
}

/* The reference formulas, straight from kiln/training.h, per type. */
static float ref_f32(int op, float y, float a, float b, ew_case c) {
    const float s0 = (float)c.s0, s1 = (float)c.s1;
    switch (op) {
    case OP_LERP: return fabsf(s0) < 0.5f ? a + s0 * (b - a) : b - (b - a) * (1.0f - s0);
    case OP_SIGN: return a > 0 ? 1.0f : a < 0 ? -1.0f : isnan(a) ? a : 0.0f;
    case OP_MUL: return a * b;
    case OP_ADDCMUL: return y + (s0 * a) * b;
    case OP_ADDCDIV: return y + (s0 * a) / b;
    case OP_SQRT: return sqrtf(a);
    default: return a > s1 ? s1 : a < s0 ? s0 : a;
    }
}
static double ref_f64(int op, double y, double a, double b, ew_case c) {
    switch (op) {
    case OP_LERP: return fabs(c.s0) < 0.5 ? a + c.s0 * (b - a) : b - (b - a) * (1.0 - c.s0);
    case OP_SIGN: return a > 0 ? 1.0 : a < 0 ? -1.0 : isnan(a) ? a : 0.0;
    case OP_MUL: return a * b;
    case OP_ADDCMUL: return y + (c.s0 * a) * b;
    case OP_ADDCDIV: return y + (c.s0 * a) / b;
    case OP_SQRT: return sqrt(a);
    default: return a > c.s1 ? c.s1 : a < c.s0 ? c.s0 : a;
    }
}

static uint64_t g_rng = 88172645463325252ull;
static double unif(double lo, double hi) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (double)(g_rng >> 11) * 0x1p-53;
}

static void put(uint32_t dt, void *p, size_t i, double v) {
    if (dt == KILN_DTYPE_F64) ((double *)p)[i] = v;
    else ((float *)p)[i] = (float)v;
}

/* One entry, one dtype, one length, one case: out of place (fresh y from
 * y0), then in place on a (and on b for the entries that read it). */
static void check(int op, uint32_t dt, size_t n, ew_case c) {
    const size_t sz = kiln_dtype_size(dt), bytes = n * sz;
    void *ha = calloc(n, sz), *hb = calloc(n, sz), *hy = calloc(n, sz), *want = calloc(n, sz);
    void *a, *b, *y;
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, bytes, &a), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, bytes, &b), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, bytes, &y), KILN_OK);
    for (size_t i = 0; i < n; i++) {
        /* sqrt: mostly non-negative, with a few negatives (NaN) */
        put(dt, ha, i, op == OP_SQRT ? unif(-0.2, 9) : unif(-3, 3));
        put(dt, hb, i, unif(-3, 3));
        put(dt, hy, i, unif(-1, 1));
    }
    const int binary = op == OP_LERP || op == OP_MUL || op == OP_ADDCMUL || op == OP_ADDCDIV;
    for (int mode = 0; mode < (binary ? 3 : 2); mode++) {
        /* mode 0: y separate; 1: y is a; 2: y is b */
        memcpy(a, ha, bytes), memcpy(b, hb, bytes), memcpy(y, hy, bytes);
        void *out = mode == 0 ? y : mode == 1 ? a : b;
        for (size_t i = 0; i < n; i++) {
            const int f64 = dt == KILN_DTYPE_F64;
            const double yv = f64 ? ((double *)out)[i] : ((float *)out)[i];
            if (f64) ((double *)want)[i] = ref_f64(op, yv, ((double *)ha)[i], ((double *)hb)[i], c);
            else ((float *)want)[i] = ref_f32(op, (float)yv, ((float *)ha)[i], ((float *)hb)[i], c);
        }
        CU_ASSERT_EQUAL(call(op, dt, out, a, b, c, n), KILN_OK);
        if (memcmp(out, want, bytes) != 0) {
            size_t i = 0;
            while (i < n && !memcmp((char *)out + i * sz, (char *)want + i * sz, sz)) i++;
            fprintf(stderr, "\n  %s %s n=%zu mode %d s0=%g: element %zu differs from the reference\n", g_names[op],
                    kiln_dtype_name(dt), n, mode, c.s0, i);
            CU_FAIL("entry differs from the reference loop");
        }
    }
    g_k->free(g_acc, a), g_k->free(g_acc, b), g_k->free(g_acc, y);
    free(ha), free(hb), free(hy), free(want);
}

static void test_against_reference(void) {
    CU_ASSERT_FATAL(g_k->struct_size >= KILN_KERNELS_SIZE_1_5);
    static const size_t sizes[] = {1, 17, 1001, 600001}; /* the last is split across 2 threads */
    static const ew_case lerp_cases[] = {{0.1, 0}, {0.9, 0}, {0.0, 0}, {1.0, 0}, {-0.25, 0}};
    static const ew_case value_cases[] = {{-0.7, 0}, {1.0 / 3.0, 0}};
    static const ew_case clamp_cases[] = {{-1.25, 2.0}, {0.5, 0.5}, {-INFINITY, 0.1}};
    for (int f64 = 0; f64 < 2; f64++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (int op = 0; op < OP_COUNT; op++) {
                const ew_case *cs = op == OP_LERP ? lerp_cases
                                    : op == OP_ADDCMUL || op == OP_ADDCDIV ? value_cases
                                    : op == OP_CLAMP ? clamp_cases
                                                     : value_cases;
                const size_t nc = op == OP_LERP ? 5 : op == OP_CLAMP ? 3 : op == OP_ADDCMUL || op == OP_ADDCDIV ? 2 : 1;
                for (size_t ci = 0; ci < nc; ci++)
                    check(op, f64 ? KILN_DTYPE_F64 : KILN_DTYPE_F32, sizes[si], cs[ci]);
            }
}

/* The values where formulas usually go wrong, in float32 (float64 shares
 * the code path shape and is covered by the reference comparison). */
static void test_edges(void) {
    float x[6] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 1e-40f}, y[6];
    const float nan_neg = -NAN;
    x[0] = nan_neg;
    CU_ASSERT_EQUAL(g_k->sign(g_acc, KILN_DTYPE_F32, y, x, 6), KILN_OK);
    uint32_t u;
    memcpy(&u, &y[0], 4);
    CU_ASSERT_EQUAL(u, 0xffc00000u); /* the NaN comes back as it was, sign and all */
    CU_ASSERT_EQUAL(y[1], 1.0f);
    CU_ASSERT_EQUAL(y[2], -1.0f);
    memcpy(&u, &y[3], 4);
    CU_ASSERT_EQUAL(u, 0u); /* sign(-0) = +0 */
    CU_ASSERT_EQUAL(y[5], 1.0f); /* a subnormal is positive */
    CU_ASSERT_EQUAL(g_k->clamp(g_acc, KILN_DTYPE_F32, y, x, -1.0, 1.0, 6), KILN_OK);
    CU_ASSERT(isnan(y[0]));
    CU_ASSERT_EQUAL(y[1], 1.0f);
    CU_ASSERT_EQUAL(y[2], -1.0f);
    CU_ASSERT(signbit(y[3])); /* -0 stays -0, as the host's old clipping loop kept it */
    CU_ASSERT_EQUAL(g_k->sqrt_ex(g_acc, KILN_DTYPE_F32, y, x, 6), KILN_OK);
    CU_ASSERT(isnan(y[0]) && isinf(y[1]) && isnan(y[2]) && signbit(y[3]));
    /* lerp is exact at both ends, even where b - a rounds */
    double a[2] = {1e300, -3.0}, b[2] = {-1e300, 1e-300}, r[2];
    CU_ASSERT_EQUAL(g_k->lerp(g_acc, KILN_DTYPE_F64, r, a, b, 0.0, 2), KILN_OK);
    CU_ASSERT(r[0] == a[0] && r[1] == a[1]);
    CU_ASSERT_EQUAL(g_k->lerp(g_acc, KILN_DTYPE_F64, r, a, b, 1.0, 2), KILN_OK);
    CU_ASSERT(r[1] == b[1]);
    /* n == 0 touches nothing, NULL buffers included */
    CU_ASSERT_EQUAL(g_k->mul(g_acc, KILN_DTYPE_F32, NULL, NULL, NULL, 0), KILN_OK);
}

static void expect_refusal(int32_t rc, const char *entry, const char *detail) {
    CU_ASSERT_EQUAL(rc, KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), entry));
    if (detail) {
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), detail));
        if (!strstr(kiln_test_error(g_th), detail)) fprintf(stderr, "\n  got: %s\n", kiln_test_error(g_th));
    }
    CU_ASSERT_PTR_NULL(strchr(kiln_test_error(g_th), '\n')); /* one line */
}

static void test_refusals(void) {
    float buf[64] = {0};
    expect_refusal(g_k->lerp(g_acc, KILN_DTYPE_F16, buf, buf, buf, 0.5, 4), "lerp", "float16");
    expect_refusal(g_k->sign(g_acc, KILN_DTYPE_BF16, buf, buf, 4), "sign", "bfloat16");
    expect_refusal(g_k->sqrt_ex(g_acc, 99, buf, buf, 4), "sqrt_ex", "99");
    expect_refusal(g_k->mul(g_acc, KILN_DTYPE_F32, NULL, buf, buf, 4), "mul", "y is NULL");
    expect_refusal(g_k->addcmul(g_acc, KILN_DTYPE_F32, buf, 1.0, buf, NULL, 4), "addcmul", "b is NULL");
    /* y one element past a: each element would read a neighbour already written */
    expect_refusal(g_k->addcdiv(g_acc, KILN_DTYPE_F32, buf + 1, 1.0, buf, buf + 32, 8), "addcdiv", "overlaps a");
    expect_refusal(g_k->lerp(g_acc, KILN_DTYPE_F64, buf + 2, buf + 16, buf, 0.5, 4), "lerp", "overlaps b");
    expect_refusal(g_k->clamp(g_acc, KILN_DTYPE_F32, buf, buf, 1.0, -1.0, 4), "clamp", "lo <= hi");
    expect_refusal(g_k->clamp(g_acc, KILN_DTYPE_F32, buf, buf, NAN, 1.0, 4), "clamp", "lo <= hi");
    /* exact aliasing is allowed */
    CU_ASSERT_EQUAL(g_k->addcmul(g_acc, KILN_DTYPE_F32, buf, 1.0, buf, buf, 8), KILN_OK);
}

static CU_TestInfo cases_kernels_ew[] = {
    {"7 entries x 2 dtypes x 4 lengths, in place, against reference loops", test_against_reference},
    {"edges: NaN, -0, infinities, subnormals, lerp's ends, n = 0", test_edges},
    {"refusals: dtype, NULL, partial overlap, clamp bounds", test_refusals},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    CU_SuiteInfo suites[] = {
        {.pName = "kernels_ew", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_kernels_ew},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
