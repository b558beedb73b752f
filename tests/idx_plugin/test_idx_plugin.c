/*
 * CUnit tests for the "idx" data plugin through its ABI, with the test host.
 * The suite writes small gzipped IDX files into a mkdtemp() folder: 100
 * training and 20 test images of 4x4 whose first pixel is the image's own
 * index and whose other pixels and labels are known functions of it, so every
 * row of every batch can be decoded back to the sample it holds and checked
 * in full (normalised pixels and label). On top of that it checks batch
 * counts and sizes, the validation split, shuffling and its determinism,
 * sharding, mid-epoch starts, get_state/set_state, the errors promised for bad
 * files and bad config, and the real Fashion-MNIST files when the Debian
 * package is installed.
 */
#define _POSIX_C_SOURCE 200809L

#include <CUnit/CUnit.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <kiln/testing.h>

#include "plugin_fixture.h"

#include "cunit_skip.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define NTRAIN 100
#define NTEST 20
#define ROWS 4
#define COLS 4
#define DIM (ROWS * COLS)

static char g_dir[64];
static const kiln_plugin_desc *g_desc;
static const kiln_data_ops *g_ops;

/* ------------------------------------------------------------------------ */
/* The synthetic data set */

static uint8_t train_px(uint32_t i, uint32_t d) {
    return d == 0 ? (uint8_t)i : (uint8_t)((i * 7u + d * 13u + (i * d) % 5u) & 255u);
}
static uint8_t test_px(uint32_t i, uint32_t d) {
    return d == 0 ? (uint8_t)i : (uint8_t)((i * 11u + d * 5u + 3u) & 255u);
}
static int train_label(uint32_t i) { return (int)((i * 3u + 1u) % 10u); }
static int test_label(uint32_t i) { return (int)((i * 7u + 2u) % 10u); }

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static char *path_in(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* Writes len bytes to g_dir/name, through gzopen when gz. */
static int write_file(const char *name, const uint8_t *b, size_t len, bool gz) {
    const char *path = path_in(name);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (!f) return -1;
        int ok = gzwrite(f, b, (unsigned)len) == (int)len;
        return gzclose(f) == Z_OK && ok ? 0 : -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(b, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

/* An IDX3 file of n images (header claims claim_n) from px(). */
static int write_images(const char *name, uint32_t n, uint32_t claim_n, uint8_t (*px)(uint32_t, uint32_t), bool gz) {
    size_t len = 16 + (size_t)n * DIM;
    uint8_t *b = malloc(len);
    if (!b) return -1;
    put_be32(b, 0x803);
    put_be32(b + 4, claim_n);
    put_be32(b + 8, ROWS);
    put_be32(b + 12, COLS);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t d = 0; d < DIM; d++) b[16 + (size_t)i * DIM + d] = px(i, d);
    int rc = write_file(name, b, len, gz);
    free(b);
    return rc;
}

static int write_labels(const char *name, uint32_t n, int (*lab)(uint32_t)) {
    uint8_t b[8 + NTRAIN];
    put_be32(b, 0x801);
    put_be32(b + 4, n);
    for (uint32_t i = 0; i < n; i++) b[8 + i] = (uint8_t)lab(i);
    return write_file(name, b, 8 + n, true);
}

static const char *const g_names[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                      "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
                                      "short-images.raw"};

static int suite_init(void) {
    strcpy(g_dir, "/tmp/kiln-idxp-test-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    if (write_images(g_names[0], NTRAIN, NTRAIN, train_px, true) || write_labels(g_names[1], NTRAIN, train_label) ||
        write_images(g_names[2], NTEST, NTEST, test_px, true) || write_labels(g_names[3], NTEST, test_label) ||
        write_images(g_names[4], 50, NTRAIN, train_px, false)) /* header says 100, holds 50 */
        return -1;
    if (fixture_need_plugin_dir()) return -1;
    g_desc = fixture_load_plugin(g_th, "idx", KILN_KIND_DATA, "idx");
    if (!g_desc) return -1;
    g_ops = g_desc->ops;
    return 0;
}

static int suite_clean(void) {
    for (size_t i = 0; i < sizeof g_names / sizeof g_names[0]; i++) unlink(path_in(g_names[i]));
    return rmdir(g_dir) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* Config and instance helpers */

typedef struct cfg {
    const char *dir, *train_images, *train_labels, *test_images, *test_labels;
    int64_t num_classes, batch_size, val_batch_size, val_split, prefetch;
    bool shuffle, drop_last;
    double mean, std;
} cfg;

/* The test's usual config: the synthetic files, B = 32 train / 8 eval, 20 held out. */
static cfg cfg_small(void) {
    cfg c = {g_dir, g_names[0], g_names[1], g_names[2], g_names[3], 10, 32, 8, 20, 2, true, false, 0.2860, 0.3530};
    return c;
}

/* The plugin's declared defaults (what the host fills in for an empty section). */
static cfg cfg_defaults(void) {
    cfg c = {FMNIST_DIR, g_names[0], g_names[1], g_names[2], g_names[3], 10, 128, 0, 5000, 2, true, false,
             0.2860, 0.3530};
    return c;
}

/* Every declared key, typed, in the order the host passes them. */
static const fixture_key g_keys[] = {
    {"dir", KILN_TYPE_STRING, offsetof(cfg, dir), 0},
    {"train_images", KILN_TYPE_STRING, offsetof(cfg, train_images), 0},
    {"train_labels", KILN_TYPE_STRING, offsetof(cfg, train_labels), 0},
    {"test_images", KILN_TYPE_STRING, offsetof(cfg, test_images), 0},
    {"test_labels", KILN_TYPE_STRING, offsetof(cfg, test_labels), 0},
    {"num_classes", KILN_TYPE_INT, offsetof(cfg, num_classes), 0},
    {"batch_size", KILN_TYPE_INT, offsetof(cfg, batch_size), 0},
    {"val_batch_size", KILN_TYPE_INT, offsetof(cfg, val_batch_size), 0},
    {"val_split", KILN_TYPE_INT, offsetof(cfg, val_split), 0},
    {"shuffle", KILN_TYPE_BOOL, offsetof(cfg, shuffle), 0},
    {"drop_last", KILN_TYPE_BOOL, offsetof(cfg, drop_last), 0},
    {"normalize_mean", KILN_TYPE_FLOAT, offsetof(cfg, mean), 0},
    {"normalize_std", KILN_TYPE_FLOAT, offsetof(cfg, std), 0},
    {"prefetch", KILN_TYPE_INT, offsetof(cfg, prefetch), 0},
};
#define N_KEYS (sizeof g_keys / sizeof g_keys[0])
static kiln_kv g_kv[N_KEYS + 1];

/* The resolved config the host would pass: every declared key, typed. */
static const kiln_kv *kv_of(const cfg *c) { return fixture_kv_of(g_keys, N_KEYS, c, g_kv); }

static int32_t create(const cfg *c, kiln_instance **inst) { return fixture_create_desc(g_desc, g_th, kv_of(c), inst); }

/* A created and set-up instance, or NULL (and a failed assertion). */
static kiln_instance *make(const cfg *c, int32_t stage, int32_t rank, int32_t world) {
    kiln_instance *in = NULL;
    int32_t rc = create(c, &in);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    if (rc != KILN_OK) return NULL;
    rc = g_ops->setup(in, stage, rank, world);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    if (rc != KILN_OK) {
        fprintf(stderr, "setup: %s\n", kiln_test_error(g_th));
        g_ops->base.destroy(in);
        return NULL;
    }
    return in;
}

static int64_t nbatches(kiln_instance *in, int32_t split) {
    int64_t n = -1;
    CU_ASSERT_EQUAL(g_ops->num_batches(in, split, &n), KILN_OK);
    return n;
}

/*
 * One pass over `split` from (epoch, start): ids gets the sample index of
 * every row (decoded from pixel 0, then the whole row and the label are
 * checked against the file's values, normalised with c's mean/std), sizes the
 * batch sizes. Returns the number of batches, -1 on a failure.
 */
static int run_pass(kiln_instance *in, const cfg *c, int32_t split, uint64_t epoch, int64_t start, int *ids,
                    int *nids, int *sizes) {
    if (g_ops->start_epoch(in, split, epoch, start) != KILN_OK) return -1;
    const bool test = split == KILN_SPLIT_TEST;
    const float mean = (float)c->mean, std = (float)c->std;
    int nb = 0, ni = 0, bad = 0;
    kiln_batch b;
    int32_t rc;
    while ((rc = g_ops->next(in, split, &b)) == 1) {
        if (b.ntensors != 2 || b.tensors[0].dtype != KILN_DTYPE_F32 || b.tensors[1].dtype != KILN_DTYPE_I32 ||
            b.tensors[0].ndim != 2 || b.tensors[1].ndim != 1 || b.tensors[0].shape[0] != b.size ||
            b.tensors[0].shape[1] != DIM || b.tensors[1].shape[0] != b.size || b.size < 1 ||
            b.struct_size != sizeof(kiln_batch))
            return -1;
        for (int k = 2; k < KILN_MAX_DIMS; k++) /* unused dims are 1 */
            if (b.tensors[0].shape[k] != 1 || b.tensors[1].shape[k - 1] != 1) return -1;
        const float *x = b.tensors[0].data;   /* (B, DIM) */
        const int32_t *y = b.tensors[1].data; /* (B) */
        for (int64_t r = 0; r < b.size; r++) {
            int id = (int)lrintf((x[r * DIM] * std + mean) * 255.0f);
            if (id < 0 || id >= (test ? NTEST : NTRAIN)) return -1;
            for (uint32_t d = 0; d < DIM; d++) {
                uint8_t p = test ? test_px((uint32_t)id, d) : train_px((uint32_t)id, d);
                float want = ((float)p / 255.0f - mean) / std;
                if (fabsf(x[r * DIM + d] - want) > 1e-6f) bad++;
            }
            if (y[r] != (test ? test_label((uint32_t)id) : train_label((uint32_t)id))) bad++;
            if (ids) ids[ni] = id;
            ni++;
        }
        if (sizes) sizes[nb] = (int)b.size;
        nb++;
    }
    if (rc != 0 || bad) return -1;
    if (nids) *nids = ni;
    return nb;
}

/* ------------------------------------------------------------------------ */
/* Tests */

static void test_descriptor(void) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(g_desc);
    CU_ASSERT_EQUAL(g_desc->kind, KILN_KIND_DATA);
    CU_ASSERT_STRING_EQUAL(g_desc->name, "idx");
    CU_ASSERT(g_desc->capabilities & KILN_CAP_STATEFUL);
    CU_ASSERT(g_ops->base.struct_size >= sizeof(kiln_data_ops));
    CU_ASSERT_PTR_NOT_NULL(g_ops->base.get_state);
    CU_ASSERT_PTR_NOT_NULL(g_ops->base.set_state);
    static const char *const keys[] = {"dir", "train_images", "train_labels", "test_images", "test_labels",
                                       "num_classes", "batch_size", "val_batch_size", "val_split", "shuffle",
                                       "drop_last", "normalize_mean", "normalize_std", "prefetch"};
    int n = 0;
    for (const kiln_param *p = g_desc->params; p && p->key; p++) {
        n++;
        CU_ASSERT(p->help && p->help[0]);
        CU_ASSERT_EQUAL(p->def.type, p->type);
    }
    CU_ASSERT_EQUAL(n, (int)(sizeof keys / sizeof keys[0]));
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const kiln_param *p = g_desc->params;
        while (p->key && strcmp(p->key, keys[i])) p++;
        CU_ASSERT_PTR_NOT_NULL(p->key);
    }
    /* A few defaults the brief fixes. */
    for (const kiln_param *p = g_desc->params; p->key; p++) {
        if (!strcmp(p->key, "dir")) CU_ASSERT_STRING_EQUAL(p->def.v.s, FMNIST_DIR);
        if (!strcmp(p->key, "batch_size")) CU_ASSERT_EQUAL(p->def.v.i, 128);
        if (!strcmp(p->key, "val_split")) CU_ASSERT_EQUAL(p->def.v.i, 5000);
        if (!strcmp(p->key, "shuffle")) CU_ASSERT_EQUAL(p->def.v.i, 1);
        if (!strcmp(p->key, "normalize_std")) CU_ASSERT_DOUBLE_EQUAL(p->def.v.f, 0.3530, 1e-12);
    }
}

static void test_num_batches(void) {
    kiln_test_reset(g_th);
    cfg c = cfg_small();
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), 3); /* 80 = 32 + 32 + 16 */
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_VAL), 3);   /* 20 = 8 + 8 + 4 */
    int64_t n = 7;
    CU_ASSERT_EQUAL(g_ops->num_batches(in, KILN_SPLIT_TEST, &n), KILN_E_STATE); /* not set up by FIT */
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "test"));
    CU_ASSERT_EQUAL(g_ops->num_batches(in, 3, &n), KILN_E_INVALID_ARG);
    int sizes[16], ni = 0;
    CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_TRAIN, 0, 0, NULL, &ni, sizes), 3);
    CU_ASSERT(sizes[0] == 32 && sizes[1] == 32 && sizes[2] == 16 && ni == 80);
    CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_VAL, 0, 0, NULL, &ni, sizes), 3);
    CU_ASSERT(sizes[0] == 8 && sizes[1] == 8 && sizes[2] == 4 && ni == 20);
    /* TEST on the same instance keeps the FIT splits. */
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_TEST, 0, 1), KILN_OK);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TEST), 3); /* 20 = 8 + 8 + 4 */
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), 3);
    g_ops->base.destroy(in);

    /* drop_last drops the short train batch only. */
    c.drop_last = true;
    in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), 2);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_VAL), 3);
    CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_TRAIN, 0, 0, NULL, &ni, sizes), 2);
    CU_ASSERT(sizes[0] == 32 && sizes[1] == 32 && ni == 64);
    g_ops->base.destroy(in);

    /* val_batch_size 0 means batch_size: 20 val images in one batch of 20. */
    c = cfg_small();
    c.val_batch_size = 0;
    in = make(&c, KILN_STAGE_VALIDATE, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_VAL), 1);
    CU_ASSERT_EQUAL(g_ops->num_batches(in, KILN_SPLIT_TRAIN, &n), KILN_E_STATE); /* VALIDATE sets up val only */
    CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_VAL, 0, 0, NULL, &ni, sizes), 1);
    CU_ASSERT(sizes[0] == 20);
    g_ops->base.destroy(in);
}

