/*
 * host/lr_clip.c — what the trainer does to the optimizers between steps:
 * the learning-rate schedule and gradient clipping.
 *
 * Schedule: the optional `scheduler` section names a scheduler plugin; its
 * host keys say when it steps (Lightning's lr_scheduler_config): interval
 * "step" (after every optimizer step; the default) or "epoch" (at the end of
 * every epoch), every `frequency` of those, and `monitor`, the metric a
 * plateau schedule reads (it then steps per epoch only, as Lightning updates
 * ReduceLROnPlateau only there). The plugin's lr_at gives the rate for the
 * first optimizer's configured rate; every optimizer gets the same factor of
 * its own configured rate. The step count and factor travel in checkpoints.
 *
 * Clipping: trainer.gradient_clip_val with algorithm "norm" (one total L2
 * norm over every gradient, PyTorch's clip_grad_norm_: scale by
 * max_norm / (norm + 1e-6) when that is below 1) or "value" (clamp each
 * element to [-v, v]: the kernel table's clamp entry from 1.5 on, so it
 * works on device memory; a host loop over an older host-memory table). It runs inside the precision plugin's after-closure,
 * i.e. after unscaling and on_before_optimizer_step, and never on
 * accumulating batches; the total norm is logged as `grad_norm`. The norm
 * takes one sumsq_many call (ABI 1.9) where the table has it, one sumsq
 * per parameter otherwise: the same value, but a GPU waits once, not once
 * per parameter. Scaling and clamping are elementwise, so each is one call
 * over the gradient arena, which holds every gradient.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lr_clip.h"

#include "log.h"

/* ------------------------------------------------------------- schedule */

static int apply_factor(ht_trainer *t, double lr0, ht_error *err) {
    if (!isfinite(lr0) || lr0 < 0) {
        ht_errorf(err, "scheduler '%s' (%s): lr_at returned %g at scheduler step %lld; expected a finite rate >= 0",
              t->scheduler.p->view.name, t->scheduler.p->lib->path, lr0, (long long)t->sched_steps);
        return KILN_E_NONFINITE;
    }
    t->lr_factor = t->base_lr[0] > 0 ? lr0 / t->base_lr[0] : 0.0;
    for (int i = 0; i < t->nopts; i++) {
        double lr = i == 0 ? lr0 : t->base_lr[i] * t->lr_factor;
        herr_clear();
        int32_t rc = t->opt_ops[i]->set_lr(t->opts[i].inst, lr);
        if (rc) return ht_fail(t, &t->opts[i], rc, "set_lr", err);
        t->lr[i] = lr;
    }
    return KILN_OK;
}

/* scheduler.step(): the rate after sched_steps steps */
static int sched_step(ht_trainer *t, ht_error *err) {
    double metric = NAN;
    if (t->sched_monitor && hm_get(&t->metrics, t->sched_monitor, &metric) != 0) {
        ht_errorf(err,
                  "scheduler '%s' is conditioned on metric '%s', which is not available (log it from the module, e.g. "
              "val_loss, or fix scheduler.monitor)",
              t->scheduler.p->view.name, t->sched_monitor);
        return KILN_E_CONFIG;
    }
    double lr = 0;
    ht_trace(t, KILN_SRC_HOST, "lr_scheduler_step", t->last_batch_idx);
    herr_clear();
    int32_t rc = t->sched_ops->lr_at(t->scheduler.inst, t->base_lr[0], t->sched_steps,
                                     t->epoch_progress.current.completed, metric, &lr);
    if (rc) return ht_fail(t, &t->scheduler, rc, "lr_at", err);
    t->sched_steps++;
    return apply_factor(t, lr, err);
}

int ht_start_schedule(ht_trainer *t, const ht_schedule_keys *keys, ht_error *err) {
    for (int i = 0; i < t->nopts; i++) t->lr[i] = t->base_lr[i] = t->opt_ops[i]->get_lr(t->opts[i].inst);
    t->lr_factor = 1.0;
    if (!t->scheduler.p) return KILN_OK;
    t->sched_ops = (const kiln_scheduler_ops *)t->scheduler.p->ops;
    const char *interval = keys->interval, *monitor = keys->monitor;
    const long long freq = (long long)keys->frequency;
    char where[4200];
    snprintf(where, sizeof where, "%s", t->cfg->path);
    if (strcmp(interval, "step") && strcmp(interval, "epoch")) {
        ht_errorf(err, "%s: scheduler.interval must be \"step\" or \"epoch\", found \"%s\"", where, interval);
        return KILN_E_CONFIG;
    }
    if (freq < 1) {
        ht_errorf(err, "%s: scheduler.frequency must be >= 1, found %lld", where, freq);
        return KILN_E_CONFIG;
    }
    if (monitor && !strcmp(interval, "step")) {
        ht_errorf(err,
                  "%s: scheduler.monitor = \"%s\" with interval \"step\": a monitored (plateau) schedule is updated once "
              "per epoch (as in Lightning); set interval = \"epoch\"",
              where, monitor);
        return KILN_E_CONFIG;
    }
    if (t->manual) {
        ht_errorf(err, "%s: module '%s' optimises manually, so the trainer does not step schedulers (as in Lightning); "
              "remove the scheduler section",
              where, t->module.p->view.name);
        return KILN_E_CONFIG;
    }
    t->sched_per_epoch = !strcmp(interval, "epoch");
    t->sched_frequency = freq;
    t->sched_monitor = monitor;
    /* construction: PyTorch schedulers set the rate of step 0 at once */
    t->sched_steps = 0;
    double lr = 0;
    herr_clear();
    int32_t src = t->sched_ops->lr_at(t->scheduler.inst, t->base_lr[0], 0, 0, NAN, &lr);
    if (src) return ht_fail(t, &t->scheduler, src, "lr_at", err);
    t->sched_steps = 1;
    return apply_factor(t, lr, err);
}

