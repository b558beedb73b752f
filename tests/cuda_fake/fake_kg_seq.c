/*
 * fake_kg_seq.c — the ABI 1.4 sequence launchers of kernels/cuda/kg_kernels.h
 * (embedding, layer norm, fused cross-entropy, add, attention), run on the
 * host for the fake CUDA build of the cuda accelerator plugin. Each does
 * what its CUDA counterpart does before launching (the same refusals with
 * cudaErrorInvalidValue, the same "nothing to do" cases, the attention
 * length limit), checks that every buffer it would touch is device memory
 * (the plugin's scratch carving and the embedding's uploaded bucket index
 * are what this catches) and that the outputs kg_kernels.h forbids to
 * overlap do not, drains the stream, and computes with the cpu kernels of
 * kernels/cpu, which define the results: kc_embedding_*, kc_layernorm_*,
 * kc_xent_fused row by row, kc_add, kc_attn_* (the flash path's launchers
 * are in fake_kg_flash_launch.c). Where kg_kernels.h states a
 * contract of its own — the bucket scatter in the index's order, a bad
 * target row left alone and the smallest one reported, the row losses'
 * block order — the fake follows it in plain loops.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_attn.h"
#include "cpu_kernels.h"
#include "cpu_seq.h"
#include "fake_internal.h"
#include "kg_kernels.h"

static int fake_seq_fdt(int dt) { return dt == KG_F32 || dt == KG_F64; }
static size_t fake_seq_esz(int dt) { return dt == KG_F64 ? sizeof(double) : sizeof(float); }
static int fake_seq_round_ok(int fdt, int rd) {
    return rd == KG_F32 || (fdt == KG_F32 && (rd == KG_F16 || rd == KG_BF16)) || (fdt == KG_F64 && rd == KG_F64);
}

/* ------------------------------------------------------------- embedding */

cudaError_t kg_embedding_forward(cudaStream_t s, int fdt, void *out, const int32_t *tokens, const void *wte,
                                 const void *wpe, int B, int T, int C) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_seq_fdt(fdt) || B < 0 || T < 0 || C < 0) return fake_error(cudaErrorInvalidValue);
    if (B == 0 || T == 0 || C == 0) return cudaSuccess;
    const size_t n = (size_t)B * (size_t)T, esz = fake_seq_esz(fdt), row = (size_t)C * esz;
    const fake_buf bufs[] = {{"out", out, n * row}, {"tokens", tokens, n * sizeof *tokens}, {"wpe", wpe, wpe ? (size_t)T * row : 0}};
    cudaError_t e = fake_launch(__func__, s, bufs, 3);
    if (e != cudaSuccess) return e;
    /* the table's size is not an argument: each row read must be device memory */
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0) {
            fake_violation("%s: token %d at %zu was not checked by the caller", __func__, (int)tokens[i], i);
            return fake_error(cudaErrorIllegalAddress);
        }
        if ((e = fake_need_device(__func__, "wte row", (const char *)wte + (size_t)tokens[i] * row, row)) != cudaSuccess)
            return e;
    }
    if (fake_overlap(__func__, "out", out, n * row, "tokens", tokens, n * sizeof *tokens)) return fake_error(cudaErrorInvalidValue);
    if (fdt == KG_F32) kc_embedding_forward(out, tokens, wte, wpe, B, T, C);
    else kc_embedding_forward_f64(out, tokens, wte, wpe, B, T, C);
    return cudaSuccess;
}

cudaError_t kg_embedding_backward_pos(cudaStream_t s, int fdt, void *dwpe, const void *dout, int B, int T, int C) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_seq_fdt(fdt) || B < 0 || T < 0 || C < 0) return fake_error(cudaErrorInvalidValue);
    if (B == 0 || T == 0 || C == 0) return cudaSuccess;
    const size_t esz = fake_seq_esz(fdt), tc = (size_t)T * (size_t)C;
    const fake_buf bufs[] = {{"dwpe", dwpe, tc * esz}, {"dout", dout, (size_t)B * tc * esz}};
    cudaError_t e = fake_launch(__func__, s, bufs, 2);
    if (e != cudaSuccess) return e;
    if (fake_overlap(__func__, "dwpe", dwpe, tc * esz, "dout", dout, (size_t)B * tc * esz)) return fake_error(cudaErrorInvalidValue);
    if (fdt == KG_F32) kc_embedding_backward(NULL, dwpe, dout, NULL, B, T, C, 0, NULL);
    else kc_embedding_backward_f64(NULL, dwpe, dout, NULL, B, T, C, 0, NULL);
    return cudaSuccess;
}

