/*
 * cpu_attn.c — CPU kernels for the ABI 1.4 causal self-attention entries
 * (layouts and contracts in cpu_attn.h). Per (batch, head) pair the forward
 * walks query tiles of KC_ATTN_TILE rows: S = Q_tile K[0:end]^T / sqrt(D) by
 * one GEMM over the keys the tile may see (the causal lower triangle's tiles
 * only: about half of the full T x T work), a max-subtracted row softmax
 * whose sum is taken in double, lse = max + log(sum), then O_tile = P V by a
 * second GEMM and a scaling of each row by 1/sum. The backward recomputes P
 * from the saved lse (flash-attention style: nothing T x T outlives a tile)
 * and per tile does dV += P^T dO, dP = dO V^T, Delta = rowsum(dO * O),
 * dS = P * (dP - Delta), dQ = dS K / sqrt(D), dK += dS^T Q / sqrt(D): five
 * GEMMs, two of which accumulate straight into dqkv's strided columns.
 *
 * Threads: the work items are the B * NH (batch, head) pairs; each is
 * computed entirely by one thread in a fixed order, so results are the same
 * bits at any thread count. The GEMMs are direct cblas calls with OpenBLAS
 * at one thread (as configure() sets it): kc_gemm would try to split over
 * the pool, which is already busy running these range bodies. Scratch: the
 * range body is not told its thread, so the kernel runs kc_parallel_for over
 * `parts` indices rather than over the items: index p owns workspace slot p
 * and the items [p * items / parts, (p + 1) * items / parts). Whatever
 * split the pool picks (or none, when it is busy), a slot is only ever used
 * by the thread running its index.
 *
 * The float32 and float64 kernels are one body written once: this file
 * includes itself twice with KC_ATTN_TEMPLATE set, once per element type.
 */
#ifndef KC_ATTN_TEMPLATE

#include "cpu_attn.h"

#include <cblas.h>
#include <math.h>

#include "cpu_internal.h"
#include "cpu_kernels.h"

/*
 * Query rows per tile. 64 keeps a tile's S (64 x T) in L2 up to T = 1024 and
 * each GEMM large enough for OpenBLAS's kernels (with D = 64: 64 x n x 64),
 * while the wasted upper half of each diagonal block (tile^2 / 2 scores) is
 * a third of the work at T = 128 and falls with T. Measured on the 2-vCPU
 * project machine with OpenBLAS's SkylakeX kernels: at T = 1024 64 ran
 * 5-30 % faster than 32 or 128 (32: more, smaller GEMMs; 128: more masked
 * waste); at T = 128 and 256 the three sizes were within the noise.
 */
#ifndef KC_ATTN_TILE /* a build may override it to measure another size */
#define KC_ATTN_TILE 64
#endif

static size_t kc_attn_tile(int T) { return (size_t)(T < KC_ATTN_TILE ? T : KC_ATTN_TILE); }

/* Per-part scratch: S or P (tile x T), for the backward dP too (tile x T),
 * and one value per tile row; whole cache lines so slots never share one. */
static size_t kc_attn_part_bytes(int backward, size_t elem_size, int T) {
    const size_t tile = kc_attn_tile(T);
    const size_t elems = (backward ? 2 : 1) * tile * (size_t)T + tile;
    return (elems * elem_size + 63) & ~(size_t)63;
}

size_t kc_attn_workspace_bytes(int backward, size_t elem_size, int T, int parts) {
    if (T <= 0 || parts <= 0) return 0;
    return (size_t)parts * kc_attn_part_bytes(backward, elem_size, T);
}

size_t kc_attn_workspace_bytes_for(int backward, size_t elem_size, int B, int T, int NH) {
    if (B <= 0 || NH <= 0) return 0;
    size_t parts = (size_t)kc_get_num_threads();
    const size_t items = (size_t)B * (size_t)NH;
    if (parts > items) parts = items;
    return kc_attn_workspace_bytes(backward, elem_size, T, (int)parts);
}

/* How many parts a call runs: one per thread, at most one per item, and no
 * more than the workspace has slots for; 0 when it has none. */
static size_t kc_attn_parts(size_t items, size_t part_bytes, size_t ws_bytes) {
    size_t parts = (size_t)kc_get_num_threads();
    if (parts > items) parts = items;
    if (parts > ws_bytes / part_bytes) parts = ws_bytes / part_bytes;
    return parts;
}

