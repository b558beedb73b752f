/*
 * cpu_elementwise.c: the per-element kernels (ReLU and GELU forward and
 * backward, scale, axpy) and the reductions (sum, sum of squares, finiteness
 * check) that run over activations and whole gradient buffers every step.
 * Each loop body is straight-line float arithmetic over restrict-qualified
 * pointers so GCC vectorizes it (GELU uses an inlined polynomial exp instead
 * of calling tanhf per element). Kernels that allow in-place use dispatch to a
 * separate in-place body rather than dropping restrict, because a may-alias
 * loop gets a runtime overlap check that exact aliasing (dx == dy) fails.
 * Large loops are split across the pool; reductions use a block
 * decomposition fixed by n, so results never depend on the thread count.
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"

#include <string.h>

/* Context shared by the elementwise range bodies. */
typedef struct {
    float *out;       /* (n) output */
    const float *in;  /* (n) first input (x, or dy) */
    const float *in2; /* (n) second input (x for backwards), else NULL */
    float a;          /* scalar operand */
} kc_ew_ctx;

/* ------------------------------------------------------------------ ReLU */

/* x < 0 ? 0 : x keeps NaN (comparisons with NaN are false), as torch.relu
 * does, so a diverged activation stays visible to kc_all_finite. */
static KC_ALWAYS_INLINE void kc_relu_fwd_body(float *restrict y, const float *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}
static KC_ALWAYS_INLINE void kc_relu_fwd_inplace(float *restrict y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = y[i] < 0.0f ? 0.0f : y[i];
}
static KC_ALWAYS_INLINE void kc_relu_fwd_range_impl(void *vc, size_t i0, size_t i1) {
    const kc_ew_ctx *c = vc;
    if (c->out == c->in) kc_relu_fwd_inplace(c->out + i0, i1 - i0);
    else kc_relu_fwd_body(c->out + i0, c->in + i0, i1 - i0);
}
KC_DISPATCHED_RANGE(kc_relu_fwd_range)

void kc_relu_forward(float *y, const float *x, size_t n) {
    kc_ew_ctx c = {y, x, NULL, 0.0f};
    kc_parallel_for(n, KC_GRAIN_STREAM, KC_ALIGN_FLOATS, kc_relu_fwd_range_pick(), &c);
}

static KC_ALWAYS_INLINE void kc_relu_bwd_body(float *restrict dx, const float *restrict dy,
                             const float *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const float d = dy[i]; /* loaded unconditionally so the select vectorizes */
        dx[i] = x[i] > 0.0f ? d : 0.0f;
    }
}
static KC_ALWAYS_INLINE void kc_relu_bwd_inplace(float *restrict d, const float *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = x[i] > 0.0f ? d[i] : 0.0f;
}
static KC_ALWAYS_INLINE void kc_relu_bwd_range_impl(void *vc, size_t i0, size_t i1) {
    const kc_ew_ctx *c = vc;
    if (c->out == c->in) kc_relu_bwd_inplace(c->out + i0, c->in2 + i0, i1 - i0);
    else kc_relu_bwd_body(c->out + i0, c->in + i0, c->in2 + i0, i1 - i0);
}
KC_DISPATCHED_RANGE(kc_relu_bwd_range)

void kc_relu_backward(float *dx, const float *dy, const float *x, size_t n) {
    kc_ew_ctx c = {dx, dy, x, 0.0f};
    kc_parallel_for(n, KC_GRAIN_STREAM, KC_ALIGN_FLOATS, kc_relu_bwd_range_pick(), &c);
}

/* ------------------------------------------------------------------ GELU */

/* gelu and its gradient per element: km_gelu, km_gelu_grad (kernels/common/km_act.h). */

static KC_ALWAYS_INLINE void kc_gelu_fwd_body(float *restrict y, const float *restrict x,
                                              size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = km_gelu(x[i]);
}
static KC_ALWAYS_INLINE void kc_gelu_fwd_inplace(float *restrict y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = km_gelu(y[i]);
}
static KC_ALWAYS_INLINE void kc_gelu_fwd_range_impl(void *vc, size_t i0, size_t i1) {
    const kc_ew_ctx *c = vc;
    if (c->out == c->in) kc_gelu_fwd_inplace(c->out + i0, i1 - i0);
    else kc_gelu_fwd_body(c->out + i0, c->in + i0, i1 - i0);
}

KC_DISPATCHED_RANGE(kc_gelu_fwd_range)

void kc_gelu_forward(float *y, const float *x, size_t n) {
    kc_ew_ctx c = {y, x, NULL, 0.0f};
    kc_parallel_for(n, KC_GRAIN_HEAVY, KC_ALIGN_FLOATS, kc_gelu_fwd_range_pick(), &c);
}

static KC_ALWAYS_INLINE void kc_gelu_bwd_body(float *restrict dx, const float *restrict dy,
                                              const float *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) dx[i] = dy[i] * km_gelu_grad(x[i]);
}
static KC_ALWAYS_INLINE void kc_gelu_bwd_inplace(float *restrict d, const float *restrict x,
                                                 size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = d[i] * km_gelu_grad(x[i]);
}
static KC_ALWAYS_INLINE void kc_gelu_bwd_range_impl(void *vc, size_t i0, size_t i1) {
    const kc_ew_ctx *c = vc;
    if (c->out == c->in) kc_gelu_bwd_inplace(c->out + i0, c->in2 + i0, i1 - i0);
    else kc_gelu_bwd_body(c->out + i0, c->in + i0, c->in2 + i0, i1 - i0);
}

