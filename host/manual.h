/*
 * host/manual.h — manual optimisation (manual.c): one batch's
 * training_step, inside which the module drives backward and its
 * optimizers through the 1.2 services declared here.
 */
#ifndef KILN_HOST_MANUAL_H
#define KILN_HOST_MANUAL_H

#include <stddef.h>
#include <stdint.h>

#include "run.h"

/* One batch's training_step in manual mode; a failure lands in step->err
 * (the returned status is its rc). The services below reach the step
 * through t->step. */
int ht_manual_step(ht_trainer *t, ht_step *step);

uint32_t ht_svc_optimizer_count(kiln_host_ctx *h);
int32_t ht_svc_manual_backward(kiln_host_ctx *h, double loss);
int32_t ht_svc_optimizer_step(kiln_host_ctx *h, uint32_t index, const struct kiln_closure *closure, int32_t *skipped);
int32_t ht_svc_optimizer_zero_grad(kiln_host_ctx *h, uint32_t index);
int32_t ht_svc_toggle_optimizer(kiln_host_ctx *h, uint32_t index);
int32_t ht_svc_untoggle_optimizer(kiln_host_ctx *h, uint32_t index);

#endif
