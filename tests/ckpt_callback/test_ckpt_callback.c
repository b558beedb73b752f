/*
 * test_ckpt_callback.c — CUnit suite for the `checkpoint` callback plugin
 * (Lightning's ModelCheckpoint), loaded from the build's plugin directory
 * through the test host. The plugin gets a copy of the test host's services table
 * whose save_checkpoint is a fake host: it records every requested path and,
 * only when the test calls host_flush() (the host's "next consistent point":
 * the end of the batch or epoch), creates those files, so the suite can
 * check that an evicted checkpoint survives until its replacement exists.
 * Hooks are fed in Lightning's order (setup, on_fit_start, validation end
 * inside the epoch, on_train_epoch_end) with a mkdtemp() run directory. The
 * suite covers filename templates (epoch, step, metrics, format specs,
 * braces, the version counter), top-k in both modes over score sequences
 * (which paths are requested, which deleted, and when), save_top_k -1/0/1
 * without monitor, the step and epoch triggers, the save_on_train_epoch_end
 * timing (explicit and Lightning's rule), the sanity-check and outside-fit
 * skips, the missing-monitor rule, save_last, the state blob (decoded
 * independently) and a resumed run continuing the bookkeeping, rank 1, and
 * every create-time refusal.
 */
#define _XOPEN_SOURCE 700 /* POSIX: access, mkdir */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CUnit/CUnit.h>

#include <kiln/testing.h>

#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

/* ---------------------------------------------------------------------------
 * The fake host: recorded requests, deferred writes, recorded log lines */

#define MAX_REQ 256
#define MAX_LOG 256
#define PATHLEN 1024

static kiln_host_services g_svc;    /* the test host's table with the fakes below   */
static char g_req[MAX_REQ][PATHLEN]; /* every save_checkpoint path, in order   */
static int g_nreq;
static int g_nwritten;               /* requests host_flush() has written      */
static int32_t g_save_rc;            /* what the fake returns (KILN_OK)        */
static char g_log[MAX_LOG][1200];    /* log lines                              */
static int g_loglevel[MAX_LOG];
static int g_nlog;
static char g_run[512];              /* the run directory (mkdtemp)            */
static char g_ck[600];               /* <run>/checkpoints                      */

static int32_t fake_save(kiln_host_ctx *h, const char *path) {
    if (g_save_rc != KILN_OK) {
        kiln_test_services(g_th)->set_error(h, g_save_rc, "fake host: refused");
        return g_save_rc;
    }
    CU_ASSERT_FATAL(g_nreq < MAX_REQ);
    snprintf(g_req[g_nreq++], PATHLEN, "%s", path);
    return KILN_OK;
}

static void rec_log(kiln_host_ctx *h, int32_t level, const char *msg) {
    (void)h;
    if (g_nlog < MAX_LOG) {
        g_loglevel[g_nlog] = level;
        snprintf(g_log[g_nlog++], sizeof g_log[0], "%s", msg);
    }
    if (getenv("MH_VERBOSE")) fprintf(stderr, "log %d: %s\n", level, msg);
}

static int count_log(int level, const char *needle) {
    int n = 0;
    for (int i = 0; i < g_nlog; i++)
        if (g_loglevel[i] == level && strstr(g_log[i], needle)) n++;
    return n;
}

static void mkdir_parent(const char *path) {
    char tmp[PATHLEN];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *s = tmp + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            mkdir(tmp, 0755);
            *s = '/';
        }
}

/* The host reaching a consistent point: every requested file is written. */
static void host_flush(void) {
    for (; g_nwritten < g_nreq; g_nwritten++) {
        mkdir_parent(g_req[g_nwritten]);
        FILE *f = fopen(g_req[g_nwritten], "w");
        CU_ASSERT_PTR_NOT_NULL_FATAL(f);
        fprintf(f, "checkpoint %d\n", g_nwritten);
        fclose(f);
    }
}

/* <run>/checkpoints/<name>.safetensors, in one of 8 rotating buffers */
static const char *ckpt_path(const char *name) {
    static char buf[8][PATHLEN];
    static int i;
    char *b = buf[i++ & 7];
    snprintf(b, PATHLEN, "%s/%s.safetensors", g_ck, name);
    return b;
}

static void fixture_begin(void) {
    kiln_test_reset(g_th);
    g_svc = *kiln_test_services(g_th);
    g_svc.save_checkpoint = fake_save;
    g_svc.log = rec_log;
    g_nreq = g_nwritten = g_nlog = 0;
    g_save_rc = KILN_OK;
    fixture_tmpdir(g_run, sizeof g_run, "ckpt");
    snprintf(g_ck, sizeof g_ck, "%s/checkpoints", g_run);
    kiln_test_trainer(g_th)->run_dir = g_run;
    kiln_test_trainer(g_th)->stage = KILN_STAGE_FIT;
    kiln_test_trainer(g_th)->num_val_batches = 4;
}

static void *g_blob; /* the last get_state blob (host memory)                  */
static size_t g_blob_size;

static void fixture_end(void) {
    fixture_rmtree(g_run);
    free(g_blob);
    g_blob = NULL;
}

/* ---------------------------------------------------------------------------
 * The plugin */

static const kiln_plugin_desc *load_desc(void) { return fixture_load_callback_desc(g_th, "checkpoint"); }

static const kiln_callback_ops *g_ops;

/* Everything create() reads. The host fills every key with a default and
 * leaves the three default-less keys out unless the run file sets them. */
typedef struct ck_cfg {
    const char *dirpath, *filename, *monitor, *mode;
    int64_t top_k;
    int save_last;
    int has_steps, has_epochs; /* 0: the key is absent */
    int64_t steps, epochs;
    int on_train_epoch_end;    /* -1: absent */
    int weights_only, version_counter, verbose;
} ck_cfg;

static ck_cfg cfg_defaults(void) {
    ck_cfg c = {"checkpoints", "epoch={epoch}-step={step}", "", "min", 1, 0, 0, 0, 0, 0, -1, 0, 1, 0};
    return c;
}

static kiln_kv g_kv[16];

static const kiln_kv *cfg_kv(const ck_cfg *c) {
    int n = 0;
    g_kv[n++] = (kiln_kv){"dirpath", {KILN_TYPE_STRING, 0, {.s = c->dirpath}}};
    g_kv[n++] = (kiln_kv){"filename", {KILN_TYPE_STRING, 0, {.s = c->filename}}};
    g_kv[n++] = (kiln_kv){"monitor", {KILN_TYPE_STRING, 0, {.s = c->monitor}}};
    g_kv[n++] = (kiln_kv){"mode", {KILN_TYPE_STRING, 0, {.s = c->mode}}};
    g_kv[n++] = (kiln_kv){"save_top_k", {KILN_TYPE_INT, 0, {.i = c->top_k}}};
    g_kv[n++] = (kiln_kv){"save_last", {KILN_TYPE_BOOL, 0, {.i = c->save_last}}};
    if (c->has_steps) g_kv[n++] = (kiln_kv){"every_n_train_steps", {KILN_TYPE_INT, 0, {.i = c->steps}}};
    if (c->has_epochs) g_kv[n++] = (kiln_kv){"every_n_epochs", {KILN_TYPE_INT, 0, {.i = c->epochs}}};
    if (c->on_train_epoch_end >= 0)
        g_kv[n++] = (kiln_kv){"save_on_train_epoch_end", {KILN_TYPE_BOOL, 0, {.i = c->on_train_epoch_end}}};
    g_kv[n++] = (kiln_kv){"save_weights_only", {KILN_TYPE_BOOL, 0, {.i = c->weights_only}}};
    g_kv[n++] = (kiln_kv){"enable_version_counter", {KILN_TYPE_BOOL, 0, {.i = c->version_counter}}};
    g_kv[n++] = (kiln_kv){"verbose", {KILN_TYPE_BOOL, 0, {.i = c->verbose}}};
    g_kv[n] = (kiln_kv){NULL, KILN_V_NONE};
    return g_kv;
}

