/*
 * fp8sim.c — "fp8-sim", an out-of-tree precision plugin that simulates FP8
 * training on any accelerator with kiln's ABI 1.5: FP32 master weights and
 * FP32 arithmetic, but every value that an FP8 recipe stores in 8 bits is
 * rounded through the OCP format, with a per-tensor power-of-two scale
 * from the tensor's current largest magnitude (fp8sim_scale.h):
 *
 *   weights      convert_params: compute copy = E4M3(w * s) / s, per tensor
 *                (matrices only; biases stay fp32, as FP8 recipes keep them)
 *   activations  round_activation (the 1.5 precision op, which mlp and the
 *                kiln/nn.h transformer blocks call on every Linear and
 *                attention output): x = E4M3(x * s) / s, per call
 *   gradients    after the backward, before clipping and the update:
 *                g = E5M2(g * s) / s per parameter (grad_dtype; "none"
 *                keeps fp32 gradients)
 *
 * The rounding itself is the accelerator's round_to (ABI 1.5 accepts the
 * FP8 dtypes; round to nearest even, finite overflow saturating) and the
 * scaling its scale_ex, so the data stays on the device. Only the amax is
 * read on the host: directly where the accelerator's memory is host memory,
 * else through one copy into a staging buffer. There is no loss scaling
 * (pre_backward gives 1): E5M2's range with a per-tensor scale does that
 * job. At on_fit_end the plugin logs how many tensors it scaled and the
 * range of their scales.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>
#include <kiln/optim_util.h> /* kiln_param_has_grad */
#include <kiln/precision_util.h>

#include "fp8sim_scale.h"

#define FS_E4M3_MAX 448.0
#define FS_E5M2_MAX 57344.0

typedef struct fs_weight {
    kiln_parameter *p;
    float *compute; /* (p->numel) the rounded copy the forward reads, accelerator */
} fs_weight;

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    /* configuration */
    uint32_t wdt, adt, gdt; /* KILN_DTYPE_F8E4M3 / F8E5M2; gdt 0: fp32 gradients */
    int margin;             /* powers of two of headroom below the format's max */
    /* set by setup() */
    kiln_instance *acc;
    const kiln_kernels *k;
    int host_mem;              /* the accelerator's memory is host memory */
    kiln_parameter **params;   /* (n) every parameter (gradients) */
    uint32_t n;
    fs_weight *w;              /* (nw) the matrices (weights) */
    uint32_t nw;
    float *staging;            /* host copy for the amax, grow-only, when !host_mem */
    size_t staging_n;
    /* what was scaled, for the summary */
    int64_t scaled;            /* round_activation + weight + gradient roundings */
    double min_scale, max_scale;
};

#define FS_ERR(self, code, ...) kiln_errorf((self)->svc, (self)->hctx, (code), __VA_ARGS__)

/* ---------------------------------------------------------------- create */

static int32_t fs_dtype(const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg, const char *key,
                        const char *def, int allow_none, uint32_t *out) {
    const char *s = kiln_kv_str(cfg, key, def);
    if (allow_none && !strcmp(s, "none")) {
        *out = 0;
        return KILN_OK;
    }
    const uint32_t dt = kiln_dtype_from_name(s);
    if (dt != KILN_DTYPE_F8E4M3 && dt != KILN_DTYPE_F8E5M2)
        return kiln_errorf(svc, h, KILN_E_CONFIG, "fp8-sim: %s must be \"float8_e4m3fn\" or \"float8_e5m2\"%s, got \"%s\"",
                           key, allow_none ? " or \"none\"" : "", s);
    *out = dt;
    return KILN_OK;
}

