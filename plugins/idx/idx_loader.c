/*
 * The idx batch loader: a single producer thread fills a ring of nslots
 * preallocated batch buffers while the consumer (the training loop) takes
 * them in order. Every start_epoch bumps a generation number; the producer
 * copies (generation, epoch, start batch) under the mutex, works outside it,
 * and publishes a slot only if the generation is still current, so a restart
 * mid-epoch simply makes in-flight work vanish. Both sides sleep on condition
 * variables, never spin. Which samples form batch b of epoch e is computed
 * from (seed, e, b) alone, so the data never depends on how far ahead the
 * producer happened to be.
 *
 * The training thread should not pay for waking the producer: waking a thread
 * on another CPU costs the waker a futex system call and, on a virtual
 * machine, an inter-processor interrupt, measured at ~20-30 us of the
 * training thread's time per wake with the tiny benchmark model
 * (docs/benchmarks.md). So the producer refills in bursts, from half a ring
 * free to full, and between bursts sleeps on a timed wait sized from the
 * consumer's pace (the average interval between takes), waking itself when
 * about half the ring has been used. The consumer signals it only when it
 * would otherwise wait (no batch ready), or, before the pace is known (the
 * first batches of an epoch), at half a ring free. With half the ring still
 * ready when the producer refills, the consumer does not wait for it.
 */
#define _POSIX_C_SOURCE 200809L

#include "idx_loader.h"
#include "../common/data_common.h"

#include <kiln/rng.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------ */
/* Deterministic shuffling: our own PRNG so the order is the same on every libc. */

/* kiln/rng.h: splitmix64 and xoshiro256**, the same bits on every libc. */

/*
 * Seeds xoshiro256** from (seed, epoch): the first splitmix64 output of seed,
 * xor epoch, is a splitmix64 state whose next four outputs are the xoshiro
 * state (never all zero: splitmix64 outputs of distinct counters differ).
 */
static void idx_rng_seed(kiln_rng *r, uint64_t seed, uint64_t epoch) {
    uint64_t sm = seed;
    sm = kiln_splitmix64(&sm) ^ epoch;
    for (int i = 0; i < 4; i++) r->s[i] = kiln_splitmix64(&sm);
}

/* perm (n) := a uniformly random permutation of 0..n-1 for (seed, epoch), by Fisher–Yates. */
static void idx_epoch_perm(uint32_t *perm, uint64_t n, uint64_t seed, uint64_t epoch) {
    kiln_rng r;
    idx_rng_seed(&r, seed, epoch);
    dc_shuffle(perm, n, &r);
}

/* ------------------------------------------------------------------------ */
/* Batch assembly: pure function of (config, permutation of the epoch, batch index). */

static void idx_fill_batch(const idx_loader *L, idx_loader_slot *s, uint64_t b) {
    const idx_loader_config *c = &L->cfg;
    const uint32_t B = c->batch_size, D = L->dim;
    const uint64_t i0 = b * B;
    const uint64_t left = L->num_samples - i0;
    const uint32_t len = left < B ? (uint32_t)left : B;
    for (uint32_t j = 0; j < len; j++) {
        /*
         * DistributedSampler: rank r takes positions r, r+W, r+2W, ... of the
         * epoch list; positions past the range wrap to its start (padding).
         */
        uint64_t pos = (uint64_t)c->rank + (i0 + j) * c->world_size;
        uint64_t q = pos % L->n_range;
        uint32_t idx = c->begin + (L->perm ? L->perm[q] : (uint32_t)q);
        const uint8_t *src = c->dataset->pixels + (size_t)idx * D; /* (D) */
        float *dst = s->x + (size_t)j * D;                         /* (D) */
        for (uint32_t d = 0; d < D; d++) dst[d] = L->lut[src[d]];
        s->y[j] = c->dataset->labels[idx];
    }
    if (len < B) {
        memset(s->x + (size_t)len * D, 0, (size_t)(B - len) * D * sizeof(float));
        for (uint32_t j = len; j < B; j++) s->y[j] = -1;
    }
    s->len = (int)len;
    s->batch = b;
}

