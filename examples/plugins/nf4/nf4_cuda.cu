/*
 * nf4_cuda.cu — the nf4/int4 quantize-dequantize of convert_params as a CUDA
 * kernel (see nf4_cuda.h): one thread per block of `block` weights, with the
 * arithmetic of nf4_quant.c operation for operation (a true division w / m,
 * the NF4 code as the count of decision thresholds below it, int4 rounding
 * half away from zero from the exact remainder, absmax * table[code]), so
 * the compute copy is the one the host path would write. Built with
 * --fmad=false (CMakeLists.txt): nothing here may fuse a multiply into an
 * add. Launched on the legacy default stream, one launch per weight and one
 * wait for them all (nf4_cuda_finish): the plugin has already waited for the
 * accelerator's stream (its synchronize()), and the module's next kernels
 * are queued only after the wait.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "nf4_cuda.h"
extern "C" { /* nf4_quant.h is a C header */
#include "nf4_quant.h"
}

/* The table and, for nf4, the 15 decision thresholds, by value. */
typedef struct {
    float t[16];
    float mid[15];
} nf4_tables;

static __device__ __forceinline__ int nf4_round_half_away(float y) {
    int q = (int)y;
    float r = y - (float)q;
    return q + (r >= 0.5f) - (r <= -0.5f);
}

static __device__ __forceinline__ uint16_t nf4_bf16_bits(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays a (quiet) NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__global__ void nf4_fake_quant_kernel(int kind, const float *__restrict__ w, size_t numel, size_t block,
                                      void *__restrict__ out, int bf16, nf4_tables tab) {
    const size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t start = b * block;
    if (start >= numel) return;
    const size_t n = numel - start < block ? numel - start : block;
    const float *x = w + start;
    float m = 0.0f;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        finite &= a <= 3.40282347e38f; /* false for inf and NaN */
        m = a > m ? a : m;
    }
    const int zero_code = kind == NF4Q_INT4 ? 8 : 7;
    for (size_t i = 0; i < n; i++) {
        int code;
        float absmax = m;
        if (!finite || m == 0.0f) {
            code = zero_code;
            absmax = finite ? 0.0f : NAN;
        } else if (kind == NF4Q_INT4) {
            code = nf4_round_half_away(x[i] / m * 7.0f) + 8;
        } else {
            const float v = x[i] / m;
            code = 0;
            for (int j = 0; j < 15; j++) code += v > tab.mid[j];
        }
        const float d = absmax * tab.t[code];
        if (bf16) ((uint16_t *)out)[start + i] = nf4_bf16_bits(d);
        else ((float *)out)[start + i] = d;
    }
}

extern "C" int nf4_cuda_usable(const void *p) {
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or device: not an error of ours */
        return 0;
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) return 0;
    return cudaSetDevice(attr.device) == cudaSuccess;
}

extern "C" int nf4_cuda_fake_quant(int kind, const float *w, size_t numel, size_t block, void *compute, int bf16,
                                   char *err, size_t errlen) {
    if (numel == 0) return 0;
    nf4_tables tab;
    const float *t = nf4q_table(kind);
    for (int i = 0; i < 16; i++) tab.t[i] = t[i];
    for (int i = 0; i < 15; i++) tab.mid[i] = (nf4q_nf4_table[i] + nf4q_nf4_table[i + 1]) * 0.5f; /* nf4_quant.c's */
    const size_t blocks = (numel + block - 1) / block;
    const unsigned threads = 128, grid = (unsigned)((blocks + threads - 1) / threads);
    nf4_fake_quant_kernel<<<grid, threads, 0, 0>>>(kind, w, numel, block, compute, bf16, tab);
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    snprintf(err, errlen, "nf4_fake_quant_kernel<<<>>> failed: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    return -1;
}

extern "C" int nf4_cuda_finish(char *err, size_t errlen) {
    const cudaError_t e = cudaStreamSynchronize(0);
    if (e == cudaSuccess) return 0;
    snprintf(err, errlen, "cudaStreamSynchronize failed: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    return -1;
}
