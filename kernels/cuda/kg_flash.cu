/*
 * kg_flash.cu: the device side of the fused ("flash") causal attention:
 * kg_flash.cuh's block programs instantiated with kg_fl_dev, the policy of
 * a real CUDA block (threadIdx, __syncthreads, __syncwarp, and the warp's
 * tensor-core products through nvcuda::wmma on bf16 or f16 operands with
 * float accumulators), their kernels and the launchers of kg_kernels.h.
 * The algorithm itself, and why it is correct on both machines, is in
 * kg_flash.cuh; the host twin that CI tests is kg_flash_host.cuh.
 */
#include <limits.h>

#include <type_traits>

/* kiln's headers first: kg_math.cuh names a local `half`, which
 * cuda_fp16.h's type of that name would shadow (-Wshadow). */
#include "kg_flash.cuh"
#include "kg_internal.cuh"
#include "kg_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

struct kg_fl_dev {
    static __device__ __forceinline__ int tid0() { return (int)threadIdx.x; }
    static __device__ __forceinline__ int tstep() { return KG_FL_THREADS; }
    static __device__ __forceinline__ bool tin(int t) { return t < KG_FL_THREADS; }
    static __device__ __forceinline__ int warp0() { return (int)(threadIdx.x >> 5); }
    static __device__ __forceinline__ int wstep() { return KG_FL_WARPS; }
    static __device__ __forceinline__ bool win(int w) { return w < KG_FL_WARPS; }
    static __device__ __forceinline__ int lane0() { return (int)(threadIdx.x & 31u); }
    static __device__ __forceinline__ int lstep() { return 32; }
    static __device__ __forceinline__ bool lin(int, int l) { return l < 32; }
    static __device__ __forceinline__ void sync() { __syncthreads(); }
    static __device__ __forceinline__ void syncwarp() { __syncwarp(); }
    template <class T> static __device__ __forceinline__ T ld(const T *p) { return *p; }
    template <class T> static __device__ __forceinline__ void st(T *p, T v) { *p = v; }

    /* Accumulators in registers: NN wmma fragments of 16 x 16 floats. */
    template <int NN> struct acc {
        nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f[NN];
    };
    static constexpr int kSlots = 1;
    static __device__ __forceinline__ int slot(int) { return 0; }
    template <int NN> static __device__ __forceinline__ void acc_zero(acc<NN> &c) {
#pragma unroll
        for (int n = 0; n < NN; n++) nvcuda::wmma::fill_fragment(c.f[n], 0.0f);
    }
    template <int NN> static __device__ __forceinline__ void acc_load(acc<NN> &c, const float *p, int ldc) {
#pragma unroll
        for (int n = 0; n < NN; n++)
            nvcuda::wmma::load_matrix_sync(c.f[n], p + 16 * n, (unsigned)ldc, nvcuda::wmma::mem_row_major);
    }
    template <int NN> static __device__ __forceinline__ void acc_store(const acc<NN> &c, float *p, int ldc) {
#pragma unroll
        for (int n = 0; n < NN; n++)
            nvcuda::wmma::store_matrix_sync(p + 16 * n, c.f[n], (unsigned)ldc, nvcuda::wmma::mem_row_major);
    }

    /* kg_flash.cuh's product added into register accumulators: each A
     * fragment loaded once per step of 16 along K. */
    template <int OP, int AT, int BT, int KN, int NN>
    static __device__ __forceinline__ void mma_acc(acc<NN> &c, const uint16_t *a, int lda, const uint16_t *b,
                                                   int ldb) {
        namespace w = nvcuda::wmma;
        typedef typename std::conditional<OP == KG_BF16, __nv_bfloat16, __half>::type E;
        typedef typename std::conditional<AT != 0, w::col_major, w::row_major>::type LA;
        typedef typename std::conditional<BT != 0, w::col_major, w::row_major>::type LB;
#pragma unroll
        for (int k = 0; k < KN; k++) {
            w::fragment<w::matrix_a, 16, 16, 16, E, LA> af;
            w::load_matrix_sync(af, (const E *)(AT ? a + 16 * k * lda : a + 16 * k), (unsigned)lda);
#pragma unroll
            for (int n = 0; n < NN; n++) {
                w::fragment<w::matrix_b, 16, 16, 16, E, LB> bf;
                w::load_matrix_sync(bf, (const E *)(BT ? b + 16 * n * ldb + 16 * k : b + 16 * k * ldb + 16 * n),
                                    (unsigned)ldb);
                w::mma_sync(c.f[n], af, bf, c.f[n]);
            }
        }
    }

    /* The product with C in shared memory (loaded first when accumulating). */
    template <int OP, int AT, int BT, int KN, int NN>
    static __device__ __forceinline__ void mma(float *c, int ldc, const uint16_t *a, int lda, const uint16_t *b,
                                               int ldb, bool accumulate) {
        acc<NN> t;
        if (accumulate) acc_load(t, c, ldc);
        else acc_zero(t);
        mma_acc<OP, AT, BT, KN, NN>(t, a, lda, b, ldb);
        acc_store(t, c, ldc);
    }
};

