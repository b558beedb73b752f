/*
 * test_cuda_kernels.c — the "cuda" accelerator plugin (libkiln-cuda.so)
 * checked against the "cpu" one (libkiln-cpu.so), the reference. Both are
 * loaded through the test host as the real host loads them, and every entry
 * of their kiln_kernels tables (ABI 1.1 to 1.5) runs on the same seeded
 * random inputs (sizes that are not multiples of 32, ~1M elements for the
 * reductions and optimizers, GEMMs up to 512x1024x784, plus special values:
 * NaN, infinities, subnormals, rounding ties, fp16 overflow). Inputs go in
 * with copy(H2D) and results come out with synchronize + copy(D2H) on both
 * sides alike, since the cuda plugin's memory is device memory; the scalar
 * outputs (sums, losses, finiteness) are host pointers and the labels are
 * device memory, as modules pass them. Each result is compared under a
 * tolerance derived from how two correct implementations may differ
 * (summation order, libm against CUDA's math library, tensor-core
 * accumulation; see "Tolerances" below); results of single IEEE operations
 * (bias add, scale, ReLU, casts, rounding) must agree exactly. Also checked:
 * memory is zero-filled and 64-byte aligned, D2D copies, zero and free(NULL),
 * KILN_E_DATA for an out-of-range label on both, and that the tolerances
 * themselves reject TF32-class GEMM error. Without the cuda plugin or without
 * a usable GPU the program prints one line saying why and exits 77, which
 * CTest reports as skipped; the cpu plugin failing to load is a failure.
 */

/*
 * Environment:
 *   KILN_PLUGIN_DIR          the plugin build directory (CTest sets it)
 *   KILN_GPU_TEST_ACCEL=NAME test libkiln-NAME.so (plugin NAME) instead of
 *                            "cuda". KILN_GPU_TEST_ACCEL=cpu compares the
 *                            reference with itself: every comparison must
 *                            pass, which checks this file's plumbing and
 *                            tolerance arithmetic on a machine without a GPU.
 *   KILN_GPU_TEST_REQUIRE=1  a missing plugin or GPU fails (exit 1) instead
 *                            of skipping, for GPU runs that must not pass
 *                            vacuously.
 *   KILN_GPU_TEST_ATTENTION=rowwise  the device under test's `attention`
 *                            key (default: the plugin's default, gemm).
 *   KILN_GPU_TEST_ONLY=TEXT only the cases whose name contains TEXT (the
 *                            rowwise runs take the attention case alone: the
 *                            `attention` key changes nothing else).
 *   KILN_GPU_TEST_VERBOSE=1  one line per comparison: its worst error as a
 *                            fraction of the tolerance (the margin).
 *
 * Tolerances (u32 = 2^-24, u64 = 2^-53, the unit roundoffs):
 *  - Exact. cast, round_to: the same bits (a NaN only has to be a NaN:
 *    CUDA's conversions return a canonical NaN). bias_add, scale, ReLU,
 *    leaky ReLU, all_finite, n_correct, untouched GEMM padding: equal values
 *    (+0 == -0). Each of these results is one correctly rounded IEEE
 *    operation or none, so any two correct implementations agree.
 *  - Sums (GEMM, bias_grad, softmax's row sums, sum, sumsq). Any order of
 *    summing n terms errs by at most (n-1)u * sum|terms| (Higham, Accuracy
 *    and Stability of Numerical Algorithms, 3.1), so two orders differ by at
 *    most 2(n+4)u * sum|terms| per element, the +4 covering alpha, beta and
 *    the final roundings. That bound cannot fail a correct implementation
 *    but grows like n*u while real errors grow like sqrt(n)*u: it would not
 *    notice TF32 (10-bit mantissa) products in an fp32 GEMM, nor one row
 *    dropped from a 4099-row bias_grad. So GEMM and bias_grad also check
 *    the norm-wise error rms(gpu - cpu) / rms(that bound's scale) <= 16 u.
 *    Measured on these inputs against an exact sum: OpenBLAS and sequential
 *    fp32 give 0.05-0.4 u32 for K = 33..20000, sequential round-toward-zero
 *    3-80 u32, TF32 inputs 40-1000 u32 (210 u32 at K = 784).
 *  - Tensor cores (GEMMs whose operands are all 16-bit values): products are
 *    exact in fp32 but accumulation may truncate (Fasi et al., "Numerical
 *    behavior of NVIDIA tensor cores", PeerJ CS 2021), so u = 2^-23 in the
 *    bound and 64 u32 in the norm-wise check.
 *  - 16-bit outputs (gemm_ex round_dtype F16/BF16). Each side rounds its own
 *    fp32 product to nearest, within half an ulp of the 16-bit format, so
 *    |gpu - cpu| <= product bound + ulp16(gpu)/2 + ulp16(cpu)/2: one ulp of
 *    the 16-bit format where the two sums straddle a rounding boundary.
 *  - Elementwise math (GELU, tanh, sigmoid, softmax's exp and log, AdamW's
 *    sqrt and divide). CUDA's expf/tanhf are within 2 ulp and the CPU's
 *    inlined exp within a few, so 1e-6 relative (8.4 u32) in fp32; fp64
 *    libm against CUDA, a few ulp each: 1e-13. Relative to |cpu| plus a
 *    floor where a legitimate formula cancels (0.5x(1 + tanh u) for GELU,
 *    1 - tanh^2 for tanh', s(1 - s) for sigmoid'), of the size of the terms
 *    that cancel; sigmoid's tails (down to subnormals) are relative, with a
 *    floor just above FLT_MIN for flush-to-zero differences. Plain
 *    arithmetic (axpy): 1e-6 in fp32 (covers a fused multiply-add), 1e-15
 *    in fp64.
 *  - Optimizers: about ten rounded operations per element per step whose
 *    errors carry into the next step, so 4e-6 * step in fp32 and
 *    1e-13 * step in fp64, relative to |p| plus the updates so far.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include <kiln/testing.h>

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

#define U32 0x1p-24
#define U23 0x1p-23
#define U64 0x1p-53
#define RTOL_F32 1e-6       /* fp32 elementwise math, see above        */
#define RTOL_F64 1e-13      /* fp64 elementwise math                   */
#define RTOL_F64_ARITH 1e-15 /* fp64 plain arithmetic (FMA or not)     */
#define RTOL_OPT_F32 4e-6   /* fp32 optimizer step, times the step     */
#define NORM_LIMIT 16.0     /* norm-wise sum error, in units of u      */
#define TINY_F32 1e-37      /* absolute floor: flush-to-zero of fp32   */
#define TINY_F64 1e-300     /* and of fp64                             */

/* ================================================================ sides */

/* One accelerator instance and the device buffers of the current block.
 * `failed` is set by the first failing call of a block, after which the
 * block's remaining calls are skipped (so one failure is one message). */
#define MAX_LIVE 32
typedef struct side {
    const char *name;
    const kiln_plugin_desc *desc;
    const kiln_accelerator_ops *ops;
    kiln_instance *acc;
    const kiln_kernels *k;
    int failed;
    void *live[MAX_LIVE];
    int nlive;
} side;

enum { REF = 0, DUT = 1 }; /* the cpu reference; the device under test */
static side g_side[2];
static int g_verbose;
static int g_quiet; /* the self-check's deliberate failures print nothing */

/* The reference is host memory (checked at setup), so input preparation
 * calls its kernels on host buffers directly. */
#define RK (g_side[REF].k)
#define RACC (g_side[REF].acc)

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "test_cuda_kernels: out of host memory (%zu x %zu bytes)\n", n, size);
        exit(2);
    }
    return p;
}

static side *begin(int s) {
    side *S = &g_side[s];
    S->failed = 0;
    S->nlive = 0;
    return S;
}

/* Frees the block's buffers; 1 when every call of the block succeeded. */
static int end(side *S) {
    for (int i = 0; i < S->nlive; i++) S->k->free(S->acc, S->live[i]);
    S->nlive = 0;
    return !S->failed;
}

/* Reports a failed call once per block, with the plugin's message. */
static int step_ok(side *S, int32_t rc, const char *expr, unsigned line) {
    if (rc != KILN_OK && !S->failed) {
        fprintf(stderr, "  [%s] line %u: %s\n    -> %s (%d): %s\n", S->name, line, expr, kiln_status_name(rc),
                (int)rc, kiln_test_error(g_th));
        S->failed = 1;
    }
    CU_assertImplementation(rc == KILN_OK ? CU_TRUE : CU_FALSE, line, expr, __FILE__, "", CU_FALSE);
    return rc == KILN_OK;
}

/* RUN(S, call): the kernel call, unless an earlier call of the block failed
 * (the test host's last message is cleared first, so a report shows this
 * call's message or none). */
#define RUN(S, call) step_ok((S), (S)->failed ? KILN_OK : (kiln_test_clear_error(g_th), (call)), #call, __LINE__)

/* A copy of host(bytes) in S's memory, zero-filled when host is NULL; freed
 * by end(). NULL once the block has failed. */
static void *up(side *S, const void *host, size_t bytes) {
    void *p = NULL;
    if (S->failed) return NULL;
    if (S->nlive == MAX_LIVE) {
        fprintf(stderr, "  [%s] more than %d buffers in one block\n", S->name, MAX_LIVE);
        S->failed = 1;
        CU_FAIL("too many buffers in one block");
        return NULL;
    }
    if (!RUN(S, S->k->alloc(S->acc, bytes, &p))) return NULL;
    S->live[S->nlive++] = p;
    if (host && bytes) RUN(S, S->k->copy(S->acc, p, host, bytes, KILN_COPY_H2D));
    return S->failed ? NULL : p;
}

/* host(bytes) = dev(bytes) once every queued kernel has finished (the copy
 * may be queued as well, hence the second synchronize). */
static void down(side *S, void *host, const void *dev, size_t bytes) {
    RUN(S, S->k->synchronize(S->acc));
    RUN(S, S->k->copy(S->acc, host, dev, bytes, KILN_COPY_D2H));
    RUN(S, S->k->synchronize(S->acc));
}

/* ============================================================ inputs */

