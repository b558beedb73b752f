/*
 * adamw.c — the "adamw" optimizer plugin: torch.optim.AdamW (decoupled weight
 * decay, amsgrad off) over the accelerator's adamw_update kernel. The plugin
 * owns the parameter list, the first and second moment buffers m and v (one
 * pair per parameter in accelerator memory, allocated once in setup and
 * zero-filled by the accelerator, as PyTorch's zeros_like), and the step
 * count. PyTorch keeps a step per parameter, but every parameter steps
 * together, so one shared count is the same number. One deliberate
 * difference from torch's defaults: parameters flagged KILN_PARAMF_NO_DECAY
 * (biases, norms) get no weight decay unless decay_bias = true. torch.optim.
 * AdamW decays every parameter it is given; the usual recipe builds a second
 * parameter group with weight_decay 0 for biases, which this flag replaces.
 * Where the kernel table has ABI 1.10's adamw_update_many, a step is one
 * call for every parameter (a handful of GPU launches instead of one per
 * parameter), with the same bits as the per-parameter calls.
 * Nothing is allocated per step. State (version 1) is the step count, the
 * learning rate, m and v, checked against the parameter list on restore.
 * The cpu accelerator's fp32 update flushes subnormals to zero (see
 * kernels/cpu/cpu_internal.h, kc_ftz_begin): m and v below 1.2e-38 become 0
 * where PyTorch would keep them, as under torch.set_flush_denormal(True).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>
#include <kiln/optim_util.h>

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    /* hyperparameters as configured (rounded to float where they meet the
     * kernel table, whose arguments are float) */
    double lr, beta1, beta2, eps, weight_decay;
    int decay_bias;
    /* set by setup() */
    kiln_instance *acc;
    const kiln_kernels *k;
    kiln_parameter **params; /* (n) the parameters, in the order setup got them */
    float **m;               /* (n) first moments, each (params[i]->numel), accelerator */
    float **v;               /* (n) second moments, each (params[i]->numel), accelerator */
    uint32_t n;
    int64_t t;               /* completed steps; step() passes ++t (1-based) */
    /* the list adamw_update_many takes, refilled each step with the
     * parameters that have a gradient; NULL without the 1.10 entry */
    void **lp, **lm, **lv;   /* (n) data, first and second moments */
    const void **lg;         /* (n) gradients */
    size_t *ln;              /* (n) elements */
    double *lwd;             /* (n) weight decay */
};

/* State blob, version 1, native byte order:
 *   adamw_state_header
 *   int64_t numel[nparams]   sizes, checked against the parameters
 *   float   m[sum numel]     first moments, concatenated in parameter order
 *   float   v[sum numel]     second moments, likewise */
#define ADAMW_STATE_VERSION 1u
#define ADAMW_STATE_MAGIC "kiln-adw"
typedef struct adamw_state_header {
    char magic[8];
    uint32_t nparams;
    uint32_t reserved; /* 0 */
    int64_t t;
    double lr;
} adamw_state_header;

#define ADAMW_ERR(self, code, ...) kiln_errorf((self)->svc, (self)->hctx, (code), __VA_ARGS__)

/* ---------------------------------------------------------------- create */

static int32_t adamw_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                            const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    double lr = kiln_kv_float(config, "lr", 1e-3);
    double beta1 = kiln_kv_float(config, "beta1", 0.9);
    double beta2 = kiln_kv_float(config, "beta2", 0.999);
    double eps = kiln_kv_float(config, "eps", 1e-8);
    double weight_decay = kiln_kv_float(config, "weight_decay", 1e-2);
    int decay_bias = kiln_kv_int(config, "decay_bias", 0) != 0;

    /* torch.optim.AdamW's checks (`!(x >= 0)` also refuses NaN); infinities
     * are refused because they would only ever produce NaN weights. */
    if (!(lr >= 0.0) || !isfinite(lr))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "lr must be a finite number >= 0, got %g", lr);
    if (!(beta1 >= 0.0 && beta1 < 1.0))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "beta1 must be in [0, 1), got %g", beta1);
    if (!(beta2 >= 0.0 && beta2 < 1.0))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "beta2 must be in [0, 1), got %g", beta2);
    if (!(eps >= 0.0) || !isfinite(eps))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "eps must be a finite number >= 0, got %g", eps);
    if (!(weight_decay >= 0.0) || !isfinite(weight_decay))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "weight_decay must be a finite number >= 0, got %g",
                           weight_decay);

    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "cannot allocate the adamw instance");
    self->svc = svc;
    self->hctx = hctx;
    self->lr = lr;
    self->beta1 = beta1;
    self->beta2 = beta2;
    self->eps = eps;
    self->weight_decay = weight_decay;
    self->decay_bias = decay_bias;
    *out = self;
    return KILN_OK;
}

