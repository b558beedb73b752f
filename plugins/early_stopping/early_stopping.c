/*
 * early_stopping.c — Lightning's EarlyStopping callback as a kiln plugin: it
 * watches one metric of callback_metrics (`monitor`) and asks the trainer to
 * stop (svc->request_stop, which the host holds back until min_epochs /
 * min_steps are met) once the metric stopped improving for `patience`
 * checks, became non-finite, crossed `stopping_threshold` (good enough) or
 * `divergence_threshold` (hopeless). A check runs at on_validation_end, or at
 * on_train_epoch_end when check_on_train_epoch_end is true; left unset it
 * follows Lightning's rule (true when trainer.val_check_interval == 1.0 and
 * trainer.check_val_every_n_epoch == 1). Checks only run while fitting and
 * never during the sanity check. The decision order, the sign handling of
 * min_delta, the messages and the checkpointed state (wait_count,
 * stopped_epoch, best_score, patience, stopping reason) follow
 * lightning/pytorch/callbacks/early_stopping.py.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

/* Why the run was asked to stop; numbered as Lightning's EarlyStoppingReason
 * so a reader of the checkpoint can map it. */
enum {
    ES_NOT_STOPPED = 0,
    ES_STOPPING_THRESHOLD = 1,
    ES_DIVERGENCE_THRESHOLD = 2,
    ES_PATIENCE_EXHAUSTED = 3,
    ES_NON_FINITE_METRIC = 4,
};

enum { ES_MODE_MIN = 0, ES_MODE_MAX = 1 };

/* check_on_train_epoch_end before SETUP resolves an unset value */
enum { ES_TIMING_UNRESOLVED = -1 };

#define ES_STATE_VERSION 1u
#define ES_STATE_MAGIC "KES1"
#define ES_STATE_HEADER 48 /* bytes before the monitor name, see es_get_state */
#define ES_MSG_MAX 512
/* Restored counters stay below 2^53 (exact as doubles), far from overflow. */
#define ES_COUNT_LIMIT ((int64_t)1 << 53)

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    /* configuration */
    const char *monitor;       /* callback_metrics key, valid until destroy   */
    int mode;                  /* ES_MODE_*                                    */
    double min_delta;          /* signed as Lightning stores it: -|d| for min  */
    int64_t patience;
    int verbose, strict, check_finite, log_rank_zero_only;
    int has_stopping_threshold, has_divergence_threshold;
    double stopping_threshold, divergence_threshold;
    int check_on_train_epoch_end; /* 0/1, or ES_TIMING_UNRESOLVED             */
    /* run state (checkpointed) */
    int64_t wait_count;
    int64_t stopped_epoch;
    double best_score;         /* +inf (min) or -inf (max) before any check    */
    uint32_t stopping_reason;  /* ES_* of the last stop decision               */
    char stopping_message[ES_MSG_MAX];
    /* between ON_FIT_START and ON_FIT_END: Lightning's trainer.state.fn ==
     * FITTING, which the event's stage cannot tell (in-fit validation and a
     * standalone validate both report KILN_STAGE_VALIDATE) */
    int fitting;
};

static const char *es_mode_name(int mode) { return mode == ES_MODE_MAX ? "max" : "min"; }

/* Lightning's monitor_op: torch.lt for min, torch.gt for max (strict, so a
 * NaN on either side is never "better"). */
static int es_better(const kiln_instance *self, double a, double b) {
    return self->mode == ES_MODE_MAX ? a > b : a < b;
}

/* ---------------------------------------------------------------------------
 * Logging */

static const kiln_trainer_state *es_trainer(const kiln_instance *self, const kiln_event *ev) {
    if (ev && ev->trainer) return ev->trainer;
    return self->svc->trainer_state ? self->svc->trainer_state(self->hctx) : NULL;
}

/* Lightning's _log_info: rank-prefixed when several ranks run, and with
 * log_rank_zero_only only rank 0 speaks. */