static uint64_t g_rng;
static void seed(uint64_t s) { g_rng = s * 0x9E3779B97F4A7C15ull + 12345u; }
static uint64_t next_u64(void) { /* splitmix64 */
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [lo, hi) */
static double unif(double lo, double hi) { return lo + (hi - lo) * (double)(next_u64() >> 11) * 0x1p-53; }

static float *rand_f32(size_t n, double lo, double hi) {
    float *x = xcalloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)unif(lo, hi);
    return x;
}
static double *rand_f64(size_t n, double lo, double hi) {
    double *x = xcalloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = unif(lo, hi);
    return x;
}
/* the same values as doubles */
static double *widen(const float *x, size_t n) {
    double *d = xcalloc(n, sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static double f16_value(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}
static double bf16_value(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static int is_nan16(uint32_t dt, uint16_t h) {
    return dt == KILN_DTYPE_F16 ? (h & 0x7C00) == 0x7C00 && (h & 0x03FF) : (h & 0x7F80) == 0x7F80 && (h & 0x007F);
}

/* element i of p, dtype dt, as a double */
static double elem(uint32_t dt, const void *p, size_t i) {
    switch (dt) {
    case KILN_DTYPE_F32: return ((const float *)p)[i];
    case KILN_DTYPE_F64: return ((const double *)p)[i];
    case KILN_DTYPE_F16: return f16_value(((const uint16_t *)p)[i]);
    case KILN_DTYPE_BF16: return bf16_value(((const uint16_t *)p)[i]);
    default: return NAN;
    }
}

/* The spacing of the 16-bit format dt at |x| (its subnormal spacing below
 * the normal range, its top binade's spacing beyond the largest finite). */
static double ulp16(double x, uint32_t dt) {
    const int p = dt == KILN_DTYPE_F16 ? 11 : 8;            /* significand bits */
    const int emin = dt == KILN_DTYPE_F16 ? -14 : -126;    /* smallest normal exponent */
    const int emax = dt == KILN_DTYPE_F16 ? 15 : 127;
    int e;
    x = fabs(x);
    if (!(x > 0) || isinf(x)) e = isinf(x) ? emax : emin;
    else {
        (void)frexp(x, &e); /* x = f 2^e, f in [0.5, 1) */
        e -= 1;
        if (e < emin) e = emin;
        if (e > emax) e = emax;
    }
    return ldexp(1.0, e - (p - 1));
}

/* ======================================================== comparisons */

static void vreport(int ok, double worst, const char *fmt, va_list ap) {
    if (g_quiet || (ok && !g_verbose)) return;
    char what[256];
    vsnprintf(what, sizeof what, fmt, ap);
    printf("  %-4s %-78s worst %.3g of tol\n", ok ? "ok" : "FAIL", what, worst);
}

/*
 * got(n) from the device under test against want(n) from the reference, both
 * of dtype dt: |got - want| <= tol[i] (tol NULL: equal values, +0 == -0).
 * Non-finite values must agree exactly (NaN with NaN, inf with the same
 * inf). Prints the first few disagreements; returns 1 when all agree.
 */
static int cmp_tol(uint32_t dt, const void *want, const void *got, size_t n, const double *tol, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int cmp_tol(uint32_t dt, const void *want, const void *got, size_t n, const double *tol, const char *fmt, ...) {
    size_t bad = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double w = elem(dt, want, i), g = elem(dt, got, i), t = tol ? tol[i] : 0.0;
        int ok;
        double r = 0.0;
        if (isnan(w) || isnan(g)) ok = isnan(w) && isnan(g), r = ok ? 0.0 : INFINITY;
        else if (isinf(w) || isinf(g)) ok = w == g, r = ok ? 0.0 : INFINITY;
        else {
            const double d = fabs(g - w);
            ok = d <= t;
            r = d == 0 ? 0.0 : t > 0 ? d / t : INFINITY;
        }
        if (r > worst) worst = r;
        if (!ok) {
            if (bad < 4 && !g_quiet) {
                va_list ap;
                char what[256];
                va_start(ap, fmt);
                vsnprintf(what, sizeof what, fmt, ap);
                va_end(ap);
                fprintf(stderr, "  %s: [%zu] got %.9g, want %.9g (|diff| %.3g, tol %.3g)\n", what, i, g, w,
                        fabs(g - w), t);
            }
            bad++;
        }
    }
    va_list ap;
    va_start(ap, fmt);
    vreport(bad == 0, worst, fmt, ap);
    va_end(ap);
    if (bad && !g_quiet) fprintf(stderr, "    %zu of %zu values out of tolerance\n", bad, n);
    return bad == 0;
}

/* The same bits (a 16-bit or wider pattern), except that any NaN matches any
 * NaN: for cast and round_to. */
static int cmp_bits(uint32_t dt, const void *want, const void *got, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int cmp_bits(uint32_t dt, const void *want, const void *got, size_t n, const char *fmt, ...) {
    const size_t sz = kiln_dtype_size(dt);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const void *w = (const char *)want + i * sz, *g = (const char *)got + i * sz;
        int ok;
        if (sz == 2) {
            uint16_t a, b;
            memcpy(&a, w, 2), memcpy(&b, g, 2);
            ok = a == b || (is_nan16(dt, a) && is_nan16(dt, b));
        } else {
            const double a = elem(dt, want, i), b = elem(dt, got, i);
            ok = !memcmp(w, g, sz) || (isnan(a) && isnan(b));
        }
        if (!ok) {
            if (bad < 4 && !g_quiet) {
                va_list ap;
                char what[256];
                va_start(ap, fmt);
                vsnprintf(what, sizeof what, fmt, ap);
                va_end(ap);
                uint64_t bw = 0, bg = 0;
                memcpy(&bw, w, sz), memcpy(&bg, g, sz);
                fprintf(stderr, "  %s: [%zu] got %.9g (0x%llx), want %.9g (0x%llx)\n", what, i, elem(dt, got, i),
                        (unsigned long long)bg, elem(dt, want, i), (unsigned long long)bw);
            }
            bad++;
        }
    }
    va_list ap;
    va_start(ap, fmt);
    vreport(bad == 0, bad ? INFINITY : 0.0, fmt, ap);
    va_end(ap);
    if (bad && !g_quiet) fprintf(stderr, "    %zu of %zu values differ\n", bad, n);
    return bad == 0;
}

/* Norm-wise: rms(got - want) / rms(scale) <= limit, over the finite pairs
 * (the elementwise check has already matched the non-finite ones). */
static int cmp_norm(uint32_t dt, const void *want, const void *got, size_t n, const double *scale, double limit,
                    const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int cmp_norm(uint32_t dt, const void *want, const void *got, size_t n, const double *scale, double limit,
                    const char *fmt, ...) {
    double sd = 0.0, ss = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double w = elem(dt, want, i), g = elem(dt, got, i);
        if (!isfinite(w) || !isfinite(g)) continue;
        sd += (g - w) * (g - w);
        ss += scale[i] * scale[i];
    }
    const double ratio = ss > 0 ? sqrt(sd / ss) : (sd > 0 ? INFINITY : 0.0);
    const int ok = ratio <= limit;
    va_list ap;
    va_start(ap, fmt);
    if (!ok && !g_quiet) {
        char what[256];
        va_list aq;
        va_copy(aq, ap);
        vsnprintf(what, sizeof what, fmt, aq);
        va_end(aq);
        fprintf(stderr, "  %s: norm-wise error %.3g exceeds %.3g\n", what, ratio, limit);
    }
    vreport(ok, limit > 0 ? ratio / limit : ratio, fmt, ap);
    va_end(ap);
    return ok;
}

/* A scalar: |got - want| <= tol, non-finite values equal. */
static int cmp_scalar(double want, double got, double tol, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int cmp_scalar(double want, double got, double tol, const char *fmt, ...) {
    int ok;
    double r;
    if (isnan(want) || isnan(got)) ok = isnan(want) && isnan(got), r = ok ? 0 : INFINITY;
    else if (isinf(want) || isinf(got)) ok = want == got, r = ok ? 0 : INFINITY;
    else ok = fabs(got - want) <= tol, r = fabs(got - want) == 0 ? 0 : tol > 0 ? fabs(got - want) / tol : INFINITY;
    va_list ap;
    va_start(ap, fmt);
    if (!ok && !g_quiet) {
        char what[256];
        va_list aq;
        va_copy(aq, ap);
        vsnprintf(what, sizeof what, fmt, aq);
        va_end(aq);
        fprintf(stderr, "  %s: got %.17g, want %.17g (tol %.3g)\n", what, got, want, tol);
    }
    vreport(ok, r, fmt, ap);
    va_end(ap);
    return ok;
}

/* ============================================================== table */

static void test_table(void) {
    for (int s = 0; s < 2; s++) {
        const side *S = &g_side[s];
        CU_ASSERT_TRUE(S->k->struct_size >= KILN_KERNELS_SIZE_1_3);
        /* every function pointer from alloc up to struct_size is set */
        typedef void (*any_fn)(void);
        int n = 0, null = 0;
        for (size_t off = offsetof(kiln_kernels, alloc); off + sizeof(any_fn) <= S->k->struct_size;
             off += sizeof(any_fn), n++) {
            any_fn f;
            memcpy(&f, (const char *)S->k + off, sizeof f);
            if (!f) fprintf(stderr, "  [%s] kernel table entry at offset %zu is NULL\n", S->name, off), null++;
        }
        CU_ASSERT_EQUAL(null, 0);
        CU_ASSERT_TRUE(n >= 46); /* 21 entries of 1.1 + 15 of 1.2 + 2 of 1.3 + 8 of 1.4 */
    }
    /* The cuda plugin's memory is device memory; a plugin named "cuda" says
     * so in its properties. */
    if (!strcmp(g_side[DUT].name, "cuda")) {
        CU_ASSERT_FALSE(g_side[DUT].k->flags & KILN_KERNELS_HOST_MEMORY);
        CU_ASSERT_STRING_EQUAL(kiln_kv_str(g_side[DUT].desc->properties, "device_type", ""), "cuda");
    }
}

/* ============================================================= memory */

static void test_memory(void) {
    static const size_t sizes[] = {1, 63, 4097, (1u << 20) + 3};
    unsigned char *host = xcalloc((1u << 20) + 64, 1);
    for (int s = 0; s < 2; s++) {
        side *S = begin(s);
        /* zero-filled and 64-byte aligned, whatever the size */
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            unsigned char *p = up(S, NULL, sizes[i]);
            if (!p) break;
            CU_ASSERT_EQUAL((uintptr_t)p % 64, 0);
            memset(host, 0x5A, sizes[i]);
            down(S, host, p, sizes[i]);
            size_t nonzero = 0;
            for (size_t j = 0; j < sizes[i]; j++) nonzero += host[j] != 0;
            if (nonzero) fprintf(stderr, "  [%s] alloc(%zu): %zu bytes not zero\n", S->name, sizes[i], nonzero);
            CU_ASSERT_EQUAL(nonzero, 0);
        }
        end(S);
        /* memory that was dirtied and freed comes back zeroed */
        for (int round = 0; round < 3 && !S->failed; round++) {
            begin(s);
            memset(host, 0xAB, 1u << 20);
            (void)up(S, host, 1u << 20);
            end(S);
            begin(s);
            unsigned char *p = up(S, NULL, 1u << 20);
            if (p) {
                memset(host, 0x5A, 1u << 20);
                down(S, host, p, 1u << 20);
                size_t nonzero = 0;
                for (size_t j = 0; j < (1u << 20); j++) nonzero += host[j] != 0;
                CU_ASSERT_EQUAL(nonzero, 0);
            }
            end(S);
        }
        /* H2D, D2D (whole and a partial copy between offsets), D2H, zero */
        begin(s);
        enum { N = 1031 };
        seed(1);
        float *h = rand_f32(N, -1, 1), back[N], want[N];
        float *d1 = up(S, h, sizeof(float) * N), *d2 = up(S, NULL, sizeof(float) * N);
        if (d1 && d2) {
            RUN(S, S->k->copy(S->acc, d2, d1, sizeof(float) * N, KILN_COPY_D2D));
            down(S, back, d2, sizeof back);
            CU_ASSERT_EQUAL(memcmp(back, h, sizeof back), 0);
            RUN(S, S->k->copy(S->acc, d2 + 5, d1 + 100, 300 * sizeof(float), KILN_COPY_D2D));
            down(S, back, d2, sizeof back);
            memcpy(want, h, sizeof want);
            memcpy(want + 5, h + 100, 300 * sizeof(float));
            CU_ASSERT_EQUAL(memcmp(back, want, sizeof back), 0);
            RUN(S, S->k->zero(S->acc, d1 + 7, 500 * sizeof(float)));
            down(S, back, d1, sizeof back);
            memcpy(want, h, sizeof want);
            memset(want + 7, 0, 500 * sizeof(float));
            CU_ASSERT_EQUAL(memcmp(back, want, sizeof back), 0);
        }
        CU_ASSERT_TRUE(end(S));
        free(h);
        S->k->free(S->acc, NULL); /* a no-op */
    }
    free(host);
}

/* =============================================================== GEMM */

/* One GEMM: C(M,N; ldc) = alpha op(A) op(B) + beta C. The 1.1 gemm when
 * entry11, else gemm_ex. A and B are stored as a_dt / b_dt holding values
 * representable in a_grid / b_grid (F32 storage may hold 16-bit values).
 * Leading dimensions are wider than the rows (A +3, B +5, C +7) unless
 * `packed` (a kernel may take another path for packed C). */
typedef struct gemm_case {
    int M, N, K, ta, tb, entry11;
    uint32_t a_dt, a_grid, b_dt, b_grid, c_dt, round;
    double alpha, beta;
    int packed;
} gemm_case;

static void gemm_lds(const gemm_case *g, int *lda, int *ldb, int *ldc) {
    const int pad = !g->packed;
    *lda = (g->ta ? g->M : g->K) + 3 * pad;
    *ldb = (g->tb ? g->K : g->N) + 5 * pad;
    *ldc = g->N + 7 * pad;
}

/* A stored (rows, ld) operand with `cols` used columns: uniform [-1, 1)
 * values on the grid of `grid`, NaN in the padding (a kernel that reads it
 * poisons its result). *absv: |values| in the accumulation type (float, or
 * double for F64), the same layout, for the error bound. */
static void *make_operand(int rows, int cols, int ld, uint32_t st, uint32_t grid, void **absv) {
    const size_t n = (size_t)rows * (size_t)ld;
    if (st == KILN_DTYPE_F64) {
        double *v = xcalloc(n, sizeof *v), *a = xcalloc(n, sizeof *a);
        for (size_t i = 0; i < n; i++) {
            v[i] = (int)(i % (size_t)ld) < cols ? unif(-1, 1) : NAN;
            a[i] = fabs(v[i]);
        }
        *absv = a;
        return v;
    }
    float *v = rand_f32(n, -1, 1), *a = xcalloc(n, sizeof *a);
    if (grid != KILN_DTYPE_F32) RK->round_to(RACC, v, grid, n);
    for (size_t i = 0; i < n; i++) {
        if ((int)(i % (size_t)ld) >= cols) v[i] = NAN;
        a[i] = fabsf(v[i]);
    }
    *absv = a;
    if (st == KILN_DTYPE_F32) return v;
    uint16_t *h = xcalloc(n, sizeof *h);
    RK->cast(RACC, h, st, v, KILN_DTYPE_F32, n); /* exact: the values are on the grid */
    free(v);
    return h;
}

/* Compares a GEMM's result got(M, ldc) with want (see "Tolerances"): the
 * elementwise bound, the padding columns untouched, the norm-wise error
 * (unrounded results), and 16-bit representability of rounded ones.
 * S(M, N): |A| |B|, C0(M, ldc): C before the call. */
static int check_gemm(const gemm_case *g, const void *C0, const void *want, const void *got, const double *S,
                      const char *label) {
    int lda, ldb, ldc;
    gemm_lds(g, &lda, &ldb, &ldc);
    const size_t nc = (size_t)g->M * (size_t)ldc;
    const uint32_t dt = g->c_dt;
    const int rounded = dt == KILN_DTYPE_F32 && (g->round == KILN_DTYPE_F16 || g->round == KILN_DTYPE_BF16);
    const int sixteen = g->a_grid != KILN_DTYPE_F32 && g->a_grid != KILN_DTYPE_F64 &&
                        g->b_grid != KILN_DTYPE_F32 && g->b_grid != KILN_DTYPE_F64;
    const double u = dt == KILN_DTYPE_F64 ? U64 : sixteen ? U23 : U32;
    const double rtol = 2.0 * (g->K + 4) * u;
    double *tol = xcalloc(nc, sizeof *tol), *scale = xcalloc(nc, sizeof *scale);
    for (int i = 0; i < g->M; i++)
        for (int j = 0; j < g->N; j++) { /* padding: tol 0, scale 0 */
            const size_t ix = (size_t)i * ldc + j;
            const double bc = g->beta != 0 ? g->beta * elem(dt, C0, ix) : 0.0;
            const double sc = fabs(g->alpha) * S[(size_t)i * g->N + j] + fabs(bc);
            double t = rtol * sc;
            if (rounded) {
                const double w = elem(dt, want, ix), v = elem(dt, got, ix);
                /* upper estimates of each side's rounded product */
                const double rw = fabs(w - bc) + 0x1p-22 * (fabs(w) + fabs(bc));
                const double rv = fabs(v - bc) + 0x1p-22 * (fabs(v) + fabs(bc));
                t += 0.5 * ulp16(rw, g->round) + 0.5 * ulp16(rv, g->round);
                if (g->beta != 0) t += U23 * (fabs(w) + fabs(v) + 2 * fabs(bc));
            }
            tol[ix] = t;
            scale[ix] = sc;
        }
    int ok = cmp_tol(dt, want, got, nc, tol, "%s", label);
    if (g->beta == 0) { /* C was NaN and must not have been read: the reference is finite */
        size_t nonfinite = 0;
        for (int i = 0; i < g->M; i++)
            for (int j = 0; j < g->N; j++) nonfinite += !isfinite(elem(dt, want, (size_t)i * ldc + j));
        if (nonfinite && !g_quiet) fprintf(stderr, "  %s: %zu non-finite reference values\n", label, nonfinite);
        ok &= nonfinite == 0;
    }
    if (!rounded) {
        const double limit = dt == KILN_DTYPE_F64 ? NORM_LIMIT * U64
                             : sixteen            ? 4 * NORM_LIMIT * U32
                                                  : NORM_LIMIT * U32;
        ok &= cmp_norm(dt, want, got, nc, scale, limit, "%s norm-wise", label);
    } else if (g->beta == 0) {
        /* the result is the rounded product itself: representable */
        float *r = xcalloc((size_t)g->M * g->N, sizeof *r), *r0 = xcalloc((size_t)g->M * g->N, sizeof *r0);
        for (int i = 0; i < g->M; i++)
            for (int j = 0; j < g->N; j++) r[(size_t)i * g->N + j] = ((const float *)got)[(size_t)i * ldc + j];
        memcpy(r0, r, sizeof *r * (size_t)g->M * g->N);
        RK->round_to(RACC, r, g->round, (size_t)g->M * g->N);
        ok &= cmp_tol(KILN_DTYPE_F32, r, r0, (size_t)g->M * g->N, NULL, "%s representable in %s", label,
                      kiln_dtype_name(g->round));
        free(r), free(r0);
    }
    free(tol), free(scale);
    return ok;
}

static void run_gemm_case(const gemm_case *g) {
    const int a_rows = g->ta ? g->K : g->M, a_cols = g->ta ? g->M : g->K;
    const int b_rows = g->tb ? g->N : g->K, b_cols = g->tb ? g->K : g->N;
    int lda, ldb, ldc;
    gemm_lds(g, &lda, &ldb, &ldc);
    const size_t na = (size_t)a_rows * lda, nb = (size_t)b_rows * ldb, nc = (size_t)g->M * ldc;
    const size_t csz = kiln_dtype_size(g->c_dt);
    void *absA, *absB;
    void *A = make_operand(a_rows, a_cols, lda, g->a_dt, g->a_grid, &absA);
    void *B = make_operand(b_rows, b_cols, ldb, g->b_dt, g->b_grid, &absB);
    /* C0: NaN where beta == 0 (C must not be read), a sentinel in the padding */
    void *C0 = xcalloc(nc, csz), *out[2] = {xcalloc(nc, csz), xcalloc(nc, csz)};
    for (size_t i = 0; i < nc; i++) {
        const double v = (int)(i % (size_t)ldc) >= g->N ? 12345.0 : g->beta == 0 ? NAN : unif(-1, 1);
        if (g->c_dt == KILN_DTYPE_F64) ((double *)C0)[i] = v;
        else ((float *)C0)[i] = (float)v;
    }
    /* S(M, N) = |A| |B| on the reference, for the bound */
    double *S = xcalloc((size_t)g->M * g->N, sizeof *S);
    if (g->c_dt == KILN_DTYPE_F64) {
        CU_ASSERT_EQUAL(RK->gemm_ex(RACC, g->ta, g->tb, g->M, g->N, g->K, 1.0, absA, KILN_DTYPE_F64, lda, absB,
                                    KILN_DTYPE_F64, ldb, 0.0, S, KILN_DTYPE_F64, g->N, KILN_DTYPE_F32),
                        KILN_OK);
    } else {
        float *Sf = xcalloc((size_t)g->M * g->N, sizeof *Sf);
        CU_ASSERT_EQUAL(RK->gemm(RACC, g->ta, g->tb, g->M, g->N, g->K, 1.0f, absA, lda, absB, ldb, 0.0f, Sf, g->N),
                        KILN_OK);
        for (size_t i = 0; i < (size_t)g->M * g->N; i++) S[i] = Sf[i];
        free(Sf);
    }
    int ran = 1;
    for (int s = 0; s < 2; s++) {
        side *X = begin(s);
        void *dA = up(X, A, na * kiln_dtype_size(g->a_dt)), *dB = up(X, B, nb * kiln_dtype_size(g->b_dt));
        void *dC = up(X, C0, nc * csz);
        if (g->entry11)
            RUN(X, X->k->gemm(X->acc, g->ta, g->tb, g->M, g->N, g->K, (float)g->alpha, dA, lda, dB, ldb,
                              (float)g->beta, dC, ldc));
        else
            RUN(X, X->k->gemm_ex(X->acc, g->ta, g->tb, g->M, g->N, g->K, g->alpha, dA, g->a_dt, lda, dB, g->b_dt,
                                 ldb, g->beta, dC, g->c_dt, ldc, g->round));
        down(X, out[s], dC, nc * csz);
        ran &= end(X);
    }
    char label[160];
    snprintf(label, sizeof label, "%s %dx%dx%d %c%c%s A %s%s B %s%s C %s round %s alpha %g beta %g",
             g->entry11 ? "gemm" : "gemm_ex", g->M, g->N, g->K, g->ta ? 'T' : 'N', g->tb ? 'T' : 'N',
             g->packed ? " packed" : "",
             kiln_dtype_name(g->a_dt), g->a_grid != g->a_dt ? "(16-bit values)" : "", kiln_dtype_name(g->b_dt),
             g->b_grid != g->b_dt ? "(16-bit values)" : "", kiln_dtype_name(g->c_dt),
             g->entry11 ? "-" : kiln_dtype_name(g->round), g->alpha, g->beta);
    if (ran) CU_ASSERT_TRUE(check_gemm(g, C0, out[REF], out[DUT], S, label));
    free(A), free(B), free(absA), free(absB), free(C0), free(out[0]), free(out[1]), free(S);
}

/* alpha, beta for the transpose combinations NN, NT, TN, TT: beta == 0
 * (with NaN in C) twice, beta != 0 twice, so every shape sees both */
static const double g_ab[4][2] = {{1.0, 0.0}, {0.75, -0.5}, {-1.25, 1.0}, {2.0, 0.0}};
static const int g_shapes[][3] = {{127, 65, 33}, {512, 1024, 784}, {1, 37, 300}, {45, 1, 129}, {200, 150, 1}};

static void test_gemm_f32(void) {
    seed(100);
    for (size_t s = 0; s < sizeof g_shapes / sizeof g_shapes[0]; s++)
        for (int c = 0; c < 4; c++) {
            const gemm_case g = {g_shapes[s][0], g_shapes[s][1], g_shapes[s][2], c >> 1, c & 1, 1,
                                 KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32,
                                 KILN_DTYPE_F32, g_ab[c][0], g_ab[c][1], 0};
            run_gemm_case(&g);
        }
    /* gemm_ex with float32 operands, unrounded and rounded: each rounding
     * with beta == 0 and beta != 0, every transpose combination once or more */
    const uint32_t rounds[3] = {KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_F16};
    const int combos[3][2] = {{1, 3}, {0, 2}, {3, 1}};
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 2; i++) {
            const int c = combos[r][i];
            const gemm_case g = {127, 65, 33, c >> 1, c & 1, 0, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32,
                                 KILN_DTYPE_F32, KILN_DTYPE_F32, rounds[r], g_ab[c][0], g_ab[c][1], 0};
            run_gemm_case(&g);
        }
    /* packed operands and C */
    for (int c = 0; c < 4; c += 3) {
        const gemm_case g = {127, 65, 33, c >> 1, c & 1, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32,
                             KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, g_ab[c][0], g_ab[c][1], 1};
        run_gemm_case(&g);
    }
}

static void test_gemm_ex_16bit(void) {
    seed(200);
    const uint32_t F16 = KILN_DTYPE_F16, BF16 = KILN_DTYPE_BF16, F32 = KILN_DTYPE_F32;
    const uint32_t rounds[3] = {KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    const int shapes[2][3] = {{127, 65, 33}, {61, 35, 129}};
    int combo = 0;
    /* both operands 16-bit, every rounding, beta 0 (NaN C) and 1 */
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < 2; d++)
            for (int r = 0; r < 3; r++)
                for (int b = 0; b < 2; b++, combo++) {
                    const uint32_t dt = d ? BF16 : F16;
                    const int c = combo % 4;
                    const gemm_case g = {shapes[s][0], shapes[s][1], shapes[s][2], c >> 1, c & 1, 0, dt, dt, dt, dt,
                                         F32, rounds[r], g_ab[c][0], (double)b, 0};
                    run_gemm_case(&g);
                }
    /* one float32 operand holding 16-bit values; float16 times bfloat16 */
    const uint32_t pairs[3][4] = {{F32, F16, F16, F16}, {BF16, BF16, F32, BF16}, {F16, F16, BF16, BF16}};
    for (int p = 0; p < 3; p++)
        for (int r = 0; r < 2; r++)
            for (int b = 0; b < 2; b++, combo++) {
                const int c = combo % 4;
                const gemm_case g = {127, 65, 33, c >> 1, c & 1, 0, pairs[p][0], pairs[p][1], pairs[p][2],
                                     pairs[p][3], F32, rounds[r], g_ab[c][0], (double)b, 0};
                run_gemm_case(&g);
            }
    /* the large shape, a different combination per transpose */
    const gemm_case big[4] = {
        {512, 1024, 784, 0, 0, 0, F16, F16, F16, F16, F32, KILN_DTYPE_F16, 1.0, 0.0, 0},
        {512, 1024, 784, 0, 1, 0, BF16, BF16, BF16, BF16, F32, KILN_DTYPE_BF16, 0.75, 1.0, 0},
        {512, 1024, 784, 1, 0, 0, F16, F16, F16, F16, F32, KILN_DTYPE_F32, -1.25, 1.0, 0},
        {512, 1024, 784, 1, 1, 0, F32, F16, F16, F16, F32, KILN_DTYPE_F32, 2.0, 0.0, 0},
    };
    for (int i = 0; i < 4; i++) run_gemm_case(&big[i]);
    /* packed C: beta == 0 with rounding may round the product in place */
    const gemm_case packed[4] = {
        {127, 65, 33, 0, 1, 0, F16, F16, F16, F16, F32, KILN_DTYPE_F16, 1.0, 0.0, 1},
        {127, 65, 33, 1, 0, 0, BF16, BF16, BF16, BF16, F32, KILN_DTYPE_BF16, -1.25, 0.0, 1},
        {127, 65, 33, 0, 0, 0, F32, F16, F16, F16, F32, KILN_DTYPE_F16, 2.0, 0.0, 1},
        {127, 65, 33, 1, 1, 0, F16, F16, F16, F16, F32, KILN_DTYPE_BF16, 0.75, 1.0, 1},
    };
    for (int i = 0; i < 4; i++) run_gemm_case(&packed[i]);

    /* fp16 overflow of the rounded product gives inf, as an fp16 matmul
     * does: A(2, 300) rows of 16 and 8 times B(300, 3) of 16 is 76800
     * (beyond 65504) and 38400 (exact), plus beta C with C = 1 */
    enum { M = 2, N = 3, K = 300 };
    uint16_t A[M * K], B[K * N];
    float fa[M * K], fb[K * N], C0[M * N], out[2][M * N];
    for (int i = 0; i < M * K; i++) fa[i] = i < K ? 16.0f : 8.0f;
    for (int i = 0; i < K * N; i++) fb[i] = 16.0f;
    RK->cast(RACC, A, F16, fa, F32, M * K);
    RK->cast(RACC, B, F16, fb, F32, K * N);
    for (int sign = 0; sign < 2; sign++) {
        int ran = 1;
        for (int s = 0; s < 2; s++) {
            side *X = begin(s);
            for (int i = 0; i < M * N; i++) C0[i] = 1.0f;
            void *dA = up(X, A, sizeof A), *dB = up(X, B, sizeof B), *dC = up(X, C0, sizeof C0);
            RUN(X, X->k->gemm_ex(X->acc, 0, 0, M, N, K, sign ? -1.0 : 1.0, dA, F16, K, dB, F16, N, 1.0, dC, F32, N,
                                 F16));
            down(X, out[s], dC, sizeof C0);
            ran &= end(X);
        }
        if (!ran) continue;
        const float want[M * N] = {sign ? -INFINITY : INFINITY, sign ? -INFINITY : INFINITY,
                                   sign ? -INFINITY : INFINITY, sign ? -38399.0f : 38401.0f,
                                   sign ? -38399.0f : 38401.0f, sign ? -38399.0f : 38401.0f};
        CU_ASSERT_TRUE(cmp_tol(F32, want, out[REF], M * N, NULL, "gemm_ex fp16 overflow (reference, sign %d)", sign));
        CU_ASSERT_TRUE(cmp_tol(F32, out[REF], out[DUT], M * N, NULL, "gemm_ex fp16 overflow (sign %d)", sign));
    }
}

static void test_gemm_ex_f64(void) {
    seed(300);
    const uint32_t F64 = KILN_DTYPE_F64;
    for (size_t s = 0; s < 3; s++)
        for (int c = 0; c < 4; c++) {
            const gemm_case g = {g_shapes[s][0], g_shapes[s][1], g_shapes[s][2], c >> 1, c & 1, 0, F64, F64, F64,
                                 F64, F64, s == 2 ? F64 : KILN_DTYPE_F32, g_ab[c][0], g_ab[c][1], 0};
            run_gemm_case(&g);
        }
    const gemm_case packed = {127, 65, 33, 0, 1, 0, F64, F64, F64, F64, F64, KILN_DTYPE_F32, 0.75, -0.5, 1};
    run_gemm_case(&packed);
}

/* ========================================================== bias */

static void test_bias(void) {
    const int shapes[3][2] = {{333, 77}, {4099, 257}, {1, 5}};
    seed(400);
    for (int sh = 0; sh < 3; sh++) {
        const int R = shapes[sh][0], C = shapes[sh][1];
        const size_t ny = (size_t)R * C;
        /* entry: 0 the 1.1 fp32 entries, 1 the _ex ones in F32, 2 in F64 */
        for (int entry = 0; entry < 3; entry++) {
            const uint32_t dt = entry == 2 ? KILN_DTYPE_F64 : KILN_DTYPE_F32;
            const size_t sz = kiln_dtype_size(dt);
            const double u = dt == KILN_DTYPE_F64 ? U64 : U32;
            void *y0 = xcalloc(ny, sz), *b = xcalloc(C, sz), *dy = xcalloc(ny, sz), *db0 = xcalloc(C, sz);
            void *y[2] = {xcalloc(ny, sz), xcalloc(ny, sz)}, *db[2][2] = {{xcalloc(C, sz), xcalloc(C, sz)},
                                                                          {xcalloc(C, sz), xcalloc(C, sz)}};
            double *colabs = xcalloc(C, sizeof *colabs);
            for (size_t i = 0; i < ny; i++) {
                const double a = unif(-2, 2), g = unif(-1, 1);
                if (sz == 8) ((double *)y0)[i] = a, ((double *)dy)[i] = g;
                else ((float *)y0)[i] = (float)a, ((float *)dy)[i] = (float)g;
                colabs[i % C] += fabs(elem(dt, dy, i));
            }
            for (int j = 0; j < C; j++) {
                const double a = unif(-1, 1), d = unif(-1, 1);
                if (sz == 8) ((double *)b)[j] = a, ((double *)db0)[j] = d;
                else ((float *)b)[j] = (float)a, ((float *)db0)[j] = (float)d;
            }
            /* db before an accumulate = 0 call: NaN, which must not leak */
            void *dbnan = xcalloc(C, sz);
            for (int j = 0; j < C; j++) {
                if (sz == 8) ((double *)dbnan)[j] = NAN;
                else ((float *)dbnan)[j] = NAN;
            }
            int ran = 1;
            for (int s = 0; s < 2; s++) {
                side *X = begin(s);
                void *dY = up(X, y0, ny * sz), *dB = up(X, b, C * sz), *dDY = up(X, dy, ny * sz);
                void *dDB0 = up(X, dbnan, C * sz), *dDB1 = up(X, db0, C * sz);
                if (entry == 0) {
                    RUN(X, X->k->bias_add(X->acc, dY, dB, R, C));
                    RUN(X, X->k->bias_grad(X->acc, dDB0, dDY, R, C, 0));
                    RUN(X, X->k->bias_grad(X->acc, dDB1, dDY, R, C, 1));
                } else {
                    RUN(X, X->k->bias_add_ex(X->acc, dt, dY, dB, R, C));
                    RUN(X, X->k->bias_grad_ex(X->acc, dt, dDB0, dDY, R, C, 0));
                    RUN(X, X->k->bias_grad_ex(X->acc, dt, dDB1, dDY, R, C, 1));
                }
                down(X, y[s], dY, ny * sz);
                down(X, db[s][0], dDB0, C * sz);
                down(X, db[s][1], dDB1, C * sz);
                ran &= end(X);
            }
            const char *ename = entry == 0 ? "" : "_ex";
            const char *dname = kiln_dtype_name(dt);
            if (ran) {
                CU_ASSERT_TRUE(cmp_tol(dt, y[REF], y[DUT], ny, NULL, "bias_add%s %s %dx%d", ename, dname, R, C));
                double *tol = xcalloc(C, sizeof *tol), *scale = xcalloc(C, sizeof *scale);
                for (int acc = 0; acc < 2; acc++) {
                    for (int j = 0; j < C; j++) {
                        scale[j] = colabs[j] + (acc ? fabs(elem(dt, db0, j)) : 0.0);
                        tol[j] = 2.0 * (R + 4) * u * scale[j];
                    }
                    CU_ASSERT_TRUE(cmp_tol(dt, db[REF][acc], db[DUT][acc], C, tol, "bias_grad%s %s %dx%d accumulate %d",
                                           ename, dname, R, C, acc));
                    for (int j = 0; j < C; j++) /* the NaN in db was not read */
                        CU_ASSERT_TRUE(isfinite(elem(dt, db[REF][acc], j)));
                    CU_ASSERT_TRUE(cmp_norm(dt, db[REF][acc], db[DUT][acc], C, scale, NORM_LIMIT * u,
                                            "bias_grad%s %s %dx%d accumulate %d norm-wise", ename, dname, R, C, acc));
                }
                free(tol), free(scale);
            }
            free(y0), free(b), free(dy), free(db0), free(dbnan), free(colabs);
            for (int s = 0; s < 2; s++) free(y[s]), free(db[s][0]), free(db[s][1]);
        }
    }
}

/* ===================================================== activations */

static const char *const g_act_names[5] = {"relu", "gelu", "tanh", "sigmoid", "leaky_relu"};

/* The floor of the tolerance scale (see "Tolerances"): the size of terms a
 * legitimate formula may cancel. fwd: y = f(x); bwd: dx = dy f'(x). */
static double act_floor(int act, int bwd, double x, double dy) {
    const double ax = fabs(x);
    switch (act) {
    case KILN_ACT_GELU: /* 0.5 x (1 + tanh u) and its derivative's 0.5 x (1 - t^2) c (1 + 3k x^2) */
        return bwd ? fabs(dy) * (0.5 + 0.4 * ax + 0.054 * ax * ax * ax) : 0.1 * ax;
    case KILN_ACT_TANH: return bwd ? 0.5 * fabs(dy) : 0.1; /* (1 - e) / (1 + e); 1 - tanh^2 */
    case KILN_ACT_SIGMOID: return bwd ? 0.5 * fabs(dy) : 0.0; /* s (1 - s) */
    default: return 0.0;
    }
}

/* x(n) for the activations: specials first, then uniform [-8, 8). */
static size_t act_inputs(double *x, size_t n, int act) {
    static const double specials[] = {0.0, -0.0, 1e-30, -1e-30, 1e-3, -1e-3, 0.75, -0.75, 20, -20, 50, -50, 100,
                                      -100, 1e4, -1e4};
    size_t k = 0;
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) x[k++] = specials[i];
    x[k++] = NAN;
    if (act != KILN_ACT_GELU) x[k++] = INFINITY, x[k++] = -INFINITY; /* gelu(-inf) is NaN or 0 by formula */
    for (size_t i = k; i < n; i++) x[i] = (float)unif(-8, 8);
    return k;
}

/* One activation through act_forward/act_backward (entry11 = 0) or the 1.1
 * relu_/gelu_ entries (entry11 = 1, F32). The backward runs out of place and
 * in place (dx == dy). */
static void run_act(int act, uint32_t dt, int entry11) {
    enum { N = 70001 };
    const size_t sz = kiln_dtype_size(dt);
    double *xd = xcalloc(N, sizeof *xd), *dyd = xcalloc(N, sizeof *dyd);
    act_inputs(xd, N, act);
    for (size_t i = 0; i < N; i++) dyd[i] = unif(-1, 1);
    void *x = xcalloc(N, sz), *dy = xcalloc(N, sz);
    for (size_t i = 0; i < N; i++) {
        if (sz == 8) ((double *)x)[i] = xd[i], ((double *)dy)[i] = dyd[i];
        else ((float *)x)[i] = (float)xd[i], ((float *)dy)[i] = (float)dyd[i];
    }
    void *y[2] = {xcalloc(N, sz), xcalloc(N, sz)}, *dx[2] = {xcalloc(N, sz), xcalloc(N, sz)};
    void *dxi[2] = {xcalloc(N, sz), xcalloc(N, sz)};
    int ran = 1;
    for (int s = 0; s < 2; s++) {
        side *X = begin(s);
        void *dX = up(X, x, N * sz), *dY = up(X, NULL, N * sz), *dDY = up(X, dy, N * sz), *dDX = up(X, NULL, N * sz);
        void *dIn = up(X, dy, N * sz);
        if (entry11) {
            RUN(X, (act == KILN_ACT_GELU ? X->k->gelu_forward : X->k->relu_forward)(X->acc, dY, dX, N));
            RUN(X, (act == KILN_ACT_GELU ? X->k->gelu_backward : X->k->relu_backward)(X->acc, dDX, dDY, dX, N));
            RUN(X, (act == KILN_ACT_GELU ? X->k->gelu_backward : X->k->relu_backward)(X->acc, dIn, dIn, dX, N));
        } else {
            RUN(X, X->k->act_forward(X->acc, dt, act, dY, dX, N));
            RUN(X, X->k->act_backward(X->acc, dt, act, dDX, dDY, dX, N));
            RUN(X, X->k->act_backward(X->acc, dt, act, dIn, dIn, dX, N));
        }
        down(X, y[s], dY, N * sz);
        down(X, dx[s], dDX, N * sz);
        down(X, dxi[s], dIn, N * sz);
        ran &= end(X);
    }
    if (ran) {
        const char *name = entry11 ? (act == KILN_ACT_GELU ? "gelu_" : "relu_") : "act_";
        const char *an = entry11 ? "(1.1)" : g_act_names[act];
        const char *dn = kiln_dtype_name(dt);
        const int exact = act == KILN_ACT_RELU || act == KILN_ACT_LEAKY_RELU;
        const double rtol = dt == KILN_DTYPE_F64 ? RTOL_F64 : RTOL_F32;
        const double tiny = dt == KILN_DTYPE_F64 ? TINY_F64 : TINY_F32;
        double *tf = NULL, *tb = NULL;
        if (!exact) {
            tf = xcalloc(N, sizeof *tf), tb = xcalloc(N, sizeof *tb);
            for (size_t i = 0; i < N; i++) {
                const double xv = elem(dt, x, i), g = elem(dt, dy, i);
                tf[i] = rtol * (fabs(elem(dt, y[REF], i)) + act_floor(act, 0, xv, g)) + tiny;
                tb[i] = rtol * (fabs(elem(dt, dx[REF], i)) + act_floor(act, 1, xv, g)) + tiny;
            }
        }
        CU_ASSERT_TRUE(cmp_tol(dt, y[REF], y[DUT], N, tf, "%sforward %s %s n=%d", name, an, dn, N));
        CU_ASSERT_TRUE(cmp_tol(dt, dx[REF], dx[DUT], N, tb, "%sbackward %s %s n=%d", name, an, dn, N));
        CU_ASSERT_TRUE(cmp_tol(dt, dx[REF], dxi[DUT], N, tb, "%sbackward %s %s n=%d in place", name, an, dn, N));
        free(tf), free(tb);
    }
    free(xd), free(dyd), free(x), free(dy);
    for (int s = 0; s < 2; s++) free(y[s]), free(dx[s]), free(dxi[s]);
}

static void test_act_11(void) {
    seed(500);
    run_act(KILN_ACT_RELU, KILN_DTYPE_F32, 1);
    run_act(KILN_ACT_GELU, KILN_DTYPE_F32, 1);
}

static void test_act_ex(void) {
    seed(600);
    for (int act = KILN_ACT_RELU; act <= KILN_ACT_LEAKY_RELU; act++) {
        run_act(act, KILN_DTYPE_F32, 0);
        run_act(act, KILN_DTYPE_F64, 0);
    }
}

/* ===================================================== softmax + xent */

/* entry: 0 the 1.1 entries (F32), else the _ex entries in dtype dt */
static void run_softmax(int B, int C, int entry11, uint32_t dt) {
    const size_t n = (size_t)B * C, sz = kiln_dtype_size(dt);
    const double u = dt == KILN_DTYPE_F64 ? U64 : U32, rtol = dt == KILN_DTYPE_F64 ? RTOL_F64 : RTOL_F32;
    const double tiny = dt == KILN_DTYPE_F64 ? TINY_F64 : TINY_F32;
    void *logits = xcalloc(n, sz), *probs[2] = {xcalloc(n, sz), xcalloc(n, sz)};
    void *dl[2] = {xcalloc(n, sz), xcalloc(n, sz)};
    int32_t *labels = xcalloc(B, sizeof *labels);
    for (size_t i = 0; i < n; i++) {
        const int row = (int)(i / C);
        /* row 0: logits of magnitude 400 (exp overflows without the row
         * max); row 1: all equal (the first maximum wins the argmax) */
        const double v = row == 1 && B > 2 ? 0.5 : unif(-4, 4) * (row == 0 && B > 2 ? 100 : 1);
        if (sz == 8) ((double *)logits)[i] = v;
        else ((float *)logits)[i] = (float)v;
    }
    for (int b = 0; b < B; b++) labels[b] = (int32_t)(next_u64() % (uint64_t)C);
    if (B > 2) labels[1] = 0;
    double loss[2][2] = {{0}};
    int32_t correct[2] = {-1, -1};
    const double dloss = 0.5;
    int ran = 1;
    for (int s = 0; s < 2; s++) {
        side *X = begin(s);
        void *dLg = up(X, logits, n * sz), *dP = up(X, NULL, n * sz), *dD = up(X, NULL, n * sz);
        int32_t *dLab = up(X, labels, B * sizeof(int32_t));
        if (entry11) {
            float l = 0, l2 = 0;
            RUN(X, X->k->softmax_xent_forward(X->acc, dP, dLg, dLab, B, C, &l, &correct[s]));
            RUN(X, X->k->softmax_xent_forward(X->acc, dP, dLg, dLab, B, C, &l2, NULL)); /* n_correct may be NULL */
            loss[s][0] = l, loss[s][1] = l2;
        } else {
            RUN(X, X->k->softmax_xent_forward_ex(X->acc, dt, dP, dLg, dLab, B, C, &loss[s][0], &correct[s]));
            RUN(X, X->k->softmax_xent_forward_ex(X->acc, dt, dP, dLg, dLab, B, C, &loss[s][1], NULL));
        }
        down(X, probs[s], dP, n * sz);
        /* the backward of both sides starts from the reference's probs */
        if (!X->failed) RUN(X, X->k->copy(X->acc, dP, probs[REF], n * sz, KILN_COPY_H2D));
        if (entry11) RUN(X, X->k->softmax_xent_backward(X->acc, dD, dP, dLab, B, C, (float)dloss));
        else RUN(X, X->k->softmax_xent_backward_ex(X->acc, dt, dD, dP, dLab, B, C, dloss));
        down(X, dl[s], dD, n * sz);
        ran &= end(X);
    }
    if (ran) {
        const char *e = entry11 ? "" : "_ex";
        const char *dn = kiln_dtype_name(dt);
        double *tol = xcalloc(n, sizeof *tol);
        /* probs: exp within a few ulp, the row sum within 2(C+8)u */
        for (size_t i = 0; i < n; i++) tol[i] = (rtol + 2.0 * (C + 8) * u) * fabs(elem(dt, probs[REF], i)) + tiny;
        CU_ASSERT_TRUE(
            cmp_tol(dt, probs[REF], probs[DUT], n, tol, "softmax_xent_forward%s %s %dx%d probs", e, dn, B, C));
        /* loss = mean(log(row sum) + max - logit[label]): the row sum's
         * relative error as an absolute one, plus the elementwise rounding */
        for (int k = 0; k < 2; k++)
            CU_ASSERT_TRUE(cmp_scalar(loss[REF][k], loss[DUT][k], 2.0 * (C + 8) * u + rtol * (1 + fabs(loss[REF][k])),
                                      "softmax_xent_forward%s %s %dx%d loss%s", e, dn, B, C,
                                      k ? " (n_correct NULL)" : ""));
        CU_ASSERT_EQUAL(correct[DUT], correct[REF]);
        if (correct[DUT] != correct[REF])
            fprintf(stderr, "  softmax_xent_forward%s %s %dx%d: n_correct %d, want %d\n", e, dn, B, C,
                    (int)correct[DUT],
                    (int)correct[REF]);
        for (size_t i = 0; i < n; i++) tol[i] = rtol * fabs(elem(dt, dl[REF], i)) + tiny;
        CU_ASSERT_TRUE(cmp_tol(dt, dl[REF], dl[DUT], n, tol, "softmax_xent_backward%s %s %dx%d", e, dn, B, C));
        free(tol);
    }
    free(logits), free(labels);
    for (int s = 0; s < 2; s++) free(probs[s]), free(dl[s]);
}

static void test_softmax(void) {
    const int shapes[3][2] = {{129, 10}, {1000, 1001}, {7, 1}};
    seed(700);
    for (int s = 0; s < 3; s++) {
        run_softmax(shapes[s][0], shapes[s][1], 1, KILN_DTYPE_F32);
        run_softmax(shapes[s][0], shapes[s][1], 0, KILN_DTYPE_F32);
        run_softmax(shapes[s][0], shapes[s][1], 0, KILN_DTYPE_F64);
    }
}

/* A label outside [0, C) is KILN_E_DATA (with a message) on both sides, in
 * the forward and the backward of every entry; NaN logits with valid
 * labels are a NaN loss, not an error; and the device keeps working after
 * the errors (no sticky CUDA error). */
static void test_softmax_errors(void) {
    enum { B = 5, C = 4 };
    seed(800);
    double l64[B * C];
    float l32[B * C];
    for (int i = 0; i < B * C; i++) l64[i] = l32[i] = (float)unif(-2, 2);
    const int32_t bad[2][B] = {{1, 2, 3, 0, C}, {-1, 0, 1, 2, 3}}; /* last row = C; first row = -1 */
    for (int s = 0; s < 2; s++) {
        side *X = begin(s);
        float *d32 = up(X, l32, sizeof l32), *p32 = up(X, NULL, sizeof l32);
        double *d64 = up(X, l64, sizeof l64), *p64 = up(X, NULL, sizeof l64);
        for (int v = 0; v < 2 && !X->failed; v++) {
            int32_t *lab = up(X, bad[v], sizeof bad[v]);
            if (!lab) break;
            static const char *const what[6] = {
                "softmax_xent_forward",           "softmax_xent_backward",
                "softmax_xent_forward_ex float32", "softmax_xent_backward_ex float32",
                "softmax_xent_forward_ex float64", "softmax_xent_backward_ex float64"};
            float lf = 0;
            double ld = 0;
            int32_t nc = 0, rc[6];
            /* (the backward's dlogits and probs are distinct buffers: the ABI
             * does not promise that they may alias) */
            kiln_test_clear_error(g_th);
            rc[0] = X->k->softmax_xent_forward(X->acc, p32, d32, lab, B, C, &lf, &nc);
            const int msg0 = kiln_test_error(g_th)[0] != 0;
            rc[1] = X->k->softmax_xent_backward(X->acc, p32, d32, lab, B, C, 1.0f);
            rc[2] = X->k->softmax_xent_forward_ex(X->acc, KILN_DTYPE_F32, p32, d32, lab, B, C, &ld, &nc);
            rc[3] = X->k->softmax_xent_backward_ex(X->acc, KILN_DTYPE_F32, p32, d32, lab, B, C, 1.0);
            rc[4] = X->k->softmax_xent_forward_ex(X->acc, KILN_DTYPE_F64, p64, d64, lab, B, C, &ld, NULL);
            kiln_test_clear_error(g_th);
            rc[5] = X->k->softmax_xent_backward_ex(X->acc, KILN_DTYPE_F64, p64, d64, lab, B, C, 1.0);
            const int msg5 = kiln_test_error(g_th)[0] != 0;
            for (int i = 0; i < 6; i++) {
                if (rc[i] != KILN_E_DATA)
                    fprintf(stderr, "  [%s] %s with label %d: %s, want KILN_E_DATA\n", X->name, what[i],
                            v ? -1 : C, kiln_status_name(rc[i]));
                CU_ASSERT_EQUAL(rc[i], KILN_E_DATA);
            }
            CU_ASSERT_TRUE(msg0 && msg5); /* with a message */
        }
        /* NaN logits, valid labels: KILN_OK and a NaN loss */
        const int32_t good[B] = {0, 1, 2, 3, 0};
        float nanl[B * C];
        memcpy(nanl, l32, sizeof nanl);
        nanl[6] = NAN;
        int32_t *lab = up(X, good, sizeof good);
        float *dn = up(X, nanl, sizeof nanl);
        float lf = 0;
        RUN(X, X->k->softmax_xent_forward(X->acc, p32, dn, lab, B, C, &lf, NULL));
        if (!X->failed) CU_ASSERT_TRUE(isnan(lf));
        /* still working: a valid call gives the right loss */
        double want = 0, got = NAN;
        for (int b = 0; b < B; b++) {
            double mx = -INFINITY, z = 0;
            for (int j = 0; j < C; j++) mx = fmax(mx, l64[b * C + j]);
            for (int j = 0; j < C; j++) z += exp(l64[b * C + j] - mx);
            want += log(z) + mx - l64[b * C + good[b]];
        }
        want /= B;
        RUN(X, X->k->softmax_xent_forward_ex(X->acc, KILN_DTYPE_F64, p64, d64, lab, B, C, &got, NULL));
        if (!X->failed)
            CU_ASSERT_TRUE(cmp_scalar(want, got, 1e-13, "[%s] softmax_xent_forward_ex after the errors", X->name));
        CU_ASSERT_TRUE(end(X));
    }
}

/* =========================================================== reductions */

static void test_sum_sumsq(void) {
    static const size_t sizes[] = {1, 37, 4099, 1000003};
    seed(900);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int positive = 0; positive < 2; positive++) {
            /* centred data cancels; positive data (1 + [0, 1)) would show a
             * float accumulator at once */
            const size_t n = sizes[si];
            float *x = rand_f32(n, positive ? 1 : -1, positive ? 2 : 1);
            double *xd = rand_f64(n, positive ? 1 : -1, positive ? 2 : 1);
            double sabs = 0, ssq = 0, ssq64 = 0;
            for (size_t i = 0; i < n; i++) sabs += fabs(x[i]), ssq += (double)x[i] * x[i], ssq64 += xd[i] * xd[i];
            double r[2][4] = {{0}};
            int ran = 1;
            for (int s = 0; s < 2; s++) {
                side *X = begin(s);
                float *dx = up(X, x, n * sizeof *x);
                double *dxd = up(X, xd, n * sizeof *xd);
                RUN(X, X->k->sum(X->acc, dx, n, &r[s][0]));
                RUN(X, X->k->sumsq(X->acc, dx, n, &r[s][1]));
                RUN(X, X->k->sumsq_ex(X->acc, KILN_DTYPE_F32, dx, n, &r[s][2]));
                RUN(X, X->k->sumsq_ex(X->acc, KILN_DTYPE_F64, dxd, n, &r[s][3]));
                ran &= end(X);
            }
            if (ran) {
                /* double accumulation in any order: 2(n+2)u64 * sum|terms| */
                const double b = 2.0 * ((double)n + 2) * U64;
                const char *pos = positive ? " positive" : "";
                CU_ASSERT_TRUE(cmp_scalar(r[REF][0], r[DUT][0], b * sabs, "sum n=%zu%s", n, pos));
                CU_ASSERT_TRUE(cmp_scalar(r[REF][1], r[DUT][1], b * ssq, "sumsq n=%zu%s", n, pos));
                CU_ASSERT_TRUE(cmp_scalar(r[REF][2], r[DUT][2], b * ssq, "sumsq_ex float32 n=%zu%s", n, pos));
                /* float64 squares round too: one more u per term */
                CU_ASSERT_TRUE(
                    cmp_scalar(r[REF][3], r[DUT][3], (b + 2 * U64) * ssq64, "sumsq_ex float64 n=%zu%s", n, pos));
            }
            free(x), free(xd);
        }
}