/* The bucket scatter in the index's order, as the kernel runs it. */
#define FAKE_EMB_TOK(TY)                                                                               \
    do {                                                                                               \
        TY *g = (TY *)dwte + (size_t)token[k] * (size_t)C;                                             \
        for (int32_t p = start[k]; p < start[k + 1]; p++) {                                            \
            const TY *d = (const TY *)dout + (size_t)order[p] * (size_t)C;                             \
            for (size_t j = 0; j < (size_t)C; j++) g[j] += d[j];                                       \
        }                                                                                              \
    } while (0)

cudaError_t kg_embedding_backward_tok(cudaStream_t s, int fdt, void *dwte, const void *dout, const int32_t *index,
                                      int nb, int C) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_seq_fdt(fdt) || nb < 0 || C < 0) return fake_error(cudaErrorInvalidValue);
    if (nb == 0 || C == 0) return cudaSuccess;
    const fake_buf head[] = {{"index (tokens and starts)", index, (2 * (size_t)nb + 1) * sizeof *index}};
    cudaError_t e = fake_launch(__func__, s, head, 1);
    if (e != cudaSuccess) return e;
    const int32_t *token = index, *start = index + nb, *order = start + nb + 1;
    const size_t n = (size_t)start[nb], row = (size_t)C * fake_seq_esz(fdt);
    if (start[0] != 0 || start[nb] < 0) {
        fake_violation("%s: bucket starts run from %d to %d, not from 0", __func__, (int)start[0], (int)start[nb]);
        return fake_error(cudaErrorIllegalAddress);
    }
    if ((e = fake_need_device(__func__, "index (order)", order, n * sizeof *order)) != cudaSuccess) return e;
    for (int k = 0; k < nb; k++) {
        if (start[k + 1] <= start[k] || token[k] < 0 || (k > 0 && token[k] <= token[k - 1])) {
            fake_violation("%s: bucket %d (token %d, positions %d..%d) is empty, negative or out of order", __func__,
                           k, (int)token[k], (int)start[k], (int)start[k + 1]);
            return fake_error(cudaErrorIllegalAddress);
        }
        if ((e = fake_need_device(__func__, "dwte row", (const char *)dwte + (size_t)token[k] * row, row)) != cudaSuccess)
            return e;
        for (int32_t p = start[k]; p < start[k + 1]; p++)
            if ((p > start[k] && order[p] <= order[p - 1]) || order[p] < 0 ||
                (e = fake_need_device(__func__, "dout row", (const char *)dout + (size_t)order[p] * row, row)) !=
                    cudaSuccess) {
                if (e == cudaSuccess) {
                    fake_violation("%s: bucket %d's positions are not increasing at %d", __func__, k, (int)p);
                    return fake_error(cudaErrorIllegalAddress);
                }
                return e;
            }
    }
    for (int k = 0; k < nb; k++) {
        if (fdt == KG_F32) FAKE_EMB_TOK(float);
        else FAKE_EMB_TOK(double);
    }
    return cudaSuccess;
}

/* ------------------------------------------------------------ layer norm */

/* The layer norm's arithmetic once its launch is checked: the cpu kernel,
 * a 16-bit y computed in float32 and rounded as it is stored. */
static cudaError_t fake_ln_math(int fdt, void *y, void *mean, void *rstd, const void *x, const void *w, const void *b,
                                int N, int C, double eps, int round_dtype) {
    if (fake_act16(fdt)) {
        float *y32 = malloc((size_t)N * (size_t)C * sizeof *y32);
        if (!y32) return fake_error(cudaErrorMemoryAllocation);
        kc_layernorm_forward(y32, mean, rstd, x, w, b, N, C, eps, KC_F32);
        fake_store16(fdt, y, y32, (size_t)N * (size_t)C);
        free(y32);
    } else if (fdt == KG_F32)
        kc_layernorm_forward(y, mean, rstd, x, w, b, N, C, eps, round_dtype == KG_F32 ? KC_F32 : round_dtype);
    else
        kc_layernorm_forward_f64(y, mean, rstd, x, w, b, N, C, eps);
    return cudaSuccess;
}

cudaError_t kg_layernorm_forward(cudaStream_t s, int fdt, void *y, void *mean, void *rstd, const void *x,
                                 const void *w, const void *b, int N, int C, double eps, int round_dtype) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int y16 = fake_act16(fdt); /* 1.7: y in 16 bits, round_dtype fdt */
    if ((!fake_seq_fdt(fdt) && !y16) || N < 0 || C < 0 ||
        (y16 ? round_dtype != fdt : !fake_seq_round_ok(fdt, round_dtype)))
        return fake_error(cudaErrorInvalidValue);
    if (N == 0 || C == 0) return cudaSuccess;
    const size_t esz = y16 ? sizeof(float) : fake_seq_esz(fdt), xb = (size_t)N * (size_t)C * esz, rb = (size_t)N * esz,
                 cb = (size_t)C * esz, yb = y16 ? (size_t)N * (size_t)C * 2 : xb;
    const fake_buf bufs[] = {{"y", y, yb}, {"mean", mean, rb}, {"rstd", rstd, rb}, {"x", x, xb},
                             {"w", w, w ? cb : 0}, {"b", b, b ? cb : 0}};
    cudaError_t e = fake_launch(__func__, s, bufs, 6);
    if (e != cudaSuccess) return e;
    if (fake_overlap(__func__, "y", y, yb, "x", x, xb) || fake_overlap(__func__, "mean", mean, rb, "rstd", rstd, rb))
        return fake_error(cudaErrorInvalidValue);
    return fake_ln_math(fdt, y, mean, rstd, x, w, b, N, C, eps, round_dtype);
}

