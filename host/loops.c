/*
 * host/loops.c — Lightning's loops re-done in C: the fit loop (epochs), the
 * training epoch loop (batches, with automatic optimisation from closure.c
 * or manual optimisation from manual.c, and validation where it is due) and
 * the evaluation loop (sanity check, validation inside fit, `kiln
 * validate`, `kiln test`). Each run_*_loop function writes out Lightning's
 * _Loop.run with its steps named as Lightning names them (reset,
 * on_run_start, advance, on_advance_end, on_run_end).
 * Hook order, progress counters, accumulation, validation placement and the
 * stopping rules follow docs/semantics.md (Lightning 2.x's loops); the
 * comments name the Lightning code each piece mirrors.
 */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "loops.h"

#include "checkpoint.h"
#include "closure.h"
#include "log.h"
#include "lr_clip.h"
#include "manual.h"

/* ---------------------------------------------------------------------------
 * Progress (loops/progress.py) */

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

static int data_fail(ht_trainer *t, int32_t rc, const char *what, ht_error *err) {
    return ht_fail(t, &t->data, rc, what, err);
}

/* limit_*_batches: an int is a count, a float a fraction (loops/utilities) */
static int limit_batches(ht_trainer *t, int64_t n, double limit, int is_count, const char *key, int64_t *out,
                         ht_error *err) {
    if (is_count) *out = n < (int64_t)limit ? n : (int64_t)limit;
    else {
        *out = (int64_t)((double)n * limit);
        if (limit > 0 && *out == 0 && n > 0) {
            ht_errorf(err, "%s: trainer.%s = %g of %lld batches gives 0 batches; use a larger fraction or an int",
                     t->cfg->path, key, limit, (long long)n);
            return KILN_E_CONFIG;
        }
    }
    return KILN_OK;
}

static int fetch(ht_trainer *t, int32_t split, kiln_batch *b, ht_error *err) {
    double t0 = ht_now();
    memset(b, 0, sizeof *b);
    b->struct_size = sizeof *b;
    herr_clear();
    int32_t rc = t->data_ops->next(t->data.inst, split, b);
    if (split == KILN_SPLIT_TRAIN) t->time.data += ht_now() - t0;
    if (rc < 0) return data_fail(t, rc, "next batch", err);
    return rc; /* 1: a batch, 0: the epoch ended early */
}

/* ---------------------------------------------------------------------------
 * Logging (trainer/connectors/logger_connector) */

static int send_metrics(ht_trainer *t, kiln_kv *kv, int n, int64_t step, ht_error *err) {
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
        if (rc) return ht_fail(t, &t->callbacks[i], rc, "log_metrics failed", err);
    }
    return KILN_OK;
}

static int log_step_metrics(ht_trainer *t, ht_error *err) {
    kiln_kv kv[HM_MAX + 2];
    char names[HM_MAX][72];
    int n = hm_take_step(&t->metrics, kv, HM_MAX, names);
    return send_metrics(t, kv, n, t->batches_that_stepped, err);
}

/* Several ranks: every epoch mean is the weighted mean over all ranks'
 * samples (Lightning's sync_dist for epoch metrics); the ranks log the same
 * metrics in the same order, so one reduce_sum of (sum, weight) pairs does. */