static int32_t fs_create(void *pc, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)pc;
    *out = NULL;
    uint32_t wdt, adt, gdt;
    int32_t rc = fs_dtype(svc, h, cfg, "weight_dtype", "float8_e4m3fn", 0, &wdt);
    if (rc == KILN_OK) rc = fs_dtype(svc, h, cfg, "activation_dtype", "float8_e4m3fn", 0, &adt);
    if (rc == KILN_OK) rc = fs_dtype(svc, h, cfg, "grad_dtype", "float8_e5m2", 1, &gdt);
    if (rc != KILN_OK) return rc;
    const int64_t margin = kiln_kv_int(cfg, "margin", 0);
    if (margin < 0 || margin > 16)
        return kiln_errorf(svc, h, KILN_E_CONFIG, "fp8-sim: margin must be in [0, 16], got %lld", (long long)margin);
    kiln_instance *s = calloc(1, sizeof *s);
    if (!s) return kiln_errorf(svc, h, KILN_E_NOMEM, "fp8-sim: cannot allocate the instance");
    s->svc = svc;
    s->hctx = h;
    s->wdt = wdt;
    s->adt = adt;
    s->gdt = gdt;
    s->margin = (int)margin;
    s->min_scale = INFINITY;
    s->max_scale = 0.0;
    *out = s;
    return KILN_OK;
}

static void fs_release(kiln_instance *s) {
    for (uint32_t i = 0; i < s->nw; i++)
        if (s->w[i].compute) s->k->free(s->acc, s->w[i].compute);
    free(s->w);
    free(s->params);
    free(s->staging);
    s->w = NULL;
    s->params = NULL;
    s->staging = NULL;
    s->nw = s->n = 0;
    s->staging_n = 0;
}

static void fs_destroy(kiln_instance *s) {
    if (!s) return;
    if (s->k) fs_release(s);
    free(s);
}

/* ----------------------------------------------------------------- setup */

static int32_t fs_setup(kiln_instance *s, kiln_parameter *const *params, uint32_t n) {
    kiln_instance *acc = NULL;
    const kiln_kernels *k = NULL;
    int32_t rc = s->svc->accelerator ? s->svc->accelerator(s->hctx, &acc, &k) : KILN_E_UNSUPPORTED;
    if (rc != KILN_OK || !k) return FS_ERR(s, rc ? rc : KILN_E_NOT_FOUND, "fp8-sim: no accelerator kernel table");
    if (k->struct_size < KILN_KERNELS_SIZE_1_5 || !k->round_to || !k->scale_ex || !k->copy || !k->alloc)
        return FS_ERR(s, KILN_E_UNSUPPORTED,
                      "fp8-sim: needs an ABI 1.5 kernel table (round_to through FP8, scale_ex); the accelerator's is "
                      "%u bytes, expected at least %u",
                      (unsigned)k->struct_size, (unsigned)KILN_KERNELS_SIZE_1_5);
    for (uint32_t i = 0; i < n; i++)
        if (kiln_param_dtype(params[i]) != KILN_DTYPE_F32)
            return FS_ERR(s, KILN_E_CONFIG, "fp8-sim: parameter %s has %s masters; expected float32",
                          params[i]->name, kiln_dtype_name(kiln_param_dtype(params[i])));
    if (s->k) fs_release(s);
    s->acc = acc;
    s->k = k;
    s->host_mem = (k->flags & KILN_KERNELS_HOST_MEMORY) != 0;
    s->params = calloc(n ? n : 1, sizeof *s->params);
    s->w = calloc(n ? n : 1, sizeof *s->w);
    if (!s->params || !s->w) return FS_ERR(s, KILN_E_NOMEM, "fp8-sim: cannot allocate %u parameter slots", n);
    memcpy(s->params, params, n * sizeof *params);
    s->n = n;
    for (uint32_t i = 0; i < n; i++) {
        kiln_parameter *p = params[i];
        p->compute = p->data; /* vectors compute from their fp32 masters */
        p->compute_dtype = KILN_DTYPE_F32;
        if (p->ndim < 2 || p->numel == 0) continue;
        fs_weight *w = &s->w[s->nw];
        w->p = p;
        if ((rc = k->alloc(acc, (size_t)p->numel * sizeof(float), (void **)&w->compute)) != KILN_OK) {
            fs_release(s);
            return rc;
        }
        p->compute = w->compute;
        s->nw++;
    }
    return KILN_OK;
}

/* ------------------------------------------------------------- rounding */

