/*
 * schedulers.c — the "schedulers" library: four learning-rate scheduler
 * plugins after torch.optim.lr_scheduler, all answering the one question
 * the ABI asks (kiln_scheduler_ops.lr_at): what is the rate after `step`
 * scheduler steps, for an optimizer configured with base_lr? "constant"
 * (ConstantLR), "step" (StepLR) and "cosine" (linear warmup, then
 * CosineAnnealingLR, as Lightning-bolts' LinearWarmupCosineAnnealingLR) are
 * closed forms of the step number, so they keep no state and a repeated or
 * resumed step gives the same answer. "plateau" (ReduceLROnPlateau) is the
 * one schedule that depends on history — the monitored metric of every
 * step — so it keeps PyTorch's counters (best, num_bad_epochs,
 * cooldown_counter) and its current rate, and checkpoints them through
 * get_state/set_state. The host decides when a step happens (interval,
 * frequency, monitor) and applies the returned rate with set_lr; `epoch` is
 * therefore not read by any of these schedules. All arithmetic is in double,
 * like PyTorch's Python floats.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

/* pi to double precision (M_PI is not ISO C) */
#define SCHED_PI 3.14159265358979323846

enum { SCHED_CONSTANT = 1, SCHED_STEP = 2, SCHED_COSINE = 3, SCHED_PLATEAU = 4 };

/* ReduceLROnPlateau's counters and the rate it last returned. */
typedef struct sched_plateau_state {
    int initialised;        /* step 0 (or a restored state) has set `lr`      */
    int warned_no_metric;   /* the "no metric" warning was logged once        */
    int64_t last_step;      /* the step `lr` belongs to                       */
    double best;            /* best metric so far; +-inf before the first     */
    int64_t num_bad_epochs; /* steps since `best` improved (outside cooldown) */
    int64_t cooldown_counter; /* steps left in the cooldown after a reduction */
    double lr;              /* the current rate (PyTorch keeps it in the
                               optimizer's param_group; here it lives here)  */
} sched_plateau_state;

/* Each kind's settings, read and checked by its create. */
typedef union sched_cfg {
    struct { double factor; int64_t total_iters; } constant;
    struct { int64_t step_size; double gamma; } step;
    struct { int64_t warmup_steps, t_max; double warmup_start_factor, eta_min; } cosine;
    struct {
        int mode_max, threshold_abs;
        double factor, threshold, min_lr, eps;
        int64_t patience, cooldown;
    } plateau;
} sched_cfg;

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    int kind; /* SCHED_* */
    sched_cfg cfg;
    sched_plateau_state st; /* plateau only */
};

#define SCHED_ERR(self, code, ...) kiln_errorf((self)->svc, (self)->hctx, (code), __VA_ARGS__)

/* ------------------------------------------------------------ common */

static const char *sched_kind_name(int kind) {
    switch (kind) {
    case SCHED_CONSTANT: return "constant";
    case SCHED_STEP: return "step";
    case SCHED_COSINE: return "cosine";
    default: return "plateau";
    }
}

/* The end of every create: the instance of `kind` with the checked
 * settings, in *out. */
static int32_t sched_new(const kiln_host_services *svc, kiln_host_ctx *hctx, int kind, const sched_cfg *cfg,
                         kiln_instance **out) {
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) {
        kiln_errorf(svc, hctx, KILN_E_NOMEM, "cannot allocate the %s scheduler instance", sched_kind_name(kind));
        return KILN_E_NOMEM;
    }
    self->svc = svc;
    self->hctx = hctx;
    self->kind = kind;
    self->cfg = *cfg;
    *out = self;
    return KILN_OK;
}

static void sched_destroy(kiln_instance *self) { free(self); }

/* The arguments every lr_at checks before computing anything. A negative
 * base rate is refused along with non-finite ones: no optimizer accepts it,
 * and a schedule of it would only hide the mistake. */
