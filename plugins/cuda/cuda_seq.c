/*
 * cuda_seq.c — the cuda accelerator's ABI 1.4 sequence entries: embedding
 * forward and backward, layer norm forward and backward, causal attention
 * forward and backward, the fused cross-entropy and add, over the kernels
 * of kernels/cuda (kg_seq.cu, kg_attn.cu). Each entry first checks what the
 * cpu accelerator checks, with the same messages (dtype, sizes, NULL
 * buffers, round_dtype, forbidden overlaps: KILN_E_INVALID_ARG), so a
 * module that runs on one runs on the other.
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
 * kg_attn.cu's one-warp-per-row kernels (no T x T buffers, CUDA cores).
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* *out = a * b * c elements, refused when their bytes in float64 would
 * not fit in a size_t (so every later `elements * size` is exact). */
static int32_t cu_seq_elems(kiln_instance *acc, const char *fn, size_t a, size_t b, size_t c, size_t *out) {
    size_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc) || abc > SIZE_MAX / 8)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: %zu x %zu x %zu elements is larger than the address space",
                      fn, a, b, c);
    *out = abc;
    return KILN_OK;
}

/* Overlap of two device ranges, either of which may be absent. */
static int cu_seq_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    if (!a || !b || !a_bytes || !b_bytes) return 0;
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + b_bytes && y < x + a_bytes;
}

#define CU_NO_OVERLAP(acc, fn, p, pbytes, q, qbytes)                                                          \
    do {                                                                                                      \
        if (cu_seq_overlap(p, pbytes, q, qbytes))                                                             \
            return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: " #p " overlaps " #q, fn);                       \
    } while (0)

/* round_dtype as the cpu takes it: float32 is "none"; the 16-bit formats
 * round float32 data; float64 data accepts float64 (none) too. */
static int32_t cu_seq_round_ok(kiln_instance *acc, const char *fn, uint32_t dt, uint32_t rd) {
    if (rd == KILN_DTYPE_F32 || (dt == KILN_DTYPE_F32 && cu_is16(rd)) ||
        (dt == KILN_DTYPE_F64 && rd == KILN_DTYPE_F64))
        return KILN_OK;
    return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: round_dtype must be %s for dtype %s, got %s (%u)", fn,
                  dt == KILN_DTYPE_F32 ? "float32 (none), float16 or bfloat16" : "float32 (none) or float64",
                  kiln_dtype_name(dt), kiln_dtype_name(rd), (unsigned)rd);
}

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
    CU_CHECK(acc, fn, cudaStreamSynchronize(acc->stream));
    for (size_t i = 0; i < n; i++)
        if (acc->tok_host[i] < 0 || acc->tok_host[i] >= V)
            return CU_ERR(acc, KILN_E_DATA,
                          "cuda: %s: token %d at index %zu (batch %zu, position %zu) is outside [0, %d) (vocabulary "
                          "size V=%d)",
                          fn, (int)acc->tok_host[i], i, i / (size_t)T, i % (size_t)T, (int)V, (int)V);
    acc->tok_dev = tokens, acc->tok_n = n, acc->tok_V = V;
    return KILN_OK;
}

/* ------------------------------------------------------------- embedding */

