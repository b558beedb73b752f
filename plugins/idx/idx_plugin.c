/*
 * The "idx" data plugin (KILN_KIND_DATA): image classification data from IDX
 * files (MNIST / Fashion-MNIST and anything in the same container), by
 * default Debian's dataset-fashion-mnist package. It plays the role of a
 * LightningDataModule: setup(stage) reads and validates the files for that
 * stage (FIT: the training file, split into train and a held-out validation
 * tail; VALIDATE: that validation tail; TEST: the test files), and each split
 * gets its own idx_loader (shuffled and sharded like DistributedSampler for
 * train, unshuffled but sharded for val/test) whose producer thread prepares
 * batches ahead. Batches are normalised (p/255 - mean) / std inputs (B, D) F32
 * and labels (B) I32. The train position (epoch, next batch) is the plugin's
 * state, so a run resumes mid-epoch on exactly the samples it would have seen.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

#include "idx_loader.h"
#include "idx_reader.h"

#define IDXP_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/* State blob, version 1: 40 bytes, little-endian, see idxp_get_state. */
#define IDXP_STATE_VERSION 1u
#define IDXP_STATE_MAGIC 0x5844494Bu /* "KIDX" read as a little-endian u32 */
#define IDXP_STATE_SIZE 40u
#define IDXP_STATE_HAS_TRAIN 1u      /* flags: num_batches and seed were known at save time */

enum { IDXP_NSPLITS = 3 };
static const char *const idxp_split_names[IDXP_NSPLITS] = {"train", "val", "test"};

/* One split's loader and the view of its current batch. */
typedef struct idxp_split {
    bool ready;             /* set up (possibly empty): num_batches/start_epoch/next are valid */
    bool has_loader;        /* false for an empty validation split (val_split = 0) */
    idx_loader loader;      /* never moved: its producer thread holds a pointer to it */
    kiln_tensor tensors[2]; /* [0] inputs (B, D) F32, [1] targets (B) I32: the last batch handed out */
} idxp_split;

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    /* Resolved paths (relative names joined to `dir`); malloc'd. */
    char *train_images, *train_labels, *test_images, *test_labels;
    int num_classes;
    uint32_t batch_size;      /* train */
    uint32_t eval_batch_size; /* val and test: val_batch_size, or batch_size when that is 0 */
    uint32_t val_split;       /* images held out at the end of the training file */
    bool shuffle, drop_last;
    float mean, std;
    int prefetch;
    uint64_t seed;            /* of the train shuffle; read at setup(FIT) */
    /* Datasets are read once, on the first setup that needs them, and kept
     * until destroy: loaders borrow them and FIT/VALIDATE share one. */
    idx_dataset train_ds, test_ds;
    bool train_loaded, test_loaded;
    idxp_split split[IDXP_NSPLITS];
    /* A position restored by set_state, applied by the next
     * start_epoch(TRAIN, epoch, start_batch < 0); any train start_epoch clears it. */
    bool restored;
    uint32_t restored_flags;
    uint64_t restored_epoch, restored_next, restored_nb, restored_seed;
};

/* ------------------------------------------------------------------------ */
/* Helpers */

/* Map a reader/loader status to a kiln status. Out-of-range labels are bad data, not a bad argument. */
static int32_t idxp_status(int rc, bool from_reader) {
    switch (rc) {
    case IDX_OK: return KILN_OK;
    case IDX_EIO: return KILN_E_IO;
    case IDX_EFORMAT: return KILN_E_DATA;
    case IDX_ENOMEM: return KILN_E_NOMEM;
    case IDX_EINVAL: return from_reader ? KILN_E_DATA : KILN_E_CONFIG;
    case IDX_ESTATE: return KILN_E_STATE;
    default: return KILN_E_INTERNAL;
    }
}

