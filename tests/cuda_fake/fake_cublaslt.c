/*
 * fake_cublaslt.c — the cuBLASLt functions the cuda accelerator plugin
 * calls, with cublasLt.h's signatures: descriptors, layouts and preferences
 * are heap objects recording their attributes; the heuristic returns one
 * "algorithm" that remembers the configuration it was chosen for, the
 * alignment the preference allowed and the workspace it needs; and
 * cublasLtMatmul computes D = alpha * op(A) * op(B) + beta * C in
 * COLUMN-MAJOR exactly as cuBLASLt defines it (op(A) is m x k, op(B) k x n,
 * C and D m x n; a layout gives the STORED rows, cols and ld of its matrix,
 * and for a strided batch its count and stride, each batch one GEMM),
 * accumulating in double from exactly decoded inputs (fp16/bf16 widen
 * exactly; TF32 compute rounds fp32 inputs to 10 mantissa bits first, as
 * the tensor cores do; a float16 / bfloat16 C of the operands' type gets
 * the fp32 result rounded once). beta == 0 does not read C, so NaN there cannot
 * leak. The BIAS and GELU_AUX_BIAS epilogues (fp32 output; BIAS on a
 * 16-bit output too, its bias then in that type and the sum rounded once)
 * add the bias after the product is rounded to fp32 and, for GELU, store that in aux
 * and apply a GELU that is not the cpu kernels' (as cuBLASLt's is not).
 * The algorithm also remembers the bias and aux alignment the heuristic saw
 * on the descriptor; a heuristic call for a 16-bit D whose preference
 * allows split-K sums in the output type is a violation (kiln's rounding
 * rule, which the real heuristic would not enforce); and cublasLtDestroy checks that the last GEMM was
 * waited for. Before computing, every argument is checked the way cuBLASLt checks
 * it or would fault on it: the layouts must agree on m, n and k
 * (CUBLAS_STATUS_INVALID_VALUE otherwise, which is what exposes a wrong
 * row-major to column-major mapping), ld >= rows, supported type and
 * compute combinations only, the algorithm must come from a heuristic call
 * for the same configuration, pointers at least as aligned as the
 * preference promised, enough workspace, and operands inside device
 * memory. The arithmetic is built with -O2 even in Debug builds: the
 * comparison test multiplies matrices of up to 512 x 1024 x 784.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#include "cpu_kernels.h"
#include "fake_internal.h"
#include "half_bits.h"

/* ------------------------------------------------------------- objects */

#define FAKE_LT_MAGIC 0x17C0DEu
#define FAKE_ALGO_MAGIC 0xA160u

struct cublasLtContext {
    unsigned magic;
    int device;
    /* the stream of the last GEMM and that stream's sync count then: the
     * handle must not be destroyed before the GEMM was waited for */
    cudaStream_t last_stream;
    unsigned long last_syncs;
    int pending;
};

/* A descriptor, layout or preference: the opaque struct the API hands out
 * comes first, so the handle converts back to the fake's record. */
typedef struct fake_desc {
    cublasLtMatmulDescOpaque_t opaque;
    int32_t compute, scale, transa, transb;
    uint32_t epilogue;  /* CUBLASLT_EPILOGUE_DEFAULT, BIAS or GELU_AUX_BIAS */
    const void *bias;   /* (m) D's type */
    void *aux;          /* (m x n, aux_ld) D's type: GELU's input */
    int64_t aux_ld;
    struct fake_desc *next;
} fake_desc;

typedef struct fake_layout {
    cublasLtMatrixLayoutOpaque_t opaque;
    int32_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;  /* CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT (1 unless set)        */
    int64_t stride; /* CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, elements */
    struct fake_layout *next;
} fake_layout;

typedef struct fake_pref {
    cublasLtMatmulPreferenceOpaque_t opaque;
    uint64_t max_ws;
    uint32_t align[4]; /* A, B, C, D: minimum alignment in bytes */
    uint32_t reduction_mask; /* the split-K reduction schemes allowed */
    struct fake_pref *next;
} fake_pref;

static fake_desc *fake_descs;
static fake_layout *fake_layouts;
static fake_pref *fake_prefs;

