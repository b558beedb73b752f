/*
 * cpu_accel_seq.c — the cpu accelerator's ABI 1.4 sequence entries
 * (embedding forward/backward, layer norm forward/backward, the fused
 * cross-entropy, add, causal attention forward/backward): thin wrappers over
 * the kc_* kernels of kernels/cpu/cpu_seq.h and cpu_attn.h. As in cpu_accel.c, the wrappers do what the
 * kernels leave out, with the checks the cuda plugin makes too
 * (../common/accel_checks.h): a dtype other than float32/float64, a negative size, a
 * NULL buffer that would be touched, a size past the address space or a
 * forbidden overlap is KILN_E_INVALID_ARG naming the entry; a token or a
 * target outside its range is KILN_E_DATA naming the index, the value and
 * the valid range, found by a scan before anything is written (the kernels
 * would index out of bounds). The two backward passes that need scratch (the
 * embedding's counting sort, the layer norm's dw/db partials) take it from
 * the instance's grow-only workspace. 1.7's 16-bit activation storage
 * (the layer norms, add and attention with dtype float16/bfloat16) widens
 * the 16-bit inputs into the instance's second buffer, runs the float32
 * kernel and rounds the 16-bit outputs into place. Compiled against the
 * frozen 1.2 and 1.3 headers for the test fixtures too, where the body is
 * left out.
 */
#include "cpu_accel.h"

#if KILN_ABI_MINOR >= 4

#include <math.h>

#include "cpu_attn.h"
#include "cpu_kernels.h"
#include "cpu_seq.h"

/* ------------------------------------------------------------- embedding */

int32_t cpu_embedding_forward(kiln_instance *acc, uint32_t dtype, void *out, const int32_t *tokens, const void *wte,
                              const void *wpe, int32_t B, int32_t T, int32_t C, int32_t V) {
    const char *fn = "embedding_forward";
    const ack_sink s = CPU_SINK(acc);
    size_t nout = 0;
    int go = 0;
    int32_t rc = ack_emb_forward(s, fn, dtype, out, tokens, wte, wpe, B, T, C, V, &nout, &go);
    if (rc != KILN_OK || !go) return rc;
    /* every token is checked even when C = 0 leaves nothing to write */
    if ((rc = ack_tokens_in_range(s, fn, tokens, B, T, V)) != KILN_OK || nout == 0) return rc;
    if (dtype == KILN_DTYPE_F32) kc_embedding_forward(out, tokens, wte, wpe, B, T, C);
    else kc_embedding_forward_f64(out, tokens, wte, wpe, B, T, C);
    return KILN_OK;
}

int32_t cpu_embedding_backward(kiln_instance *acc, uint32_t dtype, void *dwte, void *dwpe, const void *dout,
                               const int32_t *tokens, int32_t B, int32_t T, int32_t C, int32_t V) {
    const char *fn = "embedding_backward";
    const ack_sink s = CPU_SINK(acc);
    size_t ndout = 0;
    int go = 0;
    /* the sort's offsets are int32 */
    int32_t rc = ack_emb_backward(s, fn, dtype, dwte, dwpe, dout, tokens, B, T, C, V, (size_t)INT32_MAX, &ndout, &go);
    if (rc != KILN_OK || !go) return rc;
    if (dwte && (rc = ack_tokens_in_range(s, fn, tokens, B, T, V)) != KILN_OK) return rc;
    if (ndout == 0) return KILN_OK;
    const size_t ws = kc_embedding_backward_workspace(B, T, V, dwte != NULL);
    if (ws && (rc = cpu_reserve_workspace(acc, ws)) != KILN_OK) return rc;
    if (dtype == KILN_DTYPE_F32) kc_embedding_backward(dwte, dwpe, dout, tokens, B, T, C, V, acc->ws);
    else kc_embedding_backward_f64(dwte, dwpe, dout, tokens, B, T, C, V, acc->ws);
    return KILN_OK;
}

/* ------------------------------------------------------------ layer norm */

