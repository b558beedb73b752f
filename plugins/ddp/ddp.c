/*
 * ddp.c — the "ddp" strategy (Lightning's DDPStrategy on CPU processes):
 * one OS process per rank, joined by MPI (OpenMPI's mpirun, or srun with
 * PMI). create() decides the rank from explicit config, then the launcher's
 * variables (OpenMPI, torchrun-style, Slurm), initialises MPI and insists the
 * MPI world agrees, so a mis-launched job fails before anything trains.
 * setup() broadcasts every parameter's master values from rank 0 (ranks start
 * equal, as DistributedDataParallel's constructor does) and post_backward()
 * averages the gradients with one MPI_Allreduce per bucket of at most
 * bucket_mb MiB, staged through one host buffer allocated in setup() (D2H and
 * H2D through the accelerator's kernel table when its memory is not host
 * memory). A bucket whose tensors lie back to back in memory (the host's
 * arenas) needs no staging on host memory or on NCCL: its collective runs
 * in place, and on NCCL all such buckets are queued together and waited
 * for once. The host calls post_backward only on stepping batches, which is
 * Lightning's no_sync() around accumulating ones. Every MPI failure becomes a
 * kiln status with a message naming the call and the rank (the communicator
 * is a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN). A dead rank is
 * noticed by the launcher, which ends the job; a hung one (stopped,
 * deadlocked, stuck in I/O) is not, so every collective is issued
 * non-blocking and waited for with a deadline (timeout_s; timeout_s = 0
 * means no deadline and MPI's blocking collectives): the ranks still
 * alive then fail with a message naming the collective instead of blocking
 * for ever, skip MPI_Finalize (which would wait for the hung rank too), and
 * the launcher takes the job down when they exit. Collectives and bytes are
 * counted and reported in one info line at destroy. Under Slurm, a task
 * that no PMIx server serves (`srun --mpi=none`) is stopped before
 * MPI_Init with one line saying how to launch instead of Open MPI's abort
 * (ddp_slurm.c); a launch without MPI takes its rendezvous host and port
 * from the job when MASTER_ADDR/MASTER_PORT are unset.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp_internal.h"
#include "ddp_slurm.h"
#include "ddp_tcp.h"

/* ------------------------------------------------------------------------ */
/* Errors */

/* Turn an MPI error code into KILN_E_COMM with the call, the rank and MPI's
 * own text, so a failed collective says where and why. */
static int32_t ddp_mpi_fail(kiln_instance *self, int err, const char *call) {
    char text[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) len = snprintf(text, sizeof text, "MPI error %d", err);
    text[len < 0 ? 0 : len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len] = 0;
    return kiln_errorf(self->svc, self->hctx, KILN_E_COMM, "ddp: rank %d of %d: %s failed: %s", (int)self->rank,
                       (int)self->world, call, text);
}

/* A collective that cannot complete because an earlier one failed for good. */
int32_t ddp_dead(kiln_instance *self, const char *call) {
    return kiln_errorf(self->svc, self->hctx, KILN_E_COMM, "ddp: rank %d of %d: %s not attempted: %s",
                       (int)self->rank, (int)self->world, call,
                       self->dead_why ? self->dead_why : "an earlier collective failed");
}

void ddp_kill(kiln_instance *self, const char *why, int mpi_stuck) {
    if (!self->dead) self->dead_why = why; /* the first cause is the one to report */
    self->dead = 1;
    if (mpi_stuck) self->mpi_stuck = 1;
}

/* The pause between two polls of a pending collective (MPI's and NCCL's
 * waits both use it): none for the first second, as a blocking collective
 * would spin, then a sleep of 50 us growing to 1 ms, so a rank waiting for a
 * slow or hung peer does not hold a core. (Sleeping after 2 ms instead made
 * 2-rank training 7x slower: OpenMPI's non-blocking all-reduce advances only
 * while both ranks test, so every round of a large one waited out a nap.) */
void ddp_backoff(double waited, long *nap_ns) {
    if (waited <= 1.0) return;
    struct timespec ts = {0, *nap_ns};
    nanosleep(&ts, NULL);
    if (*nap_ns < 1000000) *nap_ns *= 2;
}

/* With timeout_s = 0 (no deadline) the MPI collectives are the blocking
 * ones: OpenMPI's tuned blocking algorithms beat its non-blocking (libnbc)
 * ones, about 10% of 2-rank training throughput. With a deadline they must
 * be non-blocking, so a hung peer can be noticed. */
#define DDP_BLOCKING(self) ((self)->timeout_s == 0)

/* Polls the request until done or timeout_s (MPI_Test also drives
 * OpenMPI's progress). */
int32_t ddp_wait(kiln_instance *self, MPI_Request *req, const char *call) {
    const double t0 = MPI_Wtime();
    long nap_ns = 50000;
    for (;;) {
        int done = 0;
        int err = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS) return ddp_mpi_fail(self, err, call);
        if (done) return KILN_OK;
        const double waited = MPI_Wtime() - t0;
        if (self->timeout_s > 0 && waited > self->timeout_s) {
            ddp_kill(self, "an earlier collective timed out", 1);
            return kiln_errorf(self->svc, self->hctx, KILN_E_COMM,
                               "ddp: rank %d of %d: %s did not complete within timeout_s = %g s: another rank is "
                               "hung, stopped or far slower (raise strategy.timeout_s if its steps are that long)",
                               (int)self->rank, (int)self->world, call, self->timeout_s);
        }
        ddp_backoff(waited, &nap_ns);
    }
}

/* ------------------------------------------------------------------------ */
/* Rank discovery */

/* A rank source: three variable names, or explicit config (names NULL). */
typedef struct ddp_source {
    const char *label;
    const char *rank_var, *size_var, *local_var;
} ddp_source;

