/*
 * cuda_blas.c — the GEMMs of the "cuda" accelerator, through cuBLASLt. The
 * kernel table speaks row-major (C(M,N) = alpha op(A) op(B) + beta C) and
 * cuBLASLt column-major, so every call computes the transposed product
 * C^T(N,M) = op(B)^T op(A)^T with the operands swapped: no data moves. A
 * cuBLASLt call needs a matmul descriptor, three layouts and an algorithm
 * chosen by its heuristic; building those costs far more than a small GEMM,
 * so they are cached per shape, transposes, leading dimensions, dtypes,
 * pointer alignment, whether beta is zero and the epilogue (a training
 * step repeats the same few shapes), least-recently-used out. Attention's
 * products run as strided batches (one cuBLASLt call for every head). The bias
 * epilogue serves linear_forward (cuda_fused.c); GELU_AUX_BIAS is supported
 * here but not used, its GELU not being kiln's. fp32 GEMMs run in full fp32
 * unless the run asks for TF32 (`tf32 = true`); fp16/bf16 operands
 * accumulate in fp32 on the tensor cores; fp64 in fp64.
 */
#include <string.h>

#include "cuda_internal.h"

int32_t cu_blas_fail(kiln_instance *acc, cublasStatus_t s, const char *what, const char *call) {
    /* cuBLAS reports a lost context as a failed execution; the runtime's
     * error says why (and cu_fail marks the instance lost) */
    const cudaError_t e = s == CUBLAS_STATUS_EXECUTION_FAILED ? cudaPeekAtLastError() : cudaSuccess;
    if (e != cudaSuccess) return cu_fail(acc, e, what, call);
    return CU_ERR(acc, s == CUBLAS_STATUS_ALLOC_FAILED ? KILN_E_NOMEM : KILN_E_CUDA,
                  "cuda: %s: %s failed: cuBLAS status %d (%s)", what, call, (int)s, cublasLtGetStatusString(s));
}

static cudaDataType_t cu_dtype(uint32_t dt) {
    switch (dt) {
    case KILN_DTYPE_F64: return CUDA_R_64F;
    case KILN_DTYPE_F16: return CUDA_R_16F;
    case KILN_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

/* The largest power of two (up to 256) dividing the address: cuBLASLt's
 * heuristic assumes 256-byte aligned operands unless told otherwise, and an
 * algorithm picked under that assumption refuses a less aligned pointer. */
static int cu_align(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a & (uintptr_t)(al - 1))) al >>= 1;
    return al;
}

static void cu_plan_destroy(cu_plan *p) {
    if (!p->valid) return;
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->desc);
    p->valid = 0;
}

int32_t cu_blas_init(kiln_instance *acc) {
    CU_BLAS(acc, "configure", cublasLtCreate(&acc->lt));
    void *ws = NULL;
    int32_t rc = cu_alloc_scratch(acc, acc->workspace_bytes, &ws);
    if (rc != KILN_OK) return rc;
    acc->lt_workspace = ws;
    return KILN_OK;
}

/* The caller has synchronised the stream (cu_destroy): cuBLASLt's handle
 * and workspace must outlive every GEMM still queued on it. */
void cu_blas_release(kiln_instance *acc) {
    for (int i = 0; i < CU_GEMM_PLANS; i++) cu_plan_destroy(&acc->plans[i]);
    if (acc->lt) cublasLtDestroy(acc->lt);
    acc->lt = NULL;
}

/* Key fields of a plan, in the order cu_plan declares them. */
typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc, atype, btype, ctype, compute, beta_zero, align, epilogue;
    int bias_align, aux_align;
    int batch;
    int64_t sa, sb, sc; /* column-major view: sa is the caller's B's stride */
} cu_key;

static int cu_key_eq(const cu_plan *p, const cu_key *k) {
    return p->valid && p->ta == k->ta && p->tb == k->tb && p->m == k->m && p->n == k->n && p->k == k->k &&
           p->lda == k->lda && p->ldb == k->ldb && p->ldc == k->ldc && p->atype == k->atype &&
           p->btype == k->btype && p->ctype == k->ctype && p->compute == k->compute &&
           p->beta_zero == k->beta_zero && p->align == k->align && p->epilogue == k->epilogue &&
           p->bias_align == k->bias_align && p->aux_align == k->aux_align && p->batch == k->batch &&
           p->sa == k->sa && p->sb == k->sb && p->sc == k->sc;
}