static void test_val_first_batch(void) {
    kiln_test_reset(g_th);
    cfg c = cfg_small();
    c.mean = 0.5;
    c.std = 0.25;
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_VAL, 0, 0), KILN_OK);
    kiln_batch b;
    memset(&b, 0, sizeof b);
    CU_ASSERT_EQUAL_FATAL(g_ops->next(in, KILN_SPLIT_VAL, &b), 1);
    CU_ASSERT_EQUAL(b.size, 8);
    CU_ASSERT_EQUAL(b.ntensors, 2);
    CU_ASSERT_EQUAL(b.tensors[0].shape[0], 8);
    CU_ASSERT_EQUAL(b.tensors[0].shape[1], DIM);
    const float *x = b.tensors[0].data;   /* (8, DIM) */
    const int32_t *y = b.tensors[1].data; /* (8) */
    int bad = 0;
    for (int r = 0; r < 8; r++) { /* the val split is images 80..99, unshuffled */
        uint32_t i = 80u + (uint32_t)r;
        if (y[r] != train_label(i)) bad++;
        for (uint32_t d = 0; d < DIM; d++) {
            float want = ((float)train_px(i, d) / 255.0f - 0.5f) / 0.25f;
            if (fabsf(x[r * DIM + d] - want) > 1e-6f) bad++;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_DOUBLE_EQUAL(x[0], ((80.0 / 255.0) - 0.5) / 0.25, 1e-5);
    /* Val is never shuffled, whatever the epoch: 80..99 in order. */
    int ids[NTRAIN], ni = 0;
    CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_VAL, 5, 0, ids, &ni, NULL), 3);
    CU_ASSERT_EQUAL(ni, 20);
    for (int k = 0; k < ni; k++) bad += ids[k] != 80 + k;
    CU_ASSERT_EQUAL(bad, 0);
    /* Test split: the test file, in order. */
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_TEST, 0, 1), KILN_OK);
    CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_TEST, 0, 0, ids, &ni, NULL), 3);
    CU_ASSERT_EQUAL(ni, NTEST);
    for (int k = 0; k < ni; k++) bad += ids[k] != k;
    CU_ASSERT_EQUAL(bad, 0);
    g_ops->base.destroy(in);
}

