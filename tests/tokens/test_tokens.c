/*
 * CUnit tests for the "tokens" data plugin through its ABI, with the mock
 * host, and for kiln-text2tokens. The suite writes small llm.c shards into a
 * mkdtemp() folder whose token at position i of shard s is s*4096 + i, so the
 * first input token of every row names the shard and the window it came
 * from, and every token of every row can be checked (inputs = the window's
 * first T tokens, targets = the same shifted by one). On top of that: the
 * sequential and the seeded shuffled orders, two- and three-rank sharding,
 * mid-epoch starts, get_state/set_state with hostile blobs, the byte-level
 * text format and its val_fraction split, one error per malformed shard (the
 * message must name the file), a FIFO refused without hanging, bad config,
 * and the converter's round trip.
 */
#define _POSIX_C_SOURCE 200809L

#include <CUnit/CUnit.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kiln/testing.h>

#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

#define T 16               /* block_size of most tests */
#define B 5                /* batch_size of most tests */
#define NSHARDS 3
#define MAXW 4096          /* windows any test records */

/* Train shards: 401, 161 and 241 tokens give 25 + 10 + 15 = 50 windows of T = 16. */
static const uint32_t g_ntok[NSHARDS] = {401, 161, 241};
#define NWIN 50
#define VAL_NTOK 100       /* val shard: (100 - 1) / 16 = 6 windows */
#define VAL_NWIN 6

static char g_dir[64];
static const kiln_plugin_desc *g_desc;
static const kiln_data_ops *g_ops;

/* ------------------------------------------------------------------------ */
/* Files */

