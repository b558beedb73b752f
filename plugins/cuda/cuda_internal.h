/*
 * cuda_internal.h — what the three files of the "cuda" accelerator plugin
 * share: the instance (device, stream, cuBLASLt handle, caching allocator,
 * pinned staging ring, scratch), the error macros that turn a failing CUDA
 * or cuBLAS call into a kiln_status and a message naming the call, and the
 * functions each file provides to the others. cuda_mem.c owns memory and
 * copies, cuda_blas.c the GEMMs (with their cuBLASLt epilogues),
 * cuda_fused.c the fused ABI 1.3 entries, cuda_seq.c the ABI 1.4 sequence
 * entries, cuda_accel.c the kernel table,
 * the instance's life cycle and the descriptor. Nothing here is visible outside
 * the library (hidden visibility, version script).
 */
#ifndef KILN_PLUGIN_CUDA_INTERNAL_H
#define KILN_PLUGIN_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <kiln/kiln.h>

#include "../../kernels/common/km_gemm.h" /* gemm_ex's operand rule, shared with the cpu */
#include "../common/accel_checks.h"
#include "kg_kernels.h"

/* `profile = true`'s event ring and totals (cuda_prof.c). */
typedef struct cu_prof cu_prof;

/* One block of device memory the caching allocator knows about. */
typedef struct cu_block {
    void *ptr;
    size_t size;  /* rounded size actually allocated */
    int in_use;
} cu_block;

/* One slot of the pinned staging ring used for host-to-device copies: the
 * host data is memcpy'd into `host` (pinned), the DMA is queued on the
 * stream, and `done` is recorded after it so the slot is reused only once
 * the device has read it. */
typedef struct cu_stage {
    void *host;          /* (bytes) pinned, cudaHostAlloc */
    size_t bytes;
    cudaEvent_t done;
    int pending;         /* an async copy from this slot may still run */
} cu_stage;

#define CU_STAGES 4
#define CU_GEMM_PLANS 64

/* A cached cuBLASLt plan for one GEMM shape and type combination. */
typedef struct cu_plan {
    int valid;
    /* key */
    int ta, tb, m, n, k, lda, ldb, ldc;
    int atype, btype, ctype, compute;
    int beta_zero;
    int align;          /* smallest alignment of A, B and C, bytes (<= 256) */
    int epilogue;       /* cublasLtEpilogue_t; CUBLASLT_EPILOGUE_DEFAULT: none */
    int bias_align;     /* the bias pointer's alignment (0: no epilogue) */
    int aux_align;      /* the aux pointer's alignment (0: not GELU_AUX_BIAS) */
    int batch;          /* strided batch count (1: one GEMM)                 */
    int64_t sa, sb, sc; /* batch strides of A, B, C in elements              */
    /* value */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    unsigned long last_use;
} cu_plan;

/* The attention paths (config `attention`): cuBLASLt products with the
 * scores in device memory, one warp per row, or the fused tiles of
 * kernels/cuda/kg_flash.cuh. */
enum { CU_ATTN_GEMM = 0, CU_ATTN_ROWWISE = 1, CU_ATTN_FLASH = 2 };
/* What a GEMM's FLOPs ran on: 16-bit tensor cores (fp16/bf16 operands),
 * TF32 tensor cores, the fp32 and the fp64 units (acc->gemm_flops) */
