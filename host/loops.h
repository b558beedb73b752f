/*
 * host/loops.h — Lightning's loops (loops.c): the fit loop with its
 * sanity check, training epochs and validation, and the evaluation loop of
 * `kiln validate` and `kiln test`.
 */
#ifndef KILN_HOST_LOOPS_H
#define KILN_HOST_LOOPS_H

#include <stddef.h>

#include "run.h"

int ht_run_fit_loop(ht_trainer *t, ht_error *err);
int ht_run_eval_loop(ht_trainer *t, int stage, ht_error *err);

#endif