int32_t cpu_layernorm_forward(kiln_instance *acc, uint32_t dtype, void *y, void *mean, void *rstd, const void *x,
                              const void *w, const void *b, int32_t N, int32_t C, double eps, uint32_t round_dtype) {
    int go = 0;
    int32_t rc = ack_ln_forward(CPU_SINK(acc), "layernorm_forward", dtype, y, mean, rstd, x, w, b, N, C, eps,
                                round_dtype, 0, &go);
    if (rc != KILN_OK || !go) return rc;
#if KILN_ABI_MINOR >= 7
    if (ack_act16(dtype)) { /* y 16-bit: computed rounded in float32, then stored (exact) */
        const size_t n = (size_t)N * (size_t)C;
        if ((rc = cpu_reserve_stage(acc, n)) != KILN_OK) return rc;
        kc_layernorm_forward(acc->stage, mean, rstd, x, w, b, N, C, eps, (int)dtype);
        kc_cast(y, (int)dtype, acc->stage, KC_F32, n);
        return KILN_OK;
    }
#endif
    const int r16 = round_dtype == KILN_DTYPE_F16 || round_dtype == KILN_DTYPE_BF16;
    if (dtype == KILN_DTYPE_F32)
        kc_layernorm_forward(y, mean, rstd, x, w, b, N, C, eps, r16 ? (int)round_dtype : KC_F32);
    else
        kc_layernorm_forward_f64(y, mean, rstd, x, w, b, N, C, eps);
    return KILN_OK;
}

int32_t cpu_layernorm_backward(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy,
                               const void *x, const void *w, const void *mean, const void *rstd, int32_t N, int32_t C,
                               int32_t accumulate) {
    int go = 0;
    int32_t rc = ack_ln_backward(CPU_SINK(acc), "layernorm_backward", dtype, dx, dw, db, dy, x, w, mean, rstd, N, C,
                                 &go);
    if (rc != KILN_OK || !go) return rc;
    const size_t ws = kc_layernorm_backward_workspace(N, C, dw != NULL, db != NULL);
    if (ws && (rc = cpu_reserve_workspace(acc, ws)) != KILN_OK) return rc;
#if KILN_ABI_MINOR >= 7
    if (ack_act16(dtype)) { /* dy 16-bit, widened; everything else float32 */
        const size_t n = (size_t)N * (size_t)C;
        if ((rc = cpu_reserve_stage(acc, n)) != KILN_OK) return rc;
        kc_cast(acc->stage, KC_F32, dy, (int)dtype, n);
        kc_layernorm_backward(dx, dw, db, acc->stage, x, w, mean, rstd, N, C, accumulate != 0, acc->ws);
        return KILN_OK;
    }
#endif
    if (dtype == KILN_DTYPE_F32)
        kc_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate != 0, acc->ws);
    else
        kc_layernorm_backward_f64(dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate != 0, acc->ws);
    return KILN_OK;
}

/* --------------------------------------------------- fused cross-entropy */

int32_t cpu_xent_fused(kiln_instance *acc, uint32_t dtype, void *logits, const int32_t *targets, int32_t N, int32_t V,
                       int32_t Vp, double grad_scale, double *loss_sum) {
    const char *fn = "xent_fused";
    const ack_sink s = CPU_SINK(acc);
    size_t nl = 0;
    int32_t rc = ack_xent(s, fn, dtype, logits, targets, N, V, Vp, loss_sum, &nl);
    if (rc != KILN_OK) return rc;
    /* the loss lands in host memory here, so it must not be in the logits */
    if ((rc = ack_apart(s, fn, "logits", logits, nl * kiln_dtype_size(dtype), "loss_sum", loss_sum,
                        sizeof *loss_sum)) != KILN_OK)
        return rc;
    for (int32_t i = 0; i < N; i++)
        if (targets[i] < -1 || targets[i] >= V) return ack_bad_target(s, fn, targets[i], i, V);
    if (dtype == KILN_DTYPE_F16 || dtype == KILN_DTYPE_BF16) { /* 1.6: widened into the workspace */
        if ((rc = cpu_reserve_workspace(acc, nl * sizeof(float))) != KILN_OK) return rc;
        *loss_sum = kc_xent_fused_16((int)dtype, logits, targets, N, V, Vp, grad_scale, acc->ws);
        return KILN_OK;
    }
    *loss_sum = dtype == KILN_DTYPE_F32 ? kc_xent_fused(logits, targets, N, V, Vp, grad_scale)
                                        : kc_xent_fused_f64(logits, targets, N, V, Vp, grad_scale);
    return KILN_OK;
}

/* ------------------------------------------------------------------- add */

int32_t cpu_add(kiln_instance *acc, uint32_t dtype, void *y, const void *a, const void *b, size_t n) {
    int go = 0;
    int32_t rc = ack_add(CPU_SINK(acc), "add", dtype, y, a, b, n, &go);
    if (rc != KILN_OK || !go) return rc;
#if KILN_ABI_MINOR >= 7
    if (ack_act16(dtype)) { /* y, a float32; b 16-bit, widened */
        if ((rc = cpu_reserve_stage(acc, n)) != KILN_OK) return rc;
        kc_cast(acc->stage, KC_F32, b, (int)dtype, n);
        kc_add(y, a, acc->stage, n);
        return KILN_OK;
    }
#endif
    if (dtype == KILN_DTYPE_F32) kc_add(y, a, b, n);
    else kc_add_f64(y, a, b, n);
    return KILN_OK;
}

