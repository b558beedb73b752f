/*
 * tests/plugins/manualmod.c — a test-only module that optimises manually
 * (automatic_optimization = false) with two parameter groups "a.w" (2) and
 * "b.w" (2) and the GAN pattern of the seed example: per batch, for each
 * optimizer i in 0..n-1: toggle_optimizer(i), a loss that depends on BOTH
 * groups, manual_backward, a step of optimizer i every `every_<i>` batches
 * (then its zero_grad), untoggle. loss_0 = sum (a*b - 1)^2 and loss_1 =
 * sum (a + b - 3)^2, so without the toggle each backward would also write
 * the other group's gradient. It records, in `path`, per backward the other
 * group's gradient before and after ("g <batch> <opt> <before0> <before1>
 * <after0> <after1>"), each step's `skipped` flag ("s <batch> <opt> <flag>"),
 * and how often an optimizer called the closure it was given ("c <batch>
 * <opt> <calls>"). use_toggle = false, pass_closure = true and bad_call
 * (call a service outside training_step) steer the tests.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common_train.h"

struct mm {
    const kiln_host_services *svc;
    kiln_host_ctx *h;
    kiln_parameter *a, *b;
    int64_t every[2];
    int use_toggle, pass_closure, bad_call;
    int cur;         /* which loss manual_backward back-propagates */
    int closure_calls;
    FILE *f;
};

static int32_t mm_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)ctx;
    struct mm *m = calloc(1, sizeof *m);
    if (!m) return KILN_E_NOMEM;
    m->svc = svc;
    m->h = h;
    m->every[0] = kiln_kv_int(cfg, "every_0", 1);
    m->every[1] = kiln_kv_int(cfg, "every_1", 1);
    m->use_toggle = (int)kiln_kv_int(cfg, "use_toggle", 1);
    m->pass_closure = (int)kiln_kv_int(cfg, "pass_closure", 0);
    m->bad_call = (int)kiln_kv_int(cfg, "bad_call", 0);
    const char *path = kiln_kv_str(cfg, "path", "manual.txt");
    int64_t shape[1] = {2};
    int32_t rc = svc->param_register(h, "a.w", 1, shape, 0, &m->a);
    if (rc == KILN_OK) rc = svc->param_register(h, "b.w", 1, shape, 0, &m->b);
    if (rc == KILN_OK && !(m->f = fopen(path, "w"))) rc = kiln_errorf(svc, h, KILN_E_IO, "%s: cannot write", path);
    if (rc != KILN_OK) { free(m); return rc; }
    *out = (kiln_instance *)m;
    return KILN_OK;
}

static void mm_destroy(kiln_instance *i) {
    struct mm *m = (struct mm *)i;
    if (m->f) fclose(m->f);
    free(m);
}

static int32_t mm_init(kiln_instance *i, uint64_t seed) {
    struct mm *m = (struct mm *)i;
    (void)seed;
    const float a0[2] = {0.5f, 1.5f}, b0[2] = {2.0f, -1.0f};
    memcpy(m->a->data, a0, sizeof a0);
    memcpy(m->b->data, b0, sizeof b0);
    memset(m->a->grad, 0, sizeof a0);
    memset(m->b->grad, 0, sizeof b0);
    if (m->bad_call) { /* outside training_step: refused */
        int32_t rc = m->svc->manual_backward(m->h, 1.0);
        if (rc != KILN_E_STATE) return kiln_errorf(m->svc, m->h, KILN_E_INTERNAL, "manual_backward was not refused");
    }
    return KILN_OK;
}

static double mm_loss(const struct mm *m, int which) {
    double l = 0;
    for (int k = 0; k < 2; k++) {
        double a = m->a->data[k], b = m->b->data[k];
        double r = which == 0 ? a * b - 1 : a + b - 3;
        l += r * r;
    }
    return l;
}

/* d(loss_cur)/d(a, b) * dloss added to every grad that is not frozen */
static int32_t mm_backward(kiln_instance *i, double dloss) {
    struct mm *m = (struct mm *)i;
    for (int k = 0; k < 2; k++) {
        double a = m->a->data[k], b = m->b->data[k];
        double ga, gb;
        if (m->cur == 0) { ga = 2 * (a * b - 1) * b; gb = 2 * (a * b - 1) * a; }
        else { ga = 2 * (a + b - 3); gb = ga; }
        if (!(m->a->flags & KILN_PARAMF_FROZEN)) m->a->grad[k] += (float)(ga * dloss);
        if (!(m->b->flags & KILN_PARAMF_FROZEN)) m->b->grad[k] += (float)(gb * dloss);
    }
    return KILN_OK;
}