/* Train ids of `epochs` consecutive epochs of a fresh instance with run seed `seed`. */
static int train_ids(uint64_t seed, bool shuffle, int epochs, int ids[][NTRAIN]) {
    kiln_test_reset(g_th);
    kiln_test_set_seed(g_th, seed);
    cfg c = cfg_small();
    c.shuffle = shuffle;
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    if (!in) return -1;
    int ok = 0;
    for (int e = 0; e < epochs; e++) {
        int ni = 0;
        if (run_pass(in, &c, KILN_SPLIT_TRAIN, (uint64_t)e, 0, ids[e], &ni, NULL) != 3 || ni != 80) ok = -1;
    }
    g_ops->base.destroy(in);
    return ok;
}

/* 1 when ids[0..n) is a permutation of 0..n-1. */
static int is_perm(const int *ids, int n) {
    char seen[NTRAIN] = {0};
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n || seen[ids[i]]) return 0;
        seen[ids[i]] = 1;
    }
    return 1;
}

static void test_train_shuffle(void) {
    static int a[3][NTRAIN], b[3][NTRAIN], s[1][NTRAIN], o[2][NTRAIN];
    CU_ASSERT_EQUAL_FATAL(train_ids(1234, true, 3, a), 0);
    CU_ASSERT_EQUAL_FATAL(train_ids(1234, true, 3, b), 0);
    CU_ASSERT_EQUAL_FATAL(train_ids(999, true, 1, s), 0);
    CU_ASSERT_EQUAL_FATAL(train_ids(1234, false, 2, o), 0);
    for (int e = 0; e < 3; e++) {
        CU_ASSERT(is_perm(a[e], 80)); /* every train image once, never a val image (80..99) */
        CU_ASSERT(memcmp(a[e], b[e], 80 * sizeof(int)) == 0); /* same seed: same order */
    }
    CU_ASSERT(memcmp(a[0], a[1], 80 * sizeof(int)) != 0); /* epochs differ */
    CU_ASSERT(memcmp(a[1], a[2], 80 * sizeof(int)) != 0);
    CU_ASSERT(memcmp(a[0], s[0], 80 * sizeof(int)) != 0); /* another seed: another order */
    int inorder = 0;
    for (int e = 0; e < 2; e++)
        for (int k = 0; k < 80; k++) inorder += o[e][k] == k;
    CU_ASSERT_EQUAL(inorder, 160); /* shuffle = false: file order every epoch */
}