KC_DISPATCHED_RANGE(kc_gelu_bwd_range)

void kc_gelu_backward(float *dx, const float *dy, const float *x, size_t n) {
    kc_ew_ctx c = {dx, dy, x, 0.0f};
    kc_parallel_for(n, KC_GRAIN_HEAVY, KC_ALIGN_FLOATS, kc_gelu_bwd_range_pick(), &c);
}

/* -------------------------------------------------------------- BLAS-1 */

/* Own loops rather than cblas_sscal/saxpy: OpenBLAS may fuse a*x+y (FMA) in
 * some builds and threads by its own rules; these give the same rounding on
 * every machine and split with the rest of the kernels. */
static void kc_scale_range(void *vc, size_t i0, size_t i1) {
    const kc_ew_ctx *c = vc;
    float *restrict x = c->out + i0;
    const float a = c->a;
    const size_t n = i1 - i0;
    for (size_t i = 0; i < n; i++) x[i] = x[i] * a;
}

void kc_scale(float *x, float a, size_t n) {
    kc_ew_ctx c = {x, NULL, NULL, a};
    kc_parallel_for(n, KC_GRAIN_STREAM, KC_ALIGN_FLOATS, kc_scale_range, &c);
}

static void kc_axpy_range(void *vc, size_t i0, size_t i1) {
    const kc_ew_ctx *c = vc;
    float *restrict y = c->out + i0;
    const float *restrict x = c->in + i0;
    const float a = c->a;
    const size_t n = i1 - i0;
    for (size_t i = 0; i < n; i++) y[i] = y[i] + a * x[i];
}

void kc_axpy(float *y, float a, const float *x, size_t n) {
    kc_ew_ctx c = {y, x, NULL, a};
    kc_parallel_for(n, KC_GRAIN_STREAM, KC_ALIGN_FLOATS, kc_axpy_range, &c);
}

/* memset split across the pool: zero_grad clears every gradient each step
 * (7.4 MB for 784-1024-1024-10), and one core's memset does not saturate the
 * memory system. Units are bytes; parts start on cache lines. */
static void kc_zero_range(void *vc, size_t b0, size_t b1) {
    memset((unsigned char *)vc + b0, 0, b1 - b0);
}

void kc_zero(void *p, size_t bytes) {
    if (bytes) kc_parallel_for(bytes, KC_GRAIN_STREAM * sizeof(float), 64, kc_zero_range, p);
}

/* ---------------------------------------------------------- reductions */

enum { KC_RED_SUM, KC_RED_SUMSQ, KC_RED_NONFINITE };

typedef struct {
    const float *x; /* (n) */
    size_t n;
    size_t bs;      /* block size, from kc_red_block_size(n) */
    int kind;
    double partial[KC_RED_MAX_BLOCKS]; /* one per block, written by its owner */
} kc_red_ctx;

/*
 * Sum of one block in double with eight independent accumulators: the fixed
 * lane pattern lets GCC vectorize (a single double accumulator would be a
 * serial dependency chain) while keeping the order defined, hence the same
 * bits on every run and thread count.
 */
static double kc_block_sum(const float *restrict x, size_t n) {
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) a[j] += (double)x[i + j];
    double s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (; i < n; i++) s += (double)x[i];
    return s;
}

static double kc_block_sumsq(const float *restrict x, size_t n) {
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) {
            const double v = (double)x[i + j];
            a[j] += v * v;
        }
    double s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

/* 1 if the block holds a NaN or an infinity: all exponent bits set. Integer
 * tests vectorize and do not depend on floating-point compare semantics. */
static int kc_block_nonfinite(const float *restrict x, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad != 0;
}

/* Blocks [b0, b1). */
static void kc_red_range(void *vc, size_t b0, size_t b1) {
    kc_red_ctx *c = vc;
    for (size_t b = b0; b < b1; b++) {
        const size_t i0 = b * c->bs;
        const size_t len = (i0 + c->bs <= c->n ? c->bs : c->n - i0);
        const float *x = c->x + i0;
        switch (c->kind) {
        case KC_RED_SUM: c->partial[b] = kc_block_sum(x, len); break;
        case KC_RED_SUMSQ: c->partial[b] = kc_block_sumsq(x, len); break;
        default: c->partial[b] = kc_block_nonfinite(x, len); break;
        }
    }
}

static double kc_reduce(const float *x, size_t n, int kind) {
    if (n == 0) return 0.0;
    kc_red_ctx c;
    c.x = x;
    c.n = n;
    c.bs = kc_red_block_size(n);
    c.kind = kind;
    const size_t nblocks = (n + c.bs - 1) / c.bs;
    /* Grain of 2 blocks: a block is >= 16K floats, enough to amortize a
     * wake-up; the split is over blocks, so its boundaries are block ones. */
    kc_parallel_for(nblocks, 2, 1, kc_red_range, &c);
    double s = 0.0;
    for (size_t b = 0; b < nblocks; b++) s += c.partial[b];
    return s;
}

double kc_sum(const float *x, size_t n) { return kc_reduce(x, n, KC_RED_SUM); }

double kc_sumsq(const float *x, size_t n) { return kc_reduce(x, n, KC_RED_SUMSQ); }

int kc_all_finite(const float *x, size_t n) { return kc_reduce(x, n, KC_RED_NONFINITE) == 0.0; }