/* `name` as is when absolute or when dir is empty, else dir/name. NULL when out of memory. */
static char *idxp_resolve(const char *dir, const char *name) {
    if (name[0] == '/' || dir[0] == '\0') return strdup(name);
    size_t ld = strlen(dir), ln = strlen(name);
    bool slash = dir[ld - 1] == '/';
    char *p = malloc(ld + !slash + ln + 1);
    if (!p) return NULL;
    memcpy(p, dir, ld);
    if (!slash) p[ld++] = '/';
    memcpy(p + ld, name, ln + 1);
    return p;
}

static void idxp_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void idxp_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t idxp_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t idxp_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void idxp_free_split(idxp_split *s) {
    idx_loader_free(&s->loader); /* joins the producer; safe on a zeroed loader */
    memset(s, 0, sizeof *s);
}

static void idxp_free(kiln_instance *self) {
    if (!self) return;
    for (int i = 0; i < IDXP_NSPLITS; i++) idxp_free_split(&self->split[i]);
    idx_dataset_free(&self->train_ds);
    idx_dataset_free(&self->test_ds);
    free(self->train_images);
    free(self->train_labels);
    free(self->test_images);
    free(self->test_labels);
    free(self);
}

/* ------------------------------------------------------------------------ */
/* create / destroy */

/* Reads an integer key and checks lo <= v <= hi; the message names the key. */
static int32_t idxp_int_key(const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                            const char *key, int64_t def, int64_t lo, int64_t hi, const char *why, int64_t *out) {
    int64_t v = kiln_kv_int(config, key, def);
    if (v < lo || v > hi)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "idx: %s must be in %" PRId64 "..%" PRId64 " (%s), got %" PRId64,
                           key, lo, hi, why, v);
    *out = v;
    return KILN_OK;
}

static int32_t idxp_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                           const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    if (!out) return kiln_errorf(svc, hctx, KILN_E_INVALID_ARG, "idx: create needs an output pointer");
    *out = NULL;

    int64_t num_classes = 0, batch_size = 0, val_batch_size = 0, val_split = 0, prefetch = 0;
    int32_t rc;
    if ((rc = idxp_int_key(svc, hctx, config, "num_classes", 10, 1, 256, "uint8 labels", &num_classes)) ||
        (rc = idxp_int_key(svc, hctx, config, "batch_size", 128, 1, INT32_MAX, "samples per train batch",
                           &batch_size)) ||
        (rc = idxp_int_key(svc, hctx, config, "val_batch_size", 0, 0, INT32_MAX, "0 means batch_size",
                           &val_batch_size)) ||
        (rc = idxp_int_key(svc, hctx, config, "val_split", 5000, 0, UINT32_MAX, "training images held out",
                           &val_split)) ||
        (rc = idxp_int_key(svc, hctx, config, "prefetch", 0, 0, IDX_LOADER_MAX_PREFETCH,
                           "batches prepared ahead, 0 = automatic", &prefetch)))
        return rc;
    double mean = kiln_kv_float(config, "normalize_mean", 0.2860);
    double std = kiln_kv_float(config, "normalize_std", 0.3530);
    if (!isfinite(mean) || fabs(mean) > 1e30)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "idx: normalize_mean must be a finite number, got %g", mean);
    if (!isfinite(std) || !(std > 0.0) || std > 1e30 || (float)std <= 0.0f)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "idx: normalize_std must be finite and > 0, got %g", std);

    const char *dir = kiln_kv_str(config, "dir", IDXP_DEFAULT_DIR);
    static const char *const file_keys[4] = {"train_images", "train_labels", "test_images", "test_labels"};
    static const char *const file_defs[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    const char *names[4];
    for (int i = 0; i < 4; i++) {
        names[i] = kiln_kv_str(config, file_keys[i], file_defs[i]);
        if (!names[i][0])
            return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                               "idx: %s must name a file (relative to dir or absolute), got an empty string",
                               file_keys[i]);
    }

    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "idx: out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->train_images = idxp_resolve(dir, names[0]);
    self->train_labels = idxp_resolve(dir, names[1]);
    self->test_images = idxp_resolve(dir, names[2]);
    self->test_labels = idxp_resolve(dir, names[3]);
    if (!self->train_images || !self->train_labels || !self->test_images || !self->test_labels) {
        idxp_free(self);
        return kiln_errorf(svc, hctx, KILN_E_NOMEM, "idx: out of memory");
    }
    self->num_classes = (int)num_classes;
    self->batch_size = (uint32_t)batch_size;
    self->eval_batch_size = val_batch_size ? (uint32_t)val_batch_size : (uint32_t)batch_size;
    self->val_split = (uint32_t)val_split;
    self->shuffle = kiln_kv_int(config, "shuffle", 1) != 0;
    self->drop_last = kiln_kv_int(config, "drop_last", 0) != 0;
    self->mean = (float)mean;
    self->std = (float)std;
    self->prefetch = (int)prefetch;
    *out = self;
    return KILN_OK;
}

