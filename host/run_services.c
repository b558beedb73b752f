/*
 * host/run_services.c — the services a plugin calls that act on its run:
 * the accelerator and its kernel table, parameter registration, the
 * trainer state, logged values and metrics, stop requests, seeds, the
 * module's predict_step and the precision's activation rounding (1.1 to
 * 1.5), and the collectives (1.2: Lightning's strategy.barrier, reduce,
 * broadcast, all_gather). Each reaches the run through the caller's host
 * context. The collectives forward to the run's strategy, so a plugin never
 * loads MPI or NCCL itself; with one process, or a strategy without the 1.2
 * ops and one rank, they answer locally, and a strategy that runs several
 * ranks but lacks broadcast/all_gather is refused with a message naming it.
 * plugin_api.c puts these into the services table.
 */
#define _GNU_SOURCE
#include "run_services.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/rng.h"
#include "log.h"

static ht_trainer *trainer_of(kiln_host_ctx *h) { return h ? h->trainer : NULL; }

/* svc->predict (1.4): the module's predict_step on fresh compute weights.
 * Refused inside the optimisation of a batch, where it would overwrite the
 * activations the backward reads. */
int32_t ht_svc_predict(kiln_host_ctx *h, const kiln_batch *batch, kiln_tensor *out) {
    ht_trainer *t = trainer_of(h);
    if (!t || !t->module.inst || !t->module_ops || !t->precision_ops) {
        herr_set(KILN_E_STATE, "predict: no module is set up yet (call it from a hook during fit, validate or test)");
        return KILN_E_STATE;
    }
    if (!batch || !out) {
        herr_set(KILN_E_INVALID_ARG, "predict: expected a batch and an output tensor, found NULL");
        return KILN_E_INVALID_ARG;
    }
    if (t->module_ops->base.struct_size < KILN_MODULE_OPS_SIZE_1_4 || !t->module_ops->predict_step) {
        char msg[512];
        snprintf(msg, sizeof msg, "predict: module '%s' (%s) has no predict_step (ABI 1.4)", t->module.p->view.name,
                 t->module.p->lib->path);
        herr_set(KILN_E_UNSUPPORTED, msg);
        return KILN_E_UNSUPPORTED;
    }
    if (t->in_train_step) {
        herr_set(KILN_E_STATE, "predict: not available while a batch is being optimised (it would overwrite what "
                               "backward needs); call it from on_train_batch_end, on_validation_end or on_fit_end");
        return KILN_E_STATE;
    }
    int32_t rc = t->precision_ops->convert_params(t->precision.inst);
    if (rc != KILN_OK) return rc;
    memset(out, 0, sizeof *out);
    return t->module_ops->predict_step(t->module.inst, batch, out);
}

/* svc->round_activation (1.5): the precision's round_activation, when its
 * library is 1.5 or newer and the op is set; otherwise nothing to do. A
 * failure is logged with the precision's own message (the module that
 * called reports only the status and the site). */
int32_t ht_svc_round_activation(kiln_host_ctx *h, const char *site, uint32_t dtype, void *x, size_t n) {
    ht_trainer *t = trainer_of(h);
    if (!t || !t->precision_ops || !t->precision.inst || n == 0) return KILN_OK;
    const hl_plugin *p = t->precision.p;
    if (p->lib->view.abi_minor < 5 || p->ops->struct_size < KILN_PRECISION_OPS_SIZE_1_5 ||
        !t->precision_ops->round_activation)
        return KILN_OK;
    herr_clear();
    int32_t rc = t->precision_ops->round_activation(t->precision.inst, site ? site : "", dtype, x, n);
    if (rc != KILN_OK)
        hlog(KILN_LOG_ERROR, "precision '%s' (%s): round_activation on %s: %s", p->view.name, p->lib->path,
             site ? site : "?", herr_msg()[0] ? herr_msg() : kiln_status_name(rc));
    return rc;
}

int32_t ht_svc_accelerator(kiln_host_ctx *h, kiln_instance **acc, const struct kiln_kernels **k) {
    ht_trainer *t = trainer_of(h);
    if (!t || !t->kernels) {
        herr_set(KILN_E_STATE, "no accelerator is set up for this instance");
        return KILN_E_STATE;
    }
    *acc = t->accel.inst;
    *k = t->kernels;
    return KILN_OK;
}