static void test_start_epoch_mid(void) {
    kiln_test_reset(g_th);
    kiln_test_set_seed(g_th, 77);
    cfg c = cfg_small();
    c.batch_size = 16; /* 5 batches of 16 */
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    int full[NTRAIN], part[NTRAIN], ni = 0;
    CU_ASSERT_EQUAL_FATAL(run_pass(in, &c, KILN_SPLIT_TRAIN, 3, 0, full, &ni, NULL), 5);
    for (int k = 1; k <= 4; k++) {
        CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_TRAIN, 3, k, part, &ni, NULL), 5 - k);
        CU_ASSERT_EQUAL(ni, 80 - 16 * k);
        CU_ASSERT(memcmp(part, full + 16 * k, (size_t)ni * sizeof(int)) == 0); /* batch k.. of the full pass */
    }
    /* Restart in the middle of an epoch (after one batch), at another batch. */
    kiln_batch b;
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_TRAIN, 3, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->next(in, KILN_SPLIT_TRAIN, &b), 1);
    CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_TRAIN, 3, 2, part, &ni, NULL), 3);
    CU_ASSERT(memcmp(part, full + 32, 48 * sizeof(int)) == 0);
    /* start_batch == num_batches: an empty epoch; beyond it: an error. */
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_TRAIN, 3, 5), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->next(in, KILN_SPLIT_TRAIN, &b), 0);
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_TRAIN, 3, 6), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "6"));
    g_ops->base.destroy(in);
}