static int reduce_epoch_metrics(ht_trainer *t, int stage, ht_error *err) {
    if (t->state.world_size <= 1) return KILN_OK;
    double buf[2 * HM_MAX];
    int idx[HM_MAX], n = 0;
    for (int i = 0; i < t->metrics.n; i++) {
        ht_metric *m = &t->metrics.m[i];
        if (!m->in_epoch || m->stage != stage) continue;
        buf[2 * n] = m->sum;
        buf[2 * n + 1] = m->weight;
        idx[n++] = i;
    }
    double cnt = n, all = 0;
    herr_clear();
    int32_t rc = t->strategy_ops->reduce_sum(t->strategy.inst, &cnt, 1);
    all = cnt;
    if (rc == KILN_OK && all != (double)n * t->state.world_size) {
        ht_errorf(err, "rank %d logged %d epoch metrics, the ranks together %g: every rank must log the same "
              "metrics", t->state.rank, n, all);
        return KILN_E_STATE;
    }
    if (rc == KILN_OK && n) rc = t->strategy_ops->reduce_sum(t->strategy.inst, buf, (uint32_t)(2 * n));
    if (rc) return ht_fail(t, &t->strategy, rc, "reduce_sum (epoch metrics)", err);
    for (int k = 0; k < n; k++) {
        t->metrics.m[idx[k]].sum = buf[2 * k];
        t->metrics.m[idx[k]].weight = buf[2 * k + 1];
    }
    return KILN_OK;
}

static int log_epoch_metrics_reduced(ht_trainer *t, int stage, int64_t step, int reduced, ht_error *err) {
    int rrc = reduced ? KILN_OK : reduce_epoch_metrics(t, stage, err);
    if (rrc) return rrc;
    kiln_kv kv[HM_MAX + 2];
    char names[HM_MAX][72];
    int n = hm_take_epoch(&t->metrics, stage, kv, HM_MAX, names);
    return send_metrics(t, kv, n, step, err);
}

static int log_epoch_metrics(ht_trainer *t, int stage, int64_t step, ht_error *err) {
    return log_epoch_metrics_reduced(t, stage, step, 0, err);
}

/* ---------------------------------------------------------------------------
 * The shape of every loop (loops/loop.py: _Loop.run), written out in each
 * run_*_loop function below rather than driven through a table:
 *
 *   reset → on_run_start → while !done: advance → on_advance_end → on_run_end
 *
 * advance may return LOOP_STOP (Lightning's StopIteration): the loop breaks
 * at once, skipping that iteration's on_advance_end. */

#define LOOP_STOP 1

/* ---------------------------------------------------------------------------
 * Evaluation loop (loops/evaluation_loop.py): one pass over `n` batches of
 * `split`; `stage` is what plugins see (SANITY, VALIDATE or TEST) and which
 * metrics the pass reduces. */

typedef struct eval_ids {
    uint32_t start, end, epoch_start, epoch_end, batch_start, batch_end;
    const char *step_name, *model_eval, *model_train;
} eval_ids;

static const eval_ids VAL_IDS = {KILN_EV_ON_VALIDATION_START, KILN_EV_ON_VALIDATION_END,
                                 KILN_EV_ON_VALIDATION_EPOCH_START, KILN_EV_ON_VALIDATION_EPOCH_END,
                                 KILN_EV_ON_VALIDATION_BATCH_START, KILN_EV_ON_VALIDATION_BATCH_END,
                                 "validation_step", "on_validation_model_eval", "on_validation_model_train"};
static const eval_ids TEST_IDS = {KILN_EV_ON_TEST_START, KILN_EV_ON_TEST_END, KILN_EV_ON_TEST_EPOCH_START,
                                  KILN_EV_ON_TEST_EPOCH_END, KILN_EV_ON_TEST_BATCH_START, KILN_EV_ON_TEST_BATCH_END,
                                  "test_step", "on_test_model_eval", "on_test_model_train"};

typedef struct eval_loop {
    ht_trainer *t;
    int stage;
    int32_t split;
    int64_t n, log_step;
    const eval_ids *ids;
    kiln_batch batch; /* the current batch, valid until the next fetch */
    ht_step step;     /* the batch in flight: never accumulating          */
} eval_loop;

static int eval_reset(eval_loop *e, ht_error *err) {
    ht_trainer *t = e->t;
    reset_current(&t->val_batch_progress);
    herr_clear();
    int32_t rc = t->data_ops->start_epoch(t->data.inst, e->split, 0, 0);
    return rc ? data_fail(t, rc, "start_epoch", err) : KILN_OK;
}

