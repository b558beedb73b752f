/*
 * sgd.c — the "sgd" optimizer plugin: torch.optim.SGD (momentum, dampening,
 * Nesterov, L2 weight decay applied to every parameter, as torch does) over
 * the accelerator's sgd_update kernel. The plugin owns only bookkeeping: the
 * parameter list, one momentum buffer per parameter in accelerator memory
 * (allocated once in setup, and only when momentum != 0, as PyTorch keeps no
 * state without momentum), and whether those buffers hold momentum yet
 * (PyTorch's `momentum_buffer is None`, which makes the first step copy the
 * gradient into the buffer instead of blending). Nothing is allocated per
 * step; the per-element work is the kernel's. State (version 1) is the step
 * count, the learning rate and the buffers, checked against the parameter
 * list on restore so a checkpoint of another model is refused, not misread.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>
#include <kiln/optim_util.h>

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    /* hyperparameters as configured (doubles, like PyTorch's Python floats;
     * rounded to float where they meet the kernel) */
    double lr, momentum, dampening, weight_decay;
    int nesterov;
    /* set by setup() */
    kiln_instance *acc;
    const kiln_kernels *k;
    kiln_parameter **params; /* (n) the parameters, in the order setup got them */
    float **bufs;            /* (n) momentum buffers, each (params[i]->numel) on the
                                accelerator; NULL when momentum == 0 */
    uint32_t n;
    int64_t steps;           /* completed step() calls */
    int bufs_ready;          /* the buffers hold momentum (not before the first step) */
};

/* State blob, version 1, native byte order:
 *   sgd_state_header
 *   int64_t numel[nparams]              sizes, checked against the parameters
 *   float   buf[sum numel]              only when has_buffers: the momentum
 *                                       buffers, concatenated in parameter order */
#define SGD_STATE_VERSION 1u
#define SGD_STATE_MAGIC "kiln-sgd"
typedef struct sgd_state_header {
    char magic[8];
    uint32_t nparams;
    uint32_t has_buffers;
    int64_t steps;
    double lr;
} sgd_state_header;

#define SGD_ERR(self, code, ...) kiln_errorf((self)->svc, (self)->hctx, (code), __VA_ARGS__)

/* ---------------------------------------------------------------- create */

static int32_t sgd_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                          const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    double lr = kiln_kv_float(config, "lr", 0.01);
    double momentum = kiln_kv_float(config, "momentum", 0.0);
    double dampening = kiln_kv_float(config, "dampening", 0.0);
    double weight_decay = kiln_kv_float(config, "weight_decay", 0.0);
    int nesterov = kiln_kv_int(config, "nesterov", 0) != 0;

    /* torch.optim.SGD's checks; `!(x >= 0)` also refuses NaN, and infinities
     * are refused because they would only ever produce NaN weights. */
    if (!(lr >= 0.0) || !isfinite(lr))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "lr must be a finite number >= 0, got %g", lr);
    if (!(momentum >= 0.0) || !isfinite(momentum))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "momentum must be a finite number >= 0, got %g", momentum);
    if (!isfinite(dampening))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "dampening must be a finite number, got %g", dampening);
    if (!(weight_decay >= 0.0) || !isfinite(weight_decay))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "weight_decay must be a finite number >= 0, got %g",
                           weight_decay);
    if (nesterov && (momentum <= 0.0 || dampening != 0.0))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "nesterov = true requires momentum > 0 and dampening = 0, got momentum = %g and "
                           "dampening = %g",
                           momentum, dampening);

    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "cannot allocate the sgd instance");
    self->svc = svc;
    self->hctx = hctx;
    self->lr = lr;
    self->momentum = momentum;
    self->dampening = dampening;
    self->weight_decay = weight_decay;
    self->nesterov = nesterov;
    *out = self;
    return KILN_OK;
}

/* Frees what setup() built; the instance itself stays usable for a new setup. */
static void sgd_release(kiln_instance *self) {
    if (self->bufs) {
        for (uint32_t i = 0; i < self->n; i++)
            if (self->bufs[i]) self->k->free(self->acc, self->bufs[i]);
        free(self->bufs);
    }
    free(self->params);
    self->bufs = NULL;
    self->params = NULL;
    self->n = 0;
    self->steps = 0;
    self->bufs_ready = 0;
}

