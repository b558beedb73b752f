/*
 * test_tensorboard.c — CUnit suite for the tensorboard callback plugin. The
 * plugin is loaded from the build's plugin directory through the test host,
 * created with a full config (as the host would resolve it) and driven with
 * LOG_METRICS and lifecycle events whose trainer state points at a fresh
 * mkdtemp() run directory. The event file it writes is then parsed back by an
 * independent reader written here: its own bitwise CRC-32C (the plugin uses a
 * table), its own TFRecord framing check and its own protobuf decoder that
 * rejects any field the writer has no business emitting. The tests assert
 * the file name, every record's length and data CRC, the leading
 * file_version record, every scalar's tag/value/step exactly as logged (as
 * float32), monotone wall times within the test's clock window, flushing
 * behaviour, rank-0-only writing and the configuration/I/O errors. The
 * plugin's own CRC code (tb_record.c, compiled into this test) is checked
 * against the standard check value too.
 */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <CUnit/CUnit.h>

#include <kiln/testing.h>

#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */
#include "tb_record.h" /* the plugin's tb_crc32c / tb_mask_crc, built from plugins/tensorboard/tb_record.c */

/* ---------------------------------------------------------------------------
 * The independent reader. Bitwise CRC-32C: shift one bit at a time,
 * xor-ing the reflected Castagnoli polynomial when the low bit falls out. */

static uint32_t ref_crc32c(const void *data, size_t n) {
    const unsigned char *p = data;
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int bit = 0; bit < 8; bit++) crc = (crc & 1u) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
    }
    return crc ^ 0xffffffffu;
}

/* Rotate right by 15, then add TensorFlow's constant. */
static uint32_t ref_masked(const void *data, size_t n) {
    uint32_t c = ref_crc32c(data, n);
    return (uint32_t)((c << 17) | (c >> 15)) + 0xa282ead8u;
}

static uint64_t rd_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

#define RD_MAX_EVENTS 128
#define RD_MAX_VALUES 16

typedef struct rd_scalar {
    char tag[64];
    float value;
} rd_scalar;

/* One decoded tensorflow.Event: which fields were present and their values. */
typedef struct rd_event {
    int has_wall, has_step, has_version, has_summary;
    double wall;
    int64_t step;
    char version[64];
    int nvalues;
    rd_scalar values[RD_MAX_VALUES];
} rd_event;

typedef struct rd_file {
    int nevents;
    rd_event ev[RD_MAX_EVENTS];
    char error[256]; /* empty when every record was well formed */
} rd_file;

/* A protobuf field: its number, wire type and payload. */
typedef struct pb_field {
    uint32_t num, wire;
    uint64_t u;               /* wire types 0, 1, 5                     */
    const unsigned char *buf; /* wire type 2: (len) bytes               */
    size_t len;
} pb_field;

static int pb_read_varint(const unsigned char **p, const unsigned char *end, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*p >= end) return -1;
        unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1; /* more than 10 bytes */
}

/* Next field from [*p, end); 0 on success, 1 at the end, -1 malformed. */
static int pb_next(const unsigned char **p, const unsigned char *end, pb_field *f) {
    if (*p == end) return 1;
    uint64_t key;
    if (pb_read_varint(p, end, &key) != 0) return -1;
    f->num = (uint32_t)(key >> 3);
    f->wire = (uint32_t)(key & 7);
    switch (f->wire) {
    case 0:
        return pb_read_varint(p, end, &f->u);
    case 1:
    case 5: {
        size_t w = f->wire == 1 ? 8 : 4;
        if ((size_t)(end - *p) < w) return -1;
        f->u = rd_le(*p, (int)w);
        *p += w;
        return 0;
    }
    case 2: {
        uint64_t len;
        if (pb_read_varint(p, end, &len) != 0 || len > (uint64_t)(end - *p)) return -1;
        f->buf = *p;
        f->len = (size_t)len;
        *p += len;
        return 0;
    }
    default:
        return -1;
    }
}

