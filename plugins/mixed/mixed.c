/*
 * mixed.c — the "16-mixed" and "bf16-mixed" precision plugins (PyTorch
 * Lightning's MixedPrecision with torch.autocast and, for fp16, a
 * GradScaler). Master weights and gradients stay fp32; every linear weight
 * (ndim >= 2) gets a compute copy in fp16 or bf16, refreshed from the
 * masters by convert_params before each forward, and the module computes in
 * that dtype (on the cpu accelerator by rounding through the real format, so
 * overflow and underflow happen as on a GPU). 1-D parameters (biases) keep
 * compute = masters: their sum with a matmul output is rounded anyway.
 * Masters that follow each other in memory (the host's parameter arena)
 * get their copies in one buffer, refreshed by one cast: a GPU converts a
 * GPT's 50 weight matrices with one launch, not 50 (the biases between
 * them are converted too, unused, a fraction of a percent of the bytes).
 *
 * 16-mixed scales the loss before backward (hooks see the scaled loss and
 * gradients), then in optimizer_step: runs the closure, unscales every
 * gradient and looks for inf/NaN, runs on_before_optimizer_step/clipping on
 * the unscaled gradients, and steps the optimizer only when all were finite;
 * then updates the scale (backoff on inf, growth after growth_interval clean
 * steps). The host counts a skipped step as a step, as Lightning does. The
 * scale, growth tracker and skip count are the plugin's checkpoint state.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

#include "../common/plugin_common.h"
#include <kiln/precision_util.h>

#define MX_VERSION "1.0.0"
#define MX_STATE_VERSION 1u
#define MX_STATE_MAGIC "KMXS"

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    uint32_t dtype;             /* KILN_DTYPE_F16 or KILN_DTYPE_BF16               */
    int scaler;                 /* 1: dynamic loss scaling (16-mixed)              */
    /* GradScaler configuration */
    double init_scale, growth_factor, backoff_factor;
    int64_t growth_interval;
    /* GradScaler state (checkpointed) */
    double scale;               /* current loss scale                             */
    int64_t growth_tracker;     /* clean steps since the last growth or backoff   */
    int64_t skipped;            /* optimizer steps skipped for inf/NaN, in total   */
    /* the run */
    kiln_instance *acc;
    const kiln_kernels *k;
    kiln_parameter *const *params; /* the host's list, valid for the run         */
    uint32_t n;
    void **copies;              /* (n) each parameter's compute copy, or NULL    */
    /* the copies' buffers: span s holds span_n[s] elements converted from
     * the masters at span_src[s], adjacent parameters side by side */
    uint32_t nspans;
    void **span_buf;            /* (nspans) compute-dtype buffers we allocated */
    const float **span_src;     /* (nspans) the span's first master            */
    size_t *span_n;             /* (nspans) its elements                        */
    /* the gradients as unscale_check (ABI 1.3) takes them, or NULL when the
     * accelerator's table has no such entry */
    void **grads;               /* (n) p->grad of every parameter                */
    size_t *grad_n;             /* (n) p->numel                                  */
};

/* kiln_errorf through the instance's services, the format checked */
#define mx_err(self, code, ...) PLUGIN_FAIL((self)->svc, (self)->hctx, (code), __VA_ARGS__)

/* ------------------------------------------------------------- lifecycle */

static int32_t mx_create_common(const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                                uint32_t dtype, int scaler, kiln_instance **out) {
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->dtype = dtype;
    self->scaler = scaler;
    if (scaler) {
        self->init_scale = kiln_kv_float(config, "init_scale", 65536.0);
        self->growth_factor = kiln_kv_float(config, "growth_factor", 2.0);
        self->backoff_factor = kiln_kv_float(config, "backoff_factor", 0.5);
        self->growth_interval = kiln_kv_int(config, "growth_interval", 2000);
        const char *bad = NULL;
        char got[64] = "";
        if (!(self->init_scale > 0) || !isfinite(self->init_scale) || self->init_scale > 3.0e38)
            bad = "init_scale must be a finite number in (0, 3e38]", snprintf(got, sizeof got, "%g", self->init_scale);
        else if (!(self->growth_factor > 1.0) || !isfinite(self->growth_factor))
            bad = "growth_factor must be > 1", snprintf(got, sizeof got, "%g", self->growth_factor);
        else if (!(self->backoff_factor > 0.0 && self->backoff_factor < 1.0))
            bad = "backoff_factor must be in (0, 1)", snprintf(got, sizeof got, "%g", self->backoff_factor);
        else if (self->growth_interval < 1)
            bad = "growth_interval must be >= 1", snprintf(got, sizeof got, "%lld", (long long)self->growth_interval);
        if (bad) {
            free(self);
            return kiln_errorf(svc, hctx, KILN_E_CONFIG, "16-mixed: %s, got %s", bad, got);
        }
        self->scale = self->init_scale;
    } else {
        self->scale = 1.0;
    }
    *out = self;
    return KILN_OK;
}

