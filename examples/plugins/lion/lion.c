/*
 * lion.c — "lion", an out-of-tree optimizer plugin: the Lion optimizer
 * (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"; the
 * lion-pytorch reference) built only from kiln's kernel table, so it updates
 * on whatever accelerator the run uses — host memory or a GPU — without
 * reading or writing parameter memory itself. Per parameter with a gradient,
 * in this order:
 *
 *   c = lerp(m, g, 1 - beta1)           = beta1 * m + (1 - beta1) * g
 *   c = sign(c)
 *   p = p * (1 - lr * weight_decay)     (decoupled decay; none for biases
 *                                        flagged KILN_PARAMF_NO_DECAY)
 *   p = p + (-lr) * c                   i.e. p -= lr * (sign(c) + wd * p)
 *   m = lerp(m, g, 1 - beta2)           = beta2 * m + (1 - beta2) * g
 *
 * with the ABI 1.5 entries lerp and sign and the 1.2 entries scale_ex and
 * axpy_ex, in the parameters' own dtype (float32 or float64 masters). The
 * plugin owns the momentum m (one buffer per parameter, zero-filled by the
 * accelerator's alloc) and one scratch buffer c as long as the largest
 * parameter. A parameter without a gradient this step (KILN_PARAMF_NO_GRAD,
 * kiln_param_has_grad) is skipped entirely — no decay, no momentum change —
 * as torch optimizers skip p.grad is None. State (version 1): the step
 * count, the learning rate and the momenta, through kiln/optim_util.h's
 * helpers (the sizes recorded so another model's state is refused), so a
 * resumed run continues bit for bit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>
#include <kiln/optim_util.h>

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    double lr, beta1, beta2, weight_decay; /* as configured */
    int decay_bias;
    /* set by setup() */
    kiln_instance *acc;
    const kiln_kernels *k;
    kiln_parameter **params; /* (n) in the order setup got them */
    float **m;               /* (n) momenta, each (params[i]->numel) of the master dtype, accelerator */
    void *c;                 /* (max numel) scratch for sign(interpolation), accelerator */
    uint32_t n;
    int64_t steps;           /* completed steps (for the state; Lion has no bias correction) */
};

/* State blob, version 1, native byte order:
 *   lion_state_header
 *   int64_t numel[nparams]   sizes, checked against the parameters
 *   m[sum numel]             momenta in the master dtype, in parameter order */
#define LION_STATE_VERSION 1u
#define LION_STATE_MAGIC "kiln-lio"
typedef struct lion_state_header {
    char magic[8];
    uint32_t nparams;
    uint32_t reserved; /* 0 */
    int64_t steps;
    double lr;
} lion_state_header;

#define LION_ERR(self, code, ...) kiln_errorf((self)->svc, (self)->hctx, (code), __VA_ARGS__)

/* ---------------------------------------------------------------- create */

static int32_t lion_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                           const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const double lr = kiln_kv_float(config, "lr", 1e-4), beta1 = kiln_kv_float(config, "beta1", 0.9),
                 beta2 = kiln_kv_float(config, "beta2", 0.99), wd = kiln_kv_float(config, "weight_decay", 0.0);
    /* `!(x >= 0)` also refuses NaN */
    if (!(lr >= 0.0) || !isfinite(lr))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "lion: lr must be a finite number >= 0, got %g", lr);
    if (!(beta1 >= 0.0 && beta1 <= 1.0))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "lion: beta1 must be in [0, 1], got %g", beta1);
    if (!(beta2 >= 0.0 && beta2 <= 1.0))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "lion: beta2 must be in [0, 1], got %g", beta2);
    if (!(wd >= 0.0) || !isfinite(wd))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "lion: weight_decay must be a finite number >= 0, got %g", wd);
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "lion: cannot allocate the instance");
    self->svc = svc;
    self->hctx = hctx;
    self->lr = lr;
    self->beta1 = beta1;
    self->beta2 = beta2;
    self->weight_decay = wd;
    self->decay_bias = kiln_kv_int(config, "decay_bias", 0) != 0;
    *out = self;
    return KILN_OK;
}

