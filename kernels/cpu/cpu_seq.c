/*
 * cpu_seq.c — CPU kernels for the ABI 1.4 sequence entries other than
 * attention (cpu_seq.h): embedding forward and scatter-add backward, layer
 * norm forward and backward, the fused softmax cross-entropy over a
 * vocabulary, and add. They run every step of a transformer, so the inner
 * loops are written for the vectorizer (fixed lanes for reductions, the
 * branch-free exp of km_act.h, AVX2 copies through KC_DISPATCHED_RANGE) and
 * the outer loops are split across the pool by rows. Determinism at any
 * thread count comes from the decomposition, never from the split: a row's
 * arithmetic is the same whichever thread runs it, reductions over rows go
 * through blocks sized from the shapes only, and the embedding gradient is
 * scattered per destination row (after a counting sort of the positions by
 * token) so that each row sees its contributions in increasing position
 * order, as the serial loop would.
 *
 * The float32 and float64 versions share one body: this file includes
 * itself twice with KC_SEQ_T set to float and to double (the only other
 * differences, the exp used by the cross-entropy and the output rounding of
 * the layer norm, are macros too), so the two can never drift apart.
 */
#ifndef KC_SEQ_T

#include "cpu_seq.h"

#include "cpu_internal.h"
#include "cpu_kernels.h"
#include "../common/km_seq.h"

#include <math.h>
#include <string.h>

#define KC_SEQ_CAT_(a, b) a##b
#define KC_SEQ_CAT(a, b) KC_SEQ_CAT_(a, b)
/* name, name_f64 */
#define KC_N(name) KC_SEQ_CAT(name, KC_SEQ_SUF)
/* The range body and the dispatcher of a KC_DISPATCHED_RANGE (one level of
 * indirection so that KC_N expands before the macro pastes onto it). */
#define KC_IMPL(name) KC_SEQ_CAT(KC_N(name), _impl)
#define KC_PICK(name) KC_SEQ_CAT(KC_N(name), _pick)
#define KC_SEQ_DISPATCH(name) KC_DISPATCHED_RANGE(name)

/* The row blocks of the layer norm backward's dw/db partials and of the
 * cross-entropy's loss sum: kernels/common/km_seq.h, shared with the CUDA
 * kernels so that both sum in the same order. */
static size_t kc_ln_rows_per_block(size_t N) { return km_ln_rows_per_block(N); }

size_t kc_layernorm_backward_workspace(int N, int C, int has_dw, int has_db) {
    if (N <= 0 || C <= 0 || (!has_dw && !has_db)) return 0;
    const size_t rpb = kc_ln_rows_per_block((size_t)N);
    const size_t nblocks = ((size_t)N + rpb - 1) / rpb;
    return nblocks * (size_t)C * sizeof(double) * (size_t)((has_dw != 0) + (has_db != 0));
}

size_t kc_embedding_backward_workspace(int B, int T, int V, int has_dwte) {
    if (!has_dwte || B <= 0 || T <= 0 || V < 0) return 0;
    return ((size_t)V + 1 + (size_t)B * (size_t)T) * sizeof(int32_t);
}

/*
 * Counting sort of positions [0, n) by token, stable (increasing position
 * within a token). On return the positions of token v are
 * order[end[v-1] .. end[v]) (end[-1] read as 0). end: (V + 1), order: (n).
 * Serial: O(n + V), small next to the O(n * C) scatter it orders.
 */
static void kc_sort_by_token(int32_t *restrict end, int32_t *restrict order, const int32_t *restrict tokens,
                             size_t n, size_t V) {
    memset(end, 0, (V + 1) * sizeof *end);
    for (size_t i = 0; i < n; i++) end[tokens[i] + 1]++;
    for (size_t v = 0; v < V; v++) end[v + 1] += end[v];
    /* end[v] is now where token v starts; used as its cursor, it finishes
     * where v ends (= where v + 1 started). */
    for (size_t i = 0; i < n; i++) order[end[tokens[i]]++] = (int32_t)i;
}