int32_t cu_embedding_forward(kiln_instance *acc, uint32_t dtype, void *out, const int32_t *tokens, const void *wte,
                             const void *wpe, int32_t B, int32_t T, int32_t C, int32_t V) {
    const char *fn = "embedding_forward";
    int32_t rc = cu_check_fdt(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (B < 0 || T < 0 || C < 0 || V < 0)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: B, T, C, V must be >= 0, got %d, %d, %d, %d", fn, (int)B,
                      (int)T, (int)C, (int)V);
    size_t nout = 0, nwte = 0, nwpe = 0;
    if ((rc = cu_seq_elems(acc, fn, (size_t)B, (size_t)T, (size_t)C, &nout)) != KILN_OK ||
        (rc = cu_seq_elems(acc, fn, (size_t)V, (size_t)C, 1, &nwte)) != KILN_OK ||
        (rc = cu_seq_elems(acc, fn, (size_t)T, (size_t)C, 1, &nwpe)) != KILN_OK)
        return rc;
    const size_t n = (size_t)B * (size_t)T, esz = kiln_dtype_size(dtype);
    CU_NEED(acc, tokens, n, "embedding_forward");
    CU_NEED(acc, out, nout, "embedding_forward");
    CU_NEED(acc, wte, nout, "embedding_forward");
    if (n == 0) return KILN_OK;
    CU_NO_OVERLAP(acc, fn, out, nout * esz, wte, nwte * esz);
    CU_NO_OVERLAP(acc, fn, out, nout * esz, wpe, nwpe * esz);
    CU_NO_OVERLAP(acc, fn, out, nout * esz, tokens, n * sizeof *tokens);
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
    int32_t rc = cu_check_fdt(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (B < 0 || T < 0 || C < 0 || V < 0)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: B, T, C, V must be >= 0, got %d, %d, %d, %d", fn, (int)B,
                      (int)T, (int)C, (int)V);
    size_t ndout = 0, nwte = 0, nwpe = 0;
    if ((rc = cu_seq_elems(acc, fn, (size_t)B, (size_t)T, (size_t)C, &ndout)) != KILN_OK ||
        (rc = cu_seq_elems(acc, fn, (size_t)V, (size_t)C, 1, &nwte)) != KILN_OK ||
        (rc = cu_seq_elems(acc, fn, (size_t)T, (size_t)C, 1, &nwpe)) != KILN_OK)
        return rc;
    if (!dwte && !dwpe) return KILN_OK; /* both tables frozen */
    const size_t n = (size_t)B * (size_t)T, esz = kiln_dtype_size(dtype);
    CU_NEED(acc, dout, ndout, "embedding_backward");
    if (dwte) CU_NEED(acc, tokens, n, "embedding_backward");
    /* the bucket index is int32 */
    if (dwte && n > (size_t)INT32_MAX / 3)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: B*T = %zu positions is above %d", fn, n,
                      (int)(INT32_MAX / 3));
    if (n == 0) return KILN_OK;
    CU_NO_OVERLAP(acc, fn, dwte, nwte * esz, dout, ndout * esz);
    CU_NO_OVERLAP(acc, fn, dwpe, nwpe * esz, dout, ndout * esz);
    CU_NO_OVERLAP(acc, fn, dwte, nwte * esz, dwpe, nwpe * esz);
    if (tokens) {
        CU_NO_OVERLAP(acc, fn, dwte, nwte * esz, tokens, n * sizeof *tokens);
        CU_NO_OVERLAP(acc, fn, dwpe, nwpe * esz, tokens, n * sizeof *tokens);
    }
    CU_READY(acc, fn);
    if (dwte && (rc = cu_tokens_checked(acc, fn, tokens, B, T, V)) != KILN_OK) return rc;
    if (ndout == 0) return KILN_OK;
    if (dwpe) CU_LAUNCH(acc, fn, kg_embedding_backward_pos(acc->stream, (int)dtype, dwpe, dout, B, T, C));
    if (dwte) {
        int32_t nb = 0;
        if ((rc = cu_emb_buckets(acc, fn, V, &nb)) != KILN_OK) return rc;
        const size_t bytes = (2 * (size_t)nb + 1 + n) * sizeof(int32_t);
        if ((rc = cu_reserve(acc, &acc->emb_index_dev, &acc->emb_index_dev_bytes, bytes, fn)) != KILN_OK) return rc;
        if ((rc = cu_copy(acc, acc->emb_index_dev, acc->emb_index, bytes, KILN_COPY_H2D)) != KILN_OK) return rc;
        CU_LAUNCH(acc, fn, kg_embedding_backward_tok(acc->stream, (int)dtype, dwte, dout, acc->emb_index_dev, nb, C));
    }
    return KILN_OK;
}

/* ------------------------------------------------------------ layer norm */