/* Frees what setup() built; the instance stays usable for a new setup. */
static void lion_release(kiln_instance *self) {
    if (self->m) {
        for (uint32_t i = 0; i < self->n; i++)
            if (self->m[i]) self->k->free(self->acc, self->m[i]);
        free(self->m);
    }
    if (self->c) self->k->free(self->acc, self->c);
    free(self->params);
    self->m = NULL;
    self->c = NULL;
    self->params = NULL;
    self->n = 0;
    self->steps = 0;
}

static void lion_destroy(kiln_instance *self) {
    if (!self) return;
    lion_release(self);
    free(self);
}

/* ----------------------------------------------------------------- setup */

/* The run's kernel table must have the 1.5 entries Lion is made of. */
static int32_t lion_find_accelerator(kiln_instance *self, kiln_instance **acc, const kiln_kernels **k) {
    if (self->svc->abi_minor < 1 || !self->svc->accelerator)
        return LION_ERR(self, KILN_E_UNSUPPORTED, "lion: the host offers no accelerator service (needs ABI 1.1)");
    *acc = NULL;
    *k = NULL;
    int32_t rc = self->svc->accelerator(self->hctx, acc, k);
    if (rc != KILN_OK || !*k)
        return LION_ERR(self, rc != KILN_OK ? rc : KILN_E_NOT_FOUND,
                        "lion: no accelerator kernel table is available (accelerator service returned %s)",
                        kiln_status_name(rc));
    const kiln_kernels *t = *k;
    if (t->struct_size < KILN_KERNELS_SIZE_1_5)
        return LION_ERR(self, KILN_E_UNSUPPORTED,
                        "lion: needs the ABI 1.5 kernel entries lerp and sign; the accelerator's table is %u bytes, "
                        "expected at least %u",
                        (unsigned)t->struct_size, (unsigned)KILN_KERNELS_SIZE_1_5);
    const char *missing = !t->lerp ? "lerp" : !t->sign ? "sign" : !t->scale_ex ? "scale_ex" : !t->axpy_ex ? "axpy_ex"
                          : !t->alloc || !t->free || !t->copy || !t->zero ? "alloc/free/copy/zero" : NULL;
    if (missing)
        return LION_ERR(self, KILN_E_UNSUPPORTED, "lion: the accelerator's kernel table has no %s entry", missing);
    return KILN_OK;
}

static int32_t lion_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t n) {
    kiln_instance *acc;
    const kiln_kernels *k;
    int32_t rc = lion_find_accelerator(self, &acc, &k);
    if (rc != KILN_OK) return rc;
    if (n == 0 || !params) return LION_ERR(self, KILN_E_INVALID_ARG, "lion: got an empty parameter list");
    size_t most = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kiln_parameter *p = params[i];
        if (!p || p->numel < 0 || (p->numel > 0 && (!p->data || !p->grad)))
            return LION_ERR(self, KILN_E_INVALID_ARG,
                            "lion: parameter %u (%s) has no data/grad memory or a negative size", (unsigned)i,
                            p && p->name ? p->name : "?");
        const uint32_t dt = kiln_param_dtype(p);
        if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F64)
            return LION_ERR(self, KILN_E_UNSUPPORTED, "lion: parameter %s has %s masters; expected float32 or float64",
                            p->name ? p->name : "?", kiln_dtype_name(dt));
        if (kiln_param_bytes(p) > most) most = kiln_param_bytes(p);
    }
    lion_release(self); /* a second setup() replaces the first */
    self->acc = acc;
    self->k = k;
    self->params = calloc(n, sizeof *self->params);
    self->m = calloc(n, sizeof *self->m);
    if (!self->params || !self->m) {
        free(self->params), free(self->m);
        self->params = NULL, self->m = NULL;
        return LION_ERR(self, KILN_E_NOMEM, "lion: cannot allocate the lists of %u parameters", (unsigned)n);
    }
    memcpy(self->params, params, n * sizeof *self->params);
    self->n = n;
    for (uint32_t i = 0; i < n; i++) {
        if (params[i]->numel == 0) continue;
        void *b = NULL; /* zero-filled: Lion's exp_avg starts at 0 */
        if ((rc = k->alloc(acc, kiln_param_bytes(params[i]), &b)) != KILN_OK) {
            lion_release(self); /* the accelerator has described the failure */
            return rc;
        }
        self->m[i] = b;
    }
    if (most > 0 && (rc = k->alloc(acc, most, &self->c)) != KILN_OK) {
        lion_release(self);
        return rc;
    }
    return KILN_OK;
}

