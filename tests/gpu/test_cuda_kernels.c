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
 * The GEMM/bias, optimizer/elementwise/cast, 1.4 sequence and 1.7 16-bit
 * activation storage cases stand in cuda_gemm_cases.inc, cuda_ew_cases.inc,
 * cuda_seq_cases.inc and cuda_act16_cases.inc, which this file includes;
 * the table g_cases below registers them all.
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
 *   KILN_GPU_TEST_CACHING=0  the device under test's `caching` key false:
 *                            every tensor its own exact-size cudaMalloc, so
 *                            a kernel's overrun leaves it (compute-sanitizer
 *                            on the GPU, ASan on the host-execution build).
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

#include "half_bits.h"
#include "adamw_many_cases.h"
#include "add_ln_cases.h"
#include "bwd_fuse_cases.h"
#include "sumsq_many_cases.h"

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

static int is_nan16(uint32_t dt, uint16_t h) {
    return dt == KILN_DTYPE_F16 ? (h & 0x7C00) == 0x7C00 && (h & 0x03FF) : (h & 0x7F80) == 0x7F80 && (h & 0x007F);
}

/* element i of p, dtype dt, as a double */
static double elem(uint32_t dt, const void *p, size_t i) {
    switch (dt) {
    case KILN_DTYPE_F32: return ((const float *)p)[i];
    case KILN_DTYPE_F64: return ((const double *)p)[i];
    case KILN_DTYPE_F16: return hb_f16_value(((const uint16_t *)p)[i]);
    case KILN_DTYPE_BF16: return hb_bf16_value(((const uint16_t *)p)[i]);
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

/* The comparisons' one line per case (failures, or all under verbose). */
static void report(int ok, double worst, const char *what) {
    if (g_quiet || (ok && !g_verbose)) return;
    printf("  %-4s %-78s worst %.3g of tol\n", ok ? "ok" : "FAIL", what, worst);
}

/* The case's name into the char array `buf`, from the printf-style `fmt`
 * and `...` of the comparison it stands in: a macro, since only the
 * variadic function itself can va_start its arguments. */
#define FORMAT_WHAT(buf)                                                                                               \
    do {                                                                                                               \
        va_list ap_;                                                                                                   \
        va_start(ap_, fmt);                                                                                            \
        vsnprintf(buf, sizeof buf, fmt, ap_);                                                                          \
        va_end(ap_);                                                                                                   \
    } while (0)

/*
 * got(n) from the device under test against want(n) from the reference, both
 * of dtype dt: |got - want| <= tol[i] (tol NULL: equal values, +0 == -0).
 * Non-finite values must agree exactly (NaN with NaN, inf with the same
 * inf). Prints the first few disagreements; returns 1 when all agree.
 */
static int cmp_tol(uint32_t dt, const void *want, const void *got, size_t n, const double *tol, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int cmp_tol(uint32_t dt, const void *want, const void *got, size_t n, const double *tol, const char *fmt, ...) {
    char what[256];
    FORMAT_WHAT(what);
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
            if (bad < 4 && !g_quiet)
                fprintf(stderr, "  %s: [%zu] got %.9g, want %.9g (|diff| %.3g, tol %.3g)\n", what, i, g, w,
                        fabs(g - w), t);
            bad++;
        }
    }
    report(bad == 0, worst, what);
    if (bad && !g_quiet) fprintf(stderr, "    %zu of %zu values out of tolerance\n", bad, n);
    return bad == 0;
}

/* The same bits (a 16-bit or wider pattern), except that any NaN matches any
 * NaN: for cast and round_to. */
static int cmp_bits(uint32_t dt, const void *want, const void *got, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int cmp_bits(uint32_t dt, const void *want, const void *got, size_t n, const char *fmt, ...) {
    char what[256];
    FORMAT_WHAT(what);
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
                uint64_t bw = 0, bg = 0;
                memcpy(&bw, w, sz), memcpy(&bg, g, sz);
                fprintf(stderr, "  %s: [%zu] got %.9g (0x%llx), want %.9g (0x%llx)\n", what, i, elem(dt, got, i),
                        (unsigned long long)bg, elem(dt, want, i), (unsigned long long)bw);
            }
            bad++;
        }
    }
    report(bad == 0, bad ? INFINITY : 0.0, what);
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
    char what[256];
    FORMAT_WHAT(what);
    if (!ok && !g_quiet) fprintf(stderr, "  %s: norm-wise error %.3g exceeds %.3g\n", what, ratio, limit);
    report(ok, limit > 0 ? ratio / limit : ratio, what);
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
    char what[256];
    FORMAT_WHAT(what);
    if (!ok && !g_quiet) fprintf(stderr, "  %s: got %.17g, want %.17g (tol %.3g)\n", what, got, want, tol);
    report(ok, r, what);
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

/* ================================================ GEMM and bias */

#include "cuda_gemm_cases.inc"

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

/* ============================= optimizers, 1.5 elementwise, casts */