enum { CU_FLOPS_16 = 0, CU_FLOPS_TF32 = 1, CU_FLOPS_32 = 2, CU_FLOPS_64 = 3 };

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    /* configuration */
    int32_t device_cfg;     /* config `device`; -1: the local rank's device */
    int32_t tf32;           /* config `tf32`: fp32 GEMMs on TF32 tensor cores */
    int32_t caching;        /* config `caching`: freed blocks kept for reuse (cuda_mem.c) */
    size_t workspace_bytes; /* config `workspace_mib`: cuBLASLt workspace */
    size_t stage_bytes;     /* config `staging_mib`: each pinned staging slot */
    int attn_path;          /* config `attention`: CU_ATTN_GEMM, _ROWWISE, _FLASH */
    int profile;            /* config `profile`: GPU time per entry (log)    */
    size_t attn_cap;        /* config `attention_workspace_mib`, bytes        */
    /* after configure() */
    int driver_version;     /* cudaDriverGetVersion, e.g. 13000 (create)   */
    int runtime_version;    /* cudaRuntimeGetVersion: the loaded libcudart */
    /* a sticky error (a kernel faulted: every later CUDA call in the
     * process fails the same way): cudaSuccess until one is seen, then the
     * error and the entry that saw it first; cu_enter refuses from then on */
    cudaError_t lost;
    char lost_at[48];
    int configured;         /* device chosen and every resource set up     */
    int setup_started;      /* configure() began creating resources (so
                               destroy releases them; a failed configure
                               is not retried)                             */
    int device;
    char device_name[256];
    int cc_major, cc_minor;
    size_t smem_optin;      /* shared memory a block may opt into (bytes)  */
    int flash_noted;        /* the flash path's fallback was logged once    */
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_workspace;     /* (workspace_bytes) device */
    cu_plan plans[CU_GEMM_PLANS];
    unsigned long plan_clock;
    /* caching allocator: every block ever cudaMalloc'ed, live or cached */
    cu_block *blocks;
    size_t nblocks, cap_blocks;
    size_t bytes_cached, bytes_in_use;
    unsigned long device_mallocs; /* cudaMalloc calls, for tests/benchmarks */
    /* the times an entry waited for the stream to hand a value back to the
     * host (cu_wait), for tests/benchmarks: each one leaves the GPU idle
     * until the host queues the next launch */
    unsigned long host_waits;
    /* GEMM work queued through cuBLASLt, logged at exit: FLOPs (2*M*N*K
     * per product) by the units they run on (CU_FLOPS_*), and the bytes the
     * operand conversions of gemm_ex and linear_forward read and wrote */
    double gemm_flops[4];
    double gemm_convert_bytes;
    /* 1 once cuBLASLt found no algorithm for a bias epilogue on a 16-bit
     * output (1.8's rounded bias): linear_forward then adds the rounded bias
     * through float32 scratch, as for a float32 bias (logged once) */
    int no_bias16;
    /* pinned staging ring for H2D copies */
    cu_stage stages[CU_STAGES];
    int next_stage;
    /* pinned results read back after a sync: (8) doubles */
    double *host_scalars;
    /* device scratch: reduction partials and results (KG_REDUCE_BLOCKS + 8
     * doubles); grow-only: softmax rows (B doubles + B ints + 1 int), and
     * ws for gemm_ex operands and products and bias_grad's partials */
    double *red_scratch;
    void *row_scratch;
    size_t row_scratch_bytes;
    void *ws;
    size_t ws_bytes;
    /* The labels the last softmax_xent_forward found valid: (checked_B)
     * ints at checked_labels, all in [0, checked_C). A backward over the
     * same labels skips its own check (a read-back and a wait per step);
     * copy(), zero() and free() over any of those bytes forget them, and
     * nothing else in the table writes int32 data. */
    const void *checked_labels;
    int32_t checked_B, checked_C;
    /* host copy of the labels the loss backward checks, grow-only */
    int32_t *host_labels;
    size_t host_labels_cap;
    /* The tokens the last embedding entry read back and found in [0,
     * tok_V): (tok_n) ints at tok_dev, their host copy in tok_host
     * (grow-only). The backward over the same tokens builds its buckets
     * from that copy without a read-back; copy(), zero() and free() over
     * those bytes forget them (cu_labels_touched). */
    const void *tok_dev;
    size_t tok_n;
    int32_t tok_V;
    int32_t *tok_host;
    size_t tok_host_cap;
    /* embedding_backward's bucket index: host counts (V + 1) and index
     * (2 * buckets + 1 + B*T), grow-only, and the device copy */
    int32_t *emb_count, *emb_index;
    size_t emb_count_cap, emb_index_cap;
    void *emb_index_dev;    /* int32 */
    size_t emb_index_dev_bytes;
    /* grow-only device scratch of the sequence entries: the layer norm's
     * dw/db partials or attention's Delta (seq_work), the cross-entropy's
     * row losses, sum and bad row (seq_rows) */
    void *seq_work;
    size_t seq_work_bytes;
    void *seq_rows;
    size_t seq_rows_bytes;
    /* the gemm attention's operands, scores and products (grow-only) */
    void *attn_ws;
    size_t attn_ws_bytes;
    /* sumsq_many's scratch, grow-only: one list's partials
     * (KG_LIST_MAX * KG_REDUCE_BLOCKS doubles), then the results (count) */
    void *many_dev;
    size_t many_dev_bytes;
    cu_prof *prof; /* NULL unless profile = true */
};

