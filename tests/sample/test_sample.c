/*
 * test_sample.c — CUnit suite for the `sample` callback plugin, loaded from
 * the build's plugin directory through the test host. The mock's predict
 * service stands in for a language model whose logits the test chooses:
 * "the next token is the last one plus one" makes greedy decoding write a
 * known text, and a row with a few large logits checks that top_k draws only
 * among them. The suite checks the file the samples are appended to, when
 * samples are taken (every N steps, at the end of fit, never on rank 1 or
 * in the sanity check), that a draw depends only on the seed and the step,
 * the byte-level and token-id renderings, the context crop, and the
 * refusals (bad keys, a module without predict_step).
 */
#define _XOPEN_SOURCE 700 /* mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <CUnit/CUnit.h>

#include <kiln/testing.h>

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

static const kiln_callback_ops *g_ops;
static char g_run[256];
static int64_t g_vocab = 256;   /* logits per prediction                     */
static int g_mode;              /* 0: next = last + 1; 1: three likely tokens */
static int64_t g_max_seen_t;    /* the longest context predict was given      */
static int g_calls;
static float g_logits[70000];

static int32_t fake_predict(void *ctx, const kiln_batch *batch, kiln_tensor *out) {
    (void)ctx;
    const kiln_tensor *x = &batch->tensors[0];
    CU_ASSERT_EQUAL_FATAL(x->dtype, KILN_DTYPE_I32);
    CU_ASSERT_EQUAL_FATAL(x->ndim, 2);
    const int64_t t = x->shape[1];
    const int32_t last = ((const int32_t *)x->data)[t - 1];
    if (t > g_max_seen_t) g_max_seen_t = t;
    g_calls++;
    for (int64_t i = 0; i < g_vocab; i++) g_logits[i] = 0.0f;
    if (g_mode == 0) {
        g_logits[(last + 1) % g_vocab] = 5.0f;
    } else { /* 'x', 'y', 'z' likely, 'z' a little less */
        g_logits['x'] = 8.0f, g_logits['y'] = 8.0f, g_logits['z'] = 7.5f;
    }
    *out = (kiln_tensor){g_logits, KILN_DTYPE_F32, 2, {1, g_vocab, 1, 1}};
    return KILN_OK;
}

static int32_t no_predict(void *ctx, const kiln_batch *batch, kiln_tensor *out) {
    (void)ctx;
    (void)batch, (void)out;
    kiln_test_services(g_th)->set_error(kiln_test_hctx(g_th), KILN_E_UNSUPPORTED, "predict: module 'mlp' has no predict_step");
    return KILN_E_UNSUPPORTED;
}

static void setup_run(void) {
    kiln_test_reset(g_th);
    snprintf(g_run, sizeof g_run, "/tmp/kiln-sample-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(g_run));
    kiln_test_trainer(g_th)->struct_size = sizeof(kiln_trainer_state);
    kiln_test_trainer(g_th)->run_dir = g_run;
    kiln_test_trainer(g_th)->world_size = 1;
    kiln_test_set_trainer_hooks(g_th, &(kiln_test_trainer_hooks){.predict = fake_predict});
    g_vocab = 256;
    g_mode = 0;
    g_max_seen_t = 0;
    g_calls = 0;
}

static char *read_samples(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/samples.txt", g_run);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void cleanup_run(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/samples.txt", g_run);
    unlink(path);
    rmdir(g_run);
}

static kiln_kv g_kv[12];
/* keys, values: a NULL-terminated list of (name, kiln_value) */
static kiln_instance *make(int32_t want, int n, const char *const *names, const kiln_value *vals) {
    for (int i = 0; i < n; i++) g_kv[i] = (kiln_kv){names[i], vals[i]};
    g_kv[n] = (kiln_kv){NULL, KILN_V_NONE};
    kiln_instance *inst = NULL;
    int32_t rc = g_ops->base.create(NULL, kiln_test_services(g_th), kiln_test_hctx(g_th), g_kv, &inst);
    CU_ASSERT_EQUAL(rc, want);
    if (want != KILN_OK) CU_ASSERT_PTR_NULL(inst);
    return inst;
}