cudaError_t kg_layernorm_backward(cudaStream_t s, int fdt, void *dx, void *dw, void *db, const void *dy,
                                  const void *x, const void *w, const void *mean, const void *rstd, int N, int C,
                                  int accumulate, void *work) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int d16 = fake_act16(fdt); /* 1.7: dy in 16 bits */
    if ((!fake_seq_fdt(fdt) && !d16) || N < 0 || C < 0) return fake_error(cudaErrorInvalidValue);
    if (N == 0 || C == 0) return cudaSuccess;
    if ((dw || db) && !work) return fake_error(cudaErrorInvalidValue);
    const size_t esz = d16 ? sizeof(float) : fake_seq_esz(fdt), xb = (size_t)N * (size_t)C * esz, rb = (size_t)N * esz,
                 cb = (size_t)C * esz, wb = kg_layernorm_backward_work_bytes(N, C, dw != NULL, db != NULL);
    const size_t dyb = d16 ? (size_t)N * (size_t)C * 2 : xb;
    const fake_buf bufs[] = {{"dx", dx, xb},         {"dw", dw, dw ? cb : 0},     {"db", db, db ? cb : 0},
                             {"dy", dy, dyb},         {"x", x, xb},                {"w", w, w ? cb : 0},
                             {"mean/rstd", mean, rb}, {"work", work, wb}};
    cudaError_t e = fake_launch(__func__, s, bufs, 8);
    if (e == cudaSuccess) e = fake_need_device(__func__, "rstd", rstd, rb);
    if (e != cudaSuccess) return e;
    if (fake_overlap(__func__, "dx", dx, xb, "dy", dy, dyb) || fake_overlap(__func__, "work", work, wb, "dx", dx, xb))
        return fake_error(cudaErrorInvalidValue);
    if (d16) {
        float *dy32 = fake_widen16(fdt, dy, (size_t)N * (size_t)C);
        if (!dy32) return fake_error(cudaErrorMemoryAllocation);
        kc_layernorm_backward(dx, dw, db, dy32, x, w, mean, rstd, N, C, accumulate != 0, work);
        free(dy32);
    } else if (fdt == KG_F32) kc_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate != 0, work);
    else kc_layernorm_backward_f64(dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate != 0, work);
    return cudaSuccess;
}

/* 1.11: the same launch, with dx16 among its buffers, and the copy as
 * kg_cast makes it. */
cudaError_t kg_layernorm_backward_cast(cudaStream_t s, int fdt, void *dx, void *dw, void *db, const void *dy,
                                       const void *x, const void *w, const void *mean, const void *rstd, int N, int C,
                                       int accumulate, void *work, void *dx16, int dx16_fdt) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if ((fdt != KG_F32 && !fake_act16(fdt)) || (dx16_fdt != KG_F16 && dx16_fdt != KG_BF16) || N < 0 || C < 0)
        return fake_error(cudaErrorInvalidValue);
    if (N == 0 || C == 0) return cudaSuccess;
    if (!dx16) return fake_error(cudaErrorInvalidValue);
    const size_t n = (size_t)N * (size_t)C, xb = n * sizeof(float);
    /* the copy's checks, then layernorm_backward's launch as the one kernel */
    cudaError_t e = fake_need_device(__func__, "dx16", dx16, n * 2);
    if (e != cudaSuccess) return e;
    const void *others[6] = {dx, dy, x, w, mean, rstd};
    static const char *const names[6] = {"dx", "dy", "x", "w", "mean", "rstd"};
    const size_t ob[6] = {xb, fake_act16(fdt) ? n * 2 : xb, xb, w ? (size_t)C * 4 : 0, (size_t)N * 4, (size_t)N * 4};
    for (int i = 0; i < 6; i++)
        if (fake_overlap(__func__, "dx16", dx16, n * 2, names[i], others[i], ob[i]))
            return fake_error(cudaErrorInvalidValue);
    if ((e = kg_layernorm_backward(s, fdt, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, work)) != cudaSuccess)
        return e;
    return kc_cast(dx16, dx16_fdt, dx, KC_F32, n) != 0 ? fake_error(cudaErrorInvalidValue) : cudaSuccess;
}

/* --------------------------------------------------- fused cross-entropy */

