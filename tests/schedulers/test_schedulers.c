/*
 * test_schedulers.c — CUnit suite for the scheduler plugins constant, step,
 * cosine and plateau (libkiln-schedulers.so) and the lr_monitor callback,
 * each loaded from the build's plugin directory through the test host and
 * created with the config the host would resolve (every declared key, its
 * declared default unless the test overrides it). The closed-form
 * schedules are checked against values the test derives another way: hand
 * values, and PyTorch's recursive (chainable) forms, which multiply the
 * previous rate instead of evaluating the closed form. ReduceLROnPlateau is
 * checked against hand-traced rate sequences for metric streams that
 * exercise improvement, patience, cooldown, min_lr, eps, rel/abs
 * thresholds, max mode and missing (NaN) metrics, and its checkpoint state
 * must give an identical continuation. lr_monitor must log the right names,
 * values and flags at the right events, and nothing where it should not.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/CUnit.h>

#include <kiln/testing.h>

#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

/* ---------------------------------------------------------------------------
 * Loading, configs and comparisons */

#define MAX_CFG 16

static const kiln_plugin_desc *load_desc(const char *lib, uint32_t kind, const char *name) {
    const char *dir = getenv("KILN_PLUGIN_DIR");
    CU_ASSERT_PTR_NOT_NULL_FATAL(dir);
    char path[1024];
    snprintf(path, sizeof path, "%s/libkiln-%s.so", dir, lib);
    const kiln_plugin_desc *d = NULL;
    kiln_test_load(g_th, path, kind, name, &d);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    return d;
}

static const kiln_scheduler_ops *sched_ops(const char *name, const kiln_plugin_desc **desc) {
    const kiln_plugin_desc *d = load_desc("schedulers", KILN_KIND_SCHEDULER, name);
    const kiln_scheduler_ops *ops = d->ops;
    CU_ASSERT_FATAL(ops->base.struct_size >= KILN_SCHEDULER_OPS_SIZE_1_1 && ops->lr_at && ops->base.create &&
                    ops->base.destroy);
    if (desc) *desc = d;
    return ops;
}

/* The resolved config the host would pass: every declared key with its
 * default, then `over` (NULL-key terminated) replacing values. Every
 * override must name a declared key — a typo would otherwise test nothing. */
static void make_cfg(const kiln_plugin_desc *d, const kiln_kv *over, kiln_kv out[MAX_CFG]) {
    int n = 0;
    for (const kiln_param *p = d->params; p && p->key; p++) {
        CU_ASSERT_FATAL(n < MAX_CFG - 1);
        out[n].key = p->key;
        out[n].value = p->def;
        n++;
    }
    out[n].key = NULL;
    out[n].value.type = KILN_TYPE_NONE;
    for (const kiln_kv *o = over; o && o->key; o++) {
        int found = 0;
        for (int i = 0; i < n; i++)
            if (!strcmp(out[i].key, o->key)) {
                CU_ASSERT_EQUAL(out[i].value.type, o->value.type);
                out[i].value = o->value;
                found = 1;
            }
        if (!found) fprintf(stderr, "\nconfig override '%s' is not a declared key of %s\n", o->key, d->name);
        CU_ASSERT_FATAL(found);
    }
}

/* Create `name` with defaults + `over`; CU-fails unless it succeeds. */
static kiln_instance *sched_new(const char *name, const kiln_kv *over, const kiln_host_services *svc) {
    const kiln_plugin_desc *d;
    const kiln_scheduler_ops *ops = sched_ops(name, &d);
    kiln_kv cfg[MAX_CFG];
    make_cfg(d, over, cfg);
    kiln_instance *inst = NULL;
    int32_t rc = ops->base.create(d->plugin_ctx, svc ? svc : kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &inst);
    if (rc != KILN_OK) fprintf(stderr, "\ncreate %s: %s\n", name, kiln_test_error(g_th));
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    return inst;
}

static void sched_free(const char *name, kiln_instance *inst) { sched_ops(name, NULL)->base.destroy(inst); }

/* lr_at that must succeed */
static double lr_at(const char *name, kiln_instance *inst, double base, int64_t step, double metric) {
    double lr = -1.0;
    int32_t rc = sched_ops(name, NULL)->lr_at(inst, base, step, 0, metric, &lr);
    if (rc != KILN_OK) fprintf(stderr, "\n%s lr_at(step %lld): %s\n", name, (long long)step, kiln_test_error(g_th));
    CU_ASSERT_EQUAL(rc, KILN_OK);
    return lr;
}

/* |got - want| <= rel * max(|want|, tiny) */
static int close_to(double got, double want, double rel) {
    if (got == want) return 1;
    double scale = fabs(want) > 1e-300 ? fabs(want) : 1e-300;
    return fabs(got - want) <= rel * scale;
}

#define ASSERT_CLOSE(got, want, rel, what, step)                                                           \
    do {                                                                                                   \
        double g_ = (got), w_ = (want);                                                                    \
        if (!close_to(g_, w_, (rel)))                                                                      \
            fprintf(stderr, "\n%s at step %lld: got %.17g, want %.17g\n", (what), (long long)(step), g_, w_); \
        CU_ASSERT(close_to(g_, w_, (rel)));                                                                \
    } while (0)

/* Services whose log() counts warnings (the test host's own log prints only). */
static kiln_host_services g_counting;
static int g_warnings;
static char g_last_warning[512];
static void counting_log(kiln_host_ctx *h, int32_t level, const char *msg) {
    (void)h;
    if (level >= KILN_LOG_WARN) {
        g_warnings++;
        snprintf(g_last_warning, sizeof g_last_warning, "%s", msg);
    }
}
static const kiln_host_services *counting_services(void) {
    g_counting = *kiln_test_services(g_th);
    g_counting.log = counting_log;
    g_warnings = 0;
    g_last_warning[0] = '\0';
    return &g_counting;
}

/* ---------------------------------------------------------------------------
 * Descriptors */