/* Frees what setup() built; the instance itself stays usable for a new setup. */
static void adamw_release(kiln_instance *self) {
    for (uint32_t i = 0; i < self->n; i++) {
        if (self->m && self->m[i]) self->k->free(self->acc, self->m[i]);
        if (self->v && self->v[i]) self->k->free(self->acc, self->v[i]);
    }
    free(self->m);
    free(self->v);
    free(self->params);
    free(self->lp), free(self->lg), free(self->lm), free(self->lv), free(self->ln), free(self->lwd);
    self->lp = self->lm = self->lv = NULL;
    self->lg = NULL;
    self->ln = NULL;
    self->lwd = NULL;
    self->m = self->v = NULL;
    self->params = NULL;
    self->n = 0;
    self->t = 0;
}

static void adamw_destroy(kiln_instance *self) {
    if (!self) return;
    adamw_release(self);
    free(self);
}

/* ----------------------------------------------------------------- setup */

/* The run's accelerator and its kernel table, which must reach adamw_update. */
static int32_t adamw_find_accelerator(kiln_instance *self, kiln_instance **acc, const kiln_kernels **k) {
    if (self->svc->abi_minor < 1 || !self->svc->accelerator)
        return ADAMW_ERR(self, KILN_E_UNSUPPORTED, "the host offers no accelerator service (needs ABI 1.1)");
    *acc = NULL;
    *k = NULL;
    int32_t rc = self->svc->accelerator(self->hctx, acc, k);
    if (rc != KILN_OK || !*k)
        return ADAMW_ERR(self, rc != KILN_OK ? rc : KILN_E_NOT_FOUND,
                         "no accelerator kernel table is available (accelerator service returned %s)",
                         kiln_status_name(rc));
    const kiln_kernels *t = *k;
    if (t->struct_size < offsetof(kiln_kernels, adamw_update) + sizeof t->adamw_update || !t->adamw_update ||
        !t->alloc || !t->free || !t->copy || !t->zero)
        return ADAMW_ERR(self, KILN_E_UNSUPPORTED,
                         "the accelerator's kernel table (struct_size %u) lacks adamw_update, alloc, free, copy or "
                         "zero",
                         (unsigned)t->struct_size);
    return KILN_OK;
}

