/*
 * kgx_selftest.cu: kernels written right and kernels written wrong, for
 * test_kgx, which runs them through the host execution (kgx.cpp) and checks
 * that each mistake is caught the way kgx.cpp says it is: a missing
 * barrier, a shuffle after half the warp has returned, threads of one warp
 * at different barriers, shared memory read before any thread of the block
 * wrote it, blocks racing on one output, a launch CUDA would refuse and a
 * host pointer handed to a kernel. Valid CUDA (the mistakes are the kind
 * nvcc accepts); compiled here only through kgx_translate.cmake. Each entry
 * launches on the legacy stream and returns cudaGetLastError().
 */
#include <cuda_runtime.h>

#define ST_THREADS 256

/* --------------------------------------------------- block tree sums */

/* out[b] = the sum of x[b * 256 .. + 256) by a shared-memory tree;
 * barrier = 0 leaves out every barrier. */
__global__ void st_tree_kernel(const float *x, float *out, int barrier) {
    __shared__ float s[ST_THREADS];
    const unsigned t = threadIdx.x;
    s[t] = x[blockIdx.x * ST_THREADS + t];
    if (barrier) __syncthreads();
    for (unsigned h = ST_THREADS / 2; h > 0; h >>= 1) {
        if (t < h) s[t] += s[t + h];
        if (barrier) __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

extern "C" cudaError_t st_tree_sum(const float *x, float *out, int blocks, int barrier) {
    st_tree_kernel<<<blocks, ST_THREADS>>>(x, out, barrier);
    return cudaGetLastError();
}

/* ---------------------------------------------------- warp shuffles */

/* out[w] = the sum of warp w's 32 values by a butterfly; half_exit: lanes
 * 16..31 return first, and lanes 0..15 still name them in the mask. */
__global__ void st_warp_kernel(const float *x, float *out, int half_exit) {
    const unsigned t = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31u;
    float v = x[t];
    if (half_exit && lane >= 16) return;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[t / 32] = v;
}

extern "C" cudaError_t st_warp_sum(const float *x, float *out, int warps, int half_exit) {
    st_warp_kernel<<<1, 32 * warps>>>(x, out, half_exit);
    return cudaGetLastError();
}

/* ---------------------------------------------------- barriers apart */

/* Lanes 0..15 of each warp wait at __syncthreads, 16..31 at __syncwarp:
 * neither barrier can complete. */
__global__ void st_split_kernel(float *out) {
    if ((threadIdx.x & 31u) < 16) __syncthreads();
    else __syncwarp();
    out[threadIdx.x] = 1.0f;
}

extern "C" cudaError_t st_split_barriers(float *out) {
    st_split_kernel<<<1, 64>>>(out);
    return cudaGetLastError();
}

/* ------------------------------------------------------ shared memory */

/* Block b's thread 0 reads s[1] and stores it; wrote = 1: thread 1 wrote
 * it first (behind a barrier). Without that, the value is whatever the
 * shared memory held: on the host, 0xff bytes. */
__global__ void st_stale_kernel(float *out, int wrote) {
    __shared__ float s[ST_THREADS];
    if (wrote && threadIdx.x == 1) s[1] = (float)blockIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = s[1];
    __syncthreads(); /* (without it, the write below races with that read: kgx caught it) */
    if (threadIdx.x == 1) s[1] = 7.0f; /* left behind for the next block */
}

extern "C" cudaError_t st_stale_shared(float *out, int blocks, int wrote) {
    st_stale_kernel<<<blocks, ST_THREADS>>>(out, wrote);
    return cudaGetLastError();
}

/* Dynamic shared memory: out[t] = x[t] through smem, reversed in the block. */
extern __shared__ float st_dyn[];
__global__ void st_dyn_kernel(const float *x, float *out) {
    st_dyn[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = st_dyn[blockDim.x - 1 - threadIdx.x];
}

extern "C" cudaError_t st_dyn_reverse(const float *x, float *out, int n, size_t smem) {
    st_dyn_kernel<<<1, n, smem>>>(x, out);
    return cudaGetLastError();
}

/* ------------------------------------------------------ across blocks */

/* Every block writes its index into out[0]: the last block wins, and which
 * block runs last is the GPU's choice. */
__global__ void st_race_kernel(int *out) {
    if (threadIdx.x == 0) out[0] = (int)blockIdx.x;
}

extern "C" cudaError_t st_block_race(int *out, int blocks) {
    st_race_kernel<<<blocks, 32>>>(out);
    return cudaGetLastError();
}

/* The smallest index among blocks that "find" something, by atomicCAS in
 * a loop (kg_note_bad_row's pattern): the same answer in any order. */
__global__ void st_min_kernel(int *best, int every) {
    const int b = (int)blockIdx.x;
    if (threadIdx.x != 0 || b % every != every - 1) return;
    int old = *(volatile int *)best;
    while (old < 0 || b < old) {
        const int prev = atomicCAS(best, old, b);
        if (prev == old) break;
        old = prev;
    }
}

extern "C" cudaError_t st_min_found(int *best, int blocks, int every) {
    st_min_kernel<<<blocks, 32>>>(best, every);
    return cudaGetLastError();
}

/* ------------------------------------------------------- grid strides */

/* y[i] = 2 x[i] + i over a grid-stride loop, with a 2-D block for the
 * coordinates' sake. */
__global__ void st_axpy_kernel(const float *x, float *y, size_t n) {
    const size_t per = (size_t)blockDim.x * blockDim.y;
    for (size_t i = (size_t)blockIdx.x * per + threadIdx.y * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * per)
        y[i] = 2.0f * x[i] + (float)i;
}

extern "C" cudaError_t st_axpy(const float *x, float *y, size_t n, unsigned grid, unsigned bx, unsigned by) {
    st_axpy_kernel<<<grid, dim3(bx, by)>>>(x, y, n);
    return cudaGetLastError();
}
