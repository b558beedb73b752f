/*
 * test_stopping.c — CUnit suite for the callback plugins early_stopping and
 * nan_guard, each loaded from the build's plugin directory through the mock
 * host. The plugins get the test host's services table with request_stop and log
 * replaced by recorders, so a test can assert exactly when a stop was
 * requested and with which reason. early_stopping is fed Lightning-ordered
 * fit events (setup, on_fit_start, then per epoch a logged metric,
 * on_validation_end and on_train_epoch_end) and checked against every rule of
 * Lightning's EarlyStopping: patience, min_delta in both modes, the two
 * thresholds, check_finite, strict and non-strict missing metrics, the
 * sanity-check and outside-fit skips, both check timings (explicit and
 * derived from the trainer keys) and the checkpointed state. nan_guard gets
 * parameters registered with the test host (float32, and float64 masters
 * allocated here) holding planted nan/inf values, and is checked for the
 * status, the exact message, the gradient-scaler exemption, frozen
 * parameters, device memory read back through a fake accelerator, and
 * silence on finite values.
 */
#define _GNU_SOURCE
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/CUnit.h>

#include <kiln/testing.h>

#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

/* ---------------------------------------------------------------------------
 * A services table that records stop requests and log lines */

static kiln_host_services g_svc;   /* the test host's table with two recorders     */
static int g_stops;                /* request_stop calls since fixture_begin  */
static char g_stop_reason[1024];   /* the last reason                          */
static char g_log[16][1024];       /* log lines, oldest first                  */
static int g_nlog;

static void rec_request_stop(kiln_host_ctx *h, const char *reason) {
    kiln_test_services(g_th)->request_stop(h, reason);
    g_stops++;
    snprintf(g_stop_reason, sizeof g_stop_reason, "%s", reason ? reason : "");
}

static void rec_log(kiln_host_ctx *h, int32_t level, const char *msg) {
    (void)h;
    (void)level;
    if (g_nlog < 16) snprintf(g_log[g_nlog++], sizeof g_log[0], "%s", msg);
}

static int logged_line(const char *needle) {
    for (int i = 0; i < g_nlog; i++)
        if (strstr(g_log[i], needle)) return 1;
    return 0;
}

static void fixture_begin(void) {
    kiln_test_reset(g_th);
    g_svc = *kiln_test_services(g_th);
    g_svc.request_stop = rec_request_stop;
    g_svc.log = rec_log;
    g_stops = 0;
    g_stop_reason[0] = '\0';
    g_nlog = 0;
    kiln_test_trainer(g_th)->stage = KILN_STAGE_FIT;
}

static const kiln_plugin_desc *load_desc(const char *name) { return fixture_load_callback_desc(g_th, name); }

static const kiln_callback_ops *load(const char *name) { return fixture_callback_ops(load_desc(name)); }

static kiln_instance *create(const kiln_callback_ops *ops, const kiln_kv *cfg, int32_t *rc) {
    return fixture_create(&ops->base, &g_svc, g_th, cfg, rc);
}

static kiln_event ev_make(uint32_t id, int32_t stage, int64_t batch) {
    return fixture_event(id, stage, batch, kiln_test_trainer(g_th));
}

static int32_t send(const kiln_callback_ops *ops, kiln_instance *inst, uint32_t id, int32_t stage) {
    kiln_event e = ev_make(id, stage, -1);
    return ops->on_event(inst, &e);
}

/* ---------------------------------------------------------------------------
 * early_stopping fixtures */

/* Everything create() reads; the host would fill every declared key that has
 * a default, and leaves the thresholds and check_on_train_epoch_end out when
 * the run file does not set them. */
typedef struct es_cfg {
    const char *monitor, *mode;
    double min_delta;
    int64_t patience;
    int verbose, strict, check_finite;
    int has_st, has_dv, timing; /* timing: -1 unset, else 0/1 */
    double st, dv;
} es_cfg;

static es_cfg es_defaults(void) {
    es_cfg c = {"val_loss", "min", 0.0, 3, 0, 1, 1, 0, 0, -1, 0.0, 0.0};
    return c;
}

/* Fill kv[16] from c. */
static const kiln_kv *es_kv(kiln_kv *kv, const es_cfg *c) {
    int n = 0;
    kv[n++] = (kiln_kv){"monitor", {KILN_TYPE_STRING, 0, {.s = c->monitor}}};
    kv[n++] = (kiln_kv){"min_delta", {KILN_TYPE_FLOAT, 0, {.f = c->min_delta}}};
    kv[n++] = (kiln_kv){"patience", {KILN_TYPE_INT, 0, {.i = c->patience}}};
    kv[n++] = (kiln_kv){"verbose", {KILN_TYPE_BOOL, 0, {.i = c->verbose}}};
    kv[n++] = (kiln_kv){"mode", {KILN_TYPE_STRING, 0, {.s = c->mode}}};
    kv[n++] = (kiln_kv){"strict", {KILN_TYPE_BOOL, 0, {.i = c->strict}}};
    kv[n++] = (kiln_kv){"check_finite", {KILN_TYPE_BOOL, 0, {.i = c->check_finite}}};
    kv[n++] = (kiln_kv){"log_rank_zero_only", {KILN_TYPE_BOOL, 0, {.i = 0}}};
    if (c->has_st) kv[n++] = (kiln_kv){"stopping_threshold", {KILN_TYPE_FLOAT, 0, {.f = c->st}}};
    if (c->has_dv) kv[n++] = (kiln_kv){"divergence_threshold", {KILN_TYPE_FLOAT, 0, {.f = c->dv}}};
    if (c->timing >= 0) kv[n++] = (kiln_kv){"check_on_train_epoch_end", {KILN_TYPE_BOOL, 0, {.i = c->timing}}};
    kv[n] = (kiln_kv){NULL, KILN_V_NONE};
    return kv;
}

static const kiln_callback_ops *g_es;
static kiln_kv g_es_kv[16];

static kiln_instance *es_new(const es_cfg *c) {
    g_es = load("early_stopping");
    int32_t rc;
    kiln_instance *inst = create(g_es, es_kv(g_es_kv, c), &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    return inst;
}

/* trainer.fit up to the first epoch: setup, on_fit_start */
static void es_fit_start(kiln_instance *inst) {
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_SETUP, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_FIT_START, KILN_STAGE_FIT), KILN_OK);
}

static void log_metric(const char *name, double v) {
    kiln_test_services(g_th)->log_value(kiln_test_hctx(g_th), name, v, KILN_LOG_ON_EPOCH, 1.0);
}

