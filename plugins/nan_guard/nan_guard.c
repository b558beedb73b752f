/*
 * nan_guard.c — the terminate_on_nan of Lightning 1.5 as a
 * callback plugin: it stops the run at the first non-finite value instead of
 * letting NaN spread silently through the weights. It checks the loss handed
 * to backward (ON_BEFORE_BACKWARD, the loss times the precision's scale),
 * every parameter's gradient after backward (ON_AFTER_BACKWARD) and every
 * parameter's master weights at the end of each training batch
 * (ON_TRAIN_BATCH_END), and fails the hook with KILN_E_NONFINITE and a line
 * naming the epoch, batch, global step and the first bad element
 * ("nan_guard: gradient of parameter layers.1.weight[523] is nan after
 * backward at epoch 2, batch 17, global step 877 ..."); the host then ends
 * the run with that line and a non-zero exit, leaving the last end-of-epoch
 * checkpoint as it was. Masters are float32 or float64 (kiln_param_dtype).
 * Under a precision with a gradient scaler (its "needs_grad_scaler" property,
 * 16-mixed) overflowing scaled gradients are expected — the scaler skips that
 * step and lowers the scale — so the gradient check is off there; the loss
 * and the weights are still checked. Values live in accelerator memory: the
 * accelerator's all_finite kernels give the quick answer, and only a failing
 * tensor is read back (in chunks) to find the first bad element. On a 1.9
 * table one sumsq_many call clears every tensor whose sum of squares is
 * finite, so a GPU waits once per check rather than once per parameter.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

#define NG_CHUNK 65536 /* elements read back per copy when locating a bad value */
#define NG_MSG_MAX 512

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    int check_loss, check_grads, check_params;
    /* the accelerator, looked up at the first check; kernels NULL when the
     * host has none (a mock): values are then plain host memory */
    int acc_looked_up;
    kiln_instance *acc;
    const kiln_kernels *kernels;
    void *scratch;          /* (NG_CHUNK) doubles' worth of bytes, host memory */
    /* the quick pass's list (ABI 1.9 sumsq_many) and its verdicts, (qcap)
     * entries each */
    const void **qx;
    size_t *qn;
    double *qs;
    unsigned char *qflag;
    uint32_t qcap;
    int scaler_noted;       /* the scaler exemption was logged once            */
};

/* Where a non-finite element was found. */
typedef struct ng_hit {
    int64_t index;          /* flat index of the first bad element             */
    double value;           /* its value (nan, inf or -inf)                    */
    int64_t count;          /* non-finite elements in the whole tensor         */
} ng_hit;

static const char *ng_fmt(double v) { return isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

static const kiln_trainer_state *ng_trainer(const kiln_instance *self, const kiln_event *ev) {
    if (ev->trainer) return ev->trainer;
    return self->svc->trainer_state ? self->svc->trainer_state(self->hctx) : NULL;
}

/* "at epoch 2, batch 17, global step 877" */
static void ng_where(const kiln_instance *self, const kiln_event *ev, char *buf, size_t n) {
    const kiln_trainer_state *ts = ng_trainer(self, ev);
    snprintf(buf, n, "at epoch %lld, batch %lld, global step %lld", (long long)(ts ? ts->current_epoch : -1),
             (long long)ev->batch_idx, (long long)(ts ? ts->global_step : -1));
}

/* ---------------------------------------------------------------------------
 * Scanning */

static void ng_lookup_accelerator(kiln_instance *self) {
    if (self->acc_looked_up) return;
    self->acc_looked_up = 1;
    kiln_instance *acc = NULL;
    const kiln_kernels *k = NULL;
    if (self->svc->accelerator && self->svc->accelerator(self->hctx, &acc, &k) == KILN_OK && k) {
        self->acc = acc;
        self->kernels = k;
    }
}

/* First non-finite element of host memory x(n) in `dtype` (F32 or F64),
 * counting them all; `base` is x's offset in the whole tensor. */
static void ng_scan_host(const void *x, uint32_t dtype, int64_t n, int64_t base, ng_hit *hit) {
    if (dtype == KILN_DTYPE_F64) {
        const double *d = x;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(d[i])) {
                if (hit->index < 0) { hit->index = base + i; hit->value = d[i]; }
                hit->count++;
            }
    } else {
        const float *f = x;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(f[i])) {
                if (hit->index < 0) { hit->index = base + i; hit->value = (double)f[i]; }
                hit->count++;
            }
    }
}

/* The accelerator's verdict on x(n): 1 finite, 0 not, -1 it cannot say
 * (no kernel for this dtype, or no accelerator). */
static int ng_kernel_finite(kiln_instance *self, const void *x, uint32_t dtype, int64_t n) {
    const kiln_kernels *k = self->kernels;
    if (!k) return -1;
    int32_t finite = 1;
    if (k->struct_size >= KILN_KERNELS_SIZE_1_2 && k->all_finite_ex) {
        if (k->all_finite_ex(self->acc, dtype, x, (size_t)n, &finite) != KILN_OK) return -1;
        return finite != 0;
    }
    if (dtype == KILN_DTYPE_F32 && k->all_finite) {
        if (k->all_finite(self->acc, x, (size_t)n, &finite) != KILN_OK) return -1;
        return finite != 0;
    }
    return -1;
}

