/*
 * kg_loss.cu: fused softmax + cross-entropy (forward, backward) and the
 * deterministic reduction of its per-row results. The forward runs one
 * block per row in three passes over the row, as the CPU's kc_xent_row
 * does: the row maximum and its first index (subtracting the max keeps
 * every exp argument <= 0, so logits of any size stay finite), the sum of
 * exp(l - max) in double, then the probabilities. Sums inside a block use a
 * fixed tree, so results never depend on timing; they differ from the CPU's
 * sequential sums only by double rounding (~1e-16 relative), and expf /
 * exp / log are CUDA's (within 1-2 ulp of libm's), so probabilities agree
 * with the CPU's to a few float ulp and the loss to ~1e-7 (float) or ~1e-15
 * (double) relative. Per-row losses go to a caller buffer and are added by
 * kg_reduce_rows in the CPU's exact block order, so equal row losses give
 * the CPU's mean bit for bit.
 */
#include "kg_internal.cuh"
#include "kg_kernels.h"

/* ---------------------------------------------------------------- forward */

/*
 * One block per row (blockIdx.x). probs(B, C) = softmax(logits(B, C)),
 * not overlapping; row_loss(B) = -log p[label] (NaN for a label outside
 * [0, C)); row_correct(B) = first argmax == label (0 for a bad label);
 * *bad_row (may be NULL) lowered to the smallest bad row.
 */
template <typename T>
__global__ void __launch_bounds__(KG_THREADS)
    kg_xent_fwd_kernel(T *__restrict__ probs, const T *__restrict__ logits, const int32_t *__restrict__ labels,
                       int C, double *__restrict__ row_loss, int32_t *__restrict__ row_correct, int32_t *bad_row) {
    __shared__ T s_max[KG_THREADS];
    __shared__ int s_arg[KG_THREADS];
    __shared__ double s_sum[KG_THREADS];
    const unsigned t = threadIdx.x;
    const unsigned uC = (unsigned)C;
    const int32_t row = (int32_t)blockIdx.x;
    const T *l = logits + (size_t)row * uC; /* (C) */
    T *p = probs + (size_t)row * uC;        /* (C) */

    /* Pass 1: max and first argmax. Each thread scans its strided columns,
     * then a tree combines (larger value, or equal at a smaller index), so
     * the winner is the first maximum as in the CPU's left-to-right scan.
     * NaN never wins; the CPU starts from l[0], so a NaN l[0] makes the max
     * NaN (and the argmax 0), fixed up after the tree. */
    T bv = (T)-INFINITY;
    int bi = C;
    for (unsigned j = t; j < uC; j += KG_THREADS) {
        const T v = l[j];
        if (kg_argmax_take(v, (int)j, bv, bi)) {
            bv = v;
            bi = (int)j;
        }
    }
    s_max[t] = bv;
    s_arg[t] = bi;
    __syncthreads();
    for (unsigned h = KG_THREADS / 2; h > 0; h >>= 1) {
        if (t < h && kg_argmax_take(s_max[t + h], s_arg[t + h], s_max[t], s_arg[t])) {
            s_max[t] = s_max[t + h];
            s_arg[t] = s_arg[t + h];
        }
        __syncthreads();
    }
    T mx = s_max[0];
    int arg = s_arg[0];
    const T l0 = l[0];
    if (l0 != l0) {
        mx = l0;
        arg = 0;
    }

    /* Pass 2: denom = sum of exp(l - max), each term rounded to T and added
     * in double (as the CPU does). */
    double acc = 0.0;
    for (unsigned j = t; j < uC; j += KG_THREADS) acc += (double)kg_xent_exp(l[j] - mx);
    s_sum[t] = acc;
    kg_block_tree_sum(s_sum);
    const double denom = s_sum[0];

    /* Pass 3: p = exp(l - max) normalised (exp recomputed rather than
     * stored and re-read: same value, one memory pass fewer). */
    const T norm = kg_xent_norm<T>(denom);
    for (unsigned j = t; j < uC; j += KG_THREADS) p[j] = kg_xent_prob(kg_xent_exp(l[j] - mx), norm);

    if (t == 0) {
        const int32_t y = labels[row];
        if (y < 0 || y >= C) {
            row_loss[row] = kg_nan_f64();
            row_correct[row] = 0;
            if (bad_row) kg_note_bad_row(bad_row, row);
        } else {
            row_loss[row] = kg_xent_loss(denom, l[y], mx);
            row_correct[row] = arg == y;
        }
    }
}

extern "C" cudaError_t kg_softmax_xent_forward(cudaStream_t s, int fdt, void *probs, const void *logits,
                                               const int32_t *labels, int B, int C, double *row_loss,
                                               int32_t *row_correct, int32_t *bad_row) {
    if (fdt != KG_F32 && fdt != KG_F64) return cudaErrorInvalidValue;
    if (B < 0 || C < 1) return cudaErrorInvalidValue; /* a softmax over no classes has no meaning */
    if (B == 0) return cudaSuccess;
    if (fdt == KG_F32)
        kg_xent_fwd_kernel<float><<<(unsigned)B, KG_THREADS, 0, s>>>((float *)probs, (const float *)logits, labels, C,
                                                                     row_loss, row_correct, bad_row);
    else
        kg_xent_fwd_kernel<double><<<(unsigned)B, KG_THREADS, 0, s>>>((double *)probs, (const double *)logits, labels,
                                                                      C, row_loss, row_correct, bad_row);
    return cudaGetLastError();
}