static int32_t try_create(const ck_cfg *c, kiln_instance **inst) {
    g_ops = fixture_callback_ops(load_desc());
    int32_t rc;
    *inst = fixture_create(&g_ops->base, &g_svc, g_th, cfg_kv(c), &rc);
    return rc;
}

static kiln_instance *make(const ck_cfg *c) {
    kiln_instance *inst = NULL;
    int32_t rc = try_create(c, &inst);
    if (rc != KILN_OK) fprintf(stderr, "create: %s\n", kiln_test_error(g_th));
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    return inst;
}

static int32_t send(kiln_instance *inst, uint32_t id, int32_t stage) {
    kiln_event e = fixture_event(id, stage, -1, kiln_test_trainer(g_th));
    return g_ops->on_event(inst, &e);
}

static void fit_start(kiln_instance *inst) {
    CU_ASSERT_EQUAL(send(inst, KILN_EV_SETUP, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_FIT_START, KILN_STAGE_FIT), KILN_OK);
}

static void log_metric(const char *name, double v) {
    kiln_test_services(g_th)->log_value(kiln_test_hctx(g_th), name, v, KILN_LOG_ON_EPOCH, 1.0);
}

/* One training epoch of 10 optimizer steps as the host runs it: the epoch
 * start, the steps, validation logging val_loss = v (NaN: nothing logged),
 * on_validation_end, on_train_epoch_end, then the host writes what was
 * requested (unless !flush) and the epoch counter advances. */
static void epoch(kiln_instance *inst, double v, int flush) {
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_START, KILN_STAGE_FIT), KILN_OK);
    kiln_test_trainer(g_th)->global_step += 10;
    if (!isnan(v)) log_metric("val_loss", v);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    if (flush) host_flush();
    kiln_test_trainer(g_th)->current_epoch++;
}

/* "epoch=E-step=S" of the default template */
static const char *ckpt_path_epoch_step(int64_t e, int64_t s) {
    static char buf[8][64];
    static int i;
    char *b = buf[i++ & 7];
    snprintf(b, 64, "epoch=%lld-step=%lld", (long long)e, (long long)s);
    return ckpt_path(b);
}

/* A fresh fixture and an instance of c past on_fit_start; end() destroys
 * it and the fixture. */
static kiln_instance *begin(const ck_cfg *c) {
    fixture_begin();
    kiln_instance *inst = make(c);
    fit_start(inst);
    return inst;
}

static void end(kiln_instance *inst) {
    g_ops->base.destroy(inst);
    fixture_end();
}

/* The defaults watching val_loss, keeping the best top_k. */
static ck_cfg cfg_monitor(int64_t top_k) {
    ck_cfg c = cfg_defaults();
    c.monitor = "val_loss";
    c.top_k = top_k;
    return c;
}

/* Exactly n checkpoints requested (fatal: the paths are read next), the
 * i-th at the i-th path given; a NULL path is not checked. */
static void expect_reqs(int n, ...) {
    CU_ASSERT_EQUAL_FATAL(g_nreq, n);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        const char *p = va_arg(ap, const char *);
        if (p) CU_ASSERT_STRING_EQUAL(g_req[i], p);
    }
    va_end(ap);
}

/* n epochs without a val_loss, each written by the host. */
static void epochs(kiln_instance *inst, int n) {
    for (int e = 0; e < n; e++) epoch(inst, NAN, 1);
}

/* The next training epoch starts (pending deletions are processed). */
static void epoch_start(kiln_instance *inst) {
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_START, KILN_STAGE_FIT), KILN_OK);
}

/* ---------------------------------------------------------------------------
 * An independent reader of the version-1 state blob */

typedef struct st_view {
    uint32_t mode, flags, nbest, npend;
    int64_t last_step, last_epoch;
    double best_score, kth_value, current;
    char monitor[64], dir_cfg[256], dir[PATHLEN], best[PATHLEN], kth[PATHLEN], last[PATHLEN], topk[PATHLEN];
    char bk_path[16][PATHLEN];
    double bk_score[16];
    char victim[16][PATHLEN], repl[16][PATHLEN];
} st_view;

static uint64_t rd64(const unsigned char *b, size_t *o) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)b[*o + i] << (8 * i);
    *o += 8;
    return x;
}
static uint32_t rd32(const unsigned char *b, size_t *o) {
    uint32_t x = (uint32_t)b[*o] | (uint32_t)b[*o + 1] << 8 | (uint32_t)b[*o + 2] << 16 | (uint32_t)b[*o + 3] << 24;
    *o += 4;
    return x;
}
static double rdf(const unsigned char *b, size_t *o) {
    uint64_t x = rd64(b, o);
    double d;
    memcpy(&d, &x, sizeof d);
    return d;
}
static void rds(const unsigned char *b, size_t *o, char *out, size_t n) {
    uint32_t len = rd32(b, o);
    snprintf(out, n, "%.*s", (int)len, (const char *)b + *o);
    *o += len;
}

/* get_state into g_blob (kept for set_state) and decode it */
static void read_state(kiln_instance *inst, st_view *s) {
    memset(s, 0, sizeof *s);
    free(g_blob);
    g_blob = NULL;
    uint32_t ver = 0;
    CU_ASSERT_EQUAL_FATAL(g_ops->base.get_state(inst, &ver, &g_blob, &g_blob_size), KILN_OK);
    CU_ASSERT_EQUAL(ver, 1u);
    const unsigned char *b = g_blob;
    CU_ASSERT_FATAL(g_blob_size >= 48 && memcmp(b, "KCK1", 4) == 0);
    size_t o = 4;
    s->mode = rd32(b, &o);
    s->flags = rd32(b, &o);
    s->last_step = (int64_t)rd64(b, &o);
    s->last_epoch = (int64_t)rd64(b, &o);
    s->best_score = rdf(b, &o);
    s->kth_value = rdf(b, &o);
    s->current = rdf(b, &o);
    rds(b, &o, s->monitor, sizeof s->monitor);
    rds(b, &o, s->dir_cfg, sizeof s->dir_cfg);
    rds(b, &o, s->dir, sizeof s->dir);
    rds(b, &o, s->best, sizeof s->best);
    rds(b, &o, s->kth, sizeof s->kth);
    rds(b, &o, s->last, sizeof s->last);
    rds(b, &o, s->topk, sizeof s->topk);
    s->nbest = rd32(b, &o);
    CU_ASSERT_FATAL(s->nbest <= 16);
    for (uint32_t i = 0; i < s->nbest; i++) {
        rds(b, &o, s->bk_path[i], PATHLEN);
        s->bk_score[i] = rdf(b, &o);
    }
    s->npend = rd32(b, &o);
    CU_ASSERT_FATAL(s->npend <= 16);
    for (uint32_t i = 0; i < s->npend; i++) {
        rds(b, &o, s->victim[i], PATHLEN);
        rds(b, &o, s->repl[i], PATHLEN);
    }
    CU_ASSERT_EQUAL(o, g_blob_size);
}

