/*
 * host/error.h — the one way a failure travels in the host: a status and a
 * one-line message (for `kiln: error:`), in an ht_error the caller owns.
 * It sits below every other host file so the stores (run files, loader,
 * registry, safetensors, metrics, checkpoint texts) report the way the
 * training layers above them do, without depending on the run (run.h): a
 * fuzz harness or a test declares `ht_error e = {0};` and calls a parser.
 * The plugin ABI has its own channel, set_error (herr_set in log.c): a
 * thread-local slot that ht_fail reads right after the plugin call, as C
 * code reads errno.
 */
#ifndef KILN_HOST_ERROR_H
#define KILN_HOST_ERROR_H

#include <stdint.h>

/* A failure on its way up: the message that explains it, and its status
 * (a KILN_E_* code) where the function that found it has one. A function
 * taking an ht_error writes it where the failure is found and returns the
 * status (or NULL, or -1, as its header says); the message is the caller's
 * to prefix or print. Inside a step the status must outlive the call that
 * found it (plugins pass only a status back), so step->err keeps the first
 * (ht_step_error in run.h). */
typedef struct ht_error {
    int32_t rc;
    char msg[4096];
} ht_error;

/* printf into err->msg (the status is left as it is); no-op when err is
 * NULL, for a caller that wants only the status. */
void ht_errorf(ht_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same, and `rc` into err->rc; returns rc, so a store can
 * `return ht_errorc(err, KILN_E_CONFIG, "...", ...);`. */
int32_t ht_errorc(ht_error *err, int32_t rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