static int32_t mm_closure(void *ctx, double *loss) {
    struct mm *m = ctx;
    m->closure_calls++;
    *loss = mm_loss(m, m->cur);
    return KILN_OK;
}

static int32_t mm_step(kiln_instance *i, const kiln_batch *batch, int64_t bi, kiln_step_output *out) {
    struct mm *m = (struct mm *)i;
    const kiln_host_services *s = m->svc;
    uint32_t n = s->optimizer_count(m->h);
    double total = 0;
    for (uint32_t o = 0; o < n && o < 2; o++) {
        int32_t rc;
        if (m->use_toggle && (rc = s->toggle_optimizer(m->h, o))) return rc;
        kiln_parameter *other = o == 0 ? m->b : m->a;
        float before[2] = {other->grad[0], other->grad[1]};
        m->cur = (int)o;
        double l = mm_loss(m, (int)o);
        total += l;
        if ((rc = s->manual_backward(m->h, l))) return rc;
        fprintf(m->f, "g %lld %u %.9g %.9g %.9g %.9g\n", (long long)bi, o, before[0], before[1], other->grad[0],
                other->grad[1]);
        if ((bi + 1) % m->every[o] == 0) {
            kiln_closure c = {sizeof c, 0, m, mm_closure};
            int32_t skipped = -1;
            m->closure_calls = 0;
            if ((rc = s->optimizer_step(m->h, o, m->pass_closure ? &c : NULL, &skipped))) return rc;
            fprintf(m->f, "s %lld %u %d\n", (long long)bi, o, skipped);
            fprintf(m->f, "c %lld %u %d\n", (long long)bi, o, m->closure_calls);
            if ((rc = s->optimizer_zero_grad(m->h, o))) return rc;
        }
        if (m->use_toggle && (rc = s->untoggle_optimizer(m->h, o))) return rc;
    }
    if (s->optimizer_step(m->h, 7, NULL, NULL) != KILN_E_INVALID_ARG) /* a bad index is refused */
        return kiln_errorf(s, m->h, KILN_E_INTERNAL, "optimizer index 7 was not refused");
    fflush(m->f);
    out->struct_size = sizeof *out;
    out->has_loss = 1;
    out->loss = total;
    out->batch_size = batch->size;
    return KILN_OK;
}

static int32_t mm_eval(kiln_instance *i, const kiln_batch *batch, int64_t bi, kiln_step_output *out) {
    struct mm *m = (struct mm *)i;
    (void)bi;
    out->struct_size = sizeof *out;
    out->has_loss = 1;
    out->loss = mm_loss(m, 0) + mm_loss(m, 1);
    out->batch_size = batch->size;
    return KILN_OK;
}

static const kiln_module_ops mm_ops = {{sizeof(kiln_module_ops), 0, mm_create, mm_destroy, NULL, NULL},
                                       mm_init, mm_step, mm_backward, mm_eval, mm_eval, NULL, NULL};
static const kiln_param mm_params[] = {
    {"every_0", KILN_TYPE_INT, 0, KILN_V_INT(1), "optimizer 0 steps every N batches"},
    {"every_1", KILN_TYPE_INT, 0, KILN_V_INT(1), "optimizer 1 steps every N batches"},
    {"use_toggle", KILN_TYPE_INT, 0, KILN_V_INT(1), "toggle each optimizer around its backward"},
    {"pass_closure", KILN_TYPE_INT, 0, KILN_V_INT(0), "give optimizer_step a closure"},
    {"bad_call", KILN_TYPE_INT, 0, KILN_V_INT(0), "call manual_backward outside training_step"},
    {"path", KILN_TYPE_STRING, 0, KILN_V_STR("manual.txt"), "record file"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_kv mm_props[] = {{"automatic_optimization", KILN_V_BOOL(0)}, {NULL, KILN_V_NONE}};
static const kiln_plugin_desc mm_desc = {sizeof(kiln_plugin_desc), KILN_KIND_MODULE, "manualmod", "1.0.0",
                                         "manual optimisation with two parameter groups", 0, mm_props, mm_params,
                                         &mm_ops, NULL};
KILN_DEFINE_LIBRARY("manualmod", "1.0.0", 2, &mm_desc)