/* ---------------------------------------------------------------------------
 * Descriptor */

static void test_descriptor(void) {
    fixture_begin();
    const kiln_plugin_desc *d = load_desc();
    CU_ASSERT_EQUAL(d->kind, KILN_KIND_CALLBACK);
    CU_ASSERT(d->capabilities & KILN_CAP_STATEFUL);
    const char *keys[] = {"dirpath", "filename", "monitor", "mode", "save_top_k", "save_last",
                          "every_n_train_steps", "every_n_epochs", "save_on_train_epoch_end",
                          "save_weights_only", "enable_version_counter", "verbose"};
    const uint32_t types[] = {KILN_TYPE_STRING, KILN_TYPE_STRING, KILN_TYPE_STRING, KILN_TYPE_STRING,
                              KILN_TYPE_INT, KILN_TYPE_BOOL, KILN_TYPE_INT, KILN_TYPE_INT, KILN_TYPE_BOOL,
                              KILN_TYPE_BOOL, KILN_TYPE_BOOL, KILN_TYPE_BOOL};
    size_t n = 0;
    for (const kiln_param *p = d->params; p->key; p++, n++) {
        CU_ASSERT_PTR_NOT_NULL(p->help);
        size_t i = 0;
        while (i < sizeof keys / sizeof *keys && strcmp(keys[i], p->key)) i++;
        CU_ASSERT_FATAL(i < sizeof keys / sizeof *keys);
        CU_ASSERT_EQUAL(p->type, types[i]);
    }
    CU_ASSERT_EQUAL(n, sizeof keys / sizeof *keys);
    fixture_end();
}

/* ---------------------------------------------------------------------------
 * Filenames */

/* One epoch-end save with `filename`; returns the requested path. */
static const char *save_once(const char *filename, kiln_instance **keep) {
    ck_cfg c = cfg_defaults();
    c.filename = filename;
    c.top_k = -1;
    kiln_instance *inst = make(&c);
    fit_start(inst);
    int before = g_nreq;
    epoch(inst, NAN, 1);
    CU_ASSERT_EQUAL(g_nreq, before + 1);
    if (keep) *keep = inst;
    else g_ops->base.destroy(inst);
    return g_req[g_nreq - 1];
}

static void test_filename_format(void) {
    fixture_begin();
    kiln_test_trainer(g_th)->current_epoch = 3;
    kiln_test_trainer(g_th)->global_step = 1224; /* 1234 after the epoch's steps */
    log_metric("val_loss", 0.123456789);
    log_metric("acc", 0.5);
    log_metric("two", 2.0);
    log_metric("tiny", 1e-5);
    log_metric("neg", -1.25);
    /* the default */
    CU_ASSERT_STRING_EQUAL(save_once("epoch={epoch}-step={step}", NULL), ckpt_path("epoch=3-step=1234"));
    kiln_test_trainer(g_th)->current_epoch = 3;
    kiln_test_trainer(g_th)->global_step = 1224;
    /* epoch(...) logs no val_loss for NaN, so the metrics above stay */
    CU_ASSERT_STRING_EQUAL(save_once("e{epoch:03d}-s{step:06}-{val_loss:.4f}-{acc}-{two}-{tiny}", NULL),
                           ckpt_path("e003-s001234-0.1235-0.5-2.0-1e-05"));
    kiln_test_trainer(g_th)->current_epoch = 3;
    kiln_test_trainer(g_th)->global_step = 1224;
    CU_ASSERT_STRING_EQUAL(save_once("{val_loss:.2e}_{val_loss:+08.3f}_{neg:.1f}_{acc:d}_{two:5}_{epoch:.1f}", NULL),
                           ckpt_path("1.23e-01_+000.123_-1.2_0_  2.0_3.0"));
    kiln_test_trainer(g_th)->current_epoch = 3;
    kiln_test_trainer(g_th)->global_step = 1224;
    /* a missing metric is 0 (Lightning), with one warning; braces escape */
    CU_ASSERT_STRING_EQUAL(save_once("{{x}}-{nope}-{nope:.2f}", NULL), ckpt_path("{x}-0-0.00"));
    CU_ASSERT_EQUAL(count_log(KILN_LOG_WARN, "{nope}"), 1);
    kiln_test_trainer(g_th)->current_epoch = 3;
    kiln_test_trainer(g_th)->global_step = 1224;
    /* the extension is not doubled, subfolders are allowed */
    CU_ASSERT_STRING_EQUAL(save_once("sub/best.safetensors", NULL), ckpt_path("sub/best"));
    fixture_end();
}

static void test_filename_refusals(void) {
    const char *bad[] = {"{epoch", "epoch}", "{}", "{:.2f}", "{val:.2d}", "{val:x}", "{val:.f}", "{a{b}",
                         "/abs/{epoch}", "../{epoch}", "a/../b", "", ".safetensors"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fixture_begin();
        ck_cfg c = cfg_defaults();
        c.filename = bad[i];
        kiln_instance *inst;
        CU_ASSERT_EQUAL(try_create(&c, &inst), KILN_E_CONFIG);
        CU_ASSERT_EQUAL(kiln_test_error_code(g_th), KILN_E_CONFIG);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "filename"));
        fixture_end();
    }
}

/* Lightning's version counter, and overwriting the file being replaced */
static void test_version_counter(void) {
    ck_cfg c = cfg_defaults();
    c.filename = "fixed";
    c.top_k = -1;
    kiln_instance *inst = begin(&c);
    epochs(inst, 3);
    expect_reqs(3, ckpt_path("fixed"), ckpt_path("fixed-v1"), ckpt_path("fixed-v2"));
    end(inst);

    /* top 1: the name of the file it replaces is reused, nothing deleted */
    c.top_k = 1;
    inst = begin(&c);
    epochs(inst, 2);
    expect_reqs(2, NULL, ckpt_path("fixed"));
    CU_ASSERT(fixture_file_exists(ckpt_path("fixed")));
    end(inst);

    /* counter off: the same name again */
    c.top_k = -1;
    c.version_counter = 0;
    inst = begin(&c);
    epochs(inst, 2);
    expect_reqs(2, NULL, ckpt_path("fixed"));
    end(inst);
}

/* dirpath: absolute as given; relative to a relative run_dir through cwd */
static void test_dirpath(void) {
    fixture_begin();
    char abs_dir[700];
    snprintf(abs_dir, sizeof abs_dir, "%s/elsewhere/", g_run);
    ck_cfg c = cfg_defaults();
    c.dirpath = abs_dir;
    kiln_instance *inst = make(&c);
    fit_start(inst);
    epoch(inst, NAN, 1);
    char want[800];
    snprintf(want, sizeof want, "%s/elsewhere/epoch=0-step=10.safetensors", g_run);
    expect_reqs(1, want);
    g_ops->base.destroy(inst);

    char cwd[PATHLEN];
    CU_ASSERT_PTR_NOT_NULL_FATAL(getcwd(cwd, sizeof cwd));
    CU_ASSERT_EQUAL_FATAL(chdir(g_run), 0);
    kiln_test_trainer(g_th)->run_dir = "version_0";
    c = cfg_defaults();
    c.dirpath = "ck";
    inst = make(&c);
    fit_start(inst);
    epoch(inst, NAN, 1);
    snprintf(want, sizeof want, "%s/version_0/ck/epoch=1-step=20.safetensors", g_run);
    expect_reqs(2, NULL, want);
    CU_ASSERT(fixture_file_exists(want));
    g_ops->base.destroy(inst);
    CU_ASSERT_EQUAL(chdir(cwd), 0);
    fixture_end();
}

