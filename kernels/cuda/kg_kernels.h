/*
 * kg_kernels.h: the CUDA kernels the "cuda" accelerator plugin trains with,
 * as plain C launchers. Each launcher enqueues its work on `stream` and
 * returns the launch's cudaError_t (cudaSuccess, or the error of the launch
 * itself; an error inside a kernel shows up at the next synchronisation).
 * Nothing here allocates or synchronises: the plugin owns every buffer
 * (scratch included) and decides when to wait. All pointers are device
 * pointers of the current device; tensors are row-major.
 *
 * dtype arguments use the ABI's numbers (KILN_DTYPE_F32 = 1 ... see
 * kiln/tensor.h): `fdt` means F32 or F64 (the "_ex" kernels of the table),
 * 16-bit values are stored as IEEE half / bfloat16 bit patterns. Every
 * kernel's per-element arithmetic is in kg_math.cuh (host+device), which the
 * CPU references in kernels/cpu/ define the meaning of; tests compare the
 * two (tests/gpu, and tests/cuda_math on the host without a GPU).
 *
 * Reductions are deterministic: a fixed grid of KG_REDUCE_BLOCKS blocks
 * writes one partial each into caller scratch, then one block adds the
 * partials in order, so the result does not depend on timing.
 */
#ifndef KILN_KERNELS_CUDA_KG_KERNELS_H
#define KILN_KERNELS_CUDA_KG_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "../common/km_seq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Mirrors of the ABI's numbers (checked by static_assert in the plugin). */
enum { KG_F32 = 1, KG_F64 = 2, KG_F16 = 3, KG_BF16 = 4, KG_F8E4M3 = 8, KG_F8E5M2 = 9 };
enum { KG_ACT_RELU = 0, KG_ACT_GELU = 1, KG_ACT_TANH = 2, KG_ACT_SIGMOID = 3, KG_ACT_LEAKY_RELU = 4 };

/* Partials a reduction writes: the scratch it needs is KG_REDUCE_BLOCKS
 * doubles (plus the output). */
#define KG_REDUCE_BLOCKS 256

/* y(rows, cols) += b(cols); fdt */
cudaError_t kg_bias_add(cudaStream_t s, int fdt, void *y, const void *b, int rows, int cols);
/* db(cols) = (accumulate ? db : 0) + column sums of dy(rows, cols); fdt,
 * summed in the element type; fdt KG_F16 / KG_BF16 (ABI 1.7): dy stored in
 * that format, widened as read, db and work float32 (the float32 sums). Two passes with a fixed order, so every run
 * gives the same bits (not the cpu's: it sums each column top to bottom):
 *   1. the rows split into parts of KG_BIAS_GRAD_ROWS (the last may be
 *      shorter); in part p, lane l (0 .. KG_BIAS_GRAD_LANES-1) sums rows
 *      p*KG_BIAS_GRAD_ROWS + l, + l + LANES, ... in order from 0, and the
 *      part's sum is lane 0 + lane 1 + ... + lane LANES-1, left to right;
 *   2. db = init + part 0 + part 1 + ..., left to right (init: db or 0).
 * work: (parts, cols) partials of the element type, at least
 * kg_bias_grad_work_bytes() bytes of device memory; NULL when that is 0
 * (one part: pass 1 writes db itself). rows == 0 with accumulate == 0
 * zeroes db. */
#define KG_BIAS_GRAD_ROWS 256
#define KG_BIAS_GRAD_LANES 8
static inline size_t kg_bias_grad_parts(int rows) {
    return rows <= KG_BIAS_GRAD_ROWS ? 1 : ((size_t)rows + KG_BIAS_GRAD_ROWS - 1) / KG_BIAS_GRAD_ROWS;
}
static inline size_t kg_bias_grad_work_bytes(int fdt, int rows, int cols) {
    const size_t parts = kg_bias_grad_parts(rows);
    if (parts <= 1 || cols <= 0) return 0;
    return parts * (size_t)cols * (fdt == KG_F64 ? sizeof(double) : sizeof(float));
}
cudaError_t kg_bias_grad(cudaStream_t s, int fdt, void *db, const void *dy, int rows, int cols, int accumulate,
                         void *work);
/* y(n) = act(x); dx(n) = dy * act'(x) (dx may alias dy); fdt; act KG_ACT_*.
 * kg_act_backward also takes fdt KG_F16 / KG_BF16 (ABI 1.7): dx, dy and x
 * stored in that format, float32 arithmetic, dx rounded as stored. */
