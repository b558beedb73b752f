/*
 * host/run.c — the bottom layer of training (run.h): failure reports that
 * say which plugin failed and where the loops were, hook dispatch in
 * Lightning's order (callbacks, the precision plugin, the module) with a
 * trace copy for tracing callbacks, the kiln_trainer_state plugins read,
 * the gradient-presence flags, the clock and mkdir -p. Nothing here calls
 * into the files above it.
 */
#define _GNU_SOURCE
#include "run.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "log.h"

double ht_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

volatile sig_atomic_t ht_signal;


/* ---------------------------------------------------------------------------
 * Failures */

/* Where the loops are, for messages: "(sanity check: epoch 0, batch 1,
 * global step 0)"; empty outside the loops. */
static void where_text(const ht_trainer *t, char *buf, size_t n) {
    buf[0] = 0;
    if (!t->in_loops) return;
    const char *stage = t->stage == KILN_STAGE_SANITY     ? "sanity check"
                        : t->stage == KILN_STAGE_VALIDATE ? "validation"
                        : t->stage == KILN_STAGE_TEST     ? "test"
                                                          : "train";
    if (t->step && t->step->batch)
        snprintf(buf, n, " (%s: epoch %lld, batch %lld, global step %lld)", stage,
                 (long long)t->epoch_progress.current.completed, (long long)t->step->batch_idx,
                 (long long)t->opt_step.total.completed);
    else
        snprintf(buf, n, " (%s: epoch %lld, global step %lld)", stage, (long long)t->epoch_progress.current.completed,
                 (long long)t->opt_step.total.completed);
}

int ht_fail(ht_trainer *t, ht_slot *s, int32_t rc, const char *what, ht_error *err) {
    if (rc > 0) {
        /* not a status (kiln/status.h: 0 or negative); say so rather than
         * pass on a code no one can look up */
        char msg[160];
        snprintf(msg, sizeof msg, "returned %d, which is not a kiln status (0 for success, a negative KILN_E_* code "
                 "for failure)", (int)rc);
        herr_set(KILN_E_INTERNAL, msg);
        rc = KILN_E_INTERNAL;
    }
    hs_format_error(&s->hctx, rc, what, err);
    char where[160];
    where_text(t, where, sizeof where);
    size_t l = strlen(err->msg);
    if (where[0] && l + 1 < sizeof err->msg) snprintf(err->msg + l, sizeof err->msg - l, "%s", where);
    return rc < 0 ? rc : KILN_E_INTERNAL;
}

int32_t ht_step_error(ht_step *step, int32_t rc, const char *msg) {
    if (!step->err.rc) {
        step->err.rc = rc;
        snprintf(step->err.msg, sizeof step->err.msg, "%s", msg);
    }
    return rc;
}

int32_t ht_step_fail(ht_trainer *t, ht_step *step, ht_slot *s, int32_t rc, const char *what) {
    ht_error e;
    rc = ht_fail(t, s, rc, what, &e);
    return ht_step_error(step, rc, e.msg);
}

void ht_grads_none(ht_trainer *t, int opt) {
    const uint32_t n = opt < 0 ? t->nparams : t->opt_nparams[opt];
    for (uint32_t k = 0; k < n; k++) (opt < 0 ? t->params[k] : t->opt_params[opt][k])->flags |= KILN_PARAMF_NO_GRAD;
}

void ht_grads_present(ht_trainer *t) {
    for (uint32_t k = 0; k < t->nparams; k++)
        if (!(t->params[k]->flags & KILN_PARAMF_FROZEN)) t->params[k]->flags &= ~KILN_PARAMF_NO_GRAD;
}

int ht_mkdirs(const char *dir, const char *what, ht_error *err) {
    char p[4200];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') { *s = 0; mkdir(p, 0755); *s = '/'; } /* the last mkdir reports */
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        ht_errorf(err, "%s: cannot create %s: %s", dir, what, strerror(errno));
        return KILN_E_IO;
    }
    return KILN_OK;
}


/* ---------------------------------------------------------------------------
 * Hooks */

static char g_lower[64][48];

static const char *lower_name(uint32_t id) {
    if (id >= 64) return "unknown";
    if (!g_lower[id][0]) {
        const char *n = kiln_event_name(id);
        size_t i = 0;
        for (; n[i] && i < sizeof g_lower[0] - 1; i++) g_lower[id][i] = (char)tolower((unsigned char)n[i]);
        g_lower[id][i] = 0;
    }
    return g_lower[id];
}

void ht_update_state(ht_trainer *t) {
    kiln_trainer_state *s = &t->state;
    s->struct_size = sizeof *s;
    s->stage = t->stage;
    s->current_epoch = t->epoch_progress.current.completed;
    s->global_step = t->opt_step.total.completed;
    s->max_epochs = t->set.max_epochs;
    s->max_steps = t->set.max_steps;
    s->num_training_batches = t->num_training_batches;
    s->num_val_batches = t->num_val_batches;
    s->batches_that_stepped = t->batches_that_stepped;
    s->sanity_checking = t->stage == KILN_STAGE_SANITY;
    s->should_stop = t->should_stop;
    s->run_dir = t->run_dir;
    s->accumulate_grad_batches = (int32_t)t->set.accumulate_grad_batches;
    s->precision = t->precision.p ? t->precision.p->view.properties : NULL;
    s->automatic_optimization = !t->manual;
    s->num_optimizers = (uint32_t)t->nopts;
    s->lr = t->lr;
}

