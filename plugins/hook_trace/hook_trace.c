/*
 * hook_trace.c — a callback plugin that writes every event it receives to a
 * text file, one line per event, so tests can compare the host's hook order
 * with Lightning's and users can see what their plugin stack was asked to do.
 * A line reads `<source> <name> [batch=<i>] [acc=1] [stage=<stage>]`:
 * "callback <lowercase hook name>" for ordinary hooks, and for KILN_EV_TRACE
 * copies the callee ("module", "precision", "strategy", "optimizer", "host")
 * with the traced call's name from the event's detail. The file is flushed
 * after every line so a trace survives a crashing host. Ranks other than 0
 * write beside rank 0's file ("hooks.rank1.txt") rather than interleave.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/fs_util.h>
#include <kiln/kiln.h>

#include "../common/plugin_common.h"

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    const char *path_cfg; /* from config, valid until destroy            */
    int include_trace;    /* also record KILN_EV_TRACE events             */
    char *path;           /* resolved at the first event                  */
    FILE *fp;
};

/* ---------------------------------------------------------------------------
 * Names */

/* The lowercase Lightning name of a hook id into buf ("on_train_batch_start"),
 * or "event_<id>" for an id this build does not know. */
static const char *ht_hook_name(uint32_t id, char *buf, size_t cap) {
    const char *n = kiln_event_name(id);
    if (!strcmp(n, "UNKNOWN")) {
        snprintf(buf, cap, "event_%u", (unsigned)id);
        return buf;
    }
    size_t i = 0;
    for (; n[i] && i + 1 < cap; i++) buf[i] = (char)(n[i] >= 'A' && n[i] <= 'Z' ? n[i] - 'A' + 'a' : n[i]);
    buf[i] = '\0';
    return buf;
}

static const char *ht_source_name(int32_t src, char *buf, size_t cap) {
    switch (src) {
    case KILN_SRC_CALLBACK: return "callback";
    case KILN_SRC_MODULE: return "module";
    case KILN_SRC_PRECISION: return "precision";
    case KILN_SRC_STRATEGY: return "strategy";
    case KILN_SRC_OPTIMIZER: return "optimizer";
    case KILN_SRC_HOST: return "host";
    default:
        snprintf(buf, cap, "source_%d", (int)src);
        return buf;
    }
}

/* NULL for the fit stage and for an unset (0) stage: those print nothing. */
static const char *ht_stage_name(int32_t stage, char *buf, size_t cap) {
    switch (stage) {
    case 0:
    case KILN_STAGE_FIT: return NULL;
    case KILN_STAGE_VALIDATE: return "validate";
    case KILN_STAGE_TEST: return "test";
    case KILN_STAGE_SANITY: return "sanity";
    default:
        snprintf(buf, cap, "%d", (int)stage);
        return buf;
    }
}

/* ---------------------------------------------------------------------------
 * The file */

/* <run_dir>/<path> (or <path> when absolute or without a run directory);
 * for rank r > 0, ".rank<r>" goes before the file's extension. */
