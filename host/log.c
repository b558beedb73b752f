/*
 * host/log.c — stderr logging with a level threshold, the thread-local
 * error slot behind the set_error() host service, and the writers of the
 * host's own ht_error (error.h: every host file links this one, the fuzz
 * harnesses' parsers included). One fprintf per line so lines from several
 * threads do not interleave mid-line.
 */
#define _GNU_SOURCE
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"

static int g_level = KILN_LOG_INFO;
static int g_loader_debug = 0;

static _Thread_local int t_err_code;
static _Thread_local char t_err_msg[1024];

static int g_quiet = 0;

void hlog_set_level(int level) { g_level = level; }
int hlog_level(void) { return g_level; }
void hlog_set_quiet(int q) { g_quiet = q; }
int hlog_quiet(void) { return g_quiet; }
int hlog_loader_debug(void) { return g_loader_debug; }

void hlog_init_from_env(void) {
    const char *v = getenv("KILN_LOG");
    if (v) {
        if (!strcasecmp(v, "trace")) g_level = KILN_LOG_TRACE;
        else if (!strcasecmp(v, "debug")) g_level = KILN_LOG_DEBUG;
        else if (!strcasecmp(v, "info")) g_level = KILN_LOG_INFO;
        else if (!strcasecmp(v, "warn")) g_level = KILN_LOG_WARN;
        else if (!strcasecmp(v, "error")) g_level = KILN_LOG_ERROR;
    }
    const char *d = secure_getenv("KILN_PLUGIN_DEBUG");
    g_loader_debug = d && *d && strcmp(d, "0") != 0;
}

static const char *level_name(int level) {
    switch (level) {
    case KILN_LOG_TRACE: return "trace";
    case KILN_LOG_DEBUG: return "debug";
    case KILN_LOG_INFO: return "info";
    case KILN_LOG_WARN: return "warning";
    default: return "error";
    }
}

void hlogv(int level, const char *fmt, va_list ap) {
    if (level < g_level) return;
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    fprintf(stderr, "kiln: %s: %s\n", level_name(level), line);
}

void hlog(int level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    hlogv(level, fmt, ap);
    va_end(ap);
}

void hlog_loader(const char *fmt, ...) {
    if (!g_loader_debug) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kiln: loader: %s\n", line);
}

void ht_errorf(ht_error *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

int32_t ht_errorc(ht_error *err, int32_t rc, const char *fmt, ...) {
    if (!err) return rc;
    err->rc = rc;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return rc;
}

void herr_clear(void) {
    t_err_code = 0;
    t_err_msg[0] = 0;
}

void herr_set(int code, const char *msg) {
    t_err_code = code;
    snprintf(t_err_msg, sizeof t_err_msg, "%s", msg ? msg : "");
}

const char *herr_msg(void) { return t_err_msg; }
int herr_code(void) { return t_err_code; }

size_t hedit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return HEDIT_FAR;
    /* three rows: a transposition looks two rows back */
    size_t rows[3][65], *pp = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t x = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < x) x = prev[j] + 1;
            if (cur[j - 1] + 1 < x) x = cur[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && pp[j - 2] + 1 < x)
                x = pp[j - 2] + 1;
            cur[j] = x;
        }
        size_t *t = pp;
        pp = prev;
        prev = cur;
        cur = t;
    }
    return prev[lb];
}

/* The loader's bookkeeping has no way to go on without its lists: out of
 * memory there ends the process with one line. */
char *hmem_strdup(const char *s) {
    char *d = strdup(s ? s : "");
    if (!d) { HLOG_ERROR("out of memory"); abort(); }
    return d;
}

void *hmem_realloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q && n) { HLOG_ERROR("out of memory"); abort(); }
    return q;
}