static const ddp_source ddp_env_sources[] = {
    {"OpenMPI (OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"torchrun-style (RANK/WORLD_SIZE/LOCAL_RANK)", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Slurm (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID)", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

/* getenv with the const signature ddp_slurm.c takes. */
static const char *ddp_getenv(const char *name) { return getenv(name); }

/* Parse a whole-string non-negative decimal; -1 absent, -2 malformed. */
static int64_t ddp_env_int(const char *name) {
    const char *s = getenv(name);
    if (!s || !*s) return -1;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end || v < 0 || v > INT32_MAX) return -2;
    return v;
}

/* Fill rank/world/local from the first source that sets its rank and size
 * variables. *label is NULL when none does. */
static int32_t ddp_ranks_from_env(kiln_instance *self, const char **label, int64_t *rank, int64_t *world,
                                  int64_t *local) {
    *label = NULL;
    for (size_t i = 0; i < sizeof ddp_env_sources / sizeof ddp_env_sources[0]; i++) {
        const ddp_source *s = &ddp_env_sources[i];
        int64_t r = ddp_env_int(s->rank_var), w = ddp_env_int(s->size_var), l = ddp_env_int(s->local_var);
        if (r == -1 && w == -1) continue;
        const char *bad = r == -2 ? s->rank_var : w == -2 ? s->size_var : l == -2 ? s->local_var : NULL;
        if (bad)
            return kiln_errorf(self->svc, self->hctx, KILN_E_CONFIG,
                               "ddp: %s: expected a non-negative integer, found '%s'", bad, getenv(bad));
        if (r < 0 || w < 0)
            return kiln_errorf(self->svc, self->hctx, KILN_E_CONFIG,
                               "ddp: %s sets only one of %s and %s; both are needed", s->label, s->rank_var,
                               s->size_var);
        *label = s->label;
        *rank = r;
        *world = w;
        *local = l;
        return KILN_OK;
    }
    return KILN_OK;
}

/* MPI's own idea of the node-local rank: the rank within the processes that
 * share this node's memory. */
static int32_t ddp_mpi_local_rank(kiln_instance *self, int64_t *local) {
    MPI_Comm node;
    int err = MPI_Comm_split_type(self->comm, MPI_COMM_TYPE_SHARED, (int)self->rank, MPI_INFO_NULL, &node);
    if (err != MPI_SUCCESS) return ddp_mpi_fail(self, err, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    int r = 0;
    err = MPI_Comm_rank(node, &r);
    MPI_Comm_free(&node);
    if (err != MPI_SUCCESS) return ddp_mpi_fail(self, err, "MPI_Comm_rank(node communicator)");
    *local = r;
    return KILN_OK;
}

/* auto bootstrap: TCP when torchrun-style variables won and no MPI launcher
 * is around (no OpenMPI, PMIx or PMI rank) and ddp has NCCL: a torchrun or
 * Kubernetes launch on GPUs. Everything else joins MPI. */
static int ddp_launched_without_mpi(const char *source) {
#ifdef KILN_DDP_NCCL
    return source == ddp_env_sources[1].label && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK") &&
           !getenv("PMI_RANK") && !getenv("PMI_SIZE") && getenv("MASTER_ADDR") && getenv("MASTER_PORT");
#else
    (void)source;
    return 0;
#endif
}

/* create() of bootstrap "tcp": the world from config or the launcher's
 * variables, the rendezvous from MASTER_ADDR and MASTER_PORT; no MPI. The
 * NCCL communicator is made at setup (or at the first collective). */
static int32_t ddp_create_tcp(kiln_instance *self, const char *source, int64_t rank, int64_t world, int64_t local) {
    const kiln_host_services *svc = self->svc;
    kiln_host_ctx *hctx = self->hctx;
#ifndef KILN_DDP_NCCL
    (void)source, (void)rank, (void)world, (void)local;
    return kiln_errorf(svc, hctx, KILN_E_UNSUPPORTED,
                       "ddp: bootstrap \"tcp\" runs every collective on NCCL, and this ddp plugin was built without "
                       "NCCL (no nccl.h/libnccl at build time); launch through mpirun or srun");
#else
    if (!source)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "ddp: bootstrap \"tcp\" needs RANK and WORLD_SIZE (torchrun sets them) or "
                           "strategy.rank/world_size; none is set");
    const char *addr = getenv("MASTER_ADDR");
    const char *addr_from = "MASTER_ADDR", *port_from = "MASTER_PORT";
    /* Under Slurm the job itself names rank 0's host: task 0 runs on the
     * first node of its step (srun's block and cyclic distributions both
     * start there), and every task sees the same list. The step's list
     * first: a step may run on part of the job's nodes. */
    char slurm_host[256];
    const char *list_var = getenv("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    if ((!addr || !*addr) && getenv(list_var)) {
        char why[300];
        int r = ddp_slurm_hostlist_nth(getenv(list_var), 0, slurm_host, sizeof slurm_host, why, sizeof why);
        if (r != 0)
            return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                               "ddp: bootstrap \"tcp\": MASTER_ADDR is unset and %s '%s' gives no first host: %s",
                               list_var, getenv(list_var), r < 0 ? why : "the list is empty");
        addr = slurm_host;
        addr_from = list_var;
    }
    int64_t port = ddp_env_int("MASTER_PORT");
    if (port == -1 && getenv("SLURM_JOB_ID")) {
        port = ddp_slurm_port(getenv("SLURM_JOB_ID"));
        port_from = "SLURM_JOB_ID (20000 + id % 20000)";
    }
    if (port < 1 || port > 65535)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "ddp: bootstrap \"tcp\": MASTER_PORT: expected a TCP port 1..65535, found '%s'",
                           getenv("MASTER_PORT") ? getenv("MASTER_PORT") : "(unset)");
    /* The rendezvous hands NCCL's id (the key to its bootstrap) only to
     * ranks that prove they hold the job's secret. Unset, it runs
     * unauthenticated as torchrun does, and rank 0 says so once. */
    const char *secret = getenv("KILN_RDZV_SECRET");
    if (secret && *secret && (strlen(secret) < DDP_TCP_MIN_SECRET || strlen(secret) >= sizeof self->rdzv_secret))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "ddp: KILN_RDZV_SECRET: expected %d to %zu characters, found %zu (e.g. `openssl rand "
                           "-hex 32`)", DDP_TCP_MIN_SECRET, sizeof self->rdzv_secret - 1, strlen(secret));
    if (world > 1 && (!addr || !*addr || strlen(addr) >= sizeof self->master_addr))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "ddp: bootstrap \"tcp\": MASTER_ADDR: expected rank 0's host name or address, found "
                           "'%s'", addr ? addr : "(unset)");
    if (local < 0 && world > 1)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "ddp: bootstrap \"tcp\": LOCAL_RANK is not set (torchrun sets it; or set "
                           "strategy.local_rank): it picks this process's GPU");
    self->tcp_boot = 1;
    snprintf(self->master_addr, sizeof self->master_addr, "%s", addr ? addr : "");
    self->master_port = (int)port;
    snprintf(self->rdzv_secret, sizeof self->rdzv_secret, "%s", secret ? secret : "");
    self->rank = (int32_t)rank;
    self->world = (int32_t)world;
    self->local_rank = (int32_t)(local < 0 ? 0 : local);
    kiln_logf(svc, hctx, KILN_LOG_INFO,
              "ddp: rank %d of %d (local rank %d) from %s; no MPI: rendezvous over TCP at %s:%d, collectives on NCCL",
              (int)self->rank, (int)self->world, (int)self->local_rank, source, self->master_addr[0] ? self->master_addr : "*",
              self->master_port);
    if (strcmp(addr_from, "MASTER_ADDR") || strcmp(port_from, "MASTER_PORT"))
        kiln_logf(svc, hctx, KILN_LOG_INFO, "ddp: rendezvous host from %s, port from %s", addr_from, port_from);
    if (!self->rdzv_secret[0] && self->rank == 0 && self->world > 1)
        kiln_logf(svc, hctx, KILN_LOG_WARN,
                  "ddp: KILN_RDZV_SECRET is unset: the TCP rendezvous at %s:%d is unauthenticated, and anyone who "
                  "reaches that port during it can obtain NCCL's id; have the launcher export the same secret to "
                  "every rank (docs/distributed.md)", self->master_addr, self->master_port);
    return KILN_OK;