/* ---------------------------------------------------------------------------
 * Top-k */

static void test_topk_min(void) {
    ck_cfg c = cfg_monitor(2);
    kiln_instance *inst = begin(&c);
    epoch(inst, 0.5, 1); /* e0: kept {e0} */
    epoch(inst, 0.4, 1); /* e1: kept {e0, e1}, kth e0 */
    epoch(inst, 0.6, 1); /* e2: worse than the kth: nothing */
    expect_reqs(2, ckpt_path_epoch_step(0, 10), ckpt_path_epoch_step(1, 20));

    /* e3 = 0.3 evicts e0, but the host has not written e3 yet */
    epoch(inst, 0.3, 0);
    expect_reqs(3, NULL, NULL, ckpt_path_epoch_step(3, 40));
    epoch_start(inst);
    CU_ASSERT(fixture_file_exists(ckpt_path_epoch_step(0, 10))); /* kept until its replacement exists */
    host_flush();
    CU_ASSERT(fixture_file_exists(ckpt_path_epoch_step(0, 10)));
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT(!fixture_file_exists(ckpt_path_epoch_step(0, 10))); /* the next hook after the write */
    CU_ASSERT(fixture_file_exists(ckpt_path_epoch_step(1, 20)) && fixture_file_exists(ckpt_path_epoch_step(3, 40)));

    epoch(inst, 0.4, 1);  /* e4: equal to the kth (0.4): not better */
    epoch(inst, 0.35, 1); /* e5: evicts e1 */
    epoch(inst, NAN, 1);  /* e6: val_loss is still e5's 0.35, equal to the kth */
    expect_reqs(4, NULL, NULL, NULL, ckpt_path_epoch_step(5, 60));
    epoch_start(inst);
    CU_ASSERT(!fixture_file_exists(ckpt_path_epoch_step(1, 20)));

    st_view s;
    read_state(inst, &s);
    CU_ASSERT_EQUAL(s.mode, 0u);
    CU_ASSERT_STRING_EQUAL(s.monitor, "val_loss");
    CU_ASSERT_STRING_EQUAL(s.best, ckpt_path_epoch_step(3, 40));
    CU_ASSERT_DOUBLE_EQUAL(s.best_score, 0.3, 0);
    CU_ASSERT_STRING_EQUAL(s.kth, ckpt_path_epoch_step(5, 60));
    CU_ASSERT_DOUBLE_EQUAL(s.kth_value, 0.35, 0);
    CU_ASSERT_EQUAL(s.nbest, 2u);
    CU_ASSERT_STRING_EQUAL(s.bk_path[0], ckpt_path_epoch_step(3, 40));
    CU_ASSERT_STRING_EQUAL(s.bk_path[1], ckpt_path_epoch_step(5, 60));
    CU_ASSERT_EQUAL(s.npend, 0u);
    CU_ASSERT_EQUAL(s.last_step, 60);
    CU_ASSERT_STRING_EQUAL(s.dir, g_ck);
    CU_ASSERT_STRING_EQUAL(s.dir_cfg, "checkpoints");
    /* one info line per requested checkpoint, with its score */
    CU_ASSERT_EQUAL(count_log(KILN_LOG_INFO, "saving"), 4);
    char needle[PATHLEN + 64];
    snprintf(needle, sizeof needle, "saving %s (val_loss = 0.35000, best 0.30000, top 2)", ckpt_path_epoch_step(5, 60));
    CU_ASSERT_EQUAL(count_log(KILN_LOG_INFO, needle), 1);
    end(inst);
}

static void test_topk_max_and_nan(void) {
    ck_cfg c = cfg_defaults();
    c.monitor = "acc";
    c.mode = "max";
    c.filename = "{epoch}-{acc:.2f}";
    kiln_instance *inst = begin(&c);
    const double acc[] = {0.1, 0.3, 0.2, 0.3, 0.5, NAN};
    for (int e = 0; e < 6; e++) {
        log_metric("acc", acc[e]);
        epoch(inst, NAN, 1);
        epoch_start(inst);
    }
    /* 0.1, then 0.3 replaces it; 0.2 and the equal 0.3 do not; 0.5 does; NaN
     * is never better */
    expect_reqs(3, ckpt_path("0-0.10"), ckpt_path("1-0.30"), ckpt_path("4-0.50"));
    CU_ASSERT(!fixture_file_exists(ckpt_path("0-0.10")) && !fixture_file_exists(ckpt_path("1-0.30")) && fixture_file_exists(ckpt_path("4-0.50")));
    end(inst);

    /* a NaN while fewer than k are kept is saved, stored as the worst */
    c.top_k = 2;
    inst = begin(&c);
    log_metric("acc", NAN);
    epoch(inst, NAN, 1);
    log_metric("acc", 0.2);
    epoch(inst, NAN, 1);
    log_metric("acc", 0.1);
    epoch(inst, NAN, 1); /* better than the NaN (-inf): evicts it */
    expect_reqs(3, ckpt_path("0-nan"), NULL, ckpt_path("2-0.10"));
    epoch_start(inst);
    CU_ASSERT(!fixture_file_exists(ckpt_path("0-nan")));
    st_view s;
    read_state(inst, &s);
    CU_ASSERT_STRING_EQUAL(s.best, ckpt_path("1-0.20"));
    CU_ASSERT_STRING_EQUAL(s.kth, ckpt_path("2-0.10"));
    end(inst);
}

static void test_no_monitor(void) {
    /* top 1: the newest only, the previous deleted once the new one exists */
    ck_cfg c = cfg_defaults();
    kiln_instance *inst = begin(&c);
    epoch(inst, NAN, 1);
    epoch(inst, NAN, 0);
    expect_reqs(2, NULL, ckpt_path_epoch_step(1, 20));
    epoch_start(inst);
    CU_ASSERT(fixture_file_exists(ckpt_path_epoch_step(0, 10)));
    host_flush();
    epoch_start(inst);
    CU_ASSERT(!fixture_file_exists(ckpt_path_epoch_step(0, 10)) && fixture_file_exists(ckpt_path_epoch_step(1, 20)));
    /* the last replacement is never written: at on_fit_end the old file stays */
    epoch(inst, NAN, 0);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_FIT_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT(fixture_file_exists(ckpt_path_epoch_step(1, 20)));
    CU_ASSERT_EQUAL(count_log(KILN_LOG_WARN, "was never written"), 1);
    end(inst);

    /* -1: every one kept */
    c.top_k = -1;
    inst = begin(&c);
    epochs(inst, 3);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_FIT_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(g_nreq, 3);
    CU_ASSERT(fixture_file_exists(ckpt_path_epoch_step(0, 10)) && fixture_file_exists(ckpt_path_epoch_step(1, 20)) && fixture_file_exists(ckpt_path_epoch_step(2, 30)));
    end(inst);

    /* 0: nothing */
    c.top_k = 0;
    inst = begin(&c);
    epochs(inst, 3);
    CU_ASSERT_EQUAL(g_nreq, 0);
    CU_ASSERT_EQUAL(count_log(KILN_LOG_INFO, "saving"), 0);
    end(inst);
}