static void test_all_finite(void) {
    enum { N = 1000003 };
    seed(1000);
    float *x = rand_f32(N, -1, 1);
    double *xd = widen(x, N);
    /* (index, value) planted one at a time; FLT_MAX is finite */
    const struct {
        size_t at;
        double v;
        int finite;
    } cases[] = {{0, 0, 1},       {N - 1, FLT_MAX, 1}, {N - 1, INFINITY, 0}, {0, -INFINITY, 0},
                 {N / 2, NAN, 0}, {N - 33, NAN, 0},    {12345, -FLT_MAX, 1}};
    const size_t lens[] = {N, 37, 0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t li = 0; li < 3; li++) {
            const size_t n = lens[li];
            const float keep = x[cases[c].at];
            const double keepd = xd[cases[c].at];
            x[cases[c].at] = (float)cases[c].v, xd[cases[c].at] = cases[c].v;
            const int want = cases[c].at < n ? cases[c].finite : 1; /* n bounds what is read */
            int32_t f[2][3] = {{-1, -1, -1}, {-1, -1, -1}};
            int ran = 1;
            for (int s = 0; s < 2; s++) {
                side *X = begin(s);
                float *dx = up(X, x, N * sizeof *x);
                double *dxd = up(X, xd, N * sizeof *xd);
                RUN(X, X->k->all_finite(X->acc, dx, n, &f[s][0]));
                RUN(X, X->k->all_finite_ex(X->acc, KILN_DTYPE_F32, dx, n, &f[s][1]));
                RUN(X, X->k->all_finite_ex(X->acc, KILN_DTYPE_F64, dxd, n, &f[s][2]));
                ran &= end(X);
            }
            x[cases[c].at] = keep, xd[cases[c].at] = keepd;
            if (!ran) continue;
            for (int e = 0; e < 3; e++)
                for (int s = 0; s < 2; s++) {
                    if (f[s][e] != want)
                        fprintf(stderr, "  [%s] all_finite%s n=%zu with %g at %zu: %d, want %d\n", g_side[s].name,
                                e == 0 ? "" : e == 1 ? "_ex float32" : "_ex float64", n, cases[c].v, cases[c].at,
                                (int)f[s][e], want);
                    CU_ASSERT_EQUAL(f[s][e], want);
                }
        }
    free(x), free(xd);
}

