/*
 * The "tokens" data plugin (KILN_KIND_DATA): language-model batches from
 * llm.c token shards (format "llmc", uint16 tokens, e.g. GPT-2 BPE) or from
 * raw UTF-8 text read byte by byte (format "text", vocabulary 256). Every
 * sample is a window of block_size + 1 consecutive tokens; windows start
 * every block_size tokens (neighbours share one token, as in llm.c's loader).
 * A batch is
 *   tensors[0] inputs  (B, T) I32: tokens 0..T-1 of each window
 *   tensors[1] targets (B, T) I32: tokens 1..T   (inputs shifted by one)
 * with batch->size = B (smaller only for the last validation/test batch).
 *
 * setup(stage) globs, maps (read-only) and validates the files once per
 * instance (tok_data.c), then builds each split's sampler (tok_sampler.c):
 * train shuffled per epoch from a seed and sharded DistributedSampler-style,
 * always dropping the short last batch; val/test in file order, sharded with
 * padding, keeping the short last batch. The train position (epoch, next
 * batch) and the seed are the plugin's state, so a run resumes mid-epoch on
 * exactly the windows it would have seen.
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
#include "tok_data.h"
#include "tok_format.h"
#include "tok_sampler.h"

/* State blob, version 1: 56 bytes, little-endian, see tokp_get_state. */
#define TOKP_STATE_VERSION 1u
#define TOKP_STATE_MAGIC 0x4B4F544Bu /* "KTOK" read as a little-endian u32 */
#define TOKP_STATE_SIZE 56u
/* flags: DC_STATE_HAS_TRAIN, the train fields were known at save time */

#define TOKP_DEFAULT_VOCAB 50257
#define TOKP_MAX_BLOCK (1 << 20)
#define TOKP_MAX_BATCH (1 << 20)

enum { TOKP_NSPLITS = DC_NSPLITS };

typedef struct tokp_split {
    bool ready;             /* set up (possibly empty): num_batches/start_epoch/next are valid */
    bool has_data;          /* false for an empty split (no val data configured) */
    tok_view view;          /* the split's tokens */
    tok_sampler sampler;    /* order and the (B, T) buffers the tensors point at */
    kiln_tensor tensors[2]; /* [0] inputs (B, T) I32, [1] targets (B, T) I32: the last batch handed out */
} tokp_split;

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    int format;                  /* TOK_FMT_* */
    char *train_pat, *val_pat, *test_pat; /* glob patterns; val/test may be "" */
    char *exclude;                        /* fnmatch pattern of file names to skip; "" = none */
    double val_fraction;
    uint32_t batch_size, eval_batch_size, block_size;
    uint64_t vocab_size;
    bool shuffle;
    bool seed_from_key;          /* `seed` >= 0 was given; else the host's "data.shuffle" stream */
    uint64_t seed_key;
    uint64_t seed;               /* the train shuffle's seed, fixed at setup(FIT) */
    int32_t world_size;          /* of the last setup(FIT) */
    /* Files are mapped and validated once, on the first setup that needs them, and kept until destroy. */
    tok_fileset fs_train, fs_val, fs_test;
    bool loaded_train, loaded_val, loaded_test;
    tokp_split split[TOKP_NSPLITS];
    /* A state restored by set_state: its seed replaces the configured one and
     * its shape is checked at setup(FIT); its position is applied by the next
     * start_epoch(TRAIN, epoch, start_batch < 0) and consumed by any train start_epoch. */
    dc_resume res;
    uint64_t restored_nwin;
    uint32_t restored_batch, restored_world;
};

/* Reports go out as "tokens: ..." */
#define TOKP_SINK(self) ((dc_sink){(self)->svc, (self)->hctx, "tokens"})

/* ------------------------------------------------------------------------ */
/* Helpers */

static int32_t tokp_status(int rc) {
    switch (rc) {
    case TOK_OK: return KILN_OK;
    case TOK_EIO: return KILN_E_IO;
    case TOK_EFORMAT: return KILN_E_DATA;
    case TOK_ENOMEM: return KILN_E_NOMEM;
    case TOK_EINVAL: return KILN_E_CONFIG;
    default: return KILN_E_INTERNAL;
    }
}