cudaError_t kg_xent_fused(cudaStream_t s, int fdt, void *logits, const int32_t *targets, int N, int V, int Vp,
                          double grad_scale, double *row_loss, int32_t *bad_row, double *loss_sum) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int is16 = fdt == KG_F16 || fdt == KG_BF16; /* 1.6: 16-bit logits */
    if (!(fake_seq_fdt(fdt) || is16) || N < 0 || V < 1 || Vp < V) return fake_error(cudaErrorInvalidValue);
    const size_t esz = is16 ? 2 : fake_seq_esz(fdt), lb = (size_t)N * (size_t)Vp * esz;
    const fake_buf bufs[] = {{"logits", logits, lb},
                             {"targets", targets, (size_t)N * sizeof *targets},
                             {"row_loss", row_loss, (size_t)N * sizeof *row_loss},
                             {"bad_row", bad_row, N ? sizeof *bad_row : 0},
                             {"loss_sum", loss_sum, sizeof *loss_sum}};
    cudaError_t e = fake_launch(__func__, s, bufs, 5);
    if (e != cudaSuccess) return e;
    if (fake_overlap(__func__, "logits", logits, lb, "row_loss", row_loss, (size_t)N * sizeof *row_loss))
        return fake_error(cudaErrorInvalidValue);
    float *row32 = is16 ? malloc((size_t)Vp * sizeof *row32) : NULL; /* kc_xent_fused_16's widened row */
    if (is16 && !row32) return fake_error(cudaErrorMemoryAllocation);
    for (int i = 0; i < N; i++) {
        const int32_t t = targets[i];
        if (t < -1 || t >= V) {
            if (*bad_row < 0 || i < *bad_row) *bad_row = i;
            row_loss[i] = 0.0;
            continue;
        }
        void *row = (char *)logits + (size_t)i * (size_t)Vp * esz;
        row_loss[i] = is16            ? kc_xent_fused_16(fdt, row, &targets[i], 1, V, Vp, grad_scale, row32)
                      : fdt == KG_F32 ? kc_xent_fused(row, &targets[i], 1, V, Vp, grad_scale)
                                      : kc_xent_fused_f64(row, &targets[i], 1, V, Vp, grad_scale);
    }
    free(row32);
    const size_t rpb = km_xent_rows_per_block((size_t)N);
    double total = 0.0;
    for (size_t r0 = 0; r0 < (size_t)N; r0 += rpb) {
        double part = 0.0;
        for (size_t i = r0; i < r0 + rpb && i < (size_t)N; i++) part += row_loss[i];
        total += part;
    }
    *loss_sum = total;
    return cudaSuccess;
}

/* ------------------------------------------------------------------- add */

/* The residual add's arithmetic once its launch is checked: b widened
 * from 16 bits where it is stored so, then the cpu kernel. */
static cudaError_t fake_add_math(int fdt, void *y, const void *a, const void *b, size_t n) {
    if (fake_act16(fdt)) {
        float *b32 = fake_widen16(fdt, b, n);
        if (!b32) return fake_error(cudaErrorMemoryAllocation);
        kc_add(y, a, b32, n);
        free(b32);
    } else if (fdt == KG_F32) kc_add(y, a, b, n);
    else kc_add_f64(y, a, b, n);
    return cudaSuccess;
}

cudaError_t kg_add(cudaStream_t s, int fdt, void *y, const void *a, const void *b, size_t n) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int b16 = fake_act16(fdt); /* 1.7: b in 16 bits, y and a float32 */
    if (!fake_seq_fdt(fdt) && !b16) return fake_error(cudaErrorInvalidValue);
    if (n == 0) return cudaSuccess;
    const size_t nb = n * (b16 ? sizeof(float) : fake_seq_esz(fdt)), nbb = b16 ? n * 2 : nb;
    const fake_buf bufs[] = {{"y", y, nb}, {"a", a, nb}, {"b", b, nbb}};
    cudaError_t e = fake_launch(__func__, s, bufs, 3);
    if (e != cudaSuccess) return e;
    if ((y != a && fake_overlap(__func__, "y", y, nb, "a", a, nb)) ||
        ((b16 || y != b) && fake_overlap(__func__, "y", y, nb, "b", b, nbb)))
        return fake_error(cudaErrorInvalidValue);
    return fake_add_math(fdt, y, a, b, n);
}

/* ABI 1.10's fused residual add and layer norm: one launch whose buffers
 * are both entries', the outputs y, mean and rstd apart from every input
 * (res, a, rb), res apart from a unless it is a; then the two entries'
 * arithmetic in a row, as the kernel does it in one pass. */
