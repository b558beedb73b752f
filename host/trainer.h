/*
 * host/trainer.h — setting up and tearing down a run: ht_open instantiates
 * the plugin stack a run file names (accelerator, strategy, precision,
 * data, module, optimizers, scheduler, callbacks) and allocates the
 * parameters; ht_fit and ht_evaluate run Lightning's loops (loops.c) on it;
 * ht_close destroys it. cli_run.c drives them for `kiln fit|validate|test`.
 * The run's state and hook dispatch are the layer below (run.h).
 */
#ifndef KILN_HOST_TRAINER_H
#define KILN_HOST_TRAINER_H

#include <stddef.h>

#include "run.h"

/* Open a run: instantiate the stack (the optimizers and the scheduler for
 * fit only) and set up the parameters. On failure err->msg holds one line
 * and everything is released. */
int ht_open(ht_trainer *t, hc_config *cfg, hl_loader *loader, int stage, ht_error *err);
/* Create <default_root_dir>/version_N, write the effective config there. */
int ht_make_run_dir(ht_trainer *t, ht_error *err);
int ht_fit(ht_trainer *t, ht_error *err);
/* validate (KILN_STAGE_VALIDATE) or test (KILN_STAGE_TEST) with the current weights */
int ht_evaluate(ht_trainer *t, int stage, ht_error *err);
void ht_print_summary(ht_trainer *t, const char *verb);
/* Destroy every instance (reverse creation order). */
void ht_close(ht_trainer *t);

#endif
