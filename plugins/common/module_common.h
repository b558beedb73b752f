/*
 * module_common.h — what the model and precision plugins (gpt, mlp, mixed,
 * gan) had each written out. Their one-line error report: each had copied
 * kiln_errorf's body, only to give its own first argument and to have the
 * compiler check the message's format. PLUGIN_FAIL keeps both: it is
 * kiln_errorf (the SDK's printf-style set_error, which returns the code),
 * with the format checked at compile time by a function that is never
 * called (kiln_errorf itself declares no format attribute, and the public
 * header is frozen). And a step's output of a loss over B samples
 * (mlp's and gan's steps).
 *
 * Header only. Internal to the plugins; never installed.
 */
#ifndef KILN_PLUGINS_COMMON_MODULE_COMMON_H
#define KILN_PLUGINS_COMMON_MODULE_COMMON_H

#include <kiln/kiln.h>

/* Never called (PLUGIN_FAIL puts it behind `0 &&`): its attribute has the
 * compiler check a message against its arguments. */
__attribute__((format(printf, 1, 2))) static inline int plugin_fail_format(const char *fmt, ...) {
    (void)fmt;
    return 0;
}

/* kiln_errorf(svc, hctx, code, fmt, ...) with the format checked; returns
 * code. */
#define PLUGIN_FAIL(svc, hctx, code, ...) \
    ((void)(0 && plugin_fail_format(__VA_ARGS__)), kiln_errorf((svc), (hctx), (code), __VA_ARGS__))

/* A training or evaluation step's output, when the host asked for one: the
 * loss over B samples (what the progress bar and the monitors read). */
static inline void module_step_loss(kiln_step_output *out, double loss, int32_t B) {
    if (!out) return;
    out->struct_size = sizeof *out;
    out->has_loss = 1;
    out->loss = loss;
    out->batch_size = B;
}

#endif /* KILN_PLUGINS_COMMON_MODULE_COMMON_H */
