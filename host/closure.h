/*
 * host/closure.h — automatic optimisation of one batch (closure.c) and the
 * backward sequence both optimisation modes share.
 */
#ifndef KILN_HOST_CLOSURE_H
#define KILN_HOST_CLOSURE_H

#include <stddef.h>

#include "run.h"

/* Run automatic optimisation for the step's batch: the closure directly
 * while accumulating, else through LM.optimizer_step → P.optimizer_step →
 * O.step(closure). The result lands in step->output; a failure in
 * step->err (the returned status is step->err.rc's). */
int ht_automatic_step(ht_trainer *t, ht_step *step);
/* The backward sequence both optimisation modes run: strategy and
 * precision pre_backward, on_before_backward, the module's backward with
 * dloss = scale / divide, on_after_backward, and the strategy's
 * post_backward when `sync`. */
int32_t ht_backward(ht_trainer *t, ht_step *step, double loss, double divide, int sync);

#endif
