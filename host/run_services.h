/*
 * host/run_services.h — the services that act on a plugin's run
 * (run_services.c): the 1.1 trainer services, predict and
 * round_activation, and the 1.2 collectives. Their signatures are the
 * services table's (kiln/plugin.h); plugin_api.c lists them there.
 */
#ifndef KILN_HOST_RUN_SERVICES_H
#define KILN_HOST_RUN_SERVICES_H

#include <stddef.h>
#include <stdint.h>

#include "run.h"

int32_t ht_svc_accelerator(kiln_host_ctx *h, kiln_instance **acc, const struct kiln_kernels **k);
int32_t ht_svc_param_register(kiln_host_ctx *h, const char *name, uint32_t ndim, const int64_t *shape,
                              uint32_t flags, kiln_parameter **out);
int32_t ht_svc_params(kiln_host_ctx *h, kiln_parameter *const **list, uint32_t *n);
const struct kiln_trainer_state *ht_svc_trainer_state(kiln_host_ctx *h);
void ht_svc_log_value(kiln_host_ctx *h, const char *name, double value, uint32_t flags, double weight);
int32_t ht_svc_get_metric(kiln_host_ctx *h, const char *name, double *out);
void ht_svc_request_stop(kiln_host_ctx *h, const char *reason);
/* Also the seed trainer.c hands the module's init_weights ("module.init"). */
uint64_t ht_svc_seed(kiln_host_ctx *h, const char *stream);
int32_t ht_svc_predict(kiln_host_ctx *h, const kiln_batch *batch, kiln_tensor *out);
int32_t ht_svc_round_activation(kiln_host_ctx *h, const char *site, uint32_t dtype, void *x, size_t n);
int32_t ht_svc_barrier(kiln_host_ctx *h, const char *name);
int32_t ht_svc_reduce(kiln_host_ctx *h, double *values, uint32_t n, int32_t op);
int32_t ht_svc_broadcast(kiln_host_ctx *h, void *buf, size_t bytes, int32_t root);
int32_t ht_svc_all_gather(kiln_host_ctx *h, const void *send, size_t bytes, void *recv);

#endif
