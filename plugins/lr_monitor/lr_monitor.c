/*
 * lr_monitor.c — Lightning's LearningRateMonitor as a kiln callback plugin:
 * it logs every optimizer's current learning rate, as the trainer state
 * reports it after the scheduler's latest update (ABI 1.2
 * kiln_trainer_state.lr, num_optimizers entries). With logging_interval
 * "step" (the default) the rates are logged at every on_train_batch_start as
 * per-step values (the host's log_every_n_steps decides which reach the
 * loggers, as Lightning's should_update_logs does); with "epoch" at every
 * on_train_epoch_start as epoch values. One optimizer's rate is named "lr",
 * several are "lr-0", "lr-1", ... in config order (Lightning names them
 * after the optimizer class, which a plugin ABI has no use for). Nothing is
 * logged while the sanity check runs. A host whose trainer state predates
 * 1.2 has no rates to read: the monitor says so once and then stays quiet
 * rather than failing the run over a diagnostic.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

/* Longest rate name: "lr-" and a uint32 index. */
#define LRM_NAME_MAX 16

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    uint32_t event;  /* KILN_EV_ON_TRAIN_BATCH_START or KILN_EV_ON_TRAIN_EPOCH_START */
    uint32_t flags;  /* KILN_LOG_ON_STEP or KILN_LOG_ON_EPOCH, to match             */
    int warned;      /* the "no learning rates" warning was given                  */
};

static int32_t lrm_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                          const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const char *interval = kiln_kv_str(config, "logging_interval", "step");
    int per_epoch;
    if (strcmp(interval, "step") == 0)
        per_epoch = 0;
    else if (strcmp(interval, "epoch") == 0)
        per_epoch = 1;
    else
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "logging_interval must be \"step\" or \"epoch\", got \"%s\"",
                           interval);
    if (svc->abi_minor < 1 || !svc->log_value)
        return kiln_errorf(svc, hctx, KILN_E_UNSUPPORTED,
                           "the host offers no log_value service (ABI 1.1; host provides %u.%u)",
                           (unsigned)svc->abi_major, (unsigned)svc->abi_minor);
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "cannot allocate the lr_monitor instance");
    self->svc = svc;
    self->hctx = hctx;
    self->event = per_epoch ? KILN_EV_ON_TRAIN_EPOCH_START : KILN_EV_ON_TRAIN_BATCH_START;
    self->flags = per_epoch ? KILN_LOG_ON_EPOCH : KILN_LOG_ON_STEP;
    *out = self;
    return KILN_OK;
}

static void lrm_destroy(kiln_instance *self) { free(self); }

/* Warn once that there is nothing to log, naming why. */
static void lrm_warn_once(kiln_instance *self, const char *why) {
    if (self->warned) return;
    self->warned = 1;
    kiln_logf(self->svc, self->hctx, KILN_LOG_WARN, "lr_monitor: %s; no learning rates will be logged", why);
}

static int32_t lrm_on_event(kiln_instance *self, kiln_event *ev) {
    if (!ev) return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG, "lr_monitor: on_event got no event");
    if (ev->id != self->event) return KILN_OK;
    const kiln_trainer_state *ts = ev->trainer;
    if (!ts && self->svc->trainer_state) ts = self->svc->trainer_state(self->hctx);
    if (!ts) return KILN_OK;
    if (ts->sanity_checking || ev->stage == KILN_STAGE_SANITY) return KILN_OK;
    if (ts->struct_size < KILN_TRAINER_STATE_SIZE_1_2) {
        char why[128];
        snprintf(why, sizeof why, "the host's trainer state (%u bytes) predates ABI 1.2, which added the rates",
                 (unsigned)ts->struct_size);
        lrm_warn_once(self, why);
        return KILN_OK;
    }
    if (ts->num_optimizers == 0 || !ts->lr) {
        lrm_warn_once(self, "the trainer state lists no optimizer rates");
        return KILN_OK;
    }
    char name[LRM_NAME_MAX];
    for (uint32_t i = 0; i < ts->num_optimizers; i++) {
        if (ts->num_optimizers == 1)
            snprintf(name, sizeof name, "lr");
        else
            snprintf(name, sizeof name, "lr-%u", (unsigned)i);
        self->svc->log_value(self->hctx, name, ts->lr[i], self->flags, 1.0);
    }
    return KILN_OK;
}

static const kiln_callback_ops lrm_ops = {
    .base = {.struct_size = sizeof(kiln_callback_ops), .create = lrm_create, .destroy = lrm_destroy},
    .on_event = lrm_on_event,
};

static const kiln_param lrm_params[] = {
    {"logging_interval", KILN_TYPE_STRING, 0, KILN_V_STR("step"),
     "\"step\": log the rates at every training batch; \"epoch\": at every training epoch's start"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const lrm_checks[] = {"logging_interval in {step, epoch}"};
static const kiln_kv lrm_props[] = {
    {"config_checks", KILN_V_STRS(lrm_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc lrm_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_CALLBACK,
    .name = "lr_monitor",
    .version = "0.1.0",
    .description = "Lightning's LearningRateMonitor: logs each optimizer's learning rate (\"lr\", \"lr-0\", ...)",
    .capabilities = KILN_CAP_DETERMINISTIC,
    .properties = lrm_props,
    .params = lrm_params,
    .ops = &lrm_ops,
};

KILN_DEFINE_LIBRARY("lr_monitor", "0.1.0", 1, &lrm_desc)