#include "cuda_ew_cases.inc"

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
 * in it), w(out, in) in w_dt (or, through 1.6's linear_forward_layout with
 * KILN_LAYOUT_IN_OUT, w(in, out): Conv1D), b(out) or none; y and post compared with
 * the GEMM bound of "Tolerances" plus the bias, one 16-bit ulp each where
 * rounded, and for post the activation's slope (<= 1.13) times y's bound
 * plus the elementwise tolerance. */
typedef struct lin_case {
    int rows, in, out, act, bias;
    uint32_t dt, w_dt, round;
    int entry; /* 0: linear_forward (1.3); 1 + KILN_LAYOUT_*: linear_forward_layout (1.6) */
} lin_case;

static void run_linear(const lin_case *L) {
    const size_t nx = (size_t)L->rows * L->in, nw = (size_t)L->out * L->in, ny = (size_t)L->rows * L->out;
    const uint32_t dt = L->dt;
    const size_t esz = kiln_dtype_size(dt);
    const int rounded = L->round == KILN_DTYPE_F16 || L->round == KILN_DTYPE_BF16;
    void *absx, *absw;
    void *x = make_operand(L->rows, L->in, L->in, dt, rounded ? L->round : dt, &absx);
    const int in_out = L->entry == 1 + KILN_LAYOUT_IN_OUT;
    void *w = in_out ? make_operand(L->in, L->out, L->out, L->w_dt, rounded ? L->round : L->w_dt, &absw)
                     : make_operand(L->out, L->in, L->in, L->w_dt, rounded ? L->round : L->w_dt, &absw);
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
        CU_ASSERT_EQUAL(RK->gemm_ex(RACC, 0, !in_out, L->rows, L->out, L->in, 1.0, absx, KILN_DTYPE_F64, L->in, absw,
                                    KILN_DTYPE_F64, in_out ? L->out : L->in, 0.0, S, KILN_DTYPE_F64, L->out,
                                    KILN_DTYPE_F32),
                        KILN_OK);
    } else {
        float *Sf = xcalloc(ny, sizeof *Sf);
        CU_ASSERT_EQUAL(RK->gemm(RACC, 0, !in_out, L->rows, L->out, L->in, 1.0f, absx, L->in, absw,
                                 in_out ? L->out : L->in, 0.0f, Sf, L->out),
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
        if (L->entry == 0)
            RUN(X, X->k->linear_forward(X->acc, dt, dx, dw, L->w_dt, db, L->rows, L->in, L->out, L->act, dy, dp,
                                        L->round));
        else if (X->k->struct_size < KILN_KERNELS_SIZE_1_6 || !X->k->linear_forward_layout) {
            X->failed = 1;
            CU_FAIL("the table lacks linear_forward_layout (1.6)");
        } else
            RUN(X, X->k->linear_forward_layout(X->acc, dt, dx, dw, L->w_dt, L->entry - 1, db, L->rows, L->in, L->out,
                                               L->act, dy, dp, L->round));
        down(X, y[s], dy, ny * esz);
        if (L->act >= 0) down(X, p[s], dp, ny * esz);
        ran &= end(X);
    }
    char label[160];
    snprintf(label, sizeof label, "%s %dx%d->%d %s w %s round %s act %s%s",
             L->entry == 0 ? "linear_forward" : in_out ? "linear_forward_layout (in, out)" : "linear_forward_layout",
             L->rows, L->in, L->out,
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
        {130, 784, 256, KILN_ACT_GELU, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, 0},
        {130, 784, 250, KILN_ACT_GELU, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, 0},
        {64, 100, 32, KILN_ACT_RELU, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, 0},
        {64, 100, 10, -1, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, 0},
        {33, 65, 17, KILN_ACT_TANH, 0, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, 0},
        /* mixed precision: 16-bit weights, one rounding after the bias */
        {128, 784, 256, KILN_ACT_GELU, 1, KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_BF16, 0},
        {128, 256, 10, -1, 1, KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_BF16, 0},
        {96, 300, 64, KILN_ACT_RELU, 1, KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_F16, 0},
        /* 16-bit weights without rounding: converted, an fp32 product, kiln's GELU */
        {64, 100, 48, KILN_ACT_GELU, 1, KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_F32, 0},
        /* fp64 */
        {40, 70, 30, KILN_ACT_RELU, 1, KILN_DTYPE_F64, KILN_DTYPE_F64, KILN_DTYPE_F32, 0},
        {40, 70, 24, KILN_ACT_GELU, 1, KILN_DTYPE_F64, KILN_DTYPE_F64, KILN_DTYPE_F32, 0},
        {40, 70, 24, KILN_ACT_TANH, 1, KILN_DTYPE_F64, KILN_DTYPE_F64, KILN_DTYPE_F64, 0}, /* F64 "rounding": none */
        /* K = 0: the bias alone */
        {5, 0, 8, KILN_ACT_SIGMOID, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, 0},
        /* 1.6: linear_forward_layout. GPT-2's Conv1D layers in bf16-mixed
         * (c_attn, c_fc with GELU, c_proj), fp32 and fp64, nn.Linear's layout */
        {128, 96, 288, -1, 1, KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_BF16, 1 + KILN_LAYOUT_IN_OUT},
        {128, 96, 384, KILN_ACT_GELU, 1, KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_BF16, 1 + KILN_LAYOUT_IN_OUT},
        {128, 384, 96, -1, 1, KILN_DTYPE_F32, KILN_DTYPE_BF16, KILN_DTYPE_BF16, 1 + KILN_LAYOUT_IN_OUT},
        {64, 100, 50, KILN_ACT_GELU, 1, KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F32, 1 + KILN_LAYOUT_IN_OUT},
        {40, 70, 24, KILN_ACT_RELU, 0, KILN_DTYPE_F64, KILN_DTYPE_F64, KILN_DTYPE_F32, 1 + KILN_LAYOUT_IN_OUT},
        {64, 100, 32, KILN_ACT_RELU, 1, KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_F16, 1 + KILN_LAYOUT_OUT_IN},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_linear(&cases[c]);
}

/* ====================================================== 1.4 sequence */

/* 1.9's sumsq_many: the cases the cpu accelerator and the fake GPU pass
 * (tests/support/sumsq_many_cases.h), on the device: each tensor's value
 * has the bits of sumsq_ex on that tensor. */
static void test_sumsq_many(void) {
    for (int s = 0; s < 2; s++) sumsq_many_run_all(g_side[s].k, g_side[s].acc);
}

/* 1.10's adamw_update_many: the same shared cases, on the device: each
 * tensor's p, m and v have the bits of its own adamw_update_ex launch (the
 * list kernel gives each tensor that launch's blocks and coefficients). */
static void test_adamw_many(void) {
    for (int s = 0; s < 2; s++) adamw_many_run_all(g_side[s].k, g_side[s].acc);
}

/* 1.10's add_layernorm_forward: the shared cases on the device: the fused
 * kernel's res, y, mean and rstd have the bits of the device's add and
 * layernorm_forward (the same operations, one pass). */
static void test_add_ln(void) {
    for (int s = 0; s < 2; s++) add_ln_run_all(g_side[s].k, g_side[s].acc);
}

/* 1.11's act_bias_backward and layernorm_backward_cast: the shared cases on
 * the device: the activation backward inside the bias sum's first pass,
 * and the layer norm's dx kernel storing the 16-bit copy, have the bits of
 * the device's entries they fuse. */
static void test_bwd_fuse(void) {
    for (int s = 0; s < 2; s++) bwd_fuse_run_all(g_side[s].k, g_side[s].acc);
}

#include "cuda_seq_cases.inc"
#include "cuda_act16_cases.inc"

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
 * paths are compared with the cpu one by separate runs), and
 * KILN_GPU_TEST_CACHING=0 its `caching` key. */
