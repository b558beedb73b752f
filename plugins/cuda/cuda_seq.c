/*
 * cuda_seq.c — the cuda accelerator's ABI 1.4 sequence entries: embedding
 * forward and backward, layer norm forward and backward, causal attention
 * forward and backward, the fused cross-entropy and add, over the kernels
 * of kernels/cuda (kg_seq.cu, kg_attn.cu). Each entry first makes the cpu
 * accelerator's checks, through the same code (../common/accel_checks.h:
 * dtype, sizes, NULL buffers, round_dtype, forbidden overlaps:
 * KILN_E_INVALID_ARG), so a module that runs on one runs on the other.
 *
 * Indices live in device memory, so their range checks cost a read-back:
 *   - embedding_forward copies the B*T tokens to the host and waits once
 *     (a bad token is KILN_E_DATA before anything is written, as on the
 *     cpu). It keeps that host copy; embedding_backward over the same
 *     tokens (nothing has written them since: copy, zero and free forget
 *     it, see cu_labels_touched) builds its buckets from it without
 *     waiting. The buckets — a stable counting sort of the positions by
 *     token — are formed on the host and uploaded through the staging ring,
 *     so the scatter-add needs no float atomics and gives the cpu's bits.
 *   - xent_fused must return the loss sum, so it waits once anyway: the
 *     kernel leaves rows with a bad target alone and reports the smallest,
 *     and the entry turns that into KILN_E_DATA naming the row and target.
 * Attention runs its products on cuBLASLt (below, "the gemm path") unless
 * the accelerator is configured with attention = "rowwise", which takes
 * kg_attn.cu's one-warp-per-row kernels (no T x T buffers, CUDA cores), or
 * attention = "flash", which takes kg_flash.cu's fused tiles on the tensor
 * cores for the calls they run (16-bit mixed precision, head sizes 16, 32,
 * 64, 128; the gemm path otherwise, logged once).
 *
 * ABI 1.7's 16-bit activation storage (dtype F16 / BF16, KILN_KERNELS_ACT_
 * 16BIT): the layer norm's y and dy, attention's qkv, out, dout and dqkv,
 * and add's b are read and written in 16 bits by the same kernels (their
 * 16-bit instantiations: float32 arithmetic on the widened values, each
 * output rounded as it is stored), never staged through float32 copies.
 * Attention's gemm path splits the 16-bit qkv into its 16-bit operands
 * with a copy and merges its float32 products into 16-bit out and dqkv;
 * the flash path loads its 16-bit tiles straight from qkv and dout and
 * stores 16-bit outputs, and the rowwise kernels read and write 16 bits
 * in place of float32.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* A grow-only host buffer of int32. */
static int32_t cu_host_ints(kiln_instance *acc, const char *fn, int32_t **buf, size_t *cap, size_t n) {
    if (n <= *cap) return KILN_OK;
    int32_t *p = realloc(*buf, n * sizeof *p);
    if (!p) return CU_ERR(acc, KILN_E_NOMEM, "cuda: %s: out of host memory for %zu indices", fn, n);
    *buf = p;
    *cap = n;
    return KILN_OK;
}

/* The tokens(n) on the host, all in [0, V): the memo when it stands for
 * these bytes, else one read-back (which waits for the stream) and the
 * check, which names the first bad token as the cpu does. */
static int32_t cu_tokens_checked(kiln_instance *acc, const char *fn, const int32_t *tokens, int32_t B, int32_t T,
                                 int32_t V) {
    const size_t n = (size_t)B * (size_t)T;
    if (acc->tok_dev == (const void *)tokens && acc->tok_n == n && acc->tok_V == V) return KILN_OK;
    acc->tok_dev = NULL;
    int32_t rc = cu_host_ints(acc, fn, &acc->tok_host, &acc->tok_host_cap, n);
    if (rc != KILN_OK) return rc;
    CU_CHECK(acc, fn, cudaMemcpyAsync(acc->tok_host, tokens, n * sizeof(int32_t), cudaMemcpyDeviceToHost, acc->stream));
    CU_CHECK(acc, fn, cu_wait(acc));
    if ((rc = ack_tokens_in_range(CU_SINK(acc), fn, acc->tok_host, B, T, V)) != KILN_OK) return rc;
    acc->tok_dev = tokens, acc->tok_n = n, acc->tok_V = V;
    return KILN_OK;
}

/* ------------------------------------------------------------- embedding */

int32_t cu_embedding_forward(kiln_instance *acc, uint32_t dtype, void *out, const int32_t *tokens, const void *wte,
                             const void *wpe, int32_t B, int32_t T, int32_t C, int32_t V) {
    const char *fn = "embedding_forward";
    size_t nout = 0;
    int go = 0;
    int32_t rc = ack_emb_forward(CU_SINK(acc), fn, dtype, out, tokens, wte, wpe, B, T, C, V, &nout, &go);
    if (rc != KILN_OK || !go) return rc;
    CU_READY(acc, fn);
    if ((rc = cu_tokens_checked(acc, fn, tokens, B, T, V)) != KILN_OK) return rc;
    if (nout == 0) return KILN_OK;
    CU_LAUNCH(acc, fn, kg_embedding_forward(acc->stream, (int)dtype, out, tokens, wte, wpe, B, T, C));
    return KILN_OK;
}