static fake_desc *fake_desc_of(cublasLtMatmulDesc_t d) {
    for (fake_desc *p = fake_descs; p; p = p->next)
        if (&p->opaque == d) return p;
    return NULL;
}
static fake_layout *fake_layout_of(cublasLtMatrixLayout_t l) {
    for (fake_layout *p = fake_layouts; p; p = p->next)
        if (&p->opaque == l) return p;
    return NULL;
}
static fake_pref *fake_pref_of(cublasLtMatmulPreference_t pr) {
    for (fake_pref *p = fake_prefs; p; p = p->next)
        if (&p->opaque == pr) return p;
    return NULL;
}

/* Unlinks `node` from a singly linked list headed by *head (any of the
 * three kinds: each has `next` at a different offset, hence a macro). */
#define FAKE_UNLINK(head, node)                                   \
    do {                                                          \
        for (__typeof__(head) *pp_ = &(head); *pp_; pp_ = &(*pp_)->next) \
            if (*pp_ == (node)) {                                 \
                *pp_ = (node)->next;                              \
                break;                                            \
            }                                                     \
    } while (0)

const char *CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "unknown cuBLAS status";
    }
}

const char *CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
    *lightHandle = NULL;
    if (fake_inject("cublasLtCreate")) return CUBLAS_STATUS_NOT_INITIALIZED;
    struct cublasLtContext *h = calloc(1, sizeof *h);
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = FAKE_LT_MAGIC;
    int dev = 0;
    (void)cudaGetDevice(&dev);
    h->device = dev;
    fake_stats.lt_handles_live++;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle || lightHandle->magic != FAKE_LT_MAGIC) {
        fake_violation("cublasLtDestroy(%p): not a live handle", (void *)lightHandle);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    /* kiln's contract (stricter than the library, which waits for the
     * device): a GEMM queued on a stream is waited for before its handle,
     * and the workspace it uses, go */
    if (lightHandle->pending && fake_stream_syncs(lightHandle->last_stream) == lightHandle->last_syncs)
        fake_violation("cublasLtDestroy(%p): a GEMM queued on stream %p has not been waited for "
                       "(synchronise the stream first)",
                       (void *)lightHandle, (void *)lightHandle->last_stream);
    lightHandle->magic = 0;
    free(lightHandle);
    fake_stats.lt_handles_live--;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                                     cublasComputeType_t computeType, cudaDataType_t scaleType) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    *matmulDesc = NULL;
    if (fake_inject("cublasLtMatmulDescCreate")) return CUBLAS_STATUS_ALLOC_FAILED;
    fake_desc *d = calloc(1, sizeof *d);
    if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
    d->compute = (int32_t)computeType;
    d->scale = (int32_t)scaleType;
    d->transa = d->transb = CUBLAS_OP_N;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->next = fake_descs;
    fake_descs = d;
    fake_stats.lt_objects_live++;
    *matmulDesc = &d->opaque;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    fake_desc *d = fake_desc_of(matmulDesc);
    if (!d) {
        fake_violation("cublasLtMatmulDescDestroy(%p): not a live descriptor", (void *)matmulDesc);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    FAKE_UNLINK(fake_descs, d);
    free(d);
    fake_stats.lt_objects_live--;
    return CUBLAS_STATUS_SUCCESS;
}