static void test_sharding(void) {
    kiln_test_reset(g_th);
    kiln_test_set_seed(g_th, 5);
    cfg c = cfg_small();
    int tr[2][NTRAIN], va[2][NTRAIN], nt[2], nv[2];
    for (int r = 0; r < 2; r++) {
        kiln_instance *in = make(&c, KILN_STAGE_FIT, r, 2);
        CU_ASSERT_PTR_NOT_NULL_FATAL(in);
        CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), 2); /* 40 per rank: 32 + 8 */
        CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_VAL), 2);   /* 10 per rank: 8 + 2 */
        CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_TRAIN, 1, 0, tr[r], &nt[r], NULL), 2);
        CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_VAL, 1, 0, va[r], &nv[r], NULL), 2);
        g_ops->base.destroy(in);
    }
    CU_ASSERT(nt[0] == 40 && nt[1] == 40 && nv[0] == 10 && nv[1] == 10);
    int all[NTRAIN];
    memcpy(all, tr[0], 40 * sizeof(int));
    memcpy(all + 40, tr[1], 40 * sizeof(int));
    CU_ASSERT(is_perm(all, 80)); /* the two shards partition the train split */
    int bad = 0;
    for (int k = 0; k < 10; k++) bad += va[0][k] != 80 + 2 * k || va[1][k] != 81 + 2 * k;
    CU_ASSERT_EQUAL(bad, 0); /* val: strided, unshuffled */
    /* drop_last with 2 ranks: 40 per rank -> one batch of 32. */
    c.drop_last = true;
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 1, 2);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), 1);
    g_ops->base.destroy(in);
}

static void test_empty_val(void) {
    kiln_test_reset(g_th);
    cfg c = cfg_small();
    c.val_split = 0;
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), 4); /* all 100: 32 + 32 + 32 + 4 */
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_VAL), 0);
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_VAL, 0, 0), KILN_OK);
    kiln_batch b;
    CU_ASSERT_EQUAL(g_ops->next(in, KILN_SPLIT_VAL, &b), 0);
    int ids[NTRAIN], ni = 0;
    CU_ASSERT_EQUAL(run_pass(in, &c, KILN_SPLIT_TRAIN, 0, 0, ids, &ni, NULL), 4);
    CU_ASSERT(ni == 100 && is_perm(ids, 100));
    g_ops->base.destroy(in);
}

/* Decodes a version-1 blob's fields. */
static void blob_fields(const void *data, uint64_t *epoch, uint64_t *next, uint64_t *nb) {
    const uint8_t *p = data;
    uint64_t v[3] = {0, 0, 0};
    for (int f = 0; f < 3; f++)
        for (int i = 0; i < 8; i++) v[f] |= (uint64_t)p[8 + 8 * f + i] << (8 * i);
    *epoch = v[0];
    *next = v[1];
    *nb = v[2];
}