/* ---------------------------------------------------------------------------
 * Triggers and timing */

static int32_t batch_end(kiln_instance *inst, int64_t idx) {
    kiln_event e = fixture_event(KILN_EV_ON_TRAIN_BATCH_END, KILN_STAGE_FIT, idx, kiln_test_trainer(g_th));
    return g_ops->on_event(inst, &e);
}

static void test_every_n_train_steps(void) {
    ck_cfg c = cfg_defaults();
    c.has_steps = 1;
    c.steps = 3;
    c.top_k = -1;
    kiln_instance *inst = begin(&c);
    /* accumulate 2: the global step advances every other batch, so a step
     * that is a multiple of 3 is seen at two batch ends; one save each */
    for (int64_t b = 0; b < 14; b++) {
        kiln_test_trainer(g_th)->global_step = (b + 1) / 2;
        CU_ASSERT_EQUAL(batch_end(inst, b), KILN_OK);
        host_flush();
    }
    /* the epoch end saves nothing: every_n_epochs is off once steps is set */
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    expect_reqs(2, ckpt_path_epoch_step(0, 3), ckpt_path_epoch_step(0, 6));
    g_ops->base.destroy(inst);

    /* not during the sanity check, not outside fit */
    inst = make(&c);
    kiln_test_trainer(g_th)->global_step = 9;
    CU_ASSERT_EQUAL(batch_end(inst, 0), KILN_OK); /* before on_fit_start */
    fit_start(inst);
    kiln_test_trainer(g_th)->sanity_checking = 1;
    CU_ASSERT_EQUAL(batch_end(inst, 0), KILN_OK);
    kiln_test_trainer(g_th)->sanity_checking = 0;
    CU_ASSERT_EQUAL(g_nreq, 2);
    CU_ASSERT_EQUAL(batch_end(inst, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_nreq, 3);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_FIT_END, KILN_STAGE_FIT), KILN_OK);
    kiln_test_trainer(g_th)->global_step = 12;
    CU_ASSERT_EQUAL(batch_end(inst, 0), KILN_OK); /* after on_fit_end */
    CU_ASSERT_EQUAL(g_nreq, 3);
    end(inst);
}

static void test_every_n_epochs(void) {
    ck_cfg c = cfg_defaults();
    c.has_epochs = 1;
    c.epochs = 2;
    c.top_k = -1;
    kiln_instance *inst = begin(&c);
    epochs(inst, 6);
    /* (epoch + 1) % 2 == 0: epochs 1, 3, 5 */
    expect_reqs(3, ckpt_path_epoch_step(1, 20), ckpt_path_epoch_step(3, 40), ckpt_path_epoch_step(5, 60));
    /* no step taken since the last save: nothing, even when due */
    kiln_test_trainer(g_th)->current_epoch = 7;
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    kiln_test_trainer(g_th)->global_step = 61;
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(g_nreq, 4);
    end(inst);

    /* global step 0 (no optimizer step yet) is never saved */
    c = cfg_defaults();
    inst = begin(&c);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(g_nreq, 0);
    end(inst);
}

/* Which hook saves: returns 1 for on_train_epoch_end, 2 for
 * on_validation_end, 0 for none. */
static int saving_hook(const ck_cfg *c) {
    kiln_instance *inst = make(c);
    fit_start(inst);
    kiln_test_trainer(g_th)->global_step += 10;
    int before = g_nreq, hook = 0;
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    if (g_nreq > before) hook = 2;
    before = g_nreq;
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    if (g_nreq > before) hook = hook ? -1 : 1;
    host_flush();
    kiln_test_trainer(g_th)->current_epoch++;
    g_ops->base.destroy(inst);
    return hook;
}

static void test_save_on_train_epoch_end(void) {
    fixture_begin();
    ck_cfg c = cfg_defaults();
    c.top_k = -1;
    c.on_train_epoch_end = 0;
    CU_ASSERT_EQUAL(saving_hook(&c), 2);
    c.on_train_epoch_end = 1;
    CU_ASSERT_EQUAL(saving_hook(&c), 1);
    /* unset: Lightning's rule from the trainer keys */
    c.on_train_epoch_end = -1;
    CU_ASSERT_EQUAL(saving_hook(&c), 1); /* validation once per epoch */
    static kiln_kv vci[] = {{"trainer.val_check_interval", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    kiln_test_set_config(g_th, vci);
    CU_ASSERT_EQUAL(saving_hook(&c), 2); /* validation twice per epoch */
    kiln_test_trainer(g_th)->num_val_batches = 0;
    CU_ASSERT_EQUAL(saving_hook(&c), 1); /* no validation at all */
    static kiln_kv every[] = {{"trainer.check_val_every_n_epoch", KILN_V_INT(2)}, {NULL, KILN_V_NONE}};
    kiln_test_set_config(g_th, every);
    CU_ASSERT_EQUAL(saving_hook(&c), 2); /* validation not every epoch */
    kiln_test_set_config(g_th, NULL);
    kiln_test_trainer(g_th)->num_val_batches = 4;

    /* mid-epoch validation at the same global step twice: one save */
    c.on_train_epoch_end = 0;
    kiln_instance *inst = make(&c);
    fit_start(inst);
    kiln_test_trainer(g_th)->global_step += 5;
    int before = g_nreq;
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    CU_ASSERT_EQUAL(g_nreq, before + 1);
    end(inst);
}

static void test_sanity_and_outside_fit(void) {
    fixture_begin();
    ck_cfg c = cfg_monitor(1);
    c.on_train_epoch_end = 0;
    kiln_instance *inst = make(&c);
    /* a standalone validate (no on_fit_start) saves nothing */
    kiln_test_trainer(g_th)->stage = KILN_STAGE_VALIDATE;
    kiln_test_trainer(g_th)->global_step = 10;
    log_metric("val_loss", 1.0);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    CU_ASSERT_EQUAL(g_nreq, 0);
    /* nor does the sanity check inside fit */
    kiln_test_trainer(g_th)->stage = KILN_STAGE_FIT;
    fit_start(inst);
    kiln_test_trainer(g_th)->sanity_checking = 1;
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_SANITY), KILN_OK);
    kiln_test_trainer(g_th)->sanity_checking = 0;
    CU_ASSERT_EQUAL(g_nreq, 0);
    /* the first real validation end does */
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    CU_ASSERT_EQUAL(g_nreq, 1);
    g_ops->base.destroy(inst);

    /* a sanity validation does not count as a validation run: a monitor
     * still missing afterwards is only a warning */
    c.monitor = "val_acc";
    c.on_train_epoch_end = 1;
    inst = make(&c);
    fit_start(inst);
    kiln_test_trainer(g_th)->sanity_checking = 1;
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_SANITY), KILN_OK);
    kiln_test_trainer(g_th)->sanity_checking = 0;
    kiln_test_trainer(g_th)->global_step = 20;
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(g_nreq, 1);
    CU_ASSERT_EQUAL(count_log(KILN_LOG_WARN, "monitor `val_acc` is not logged yet"), 1);
    end(inst);
}

