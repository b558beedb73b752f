/*
 * plugin_common.h — small pieces several plugins had each written out.
 * The callbacks that write files or speak for one rank (csv_logger,
 * tensorboard, hook_trace, progress, checkpoint): the trainer state an event
 * is about, the rank-0 gate of the loggers, a config integer's lower bound,
 * and closing and reporting a file the way every logger reports I/O
 * failures ("<plugin>: cannot <what> <path>: <strerror>"). The model and
 * precision plugins (gpt, mlp, mixed, gan): their one-line error report,
 * PLUGIN_FAIL (each had copied kiln_errorf's body, only to give its own
 * first argument and to have the compiler check the message's format), and
 * a step's output of a loss over B samples.
 *
 * Header only, every function static inline: each plugin compiles its own
 * copy, with no source to add to its target. Internal to the plugins;
 * never installed. Names start with cbc_ (callbacks), PLUGIN_ and module_.
 */
#ifndef KILN_PLUGINS_COMMON_PLUGIN_COMMON_H
#define KILN_PLUGINS_COMMON_PLUGIN_COMMON_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <kiln/kiln.h>

/* ------------------------------------------------------------- callbacks */

/* The trainer state an event is about: the event's own, else (ABI 1.1
 * hosts) the host's current one; NULL when neither is known. */
static inline const kiln_trainer_state *cbc_trainer(const kiln_host_services *svc, kiln_host_ctx *hctx,
                                                    const kiln_event *ev) {
    if (ev && ev->trainer) return ev->trainer;
    return svc->abi_minor >= 1 && svc->trainer_state ? svc->trainer_state(hctx) : NULL;
}

/* A logger's entry gate: *ts as cbc_trainer finds it, and whether this
 * process writes (rank 0, or no trainer state to say otherwise). */
static inline int cbc_rank0(const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_event *ev,
                            const kiln_trainer_state **ts) {
    *ts = cbc_trainer(svc, hctx, ev);
    return !*ts || (*ts)->rank == 0;
}

/* A config integer's lower bound: KILN_OK, or KILN_E_CONFIG with
 * "<prefix><key> must be >= <min><why>, got <v>" (prefix "checkpoint: " or
 * "", why " (0: off)" or ""). */
static inline int32_t cbc_at_least(const kiln_host_services *svc, kiln_host_ctx *hctx, const char *prefix,
                                   const char *key, int64_t v, int64_t min, const char *why) {
    if (v >= min) return KILN_OK;
    return kiln_errorf(svc, hctx, KILN_E_CONFIG, "%s%s must be >= %lld%s, got %lld", prefix, key, (long long)min, why,
                       (long long)v);
}

/* "<plugin>: cannot <what> <path>: <strerror(err)>" as KILN_E_IO. */
static inline int32_t cbc_io_error(const kiln_host_services *svc, kiln_host_ctx *hctx, const char *plugin,
                                   const char *what, const char *path, int err) {
    return kiln_errorf(svc, hctx, KILN_E_IO, "%s: cannot %s %s: %s", plugin, what, path, strerror(err));
}

/* Closes *fp (when open) and forgets it: 0, or the errno fclose left. */
static inline int cbc_fclose(FILE **fp) {
    if (!*fp) return 0;
    const int err = fclose(*fp) != 0 ? errno : 0;
    *fp = NULL;
    return err;
}

/* ------------------------------------------------- modules and precisions */

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

#endif /* KILN_PLUGINS_COMMON_PLUGIN_COMMON_H */
