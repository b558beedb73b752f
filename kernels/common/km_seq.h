/*
 * km_seq.h — the partitions the ABI 1.4 sequence kernels fix for their
 * reductions over rows, and the per-element formulas they evaluate, written
 * once for kernels/cpu (cpu_seq.c) and kernels/cuda (kg_seq.cu). A sum over
 * rows is formed as per-block partial sums whose blocks depend on the
 * shapes only, combined in block order; when
 * both kernel sets use the same blocks, the layer norm's dw and db (partials
 * in double, rounded once) come out of a GPU with the CPU's bits, and the
 * cross-entropy's loss sum adds its row losses in the same order. A change
 * here changes the bits of both, together.
 */
#ifndef KILN_KERNELS_COMMON_KM_SEQ_H
#define KILN_KERNELS_COMMON_KM_SEQ_H

#include <stddef.h>

#include "km_act.h" /* KM_FN */

/* Rows per block of the layer norm backward's dw/db partial sums: from N
 * only, at least KM_LN_MIN_ROWS rows (a partial row is amortised over
 * several data rows) and at most KM_LN_MAX_BLOCKS blocks (the workspace
 * stays at a few MB for C = 768). */
#define KM_LN_MIN_ROWS ((size_t)8)
#define KM_LN_MAX_BLOCKS ((size_t)128)
KM_FN size_t km_ln_rows_per_block(size_t N) {
    const size_t r = (N + KM_LN_MAX_BLOCKS - 1) / KM_LN_MAX_BLOCKS;
    return r < KM_LN_MIN_ROWS ? KM_LN_MIN_ROWS : r;
}
KM_FN size_t km_ln_blocks(size_t N) {
    const size_t rpb = km_ln_rows_per_block(N);
    return (N + rpb - 1) / rpb;
}

/* Rows per block of the fused cross-entropy's loss sum: at most
 * KM_XENT_MAX_BLOCKS blocks; each block's rows are added in row order, then
 * the blocks in block order. */
#define KM_XENT_MAX_BLOCKS ((size_t)256)
KM_FN size_t km_xent_rows_per_block(size_t N) { return (N + KM_XENT_MAX_BLOCKS - 1) / KM_XENT_MAX_BLOCKS; }

/*
 * The per-element formulas both kernel sets evaluate, each one fixed
 * sequence of IEEE operations in the element type (no fused multiply-add:
 * kernels/cpu builds with -ffp-contract=off, kernels/cuda with
 * --fmad=false), so that a float result depends on the inputs only.
 *   km_ln_y:  the layer norm's output from the stored mean m and rstd r,
 *             ((x - m) * r) * w + b, without the factor or the term when the
 *             layer has no weight (has_w 0) or no bias (has_b 0);
 *   km_ln_dx: its input gradient r * ((g - am) - ((x - m) * r) * bm), g =
 *             dy * w (dy without a weight), am and bm the row means of g and
 *             g * xhat rounded to the element type;
 *   km_xent_target: the cross-entropy gradient at the target column,
 *             grad_scale * (e / sum - 1) formed in double from the target's
 *             exponential e, so that p - 1 does not cancel in the data type.
 *             (Every other column is e * (T)(grad_scale / sum).)
 */
#define KM_SEQ_FORMULAS(T, SUF)                                                                            \
    KM_FN T km_ln_y##SUF(T x, T m, T r, T w, T b, int has_w, int has_b) {                                  \
        T v = (x - m) * r;                                                                                 \
        if (has_w) v = v * w;                                                                              \
        if (has_b) v = v + b;                                                                              \
        return v;                                                                                          \
    }                                                                                                      \
    KM_FN T km_ln_dx##SUF(T g, T x, T m, T r, T am, T bm) { return r * ((g - am) - ((x - m) * r) * bm); } \
    KM_FN T km_xent_target##SUF(T e, double sum, double grad_scale) {                                      \
        return (T)(grad_scale * ((double)e / sum - 1.0));                                                  \
    }
KM_SEQ_FORMULAS(float, _f32)
KM_SEQ_FORMULAS(double, _f64)
#undef KM_SEQ_FORMULAS

#endif /* KILN_KERNELS_COMMON_KM_SEQ_H */