static void test_missing_monitor(void) {
    ck_cfg c = cfg_monitor(1);
    c.has_steps = 1;
    c.steps = 5;
    kiln_instance *inst = begin(&c);
    /* before any validation: a warning (once), no top-k save */
    kiln_test_trainer(g_th)->global_step = 5;
    CU_ASSERT_EQUAL(batch_end(inst, 4), KILN_OK);
    kiln_test_trainer(g_th)->global_step = 10;
    CU_ASSERT_EQUAL(batch_end(inst, 9), KILN_OK);
    CU_ASSERT_EQUAL(g_nreq, 0);
    CU_ASSERT_EQUAL(count_log(KILN_LOG_WARN, "monitor `val_loss` is not logged yet"), 1);
    /* after a validation run it is a configuration error naming the metric */
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    kiln_test_trainer(g_th)->global_step = 15;
    CU_ASSERT_EQUAL(batch_end(inst, 14), KILN_E_CONFIG);
    CU_ASSERT_EQUAL(kiln_test_error_code(g_th), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "`val_loss`"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "on_train_batch_end"));
    CU_ASSERT_EQUAL(g_nreq, 0);
    g_ops->base.destroy(inst);

    /* at the epoch end after validation (the default timing) likewise */
    c = cfg_defaults();
    c.monitor = "val_acc";
    inst = make(&c);
    fit_start(inst);
    kiln_test_trainer(g_th)->global_step = 20;
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "`val_acc`"));
    end(inst);
}

static void test_save_last(void) {
    ck_cfg c = cfg_monitor(1);
    c.save_last = 1;
    kiln_instance *inst = begin(&c);
    epoch(inst, 0.5, 1); /* top-k and last */
    epoch(inst, 0.7, 1); /* not in the top 1: last only */
    epoch(inst, 0.2, 1); /* both; e0 evicted */
    epoch_start(inst);
    expect_reqs(5, ckpt_path_epoch_step(0, 10), ckpt_path("last"), ckpt_path("last"), ckpt_path_epoch_step(2, 30), ckpt_path("last"));
    CU_ASSERT(!fixture_file_exists(ckpt_path_epoch_step(0, 10)) && fixture_file_exists(ckpt_path_epoch_step(2, 30)) && fixture_file_exists(ckpt_path("last")));
    CU_ASSERT_EQUAL(count_log(KILN_LOG_INFO, "(save_last)"), 3);
    st_view s;
    read_state(inst, &s);
    CU_ASSERT_STRING_EQUAL(s.last, ckpt_path("last"));
    CU_ASSERT_STRING_EQUAL(s.topk, ckpt_path_epoch_step(2, 30));
    end(inst);

    /* save_top_k 0 with save_last: only last */
    c = cfg_defaults();
    c.top_k = 0;
    c.save_last = 1;
    inst = begin(&c);
    epochs(inst, 2);
    expect_reqs(2, ckpt_path("last"), ckpt_path("last"));
    end(inst);
}

/* ---------------------------------------------------------------------------
 * State */

static void test_state_resume(void) {
    ck_cfg c = cfg_monitor(2);
    kiln_instance *a = begin(&c);
    epoch(a, 0.5, 1);
    epoch(a, 0.4, 1);
    epoch(a, 0.3, 0); /* e2 evicts e0; the host writes e2 with this state */
    st_view s;
    read_state(a, &s);
    CU_ASSERT_EQUAL(s.npend, 1u);
    CU_ASSERT_STRING_EQUAL(s.victim[0], ckpt_path_epoch_step(0, 10));
    CU_ASSERT_STRING_EQUAL(s.repl[0], ckpt_path_epoch_step(2, 30));
    CU_ASSERT_STRING_EQUAL(s.topk, ckpt_path_epoch_step(2, 30));
    CU_ASSERT_EQUAL(s.flags & 3u, 3u);
    CU_ASSERT_DOUBLE_EQUAL(s.current, 0.3, 0);
    host_flush();
    g_ops->base.destroy(a); /* the run stops before any later hook */
    CU_ASSERT(fixture_file_exists(ckpt_path_epoch_step(0, 10)));

    /* a resumed run: same configuration, state from the file */
    kiln_instance *b = make(&c);
    CU_ASSERT_EQUAL_FATAL(g_ops->base.set_state(b, 1, g_blob, g_blob_size), KILN_OK);
    fit_start(b);
    CU_ASSERT(!fixture_file_exists(ckpt_path_epoch_step(0, 10))); /* the restored deletion, e2 exists */
    epoch(b, 0.45, 1);             /* e3: worse than the kth (0.4): nothing */
    CU_ASSERT_EQUAL(g_nreq, 3);
    epoch(b, 0.35, 1);             /* e4: evicts e1 */
    epoch_start(b);
    expect_reqs(4, NULL, NULL, NULL, ckpt_path_epoch_step(4, 50));
    CU_ASSERT(!fixture_file_exists(ckpt_path_epoch_step(1, 20)));
    epoch(b, 0.2, 1); /* e5: evicts e4 (0.35 is now the kth) */
    epoch_start(b);
    CU_ASSERT(!fixture_file_exists(ckpt_path_epoch_step(4, 50)));
    epoch(b, 0.1, 1); /* e6: evicts e2, the file the run resumed from: kept */
    epoch_start(b);
    CU_ASSERT_EQUAL_FATAL(g_nreq, 6);
    CU_ASSERT(fixture_file_exists(ckpt_path_epoch_step(2, 30)));
    read_state(b, &s);
    CU_ASSERT_STRING_EQUAL(s.best, ckpt_path_epoch_step(6, 70));
    CU_ASSERT_DOUBLE_EQUAL(s.best_score, 0.1, 0);
    CU_ASSERT_EQUAL(s.nbest, 2u);
    CU_ASSERT_STRING_EQUAL(s.bk_path[0], ckpt_path_epoch_step(5, 60));
    CU_ASSERT_STRING_EQUAL(s.bk_path[1], ckpt_path_epoch_step(6, 70));
    CU_ASSERT_STRING_EQUAL(s.kth, ckpt_path_epoch_step(5, 60));
    end(b);
}

/* kiln resumes into a new version_N: with the same configured dirpath the
 * bookkeeping continues, but files of the old run directory are never
 * deleted (they are outside the current dirpath) */
