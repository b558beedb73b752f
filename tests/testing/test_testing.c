/*
 * test_testing.c — the test host of kiln/testing.h, checked through the
 * plugins it is meant for: config text resolved against declared keys
 * (defaults, lists, refusals), the records (log lines, set_error, logged
 * values, stop requests, checkpoint paths), harness failures as a status
 * and one line, and every kind driven through its wrappers — the cpu
 * accelerator, the 32-true precision, sgd, the step scheduler,
 * early_stopping, the mlp module and the toydata fixture — as one small
 * training step a trainer would run, with a state round trip.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include <kiln/testing.h>

static kiln_test_host *g_th;

static const kiln_plugin_desc *load(const char *envdir, const char *lib, uint32_t kind, const char *name) {
    const char *dir = getenv(envdir);
    char path[4096];
    snprintf(path, sizeof path, "%s/libkiln-%s.so", dir ? dir : ".", lib);
    const kiln_plugin_desc *d = NULL;
    if (kiln_test_load(g_th, path, kind, name, &d) != KILN_OK) fprintf(stderr, "%s\n", kiln_test_message(g_th));
    return d;
}

static void test_config_text(void) {
    kiln_test_reset(g_th);
    const kiln_plugin_desc *mlp = load("KILN_PLUGIN_DIR", "mlp", KILN_KIND_MODULE, "mlp");
    const kiln_plugin_desc *es = load("KILN_PLUGIN_DIR", "early_stopping", KILN_KIND_CALLBACK, "early_stopping");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mlp);
    CU_ASSERT_PTR_NOT_NULL_FATAL(es);
    const kiln_kv *kv = NULL;
    CU_ASSERT_EQUAL_FATAL(kiln_test_config(g_th, mlp, "layers = [3, 4, 2]\n activation = gelu ; max_batch=8", &kv),
                          KILN_OK);
    const kiln_value *v = kiln_kv_find(kv, "layers");
    CU_ASSERT_FATAL(v && v->type == KILN_TYPE_INT_LIST && v->count == 3);
    CU_ASSERT(v->v.il[0] == 3 && v->v.il[1] == 4 && v->v.il[2] == 2);
    CU_ASSERT_STRING_EQUAL(kiln_kv_str(kv, "activation", ""), "gelu");
    CU_ASSERT_EQUAL(kiln_kv_int(kv, "max_batch", 0), 8);
    CU_ASSERT_STRING_EQUAL(kiln_kv_str(kv, "init", ""), "kaiming_uniform"); /* a default */
    /* a float key takes an integer; a key without a default stays out */
    CU_ASSERT_EQUAL_FATAL(kiln_test_config(g_th, es, "monitor = \"val_loss\"; min_delta = 1", &kv), KILN_OK);
    CU_ASSERT_EQUAL(kiln_kv_find(kv, "min_delta")->type, KILN_TYPE_FLOAT);
    CU_ASSERT_EQUAL(kiln_kv_float(kv, "min_delta", 0), 1.0);
    CU_ASSERT_PTR_NULL(kiln_kv_find(kv, "stopping_threshold"));
    /* refusals: each a status and a line naming the key */
    static const struct { const char *text, *needle; } bad[] = {
        {"patience = 2", "monitor"},              /* required, missing */
        {"monitor = x; speed = 3", "speed"},      /* undeclared        */
        {"monitor = x; patience = 2.5", "patience"},
        {"monitor = x; verbose = yes", "verbose"},
        {"monitor = x; monitor = y", "twice"},
        {"monitor = \"x", "monitor"},             /* unterminated      */
        {"monitor", "key = value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL(kiln_test_config(g_th, es, bad[i].text, &kv), KILN_E_CONFIG);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_message(g_th), bad[i].needle));
        if (!strstr(kiln_test_message(g_th), bad[i].needle))
            fprintf(stderr, "  \"%s\": %s\n", bad[i].text, kiln_test_message(g_th));
    }
    CU_ASSERT_EQUAL(kiln_test_config(g_th, mlp, "layers = [3, x]", &kv), KILN_E_CONFIG);
}

