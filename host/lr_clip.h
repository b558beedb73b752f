/*
 * host/lr_clip.h — what the trainer does to the optimizers between steps
 * (lr_clip.c): the learning-rate schedule and gradient clipping.
 */
#ifndef KILN_HOST_LR_CLIP_H
#define KILN_HOST_LR_CLIP_H

#include <stddef.h>
#include <stdint.h>

#include "run.h"

/* When the scheduler in t->scheduler steps: the host keys of its section. */
typedef struct ht_schedule_keys {
    const char *interval; /* "step" or "epoch"                              */
    const char *monitor;  /* the metric a plateau schedule reads, or NULL   */
    int64_t frequency;
} ht_schedule_keys;

/* Read every optimizer's configured rate; with a scheduler open in
 * t->scheduler (trainer.c opens it after the optimizers), check `keys`
 * and set the rate of scheduler step 0, as PyTorch schedulers do when they
 * are constructed. */
int ht_start_schedule(ht_trainer *t, const ht_schedule_keys *keys, ht_error *err);
/* Lightning's update_lr_schedulers(interval, update_plateau_schedulers):
 * per_epoch 0 after a stepping batch, 1 at the epoch's last batch
 * (plateau 0) or after on_train_epoch_end (plateau 1, monitored ones).
 * `step` is the batch that just ran (NULL after the epoch): a per-step
 * schedule steps after a batch that is not accumulating. */
int ht_update_lr(ht_trainer *t, const ht_step *step, int per_epoch, int plateau, ht_error *err);
/* Clip the gradients of every parameter (trainer.gradient_clip_val), log
 * the total norm; called after unscale and on_before_optimizer_step. */
int ht_clip_gradients(ht_trainer *t, ht_error *err);

#endif