static void tokp_free_split(tokp_split *s) {
    tok_sampler_free(&s->sampler);
    tok_view_free(&s->view);
    memset(s, 0, sizeof *s);
}

static void tokp_free(kiln_instance *self) {
    if (!self) return;
    for (int i = 0; i < TOKP_NSPLITS; i++) tokp_free_split(&self->split[i]);
    tok_fileset_free(&self->fs_train);
    tok_fileset_free(&self->fs_val);
    tok_fileset_free(&self->fs_test);
    free(self->train_pat);
    free(self->exclude);
    free(self->val_pat);
    free(self->test_pat);
    free(self);
}

/* ------------------------------------------------------------------------ */
/* create / destroy */

static int32_t tokp_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                           const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    if (!out) return kiln_errorf(svc, hctx, KILN_E_INVALID_ARG, "tokens: create needs an output pointer");
    *out = NULL;

    const char *format = kiln_kv_str(config, "format", "llmc");
    int fmt;
    if (!strcmp(format, "llmc")) fmt = TOK_FMT_LLMC;
    else if (!strcmp(format, "text")) fmt = TOK_FMT_TEXT;
    else
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "tokens: format must be \"llmc\" or \"text\", got \"%s\"",
                           format);
    int64_t batch = 0, eval_batch = 0, block = 0, vocab = 0, seed = 0;
    int32_t rc;
    const dc_sink sk = {svc, hctx, "tokens"};
    if ((rc = dc_int_key(sk, config, "batch_size", 4, 1, TOKP_MAX_BATCH, "windows per train batch", &batch)) ||
        (rc = dc_int_key(sk, config, "val_batch_size", 0, 0, TOKP_MAX_BATCH,
                         "windows per val/test batch, 0 = batch_size", &eval_batch)) ||
        (rc = dc_int_key(sk, config, "block_size", 1024, 1, TOKP_MAX_BLOCK, "tokens per sample T", &block)) ||
        (rc = dc_int_key(sk, config, "vocab_size", TOKP_DEFAULT_VOCAB, 1, INT32_MAX, "every token must be below it",
                         &vocab)) ||
        (rc = dc_int_key(sk, config, "seed", -1, -1, INT64_MAX, "-1 = the run's seed", &seed)))
        return rc;
    if (fmt == TOK_FMT_TEXT && vocab < 256)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "tokens: format \"text\" has 256 byte tokens, so vocab_size must be >= 256, got %" PRId64,
                           vocab);
    int64_t per_batch_max = (int64_t)1 << 28;
    if (batch * block > per_batch_max || (eval_batch ? eval_batch : batch) * block > per_batch_max)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "tokens: batch_size x block_size (and val_batch_size x block_size) must be at most "
                           "%" PRId64 " tokens, got %" PRId64 " x %" PRId64,
                           per_batch_max, eval_batch > batch ? eval_batch : batch, block);
    double vf = kiln_kv_float(config, "val_fraction", 0.0);
    if (!(vf >= 0.0 && vf < 1.0))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "tokens: val_fraction must be in [0, 1), got %g", vf);
    const char *train = kiln_kv_str(config, "train", "");
    const char *val = kiln_kv_str(config, "val", "");
    const char *test = kiln_kv_str(config, "test", "");
    if (!train[0])
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "tokens: train must be a file name or glob pattern (e.g. \"data/*_train_*.bin\"), got an "
                           "empty string");
    if (val[0] && vf > 0.0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "tokens: val and val_fraction (%g) are both set: validation data comes from the `val` "
                           "files or from the tail of the train data, not both",
                           vf);

    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "tokens: out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->format = fmt;
    self->train_pat = strdup(train);
    self->exclude = strdup(kiln_kv_str(config, "exclude", ""));
    self->val_pat = strdup(val);
    self->test_pat = strdup(test);
    if (!self->train_pat || !self->exclude || !self->val_pat || !self->test_pat) {
        tokp_free(self);
        return kiln_errorf(svc, hctx, KILN_E_NOMEM, "tokens: out of memory");
    }
    self->val_fraction = vf;
    self->batch_size = (uint32_t)batch;
    self->eval_batch_size = eval_batch ? (uint32_t)eval_batch : (uint32_t)batch;
    self->block_size = (uint32_t)block;
    self->vocab_size = (uint64_t)vocab;
    self->shuffle = kiln_kv_int(config, "shuffle", 1) != 0;
    self->seed_from_key = seed >= 0;
    self->seed_key = seed >= 0 ? (uint64_t)seed : 0;
    *out = self;
    return KILN_OK;
}

