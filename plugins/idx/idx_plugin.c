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

#include "../common/data_common.h"
#include "idx_loader.h"
#include "idx_reader.h"

#define IDXP_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/* State blob, version 1: 40 bytes, little-endian, see idxp_get_state. */
#define IDXP_STATE_VERSION 1u
#define IDXP_STATE_MAGIC 0x5844494Bu /* "KIDX" read as a little-endian u32 */
#define IDXP_STATE_SIZE 40u
/* flags: DC_STATE_HAS_TRAIN, num_batches and seed were known at save time */

enum { IDXP_NSPLITS = DC_NSPLITS };

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
    dc_resume res;
};

/* Reports go out as "idx: ..." */
#define IDXP_SINK(self) ((dc_sink){(self)->svc, (self)->hctx, "idx"})

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

static int32_t idxp_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                           const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    if (!out) return kiln_errorf(svc, hctx, KILN_E_INVALID_ARG, "idx: create needs an output pointer");
    *out = NULL;

    int64_t num_classes = 0, batch_size = 0, val_batch_size = 0, val_split = 0, prefetch = 0;
    int32_t rc;
    const dc_sink sk = {svc, hctx, "idx"};
    if ((rc = dc_int_key(sk, config, "num_classes", 10, 1, 256, "uint8 labels", &num_classes)) ||
        (rc = dc_int_key(sk, config, "batch_size", 128, 1, INT32_MAX, "samples per train batch", &batch_size)) ||
        (rc = dc_int_key(sk, config, "val_batch_size", 0, 0, INT32_MAX, "0 means batch_size", &val_batch_size)) ||
        (rc = dc_int_key(sk, config, "val_split", 5000, 0, UINT32_MAX, "training images held out", &val_split)) ||
        (rc = dc_int_key(sk, config, "prefetch", 0, 0, IDX_LOADER_MAX_PREFETCH, "batches prepared ahead, 0 = automatic",
                         &prefetch)))
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
                           dc_split_name(which), err);
    }
    s->has_loader = true;
    s->ready = true;
    kiln_logf(self->svc, self->hctx, KILN_LOG_DEBUG,
              "idx: %s split: images [%u, %u), rank %d of %d: %d batches of %u%s", dc_split_name(which), begin,
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
        self->seed = dc_host_seed(IDXP_SINK(self)); /* the same on every rank */
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
    *rc = dc_check_split(IDXP_SINK(self), split, split >= 0 && split < IDXP_NSPLITS && self->split[split].ready, op);
    return *rc == KILN_OK ? &self->split[split] : NULL;
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

/* The first batch as dc_first_batch says (a restored train position, or start_batch). */
static int32_t idxp_start_epoch(kiln_instance *self, int32_t split, uint64_t epoch, int64_t start_batch) {
    int32_t rc;
    idxp_split *s = idxp_get_split(self, split, "start_epoch", &rc);
    if (!s) return rc;
    int64_t nb = s->has_loader ? idx_loader_num_batches(&s->loader) : 0;
    uint64_t first = 0;
    bool resumed = false;
    if ((rc = dc_first_batch(IDXP_SINK(self), &self->res, split, epoch, start_batch, (uint64_t)nb,
                             " (batch_size, val_split, drop_last or world size changed)", &first, &resumed)))
        return rc;
    if (resumed && (self->res.flags & DC_STATE_HAS_TRAIN) && self->res.seed != self->seed)
        kiln_logf(self->svc, self->hctx, KILN_LOG_WARN,
                  "idx: resuming with a different shuffle seed than the checkpoint's: epoch %" PRIu64
                  " will not repeat the saved order", epoch);
    if (!s->has_loader) return KILN_OK; /* empty split: nothing to start */
    int r = idx_loader_start_epoch(&s->loader, epoch, first);
    if (r != IDX_OK)
        return kiln_errorf(self->svc, self->hctx, idxp_status(r, false), "idx: start_epoch(%s): %s",
                           dc_split_name(split), idx_loader_strerror(r));
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
                           dc_split_name(split), dc_split_name(split));
    if (r < 0)
        return kiln_errorf(self->svc, self->hctx, idxp_status(r, false), "idx: next(%s): %s", dc_split_name(split),
                           idx_loader_strerror(r));
    if (r == 0) return 0;
    /* Views of the loader's slot, (len, D) inputs and (len) labels. */
    kiln_tensor *t = s->tensors;
    memset(t, 0, 2 * sizeof *t);
    dc_view(&t[0], x, KILN_DTYPE_F32, len, s->loader.dim);
    dc_view(&t[1], y, KILN_DTYPE_I32, len, 0);
    return dc_batch(out, t, len);
}

/* ------------------------------------------------------------------------ */
/* state */

/*
 * Version 1 layout (little-endian, 40 bytes):
 *   u32 magic "KIDX"   u32 flags (DC_STATE_HAS_TRAIN)
 *   u64 epoch          u64 next_batch (the next train batch the host would receive)
 *   u64 num_batches    u64 seed (train batches per epoch and shuffle seed; 0 without HAS_TRAIN)
 * A position restored but not yet applied is saved as it was restored.
 */
static int32_t idxp_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    int32_t rc;
    uint8_t *p = dc_state_blob(IDXP_SINK(self), state_version, data, size, IDXP_STATE_SIZE, &rc);
    if (!p) return rc;
    dc_resume pos = self->res; /* a position restored but not applied: as restored */
    const idxp_split *tr = &self->split[KILN_SPLIT_TRAIN];
    if (!pos.restored) {
        pos = (dc_resume){0};
        if (tr->has_loader) {
            pos.flags = DC_STATE_HAS_TRAIN;
            idx_loader_position(&tr->loader, &pos.epoch, &pos.next);
            pos.nb = (uint64_t)idx_loader_num_batches(&tr->loader);
            pos.seed = self->seed;
        }
    }
    dc_put_position(p, IDXP_STATE_MAGIC, &pos);
    *state_version = IDXP_STATE_VERSION;
    *data = p;
    *size = IDXP_STATE_SIZE;
    return KILN_OK;
}

static int32_t idxp_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    uint32_t flags = 0;
    int32_t rc = dc_state_header(IDXP_SINK(self), state_version, data, size, IDXP_STATE_SIZE, IDXP_STATE_MAGIC,
                                 "an idx", &flags);
    if (rc) return rc;
    dc_resume pos = dc_get_position(data);
    const uint64_t next = pos.next, nb = pos.nb;
    if ((flags & DC_STATE_HAS_TRAIN) ? next > nb : (next != 0 || nb != 0))
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                           "idx: corrupt state: next batch %" PRIu64 " of an epoch of %" PRIu64 " batches", next, nb);
    const idxp_split *tr = &self->split[KILN_SPLIT_TRAIN];
    if ((flags & DC_STATE_HAS_TRAIN) && tr->has_loader && nb != (uint64_t)idx_loader_num_batches(&tr->loader))
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                           "idx: the state was saved with %" PRIu64 " train batches per epoch, this run has %d "
                           "(batch_size, val_split, drop_last or world size changed)",
                           nb, idx_loader_num_batches(&tr->loader));
    pos.restored = true;
    self->res = pos;
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
