/*
 * cpu_f64.c: float64 versions of the training kernels (bias add and its
 * gradient, ReLU and GELU forward/backward, fused softmax + cross-entropy,
 * sum of squares, the finiteness check, scale, axpy, and the SGD / AdamW
 * updates), for a "64-true" precision that keeps master weights, gradients
 * and activations in double, as PyTorch does for a .double() model. Each has
 * the float version's contract and order of operations (see cpu_kernels.h and
 * the float sources), with the scalars used as the doubles they are. The
 * loops are plain double arithmetic over restrict pointers, which GCC
 * vectorizes at -O3, except GELU and the loss, which call libm's exp/log
 * (accurate in double; no inlined polynomial is needed at this precision).
 * Large loops split across the pool exactly as the float ones do: elementwise
 * work by contiguous ranges, reductions and the loss by blocks whose size
 * depends on n (or B) only, so no result depends on the thread count.
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"
#include "../common/km_optim.h"

#include <math.h>

/* Streaming loops move 8 bytes per element, twice a float's: half the
 * float grain keeps the bytes per thread the same. 8 doubles = 64 bytes, so
 * range boundaries on multiples of 8 keep threads' outputs on separate cache
 * lines. */
#define KC64_GRAIN_STREAM (KC_GRAIN_STREAM / 2)
#define KC64_ALIGN ((size_t)8)

typedef struct {
    double *out;       /* (n) output */
    const double *in;  /* (n) first input (x, or dy) */
    const double *in2; /* (n) second input (x for backwards), else NULL */
    double a;          /* scalar operand */
} kc64_ew_ctx;

/* -------------------------------------------------------------- bias */

typedef struct {
    double *y;       /* (rows, cols) */
    const double *b; /* (cols) */
    size_t cols;
} kc64_bias_add_ctx;

/* Rows [r0, r1). */
static void kc64_bias_add_range(void *vc, size_t r0, size_t r1) {
    const kc64_bias_add_ctx *c = vc;
    const double *restrict b = c->b;
    for (size_t r = r0; r < r1; r++) {
        double *restrict y = c->y + r * c->cols;
        for (size_t j = 0; j < c->cols; j++) y[j] += b[j];
    }
}

void kc_bias_add_f64(double *y, const double *b, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    kc64_bias_add_ctx c = {y, b, (size_t)cols};
    const size_t grain = KC64_GRAIN_STREAM / (size_t)cols;
    kc_parallel_for((size_t)rows, grain ? grain : 1, 1, kc64_bias_add_range, &c);
}

typedef struct {
    double *db;       /* (cols) */
    const double *dy; /* (rows, cols) */
    size_t rows, cols;
    int accumulate;
} kc64_bias_grad_ctx;

/* Columns [j0, j1), rows summed in order 0..rows-1 whichever thread owns
 * the column. */
static void kc64_bias_grad_range(void *vc, size_t j0, size_t j1) {
    const kc64_bias_grad_ctx *c = vc;
    double *restrict db = c->db + j0;
    const size_t w = j1 - j0;
    if (!c->accumulate)
        for (size_t j = 0; j < w; j++) db[j] = 0.0;
    for (size_t r = 0; r < c->rows; r++) {
        const double *restrict dy = c->dy + r * c->cols + j0;
        for (size_t j = 0; j < w; j++) db[j] += dy[j];
    }
}

void kc_bias_grad_f64(double *db, const double *dy, int rows, int cols, int accumulate) {
    if (cols <= 0) return;
    if (rows < 0) rows = 0;
    kc64_bias_grad_ctx c = {db, dy, (size_t)rows, (size_t)cols, accumulate};
    size_t grain = rows ? KC64_GRAIN_STREAM / (size_t)rows : (size_t)cols;
    if (grain < 32) grain = 32; /* strips of at least 4 cache lines */
    kc_parallel_for((size_t)cols, grain, KC64_ALIGN, kc64_bias_grad_range, &c);
}

/* -------------------------------------------------------------- ReLU */

