/*
 * tests/plugins/repeatopt.c — a test-only optimizer that declares it calls
 * its closure several times per step (as LBFGS does). It exists to prove
 * that a precision declaring allows_repeated_closure = false is refused
 * with it at config check, by properties alone. If ever run, its step calls
 * the closure twice and updates nothing.
 */
#include <stdlib.h>

#include "common_train.h"

struct ro { int unused; };

static int32_t ro_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)ctx, (void)svc, (void)h, (void)cfg;
    *out = calloc(1, sizeof(struct ro));
    return *out ? KILN_OK : KILN_E_NOMEM;
}
static void ro_destroy(kiln_instance *i) { free(i); }
static int32_t ro_setup(kiln_instance *i, kiln_parameter *const *p, uint32_t n) { (void)i, (void)p, (void)n; return KILN_OK; }
static int32_t ro_step(kiln_instance *i, const kiln_closure *c) {
    (void)i;
    double loss;
    for (int k = 0; c && k < 2; k++) {
        int32_t rc = c->call(c->ctx, &loss);
        if (rc) return rc;
    }
    return KILN_OK;
}
static int32_t ro_zero(kiln_instance *i) { (void)i; return KILN_OK; }
static double ro_get_lr(kiln_instance *i) { (void)i; return 0.1; }
static int32_t ro_set_lr(kiln_instance *i, double lr) { (void)i, (void)lr; return KILN_OK; }

static const kiln_optimizer_ops ro_ops = {{sizeof(kiln_optimizer_ops), 0, ro_create, ro_destroy, NULL, NULL},
                                          ro_setup, ro_step, ro_zero, ro_get_lr, ro_set_lr};
static const kiln_kv ro_props[] = {{"repeated_closure", KILN_V_BOOL(1)}, {NULL, KILN_V_NONE}};
static const kiln_plugin_desc ro_desc = {sizeof(kiln_plugin_desc), KILN_KIND_OPTIMIZER, "repeatopt", "1.0.0",
                                         "calls its closure twice per step", 0, ro_props, NULL, &ro_ops, NULL};
KILN_DEFINE_LIBRARY("repeatopt", "1.0.0", 1, &ro_desc)
