/*
 * kg_flash.cu: the device side of the fused ("flash") causal attention:
 * kg_flash.cuh's block programs instantiated with kg_fl_dev, the policy of
 * a real CUDA block (threadIdx, __syncthreads, warp shuffles, and the
 * tensor cores through PTX's ldmatrix and mma.sync m16n8k16 on bf16 or f16
 * operands with float accumulators: sm_80 and newer), their kernels and
 * the launchers of kg_kernels.h.
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
    template <class T> static __device__ __forceinline__ T ld(const T *p) { return *p; }
    template <class T> static __device__ __forceinline__ void st(T *p, T v) { *p = v; }

    /* A thread holds its own lane's registers (kg_flash.cuh's policy
     * contract); what a warp keeps across barriers, once. */
    static constexpr int NL = 1;
    static __device__ __forceinline__ int li(int) { return 0; }
    static constexpr int kSlots = 1;
    static __device__ __forceinline__ int slot(int) { return 0; }

    /* ldmatrix.x4 (sm_75 and newer): this lane's row address p[0]. */
    template <int TRANS>
    static __device__ __forceinline__ void ldsm(uint32_t (&r)[4][NL], const uint16_t *const (&p)[NL]) {
        const unsigned addr = (unsigned)__cvta_generic_to_shared(p[0]);
        if constexpr (TRANS)
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(r[0][0]), "=r"(r[1][0]), "=r"(r[2][0]), "=r"(r[3][0])
                         : "r"(addr));
        else
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(r[0][0]), "=r"(r[1][0]), "=r"(r[2][0]), "=r"(r[3][0])
                         : "r"(addr));
    }

    /* mma.sync m16n8k16 (sm_80 and newer), float accumulators in place. */
    template <int OP>
    static __device__ __forceinline__ void mma(float (&d)[4][NL], const uint32_t (&a)[4][NL],
                                               const uint32_t (&b)[4][NL], int h) {
        if constexpr (OP == KG_BF16)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                         "{%8, %9}, {%0, %1, %2, %3};\n"
                         : "+f"(d[0][0]), "+f"(d[1][0]), "+f"(d[2][0]), "+f"(d[3][0])
                         : "r"(a[0][0]), "r"(a[1][0]), "r"(a[2][0]), "r"(a[3][0]), "r"(b[2 * h][0]),
                           "r"(b[2 * h + 1][0]));
        else
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                         "{%8, %9}, {%0, %1, %2, %3};\n"
                         : "+f"(d[0][0]), "+f"(d[1][0]), "+f"(d[2][0]), "+f"(d[3][0])
                         : "r"(a[0][0]), "r"(a[1][0]), "r"(a[2][0]), "r"(a[3][0]), "r"(b[2 * h][0]),
                           "r"(b[2 * h + 1][0]));
    }

    static __device__ __forceinline__ void shfl_xor(float (&v)[NL], int m) {
        v[0] = __shfl_xor_sync(0xffffffffu, v[0], m);
    }

    /* Two floats rounded to nearest even in one instruction (cvt.rn.bf16x2
     * / .f16x2): the bits of kg_bf16_bits / kg_f16_bits for every value
     * but NaN, which neither P nor dS is unless an input is. */
    template <int OP> static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
        if constexpr (OP == KG_BF16) {
            const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
            return *(const uint32_t *)&v;
        } else {
            const __half2 v = __floats2half2_rn(lo, hi);
            return *(const uint32_t *)&v;
        }
    }
};

extern __shared__ __align__(128) unsigned char kg_fl_smem[];

template <int PROG, int OP, int DN> __global__ void __launch_bounds__(KG_FL_THREADS, 2) kg_fl_kernel(kg_flash_args a) {
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