static char *path_in(const char *name) {
    static char buf[8][256];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static int write_bytes(const char *name, const void *b, size_t len) {
    FILE *f = fopen(path_in(name), "wb");
    if (!f) return -1;
    size_t w = fwrite(b, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

/* An llm.c shard: header (magic, version, claim) then n tokens tok(i), then `extra` zero bytes. */
static int write_shard(const char *name, int32_t magic, int32_t version, uint32_t claim, uint32_t n, uint32_t base,
                       size_t extra) {
    size_t len = 1024 + 2 * (size_t)n + extra;
    uint8_t *b = calloc(1, len);
    if (!b) return -1;
    put_le32(b, (uint32_t)magic);
    put_le32(b + 4, (uint32_t)version);
    put_le32(b + 8, claim);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v = base + i;
        b[1024 + 2 * i] = (uint8_t)v;
        b[1024 + 2 * i + 1] = (uint8_t)(v >> 8);
    }
    int rc = write_bytes(name, b, len);
    free(b);
    return rc;
}

static const char *const g_files[] = {
    "train_00.bin", "train_01.bin", "train_02.bin", "val_00.bin", "bad_magic.bin", "bad_version.bin",
    "bad_trunc.bin", "bad_long.bin", "bad_vocab.bin", "bad_short.bin", "bad_tiny.bin", "fifo.bin",
    "a.txt", "b.txt", "conv_in.txt", "conv.bin", "small.txt",
};
static const char g_text_a[] = "The quick brown fox jumps over the lazy dog.\n";          /* 45 bytes */
static const char g_text_b[] = "Pack my box with five dozen liquor jugs! 0123456789\n"; /* 52 bytes */

static int suite_init(void) {
    strcpy(g_dir, "/tmp/kiln-tokens-test-XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    int bad = 0;
    for (uint32_t s = 0; s < NSHARDS; s++) {
        char name[32];
        snprintf(name, sizeof name, "train_%02u.bin", s);
        bad |= write_shard(name, 20240520, 1, g_ntok[s], g_ntok[s], s * 4096u, 0);
    }
    bad |= write_shard("val_00.bin", 20240520, 1, VAL_NTOK, VAL_NTOK, 9u * 4096u, 0);
    bad |= write_shard("bad_magic.bin", 20240521, 1, 100, 100, 0, 0);
    bad |= write_shard("bad_version.bin", 20240520, 2, 100, 100, 0, 0);
    bad |= write_shard("bad_trunc.bin", 20240520, 1, 300, 100, 0, 0);  /* says 300, holds 100 */
    bad |= write_shard("bad_long.bin", 20240520, 1, 100, 100, 0, 6);    /* 6 bytes after the last token */
    bad |= write_shard("bad_vocab.bin", 20240520, 1, 100, 100, 40000, 0); /* token 37 is 40037 */
    bad |= write_shard("bad_short.bin", 20240520, 1, 10, 10, 0, 0);     /* fewer than T + 1 */
    bad |= write_bytes("bad_tiny.bin", "abc", 3);                      /* shorter than the header */
    bad |= mkfifo(path_in("fifo.bin"), 0600);
    bad |= write_bytes("a.txt", g_text_a, strlen(g_text_a));
    bad |= write_bytes("b.txt", g_text_b, strlen(g_text_b));
    bad |= write_bytes("small.txt", "tiny", 4);
    if (bad) return -1;
    if (fixture_need_plugin_dir()) return -1;
    g_desc = fixture_load_plugin(g_th, "tokens", KILN_KIND_DATA, "tokens");
    if (!g_desc) return -1;
    g_ops = g_desc->ops;
    return 0;
}

static int suite_clean(void) {
    for (size_t i = 0; i < sizeof g_files / sizeof g_files[0]; i++) unlink(path_in(g_files[i]));
    return rmdir(g_dir) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* Config and instance helpers */

typedef struct cfg {
    const char *format, *train, *val, *test;
    double val_fraction;
    int64_t batch_size, val_batch_size, block_size, vocab_size, seed;
    bool shuffle;
    const char *exclude; /* NULL: the key is not given */
} cfg;

static char g_train_glob[256], g_val_glob[256];

/* The usual config: the three train shards, the val shard, B 5, T 16, no shuffle. */
static cfg cfg_small(void) {
    snprintf(g_train_glob, sizeof g_train_glob, "%s/train_*.bin", g_dir);
    snprintf(g_val_glob, sizeof g_val_glob, "%s/val_*.bin", g_dir);
    cfg c = {"llmc", g_train_glob, g_val_glob, "", 0.0, B, 4, T, 65536, -1, false, NULL};
    return c;
}

/* The declared keys, typed, in the order the host passes them; exclude
 * only when the case gives it. */
static const fixture_key g_keys[] = {
    {"format", KILN_TYPE_STRING, offsetof(cfg, format), 0},   {"train", KILN_TYPE_STRING, offsetof(cfg, train), 0},
    {"val", KILN_TYPE_STRING, offsetof(cfg, val), 0},         {"test", KILN_TYPE_STRING, offsetof(cfg, test), 0},
    {"val_fraction", KILN_TYPE_FLOAT, offsetof(cfg, val_fraction), 0},
    {"batch_size", KILN_TYPE_INT, offsetof(cfg, batch_size), 0},
    {"val_batch_size", KILN_TYPE_INT, offsetof(cfg, val_batch_size), 0},
    {"block_size", KILN_TYPE_INT, offsetof(cfg, block_size), 0},
    {"vocab_size", KILN_TYPE_INT, offsetof(cfg, vocab_size), 0},
    {"shuffle", KILN_TYPE_BOOL, offsetof(cfg, shuffle), 0},   {"seed", KILN_TYPE_INT, offsetof(cfg, seed), 0},
    {"exclude", KILN_TYPE_STRING, offsetof(cfg, exclude), 1},
};
#define N_KEYS (sizeof g_keys / sizeof g_keys[0])
static kiln_kv g_kv[N_KEYS + 1];

static int32_t create(const cfg *c, kiln_instance **out) {
    return fixture_create_desc(g_desc, g_th, fixture_kv_of(g_keys, N_KEYS, c, g_kv), out);
}

/* A created instance set up for `stage`, or NULL (the error is printed). */
static kiln_instance *make(const cfg *c, int32_t stage, int32_t rank, int32_t world) {
    kiln_instance *in = NULL;
    if (create(c, &in) != KILN_OK) {
        fprintf(stderr, "\n  create: %s\n", kiln_test_error(g_th));
        return NULL;
    }
    if (g_ops->setup(in, stage, rank, world) != KILN_OK) {
        fprintf(stderr, "\n  setup: %s\n", kiln_test_error(g_th));
        g_ops->base.destroy(in);
        return NULL;
    }
    return in;
}

static int64_t nbatches(kiln_instance *in, int32_t split) {
    int64_t n = -1;
    return g_ops->num_batches(in, split, &n) == KILN_OK ? n : -1;
}

/* The global window index of a train/val row from its first token (s*4096 + k*T); -1 if no window starts there. */
static int window_id(int32_t first, int val) {
    int s = first / 4096, start = first % 4096;
    if (start % T) return -1;
    if (val) return s == 9 ? start / T : -1;
    if (s < 0 || s >= NSHARDS) return -1;
    int w = 0;
    for (int k = 0; k < s; k++) w += (int)((g_ntok[k] - 1) / T);
    return w + start / T;
}

/* Checks one batch row by row: shapes, dtype, every token and the shift. Returns the number of bad rows. */
static int check_batch(const kiln_batch *b, int64_t tblock, int val, int *ids, int *ni) {
    int bad = 0;
    if (b->ntensors != 2 || b->tensors[0].dtype != KILN_DTYPE_I32 || b->tensors[1].dtype != KILN_DTYPE_I32 ||
        b->tensors[0].ndim != 2 || b->tensors[0].shape[0] != b->size || b->tensors[0].shape[1] != tblock ||
        b->tensors[1].shape[0] != b->size || b->tensors[1].shape[1] != tblock)
        return 1000;
    const int32_t *x = b->tensors[0].data; /* (size, T) */
    const int32_t *y = b->tensors[1].data; /* (size, T) */
    for (int64_t r = 0; r < b->size; r++) {
        const int32_t *xr = x + r * tblock, *yr = y + r * tblock;
        int id = window_id(xr[0], val);
        int rowbad = id < 0;
        for (int64_t t = 0; t < tblock; t++) rowbad |= xr[t] != xr[0] + t || yr[t] != xr[0] + t + 1;
        bad += rowbad;
        if (ids && *ni < MAXW) ids[(*ni)++] = id;
    }
    return bad;
}

/* One pass of `split` from start_batch; records window ids and batch sizes; returns the batch count or -1. */
static int run_pass(kiln_instance *in, int32_t split, uint64_t epoch, int64_t start, int *ids, int *ni, int *sizes) {
    if (g_ops->start_epoch(in, split, epoch, start) != KILN_OK) return -1;
    *ni = 0;
    int nb = 0;
    kiln_batch b;
    int32_t rc;
    while ((rc = g_ops->next(in, split, &b)) == 1) {
        if (check_batch(&b, T, split != KILN_SPLIT_TRAIN, ids, ni)) return -1;
        if (sizes) sizes[nb] = (int)b.size;
        nb++;
    }
    return rc == 0 ? nb : -1;
}

static int is_perm(const int *ids, int n) {
    char seen[MAXW] = {0};
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n || seen[ids[i]]) return 0;
        seen[ids[i]] = 1;
    }
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Tests */

static void test_descriptor(void) {
    CU_ASSERT_EQUAL(g_desc->kind, KILN_KIND_DATA);
    CU_ASSERT_STRING_EQUAL(g_desc->name, "tokens");
    CU_ASSERT(g_desc->capabilities & KILN_CAP_STATEFUL);
    static const char *const keys[] = {"format", "train", "val", "test", "val_fraction", "batch_size",
                                       "val_batch_size", "block_size", "vocab_size", "shuffle", "seed", "exclude"};
    int found = 0, n = 0;
    for (const kiln_param *p = g_desc->params; p->key; p++, n++)
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (!strcmp(p->key, keys[k])) {
                found++;
                if (!strcmp(p->key, "train")) CU_ASSERT(p->flags & KILN_PARAM_REQUIRED);
            }
    CU_ASSERT_EQUAL(found, 12);
    CU_ASSERT_EQUAL(n, 12);
}

static void test_windows_sequential(void) {
    kiln_test_reset(g_th);
    cfg c = cfg_small();
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), NWIN / B);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_VAL), 2); /* 6 windows: 4 + 2 */
    static int ids[MAXW];
    int ni = 0, sizes[64];
    for (int e = 0; e < 2; e++) {
        CU_ASSERT_EQUAL(run_pass(in, KILN_SPLIT_TRAIN, (uint64_t)e, 0, ids, &ni, sizes), NWIN / B);
        CU_ASSERT_EQUAL(ni, NWIN);
        int bad = 0;
        for (int k = 0; k < ni; k++) bad += ids[k] != k; /* file order, shard by shard, every T tokens */
        for (int k = 0; k < NWIN / B; k++) bad += sizes[k] != B;
        CU_ASSERT_EQUAL(bad, 0);
    }
    /* The first row in full: shard 0's tokens 0..16. */
    kiln_batch b;
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_TRAIN, 0, 0), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(g_ops->next(in, KILN_SPLIT_TRAIN, &b), 1);
    const int32_t *x = b.tensors[0].data, *y = b.tensors[1].data;
    CU_ASSERT(x[0] == 0 && x[15] == 15 && y[0] == 1 && y[15] == 16);
    CU_ASSERT(x[T] == 16 && y[T] == 17); /* the next window starts at the previous one's last target */
    /* Val keeps its short last batch. */
    CU_ASSERT_EQUAL(run_pass(in, KILN_SPLIT_VAL, 0, 0, ids, &ni, sizes), 2);
    CU_ASSERT(ni == VAL_NWIN && sizes[0] == 4 && sizes[1] == 2);
    for (int k = 0; k < ni; k++) CU_ASSERT_EQUAL(ids[k], k);
    g_ops->base.destroy(in);
}