/* One epoch as the host runs it: validation (which logs `v`) ends inside the
 * training epoch, then on_train_epoch_end; current_epoch then advances. Both
 * hooks must succeed. */
static void es_epoch(kiln_instance *inst, double v) {
    log_metric("val_loss", v);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    kiln_test_trainer(g_th)->current_epoch++;
}

/* The decoded version-1 state blob. */
typedef struct es_state {
    uint32_t mode, reason;
    int64_t wait, stopped_epoch, patience;
    double best;
    char monitor[64];
} es_state;

static uint64_t le64(const unsigned char *p) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)p[i] << (8 * i);
    return x;
}
static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static es_state es_read_state(kiln_instance *inst) {
    es_state s;
    memset(&s, 0, sizeof s);
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(g_es->base.get_state(inst, &ver, &blob, &size), KILN_OK);
    CU_ASSERT_EQUAL(ver, 1u);
    CU_ASSERT_FATAL(size >= 48);
    const unsigned char *b = blob;
    CU_ASSERT(memcmp(b, "KES1", 4) == 0);
    s.mode = le32(b + 4);
    s.wait = (int64_t)le64(b + 8);
    s.stopped_epoch = (int64_t)le64(b + 16);
    s.patience = (int64_t)le64(b + 24);
    uint64_t bits = le64(b + 32);
    memcpy(&s.best, &bits, sizeof s.best);
    s.reason = le32(b + 40);
    uint32_t ml = le32(b + 44);
    CU_ASSERT_EQUAL(size, 48 + (size_t)ml);
    snprintf(s.monitor, sizeof s.monitor, "%.*s", (int)ml, (const char *)b + 48);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    return s;
}

/* ---------------------------------------------------------------------------
 * early_stopping: the rules */

static void test_es_patience(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, 1.0);  /* improvement over +inf */
    es_epoch(inst, 0.9);  /* improvement */
    es_epoch(inst, 0.95); /* wait 1 */
    es_epoch(inst, 0.9);  /* equal is no improvement: wait 2 */
    CU_ASSERT_EQUAL(g_stops, 0);
    CU_ASSERT_EQUAL(kiln_test_stop_count(g_th), 0);
    es_state s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.wait, 2);
    CU_ASSERT_EQUAL(s.best, 0.9);
    CU_ASSERT_EQUAL(s.reason, 0u);
    es_epoch(inst, 1.5); /* wait 3 = patience: stop, at epoch 4 */
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_EQUAL(kiln_test_stop_count(g_th), 1);
    CU_ASSERT_STRING_EQUAL(g_stop_reason,
                           "Monitored metric val_loss did not improve in the last 3 records. Best score: 0.900. "
                           "Signaling Trainer to stop.");
    s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.wait, 3);
    CU_ASSERT_EQUAL(s.stopped_epoch, 4);
    CU_ASSERT_EQUAL(s.reason, 3u); /* PATIENCE_EXHAUSTED */
    CU_ASSERT_STRING_EQUAL(s.monitor, "val_loss");
    g_es->base.destroy(inst);
}

static void test_es_patience_reset_and_zero(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    c.patience = 2;
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, 1.0);
    es_epoch(inst, 1.1); /* wait 1 */
    es_epoch(inst, 0.5); /* improvement resets the count */
    es_epoch(inst, 1.1); /* wait 1 */
    CU_ASSERT_EQUAL(g_stops, 0);
    es_epoch(inst, 1.1); /* wait 2: stop */
    CU_ASSERT_EQUAL(g_stops, 1);
    g_es->base.destroy(inst);

    /* patience 0: the first check without improvement stops */
    fixture_begin();
    c.patience = 0;
    inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, 1.0);
    CU_ASSERT_EQUAL(g_stops, 0);
    es_epoch(inst, 1.0);
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_stop_reason, "did not improve in the last 1 records. Best score: 1.000."));
    g_es->base.destroy(inst);
}

static void test_es_min_delta_min(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    c.min_delta = 0.25;
    c.patience = 2;
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, 1.0);
    es_epoch(inst, 0.75); /* exactly min_delta better: not an improvement */
    es_state s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.wait, 1);
    CU_ASSERT_EQUAL(s.best, 1.0);
    es_epoch(inst, 0.5); /* 0.5 better: improvement */
    s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.wait, 0);
    CU_ASSERT_EQUAL(s.best, 0.5);
    es_epoch(inst, 0.3);  /* 0.2 better: not enough, wait 1 */
    es_epoch(inst, 0.26); /* wait 2: stop */
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_stop_reason, "Best score: 0.500"));
    g_es->base.destroy(inst);
}

static void test_es_min_delta_max(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    c.monitor = "val_acc";
    c.mode = "max";
    c.min_delta = 0.25;
    c.patience = 3;
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    es_state s = es_read_state(inst);
    CU_ASSERT(isinf(s.best) && s.best < 0); /* max mode starts at -inf */
    CU_ASSERT_EQUAL(s.mode, 1u);
    log_metric("val_acc", 1.0);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    log_metric("val_acc", 1.25); /* exactly min_delta higher: no improvement */
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    log_metric("val_acc", 0.5); /* lower is worse in max mode */
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.wait, 2);
    CU_ASSERT_EQUAL(s.best, 1.0);
    log_metric("val_acc", 1.5); /* improvement */
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.wait, 0);
    CU_ASSERT_EQUAL(s.best, 1.5);
    CU_ASSERT_STRING_EQUAL(s.monitor, "val_acc");
    CU_ASSERT_EQUAL(g_stops, 0);
    g_es->base.destroy(inst);
}

static void test_es_stopping_threshold(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    c.has_st = 1;
    c.st = 0.1;
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, 0.2);
    es_epoch(inst, 0.1); /* reaching it is not beyond it (torch.lt) */
    CU_ASSERT_EQUAL(g_stops, 0);
    es_epoch(inst, 0.05); /* better than the threshold: stop at once */
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_STRING_EQUAL(g_stop_reason,
                           "Stopping threshold reached: val_loss = 0.05 < 0.1. Signaling Trainer to stop.");
    es_state s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.reason, 1u);
    CU_ASSERT_EQUAL(s.stopped_epoch, 2);
    CU_ASSERT_EQUAL(s.best, 0.1); /* a threshold stop does not update best */
    g_es->base.destroy(inst);

    fixture_begin();
    c = es_defaults();
    c.monitor = "val_acc";
    c.mode = "max";
    c.has_st = 1;
    c.st = 0.9;
    inst = es_new(&c);
    es_fit_start(inst);
    log_metric("val_acc", 0.8);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(g_stops, 0);
    log_metric("val_acc", 0.95);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_STRING_EQUAL(g_stop_reason,
                           "Stopping threshold reached: val_acc = 0.95 > 0.9. Signaling Trainer to stop.");
    g_es->base.destroy(inst);
}