cudaError_t kg_act_forward(cudaStream_t s, int fdt, int act, void *y, const void *x, size_t n);
cudaError_t kg_act_backward(cudaStream_t s, int fdt, int act, void *dx, const void *dy, const void *x, size_t n);
/* ABI 1.11: kg_act_backward(dx, dy, x, rows * cols), then kg_bias_grad(db,
 * dx, rows, cols, accumulate, work), bit for bit, in one pass over the
 * gradient (work as kg_bias_grad's, for fdt). db NULL: kg_act_backward. */
cudaError_t kg_act_bias_backward(cudaStream_t s, int fdt, int act, void *dx, void *db, const void *dy, const void *x,
                                 int rows, int cols, int accumulate, void *work);

/* Softmax cross-entropy, one block per row. probs(B, C) = softmax(logits);
 * row_loss(B) (double) = -log probs[b, labels[b]]; row_correct(B) = argmax ==
 * label (first maximum wins, as on the CPU); *bad_row (device int, caller
 * sets it to -1 first) = the smallest row whose label is outside [0, C).
 * fdt. The plugin reduces row_loss/row_correct with kg_reduce_rows. */
cudaError_t kg_softmax_xent_forward(cudaStream_t s, int fdt, void *probs, const void *logits, const int32_t *labels,
                                    int B, int C, double *row_loss, int32_t *row_correct, int32_t *bad_row);
/* out[0] = sum of row_loss(B) / B, out[1] = sum of row_correct(B), added in
 * row order by one block (deterministic). */
cudaError_t kg_reduce_rows(cudaStream_t s, const double *row_loss, const int32_t *row_correct, int B, double *out);
/* dlogits(B, C) = dloss * (probs - onehot(labels)) / B; fdt */
cudaError_t kg_softmax_xent_backward(cudaStream_t s, int fdt, void *dlogits, const void *probs,
                                     const int32_t *labels, int B, int C, double dloss);

/* Reductions over x(n) (dtype F32, F64, F16 or BF16), accumulated in double:
 * KG_SUM the sum, KG_SUMSQ the sum of squares, KG_NONFINITE the count of
 * inf/NaN values. partials: KG_REDUCE_BLOCKS doubles; *out: one double. */
enum { KG_SUM = 0, KG_SUMSQ = 1, KG_NONFINITE = 2 };
cudaError_t kg_reduce(cudaStream_t s, int op, int dtype, const void *x, size_t n, double *partials, double *out);

/* x(n) *= a; y(n) += a * x(n); fdt (a rounded to float for F32). kg_scale
 * also takes F16 / BF16 storage (gemm_ex's K == 0 on a 16-bit C): the
 * product formed in float and rounded as it is stored. */
cudaError_t kg_scale(cudaStream_t s, int fdt, void *x, double a, size_t n);
cudaError_t kg_axpy(cudaStream_t s, int fdt, void *y, double a, const void *x, size_t n);
/* A list of up to KG_LIST_MAX tensors, passed to a kernel by value (its
 * 776 bytes are far below the 4 KiB kernel-parameter limit). */
#define KG_LIST_MAX 48
typedef struct kg_list {
    void *x[KG_LIST_MAX];  /* device pointers */
    size_t n[KG_LIST_MAX]; /* elements of each */
    int count;
} kg_list;
/* Loss-scale unscale and finite check of a whole list in one launch: every
 * x[t](n[t]) *= a, and *nonfinite (device int, caller zeroes it) set to 1
 * when any product is inf/NaN. fdt. */
cudaError_t kg_unscale_check(cudaStream_t s, int fdt, const kg_list *list, double a, int32_t *nonfinite);
/* kg_reduce over each tensor of a list, in two launches: out[t] = the value
 * kg_reduce gives list->x[t](n[t]), bit for bit (0 for an empty one, whose
 * pointer is not read). partials: KG_REDUCE_BLOCKS * list->count doubles;
 * out: list->count doubles; both device memory. */
cudaError_t kg_reduce_list(cudaStream_t s, int op, int dtype, const kg_list *list, double *partials, double *out);

/* The part of linear_forward's epilogue cuBLASLt did not do, in one pass:
 * y(rows, cols) = round_dtype(y + b(cols)) (b may be NULL), and
 * post(rows, cols) = round_dtype(act(y)) when act >= 0 (KG_ACT_*; -1: no
 * activation, post unused). fdt; round_dtype F32 (none), or F16/BF16 with
 * F32 data. */