cudaError_t kg_add_layernorm_forward(cudaStream_t s, int fdt, void *res, const void *a, const void *rb, void *y,
                                     void *mean, void *rstd, const void *w, const void *b, int N, int C, double eps,
                                     int round_dtype) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int y16 = fake_act16(fdt);
    if ((!fake_seq_fdt(fdt) && !y16) || N < 0 || C < 0 ||
        (y16 ? round_dtype != fdt : !fake_seq_round_ok(fdt, round_dtype)) || !res || !a || !rb)
        return fake_error(cudaErrorInvalidValue);
    if (N == 0 || C == 0) return cudaSuccess;
    const size_t n = (size_t)N * (size_t)C, esz = y16 ? sizeof(float) : fake_seq_esz(fdt), xb = n * esz,
                 sb = y16 ? n * 2 : xb, rbytes = (size_t)N * esz, cb = (size_t)C * esz;
    const fake_buf bufs[] = {{"res", res, xb},       {"a", a, xb},         {"rb", rb, sb},
                             {"y", y, sb},           {"mean", mean, rbytes}, {"rstd", rstd, rbytes},
                             {"w", w, w ? cb : 0},   {"b", b, b ? cb : 0}};
    cudaError_t e = fake_launch(__func__, s, bufs, 8);
    if (e != cudaSuccess) return e;
    const void *in[3] = {res, a, rb};
    const size_t inb[3] = {xb, xb, sb};
    static const char *const inn[3] = {"res", "a", "rb"};
    for (int i = 0; i < 3; i++)
        if (fake_overlap(__func__, "y", y, sb, inn[i], in[i], inb[i]) ||
            fake_overlap(__func__, "mean", mean, rbytes, inn[i], in[i], inb[i]) ||
            fake_overlap(__func__, "rstd", rstd, rbytes, inn[i], in[i], inb[i]))
            return fake_error(cudaErrorInvalidValue);
    if ((res != a && fake_overlap(__func__, "res", res, xb, "a", a, xb)) ||
        ((y16 || res != rb) && fake_overlap(__func__, "res", res, xb, "rb", rb, sb)) ||
        fake_overlap(__func__, "mean", mean, rbytes, "rstd", rstd, rbytes))
        return fake_error(cudaErrorInvalidValue);
    e = fake_add_math(fdt, res, a, rb, n);
    return e != cudaSuccess ? e : fake_ln_math(fdt, y, mean, rstd, res, w, b, N, C, eps, round_dtype);
}

/* ------------------------------------------------------------- attention */

static int fake_attn_args(int fdt, int B, int T, int C, int NH, int round_dtype) {
    const int dt_ok = fake_act16(fdt) ? round_dtype == fdt : fake_seq_fdt(fdt) && fake_seq_round_ok(fdt, round_dtype);
    return dt_ok && B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0 && T <= kg_attention_max_T(fdt);
}

/* What both attention launches do once their buffers are listed: the
 * launch checks, the two operand overlaps kg_kernels.h forbids (pairs of
 * indices into b, the first found is the one reported), then the CPU
 * kernel's workspace for `backward`, 64-byte aligned, into *ws / *wsb. */
static cudaError_t fake_attn_launch(const char *fn, cudaStream_t s, const fake_buf *b, int nb, const int ov[2][2],
                                    int backward, size_t esz, int B, int T, int NH, void **ws, size_t *wsb) {
    cudaError_t e = fake_launch(fn, s, b, nb);
    if (e != cudaSuccess) return e;
    for (int i = 0; i < 2; i++) {
        const fake_buf *x = &b[ov[i][0]], *y = &b[ov[i][1]];
        if (fake_overlap(fn, x->what, x->p, x->bytes, y->what, y->p, y->bytes)) return fake_error(cudaErrorInvalidValue);
    }
    *wsb = kc_attn_workspace_bytes_for(backward, esz, B, T, NH);
    *ws = aligned_alloc(64, (*wsb + 63) & ~(size_t)63);
    return *ws ? cudaSuccess : fake_error(cudaErrorMemoryAllocation);
}

cudaError_t kg_attention_forward(cudaStream_t s, int fdt, void *out, void *lse, const void *qkv, int B, int T, int C,
                                 int NH, int round_dtype) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_attn_args(fdt, B, T, C, NH, round_dtype)) return fake_error(cudaErrorInvalidValue);
    const int s16 = fake_act16(fdt); /* 1.7: qkv and out in 16 bits, lse float32 */
    const size_t esz = s16 ? sizeof(float) : fake_seq_esz(fdt), rows = (size_t)B * (size_t)T;
    const size_t ob = rows * (size_t)C * (s16 ? 2 : esz), qb = 3 * ob, lb = rows * (size_t)NH * esz;
    const fake_buf bufs[] = {{"out", out, ob}, {"lse", lse, lb}, {"qkv", qkv, qb}};
    static const int overlaps[2][2] = {{0, 2}, {1, 2}}; /* out / qkv, lse / qkv */
    void *ws;
    size_t wsb;
    cudaError_t e = fake_attn_launch(__func__, s, bufs, 3, overlaps, 0, esz, B, T, NH, &ws, &wsb);
    if (e != cudaSuccess) return e;
    if (s16) { /* the float32 kernel on the widened qkv, out rounded as stored */
        const size_t no = rows * (size_t)C;
        float *q32 = fake_widen16(fdt, qkv, 3 * no), *o32 = malloc(no * sizeof *o32);
        int k = -1;
        if (q32 && o32) k = kc_attn_forward(o32, lse, q32, B, T, C, NH, KC_F32, ws, wsb);
        if (k == 0) fake_store16(fdt, out, o32, no);
        free(q32), free(o32), free(ws);
        return k == 0 ? cudaSuccess : fake_error(cudaErrorInvalidValue);
    }
    const int k = fdt == KG_F32 ? kc_attn_forward(out, lse, qkv, B, T, C, NH, round_dtype == KG_F32 ? KC_F32 : round_dtype, ws, wsb)
                                : kc_attn_forward_f64(out, lse, qkv, B, T, C, NH, ws, wsb);
    free(ws);
    return k == 0 ? cudaSuccess : fake_error(cudaErrorInvalidValue);
}