static int rd_value(rd_scalar *s, const unsigned char *p, const unsigned char *end) {
    pb_field f;
    int rc, has_tag = 0, has_val = 0;
    while ((rc = pb_next(&p, end, &f)) == 0) {
        if (f.num == 1 && f.wire == 2 && f.len < sizeof s->tag) {
            memcpy(s->tag, f.buf, f.len);
            s->tag[f.len] = '\0';
            has_tag = 1;
        } else if (f.num == 2 && f.wire == 5) {
            uint32_t bits = (uint32_t)f.u;
            memcpy(&s->value, &bits, sizeof bits);
            has_val = 1;
        } else {
            return -1;
        }
    }
    return rc == 1 && has_tag && has_val ? 0 : -1;
}

static int rd_summary(rd_event *e, const unsigned char *p, const unsigned char *end) {
    pb_field f;
    int rc;
    while ((rc = pb_next(&p, end, &f)) == 0) {
        if (f.num != 1 || f.wire != 2 || e->nvalues >= RD_MAX_VALUES) return -1;
        if (rd_value(&e->values[e->nvalues++], f.buf, f.buf + f.len) != 0) return -1;
    }
    return rc == 1 ? 0 : -1;
}

static int rd_event_decode(rd_event *e, const unsigned char *p, const unsigned char *end) {
    memset(e, 0, sizeof *e);
    pb_field f;
    int rc;
    while ((rc = pb_next(&p, end, &f)) == 0) {
        if (f.num == 1 && f.wire == 1) {
            memcpy(&e->wall, &f.u, sizeof e->wall);
            e->has_wall = 1;
        } else if (f.num == 2 && f.wire == 0) {
            e->step = (int64_t)f.u;
            e->has_step = 1;
        } else if (f.num == 3 && f.wire == 2 && f.len < sizeof e->version) {
            memcpy(e->version, f.buf, f.len);
            e->version[f.len] = '\0';
            e->has_version = 1;
        } else if (f.num == 5 && f.wire == 2) {
            if (rd_summary(e, f.buf, f.buf + f.len) != 0) return -1;
            e->has_summary = 1;
        } else {
            return -1;
        }
    }
    return rc == 1 ? 0 : -1;
}

/* Parse a whole event file into *out; out->error says what was wrong. */
static void rd_parse(const char *path, rd_file *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(out->error, sizeof out->error, "cannot open %s", path);
        return;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(size > 0 ? (size_t)size : 1);
    size_t n = fread(buf, 1, (size_t)size, f);
    fclose(f);
    size_t off = 0;
    while (off < n && !out->error[0]) {
        if (n - off < 12) {
            snprintf(out->error, sizeof out->error, "%zu stray bytes at offset %zu", n - off, off);
            break;
        }
        uint64_t len = rd_le(buf + off, 8);
        if ((uint32_t)rd_le(buf + off + 8, 4) != ref_masked(buf + off, 8)) {
            snprintf(out->error, sizeof out->error, "bad length CRC at offset %zu", off);
            break;
        }
        if (len > n - off - 12 || n - off - 12 - len < 4) {
            snprintf(out->error, sizeof out->error, "record at %zu truncated", off);
            break;
        }
        const unsigned char *data = buf + off + 12;
        if ((uint32_t)rd_le(data + len, 4) != ref_masked(data, (size_t)len)) {
            snprintf(out->error, sizeof out->error, "bad data CRC at offset %zu", off);
            break;
        }
        if (out->nevents >= RD_MAX_EVENTS || rd_event_decode(&out->ev[out->nevents], data, data + len) != 0) {
            snprintf(out->error, sizeof out->error, "record %d is not a well-formed Event", out->nevents);
            break;
        }
        out->nevents++;
        off += 12 + (size_t)len + 4;
    }
    free(buf);
    if (out->error[0]) fprintf(stderr, "\n%s: %s\n", path, out->error);
}