/* The bucket index of kg_embedding_backward_tok from the host tokens: a
 * stable counting sort, only the tokens that occur. Returns the bucket
 * count; index = [token(nb) | start(nb + 1) | order(n)]. */
static int32_t cu_emb_buckets(kiln_instance *acc, const char *fn, int32_t V, int32_t *nb_out) {
    const size_t n = acc->tok_n;
    int32_t rc = cu_host_ints(acc, fn, &acc->emb_count, &acc->emb_count_cap, (size_t)V + 1);
    if (rc == KILN_OK) rc = cu_host_ints(acc, fn, &acc->emb_index, &acc->emb_index_cap, 2 * n + 1 + n);
    if (rc != KILN_OK) return rc;
    int32_t *cnt = acc->emb_count;
    memset(cnt, 0, ((size_t)V + 1) * sizeof *cnt);
    for (size_t i = 0; i < n; i++) cnt[acc->tok_host[i] + 1]++;
    int32_t nb = 0;
    for (int32_t v = 0; v < V; v++) nb += cnt[v + 1] != 0;
    int32_t *token = acc->emb_index, *start = token + nb, *order = start + nb + 1;
    /* prefix sums: cnt[v] = where token v starts among the positions */
    for (int32_t v = 0; v < V; v++) cnt[v + 1] += cnt[v];
    int32_t k = 0;
    for (int32_t v = 0; v < V; v++)
        if (cnt[v + 1] != cnt[v]) {
            token[k] = v;
            start[k] = cnt[v];
            k++;
        }
    start[nb] = (int32_t)n;
    for (size_t i = 0; i < n; i++) order[cnt[acc->tok_host[i]]++] = (int32_t)i;
    *nb_out = nb;
    return KILN_OK;
}

int32_t cu_embedding_backward(kiln_instance *acc, uint32_t dtype, void *dwte, void *dwpe, const void *dout,
                              const int32_t *tokens, int32_t B, int32_t T, int32_t C, int32_t V) {
    const char *fn = "embedding_backward";
    size_t ndout = 0;
    int go = 0;
    /* the bucket index is int32 */
    int32_t rc = ack_emb_backward(CU_SINK(acc), fn, dtype, dwte, dwpe, dout, tokens, B, T, C, V,
                                  (size_t)(INT32_MAX / 3), &ndout, &go);
    if (rc != KILN_OK || !go) return rc;
    const size_t n = (size_t)B * (size_t)T;
    CU_READY(acc, fn);
    if (dwte && (rc = cu_tokens_checked(acc, fn, tokens, B, T, V)) != KILN_OK) return rc;
    if (ndout == 0) return KILN_OK;
    if (dwpe) CU_LAUNCH(acc, fn, kg_embedding_backward_pos(acc->stream, (int)dtype, dwpe, dout, B, T, C));
    if (dwte) {
        int32_t nb = 0;
        if ((rc = cu_emb_buckets(acc, fn, V, &nb)) != KILN_OK) return rc;
        const size_t bytes = (2 * (size_t)nb + 1 + n) * sizeof(int32_t);
        /* reserved for the most buckets n tokens can make (nb <= n), not
         * this batch's: the distinct tokens vary from batch to batch, and
         * growing with them would allocate in the steady-state step */
        const size_t most = (3 * n + 1) * sizeof(int32_t);
        if ((rc = cu_reserve(acc, &acc->emb_index_dev, &acc->emb_index_dev_bytes, most, fn)) != KILN_OK) return rc;
        if ((rc = cu_copy_in(acc, acc->emb_index_dev, acc->emb_index, bytes, KILN_COPY_H2D)) != KILN_OK)
            return rc;
        CU_LAUNCH(acc, fn, kg_embedding_backward_tok(acc->stream, (int)dtype, dwte, dout, acc->emb_index_dev, nb, C));
    }
    return KILN_OK;
}

/* ------------------------------------------------------------ layer norm */

int32_t cu_layernorm_forward(kiln_instance *acc, uint32_t dtype, void *y, void *mean, void *rstd, const void *x,
                             const void *w, const void *b, int32_t N, int32_t C, double eps, uint32_t round_dtype) {
    const char *fn = "layernorm_forward";
    int go = 0;
    int32_t rc = ack_ln_forward(CU_SINK(acc), fn, dtype, y, mean, rstd, x, w, b, N, C, eps, round_dtype, 1, &go);
    if (rc != KILN_OK || !go) return rc;
    CU_READY(acc, fn);
    /* F64 rounds nothing; 16-bit storage (1.7) rounds as it stores (round_dtype == dtype, checked) */
    CU_LAUNCH(acc, fn,
              kg_layernorm_forward(acc->stream, (int)dtype, y, mean, rstd, x, w, b, N, C, eps,
                                   dtype == KILN_DTYPE_F64 ? KG_F32 : (int)round_dtype));
    return KILN_OK;
}