static int eval_on_run_start(eval_loop *e, ht_error *err) {
    ht_trainer *t = e->t;
    ht_trace(t, KILN_SRC_MODULE, e->ids->model_eval, -1);
    int rc = ht_hook(t, e->ids->start, -1, NULL, NULL, 0, NULL, err);
    return rc ? rc : ht_hook(t, e->ids->epoch_start, -1, NULL, NULL, 0, NULL, err);
}

static int eval_done(const eval_loop *e) { return e->t->val_batch_progress.current.ready >= e->n; }

static int eval_advance(eval_loop *e, ht_error *err) {
    ht_trainer *t = e->t;
    const int64_t i = t->val_batch_progress.current.ready;
    kiln_batch *bp = &e->batch;
    int rc = fetch(t, e->split, bp, err);
    if (rc < 0) return rc;
    if (rc == 0) return LOOP_STOP; /* the data ran out early */
    e->step.batch = bp;
    e->step.batch_idx = t->last_batch_idx = i;
    HT_INC(t->val_batch_progress, ready);
    if ((rc = ht_hook(t, e->ids->batch_start, i, bp, NULL, 0, NULL, err))) return rc;
    HT_INC(t->val_batch_progress, started);
    ht_trace(t, KILN_SRC_MODULE, e->ids->step_name, i);
    herr_clear();
    int32_t prc = t->precision_ops->convert_params(t->precision.inst);
    if (prc) return ht_fail(t, &t->precision, prc, "convert_params", err);
    kiln_step_output o = {sizeof o, 0, 0, 0, 0, 0};
    herr_clear();
    prc = e->stage == KILN_STAGE_TEST ? t->module_ops->test_step(t->module.inst, bp, i, &o)
                                      : t->module_ops->validation_step(t->module.inst, bp, i, &o);
    if (prc) return ht_fail(t, &t->module, prc, e->ids->step_name, err);
    HT_INC(t->val_batch_progress, processed);
    if ((rc = ht_hook(t, e->ids->batch_end, i, bp, &o, 0, NULL, err))) return rc;
    HT_INC(t->val_batch_progress, completed);
    e->step.batch = NULL;
    return KILN_OK;
}

static int eval_on_run_end(eval_loop *e, ht_error *err) {
    ht_trainer *t = e->t;
    e->step.batch = NULL;
    int rc = ht_hook(t, e->ids->epoch_end, -1, NULL, NULL, 0, NULL, err);
    if (rc) return rc;
    if (e->stage == KILN_STAGE_SANITY) hm_reset_epoch(&t->metrics, e->stage); /* sanity results are discarded */
    else if ((rc = log_epoch_metrics(t, e->stage, e->log_step, err))) return rc;
    if ((rc = ht_hook(t, e->ids->end, -1, NULL, NULL, 0, NULL, err))) return rc;
    ht_trace(t, KILN_SRC_MODULE, e->ids->model_train, -1);
    return KILN_OK;
}