static void idxp_destroy(kiln_instance *self) { idxp_free(self); }

/* ------------------------------------------------------------------------ */
/* setup */

/* Reads (once) an image file and its label file; errors carry the reader's message. */
static int32_t idxp_load(kiln_instance *self, idx_dataset *ds, bool *loaded, const char *images,
                         const char *labels, const char *what) {
    if (*loaded) return KILN_OK;
    char err[400];
    err[0] = '\0';
    int rc = idx_open_dataset(images, labels, self->num_classes, ds, err, sizeof err);
    if (rc != IDX_OK) {
        /* The reader's line names the file; a missing file gets a hint about where data comes from. */
        return kiln_errorf(self->svc, self->hctx, idxp_status(rc, true), "idx: %s data: %s%s", what, err,
                           rc == IDX_EIO ? " (set `dir` / the file keys, or install Debian's dataset-fashion-mnist)"
                                         : "");
    }
    *loaded = true;
    kiln_logf(self->svc, self->hctx, KILN_LOG_INFO, "idx: %s data: %u images of %ux%u from %s", what, ds->n,
              ds->rows, ds->cols, images);
    return KILN_OK;
}

/* The training file must keep at least one image after holding out val_split. */
static int32_t idxp_check_val_split(kiln_instance *self) {
    if (self->val_split >= self->train_ds.n)
        return kiln_errorf(self->svc, self->hctx, KILN_E_CONFIG,
                           "idx: val_split is %u but %s has only %u images: it must be smaller, so at least one "
                           "image is left for training",
                           self->val_split, self->train_images, self->train_ds.n);
    return KILN_OK;
}

/* (Re)builds one split's loader over [begin, end) of ds; begin == end makes an empty split. */
static int32_t idxp_build(kiln_instance *self, int which, const idx_dataset *ds, uint32_t begin, uint32_t end,
                          uint32_t batch, bool shuffle, bool drop_last, int32_t rank, int32_t world_size) {
    idxp_split *s = &self->split[which];
    idxp_free_split(s);
    if (begin == end) {
        s->ready = true; /* empty: 0 batches */
        return KILN_OK;
    }
    idx_loader_config cfg;
    idx_loader_config_defaults(&cfg, ds);
    cfg.begin = begin;
    cfg.end = end;
    cfg.batch_size = batch;
    cfg.shuffle = shuffle;
    cfg.seed = self->seed;
    cfg.drop_last = drop_last;
    cfg.mean = self->mean;
    cfg.std = self->std;
    cfg.rank = (uint32_t)rank;
    cfg.world_size = (uint32_t)world_size;
    cfg.prefetch = self->prefetch;
    char err[400];
    err[0] = '\0';
    int rc = idx_loader_init(&s->loader, &cfg, err, sizeof err);
    if (rc != IDX_OK) {
        idxp_free_split(s);
        return kiln_errorf(self->svc, self->hctx, idxp_status(rc, false), "idx: %s split: %s",
                           idxp_split_names[which], err);
    }
    s->has_loader = true;
    s->ready = true;
    kiln_logf(self->svc, self->hctx, KILN_LOG_DEBUG,
              "idx: %s split: images [%u, %u), rank %d of %d: %d batches of %u%s", idxp_split_names[which], begin,
              end, rank, world_size, idx_loader_num_batches(&s->loader), batch, shuffle ? ", shuffled" : "");
    return KILN_OK;
}