/* 1.10: the residual add and the layer norm in one kernel (the add's sum
 * written to res and normalised from there), checked as both. */
int32_t cu_add_layernorm_forward(kiln_instance *acc, uint32_t dtype, void *res, const void *a, const void *b, void *y,
                                 void *mean, void *rstd, const void *w, const void *bias, int32_t N, int32_t C,
                                 double eps, uint32_t round_dtype) {
    const char *fn = "add_layernorm_forward";
    int go = 0;
    int32_t rc = ack_add_ln_forward(CU_SINK(acc), fn, dtype, res, a, b, y, mean, rstd, w, bias, N, C, eps, round_dtype,
                                    1, &go);
    if (rc != KILN_OK || !go) return rc;
    CU_READY(acc, fn);
    CU_LAUNCH(acc, fn,
              kg_add_layernorm_forward(acc->stream, (int)dtype, res, a, b, y, mean, rstd, w, bias, N, C, eps,
                                       dtype == KILN_DTYPE_F64 ? KG_F32 : (int)round_dtype));
    return KILN_OK;
}

/* Both layer norm backwards once checked: the column limit, the partials'
 * workspace, the launch (dx16 NULL: layernorm_backward's, else 1.11's with
 * the 16-bit copy of dx stored by the dx kernel). */
static int32_t cu_ln_backward_run(kiln_instance *acc, const char *fn, uint32_t dtype, void *dx, void *dw, void *db,
                                  const void *dy, const void *x, const void *w, const void *mean, const void *rstd,
                                  int32_t N, int32_t C, int32_t accumulate, void *dx16, uint32_t dx16_dtype) {
    if ((((size_t)C + 255) / 256) > 65535u)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: C=%d is above the %d columns one launch covers", fn, (int)C,
                      65535 * 256);
    CU_READY(acc, fn);
    const size_t work = kg_layernorm_backward_work_bytes(N, C, dw != NULL, db != NULL);
    int32_t rc;
    if (work && (rc = cu_reserve(acc, &acc->seq_work, &acc->seq_work_bytes, work, fn)) != KILN_OK) return rc;
    void *const ws = work ? acc->seq_work : NULL;
    if (dx16)
        CU_LAUNCH(acc, fn,
                  kg_layernorm_backward_cast(acc->stream, (int)dtype, dx, dw, db, dy, x, w, mean, rstd, N, C,
                                             accumulate != 0, ws, dx16, (int)dx16_dtype));
    else
        CU_LAUNCH(acc, fn,
                  kg_layernorm_backward(acc->stream, (int)dtype, dx, dw, db, dy, x, w, mean, rstd, N, C,
                                        accumulate != 0, ws));
    return KILN_OK;
}

int32_t cu_layernorm_backward(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy,
                              const void *x, const void *w, const void *mean, const void *rstd, int32_t N, int32_t C,
                              int32_t accumulate) {
    const char *fn = "layernorm_backward";
    int go = 0;
    int32_t rc = ack_ln_backward(CU_SINK(acc), fn, dtype, dx, dw, db, dy, x, w, mean, rstd, N, C, &go);
    if (rc != KILN_OK || !go) return rc;
    return cu_ln_backward_run(acc, fn, dtype, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, NULL, 0);
}

/* 1.11: the layer norm's backward with dx's 16-bit copy stored by the dx
 * kernel, checked as layernorm_backward and cast. */
int32_t cu_layernorm_backward_cast(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy,
                                   const void *x, const void *w, const void *mean, const void *rstd, int32_t N,
                                   int32_t C, int32_t accumulate, void *dx16, uint32_t dx16_dtype) {
    const char *fn = "layernorm_backward_cast";
    int go = 0;
    int32_t rc = ack_ln_backward_cast(CU_SINK(acc), fn, dtype, dx, dw, db, dy, x, w, mean, rstd, N, C, dx16,
                                      dx16_dtype, &go);
    if (rc != KILN_OK || !go) return rc;
    return cu_ln_backward_run(acc, fn, dtype, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, dx16, dx16_dtype);
}

/* ------------------------------------------------------------- attention */

/* The checks before either pass (accel_checks.h: sizes, round_dtype, the
 * element counts n[], indexed by ACK_QKV, ACK_OUT, ACK_LSE), the rowwise
 * kernel's limit on T, then the NULL checks of the nbuf buffers. */