/* ------------------------------------------------------------ reduce_rows */

/*
 * out[0] = sum of row_loss(B) / B, out[1] = sum of row_correct(B), by one
 * block in the CPU's order (kc_softmax_xent_forward): rows in blocks of
 * ceil(B / 256), each block summed in row order from 0.0, then the block
 * sums in block order. B == 0 gives NaN and 0 (the CPU's NAN for B < 1).
 */
__global__ void __launch_bounds__(KG_THREADS)
    kg_reduce_rows_kernel(const double *__restrict__ row_loss, const int32_t *__restrict__ row_correct, int B,
                          double *__restrict__ out) {
    __shared__ double s_loss[KG_THREADS];
    __shared__ long long s_correct[KG_THREADS];
    const unsigned t = threadIdx.x;
    if (B <= 0) {
        if (t == 0) {
            out[0] = kg_nan_f64();
            out[1] = 0.0;
        }
        return;
    }
    const unsigned rows_per_block = ((unsigned)B + KG_THREADS - 1) / KG_THREADS;
    const unsigned nblocks = ((unsigned)B + rows_per_block - 1) / rows_per_block;
    double loss = 0.0;
    long long correct = 0;
    if (t < nblocks) {
        const unsigned r0 = t * rows_per_block;
        const unsigned r1 = r0 + rows_per_block < (unsigned)B ? r0 + rows_per_block : (unsigned)B;
        for (unsigned r = r0; r < r1; r++) {
            loss += row_loss[r];
            correct += row_correct[r];
        }
    }
    s_loss[t] = loss;
    s_correct[t] = correct;
    __syncthreads();
    if (t == 0) {
        double total = 0.0;
        long long n_correct = 0;
        for (unsigned b = 0; b < nblocks; b++) {
            total += s_loss[b];
            n_correct += s_correct[b];
        }
        out[0] = total / (double)B;
        out[1] = (double)n_correct;
    }
}

extern "C" cudaError_t kg_reduce_rows(cudaStream_t s, const double *row_loss, const int32_t *row_correct, int B,
                                      double *out) {
    if (B < 0) return cudaErrorInvalidValue;
    kg_reduce_rows_kernel<<<1, KG_THREADS, 0, s>>>(row_loss, row_correct, B, out);
    return cudaGetLastError();
}

/* --------------------------------------------------------------- backward */

/*
 * dlogits(B, C) = scale * (probs - onehot(labels)), scale = dloss / B;
 * rows with a label outside [0, C) become NaN (as on the CPU, so an
 * unchecked bad label cannot train silently). Each element reads only its
 * own probability, so dlogits may equal probs. Flat over B * C; IdxT does
 * the row/column split.
 */
template <typename T, typename IdxT>
__global__ void kg_xent_bwd_kernel(T *dlogits, const T *probs, const int32_t *__restrict__ labels, size_t total,
                                   IdxT C, T scale) {
    KG_GRID_STRIDE(i, total) {
        const IdxT r = (IdxT)i / C;
        const IdxT j = (IdxT)i - r * C;
        const int32_t y = labels[r];
        T d;
        if (y < 0 || (IdxT)y >= C) d = kg_nan<T>();
        else d = kg_xent_grad(scale, probs[i], j == (IdxT)y);
        dlogits[i] = d;
    }
}

template <typename T>
static cudaError_t kg_xent_bwd_t(cudaStream_t s, T *dlogits, const T *probs, const int32_t *labels, int B, int C,
                                 double dloss) {
    const size_t total = (size_t)B * (size_t)C;
    const T scale = kg_xent_scale<T>(dloss, B);
    if (total <= UINT32_MAX)
        kg_xent_bwd_kernel<T, uint32_t><<<kg_grid(total), KG_THREADS, 0, s>>>(dlogits, probs, labels, total,
                                                                             (uint32_t)C, scale);
    else
        kg_xent_bwd_kernel<T, size_t><<<kg_grid(total), KG_THREADS, 0, s>>>(dlogits, probs, labels, total,
                                                                           (size_t)C, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_softmax_xent_backward(cudaStream_t s, int fdt, void *dlogits, const void *probs,
                                                const int32_t *labels, int B, int C, double dloss) {
    if (fdt != KG_F32 && fdt != KG_F64) return cudaErrorInvalidValue;
    if (B < 0 || C < 0) return cudaErrorInvalidValue;
    if (B == 0 || C == 0) return cudaSuccess;
    if (fdt == KG_F32) return kg_xent_bwd_t(s, (float *)dlogits, (const float *)probs, labels, B, C, dloss);
    return kg_xent_bwd_t(s, (double *)dlogits, (const double *)probs, labels, B, C, dloss);
}