/* Train ids of `epochs` epochs of a fresh instance (host seed `seed`, key seed `kseed`). */
static int train_ids(uint64_t seed, int64_t kseed, int epochs, int ids[][NWIN]) {
    kiln_test_reset(g_th);
    kiln_test_set_seed(g_th, seed);
    cfg c = cfg_small();
    c.shuffle = true;
    c.seed = kseed;
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    if (!in) return -1;
    int ok = 0;
    for (int e = 0; e < epochs; e++) {
        int ni = 0;
        if (run_pass(in, KILN_SPLIT_TRAIN, (uint64_t)e, 0, ids[e], &ni, NULL) != NWIN / B || ni != NWIN) ok = -1;
    }
    g_ops->base.destroy(in);
    return ok;
}

static void test_shuffle(void) {
    static int a[3][NWIN], b[3][NWIN], s[1][NWIN], k1[1][NWIN], k2[1][NWIN];
    CU_ASSERT_EQUAL_FATAL(train_ids(1234, -1, 3, a), 0);
    CU_ASSERT_EQUAL_FATAL(train_ids(1234, -1, 3, b), 0);
    CU_ASSERT_EQUAL_FATAL(train_ids(999, -1, 1, s), 0);
    CU_ASSERT_EQUAL_FATAL(train_ids(1, 42, 1, k1), 0);
    CU_ASSERT_EQUAL_FATAL(train_ids(2, 42, 1, k2), 0);
    for (int e = 0; e < 3; e++) {
        CU_ASSERT(is_perm(a[e], NWIN));
        CU_ASSERT(memcmp(a[e], b[e], sizeof a[e]) == 0); /* same seed: same order */
    }
    CU_ASSERT(memcmp(a[0], a[1], sizeof a[0]) != 0); /* every epoch its own order */
    CU_ASSERT(memcmp(a[1], a[2], sizeof a[0]) != 0);
    CU_ASSERT(memcmp(a[0], s[0], sizeof a[0]) != 0); /* another run seed: another order */
    CU_ASSERT(memcmp(k1[0], k2[0], sizeof k1[0]) == 0); /* the `seed` key overrides the run seed */
    int inorder = 0;
    for (int k = 0; k < NWIN; k++) inorder += a[0][k] == k;
    CU_ASSERT(inorder < NWIN / 2);
}

