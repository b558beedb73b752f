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
 * returning, so the accelerator's next kernels see the result. The
 * communicator is non-blocking (config.blocking = 0): its init and every
 * collective are polled (ncclCommGetAsyncError, then the stream) against
 * timeout_s, so neither a rank that never reaches the init nor one that
 * hangs later can hold the others for ever. Any NCCL error, asynchronous or
 * not, aborts the communicator at once (ncclCommAbort; ncclCommDestroy
 * could wait for a dead peer) and marks ddp dead, so later collectives fail
 * with one line and MPI's teardown is skipped. Failures become KILN_E_COMM
 * (NCCL) or KILN_E_CUDA with the call, the rank and NCCL's or CUDA's text.
 * Built only with KILN_DDP_NCCL.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "ddp_internal.h"
#include "ddp_tcp.h"

typedef struct ddp_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    int aborted;  /* ncclCommAbort ran: the handle is gone, never destroy it */
} ddp_nccl;

/* What travels from rank 0 to every rank at the bootstrap (over MPI or
 * TCP): NCCL's id, or, when rank 0 could not make one, its error instead,
 * so the other ranks fail at once rather than wait out timeout_s for an id
 * that never comes. Fixed-size fields: every rank runs the same build. */
typedef struct ddp_nccl_boot {
    ncclUniqueId id;
    int32_t status;  /* ncclSuccess, or the result of rank 0's ncclGetUniqueId */
    char why[124];   /* rank 0's ncclGetLastError() text when status != 0    */
} ddp_nccl_boot;

static int32_t ddp_nccl_fail(kiln_instance *self, ncclResult_t r, const char *call) {
    return kiln_errorf(self->svc, self->hctx, KILN_E_COMM, "ddp: rank %d of %d: %s failed: %s (%s)", (int)self->rank,
                       (int)self->world, call, ncclGetErrorString(r), ncclGetLastError(NULL));
}

static int32_t ddp_cuda_fail(kiln_instance *self, cudaError_t e, const char *call) {
    (void)cudaGetLastError();
    return kiln_errorf(self->svc, self->hctx, KILN_E_CUDA, "ddp: rank %d of %d: %s failed: %s", (int)self->rank,
                       (int)self->world, call, cudaGetErrorString(e));
}

/* After any error on a live communicator NCCL guarantees nothing about the
 * operations in flight, and ncclCommDestroy (or MPI_Finalize) may then wait
 * for ever on a peer that is gone: the communicator is aborted at once, and
 * the instance marked dead, so later collectives fail with one line and the
 * teardown skips what would wait. */
static void ddp_nccl_abort(kiln_instance *self, ddp_nccl *n, const char *why) {
    if (!n->aborted && n->comm) (void)ncclCommAbort(n->comm);
    n->aborted = 1;
    ddp_kill(self, why, 1);
}

static double ddp_since(const struct timespec *t0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + 1e-9 * (double)(now.tv_nsec - t0->tv_nsec);
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

/* The watchdog of every NCCL operation, as NCCL's own documentation asks of
 * a non-blocking communicator and as torch's watchdog does: polls
 * ncclCommGetAsyncError until the operation has been issued (ncclInProgress
 * means its kernels may not be on the stream yet, so the stream must not be
 * asked before), then, for a collective (on_stream), NCCL's stream until it
 * is done, pausing between polls as ddp_backoff says. Every asynchronous
 * error (a peer that died, a network error, a failed kernel) and a miss of
 * timeout_s (a hung peer never joins) abort the communicator, which frees
 * the stream, and fail with one line instead of blocking for ever. */
static int32_t ddp_nccl_poll(kiln_instance *self, ddp_nccl *n, const char *what, int on_stream) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long nap_ns = 50000;
    for (;;) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &async);
        if (r != ncclSuccess) async = r;
        if (async != ncclSuccess && async != ncclInProgress) {
            const char *text = ncclGetLastError(n->comm);
            char last[256];
            snprintf(last, sizeof last, "%s", text ? text : "");
            ddp_nccl_abort(self, n, "NCCL reported an error in an earlier collective and its communicator was "
                                    "aborted");
            return kiln_errorf(self->svc, self->hctx, KILN_E_COMM,
                               "ddp: rank %d of %d: %s failed: %s (%s): a peer died or the network failed; NCCL "
                               "communicator aborted",
                               (int)self->rank, (int)self->world, what, ncclGetErrorString(async), last);
        }
        if (async == ncclSuccess) {
            cudaError_t e = on_stream ? cudaStreamQuery(n->stream) : cudaSuccess;
            if (e == cudaSuccess) {
                /* an error raised while the stream drained counts too */
                r = ncclCommGetAsyncError(n->comm, &async);
                if (r == ncclSuccess && async == ncclSuccess) return KILN_OK;
                continue; /* reported (and aborted) at the top */
            }
            if (e != cudaErrorNotReady) {
                (void)cudaGetLastError();
                ddp_nccl_abort(self, n, "NCCL's stream failed in an earlier collective and its communicator was "
                                        "aborted");
                return kiln_errorf(self->svc, self->hctx, KILN_E_CUDA,
                                   "ddp: rank %d of %d: %s failed on NCCL's stream: cudaStreamQuery: %s; NCCL "
                                   "communicator aborted",
                                   (int)self->rank, (int)self->world, what, cudaGetErrorString(e));
            }
        }
        const double waited = ddp_since(&t0);
        if (self->timeout_s > 0 && waited > self->timeout_s) {
            ddp_nccl_abort(self, n, "an earlier collective timed out");
            return kiln_errorf(self->svc, self->hctx, KILN_E_COMM,
                               "ddp: rank %d of %d: %s did not complete within timeout_s = %g s: another rank is "
                               "hung, stopped or far slower; NCCL communicator aborted",
                               (int)self->rank, (int)self->world, what, self->timeout_s);
        }
        ddp_backoff(waited, &nap_ns);
    }
}

