/*
 * fake_internal.h — the services fake_cudart.c gives the other two fakes
 * (fake_cublaslt.c, fake_kg.c, fake_kg_seq.c): the statistics, failure injection, the
 * device-memory registry's range checks, contract-violation reports and
 * draining a stream's queued work before a "kernel" runs on it. All hidden
 * inside the fake plugin library. Single-threaded, like the plugin (one
 * stream, driven from one thread).
 */
#ifndef KILN_TESTS_FAKE_INTERNAL_H
#define KILN_TESTS_FAKE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "fake_cuda.h"

extern fake_cuda_stats fake_stats;

/* 1 when KILN_FAKE_CUDA_FAIL says this call of `fn` fails (counted). */
int fake_inject(const char *fn);

/* Records e as the runtime's last error (cudaGetLastError) and returns it. */
cudaError_t fake_error(cudaError_t e);
/* An injected kernel fault (fake_fault(e), from fake_launch and the
 * synchronisations) is sticky:
 * fake_lost() returns its error while KILN_FAKE_CUDA_FAIL keeps the value
 * that injected it, cudaSuccess otherwise; every call that would reach the
 * device starts with FAKE_RETURN_IF_LOST(). */
cudaError_t fake_lost(void);
void fake_fault(cudaError_t e);
#define FAKE_RETURN_IF_LOST()                     \
    do {                                          \
        const cudaError_t lost_ = fake_lost();    \
        if (lost_ != cudaSuccess) return lost_;   \
    } while (0)

/* Counts and (unless KILN_FAKE_CUDA_QUIET) prints a contract violation. */
void fake_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* 1 when [p, p + bytes) lies inside one live cudaMalloc block (bytes 0:
 * always 1). */
int fake_is_device_range(const void *p, size_t bytes);
/* 1 when p lies inside any live cudaMalloc block. */
int fake_is_device_ptr(const void *p);

/* The live cudaMalloc block holding p: 1 with its start and size, or 0
 * (the host-execution build's two-schedule check, tests/cuda_host/kgx.cpp,
 * snapshots the blocks a kernel may write). */
int fake_device_block_of(const void *p, void **base, size_t *bytes);

/* fake_is_device_range or a violation naming fn and what; returns
 * cudaSuccess or cudaErrorIllegalAddress (already recorded as last error). */
cudaError_t fake_need_device(const char *fn, const char *what, const void *p, size_t bytes);

/* Runs everything queued on stream s (0: the legacy default stream, which
 * has no queue), for a kernel about to run on it. cudaErrorInvalidResourceHandle
 * for a handle that is not a live stream. */
cudaError_t fake_stream_drain(cudaStream_t s, const char *fn);

/* How many times stream s has been waited for as a whole (its own
 * cudaStreamSynchronize, or cudaDeviceSynchronize); (unsigned long)-1 for
 * the legacy stream or a stream that is no longer live (destroying a
 * stream lets its work finish). cuBLASLt's fake compares two readings to
 * tell whether a GEMM it queued has been waited for. */
unsigned long fake_stream_syncs(cudaStream_t s);

/* Sealed device memory (fake_cudart.c): every operation of the fake that
 * touches device memory is a scope, opened with FAKE_SCOPE() at the top of
 * the function; fake_need_device (and so fake_launch) opens the blocks it
 * checks for the operation, and the end of the outermost scope seals them
 * again. A block touched without being opened faults. fake_seal_off():
 * blocks allocated from then on are plain host memory (the host-execution
 * build). */
int fake_scope_begin(void);
void fake_scope_end(int *depth);
#define FAKE_SCOPE() __attribute__((cleanup(fake_scope_end))) int fake_scope_depth_ = fake_scope_begin()
void fake_seal_off(void);
/* The operation in progress (a kernel launch, a GEMM) is work on stream s:
 * the blocks fake_need_device checks until its scope ends are recorded as
 * used by it, so the fake can tell whether the host waited for them
 * before the fake NCCL takes them (fake_cuda_hold). */
void fake_work_on(cudaStream_t s);

/* The prologue every fake launcher with work runs (fake_kg.c): each of up
 * to 8 buffers must be device memory (a violation otherwise, answered with
 * cudaErrorIllegalAddress), then the stream's queued work runs, since a
 * kernel runs after what was queued before it; counts the kernel. */
typedef struct fake_buf {
    const char *what;
    const void *p;
    size_t bytes;
} fake_buf;
cudaError_t fake_launch(const char *fn, cudaStream_t s, const fake_buf *bufs, int nbufs);

/* A violation (returning 1) when [a, +na) and [b, +nb) overlap: the
 * kernels mark these operands __restrict__, or kg_kernels.h forbids it. */
int fake_overlap(const char *fn, const char *wa, const void *a, size_t na, const char *wb, const void *b, size_t nb);

/* ABI 1.7's 16-bit activation storage, computed as the kernels define it:
 * the float32 computation on the widened values, each 16-bit output
 * rounded to nearest even as stored. fake_act16: dt is KG_F16 or KG_BF16.
 * fake_widen16: a malloc'ed float copy of src(n) in dt (NULL when out of
 * memory: the caller answers cudaErrorMemoryAllocation); fake_store16:
 * dst(n) in dt = src(n) rounded. */
int fake_act16(int dt);
float *fake_widen16(int dt, const void *src, size_t n);
void fake_store16(int dt, void *dst, const float *src, size_t n);

#endif /* KILN_TESTS_FAKE_INTERNAL_H */