static void es_log_info(const kiln_instance *self, const kiln_trainer_state *ts, const char *msg) {
    int world = ts ? ts->world_size : 1;
    int rank = ts ? ts->rank : 0;
    if (self->log_rank_zero_only && rank != 0) return;
    if (world > 1)
        kiln_logf(self->svc, self->hctx, KILN_LOG_INFO, "[rank: %d] %s", rank, msg);
    else
        kiln_logf(self->svc, self->hctx, KILN_LOG_INFO, "%s", msg);
}

/* ---------------------------------------------------------------------------
 * The decision (_evaluate_stopping_criteria): first match wins. Returns 1 to
 * stop; `reason` receives the message (empty when there is nothing to say). */

static int es_evaluate(kiln_instance *self, double current, char *reason, size_t rlen, uint32_t *why) {
    const char *m = self->monitor;
    const char *order = self->mode == ES_MODE_MAX ? ">" : "<";
    reason[0] = '\0';
    *why = ES_NOT_STOPPED;
    if (self->check_finite && !isfinite(current)) {
        snprintf(reason, rlen,
                 "Monitored metric %s = %s is not finite. Previous best value was %.3f. Signaling Trainer to stop.",
                 m, isnan(current) ? "nan" : current > 0 ? "inf" : "-inf", self->best_score);
        *why = ES_NON_FINITE_METRIC;
        return 1;
    }
    if (self->has_stopping_threshold && es_better(self, current, self->stopping_threshold)) {
        snprintf(reason, rlen, "Stopping threshold reached: %s = %g %s %g. Signaling Trainer to stop.", m, current,
                 order, self->stopping_threshold);
        *why = ES_STOPPING_THRESHOLD;
        return 1;
    }
    /* monitor_op(-current, -threshold): worse than the threshold */
    if (self->has_divergence_threshold && es_better(self, -current, -self->divergence_threshold)) {
        snprintf(reason, rlen, "Divergence threshold reached: %s = %g %s %g. Signaling Trainer to stop.", m, current,
                 self->mode == ES_MODE_MAX ? "<" : ">", self->divergence_threshold);
        *why = ES_DIVERGENCE_THRESHOLD;
        return 1;
    }
    /* min_delta is already signed: current + |d| < best (min), current - |d|
     * > best (max); an improvement of exactly |d| does not count */
    if (es_better(self, current - self->min_delta, self->best_score)) {
        if (isfinite(self->best_score))
            snprintf(reason, rlen, "Metric %s improved by %.3f >= min_delta = %g. New best score: %.3f", m,
                     fabs(self->best_score - current), fabs(self->min_delta), current);
        else
            snprintf(reason, rlen, "Metric %s improved. New best score: %.3f", m, current);
        self->best_score = current;
        self->wait_count = 0;
        return 0;
    }
    self->wait_count++;
    if (self->wait_count >= self->patience) {
        snprintf(reason, rlen,
                 "Monitored metric %s did not improve in the last %lld records. Best score: %.3f. Signaling Trainer "
                 "to stop.",
                 m, (long long)self->wait_count, self->best_score);
        *why = ES_PATIENCE_EXHAUSTED;
        return 1;
    }
    return 0;
}