cudaError_t kg_linear_epilogue(cudaStream_t s, int fdt, void *y, const void *b, int rows, int cols, int act,
                               void *post, int round_dtype);
/* Its ABI 1.7 form for y and post stored in sdt (KG_F16 / KG_BF16), b
 * float32: with src (the float32 product, packed (rows, cols)) y =
 * sdt(src + b) (b may be NULL); with src NULL, y already holds the product
 * the GEMM rounded as it stored it and is only read (b must be NULL, and
 * without an activation nothing runs). post = sdt(act(y)) when act >= 0,
 * from the rounded y. */
cudaError_t kg_linear_epilogue16(cudaStream_t s, int sdt, void *y, const float *src, const float *b, int rows,
                                 int cols, int act, void *post);

/* dst(n) = src(n) converted between F32, F64, F16, BF16 (round to nearest
 * even; overflow to inf). dst and src must not overlap unless equal dtypes
 * and equal pointers (then nothing happens). */
cudaError_t kg_cast(cudaStream_t s, void *dst, int dst_dtype, const void *src, int src_dtype, size_t n);
/* x(n) float32, rounded in place through F16, BF16, or the OCP FP8
 * formats F8E4M3 / F8E5M2 (kernels/common/km_fp8.h) (F32: nothing). */
cudaError_t kg_round_to(cudaStream_t s, float *x, int dtype, size_t n);
/* The gemm_ex epilogue with rounding: c(rows, cols; ldc) = round_dtype(
 * p(rows, cols; packed)) + beta * c (c not read when beta == 0). F32 c.
 * p is F32, or p_dtype == round_dtype (F16 / BF16): the product the GEMM
 * rounded as it stored it, widened here (half the bytes of an F32 p). */
cudaError_t kg_round_add(cudaStream_t s, float *c, int ldc, const void *p, int p_dtype, int rows, int cols,
                         int round_dtype, float beta);

/* The ABI 1.5 elementwise building blocks (kg_ew.cu), one launcher for all:
 * y(n) = op(a, b) of fdt, op KG_EW_* with kernels/cpu's KC_EW_* numbers
 * and formulas (kernels/common/km_ew.h): lerp (weight s0), sign (a), mul,
 * addcmul / addcdiv (value s0; y read too), sqrt (a), clamp (a to
 * [s0, s1]). Scalars rounded to float once for F32. y may equal a or b;
 * b is NULL for the unary ops. */
enum { KG_EW_LERP = 0, KG_EW_SIGN = 1, KG_EW_MUL = 2, KG_EW_ADDCMUL = 3, KG_EW_ADDCDIV = 4, KG_EW_SQRT = 5,
       KG_EW_CLAMP = 6 };
cudaError_t kg_ew(cudaStream_t s, int op, int fdt, void *y, const void *a, const void *b, double s0, double s1,
                  size_t n);

/* torch.optim.SGD on one tensor of fdt (PyTorch order, see
 * kernels/cpu/cpu_train.inc). momentum_buf may be NULL when momentum == 0.
 * compute(n), when not NULL, receives the updated p cast to compute_dtype
 * (F16/BF16/F32) in the same pass. */
cudaError_t kg_sgd_update(cudaStream_t s, int fdt, void *p, const void *g, void *momentum_buf, size_t n, double lr,
                          double momentum, double dampening, int nesterov, double weight_decay, int first_step,
                          void *compute, int compute_dtype);
/* torch.optim.AdamW on one tensor of fdt; step is 1-based; bias
 * corrections computed in double as on the CPU. compute as for SGD. */
cudaError_t kg_adamw_update(cudaStream_t s, int fdt, void *p, const void *g, void *m, void *v, size_t n, double lr,
                            double beta1, double beta2, double eps, double weight_decay, int64_t step, void *compute,
                            int compute_dtype);

/* A list of up to KG_ADAMW_LIST_MAX AdamW tensors, passed by value (2.9
 * KiB, below the 4 KiB kernel-parameter limit). Each tensor gets the blocks
 * kg_adamw_update would give it alone: tensor t owns blocks [first[t],
 * first[t + 1]) of a one-dimensional grid, so no block idles on a small
 * tensor beside a large one. The caller fills p, g, m, v, n, weight_decay
 * and count; kg_adamw_update_list fills first and decay (1 - lr *
 * weight_decay[t], formed as the single call forms it, a float's value
 * for F32). */
