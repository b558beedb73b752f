/*
 * Batching over an idx_dataset for training: an index range [begin, end) of
 * the dataset (so train/validation splits are two loaders over one dataset),
 * a deterministic per-epoch shuffle, PyTorch DistributedSampler-style sharding
 * over world_size ranks, normalisation to float, and one background thread
 * that prepares the next batches into a small ring of preallocated buffers
 * while the training step runs. Batch content is a pure function of
 * (config, seed, epoch, batch index) and never of thread timing, so a run can
 * checkpoint (idx_loader_position) after any batch and resume bit-exactly
 * (idx_loader_start_epoch with the saved batch index).
 *
 * Threading contract: one consumer thread calls init / start_epoch / next /
 * position / free; the loader's own producer thread is internal.
 */
#ifndef KILN_PLUGINS_IDX_LOADER_H
#define KILN_PLUGINS_IDX_LOADER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "idx_reader.h"

#ifdef __cplusplus
extern "C" {
#endif

/* prefetch 0 (automatic): as many batches as fit in IDX_LOADER_AUTO_BYTES,
 * between 2 and IDX_LOADER_AUTO_MAX. A deep ring lets the producer sleep
 * through several steps (it is woken at half a ring free, see idx_loader.c). */
#define IDX_LOADER_AUTO_MAX 8
#define IDX_LOADER_AUTO_BYTES ((size_t)32 << 20)
#define IDX_LOADER_MAX_PREFETCH 16

typedef struct idx_loader_config {
    const idx_dataset *dataset; /* borrowed: must outlive the loader and not change */
    uint32_t begin, end;        /* sample range [begin, end) of the dataset */
    uint32_t batch_size;        /* B > 0 */
    bool shuffle;               /* permute [begin, end) anew each epoch */
    uint64_t seed;              /* with the epoch number, determines the permutation */
    bool drop_last;             /* drop the shard remainder and the final partial batch */
    float mean, std;            /* x = (p/255 - mean) / std; defaults 0 and 1 */
    uint32_t rank, world_size;  /* this process's shard: rank in [0, world_size) */
    int prefetch;               /* batches prepared ahead, 1..IDX_LOADER_MAX_PREFETCH; 0 = automatic */
} idx_loader_config;

/*
 * Fills cfg with the defaults for the whole dataset: range [0, ds->n),
 * batch_size 1, no shuffle, seed 0, keep the last partial batch, mean 0,
 * std 1, rank 0 of 1, automatic prefetch. ds may be NULL (then end is 0).
 */
void idx_loader_config_defaults(idx_loader_config *cfg, const idx_dataset *ds);

/* One prepared batch; the loader owns the buffers. */
typedef struct idx_loader_slot {
    float *x;        /* (B, rows*cols), normalised; rows >= len are 0 */
    int32_t *y;      /* (B); entries >= len are -1 so accidental use is visible */
    int len;         /* valid rows, 1..B */
    uint64_t batch;  /* which batch of the epoch this is (consistency check) */
} idx_loader_slot;

typedef struct idx_loader {
    /* Fixed after init. */
    idx_loader_config cfg;
    uint32_t dim;            /* rows*cols */
    uint64_t n_range;        /* end - begin */
    uint64_t total;          /* padded (or truncated) size over all ranks */
    uint64_t num_samples;    /* samples per rank per epoch: total / world_size */
    uint64_t num_batches;    /* batches per rank per epoch */
    float lut[256];          /* pixel value -> normalised float */
    int nslots;              /* prefetch + 1: the consumer holds one while the rest fill */
    int wake_free;           /* free slots at which a sleeping producer is woken: half the ring */
    idx_loader_slot *slots;  /* (nslots) */
    uint32_t *perm;          /* (n_range) epoch permutation; touched by the producer only */

    /* Shared state, guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv_prod;  /* producer sleeps here when the ring is full or the epoch done */
    pthread_cond_t cv_cons;  /* consumer sleeps here when no batch is ready */
    pthread_t thread;
    bool sync_inited;        /* mu and the condition variables exist */
    bool thread_started;
    bool stop;
    bool started;            /* start_epoch has been called */
    uint64_t gen;            /* bumped by every start_epoch; stale producer work is dropped */
    uint64_t epoch;
    uint64_t start_batch;    /* where the producer starts for generation gen */
    uint64_t cons_next;      /* index of the next batch the consumer receives */
    int rd;                  /* next ready slot for the consumer */
    int ready;               /* slots filled and not yet taken */
    bool held;               /* consumer holds slot rd-1 (pointers returned by next) */
    bool prod_waiting;       /* the producer sleeps on cv_prod (set and read under mu) */
    bool prod_timed;         /* ... on a timed wait: it wakes itself */
    bool prod_finished;      /* ... with the epoch's last batch made: nothing to wake it for */
    double last_take_s;      /* CLOCK_MONOTONIC of the last next(); 0 after start_epoch */
    double take_interval_s;  /* average interval between next() calls; 0 = not known yet */
    uint64_t prod_wakes;     /* times next() woke the producer (under mu; tests read it) */
    uint64_t cons_waits;     /* times next() found no batch ready and waited (tests read it) */
} idx_loader;

/*
 * Validates cfg, allocates all buffers and starts the producer thread (idle
 * until idx_loader_start_epoch). Returns 0 or a negative IDX_E* code with a
 * message in err. On failure nothing needs freeing (idx_loader_free is still safe).
 */
int idx_loader_init(idx_loader *L, const idx_loader_config *cfg, char *err, size_t errlen);

/* Batches this rank gets per epoch. */
int idx_loader_num_batches(const idx_loader *L);

/* Samples this rank gets per epoch (padding repeats included). */
uint64_t idx_loader_num_samples(const idx_loader *L);

/*
 * Begins epoch `epoch` at batch `start_batch` (0 for a fresh epoch, the saved
 * next_batch for a resume; start_batch == num_batches gives an empty epoch).
 * Safe at any time, including mid-epoch: prefetched batches of the previous
 * epoch are discarded. Invalidates pointers returned by earlier next calls.
 * Returns 0, or IDX_EINVAL if start_batch > num_batches.
 */
int idx_loader_start_epoch(idx_loader *L, uint64_t epoch, uint64_t start_batch);

/*
 * Hands out the next batch: 1 with *x (batch_len, rows*cols), *y (batch_len),
 * valid until the next call to idx_loader_next / start_epoch / free; 0 at the
 * end of the epoch; IDX_ESTATE before the first start_epoch.
 */
int idx_loader_next(idx_loader *L, const float **x, const int32_t **y, int *batch_len);

/*
 * The epoch and the index of the next batch the consumer will receive (not
 * what has been prefetched). After next returned batch k, next_batch is k+1;
 * next_batch == num_batches means the epoch is finished (resume with epoch+1, 0).
 */
void idx_loader_position(const idx_loader *L, uint64_t *epoch, uint64_t *next_batch);

/* Static text for an IDX_E* status (next and start_epoch have no err buffer). */
const char *idx_loader_strerror(int status);

/* Stops and joins the producer, frees the buffers; safe on a zeroed or failed-init loader. */
void idx_loader_free(idx_loader *L);

#ifdef __cplusplus
}
#endif

#endif