static int32_t idxp_setup(kiln_instance *self, int32_t stage, int32_t rank, int32_t world_size) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG,
                           "idx: setup expects 0 <= rank < world_size, got rank %d, world_size %d", rank, world_size);
    int32_t rc;
    switch (stage) {
    case KILN_STAGE_FIT: {
        /* A failed FIT setup leaves neither split of an earlier one usable. */
        idxp_free_split(&self->split[KILN_SPLIT_TRAIN]);
        idxp_free_split(&self->split[KILN_SPLIT_VAL]);
        if ((rc = idxp_load(self, &self->train_ds, &self->train_loaded, self->train_images, self->train_labels,
                            "train")) ||
            (rc = idxp_check_val_split(self)))
            return rc;
        /* The host's stream seed is rank-independent, so every rank draws the same permutation and
         * the DistributedSampler-style shards are disjoint. */
        self->seed = (self->svc->abi_minor >= 1 && self->svc->seed) ? self->svc->seed(self->hctx, "data.shuffle") : 0;
        uint32_t n_train = self->train_ds.n - self->val_split;
        if ((rc = idxp_build(self, KILN_SPLIT_TRAIN, &self->train_ds, 0, n_train, self->batch_size, self->shuffle,
                             self->drop_last, rank, world_size)))
            return rc;
        /* Validation keeps every sample (no drop_last), as Lightning's val loaders do. */
        rc = idxp_build(self, KILN_SPLIT_VAL, &self->train_ds, n_train, self->train_ds.n, self->eval_batch_size,
                        false, false, rank, world_size);
        if (rc) idxp_free_split(&self->split[KILN_SPLIT_TRAIN]);
        return rc;
    }
    case KILN_STAGE_VALIDATE:
    case KILN_STAGE_SANITY: /* the sanity check runs validation batches */
        if ((rc = idxp_load(self, &self->train_ds, &self->train_loaded, self->train_images, self->train_labels,
                            "train")) ||
            (rc = idxp_check_val_split(self)))
            return rc;
        return idxp_build(self, KILN_SPLIT_VAL, &self->train_ds, self->train_ds.n - self->val_split,
                          self->train_ds.n, self->eval_batch_size, false, false, rank, world_size);
    case KILN_STAGE_TEST:
        if ((rc = idxp_load(self, &self->test_ds, &self->test_loaded, self->test_images, self->test_labels, "test")))
            return rc;
        return idxp_build(self, KILN_SPLIT_TEST, &self->test_ds, 0, self->test_ds.n, self->eval_batch_size, false,
                          false, rank, world_size);
    default:
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG,
                           "idx: setup expects stage FIT (1), VALIDATE (2), TEST (3) or SANITY (4), got %d", stage);
    }
}

/* ------------------------------------------------------------------------ */
/* batches */

/* The split, when its id is valid and it was set up; else an error is reported and NULL returned. */
static idxp_split *idxp_get_split(kiln_instance *self, int32_t split, const char *op, int32_t *rc) {
    if (split < 0 || split >= IDXP_NSPLITS) {
        *rc = kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG,
                          "idx: %s expects split TRAIN (0), VAL (1) or TEST (2), got %d", op, split);
        return NULL;
    }
    idxp_split *s = &self->split[split];
    if (!s->ready) {
        static const char *const stage_for[IDXP_NSPLITS] = {"FIT", "FIT or VALIDATE", "TEST"};
        *rc = kiln_errorf(self->svc, self->hctx, KILN_E_STATE, "idx: %s(%s): that split was not set up; call "
                          "setup(%s) first", op, idxp_split_names[split], stage_for[split]);
        return NULL;
    }
    *rc = KILN_OK;
    return s;
}