/* _run_early_stopping_check */
static int32_t es_check(kiln_instance *self, const kiln_event *ev, const char *hook) {
    const kiln_trainer_state *ts = es_trainer(self, ev);
    double current = 0.0;
    int32_t rc = self->svc->get_metric ? self->svc->get_metric(self->hctx, self->monitor, &current)
                                       : KILN_E_NOT_FOUND;
    if (rc != KILN_OK) {
        /* The ABI cannot enumerate callback_metrics, so unlike Lightning the
         * message cannot list the keys that do exist. */
        char msg[ES_MSG_MAX];
        snprintf(msg, sizeof msg,
                 "early_stopping conditioned on metric `%s` which is not available at %s (epoch %lld); log it "
                 "(self.log / log_value) before this hook, monitor a metric that is logged, or set strict = false",
                 self->monitor, hook, (long long)(ts ? ts->current_epoch : -1));
        if (self->strict) return kiln_errorf(self->svc, self->hctx, KILN_E_CONFIG, "%s", msg);
        if (self->verbose) kiln_logf(self->svc, self->hctx, KILN_LOG_WARN, "%s", msg);
        return KILN_OK;
    }
    char reason[ES_MSG_MAX];
    uint32_t why = ES_NOT_STOPPED;
    int stop = es_evaluate(self, current, reason, sizeof reason, &why);
    /* Lightning OR-reduces the decision across ranks here; a callback has no
     * collective, so every rank decides alone (identical metrics give the
     * same answer on every rank). */
    if (stop) {
        self->stopped_epoch = ts ? ts->current_epoch : 0;
        self->stopping_reason = why;
        snprintf(self->stopping_message, sizeof self->stopping_message, "%s", reason);
        if (self->svc->request_stop) self->svc->request_stop(self->hctx, reason);
    }
    if (reason[0] && self->verbose) es_log_info(self, ts, reason);
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Timing */

/* Lightning's setup(): an unset check_on_train_epoch_end becomes
 * val_check_interval == 1.0 and check_val_every_n_epoch == 1 (validation once
 * per epoch, at its end, so the epoch end sees the fresh value). */
static void es_resolve_timing(kiln_instance *self) {
    if (self->check_on_train_epoch_end != ES_TIMING_UNRESOLVED) return;
    double vci = 1.0;
    int64_t every = 1;
    kiln_value v;
    if (self->svc->config_get && self->svc->config_get(self->hctx, "trainer.val_check_interval", &v) == KILN_OK) {
        if (v.type == KILN_TYPE_FLOAT) vci = v.v.f;
        else if (v.type == KILN_TYPE_INT) vci = (double)v.v.i;
    }
    if (self->svc->config_get && self->svc->config_get(self->hctx, "trainer.check_val_every_n_epoch", &v) == KILN_OK &&
        v.type == KILN_TYPE_INT)
        every = v.v.i;
    self->check_on_train_epoch_end = vci == 1.0 && every == 1;
    kiln_logf(self->svc, self->hctx, KILN_LOG_DEBUG, "early_stopping: checking %s at %s", self->monitor,
              self->check_on_train_epoch_end ? "on_train_epoch_end" : "on_validation_end");
}

/* _should_skip_check: outside fit, or during the sanity check */
static int es_skip(const kiln_instance *self, const kiln_event *ev) {
    if (!self->fitting) return 1;
    if (ev->stage == KILN_STAGE_SANITY) return 1;
    const kiln_trainer_state *ts = ev->trainer;
    return ts && ts->sanity_checking;
}

static int32_t es_on_event(kiln_instance *self, kiln_event *ev) {
    if (!self || !ev) return KILN_E_INVALID_ARG;
    switch (ev->id) {
    case KILN_EV_SETUP:
        if (ev->stage == KILN_STAGE_FIT) es_resolve_timing(self);
        return KILN_OK;
    case KILN_EV_ON_FIT_START:
        es_resolve_timing(self);
        self->fitting = 1;
        return KILN_OK;
    case KILN_EV_ON_FIT_END:
    case KILN_EV_TEARDOWN:
        self->fitting = 0;
        return KILN_OK;
    case KILN_EV_ON_TRAIN_EPOCH_END:
        if (self->check_on_train_epoch_end != 1 || es_skip(self, ev)) return KILN_OK;
        return es_check(self, ev, "on_train_epoch_end");
    case KILN_EV_ON_VALIDATION_END:
        if (self->check_on_train_epoch_end == 1 || es_skip(self, ev)) return KILN_OK;
        return es_check(self, ev, "on_validation_end");
    default:
        return KILN_OK;
    }
}

/* ---------------------------------------------------------------------------
 * State (state_dict / load_state_dict). Version 1, little-endian:
 *   0  "KES1"             4  uint32 mode (0 min, 1 max)
 *   8  int64 wait_count   16 int64 stopped_epoch       24 int64 patience
 *   32 float64 best_score 40 uint32 stopping_reason    44 uint32 monitor length
 *   48 the monitor's bytes (no NUL)
 * The monitor and mode identify the callback as Lightning's state_key does. */

static void es_put_u64(unsigned char *p, uint64_t x) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(x >> (8 * i));
}
static uint64_t es_get_u64(const unsigned char *p) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)p[i] << (8 * i);
    return x;
}
static void es_put_u32(unsigned char *p, uint32_t x) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(x >> (8 * i));
}
static uint32_t es_get_u32(const unsigned char *p) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) x |= (uint32_t)p[i] << (8 * i);
    return x;
}
static void es_put_f64(unsigned char *p, double d) {
    uint64_t x;
    memcpy(&x, &d, sizeof x);
    es_put_u64(p, x);
}
static double es_get_f64(const unsigned char *p) {
    uint64_t x = es_get_u64(p);
    double d;
    memcpy(&d, &x, sizeof d);
    return d;
}