/* ============================================================== BLAS-1 */

static void test_scale_axpy(void) {
    static const size_t sizes[] = {37, 1000003};
    const double as[2] = {0.1, -3.0};
    seed(1100);
    for (size_t si = 0; si < 2; si++) {
        const size_t n = sizes[si];
        float *x = rand_f32(n, -2, 2), *y = rand_f32(n, -2, 2);
        double *xd = rand_f64(n, -2, 2), *yd = rand_f64(n, -2, 2);
        for (int ai = 0; ai < 2; ai++) {
            const double a = as[ai];
            /* [entry] 0: scale, 1: scale_ex F32, 2: axpy, 3: axpy_ex F32 */
            float *o32[2][4];
            double *o64[2][2];
            for (int s = 0; s < 2; s++) {
                for (int e = 0; e < 4; e++) o32[s][e] = xcalloc(n, sizeof(float));
                for (int e = 0; e < 2; e++) o64[s][e] = xcalloc(n, sizeof(double));
            }
            int ran = 1;
            for (int s = 0; s < 2; s++) {
                side *X = begin(s);
                float *d[4] = {up(X, x, n * 4), up(X, x, n * 4), up(X, y, n * 4), up(X, y, n * 4)};
                float *dx = up(X, x, n * 4);
                double *e0 = up(X, xd, n * 8), *e1 = up(X, yd, n * 8), *ex = up(X, xd, n * 8);
                RUN(X, X->k->scale(X->acc, d[0], (float)a, n));
                RUN(X, X->k->scale_ex(X->acc, KILN_DTYPE_F32, d[1], a, n));
                RUN(X, X->k->axpy(X->acc, d[2], (float)a, dx, n));
                RUN(X, X->k->axpy_ex(X->acc, KILN_DTYPE_F32, d[3], a, dx, n));
                RUN(X, X->k->scale_ex(X->acc, KILN_DTYPE_F64, e0, a, n));
                RUN(X, X->k->axpy_ex(X->acc, KILN_DTYPE_F64, e1, a, ex, n));
                for (int e = 0; e < 4; e++) down(X, o32[s][e], d[e], n * 4);
                down(X, o64[s][0], e0, n * 8);
                down(X, o64[s][1], e1, n * 8);
                ran &= end(X);
            }
            if (ran) {
                /* scale: one multiply by a rounded to the data's type: exact */
                CU_ASSERT_TRUE(cmp_tol(KILN_DTYPE_F32, o32[REF][0], o32[DUT][0], n, NULL, "scale n=%zu a=%g", n, a));
                CU_ASSERT_TRUE(
                    cmp_tol(KILN_DTYPE_F32, o32[REF][1], o32[DUT][1], n, NULL, "scale_ex float32 n=%zu a=%g", n, a));
                CU_ASSERT_TRUE(
                    cmp_tol(KILN_DTYPE_F64, o64[REF][0], o64[DUT][0], n, NULL, "scale_ex float64 n=%zu a=%g", n, a));
                double *tol = xcalloc(n, sizeof *tol);
                const float af = (float)a;
                for (size_t i = 0; i < n; i++) tol[i] = RTOL_F32 * (fabs(y[i]) + fabs((double)af * x[i]));
                CU_ASSERT_TRUE(cmp_tol(KILN_DTYPE_F32, o32[REF][2], o32[DUT][2], n, tol, "axpy n=%zu a=%g", n, a));
                CU_ASSERT_TRUE(
                    cmp_tol(KILN_DTYPE_F32, o32[REF][3], o32[DUT][3], n, tol, "axpy_ex float32 n=%zu a=%g", n, a));
                for (size_t i = 0; i < n; i++) tol[i] = RTOL_F64_ARITH * (fabs(yd[i]) + fabs(a * xd[i]));
                CU_ASSERT_TRUE(
                    cmp_tol(KILN_DTYPE_F64, o64[REF][1], o64[DUT][1], n, tol, "axpy_ex float64 n=%zu a=%g", n, a));
                free(tol);
            }
            for (int s = 0; s < 2; s++) {
                for (int e = 0; e < 4; e++) free(o32[s][e]);
                for (int e = 0; e < 2; e++) free(o64[s][e]);
            }
        }
        free(x), free(y), free(xd), free(yd);
    }
}

