/*
 * test_kernels_cpu.c: CUnit suite for kernels/cpu. It checks kc_gemm against
 * the naive double reference for every transpose combination and padded
 * leading dimensions; every backward kernel against central finite
 * differences of its forward; the loss, SGD and AdamW against values derived
 * independently (by hand, by a separate Python script quoted in a comment, or
 * by a double-precision textbook formula written inline here); the
 * reductions and BLAS-1 helpers; and that splitting loops across the thread
 * pool reproduces the single-threaded results bit for bit. The dtype
 * conversions, kc_gemm_ex and the float64 kernels have their own suite in
 * test_kernels_ex.c, the GAN activations (tanh, sigmoid, leaky ReLU) theirs
 * in test_kernels_act.c, both registered from here (one executable).
 */
#include "cpu_kernels.h"
#include "kt_common.h"

#include <CUnit/CUnit.h>
#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* <math.h>'s M_PI / M_LN2 are not ISO C11. */
#define KT_PI 3.14159265358979323846
#define KT_LN2 0.69314718055994530942

/* ------------------------------------------------------------- helpers */

/* Deterministic xorshift64* so failures reproduce. */
static test_rng g_rng = {0x9E3779B97F4A7C15ull};
static void rng_seed(uint64_t s) { test_rng_seed(&g_rng, s); }
static double rng_unit(void) { return test_rng_unit(&g_rng); } /* [0, 1) */
static float rng_uniform(float lo, float hi) { return lo + (hi - lo) * (float)rng_unit(); }
static void fill_uniform(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(lo, hi);
}

static float *falloc(size_t n) { return kt_alloc((n ? n : 1) * sizeof(float)); }

/* Counts elements outside tolerance, printing the first few for diagnosis. */
static int count_far(const char *what, const float *got, const double *want, size_t n,
                     double rtol, double atol) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!kt_close(got[i], want[i], rtol, atol)) {
            if (bad < 5)
                printf("\n  %s[%zu]: got %.9g want %.9g", what, i, (double)got[i], want[i]);
            bad++;
        }
    }
    return bad;
}

/* ------------------------------------------------------------------ GEMM */

/* One kc_gemm vs kc_gemm_ref comparison with padded leading dimensions; the
 * padding columns hold a sentinel that must survive. */
static void gemm_case(int ta, int tb, int M, int N, int K, float alpha, float beta, int pad) {
    const int a_rows = ta ? K : M, a_cols = ta ? M : K;
    const int b_rows = tb ? N : K, b_cols = tb ? K : N;
    const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
    float *A = falloc((size_t)a_rows * lda), *B = falloc((size_t)b_rows * ldb);
    float *C = falloc((size_t)M * ldc), *R = falloc((size_t)M * ldc);
    fill_uniform(A, (size_t)a_rows * lda, -1, 1);
    fill_uniform(B, (size_t)b_rows * ldb, -1, 1);
    fill_uniform(C, (size_t)M * ldc, -1, 1);
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++) C[(size_t)i * ldc + j] = 12345.0f;
    memcpy(R, C, (size_t)M * ldc * sizeof *C);
    kc_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    kc_gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, R, ldc);
    int bad = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < ldc; j++) {
            float got = C[(size_t)i * ldc + j], want = R[(size_t)i * ldc + j];
            /* float GEMM error grows ~ K * eps * |terms|; terms are <= 1 */
            if (j >= N ? got != 12345.0f : !kt_close(got, want, 1e-5, 1e-6 * (K + 1))) {
                if (bad < 3)
                    printf("\n  gemm ta=%d tb=%d %dx%dx%d C[%d,%d]: %.9g vs ref %.9g", ta, tb, M,
                           N, K, i, j, (double)got, (double)want);
                bad++;
            }
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    free(A), free(B), free(C), free(R);
}

static void test_gemm_vs_ref(void) {
    rng_seed(1);
    static const int sizes[][3] = {{7, 5, 3}, {33, 17, 65}, {1, 1, 1}, {64, 48, 32}, {3, 70, 9}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
                gemm_case(ta, tb, sizes[s][0], sizes[s][1], sizes[s][2], 0.75f, -0.5f, 3);
                gemm_case(ta, tb, sizes[s][0], sizes[s][1], sizes[s][2], 1.0f, 0.0f, 0);
                gemm_case(ta, tb, sizes[s][0], sizes[s][1], sizes[s][2], -2.0f, 1.0f, 5);
            }
}

/* beta == 0 must overwrite C without reading it (NaN in C is not kept), and
 * K == 0 leaves C = beta * C. */
static void test_gemm_beta_zero_and_k0(void) {
    float A[6] = {1, 2, 3, 4, 5, 6}; /* (2, 3) */
    float B[6] = {1, 0, 0, 1, 1, 1}; /* (3, 2) */
    float C[4] = {NAN, NAN, NAN, NAN};
    kc_gemm(0, 0, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2);
    /* [1 2 3; 4 5 6] * [1 0; 0 1; 1 1] = [4 5; 10 11] */
    CU_ASSERT_EQUAL(C[0], 4.0f);
    CU_ASSERT_EQUAL(C[1], 5.0f);
    CU_ASSERT_EQUAL(C[2], 10.0f);
    CU_ASSERT_EQUAL(C[3], 11.0f);
    float R[4] = {NAN, NAN, NAN, NAN};
    kc_gemm_ref(0, 0, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, R, 2);
    CU_ASSERT(memcmp(C, R, sizeof C) == 0);
    float D[4] = {1, 2, 3, 4};
    kc_gemm(0, 0, 2, 2, 0, 1.0f, A, 1, B, 2, 0.5f, D, 2);
    CU_ASSERT_EQUAL(D[0], 0.5f);
    CU_ASSERT_EQUAL(D[3], 2.0f);
    float E[4] = {NAN, 1, 2, 3};
    kc_gemm(0, 0, 2, 2, 0, 1.0f, A, 1, B, 2, 0.0f, E, 2);
    CU_ASSERT_EQUAL(E[0], 0.0f);
    CU_ASSERT_EQUAL(E[3], 0.0f);
}