static void tokp_destroy(kiln_instance *self) { tokp_free(self); }

/* ------------------------------------------------------------------------ */
/* setup */

/* Maps and validates (once) the files of one pattern. */
static int32_t tokp_load(kiln_instance *self, tok_fileset *fs, bool *loaded, const char *pattern, const char *what) {
    if (*loaded) return KILN_OK;
    char err[600];
    err[0] = '\0';
    int rc = tok_fileset_open(fs, pattern, self->exclude, what, self->format, (uint64_t)self->block_size + 1,
                              self->vocab_size, err, sizeof err);
    if (rc != TOK_OK) return kiln_errorf(self->svc, self->hctx, tokp_status(rc), "tokens: %s", err);
    *loaded = true;
    kiln_logf(self->svc, self->hctx, KILN_LOG_INFO, "tokens: %s: %" PRIu64 " tokens in %u file(s) matching '%s'",
              what, fs->total, fs->nfiles, pattern);
    return KILN_OK;
}

/* Validation taken from the tail of the train data (val empty, val_fraction > 0). */
static bool tokp_val_from_train(const kiln_instance *self) { return !self->val_pat[0] && self->val_fraction > 0.0; }

/* Tokens of the train set held out for validation (0 unless tokp_val_from_train). */
static uint64_t tokp_val_tokens(const kiln_instance *self) {
    if (!tokp_val_from_train(self)) return 0;
    return (uint64_t)floor((double)self->fs_train.total * self->val_fraction);
}

/* (Re)builds split `which` over tokens [lo, hi) of fs; fs NULL makes an empty split. */
static int32_t tokp_build(kiln_instance *self, int which, const tok_fileset *fs, uint64_t lo, uint64_t hi,
                          const char *what, int32_t rank, int32_t world_size) {
    tokp_split *s = &self->split[which];
    tokp_free_split(s);
    if (!fs) {
        s->ready = true; /* no data configured: 0 batches */
        return KILN_OK;
    }
    char err[600];
    err[0] = '\0';
    int rc = tok_view_init(&s->view, fs, lo, hi, self->block_size, err, sizeof err);
    if (rc == TOK_OK && s->view.nwin == 0) {
        snprintf(err, sizeof err,
                 "%" PRIu64 " tokens hold no window of block_size + 1 = %" PRIu64 " tokens (text too short or "
                 "block_size too large)",
                 s->view.ntok, (uint64_t)self->block_size + 1);
        rc = TOK_EINVAL;
    }
    if (rc == TOK_OK) {
        bool train = which == KILN_SPLIT_TRAIN;
        tok_sampler_config cfg = {
            .view = &s->view,
            .batch_size = train ? self->batch_size : self->eval_batch_size,
            .rank = (uint32_t)rank,
            .world_size = (uint32_t)world_size,
            .shuffle = train && self->shuffle,
            .seed = self->seed,
            .drop_last = train,
        };
        rc = tok_sampler_init(&s->sampler, &cfg, err, sizeof err);
    }
    if (rc != TOK_OK) {
        tokp_free_split(s);
        return kiln_errorf(self->svc, self->hctx, tokp_status(rc), "tokens: %s split (%s): %s", dc_split_name(which), what, err);
    }
    s->has_data = true;
    s->ready = true;
    kiln_logf(self->svc, self->hctx, KILN_LOG_DEBUG,
              "tokens: %s split: %" PRIu64 " tokens, %" PRIu64 " windows; rank %d of %d: %" PRIu64
              " batches of %u x %u%s",
              dc_split_name(which), s->view.ntok, s->view.nwin, rank, world_size, s->sampler.num_batches,
              s->sampler.cfg.batch_size, self->block_size, s->sampler.cfg.shuffle ? ", shuffled" : "");
    return KILN_OK;
}

