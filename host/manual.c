/*
 * host/manual.c — manual optimisation (Lightning's automatic_optimization =
 * False: loops/optimization/manual.py, core/optimizer.py's
 * LightningOptimizer, core/module.py's manual_backward and toggle_optimizer).
 * The batch driver only brackets the module's training_step; inside it the
 * module drives everything through the 1.2 services implemented here:
 * manual_backward (the same strategy/precision backward chain as automatic
 * mode, hooks included), optimizer_step (precision optimizer_step with
 * on_before_optimizer_step; every call is one global step), a hook-less
 * zero_grad, and toggle/untoggle, which mark the parameters owned only by
 * the other optimizers KILN_PARAMF_FROZEN. Never called in manual mode:
 * optimizer_step/optimizer_zero_grad/on_before_zero_grad module hooks,
 * clipping, accumulation.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "manual.h"

#include "closure.h"
#include "log.h"

static ht_trainer *trainer_of(kiln_host_ctx *h) { return h ? h->trainer : NULL; }

/* The services work for the module, inside its training_step, in a
 * manually optimising run; anything else is a bug in the caller. */
static ht_trainer *manual_trainer(kiln_host_ctx *h, const char *what) {
    ht_trainer *t = trainer_of(h);
    char msg[256];
    if (!t || !t->manual || !t->in_manual_step || h != &t->module.hctx) {
        snprintf(msg, sizeof msg,
                 "%s is only available to a module whose automatic_optimization property is false, from inside its "
                 "training_step",
                 what);
        herr_set(KILN_E_STATE, msg);
        return NULL;
    }
    return t;
}

static int bad_index(ht_trainer *t, uint32_t index, const char *what) {
    if (index < (uint32_t)t->nopts) return 0;
    char msg[256];
    snprintf(msg, sizeof msg, "%s(%u): the run has %d optimizer%s (indices 0..%d in config order)", what, index,
             t->nopts, t->nopts == 1 ? "" : "s", t->nopts - 1);
    herr_set(KILN_E_INVALID_ARG, msg);
    return 1;
}

static const char *step_name(ht_trainer *t, uint32_t index, const char *what, char *buf, size_t n) {
    if (t->nopts == 1) return what;
    snprintf(buf, n, "%s[%u]", what, index);
    return buf;
}

/* The trainer for a service that names an optimizer by index, the call
 * traced as `traced` (with "[index]" when there are several optimizers;
 * NULL: not here) from `source`; NULL with the status in *rc (and the
 * module's message set) when the call is misplaced or the index is out of
 * range. */
static ht_trainer *indexed_service(kiln_host_ctx *h, uint32_t index, const char *what, int32_t source,
                                   const char *traced, int32_t *rc) {
    ht_trainer *t = manual_trainer(h, what);
    *rc = !t ? KILN_E_STATE : bad_index(t, index, what) ? KILN_E_INVALID_ARG : KILN_OK;
    if (*rc) return NULL;
    char nm[48];
    if (traced) ht_trace(t, source, step_name(t, index, traced, nm, sizeof nm), t->step->batch_idx);
    return t;
}

/* A failure inside a service: the step keeps the full message for the
 * batch driver (the module only passes the code back), and the module is
 * handed it too, through the error slot plugins read. */
static int32_t keep(ht_step *s, int32_t rc, const char *why) {
    ht_step_error(s, rc, why);
    herr_set(rc, why);
    return rc;
}

/* keep() for a failed plugin call */
static int32_t keep_fail(ht_trainer *t, ht_slot *slot, int32_t rc, const char *what) {
    ht_error e;
    rc = ht_fail(t, slot, rc, what, &e);
    return keep(t->step, rc, e.msg);
}

uint32_t ht_svc_optimizer_count(kiln_host_ctx *h) {
    ht_trainer *t = trainer_of(h);
    return t ? (uint32_t)t->nopts : 0;
}

