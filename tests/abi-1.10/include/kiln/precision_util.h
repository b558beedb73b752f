/*
 * kiln/precision_util.h — header-only help for precision plugins: the
 * optimizer step of Lightning's base Precision, which every precision
 * without a gradient scaler uses as is. It wraps the host's closure so that
 * the optimizer, calling it (once, or many times for LBFGS), runs
 * training_step, zero_grad and backward and then `after_closure`
 * (on_before_optimizer_step and clipping), then updates. Nothing here is
 * part of the binary ABI; plugins may use it or not.
 */
#ifndef KILN_PRECISION_UTIL_H
#define KILN_PRECISION_UTIL_H

#include "kiln/training.h"

typedef struct kiln__wrapped_closure {
    const kiln_closure *closure, *after;
} kiln__wrapped_closure;

static inline int32_t kiln__wrapped_call(void *ctx, double *loss) {
    const kiln__wrapped_closure *w = (const kiln__wrapped_closure *)ctx;
    int32_t rc = w->closure->call(w->closure->ctx, loss);
    if (rc != KILN_OK) return rc;
    double ignored;
    return w->after ? w->after->call(w->after->ctx, &ignored) : KILN_OK;
}

/* Precision.optimizer_step: opt.step(closure = wrapped); *skipped = 0. */
static inline int32_t kiln_precision_default_step(const kiln_optimizer_ref *opt, const kiln_closure *closure,
                                                  const kiln_closure *after_closure, int32_t *skipped) {
    kiln__wrapped_closure w = {closure, after_closure};
    kiln_closure wrapped = {sizeof(kiln_closure), 0, &w, kiln__wrapped_call};
    if (skipped) *skipped = 0;
    return opt->step(opt->ctx, &wrapped);
}

#endif /* KILN_PRECISION_UTIL_H */