/*
 * exp(x) for the shifted scores x <= 0 (the backward's s - lse may exceed 0
 * by a rounding: that reads as 0, exp = 1). Below -87 the result would be
 * under FLT_MIN: it is flushed to 0, so no subnormal weight reaches the
 * GEMMs (each costs a microcode assist there) while the change is below
 * 2^-126 of a row sum that is at least 1. NaN passes through, so a NaN score
 * still poisons its row as the textbook softmax does.
 */
static KC_ALWAYS_INLINE float kc_attn_exp_f32(float x) {
    float e = km_exp_nonpos(x);
    e = x < -87.0f ? 0.0f : e;
    return x != x ? x : e;
}
static KC_ALWAYS_INLINE double kc_attn_exp_f64(double x) { return exp(x); }

/* rows x cols of x (leading dimension ld) rounded through float16 or
 * bfloat16 in place (round_dtype KC_F32: nothing). */
static KC_ALWAYS_INLINE void kc_attn_round_rows(float *x, size_t rows, size_t cols, size_t ld, int round_dtype) {
    if (round_dtype == KC_F16) {
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < cols; j++) x[r * ld + j] = kc_f16_value(kc_f16_bits(x[r * ld + j]));
    } else if (round_dtype == KC_BF16) {
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < cols; j++) x[r * ld + j] = kc_bf16_value(kc_bf16_bits(x[r * ld + j]));
    }
}

/* Expands its argument before KC_DISPATCHED_RANGE pastes onto it. */
#define KC_ATTN_DISPATCH(name) KC_DISPATCHED_RANGE(name)

#define KC_ATTN_TEMPLATE 1
#define KA_R float
#define KA(name) kc_attn_f32_##name
#define KA_GEMM kc_blas_sgemm
#define KA_EXP kc_attn_exp_f32
#define KA_IS_F32 1
#include "cpu_attn.c"
#undef KA_R
#undef KA
#undef KA_GEMM
#undef KA_EXP
#undef KA_IS_F32

#define KA_R double
#define KA(name) kc_attn_f64_##name
#define KA_GEMM kc_blas_dgemm
#define KA_EXP kc_attn_exp_f64
#define KA_IS_F32 0
#include "cpu_attn.c"
#undef KA_R
#undef KA
#undef KA_GEMM
#undef KA_EXP
#undef KA_IS_F32
#undef KC_ATTN_TEMPLATE

int kc_attn_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH, int round_dtype,
                    void *ws, size_t ws_bytes) {
    if (round_dtype != KC_F32 && round_dtype != KC_F16 && round_dtype != KC_BF16) return -1;
    return kc_attn_f32_fwd(out, lse, qkv, B, T, C, NH, round_dtype, ws, ws_bytes);
}

int kc_attn_forward_f64(double *out, double *lse, const double *qkv, int B, int T, int C, int NH, void *ws,
                        size_t ws_bytes) {
    return kc_attn_f64_fwd(out, lse, qkv, B, T, C, NH, KC_F32, ws, ws_bytes);
}

int kc_attn_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse, int B,
                     int T, int C, int NH, int round_dtype, void *ws, size_t ws_bytes) {
    if (round_dtype != KC_F32 && round_dtype != KC_F16 && round_dtype != KC_BF16) return -1;
    return kc_attn_f32_bwd(dqkv, dout, qkv, out, lse, B, T, C, NH, round_dtype, ws, ws_bytes);
}

int kc_attn_backward_f64(double *dqkv, const double *dout, const double *qkv, const double *out,
                         const double *lse, int B, int T, int C, int NH, void *ws, size_t ws_bytes) {
    return kc_attn_f64_bwd(dqkv, dout, qkv, out, lse, B, T, C, NH, KC_F32, ws, ws_bytes);
}

/* ------------------------------------------------------------ references */

/* Row i's softmax over keys 0..i of head h of batch b, normalised, into
 * p[0..i]; returns the log-sum-exp. q, k: the head's columns of the batch's
 * qkv rows (leading dimension 3C). */
static double kc_attn_ref_row(double *p, const double *q, const double *k, size_t ld, int i, int D) {
    const double scale = 1.0 / sqrt((double)D);
    double mx = -INFINITY;
    for (int j = 0; j <= i; j++) {
        double s = 0.0;
        for (int d = 0; d < D; d++) s += q[(size_t)i * ld + (size_t)d] * k[(size_t)j * ld + (size_t)d];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
    }
    double sum = 0.0;
    for (int j = 0; j <= i; j++) {
        p[j] = exp(p[j] - mx);
        sum += p[j];
    }
    for (int j = 0; j <= i; j++) p[j] /= sum;
    return mx + log(sum);
}

