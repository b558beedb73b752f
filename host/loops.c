/*
 * host/loops.c — Lightning's loops re-done in C: the fit loop, the training
 * epoch loop with automatic optimisation and its closure, and the evaluation
 * loop (sanity check, validation inside fit, `kiln validate`, `kiln test`).
 * Hook order, progress counters, accumulation, validation placement and the
 * stopping rules follow ../docs/semantics.md (reference §1, §3, §4); the
 * comments name the Lightning code each piece mirrors.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "trainer.h"

/* ---------------------------------------------------------------------------
 * Progress (loops/progress.py) */

#define INC(pr, field) ((pr).total.field++, (pr).current.field++)

static void reset_current(ht_progress *p) { memset(&p->current, 0, sizeof p->current); }

static int64_t global_step(const ht_trainer *t) { return t->opt_step.total.completed; }

/* fit_loop._can_stop_early */
static int can_stop_early(const ht_trainer *t) {
    int met_epochs = t->set.min_epochs <= 0 || t->epoch_progress.current.processed >= t->set.min_epochs;
    int met_steps = t->set.min_steps <= 0 || global_step(t) >= t->set.min_steps;
    return met_epochs && met_steps;
}

static int max_steps_reached(const ht_trainer *t) {
    return t->set.max_steps != -1 && global_step(t) >= t->set.max_steps;
}

static void note_min_not_met(ht_trainer *t) {
    if (t->min_not_met_logged) return;
    t->min_not_met_logged = 1;
    HLOG_INFO("the run was asked to stop but min_epochs=%lld or min_steps=%lld has not been met; training continues",
              (long long)t->set.min_epochs, (long long)t->set.min_steps);
}

/* ---------------------------------------------------------------------------
 * Data */

static int data_fail(ht_trainer *t, int32_t rc, const char *what, char *why, size_t whylen) {
    return ht_fail(t, &t->data, rc, what, why, whylen);
}

/* limit_*_batches: an int is a count, a float a fraction (loops/utilities) */
static int limit_batches(ht_trainer *t, int64_t n, double limit, int is_count, const char *key, int64_t *out,
                         char *why, size_t whylen) {
    if (is_count) *out = n < (int64_t)limit ? n : (int64_t)limit;
    else {
        *out = (int64_t)((double)n * limit);
        if (limit > 0 && *out == 0 && n > 0) {
            snprintf(why, whylen, "%s: trainer.%s = %g of %lld batches gives 0 batches; use a larger fraction or an int",
                     t->cfg->path, key, limit, (long long)n);
            return KILN_E_CONFIG;
        }
    }
    return KILN_OK;
}

static int fetch(ht_trainer *t, int32_t split, kiln_batch *b, char *why, size_t whylen) {
    double t0 = ht_now();
    memset(b, 0, sizeof *b);
    b->struct_size = sizeof *b;
    herr_clear();
    int32_t rc = t->data_ops->next(t->data.inst, split, b);
    if (split == KILN_SPLIT_TRAIN) t->time.data += ht_now() - t0;
    if (rc < 0) return data_fail(t, rc, "next batch", why, whylen);
    return rc; /* 1: a batch, 0: the epoch ended early */
}

/* ---------------------------------------------------------------------------
 * Logging (trainer/connectors/logger_connector) */

static int send_metrics(ht_trainer *t, kiln_kv *kv, int n, int64_t step, char *why, size_t whylen) {
    if (n == 0) return KILN_OK;
    kv[n].key = "epoch";
    kv[n].value = (kiln_value){KILN_TYPE_FLOAT, 0, {.f = (double)t->epoch_progress.current.completed}};
    kv[n + 1].key = NULL;
    ht_update_state(t);
    kiln_event ev = {sizeof ev, KILN_EV_LOG_METRICS, t->stage, KILN_SRC_HOST, -1, NULL, NULL, 0, &t->state, NULL,
                     kv, step, 0, 0, 0, 0};
    for (int i = 0; i < t->ncallbacks; i++) {
        const kiln_callback_ops *ops = (const kiln_callback_ops *)t->callbacks[i].p->ops;
        herr_clear();
        int32_t rc = ops->on_event(t->callbacks[i].inst, &ev);
        if (rc) return ht_fail(t, &t->callbacks[i], rc, "log_metrics failed", why, whylen);
    }
    return KILN_OK;
}