/* ========================================================== optimizers */

/* Stores v into element i of an F32 or F64 buffer. */
static void put(uint32_t dt, void *p, size_t i, double v) {
    if (dt == KILN_DTYPE_F64) ((double *)p)[i] = v;
    else ((float *)p)[i] = (float)v;
}

/* ============================================ 1.5 elementwise entries */

static void test_ew15(void) {
    static const char *const names[7] = {"lerp", "sign", "mul", "addcmul", "addcdiv", "sqrt_ex", "clamp"};
    static const size_t sizes[] = {37, 100003};
    static const double weights[2] = {0.1, 0.9}; /* both of torch.lerp's formulas */
    if (!g_side[DUT].k->clamp || g_side[DUT].k->struct_size < KILN_KERNELS_SIZE_1_5) {
        CU_FAIL("the table under test lacks the 1.5 elementwise entries");
        return;
    }
    seed(1500);
    for (size_t si = 0; si < 2; si++) {
        const size_t n = sizes[si];
        for (int f64 = 0; f64 < 2; f64++) {
            const uint32_t dt = f64 ? KILN_DTYPE_F64 : KILN_DTYPE_F32;
            const size_t sz = kiln_dtype_size(dt), bytes = n * sz;
            void *a = xcalloc(n, sz), *b = xcalloc(n, sz), *y0 = xcalloc(n, sz);
            for (size_t i = 0; i < n; i++) {
                put(dt, a, i, unif(-3, 3));
                put(dt, b, i, unif(-3, 3));
                put(dt, y0, i, unif(-1, 1));
            }
            /* the edges: NaN, infinities, signed zeros, a subnormal */
            const double special[6] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, f64 ? 4e-320 : 1e-40};
            for (int j = 0; j < 6; j++) put(dt, a, (size_t)j * 5 % n, special[j]);
            for (int j = 0; j < 6; j++) put(dt, b, (size_t)j * 7 % n + 1, special[5 - j]);
            for (int op = 0; op < 7; op++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    for (int wi = 0; wi < (op == 0 ? 2 : 1); wi++) {
                        void *out[2] = {xcalloc(n, sz), xcalloc(n, sz)};
                        int ran = 1;
                        for (int s = 0; s < 2; s++) {
                            side *X = begin(s);
                            void *da = up(X, a, bytes), *db = up(X, b, bytes), *dy = up(X, y0, bytes);
                            /* in place: y is a itself (b for mul) */
                            void *y = !inplace ? dy : op == 2 ? db : da;
                            const kiln_kernels *k = X->k;
                            switch (op) {
                            case 0: RUN(X, k->lerp(X->acc, dt, y, da, db, weights[wi], n)); break;
                            case 1: RUN(X, k->sign(X->acc, dt, y, da, n)); break;
                            case 2: RUN(X, k->mul(X->acc, dt, y, da, db, n)); break;
                            case 3: RUN(X, k->addcmul(X->acc, dt, y, -0.7, da, db, n)); break;
                            case 4: RUN(X, k->addcdiv(X->acc, dt, y, 0.3, da, db, n)); break;
                            case 5: RUN(X, k->sqrt_ex(X->acc, dt, y, da, n)); break;
                            default: RUN(X, k->clamp(X->acc, dt, y, da, -1.25, 2.0, n)); break;
                            }
                            if (!X->failed) down(X, out[s], y, bytes);
                            ran &= end(X);
                        }
                        /* the same per-element formulas (kernels/common/km_ew.h), IEEE division and
                         * square root, no FMA on either side: equal bits, NaNs included */
                        if (ran && memcmp(out[REF], out[DUT], bytes) != 0) {
                            size_t i = 0;
                            while (i < n && !memcmp((char *)out[REF] + i * sz, (char *)out[DUT] + i * sz, sz)) i++;
                            fprintf(stderr, "  %s %s n=%zu%s: element %zu differs\n", names[op], kiln_dtype_name(dt),
                                    n, inplace ? " in place" : "", i);
                            CU_FAIL("1.5 elementwise entry differs from the cpu");
                        }
                        free(out[0]), free(out[1]);
                    }
                }
            }
            free(a), free(b), free(y0);
        }
    }
}