#define KG_ADAMW_LIST_MAX 48
typedef struct kg_adamw_list {
    void *p[KG_ADAMW_LIST_MAX];
    const void *g[KG_ADAMW_LIST_MAX];
    void *m[KG_ADAMW_LIST_MAX];
    void *v[KG_ADAMW_LIST_MAX];
    size_t n[KG_ADAMW_LIST_MAX];
    double weight_decay[KG_ADAMW_LIST_MAX];
    double decay[KG_ADAMW_LIST_MAX];       /* filled by kg_adamw_update_list */
    unsigned first[KG_ADAMW_LIST_MAX + 1]; /* likewise */
    int count;
} kg_adamw_list;
/* kg_adamw_update (no compute copy) on every tensor of the list in one
 * launch, each tensor's result the bits of its own call. */
cudaError_t kg_adamw_update_list(cudaStream_t s, int fdt, kg_adamw_list *list, double lr, double beta1, double beta2,
                                 double eps, int64_t step);

/* ---- The ABI 1.4 sequence kernels (kg_seq.cu, kg_attn.cu) ----
 * fdt F32 or F64 for every floating-point buffer of a call; round_dtype
 * (F32 data only) KG_F32 for none, KG_F16 / KG_BF16 to round the named
 * output once. Index buffers (tokens, targets, the embedding's buckets) are
 * device int32. The caller has checked sizes, indices and overlaps (the
 * plugin's entries do, as the cpu accelerator does); each launcher only
 * refuses a dtype or size it cannot run with cudaErrorInvalidValue. */

/* out(B*T, C) = wte[tokens[i]] + wpe[i % T] (wpe NULL: wte's row alone). */
cudaError_t kg_embedding_forward(cudaStream_t s, int fdt, void *out, const int32_t *tokens, const void *wte,
                                 const void *wpe, int B, int T, int C);
/* dwpe(T, C)[t] += dout[b*T + t] for b = 0, 1, ..., B-1 in that order. */
cudaError_t kg_embedding_backward_pos(cudaStream_t s, int fdt, void *dwpe, const void *dout, int B, int T, int C);
/* The token table's scatter-add by buckets, built by the caller from the
 * tokens (a stable counting sort): index = [token(nb) | start(nb + 1) |
 * order(n)], bucket k's positions order[start[k] .. start[k+1]) in
 * increasing order. dwte[token[k]] += dout[p] for each p of bucket k in
 * that order, one column per thread: each row sees its contributions one
 * at a time in increasing position, the serial loop's bits. */
cudaError_t kg_embedding_backward_tok(cudaStream_t s, int fdt, void *dwte, const void *dout, const int32_t *index,
                                      int nb, int C);

/* Layer norm, one warp per row: mean(N), rstd(N) from statistics summed in
 * double (two passes: the mean, then the squared deviations), stored in
 * fdt; y(N, C) = ((x - mean) * rstd) * w + b from the stored values (w, b
 * NULL: 1, 0), rounded through round_dtype. fdt KG_F16 / KG_BF16 (ABI
 * 1.7): y stored in that format (round_dtype must be fdt), every other
 * buffer float32. */
cudaError_t kg_layernorm_forward(cudaStream_t s, int fdt, void *y, void *mean, void *rstd, const void *x,
                                 const void *w, const void *b, int N, int C, double eps, int round_dtype);
/* ABI 1.10: res(N, C) = a + rb first (kg_add's sum, rb stored as y is),
 * then kg_layernorm_forward of res, in the same pass: res is written as
 * the statistics are summed and read back from there, never x. res may
 * equal a. */
cudaError_t kg_add_layernorm_forward(cudaStream_t s, int fdt, void *res, const void *a, const void *rb, void *y,
                                     void *mean, void *rstd, const void *w, const void *b, int N, int C, double eps,
                                     int round_dtype);
/* Its backward (fdt KG_F16 / KG_BF16, ABI 1.7: dy stored in that format,
 * every other buffer float32). dx(N, C) = (accumulate ? dx : 0) + rstd * ((g - mean_C(g))
 * - xhat * mean_C(g * xhat)), g = dy * w (dy without w), row sums in double.
 * dw(C) += sum_n dy * xhat, db(C) += sum_n dy (each skipped when NULL):
 * partial sums in double over the row blocks of kernels/common/km_seq.h,
 * added in block order and rounded once (the cpu's bits). work: at least
 * kg_layernorm_backward_work_bytes() bytes (NULL when 0). */