/* A strided batch on a layout: its count and its stride in elements. */
static cublasStatus_t cu_layout_batch(cublasLtMatrixLayout_t l, int batch, int64_t stride) {
    if (batch <= 1) return CUBLAS_STATUS_SUCCESS;
    const int32_t n = batch;
    cublasStatus_t s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    return s;
}

/* Points the descriptor's epilogue at this call's bias and aux buffers (the
 * plan is cached per shape, the buffers change from call to call). */
static cublasStatus_t cu_ep_pointers(cublasLtMatmulDesc_t desc, const cu_ep *ep) {
    if (!ep || ep->kind == CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_SUCCESS;
    cublasStatus_t s =
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep->bias, sizeof ep->bias);
    if (s == CUBLAS_STATUS_SUCCESS && ep->kind == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep->aux, sizeof ep->aux);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ep->aux_ld,
                                               sizeof ep->aux_ld);
    }
    return s;
}

/* Builds the descriptor, layouts and algorithm for one key (column-major
 * view: m = N rows of C^T, n = M columns, A' = B, B' = A). */
static int32_t cu_plan_build(kiln_instance *acc, cu_plan *p, const cu_key *k, const cu_ep *ep) {
    const cublasComputeType_t compute = (cublasComputeType_t)k->compute;
    const cudaDataType_t scale = compute == CUBLAS_COMPUTE_64F ? CUDA_R_64F : CUDA_R_32F;
    memset(p, 0, sizeof *p);
    CU_BLAS(acc, "gemm (plan)", cublasLtMatmulDescCreate(&p->desc, compute, scale));
    const cublasOperation_t opa = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int32_t rc = KILN_OK;
    cublasStatus_t s =
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (s == CUBLAS_STATUS_SUCCESS && k->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        const uint32_t epi = (uint32_t)k->epilogue;
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        /* the heuristic reads the buffers' alignment from the pointers */
        if (s == CUBLAS_STATUS_SUCCESS) s = cu_ep_pointers(p->desc, ep);
    }
    /* A' (the caller's B): stored m x k when not transposed, k x m when it is */
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->la, (cudaDataType_t)k->atype, (uint64_t)(k->ta ? k->k : k->m),
                                       (uint64_t)(k->ta ? k->m : k->k), k->lda);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->lb, (cudaDataType_t)k->btype, (uint64_t)(k->tb ? k->n : k->k),
                                       (uint64_t)(k->tb ? k->k : k->n), k->ldb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->lc, (cudaDataType_t)k->ctype, (uint64_t)k->m, (uint64_t)k->n, k->ldc);
    if (s == CUBLAS_STATUS_SUCCESS) s = cu_layout_batch(p->la, k->batch, k->sa);
    if (s == CUBLAS_STATUS_SUCCESS) s = cu_layout_batch(p->lb, k->batch, k->sb);
    if (s == CUBLAS_STATUS_SUCCESS) s = cu_layout_batch(p->lc, k->batch, k->sc);
    cublasLtMatmulPreference_t pref = NULL;
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&pref);
    if (s == CUBLAS_STATUS_SUCCESS) {
        const uint64_t ws = acc->workspace_bytes;
        const uint32_t al = (uint32_t)k->align;
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        /* one alignment for A, B, C and D: the smallest of the three */
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
        /* A 16-bit output is the float32 result rounded once (what the cpu
         * computes and the docs promise). A split-K algorithm whose partial
         * sums are added in the output type (INPLACE, OUTPUT_TYPE) would
         * round each partial sum, and in float16 could overflow where the
         * whole sum does not: allow only sums kept in the compute type
         * (and algorithms with no split, which no mask excludes). */
        if (s == CUBLAS_STATUS_SUCCESS && (k->ctype == CUDA_R_16F || k->ctype == CUDA_R_16BF)) {
            const uint32_t rs = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
            s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &rs, sizeof rs);
        }
    }
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(acc->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &found);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
        /* the heuristic's way of saying "no algorithm": a caller with an
         * alternative takes it */
        rc = CU_ERR(acc, KILN_E_UNSUPPORTED, "cuda: gemm (plan): cublasLt descriptor/heuristic failed: cuBLAS status %d (%s)",
                    (int)s, cublasLtGetStatusString(s));
    } else if (s != CUBLAS_STATUS_SUCCESS) {
        rc = cu_blas_fail(acc, s, "gemm (plan)", "cublasLt descriptor/heuristic");
    } else if (found < 1) {
        rc = CU_ERR(acc, KILN_E_UNSUPPORTED,
                    "cuda: gemm: cuBLASLt has no algorithm for %dx%dx%d (column-major m x n x k, types %d/%d->%d, "
                    "compute %d, alignment %d, epilogue %d) on %s",
                    k->m, k->n, k->k, k->atype, k->btype, k->ctype, k->compute, k->align, k->epilogue,
                    acc->device_name);
    }
    if (rc != KILN_OK) {
        if (p->la) cublasLtMatrixLayoutDestroy(p->la);
        if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
        if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
        cublasLtMatmulDescDestroy(p->desc);
        memset(p, 0, sizeof *p);
        return rc;
    }
    p->algo = res.algo;
    p->ta = k->ta, p->tb = k->tb, p->m = k->m, p->n = k->n, p->k = k->k;
    p->lda = k->lda, p->ldb = k->ldb, p->ldc = k->ldc;
    p->atype = k->atype, p->btype = k->btype, p->ctype = k->ctype, p->compute = k->compute;
    p->beta_zero = k->beta_zero;
    p->align = k->align;
    p->epilogue = k->epilogue;
    p->bias_align = k->bias_align;
    p->aux_align = k->aux_align;
    p->batch = k->batch;
    p->sa = k->sa, p->sb = k->sb, p->sc = k->sc;
    p->valid = 1;
    return KILN_OK;
}