/* The layer norm's sizes: N >= 0, C >= 1 (unless N = 0), and *nx = N * C. */
static int32_t cu_ln_elems(kiln_instance *acc, const char *fn, int32_t N, int32_t C, size_t *nx) {
    if (N < 0 || C < 0 || (N > 0 && C == 0))
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: N must be >= 0 and C >= 1, got N=%d C=%d", fn, (int)N,
                      (int)C);
    return cu_seq_elems(acc, fn, (size_t)N, (size_t)C, 1, nx);
}

int32_t cu_layernorm_forward(kiln_instance *acc, uint32_t dtype, void *y, void *mean, void *rstd, const void *x,
                             const void *w, const void *b, int32_t N, int32_t C, double eps, uint32_t round_dtype) {
    const char *fn = "layernorm_forward";
    int32_t rc = cu_check_fdt(acc, fn, dtype);
    if (rc != KILN_OK || (rc = cu_seq_round_ok(acc, fn, dtype, round_dtype)) != KILN_OK) return rc;
    if (!(eps >= 0.0)) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: eps must be >= 0, got %g", fn, eps);
    size_t nx = 0;
    if ((rc = cu_ln_elems(acc, fn, N, C, &nx)) != KILN_OK) return rc;
    if (nx == 0) return KILN_OK;
    CU_NEED(acc, y, nx, "layernorm_forward");
    CU_NEED(acc, x, nx, "layernorm_forward");
    CU_NEED(acc, mean, (size_t)N, "layernorm_forward");
    CU_NEED(acc, rstd, (size_t)N, "layernorm_forward");
    const size_t esz = kiln_dtype_size(dtype), xb = nx * esz, rb = (size_t)N * esz, cb = (size_t)C * esz;
    CU_NO_OVERLAP(acc, fn, y, xb, x, xb);
    CU_NO_OVERLAP(acc, fn, y, xb, w, cb);
    CU_NO_OVERLAP(acc, fn, y, xb, b, cb);
    CU_NO_OVERLAP(acc, fn, mean, rb, rstd, rb);
    CU_NO_OVERLAP(acc, fn, mean, rb, y, xb);
    CU_NO_OVERLAP(acc, fn, mean, rb, x, xb);
    CU_NO_OVERLAP(acc, fn, rstd, rb, y, xb);
    CU_NO_OVERLAP(acc, fn, rstd, rb, x, xb);
    CU_READY(acc, fn);
    CU_LAUNCH(acc, fn,
              kg_layernorm_forward(acc->stream, (int)dtype, y, mean, rstd, x, w, b, N, C, eps,
                                   dtype == KILN_DTYPE_F32 ? (int)round_dtype : KG_F32));
    return KILN_OK;
}