static int32_t es_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    if (!self || !state_version || !data || !size) return KILN_E_INVALID_ARG;
    size_t mlen = strlen(self->monitor);
    size_t n = ES_STATE_HEADER + mlen;
    unsigned char *b = self->svc->alloc(self->hctx, n, 0);
    if (!b) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "early_stopping: out of memory (%zu bytes)", n);
    memcpy(b, ES_STATE_MAGIC, 4);
    es_put_u32(b + 4, (uint32_t)self->mode);
    es_put_u64(b + 8, (uint64_t)self->wait_count);
    es_put_u64(b + 16, (uint64_t)self->stopped_epoch);
    es_put_u64(b + 24, (uint64_t)self->patience);
    es_put_f64(b + 32, self->best_score);
    es_put_u32(b + 40, self->stopping_reason);
    es_put_u32(b + 44, (uint32_t)mlen);
    memcpy(b + ES_STATE_HEADER, self->monitor, mlen);
    *state_version = ES_STATE_VERSION;
    *data = b;
    *size = n;
    return KILN_OK;
}

static int32_t es_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    if (!self || (!data && size)) return KILN_E_INVALID_ARG;
    if (state_version != ES_STATE_VERSION)
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                           "early_stopping: cannot read state version %u (this build reads version %u)",
                           state_version, ES_STATE_VERSION);
    const unsigned char *b = data;
    if (size < ES_STATE_HEADER || memcmp(b, ES_STATE_MAGIC, 4) != 0)
        return kiln_errorf(self->svc, self->hctx, KILN_E_DATA,
                           "early_stopping: state of %zu bytes is not an early_stopping state (expected at least %d "
                           "bytes starting with \"%s\")",
                           size, ES_STATE_HEADER, ES_STATE_MAGIC);
    uint32_t mode = es_get_u32(b + 4);
    uint32_t mlen = es_get_u32(b + 44);
    uint32_t reason = es_get_u32(b + 40);
    if ((size_t)mlen != size - ES_STATE_HEADER || mode > ES_MODE_MAX || reason > ES_NON_FINITE_METRIC)
        return kiln_errorf(self->svc, self->hctx, KILN_E_DATA,
                           "early_stopping: corrupt state (size %zu, monitor length %u, mode %u, reason %u)", size,
                           mlen, mode, reason);
    const char *saved = (const char *)b + ES_STATE_HEADER;
    /* Lightning keys the state by monitor and mode: another early stopping
     * callback's state is simply not this one's, so it starts fresh. */
    if ((int)mode != self->mode || strlen(self->monitor) != mlen || memcmp(saved, self->monitor, mlen) != 0) {
        /* the saved name comes from the file: control characters escaped,
         * so a newline in it cannot forge a log line */
        char q[300];
        size_t o = 0;
        for (uint32_t i = 0; i < mlen && o + 5 < sizeof q; i++) {
            unsigned char c = (unsigned char)saved[i];
            if (c < 0x20 || c == 0x7F) o += (size_t)snprintf(q + o, sizeof q - o, "\\x%02x", c);
            else q[o++] = (char)c;
        }
        q[o] = 0;
        kiln_logf(self->svc, self->hctx, KILN_LOG_WARN,
                  "early_stopping: the checkpoint's state is for monitor `%s` mode %s, this callback monitors `%s` "
                  "mode %s; starting fresh",
                  q, es_mode_name((int)mode), self->monitor, es_mode_name(self->mode));
        return KILN_OK;
    }
    int64_t patience = (int64_t)es_get_u64(b + 24);
    int64_t wait_count = (int64_t)es_get_u64(b + 8);
    int64_t stopped_epoch = (int64_t)es_get_u64(b + 16);
    double best = es_get_f64(b + 32);
    /* Every value is bounded before it is used: wait_count++ past INT64_MAX
     * wraps in a release build and the callback never stops again, and a
     * NaN best is never improved on. */
    const struct { const char *name; int64_t v; } counts[] = {
        {"patience", patience}, {"wait_count", wait_count}, {"stopped_epoch", stopped_epoch}};
    for (int i = 0; i < 3; i++)
        if (counts[i].v < 0 || counts[i].v >= ES_COUNT_LIMIT)
            return kiln_errorf(self->svc, self->hctx, KILN_E_DATA,
                               "early_stopping: state %s: expected 0 <= value < 2^53, found %lld", counts[i].name,
                               (long long)counts[i].v);
    /* best is a metric seen, or the start value (+inf for min, -inf for
     * max); the other infinity only gets in when check_finite is off */
    const double start = mode == ES_MODE_MAX ? -INFINITY : INFINITY;
    if (isnan(best) || (isinf(best) && best != start && self->check_finite))
        return kiln_errorf(self->svc, self->hctx, KILN_E_DATA,
                           "early_stopping: state best_score: expected a finite value or %g (mode %s), found %g",
                           start, es_mode_name((int)mode), best);
    /* never stopped: no stop epoch, and the patience has not run out */
    if (reason == ES_NOT_STOPPED && (stopped_epoch != 0 || (wait_count != 0 && wait_count >= patience)))
        return kiln_errorf(self->svc, self->hctx, KILN_E_DATA,
                           "early_stopping: state of a callback that never stopped: expected stopped_epoch 0 and "
                           "wait_count below patience %lld, found stopped_epoch %lld and wait_count %lld",
                           (long long)patience, (long long)stopped_epoch, (long long)wait_count);
    /* load_state_dict restores patience too, overriding the run file */
    if (patience != self->patience)
        kiln_logf(self->svc, self->hctx, KILN_LOG_INFO,
                  "early_stopping: patience %lld restored from the checkpoint (the run file says %lld)",
                  (long long)patience, (long long)self->patience);
    self->wait_count = wait_count;
    self->stopped_epoch = stopped_epoch;
    self->patience = patience;
    self->best_score = best;
    self->stopping_reason = reason;
    self->stopping_message[0] = '\0';
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Lifecycle */