static void sgd_destroy(kiln_instance *self) {
    if (!self) return;
    sgd_release(self);
    free(self);
}

/* ----------------------------------------------------------------- setup */

/* The run's accelerator and its kernel table, which must reach sgd_update. */
static int32_t sgd_find_accelerator(kiln_instance *self, kiln_instance **acc, const kiln_kernels **k) {
    if (self->svc->abi_minor < 1 || !self->svc->accelerator)
        return SGD_ERR(self, KILN_E_UNSUPPORTED, "the host offers no accelerator service (needs ABI 1.1)");
    *acc = NULL;
    *k = NULL;
    int32_t rc = self->svc->accelerator(self->hctx, acc, k);
    if (rc != KILN_OK || !*k)
        return SGD_ERR(self, rc != KILN_OK ? rc : KILN_E_NOT_FOUND,
                       "no accelerator kernel table is available (accelerator service returned %s)",
                       kiln_status_name(rc));
    const kiln_kernels *t = *k;
    if (t->struct_size < offsetof(kiln_kernels, sgd_update) + sizeof t->sgd_update || !t->sgd_update ||
        !t->alloc || !t->free || !t->copy || !t->zero)
        return SGD_ERR(self, KILN_E_UNSUPPORTED,
                       "the accelerator's kernel table (struct_size %u) lacks sgd_update, alloc, free, copy or zero",
                       (unsigned)t->struct_size);
    return KILN_OK;
}

static int32_t sgd_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t n) {
    kiln_instance *acc;
    const kiln_kernels *k;
    int32_t rc = sgd_find_accelerator(self, &acc, &k);
    if (rc != KILN_OK) return rc;
    if (n == 0 || !params) return SGD_ERR(self, KILN_E_INVALID_ARG, "sgd got an empty parameter list");
    for (uint32_t i = 0; i < n; i++) {
        const kiln_parameter *p = params[i];
        if (!p || p->numel < 0 || (p->numel > 0 && (!p->data || !p->grad)))
            return SGD_ERR(self, KILN_E_INVALID_ARG, "parameter %u (%s) has no data/grad memory or a negative size",
                           (unsigned)i, p && p->name ? p->name : "?");
        const uint32_t dt = kiln_param_dtype(p);
        if (dt != KILN_DTYPE_F32 && (dt != KILN_DTYPE_F64 || k->struct_size < KILN_KERNELS_SIZE_1_2 ||
                                     !k->sgd_update_ex))
            return SGD_ERR(self, KILN_E_UNSUPPORTED,
                           "parameter %s has %s masters; sgd updates float32, and float64 through the ABI 1.2 "
                           "kernel sgd_update_ex (kernel table: %u bytes)",
                           p->name ? p->name : "?", kiln_dtype_name(dt), (unsigned)k->struct_size);
    }
    sgd_release(self); /* a second setup() replaces the first, freed with its own accelerator */
    self->acc = acc;
    self->k = k;
    self->params = calloc(n, sizeof *self->params);
    if (!self->params) return SGD_ERR(self, KILN_E_NOMEM, "cannot allocate the list of %u parameters", (unsigned)n);
    memcpy(self->params, params, n * sizeof *self->params);
    self->n = n;
    if (self->momentum != 0.0) {
        self->bufs = calloc(n, sizeof *self->bufs);
        if (!self->bufs) {
            sgd_release(self);
            return SGD_ERR(self, KILN_E_NOMEM, "cannot allocate %u momentum buffer pointers", (unsigned)n);
        }
        for (uint32_t i = 0; i < n; i++) {
            if (params[i]->numel == 0) continue;
            void *b = NULL;
            rc = self->k->alloc(self->acc, kiln_param_bytes(params[i]), &b);
            if (rc != KILN_OK) {
                sgd_release(self); /* the accelerator has described the failure */
                return rc;
            }
            self->bufs[i] = b;
        }
    }
    return KILN_OK;
}

/* ------------------------------------------------------------------ step */