static void test_descriptors(void) {
    kiln_test_reset(g_th);
    const char *names[] = {"constant", "step", "cosine", "plateau"};
    for (int i = 0; i < 4; i++) {
        const kiln_plugin_desc *d;
        const kiln_scheduler_ops *ops = sched_ops(names[i], &d);
        CU_ASSERT_EQUAL(d->kind, KILN_KIND_SCHEDULER);
        CU_ASSERT_STRING_EQUAL(d->name, names[i]);
        const int plateau = i == 3;
        CU_ASSERT_EQUAL((d->capabilities & KILN_CAP_STATEFUL) != 0, plateau);
        CU_ASSERT_EQUAL(ops->base.get_state != NULL, plateau);
        CU_ASSERT_EQUAL(ops->base.set_state != NULL, plateau);
        const kiln_value *rop = kiln_kv_find(d->properties, "reduce_on_plateau");
        if (plateau) {
            CU_ASSERT_PTR_NOT_NULL_FATAL(rop);
            CU_ASSERT_EQUAL(rop->type, KILN_TYPE_BOOL);
            CU_ASSERT_EQUAL(rop->v.i, 1);
        } else {
            CU_ASSERT_PTR_NULL(rop);
        }
        for (const kiln_param *p = d->params; p && p->key; p++) {
            CU_ASSERT(p->def.type == p->type); /* every key has a default of its own type */
            CU_ASSERT(p->help && *p->help);
        }
    }
    /* PyTorch's defaults */
    kiln_kv cfg[MAX_CFG];
    const kiln_plugin_desc *d;
    sched_ops("constant", &d);
    make_cfg(d, NULL, cfg);
    CU_ASSERT(kiln_kv_float(cfg, "factor", 0) == 1.0 / 3.0);
    CU_ASSERT_EQUAL(kiln_kv_int(cfg, "total_iters", 0), 5);
    sched_ops("step", &d);
    make_cfg(d, NULL, cfg);
    CU_ASSERT_EQUAL(kiln_kv_int(cfg, "step_size", 0), 30);
    CU_ASSERT(kiln_kv_float(cfg, "gamma", 0) == 0.1);
    sched_ops("cosine", &d);
    make_cfg(d, NULL, cfg);
    CU_ASSERT_EQUAL(kiln_kv_int(cfg, "warmup_steps", -1), 0);
    CU_ASSERT(kiln_kv_float(cfg, "warmup_start_factor", -1) == 0.0);
    CU_ASSERT_EQUAL(kiln_kv_int(cfg, "t_max", 0), 1000);
    CU_ASSERT(kiln_kv_float(cfg, "eta_min", -1) == 0.0);
    sched_ops("plateau", &d);
    make_cfg(d, NULL, cfg);
    CU_ASSERT_STRING_EQUAL(kiln_kv_str(cfg, "mode", ""), "min");
    CU_ASSERT(kiln_kv_float(cfg, "factor", 0) == 0.1);
    CU_ASSERT_EQUAL(kiln_kv_int(cfg, "patience", 0), 10);
    CU_ASSERT(kiln_kv_float(cfg, "threshold", 0) == 1e-4);
    CU_ASSERT_STRING_EQUAL(kiln_kv_str(cfg, "threshold_mode", ""), "rel");
    CU_ASSERT_EQUAL(kiln_kv_int(cfg, "cooldown", -1), 0);
    CU_ASSERT(kiln_kv_float(cfg, "min_lr", -1) == 0.0);
    CU_ASSERT(kiln_kv_float(cfg, "eps", 0) == 1e-8);
}

/* ---------------------------------------------------------------------------
 * Closed-form schedules */

static void test_constant(void) {
    kiln_test_reset(g_th);
    /* defaults: factor 1/3 for 5 steps; 0.3 / 3 = 0.1 by hand */
    kiln_instance *s = sched_new("constant", NULL, NULL);
    for (int64_t k = 0; k < 5; k++) ASSERT_CLOSE(lr_at("constant", s, 0.3, k, NAN), 0.1, 1e-15, "constant", k);
    for (int64_t k = 5; k < 9; k++) CU_ASSERT_EQUAL(lr_at("constant", s, 0.3, k, NAN), 0.3);
    CU_ASSERT_EQUAL(lr_at("constant", s, 0.3, 1000000, NAN), 0.3);
    /* out of order and repeated: a closed form does not care */
    ASSERT_CLOSE(lr_at("constant", s, 0.3, 2, NAN), 0.1, 1e-15, "constant", 2);
    sched_free("constant", s);

    /* PyTorch's chainable form: lr_0 = base * factor; at total_iters the
     * rate is divided by the factor once; otherwise unchanged */
    const kiln_kv over[] = {{"factor", KILN_V_FLOAT(0.25)}, {"total_iters", KILN_V_INT(3)}, {NULL, KILN_V_NONE}};
    s = sched_new("constant", over, NULL);
    double chain = 0.2 * 0.25;
    for (int64_t k = 0; k < 8; k++) {
        if (k == 3) chain = chain * (1.0 / 0.25);
        ASSERT_CLOSE(lr_at("constant", s, 0.2, k, NAN), chain, 1e-15, "constant chain", k);
    }
    sched_free("constant", s);

    /* total_iters 0: the base rate from the start */
    const kiln_kv none[] = {{"factor", KILN_V_FLOAT(0.5)}, {"total_iters", KILN_V_INT(0)}, {NULL, KILN_V_NONE}};
    s = sched_new("constant", none, NULL);
    CU_ASSERT_EQUAL(lr_at("constant", s, 0.7, 0, NAN), 0.7);
    sched_free("constant", s);
}

