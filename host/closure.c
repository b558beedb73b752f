/*
 * host/closure.c — automatic optimisation (loops/optimization/automatic.py
 * and closure.py): the closure object with its step, zero_grad and backward
 * functions, the wrapper that precision plugins call after the closure
 * (on_before_optimizer_step, clipping), the optimizer handle they step, and
 * the per-batch driver. Every part is timed for the run summary. Everything
 * here works on the step loops.c hands down (ht_step: the batch, whether it
 * steps, the result); plugins call the closure through the ABI's
 * kiln_closure and see only a status, so a failure inside it is kept in the
 * step's error and reported by the driver with the plugin that caused it.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "closure.h"

#include "log.h"
#include "lr_clip.h"

/* ---------------------------------------------------------------------------
 * The closure (loops/optimization/closure.py): three functions called in
 * order — step (training_step), zero_grad, backward — the result cached and
 * consumed once per batch. zero_grad_fn / backward_fn are NULL when the batch
 * does not zero gradients (mid accumulation window) or skips backward. */
typedef struct ht_closure ht_closure;
struct ht_closure {
    ht_trainer *t;
    ht_step *s;
    int32_t (*step_fn)(ht_closure *c, kiln_step_output *out);
    int32_t (*zero_grad_fn)(ht_closure *c);
    int32_t (*backward_fn)(ht_closure *c, double loss);
    kiln_step_output result;   /* cached: the loss divided by accumulate */
    int has_result;
    int calls;                 /* how often the optimizer called it     */
    kiln_closure abi;          /* what plugins receive                  */
};


/* step_fn: S.training_step → LM.training_step under P.convert_params */
static int32_t closure_step(ht_closure *c, kiln_step_output *out) {
    ht_trainer *t = c->t;
    ht_step *s = c->s;
    ht_trace(t, KILN_SRC_MODULE, "training_step", s->batch_idx);
    double t0 = ht_now();
    herr_clear();
    int32_t rc = t->precision_ops->convert_params(t->precision.inst);
    if (rc) return ht_step_fail(t, s, &t->precision, rc, "convert_params");
    *out = (kiln_step_output){sizeof *out, 0, 0, 0, 0, 0};
    herr_clear();
    rc = t->module_ops->training_step(t->module.inst, s->batch, s->batch_idx, out);
    t->time.forward += ht_now() - t0;
    if (rc) return ht_step_fail(t, s, &t->module, rc, "training_step");
    /* A line search (LBFGS strong-Wolfe) probes with trial steps and backs
     * off from an overshoot whose loss is +inf, as PyTorch does: +inf is
     * passed to an optimizer that repeats its closure; NaN never is. */
    if (out->has_loss && !isfinite(out->loss) && !(t->opt_repeats && out->loss == INFINITY)) {
        char msg[sizeof s->err.msg];
        snprintf(msg, sizeof msg,
                 "module '%s' (%s): training_step returned a non-finite loss (%g) at epoch %lld, batch %lld, global "
                 "step %lld; expected a finite value (lower the learning rate, or check the data)",
                 t->module.p->view.name, t->module.p->lib->path, out->loss,
                 (long long)t->epoch_progress.current.completed, (long long)s->batch_idx,
                 (long long)t->opt_step.total.completed);
        return ht_step_error(s, KILN_E_NONFINITE, msg);
    }
    return KILN_OK;
}