/* Copies an int32 attribute, with cuBLASLt's size check. */
static cublasStatus_t fake_i32(int32_t *dst, const void *buf, size_t size) {
    if (!buf || size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(dst, buf, sizeof *dst);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                           size_t sizeInBytes) {
    fake_desc *d = fake_desc_of(matmulDesc);
    if (!d) {
        fake_violation("cublasLtMatmulDescSetAttribute(%p): not a live descriptor", (void *)matmulDesc);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (fake_inject("cublasLtMatmulDescSetAttribute")) return CUBLAS_STATUS_INVALID_VALUE;
    int32_t v = 0;
    cublasStatus_t s;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return fake_i32(&d->compute, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return fake_i32(&d->scale, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if ((s = fake_i32(&v, buf, sizeInBytes)) != CUBLAS_STATUS_SUCCESS) return s;
        if (v != CUBLAS_OP_N && v != CUBLAS_OP_T && v != CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
        if (v == CUBLAS_OP_C) v = CUBLAS_OP_T; /* real types: conjugate is transpose */
        if (attr == CUBLASLT_MATMUL_DESC_TRANSA) d->transa = v;
        else d->transb = v;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        /* uint32_t in cublasLt.h; the fake models the two linear_forward uses */
        if (!buf || sizeInBytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->epilogue, buf, sizeof d->epilogue);
        if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS &&
            d->epilogue != CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
            fake_violation("cublasLtMatmulDescSetAttribute: epilogue %u is not modelled by the fake",
                           (unsigned)d->epilogue);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (!buf || sizeInBytes != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->bias, buf, sizeof d->bias);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        if (!buf || sizeInBytes != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->aux, buf, sizeof d->aux);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        if (!buf || sizeInBytes != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->aux_ld, buf, sizeof d->aux_ld);
        return CUBLAS_STATUS_SUCCESS;
    default:
        fake_violation("cublasLtMatmulDescSetAttribute: attribute %d is not modelled by the fake", (int)attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    *matLayout = NULL;
    if (fake_inject("cublasLtMatrixLayoutCreate")) return CUBLAS_STATUS_ALLOC_FAILED;
    fake_layout *l = calloc(1, sizeof *l);
    if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
    l->type = (int32_t)type;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    l->batch = 1;
    l->next = fake_layouts;
    fake_layouts = l;
    fake_stats.lt_objects_live++;
    *matLayout = &l->opaque;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    fake_layout *l = fake_layout_of(matLayout);
    if (!l) {
        fake_violation("cublasLtMatrixLayoutDestroy(%p): not a live layout", (void *)matLayout);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    FAKE_UNLINK(fake_layouts, l);
    free(l);
    fake_stats.lt_objects_live--;
    return CUBLAS_STATUS_SUCCESS;
}

/* The two attributes a strided batched GEMM sets; any other is reported,
 * since the fake would ignore what it means. */
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                             size_t sizeInBytes) {
    fake_layout *l = fake_layout_of(matLayout);
    if (!l || !buf) {
        fake_violation("cublasLtMatrixLayoutSetAttribute(%p): not a live layout, or no value", (void *)matLayout);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && sizeInBytes == sizeof(int32_t)) {
        memcpy(&l->batch, buf, sizeof l->batch);
        if (l->batch < 1) {
            fake_violation("cublasLtMatrixLayoutSetAttribute: batch count %d", (int)l->batch);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && sizeInBytes == sizeof(int64_t)) {
        memcpy(&l->stride, buf, sizeof l->stride);
        return CUBLAS_STATUS_SUCCESS;
    }
    fake_violation("cublasLtMatrixLayoutSetAttribute: attribute %d (%zu bytes) is not modelled", (int)attr, sizeInBytes);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = NULL;
    if (fake_inject("cublasLtMatmulPreferenceCreate")) return CUBLAS_STATUS_ALLOC_FAILED;
    fake_pref *p = calloc(1, sizeof *p);
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    p->max_ws = 0; /* cuBLASLt's default: no workspace */
    for (int i = 0; i < 4; i++) p->align[i] = 256;
    p->reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK; /* cuBLASLt's default: every scheme */
    p->next = fake_prefs;
    fake_prefs = p;
    fake_stats.lt_objects_live++;
    *pref = &p->opaque;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    fake_pref *p = fake_pref_of(pref);
    if (!p) {
        fake_violation("cublasLtMatmulPreferenceDestroy(%p): not a live preference", (void *)pref);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    FAKE_UNLINK(fake_prefs, p);
    free(p);
    fake_stats.lt_objects_live--;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void *buf, size_t sizeInBytes) {
    fake_pref *p = fake_pref_of(pref);
    if (!p) {
        fake_violation("cublasLtMatmulPreferenceSetAttribute(%p): not a live preference", (void *)pref);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        if (sizeInBytes != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->max_ws, buf, sizeof p->max_ws);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        if (sizeInBytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeof(uint32_t));
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
        if (sizeInBytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->reduction_mask, buf, sizeof(uint32_t));
        return CUBLAS_STATUS_SUCCESS;
    default:
        fake_violation("cublasLtMatmulPreferenceSetAttribute: attribute %d is not modelled by the fake", (int)attr);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

/* ------------------------------------------------------ configuration */

/* One matmul's configuration, resolved from the descriptor and layouts. */
typedef struct fake_cfg {
    const fake_desc *d;
    const fake_layout *a, *b, *c, *dd;
    uint64_t m, n, k, batch;
    size_t ab_size, cd_size; /* element bytes */
} fake_cfg;

static size_t fake_type_size(int32_t t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 0;
    }
}

static int fake_is_compute_32f(int32_t c) { return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_PEDANTIC; }
static int fake_is_compute_64f(int32_t c) { return c == CUBLAS_COMPUTE_64F || c == CUBLAS_COMPUTE_64F_PEDANTIC; }

/* Checks what cuBLASLt checks for a matmul (see the file comment); fills
 * cfg. `fn` names the caller in violation messages. */
static cublasStatus_t fake_resolve(const char *fn, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                   fake_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->d = fake_desc_of(desc);
    cfg->a = fake_layout_of(la);
    cfg->b = fake_layout_of(lb);
    cfg->c = fake_layout_of(lc);
    cfg->dd = fake_layout_of(ld);
    if (!cfg->d || !cfg->a || !cfg->b || !cfg->c || !cfg->dd) {
        fake_violation("%s: a descriptor or layout is not live (desc %p, A %p, B %p, C %p, D %p)", fn, (void *)desc,
                       (void *)la, (void *)lb, (void *)lc, (void *)ld);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const fake_desc *d = cfg->d;
    const fake_layout *a = cfg->a, *b = cfg->b, *c = cfg->c, *dd = cfg->dd;

    /* types: the combinations of cuBLASLt's table that the plugin may use */
    int ok;
    if (fake_is_compute_64f(d->compute))
        ok = d->scale == CUDA_R_64F && a->type == CUDA_R_64F && b->type == CUDA_R_64F && c->type == CUDA_R_64F;
    else if (d->compute == CUBLAS_COMPUTE_32F_FAST_TF32)
        ok = d->scale == CUDA_R_32F && a->type == CUDA_R_32F && b->type == CUDA_R_32F && c->type == CUDA_R_32F;
    else if (fake_is_compute_32f(d->compute))
        ok = d->scale == CUDA_R_32F && a->type == b->type &&
             (a->type == CUDA_R_32F || a->type == CUDA_R_16F || a->type == CUDA_R_16BF) &&
             (c->type == CUDA_R_32F || (c->type == a->type && a->type != CUDA_R_32F)); /* 16-bit out: same type */
    else
        ok = 0;
    if (!ok || dd->type != c->type) {
        fake_violation("%s: unsupported types: compute %d, scale %d, A %d, B %d, C %d, D %d", fn, (int)d->compute,
                       (int)d->scale, (int)a->type, (int)b->type, (int)c->type, (int)dd->type);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    cfg->ab_size = fake_type_size(a->type);
    cfg->cd_size = fake_type_size(c->type);
    /* BIAS on fp32 or (its bias then in the output's type, as cublasLt.h
     * says for every non-IMMA, non-fp8 kernel) 16-bit output; GELU_AUX_BIAS
     * on fp32 only; fp32 compute */
    const int c16 = c->type == CUDA_R_16F || c->type == CUDA_R_16BF;
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT &&
        (!(c->type == CUDA_R_32F || (c16 && d->epilogue == CUBLASLT_EPILOGUE_BIAS)) ||
         !(fake_is_compute_32f(d->compute) || d->compute == CUBLAS_COMPUTE_32F_FAST_TF32))) {
        fake_violation("%s: the fake models the bias epilogue for fp32 and 16-bit output, GELU_AUX_BIAS for fp32 "
                       "output, and both for fp32 compute only (epilogue %u, C %d, compute %d)",
                       fn, (unsigned)d->epilogue, (int)c->type, (int)d->compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }

    /* shapes: op(A) m x k, op(B) k x n, C and D m x n */
    const uint64_t m = d->transa == CUBLAS_OP_N ? a->rows : a->cols;
    const uint64_t k = d->transa == CUBLAS_OP_N ? a->cols : a->rows;
    const uint64_t kb = d->transb == CUBLAS_OP_N ? b->rows : b->cols;
    const uint64_t n = d->transb == CUBLAS_OP_N ? b->cols : b->rows;
    if (k != kb || c->rows != m || c->cols != n || dd->rows != m || dd->cols != n || dd->ld != c->ld) {
        fake_violation("%s: inconsistent shapes: op%s(A) from %llux%llu is %llux%llu, op%s(B) from %llux%llu is "
                       "%llux%llu, C %llux%llu, D %llux%llu (ldc %lld, ldd %lld)",
                       fn, d->transa == CUBLAS_OP_N ? "N" : "T", (unsigned long long)a->rows,
                       (unsigned long long)a->cols, (unsigned long long)m, (unsigned long long)k,
                       d->transb == CUBLAS_OP_N ? "N" : "T", (unsigned long long)b->rows,
                       (unsigned long long)b->cols, (unsigned long long)kb, (unsigned long long)n,
                       (unsigned long long)c->rows, (unsigned long long)c->cols, (unsigned long long)dd->rows,
                       (unsigned long long)dd->cols, (long long)c->ld, (long long)dd->ld);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (m == 0 || n == 0 || k == 0) {
        fake_violation("%s: empty problem m=%llu n=%llu k=%llu", fn, (unsigned long long)m, (unsigned long long)n,
                       (unsigned long long)k);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const fake_layout *all[4] = {a, b, c, dd};
    for (int i = 0; i < 4; i++)
        if (all[i]->ld < 1 || (uint64_t)all[i]->ld < all[i]->rows) {
            fake_violation("%s: layout %c: ld %lld is smaller than its %llu rows (column-major)", fn, "ABCD"[i],
                           (long long)all[i]->ld, (unsigned long long)all[i]->rows);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    /* a batch: every layout the same count; a stride of 0 repeats one
     * matrix (allowed for A and B, not for the output) */
    for (int i = 0; i < 4; i++)
        if (all[i]->batch != a->batch || all[i]->stride < 0 || (i >= 2 && a->batch > 1 && all[i]->stride == 0)) {
            fake_violation("%s: layout %c: batch %d stride %lld against A's batch %d", fn, "ABCD"[i],
                           (int)all[i]->batch, (long long)all[i]->stride, (int)a->batch);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    if (a->batch > 1 && d->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        fake_violation("%s: the fake models epilogues for single GEMMs only (batch %d)", fn, (int)a->batch);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (a->batch > 1 && (uint64_t)dd->stride < (dd->cols - 1) * (uint64_t)dd->ld + dd->rows) {
        fake_violation("%s: D's batch stride %lld is shorter than one matrix (%llu x %llu, ld %lld): batches overlap",
                       fn, (long long)dd->stride, (unsigned long long)dd->rows, (unsigned long long)dd->cols,
                       (long long)dd->ld);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    cfg->m = m;
    cfg->n = n;
    cfg->k = k;
    cfg->batch = (uint64_t)a->batch;
    return CUBLAS_STATUS_SUCCESS;
}

/* A fingerprint of the configuration, stored in the algorithm. */
static uint64_t fake_cfg_hash(const fake_cfg *c) {
    const int64_t v[] = {c->d->compute, c->d->scale, c->d->transa, c->d->transb, c->d->epilogue, c->a->type,
                         (int64_t)c->a->rows,
                         (int64_t)c->a->cols, c->a->ld, c->b->type, (int64_t)c->b->rows, (int64_t)c->b->cols,
                         c->b->ld, c->c->type, (int64_t)c->c->rows, (int64_t)c->c->cols, c->c->ld,
                         c->a->batch, c->a->stride, c->b->stride, c->c->stride};
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
    return h;
}

/* The algorithm's record in cublasLtMatmulAlgo_t.data (8 uint64). */
enum { FAKE_ALGO_TAG = 0, FAKE_ALGO_HASH = 1, FAKE_ALGO_ALIGN = 2, FAKE_ALGO_WS = 3, FAKE_ALGO_BIAS_ALIGN = 4,
       FAKE_ALGO_AUX_ALIGN = 5 };

static uint64_t fake_align_of(const void *p);

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int *returnAlgoCount) {
    if (!lightHandle || lightHandle->magic != FAKE_LT_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount) return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    fake_stats.heuristics++;
    if (fake_inject("cublasLtMatmulAlgoGetHeuristic")) return CUBLAS_STATUS_NOT_SUPPORTED;
    const fake_pref *p = fake_pref_of(preference);
    if (!p) {
        fake_violation("cublasLtMatmulAlgoGetHeuristic: preference %p is not live", (void *)preference);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    fake_cfg cfg;
    cublasStatus_t s = fake_resolve("cublasLtMatmulAlgoGetHeuristic", operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &cfg);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    uint32_t align = p->align[0];
    for (int i = 1; i < 4; i++)
        if (p->align[i] < align) align = p->align[i];
    if (align == 0 || (align & (align - 1))) return CUBLAS_STATUS_INVALID_VALUE;
    /* kiln's rule, not cuBLASLt's: a 16-bit D is the float32 result rounded
     * once, which a split-K algorithm adding its partial sums in the output
     * type (INPLACE, OUTPUT_TYPE) would break; the real heuristic may pick
     * one for a long K unless the preference excludes them */
    if (cfg.cd_size == 2 &&
        (p->reduction_mask & (CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)))
        fake_violation("cublasLtMatmulAlgoGetHeuristic: a 16-bit D with reduction schemes 0x%x allowed: split-K "
                       "partial sums could be added in the 16-bit type (allow only "
                       "CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)",
                       (unsigned)p->reduction_mask);
    /* an element-misaligned operand has no algorithm at all */
    if (align < cfg.ab_size || align < cfg.cd_size) return CUBLAS_STATUS_NOT_SUPPORTED;
    const uint64_t ws = p->max_ws < ((uint64_t)1 << 20) ? p->max_ws : ((uint64_t)1 << 20);
    cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[0];
    memset(r, 0, sizeof *r);
    r->algo.data[FAKE_ALGO_TAG] = FAKE_ALGO_MAGIC;
    r->algo.data[FAKE_ALGO_HASH] = fake_cfg_hash(&cfg);
    r->algo.data[FAKE_ALGO_ALIGN] = align;
    r->algo.data[FAKE_ALGO_WS] = ws;
    /* the epilogue's buffers have no preference attribute: the heuristic
     * reads their alignment from the descriptor's pointers, and the
     * algorithm may rely on it */
    if (cfg.d->epilogue != CUBLASLT_EPILOGUE_DEFAULT) r->algo.data[FAKE_ALGO_BIAS_ALIGN] = fake_align_of(cfg.d->bias);
    if (cfg.d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) r->algo.data[FAKE_ALGO_AUX_ALIGN] = fake_align_of(cfg.d->aux);
    r->workspaceSize = (size_t)ws;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* --------------------------------------------------------------- matmul */

/* fp32 to TF32 (10 explicit mantissa bits), round to nearest even, as the
 * tensor cores read fp32 operands under CUBLAS_COMPUTE_32F_FAST_TF32. */
static float fake_tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7F800000u) != 0x7F800000u) {
        u += 0xFFFu + ((u >> 13) & 1u);
        u &= ~0x1FFFu;
    }
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Element (r, c) of a stored column-major matrix of `type`. */
static double fake_load(const void *p, int32_t type, uint64_t r, uint64_t c, int64_t ld, int tf32) {
    const size_t i = (size_t)(r + c * (uint64_t)ld);
    switch (type) {
    case CUDA_R_32F: {
        const float v = ((const float *)p)[i];
        return tf32 ? fake_tf32(v) : v;
    }
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_16F: return hb_f16_value(((const uint16_t *)p)[i]);
    default: return hb_bf16_value(((const uint16_t *)p)[i]);
    }
}

/* Largest power of two (up to 256) dividing the address. */
static uint64_t fake_align_of(const void *p) {
    uint64_t al = 256;
    while (al > 1 && ((uintptr_t)p & (al - 1))) al >>= 1;
    return al;
}

/* Bytes a stored layout spans, every batch included. */
static size_t fake_span(const fake_layout *l, size_t esz) {
    return ((size_t)(l->batch - 1) * (size_t)l->stride + (size_t)(l->cols - 1) * (size_t)l->ld + (size_t)l->rows) *
           esz;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                                           const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                                           const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                                           void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
    FAKE_SCOPE();
    fake_work_on(stream); /* the blocks checked below are this GEMM's work */
    static const char fn[] = "cublasLtMatmul";
    if (!lightHandle || lightHandle->magic != FAKE_LT_MAGIC) {
        fake_violation("%s: handle %p is not a live cuBLASLt handle", fn, (void *)lightHandle);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    /* a lost context (an injected kernel fault): cuBLAS's failed execution,
     * the runtime's sticky error behind it */
    if (fake_lost() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (fake_inject(fn)) return CUBLAS_STATUS_EXECUTION_FAILED;
    fake_cfg cfg;
    cublasStatus_t s = fake_resolve(fn, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &cfg);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!alpha || !beta || fake_is_device_ptr(alpha) || fake_is_device_ptr(beta)) {
        fake_violation("%s: alpha/beta must be host pointers (pointer mode host)", fn);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (algo) {
        if (algo->data[FAKE_ALGO_TAG] != FAKE_ALGO_MAGIC || algo->data[FAKE_ALGO_HASH] != fake_cfg_hash(&cfg)) {
            fake_violation("%s: the algorithm was not chosen by a heuristic for this configuration", fn);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        const void *ptrs[4] = {A, B, C, D};
        for (int i = 0; i < 4; i++)
            if (fake_align_of(ptrs[i]) < algo->data[FAKE_ALGO_ALIGN]) {
                fake_violation("%s: %c = %p is %llu-byte aligned but the algorithm was chosen for %llu-byte "
                               "alignment",
                               fn, "ABCD"[i], ptrs[i], (unsigned long long)fake_align_of(ptrs[i]),
                               (unsigned long long)algo->data[FAKE_ALGO_ALIGN]);
                return CUBLAS_STATUS_INVALID_VALUE;
            }
        const void *eps[2] = {cfg.d->bias, cfg.d->aux};
        for (int i = 0; i < 2; i++)
            if (algo->data[FAKE_ALGO_BIAS_ALIGN + i] && fake_align_of(eps[i]) < algo->data[FAKE_ALGO_BIAS_ALIGN + i]) {
                fake_violation("%s: the epilogue's %s = %p is %llu-byte aligned but the algorithm was chosen for a "
                               "%llu-byte aligned one",
                               fn, i ? "aux" : "bias", eps[i], (unsigned long long)fake_align_of(eps[i]),
                               (unsigned long long)algo->data[FAKE_ALGO_BIAS_ALIGN + i]);
                return CUBLAS_STATUS_INVALID_VALUE;
            }
        if (workspaceSizeInBytes < algo->data[FAKE_ALGO_WS]) {
            fake_violation("%s: workspace of %zu bytes, the algorithm needs %llu", fn, workspaceSizeInBytes,
                           (unsigned long long)algo->data[FAKE_ALGO_WS]);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (fake_need_device(fn, "workspace", workspace, (size_t)algo->data[FAKE_ALGO_WS]) != cudaSuccess)
            return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    const int32_t scale = cfg.d->scale;
    double a_, b_;
    if (scale == CUDA_R_64F) {
        memcpy(&a_, alpha, sizeof a_);
        memcpy(&b_, beta, sizeof b_);
    } else {
        float af, bf;
        memcpy(&af, alpha, sizeof af);
        memcpy(&bf, beta, sizeof bf);
        a_ = af;
        b_ = bf;
    }
    /* operands inside device memory (C only when it is read) */
    if (fake_need_device(fn, "A", A, fake_span(cfg.a, cfg.ab_size)) != cudaSuccess ||
        fake_need_device(fn, "B", B, fake_span(cfg.b, cfg.ab_size)) != cudaSuccess ||
        (b_ != 0.0 && fake_need_device(fn, "C", C, fake_span(cfg.c, cfg.cd_size)) != cudaSuccess) ||
        fake_need_device(fn, "D", D, fake_span(cfg.dd, cfg.cd_size)) != cudaSuccess)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    /* the epilogue's buffers: bias(m), and GELU's input aux(m x n; aux_ld),
     * aux_ld a multiple of 8 and >= m (cublasLt.h) */
    const uint32_t epi = cfg.d->epilogue;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT &&
        fake_need_device(fn, "bias", cfg.d->bias, (size_t)cfg.m * cfg.cd_size) != cudaSuccess)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        if (cfg.d->aux_ld < (int64_t)cfg.m || cfg.d->aux_ld % 8 != 0) {
            fake_violation("%s: EPILOGUE_AUX_LD %lld must be a multiple of 8 and >= %llu rows", fn,
                           (long long)cfg.d->aux_ld, (unsigned long long)cfg.m);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        const size_t aux_bytes = ((size_t)(cfg.n - 1) * (size_t)cfg.d->aux_ld + (size_t)cfg.m) * sizeof(float);
        if (fake_need_device(fn, "aux", cfg.d->aux, aux_bytes) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    if (fake_stream_drain(stream, fn) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;

    const uint64_t m = cfg.m, n = cfg.n, k = cfg.k;
    const int tf32 = cfg.d->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    const void *A0 = A, *B0 = B, *C0 = C;
    void *D0 = D;
    for (uint64_t bi = 0; bi < cfg.batch; bi++) {
        A = (const char *)A0 + (size_t)bi * (size_t)cfg.a->stride * cfg.ab_size;
        B = (const char *)B0 + (size_t)bi * (size_t)cfg.b->stride * cfg.ab_size;
        C = (const char *)C0 + (size_t)bi * (size_t)cfg.c->stride * cfg.cd_size;
        D = (char *)D0 + (size_t)bi * (size_t)cfg.dd->stride * cfg.cd_size;
        /* op(A) as opa(m, k) and op(B)^T as opbt(n, k), row-major doubles, so
         * each output is a dot product of two contiguous rows */
        double *opa = malloc((size_t)(m * k) * sizeof *opa);
        double *opbt = malloc((size_t)(n * k) * sizeof *opbt);
        double *out = malloc((size_t)(m * n) * sizeof *out);
        if (!opa || !opbt || !out) {
            free(opa), free(opbt), free(out);
            return CUBLAS_STATUS_ALLOC_FAILED;
        }
        for (uint64_t i = 0; i < m; i++)
            for (uint64_t p = 0; p < k; p++)
                opa[i * k + p] = cfg.d->transa == CUBLAS_OP_N ? fake_load(A, cfg.a->type, i, p, cfg.a->ld, tf32)
                                                              : fake_load(A, cfg.a->type, p, i, cfg.a->ld, tf32);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t p = 0; p < k; p++)
                opbt[j * k + p] = cfg.d->transb == CUBLAS_OP_N ? fake_load(B, cfg.b->type, p, j, cfg.b->ld, tf32)
                                                               : fake_load(B, cfg.b->type, j, p, cfg.b->ld, tf32);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                const double *x = opa + i * k, *y = opbt + j * k;
                double acc = 0.0;
                for (uint64_t p = 0; p < k; p++) acc += x[p] * y[p];
                out[i + j * m] = acc;
            }
        /* D = alpha * acc + beta * C: all of C is read before D is written, so
         * C == D (in place) is fine */
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                const size_t ci = (size_t)(i + j * (uint64_t)cfg.c->ld), di = (size_t)(i + j * (uint64_t)cfg.dd->ld);
                const double acc = out[i + j * m];
                if (cfg.c->type == CUDA_R_64F) {
                    const double r = b_ == 0.0 ? a_ * acc : a_ * acc + b_ * ((const double *)C)[ci];
                    ((double *)D)[di] = r;
                } else if (cfg.c->type != CUDA_R_32F) {
                    /* a 16-bit output: the fp32 result, rounded once to nearest even */
                    const int bf = cfg.c->type == CUDA_R_16BF;
                    const double c0 = b_ == 0.0 ? 0.0 : fake_load(C, cfg.c->type, i, j, cfg.c->ld, 0);
                    float v = (float)(b_ == 0.0 ? a_ * acc : a_ * acc + b_ * c0);
                    if (epi != CUBLASLT_EPILOGUE_DEFAULT) { /* the bias in D's type, added in fp32 */
                        const uint16_t h = ((const uint16_t *)cfg.d->bias)[i];
                        v = v + (bf ? hb_bf16_value(h) : (float)hb_f16_value(h));
                    }
                    ((uint16_t *)D)[di] = hb_round16(bf, v);
                } else {
                    const double r = b_ == 0.0 ? a_ * acc : a_ * acc + b_ * (double)((const float *)C)[ci];
                    float v = (float)r;
                    if (epi != CUBLASLT_EPILOGUE_DEFAULT) v = v + ((const float *)cfg.d->bias)[i];
                    if (epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                        ((float *)cfg.d->aux)[i + j * (uint64_t)cfg.d->aux_ld] = v;
                        /* cuBLASLt's GELU is its own tanh approximation, not
                         * kiln's km_gelu; libm's tanhf in float stands for it,
                         * so a caller that promises the cpu's GELU bits and
                         * uses this epilogue shows the difference */
                        v = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
                    }
                    ((float *)D)[di] = v;
                }
            }
        free(opa), free(opbt), free(out);
    }
    fake_stats.matmuls++;
    if (cfg.a->type == CUDA_R_16F || cfg.a->type == CUDA_R_16BF) fake_stats.matmuls_16bit++;
    if (cfg.a->type == CUDA_R_32F && !tf32) fake_stats.matmuls_fp32++;
    if (epi == CUBLASLT_EPILOGUE_BIAS && cfg.c->type != CUDA_R_32F && cfg.c->type != CUDA_R_64F)
        fake_stats.matmuls_bias16++;
    lightHandle->last_stream = stream;
    lightHandle->last_syncs = fake_stream_syncs(stream);
    lightHandle->pending = lightHandle->last_syncs != (unsigned long)-1; /* not the legacy stream */
    return CUBLAS_STATUS_SUCCESS;
}