static int32_t cu_attn_args(kiln_instance *acc, const char *fn, uint32_t dtype, int32_t B, int32_t T, int32_t C,
                            int32_t NH, uint32_t round_dtype, int nbuf, const char *const names[],
                            const void *const bufs[], const int kinds[], size_t n[3]) {
    int32_t rc = ack_attn_args(CU_SINK(acc), fn, dtype, B, T, C, NH, round_dtype, "for", n);
    if (rc != KILN_OK) return rc;
    const int max_t = kg_attention_max_T((int)dtype);
    if (acc->attn_path == CU_ATTN_ROWWISE && T > max_t)
        return CU_ERR(acc, KILN_E_UNSUPPORTED,
                      "cuda: %s: T=%d is above the %d positions the rowwise kernel holds for %s (attention = \"gemm\" "
                      "has no such limit)",
                      fn, (int)T, max_t, kiln_dtype_name(dtype));
    return ack_attn_need(CU_SINK(acc), fn, nbuf, names, bufs, kinds, n);
}

/* Whether this call takes the flash path: configured, and the call is one
 * it runs (float32 data rounded to 16 bits, a head size it has, its shared
 * memory within the device's). Otherwise the gemm path runs, which the log
 * says once per instance. */
static int cu_attn_flash(kiln_instance *acc, uint32_t dtype, int32_t C, int32_t NH, uint32_t round_dtype) {
    if (acc->attn_path != CU_ATTN_FLASH) return 0;
    /* 16-bit storage (1.7) is the same mixed-precision call: float32
     * arithmetic, outputs rounded to dtype (== round_dtype, checked) */
    const int s16 = cu_is16(dtype);
    const int D = C / NH, rd = dtype == KILN_DTYPE_F32 || s16 ? (int)round_dtype : KG_F32;
    const int runs_it = kg_flash_supported(s16 ? KG_F32 : (int)dtype, rd, D);
    if (runs_it && kg_flash_smem_bytes(D) <= acc->smem_optin) return 1;
    if (!acc->flash_noted) {
        acc->flash_noted = 1;
        if (runs_it)
            kiln_logf(acc->svc, acc->hctx, KILN_LOG_INFO,
                      "cuda: attention = \"flash\": head size %d needs %zu bytes of shared memory per block, the "
                      "device allows %zu; using the gemm path",
                      D, kg_flash_smem_bytes(D), acc->smem_optin);
        else
            kiln_logf(acc->svc, acc->hctx, KILN_LOG_INFO,
                      "cuda: attention = \"flash\" runs float32 data with 16-bit outputs (a 16-bit mixed "
                      "precision, or 16-bit storage) and head sizes 16, 32, 64, 128; this call is %s%s with head "
                      "size %d: using the gemm path",
                      kiln_dtype_name(dtype),
                      s16 ? " storage" : rd == KG_BF16 ? " rounded to bf16" : rd == KG_F16 ? " rounded to f16" : "",
                      D);
    }
    return 0;
}

/* The gemm path: per chunk of batch elements, every head at once through
 * cuBLASLt strided batches, with the scores (and in the backward their
 * gradient) materialised in attn_ws. Forward: S = scale Q K^T, the causal
 * softmax (lse kept), O = P V. Backward: S again, P from lse, dV = P^T dO,
 * dP = dO V^T, dS = P (dP - Delta), dQ = scale dS K, dK = scale dS^T Q. The
 * products' operands are 16-bit (tensor cores, fp32 accumulation) when the
 * call rounds its output to a 16-bit format, as a mixed-precision step's
 * attention would run; otherwise the data's dtype (fp32 on TF32 tensor
 * cores only with `tf32 = true`). */
typedef struct cu_attn_plan {
    uint32_t fdt, op;       /* data (arithmetic) and operand dtypes */
    uint32_t sdt;           /* storage of qkv, out, dout, dqkv: fdt, or
                               1.7's 16 bits beside float32 arithmetic */
    size_t esz, osz, ssz;   /* element sizes of fdt, op and sdt */
    int B, T, C, NH, D, nb; /* nb: batch elements per chunk */
    double scale;           /* 1/sqrt(D), in float32 for float32 data */
    int rd;                 /* the outputs' rounding (KG_F32: none) */
    size_t hd, tt;          /* strides of one head's (T, D) and (T, T) in the
                               head-major buffers: T * D and T * T rounded up
                               to 128 elements, so every head's matrix starts
                               256-byte aligned in any dtype (cuBLASLt's
                               fast algorithms need it for each batch) */
} cu_attn_plan;

/* Bytes one batch element needs, forward or backward, each buffer rounded
 * up to 256 bytes as carved. */
static size_t cu_attn_bytes(const cu_attn_plan *p, int nb, int backward) {
    const size_t bh = (size_t)nb * (size_t)p->NH;
    const size_t ops = cu_up256(bh * p->hd * p->osz), scores = cu_up256(bh * p->tt * p->esz);
    const size_t probs = cu_up256(bh * p->tt * p->osz), outs = cu_up256(bh * p->hd * p->esz);
    if (!backward) return 3 * ops + scores + probs + outs;
    return 4 * ops + 2 * scores + probs + 3 * outs + cu_up256(bh * (size_t)p->T * sizeof(double));
}