/* rank 0's id (or its failure) to every rank, over MPI or TCP */
static int32_t ddp_nccl_exchange(kiln_instance *self, ddp_nccl_boot *boot) {
    if (self->tcp_boot) {
        char err[512];
        int trc = ddp_tcp_bcast(self->master_addr, self->master_port, (int)self->rank, (int)self->world,
                                self->timeout_s, self->rdzv_secret[0] ? self->rdzv_secret : NULL, boot, sizeof *boot,
                                err, sizeof err);
        /* the secret served its one purpose: keep no copy for a core dump */
        volatile char *sec = self->rdzv_secret;
        for (size_t i = 0; i < sizeof self->rdzv_secret; i++) sec[i] = 0;
        if (trc)
            return kiln_errorf(self->svc, self->hctx, KILN_E_COMM,
                               "ddp: rank %d of %d: TCP rendezvous at %s:%d (MASTER_ADDR:MASTER_PORT): %s",
                               (int)self->rank, (int)self->world, self->master_addr, self->master_port, err);
        return KILN_OK;
    }
    MPI_Request req;
    if (self->dead) return ddp_dead(self, "MPI_Ibcast(ncclUniqueId)");
    if (MPI_Ibcast(boot, (int)sizeof *boot, MPI_BYTE, 0, self->comm, &req) != MPI_SUCCESS)
        return kiln_errorf(self->svc, self->hctx, KILN_E_COMM, "ddp: rank %d of %d: MPI_Ibcast(ncclUniqueId) failed",
                           (int)self->rank, (int)self->world);
    return ddp_wait(self, &req, "MPI_Ibcast(ncclUniqueId)");
}

