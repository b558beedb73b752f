/*
 * cpu_loss.c: the fused softmax + cross-entropy loss for classification
 * (logits (B, C), integer labels) and its gradient w.r.t. the logits. Fusing
 * the two lets the forward keep the probabilities the backward needs and
 * compute the loss as a log-sum-exp (never the log of a probability that may
 * have underflowed to 0). For a small class count the (B, C) matrix is tiny
 * next to the GEMMs, so rows use libm's accurate expf/log; for a large one
 * (a vocabulary) the rows are split across the pool. The forward's mean is
 * reduced over row blocks whose size depends on B only, so the loss is the
 * same bits for every thread count.
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"

#include <math.h>

/* ---------------------------------------------------------------- forward */

typedef struct {
    float *probs;          /* (B, C) */
    const float *logits;   /* (B, C) */
    const int32_t *labels; /* (B) */
    size_t B, C;
    size_t rows_per_block; /* from kc_red_block_size-like rule, depends on B */
    /* per row block, written only by the block's owner */
    double loss[KC_RED_MAX_BLOCKS];
    int correct[KC_RED_MAX_BLOCKS];
    int bad[KC_RED_MAX_BLOCKS];
} kc_xent_ctx;

/*
 * One row: probs p = softmax(l), returns -log p[y] (in double) or NAN for a
 * label outside [0, C); *hit = 1 when the first argmax equals y.
 * l, p: (C), not overlapping.
 */
static double kc_xent_row(float *restrict p, const float *restrict l, int32_t y, size_t C,
                          int *hit) {
    /* Row max and its first index: subtracting the max keeps every exp
     * argument <= 0, so no overflow for logits of any size. NaN logits never
     * win the comparison but reach p and the loss through exp. */
    float mx = l[0];
    size_t arg = 0;
    for (size_t j = 1; j < C; j++) {
        if (l[j] > mx) {
            mx = l[j];
            arg = j;
        }
    }
    double denom = 0.0;
    for (size_t j = 0; j < C; j++) {
        const float e = expf(l[j] - mx);
        p[j] = e;
        denom += (double)e;
    }
    const float inv = (float)(1.0 / denom);
    for (size_t j = 0; j < C; j++) p[j] *= inv;
    *hit = 0;
    if (y < 0 || (size_t)y >= C) return NAN;
    *hit = (arg == (size_t)y);
    /* -log p[y] = log(sum_j exp(l_j - mx)) - (l_y - mx) */
    return log(denom) - ((double)l[y] - (double)mx);
}

/* Row blocks [b0, b1). */
static void kc_xent_fwd_range(void *vc, size_t b0, size_t b1) {
    kc_xent_ctx *c = vc;
    for (size_t b = b0; b < b1; b++) {
        const size_t r0 = b * c->rows_per_block;
        const size_t r1 = r0 + c->rows_per_block < c->B ? r0 + c->rows_per_block : c->B;
        double loss = 0.0;
        int correct = 0, bad = 0;
        for (size_t i = r0; i < r1; i++) {
            int hit;
            const double li = kc_xent_row(c->probs + i * c->C, c->logits + i * c->C,
                                          c->labels[i], c->C, &hit);
            const int32_t y = c->labels[i];
            if (y < 0 || (size_t)y >= c->C) {
                bad = 1; /* keep filling probs; the result is NAN anyway */
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

float kc_softmax_xent_forward(float *probs, const float *logits,
                              const int32_t *labels, int B, int C, int *n_correct) {
    if (n_correct) *n_correct = 0;
    if (B < 1 || C < 1) return NAN;
    /* The context holds the per-block partials (~3 KiB) on the stack. */
    kc_xent_ctx c;
    c.probs = probs;
    c.logits = logits;
    c.labels = labels;
    c.B = (size_t)B;
    c.C = (size_t)C;
    c.rows_per_block = (c.B + KC_RED_MAX_BLOCKS - 1) / KC_RED_MAX_BLOCKS;
    const size_t nblocks = (c.B + c.rows_per_block - 1) / c.rows_per_block;
    /* Split when a thread gets at least a heavy grain of logits (each costs
     * an expf call, ~10 ns). */
    const size_t per_block = c.rows_per_block * c.C;
    const size_t grain = (KC_GRAIN_HEAVY + per_block - 1) / per_block;
    kc_parallel_for(nblocks, grain, 1, kc_xent_fwd_range, &c);
    double loss = 0.0;
    int correct = 0, bad = 0;
    for (size_t b = 0; b < nblocks; b++) {
        loss += c.loss[b];
        correct += c.correct[b];
        bad |= c.bad[b];
    }
    if (n_correct) *n_correct = correct;
    if (bad) return NAN;
    return (float)(loss / (double)B);
}

/* --------------------------------------------------------------- backward */

typedef struct {
    float *dlogits;        /* (B, C), may equal probs */
    const float *probs;    /* (B, C) */
    const int32_t *labels; /* (B) */
    size_t C;
    float scale;           /* dloss / B */
} kc_xent_bwd_ctx;

/* Rows [r0, r1). dlogits may equal probs: p[y] is read before the row is
 * written, and every other element is read only at its own index, so no
 * restrict here. */
static void kc_xent_bwd_range(void *vc, size_t r0, size_t r1) {
    const kc_xent_bwd_ctx *c = vc;
    const size_t C = c->C;
    const float scale = c->scale;
    for (size_t i = r0; i < r1; i++) {
        float *d = c->dlogits + i * C;
        const float *p = c->probs + i * C;
        const int32_t y = c->labels[i];
        if (y < 0 || (size_t)y >= C) {
            for (size_t j = 0; j < C; j++) d[j] = NAN;
            continue;
        }
        const float py = p[y];
        for (size_t j = 0; j < C; j++) d[j] = scale * p[j];
        d[y] = scale * (py - 1.0f);
    }
}

void kc_softmax_xent_backward(float *dlogits, const float *probs,
                              const int32_t *labels, int B, int C, float dloss) {
    if (B < 1 || C < 1) return;
    /* d(mean loss)/d logit = (p - onehot) / B; dloss chains the caller's
     * scaling (gradient accumulation, loss scale) in. */
    kc_xent_bwd_ctx c = {dlogits, probs, labels, (size_t)C,
                         (float)((double)dloss / (double)B)};
    const size_t grain = (KC_GRAIN_STREAM + (size_t)C - 1) / (size_t)C;
    kc_parallel_for((size_t)B, grain, 1, kc_xent_bwd_range, &c);
}
