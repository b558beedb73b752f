/*
 * fake_cudart_ddp.c — the few CUDA runtime functions plugins/ddp/ddp_nccl.c
 * calls, with cuda_runtime_api.h's signatures, for the "ddp over fake NCCL"
 * test plugin (tests/ddp_nccl_fake). The accelerator's memory is the fake
 * cuda plugin's (host memory, in another library whose registry is hidden),
 * so cudaPointerGetAttributes cannot look a pointer up: with
 * KILN_FAKE_NCCL_ALL_DEVICE=1 it calls every non-NULL pointer device memory
 * (ddp asks only when the accelerator's table lacks KILN_KERNELS_HOST_MEMORY,
 * i.e. for the fake cuda plugin's parameters), otherwise "unregistered host
 * memory", as the real runtime answers for malloc'd memory. Streams are
 * queues of the MPI requests fake_nccl.c started: cudaStreamQuery tests them
 * in order (MPI_Test also drives MPI's progress) and answers
 * cudaErrorNotReady while one is pending, cudaStreamSynchronize waits for
 * them, as a GPU stream running NCCL kernels would; fake_nccl.c's injected
 * failures put ops on them that never complete or that fail. The current device is
 * this library's own (0 unless cudaSetDevice said otherwise): the
 * accelerator's cudaSetDevice went to the other fake.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_nccl_internal.h"

static cudaError_t fake_last = cudaSuccess;
static int fake_device = 0;

static cudaError_t fake_err(cudaError_t e) {
    if (e != cudaSuccess) fake_last = e;
    return e;
}

cudaError_t CUDARTAPI cudaGetLastError(void) {
    cudaError_t e = fake_last;
    fake_last = cudaSuccess;
    return e;
}

const char *CUDARTAPI cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (fake)";
    case cudaErrorNotReady: return "device not ready (fake)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle (fake)";
    case cudaErrorMemoryAllocation: return "out of memory (fake)";
    case cudaErrorUnknown: return "unspecified launch failure: an MPI request of fake NCCL failed";
    case cudaErrorLaunchFailure: return "unspecified launch failure (fake: injected into an NCCL kernel)";
    default: return "unrecognized error code (fake)";
    }
}

cudaError_t CUDARTAPI cudaGetDevice(int *device) {
    if (!device) return fake_err(cudaErrorInvalidValue);
    *device = fake_device;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
    if (device < 0) return fake_err(cudaErrorInvalidDevice);
    fake_device = device;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
    if (!attributes) return fake_err(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    const char *all = getenv("KILN_FAKE_NCCL_ALL_DEVICE");
    if (ptr && all && strcmp(all, "1") == 0) {
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = fake_device;
        attributes->devicePointer = (void *)(uintptr_t)ptr;
        return cudaSuccess;
    }
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = (void *)(uintptr_t)ptr;
    return cudaSuccess;
}

/* ------------------------------------------------------------- streams */

/* Live streams, so ncclCommAbort can drop its requests from all of them. */
#define FAKE_MAX_STREAMS 16
static struct CUstream_st *fake_streams[FAKE_MAX_STREAMS];

int fake_stream_valid(cudaStream_t s) {
    if (!s) return 0;
    for (int i = 0; i < FAKE_MAX_STREAMS; i++)
        if (fake_streams[i] == s) return s->magic == FAKE_NCCL_STREAM_MAGIC;
    return 0;
}

int fake_stream_push(cudaStream_t s, fake_nccl_op op) {
    if (s->count == FAKE_NCCL_STREAM_DEPTH) return -1;
    s->ops[(s->head + s->count) % FAKE_NCCL_STREAM_DEPTH] = op;
    s->count++;
    return 0;
}

void fake_stream_forget(struct ncclComm *comm) {
    for (int i = 0; i < FAKE_MAX_STREAMS; i++) {
        struct CUstream_st *s = fake_streams[i];
        if (!s) continue;
        /* keep the others' entries in order; the abandoned requests leak,
         * as NCCL's aborted kernels are simply gone (and their buffers stay
         * held: MPI may still write them) */
        int kept = 0;
        fake_nccl_op keep[FAKE_NCCL_STREAM_DEPTH];
        for (int k = 0; k < s->count; k++) {
            const fake_nccl_op *op = &s->ops[(s->head + k) % FAKE_NCCL_STREAM_DEPTH];
            if (op->comm != comm) keep[kept++] = *op;
        }
        memcpy(s->ops, keep, sizeof(fake_nccl_op) * (size_t)kept);
        s->head = 0;
        s->count = kept;
    }
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    (void)flags;
    if (!pStream) return fake_err(cudaErrorInvalidValue);
    for (int i = 0; i < FAKE_MAX_STREAMS; i++)
        if (!fake_streams[i]) {
            struct CUstream_st *s = calloc(1, sizeof *s);
            if (!s) return fake_err(cudaErrorMemoryAllocation);
            s->magic = FAKE_NCCL_STREAM_MAGIC;
            fake_streams[i] = s;
            *pStream = s;
            return cudaSuccess;
        }
    return fake_err(cudaErrorMemoryAllocation);
}

/* Completes what is done, in order; wait: block on each instead. A stuck
 * op never completes (a synchronize then blocks for ever, as on a GPU); a
 * failing one stays at the head and fails every query, as a sticky error. */
static cudaError_t fake_stream_progress(cudaStream_t s, int wait) {
    if (!fake_stream_valid(s)) return fake_err(cudaErrorInvalidResourceHandle);
    while (s->count > 0) {
        fake_nccl_op *op = &s->ops[s->head];
        if (op->how == FAKE_OP_FAILS) {
            fake_nccl_kernel_failed(op->comm);
            return fake_err(cudaErrorLaunchFailure);
        }
        if (op->how == FAKE_OP_STUCK) {
            if (!wait) return cudaErrorNotReady;
            for (;;) {
                struct timespec nap = {1, 0};
                nanosleep(&nap, NULL);
            }
        }
        int done = 0;
        int err = wait ? MPI_Wait(&op->req, MPI_STATUS_IGNORE) : MPI_Test(&op->req, &done, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS) return fake_err(cudaErrorUnknown);
        if (!wait && !done) return cudaErrorNotReady; /* not an error: not recorded */
        fake_nccl_hold(op->buf, op->bytes, 0);
        s->head = (s->head + 1) % FAKE_NCCL_STREAM_DEPTH;
        s->count--;
    }
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream) { return fake_stream_progress(stream, 0); }

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) { return fake_stream_progress(stream, 1); }

/* As on a GPU, destroying a stream with work pending does not wait for it;
 * the requests are dropped (only after an abort can there be any). */
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
    if (!fake_stream_valid(stream)) return fake_err(cudaErrorInvalidResourceHandle);
    for (int i = 0; i < FAKE_MAX_STREAMS; i++)
        if (fake_streams[i] == stream) fake_streams[i] = NULL;
    stream->magic = 0;
    free(stream);
    return cudaSuccess;
}