int32_t ht_svc_param_register(kiln_host_ctx *h, const char *name, uint32_t ndim, const int64_t *shape,
                              uint32_t flags, kiln_parameter **out) {
    ht_trainer *t = trainer_of(h);
    char msg[256];
    if (!t || !h->may_register) {
        herr_set(KILN_E_STATE, "param_register is only available to a module during create()");
        return KILN_E_STATE;
    }
    if (!name || !*name || ndim == 0 || ndim > KILN_MAX_DIMS || !shape || !out) {
        snprintf(msg, sizeof msg, "param_register('%s'): expected a name and 1..%d dimensions, found %u",
                 name ? name : "(null)", KILN_MAX_DIMS, ndim);
        herr_set(KILN_E_INVALID_ARG, msg);
        return KILN_E_INVALID_ARG;
    }
    if (t->nparams == t->cap_params) { /* grow: the module decides how many */
        if (t->cap_params >= UINT32_MAX / 2) {
            herr_set(KILN_E_INVALID_ARG, "param_register: too many parameters");
            return KILN_E_INVALID_ARG;
        }
        uint32_t cap = t->cap_params ? 2 * t->cap_params : 64;
        kiln_parameter **grown = realloc(t->params, (size_t)cap * sizeof *grown);
        if (!grown) return KILN_E_NOMEM;
        t->params = grown;
        t->cap_params = cap;
    }
    for (uint32_t i = 0; i < t->nparams; i++)
        if (!strcmp(t->params[i]->name, name)) {
            snprintf(msg, sizeof msg, "param_register: parameter '%s' registered twice", name);
            herr_set(KILN_E_INVALID_ARG, msg);
            return KILN_E_INVALID_ARG;
        }
    kiln_parameter *p = calloc(1, sizeof *p);
    if (!p) return KILN_E_NOMEM;
    p->struct_size = sizeof *p;
    p->flags = flags;
    p->name = strdup(name);
    p->ndim = ndim;
    p->numel = 1;
    for (uint32_t i = 0; i < KILN_MAX_DIMS; i++) p->shape[i] = i < ndim ? shape[i] : 1;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || shape[i] > ((int64_t)1 << 40)) {
            snprintf(msg, sizeof msg, "param_register('%s'): dimension %u is %lld, expected > 0", name, i,
                     (long long)shape[i]);
            free((void *)p->name);
            free(p);
            herr_set(KILN_E_INVALID_ARG, msg);
            return KILN_E_INVALID_ARG;
        }
        p->numel *= shape[i];
    }
    t->params[t->nparams++] = p;
    *out = p;
    return KILN_OK;
}

int32_t ht_svc_params(kiln_host_ctx *h, kiln_parameter *const **list, uint32_t *n) {
    ht_trainer *t = trainer_of(h);
    if (!t) return KILN_E_STATE;
    *list = t->params;
    *n = t->nparams;
    return KILN_OK;
}

const struct kiln_trainer_state *ht_svc_trainer_state(kiln_host_ctx *h) {
    ht_trainer *t = trainer_of(h);
    if (!t) return NULL;
    ht_update_state(t);
    return &t->state;
}

void ht_svc_log_value(kiln_host_ctx *h, const char *name, double value, uint32_t flags, double weight) {
    ht_trainer *t = trainer_of(h);
    if (!t || !name) return;
    /* Nothing logged during the sanity check is kept (Lightning). */
    hm_log(&t->metrics, t->stage, name, value, flags, weight);
}

int32_t ht_svc_get_metric(kiln_host_ctx *h, const char *name, double *out) {
    ht_trainer *t = trainer_of(h);
    if (!t || !name || !out) return KILN_E_INVALID_ARG;
    return hm_get(&t->metrics, name, out) == 0 ? KILN_OK : KILN_E_NOT_FOUND;
}

void ht_svc_request_stop(kiln_host_ctx *h, const char *reason) {
    ht_trainer *t = trainer_of(h);
    if (!t) return;
    if (!t->should_stop) HLOG_INFO("[%s] requested the run to stop%s%s", h->label, reason ? ": " : "", reason ? reason : "");
    t->should_stop = 1;
    /* live, as Lightning's trainer.should_stop: the plugins called after
     * this one in the same hook (the module's on_validation_end after early
     * stopping's) already read it from the state they were handed */
    t->state.should_stop = 1;
}

uint64_t ht_svc_seed(kiln_host_ctx *h, const char *stream) {
    ht_trainer *t = trainer_of(h);
    uint64_t x = (uint64_t)(t ? t->set.seed : 0);
    uint64_t hsh = 1469598103934665603ull; /* FNV-1a of the stream name */
    for (const char *c = stream ? stream : ""; *c; c++) hsh = (hsh ^ (uint8_t)*c) * 1099511628211ull;
    x ^= hsh;
    return kiln_splitmix64(&x);
}