/* Loads what the val split needs and builds it. */
static int32_t tokp_setup_val(kiln_instance *self, int which, int32_t rank, int32_t world_size) {
    int32_t rc;
    if (self->val_pat[0]) {
        if ((rc = tokp_load(self, &self->fs_val, &self->loaded_val, self->val_pat, "val"))) return rc;
        return tokp_build(self, which, &self->fs_val, 0, self->fs_val.total, self->val_pat, rank, world_size);
    }
    if (!tokp_val_from_train(self)) return tokp_build(self, which, NULL, 0, 0, "", rank, world_size);
    if ((rc = tokp_load(self, &self->fs_train, &self->loaded_train, self->train_pat, "train"))) return rc;
    uint64_t nval = tokp_val_tokens(self), total = self->fs_train.total;
    if (nval <= self->block_size)
        return kiln_errorf(self->svc, self->hctx, KILN_E_CONFIG,
                           "tokens: val_fraction %g of %" PRIu64 " train tokens leaves %" PRIu64
                           " for validation, fewer than one window of block_size + 1 = %" PRIu64,
                           self->val_fraction, total, nval, (uint64_t)self->block_size + 1);
    return tokp_build(self, which, &self->fs_train, total - nval, total, "the last val_fraction of train", rank,
                      world_size);
}

/* A saved train shape (windows, batches per epoch, batch size, world size)
 * must be this run's, once the train split exists. */
static int32_t tokp_same_shape(kiln_instance *self, uint64_t nwin, uint64_t nb, uint32_t batch, uint32_t world) {
    const tokp_split *tr = &self->split[KILN_SPLIT_TRAIN];
    if (!tr->has_data) return KILN_OK;
    const tok_sampler *S = &tr->sampler;
    if (nwin != tr->view.nwin || nb != S->num_batches || batch != S->cfg.batch_size || world != S->cfg.world_size)
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                           "tokens: the state was saved with %" PRIu64 " train windows, %" PRIu64
                           " batches per epoch, batch_size %u and world size %u; this run has %" PRIu64 ", %" PRIu64
                           ", %u and %u (the data, block_size, batch_size, val_fraction or world size changed)",
                           nwin, nb, batch, world, tr->view.nwin, S->num_batches, S->cfg.batch_size,
                           S->cfg.world_size);
    return KILN_OK;
}

/* A restored state must describe this run's train split. */
static int32_t tokp_check_restored(kiln_instance *self) {
    if (!self->res.restored || !(self->res.flags & DC_STATE_HAS_TRAIN)) return KILN_OK;
    return tokp_same_shape(self, self->restored_nwin, self->res.nb, self->restored_batch, self->restored_world);
}