static int32_t cu_attn_plan_make(kiln_instance *acc, const char *fn, uint32_t dtype, int32_t B, int32_t T, int32_t C,
                                 int32_t NH, uint32_t round_dtype, int backward, cu_attn_plan *p) {
    /* 16-bit storage: float32 data whose outputs round to it, the operands
     * already in it (the split copies them) */
    const int s16 = cu_is16(dtype);
    p->fdt = s16 ? KILN_DTYPE_F32 : dtype;
    p->sdt = dtype;
    p->op = (p->fdt == KILN_DTYPE_F32 && cu_is16(round_dtype)) ? round_dtype : dtype;
    p->esz = kiln_dtype_size(p->fdt), p->osz = kiln_dtype_size(p->op), p->ssz = kiln_dtype_size(dtype);
    p->B = B, p->T = T, p->C = C, p->NH = NH, p->D = C / NH;
    const double scale = 1.0 / sqrt((double)p->D);
    p->scale = p->fdt == KILN_DTYPE_F32 ? (double)(float)scale : scale;
    p->rd = p->fdt == KILN_DTYPE_F32 ? (int)round_dtype : KG_F32;
    p->hd = ((size_t)T * (size_t)p->D + 127) & ~(size_t)127, p->tt = ((size_t)T * (size_t)T + 127) & ~(size_t)127;
    int nb = B;
    while (nb > 1 && cu_attn_bytes(p, nb, backward) > acc->attn_cap) nb = (nb + 1) / 2;
    p->nb = nb;
    return cu_reserve(acc, &acc->attn_ws, &acc->attn_ws_bytes, cu_attn_bytes(p, nb, backward), fn);
}

/* The next carve of `bytes` (256-aligned) from *at. */
static void *cu_carve(char **at, size_t bytes) {
    void *p = *at;
    *at += cu_up256(bytes);
    return p;
}

/* One chunk of batch elements: [b0, b0 + nb), bh = nb * NH head
 * matrices, its q, k and v (head-major operands of the plan's dtype,
 * carved first from attn_ws), and `at`, where the next carve starts. */
typedef struct cu_attn_chunk {
    int b0, nb, bh;
    void *q, *k, *v;
    char *at;
} cu_attn_chunk;

/* The chunk from b0, its q, k and v filled out of qkv(B, T, 3C). */
static int32_t cu_attn_chunk_qkv(kiln_instance *acc, const char *fn, const cu_attn_plan *p, const void *qkv, int b0,
                                 cu_attn_chunk *c) {
    c->b0 = b0;
    c->nb = p->B - b0 < p->nb ? p->B - b0 : p->nb;
    c->bh = c->nb * p->NH;
    c->at = acc->attn_ws;
    const size_t bytes = (size_t)c->bh * p->hd * p->osz;
    void **ops[3] = {&c->q, &c->k, &c->v};
    for (int i = 0; i < 3; i++) *ops[i] = cu_carve(&c->at, bytes);
    const size_t row1 = (size_t)p->C * p->ssz;
    const char *src = (const char *)qkv + (size_t)b0 * (size_t)p->T * 3 * row1;
    for (int i = 0; i < 3; i++)
        CU_LAUNCH(acc, fn, kg_heads_split(acc->stream, (int)p->sdt, src + (size_t)i * row1, 3 * p->C, c->nb, p->T,
                                          p->NH, p->D, *ops[i], p->hd, (int)p->op));
    return KILN_OK;
}

#define CU_BATCHED(acc, fn, ta, tb, M, N, K, alpha, A, at, lda, sa, Bm, bt, ldb, sb, Cm, ct, ldc, sc, n)                  do {                                                                                                               int32_t rc_ = cu_matmul_strided(acc, fn, ta, tb, M, N, K, alpha, A, at, lda, sa, Bm, bt, ldb, sb, 0.0, Cm, ct,                                         ldc, sc, n);                                                                   if (rc_ != KILN_OK) return rc_;                                                                            } while (0)

/* The buffers of a pass: forward writes out and lse; backward reads dout,
 * out and lse and writes dqkv. */
typedef struct cu_attn_io {
    void *out, *lse, *dqkv;
    const void *qkv, *dout, *fout, *flse;
} cu_attn_io;

/* Forward over one chunk: S = scale Q K^T, the causal softmax (P, lse),
 * O = P V, O merged into out. */
