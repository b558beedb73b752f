/*
 * bench/gpu/bench_lt.h — what the two GPU benchmark programs share: error
 * checks that print the failing call and return 1 from the caller (define
 * BLT_ME, the program's name, first), and a row-major cuBLASLt GEMM planned
 * the way plugins/cuda/cuda_blas.c maps it (C(M,N) = op(A) op(B) computed as
 * the column-major C^T = op(B)^T op(A)^T, operands swapped, so no data
 * moves), optionally with the bias epilogue. Header-only, benchmarks only.
 */
#ifndef KILN_BENCH_GPU_BENCH_LT_H
#define KILN_BENCH_GPU_BENCH_LT_H

#include <stdint.h>
#include <stdio.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#ifndef BLT_ME
#error "define BLT_ME (the program's name) before including bench_lt.h"
#endif

#define CK(call)                                                                                \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, BLT_ME ": %s failed: %s\n", #call, cudaGetErrorString(e_));         \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)
#define CB(call)                                                                                \
    do {                                                                                        \
        cublasStatus_t s_ = (call);                                                             \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                      \
            fprintf(stderr, BLT_ME ": %s failed: %s\n", #call, cublasLtGetStatusString(s_));    \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)

/* A planned GEMM; call cublasLtMatmul with the caller's B first (la), then
 * the caller's A (lb), and C as both C and D (lc). */
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} blt_gemm;

/* Plans C(M,N) = op(A)(M,K) op(B)(K,N) with A, B of type ab and an fp32 C
 * (packed, row-major), under `compute`, within `ws` bytes of workspace; with
 * bias != NULL, the bias epilogue adds bias(N) to every row of C. */
static inline int blt_plan(cublasLtHandle_t lt, blt_gemm *g, int ta, int tb, int M, int N, int K, cudaDataType_t ab,
                           cublasComputeType_t compute, size_t ws, const void *bias) {
    CB(cublasLtMatmulDescCreate(&g->desc, compute, CUDA_R_32F));
    const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CB(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (bias) {
        const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        CB(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        CB(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    /* A' = the caller's B: (K,N) row-major, or (N,K) when tb; B' = A */
    const int ldb = tb ? K : N, lda = ta ? M : K;
    CB(cublasLtMatrixLayoutCreate(&g->la, ab, tb ? K : N, tb ? N : K, ldb));
    CB(cublasLtMatrixLayoutCreate(&g->lb, ab, ta ? M : K, ta ? K : M, lda));
    CB(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_32F, N, M, N));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, g->desc, g->la, g->lb, g->lc, g->lc, pref, 1, &r, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (!found) {
        fprintf(stderr, BLT_ME ": no cuBLASLt algorithm for %dx%dx%d\n", M, N, K);
        return 1;
    }
    g->algo = r.algo;
    return 0;
}

#endif /* KILN_BENCH_GPU_BENCH_LT_H */