static void test_ddp(void) {
    kiln_test_reset(g_th);
    kiln_test_set_seed(g_th, 5);
    cfg c = cfg_small();
    c.shuffle = true;
    static int tr[2][MAXW], va[2][MAXW];
    int nt[2], nv[2];
    for (int r = 0; r < 2; r++) {
        kiln_instance *in = make(&c, KILN_STAGE_FIT, r, 2);
        CU_ASSERT_PTR_NOT_NULL_FATAL(in);
        CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), 5); /* 25 windows per rank */
        CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_VAL), 1);   /* 3 per rank */
        CU_ASSERT_EQUAL(run_pass(in, KILN_SPLIT_TRAIN, 1, 0, tr[r], &nt[r], NULL), 5);
        CU_ASSERT_EQUAL(run_pass(in, KILN_SPLIT_VAL, 1, 0, va[r], &nv[r], NULL), 1);
        g_ops->base.destroy(in);
    }
    CU_ASSERT(nt[0] == 25 && nt[1] == 25 && nv[0] == 3 && nv[1] == 3);
    static int all[MAXW];
    memcpy(all, tr[0], 25 * sizeof(int));
    memcpy(all + 25, tr[1], 25 * sizeof(int));
    CU_ASSERT(is_perm(all, NWIN)); /* disjoint, and together the whole epoch */
    /* Rank r holds positions r, r+2, ... of the one-process order of the same epoch. */
    static int one[1][NWIN];
    int single[NWIN], ni = 0;
    kiln_test_reset(g_th);
    kiln_test_set_seed(g_th, 5);
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(run_pass(in, KILN_SPLIT_TRAIN, 1, 0, single, &ni, NULL), NWIN / B);
    g_ops->base.destroy(in);
    int bad = 0;
    for (int k = 0; k < 25; k++) bad += tr[0][k] != single[2 * k] || tr[1][k] != single[2 * k + 1];
    CU_ASSERT_EQUAL(bad, 0);
    (void)one;
    /* Val is strided and unshuffled. */
    bad = 0;
    for (int k = 0; k < 3; k++) bad += va[0][k] != 2 * k || va[1][k] != 2 * k + 1;
    CU_ASSERT_EQUAL(bad, 0);
    /* Three ranks: 50 / 3 = 16 windows each -> 3 full batches on every rank, disjoint. */
    static int t3[3][MAXW];
    int n3[3];
    for (int r = 0; r < 3; r++) {
        kiln_instance *i3 = make(&c, KILN_STAGE_FIT, r, 3);
        CU_ASSERT_PTR_NOT_NULL_FATAL(i3);
        CU_ASSERT_EQUAL(nbatches(i3, KILN_SPLIT_TRAIN), 3);
        CU_ASSERT_EQUAL(nbatches(i3, KILN_SPLIT_VAL), 1); /* 6 / 3 = 2 each */
        CU_ASSERT_EQUAL(run_pass(i3, KILN_SPLIT_TRAIN, 0, 0, t3[r], &n3[r], NULL), 3);
        g_ops->base.destroy(i3);
    }
    char seen[NWIN] = {0};
    bad = 0;
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < n3[r]; k++) {
            bad += t3[r][k] < 0 || t3[r][k] >= NWIN || seen[t3[r][k]];
            if (t3[r][k] >= 0 && t3[r][k] < NWIN) seen[t3[r][k]] = 1;
        }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_resume_mid_epoch(void) {
    kiln_test_reset(g_th);
    kiln_test_set_seed(g_th, 77);
    cfg c = cfg_small();
    c.shuffle = true;
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    static int full[MAXW], part[MAXW];
    int ni = 0;
    CU_ASSERT_EQUAL_FATAL(run_pass(in, KILN_SPLIT_TRAIN, 3, 0, full, &ni, NULL), 10);
    for (int k = 1; k <= 9; k++) {
        CU_ASSERT_EQUAL(run_pass(in, KILN_SPLIT_TRAIN, 3, k, part, &ni, NULL), 10 - k);
        CU_ASSERT_EQUAL(ni, NWIN - B * k);
        CU_ASSERT(memcmp(part, full + B * k, (size_t)ni * sizeof(int)) == 0);
    }
    /* After another epoch was drawn, going back to epoch 3 gives epoch 3 again. */
    CU_ASSERT_EQUAL(run_pass(in, KILN_SPLIT_TRAIN, 4, 0, part, &ni, NULL), 10);
    CU_ASSERT_EQUAL(run_pass(in, KILN_SPLIT_TRAIN, 3, 6, part, &ni, NULL), 4);
    CU_ASSERT(memcmp(part, full + 30, 20 * sizeof(int)) == 0);
    kiln_batch b;
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_TRAIN, 3, 10), KILN_OK); /* an empty rest of epoch */
    CU_ASSERT_EQUAL(g_ops->next(in, KILN_SPLIT_TRAIN, &b), 0);
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_TRAIN, 3, 11), KILN_E_INVALID_ARG);
    g_ops->base.destroy(in);
}