/* round_to through the 1.5 FP8 formats: the same bits on both sides (one
 * integer codec, kernels/common/km_fp8.h), over the whole range, the
 * saturation region, NaN and both infinities. */
static void test_round_fp8(void) {
    enum { N = 100003 };
    float *x = xcalloc(N, sizeof *x);
    seed(1508);
    for (size_t i = 0; i < N; i++) x[i] = (float)(unif(-1, 1) * ldexp(1.0, (int)(next_u64() % 48) - 28));
    const float special[6] = {NAN, INFINITY, -INFINITY, -0.0f, 1e9f, -464.0f};
    for (int j = 0; j < 6; j++) x[(size_t)j * 13] = special[j];
    static const uint32_t dts[2] = {KILN_DTYPE_F8E4M3, KILN_DTYPE_F8E5M2};
    for (int d = 0; d < 2; d++) {
        float *out[2] = {xcalloc(N, sizeof(float)), xcalloc(N, sizeof(float))};
        int ran = 1;
        for (int s = 0; s < 2; s++) {
            side *X = begin(s);
            float *dx = up(X, x, N * sizeof(float));
            RUN(X, X->k->round_to(X->acc, dx, dts[d], N));
            if (!X->failed) down(X, out[s], dx, N * sizeof(float));
            ran &= end(X);
        }
        if (ran && memcmp(out[REF], out[DUT], N * sizeof(float)) != 0) {
            fprintf(stderr, "  round_to %s differs from the cpu\n", kiln_dtype_name(dts[d]));
            CU_FAIL("FP8 round_to differs from the cpu");
        }
        free(out[0]), free(out[1]);
    }
    free(x);
}

typedef struct sgd_variant {
    double lr, momentum, dampening, weight_decay;
    int nesterov, steps;
} sgd_variant;

/* entry11: the 1.1 sgd_update (F32), else sgd_update_ex in dt. Each side
 * runs `steps` steps on its own state (first_step on the first), with a
 * fresh gradient per step; p and the momentum buffer are compared after
 * every step. */
static void run_sgd(const sgd_variant *v, size_t n, int entry11, uint32_t dt) {
    const size_t sz = kiln_dtype_size(dt);
    const int has_buf = v->momentum != 0;
    const double rtol = dt == KILN_DTYPE_F64 ? RTOL_F64 : RTOL_OPT_F32;
    void *p0 = xcalloc(n, sz), *g = xcalloc(n, sz);
    void *p[2] = {xcalloc(n, sz), xcalloc(n, sz)}, *buf[2] = {xcalloc(n, sz), xcalloc(n, sz)};
    double *acc_p = xcalloc(n, sizeof *acc_p), *acc_b = xcalloc(n, sizeof *acc_b), *tol = xcalloc(n, sizeof *tol);
    for (size_t i = 0; i < n; i++) put(dt, p0, i, unif(-1, 1));
    /* state per side: p, the momentum buffer (NULL without momentum) and
     * the gradient, refilled every step */
    void *dP[2] = {NULL, NULL}, *dB[2] = {NULL, NULL}, *dG[2] = {NULL, NULL};
    int ran = 1;
    for (int s = 0; s < 2; s++) {
        side *X = begin(s);
        dP[s] = up(X, p0, n * sz);
        dB[s] = has_buf ? up(X, NULL, n * sz) : NULL;
        dG[s] = up(X, NULL, n * sz);
        if (X->failed) ran = 0;
    }
    char label[160];
    snprintf(label, sizeof label, "sgd_update%s %s n=%zu lr %g momentum %g dampening %g nesterov %d wd %g",
             entry11 ? "" : "_ex", kiln_dtype_name(dt), n, v->lr, v->momentum, v->dampening, v->nesterov,
             v->weight_decay);
    for (int t = 1; t <= v->steps && ran; t++) {
        for (size_t i = 0; i < n; i++) put(dt, g, i, unif(-1, 1));
        for (int s = 0; s < 2; s++) {
            side *X = &g_side[s];
            RUN(X, X->k->copy(X->acc, dG[s], g, n * sz, KILN_COPY_H2D));
            if (entry11)
                RUN(X, X->k->sgd_update(X->acc, dP[s], dG[s], dB[s], n, (float)v->lr, (float)v->momentum,
                                        (float)v->dampening, v->nesterov, (float)v->weight_decay, t == 1));
            else
                RUN(X, X->k->sgd_update_ex(X->acc, dt, dP[s], dG[s], dB[s], n, v->lr, v->momentum, v->dampening,
                                           v->nesterov, v->weight_decay, t == 1));
            down(X, p[s], dP[s], n * sz);
            if (has_buf) down(X, buf[s], dB[s], n * sz);
            if (X->failed) ran = 0;
        }
        if (!ran) break;
        /* the scale: |p| plus every step's lr * (|g| + wd |p| + |buf|) */
        for (size_t i = 0; i < n; i++) {
            const double pb = fabs(elem(dt, p[REF], i)), bb = has_buf ? fabs(elem(dt, buf[REF], i)) : 0.0;
            const double d = fabs(elem(dt, g, i)) + v->weight_decay * pb + (1 + v->momentum) * bb;
            acc_b[i] += d;
            acc_p[i] += v->lr * d;
            tol[i] = rtol * t * (pb + acc_p[i]);
        }
        CU_ASSERT_TRUE(cmp_tol(dt, p[REF], p[DUT], n, tol, "%s step %d p", label, t));
        if (has_buf) {
            for (size_t i = 0; i < n; i++) tol[i] = rtol * t * (fabs(elem(dt, buf[REF], i)) + acc_b[i]);
            CU_ASSERT_TRUE(cmp_tol(dt, buf[REF], buf[DUT], n, tol, "%s step %d momentum_buf", label, t));
        }
    }
    for (int s = 0; s < 2; s++) end(&g_side[s]);
    free(p0), free(g), free(acc_p), free(acc_b), free(tol);
    for (int s = 0; s < 2; s++) free(p[s]), free(buf[s]);
}

static void test_sgd(void) {
    static const sgd_variant variants[] = {
        {0.1, 0.0, 0.0, 0.0, 0, 2},   /* plain, no buffer (NULL)        */
        {0.1, 0.0, 0.0, 1e-2, 0, 2},  /* weight decay without momentum  */
        {0.1, 0.9, 0.0, 0.0, 0, 3},   /* momentum: first_step, then not */
        {0.05, 0.9, 0.1, 1e-2, 0, 3}, /* dampening and weight decay     */
        {0.1, 0.9, 0.0, 5e-4, 1, 3},  /* Nesterov                       */
    };
    static const size_t sizes[] = {37, 1000003};
    seed(1200);
    for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++)
        for (size_t si = 0; si < 2; si++) {
            run_sgd(&variants[vi], sizes[si], 1, KILN_DTYPE_F32);
            run_sgd(&variants[vi], sizes[si], 0, KILN_DTYPE_F32);
            run_sgd(&variants[vi], sizes[si], 0, KILN_DTYPE_F64);
        }
}

/* AdamW over `steps` steps per side, compared after every step (p, m, v). */
static void run_adamw(size_t n, int entry11, uint32_t dt, double lr, double wd, int steps) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const size_t sz = kiln_dtype_size(dt);
    const double rtol = dt == KILN_DTYPE_F64 ? RTOL_F64 : RTOL_OPT_F32;
    void *p0 = xcalloc(n, sz), *g = xcalloc(n, sz), *prev = xcalloc(n, sz);
    void *o[2][3];
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 3; k++) o[s][k] = xcalloc(n, sz);
    double *upd = xcalloc(n, sizeof *upd), *gmax = xcalloc(n, sizeof *gmax), *tol = xcalloc(n, sizeof *tol);
    for (size_t i = 0; i < n; i++) put(dt, p0, i, unif(-1, 1));
    memcpy(prev, p0, n * sz);
    void *d[2][4]; /* per side: p, m, v, and the gradient, refilled every step */
    int ran = 1;
    for (int s = 0; s < 2; s++) {
        side *X = begin(s);
        d[s][0] = up(X, p0, n * sz), d[s][1] = up(X, NULL, n * sz), d[s][2] = up(X, NULL, n * sz);
        d[s][3] = up(X, NULL, n * sz);
        if (X->failed) ran = 0;
    }
    char label[128];
    snprintf(label, sizeof label, "adamw_update%s %s n=%zu lr %g wd %g", entry11 ? "" : "_ex", kiln_dtype_name(dt),
             n, lr, wd);
    for (int t = 1; t <= steps && ran; t++) {
        for (size_t i = 0; i < n; i++) {
            put(dt, g, i, unif(-1, 1) * (i % 7 == 0 ? 1e-3 : 1.0)); /* some small gradients */
            gmax[i] = fmax(gmax[i], fabs(elem(dt, g, i)));
        }
        for (int s = 0; s < 2; s++) {
            side *X = &g_side[s];
            RUN(X, X->k->copy(X->acc, d[s][3], g, n * sz, KILN_COPY_H2D));
            if (entry11)
                RUN(X, X->k->adamw_update(X->acc, d[s][0], d[s][3], d[s][1], d[s][2], n, (float)lr, (float)b1,
                                          (float)b2, (float)eps, (float)wd, t));
            else
                RUN(X, X->k->adamw_update_ex(X->acc, dt, d[s][0], d[s][3], d[s][1], d[s][2], n, lr, b1, b2, eps, wd,
                                             t));
            for (int k = 0; k < 3; k++) down(X, o[s][k], d[s][k], n * sz);
            if (X->failed) ran = 0;
        }
        if (!ran) break;
        for (size_t i = 0; i < n; i++) {
            upd[i] += fabs(elem(dt, o[REF][0], i) - elem(dt, prev, i));
            tol[i] = rtol * t * (fabs(elem(dt, o[REF][0], i)) + upd[i] + lr * wd);
        }
        memcpy(prev, o[REF][0], n * sz);
        CU_ASSERT_TRUE(cmp_tol(dt, o[REF][0], o[DUT][0], n, tol, "%s step %d p", label, t));
        for (size_t i = 0; i < n; i++) tol[i] = rtol * t * (fabs(elem(dt, o[REF][1], i)) + gmax[i]);
        CU_ASSERT_TRUE(cmp_tol(dt, o[REF][1], o[DUT][1], n, tol, "%s step %d m", label, t));
        const double tiny = dt == KILN_DTYPE_F64 ? TINY_F64 : TINY_F32;
        for (size_t i = 0; i < n; i++) tol[i] = rtol * t * fabs(elem(dt, o[REF][2], i)) + tiny;
        CU_ASSERT_TRUE(cmp_tol(dt, o[REF][2], o[DUT][2], n, tol, "%s step %d v", label, t));
    }
    for (int s = 0; s < 2; s++) end(&g_side[s]);
    free(p0), free(g), free(prev), free(upd), free(gmax), free(tol);
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 3; k++) free(o[s][k]);
}

static void test_adamw(void) {
    seed(1300);
    static const size_t sizes[] = {37, 1000003};
    for (size_t si = 0; si < 2; si++) {
        run_adamw(sizes[si], 1, KILN_DTYPE_F32, 1e-3, 1e-2, 5);
        run_adamw(sizes[si], 0, KILN_DTYPE_F32, 1e-3, 1e-2, 5);
        run_adamw(sizes[si], 0, KILN_DTYPE_F64, 1e-3, 1e-2, 5);
    }
    run_adamw(4099, 0, KILN_DTYPE_F32, 0.1, 0.0, 4); /* a large rate, no decay */
}

/* ======================================================= cast, round_to */

/* Source values per dtype (see the comments inside); *n receives the count. */
static void *cast_source(uint32_t dt, size_t *n) {
    if (dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16) {
        uint16_t *h = xcalloc(65536, sizeof *h); /* every bit pattern */
        for (size_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
        *n = 65536;
        return h;
    }
    enum { RANDOM_BITS = 60000, TIES = 8192 };
    const size_t cap = 64 + RANDOM_BITS + 3 * 6 * TIES + 20000; /* the float64 set is the larger */
    size_t k = 0;
    if (dt == KILN_DTYPE_F32) {
        float *x = xcalloc(cap, sizeof *x);
        static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, -FLT_MAX, FLT_MIN,
                                         -FLT_MIN, 0x1p-149f, -0x1p-149f, 1e-40f, -3e-39f, 65504.0f, 65519.996f,
                                         65520.0f, -65520.0f, 65536.0f, 1e5f, 0x1p-24f, 0x1p-25f, 0x3p-25f, 0x1p-26f,
                                         0x1p-14f, 0x1.ff8p-15f, 3.3895314e38f, 3.3961776e38f, 1.0f, -1.0f};
        for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) x[k++] = specials[i];
        for (size_t i = 0; i < RANDOM_BITS; i++) { /* every exponent, NaN payloads, subnormals */
            const uint32_t u = (uint32_t)next_u64();
            memcpy(&x[k++], &u, sizeof u);
        }
        /* ties between neighbouring 16-bit values (exact in float), and one
         * float ulp either side: round-to-nearest-even and its neighbours */
        for (int f = 0; f < 2; f++)
            for (size_t i = 0; i < TIES; i++) {
                uint16_t h = (uint16_t)(next_u64() & 0x7FFE); /* finite, with a finite successor */
                if (f == 0 && (h & 0x7C00) == 0x7C00) h = 0x7BFE;
                if (f == 1 && (h & 0x7F80) == 0x7F80) h = 0x7F7E;
                const double a = f ? bf16_value(h) : f16_value(h), b = f ? bf16_value(h + 1) : f16_value(h + 1);
                const float mid = (float)(0.5 * (a + b)), sg = (next_u64() & 1) ? -1.0f : 1.0f;
                x[k++] = sg * mid;
                x[k++] = sg * nextafterf(mid, INFINITY);
                x[k++] = sg * nextafterf(mid, 0.0f);
            }
        for (size_t i = 0; i < 20000; i++) x[k++] = (float)unif(-70000, 70000); /* around fp16's range */
        *n = k;
        return x;
    }
    double *x = xcalloc(cap, sizeof *x);
    static const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, DBL_MAX, -DBL_MAX, 1e39, -1e39, 1e-46,
                                      0x1p-150, 0x1.000001p-150, 0x1p-149, 3.4028235677973366e38,
                                      3.4028235677973366e38 * (1 + 0x1p-30), 65504.0, 65519.999, 65520.0, 0x1p-25,
                                      0x1.0000001p-25, DBL_MIN, 5e-324, 1.0,
                                      /* double rounding: direct rounding goes up, via float it ties to even (down) */
                                      1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-8 + 0x1p-40, -(1.0 + 0x1p-11 + 0x1p-40),
                                      -(1.0 + 0x1p-8 + 0x1p-40)};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) x[k++] = specials[i];
    for (size_t i = 0; i < RANDOM_BITS; i++) {
        const uint64_t u = next_u64();
        memcpy(&x[k++], &u, sizeof u);
    }
    /* ties of float and of each 16-bit format, and values a hair (2^-30
     * relative, below float's precision) either side of the 16-bit ties,
     * which only a single rounding gets right */
    for (int f = 0; f < 3; f++)
        for (size_t i = 0; i < TIES; i++) {
            double a, b;
            if (f == 2) {
                uint32_t u = (uint32_t)next_u64() & 0x7F7FFFFFu;
                float fa, fb;
                memcpy(&fa, &u, 4);
                fb = nextafterf(fa, INFINITY);
                if (!isfinite(fb)) fb = fa; /* FLT_MAX has no finite successor */
                a = fa, b = fb;
            } else {
                uint16_t h = (uint16_t)(next_u64() & 0x7FFE);
                if (f == 0 && (h & 0x7C00) == 0x7C00) h = 0x7BFE;
                if (f == 1 && (h & 0x7F80) == 0x7F80) h = 0x7F7E;
                a = f ? bf16_value(h) : f16_value(h), b = f ? bf16_value(h + 1) : f16_value(h + 1);
            }
            const double mid = 0.5 * (a + b), sg = (next_u64() & 1) ? -1.0 : 1.0;
            x[k++] = sg * mid;
            x[k++] = sg * (mid + (b - a) * 0x1p-30);
            x[k++] = sg * (mid - (b - a) * 0x1p-30);
            x[k++] = sg * nextafter(mid, INFINITY);
            x[k++] = sg * nextafter(mid, 0.0);
            x[k++] = sg * unif(a, b);
        }
    for (size_t i = 0; i < 20000; i++) x[k++] = unif(-1, 1) * pow(2.0, unif(-160, 130));
    *n = k;
    return x;
}