static void test_es_divergence_threshold(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    c.has_dv = 1;
    c.dv = 5.0;
    c.patience = 100;
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, 4.0);
    es_epoch(inst, 5.0); /* at the threshold is not beyond it */
    CU_ASSERT_EQUAL(g_stops, 0);
    es_epoch(inst, 6.0);
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_STRING_EQUAL(g_stop_reason,
                           "Divergence threshold reached: val_loss = 6 > 5. Signaling Trainer to stop.");
    CU_ASSERT_EQUAL(es_read_state(inst).reason, 2u);
    g_es->base.destroy(inst);

    fixture_begin();
    c = es_defaults();
    c.monitor = "val_acc";
    c.mode = "max";
    c.has_dv = 1;
    c.dv = 0.2;
    inst = es_new(&c);
    es_fit_start(inst);
    log_metric("val_acc", 0.5);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(g_stops, 0);
    log_metric("val_acc", 0.1);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_STRING_EQUAL(g_stop_reason,
                           "Divergence threshold reached: val_acc = 0.1 < 0.2. Signaling Trainer to stop.");
    g_es->base.destroy(inst);
}

static void test_es_check_finite(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    /* check_finite comes first, even before the thresholds */
    c.has_st = 1;
    c.st = 0.01;
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, 0.5);
    CU_ASSERT_EQUAL(g_stops, 0);
    es_epoch(inst, NAN);
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_STRING_EQUAL(g_stop_reason, "Monitored metric val_loss = nan is not finite. Previous best value was "
                                          "0.500. Signaling Trainer to stop.");
    es_state s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.reason, 4u); /* NON_FINITE_METRIC */
    CU_ASSERT_EQUAL(s.best, 0.5);
    g_es->base.destroy(inst);

    /* -inf is not finite either (a min-mode "improvement" must not win) */
    fixture_begin();
    inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, -INFINITY);
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_stop_reason, "val_loss = -inf is not finite. Previous best value was inf."));
    g_es->base.destroy(inst);

    /* check_finite = false: a NaN is just no improvement */
    fixture_begin();
    c = es_defaults();
    c.check_finite = 0;
    c.patience = 2;
    inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, 0.5);
    es_epoch(inst, NAN);
    CU_ASSERT_EQUAL(g_stops, 0);
    s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.wait, 1);
    CU_ASSERT_EQUAL(s.best, 0.5);
    es_epoch(inst, NAN);
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_stop_reason, "did not improve in the last 2 records"));
    g_es->base.destroy(inst);
}

static void test_es_strict_missing(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    c.monitor = "val_f1";
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    log_metric("val_loss", 0.5); /* something else is logged */
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_E_CONFIG);
    CU_ASSERT_EQUAL(kiln_test_error_code(g_th), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "metric `val_f1` which is not available"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "on_train_epoch_end"));
    CU_ASSERT_EQUAL(g_stops, 0);
    g_es->base.destroy(inst);
}

static void test_es_nonstrict_missing(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    c.strict = 0;
    c.patience = 1;
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
        CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    }
    CU_ASSERT_EQUAL(g_stops, 0);
    es_state s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.wait, 0); /* a skipped check is not a check */
    CU_ASSERT(isinf(s.best) && s.best > 0);
    /* the metric appearing later is checked as usual */
    es_epoch(inst, 1.0);
    es_epoch(inst, 2.0);
    CU_ASSERT_EQUAL(g_stops, 1);
    g_es->base.destroy(inst);
}

static void test_es_sanity_and_outside_fit_skipped(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    c.patience = 0;
    c.timing = 0; /* check at on_validation_end */
    kiln_instance *inst = es_new(&c);
    /* outside fit (a standalone validate): no check, not even strict's */
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    es_fit_start(inst);
    /* the sanity check: missing metric and bad values are ignored */
    kiln_test_trainer(g_th)->stage = KILN_STAGE_SANITY;
    kiln_test_trainer(g_th)->sanity_checking = 1;
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_SANITY), KILN_OK);
    log_metric("val_loss", NAN);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_SANITY), KILN_OK);
    CU_ASSERT_EQUAL(g_stops, 0);
    /* the sanity flag alone is enough */
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    CU_ASSERT_EQUAL(g_stops, 0);
    kiln_test_trainer(g_th)->stage = KILN_STAGE_FIT;
    kiln_test_trainer(g_th)->sanity_checking = 0;
    es_state s = es_read_state(inst);
    CU_ASSERT_EQUAL(s.wait, 0);
    /* in fit the same value stops at once */
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    CU_ASSERT_EQUAL(g_stops, 1);
    /* after fit: skipped again */
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_FIT_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
    CU_ASSERT_EQUAL(g_stops, 1);
    g_es->base.destroy(inst);
}

/* Which hook runs the check: send each alone with a missing metric and a
 * strict callback; the checking hook fails, the other passes. */
static void expect_timing(const es_cfg *c, const kiln_kv *trainer_keys, int on_train_epoch_end) {
    fixture_begin();
    kiln_test_set_config(g_th, trainer_keys);
    kiln_instance *inst = es_new(c);
    es_fit_start(inst);
    int32_t val = send(g_es, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE);
    int32_t tee = send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT);
    CU_ASSERT_EQUAL(val, on_train_epoch_end ? KILN_OK : KILN_E_CONFIG);
    CU_ASSERT_EQUAL(tee, on_train_epoch_end ? KILN_E_CONFIG : KILN_OK);
    g_es->base.destroy(inst);
}

static const kiln_kv tk_default[] = {
    {"trainer.val_check_interval", KILN_V_FLOAT(1.0)}, {"trainer.check_val_every_n_epoch", KILN_V_INT(1)},
    {NULL, KILN_V_NONE}};
static const kiln_kv tk_half_epoch[] = {
    {"trainer.val_check_interval", KILN_V_FLOAT(0.5)}, {"trainer.check_val_every_n_epoch", KILN_V_INT(1)},
    {NULL, KILN_V_NONE}};
static const kiln_kv tk_every_2[] = {
    {"trainer.val_check_interval", KILN_V_FLOAT(1.0)}, {"trainer.check_val_every_n_epoch", KILN_V_INT(2)},
    {NULL, KILN_V_NONE}};