/* x < 0 ? 0 : x keeps NaN, as torch.relu does. Separate in-place bodies keep
 * restrict on the out-of-place ones (see cpu_elementwise.c). */
static void kc64_relu_fwd_range(void *vc, size_t i0, size_t i1) {
    const kc64_ew_ctx *c = vc;
    const size_t n = i1 - i0;
    if (c->out == c->in) {
        double *restrict y = c->out + i0;
        for (size_t i = 0; i < n; i++) y[i] = y[i] < 0.0 ? 0.0 : y[i];
    } else {
        double *restrict y = c->out + i0;
        const double *restrict x = c->in + i0;
        for (size_t i = 0; i < n; i++) y[i] = x[i] < 0.0 ? 0.0 : x[i];
    }
}

void kc_relu_forward_f64(double *y, const double *x, size_t n) {
    kc64_ew_ctx c = {y, x, NULL, 0.0};
    kc_parallel_for(n, KC64_GRAIN_STREAM, KC64_ALIGN, kc64_relu_fwd_range, &c);
}

/* dx = x > 0 ? dy : 0 (NaN x gives 0). */
static void kc64_relu_bwd_range(void *vc, size_t i0, size_t i1) {
    const kc64_ew_ctx *c = vc;
    const size_t n = i1 - i0;
    const double *restrict x = c->in2 + i0;
    if (c->out == c->in) {
        double *restrict d = c->out + i0;
        for (size_t i = 0; i < n; i++) d[i] = x[i] > 0.0 ? d[i] : 0.0;
    } else {
        double *restrict dx = c->out + i0;
        const double *restrict dy = c->in + i0;
        for (size_t i = 0; i < n; i++) {
            const double d = dy[i];
            dx[i] = x[i] > 0.0 ? d : 0.0;
        }
    }
}

void kc_relu_backward_f64(double *dx, const double *dy, const double *x, size_t n) {
    kc64_ew_ctx c = {dx, dy, x, 0.0};
    kc_parallel_for(n, KC64_GRAIN_STREAM, KC64_ALIGN, kc64_relu_bwd_range, &c);
}

/* -------------------------------------------------------------- GELU */

/* GELU tanh-approximation constants in double: sqrt(2/pi) and 0.044715. */
#define KC64_GELU_BETA 0.79788456080286535588
#define KC64_GELU_KAPPA 0.044715

/* gelu(x) = x * sigmoid(2u) = 0.5 x (1 + tanh u), u = beta (x + kappa x^3):
 * the float version's form. For very negative x, exp overflows to inf and
 * x / inf gives -0, the correct limit. NaN propagates through u. */
