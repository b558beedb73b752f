/*
 * tests/plugins/schedfix.c — a test-only scheduler: lr = base_lr / (1 +
 * step) and, for a monitored schedule, halved again when the metric is
 * above `threshold`. Every lr_at call is recorded in `path` as
 * "<step> <epoch> <metric>", so the tests see exactly when the host steps
 * it; its step count is its checkpoint state, checked on restore.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common_train.h"

struct sf { const kiln_host_services *svc; kiln_host_ctx *h; FILE *f; double threshold; int64_t calls; };

static int32_t sf_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)ctx;
    struct sf *s = calloc(1, sizeof *s);
    if (!s) return KILN_E_NOMEM;
    s->svc = svc;
    s->h = h;
    s->threshold = kiln_kv_float(cfg, "threshold", INFINITY);
    const char *path = kiln_kv_str(cfg, "path", "sched.txt");
    if (!(s->f = fopen(path, "a"))) { free(s); return kiln_errorf(svc, h, KILN_E_IO, "%s: cannot write", path); }
    *out = (kiln_instance *)s;
    return KILN_OK;
}
static void sf_destroy(kiln_instance *i) { struct sf *s = (struct sf *)i; fclose(s->f); free(s); }
static int32_t sf_lr_at(kiln_instance *i, double base, int64_t step, int64_t epoch, double metric, double *lr) {
    struct sf *s = (struct sf *)i;
    fprintf(s->f, "%lld %lld %.9g\n", (long long)step, (long long)epoch, metric);
    fflush(s->f);
    s->calls++;
    *lr = base / (1.0 + (double)step) * (metric > s->threshold ? 0.5 : 1.0);
    return KILN_OK;
}
static int32_t sf_get_state(kiln_instance *i, uint32_t *ver, void **data, size_t *size) {
    struct sf *s = (struct sf *)i;
    int64_t *p = s->svc->alloc(s->h, sizeof *p, 8);
    if (!p) return KILN_E_NOMEM;
    *p = s->calls;
    *ver = 1;
    *data = p;
    *size = sizeof *p;
    return KILN_OK;
}
static int32_t sf_set_state(kiln_instance *i, uint32_t ver, const void *data, size_t size) {
    struct sf *s = (struct sf *)i;
    if (ver != 1 || size != sizeof(int64_t)) return kiln_errorf(s->svc, s->h, KILN_E_STATE, "bad schedfix state");
    memcpy(&s->calls, data, sizeof s->calls);
    fprintf(s->f, "restored %lld\n", (long long)s->calls);
    return KILN_OK;
}
static const kiln_scheduler_ops sf_ops = {{sizeof(kiln_scheduler_ops), 0, sf_create, sf_destroy, sf_get_state,
                                           sf_set_state},
                                          sf_lr_at};
static const kiln_param sf_params[] = {
    {"path", KILN_TYPE_STRING, 0, KILN_V_STR("sched.txt"), "record file"},
    {"threshold", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(INFINITY), "halve the rate when the metric is above it"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc sf_desc = {sizeof(kiln_plugin_desc), KILN_KIND_SCHEDULER, "schedfix", "1.0.0",
                                         "lr = base / (1 + step), recorded", KILN_CAP_STATEFUL, NULL, sf_params,
                                         &sf_ops, NULL};
KILN_DEFINE_LIBRARY("schedfix", "1.0.0", 1, &sf_desc)
