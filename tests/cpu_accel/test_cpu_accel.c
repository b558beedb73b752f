/*
 * test_cpu_accel.c — the "cpu" accelerator plugin (libkiln-cpu.so) loaded
 * through the test host, as the real host would load it. Every entry of its
 * kiln_kernels table is checked against a direct double-precision computation
 * written here (naive loops, not the kernels library), so the test sees the
 * plugin's wiring (argument order, transposes, leading dimensions) as well as
 * the numbers. Also: the table's struct_size covers every entry, memory is
 * 64-byte aligned and zero-filled, an impossible allocation is KILN_E_NOMEM
 * with the size in the message, an out-of-range label is KILN_E_DATA naming
 * the row and the label, all_finite sees NaN and both infinities, and
 * configure() sizes the thread pools without changing any result. For the
 * ABI 1.2 entries: all present, every dtype they do not take refused with
 * KILN_E_INVALID_ARG and a message naming the entry and the dtype, cast and
 * round_to against the compiler's _Float16 (or an exact search without one), gemm_ex with a float16 operand
 * and rounded output against a double computation, and each `_ex` entry in
 * float32 (equal to the 1.1 entry) and float64 (against double formulas);
 * the GAN activations (tanh, sigmoid, leaky ReLU) of act_forward/act_backward
 * against double formulas, at large |x|, in place, and unknown act ids
 * refused. For the ABI 1.3 entries: unscale_check over a list (every
 * tensor scaled, inf, NaN and overflow seen, float64, refusals) and
 * linear_forward against double formulas and bit for bit against the 1.2
 * sequence it stands for. For ABI 1.7, the 16-bit activation storage of
 * the eight entries that take it (tests/support/act16_cases.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include <kiln/testing.h>

#include "act16_cases.h"
#include "adamw_many_cases.h"
#include "add_ln_cases.h"
#include "bwd_fuse_cases.h"
#include "sumsq_many_cases.h"
#include "half_bits.h"
#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

static const kiln_plugin_desc *g_desc;
static const kiln_accelerator_ops *g_ops;
static kiln_instance *g_acc;
static const kiln_kernels *g_k;

static int suite_init(void) { return fixture_accel_open(g_th, "cpu", "cpu", &g_desc, &g_ops, &g_acc, &g_k); }

static int suite_clean(void) {
    fixture_accel_close(g_th, g_ops, &g_acc);
    return 0;
}

/* |got - want| <= tol * (1 + |want|) */
static int close_to(double got, double want, double tol) { return fabs(got - want) <= tol * (1.0 + fabs(want)); }

/* Deterministic values in [-1, 1) (tests/support), as float. */
static float val(unsigned i, unsigned salt) { return (float)fixture_val(i, salt); }

/* ------------------------------------------------------------ descriptor */

static void test_descriptor(void) {
    CU_ASSERT_EQUAL(g_desc->kind, KILN_KIND_ACCELERATOR);
    CU_ASSERT_STRING_EQUAL(g_desc->name, "cpu");
    CU_ASSERT_STRING_EQUAL(kiln_kv_str(g_desc->properties, "device_type", ""), "cpu");
    CU_ASSERT_TRUE(g_ops->base.struct_size >= sizeof(kiln_accelerator_ops));
    CU_ASSERT_PTR_NOT_NULL(g_ops->kernels);
    CU_ASSERT_PTR_NOT_NULL(g_ops->configure);

    /* struct_size must reach the last 1.2 entry, and every function pointer
     * from alloc to struct_size must be set (walked generically, so an entry
     * appended later is covered too). */
    CU_ASSERT_TRUE(g_k->struct_size >= offsetof(kiln_kernels, adamw_update) + sizeof g_k->adamw_update);
    size_t first = offsetof(kiln_kernels, alloc);
    typedef void (*any_fn)(void);
    int n = 0;
    for (size_t off = first; off + sizeof(any_fn) <= g_k->struct_size; off += sizeof(any_fn), n++) {
        any_fn f;
        memcpy(&f, (const char *)g_k + off, sizeof f);
        if (!f) fprintf(stderr, "kernel table entry at offset %zu is NULL\n", off);
        CU_ASSERT_PTR_NOT_NULL((void *)(uintptr_t)f);
    }
    /* alloc .. adamw_update (21 in ABI 1.1), cast .. adamw_update_ex (15
     * appended in 1.2), unscale_check, linear_forward (1.3), the 8
     * sequence entries embedding_forward .. add (1.4), the 7
     * elementwise ones lerp .. clamp (1.5; tests/kernels_ew) and
     * linear_forward_layout (1.6), sumsq_many (1.9),
     * adamw_update_many and add_layernorm_forward (1.10),
     * act_bias_backward and layernorm_backward_cast (1.11) */
    CU_ASSERT_EQUAL(n, 59);
    CU_ASSERT_TRUE(g_k->struct_size >= KILN_KERNELS_SIZE_1_11);
    CU_ASSERT_TRUE(g_k->flags & KILN_KERNELS_STORE_16BIT);
}

/* ---------------------------------------------------------------- memory */

static void test_alloc(void) {
    static const size_t sizes[] = {0, 1, 3, 63, 64, 100, 4097, 1u << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        void *p = NULL;
        CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, sizes[s], &p), KILN_OK);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        CU_ASSERT_EQUAL((uintptr_t)p % 64, 0);
        const unsigned char *b = p;
        size_t nonzero = 0;
        for (size_t i = 0; i < sizes[s]; i++) nonzero += b[i] != 0;
        CU_ASSERT_EQUAL(nonzero, 0);
        memset(p, 0xAB, sizes[s]); /* the whole requested size is writable */
        g_k->free(g_acc, p);
    }
    /* Memory that was dirtied and freed comes back zeroed. */
    for (int round = 0; round < 4; round++) {
        unsigned char *p = NULL;
        CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, 8192, (void **)&p), KILN_OK);
        int zero = 1;
        for (int i = 0; i < 8192; i++) zero &= p[i] == 0;
        CU_ASSERT_TRUE(zero);
        memset(p, 0xCD, 8192);
        g_k->free(g_acc, p);
    }
    /* A size no allocator can satisfy: KILN_E_NOMEM naming the size. */
    void *p = (void *)&p;
    size_t huge = SIZE_MAX - 8;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(g_k->alloc(g_acc, huge, &p), KILN_E_NOMEM);
    CU_ASSERT_PTR_NULL(p);
    char num[32];
    snprintf(num, sizeof num, "%zu", huge);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), num));
    g_k->free(g_acc, NULL); /* a no-op */
}

static void test_copy_zero_sync(void) {
    float host[37], back[37];
    for (int i = 0; i < 37; i++) host[i] = val(i, 1);
    float *d1 = NULL, *d2 = NULL;
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, sizeof host, (void **)&d1), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, sizeof host, (void **)&d2), KILN_OK);
    CU_ASSERT_EQUAL(g_k->copy(g_acc, d1, host, sizeof host, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(g_k->copy(g_acc, d2, d1, sizeof host, KILN_COPY_D2D), KILN_OK);
    memset(back, 0, sizeof back);
    CU_ASSERT_EQUAL(g_k->copy(g_acc, back, d2, sizeof host, KILN_COPY_D2H), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(back, host, sizeof host), 0);
    /* A partial copy touches only its bytes. */
    CU_ASSERT_EQUAL(g_k->copy(g_acc, d2 + 5, d1, 3 * sizeof(float), KILN_COPY_D2D), KILN_OK);
    CU_ASSERT_EQUAL(d2[4], host[4]);
    CU_ASSERT_EQUAL(d2[5], host[0]);
    CU_ASSERT_EQUAL(d2[7], host[2]);
    CU_ASSERT_EQUAL(d2[8], host[8]);
    CU_ASSERT_EQUAL(g_k->copy(g_acc, NULL, NULL, 0, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(g_k->copy(g_acc, d1, host, 4, 7), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "kind"));

    /* zero clears exactly the bytes asked for. */
    CU_ASSERT_EQUAL(g_k->zero(g_acc, d1 + 2, 10 * sizeof(float)), KILN_OK);
    for (int i = 0; i < 37; i++) CU_ASSERT_EQUAL(d1[i], (i >= 2 && i < 12) ? 0.0f : host[i]);
    CU_ASSERT_EQUAL(g_k->synchronize(g_acc), KILN_OK);
    g_k->free(g_acc, d1);
    g_k->free(g_acc, d2);
}

/* ------------------------------------------------------------------ GEMM */

/* C = alpha op(A) op(B) + beta C in double, from the stored layouts. */
static double ref_gemm_elem(int ta, int tb, int i, int j, int K, const float *A, int lda, const float *B, int ldb) {
    double s = 0.0;
    for (int k = 0; k < K; k++) {
        double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
        double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
        s += a * b;
    }
    return s;
}

static void check_gemm(int M, int N, int K, float alpha, float beta) {
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            /* Leading dimensions wider than the rows, to catch ld mix-ups. */
            int a_rows = ta ? K : M, a_cols = ta ? M : K;
            int b_rows = tb ? N : K, b_cols = tb ? K : N;
            int lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 2;
            float *A = calloc((size_t)a_rows * lda + 1, sizeof *A);
            float *B = calloc((size_t)b_rows * ldb + 1, sizeof *B);
            float *C = calloc((size_t)M * ldc + 1, sizeof *C);
            float *C0 = calloc((size_t)M * ldc + 1, sizeof *C0);
            for (int i = 0; i < a_rows * lda; i++) A[i] = val(i, 10 + ta);
            for (int i = 0; i < b_rows * ldb; i++) B[i] = val(i, 20 + tb);
            for (int i = 0; i < M * ldc; i++) C[i] = C0[i] = val(i, 30);
            CU_ASSERT_EQUAL_FATAL(g_k->gemm(g_acc, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), KILN_OK);
            int bad = 0;
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < ldc; j++) {
                    double got = C[(size_t)i * ldc + j];
                    double want = j < N ? alpha * ref_gemm_elem(ta, tb, i, j, K, A, lda, B, ldb) +
                                              beta * (double)C0[(size_t)i * ldc + j]
                                        : C0[(size_t)i * ldc + j]; /* padding untouched */
                    if (!close_to(got, want, 1e-5)) {
                        if (bad++ < 3)
                            fprintf(stderr, "gemm ta=%d tb=%d %dx%dx%d C[%d,%d] = %.8g, expected %.8g\n", ta, tb, M,
                                    N, K, i, j, got, want);
                    }
                }
            }
            CU_ASSERT_EQUAL(bad, 0);
            free(A);
            free(B);
            free(C);
            free(C0);
        }
    }
}

static void test_gemm(void) {
    check_gemm(3, 4, 5, 0.75f, -0.5f);
    check_gemm(37, 29, 41, 1.0f, 0.0f);
    check_gemm(64, 48, 96, -1.25f, 1.0f);

    /* beta == 0: C is not read, so NaN there disappears. */
    float A[2 * 3] = {1, 2, 3, 4, 5, 6}, B[3 * 2] = {1, 0, 0, 1, 1, 1}, C[4] = {NAN, NAN, NAN, NAN};
    CU_ASSERT_EQUAL(g_k->gemm(g_acc, 0, 0, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2), KILN_OK);
    CU_ASSERT_EQUAL(C[0], 4.0f);
    CU_ASSERT_EQUAL(C[1], 5.0f);
    CU_ASSERT_EQUAL(C[2], 10.0f);
    CU_ASSERT_EQUAL(C[3], 11.0f);

    /* Bad shapes are refused with a message, not handed to BLAS. */
    CU_ASSERT_EQUAL(g_k->gemm(g_acc, 0, 0, 2, 2, 3, 1.0f, A, 2, B, 2, 0.0f, C, 2), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "lda"));
    CU_ASSERT_EQUAL(g_k->gemm(g_acc, 0, 0, -1, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2), KILN_E_INVALID_ARG);
}