static int32_t mx16_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                           const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    return mx_create_common(svc, hctx, config, KILN_DTYPE_F16, 1, out);
}

static int32_t mxbf_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                           const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    return mx_create_common(svc, hctx, config, KILN_DTYPE_BF16, 0, out);
}

static void mx_release(kiln_instance *self) {
    if (self->span_buf) {
        for (uint32_t s = 0; s < self->nspans; s++)
            if (self->span_buf[s] && self->k) self->k->free(self->acc, self->span_buf[s]);
    }
    free(self->copies), free(self->span_buf), free(self->span_src), free(self->span_n);
    self->copies = NULL, self->span_buf = NULL, self->span_src = NULL, self->span_n = NULL;
    self->nspans = 0;
    free(self->grads);
    free(self->grad_n);
    self->grads = NULL;
    self->grad_n = NULL;
}

static void mx_destroy(kiln_instance *self) {
    if (!self) return;
    mx_release(self);
    free(self);
}

/* ----------------------------------------------------------------- setup */

/* The most elements of a parameter without a copy (a bias, a norm) that a
 * span converts in passing: 384 KB of traffic, a fraction of a launch's
 * cost on a GPU. A larger one (an unusual 1-D table) ends the span. */
#define MX_SPAN_SKIP 65536

/* Whether a parameter gets a compute copy: a weight (ndim >= 2) with elements. */
static int mx_wants_copy(const kiln_parameter *p) { return p->ndim >= 2 && p->numel > 0; }

/* Elements from a's masters to b's (b after a in one arena). */
static size_t mx_gap(const kiln_parameter *a, const kiln_parameter *b) {
    return ((uintptr_t)b->data - (uintptr_t)a->data) / sizeof(float);
}

/* Whether b's masters start exactly where a's end. */
static int mx_follows(const kiln_parameter *a, const kiln_parameter *b) {
    return (uintptr_t)b->data == (uintptr_t)a->data + (uintptr_t)a->numel * sizeof(float);
}

