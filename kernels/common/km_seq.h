/*
 * km_seq.h — the partitions the ABI 1.4 sequence kernels fix for their
 * reductions over rows, written once for kernels/cpu (cpu_seq.c) and
 * kernels/cuda (kg_seq.cu). A sum over rows is formed as per-block partial
 * sums whose blocks depend on the shapes only, combined in block order; when
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

#endif /* KILN_KERNELS_COMMON_KM_SEQ_H */