static void test_harness_errors(void) {
    kiln_test_reset(g_th);
    const kiln_plugin_desc *d = NULL;
    CU_ASSERT_EQUAL(kiln_test_load(g_th, "/nonexistent/libkiln-x.so", KILN_KIND_CALLBACK, "x", &d), KILN_E_NOT_FOUND);
    CU_ASSERT_PTR_NULL(d);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_message(g_th), "/nonexistent/libkiln-x.so"));
    const kiln_plugin_desc *sgd = load("KILN_PLUGIN_DIR", "sgd", KILN_KIND_OPTIMIZER, "sgd");
    CU_ASSERT_PTR_NOT_NULL_FATAL(sgd);
    char path[4096];
    CU_ASSERT_EQUAL_FATAL(kiln_test_plugin_path(g_th, "sgd", path, sizeof path), KILN_OK);
    CU_ASSERT_EQUAL(kiln_test_load(g_th, path, KILN_KIND_OPTIMIZER, "adam", &d), KILN_E_NOT_FOUND);
    CU_ASSERT_EQUAL(kiln_test_plugin_path(g_th, "no-such-plugin", path, sizeof path), KILN_E_NOT_FOUND);
    kiln_instance *opt = NULL;
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(g_th, sgd, "lr = 0.5", &opt), KILN_OK);
    /* the wrong kind, an unknown instance: refused before any call */
    CU_ASSERT_EQUAL(kiln_test_send_event(g_th, opt, KILN_EV_ON_FIT_START), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_message(g_th), "sgd"));
    CU_ASSERT_EQUAL(kiln_test_convert_params(g_th, opt), KILN_E_INVALID_ARG);
    int token;
    CU_ASSERT_EQUAL(kiln_test_zero_grad(g_th, (kiln_instance *)&token), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(kiln_test_destroy(g_th, (kiln_instance *)&token), KILN_E_INVALID_ARG);
    /* the plugin's config_checks (1.5), applied as kiln applies them: refused
     * before create, in one line naming the rule */
    kiln_instance *bad = NULL;
    CU_ASSERT_EQUAL(kiln_test_create_text(g_th, sgd, "lr = -1", &bad), KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(bad);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_message(g_th), "plugin sgd: config key 'lr' must be >= 0, found -1"));
    /* the plugin's own refusal: its status, its message */
    CU_ASSERT_EQUAL(kiln_test_create_text(g_th, sgd, "lr = 0.1; nesterov = true", &bad), KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(bad);
    CU_ASSERT_EQUAL(kiln_test_error_code(g_th), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "nesterov"));
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(kiln_test_error(g_th)[0], 0);
    CU_ASSERT_EQUAL(kiln_test_error_code(g_th), 0);
    CU_ASSERT_EQUAL(kiln_test_destroy(g_th, opt), KILN_OK);
    CU_ASSERT_PTR_NULL(kiln_test_desc_of(g_th, opt));
}

