/*
 * host/log.h — the host's logging and its per-thread error slot. Every line
 * goes to stderr as "kiln: LEVEL: text" (INFO and above by default;
 * KILN_LOG=debug|trace or -v lowers the threshold, KILN_PLUGIN_DEBUG=1 turns
 * on loader tracing). The error slot carries the detail a plugin passes to
 * set_error() back to the host code that prefixes it with kind, name and file.
 * Also the one edit distance behind each did-you-mean (run-file keys,
 * plugin names, the plugin entry point); the host's own failures travel in
 * an ht_error (error.h), whose writers ht_errorf and ht_errorc log.c holds.
 */
#ifndef KILN_HOST_LOG_H
#define KILN_HOST_LOG_H

#include <stdarg.h>
#include <stddef.h>

#include "kiln/plugin.h"

void hlog_set_level(int level);
int hlog_level(void);
/* -q given n times: 1 silences progress bars and info/warning lines (the
 * log level becomes ERROR), 2 also the end-of-run summary. */
void hlog_set_quiet(int q);
int hlog_quiet(void);
void hlog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hlogv(int level, const char *fmt, va_list ap);

/* Loader tracing (KILN_PLUGIN_DEBUG=1): printed at any level when enabled. */
int hlog_loader_debug(void);
void hlog_loader(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void hlog_init_from_env(void);

/* The thread-local error slot: last message set by a plugin or host code. */
void herr_clear(void);
void herr_set(int code, const char *msg);
const char *herr_msg(void); /* "" when none */
int herr_code(void);

/* Damerau-Levenshtein distance (optimal string alignment: insertions,
 * deletions, substitutions and adjacent transpositions each count one), the
 * measure of every did-you-mean; HEDIT_FAR when either string is longer
 * than 64 bytes (names that long are never suggested). */
#define HEDIT_FAR 99
size_t hedit_distance(const char *a, const char *b);

#define HLOG_ERROR(...) hlog(KILN_LOG_ERROR, __VA_ARGS__)
#define HLOG_WARN(...) hlog(KILN_LOG_WARN, __VA_ARGS__)
#define HLOG_INFO(...) hlog(KILN_LOG_INFO, __VA_ARGS__)
#define HLOG_DEBUG(...) hlog(KILN_LOG_DEBUG, __VA_ARGS__)

/* strdup (NULL reads as "") and realloc that end the process with one
 * line when out of memory. */
char *hmem_strdup(const char *s);
void *hmem_realloc(void *p, size_t n);

#endif