#define CU_ERR(acc, code, ...) kiln_errorf((acc)->svc, (acc)->hctx, (code), __VA_ARGS__)

/* The checks shared with the cpu plugin (../common/accel_checks.h) report
 * through this sink: the same messages, "cuda: " in front. */
#define CU_SINK(acc) ACK_SINK(acc, "cuda: ")

/* Checks a CUDA runtime call; on failure returns KILN_E_CUDA (KILN_E_NOMEM
 * for cudaErrorMemoryAllocation) with "cuda: <what>: <call> failed: <error
 * name> (<error string>)". Clears the runtime's last error for non-sticky
 * errors so a later call does not report it again. A sticky one (a kernel
 * faulted; it may have been queued by an earlier entry) marks the instance
 * lost and says so; errors that mean the driver is too old for this build,
 * or the build has no code for the GPU, say what to install or rebuild. */
int32_t cu_fail(kiln_instance *acc, cudaError_t e, const char *what, const char *call);
/* "13.0" from a CUDA version number such as 13000 (cuda_accel.c). */
void cu_version(int v, char *buf, size_t len);
#define CU_CHECK(acc, what, call)                                              \
    do {                                                                       \
        cudaError_t cu_e_ = (call);                                            \
        if (cu_e_ != cudaSuccess) return cu_fail((acc), cu_e_, (what), #call); \
    } while (0)

int32_t cu_blas_fail(kiln_instance *acc, cublasStatus_t s, const char *what, const char *call);
#define CU_BLAS(acc, what, call)                                                      \
    do {                                                                              \
        cublasStatus_t cu_s_ = (call);                                                \
        if (cu_s_ != CUBLAS_STATUS_SUCCESS) return cu_blas_fail((acc), cu_s_, (what), #call); \
    } while (0)

/* A NULL pointer is only acceptable when nothing would be read or written. */
#define CU_NEED(acc, ptr, n, fn)                                                                           \
    do {                                                                                                   \
        if ((n) > 0 && !(ptr))                                                                             \
            return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: " fn ": " #ptr " is NULL for %zu elements",      \
                          (size_t)(n));                                                                    \
    } while (0)

/* Waits for the stream so that a result can be read on the host: every
 * such wait in an entry goes through here, counted (host_waits), so a test
 * can hold the steady-state step to a fixed number of them. */
static inline cudaError_t cu_wait(kiln_instance *acc) {
    acc->host_waits++;
    return cudaStreamSynchronize(acc->stream);
}

/* Launches a kernel of kernels/cuda and turns a launch error into a status. */
#define CU_LAUNCH(acc, fn, call) CU_CHECK(acc, fn, call)

static inline int cu_fdt(uint32_t dt) { return dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F64; }
static inline int cu_is16(uint32_t dt) { return dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16; }

static inline int32_t cu_check_fdt(kiln_instance *acc, const char *fn, uint32_t dt) {
    return ack_float_dtype(CU_SINK(acc), fn, dt);
}

/* Scratch carve-outs start on 256-byte boundaries (cuBLASLt's alignment). */
static inline size_t cu_up256(size_t b) { return (b + 255) & ~(size_t)255; }

/* Every entry that touches the device: the instance must be configured,
 * and its device is made current on the calling thread (the CUDA runtime's
 * current device is per thread, and another instance or thread may have
 * changed it). Cheap when it is current already. */
int32_t cu_enter(kiln_instance *acc, const char *fn);
#define CU_READY(acc, fn)                         \
    do {                                          \
        int32_t cu_rc_ = cu_enter((acc), (fn));   \
        if (cu_rc_ != KILN_OK) return cu_rc_;     \
    } while (0)

/* Forgets the checked labels and tokens when [p, p + bytes) overlaps
 * them: nothing else in the table writes int32 data. */
static inline void cu_labels_touched(kiln_instance *acc, const void *p, size_t bytes) {
    const uintptr_t a = (uintptr_t)p;
    if (acc->checked_labels) {
        const uintptr_t l = (uintptr_t)acc->checked_labels;
        const size_t lb = (size_t)acc->checked_B * sizeof(int32_t);
        if (a < l + lb && l < a + bytes) acc->checked_labels = NULL;
    }
    if (acc->tok_dev) {
        const uintptr_t t = (uintptr_t)acc->tok_dev;
        const size_t tb = acc->tok_n * sizeof(int32_t);
        if (a < t + tb && t < a + bytes) acc->tok_dev = NULL;
    }
}

/* cuda_mem.c */
/* alloc() of the kernel table: zero-filled (queued on the stream). */
int32_t cu_alloc(kiln_instance *acc, size_t bytes, void **out);
/* The same block cache without the zero fill, for the plugin's own scratch
 * (contents undefined); called inside an entry or configure() only, since
 * it makes no entry prologue (cu_enter). */
int32_t cu_alloc_scratch(kiln_instance *acc, size_t bytes, void **out);
void cu_free(kiln_instance *acc, void *ptr);
int32_t cu_copy(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind);
/* copy() inside another entry: its checked arguments, no second prologue
 * (which would book the entry's later kernels to "copy" in the profile). */
int32_t cu_copy_in(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind);
int32_t cu_zero(kiln_instance *acc, void *ptr, size_t bytes);
int32_t cu_synchronize(kiln_instance *acc);
/* Grow-only device scratch: *buf at least `bytes` (contents undefined). */
int32_t cu_reserve(kiln_instance *acc, void **buf, size_t *have, size_t bytes, const char *what);
/* Frees every cached block and staging slot (destroy). */
void cu_mem_release(kiln_instance *acc);
/* Sets up staging events and the pinned scalar buffer (configure). */
int32_t cu_mem_init(kiln_instance *acc);

/* cuda_blas.c */
int32_t cu_blas_init(kiln_instance *acc);
void cu_blas_release(kiln_instance *acc);
/* C(M,N) = alpha * op(A) * op(B) + beta * C, row-major, dtypes KILN_DTYPE_*
 * (A and B equal; F32/F16/BF16 with F32 C, or all F64), fp32 (fp64)
 * accumulation. */
int32_t cu_matmul(kiln_instance *acc, const char *fn, int ta, int tb, int M, int N, int K, double alpha,
                  const void *A, uint32_t at, int lda, const void *B, uint32_t bt, int ldb, double beta, void *C,
                  uint32_t ct, int ldc);
/* The dtype a product of an `at` and a `bt` operand rounded through rt runs
 * in (gemm_ex's rule, see cu_gemm_ex): km_gemm_round_dtype's 16-bit dtype
 * when each operand is fp32 or of it (the tensor cores); else fp32 (a
 * 16-bit operand widened exactly), or the operands' dtype when both are of
 * another one (F64). */
uint32_t cu_product_dtype(uint32_t at, uint32_t bt, uint32_t rt);
/* A(na elements) and B(nb) as operands of dtype op, for a product whose
 * fp32 operands are rounded through ort (km_gemm_round_dtype): each
 * converted into the grow-only workspace acc->ws where its dtype differs
 * from op, or copied and rounded there when it is fp32 in an fp32 product
 * with a 16-bit ort; else itself. `extra` more workspace bytes follow them
 * for the caller (*extra_out; may be NULL when extra is 0). */
int32_t cu_gemm_operands(kiln_instance *acc, const char *fn, uint32_t op, uint32_t ort, const void *A, uint32_t at,
                         size_t na, const void *B, uint32_t bt, size_t nb, size_t extra, const void **a,
                         const void **b, void **extra_out);
/* A cuBLASLt epilogue for cu_matmul_ep, in the row-major call's terms:
 * CUBLASLT_EPILOGUE_BIAS adds bias(N) to every row of C; GELU_AUX_BIAS
 * also applies GELU and stores C's pre-GELU values (bias added) in
 * aux(M, N; aux_ld), aux_ld a multiple of 8. F32 C only. linear_forward
 * uses BIAS only: cuBLASLt's GELU is not km_gelu's bits (cuda_fused.c). */
typedef struct cu_ep {
    int kind;           /* cublasLtEpilogue_t */
    const void *bias;   /* (N) device, C's dtype */
    void *aux;          /* (M, aux_ld) device, GELU_AUX_BIAS only */
    int64_t aux_ld;
} cu_ep;
int32_t cu_matmul_ep(kiln_instance *acc, const char *fn, int ta, int tb, int M, int N, int K, double alpha,
                     const void *A, uint32_t at, int lda, const void *B, uint32_t bt, int ldb, double beta, void *C,
                     uint32_t ct, int ldc, const cu_ep *ep);
/* `batch` products at once (cuBLASLt's strided batch): product i takes A +
 * i * sa, B + i * sb and C + i * sc (strides in elements); otherwise as
 * cu_matmul. K > 0, no epilogue. */
int32_t cu_matmul_strided(kiln_instance *acc, const char *fn, int ta, int tb, int M, int N, int K, double alpha,
                          const void *A, uint32_t at, int lda, int64_t sa, const void *B, uint32_t bt, int ldb,
                          int64_t sb, double beta, void *C, uint32_t ct, int ldc, int64_t sc, int batch);

/* cuda_fused.c: the ABI 1.3 entries */
int32_t cu_unscale_check(kiln_instance *acc, uint32_t dtype, void *const *x, const size_t *n, uint32_t count,
                         double a, int32_t *finite);
int32_t cu_linear_forward(kiln_instance *acc, uint32_t dtype, const void *x, const void *w, uint32_t w_dtype,
                          const void *b, int32_t rows, int32_t in, int32_t out, int32_t act, void *y, void *post,
                          uint32_t round_dtype);
/* 1.6: the same for either weight layout (KILN_LAYOUT_*) */
int32_t cu_linear_forward_layout(kiln_instance *acc, uint32_t dtype, const void *x, const void *w, uint32_t w_dtype,
                                 int32_t w_layout, const void *b, int32_t rows, int32_t in, int32_t out, int32_t act,
                                 void *y, void *post, uint32_t round_dtype);

/* cuda_prof.c: profile = true. init at configure; mark at every cu_enter;
 * report (to the log) and release at destroy, while the stream lives. */
int32_t cu_prof_init(kiln_instance *acc);
void cu_prof_mark(kiln_instance *acc, const char *entry);
void cu_prof_report(kiln_instance *acc);
void cu_prof_release(kiln_instance *acc);

/* cuda_seq.c: the ABI 1.4 sequence entries, cu_embedding_forward ...
 * cu_attention_backward */
ACK_DECLARE_SEQ_ENTRIES(cu_)
/* cuda_seq.c: 1.10's residual add fused with the layer norm after it */
int32_t cu_add_layernorm_forward(kiln_instance *acc, uint32_t dtype, void *res, const void *a, const void *b, void *y,
                                 void *mean, void *rstd, const void *w, const void *bias, int32_t N, int32_t C,
                                 double eps, uint32_t round_dtype);
/* cuda_seq.c: 1.11's layer norm backward with a 16-bit copy of dx */
int32_t cu_layernorm_backward_cast(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy,
                                   const void *x, const void *w, const void *mean, const void *rstd, int32_t N,
                                   int32_t C, int32_t accumulate, void *dx16, uint32_t dx16_dtype);

#endif /* KILN_PLUGIN_CUDA_INTERNAL_H */