static void test_step(void) {
    kiln_test_reset(g_th);
    const kiln_kv over[] = {{"step_size", KILN_V_INT(3)}, {"gamma", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    kiln_instance *s = sched_new("step", over, NULL);
    /* hand values for base 0.8 */
    const struct { int64_t step; double lr; } hand[] = {
        {0, 0.8}, {1, 0.8}, {2, 0.8}, {3, 0.4}, {5, 0.4}, {6, 0.2}, {8, 0.2}, {9, 0.1}, {12, 0.05}};
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++)
        ASSERT_CLOSE(lr_at("step", s, 0.8, hand[i].step, NAN), hand[i].lr, 1e-15, "step hand", hand[i].step);
    /* PyTorch's chainable StepLR: multiply by gamma when step % step_size == 0 */
    double chain = 0.8;
    for (int64_t k = 0; k <= 60; k++) {
        if (k > 0 && k % 3 == 0) chain *= 0.5;
        ASSERT_CLOSE(lr_at("step", s, 0.8, k, NAN), chain, 1e-13, "step chain", k);
    }
    sched_free("step", s);

    /* defaults: step_size 30, gamma 0.1 */
    s = sched_new("step", NULL, NULL);
    CU_ASSERT_EQUAL(lr_at("step", s, 1.0, 29, NAN), 1.0);
    ASSERT_CLOSE(lr_at("step", s, 1.0, 30, NAN), 0.1, 1e-15, "step default", 30);
    ASSERT_CLOSE(lr_at("step", s, 1.0, 65, NAN), 0.01, 1e-14, "step default", 65);
    /* a huge step underflows to 0, no error */
    CU_ASSERT_EQUAL(lr_at("step", s, 1.0, INT64_C(30) * 100000, NAN), 0.0);
    sched_free("step", s);
}

/* PyTorch's chainable CosineAnnealingLR from `start` (its base rate) to
 * eta_min over t steps, one step further from `prev` at step e >= 1. */
static double cosine_chain(double prev, int64_t e, int64_t t, double eta_min) {
    const double pi = 3.14159265358979323846;
    return (1.0 + cos(pi * (double)e / (double)t)) / (1.0 + cos(pi * (double)(e - 1) / (double)t)) *
               (prev - eta_min) +
           eta_min;
}

static void test_cosine(void) {
    kiln_test_reset(g_th);
    const double base = 0.1, f0 = 0.1, eta = 0.001;
    const int64_t w = 10, t_max = 110;
    const kiln_kv over[] = {{"warmup_steps", KILN_V_INT(10)},
                            {"warmup_start_factor", KILN_V_FLOAT(0.1)},
                            {"t_max", KILN_V_INT(110)},
                            {"eta_min", KILN_V_FLOAT(0.001)},
                            {NULL, KILN_V_NONE}};
    kiln_instance *s = sched_new("cosine", over, NULL);
    /* hand values: start, mid-warmup, boundary, cosine midpoint, end, beyond */
    ASSERT_CLOSE(lr_at("cosine", s, base, 0, NAN), 0.01, 1e-14, "cosine", 0);
    ASSERT_CLOSE(lr_at("cosine", s, base, 1, NAN), 0.019, 1e-14, "cosine", 1);
    ASSERT_CLOSE(lr_at("cosine", s, base, 5, NAN), 0.055, 1e-14, "cosine", 5);
    CU_ASSERT_EQUAL(lr_at("cosine", s, base, w, NAN), base);
    ASSERT_CLOSE(lr_at("cosine", s, base, 60, NAN), 0.0505, 1e-14, "cosine", 60);
    ASSERT_CLOSE(lr_at("cosine", s, base, t_max, NAN), eta, 1e-14, "cosine", t_max);
    CU_ASSERT_EQUAL(lr_at("cosine", s, base, t_max + 1, NAN), eta);
    CU_ASSERT_EQUAL(lr_at("cosine", s, base, 100000, NAN), eta);
    /* warmup as an interpolation between the two end rates */
    const double start = base * f0;
    for (int64_t k = 0; k < w; k++)
        ASSERT_CLOSE(lr_at("cosine", s, base, k, NAN), start + (base - start) * (double)k / (double)w, 1e-13,
                     "cosine warmup", k);
    /* annealing against the chainable form, step by step */
    double chain = base;
    for (int64_t k = w + 1; k <= t_max; k++) {
        chain = cosine_chain(chain, k - w, t_max - w, eta);
        ASSERT_CLOSE(lr_at("cosine", s, base, k, NAN), chain, 1e-10, "cosine chain", k);
    }
    /* monotone non-increasing after the warmup */
    double prev = lr_at("cosine", s, base, w, NAN);
    for (int64_t k = w + 1; k <= t_max + 5; k++) {
        double lr = lr_at("cosine", s, base, k, NAN);
        CU_ASSERT(lr <= prev);
        prev = lr;
    }
    sched_free("cosine", s);

    /* defaults: no warmup, t_max 1000, eta_min 0 */
    s = sched_new("cosine", NULL, NULL);
    CU_ASSERT_EQUAL(lr_at("cosine", s, 0.4, 0, NAN), 0.4);
    ASSERT_CLOSE(lr_at("cosine", s, 0.4, 500, NAN), 0.2, 1e-14, "cosine default", 500);
    /* a quarter in: (1 + cos(pi/4)) / 2 = (2 + sqrt 2) / 4 */
    ASSERT_CLOSE(lr_at("cosine", s, 0.4, 250, NAN), 0.4 * (2.0 + sqrt(2.0)) / 4.0, 1e-14, "cosine default", 250);
    CU_ASSERT(fabs(lr_at("cosine", s, 0.4, 1000, NAN)) < 1e-17);
    CU_ASSERT_EQUAL(lr_at("cosine", s, 0.4, 1500, NAN), 0.0);
    sched_free("cosine", s);

    /* warmup from 0 (the default start factor) */
    const kiln_kv warm0[] = {{"warmup_steps", KILN_V_INT(4)}, {"t_max", KILN_V_INT(5)}, {NULL, KILN_V_NONE}};
    s = sched_new("cosine", warm0, NULL);
    CU_ASSERT_EQUAL(lr_at("cosine", s, 1.0, 0, NAN), 0.0);
    CU_ASSERT_EQUAL(lr_at("cosine", s, 1.0, 1, NAN), 0.25);
    CU_ASSERT_EQUAL(lr_at("cosine", s, 1.0, 3, NAN), 0.75);
    CU_ASSERT_EQUAL(lr_at("cosine", s, 1.0, 4, NAN), 1.0);
    CU_ASSERT(fabs(lr_at("cosine", s, 1.0, 5, NAN)) < 1e-16);
    sched_free("cosine", s);
}

/* Bad arguments to lr_at, for every schedule. */
static void test_lr_at_arguments(void) {
    kiln_test_reset(g_th);
    const char *names[] = {"constant", "step", "cosine", "plateau"};
    for (int i = 0; i < 4; i++) {
        kiln_instance *s = sched_new(names[i], NULL, NULL);
        const kiln_scheduler_ops *ops = sched_ops(names[i], NULL);
        double lr = 123.0;
        const struct { double base; int64_t step; const char *needle; } bad[] = {
            {0.1, -1, "step"}, {NAN, 0, "base_lr"}, {INFINITY, 1, "base_lr"}, {-0.1, 1, "base_lr"}};
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            kiln_test_clear_error(g_th);
            CU_ASSERT_EQUAL(ops->lr_at(s, bad[k].base, bad[k].step, 0, 1.0, &lr), KILN_E_INVALID_ARG);
            CU_ASSERT_EQUAL(kiln_test_error_code(g_th), KILN_E_INVALID_ARG);
            CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), bad[k].needle));
            CU_ASSERT_EQUAL(lr, 123.0); /* untouched */
        }
        CU_ASSERT_EQUAL(ops->lr_at(s, 0.1, 0, 0, 1.0, NULL), KILN_E_INVALID_ARG);
        /* a base rate of 0 is a valid (if idle) schedule */
        CU_ASSERT_EQUAL(ops->lr_at(s, 0.0, 0, 0, NAN, &lr), KILN_OK);
        CU_ASSERT_EQUAL(lr, 0.0);
        ops->base.destroy(s);
    }
}

/* ---------------------------------------------------------------------------
 * Bad configs */

typedef struct bad_cfg {
    const char *plugin;
    kiln_kv over[2];
    const char *needle; /* what the message must name */
} bad_cfg;