static int32_t adamw_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t n) {
    kiln_instance *acc;
    const kiln_kernels *k;
    int32_t rc = adamw_find_accelerator(self, &acc, &k);
    if (rc != KILN_OK) return rc;
    if (n == 0 || !params) return ADAMW_ERR(self, KILN_E_INVALID_ARG, "adamw got an empty parameter list");
    for (uint32_t i = 0; i < n; i++) {
        const kiln_parameter *p = params[i];
        if (!p || p->numel < 0 || (p->numel > 0 && (!p->data || !p->grad)))
            return ADAMW_ERR(self, KILN_E_INVALID_ARG,
                             "parameter %u (%s) has no data/grad memory or a negative size", (unsigned)i,
                             p && p->name ? p->name : "?");
        const uint32_t dt = kiln_param_dtype(p);
        if (dt != KILN_DTYPE_F32 && (dt != KILN_DTYPE_F64 || k->struct_size < KILN_KERNELS_SIZE_1_2 ||
                                     !k->adamw_update_ex))
            return ADAMW_ERR(self, KILN_E_UNSUPPORTED,
                             "parameter %s has %s masters; adamw updates float32, and float64 through the ABI 1.2 "
                             "kernel adamw_update_ex (kernel table: %u bytes)",
                             p->name ? p->name : "?", kiln_dtype_name(dt), (unsigned)k->struct_size);
    }
    adamw_release(self); /* a second setup() replaces the first, freed with its own accelerator */
    self->acc = acc;
    self->k = k;
    self->params = calloc(n, sizeof *self->params);
    self->m = calloc(n, sizeof *self->m);
    self->v = calloc(n, sizeof *self->v);
    self->n = n;
    if (!self->params || !self->m || !self->v) {
        adamw_release(self);
        return ADAMW_ERR(self, KILN_E_NOMEM, "cannot allocate the bookkeeping of %u parameters", (unsigned)n);
    }
    memcpy(self->params, params, n * sizeof *self->params);
    if (k->struct_size >= KILN_KERNELS_SIZE_1_10 && k->adamw_update_many) {
        self->lp = calloc(n, sizeof *self->lp), self->lg = calloc(n, sizeof *self->lg);
        self->lm = calloc(n, sizeof *self->lm), self->lv = calloc(n, sizeof *self->lv);
        self->ln = calloc(n, sizeof *self->ln), self->lwd = calloc(n, sizeof *self->lwd);
        if (!self->lp || !self->lg || !self->lm || !self->lv || !self->ln || !self->lwd) {
            adamw_release(self);
            return ADAMW_ERR(self, KILN_E_NOMEM, "cannot allocate the update list of %u parameters", (unsigned)n);
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        if (params[i]->numel == 0) continue;
        size_t bytes = kiln_param_bytes(params[i]);
        void *m = NULL, *v = NULL;
        rc = self->k->alloc(self->acc, bytes, &m);
        if (rc == KILN_OK) {
            self->m[i] = m;
            rc = self->k->alloc(self->acc, bytes, &v);
            if (rc == KILN_OK) self->v[i] = v;
        }
        if (rc != KILN_OK) {
            adamw_release(self); /* the accelerator has described the failure */
            return rc;
        }
    }
    return KILN_OK;
}

/* ------------------------------------------------------------------ step */

/* The weight decay of one parameter: none for KILN_PARAMF_NO_DECAY unless
 * decay_bias (see the file comment for why this differs from torch). */
static double adamw_param_decay(const kiln_instance *self, const kiln_parameter *p) {
    return (p->flags & KILN_PARAMF_NO_DECAY) && !self->decay_bias ? 0.0 : self->weight_decay;
}

/* A hyperparameter as the update of dtype dt takes it: float32's rounded
 * to float (adamw_update's argument type, so the bits do not change). */
static double adamw_hp(double x, uint32_t dt) { return dt == KILN_DTYPE_F32 ? (double)(float)x : x; }

/* 1.10: every parameter with a gradient in one adamw_update_many call per
 * master dtype. float32 passes the hyperparameters rounded to float, as
 * adamw_update takes them, so the bits are those of the loop below. */
static int32_t adamw_step_many(kiln_instance *self, int64_t step) {
    static const uint32_t dtypes[2] = {KILN_DTYPE_F32, KILN_DTYPE_F64};
    for (int d = 0; d < 2; d++) {
        const uint32_t dt = dtypes[d];
        uint32_t c = 0;
        for (uint32_t i = 0; i < self->n; i++) {
            kiln_parameter *p = self->params[i];
            if (p->numel == 0 || !kiln_param_has_grad(p) || kiln_param_dtype(p) != dt) continue;
            self->lp[c] = p->data, self->lg[c] = p->grad, self->lm[c] = self->m[i], self->lv[c] = self->v[i];
            self->ln[c] = (size_t)p->numel;
            self->lwd[c] = adamw_hp(adamw_param_decay(self, p), dt);
            c++;
        }
        if (c == 0) continue;
        int32_t rc = self->k->adamw_update_many(self->acc, dt, c, self->lp, self->lg, self->lm, self->lv, self->ln,
                                                self->lwd, adamw_hp(self->lr, dt), adamw_hp(self->beta1, dt),
                                                adamw_hp(self->beta2, dt), adamw_hp(self->eps, dt), step);
        if (rc != KILN_OK) return rc;
    }
    return KILN_OK;
}

static int32_t adamw_step(kiln_instance *self, const kiln_closure *closure) {
    if (!self->params) return ADAMW_ERR(self, KILN_E_STATE, "step() before setup()");
    if (closure && closure->call) {
        double loss = NAN;
        int32_t rc = closure->call(closure->ctx, &loss);
        if (rc != KILN_OK) return rc; /* the closure reported its own error */
    }
    /* no gradient anywhere (a training_step without a loss): torch's AdamW
     * skips every p.grad-is-None parameter, its step count included */
    if (!kiln_params_any_grad(self->params, self->n)) return KILN_OK;
    const int64_t step = ++self->t;
    if (self->lp) return adamw_step_many(self, step);
    const float lr = (float)self->lr, beta1 = (float)self->beta1, beta2 = (float)self->beta2,
                eps = (float)self->eps;
    for (uint32_t i = 0; i < self->n; i++) {
        kiln_parameter *p = self->params[i];
        if (p->numel == 0 || !kiln_param_has_grad(p)) continue;
        int32_t rc;
        if (kiln_param_dtype(p) == KILN_DTYPE_F64) /* 64-true: the same update in double */
            rc = self->k->adamw_update_ex(self->acc, KILN_DTYPE_F64, p->data, p->grad, self->m[i], self->v[i],
                                          (size_t)p->numel, self->lr, self->beta1, self->beta2, self->eps,
                                          adamw_param_decay(self, p), step);
        else
            rc = self->k->adamw_update(self->acc, p->data, p->grad, self->m[i], self->v[i], (size_t)p->numel, lr,
                                       beta1, beta2, eps, (float)adamw_param_decay(self, p), step);
        if (rc != KILN_OK) return rc;
    }
    return KILN_OK;
}

static int32_t adamw_zero_grad(kiln_instance *self) {
    if (!self->params) return ADAMW_ERR(self, KILN_E_STATE, "zero_grad() before setup()");
    return kiln_params_zero_grad(self->k, self->acc, self->params, self->n);
}

static double adamw_get_lr(kiln_instance *self) { return self->lr; }

static int32_t adamw_set_lr(kiln_instance *self, double lr) {
    if (!(lr >= 0.0) || !isfinite(lr))
        return ADAMW_ERR(self, KILN_E_INVALID_ARG, "lr must be a finite number >= 0, got %g", lr);
    self->lr = lr;
    return KILN_OK;
}

/* ----------------------------------------------------------------- state */

static int32_t adamw_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    if (!self->params) return ADAMW_ERR(self, KILN_E_STATE, "get_state() before setup()");
    size_t bytes = sizeof(adamw_state_header) + (size_t)self->n * sizeof(int64_t) +
                   2 * kiln_params_bytes(self->params, self->n);
    unsigned char *blob = self->svc->alloc(self->hctx, bytes, 16);
    if (!blob) return ADAMW_ERR(self, KILN_E_NOMEM, "cannot allocate %zu bytes for the adamw state", bytes);

    adamw_state_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, ADAMW_STATE_MAGIC, sizeof h.magic);
    h.nparams = self->n;
    h.t = self->t;
    h.lr = self->lr;
    memcpy(blob, &h, sizeof h);
    size_t off = sizeof h;
    kiln_params_write_sizes(self->params, self->n, blob, &off);
    int32_t rc = kiln_params_save_bufs(self->k, self->acc, self->params, self->n, self->m, blob, &off);
    if (rc == KILN_OK) rc = kiln_params_save_bufs(self->k, self->acc, self->params, self->n, self->v, blob, &off);
    if (rc != KILN_OK) {
        self->svc->free(self->hctx, blob);
        return rc;
    }
    *state_version = ADAMW_STATE_VERSION;
    *data = blob;
    *size = bytes;
    return KILN_OK;
}