/* zero_grad_fn: on_before_zero_grad hooks, LM.optimizer_zero_grad → O.zero_grad */
static int32_t closure_zero_grad(ht_closure *c) {
    ht_trainer *t = c->t;
    ht_step *s = c->s;
    ht_error e;
    HT_INC(t->zero_grad, ready);
    int rc = ht_hook(t, KILN_EV_ON_BEFORE_ZERO_GRAD, s->batch_idx, s->batch, NULL, 0, NULL, &e);
    if (rc) return ht_step_error(s, rc, e.msg);
    HT_INC(t->zero_grad, started);
    rc = ht_hook(t, KILN_EV_OPTIMIZER_ZERO_GRAD, s->batch_idx, s->batch, NULL, 0, NULL, &e);
    if (rc) return ht_step_error(s, rc, e.msg);
    double t0 = ht_now();
    ht_trace(t, KILN_SRC_OPTIMIZER, "zero_grad", s->batch_idx);
    herr_clear();
    rc = t->opt_ops[0]->zero_grad(t->opts[0].inst);
    t->time.zero_grad += ht_now() - t0;
    if (rc) return ht_step_fail(t, s, &t->opts[0], rc, "zero_grad");
    ht_grads_none(t, 0); /* zero_grad(set_to_none=True) */
    HT_INC(t->zero_grad, completed);
    return KILN_OK;
}

/* The backward of automatic and of manual optimisation, one sequence:
 * S.pre_backward → P.pre_backward(loss, &scale) → on_before_backward(loss ×
 * scale) → LM.backward(scale ÷ divide) (gradients added) → on_after_backward
 * → S.post_backward when `sync` (not while accumulating: the gradients are
 * final for the step only then; docs/semantics.md). */
int32_t ht_backward(ht_trainer *t, ht_step *s, double loss, double divide, int sync) {
    ht_error e;
    ht_trace(t, KILN_SRC_STRATEGY, "pre_backward", s->batch_idx);
    herr_clear();
    int32_t rc = t->strategy_ops->pre_backward(t->strategy.inst);
    if (rc) return ht_step_fail(t, s, &t->strategy, rc, "pre_backward");
    ht_trace(t, KILN_SRC_PRECISION, "pre_backward", s->batch_idx);
    double scale = 1.0;
    herr_clear();
    rc = t->precision_ops->pre_backward(t->precision.inst, loss, &scale);
    if (rc) return ht_step_fail(t, s, &t->precision, rc, "pre_backward");
    rc = ht_hook(t, KILN_EV_ON_BEFORE_BACKWARD, s->batch_idx, s->batch, NULL, loss * scale, NULL, &e);
    if (rc) return ht_step_error(s, rc, e.msg);
    ht_trace(t, KILN_SRC_MODULE, "backward", s->batch_idx);
    double t0 = ht_now();
    herr_clear();
    rc = t->module_ops->backward(t->module.inst, scale / divide);
    t->time.backward += ht_now() - t0;
    if (rc) return ht_step_fail(t, s, &t->module, rc, "backward");
    ht_grads_present(t);
    rc = ht_hook(t, KILN_EV_ON_AFTER_BACKWARD, s->batch_idx, s->batch, NULL, 0, NULL, &e);
    if (rc) return ht_step_error(s, rc, e.msg);
    if (sync) {
        ht_trace(t, KILN_SRC_STRATEGY, "post_backward", s->batch_idx);
        herr_clear();
        rc = t->strategy_ops->post_backward(t->strategy.inst);
        if (rc) return ht_step_fail(t, s, &t->strategy, rc, "post_backward");
    }
    return KILN_OK;
}

/* backward_fn: the loss was divided by accumulate_grad_batches, and so is
 * the gradient: dloss = scale / accumulate */
static int32_t closure_backward(ht_closure *c, double loss) {
    return ht_backward(c->t, c->s, loss, (double)c->t->set.accumulate_grad_batches, !c->s->accumulating);
}

/* Closure.__call__: step, zero_grad (even without a loss), backward (only
 * with one); the result, divided by accumulate_grad_batches, is cached. */
static int32_t closure_call(void *vc, double *loss_out) {
    ht_closure *c = vc;
    ht_trainer *t = c->t;
    double t_enter = ht_now();
    c->calls++;
    kiln_step_output out;
    int32_t rc = c->step_fn(c, &out);
    if (rc) return rc;
    if (out.has_loss) out.loss /= (double)t->set.accumulate_grad_batches; /* not in place in Lightning either */
    c->result = out;
    c->has_result = 1;
    if (c->zero_grad_fn && (rc = c->zero_grad_fn(c))) return rc;
    if (c->backward_fn && out.has_loss && (rc = c->backward_fn(c, out.loss))) return rc;
    if (loss_out) *loss_out = out.has_loss ? out.loss : NAN;
    c->s->closure_time += ht_now() - t_enter;
    return KILN_OK;
}