static void test_es_timing(void) {
    es_cfg c = es_defaults();
    c.timing = 1;
    expect_timing(&c, tk_half_epoch, 1); /* explicit true wins over the trainer */
    c.timing = 0;
    expect_timing(&c, tk_default, 0); /* explicit false */
    c.timing = -1;                    /* unset: Lightning's rule */
    expect_timing(&c, tk_default, 1);
    expect_timing(&c, NULL, 1); /* the trainer defaults */
    expect_timing(&c, tk_half_epoch, 0);
    expect_timing(&c, tk_every_2, 0);

    /* at on_validation_end every validation run is a check, several per
     * epoch with val_check_interval 0.5; the stop lands inside the epoch */
    fixture_begin();
    kiln_test_set_config(g_th, tk_half_epoch);
    c.patience = 2;
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    static const double vals[] = {1.0, 1.0, 1.0};
    for (int i = 0; i < 3; i++) {
        log_metric("val_loss", vals[i]);
        CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_VALIDATION_END, KILN_STAGE_VALIDATE), KILN_OK);
        CU_ASSERT_EQUAL(g_stops, i == 2);
    }
    CU_ASSERT_EQUAL(send(g_es, inst, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT), KILN_OK);
    CU_ASSERT_EQUAL(es_read_state(inst).stopped_epoch, 0);
    g_es->base.destroy(inst);
}

static void test_es_verbose_messages(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    c.verbose = 1;
    c.min_delta = 0.125;
    c.patience = 1;
    kiln_instance *inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, 0.5);
    CU_ASSERT(logged_line("Metric val_loss improved. New best score: 0.500"));
    es_epoch(inst, 0.25);
    CU_ASSERT(logged_line("Metric val_loss improved by 0.250 >= min_delta = 0.125. New best score: 0.250"));
    es_epoch(inst, 0.25);
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT(logged_line(g_stop_reason));
    g_es->base.destroy(inst);

    /* not verbose: nothing logged, the reason still reaches request_stop */
    fixture_begin();
    c.verbose = 0;
    inst = es_new(&c);
    es_fit_start(inst);
    es_epoch(inst, 0.5);
    es_epoch(inst, 0.5);
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_EQUAL(g_nlog, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_stop_reason, "did not improve"));
    g_es->base.destroy(inst);
}

static void test_es_state_round_trip(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    kiln_instance *a = es_new(&c);
    es_fit_start(a);
    es_epoch(a, 0.3);
    es_epoch(a, 0.4);
    es_epoch(a, 0.5); /* wait 2 of 3 */
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(g_es->base.get_state(a, &ver, &blob, &size), KILN_OK);
    g_es->base.destroy(a);

    /* a resumed run: patience comes back from the checkpoint (Lightning's
     * load_state_dict), so a run file's patience 10 is overridden */
    c.patience = 10;
    kiln_kv kv2[16];
    int32_t rc;
    kiln_instance *b = create(g_es, es_kv(kv2, &c), &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(g_es->base.set_state(b, ver, blob, size), KILN_OK);
    es_state s = es_read_state(b);
    CU_ASSERT_EQUAL(s.wait, 2);
    CU_ASSERT_EQUAL(s.best, 0.3);
    CU_ASSERT_EQUAL(s.patience, 3);
    es_fit_start(b);
    kiln_test_trainer(g_th)->current_epoch = 3;
    es_epoch(b, 0.31); /* wait 3: stop */
    CU_ASSERT_EQUAL(g_stops, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_stop_reason, "last 3 records. Best score: 0.300"));
    CU_ASSERT_EQUAL(es_read_state(b).stopped_epoch, 3);

    /* refusals: another version, a foreign blob, a truncated one */
    CU_ASSERT_EQUAL(g_es->base.set_state(b, 2, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "version 2"));
    unsigned char junk[64] = "not an early stopping state at all, sorry....";
    CU_ASSERT_EQUAL(g_es->base.set_state(b, 1, junk, sizeof junk), KILN_E_DATA);
    CU_ASSERT_EQUAL(g_es->base.set_state(b, 1, blob, size - 1), KILN_E_DATA);
    g_es->base.destroy(b);

    /* another monitor's state is not this callback's: it starts fresh */
    fixture_begin();
    c = es_defaults();
    c.monitor = "train_loss";
    kiln_kv kv3[16];
    kiln_instance *d = create(g_es, es_kv(kv3, &c), &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(g_es->base.set_state(d, ver, blob, size), KILN_OK);
    s = es_read_state(d);
    CU_ASSERT_EQUAL(s.wait, 0);
    CU_ASSERT(isinf(s.best));
    CU_ASSERT(logged_line("starting fresh"));
    g_es->base.destroy(d);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
}

/* A blob with an out-of-range counter or a best score the callback could
 * not have reached is refused with KILN_E_DATA in one line naming the
 * value, and changes nothing: wait_count at INT64_MAX would wrap on the
 * next check and early stopping would never fire again. A good blob still
 * restores. */
static void put64(unsigned char *p, uint64_t x) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(x >> (8 * i));
}
static void test_es_state_bounds(void) {
    fixture_begin();
    es_cfg c = es_defaults();
    kiln_instance *a = es_new(&c);
    es_fit_start(a);
    es_epoch(a, 0.3);
    es_epoch(a, 0.4); /* wait 1 of 3, best 0.3, not stopped */
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(g_es->base.get_state(a, &ver, &blob, &size), KILN_OK);
    g_es->base.destroy(a);
    unsigned char *bad = malloc(size);
    CU_ASSERT_PTR_NOT_NULL_FATAL(bad);
    kiln_kv kv[16];
    int32_t rc;
    kiln_instance *b = create(g_es, es_kv(kv, &c), &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    double nan = NAN, minus_inf = -INFINITY;
    uint64_t nan_bits, minus_inf_bits;
    memcpy(&nan_bits, &nan, 8);
    memcpy(&minus_inf_bits, &minus_inf, 8);
    const struct {
        size_t off;
        uint64_t v;
        const char *needle;
    } cases[] = {
        {8, (uint64_t)INT64_MAX, "state wait_count: expected 0 <= value < 2^53, found 9223372036854775807"},
        {8, (uint64_t)-1, "state wait_count: expected 0 <= value < 2^53, found -1"},
        {24, (uint64_t)1 << 53, "state patience: expected 0 <= value < 2^53, found 9007199254740992"},
        {24, (uint64_t)INT64_MIN, "state patience: expected 0 <= value < 2^53, found -9223372036854775808"},
        {16, (uint64_t)-5, "state stopped_epoch: expected 0 <= value < 2^53, found -5"},
        {32, nan_bits, "state best_score: expected a finite value or inf (mode min), found nan"},
        {32, minus_inf_bits, "state best_score: expected a finite value or inf (mode min), found -inf"},
        {16, 4, "never stopped: expected stopped_epoch 0 and wait_count below patience 3, found stopped_epoch 4"},
        {8, 3, "never stopped: expected stopped_epoch 0 and wait_count below patience 3, found stopped_epoch 0 and "
               "wait_count 3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(bad, blob, size);
        put64(bad + cases[i].off, cases[i].v);
        kiln_test_clear_error(g_th);
        CU_ASSERT_EQUAL(g_es->base.set_state(b, ver, bad, size), KILN_E_DATA);
        if (!strstr(kiln_test_error(g_th), cases[i].needle)) fprintf(stderr, "\ncase %zu: %s\n", i, kiln_test_error(g_th));
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), cases[i].needle));
        CU_ASSERT_PTR_NULL(strchr(kiln_test_error(g_th), '\n'));
        es_state s = es_read_state(b); /* unchanged: as created */
        CU_ASSERT_EQUAL(s.wait, 0);
        CU_ASSERT_EQUAL(s.patience, 3);
        CU_ASSERT(isinf(s.best) && s.best > 0);
    }
    /* the good blob restores and the callback goes on counting */
    CU_ASSERT_EQUAL(g_es->base.set_state(b, ver, blob, size), KILN_OK);
    es_state s = es_read_state(b);
    CU_ASSERT_EQUAL(s.wait, 1);
    CU_ASSERT_EQUAL(s.best, 0.3);
    es_fit_start(b);
    es_epoch(b, 0.5);
    es_epoch(b, 0.5); /* wait 3: stop */
    CU_ASSERT_EQUAL(g_stops, 1);
    g_es->base.destroy(b);
    free(bad);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
}