static int log_step_metrics(ht_trainer *t, char *why, size_t whylen) {
    kiln_kv kv[HM_MAX + 2];
    char names[HM_MAX][72];
    int n = hm_take_step(&t->metrics, kv, HM_MAX, names);
    return send_metrics(t, kv, n, t->batches_that_stepped, why, whylen);
}

static int log_epoch_metrics(ht_trainer *t, int stage, int64_t step, char *why, size_t whylen) {
    kiln_kv kv[HM_MAX + 2];
    char names[HM_MAX][72];
    int n = hm_take_epoch(&t->metrics, stage, kv, HM_MAX, names);
    return send_metrics(t, kv, n, step, why, whylen);
}

/* ---------------------------------------------------------------------------
 * The closure (loops/optimization/closure.py, automatic.py) */

typedef struct ht_closure_ctx {
    ht_trainer *t;
    int do_zero_grad; /* batch_idx % accumulate == 0                          */
    int do_backward;
} ht_closure_ctx;

static int32_t closure_fail(ht_trainer *t, int32_t rc) {
    t->err_rc = rc;
    return rc;
}

/* step_fn → zero_grad_fn → backward_fn, the result cached in last_output. */
static int32_t closure_call(void *vctx, double *loss_out) {
    ht_closure_ctx *c = vctx;
    ht_trainer *t = c->t;
    double t_enter = ht_now();
    t->closure_ran = 1;
    const double acc = (double)t->set.accumulate_grad_batches;

    /* step_fn: S.training_step → LM.training_step (under P.train_step_context) */
    ht_trace(t, KILN_SRC_MODULE, "training_step", t->batch_idx);
    double t0 = ht_now();
    herr_clear();
    int32_t rc = t->precision_ops->convert_params(t->precision.inst);
    if (rc) { ht_fail(t, &t->precision, rc, "convert_params", t->err, sizeof t->err); return closure_fail(t, rc); }
    kiln_step_output out = {sizeof out, 0, 0, 0};
    herr_clear();
    rc = t->module_ops->training_step(t->module.inst, t->batch, t->batch_idx, &out);
    t->time.forward += ht_now() - t0;
    if (rc) { ht_fail(t, &t->module, rc, "training_step", t->err, sizeof t->err); return closure_fail(t, rc); }
    if (out.has_loss && !isfinite(out.loss)) {
        snprintf(t->err, sizeof t->err,
                 "module '%s' (%s): training_step returned a non-finite loss (%g) at epoch %lld, batch %lld, global "
                 "step %lld; expected a finite value (lower the learning rate, or check the data)",
                 t->module.p->view.name, t->module.p->lib->path, out.loss,
                 (long long)t->epoch_progress.current.completed, (long long)t->batch_idx, (long long)global_step(t));
        return closure_fail(t, KILN_E_NONFINITE);
    }
    /* ClosureResult: the loss divided by accumulate_grad_batches, not in place */
    t->last_output = out;
    if (out.has_loss) t->last_output.loss = out.loss / acc;
    else if (!t->min_not_met_logged && t->set.accumulate_grad_batches >= 1)
        HLOG_DEBUG("training_step returned no loss at batch %lld; the step is skipped", (long long)t->batch_idx);

    /* zero_grad_fn: even when the loss is None */
    if (c->do_zero_grad) {
        char *why = t->err;
        size_t wl = sizeof t->err;
        INC(t->zero_grad, ready);
        rc = ht_hook(t, KILN_EV_ON_BEFORE_ZERO_GRAD, t->batch_idx, t->batch, NULL, 0, NULL, why, wl);
        if (rc) return closure_fail(t, rc);
        INC(t->zero_grad, started);
        rc = ht_hook(t, KILN_EV_OPTIMIZER_ZERO_GRAD, t->batch_idx, t->batch, NULL, 0, NULL, why, wl);
        if (rc) return closure_fail(t, rc);
        t0 = ht_now();
        ht_trace(t, KILN_SRC_OPTIMIZER, "zero_grad", t->batch_idx);
        herr_clear();
        rc = t->optimizer_ops->zero_grad(t->optimizer.inst);
        t->time.zero_grad += ht_now() - t0;
        if (rc) { ht_fail(t, &t->optimizer, rc, "zero_grad", why, wl); return closure_fail(t, rc); }
        INC(t->zero_grad, completed);
    }

    /* backward_fn: S.backward → S.pre_backward → P.pre_backward (scale,
     * on_before_backward) → P.backward → LM.backward → P.post_backward
     * (on_after_backward) → S.post_backward */
    if (c->do_backward && out.has_loss) {
        char *why = t->err;
        size_t wl = sizeof t->err;
        ht_trace(t, KILN_SRC_STRATEGY, "pre_backward", t->batch_idx);
        herr_clear();
        rc = t->strategy_ops->pre_backward(t->strategy.inst);
        if (rc) { ht_fail(t, &t->strategy, rc, "pre_backward", why, wl); return closure_fail(t, rc); }
        ht_trace(t, KILN_SRC_PRECISION, "pre_backward", t->batch_idx);
        double scale = 1.0;
        herr_clear();
        rc = t->precision_ops->pre_backward(t->precision.inst, t->last_output.loss, &scale);
        if (rc) { ht_fail(t, &t->precision, rc, "pre_backward", why, wl); return closure_fail(t, rc); }
        t->loss_scale = scale;
        rc = ht_hook(t, KILN_EV_ON_BEFORE_BACKWARD, t->batch_idx, t->batch, NULL, t->last_output.loss * scale, NULL,
                     why, wl);
        if (rc) return closure_fail(t, rc);
        ht_trace(t, KILN_SRC_MODULE, "backward", t->batch_idx);
        t0 = ht_now();
        herr_clear();
        rc = t->module_ops->backward(t->module.inst, scale / acc);
        t->time.backward += ht_now() - t0;
        if (rc) { ht_fail(t, &t->module, rc, "backward", why, wl); return closure_fail(t, rc); }
        rc = ht_hook(t, KILN_EV_ON_AFTER_BACKWARD, t->batch_idx, t->batch, NULL, 0, NULL, why, wl);
        if (rc) return closure_fail(t, rc);
        if (!t->accumulating) { /* no gradient sync while accumulating (no_sync) */
            ht_trace(t, KILN_SRC_STRATEGY, "post_backward", t->batch_idx);
            herr_clear();
            rc = t->strategy_ops->post_backward(t->strategy.inst);
            if (rc) { ht_fail(t, &t->strategy, rc, "post_backward", why, wl); return closure_fail(t, rc); }
        }
    }
    if (loss_out) *loss_out = t->last_output.has_loss ? t->last_output.loss : NAN;
    t->closure_time += ht_now() - t_enter;
    return KILN_OK;
}