#if KILN_ABI_MINOR >= 10
/* 1.10: the two entries in a row, after the checks of both (so nothing is
 * written when either would refuse). On the cpu nothing is saved by fusing
 * them; the composition gives their bits by construction. */
int32_t cpu_add_layernorm_forward(kiln_instance *acc, uint32_t dtype, void *res, const void *a, const void *b, void *y,
                                  void *mean, void *rstd, const void *w, const void *bias, int32_t N, int32_t C,
                                  double eps, uint32_t round_dtype) {
    int go = 0;
    int32_t rc = ack_add_ln_forward(CPU_SINK(acc), "add_layernorm_forward", dtype, res, a, b, y, mean, rstd, w, bias,
                                    N, C, eps, round_dtype, 0, &go);
    if (rc != KILN_OK || !go) return rc;
    rc = cpu_add(acc, dtype, res, a, b, (size_t)N * (size_t)C);
    return rc != KILN_OK ? rc : cpu_layernorm_forward(acc, dtype, y, mean, rstd, res, w, bias, N, C, eps, round_dtype);
}
#endif

#if KILN_ABI_MINOR >= 11
/* 1.11: layernorm_backward, then dx's 16-bit copy (kc_cast, as the cast
 * entry), after the checks of both. */
int32_t cpu_layernorm_backward_cast(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy,
                                    const void *x, const void *w, const void *mean, const void *rstd, int32_t N,
                                    int32_t C, int32_t accumulate, void *dx16, uint32_t dx16_dtype) {
    int go = 0;
    int32_t rc = ack_ln_backward_cast(CPU_SINK(acc), "layernorm_backward_cast", dtype, dx, dw, db, dy, x, w, mean, rstd,
                                      N, C, dx16, dx16_dtype, &go);
    if (rc != KILN_OK || !go) return rc;
    rc = cpu_layernorm_backward(acc, dtype, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate);
    if (rc == KILN_OK) kc_cast(dx16, (int)dx16_dtype, dx, KC_F32, (size_t)N * (size_t)C);
    return rc;
}
#endif

/* ------------------------------------------------------------- attention */

/* attention_forward, attention_backward: the checks (accel_checks.h), the
 * instance workspace reserved for the kernels' per-thread query-tile
 * scratch, then the kc_attn_* kernels of kernels/cpu/cpu_attn.c. */

/* A kernel's refusal after the checks passed is a bug here, not the caller's. */
static int32_t cpu_attn_ran(kiln_instance *acc, const char *fn, int k, size_t need) {
    if (k == 0) return KILN_OK;
    return CPU_ERR(acc, KILN_E_INTERNAL, "%s: the kernel refused a call the checks accepted (workspace %zu of %zu)", fn,
                   acc->ws_bytes, need);
}

int32_t cpu_attention_forward(kiln_instance *acc, uint32_t dtype, void *out, void *lse, const void *qkv, int32_t B,
                              int32_t T, int32_t C, int32_t NH, uint32_t round_dtype) {
    static const char fn[] = "attention_forward";
    static const char *const names[3] = {"out", "lse", "qkv"};
    static const int kinds[3] = {ACK_OUT, ACK_LSE, ACK_QKV};
    const void *const bufs[3] = {out, lse, qkv};
    size_t n[3];
    /* the cpu words round_dtype's message "with dtype" */
    int32_t rc = ack_attn_args(CPU_SINK(acc), fn, dtype, B, T, C, NH, round_dtype, "with", n);
    if (rc != KILN_OK || (rc = ack_attn_need(CPU_SINK(acc), fn, 3, names, bufs, kinds, n)) != KILN_OK) return rc;
    /* 16-bit storage (1.7) runs the float32 kernel: its workspace is float32's */
    const size_t need = kc_attn_workspace_bytes_for(0, ack_msz(dtype), B, T, NH);
    const size_t ea = ack_attn_esz(dtype, ACK_QKV), el = ack_attn_esz(dtype, ACK_LSE), n_qkv = n[ACK_QKV],
                 n_out = n[ACK_OUT], n_lse = n[ACK_LSE];
    if (ack_ranges_overlap(out, n_out * ea, qkv, n_qkv * ea) ||
        ack_ranges_overlap(lse, n_lse * el, qkv, n_qkv * ea) ||
        ack_ranges_overlap(lse, n_lse * el, out, n_out * ea))
        return CPU_ERR(acc, KILN_E_INVALID_ARG,
                       "%s: out, lse and qkv must not overlap (B=%d T=%d C=%d NH=%d, %s)", fn, (int)B, (int)T, (int)C,
                       (int)NH, kiln_dtype_name(dtype));
    if ((rc = cpu_reserve_workspace(acc, need)) != KILN_OK) return rc;
#if KILN_ABI_MINOR >= 7
    if (ack_act16(dtype)) { /* qkv, out 16-bit: staged float32 copies; lse float32 */
        if ((rc = cpu_reserve_stage(acc, n_qkv + n_out)) != KILN_OK) return rc;
        float *q32 = acc->stage, *o32 = acc->stage + n_qkv;
        kc_cast(q32, KC_F32, qkv, (int)dtype, n_qkv);
        rc = cpu_attn_ran(acc, fn, kc_attn_forward(o32, lse, q32, B, T, C, NH, (int)dtype, acc->ws, acc->ws_bytes),
                          need);
        if (rc == KILN_OK) kc_cast(out, (int)dtype, o32, KC_F32, n_out);
        return rc;
    }
#endif
    return cpu_attn_ran(acc, fn,
                        dtype == KILN_DTYPE_F32
                            ? kc_attn_forward(out, lse, qkv, B, T, C, NH, (int)round_dtype, acc->ws, acc->ws_bytes)
                            : kc_attn_forward_f64(out, lse, qkv, B, T, C, NH, acc->ws, acc->ws_bytes),
                        need);
}