/* Check tensor x(n) of `dtype`; *hit is filled (index >= 0) when a value is
 * not finite. Fails only when device memory cannot be read back. */
static int32_t ng_check_tensor(kiln_instance *self, const void *x, uint32_t dtype, int64_t n, ng_hit *hit) {
    hit->index = -1;
    hit->value = 0.0;
    hit->count = 0;
    if (!x || n <= 0) return KILN_OK;
    if (dtype != KILN_DTYPE_F32 && dtype != KILN_DTYPE_F64)
        return kiln_errorf(self->svc, self->hctx, KILN_E_UNSUPPORTED,
                           "nan_guard: parameters in %s are not supported (expected float32 or float64 masters)",
                           kiln_dtype_name(dtype));
    ng_lookup_accelerator(self);
    if (ng_kernel_finite(self, x, dtype, n) == 1) return KILN_OK;
    const kiln_kernels *k = self->kernels;
    if (!k || (k->flags & KILN_KERNELS_HOST_MEMORY)) {
        ng_scan_host(x, dtype, n, 0, hit);
        return KILN_OK;
    }
    /* Device memory: read it back a chunk at a time. */
    size_t esz = kiln_dtype_size(dtype);
    if (!self->scratch && !(self->scratch = malloc(NG_CHUNK * sizeof(double))))
        return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "nan_guard: out of memory");
    for (int64_t off = 0; off < n; off += NG_CHUNK) {
        int64_t m = n - off < NG_CHUNK ? n - off : NG_CHUNK;
        int32_t rc = k->copy(self->acc, self->scratch, (const char *)x + (size_t)off * esz, (size_t)m * esz,
                             KILN_COPY_D2H);
        if (rc != KILN_OK)
            return kiln_errorf(self->svc, self->hctx, rc, "nan_guard: reading %lld values back from the device failed",
                               (long long)m);
        ng_scan_host(self->scratch, dtype, m, off, hit);
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * The checks */

static int32_t ng_check_loss(kiln_instance *self, const kiln_event *ev) {
    if (isfinite(ev->loss)) return KILN_OK;
    char where[160];
    ng_where(self, ev, where, sizeof where);
    return kiln_errorf(self->svc, self->hctx, KILN_E_NONFINITE,
                       "nan_guard: the loss is %s before backward %s (the training_step loss times the loss scale); "
                       "expected a finite loss (lower the learning rate, or check the data)",
                       ng_fmt(ev->loss), where);
}

/* A frozen parameter (toggle_optimizer) got no gradient this backward:
 * whatever its grad holds is not this step's. */
static int ng_skipped(const kiln_parameter *p, int grads) { return !p || (grads && (p->flags & KILN_PARAMF_FROZEN)); }

/* The quick pass on a 1.9 table: every tensor's sum of squares in one
 * sumsq_many call (one wait on a GPU, where all_finite_ex per tensor waits
 * once each). A non-finite element makes its tensor's sum non-finite, so
 * finite sums clear every tensor; a float32 tensor's sum cannot overflow
 * the double it is added in. Sets qflag[i] = 1 where the sum is not
 * finite (that tensor then goes through the exact check, which also
 * clears a float64 tensor whose huge values only overflowed the sum).
 * Returns 0 when it ran, -1 when it cannot (older table, mixed dtypes, no
 * memory): then every tensor gets the exact check. */
static int ng_quick_pass(kiln_instance *self, kiln_parameter *const *list, uint32_t n, int grads) {
    const kiln_kernels *k = self->kernels;
    if (!k || k->struct_size < KILN_KERNELS_SIZE_1_9 || !k->sumsq_many || n == 0) return -1;
    uint32_t dt = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (ng_skipped(list[i], grads)) continue;
        const uint32_t d = kiln_param_dtype(list[i]);
        if (dt && d != dt) return -1;
        dt = d;
    }
    if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F64) return -1;
    if (n > self->qcap) {
        const void **qx = realloc(self->qx, n * sizeof *qx);
        if (qx) self->qx = qx;
        size_t *qn = realloc(self->qn, n * sizeof *qn);
        if (qn) self->qn = qn;
        double *qs = realloc(self->qs, n * sizeof *qs);
        if (qs) self->qs = qs;
        unsigned char *qf = realloc(self->qflag, n);
        if (qf) self->qflag = qf;
        if (!qx || !qn || !qs || !qf) return -1;
        self->qcap = n;
    }
    for (uint32_t i = 0; i < n; i++) {
        const kiln_parameter *p = list[i];
        const int skip = ng_skipped(p, grads);
        self->qx[i] = skip ? NULL : grads ? (const void *)p->grad : (const void *)p->data;
        self->qn[i] = self->qx[i] ? (size_t)p->numel : 0;
    }
    if (k->sumsq_many(self->acc, dt, self->qx, self->qn, n, self->qs) != KILN_OK) return -1;
    for (uint32_t i = 0; i < n; i++) self->qflag[i] = !isfinite(self->qs[i]);
    return 0;
}