/* S.backward(loss, None): the chain of docs/manual-optimization.md, as in automatic mode */
int32_t ht_svc_manual_backward(kiln_host_ctx *h, double loss) {
    ht_trainer *t = manual_trainer(h, "manual_backward");
    if (!t) return KILN_E_STATE;
    char why[2048];
    if (!isfinite(loss)) {
        snprintf(why, sizeof why,
                 "module '%s' (%s): manual_backward got a non-finite loss (%g) at epoch %lld, batch %lld; expected a "
                 "finite value",
                 t->module.p->view.name, t->module.p->lib->path, loss,
                 (long long)t->epoch_progress.current.completed, (long long)t->step->batch_idx);
        return keep(t->step, KILN_E_NONFINITE, why);
    }
    /* the same sequence as automatic optimisation's, dloss = scale, and the
     * strategy synchronises after every manual backward; the module gets
     * the step's error when it fails */
    int32_t rc = ht_backward(t, t->step, loss, 1.0, 1);
    if (rc) herr_set(rc, t->step->err.msg);
    return rc;
}

/* What the precision calls as `optimizer.step(wrapped)` and `after`. */
typedef struct {
    ht_trainer *t;
    uint32_t index;
} manual_opt;

static int32_t manual_opt_step(void *vctx, const kiln_closure *closure) {
    manual_opt *m = vctx;
    ht_trainer *t = m->t;
    char nm[32];
    ht_trace(t, KILN_SRC_OPTIMIZER, step_name(t, m->index, "step", nm, sizeof nm), t->step->batch_idx);
    herr_clear();
    int32_t rc = t->opt_ops[m->index]->step(t->opts[m->index].inst, closure);
    if (rc && !t->step->err.rc) keep_fail(t, &t->opts[m->index], rc, "step");
    return rc;
}

/* _after_closure in manual mode: on_before_optimizer_step, no clipping */
static int32_t manual_after(void *vctx, double *loss) {
    manual_opt *m = vctx;
    ht_step *s = m->t->step;
    (void)loss;
    ht_error e;
    int rc = ht_hook(m->t, KILN_EV_ON_BEFORE_OPTIMIZER_STEP, s->batch_idx, s->batch, NULL, 0, NULL, &e);
    return rc ? keep(s, rc, e.msg) : KILN_OK;
}

/* The closure a step without one gets: nothing to recompute. */
static int32_t noop_closure(void *ctx, double *loss) {
    (void)ctx;
    if (loss) *loss = NAN;
    return KILN_OK;
}

int32_t ht_svc_optimizer_step(kiln_host_ctx *h, uint32_t index, const struct kiln_closure *closure, int32_t *skipped) {
    int32_t rc;
    ht_trainer *t = indexed_service(h, index, "optimizer_step", KILN_SRC_HOST, NULL, &rc);
    if (!t) return rc;
    if (closure && (closure->struct_size < sizeof(kiln_closure) || !closure->call)) {
        herr_set(KILN_E_INVALID_ARG, "optimizer_step: the closure has no call function (pass NULL for none)");
        return KILN_E_INVALID_ARG;
    }
    manual_opt m = {t, index};
    kiln_closure noop = {sizeof noop, 0, NULL, noop_closure};
    kiln_closure after = {sizeof after, 0, &m, manual_after};
    kiln_optimizer_ref opt = {sizeof opt, 0, &m, manual_opt_step};
    HT_INC(t->opt_step, ready); /* _on_before_step */
    int32_t sk = 0;
    ht_trace(t, KILN_SRC_PRECISION, "optimizer_step", t->step->batch_idx);
    double t0 = ht_now();
    herr_clear();
    rc = t->precision_ops->optimizer_step(t->precision.inst, &opt, closure ? closure : &noop, &after, &sk);
    t->time.optimizer += ht_now() - t0;
    if (rc) {
        if (!t->step->err.rc) keep_fail(t, &t->precision, rc, "optimizer_step");
        herr_set(rc, t->step->err.msg);
        return rc;
    }
    HT_INC(t->opt_step, completed); /* _on_after_step: every call is a global step */
    t->skipped_steps += sk != 0;
    if (skipped) *skipped = sk;
    /* The masters just changed: a forward later in this training_step
     * must see them (compute copies: fp16, bf16, quantised). */
    herr_clear();
    rc = t->precision_ops->convert_params(t->precision.inst);
    if (rc) return keep_fail(t, &t->precision, rc, "convert_params");
    return KILN_OK;
}