static size_t kc_xent_rows_per_block(size_t N) { return km_xent_rows_per_block(N); }
_Static_assert(KM_XENT_MAX_BLOCKS <= KC_RED_MAX_BLOCKS, "the cross-entropy's partials live in a KC_RED_MAX_BLOCKS array");

/* Units per part so that one part holds at least `grain` elements of work,
 * when one unit is `per_unit` elements. */
static size_t kc_seq_grain(size_t grain, size_t per_unit) {
    if (per_unit == 0) return grain;
    const size_t g = (grain + per_unit - 1) / per_unit;
    return g ? g : 1;
}

/* float32: the fast exp of GELU's family (vectorizes; exact range
 * reduction down into the subnormals), libm's expf on the rare rows holding
 * inf or NaN, and y rounded through float16 / bfloat16 on request. */
#define KC_SEQ_T float
#define KC_SEQ_SUF
#define KC_SEQ_KM_SUF _f32
#define KC_SEQ_EXP_NONPOS(x) km_exp_nonpos(x)
#define KC_SEQ_EXP(x) expf(x)
#define KC_SEQ_IS_F32 1
#define KC_SEQ_IT int32_t
#define KC_SEQ_IT_MIN INT32_MIN
#define KC_SEQ_SIGN_SHIFT 31
#define KC_SEQ_MAG INT32_C(0x7fffffff)
#define KC_SEQ_EXP_BITS INT32_C(0x7f800000)
#include "cpu_seq.c"
#undef KC_SEQ_T
#undef KC_SEQ_SUF
#undef KC_SEQ_KM_SUF
#undef KC_SEQ_EXP_NONPOS
#undef KC_SEQ_EXP
#undef KC_SEQ_IS_F32
#undef KC_SEQ_IT
#undef KC_SEQ_IT_MIN
#undef KC_SEQ_SIGN_SHIFT
#undef KC_SEQ_MAG
#undef KC_SEQ_EXP_BITS

/* float64: libm's exp throughout (the float64 kernels are the reference
 * path; accuracy matters more than speed). */
#define KC_SEQ_T double
#define KC_SEQ_SUF _f64
#define KC_SEQ_KM_SUF _f64
#define KC_SEQ_EXP_NONPOS(x) exp(x)
#define KC_SEQ_EXP(x) exp(x)
#define KC_SEQ_IS_F32 0
#define KC_SEQ_IT int64_t
#define KC_SEQ_IT_MIN INT64_MIN
#define KC_SEQ_SIGN_SHIFT 63
#define KC_SEQ_MAG INT64_C(0x7fffffffffffffff)
#define KC_SEQ_EXP_BITS INT64_C(0x7ff0000000000000)
#include "cpu_seq.c"

/* Logits stored in float16 / bfloat16 (ABI 1.6): the float32 kernel on the
 * rows widened into ws (exact), then the gradient rounded back as it is
 * stored. Being the float32 call, the loss and the gradient's values are
 * those of float32 logits holding the same values, bit for bit. */
double kc_xent_fused_16(int dtype, void *logits, const int32_t *targets, int N, int V, int Vp, double grad_scale,
                        float *ws) {
    if (N <= 0 || V <= 0) return 0.0;
    const size_t n = (size_t)N * (size_t)Vp;
    kc_cast_rows(KC_CAST, ws, KC_F32, n, logits, dtype, n, 1, n);
    const double sum = kc_xent_fused(ws, targets, N, V, Vp, grad_scale);
    if (grad_scale != 0.0) kc_cast_rows(KC_CAST, logits, dtype, n, ws, KC_F32, n, 1, n);
    return sum;
}

#else /* KC_SEQ_T: the body, once per data type */

typedef KC_SEQ_T KC_N(kc_seq_t);
#define T_ KC_N(kc_seq_t)
/* kernels/common/km_seq.h's formula of this element type */
#define KM_(name) KC_SEQ_CAT(name, KC_SEQ_KM_SUF)