static int32_t cu_attn_gemm_fwd_chunk(kiln_instance *acc, const char *fn, const cu_attn_plan *p, cu_attn_chunk *c,
                                      const cu_attn_io *io) {
    const uint32_t dtype = p->fdt;
    const int fdt = (int)dtype, op = (int)p->op, T = p->T, C = p->C, NH = p->NH, D = p->D, nb = c->nb, bh = c->bh;
    void *S = cu_carve(&c->at, (size_t)bh * p->tt * p->esz);
    void *P = cu_carve(&c->at, (size_t)bh * p->tt * p->osz), *O = cu_carve(&c->at, (size_t)bh * p->hd * p->esz);
    CU_BATCHED(acc, fn, 0, 1, T, T, D, p->scale, c->q, p->op, D, (int64_t)p->hd, c->k, p->op, D, (int64_t)p->hd, S,
               dtype, T, (int64_t)p->tt, bh);
    void *l = (char *)io->lse + (size_t)c->b0 * (size_t)NH * (size_t)T * p->esz;
    CU_LAUNCH(acc, fn, kg_attn_softmax(acc->stream, fdt, S, T, (size_t)bh * (size_t)T, p->tt, l, P, op));
    CU_BATCHED(acc, fn, 0, 0, T, D, T, 1.0, P, p->op, T, (int64_t)p->tt, c->v, p->op, D, (int64_t)p->hd, O, dtype, D,
               (int64_t)p->hd, bh);
    char *dst = (char *)io->out + (size_t)c->b0 * (size_t)T * (size_t)C * p->ssz;
    CU_LAUNCH(acc, fn, kg_heads_merge(acc->stream, (int)p->sdt, dst, C, nb, T, NH, D, O, p->hd, p->rd));
    return KILN_OK;
}

/* Backward over one chunk: S again, P from lse, dV = P^T dO, dP = dO V^T,
 * dS = P (dP - Delta), dQ = scale dS K, dK = scale dS^T Q, merged into dqkv. */
static int32_t cu_attn_gemm_bwd_chunk(kiln_instance *acc, const char *fn, const cu_attn_plan *p, cu_attn_chunk *c,
                                      const cu_attn_io *io) {
    const uint32_t dtype = p->fdt;
    const int fdt = (int)dtype, op = (int)p->op, T = p->T, C = p->C, NH = p->NH, D = p->D, nb = c->nb, bh = c->bh;
    const double scale = p->scale;
    const size_t rows = (size_t)bh * (size_t)T;
    void *dO = cu_carve(&c->at, (size_t)bh * p->hd * p->osz);
    void *S = cu_carve(&c->at, (size_t)bh * p->tt * p->esz), *dP = cu_carve(&c->at, (size_t)bh * p->tt * p->esz);
    void *P = cu_carve(&c->at, (size_t)bh * p->tt * p->osz);
    void *dQ = cu_carve(&c->at, (size_t)bh * p->hd * p->esz), *dK = cu_carve(&c->at, (size_t)bh * p->hd * p->esz);
    void *dV = cu_carve(&c->at, (size_t)bh * p->hd * p->esz);
    double *delta = cu_carve(&c->at, rows * sizeof(double));
    const size_t row3 = 3 * (size_t)C * p->ssz, row1 = (size_t)C * p->ssz;
    const int sdt = (int)p->sdt;
    const char *go = (const char *)io->dout + (size_t)c->b0 * (size_t)T * row1;
    const char *fo = (const char *)io->fout + (size_t)c->b0 * (size_t)T * row1;
    const void *l = (const char *)io->flse + (size_t)c->b0 * (size_t)NH * (size_t)T * p->esz;
    CU_LAUNCH(acc, fn, kg_heads_split(acc->stream, sdt, go, C, nb, T, NH, D, dO, p->hd, op));
    CU_LAUNCH(acc, fn, kg_attn_delta(acc->stream, sdt, go, fo, nb, T, C, NH, delta));
    CU_BATCHED(acc, fn, 0, 1, T, T, D, scale, c->q, p->op, D, (int64_t)p->hd, c->k, p->op, D, (int64_t)p->hd, S, dtype,
               T, (int64_t)p->tt, bh);
    CU_LAUNCH(acc, fn, kg_attn_probs(acc->stream, fdt, S, l, T, rows, p->tt, P, op));
    /* dV = P^T dO, dP = dO V^T; then P's buffer takes dS (stream order:
     * after dV has read P) */
    CU_BATCHED(acc, fn, 1, 0, T, D, T, 1.0, P, p->op, T, (int64_t)p->tt, dO, p->op, D, (int64_t)p->hd, dV, dtype, D,
               (int64_t)p->hd, bh);
    CU_BATCHED(acc, fn, 0, 1, T, T, D, 1.0, dO, p->op, D, (int64_t)p->hd, c->v, p->op, D, (int64_t)p->hd, dP, dtype, T,
               (int64_t)p->tt, bh);
    CU_LAUNCH(acc, fn, kg_attn_dscores(acc->stream, fdt, S, dP, l, delta, T, rows, p->tt, P, op));
    CU_BATCHED(acc, fn, 0, 0, T, D, T, scale, P, p->op, T, (int64_t)p->tt, c->k, p->op, D, (int64_t)p->hd, dQ, dtype,
               D, (int64_t)p->hd, bh);
    CU_BATCHED(acc, fn, 1, 0, T, D, T, scale, P, p->op, T, (int64_t)p->tt, c->q, p->op, D, (int64_t)p->hd, dK, dtype,
               D, (int64_t)p->hd, bh);
    char *dst = (char *)io->dqkv + (size_t)c->b0 * (size_t)T * row3;
    CU_LAUNCH(acc, fn, kg_heads_merge(acc->stream, sdt, dst, 3 * C, nb, T, NH, D, dQ, p->hd, p->rd));
    CU_LAUNCH(acc, fn, kg_heads_merge(acc->stream, sdt, dst + row1, 3 * C, nb, T, NH, D, dK, p->hd, p->rd));
    CU_LAUNCH(acc, fn, kg_heads_merge(acc->stream, sdt, dst + 2 * row1, 3 * C, nb, T, NH, D, dV, p->hd, p->rd));
    return KILN_OK;
}