static void test_bad_configs(void) {
    kiln_test_reset(g_th);
    const bad_cfg cases[] = {
        {"constant", {{"factor", KILN_V_FLOAT(1.5)}, {NULL, KILN_V_NONE}}, "factor"},
        {"constant", {{"factor", KILN_V_FLOAT(-0.1)}, {NULL, KILN_V_NONE}}, "factor"},
        {"constant", {{"factor", KILN_V_FLOAT(NAN)}, {NULL, KILN_V_NONE}}, "factor"},
        {"constant", {{"total_iters", KILN_V_INT(-1)}, {NULL, KILN_V_NONE}}, "total_iters"},
        {"step", {{"step_size", KILN_V_INT(0)}, {NULL, KILN_V_NONE}}, "step_size"},
        {"step", {{"step_size", KILN_V_INT(-3)}, {NULL, KILN_V_NONE}}, "step_size"},
        {"step", {{"gamma", KILN_V_FLOAT(0.0)}, {NULL, KILN_V_NONE}}, "gamma"},
        {"step", {{"gamma", KILN_V_FLOAT(INFINITY)}, {NULL, KILN_V_NONE}}, "gamma"},
        {"cosine", {{"warmup_steps", KILN_V_INT(-1)}, {NULL, KILN_V_NONE}}, "warmup_steps"},
        {"cosine", {{"warmup_steps", KILN_V_INT(1000)}, {NULL, KILN_V_NONE}}, "t_max"},
        {"cosine", {{"t_max", KILN_V_INT(0)}, {NULL, KILN_V_NONE}}, "t_max"},
        {"cosine", {{"warmup_start_factor", KILN_V_FLOAT(1.5)}, {NULL, KILN_V_NONE}}, "warmup_start_factor"},
        {"cosine", {{"eta_min", KILN_V_FLOAT(-1e-3)}, {NULL, KILN_V_NONE}}, "eta_min"},
        {"plateau", {{"mode", KILN_V_STR("avg")}, {NULL, KILN_V_NONE}}, "mode"},
        {"plateau", {{"threshold_mode", KILN_V_STR("pct")}, {NULL, KILN_V_NONE}}, "threshold_mode"},
        {"plateau", {{"factor", KILN_V_FLOAT(1.0)}, {NULL, KILN_V_NONE}}, "factor"},
        {"plateau", {{"factor", KILN_V_FLOAT(-0.5)}, {NULL, KILN_V_NONE}}, "factor"},
        {"plateau", {{"patience", KILN_V_INT(-1)}, {NULL, KILN_V_NONE}}, "patience"},
        {"plateau", {{"threshold", KILN_V_FLOAT(-1e-4)}, {NULL, KILN_V_NONE}}, "threshold"},
        {"plateau", {{"cooldown", KILN_V_INT(-2)}, {NULL, KILN_V_NONE}}, "cooldown"},
        {"plateau", {{"min_lr", KILN_V_FLOAT(-1.0)}, {NULL, KILN_V_NONE}}, "min_lr"},
        {"plateau", {{"eps", KILN_V_FLOAT(-1e-8)}, {NULL, KILN_V_NONE}}, "eps"},
        {"plateau", {{"min_lr", KILN_V_FLOAT(NAN)}, {NULL, KILN_V_NONE}}, "min_lr"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const kiln_plugin_desc *d;
        const kiln_scheduler_ops *ops = sched_ops(cases[i].plugin, &d);
        kiln_kv cfg[MAX_CFG];
        make_cfg(d, cases[i].over, cfg);
        kiln_instance *inst = (kiln_instance *)g_th; /* must be reset to NULL */
        kiln_test_clear_error(g_th);
        kiln_test_clear_error(g_th);
        int32_t rc = ops->base.create(d->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &inst);
        if (rc != KILN_E_CONFIG || !strstr(kiln_test_error(g_th), cases[i].needle))
            fprintf(stderr, "\ncase %zu (%s %s): rc %d, error \"%s\"\n", i, cases[i].plugin, cases[i].over[0].key,
                    (int)rc, kiln_test_error(g_th));
        CU_ASSERT_EQUAL(rc, KILN_E_CONFIG);
        CU_ASSERT_PTR_NULL(inst);
        CU_ASSERT_EQUAL(kiln_test_error_code(g_th), KILN_E_CONFIG);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), cases[i].needle));
        if (rc == KILN_OK && inst) ops->base.destroy(inst);
    }
    /* the message says what was found */
    const kiln_plugin_desc *d;
    const kiln_scheduler_ops *ops = sched_ops("plateau", &d);
    kiln_kv cfg[MAX_CFG];
    const kiln_kv over[] = {{"mode", KILN_V_STR("maximum")}, {NULL, KILN_V_NONE}};
    make_cfg(d, over, cfg);
    kiln_instance *inst = NULL;
    CU_ASSERT_EQUAL(ops->base.create(NULL, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "\"maximum\""));
}

/* ---------------------------------------------------------------------------
 * ReduceLROnPlateau */

/* Step 0 (metric ignored), then one step per metric; the rates after
 * steps 1..n must equal want[0..n-1] (within a rounding). */