static int32_t mx_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t n) {
    const char *me = self->scaler ? "16-mixed" : "bf16-mixed";
    if (!self->svc->accelerator || self->svc->accelerator(self->hctx, &self->acc, &self->k) != KILN_OK || !self->k)
        return mx_err(self, KILN_E_STATE, "%s: no accelerator kernel table available", me);
    const kiln_kernels *k = self->k;
    if (k->struct_size < KILN_KERNELS_SIZE_1_2 || !k->cast || !k->round_to || !k->gemm_ex)
        return mx_err(self, KILN_E_UNSUPPORTED,
                      "%s: needs the ABI 1.2 kernel entries cast, round_to and gemm_ex; the accelerator's kernel "
                      "table is %u bytes (1.2 needs %zu)",
                      me, k->struct_size, (size_t)KILN_KERNELS_SIZE_1_2);
    if (self->scaler && (!k->scale || !k->all_finite))
        return mx_err(self, KILN_E_UNSUPPORTED, "%s: the kernel table lacks scale or all_finite", me);
    mx_release(self);
    self->params = params;
    self->n = n;
    self->copies = calloc(n ? n : 1, sizeof *self->copies);
    self->span_buf = calloc(n ? n : 1, sizeof *self->span_buf);
    self->span_src = calloc(n ? n : 1, sizeof *self->span_src);
    self->span_n = calloc(n ? n : 1, sizeof *self->span_n);
    if (!self->copies || !self->span_buf || !self->span_src || !self->span_n)
        return mx_err(self, KILN_E_NOMEM, "%s: out of memory", me);
    for (uint32_t i = 0; i < n; i++) {
        kiln_parameter *p = params[i];
        if (kiln_param_dtype(p) != KILN_DTYPE_F32)
            return mx_err(self, KILN_E_STATE, "%s: parameter %s has %s masters, expected float32", me, p->name,
                          kiln_dtype_name(kiln_param_dtype(p)));
        p->compute = p->data; /* biases (see the top), and empty weights: nothing to read */
        p->compute_dtype = p->ndim < 2 ? KILN_DTYPE_F32 : self->dtype;
    }
    const size_t esz = kiln_dtype_size(self->dtype);
    for (uint32_t i = 0; i < n;) {
        if (!mx_wants_copy(params[i])) {
            i++;
            continue;
        }
        /* the span: from weight i through the last weight j whose masters
         * continue i's without a gap, each copy on a 16-byte boundary
         * (the alignment a GEMM's vector loads need), never across a 1-D
         * parameter larger than a launch is worth (MX_SPAN_SKIP) */
        uint32_t last = i, j = i;
        while (j + 1 < n && mx_follows(params[j], params[j + 1]) && mx_gap(params[i], params[j + 1]) * esz % 16 == 0 &&
               (mx_wants_copy(params[j + 1]) || params[j + 1]->numel <= MX_SPAN_SKIP)) {
            j++;
            if (mx_wants_copy(params[j])) last = j;
        }
        const uint32_t s = self->nspans++;
        self->span_src[s] = params[i]->data;
        self->span_n[s] = mx_gap(params[i], params[last]) + (size_t)params[last]->numel;
        int32_t rc = k->alloc(self->acc, self->span_n[s] * esz, &self->span_buf[s]);
        if (rc != KILN_OK) return rc;
        for (uint32_t q = i; q <= last; q++) {
            if (!mx_wants_copy(params[q])) continue;
            self->copies[q] = (unsigned char *)self->span_buf[s] + mx_gap(params[i], params[q]) * esz;
            params[q]->compute = self->copies[q];
        }
        i = last + 1;
    }
    /* 1.3: the whole unscale in one call, so an accelerator with a device
     * waits once per step instead of once per parameter */
    if (self->scaler && k->struct_size >= KILN_KERNELS_SIZE_1_3 && k->unscale_check) {
        self->grads = calloc(n ? n : 1, sizeof *self->grads);
        self->grad_n = calloc(n ? n : 1, sizeof *self->grad_n);
        if (!self->grads || !self->grad_n) return mx_err(self, KILN_E_NOMEM, "%s: out of memory", me);
    }
    return KILN_OK;
}

/* Before every forward: compute copies = masters, rounded to nearest even,
 * one cast per span. */
static int32_t mx_convert(kiln_instance *self) {
    for (uint32_t s = 0; s < self->nspans; s++) {
        int32_t rc = self->k->cast(self->acc, self->span_buf[s], self->dtype, self->span_src[s], KILN_DTYPE_F32,
                                   self->span_n[s]);
        if (rc != KILN_OK) return rc;
    }
    return KILN_OK;
}

/* -------------------------------------------------------------- backward */

static int32_t mx_pre_backward(kiln_instance *self, double loss, double *scale) {
    (void)loss;
    *scale = self->scaler ? self->scale : 1.0;
    return KILN_OK;
}

/* ---------------------------------------------------------- optimizer step */

/* GradScaler.unscale_: grads *= 1/scale (in fp32, as PyTorch's inv_scale),
 * and whether any gradient is inf/NaN afterwards. */
static int32_t mx_unscale(kiln_instance *self, int *found_inf) {
    const float inv = (float)(1.0 / self->scale);
    *found_inf = 0;
    if (self->grads) {
        for (uint32_t i = 0; i < self->n; i++) { /* as read now, like the loop below */
            self->grads[i] = self->params[i]->grad;
            self->grad_n[i] = (size_t)self->params[i]->numel;
        }
        int32_t finite = 1;
        int32_t rc = self->k->unscale_check(self->acc, KILN_DTYPE_F32, self->grads, self->grad_n, self->n,
                                            (double)inv, &finite);
        if (rc != KILN_OK) return rc;
        *found_inf = !finite;
        return KILN_OK;
    }
    for (uint32_t i = 0; i < self->n; i++) {
        kiln_parameter *p = self->params[i];
        if (p->numel == 0) continue;
        int32_t rc = self->k->scale(self->acc, p->grad, inv, (size_t)p->numel);
        int32_t finite = 1;
        if (rc == KILN_OK) rc = self->k->all_finite(self->acc, p->grad, (size_t)p->numel, &finite);
        if (rc != KILN_OK) return rc;
        if (!finite) *found_inf = 1;
    }
    return KILN_OK;
}

