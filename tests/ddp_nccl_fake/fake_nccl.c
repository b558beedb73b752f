/*
 * fake_nccl.c — the NCCL functions plugins/ddp/ddp_nccl.c calls, with
 * nccl.h's signatures, implemented over MPI on host memory, so that ddp's
 * NCCL path (bootstrap, bucketed broadcast and all-reduce, the watchdog) runs
 * on a machine without a GPU, against the fake cuda plugin whose "device
 * memory" is host memory. A communicator is a duplicate of MPI_COMM_WORLD;
 * ncclCommInitRank checks what real NCCL would trust blindly (rank and size
 * are the MPI world's, every rank got rank 0's unique id), so a wrong
 * bootstrap in ddp fails here instead of passing. Collectives are enqueued
 * as NCCL's are: a non-blocking MPI collective is started and pushed onto
 * the stream, and only cudaStreamQuery/cudaStreamSynchronize
 * (fake_cudart_ddp.c) complete it; so a caller that forgets to wait reads a
 * stale buffer, and a stopped peer leaves the collective pending for ddp's
 * watchdog to see. ncclAvg on floats multiplies by 1/nranks before summing,
 * as NCCL does (PreMulSum with the scalar 1/nranks in the element type).
 * Calls and bytes are counted per communicator and printed as one line on
 * stderr at ncclCommDestroy or ncclCommAbort, which the test greps:
 *   fake-nccl: rank R of W: allreduce N (B bytes, A avg), broadcast M (C bytes), allgather G, destroyed
 * ddp's launch without MPI (bootstrap "tcp") never touches MPI itself: then
 * the fake starts MPI for its own transport at ncclCommInitRank (the test
 * still runs the processes under mpirun, with OpenMPI's rank variables
 * renamed to torchrun's) and finalizes it when the last communicator goes.
 * A non-blocking communicator (ncclCommInitRankConfig, blocking = 0) is
 * modelled as NCCL documents it: the init and every collective answer
 * ncclInProgress, and only polls of ncclCommGetAsyncError advance them (a
 * collective reaches its stream at the second poll); any other call on the
 * communicator while it is in progress is a contract violation. Injected
 * failures (KILN_FAKE_NCCL_FAIL, below) play a dying peer, a failing kernel,
 * a failing ncclGetUniqueId and a rank lost before the init. What real NCCL
 * would not survive (ncclCommDestroy after an asynchronous error, a call on
 * a communicator in progress) prints "fake-nccl: contract violation: ...".
 * The fake cuda plugin seals its device memory from host code; this fake
 * reads and writes its buffers from the host as NCCL's kernels would on
 * the GPU, so it holds each collective's buffers open until the
 * collective completes (fake_nccl_hold).
 */
#define _GNU_SOURCE /* dl_iterate_phdr */
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "fake_cuda.h"
#include "fake_nccl_internal.h"

struct ncclComm {
    MPI_Comm comm; /* dup of MPI_COMM_WORLD, errors returned */
    int rank, size;
    int aborted;
    unsigned long n_allreduce, n_avg, n_bcast, n_allgather;
    unsigned long long allreduce_bytes, bcast_bytes;
    /* non-blocking mode (ncclCommInitRankConfig with blocking = 0) */
    int blocking;
    ncclResult_t state;      /* ncclSuccess or ncclInProgress (init, issue, finalize) */
    ncclResult_t async;      /* an asynchronous error, sticky; ncclSuccess if none    */
    int phase;               /* init: 1 idup, 2 id broadcast, 3 check; 0 done         */
    MPI_Request init_req;
    ncclUniqueId asked_id, root_id;
    int asked_rank, asked_size, local, any;
    int issue_polls;         /* polls left until the deferred collective is issued */
    cudaStream_t issue_stream;
    fake_nccl_op issue_op;
    int have_issue;
    int finalized;
    int kernel_failed;       /* a kernel of this comm failed on a stream            */
    unsigned long ncoll;     /* collectives so far (injection counts them)          */
};

/* fake_cuda_hold of the fake cuda plugin, found among the loaded objects
 * (it is dlopen'ed as a plugin, with local symbols): the first that
 * exports it. */
static int fake_find_hold(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    if (!info->dlpi_name || !*info->dlpi_name) return 0;
    void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return 0;
    void *f = dlsym(h, FAKE_CUDA_HOLD);
    dlclose(h); /* the plugin stays loaded: the host holds it */
    if (!f) return 0;
    memcpy(data, &f, sizeof f);
    return 1;
}