void kc_attn_forward_ref(double *out, double *lse, const double *qkv, int B, int T, int C, int NH,
                         double *scratch) {
    const int D = C / NH;
    const size_t ld = 3 * (size_t)C;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const double *q = qkv + (size_t)b * (size_t)T * ld + (size_t)h * (size_t)D;
            const double *k = q + C, *v = q + 2 * (size_t)C;
            for (int i = 0; i < T; i++) {
                lse[((size_t)b * (size_t)NH + (size_t)h) * (size_t)T + (size_t)i] =
                    kc_attn_ref_row(scratch, q, k, ld, i, D);
                double *o = out + ((size_t)b * (size_t)T + (size_t)i) * (size_t)C + (size_t)h * (size_t)D;
                for (int d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int j = 0; j <= i; j++) acc += scratch[j] * v[(size_t)j * ld + (size_t)d];
                    o[d] = acc;
                }
            }
        }
}

void kc_attn_backward_ref(double *dqkv, const double *dout, const double *qkv, int B, int T, int C, int NH,
                          double *scratch) {
    const int D = C / NH;
    const size_t ld = 3 * (size_t)C;
    const double scale = 1.0 / sqrt((double)D);
    for (size_t i = 0; i < (size_t)B * (size_t)T * ld; i++) dqkv[i] = 0.0;
    double *p = scratch, *dp = scratch + T;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t off = (size_t)b * (size_t)T * ld + (size_t)h * (size_t)D;
            const double *q = qkv + off, *k = q + C, *v = q + 2 * (size_t)C;
            double *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * (size_t)C;
            for (int i = 0; i < T; i++) {
                const double *g = dout + ((size_t)b * (size_t)T + (size_t)i) * (size_t)C + (size_t)h * (size_t)D;
                kc_attn_ref_row(p, q, k, ld, i, D);
                double delta = 0.0;
                for (int j = 0; j <= i; j++) {
                    double s = 0.0;
                    for (int d = 0; d < D; d++) s += g[d] * v[(size_t)j * ld + (size_t)d];
                    dp[j] = s;
                    delta += p[j] * s;
                }
                for (int j = 0; j <= i; j++) {
                    const double ds = p[j] * (dp[j] - delta) * scale;
                    for (int d = 0; d < D; d++) {
                        dq[(size_t)i * ld + (size_t)d] += ds * k[(size_t)j * ld + (size_t)d];
                        dk[(size_t)j * ld + (size_t)d] += ds * q[(size_t)i * ld + (size_t)d];
                        dv[(size_t)j * ld + (size_t)d] += p[j] * g[d];
                    }
                }
            }
        }
}

#else /* KC_ATTN_TEMPLATE: the kernels for element type KA_R */

typedef struct {
    KA_R *out, *lse, *dqkv;                    /* outputs (forward: out, lse; backward: dqkv) */
    const KA_R *qkv, *dout, *o, *lse_in;       /* inputs (backward: dout, o = out, lse_in)     */
    int T, C, NH, D, round_dtype;
    KA_R scale;
    size_t items, parts, part_bytes, tile;
    char *ws;
} KA(ctx);

/* max of x[0..n): eight independent lanes (a < b ? b : a is exactly the
 * vector max instruction, so this vectorizes without fast-math). */
static KC_ALWAYS_INLINE KA_R KA(row_max)(const KA_R *restrict x, size_t n) {
    KA_R m[8];
    for (int u = 0; u < 8; u++) m[u] = -INFINITY;
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) m[u] = m[u] < x[j + u] ? x[j + u] : m[u];
    for (; j < n; j++) m[0] = m[0] < x[j] ? x[j] : m[0];
    KA_R r = m[0];
    for (int u = 1; u < 8; u++) r = r < m[u] ? m[u] : r;
    return r;
}

/* sum of x[0..n) in double: eight lanes in a fixed order (vectorizable,
 * and the same bits whichever thread runs it). */
static KC_ALWAYS_INLINE double KA(row_sum)(const KA_R *restrict x, size_t n) {
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) s[u] += (double)x[j + u];
    for (; j < n; j++) s[0] += (double)x[j];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* sum of a[0..n) * b[0..n) in double, the same way. */
static KC_ALWAYS_INLINE double KA(dot)(const KA_R *restrict a, const KA_R *restrict b, size_t n) {
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) s[u] += (double)a[j + u] * (double)b[j + u];
    for (; j < n; j++) s[0] += (double)a[j] * (double)b[j];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* Forward of one (batch, head) pair. S: tile x T scratch, rinv: tile. */