static inline double kc64_gelu_one(double x) {
    const double u = KC64_GELU_BETA * (x + KC64_GELU_KAPPA * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}

/* s + x * 2 s (1 - s) du/dx with s = sigmoid(2u) = 1 / (1 + e^t), t = -2u.
 * Unlike the float version (whose exp is clamped), libm's exp overflows for
 * x below about -21, where e * s would be inf * 0 = NaN; so s and 1 - s come
 * from exp(-|t|), which never overflows, each without cancellation. Far in
 * the negative tail s underflows to 0 and so does the derivative (its true
 * value is below 1e-300). */
static inline double kc64_gelu_grad_one(double x) {
    const double x2 = x * x;
    const double u = KC64_GELU_BETA * (x + KC64_GELU_KAPPA * x2 * x);
    const double t = -2.0 * u;
    const double e = exp(-fabs(t)); /* (0, 1] */
    const double r = 1.0 / (1.0 + e);
    const double s = t > 0.0 ? e * r : r;
    const double one_minus_s = t > 0.0 ? r : e * r;
    const double du = KC64_GELU_BETA * (1.0 + 3.0 * KC64_GELU_KAPPA * x2);
    return s + 2.0 * x * du * one_minus_s * s;
}

static void kc64_gelu_fwd_range(void *vc, size_t i0, size_t i1) {
    const kc64_ew_ctx *c = vc;
    /* y[i] depends on x[i] only, so one loop serves in place too. */
    for (size_t i = i0; i < i1; i++) c->out[i] = kc64_gelu_one(c->in[i]);
}

void kc_gelu_forward_f64(double *y, const double *x, size_t n) {
    kc64_ew_ctx c = {y, x, NULL, 0.0};
    kc_parallel_for(n, KC_GRAIN_HEAVY, KC64_ALIGN, kc64_gelu_fwd_range, &c);
}

static void kc64_gelu_bwd_range(void *vc, size_t i0, size_t i1) {
    const kc64_ew_ctx *c = vc;
    for (size_t i = i0; i < i1; i++) c->out[i] = c->in[i] * kc64_gelu_grad_one(c->in2[i]);
}

void kc_gelu_backward_f64(double *dx, const double *dy, const double *x, size_t n) {
    kc64_ew_ctx c = {dx, dy, x, 0.0};
    kc_parallel_for(n, KC_GRAIN_HEAVY, KC64_ALIGN, kc64_gelu_bwd_range, &c);
}

/* -------------------------------------------------------------- loss */

typedef struct {
    double *probs;         /* (B, C) */
    const double *logits;  /* (B, C) */
    const int32_t *labels; /* (B) */
    size_t B, C;
    size_t rows_per_block; /* depends on B only */
    double loss[KC_RED_MAX_BLOCKS];
    int correct[KC_RED_MAX_BLOCKS];
    int bad[KC_RED_MAX_BLOCKS];
} kc64_xent_ctx;

/* One row: p = softmax(l) with the max subtracted; returns -log p[y] as
 * log(sum exp(l - max)) - (l[y] - max), or NAN for a label outside [0, C);
 * *hit = 1 when the first argmax equals y. l, p: (C), not overlapping. */
static double kc64_xent_row(double *restrict p, const double *restrict l, int32_t y, size_t C, int *hit) {
    double mx = l[0];
    size_t arg = 0;
    for (size_t j = 1; j < C; j++) {
        if (l[j] > mx) {
            mx = l[j];
            arg = j;
        }
    }
    double denom = 0.0;
    for (size_t j = 0; j < C; j++) {
        const double e = exp(l[j] - mx);
        p[j] = e;
        denom += e;
    }
    for (size_t j = 0; j < C; j++) p[j] /= denom;
    *hit = 0;
    if (y < 0 || (size_t)y >= C) return NAN;
    *hit = arg == (size_t)y;
    return log(denom) - (l[y] - mx);
}

/* Row blocks [b0, b1). */
static void kc64_xent_fwd_range(void *vc, size_t b0, size_t b1) {
    kc64_xent_ctx *c = vc;
    for (size_t b = b0; b < b1; b++) {
        const size_t r0 = b * c->rows_per_block;
        const size_t r1 = r0 + c->rows_per_block < c->B ? r0 + c->rows_per_block : c->B;
        double loss = 0.0;
        int correct = 0, bad = 0;
        for (size_t i = r0; i < r1; i++) {
            int hit;
            const double li = kc64_xent_row(c->probs + i * c->C, c->logits + i * c->C, c->labels[i], c->C, &hit);
            if (c->labels[i] < 0 || (size_t)c->labels[i] >= c->C) {
                bad = 1; /* probs of the row are filled; the result is NAN */
                continue;
            }
            loss += li;
            correct += hit;
        }
        c->loss[b] = loss;
        c->correct[b] = correct;
        c->bad[b] = bad;
    }
}

double kc_softmax_xent_forward_f64(double *probs, const double *logits, const int32_t *labels,
                                   int B, int C, int *n_correct) {
    if (n_correct) *n_correct = 0;
    if (B < 1 || C < 1) return NAN;
    kc64_xent_ctx c; /* ~5 KiB of per-block partials, on the stack */
    c.probs = probs;
    c.logits = logits;
    c.labels = labels;
    c.B = (size_t)B;
    c.C = (size_t)C;
    c.rows_per_block = (c.B + KC_RED_MAX_BLOCKS - 1) / KC_RED_MAX_BLOCKS;
    const size_t nblocks = (c.B + c.rows_per_block - 1) / c.rows_per_block;
    const size_t per_block = c.rows_per_block * c.C;
    const size_t grain = (KC_GRAIN_HEAVY + per_block - 1) / per_block;
    kc_parallel_for(nblocks, grain, 1, kc64_xent_fwd_range, &c);
    double loss = 0.0;
    int correct = 0, bad = 0;
    for (size_t b = 0; b < nblocks; b++) {
        loss += c.loss[b];
        correct += c.correct[b];
        bad |= c.bad[b];
    }
    if (n_correct) *n_correct = correct;
    return bad ? NAN : loss / (double)B;
}

typedef struct {
    double *dlogits;       /* (B, C), may equal probs */
    const double *probs;   /* (B, C) */
    const int32_t *labels; /* (B) */
    size_t C;
    double scale;          /* dloss / B */
} kc64_xent_bwd_ctx;

/* Rows [r0, r1); p[y] is read before the row is written, so dlogits may
 * equal probs (hence no restrict). */
static void kc64_xent_bwd_range(void *vc, size_t r0, size_t r1) {
    const kc64_xent_bwd_ctx *c = vc;
    const size_t C = c->C;
    for (size_t i = r0; i < r1; i++) {
        double *d = c->dlogits + i * C;
        const double *p = c->probs + i * C;
        const int32_t y = c->labels[i];
        if (y < 0 || (size_t)y >= C) {
            for (size_t j = 0; j < C; j++) d[j] = NAN;
            continue;
        }
        const double py = p[y];
        for (size_t j = 0; j < C; j++) d[j] = c->scale * p[j];
        d[y] = c->scale * (py - 1.0);
    }
}

void kc_softmax_xent_backward_f64(double *dlogits, const double *probs, const int32_t *labels,
                                  int B, int C, double dloss) {
    if (B < 1 || C < 1) return;
    kc64_xent_bwd_ctx c = {dlogits, probs, labels, (size_t)C, dloss / (double)B};
    const size_t grain = (KC64_GRAIN_STREAM + (size_t)C - 1) / (size_t)C;
    kc_parallel_for((size_t)B, grain, 1, kc64_xent_bwd_range, &c);
}

/* ----------------------------------------------- reductions, BLAS-1 */

typedef struct {
    const double *x; /* (n) */
    size_t n, bs;    /* bs from kc_red_block_size(n) */
    int nonfinite;   /* 0: sum of squares; 1: count of non-finite blocks */
    double partial[KC_RED_MAX_BLOCKS];
} kc64_red_ctx;

/* Eight fixed lanes (vectorizable, order defined by n only), as in
 * cpu_elementwise.c's kc_block_sumsq. */
static double kc64_block_sumsq(const double *restrict x, size_t n) {
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) a[j] += x[i + j] * x[i + j];
    double s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (; i < n; i++) s += x[i] * x[i];
    return s;
}