int32_t cu_layernorm_backward(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy,
                              const void *x, const void *w, const void *mean, const void *rstd, int32_t N, int32_t C,
                              int32_t accumulate) {
    const char *fn = "layernorm_backward";
    int32_t rc = cu_check_fdt(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    size_t nx = 0;
    if ((rc = cu_ln_elems(acc, fn, N, C, &nx)) != KILN_OK) return rc;
    if (nx == 0) return KILN_OK;
    CU_NEED(acc, dx, nx, "layernorm_backward");
    CU_NEED(acc, dy, nx, "layernorm_backward");
    CU_NEED(acc, x, nx, "layernorm_backward");
    CU_NEED(acc, mean, (size_t)N, "layernorm_backward");
    CU_NEED(acc, rstd, (size_t)N, "layernorm_backward");
    const size_t esz = kiln_dtype_size(dtype), xb = nx * esz, rb = (size_t)N * esz, cb = (size_t)C * esz;
    CU_NO_OVERLAP(acc, fn, dx, xb, dy, xb);
    CU_NO_OVERLAP(acc, fn, dx, xb, x, xb);
    CU_NO_OVERLAP(acc, fn, dx, xb, w, cb);
    CU_NO_OVERLAP(acc, fn, dx, xb, mean, rb);
    CU_NO_OVERLAP(acc, fn, dx, xb, rstd, rb);
    CU_NO_OVERLAP(acc, fn, dw, cb, db, cb);
    /* dw/db over an input would change what a later row reads */
    const void *ins[5] = {dy, x, w, mean, rstd};
    const size_t in_bytes[5] = {xb, xb, cb, rb, rb};
    static const char *const in_names[5] = {"dy", "x", "w", "mean", "rstd"};
    for (int o = 0; o < 2; o++) {
        const void *g = o == 0 ? dw : db;
        if (cu_seq_overlap(g, cb, dx, xb))
            return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: %s overlaps dx", fn, o == 0 ? "dw" : "db");
        for (int i = 0; i < 5; i++)
            if (cu_seq_overlap(g, cb, ins[i], in_bytes[i]))
                return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: %s overlaps the input %s", fn, o == 0 ? "dw" : "db",
                              in_names[i]);
    }
    if ((((size_t)C + 255) / 256) > 65535u)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: C=%d is above the %d columns one launch covers", fn, (int)C,
                      65535 * 256);
    CU_READY(acc, fn);
    const size_t work = kg_layernorm_backward_work_bytes(N, C, dw != NULL, db != NULL);
    if (work && (rc = cu_reserve(acc, &acc->seq_work, &acc->seq_work_bytes, work, fn)) != KILN_OK) return rc;
    CU_LAUNCH(acc, fn,
              kg_layernorm_backward(acc->stream, (int)dtype, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate != 0,
                                    work ? acc->seq_work : NULL));
    return KILN_OK;
}

/* ------------------------------------------------------------- attention */

/* Sizes, round_dtype and the element counts of qkv (B, T, 3C), out (B, T,
 * C) and lse (B, NH, T). */
static int32_t cu_attn_args(kiln_instance *acc, const char *fn, uint32_t dtype, int32_t B, int32_t T, int32_t C,
                            int32_t NH, uint32_t round_dtype, size_t *n_qkv, size_t *n_out, size_t *n_lse) {
    int32_t rc = cu_check_fdt(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: B, T, C and NH must be > 0, got B=%d T=%d C=%d NH=%d", fn,
                      (int)B, (int)T, (int)C, (int)NH);
    if (C % NH != 0)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: C=%d is not a multiple of NH=%d (head size C/NH)", fn,
                      (int)C, (int)NH);
    if (C > INT_MAX / 3)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: C=%d is too large (3C must fit in an int)", fn, (int)C);
    const size_t rows = (size_t)B * (size_t)T, elem = kiln_dtype_size(dtype);
    if (rows > SIZE_MAX / (3 * (size_t)C) / elem)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: B=%d T=%d C=%d is larger than the address space", fn,
                      (int)B, (int)T, (int)C);
    if ((rc = cu_seq_round_ok(acc, fn, dtype, round_dtype)) != KILN_OK) return rc;
    const int max_t = kg_attention_max_T((int)dtype);
    if (acc->attn_rowwise && T > max_t)
        return CU_ERR(acc, KILN_E_UNSUPPORTED,
                      "cuda: %s: T=%d is above the %d positions the rowwise kernel holds for %s (attention = \"gemm\" "
                      "has no such limit)",
                      fn, (int)T, max_t, kiln_dtype_name(dtype));
    *n_qkv = rows * 3 * (size_t)C;
    *n_out = rows * (size_t)C;
    *n_lse = rows * (size_t)NH;
    return KILN_OK;
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
    uint32_t fdt, op;       /* data and operand dtypes */
    size_t esz, osz;
    int B, T, C, NH, D, nb; /* nb: batch elements per chunk */
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
    p->fdt = dtype;
    p->op = dtype == KILN_DTYPE_F32 && cu_is16(round_dtype) ? round_dtype : dtype;
    p->esz = kiln_dtype_size(dtype), p->osz = kiln_dtype_size(p->op);
    p->B = B, p->T = T, p->C = C, p->NH = NH, p->D = C / NH;
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