static void test_cast_round_to(void) {
    static const uint32_t dts[4] = {KILN_DTYPE_F32, KILN_DTYPE_F64, KILN_DTYPE_F16, KILN_DTYPE_BF16};
    seed(1400);
    for (int si = 0; si < 4; si++) {
        size_t n;
        void *src = cast_source(dts[si], &n);
        const size_t ssz = kiln_dtype_size(dts[si]);
        for (int di = 0; di < 4; di++) {
            const size_t dsz = kiln_dtype_size(dts[di]);
            void *out[2] = {xcalloc(n, dsz), xcalloc(n, dsz)};
            int ran = 1;
            for (int s = 0; s < 2; s++) {
                side *X = begin(s);
                void *dS = up(X, src, n * ssz), *dD = up(X, NULL, n * dsz);
                RUN(X, X->k->cast(X->acc, dD, dts[di], dS, dts[si], n));
                down(X, out[s], dD, n * dsz);
                ran &= end(X);
            }
            if (ran)
                CU_ASSERT_TRUE(cmp_bits(dts[di], out[REF], out[DUT], n, "cast %s -> %s (%zu values)",
                                        kiln_dtype_name(dts[si]), kiln_dtype_name(dts[di]), n));
            free(out[0]), free(out[1]);
        }
        if (dts[si] == KILN_DTYPE_F32)
            for (int di = 0; di < 4; di++) {
                if (dts[di] == KILN_DTYPE_F64) continue;
                float *out[2] = {xcalloc(n, 4), xcalloc(n, 4)};
                int ran = 1;
                for (int s = 0; s < 2; s++) {
                    side *X = begin(s);
                    float *dX = up(X, src, n * 4);
                    RUN(X, X->k->round_to(X->acc, dX, dts[di], n));
                    down(X, out[s], dX, n * 4);
                    ran &= end(X);
                }
                if (ran)
                    CU_ASSERT_TRUE(cmp_bits(KILN_DTYPE_F32, out[REF], out[DUT], n, "round_to %s (%zu values)",
                                            kiln_dtype_name(dts[di]), n));
                free(out[0]), free(out[1]);
            }
        free(src);
    }
}

/* ========================================================= self-check */

/* An fp32 product on the reference alone: A(M, K; K + 3) B(K, N; N + 5)
 * into c(M, N + 7), with NaN in c first; S(M, N) = |A| |B|. With tf32 the
 * inputs are first rounded to TF32 (10 mantissa bits, to nearest even). */
static void ref_product(int M, int N, int K, int tf32, float *c, double *S) {
    void *absA, *absB;
    float *A = make_operand(M, K, K + 3, KILN_DTYPE_F32, KILN_DTYPE_F32, &absA);
    float *B = make_operand(K, N, N + 5, KILN_DTYPE_F32, KILN_DTYPE_F32, &absB);
    float *t[2] = {xcalloc((size_t)M * (K + 3), sizeof(float)), xcalloc((size_t)K * (N + 5), sizeof(float))};
    const float *src[2] = {A, B};
    const size_t len[2] = {(size_t)M * (K + 3), (size_t)K * (N + 5)};
    for (int m = 0; m < 2; m++)
        for (size_t i = 0; i < len[m]; i++) {
            uint32_t u;
            memcpy(&u, &src[m][i], 4);
            if (tf32 && isfinite(src[m][i])) u = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
            memcpy(&t[m][i], &u, 4);
        }
    float *Sf = xcalloc((size_t)M * N, sizeof *Sf);
    for (size_t i = 0; i < (size_t)M * (N + 7); i++) c[i] = (int)(i % (size_t)(N + 7)) >= N ? 12345.0f : NAN;
    CU_ASSERT_EQUAL(RK->gemm(RACC, 0, 0, M, N, K, 1.0f, t[0], K + 3, t[1], N + 5, 0.0f, c, N + 7), KILN_OK);
    CU_ASSERT_EQUAL(RK->gemm(RACC, 0, 0, M, N, K, 1.0f, absA, K + 3, absB, N + 5, 0.0f, Sf, N), KILN_OK);
    for (size_t i = 0; i < (size_t)M * N; i++) S[i] = Sf[i];
    free(A), free(B), free(absA), free(absB), free(t[0]), free(t[1]), free(Sf);
}

/* The tolerances have teeth, checked on the reference alone: an fp32 GEMM
 * whose inputs were rounded to TF32 fails check_gemm (through the norm-wise
 * part; the elementwise bound alone would let it pass at K = 784), and a
 * result rounded to fp16 that is two fp16 ulps off in its largest element
 * fails as well, while each result passes against itself. */
static void test_tolerances_bite(void) {
    enum { M = 127, N = 65 };
    const int ldc = N + 7;
    const size_t nc = (size_t)M * ldc;
    float *C0 = xcalloc(nc, sizeof *C0), *c = xcalloc(nc, sizeof *c), *ct = xcalloc(nc, sizeof *ct);
    double *S = xcalloc((size_t)M * N, sizeof *S);
    for (size_t i = 0; i < nc; i++) C0[i] = (int)(i % (size_t)ldc) >= N ? 12345.0f : NAN;

    gemm_case g = {M, N, 784, 0, 0, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32,
                   KILN_DTYPE_F32, KILN_DTYPE_F32, 1.0, 0.0, 0};
    seed(1500);
    ref_product(M, N, g.K, 0, c, S);
    seed(1500);
    ref_product(M, N, g.K, 1, ct, S);
    CU_ASSERT_TRUE(check_gemm(&g, C0, c, c, S, "self-check: fp32 GEMM against itself"));
    g_quiet = 1;
    const int tf32_passes = check_gemm(&g, C0, c, ct, S, "self-check: TF32 inputs");
    g_quiet = 0;
    CU_ASSERT_FALSE(tf32_passes);

    g.K = 33, g.entry11 = 0, g.round = KILN_DTYPE_F16;
    seed(1501);
    ref_product(M, N, g.K, 0, c, S);
    RK->round_to(RACC, c, KILN_DTYPE_F16, nc); /* (the padding sentinel is the same in both) */
    memcpy(ct, c, nc * sizeof *c);
    size_t big = 0;
    for (size_t i = 0; i < nc; i++)
        if ((int)(i % (size_t)ldc) < N && fabsf(c[i]) > fabsf(c[big])) big = i;
    ct[big] = (float)(c[big] + 2 * ulp16(c[big], KILN_DTYPE_F16));
    CU_ASSERT_TRUE(check_gemm(&g, C0, c, c, S, "self-check: rounded GEMM against itself"));
    g_quiet = 1;
    const int moved_passes = check_gemm(&g, C0, c, ct, S, "self-check: two fp16 ulps off");
    g_quiet = 0;
    CU_ASSERT_FALSE(moved_passes);
    free(C0), free(c), free(ct), free(S);
}

/* ================================================== ABI 1.3: fused entries */

/* unscale_check over 60 tensors (more than one launch's list on the cuda
 * side; a few empty), carved from one buffer: every value is one IEEE
 * multiply, so the results must be equal; the finiteness flag must agree,
 * with an inf planted in the 56th tensor and with a finite value the
 * multiply overflows. Then a float64 list. */
static void test_unscale_check(void) {
    enum { T = 60, CAP = 5000 };
    seed(1300);
    size_t n[T], off[T], total = 0;
    for (int t = 0; t < T; t++) {
        n[t] = t % 13 == 5 ? 0 : 1 + (size_t)(next_u64() % CAP);
        off[t] = total;
        total += (n[t] + 15) & ~(size_t)15; /* 64-byte aligned starts */
    }
    float *x = rand_f32(total, -1000, 1000);
    const double a[3] = {1.0 / 1024, 0.5, 4.0};
    for (int c = 0; c < 3; c++) {
        if (c == 1) x[off[55] + n[55] / 2] = INFINITY;
        if (c == 2) x[off[55] + n[55] / 2] = 2e38f; /* finite, overflows when x 4 */
        float *out[2] = {xcalloc(total, sizeof(float)), xcalloc(total, sizeof(float))};
        int32_t fin[2] = {-1, -1};
        int ran = 1;
        for (int s = 0; s < 2; s++) {
            side *X = begin(s);
            float *d = up(X, x, total * sizeof *x);
            void *ptr[T];
            for (int t = 0; t < T; t++) ptr[t] = n[t] ? (void *)(d + off[t]) : NULL;
            if (d) RUN(X, X->k->unscale_check(X->acc, KILN_DTYPE_F32, ptr, n, T, a[c], &fin[s]));
            down(X, out[s], d, total * sizeof(float));
            ran &= end(X);
        }
        if (ran) {
            CU_ASSERT_TRUE(cmp_tol(KILN_DTYPE_F32, out[REF], out[DUT], total, NULL,
                                   "unscale_check float32 %d tensors a=%g%s", T, a[c],
                                   c == 1 ? " (inf planted)" : c == 2 ? " (overflow)" : ""));
            CU_ASSERT_EQUAL(fin[REF], c == 0);
            CU_ASSERT_EQUAL(fin[DUT], fin[REF]);
        }
        free(out[0]), free(out[1]);
    }
    free(x);

    double *xd = rand_f64(3000, -1, 1), *od[2] = {xcalloc(3000, sizeof(double)), xcalloc(3000, sizeof(double))};
    size_t nd[3] = {1000, 0, 1999};
    int32_t fd[2] = {-1, -1};
    int ran = 1;
    for (int s = 0; s < 2; s++) {
        side *X = begin(s);
        double *d = up(X, xd, 3000 * sizeof *xd);
        void *ptr[3] = {d, NULL, d ? d + 1001 : NULL};
        if (d) RUN(X, X->k->unscale_check(X->acc, KILN_DTYPE_F64, ptr, nd, 3, 0.125, &fd[s]));
        down(X, od[s], d, 3000 * sizeof(double));
        ran &= end(X);
    }
    if (ran) {
        CU_ASSERT_TRUE(cmp_tol(KILN_DTYPE_F64, od[REF], od[DUT], 3000, NULL, "unscale_check float64"));
        CU_ASSERT_TRUE(fd[REF] == 1 && fd[DUT] == 1);
    }
    free(xd), free(od[0]), free(od[1]);
}

/* One linear_forward case: x(rows, in) on the grid of round (representable
 * in it), w(out, in) in w_dt, b(out) or none; y and post compared with
 * the GEMM bound of "Tolerances" plus the bias, one 16-bit ulp each where
 * rounded, and for post the activation's slope (<= 1.13) times y's bound
 * plus the elementwise tolerance. */
typedef struct lin_case {
    int rows, in, out, act, bias;
    uint32_t dt, w_dt, round;
} lin_case;