/* sum(W .* C) in double, C: (M, N) contiguous. */
static double weighted_sum(const float *W, const float *C, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)W[i] * (double)C[i];
    return s;
}

/*
 * GEMM backward against finite differences. Forward C = op(A) op(B) with
 * loss L = sum(W .* C), so dC = W. Two layouts: the plain C = A B
 * (dA = dC B^T, dB = A^T dC) and the linear layer's C = A B^T with B (N, K)
 * the weight (dA = dC B, dB = dC^T A). L is linear in A and B, so the central
 * difference is exact up to float rounding for any step; eps = 0.25.
 */
/* d(sum W * C)/dp at the element p of A or B by central differences of
 * half-width eps, C = A op(B) (M x K times K x N; B is (N, K) when tb);
 * p is left as it was. */
static double gemm_fd(float *p, float eps, int tb, int M, int N, int K, const float *A, const float *B, float *C,
                      const float *W) {
    const int ldb = tb ? K : N;
    const size_t nC = (size_t)M * N;
    const float keep = *p;
    *p = keep + eps;
    kc_gemm(0, tb, M, N, K, 1.0f, A, K, B, ldb, 0.0f, C, N);
    const double lp = weighted_sum(W, C, nC);
    *p = keep - eps;
    kc_gemm(0, tb, M, N, K, 1.0f, A, K, B, ldb, 0.0f, C, N);
    const double lm = weighted_sum(W, C, nC);
    *p = keep;
    return (lp - lm) / (2.0 * eps);
}

static void gemm_grad_case(int tb) {
    const int M = 5, K = 7, N = 4;
    const size_t nA = (size_t)M * K, nB = (size_t)K * N, nC = (size_t)M * N;
    float *A = falloc(nA), *B = falloc(nB), *W = falloc(nC), *C = falloc(nC);
    float *dA = falloc(nA), *dB = falloc(nB);
    double *numA = malloc(nA * sizeof(double)), *numB = malloc(nB * sizeof(double));
    CU_ASSERT_FATAL(numA && numB);
    fill_uniform(A, nA, -1, 1);
    fill_uniform(B, nB, -1, 1);
    fill_uniform(W, nC, -1, 1);
    const float eps = 0.25f;
    for (size_t i = 0; i < nA; i++) numA[i] = gemm_fd(A + i, eps, tb, M, N, K, A, B, C, W);
    for (size_t i = 0; i < nB; i++) numB[i] = gemm_fd(B + i, eps, tb, M, N, K, A, B, C, W);
    if (!tb) {
        /* dA (M, K) = W (M, N) * B^T;  B (K, N) read transposed */
        kc_gemm(0, 1, M, K, N, 1.0f, W, N, B, N, 0.0f, dA, K);
        /* dB (K, N) = A^T * W;  A (M, K) read transposed */
        kc_gemm(1, 0, K, N, M, 1.0f, A, K, W, N, 0.0f, dB, N);
    } else {
        /* dA (M, K) = W (M, N) * B (N, K) */
        kc_gemm(0, 0, M, K, N, 1.0f, W, N, B, K, 0.0f, dA, K);
        /* dB (N, K) = W^T * A */
        kc_gemm(1, 0, N, K, M, 1.0f, W, N, A, K, 0.0f, dB, K);
    }
    CU_ASSERT_EQUAL(count_far("dA", dA, numA, nA, 1e-4, 1e-5), 0);
    CU_ASSERT_EQUAL(count_far("dB", dB, numB, nB, 1e-4, 1e-5), 0);
    free(A), free(B), free(W), free(C), free(dA), free(dB), free(numA), free(numB);
}

static void test_gemm_backward_fd(void) {
    rng_seed(2);
    gemm_grad_case(0);
    gemm_grad_case(1);
}

/* ------------------------------------------------------------------ bias */

static void test_bias_add_values(void) {
    float y[6] = {1, 2, 3, 4, 5, 6}; /* (2, 3) */
    const float b[3] = {10, 20, 30};
    kc_bias_add(y, b, 2, 3);
    const float want[6] = {11, 22, 33, 14, 25, 36};
    CU_ASSERT(memcmp(y, want, sizeof y) == 0);
}

/*
 * bias_grad via bias_add: y = x + b (broadcast), L = sum(W .* y), so
 * dL/db = column sums of W = kc_bias_grad(W). Checked by central differences
 * on b (exact for this linear L), plus accumulate=1 adding onto db.
 */
static void test_bias_grad_fd(void) {
    rng_seed(3);
    const int rows = 9, cols = 13;
    const size_t n = (size_t)rows * cols;
    float *x = falloc(n), *y = falloc(n), *W = falloc(n), b[13], db[13];
    double num[13];
    fill_uniform(x, n, -1, 1);
    fill_uniform(W, n, -1, 1);
    fill_uniform(b, cols, -1, 1);
    const float eps = 0.125f;
    for (int j = 0; j < cols; j++) {
        const float keep = b[j];
        b[j] = keep + eps;
        memcpy(y, x, n * sizeof *y);
        kc_bias_add(y, b, rows, cols);
        const double lp = weighted_sum(W, y, n);
        b[j] = keep - eps;
        memcpy(y, x, n * sizeof *y);
        kc_bias_add(y, b, rows, cols);
        const double lm = weighted_sum(W, y, n);
        b[j] = keep;
        num[j] = (lp - lm) / (2.0 * eps);
    }
    for (int j = 0; j < cols; j++) db[j] = NAN; /* must be overwritten */
    kc_bias_grad(db, W, rows, cols, 0);
    CU_ASSERT_EQUAL(count_far("db", db, num, (size_t)cols, 1e-4, 1e-5), 0);
    double twice[13];
    for (int j = 0; j < cols; j++) twice[j] = 2.0 * num[j];
    kc_bias_grad(db, W, rows, cols, 1);
    CU_ASSERT_EQUAL(count_far("db accumulated", db, twice, (size_t)cols, 1e-4, 1e-5), 0);
    free(x), free(y), free(W);
}

