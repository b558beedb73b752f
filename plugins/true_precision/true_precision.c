/*
 * true_precision.c — the "true" precisions, where the forward computes in
 * the dtype of the master weights: "32-true" (Lightning's base Precision:
 * fp32 everywhere) and "64-true" (DoublePrecision: parameters, gradients,
 * activations and optimizer state in fp64; it says so through its
 * "param_dtype" property, and the host then allocates fp64 masters after
 * checking that the module and optimizer list "float64" in their
 * "param_dtypes"). Both are the base Precision otherwise: compute reads the
 * masters, no loss scaling, and the optimizer step wraps the closure so
 * on_before_optimizer_step and clipping follow it (kiln/precision_util.h).
 * The two plugins differ only in the dtype they expect; it is passed to
 * create() as plugin_ctx. Each reports its own precision/amp_backend
 * strings; the host has no list of precisions.
 */
#include <stdint.h>
#include <stdlib.h>

#include <kiln/kiln.h>
#include <kiln/precision_util.h>

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    uint32_t dtype; /* KILN_DTYPE_F32 or KILN_DTYPE_F64 */
    const char *name;
};

static const uint32_t tp_f32 = KILN_DTYPE_F32, tp_f64 = KILN_DTYPE_F64;

static int32_t tp_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                         kiln_instance **out) {
    (void)config;
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->dtype = *(const uint32_t *)plugin_ctx;
    self->name = self->dtype == KILN_DTYPE_F64 ? "64-true" : "32-true";
    *out = self;
    return KILN_OK;
}

static void tp_destroy(kiln_instance *self) { free(self); }

/* The forward reads the masters directly. */
static int32_t tp_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        if (kiln_param_dtype(params[i]) != self->dtype)
            return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                               "%s: parameter %s has %s masters, expected %s (a host older than ABI 1.2 cannot "
                               "allocate float64 ones)",
                               self->name, params[i]->name, kiln_dtype_name(kiln_param_dtype(params[i])),
                               kiln_dtype_name(self->dtype));
        params[i]->compute = params[i]->data;
        params[i]->compute_dtype = self->dtype;
    }
    return KILN_OK;
}

static int32_t tp_convert(kiln_instance *self) {
    (void)self;
    return KILN_OK;
}

static int32_t tp_pre_backward(kiln_instance *self, double loss, double *scale) {
    (void)self;
    (void)loss;
    *scale = 1.0;
    return KILN_OK;
}

static int32_t tp_optimizer_step(kiln_instance *self, const kiln_optimizer_ref *opt, const kiln_closure *closure,
                                 const kiln_closure *after_closure, int32_t *skipped) {
    (void)self;
    return kiln_precision_default_step(opt, closure, after_closure, skipped);
}

static const kiln_precision_ops tp_ops = {
    .base = {sizeof(kiln_precision_ops), 0, tp_create, tp_destroy, NULL, NULL},
    .setup = tp_setup,
    .convert_params = tp_convert,
    .pre_backward = tp_pre_backward,
    .optimizer_step = tp_optimizer_step,
    .on_event = NULL,
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

static const kiln_plugin_desc p32_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_PRECISION,
    .name = "32-true",
    .version = "1.0.0",
    .description = "full fp32: parameters, compute and gradients; no loss scaling",
    .capabilities = KILN_CAP_DETERMINISTIC,
    .properties = p32_props,
    .params = NULL,
    .ops = &tp_ops,
    .plugin_ctx = (void *)&tp_f32,
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
    .ops = &tp_ops,
    .plugin_ctx = (void *)&tp_f64,
};

KILN_DEFINE_LIBRARY("true", "1.0.0", 1, &p32_desc, &p64_desc)