extern __shared__ __align__(128) unsigned char kg_fl_smem[];

template <int PROG, int OP, int DN> __global__ void __launch_bounds__(KG_FL_THREADS) kg_fl_kernel(kg_flash_args a) {
    int tile, bh;
    kg_fl_block_of(PROG, (size_t)blockIdx.x, a.B, a.NH, a.T, &tile, &bh);
    if constexpr (PROG == KG_FL_FWD) kg_fl_forward_block<kg_fl_dev, OP, DN>(a, kg_fl_smem, tile, bh);
    else if constexpr (PROG == KG_FL_DKDV) kg_fl_dkdv_block<kg_fl_dev, OP, DN>(a, kg_fl_smem, tile, bh);
    else kg_fl_dq_block<kg_fl_dev, OP, DN>(a, kg_fl_smem, tile, bh);
}

/* One program's launch: its dynamic shared memory allowed (above the
 * 48 KiB default), then one block per (tile, head). The allowance is set
 * before every launch, not once per process: it holds for the device
 * current when it is set, and one process may drive several devices (one
 * instance each, from any thread), which a process-wide "done" flag would
 * leave without it. The call is cheap beside the launch. */
template <int PROG, int OP, int DN> static cudaError_t kg_fl_launch(cudaStream_t s, const kg_flash_args &a) {
    const size_t bytes = kg_fl_layout_of(PROG, 16 * DN).bytes;
    const cudaError_t e =
        cudaFuncSetAttribute(kg_fl_kernel<PROG, OP, DN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) return e;
    const size_t nb = kg_fl_blocks(a.B, a.NH, a.T);
    if (nb == 0 || nb > (size_t)INT_MAX) return cudaErrorInvalidValue;
    kg_fl_kernel<PROG, OP, DN><<<(unsigned)nb, KG_FL_THREADS, bytes, s>>>(a);
    return cudaGetLastError();
}

template <int PROG, int OP> static cudaError_t kg_fl_launch_d(cudaStream_t s, int D, const kg_flash_args &a) {
    switch (D) {
    case 16: return kg_fl_launch<PROG, OP, 1>(s, a);
    case 32: return kg_fl_launch<PROG, OP, 2>(s, a);
    case 64: return kg_fl_launch<PROG, OP, 4>(s, a);
    case 128: return kg_fl_launch<PROG, OP, 8>(s, a);
    default: return cudaErrorInvalidValue;
    }
}

template <int PROG> static cudaError_t kg_fl_launch_any(cudaStream_t s, int D, const kg_flash_args &a) {
    return a.rd == KG_BF16 ? kg_fl_launch_d<PROG, KG_BF16>(s, D, a) : kg_fl_launch_d<PROG, KG_F16>(s, D, a);
}

size_t kg_flash_smem_bytes(int D) { return kg_fl_smem_most(D); }

cudaError_t kg_flash_forward(cudaStream_t s, void *out, void *lse, const void *qkv, int B, int T, int C, int NH,
                             int round_dtype, int sdt) {
    if (B <= 0 || T <= 0 || NH <= 0 || C % NH != 0 || !kg_flash_supported(KG_F32, round_dtype, C / NH) ||
        (sdt != KG_F32 && sdt != round_dtype))
        return cudaErrorInvalidValue;
    const int D = C / NH;
    kg_flash_args a = {qkv,   NULL, NULL, NULL, NULL, out, (float *)lse, NULL, B, T, C, NH, round_dtype,
                       (float)(1.0 / sqrt((double)D)), sdt != KG_F32};
    return kg_fl_launch_any<KG_FL_FWD>(s, D, a);
}

cudaError_t kg_flash_backward(cudaStream_t s, void *dqkv, const void *dout, const void *qkv, const void *out,
                              const void *lse, int B, int T, int C, int NH, int round_dtype, int sdt, double *delta) {
    if (B <= 0 || T <= 0 || NH <= 0 || C % NH != 0 || !kg_flash_supported(KG_F32, round_dtype, C / NH) || !delta ||
        (sdt != KG_F32 && sdt != round_dtype))
        return cudaErrorInvalidValue;
    const int D = C / NH;
    cudaError_t e = kg_attn_delta(s, sdt, dout, out, B, T, C, NH, delta);
    if (e != cudaSuccess) return e;
    kg_flash_args a = {qkv,  dout, out,         (const float *)lse, delta, NULL, NULL, dqkv, B, T, C, NH,
                       round_dtype, (float)(1.0 / sqrt((double)D)), sdt != KG_F32};
    if ((e = kg_fl_launch_any<KG_FL_DKDV>(s, D, a)) != cudaSuccess) return e;
    return kg_fl_launch_any<KG_FL_DQ>(s, D, a);
}