/* --------------------------------------------------------- activations */

/*
 * Elementwise backward vs central differences: L = sum(W .* f(x)), so
 * dL/dx_i = W_i f'(x_i); since f is elementwise only y_i moves when x_i
 * does, and the difference is taken in double from float forward outputs.
 */
typedef void (*fwd_fn)(float *, const float *, size_t);
typedef void (*bwd_fn)(float *, const float *, const float *, size_t);

static int fd_check_elementwise(const char *name, fwd_fn fwd, bwd_fn bwd, const float *x,
                                size_t n, float eps, double rtol, double atol) {
    float *W = falloc(n), *dx = falloc(n), *xp = falloc(n), *yp = falloc(n), *ym = falloc(n);
    double *num = malloc(n * sizeof(double));
    CU_ASSERT_FATAL(num != NULL);
    fill_uniform(W, n, -1, 1);
    for (size_t i = 0; i < n; i++) {
        xp[i] = x[i] + eps;
        ym[i] = x[i] - eps;
        /* the step actually taken, after float rounding of x +- eps */
        num[i] = (double)xp[i] - (double)ym[i];
    }
    fwd(yp, xp, n);
    fwd(ym, ym, n); /* in place */
    for (size_t i = 0; i < n; i++)
        num[i] = (double)W[i] * ((double)yp[i] - (double)ym[i]) / num[i];
    bwd(dx, W, x, n);
    int bad = count_far(name, dx, num, n, rtol, atol);
    free(W), free(dx), free(xp), free(yp), free(ym), free(num);
    return bad;
}

static void test_relu_values_and_fd(void) {
    const float x[6] = {-2.0f, -0.0f, 0.0f, 0.5f, 3.0f, NAN};
    float y[6];
    kc_relu_forward(y, x, 6);
    CU_ASSERT_EQUAL(y[0], 0.0f);
    CU_ASSERT_EQUAL(y[3], 0.5f);
    CU_ASSERT_EQUAL(y[4], 3.0f);
    CU_ASSERT(isnan(y[5]));
    const float dy[6] = {1, 2, 3, 4, 5, 6};
    float dx[6];
    kc_relu_backward(dx, dy, x, 6);
    const float want[6] = {0, 0, 0, 4, 5, 0};
    CU_ASSERT(memcmp(dx, want, sizeof dx) == 0);

    rng_seed(4);
    const size_t n = 101;
    float *xs = falloc(n);
    for (size_t i = 0; i < n; i++) {
        /* keep clear of the kink so x +- eps stays on one side */
        float v = rng_uniform(0.05f, 2.0f);
        xs[i] = (i % 2) ? v : -v;
    }
    CU_ASSERT_EQUAL(fd_check_elementwise("relu dx", kc_relu_forward, kc_relu_backward, xs, n,
                                         1e-2f, 1e-3, 1e-5), 0);
    free(xs);
}

/* GELU, tanh approximation, in double. 0.5 x (1 + tanh u) is written as
 * x / (1 + exp(-2u)) (the same function) because in double, too, 1 + tanh u
 * cancels to exactly 0 once x < -9.5, where the true value is still ~1e-34.
 * The tanh form itself is checked by the Python literals below. */
static double gelu_ref(double x) {
    const double c = sqrt(2.0 / KT_PI), u = c * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}
/* d/dx of x s with s = sigmoid(2u): s + x * 2 u' s (1 - s), 1 - s = e s. */
static double gelu_grad_ref(double x) {
    const double c = sqrt(2.0 / KT_PI), u = c * (x + 0.044715 * x * x * x);
    const double e = exp(-2.0 * u), s = 1.0 / (1.0 + e);
    return s + 2.0 * x * c * (1.0 + 3.0 * 0.044715 * x * x) * e * s * s;
}

