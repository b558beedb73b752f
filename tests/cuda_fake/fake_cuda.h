/*
 * fake_cuda.h — what the "fake CUDA" build of the cuda accelerator plugin
 * (tests/cuda_fake) shares between its three fakes (fake_cudart.c: the CUDA
 * runtime on host memory; fake_cublaslt.c: cuBLASLt as a column-major
 * reference GEMM; fake_kg.c: kernels/cuda's launchers on the CPU kernels)
 * and the tests that drive it. The fakes are compiled into the plugin
 * library itself (hidden, bound inside it, so a real libcudart elsewhere in
 * the process can never interpose); the one thing the library exports
 * besides the plugin entry is fake_cuda_get_stats(), which a test finds with
 * dlopen(RTLD_NOLOAD) + dlsym to see what the plugin asked of "the GPU".
 * Device memory is host memory from a registry of live cudaMalloc blocks,
 * so every pointer a CUDA call or kernel receives is range-checked against
 * it (a device operand outside any block, or a host operand inside one, is
 * a contract violation: counted, printed, and the call fails). Work queued
 * on a stream (async copies into or out of pinned memory, device-to-device
 * copies, memsets, event records) runs only when something waits for it
 * (stream or event synchronize, a blocking copy, a kernel or GEMM on that
 * stream, cudaFree), as on a GPU, so a missing synchronisation shows up as
 * stale or corrupted data rather than passing by luck. Environment, read
 * at every call so a test can change it between calls:
 *   KILN_FAKE_CUDA_DEVICES=N    visible devices (default 1; 0: none)
 *   KILN_FAKE_CUDA_DRIVER=V     cudaDriverGetVersion's answer (default
 *                               13000; 0: no driver installed); only an
 *                               older major release than the runtime's is
 *                               insufficient (minor-version compatibility)
 *   KILN_FAKE_CUDA_RUNTIME=V    cudaRuntimeGetVersion's answer (default
 *                               CUDART_VERSION)
 *   KILN_FAKE_CUDA_OOM_AFTER=N  device capacity in bytes: cudaMalloc fails
 *                               with cudaErrorMemoryAllocation when the live
 *                               blocks plus the request would exceed it
 *   KILN_FAKE_CUDA_FAIL=LIST    comma-separated function names (cudaX,
 *                               cublasLtX, kg_x) that fail: "name" on every
 *                               call, "name@N" on its N-th call counted from
 *                               when the variable took its current value;
 *                               "kernel_fault" is a kernel that faults: its
 *                               launch succeeds, and every later device
 *                               call fails with a sticky
 *                               cudaErrorIllegalAddress until the variable
 *                               changes (injected waits fault the same way)
 *   KILN_FAKE_CUDA_QUIET=1      do not print contract violations
 *   KILN_FAKE_CUDA_SMEM_OPTIN=N the shared memory a block may opt into,
 *                               bytes (default 232448, an H100/H200's)
 *   KILN_FAKE_CUDA_SEAL=0       device blocks allocated from then on are
 *                               plain host memory; by default each is
 *                               sealed (PROT_NONE) except while a CUDA
 *                               call or kernel of the fake uses it, so host
 *                               code that reads or writes device memory
 *                               faults at once, as it would on a GPU, and
 *                               the fault names the block
 */
#ifndef KILN_TESTS_FAKE_CUDA_H
#define KILN_TESTS_FAKE_CUDA_H

#include <stddef.h>

/* Counters since the library was loaded. "live" counts are current. */
typedef struct fake_cuda_stats {
    unsigned long mallocs;          /* successful cudaMalloc calls            */
    unsigned long malloc_failures;  /* cudaMalloc calls that failed           */
    unsigned long frees;            /* successful cudaFree calls (non-NULL)   */
    size_t live_blocks, live_bytes; /* device memory now allocated            */
    size_t peak_bytes;
    unsigned long host_allocs;      /* cudaHostAlloc calls that succeeded     */
    size_t live_host_blocks;
    unsigned long streams_live, events_live;
    unsigned long lt_handles_live;  /* cublasLtCreate minus cublasLtDestroy   */
    unsigned long lt_objects_live;  /* descriptors, layouts, preferences      */
    unsigned long heuristics;       /* cublasLtMatmulAlgoGetHeuristic calls   */
    unsigned long matmuls;          /* cublasLtMatmul calls that ran          */
    unsigned long kernels;          /* kg_* launches that ran                 */
    unsigned long h2d_async_pinned; /* async H2D copies from pinned memory    */
    unsigned long syncs;            /* stream/event synchronisations          */
    unsigned long violations;       /* contract violations (see above)        */
    unsigned long injected;         /* failures injected by KILN_FAKE_CUDA_FAIL */
    unsigned long memsets;          /* cudaMemset*(Async) calls on device memory */
    size_t memset_bytes;            /* bytes they set                          */
    unsigned long d2h_copies;       /* device-to-host copies (read-backs)      */
    unsigned long matmuls_16bit;    /* matmuls with fp16/bf16 A and B (tensor cores) */
    unsigned long matmuls_fp32;     /* with fp32 A and B in full fp32 (no TF32) */
    unsigned long matmuls_bias16;   /* with the bias epilogue on a 16-bit output */
    unsigned long round_add_16bit;  /* kg_round_add calls widening a 16-bit product */
    unsigned long sealed_mallocs;   /* cudaMalloc blocks sealed (KILN_FAKE_CUDA_SEAL) */
    char last_violation[256];
} fake_cuda_stats;

/* Exported by the fake plugin library (default visibility, version script
 * tests/cuda_fake/fake-plugin.map). */
typedef void (*fake_cuda_get_stats_fn)(fake_cuda_stats *out);
#define FAKE_CUDA_GET_STATS "fake_cuda_get_stats"
/* Holds [p, p + n) of device memory (on = 1) until the matching call
 * with on = 0, for a fake in another library that reads and writes device
 * memory from the host as the GPU would: the fake NCCL, while a collective
 * is in flight on NCCL's own stream. Its block stays open (unsealed)
 * meanwhile. A contract violation: taking a block whose latest kernel,
 * GEMM or copy the host has not waited for, and work on held bytes.
 * Pointers outside device memory are ignored. */
typedef void (*fake_cuda_hold_fn)(const void *p, size_t n, int on);
#define FAKE_CUDA_HOLD "fake_cuda_hold"

#endif /* KILN_TESTS_FAKE_CUDA_H */