/* ---------------------------------------------------------------------------
 * Collectives */

static ht_trainer *run_of(kiln_host_ctx *h, const char *what) {
    ht_trainer *t = h ? h->trainer : NULL;
    if (!t || !t->strategy.p || !t->strategy_ops) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: no run (strategy) to communicate through", what);
        herr_set(KILN_E_STATE, msg);
        return NULL;
    }
    return t;
}

static int32_t strategy_fail(ht_trainer *t, int32_t rc, const char *what) {
    ht_error e;
    ht_fail(t, &t->strategy, rc, what, &e);
    e.msg[1023] = 0; /* the module gets one short line */
    herr_set(rc, e.msg);
    return rc;
}

int32_t ht_svc_barrier(kiln_host_ctx *h, const char *name) {
    ht_trainer *t = run_of(h, "barrier");
    if (!t) return KILN_E_STATE;
    herr_clear();
    int32_t rc = t->strategy_ops->barrier(t->strategy.inst, name);
    return rc ? strategy_fail(t, rc, "barrier") : KILN_OK;
}

int32_t ht_svc_reduce(kiln_host_ctx *h, double *values, uint32_t n, int32_t op) {
    ht_trainer *t = run_of(h, "reduce");
    if (!t) return KILN_E_STATE;
    if (op != KILN_REDUCE_SUM && op != KILN_REDUCE_MEAN) {
        herr_set(KILN_E_INVALID_ARG, "reduce: op must be KILN_REDUCE_SUM or KILN_REDUCE_MEAN");
        return KILN_E_INVALID_ARG;
    }
    if (n && !values) {
        herr_set(KILN_E_INVALID_ARG, "reduce: NULL values");
        return KILN_E_INVALID_ARG;
    }
    herr_clear();
    int32_t rc = t->strategy_ops->reduce_sum(t->strategy.inst, values, n);
    if (rc) return strategy_fail(t, rc, "reduce_sum");
    if (op == KILN_REDUCE_MEAN && t->state.world_size > 1)
        for (uint32_t i = 0; i < n; i++) values[i] /= (double)t->state.world_size;
    return KILN_OK;
}

/* the 1.2 ops of the strategy, or NULL */
static const kiln_strategy_ops *ops12(const ht_trainer *t) {
    return t->strategy.p->ops->struct_size >= KILN_STRATEGY_OPS_SIZE_1_2 ? t->strategy_ops : NULL;
}

static int32_t missing(ht_trainer *t, const char *what) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s: strategy '%s' (%s) runs %d ranks but has no %s op (ABI 1.2)", what,
             t->strategy.p->view.name, t->strategy.p->lib->path, t->state.world_size, what);
    herr_set(KILN_E_UNSUPPORTED, msg);
    return KILN_E_UNSUPPORTED;
}

int32_t ht_svc_broadcast(kiln_host_ctx *h, void *buf, size_t bytes, int32_t root) {
    ht_trainer *t = run_of(h, "broadcast");
    if (!t) return KILN_E_STATE;
    if (root < 0 || root >= t->state.world_size || (bytes && !buf)) {
        char msg[160];
        snprintf(msg, sizeof msg, "broadcast: root %d of %d ranks, %zu bytes at %p", root, t->state.world_size, bytes,
                 buf);
        herr_set(KILN_E_INVALID_ARG, msg);
        return KILN_E_INVALID_ARG;
    }
    const kiln_strategy_ops *o = ops12(t);
    if (!o || !o->broadcast) return t->state.world_size <= 1 ? KILN_OK : missing(t, "broadcast");
    herr_clear();
    int32_t rc = o->broadcast(t->strategy.inst, buf, bytes, root);
    return rc ? strategy_fail(t, rc, "broadcast") : KILN_OK;
}

int32_t ht_svc_all_gather(kiln_host_ctx *h, const void *send, size_t bytes, void *recv) {
    ht_trainer *t = run_of(h, "all_gather");
    if (!t) return KILN_E_STATE;
    if (bytes && (!send || !recv)) {
        herr_set(KILN_E_INVALID_ARG, "all_gather: NULL send or receive buffer");
        return KILN_E_INVALID_ARG;
    }
    const kiln_strategy_ops *o = ops12(t);
    if (!o || !o->all_gather) {
        if (t->state.world_size > 1) return missing(t, "all_gather");
        if (bytes) memmove(recv, send, bytes);
        return KILN_OK;
    }
    herr_clear();
    int32_t rc = o->all_gather(t->strategy.inst, send, bytes, recv);
    return rc ? strategy_fail(t, rc, "all_gather") : KILN_OK;
}