static int32_t idxp_num_batches(kiln_instance *self, int32_t split, int64_t *n) {
    int32_t rc;
    idxp_split *s = idxp_get_split(self, split, "num_batches", &rc);
    if (!s) return rc;
    if (!n) return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG, "idx: num_batches needs an output pointer");
    /* Always the full epoch, also after set_state: Lightning's num_training_batches does not shrink on resume. */
    *n = s->has_loader ? idx_loader_num_batches(&s->loader) : 0;
    return KILN_OK;
}

/*
 * start_batch >= 0 starts there. start_batch < 0 means "resume": for TRAIN,
 * the position restored by set_state when its epoch equals `epoch` (else 0);
 * for VAL/TEST, 0. Every TRAIN start_epoch consumes the restored position.
 */
static int32_t idxp_start_epoch(kiln_instance *self, int32_t split, uint64_t epoch, int64_t start_batch) {
    int32_t rc;
    idxp_split *s = idxp_get_split(self, split, "start_epoch", &rc);
    if (!s) return rc;
    int64_t nb = s->has_loader ? idx_loader_num_batches(&s->loader) : 0;
    uint64_t first = start_batch < 0 ? 0 : (uint64_t)start_batch;
    if (split == KILN_SPLIT_TRAIN && start_batch < 0 && self->restored && self->restored_epoch == epoch) {
        if ((self->restored_flags & IDXP_STATE_HAS_TRAIN) && self->restored_nb != (uint64_t)nb)
            return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                               "idx: the restored train position was saved with %" PRIu64 " batches per epoch, this "
                               "run has %" PRId64 " (batch_size, val_split, drop_last or world size changed)",
                               self->restored_nb, nb);
        if ((self->restored_flags & IDXP_STATE_HAS_TRAIN) && self->restored_seed != self->seed)
            kiln_logf(self->svc, self->hctx, KILN_LOG_WARN,
                      "idx: resuming with a different shuffle seed than the checkpoint's: epoch %" PRIu64
                      " will not repeat the saved order", epoch);
        first = self->restored_next;
    }
    if (first > (uint64_t)nb)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG,
                           "idx: start_epoch(%s) at batch %" PRIu64 ", but an epoch has %" PRId64 " batches",
                           idxp_split_names[split], first, nb);
    if (split == KILN_SPLIT_TRAIN) self->restored = false;
    if (!s->has_loader) return KILN_OK; /* empty split: nothing to start */
    int r = idx_loader_start_epoch(&s->loader, epoch, first);
    if (r != IDX_OK)
        return kiln_errorf(self->svc, self->hctx, idxp_status(r, false), "idx: start_epoch(%s): %s",
                           idxp_split_names[split], idx_loader_strerror(r));
    return KILN_OK;
}

static int32_t idxp_next(kiln_instance *self, int32_t split, kiln_batch *out) {
    int32_t rc;
    idxp_split *s = idxp_get_split(self, split, "next", &rc);
    if (!s) return rc;
    if (!out) return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG, "idx: next needs an output batch");
    if (!s->has_loader) return 0; /* empty validation split */
    const float *x = NULL;  /* (len, D) */
    const int32_t *y = NULL; /* (len) */
    int len = 0;
    int r = idx_loader_next(&s->loader, &x, &y, &len);
    if (r == IDX_ESTATE)
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE, "idx: next(%s) before start_epoch(%s)",
                           idxp_split_names[split], idxp_split_names[split]);
    if (r < 0)
        return kiln_errorf(self->svc, self->hctx, idxp_status(r, false), "idx: next(%s): %s",
                           idxp_split_names[split], idx_loader_strerror(r));
    if (r == 0) return 0;
    /* Views of the loader's slot; the consumer reads them only (the cast drops const for kiln_tensor). */
    kiln_tensor *t = s->tensors;
    memset(t, 0, 2 * sizeof *t);
    t[0].data = (void *)x;
    t[0].dtype = KILN_DTYPE_F32;
    t[0].ndim = 2;
    t[0].shape[0] = len;
    t[0].shape[1] = s->loader.dim;
    t[0].shape[2] = t[0].shape[3] = 1;
    t[1].data = (void *)y;
    t[1].dtype = KILN_DTYPE_I32;
    t[1].ndim = 1;
    t[1].shape[0] = len;
    t[1].shape[1] = t[1].shape[2] = t[1].shape[3] = 1;
    out->struct_size = sizeof *out;
    out->ntensors = 2;
    out->tensors = t;
    out->size = len;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* state */