/* ------------------------------------------------------ bias, activations */

static void test_bias(void) {
    enum { R = 3, Cc = 4 };
    float y[R * Cc], y0[R * Cc], b[Cc], db[Cc];
    for (int i = 0; i < R * Cc; i++) y[i] = y0[i] = val(i, 40);
    for (int j = 0; j < Cc; j++) b[j] = val(j, 41);
    CU_ASSERT_EQUAL(g_k->bias_add(g_acc, y, b, R, Cc), KILN_OK);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < Cc; j++) CU_ASSERT_EQUAL(y[i * Cc + j], y0[i * Cc + j] + b[j]);

    for (int j = 0; j < Cc; j++) db[j] = 100.0f;
    CU_ASSERT_EQUAL(g_k->bias_grad(g_acc, db, y0, R, Cc, 0), KILN_OK);
    for (int j = 0; j < Cc; j++) {
        double s = 0;
        for (int i = 0; i < R; i++) s += y0[i * Cc + j];
        CU_ASSERT_TRUE(close_to(db[j], s, 1e-6));
    }
    CU_ASSERT_EQUAL(g_k->bias_grad(g_acc, db, y0, R, Cc, 1), KILN_OK); /* accumulate: doubles */
    for (int j = 0; j < Cc; j++) {
        double s = 0;
        for (int i = 0; i < R; i++) s += y0[i * Cc + j];
        CU_ASSERT_TRUE(close_to(db[j], 2 * s, 1e-6));
    }
}

static double gelu_ref(double x) {
    const double c = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}

static double gelu_grad_ref(double x) {
    const double c = sqrt(2.0 / 3.14159265358979323846);
    double t = tanh(c * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

static void test_activations(void) {
    enum { N = 101 };
    float x[N], y[N], dy[N], dx[N];
    for (int i = 0; i < N; i++) {
        x[i] = -6.0f + 12.0f * (float)i / (N - 1); /* includes 0 at i = 50 */
        dy[i] = val(i, 50);
    }
    CU_ASSERT_EQUAL(g_k->relu_forward(g_acc, y, x, N), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(y[i], x[i] > 0 ? x[i] : 0.0f);
    CU_ASSERT_EQUAL(g_k->relu_backward(g_acc, dx, dy, x, N), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(dx[i], x[i] > 0 ? dy[i] : 0.0f);

    CU_ASSERT_EQUAL(g_k->gelu_forward(g_acc, y, x, N), KILN_OK);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += !close_to(y[i], gelu_ref(x[i]), 2e-6);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(g_k->gelu_backward(g_acc, dx, dy, x, N), KILN_OK);
    bad = 0;
    for (int i = 0; i < N; i++) bad += !close_to(dx[i], dy[i] * gelu_grad_ref(x[i]), 2e-6);
    CU_ASSERT_EQUAL(bad, 0);
}

/* The GAN activations through act_forward / act_backward, both dtypes,
 * against double formulas written here: tanh, sigmoid, leaky ReLU (slope
 * 0.2); dx = dy * f'(x) with x the forward INPUT; large |x| stays finite
 * with the right limits; in place works; an unknown act id is refused. */
static double gan_act_ref(int32_t act, double x) {
    if (act == KILN_ACT_TANH) return tanh(x);
    if (act == KILN_ACT_SIGMOID) return 1.0 / (1.0 + exp(-x));
    return x > 0 ? x : 0.2 * x;
}
static double gan_act_grad_ref(int32_t act, double x) {
    if (act == KILN_ACT_TANH) return 1.0 / (cosh(x) * cosh(x));
    if (act == KILN_ACT_SIGMOID) {
        const double s = 1.0 / (1.0 + exp(-x));
        return s * (1.0 - s);
    }
    return x > 0 ? 1.0 : 0.2;
}

/* Element i of a float32 or float64 array. */
static double elem(uint32_t dt, const void *p, int i) {
    return dt == KILN_DTYPE_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

/* act_forward of x into y and act_backward of dy into dx, in dtype dt,
 * against the references (tolerances tol_f and tol_b): each call succeeds
 * and no element is off. */
static void check_act(int32_t act, uint32_t dt, void *y, void *dx, const void *x, const void *dy, int n, double tol_f,
                      double tol_b) {
    int bad = 0;
    CU_ASSERT_EQUAL(g_k->act_forward(g_acc, dt, act, y, x, (size_t)n), KILN_OK);
    for (int i = 0; i < n; i++) bad += !close_to(elem(dt, y, i), gan_act_ref(act, elem(dt, x, i)), tol_f);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(g_k->act_backward(g_acc, dt, act, dx, dy, x, (size_t)n), KILN_OK);
    bad = 0;
    for (int i = 0; i < n; i++)
        bad += !close_to(elem(dt, dx, i), elem(dt, dy, i) * gan_act_grad_ref(act, elem(dt, x, i)), tol_b);
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_gan_activations(void) {
    enum { N = 121 };
    float xf[N], yf[N], dyf[N], dxf[N], inpl[N];
    double xd[N], yd[N], dyd[N], dxd[N];
    for (int i = 0; i < N; i++) {
        xd[i] = xf[i] = -12.0f + 24.0f * (float)i / (N - 1); /* 0 at i = 60 */
        dyd[i] = dyf[i] = val(i, 60);
    }
    const int32_t acts[3] = {KILN_ACT_TANH, KILN_ACT_SIGMOID, KILN_ACT_LEAKY_RELU};
    for (int a = 0; a < 3; a++) {
        const int32_t act = acts[a];
        check_act(act, KILN_DTYPE_F32, yf, dxf, xf, dyf, N, 1e-6, 1e-6);
        memcpy(inpl, dyf, sizeof inpl); /* dx may alias dy */
        CU_ASSERT_EQUAL(g_k->act_backward(g_acc, KILN_DTYPE_F32, act, inpl, inpl, xf, N), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(inpl, dxf, sizeof inpl), 0);
        check_act(act, KILN_DTYPE_F64, yd, dxd, xd, dyd, N, 1e-14, 1e-13);
    }
    /* exact leaky values: 0.2 as float in F32, as double in F64 */
    CU_ASSERT_EQUAL(g_k->act_forward(g_acc, KILN_DTYPE_F32, KILN_ACT_LEAKY_RELU, yf, xf, N), KILN_OK);
    CU_ASSERT_EQUAL(yf[0], -12.0f * 0.2f);
    CU_ASSERT_EQUAL(yf[N - 1], 12.0f);
    CU_ASSERT_EQUAL(g_k->act_forward(g_acc, KILN_DTYPE_F64, KILN_ACT_LEAKY_RELU, yd, xd, N), KILN_OK);
    CU_ASSERT_EQUAL(yd[0], -12.0 * 0.2);

    /* large |x|: the limits, finite gradients, no NaN */
    const float big[6] = {1e6f, -1e6f, 500.0f, -500.0f, INFINITY, -INFINITY};
    const float ones[6] = {1, 1, 1, 1, 1, 1};
    float by[6], bg[6];
    CU_ASSERT_EQUAL(g_k->act_forward(g_acc, KILN_DTYPE_F32, KILN_ACT_TANH, by, big, 6), KILN_OK);
    CU_ASSERT_EQUAL(g_k->act_backward(g_acc, KILN_DTYPE_F32, KILN_ACT_TANH, bg, ones, big, 6), KILN_OK);
    for (int i = 0; i < 6; i++) {
        CU_ASSERT_EQUAL(by[i], i % 2 ? -1.0f : 1.0f);
        CU_ASSERT_EQUAL(bg[i], 0.0f);
    }
    CU_ASSERT_EQUAL(g_k->act_forward(g_acc, KILN_DTYPE_F32, KILN_ACT_SIGMOID, by, big, 6), KILN_OK);
    CU_ASSERT_EQUAL(g_k->act_backward(g_acc, KILN_DTYPE_F32, KILN_ACT_SIGMOID, bg, ones, big, 6), KILN_OK);
    for (int i = 0; i < 6; i++) {
        CU_ASSERT_EQUAL(by[i], i % 2 ? 0.0f : 1.0f);
        CU_ASSERT_EQUAL(bg[i], 0.0f);
    }
    double bd[6], bdy[6], bdg[6];
    for (int i = 0; i < 6; i++) bd[i] = big[i], bdy[i] = 1.0;
    CU_ASSERT_EQUAL(g_k->act_forward(g_acc, KILN_DTYPE_F64, KILN_ACT_SIGMOID, bdg, bd, 6), KILN_OK);
    for (int i = 0; i < 6; i++)
        if (i != 3) CU_ASSERT_EQUAL(bdg[i], i % 2 ? 0.0 : 1.0);
    CU_ASSERT_TRUE(close_to(bdg[3] / exp(-500.0), 1.0, 1e-14)); /* 7e-218: a normal double */
    CU_ASSERT_EQUAL(g_k->act_backward(g_acc, KILN_DTYPE_F64, KILN_ACT_TANH, bdg, bdy, bd, 6), KILN_OK);
    for (int i = 0; i < 6; i++) CU_ASSERT_EQUAL(bdg[i], 0.0);

    /* unknown act ids: KILN_E_INVALID_ARG naming the entry, nothing written */
    float keep[4] = {7, 7, 7, 7}, src[4] = {1, 2, 3, 4};
    const int32_t bad_acts[3] = {5, -1, 1000};
    for (int i = 0; i < 3; i++) {
        int32_t rc = g_k->act_forward(g_acc, KILN_DTYPE_F32, bad_acts[i], keep, src, 4);
        CU_ASSERT_EQUAL(rc, KILN_E_INVALID_ARG);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "act_forward: act must be"));
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "KILN_ACT_LEAKY_RELU (4)"));
        rc = g_k->act_backward(g_acc, KILN_DTYPE_F32, bad_acts[i], keep, src, src, 4);
        CU_ASSERT_EQUAL(rc, KILN_E_INVALID_ARG);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "act_backward: act must be"));
        kiln_test_clear_error(g_th);
        kiln_test_clear_error(g_th);
    }
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(keep[i], 7.0f);
}

/* ------------------------------------------------------------------- loss */

static void test_softmax_xent(void) {
    enum { B = 4, C = 5 };
    float logits[B * C], probs[B * C], dl[B * C];
    int32_t labels[B] = {0, 3, 4, 2};
    for (int i = 0; i < B * C; i++) logits[i] = 3.0f * val(i, 60);
    logits[1 * C + 3] = 5.0f; /* row 1 predicts its label */
    float loss = 0;
    int32_t correct = -1;
    CU_ASSERT_EQUAL_FATAL(g_k->softmax_xent_forward(g_acc, probs, logits, labels, B, C, &loss, &correct), KILN_OK);
    double want_loss = 0;
    int want_correct = 0;
    for (int b = 0; b < B; b++) {
        const float *l = logits + b * C;
        double mx = l[0], z = 0;
        int arg = 0;
        for (int j = 1; j < C; j++)
            if (l[j] > mx) mx = l[j], arg = j;
        for (int j = 0; j < C; j++) z += exp(l[j] - mx);
        for (int j = 0; j < C; j++) CU_ASSERT_TRUE(close_to(probs[b * C + j], exp(l[j] - mx) / z, 1e-6));
        want_loss += -(l[labels[b]] - mx - log(z));
        want_correct += arg == labels[b];
    }
    want_loss /= B;
    CU_ASSERT_TRUE(close_to(loss, want_loss, 1e-6));
    CU_ASSERT_EQUAL(correct, want_correct);
    CU_ASSERT_TRUE(want_correct >= 1);
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, probs, logits, labels, B, C, &loss, NULL), KILN_OK);

    const float dloss = 0.5f;
    CU_ASSERT_EQUAL(g_k->softmax_xent_backward(g_acc, dl, probs, labels, B, C, dloss), KILN_OK);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < C; j++) {
            double want = dloss * ((double)probs[b * C + j] - (j == labels[b])) / B;
            CU_ASSERT_TRUE(close_to(dl[b * C + j], want, 1e-6));
        }

    /* A label outside [0, C): KILN_E_DATA, naming the row and the value. */
    int32_t bad[B] = {0, 7, 1, 2};
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, probs, logits, bad, B, C, &loss, &correct), KILN_E_DATA);
    CU_ASSERT_EQUAL(kiln_test_error_code(g_th), KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "label 7"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "index 1"));
    int32_t neg[B] = {0, 1, -1, 2};
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, probs, logits, neg, B, C, &loss, NULL), KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "label -1"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "index 2"));
    CU_ASSERT_EQUAL(g_k->softmax_xent_backward(g_acc, dl, probs, bad, B, C, 1.0f), KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "label 7"));

    /* A NaN logit with valid labels is a NaN loss, not a data error. */
    logits[2] = NAN;
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, probs, logits, labels, B, C, &loss, NULL), KILN_OK);
    CU_ASSERT_TRUE(isnan(loss));
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, probs, logits, labels, 0, C, &loss, NULL), KILN_E_INVALID_ARG);
}