/* q, k and v of batch elements [b0, b0 + nb) out of qkv(B, T, 3C) into
 * head-major operands of the plan's dtype. */
static int32_t cu_attn_split_qkv(kiln_instance *acc, const char *fn, const cu_attn_plan *p, const void *qkv, int b0,
                                 int nb, void *q, void *k, void *v) {
    const size_t row1 = (size_t)p->C * p->esz;
    const char *src = (const char *)qkv + (size_t)b0 * (size_t)p->T * 3 * row1;
    void *dst[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        CU_LAUNCH(acc, fn, kg_heads_split(acc->stream, (int)p->fdt, src + (size_t)i * row1, 3 * p->C, nb, p->T, p->NH,
                                          p->D, dst[i], p->hd, (int)p->op));
    return KILN_OK;
}

#define CU_BATCHED(acc, fn, ta, tb, M, N, K, alpha, A, at, lda, sa, Bm, bt, ldb, sb, Cm, ct, ldc, sc, n)                  do {                                                                                                               int32_t rc_ = cu_matmul_strided(acc, fn, ta, tb, M, N, K, alpha, A, at, lda, sa, Bm, bt, ldb, sb, 0.0, Cm, ct,                                         ldc, sc, n);                                                                   if (rc_ != KILN_OK) return rc_;                                                                            } while (0)

static int32_t cu_attn_gemm_forward(kiln_instance *acc, uint32_t dtype, void *out, void *lse, const void *qkv,
                                    int32_t B, int32_t T, int32_t C, int32_t NH, uint32_t round_dtype) {
    const char *fn = "attention_forward";
    cu_attn_plan p;
    int32_t rc = cu_attn_plan_make(acc, fn, dtype, B, T, C, NH, round_dtype, 0, &p);
    if (rc != KILN_OK) return rc;
    const int fdt = (int)dtype, op = (int)p.op, D = p.D;
    const double scale = dtype == KILN_DTYPE_F32 ? (double)(float)(1.0 / sqrt((double)D)) : 1.0 / sqrt((double)D);
    const int rd = dtype == KILN_DTYPE_F32 ? (int)round_dtype : KG_F32;
    for (int b0 = 0; b0 < B; b0 += p.nb) {
        const int nb = B - b0 < p.nb ? B - b0 : p.nb, bh = nb * NH;
        char *at = acc->attn_ws;
        void *q = cu_carve(&at, (size_t)bh * p.hd * p.osz), *k = cu_carve(&at, (size_t)bh * p.hd * p.osz);
        void *v = cu_carve(&at, (size_t)bh * p.hd * p.osz), *S = cu_carve(&at, (size_t)bh * p.tt * p.esz);
        void *P = cu_carve(&at, (size_t)bh * p.tt * p.osz), *O = cu_carve(&at, (size_t)bh * p.hd * p.esz);
        if ((rc = cu_attn_split_qkv(acc, fn, &p, qkv, b0, nb, q, k, v)) != KILN_OK) return rc;
        CU_BATCHED(acc, fn, 0, 1, T, T, D, scale, q, p.op, D, (int64_t)p.hd, k, p.op, D, (int64_t)p.hd, S, dtype, T,
                   (int64_t)p.tt, bh);
        void *l = (char *)lse + (size_t)b0 * (size_t)NH * (size_t)T * p.esz;
        CU_LAUNCH(acc, fn, kg_attn_softmax(acc->stream, fdt, S, T, (size_t)bh * (size_t)T, p.tt, l, P, op));
        CU_BATCHED(acc, fn, 0, 0, T, D, T, 1.0, P, p.op, T, (int64_t)p.tt, v, p.op, D, (int64_t)p.hd, O, dtype, D,
                   (int64_t)p.hd, bh);
        char *dst = (char *)out + (size_t)b0 * (size_t)T * (size_t)C * p.esz;
        CU_LAUNCH(acc, fn, kg_heads_merge(acc->stream, fdt, dst, C, nb, T, NH, D, O, p.hd, rd));
    }
    return KILN_OK;
}

static int32_t cu_attn_gemm_backward(kiln_instance *acc, uint32_t dtype, void *dqkv, const void *dout,
                                     const void *qkv, const void *out, const void *lse, int32_t B, int32_t T,
                                     int32_t C, int32_t NH, uint32_t round_dtype) {
    const char *fn = "attention_backward";
    cu_attn_plan p;
    int32_t rc = cu_attn_plan_make(acc, fn, dtype, B, T, C, NH, round_dtype, 1, &p);
    if (rc != KILN_OK) return rc;
    const int fdt = (int)dtype, op = (int)p.op, D = p.D;
    const double scale = dtype == KILN_DTYPE_F32 ? (double)(float)(1.0 / sqrt((double)D)) : 1.0 / sqrt((double)D);
    const int rd = dtype == KILN_DTYPE_F32 ? (int)round_dtype : KG_F32;
    for (int b0 = 0; b0 < B; b0 += p.nb) {
        const int nb = B - b0 < p.nb ? B - b0 : p.nb, bh = nb * NH;
        const size_t rows = (size_t)bh * (size_t)T;
        char *at = acc->attn_ws;
        void *q = cu_carve(&at, (size_t)bh * p.hd * p.osz), *k = cu_carve(&at, (size_t)bh * p.hd * p.osz);
        void *v = cu_carve(&at, (size_t)bh * p.hd * p.osz), *dO = cu_carve(&at, (size_t)bh * p.hd * p.osz);
        void *S = cu_carve(&at, (size_t)bh * p.tt * p.esz), *dP = cu_carve(&at, (size_t)bh * p.tt * p.esz);
        void *P = cu_carve(&at, (size_t)bh * p.tt * p.osz);
        void *dQ = cu_carve(&at, (size_t)bh * p.hd * p.esz), *dK = cu_carve(&at, (size_t)bh * p.hd * p.esz);
        void *dV = cu_carve(&at, (size_t)bh * p.hd * p.esz);
        double *delta = cu_carve(&at, rows * sizeof(double));
        const size_t row3 = 3 * (size_t)C * p.esz, row1 = (size_t)C * p.esz;
        const char *go = (const char *)dout + (size_t)b0 * (size_t)T * row1;
        const char *fo = (const char *)out + (size_t)b0 * (size_t)T * row1;
        const void *l = (const char *)lse + (size_t)b0 * (size_t)NH * (size_t)T * p.esz;
        if ((rc = cu_attn_split_qkv(acc, fn, &p, qkv, b0, nb, q, k, v)) != KILN_OK) return rc;
        CU_LAUNCH(acc, fn, kg_heads_split(acc->stream, fdt, go, C, nb, T, NH, D, dO, p.hd, op));
        CU_LAUNCH(acc, fn, kg_attn_delta(acc->stream, fdt, go, fo, nb, T, C, NH, delta));
        CU_BATCHED(acc, fn, 0, 1, T, T, D, scale, q, p.op, D, (int64_t)p.hd, k, p.op, D, (int64_t)p.hd, S, dtype, T,
                   (int64_t)p.tt, bh);
        CU_LAUNCH(acc, fn, kg_attn_probs(acc->stream, fdt, S, l, T, rows, p.tt, P, op));
        /* dV = P^T dO, dP = dO V^T; then P's buffer takes dS (stream order:
         * after dV has read P) */
        CU_BATCHED(acc, fn, 1, 0, T, D, T, 1.0, P, p.op, T, (int64_t)p.tt, dO, p.op, D, (int64_t)p.hd, dV, dtype, D,
                   (int64_t)p.hd, bh);
        CU_BATCHED(acc, fn, 0, 1, T, T, D, 1.0, dO, p.op, D, (int64_t)p.hd, v, p.op, D, (int64_t)p.hd, dP, dtype, T,
                   (int64_t)p.tt, bh);
        CU_LAUNCH(acc, fn, kg_attn_dscores(acc->stream, fdt, S, dP, l, delta, T, rows, p.tt, P, op));
        CU_BATCHED(acc, fn, 0, 0, T, D, T, scale, P, p.op, T, (int64_t)p.tt, k, p.op, D, (int64_t)p.hd, dQ, dtype, D,
                   (int64_t)p.hd, bh);
        CU_BATCHED(acc, fn, 1, 0, T, D, T, scale, P, p.op, T, (int64_t)p.tt, q, p.op, D, (int64_t)p.hd, dK, dtype, D,
                   (int64_t)p.hd, bh);
        char *dst = (char *)dqkv + (size_t)b0 * (size_t)T * row3;
        CU_LAUNCH(acc, fn, kg_heads_merge(acc->stream, fdt, dst, 3 * C, nb, T, NH, D, dQ, p.hd, rd));
        CU_LAUNCH(acc, fn, kg_heads_merge(acc->stream, fdt, dst + row1, 3 * C, nb, T, NH, D, dK, p.hd, rd));
        CU_LAUNCH(acc, fn, kg_heads_merge(acc->stream, fdt, dst + 2 * row1, 3 * C, nb, T, NH, D, dV, p.hd, rd));
    }
    return KILN_OK;
}

int32_t cu_attention_forward(kiln_instance *acc, uint32_t dtype, void *out, void *lse, const void *qkv, int32_t B,
                             int32_t T, int32_t C, int32_t NH, uint32_t round_dtype) {
    const char *fn = "attention_forward";
    size_t n_qkv, n_out, n_lse;
    int32_t rc = cu_attn_args(acc, fn, dtype, B, T, C, NH, round_dtype, &n_qkv, &n_out, &n_lse);
    if (rc != KILN_OK) return rc;
    CU_NEED(acc, out, n_out, "attention_forward");
    CU_NEED(acc, lse, n_lse, "attention_forward");
    CU_NEED(acc, qkv, n_qkv, "attention_forward");
    const size_t e = kiln_dtype_size(dtype);
    if (cu_seq_overlap(out, n_out * e, qkv, n_qkv * e) || cu_seq_overlap(lse, n_lse * e, qkv, n_qkv * e) ||
        cu_seq_overlap(lse, n_lse * e, out, n_out * e))
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: out, lse and qkv must not overlap (B=%d T=%d C=%d NH=%d, %s)",
                      fn, (int)B, (int)T, (int)C, (int)NH, kiln_dtype_name(dtype));
    CU_READY(acc, fn);
    if (!acc->attn_rowwise) return cu_attn_gemm_forward(acc, dtype, out, lse, qkv, B, T, C, NH, round_dtype);
    CU_LAUNCH(acc, fn,
              kg_attention_forward(acc->stream, (int)dtype, out, lse, qkv, B, T, C, NH,
                                   dtype == KILN_DTYPE_F32 ? (int)round_dtype : KG_F32));
    return KILN_OK;
}

