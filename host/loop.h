/*
 * host/loop.h — the one shape every loop has (Lightning's _Loop), and the
 * closure of automatic optimisation. A loop is a table of functions over its
 * own state; ht_loop_run() drives it:
 *
 *   if skip: return
 *   reset → on_run_start → while !done: advance → on_advance_end → on_run_end
 *
 * advance may return HT_LOOP_STOP (Lightning's StopIteration): the loop
 * breaks at once, skipping that iteration's on_advance_end. The fit loop
 * runs the training epoch loop inside its advance; the epoch loop runs
 * automatic optimisation per batch and the evaluation loop when validation
 * is due. Checkpoint/resume will add restart flags to this shape.
 */
#ifndef KILN_HOST_LOOP_H
#define KILN_HOST_LOOP_H

#include <stddef.h>

#include "trainer.h"

#define HT_LOOP_STOP 1

typedef struct ht_loop ht_loop;
struct ht_loop {
    const char *name;
    ht_trainer *t;
    int (*skip)(ht_loop *L);                                    /* may be NULL */
    int (*reset)(ht_loop *L, char *why, size_t whylen);
    int (*on_run_start)(ht_loop *L, char *why, size_t whylen);
    int (*done)(ht_loop *L);
    int (*advance)(ht_loop *L, char *why, size_t whylen);        /* HT_LOOP_STOP breaks */
    int (*on_advance_end)(ht_loop *L, char *why, size_t whylen);
    int (*on_run_end)(ht_loop *L, char *why, size_t whylen);
};

int ht_loop_run(ht_loop *L, char *why, size_t whylen);

/* ---------------------------------------------------------------------------
 * The closure (loops/optimization/closure.py): three functions called in
 * order — step (training_step), zero_grad, backward — the result cached and
 * consumed once per batch. zero_grad_fn / backward_fn are NULL when the batch
 * does not zero gradients (mid accumulation window) or skips backward. */
typedef struct ht_closure ht_closure;
struct ht_closure {
    ht_trainer *t;
    int32_t (*step_fn)(ht_closure *c, kiln_step_output *out);
    int32_t (*zero_grad_fn)(ht_closure *c);
    int32_t (*backward_fn)(ht_closure *c, double loss);
    kiln_step_output result;   /* cached: the loss divided by accumulate */
    int has_result;
    int calls;                 /* how often the optimizer called it     */
    kiln_closure abi;          /* what plugins receive                  */
};

/* Run automatic optimisation for the current batch (t->batch, t->batch_idx,
 * t->accumulating): the closure directly while accumulating, else through
 * LM.optimizer_step → P.optimizer_step → O.step(closure). */
int ht_automatic_step(ht_trainer *t, char *why, size_t whylen);
/* The backward sequence both optimisation modes run (closure.c): strategy
 * and precision pre_backward, on_before_backward, the module's backward with
 * dloss = scale / divide, on_after_backward, and the strategy's
 * post_backward when `sync`. */
int32_t ht_backward(ht_trainer *t, double loss, double divide, int sync, char *why, size_t whylen);
/* Manual optimisation (manual.c): one batch's training_step, inside which
 * the module drives backward and its optimizers through the services. */
int ht_manual_step(ht_trainer *t, char *why, size_t whylen);

#endif