/* ---------------------------------------------------- reductions, BLAS-1 */

static void test_reductions(void) {
    enum { N = 1000 };
    float x[N], y[N], y0[N];
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) {
        x[i] = val(i, 70);
        y[i] = y0[i] = val(i, 71);
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    double out = 0;
    CU_ASSERT_EQUAL(g_k->sum(g_acc, x, N, &out), KILN_OK);
    CU_ASSERT_TRUE(close_to(out, s, 1e-12));
    CU_ASSERT_EQUAL(g_k->sumsq(g_acc, x, N, &out), KILN_OK);
    CU_ASSERT_TRUE(close_to(out, s2, 1e-12));

    CU_ASSERT_EQUAL(g_k->axpy(g_acc, y, -0.25f, x, N), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_TRUE(close_to(y[i], y0[i] + -0.25 * x[i], 1e-7));
    CU_ASSERT_EQUAL(g_k->scale(g_acc, y0, 3.0f, N), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(y0[i], 3.0f * val(i, 71));

    int32_t fin = -1;
    CU_ASSERT_EQUAL(g_k->all_finite(g_acc, x, N, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 1);
    const float specials[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        float keep = x[N - 7];
        x[N - 7] = specials[k];
        fin = -1;
        CU_ASSERT_EQUAL(g_k->all_finite(g_acc, x, N, &fin), KILN_OK);
        CU_ASSERT_EQUAL(fin, 0);
        x[N - 7] = keep;
    }
    fin = -1;
    CU_ASSERT_EQUAL(g_k->all_finite(g_acc, NULL, 0, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 1);
}

/* -------------------------------------------------------------- optimizers */

static void test_optimizer_kernels(void) {
    enum { N = 9 };
    float p[N], g[N], buf[N];
    double rp[N], rb[N];
    const float lr = 0.1f, mom = 0.9f, wd = 0.01f;
    for (int i = 0; i < N; i++) {
        p[i] = val(i, 80);
        g[i] = val(i, 81);
        rp[i] = p[i];
    }
    /* Two Nesterov steps with weight decay, from torch.optim.SGD's rules. */
    for (int step = 0; step < 2; step++) {
        CU_ASSERT_EQUAL(g_k->sgd_update(g_acc, p, g, buf, N, lr, mom, 0.0f, 1, wd, step == 0), KILN_OK);
        for (int i = 0; i < N; i++) {
            double d = g[i] + (double)wd * rp[i];
            rb[i] = step == 0 ? d : (double)mom * rb[i] + d;
            d = d + (double)mom * rb[i];
            rp[i] -= (double)lr * d;
            CU_ASSERT_TRUE(close_to(p[i], rp[i], 1e-6));
            CU_ASSERT_TRUE(close_to(buf[i], rb[i], 1e-6));
        }
    }
    CU_ASSERT_EQUAL(g_k->sgd_update(g_acc, p, g, NULL, N, lr, mom, 0.0f, 0, 0.0f, 1), KILN_E_INVALID_ARG);

    /* Two AdamW steps, from torch.optim.AdamW's rules. */
    float m[N] = {0}, v[N] = {0};
    double rm[N] = {0}, rv[N] = {0};
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    for (int i = 0; i < N; i++) rp[i] = p[i];
    for (int step = 1; step <= 2; step++) {
        CU_ASSERT_EQUAL(g_k->adamw_update(g_acc, p, g, m, v, N, lr, b1, b2, eps, wd, step), KILN_OK);
        for (int i = 0; i < N; i++) {
            rp[i] *= 1.0 - (double)lr * wd;
            rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1.0 - b2) * (double)g[i] * g[i];
            double mhat = rm[i] / (1.0 - pow(b1, step)), vh = rv[i] / (1.0 - pow(b2, step));
            rp[i] -= (double)lr * mhat / (sqrt(vh) + eps);
            CU_ASSERT_TRUE(close_to(p[i], rp[i], 1e-6));
            CU_ASSERT_TRUE(close_to(m[i], rm[i], 1e-6));
            CU_ASSERT_TRUE(close_to(v[i], rv[i], 1e-6));
        }
    }
    CU_ASSERT_EQUAL(g_k->adamw_update(g_acc, p, g, m, v, N, lr, b1, b2, eps, wd, 0), KILN_E_INVALID_ARG);
}

/* ------------------------------------------------- 1.2: other dtypes */

/* Every 1.2 entry, by name (the generic walk above counts them too). */
static void test_table_1_2(void) {
    CU_ASSERT_TRUE(g_k->struct_size >= KILN_KERNELS_SIZE_1_2);
    CU_ASSERT_PTR_NOT_NULL(g_k->cast);
    CU_ASSERT_PTR_NOT_NULL(g_k->round_to);
    CU_ASSERT_PTR_NOT_NULL(g_k->gemm_ex);
    CU_ASSERT_PTR_NOT_NULL(g_k->bias_add_ex);
    CU_ASSERT_PTR_NOT_NULL(g_k->bias_grad_ex);
    CU_ASSERT_PTR_NOT_NULL(g_k->act_forward);
    CU_ASSERT_PTR_NOT_NULL(g_k->act_backward);
    CU_ASSERT_PTR_NOT_NULL(g_k->softmax_xent_forward_ex);
    CU_ASSERT_PTR_NOT_NULL(g_k->softmax_xent_backward_ex);
    CU_ASSERT_PTR_NOT_NULL(g_k->sumsq_ex);
    CU_ASSERT_PTR_NOT_NULL(g_k->all_finite_ex);
    CU_ASSERT_PTR_NOT_NULL(g_k->scale_ex);
    CU_ASSERT_PTR_NOT_NULL(g_k->axpy_ex);
    CU_ASSERT_PTR_NOT_NULL(g_k->sgd_update_ex);
    CU_ASSERT_PTR_NOT_NULL(g_k->adamw_update_ex);
}

/* rc is KILN_E_INVALID_ARG and the message contains both fragments. */
static int rejected(int32_t rc, const char *frag1, const char *frag2) {
    int ok = rc == KILN_E_INVALID_ARG && kiln_test_error_code(g_th) == KILN_E_INVALID_ARG && strstr(kiln_test_error(g_th), frag1) &&
             (!frag2 || strstr(kiln_test_error(g_th), frag2));
    if (!ok) fprintf(stderr, "expected INVALID_ARG with '%s'/'%s', got rc %d: %s\n", frag1, frag2 ? frag2 : "",
                     (int)rc, kiln_test_error(g_th));
    kiln_test_clear_error(g_th);
    kiln_test_clear_error(g_th);
    return ok;
}

/* The `_ex` entries take float32 or float64 only; anything else is refused
 * with a message naming the entry and the dtype it got. */
static void test_ex_bad_dtypes(void) {
    float f[8] = {0}, f2[8] = {0};
    int32_t labels[2] = {0, 1}, fin;
    double out;
    const uint32_t bad_dts[3] = {KILN_DTYPE_F16, KILN_DTYPE_I32, 99};
    const char *names[3] = {"float16 (3)", "int32 (5)", "invalid (99)"};
    for (int k = 0; k < 3; k++) {
        const uint32_t dt = bad_dts[k];
        const char *nm = names[k];
        CU_ASSERT(rejected(g_k->bias_add_ex(g_acc, dt, f, f2, 2, 2), "bias_add_ex: dtype must be float32 or float64", nm));
        /* 1.7 takes float16 (16-bit activation storage) in these two */
        if (dt != KILN_DTYPE_F16) CU_ASSERT(rejected(g_k->bias_grad_ex(g_acc, dt, f, f2, 2, 2, 0), "bias_grad_ex", nm));
        CU_ASSERT(rejected(g_k->act_forward(g_acc, dt, KILN_ACT_RELU, f, f2, 4), "act_forward", nm));
        if (dt != KILN_DTYPE_F16)
            CU_ASSERT(rejected(g_k->act_backward(g_acc, dt, KILN_ACT_GELU, f, f2, f2, 4), "act_backward", nm));
        CU_ASSERT(rejected(g_k->softmax_xent_forward_ex(g_acc, dt, f, f2, labels, 2, 2, &out, NULL),
                           "softmax_xent_forward_ex", nm));
        CU_ASSERT(rejected(g_k->softmax_xent_backward_ex(g_acc, dt, f, f2, labels, 2, 2, 1.0),
                           "softmax_xent_backward_ex", nm));
        CU_ASSERT(rejected(g_k->sumsq_ex(g_acc, dt, f, 4, &out), "sumsq_ex", nm));
        CU_ASSERT(rejected(g_k->all_finite_ex(g_acc, dt, f, 4, &fin), "all_finite_ex", nm));
        CU_ASSERT(rejected(g_k->scale_ex(g_acc, dt, f, 2.0, 4), "scale_ex", nm));
        CU_ASSERT(rejected(g_k->axpy_ex(g_acc, dt, f, 2.0, f2, 4), "axpy_ex", nm));
        CU_ASSERT(rejected(g_k->sgd_update_ex(g_acc, dt, f, f2, NULL, 4, 0.1, 0.0, 0.0, 0, 0.0, 1), "sgd_update_ex", nm));
        CU_ASSERT(rejected(g_k->adamw_update_ex(g_acc, dt, f, f2, f, f, 4, 0.1, 0.9, 0.999, 1e-8, 0.0, 1),
                           "adamw_update_ex", nm));
    }
    for (int i = 0; i < 8; i++) CU_ASSERT_EQUAL(f[i], 0.0f); /* nothing written */

    /* cast and round_to */
    CU_ASSERT(rejected(g_k->cast(g_acc, f, KILN_DTYPE_I32, f2, KILN_DTYPE_F32, 4), "cast: dst_dtype", "int32"));
    CU_ASSERT(rejected(g_k->cast(g_acc, f, KILN_DTYPE_F32, f2, KILN_DTYPE_U8, 4), "cast: src_dtype", "uint8"));
    CU_ASSERT(rejected(g_k->cast(g_acc, f, KILN_DTYPE_F16, f + 1, KILN_DTYPE_F32, 4), "cast", "overlap"));
    CU_ASSERT(rejected(g_k->cast(g_acc, NULL, KILN_DTYPE_F16, f, KILN_DTYPE_F32, 4), "cast", "NULL"));
    CU_ASSERT(rejected(g_k->round_to(g_acc, f, KILN_DTYPE_F64, 4), "round_to", "float64"));

    /* gemm_ex's combinations */
    double d[4] = {0};
    uint16_t h[4] = {0};
    /* (K, A, its dtype, B, its dtype, C, its dtype, round_dtype) with M = N = 2
     * and every leading dimension 2, and the message's two parts */
    const struct {
        int32_t K;
        const void *a;
        uint32_t at;
        const void *b;
        uint32_t bt;
        void *c;
        uint32_t ct, rt;
        const char *what, *detail;
    } bad_gemm[] = {
        {2, h, KILN_DTYPE_F16, d, KILN_DTYPE_F64, d, KILN_DTYPE_F64, KILN_DTYPE_F32, "gemm_ex: c_dtype float64 needs float64 A and B, got a_dtype float16", NULL},
        {2, d, KILN_DTYPE_F64, f, KILN_DTYPE_F32, d, KILN_DTYPE_F64, KILN_DTYPE_F32, "gemm_ex: c_dtype float64 needs float64 A and B, got b_dtype float32", NULL},
        {2, d, KILN_DTYPE_F64, f, KILN_DTYPE_F32, f, KILN_DTYPE_F32, KILN_DTYPE_F32, "gemm_ex: c_dtype float32 needs float32, float16 or bfloat16 A and B, got a_dtype float64", NULL},
        {2, f, KILN_DTYPE_F32, f2, KILN_DTYPE_F32, h, KILN_DTYPE_F16, KILN_DTYPE_F32, "gemm_ex: c_dtype float16 takes round_dtype float16", "got float32"},
        {2, f, KILN_DTYPE_F32, h, KILN_DTYPE_BF16, h, KILN_DTYPE_F16, KILN_DTYPE_F16, "gemm_ex: c_dtype float16 needs float32 or float16 A and B, got b_dtype bfloat16", NULL},
        {2, d, KILN_DTYPE_F64, f, KILN_DTYPE_F32, h, KILN_DTYPE_BF16, KILN_DTYPE_BF16, "gemm_ex: c_dtype bfloat16 needs", "a_dtype float64"},
        {2, f, KILN_DTYPE_F32, f2, KILN_DTYPE_F32, f, KILN_DTYPE_U8, KILN_DTYPE_F32, "gemm_ex: c_dtype must be float32, float64, float16 or bfloat16", "uint8"},
        {2, f, KILN_DTYPE_F32, f2, KILN_DTYPE_F32, f, KILN_DTYPE_F32, KILN_DTYPE_F64, "gemm_ex: round_dtype", "float64"},
        {2, d, KILN_DTYPE_F64, d, KILN_DTYPE_F64, d, KILN_DTYPE_F64, KILN_DTYPE_BF16, "gemm_ex: c_dtype float64 takes round_dtype", "bfloat16"},
        {3, f, KILN_DTYPE_F32, h, KILN_DTYPE_F16, f, KILN_DTYPE_F32, KILN_DTYPE_F32, "gemm_ex: lda=2", NULL},
        {2, f, KILN_DTYPE_F32, NULL, KILN_DTYPE_F16, f, KILN_DTYPE_F32, KILN_DTYPE_F32, "gemm_ex: NULL B", NULL},
    };
    for (size_t i = 0; i < sizeof bad_gemm / sizeof bad_gemm[0]; i++)
        CU_ASSERT(rejected(g_k->gemm_ex(g_acc, 0, 0, 2, 2, bad_gemm[i].K, 1.0, bad_gemm[i].a, bad_gemm[i].at, 2,
                                        bad_gemm[i].b, bad_gemm[i].bt, 2, 0.0, bad_gemm[i].c, bad_gemm[i].ct, 2,
                                        bad_gemm[i].rt),
                           bad_gemm[i].what, bad_gemm[i].detail));
    /* other argument errors of the _ex entries */
    CU_ASSERT(rejected(g_k->act_forward(g_acc, KILN_DTYPE_F64, 7, d, d, 4), "act_forward: act must be", "got 7"));
    CU_ASSERT(rejected(g_k->act_backward(g_acc, KILN_DTYPE_F32, -1, f, f, f, 4), "act_backward: act", NULL));
    CU_ASSERT(rejected(g_k->sgd_update_ex(g_acc, KILN_DTYPE_F64, d, d, NULL, 4, 0.1, 0.9, 0.0, 0, 0.0, 1),
                       "sgd_update_ex (momentum != 0)", "momentum_buf"));
    CU_ASSERT(rejected(g_k->adamw_update_ex(g_acc, KILN_DTYPE_F64, d, d, d, d, 4, 0.1, 0.9, 0.999, 1e-8, 0.0, 0),
                       "adamw_update_ex: step is 1-based", NULL));
    CU_ASSERT(rejected(g_k->bias_add_ex(g_acc, KILN_DTYPE_F64, d, d, -1, 2), "bias_add_ex: rows and cols", NULL));
    double d2[4] = {0}, loss = 0.0;
    float lossf = 0.0f;
    CU_ASSERT(rejected(g_k->softmax_xent_forward_ex(g_acc, KILN_DTYPE_F64, d2, d, labels, 2, 2, NULL, NULL),
                       "softmax_xent_forward_ex: loss is NULL", NULL));
    /* softmax_xent's buffers: the forward's probs apart from its logits (a
     * row's label logit is read after its probabilities are written), the
     * backward's dlogits probs itself or apart */
    CU_ASSERT(rejected(g_k->softmax_xent_forward_ex(g_acc, KILN_DTYPE_F64, d, d, labels, 2, 2, &loss, NULL),
                       "softmax_xent_forward_ex: probs overlaps logits", NULL));
    CU_ASSERT(rejected(g_k->softmax_xent_forward(g_acc, f + 3, f, labels, 2, 2, &lossf, NULL),
                       "softmax_xent_forward: probs overlaps logits", NULL));
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, f + 4, f, labels, 2, 2, &lossf, NULL), KILN_OK);
    CU_ASSERT(rejected(g_k->softmax_xent_backward_ex(g_acc, KILN_DTYPE_F64, d + 1, d, labels, 1, 2, 1.0),
                       "softmax_xent_backward_ex: dlogits partially overlaps probs", NULL));
    CU_ASSERT(rejected(g_k->softmax_xent_backward(g_acc, f + 1, f, labels, 2, 2, 1.0f),
                       "softmax_xent_backward: dlogits partially overlaps probs", NULL));
    CU_ASSERT_EQUAL(g_k->softmax_xent_backward_ex(g_acc, KILN_DTYPE_F64, d2, d2, labels, 2, 2, 1.0), KILN_OK);
}

/* The float16 bits of x (round to nearest even): the compiler's _Float16
 * where it has one, else tests/support/half_bits.h's search. */
static uint16_t to_f16(float x) {
#if defined(__FLT16_MAX__)
    _Float16 h = (_Float16)x;
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
#else
    return hb_f16_bits(x);
#endif
}
/* and back: the exact decode of tests/support/half_bits.h */
static float from_f16(uint16_t u) { return (float)hb_f16_value(u); }

/* cast and round_to through the table. */
static void test_cast_round_to(void) {
    enum { N = 64 };
    float x[N], back[N], r[N];
    uint16_t h[N];
    double d[N];
    for (int i = 0; i < N; i++) x[i] = 70000.0f * val(i, 100);
    x[3] = 65520.0f; /* beyond fp16's range (half an ulp above 65504): inf */
    x[9] = -1e5f;
    CU_ASSERT_EQUAL(g_k->cast(g_acc, h, KILN_DTYPE_F16, x, KILN_DTYPE_F32, N), KILN_OK);
    CU_ASSERT_EQUAL(g_k->cast(g_acc, back, KILN_DTYPE_F32, h, KILN_DTYPE_F16, N), KILN_OK);
    memcpy(r, x, sizeof r);
    CU_ASSERT_EQUAL(g_k->round_to(g_acc, r, KILN_DTYPE_F16, N), KILN_OK);
    int infs = 0;
    for (int i = 0; i < N; i++) {
        CU_ASSERT_EQUAL(h[i], to_f16(x[i]));
        CU_ASSERT_EQUAL(memcmp(&back[i], &r[i], sizeof r[i]), 0); /* round_to = there and back */
        infs += isinf(r[i]) != 0; /* glibc gives -1 for -inf */
    }
    CU_ASSERT_TRUE(isinf(r[3]) && r[3] > 0);
    CU_ASSERT_TRUE(isinf(r[9]) && r[9] < 0);
    CU_ASSERT_TRUE(infs >= 2);
    /* bfloat16: the top half of the float bits, rounded */
    CU_ASSERT_EQUAL(g_k->cast(g_acc, h, KILN_DTYPE_BF16, x, KILN_DTYPE_F32, N), KILN_OK);
    memcpy(r, x, sizeof r);
    CU_ASSERT_EQUAL(g_k->round_to(g_acc, r, KILN_DTYPE_BF16, N), KILN_OK);
    for (int i = 0; i < N; i++) {
        uint32_t u;
        memcpy(&u, &r[i], sizeof u);
        CU_ASSERT_EQUAL(u, (uint32_t)h[i] << 16);
        CU_ASSERT_TRUE(fabsf(r[i] - x[i]) <= fabsf(x[i]) * 0x1p-8f);
    }
    /* float64 both ways, and float32 rounding is a no-op */
    CU_ASSERT_EQUAL(g_k->cast(g_acc, d, KILN_DTYPE_F64, x, KILN_DTYPE_F32, N), KILN_OK);
    CU_ASSERT_EQUAL(g_k->cast(g_acc, back, KILN_DTYPE_F32, d, KILN_DTYPE_F64, N), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(back, x, sizeof x), 0);
    memcpy(r, x, sizeof r);
    CU_ASSERT_EQUAL(g_k->round_to(g_acc, r, KILN_DTYPE_F32, N), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(r, x, sizeof x), 0);
    CU_ASSERT_EQUAL(g_k->cast(g_acc, x, KILN_DTYPE_F32, x, KILN_DTYPE_F32, N), KILN_OK); /* in place, same dtype */
    CU_ASSERT_EQUAL(g_k->cast(g_acc, NULL, KILN_DTYPE_F16, NULL, KILN_DTYPE_F32, 0), KILN_OK);
}

/* gemm_ex through the table: float32 A, float16 B (both layouts), against a
 * double computation on the values the float16 B keeps and on A rounded
 * through the matmul's 16-bit dtype (autocast's: the round dtype when it is
 * 16-bit, else B's); rounded output;
 * float64; and a workspace that grows and is reused across calls of
 * different sizes. */
static void check_gemm_ex_f16b(int M, int N, int K, int ta, int tb, double alpha, double beta, uint32_t round) {
    const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    const int lda = a_cols + 1, ldb = b_cols + 2, ldc = N + 3;
    float *A = calloc((size_t)a_rows * lda, sizeof *A), *Bv = calloc((size_t)b_rows * ldb, sizeof *Bv);
    uint16_t *B = calloc((size_t)b_rows * ldb, sizeof *B);
    float *C = calloc((size_t)M * ldc, sizeof *C), *C0 = calloc((size_t)M * ldc, sizeof *C0);
    CU_ASSERT_FATAL(A && Bv && B && C && C0);
    float *Av = calloc((size_t)a_rows * lda, sizeof *Av); /* the values the product sees */
    CU_ASSERT_PTR_NOT_NULL_FATAL(Av);
    for (int i = 0; i < a_rows * lda; i++) {
        A[i] = 2.0f * val(i, 110);
        Av[i] = from_f16(to_f16(A[i])); /* round is F32 or F16 here: float16 either way */
    }
    for (int i = 0; i < b_rows * ldb; i++) {
        B[i] = to_f16(2.0f * val(i, 111));
        Bv[i] = from_f16(B[i]);
    }
    for (int i = 0; i < M * ldc; i++) C[i] = C0[i] = (i % ldc) >= N ? -77.0f : beta == 0.0 ? NAN : val(i, 112);
    CU_ASSERT_EQUAL_FATAL(g_k->gemm_ex(g_acc, ta, tb, M, N, K, alpha, A, KILN_DTYPE_F32, lda, B, KILN_DTYPE_F16, ldb,
                                       beta, C, KILN_DTYPE_F32, ldc, round),
                          KILN_OK);
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            const double got = C[(size_t)i * ldc + j];
            if (j >= N) {
                bad += got != -77.0;
                continue;
            }
            double prod = alpha * ref_gemm_elem(ta, tb, i, j, K, Av, lda, Bv, ldb);
            double tol = 1e-5;
            if (round == KILN_DTYPE_F16) {
                prod = from_f16(to_f16((float)prod));
                tol = 1.0 / 1024; /* one fp16 unit: float accumulation may tip the rounding */
            }
            const double want = prod + (beta != 0.0 ? beta * C0[(size_t)i * ldc + j] : 0.0);
            if (!close_to(got, want, tol)) {
                if (bad++ < 3)
                    fprintf(stderr, "gemm_ex f16 B %dx%dx%d ta=%d tb=%d C[%d,%d] = %.8g, expected %.8g\n", M, N, K, ta,
                            tb, i, j, got, want);
            }
            if (round == KILN_DTYPE_F16 && beta == 0.0) bad += from_f16(to_f16((float)got)) != (float)got;
        }
    CU_ASSERT_EQUAL(bad, 0);
    free(A), free(Av), free(Bv), free(B), free(C), free(C0);
}