static void es_destroy(kiln_instance *self) { free(self); }

static int32_t es_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                         kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const char *monitor = kiln_kv_str(config, "monitor", NULL);
    if (!monitor || !monitor[0])
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "early_stopping: monitor must name a logged metric (e.g. \"val_loss\"), got %s",
                           monitor ? "an empty string" : "nothing");
    const char *mode = kiln_kv_str(config, "mode", "min");
    if (strcmp(mode, "min") != 0 && strcmp(mode, "max") != 0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "early_stopping: mode can be \"min\" or \"max\", got \"%s\"",
                           mode);
    double min_delta = kiln_kv_float(config, "min_delta", 0.0);
    if (!(min_delta >= 0.0) || !isfinite(min_delta))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "early_stopping: min_delta must be a finite value >= 0 (an absolute change; mode sets the "
                           "direction), got %g",
                           min_delta);
    int64_t patience = kiln_kv_int(config, "patience", 3);
    if (patience < 0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "early_stopping: patience must be >= 0, got %lld",
                           (long long)patience);
    const kiln_value *st = kiln_kv_find(config, "stopping_threshold");
    const kiln_value *dv = kiln_kv_find(config, "divergence_threshold");
    double st_v = st ? kiln_kv_float(config, "stopping_threshold", NAN) : NAN;
    double dv_v = dv ? kiln_kv_float(config, "divergence_threshold", NAN) : NAN;
    if (st && !isfinite(st_v))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "early_stopping: stopping_threshold must be finite, got %g", st_v);
    if (dv && !isfinite(dv_v))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "early_stopping: divergence_threshold must be finite, got %g",
                           dv_v);

    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "early_stopping: out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->monitor = monitor;
    self->mode = strcmp(mode, "max") == 0 ? ES_MODE_MAX : ES_MODE_MIN;
    /* Lightning: min_delta *= 1 if monitor_op == torch.gt else -1 */
    self->min_delta = self->mode == ES_MODE_MAX ? min_delta : -min_delta;
    self->patience = patience;
    self->verbose = kiln_kv_int(config, "verbose", 0) != 0;
    self->strict = kiln_kv_int(config, "strict", 1) != 0;
    self->check_finite = kiln_kv_int(config, "check_finite", 1) != 0;
    self->log_rank_zero_only = kiln_kv_int(config, "log_rank_zero_only", 0) != 0;
    self->has_stopping_threshold = st != NULL;
    self->stopping_threshold = st_v;
    self->has_divergence_threshold = dv != NULL;
    self->divergence_threshold = dv_v;
    const kiln_value *ct = kiln_kv_find(config, "check_on_train_epoch_end");
    self->check_on_train_epoch_end =
        ct && ct->type == KILN_TYPE_BOOL ? ct->v.i != 0 : ES_TIMING_UNRESOLVED;
    self->best_score = self->mode == ES_MODE_MIN ? INFINITY : -INFINITY;
    *out = self;
    return KILN_OK;
}

