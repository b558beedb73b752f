/*
 * host/run.h — the bottom layer of training: the state of one run (the
 * plugin slots, the parameters, Lightning's progress counters, settings,
 * timings, metrics) and the few things every layer above does with it:
 * report a failed plugin call (ht_fail), send a hook to the listeners in
 * Lightning's order (ht_hook, ht_hook_to), trace a call for tracing
 * callbacks (ht_trace), read the clock (ht_now). It depends only on the
 * stores below it (run files, the registry, metrics, plugin instances);
 * the optimisation, scheduling, checkpoint and loop files build on it, and
 * trainer.c (setting a run up and tearing it down) sits on top.
 */
#ifndef KILN_HOST_RUN_H
#define KILN_HOST_RUN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "error.h"
#include "kiln/training.h"
#include "loader.h"
#include "metrics.h"
#include "services.h"

/* Lightning's progress trackers (loops/progress.py): each counter moves at a
 * fixed point of the loop; `current` resets per run, `total` never. */
typedef struct ht_counts {
    int64_t ready, started, processed, completed;
} ht_counts;
typedef struct ht_progress {
    ht_counts total, current;
} ht_progress;

/* One instantiated plugin. */
typedef struct ht_slot {
    const hl_plugin *p;
    kiln_host_ctx hctx;
    kiln_instance *inst;
    hc_kvset cfg;
    const char *role; /* "optimizer", "callbacks.[1]" — for messages */
} ht_slot;

#define HT_MAX_CALLBACKS 32
#define HT_MAX_OPTIMIZERS 8

/* Trainer settings (the resolved `trainer` section). */
typedef struct ht_settings {
    int64_t max_epochs, max_steps, min_epochs, min_steps;
    double limit_train, limit_val, limit_test; /* fraction, or count when *_is_count */
    int limit_train_is_count, limit_val_is_count, limit_test_is_count;
    double val_check_interval;
    int val_check_is_count;
    int64_t check_val_every_n_epoch;
    int64_t num_sanity_val_steps;
    int64_t accumulate_grad_batches;
    int64_t seed;
    const char *default_root_dir;
    int64_t log_every_n_steps;
    int64_t threads;
    double gradient_clip_val;     /* 0: off                                   */
    double peak_flops;            /* FLOP/s for MFU; 0: measure the
                                     accelerator's float32 GEMM rate          */
    int clip_by_value;            /* gradient_clip_algorithm = "value"        */
} ht_settings;

/* Wall-clock seconds spent in each part of training (closure timings). */
typedef struct ht_timing {
    double data, forward, backward, zero_grad, optimizer, validation, total;
} ht_timing;

/* One batch as it travels down the step (loops.c → closure.c or manual.c →
 * ht_backward): the batch and its index, whether it steps the optimizers,
 * what the module's training_step returned, and the step's failure. It
 * lives on the loop's stack for one batch. */
typedef struct ht_step {
    const kiln_batch *batch;      /* NULL once on_train_batch_end has run    */
    int64_t batch_idx;
    int accumulating;             /* the batch does not step (accumulation)  */
    kiln_step_output output;      /* the closure's consumed result            */
    double closure_time;          /* seconds inside the closure               */
    ht_error err;
} ht_step;