static void blob_u64(const void *data, int off, uint64_t v) {
    uint8_t *p = (uint8_t *)data + off;
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t blob_get(const void *data, int off) {
    const uint8_t *p = (const uint8_t *)data + off;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void test_state(void) {
    kiln_test_reset(g_th);
    kiln_test_set_seed(g_th, 31337);
    cfg c = cfg_small();
    c.shuffle = true;
    kiln_instance *a = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    static int full[MAXW], rest[MAXW];
    int ni = 0;
    CU_ASSERT_EQUAL_FATAL(run_pass(a, KILN_SPLIT_TRAIN, 2, 0, full, &ni, NULL), 10);
    CU_ASSERT_EQUAL(g_ops->start_epoch(a, KILN_SPLIT_TRAIN, 2, 0), KILN_OK);
    kiln_batch b;
    for (int k = 0; k < 3; k++) CU_ASSERT_EQUAL(g_ops->next(a, KILN_SPLIT_TRAIN, &b), 1);
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(g_ops->base.get_state(a, &ver, &blob, &size), KILN_OK);
    CU_ASSERT(ver == 1 && size == 56);
    CU_ASSERT(blob_get(blob, 8) == 2 && blob_get(blob, 16) == 3 && blob_get(blob, 24) == 10 &&
              blob_get(blob, 40) == NWIN);
    g_ops->base.destroy(a);

    /* Restore before setup, as the host does, in a run whose own seed differs: the checkpoint's seed wins. */
    kiln_test_set_seed(g_th, 4242);
    kiln_instance *bi = NULL;
    CU_ASSERT_EQUAL_FATAL(create(&c, &bi), KILN_OK);
    fixture_data_restore(g_th, g_ops, bi, ver, blob, size);
    CU_ASSERT_EQUAL(run_pass(bi, KILN_SPLIT_TRAIN, 2, -1, rest, &ni, NULL), 7); /* start_batch -1: the saved one */
    CU_ASSERT(ni == 35 && memcmp(rest, full + 15, 35 * sizeof(int)) == 0);
    /* The host's way: the batch index given explicitly. */
    CU_ASSERT_EQUAL(run_pass(bi, KILN_SPLIT_TRAIN, 2, 3, rest, &ni, NULL), 7);
    CU_ASSERT(memcmp(rest, full + 15, 35 * sizeof(int)) == 0);
    g_ops->base.destroy(bi);

    /* Hostile and mismatched blobs: one line, KILN_E_STATE, nothing applied. */
    kiln_instance *d = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    uint8_t bad[56];
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 2, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "version 2"));
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, blob, size - 1), KILN_E_STATE);
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, NULL, 56), KILN_E_STATE);
    memcpy(bad, blob, 56);
    bad[0] ^= 0xff; /* magic */
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, bad, 56), KILN_E_STATE);
    memcpy(bad, blob, 56);
    bad[4] |= 4; /* unknown flag */
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, bad, 56), KILN_E_STATE);
    memcpy(bad, blob, 56);
    blob_u64(bad, 16, 11); /* next batch beyond the epoch */
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, bad, 56), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "corrupt"));
    memcpy(bad, blob, 56);
    blob_u64(bad, 24, UINT64_MAX); /* batches no window count can give */
    blob_u64(bad, 16, UINT64_MAX - 1);
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, bad, 56), KILN_E_STATE);
    memcpy(bad, blob, 56);
    blob_u64(bad, 40, 60); /* other data: 60 windows, 12 batches */
    blob_u64(bad, 24, 12);
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, bad, 56), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "60"));
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, blob, size), KILN_OK); /* the good one still works */
    g_ops->base.destroy(d);
    /* Restored before setup, a mismatch (batch size 10 instead of 5) fails setup. */
    c.batch_size = 10;
    CU_ASSERT_EQUAL_FATAL(create(&c, &d), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->base.set_state(d, 1, blob, size), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->setup(d, KILN_STAGE_FIT, 0, 1), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "batch_size"));
    g_ops->base.destroy(d);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
}