/* P._after_closure: on_before_optimizer_step, then gradient clipping */
static int32_t after_closure_call(void *vctx, double *loss_out) {
    ht_trainer *t = vctx;
    (void)loss_out;
    int rc = ht_hook(t, KILN_EV_ON_BEFORE_OPTIMIZER_STEP, t->batch_idx, t->batch, NULL, 0, NULL, t->err,
                     sizeof t->err);
    if (rc) return closure_fail(t, rc);
    ht_trace(t, KILN_SRC_MODULE, "configure_gradient_clipping", t->batch_idx);
    return KILN_OK;
}

/* optimizer.step(closure) as seen by the precision plugin */
static int32_t opt_ref_step(void *vctx, const kiln_closure *closure) {
    ht_trainer *t = vctx;
    ht_trace(t, KILN_SRC_OPTIMIZER, "step", t->batch_idx);
    herr_clear();
    int32_t rc = t->optimizer_ops->step(t->optimizer.inst, closure);
    if (rc && !t->err_rc) ht_fail(t, &t->optimizer, rc, "step", t->err, sizeof t->err);
    return rc;
}

/* _AutomaticOptimization.run */
static int run_automatic(ht_trainer *t, char *why, size_t whylen) {
    const int64_t acc = t->set.accumulate_grad_batches;
    ht_closure_ctx cctx = {t, (t->batch_idx % acc) == 0, 1};
    kiln_closure closure = {sizeof closure, 0, &cctx, closure_call};
    t->closure_ran = 0;
    t->closure_time = 0;
    t->err[0] = 0;
    t->err_rc = 0;
    int32_t rc;
    if (t->accumulating) {
        rc = closure_call(&cctx, NULL);
    } else {
        INC(t->opt_step, ready);
        rc = ht_hook(t, KILN_EV_OPTIMIZER_STEP, t->batch_idx, t->batch, NULL, 0, NULL, why, whylen);
        if (rc) return rc;
        kiln_closure after = {sizeof after, 0, t, after_closure_call};
        kiln_optimizer_ref opt = {sizeof opt, 0, t, opt_ref_step};
        int32_t skipped = 0;
        double t0 = ht_now();
        ht_trace(t, KILN_SRC_PRECISION, "optimizer_step", t->batch_idx);
        herr_clear();
        rc = t->precision_ops->optimizer_step(t->precision.inst, &opt, &closure, &after, &skipped);
        t->time.optimizer += (ht_now() - t0) - t->closure_time;
        if (rc == KILN_OK) {
            INC(t->opt_step, completed); /* counted even when the update was skipped */
            t->skipped_steps += skipped != 0;
        }
    }
    if (rc) {
        if (t->err[0]) snprintf(why, whylen, "%s", t->err);
        else ht_fail(t, &t->precision, rc, "optimizer_step", why, whylen);
        return rc;
    }
    if (!t->closure_ran) {
        snprintf(why, whylen,
                 "precision '%s' / optimizer '%s': the optimizer step never called the closure, so training_step did "
                 "not run (an optimizer_step must call the closure it is given)",
                 t->precision.p->view.name, t->optimizer.p->view.name);
        return KILN_E_STATE;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Evaluation loop (loops/evaluation_loop.py) */

typedef struct eval_ids {
    uint32_t start, end, epoch_start, epoch_end, batch_start, batch_end;
    const char *step_name;
} eval_ids;

static const eval_ids VAL_IDS = {KILN_EV_ON_VALIDATION_START, KILN_EV_ON_VALIDATION_END,
                                 KILN_EV_ON_VALIDATION_EPOCH_START, KILN_EV_ON_VALIDATION_EPOCH_END,
                                 KILN_EV_ON_VALIDATION_BATCH_START, KILN_EV_ON_VALIDATION_BATCH_END, "validation_step"};
static const eval_ids TEST_IDS = {KILN_EV_ON_TEST_START, KILN_EV_ON_TEST_END, KILN_EV_ON_TEST_EPOCH_START,
                                  KILN_EV_ON_TEST_EPOCH_END, KILN_EV_ON_TEST_BATCH_START, KILN_EV_ON_TEST_BATCH_END,
                                  "test_step"};

/* One pass over `n` batches of `split`; `stage` is what plugins see
 * (SANITY, VALIDATE or TEST) and which metrics the pass reduces. */
static int run_eval(ht_trainer *t, int stage, int32_t split, int64_t n, int64_t log_step, char *why, size_t whylen) {
    const eval_ids *E = stage == KILN_STAGE_TEST ? &TEST_IDS : &VAL_IDS;
    int saved_stage = t->stage, saved_acc = t->accumulating;
    t->stage = stage;
    t->accumulating = 0;
    double t0 = ht_now();
    int rc = KILN_OK;
    herr_clear();
    int32_t prc = t->data_ops->start_epoch(t->data.inst, split, 0, 0);
    if (prc) { rc = data_fail(t, prc, "start_epoch", why, whylen); goto out; }
    ht_trace(t, KILN_SRC_MODULE, stage == KILN_STAGE_TEST ? "on_test_model_eval" : "on_validation_model_eval", -1);
    if ((rc = ht_hook(t, E->start, -1, NULL, NULL, 0, NULL, why, whylen))) goto out;
    if ((rc = ht_hook(t, E->epoch_start, -1, NULL, NULL, 0, NULL, why, whylen))) goto out;
    reset_current(&t->val_batch_progress);
    for (int64_t i = 0; i < n; i++) {
        kiln_batch b;
        rc = fetch(t, split, &b, why, whylen);
        if (rc < 0) goto out;
        if (rc == 0) { rc = KILN_OK; break; }
        rc = KILN_OK;
        t->batch = &b;
        t->batch_idx = i;
        INC(t->val_batch_progress, ready);
        if ((rc = ht_hook(t, E->batch_start, i, &b, NULL, 0, NULL, why, whylen))) goto out;
        INC(t->val_batch_progress, started);
        ht_trace(t, KILN_SRC_MODULE, E->step_name, i);
        herr_clear();
        prc = t->precision_ops->convert_params(t->precision.inst);
        if (prc) { rc = ht_fail(t, &t->precision, prc, "convert_params", why, whylen); goto out; }
        kiln_step_output o = {sizeof o, 0, 0, 0};
        herr_clear();
        prc = stage == KILN_STAGE_TEST ? t->module_ops->test_step(t->module.inst, &b, i, &o)
                                       : t->module_ops->validation_step(t->module.inst, &b, i, &o);
        if (prc) { rc = ht_fail(t, &t->module, prc, E->step_name, why, whylen); goto out; }
        INC(t->val_batch_progress, processed);
        if ((rc = ht_hook(t, E->batch_end, i, &b, &o, 0, NULL, why, whylen))) goto out;
        INC(t->val_batch_progress, completed);
    }
    t->batch = NULL;
    if ((rc = ht_hook(t, E->epoch_end, -1, NULL, NULL, 0, NULL, why, whylen))) goto out;
    if (stage == KILN_STAGE_SANITY) hm_reset_epoch(&t->metrics, stage); /* sanity results are discarded */
    else if ((rc = log_epoch_metrics(t, stage, log_step, why, whylen))) goto out;
    if ((rc = ht_hook(t, E->end, -1, NULL, NULL, 0, NULL, why, whylen))) goto out;
    ht_trace(t, KILN_SRC_MODULE, stage == KILN_STAGE_TEST ? "on_test_model_train" : "on_validation_model_train", -1);
out:
    t->batch = NULL;
    t->stage = saved_stage;
    t->accumulating = saved_acc;
    t->time.validation += ht_now() - t0;
    return rc;
}

/* _should_check_val_fx */
static int should_check_val(ht_trainer *t, int64_t batch_idx) {
    if (t->num_val_batches == 0) return 0;
    if ((t->epoch_progress.current.completed + 1) % t->set.check_val_every_n_epoch != 0) return 0;
    if (t->should_stop && can_stop_early(t)) return 1;
    int64_t every;
    if (t->set.val_check_is_count) every = (int64_t)t->set.val_check_interval;
    else {
        every = (int64_t)((double)t->num_training_batches * t->set.val_check_interval);
        if (every < 1) every = 1;
    }
    return (batch_idx + 1) % every == 0;
}

/* ---------------------------------------------------------------------------
 * Training epoch (loops/training_epoch_loop.py) */

static int run_train_epoch(ht_trainer *t, char *why, size_t whylen) {
    int rc;
    const int64_t epoch = t->epoch_progress.current.completed;
    herr_clear();
    int32_t prc = t->data_ops->start_epoch(t->data.inst, KILN_SPLIT_TRAIN, (uint64_t)epoch, 0);
    if (prc) return data_fail(t, prc, "start_epoch", why, whylen);
    INC(t->epoch_progress, ready);
    if ((rc = ht_hook(t, KILN_EV_ON_TRAIN_EPOCH_START, -1, NULL, NULL, 0, NULL, why, whylen))) return rc;
    INC(t->epoch_progress, started);
    reset_current(&t->batch_progress);
    t->is_last_batch = 0;

    for (;;) {
        const int64_t i = t->batch_progress.current.ready; /* batch_idx */
        if (i >= t->num_training_batches) break;
        kiln_batch b;
        rc = fetch(t, KILN_SPLIT_TRAIN, &b, why, whylen);
        if (rc < 0) return rc;
        if (rc == 0) break; /* the data ran out before num_training_batches */
        t->batch = &b;
        t->batch_idx = i;
        INC(t->batch_progress, ready);
        t->is_last_batch = i + 1 >= t->num_training_batches;
        /* _should_accumulate: the last batch of an epoch always steps */
        t->accumulating = (t->batch_progress.current.ready % t->set.accumulate_grad_batches != 0) && !t->is_last_batch;

        int result = 0;
        if ((rc = ht_hook(t, KILN_EV_ON_TRAIN_BATCH_START, i, &b, NULL, 0, &result, why, whylen))) return rc;
        ht_trace(t, KILN_SRC_STRATEGY, "on_train_batch_start", i);
        if (result == -1) {
            /* -1 ends the epoch: no optimisation, no on_train_batch_end, no
             * validation for this epoch (the break skips on_advance_end) */
            t->is_last_batch = 1;
            INC(t->batch_progress, processed);
            t->batch = NULL;
            break;
        }
        INC(t->batch_progress, started);
        if ((rc = run_automatic(t, why, whylen))) return rc;
        INC(t->batch_progress, processed);
        t->samples_seen += b.size;
        if ((rc = ht_hook(t, KILN_EV_ON_TRAIN_BATCH_END, i, &b, &t->last_output, 0, NULL, why, whylen))) return rc;
        INC(t->batch_progress, completed);
        t->batch = NULL;

        /* update_train_step_metrics: logged on stepping batches every
         * log_every_n_steps (or when stopping) */
        if (!t->accumulating && ((t->batches_that_stepped + 1) % t->set.log_every_n_steps == 0 || t->should_stop))
            if ((rc = log_step_metrics(t, why, whylen))) return rc;

        /* on_advance_end: validation, then the logger step */
        if (should_check_val(t, i)) {
            if (!t->accumulating &&
                (rc = ht_hook(t, KILN_EV_ON_VALIDATION_MODEL_ZERO_GRAD, -1, NULL, NULL, 0, NULL, why, whylen)))
                return rc;
            if ((rc = run_eval(t, KILN_STAGE_VALIDATE, KILN_SPLIT_VAL, t->num_val_batches, t->batches_that_stepped,
                               why, whylen)))
                return rc;
        }
        if (!t->accumulating) t->batches_that_stepped++;
        t->total_batch_idx++;
        t->accumulating = 0;

        /* epoch_loop.done */
        if (max_steps_reached(t)) break;
        if (t->should_stop) {
            if (can_stop_early(t)) break;
            note_min_not_met(t);
        }
    }
    t->accumulating = 0;
    INC(t->epoch_progress, processed);
    if ((rc = ht_hook(t, KILN_EV_ON_TRAIN_EPOCH_END, -1, NULL, NULL, 0, NULL, why, whylen))) return rc;
    int64_t step = t->batches_that_stepped > 0 ? t->batches_that_stepped - 1 : 0;
    if ((rc = log_epoch_metrics(t, KILN_STAGE_FIT, step, why, whylen))) return rc;
    INC(t->epoch_progress, completed);
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Fit loop (loops/fit_loop.py) */

static int fit_done(ht_trainer *t) {
    if (max_steps_reached(t)) return 1;
    if (t->set.max_epochs != -1 && t->epoch_progress.current.processed >= t->set.max_epochs) return 1;
    if (t->should_stop) {
        if (can_stop_early(t)) return 1;
        note_min_not_met(t);
    }
    return 0;
}

static int setup_data(ht_trainer *t, int stage, char *why, size_t whylen) {
    herr_clear();
    int32_t rc = t->data_ops->setup(t->data.inst, stage, t->state.rank, t->state.world_size);
    if (rc) return data_fail(t, rc, "setup", why, whylen);
    return KILN_OK;
}

static int count_batches(ht_trainer *t, int32_t split, double limit, int is_count, const char *key, int64_t *out,
                         char *why, size_t whylen) {
    int64_t n = 0;
    herr_clear();
    int32_t rc = t->data_ops->num_batches(t->data.inst, split, &n);
    if (rc) return data_fail(t, rc, "num_batches", why, whylen);
    return limit_batches(t, n, limit, is_count, key, out, why, whylen);
}

int ht_run_fit_loop(ht_trainer *t, char *why, size_t whylen) {
    int rc;
    t->stage = KILN_STAGE_FIT;
    /* DM.setup → CB.setup → LM.setup */
    if ((rc = setup_data(t, KILN_STAGE_FIT, why, whylen))) return rc;
    if ((rc = count_batches(t, KILN_SPLIT_TRAIN, t->set.limit_train, t->set.limit_train_is_count,
                            "limit_train_batches", &t->num_training_batches, why, whylen)))
        return rc;
    if ((rc = count_batches(t, KILN_SPLIT_VAL, t->set.limit_val, t->set.limit_val_is_count, "limit_val_batches",
                            &t->num_val_batches, why, whylen)))
        return rc;
    if (t->set.val_check_is_count && t->set.val_check_interval > (double)t->num_training_batches &&
        t->num_training_batches > 0) {
        snprintf(why, whylen,
                 "%s: trainer.val_check_interval = %lld must be <= the number of training batches (%lld)",
                 t->cfg->path, (long long)t->set.val_check_interval, (long long)t->num_training_batches);
        return KILN_E_CONFIG;
    }
    if ((rc = ht_hook(t, KILN_EV_SETUP, -1, NULL, NULL, 0, NULL, why, whylen))) return rc;
    if ((rc = ht_hook(t, KILN_EV_ON_FIT_START, -1, NULL, NULL, 0, NULL, why, whylen))) return rc;

    /* sanity check (trainer._run_sanity_check) */
    if (t->num_val_batches > 0 && t->set.num_sanity_val_steps != 0) {
        int64_t n = t->set.num_sanity_val_steps == -1 || t->set.num_sanity_val_steps > t->num_val_batches
                        ? t->num_val_batches
                        : t->set.num_sanity_val_steps;
        t->stage = KILN_STAGE_SANITY;
        if ((rc = ht_hook(t, KILN_EV_ON_SANITY_CHECK_START, -1, NULL, NULL, 0, NULL, why, whylen))) return rc;
        if ((rc = run_eval(t, KILN_STAGE_SANITY, KILN_SPLIT_VAL, n, 0, why, whylen))) return rc;
        t->stage = KILN_STAGE_SANITY;
        if ((rc = ht_hook(t, KILN_EV_ON_SANITY_CHECK_END, -1, NULL, NULL, 0, NULL, why, whylen))) return rc;
        t->stage = KILN_STAGE_FIT;
        hm_clear_cb(&t->metrics);
        reset_current(&t->val_batch_progress);
    }

    /* fit_loop.skip: no training batches → no train hooks at all */
    if (t->num_training_batches > 0) {
        if ((rc = ht_hook(t, KILN_EV_ON_TRAIN_START, -1, NULL, NULL, 0, NULL, why, whylen))) return rc;
        ht_trace(t, KILN_SRC_STRATEGY, "on_train_start", -1);
        while (!fit_done(t))
            if ((rc = run_train_epoch(t, why, whylen))) return rc;
        if ((rc = ht_hook(t, KILN_EV_ON_TRAIN_END, -1, NULL, NULL, 0, NULL, why, whylen))) return rc;
    }
    if ((rc = ht_hook(t, KILN_EV_ON_FIT_END, -1, NULL, NULL, 0, NULL, why, whylen))) return rc;
    return ht_hook(t, KILN_EV_TEARDOWN, -1, NULL, NULL, 0, NULL, why, whylen);
}

int ht_run_eval_loop(ht_trainer *t, int stage, char *why, size_t whylen) {
    int rc;
    int32_t split = stage == KILN_STAGE_TEST ? KILN_SPLIT_TEST : KILN_SPLIT_VAL;
    t->stage = stage;
    if ((rc = setup_data(t, stage, why, whylen))) return rc;
    int64_t n = 0;
    if ((rc = count_batches(t, split, stage == KILN_STAGE_TEST ? t->set.limit_test : t->set.limit_val,
                            stage == KILN_STAGE_TEST ? t->set.limit_test_is_count : t->set.limit_val_is_count,
                            stage == KILN_STAGE_TEST ? "limit_test_batches" : "limit_val_batches", &n, why, whylen)))
        return rc;
    if (stage == KILN_STAGE_TEST) t->num_test_batches = n;
    else t->num_val_batches = n;
    if ((rc = ht_hook(t, KILN_EV_SETUP, -1, NULL, NULL, 0, NULL, why, whylen))) return rc;
    if (n > 0 && (rc = run_eval(t, stage, split, n, 0, why, whylen))) return rc;
    t->stage = stage;
    return ht_hook(t, KILN_EV_TEARDOWN, -1, NULL, NULL, 0, NULL, why, whylen);
}