typedef struct ht_trainer {
    hc_config *cfg;
    hl_loader *loader;
    ht_settings set;
    hc_kvset trainer_kv;

    ht_slot accel, strategy, precision, data, module;
    ht_slot opts[HT_MAX_OPTIMIZERS]; /* opts[0] is `optimizer`; more with `optimizers` */
    int nopts;
    ht_slot callbacks[HT_MAX_CALLBACKS];
    int ncallbacks;
    const kiln_accelerator_ops *accel_ops;
    const kiln_strategy_ops *strategy_ops;
    const kiln_precision_ops *precision_ops;
    const kiln_data_ops *data_ops;
    const kiln_module_ops *module_ops;
    const kiln_optimizer_ops *opt_ops[HT_MAX_OPTIMIZERS];
    /* the optional `scheduler`: one schedule for every optimizer, as a
     * factor of each optimizer's configured (base) rate */
    ht_slot scheduler;
    const kiln_scheduler_ops *sched_ops;
    int sched_per_epoch;          /* interval = "epoch"                       */
    int64_t sched_frequency;
    const char *sched_monitor;    /* metric it reads (plateau), or NULL       */
    int64_t sched_steps;          /* scheduler steps taken (PyTorch last_epoch) */
    double lr_factor;             /* current lr / base lr                     */
    double base_lr[HT_MAX_OPTIMIZERS], lr[HT_MAX_OPTIMIZERS];
    const kiln_kernels *kernels;  /* the accelerator's kernel table            */

    /* parameters registered by the module; data/grad carved from two
     * arenas. Sized by the module (GPT-2 XL registers 580): params grows
     * while the module registers; the per-parameter arrays below are
     * allocated for nparams once registration is over (alloc_params,
     * assign_params). */
    kiln_parameter **params;      /* (nparams), room for cap_params          */
    uint32_t nparams, cap_params;
    /* which optimizer updates which parameter (`params` patterns) */
    unsigned char *owns[HT_MAX_OPTIMIZERS];        /* (nparams) each       */
    kiln_parameter **opt_params[HT_MAX_OPTIMIZERS]; /* (opt_nparams[i])     */
    uint32_t opt_nparams[HT_MAX_OPTIMIZERS];
    unsigned char *toggle_froze;  /* (nparams) FROZEN set by toggle_optimizer */
    /* gradient clipping's list for sumsq_many (ABI 1.9): every gradient
     * and its length (set with the gradients), and its sum of squares,
     * (nparams) each */
    const void **clip_x;
    size_t *clip_n;
    double *clip_s;
    int manual;                   /* the module optimises manually            */
    int opt_repeats;              /* optimizer 0 repeats its closure (LBFGS)  */
    int in_manual_step;           /* inside its training_step: services open  */
    void *param_arena, *grad_arena; /* masters and gradients, in param_dtype */
    size_t arena_numel;             /* elements of each arena, padding included */
    uint32_t param_dtype;          /* KILN_DTYPE_F32 or F64, from the precision */

    /* state visible to plugins */
    kiln_trainer_state state;
    int stage;
    char run_dir[4096];

    /* progress (docs/semantics.md) */
    ht_progress epoch_progress;   /* processed tracker                        */
    ht_progress batch_progress;   /* train batches                            */
    int is_last_batch;
    ht_progress opt_step;         /* ready/completed: global_step = total.completed */
    ht_progress zero_grad;        /* ready/started/completed                  */
    ht_progress val_batch_progress;
    int64_t batches_that_stepped;
    int64_t total_batch_idx;
    int should_stop;
    int resumed;                  /* restored from a checkpoint: no sanity check */
    int restart_mid_epoch;        /* restored inside an epoch: its start hooks
                                     ran before the checkpoint, data resumes at
                                     the saved batch                          */
    char ckpt_pending[8][1024];   /* save_checkpoint requests, written at the
                                     next consistent point (ht_ckpt_flush)     */
    int nckpt_pending;
    int interrupted;              /* SIGINT/SIGTERM seen: the signal number    */
    int fitting;                  /* inside ht_fit (validation included)       */
    int64_t interrupted_epoch, interrupted_batch; /* where it stopped        */
    int min_not_met_logged;
    int64_t num_training_batches, num_val_batches, num_test_batches;
    int64_t skipped_steps;

    ht_metrics metrics;
    ht_timing time;
    int64_t samples_seen;
    int64_t tokens_seen;          /* this process's run: sum of the training
                                     steps' kiln_step_output.tokens (1.4)     */
    double flops_seen;            /* likewise of .flops (for MFU)             */
    int in_train_step;            /* inside the optimisation of one batch:
                                     svc->predict is refused (it would
                                     overwrite what backward needs)           */
    ht_step *step;                /* the batch in flight (loops.c sets it for
                                     the batch's hooks and clears it after):
                                     for failure messages, trace events and
                                     the services a plugin calls back into
                                     during the step; NULL between batches   */
    int64_t last_batch_idx;       /* the index of the latest batch, training
                                     or evaluation: an epoch-end scheduler
                                     step's trace event carries it            */
    int excepting;                /* on_exception was sent (once per run)     */
    int in_loops;                 /* inside ht_run_fit_loop/ht_run_eval_loop:
                                     failures say stage, epoch, batch, step  */
} ht_trainer;