#endif
}

/* ------------------------------------------------------------------------ */
/* create / destroy */

/* The gradient buckets and their staging buffers (the device one under
 * NCCL), freed and forgotten: at release, and at every setup (the sizes
 * change; NCCL use is decided again, the communicator is kept). */
static void ddp_drop_buffers(kiln_instance *self) {
#ifdef KILN_DDP_NCCL
    if (self->dbuf && self->K && self->K->free) self->K->free(self->acc, self->dbuf);
    self->dbuf = NULL;
    self->use_nccl = 0;
#endif
    free(self->buf);
    free(self->segs);
    free(self->buckets);
    self->buf = NULL;
    self->segs = NULL;
    self->buckets = NULL;
}

static void ddp_release(kiln_instance *self) {
#ifdef KILN_DDP_NCCL
    ddp_nccl_release(self);
#endif
    ddp_drop_buffers(self);
    self->nseg = self->nbuckets = 0;
    self->buf_bytes = 0;
    /* after a timeout or NCCL's report of a failed peer, a peer may never
     * answer: freeing the communicator or MPI_Finalize would wait for it, so
     * leave both to process exit (the launcher then ends the job) */
    if (self->have_comm && !self->mpi_stuck) MPI_Comm_free(&self->comm);
    self->have_comm = 0;
    int finalized = 0;
    if (self->initialized_mpi && !self->mpi_stuck && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized)
        MPI_Finalize();
    self->initialized_mpi = 0;
}