/* The gemm path of either pass: the plan (how many batch elements a chunk
 * holds in attn_ws), then chunk by chunk: q, k, v split, the pass. */
static int32_t cu_attn_gemm(kiln_instance *acc, const char *fn, int backward, uint32_t dtype, const cu_attn_io *io,
                            int32_t B, int32_t T, int32_t C, int32_t NH, uint32_t round_dtype) {
    cu_attn_plan p;
    int32_t rc = cu_attn_plan_make(acc, fn, dtype, B, T, C, NH, round_dtype, backward, &p);
    for (int b0 = 0; rc == KILN_OK && b0 < B; b0 += p.nb) {
        cu_attn_chunk c;
        if ((rc = cu_attn_chunk_qkv(acc, fn, &p, io->qkv, b0, &c)) != KILN_OK) break;
        rc = backward ? cu_attn_gemm_bwd_chunk(acc, fn, &p, &c, io) : cu_attn_gemm_fwd_chunk(acc, fn, &p, &c, io);
    }
    return rc;
}

int32_t cu_attention_forward(kiln_instance *acc, uint32_t dtype, void *out, void *lse, const void *qkv, int32_t B,
                             int32_t T, int32_t C, int32_t NH, uint32_t round_dtype) {
    const char *fn = "attention_forward";
    static const char *const names[3] = {"out", "lse", "qkv"};
    static const int kinds[3] = {ACK_OUT, ACK_LSE, ACK_QKV};
    const void *const bufs[3] = {out, lse, qkv};
    size_t n[3];
    int32_t rc = cu_attn_args(acc, fn, dtype, B, T, C, NH, round_dtype, 3, names, bufs, kinds, n);
    if (rc != KILN_OK) return rc;
    /* bytes: the activations in dtype's storage, lse in float32 beside 16 bits (1.7) */
    const size_t b_qkv = n[ACK_QKV] * ack_attn_esz(dtype, ACK_QKV), b_out = n[ACK_OUT] * ack_attn_esz(dtype, ACK_OUT);
    const size_t b_lse = n[ACK_LSE] * ack_attn_esz(dtype, ACK_LSE);
    if (ack_overlap(out, b_out, qkv, b_qkv) || ack_overlap(lse, b_lse, qkv, b_qkv) ||
        ack_overlap(lse, b_lse, out, b_out))
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: out, lse and qkv must not overlap (B=%d T=%d C=%d NH=%d, %s)",
                      fn, (int)B, (int)T, (int)C, (int)NH, kiln_dtype_name(dtype));
    CU_READY(acc, fn);
    if (cu_attn_flash(acc, dtype, C, NH, round_dtype)) {
        CU_LAUNCH(acc, fn,
                  kg_flash_forward(acc->stream, out, lse, qkv, B, T, C, NH, (int)round_dtype,
                                   cu_is16(dtype) ? (int)dtype : KG_F32));
        return KILN_OK;
    }
    if (acc->attn_path != CU_ATTN_ROWWISE) {
        const cu_attn_io io = {.out = out, .lse = lse, .qkv = qkv};
        return cu_attn_gemm(acc, fn, 0, dtype, &io, B, T, C, NH, round_dtype);
    }
    CU_LAUNCH(acc, fn,
              kg_attention_forward(acc->stream, (int)dtype, out, lse, qkv, B, T, C, NH,
                                   dtype == KILN_DTYPE_F64 ? KG_F32 : (int)round_dtype));
    return KILN_OK;
}

