/*
 * precision64.c — the "64-true" precision plugin (Lightning's
 * DoublePrecision): parameters, gradients, activations and optimizer state
 * in float64. The plugin says so through its "param_dtype" property; the
 * host then allocates fp64 masters (after checking that the module and the
 * optimizer list "float64" in their "param_dtypes"), and the module computes
 * in the dtype of its masters. Everything else is the base Precision: no
 * scaling, the closure wrapped so on_before_optimizer_step follows it.
 */
#include <stdlib.h>

#include <kiln/kiln.h>
#include <kiln/precision_util.h>

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
};

static int32_t p64_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
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

static void p64_destroy(kiln_instance *self) { free(self); }

/* The forward reads the fp64 masters directly. */
static int32_t p64_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        if (kiln_param_dtype(params[i]) != KILN_DTYPE_F64)
            return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                               "64-true: parameter %s has %s masters, expected float64 (a host older than ABI 1.2 "
                               "cannot allocate them)",
                               params[i]->name, kiln_dtype_name(kiln_param_dtype(params[i])));
        params[i]->compute = params[i]->data;
        params[i]->compute_dtype = KILN_DTYPE_F64;
    }
    return KILN_OK;
}

static int32_t p64_convert(kiln_instance *self) {
    (void)self;
    return KILN_OK;
}

static int32_t p64_pre_backward(kiln_instance *self, double loss, double *scale) {
    (void)self;
    (void)loss;
    *scale = 1.0;
    return KILN_OK;
}

static int32_t p64_optimizer_step(kiln_instance *self, const kiln_optimizer_ref *opt, const kiln_closure *closure,
                                  const kiln_closure *after_closure, int32_t *skipped) {
    (void)self;
    return kiln_precision_default_step(opt, closure, after_closure, skipped);
}

static const kiln_precision_ops p64_ops = {
    .base = {sizeof(kiln_precision_ops), 0, p64_create, p64_destroy, NULL, NULL},
    .setup = p64_setup,
    .convert_params = p64_convert,
    .pre_backward = p64_pre_backward,
    .optimizer_step = p64_optimizer_step,
    .on_event = NULL,
};

static const char *const p64_aliases[] = {"64", "double"};
static const kiln_kv p64_props[] = {
    {"precision", KILN_V_STR("64-true")},
    {"amp_backend", KILN_V_STR("none")},
    {"amp_level", KILN_V_STR("none")},
    {"param_dtype", KILN_V_STR("float64")},
    {"compute_dtype", KILN_V_STR("float64")},
    {"grad_dtype", KILN_V_STR("float64")},
    {"needs_grad_scaler", KILN_V_BOOL(0)},
    {"bits_per_weight", KILN_V_FLOAT(64.0)},
    {"aliases", KILN_V_STRS(p64_aliases)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc p64_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_PRECISION,
    .name = "64-true",
    .version = "1.0.0",
    .description = "full fp64: parameters, gradients, activations and optimizer state",
    .capabilities = KILN_CAP_DETERMINISTIC,
    .properties = p64_props,
    .params = NULL,
    .ops = &p64_ops,
};

KILN_DEFINE_LIBRARY("64-true", "1.0.0", 2, &p64_desc)
