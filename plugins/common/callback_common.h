/*
 * callback_common.h — small pieces the callback plugins that write files or
 * speak for one rank (csv_logger, tensorboard, hook_trace, progress) had
 * each written out: the trainer state an event is about, the rank-0 gate
 * of the loggers, a config integer's lower bound, and closing and reporting a file the way every logger
 * reports I/O failures ("<plugin>: cannot <what> <path>: <strerror>").
 *
 * Header only, every function static inline: each plugin compiles its own
 * copy, with no source to add to its target. Internal to the plugins;
 * never installed. Names start with cbc_ (callback common).
 */
#ifndef KILN_PLUGINS_COMMON_CALLBACK_COMMON_H
#define KILN_PLUGINS_COMMON_CALLBACK_COMMON_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <kiln/kiln.h>

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

#endif /* KILN_PLUGINS_COMMON_CALLBACK_COMMON_H */
