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
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "fake_nccl_internal.h"

struct ncclComm {
    MPI_Comm comm; /* dup of MPI_COMM_WORLD, errors returned */
    int rank, size;
    int aborted;
    unsigned long n_allreduce, n_avg, n_bcast, n_allgather;
    unsigned long long allreduce_bytes, bcast_bytes;
};

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

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return fake_fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (fake)";
    case ncclSystemError: return "unhandled system error (fake: MPI failed)";
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

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    if (!comm) return fake_fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
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
    /* as real NCCL's, this init is collective: every rank must call it */
    if (MPI_Comm_dup(MPI_COMM_WORLD, &c->comm) != MPI_SUCCESS) {
        free(c);
        return fake_fail(ncclSystemError, "ncclCommInitRank: MPI_Comm_dup failed");
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    /* what NCCL's bootstrap would establish: one id, consistent ranks */
    ncclUniqueId root = commId;
    int bad = MPI_Bcast(root.internal, (int)sizeof root.internal, MPI_BYTE, 0, c->comm) != MPI_SUCCESS;
    int mismatch = memcmp(root.internal, commId.internal, sizeof root.internal) != 0;
    int wrong_rank = c->rank != rank || c->size != nranks;
    int local = bad * 4 | mismatch * 2 | wrong_rank, any = 0;
    if (MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_BOR, c->comm) != MPI_SUCCESS) any |= 4;
    if (any) {
        MPI_Comm_free(&c->comm);
        const int me = c->rank, world = c->size;
        free(c);
        return fake_fail(ncclInvalidUsage,
                         "ncclCommInitRank: rank %d of %d asked (MPI world: rank %d of %d): %s%s%s", rank, nranks,
                         me, world, (any & 4) ? "MPI failed; " : "",
                         (any & 2) ? "the ranks hold different unique ids (rank 0's was not broadcast); " : "",
                         (any & 1) ? "rank/nranks disagree with the MPI world" : "");
    }
    *comm = c;
    fake_live_comms++;
    return ncclSuccess;
}

/* The last communicator of a fake that started MPI itself finalizes it
 * (mpirun fails a job whose processes exit without MPI_Finalize). */
static void fake_comm_gone(int collective_ok) {
    if (--fake_live_comms > 0 || !fake_started_mpi || !collective_ok) return;
    int fin = 0;
    if (MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
    fake_started_mpi = 0;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!comm || !asyncError) return fake_fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    *asyncError = ncclSuccess;
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

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
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
    if (count > 0 && sendbuff != recvbuff) memcpy(recvbuff, sendbuff, count * esz);
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
    MPI_Request req;
    if (MPI_Iallreduce(MPI_IN_PLACE, recvbuff, (int)count, mt, MPI_SUM, comm->comm, &req) != MPI_SUCCESS)
        return fake_fail(ncclSystemError, "ncclAllReduce: MPI_Iallreduce failed");
    if (fake_stream_push(stream, req, comm))
        return fake_fail(ncclInternalError, "ncclAllReduce: more than %d collectives pending on one stream",
                         FAKE_NCCL_STREAM_DEPTH);
    comm->n_allreduce++;
    comm->n_avg += op == ncclAvg;
    comm->allreduce_bytes += (unsigned long long)(count * esz);
    return ncclSuccess;
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
    if (count > 0 && comm->rank == root && sendbuff != recvbuff) memcpy(recvbuff, sendbuff, count * esz);
    MPI_Request req;
    if (MPI_Ibcast(recvbuff, (int)count, mt, root, comm->comm, &req) != MPI_SUCCESS)
        return fake_fail(ncclSystemError, "ncclBroadcast: MPI_Ibcast failed");
    if (fake_stream_push(stream, req, comm))
        return fake_fail(ncclInternalError, "ncclBroadcast: more than %d collectives pending on one stream",
                         FAKE_NCCL_STREAM_DEPTH);
    comm->n_bcast++;
    comm->bcast_bytes += (unsigned long long)(count * esz);
    return ncclSuccess;
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
    MPI_Request req;
    if (MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recvbuff, (int)sendcount, mt, comm->comm, &req) !=
        MPI_SUCCESS)
        return fake_fail(ncclSystemError, "ncclAllGather: MPI_Iallgather failed");
    if (fake_stream_push(stream, req, comm))
        return fake_fail(ncclInternalError, "ncclAllGather: more than %d collectives pending on one stream",
                         FAKE_NCCL_STREAM_DEPTH);
    comm->n_allgather++;
    return ncclSuccess;
}