/*
 * Version 1 layout (little-endian, 40 bytes):
 *   u32 magic "KIDX"   u32 flags (IDXP_STATE_HAS_TRAIN)
 *   u64 epoch          u64 next_batch (the next train batch the host would receive)
 *   u64 num_batches    u64 seed (train batches per epoch and shuffle seed; 0 without HAS_TRAIN)
 * A position restored but not yet applied is saved as it was restored.
 */
static int32_t idxp_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    if (!state_version || !data || !size)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG, "idx: get_state needs output pointers");
    uint32_t flags = 0;
    uint64_t epoch = 0, next = 0, nb = 0, seed = 0;
    const idxp_split *tr = &self->split[KILN_SPLIT_TRAIN];
    if (self->restored) {
        flags = self->restored_flags;
        epoch = self->restored_epoch;
        next = self->restored_next;
        nb = self->restored_nb;
        seed = self->restored_seed;
    } else if (tr->has_loader) {
        flags = IDXP_STATE_HAS_TRAIN;
        idx_loader_position(&tr->loader, &epoch, &next);
        nb = (uint64_t)idx_loader_num_batches(&tr->loader);
        seed = self->seed;
    }
    uint8_t *p = self->svc->alloc(self->hctx, IDXP_STATE_SIZE, 0);
    if (!p) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "idx: out of memory for the state blob");
    idxp_put_u32(p, IDXP_STATE_MAGIC);
    idxp_put_u32(p + 4, flags);
    idxp_put_u64(p + 8, epoch);
    idxp_put_u64(p + 16, next);
    idxp_put_u64(p + 24, nb);
    idxp_put_u64(p + 32, seed);
    *state_version = IDXP_STATE_VERSION;
    *data = p;
    *size = IDXP_STATE_SIZE;
    return KILN_OK;
}

static int32_t idxp_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    if (state_version != IDXP_STATE_VERSION)
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                           "idx: state version %u is not readable; this plugin reads version %u", state_version,
                           IDXP_STATE_VERSION);
    if (!data || size != IDXP_STATE_SIZE)
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE, "idx: state version 1 is %u bytes, got %zu",
                           IDXP_STATE_SIZE, data ? size : (size_t)0);
    const uint8_t *p = data;
    uint32_t magic = idxp_get_u32(p), flags = idxp_get_u32(p + 4);
    uint64_t epoch = idxp_get_u64(p + 8), next = idxp_get_u64(p + 16);
    uint64_t nb = idxp_get_u64(p + 24), seed = idxp_get_u64(p + 32);
    if (magic != IDXP_STATE_MAGIC || (flags & ~IDXP_STATE_HAS_TRAIN))
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                           "idx: expected an idx state blob (magic 0x%08X, flags <= 1), found magic 0x%08X, flags %u",
                           IDXP_STATE_MAGIC, magic, flags);
    if ((flags & IDXP_STATE_HAS_TRAIN) ? next > nb : (next != 0 || nb != 0))
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                           "idx: corrupt state: next batch %" PRIu64 " of an epoch of %" PRIu64 " batches", next, nb);
    const idxp_split *tr = &self->split[KILN_SPLIT_TRAIN];
    if ((flags & IDXP_STATE_HAS_TRAIN) && tr->has_loader && nb != (uint64_t)idx_loader_num_batches(&tr->loader))
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                           "idx: the state was saved with %" PRIu64 " train batches per epoch, this run has %d "
                           "(batch_size, val_split, drop_last or world size changed)",
                           nb, idx_loader_num_batches(&tr->loader));
    self->restored = true;
    self->restored_flags = flags;
    self->restored_epoch = epoch;
    self->restored_next = next;
    self->restored_nb = nb;
    self->restored_seed = seed;
    return KILN_OK;
}