static int32_t sched_check_args(kiln_instance *self, double base_lr, int64_t step, double *lr) {
    if (!lr) return SCHED_ERR(self, KILN_E_INVALID_ARG, "%s scheduler: lr_at got no output pointer",
                              sched_kind_name(self->kind));
    if (step < 0)
        return SCHED_ERR(self, KILN_E_INVALID_ARG, "%s scheduler: step must be >= 0, got %lld",
                         sched_kind_name(self->kind), (long long)step);
    if (!isfinite(base_lr) || base_lr < 0.0)
        return SCHED_ERR(self, KILN_E_INVALID_ARG, "%s scheduler: base_lr must be a finite number >= 0, got %g",
                         sched_kind_name(self->kind), base_lr);
    return KILN_OK;
}

/* ---------------------------------------------------------- constant */

/* ConstantLR: base_lr * factor for the first total_iters steps, base_lr
 * from then on (PyTorch's closed form
 * base_lr * (factor + (step >= total_iters) * (1 - factor))). */
static int32_t constant_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                               const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const double factor = kiln_kv_float(config, "factor", 1.0 / 3.0);
    const int64_t total_iters = kiln_kv_int(config, "total_iters", 5);
    /* torch refuses a factor outside [0, 1]; `!(x >= 0)` also refuses NaN */
    if (!(factor >= 0.0) || factor > 1.0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "factor must be in [0, 1], got %g", factor);
    if (total_iters < 0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "total_iters must be >= 0, got %lld", (long long)total_iters);
    const sched_cfg c = {.constant = {.factor = factor, .total_iters = total_iters}};
    return sched_new(svc, hctx, SCHED_CONSTANT, &c, out);
}

static double constant_lr(const kiln_instance *self, double base_lr, int64_t step) {
    return step < self->cfg.constant.total_iters ? base_lr * self->cfg.constant.factor : base_lr;
}

/* -------------------------------------------------------------- step */

/* StepLR: base_lr * gamma^floor(step / step_size). */
static int32_t step_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                           const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const int64_t step_size = kiln_kv_int(config, "step_size", 30);
    const double gamma = kiln_kv_float(config, "gamma", 0.1);
    if (step_size < 1)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "step_size must be >= 1 (scheduler steps per decay), got %lld", (long long)step_size);
    if (!(gamma > 0.0) || !isfinite(gamma))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "gamma must be a finite number > 0, got %g", gamma);
    const sched_cfg c = {.step = {.step_size = step_size, .gamma = gamma}};
    return sched_new(svc, hctx, SCHED_STEP, &c, out);
}

static double step_lr(const kiln_instance *self, double base_lr, int64_t step) {
    /* integer division is floor() for step >= 0; pow() underflows to 0 (or
     * overflows to inf for gamma > 1) gracefully for huge exponents */
    const int64_t decays = step / self->cfg.step.step_size;
    return base_lr * pow(self->cfg.step.gamma, (double)decays);
}

/* ------------------------------------------------------------ cosine */

/* Linear warmup from base_lr * warmup_start_factor to base_lr over
 * warmup_steps steps, then cosine annealing from base_lr down to eta_min
 * over the remaining t_max - warmup_steps steps (CosineAnnealingLR's closed
 * form, shifted by the warmup), and eta_min after t_max. PyTorch's
 * CosineAnnealingLR would swing back up after t_max (the cosine is
 * periodic); a schedule that ends at t_max is what training runs want, and
 * it is what this one does. */
static int32_t cosine_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                             const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const int64_t warmup_steps = kiln_kv_int(config, "warmup_steps", 0);
    const double warmup_start_factor = kiln_kv_float(config, "warmup_start_factor", 0.0);
    const int64_t t_max = kiln_kv_int(config, "t_max", 1000);
    const double eta_min = kiln_kv_float(config, "eta_min", 0.0);
    if (warmup_steps < 0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "warmup_steps must be >= 0, got %lld", (long long)warmup_steps);
    if (!(warmup_start_factor >= 0.0) || warmup_start_factor > 1.0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "warmup_start_factor must be in [0, 1], got %g",
                           warmup_start_factor);
    if (t_max <= warmup_steps)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "t_max must be > warmup_steps (the cosine needs at least one step), got t_max = %lld and "
                           "warmup_steps = %lld",
                           (long long)t_max, (long long)warmup_steps);
    if (!(eta_min >= 0.0) || !isfinite(eta_min))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "eta_min must be a finite number >= 0, got %g", eta_min);
    const sched_cfg c = {.cosine = {.warmup_steps = warmup_steps,
                                    .t_max = t_max,
                                    .warmup_start_factor = warmup_start_factor,
                                    .eta_min = eta_min}};
    return sched_new(svc, hctx, SCHED_COSINE, &c, out);
}