/* ---------------------------------------------------------------------------
 * Fixtures */

static char g_dir[256];         /* the test's run_dir (mkdtemp)          */
static kiln_trainer_state g_ts; /* what every event's trainer points at  */
static double g_t0;             /* wall clock when the fixture started   */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void fixture_begin(void) {
    kiln_test_reset(g_th);
    fixture_tmpdir(g_dir, sizeof g_dir, "tensorboard");
    fixture_fit_state(&g_ts, g_dir);
    (*kiln_test_trainer(g_th)) = g_ts;
    g_t0 = now_s();
}

static void fixture_end(void) { fixture_rmtree(g_dir); }

static const kiln_plugin_desc *load_desc(void) { return fixture_load_callback_desc(g_th, "tensorboard"); }

static const kiln_callback_ops *load(void) { return fixture_callback_ops(load_desc()); }

static kiln_instance *create(const kiln_callback_ops *ops, const kiln_kv *cfg, int32_t *rc) {
    return fixture_create(&ops->base, kiln_test_services(g_th), g_th, cfg, rc);
}

static kiln_event ev_make(uint32_t id) { return fixture_event(id, KILN_STAGE_FIT, -1, &g_ts); }

static int32_t send(const kiln_callback_ops *ops, kiln_instance *inst, uint32_t id) {
    kiln_event e = ev_make(id);
    return ops->on_event(inst, &e);
}

static int32_t send_metrics(const kiln_callback_ops *ops, kiln_instance *inst, const kiln_kv *metrics, int64_t step) {
    kiln_event e = ev_make(KILN_EV_LOG_METRICS);
    e.metrics = metrics;
    e.step = step;
    return ops->on_event(inst, &e);
}

static const kiln_kv default_cfg[] = {
    {"subdir", KILN_V_STR("tensorboard")},
    {"flush_every_n", KILN_V_INT(1)},
    {"filename_suffix", KILN_V_STR("")},
    {NULL, KILN_V_NONE},
};

/* Every entry of `dir` whose name starts with "events.out.tfevents.";
 * returns how many, the last one's full path in `path`. */
static int find_event_files(const char *dir, char *path, size_t n) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, "events.out.tfevents.", 20) != 0) continue;
        count++;
        snprintf(path, n, "%s/%s", dir, de->d_name);
    }
    closedir(d);
    return count;
}

/* The base name is events.out.tfevents.<10 digits>.<hostname><tail>, with
 * the seconds inside the test's clock window. */
static void assert_file_name(const char *path, const char *tail) {
    const char *base = strrchr(path, '/') + 1;
    CU_ASSERT_EQUAL_FATAL(strncmp(base, "events.out.tfevents.", 20), 0);
    const char *digits = base + 20;
    for (int i = 0; i < 10; i++) CU_ASSERT(digits[i] >= '0' && digits[i] <= '9');
    long long secs = strtoll(digits, NULL, 10);
    CU_ASSERT(secs >= (long long)g_t0 && secs <= (long long)now_s());
    char host[256] = "";
    gethostname(host, sizeof host);
    char want[600];
    snprintf(want, sizeof want, ".%s%s", host, tail);
    CU_ASSERT_STRING_EQUAL(digits + 10, want);
}

/* What one LOG_METRICS event should have produced. */
typedef struct want_event {
    int64_t step;
    int n;
    const char *tags[4];
    double values[4];
} want_event;

/* The file holds the version record then exactly `n` scalar events equal
 * to `want` (values compared as float32, bit for bit), with wall times
 * non-decreasing and inside [g_t0, now]. */