/* The plan for a key: a cached one, else a new one in the least recently
 * used slot. */
static int32_t cu_plan_get(kiln_instance *acc, const cu_key *k, const cu_ep *ep, cu_plan **out) {
    cu_plan *lru = &acc->plans[0];
    for (int i = 0; i < CU_GEMM_PLANS; i++) {
        cu_plan *p = &acc->plans[i];
        if (cu_key_eq(p, k)) {
            p->last_use = ++acc->plan_clock;
            *out = p;
            return KILN_OK;
        }
        if (lru->valid && (!p->valid || p->last_use < lru->last_use)) lru = p;
    }
    cu_plan_destroy(lru);
    int32_t rc = cu_plan_build(acc, lru, k, ep);
    if (rc != KILN_OK) return rc;
    lru->last_use = ++acc->plan_clock;
    *out = lru;
    return KILN_OK;
}

/* C = beta * C for K == 0 (cuBLASLt does not take k = 0). */
static int32_t cu_scale_c(kiln_instance *acc, int M, int N, double beta, void *C, uint32_t ct, int ldc) {
    const size_t esz = kiln_dtype_size(ct);
    if (beta == 0.0) {
        CU_CHECK(acc, "gemm (k = 0)",
                 cudaMemset2DAsync(C, (size_t)ldc * esz, 0, (size_t)N * esz, (size_t)M, acc->stream));
        return KILN_OK;
    }
    for (int r = 0; r < M; r++)
        CU_CHECK(acc, "gemm (k = 0)",
                 kg_scale(acc->stream, (int)ct, (char *)C + (size_t)r * (size_t)ldc * esz, beta, (size_t)N));
    return KILN_OK;
}

uint32_t cu_product_dtype(uint32_t at, uint32_t bt, uint32_t rt) {
    const uint32_t p = (uint32_t)km_gemm_round_dtype((int)at, (int)bt, (int)rt);
    if (cu_is16(p)) return (at == KILN_DTYPE_F32 || at == p) && (bt == KILN_DTYPE_F32 || bt == p) ? p : KILN_DTYPE_F32;
    return at == bt ? at : KILN_DTYPE_F32;
}

/* One operand as op: converted when its dtype differs, or (fp32 in an
 * fp32 product whose operands autocast would round through ort: a 16-bit
 * operand of the other format sits beside it) copied and rounded through
 * ort; into dst. Counts the bytes. */