static void test_text(void) {
    kiln_test_reset(g_th);
    char glob[256];
    snprintf(glob, sizeof glob, "%s/[ab].txt", g_dir);
    /* The stream is a.txt then b.txt: 97 bytes; val_fraction 0.25 keeps the last 24 for validation. */
    char all[128];
    snprintf(all, sizeof all, "%s%s", g_text_a, g_text_b);
    const int ntot = (int)strlen(all), nval = 24, ntrain = ntot - nval, tb = 8;
    cfg c = cfg_small();
    c.format = "text";
    c.train = glob;
    c.val = "";
    c.val_fraction = 0.25;
    c.block_size = tb;
    c.batch_size = 2;
    c.val_batch_size = 2;
    c.vocab_size = 256;
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    int trw = (ntrain - 1) / tb, vaw = (nval - 1) / tb; /* 9 and 2 windows */
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), trw / 2);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_VAL), (vaw + 1) / 2);
    for (int split = 0; split < 2; split++) {
        const char *base = all + (split ? ntrain : 0);
        CU_ASSERT_EQUAL(g_ops->start_epoch(in, split, 0, 0), KILN_OK);
        kiln_batch b;
        int row = 0, bad = 0;
        while (g_ops->next(in, split, &b) == 1) {
            const int32_t *x = b.tensors[0].data, *y = b.tensors[1].data; /* (size, 8) */
            CU_ASSERT_EQUAL(b.tensors[0].shape[1], tb);
            for (int r = 0; r < b.size; r++, row++)
                for (int t = 0; t < tb; t++)
                    bad += x[r * tb + t] != (uint8_t)base[row * tb + t] || y[r * tb + t] != (uint8_t)base[row * tb + t + 1];
        }
        CU_ASSERT_EQUAL(bad, 0);
        CU_ASSERT_EQUAL(row, split ? vaw : trw / 2 * 2);
    }
    /* Window 5 (bytes 40..48) runs from a.txt into b.txt: the files form one stream. */
    CU_ASSERT(5 * tb < 45 && 6 * tb > 45);
    g_ops->base.destroy(in);
    /* Text needs vocab_size >= 256. */
    c.vocab_size = 255;
    kiln_instance *x = (kiln_instance *)&x;
    CU_ASSERT_EQUAL(create(&c, &x), KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(x);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "vocab_size"));
    /* A val_fraction leaving less than one window is refused. */
    c.vocab_size = 256;
    c.val_fraction = 0.05; /* 4 bytes */
    CU_ASSERT_EQUAL(create(&c, &x), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->setup(x, KILN_STAGE_FIT, 0, 1), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "val_fraction"));
    g_ops->base.destroy(x);
    /* exclude drops files by name: "[ab].txt" without "b*" is a.txt alone,
     * and excluding everything is refused naming both patterns. */
    c.val_fraction = 0;
    c.exclude = "b*";
    CU_ASSERT_EQUAL(create(&c, &x), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(g_ops->setup(x, KILN_STAGE_FIT, 0, 1), KILN_OK);
    CU_ASSERT_EQUAL(nbatches(x, KILN_SPLIT_TRAIN), (int)((strlen(g_text_a) - 1) / tb / 2));
    g_ops->base.destroy(x);
    c.exclude = "*.txt";
    CU_ASSERT_EQUAL(create(&c, &x), KILN_OK);
    CU_ASSERT_NOT_EQUAL(g_ops->setup(x, KILN_STAGE_FIT, 0, 1), KILN_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "excluded by '*.txt'"));
    g_ops->base.destroy(x);
    c.exclude = NULL;
    /* Text too short for one window. */
    c.train = path_in("small.txt");
    c.val_fraction = 0;
    CU_ASSERT_EQUAL(create(&c, &x), KILN_OK);
    CU_ASSERT_NOT_EQUAL(g_ops->setup(x, KILN_STAGE_FIT, 0, 1), KILN_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "window"));
    g_ops->base.destroy(x);
}

/* setup(FIT) with train = name (and vocab_size) must fail with `code`, naming the file and `needle`. */
static void expect_shard_error(const char *name, int64_t vocab, int32_t code, const char *needle, const char *needle2) {
    cfg c = cfg_small();
    c.vocab_size = vocab;
    char path[256];
    snprintf(path, sizeof path, "%s", path_in(name));
    c.train = path;
    kiln_instance *in = NULL;
    CU_ASSERT_EQUAL_FATAL(create(&c, &in), KILN_OK);
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_FIT, 0, 1), code);
    int ok = strstr(kiln_test_error(g_th), path) && strstr(kiln_test_error(g_th), needle) && (!needle2 || strstr(kiln_test_error(g_th), needle2)) &&
             !strchr(kiln_test_error(g_th), '\n');
    CU_ASSERT(ok);
    if (!ok) fprintf(stderr, "\n  unexpected message for %s: %s\n", name, kiln_test_error(g_th));
    int64_t n;
    CU_ASSERT_EQUAL(g_ops->num_batches(in, KILN_SPLIT_TRAIN, &n), KILN_E_STATE);
    g_ops->base.destroy(in);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "\n  test_tokens: a setup hung (FIFO?)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(3);
}