/* Which callbacks a dispatch reaches: all, or (at on_train_epoch_end) those
 * without / with KILN_CAP_MONITOR. */
enum { CB_ALL, CB_PLAIN, CB_MONITORING };

static int callback_selected(const ht_slot *s, int which) {
    if (which == CB_ALL) return 1;
    const int monitors = (s->p->view.capabilities & KILN_CAP_MONITOR) != 0;
    return which == CB_MONITORING ? monitors : !monitors;
}

static int send_to_some_callbacks(ht_trainer *t, kiln_event *ev, int which, ht_error *err) {
    for (int i = 0; i < t->ncallbacks; i++) {
        if (!callback_selected(&t->callbacks[i], which)) continue;
        const kiln_callback_ops *ops = (const kiln_callback_ops *)t->callbacks[i].p->ops;
        herr_clear();
        int32_t rc = ops->on_event(t->callbacks[i].inst, ev);
        if (rc != KILN_OK) {
            char what[96];
            snprintf(what, sizeof what, "%s failed", ev->id == KILN_EV_TRACE ? "trace" : lower_name(ev->id));
            return ht_fail(t, &t->callbacks[i], rc, what, err);
        }
    }
    return KILN_OK;
}

static int send_to_callbacks(ht_trainer *t, kiln_event *ev, ht_error *err) {
    return send_to_some_callbacks(t, ev, CB_ALL, err);
}

void ht_trace(ht_trainer *t, int32_t source, const char *what, int64_t batch_idx) {
    if (!t->ncallbacks) return;
    kiln_event ev = {sizeof ev, KILN_EV_TRACE, t->stage, source, batch_idx, t->step ? t->step->batch : NULL, NULL,
                     0, &t->state, what, NULL, 0, t->step ? t->step->accumulating : 0, 0, 0, 0};
    ht_error e;
    if (send_to_callbacks(t, &ev, &e) != KILN_OK) HLOG_WARN("%.255s", e.msg); /* one short line per trace */
}

/* Hooks that only callbacks have, and those that only the module has. */
static int callback_hook(uint32_t id) {
    return id != KILN_EV_ON_VALIDATION_MODEL_ZERO_GRAD && id != KILN_EV_OPTIMIZER_STEP &&
           id != KILN_EV_OPTIMIZER_ZERO_GRAD;
}
static int module_hook(uint32_t id) {
    return id != KILN_EV_ON_SANITY_CHECK_START && id != KILN_EV_ON_SANITY_CHECK_END && id != KILN_EV_LOG_METRICS;
}

int ht_hook(ht_trainer *t, uint32_t id, int64_t batch_idx, const kiln_batch *batch, const kiln_step_output *out,
            double loss, int *result, ht_error *err) {
    return ht_hook_to(t, HT_TO_ALL, id, batch_idx, batch, out, loss, result, err);
}

int ht_hook_to(ht_trainer *t, int parts, uint32_t id, int64_t batch_idx, const kiln_batch *batch,
               const kiln_step_output *out, double loss, int *result, ht_error *err) {
    ht_update_state(t);
    kiln_event ev = {sizeof ev, id, t->stage, KILN_SRC_CALLBACK, batch_idx, batch, out, loss, &t->state, NULL,
                     NULL, 0, t->step ? t->step->accumulating : 0, 0, 0, 0};
    if (result) *result = 0;
    const int cbs = parts & (HT_TO_PLAIN_CALLBACKS | HT_TO_MONITORS);
    if (callback_hook(id) && cbs) {
        int which = cbs == (HT_TO_PLAIN_CALLBACKS | HT_TO_MONITORS) ? CB_ALL
                    : cbs == HT_TO_MONITORS                          ? CB_MONITORING
                                                                     : CB_PLAIN;
        int rc = send_to_some_callbacks(t, &ev, which, err);
        if (rc) return rc;
    }
    /* 1.2: a precision plugin may listen too (after the callbacks, before
     * the module), e.g. to export quantised weights at on_fit_end. */
    const kiln_precision_ops *pops = t->precision_ops;
    if ((parts & HT_TO_PRECISION) && callback_hook(id) && pops &&
        t->precision.p->ops->struct_size >= KILN_PRECISION_OPS_SIZE_1_2 && pops->on_event) {
        ht_trace(t, KILN_SRC_PRECISION, lower_name(id), batch_idx);
        ev.source = KILN_SRC_PRECISION;
        herr_clear();
        int32_t rc = pops->on_event(t->precision.inst, &ev);
        if (rc != KILN_OK) {
            char what[96];
            snprintf(what, sizeof what, "%s failed", lower_name(id));
            return ht_fail(t, &t->precision, rc, what, err);
        }
    }
    const int to_module = (parts & HT_TO_MODULE) && module_hook(id) && t->module.p;
    if (to_module) ht_trace(t, KILN_SRC_MODULE, lower_name(id), batch_idx);
    if (to_module && t->module_ops->on_event) {
        ev.source = KILN_SRC_MODULE;
        ev.result = 0;
        herr_clear();
        int32_t rc = t->module_ops->on_event(t->module.inst, &ev);
        if (rc != KILN_OK) {
            char what[96];
            snprintf(what, sizeof what, "%s failed", lower_name(id));
            return ht_fail(t, &t->module, rc, what, err);
        }
        if (result) *result = ev.result;
    }
    return KILN_OK;
}