/* ------------------------------------------------------------- embedding */

typedef struct {
    T_ *out;               /* (n, C) */
    const int32_t *tokens; /* (n) */
    const T_ *wte, *wpe;   /* (V, C), (>= T, C) or NULL */
    size_t T, C;
} KC_N(kc_emb_fwd_ctx);

/* Rows [r0, r1) of out. */
static KC_ALWAYS_INLINE void KC_IMPL(kc_emb_fwd_range)(void *vc, size_t r0, size_t r1) {
    const KC_N(kc_emb_fwd_ctx) *c = vc;
    const size_t C = c->C;
    for (size_t i = r0; i < r1; i++) {
        T_ *restrict o = c->out + i * C;
        const T_ *restrict e = c->wte + (size_t)c->tokens[i] * C;
        if (c->wpe) {
            const T_ *restrict p = c->wpe + (i % c->T) * C;
            for (size_t j = 0; j < C; j++) o[j] = e[j] + p[j];
        } else {
            memcpy(o, e, C * sizeof *o);
        }
    }
}
KC_SEQ_DISPATCH(KC_N(kc_emb_fwd_range))

void KC_N(kc_embedding_forward)(T_ *out, const int32_t *tokens, const T_ *wte, const T_ *wpe, int B, int T, int C) {
    if (B <= 0 || T <= 0 || C <= 0) return;
    KC_N(kc_emb_fwd_ctx) c = {out, tokens, wte, wpe, (size_t)T, (size_t)C};
    const size_t n = (size_t)B * (size_t)T;
    kc_parallel_for(n, kc_seq_grain(KC_GRAIN_STREAM, (size_t)C), 1, KC_PICK(kc_emb_fwd_range)(), &c);
}

typedef struct {
    T_ *dwte, *dwpe;       /* (V, C), (T, C) */
    const T_ *dout;        /* (B*T, C) */
    const int32_t *end;    /* (V + 1) from kc_sort_by_token */
    const int32_t *order;  /* (B*T) */
    size_t B, T, C;
} KC_N(kc_emb_bwd_ctx);

/* Rows [t0, t1) of dwpe: each adds its B contributions in increasing b. */
static KC_ALWAYS_INLINE void KC_IMPL(kc_emb_bwd_pos_range)(void *vc, size_t t0, size_t t1) {
    const KC_N(kc_emb_bwd_ctx) *c = vc;
    const size_t C = c->C;
    for (size_t t = t0; t < t1; t++) {
        T_ *restrict g = c->dwpe + t * C;
        for (size_t b = 0; b < c->B; b++) {
            const T_ *restrict d = c->dout + (b * c->T + t) * C;
            for (size_t j = 0; j < C; j++) g[j] += d[j];
        }
    }
}
KC_SEQ_DISPATCH(KC_N(kc_emb_bwd_pos_range))

/* Rows [v0, v1) of dwte: each adds the rows of its positions in increasing
 * position order (the sort is stable). */
static KC_ALWAYS_INLINE void KC_IMPL(kc_emb_bwd_tok_range)(void *vc, size_t v0, size_t v1) {
    const KC_N(kc_emb_bwd_ctx) *c = vc;
    const size_t C = c->C;
    for (size_t v = v0; v < v1; v++) {
        const size_t k0 = v ? (size_t)c->end[v - 1] : 0, k1 = (size_t)c->end[v];
        T_ *restrict g = c->dwte + v * C;
        for (size_t k = k0; k < k1; k++) {
            const T_ *restrict d = c->dout + (size_t)c->order[k] * C;
            for (size_t j = 0; j < C; j++) g[j] += d[j];
        }
    }
}
KC_SEQ_DISPATCH(KC_N(kc_emb_bwd_tok_range))