static void test_state(void) {
    kiln_test_reset(g_th);
    kiln_test_set_seed(g_th, 31337);
    cfg c = cfg_small();
    c.batch_size = 16;
    kiln_instance *a = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    /* Before the first epoch: position (0, 0). */
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    uint64_t e, nx, nb;
    CU_ASSERT_EQUAL(g_ops->base.get_state(a, &ver, &blob, &size), KILN_OK);
    CU_ASSERT(ver == 1 && size == 40 && blob);
    blob_fields(blob, &e, &nx, &nb);
    CU_ASSERT(e == 0 && nx == 0 && nb == 5);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);

    /* a: epoch 1, two batches consumed -> (1, 2). */
    int full[NTRAIN], rest[NTRAIN], ni = 0;
    CU_ASSERT_EQUAL_FATAL(run_pass(a, &c, KILN_SPLIT_TRAIN, 1, 0, full, &ni, NULL), 5);
    CU_ASSERT_EQUAL(g_ops->start_epoch(a, KILN_SPLIT_TRAIN, 1, 0), KILN_OK);
    kiln_batch b;
    CU_ASSERT_EQUAL(g_ops->next(a, KILN_SPLIT_TRAIN, &b), 1);
    CU_ASSERT_EQUAL(g_ops->next(a, KILN_SPLIT_TRAIN, &b), 1);
    CU_ASSERT_EQUAL(g_ops->base.get_state(a, &ver, &blob, &size), KILN_OK);
    blob_fields(blob, &e, &nx, &nb);
    CU_ASSERT(ver == 1 && e == 1 && nx == 2 && nb == 5);
    g_ops->base.destroy(a);

    /* b: restore before setup (as a host restoring a checkpoint would), then resume with start_batch -1. */
    kiln_instance *bi = NULL;
    CU_ASSERT_EQUAL_FATAL(create(&c, &bi), KILN_OK);
    fixture_data_restore(g_th, g_ops, bi, ver, blob, size);
    void *blob2 = NULL;
    size_t size2 = 0;
    CU_ASSERT_EQUAL(run_pass(bi, &c, KILN_SPLIT_TRAIN, 1, -1, rest, &ni, NULL), 3);
    CU_ASSERT(ni == 48 && memcmp(rest, full + 32, 48 * sizeof(int)) == 0); /* batches 2..4 of epoch 1 */
    CU_ASSERT_EQUAL(g_ops->base.get_state(bi, &ver, &blob2, &size2), KILN_OK);
    blob_fields(blob2, &e, &nx, &nb);
    CU_ASSERT(e == 1 && nx == 5 && nb == 5); /* epoch finished */
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob2);
    /* The restored position was consumed: -1 now means batch 0. */
    CU_ASSERT_EQUAL(run_pass(bi, &c, KILN_SPLIT_TRAIN, 1, -1, rest, &ni, NULL), 5);
    CU_ASSERT(memcmp(rest, full, 80 * sizeof(int)) == 0);
    /* A restored position of another epoch does not apply. */
    CU_ASSERT_EQUAL(g_ops->base.set_state(bi, ver, blob, size), KILN_OK);
    CU_ASSERT_EQUAL(run_pass(bi, &c, KILN_SPLIT_TRAIN, 2, -1, rest, &ni, NULL), 5);
    g_ops->base.destroy(bi);

    /* Refusals: another version, a cut blob, a bad magic, another batch count. */
    c.batch_size = 32; /* 3 batches per epoch, the blob says 5 */
    kiln_instance *d = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 2, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "version 2"));
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, blob, size - 1), KILN_E_STATE);
    uint8_t bad[40];
    memcpy(bad, blob, 40);
    bad[0] ^= 0xff;
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, bad, 40), KILN_E_STATE);
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "5"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "3"));
    g_ops->base.destroy(d);
    /* Set before setup, the mismatch is caught when the position is applied. */
    CU_ASSERT_EQUAL_FATAL(create(&c, &d), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, blob, size), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->setup(d, KILN_STAGE_FIT, 0, 1), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->start_epoch(d, KILN_SPLIT_TRAIN, 1, -1), KILN_E_STATE);
    g_ops->base.destroy(d);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
}

static void test_call_order_errors(void) {
    kiln_test_reset(g_th);
    cfg c = cfg_small();
    kiln_instance *in = NULL;
    CU_ASSERT_EQUAL_FATAL(create(&c, &in), KILN_OK);
    int64_t n;
    kiln_batch b;
    CU_ASSERT_EQUAL(g_ops->num_batches(in, KILN_SPLIT_TRAIN, &n), KILN_E_STATE);
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_VAL, 0, 0), KILN_E_STATE);
    CU_ASSERT_EQUAL(g_ops->next(in, KILN_SPLIT_TEST, &b), KILN_E_STATE);
    CU_ASSERT_EQUAL(g_ops->setup(in, 9, 0, 1), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_FIT, 2, 2), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_FIT, 0, 0), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_FIT, 0, 1), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->next(in, KILN_SPLIT_TRAIN, &b), KILN_E_STATE); /* before start_epoch */
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "start_epoch"));
    CU_ASSERT_EQUAL(g_ops->next(in, -1, &b), KILN_E_INVALID_ARG);
    /* A val batch stays valid while the train split moves on (separate tensor arrays and buffers). */
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_TRAIN, 0, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_VAL, 0, 0), KILN_OK);
    kiln_batch vb;
    CU_ASSERT_EQUAL_FATAL(g_ops->next(in, KILN_SPLIT_VAL, &vb), 1);
    const int32_t *vy = vb.tensors[1].data;
    for (int k = 0; k < 3; k++) CU_ASSERT_EQUAL(g_ops->next(in, KILN_SPLIT_TRAIN, &b), 1);
    CU_ASSERT(vb.tensors != b.tensors);
    CU_ASSERT_EQUAL(vb.tensors[0].shape[0], 8);
    CU_ASSERT_PTR_EQUAL(vb.tensors[1].data, vy);
    int bad = 0;
    for (int k = 0; k < 8; k++) bad += vy[k] != train_label(80u + (uint32_t)k);
    CU_ASSERT_EQUAL(bad, 0);
    /* Destroy with prefetch threads mid-epoch (train finished, val mid-way). */
    g_ops->base.destroy(in);
}

