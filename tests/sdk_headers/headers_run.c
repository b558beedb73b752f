/*
 * tests/sdk_headers/headers_run.c — runs what the installed SDK headers
 * define, compiled under strict C11 (check_headers.sh): the file-system
 * helpers (the strdup crash a plugin author hit under -std=c11), typed
 * values and their text, status names, dtypes, the random numbers, the
 * optimizer helpers (the 1.5 no-gradient test) and the precision plugin's
 * default optimizer step, with small fakes where a host would be. Exits
 * non-zero, naming the check, on the first difference.
 */
#include <kiln/config_checks.h>
#include <kiln/fs_util.h>
#include <kiln/kiln.h>
#include <kiln/nn.h>
#include <kiln/optim_util.h>
#include <kiln/precision_util.h>
#include <kiln/rng.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static int failures;
#define CHECK(cond)                                                      \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "headers_run: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                  \
        }                                                                \
    } while (0)

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* a host's set_error, as kiln_errorf calls it */
static char g_err[512];
static int32_t g_code;
static void fake_set_error(kiln_host_ctx *h, int32_t code, const char *msg) {
    (void)h;
    g_code = code;
    snprintf(g_err, sizeof g_err, "%s", msg);
}

/* an optimizer and closures, as the default precision step drives them */
static int g_closure_calls, g_after_calls, g_steps;
static int32_t closure_fn(void *ctx, double *loss) {
    (void)ctx;
    g_closure_calls++;
    if (loss) *loss = 0.25;
    return KILN_OK;
}
static int32_t after_fn(void *ctx, double *loss) {
    (void)ctx;
    (void)loss;
    g_after_calls++;
    return KILN_OK;
}
static int32_t step_fn(void *ctx, const kiln_closure *c) {
    (void)ctx;
    double loss = 0;
    int32_t rc = c->call(c->ctx, &loss);
    g_steps += rc == KILN_OK && loss == 0.25;
    return rc;
}