static void plateau_expect(const char *label, const kiln_kv *over, double base, const double *metrics,
                           const double *want, int n) {
    kiln_instance *s = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", s, base, 0, metrics[0]), base);
    for (int k = 0; k < n; k++) {
        double got = lr_at("plateau", s, base, k + 1, metrics[k]);
        if (!close_to(got, want[k], 1e-14))
            fprintf(stderr, "\nplateau %s, step %d (metric %g): got %.17g, want %.17g\n", label, k + 1, metrics[k],
                    got, want[k]);
        CU_ASSERT(close_to(got, want[k], 1e-14));
    }
    sched_free("plateau", s);
}

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void test_plateau_patience(void) {
    kiln_test_reset(g_th);
    /* improve, improve, then flat: patience 2 tolerates two bad steps and
     * reduces on the third; the counter restarts after a reduction */
    const kiln_kv over[] = {{"patience", KILN_V_INT(2)}, {"factor", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    const double m[] = {10, 9, 9, 9, 9, 9, 9, 9, 8, 8};
    const double want[] = {1, 1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25};
    plateau_expect("patience", over, 1.0, m, want, N_OF(m));

    /* the default patience (10): ten bad steps are tolerated, the 11th is not */
    const kiln_kv dflt[] = {{NULL, KILN_V_NONE}};
    double m2[13], w2[13];
    for (int k = 0; k < 13; k++) {
        m2[k] = 3.0;
        w2[k] = k < 11 ? 0.2 : 0.2 * 0.1;
    }
    plateau_expect("default patience", dflt, 0.2, m2, w2, 13);
}

static void test_plateau_cooldown(void) {
    kiln_test_reset(g_th);
    /* patience 0, cooldown 2: a reduction, then two steps whose badness is
     * forgotten, then a reduction on the next bad step */
    const kiln_kv over[] = {{"patience", KILN_V_INT(0)},
                            {"cooldown", KILN_V_INT(2)},
                            {"factor", KILN_V_FLOAT(0.5)},
                            {NULL, KILN_V_NONE}};
    const double m[] = {5, 5, 5, 5, 5, 5, 5, 5};
    const double want[] = {1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125};
    plateau_expect("cooldown", over, 1.0, m, want, N_OF(m));

    /* without cooldown every bad step reduces */
    const kiln_kv nocd[] = {{"patience", KILN_V_INT(0)}, {"factor", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    const double want0[] = {1, 0.5, 0.25, 0.125};
    plateau_expect("no cooldown", nocd, 1.0, m, want0, N_OF(want0));
}

static void test_plateau_min_lr_eps(void) {
    kiln_test_reset(g_th);
    /* the rate stops at min_lr */
    const kiln_kv over[] = {{"patience", KILN_V_INT(0)}, {"min_lr", KILN_V_FLOAT(0.05)}, {NULL, KILN_V_NONE}};
    const double m[] = {1, 1, 1, 1, 1};
    const double want[] = {1, 0.1, 0.05, 0.05, 0.05};
    plateau_expect("min_lr", over, 1.0, m, want, N_OF(m));

    /* a reduction smaller than eps is skipped: 1e-8 -> 5e-9 changes by
     * 5e-9 < eps = 1e-8 (the default), but happens with eps = 0 */
    const kiln_kv tiny[] = {{"patience", KILN_V_INT(0)}, {"factor", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    const double wt[] = {1e-8, 1e-8, 1e-8};
    plateau_expect("eps", tiny, 1e-8, m, wt, N_OF(wt));
    const kiln_kv tiny0[] = {{"patience", KILN_V_INT(0)},
                             {"factor", KILN_V_FLOAT(0.5)},
                             {"eps", KILN_V_FLOAT(0.0)},
                             {NULL, KILN_V_NONE}};
    const double wt0[] = {1e-8, 5e-9, 2.5e-9};
    plateau_expect("eps 0", tiny0, 1e-8, m, wt0, N_OF(wt0));
}

static void test_plateau_thresholds(void) {
    kiln_test_reset(g_th);
    /* 10 -> 9.5: rel 0.1 asks for < 9.0 (bad); abs 0.1 asks for < 9.9 (better) */
    const double m[] = {10, 9.5, 8.0, 7.95};
    const kiln_kv rel[] = {{"patience", KILN_V_INT(0)},
                           {"factor", KILN_V_FLOAT(0.5)},
                           {"threshold", KILN_V_FLOAT(0.1)},
                           {NULL, KILN_V_NONE}};
    const double want_rel[] = {1, 0.5, 0.5, 0.25};
    plateau_expect("rel", rel, 1.0, m, want_rel, N_OF(m));
    const kiln_kv abs_[] = {{"patience", KILN_V_INT(0)},
                            {"factor", KILN_V_FLOAT(0.5)},
                            {"threshold", KILN_V_FLOAT(0.1)},
                            {"threshold_mode", KILN_V_STR("abs")},
                            {NULL, KILN_V_NONE}};
    /* 7.95 is not below 8.0 - 0.1 */
    const double want_abs[] = {1, 1, 1, 0.5};
    plateau_expect("abs", abs_, 1.0, m, want_abs, N_OF(m));

    /* the default relative threshold 1e-4: 9.9995 is not below 10 * 0.9999 */
    const kiln_kv dflt[] = {{"patience", KILN_V_INT(0)}, {NULL, KILN_V_NONE}};
    const double mt[] = {10, 9.9995, 9.998};
    const double wt[] = {1, 0.1, 0.1};
    plateau_expect("default threshold", dflt, 1.0, mt, wt, N_OF(mt));
}

static void test_plateau_max_mode(void) {
    kiln_test_reset(g_th);
    const double m[] = {0.5, 0.6, 0.6, 0.7};
    const kiln_kv max_rel[] = {{"mode", KILN_V_STR("max")},
                               {"patience", KILN_V_INT(0)},
                               {"factor", KILN_V_FLOAT(0.5)},
                               {NULL, KILN_V_NONE}};
    const double want_max[] = {1, 1, 0.5, 0.5};
    plateau_expect("max rel", max_rel, 1.0, m, want_max, N_OF(m));
    /* the same rising metric is a failure in min mode */
    const kiln_kv min_rel[] = {{"patience", KILN_V_INT(0)}, {"factor", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    const double want_min[] = {1, 0.5, 0.25, 0.125};
    plateau_expect("min rel", min_rel, 1.0, m, want_min, N_OF(m));
    /* max with an absolute threshold of 0.15: 0.6 is not above 0.65, 0.7 is */
    const kiln_kv max_abs[] = {{"mode", KILN_V_STR("max")},
                               {"patience", KILN_V_INT(0)},
                               {"factor", KILN_V_FLOAT(0.5)},
                               {"threshold", KILN_V_FLOAT(0.15)},
                               {"threshold_mode", KILN_V_STR("abs")},
                               {NULL, KILN_V_NONE}};
    const double want_abs[] = {1, 0.5, 0.25, 0.25};
    plateau_expect("max abs", max_abs, 1.0, m, want_abs, N_OF(m));
}

static void test_plateau_missing_metric(void) {
    kiln_test_reset(g_th);
    /* NaN: no metric; the rate stays and nothing is counted. Counted, the
     * two NaNs would have reduced the rate at step 3. */
    const kiln_kv over[] = {{"patience", KILN_V_INT(1)}, {"factor", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    const double m[] = {1, NAN, NAN, 1, 1, NAN};
    const double want[] = {1, 1, 1, 1, 0.5, 0.5};
    plateau_expect("nan", over, 1.0, m, want, N_OF(m));

    /* one warning however many steps lack the metric */
    const kiln_host_services *svc = counting_services();
    kiln_instance *s = sched_new("plateau", over, svc);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 0.3, 0, NAN), 0.3);
    for (int64_t k = 1; k <= 30; k++) CU_ASSERT_EQUAL(lr_at("plateau", s, 0.3, k, NAN), 0.3);
    CU_ASSERT_EQUAL(g_warnings, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_last_warning, "metric"));
    sched_free("plateau", s);

    /* step 0 is construction: its metric is not read. Were 0.001 the best,
     * 10 at step 1 would be a bad step and (patience 0) reduce at once. */
    const kiln_kv p0[] = {{"patience", KILN_V_INT(0)}, {"factor", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    s = sched_new("plateau", p0, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 1.0, 0, 0.001), 1.0);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 1.0, 1, 10.0), 1.0);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 1.0, 2, 10.0), 0.5);
    sched_free("plateau", s);
}

static void test_plateau_order(void) {
    kiln_test_reset(g_th);
    const kiln_kv p0[] = {{"patience", KILN_V_INT(0)}, {"factor", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    kiln_instance *s = sched_new("plateau", p0, NULL);
    const kiln_scheduler_ops *ops = sched_ops("plateau", NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 1.0, 0, NAN), 1.0);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 1.0, 1, 1.0), 1.0);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 1.0, 2, 1.0), 0.5);
    /* the same step again: the current rate, the bad metric not counted */
    CU_ASSERT_EQUAL(lr_at("plateau", s, 1.0, 2, 1.0), 0.5);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 1.0, 3, 1.0), 0.25);
    /* the rate is the schedule's own: a different base_lr later does not reset it */
    CU_ASSERT_EQUAL(lr_at("plateau", s, 7.0, 4, 0.5), 0.25);
    /* going back is refused, and changes nothing */
    double lr = -1;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops->lr_at(s, 1.0, 1, 0, 1.0, &lr), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "order"));
    CU_ASSERT_EQUAL(lr_at("plateau", s, 1.0, 5, 0.5), 0.125);
    /* step 0 constructs afresh */
    CU_ASSERT_EQUAL(lr_at("plateau", s, 2.0, 0, NAN), 2.0);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 2.0, 1, 100.0), 2.0);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 2.0, 2, 100.0), 1.0);
    sched_free("plateau", s);

    /* a host that never asks for step 0 starts from base_lr */
    s = sched_new("plateau", p0, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 0.4, 1, 3.0), 0.4);
    CU_ASSERT_EQUAL(lr_at("plateau", s, 0.4, 2, 3.0), 0.2);
    sched_free("plateau", s);
}

/* An uninterrupted run against one checkpointed after `split` steps and
 * restored into a fresh instance: identical rates at every later step. */
static void plateau_roundtrip(const kiln_kv *over, double base, const double *m, int n, int split) {
    const kiln_scheduler_ops *ops = sched_ops("plateau", NULL);
    kiln_instance *a = sched_new("plateau", over, NULL), *b = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", a, base, 0, NAN), base);
    CU_ASSERT_EQUAL(lr_at("plateau", b, base, 0, NAN), base);
    for (int k = 1; k <= split; k++) CU_ASSERT_EQUAL(lr_at("plateau", a, base, k, m[k - 1]),
                                                     lr_at("plateau", b, base, k, m[k - 1]));
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(ops->base.get_state(b, &ver, &blob, &size), KILN_OK);
    sched_free("plateau", b);
    kiln_instance *c = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", c, base, 0, NAN), base);
    CU_ASSERT_EQUAL_FATAL(ops->base.set_state(c, ver, blob, size), KILN_OK);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    for (int k = split + 1; k <= n; k++) {
        double la = lr_at("plateau", a, base, k, m[k - 1]), lc = lr_at("plateau", c, base, k, m[k - 1]);
        if (la != lc) fprintf(stderr, "\nround trip split %d, step %d: %.17g vs %.17g\n", split, k, la, lc);
        CU_ASSERT_EQUAL(la, lc);
    }
    sched_free("plateau", a);
    sched_free("plateau", c);
}