static inline size_t kg_layernorm_backward_work_bytes(int N, int C, int has_dw, int has_db) {
    if (N <= 0 || C <= 0 || (!has_dw && !has_db)) return 0;
    return km_ln_blocks((size_t)N) * (size_t)C * sizeof(double) * (size_t)((has_dw != 0) + (has_db != 0));
}
cudaError_t kg_layernorm_backward(cudaStream_t s, int fdt, void *dx, void *dw, void *db, const void *dy,
                                  const void *x, const void *w, const void *mean, const void *rstd, int N, int C,
                                  int accumulate, void *work);
/* ABI 1.11: kg_layernorm_backward, and dx16 (N, C) in dx16_fdt (KG_F16 or
 * KG_BF16) = dx rounded as kg_cast rounds it, stored by the same kernel as
 * it stores dx (fdt not KG_F64). */
cudaError_t kg_layernorm_backward_cast(cudaStream_t s, int fdt, void *dx, void *dw, void *db, const void *dy,
                                       const void *x, const void *w, const void *mean, const void *rstd, int N, int C,
                                       int accumulate, void *work, void *dx16, int dx16_fdt);

/* Softmax cross-entropy fused with its gradient, one block per row of
 * logits(N, Vp) (columns [V, Vp) padding), targets(N) in [-1, V):
 * row_loss(N) (double) = logsumexp(logits[i, :V]) - logits[i, t] (0 for
 * t = -1); with grad_scale != 0 the row is overwritten with grad_scale *
 * (softmax - onehot), 0 in the padding and on ignored rows. A row whose
 * target is outside [-1, V) is left alone and lowers *bad_row (device int,
 * the caller sets it to -1) to the smallest such row. Then *loss_sum =
 * the row losses added in kernels/common/km_seq.h's block order. fdt
 * KG_F16 / KG_BF16 (ABI 1.6): logits stored in that format, the row's
 * arithmetic in float32 on the widened values, the gradient stored rounded
 * to nearest even. */
cudaError_t kg_xent_fused(cudaStream_t s, int fdt, void *logits, const int32_t *targets, int N, int V, int Vp,
                          double grad_scale, double *row_loss, int32_t *bad_row, double *loss_sum);

/* y(n) = a(n) + b(n); y may equal a or b. fdt KG_F16 / KG_BF16 (ABI 1.7):
 * b stored in that format, y and a float32 (y may equal a only). */
cudaError_t kg_add(cudaStream_t s, int fdt, void *y, const void *a, const void *b, size_t n);

/* Causal self-attention on qkv(B, T, 3C) (kiln/training.h's layout; D =
 * C / NH), the row-wise kernels (the accelerator's `attention = "rowwise"`;
 * the default runs the products on cuBLASLt, see below), one warp per
 * (batch, head, row): the row's scores (scaled by
 * 1 / sqrt(D) rounded to fdt) kept in shared memory, the softmax with the
 * row max subtracted and its sum in double, lse(B, NH, T) = max +
 * log(sum), out(B, T, C) = sum_j p_j v_j / sum (accumulated in double),
 * rounded through round_dtype. T may be at most kg_attention_max_T(fdt):
 * the backward keeps two rows of T values per warp in the 48 KiB of shared
 * memory a block has without opting in. fdt KG_F16 / KG_BF16 (ABI 1.7):
 * qkv, out, dout and dqkv stored in that format (round_dtype must be fdt),
 * float32 arithmetic, lse and shared memory. */
#define KG_ATTN_SMEM 49152
static inline int kg_attention_max_T(int fdt) {
    return (int)(KG_ATTN_SMEM / (2 * (fdt == KG_F64 ? sizeof(double) : sizeof(float))));
}
cudaError_t kg_attention_forward(cudaStream_t s, int fdt, void *out, void *lse, const void *qkv, int B, int T,
                                 int C, int NH, int round_dtype);
/* Its backward into dqkv(B, T, 3C) (overwritten), recomputing each P row
 * from lse: dQ by rows (one warp per query row), dK and dV by columns (one
 * warp per key row), so no two threads add into one element and the bits
 * never depend on timing. work: B * NH * T doubles (Delta = rowsum(dout *
 * out)). */
cudaError_t kg_attention_backward(cudaStream_t s, int fdt, void *dqkv, const void *dout, const void *qkv,
                                  const void *out, const void *lse, int B, int T, int C, int NH, int round_dtype,
                                  double *work);