/* Everything is validated before anything changes, so a refused blob leaves
 * the optimizer exactly as it was. */
static int32_t adamw_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    if (state_version != ADAMW_STATE_VERSION)
        return ADAMW_ERR(self, KILN_E_STATE,
                         "adamw state version %u is not supported (this build reads version %u)",
                         (unsigned)state_version, ADAMW_STATE_VERSION);
    if (!self->params)
        return ADAMW_ERR(self, KILN_E_STATE, "set_state() before setup(): no parameters to match");
    const unsigned char *blob = data;
    adamw_state_header h;
    if (!blob || size < sizeof h)
        return ADAMW_ERR(self, KILN_E_STATE, "adamw state is %zu bytes, shorter than its %zu-byte header", size,
                         sizeof h);
    memcpy(&h, blob, sizeof h);
    if (memcmp(h.magic, ADAMW_STATE_MAGIC, sizeof h.magic) != 0)
        return ADAMW_ERR(self, KILN_E_STATE, "not an adamw state (wrong magic)");
    if (h.nparams != self->n)
        return ADAMW_ERR(self, KILN_E_STATE, "adamw state holds %u parameters, the optimizer has %u",
                         (unsigned)h.nparams, (unsigned)self->n);
    if (h.t < 0 || !(h.lr >= 0.0) || !isfinite(h.lr))
        return ADAMW_ERR(self, KILN_E_STATE, "adamw state header is corrupt (step %lld, lr %g)", (long long)h.t,
                         h.lr);
    size_t off = sizeof h;
    if (size < off + (size_t)self->n * sizeof(int64_t))
        return ADAMW_ERR(self, KILN_E_STATE, "adamw state is %zu bytes, too short for %u parameter sizes", size,
                         (unsigned)self->n);
    int64_t numel;
    int64_t bad = kiln_params_check_sizes(self->params, self->n, blob, &off, &numel);
    if (bad >= 0)
        return ADAMW_ERR(self, KILN_E_STATE,
                             "adamw state: parameter %u (%s) has %lld elements there, %lld here", (unsigned)bad,
                       self->params[bad]->name ? self->params[bad]->name : "?", (long long)numel,
                       (long long)self->params[bad]->numel);
    size_t expect = off + 2 * kiln_params_bytes(self->params, self->n);
    if (size != expect)
        return ADAMW_ERR(self, KILN_E_STATE, "adamw state is %zu bytes, expected %zu for these parameters", size,
                         expect);

    int32_t rc = kiln_params_load_bufs(self->k, self->acc, self->params, self->n, self->m, blob, &off);
    if (rc == KILN_OK) rc = kiln_params_load_bufs(self->k, self->acc, self->params, self->n, self->v, blob, &off);
    if (rc != KILN_OK) return rc;
    self->t = h.t;
    self->lr = h.lr;
    return KILN_OK;
}