int32_t cpu_attention_backward(kiln_instance *acc, uint32_t dtype, void *dqkv, const void *dout, const void *qkv,
                               const void *out, const void *lse, int32_t B, int32_t T, int32_t C, int32_t NH,
                               uint32_t round_dtype) {
    static const char fn[] = "attention_backward";
    static const char *const names[5] = {"dqkv", "dout", "qkv", "out", "lse"};
    static const int kinds[5] = {ACK_QKV, ACK_OUT, ACK_QKV, ACK_OUT, ACK_LSE};
    const void *const bufs[5] = {dqkv, dout, qkv, out, lse};
    size_t n[3];
    int32_t rc = ack_attn_args(CPU_SINK(acc), fn, dtype, B, T, C, NH, round_dtype, "with", n);
    if (rc != KILN_OK || (rc = ack_attn_need(CPU_SINK(acc), fn, 5, names, bufs, kinds, n)) != KILN_OK) return rc;
    const size_t need = kc_attn_workspace_bytes_for(1, ack_msz(dtype), B, T, NH);
    /* dqkv over any input would change what a later query tile reads */
    const size_t dq_bytes = n[ACK_QKV] * ack_attn_esz(dtype, ACK_QKV);
    const char *hit = NULL;
    for (int i = 1; i < 5 && !hit; i++)
        if (ack_ranges_overlap(dqkv, dq_bytes, bufs[i], n[kinds[i]] * ack_attn_esz(dtype, kinds[i]))) hit = names[i];
    if (hit)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: dqkv overlaps %s (B=%d T=%d C=%d NH=%d, %s)", fn, hit, (int)B,
                       (int)T, (int)C, (int)NH, kiln_dtype_name(dtype));
    if ((rc = cpu_reserve_workspace(acc, need)) != KILN_OK) return rc;
#if KILN_ABI_MINOR >= 7
    if (ack_act16(dtype)) { /* dqkv, dout, qkv, out 16-bit: staged float32 copies; lse float32 */
        const size_t nq = n[ACK_QKV], no = n[ACK_OUT];
        if ((rc = cpu_reserve_stage(acc, 2 * nq + 2 * no)) != KILN_OK) return rc;
        float *dq32 = acc->stage, *q32 = dq32 + nq, *do32 = q32 + nq, *o32 = do32 + no;
        kc_cast(q32, KC_F32, qkv, (int)dtype, nq);
        kc_cast(do32, KC_F32, dout, (int)dtype, no);
        kc_cast(o32, KC_F32, out, (int)dtype, no);
        rc = cpu_attn_ran(acc, fn,
                          kc_attn_backward(dq32, do32, q32, o32, lse, B, T, C, NH, (int)dtype, acc->ws, acc->ws_bytes),
                          need);
        if (rc == KILN_OK) kc_cast(dqkv, (int)dtype, dq32, KC_F32, nq);
        return rc;
    }
#endif
    return cpu_attn_ran(acc, fn,
                        dtype == KILN_DTYPE_F32 ? kc_attn_backward(dqkv, dout, qkv, out, lse, B, T, C, NH,
                                                                   (int)round_dtype, acc->ws, acc->ws_bytes)
                                                : kc_attn_backward_f64(dqkv, dout, qkv, out, lse, B, T, C, NH,
                                                                       acc->ws, acc->ws_bytes),
                        need);
}
#endif /* KILN_ABI_MINOR >= 4 */
