/*
 * The order of windows and the batches of one split of the "tokens" plugin:
 * a seeded per-epoch permutation of the view's windows (or their file order),
 * DistributedSampler-style sharding (rank r takes positions r, r+W, r+2W, ...
 * of the epoch's order), and the batch buffers, allocated once, that the
 * windows of each batch are read into. A batch is a pure function of (view,
 * batch size, rank, world size, seed, epoch, batch index), so start_epoch at
 * any batch gives exactly what an uninterrupted epoch gives from there.
 * Single-threaded: no prefetching (reading a window is a copy of T+1 tokens).
 */
#ifndef KILN_PLUGINS_TOK_SAMPLER_H
#define KILN_PLUGINS_TOK_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok_data.h"

typedef struct tok_sampler_config {
    const tok_view *view;  /* borrowed: outlives the sampler, unchanged */
    uint32_t batch_size;   /* B > 0 */
    uint32_t rank, world_size;
    bool shuffle;          /* a new permutation every epoch, from (seed, epoch) */
    uint64_t seed;
    /* true (train): each rank takes floor(nwin / W) windows and only full
     * batches, so ranks are disjoint; false (val/test): each rank takes
     * ceil(nwin / W) windows, the order wrapping to its start for the padding
     * (as DistributedSampler pads), and the last batch may be short. */
    bool drop_last;
} tok_sampler_config;

typedef struct tok_sampler {
    tok_sampler_config cfg;
    uint64_t per_rank;      /* windows this rank draws per epoch, padding included */
    uint64_t num_batches;   /* per rank per epoch; the same on every rank */
    uint32_t *perm;         /* (view->nwin) the epoch's order when shuffling, else NULL */
    bool perm_valid;
    uint64_t perm_epoch, perm_seed;
    int32_t *inputs;        /* (B, T) tokens 0..T-1 of each window */
    int32_t *targets;       /* (B, T) tokens 1..T of each window; -1 in rows past a short batch */
    bool started;
    uint64_t epoch, next;   /* the position: next is the batch the next call returns */
} tok_sampler;

/* Checks cfg, allocates the buffers (and the permutation). err gets one line on failure; free is always safe. */
int tok_sampler_init(tok_sampler *S, const tok_sampler_config *cfg, char *err, size_t errlen);

/* Begins `epoch` at batch start_batch (<= num_batches). TOK_EINVAL beyond. */
int tok_sampler_start_epoch(tok_sampler *S, uint64_t epoch, uint64_t start_batch);

/* Fills inputs/targets with the next batch: 1 and *len its rows, 0 at the end of the epoch, TOK_EINVAL before start_epoch. */
int tok_sampler_next(tok_sampler *S, uint32_t *len);

/* The window at row j of batch b of the current epoch's order (for tests and logs); needs start_epoch. */
uint64_t tok_sampler_window_of(const tok_sampler *S, uint64_t b, uint32_t j);

/* Changes the seed (a restored checkpoint's); the next start_epoch draws with it. */
void tok_sampler_set_seed(tok_sampler *S, uint64_t seed);

void tok_sampler_free(tok_sampler *S);

#endif