static const kiln_callback_ops es_ops = {
    .base = {.struct_size = sizeof(kiln_callback_ops),
             .create = es_create,
             .destroy = es_destroy,
             .get_state = es_get_state,
             .set_state = es_set_state},
    .on_event = es_on_event,
};

static const kiln_param es_params[] = {
    {"monitor", KILN_TYPE_STRING, KILN_PARAM_REQUIRED, KILN_V_NONE,
     "the callback_metrics key to watch (e.g. \"val_loss\")"},
    {"min_delta", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0), "an absolute change <= min_delta is not an improvement"},
    {"patience", KILN_TYPE_INT, 0, KILN_V_INT(3), "checks without improvement before stopping"},
    {"verbose", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "log every decision (improvement, reason to stop)"},
    {"mode", KILN_TYPE_STRING, 0, KILN_V_STR("min"), "\"min\": lower is better; \"max\": higher is better"},
    {"strict", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1), "fail the run when the monitored metric is missing at a check"},
    {"check_finite", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1), "stop when the monitored metric is nan or inf"},
    {"stopping_threshold", KILN_TYPE_FLOAT, 0, KILN_V_NONE,
     "stop at once when the metric is better than this (unset: off)"},
    {"divergence_threshold", KILN_TYPE_FLOAT, 0, KILN_V_NONE,
     "stop at once when the metric is worse than this (unset: off)"},
    {"check_on_train_epoch_end", KILN_TYPE_BOOL, 0, KILN_V_NONE,
     "check at on_train_epoch_end instead of on_validation_end (unset: when validation runs once per epoch)"},
    {"log_rank_zero_only", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "verbose messages from rank 0 only"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const es_checks[] = {"mode in {min, max}", "patience >= 0"};
static const kiln_kv es_props[] = {
    {"config_checks", KILN_V_STRS(es_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc es_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_CALLBACK,
    .name = "early_stopping",
    .version = "1.0.0",
    .description = "Lightning's EarlyStopping: stop when a monitored metric stops improving",
    .capabilities = KILN_CAP_STATEFUL | KILN_CAP_MONITOR, /* after the module at on_train_epoch_end */
    .properties = es_props,
    .params = es_params,
    .ops = &es_ops,
};

KILN_DEFINE_LIBRARY("early_stopping", "1.0.0", 1, &es_desc)