static int32_t send(kiln_instance *inst, uint32_t id, int64_t step) {
    kiln_test_trainer(g_th)->global_step = step;
    kiln_event ev = {sizeof ev, id, KILN_STAGE_FIT, 0, step, NULL, NULL, 0, kiln_test_trainer(g_th), NULL, NULL, 0, 0, 0, 0, 0};
    return g_ops->on_event(inst, &ev);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

static void test_greedy_text(void) {
    setup_run();
    const char *k[] = {"temperature", "num_tokens", "prompt"};
    const kiln_value v[] = {KILN_V_FLOAT(0.0), KILN_V_INT(5), KILN_V_STR("ab")};
    kiln_instance *s = make(KILN_OK, 3, k, v);
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_FIT_END, 7), KILN_OK);
    const char *txt = read_samples();
    CU_ASSERT_PTR_NOT_NULL_FATAL(txt);
    CU_ASSERT_PTR_NOT_NULL(strstr(txt, "=== step 7, epoch 0, at the end of fit"));
    CU_ASSERT_PTR_NOT_NULL(strstr(txt, "\nabcdefg\n"));
    CU_ASSERT_EQUAL(g_calls, 5);
    g_ops->base.destroy(s);
    cleanup_run();
}

static void test_when(void) {
    setup_run();
    const char *k[] = {"every_n_steps", "num_tokens"};
    const kiln_value v[] = {KILN_V_INT(2), KILN_V_INT(3)};
    kiln_instance *s = make(KILN_OK, 2, k, v);
    for (int64_t step = 1; step <= 5; step++) CU_ASSERT_EQUAL(send(s, KILN_EV_ON_TRAIN_BATCH_END, step), KILN_OK);
    /* accumulating batches end at the same global step: no second sample */
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_TRAIN_BATCH_END, 4), KILN_OK);
    kiln_test_trainer(g_th)->sanity_checking = 1;
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_TRAIN_BATCH_END, 6), KILN_OK);
    kiln_test_trainer(g_th)->sanity_checking = 0;
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_FIT_END, 5), KILN_OK);
    const char *txt = read_samples();
    CU_ASSERT_PTR_NOT_NULL_FATAL(txt);
    CU_ASSERT_EQUAL(count(txt, "=== step"), 3);
    CU_ASSERT_EQUAL(count(txt, "=== step 2,"), 1);
    CU_ASSERT_EQUAL(count(txt, "=== step 4,"), 1);
    CU_ASSERT_EQUAL(count(txt, "=== step 5, epoch 0, at the end of fit"), 1);
    /* a fit that ends on a sampled step does not print the same text again */
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_TRAIN_BATCH_END, 6), KILN_OK);
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_FIT_END, 6), KILN_OK);
    txt = read_samples();
    CU_ASSERT_EQUAL(count(txt, "=== step 6,"), 1);
    g_ops->base.destroy(s);
    cleanup_run();

    /* rank 1 never samples */
    setup_run();
    kiln_test_trainer(g_th)->rank = 1;
    s = make(KILN_OK, 2, k, v);
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_TRAIN_BATCH_END, 2), KILN_OK);
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_FIT_END, 2), KILN_OK);
    CU_ASSERT_PTR_NULL(read_samples());
    CU_ASSERT_EQUAL(g_calls, 0);
    g_ops->base.destroy(s);
    cleanup_run();
}

/* A draw depends on the seed and the step only; top_k keeps it among the
 * k most likely tokens. */