static void *idx_producer(void *arg) {
    idx_loader *L = arg;
    uint64_t my_gen = 0;           /* generation the local copies below belong to */
    uint64_t next = UINT64_MAX;    /* next batch to prepare; idle until the first start_epoch */
    uint64_t perm_epoch = 0;
    bool perm_valid = false;

    bool filling = false; /* refilling: keep going until the ring is full */
    pthread_mutex_lock(&L->mu);
    for (;;) {
        /* Sleep while there is nothing to do: same generation and (epoch done,
         * or the ring full, or, once it was full, less than half of it free). */
        for (;;) {
            if (L->stop || L->gen != my_gen) break;
            const int free_slots = L->nslots - L->ready - (int)L->held;
            const bool done = next >= L->num_batches;
            if (!done && free_slots >= 1 && (filling || free_slots >= L->wake_free)) break;
            filling = false;
            L->prod_waiting = true;
            L->prod_finished = done; /* only start_epoch has work for us then */
            if (done || L->take_interval_s <= 0.0) {
                L->prod_timed = false; /* the consumer wakes us (start_epoch, half a ring free) */
                pthread_cond_wait(&L->cv_prod, &L->mu);
            } else {
                /* Sleep about as long as the consumer takes to free half the
                 * ring (its pace so far), so it never has to wake us. */
                L->prod_timed = true;
                double nap = L->take_interval_s * (double)(L->wake_free - free_slots);
                nap = nap < 50e-6 ? 50e-6 : nap > 0.2 ? 0.2 : nap;
                struct timespec until;
                clock_gettime(CLOCK_MONOTONIC, &until);
                long ns = until.tv_nsec + (long)(nap * 1e9);
                until.tv_sec += ns / 1000000000L;
                until.tv_nsec = ns % 1000000000L;
                pthread_cond_timedwait(&L->cv_prod, &L->mu, &until);
            }
            L->prod_waiting = false;
        }
        filling = true;
        if (L->stop) break;
        if (L->gen != my_gen) {
            my_gen = L->gen;
            next = L->start_batch;
            uint64_t epoch = L->epoch;
            pthread_mutex_unlock(&L->mu);
            /* The permutation is the producer's alone: build it outside the lock. */
            if (L->perm && (!perm_valid || perm_epoch != epoch)) {
                idx_epoch_perm(L->perm, L->n_range, L->cfg.seed, epoch);
                perm_epoch = epoch;
                perm_valid = true;
            }
            pthread_mutex_lock(&L->mu);
            continue; /* re-check: another start_epoch may have come meanwhile */
        }
        /* Held slot rd-1, ready slots rd..rd+ready-1: the first free one follows them. */
        int w = (L->rd + L->ready) % L->nslots;
        pthread_mutex_unlock(&L->mu);

        idx_fill_batch(L, &L->slots[w], next);

        pthread_mutex_lock(&L->mu);
        if (L->gen == my_gen) { /* else a start_epoch came: drop this batch */
            L->ready++;
            next++;
            pthread_cond_signal(&L->cv_cons);
        }
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ */

void idx_loader_config_defaults(idx_loader_config *cfg, const idx_dataset *ds) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->dataset = ds;
    cfg->begin = 0;
    cfg->end = ds ? ds->n : 0;
    cfg->batch_size = 1;
    cfg->shuffle = false;
    cfg->seed = 0;
    cfg->drop_last = false;
    cfg->mean = 0.0f;
    cfg->std = 1.0f;
    cfg->rank = 0;
    cfg->world_size = 1;
    cfg->prefetch = 0;
}

static int idx_check_config(const idx_loader_config *c, char *err, size_t errlen) {
    const idx_dataset *ds = c->dataset;
    if (!ds || !ds->pixels || !ds->labels || ds->n == 0 || ds->rows == 0 || ds->cols == 0) {
        dc_errf(err, errlen, "idx loader: expected an opened, non-empty dataset, found %s",
                 ds ? "an empty or freed one" : "NULL");
        return IDX_EINVAL;
    }
    if (c->begin >= c->end || c->end > ds->n) {
        dc_errf(err, errlen, "idx loader: expected a range 0 <= begin < end <= %u, found [%u, %u)", ds->n,
                 c->begin, c->end);
        return IDX_EINVAL;
    }
    if (c->batch_size == 0) {
        dc_errf(err, errlen, "idx loader: expected batch_size > 0, found 0");
        return IDX_EINVAL;
    }
    if (c->world_size == 0 || c->rank >= c->world_size) {
        dc_errf(err, errlen, "idx loader: expected 0 <= rank < world_size, found rank %u, world_size %u",
                 c->rank, c->world_size);
        return IDX_EINVAL;
    }
    if (!isfinite(c->mean) || !isfinite(c->std) || !(c->std > 0.0f)) {
        dc_errf(err, errlen, "idx loader: expected a finite mean and std > 0, found mean %g, std %g",
                 (double)c->mean, (double)c->std);
        return IDX_EINVAL;
    }
    if (c->prefetch < 0 || c->prefetch > IDX_LOADER_MAX_PREFETCH) {
        dc_errf(err, errlen, "idx loader: expected prefetch in 0..%d (0 = automatic), found %d",
                 IDX_LOADER_MAX_PREFETCH, c->prefetch);
        return IDX_EINVAL;
    }
    return IDX_OK;
}

int idx_loader_init(idx_loader *L, const idx_loader_config *cfg, char *err, size_t errlen) {
    if (!L || !cfg) {
        dc_errf(err, errlen, "idx loader: NULL loader or config");
        return IDX_EINVAL;
    }
    memset(L, 0, sizeof *L);
    int rc = idx_check_config(cfg, err, errlen);
    if (rc) return rc;
    L->cfg = *cfg;
    const idx_loader_config *c = &L->cfg;
    L->dim = c->dataset->rows * c->dataset->cols; /* <= 2^20: checked by the reader */
    L->n_range = (uint64_t)c->end - c->begin;

    /* DistributedSampler sizes: truncate to a multiple of W, or pad up to one. */
    const uint64_t W = c->world_size, B = c->batch_size;
    if (c->drop_last) {
        L->num_samples = L->n_range / W;
        if (L->num_samples == 0) {
            dc_errf(err, errlen, "idx loader: range [%u, %u) has %llu samples, fewer than world_size %u "
                     "(drop_last leaves this rank nothing)", c->begin, c->end,
                     (unsigned long long)L->n_range, c->world_size);
            return IDX_EINVAL;
        }
    } else {
        L->num_samples = (L->n_range + W - 1) / W;
    }
    L->total = L->num_samples * W;
    L->num_batches = c->drop_last ? L->num_samples / B : (L->num_samples + B - 1) / B;
    if (L->num_batches == 0) {
        dc_errf(err, errlen, "idx loader: rank %u gets %llu samples per epoch, fewer than batch_size %u "
                 "(drop_last leaves no batch)", c->rank, (unsigned long long)L->num_samples, c->batch_size);
        return IDX_EINVAL;
    }
    if (L->num_batches > INT_MAX) {
        dc_errf(err, errlen, "idx loader: %llu batches per epoch, more than %d",
                 (unsigned long long)L->num_batches, INT_MAX);
        return IDX_EINVAL;
    }

    for (int p = 0; p < 256; p++) L->lut[p] = ((float)p / 255.0f - c->mean) / c->std;

    /* B <= 2^32 and dim <= 2^20: the float count fits in 52 bits; check bytes against size_t. */
    const uint64_t xfloats = B * L->dim;
    if (xfloats > SIZE_MAX / sizeof(float) || B > SIZE_MAX / sizeof(int32_t)) {
        dc_errf(err, errlen, "idx loader: batch of %u x %u floats does not fit in memory", c->batch_size, L->dim);
        return IDX_ENOMEM;
    }
    int prefetch = c->prefetch;
    if (prefetch <= 0) {
        size_t fit = IDX_LOADER_AUTO_BYTES / ((size_t)xfloats * sizeof(float) + 1);
        prefetch = fit < 2 ? 2 : fit > IDX_LOADER_AUTO_MAX ? IDX_LOADER_AUTO_MAX : (int)fit;
    }
    L->nslots = prefetch + 1;
    L->wake_free = (L->nslots + 1) / 2;
    L->slots = calloc((size_t)L->nslots, sizeof *L->slots);
    if (!L->slots) goto nomem;
    for (int i = 0; i < L->nslots; i++) {
        void *x = NULL;
        /* 64-byte alignment so vectorised kernels can take x as it is. */
        if (posix_memalign(&x, 64, (size_t)xfloats * sizeof(float)) != 0) goto nomem;
        L->slots[i].x = x;
        L->slots[i].y = malloc((size_t)B * sizeof(int32_t));
        if (!L->slots[i].y) goto nomem;
    }
    if (c->shuffle) {
        L->perm = malloc((size_t)L->n_range * sizeof(uint32_t));
        if (!L->perm) goto nomem;
    }

    if (pthread_mutex_init(&L->mu, NULL) != 0) goto nosync;
    /* the producer's timed sleeps count on the monotonic clock */
    pthread_condattr_t ca;
    int cerr = pthread_condattr_init(&ca);
    if (!cerr) {
        cerr = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        if (!cerr) cerr = pthread_cond_init(&L->cv_prod, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (cerr != 0) {
        pthread_mutex_destroy(&L->mu);
        goto nosync;
    }
    if (pthread_cond_init(&L->cv_cons, NULL) != 0) {
        pthread_cond_destroy(&L->cv_prod);
        pthread_mutex_destroy(&L->mu);
        goto nosync;
    }
    L->sync_inited = true;
    rc = pthread_create(&L->thread, NULL, idx_producer, L);
    if (rc != 0) {
        dc_errf(err, errlen, "idx loader: cannot start the prefetch thread: %s", strerror(rc));
        idx_loader_free(L);
        return IDX_ENOMEM;
    }
    L->thread_started = true;
    return IDX_OK;

nomem:
    dc_errf(err, errlen, "idx loader: out of memory for %d batch buffers of %u x %u floats", L->nslots,
             c->batch_size, L->dim);
    idx_loader_free(L);
    return IDX_ENOMEM;
nosync:
    dc_errf(err, errlen, "idx loader: cannot create the mutex / condition variables");
    idx_loader_free(L);
    return IDX_ENOMEM;
}

int idx_loader_num_batches(const idx_loader *L) { return L ? (int)L->num_batches : 0; }

uint64_t idx_loader_num_samples(const idx_loader *L) { return L ? L->num_samples : 0; }

int idx_loader_start_epoch(idx_loader *L, uint64_t epoch, uint64_t start_batch) {
    if (!L || !L->thread_started) return IDX_ESTATE;
    if (start_batch > L->num_batches) return IDX_EINVAL;
    pthread_mutex_lock(&L->mu);
    L->gen++;
    L->epoch = epoch;
    L->start_batch = start_batch;
    L->cons_next = start_batch;
    /* Forget everything prefetched (and the held slot): the producer refills from slot 0. */
    L->rd = 0;
    L->ready = 0;
    L->held = false;
    L->started = true;
    L->last_take_s = 0.0;
    L->take_interval_s = 0.0;
    pthread_cond_signal(&L->cv_prod);
    pthread_mutex_unlock(&L->mu);
    return IDX_OK;
}

int idx_loader_next(idx_loader *L, const float **x, const int32_t **y, int *batch_len) {
    if (!L || !L->thread_started) return IDX_ESTATE;
    pthread_mutex_lock(&L->mu);
    if (!L->started) {
        pthread_mutex_unlock(&L->mu);
        return IDX_ESTATE;
    }
    if (L->held) L->held = false; /* the caller is done with the previous batch: its slot is free again */
    if (L->cons_next >= L->num_batches) {
        pthread_mutex_unlock(&L->mu);
        return 0;
    }
    /* The consumer's pace, for the producer's timed sleeps: an average of
     * the intervals between takes (restarted by start_epoch, so a pause for
     * validation does not count). */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (L->last_take_s > 0.0) {
        const double dt = t - L->last_take_s;
        L->take_interval_s = L->take_interval_s > 0.0 ? 0.75 * L->take_interval_s + 0.25 * dt : dt;
    }
    L->last_take_s = t;
    /* Wake a producer that sleeps until woken at half a ring free (see the
     * top of the file); one on a timed sleep wakes itself. Always before
     * waiting for it: then every slot is free. */
    if (L->prod_waiting && !L->prod_finished &&
        (L->ready == 0 || (!L->prod_timed && L->nslots - L->ready >= L->wake_free))) {
        L->prod_wakes++;
        pthread_cond_signal(&L->cv_prod);
    }
    if (L->ready == 0) L->cons_waits++;
    while (L->ready == 0) pthread_cond_wait(&L->cv_cons, &L->mu);
    idx_loader_slot *s = &L->slots[L->rd];
    L->rd = (L->rd + 1) % L->nslots;
    L->ready--;
    L->held = true;
    if (s->batch != L->cons_next) { /* cannot happen unless the ring logic is broken */
        pthread_mutex_unlock(&L->mu);
        return IDX_ESTATE;
    }
    L->cons_next++;
    pthread_mutex_unlock(&L->mu);
    if (x) *x = s->x;
    if (y) *y = s->y;
    if (batch_len) *batch_len = s->len;
    return 1;
}

void idx_loader_position(const idx_loader *L, uint64_t *epoch, uint64_t *next_batch) {
    uint64_t e = 0, b = 0;
    if (L && L->sync_inited) {
        /* The mutex is the loader's mutable state even through a const view. */
        pthread_mutex_t *mu = (pthread_mutex_t *)&L->mu;
        pthread_mutex_lock(mu);
        e = L->epoch;
        b = L->cons_next;
        pthread_mutex_unlock(mu);
    }
    if (epoch) *epoch = e;
    if (next_batch) *next_batch = b;
}

const char *idx_loader_strerror(int status) {
    switch (status) {
    case IDX_OK: return "ok";
    case IDX_EIO: return "I/O error";
    case IDX_EFORMAT: return "malformed IDX data";
    case IDX_ENOMEM: return "out of memory";
    case IDX_EINVAL: return "invalid argument (e.g. start_batch beyond the epoch)";
    case IDX_ESTATE: return "loader not ready (init failed, or next before start_epoch)";
    default: return "unknown idx error";
    }
}

void idx_loader_free(idx_loader *L) {
    if (!L) return;
    if (L->sync_inited) {
        pthread_mutex_lock(&L->mu);
        L->stop = true;
        pthread_cond_broadcast(&L->cv_prod);
        pthread_mutex_unlock(&L->mu);
        if (L->thread_started) pthread_join(L->thread, NULL);
        pthread_cond_destroy(&L->cv_cons);
        pthread_cond_destroy(&L->cv_prod);
        pthread_mutex_destroy(&L->mu);
    }
    if (L->slots) {
        for (int i = 0; i < L->nslots; i++) {
            free(L->slots[i].x);
            free(L->slots[i].y);
        }
        free(L->slots);
    }
    free(L->perm);
    memset(L, 0, sizeof *L);
}