static int32_t ddp_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                          const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const int64_t cfg_rank = kiln_kv_int(config, "rank", -1);
    const int64_t cfg_world = kiln_kv_int(config, "world_size", -1);
    const int64_t cfg_local = kiln_kv_int(config, "local_rank", -1);
    const double bucket_mb = kiln_kv_float(config, "bucket_mb", 25.0);
    const double timeout_s = kiln_kv_float(config, "timeout_s", 1800.0);

    /* Config checks first: nothing to undo yet. */
    if (cfg_rank < -1 || cfg_world < -1 || cfg_world == 0 || cfg_local < -1)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "ddp: rank, world_size and local_rank must be -1 (unset) or >= 0 (world_size >= 1), "
                           "found rank %" PRId64 ", world_size %" PRId64 ", local_rank %" PRId64,
                           cfg_rank, cfg_world, cfg_local);
    if ((cfg_rank == -1) != (cfg_world == -1))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "ddp: set both rank and world_size, or neither; found rank %" PRId64
                           ", world_size %" PRId64, cfg_rank, cfg_world);
    if (cfg_world > 0 && cfg_rank >= cfg_world)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "ddp: expected 0 <= rank < world_size, found rank %" PRId64 ", world_size %" PRId64,
                           cfg_rank, cfg_world);
    if (!(bucket_mb > 0) || bucket_mb > 4096)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "ddp: bucket_mb must be in (0, 4096] MiB, found %g",
                           bucket_mb);

    if (!(timeout_s >= 0) || timeout_s > 1e7)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "ddp: timeout_s must be >= 0 seconds (0: no timeout) and below 1e7, found %g", timeout_s);

    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "ddp: out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->timeout_s = timeout_s;
    self->bucket_bytes = (size_t)(bucket_mb * 1024.0 * 1024.0);
    if (self->bucket_bytes < sizeof(double)) self->bucket_bytes = sizeof(double); /* one element at least */
    self->bucket_bytes &= ~(size_t)(sizeof(double) - 1);                          /* whole elements */

    /* Where the rank comes from, most explicit first. */
    const char *source = NULL;
    int64_t rank = -1, world = -1, local = -1;
    int32_t rc;
    if (cfg_rank >= 0) {
        source = "explicit config (strategy.rank/world_size)";
        rank = cfg_rank;
        world = cfg_world;
    } else if ((rc = ddp_ranks_from_env(self, &source, &rank, &world, &local))) {
        free(self);
        return rc;
    }
    if (source && rank >= world) {
        rc = kiln_errorf(svc, hctx, KILN_E_CONFIG, "ddp: %s says rank %" PRId64 " of %" PRId64
                         ": expected 0 <= rank < world size", source, rank, world);
        free(self);
        return rc;
    }
    if (cfg_local >= 0) local = cfg_local;

    const char *boot = kiln_kv_str(config, "bootstrap", "auto");
    int tcp = 0;
    if (!strcmp(boot, "tcp")) tcp = 1;
    else if (!strcmp(boot, "auto")) tcp = ddp_launched_without_mpi(source);
    else if (strcmp(boot, "mpi")) {
        rc = kiln_errorf(svc, hctx, KILN_E_CONFIG, "ddp: bootstrap must be \"auto\", \"mpi\" or \"tcp\", found \"%s\"",
                         boot);
        free(self);
        return rc;
    }
    if (tcp) {
        if ((rc = ddp_create_tcp(self, source, rank, world, local))) {
            free(self);
            return rc;
        }
        *out = self;
        return KILN_OK;
    }

    /* Join (or start) MPI. */
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) {
        rc = kiln_errorf(svc, hctx, KILN_E_STATE,
                         "ddp: MPI was already finalized in this process; it cannot be started again");
        free(self);
        return rc;
    }
    if (!inited) {
        /* Open MPI aborts the whole process, with a page of text, when
         * srun starts it without PMIx: say what to do instead, first. */
#ifdef OPEN_MPI
        const int pmi_counts = 0; /* Open MPI 4 direct-launches through PMIx only */
#else
        const int pmi_counts = 1; /* MPICH and others speak PMI-2 */
#endif
        char why[400];
        int sc = ddp_slurm_mpi_check(ddp_getenv, pmi_counts, why, sizeof why);
        if (sc < 0) {
            rc = kiln_errorf(svc, hctx, KILN_E_CONFIG, "ddp: %s%s", why,
#ifdef KILN_DDP_NCCL
                             " (on GPUs, strategy.bootstrap = \"tcp\" needs no MPI)"
#else
                             ""
#endif
            );
            free(self);
            return rc;
        }
#ifdef OPEN_MPI
        /* One task without PMIx: a singleton world is all it needs, but
         * Open MPI takes SLURM_STEP_ID for a direct launch and aborts; out of
         * its sight, it starts as a singleton. */
        if (sc > 0 && getenv("SLURM_STEP_ID")) {
            unsetenv("SLURM_STEP_ID");
            kiln_logf(svc, hctx, KILN_LOG_DEBUG,
                      "ddp: one Slurm task without PMIx: SLURM_STEP_ID hidden from MPI, which starts as a singleton");
        }
#endif
        int provided = 0;
        int err = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (err != MPI_SUCCESS) {
            self->rank = (int32_t)(rank < 0 ? 0 : rank);
            self->world = (int32_t)(world < 0 ? 1 : world);
            rc = ddp_mpi_fail(self, err, "MPI_Init_thread(MPI_THREAD_FUNNELED)");
            free(self);
            return rc;
        }
        self->initialized_mpi = 1;
        if (provided < MPI_THREAD_FUNNELED)
            kiln_logf(svc, hctx, KILN_LOG_WARN,
                      "ddp: MPI provides thread level %d, below MPI_THREAD_FUNNELED; collectives stay on the "
                      "main thread", provided);
    }
    int err = MPI_Comm_dup(MPI_COMM_WORLD, &self->comm);
    if (err != MPI_SUCCESS) {
        rc = ddp_mpi_fail(self, err, "MPI_Comm_dup(MPI_COMM_WORLD)");
        ddp_release(self);
        free(self);
        return rc;
    }
    self->have_comm = 1;
    MPI_Comm_set_errhandler(self->comm, MPI_ERRORS_RETURN);
    int mrank = 0, msize = 1;
    if ((err = MPI_Comm_rank(self->comm, &mrank)) != MPI_SUCCESS ||
        (err = MPI_Comm_size(self->comm, &msize)) != MPI_SUCCESS) {
        rc = ddp_mpi_fail(self, err, "MPI_Comm_rank/MPI_Comm_size");
        ddp_release(self);
        free(self);
        return rc;
    }
    if (!source) {
        /* No launcher variables: MPI itself is the only witness (a singleton is rank 0 of 1). */
        source = "the MPI world (no launcher variables set)";
        rank = mrank;
        world = msize;
    }
    if (rank != mrank || world != msize) {
        rc = kiln_errorf(svc, hctx, KILN_E_CONFIG,
                         "ddp: %s says rank %" PRId64 " of %" PRId64 ", but the MPI world is rank %d of %d. "
                         "Launch every rank through MPI: `mpirun -n %" PRId64 " kiln fit RUN.cfg` (or "
                         "`srun --mpi=pmix -n %" PRId64 " kiln fit RUN.cfg` under Slurm); torchrun-style "
                         "variables alone cannot form an MPI world",
                         source, rank, world, mrank, msize, world, world);
        ddp_release(self);
        free(self);
        return rc;
    }
    self->rank = (int32_t)rank;
    self->world = (int32_t)world;
    if (local < 0 && (rc = ddp_mpi_local_rank(self, &local))) {
        ddp_release(self);
        free(self);
        return rc;
    }
    self->local_rank = (int32_t)local;
    kiln_logf(svc, hctx, KILN_LOG_INFO, "ddp: rank %d of %d (local rank %d) from %s; MPI %s", (int)self->rank,
              (int)self->world, (int)self->local_rank, source,
              self->initialized_mpi ? "initialised here" : "already initialised");
    *out = self;
    return KILN_OK;
}

static void ddp_destroy(kiln_instance *self) {
    if (!self) return;
    kiln_logf(self->svc, self->hctx, KILN_LOG_INFO,
              "ddp: rank %d: %" PRIu64 " broadcasts, %" PRIu64 " all-reduces (%" PRIu64 " bytes); broadcast %" PRIu64
              " bytes, %" PRIu64 " metric reductions, %" PRIu64 " barriers; %" PRIu64
              " broadcasts and all-reduces in place",
              (int)self->rank, self->n_bcast, self->n_allreduce, self->allreduce_bytes, self->bcast_bytes,
              self->n_reduce_sum, self->n_barrier, self->n_in_place);
    ddp_release(self);
    free(self);
}

/* ------------------------------------------------------------------------ */
/* Buckets */

static MPI_Datatype ddp_mpi_type(uint32_t dtype) { return dtype == KILN_DTYPE_F64 ? MPI_DOUBLE : MPI_FLOAT; }

/* Plan the buckets: walk the parameters in order, cutting a new bucket when
 * the current one is full or the dtype changes. Returns the segment and
 * bucket counts through the arrays (NULL arrays: count only). */
static void ddp_plan(const kiln_instance *self, kiln_parameter *const *params, uint32_t n, ddp_segment *segs,
                     uint32_t *nseg, ddp_bucket *buckets, uint32_t *nb) {
    uint32_t s = 0, b = 0;
    int64_t room = 0;          /* elements left in the open bucket */
    uint32_t open_dtype = 0;   /* dtype of the open bucket; 0: none open */
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t dt = kiln_param_dtype(params[i]);
        const int64_t cap = (int64_t)(self->bucket_bytes / kiln_dtype_size(dt));
        int64_t off = 0;
        while (off < params[i]->numel) {
            if (open_dtype != dt || room == 0) { /* open a bucket */
                if (buckets) buckets[b] = (ddp_bucket){s, 0, dt, 0, {NULL, NULL}};
                b++;
                open_dtype = dt;
                room = cap;
            }
            const int64_t left = params[i]->numel - off;
            const int64_t take = left < room ? left : room;
            if (segs) {
                segs[s] = (ddp_segment){i, off, take};
                buckets[b - 1].nseg++;
                buckets[b - 1].count += take;
            }
            s++;
            off += take;
            room -= take;
        }
    }
    *nseg = s;
    *nb = b;
}