/* get_state -> set_state into a fresh instance mid-sequence: both continue
 * exactly like an uninterrupted run; refused blobs change nothing. */
static void test_plateau_state(void) {
    kiln_test_reset(g_th);
    const kiln_scheduler_ops *ops = sched_ops("plateau", NULL);
    const kiln_kv over[] = {{"patience", KILN_V_INT(2)},
                            {"cooldown", KILN_V_INT(1)},
                            {"factor", KILN_V_FLOAT(0.5)},
                            {"min_lr", KILN_V_FLOAT(0.01)},
                            {NULL, KILN_V_NONE}};
    /* split after step 8: two bad steps counted (4, 4 after 3.9), in the
     * middle of a streak, so the counters matter for the continuation */
    const double m[] = {5, 4, 4, 4, 4, 3.9, 4, 4, 4, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2};
    const int n = N_OF(m), split = 8;
    const double base = 0.8;
    double ref[32];
    kiln_instance *a = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", a, base, 0, NAN), base);
    for (int k = 1; k <= n; k++) ref[k] = lr_at("plateau", a, base, k, m[k - 1]);
    sched_free("plateau", a);
    /* the reference sequence itself reduces more than once */
    CU_ASSERT(ref[n] < base * 0.25);

    kiln_instance *b = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", b, base, 0, NAN), base);
    for (int k = 1; k <= split; k++) CU_ASSERT_EQUAL(lr_at("plateau", b, base, k, m[k - 1]), ref[k]);
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(ops->base.get_state(b, &ver, &blob, &size), KILN_OK);
    CU_ASSERT_EQUAL(ver, 1u);
    CU_ASSERT_PTR_NOT_NULL_FATAL(blob);
    CU_ASSERT(size > 0);

    kiln_instance *c = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", c, base, 0, NAN), base); /* the host constructs, then restores */
    /* refusals first: each leaves c as constructed */
    unsigned char *bad = malloc(size + 8);
    CU_ASSERT_PTR_NOT_NULL_FATAL(bad);
    CU_ASSERT_EQUAL(ops->base.set_state(c, ver + 1, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "version"));
    CU_ASSERT_EQUAL(ops->base.set_state(c, ver, blob, size - 1), KILN_E_STATE);
    memcpy(bad, blob, size);
    memset(bad + size, 0, 8);
    CU_ASSERT_EQUAL(ops->base.set_state(c, ver, bad, size + 8), KILN_E_STATE);
    CU_ASSERT_EQUAL(ops->base.set_state(c, ver, NULL, size), KILN_E_STATE);
    bad[0] ^= 0x20;
    CU_ASSERT_EQUAL(ops->base.set_state(c, ver, bad, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "magic"));
    /* a negative counter (int64 after the 8-byte magic and two uint32) */
    memcpy(bad, blob, size);
    int64_t neg = -5;
    memcpy(bad + 8 + 4 + 4 + 8, &neg, sizeof neg);
    CU_ASSERT_EQUAL(ops->base.set_state(c, ver, bad, size), KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "corrupt"));
    /* a min-mode state is not a max-mode one */
    const kiln_kv max_over[] = {{"mode", KILN_V_STR("max")}, {NULL, KILN_V_NONE}};
    kiln_instance *mx = sched_new("plateau", max_over, NULL);
    CU_ASSERT_EQUAL(ops->base.set_state(mx, ver, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "mode"));
    sched_free("plateau", mx);
    free(bad);

    CU_ASSERT_EQUAL_FATAL(ops->base.set_state(c, ver, blob, size), KILN_OK);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    /* both continue as the reference; a repeat of the split step (the host
     * re-applying the rate after the restore) reads no metric */
    CU_ASSERT_EQUAL(lr_at("plateau", c, base, split, 1e9), ref[split]);
    for (int k = split + 1; k <= n; k++) {
        double lb = lr_at("plateau", b, base, k, m[k - 1]);
        double lc = lr_at("plateau", c, base, k, m[k - 1]);
        if (lb != ref[k] || lc != ref[k])
            fprintf(stderr, "\nstate continuation step %d: ref %.17g, original %.17g, restored %.17g\n", k, ref[k], lb,
                    lc);
        CU_ASSERT_EQUAL(lb, ref[k]);
        CU_ASSERT_EQUAL(lc, ref[k]);
    }
    sched_free("plateau", b);

    /* the restored counters matter: a fresh schedule started at the split
     * rate does not continue like the reference */
    kiln_instance *f = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", f, ref[split], 0, NAN), ref[split]);
    int differs = 0;
    for (int k = split + 1; k <= n; k++) differs |= lr_at("plateau", f, ref[split], k - split, m[k - 1]) != ref[k];
    CU_ASSERT(differs);
    sched_free("plateau", f);

    /* a state taken before any step restores to "not started" */
    kiln_instance *g = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL_FATAL(ops->base.get_state(g, &ver, &blob, &size), KILN_OK);
    CU_ASSERT_EQUAL(ops->base.set_state(c, ver, blob, size), KILN_OK);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    CU_ASSERT_EQUAL(lr_at("plateau", c, 0.3, 1, 2.0), 0.3);
    sched_free("plateau", g);
    sched_free("plateau", c);

    /* every split point of a sequence with cooldowns, improvements, a
     * missing metric and the min_lr floor: the restored cooldown counter,
     * bad-step counter, best value and rate all decide later steps */
    const kiln_kv cd[] = {{"patience", KILN_V_INT(1)},
                          {"cooldown", KILN_V_INT(2)},
                          {"factor", KILN_V_FLOAT(0.5)},
                          {"min_lr", KILN_V_FLOAT(0.04)},
                          {NULL, KILN_V_NONE}};
    const double m2[] = {5, 5, 5, 5, 5, 4, 4, NAN, 4, 4, 4, 4, 3, 3, 3, 3, 3, 3, 3, 3};
    for (int sp = 1; sp < N_OF(m2); sp++) plateau_roundtrip(cd, 1.0, m2, N_OF(m2), sp);
    const kiln_kv mxo[] = {{"mode", KILN_V_STR("max")},
                          {"patience", KILN_V_INT(0)},
                          {"cooldown", KILN_V_INT(1)},
                          {"threshold_mode", KILN_V_STR("abs")},
                          {"threshold", KILN_V_FLOAT(0.01)},
                          {NULL, KILN_V_NONE}};
    const double m3[] = {0.1, 0.2, 0.2, 0.205, 0.3, 0.3, 0.3, 0.31, 0.4, 0.4};
    for (int sp = 1; sp < N_OF(m3); sp++) plateau_roundtrip(mxo, 0.5, m3, N_OF(m3), sp);
}

/* ---------------------------------------------------------------------------
 * lr_monitor */

static const kiln_callback_ops *lrm_ops(const kiln_plugin_desc **desc) {
    const kiln_plugin_desc *d = load_desc("lr_monitor", KILN_KIND_CALLBACK, "lr_monitor");
    const kiln_callback_ops *ops = d->ops;
    CU_ASSERT_FATAL(ops->base.struct_size >= KILN_CALLBACK_OPS_SIZE_1_1 && ops->on_event);
    if (desc) *desc = d;
    return ops;
}