static void assert_events(const char *path, const want_event *want, int n) {
    static rd_file f; /* large; one at a time */
    rd_parse(path, &f);
    CU_ASSERT_STRING_EQUAL_FATAL(f.error, "");
    CU_ASSERT_EQUAL_FATAL(f.nevents, 1 + n);
    const rd_event *v = &f.ev[0];
    CU_ASSERT(v->has_version && v->has_wall && !v->has_step && !v->has_summary);
    CU_ASSERT_STRING_EQUAL(v->version, "brain.Event:2");
    double t1 = now_s();
    double prev = 0;
    for (int i = 0; i <= n; i++) {
        const rd_event *e = &f.ev[i];
        CU_ASSERT(e->has_wall);
        CU_ASSERT(e->wall >= g_t0 - 1e-3 && e->wall <= t1 + 1e-3);
        CU_ASSERT(e->wall >= prev);
        prev = e->wall;
        if (i == 0) continue;
        const want_event *w = &want[i - 1];
        CU_ASSERT(e->has_step && e->has_summary && !e->has_version);
        CU_ASSERT_EQUAL(e->step, w->step);
        CU_ASSERT_EQUAL_FATAL(e->nvalues, w->n);
        for (int k = 0; k < w->n; k++) {
            CU_ASSERT_STRING_EQUAL(e->values[k].tag, w->tags[k]);
            float expect = (float)w->values[k];
            CU_ASSERT(memcmp(&e->values[k].value, &expect, sizeof expect) == 0);
        }
    }
}

/* ---------------------------------------------------------------------------
 * CRC-32C */

static void test_crc32c_check_values(void) {
    static const char check[] = "123456789";
    CU_ASSERT_EQUAL(ref_crc32c(check, 9), 0xE3069283u);
    CU_ASSERT_EQUAL(tb_crc32c(0, check, 9), 0xE3069283u);
    /* the plugin's CRC continues across calls */
    CU_ASSERT_EQUAL(tb_crc32c(tb_crc32c(0, check, 4), check + 4, 5), 0xE3069283u);
    /* the masked CRC of a zero length field (8 zero bytes) */
    static const unsigned char zeros[8] = {0};
    CU_ASSERT_EQUAL(ref_masked(zeros, 8), 0x07980329u);
    CU_ASSERT_EQUAL(tb_mask_crc(tb_crc32c(0, zeros, 8)), 0x07980329u);
    /* both agree on every length 0..300 of a pseudo-random buffer */
    unsigned char buf[300];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof buf; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (unsigned char)(x >> 16);
    }
    int mismatches = 0;
    for (size_t n = 0; n <= sizeof buf; n++) mismatches += tb_crc32c(0, buf, n) != ref_crc32c(buf, n);
    CU_ASSERT_EQUAL(mismatches, 0);
}

/* ---------------------------------------------------------------------------
 * The descriptor */

static void test_descriptor(void) {
    kiln_test_reset(g_th);
    const kiln_plugin_desc *d = load_desc();
    CU_ASSERT_EQUAL(d->kind, KILN_KIND_CALLBACK);
    CU_ASSERT_STRING_EQUAL(d->name, "tensorboard");
    CU_ASSERT_PTR_NOT_NULL_FATAL(d->params);
    static const struct {
        const char *key;
        uint32_t type;
        const char *s;
        int64_t i;
    } want[] = {{"subdir", KILN_TYPE_STRING, "tensorboard", 0},
                {"flush_every_n", KILN_TYPE_INT, NULL, 1},
                {"filename_suffix", KILN_TYPE_STRING, "", 0}};
    int n = 0;
    for (const kiln_param *p = d->params; p->key; p++) n++;
    CU_ASSERT_EQUAL(n, 3);
    for (int i = 0; i < 3 && i < n; i++) {
        const kiln_param *p = &d->params[i];
        CU_ASSERT_STRING_EQUAL(p->key, want[i].key);
        CU_ASSERT_EQUAL(p->type, want[i].type);
        CU_ASSERT_EQUAL(p->def.type, want[i].type);
        CU_ASSERT_PTR_NOT_NULL(p->help);
        if (want[i].s) {
            CU_ASSERT_STRING_EQUAL(p->def.v.s, want[i].s);
        } else {
            CU_ASSERT_EQUAL(p->def.v.i, want[i].i);
        }
    }
}