static void test_malformed(void) {
    kiln_test_reset(g_th);
    signal(SIGALRM, on_alarm);
    alarm(20); /* a FIFO read would block for ever: fail the run instead */
    expect_shard_error("bad_magic.bin", 65536, KILN_E_DATA, "magic", "20240521");
    expect_shard_error("bad_version.bin", 65536, KILN_E_DATA, "version", "found 2");
    expect_shard_error("bad_trunc.bin", 65536, KILN_E_DATA, "300", "truncated");
    expect_shard_error("bad_long.bin", 65536, KILN_E_DATA, "longer", "6 extra");
    expect_shard_error("bad_vocab.bin", 40037, KILN_E_DATA, "token 37", "40037");
    expect_shard_error("bad_short.bin", 65536, KILN_E_DATA, "17 tokens", "found 10");
    expect_shard_error("bad_tiny.bin", 65536, KILN_E_DATA, "header", "3 bytes");
    expect_shard_error("fifo.bin", 65536, KILN_E_IO, "FIFO", "regular file");
    expect_shard_error("nothing-*.bin", 65536, KILN_E_IO, "no file matches", NULL);
    alarm(0);
    /* The vocabulary check follows the key: every token of the train shards is below 8192 + 240. */
    cfg c = cfg_small();
    c.vocab_size = 50257;
    kiln_instance *in = NULL;
    CU_ASSERT_EQUAL_FATAL(create(&c, &in), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_FIT, 0, 1), KILN_OK); /* tokens < 8192 + 400 */
    g_ops->base.destroy(in);
    c.vocab_size = 8000; /* shard 2 holds 8192.. */
    CU_ASSERT_EQUAL_FATAL(create(&c, &in), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_FIT, 0, 1), KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "train_02.bin"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "token 0"));
    g_ops->base.destroy(in);
    /* A directory is not a shard; a bad val shard names itself too. */
    c = cfg_small();
    char dirpat[256];
    snprintf(dirpat, sizeof dirpat, "%s", g_dir);
    c.val = dirpat;
    CU_ASSERT_EQUAL_FATAL(create(&c, &in), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_VALIDATE, 0, 1), KILN_E_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "directory"));
    g_ops->base.destroy(in);
    /* Too few windows for one full train batch on each rank. */
    c = cfg_small();
    c.batch_size = 26;
    CU_ASSERT_EQUAL_FATAL(create(&c, &in), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_FIT, 0, 2), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "batch_size 26"));
    g_ops->base.destroy(in);
}

/* Each refused alone in the usual config (val_fraction 0.1: with val set). */
static const fixture_bad_value g_bad[] = {
    {"batch_size", KILN_V_INT(0)},        {"val_batch_size", KILN_V_INT(-1)},  {"block_size", KILN_V_INT(0)},
    {"vocab_size", KILN_V_INT(0)},        {"seed", KILN_V_INT(-2)},            {"format", KILN_V_STR("bpe")},
    {"train", KILN_V_STR("")},            {"val_fraction", KILN_V_FLOAT(1.0)}, {"val_fraction", KILN_V_FLOAT(-0.1)},
    {"val_fraction", KILN_V_FLOAT(0.1)},
};

static void test_bad_config(void) {
    kiln_test_reset(g_th);
    cfg c = cfg_small();
    const kiln_kv *usual = fixture_kv_of(g_keys, N_KEYS, &c, g_kv);
    fixture_expect_refused_each(g_desc, g_th, usual, g_bad, sizeof g_bad / sizeof g_bad[0]);
    /* create reads no file. */
    c.train = "/nonexistent-kiln-dir/*.bin";
    kiln_instance *in = NULL;
    CU_ASSERT_EQUAL(create(&c, &in), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_FIT, 0, 1), KILN_E_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "/nonexistent-kiln-dir/*.bin"));
    /* Calls out of order. */
    int64_t n;
    kiln_batch b;
    CU_ASSERT_EQUAL(g_ops->num_batches(in, KILN_SPLIT_VAL, &n), KILN_E_STATE);
    CU_ASSERT_EQUAL(g_ops->next(in, 7, &b), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_ops->setup(in, KILN_STAGE_FIT, 1, 1), KILN_E_INVALID_ARG);
    g_ops->base.destroy(in);
    c = cfg_small();
    in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(g_ops->next(in, KILN_SPLIT_TRAIN, &b), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "start_epoch"));
    /* No val and no val_fraction: an empty val split; test falls back to val. */
    g_ops->base.destroy(in);
    c.val = "";
    in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_VAL), 0);
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_VAL, 0, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->next(in, KILN_SPLIT_VAL, &b), 0);
    g_ops->base.destroy(in);
    c = cfg_small();
    in = make(&c, KILN_STAGE_TEST, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TEST), 2); /* the val shard */
    g_ops->base.destroy(in);
}