static void test_es_config_errors(void) {
    fixture_begin();
    const kiln_callback_ops *ops = load("early_stopping");
    struct {
        es_cfg c;
        const char *needle;
    } bad[5];
    for (int i = 0; i < 5; i++) bad[i].c = es_defaults();
    bad[0].c.mode = "avg";
    bad[0].needle = "\"avg\"";
    bad[1].c.patience = -1;
    bad[1].needle = "patience must be >= 0, got -1";
    bad[2].c.min_delta = -0.5;
    bad[2].needle = "min_delta must be";
    bad[3].c.monitor = "";
    bad[3].needle = "monitor must name";
    bad[4].c.has_st = 1;
    bad[4].c.st = INFINITY;
    bad[4].needle = "stopping_threshold must be finite";
    for (int i = 0; i < 5; i++) {
        kiln_kv kv[16];
        int32_t rc;
        kiln_test_clear_error(g_th);
        kiln_instance *inst = create(ops, es_kv(kv, &bad[i].c), &rc);
        CU_ASSERT_EQUAL(rc, KILN_E_CONFIG);
        CU_ASSERT_PTR_NULL(inst);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), bad[i].needle));
    }
    /* the declared keys: monitor required, the thresholds and the timing
     * without a default (unset means off / Lightning's rule) */
    const kiln_plugin_desc *d = load_desc("early_stopping");
    int seen = 0;
    for (const kiln_param *p = d->params; p->key; p++) {
        if (!strcmp(p->key, "monitor")) seen += (p->flags & KILN_PARAM_REQUIRED) ? 1 : 0;
        if (!strcmp(p->key, "patience")) seen += p->def.type == KILN_TYPE_INT && p->def.v.i == 3;
        if (!strcmp(p->key, "stopping_threshold")) seen += p->def.type == KILN_TYPE_NONE;
        if (!strcmp(p->key, "check_on_train_epoch_end")) seen += p->def.type == KILN_TYPE_NONE;
    }
    CU_ASSERT_EQUAL(seen, 4);
    CU_ASSERT(d->capabilities & KILN_CAP_STATEFUL);
}

/* ---------------------------------------------------------------------------
 * nan_guard fixtures */

static const kiln_callback_ops *g_ng;

#define NG_CFG(loss, grads, params)                                                                    \
    {{"check_loss", KILN_V_BOOL(loss)}, {"check_grads", KILN_V_BOOL(grads)},                             \
     {"check_params", KILN_V_BOOL(params)}, {NULL, KILN_V_NONE}}
static const kiln_kv ng_cfg_all[] = NG_CFG(1, 1, 1);

static kiln_instance *ng_new(const kiln_kv *cfg) {
    g_ng = load("nan_guard");
    int32_t rc;
    kiln_instance *inst = create(g_ng, cfg, &rc);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    return inst;
}

/* The test host's parameters: layers.0.weight (16, 8), layers.0.bias (16),
 * layers.1.weight (64, 16) in float32, zero-filled. Trainer at epoch 2,
 * global step 877. */
static void reg(const char *name, int64_t rows, int64_t cols, uint32_t flags) {
    int64_t shape[2] = {rows, cols};
    fixture_param(g_th, name, cols > 0 ? 2 : 1, shape, flags);
}

static void ng_params_f32(void) {
    reg("layers.0.weight", 16, 8, 0);
    reg("layers.0.bias", 16, 0, KILN_PARAMF_NO_DECAY);
    reg("layers.1.weight", 64, 16, 0);
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(g_th), 0);
    kiln_test_trainer(g_th)->current_epoch = 2;
    kiln_test_trainer(g_th)->global_step = 877;
}

/* Turn every parameter into float64 masters (the 64-true layout): fresh
 * zeroed double buffers the mock frees at reset. */
static void ng_params_to_f64(void) {
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        kiln_parameter *p = kiln_test_param(g_th, i);
        free(p->data);
        free(p->grad);
        p->data = calloc((size_t)p->numel, sizeof(double));
        p->grad = calloc((size_t)p->numel, sizeof(double));
        CU_ASSERT_PTR_NOT_NULL_FATAL(p->data);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p->grad);
        p->compute = p->data;
        p->param_dtype = KILN_DTYPE_F64;
        p->compute_dtype = KILN_DTYPE_F64;
    }
}

static int32_t ng_send(kiln_instance *inst, uint32_t id, int64_t batch, double loss) {
    kiln_event e = ev_make(id, KILN_STAGE_FIT, batch);
    e.loss = loss;
    return g_ng->on_event(inst, &e);
}

/* One training batch's three checkpoints, all expected to pass. */
static void ng_batch_ok(kiln_instance *inst, int64_t batch) {
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_BEFORE_BACKWARD, batch, 0.75), KILN_OK);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, batch, 0), KILN_OK);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_TRAIN_BATCH_END, batch, 0), KILN_OK);
}