static void test_gemm_ex(void) {
    /* small, large (the workspace grows), small again (reused), transposes */
    check_gemm_ex_f16b(5, 7, 3, 0, 0, 1.0, 0.0, KILN_DTYPE_F32);
    check_gemm_ex_f16b(96, 80, 72, 0, 1, 0.5, 1.0, KILN_DTYPE_F16);
    check_gemm_ex_f16b(4, 3, 9, 1, 0, -1.25, 0.5, KILN_DTYPE_F32);
    check_gemm_ex_f16b(33, 17, 21, 1, 1, 1.0, 0.0, KILN_DTYPE_F16);
    check_gemm_ex_f16b(128, 96, 64, 0, 0, 2.0, -1.0, KILN_DTYPE_F16);

    /* fp16 overflow of the rounded product: inf, as an fp16 matmul gives */
    float a[2] = {300.0f, 300.0f}, c[1] = {1.0f};
    uint16_t b[2] = {to_f16(300.0f), to_f16(300.0f)};
    CU_ASSERT_EQUAL(g_k->gemm_ex(g_acc, 0, 0, 1, 1, 2, 1.0, a, KILN_DTYPE_F32, 2, b, KILN_DTYPE_F16, 1, 1.0, c,
                                 KILN_DTYPE_F32, 1, KILN_DTYPE_F16),
                    KILN_OK);
    CU_ASSERT_TRUE(isinf(c[0]) && c[0] > 0);

    /* float64: C = alpha A B^T + beta C against the double loop */
    enum { M = 6, N = 5, K = 7 };
    double A[M * K], B[N * K], C[M * N], C0[M * N];
    for (int i = 0; i < M * K; i++) A[i] = val(i, 120) / 3.0;
    for (int i = 0; i < N * K; i++) B[i] = val(i, 121) / 7.0;
    for (int i = 0; i < M * N; i++) C[i] = C0[i] = val(i, 122);
    CU_ASSERT_EQUAL(g_k->gemm_ex(g_acc, 0, 1, M, N, K, 0.3, A, KILN_DTYPE_F64, K, B, KILN_DTYPE_F64, K, -2.0, C,
                                 KILN_DTYPE_F64, N, KILN_DTYPE_F32),
                    KILN_OK);
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += A[i * K + k] * B[j * K + k];
            bad += fabs(C[i * N + j] - (0.3 * s - 2.0 * C0[i * N + j])) > 1e-14;
        }
    CU_ASSERT_EQUAL(bad, 0);
    /* M == 0: nothing to do, pointers not needed */
    CU_ASSERT_EQUAL(g_k->gemm_ex(g_acc, 0, 0, 0, 4, 4, 1.0, NULL, KILN_DTYPE_F16, 4, NULL, KILN_DTYPE_F16, 4, 0.0,
                                 NULL, KILN_DTYPE_F32, 4, KILN_DTYPE_F16),
                    KILN_OK);
}

