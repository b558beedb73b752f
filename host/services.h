/*
 * host/services.h — the host side of the ABI: the frozen bootstrap struct,
 * the append-only services table, and kiln_host_ctx, the per-instance handle
 * every service call carries. A host context knows which plugin it belongs to
 * (for log prefixes and error attribution), the plugin's resolved config and
 * the trainer's (for config_get), and how much host memory the instance holds
 * (leaks are reported when the instance is destroyed).
 */
#ifndef KILN_HOST_SERVICES_H
#define KILN_HOST_SERVICES_H

#include <stddef.h>

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

/* The 1.1 services are implemented by the trainer (trainer.c). */
int32_t ht_svc_accelerator(kiln_host_ctx *h, kiln_instance **acc, const struct kiln_kernels **k);
int32_t ht_svc_param_register(kiln_host_ctx *h, const char *name, uint32_t ndim, const int64_t *shape,
                              uint32_t flags, kiln_parameter **out);
int32_t ht_svc_params(kiln_host_ctx *h, kiln_parameter *const **list, uint32_t *n);
const struct kiln_trainer_state *ht_svc_trainer_state(kiln_host_ctx *h);
void ht_svc_log_value(kiln_host_ctx *h, const char *name, double value, uint32_t flags, double weight);
int32_t ht_svc_get_metric(kiln_host_ctx *h, const char *name, double *out);
void ht_svc_request_stop(kiln_host_ctx *h, const char *reason);
uint64_t ht_svc_seed(kiln_host_ctx *h, const char *stream);
/* The 1.2 manual-optimisation services (manual.c). */
uint32_t ht_svc_optimizer_count(kiln_host_ctx *h);
int32_t ht_svc_manual_backward(kiln_host_ctx *h, double loss);
int32_t ht_svc_optimizer_step(kiln_host_ctx *h, uint32_t index, const struct kiln_closure *closure, int32_t *skipped);
int32_t ht_svc_optimizer_zero_grad(kiln_host_ctx *h, uint32_t index);
int32_t ht_svc_toggle_optimizer(kiln_host_ctx *h, uint32_t index);
int32_t ht_svc_untoggle_optimizer(kiln_host_ctx *h, uint32_t index);
/* checkpoint.c */
int32_t ht_svc_save_checkpoint(kiln_host_ctx *h, const char *path);
/* collectives.c */
int32_t ht_svc_barrier(kiln_host_ctx *h, const char *name);
int32_t ht_svc_reduce(kiln_host_ctx *h, double *values, uint32_t n, int32_t op);
int32_t ht_svc_broadcast(kiln_host_ctx *h, void *buf, size_t bytes, int32_t root);
int32_t ht_svc_all_gather(kiln_host_ctx *h, const void *send, size_t bytes, void *recv);
int32_t ht_svc_predict(kiln_host_ctx *h, const kiln_batch *batch, kiln_tensor *out);
int32_t ht_svc_round_activation(kiln_host_ctx *h, const char *site, uint32_t dtype, void *x, size_t n);

void hs_ctx_init(kiln_host_ctx *h, const hl_plugin *p, const kiln_kv *config, const kiln_kv *trainer);

/* Create an instance of `p` with `config`; on failure returns the status and
 * writes "kind 'name' (file): message [CODE]" into why. */
int hs_create(kiln_host_ctx *h, const hl_plugin *p, kiln_instance **out, char *why, size_t whylen);
/* Destroy and report leaked host memory. */
void hs_destroy(kiln_host_ctx *h, kiln_instance *inst);

/* Format the error of a failed plugin call: prefix + herr_msg() + status. */
void hs_format_error(const kiln_host_ctx *h, int32_t rc, const char *what, char *why, size_t whylen);

#endif