static void assert_error(int32_t rc, const char *want) {
    CU_ASSERT_EQUAL(rc, KILN_E_NONFINITE);
    CU_ASSERT_EQUAL(kiln_test_error_code(g_th), KILN_E_NONFINITE);
    CU_ASSERT_STRING_EQUAL(kiln_test_error(g_th), want);
    if (strcmp(kiln_test_error(g_th), want)) fprintf(stderr, "\n got: %s\nwant: %s\n", kiln_test_error(g_th), want);
}

/* ---------------------------------------------------------------------------
 * nan_guard */

static void test_ng_finite_passes(void) {
    fixture_begin();
    ng_params_f32();
    float *w = kiln_test_param(g_th, 2)->data, *g = kiln_test_param(g_th, 2)->grad;
    for (int64_t i = 0; i < kiln_test_param(g_th, 2)->numel; i++) {
        w[i] = (float)i * 0.5f - 100.0f;
        g[i] = i % 2 ? FLT_MAX : -FLT_MAX; /* huge, still finite */
    }
    kiln_test_param(g_th, 0)->data[3] = FLT_MIN / 4; /* a subnormal */
    kiln_instance *inst = ng_new(ng_cfg_all);
    for (int64_t b = 0; b < 5; b++) ng_batch_ok(inst, b);
    /* events it does not watch pass whatever they carry */
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_VALIDATION_BATCH_END, 0, NAN), KILN_OK);
    CU_ASSERT_EQUAL(g_stops, 0);
    g_ng->base.destroy(inst);

    /* float64 masters with finite values whose high halves read as float32
     * would be NaN (0x7FC00000): only a float64 reader sees them as finite */
    fixture_begin();
    ng_params_f32();
    ng_params_to_f64();
    double trap;
    uint64_t bits = 0x7FC0000000000000ull;
    memcpy(&trap, &bits, sizeof trap);
    CU_ASSERT(isfinite(trap));
    double *wd = (double *)kiln_test_param(g_th, 1)->data;
    for (int64_t i = 0; i < kiln_test_param(g_th, 1)->numel; i++) wd[i] = trap;
    inst = ng_new(ng_cfg_all);
    ng_batch_ok(inst, 0);
    g_ng->base.destroy(inst);
}

static void test_ng_nan_loss(void) {
    fixture_begin();
    ng_params_f32();
    kiln_instance *inst = ng_new(ng_cfg_all);
    assert_error(ng_send(inst, KILN_EV_ON_BEFORE_BACKWARD, 17, NAN),
                 "nan_guard: the loss is nan before backward at epoch 2, batch 17, global step 877 (the "
                 "training_step loss times the loss scale); expected a finite loss (lower the learning rate, or "
                 "check the data)");
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_BEFORE_BACKWARD, 18, INFINITY), KILN_E_NONFINITE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "the loss is inf before backward at epoch 2, batch 18"));
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_BEFORE_BACKWARD, 19, 1e300), KILN_OK);
    g_ng->base.destroy(inst);

    static const kiln_kv no_loss[] = NG_CFG(0, 1, 1);
    inst = ng_new(no_loss);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_BEFORE_BACKWARD, 17, NAN), KILN_OK);
    g_ng->base.destroy(inst);
}

static void test_ng_inf_grad(void) {
    fixture_begin();
    ng_params_f32();
    kiln_test_param(g_th, 2)->grad[523] = INFINITY;
    kiln_instance *inst = ng_new(ng_cfg_all);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_BEFORE_BACKWARD, 17, 2.5), KILN_OK);
    assert_error(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 17, 0),
                 "nan_guard: gradient of parameter layers.1.weight[523] is inf after backward at epoch 2, batch 17, "
                 "global step 877 (1 of 1024 float32 values not finite); expected finite gradients (lower the "
                 "learning rate, clip gradients, or check the data)");
    /* the first bad element is reported, all of them counted */
    kiln_test_param(g_th, 2)->grad[100] = -INFINITY;
    kiln_test_param(g_th, 2)->grad[900] = NAN;
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 18, 0), KILN_E_NONFINITE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "layers.1.weight[100] is -inf after backward"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "(3 of 1024 float32 values not finite)"));
    /* weights are fine: the batch end passes */
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_TRAIN_BATCH_END, 18, 0), KILN_OK);
    g_ng->base.destroy(inst);

    /* a frozen parameter (toggle_optimizer) got no gradient: not checked */
    kiln_test_param(g_th, 2)->flags |= KILN_PARAMF_FROZEN;
    inst = ng_new(ng_cfg_all);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 19, 0), KILN_OK);
    kiln_test_param(g_th, 0)->grad[0] = NAN; /* an unfrozen one still is */
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 19, 0), KILN_E_NONFINITE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "layers.0.weight[0] is nan"));
    g_ng->base.destroy(inst);

    static const kiln_kv no_grads[] = NG_CFG(1, 0, 1);
    inst = ng_new(no_grads);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 19, 0), KILN_OK);
    g_ng->base.destroy(inst);
}

static void test_ng_nan_param_f32(void) {
    fixture_begin();
    ng_params_f32();
    kiln_test_param(g_th, 1)->data[3] = NAN;
    kiln_instance *inst = ng_new(ng_cfg_all);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 4, 0), KILN_OK); /* grads are fine */
    assert_error(ng_send(inst, KILN_EV_ON_TRAIN_BATCH_END, 4, 0),
                 "nan_guard: parameter layers.0.bias[3] is nan at the end of the batch at epoch 2, batch 4, global "
                 "step 877 (1 of 16 float32 values not finite); expected finite weights (lower the learning rate, "
                 "clip gradients, or check the data)");
    g_ng->base.destroy(inst);

    static const kiln_kv no_params[] = NG_CFG(1, 1, 0);
    inst = ng_new(no_params);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_TRAIN_BATCH_END, 4, 0), KILN_OK);
    g_ng->base.destroy(inst);
}