cudaError_t kg_attention_backward(cudaStream_t s, int fdt, void *dqkv, const void *dout, const void *qkv,
                                  const void *out, const void *lse, int B, int T, int C, int NH, int round_dtype,
                                  double *work) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_attn_args(fdt, B, T, C, NH, round_dtype) || !work) return fake_error(cudaErrorInvalidValue);
    const int s16 = fake_act16(fdt); /* 1.7: dqkv, dout, qkv, out in 16 bits, lse float32 */
    const size_t esz = s16 ? sizeof(float) : fake_seq_esz(fdt), rows = (size_t)B * (size_t)T;
    const size_t ob = rows * (size_t)C * (s16 ? 2 : esz), qb = 3 * ob, lb = rows * (size_t)NH * esz;
    const fake_buf bufs[] = {{"dqkv", dqkv, qb}, {"dout", dout, ob}, {"qkv", qkv, qb},
                             {"out", out, ob},   {"lse", lse, lb},   {"work", work, rows * (size_t)NH * sizeof(double)}};
    static const int overlaps[2][2] = {{0, 2}, {0, 1}}; /* dqkv / qkv, dqkv / dout */
    void *ws;
    size_t wsb;
    cudaError_t e = fake_attn_launch(__func__, s, bufs, 6, overlaps, 1, esz, B, T, NH, &ws, &wsb);
    if (e != cudaSuccess) return e;
    if (s16) { /* the float32 kernel on the widened inputs, dqkv rounded as stored */
        const size_t no = rows * (size_t)C;
        float *q32 = fake_widen16(fdt, qkv, 3 * no), *g32 = fake_widen16(fdt, dout, no);
        float *o32 = fake_widen16(fdt, out, no), *d32 = malloc(3 * no * sizeof *d32);
        int k = -1;
        if (q32 && g32 && o32 && d32) k = kc_attn_backward(d32, g32, q32, o32, lse, B, T, C, NH, KC_F32, ws, wsb);
        if (k == 0) fake_store16(fdt, dqkv, d32, 3 * no);
        free(q32), free(g32), free(o32), free(d32), free(ws);
        return k == 0 ? cudaSuccess : fake_error(cudaErrorInvalidValue);
    }
    const int k = fdt == KG_F32 ? kc_attn_backward(dqkv, dout, qkv, out, lse, B, T, C, NH,
                                                   round_dtype == KG_F32 ? KC_F32 : round_dtype, ws, wsb)
                                : kc_attn_backward_f64(dqkv, dout, qkv, out, lse, B, T, C, NH, ws, wsb);
    free(ws);
    return k == 0 ? cudaSuccess : fake_error(cudaErrorInvalidValue);
}

/* -------------------------------------------------- attention, gemm path */

static int fake_attn_op_ok(int fdt, int op) {
    return op == fdt || (fdt == KG_F32 && (op == KG_F16 || op == KG_BF16));
}
static size_t fake_op_size(int op) { return op == KG_F64 ? 8 : op == KG_F32 ? 4 : 2; }

/* Bytes of a head-major buffer of bh heads at stride hs holding td each. */
static size_t fake_heads_bytes(size_t bh, size_t hs, size_t td, size_t esz) { return ((bh - 1) * hs + td) * esz; }