/* The services' records, straight through the table a plugin gets. */
static void test_records(void) {
    kiln_test_reset(g_th);
    const kiln_host_services *s = kiln_test_services(g_th);
    kiln_host_ctx *h = kiln_test_hctx(g_th);
    CU_ASSERT(s->abi_major == KILN_ABI_MAJOR && s->struct_size == sizeof *s);
    CU_ASSERT(!s->log_enabled(h, KILN_LOG_DEBUG) && s->log_enabled(h, KILN_LOG_INFO));
    kiln_test_set_log_level(g_th, KILN_LOG_DEBUG);
    CU_ASSERT(s->log_enabled(h, KILN_LOG_DEBUG));
    s->log(h, KILN_LOG_DEBUG, "one");
    s->log(h, KILN_LOG_INFO, "two");
    CU_ASSERT_EQUAL(kiln_test_log_count(g_th), 2);
    CU_ASSERT_STRING_EQUAL(kiln_test_log_find(g_th, KILN_LOG_DEBUG, NULL), "two");
    CU_ASSERT_PTR_NULL(kiln_test_log_find(g_th, KILN_LOG_WARN, NULL));
    CU_ASSERT_STRING_EQUAL(kiln_test_log_find(g_th, KILN_LOG_DEBUG, "on"), "one");
    s->log_value(h, "loss", 2.0, KILN_LOG_ON_STEP, 4.0);
    s->log_metric(h, "loss", 1.5, 7);
    CU_ASSERT_EQUAL(kiln_test_logged_count(g_th), 2);
    CU_ASSERT_EQUAL(kiln_test_logged(g_th, 0)->weight, 4.0);
    CU_ASSERT_EQUAL(kiln_test_logged(g_th, 0)->source, KILN_TEST_LOG_VALUE);
    CU_ASSERT_EQUAL(kiln_test_logged(g_th, 1)->step, 7);
    CU_ASSERT_EQUAL(kiln_test_logged(g_th, 1)->source, KILN_TEST_LOG_METRIC);
    CU_ASSERT_EQUAL(kiln_test_last_value(g_th, "loss"), 1.5);
    CU_ASSERT(isnan(kiln_test_last_value(g_th, "acc")));
    double m = 0;
    CU_ASSERT(s->get_metric(h, "loss", &m) == KILN_OK && m == 1.5);
    CU_ASSERT_EQUAL(s->get_metric(h, "acc", &m), KILN_E_NOT_FOUND);
    s->request_stop(h, "enough");
    CU_ASSERT_EQUAL(kiln_test_stop_count(g_th), 1);
    CU_ASSERT_STRING_EQUAL(kiln_test_stop_reason(g_th), "enough");
    CU_ASSERT_EQUAL(s->save_checkpoint(h, "a.ckpt"), KILN_OK);
    kiln_test_set_checkpoint_status(g_th, KILN_E_STATE);
    CU_ASSERT_EQUAL(s->save_checkpoint(h, "b.ckpt"), KILN_E_STATE);
    CU_ASSERT_EQUAL(kiln_test_checkpoint_count(g_th), 2);
    CU_ASSERT_STRING_EQUAL(kiln_test_checkpoint(g_th, 1), "b.ckpt");
    kiln_test_set_seed(g_th, 42);
    uint64_t a = s->seed(h, "init");
    CU_ASSERT(a == s->seed(h, "init") && a != s->seed(h, "data"));
    kiln_value cv;
    CU_ASSERT_EQUAL(s->config_get(h, "trainer.seed", &cv), KILN_E_NOT_FOUND);
    const kiln_kv cfg[] = {{"trainer.seed", KILN_V_INT(3)}, {NULL, KILN_V_NONE}};
    kiln_test_set_config(g_th, cfg);
    CU_ASSERT(s->config_get(h, "trainer.seed", &cv) == KILN_OK && cv.v.i == 3);
    CU_ASSERT_EQUAL(s->manual_backward(h, 1.0), KILN_E_UNSUPPORTED);
    CU_ASSERT_EQUAL(s->optimizer_count(h), 0);
    kiln_test_reset(g_th);
    CU_ASSERT_EQUAL(kiln_test_log_count(g_th) + kiln_test_logged_count(g_th) + kiln_test_checkpoint_count(g_th), 0);
    CU_ASSERT_EQUAL(kiln_test_stop_count(g_th), 0);
    CU_ASSERT_EQUAL(s->config_get(h, "trainer.seed", &cv), KILN_E_NOT_FOUND);
}

/* One training step the way the trainer composes it: data -> module ->
 * precision.optimizer_step(closure) -> sgd, then the scheduler, the
 * callback and the state of the optimizer. */
typedef struct {
    kiln_instance *module, *data;
    kiln_batch batch;
} step_ctx;

static int32_t closure(void *c, double *loss) {
    step_ctx *s = c;
    kiln_step_output out = {0};
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) { /* zero_grad */
        kiln_parameter *p = kiln_test_param(g_th, i);
        memset(p->grad, 0, (size_t)p->numel * sizeof(float));
    }
    int32_t rc = kiln_test_step(g_th, s->module, KILN_SPLIT_TRAIN, &s->batch, 0, &out);
    if (rc) return rc;
    *loss = out.loss;
    return kiln_test_backward(g_th, s->module, 1.0);
}