static void test_ng_nan_param_f64(void) {
    fixture_begin();
    ng_params_f32();
    ng_params_to_f64();
    double trap;
    uint64_t bits = 0x7FC0000000000000ull; /* finite; NaN if read as float32 */
    memcpy(&trap, &bits, sizeof trap);
    double *w = (double *)kiln_test_param(g_th, 2)->data;
    for (int64_t i = 0; i < 10; i++) w[i] = trap;
    w[700] = NAN;
    kiln_instance *inst = ng_new(ng_cfg_all);
    assert_error(ng_send(inst, KILN_EV_ON_TRAIN_BATCH_END, 17, 0),
                 "nan_guard: parameter layers.1.weight[700] is nan at the end of the batch at epoch 2, batch 17, "
                 "global step 877 (1 of 1024 float64 values not finite); expected finite weights (lower the "
                 "learning rate, clip gradients, or check the data)");
    w[700] = 0.0;
    ((double *)kiln_test_param(g_th, 0)->grad)[127] = -INFINITY; /* the last element */
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_TRAIN_BATCH_END, 18, 0), KILN_OK);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 19, 0), KILN_E_NONFINITE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "gradient of parameter layers.0.weight[127] is -inf after backward "
                                                 "at epoch 2, batch 19"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "(1 of 128 float64 values not finite)"));
    g_ng->base.destroy(inst);
}

static const kiln_kv prec_16_mixed[] = {
    {"precision", KILN_V_STR("16-mixed")}, {"amp_backend", KILN_V_STR("native")},
    {"needs_grad_scaler", KILN_V_BOOL(1)}, {NULL, KILN_V_NONE}};
static const kiln_kv prec_bf16_mixed[] = {
    {"precision", KILN_V_STR("bf16-mixed")}, {"needs_grad_scaler", KILN_V_BOOL(0)}, {NULL, KILN_V_NONE}};

static void test_ng_scaler_exemption(void) {
    fixture_begin();
    ng_params_f32();
    kiln_test_trainer(g_th)->precision = prec_16_mixed;
    kiln_test_param(g_th, 2)->grad[5] = INFINITY; /* a scaled overflow: the scaler skips the step */
    kiln_instance *inst = ng_new(ng_cfg_all);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 3, 0), KILN_OK);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 4, 0), KILN_OK);
    CU_ASSERT(logged_line("nan_guard: precision 16-mixed scales gradients"));
    CU_ASSERT_EQUAL(g_nlog, 1); /* said once */
    /* the loss and the weights are still checked */
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_TRAIN_BATCH_END, 4, 0), KILN_OK);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_BEFORE_BACKWARD, 5, NAN), KILN_E_NONFINITE);
    kiln_test_param(g_th, 2)->data[9] = NAN;
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_TRAIN_BATCH_END, 5, 0), KILN_E_NONFINITE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "parameter layers.1.weight[9] is nan at the end of the batch"));
    g_ng->base.destroy(inst);

    /* a precision without a scaler: gradients are checked */
    kiln_test_trainer(g_th)->precision = prec_bf16_mixed;
    inst = ng_new(ng_cfg_all);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 6, 0), KILN_E_NONFINITE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "gradient of parameter layers.1.weight[5] is inf"));
    g_ng->base.destroy(inst);

    /* a 1.1 trainer state has no precision properties: no exemption */
    kiln_test_trainer(g_th)->precision = prec_16_mixed;
    kiln_test_trainer(g_th)->struct_size = (uint32_t)offsetof(kiln_trainer_state, precision);
    inst = ng_new(ng_cfg_all);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 6, 0), KILN_E_NONFINITE);
    g_ng->base.destroy(inst);
    kiln_test_trainer(g_th)->struct_size = sizeof(kiln_trainer_state);
}

/* A fake accelerator whose memory the plugin must not read directly: copy
 * is a counted memcpy, all_finite(_ex) scan the buffers. */
static int g_copies, g_finite_calls;

static int32_t fk_copy(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind) {
    (void)acc;
    CU_ASSERT_EQUAL(kind, KILN_COPY_D2H);
    memcpy(dst, src, bytes);
    g_copies++;
    return KILN_OK;
}

static int32_t fk_all_finite_ex(kiln_instance *acc, uint32_t dtype, const void *x, size_t n, int32_t *finite) {
    (void)acc;
    g_finite_calls++;
    *finite = 1;
    for (size_t i = 0; i < n; i++)
        if (dtype == KILN_DTYPE_F64 ? !isfinite(((const double *)x)[i]) : !isfinite(((const float *)x)[i]))
            *finite = 0;
    return KILN_OK;
}

static int32_t fk_all_finite(kiln_instance *acc, const float *x, size_t n, int32_t *finite) {
    return fk_all_finite_ex(acc, KILN_DTYPE_F32, x, n, finite);
}

/* The fake accelerator's table on the test host: device memory (flags
 * 0), so values are read back through copy; sumsq_many may be NULL. */
static kiln_kernels g_fk;

static void fk_install(int32_t (*sumsq_many)(kiln_instance *, uint32_t, const void *const *, const size_t *, uint32_t,
                                             double *)) {
    g_fk = (kiln_kernels){.struct_size = sizeof g_fk,
                          .flags = 0,
                          .copy = fk_copy,
                          .all_finite = fk_all_finite,
                          .all_finite_ex = fk_all_finite_ex,
                          .sumsq_many = sumsq_many};
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), &g_fk);
}

static void test_ng_device_memory(void) {
    fixture_begin();
    fk_install(NULL);
    kiln_kernels *k = &g_fk;
    reg("emb.weight", 1000, 200, 0);
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(g_th), 0);
    g_copies = g_finite_calls = 0;
    kiln_instance *inst = ng_new(ng_cfg_all);
    ng_batch_ok(inst, 0);
    CU_ASSERT_EQUAL(g_finite_calls, 2); /* grad and data, by the kernel */
    CU_ASSERT_EQUAL(g_copies, 0);       /* nothing read back when finite */
    kiln_test_param(g_th, 0)->grad[150001] = NAN;   /* in the third 65536-element chunk */
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 1, 0), KILN_E_NONFINITE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "gradient of parameter emb.weight[150001] is nan"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "(1 of 200000 float32 values not finite)"));
    CU_ASSERT_EQUAL(g_copies, 4); /* 200000 elements in 65536-element chunks */
    g_ng->base.destroy(inst);

    /* a 1.1 kernel table (no _ex): float32 still uses all_finite */
    k->struct_size = KILN_KERNELS_SIZE_1_1;
    kiln_test_param(g_th, 0)->grad[150001] = 0.0f;
    g_copies = g_finite_calls = 0;
    inst = ng_new(ng_cfg_all);
    ng_batch_ok(inst, 1);
    CU_ASSERT_EQUAL(g_finite_calls, 2);
    CU_ASSERT_EQUAL(g_copies, 0);
    g_ng->base.destroy(inst);
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), NULL);
}

/* ABI 1.9: one sumsq_many call clears every tensor whose sum of squares is
 * finite; only the others get the exact check (all_finite_ex, then the
 * read-back that finds the element). */