int ht_update_lr(ht_trainer *t, const ht_step *step, int per_epoch, int plateau, ht_error *err) {
    if (!t->scheduler.p || per_epoch != t->sched_per_epoch) return KILN_OK;
    if ((t->sched_monitor != NULL) != plateau) return KILN_OK; /* plateau ones only at the epoch's end */
    if (!per_epoch && step->accumulating) return KILN_OK;
    /* batch and epoch indices start at 0 and the step comes after them */
    int64_t idx = (per_epoch ? t->epoch_progress.current.completed : step->batch_idx) + 1;
    if (idx % t->sched_frequency != 0) return KILN_OK;
    return sched_step(t, err);
}

/* ------------------------------------------------------------- clipping */

int ht_clip_gradients(ht_trainer *t, ht_error *err) {
    const double v = t->set.gradient_clip_val;
    if (!(v > 0)) return KILN_OK;
    const kiln_kernels *K = t->kernels;
    const int f64 = t->param_dtype == KILN_DTYPE_F64;
    if (t->set.clip_by_value) {
        /* 1.5 tables clamp on the accelerator, in place (the same
         * comparisons as the loop below, so the same bits), over the whole
         * gradient arena at once as the norm's scale below does */
        if (K->struct_size >= KILN_KERNELS_SIZE_1_5 && K->clamp) {
            herr_clear();
            int32_t rc = K->clamp(t->accel.inst, f64 ? KILN_DTYPE_F64 : KILN_DTYPE_F32, t->grad_arena, t->grad_arena,
                                  -v, v, t->arena_numel);
            if (rc) return ht_fail(t, &t->accel, rc, "clamp (gradient clipping by value)", err);
            return KILN_OK;
        }
        /* an older table has no clamp: only where the gradients are host memory */
        if (!(K->flags & KILN_KERNELS_HOST_MEMORY)) {
            ht_errorf(err, "trainer.gradient_clip_algorithm = \"value\" needs a clamp entry (kernel table 1.5) or an "
                  "accelerator whose memory is host memory; accelerator '%s' has neither (use \"norm\")",
                  t->accel.p->view.name);
            return KILN_E_UNSUPPORTED;
        }
        for (uint32_t i = 0; i < t->nparams; i++) {
            kiln_parameter *p = t->params[i];
            for (int64_t k = 0; k < p->numel; k++) {
                if (f64) {
                    double *g = (double *)p->grad;
                    g[k] = g[k] > v ? v : g[k] < -v ? -v : g[k];
                } else {
                    float *g = p->grad, fv = (float)v;
                    g[k] = g[k] > fv ? fv : g[k] < -fv ? -fv : g[k];
                }
            }
        }
        return KILN_OK;
    }
    /* Every gradient's sum of squares, added in parameter order. A 1.9
     * table gives them all in one call, so a GPU waits once per step
     * rather than once per parameter; each is the per-tensor entry's value,
     * so the norm has the same bits either way. */
    double total = 0;
    if (K->struct_size >= KILN_KERNELS_SIZE_1_9 && K->sumsq_many) {
        herr_clear(); /* clip_x, clip_n: every gradient, listed by alloc_params */
        int32_t rc = K->sumsq_many(t->accel.inst, f64 ? KILN_DTYPE_F64 : KILN_DTYPE_F32, t->clip_x, t->clip_n,
                                   t->nparams, t->clip_s);
        if (rc) return ht_fail(t, &t->accel, rc, "sumsq_many (gradient clipping)", err);
        for (uint32_t i = 0; i < t->nparams; i++) total += t->clip_s[i];
    } else {
        for (uint32_t i = 0; i < t->nparams; i++) {
            kiln_parameter *p = t->params[i];
            double s = 0;
            herr_clear();
            int32_t rc = f64 ? (K->struct_size >= KILN_KERNELS_SIZE_1_2
                                    ? K->sumsq_ex(t->accel.inst, KILN_DTYPE_F64, p->grad, (size_t)p->numel, &s)
                                    : KILN_E_UNSUPPORTED)
                             : K->sumsq(t->accel.inst, p->grad, (size_t)p->numel, &s);
            if (rc) return ht_fail(t, &t->accel, rc, "sumsq (gradient clipping)", err);
            total += s;
        }
    }
    const double norm = sqrt(total);
    hm_log(&t->metrics, t->stage, "grad_norm", norm, KILN_LOG_ON_STEP, 1.0);
    const double coef = v / (norm + 1e-6);
    if (coef >= 1.0 || !isfinite(norm)) return KILN_OK; /* clamp(coef, max=1): nothing to scale */
    /* Every gradient lies in the one arena alloc_params carved them from,
     * so one scale over the arena is every parameter's scale: the same
     * bits (elementwise), one launch instead of one per parameter. The
     * padding between tensors (zeros nobody reads) is scaled too. */
    herr_clear();
    int32_t rc = f64 ? K->scale_ex(t->accel.inst, KILN_DTYPE_F64, t->grad_arena, coef, t->arena_numel)
                     : K->scale(t->accel.inst, t->grad_arena, (float)coef, t->arena_numel);
    if (rc) return ht_fail(t, &t->accel, rc, "scale (gradient clipping)", err);
    return KILN_OK;
}