void fake_nccl_hold(const void *p, size_t n, int on) {
    static fake_cuda_hold_fn hold;
    static int looked;
    if (!p) return;
    if (!looked) {
        looked = 1;
        dl_iterate_phdr(fake_find_hold, &hold);
    }
    if (hold) hold(p, n, on);
}

static char fake_last_text[512] = "";
static int fake_started_mpi; /* this fake called MPI_Init_thread (ddp's tcp bootstrap) */
static int fake_live_comms;

/* Records why the call failed (ncclGetLastError) and returns r. */
static ncclResult_t fake_fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t fake_fail(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fake_last_text, sizeof fake_last_text, fmt, ap);
    va_end(ap);
    return r;
}

/* A use real NCCL would not survive (a hang, undefined behaviour): one line
 * on stderr that the test greps for. */
static void fake_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fake_violation(const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fake-nccl: contract violation: %s\n", msg);
    fflush(stderr);
}

/*
 * Failure injection: KILN_FAKE_NCCL_FAIL="KIND:RANK[:N]", read at every call.
 *   remote, system  the Nth collective of rank RANK's communicator is never
 *                   issued to MPI (its peers' share stays pending): it sits
 *                   on the stream for ever and the communicator's
 *                   asynchronous error becomes ncclRemoteError or
 *                   ncclSystemError, as when a peer dies mid-collective;
 *   stream          the Nth collective's kernel fails (cudaStreamQuery:
 *                   cudaErrorLaunchFailure);
 *   uniqueid        ncclGetUniqueId fails (ncclSystemError; RANK unused);
 *   initstop        rank RANK stops itself (SIGSTOP) on entering the
 *                   communicator init, as a rank dying or hanging between
 *                   the id exchange and the init.
 */
static int fake_inject(const char *kind, int rank, unsigned long nth) {
    const char *spec = getenv("KILN_FAKE_NCCL_FAIL");
    if (!spec || !*spec) return 0;
    const size_t k = strlen(kind);
    if (strncmp(spec, kind, k) != 0 || spec[k] != ':') return 0;
    char *end = NULL;
    const long r = strtol(spec + k + 1, &end, 10);
    if (end == spec + k + 1) return 0;
    if (rank >= 0 && r != rank) return 0;
    const unsigned long n = *end == ':' ? strtoul(end + 1, NULL, 10) : 1;
    return nth == 0 || n == nth;
}

void fake_nccl_kernel_failed(struct ncclComm *comm) {
    if (comm) comm->kernel_failed = 1;
}

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return fake_fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (fake)";
    case ncclSystemError: return "unhandled system error (fake)";
    case ncclInternalError: return "internal error (fake)";
    case ncclInvalidArgument: return "invalid argument (fake)";
    case ncclInvalidUsage: return "invalid usage (fake)";
    case ncclRemoteError: return "remote process exited or there was a network error (fake)";
    case ncclInProgress: return "NCCL operation in progress (fake)";
    default: return "unknown result code (fake)";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return fake_last_text;
}

/* Random bytes, as NCCL's id carries a random magic: ranks that did not get
 * rank 0's id then fail the check in ncclCommInitRank. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    if (!uniqueId) return fake_fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    if (fake_inject("uniqueid", -1, 0))
        return fake_fail(ncclSystemError, "ncclGetUniqueId: no usable network interface (fake: injected)");
    FILE *f = fopen("/dev/urandom", "rb");
    size_t got = f ? fread(uniqueId->internal, 1, sizeof uniqueId->internal, f) : 0;
    if (f) fclose(f);
    if (got != sizeof uniqueId->internal) { /* no urandom: time and pid still differ per job */
        uint64_t s = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
        for (size_t i = 0; i < sizeof uniqueId->internal; i++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            uniqueId->internal[i] = (char)(s >> 56);
        }
    }
    return ncclSuccess;
}

/* Advances a communicator's init by one step where MPI allows (wait: block
 * on each): the duplicate of MPI_COMM_WORLD, the broadcast of rank 0's id,
 * then the check of what real NCCL would trust blindly (one id on every
 * rank, ranks that agree with the MPI world). All non-blocking, so a rank
 * that never arrives leaves the others' init pending, not blocked. */