void KC_N(kc_embedding_backward)(T_ *dwte, T_ *dwpe, const T_ *dout, const int32_t *tokens, int B, int T, int C,
                                 int V, void *ws) {
    if (B <= 0 || T <= 0 || C <= 0) return;
    const size_t n = (size_t)B * (size_t)T;
    KC_N(kc_emb_bwd_ctx) c = {dwte, dwpe, dout, NULL, NULL, (size_t)B, (size_t)T, (size_t)C};
    if (dwpe) kc_parallel_for((size_t)T, kc_seq_grain(KC_GRAIN_STREAM, (size_t)B * (size_t)C), 1,
                              KC_PICK(kc_emb_bwd_pos_range)(), &c);
    if (dwte && V > 0) {
        int32_t *end = ws, *order = end + (size_t)V + 1;
        kc_sort_by_token(end, order, tokens, n, (size_t)V);
        c.end = end;
        c.order = order;
        /* Split over vocabulary rows; with the work (n * C elements) spread
         * over V rows on average, a part of g rows holds about
         * g * n * C / V elements. */
        const double per_row = (double)n * (double)C / (double)V;
        size_t grain = (size_t)((double)KC_GRAIN_STREAM / (per_row > 1.0 ? per_row : 1.0)) + 1;
        kc_parallel_for((size_t)V, grain, 1, KC_PICK(kc_emb_bwd_tok_range)(), &c);
    }
}

/* ------------------------------------------------------------ layer norm */

typedef struct {
    T_ *y, *mean, *rstd;  /* (N, C), (N), (N) */
    const T_ *x, *w, *b;  /* (N, C), (C) or NULL, (C) or NULL */
    size_t C;
    double eps;
    int round_dtype;
} KC_N(kc_ln_fwd_ctx);

/* Rows [r0, r1): statistics in double over two passes (mean, then the mean
 * squared deviation: no cancellation of E[x^2] - mean^2), eight lanes each so
 * the order is fixed and the loop vectorizes; then y in the data type from
 * the stored (rounded) mean and rstd, which the backward reads back. */
static KC_ALWAYS_INLINE void KC_IMPL(kc_ln_fwd_range)(void *vc, size_t r0, size_t r1) {
    const KC_N(kc_ln_fwd_ctx) *c = vc;
    const size_t C = c->C;
    const T_ *restrict w = c->w;
    const T_ *restrict b = c->b;
    for (size_t i = r0; i < r1; i++) {
        const T_ *restrict x = c->x + i * C;
        T_ *restrict y = c->y + i * C;
        double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        size_t j = 0;
        for (; j + 8 <= C; j += 8)
            for (size_t k = 0; k < 8; k++) a[k] += (double)x[j + k];
        double s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        for (; j < C; j++) s += (double)x[j];
        const double mean_d = s / (double)C;
        for (size_t k = 0; k < 8; k++) a[k] = 0.0;
        for (j = 0; j + 8 <= C; j += 8)
            for (size_t k = 0; k < 8; k++) {
                const double d = (double)x[j + k] - mean_d;
                a[k] += d * d;
            }
        double q = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        for (; j < C; j++) {
            const double d = (double)x[j] - mean_d;
            q += d * d;
        }
        const double rstd_d = 1.0 / sqrt(q / (double)C + c->eps);
        const T_ m = (T_)mean_d, r = (T_)rstd_d;
        c->mean[i] = m;
        c->rstd[i] = r;
        /* one loop per case, so each vectorizes with its flags constant */
        if (w && b)
            for (j = 0; j < C; j++) y[j] = KM_(km_ln_y)(x[j], m, r, w[j], b[j], 1, 1);
        else if (w)
            for (j = 0; j < C; j++) y[j] = KM_(km_ln_y)(x[j], m, r, w[j], 0, 1, 0);
        else if (b)
            for (j = 0; j < C; j++) y[j] = KM_(km_ln_y)(x[j], m, r, 0, b[j], 0, 1);
        else
            for (j = 0; j < C; j++) y[j] = KM_(km_ln_y)(x[j], m, r, 0, 0, 0, 0);
#if KC_SEQ_IS_F32
        /* while the row is in cache; C is below any split grain, so this
         * runs serially inside the range body */
        if (c->round_dtype == KC_F16) kc_round_f16(y, C);
        else if (c->round_dtype == KC_BF16) kc_round_bf16(y, C);
#endif
    }
}
KC_SEQ_DISPATCH(KC_N(kc_ln_fwd_range))