static int32_t tokp_setup(kiln_instance *self, int32_t stage, int32_t rank, int32_t world_size) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG,
                           "tokens: setup expects 0 <= rank < world_size, got rank %d, world_size %d", rank,
                           world_size);
    int32_t rc;
    switch (stage) {
    case KILN_STAGE_FIT: {
        /* A failed FIT setup leaves neither split of an earlier one usable. */
        tokp_free_split(&self->split[KILN_SPLIT_TRAIN]);
        tokp_free_split(&self->split[KILN_SPLIT_VAL]);
        if ((rc = tokp_load(self, &self->fs_train, &self->loaded_train, self->train_pat, "train"))) return rc;
        /* Every rank must draw the same permutation: the host's stream seed is rank-independent. */
        if (self->res.restored && (self->res.flags & DC_STATE_HAS_TRAIN)) self->seed = self->res.seed;
        else if (self->seed_from_key) self->seed = self->seed_key;
        else self->seed = dc_host_seed(TOKP_SINK(self));
        self->world_size = world_size;
        uint64_t total = self->fs_train.total, nval = tokp_val_tokens(self);
        if ((rc = tokp_build(self, KILN_SPLIT_TRAIN, &self->fs_train, 0, total - nval, self->train_pat, rank,
                             world_size)) ||
            (rc = tokp_check_restored(self)) || (rc = tokp_setup_val(self, KILN_SPLIT_VAL, rank, world_size))) {
            tokp_free_split(&self->split[KILN_SPLIT_TRAIN]);
            tokp_free_split(&self->split[KILN_SPLIT_VAL]);
            return rc;
        }
        return KILN_OK;
    }
    case KILN_STAGE_VALIDATE:
    case KILN_STAGE_SANITY: /* the sanity check runs validation batches */
        return tokp_setup_val(self, KILN_SPLIT_VAL, rank, world_size);
    case KILN_STAGE_TEST:
        if (self->test_pat[0]) {
            if ((rc = tokp_load(self, &self->fs_test, &self->loaded_test, self->test_pat, "test"))) return rc;
            return tokp_build(self, KILN_SPLIT_TEST, &self->fs_test, 0, self->fs_test.total, self->test_pat, rank,
                              world_size);
        }
        return tokp_setup_val(self, KILN_SPLIT_TEST, rank, world_size); /* no test files: the val data */
    default:
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG,
                           "tokens: setup expects stage FIT (1), VALIDATE (2), TEST (3) or SANITY (4), got %d", stage);
    }
}

/* ------------------------------------------------------------------------ */
/* batches */

static tokp_split *tokp_get_split(kiln_instance *self, int32_t split, const char *op, int32_t *rc) {
    *rc = dc_check_split(TOKP_SINK(self), split, split >= 0 && split < TOKP_NSPLITS && self->split[split].ready, op);
    return *rc == KILN_OK ? &self->split[split] : NULL;
}

static int32_t tokp_num_batches(kiln_instance *self, int32_t split, int64_t *n) {
    int32_t rc;
    tokp_split *s = tokp_get_split(self, split, "num_batches", &rc);
    if (!s) return rc;
    if (!n) return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG, "tokens: num_batches needs an output pointer");
    /* The full epoch, also after set_state (Lightning's num_training_batches does not shrink on resume). */
    *n = s->has_data ? (int64_t)s->sampler.num_batches : 0;
    return KILN_OK;
}

/* The first batch as dc_first_batch says (a restored train position, or start_batch). */
static int32_t tokp_start_epoch(kiln_instance *self, int32_t split, uint64_t epoch, int64_t start_batch) {
    int32_t rc;
    tokp_split *s = tokp_get_split(self, split, "start_epoch", &rc);
    if (!s) return rc;
    uint64_t nb = s->has_data ? s->sampler.num_batches : 0;
    uint64_t first = 0;
    bool resumed = false;
    if ((rc = dc_first_batch(TOKP_SINK(self), &self->res, split, epoch, start_batch, nb, "", &first, &resumed)))
        return rc;
    if (!s->has_data) return KILN_OK;
    if (tok_sampler_start_epoch(&s->sampler, epoch, first) != TOK_OK)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INTERNAL, "tokens: start_epoch(%s) refused batch %" PRIu64,
                           dc_split_name(split), first);
    return KILN_OK;
}

static int32_t tokp_next(kiln_instance *self, int32_t split, kiln_batch *out) {
    int32_t rc;
    tokp_split *s = tokp_get_split(self, split, "next", &rc);
    if (!s) return rc;
    if (!out) return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG, "tokens: next needs an output batch");
    if (!s->has_data) return 0; /* empty split */
    uint32_t len = 0;
    int r = tok_sampler_next(&s->sampler, &len);
    if (r == TOK_EINVAL)
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE, "tokens: next(%s) before start_epoch(%s)",
                           dc_split_name(split), dc_split_name(split));
    if (r == 0) return 0;
    /* Views of the split's buffers, (len, T) inputs and targets. */
    kiln_tensor *t = s->tensors;
    memset(t, 0, 2 * sizeof *t);
    dc_view(&t[0], s->sampler.inputs, KILN_DTYPE_I32, len, self->block_size);
    dc_view(&t[1], s->sampler.targets, KILN_DTYPE_I32, len, self->block_size);
    return dc_batch(out, t, len);
}