int32_t ddp_nccl_init(kiln_instance *self) {
    if (self->nccl) return KILN_OK;
    if (self->dead) return ddp_dead(self, "ncclCommInitRankConfig");
    ddp_nccl *n = calloc(1, sizeof *n);
    if (!n) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "ddp: out of memory for the NCCL state");
    cudaError_t e = cudaGetDevice(&n->device);
    if (e != cudaSuccess) {
        free(n);
        return ddp_cuda_fail(self, e, "cudaGetDevice");
    }
    ddp_nccl_boot boot;
    memset(&boot, 0, sizeof boot);
    if (self->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&boot.id);
        if (r != ncclSuccess) { /* sent instead of the id: the others stop too */
            boot.status = (int32_t)r;
            snprintf(boot.why, sizeof boot.why, "%s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
        }
    }
    int32_t rc = ddp_nccl_exchange(self, &boot);
    if (rc == KILN_OK && boot.status != ncclSuccess) {
        boot.why[sizeof boot.why - 1] = 0;
        /* every rank knows now: MPI stays usable, but NCCL never will be */
        ddp_kill(self, "NCCL's communicator could not be created", 0);
        rc = self->rank == 0
                 ? kiln_errorf(self->svc, self->hctx, KILN_E_COMM,
                               "ddp: rank 0 of %d: ncclGetUniqueId failed: %s; the other ranks were told",
                               (int)self->world, boot.why)
                 : kiln_errorf(self->svc, self->hctx, KILN_E_COMM,
                               "ddp: rank %d of %d: rank 0 could not create NCCL's unique id (ncclGetUniqueId "
                               "failed: %s); no NCCL communicator",
                               (int)self->rank, (int)self->world, boot.why);
    }
    if (rc != KILN_OK) {
        free(n);
        return rc;
    }
    if ((e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(n);
        return ddp_cuda_fail(self, e, "cudaStreamCreateWithFlags(NCCL stream)");
    }
    /* Non-blocking, so the init is polled against timeout_s like every
     * collective: a rank that dies between the id exchange and its own init
     * would otherwise hold the others in ncclCommInitRank for ever. */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, (int)self->world, boot.id, (int)self->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = ddp_nccl_fail(self, r, "ncclCommInitRankConfig");
        if (n->comm) ddp_nccl_abort(self, n, "NCCL's communicator could not be created");
        else ddp_kill(self, "NCCL's communicator could not be created", 1);
        (void)cudaStreamDestroy(n->stream);
        free(n);
        return rc;
    }
    /* the same watchdog as a collective, with its own line on a timeout:
     * the init is where a rank that never arrived shows */
    rc = KILN_OK;
    {
        long nap_ns = 50000;
        for (;;) {
            ncclResult_t async = ncclSuccess;
            r = ncclCommGetAsyncError(n->comm, &async);
            if (r != ncclSuccess) async = r;
            if (async == ncclSuccess) break;
            if (async != ncclInProgress) {
                rc = ddp_nccl_fail(self, async, "ncclCommInitRankConfig");
                ddp_nccl_abort(self, n, "NCCL's communicator could not be created");
                break;
            }
            const double waited = ddp_since(&t0);
            if (self->timeout_s > 0 && waited > self->timeout_s) {
                ddp_nccl_abort(self, n, "NCCL's communicator init timed out");
                rc = kiln_errorf(self->svc, self->hctx, KILN_E_COMM,
                                 "ddp: rank %d of %d: NCCL's communicator init (ncclCommInitRankConfig, %d ranks) "
                                 "did not complete within timeout_s = %g s (waited %.1f s): a rank died or hung "
                                 "between the id exchange and its init; NCCL communicator aborted",
                                 (int)self->rank, (int)self->world, (int)self->world, self->timeout_s, waited);
                break;
            }
            ddp_backoff(waited, &nap_ns);
        }
    }
    if (rc != KILN_OK) {
        (void)cudaStreamDestroy(n->stream);
        (void)cudaGetLastError();
        free(n);
        return rc;
    }
    self->nccl = n;
    int v = 0;
    (void)ncclGetVersion(&v);
    kiln_logf(self->svc, self->hctx, KILN_LOG_INFO, "ddp: rank %d: NCCL %d.%d.%d on device %d (collectives on their own stream)",
              (int)self->rank, v / 10000, (v / 100) % 100, v % 100, n->device);
    return KILN_OK;
}

static ncclDataType_t ddp_nccl_type(uint32_t dtype) { return dtype == KILN_DTYPE_F64 ? ncclFloat64 : ncclFloat32; }

/* What follows every collective call: its immediate result (ncclInProgress
 * is the normal answer of a non-blocking communicator: being issued), then
 * the watchdog. An immediate error aborts too: the peers have issued theirs
 * and would wait for this rank's share for ever. */
static int32_t ddp_nccl_issued(kiln_instance *self, ddp_nccl *n, ncclResult_t r, const char *what, int wait) {
    if (r != ncclSuccess && r != ncclInProgress) {
        int32_t rc = ddp_nccl_fail(self, r, what);
        ddp_nccl_abort(self, n, "an earlier NCCL collective failed and its communicator was aborted");
        return rc;
    }
    return ddp_nccl_poll(self, n, what, wait);
}

int32_t ddp_nccl_bcast(kiln_instance *self, void *dev, int64_t count, uint32_t dtype, int wait) {
    ddp_nccl *n = self->nccl;
    const char *what = "ncclBroadcast(parameters)";
    if (self->dead || !n) return ddp_dead(self, what);
    return ddp_nccl_issued(self, n, ncclBroadcast(dev, dev, (size_t)count, ddp_nccl_type(dtype), 0, n->comm, n->stream),
                           what, wait);
}

int32_t ddp_nccl_allreduce_avg(kiln_instance *self, void *dev, int64_t count, uint32_t dtype, int wait) {
    ddp_nccl *n = self->nccl;
    const char *what = "ncclAllReduce(gradients, AVG)";
    if (self->dead || !n) return ddp_dead(self, what);
    return ddp_nccl_issued(
        self, n, ncclAllReduce(dev, dev, (size_t)count, ddp_nccl_type(dtype), ncclAvg, n->comm, n->stream), what,
        wait);
}