/* 1.6: a float16 / bfloat16 C. The result is the float32 product of the
 * operands rounded through C's dtype, plus beta times C widened, rounded
 * once as it is stored: the bits of the float32 call on those operand
 * values, cast. A 16-bit B operand of C's dtype, transposes, K = 0 and a
 * padded C (ldc > N, padding untouched) too. */
static void check_gemm_ex_c16(uint32_t dt, int M, int N, int K, int ta, int tb, double alpha, double beta, int b16) {
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *Ar = malloc(na * sizeof *Ar),
          *Br = malloc(nb * sizeof *Br), *Cf = malloc(nc * sizeof *Cf);
    uint16_t *B16 = malloc(nb * 2), *C16 = malloc(nc * 2), *want = malloc(nc * 2);
    for (size_t i = 0; i < na; i++) A[i] = 3.0f * val((unsigned)i, 400);
    for (size_t i = 0; i < nb; i++) B[i] = 2.0f * val((unsigned)i, 401);
    for (size_t i = 0; i < nc; i++) Cf[i] = val((unsigned)i, 402);
    /* the operands autocast would multiply, and C as stored */
    CU_ASSERT_EQUAL(g_k->cast(g_acc, B16, dt, B, KILN_DTYPE_F32, nb), KILN_OK);
    CU_ASSERT_EQUAL(g_k->cast(g_acc, Br, KILN_DTYPE_F32, B16, dt, nb), KILN_OK);
    memcpy(Ar, A, na * sizeof *A);
    CU_ASSERT_EQUAL(g_k->round_to(g_acc, Ar, dt, na), KILN_OK);
    CU_ASSERT_EQUAL(g_k->cast(g_acc, C16, dt, Cf, KILN_DTYPE_F32, nc), KILN_OK);
    CU_ASSERT_EQUAL(g_k->cast(g_acc, Cf, KILN_DTYPE_F32, C16, dt, nc), KILN_OK);
    const int lda = ta ? M : (K > 0 ? K : 1), ldb = tb ? (K > 0 ? K : 1) : N;
    CU_ASSERT_EQUAL(g_k->gemm_ex(g_acc, ta, tb, M, N, K, alpha, Ar, KILN_DTYPE_F32, lda, Br, KILN_DTYPE_F32, ldb, beta,
                                 Cf, KILN_DTYPE_F32, N, KILN_DTYPE_F32),
                    KILN_OK);
    CU_ASSERT_EQUAL(g_k->cast(g_acc, want, dt, Cf, KILN_DTYPE_F32, nc), KILN_OK);
    CU_ASSERT_EQUAL(g_k->gemm_ex(g_acc, ta, tb, M, N, K, alpha, A, KILN_DTYPE_F32, lda, b16 ? (const void *)B16 : B,
                                 b16 ? dt : KILN_DTYPE_F32, ldb, beta, C16, dt, N, dt),
                    KILN_OK);
    CU_ASSERT_EQUAL(memcmp(C16, want, nc * 2), 0);
    /* padded: row stride N + 3, the padding keeps its bits */
    const int ldc = N + 3;
    uint16_t *P16 = malloc((size_t)M * ldc * 2);
    for (int i = 0; i < M * ldc; i++) P16[i] = (uint16_t)(0x3c00u + (unsigned)i % 7u);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) P16[(size_t)i * ldc + j] = 0;
    CU_ASSERT_EQUAL(g_k->gemm_ex(g_acc, ta, tb, M, N, K, alpha, A, KILN_DTYPE_F32, lda, B, KILN_DTYPE_F32, ldb, 0.0,
                                 P16, dt, ldc, dt),
                    KILN_OK);
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = ldc - 3; j < ldc; j++) bad += P16[(size_t)i * ldc + j] != (uint16_t)(0x3c00u + (unsigned)(i * ldc + j) % 7u);
    CU_ASSERT_EQUAL(bad, 0);
    free(P16);
    free(A), free(B), free(Ar), free(Br), free(Cf), free(B16), free(C16), free(want);
}

static void test_gemm_ex_c16(void) {
    CU_ASSERT_TRUE(g_k->flags & KILN_KERNELS_STORE_16BIT);
    const uint32_t dts[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        check_gemm_ex_c16(dts[d], 5, 7, 3, 0, 0, 1.0, 0.0, 0);
        check_gemm_ex_c16(dts[d], 33, 40, 21, 0, 1, 0.5, 0.0, 1);
        check_gemm_ex_c16(dts[d], 17, 9, 24, 1, 0, -1.25, 0.75, 0);
        check_gemm_ex_c16(dts[d], 48, 64, 32, 1, 1, 1.0, 1.0, 1);
        check_gemm_ex_c16(dts[d], 4, 6, 0, 0, 0, 1.0, -0.5, 0); /* K = 0: C = beta * C, rounded */
    }
    /* the product rounds once, at the store: 1 + 2^-9 in bfloat16 is 1 */
    float a[2] = {1.0f, 1.0f / 512.0f}, b[2] = {1.0f, 1.0f};
    uint16_t c = 0xffff;
    CU_ASSERT_EQUAL(g_k->gemm_ex(g_acc, 0, 0, 1, 1, 2, 1.0, a, KILN_DTYPE_F32, 2, b, KILN_DTYPE_F32, 1, 0.0, &c,
                                 KILN_DTYPE_BF16, 1, KILN_DTYPE_BF16),
                    KILN_OK);
    CU_ASSERT_EQUAL(c, 0x3f80); /* bfloat16 1.0 */
}

/* Every `_ex` training entry in both dtypes: float32 gives exactly what the
 * 1.1 float entry gives on the same data (it is the same kernel), float64
 * what a double computation gives. */