static void closure_init(ht_closure *c, ht_trainer *t, ht_step *s) {
    memset(c, 0, sizeof *c);
    c->t = t;
    c->s = s;
    c->step_fn = closure_step;
    /* zero_grad only at the start of an accumulation window */
    c->zero_grad_fn = s->batch_idx % t->set.accumulate_grad_batches == 0 ? closure_zero_grad : NULL;
    c->backward_fn = closure_backward;
    c->abi = (kiln_closure){sizeof(kiln_closure), 0, c, closure_call};
}

/* P._after_closure: on_before_optimizer_step, then gradient clipping */
static int32_t after_closure_call(void *vc, double *loss_out) {
    ht_closure *c = vc;
    ht_trainer *t = c->t;
    ht_step *s = c->s;
    (void)loss_out;
    ht_error e;
    int rc = ht_hook(t, KILN_EV_ON_BEFORE_OPTIMIZER_STEP, s->batch_idx, s->batch, NULL, 0, NULL, &e);
    if (rc) return ht_step_error(s, rc, e.msg);
    ht_trace(t, KILN_SRC_MODULE, "configure_gradient_clipping", s->batch_idx);
    if ((rc = ht_clip_gradients(t, &e))) return ht_step_error(s, rc, e.msg);
    return KILN_OK;
}

/* optimizer.step(closure), as the precision plugin sees it */
static int32_t opt_ref_step(void *vc, const kiln_closure *closure) {
    ht_closure *c = vc;
    ht_trainer *t = c->t;
    ht_trace(t, KILN_SRC_OPTIMIZER, "step", c->s->batch_idx);
    herr_clear();
    int32_t rc = t->opt_ops[0]->step(t->opts[0].inst, closure);
    if (rc) ht_step_fail(t, c->s, &t->opts[0], rc, "step");
    return rc;
}

int ht_automatic_step(ht_trainer *t, ht_step *s) {
    ht_closure c;
    closure_init(&c, t, s);
    s->closure_time = 0;
    int32_t rc;
    if (s->accumulating) {
        rc = closure_call(&c, NULL);
    } else {
        ht_error e;
        HT_INC(t->opt_step, ready);
        rc = ht_hook(t, KILN_EV_OPTIMIZER_STEP, s->batch_idx, s->batch, NULL, 0, NULL, &e);
        if (rc) return ht_step_error(s, rc, e.msg);
        kiln_closure after = {sizeof after, 0, &c, after_closure_call};
        kiln_optimizer_ref opt = {sizeof opt, 0, &c, opt_ref_step};
        int32_t skipped = 0;
        double t0 = ht_now();
        ht_trace(t, KILN_SRC_PRECISION, "optimizer_step", s->batch_idx);
        herr_clear();
        rc = t->precision_ops->optimizer_step(t->precision.inst, &opt, &c.abi, &after, &skipped);
        t->time.optimizer += (ht_now() - t0) - s->closure_time;
        if (rc == KILN_OK) {
            HT_INC(t->opt_step, completed); /* counted even when the update was skipped */
            t->skipped_steps += skipped != 0;
        }
    }
    /* a failure inside the closure or the optimizer is already the step's
     * error; otherwise the precision plugin's own */
    if (rc) return ht_step_fail(t, s, &t->precision, rc, "optimizer_step");
    /* consume_result: an optimizer step that never ran the closure is a bug */
    if (!c.has_result) {
        char msg[sizeof s->err.msg];
        snprintf(msg, sizeof msg,
                 "precision '%s' / optimizer '%s': the optimizer step never called the closure, so training_step did "
                 "not run (an optimizer_step must call the closure it is given)",
                 t->precision.p->view.name, t->opts[0].p->view.name);
        return ht_step_error(s, KILN_E_STATE, msg);
    }
    s->output = c.result;
    return KILN_OK;
}