/* max |x| of x(n) on the accelerator. NaN is ignored (fmax), so one NaN
 * does not make the scale 1 for the whole tensor. */
static int32_t fs_amax(kiln_instance *s, const float *x, size_t n, double *out) {
    const float *h = x;
    if (!s->host_mem) {
        if (n > s->staging_n) {
            float *b = realloc(s->staging, n * sizeof *b);
            if (!b) return FS_ERR(s, KILN_E_NOMEM, "fp8-sim: cannot allocate a %zu-float staging buffer", n);
            s->staging = b;
            s->staging_n = n;
        }
        int32_t rc = s->k->copy(s->acc, s->staging, x, n * sizeof *x, KILN_COPY_D2H);
        if (rc == KILN_OK && s->k->synchronize) rc = s->k->synchronize(s->acc);
        if (rc != KILN_OK) return rc;
        h = s->staging;
    }
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(h[i]));
    *out = m;
    return KILN_OK;
}

/* x(n) = FP8(x * scale) / scale in dtype `dt`, on the accelerator. */
static int32_t fs_round(kiln_instance *s, float *x, size_t n, uint32_t dt) {
    if (n == 0) return KILN_OK;
    double amax;
    int32_t rc = fs_amax(s, x, n, &amax);
    if (rc != KILN_OK) return rc;
    const double scale = fp8sim_scale(amax, dt == KILN_DTYPE_F8E4M3 ? FS_E4M3_MAX : FS_E5M2_MAX, s->margin);
    const kiln_kernels *k = s->k;
    if (scale != 1.0 && (rc = k->scale_ex(s->acc, KILN_DTYPE_F32, x, scale, n)) != KILN_OK) return rc;
    if ((rc = k->round_to(s->acc, x, dt, n)) != KILN_OK) return rc;
    if (scale != 1.0 && (rc = k->scale_ex(s->acc, KILN_DTYPE_F32, x, 1.0 / scale, n)) != KILN_OK) return rc;
    s->scaled++;
    if (amax > 0.0 && isfinite(amax)) {
        s->min_scale = fmin(s->min_scale, scale);
        s->max_scale = fmax(s->max_scale, scale);
    }
    return KILN_OK;
}

/* Before every forward: the FP8 weights the module reads. */
static int32_t fs_convert(kiln_instance *s) {
    for (uint32_t i = 0; i < s->nw; i++) {
        fs_weight *w = &s->w[i];
        const size_t n = (size_t)w->p->numel;
        int32_t rc = s->k->copy(s->acc, w->compute, w->p->data, n * sizeof(float), KILN_COPY_D2D);
        if (rc == KILN_OK) rc = fs_round(s, w->compute, n, s->wdt);
        if (rc != KILN_OK) return rc;
    }
    return KILN_OK;
}

/* The 1.5 op: every Linear and attention output the module produces. */
static int32_t fs_round_activation(kiln_instance *s, const char *site, uint32_t dtype, void *x, size_t n) {
    if (dtype != KILN_DTYPE_F32)
        return FS_ERR(s, KILN_E_UNSUPPORTED, "fp8-sim: activation %s is %s; expected float32", site,
                      kiln_dtype_name(dtype));
    return fs_round(s, (float *)x, n, s->adt);
}

static int32_t fs_pre_backward(kiln_instance *s, double loss, double *scale) {
    (void)s, (void)loss;
    *scale = 1.0;
    return KILN_OK;
}

/* The closure the optimizer calls: the host's (training_step, zero_grad,
 * backward), then the gradients through grad_dtype, then after_closure
 * (on_before_optimizer_step, clipping) sees FP8 gradients. */
typedef struct fs_wrapped {
    kiln_instance *s;
    const kiln_closure *closure, *after;
} fs_wrapped;