/* Sets each bucket's run[]: its weights' and gradients' memory when the
 * segments follow each other without a gap (the host's arenas hold a
 * model's parameters back to back whenever their sizes are multiples of 16
 * elements, so every GPT-2 bucket qualifies), NULL otherwise. Returns how
 * many buckets have both, i.e. need no staging at all. */
static uint32_t ddp_find_runs(kiln_instance *self) {
    uint32_t whole_buckets = 0;
    for (uint32_t b = 0; b < self->nbuckets; b++) {
        ddp_bucket *bk = &self->buckets[b];
        const size_t esz = kiln_dtype_size(bk->dtype);
        for (int which = 0; which < 2; which++) {
            uintptr_t start = 0, end = 0;
            int whole = bk->nseg > 0;
            for (uint32_t k = 0; k < bk->nseg && whole; k++) {
                const ddp_segment *sg = &self->segs[bk->first_seg + k];
                const kiln_parameter *p = self->params[sg->param];
                const void *base = which ? (void *)p->grad : (void *)p->data;
                const uintptr_t at = (uintptr_t)base + (uintptr_t)sg->offset * esz;
                if (k == 0) start = at;
                else whole = at == end;
                end = at + (uintptr_t)sg->count * esz;
            }
            bk->run[which] = whole ? (void *)start : NULL;
        }
        whole_buckets += bk->run[0] && bk->run[1];
    }
    return whole_buckets;
}

/* Copy a bucket's `which` tensors (0: data, 1: grad) into the staging buffer
 * (to_buf) or back out of it, through the kernel table when the accelerator's
 * memory is not host memory. */
static int32_t ddp_stage(kiln_instance *self, const ddp_bucket *bk, int which, int to_buf) {
    const size_t esz = kiln_dtype_size(bk->dtype);
    char *hb = self->buf; /* (bk->count) elements of bk->dtype */
    for (uint32_t k = 0; k < bk->nseg; k++) {
        const ddp_segment *sg = &self->segs[bk->first_seg + k];
        const kiln_parameter *p = self->params[sg->param];
        char *dev = (char *)(which ? (void *)p->grad : (void *)p->data) + (size_t)sg->offset * esz;
        const size_t bytes = (size_t)sg->count * esz;
        if (self->host_memory) {
            if (to_buf) memcpy(hb, dev, bytes);
            else memcpy(dev, hb, bytes);
        } else {
            int32_t rc = to_buf ? self->K->copy(self->acc, hb, dev, bytes, KILN_COPY_D2H)
                                : self->K->copy(self->acc, dev, hb, bytes, KILN_COPY_H2D);
            if (rc)
                return kiln_errorf(self->svc, self->hctx, rc, "ddp: rank %d: copying %s of '%s' %s failed (%s)",
                                   (int)self->rank, which ? "gradients" : "weights", p->name,
                                   to_buf ? "to the host" : "to the device", kiln_status_name(rc));
        }
        hb += bytes;
    }
    if (!self->host_memory && self->K->synchronize) {
        int32_t rc = self->K->synchronize(self->acc);
        if (rc)
            return kiln_errorf(self->svc, self->hctx, rc, "ddp: rank %d: accelerator synchronize failed (%s)",
                               (int)self->rank, kiln_status_name(rc));
    }
    return KILN_OK;
}

#ifdef KILN_DDP_NCCL
/* Waits for the accelerator's stream (NCCL runs on a stream of its own). */
static int32_t ddp_acc_sync(kiln_instance *self) {
    if (!self->K->synchronize) return KILN_OK;
    int32_t rc = self->K->synchronize(self->acc);
    if (rc)
        return kiln_errorf(self->svc, self->hctx, rc, "ddp: rank %d: accelerator synchronize failed (%s)",
                           (int)self->rank, kiln_status_name(rc));
    return KILN_OK;
}

/* The NCCL path's ddp_stage: a bucket's tensors packed into (to_buf) or
 * unpacked from the device buffer dbuf with device-to-device copies on the
 * accelerator's stream; packing waits for that stream, because NCCL reads
 * dbuf from its own stream next. */
static int32_t ddp_stage_dev(kiln_instance *self, const ddp_bucket *bk, int which, int to_buf) {
    const size_t esz = kiln_dtype_size(bk->dtype);
    char *db = self->dbuf; /* (bk->count) elements of bk->dtype, device */
    for (uint32_t k = 0; k < bk->nseg; k++) {
        const ddp_segment *sg = &self->segs[bk->first_seg + k];
        const kiln_parameter *p = self->params[sg->param];
        char *dev = (char *)(which ? (void *)p->grad : (void *)p->data) + (size_t)sg->offset * esz;
        const size_t bytes = (size_t)sg->count * esz;
        int32_t rc = to_buf ? self->K->copy(self->acc, db, dev, bytes, KILN_COPY_D2D)
                            : self->K->copy(self->acc, dev, db, bytes, KILN_COPY_D2D);
        if (rc)
            return kiln_errorf(self->svc, self->hctx, rc, "ddp: rank %d: packing %s of '%s' for NCCL failed (%s)",
                               (int)self->rank, which ? "gradients" : "weights", p->name, kiln_status_name(rc));
        db += bytes;
    }
    return to_buf ? ddp_acc_sync(self) : KILN_OK;
}

/* Chooses NCCL when the parameters are CUDA device memory (on any number
 * of ranks); allocates the device bucket buffer when `staged`: some bucket
 * does not lie in one piece and must be packed into it. */
static int32_t ddp_setup_nccl(kiln_instance *self, kiln_parameter *const *params, uint32_t n, int staged) {
    if (self->host_memory || n == 0 || !self->K->alloc) return KILN_OK;
    int is_dev = 0;
    ddp_nccl_is_device(params[0]->data, &is_dev);
    if (!is_dev) return KILN_OK;
    int32_t rc = ddp_nccl_init(self);
    if (rc) return rc;
    self->use_nccl = 1;
    if (!staged) return KILN_OK;
    rc = self->K->alloc(self->acc, self->buf_bytes ? self->buf_bytes : 1, &self->dbuf);
    if (rc)
        return kiln_errorf(self->svc, self->hctx, rc, "ddp: rank %d: cannot allocate a %zu-byte device bucket (%s)",
                           (int)self->rank, self->buf_bytes, kiln_status_name(rc));
    return KILN_OK;
}

