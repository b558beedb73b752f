/*
 * host/services.c — the services table handed to plugins and the bootstrap
 * struct passed to kiln_plugin_init_v1. Host memory handed out through
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
#include "version.h"

/* ---------------------------------------------------------------------------
 * Services */

static void svc_log(kiln_host_ctx *h, int32_t level, const char *msg) {
    if (level < KILN_LOG_TRACE) level = KILN_LOG_TRACE;
    if (level > KILN_LOG_ERROR) level = KILN_LOG_ERROR;
    if (h && h->label[0]) hlog(level, "[%s] %s", h->label, msg ? msg : "");
    else hlog(level, "%s", msg ? msg : "");
}

static int32_t svc_log_enabled(kiln_host_ctx *h, int32_t level) { return level >= hlog_level(); }

static void svc_set_error(kiln_host_ctx *h, int32_t code, const char *msg) { herr_set(code, msg); }

typedef struct { size_t size; kiln_host_ctx *owner; size_t offset; size_t magic; } alloc_hdr;
#define ALLOC_MAGIC ((size_t)0x6b696c6e616c6c63ull) /* "kilnallc" */

static void *svc_alloc(kiln_host_ctx *h, size_t size, size_t align) {
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

static void svc_free(kiln_host_ctx *h, void *ptr) {
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

static int32_t svc_config_get(kiln_host_ctx *h, const char *key, kiln_value *out) {
    if (!h || !key || !out) return KILN_E_INVALID_ARG;
    const kiln_kv *src = h->config;
    if (strncmp(key, "trainer.", 8) == 0) { src = h->trainer_cfg; key += 8; }
    const kiln_value *v = kiln_kv_find(src, key);
    if (!v) return KILN_E_NOT_FOUND;
    *out = *v;
    return KILN_OK;
}

static void svc_log_metric(kiln_host_ctx *h, const char *name, double value, int64_t step) {
    if (h && h->metric_sink && name) h->metric_sink(h->metric_user, name, value, step);
}

static const kiln_host_services g_services = {
    .struct_size = sizeof(kiln_host_services),
    .abi_major = KILN_ABI_MAJOR,
    .abi_minor = KILN_ABI_MINOR,
    .log = svc_log,
    .log_enabled = svc_log_enabled,
    .set_error = svc_set_error,
    .alloc = svc_alloc,
    .free = svc_free,
    .config_get = svc_config_get,
    .log_metric = svc_log_metric,
    .accelerator = ht_svc_accelerator,
    .param_register = ht_svc_param_register,
    .params = ht_svc_params,
    .trainer_state = ht_svc_trainer_state,
    .log_value = ht_svc_log_value,
    .get_metric = ht_svc_get_metric,
    .request_stop = ht_svc_request_stop,
    .seed = ht_svc_seed,
    .optimizer_count = ht_svc_optimizer_count,
    .manual_backward = ht_svc_manual_backward,
    .optimizer_step = ht_svc_optimizer_step,
    .optimizer_zero_grad = ht_svc_optimizer_zero_grad,
    .toggle_optimizer = ht_svc_toggle_optimizer,
    .untoggle_optimizer = ht_svc_untoggle_optimizer,
    .save_checkpoint = ht_svc_save_checkpoint,
    .barrier = ht_svc_barrier,
    .reduce = ht_svc_reduce,
    .broadcast = ht_svc_broadcast,
    .all_gather = ht_svc_all_gather,
    .predict = ht_svc_predict,
    .round_activation = ht_svc_round_activation,
};

static const kiln_host_services *get_services(uint16_t major, uint16_t min_minor) {
    if (major != KILN_ABI_MAJOR || min_minor > KILN_ABI_MINOR) return NULL;
    return &g_services;
}

static const kiln_host_base g_base = {
    .struct_size = sizeof(kiln_host_base),
    .abi_major = KILN_ABI_MAJOR,
    .abi_minor = KILN_ABI_MINOR,
    .host_version = KILN_VERSION_STRING,
    .get_services = get_services,
    .known_capabilities = KILN_CAP_KNOWN_1_5,
};

const kiln_host_base *hs_host_base(void) { return &g_base; }
const kiln_host_services *hs_services(void) { return &g_services; }

/* ---------------------------------------------------------------------------
 * Instances */

void hs_ctx_init(kiln_host_ctx *h, const hl_plugin *p, const kiln_kv *config, const kiln_kv *trainer) {
    memset(h, 0, sizeof *h);
    h->plugin = p;
    h->config = config;
    h->trainer_cfg = trainer;
    if (p) snprintf(h->label, sizeof h->label, "%s:%s", hl_kind_name(p->view.kind), p->view.name);
}

void hs_format_error(const kiln_host_ctx *h, int32_t rc, const char *what, char *why, size_t whylen) {
    const char *msg = *herr_msg() ? herr_msg() : kiln_strerror(rc);
    if (h->plugin)
        snprintf(why, whylen, "%s '%s' (%s): %s%s%s [%s]", hl_kind_name(h->plugin->view.kind), h->plugin->view.name,
                 h->plugin->lib->path, what ? what : "", what ? ": " : "", msg, kiln_status_name(rc));
    else snprintf(why, whylen, "%s%s%s [%s]", what ? what : "", what ? ": " : "", msg, kiln_status_name(rc));
}

int hs_create(kiln_host_ctx *h, const hl_plugin *p, kiln_instance **out, char *why, size_t whylen) {
    *out = NULL;
    herr_clear();
    int32_t rc = p->ops->create(p->view.plugin_ctx, &g_services, h, h->config, out);
    if (rc != KILN_OK || !*out) {
        if (rc == KILN_OK) { rc = KILN_E_INTERNAL; herr_set(rc, "create returned success but no instance"); }
        hs_format_error(h, rc, "create failed", why, whylen);
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
