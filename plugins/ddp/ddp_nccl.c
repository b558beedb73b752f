/*
 * ddp_nccl.c — the GPU path of the "ddp" strategy: when the parameters live
 * in CUDA device memory (the cuda accelerator), gradients are averaged and
 * the initial weights broadcast with NCCL instead of being staged through
 * host memory for MPI. The communicator is created on the device the
 * accelerator made current (its configure() picked it from the local rank),
 * bootstrapped by broadcasting rank 0's ncclUniqueId over the MPI
 * communicator ddp already has, or, in a launch without MPI (bootstrap
 * "tcp"), through ddp_tcp.c at MASTER_ADDR:MASTER_PORT; then the host
 * collectives (metrics, barriers, plugin data) run here on NCCL too, staged
 * through a small device buffer. NCCL runs on a stream of its own. The
 * strategy cannot see the accelerator's stream through the ABI, so ddp.c
 * synchronises the accelerator (K->synchronize) before a collective reads
 * device buffers, and each collective here waits for NCCL's stream before
 * returning, so the accelerator's next kernels see the result. Failures
 * become KILN_E_COMM (NCCL) or KILN_E_CUDA with the call, the rank and
 * NCCL's or CUDA's text. Built only with KILN_DDP_NCCL.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "ddp_internal.h"
#include "ddp_tcp.h"

typedef struct ddp_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    int aborted;  /* ncclCommAbort ran (timeout): do not destroy again */
} ddp_nccl;

static int32_t ddp_nccl_fail(kiln_instance *self, ncclResult_t r, const char *call) {
    return kiln_errorf(self->svc, self->hctx, KILN_E_COMM, "ddp: rank %d of %d: %s failed: %s (%s)", (int)self->rank,
                       (int)self->world, call, ncclGetErrorString(r), ncclGetLastError(NULL));
}

static int32_t ddp_cuda_fail(kiln_instance *self, cudaError_t e, const char *call) {
    (void)cudaGetLastError();
    return kiln_errorf(self->svc, self->hctx, KILN_E_CUDA, "ddp: rank %d of %d: %s failed: %s", (int)self->rank,
                       (int)self->world, call, cudaGetErrorString(e));
}

void ddp_nccl_is_device(const void *ptr, int *is_device) {
    *is_device = 0;
    if (!ptr) return;
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, ptr) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver, or not CUDA memory */
        return;
    }
    *is_device = at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

int32_t ddp_nccl_init(kiln_instance *self) {
    if (self->nccl) return KILN_OK;
    ddp_nccl *n = calloc(1, sizeof *n);
    if (!n) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "ddp: out of memory for the NCCL state");
    cudaError_t e = cudaGetDevice(&n->device);
    if (e != cudaSuccess) {
        free(n);
        return ddp_cuda_fail(self, e, "cudaGetDevice");
    }
    ncclUniqueId id;
    ncclResult_t r = ncclSuccess;
    if (self->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) {
        free(n);
        return ddp_nccl_fail(self, r, "ncclGetUniqueId");
    }
    if (self->tcp_boot) {
        char err[512];
        if (ddp_tcp_bcast(self->master_addr, self->master_port, (int)self->rank, (int)self->world, self->timeout_s,
                          &id, sizeof id, err, sizeof err)) {
            free(n);
            return kiln_errorf(self->svc, self->hctx, KILN_E_COMM,
                               "ddp: rank %d of %d: TCP rendezvous at %s:%d (MASTER_ADDR:MASTER_PORT): %s",
                               (int)self->rank, (int)self->world, self->master_addr, self->master_port, err);
        }
    } else {
        /* every rank reaches this broadcast, also when rank 0 failed above
         * (it returned, so the others fail in MPI with the job, not hang) */
        MPI_Request req;
        int err = MPI_Ibcast(&id, (int)sizeof id, MPI_BYTE, 0, self->comm, &req);
        int32_t rc = err == MPI_SUCCESS ? ddp_wait(self, &req, "MPI_Ibcast(ncclUniqueId)") : KILN_E_COMM;
        if (rc != KILN_OK) {
            free(n);
            if (err != MPI_SUCCESS)
                return kiln_errorf(self->svc, self->hctx, KILN_E_COMM,
                                   "ddp: rank %d of %d: MPI_Ibcast(ncclUniqueId) failed", (int)self->rank,
                                   (int)self->world);
            return rc;
        }
    }
    if ((e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(n);
        return ddp_cuda_fail(self, e, "cudaStreamCreateWithFlags(NCCL stream)");
    }
    if ((r = ncclCommInitRank(&n->comm, self->world, id, self->rank)) != ncclSuccess) {
        (void)cudaStreamDestroy(n->stream);
        free(n);
        return ddp_nccl_fail(self, r, "ncclCommInitRank");
    }
    self->nccl = n;
    int v = 0;
    (void)ncclGetVersion(&v);
    kiln_logf(self->svc, self->hctx, KILN_LOG_INFO, "ddp: rank %d: NCCL %d.%d.%d on device %d (collectives on their own stream)",
              (int)self->rank, v / 10000, (v / 100) % 100, v % 100, n->device);
    return KILN_OK;
}