static int32_t sgd_step(kiln_instance *self, const kiln_closure *closure) {
    if (!self->params) return SGD_ERR(self, KILN_E_STATE, "step() before setup()");
    if (closure && closure->call) {
        double loss = NAN;
        int32_t rc = closure->call(closure->ctx, &loss);
        if (rc != KILN_OK) return rc; /* the closure reported its own error */
    }
    /* no gradient anywhere (a training_step without a loss): torch's SGD
     * skips every p.grad-is-None parameter, so nothing moves */
#if KILN_ABI_MINOR >= 5 /* tests build this file against the frozen 1.4 headers too */
    if (!kiln_params_any_grad(self->params, self->n)) return KILN_OK;
#endif
    const float lr = (float)self->lr, momentum = (float)self->momentum, dampening = (float)self->dampening,
                wd = (float)self->weight_decay;
    const int first = !self->bufs_ready;
    for (uint32_t i = 0; i < self->n; i++) {
        kiln_parameter *p = self->params[i];
#if KILN_ABI_MINOR >= 5
        if (!kiln_param_has_grad(p)) continue;
#endif
        if (p->numel == 0) continue;
        int32_t rc;
        if (kiln_param_dtype(p) == KILN_DTYPE_F64) /* 64-true: the same update in double */
            rc = self->k->sgd_update_ex(self->acc, KILN_DTYPE_F64, p->data, p->grad, self->bufs ? self->bufs[i] : NULL,
                                        (size_t)p->numel, self->lr, self->momentum, self->dampening, self->nesterov,
                                        self->weight_decay, first);
        else
            rc = self->k->sgd_update(self->acc, p->data, p->grad, self->bufs ? self->bufs[i] : NULL,
                                     (size_t)p->numel, lr, momentum, dampening, self->nesterov, wd, first);
        if (rc != KILN_OK) return rc;
    }
    self->bufs_ready = self->bufs != NULL;
    self->steps++;
    return KILN_OK;
}

static int32_t sgd_zero_grad(kiln_instance *self) {
    if (!self->params) return SGD_ERR(self, KILN_E_STATE, "zero_grad() before setup()");
    return kiln_params_zero_grad(self->k, self->acc, self->params, self->n);
}

static double sgd_get_lr(kiln_instance *self) { return self->lr; }

static int32_t sgd_set_lr(kiln_instance *self, double lr) {
    if (!(lr >= 0.0) || !isfinite(lr))
        return SGD_ERR(self, KILN_E_INVALID_ARG, "lr must be a finite number >= 0, got %g", lr);
    self->lr = lr;
    return KILN_OK;
}

/* ----------------------------------------------------------------- state */

static int32_t sgd_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    if (!self->params) return SGD_ERR(self, KILN_E_STATE, "get_state() before setup()");
    const int has_buffers = self->bufs_ready;
    size_t bytes = sizeof(sgd_state_header) + (size_t)self->n * sizeof(int64_t);
    if (has_buffers) bytes += kiln_params_bytes(self->params, self->n);
    unsigned char *blob = self->svc->alloc(self->hctx, bytes, 16);
    if (!blob) return SGD_ERR(self, KILN_E_NOMEM, "cannot allocate %zu bytes for the sgd state", bytes);

    sgd_state_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, SGD_STATE_MAGIC, sizeof h.magic);
    h.nparams = self->n;
    h.has_buffers = (uint32_t)has_buffers;
    h.steps = self->steps;
    h.lr = self->lr;
    memcpy(blob, &h, sizeof h);
    size_t off = sizeof h;
    kiln_params_write_sizes(self->params, self->n, blob, &off);
    if (has_buffers) {
        int32_t rc = kiln_params_save_bufs(self->k, self->acc, self->params, self->n, self->bufs, blob, &off);
        if (rc != KILN_OK) {
            self->svc->free(self->hctx, blob);
            return rc;
        }
    }
    *state_version = SGD_STATE_VERSION;
    *data = blob;
    *size = bytes;
    return KILN_OK;
}

/* Everything is validated before anything changes, so a refused blob leaves
 * the optimizer exactly as it was. */