static const kiln_kv *default_config(const kiln_plugin_desc *d, kiln_kv *out, size_t cap) {
    size_t k = 0;
    const char *attn = getenv("KILN_GPU_TEST_ATTENTION"), *caching = getenv("KILN_GPU_TEST_CACHING");
    for (const kiln_param *p = d->params; p && p->key && k + 1 < cap; p++)
        if (p->def.type != KILN_TYPE_NONE) {
            out[k].key = p->key, out[k].value = p->def;
            if (attn && *attn && !strcmp(p->key, "attention") && p->def.type == KILN_TYPE_STRING)
                out[k].value.v.s = attn;
            if (caching && !strcmp(p->key, "caching") && p->def.type == KILN_TYPE_BOOL)
                out[k].value.v.i = strcmp(caching, "0") != 0;
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
    {"1.6 gemm_ex into a float16/bfloat16 C", test_gemm_ex_c16},
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
    {"1.9 sumsq_many: each tensor's sumsq_ex, bit for bit", test_sumsq_many},
    {"1.10 adamw_update_many: each tensor's adamw_update_ex, bit for bit", test_adamw_many},
    {"1.10 add_layernorm_forward: add then layernorm_forward, bit for bit", test_add_ln},
    {"1.11 act_bias_backward, layernorm_backward_cast: the entries they fuse, bit for bit", test_bwd_fuse},
    {"1.3 linear_forward, 1.6 linear_forward_layout: epilogues, 16-bit rounding, float64, Conv1D", test_linear_forward},
    {"cast, round_to", test_cast_round_to},
    {"1.5 lerp, sign, mul, addcmul, addcdiv, sqrt_ex, clamp: 2 dtypes, in place, edges", test_ew15},
    {"1.5 round_to float8_e4m3fn, float8_e5m2 (saturation, NaN, inf)", test_round_fp8},
    {"1.4 embedding forward/backward: tables, rewritten tokens, bad token", test_seq_embedding},
    {"1.4 layernorm forward/backward: affine or not, 16-bit outputs, accumulate", test_seq_layernorm},
    {"1.4 xent_fused: ignored rows, masked classes, padding, bad targets", test_seq_xent},
    {"1.6 xent_fused on bfloat16/float16 logits", test_seq_xent16},
    {"1.4 add: apart and in place", test_seq_add},
    {"1.4 attention forward/backward: 3 shapes, bf16 and f16 outputs", test_seq_attention},
    {"1.7 16-bit activation storage (layernorm, linear, attention, act_backward, bias_grad, add) vs float32 rounded",
     test_act16},
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
