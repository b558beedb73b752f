/*
 * Window order, sharding and batch assembly for the "tokens" plugin (see
 * tok_sampler.h). The shuffle uses kiln/rng.h (xoshiro256**), not rand(), so
 * the order is the same on every libc and machine.
 */
#define _POSIX_C_SOURCE 200809L

#include "tok_sampler.h"
#include "../common/data_common.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/rng.h>

/* The largest B*T a batch may have: its int32 buffers stay far below 2 GiB. */
#define TOK_MAX_BATCH_TOKENS ((uint64_t)1 << 28)


/* perm (n) := the permutation of 0..n-1 for (seed, epoch): Fisher-Yates from a
 * generator whose seed mixes the epoch into one splitmix64 output of seed, so
 * neighbouring epochs (and seeds) give unrelated orders. */
static void tok_make_perm(uint32_t *perm, uint64_t n, uint64_t seed, uint64_t epoch) {
    uint64_t sm = seed;
    kiln_rng r;
    kiln_rng_seed(&r, kiln_splitmix64(&sm) ^ (epoch * 0xD1B54A32D192ED03ull + 1));
    dc_shuffle(perm, n, &r);
}

int tok_sampler_init(tok_sampler *S, const tok_sampler_config *cfg, char *err, size_t errlen) {
    memset(S, 0, sizeof *S);
    const tok_view *v = cfg->view;
    if (!v || cfg->batch_size == 0 || cfg->world_size == 0 || cfg->rank >= cfg->world_size) {
        dc_errf(err, errlen, "internal: bad sampler configuration");
        return TOK_EINVAL;
    }
    const uint64_t B = cfg->batch_size, T = v->T, W = cfg->world_size, n = v->nwin;
    if (B * T > TOK_MAX_BATCH_TOKENS) {
        dc_errf(err, errlen, "batch of %" PRIu64 " x %" PRIu64 " tokens is larger than the limit of %" PRIu64, B, T,
                 TOK_MAX_BATCH_TOKENS);
        return TOK_EINVAL;
    }
    if (n > UINT32_MAX) {
        dc_errf(err, errlen, "%" PRIu64 " windows exceed the limit of %" PRIu32 " (raise block_size)", n,
                 UINT32_MAX);
        return TOK_EINVAL;
    }
    S->cfg = *cfg;
    if (cfg->drop_last) {
        S->per_rank = n / W;
        S->num_batches = S->per_rank / B;
        if (S->num_batches == 0) {
            dc_errf(err, errlen,
                     "%" PRIu64 " windows of block_size + 1 = %" PRIu64 " tokens give no full batch of batch_size %" PRIu64
                     " on each of %" PRIu64 " rank(s) (at least %" PRIu64 " windows are needed)",
                     n, T + 1, B, W, B * W);
            return TOK_EINVAL;
        }
    } else {
        S->per_rank = n ? (n + W - 1) / W : 0;
        S->num_batches = (S->per_rank + B - 1) / B;
    }
    S->inputs = malloc((size_t)(B * T) * sizeof *S->inputs);
    S->targets = malloc((size_t)(B * T) * sizeof *S->targets);
    if (cfg->shuffle && n > 0) S->perm = malloc((size_t)n * sizeof *S->perm);
    if (!S->inputs || !S->targets || (cfg->shuffle && n > 0 && !S->perm)) {
        tok_sampler_free(S);
        dc_errf(err, errlen, "out of memory for the batch buffers (%" PRIu64 " x %" PRIu64 " tokens) or the order of %" PRIu64
                 " windows", B, T, n);
        return TOK_ENOMEM;
    }
    return TOK_OK;
}

int tok_sampler_start_epoch(tok_sampler *S, uint64_t epoch, uint64_t start_batch) {
    if (start_batch > S->num_batches) return TOK_EINVAL;
    if (S->perm && (!S->perm_valid || S->perm_epoch != epoch || S->perm_seed != S->cfg.seed)) {
        tok_make_perm(S->perm, S->cfg.view->nwin, S->cfg.seed, epoch);
        S->perm_valid = true;
        S->perm_epoch = epoch;
        S->perm_seed = S->cfg.seed;
    }
    S->started = true;
    S->epoch = epoch;
    S->next = start_batch;
    return TOK_OK;
}

uint64_t tok_sampler_window_of(const tok_sampler *S, uint64_t b, uint32_t j) {
    /* DistributedSampler: this rank's k-th sample is position rank + k*W of the
     * epoch's order; positions past the end wrap around (padding, val only). */
    uint64_t k = b * S->cfg.batch_size + j;
    uint64_t q = (S->cfg.rank + k * S->cfg.world_size) % S->cfg.view->nwin;
    return S->perm ? S->perm[q] : q;
}

int tok_sampler_next(tok_sampler *S, uint32_t *len) {
    if (!S->started) return TOK_EINVAL;
    if (S->next >= S->num_batches) return 0;
    const uint32_t B = S->cfg.batch_size, T = S->cfg.view->T;
    const uint64_t first = S->next * B;
    const uint64_t left = S->per_rank - first;
    const uint32_t n = left < B ? (uint32_t)left : B;
    for (uint32_t j = 0; j < n; j++)
        tok_view_window(S->cfg.view, tok_sampler_window_of(S, S->next, j), S->inputs + (size_t)j * T,
                        S->targets + (size_t)j * T);
    if (n < B) { /* rows past a short batch: visible if a consumer reads them by mistake */
        memset(S->inputs + (size_t)n * T, 0, (size_t)(B - n) * T * sizeof *S->inputs);
        for (size_t i = (size_t)n * T; i < (size_t)B * T; i++) S->targets[i] = -1;
    }
    S->next++;
    *len = n;
    return 1;
}

void tok_sampler_set_seed(tok_sampler *S, uint64_t seed) { S->cfg.seed = seed; }

void tok_sampler_free(tok_sampler *S) {
    if (!S) return;
    free(S->perm);
    free(S->inputs);
    free(S->targets);
    memset(S, 0, sizeof *S);
}