static double cosine_lr(const kiln_instance *self, double base_lr, int64_t step) {
    const int64_t w = self->cfg.cosine.warmup_steps, t_max = self->cfg.cosine.t_max;
    const double f0 = self->cfg.cosine.warmup_start_factor, eta_min = self->cfg.cosine.eta_min;
    if (step < w) /* w > 0 here */
        return base_lr * (f0 + (1.0 - f0) * (double)step / (double)w);
    if (step <= t_max) {
        const double progress = (double)(step - w) / (double)(t_max - w); /* 0 .. 1 */
        return eta_min + (base_lr - eta_min) * (1.0 + cos(SCHED_PI * progress)) / 2.0;
    }
    return eta_min;
}

/* ----------------------------------------------------------- plateau */

/* State blob, version 1, native byte order: exactly one plateau_blob. The
 * mode is recorded so that a state written in "min" mode is not read as a
 * "max" one (its `best` would be meaningless); the other settings come from
 * the run file, so a resumed run may change patience or factor. */
#define PLATEAU_STATE_VERSION 1u
/* Restored counters stay below 2^53 (exact as doubles), far from overflow. */
#define SCHED_COUNT_LIMIT ((int64_t)1 << 53)
#define PLATEAU_STATE_MAGIC "kiln-rop"
typedef struct plateau_blob {
    char magic[8];
    uint32_t mode_max;    /* 1: "max", 0: "min"                 */
    uint32_t initialised; /* 0 or 1                              */
    int64_t last_step;
    int64_t num_bad_epochs;
    int64_t cooldown_counter;
    double best;
    double lr;
} plateau_blob;

static int32_t plateau_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                              const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const char *mode = kiln_kv_str(config, "mode", "min");
    const char *threshold_mode = kiln_kv_str(config, "threshold_mode", "rel");
    const double factor = kiln_kv_float(config, "factor", 0.1);
    const int64_t patience = kiln_kv_int(config, "patience", 10);
    const double threshold = kiln_kv_float(config, "threshold", 1e-4);
    const int64_t cooldown = kiln_kv_int(config, "cooldown", 0);
    const double min_lr = kiln_kv_float(config, "min_lr", 0.0);
    const double eps = kiln_kv_float(config, "eps", 1e-8);
    if (strcmp(mode, "min") != 0 && strcmp(mode, "max") != 0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "mode must be \"min\" or \"max\", got \"%s\"", mode);
    if (strcmp(threshold_mode, "rel") != 0 && strcmp(threshold_mode, "abs") != 0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "threshold_mode must be \"rel\" or \"abs\", got \"%s\"",
                           threshold_mode);
    /* torch: "Factor should be < 1.0."; a negative factor would flip the sign */
    if (!(factor >= 0.0) || factor >= 1.0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "factor must be in [0, 1) (the rate is multiplied by it), got %g", factor);
    if (patience < 0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "patience must be >= 0, got %lld", (long long)patience);
    if (!(threshold >= 0.0) || !isfinite(threshold))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "threshold must be a finite number >= 0, got %g", threshold);
    if (cooldown < 0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "cooldown must be >= 0, got %lld", (long long)cooldown);
    if (!(min_lr >= 0.0) || !isfinite(min_lr))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "min_lr must be a finite number >= 0, got %g", min_lr);
    if (!(eps >= 0.0) || !isfinite(eps))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "eps must be a finite number >= 0, got %g", eps);
    const sched_cfg c = {.plateau = {.mode_max = strcmp(mode, "max") == 0,
                                     .threshold_abs = strcmp(threshold_mode, "abs") == 0,
                                     .factor = factor,
                                     .threshold = threshold,
                                     .min_lr = min_lr,
                                     .eps = eps,
                                     .patience = patience,
                                     .cooldown = cooldown}};
    return sched_new(svc, hctx, SCHED_PLATEAU, &c, out);
}