static int32_t ht_open(kiln_instance *self, const kiln_trainer_state *ts) {
    const char *dir = ts && ts->run_dir && ts->run_dir[0] && self->path_cfg[0] != '/' ? ts->run_dir : NULL;
    int32_t rank = ts ? ts->rank : 0;
    size_t n = strlen(self->path_cfg) + (dir ? strlen(dir) + 1 : 0) + 32;
    self->path = malloc(n);
    if (!self->path) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "hook_trace: out of memory");
    int k = dir ? snprintf(self->path, n, "%s/", dir) : 0;
    const char *base = strrchr(self->path_cfg, '/');
    base = base ? base + 1 : self->path_cfg;
    const char *dot = strrchr(base, '.');
    if (rank > 0 && dot && dot != base)
        snprintf(self->path + k, n - (size_t)k, "%.*s.rank%d%s", (int)(dot - self->path_cfg), self->path_cfg,
                 (int)rank, dot);
    else if (rank > 0)
        snprintf(self->path + k, n - (size_t)k, "%s.rank%d", self->path_cfg, (int)rank);
    else
        snprintf(self->path + k, n - (size_t)k, "%s", self->path_cfg);
    kiln_mkdir_parent(self->path);
    self->fp = fopen(self->path, "w");
    if (!self->fp) {
        int err = errno;
        int32_t rc = kiln_errorf(self->svc, self->hctx, KILN_E_IO, "hook_trace: cannot create %s: %s", self->path,
                                 strerror(err));
        free(self->path);
        self->path = NULL;
        return rc;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Events and lifecycle */

static int32_t ht_on_event(kiln_instance *self, kiln_event *ev) {
    if (!self || !ev) return KILN_E_INVALID_ARG;
    if (ev->id == KILN_EV_LOG_METRICS) return KILN_OK;
    if (ev->id == KILN_EV_TRACE && !self->include_trace) return KILN_OK;
    if (!self->fp) {
        int32_t rc = ht_open(self, cbc_trainer(self->svc, self->hctx, ev));
        if (rc != KILN_OK) return rc;
    }

    char name_buf[64], src_buf[32], stage_buf[24];
    const char *source, *name;
    if (ev->id == KILN_EV_TRACE) {
        source = ht_source_name(ev->source, src_buf, sizeof src_buf);
        if (ev->detail)
            name = ev->detail;
        else if (ev->trace_event)
            name = ht_hook_name(ev->trace_event, name_buf, sizeof name_buf);
        else
            name = "trace";
    } else {
        source = "callback";
        name = ht_hook_name(ev->id, name_buf, sizeof name_buf);
    }
    const char *stage = ht_stage_name(ev->stage, stage_buf, sizeof stage_buf);

    fprintf(self->fp, "%s %s", source, name);
    if (ev->batch_idx >= 0) fprintf(self->fp, " batch=%lld", (long long)ev->batch_idx);
    if (ev->accumulating == 1) fputs(" acc=1", self->fp);
    if (stage) fprintf(self->fp, " stage=%s", stage);
    fputc('\n', self->fp);
    /* Flushed per line: the host may die right after this hook. */
    if (fflush(self->fp) != 0 || ferror(self->fp))
        return kiln_errorf(self->svc, self->hctx, KILN_E_IO, "hook_trace: cannot write %s: %s", self->path,
                           strerror(errno ? errno : EIO));
    return KILN_OK;
}

static int32_t ht_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                         kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const char *path = kiln_kv_str(config, "path", "hooks.txt");
    if (!path[0] || path[strlen(path) - 1] == '/')
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "path must name a file, got \"%s\"", path);
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "hook_trace: out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->path_cfg = path;
    self->include_trace = kiln_kv_int(config, "include_trace", 1) != 0;
    *out = self;
    return KILN_OK;
}

static void ht_destroy(kiln_instance *self) {
    if (!self) return;
    if (self->fp) fclose(self->fp);
    free(self->path);
    free(self);
}

static const kiln_callback_ops ht_ops = {
    .base = {.struct_size = sizeof(kiln_callback_ops), .create = ht_create, .destroy = ht_destroy},
    .on_event = ht_on_event,
};

static const kiln_param ht_params[] = {
    {"path", KILN_TYPE_STRING, 0, KILN_V_STR("hooks.txt"), "trace file, relative to the run directory unless absolute"},
    {"include_trace", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1),
     "also record traced calls into the module, precision, strategy and optimizer"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

static const kiln_plugin_desc ht_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_CALLBACK,
    .name = "hook_trace",
    .version = "1.0.0",
    .description = "writes every hook and traced call to a text file, one line each, for tests and debugging",
    .properties = NULL,
    .params = ht_params,
    .ops = &ht_ops,
};

KILN_DEFINE_LIBRARY("hook_trace", "1.0.0", 1, &ht_desc)