/* ------------------------------------------------------------------------ */
/* state */

/*
 * Version 1 layout (little-endian, 56 bytes):
 *   u32 magic "KTOK"    u32 flags (DC_STATE_HAS_TRAIN)
 *   u64 epoch           u64 next_batch (the next train batch the host would receive)
 *   u64 num_batches     u64 seed (train batches per rank per epoch; the shuffle seed)
 *   u64 windows         (train windows over all ranks)
 *   u32 batch_size      u32 world_size
 * Without HAS_TRAIN every field after flags is 0. A state restored but not
 * yet applied is saved as it was restored.
 */
static int32_t tokp_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    int32_t rc;
    uint8_t *p = dc_state_blob(TOKP_SINK(self), state_version, data, size, TOKP_STATE_SIZE, &rc);
    if (!p) return rc;
    dc_resume pos = self->res; /* a state restored but not applied: as restored */
    uint32_t batch = self->restored_batch, world = self->restored_world;
    uint64_t nwin = self->restored_nwin;
    const tokp_split *tr = &self->split[KILN_SPLIT_TRAIN];
    if (!pos.restored) {
        pos = (dc_resume){0};
        batch = world = 0;
        nwin = 0;
        if (tr->has_data) {
            pos.flags = DC_STATE_HAS_TRAIN;
            pos.epoch = tr->sampler.epoch;
            pos.next = tr->sampler.started ? tr->sampler.next : 0;
            pos.nb = tr->sampler.num_batches;
            pos.seed = self->seed;
            nwin = tr->view.nwin;
            batch = tr->sampler.cfg.batch_size;
            world = tr->sampler.cfg.world_size;
        }
    }
    dc_put_position(p, TOKP_STATE_MAGIC, &pos);
    dc_put_le64(p + 40, nwin);
    dc_put_le32(p + 48, batch);
    dc_put_le32(p + 52, world);
    *state_version = TOKP_STATE_VERSION;
    *data = p;
    *size = TOKP_STATE_SIZE;
    return KILN_OK;
}

static int32_t tokp_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    uint32_t flags = 0;
    int32_t rc = dc_state_header(TOKP_SINK(self), state_version, data, size, TOKP_STATE_SIZE, TOKP_STATE_MAGIC,
                                 "a tokens", &flags);
    if (rc) return rc;
    const uint8_t *p = data;
    dc_resume pos = dc_get_position(p);
    const uint64_t epoch = pos.epoch, next = pos.next, nb = pos.nb, seed = pos.seed, nwin = dc_get_le64(p + 40);
    uint32_t batch = dc_get_le32(p + 48), world = dc_get_le32(p + 52);
    bool has = flags & DC_STATE_HAS_TRAIN;
    /* Every field bounded so nothing derived from it can index outside the data: the position lies in its
     * epoch, the epoch's batches fit the windows, and the sizes are ones create() could have accepted. */
    bool ok = has ? (nb >= 1 && next <= nb && batch >= 1 && batch <= TOKP_MAX_BATCH && world >= 1 &&
                     world <= INT32_MAX && nwin <= UINT32_MAX && nb <= nwin / world / batch)
                  : (epoch == 0 && next == 0 && nb == 0 && seed == 0 && nwin == 0 && batch == 0 && world == 0);
    if (!ok)
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                           "tokens: corrupt state: next batch %" PRIu64 " of %" PRIu64 " per epoch, %" PRIu64
                           " windows, batch_size %u, world size %u%s",
                           next, nb, nwin, batch, world, has ? "" : " (expected all 0 without train data)");
    const tokp_split *tr = &self->split[KILN_SPLIT_TRAIN];
    if (has && (rc = tokp_same_shape(self, nwin, nb, batch, world))) return rc;
    pos.restored = true;
    self->res = pos;
    self->restored_nwin = nwin;
    self->restored_batch = batch;
    self->restored_world = world;
    if (has && tr->has_data) {
        /* Already set up: the checkpoint's seed takes effect from the next start_epoch. */
        if (seed != self->seed)
            kiln_logf(self->svc, self->hctx, KILN_LOG_INFO,
                      "tokens: the checkpoint's shuffle seed replaces this run's (resuming its order)");
        self->seed = seed;
        tok_sampler_set_seed(&self->split[KILN_SPLIT_TRAIN].sampler, seed);
    }
    return KILN_OK;
}