/* PyTorch's _reset(): the worst possible best, no counters, rate = base. */
static void plateau_reset(kiln_instance *self, double base_lr, int64_t step) {
    sched_plateau_state *s = &self->st;
    s->initialised = 1;
    s->last_step = step;
    s->best = self->cfg.plateau.mode_max ? -INFINITY : INFINITY;
    s->num_bad_epochs = 0;
    s->cooldown_counter = 0;
    s->lr = base_lr;
}

/* ReduceLROnPlateau.is_better */
static int plateau_is_better(const kiln_instance *self, double a, double best) {
    const double t = self->cfg.plateau.threshold;
    if (!self->cfg.plateau.mode_max)
        return self->cfg.plateau.threshold_abs ? a < best - t : a < best * (1.0 - t);
    return self->cfg.plateau.threshold_abs ? a > best + t : a > best * (1.0 + t);
}

/* ReduceLROnPlateau.step(metric), one metric. */
static void plateau_consume(kiln_instance *self, double metric) {
    sched_plateau_state *s = &self->st;
    if (plateau_is_better(self, metric, s->best)) {
        s->best = metric;
        s->num_bad_epochs = 0;
    } else {
        s->num_bad_epochs++;
    }
    if (s->cooldown_counter > 0) { /* in cooldown: bad steps do not count */
        s->cooldown_counter--;
        s->num_bad_epochs = 0;
    }
    if (s->num_bad_epochs > self->cfg.plateau.patience) {
        const double old_lr = s->lr;
        double new_lr = old_lr * self->cfg.plateau.factor;
        if (new_lr < self->cfg.plateau.min_lr) new_lr = self->cfg.plateau.min_lr;
        /* a change smaller than eps is not worth making (torch's eps) */
        if (old_lr - new_lr > self->cfg.plateau.eps) s->lr = new_lr;
        s->cooldown_counter = self->cfg.plateau.cooldown;
        s->num_bad_epochs = 0;
    }
}

/* Step 0 is construction: the base rate, no metric read. Later steps feed
 * `metric` to ReduceLROnPlateau.step, except a NaN one (no metric: the host
 * has no monitor, or it was not logged), which keeps the rate and counts
 * nothing. A repeated step (the host re-applying the rate, e.g. after a
 * resume) returns the current rate without reading the metric again; a step
 * before the last one is refused, since the history cannot be rewound. */
static int32_t plateau_lr(kiln_instance *self, double base_lr, int64_t step, double metric, double *lr) {
    sched_plateau_state *s = &self->st;
    if (step == 0) {
        plateau_reset(self, base_lr, 0);
        *lr = s->lr;
        return KILN_OK;
    }
    if (!s->initialised) plateau_reset(self, base_lr, step - 1); /* the host skipped step 0 */
    if (step < s->last_step)
        return SCHED_ERR(self, KILN_E_INVALID_ARG,
                         "plateau scheduler: steps must come in order, got step %lld after step %lld",
                         (long long)step, (long long)s->last_step);
    if (step > s->last_step) {
        s->last_step = step;
        if (isnan(metric)) {
            if (!s->warned_no_metric) {
                kiln_logf(self->svc, self->hctx, KILN_LOG_WARN,
                          "plateau scheduler: no metric at step %lld (set scheduler.monitor to a logged metric, "
                          "e.g. \"val_loss\"); the rate stays %g",
                          (long long)step, s->lr);
                s->warned_no_metric = 1;
            }
        } else {
            plateau_consume(self, metric);
        }
    }
    *lr = s->lr;
    return KILN_OK;
}

/* ------------------------------------------------------------ lr_at */

/* Every kind's lr_at: the arguments checked (sched_check_args), then the
 * kind's closed form, or plateau's history. The epoch is not used: every
 * schedule here counts scheduler steps. */
