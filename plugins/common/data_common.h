/*
 * data_common.h — what the two data plugins ("idx": image classification
 * from IDX files, "tokens": language-model windows from token shards)
 * share, written once: both play a LightningDataModule with three splits,
 * read their integer keys with a range, seed the train shuffle from the
 * host's "data.shuffle" stream, shuffle by Fisher-Yates from an unbiased
 * draw, save the train position in a little-endian blob with a magic and a
 * flags word, and resume from it at the next train start_epoch. The
 * messages keep each plugin's name in front ("idx: ...", "tokens: ...").
 *
 * What stays in each plugin: how the data is read, how a batch is built,
 * the blob's fields past the position, and how the shuffle is seeded from
 * (seed, epoch) (each plugin's orders are part of its saved runs).
 *
 * Header only, every function static inline, so the readers, samplers and
 * test and fuzz targets built from single files of a plugin need no extra
 * source. Internal to the plugins; never installed. Names start with dc_
 * (data common).
 */
#ifndef KILN_PLUGINS_COMMON_DATA_COMMON_H
#define KILN_PLUGINS_COMMON_DATA_COMMON_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <kiln/kiln.h>
#include <kiln/rng.h>

/* ------------------------------------------------- messages, bytes, order */

/* The readers' and samplers' messages go into a caller's buffer (err may be
 * NULL or errlen 0: nothing is written). */
__attribute__((format(printf, 3, 4))) static inline void dc_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Little-endian fields of files and state blobs, the same on every host. */
static inline uint32_t dc_get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void dc_put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t dc_get_le64(const uint8_t *p) {
    return (uint64_t)dc_get_le32(p) | (uint64_t)dc_get_le32(p + 4) << 32;
}

static inline void dc_put_le64(uint8_t *p, uint64_t v) {
    dc_put_le32(p, (uint32_t)v);
    dc_put_le32(p + 4, (uint32_t)(v >> 32));
}

/* Uniform in [0, n), n >= 1, without modulo bias: the 2^64 mod n lowest
 * values are drawn again. */
static inline uint64_t dc_rng_below(kiln_rng *r, uint64_t n) {
    const uint64_t reject = (0 - n) % n;
    for (;;) {
        uint64_t v = kiln_rng_next(r);
        if (v >= reject) return v % n;
    }
}

/* perm (n) := a uniformly random permutation of 0..n-1 drawn from r (seeded
 * by the caller), by Fisher-Yates from the top. */