static void test_ex_entries(void) {
    enum { R = 3, Cc = 5, N = R * Cc };
    float xf[N], yf[N], y11[N], gf[N], bf[Cc], dbf[Cc], db11[Cc];
    double xd[N], yd[N], gd[N], bd[Cc], dbd[Cc];
    for (int i = 0; i < N; i++) {
        xd[i] = xf[i] = 4.0f * val(i, 130);
        gd[i] = gf[i] = val(i, 131);
    }
    for (int j = 0; j < Cc; j++) bd[j] = bf[j] = val(j, 132);

    /* bias_add_ex / bias_grad_ex */
    memcpy(yf, xf, sizeof yf), memcpy(y11, xf, sizeof y11), memcpy(yd, xd, sizeof yd);
    CU_ASSERT_EQUAL(g_k->bias_add_ex(g_acc, KILN_DTYPE_F32, yf, bf, R, Cc), KILN_OK);
    CU_ASSERT_EQUAL(g_k->bias_add(g_acc, y11, bf, R, Cc), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(yf, y11, sizeof yf), 0);
    CU_ASSERT_EQUAL(g_k->bias_add_ex(g_acc, KILN_DTYPE_F64, yd, bd, R, Cc), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(yd[i], xd[i] + bd[i % Cc]);
    CU_ASSERT_EQUAL(g_k->bias_grad_ex(g_acc, KILN_DTYPE_F32, dbf, gf, R, Cc, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_k->bias_grad(g_acc, db11, gf, R, Cc, 0), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(dbf, db11, sizeof dbf), 0);
    for (int j = 0; j < Cc; j++) dbd[j] = 1.0;
    CU_ASSERT_EQUAL(g_k->bias_grad_ex(g_acc, KILN_DTYPE_F64, dbd, gd, R, Cc, 1), KILN_OK);
    for (int j = 0; j < Cc; j++) {
        double s = 1.0;
        for (int r = 0; r < R; r++) s += gd[r * Cc + j];
        CU_ASSERT_TRUE(close_to(dbd[j], s, 1e-15));
    }

    /* act_forward / act_backward, both activations */
    for (int act = KILN_ACT_RELU; act <= KILN_ACT_GELU; act++) {
        CU_ASSERT_EQUAL(g_k->act_forward(g_acc, KILN_DTYPE_F32, act, yf, xf, N), KILN_OK);
        CU_ASSERT_EQUAL((act ? g_k->gelu_forward : g_k->relu_forward)(g_acc, y11, xf, N), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(yf, y11, sizeof yf), 0);
        CU_ASSERT_EQUAL(g_k->act_forward(g_acc, KILN_DTYPE_F64, act, yd, xd, N), KILN_OK);
        for (int i = 0; i < N; i++)
            CU_ASSERT_TRUE(close_to(yd[i], act ? gelu_ref(xd[i]) : (xd[i] > 0 ? xd[i] : 0.0), 1e-13));
        CU_ASSERT_EQUAL(g_k->act_backward(g_acc, KILN_DTYPE_F32, act, yf, gf, xf, N), KILN_OK);
        CU_ASSERT_EQUAL((act ? g_k->gelu_backward : g_k->relu_backward)(g_acc, y11, gf, xf, N), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(yf, y11, sizeof yf), 0);
        CU_ASSERT_EQUAL(g_k->act_backward(g_acc, KILN_DTYPE_F64, act, yd, gd, xd, N), KILN_OK);
        for (int i = 0; i < N; i++)
            CU_ASSERT_TRUE(close_to(yd[i], gd[i] * (act ? gelu_grad_ref(xd[i]) : (xd[i] > 0 ? 1.0 : 0.0)), 1e-12));
    }

    /* reductions and BLAS-1 */
    double s32 = 0, s32_11 = 0, s64 = 0, want = 0;
    for (int i = 0; i < N; i++) want += xd[i] * xd[i];
    CU_ASSERT_EQUAL(g_k->sumsq_ex(g_acc, KILN_DTYPE_F32, xf, N, &s32), KILN_OK);
    CU_ASSERT_EQUAL(g_k->sumsq(g_acc, xf, N, &s32_11), KILN_OK);
    CU_ASSERT_EQUAL(s32, s32_11);
    CU_ASSERT_EQUAL(g_k->sumsq_ex(g_acc, KILN_DTYPE_F64, xd, N, &s64), KILN_OK);
    CU_ASSERT_TRUE(close_to(s64, want, 1e-15));
    int32_t fin = -1;
    CU_ASSERT_EQUAL(g_k->all_finite_ex(g_acc, KILN_DTYPE_F64, xd, N, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 1);
    yd[3] = -INFINITY;
    CU_ASSERT_EQUAL(g_k->all_finite_ex(g_acc, KILN_DTYPE_F64, yd, N, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 0);
    yf[4] = NAN;
    CU_ASSERT_EQUAL(g_k->all_finite_ex(g_acc, KILN_DTYPE_F32, yf, N, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 0);
    memcpy(yd, xd, sizeof yd);
    CU_ASSERT_EQUAL(g_k->scale_ex(g_acc, KILN_DTYPE_F64, yd, 0.1, N), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(yd[i], xd[i] * 0.1); /* 0.1 as a double, not 0.1f */
    CU_ASSERT_EQUAL(g_k->axpy_ex(g_acc, KILN_DTYPE_F64, yd, -3.0, gd, N), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(yd[i], xd[i] * 0.1 + -3.0 * gd[i]);
    memcpy(yf, xf, sizeof yf), memcpy(y11, xf, sizeof y11);
    CU_ASSERT_EQUAL(g_k->scale_ex(g_acc, KILN_DTYPE_F32, yf, 0.1, N), KILN_OK);
    CU_ASSERT_EQUAL(g_k->scale(g_acc, y11, 0.1f, N), KILN_OK);
    CU_ASSERT_EQUAL(g_k->axpy_ex(g_acc, KILN_DTYPE_F32, yf, -3.0, gf, N), KILN_OK);
    CU_ASSERT_EQUAL(g_k->axpy(g_acc, y11, -3.0f, gf, N), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(yf, y11, sizeof yf), 0);
}

static void test_ex_loss(void) {
    enum { B = 3, C = 4 };
    double l[B * C], p[B * C], d[B * C], loss = 0;
    float lf[B * C], pf[B * C], p11[B * C], df[B * C], d11[B * C], loss11 = 0;
    int32_t labels[B] = {2, 0, 3}, correct = -1, correct11 = -1;
    for (int i = 0; i < B * C; i++) l[i] = lf[i] = 3.0f * val(i, 140);
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward_ex(g_acc, KILN_DTYPE_F64, p, l, labels, B, C, &loss, &correct), KILN_OK);
    double want = 0;
    for (int b = 0; b < B; b++) {
        double z = 0;
        for (int j = 0; j < C; j++) z += exp(l[b * C + j]);
        for (int j = 0; j < C; j++) CU_ASSERT_TRUE(close_to(p[b * C + j], exp(l[b * C + j]) / z, 1e-15));
        want += log(z) - l[b * C + labels[b]];
    }
    CU_ASSERT_TRUE(close_to(loss, want / B, 1e-15));
    CU_ASSERT_EQUAL(g_k->softmax_xent_backward_ex(g_acc, KILN_DTYPE_F64, d, p, labels, B, C, 2.0), KILN_OK);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < C; j++)
            CU_ASSERT_TRUE(close_to(d[b * C + j], 2.0 * (p[b * C + j] - (j == labels[b])) / B, 1e-15));
    /* float32: the same numbers as the 1.1 entries */
    double lossf = 0;
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward_ex(g_acc, KILN_DTYPE_F32, pf, lf, labels, B, C, &lossf, &correct), KILN_OK);
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, p11, lf, labels, B, C, &loss11, &correct11), KILN_OK);
    CU_ASSERT_EQUAL(lossf, (double)loss11);
    CU_ASSERT_EQUAL(correct, correct11);
    CU_ASSERT_EQUAL(memcmp(pf, p11, sizeof pf), 0);
    CU_ASSERT_EQUAL(g_k->softmax_xent_backward_ex(g_acc, KILN_DTYPE_F32, df, pf, labels, B, C, 0.5), KILN_OK);
    CU_ASSERT_EQUAL(g_k->softmax_xent_backward(g_acc, d11, pf, labels, B, C, 0.5f), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(df, d11, sizeof df), 0);

    /* Bad labels: KILN_E_DATA naming the entry, the row and the label. */
    int32_t bad[B] = {2, 9, 0};
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward_ex(g_acc, KILN_DTYPE_F64, p, l, bad, B, C, &loss, NULL), KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "softmax_xent_forward_ex: label 9 at batch index 1"));
    CU_ASSERT_EQUAL(g_k->softmax_xent_backward_ex(g_acc, KILN_DTYPE_F32, df, pf, bad, B, C, 1.0), KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "softmax_xent_backward_ex: label 9"));
    /* A NaN logit is a NaN loss, not a data error. */
    l[5] = NAN;
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward_ex(g_acc, KILN_DTYPE_F64, p, l, labels, B, C, &loss, NULL), KILN_OK);
    CU_ASSERT_TRUE(isnan(loss));
}

static void test_ex_optimizers(void) {
    enum { N = 9 };
    double p[N], g[N], buf[N], m[N] = {0}, v[N] = {0}, rp[N], rb[N], rm[N] = {0}, rv[N] = {0};
    float pf[N], gf[N], bff[N], p11[N], b11[N];
    for (int i = 0; i < N; i++) {
        rp[i] = p[i] = pf[i] = p11[i] = val(i, 150);
        g[i] = gf[i] = val(i, 151);
    }
    /* SGD, Nesterov with weight decay and dampening, two steps, float64 vs
     * torch.optim.SGD's rules in double */
    for (int step = 0; step < 2; step++) {
        CU_ASSERT_EQUAL(g_k->sgd_update_ex(g_acc, KILN_DTYPE_F64, p, g, buf, N, 0.1, 0.9, 0.0, 1, 0.01, step == 0),
                        KILN_OK);
        for (int i = 0; i < N; i++) {
            double d = g[i] + 0.01 * rp[i];
            rb[i] = step == 0 ? d : 0.9 * rb[i] + d;
            d = d + 0.9 * rb[i];
            rp[i] -= 0.1 * d;
            CU_ASSERT_TRUE(close_to(p[i], rp[i], 1e-15));
            CU_ASSERT_TRUE(close_to(buf[i], rb[i], 1e-15));
        }
        /* float32 through both tables: identical */
        CU_ASSERT_EQUAL(g_k->sgd_update_ex(g_acc, KILN_DTYPE_F32, pf, gf, bff, N, 0.1, 0.9, 0.25, 0, 0.01, step == 0),
                        KILN_OK);
        CU_ASSERT_EQUAL(g_k->sgd_update(g_acc, p11, gf, b11, N, 0.1f, 0.9f, 0.25f, 0, 0.01f, step == 0), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(pf, p11, sizeof pf), 0);
    }
    /* AdamW, two steps, float64 vs torch.optim.AdamW's rules in double; the
     * float32 path agrees to float precision */
    for (int i = 0; i < N; i++) rp[i] = p[i], pf[i] = (float)p[i];
    float mf[N] = {0}, vf[N] = {0};
    for (int step = 1; step <= 2; step++) {
        CU_ASSERT_EQUAL(g_k->adamw_update_ex(g_acc, KILN_DTYPE_F64, p, g, m, v, N, 0.01, 0.9, 0.999, 1e-8, 0.1, step),
                        KILN_OK);
        CU_ASSERT_EQUAL(g_k->adamw_update_ex(g_acc, KILN_DTYPE_F32, pf, gf, mf, vf, N, 0.01, 0.9, 0.999, 1e-8, 0.1,
                                             step),
                        KILN_OK);
        for (int i = 0; i < N; i++) {
            rp[i] *= 1.0 - 0.01 * 0.1;
            rm[i] = 0.9 * rm[i] + 0.1 * g[i];
            rv[i] = 0.999 * rv[i] + 0.001 * g[i] * g[i];
            const double mhat = rm[i] / (1.0 - pow(0.9, step)), vhat = rv[i] / (1.0 - pow(0.999, step));
            rp[i] -= 0.01 * mhat / (sqrt(vhat) + 1e-8);
            CU_ASSERT_TRUE(close_to(p[i], rp[i], 1e-13));
            CU_ASSERT_TRUE(close_to(m[i], rm[i], 1e-13));
            CU_ASSERT_TRUE(close_to(v[i], rv[i], 1e-13));
            CU_ASSERT_TRUE(close_to(pf[i], rp[i], 2e-6));
        }
    }
}

/* ------------------------------------------------------------- 1.3 fused */

/* unscale_check over a list: every tensor multiplied (also after a
 * non-finite one, as GradScaler.unscale_ does), an empty tensor's NULL
 * pointer accepted, inf and NaN both reported, float64 too. */