static int32_t sched_lr_at(kiln_instance *self, double base_lr, int64_t step, int64_t epoch, double metric,
                           double *lr) {
    (void)epoch;
    int32_t rc = sched_check_args(self, base_lr, step, lr);
    if (rc != KILN_OK) return rc;
    switch (self->kind) {
    case SCHED_CONSTANT: *lr = constant_lr(self, base_lr, step); return KILN_OK;
    case SCHED_STEP: *lr = step_lr(self, base_lr, step); return KILN_OK;
    case SCHED_COSINE: *lr = cosine_lr(self, base_lr, step); return KILN_OK;
    default: return plateau_lr(self, base_lr, step, metric, lr);
    }
}

static int32_t plateau_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    if (!state_version || !data || !size)
        return SCHED_ERR(self, KILN_E_INVALID_ARG, "plateau scheduler: get_state got a NULL output pointer");
    plateau_blob b;
    memset(&b, 0, sizeof b);
    memcpy(b.magic, PLATEAU_STATE_MAGIC, sizeof b.magic);
    b.mode_max = (uint32_t)self->cfg.plateau.mode_max;
    b.initialised = (uint32_t)self->st.initialised;
    b.last_step = self->st.initialised ? self->st.last_step : -1;
    b.num_bad_epochs = self->st.num_bad_epochs;
    b.cooldown_counter = self->st.cooldown_counter;
    b.best = self->st.initialised ? self->st.best : (self->cfg.plateau.mode_max ? -INFINITY : INFINITY);
    b.lr = self->st.lr;
    void *blob = self->svc->alloc(self->hctx, sizeof b, 16);
    if (!blob) return SCHED_ERR(self, KILN_E_NOMEM, "cannot allocate %zu bytes for the plateau state", sizeof b);
    memcpy(blob, &b, sizeof b);
    *state_version = PLATEAU_STATE_VERSION;
    *data = blob;
    *size = sizeof b;
    return KILN_OK;
}

/* Everything is checked before anything changes: a refused blob leaves the
 * schedule as it was. */
static int32_t plateau_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    if (state_version != PLATEAU_STATE_VERSION)
        return SCHED_ERR(self, KILN_E_STATE,
                         "plateau scheduler state version %u is not supported (this build reads version %u)",
                         (unsigned)state_version, PLATEAU_STATE_VERSION);
    plateau_blob b;
    if (!data || size != sizeof b)
        return SCHED_ERR(self, KILN_E_STATE, "plateau scheduler state is %zu bytes, expected %zu", data ? size : 0,
                         sizeof b);
    memcpy(&b, data, sizeof b);
    if (memcmp(b.magic, PLATEAU_STATE_MAGIC, sizeof b.magic) != 0)
        return SCHED_ERR(self, KILN_E_STATE, "not a plateau scheduler state (wrong magic)");
    if (b.mode_max > 1 || b.initialised > 1)
        return SCHED_ERR(self, KILN_E_DATA,
                         "plateau scheduler state is corrupt: expected mode and initialised flags 0 or 1, found %u "
                         "and %u",
                         (unsigned)b.mode_max, (unsigned)b.initialised);
    /* Counters are bounded before use: num_bad_epochs++ past INT64_MAX
     * overflows, and a huge cooldown_counter silently stops every
     * reduction. Each counts steps, so none exceeds the steps taken. */
    const struct { const char *name; int64_t v, lo; } counts[] = {
        {"last_step", b.last_step, -1}, {"num_bad_epochs", b.num_bad_epochs, 0},
        {"cooldown_counter", b.cooldown_counter, 0}};
    for (int i = 0; i < 3; i++)
        if (counts[i].v < counts[i].lo || counts[i].v >= SCHED_COUNT_LIMIT)
            return SCHED_ERR(self, KILN_E_DATA,
                             "plateau scheduler state is corrupt: %s: expected %lld <= value < 2^53, found %lld",
                             counts[i].name, (long long)counts[i].lo, (long long)counts[i].v);
    if (!b.initialised && (b.last_step != -1 || b.num_bad_epochs != 0 || b.cooldown_counter != 0))
        return SCHED_ERR(self, KILN_E_DATA,
                         "plateau scheduler state is corrupt: a schedule not started yet: expected last_step -1 and "
                         "no counts, found last_step %lld, num_bad_epochs %lld, cooldown_counter %lld",
                         (long long)b.last_step, (long long)b.num_bad_epochs, (long long)b.cooldown_counter);
    if (b.initialised && b.last_step < 0)
        return SCHED_ERR(self, KILN_E_DATA,
                         "plateau scheduler state is corrupt: last_step of a started schedule: expected >= 0, found "
                         "%lld",
                         (long long)b.last_step);
    if (b.initialised && b.num_bad_epochs > b.last_step)
        return SCHED_ERR(self, KILN_E_DATA,
                         "plateau scheduler state is corrupt: num_bad_epochs: expected <= last_step (%lld), found %lld",
                         (long long)b.last_step, (long long)b.num_bad_epochs);
    if (isnan(b.best) || !(b.lr >= 0.0) || !isfinite(b.lr))
        return SCHED_ERR(self, KILN_E_DATA,
                         "plateau scheduler state is corrupt: expected a best value that is not nan and a finite lr "
                         ">= 0, found best %g, lr %g",
                         b.best, b.lr);
    if ((int)b.mode_max != self->cfg.plateau.mode_max)
        return SCHED_ERR(self, KILN_E_STATE,
                         "plateau scheduler state was written in mode \"%s\", the run file says mode \"%s\"; its best "
                         "value cannot be reused",
                         b.mode_max ? "max" : "min", self->cfg.plateau.mode_max ? "max" : "min");
    self->st.initialised = (int)b.initialised;
    self->st.last_step = b.last_step;
    self->st.num_bad_epochs = b.num_bad_epochs;
    self->st.cooldown_counter = b.cooldown_counter;
    self->st.best = b.best;
    self->st.lr = b.lr;
    return KILN_OK;
}