/* The fused ("flash") path (the accelerator's `attention = "flash"`;
 * kg_flash.cuh): tiles of 64 queries and 64 keys, the scores, softmax and
 * sums in registers (FlashAttention-2's design), the products on the
 * tensor cores (mma.sync, sm_80 and newer) with bf16 or f16 operands
 * (round_dtype) and float accumulators, nothing T x T in device memory;
 * the backward deterministic (a dK/dV program per key tile, a dQ program
 * per query tile, no atomics). For float32 data whose outputs are rounded
 * to 16 bits (a mixed-precision step) and heads of D = 16, 32, 64 or 128;
 * anything else takes another path (kg_flash_supported). The kernels need
 * kg_flash_smem_bytes(D) of shared memory per block (opted into at the
 * first launch; the caller checks the device's limit). delta: B * NH * T
 * doubles of scratch (rowsum(dout * out), kg_attn_delta). */
static inline int kg_flash_supported(int fdt, int round_dtype, int D) {
    return fdt == KG_F32 && (round_dtype == KG_BF16 || round_dtype == KG_F16) &&
           (D == 16 || D == 32 || D == 64 || D == 128);
}
size_t kg_flash_smem_bytes(int D);
/* sdt: the storage of qkv, out, dout and dqkv: KG_F32, or round_dtype
 * itself (ABI 1.7's 16-bit activations: the same values, the outputs
 * stored in the rounded format, lse float32 either way). */
cudaError_t kg_flash_forward(cudaStream_t s, void *out, void *lse, const void *qkv, int B, int T, int C, int NH,
                             int round_dtype, int sdt);
cudaError_t kg_flash_backward(cudaStream_t s, void *dqkv, const void *dout, const void *qkv, const void *out,
                              const void *lse, int B, int T, int C, int NH, int round_dtype, int sdt, double *delta);

/* The GEMM path of attention (plugins/cuda/cuda_seq.c runs the products
 * with cuBLASLt strided batches; these are the steps between them). BH =
 * B * NH; head-major buffers hold head bh's (T, D) at bh * hs and score
 * buffers head bh's (T, T) at bh * ts (strides in elements, at least T * D
 * and T * T: padded, each head's matrix starts aligned for the tensor
 * cores); the scores, lse and every fdt buffer are F32 or F64; `op` is
 * the dtype of the products' operands: fdt, or F16 / BF16 beside F32 (the
 * tensor cores; conversions round to nearest even).
 *   kg_heads_split: dst[bh*hs + t*D + d] (op) = src[(b*T + t)*ld + h*D + d]
 *   kg_heads_merge: dst[(b*T + t)*ld + h*D + d] = round_dtype(src[bh*hs + t*D + d])
 *   kg_attn_softmax: per row i of S (already scaled), over keys j <= i:
 *       lse = max + log(sum exp(s - max)) (the sum in double), P = exp(s -
 *       max) / sum; P = 0 above the diagonal. rows = BH * T.
 *   kg_attn_probs: P = exp(S - lse) below the diagonal, 0 above.
 *   kg_attn_dscores: dS = P * (dP - delta[row]), P recomputed as in
 *       kg_attn_probs, 0 above the diagonal.
 *   kg_attn_delta: delta(B, NH, T) = sum over the head's columns of dout *
 *       out (B, T, C), in double.
 * ABI 1.7's 16-bit activations: fdt KG_F16 / KG_BF16 names the storage of
 * the packed buffers (src of the split, which needs op == fdt and copies;
 * dst of the merge, which needs round_dtype == fdt and stores the float
 * values rounded; dout and out of the delta); the head-major buffers,
 * scores and lse stay float32 (the row steps take fdt KG_F32). */
cudaError_t kg_heads_split(cudaStream_t s, int fdt, const void *src, int ld, int B, int T, int NH, int D, void *dst,
                           size_t hs, int op);
cudaError_t kg_heads_merge(cudaStream_t s, int fdt, void *dst, int ld, int B, int T, int NH, int D, const void *src,
                           size_t hs, int round_dtype);
cudaError_t kg_attn_softmax(cudaStream_t s, int fdt, const void *S, int T, size_t rows, size_t ts, void *lse, void *P,
                            int op);
cudaError_t kg_attn_probs(cudaStream_t s, int fdt, const void *S, const void *lse, int T, size_t rows, size_t ts,
                          void *P, int op);
cudaError_t kg_attn_dscores(cudaStream_t s, int fdt, const void *S, const void *dP, const void *lse,
                            const double *delta, int T, size_t rows, size_t ts, void *dS, int op);
cudaError_t kg_attn_delta(cudaStream_t s, int fdt, const void *dout, const void *out, int B, int T, int C, int NH,
                          double *delta);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KERNELS_CUDA_KG_KERNELS_H */