static kiln_instance *lrm_new(const char *interval, const kiln_host_services *svc) {
    const kiln_plugin_desc *d;
    const kiln_callback_ops *ops = lrm_ops(&d);
    kiln_kv cfg[MAX_CFG];
    const kiln_kv over[] = {{"logging_interval", KILN_V_STR(interval)}, {NULL, KILN_V_NONE}};
    make_cfg(d, interval ? over : NULL, cfg);
    kiln_instance *inst = NULL;
    CU_ASSERT_EQUAL_FATAL(ops->base.create(d->plugin_ctx, svc ? svc : kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &inst), KILN_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    return inst;
}

/* Trainer state of a fit with `n` optimizers at rates `lr`. */
static kiln_trainer_state g_ts;
static void trainer_with(uint32_t n, const double *lr) {
    memset(&g_ts, 0, sizeof g_ts);
    g_ts.struct_size = sizeof g_ts;
    g_ts.stage = KILN_STAGE_FIT;
    g_ts.world_size = 1;
    g_ts.accumulate_grad_batches = 1;
    g_ts.automatic_optimization = 1;
    g_ts.num_optimizers = n;
    g_ts.lr = lr;
    (*kiln_test_trainer(g_th)) = g_ts;
}

/* Send one event; returns how many values it logged. */
static int lrm_send(kiln_instance *inst, uint32_t id, int32_t stage) {
    kiln_event e = fixture_event(id, stage, -1, &g_ts);
    const int before = (int)kiln_test_logged_count(g_th);
    CU_ASSERT_EQUAL(lrm_ops(NULL)->on_event(inst, &e), KILN_OK);
    return (int)kiln_test_logged_count(g_th) - before;
}

static void assert_logged(int idx, const char *name, double value, uint32_t flags) {
    CU_ASSERT_FATAL(idx < (int)kiln_test_logged_count(g_th));
    CU_ASSERT_STRING_EQUAL(kiln_test_logged(g_th, idx)->name, name);
    CU_ASSERT_EQUAL(kiln_test_logged(g_th, idx)->value, value);
    CU_ASSERT_EQUAL(kiln_test_logged(g_th, idx)->flags, flags);
    CU_ASSERT_EQUAL(kiln_test_logged(g_th, idx)->weight, 1.0);
}

/* Every event other than the one the interval logs at. */
static int lrm_send_all_but(kiln_instance *inst, uint32_t keep) {
    int n = 0;
    for (uint32_t id = KILN_EV_SETUP; id <= KILN_EV_TRACE; id++)
        if (id != keep) n += lrm_send(inst, id, KILN_STAGE_FIT);
    return n;
}

static void test_lr_monitor_step(void) {
    kiln_test_reset(g_th);
    double lr[1] = {0.05};
    trainer_with(1, lr);
    kiln_instance *m = lrm_new(NULL, NULL); /* the default: "step" */
    CU_ASSERT_EQUAL(lrm_send_all_but(m, KILN_EV_ON_TRAIN_BATCH_START), 0);
    CU_ASSERT_EQUAL(lrm_send(m, KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_FIT), 1);
    assert_logged(0, "lr", 0.05, KILN_LOG_ON_STEP);
    lr[0] = 0.025; /* the scheduler moved it: the next batch reports the new rate */
    CU_ASSERT_EQUAL(lrm_send(m, KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_FIT), 1);
    assert_logged(1, "lr", 0.025, KILN_LOG_ON_STEP);
    /* nothing while the sanity check runs */
    g_ts.sanity_checking = 1;
    CU_ASSERT_EQUAL(lrm_send(m, KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_SANITY), 0);
    CU_ASSERT_EQUAL(lrm_send(m, KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_FIT), 0);
    g_ts.sanity_checking = 0;
    CU_ASSERT_EQUAL(lrm_send(m, KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_SANITY), 0);
    lrm_ops(NULL)->base.destroy(m);
}

static void test_lr_monitor_epoch_and_many(void) {
    kiln_test_reset(g_th);
    double lr[3] = {0.1, 0.02, 0.003};
    trainer_with(3, lr);
    kiln_instance *m = lrm_new("epoch", NULL);
    CU_ASSERT_EQUAL(lrm_send_all_but(m, KILN_EV_ON_TRAIN_EPOCH_START), 0);
    CU_ASSERT_EQUAL(lrm_send(m, KILN_EV_ON_TRAIN_EPOCH_START, KILN_STAGE_FIT), 3);
    assert_logged(0, "lr-0", 0.1, KILN_LOG_ON_EPOCH);
    assert_logged(1, "lr-1", 0.02, KILN_LOG_ON_EPOCH);
    assert_logged(2, "lr-2", 0.003, KILN_LOG_ON_EPOCH);
    CU_ASSERT(isnan(kiln_test_last_value(g_th, "lr"))); /* no plain "lr" with several optimizers */
    lrm_ops(NULL)->base.destroy(m);

    /* two optimizers, per step */
    kiln_test_clear_logged(g_th);
    trainer_with(2, lr);
    m = lrm_new("step", NULL);
    CU_ASSERT_EQUAL(lrm_send(m, KILN_EV_ON_TRAIN_EPOCH_START, KILN_STAGE_FIT), 0);
    CU_ASSERT_EQUAL(lrm_send(m, KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_FIT), 2);
    assert_logged(0, "lr-0", 0.1, KILN_LOG_ON_STEP);
    assert_logged(1, "lr-1", 0.02, KILN_LOG_ON_STEP);
    lrm_ops(NULL)->base.destroy(m);

    /* an event without a trainer pointer: the trainer_state service */
    kiln_test_clear_logged(g_th);
    trainer_with(1, lr);
    m = lrm_new("step", NULL);
    kiln_event e;
    memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
    e.id = KILN_EV_ON_TRAIN_BATCH_START;
    e.stage = KILN_STAGE_FIT;
    CU_ASSERT_EQUAL(lrm_ops(NULL)->on_event(m, &e), KILN_OK);
    CU_ASSERT_EQUAL((int)kiln_test_logged_count(g_th), 1);
    assert_logged(0, "lr", 0.1, KILN_LOG_ON_STEP);
    lrm_ops(NULL)->base.destroy(m);
}

static void test_lr_monitor_old_host(void) {
    kiln_test_reset(g_th);
    double lr[1] = {0.05};
    trainer_with(1, lr);
    /* a 1.1 trainer state ends before `precision` */
    g_ts.struct_size = (uint32_t)offsetof(kiln_trainer_state, precision);
    const kiln_host_services *svc = counting_services();
    kiln_instance *m = lrm_new("step", svc);
    for (int k = 0; k < 5; k++) CU_ASSERT_EQUAL(lrm_send(m, KILN_EV_ON_TRAIN_BATCH_START, KILN_STAGE_FIT), 0);
    CU_ASSERT_EQUAL(g_warnings, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_last_warning, "1.2"));
    lrm_ops(NULL)->base.destroy(m);

    /* a 1.2 state that lists no rates: one warning too */
    trainer_with(0, NULL);
    svc = counting_services();
    m = lrm_new("epoch", svc);
    for (int k = 0; k < 3; k++) CU_ASSERT_EQUAL(lrm_send(m, KILN_EV_ON_TRAIN_EPOCH_START, KILN_STAGE_FIT), 0);
    CU_ASSERT_EQUAL(g_warnings, 1);
    CU_ASSERT_EQUAL((int)kiln_test_logged_count(g_th), 0);
    lrm_ops(NULL)->base.destroy(m);
}

