/*
 * test_callbacks.c — CUnit suite for the callback plugins progress,
 * csv_logger and hook_trace. Each plugin is loaded from the build's plugin
 * directory through the test host, created with a full config (as the host
 * would resolve it), and fed a synthetic, Lightning-ordered event sequence
 * with a trainer state whose run_dir is a fresh mkdtemp() folder. The tests
 * then read back what the plugin produced: the exact trace lines, the CSV
 * after every event (header growth, rewritten rows, round-tripped values, no
 * temporary file left), and the progress lines captured from stdout.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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
 * Fixtures */

static char g_dir[256];          /* the test's run_dir (mkdtemp)            */
static kiln_trainer_state g_ts;  /* what every event's trainer points at    */

static void fixture_begin(void) {
    kiln_test_reset(g_th);
    fixture_tmpdir(g_dir, sizeof g_dir, "callbacks");
    fixture_fit_state(&g_ts, g_dir);
    (*kiln_test_trainer(g_th)) = g_ts;
}

static void fixture_end(void) { fixture_rmtree(g_dir); }

static const kiln_callback_ops *load(const char *name) {
    return fixture_callback_ops(fixture_load_callback_desc(g_th, name));
}

static kiln_instance *create(const kiln_callback_ops *ops, const kiln_kv *cfg, int32_t *rc) {
    return fixture_create(&ops->base, kiln_test_services(g_th), g_th, cfg, rc);
}

/* create() that must succeed (fatal: the case drives the instance). */
static kiln_instance *create_ok(const kiln_callback_ops *ops, const kiln_kv *cfg) {
    int32_t rc;
    kiln_instance *inst = create(ops, cfg, &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    return inst;
}

/* create() refuses cfg naming needle (and needle2 unless NULL). */
static void config_error(const kiln_callback_ops *ops, const kiln_kv *cfg, const char *needle, const char *needle2) {
    fixture_config_error(&ops->base, kiln_test_services(g_th), g_th, cfg, needle, needle2);
}

/* The run directory made a regular file (its path into file): nothing can
 * be created under it. */
static void run_dir_is_a_file(char *file, size_t n) {
    snprintf(file, n, "%s/plainfile", g_dir);
    FILE *f = fopen(file, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fclose(f);
    g_ts.run_dir = file;
}

/* Event e fails with KILN_E_IO naming `what` and the cause (ENOTDIR: see
 * run_dir_is_a_file). */
static void expect_io_error(const kiln_callback_ops *ops, kiln_instance *inst, kiln_event *e, const char *what) {
    CU_ASSERT_EQUAL(ops->on_event(inst, e), KILN_E_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), what));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), strerror(ENOTDIR)));
}

static kiln_event ev_make(uint32_t id, int32_t stage, int64_t batch) {
    return fixture_event(id, stage, batch, &g_ts);
}

/* Send one event; every plugin answers KILN_OK to well-formed events. */
static void send(const kiln_callback_ops *ops, kiln_instance *inst, uint32_t id, int32_t stage, int64_t batch) {
    kiln_event e = ev_make(id, stage, batch);
    CU_ASSERT_EQUAL(ops->on_event(inst, &e), KILN_OK);
}

static void send_trace(const kiln_callback_ops *ops, kiln_instance *inst, int32_t source, const char *detail,
                       uint32_t trace_event, int32_t stage, int64_t batch, int32_t acc) {
    kiln_event e = ev_make(KILN_EV_TRACE, stage, batch);
    e.source = source;
    e.detail = detail;
    e.trace_event = trace_event;
    e.accumulating = acc;
    CU_ASSERT_EQUAL(ops->on_event(inst, &e), KILN_OK);
}