/* ------------------------------------------------------------------------ */
/* Descriptor */

static const kiln_data_ops tokp_ops = {
    .base =
        {
            .struct_size = sizeof(kiln_data_ops),
            .create = tokp_create,
            .destroy = tokp_destroy,
            .get_state = tokp_get_state,
            .set_state = tokp_set_state,
        },
    .setup = tokp_setup,
    .num_batches = tokp_num_batches,
    .start_epoch = tokp_start_epoch,
    .next = tokp_next,
};

static const kiln_param tokp_params[] = {
    {"format", KILN_TYPE_STRING, 0, KILN_V_STR("llmc"),
     "\"llmc\": llm.c uint16 token shards; \"text\": raw text, one token per byte"},
    {"train", KILN_TYPE_STRING, KILN_PARAM_REQUIRED, KILN_V_NONE,
     "training files: a glob pattern (files sorted by name)"},
    {"val", KILN_TYPE_STRING, 0, KILN_V_STR(""), "validation files (glob); \"\" = none, or see val_fraction"},
    {"test", KILN_TYPE_STRING, 0, KILN_V_STR(""), "test files (glob); \"\" = the validation data"},
    {"val_fraction", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0),
     "with val = \"\": the last fraction of the train tokens validates (0 = no validation)"},
    {"exclude", KILN_TYPE_STRING, 0, KILN_V_STR(""),
     "skip every matched file whose name matches this pattern (fnmatch, e.g. \"*.*\"); \"\" = none"},
    {"batch_size", KILN_TYPE_INT, 0, KILN_V_INT(4), "windows per training batch B"},
    {"val_batch_size", KILN_TYPE_INT, 0, KILN_V_INT(0), "windows per validation/test batch; 0 = batch_size"},
    {"block_size", KILN_TYPE_INT, 0, KILN_V_INT(1024), "tokens per sample T (a window is T+1 tokens)"},
    {"vocab_size", KILN_TYPE_INT, 0, KILN_V_INT(TOKP_DEFAULT_VOCAB),
     "every token must be below it (>= 256 for text); GPT-2's 50257 by default"},
    {"shuffle", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1), "a new seeded order of the training windows every epoch"},
    {"seed", KILN_TYPE_INT, 0, KILN_V_INT(-1), "seed of the shuffle; -1 = derived from trainer.seed"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* No properties: a data plugin has nothing the host needs before create(). */
/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const tokp_checks[] = {"format in {llmc, text}", "val_fraction in [0, 1)", "batch_size >= 1", "val_batch_size >= 0", "block_size >= 1", "vocab_size >= 1"};
static const kiln_kv tokp_props[] = {
    {"config_checks", KILN_V_STRS(tokp_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc tokp_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_DATA,
    .name = "tokens",
    .version = "1.0.0",
    .description = "language-model batches (inputs, targets shifted by one) from llm.c token shards or byte-level text",
    .capabilities = KILN_CAP_STATEFUL | KILN_CAP_DETERMINISTIC,
    .properties = tokp_props,
    .params = tokp_params,
    .ops = &tokp_ops,
};

KILN_DEFINE_LIBRARY("tokens", "1.0.0", 1, &tokp_desc)