static void test_seeded_topk(void) {
    setup_run();
    g_mode = 1;
    const char *k[] = {"num_tokens", "top_k", "prompt", "seed"};
    const kiln_value v[] = {KILN_V_INT(300), KILN_V_INT(2), KILN_V_STR(">"), KILN_V_INT(99)};
    kiln_instance *s = make(KILN_OK, 4, k, v);
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_FIT_END, 3), KILN_OK);
    g_ops->base.destroy(s); /* a resumed run: a new instance, the same step */
    s = make(KILN_OK, 4, k, v);
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_FIT_END, 3), KILN_OK);
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_FIT_END, 4), KILN_OK);
    char *txt = strdup(read_samples());
    CU_ASSERT_PTR_NOT_NULL_FATAL(txt);
    char *lines[3] = {0};
    int n = 0;
    for (char *p = strtok(txt, "\n"); p && n < 3; p = strtok(NULL, "\n"))
        if (p[0] == '>') lines[n++] = p;
    CU_ASSERT_EQUAL_FATAL(n, 3);
    CU_ASSERT_STRING_EQUAL(lines[0], lines[1]);   /* same seed, same step */
    CU_ASSERT_STRING_NOT_EQUAL(lines[0], lines[2]); /* another step */
    int nx = 0, ny = 0;
    for (const char *c = lines[0] + 1; *c; c++) {
        CU_ASSERT(*c == 'x' || *c == 'y'); /* never 'z' (third) or the rest */
        nx += *c == 'x', ny += *c == 'y';
    }
    CU_ASSERT_EQUAL(nx + ny, 300);
    CU_ASSERT(nx > 100 && ny > 100); /* two equal logits: about half each */
    free(txt);
    g_ops->base.destroy(s);
    cleanup_run();

    /* without top_k the third token appears; top_k 1 is greedy */
    setup_run();
    g_mode = 1;
    const kiln_value v2[] = {KILN_V_INT(300), KILN_V_INT(0), KILN_V_STR(">"), KILN_V_INT(99)};
    s = make(KILN_OK, 4, k, v2);
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_FIT_END, 3), KILN_OK);
    CU_ASSERT(count(read_samples(), "z") > 10);
    g_ops->base.destroy(s);
    cleanup_run();
}

static void test_ids_and_context(void) {
    setup_run();
    g_vocab = 50257;
    const int64_t prompt[] = {50255};
    const char *k[] = {"temperature", "num_tokens", "prompt_tokens", "context"};
    const kiln_value v[] = {KILN_V_FLOAT(0.0), KILN_V_INT(4), KILN_V_INTS(prompt), KILN_V_INT(3)};
    kiln_instance *s = make(KILN_OK, 4, k, v);
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_FIT_END, 1), KILN_OK);
    const char *txt = read_samples();
    CU_ASSERT_PTR_NOT_NULL_FATAL(txt);
    CU_ASSERT_PTR_NOT_NULL(strstr(txt, "\n50255 50256 0 1 2\n"));
    CU_ASSERT_EQUAL(g_max_seen_t, 3);
    g_ops->base.destroy(s);
    cleanup_run();
}

static void test_refusals(void) {
    setup_run();
    const char *k1[] = {"num_tokens"};
    const kiln_value bad_n[] = {KILN_V_INT(0)};
    make(KILN_E_CONFIG, 1, k1, bad_n);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "num_tokens"));
    const char *k2[] = {"temperature"};
    const kiln_value bad_t[] = {KILN_V_FLOAT(-0.5)};
    make(KILN_E_CONFIG, 1, k2, bad_t);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "temperature"));
    const char *k3[] = {"prompt"};
    const kiln_value empty[] = {KILN_V_STR("")};
    make(KILN_E_CONFIG, 1, k3, empty);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "prompt is empty"));
    const int64_t neg[] = {3, -2};
    const char *k4[] = {"prompt_tokens"};
    const kiln_value bad_ids[] = {KILN_V_INTS(neg)};
    make(KILN_E_CONFIG, 1, k4, bad_ids);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "prompt_tokens[1]"));

    /* a module without predict_step fails the run with the host's line */
    kiln_test_set_trainer_hooks(g_th, &(kiln_test_trainer_hooks){.predict = no_predict});
    kiln_instance *s = make(KILN_OK, 0, NULL, NULL);
    CU_ASSERT_EQUAL(send(s, KILN_EV_ON_FIT_END, 1), KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "no predict_step"));
    g_ops->base.destroy(s);
    cleanup_run();
}

static int suite_init(void) {
    const char *dir = getenv("KILN_PLUGIN_DIR");
    if (!dir) return 1;
    char path[1024];
    snprintf(path, sizeof path, "%s/libkiln-sample.so", dir);
    const kiln_plugin_desc *d = NULL;
    kiln_test_load(g_th, path, KILN_KIND_CALLBACK, "sample", &d);
    if (!d) return 1;
    g_ops = d->ops;
    return 0;
}

static CU_TestInfo cases_sample[] = {
    {"greedy text", test_greedy_text},
    {"when samples are taken", test_when},
    {"seeded draws, top_k", test_seeded_topk},
    {"token ids, context crop", test_ids_and_context},
    {"refusals", test_refusals},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "sample", .pInitFunc = suite_init, .pTests = cases_sample},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