/* ---------------------------------------------------------------------------
 * Writing */

static void test_scalars_round_trip(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load();
    int32_t rc;
    kiln_instance *inst = create(ops, default_cfg, &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    char tbdir[512], path[1024] = "";
    snprintf(tbdir, sizeof tbdir, "%s/tensorboard", g_dir);
    CU_ASSERT_EQUAL(send(ops, inst, KILN_EV_SETUP), KILN_OK);
    CU_ASSERT_EQUAL(send(ops, inst, KILN_EV_ON_FIT_START), KILN_OK);
    CU_ASSERT_EQUAL(find_event_files(tbdir, path, sizeof path), 0); /* nothing before the first metrics */

    const double third = 1.0 / 3.0;
    const kiln_kv m0[] = {{"train_loss", KILN_V_FLOAT(2.5)}, {"lr", KILN_V_FLOAT(0.1)}, {NULL, KILN_V_NONE}};
    const kiln_kv m1[] = {{"train_loss", KILN_V_FLOAT(third)}, {"lr", KILN_V_FLOAT(1e-3)}, {NULL, KILN_V_NONE}};
    /* INT values are plotted too; a string is not a scalar and is skipped */
    const kiln_kv m2[] = {{"val/loss", KILN_V_FLOAT(-7.25e-8)},
                          {"note", KILN_V_STR("not a number")},
                          {"epoch", KILN_V_INT(3)},
                          {NULL, KILN_V_NONE}};
    const kiln_kv none[] = {{"note", KILN_V_STR("only text")}, {NULL, KILN_V_NONE}};
    /* a step past 2^32 (a multi-byte varint) and a negative one (10 bytes) */
    /* ... and doubles beyond float32's range saturate to +-inf */
    const kiln_kv m3[] = {{"train_loss", KILN_V_FLOAT(1e30)},
                          {"big", KILN_V_FLOAT(1e300)},
                          {"neg_big", KILN_V_FLOAT(-1e300)},
                          {NULL, KILN_V_NONE}};
    const kiln_kv m4[] = {{"x", KILN_V_FLOAT(-0.0)}, {NULL, KILN_V_NONE}};
    const want_event want[] = {
        {0, 2, {"train_loss", "lr"}, {2.5, 0.1}},
        {1, 2, {"train_loss", "lr"}, {third, 1e-3}},
        {1, 2, {"val/loss", "epoch"}, {-7.25e-8, 3.0}},
        {(int64_t)1 << 33, 3, {"train_loss", "big", "neg_big"}, {1e30, INFINITY, -INFINITY}},
        {-5, 1, {"x"}, {-0.0}},
    };
    const kiln_kv *logs[] = {m0, m1, m2, m3, m4};
    const int64_t steps[] = {0, 1, 1, (int64_t)1 << 33, -5};
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(send_metrics(ops, inst, logs[i], steps[i]), KILN_OK);
        /* flush_every_n = 1: the file is complete after every event */
        CU_ASSERT_EQUAL_FATAL(find_event_files(tbdir, path, sizeof path), 1);
        assert_events(path, want, i + 1);
        if (i == 2) {
            /* no numeric metric: no record, the file stays as it was */
            CU_ASSERT_EQUAL(send_metrics(ops, inst, none, 2), KILN_OK);
            CU_ASSERT_EQUAL(send_metrics(ops, inst, NULL, 2), KILN_OK);
            assert_events(path, want, 3);
        }
    }
    assert_file_name(path, "");
    CU_ASSERT_EQUAL(send(ops, inst, KILN_EV_ON_FIT_END), KILN_OK);
    CU_ASSERT_EQUAL(send(ops, inst, KILN_EV_TEARDOWN), KILN_OK);
    assert_events(path, want, 5);

    /* After teardown a later stage (trainer.test) appends to the same file,
     * without a second version record. */
    const kiln_kv t0[] = {{"test_acc", KILN_V_FLOAT(0.875)}, {NULL, KILN_V_NONE}};
    const want_event want2[] = {want[0], want[1], want[2], want[3], want[4], {6, 1, {"test_acc"}, {0.875}}};
    CU_ASSERT_EQUAL(send(ops, inst, KILN_EV_SETUP), KILN_OK);
    CU_ASSERT_EQUAL(send_metrics(ops, inst, t0, 6), KILN_OK);
    CU_ASSERT_EQUAL(send(ops, inst, KILN_EV_TEARDOWN), KILN_OK);
    CU_ASSERT_EQUAL(find_event_files(tbdir, path, sizeof path), 1);
    assert_events(path, want2, 6);

    /* The file removed after teardown: the next metrics start a new file
     * with its own version record, not a headless one. */
    CU_ASSERT_EQUAL(remove(path), 0);
    const want_event want3[] = {{7, 1, {"test_acc"}, {0.875}}};
    CU_ASSERT_EQUAL(send_metrics(ops, inst, t0, 7), KILN_OK);
    ops->base.destroy(inst);
    CU_ASSERT_EQUAL(find_event_files(tbdir, path, sizeof path), 1);
    assert_events(path, want3, 1);
    fixture_end();
}