/* GradScaler.update */
static void mx_update(kiln_instance *self, int found_inf) {
    if (found_inf) {
        self->scale *= self->backoff_factor;
        self->growth_tracker = 0;
        return;
    }
    if (++self->growth_tracker >= self->growth_interval) {
        double grown = self->scale * self->growth_factor;
        if (isfinite(grown) && grown <= 3.0e38) self->scale = grown; /* stays a finite fp32 */
        self->growth_tracker = 0;
    }
}

static int32_t mx_optimizer_step(kiln_instance *self, const kiln_optimizer_ref *opt, const kiln_closure *closure,
                                 const kiln_closure *after_closure, int32_t *skipped) {
    *skipped = 0;
    if (!self->scaler) /* bf16: Precision.optimizer_step, the optimizer runs the closure */
        return kiln_precision_default_step(opt, closure, after_closure, skipped);
    /* MixedPrecision.optimizer_step with a scaler: the closure runs here,
     * not inside the optimizer, so the update can be skipped. */
    double loss = NAN;
    int32_t rc = closure->call(closure->ctx, &loss);
    if (rc != KILN_OK) return rc;
    /* training_step returned no loss (automatic optimisation): no unscale,
     * no step, no scaler update; the hooks still run. In manual mode the
     * closure is the module's own (often none): always step. */
    const kiln_trainer_state *ts =
        self->svc->abi_minor >= 1 && self->svc->trainer_state ? self->svc->trainer_state(self->hctx) : NULL;
    const int manual = ts && ts->struct_size >= KILN_TRAINER_STATE_SIZE_1_2 && !ts->automatic_optimization;
    const int skip = isnan(loss) && !manual;
    int found_inf = 0;
    if (!skip && (rc = mx_unscale(self, &found_inf)) != KILN_OK) return rc;
    double ignored;
    if (after_closure && (rc = after_closure->call(after_closure->ctx, &ignored)) != KILN_OK) return rc;
    if (skip) return KILN_OK;
    if (found_inf) {
        *skipped = 1;
        self->skipped++;
        if (self->svc->log) {
            char msg[128];
            snprintf(msg, sizeof msg, "16-mixed: inf/NaN gradients at scale %g: step skipped", self->scale);
            self->svc->log(self->hctx, KILN_LOG_DEBUG, msg);
        }
    } else if ((rc = opt->step(opt->ctx, NULL)) != KILN_OK) {
        return rc;
    }
    mx_update(self, found_inf);
    if (self->svc->abi_minor >= 1 && self->svc->log_value)
        self->svc->log_value(self->hctx, "amp_scale", self->scale, KILN_LOG_ON_STEP, 1.0);
    return KILN_OK;
}

/* ----------------------------------------------------------------- state */

typedef struct {
    char magic[4];
    uint32_t reserved;
    double scale;
    int64_t growth_tracker;
    int64_t skipped;
} mx_state;

static int32_t mx_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    mx_state *s = self->svc->alloc(self->hctx, sizeof *s, 8);
    if (!s) return mx_err(self, KILN_E_NOMEM, "16-mixed: out of memory for the scaler state");
    memset(s, 0, sizeof *s);
    memcpy(s->magic, MX_STATE_MAGIC, 4);
    s->scale = self->scale;
    s->growth_tracker = self->growth_tracker;
    s->skipped = self->skipped;
    *state_version = MX_STATE_VERSION;
    *data = s;
    *size = sizeof *s;
    return KILN_OK;
}

static int32_t mx_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    mx_state s;
    if (state_version != MX_STATE_VERSION || size != sizeof s)
        return mx_err(self, KILN_E_STATE, "mixed precision: scaler state version %u of %zu bytes, expected version %u "
                                          "of %zu bytes",
                      state_version, size, MX_STATE_VERSION, sizeof s);
    memcpy(&s, data, sizeof s);
    if (memcmp(s.magic, MX_STATE_MAGIC, 4) != 0 || !(s.scale > 0) || !isfinite(s.scale) || s.growth_tracker < 0)
        return mx_err(self, KILN_E_STATE, "mixed precision: the scaler state is corrupt (scale %g, tracker %lld)",
                      s.scale, (long long)s.growth_tracker);
    self->scale = s.scale;
    self->growth_tracker = s.growth_tracker;
    self->skipped = s.skipped;
    return KILN_OK;
}