cudaError_t kg_heads_split(cudaStream_t s, int fdt, const void *src, int ld, int B, int T, int NH, int D, void *dst,
                           size_t hs, int op) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int s16 = fake_act16(fdt); /* 1.7: 16-bit src, op == fdt (a copy) */
    if ((!fake_seq_fdt(fdt) && !s16) || (s16 ? op != fdt : !fake_attn_op_ok(fdt, op)) || B < 0 || T < 0 || NH < 0 ||
        D < 0 || hs < (size_t)T * (size_t)D)
        return fake_error(cudaErrorInvalidValue);
    const size_t n = (size_t)B * (size_t)NH * (size_t)T * (size_t)D, esz = fake_op_size(fdt), td = (size_t)T * (size_t)D;
    if (n == 0) return cudaSuccess;
    const size_t span = (((size_t)B * (size_t)T - 1) * (size_t)ld + (size_t)NH * (size_t)D) * esz;
    const fake_buf bufs[] = {{"src", src, span}, {"dst", dst, fake_heads_bytes(n / td, hs, td, fake_op_size(op))}};
    cudaError_t e = fake_launch(__func__, s, bufs, 2);
    if (e != cudaSuccess) return e;
    for (size_t i = 0; i < n; i++) {
        const size_t d = i % (size_t)D, t = (i / (size_t)D) % (size_t)T, bh = i / ((size_t)D * (size_t)T);
        const size_t b = bh / (size_t)NH, h = bh % (size_t)NH;
        const char *x = (const char *)src + ((b * (size_t)T + t) * (size_t)ld + h * (size_t)D + d) * esz;
        kc_cast((char *)dst + (bh * hs + i % td) * fake_op_size(op), op, x, fdt, 1);
    }
    return cudaSuccess;
}

cudaError_t kg_heads_merge(cudaStream_t s, int fdt, void *dst, int ld, int B, int T, int NH, int D, const void *src,
                           size_t hs, int round_dtype) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int d16 = fake_act16(fdt); /* 1.7: 16-bit dst, float src, round_dtype fdt */
    if ((!fake_seq_fdt(fdt) && !d16) || (d16 && round_dtype != fdt) || B < 0 || T < 0 || NH < 0 || D < 0 ||
        hs < (size_t)T * (size_t)D)
        return fake_error(cudaErrorInvalidValue);
    const size_t n = (size_t)B * (size_t)NH * (size_t)T * (size_t)D, esz = fake_op_size(fdt), td = (size_t)T * (size_t)D;
    const size_t ssz = d16 ? sizeof(float) : esz;
    if (n == 0) return cudaSuccess;
    const size_t span = (((size_t)B * (size_t)T - 1) * (size_t)ld + (size_t)NH * (size_t)D) * esz;
    const fake_buf bufs[] = {{"dst", dst, span}, {"src", src, fake_heads_bytes(n / td, hs, td, ssz)}};
    cudaError_t e = fake_launch(__func__, s, bufs, 2);
    if (e != cudaSuccess) return e;
    for (size_t i = 0; i < n; i++) {
        const size_t d = i % (size_t)D, t = (i / (size_t)D) % (size_t)T, bh = i / ((size_t)D * (size_t)T);
        const size_t b = bh / (size_t)NH, h = bh % (size_t)NH;
        char *y = (char *)dst + ((b * (size_t)T + t) * (size_t)ld + h * (size_t)D + d) * esz;
        if (d16) {
            fake_store16(fdt, y, (const float *)src + ((i / td) * hs + i % td), 1);
            continue;
        }
        memcpy(y, (const char *)src + ((i / td) * hs + i % td) * esz, esz);
        if (fdt == KG_F32 && round_dtype == KG_BF16) kc_round_bf16((float *)y, 1);
        else if (fdt == KG_F32 && round_dtype == KG_F16) kc_round_f16((float *)y, 1);
    }
    return cudaSuccess;
}

/* The three row steps, as kg_kernels.h states them, in the data type TY
 * with the kernel's exponential (km_exp_nonpos in float32). */
#define FAKE_ATTN_ROWS(TY, EXP)                                                                                  \
    do {                                                                                                         \
        for (size_t r = 0; r < rows; r++) {                                                                      \
            const size_t i = r % (size_t)T, off = (r / (size_t)T) * ts + i * (size_t)T;                          \
            const TY *srow = (const TY *)S + off;                                                                \
            char *orow = (char *)out + off * osz;                                                                \
            TY mx = (TY)-INFINITY, l = 0;                                                                        \
            double sum = 0.0;                                                                                    \
            if (mode == 0) {                                                                                     \
                for (size_t j = 0; j <= i; j++) mx = srow[j] > mx ? srow[j] : mx;                                \
                for (size_t j = 0; j <= i; j++) sum += (double)EXP(srow[j] - mx);                                \
                ((TY *)lse)[r] = (TY)((double)mx + log(sum));                                                    \
            } else {                                                                                             \
                l = ((const TY *)lse)[r];                                                                        \
            }                                                                                                    \
            const TY inv = mode == 0 ? (TY)(1.0 / sum) : (TY)0;                                                  \
            for (size_t j = 0; j < (size_t)T; j++) {                                                             \
                TY v = 0;                                                                                        \
                if (j <= i) {                                                                                    \
                    if (mode == 0) v = EXP(srow[j] - mx) * inv;                                                  \
                    else {                                                                                       \
                        const TY p = EXP(srow[j] - l);                                                           \
                        v = mode == 1 ? p                                                                        \
                                      : (TY)((double)p * ((double)((const TY *)dP)[off + j] - delta[r]));         \
                    }                                                                                            \
                }                                                                                                \
                kc_cast(orow + j * osz, op, &v, fdt, 1);                                                         \
            }                                                                                                    \
        }                                                                                                        \
    } while (0)