/* ------------------------------------------------------- descriptors */

static const kiln_scheduler_ops constant_ops = {
    .base = {sizeof(kiln_scheduler_ops), 0, constant_create, sched_destroy, NULL, NULL},
    .lr_at = sched_lr_at,
};
static const kiln_scheduler_ops step_ops = {
    .base = {sizeof(kiln_scheduler_ops), 0, step_create, sched_destroy, NULL, NULL},
    .lr_at = sched_lr_at,
};
static const kiln_scheduler_ops cosine_ops = {
    .base = {sizeof(kiln_scheduler_ops), 0, cosine_create, sched_destroy, NULL, NULL},
    .lr_at = sched_lr_at,
};
static const kiln_scheduler_ops plateau_ops = {
    .base = {sizeof(kiln_scheduler_ops), 0, plateau_create, sched_destroy, plateau_get_state, plateau_set_state},
    .lr_at = sched_lr_at,
};

static const kiln_param constant_params[] = {
    {"factor", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1.0 / 3.0),
     "multiplier of the rate for the first total_iters steps, in [0, 1]"},
    {"total_iters", KILN_TYPE_INT, 0, KILN_V_INT(5), "scheduler steps that use the reduced rate (>= 0)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};
static const kiln_param step_params[] = {
    {"step_size", KILN_TYPE_INT, 0, KILN_V_INT(30), "scheduler steps between two decays (>= 1)"},
    {"gamma", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.1), "multiplier applied at every decay (> 0)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};
static const kiln_param cosine_params[] = {
    {"warmup_steps", KILN_TYPE_INT, 0, KILN_V_INT(0), "linear warmup steps before the cosine (>= 0)"},
    {"warmup_start_factor", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0),
     "rate at step 0 as a factor of the base rate, in [0, 1]"},
    {"t_max", KILN_TYPE_INT, 0, KILN_V_INT(1000), "step at which the cosine reaches eta_min (> warmup_steps)"},
    {"eta_min", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0), "final rate, kept after t_max (>= 0)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};
static const kiln_param plateau_params[] = {
    {"mode", KILN_TYPE_STRING, 0, KILN_V_STR("min"), "\"min\": the metric should fall; \"max\": it should rise"},
    {"factor", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.1), "multiplier of the rate at a reduction, in [0, 1)"},
    {"patience", KILN_TYPE_INT, 0, KILN_V_INT(10), "steps without improvement tolerated before a reduction (>= 0)"},
    {"threshold", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1e-4), "least change that counts as an improvement (>= 0)"},
    {"threshold_mode", KILN_TYPE_STRING, 0, KILN_V_STR("rel"),
     "\"rel\": threshold is relative to the best; \"abs\": absolute"},
    {"cooldown", KILN_TYPE_INT, 0, KILN_V_INT(0),
     "steps after a reduction during which bad steps are not counted (>= 0)"},
    {"min_lr", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0), "lower bound of the rate (>= 0)"},
    {"eps", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1e-8), "reductions smaller than this are skipped (>= 0)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* Lightning's lr_scheduler_config["reduce_on_plateau"]: this schedule reads
 * a monitored metric, so the host should step it where Lightning steps
 * plateau schedulers and require `monitor`. Informational for other hosts. */
