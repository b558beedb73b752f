/*
 * kg_reduce.cu: sum, sum of squares and the non-finite count of a tensor of
 * any float dtype, accumulated in double, deterministically: pass 1 runs
 * exactly KG_REDUCE_BLOCKS blocks whatever n is, each thread adding a fixed
 * strided set of elements in index order and each block combining its
 * threads by a fixed tree into one partial in caller scratch; pass 2 is one
 * block that combines the partials by the same tree. The order of additions
 * therefore depends on n only, never on timing or the device. It is not the
 * CPU's order (kc_sum's 8-lane blocks), so sums agree with the CPU's to
 * double rounding (~1e-16 relative to the sum of |terms|), and the
 * non-finite count is exact (the CPU's kc_all_finite gives only zero or
 * non-zero; compare `count == 0`). kg_reduce_list does the same for up to
 * KG_LIST_MAX tensors in two launches, each tensor's value the same bits
 * (sumsq_many).
 */
#include "kg_internal.cuh"
#include "kg_kernels.h"

/* The term element x contributes under OP. */
template <int DT, int OP> __device__ __forceinline__ double kg_reduce_term(typename kg_storage<DT>::type x) {
    if constexpr (OP == KG_NONFINITE) {
        return kg_nonfinite<DT>(x) ? 1.0 : 0.0;
    } else {
        const double v = kg_to_double<DT>(x);
        if constexpr (OP == KG_SUMSQ) return v * v;
        else return v;
    }
}

/* Pass 1 of one tensor, in a grid of gridDim.x == KG_REDUCE_BLOCKS blocks
 * along x: *partial = this block's sum of terms over x(n). Shared by the
 * single and the list kernels, so a tensor's partials are the same bits
 * either way (the list's y dimension only picks the tensor). */
template <int DT, int OP>
__device__ __forceinline__ void kg_reduce_partial_block(const typename kg_storage<DT>::type *__restrict__ x, size_t n,
                                                        double *partial) {
    __shared__ double s[KG_THREADS];
    double acc = 0.0;
    KG_GRID_STRIDE(i, n) acc += kg_reduce_term<DT, OP>(x[i]);
    s[threadIdx.x] = acc;
    kg_block_tree_sum(s);
    if (threadIdx.x == 0) *partial = s[0];
}

/* Pass 2 of one tensor, one block: *out = the tree sum of
 * partials(KG_REDUCE_BLOCKS). */
__device__ __forceinline__ void kg_reduce_final_block(const double *__restrict__ partials, double *out) {
    __shared__ double s[KG_THREADS];
    double acc = 0.0;
    for (unsigned b = threadIdx.x; b < KG_REDUCE_BLOCKS; b += KG_THREADS) acc += partials[b];
    s[threadIdx.x] = acc;
    kg_block_tree_sum(s);
    if (threadIdx.x == 0) *out = s[0];
}

/* Pass 1, gridDim.x == KG_REDUCE_BLOCKS: partials[block] = the block's sum
 * of terms over x(n). */
template <int DT, int OP>
__global__ void __launch_bounds__(KG_THREADS)
    kg_reduce_partial_kernel(const typename kg_storage<DT>::type *__restrict__ x, size_t n,
                             double *__restrict__ partials) {
    kg_reduce_partial_block<DT, OP>(x, n, partials + blockIdx.x);
}

/* Pass 2, one block: *out = the tree sum of partials(KG_REDUCE_BLOCKS). */
__global__ void __launch_bounds__(KG_THREADS)
    kg_reduce_final_kernel(const double *__restrict__ partials, double *__restrict__ out) {
    kg_reduce_final_block(partials, out);
}

/* The list's pass 1, grid (KG_REDUCE_BLOCKS, count): tensor blockIdx.y's
 * partials into partials(count, KG_REDUCE_BLOCKS). */
template <int DT, int OP>
__global__ void __launch_bounds__(KG_THREADS) kg_reduce_list_partial_kernel(const kg_list list, double *partials) {
    typedef typename kg_storage<DT>::type S;
    kg_reduce_partial_block<DT, OP>((const S *)list.x[blockIdx.y], list.n[blockIdx.y],
                                    partials + (size_t)blockIdx.y * KG_REDUCE_BLOCKS + blockIdx.x);
}