/* At most this many in-place collectives are queued on NCCL's stream
 * before the host waits for them: far more than a step needs (GPT-2 124M
 * has 20 buckets of 25 MiB) and a bound on what is outstanding. */
#define DDP_NCCL_QUEUED 32

/* One bucket's collective on NCCL: in place on `run` when the bucket lies
 * in one piece, queued behind the earlier ones (*queued counts them, and
 * the host waits for all of them when DDP_NCCL_QUEUED are out); else
 * packed into dbuf, run and waited for (which also finishes the queued
 * ones), and unpacked. which: 0 broadcasts the weights from rank 0, 1
 * averages the gradients. */
static int32_t ddp_nccl_bucket(kiln_instance *self, const ddp_bucket *bk, int which, uint32_t *queued) {
    int32_t rc;
    const char *what = which ? "ncclAllReduce(gradients, AVG)" : "ncclBroadcast(parameters)";
    void *run = bk->run[which];
    if (run) {
        if (*queued == DDP_NCCL_QUEUED) {
            if ((rc = ddp_nccl_wait(self, what))) return rc;
            *queued = 0;
        }
        rc = which ? ddp_nccl_allreduce_avg(self, run, bk->count, bk->dtype, 0)
                   : ddp_nccl_bcast(self, run, bk->count, bk->dtype, 0);
        if (rc) return rc;
        ++*queued;
        self->n_in_place++;
        return KILN_OK;
    }
    /* every rank waits for the accelerator's stream before NCCL writes
     * dbuf: K->alloc's zero fill and the previous bucket's unpack copies
     * are queued there, and would otherwise land after (or read during)
     * the collective */
    if ((which || self->rank == 0) && (rc = ddp_stage_dev(self, bk, which, 1))) return rc;
    if (!which && self->rank != 0 && (rc = ddp_acc_sync(self))) return rc;
    rc = which ? ddp_nccl_allreduce_avg(self, self->dbuf, bk->count, bk->dtype, 1)
               : ddp_nccl_bcast(self, self->dbuf, bk->count, bk->dtype, 1);
    if (rc) return rc;
    *queued = 0;
    if ((which || self->rank != 0) && (rc = ddp_stage_dev(self, bk, which, 0))) return rc;
    return KILN_OK;
}

/* Every bucket's collective on NCCL, after one wait for the accelerator's
 * stream (the module's initial weights, or the backward's gradients, and
 * the arena's zero fill are queued there; NCCL reads from its own stream),
 * then one wait for NCCL's stream at the end: two waits per step for a
 * model whose buckets all lie in one piece, instead of two per bucket. */
static int32_t ddp_nccl_all(kiln_instance *self, int which) {
    int32_t rc = ddp_acc_sync(self);
    if (rc) return rc;
    uint32_t queued = 0;
    for (uint32_t b = 0; b < self->nbuckets; b++) {
        const ddp_bucket *bk = &self->buckets[b];
        if ((rc = ddp_nccl_bucket(self, bk, which, &queued))) return rc;
        const uint64_t bytes = (uint64_t)bk->count * kiln_dtype_size(bk->dtype);
        if (which) self->n_allreduce++, self->allreduce_bytes += bytes;
        else self->n_bcast++, self->bcast_bytes += bytes;
    }
    return queued ? ddp_nccl_wait(self, which ? "ncclAllReduce(gradients, AVG)" : "ncclBroadcast(parameters)")
                  : KILN_OK;
}

static int32_t ddp_nccl_params(kiln_instance *self) { return ddp_nccl_all(self, 0); }
static int32_t ddp_nccl_grads(kiln_instance *self) { return ddp_nccl_all(self, 1); }
#endif

/* ------------------------------------------------------------------------ */
/* Strategy ops */

static int32_t ddp_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t n) {
    ddp_drop_buffers(self);
    self->params = params;
    self->nparams = n;

    for (uint32_t i = 0; i < n; i++) {
        const uint32_t dt = kiln_param_dtype(params[i]);
        if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F64)
            return kiln_errorf(self->svc, self->hctx, KILN_E_UNSUPPORTED,
                               "ddp: parameter '%s': expected float32 or float64 masters, found %s", params[i]->name,
                               kiln_dtype_name(dt));
        if (params[i]->numel < 0 || (params[i]->numel > 0 && (!params[i]->data || !params[i]->grad)))
            return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG,
                               "ddp: parameter '%s': expected allocated data and grad, found data %p grad %p",
                               params[i]->name, (void *)params[i]->data, (void *)params[i]->grad);
    }

    /* The accelerator decides whether the staging buffer is needed for copies. */
    self->acc = NULL;
    self->K = NULL;
    self->host_memory = 1;
    if (self->svc->abi_minor >= 1 && self->svc->accelerator &&
        self->svc->accelerator(self->hctx, &self->acc, &self->K) == KILN_OK && self->K) {
        self->host_memory = (self->K->flags & KILN_KERNELS_HOST_MEMORY) != 0;
        if (!self->host_memory && !self->K->copy)
            return kiln_errorf(self->svc, self->hctx, KILN_E_UNSUPPORTED,
                               "ddp: the accelerator's memory is not host memory and its kernel table has no copy");
    }

    uint32_t nseg = 0, nb = 0;
    ddp_plan(self, params, n, NULL, &nseg, NULL, &nb);
    self->segs = calloc(nseg ? nseg : 1, sizeof *self->segs);
    self->buckets = calloc(nb ? nb : 1, sizeof *self->buckets);
    if (!self->segs || !self->buckets)
        return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "ddp: out of memory planning %u buckets", nb);
    ddp_plan(self, params, n, self->segs, &self->nseg, self->buckets, &self->nbuckets);
    const uint32_t whole = ddp_find_runs(self);
    size_t largest = 0;
    for (uint32_t b = 0; b < self->nbuckets; b++) {
        const size_t bytes = (size_t)self->buckets[b].count * kiln_dtype_size(self->buckets[b].dtype);
        if (bytes > largest) largest = bytes;
    }
    self->buf_bytes = largest;
    self->buf = malloc(largest ? largest : 1);
    if (!self->buf)
        return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "ddp: cannot allocate a %zu-byte bucket buffer",
                           largest);
    kiln_logf(self->svc, self->hctx, KILN_LOG_DEBUG,
              "ddp: rank %d: %u parameters in %u buckets of <= %zu bytes, %u of them in one piece (reduced in place)",
              (int)self->rank, n, self->nbuckets, self->bucket_bytes, whole);