static void fake_init_progress(struct ncclComm *c, int wait) {
    while (c->phase) {
        int done = 0;
        int err = wait ? MPI_Wait(&c->init_req, MPI_STATUS_IGNORE) : MPI_Test(&c->init_req, &done, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS) {
            c->phase = 0;
            c->state = ncclSuccess;
            c->async = fake_fail(ncclSystemError, "ncclCommInitRank: MPI failed in the fake's bootstrap");
            return;
        }
        if (!wait && !done) return;
        if (c->phase == 1) {
            MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
            MPI_Comm_rank(c->comm, &c->rank);
            MPI_Comm_size(c->comm, &c->size);
            c->root_id = c->asked_id;
            c->phase = 2;
            err = MPI_Ibcast(c->root_id.internal, (int)sizeof c->root_id.internal, MPI_BYTE, 0, c->comm, &c->init_req);
        } else if (c->phase == 2) {
            const int mismatch = memcmp(c->root_id.internal, c->asked_id.internal, sizeof c->root_id.internal) != 0;
            const int wrong_rank = c->rank != c->asked_rank || c->size != c->asked_size;
            c->local = mismatch * 2 | wrong_rank;
            c->phase = 3;
            err = MPI_Iallreduce(&c->local, &c->any, 1, MPI_INT, MPI_BOR, c->comm, &c->init_req);
        } else {
            c->phase = 0;
            c->state = ncclSuccess;
            if (c->any)
                c->async = fake_fail(ncclInvalidUsage,
                                     "ncclCommInitRank: rank %d of %d asked (MPI world: rank %d of %d): %s%s",
                                     c->asked_rank, c->asked_size, c->rank, c->size,
                                     (c->any & 2) ? "the ranks hold different unique ids (rank 0's was not "
                                                    "broadcast); " : "",
                                     (c->any & 1) ? "rank/nranks disagree with the MPI world" : "");
            return;
        }
        if (err != MPI_SUCCESS) {
            c->phase = 0;
            c->state = ncclSuccess;
            c->async = fake_fail(ncclSystemError, "ncclCommInitRank: MPI failed in the fake's bootstrap");
            return;
        }
    }
}

static ncclResult_t fake_init(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, int blocking) {
    if (!comm) return fake_fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    if (fake_inject("initstop", rank, 0)) raise(SIGSTOP);
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) { /* ddp bootstrapped over TCP: MPI is the fake's own transport */
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return fake_fail(ncclSystemError, "ncclCommInitRank: MPI_Init_thread failed (the fake's transport)");
        fake_started_mpi = 1;
    }
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fake_fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return fake_fail(ncclSystemError, "ncclCommInitRank: out of memory");
    c->blocking = blocking;
    c->asked_id = commId;
    c->asked_rank = rank;
    c->asked_size = nranks;
    c->rank = rank;
    c->size = nranks;
    /* as real NCCL's, this init is collective: every rank must call it */
    if (MPI_Comm_idup(MPI_COMM_WORLD, &c->comm, &c->init_req) != MPI_SUCCESS) {
        free(c);
        return fake_fail(ncclSystemError, "ncclCommInitRank: MPI_Comm_idup failed");
    }
    c->phase = 1;
    c->state = ncclInProgress;
    fake_live_comms++;
    if (blocking) {
        fake_init_progress(c, 1);
        if (c->async != ncclSuccess) { /* a blocking init returns its error and no communicator */
            const ncclResult_t r = c->async;
            if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
            free(c);
            fake_live_comms--;
            return r;
        }
        *comm = c;
        return ncclSuccess;
    }
    *comm = c; /* as NCCL: the handle at once, its state ncclInProgress */
    return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return fake_init(comm, nranks, commId, rank, 1);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    int blocking = 1;
    if (config) {
        if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t))
            return fake_fail(ncclInvalidArgument,
                             "ncclCommInitRankConfig: config not set from NCCL_CONFIG_INITIALIZER");
        if (config->blocking != NCCL_CONFIG_UNDEF_INT) blocking = config->blocking != 0;
    }
    return fake_init(comm, nranks, commId, rank, blocking);
}

/* The last communicator of a fake that started MPI itself finalizes it
 * (mpirun fails a job whose processes exit without MPI_Finalize). */