/* setup's error: code, and text containing both needles (needle2 may be NULL). */
static void expect_setup_error(const cfg *c, int32_t stage, int32_t code, const char *needle, const char *needle2) {
    kiln_instance *in = NULL;
    CU_ASSERT_EQUAL_FATAL(create(c, &in), KILN_OK); /* create reads no file */
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(g_ops->setup(in, stage, 0, 1), code);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), needle));
    if (needle2) CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), needle2));
    if (!strstr(kiln_test_error(g_th), needle) || (needle2 && !strstr(kiln_test_error(g_th), needle2)))
        fprintf(stderr, "\n  unexpected message: %s\n", kiln_test_error(g_th));
    int64_t n;
    CU_ASSERT_EQUAL(g_ops->num_batches(in, stage == KILN_STAGE_TEST ? KILN_SPLIT_TEST : KILN_SPLIT_TRAIN, &n),
                    KILN_E_STATE);
    g_ops->base.destroy(in);
}

static void test_setup_errors(void) {
    kiln_test_reset(g_th);
    cfg c = cfg_small();
    c.train_images = "no-such-images.gz";
    expect_setup_error(&c, KILN_STAGE_FIT, KILN_E_IO, path_in("no-such-images.gz"), NULL);
    c = cfg_small();
    c.test_labels = "missing-labels.gz";
    expect_setup_error(&c, KILN_STAGE_TEST, KILN_E_IO, path_in("missing-labels.gz"), NULL);
    c = cfg_small();
    c.train_images = g_names[1]; /* a label file where images are expected */
    expect_setup_error(&c, KILN_STAGE_FIT, KILN_E_DATA, path_in(g_names[1]), "magic");
    c = cfg_small();
    c.train_images = g_names[4]; /* header says 100 images, file holds 50 */
    expect_setup_error(&c, KILN_STAGE_VALIDATE, KILN_E_DATA, path_in(g_names[4]), "truncated");
    c = cfg_small();
    c.test_labels = g_names[1]; /* 100 labels for 20 test images */
    expect_setup_error(&c, KILN_STAGE_TEST, KILN_E_DATA, "100", "20");
    c = cfg_small();
    c.num_classes = 5; /* labels go up to 9 */
    expect_setup_error(&c, KILN_STAGE_FIT, KILN_E_DATA, path_in(g_names[1]), "num_classes 5");
    c = cfg_small();
    c.val_split = 150;
    expect_setup_error(&c, KILN_STAGE_FIT, KILN_E_CONFIG, "150", "100");
    c.val_split = 100;
    expect_setup_error(&c, KILN_STAGE_VALIDATE, KILN_E_CONFIG, "val_split is 100", "only 100");
    c = cfg_small();
    c.batch_size = 81;
    c.drop_last = true; /* 80 train images: no full batch */
    expect_setup_error(&c, KILN_STAGE_FIT, KILN_E_CONFIG, "batch_size", NULL);
}

static void test_paths(void) {
    kiln_test_reset(g_th);
    cfg c = cfg_small();
    char dir_slash[80];
    snprintf(dir_slash, sizeof dir_slash, "%s/", g_dir);
    c.dir = dir_slash; /* a trailing slash is fine */
    kiln_instance *in = make(&c, KILN_STAGE_TEST, 0, 1);
    CU_ASSERT_PTR_NOT_NULL(in);
    if (in) g_ops->base.destroy(in);
    /* Absolute names ignore dir. */
    char img[256], lab[256];
    snprintf(img, sizeof img, "%s", path_in(g_names[0]));
    snprintf(lab, sizeof lab, "%s", path_in(g_names[1]));
    c = cfg_small();
    c.dir = "/nonexistent-kiln-dir";
    c.train_images = img;
    c.train_labels = lab;
    in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), 3);
    /* ... while relative ones still resolve against it. */
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_TEST, 0, 1), KILN_E_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "/nonexistent-kiln-dir/t10k-images-idx3-ubyte.gz"));
    g_ops->base.destroy(in);
}

