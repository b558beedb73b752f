/*
 * host/services.h — plugin instances: kiln_host_ctx, the per-instance handle
 * every service call carries, creating and destroying an instance, and the
 * services that need no run. A host context knows which plugin it belongs to
 * (for log prefixes and error attribution), the plugin's resolved config and
 * the trainer's (for config_get), and how much host memory the instance holds
 * (leaks are reported when the instance is destroyed).
 */
#ifndef KILN_HOST_SERVICES_H
#define KILN_HOST_SERVICES_H

#include <stddef.h>

#include "error.h"
#include "kiln/plugin.h"
#include "loader.h"

/* Where log_metric() goes; the trainer installs one. */
typedef void (*hs_metric_sink)(void *user, const char *name, double value, int64_t step);

struct kiln_host_ctx {
    const hl_plugin *plugin;     /* NULL for host-internal contexts            */
    char label[96];              /* "optimizer:sgd" for log lines              */
    const kiln_kv *config;       /* the plugin's resolved section              */
    const kiln_kv *trainer_cfg;  /* the trainer's resolved section             */
    hs_metric_sink metric_sink;
    void *metric_user;
    size_t live_bytes;           /* host memory held through alloc()           */
    size_t live_blocks;
    struct ht_trainer *trainer;  /* the run this instance belongs to, or NULL  */
    int may_register;            /* param_register allowed (module create)     */
};

/* The services that need no run (services.c); plugin_api.c lists them in
 * the services table with the others. */
void hs_svc_log(kiln_host_ctx *h, int32_t level, const char *msg);
int32_t hs_svc_log_enabled(kiln_host_ctx *h, int32_t level);
void hs_svc_set_error(kiln_host_ctx *h, int32_t code, const char *msg);
void *hs_svc_alloc(kiln_host_ctx *h, size_t size, size_t align);
void hs_svc_free(kiln_host_ctx *h, void *ptr);
int32_t hs_svc_config_get(kiln_host_ctx *h, const char *key, kiln_value *out);
void hs_svc_log_metric(kiln_host_ctx *h, const char *name, double value, int64_t step);

void hs_ctx_init(kiln_host_ctx *h, const hl_plugin *p, const kiln_kv *config, const kiln_kv *trainer);

/* Create an instance of `p` with the context's config, handing it
 * `services` (plugin_api.c's hs_services()); on failure returns the status
 * and writes "kind 'name' (file): message [CODE]" into err. */
int hs_create(kiln_host_ctx *h, const kiln_host_services *services, const hl_plugin *p, kiln_instance **out,
              ht_error *err);
/* Destroy and report leaked host memory. */
void hs_destroy(kiln_host_ctx *h, kiln_instance *inst);

/* Format the error of a failed plugin call: prefix + herr_msg() + status. */
void hs_format_error(const kiln_host_ctx *h, int32_t rc, const char *what, ht_error *err);

#endif