static KC_ALWAYS_INLINE void KA(fwd_pair)(const KA(ctx) *c, size_t bh, KA_R *restrict S,
                                                  KA_R *restrict rinv) {
    const size_t T = (size_t)c->T, C = (size_t)c->C, D = (size_t)c->D, ld = 3 * C;
    const size_t b = bh / (size_t)c->NH, h = bh % (size_t)c->NH;
    const KA_R *q = c->qkv + b * T * ld + h * D, *k = q + C, *v = q + 2 * C;
    KA_R *o = c->out + b * T * C + h * D;
    KA_R *lse = c->lse + bh * T;
    for (size_t i0 = 0; i0 < T; i0 += c->tile) {
        const size_t m = T - i0 < c->tile ? T - i0 : c->tile, n = i0 + m;
        /* S (m, n) = scale * Q[i0:i0+m] K[0:n]^T */
        KA_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)D, c->scale, q + i0 * ld, (int)ld, k,
                (int)ld, 0, S, (int)n);
        for (size_t r = 0; r < m; r++) {
            KA_R *restrict s = S + r * n;
            const size_t len = i0 + r + 1; /* keys 0..i0+r: the causal mask */
            const KA_R mx = KA(row_max)(s, len);
            for (size_t j = 0; j < len; j++) s[j] = KA_EXP(s[j] - mx);
            for (size_t j = len; j < n; j++) s[j] = 0;
            const double sum = KA(row_sum)(s, len);
            lse[i0 + r] = (KA_R)((double)mx + log(sum));
            rinv[r] = (KA_R)(1.0 / sum);
        }
        /* O (m, D) = P V[0:n], unnormalised; each row then scaled by 1/sum
         * (m x D multiplies instead of m x n for normalising P). */
        KA_R *ot = o + i0 * C;
        KA_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)D, (int)n, 1, S, (int)n, v, (int)ld, 0, ot,
                (int)C);
        for (size_t r = 0; r < m; r++) {
            KA_R *restrict orow = ot + r * C;
            const KA_R ri = rinv[r];
            for (size_t d = 0; d < D; d++) orow[d] *= ri;
        }
#if KA_IS_F32
        kc_attn_round_rows(ot, m, D, C, c->round_dtype);
#endif
    }
}

static KC_ALWAYS_INLINE void KA(fwd_range_impl)(void *vc, size_t p0, size_t p1) {
    const KA(ctx) *c = vc;
    for (size_t p = p0; p < p1; p++) {
        KA_R *S = (KA_R *)(void *)(c->ws + p * c->part_bytes);
        KA_R *rinv = S + c->tile * (size_t)c->T;
        for (size_t bh = p * c->items / c->parts; bh < (p + 1) * c->items / c->parts; bh++)
            KA(fwd_pair)(c, bh, S, rinv);
    }
}
KC_ATTN_DISPATCH(KA(fwd_range))

/* Backward of one (batch, head) pair. P, dS: tile x T scratch, delta: tile. */
static KC_ALWAYS_INLINE void KA(bwd_pair)(const KA(ctx) *c, size_t bh, KA_R *restrict P,
                                                  KA_R *restrict dS, KA_R *restrict delta) {
    const size_t T = (size_t)c->T, C = (size_t)c->C, D = (size_t)c->D, ld = 3 * C;
    const size_t b = bh / (size_t)c->NH, h = bh % (size_t)c->NH;
    const size_t off = b * T * ld + h * D;
    const KA_R *q = c->qkv + off, *k = q + C, *v = q + 2 * C;
    KA_R *dq = c->dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
    const KA_R *g = c->dout + b * T * C + h * D, *o = c->o + b * T * C + h * D;
    const KA_R *lse = c->lse_in + bh * T;
    /* dK and dV accumulate over the query tiles: start from 0 (dqkv is
     * overwritten, never added to); dQ is written whole per tile. */
    for (size_t t = 0; t < T; t++)
        for (size_t d = 0; d < D; d++) dk[t * ld + d] = dv[t * ld + d] = 0;
    for (size_t i0 = 0; i0 < T; i0 += c->tile) {
        const size_t m = T - i0 < c->tile ? T - i0 : c->tile, n = i0 + m;
        /* P (m, n) = exp(scale * Q K^T - lse), recomputed; 0 above the diagonal */
        KA_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)D, c->scale, q + i0 * ld, (int)ld, k,
                (int)ld, 0, P, (int)n);
        for (size_t r = 0; r < m; r++) {
            KA_R *restrict p = P + r * n;
            const size_t len = i0 + r + 1;
            const KA_R l = lse[i0 + r];
            for (size_t j = 0; j < len; j++) p[j] = KA_EXP(p[j] - l);
            for (size_t j = len; j < n; j++) p[j] = 0;
            /* Delta_i = sum_j P_ij dP_ij = dO_i . O_i (the forward's out) */
            delta[r] = (KA_R)KA(dot)(g + (i0 + r) * C, o + (i0 + r) * C, D);
        }
        /* dV[0:n] += P^T dO_tile */
        KA_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)D, (int)m, 1, P, (int)n, g + i0 * C, (int)C, 1,
                dv, (int)ld);
        /* dP (m, n) = dO_tile V[0:n]^T, then dS = P * (dP - Delta) in place */
        KA_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)D, 1, g + i0 * C, (int)C, v, (int)ld,
                0, dS, (int)n);
        for (size_t r = 0; r < m; r++) {
            const KA_R *restrict p = P + r * n;
            KA_R *restrict ds = dS + r * n;
            const size_t len = i0 + r + 1;
            const KA_R dl = delta[r];
            for (size_t j = 0; j < len; j++) ds[j] = p[j] * (ds[j] - dl);
            for (size_t j = len; j < n; j++) ds[j] = 0;
        }
        /* dQ_tile = scale * dS K[0:n];  dK[0:n] += scale * dS^T Q_tile */
        KA_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)D, (int)n, c->scale, dS, (int)n, k, (int)ld,
                0, dq + i0 * ld, (int)ld);
        KA_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)n, (int)D, (int)m, c->scale, dS, (int)n, q + i0 * ld,
                (int)ld, 1, dk, (int)ld);
    }