/* 1 if the block holds a NaN or an infinity (all exponent bits set). */
static int kc64_block_nonfinite(const double *restrict x, size_t n) {
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (uint64_t)((u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull);
    }
    return bad != 0;
}

static void kc64_red_range(void *vc, size_t b0, size_t b1) {
    kc64_red_ctx *c = vc;
    for (size_t b = b0; b < b1; b++) {
        const size_t i0 = b * c->bs;
        const size_t len = i0 + c->bs <= c->n ? c->bs : c->n - i0;
        c->partial[b] = c->nonfinite ? kc64_block_nonfinite(c->x + i0, len) : kc64_block_sumsq(c->x + i0, len);
    }
}

static double kc64_reduce(const double *x, size_t n, int nonfinite) {
    if (n == 0) return 0.0;
    kc64_red_ctx c;
    c.x = x;
    c.n = n;
    c.bs = kc_red_block_size(n);
    c.nonfinite = nonfinite;
    const size_t nblocks = (n + c.bs - 1) / c.bs;
    kc_parallel_for(nblocks, 2, 1, kc64_red_range, &c);
    double s = 0.0;
    for (size_t b = 0; b < nblocks; b++) s += c.partial[b];
    return s;
}

double kc_sumsq_f64(const double *x, size_t n) { return kc64_reduce(x, n, 0); }