static void test_gelu_values(void) {
    /* Known values of 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))), from
     * Python's math module: for x in [0,1,-1,2.5,-3]: repr(0.5*x*(1+tanh(u))). */
    const float x[5] = {0.0f, 1.0f, -1.0f, 2.5f, -3.0f};
    const double want[5] = {0.0, 0.8411919906082768, -0.15880800939172324, 2.484915733910001,
                            -0.0036373920817729943};
    float y[5];
    kc_gelu_forward(y, x, 5);
    CU_ASSERT_EQUAL(count_far("gelu known", y, want, 5, 1e-6, 0), 0);

    /* Dense sweep vs the double formula: a few float ulps relative, plus a
     * tiny absolute floor where y underflows (x < -9). */
    const size_t n = 4001;
    float *xs = falloc(n), *ys = falloc(n), *gs = falloc(n), *ones = falloc(n);
    double *wy = malloc(n * sizeof(double)), *wg = malloc(n * sizeof(double));
    CU_ASSERT_FATAL(wy && wg);
    for (size_t i = 0; i < n; i++) {
        xs[i] = -12.0f + 24.0f * (float)i / (float)(n - 1);
        ones[i] = 1.0f;
        wy[i] = gelu_ref(xs[i]);
        wg[i] = gelu_grad_ref(xs[i]);
    }
    kc_gelu_forward(ys, xs, n);
    kc_gelu_backward(gs, ones, xs, n);
    /* Tolerance: a few ulps times the relative condition number
     * |x gelu'(x) / gelu(x)|, which reaches ~200 near x = -10 (there y is
     * e^(-2u) with |u| ~ 30, so rounding x^3 alone moves y by 1e-5). */
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double cond = wy[i] != 0.0 ? fabs(xs[i] * wg[i] / wy[i]) : 0.0;
        if (!kt_close(ys[i], wy[i], 1.2e-7 * (8.0 + cond), 1e-30)) {
            if (bad++ < 5)
                printf("\n  gelu(%.9g): got %.9g want %.9g", (double)xs[i], (double)ys[i], wy[i]);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(count_far("gelu' sweep", gs, wg, n, 2e-6, 1e-6), 0);

    float special[3] = {NAN, INFINITY, 1.0f};
    kc_gelu_forward(special, special, 3);
    CU_ASSERT(isnan(special[0]));
    CU_ASSERT(isinf(special[1]) && special[1] > 0);
    free(xs), free(ys), free(gs), free(ones), free(wy), free(wg);
}

static void test_gelu_fd(void) {
    rng_seed(5);
    const size_t n = 257;
    float *x = falloc(n);
    fill_uniform(x, n, -5, 5);
    /* eps 1e-2: truncation ~ eps^2 |f'''| / 6 < 1e-4; float rounding of y
     * contributes ~ 1e-7 |y| / eps < 1e-4. */
    CU_ASSERT_EQUAL(fd_check_elementwise("gelu dx", kc_gelu_forward, kc_gelu_backward, x, n,
                                         1e-2f, 1e-2, 2e-4), 0);
    free(x);
}

/* In-place calls (y == x, dx == dy) must give what out-of-place calls give. */
static void test_elementwise_in_place(void) {
    rng_seed(6);
    const size_t n = 1000;
    float *x = falloc(n), *dy = falloc(n), *a = falloc(n), *b = falloc(n);
    fill_uniform(x, n, -4, 4);
    fill_uniform(dy, n, -1, 1);
    fwd_fn fwds[2] = {kc_relu_forward, kc_gelu_forward};
    bwd_fn bwds[2] = {kc_relu_backward, kc_gelu_backward};
    for (int k = 0; k < 2; k++) {
        fwds[k](a, x, n);
        memcpy(b, x, n * sizeof *b);
        fwds[k](b, b, n);
        CU_ASSERT(memcmp(a, b, n * sizeof *a) == 0);
        bwds[k](a, dy, x, n);
        memcpy(b, dy, n * sizeof *b);
        bwds[k](b, b, x, n);
        CU_ASSERT(memcmp(a, b, n * sizeof *a) == 0);
    }
    free(x), free(dy), free(a), free(b);
}

/* ------------------------------------------------------------------ loss */

static void test_softmax_xent_known(void) {
    /* All-zero logits: p = 1/C everywhere, loss = log C. */
    float logits[4 * 5] = {0}, probs[4 * 5];
    int32_t labels[4] = {0, 1, 3, 2};
    int nc = -1;
    float loss = kc_softmax_xent_forward(probs, logits, labels, 4, 5, &nc);
    CU_ASSERT_DOUBLE_EQUAL(loss, log(5.0), 1e-6);
    for (int i = 0; i < 20; i++) CU_ASSERT_DOUBLE_EQUAL(probs[i], 0.2, 1e-7);
    CU_ASSERT_EQUAL(nc, 1); /* all tied: argmax is column 0, so only row 0 */

    /*
     * Hand-computed 2x3 case. Row 0: logits (1, 2, 3), label 2:
     *   Z = e + e^2 + e^3 = 30.19287485; p = (0.09003057, 0.24472847,
     *   0.66524096); -log p2 = log(Z) - 3 = 0.40760596.
     * Row 1: logits (0, 0, ln 2) i.e. weights (1, 1, 2), label 0:
     *   p = (0.25, 0.25, 0.5); -log p0 = log 4 = 1.38629436.
     * Mean = 0.89695016. Argmax row 0 = 2 (correct), row 1 = 2 (wrong).
     */
    const float l2[6] = {1.0f, 2.0f, 3.0f, 0.0f, 0.0f, (float)KT_LN2};
    const int32_t y2[2] = {2, 0};
    float p2[6];
    loss = kc_softmax_xent_forward(p2, l2, y2, 2, 3, &nc);
    CU_ASSERT_DOUBLE_EQUAL(loss, 0.89695016, 1e-6);
    CU_ASSERT_EQUAL(nc, 1);
    const double wp[6] = {0.09003057, 0.24472847, 0.66524096, 0.25, 0.25, 0.5};
    CU_ASSERT_EQUAL(count_far("p2", p2, wp, 6, 1e-6, 1e-7), 0);
    /* probs rows sum to 1 */
    CU_ASSERT_DOUBLE_EQUAL(p2[0] + p2[1] + p2[2], 1.0, 1e-6);

    /* n_correct may be NULL */
    loss = kc_softmax_xent_forward(p2, l2, y2, 2, 3, NULL);
    CU_ASSERT_DOUBLE_EQUAL(loss, 0.89695016, 1e-6);

    /* Ties go to the first maximum: rows (2, 5, 5, 1) with labels 1 and 2
     * give one correct row (a last-maximum rule would also give one, but
     * the other row). */
    const float lt[8] = {2, 5, 5, 1, 2, 5, 5, 1};
    const int32_t first[2] = {1, 1}, second[2] = {2, 2};
    float pt[8];
    kc_softmax_xent_forward(pt, lt, first, 2, 4, &nc);
    CU_ASSERT_EQUAL(nc, 2);
    kc_softmax_xent_forward(pt, lt, second, 2, 4, &nc);
    CU_ASSERT_EQUAL(nc, 0);
}

static void test_softmax_xent_extremes(void) {
    /* Logits of magnitude 1000 must not overflow: row (1000, 0, -1000) with
     * label 0 has loss ~ e^-1000 ~ 0; label 2 has loss 2000 (exact). */
    const float l[6] = {1000.0f, 0.0f, -1000.0f, 1000.0f, 0.0f, -1000.0f};
    const int32_t y[2] = {0, 2};
    float p[6];
    int nc = 0;
    float loss = kc_softmax_xent_forward(p, l, y, 2, 3, &nc);
    CU_ASSERT(isfinite(loss));
    CU_ASSERT_DOUBLE_EQUAL(loss, 1000.0, 1e-3); /* (0 + 2000) / 2 */
    for (int i = 0; i < 6; i++) CU_ASSERT(isfinite(p[i]));
    CU_ASSERT_EQUAL(p[0], 1.0f);
    CU_ASSERT_EQUAL(nc, 1);

    /* Out-of-range labels: NAN, and n_correct counts only the valid rows. */
    const float l2[6] = {0.0f, 5.0f, 1.0f, 3.0f, 0.0f, 0.0f};
    int32_t bad[2] = {1, 3};
    loss = kc_softmax_xent_forward(p, l2, bad, 2, 3, &nc);
    CU_ASSERT(isnan(loss));
    CU_ASSERT_EQUAL(nc, 1);
    bad[1] = -1;
    CU_ASSERT(isnan(kc_softmax_xent_forward(p, l2, bad, 2, 3, &nc)));
    /* backward fills the bad row with NaN, leaves the good one finite */
    float d[6];
    kc_softmax_xent_backward(d, p, bad, 2, 3, 1.0f);
    CU_ASSERT(isfinite(d[0]) && isfinite(d[1]) && isfinite(d[2]));
    CU_ASSERT(isnan(d[3]) && isnan(d[4]) && isnan(d[5]));
    /* empty batch */
    CU_ASSERT(isnan(kc_softmax_xent_forward(p, l2, bad, 0, 3, &nc)));
    CU_ASSERT_EQUAL(nc, 0);
}

/* d(mean loss)/d logits vs central differences of the forward's loss. */
static void test_softmax_xent_backward_fd(void) {
    rng_seed(7);
    const int B = 4, C = 6;
    const size_t n = (size_t)B * C;
    float logits[24], probs[24], d[24], scratch[24];
    double num[24];
    const int32_t labels[4] = {0, 5, 2, 2};
    fill_uniform(logits, n, -2, 2);
    const float eps = 1e-2f;
    for (size_t i = 0; i < n; i++) {
        const float keep = logits[i];
        logits[i] = keep + eps;
        const double lp = kc_softmax_xent_forward(scratch, logits, labels, B, C, NULL);
        logits[i] = keep - eps;
        const double lm = kc_softmax_xent_forward(scratch, logits, labels, B, C, NULL);
        logits[i] = keep;
        num[i] = (lp - lm) / (2.0 * eps);
    }
    kc_softmax_xent_forward(probs, logits, labels, B, C, NULL);
    kc_softmax_xent_backward(d, probs, labels, B, C, 1.0f);
    CU_ASSERT_EQUAL(count_far("dlogits", d, num, n, 1e-2, 2e-4), 0);
    /* dloss scales linearly; in place (dlogits == probs) gives the same. */
    float d2[24];
    kc_softmax_xent_backward(d2, probs, labels, B, C, 2.5f);
    double scaled[24];
    for (size_t i = 0; i < n; i++) scaled[i] = 2.5 * d[i];
    CU_ASSERT_EQUAL(count_far("dlogits*2.5", d2, scaled, n, 1e-6, 1e-9), 0);
    kc_softmax_xent_backward(probs, probs, labels, B, C, 1.0f);
    CU_ASSERT(memcmp(probs, d, sizeof d) == 0);
    /* each row of the gradient sums to 0 */
    for (int b = 0; b < B; b++) {
        double s = 0;
        for (int j = 0; j < C; j++) s += d[b * C + j];
        CU_ASSERT_DOUBLE_EQUAL(s, 0.0, 1e-7);
    }
}

/* ----------------------------------------------------- reductions, BLAS-1 */

static void test_reductions_and_blas1(void) {
    const float x[5] = {1.0f, -2.0f, 3.5f, 0.25f, -0.75f};
    CU_ASSERT_DOUBLE_EQUAL(kc_sum(x, 5), 2.0, 0);
    CU_ASSERT_DOUBLE_EQUAL(kc_sumsq(x, 5), 1 + 4 + 12.25 + 0.0625 + 0.5625, 0);
    CU_ASSERT_DOUBLE_EQUAL(kc_sum(x, 0), 0.0, 0);

    /* double accumulation: 2^24 + 1 + ... is lost in float, kept here */
    const size_t n = 100003;
    float *big = falloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (i == 0) ? 16777216.0f : 1.0f;
    CU_ASSERT_DOUBLE_EQUAL(kc_sum(big, n), 16777216.0 + (double)(n - 1), 0);
    for (size_t i = 0; i < n; i++) big[i] = (float)((i % 7) - 3) * 0.5f;
    double want = 0, want2 = 0;
    for (size_t i = 0; i < n; i++) want += big[i], want2 += (double)big[i] * big[i];
    CU_ASSERT_DOUBLE_EQUAL(kc_sum(big, n), want, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(kc_sumsq(big, n), want2, 1e-6);

    float y[5] = {1, 1, 1, 1, 1};
    kc_axpy(y, 2.0f, x, 5);
    const float wa[5] = {3.0f, -3.0f, 8.0f, 1.5f, -0.5f};
    CU_ASSERT(memcmp(y, wa, sizeof y) == 0);
    kc_scale(y, -0.5f, 5);
    const float ws[5] = {-1.5f, 1.5f, -4.0f, -0.75f, 0.25f};
    CU_ASSERT(memcmp(y, ws, sizeof y) == 0);

    CU_ASSERT_EQUAL(kc_all_finite(x, 5), 1);
    CU_ASSERT_EQUAL(kc_all_finite(x, 0), 1);
    float z[5];
    const float specials[3] = {NAN, INFINITY, -INFINITY};
    for (int s = 0; s < 3; s++)
        for (int pos = 0; pos < 5; pos++) {
            memcpy(z, x, sizeof z);
            z[pos] = specials[s];
            CU_ASSERT_EQUAL(kc_all_finite(z, 5), 0);
        }
    /* largest finite and denormals are finite */
    const float edge[3] = {3.4028235e38f, -3.4028235e38f, 1e-45f};
    CU_ASSERT_EQUAL(kc_all_finite(edge, 3), 1);
    /* a non-finite value deep inside a large (multi-block) buffer */
    for (size_t i = 0; i < n; i++) big[i] = 1.0f;
    CU_ASSERT_EQUAL(kc_all_finite(big, n), 1);
    big[n - 2] = -INFINITY;
    CU_ASSERT_EQUAL(kc_all_finite(big, n), 0);
    free(big);
}

/* ------------------------------------------------------------------ SGD */

/* Runs 3 SGD steps on p = 1 with constant g = 1, lr = 0.1 and checks p after
 * each step against hand-derived values (see test_sgd_hand). */
static void sgd3(float momentum, float dampening, int nesterov, float wd, const double want[3]) {
    float p = 1.0f, g = 1.0f, buf = -777.0f; /* buf garbage: first step must ignore it */
    for (int t = 0; t < 3; t++) {
        kc_sgd_update(&p, &g, momentum != 0.0f ? &buf : NULL, 1, 0.1f, momentum, dampening,
                      nesterov, wd, t == 0);
        if (!kt_close(p, want[t], 1e-6, 1e-7))
            printf("\n  sgd mom=%g damp=%g nest=%d wd=%g step %d: p=%.9g want %.9g",
                   (double)momentum, (double)dampening, nesterov, (double)wd, t + 1, (double)p,
                   want[t]);
        CU_ASSERT(kt_close(p, want[t], 1e-6, 1e-7));
    }
}

/*
 * Expected values by hand, p0 = 1, g = 1 every step, lr = 0.1, following
 * torch.optim.SGD's documented algorithm (buf_1 = g'; dampening only from
 * step 2; nesterov uses g' + mu * buf):
 *  plain:            p = 0.9, 0.8, 0.7
 *  momentum 0.9:     buf = 1, 1.9, 2.71           -> p = 0.9, 0.71, 0.439
 *  + dampening 0.5:  buf = 1, 0.9+0.5=1.4, 1.26+0.5=1.76 -> p = 0.9, 0.76, 0.584
 *  nesterov, mu 0.9: buf = 1, 1.9, 2.71; g'' = 1.9, 2.71, 3.439
 *                                                 -> p = 0.81, 0.539, 0.1951
 *  wd 0.1, mu 0.9:   g' = 1.1, 1.089, 1.06821; buf = 1.1, 2.079, 2.93931
 *                                                 -> p = 0.89, 0.6821, 0.388169
 *  wd 0.1, no mom:   g' = 1.1, 1.089, 1.07811     -> p = 0.89, 0.7811, 0.673289
 */
static void test_sgd_hand(void) {
    const double plain[3] = {0.9, 0.8, 0.7};
    const double mom[3] = {0.9, 0.71, 0.439};
    const double damp[3] = {0.9, 0.76, 0.584};
    const double nest[3] = {0.81, 0.539, 0.1951};
    const double wdm[3] = {0.89, 0.6821, 0.388169};
    const double wd0[3] = {0.89, 0.7811, 0.673289};
    sgd3(0.0f, 0.0f, 0, 0.0f, plain);
    sgd3(0.9f, 0.0f, 0, 0.0f, mom);
    sgd3(0.9f, 0.5f, 0, 0.0f, damp);
    sgd3(0.9f, 0.0f, 1, 0.0f, nest);
    sgd3(0.9f, 0.0f, 0, 0.1f, wdm);
    sgd3(0.0f, 0.0f, 0, 0.1f, wd0);
}

/* Random vectors, all option combinations, 3 steps, against the textbook
 * algorithm evaluated in double (same float hyperparameter values). */
static void test_sgd_vs_double(void) {
    rng_seed(8);
    enum { N = 37, T = 3 };
    for (int mode = 0; mode < 16; mode++) {
        const kt_sgd_opts o = kt_sgd_mode(mode);
        float p[N], buf[N], g[N];
        double pd[N], bd[N], gd[N];
        fill_uniform(p, N, -1, 1);
        for (int i = 0; i < N; i++) pd[i] = p[i];
        for (int t = 0; t < T; t++) {
            fill_uniform(g, N, -1, 1);
            kc_sgd_update(p, g, buf, N, o.lr, o.mu, o.damp, o.nest, o.wd, t == 0);
            for (int i = 0; i < N; i++) gd[i] = g[i];
            kt_sgd_textbook(pd, bd, gd, N, o.lr, o.mu, o.damp, o.nest, o.wd, t == 0);
        }
        CU_ASSERT_EQUAL(count_far("sgd p", p, pd, N, 1e-5, 1e-6), 0);
        if (o.mu != 0.0f) CU_ASSERT_EQUAL(count_far("sgd buf", buf, bd, N, 1e-5, 1e-6), 0);
    }
}

/* ---------------------------------------------------------------- AdamW */

/* The Python literals of kt_common.h (textbook AdamW in double) through
 * the float API with double hyperparameters, exactly the script's Python
 * floats. */
static void test_adamw_literals(void) {
    /* float p carries ~1e-7 relative rounding per op; the gradients are
     * float-rounded decimals (relative 3e-8), hence the tolerance */
    KT_ADAMW_LITERALS(float, kc_adamw_update_d, count_far, "adamw", 1e-6, 1e-6, 1e-5);
}

/* The float API and lerp's large-weight branch (beta1 < 0.5) against the
 * textbook formula in double with the same float hyperparameter values. */
static void adamw_vs_double(float lr, float b1, float b2, float eps, float wd) {
    enum { N = 41, T = 3 };
    float p[N], m[N] = {0}, v[N] = {0}, g[N];
    double pd[N], md[N] = {0}, vd[N] = {0}, gd[N];
    fill_uniform(p, N, -2, 2);
    for (int i = 0; i < N; i++) pd[i] = p[i];
    for (int t = 1; t <= T; t++) {
        fill_uniform(g, N, -0.5f, 0.5f);
        kc_adamw_update(p, g, m, v, N, lr, b1, b2, eps, wd, t);
        for (int i = 0; i < N; i++) gd[i] = g[i];
        kt_adamw_textbook(pd, md, vd, gd, N, lr, b1, b2, eps, wd, t);
    }
    CU_ASSERT_EQUAL(count_far("adamw p", p, pd, N, 2e-6, 2e-6), 0);
    CU_ASSERT_EQUAL(count_far("adamw m", m, md, N, 1e-5, 1e-9), 0);
    CU_ASSERT_EQUAL(count_far("adamw v", v, vd, N, 1e-5, 1e-12), 0);
}

static void test_adamw_vs_double(void) {
    rng_seed(9);
    adamw_vs_double(1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f);
    adamw_vs_double(3e-2f, 0.3f, 0.95f, 1e-6f, 0.0f); /* lerp weight 0.7 >= 0.5 */
    adamw_vs_double(1e-2f, 0.0f, 0.5f, 1e-3f, 0.5f);
}

/* The optimizer updates flush subnormals (kc_ftz_begin): a decayed Adam m
 * or momentum buffer below 2^-126 becomes 0 instead of a slow subnormal,
 * normal values are untouched, and the caller's MXCSR is restored. */
static void test_optim_flush_subnormals(void) {
#if defined(__x86_64__) || defined(__SSE2__)
    const unsigned int csr = _mm_getcsr();
#endif
    const float tiny = 1e-39f; /* subnormal */
    float p[4] = {1.0f, -0.5f, 0.25f, 2.0f}, g[4] = {0.0f, 0.1f, 0.0f, -0.2f};
    float m[4] = {tiny, 0.01f, -tiny, 0.0f}, v[4] = {1e-6f, 1e-6f, 1e-6f, 1e-6f};
    kc_adamw_update_d(p, g, m, v, 4, 0.01, 0.9, 0.999, 1e-8, 0.0, 1000);
    CU_ASSERT(m[0] == 0.0f && m[2] == 0.0f); /* 0.9 * tiny is subnormal: flushed */
    CU_ASSERT(m[1] != 0.0f && m[3] != 0.0f);
    CU_ASSERT_EQUAL(p[0], 1.0f);               /* a zero step leaves p alone */
    float pb[3] = {1.0f, 2.0f, 3.0f}, gb[3] = {0.0f, 0.0f, 1.0f}, b[3] = {tiny, 1e-3f, 0.0f};
    kc_sgd_update(pb, gb, b, 3, 0.1f, 0.9f, 0.0f, 0, 0.0f, 0);
    CU_ASSERT(b[0] == 0.0f);
    CU_ASSERT(b[1] == 0.9f * 1e-3f && b[2] == 1.0f);
#if defined(__x86_64__) || defined(__SSE2__)
    CU_ASSERT_EQUAL(_mm_getcsr(), csr);
    /* outside the updates, gradual underflow as before */
    volatile float x = tiny;
    CU_ASSERT(x * 0.5f != 0.0f);
#endif
    /* kc_set_flush_denormal(0): IEEE inside the updates too (PyTorch's
     * default), so the decayed state stays subnormal */
    kc_set_flush_denormal(0);
    float p2[2] = {1.0f, 1.0f}, g2[2] = {0.0f, 0.0f}, m2[2] = {tiny, -tiny}, v2[2] = {1e-6f, 1e-6f};
    kc_adamw_update_d(p2, g2, m2, v2, 2, 0.01, 0.9, 0.999, 1e-8, 0.0, 1000);
    CU_ASSERT(m2[0] == 0.9f * tiny && m2[0] != 0.0f && m2[1] == -0.9f * tiny);
    float pb2[1] = {1.0f}, gb2[1] = {0.0f}, b2[1] = {tiny};
    kc_sgd_update(pb2, gb2, b2, 1, 0.1f, 0.9f, 0.0f, 0, 0.0f, 0);
    CU_ASSERT(b2[0] == 0.9f * tiny && b2[0] != 0.0f);
    kc_set_flush_denormal(1);
}

/* ---------------------------------------------------------------- threads */

/* Runs every threaded kernel at the current thread count on fresh copies of
 * the same inputs; out receives all results concatenated. */
enum { TN = (3 << 18) + 13, TROWS = 257, TCOLS = 3001, XB = 997, XC = 769 }; /* TROWS * TCOLS <= TN: x and g are read as (TROWS, TCOLS) */
#define T_OUT_N (11 * (size_t)TN + (size_t)TROWS * TCOLS + TCOLS + 2 * (size_t)XB * XC)

static void run_all_kernels(const float *x, const float *g, const int32_t *labels, float *out,
                            double *sums) {
    const size_t n = TN;
    float *o = out;
    kc_relu_forward(o, x, n), o += n;
    kc_relu_backward(o, g, x, n), o += n;
    kc_gelu_forward(o, x, n), o += n;
    kc_gelu_backward(o, g, x, n), o += n;
    memcpy(o, x, n * sizeof *o), kc_scale(o, 0.37f, n), o += n;
    memcpy(o, x, n * sizeof *o), kc_axpy(o, -1.3f, g, n), o += n;
    /* SGD with every feature on (nesterov, dampening, weight decay), 2 steps */
    float *p = o, *buf = o + n;
    memcpy(p, x, n * sizeof *p);
    kc_sgd_update(p, g, buf, n, 0.1f, 0.9f, 0.1f, 1, 0.01f, 1);
    kc_sgd_update(p, x, buf, n, 0.1f, 0.9f, 0.1f, 1, 0.01f, 0);
    o += 2 * n;
    /* AdamW, 2 steps */
    float *ap = o, *am = o + n, *av = o + 2 * n;
    memcpy(ap, x, n * sizeof *ap);
    memset(am, 0, n * sizeof *am);
    memset(av, 0, n * sizeof *av);
    kc_adamw_update(ap, g, am, av, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
    kc_adamw_update(ap, x, am, av, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 2);
    o += 3 * n;
    /* bias add over (TROWS, TCOLS) and its gradient, accumulate on top */
    const size_t nb = (size_t)TROWS * TCOLS;
    memcpy(o, x, nb * sizeof *o);
    kc_bias_add(o, g, TROWS, TCOLS);
    o += nb;
    kc_bias_grad(o, x, TROWS, TCOLS, 0);
    kc_bias_grad(o, g, TROWS, TCOLS, 1);
    o += TCOLS;
    /* softmax + cross-entropy over a vocabulary-sized (XB, XC) */
    int nc = -1;
    sums[3] = kc_softmax_xent_forward(o, x, labels, XB, XC, &nc);
    sums[4] = nc;
    kc_softmax_xent_backward(o + (size_t)XB * XC, o, labels, XB, XC, 0.5f);
    o += 2 * (size_t)XB * XC;
    sums[0] = kc_sum(x, n);
    sums[1] = kc_sumsq(g, n);
    sums[2] = kc_all_finite(x, n);
}

static void test_threads_bit_identical(void) {
    const size_t n = TN;
    const size_t out_n = T_OUT_N;
    float *x = falloc(n), *g = falloc(n), *ref = falloc(out_n), *got = falloc(out_n);
    int32_t labels[XB];
    rng_seed(10);
    fill_uniform(x, n, -6, 6);
    fill_uniform(g, n, -1, 1);
    for (int i = 0; i < XB; i++) labels[i] = (int32_t)(rng_unit() * XC);
    double ref_sums[5], sums[5];
    CU_ASSERT_EQUAL(kc_set_num_threads(1), 1);
    run_all_kernels(x, g, labels, ref, ref_sums);
    CU_ASSERT(isfinite(ref_sums[3]) && ref_sums[3] > 0);
    const int counts[] = {2, 3, 4, 2};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        CU_ASSERT_EQUAL(kc_set_num_threads(counts[k]), counts[k]);
        CU_ASSERT_EQUAL(kc_get_num_threads(), counts[k]);
        memset(got, 0xff, out_n * sizeof *got);
        run_all_kernels(x, g, labels, got, sums);
        for (size_t i = 0; i < out_n; i++) {
            if (memcmp(&got[i], &ref[i], sizeof *got) != 0) {
                printf("\n  %d threads: output %zu (kernel block %zu) differs: %.9g vs %.9g",
                       counts[k], i, i / n, (double)got[i], (double)ref[i]);
                CU_FAIL("threaded result differs from single-threaded");
                break;
            }
        }
        CU_ASSERT(memcmp(sums, ref_sums, sizeof sums) == 0);
    }
    /* non-finite detection across block and thread boundaries */
    x[n / 2 + 1] = NAN;
    CU_ASSERT_EQUAL(kc_all_finite(x, n), 0);
    x[n / 2 + 1] = 0.0f;
    x[n - 1] = INFINITY;
    CU_ASSERT_EQUAL(kc_all_finite(x, n), 0);
    CU_ASSERT_EQUAL(kc_set_num_threads(0), 1); /* < 1 means 1: joins the workers */
    CU_ASSERT_EQUAL(kc_get_num_threads(), 1);
    CU_ASSERT_EQUAL(kc_all_finite(x, n), 0);
    free(x), free(g), free(ref), free(got);
}

/* kc_zero clears exactly [p, p+bytes) at every thread count, including a
 * size that splits (several MiB) and starts and ends off a cache line. */
static void test_zero_split(void) {
    const size_t total = (size_t)5 << 20, off = 3, bytes = total - 64 - 7;
    unsigned char *buf = malloc(total);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    const int counts[] = {1, 2, 3};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        CU_ASSERT_EQUAL(kc_set_num_threads(counts[k]), counts[k]);
        memset(buf, 0xa5, total);
        kc_zero(buf + off, bytes);
        size_t bad = 0;
        for (size_t i = 0; i < total; i++) {
            int inside = i >= off && i < off + bytes;
            if (buf[i] != (inside ? 0 : 0xa5)) bad++;
        }
        CU_ASSERT_EQUAL(bad, 0);
        kc_zero(buf, 0); /* no-op, no crash */
    }
    CU_ASSERT_EQUAL(kc_set_num_threads(1), 1);
    free(buf);
}

/* ------------------------------------------------------------------ main */

extern CU_TestInfo kt_ex_cases[];  /* test_kernels_ex.c */
extern CU_TestInfo kt_act_cases[]; /* test_kernels_act.c */

static CU_TestInfo cases_kernels_cpu[] = {
    {"gemm_vs_ref_all_transposes", test_gemm_vs_ref},
    {"gemm_beta_zero_and_k0", test_gemm_beta_zero_and_k0},
    {"gemm_backward_fd", test_gemm_backward_fd},
    {"bias_add_values", test_bias_add_values},
    {"bias_grad_fd", test_bias_grad_fd},
    {"relu_values_and_fd", test_relu_values_and_fd},
    {"gelu_values", test_gelu_values},
    {"gelu_fd", test_gelu_fd},
    {"elementwise_in_place", test_elementwise_in_place},
    {"softmax_xent_known", test_softmax_xent_known},
    {"softmax_xent_extremes", test_softmax_xent_extremes},
    {"softmax_xent_backward_fd", test_softmax_xent_backward_fd},
    {"reductions_and_blas1", test_reductions_and_blas1},
    {"zero_split", test_zero_split},
    {"sgd_hand", test_sgd_hand},
    {"sgd_vs_double", test_sgd_vs_double},
    {"adamw_literals", test_adamw_literals},
    {"adamw_vs_double", test_adamw_vs_double},
    {"optim_flush_subnormals", test_optim_flush_subnormals},
    {"threads_bit_identical", test_threads_bit_identical},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    CU_SuiteInfo suites[] = {
        {.pName = "kernels_cpu", .pTests = cases_kernels_cpu},
        {.pName = "kernels_cpu_dtypes_f64", .pTests = kt_ex_cases},
        {.pName = "kernels_cpu_gan_activations", .pTests = kt_act_cases},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