static ncclDataType_t ddp_nccl_type(uint32_t dtype) { return dtype == KILN_DTYPE_F64 ? ncclFloat64 : ncclFloat32; }

/* Waits for NCCL's stream like NCCL's own watchdogs do: polling the stream
 * and the communicator's asynchronous error, pausing between polls as
 * ddp_backoff says; past timeout_s (a hung peer never joins the collective)
 * the communicator is aborted, which frees the stream, and the collective
 * fails with a message instead of blocking for ever. */
static int32_t ddp_nccl_wait(kiln_instance *self, ddp_nccl *n, const char *what) {
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long nap_ns = 50000;
    for (;;) {
        cudaError_t e = cudaStreamQuery(n->stream);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) return ddp_cuda_fail(self, e, what);
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &async);
        if (r != ncclSuccess) return ddp_nccl_fail(self, r, "ncclCommGetAsyncError");
        if (async != ncclSuccess && async != ncclInProgress) return ddp_nccl_fail(self, async, what);
        clock_gettime(CLOCK_MONOTONIC, &now);
        const double waited = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (self->timeout_s > 0 && waited > self->timeout_s) {
            (void)ncclCommAbort(n->comm);
            n->aborted = 1;
            self->timed_out = 1;
            return kiln_errorf(self->svc, self->hctx, KILN_E_COMM,
                               "ddp: rank %d of %d: %s did not complete within timeout_s = %g s: another rank is "
                               "hung, stopped or far slower; NCCL communicator aborted",
                               (int)self->rank, (int)self->world, what, self->timeout_s);
        }
        ddp_backoff(waited, &nap_ns);
    }
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(n->comm, &async);
    if (r != ncclSuccess) return ddp_nccl_fail(self, r, "ncclCommGetAsyncError");
    if (async != ncclSuccess) return ddp_nccl_fail(self, async, what);
    return KILN_OK;
}

int32_t ddp_nccl_bcast(kiln_instance *self, void *dev, int64_t count, uint32_t dtype) {
    ddp_nccl *n = self->nccl;
    if (self->timed_out) return ddp_dead(self, "ncclBroadcast(parameters)");
    ncclResult_t r = ncclBroadcast(dev, dev, (size_t)count, ddp_nccl_type(dtype), 0, n->comm, n->stream);
    if (r != ncclSuccess) return ddp_nccl_fail(self, r, "ncclBroadcast(parameters)");
    return ddp_nccl_wait(self, n, "ncclBroadcast(parameters)");
}

int32_t ddp_nccl_allreduce_avg(kiln_instance *self, void *dev, int64_t count, uint32_t dtype) {
    ddp_nccl *n = self->nccl;
    if (self->timed_out) return ddp_dead(self, "ncclAllReduce(gradients, AVG)");
    ncclResult_t r = ncclAllReduce(dev, dev, (size_t)count, ddp_nccl_type(dtype), ncclAvg, n->comm, n->stream);
    if (r != ncclSuccess) return ddp_nccl_fail(self, r, "ncclAllReduce(gradients, AVG)");
    return ddp_nccl_wait(self, n, "ncclAllReduce(gradients, AVG)");
}

/* ------------------------------------------------------------------------ */
/* Host collectives of a tcp-bootstrapped job */

/* The accelerator, the communicator and a staging buffer of at least bytes;
 * refuses an accelerator whose memory is not CUDA device memory. */
static int32_t ddp_host_ready(kiln_instance *self, size_t bytes) {
    int32_t rc;
    if (!self->K && (rc = self->svc->accelerator(self->hctx, &self->acc, &self->K)) != KILN_OK)
        return kiln_errorf(self->svc, self->hctx, rc, "ddp: rank %d: no accelerator for the collectives",
                           (int)self->rank);
    if (bytes < 64) bytes = 64;
    if (self->hdev_bytes < bytes) {
        if (self->hdev) self->K->free(self->acc, self->hdev);
        self->hdev = NULL;
        self->hdev_bytes = 0;
        if ((rc = self->K->alloc(self->acc, bytes, &self->hdev)) != KILN_OK)
            return kiln_errorf(self->svc, self->hctx, rc, "ddp: rank %d: cannot allocate %zu device bytes for a "
                               "collective (%s)", (int)self->rank, bytes, kiln_status_name(rc));
        self->hdev_bytes = bytes;
        int is_dev = 0;
        ddp_nccl_is_device(self->hdev, &is_dev);
        if (!is_dev)
            return kiln_errorf(self->svc, self->hctx, KILN_E_CONFIG,
                               "ddp: rank %d: a launch without MPI (bootstrap \"tcp\") runs every collective on "
                               "NCCL and needs the cuda accelerator; on CPU, launch through mpirun or srun",
                               (int)self->rank);
    }
    return self->nccl ? KILN_OK : ddp_nccl_init(self);
}