static void test_flush_every_n(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load();
    const kiln_kv cfg[] = {{"subdir", KILN_V_STR("tensorboard")},
                           {"flush_every_n", KILN_V_INT(3)},
                           {"filename_suffix", KILN_V_STR("")},
                           {NULL, KILN_V_NONE}};
    int32_t rc;
    kiln_instance *inst = create(ops, cfg, &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    char tbdir[512], path[1024] = "";
    snprintf(tbdir, sizeof tbdir, "%s/tensorboard", g_dir);
    want_event want[5];
    kiln_kv m[2] = {{"loss", KILN_V_FLOAT(0)}, {NULL, KILN_V_NONE}};
    /* The version record is flushed at creation; scalars every third
     * record; an epoch end flushes what is pending. Records are small, so
     * stdio holds them until the flush. */
    const int visible_after[5] = {0, 0, 3, 3, 5};
    for (int i = 0; i < 5; i++) {
        m[0].value.v.f = 0.5 * i;
        want[i] = (want_event){i, 1, {"loss"}, {0.5 * i}};
        CU_ASSERT_EQUAL(send_metrics(ops, inst, m, i), KILN_OK);
        if (i == 4) {
            CU_ASSERT_EQUAL(send(ops, inst, KILN_EV_ON_TRAIN_EPOCH_END), KILN_OK);
        }
        CU_ASSERT_EQUAL_FATAL(find_event_files(tbdir, path, sizeof path), 1);
        assert_events(path, want, visible_after[i]);
    }
    /* one more pending record reaches the file at destroy */
    m[0].value.v.f = 9;
    CU_ASSERT_EQUAL(send_metrics(ops, inst, m, 5), KILN_OK);
    assert_events(path, want, 5);
    ops->base.destroy(inst);
    want_event all[6];
    memcpy(all, want, sizeof want);
    all[5] = (want_event){5, 1, {"loss"}, {9}};
    assert_events(path, all, 6);
    fixture_end();
}

/* Two loggers in one run directory (same second, most likely) never share
 * a file; subdir may nest and filename_suffix ends the name. */
static void test_two_files_suffix_and_subdir(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load();
    const kiln_kv cfg[] = {{"subdir", KILN_V_STR("logs/tb")},
                           {"flush_every_n", KILN_V_INT(1)},
                           {"filename_suffix", KILN_V_STR(".v2")},
                           {NULL, KILN_V_NONE}};
    int32_t rc;
    kiln_instance *a = create(ops, cfg, &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    kiln_instance *b = create(ops, cfg, &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    const kiln_kv ma[] = {{"a", KILN_V_FLOAT(1)}, {NULL, KILN_V_NONE}};
    const kiln_kv mb[] = {{"b", KILN_V_FLOAT(2)}, {NULL, KILN_V_NONE}};
    CU_ASSERT_EQUAL(send_metrics(ops, a, ma, 0), KILN_OK);
    CU_ASSERT_EQUAL(send_metrics(ops, b, mb, 0), KILN_OK);
    CU_ASSERT_EQUAL(send_metrics(ops, a, ma, 1), KILN_OK);
    ops->base.destroy(a);
    ops->base.destroy(b);
    char tbdir[512];
    snprintf(tbdir, sizeof tbdir, "%s/logs/tb", g_dir);
    DIR *d = opendir(tbdir);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    int nfiles = 0, seen_a = 0, seen_b = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        nfiles++;
        size_t len = strlen(de->d_name);
        CU_ASSERT(len > 3 && strcmp(de->d_name + len - 3, ".v2") == 0);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", tbdir, de->d_name);
        static rd_file f;
        rd_parse(path, &f);
        CU_ASSERT_STRING_EQUAL(f.error, "");
        if (f.nevents == 3 && !strcmp(f.ev[1].values[0].tag, "a") && !strcmp(f.ev[2].values[0].tag, "a")) {
            seen_a++;
            assert_file_name(path, ".v2");
        } else if (f.nevents == 2 && !strcmp(f.ev[1].values[0].tag, "b")) {
            seen_b++;
        }
    }
    closedir(d);
    CU_ASSERT_EQUAL(nfiles, 2);
    CU_ASSERT_EQUAL(seen_a, 1);
    CU_ASSERT_EQUAL(seen_b, 1);
    fixture_end();
}

/* subdir "" writes into the run directory itself; an absolute subdir is
 * used as it is. */
static void test_subdir_empty_and_absolute(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load();
    kiln_kv cfg[] = {{"subdir", KILN_V_STR("")},
                     {"flush_every_n", KILN_V_INT(1)},
                     {"filename_suffix", KILN_V_STR("")},
                     {NULL, KILN_V_NONE}};
    const kiln_kv m[] = {{"loss", KILN_V_FLOAT(0.25)}, {NULL, KILN_V_NONE}};
    const want_event want[] = {{7, 1, {"loss"}, {0.25}}};
    int32_t rc;
    kiln_instance *inst = create(ops, cfg, &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(send_metrics(ops, inst, m, 7), KILN_OK);
    ops->base.destroy(inst);
    char path[1024] = "";
    CU_ASSERT_EQUAL_FATAL(find_event_files(g_dir, path, sizeof path), 1);
    assert_events(path, want, 1);

    char abs_dir[512];
    snprintf(abs_dir, sizeof abs_dir, "%s/elsewhere/deep", g_dir);
    cfg[0].value.v.s = abs_dir;
    g_ts.run_dir = "/nonexistent-run-dir"; /* must not be used */
    inst = create(ops, cfg, &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(send_metrics(ops, inst, m, 7), KILN_OK);
    ops->base.destroy(inst);
    CU_ASSERT_EQUAL_FATAL(find_event_files(abs_dir, path, sizeof path), 1);
    assert_events(path, want, 1);
    fixture_end();
}

/* ---------------------------------------------------------------------------
 * Ranks and errors */

static void test_rank_nonzero_writes_nothing(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load();
    int32_t rc;
    kiln_instance *inst = create(ops, default_cfg, &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    g_ts.rank = 1;
    g_ts.world_size = 2;
    const kiln_kv m[] = {{"loss", KILN_V_FLOAT(1)}, {NULL, KILN_V_NONE}};
    CU_ASSERT_EQUAL(send(ops, inst, KILN_EV_SETUP), KILN_OK);
    CU_ASSERT_EQUAL(send_metrics(ops, inst, m, 0), KILN_OK);
    /* an event without a trainer pointer falls back to the service */
    (*kiln_test_trainer(g_th)) = g_ts;
    kiln_event e = ev_make(KILN_EV_LOG_METRICS);
    e.trainer = NULL;
    e.metrics = m;
    CU_ASSERT_EQUAL(ops->on_event(inst, &e), KILN_OK);
    CU_ASSERT_EQUAL(send(ops, inst, KILN_EV_TEARDOWN), KILN_OK);
    ops->base.destroy(inst);
    char tbdir[512];
    snprintf(tbdir, sizeof tbdir, "%s/tensorboard", g_dir);
    struct stat st;
    CU_ASSERT_NOT_EQUAL(stat(tbdir, &st), 0); /* not even the folder */
    char path[1024];
    CU_ASSERT_EQUAL(find_event_files(g_dir, path, sizeof path), 0);
    fixture_end();
}

static void test_config_and_io_errors(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load();
    int32_t rc;
    const kiln_kv bad_flush[] = {{"subdir", KILN_V_STR("tensorboard")},
                                 {"flush_every_n", KILN_V_INT(0)},
                                 {"filename_suffix", KILN_V_STR("")},
                                 {NULL, KILN_V_NONE}};
    CU_ASSERT_PTR_NULL(fixture_config_error(&ops->base, kiln_test_services(g_th), g_th, bad_flush, "flush_every_n must be >= 1, got 0", NULL));
    const kiln_kv bad_suffix[] = {{"subdir", KILN_V_STR("tensorboard")},
                                  {"flush_every_n", KILN_V_INT(1)},
                                  {"filename_suffix", KILN_V_STR("x/y")},
                                  {NULL, KILN_V_NONE}};
    CU_ASSERT_PTR_NULL(fixture_config_error(&ops->base, kiln_test_services(g_th), g_th, bad_suffix, "filename_suffix", "\"x/y\""));

    /* The event folder cannot be made: a plain file stands where it goes. */
    char blocker[512];
    snprintf(blocker, sizeof blocker, "%s/tensorboard", g_dir);
    FILE *f = fopen(blocker, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fclose(f);
    kiln_instance *inst = create(ops, default_cfg, &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    const kiln_kv m[] = {{"loss", KILN_V_FLOAT(1)}, {NULL, KILN_V_NONE}};
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(send_metrics(ops, inst, m, 0), KILN_E_IO);
    CU_ASSERT_EQUAL(kiln_test_error_code(g_th), KILN_E_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "tensorboard: cannot create"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), blocker));
    /* Once the obstacle is gone, the next metrics create a proper file with
     * its version record first. */
    CU_ASSERT_EQUAL(remove(blocker), 0);
    CU_ASSERT_EQUAL(send_metrics(ops, inst, m, 1), KILN_OK);
    ops->base.destroy(inst);
    char path[1024] = "";
    CU_ASSERT_EQUAL_FATAL(find_event_files(blocker, path, sizeof path), 1);
    const want_event want[] = {{1, 1, {"loss"}, {1}}};
    assert_events(path, want, 1);
    fixture_end();
}

static CU_TestInfo cases_tensorboard[] = {
    {"CRC-32C check values, plugin vs bitwise reference", test_crc32c_check_values},
    {"descriptor declares subdir, flush_every_n, filename_suffix", test_descriptor},
    {"scalars round-trip through an independent reader", test_scalars_round_trip},
    {"flush_every_n buffers, epoch end and destroy flush", test_flush_every_n},
    {"two loggers, nested subdir, filename_suffix", test_two_files_suffix_and_subdir},
    {"empty and absolute subdir", test_subdir_empty_and_absolute},
    {"rank != 0 writes nothing", test_rank_nonzero_writes_nothing},
    {"config and I/O errors", test_config_and_io_errors},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "tensorboard", .pTests = cases_tensorboard},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