/* ------------------------------------------------------------------ step */

/* One parameter's update, every operation on the accelerator. */
static int32_t lion_update(kiln_instance *self, kiln_parameter *p, void *m) {
    const kiln_kernels *k = self->k;
    const uint32_t dt = kiln_param_dtype(p);
    const size_t n = (size_t)p->numel;
    const double wd = (p->flags & KILN_PARAMF_NO_DECAY) && !self->decay_bias ? 0.0 : self->weight_decay;
    int32_t rc;
    if ((rc = k->lerp(self->acc, dt, self->c, m, p->grad, 1.0 - self->beta1, n)) != KILN_OK) return rc;
    if ((rc = k->sign(self->acc, dt, self->c, self->c, n)) != KILN_OK) return rc;
    if (wd != 0.0 && (rc = k->scale_ex(self->acc, dt, p->data, 1.0 - self->lr * wd, n)) != KILN_OK) return rc;
    if ((rc = k->axpy_ex(self->acc, dt, p->data, -self->lr, self->c, n)) != KILN_OK) return rc;
    return k->lerp(self->acc, dt, m, m, p->grad, 1.0 - self->beta2, n);
}

static int32_t lion_step(kiln_instance *self, const kiln_closure *closure) {
    if (!self->params) return LION_ERR(self, KILN_E_STATE, "lion: step() before setup()");
    if (closure && closure->call) {
        double loss = NAN;
        int32_t rc = closure->call(closure->ctx, &loss);
        if (rc != KILN_OK) return rc; /* the closure reported its own error */
    }
    /* no gradient anywhere (a training_step without a loss): nothing moves,
     * not even the step count, as a torch optimizer whose every p.grad is None */
    if (!kiln_params_any_grad(self->params, self->n)) return KILN_OK;
    for (uint32_t i = 0; i < self->n; i++) {
        kiln_parameter *p = self->params[i];
        if (p->numel == 0 || !kiln_param_has_grad(p)) continue;
        int32_t rc = lion_update(self, p, self->m[i]);
        if (rc != KILN_OK) return rc;
    }
    self->steps++;
    return KILN_OK;
}

static int32_t lion_zero_grad(kiln_instance *self) {
    if (!self->params) return LION_ERR(self, KILN_E_STATE, "lion: zero_grad() before setup()");
    return kiln_params_zero_grad(self->k, self->acc, self->params, self->n);
}

static double lion_get_lr(kiln_instance *self) { return self->lr; }

static int32_t lion_set_lr(kiln_instance *self, double lr) {
    if (!(lr >= 0.0) || !isfinite(lr))
        return LION_ERR(self, KILN_E_INVALID_ARG, "lion: lr must be a finite number >= 0, got %g", lr);
    self->lr = lr;
    return KILN_OK;
}

/* ----------------------------------------------------------------- state */

static int32_t lion_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    if (!self->params) return LION_ERR(self, KILN_E_STATE, "lion: get_state() before setup()");
    const size_t bytes =
        sizeof(lion_state_header) + (size_t)self->n * sizeof(int64_t) + kiln_params_bytes(self->params, self->n);
    unsigned char *blob = self->svc->alloc(self->hctx, bytes, 16);
    if (!blob) return LION_ERR(self, KILN_E_NOMEM, "lion: cannot allocate %zu bytes for the state", bytes);
    lion_state_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, LION_STATE_MAGIC, sizeof h.magic);
    h.nparams = self->n;
    h.steps = self->steps;
    h.lr = self->lr;
    memcpy(blob, &h, sizeof h);
    size_t off = sizeof h;
    kiln_params_write_sizes(self->params, self->n, blob, &off);
    int32_t rc = kiln_params_save_bufs(self->k, self->acc, self->params, self->n, self->m, blob, &off);
    if (rc != KILN_OK) {
        self->svc->free(self->hctx, blob);
        return rc;
    }
    *state_version = LION_STATE_VERSION;
    *data = blob;
    *size = bytes;
    return KILN_OK;
}