/* Every parameter's grad (grads = 1) or data (grads = 0). `when` says where
 * in the step the check runs, for the message. */
static int32_t ng_check_params(kiln_instance *self, const kiln_event *ev, int grads, const char *when) {
    kiln_parameter *const *list = NULL;
    uint32_t n = 0;
    if (!self->svc->params || self->svc->params(self->hctx, &list, &n) != KILN_OK) return KILN_OK;
    ng_lookup_accelerator(self);
    const int quick = ng_quick_pass(self, list, n, grads) == 0;
    for (uint32_t i = 0; i < n; i++) {
        const kiln_parameter *p = list[i];
        if (ng_skipped(p, grads)) continue;
        if (quick && !self->qflag[i]) continue; /* its sum of squares is finite: so is every element */
        uint32_t dt = kiln_param_dtype(p);
        ng_hit hit;
        int32_t rc = ng_check_tensor(self, grads ? (const void *)p->grad : (const void *)p->data, dt, p->numel, &hit);
        if (rc != KILN_OK) return rc;
        if (hit.index < 0) continue;
        char where[160];
        ng_where(self, ev, where, sizeof where);
        return kiln_errorf(self->svc, self->hctx, KILN_E_NONFINITE,
                           "nan_guard: %sparameter %s[%lld] is %s %s %s (%lld of %lld %s values not finite); expected "
                           "finite %s (lower the learning rate, clip gradients, or check the data)",
                           grads ? "gradient of " : "", p->name ? p->name : "?", (long long)hit.index,
                           ng_fmt(hit.value), when, where, (long long)hit.count, (long long)p->numel,
                           kiln_dtype_name(dt), grads ? "gradients" : "weights");
    }
    return KILN_OK;
}

/* The precision scales the loss and skips steps whose gradients overflow. */
static int ng_uses_scaler(const kiln_trainer_state *ts) {
    if (!ts || ts->struct_size < KILN_TRAINER_STATE_SIZE_1_2 || !ts->precision) return 0;
    const kiln_value *v = kiln_kv_find(ts->precision, "needs_grad_scaler");
    return v && v->type == KILN_TYPE_BOOL && v->v.i != 0;
}

static int32_t ng_on_event(kiln_instance *self, kiln_event *ev) {
    if (!self || !ev) return KILN_E_INVALID_ARG;
    switch (ev->id) {
    case KILN_EV_ON_BEFORE_BACKWARD:
        return self->check_loss ? ng_check_loss(self, ev) : KILN_OK;
    case KILN_EV_ON_AFTER_BACKWARD: {
        if (!self->check_grads) return KILN_OK;
        const kiln_trainer_state *ts = ng_trainer(self, ev);
        if (ng_uses_scaler(ts)) {
            if (!self->scaler_noted) {
                const kiln_value *pv = kiln_kv_find(ts->precision, "precision");
                kiln_logf(self->svc, self->hctx, KILN_LOG_INFO,
                          "nan_guard: precision %s scales gradients and skips steps that overflow; gradients are not "
                          "checked (the loss and the weights are)",
                          pv && pv->type == KILN_TYPE_STRING ? pv->v.s : "(unnamed)");
                self->scaler_noted = 1;
            }
            return KILN_OK;
        }
        return ng_check_params(self, ev, 1, "after backward");
    }
    case KILN_EV_ON_TRAIN_BATCH_END:
        return self->check_params ? ng_check_params(self, ev, 0, "at the end of the batch") : KILN_OK;
    default:
        return KILN_OK;
    }
}

/* ---------------------------------------------------------------------------
 * Lifecycle */

static void ng_destroy(kiln_instance *self) {
    if (!self) return;
    free(self->scratch);
    free(self->qx);
    free(self->qn);
    free(self->qs);
    free(self->qflag);
    free(self);
}

static int32_t ng_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                         kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "nan_guard: out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->check_loss = kiln_kv_int(config, "check_loss", 1) != 0;
    self->check_grads = kiln_kv_int(config, "check_grads", 1) != 0;
    self->check_params = kiln_kv_int(config, "check_params", 1) != 0;
    *out = self;
    return KILN_OK;
}

static const kiln_callback_ops ng_ops = {
    .base = {.struct_size = sizeof(kiln_callback_ops), .create = ng_create, .destroy = ng_destroy},
    .on_event = ng_on_event,
};

static const kiln_param ng_params[] = {
    {"check_loss", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1), "fail when the loss given to backward is nan or inf"},
    {"check_grads", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1),
     "fail when a gradient is nan or inf after backward (off under a gradient scaler, e.g. 16-mixed)"},
    {"check_params", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1), "fail when a weight is nan or inf at the end of a batch"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

static const kiln_plugin_desc ng_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_CALLBACK,
    .name = "nan_guard",
    .version = "1.0.0",
    .description = "terminate_on_nan: stop the run at the first nan/inf loss, gradient or weight",
    .properties = NULL,
    .params = ng_params,
    .ops = &ng_ops,
};

KILN_DEFINE_LIBRARY("nan_guard", "1.0.0", 1, &ng_desc)