#ifdef KILN_DDP_NCCL
    /* device memory takes NCCL even on one rank (as torch's DDP on one GPU
     * still all-reduces), so a single-GPU machine exercises that path */
    int32_t nrc = ddp_setup_nccl(self, params, n, whole < self->nbuckets);
    if (nrc) return nrc;
    if (self->tcp_boot && !self->use_nccl && n > 0)
        return kiln_errorf(self->svc, self->hctx, KILN_E_CONFIG,
                           "ddp: rank %d: a launch without MPI (bootstrap \"tcp\") runs every collective on NCCL and "
                           "needs the parameters in CUDA device memory (accelerator = \"cuda\"); on CPU, launch "
                           "through mpirun or srun", (int)self->rank);
    if (self->world == 1 && !self->use_nccl) return KILN_OK;
#else
    if (self->world == 1) return KILN_OK; /* nothing to agree on */
#endif
    /* Rank 0's weights everywhere, one broadcast per bucket. */
#ifdef KILN_DDP_NCCL
    if (self->use_nccl) return ddp_nccl_params(self);
#endif
    for (uint32_t b = 0; b < self->nbuckets; b++) {
        const ddp_bucket *bk = &self->buckets[b];
        int32_t rc;
        /* on host memory a bucket in one piece is broadcast where it is */
        void *buf = self->host_memory && bk->run[0] ? bk->run[0] : self->buf;
        if (self->rank == 0 && buf == self->buf && (rc = ddp_stage(self, bk, 0, 1))) return rc;
        if (self->dead) return ddp_dead(self, "MPI_Bcast(parameters)");
        MPI_Request req;
        int err = DDP_BLOCKING(self) ? MPI_Bcast(buf, (int)bk->count, ddp_mpi_type(bk->dtype), 0, self->comm)
                                     : MPI_Ibcast(buf, (int)bk->count, ddp_mpi_type(bk->dtype), 0, self->comm, &req);
        if (err != MPI_SUCCESS) return ddp_mpi_fail(self, err, "MPI_Bcast(parameters)");
        if (!DDP_BLOCKING(self) && (rc = ddp_wait(self, &req, "MPI_Ibcast(parameters)"))) return rc;
        if (self->rank != 0 && buf == self->buf && (rc = ddp_stage(self, bk, 0, 0))) return rc;
        self->n_bcast++;
        self->n_in_place += buf != self->buf;
        self->bcast_bytes += (uint64_t)bk->count * kiln_dtype_size(bk->dtype);
    }
    return KILN_OK;
}

static int32_t ddp_world(kiln_instance *self, int32_t *rank, int32_t *world_size, int32_t *local_rank) {
    *rank = self->rank;
    *world_size = self->world;
    *local_rank = self->local_rank;
    return KILN_OK;
}

static int32_t ddp_pre_backward(kiln_instance *self) {
    (void)self; /* the reducer has nothing to arm: the average happens after backward */
    return KILN_OK;
}

/* The gradient average: sum every bucket across ranks, divide by the world
 * size on the host (before unpacking, so the device sees one write); on
 * host memory a bucket in one piece is summed and divided where it is. */
static int32_t ddp_post_backward(kiln_instance *self) {
    if (self->world == 1 && !self->use_nccl) return KILN_OK;
    if (!self->buf && self->nbuckets)
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE, "ddp: post_backward called before setup");
#ifdef KILN_DDP_NCCL
    if (self->use_nccl) return ddp_nccl_grads(self);
#endif
    const double w = (double)self->world;
    for (uint32_t b = 0; b < self->nbuckets; b++) {
        const ddp_bucket *bk = &self->buckets[b];
        int32_t rc;
        void *buf = self->host_memory && bk->run[1] ? bk->run[1] : self->buf;
        if (buf == self->buf && (rc = ddp_stage(self, bk, 1, 1))) return rc;
        if (self->dead) return ddp_dead(self, "MPI_Allreduce(gradients, SUM)");
        MPI_Request req;
        int err = DDP_BLOCKING(self) ? MPI_Allreduce(MPI_IN_PLACE, buf, (int)bk->count, ddp_mpi_type(bk->dtype),
                                                     MPI_SUM, self->comm)
                                     : MPI_Iallreduce(MPI_IN_PLACE, buf, (int)bk->count, ddp_mpi_type(bk->dtype),
                                                      MPI_SUM, self->comm, &req);
        if (err != MPI_SUCCESS) return ddp_mpi_fail(self, err, "MPI_Allreduce(gradients, SUM)");
        if (!DDP_BLOCKING(self) && (rc = ddp_wait(self, &req, "MPI_Iallreduce(gradients, SUM)"))) return rc;
        if (bk->dtype == KILN_DTYPE_F64) {
            double *g = buf; /* (bk->count) */
            for (int64_t i = 0; i < bk->count; i++) g[i] /= w;
        } else {
            float *g = buf; /* (bk->count) */
            const float wf = (float)w;
            for (int64_t i = 0; i < bk->count; i++) g[i] /= wf;
        }
        if (buf == self->buf && (rc = ddp_stage(self, bk, 1, 0))) return rc;
        self->n_allreduce++;
        self->n_in_place += buf != self->buf;
        self->allreduce_bytes += (uint64_t)bk->count * kiln_dtype_size(bk->dtype);
    }
    return KILN_OK;
}

static int32_t ddp_barrier(kiln_instance *self, const char *name) {
#ifdef KILN_DDP_NCCL
    if (self->tcp_boot) { /* a one-value sum: NCCL has no barrier */
        double one = 0.0;
        int32_t rc = ddp_nccl_host_sum(self, &one, 1, "ncclAllReduce(barrier)");
        if (rc == KILN_OK) self->n_barrier++;
        return rc;
    }
#endif
    char call[128];
    snprintf(call, sizeof call, "MPI_Ibarrier(%s)", name ? name : "");
    if (self->dead) return ddp_dead(self, call);
    MPI_Request req;
    int err = DDP_BLOCKING(self) ? MPI_Barrier(self->comm) : MPI_Ibarrier(self->comm, &req);
    if (err != MPI_SUCCESS) return ddp_mpi_fail(self, err, call);
    int32_t rc = DDP_BLOCKING(self) ? KILN_OK : ddp_wait(self, &req, call);
    if (rc) return rc;
    self->n_barrier++;
    return KILN_OK;
}