static void run_linear(const lin_case *L) {
    const size_t nx = (size_t)L->rows * L->in, nw = (size_t)L->out * L->in, ny = (size_t)L->rows * L->out;
    const uint32_t dt = L->dt;
    const size_t esz = kiln_dtype_size(dt);
    const int rounded = L->round == KILN_DTYPE_F16 || L->round == KILN_DTYPE_BF16;
    void *absx, *absw;
    void *x = make_operand(L->rows, L->in, L->in, dt, rounded ? L->round : dt, &absx);
    void *w = make_operand(L->out, L->in, L->in, L->w_dt, rounded ? L->round : L->w_dt, &absw);
    void *b = NULL;
    double *bd = xcalloc(L->out, sizeof *bd);
    if (L->bias) {
        b = xcalloc(L->out, esz);
        for (int j = 0; j < L->out; j++) {
            bd[j] = unif(-0.5, 0.5);
            if (dt == KILN_DTYPE_F64) ((double *)b)[j] = bd[j];
            else ((float *)b)[j] = (float)bd[j], bd[j] = ((float *)b)[j];
        }
    }
    /* S(rows, out) = |x| |w|^T */
    double *S = xcalloc(ny, sizeof *S);
    if (L->in == 0) {
        /* no product: S stays 0 */
    } else if (dt == KILN_DTYPE_F64) {
        CU_ASSERT_EQUAL(RK->gemm_ex(RACC, 0, 1, L->rows, L->out, L->in, 1.0, absx, KILN_DTYPE_F64, L->in, absw,
                                    KILN_DTYPE_F64, L->in, 0.0, S, KILN_DTYPE_F64, L->out, KILN_DTYPE_F32),
                        KILN_OK);
    } else {
        float *Sf = xcalloc(ny, sizeof *Sf);
        CU_ASSERT_EQUAL(RK->gemm(RACC, 0, 1, L->rows, L->out, L->in, 1.0f, absx, L->in, absw, L->in, 0.0f, Sf, L->out),
                        KILN_OK);
        for (size_t i = 0; i < ny; i++) S[i] = Sf[i];
        free(Sf);
    }
    void *y[2] = {xcalloc(ny, esz), xcalloc(ny, esz)}, *p[2] = {xcalloc(ny, esz), xcalloc(ny, esz)};
    int ran = 1;
    for (int s = 0; s < 2; s++) {
        side *X = begin(s);
        void *dx = up(X, x, nx * esz), *dw = up(X, w, nw * kiln_dtype_size(L->w_dt));
        void *db = L->bias ? up(X, b, (size_t)L->out * esz) : NULL;
        void *dy = up(X, NULL, ny * esz), *dp = L->act >= 0 ? up(X, NULL, ny * esz) : NULL;
        RUN(X, X->k->linear_forward(X->acc, dt, dx, dw, L->w_dt, db, L->rows, L->in, L->out, L->act, dy, dp,
                                    L->round));
        down(X, y[s], dy, ny * esz);
        if (L->act >= 0) down(X, p[s], dp, ny * esz);
        ran &= end(X);
    }
    char label[160];
    snprintf(label, sizeof label, "linear_forward %dx%d->%d %s w %s round %s act %s%s", L->rows, L->in, L->out,
             kiln_dtype_name(dt), kiln_dtype_name(L->w_dt), kiln_dtype_name(L->round),
             L->act >= 0 ? g_act_names[L->act] : "none", L->bias ? "" : " no bias");
    if (ran) {
        const int sixteen = L->w_dt == KILN_DTYPE_F16 || L->w_dt == KILN_DTYPE_BF16;
        const double u = dt == KILN_DTYPE_F64 ? U64 : sixteen ? U23 : U32;
        const double rtol = dt == KILN_DTYPE_F64 ? RTOL_F64 : RTOL_F32, tiny = dt == KILN_DTYPE_F64 ? TINY_F64 : TINY_F32;
        double *ty = xcalloc(ny, sizeof *ty), *tp = xcalloc(ny, sizeof *tp), *sc = xcalloc(ny, sizeof *sc);
        for (int r = 0; r < L->rows; r++)
            for (int j = 0; j < L->out; j++) {
                const size_t i = (size_t)r * L->out + j;
                sc[i] = S[i] + fabs(bd[j]);
                const double yw = elem(dt, y[REF], i), yg = elem(dt, y[DUT], i);
                double t = 2.0 * (L->in + 4) * u * sc[i];
                if (rounded) t += ulp16(1.01 * fmax(fabs(yw), fabs(yg)), L->round);
                ty[i] = t;
                if (L->act >= 0) {
                    const double pw = elem(dt, p[REF], i), pg = elem(dt, p[DUT], i);
                    double tq = 1.2 * t + rtol * (fabs(pw) + act_floor(L->act, 0, yw, 0)) + tiny;
                    if (rounded) tq += ulp16(1.01 * fmax(fabs(pw), fabs(pg)), L->round);
                    tp[i] = tq;
                }
            }
        CU_ASSERT_TRUE(cmp_tol(dt, y[REF], y[DUT], ny, ty, "%s: y", label));
        if (!rounded)
            CU_ASSERT_TRUE(cmp_norm(dt, y[REF], y[DUT], ny, sc, NORM_LIMIT * (sixteen ? 4 * U32 : u),
                                    "%s: y norm-wise", label));
        if (L->act >= 0) CU_ASSERT_TRUE(cmp_tol(dt, p[REF], p[DUT], ny, tp, "%s: post", label));
        /* The activation itself, apart from the GEMM: in float32 without
         * rounding, post must be the cpu's activation of the DUT's own y,
         * bit for bit (kernels/common/km_act.h on both sides, no FMA). The
         * tolerance above cannot see a different GELU formula (cuBLASLt's
         * GELU epilogue agrees with km_gelu to about 1e-7): this can. */
        if (L->act >= 0 && dt == KILN_DTYPE_F32 && !rounded) {
            float *want = xcalloc(ny, sizeof *want);
            CU_ASSERT_EQUAL(RK->act_forward(RACC, dt, L->act, want, y[DUT], ny), KILN_OK);
            CU_ASSERT_TRUE(cmp_bits(dt, want, p[DUT], ny, "%s: post = cpu act(y) bit for bit", label));
            free(want);
        }
        free(ty), free(tp), free(sc);
    }
    free(x), free(w), free(b), free(bd), free(absx), free(absw), free(S);
    for (int s = 0; s < 2; s++) free(y[s]), free(p[s]);
}

static void test_linear_forward(void) {
    seed(1400);
    static const lin_case cases[] = {
        /* fp32: GELU with out % 8 == 0 (which a cuBLASLt GELU epilogue could
         * take: kiln's kernel must run instead) and not, ReLU, the last layer */
        {130, 784, 256, KILN_ACT_GELU, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32},
        {130, 784, 250, KILN_ACT_GELU, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32},
        {64, 100, 32, KILN_ACT_RELU, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32},
        {64, 100, 10, -1, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32},
        {33, 65, 17, KILN_ACT_TANH, 0, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32},
        /* mixed precision: 16-bit weights, one rounding after the bias */
        {128, 784, 256, KILN_ACT_GELU, 1, KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_BF16},
        {128, 256, 10, -1, 1, KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_BF16},
        {96, 300, 64, KILN_ACT_RELU, 1, KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_F16},
        /* 16-bit weights without rounding: converted, an fp32 product, kiln's GELU */
        {64, 100, 48, KILN_ACT_GELU, 1, KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_F32},
        /* fp64 */
        {40, 70, 30, KILN_ACT_RELU, 1, KILN_DTYPE_F64, KILN_DTYPE_F64, KILN_DTYPE_F32},
        {40, 70, 24, KILN_ACT_GELU, 1, KILN_DTYPE_F64, KILN_DTYPE_F64, KILN_DTYPE_F32},
        {40, 70, 24, KILN_ACT_TANH, 1, KILN_DTYPE_F64, KILN_DTYPE_F64, KILN_DTYPE_F64}, /* F64 "rounding": none */
        /* K = 0: the bias alone */
        {5, 0, 8, KILN_ACT_SIGMOID, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_linear(&cases[c]);
}

/* ====================================================== 1.4 sequence */

#include "cuda_seq_cases.inc"

/* ============================================================== setup */

/* Without the plugin or a GPU: one line, then exit 77 (CTest: skipped), or
 * 1 under KILN_GPU_TEST_REQUIRE. */
static void skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void skip(const char *fmt, ...) {
    const char *req = getenv("KILN_GPU_TEST_REQUIRE");
    const int required = req && *req && strcmp(req, "0") != 0;
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    printf("test_cuda_kernels: %s: %s\n", required ? "FAIL (KILN_GPU_TEST_REQUIRE is set)" : "SKIP", why);
    fflush(stdout);
    exit(required ? 1 : 77);
}

static void fail_setup(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail_setup(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "test_cuda_kernels: FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* The config the real host resolves for a plugin section that sets nothing:
 * every declared key with its default (the cuda plugin reads `tf32`,
 * `device` and its buffer sizes from it in create()). NULL-terminated, in
 * out[cap]; valid until destroy, hence static storage at the caller. */
/* Each declared key at its default; KILN_GPU_TEST_ATTENTION=MODE sets the
 * device under test's `attention` key (the cuda plugin's two attention
 * paths are compared with the cpu one by separate runs). */
static const kiln_kv *default_config(const kiln_plugin_desc *d, kiln_kv *out, size_t cap) {
    size_t k = 0;
    const char *attn = getenv("KILN_GPU_TEST_ATTENTION");
    for (const kiln_param *p = d->params; p && p->key && k + 1 < cap; p++)
        if (p->def.type != KILN_TYPE_NONE) {
            out[k].key = p->key, out[k].value = p->def;
            if (attn && *attn && !strcmp(p->key, "attention") && p->def.type == KILN_TYPE_STRING)
                out[k].value.v.s = attn;
            k++;
        }
    out[k].key = NULL;
    out[k].value.type = KILN_TYPE_NONE;
    return out;
}

static void load_side(side *S, const char *dir, const char *name, int is_ref) {
    static kiln_kv config[2][64];
    char path[1200];
    snprintf(path, sizeof path, "%s/libkiln-%s.so", dir, name);
    S->name = name;
    if (!is_ref) {
        if (access(path, F_OK) != 0) skip("%s does not exist (the %s plugin is not built)", path, name);
        /* A library that needs the CUDA driver (libcuda.so) cannot even load
         * without one: no GPU here. Any other load error is a broken build. */
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *err = dlerror();
            if (err && strstr(err, "libcuda.so")) skip("no CUDA driver: %s", err);
            fail_setup("cannot load %s: %s", path, err ? err : "?");
        }
    }
    kiln_test_clear_error(g_th);
    kiln_test_load(g_th, path, KILN_KIND_ACCELERATOR, name, &S->desc);
    if (!S->desc)
        fail_setup("%s: no accelerator plugin \"%s\" (library init failed or descriptor missing) %s", path, name,
                   kiln_test_error(g_th));
    S->ops = S->desc->ops;
    if (S->ops->base.struct_size < KILN_ACCELERATOR_OPS_SIZE_1_1 || !S->ops->kernels || !S->ops->configure)
        fail_setup("%s: the accelerator ops table lacks kernels/configure", path);
    kiln_test_clear_error(g_th);
    int32_t rc = S->ops->base.create(S->desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th),
                                     default_config(S->desc, config[is_ref], 64), &S->acc);
    if (rc != KILN_OK) {
        if (is_ref) fail_setup("%s: create failed: %s: %s", path, kiln_status_name(rc), kiln_test_error(g_th));
        skip("%s: create failed (no usable GPU?): %s: %s", name, kiln_status_name(rc), kiln_test_error(g_th));
    }
    kiln_test_clear_error(g_th);
    rc = S->ops->configure(S->acc, 0, 0); /* all CPU threads; device 0 */
    if (rc != KILN_OK) {
        S->ops->base.destroy(S->acc);
        S->acc = NULL;
        if (is_ref) fail_setup("%s: configure failed: %s: %s", path, kiln_status_name(rc), kiln_test_error(g_th));
        skip("%s: configure(threads 0, local_rank 0) failed (no usable GPU?): %s: %s", name, kiln_status_name(rc),
             kiln_test_error(g_th));
    }
    S->k = S->ops->kernels(S->acc);
    if (!S->k) fail_setup("%s: kernels() returned NULL", path);
    if (S->k->struct_size < KILN_KERNELS_SIZE_1_3)
        fail_setup("%s: the kernel table (%u bytes) lacks the ABI 1.3 entries (%zu bytes)", path,
                   (unsigned)S->k->struct_size, (size_t)KILN_KERNELS_SIZE_1_3);
    if (is_ref && !(S->k->flags & KILN_KERNELS_HOST_MEMORY))
        fail_setup("%s: the reference must use host memory", path);
}

static int suite_clean(void) {
    for (int s = 1; s >= 0; s--)
        if (g_side[s].acc) g_side[s].ops->base.destroy(g_side[s].acc), g_side[s].acc = NULL;
    kiln_test_reset(g_th);
    return 0;
}

/* Every case, in order; KILN_GPU_TEST_ONLY keeps those whose name holds it. */
static const struct {
    const char *name;
    CU_TestFunc fn;
} g_cases[] = {
    {"kernel table", test_table},
    {"memory: alloc zero-filled, copy, zero, free(NULL)", test_memory},
    {"tolerances reject TF32-class error", test_tolerances_bite},
    {"gemm float32 (and gemm_ex float32)", test_gemm_f32},
    {"gemm_ex float16/bfloat16", test_gemm_ex_16bit},
    {"gemm_ex float64", test_gemm_ex_f64},
    {"bias_add, bias_grad (and _ex)", test_bias},
    {"relu/gelu forward, backward (1.1)", test_act_11},
    {"act_forward, act_backward: 5 activations x 2 dtypes", test_act_ex},
    {"softmax_xent forward, backward (and _ex)", test_softmax},
    {"softmax_xent: bad labels, NaN logits", test_softmax_errors},
    {"sum, sumsq (and _ex)", test_sum_sumsq},
    {"all_finite (and _ex)", test_all_finite},
    {"scale, axpy (and _ex)", test_scale_axpy},
    {"sgd_update (and _ex)", test_sgd},
    {"adamw_update (and _ex)", test_adamw},
    {"1.3 unscale_check: 60 tensors, inf, overflow, float64", test_unscale_check},
    {"1.3 linear_forward: epilogues, 16-bit rounding, float64", test_linear_forward},
    {"cast, round_to", test_cast_round_to},
    {"1.5 lerp, sign, mul, addcmul, addcdiv, sqrt_ex, clamp: 2 dtypes, in place, edges", test_ew15},
    {"1.5 round_to float8_e4m3fn, float8_e5m2 (saturation, NaN, inf)", test_round_fp8},
    {"1.4 embedding forward/backward: tables, rewritten tokens, bad token", test_seq_embedding},
    {"1.4 layernorm forward/backward: affine or not, 16-bit outputs, accumulate", test_seq_layernorm},
    {"1.4 xent_fused: ignored rows, masked classes, padding, bad targets", test_seq_xent},
    {"1.4 add: apart and in place", test_seq_add},
    {"1.4 attention forward/backward: 3 shapes, bfloat16 outputs", test_seq_attention},
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    /* line-buffered, so the summaries (stdout) and details (stderr) of a
     * failure stay in order in CTest's log */
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *dir = getenv("KILN_PLUGIN_DIR");
    const char *dut = getenv("KILN_GPU_TEST_ACCEL");
    const char *verbose = getenv("KILN_GPU_TEST_VERBOSE");
    g_verbose = verbose && *verbose && strcmp(verbose, "0") != 0;
    if (!dir || !*dir) dir = ".";
    if (!dut || !*dut) dut = "cuda";
    if (strspn(dut, "abcdefghijklmnopqrstuvwxyz0123456789._-") != strlen(dut) || strlen(dut) > 64)
        fail_setup("KILN_GPU_TEST_ACCEL=\"%s\" is not a plugin name", dut);
    kiln_test_reset(g_th);
    load_side(&g_side[REF], dir, "cpu", 1);
    load_side(&g_side[DUT], dir, dut, 0);
    printf("test_cuda_kernels: %s (%s) against cpu, plugins from %s\n", dut,
           g_side[DUT].desc->description ? g_side[DUT].desc->description : "", dir);
    fflush(stdout);

    const char *only = getenv("KILN_GPU_TEST_ONLY");
    CU_pSuite s = CU_add_suite(dut, NULL, suite_clean);
    if (!s) return;
    size_t added = 0;
    for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++) {
        if (only && *only && !strstr(g_cases[i].name, only)) continue;
        CU_add_test(s, g_cases[i].name, g_cases[i].fn);
        added++;
    }
    if (!added) fail_setup("KILN_GPU_TEST_ONLY=\"%s\" matches no case", only);
}

#include "cunit_main.h"