static int run_eval(ht_trainer *t, int stage, int32_t split, int64_t n, int64_t log_step, ht_error *err) {
    eval_loop e = {t, stage, split, n, log_step, stage == KILN_STAGE_TEST ? &TEST_IDS : &VAL_IDS, {0}, {0}};
    int saved_stage = t->stage;
    ht_step *saved_step = t->step; /* validation inside a training batch's on_advance_end */
    int64_t saved_nval = t->num_val_batches;
    t->stage = stage;
    t->step = &e.step;
    if (stage == KILN_STAGE_SANITY) t->num_val_batches = n; /* what progress bars show as the total */
    double t0 = ht_now();
    /* the evaluation loop: one batch per advance, nothing at on_advance_end */
    int rc = eval_reset(&e, err);
    if (rc == KILN_OK) rc = eval_on_run_start(&e, err);
    while (rc == KILN_OK && !eval_done(&e)) rc = eval_advance(&e, err);
    if (rc == LOOP_STOP) rc = KILN_OK; /* the data ran out early */
    if (rc == KILN_OK) rc = eval_on_run_end(&e, err);
    t->time.validation += ht_now() - t0;
    t->stage = saved_stage;
    t->step = saved_step;
    t->num_val_batches = saved_nval;
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
 * Training epoch loop (loops/training_epoch_loop.py): one batch per advance */

static int epoch_reset(ht_trainer *t, ht_error *err) {
    int64_t start = 0;
    if (t->restart_mid_epoch) {
        /* resumed inside this epoch: keep the batch progress, the data
         * starts at the batch after the last one the checkpoint saw */
        start = t->batch_progress.current.completed;
        t->is_last_batch = start >= t->num_training_batches;
    } else {
        /* reset_on_run of the batch progress and of the optimisation
         * progress (training_epoch_loop.reset): the `current` optimizer-step
         * and zero-grad counters count this epoch's, as the checkpoint's
         * progress text then says to tools that read it as Lightning loop
         * state; global_step reads the total */
        reset_current(&t->batch_progress);
        reset_current(&t->opt_step);
        reset_current(&t->zero_grad);
        t->is_last_batch = 0;
    }
    t->restart_mid_epoch = 0;
    herr_clear();
    int32_t rc = t->data_ops->start_epoch(t->data.inst, KILN_SPLIT_TRAIN,
                                          (uint64_t)t->epoch_progress.current.completed, start);
    return rc ? data_fail(t, rc, "start_epoch", err) : KILN_OK;
}

/* End of a batch or of an epoch, where every counter is consistent: write
 * the checkpoints callbacks asked for; after SIGINT/SIGTERM also
 * checkpoints/last.safetensors, and stop. */
static int consistent_point(ht_trainer *t, ht_error *err) {
    if (t->state.world_size > 1) {
        /* a stop any rank asked for (early stopping, a callback) is every
         * rank's: reduce_boolean_decision(any) */
        double s = t->should_stop;
        herr_clear();
        int32_t src = t->strategy_ops->reduce_sum(t->strategy.inst, &s, 1);
        if (src) return ht_fail(t, &t->strategy, src, "reduce_sum (should_stop)", err);
        t->should_stop = s > 0;
    }
    int rc = ht_ckpt_flush(t, err);
    if (rc || !ht_signal || t->interrupted) return rc;
    t->interrupted = (int)ht_signal;
    if ((rc = ht_ckpt_save_last(t, err))) return rc;
    t->interrupted_epoch = t->epoch_progress.current.completed; /* cli_run.c says where */
    t->interrupted_batch = t->batch_progress.current.completed - 1; /* batch_idx may be a val batch now */
    return KILN_OK;
}

/* epoch_loop.done: max_steps, an allowed stop request, or the batches are done */
static int epoch_done(ht_trainer *t) {
    if (t->interrupted || max_steps_reached(t)) return 1;
    if (t->should_stop) {
        if (can_stop_early(t)) return 1;
        note_min_not_met(t);
    }
    return t->batch_progress.current.ready >= t->num_training_batches;
}

/* One batch: fetch, on_train_batch_start, its optimisation (automatic or
 * manual), the schedulers, on_train_batch_end, the step's logged metrics.
 * `b` holds the batch until the next fetch; `s` carries it down the step
 * (t->step points at it until epoch_on_advance_end). */
static int epoch_advance(ht_trainer *t, ht_step *s, kiln_batch *b, ht_error *err) {
    const int64_t i = t->batch_progress.current.ready; /* batch_idx */
    int rc = fetch(t, KILN_SPLIT_TRAIN, b, err);
    if (rc < 0) return rc;
    if (rc == 0) return LOOP_STOP; /* the data ran out before num_training_batches */
    HT_INC(t->batch_progress, ready);
    t->is_last_batch = i + 1 >= t->num_training_batches;
    *s = (ht_step){.batch = b, .batch_idx = i};
    /* _should_accumulate: the last batch of an epoch always steps */
    s->accumulating = (t->batch_progress.current.ready % t->set.accumulate_grad_batches != 0) && !t->is_last_batch;
    t->step = s;
    t->last_batch_idx = i;

    int result = 0;
    if ((rc = ht_hook(t, KILN_EV_ON_TRAIN_BATCH_START, i, b, NULL, 0, &result, err))) return rc;
    ht_trace(t, KILN_SRC_STRATEGY, "on_train_batch_start", i);
    if (result == -1) {
        /* -1 ends the epoch: no optimisation, no on_train_batch_end and no
         * validation for this epoch (StopIteration skips on_advance_end).
         * The batch still counts as the epoch's last for the schedulers
         * (training_epoch_loop.advance, should_skip_rest_of_epoch): a step
         * schedule steps, and an epoch schedule steps for this epoch. */
        t->is_last_batch = 1;
        s->accumulating = 0;
        HT_INC(t->batch_progress, processed);
        if ((rc = ht_update_lr(t, s, 0, 0, err))) return rc;
        if ((rc = ht_update_lr(t, s, 1, 0, err))) return rc;
        s->batch = NULL;
        return LOOP_STOP;
    }
    HT_INC(t->batch_progress, started);
    t->in_train_step = 1;
    rc = t->manual ? ht_manual_step(t, s) : ht_automatic_step(t, s);
    t->in_train_step = 0;
    if (rc) {
        *err = s->err; /* the step's failure is the run's */
        return rc;
    }
    HT_INC(t->batch_progress, processed);
    t->samples_seen += b->size;
    if (s->output.struct_size >= KILN_STEP_OUTPUT_SIZE_1_4) {
        /* throughput for the summary; the closure may have run more than
         * once (LBFGS), the last result stands for the batch */
        if (s->output.tokens > 0) t->tokens_seen += s->output.tokens;
        if (s->output.flops > 0 && isfinite(s->output.flops)) t->flops_seen += s->output.flops;
    }
    /* schedulers: per step, and per epoch at its last batch (before
     * on_train_batch_end, as Lightning); a monitored one at the epoch's end */
    if ((rc = ht_update_lr(t, s, 0, 0, err))) return rc;
    if (t->is_last_batch && (rc = ht_update_lr(t, s, 1, 0, err))) return rc;
    if ((rc = ht_hook(t, KILN_EV_ON_TRAIN_BATCH_END, i, b, &s->output, 0, NULL, err))) return rc;
    HT_INC(t->batch_progress, completed);
    s->batch = NULL; /* failures from here on name no batch */
    /* update_train_step_metrics: on stepping batches every log_every_n_steps
     * (or when a stop was requested) */
    if (!s->accumulating && ((t->batches_that_stepped + 1) % t->set.log_every_n_steps == 0 || t->should_stop))
        return log_step_metrics(t, err);
    return KILN_OK;
}

/* Validation inside the epoch (training_epoch_loop.on_advance_end's
 * _run_validation): on_validation_model_zero_grad after a stepping batch,
 * then the evaluation loop over the validation split. */
static int run_validation(ht_trainer *t, const ht_step *s, ht_error *err) {
    int rc;
    if (!s->accumulating && (rc = ht_hook(t, KILN_EV_ON_VALIDATION_MODEL_ZERO_GRAD, -1, NULL, NULL, 0, NULL, err)))
        return rc;
    return run_eval(t, KILN_STAGE_VALIDATE, KILN_SPLIT_VAL, t->num_val_batches, t->batches_that_stepped, err);
}

/* The rest of on_advance_end, after validation: the step counters, then
 * the consistent point (requested checkpoints, a signal's stop). */
static int epoch_on_advance_end(ht_trainer *t, const ht_step *s, ht_error *err) {
    if (!s->accumulating) t->batches_that_stepped++;
    t->total_batch_idx++;
    t->step = NULL; /* the batch is done */
    return consistent_point(t, err);
}

/* training_epoch_loop.run: one batch per advance; at on_advance_end the
 * validation when it is due (val_check_interval, check_val_every_n_epoch,
 * a stop request), then the counters and the consistent point. */
static int run_epoch_loop(ht_trainer *t, ht_error *err) {
    kiln_batch batch; /* the current batch, valid until the next fetch */
    ht_step step;     /* the batch on its way down the step               */
    int rc = epoch_reset(t, err);
    while (rc == KILN_OK && !epoch_done(t)) {
        rc = epoch_advance(t, &step, &batch, err);
        if (rc == LOOP_STOP) { /* StopIteration: no on_advance_end */
            rc = KILN_OK;
            break;
        }
        if (rc == KILN_OK && should_check_val(t, step.batch_idx)) rc = run_validation(t, &step, err);
        if (rc == KILN_OK) rc = epoch_on_advance_end(t, &step, err);
    }
    t->step = NULL;
    return rc;
}

/* ---------------------------------------------------------------------------
 * Fit loop (loops/fit_loop.py): one epoch per advance */

static int fit_on_run_start(ht_trainer *t, ht_error *err) {
    int rc = ht_hook(t, KILN_EV_ON_TRAIN_START, -1, NULL, NULL, 0, NULL, err);
    if (rc) return rc;
    ht_trace(t, KILN_SRC_STRATEGY, "on_train_start", -1);
    return KILN_OK;
}

static int fit_done(ht_trainer *t) {
    if (t->interrupted || max_steps_reached(t)) return 1;
    if (t->set.max_epochs != -1 && t->epoch_progress.current.processed >= t->set.max_epochs) return 1;
    if (t->should_stop) {
        if (can_stop_early(t)) return 1;
        note_min_not_met(t);
    }
    return 0;
}

/* on_advance_start: the epoch's start hooks */
static int fit_on_advance_start(ht_trainer *t, ht_error *err) {
    if (t->restart_mid_epoch) return KILN_OK; /* resumed inside it: these ran before the checkpoint */
    HT_INC(t->epoch_progress, ready);
    int rc = ht_hook(t, KILN_EV_ON_TRAIN_EPOCH_START, -1, NULL, NULL, 0, NULL, err);
    if (rc == KILN_OK) HT_INC(t->epoch_progress, started);
    return rc;
}

/* advance: one epoch, the training epoch loop */
static int fit_advance(ht_trainer *t, ht_error *err) {
    int rc;
    if ((rc = run_epoch_loop(t, err))) return rc;
    /* interrupted inside the epoch: it is not processed (no on_train_epoch_end) */
    return t->interrupted ? LOOP_STOP : KILN_OK;
}

/* Move the epoch counters by d in processed and completed: -1 describes an
 * epoch as in flight (its start hooks ran, it was not processed). */
static void epoch_processed_by(ht_trainer *t, int64_t d) {
    t->epoch_progress.total.processed += d;
    t->epoch_progress.total.completed += d;
    t->epoch_progress.current.processed += d;
    t->epoch_progress.current.completed += d;
}

/* on_advance_end: on_train_epoch_end, epoch metrics, completed++ */
static int fit_on_advance_end(ht_trainer *t, ht_error *err) {
    /* all the epoch's batches ran, or -1 made the last one last
     * (_num_ready_batches_reached); not when max_steps or a stop request
     * ended it early */
    const int ran_out = t->is_last_batch || t->batch_progress.current.ready >= t->num_training_batches;
    /* max_steps cut the epoch: Lightning's checkpoint of this point
     * (taken in on_train_epoch_end) resumes inside it (RESTARTED_ON_EPOCH_END:
     * no on_train_epoch_start, the next batch, the same current_epoch) */
    const int cut = !ran_out && max_steps_reached(t) && !t->interrupted;
    HT_INC(t->epoch_progress, processed);
    /* on_train_epoch_end: the callbacks that monitor no metric, then the
     * module, then the monitoring callbacks (early stopping, checkpoints),
     * which read the epoch's means, reduced over the ranks, including what
     * the module logged in its own on_train_epoch_end */
    int rc = ht_hook_to(t, HT_TO_ALL & ~HT_TO_MONITORS, KILN_EV_ON_TRAIN_EPOCH_END, -1, NULL, NULL, 0, NULL, err);
    if (rc) return rc;
    if ((rc = reduce_epoch_metrics(t, KILN_STAGE_FIT, err))) return rc;
    hm_peek_epoch(&t->metrics, KILN_STAGE_FIT);
    rc = ht_hook_to(t, HT_TO_MONITORS, KILN_EV_ON_TRAIN_EPOCH_END, -1, NULL, NULL, 0, NULL, err);
    if (rc) return rc;
    /* a monitored (plateau) schedule, only for an epoch that ran out
     * (fit_loop.on_advance_end) */
    if (ran_out && (rc = ht_update_lr(t, NULL, 1, 1, err))) return rc;
    int64_t step = t->batches_that_stepped > 0 ? t->batches_that_stepped - 1 : 0;
    if ((rc = log_epoch_metrics_reduced(t, KILN_STAGE_FIT, step, 1, err))) return rc;
    HT_INC(t->epoch_progress, completed);
    /* Lightning's default ModelCheckpoint: the weights after every epoch;
     * a cut epoch is written as still in flight, and so is any checkpoint
     * a callback asked for at its end */
    if (cut) epoch_processed_by(t, -1);
    rc = ht_ckpt_save_last(t, err);
    if (rc == KILN_OK) rc = consistent_point(t, err);
    if (cut) epoch_processed_by(t, 1);
    return rc;
}

static int fit_on_run_end(ht_trainer *t, ht_error *err) {
    return ht_hook(t, KILN_EV_ON_TRAIN_END, -1, NULL, NULL, 0, NULL, err);
}

/* fit_loop.run: one epoch per advance; skipped when there are no
 * training batches */
static int run_fit_epochs(ht_trainer *t, ht_error *err) {
    if (t->num_training_batches == 0) return KILN_OK;
    int rc = fit_on_run_start(t, err);
    while (rc == KILN_OK && !fit_done(t)) {
        rc = fit_on_advance_start(t, err);
        if (rc == KILN_OK) rc = fit_advance(t, err);
        if (rc == LOOP_STOP) { /* interrupted inside the epoch: no on_advance_end */
            rc = KILN_OK;
            break;
        }
        if (rc == KILN_OK) rc = fit_on_advance_end(t, err);
    }
    return rc == KILN_OK ? fit_on_run_end(t, err) : rc;
}

/* ---------------------------------------------------------------------------
 * Entry points (trainer._run_stage) */

static int setup_data(ht_trainer *t, int stage, ht_error *err) {
    herr_clear();
    int32_t rc = t->data_ops->setup(t->data.inst, stage, t->state.rank, t->state.world_size);
    if (rc) return data_fail(t, rc, "setup", err);
    return KILN_OK;
}

static int count_batches(ht_trainer *t, int32_t split, double limit, int is_count, const char *key, int64_t *out,
                         ht_error *err) {
    int64_t n = 0;
    herr_clear();
    int32_t rc = t->data_ops->num_batches(t->data.inst, split, &n);
    if (rc) return data_fail(t, rc, "num_batches", err);
    return limit_batches(t, n, limit, is_count, key, out, err);
}

int ht_run_fit_loop(ht_trainer *t, ht_error *err) {
    int rc;
    t->stage = KILN_STAGE_FIT;
    /* DM.setup → CB.setup → LM.setup */
    if ((rc = setup_data(t, KILN_STAGE_FIT, err))) return rc;
    if ((rc = count_batches(t, KILN_SPLIT_TRAIN, t->set.limit_train, t->set.limit_train_is_count,
                            "limit_train_batches", &t->num_training_batches, err)))
        return rc;
    if ((rc = count_batches(t, KILN_SPLIT_VAL, t->set.limit_val, t->set.limit_val_is_count, "limit_val_batches",
                            &t->num_val_batches, err)))
        return rc;
    if (t->set.val_check_is_count && t->set.val_check_interval > (double)t->num_training_batches &&
        t->num_training_batches > 0) {
        ht_errorf(err, "%s: trainer.val_check_interval = %lld must be <= the number of training batches (%lld)",
                 t->cfg->path, (long long)t->set.val_check_interval, (long long)t->num_training_batches);
        return KILN_E_CONFIG;
    }
    if ((rc = ht_hook(t, KILN_EV_SETUP, -1, NULL, NULL, 0, NULL, err))) return rc;
    if ((rc = ht_hook(t, KILN_EV_ON_FIT_START, -1, NULL, NULL, 0, NULL, err))) return rc;

    /* sanity check (trainer._run_sanity_check) */
    /* not when restarting (trainer._run_sanity_check: val_loop.restarting):
     * a resume inside an epoch, or any resume of a step-limited run
     * (fit_loop.restarting: _iteration_based_training); a checkpoint of a
     * finished epoch with max_steps = -1 is not a restart, so the check
     * runs again */
    const int restarting = t->resumed && (t->restart_mid_epoch || t->set.max_steps != -1);
    if (t->num_val_batches > 0 && t->set.num_sanity_val_steps != 0 && !restarting) {
        int64_t n = t->set.num_sanity_val_steps == -1 || t->set.num_sanity_val_steps > t->num_val_batches
                        ? t->num_val_batches
                        : t->set.num_sanity_val_steps;
        t->stage = KILN_STAGE_SANITY;
        if ((rc = ht_hook(t, KILN_EV_ON_SANITY_CHECK_START, -1, NULL, NULL, 0, NULL, err))) return rc;
        if ((rc = run_eval(t, KILN_STAGE_SANITY, KILN_SPLIT_VAL, n, 0, err))) return rc;
        if ((rc = ht_hook(t, KILN_EV_ON_SANITY_CHECK_END, -1, NULL, NULL, 0, NULL, err))) return rc;
        t->stage = KILN_STAGE_FIT;
        hm_clear_cb(&t->metrics);
        reset_current(&t->val_batch_progress);
    }

    if ((rc = run_fit_epochs(t, err))) return rc;
    if ((rc = ht_hook(t, KILN_EV_ON_FIT_END, -1, NULL, NULL, 0, NULL, err))) return rc;
    return ht_hook(t, KILN_EV_TEARDOWN, -1, NULL, NULL, 0, NULL, err);
}

int ht_run_eval_loop(ht_trainer *t, int stage, ht_error *err) {
    int rc;
    int32_t split = stage == KILN_STAGE_TEST ? KILN_SPLIT_TEST : KILN_SPLIT_VAL;
    t->stage = stage;
    if ((rc = setup_data(t, stage, err))) return rc;
    int64_t n = 0;
    if ((rc = count_batches(t, split, stage == KILN_STAGE_TEST ? t->set.limit_test : t->set.limit_val,
                            stage == KILN_STAGE_TEST ? t->set.limit_test_is_count : t->set.limit_val_is_count,
                            stage == KILN_STAGE_TEST ? "limit_test_batches" : "limit_val_batches", &n, err)))
        return rc;
    if (stage == KILN_STAGE_TEST) t->num_test_batches = n;
    else t->num_val_batches = n;
    if ((rc = ht_hook(t, KILN_EV_SETUP, -1, NULL, NULL, 0, NULL, err))) return rc;
    if (n > 0 && (rc = run_eval(t, stage, split, n, 0, err))) return rc;
    t->stage = stage;
    return ht_hook(t, KILN_EV_TEARDOWN, -1, NULL, NULL, 0, NULL, err);
}