/* Everything is validated before anything changes: a refused blob leaves
 * the optimizer as it was. */
static int32_t lion_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    if (state_version != LION_STATE_VERSION)
        return LION_ERR(self, KILN_E_STATE, "lion: state version %u is not supported (this build reads version %u)",
                        (unsigned)state_version, LION_STATE_VERSION);
    if (!self->params) return LION_ERR(self, KILN_E_STATE, "lion: set_state() before setup(): no parameters to match");
    const unsigned char *blob = data;
    lion_state_header h;
    if (!blob || size < sizeof h)
        return LION_ERR(self, KILN_E_STATE, "lion: state is %zu bytes, shorter than its %zu-byte header", size,
                        sizeof h);
    memcpy(&h, blob, sizeof h);
    if (memcmp(h.magic, LION_STATE_MAGIC, sizeof h.magic) != 0)
        return LION_ERR(self, KILN_E_STATE, "lion: not a lion state (wrong magic)");
    if (h.nparams != self->n)
        return LION_ERR(self, KILN_E_STATE, "lion: state holds %u parameters, the optimizer has %u",
                        (unsigned)h.nparams, (unsigned)self->n);
    if (h.reserved != 0 || h.steps < 0 || !(h.lr >= 0.0) || !isfinite(h.lr))
        return LION_ERR(self, KILN_E_STATE, "lion: state header is corrupt (steps %lld, lr %g)", (long long)h.steps,
                        h.lr);
    size_t off = sizeof h;
    if (size < off + (size_t)self->n * sizeof(int64_t))
        return LION_ERR(self, KILN_E_STATE, "lion: state is %zu bytes, too short for %u parameter sizes", size,
                        (unsigned)self->n);
    int64_t numel;
    const int64_t bad = kiln_params_check_sizes(self->params, self->n, blob, &off, &numel);
    if (bad >= 0)
        return LION_ERR(self, KILN_E_STATE, "lion: state: parameter %u (%s) has %lld elements there, %lld here",
                        (unsigned)bad, self->params[bad]->name ? self->params[bad]->name : "?", (long long)numel,
                        (long long)self->params[bad]->numel);
    const size_t expect = off + kiln_params_bytes(self->params, self->n);
    if (size != expect)
        return LION_ERR(self, KILN_E_STATE, "lion: state is %zu bytes, expected %zu for these parameters", size,
                        expect);
    int32_t rc = kiln_params_load_bufs(self->k, self->acc, self->params, self->n, self->m, blob, &off);
    if (rc != KILN_OK) return rc;
    self->steps = h.steps;
    self->lr = h.lr;
    return KILN_OK;
}

/* ------------------------------------------------------------ descriptor */

static const kiln_optimizer_ops lion_ops = {
    .base = {sizeof(kiln_optimizer_ops), 0, lion_create, lion_destroy, lion_get_state, lion_set_state},
    .setup = lion_setup,
    .step = lion_step,
    .zero_grad = lion_zero_grad,
    .get_lr = lion_get_lr,
    .set_lr = lion_set_lr,
};

static const kiln_param lion_params[] = {
    {"lr", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1e-4), "learning rate (>= 0; Lion wants 3-10x less than AdamW)"},
    {"beta1", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.9), "interpolation of the update direction, in [0, 1]"},
    {"beta2", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.99), "momentum decay, in [0, 1]"},
    {"weight_decay", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0), "decoupled weight decay (>= 0)"},
    {"decay_bias", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "also decay parameters flagged no-decay (biases)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

static const char *const lion_param_dtypes[] = {"float32", "float64"};
static const kiln_kv lion_props[] = {
    {"param_dtypes", KILN_V_STRS(lion_param_dtypes)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc lion_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_OPTIMIZER,
    .name = "lion",
    .version = "1.0.0",
    .description = "Lion (sign of an interpolated momentum), entirely through the kernel table",
    .capabilities = KILN_CAP_STATEFUL | KILN_CAP_DETERMINISTIC,
    .properties = lion_props,
    .params = lion_params,
    .ops = &lion_ops,
};

/* min_host_minor 5: the kernel entries lerp and sign are ABI 1.5's */
KILN_DEFINE_LIBRARY("lion", "1.0.0", 5, &lion_desc)