static cudaError_t fake_attn_rows(const char *fn, int mode, cudaStream_t s, int fdt, const void *S, const void *dP,
                                  void *lse, const double *delta, int T, size_t rows, size_t ts, void *out, int op) {
    if (fake_inject(fn)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_seq_fdt(fdt) || !fake_attn_op_ok(fdt, op) || T <= 0 || ts < (size_t)T * (size_t)T || rows % (size_t)T)
        return fake_error(cudaErrorInvalidValue);
    if (rows == 0) return cudaSuccess;
    const size_t esz = fake_seq_esz(fdt), osz = fake_op_size(op);
    const size_t tt = (rows / (size_t)T - 1) * ts + (size_t)T * (size_t)T; /* elements the score buffers span */
    const fake_buf bufs[] = {{"S", S, tt * esz},
                             {"lse", lse, rows * esz},
                             {"out", out, tt * osz},
                             {"dP", dP, mode == 2 ? tt * esz : 0},
                             {"delta", delta, mode == 2 ? rows * sizeof *delta : 0}};
    cudaError_t e = fake_launch(fn, s, bufs, 5);
    if (e != cudaSuccess) return e;
    if (fake_overlap(fn, "out", out, tt * osz, "S", S, tt * esz) || (mode == 2 && fake_overlap(fn, "out", out, tt * osz, "dP", dP, tt * esz)))
        return fake_error(cudaErrorInvalidValue);
    if (fdt == KG_F32) FAKE_ATTN_ROWS(float, km_exp_nonpos);
    else FAKE_ATTN_ROWS(double, exp);
    return cudaSuccess;
}

cudaError_t kg_attn_softmax(cudaStream_t s, int fdt, const void *S, int T, size_t rows, size_t ts, void *lse, void *P,
                            int op) {
    FAKE_SCOPE();
    return fake_attn_rows(__func__, 0, s, fdt, S, NULL, lse, NULL, T, rows, ts, P, op);
}
cudaError_t kg_attn_probs(cudaStream_t s, int fdt, const void *S, const void *lse, int T, size_t rows, size_t ts,
                          void *P, int op) {
    FAKE_SCOPE();
    return fake_attn_rows(__func__, 1, s, fdt, S, NULL, (void *)lse, NULL, T, rows, ts, P, op);
}
cudaError_t kg_attn_dscores(cudaStream_t s, int fdt, const void *S, const void *dP, const void *lse,
                            const double *delta, int T, size_t rows, size_t ts, void *dS, int op) {
    FAKE_SCOPE();
    return fake_attn_rows(__func__, 2, s, fdt, S, dP, (void *)lse, delta, T, rows, ts, dS, op);
}

cudaError_t kg_attn_delta(cudaStream_t s, int fdt, const void *dout, const void *out, int B, int T, int C, int NH,
                          double *delta) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int s16 = fake_act16(fdt); /* 1.7: dout and out in 16 bits */
    if ((!fake_seq_fdt(fdt) && !s16) || B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH)
        return fake_error(cudaErrorInvalidValue);
    const size_t rows = (size_t)B * (size_t)NH * (size_t)T, esz = fake_op_size(fdt), nb = (size_t)B * (size_t)T * (size_t)C * esz;
    if (rows == 0) return cudaSuccess;
    const fake_buf bufs[] = {{"dout", dout, nb}, {"out", out, nb}, {"delta", delta, rows * sizeof *delta}};
    cudaError_t e = fake_launch(__func__, s, bufs, 3);
    if (e != cudaSuccess) return e;
    const size_t D = (size_t)(C / NH);
    for (size_t r = 0; r < rows; r++) {
        const size_t i = r % (size_t)T, h = (r / (size_t)T) % (size_t)NH, b = r / ((size_t)T * (size_t)NH);
        const size_t off = (b * (size_t)T + i) * (size_t)C + h * D;
        double acc = 0.0;
        for (size_t d = 0; d < D; d++) {
            if (s16) {
                float g, o;
                kc_cast(&g, KG_F32, (const uint16_t *)dout + off + d, fdt, 1);
                kc_cast(&o, KG_F32, (const uint16_t *)out + off + d, fdt, 1);
                acc += (double)g * (double)o;
                continue;
            }
            acc += fdt == KG_F32 ? (double)((const float *)dout)[off + d] * (double)((const float *)out)[off + d]
                                 : ((const double *)dout)[off + d] * ((const double *)out)[off + d];
        }
        delta[r] = acc;
    }
    return cudaSuccess;
}
