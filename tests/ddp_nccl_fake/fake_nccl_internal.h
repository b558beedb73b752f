/*
 * fake_nccl_internal.h — what the two fakes compiled into the test-only
 * "ddp over fake NCCL" plugin (tests/ddp_nccl_fake) share: a stream is a
 * FIFO of MPI requests that fake_nccl.c's collectives started and that
 * fake_cudart_ddp.c's cudaStreamQuery/cudaStreamSynchronize complete. That
 * keeps NCCL's asynchrony (the collective is only enqueued; the caller must
 * wait on the stream), so ddp's watchdog (ddp_nccl_wait) polls a collective
 * that can really be late, and fire on a hung peer. All of it is local to
 * the plugin library (version script): it never meets the fake cuda
 * plugin's own fake runtime, nor a real libcudart/libnccl.
 */
#ifndef KILN_TESTS_FAKE_NCCL_INTERNAL_H
#define KILN_TESTS_FAKE_NCCL_INTERNAL_H

#include <mpi.h>

#include <cuda_runtime_api.h>

/* How an enqueued collective ends (failure injection, fake_nccl.c). */
enum {
    FAKE_OP_MPI = 0,  /* when its MPI request completes                     */
    FAKE_OP_STUCK,    /* never: a kernel waiting for a peer that is gone     */
    FAKE_OP_FAILS     /* with cudaErrorLaunchFailure, as a faulting kernel   */
};

/* One enqueued collective: the request, the comm it counts against, and
 * the device bytes it writes, held (fake_nccl_hold) until it ends. */
typedef struct fake_nccl_op {
    MPI_Request req;
    struct ncclComm *comm;
    int how;          /* FAKE_OP_*                                           */
    const void *buf;  /* recvbuff                                            */
    size_t bytes;     /* of it                                               */
} fake_nccl_op;

#define FAKE_NCCL_STREAM_DEPTH 64

struct CUstream_st {
    unsigned magic;                         /* FAKE_NCCL_STREAM_MAGIC while live */
    fake_nccl_op ops[FAKE_NCCL_STREAM_DEPTH];
    int head, count;                        /* FIFO of pending collectives       */
};
#define FAKE_NCCL_STREAM_MAGIC 0x5eedf00du

/* 1 when s is a stream fake_cudart_ddp.c created and has not destroyed. */
int fake_stream_valid(cudaStream_t s);
/* Appends a started request (or a FAKE_OP_STUCK/FAILS op, req unused); 0,
 * or -1 when the queue is full. */
int fake_stream_push(cudaStream_t s, fake_nccl_op op);
/* The fake cuda plugin seals device memory from the host and checks the
 * order of work against collectives (its fake_cuda.h); a collective holds
 * [p, p + n) (on = 1) until it ends (on = 0). Nothing when that plugin is
 * not loaded. */
void fake_nccl_hold(const void *p, size_t n, int on);
/* The fake NCCL's record that a kernel of comm failed on a stream. */
void fake_nccl_kernel_failed(struct ncclComm *comm);
/* Forgets the pending requests of comm on every stream (ncclCommAbort: a
 * collective request cannot be cancelled in MPI, and a hung peer would
 * never complete it). */
void fake_stream_forget(struct ncclComm *comm);

#endif /* KILN_TESTS_FAKE_NCCL_INTERNAL_H */