#if KA_IS_F32
    kc_attn_round_rows(dq, T, D, ld, c->round_dtype);
    kc_attn_round_rows(dk, T, D, ld, c->round_dtype);
    kc_attn_round_rows(dv, T, D, ld, c->round_dtype);
#endif
}

static KC_ALWAYS_INLINE void KA(bwd_range_impl)(void *vc, size_t p0, size_t p1) {
    const KA(ctx) *c = vc;
    for (size_t p = p0; p < p1; p++) {
        KA_R *P = (KA_R *)(void *)(c->ws + p * c->part_bytes);
        KA_R *dS = P + c->tile * (size_t)c->T;
        KA_R *delta = dS + c->tile * (size_t)c->T;
        for (size_t bh = p * c->items / c->parts; bh < (p + 1) * c->items / c->parts; bh++)
            KA(bwd_pair)(c, bh, P, dS, delta);
    }
}
KC_ATTN_DISPATCH(KA(bwd_range))

static int KA(fwd)(KA_R *out, KA_R *lse, const KA_R *qkv, int B, int T, int C, int NH, int round_dtype,
                           void *ws, size_t ws_bytes) {
    const size_t items = (size_t)B * (size_t)NH, pb = kc_attn_part_bytes(0, sizeof(KA_R), T);
    const size_t parts = kc_attn_parts(items, pb, ws_bytes);
    if (parts == 0 || !ws) return -1;
    const int D = C / NH;
    KA(ctx) c = {.out = out, .lse = lse, .qkv = qkv, .T = T, .C = C, .NH = NH, .D = D,
                         .round_dtype = round_dtype, .scale = (KA_R)(1.0 / sqrt((double)D)), .items = items,
                         .parts = parts, .part_bytes = pb, .tile = kc_attn_tile(T), .ws = ws};
    kc_parallel_for(parts, 1, 1, KA(fwd_range_pick)(), &c);
    return 0;
}

static int KA(bwd)(KA_R *dqkv, const KA_R *dout, const KA_R *qkv, const KA_R *out, const KA_R *lse, int B,
                           int T, int C, int NH, int round_dtype, void *ws, size_t ws_bytes) {
    const size_t items = (size_t)B * (size_t)NH, pb = kc_attn_part_bytes(1, sizeof(KA_R), T);
    const size_t parts = kc_attn_parts(items, pb, ws_bytes);
    if (parts == 0 || !ws) return -1;
    const int D = C / NH;
    KA(ctx) c = {.dqkv = dqkv, .qkv = qkv, .dout = dout, .o = out, .lse_in = lse, .T = T, .C = C,
                         .NH = NH, .D = D, .round_dtype = round_dtype, .scale = (KA_R)(1.0 / sqrt((double)D)),
                         .items = items, .parts = parts, .part_bytes = pb, .tile = kc_attn_tile(T), .ws = ws};
    kc_parallel_for(parts, 1, 1, KA(bwd_range_pick)(), &c);
    return 0;
}

#endif /* KC_ATTN_TEMPLATE */