int32_t ht_svc_optimizer_zero_grad(kiln_host_ctx *h, uint32_t index) {
    int32_t rc;
    ht_trainer *t = indexed_service(h, index, "optimizer_zero_grad", KILN_SRC_OPTIMIZER, "zero_grad", &rc);
    if (!t) return rc;
    double t0 = ht_now();
    herr_clear();
    rc = t->opt_ops[index]->zero_grad(t->opts[index].inst);
    t->time.zero_grad += ht_now() - t0;
    if (rc) return keep_fail(t, &t->opts[index], rc, "zero_grad");
    ht_grads_none(t, (int)index); /* zero_grad(set_to_none=True) */
    return KILN_OK;
}

/* LightningModule.toggle_optimizer: parameters of the other optimizers stop
 * requiring gradients, except those this optimizer owns too. */
int32_t ht_svc_toggle_optimizer(kiln_host_ctx *h, uint32_t index) {
    int32_t rc;
    ht_trainer *t = indexed_service(h, index, "toggle_optimizer", KILN_SRC_HOST, "toggle_optimizer", &rc);
    if (!t) return rc;
    for (uint32_t k = 0; k < t->nparams; k++) {
        int other = 0;
        for (int i = 0; i < t->nopts; i++) other |= i != (int)index && t->owns[i][k];
        kiln_parameter *p = t->params[k];
        if (other && !t->owns[index][k] && !(p->flags & KILN_PARAMF_FROZEN)) {
            p->flags |= KILN_PARAMF_FROZEN;
            t->toggle_froze[k] = 1;
        }
    }
    return KILN_OK;
}

/* Clears the FROZEN flags toggle_optimizer set (and only those). */
static void untoggle_all(ht_trainer *t) {
    for (uint32_t k = 0; k < t->nparams; k++)
        if (t->toggle_froze[k]) {
            t->params[k]->flags &= ~KILN_PARAMF_FROZEN;
            t->toggle_froze[k] = 0;
        }
}

int32_t ht_svc_untoggle_optimizer(kiln_host_ctx *h, uint32_t index) {
    int32_t rc;
    ht_trainer *t = indexed_service(h, index, "untoggle_optimizer", KILN_SRC_HOST, "untoggle_optimizer", &rc);
    if (!t) return rc;
    untoggle_all(t);
    return KILN_OK;
}

/* _manual_train_batch between on_train_batch_start and on_train_batch_end:
 * S.training_step -> LM.training_step, which drives the services above. */
int ht_manual_step(ht_trainer *t, ht_step *s) {
    ht_trace(t, KILN_SRC_MODULE, "training_step", s->batch_idx);
    double t0 = ht_now(), b0 = t->time.backward, o0 = t->time.optimizer, z0 = t->time.zero_grad;
    herr_clear();
    int32_t rc = t->precision_ops->convert_params(t->precision.inst);
    if (rc) return ht_step_fail(t, s, &t->precision, rc, "convert_params");
    kiln_step_output out = {sizeof out, 0, 0, 0, 0, 0};
    t->in_manual_step = 1;
    herr_clear();
    rc = t->module_ops->training_step(t->module.inst, s->batch, s->batch_idx, &out);
    t->in_manual_step = 0;
    /* forward = the step minus what the services measured inside it */
    t->time.forward += (ht_now() - t0) - (t->time.backward - b0) - (t->time.optimizer - o0) - (t->time.zero_grad - z0);
    untoggle_all(t); /* a toggle left on by a failing step must not outlive it */
    if (rc) { /* a service's failure is already the step's error */
        ht_step_fail(t, s, &t->module, rc, "training_step");
        return rc < 0 ? rc : KILN_E_INTERNAL;
    }
    if (out.has_loss && !isfinite(out.loss)) {
        char why[sizeof s->err.msg];
        snprintf(why, sizeof why,
                 "module '%s' (%s): training_step returned a non-finite loss (%g) at epoch %lld, batch %lld; "
                 "expected a finite value",
                 t->module.p->view.name, t->module.p->lib->path, out.loss,
                 (long long)t->epoch_progress.current.completed, (long long)s->batch_idx);
        return ht_step_error(s, KILN_E_NONFINITE, why);
    }
    s->output = out;
    return KILN_OK;
}