int32_t cu_attention_backward(kiln_instance *acc, uint32_t dtype, void *dqkv, const void *dout, const void *qkv,
                              const void *out, const void *lse, int32_t B, int32_t T, int32_t C, int32_t NH,
                              uint32_t round_dtype) {
    const char *fn = "attention_backward";
    size_t n_qkv, n_out, n_lse;
    int32_t rc = cu_attn_args(acc, fn, dtype, B, T, C, NH, round_dtype, &n_qkv, &n_out, &n_lse);
    if (rc != KILN_OK) return rc;
    CU_NEED(acc, dqkv, n_qkv, "attention_backward");
    CU_NEED(acc, dout, n_out, "attention_backward");
    CU_NEED(acc, qkv, n_qkv, "attention_backward");
    CU_NEED(acc, out, n_out, "attention_backward");
    CU_NEED(acc, lse, n_lse, "attention_backward");
    const size_t e = kiln_dtype_size(dtype);
    if (cu_seq_overlap(dqkv, n_qkv * e, dout, n_out * e) || cu_seq_overlap(dqkv, n_qkv * e, qkv, n_qkv * e) ||
        cu_seq_overlap(dqkv, n_qkv * e, out, n_out * e) || cu_seq_overlap(dqkv, n_qkv * e, lse, n_lse * e))
        return CU_ERR(acc, KILN_E_INVALID_ARG,
                      "cuda: %s: dqkv must not overlap dout, qkv, out or lse (B=%d T=%d C=%d NH=%d, %s)", fn, (int)B,
                      (int)T, (int)C, (int)NH, kiln_dtype_name(dtype));
    CU_READY(acc, fn);
    if (!acc->attn_rowwise)
        return cu_attn_gemm_backward(acc, dtype, dqkv, dout, qkv, out, lse, B, T, C, NH, round_dtype);
    if ((rc = cu_reserve(acc, &acc->seq_work, &acc->seq_work_bytes, n_lse * sizeof(double), fn)) != KILN_OK)
        return rc;
    CU_LAUNCH(acc, fn,
              kg_attention_backward(acc->stream, (int)dtype, dqkv, dout, qkv, out, lse, B, T, C, NH,
                                    dtype == KILN_DTYPE_F32 ? (int)round_dtype : KG_F32, acc->seq_work));
    return KILN_OK;
}