int main(void) {
    /* fs_util.h */
    kiln_mkdirs("fs/a/b/c");
    CHECK(is_dir("fs/a/b/c"));
    kiln_mkdir_parent("fs/x/y/file.txt");
    CHECK(is_dir("fs/x/y"));
    kiln_mkdir_parent("bare.txt"); /* nothing to make */

    /* value.h */
    static const char *const names[] = {"a", "b"};
    static const int64_t ints[] = {1, -2, 3};
    const kiln_kv kv[] = {{"lr", KILN_V_FLOAT(0.5)},  {"n", KILN_V_INT(7)},      {"on", KILN_V_BOOL(1)},
                          {"name", KILN_V_STR("x")}, {"l", KILN_V_STRS(names)}, {"i", KILN_V_INTS(ints)},
                          {NULL, KILN_V_NONE}};
    CHECK(kiln_kv_float(kv, "lr", 0) == 0.5);
    CHECK(kiln_kv_float(kv, "n", 0) == 7.0);
    CHECK(kiln_kv_int(kv, "n", 0) == 7 && kiln_kv_int(kv, "on", 0) == 1 && kiln_kv_int(kv, "none", -1) == -1);
    CHECK(!strcmp(kiln_kv_str(kv, "name", "?"), "x") && !strcmp(kiln_kv_str(kv, "lr", "?"), "?"));
    char text[64];
    CHECK(!strcmp(kiln_value_format(kiln_kv_find(kv, "lr"), text, sizeof text), "0.5"));
    CHECK(!strcmp(kiln_value_format(kiln_kv_find(kv, "on"), text, sizeof text), "true"));
    CHECK(!strcmp(kiln_value_format(kiln_kv_find(kv, "l"), text, sizeof text), "[a,b]"));
    CHECK(!strcmp(kiln_value_format(kiln_kv_find(kv, "i"), text, sizeof text), "[1,-2,3]"));
    CHECK(!strcmp(kiln_value_format(kiln_kv_find(kv, "i"), text, 4), "[1,")); /* truncates, terminated */

    /* config_checks.h: the rules kiln applies before create() */
    kiln_config_rule rule;
    char why[512], found[128];
    CHECK(kiln_config_rule_parse("lr in (0, 1]", &rule, why, sizeof why) == 0);
    kiln_value lr_ok = KILN_V_FLOAT(1.0), lr_bad = KILN_V_FLOAT(0.0);
    CHECK(kiln_config_rule_ok(&rule, &lr_ok, found, sizeof found));
    CHECK(!kiln_config_rule_ok(&rule, &lr_bad, found, sizeof found) && !strcmp(found, "0"));
    CHECK(kiln_config_rule_parse("lr ~ 1", &rule, why, sizeof why) == -1);
    static const char *const rules[] = {"lr > 0", "mode in {min, max}"};
    const kiln_kv props[] = {{"config_checks", KILN_V_STRS(rules)}, {NULL, KILN_V_NONE}};
    const kiln_kv cfg_bad[] = {{"lr", KILN_V_FLOAT(0.1)}, {"mode", KILN_V_STR("mid")}, {NULL, KILN_V_NONE}};
    CHECK(kiln_config_rules_check(props, cfg_bad, why, sizeof why) == -1);
    CHECK(!strcmp(why, "key 'mode' must be one of \"min\", \"max\", found \"mid\""));

    /* status.h */
    CHECK(!strcmp(kiln_status_name(KILN_E_CONFIG), "KILN_E_CONFIG"));
    CHECK(!strcmp(kiln_status_name(-1234), "KILN_E_PLUGIN"));
    CHECK(!strcmp(kiln_strerror(KILN_OK), "success"));

    /* tensor.h */
    CHECK(kiln_dtype_size(KILN_DTYPE_F32) == 4 && kiln_dtype_size(KILN_DTYPE_BF16) == 2);
    CHECK(kiln_dtype_from_name(kiln_dtype_name(KILN_DTYPE_F16)) == KILN_DTYPE_F16);

    /* rng.h: the same seed, the same numbers; uniform within bounds */
    kiln_rng r1, r2;
    kiln_rng_seed(&r1, 42);
    kiln_rng_seed(&r2, 42);
    CHECK(kiln_rng_next(&r1) == kiln_rng_next(&r2));
    for (int i = 0; i < 1000; i++) {
        float u = kiln_rng_uniformf(&r1, -1.0f, 1.0f);
        CHECK(u >= -1.0f && u < 1.0f);
        if (u < -1.0f || u >= 1.0f) break;
    }

    /* optim_util.h: bytes, and which parameters have a gradient (1.5) */
    float d0[6], g0[6], d1[2], g1[2];
    kiln_parameter p0 = {sizeof(kiln_parameter), 0, "w", 2, KILN_DTYPE_F32, {2, 3}, 6, d0, g0, d0,
                         KILN_DTYPE_F32, 0};
    kiln_parameter p1 = {sizeof(kiln_parameter), KILN_PARAMF_NO_DECAY, "b", 1, KILN_DTYPE_F32, {2}, 2, d1, g1, d1,
                         KILN_DTYPE_F32, 0};
    kiln_parameter *ps[2] = {&p0, &p1};
    CHECK(kiln_params_bytes(ps, 2) == 32 && kiln_params_numel(ps, 2) == 8);
    CHECK(kiln_params_any_grad(ps, 2));
    p0.flags |= KILN_PARAMF_NO_GRAD;
    p1.flags |= KILN_PARAMF_NO_GRAD;
    CHECK(!kiln_param_has_grad(&p0) && !kiln_params_any_grad(ps, 2));

    /* sdk.h: kiln_errorf through a host's set_error */
    kiln_host_services svc;
    memset(&svc, 0, sizeof svc);
    svc.set_error = fake_set_error;
    CHECK(kiln_errorf(&svc, NULL, KILN_E_CONFIG, "lr must be > 0, got %g", -1.0) == KILN_E_CONFIG);
    CHECK(g_code == KILN_E_CONFIG && !strcmp(g_err, "lr must be > 0, got -1"));
    kiln_logf(&svc, NULL, KILN_LOG_INFO, "no log service: %d", 1); /* a no-op, not a crash */

    /* precision_util.h: opt.step(closure, then after_closure) */
    kiln_closure closure = {sizeof(kiln_closure), 0, NULL, closure_fn};
    kiln_closure after = {sizeof(kiln_closure), 0, NULL, after_fn};
    kiln_optimizer_ref opt = {sizeof(kiln_optimizer_ref), 0, NULL, step_fn};
    int32_t skipped = -1;
    CHECK(kiln_precision_default_step(&opt, &closure, &after, &skipped) == KILN_OK);
    CHECK(skipped == 0 && g_closure_calls == 1 && g_after_calls == 1 && g_steps == 1);

    if (failures) return 1;
    printf("headers_run: every check passed\n");
    return 0;
}
