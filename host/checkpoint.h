/*
 * host/checkpoint.h — what a run writes and reads back as a checkpoint, in
 * the safetensors format (host/safetensors.h): the module's parameters under
 * their registered names (F32, readable by any safetensors reader) and the
 * trainer's facts in __metadata__ (format, kiln and ABI versions, the plugin
 * stack, epoch, global step, the effective run file). At the end of every
 * training epoch the trainer replaces <run_dir>/checkpoints/last.safetensors
 * atomically, as Lightning's default ModelCheckpoint saves each epoch.
 * Every plugin with get_state adds its state as a U8 tensor
 * "__state__.<role>" ("optimizer", "data", "callbacks.0", ...) with
 * "state.<role>" = {"plugin":..,"version":..}, and "loops" and "progress"
 * hold the loop counters as JSON objects (docs/checkpoints.md). `kiln validate|test --ckpt PATH|last` load the weights into the
 * stack the run file describes (names and shapes must match); `kiln fit
 * --ckpt` resumes: weights, plugin states and progress, then training goes on
 * where it stopped, bit-identical to a run that never stopped. Besides the
 * end-of-epoch file, callbacks request checkpoints (save_checkpoint) that
 * are written at the end of the current batch; "progress" holds every loop
 * counter, so such a file resumes inside its epoch. A file without it (an
 * older kiln's) is refused for resuming; its weights still load.
 */
#ifndef KILN_HOST_CHECKPOINT_H
#define KILN_HOST_CHECKPOINT_H

#include <stddef.h>

#include "run.h"

#define HT_CKPT_FORMAT "kiln-checkpoint-1"

/* Write the parameters and trainer metadata to `path` atomically. */
int ht_ckpt_save(ht_trainer *t, const char *path, ht_error *err);
/* <run_dir>/checkpoints/last.safetensors (the directory is created). */
int ht_ckpt_save_last(ht_trainer *t, ht_error *err);
/* Load parameters from `path` into the open stack: every parameter must be
 * present with the same shape and dtype F32. */
int ht_ckpt_load_weights(ht_trainer *t, const char *path, ht_error *err);
/* Resume a fit from an end-of-epoch checkpoint: weights, plugin states
 * (the plugin writing each must be the one restoring it), loop progress. */
int ht_ckpt_resume(ht_trainer *t, const char *path, ht_error *err);
/* Write the checkpoints requested through save_checkpoint (consistent
 * points of the loops only: end of a batch, end of an epoch). */
int ht_ckpt_flush(ht_trainer *t, ht_error *err);
/* "last": the newest <default_root_dir>/version_N/checkpoints/last.safetensors;
 * anything else is a path. */
int ht_ckpt_resolve(const ht_trainer *t, const char *arg, char *out, size_t outlen, ht_error *err);
/* The save_checkpoint service (1.2): a request written at the next
 * consistent point. */
int32_t ht_svc_save_checkpoint(kiln_host_ctx *h, const char *path);

#endif