static void fake_comm_gone(int collective_ok) {
    if (--fake_live_comms > 0 || !fake_started_mpi || !collective_ok) return;
    int fin = 0;
    if (MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
    fake_started_mpi = 0;
}

/* Drives the pending state: the init's MPI steps, and a deferred collective,
 * which is issued (put on its stream) only on the second poll, as a
 * non-blocking communicator's kernels reach the stream only after
 * ncclInProgress has turned into ncclSuccess. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!comm || !asyncError) return fake_fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    if (comm->phase) fake_init_progress(comm, 0);
    if (comm->have_issue && --comm->issue_polls <= 0) {
        comm->have_issue = 0;
        if (fake_stream_push(comm->issue_stream, comm->issue_op))
            comm->async = fake_fail(ncclInternalError, "more than %d collectives pending on one stream",
                                    FAKE_NCCL_STREAM_DEPTH);
        comm->state = ncclSuccess;
    }
    if (comm->finalized == 1) { /* quiescent at the next poll */
        comm->finalized = 2;
        comm->state = ncclSuccess;
    }
    *asyncError = comm->async != ncclSuccess ? comm->async : comm->state;
    return ncclSuccess;
}

static void fake_report(const struct ncclComm *c, const char *how) {
    fprintf(stderr,
            "fake-nccl: rank %d of %d: allreduce %lu (%llu bytes, %lu avg), broadcast %lu (%llu bytes), allgather %lu, "
            "%s\n",
            c->rank, c->size, c->n_allreduce, c->allreduce_bytes, c->n_avg, c->n_bcast, c->bcast_bytes, c->n_allgather,
            how);
    fflush(stderr);
}

/* NCCL frees an aborted communicator at once, without waiting for the
 * peers; MPI_Comm_free would be a collective call here, so the duplicate
 * is left to process exit. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    fake_report(comm, "aborted");
    fake_stream_forget(comm);
    free(comm);
    fake_comm_gone(0); /* a hung peer: no MPI_Finalize, which would wait for it */
    return ncclSuccess;
}

/* Flushes, then (at the next poll of a non-blocking communicator) quiescent. */
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm) return fake_fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    if (comm->state == ncclInProgress) {
        fake_violation("rank %d: ncclCommFinalize while the communicator is still ncclInProgress", comm->rank);
        return fake_fail(ncclInvalidUsage, "ncclCommFinalize: communicator in progress");
    }
    if (comm->async != ncclSuccess)
        fake_violation("rank %d: ncclCommFinalize on a communicator with an asynchronous error (%s): real NCCL may "
                       "wait for the failed peer for ever; ncclCommAbort it", comm->rank,
                       ncclGetErrorString(comm->async));
    if (comm->blocking) {
        comm->finalized = 2;
        return ncclSuccess;
    }
    comm->finalized = 1;
    comm->state = ncclInProgress;
    return ncclInProgress;
}

/* Real NCCL's destroy waits for what is in flight: after an asynchronous
 * error or a failed kernel, on a peer that is gone, that is for ever. The
 * fake says so (the test fails on the line) instead of hanging. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (comm->async != ncclSuccess || comm->kernel_failed)
        fake_violation("rank %d: ncclCommDestroy on a communicator with %s: real NCCL would wait for ever here; "
                       "ncclCommAbort it", comm->rank,
                       comm->kernel_failed ? "a failed kernel" : ncclGetErrorString(comm->async));
    if (comm->state == ncclInProgress)
        fake_violation("rank %d: ncclCommDestroy while the communicator is still ncclInProgress", comm->rank);
    fake_report(comm, "destroyed");
    fake_stream_forget(comm);
    MPI_Comm_free(&comm->comm);
    free(comm);
    fake_comm_gone(1);
    return ncclSuccess;
}

/* The checks every collective makes before anything is enqueued. */
static ncclResult_t fake_check(const char *fn, ncclComm_t comm, cudaStream_t stream, size_t count,
                               ncclDataType_t datatype, MPI_Datatype *mt, size_t *esz) {
    if (!comm) return fake_fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (comm->state == ncclInProgress) {
        /* NCCL's rule for non-blocking communicators: poll until ncclSuccess
         * before the next call */
        fake_violation("rank %d: %s on a communicator still ncclInProgress (ncclCommGetAsyncError must say "
                       "ncclSuccess first)", comm->rank, fn);
        return fake_fail(ncclInvalidUsage, "%s: communicator in progress", fn);
    }
    if (comm->finalized) return fake_fail(ncclInvalidUsage, "%s: communicator finalized", fn);
    if (comm->async != ncclSuccess) return comm->async;
    if (!fake_stream_valid(stream))
        return fake_fail(ncclInvalidArgument, "%s: stream %p is not a live stream of this fake", fn, (void *)stream);
    if (datatype == ncclFloat32) { *mt = MPI_FLOAT; *esz = 4; }
    else if (datatype == ncclFloat64) { *mt = MPI_DOUBLE; *esz = 8; }
    else if (datatype == ncclUint8 || datatype == ncclInt8) { *mt = MPI_BYTE; *esz = 1; }
    else return fake_fail(ncclInvalidArgument, "%s: datatype %d (the fake does float32, float64 and 8-bit)", fn,
                          (int)datatype);
    if (count > (size_t)INT32_MAX) return fake_fail(ncclInvalidArgument, "%s: count %zu above MPI's int", fn, count);
    return ncclSuccess;
}