static void test_unscale_check(void) {
    CU_ASSERT_TRUE(g_k->struct_size >= KILN_KERNELS_SIZE_1_3);
    enum { N0 = 37, N2 = 1000 };
    float a[N0], c[N2], a0[N0], c0[N2];
    for (int i = 0; i < N0; i++) a[i] = a0[i] = val(i, 300) * 1024.0f;
    for (int i = 0; i < N2; i++) c[i] = c0[i] = val(i, 301) * 65536.0f;
    void *x[3] = {a, NULL, c};
    size_t n[3] = {N0, 0, N2};
    const float inv = 1.0f / 4096.0f;
    int32_t fin = -1;
    CU_ASSERT_EQUAL(g_k->unscale_check(g_acc, KILN_DTYPE_F32, x, n, 3, (double)inv, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 1);
    int bad = 0;
    for (int i = 0; i < N0; i++) bad += a[i] != a0[i] * inv;
    for (int i = 0; i < N2; i++) bad += c[i] != c0[i] * inv;
    CU_ASSERT_EQUAL(bad, 0);

    /* an inf in the first tensor: reported, and the last is still scaled */
    a[5] = INFINITY;
    for (int i = 0; i < N2; i++) c0[i] = c[i];
    CU_ASSERT_EQUAL(g_k->unscale_check(g_acc, KILN_DTYPE_F32, x, n, 3, 0.5, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 0);
    CU_ASSERT_TRUE(isinf(a[5]));
    bad = 0;
    for (int i = 0; i < N2; i++) bad += c[i] != c0[i] * 0.5f;
    CU_ASSERT_EQUAL(bad, 0);
    /* a finite value that overflows when multiplied counts too */
    a[5] = 3.0e38f;
    CU_ASSERT_EQUAL(g_k->unscale_check(g_acc, KILN_DTYPE_F32, x, n, 1, 4.0, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 0);
    a[5] = 1.0f;
    c[N2 - 1] = NAN;
    CU_ASSERT_EQUAL(g_k->unscale_check(g_acc, KILN_DTYPE_F32, x, n, 3, 1.0, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 0);
    CU_ASSERT_EQUAL(g_k->unscale_check(g_acc, KILN_DTYPE_F32, x, n, 2, 1.0, &fin), KILN_OK); /* NaN not in range */
    CU_ASSERT_EQUAL(fin, 1);
    CU_ASSERT_EQUAL(g_k->unscale_check(g_acc, KILN_DTYPE_F32, NULL, NULL, 0, 1.0, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 1);

    double d[4] = {1.0, -3.0, 1e300, 0.25};
    void *xd[1] = {d};
    size_t nd[1] = {4};
    CU_ASSERT_EQUAL(g_k->unscale_check(g_acc, KILN_DTYPE_F64, xd, nd, 1, 0.125, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 1);
    CU_ASSERT_TRUE(d[0] == 0.125 && d[1] == -0.375 && d[2] == 1e300 * 0.125 && d[3] == 0.03125);
    CU_ASSERT_EQUAL(g_k->unscale_check(g_acc, KILN_DTYPE_F64, xd, nd, 1, 1e10, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 0); /* 1.25e299 * 1e10 overflows double */

    CU_ASSERT_TRUE(rejected(g_k->unscale_check(g_acc, KILN_DTYPE_F32, x, n, 3, 1.0, NULL), "unscale_check",
                            "finite is NULL"));
    CU_ASSERT_TRUE(rejected(g_k->unscale_check(g_acc, KILN_DTYPE_F32, NULL, n, 3, 1.0, &fin), "unscale_check",
                            "NULL x array"));
    void *xbad[2] = {a, NULL};
    size_t nbad[2] = {N0, 4};
    CU_ASSERT_TRUE(rejected(g_k->unscale_check(g_acc, KILN_DTYPE_F32, xbad, nbad, 2, 1.0, &fin), "x[1] is NULL",
                            "n[1]=4"));
    CU_ASSERT_TRUE(rejected(g_k->unscale_check(g_acc, KILN_DTYPE_F16, x, n, 3, 1.0, &fin), "unscale_check",
                            "float16 (3)"));
}

/* The bf16 bit pattern of x rounded to nearest even (x finite). */
static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) { return hb_bf16_value(h); }

/* linear_forward: against a double computation, and bit for bit against
 * the unfused sequence its ABI comment names (which is what mlp runs on a
 * 1.2 accelerator), in float32, float32 with bfloat16 weights and output
 * rounding, and float64; plus its refusals. */
/* 1.6: linear_forward_layout. KILN_LAYOUT_IN_OUT (Conv1D, w (in, out))
 * gives the bits of its unfused equivalent (gemm_ex with B untransposed,
 * bias_add_ex, round_to, act_forward, round_to) and the double loop's
 * values; KILN_LAYOUT_OUT_IN gives the 1.3 entry's bits; another layout is
 * refused. */
static void test_linear_forward_layout(void) {
    enum { R = 7, I = 12, O = 10, NY = R * O };
    float x[R * I], w[O * I], wt[I * O], b[O], y[NY], post[NY], y2[NY], post2[NY];
    uint16_t wtb[I * O];
    CU_ASSERT_TRUE_FATAL(g_k->struct_size >= KILN_KERNELS_SIZE_1_6 && g_k->linear_forward_layout);
    for (int i = 0; i < R * I; i++) x[i] = val(i, 320) * 2.0f; /* not bf16-representable: rounded as operands */
    for (int o = 0; o < O; o++)
        for (int i = 0; i < I; i++) w[o * I + i] = wt[i * O + o] = val(o * I + i, 321) * 0.5f;
    for (int i = 0; i < I * O; i++) wtb[i] = to_bf16(wt[i]);
    for (int i = 0; i < O; i++) b[i] = val(i, 322) * 0.25f;
    static const int32_t acts[] = {KILN_ACT_GELU, KILN_ACT_RELU, -1};
    for (unsigned t = 0; t < sizeof acts / sizeof acts[0]; t++)
        for (int bf = 0; bf < 2; bf++) {
            const int32_t act = acts[t];
            const uint32_t wdt = bf ? KILN_DTYPE_BF16 : KILN_DTYPE_F32, rdt = bf ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
            const void *W = bf ? (const void *)wtb : (const void *)wt;
            CU_ASSERT_EQUAL(g_k->linear_forward_layout(g_acc, KILN_DTYPE_F32, x, W, wdt, KILN_LAYOUT_IN_OUT, b, R, I, O,
                                                       act, y, act < 0 ? NULL : post, rdt),
                            KILN_OK);
            CU_ASSERT_EQUAL(g_k->gemm_ex(g_acc, 0, 0, R, O, I, 1.0, x, KILN_DTYPE_F32, I, W, wdt, O, 0.0, y2,
                                         KILN_DTYPE_F32, O, KILN_DTYPE_F32),
                            KILN_OK);
            CU_ASSERT_EQUAL(g_k->bias_add_ex(g_acc, KILN_DTYPE_F32, y2, b, R, O), KILN_OK);
            CU_ASSERT_EQUAL(g_k->round_to(g_acc, y2, rdt, NY), KILN_OK);
            CU_ASSERT_EQUAL(memcmp(y, y2, sizeof y), 0);
            if (act >= 0) {
                CU_ASSERT_EQUAL(g_k->act_forward(g_acc, KILN_DTYPE_F32, act, post2, y2, NY), KILN_OK);
                CU_ASSERT_EQUAL(g_k->round_to(g_acc, post2, rdt, NY), KILN_OK);
                CU_ASSERT_EQUAL(memcmp(post, post2, sizeof post), 0);
            }
            int bad = 0;
            for (int r = 0; r < R; r++)
                for (int o = 0; o < O; o++) {
                    double s = b[o];
                    for (int i = 0; i < I; i++)
                        s += bf ? (double)from_bf16(to_bf16(x[r * I + i])) * from_bf16(wtb[i * O + o])
                                : (double)x[r * I + i] * wt[i * O + o];
                    bad += !close_to(y[r * O + o], s, bf ? 1.0 / 128 : 1e-5);
                }
            CU_ASSERT_EQUAL(bad, 0);
            /* OUT_IN is the 1.3 entry */
            CU_ASSERT_EQUAL(g_k->linear_forward_layout(g_acc, KILN_DTYPE_F32, x, w, KILN_DTYPE_F32, KILN_LAYOUT_OUT_IN,
                                                       b, R, I, O, act, y, act < 0 ? NULL : post, rdt),
                            KILN_OK);
            CU_ASSERT_EQUAL(g_k->linear_forward(g_acc, KILN_DTYPE_F32, x, w, KILN_DTYPE_F32, b, R, I, O, act, y2,
                                                act < 0 ? NULL : post2, rdt),
                            KILN_OK);
            CU_ASSERT_EQUAL(memcmp(y, y2, sizeof y), 0);
            if (act >= 0) CU_ASSERT_EQUAL(memcmp(post, post2, sizeof post), 0);
        }
    CU_ASSERT_TRUE(rejected(g_k->linear_forward_layout(g_acc, KILN_DTYPE_F32, x, wt, KILN_DTYPE_F32, 2, b, R, I, O, -1,
                                                       y, NULL, KILN_DTYPE_F32),
                            "linear_forward_layout: w_layout must be", "got 2"));
    CU_ASSERT_TRUE(rejected(g_k->linear_forward_layout(g_acc, KILN_DTYPE_F32, x, wt, KILN_DTYPE_F32, KILN_LAYOUT_IN_OUT,
                                                       b, R, I, O, KILN_ACT_RELU, y, NULL, KILN_DTYPE_F32),
                            "linear_forward_layout", "post is NULL"));
}

static void test_linear_forward(void) {
    enum { R = 9, I = 13, O = 11, NY = R * O };
    float x[R * I], w[O * I], b[O], y[NY], post[NY], y2[NY], post2[NY];
    uint16_t wb[O * I];
    for (int i = 0; i < R * I; i++) x[i] = from_bf16(to_bf16(val(i, 310) * 2.0f)); /* bf16-representable */
    for (int i = 0; i < O * I; i++) {
        w[i] = val(i, 311) * 0.5f;
        wb[i] = to_bf16(w[i]);
    }
    for (int i = 0; i < O; i++) b[i] = val(i, 312) * 0.25f;

    static const int32_t acts[] = {KILN_ACT_RELU, KILN_ACT_GELU, KILN_ACT_TANH, -1};
    for (unsigned t = 0; t < sizeof acts / sizeof acts[0]; t++) {
        const int32_t act = acts[t];
        const float *bias = act == KILN_ACT_TANH ? NULL : b; /* one case without a bias */
        /* float32 */
        CU_ASSERT_EQUAL(g_k->linear_forward(g_acc, KILN_DTYPE_F32, x, w, KILN_DTYPE_F32, bias, R, I, O, act, y,
                                            act < 0 ? NULL : post, KILN_DTYPE_F32),
                        KILN_OK);
        int bad = 0;
        for (int r = 0; r < R; r++)
            for (int o = 0; o < O; o++) {
                double s = bias ? bias[o] : 0.0;
                for (int i = 0; i < I; i++) s += (double)x[r * I + i] * w[o * I + i];
                bad += !close_to(y[r * O + o], s, 1e-5);
                if (act == KILN_ACT_RELU) bad += post[r * O + o] != (y[r * O + o] > 0 ? y[r * O + o] : 0.0f);
                if (act == KILN_ACT_GELU) bad += !close_to(post[r * O + o], gelu_ref(y[r * O + o]), 2e-6);
                if (act == KILN_ACT_TANH) bad += !close_to(post[r * O + o], tanh(y[r * O + o]), 2e-6);
            }
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT_EQUAL(g_k->gemm(g_acc, 0, 1, R, O, I, 1.0f, x, I, w, I, 0.0f, y2, O), KILN_OK);
        if (bias) CU_ASSERT_EQUAL(g_k->bias_add(g_acc, y2, bias, R, O), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(y, y2, sizeof y), 0);
        if (act >= 0) {
            CU_ASSERT_EQUAL(g_k->act_forward(g_acc, KILN_DTYPE_F32, act, post2, y2, NY), KILN_OK);
            CU_ASSERT_EQUAL(memcmp(post, post2, sizeof post), 0);
        }

        /* bf16 weights, bf16 rounding: one rounding after the bias */
        CU_ASSERT_EQUAL(g_k->linear_forward(g_acc, KILN_DTYPE_F32, x, wb, KILN_DTYPE_BF16, bias, R, I, O, act, y,
                                            act < 0 ? NULL : post, KILN_DTYPE_BF16),
                        KILN_OK);
        CU_ASSERT_EQUAL(g_k->gemm_ex(g_acc, 0, 1, R, O, I, 1.0, x, KILN_DTYPE_F32, I, wb, KILN_DTYPE_BF16, I, 0.0, y2,
                                     KILN_DTYPE_F32, O, KILN_DTYPE_F32),
                        KILN_OK);
        if (bias) CU_ASSERT_EQUAL(g_k->bias_add_ex(g_acc, KILN_DTYPE_F32, y2, bias, R, O), KILN_OK);
        CU_ASSERT_EQUAL(g_k->round_to(g_acc, y2, KILN_DTYPE_BF16, NY), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(y, y2, sizeof y), 0);
        bad = 0;
        for (int r = 0; r < R; r++)
            for (int o = 0; o < O; o++) {
                double s = bias ? bias[o] : 0.0;
                for (int i = 0; i < I; i++) s += (double)x[r * I + i] * from_bf16(wb[o * I + i]);
                bad += from_bf16(to_bf16(y[r * O + o])) != y[r * O + o]; /* representable */
                bad += !close_to(y[r * O + o], s, 1.0 / 128);
            }
        CU_ASSERT_EQUAL(bad, 0);
        if (act >= 0) {
            CU_ASSERT_EQUAL(g_k->act_forward(g_acc, KILN_DTYPE_F32, act, post2, y2, NY), KILN_OK);
            CU_ASSERT_EQUAL(g_k->round_to(g_acc, post2, KILN_DTYPE_BF16, NY), KILN_OK);
            CU_ASSERT_EQUAL(memcmp(post, post2, sizeof post), 0);
        }
    }

    /* float64 against the double loop */
    double xd[R * I], wd[O * I], bd[O], yd[NY], pd[NY];
    for (int i = 0; i < R * I; i++) xd[i] = val(i, 313) / 3.0;
    for (int i = 0; i < O * I; i++) wd[i] = val(i, 314) / 7.0;
    for (int i = 0; i < O; i++) bd[i] = val(i, 315);
    CU_ASSERT_EQUAL(g_k->linear_forward(g_acc, KILN_DTYPE_F64, xd, wd, KILN_DTYPE_F64, bd, R, I, O, KILN_ACT_RELU, yd,
                                        pd, KILN_DTYPE_F32),
                    KILN_OK);
    int bad = 0;
    for (int r = 0; r < R; r++)
        for (int o = 0; o < O; o++) {
            double s = bd[o];
            for (int i = 0; i < I; i++) s += xd[r * I + i] * wd[o * I + i];
            bad += fabs(yd[r * O + o] - s) > 1e-14 || pd[r * O + o] != (s > 0 ? yd[r * O + o] : 0.0);
        }
    CU_ASSERT_EQUAL(bad, 0);

    /* refusals */
    CU_ASSERT_TRUE(rejected(g_k->linear_forward(g_acc, KILN_DTYPE_F64, xd, wd, KILN_DTYPE_F64, bd, R, I, O, -1, yd,
                                                NULL, KILN_DTYPE_BF16),
                            "linear_forward: round_dtype", "bfloat16"));
    CU_ASSERT_TRUE(rejected(g_k->linear_forward(g_acc, KILN_DTYPE_F32, x, w, KILN_DTYPE_F32, b, R, I, O, 9, y, post,
                                                KILN_DTYPE_F32),
                            "linear_forward", "got 9"));
    CU_ASSERT_TRUE(rejected(g_k->linear_forward(g_acc, KILN_DTYPE_F32, x, w, KILN_DTYPE_F32, b, R, I, O,
                                                KILN_ACT_RELU, y, NULL, KILN_DTYPE_F32),
                            "linear_forward", "post is NULL"));
    CU_ASSERT_TRUE(rejected(g_k->linear_forward(g_acc, KILN_DTYPE_F32, x, w, KILN_DTYPE_F32, b, R, I, O,
                                                KILN_ACT_RELU, y, y + 1, KILN_DTYPE_F32),
                            "linear_forward", "overlap"));
    /* float16 is 1.7's 16-bit activation storage, whose store is the rounding */
    CU_ASSERT_TRUE(rejected(g_k->linear_forward(g_acc, KILN_DTYPE_F16, x, w, KILN_DTYPE_F32, b, R, I, O, -1, y, NULL,
                                                KILN_DTYPE_F32),
                            "linear_forward", "round_dtype must be float16 for float16 activation storage"));
    CU_ASSERT_TRUE(rejected(g_k->linear_forward(g_acc, KILN_DTYPE_I32, x, w, KILN_DTYPE_F32, b, R, I, O, -1, y, NULL,
                                                KILN_DTYPE_F32),
                            "linear_forward", "int32 (5)"));
    CU_ASSERT_TRUE(rejected(g_k->linear_forward(g_acc, KILN_DTYPE_F32, x, w, KILN_DTYPE_F32, b, -1, I, O, -1, y, NULL,
                                                KILN_DTYPE_F32),
                            "linear_forward", ">= 0"));
    /* nothing to compute: no pointer needed */
    CU_ASSERT_EQUAL(g_k->linear_forward(g_acc, KILN_DTYPE_F32, NULL, NULL, KILN_DTYPE_F32, NULL, 0, I, O,
                                        KILN_ACT_GELU, NULL, NULL, KILN_DTYPE_F32),
                    KILN_OK);
}

/* -------------------------------------------------------------- configure */

static void test_configure(void) {
    /* Large enough that the kernels split the loops across the pool. */
    enum { N = 1 << 18 };
    float *x = malloc(N * sizeof *x), *y1 = malloc(N * sizeof *y1), *yn = malloc(N * sizeof *yn);
    CU_ASSERT_PTR_NOT_NULL_FATAL(x);
    CU_ASSERT_PTR_NOT_NULL_FATAL(y1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(yn);
    for (int i = 0; i < N; i++) x[i] = 4.0f * val(i, 90);
    double s1, sn;
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 1, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_k->gelu_forward(g_acc, y1, x, N), KILN_OK);
    CU_ASSERT_EQUAL(g_k->sum(g_acc, x, N, &s1), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 3, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_k->gelu_forward(g_acc, yn, x, N), KILN_OK);
    CU_ASSERT_EQUAL(g_k->sum(g_acc, x, N, &sn), KILN_OK);
    /* The thread split never changes a bit. */
    CU_ASSERT_EQUAL(memcmp(y1, yn, N * sizeof *y1), 0);
    CU_ASSERT_EQUAL(s1, sn);
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 0, 0), KILN_OK); /* all CPUs */
    CU_ASSERT_EQUAL(g_k->gelu_forward(g_acc, yn, x, N), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(y1, yn, N * sizeof *y1), 0);
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, -1, 0), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "threads"));
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 1, 0), KILN_OK);
    free(x);
    free(y1);
    free(yn);
}

