/*
 * kg_internal.cuh: what the kernel sources share beyond kg_math.cuh's
 * arithmetic: the launch geometry (a fixed block size and a capped grid for
 * grid-stride loops, so a launch never has 0 blocks and never more than the
 * hardware's limit), the grid-stride loop macro with size_t indices (tensors
 * may exceed 2^31 elements), the deterministic shared-memory tree sum the
 * reductions and the loss use, and the smallest-bad-row record of the two
 * cross-entropy kernels. Private to kernels/cuda.
 */
#ifndef KILN_KERNELS_CUDA_KG_INTERNAL_CUH
#define KILN_KERNELS_CUDA_KG_INTERNAL_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "kg_math.cuh"

/* Threads per block everywhere; the tree reductions assume this power of 2. */
#define KG_THREADS 256

/* Grid-stride loops need no more blocks than keep every SM busy: 4096 blocks
 * of 256 threads is several waves on an H100/H200 (132 SMs x 2048 threads),
 * and caps the grid far below gridDim.x's limit for any n. */
#define KG_MAX_BLOCKS 4096u

/* Blocks for n elements (n > 0): one per KG_THREADS elements, capped. */
static inline unsigned kg_grid(size_t n) {
    const size_t b = (n + KG_THREADS - 1) / KG_THREADS;
    return b < (size_t)KG_MAX_BLOCKS ? (unsigned)b : KG_MAX_BLOCKS;
}

/* A list launch (several tensors in one grid, each with the blocks its
 * own launch would have): first[t] = the first block of tensor t, for
 * count tensors of n[t] elements (an empty one gets none); returns the
 * grid's blocks, which first[count] also holds. */
static inline unsigned kg_list_blocks(const size_t *n, int count, unsigned *first) {
    unsigned blocks = 0;
    for (int t = 0; t < count; t++) {
        first[t] = blocks;
        blocks += n[t] ? kg_grid(n[t]) : 0;
    }
    first[count] = blocks;
    return blocks;
}

/* The tensor that block b of a list launch works on: the t with first[t]
 * <= b < first[t + 1] (b < first[count]), by binary search; a tensor with
 * no blocks is never the answer. */
KG_HD int kg_list_owner(const unsigned *first, int count, unsigned b) {
    int lo = 0, hi = count; /* first[lo] <= b < first[hi] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (b >= first[mid]) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* for (i over [0, n)) across the whole grid, i a size_t. */
#define KG_GRID_STRIDE(i, n)                                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
         i += (size_t)gridDim.x * blockDim.x)

/*
 * Sum of s[0 .. KG_THREADS) into s[0] by a fixed pairwise tree (s[t] +=
 * s[t + h] for h = 128, 64, ..., 1), so the result depends on the values
 * only, never on timing. Every thread of the block must call it; s is
 * __shared__, and each thread has written its own s[threadIdx.x] before.
 * Returns with s[0] visible to all threads.
 */
template <typename T> __device__ __forceinline__ void kg_block_tree_sum(T *s) {
    __syncthreads();
    for (unsigned h = KG_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) s[threadIdx.x] = s[threadIdx.x] + s[threadIdx.x + h];
        __syncthreads();
    }
}

/* A value as the compute type T reads it from storage dtype SD, and a
 * value of T as SD stores it: identities for float32 / float64 storage;
 * 16-bit storage (the 1.6 logits, the 1.7 activations) widens exactly and
 * stores rounded to nearest even, so a kernel templated on SD computes the
 * float32 kernel's bits on the widened inputs. */
template <typename T, int SD> static __device__ __forceinline__ T kg_ld(typename kg_storage<SD>::type v) {
    return kg_convert<kg_dtype_of<T>::value, SD>(v);
}
template <typename T, int SD> static __device__ __forceinline__ typename kg_storage<SD>::type kg_st(T v) {
    return kg_convert<SD, kg_dtype_of<T>::value>(v);
}

/* Records row as a bad row (a label or target out of range) when it is
 * below the current one (or none is recorded yet: -1), so the smallest bad
 * row wins whatever order the blocks run in. */
static __device__ __forceinline__ void kg_note_bad_row(int32_t *bad_row, int32_t row) {
    int32_t old = *(volatile int32_t *)bad_row;
    while (old < 0 || row < old) {
        const int32_t prev = atomicCAS(bad_row, old, row);
        if (prev == old) break;
        old = prev;
    }
}

#endif /* KILN_KERNELS_CUDA_KG_INTERNAL_CUH */
