/*
 * host/services.c — plugin instances and the services that need no run:
 * the host context each instance's calls carry, create and destroy (with
 * the report of leaked host memory), the error line of a failed call, and
 * logging, errors, host memory, config_get and log_metric. Host memory handed out through
 * alloc() carries a small header (size, owner) so free() can account it to
 * the instance and destroy can report leaks. Services are thread-safe except
 * where noted: the per-context byte counters are only touched from the
 * instance's own calls, which the host never makes concurrently.
 */
#define _GNU_SOURCE
#include "services.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* ---------------------------------------------------------------------------
 * Services */

void hs_svc_log(kiln_host_ctx *h, int32_t level, const char *msg) {
    if (level < KILN_LOG_TRACE) level = KILN_LOG_TRACE;
    if (level > KILN_LOG_ERROR) level = KILN_LOG_ERROR;
    if (h && h->label[0]) hlog(level, "[%s] %s", h->label, msg ? msg : "");
    else hlog(level, "%s", msg ? msg : "");
}

int32_t hs_svc_log_enabled(kiln_host_ctx *h, int32_t level) { return level >= hlog_level(); }

void hs_svc_set_error(kiln_host_ctx *h, int32_t code, const char *msg) { herr_set(code, msg); }

typedef struct { size_t size; kiln_host_ctx *owner; size_t offset; size_t magic; } alloc_hdr;
#define ALLOC_MAGIC ((size_t)0x6b696c6e616c6c63ull) /* "kilnallc" */

void *hs_svc_alloc(kiln_host_ctx *h, size_t size, size_t align) {
    if (align == 0) align = 16;
    if (align < sizeof(alloc_hdr)) align = 32;
    if ((align & (align - 1)) || align > 4096 || size > ((size_t)1 << 48)) return NULL;
    void *base = NULL;
    if (posix_memalign(&base, align, align + size) != 0) return NULL;
    char *p = (char *)base + align;
    alloc_hdr *hd = (alloc_hdr *)(p - sizeof(alloc_hdr));
    hd->size = size;
    hd->owner = h;
    hd->offset = align;
    hd->magic = ALLOC_MAGIC;
    if (h) { h->live_bytes += size; h->live_blocks++; }
    return p;
}

void hs_svc_free(kiln_host_ctx *h, void *ptr) {
    if (!ptr) return;
    alloc_hdr *hd = (alloc_hdr *)((char *)ptr - sizeof(alloc_hdr));
    if (hd->magic != ALLOC_MAGIC) {
        hlog(KILN_LOG_ERROR, "[%s] free() of a pointer that did not come from alloc(); ignored",
             h && h->label[0] ? h->label : "plugin");
        return;
    }
    hd->magic = 0;
    if (hd->owner) { hd->owner->live_bytes -= hd->size; hd->owner->live_blocks--; }
    free((char *)ptr - hd->offset);
}

int32_t hs_svc_config_get(kiln_host_ctx *h, const char *key, kiln_value *out) {
    if (!h || !key || !out) return KILN_E_INVALID_ARG;
    const kiln_kv *src = h->config;
    if (strncmp(key, "trainer.", 8) == 0) { src = h->trainer_cfg; key += 8; }
    const kiln_value *v = kiln_kv_find(src, key);
    if (!v) return KILN_E_NOT_FOUND;
    *out = *v;
    return KILN_OK;
}

void hs_svc_log_metric(kiln_host_ctx *h, const char *name, double value, int64_t step) {
    if (h && h->metric_sink && name) h->metric_sink(h->metric_user, name, value, step);
}

/* ---------------------------------------------------------------------------
 * Instances */

void hs_ctx_init(kiln_host_ctx *h, const hl_plugin *p, const kiln_kv *config, const kiln_kv *trainer) {
    memset(h, 0, sizeof *h);
    h->plugin = p;
    h->config = config;
    h->trainer_cfg = trainer;
    if (p) snprintf(h->label, sizeof h->label, "%s:%s", hl_kind_name(p->view.kind), p->view.name);
}

void hs_format_error(const kiln_host_ctx *h, int32_t rc, const char *what, ht_error *err) {
    const char *msg = *herr_msg() ? herr_msg() : kiln_strerror(rc);
    if (h->plugin)
        ht_errorf(err, "%s '%s' (%s): %s%s%s [%s]", hl_kind_name(h->plugin->view.kind), h->plugin->view.name,
                  h->plugin->lib->path, what ? what : "", what ? ": " : "", msg, kiln_status_name(rc));
    else ht_errorf(err, "%s%s%s [%s]", what ? what : "", what ? ": " : "", msg, kiln_status_name(rc));
}

int hs_create(kiln_host_ctx *h, const kiln_host_services *services, const hl_plugin *p, kiln_instance **out,
              ht_error *err) {
    *out = NULL;
    herr_clear();
    int32_t rc = p->ops->create(p->view.plugin_ctx, services, h, h->config, out);
    if (rc != KILN_OK || !*out) {
        if (rc == KILN_OK) { rc = KILN_E_INTERNAL; herr_set(rc, "create returned success but no instance"); }
        hs_format_error(h, rc, "create failed", err);
        *out = NULL;
        return rc;
    }
    return KILN_OK;
}

void hs_destroy(kiln_host_ctx *h, kiln_instance *inst) {
    if (!inst) return;
    h->plugin->ops->destroy(inst);
    if (h->live_blocks)
        hlog(KILN_LOG_WARN, "[%s] leaked %zu bytes of host memory in %zu block(s) at destroy", h->label,
             h->live_bytes, h->live_blocks);
}