static void test_lr_monitor_config(void) {
    kiln_test_reset(g_th);
    const kiln_plugin_desc *d;
    const kiln_callback_ops *ops = lrm_ops(&d);
    CU_ASSERT_EQUAL(d->kind, KILN_KIND_CALLBACK);
    kiln_kv cfg[MAX_CFG];
    make_cfg(d, NULL, cfg);
    CU_ASSERT_STRING_EQUAL(kiln_kv_str(cfg, "logging_interval", ""), "step");
    const kiln_kv over[] = {{"logging_interval", KILN_V_STR("batch")}, {NULL, KILN_V_NONE}};
    make_cfg(d, over, cfg);
    kiln_instance *inst = (kiln_instance *)g_th;
    CU_ASSERT_EQUAL(ops->base.create(d->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(inst);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "logging_interval"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "\"batch\""));
}

/* ---------------------------------------------------------------------------
 * Registration */

/* Counters and rates out of range are refused with KILN_E_DATA in one
 * line naming the value, and leave the schedule as it was: a bad-step
 * count at INT64_MAX overflows on the next bad step, a huge cooldown
 * counter stops every reduction; the counters cannot exceed the steps
 * taken. The blob they were cut from still restores and continues. */
static void test_plateau_state_bounds(void) {
    kiln_test_reset(g_th);
    const kiln_scheduler_ops *ops = sched_ops("plateau", NULL);
    const kiln_kv over[] = {{"patience", KILN_V_INT(1)}, {"factor", KILN_V_FLOAT(0.5)}, {NULL, KILN_V_NONE}};
    const double m[] = {5, 4, 4, 4, 3, 3, 3, 3};
    kiln_instance *a = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", a, 1.0, 0, NAN), 1.0);
    for (int k = 1; k <= 3; k++) lr_at("plateau", a, 1.0, k, m[k - 1]); /* one bad step after 4 */
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(ops->base.get_state(a, &ver, &blob, &size), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(size, 56u); /* magic, two uint32, three int64, two doubles */
    unsigned char *bad = malloc(size);
    CU_ASSERT_PTR_NOT_NULL_FATAL(bad);
    kiln_instance *c = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", c, 1.0, 0, NAN), 1.0);
    enum { MODE = 8, INIT = 12, LAST = 16, BAD = 24, COOL = 32, BEST = 40, LR = 48 };
    const struct {
        int off;
        int64_t i; /* for the integer fields */
        double d;  /* for BEST and LR */
        const char *needle;
    } cases[] = {
        {BAD, INT64_MAX, 0, "num_bad_epochs: expected 0 <= value < 2^53, found 9223372036854775807"},
        {COOL, (int64_t)1 << 53, 0, "cooldown_counter: expected 0 <= value < 2^53, found 9007199254740992"},
        {COOL, -1, 0, "cooldown_counter: expected 0 <= value < 2^53, found -1"},
        {LAST, INT64_MAX, 0, "last_step: expected -1 <= value < 2^53, found 9223372036854775807"},
        {LAST, -2, 0, "last_step: expected -1 <= value < 2^53, found -2"},
        {BAD, 4, 0, "num_bad_epochs: expected <= last_step (3), found 4"},
        {INIT, 0, 0, "not started yet: expected last_step -1 and no counts, found last_step 3"},
        {LAST, -1, 0, "last_step of a started schedule: expected >= 0, found -1"},
        {MODE, 2, 0, "expected mode and initialised flags 0 or 1, found 2 and 1"},
        {BEST, 0, NAN, "found best nan, lr 1"},
        {LR, 0, INFINITY, "a finite lr >= 0, found best 4, lr inf"},
        {LR, 0, -0.25, "found best 4, lr -0.25"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(bad, blob, size);
        if (cases[i].off == MODE || cases[i].off == INIT) {
            uint32_t u = (uint32_t)cases[i].i;
            memcpy(bad + cases[i].off, &u, sizeof u);
        } else if (cases[i].off == BEST || cases[i].off == LR) {
            memcpy(bad + cases[i].off, &cases[i].d, sizeof(double));
        } else {
            memcpy(bad + cases[i].off, &cases[i].i, sizeof(int64_t));
        }
        kiln_test_clear_error(g_th);
        CU_ASSERT_EQUAL(ops->base.set_state(c, ver, bad, size), KILN_E_DATA);
        if (!strstr(kiln_test_error(g_th), cases[i].needle)) fprintf(stderr, "\ncase %zu: %s\n", i, kiln_test_error(g_th));
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), cases[i].needle));
        CU_ASSERT_PTR_NULL(strchr(kiln_test_error(g_th), '\n'));
    }
    /* nothing changed: c is still the fresh schedule of step 0 */
    kiln_instance *f = sched_new("plateau", over, NULL);
    CU_ASSERT_EQUAL(lr_at("plateau", f, 1.0, 0, NAN), 1.0);
    void *fb = NULL, *cb = NULL;
    size_t fs = 0, cs = 0;
    CU_ASSERT_EQUAL_FATAL(ops->base.get_state(f, &ver, &fb, &fs), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(ops->base.get_state(c, &ver, &cb, &cs), KILN_OK);
    CU_ASSERT_TRUE(fs == cs && memcmp(fb, cb, fs) == 0);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), fb);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), cb);
    sched_free("plateau", f);
    /* the good blob restores, and both continue alike */
    CU_ASSERT_EQUAL_FATAL(ops->base.set_state(c, ver, blob, size), KILN_OK);
    for (int k = 4; k <= N_OF(m); k++)
        CU_ASSERT_EQUAL(lr_at("plateau", c, 1.0, k, m[k - 1]), lr_at("plateau", a, 1.0, k, m[k - 1]));
    CU_ASSERT(lr_at("plateau", c, 1.0, N_OF(m), NAN) < 1.0); /* it did reduce */
    free(bad);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    sched_free("plateau", c);
    sched_free("plateau", a);
}

static CU_TestInfo cases_schedulers[] = {
    {"descriptors and defaults", test_descriptors},
    {"constant (ConstantLR)", test_constant},
    {"step (StepLR)", test_step},
    {"cosine with warmup", test_cosine},
    {"lr_at argument checks", test_lr_at_arguments},
    {"bad configs refused", test_bad_configs},
    CU_TEST_INFO_NULL,
};

static CU_TestInfo cases_plateau[] = {
    {"improvement and patience", test_plateau_patience},
    {"cooldown", test_plateau_cooldown},
    {"min_lr and eps", test_plateau_min_lr_eps},
    {"rel and abs thresholds", test_plateau_thresholds},
    {"max mode", test_plateau_max_mode},
    {"missing metric and step 0", test_plateau_missing_metric},
    {"step order", test_plateau_order},
    {"state round trip", test_plateau_state},
    {"state values bounded; a bad blob refused", test_plateau_state_bounds},
    CU_TEST_INFO_NULL,
};

static CU_TestInfo cases_lr_monitor[] = {
    {"per step", test_lr_monitor_step},
    {"per epoch, several optimizers", test_lr_monitor_epoch_and_many},
    {"old host: one warning", test_lr_monitor_old_host},
    {"config", test_lr_monitor_config},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "schedulers", .pTests = cases_schedulers},
        {.pName = "plateau", .pTests = cases_plateau},
        {.pName = "lr_monitor", .pTests = cases_lr_monitor},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