/* The `blas` key: a bad value is refused; "blis" loads BLIS where it is
 * installed (the GEMMs then agree with a double reference) and is refused
 * with the package to install where it is not. */
static void test_blas_key(void) {
    kiln_kv bad[] = {{"blas", KILN_V_STR("mkl")}, {NULL, KILN_V_NONE}};
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL(g_ops->base.create(g_desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), bad, &acc), KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(acc);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "blas must be"));
    kiln_kv blis[] = {{"blas", KILN_V_STR("blis")}, {NULL, KILN_V_NONE}};
    int32_t rc = g_ops->base.create(g_desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), blis, &acc);
    if (access("/usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4", R_OK) != 0 && rc != KILN_OK) {
        CU_ASSERT_EQUAL(rc, KILN_E_UNSUPPORTED);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "libblis4-serial"));
        return;
    }
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    enum { M = 37, N = 41, K = 29 };
    float A[K * M], B[N * K], C[M * N];
    for (int i = 0; i < K * M; i++) A[i] = val(i, 3);
    for (int i = 0; i < N * K; i++) B[i] = val(i, 5);
    /* C = A^T B^T with A stored (K, M), B stored (N, K) */
    CU_ASSERT_EQUAL(g_k->gemm(acc, 1, 1, M, N, K, 1.0f, A, M, B, K, 0.0f, C, N), KILN_OK);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double r = 0;
            for (int k = 0; k < K; k++) r += (double)A[k * M + i] * (double)B[j * K + k];
            worst = fmax(worst, fabs(r - C[i * N + j]));
        }
    CU_ASSERT(worst < 1e-4);
    g_ops->base.destroy(acc);
}

/* ABI 1.7: the shared cases of tests/support/act16_cases.h */
static void test_act16(void) { act16_run_all(g_k, g_acc); }
/* ABI 1.8: KILN_LAYOUT_ROUND_BIAS, the same shared file */
static void test_bias_round(void) { bias_round_run_all(g_k, g_acc); }
/* ABI 1.9: sumsq_many, the same shared file as the fake GPU's */
static void test_sumsq_many(void) { sumsq_many_run_all(g_k, g_acc); }
/* ABI 1.10: adamw_update_many, the same shared file as the fake GPU's */
static void test_adamw_many(void) { adamw_many_run_all(g_k, g_acc); }
/* ABI 1.10: add_layernorm_forward, likewise */
static void test_add_ln(void) { add_ln_run_all(g_k, g_acc); }
/* ABI 1.11: act_bias_backward and layernorm_backward_cast, likewise */
static void test_bwd_fuse(void) { bwd_fuse_run_all(g_k, g_acc); }

static CU_TestInfo cases_cpu_accel[] = {
    {"blas key: auto, openblas, blis", test_blas_key},
    {"descriptor and kernel table", test_descriptor},
    {"alloc: aligned, zeroed, NOMEM", test_alloc},
    {"copy, zero, synchronize", test_copy_zero_sync},
    {"gemm: four transposes vs naive", test_gemm},
    {"bias_add, bias_grad", test_bias},
    {"relu, gelu forward/backward", test_activations},
    {"softmax_xent and bad labels", test_softmax_xent},
    {"sum, sumsq, scale, axpy, all_finite", test_reductions},
    {"sgd_update, adamw_update", test_optimizer_kernels},
    {"1.2 entries present", test_table_1_2},
    {"1.2: bad dtypes and arguments rejected", test_ex_bad_dtypes},
    {"1.2: cast, round_to", test_cast_round_to},
    {"1.2: gemm_ex (f16 B, rounding, f64, workspace)", test_gemm_ex},
    {"1.6: gemm_ex into a bf16/f16 C (= f32 then rounded once, padding kept)", test_gemm_ex_c16},
    {"1.2: _ex bias, act, reductions (f32 = 1.1, f64 vs double)", test_ex_entries},
    {"1.2: act tanh, sigmoid, leaky_relu (f32, f64, limits, bad ids)", test_gan_activations},
    {"1.2: _ex softmax_xent and bad labels", test_ex_loss},
    {"1.2: _ex sgd, adamw", test_ex_optimizers},
    {"1.3: unscale_check over a list (f32, f64, inf, NaN, refusals)", test_unscale_check},
    {"1.3: linear_forward (f32, bf16 rounding, f64, = unfused, refusals)", test_linear_forward},
    {"1.6: linear_forward_layout (Conv1D (in, out) = unfused, OUT_IN = 1.3 entry, bad layout)", test_linear_forward_layout},
    {"1.7: 16-bit activation storage (8 entries = the f32 call, rounded as stored; refusals)", test_act16},
    {"1.8: linear_forward_layout's KILN_LAYOUT_ROUND_BIAS = the call with the bias rounded first", test_bias_round},
    {"1.9: sumsq_many = sumsq_ex per tensor, bit for bit", test_sumsq_many},
    {"1.10: adamw_update_many = adamw_update_ex per tensor, bit for bit", test_adamw_many},
    {"1.10: add_layernorm_forward = add then layernorm_forward, bit for bit", test_add_ln},
    {"1.11: act_bias_backward and layernorm_backward_cast = the entries they fuse, bit for bit", test_bwd_fuse},
    {"configure threads", test_configure},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "cpu_accel", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_cpu_accel},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