static void test_every_kind(void) {
    kiln_test_reset(g_th);
    const kiln_plugin_desc *p32 = load("KILN_PLUGIN_DIR", "true", KILN_KIND_PRECISION, "32-true");
    const kiln_plugin_desc *sgd = load("KILN_PLUGIN_DIR", "sgd", KILN_KIND_OPTIMIZER, "sgd");
    const kiln_plugin_desc *step = load("KILN_PLUGIN_DIR", "schedulers", KILN_KIND_SCHEDULER, "step");
    const kiln_plugin_desc *es = load("KILN_PLUGIN_DIR", "early_stopping", KILN_KIND_CALLBACK, "early_stopping");
    const kiln_plugin_desc *mlp = load("KILN_PLUGIN_DIR", "mlp", KILN_KIND_MODULE, "mlp");
    const kiln_plugin_desc *toy = load("KILN_TRAIN_FIXTURES", "toydata", KILN_KIND_DATA, "toydata");
    CU_ASSERT_FATAL(p32 && sgd && step && es && mlp && toy);
    /* the accelerator: the built cpu plugin, found through KILN_PLUGIN_DIR */
    CU_ASSERT_EQUAL_FATAL(kiln_test_use_accelerator(g_th, NULL, "cpu", NULL, 1), KILN_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(kiln_test_kernels(g_th));
    kiln_test_trainer(g_th)->stage = KILN_STAGE_FIT;

    step_ctx s = {0};
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(g_th, toy, "batch_size = 4; features = 3; n_train = 2", &s.data),
                          KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_data_setup(g_th, s.data, KILN_STAGE_FIT, 0, 1), KILN_OK);
    int64_t nb = 0;
    CU_ASSERT(kiln_test_num_batches(g_th, s.data, KILN_SPLIT_TRAIN, &nb) == KILN_OK && nb == 2);
    CU_ASSERT_EQUAL_FATAL(kiln_test_start_epoch(g_th, s.data, KILN_SPLIT_TRAIN, 0, 0), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_data_next(g_th, s.data, KILN_SPLIT_TRAIN, &s.batch), 1);
    CU_ASSERT_EQUAL(s.batch.size, 4);

    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(g_th, mlp, "layers = [3, 5, 2]; max_batch = 4", &s.module), KILN_OK);
    CU_ASSERT_EQUAL(kiln_test_param_count(g_th), 4); /* two Linear layers */
    CU_ASSERT_PTR_NOT_NULL(kiln_test_find_param(g_th, "layers.0.weight"));
    CU_ASSERT_EQUAL_FATAL(kiln_test_init_weights(g_th, s.module, 7), KILN_OK);

    kiln_instance *prec = NULL, *opt = NULL, *sched = NULL, *cb = NULL, *opt2 = NULL;
    CU_ASSERT_EQUAL_FATAL(kiln_test_create(g_th, p32, NULL, &prec), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_setup(g_th, prec), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(g_th, sgd, "lr = 0.1; momentum = 0.9", &opt), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_setup(g_th, opt), KILN_OK);
    CU_ASSERT_EQUAL(kiln_test_send_event(g_th, prec, KILN_EV_ON_FIT_START), KILN_OK);

    kiln_parameter *w = kiln_test_find_param(g_th, "layers.0.weight");
    const float w0 = w->data[0];
    int32_t skipped = -1;
    CU_ASSERT_EQUAL(kiln_test_convert_params(g_th, prec), KILN_OK);
    CU_ASSERT_EQUAL(kiln_test_precision_step(g_th, prec, opt, closure, &s, &skipped), KILN_OK);
    CU_ASSERT_EQUAL(skipped, 0);
    const kiln_test_counts *n = kiln_test_counters(g_th);
    CU_ASSERT(n->closure_calls == 1 && n->after_closure == 1 && n->updates == 1);
    CU_ASSERT(isfinite(n->last_loss) && n->last_loss > 0);
    CU_ASSERT_EQUAL(kiln_test_last_value(g_th, "train_loss"), n->last_loss); /* the module logged it */
    /* sgd moved the weight by -lr * grad (the first momentum step) */
    CU_ASSERT_DOUBLE_EQUAL(w->data[0], w0 - 0.1f * w->grad[0], 1e-6);
    /* the optimizer alone, with and without a closure */
    CU_ASSERT_EQUAL(kiln_test_optimizer_step(g_th, opt, closure, &s), KILN_OK);
    CU_ASSERT_EQUAL(n->closure_calls, 2);
    CU_ASSERT_EQUAL(kiln_test_optimizer_step(g_th, opt, NULL, NULL), KILN_OK);
    double lr = 0;
    CU_ASSERT(kiln_test_get_lr(g_th, opt, &lr) == KILN_OK && fabs(lr - 0.1) < 1e-12);
    CU_ASSERT_EQUAL(kiln_test_set_lr(g_th, opt, 0.05), KILN_OK);

    /* the momentum buffers move to a second instance */
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(g_th, sgd, "lr = 0.05; momentum = 0.9", &opt2), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_setup(g_th, opt2), KILN_OK);
    size_t bytes = 0;
    CU_ASSERT_EQUAL(kiln_test_state_roundtrip(g_th, opt, opt2, NULL, &bytes), KILN_OK);
    CU_ASSERT(bytes > 0);

    /* the scheduler: StepLR(step_size 2, gamma 0.5) */
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(g_th, step, "step_size = 2; gamma = 0.5", &sched), KILN_OK);
    const double want[5] = {1.0, 1.0, 0.5, 0.5, 0.25};
    for (int i = 0; i < 5; i++) {
        CU_ASSERT_EQUAL(kiln_test_lr_at(g_th, sched, 1.0, i, 0, NAN, &lr), KILN_OK);
        CU_ASSERT_DOUBLE_EQUAL(lr, want[i], 1e-12);
    }

    /* the callback: early stopping on a metric that stops improving */
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(g_th, es, "monitor = \"val_loss\"; patience = 1", &cb), KILN_OK);
    CU_ASSERT_EQUAL(kiln_test_send_event(g_th, cb, KILN_EV_ON_FIT_START), KILN_OK);
    const double vals[3] = {1.0, 0.5, 0.7};
    for (int e = 0; e < 3; e++) {
        kiln_test_trainer(g_th)->current_epoch = e;
        kiln_test_services(g_th)->log_value(kiln_test_hctx(g_th), "val_loss", vals[e], KILN_LOG_ON_EPOCH, 1.0);
        CU_ASSERT_EQUAL(kiln_test_send_event(g_th, cb, KILN_EV_ON_TRAIN_EPOCH_END), KILN_OK);
        CU_ASSERT_EQUAL(kiln_test_stop_count(g_th), e == 2);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_stop_reason(g_th), "val_loss"));

    /* the rest of the epoch, then its end */
    CU_ASSERT_EQUAL(kiln_test_data_next(g_th, s.data, KILN_SPLIT_TRAIN, &s.batch), 1);
    CU_ASSERT_EQUAL(kiln_test_data_next(g_th, s.data, KILN_SPLIT_TRAIN, &s.batch), 0);
    kiln_step_output out = {0};
    CU_ASSERT_EQUAL(kiln_test_step(g_th, s.module, 7, &s.batch, 0, &out), KILN_E_INVALID_ARG);
    /* reset destroys every instance (newest first) and the accelerator last */
    CU_ASSERT_EQUAL(kiln_test_reset(g_th), KILN_OK);
    CU_ASSERT_PTR_NULL(kiln_test_kernels(g_th));
    CU_ASSERT_EQUAL(kiln_test_param_count(g_th), 0);
}