static const char *const plateau_checks[] = {"mode in {min, max}",    "factor in [0, 1)", "patience >= 0",
                                             "threshold >= 0",        "threshold_mode in {rel, abs}",
                                             "cooldown >= 0",         "min_lr >= 0",      "eps >= 0"};
static const kiln_kv plateau_props[] = {
    {"reduce_on_plateau", KILN_V_BOOL(1)},
    {"config_checks", KILN_V_STRS(plateau_checks)},
    {NULL, KILN_V_NONE},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const constant_checks[] = {"factor in [0, 1]", "total_iters >= 0"};
static const kiln_kv constant_props[] = {{"config_checks", KILN_V_STRS(constant_checks)}, {NULL, KILN_V_NONE}};
static const char *const step_checks[] = {"step_size >= 1", "gamma > 0"};
static const kiln_kv step_props[] = {{"config_checks", KILN_V_STRS(step_checks)}, {NULL, KILN_V_NONE}};
static const char *const cosine_checks[] = {"warmup_steps >= 0", "warmup_start_factor in [0, 1]", "t_max >= 1",
                                            "eta_min >= 0"};
static const kiln_kv cosine_props[] = {{"config_checks", KILN_V_STRS(cosine_checks)}, {NULL, KILN_V_NONE}};

static const kiln_plugin_desc constant_desc = {
    sizeof(kiln_plugin_desc), KILN_KIND_SCHEDULER, "constant", "0.1.0",
    "constant factor for the first total_iters steps, then the base rate (torch ConstantLR)",
    KILN_CAP_DETERMINISTIC, constant_props, constant_params, &constant_ops, NULL,
};
static const kiln_plugin_desc step_desc = {
    sizeof(kiln_plugin_desc), KILN_KIND_SCHEDULER, "step", "0.1.0",
    "decay by gamma every step_size steps (torch StepLR)",
    KILN_CAP_DETERMINISTIC, step_props, step_params, &step_ops, NULL,
};
static const kiln_plugin_desc cosine_desc = {
    sizeof(kiln_plugin_desc), KILN_KIND_SCHEDULER, "cosine", "0.1.0",
    "linear warmup, then cosine annealing to eta_min at t_max (CosineAnnealingLR with warmup)",
    KILN_CAP_DETERMINISTIC, cosine_props, cosine_params, &cosine_ops, NULL,
};
static const kiln_plugin_desc plateau_desc = {
    sizeof(kiln_plugin_desc), KILN_KIND_SCHEDULER, "plateau", "0.1.0",
    "reduce the rate when a monitored metric stops improving (torch ReduceLROnPlateau)",
    KILN_CAP_STATEFUL | KILN_CAP_DETERMINISTIC, plateau_props, plateau_params, &plateau_ops, NULL,
};

KILN_DEFINE_LIBRARY("schedulers", "0.1.0", 1, &constant_desc, &step_desc, &cosine_desc, &plateau_desc)