/* --------------------------------------------------- fused cross-entropy */

int32_t cu_xent_fused(kiln_instance *acc, uint32_t dtype, void *logits, const int32_t *targets, int32_t N, int32_t V,
                      int32_t Vp, double grad_scale, double *loss_sum) {
    const char *fn = "xent_fused";
    int32_t rc = cu_check_fdt(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (N < 0 || V < 1 || Vp < V)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: need N >= 0, V >= 1 and Vp >= V, got N=%d V=%d Vp=%d", fn,
                      (int)N, (int)V, (int)Vp);
    if (!loss_sum) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: loss_sum is NULL", fn);
    size_t nl = 0;
    if ((rc = cu_seq_elems(acc, fn, (size_t)N, (size_t)Vp, 1, &nl)) != KILN_OK) return rc;
    CU_NEED(acc, logits, nl, "xent_fused");
    CU_NEED(acc, targets, (size_t)N, "xent_fused");
    const size_t esz = kiln_dtype_size(dtype);
    CU_NO_OVERLAP(acc, fn, logits, nl * esz, targets, (size_t)N * sizeof *targets);
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
    CU_CHECK(acc, fn, cudaStreamSynchronize(acc->stream));
    int32_t bad_row;
    memcpy(&bad_row, acc->host_scalars + 5, sizeof bad_row);
    if (bad_row >= 0) {
        int32_t t = 0;
        CU_CHECK(acc, fn, cudaMemcpy(&t, targets + bad_row, sizeof t, cudaMemcpyDeviceToHost));
        return CU_ERR(acc, KILN_E_DATA, "cuda: %s: target %d at row %d is outside [-1, %d) (-1 ignores the row; V=%d)",
                      fn, (int)t, (int)bad_row, (int)V, (int)V);
    }
    *loss_sum = acc->host_scalars[4];
    return KILN_OK;
}

/* ------------------------------------------------------------------- add */

int32_t cu_add(kiln_instance *acc, uint32_t dtype, void *y, const void *a, const void *b, size_t n) {
    const char *fn = "add";
    int32_t rc = cu_check_fdt(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (n > SIZE_MAX / 8)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: n=%zu elements is larger than the address space", fn, n);
    CU_NEED(acc, y, n, "add");
    CU_NEED(acc, a, n, "add");
    CU_NEED(acc, b, n, "add");
    if (n == 0) return KILN_OK;
    const size_t nb = n * kiln_dtype_size(dtype);
    if (y != a && cu_seq_overlap(y, nb, a, nb))
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: y partially overlaps a (only y == a may alias)", fn);
    if (y != b && cu_seq_overlap(y, nb, b, nb))
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: y partially overlaps b (only y == b may alias)", fn);
    CU_READY(acc, fn);
    CU_LAUNCH(acc, fn, kg_add(acc->stream, (int)dtype, y, a, b, n));
    return KILN_OK;
}
