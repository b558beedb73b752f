/*
 * actround.c — test fixture: a precision ("actround") that keeps fp32
 * weights as 32-true does and implements the ABI 1.5 round_activation op:
 * every activation a module hands it is rounded in place through
 * `dtype` (round_to: "float8_e4m3fn", "float8_e5m2", or "none" to leave it)
 * after multiplying by `scale` and before dividing by it again (a fixed
 * per-run scale; the fp8-sim example computes one per tensor). Each site's
 * first call is logged at INFO ("actround: site <name> n=<n> dtype <dt>"),
 * so tests see which outputs the module routes through the precision.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>
#include <kiln/precision_util.h>

#define AR_MAX_SITES 64

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    uint32_t dtype; /* KILN_DTYPE_F8* or 0: none */
    double scale;
    char *sites[AR_MAX_SITES];
    int nsites;
};

static int32_t ar_create(void *pc, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)pc;
    const char *dt = kiln_kv_str(cfg, "dtype", "float8_e4m3fn");
    uint32_t d = strcmp(dt, "none") ? kiln_dtype_from_name(dt) : 0;
    if (strcmp(dt, "none") && d != KILN_DTYPE_F8E4M3 && d != KILN_DTYPE_F8E5M2)
        return kiln_errorf(svc, h, KILN_E_CONFIG, "actround: dtype must be float8_e4m3fn, float8_e5m2 or none, got %s",
                           dt);
    kiln_instance *s = calloc(1, sizeof *s);
    if (!s) return KILN_E_NOMEM;
    s->svc = svc;
    s->hctx = h;
    s->dtype = d;
    s->scale = kiln_kv_float(cfg, "scale", 1.0);
    *out = s;
    return KILN_OK;
}

static void ar_destroy(kiln_instance *s) {
    if (!s) return;
    for (int i = 0; i < s->nsites; i++) free(s->sites[i]);
    free(s);
}

static int32_t ar_setup(kiln_instance *s, kiln_parameter *const *p, uint32_t n) {
    (void)s;
    for (uint32_t i = 0; i < n; i++) {
        p[i]->compute = p[i]->data;
        p[i]->compute_dtype = kiln_param_dtype(p[i]);
    }
    return KILN_OK;
}

static int32_t ar_convert(kiln_instance *s) {
    (void)s;
    return KILN_OK;
}

static int32_t ar_pre_backward(kiln_instance *s, double loss, double *scale) {
    (void)s, (void)loss;
    *scale = 1.0;
    return KILN_OK;
}

static int32_t ar_step(kiln_instance *s, const kiln_optimizer_ref *opt, const kiln_closure *c,
                       const kiln_closure *after, int32_t *skipped) {
    (void)s;
    return kiln_precision_default_step(opt, c, after, skipped);
}

static int32_t ar_round_activation(kiln_instance *s, const char *site, uint32_t dtype, void *x, size_t n) {
    int seen = 0;
    for (int i = 0; i < s->nsites && !seen; i++) seen = !strcmp(s->sites[i], site);
    if (!seen && s->nsites < AR_MAX_SITES) {
        s->sites[s->nsites++] = strdup(site);
        kiln_logf(s->svc, s->hctx, KILN_LOG_INFO, "actround: site %s n=%zu dtype %s", site, n, kiln_dtype_name(dtype));
    }
    if (!s->dtype) return KILN_OK;
    if (dtype != KILN_DTYPE_F32)
        return kiln_errorf(s->svc, s->hctx, KILN_E_UNSUPPORTED, "actround: activations in %s; expected float32",
                           kiln_dtype_name(dtype));
    kiln_instance *acc;
    const kiln_kernels *k;
    int32_t rc = s->svc->accelerator(s->hctx, &acc, &k);
    if (rc != KILN_OK) return rc;
    if (s->scale != 1.0 && (rc = k->scale_ex(acc, KILN_DTYPE_F32, x, s->scale, n)) != KILN_OK) return rc;
    if ((rc = k->round_to(acc, (float *)x, s->dtype, n)) != KILN_OK) return rc;
    if (s->scale != 1.0) rc = k->scale_ex(acc, KILN_DTYPE_F32, x, 1.0 / s->scale, n);
    return rc;
}

static const kiln_precision_ops ar_ops = {
    .base = {sizeof(kiln_precision_ops), 0, ar_create, ar_destroy, NULL, NULL},
    .setup = ar_setup,
    .convert_params = ar_convert,
    .pre_backward = ar_pre_backward,
    .optimizer_step = ar_step,
    .round_activation = ar_round_activation,
};

static const kiln_param ar_params[] = {
    {"dtype", KILN_TYPE_STRING, 0, KILN_V_STR("float8_e4m3fn"), "float8_e4m3fn | float8_e5m2 | none"},
    {"scale", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1.0), "multiply before rounding, divide after"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

static const kiln_kv ar_props[] = {{"precision", KILN_V_STR("actround")}, {NULL, KILN_V_NONE}};

static const kiln_plugin_desc ar_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_PRECISION,
    .name = "actround",
    .version = "0.1.0",
    .description = "test fixture: fp32 weights, activations rounded through FP8 by round_activation",
    .capabilities = 0,
    .properties = ar_props,
    .params = ar_params,
    .ops = &ar_ops,
};

KILN_DEFINE_LIBRARY("actround", "0.1.0", 5, &ar_desc)