#if KC_SEQ_IS_F32
void kc_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w, const float *b, int N,
                          int C, double eps, int round_dtype) {
#else
void kc_layernorm_forward_f64(double *y, double *mean, double *rstd, const double *x, const double *w,
                              const double *b, int N, int C, double eps) {
    const int round_dtype = KC_F64;
#endif
    if (N <= 0 || C <= 0) return;
    KC_N(kc_ln_fwd_ctx) c = {y, mean, rstd, x, w, b, (size_t)C, eps, round_dtype};
    /* three passes over a row held in L1: between a stream and GELU */
    kc_parallel_for((size_t)N, kc_seq_grain(KC_GRAIN_STREAM / 2, (size_t)C), 1, KC_PICK(kc_ln_fwd_range)(), &c);
}

typedef struct {
    T_ *dx;                        /* (N, C) */
    double *pw, *pb;               /* (nblocks, C) partials or NULL */
    const T_ *dy, *x, *w;          /* (N, C), (N, C), (C) or NULL */
    const T_ *mean, *rstd;         /* (N), (N) */
    size_t N, C, rpb;
    int accumulate;
} KC_N(kc_ln_bwd_ctx);

/* Row blocks [b0, b1): dx of every row of the block, and the block's own
 * partial rows of dw and db (zeroed first, rows added in order). */
static KC_ALWAYS_INLINE void KC_IMPL(kc_ln_bwd_range)(void *vc, size_t b0, size_t b1) {
    const KC_N(kc_ln_bwd_ctx) *c = vc;
    const size_t C = c->C;
    const T_ *restrict w = c->w;
    for (size_t blk = b0; blk < b1; blk++) {
        double *restrict pw = c->pw ? c->pw + blk * C : NULL;
        double *restrict pb = c->pb ? c->pb + blk * C : NULL;
        if (pw) memset(pw, 0, C * sizeof *pw);
        if (pb) memset(pb, 0, C * sizeof *pb);
        const size_t r0 = blk * c->rpb, r1 = r0 + c->rpb < c->N ? r0 + c->rpb : c->N;
        for (size_t i = r0; i < r1; i++) {
            const T_ *restrict x = c->x + i * C;
            const T_ *restrict dy = c->dy + i * C;
            T_ *restrict dx = c->dx + i * C;
            const T_ m = c->mean[i], r = c->rstd[i];
            /* sum g and sum g * xhat, in double, eight fixed lanes */
            double sa[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sb[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            size_t j = 0;
            if (w) {
                for (; j + 8 <= C; j += 8)
                    for (size_t k = 0; k < 8; k++) {
                        const T_ h = (x[j + k] - m) * r, g = dy[j + k] * w[j + k];
                        sa[k] += (double)g;
                        sb[k] += (double)g * (double)h;
                    }
            } else {
                for (; j + 8 <= C; j += 8)
                    for (size_t k = 0; k < 8; k++) {
                        const T_ h = (x[j + k] - m) * r, g = dy[j + k];
                        sa[k] += (double)g;
                        sb[k] += (double)g * (double)h;
                    }
            }
            double A = ((sa[0] + sa[1]) + (sa[2] + sa[3])) + ((sa[4] + sa[5]) + (sa[6] + sa[7]));
            double Bs = ((sb[0] + sb[1]) + (sb[2] + sb[3])) + ((sb[4] + sb[5]) + (sb[6] + sb[7]));
            for (; j < C; j++) {
                const T_ h = (x[j] - m) * r, g = w ? dy[j] * w[j] : dy[j];
                A += (double)g;
                Bs += (double)g * (double)h;
            }
            const T_ am = (T_)(A / (double)C), bm = (T_)(Bs / (double)C);
            if (w) {
                if (c->accumulate)
                    for (j = 0; j < C; j++) dx[j] += KM_(km_ln_dx)(dy[j] * w[j], x[j], m, r, am, bm);
                else
                    for (j = 0; j < C; j++) dx[j] = KM_(km_ln_dx)(dy[j] * w[j], x[j], m, r, am, bm);
            } else {
                if (c->accumulate)
                    for (j = 0; j < C; j++) dx[j] += KM_(km_ln_dx)(dy[j], x[j], m, r, am, bm);
                else
                    for (j = 0; j < C; j++) dx[j] = KM_(km_ln_dx)(dy[j], x[j], m, r, am, bm);
            }
            if (pw)
                for (j = 0; j < C; j++) pw[j] += (double)dy[j] * (double)((x[j] - m) * r);
            if (pb)
                for (j = 0; j < C; j++) pb[j] += (double)dy[j];
        }
    }
}
KC_SEQ_DISPATCH(KC_N(kc_ln_bwd_range))

/* g(C) = round(g + sum over blocks of p(nblocks, C)), blocks in order
 * (summed into p's first row). */
static void KC_N(kc_ln_combine)(T_ *restrict g, double *restrict p, size_t nblocks, size_t C) {
    for (size_t blk = 1; blk < nblocks; blk++) {
        const double *restrict q = p + blk * C;
        for (size_t j = 0; j < C; j++) p[j] += q[j];
    }
    for (size_t j = 0; j < C; j++) g[j] = (T_)((double)g[j] + p[j]);
}

void KC_N(kc_layernorm_backward)(T_ *dx, T_ *dw, T_ *db, const T_ *dy, const T_ *x, const T_ *w, const T_ *mean,
                                 const T_ *rstd, int N, int C, int accumulate, void *ws) {
    if (N <= 0 || C <= 0) return;
    const size_t rpb = kc_ln_rows_per_block((size_t)N);
    const size_t nblocks = ((size_t)N + rpb - 1) / rpb;
    double *pw = dw ? (double *)ws : NULL;
    double *pb = db ? (double *)ws + (dw ? nblocks * (size_t)C : 0) : NULL;
    KC_N(kc_ln_bwd_ctx) c = {dx, pw, pb, dy, x, w, mean, rstd, (size_t)N, (size_t)C, rpb, accumulate != 0};
    kc_parallel_for(nblocks, kc_seq_grain(KC_GRAIN_HEAVY, rpb * (size_t)C), 1, KC_PICK(kc_ln_bwd_range)(), &c);
    if (dw) KC_N(kc_ln_combine)(dw, pw, nblocks, (size_t)C);
    if (db) KC_N(kc_ln_combine)(db, pb, nblocks, (size_t)C);
}

/* --------------------------------------------------- fused cross-entropy */

/* The rare row holding inf or NaN, in scalar libm arithmetic: -inf logits
 * get probability 0, NaN (or +inf) makes the row's loss and gradient NaN,
 * as the unfused computation would. Returns the row's loss. */
static double KC_N(kc_xent_row_slow)(T_ *l, size_t t, size_t V, size_t Vp, double gs) {
    T_ m = -INFINITY;
    for (size_t j = 0; j < V; j++)
        if (l[j] > m) m = l[j];
    double sum = 0.0;
    for (size_t j = 0; j < V; j++) sum += (double)KC_SEQ_EXP(l[j] - m);
    const double loss = log(sum) + (double)m - (double)l[t];
    if (gs != 0.0) {
        for (size_t j = 0; j < V; j++) {
            const double p = (double)KC_SEQ_EXP(l[j] - m) / sum;
            l[j] = (T_)(gs * (j == t ? p - 1.0 : p));
        }
        for (size_t j = V; j < Vp; j++) l[j] = 0;
    }
    return loss;
}

/* sum_j exp(l[j] - m) over [0, V) in double, eight fixed lanes; with
 * `store` the exponentials replace the logits (the softmax numerators).
 * Every l[j] - m is <= 0 and finite here. */
static KC_ALWAYS_INLINE double KC_N(kc_xent_expsum)(T_ *restrict l, size_t V, T_ m, int store) {
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t j = 0;
    for (; j + 8 <= V; j += 8)
        for (size_t k = 0; k < 8; k++) {
            const T_ e = KC_SEQ_EXP_NONPOS(l[j + k] - m);
            if (store) l[j + k] = e;
            s[k] += (double)e;
        }
    double sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; j < V; j++) {
        const T_ e = KC_SEQ_EXP_NONPOS(l[j] - m);
        if (store) l[j] = e;
        sum += (double)e;
    }
    return sum;
}

/*
 * The row max of l[0, V) and whether any element is inf or NaN, in one
 * pass. A float compare-select reduction does not vectorize (GCC keeps it
 * scalar: maxps differs from `a > b ? a : b` on NaN), so the max is taken
 * over integer keys that order like the values: the bits of a finite value,
 * with the magnitude bits flipped when negative (an involution, so the key
 * of the max maps back to it). The finite test is on the exponent bits.
 */
static KC_ALWAYS_INLINE T_ KC_N(kc_xent_rowmax)(const T_ *restrict l, size_t V, int *nonfinite) {
    KC_SEQ_IT m = KC_SEQ_IT_MIN, bad = 0;
    for (size_t j = 0; j < V; j++) {
        KC_SEQ_IT s;
        memcpy(&s, &l[j], sizeof s);
        const KC_SEQ_IT key = s ^ ((s >> KC_SEQ_SIGN_SHIFT) & KC_SEQ_MAG);
        m = key > m ? key : m;
        bad |= (KC_SEQ_IT)((s & KC_SEQ_EXP_BITS) == KC_SEQ_EXP_BITS);
    }
    *nonfinite = bad != 0;
    const KC_SEQ_IT s = m ^ ((m >> KC_SEQ_SIGN_SHIFT) & KC_SEQ_MAG);
    T_ v;
    memcpy(&v, &s, sizeof v);
    return v;
}

/*
 * One row with target t in [0, V): returns its loss, and with gs != 0
 * leaves gs * (softmax - onehot) in l[0, V) and 0 in l[V, Vp). Three passes:
 * the max (with the finiteness test), the exponentials and their sum
 * (stored in place when a gradient is wanted), then one scale. The target's
 * entry is formed in double from its own exponential, so p - 1 does not
 * cancel in the data type.
 */
static KC_ALWAYS_INLINE double KC_N(kc_xent_row)(T_ *restrict l, size_t t, size_t V, size_t Vp, double gs) {
    int nonfinite;
    const T_ m = KC_N(kc_xent_rowmax)(l, V, &nonfinite);
    size_t j;
    if (nonfinite) return KC_N(kc_xent_row_slow)(l, t, V, Vp, gs);
    const T_ lt = l[t];
    if (gs == 0.0) {
        const double sum = KC_N(kc_xent_expsum)(l, V, m, 0);
        return log(sum) + (double)m - (double)lt;
    }
    const double sum = KC_N(kc_xent_expsum)(l, V, m, 1);
    const T_ et = l[t];
    const T_ sc = (T_)(gs / sum);
    for (j = 0; j < V; j++) l[j] *= sc;
    l[t] = KM_(km_xent_target)(et, sum, gs);
    for (j = V; j < Vp; j++) l[j] = 0;
    return log(sum) + (double)m - (double)lt;
}

typedef struct {
    T_ *logits;             /* (N, Vp) */
    const int32_t *targets; /* (N) */
    size_t N, V, Vp, rpb;
    double gs;
    double part[KC_RED_MAX_BLOCKS]; /* per row block, written by its owner */
} KC_N(kc_xent_ctx);

/* Row blocks [b0, b1). */
static KC_ALWAYS_INLINE void KC_IMPL(kc_xent_range)(void *vc, size_t b0, size_t b1) {
    KC_N(kc_xent_ctx) *c = vc;
    for (size_t blk = b0; blk < b1; blk++) {
        const size_t r0 = blk * c->rpb, r1 = r0 + c->rpb < c->N ? r0 + c->rpb : c->N;
        double s = 0.0;
        for (size_t i = r0; i < r1; i++) {
            T_ *l = c->logits + i * c->Vp;
            const int32_t t = c->targets[i];
            if (t < 0) {
                if (c->gs != 0.0) memset(l, 0, c->Vp * sizeof *l);
                continue;
            }
            s += KC_N(kc_xent_row)(l, (size_t)t, c->V, c->Vp, c->gs);
        }
        c->part[blk] = s;
    }
}
KC_SEQ_DISPATCH(KC_N(kc_xent_range))

double KC_N(kc_xent_fused)(T_ *logits, const int32_t *targets, int N, int V, int Vp, double grad_scale) {
    if (N <= 0 || V <= 0) return 0.0;
    KC_N(kc_xent_ctx) c;
    c.logits = logits;
    c.targets = targets;
    c.N = (size_t)N;
    c.V = (size_t)V;
    c.Vp = (size_t)Vp;
    c.rpb = kc_xent_rows_per_block((size_t)N);
    c.gs = grad_scale;
    const size_t nblocks = ((size_t)N + c.rpb - 1) / c.rpb;
    /* an exp per element: the heavy grain */
    kc_parallel_for(nblocks, kc_seq_grain(KC_GRAIN_HEAVY, c.rpb * c.Vp), 1, KC_PICK(kc_xent_range)(), &c);
    double s = 0.0;
    for (size_t b = 0; b < nblocks; b++) s += c.part[b];
    return s;
}

/* ------------------------------------------------------------------- add */

typedef struct {
    T_ *y;
    const T_ *a, *b; /* (n) each */
} KC_N(kc_add_ctx);

/* y may be a or b: each aliasing case gets its own loop with restrict
 * pointers, so all of them vectorize without a runtime overlap test (which
 * would send the in-place residual add to the scalar fallback). */
static KC_ALWAYS_INLINE void KC_IMPL(kc_add_range)(void *vc, size_t i0, size_t i1) {
    const KC_N(kc_add_ctx) *c = vc;
    if (c->y == c->a && c->y == c->b) {
        T_ *restrict y = c->y;
        for (size_t i = i0; i < i1; i++) y[i] = y[i] + y[i];
    } else if (c->y == c->a) {
        T_ *restrict y = c->y;
        const T_ *restrict b = c->b;
        for (size_t i = i0; i < i1; i++) y[i] = y[i] + b[i];
    } else if (c->y == c->b) {
        T_ *restrict y = c->y;
        const T_ *restrict a = c->a;
        for (size_t i = i0; i < i1; i++) y[i] = a[i] + y[i];
    } else {
        T_ *restrict y = c->y;
        const T_ *restrict a = c->a, *restrict b = c->b;
        for (size_t i = i0; i < i1; i++) y[i] = a[i] + b[i];
    }
}
KC_SEQ_DISPATCH(KC_N(kc_add_range))

void KC_N(kc_add)(T_ *y, const T_ *a, const T_ *b, size_t n) {
    KC_N(kc_add_ctx) c = {y, a, b};
    kc_parallel_for(n, KC_GRAIN_STREAM, KC_ALIGN_FLOATS, KC_PICK(kc_add_range)(), &c);
}

#undef T_
#undef KM_
#endif /* KC_SEQ_T */