static int32_t sgd_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    if (state_version != SGD_STATE_VERSION)
        return SGD_ERR(self, KILN_E_STATE, "sgd state version %u is not supported (this build reads version %u)",
                       (unsigned)state_version, SGD_STATE_VERSION);
    if (!self->params) return SGD_ERR(self, KILN_E_STATE, "set_state() before setup(): no parameters to match");
    const unsigned char *blob = data;
    sgd_state_header h;
    if (!blob || size < sizeof h)
        return SGD_ERR(self, KILN_E_STATE, "sgd state is %zu bytes, shorter than its %zu-byte header", size,
                       sizeof h);
    memcpy(&h, blob, sizeof h);
    if (memcmp(h.magic, SGD_STATE_MAGIC, sizeof h.magic) != 0)
        return SGD_ERR(self, KILN_E_STATE, "not an sgd state (wrong magic)");
    if (h.nparams != self->n)
        return SGD_ERR(self, KILN_E_STATE, "sgd state holds %u parameters, the optimizer has %u",
                       (unsigned)h.nparams, (unsigned)self->n);
    if (h.has_buffers > 1 || h.steps < 0 || !(h.lr >= 0.0) || !isfinite(h.lr))
        return SGD_ERR(self, KILN_E_STATE, "sgd state header is corrupt (has_buffers %u, steps %lld, lr %g)",
                       (unsigned)h.has_buffers, (long long)h.steps, h.lr);
    size_t off = sizeof h;
    if (size < off + (size_t)self->n * sizeof(int64_t))
        return SGD_ERR(self, KILN_E_STATE, "sgd state is %zu bytes, too short for %u parameter sizes", size,
                       (unsigned)self->n);
    int64_t numel;
    int64_t bad = kiln_params_check_sizes(self->params, self->n, blob, &off, &numel);
    if (bad >= 0)
        return SGD_ERR(self, KILN_E_STATE, "sgd state: parameter %u (%s) has %lld elements there, %lld here",
                       (unsigned)bad, self->params[bad]->name ? self->params[bad]->name : "?", (long long)numel,
                       (long long)self->params[bad]->numel);
    size_t expect = off + (h.has_buffers ? kiln_params_bytes(self->params, self->n) : 0);
    if (size != expect)
        return SGD_ERR(self, KILN_E_STATE, "sgd state is %zu bytes, expected %zu for these parameters", size,
                       expect);

    if (h.has_buffers && self->bufs) {
        int32_t rc = kiln_params_load_bufs(self->k, self->acc, self->params, self->n, self->bufs, blob, &off);
        if (rc != KILN_OK) return rc;
    } else if (h.has_buffers) {
        /* Saved with momentum, resumed without: PyTorch would load the
         * buffers and never read them; here they are simply not kept. */
        kiln_logf(self->svc, self->hctx, KILN_LOG_INFO,
                  "sgd: the state's momentum buffers are ignored because momentum is 0");
    }
    /* Without saved buffers the next step starts momentum afresh, as PyTorch
     * does for a parameter with no momentum_buffer. */
    self->bufs_ready = h.has_buffers && self->bufs != NULL;
    self->steps = h.steps;
    self->lr = h.lr;
    return KILN_OK;
}

/* ------------------------------------------------------------ descriptor */

static const kiln_optimizer_ops sgd_ops = {
    .base = {sizeof(kiln_optimizer_ops), 0, sgd_create, sgd_destroy, sgd_get_state, sgd_set_state},
    .setup = sgd_setup,
    .step = sgd_step,
    .zero_grad = sgd_zero_grad,
    .get_lr = sgd_get_lr,
    .set_lr = sgd_set_lr,
};

static const kiln_param sgd_params[] = {
    {"lr", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.01), "learning rate (>= 0)"},
    {"momentum", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0), "momentum factor (>= 0; 0 keeps no buffers)"},
    {"dampening", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0), "dampening for momentum"},
    {"nesterov", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "Nesterov momentum (needs momentum > 0, dampening 0)"},
    {"weight_decay", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0), "L2 penalty added to every gradient (>= 0)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* Master dtypes this optimizer updates (host/stack_checks.c reads it). */
static const char *const sgd_param_dtypes[] = {"float32", "float64"};
/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const sgd_checks[] = {"lr >= 0", "momentum >= 0", "weight_decay >= 0"};
static const kiln_kv sgd_props[] = {
    {"param_dtypes", KILN_V_STRS(sgd_param_dtypes)},
    {"config_checks", KILN_V_STRS(sgd_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc sgd_desc = {
    sizeof(kiln_plugin_desc),
    KILN_KIND_OPTIMIZER,
    "sgd",
    "0.1.0",
    "stochastic gradient descent with momentum (torch.optim.SGD)",
    KILN_CAP_STATEFUL | KILN_CAP_DETERMINISTIC,
    sgd_props,
    sgd_params,
    &sgd_ops,
    NULL,
};

KILN_DEFINE_LIBRARY("sgd", "0.1.0", 1, &sgd_desc)