/* ------------------------------------------------------------ descriptors */

static const kiln_precision_ops mx16_ops = {
    .base = {sizeof(kiln_precision_ops), 0, mx16_create, mx_destroy, mx_get_state, mx_set_state},
    .setup = mx_setup,
    .convert_params = mx_convert,
    .pre_backward = mx_pre_backward,
    .optimizer_step = mx_optimizer_step,
    .on_event = NULL,
};

static const kiln_precision_ops mxbf_ops = {
    .base = {sizeof(kiln_precision_ops), 0, mxbf_create, mx_destroy, NULL, NULL},
    .setup = mx_setup,
    .convert_params = mx_convert,
    .pre_backward = mx_pre_backward,
    .optimizer_step = mx_optimizer_step,
    .on_event = NULL,
};

static const kiln_param mx16_params[] = {
    {"init_scale", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(65536.0), "initial loss scale (GradScaler init_scale)"},
    {"growth_factor", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(2.0), "scale multiplier after growth_interval clean steps"},
    {"backoff_factor", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.5), "scale multiplier on a step with inf/NaN gradients"},
    {"growth_interval", KILN_TYPE_INT, 0, KILN_V_INT(2000), "clean optimizer steps before the scale grows"},
    {NULL, KILN_TYPE_NONE, 0, KILN_V_NONE, NULL},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const mx_checks[] = {"init_scale in (0, 3e38]", "growth_factor > 1", "backoff_factor in (0, 1)", "growth_interval >= 1"};
static const char *const mx16_aliases[] = {"16", "fp16", "16-mixed"};
static const kiln_kv mx16_props[] = {
    {"precision", KILN_V_STR("16-mixed")},
    {"amp_backend", KILN_V_STR("native")},
    {"amp_level", KILN_V_STR("none")}, /* apex's O0..O3; native AMP has none */
    {"param_dtype", KILN_V_STR("float32")},
    {"compute_dtype", KILN_V_STR("float16")},
    {"grad_dtype", KILN_V_STR("float32")},
    {"needs_grad_scaler", KILN_V_BOOL(1)},
    {"allows_repeated_closure", KILN_V_BOOL(0)},
    {"bits_per_weight", KILN_V_FLOAT(16.0)},
    {"aliases", KILN_V_STRS(mx16_aliases)},
    {"config_checks", KILN_V_STRS(mx_checks)},
    {NULL, KILN_V_NONE},
};

static const char *const mxbf_aliases[] = {"bf16"};
static const kiln_kv mxbf_props[] = {
    {"precision", KILN_V_STR("bf16-mixed")},
    {"amp_backend", KILN_V_STR("native")},
    {"amp_level", KILN_V_STR("none")}, /* apex's O0..O3; native AMP has none */
    {"param_dtype", KILN_V_STR("float32")},
    {"compute_dtype", KILN_V_STR("bfloat16")},
    {"grad_dtype", KILN_V_STR("float32")},
    {"needs_grad_scaler", KILN_V_BOOL(0)},
    {"allows_repeated_closure", KILN_V_BOOL(1)},
    {"bits_per_weight", KILN_V_FLOAT(16.0)},
    {"aliases", KILN_V_STRS(mxbf_aliases)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc mx16_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_PRECISION,
    .name = "16-mixed",
    .version = MX_VERSION,
    .description = "fp16 compute over fp32 master weights, dynamic loss scaling (GradScaler semantics)",
    .capabilities = KILN_CAP_DETERMINISTIC | KILN_CAP_STATEFUL,
    .properties = mx16_props,
    .params = mx16_params,
    .ops = &mx16_ops,
};

static const kiln_plugin_desc mxbf_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_PRECISION,
    .name = "bf16-mixed",
    .version = MX_VERSION,
    .description = "bf16 compute over fp32 master weights, no loss scaling",
    .capabilities = KILN_CAP_DETERMINISTIC,
    .properties = mxbf_props,
    .params = NULL,
    .ops = &mxbf_ops,
};

KILN_DEFINE_LIBRARY("mixed", MX_VERSION, 2, &mx16_desc, &mxbf_desc)