/* Move one progress counter in both trackers (loops/progress.py's
 * increment_*: total and current together). */
#define HT_INC(pr, field) ((pr).total.field++, (pr).current.field++)

/* Report a failed plugin call: "<kind> '<name>' (<file>): <what>: <msg>
 * [CODE]", followed by where the loops are when inside them. Returns the
 * status to pass on (a positive rc, which no plugin may return, becomes
 * KILN_E_INTERNAL). */
int ht_fail(ht_trainer *t, ht_slot *s, int32_t rc, const char *what, ht_error *err);
/* The same report kept in the step's error (when it is the first: what a
 * plugin does after a call it was handed failed cannot hide the cause). */
int32_t ht_step_fail(ht_trainer *t, ht_step *step, ht_slot *s, int32_t rc, const char *what);
/* Keep `rc` and `msg` as the step's error when it is the first; returns rc. */
int32_t ht_step_error(ht_step *step, int32_t rc, const char *msg);

/* Events: callbacks in list order, then the module (docs/semantics.md ordering),
 * with a TRACE copy of the module call for tracing callbacks. Returns the
 * module's ev->result (for on_train_batch_start) in *result if non-NULL. */
int ht_hook(ht_trainer *t, uint32_t id, int64_t batch_idx, const kiln_batch *batch, const kiln_step_output *out,
            double loss, int *result, ht_error *err);
/* ht_hook to some of the listeners only, in the same order: callbacks
 * without KILN_CAP_MONITOR, those with it, the precision plugin, the module.
 * on_train_epoch_end goes to the monitoring callbacks last, after the
 * module (Lightning's fit_loop.on_advance_end). */
enum {
    HT_TO_PLAIN_CALLBACKS = 1,
    HT_TO_MONITORS = 2,
    HT_TO_PRECISION = 4,
    HT_TO_MODULE = 8,
    HT_TO_ALL = 15,
};
int ht_hook_to(ht_trainer *t, int parts, uint32_t id, int64_t batch_idx, const kiln_batch *batch,
               const kiln_step_output *out, double loss, int *result, ht_error *err);
/* Record a call into a plugin for tracing callbacks (hook_trace). */
void ht_trace(ht_trainer *t, int32_t source, const char *what, int64_t batch_idx);

/* KILN_PARAMF_NO_GRAD, torch's `grad is None`: zero_grad of optimizer `opt`
 * (-1: every parameter) sets it on the parameters that optimizer owns; a
 * backward clears it on every parameter that requires a gradient (not
 * KILN_PARAMF_FROZEN). Optimizers skip flagged parameters, so a step after
 * a training_step that returned no loss changes nothing (Lightning 2.x). */
void ht_grads_none(ht_trainer *t, int opt);
void ht_grads_present(ht_trainer *t);

/* Refresh the kiln_trainer_state plugins read from the counters. */
void ht_update_state(ht_trainer *t);

/* Monotonic seconds, for the run summary's timings. */
double ht_now(void);

/* mkdir -p of `dir`; `what` names it in the message ("the checkpoint
 * directory"). */
int ht_mkdirs(const char *dir, const char *what, ht_error *err);

/* Set by the SIGINT/SIGTERM handler (cli_run.c); the loops finish the
 * current batch, save checkpoints/last.safetensors and stop. */
extern volatile sig_atomic_t ht_signal;

#endif