int32_t cu_attention_backward(kiln_instance *acc, uint32_t dtype, void *dqkv, const void *dout, const void *qkv,
                              const void *out, const void *lse, int32_t B, int32_t T, int32_t C, int32_t NH,
                              uint32_t round_dtype) {
    const char *fn = "attention_backward";
    static const char *const names[5] = {"dqkv", "dout", "qkv", "out", "lse"};
    static const int kinds[5] = {ACK_QKV, ACK_OUT, ACK_QKV, ACK_OUT, ACK_LSE};
    const void *const bufs[5] = {dqkv, dout, qkv, out, lse};
    size_t n[3];
    int32_t rc = cu_attn_args(acc, fn, dtype, B, T, C, NH, round_dtype, 5, names, bufs, kinds, n);
    if (rc != KILN_OK) return rc;
    const size_t n_lse = n[ACK_LSE];
    const size_t b_qkv = n[ACK_QKV] * ack_attn_esz(dtype, ACK_QKV), b_out = n[ACK_OUT] * ack_attn_esz(dtype, ACK_OUT);
    const size_t b_lse = n_lse * ack_attn_esz(dtype, ACK_LSE);
    if (ack_overlap(dqkv, b_qkv, dout, b_out) || ack_overlap(dqkv, b_qkv, qkv, b_qkv) ||
        ack_overlap(dqkv, b_qkv, out, b_out) || ack_overlap(dqkv, b_qkv, lse, b_lse))
        return CU_ERR(acc, KILN_E_INVALID_ARG,
                      "cuda: %s: dqkv must not overlap dout, qkv, out or lse (B=%d T=%d C=%d NH=%d, %s)", fn, (int)B,
                      (int)T, (int)C, (int)NH, kiln_dtype_name(dtype));
    CU_READY(acc, fn);
    const int flash = cu_attn_flash(acc, dtype, C, NH, round_dtype);
    if (!flash && acc->attn_path != CU_ATTN_ROWWISE) {
        const cu_attn_io io = {.dqkv = dqkv, .qkv = qkv, .dout = dout, .fout = out, .flse = lse};
        return cu_attn_gemm(acc, fn, 1, dtype, &io, B, T, C, NH, round_dtype);
    }
    if ((rc = cu_reserve(acc, &acc->seq_work, &acc->seq_work_bytes, n_lse * sizeof(double), fn)) != KILN_OK)
        return rc;
    if (flash) {
        CU_LAUNCH(acc, fn,
                  kg_flash_backward(acc->stream, dqkv, dout, qkv, out, lse, B, T, C, NH, (int)round_dtype,
                                    cu_is16(dtype) ? (int)dtype : KG_F32, acc->seq_work));
        return KILN_OK;
    }
    CU_LAUNCH(acc, fn,
              kg_attention_backward(acc->stream, (int)dtype, dqkv, dout, qkv, out, lse, B, T, C, NH,
                                    dtype == KILN_DTYPE_F64 ? KG_F32 : (int)round_dtype, acc->seq_work));
    return KILN_OK;
}

/* --------------------------------------------------- fused cross-entropy */

int32_t cu_xent_fused(kiln_instance *acc, uint32_t dtype, void *logits, const int32_t *targets, int32_t N, int32_t V,
                      int32_t Vp, double grad_scale, double *loss_sum) {
    const char *fn = "xent_fused";
    size_t nl = 0;
    int32_t rc = ack_xent(CU_SINK(acc), fn, dtype, logits, targets, N, V, Vp, loss_sum, &nl);
    if (rc != KILN_OK) return rc;
    if (N == 0) {
        *loss_sum = 0.0;
        return KILN_OK;
    }
    CU_READY(acc, fn);
    /* scratch: row losses (N doubles), then the sum and the bad row */
    const size_t lb = cu_up256((size_t)N * sizeof(double));
    if ((rc = cu_reserve(acc, &acc->seq_rows, &acc->seq_rows_bytes, lb + 256, fn)) != KILN_OK) return rc;
    double *row_loss = acc->seq_rows, *sum = (double *)((char *)acc->seq_rows + lb);
    int32_t *bad = (int32_t *)(sum + 1);
    CU_CHECK(acc, fn, cudaMemsetAsync(bad, 0xff, sizeof *bad, acc->stream)); /* -1 */
    CU_LAUNCH(acc, fn, kg_xent_fused(acc->stream, (int)dtype, logits, targets, N, V, Vp, grad_scale, row_loss, bad, sum));
    CU_CHECK(acc, fn, cudaMemcpyAsync(acc->host_scalars + 4, sum, 2 * sizeof(double), cudaMemcpyDeviceToHost,
                                      acc->stream));
    CU_CHECK(acc, fn, cu_wait(acc));
    int32_t bad_row;
    memcpy(&bad_row, acc->host_scalars + 5, sizeof bad_row);
    if (bad_row >= 0) {
        int32_t t = 0;
        CU_CHECK(acc, fn, cudaMemcpy(&t, targets + bad_row, sizeof t, cudaMemcpyDeviceToHost));
        return ack_bad_target(CU_SINK(acc), fn, t, bad_row, V);
    }
    *loss_sum = acc->host_scalars[4];
    return KILN_OK;
}

/* ------------------------------------------------------------------- add */

int32_t cu_add(kiln_instance *acc, uint32_t dtype, void *y, const void *a, const void *b, size_t n) {
    const char *fn = "add";
    int go = 0;
    int32_t rc = ack_add(CU_SINK(acc), fn, dtype, y, a, b, n, &go);
    if (rc != KILN_OK || !go) return rc;
    CU_READY(acc, fn);
    CU_LAUNCH(acc, fn, kg_add(acc->stream, (int)dtype, y, a, b, n));
    return KILN_OK;
}