/* The list's pass 2, one block per tensor: out[t] from its partials. */
__global__ void __launch_bounds__(KG_THREADS) kg_reduce_list_final_kernel(const double *partials, double *out) {
    kg_reduce_final_block(partials + (size_t)blockIdx.x * KG_REDUCE_BLOCKS, out + blockIdx.x);
}

template <int DT>
static cudaError_t kg_reduce_dt(cudaStream_t s, int op, const void *x, size_t n, double *partials) {
    typedef typename kg_storage<DT>::type S;
    switch (op) {
    case KG_SUM:
        kg_reduce_partial_kernel<DT, KG_SUM><<<KG_REDUCE_BLOCKS, KG_THREADS, 0, s>>>((const S *)x, n, partials);
        break;
    case KG_SUMSQ:
        kg_reduce_partial_kernel<DT, KG_SUMSQ><<<KG_REDUCE_BLOCKS, KG_THREADS, 0, s>>>((const S *)x, n, partials);
        break;
    default:
        kg_reduce_partial_kernel<DT, KG_NONFINITE><<<KG_REDUCE_BLOCKS, KG_THREADS, 0, s>>>((const S *)x, n, partials);
        break;
    }
    return cudaGetLastError();
}

/* n == 0 still runs both passes (the grid is fixed, never empty), so *out
 * is 0 rather than left unwritten. */
extern "C" cudaError_t kg_reduce(cudaStream_t s, int op, int dtype, const void *x, size_t n, double *partials,
                                 double *out) {
    if (op != KG_SUM && op != KG_SUMSQ && op != KG_NONFINITE) return cudaErrorInvalidValue;
    cudaError_t err;
    switch (dtype) {
    case KG_F32: err = kg_reduce_dt<KG_F32>(s, op, x, n, partials); break;
    case KG_F64: err = kg_reduce_dt<KG_F64>(s, op, x, n, partials); break;
    case KG_F16: err = kg_reduce_dt<KG_F16>(s, op, x, n, partials); break;
    case KG_BF16: err = kg_reduce_dt<KG_BF16>(s, op, x, n, partials); break;
    default: return cudaErrorInvalidValue;
    }
    if (err != cudaSuccess) return err;
    kg_reduce_final_kernel<<<1, KG_THREADS, 0, s>>>(partials, out);
    return cudaGetLastError();
}

template <int DT>
static cudaError_t kg_reduce_list_dt(cudaStream_t s, int op, const kg_list *list, double *partials) {
    const dim3 grid(KG_REDUCE_BLOCKS, (unsigned)list->count);
    switch (op) {
    case KG_SUM: kg_reduce_list_partial_kernel<DT, KG_SUM><<<grid, KG_THREADS, 0, s>>>(*list, partials); break;
    case KG_SUMSQ: kg_reduce_list_partial_kernel<DT, KG_SUMSQ><<<grid, KG_THREADS, 0, s>>>(*list, partials); break;
    default: kg_reduce_list_partial_kernel<DT, KG_NONFINITE><<<grid, KG_THREADS, 0, s>>>(*list, partials); break;
    }
    return cudaGetLastError();
}

/* Every tensor of the list in two launches, each tensor's value the bits
 * kg_reduce gives it (the same blocks, strides and trees); an empty tensor
 * gives 0 and its pointer is never read. */
extern "C" cudaError_t kg_reduce_list(cudaStream_t s, int op, int dtype, const kg_list *list, double *partials,
                                      double *out) {
    if (op != KG_SUM && op != KG_SUMSQ && op != KG_NONFINITE) return cudaErrorInvalidValue;
    if (list->count < 0 || list->count > KG_LIST_MAX) return cudaErrorInvalidValue;
    if (list->count == 0) return cudaSuccess;
    cudaError_t err;
    switch (dtype) {
    case KG_F32: err = kg_reduce_list_dt<KG_F32>(s, op, list, partials); break;
    case KG_F64: err = kg_reduce_list_dt<KG_F64>(s, op, list, partials); break;
    case KG_F16: err = kg_reduce_list_dt<KG_F16>(s, op, list, partials); break;
    case KG_BF16: err = kg_reduce_list_dt<KG_BF16>(s, op, list, partials); break;
    default: return cudaErrorInvalidValue;
    }
    if (err != cudaSuccess) return err;
    kg_reduce_list_final_kernel<<<(unsigned)list->count, KG_THREADS, 0, s>>>(partials, out);
    return cudaGetLastError();
}