static void test_params_f64(void) {
    kiln_test_reset(g_th);
    kiln_parameter *p = NULL, *q = NULL;
    const int64_t shape[2] = {3, 5};
    CU_ASSERT_EQUAL_FATAL(kiln_test_add_param(g_th, "w", 2, shape, 0, KILN_DTYPE_F64, &p), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_add_param(g_th, "b", 1, shape, KILN_PARAMF_NO_DECAY, KILN_DTYPE_F32, &q), KILN_OK);
    CU_ASSERT_EQUAL(kiln_test_add_param(g_th, "x", 0, shape, 0, KILN_DTYPE_F32, &q), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(kiln_test_add_param(g_th, "x", 1, shape, 0, KILN_DTYPE_F16, &q), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(g_th), KILN_OK);
    CU_ASSERT(p->numel == 15 && kiln_param_dtype(p) == KILN_DTYPE_F64 && p->compute == p->data);
    double *d = (double *)(void *)p->data;
    d[14] = 1.5; /* room for 15 doubles (ASan would see an overrun) */
    CU_ASSERT_EQUAL(((double *)(void *)p->grad)[14], 0.0);
    CU_ASSERT_PTR_EQUAL(kiln_test_params(g_th)[0], p);
    CU_ASSERT_PTR_NULL(kiln_test_param(g_th, 2));
    kiln_test_host *other;
    CU_ASSERT_EQUAL_FATAL(kiln_test_host_new(&other), KILN_OK); /* hosts are independent */
    CU_ASSERT_EQUAL(kiln_test_param_count(other), 0);
    kiln_test_host_free(other);
}

static int suite_clean(void) {
    kiln_test_host_free(g_th);
    g_th = NULL;
    return 0;
}

static CU_TestInfo cases_testing[] = {
    {"config text against declared keys", test_config_text},
    {"harness failures: a status and one line", test_harness_errors},
    {"services record what the plugin does", test_records},
    {"every kind through its wrappers", test_every_kind},
    {"parameters: f32, f64, independent hosts", test_params_f64},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "testing", .pCleanupFunc = suite_clean, .pTests = cases_testing},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