/* How this collective ends, counting it for KILN_FAKE_NCCL_FAIL: an
 * injected remote or system error leaves it for ever on the stream (the MPI
 * collective is never started, so the peers' stays pending too) and sets
 * the communicator's asynchronous error. */
static int fake_fate(ncclComm_t comm) {
    comm->ncoll++;
    if (fake_inject("remote", comm->rank, comm->ncoll)) {
        comm->async = fake_fail(ncclRemoteError, "NET/IB: peer rank %d closed the connection (fake: injected)",
                                (comm->rank + 1) % comm->size);
        return FAKE_OP_STUCK;
    }
    if (fake_inject("system", comm->rank, comm->ncoll)) {
        comm->async = fake_fail(ncclSystemError, "socket recv failed: Connection reset by peer (fake: injected)");
        return FAKE_OP_STUCK;
    }
    if (fake_inject("stream", comm->rank, comm->ncoll)) return FAKE_OP_FAILS;
    return FAKE_OP_MPI;
}

/* Puts a started collective on its stream: at once on a blocking
 * communicator; on a non-blocking one the call answers ncclInProgress and
 * the op reaches the stream at the second ncclCommGetAsyncError, so a
 * caller that asks the stream first sees it empty and reads a stale buffer. */
static ncclResult_t fake_enqueue(const char *fn, ncclComm_t comm, cudaStream_t stream, MPI_Request req, int how,
                                 const void *buf, size_t bytes) {
    if (comm->blocking) {
        if (fake_stream_push(stream, (fake_nccl_op){req, comm, how, buf, bytes}))
            return fake_fail(ncclInternalError, "%s: more than %d collectives pending on one stream", fn,
                             FAKE_NCCL_STREAM_DEPTH);
        return ncclSuccess;
    }
    comm->have_issue = 1;
    comm->issue_polls = 2;
    comm->issue_stream = stream;
    comm->issue_op = (fake_nccl_op){req, comm, how, buf, bytes};
    comm->state = ncclInProgress;
    return ncclInProgress;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    MPI_Datatype mt = MPI_DATATYPE_NULL; /* set by fake_check on success (the  */
    size_t esz = 0;                      /* optimiser cannot see it)          */
    ncclResult_t r = fake_check("ncclAllReduce", comm, stream, count, datatype, &mt, &esz);
    if (r != ncclSuccess) return r;
    if (op != ncclSum && op != ncclAvg)
        return fake_fail(ncclInvalidArgument, "ncclAllReduce: op %d (the fake does ncclSum and ncclAvg)", (int)op);
    if (mt == MPI_BYTE) return fake_fail(ncclInvalidArgument, "ncclAllReduce: the fake sums floats only");
    if (count > 0 && (!sendbuff || !recvbuff)) return fake_fail(ncclInvalidArgument, "ncclAllReduce: NULL buffer");
    const size_t bytes = count * esz;
    fake_nccl_hold(recvbuff, bytes, 1);
    if (count > 0 && sendbuff != recvbuff) {
        fake_nccl_hold(sendbuff, bytes, 1);
        memcpy(recvbuff, sendbuff, bytes);
        fake_nccl_hold(sendbuff, bytes, 0);
    }
    if (op == ncclAvg && count > 0) {
        if (datatype == ncclFloat64) {
            const double s = 1.0 / (double)comm->size;
            double *x = recvbuff; /* (count) */
            for (size_t i = 0; i < count; i++) x[i] *= s;
        } else {
            const float s = (float)(1.0 / (double)comm->size);
            float *x = recvbuff; /* (count) */
            for (size_t i = 0; i < count; i++) x[i] *= s;
        }
    }
    MPI_Request req = MPI_REQUEST_NULL;
    const int how = fake_fate(comm);
    if (how == FAKE_OP_MPI &&
        MPI_Iallreduce(MPI_IN_PLACE, recvbuff, (int)count, mt, MPI_SUM, comm->comm, &req) != MPI_SUCCESS) {
        fake_nccl_hold(recvbuff, bytes, 0);
        return fake_fail(ncclSystemError, "ncclAllReduce: MPI_Iallreduce failed");
    }
    r = fake_enqueue("ncclAllReduce", comm, stream, req, how, recvbuff, bytes);
    if (r != ncclSuccess && r != ncclInProgress) return r; /* a started request: still held */
    comm->n_allreduce++;
    comm->n_avg += op == ncclAvg;
    comm->allreduce_bytes += (unsigned long long)(count * esz);
    return r;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    MPI_Datatype mt = MPI_DATATYPE_NULL; /* set by fake_check on success (the  */
    size_t esz = 0;                      /* optimiser cannot see it)          */
    ncclResult_t r = fake_check("ncclBroadcast", comm, stream, count, datatype, &mt, &esz);
    if (r != ncclSuccess) return r;
    if (root < 0 || root >= comm->size)
        return fake_fail(ncclInvalidArgument, "ncclBroadcast: root %d of %d", root, comm->size);
    if (count > 0 && (!recvbuff || (comm->rank == root && !sendbuff)))
        return fake_fail(ncclInvalidArgument, "ncclBroadcast: NULL buffer");
    const size_t bytes = count * esz;
    fake_nccl_hold(recvbuff, bytes, 1);
    if (count > 0 && comm->rank == root && sendbuff != recvbuff) {
        fake_nccl_hold(sendbuff, bytes, 1);
        memcpy(recvbuff, sendbuff, bytes);
        fake_nccl_hold(sendbuff, bytes, 0);
    }
    MPI_Request req = MPI_REQUEST_NULL;
    const int how = fake_fate(comm);
    if (how == FAKE_OP_MPI && MPI_Ibcast(recvbuff, (int)count, mt, root, comm->comm, &req) != MPI_SUCCESS) {
        fake_nccl_hold(recvbuff, bytes, 0);
        return fake_fail(ncclSystemError, "ncclBroadcast: MPI_Ibcast failed");
    }
    r = fake_enqueue("ncclBroadcast", comm, stream, req, how, recvbuff, bytes);
    if (r != ncclSuccess && r != ncclInProgress) return r;
    comm->n_bcast++;
    comm->bcast_bytes += (unsigned long long)(count * esz);
    return r;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    MPI_Datatype mt = MPI_DATATYPE_NULL; /* set by fake_check on success (the  */
    size_t esz = 0;                      /* optimiser cannot see it)          */
    ncclResult_t r = fake_check("ncclAllGather", comm, stream, sendcount, datatype, &mt, &esz);
    if (r != ncclSuccess) return r;
    if (sendcount > 0 && (!sendbuff || !recvbuff)) return fake_fail(ncclInvalidArgument, "ncclAllGather: NULL buffer");
    /* NCCL's in-place form: sendbuff is this rank's part of recvbuff */
    unsigned char *mine = (unsigned char *)recvbuff + (size_t)comm->rank * sendcount * esz;
    if (sendcount > 0 && sendbuff != mine)
        return fake_fail(ncclInvalidUsage, "ncclAllGather: the fake does the in-place form only (sendbuff = recvbuff "
                                           "+ rank * sendcount)");
    MPI_Request req = MPI_REQUEST_NULL;
    const int how = fake_fate(comm);
    const size_t bytes = sendcount * esz * (size_t)comm->size;
    fake_nccl_hold(recvbuff, bytes, 1);
    if (how == FAKE_OP_MPI && MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recvbuff, (int)sendcount, mt,
                                             comm->comm, &req) != MPI_SUCCESS) {
        fake_nccl_hold(recvbuff, bytes, 0);
        return fake_fail(ncclSystemError, "ncclAllGather: MPI_Iallgather failed");
    }
    r = fake_enqueue("ncclAllGather", comm, stream, req, how, recvbuff, bytes);
    if (r != ncclSuccess && r != ncclInProgress) return r;
    comm->n_allgather++;
    return r;
}