static int g_sumsq_many_calls;

static int32_t fk_sumsq_many(kiln_instance *acc, uint32_t dtype, const void *const *x, const size_t *n,
                             uint32_t count, double *out) {
    (void)acc;
    g_sumsq_many_calls++;
    for (uint32_t i = 0; i < count; i++) {
        double s = 0.0;
        for (size_t j = 0; j < n[i]; j++) {
            const double v = dtype == KILN_DTYPE_F64 ? ((const double *)x[i])[j] : ((const float *)x[i])[j];
            s += v * v;
        }
        out[i] = s;
    }
    return KILN_OK;
}

static void test_ng_quick_pass(void) {
    fixture_begin();
    fk_install(fk_sumsq_many);
    ng_params_f32();
    float *g2 = kiln_test_param(g_th, 2)->grad;
    for (int64_t i = 0; i < kiln_test_param(g_th, 2)->numel; i++) g2[i] = i % 2 ? FLT_MAX : -FLT_MAX;
    g_copies = g_finite_calls = g_sumsq_many_calls = 0;
    kiln_instance *inst = ng_new(ng_cfg_all);
    ng_batch_ok(inst, 0); /* FLT_MAX squared, 1024 times: a finite double */
    CU_ASSERT_EQUAL(g_sumsq_many_calls, 2); /* one per check, for all three tensors */
    CU_ASSERT_EQUAL(g_finite_calls, 0);
    CU_ASSERT_EQUAL(g_copies, 0);
    /* a NaN: its tensor alone gets the exact check, and the same message */
    g2[523] = NAN;
    g_copies = g_finite_calls = g_sumsq_many_calls = 0;
    assert_error(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 17, 0),
                 "nan_guard: gradient of parameter layers.1.weight[523] is nan after backward at epoch 2, batch 17, "
                 "global step 877 (1 of 1024 float32 values not finite); expected finite gradients (lower the "
                 "learning rate, clip gradients, or check the data)");
    CU_ASSERT_EQUAL(g_sumsq_many_calls, 1);
    CU_ASSERT_EQUAL(g_finite_calls, 1);
    CU_ASSERT_EQUAL(g_copies, 1);
    /* frozen, it is not looked at */
    kiln_test_param(g_th, 2)->flags |= KILN_PARAMF_FROZEN;
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_AFTER_BACKWARD, 18, 0), KILN_OK);
    kiln_test_param(g_th, 2)->flags &= ~KILN_PARAMF_FROZEN;
    g_ng->base.destroy(inst);

    /* float64 values whose squares overflow the sum: flagged by the quick
     * pass, cleared by the exact check */
    fixture_begin();
    fk_install(fk_sumsq_many);
    ng_params_f32();
    ng_params_to_f64();
    double *w1 = (double *)kiln_test_param(g_th, 1)->data;
    for (int64_t i = 0; i < kiln_test_param(g_th, 1)->numel; i++) w1[i] = 1e200;
    g_copies = g_finite_calls = g_sumsq_many_calls = 0;
    inst = ng_new(ng_cfg_all);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_TRAIN_BATCH_END, 3, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_sumsq_many_calls, 1);
    CU_ASSERT_EQUAL(g_finite_calls, 1); /* layers.0.bias only */
    CU_ASSERT_EQUAL(g_copies, 0);
    g_ng->base.destroy(inst);

    /* a 1.8 table: the per-tensor kernel, as before */
    g_fk.struct_size = KILN_KERNELS_SIZE_1_6;
    g_copies = g_finite_calls = g_sumsq_many_calls = 0;
    inst = ng_new(ng_cfg_all);
    CU_ASSERT_EQUAL(ng_send(inst, KILN_EV_ON_TRAIN_BATCH_END, 4, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_sumsq_many_calls, 0);
    CU_ASSERT_EQUAL(g_finite_calls, 3);
    g_ng->base.destroy(inst);
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), NULL);
}

static void test_ng_declared_keys(void) {
    fixture_begin();
    const kiln_plugin_desc *d = load_desc("nan_guard");
    const char *want[] = {"check_loss", "check_grads", "check_params"};
    int n = 0;
    for (const kiln_param *p = d->params; p->key; p++, n++) {
        CU_ASSERT_STRING_EQUAL(p->key, want[n]);
        CU_ASSERT_EQUAL(p->type, KILN_TYPE_BOOL);
        CU_ASSERT_EQUAL(p->def.type, KILN_TYPE_BOOL);
        CU_ASSERT_EQUAL(p->def.v.i, 1);
    }
    CU_ASSERT_EQUAL(n, 3);
}

static CU_TestInfo cases_early_stopping[] = {
    {"patience counts checks without improvement", test_es_patience},
    {"an improvement resets the count; patience 0", test_es_patience_reset_and_zero},
    {"min_delta in min mode", test_es_min_delta_min},
    {"min_delta in max mode", test_es_min_delta_max},
    {"stopping_threshold stops at once", test_es_stopping_threshold},
    {"divergence_threshold stops at once", test_es_divergence_threshold},
    {"check_finite: nan and -inf stop, or count as no improvement", test_es_check_finite},
    {"strict: a missing metric is KILN_E_CONFIG", test_es_strict_missing},
    {"non-strict: a missing metric skips the check", test_es_nonstrict_missing},
    {"sanity check and outside fit are skipped", test_es_sanity_and_outside_fit_skipped},
    {"check_on_train_epoch_end timing", test_es_timing},
    {"verbose messages", test_es_verbose_messages},
    {"state round trip and refusals", test_es_state_round_trip},
    {"state values bounded; a bad blob refused", test_es_state_bounds},
    {"config errors and declared keys", test_es_config_errors},
    CU_TEST_INFO_NULL,
};

static CU_TestInfo cases_nan_guard[] = {
    {"finite values pass (float32, float64)", test_ng_finite_passes},
    {"nan loss before backward", test_ng_nan_loss},
    {"inf gradient after backward", test_ng_inf_grad},
    {"nan float32 weight at batch end", test_ng_nan_param_f32},
    {"nan float64 weight and gradient", test_ng_nan_param_f64},
    {"gradient scaler exemption", test_ng_scaler_exemption},
    {"device memory is read back only when not finite", test_ng_device_memory},
    {"1.9: one sumsq_many clears the finite tensors; only the others are checked", test_ng_quick_pass},
    {"declared keys", test_ng_declared_keys},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "early_stopping", .pTests = cases_early_stopping},
        {.pName = "nan_guard", .pTests = cases_nan_guard},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