int kc_all_finite_f64(const double *x, size_t n) { return kc64_reduce(x, n, 1) == 0.0; }

static void kc64_scale_range(void *vc, size_t i0, size_t i1) {
    const kc64_ew_ctx *c = vc;
    double *restrict x = c->out + i0;
    const double a = c->a;
    for (size_t i = 0; i < i1 - i0; i++) x[i] = x[i] * a;
}

void kc_scale_f64(double *x, double a, size_t n) {
    kc64_ew_ctx c = {x, NULL, NULL, a};
    kc_parallel_for(n, KC64_GRAIN_STREAM, KC64_ALIGN, kc64_scale_range, &c);
}

/* y + a * x: the product rounded, then added (no FMA: -ffp-contract=off). */
static void kc64_axpy_range(void *vc, size_t i0, size_t i1) {
    const kc64_ew_ctx *c = vc;
    double *restrict y = c->out + i0;
    const double *restrict x = c->in + i0;
    const double a = c->a;
    for (size_t i = 0; i < i1 - i0; i++) y[i] = y[i] + a * x[i];
}

void kc_axpy_f64(double *y, double a, const double *x, size_t n) {
    kc64_ew_ctx c = {y, x, NULL, a};
    kc_parallel_for(n, KC64_GRAIN_STREAM, KC64_ALIGN, kc64_axpy_range, &c);
}

/* --------------------------------------------------------------- SGD */

enum { KC64_SGD_WD = 1, KC64_SGD_MOM = 2, KC64_SGD_FIRST = 4, KC64_SGD_NEST = 8 };

typedef struct {
    double *p;       /* (n) */
    const double *g; /* (n) */
    double *buf;     /* (n), or NULL without momentum */
    double neg_lr, momentum, one_minus_damp, wd;
    int mode;        /* KC64_SGD_* bits, normalised as in kc_sgd_update */
} kc64_sgd_ctx;

/* torch.optim.SGD's order, per element (see kc_sgd_loop in cpu_optim.c):
 *   d = g + wd * p;  b = first ? d : mom * b + omd * d;
 *   d = nest ? d + mom * b : b;  p = p + (-lr) * d
 * The flags are constants at each call site, so each instance is
 * branch-free after inlining. */
static KC_ALWAYS_INLINE void kc64_sgd_loop(double *restrict p, const double *restrict g, double *restrict buf,
                                           size_t n, double neg_lr, double mom, double omd, double wd,
                                           const int has_wd, const int has_mom, const int first,
                                           const int nest) {
    for (size_t i = 0; i < n; i++) {
        double d = g[i];
        if (has_wd) d = d + wd * p[i];
        if (has_mom) {
            const double b = first ? d : mom * buf[i] + omd * d;
            buf[i] = b;
            d = nest ? d + mom * b : b;
        }
        p[i] = p[i] + neg_lr * d;
    }
}

static void kc64_sgd_range(void *vc, size_t i0, size_t i1) {
    const kc64_sgd_ctx *c = vc;
    double *p = c->p + i0;
    const double *g = c->g + i0;
    double *buf = c->buf ? c->buf + i0 : NULL;
    const size_t n = i1 - i0;
    const double lr = c->neg_lr, mo = c->momentum, od = c->one_minus_damp, wd = c->wd;
#define KC64_SGD_CASE(WD, MOM, FIRST, NEST)                                                              \
    case (WD) * KC64_SGD_WD + (MOM) * KC64_SGD_MOM + (FIRST) * KC64_SGD_FIRST + (NEST) * KC64_SGD_NEST: \
        kc64_sgd_loop(p, g, buf, n, lr, mo, od, wd, WD, MOM, FIRST, NEST);                              \
        break;
    switch (c->mode) {
        KC64_SGD_CASE(0, 0, 0, 0)
        KC64_SGD_CASE(1, 0, 0, 0)
        KC64_SGD_CASE(0, 1, 0, 0)
        KC64_SGD_CASE(1, 1, 0, 0)
        KC64_SGD_CASE(0, 1, 1, 0)
        KC64_SGD_CASE(1, 1, 1, 0)
        KC64_SGD_CASE(0, 1, 0, 1)
        KC64_SGD_CASE(1, 1, 0, 1)
        KC64_SGD_CASE(0, 1, 1, 1)
        KC64_SGD_CASE(1, 1, 1, 1)
    default: break; /* unreachable: mode is normalised below */
    }
#undef KC64_SGD_CASE
}

