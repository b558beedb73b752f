/*
 * cpu_gemm.c: the dense-layer GEMMs: cblas_sgemm through OpenBLAS
 * (row-major, all four transpose combinations) and a naive
 * double-accumulating reference GEMM the tests compare against. A linear
 * layer y = x W^T + b runs as kc_gemm then kc_bias_add; its backward is two
 * more kc_gemm calls (dx = dy W, dW = dy^T x) plus kc_bias_grad (the bias
 * kernels are cpu_train.inc's, in both dtypes).
 *
 * Large GEMMs are split across kiln's own pool, OpenBLAS itself running one
 * thread per call: each thread computes a block of C's columns (or rows) with
 * the full K, so every element still comes from one thread and the result
 * does not depend on timing. Why not OpenBLAS's threads: they spin between
 * calls, and in a training step, where GEMMs alternate with elementwise and
 * optimizer kernels, the spinning threads compete with ours for the cores
 * (on 2 cores the non-GEMM part of a step took ~10x longer that way). Our
 * pool sleeps between jobs.
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

typedef struct kc_gemm_ctx {
    int trans_a, trans_b, M, N, K;
    float alpha, beta;
    const float *A, *B; /* op(A): (M, K), op(B): (K, N) */
    float *C;           /* (M, N) */
    int lda, ldb, ldc;
} kc_gemm_ctx;

static void kc_sgemm(const kc_gemm_ctx *g, int M, int N, const float *A, const float *B, float *C) {
    kc_blas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans, M,
                N, g->K, g->alpha, A, g->lda, B, g->ldb, g->beta, C, g->ldc);
}

/* C[:, j0:j1] = op(A) op(B)[:, j0:j1] */
static void kc_gemm_cols(void *vc, size_t j0, size_t j1) {
    const kc_gemm_ctx *g = vc;
    const float *B = g->trans_b ? g->B + j0 * (size_t)g->ldb : g->B + j0;
    kc_sgemm(g, g->M, (int)(j1 - j0), g->A, B, g->C + j0);
}

/* C[i0:i1, :] = op(A)[i0:i1, :] op(B) */
static void kc_gemm_rows(void *vc, size_t i0, size_t i1) {
    const kc_gemm_ctx *g = vc;
    const float *A = g->trans_a ? g->A + i0 : g->A + i0 * (size_t)g->lda;
    kc_sgemm(g, (int)(i1 - i0), g->N, A, g->B, g->C + i0 * (size_t)g->ldc);
}

/* Below this many multiply-adds a GEMM is not worth a second thread. */
#define KC_GEMM_SPLIT_MIN_FLOPS ((double)(1 << 21))
#define KC_GEMM_SPLIT_GRAIN ((size_t)64)

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
    kc_gemm_ctx g = {trans_a, trans_b, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc};
    const int big = (double)M * (double)N * (double)K >= KC_GEMM_SPLIT_MIN_FLOPS && kc_get_num_threads() > 1;
    if (big && (size_t)N >= 2 * KC_GEMM_SPLIT_GRAIN)
        kc_parallel_for((size_t)N, KC_GEMM_SPLIT_GRAIN, KC_ALIGN_FLOATS, kc_gemm_cols, &g);
    else if (big && (size_t)M >= 2 * KC_GEMM_SPLIT_GRAIN)
        kc_parallel_for((size_t)M, KC_GEMM_SPLIT_GRAIN, 1, kc_gemm_rows, &g);
    else
        kc_sgemm(&g, M, N, A, B, C);
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
