/*
 * cpu_gemm.c: the dense-layer kernels: GEMM through OpenBLAS's cblas_sgemm
 * (row-major, all four transpose combinations), a naive double-accumulating
 * reference GEMM the tests compare against, and the bias broadcast-add and its
 * gradient (column sums). A linear layer y = x W^T + b runs as kc_gemm then
 * kc_bias_add; its backward is two more kc_gemm calls (dx = dy W,
 * dW = dy^T x) plus kc_bias_grad. The bias kernels are single loops over a
 * contiguous row that the compiler vectorizes; when the matrix is large they
 * split across the pool (bias_add by rows, bias_grad by columns, so every
 * output element is still produced by one thread with the serial arithmetic).
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"

#include <cblas.h>

/* K == 0, or a reference GEMM's epilogue: C = beta * C, with beta == 0
 * meaning "overwrite" (BLAS convention: C may hold NaN then).
 * C: (M, N) with leading dimension ldc. */
static void kc_scale_matrix(float *C, int M, int N, int ldc, float beta) {
    for (int i = 0; i < M; i++) {
        float *restrict c = C + (size_t)i * (size_t)ldc;
        if (beta == 0.0f) {
            for (int j = 0; j < N; j++) c[j] = 0.0f;
        } else {
            for (int j = 0; j < N; j++) c[j] = beta * c[j];
        }
    }
}

void kc_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
             const float *A, int lda, const float *B, int ldb, float beta,
             float *C, int ldc) {
    if (M <= 0 || N <= 0 || K < 0) return;
    if (K == 0) {
        /* OpenBLAS rejects lda < max(1, K) with an error message; the result
         * is just the beta scaling, so do it here. */
        kc_scale_matrix(C, M, N, ldc, beta);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb,
                beta, C, ldc);
}

void kc_gemm_ref(int trans_a, int trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta,
                 float *C, int ldc) {
    if (M <= 0 || N <= 0 || K < 0) return;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++) {
                /* op(A)[i][k] and op(B)[k][j] in the stored layouts. */
                double a = trans_a ? A[(size_t)k * (size_t)lda + (size_t)i]
                                   : A[(size_t)i * (size_t)lda + (size_t)k];
                double b = trans_b ? B[(size_t)j * (size_t)ldb + (size_t)k]
                                   : B[(size_t)k * (size_t)ldb + (size_t)j];
                acc += a * b;
            }
            float *c = &C[(size_t)i * (size_t)ldc + (size_t)j];
            double r = (double)alpha * acc;
            if (beta != 0.0f) r += (double)beta * (double)*c;
            *c = (float)r;
        }
    }
}

/* ------------------------------------------------------------- bias add */

typedef struct {
    float *y;       /* (rows, cols) */
    const float *b; /* (cols) */
    size_t cols;
} kc_bias_add_ctx;

/* Rows [r0, r1). */
static void kc_bias_add_range(void *vctx, size_t r0, size_t r1) {
    const kc_bias_add_ctx *c = vctx;
    const size_t cols = c->cols;
    const float *restrict b = c->b;
    for (size_t r = r0; r < r1; r++) {
        float *restrict y = c->y + r * cols;
        for (size_t j = 0; j < cols; j++) y[j] += b[j];
    }
}

void kc_bias_add(float *y, const float *b, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    kc_bias_add_ctx c = {y, b, (size_t)cols};
    size_t grain = KC_GRAIN_STREAM / (size_t)cols;
    kc_parallel_for((size_t)rows, grain ? grain : 1, 1, kc_bias_add_range, &c);
}

/* ------------------------------------------------------------ bias grad */

typedef struct {
    float *db;       /* (cols) */
    const float *dy; /* (rows, cols) */
    size_t rows, cols;
    int accumulate;
} kc_bias_grad_ctx;

/* Columns [j0, j1): db[j] accumulates rows in order 0..rows-1, the same
 * order whichever thread owns column j. */
static void kc_bias_grad_range(void *vctx, size_t j0, size_t j1) {
    const kc_bias_grad_ctx *c = vctx;
    float *restrict db = c->db + j0;
    const size_t w = j1 - j0;
    if (!c->accumulate) {
        for (size_t j = 0; j < w; j++) db[j] = 0.0f;
    }
    for (size_t r = 0; r < c->rows; r++) {
        const float *restrict dy = c->dy + r * c->cols + j0;
        for (size_t j = 0; j < w; j++) db[j] += dy[j];
    }
}

void kc_bias_grad(float *db, const float *dy, int rows, int cols, int accumulate) {
    if (cols <= 0) return;
    if (rows < 0) rows = 0;
    kc_bias_grad_ctx c = {db, dy, (size_t)rows, (size_t)cols, accumulate};
    /* Split columns only when each thread gets a full grain of elements and
     * a column strip of at least 64 floats (shorter strips waste the rows'
     * cache lines). */
    size_t grain = rows ? KC_GRAIN_STREAM / (size_t)rows : (size_t)cols;
    if (grain < 64) grain = 64;
    kc_parallel_for((size_t)cols, grain, KC_ALIGN_FLOATS, kc_bias_grad_range, &c);
}