static int32_t cu_operand(kiln_instance *acc, const char *what, uint32_t op, uint32_t ort, const void *X,
                          uint32_t xt, size_t n, void *dst) {
    if (xt != op) {
        CU_LAUNCH(acc, what, kg_cast(acc->stream, dst, (int)op, X, (int)xt, n));
        acc->gemm_convert_bytes += (double)n * (double)(kiln_dtype_size(xt) + kiln_dtype_size(op));
        return KILN_OK;
    }
    CU_CHECK(acc, what, cudaMemcpyAsync(dst, X, n * sizeof(float), cudaMemcpyDeviceToDevice, acc->stream));
    CU_LAUNCH(acc, what, kg_round_to(acc->stream, dst, (int)ort, n));
    acc->gemm_convert_bytes += (double)n * 4.0 * sizeof(float);
    return KILN_OK;
}

int32_t cu_gemm_operands(kiln_instance *acc, const char *fn, uint32_t op, uint32_t ort, const void *A, uint32_t at,
                         size_t na, const void *B, uint32_t bt, size_t nb, size_t extra, const void **a,
                         const void **b, void **extra_out) {
    const int round32 = op == KILN_DTYPE_F32 && cu_is16(ort);
    const int conv_a = at != op || (round32 && at == KILN_DTYPE_F32);
    const int conv_b = bt != op || (round32 && bt == KILN_DTYPE_F32);
    const size_t osz = kiln_dtype_size(op);
    const size_t bytes_a = conv_a ? cu_up256(na * osz) : 0, bytes_b = conv_b ? cu_up256(nb * osz) : 0;
    *a = A, *b = B;
    if (extra_out) *extra_out = NULL;
    if (bytes_a + bytes_b + extra == 0) return KILN_OK;
    int32_t rc = cu_reserve(acc, &acc->ws, &acc->ws_bytes, bytes_a + bytes_b + extra, fn);
    if (rc != KILN_OK) return rc;
    char *ws = acc->ws, what[96];
    if (bytes_a) {
        snprintf(what, sizeof what, "%s (operand A)", fn);
        if ((rc = cu_operand(acc, what, op, ort, A, at, na, ws)) != KILN_OK) return rc;
        *a = ws;
    }
    if (bytes_b) {
        snprintf(what, sizeof what, "%s (operand B)", fn);
        if ((rc = cu_operand(acc, what, op, ort, B, bt, nb, ws + bytes_a)) != KILN_OK) return rc;
        *b = ws + bytes_a;
    }
    if (extra_out && extra) *extra_out = ws + bytes_a + bytes_b;
    return KILN_OK;
}