/* Moves bytes between host and the staging buffer and waits for the
 * accelerator, so NCCL's stream sees a finished copy (H2D) and the caller a
 * finished result (D2H). */
static int32_t ddp_host_copy(kiln_instance *self, void *dst, const void *src, size_t bytes, int32_t kind) {
    int32_t rc = bytes ? self->K->copy(self->acc, dst, src, bytes, kind) : KILN_OK;
    if (rc == KILN_OK) rc = self->K->synchronize(self->acc);
    if (rc != KILN_OK)
        return kiln_errorf(self->svc, self->hctx, rc, "ddp: rank %d: staging a collective through the device failed "
                           "(%s)", (int)self->rank, kiln_status_name(rc));
    return KILN_OK;
}

int32_t ddp_nccl_host_sum(kiln_instance *self, double *values, uint32_t n, const char *what) {
    if (self->timed_out) return ddp_dead(self, what);
    size_t bytes = (size_t)n * sizeof(double);
    int32_t rc = ddp_host_ready(self, bytes);
    if (rc || (rc = ddp_host_copy(self, self->hdev, values, bytes, KILN_COPY_H2D))) return rc;
    ddp_nccl *nc = self->nccl;
    ncclResult_t r = ncclAllReduce(self->hdev, self->hdev, n, ncclFloat64, ncclSum, nc->comm, nc->stream);
    if (r != ncclSuccess) return ddp_nccl_fail(self, r, what);
    if ((rc = ddp_nccl_wait(self, nc, what))) return rc;
    return ddp_host_copy(self, values, self->hdev, bytes, KILN_COPY_D2H);
}

int32_t ddp_nccl_host_bcast(kiln_instance *self, void *buf, size_t bytes, int32_t root) {
    const char *what = "ncclBroadcast(plugin data)";
    if (self->timed_out) return ddp_dead(self, what);
    int32_t rc = ddp_host_ready(self, bytes);
    if (rc || (self->rank == root && (rc = ddp_host_copy(self, self->hdev, buf, bytes, KILN_COPY_H2D)))) return rc;
    ddp_nccl *nc = self->nccl;
    ncclResult_t r = ncclBroadcast(self->hdev, self->hdev, bytes, ncclUint8, root, nc->comm, nc->stream);
    if (r != ncclSuccess) return ddp_nccl_fail(self, r, what);
    if ((rc = ddp_nccl_wait(self, nc, what))) return rc;
    return ddp_host_copy(self, buf, self->hdev, bytes, KILN_COPY_D2H);
}

int32_t ddp_nccl_host_gather(kiln_instance *self, const void *send, size_t bytes, void *recv) {
    const char *what = "ncclAllGather(plugin data)";
    if (self->timed_out) return ddp_dead(self, what);
    size_t total = bytes * (size_t)self->world;
    int32_t rc = ddp_host_ready(self, total);
    if (rc) return rc;
    /* in place, as NCCL allows: this rank's part already at its offset */
    unsigned char *mine = (unsigned char *)self->hdev + (size_t)self->rank * bytes;
    if ((rc = ddp_host_copy(self, mine, send, bytes, KILN_COPY_H2D))) return rc;
    ddp_nccl *nc = self->nccl;
    ncclResult_t r = ncclAllGather(mine, self->hdev, bytes, ncclUint8, nc->comm, nc->stream);
    if (r != ncclSuccess) return ddp_nccl_fail(self, r, what);
    if ((rc = ddp_nccl_wait(self, nc, what))) return rc;
    return ddp_host_copy(self, recv, self->hdev, total, KILN_COPY_D2H);
}

void ddp_nccl_release(kiln_instance *self) {
    if (self->hdev && self->K && self->K->free) self->K->free(self->acc, self->hdev);
    self->hdev = NULL;
    self->hdev_bytes = 0;
    ddp_nccl *n = self->nccl;
    if (!n) return;
    (void)cudaSetDevice(n->device);
    if (!n->aborted) (void)ncclCommDestroy(n->comm);
    (void)cudaStreamDestroy(n->stream);
    (void)cudaGetLastError();
    free(n);
    self->nccl = NULL;
}