static void test_state_resume_new_run_dir(void) {
    fixture_begin();
    char v0[600], v1[600];
    snprintf(v0, sizeof v0, "%s/version_0", g_run);
    snprintf(v1, sizeof v1, "%s/version_1", g_run);
    CU_ASSERT_EQUAL_FATAL(mkdir(v0, 0755), 0);
    CU_ASSERT_EQUAL_FATAL(mkdir(v1, 0755), 0);
    kiln_test_trainer(g_th)->run_dir = v0;
    ck_cfg c = cfg_monitor(2);
    kiln_instance *a = make(&c);
    fit_start(a);
    epoch(a, 0.5, 1);
    epoch(a, 0.4, 1);
    epoch(a, 0.3, 0); /* evicts e0, waiting for e2 */
    st_view s;
    read_state(a, &s);
    host_flush();
    g_ops->base.destroy(a);
    char old0[800], old1[800], old2[800], new4[800];
    snprintf(old0, sizeof old0, "%s/checkpoints/epoch=0-step=10.safetensors", v0);
    snprintf(old1, sizeof old1, "%s/checkpoints/epoch=1-step=20.safetensors", v0);
    snprintf(old2, sizeof old2, "%s/checkpoints/epoch=2-step=30.safetensors", v0);

    kiln_test_trainer(g_th)->run_dir = v1;
    kiln_instance *b = make(&c);
    CU_ASSERT_EQUAL_FATAL(g_ops->base.set_state(b, 1, g_blob, g_blob_size), KILN_OK);
    fit_start(b);
    CU_ASSERT(fixture_file_exists(old0)); /* outside version_1/checkpoints: kept */
    epoch(b, 0.45, 1);       /* worse than the restored kth (0.4): nothing */
    CU_ASSERT_EQUAL(g_nreq, 3);
    epoch(b, 0.35, 1);       /* better: saved in the new folder, e1 evicted but kept */
    epoch_start(b);
    CU_ASSERT_EQUAL_FATAL(g_nreq, 4);
    snprintf(new4, sizeof new4, "%s/checkpoints/epoch=4-step=50.safetensors", v1);
    CU_ASSERT_STRING_EQUAL(g_req[3], new4);
    CU_ASSERT(fixture_file_exists(old1) && fixture_file_exists(old2) && fixture_file_exists(new4));
    read_state(b, &s);
    CU_ASSERT_STRING_EQUAL(s.best, old2); /* the best is still the old run's */
    CU_ASSERT_EQUAL(s.nbest, 2u);
    CU_ASSERT_STRING_EQUAL(s.bk_path[0], old2);
    CU_ASSERT_STRING_EQUAL(s.bk_path[1], new4);
    end(b);
}

/* A run whose state waits to delete ckpt_path_epoch_step(0, 10) once ckpt_path_epoch_step(2, 30) exists; the
 * blob is in g_blob. */
static void make_pending_blob(const ck_cfg *c) {
    kiln_instance *a = make(c);
    fit_start(a);
    epoch(a, 0.5, 1);
    epoch(a, 0.4, 1);
    epoch(a, 0.3, 0);
    st_view s;
    read_state(a, &s);
    CU_ASSERT_EQUAL_FATAL(s.npend, 1u);
    host_flush();
    g_ops->base.destroy(a);
}

/* Replaces the last occurrence of `from` in the blob by `to` (same length):
 * a crafted checkpoint that still decodes. */
static void patch_blob(const char *from, const char *to) {
    size_t n = strlen(from);
    CU_ASSERT_EQUAL_FATAL(strlen(to), n);
    unsigned char *b = g_blob, *hit = NULL;
    for (size_t i = 0; i + n <= g_blob_size; i++)
        if (!memcmp(b + i, from, n)) hit = b + i;
    CU_ASSERT_PTR_NOT_NULL_FATAL(hit);
    memcpy(hit, to, n);
}

/* A checkpoint must not make fit --ckpt delete files outside dirpath: a
 * "<dirpath>/../x" pending deletion is refused at set_state, and a
 * normal-form path through a sub-folder that is a symbolic link to
 * elsewhere is never deleted. */
static void test_state_hostile_paths(void) {
    fixture_begin();
    ck_cfg c = cfg_monitor(2);
    make_pending_blob(&c);
    const char *victim = ckpt_path_epoch_step(0, 10); /* <run>/checkpoints/epoch=0-step=10.safetensors */
    const size_t rest = strlen("epoch=0-step=10.safetensors");

    /* 1. "../": a file beside the checkpoint folder */
    char name[64], outside[2 * PATHLEN], hostile[2 * PATHLEN];
    snprintf(name, sizeof name, "%.*s", (int)(rest - 3), "victim-of-a-crafted-checkpoint");
    snprintf(outside, sizeof outside, "%s/%s", g_run, name);
    snprintf(hostile, sizeof hostile, "%s/../%s", g_ck, name);
    FILE *f = fopen(outside, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs("precious\n", f);
    fclose(f);
    patch_blob(victim, hostile);
    kiln_instance *b = make(&c);
    g_nlog = 0;
    CU_ASSERT_EQUAL(g_ops->base.set_state(b, 1, g_blob, g_blob_size), KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "pending deletion"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), hostile));
    fit_start(b);
    CU_ASSERT(fixture_file_exists(outside));
    g_ops->base.destroy(b);

    /* 2. a sub-folder of dirpath that links elsewhere */
    patch_blob(hostile, victim); /* back to the original blob */
    char linkdir[2 * PATHLEN], target_dir[2 * PATHLEN], via_link[2 * PATHLEN], real_file[4 * PATHLEN];
    snprintf(target_dir, sizeof target_dir, "%s/elsewhere", g_run);
    CU_ASSERT_EQUAL_FATAL(mkdir(target_dir, 0755), 0);
    snprintf(linkdir, sizeof linkdir, "%s/lnk", g_ck);
    CU_ASSERT_EQUAL_FATAL(symlink(target_dir, linkdir), 0);
    snprintf(name, sizeof name, "%.*s", (int)(rest - 4), "file-behind-a-symbolic-link");
    snprintf(via_link, sizeof via_link, "%s/lnk/%s", g_ck, name);
    snprintf(real_file, sizeof real_file, "%s/%s", target_dir, name);
    f = fopen(real_file, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fclose(f);
    patch_blob(victim, via_link);
    b = make(&c);
    CU_ASSERT_EQUAL_FATAL(g_ops->base.set_state(b, 1, g_blob, g_blob_size), KILN_OK);
    fit_start(b); /* the replacement exists: the deletion is processed */
    CU_ASSERT(fixture_file_exists(real_file));
    CU_ASSERT(fixture_file_exists(victim)); /* the original victim was never named */
    g_ops->base.destroy(b);
    CU_ASSERT_EQUAL(unlink(linkdir), 0);

    /* 3. the untouched blob still deletes its own victim */
    patch_blob(via_link, victim);
    b = make(&c);
    CU_ASSERT_EQUAL_FATAL(g_ops->base.set_state(b, 1, g_blob, g_blob_size), KILN_OK);
    fit_start(b);
    CU_ASSERT(!fixture_file_exists(victim));
    end(b);
}

static void test_verbose(void) {
    ck_cfg c = cfg_monitor(1);
    c.verbose = 1;
    kiln_instance *inst = begin(&c);
    epoch(inst, 0.5, 1);
    epoch(inst, 0.7, 1);
    CU_ASSERT_EQUAL(count_log(KILN_LOG_INFO, "val_loss = 0.7 was not in top 1"), 1);
    epoch(inst, 0.2, 1);
    epoch_start(inst);
    char needle[2 * PATHLEN + 64];
    snprintf(needle, sizeof needle, "removed %s (replaced by %s)", ckpt_path_epoch_step(0, 10), ckpt_path_epoch_step(2, 30));
    CU_ASSERT_EQUAL(count_log(KILN_LOG_INFO, needle), 1);
    CU_ASSERT_EQUAL(count_log(KILN_LOG_INFO, "saving"), 2);
    end(inst);
}