static int32_t ddp_reduce_sum(kiln_instance *self, double *values, uint32_t n) {
    if (n == 0) return KILN_OK;
    if (n > INT_MAX)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG, "ddp: reduce_sum of %u values, at most %d",
                           n, INT_MAX);
#ifdef KILN_DDP_NCCL
    if (self->tcp_boot) {
        int32_t rc = ddp_nccl_host_sum(self, values, n, "ncclAllReduce(metrics, SUM)");
        if (rc == KILN_OK) self->n_reduce_sum++;
        return rc;
    }
#endif
    if (self->dead) return ddp_dead(self, "MPI_Allreduce(metrics, SUM)");
    MPI_Request req;
    int err = DDP_BLOCKING(self) ? MPI_Allreduce(MPI_IN_PLACE, values, (int)n, MPI_DOUBLE, MPI_SUM, self->comm)
                                 : MPI_Iallreduce(MPI_IN_PLACE, values, (int)n, MPI_DOUBLE, MPI_SUM, self->comm, &req);
    if (err != MPI_SUCCESS) return ddp_mpi_fail(self, err, "MPI_Allreduce(metrics, SUM)");
    int32_t rc = DDP_BLOCKING(self) ? KILN_OK : ddp_wait(self, &req, "MPI_Iallreduce(metrics, SUM)");
    if (rc) return rc;
    self->n_reduce_sum++;
    return KILN_OK;
}

/* Plugins' collectives (1.2), through the host's broadcast/all_gather. */
static int32_t ddp_broadcast(kiln_instance *self, void *buf, size_t bytes, int32_t root) {
    if (bytes > INT_MAX)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG, "ddp: broadcast of %zu bytes, at most %d", bytes,
                           INT_MAX);
#ifdef KILN_DDP_NCCL
    if (self->tcp_boot) return ddp_nccl_host_bcast(self, buf, bytes, root);
#endif
    if (self->dead) return ddp_dead(self, "MPI_Bcast(plugin data)");
    MPI_Request req;
    int err = DDP_BLOCKING(self) ? MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, self->comm)
                                 : MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, self->comm, &req);
    if (err != MPI_SUCCESS) return ddp_mpi_fail(self, err, "MPI_Bcast(plugin data)");
    return DDP_BLOCKING(self) ? KILN_OK : ddp_wait(self, &req, "MPI_Ibcast(plugin data)");
}

static int32_t ddp_all_gather(kiln_instance *self, const void *send, size_t bytes, void *recv) {
    if (bytes > INT_MAX)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG, "ddp: all_gather of %zu bytes, at most %d",
                           bytes, INT_MAX);
#ifdef KILN_DDP_NCCL
    if (self->tcp_boot) return ddp_nccl_host_gather(self, send, bytes, recv);
#endif
    if (self->dead) return ddp_dead(self, "MPI_Allgather(plugin data)");
    MPI_Request req;
    int err = DDP_BLOCKING(self) ? MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, self->comm)
                                 : MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, self->comm,
                                                  &req);
    if (err != MPI_SUCCESS) return ddp_mpi_fail(self, err, "MPI_Allgather(plugin data)");
    return DDP_BLOCKING(self) ? KILN_OK : ddp_wait(self, &req, "MPI_Iallgather(plugin data)");
}

/* ------------------------------------------------------------------------ */
/* Descriptor */

static const kiln_strategy_ops ddp_ops = {
    .base = {sizeof(kiln_strategy_ops), 0, ddp_create, ddp_destroy, NULL, NULL},
    .setup = ddp_setup,
    .world = ddp_world,
    .pre_backward = ddp_pre_backward,
    .post_backward = ddp_post_backward,
    .barrier = ddp_barrier,
    .reduce_sum = ddp_reduce_sum,
    .broadcast = ddp_broadcast,
    .all_gather = ddp_all_gather,
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const ddp_checks[] = {"bootstrap in {auto, mpi, tcp}", "bucket_mb > 0", "timeout_s >= 0"};
static const kiln_kv ddp_props[] = {
    {"distributed", KILN_V_BOOL(1)},
    {"config_checks", KILN_V_STRS(ddp_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_param ddp_params[] = {
    {"rank", KILN_TYPE_INT, 0, KILN_V_INT(-1),
     "this process's global rank; -1: from OMPI_COMM_WORLD_RANK, RANK or SLURM_PROCID"},
    {"world_size", KILN_TYPE_INT, 0, KILN_V_INT(-1),
     "number of processes; -1: from OMPI_COMM_WORLD_SIZE, WORLD_SIZE or SLURM_NTASKS"},
    {"local_rank", KILN_TYPE_INT, 0, KILN_V_INT(-1),
     "rank on this node (device index); -1: from the launcher's variables, else MPI's shared-memory split"},
    {"bucket_mb", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(25.0),
     "MiB of gradients per all-reduce (torch's bucket_cap_mb); (0, 4096]"},
    {"bootstrap", KILN_TYPE_STRING, 0, KILN_V_STR("auto"),
     "how ranks find each other: \"mpi\" (mpirun, srun), \"tcp\" (torchrun-style variables and "
     "MASTER_ADDR:MASTER_PORT, no MPI; GPUs only: collectives on NCCL), \"auto\": tcp when torchrun-style "
     "variables are set without an MPI launcher"},
    {"timeout_s", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1800.0),
     "seconds one collective may wait for the other ranks before the job fails (torch's default 30 min); 0: "
     "wait for ever (MPI's blocking collectives, slightly faster)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

static const kiln_plugin_desc ddp_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_STRATEGY,
    .name = "ddp",
    .version = "1.0.0",
    .description = "data-parallel processes over MPI: rank 0's weights broadcast at setup, bucketed gradient "
                   "all-reduce (average) on stepping batches",
    .capabilities = 0,
    .properties = ddp_props,
    .params = ddp_params,
    .ops = &ddp_ops,
};

KILN_DEFINE_LIBRARY("ddp", "1.0.0", 1, &ddp_desc)