int32_t ddp_nccl_wait(kiln_instance *self, const char *what) {
    ddp_nccl *n = self->nccl;
    if (self->dead || !n) return ddp_dead(self, what);
    return ddp_nccl_poll(self, n, what, 1);
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
        /* K->alloc's zero fill is queued on the accelerator's stream, and
         * NCCL writes the buffer from its own stream next (a non-root rank
         * of a broadcast copies nothing in first): without this wait the
         * fill could land after the received data and zero it */
        if ((rc = self->K->synchronize ? self->K->synchronize(self->acc) : KILN_OK) != KILN_OK)
            return kiln_errorf(self->svc, self->hctx, rc, "ddp: rank %d: accelerator synchronize after allocating "
                               "the collectives' staging buffer failed (%s)", (int)self->rank, kiln_status_name(rc));
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
    if (self->dead) return ddp_dead(self, what);
    size_t bytes = (size_t)n * sizeof(double);
    int32_t rc = ddp_host_ready(self, bytes);
    if (rc || (rc = ddp_host_copy(self, self->hdev, values, bytes, KILN_COPY_H2D))) return rc;
    ddp_nccl *nc = self->nccl;
    rc = ddp_nccl_issued(self, nc, ncclAllReduce(self->hdev, self->hdev, n, ncclFloat64, ncclSum, nc->comm, nc->stream),
                         what, 1);
    return rc ? rc : ddp_host_copy(self, values, self->hdev, bytes, KILN_COPY_D2H);
}

int32_t ddp_nccl_host_bcast(kiln_instance *self, void *buf, size_t bytes, int32_t root) {
    const char *what = "ncclBroadcast(plugin data)";
    if (self->dead) return ddp_dead(self, what);
    int32_t rc = ddp_host_ready(self, bytes);
    if (rc || (self->rank == root && (rc = ddp_host_copy(self, self->hdev, buf, bytes, KILN_COPY_H2D)))) return rc;
    ddp_nccl *nc = self->nccl;
    rc = ddp_nccl_issued(self, nc, ncclBroadcast(self->hdev, self->hdev, bytes, ncclUint8, root, nc->comm, nc->stream),
                         what, 1);
    return rc ? rc : ddp_host_copy(self, buf, self->hdev, bytes, KILN_COPY_D2H);
}

int32_t ddp_nccl_host_gather(kiln_instance *self, const void *send, size_t bytes, void *recv) {
    const char *what = "ncclAllGather(plugin data)";
    if (self->dead) return ddp_dead(self, what);
    size_t total = bytes * (size_t)self->world;
    int32_t rc = ddp_host_ready(self, total);
    if (rc) return rc;
    /* in place, as NCCL allows: this rank's part already at its offset */
    unsigned char *mine = (unsigned char *)self->hdev + (size_t)self->rank * bytes;
    if ((rc = ddp_host_copy(self, mine, send, bytes, KILN_COPY_H2D))) return rc;
    ddp_nccl *nc = self->nccl;
    rc = ddp_nccl_issued(self, nc, ncclAllGather(mine, self->hdev, bytes, ncclUint8, nc->comm, nc->stream), what, 1);
    return rc ? rc : ddp_host_copy(self, recv, self->hdev, total, KILN_COPY_D2H);
}

void ddp_nccl_release(kiln_instance *self) {
    if (self->hdev && self->K && self->K->free) self->K->free(self->acc, self->hdev);
    self->hdev = NULL;
    self->hdev_bytes = 0;
    ddp_nccl *n = self->nccl;
    if (!n) return;
    (void)cudaSetDevice(n->device);
    if (!n->aborted && self->dead) ddp_nccl_abort(self, n, self->dead_why);
    if (!n->aborted) {
        /* a non-blocking communicator is finalized first (flushes what was
         * issued and waits for the peers to be quiescent), polled against
         * timeout_s; only then does ncclCommDestroy free it without
         * blocking. Any error or a miss aborts instead. */
        ncclResult_t r = ncclCommFinalize(n->comm);
        int32_t rc = KILN_E_COMM;
        if (r == ncclSuccess || r == ncclInProgress) rc = ddp_nccl_poll(self, n, "ncclCommFinalize", 0);
        if (rc == KILN_OK) (void)ncclCommDestroy(n->comm);
        else if (!n->aborted) ddp_nccl_abort(self, n, "NCCL's communicator failed at its finalize");
    }
    (void)cudaStreamDestroy(n->stream);
    (void)cudaGetLastError();
    free(n);
    self->nccl = NULL;
}