static void test_state_mismatch_and_corrupt(void) {
    ck_cfg c = cfg_monitor(1);
    kiln_instance *a = begin(&c);
    epoch(a, 0.5, 1);
    st_view s;
    read_state(a, &s);
    g_ops->base.destroy(a);

    /* another monitor: the state is not this callback's, it starts fresh */
    c.monitor = "val_acc";
    kiln_instance *b = make(&c);
    CU_ASSERT_EQUAL(g_ops->base.set_state(b, 1, g_blob, g_blob_size), KILN_OK);
    CU_ASSERT_EQUAL(count_log(KILN_LOG_WARN, "starting fresh"), 1);
    void *keep = g_blob;
    size_t keep_size = g_blob_size;
    g_blob = NULL;
    read_state(b, &s);
    CU_ASSERT_EQUAL(s.nbest, 0u);
    CU_ASSERT_STRING_EQUAL(s.best, "");
    g_ops->base.destroy(b);

    /* another dirpath: only best_model_path comes back */
    c.monitor = "val_loss";
    c.dirpath = "other";
    b = make(&c);
    CU_ASSERT_EQUAL(g_ops->base.set_state(b, 1, keep, keep_size), KILN_OK);
    CU_ASSERT_EQUAL(count_log(KILN_LOG_WARN, "dirpath changed"), 1);
    read_state(b, &s);
    CU_ASSERT_STRING_EQUAL(s.best, ckpt_path_epoch_step(0, 10));
    CU_ASSERT_EQUAL(s.nbest, 0u);

    /* other versions and damaged blobs are refused */
    CU_ASSERT_EQUAL(g_ops->base.set_state(b, 2, keep, keep_size), KILN_E_STATE);
    CU_ASSERT_EQUAL(g_ops->base.set_state(b, 1, keep, keep_size - 3), KILN_E_DATA);
    unsigned char *bad = malloc(keep_size);
    memcpy(bad, keep, keep_size);
    bad[0] = 'X';
    CU_ASSERT_EQUAL(g_ops->base.set_state(b, 1, bad, keep_size), KILN_E_DATA);
    memcpy(bad, keep, keep_size);
    memset(bad + keep_size - 4, 0xff, 4); /* an absurd pending count */
    CU_ASSERT_EQUAL(g_ops->base.set_state(b, 1, bad, keep_size), KILN_E_DATA);
    free(bad);
    free(keep);
    end(b);
}

/* ---------------------------------------------------------------------------
 * Ranks, host errors, refusals */

static void test_rank1(void) {
    fixture_begin();
    kiln_test_trainer(g_th)->rank = 1;
    kiln_test_trainer(g_th)->world_size = 2;
    ck_cfg c = cfg_monitor(1);
    c.save_last = 1;
    kiln_instance *inst = make(&c);
    fit_start(inst);
    /* a file rank 0 would delete stays: rank 1 deletes nothing */
    epoch(inst, 0.5, 1);
    mkdir_parent(ckpt_path_epoch_step(0, 10));
    FILE *f = fopen(ckpt_path_epoch_step(0, 10), "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fclose(f);
    epoch(inst, 0.4, 1);
    epoch_start(inst);
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_FIT_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(g_nreq, 0);
    CU_ASSERT(fixture_file_exists(ckpt_path_epoch_step(0, 10)));
    CU_ASSERT_EQUAL(count_log(KILN_LOG_INFO, "saving"), 0);
    /* the same bookkeeping as rank 0 */
    st_view s;
    read_state(inst, &s);
    CU_ASSERT_STRING_EQUAL(s.best, ckpt_path_epoch_step(1, 20));
    CU_ASSERT_EQUAL(s.nbest, 1u);
    CU_ASSERT_EQUAL(s.npend, 0u);
    CU_ASSERT_EQUAL(s.last_step, 20);
    end(inst);
}

static void test_host_refuses(void) {
    ck_cfg c = cfg_defaults();
    kiln_instance *inst = begin(&c);
    g_save_rc = KILN_E_STATE;
    kiln_test_trainer(g_th)->global_step = 10;
    CU_ASSERT_EQUAL(send(inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "save_checkpoint"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), ckpt_path_epoch_step(0, 10)));
    g_ops->base.destroy(inst);

    /* a host without save_checkpoint is refused at create */
    g_svc.save_checkpoint = NULL;
    CU_ASSERT_EQUAL(try_create(&c, &inst), KILN_E_HOST_TOO_OLD);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "save_checkpoint"));
    g_svc.save_checkpoint = fake_save;
    g_svc.abi_minor = 1;
    CU_ASSERT_EQUAL(try_create(&c, &inst), KILN_E_HOST_TOO_OLD);
    fixture_end();
}

static void refuse(ck_cfg c, const char *needle) {
    kiln_instance *inst;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(try_create(&c, &inst), KILN_E_CONFIG);
    if (!strstr(kiln_test_error(g_th), needle)) fprintf(stderr, "\nmessage \"%s\" lacks \"%s\"\n", kiln_test_error(g_th), needle);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), needle));
}

static void test_refusals(void) {
    fixture_begin();
    ck_cfg c = cfg_defaults();
    c.weights_only = 1;
    refuse(c, "save_weights_only");
    c = cfg_defaults();
    c.mode = "avg";
    refuse(c, "\"avg\"");
    c = cfg_defaults();
    c.has_steps = 1;
    c.steps = -1;
    refuse(c, "every_n_train_steps must be >= 0");
    c = cfg_defaults();
    c.has_epochs = 1;
    c.epochs = -2;
    refuse(c, "every_n_epochs must be >= 0");
    c = cfg_defaults();
    c.has_steps = c.has_epochs = 1;
    c.steps = 10;
    c.epochs = 1;
    refuse(c, "mutually exclusive");
    c = cfg_defaults();
    c.top_k = -2;
    refuse(c, "save_top_k must be >= -1");
    c = cfg_defaults();
    c.top_k = 3;
    refuse(c, "needs a monitor");
    c = cfg_defaults();
    c.dirpath = "";
    refuse(c, "dirpath");
    /* accepted: k > 1 with a monitor; explicit zeros */
    kiln_instance *inst;
    c = cfg_defaults();
    c.top_k = 3;
    c.monitor = "val_loss";
    CU_ASSERT_EQUAL(try_create(&c, &inst), KILN_OK);
    g_ops->base.destroy(inst);
    c.has_steps = c.has_epochs = 1;
    c.steps = c.epochs = 0;
    CU_ASSERT_EQUAL(try_create(&c, &inst), KILN_OK);
    end(inst);
}

static CU_TestInfo cases_checkpoint[] = {
    {"descriptor", test_descriptor},
    {"filename_format", test_filename_format},
    {"filename_refusals", test_filename_refusals},
    {"version_counter", test_version_counter},
    {"dirpath", test_dirpath},
    {"topk_min", test_topk_min},
    {"topk_max_and_nan", test_topk_max_and_nan},
    {"no_monitor", test_no_monitor},
    {"every_n_train_steps", test_every_n_train_steps},
    {"every_n_epochs", test_every_n_epochs},
    {"save_on_train_epoch_end", test_save_on_train_epoch_end},
    {"sanity_and_outside_fit", test_sanity_and_outside_fit},
    {"missing_monitor", test_missing_monitor},
    {"save_last", test_save_last},
    {"state_resume", test_state_resume},
    {"state_resume_new_run_dir", test_state_resume_new_run_dir},
    {"state_mismatch_and_corrupt", test_state_mismatch_and_corrupt},
    {"state_hostile_paths", test_state_hostile_paths},
    {"verbose", test_verbose},
    {"rank1", test_rank1},
    {"host_refuses", test_host_refuses},
    {"refusals", test_refusals},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "checkpoint", .pTests = cases_checkpoint},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