/* One GEMM, or a strided batch of them (batch > 1: no epilogue, K > 0). */
static int32_t cu_matmul_any(kiln_instance *acc, const char *fn, int ta, int tb, int M, int N, int K, double alpha,
                             const void *A, uint32_t at, int lda, int64_t sa, const void *B, uint32_t bt, int ldb,
                             int64_t sb, double beta, void *C, uint32_t ct, int ldc, int64_t sc, int batch,
                             const cu_ep *ep) {
    const int epilogue = ep ? ep->kind : CUBLASLT_EPILOGUE_DEFAULT;
    if (M == 0 || N == 0) return KILN_OK;
    if (K == 0 && epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: an epilogue needs K > 0 (the caller handles K == 0)", fn);
    if (K == 0) return cu_scale_c(acc, M, N, beta, C, ct, ldc);
    cu_key k;
    memset(&k, 0, sizeof k);
    /* column-major view of the row-major call: swap the operands */
    k.ta = tb, k.tb = ta;
    k.m = N, k.n = M, k.k = K;
    k.lda = ldb, k.ldb = lda, k.ldc = ldc;
    k.atype = (int)cu_dtype(bt), k.btype = (int)cu_dtype(at), k.ctype = (int)cu_dtype(ct);
    k.compute = ct == KILN_DTYPE_F64 ? (int)CUBLAS_COMPUTE_64F
                : (at == KILN_DTYPE_F32 && acc->tf32) ? (int)CUBLAS_COMPUTE_32F_FAST_TF32
                                                      : (int)CUBLAS_COMPUTE_32F;
    k.beta_zero = beta == 0.0;
    k.epilogue = epilogue;
    k.batch = batch > 1 ? batch : 1;
    if (k.batch > 1) k.sa = sb, k.sb = sa, k.sc = sc;
    /* A, B and C reach the heuristic as the preference's minimum alignment
     * (their smallest); the epilogue's bias and aux reach it as the pointers
     * themselves (cu_plan_build sets them on the descriptor), so the key
     * holds each of those alignments on its own. One shared minimum would
     * let a plan chosen for a 256-byte aligned bias serve a call whose bias
     * is less aligned (when A, B or C set that minimum before). */
    int al = cu_align(A);
    if (cu_align(B) < al) al = cu_align(B);
    if (cu_align(C) < al) al = cu_align(C);
    if (k.batch > 1) {
        /* every product's operands start where the strides put them */
        const void *firsts[3] = {(const char *)A + (size_t)sa * kiln_dtype_size(at),
                                 (const char *)B + (size_t)sb * kiln_dtype_size(bt),
                                 (const char *)C + (size_t)sc * kiln_dtype_size(ct)};
        for (int i = 0; i < 3; i++)
            if (cu_align(firsts[i]) < al) al = cu_align(firsts[i]);
    }
    k.align = al;
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) k.bias_align = cu_align(ep->bias);
    if (epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) k.aux_align = cu_align(ep->aux);
    cu_plan *p = NULL;
    int32_t rc = cu_plan_get(acc, &k, ep, &p);
    if (rc != KILN_OK) return rc;
    cublasStatus_t s = cu_ep_pointers(p->desc, ep);
    if (s != CUBLAS_STATUS_SUCCESS) return cu_blas_fail(acc, s, fn, "cublasLtMatmulDescSetAttribute (epilogue)");
    const float alpha_f = (float)alpha, beta_f = (float)beta;
    const void *pa = ct == KILN_DTYPE_F64 ? (const void *)&alpha : (const void *)&alpha_f;
    const void *pb = ct == KILN_DTYPE_F64 ? (const void *)&beta : (const void *)&beta_f;
    s = cublasLtMatmul(acc->lt, p->desc, pa, B, p->la, A, p->lb, pb, C, p->lc, C, p->lc, &p->algo, acc->lt_workspace,
                       acc->workspace_bytes, acc->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "%s (%dx%dx%d)", fn, M, N, K);
        return cu_blas_fail(acc, s, what, "cublasLtMatmul");
    }
    const int unit = k.compute == (int)CUBLAS_COMPUTE_64F                ? CU_FLOPS_64
                     : k.compute == (int)CUBLAS_COMPUTE_32F_FAST_TF32    ? CU_FLOPS_TF32
                     : k.atype == (int)CUDA_R_32F                        ? CU_FLOPS_32
                                                                         : CU_FLOPS_16;
    acc->gemm_flops[unit] += 2.0 * (double)M * (double)N * (double)K * (double)k.batch;
    return KILN_OK;
}

int32_t cu_matmul_ep(kiln_instance *acc, const char *fn, int ta, int tb, int M, int N, int K, double alpha,
                     const void *A, uint32_t at, int lda, const void *B, uint32_t bt, int ldb, double beta, void *C,
                     uint32_t ct, int ldc, const cu_ep *ep) {
    return cu_matmul_any(acc, fn, ta, tb, M, N, K, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1, ep);
}

int32_t cu_matmul(kiln_instance *acc, const char *fn, int ta, int tb, int M, int N, int K, double alpha,
                  const void *A, uint32_t at, int lda, const void *B, uint32_t bt, int ldb, double beta, void *C,
                  uint32_t ct, int ldc) {
    return cu_matmul_ep(acc, fn, ta, tb, M, N, K, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, NULL);
}

int32_t cu_matmul_strided(kiln_instance *acc, const char *fn, int ta, int tb, int M, int N, int K, double alpha,
                          const void *A, uint32_t at, int lda, int64_t sa, const void *B, uint32_t bt, int ldb,
                          int64_t sb, double beta, void *C, uint32_t ct, int ldc, int64_t sc, int batch) {
    if (batch <= 0 || M == 0 || N == 0) return KILN_OK;
    if (K == 0) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: a batched GEMM needs K > 0", fn);
    return cu_matmul_any(acc, fn, ta, tb, M, N, K, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch,
                         NULL);
}