void kc_sgd_update_f64(double *p, const double *g, double *momentum_buf, size_t n,
                       double lr, double momentum, double dampening, int nesterov,
                       double weight_decay, int first_step) {
    if (n == 0) return;
    const km_sgd_coef_f64 k = /* kernels/common/km_optim.h */
        km_sgd_coef_f64_make(lr, momentum, dampening, nesterov, weight_decay, first_step, momentum_buf != NULL);
    kc64_sgd_ctx c;
    c.p = p;
    c.g = g;
    c.buf = momentum_buf;
    c.neg_lr = k.neg_lr;
    c.momentum = k.momentum;
    c.one_minus_damp = k.one_minus_damp;
    c.wd = k.wd;
    c.mode = (k.has_wd ? KC64_SGD_WD : 0) | (k.has_mom ? KC64_SGD_MOM : 0) | (k.first ? KC64_SGD_FIRST : 0) |
             (k.nesterov ? KC64_SGD_NEST : 0);
    kc_parallel_for(n, KC_GRAIN_HEAVY, KC64_ALIGN, kc64_sgd_range, &c);
}

/* ------------------------------------------------------------- AdamW */

typedef struct {
    double *p, *m, *v;   /* (n) each */
    const double *g;     /* (n) */
    km_adamw_coef_f64 k; /* the step's scalars (kernels/common/km_optim.h) */
} kc64_adamw_ctx;

/* PyTorch's single-tensor AdamW order, per element (see kc_adamw_loop in
 * cpu_optim.c): p *= decay; m.lerp_(g, w1); v = v*b2 + (c2*g)*g;
 * den = sqrt(v)/bc2_sqrt + eps; p += (-step_size * m) / den. */
static KC_ALWAYS_INLINE void kc64_adamw_loop(double *restrict p, const double *restrict g, double *restrict m,
                                             double *restrict v, size_t n, const kc64_adamw_ctx *c,
                                             const int big_weight) {
    const double decay = c->k.decay, w1 = c->k.w1, omw1 = c->k.one_minus_w1, b2 = c->k.beta2, c2 = c->k.c2,
                 bc2s = c->k.bc2_sqrt, eps = c->k.eps, ns = c->k.neg_step;
    for (size_t i = 0; i < n; i++) {
        const double gi = g[i];
        double mi = m[i];
        mi = big_weight ? gi - (gi - mi) * omw1 : mi + w1 * (gi - mi);
        const double vi = v[i] * b2 + (c2 * gi) * gi;
        const double den = sqrt(vi) / bc2s + eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay + (ns * mi) / den;
    }
}

static void kc64_adamw_range(void *vc, size_t i0, size_t i1) {
    const kc64_adamw_ctx *c = vc;
    if (c->k.big_weight)
        kc64_adamw_loop(c->p + i0, c->g + i0, c->m + i0, c->v + i0, i1 - i0, c, 1);
    else
        kc64_adamw_loop(c->p + i0, c->g + i0, c->m + i0, c->v + i0, i1 - i0, c, 0);
}

void kc_adamw_update_f64(double *p, const double *g, double *m, double *v, size_t n,
                         double lr, double beta1, double beta2, double eps,
                         double weight_decay, int64_t step) {
    if (n == 0) return;
    kc64_adamw_ctx c;
    c.p = p;
    c.g = g;
    c.m = m;
    c.v = v;
    c.k = km_adamw_coef_f64_make(lr, beta1, beta2, eps, weight_decay, step);
    kc_parallel_for(n, KC_GRAIN_HEAVY, KC64_ALIGN, kc64_adamw_range, &c);
}
