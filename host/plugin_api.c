/*
 * host/plugin_api.c — what the host hands a plugin, in one place: the
 * bootstrap struct each library's kiln_plugin_init_v1 receives and the
 * services table (kiln/plugin.h) with every entry, whichever file
 * implements it: services.c (logging, errors, host memory, config),
 * run_services.c (the trainer services, predict, the collectives),
 * manual.c (manual optimisation) and checkpoint.c (save_checkpoint). It
 * sits above all of them; the loader and the trainer receive these tables
 * from here rather than reaching up for them.
 */
#include "plugin_api.h"

#include "checkpoint.h"
#include "manual.h"
#include "run_services.h"
#include "services.h"
#include "version.h"

static const kiln_host_services g_services = {
    .struct_size = sizeof(kiln_host_services),
    .abi_major = KILN_ABI_MAJOR,
    .abi_minor = KILN_ABI_MINOR,
    .log = hs_svc_log,
    .log_enabled = hs_svc_log_enabled,
    .set_error = hs_svc_set_error,
    .alloc = hs_svc_alloc,
    .free = hs_svc_free,
    .config_get = hs_svc_config_get,
    .log_metric = hs_svc_log_metric,
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

