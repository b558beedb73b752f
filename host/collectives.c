/*
 * host/collectives.c — the 1.2 collective services plugins use in a
 * distributed run (Lightning's strategy.barrier/reduce/broadcast/all_gather):
 * each forwards to the run's strategy, so a plugin never loads MPI or NCCL
 * itself. With one process, or a strategy without the 1.2 ops and one rank,
 * they answer locally. A strategy that runs several ranks but lacks
 * broadcast/all_gather is refused with a message naming it.
 */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "trainer.h"

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
    char why[1024];
    ht_fail(t, &t->strategy, rc, what, why, sizeof why);
    herr_set(rc, why);
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
