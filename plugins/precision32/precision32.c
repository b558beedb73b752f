/*
 * precision32.c — the "32-true" precision plugin: fp32 parameters, compute
 * and gradients, no loss scaling. It is Lightning's base Precision: every
 * method a pass-through. optimizer_step wraps the closure so the optimizer
 * runs training_step, zero_grad and backward, then on_before_optimizer_step
 * and clipping (the host's after_closure), then updates — the order of
 * Precision._wrap_closure. It reports its own precision/amp_backend strings;
 * the host has no list of precisions.
 */
#include <stdlib.h>

#include <kiln/kiln.h>
#include <kiln/precision_util.h>

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
};

static int32_t p32_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                          const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    (void)config;
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "out of memory");
    self->svc = svc;
    self->hctx = hctx;
    *out = self;
    return KILN_OK;
}

static void p32_destroy(kiln_instance *self) { free(self); }

/* fp32 compute reads the master weights directly. */
static int32_t p32_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t n) {
    (void)self;
    for (uint32_t i = 0; i < n; i++) {
        params[i]->compute = params[i]->data;
        params[i]->compute_dtype = KILN_DTYPE_F32;
    }
    return KILN_OK;
}

static int32_t p32_convert(kiln_instance *self) {
    (void)self;
    return KILN_OK;
}

static int32_t p32_pre_backward(kiln_instance *self, double loss, double *scale) {
    (void)self;
    (void)loss;
    *scale = 1.0;
    return KILN_OK;
}

/* The closure the optimizer calls: the host's closure, then after_closure. */
static int32_t p32_optimizer_step(kiln_instance *self, const kiln_optimizer_ref *opt, const kiln_closure *closure,
                                  const kiln_closure *after_closure, int32_t *skipped) {
    (void)self;
    return kiln_precision_default_step(opt, closure, after_closure, skipped);
}

static const kiln_precision_ops p32_ops = {
    .base = {sizeof(kiln_precision_ops), 0, p32_create, p32_destroy, NULL, NULL},
    .setup = p32_setup,
    .convert_params = p32_convert,
    .pre_backward = p32_pre_backward,
    .optimizer_step = p32_optimizer_step,
};

static const char *const p32_aliases[] = {"32", "fp32"};
static const kiln_kv p32_props[] = {
    {"precision", KILN_V_STR("32-true")},
    {"amp_backend", KILN_V_STR("none")},
    {"amp_level", KILN_V_STR("none")},
    {"param_dtype", KILN_V_STR("float32")},
    {"compute_dtype", KILN_V_STR("float32")},
    {"grad_dtype", KILN_V_STR("float32")},
    {"needs_grad_scaler", KILN_V_BOOL(0)},
    {"bits_per_weight", KILN_V_FLOAT(32.0)},
    {"aliases", KILN_V_STRS(p32_aliases)},
    {"default", KILN_V_BOOL(1)}, /* the precision of a run file that names none */
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc p32_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_PRECISION,
    .name = "32-true",
    .version = "1.0.0",
    .description = "full fp32: parameters, compute and gradients; no loss scaling",
    .capabilities = KILN_CAP_DETERMINISTIC,
    .properties = p32_props,
    .params = NULL,
    .ops = &p32_ops,
};

KILN_DEFINE_LIBRARY("32-true", "1.0.0", 1, &p32_desc)