static inline void dc_shuffle(uint32_t *perm, uint64_t n, kiln_rng *r) {
    for (uint64_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = dc_rng_below(r, i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

/* ------------------------------------------------------------ the plugins */

/* Where a data plugin reports: the instance's host services and its name. */
typedef struct dc_sink {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    const char *name;
} dc_sink;

#define DC_ERR(s, code, fmt, ...) kiln_errorf((s).svc, (s).hctx, (code), "%s: " fmt, (s).name, __VA_ARGS__)

/* Reads an integer key and checks lo <= v <= hi; the message names the key
 * and why the range is what it is. */
static inline int32_t dc_int_key(dc_sink s, const kiln_kv *config, const char *key, int64_t def, int64_t lo,
                                 int64_t hi, const char *why, int64_t *out) {
    int64_t v = kiln_kv_int(config, key, def);
    if (v < lo || v > hi)
        return DC_ERR(s, KILN_E_CONFIG, "%s must be in %" PRId64 "..%" PRId64 " (%s), got %" PRId64, key, lo, hi, why,
                      v);
    *out = v;
    return KILN_OK;
}

/* The train shuffle's seed: the host's "data.shuffle" stream, which is
 * rank-independent, so every rank draws the same permutation and the
 * DistributedSampler-style shards are disjoint (0 before ABI 1.1). */
static inline uint64_t dc_host_seed(dc_sink s) {
    return (s.svc->abi_minor >= 1 && s.svc->seed) ? s.svc->seed(s.hctx, "data.shuffle") : 0;
}

enum { DC_NSPLITS = 3 };

/* "train", "val", "test" for KILN_SPLIT_TRAIN, _VAL, _TEST. */
static inline const char *dc_split_name(int split) {
    return split == KILN_SPLIT_TRAIN ? "train" : split == KILN_SPLIT_VAL ? "val" : "test";
}

/* An op's split id must be one of the three, and that split set up. */
static inline int32_t dc_check_split(dc_sink s, int32_t split, bool ready, const char *op) {
    if (split < 0 || split >= DC_NSPLITS)
        return DC_ERR(s, KILN_E_INVALID_ARG, "%s expects split TRAIN (0), VAL (1) or TEST (2), got %d", op, split);
    if (!ready) {
        static const char *const stage_for[DC_NSPLITS] = {"FIT", "FIT or VALIDATE", "TEST"};
        return DC_ERR(s, KILN_E_STATE, "%s(%s): that split was not set up; call setup(%s) first", op,
                      dc_split_name(split), stage_for[split]);
    }
    return KILN_OK;
}

/* A batch of two tensor views: t[i] of `dtype`, (d0) when d1 is 0, else
 * (d0, d1). The consumer only reads them (the cast drops const). */
static inline void dc_view(kiln_tensor *t, const void *data, uint32_t dtype, int64_t d0, int64_t d1) {
    t->data = (void *)data;
    t->dtype = dtype;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1 ? d1 : 1;
    t->shape[2] = t->shape[3] = 1;
}

static inline int32_t dc_batch(kiln_batch *out, kiln_tensor *t, int64_t len) {
    out->struct_size = sizeof *out;
    out->ntensors = 2;
    out->tensors = t;
    out->size = len;
    return 1;
}

/* ------------------------------------------------------- the train position */

/* flags: the train fields were known at save time */
#define DC_STATE_HAS_TRAIN 1u

/* A position restored by set_state, applied by the next start_epoch(TRAIN,
 * epoch, start_batch < 0) and consumed by any train start_epoch. */
typedef struct dc_resume {
    bool restored;
    uint32_t flags; /* DC_STATE_HAS_TRAIN or 0 */
    uint64_t epoch, next, nb, seed;
} dc_resume;

/*
 * start_epoch's first batch: start_batch when >= 0. start_batch < 0 means
 * "resume": for TRAIN, the restored position when its epoch equals `epoch`
 * (*resumed = true; its batches per epoch must be nb, else KILN_E_STATE with
 * nb_hint after the counts), else 0; for VAL/TEST, 0. The batch must lie in
 * the epoch of nb batches. Every TRAIN call consumes the restored position.
 */
static inline int32_t dc_first_batch(dc_sink s, dc_resume *r, int32_t split, uint64_t epoch, int64_t start_batch,
                                     uint64_t nb, const char *nb_hint, uint64_t *first, bool *resumed) {
    *first = start_batch < 0 ? 0 : (uint64_t)start_batch;
    *resumed = false;
    if (split == KILN_SPLIT_TRAIN && start_batch < 0 && r->restored && r->epoch == epoch) {
        if ((r->flags & DC_STATE_HAS_TRAIN) && r->nb != nb)
            return DC_ERR(s, KILN_E_STATE,
                          "the restored train position was saved with %" PRIu64
                          " batches per epoch, this run has %" PRIu64 "%s",
                          r->nb, nb, nb_hint);
        *first = r->next; /* <= r->nb == nb when HAS_TRAIN, checked by set_state and above */
        *resumed = true;
    }
    if (*first > nb)
        return DC_ERR(s, KILN_E_INVALID_ARG,
                      "start_epoch(%s) at batch %" PRIu64 ", but an epoch has %" PRIu64 " batches",
                      dc_split_name(split), *first, nb);
    if (split == KILN_SPLIT_TRAIN) r->restored = false;
    return KILN_OK;
}

/* The first 40 bytes of a state blob, the same in both plugins: u32
 * magic, u32 flags, u64 epoch, u64 next batch, u64 batches per epoch, u64
 * seed (little-endian). dc_get_position reads all but the magic (checked by
 * dc_state_header); `restored` is left false. */
static inline void dc_put_position(uint8_t *p, uint32_t magic, const dc_resume *pos) {
    dc_put_le32(p, magic);
    dc_put_le32(p + 4, pos->flags);
    dc_put_le64(p + 8, pos->epoch);
    dc_put_le64(p + 16, pos->next);
    dc_put_le64(p + 24, pos->nb);
    dc_put_le64(p + 32, pos->seed);
}

static inline dc_resume dc_get_position(const uint8_t *p) {
    dc_resume pos = {0};
    pos.flags = dc_get_le32(p + 4);
    pos.epoch = dc_get_le64(p + 8);
    pos.next = dc_get_le64(p + 16);
    pos.nb = dc_get_le64(p + 24);
    pos.seed = dc_get_le64(p + 32);
    return pos;
}

/* get_state's output pointers, and a blob of `size` bytes from the host
 * (NULL after reporting). */
static inline uint8_t *dc_state_blob(dc_sink s, uint32_t *state_version, void **data, size_t *size, size_t bytes,
                                     int32_t *rc) {
    if (!state_version || !data || !size) {
        *rc = DC_ERR(s, KILN_E_INVALID_ARG, "%s", "get_state needs output pointers");
        return NULL;
    }
    uint8_t *p = s.svc->alloc(s.hctx, bytes, 0);
    *rc = p ? KILN_OK : DC_ERR(s, KILN_E_NOMEM, "%s", "out of memory for the state blob");
    return p;
}

/* set_state's first checks of a version-1 blob of want bytes: the version,
 * the size, the magic and the flags (DC_STATE_HAS_TRAIN at most); *flags
 * read. `a_blob` names the blob kind in the message ("an idx", ...). */
static inline int32_t dc_state_header(dc_sink s, uint32_t state_version, const void *data, size_t size, size_t want,
                                      uint32_t want_magic, const char *a_blob, uint32_t *flags) {
    if (state_version != 1u)
        return DC_ERR(s, KILN_E_STATE, "state version %u is not readable; this plugin reads version %u", state_version,
                      1u);
    if (!data || size != want)
        return DC_ERR(s, KILN_E_STATE, "state version 1 is %u bytes, got %zu", (unsigned)want, data ? size : (size_t)0);
    const uint32_t magic = dc_get_le32(data);
    *flags = dc_get_le32((const uint8_t *)data + 4);
    if (magic != want_magic || (*flags & ~DC_STATE_HAS_TRAIN))
        return DC_ERR(s, KILN_E_STATE,
                      "expected %s state blob (magic 0x%08X, flags <= 1), found magic 0x%08X, flags %u", a_blob,
                      want_magic, magic, *flags);
    return KILN_OK;
}

#endif /* KILN_PLUGINS_COMMON_DATA_COMMON_H */