/* ------------------------------------------------------------ descriptor */

static const kiln_optimizer_ops adamw_ops = {
    .base = {sizeof(kiln_optimizer_ops), 0, adamw_create, adamw_destroy, adamw_get_state, adamw_set_state},
    .setup = adamw_setup,
    .step = adamw_step,
    .zero_grad = adamw_zero_grad,
    .get_lr = adamw_get_lr,
    .set_lr = adamw_set_lr,
};

static const kiln_param adamw_params[] = {
    {"lr", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1e-3), "learning rate (>= 0)"},
    {"beta1", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.9), "decay of the first moment, in [0, 1)"},
    {"beta2", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.999), "decay of the second moment, in [0, 1)"},
    {"eps", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1e-8), "added to the denominator (>= 0)"},
    {"weight_decay", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1e-2), "decoupled weight decay (>= 0)"},
    {"decay_bias", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0),
     "also decay no-decay parameters (biases); torch decays all, kiln skips them by default"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* Master dtypes this optimizer updates (host/stack_checks.c reads it). */
static const char *const adamw_param_dtypes[] = {"float32", "float64"};
/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const adamw_checks[] = {"lr >= 0", "beta1 in [0, 1)", "beta2 in [0, 1)", "eps >= 0", "weight_decay >= 0"};
static const kiln_kv adamw_props[] = {
    {"param_dtypes", KILN_V_STRS(adamw_param_dtypes)},
    {"config_checks", KILN_V_STRS(adamw_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc adamw_desc = {
    sizeof(kiln_plugin_desc),
    KILN_KIND_OPTIMIZER,
    "adamw",
    "0.1.0",
    "Adam with decoupled weight decay (torch.optim.AdamW), no decay on biases by default",
    KILN_CAP_STATEFUL | KILN_CAP_DETERMINISTIC,
    adamw_props,
    adamw_params,
    &adamw_ops,
    NULL,
};

KILN_DEFINE_LIBRARY("adamw", "0.1.0", 1, &adamw_desc)