/* Runs the converter with argv (NULL-terminated, argv[0] ignored); returns its exit status or -1. */
static int run_tool(char *const argv[]) {
    const char *tool = getenv("KILN_TEXT2TOKENS");
    if (!tool) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 2);
        execv(tool, argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_converter(void) {
    if (!getenv("KILN_TEXT2TOKENS")) {
        CU_FAIL("KILN_TEXT2TOKENS is not set");
        return;
    }
    /* 300 bytes of text, every byte value 1..255 included. */
    uint8_t text[300];
    for (int i = 0; i < 300; i++) text[i] = (uint8_t)(i % 255 + 1);
    CU_ASSERT_EQUAL_FATAL(write_bytes("conv_in.txt", text, sizeof text), 0);
    char in1[256], in2[256], out[256];
    snprintf(in1, sizeof in1, "%s", path_in("conv_in.txt"));
    snprintf(in2, sizeof in2, "%s", path_in("a.txt"));
    snprintf(out, sizeof out, "%s", path_in("conv.bin"));
    char *argv1[] = {"kiln-text2tokens", "-o", out, in1, in2, NULL};
    CU_ASSERT_EQUAL_FATAL(run_tool(argv1), 0);
    FILE *f = fopen(out, "rb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    static uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t want = 300 + strlen(g_text_a);
    CU_ASSERT_EQUAL_FATAL(n, 1024 + 2 * want);
    uint32_t h[3];
    for (int k = 0; k < 3; k++) h[k] = buf[4 * k] | buf[4 * k + 1] << 8 | (uint32_t)buf[4 * k + 2] << 16 | (uint32_t)buf[4 * k + 3] << 24;
    CU_ASSERT(h[0] == 20240520 && h[1] == 1 && h[2] == want);
    int bad = 0;
    for (size_t i = 0; i < want; i++) {
        uint8_t expect = i < 300 ? text[i] : (uint8_t)g_text_a[i - 300];
        bad += buf[1024 + 2 * i] != expect || buf[1024 + 2 * i + 1] != 0;
    }
    CU_ASSERT_EQUAL(bad, 0);
    /* The plugin reads it back: format llmc, byte vocabulary. */
    kiln_test_reset(g_th);
    cfg c = cfg_small();
    c.train = out;
    c.val = "";
    c.vocab_size = 256;
    c.block_size = 4;
    c.batch_size = 3;
    kiln_instance *in = make(&c, KILN_STAGE_FIT, 0, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(in);
    CU_ASSERT_EQUAL(nbatches(in, KILN_SPLIT_TRAIN), (int64_t)((want - 1) / 4 / 3));
    CU_ASSERT_EQUAL(g_ops->start_epoch(in, KILN_SPLIT_TRAIN, 0, 0), KILN_OK);
    kiln_batch b;
    CU_ASSERT_EQUAL_FATAL(g_ops->next(in, KILN_SPLIT_TRAIN, &b), 1);
    const int32_t *x = b.tensors[0].data, *y = b.tensors[1].data; /* (3, 4) */
    bad = 0;
    for (int i = 0; i < 12; i++) bad += x[i] != text[(i / 4) * 4 + i % 4] || y[i] != text[(i / 4) * 4 + i % 4 + 1];
    CU_ASSERT_EQUAL(bad, 0);
    g_ops->base.destroy(in);
    /* Errors: a missing input leaves the old output alone and no temporary file; no -o is a usage error. */
    char missing[256];
    snprintf(missing, sizeof missing, "%s", path_in("missing.txt"));
    char *argv2[] = {"kiln-text2tokens", "-o", out, missing, NULL};
    CU_ASSERT_EQUAL(run_tool(argv2), 1);
    struct stat st;
    CU_ASSERT(stat(out, &st) == 0 && (size_t)st.st_size == 1024 + 2 * want);
    char *argv3[] = {"kiln-text2tokens", in1, NULL};
    CU_ASSERT_EQUAL(run_tool(argv3), 2);
    char *argv4[] = {"kiln-text2tokens", "-o", out, g_dir, NULL}; /* a directory */
    CU_ASSERT_EQUAL(run_tool(argv4), 1);
    /* Nothing but the known files is left in the folder (no *.tmp.*). */
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/*tmp*", g_dir);
    glob_t g;
    CU_ASSERT_EQUAL(glob(pattern, 0, NULL, &g), GLOB_NOMATCH); /* ls | grep tmp finds nothing */
    globfree(&g);
}

static CU_TestInfo cases_tokens[] = {
    {"descriptor and declared keys", test_descriptor},
    {"windows, the one-token shift, sequential order", test_windows_sequential},
    {"seeded shuffle: reproducible, new every epoch", test_shuffle},
    {"ddp: disjoint ranks, equal batch counts", test_ddp},
    {"start_epoch(k) equals batch k of a full pass", test_resume_mid_epoch},
    {"get_state / set_state, hostile blobs", test_state},
    {"text format and val_fraction", test_text},
    {"malformed shards name the file; FIFO refused", test_malformed},
    {"bad config and call order", test_bad_config},
    {"kiln-text2tokens round trip", test_converter},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "tokens", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_tokens},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