/* Each refused alone in the usual config. */
static const fixture_bad_value g_bad[] = {
    {"batch_size", KILN_V_INT(0)},          {"batch_size", KILN_V_INT(-4)},
    {"val_batch_size", KILN_V_INT(-1)},     {"val_split", KILN_V_INT(-1)},
    {"num_classes", KILN_V_INT(0)},         {"num_classes", KILN_V_INT(257)},
    {"prefetch", KILN_V_INT(-1)},           {"prefetch", KILN_V_INT(17)},
    {"normalize_std", KILN_V_FLOAT(0.0)},   {"normalize_std", KILN_V_FLOAT(-0.5)},
    {"normalize_std", KILN_V_FLOAT(NAN)},   {"normalize_mean", KILN_V_FLOAT(INFINITY)},
    {"train_images", KILN_V_STR("")},       {"test_labels", KILN_V_STR("")},
};

static void test_bad_config(void) {
    kiln_test_reset(g_th);
    cfg c = cfg_small();
    fixture_expect_refused_each(g_desc, g_th, kv_of(&c), g_bad, sizeof g_bad / sizeof g_bad[0]);
    /* And a good one reads no file: create succeeds even when dir does not exist. */
    c.dir = "/nonexistent-kiln-dir";
    kiln_instance *in = NULL;
    CU_ASSERT_EQUAL(create(&c, &in), KILN_OK);
    CU_ASSERT_PTR_NOT_NULL(in);
    if (in) g_ops->base.destroy(in);
}

static void test_fashion_mnist(void) {
    struct stat st;
    if (stat(FMNIST_DIR "/t10k-images-idx3-ubyte.gz", &st) != 0) {
        cunit_skip_case(FMNIST_DIR " is not installed (Debian package dataset-fashion-mnist)");
        return;
    }
    kiln_test_reset(g_th);
    cfg c = cfg_defaults();
    kiln_instance *in = make(&c, KILN_STAGE_TEST, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TEST), 79);
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_TEST, 0, 0), KILN_OK);
    const float lo = (0.0f - 0.2860f) / 0.3530f, hi = (1.0f - 0.2860f) / 0.3530f;
    int counts[10] = {0}, nb = 0, full = 0, bad = 0;
    int64_t total = 0, last = 0;
    kiln_batch b;
    int32_t rc;
    while ((rc = g_ops->next(in, KILN_SPLIT_TEST, &b)) == 1) {
        const float *x = b.tensors[0].data;   /* (B, 784) */
        const int32_t *y = b.tensors[1].data; /* (B) */
        if (b.tensors[0].shape[1] != 784) bad++;
        for (int64_t i = 0; i < b.size; i++) {
            if (y[i] < 0 || y[i] > 9) bad++;
            else counts[y[i]]++;
        }
        for (int64_t i = 0; i < b.size * 784; i++) bad += x[i] < lo - 1e-5f || x[i] > hi + 1e-5f;
        if (nb == 0) {
            /* t10k starts with labels 9 2 1 1 6, and image 0's pixels sum to 33456. */
            bad += y[0] != 9 || y[1] != 2 || y[2] != 1 || y[3] != 1 || y[4] != 6;
            double sum = 0;
            for (int d = 0; d < 784; d++) sum += ((double)x[d] * 0.3530 + 0.2860) * 255.0;
            CU_ASSERT_DOUBLE_EQUAL(sum, 33456.0, 0.5);
        }
        full += b.size == 128;
        total += b.size;
        last = b.size;
        nb++;
    }
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_EQUAL(nb, 79);
    CU_ASSERT_EQUAL(full, 78);
    CU_ASSERT_EQUAL(last, 16);
    CU_ASSERT_EQUAL(total, 10000);
    CU_ASSERT_EQUAL(bad, 0);
    for (int k = 0; k < 10; k++) CU_ASSERT_EQUAL(counts[k], 1000); /* Fashion-MNIST's test set is balanced */
    /* FIT on the real training file: 55000 train (430 batches), 5000 val (40). */
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_FIT, 0, 1), KILN_OK);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), 430);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_VAL), 40);
    g_ops->base.destroy(in);
}

static CU_TestInfo cases_idx_plugin[] = {
    {"descriptor and declared keys", test_descriptor},
    {"num_batches with and without drop_last", test_num_batches},
    {"first val batch equals the file, normalised", test_val_first_batch},
    {"train shuffle: per epoch, deterministic per seed", test_train_shuffle},
    {"start_epoch(k) equals batch k of a full pass", test_start_epoch_mid},
    {"sharding over two ranks", test_sharding},
    {"val_split 0 gives an empty val split", test_empty_val},
    {"get_state / set_state resume", test_state},
    {"calls out of order", test_call_order_errors},
    {"setup errors name the file and numbers", test_setup_errors},
    {"relative and absolute file names", test_paths},
    {"bad config fails create naming the key", test_bad_config},
    {"real Fashion-MNIST test split", test_fashion_mnist},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "idx_plugin", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_idx_plugin},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
