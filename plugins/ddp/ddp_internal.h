/*
 * ddp_internal.h — what the files of the "ddp" strategy share: the
 * instance, the bucket plan's types, and the NCCL entry points ddp_nccl.c
 * provides when kiln is built with CUDA and NCCL (KILN_DDP_NCCL). ddp.c
 * owns rank discovery, MPI, the bucket plan and the host-memory path;
 * ddp_nccl.c moves device-memory buckets with NCCL, its communicator
 * bootstrapped over MPI.
 */
#ifndef KILN_PLUGIN_DDP_INTERNAL_H
#define KILN_PLUGIN_DDP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include <kiln/kiln.h>

/* One contiguous run of elements of one parameter inside a bucket: a large
 * parameter is split across buckets so the staging buffer never exceeds
 * bucket_mb (torch gives such a parameter a bucket of its own instead). */
typedef struct ddp_segment {
    uint32_t param;   /* index into params                                  */
    int64_t offset;   /* first element of the parameter in this segment     */
    int64_t count;    /* elements                                           */
} ddp_segment;

/* Consecutive segments of one dtype moved by one collective. */
typedef struct ddp_bucket {
    uint32_t first_seg, nseg;
    uint32_t dtype;   /* KILN_DTYPE_F32 or KILN_DTYPE_F64                   */
    int64_t count;    /* elements in the bucket (sum of its segments)       */
    /* where the bucket's weights (run[0]) and gradients (run[1]) lie in
     * one piece of memory, as they do in the host's arenas: the collective
     * works there in place, with no staging copies; NULL: staged */
    void *run[2];
} ddp_bucket;

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    int32_t rank, world, local_rank;
    MPI_Comm comm;           /* dup of MPI_COMM_WORLD, MPI_ERRORS_RETURN    */
    int have_comm;
    int initialized_mpi;     /* this plugin called MPI_Init_thread          */
    size_t bucket_bytes;     /* capacity of one bucket                      */
    double timeout_s;        /* deadline of one collective; 0: none          */
    /* bootstrap "tcp" (a launch without MPI): MPI is never touched; the NCCL
     * id goes through ddp_tcp.c and every collective runs on NCCL */
    int tcp_boot;
    char master_addr[256];
    int master_port;
    char rdzv_secret[256];   /* KILN_RDZV_SECRET ("": unauthenticated), kept
                              * only until the rendezvous, then wiped       */
    /* no collective may run any more (a timeout, NCCL's asynchronous error
     * or a failed communicator init): each later one fails at once with
     * one line saying why (dead_why) instead of waiting on dead peers */
    int dead;
    const char *dead_why;    /* static text: "an earlier collective timed out" */
    int mpi_stuck;           /* a peer may never answer: no MPI_Comm_free or
                              * MPI_Finalize (they would wait for it)        */

    /* from setup() */
    kiln_parameter *const *params;
    uint32_t nparams;
    ddp_segment *segs;
    uint32_t nseg;
    ddp_bucket *buckets;
    uint32_t nbuckets;
    void *buf;               /* (bucket_bytes) host staging buffer           */
    size_t buf_bytes;
    kiln_instance *acc;
    const kiln_kernels *K;
    int host_memory;         /* device pointers are host pointers            */
    /* NCCL (ddp_nccl.c) when the parameters live in CUDA device memory:
     * buckets are packed into dbuf on the device and reduced there */
    int use_nccl;
    void *dbuf;              /* (buf_bytes) device bucket buffer, K->alloc   */
    void *nccl;              /* ddp_nccl state, NULL when unused             */
    void *hdev;              /* (hdev_bytes) device staging of the host
                              * collectives (metrics, plugin data) in tcp mode */
    size_t hdev_bytes;

    /* counters for the destroy line (tests read them) */
    uint64_t n_bcast, bcast_bytes;
    uint64_t n_allreduce, allreduce_bytes;
    uint64_t n_reduce_sum, n_barrier;
    uint64_t n_in_place;     /* broadcasts and all-reduces of them in place  */
};

/* Waits for a non-blocking MPI collective until timeout_s (ddp.c); on a
 * miss marks the instance dead (ddp_kill) and returns KILN_E_COMM naming
 * `call`. */
int32_t ddp_wait(kiln_instance *self, MPI_Request *req, const char *call);
/* KILN_E_COMM for a collective not attempted because the instance is dead
 * (an earlier collective timed out or NCCL failed), naming call, the rank
 * and dead_why (ddp.c). */
int32_t ddp_dead(kiln_instance *self, const char *call);
/* Marks the instance dead with why (static text); mpi_stuck also when a
 * peer may never answer again, so MPI's teardown is skipped (ddp.c). */
void ddp_kill(kiln_instance *self, const char *why, int mpi_stuck);
/* The pause between polls of a pending collective after `waited` seconds
 * (ddp.c); *nap_ns starts at 50000 and grows. */
void ddp_backoff(double waited, long *nap_ns);

#ifdef KILN_DDP_NCCL
/* 1 in *is_device when ptr is CUDA device memory (the cuda accelerator's);
 * never fails: anything CUDA cannot classify is "not device memory". */
void ddp_nccl_is_device(const void *ptr, int *is_device);
/* Creates the communicator on the calling thread's current device (the
 * accelerator chose it), the unique id broadcast from rank 0 over MPI (or
 * TCP), non-blocking so timeout_s bounds it; a failure of rank 0's
 * ncclGetUniqueId travels in place of the id, so every rank fails at once. */
int32_t ddp_nccl_init(kiln_instance *self);
/* In place on device memory, on NCCL's own stream: broadcast from rank 0,
 * or all-reduce with the average. wait: until NCCL's stream has finished
 * it (and everything before it); 0: only until NCCL has issued it, so
 * several can be queued and waited for together with ddp_nccl_wait, which
 * watches for NCCL's asynchronous errors and timeout_s the same way. */
int32_t ddp_nccl_bcast(kiln_instance *self, void *dev, int64_t count, uint32_t dtype, int wait);
int32_t ddp_nccl_allreduce_avg(kiln_instance *self, void *dev, int64_t count, uint32_t dtype, int wait);
int32_t ddp_nccl_wait(kiln_instance *self, const char *what);
/* The host collectives of a tcp-bootstrapped job, on NCCL through a device
 * staging buffer (self->hdev); they create the communicator on first use.
 * barrier is a one-value sum. */
int32_t ddp_nccl_host_sum(kiln_instance *self, double *values, uint32_t n, const char *what);
int32_t ddp_nccl_host_bcast(kiln_instance *self, void *buf, size_t bytes, int32_t root);
int32_t ddp_nccl_host_gather(kiln_instance *self, const void *send, size_t bytes, void *recv);
void ddp_nccl_release(kiln_instance *self);
#endif

#endif /* KILN_PLUGIN_DDP_INTERNAL_H */