static int32_t fs_wrapped_call(void *ctx, double *loss) {
    fs_wrapped *w = ctx;
    int32_t rc = w->closure->call(w->closure->ctx, loss);
    if (rc != KILN_OK) return rc;
    kiln_instance *s = w->s;
    for (uint32_t i = 0; s->gdt && i < s->n; i++) {
        kiln_parameter *p = s->params[i];
        if (p->numel == 0 || (p->flags & KILN_PARAMF_FROZEN) || !kiln_param_has_grad(p)) continue;
        if ((rc = fs_round(s, p->grad, (size_t)p->numel, s->gdt)) != KILN_OK) return rc;
    }
    double ignored;
    return w->after ? w->after->call(w->after->ctx, &ignored) : KILN_OK;
}

static int32_t fs_optimizer_step(kiln_instance *s, const kiln_optimizer_ref *opt, const kiln_closure *closure,
                                 const kiln_closure *after, int32_t *skipped) {
    if (skipped) *skipped = 0;
    if (!closure) return kiln_precision_default_step(opt, NULL, after, skipped);
    fs_wrapped w = {s, closure, after};
    kiln_closure wrapped = {sizeof(kiln_closure), 0, &w, fs_wrapped_call};
    return opt->step(opt->ctx, &wrapped);
}

static int32_t fs_on_event(kiln_instance *s, kiln_event *ev) {
    if (ev->id != KILN_EV_ON_FIT_END || s->scaled == 0) return KILN_OK;
    kiln_logf(s->svc, s->hctx, KILN_LOG_INFO,
              "fp8-sim: %lld tensors rounded (weights %s, activations %s, gradients %s), per-tensor scales 2^%d .. 2^%d",
              (long long)s->scaled, kiln_dtype_name(s->wdt), kiln_dtype_name(s->adt),
              s->gdt ? kiln_dtype_name(s->gdt) : "float32", s->max_scale > 0 ? (int)log2(s->min_scale) : 0,
              s->max_scale > 0 ? (int)log2(s->max_scale) : 0);
    return KILN_OK;
}

/* ------------------------------------------------------------ descriptor */

static const kiln_precision_ops fs_ops = {
    .base = {sizeof(kiln_precision_ops), 0, fs_create, fs_destroy, NULL, NULL},
    .setup = fs_setup,
    .convert_params = fs_convert,
    .pre_backward = fs_pre_backward,
    .optimizer_step = fs_optimizer_step,
    .on_event = fs_on_event,
    .round_activation = fs_round_activation,
};

static const kiln_param fs_params[] = {
    {"weight_dtype", KILN_TYPE_STRING, 0, KILN_V_STR("float8_e4m3fn"), "FP8 format of the weights the forward reads"},
    {"activation_dtype", KILN_TYPE_STRING, 0, KILN_V_STR("float8_e4m3fn"),
     "FP8 format of every Linear and attention output"},
    {"grad_dtype", KILN_TYPE_STRING, 0, KILN_V_STR("float8_e5m2"),
     "FP8 format of the gradients before the update, or \"none\" (fp32)"},
    {"margin", KILN_TYPE_INT, 0, KILN_V_INT(0), "powers of two of headroom below the format's largest value (0..16)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

static const kiln_kv fs_props[] = {
    {"precision", KILN_V_STR("fp8-sim")},
    {"amp_backend", KILN_V_STR("none")},
    {"param_dtype", KILN_V_STR("float32")},
    {"compute_dtype", KILN_V_STR("float32")},
    {"activation_dtype", KILN_V_STR("float8_e4m3fn")},
    {"grad_dtype", KILN_V_STR("float8_e5m2")},
    {"needs_grad_scaler", KILN_V_BOOL(0)},
    {"bits_per_weight", KILN_V_FLOAT(8.0)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc fs_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_PRECISION,
    .name = "fp8-sim",
    .version = "1.0.0",
    .description = "simulated FP8: E4M3 weights and activations, E5M2 gradients, per-tensor power-of-two scales",
    .capabilities = KILN_CAP_DETERMINISTIC,
    .properties = fs_props,
    .params = fs_params,
    .ops = &fs_ops,
};

/* min_host_minor 5: round_activation, and round_to's FP8 dtypes */
KILN_DEFINE_LIBRARY("fp8-sim", "1.0.0", 5, &fs_desc)