static void assert_file_is(const char *path, const char *want) {
    char *got = fixture_slurp(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(got);
    CU_ASSERT_STRING_EQUAL(got, want);
    if (strcmp(got, want)) fprintf(stderr, "\n%s:\n--- got ---\n%s--- want ---\n%s", path, got, want);
    free(got);
}

/* ---------------------------------------------------------------------------
 * hook_trace */

static const kiln_kv ht_cfg[] = {
    {"path", KILN_V_STR("hooks.txt")},
    {"include_trace", KILN_V_BOOL(1)},
    {NULL, KILN_V_NONE},
};

static void test_hook_trace_lines(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load("hook_trace");
    kiln_instance *inst = create_ok(ops, ht_cfg);
    char path[512];
    snprintf(path, sizeof path, "%s/hooks.txt", g_dir);

    send(ops, inst, KILN_EV_SETUP, KILN_STAGE_FIT, -1);
    /* Flushed per line: the first line is on disk before the next event. */
    assert_file_is(path, "callback setup\n");
    send(ops, inst, KILN_EV_ON_FIT_START, KILN_STAGE_FIT, -1);
    send(ops, inst, KILN_EV_ON_SANITY_CHECK_START, KILN_STAGE_SANITY, -1);
    send(ops, inst, KILN_EV_ON_VALIDATION_BATCH_START, KILN_STAGE_SANITY, 0);
    send_trace(ops, inst, KILN_SRC_MODULE, "validation_step", KILN_EV_VALIDATION_STEP, KILN_STAGE_SANITY, 0, 0);
    send(ops, inst, KILN_EV_ON_SANITY_CHECK_END, KILN_STAGE_SANITY, -1);
    {
        kiln_event e = ev_make(KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_FIT, 0);
        e.accumulating = 1;
        CU_ASSERT_EQUAL(ops->on_event(inst, &e), KILN_OK);
    }
    send_trace(ops, inst, KILN_SRC_MODULE, "on_train_batch_start", KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_FIT, 0, 1);
    send_trace(ops, inst, KILN_SRC_PRECISION, "pre_backward", 0, KILN_STAGE_FIT, 0, 1);
    send_trace(ops, inst, KILN_SRC_STRATEGY, "post_backward", 0, KILN_STAGE_FIT, 1, 0);
    send_trace(ops, inst, KILN_SRC_OPTIMIZER, "step", 0, KILN_STAGE_FIT, -1, 0);
    /* No detail: the traced hook's own name stands in. */
    send_trace(ops, inst, KILN_SRC_HOST, NULL, KILN_EV_OPTIMIZER_ZERO_GRAD, KILN_STAGE_FIT, -1, 0);
    {
        /* Metrics are the loggers' business, not a hook: not traced. */
        static const kiln_kv m[] = {{"train_loss", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
        kiln_event e = ev_make(KILN_EV_LOG_METRICS, KILN_STAGE_FIT, -1);
        e.metrics = m;
        CU_ASSERT_EQUAL(ops->on_event(inst, &e), KILN_OK);
    }
    send(ops, inst, KILN_EV_ON_TRAIN_BATCH_END, KILN_STAGE_FIT, 1);
    send(ops, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE, -1);
    send(ops, inst, KILN_EV_ON_TEST_START, KILN_STAGE_TEST, -1);
    send(ops, inst, KILN_EV_ON_TEST_BATCH_END, KILN_STAGE_TEST, 7);
    send(ops, inst, KILN_EV_TEARDOWN, 0, -1);

    assert_file_is(path, "callback setup\n"
                         "callback on_fit_start\n"
                         "callback on_sanity_check_start stage=sanity\n"
                         "callback on_validation_batch_start batch=0 stage=sanity\n"
                         "module validation_step batch=0 stage=sanity\n"
                         "callback on_sanity_check_end stage=sanity\n"
                         "callback on_train_batch_start batch=0 acc=1\n"
                         "module on_train_batch_start batch=0 acc=1\n"
                         "precision pre_backward batch=0 acc=1\n"
                         "strategy post_backward batch=1\n"
                         "optimizer step\n"
                         "host optimizer_zero_grad\n"
                         "callback on_train_batch_end batch=1\n"
                         "callback on_validation_end stage=validate\n"
                         "callback on_test_start stage=test\n"
                         "callback on_test_batch_end batch=7 stage=test\n"
                         "callback teardown\n");
    ops->base.destroy(inst);
    fixture_end();
}

static void test_hook_trace_no_trace_abs_path_and_rank(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load("hook_trace");
    char abs_path[512], rel_path[512];
    snprintf(abs_path, sizeof abs_path, "%s/sub/trace.log", g_dir);
    const kiln_kv cfg[] = {{"path", KILN_V_STR(abs_path)}, {"include_trace", KILN_V_BOOL(0)}, {NULL, KILN_V_NONE}};
    kiln_instance *inst = create_ok(ops, cfg);
    /* An absolute path ignores run_dir (pointed elsewhere here). */
    g_ts.run_dir = "/nonexistent-run-dir";
    send(ops, inst, KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_FIT, 3);
    send_trace(ops, inst, KILN_SRC_MODULE, "training_step", KILN_EV_TRAINING_STEP, KILN_STAGE_FIT, 3, 0);
    send(ops, inst, KILN_EV_ON_TRAIN_BATCH_END, KILN_STAGE_FIT, 3);
    assert_file_is(abs_path, "callback on_train_batch_start batch=3\ncallback on_train_batch_end batch=3\n");
    ops->base.destroy(inst);
    g_ts.run_dir = g_dir;

    /* Rank 1 writes beside rank 0's file instead of into it. */
    g_ts.rank = 1;
    g_ts.world_size = 2;
    inst = create_ok(ops, ht_cfg);
    send(ops, inst, KILN_EV_ON_FIT_START, KILN_STAGE_FIT, -1);
    snprintf(rel_path, sizeof rel_path, "%s/hooks.rank1.txt", g_dir);
    assert_file_is(rel_path, "callback on_fit_start\n");
    snprintf(rel_path, sizeof rel_path, "%s/hooks.txt", g_dir);
    CU_ASSERT_FALSE(fixture_file_exists(rel_path));
    ops->base.destroy(inst);
    fixture_end();
}

static void test_hook_trace_errors(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load("hook_trace");
    const kiln_kv bad[] = {{"path", KILN_V_STR("")}, {"include_trace", KILN_V_BOOL(1)}, {NULL, KILN_V_NONE}};
    config_error(ops, bad, "path", NULL);

    /* run_dir is a regular file: the trace cannot be created under it. */
    char file[512];
    run_dir_is_a_file(file, sizeof file);
    kiln_instance *inst = create_ok(ops, ht_cfg);
    kiln_event e = ev_make(KILN_EV_SETUP, KILN_STAGE_FIT, -1);
    expect_io_error(ops, inst, &e, "plainfile/hooks.txt");
    ops->base.destroy(inst);
    fixture_end();
}

/* ---------------------------------------------------------------------------
 * csv_logger */

static const kiln_kv csv_cfg[] = {
    {"filename", KILN_V_STR("metrics.csv")},
    {"flush_every_n", KILN_V_INT(1)},
    {NULL, KILN_V_NONE},
};

static void log_metrics(const kiln_callback_ops *ops, kiln_instance *inst, int64_t step, const kiln_kv *m) {
    kiln_event e = ev_make(KILN_EV_LOG_METRICS, KILN_STAGE_FIT, -1);
    e.metrics = m;
    e.step = step;
    CU_ASSERT_EQUAL(ops->on_event(inst, &e), KILN_OK);
}

/* After every event the file is a complete CSV and no .tmp is left. */
static void csv_expect(const char *path, const char *want) {
    assert_file_is(path, want);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CU_ASSERT_FALSE(fixture_file_exists(tmp));
}

/* Cell `col` of data row `row` (0-based, header excluded) parsed with
 * strtod; NAN for an empty cell. */
static double csv_cell(const char *path, int row, int col) {
    char *s = fixture_slurp(path);
    if (!s) return NAN;
    char *line = strchr(s, '\n');
    for (int r = 0; line && r < row; r++) line = strchr(line + 1, '\n');
    double v = NAN;
    if (line) {
        char *p = line + 1;
        for (int c = 0; c < col && p; c++) {
            p = strpbrk(p, ",\n");
            if (p && *p == ',') p++;
            else p = NULL;
        }
        if (p && *p != ',' && *p != '\n' && *p) v = strtod(p, NULL);
    }
    free(s);
    return v;
}

static int close_rel(double got, double want) { return fabs(got - want) <= 1e-8 * fabs(want); }

static void test_csv_logger_columns_grow(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load("csv_logger");
    kiln_instance *inst = create_ok(ops, csv_cfg);
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.csv", g_dir);

    send(ops, inst, KILN_EV_SETUP, KILN_STAGE_FIT, -1);
    CU_ASSERT_FALSE(fixture_file_exists(path)); /* nothing logged yet */

    const double third = 1.0 / 3.0;
    const kiln_kv m0[] = {{"train_loss", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    log_metrics(ops, inst, 0, m0);
    csv_expect(path, "step,train_loss\n0,0.5\n");

    const kiln_kv m1[] = {{"train_loss", KILN_V_FLOAT(third)}, {NULL, KILN_V_NONE}};
    log_metrics(ops, inst, 1, m1);
    csv_expect(path, "step,train_loss\n0,0.5\n1,0.333333333\n");

    /* Other hooks do not touch the file. */
    send(ops, inst, KILN_EV_ON_TRAIN_BATCH_END, KILN_STAGE_FIT, 1);
    csv_expect(path, "step,train_loss\n0,0.5\n1,0.333333333\n");

    /* A new column: every earlier row is rewritten with an empty cell. */
    const kiln_kv m2[] = {{"val_loss", KILN_V_FLOAT(0.125)}, {NULL, KILN_V_NONE}};
    log_metrics(ops, inst, 1, m2);
    csv_expect(path, "step,train_loss,val_loss\n0,0.5,\n1,0.333333333,\n1,,0.125\n");

    const kiln_kv m3[] = {{"val_loss", KILN_V_FLOAT(1e10)}, {"train_loss", KILN_V_FLOAT(2.5e-7)}, {NULL, KILN_V_NONE}};
    log_metrics(ops, inst, 2, m3);
    csv_expect(path, "step,train_loss,val_loss\n0,0.5,\n1,0.333333333,\n1,,0.125\n2,2.5e-07,1e+10\n");

    /* Values round-trip to %.9g precision; empty cells stay empty. */
    CU_ASSERT(close_rel(csv_cell(path, 0, 1), 0.5));
    CU_ASSERT(close_rel(csv_cell(path, 1, 1), third));
    CU_ASSERT(isnan(csv_cell(path, 1, 2)));
    CU_ASSERT(isnan(csv_cell(path, 2, 1)));
    CU_ASSERT(close_rel(csv_cell(path, 2, 2), 0.125));
    CU_ASSERT(close_rel(csv_cell(path, 3, 1), 2.5e-7));
    CU_ASSERT(close_rel(csv_cell(path, 3, 2), 1e10));
    CU_ASSERT_EQUAL(csv_cell(path, 3, 0), 2.0);

    /* Teardown closes; a later stage (test) appends to the same table. */
    send(ops, inst, KILN_EV_TEARDOWN, KILN_STAGE_FIT, -1);
    const kiln_kv m4[] = {{"train_loss", KILN_V_FLOAT(-4)}, {NULL, KILN_V_NONE}};
    log_metrics(ops, inst, 3, m4);
    csv_expect(path, "step,train_loss,val_loss\n0,0.5,\n1,0.333333333,\n1,,0.125\n2,2.5e-07,1e+10\n3,-4,\n");
    const kiln_kv m5[] = {{"test_acc", KILN_V_FLOAT(0.75)}, {NULL, KILN_V_NONE}};
    log_metrics(ops, inst, 3, m5);
    csv_expect(path, "step,train_loss,val_loss,test_acc\n0,0.5,,\n1,0.333333333,,\n1,,0.125,\n2,2.5e-07,1e+10,\n"
                     "3,-4,,\n3,,,0.75\n");
    ops->base.destroy(inst);
    fixture_end();
}

static void test_csv_logger_buffered_and_quoted(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load("csv_logger");
    const kiln_kv cfg[] = {{"filename", KILN_V_STR("logs/m.csv")}, {"flush_every_n", KILN_V_INT(3)},
                           {NULL, KILN_V_NONE}};
    kiln_instance *inst = create_ok(ops, cfg);
    char path[512];
    snprintf(path, sizeof path, "%s/logs/m.csv", g_dir);
    /* A name that needs CSV quoting, in a subfolder the logger creates. */
    const kiln_kv m0[] = {{"a,\"b\"", KILN_V_FLOAT(1)}, {NULL, KILN_V_NONE}};
    log_metrics(ops, inst, 0, m0);
    csv_expect(path, "step,\"a,\"\"b\"\"\"\n0,1\n");
    /* Appended rows are flushed every third row, and on teardown. */
    log_metrics(ops, inst, 1, m0);
    log_metrics(ops, inst, 2, m0);
    csv_expect(path, "step,\"a,\"\"b\"\"\"\n0,1\n");
    log_metrics(ops, inst, 3, m0);
    csv_expect(path, "step,\"a,\"\"b\"\"\"\n0,1\n1,1\n2,1\n3,1\n");
    log_metrics(ops, inst, 4, m0);
    send(ops, inst, KILN_EV_TEARDOWN, KILN_STAGE_FIT, -1);
    csv_expect(path, "step,\"a,\"\"b\"\"\"\n0,1\n1,1\n2,1\n3,1\n4,1\n");
    ops->base.destroy(inst);
    fixture_end();
}

static void test_csv_logger_rank_and_errors(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load("csv_logger");
    const kiln_kv m0[] = {{"train_loss", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.csv", g_dir);

    /* Rank 1 writes nothing. */
    g_ts.rank = 1;
    g_ts.world_size = 2;
    kiln_instance *inst = create_ok(ops, csv_cfg);
    log_metrics(ops, inst, 0, m0);
    CU_ASSERT_FALSE(fixture_file_exists(path));
    ops->base.destroy(inst);
    g_ts.rank = 0;

    /* A bad value names the key and the value. */
    const kiln_kv bad[] = {{"filename", KILN_V_STR("metrics.csv")}, {"flush_every_n", KILN_V_INT(0)},
                           {NULL, KILN_V_NONE}};
    config_error(ops, bad, "flush_every_n", "0");

    /* The file cannot be created: KILN_E_IO naming the path and the cause. */
    char file[512];
    run_dir_is_a_file(file, sizeof file);
    inst = create_ok(ops, csv_cfg);
    kiln_event e = ev_make(KILN_EV_LOG_METRICS, KILN_STAGE_FIT, -1);
    e.metrics = m0;
    expect_io_error(ops, inst, &e, "plainfile/metrics.csv");
    ops->base.destroy(inst);
    fixture_end();
}

/* ---------------------------------------------------------------------------
 * progress */

static int g_saved_stdout = -1;

static void capture_begin(const char *path) {
    fflush(stdout);
    g_saved_stdout = dup(STDOUT_FILENO);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CU_ASSERT_FATAL(fd >= 0 && g_saved_stdout >= 0);
    dup2(fd, STDOUT_FILENO);
    close(fd);
}

static void capture_end(void) {
    fflush(stdout);
    dup2(g_saved_stdout, STDOUT_FILENO);
    close(g_saved_stdout);
    g_saved_stdout = -1;
}

static void set_metric(const char *name, double v) {
    kiln_test_services(g_th)->log_value(kiln_test_hctx(g_th), name, v, KILN_LOG_PROG_BAR | KILN_LOG_ON_STEP, 1.0);
}

/* A fit run: sanity check (2 val batches), epoch 1 of 5 batches with a
 * validation, epoch 2 stopped after 3 of its 5 batches. */
static void progress_fit(const kiln_callback_ops *ops, kiln_instance *inst) {
    g_ts.max_epochs = 2;
    g_ts.num_training_batches = 5;
    g_ts.num_val_batches = 2;
    send(ops, inst, KILN_EV_SETUP, KILN_STAGE_FIT, -1);
    send(ops, inst, KILN_EV_ON_FIT_START, KILN_STAGE_FIT, -1);
    g_ts.sanity_checking = 1;
    send(ops, inst, KILN_EV_ON_SANITY_CHECK_START, KILN_STAGE_SANITY, -1);
    send(ops, inst, KILN_EV_ON_VALIDATION_START, KILN_STAGE_SANITY, -1);
    for (int b = 0; b < 2; b++) send(ops, inst, KILN_EV_ON_VALIDATION_BATCH_END, KILN_STAGE_SANITY, b);
    send(ops, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_SANITY, -1);
    send(ops, inst, KILN_EV_ON_SANITY_CHECK_END, KILN_STAGE_SANITY, -1);
    g_ts.sanity_checking = 0;
    send(ops, inst, KILN_EV_ON_TRAIN_START, KILN_STAGE_FIT, -1);
    for (int epoch = 0; epoch < 2; epoch++) {
        g_ts.current_epoch = epoch;
        send(ops, inst, KILN_EV_ON_TRAIN_EPOCH_START, KILN_STAGE_FIT, -1);
        int nb = epoch == 0 ? 5 : 3;
        for (int b = 0; b < nb; b++) {
            send(ops, inst, KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_FIT, b);
            set_metric("train_loss", 1.0 / (b + 1) + epoch);
            send(ops, inst, KILN_EV_ON_TRAIN_BATCH_END, KILN_STAGE_FIT, b);
        }
        if (epoch == 0) {
            send(ops, inst, KILN_EV_ON_VALIDATION_START, KILN_STAGE_FIT, -1);
            for (int b = 0; b < 2; b++) send(ops, inst, KILN_EV_ON_VALIDATION_BATCH_END, KILN_STAGE_FIT, b);
            set_metric("val_loss", 0.35);
            set_metric("val_acc", 0.874);
            send(ops, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_FIT, -1);
        }
        send(ops, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT, -1);
    }
    send(ops, inst, KILN_EV_ON_TRAIN_END, KILN_STAGE_FIT, -1);
    send(ops, inst, KILN_EV_TEARDOWN, KILN_STAGE_FIT, -1);
}

/* `line` is `prefix` followed by "<rate> it/s" and nothing else. */
static int is_rate_line(const char *line, const char *prefix) {
    size_t n = strlen(prefix);
    if (strncmp(line, prefix, n)) return 0;
    double rate = -1;
    int end = -1;
    if (sscanf(line + n, "%lf it/s%n", &rate, &end) != 1 || end < 0) return 0;
    return rate >= 0 && line[n + (size_t)end] == '\0';
}

/* What a progress bar of `cfg` prints over progress_fit (created and
 * destroyed here; fatal when create refuses or nothing can be read back).
 * The caller frees the text. */
static char *progress_output(const kiln_callback_ops *ops, const kiln_kv *cfg) {
    kiln_instance *inst = create_ok(ops, cfg);
    char out[512];
    snprintf(out, sizeof out, "%s/stdout.txt", g_dir);
    capture_begin(out);
    progress_fit(ops, inst);
    capture_end();
    ops->base.destroy(inst);
    char *s = fixture_slurp(out);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    return s;
}

static void test_progress_plain(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load("progress");
    const kiln_kv cfg[] = {{"refresh_rate", KILN_V_INT(1)}, {"tty", KILN_V_STR("never")},
                           {"print_every_n_batches", KILN_V_INT(2)}, {NULL, KILN_V_NONE}};
    char *s = progress_output(ops, cfg);
    const char *want[] = {
        "sanity check 2/2",
        "epoch 1 batch 2/5 loss 0.5000 ",
        "epoch 1 batch 4/5 loss 0.2500 ",
        "epoch 1 batch 5/5 loss 0.2000 ",
        "validation epoch 1: val_loss 0.3500 val_acc 0.8740",
        "epoch 2 batch 2/5 loss 1.5000 ",
        "epoch 2 batch 3/5 loss 1.3333 ", /* the epoch ended early: printed at its end */
    };
    const int nwant = (int)(sizeof want / sizeof want[0]);
    int i = 0;
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n"), i++) {
        CU_ASSERT_FATAL(i < nwant);
        CU_ASSERT_PTR_NULL(strchr(line, '\r'));
        int ok = want[i][strlen(want[i]) - 1] == ' ' ? is_rate_line(line, want[i]) : !strcmp(line, want[i]);
        CU_ASSERT(ok);
        if (!ok) fprintf(stderr, "\nline %d: got \"%s\", want \"%s\"", i, line, want[i]);
    }
    CU_ASSERT_EQUAL(i, nwant);
    free(s);

    /* Rank 1 prints nothing at all. */
    kiln_test_reset(g_th);
    g_ts.rank = 1;
    g_ts.world_size = 2;
    s = progress_output(ops, cfg);
    CU_ASSERT_STRING_EQUAL(s, "");
    free(s);
    fixture_end();
}

static void test_progress_tty(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load("progress");
    const kiln_kv cfg[] = {{"refresh_rate", KILN_V_INT(1)}, {"tty", KILN_V_STR("always")},
                           {"print_every_n_batches", KILN_V_INT(50)}, {NULL, KILN_V_NONE}};
    char *s = progress_output(ops, cfg);
    /* Bars are redrawn in place with '\r'; every bar ends on its own line. */
    CU_ASSERT_PTR_NOT_NULL(strstr(s, "\rSanity check  1/2 [==========>         ] 50.0%"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s, "\rSanity check  2/2 [====================] 100.0%"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s, "\rEpoch 1/2  1/5 [====>               ] 20.0%"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s, "\rValidation  2/2 [====================] 100.0%"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s, "\rEpoch 2/2  3/5 [============>       ] 60.0%"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s, " it/s  ETA 0:00"));
    /* The epoch's last draw carries the losses and validation metrics. */
    const char *last1 = strstr(s, "loss 0.200  val_loss 0.350  val_acc 0.874\n");
    CU_ASSERT_PTR_NOT_NULL(last1);
    CU_ASSERT_PTR_NOT_NULL(strstr(s, "loss 1.333  val_loss 0.350  val_acc 0.874\n"));
    size_t n = strlen(s);
    CU_ASSERT(n > 0 && s[n - 1] == '\n');
    /* Lines: sanity bar, epoch 1 (before validation), validation bar, the
     * epoch-1 final draw, epoch 2. */
    int lines = 0;
    for (char *p = s; *p; p++) lines += *p == '\n';
    CU_ASSERT_EQUAL(lines, 5);
    free(s);
    fixture_end();
}

static void test_progress_bad_config(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load("progress");
    const kiln_kv bad_every[] = {{"refresh_rate", KILN_V_INT(1)}, {"tty", KILN_V_STR("never")},
                                 {"print_every_n_batches", KILN_V_INT(0)}, {NULL, KILN_V_NONE}};
    config_error(ops, bad_every, "print_every_n_batches", "got 0");

    const kiln_kv bad_tty[] = {{"refresh_rate", KILN_V_INT(1)}, {"tty", KILN_V_STR("maybe")},
                               {"print_every_n_batches", KILN_V_INT(50)}, {NULL, KILN_V_NONE}};
    config_error(ops, bad_tty, "tty", "\"maybe\"");

    const kiln_kv bad_refresh[] = {{"refresh_rate", KILN_V_INT(-1)}, {"tty", KILN_V_STR("auto")},
                                   {"print_every_n_batches", KILN_V_INT(50)}, {NULL, KILN_V_NONE}};
    config_error(ops, bad_refresh, "refresh_rate", "-1");

    /* refresh_rate 0 disables the bar: nothing is printed. */
    const kiln_kv off[] = {{"refresh_rate", KILN_V_INT(0)}, {"tty", KILN_V_STR("never")},
                           {"print_every_n_batches", KILN_V_INT(1)}, {NULL, KILN_V_NONE}};
    char *s = progress_output(ops, off);
    CU_ASSERT_STRING_EQUAL(s, "");
    free(s);
    fixture_end();
}

static CU_TestInfo cases_callbacks[] = {
    {"hook_trace writes the exact lines", test_hook_trace_lines},
    {"hook_trace include_trace=false, absolute path, rank file", test_hook_trace_no_trace_abs_path_and_rank},
    {"hook_trace config and I/O errors", test_hook_trace_errors},
    {"csv_logger grows columns and rewrites atomically", test_csv_logger_columns_grow},
    {"csv_logger flush_every_n and quoted names", test_csv_logger_buffered_and_quoted},
    {"csv_logger rank 1, config and I/O errors", test_csv_logger_rank_and_errors},
    {"progress plain lines and rank 1 silence", test_progress_plain},
    {"progress terminal bars", test_progress_tty},
    {"progress bad config", test_progress_bad_config},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "callbacks", .pTests = cases_callbacks},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