/* ------------------------------------------------------------------------ */
/* Descriptor */

static const kiln_data_ops idxp_ops = {
    .base =
        {
            .struct_size = sizeof(kiln_data_ops),
            .create = idxp_create,
            .destroy = idxp_destroy,
            .get_state = idxp_get_state,
            .set_state = idxp_set_state,
        },
    .setup = idxp_setup,
    .num_batches = idxp_num_batches,
    .start_epoch = idxp_start_epoch,
    .next = idxp_next,
};

static const kiln_param idxp_params[] = {
    {"dir", KILN_TYPE_STRING, 0, KILN_V_STR(IDXP_DEFAULT_DIR),
     "folder the file names are relative to (Debian: dataset-fashion-mnist)"},
    {"train_images", KILN_TYPE_STRING, 0, KILN_V_STR("train-images-idx3-ubyte.gz"),
     "IDX3 training images (gzip or raw), relative to dir or absolute"},
    {"train_labels", KILN_TYPE_STRING, 0, KILN_V_STR("train-labels-idx1-ubyte.gz"),
     "IDX1 training labels, relative to dir or absolute"},
    {"test_images", KILN_TYPE_STRING, 0, KILN_V_STR("t10k-images-idx3-ubyte.gz"),
     "IDX3 test images, relative to dir or absolute"},
    {"test_labels", KILN_TYPE_STRING, 0, KILN_V_STR("t10k-labels-idx1-ubyte.gz"),
     "IDX1 test labels, relative to dir or absolute"},
    {"num_classes", KILN_TYPE_INT, 0, KILN_V_INT(10), "number of classes; every label must be below it (1..256)"},
    {"batch_size", KILN_TYPE_INT, 0, KILN_V_INT(128), "samples per training batch"},
    {"val_batch_size", KILN_TYPE_INT, 0, KILN_V_INT(0), "samples per validation/test batch; 0 = batch_size"},
    {"val_split", KILN_TYPE_INT, 0, KILN_V_INT(5000),
     "last N training images held out for validation; 0 = no validation data"},
    {"shuffle", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1), "reshuffle the training split every epoch (seeded by the run seed)"},
    {"drop_last", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "drop the last incomplete training batch"},
    {"normalize_mean", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.2860), "x = (pixel/255 - mean) / std; Fashion-MNIST's mean"},
    {"normalize_std", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.3530), "x = (pixel/255 - mean) / std; must be > 0"},
    {"prefetch", KILN_TYPE_INT, 0, KILN_V_INT(0),
     "batches a background thread prepares ahead per split (1..16; 0 = automatic: up to 8, at most 32 MiB)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* No properties: a data plugin has nothing the host needs before create(). */
/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const idxp_checks[] = {"num_classes in [1, 256]", "batch_size in [1, 2147483647]", "val_batch_size in [0, 2147483647]", "val_split in [0, 4294967295]", "normalize_std > 0"};
static const kiln_kv idxp_props[] = {
    {"config_checks", KILN_V_STRS(idxp_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc idxp_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_DATA,
    .name = "idx",
    .version = "1.0.0",
    .description = "image classification batches from IDX files (MNIST, Fashion-MNIST), shuffled, sharded, prefetched",
    .capabilities = KILN_CAP_STATEFUL | KILN_CAP_DETERMINISTIC,
    .properties = idxp_props,
    .params = idxp_params,
    .ops = &idxp_ops,
};

KILN_DEFINE_LIBRARY("idx", "1.0.0", 1, &idxp_desc)
