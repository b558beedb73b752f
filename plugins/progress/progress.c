/*
 * progress.c — Lightning's progress bar as a kiln callback plugin. On a
 * terminal it keeps one line per training epoch rewritten with '\r'
 * ("Epoch 3/10  210/430 [=====>     ] 48.8%  312.4 it/s  ETA 0:01  loss
 * 0.412"), and draws validation, sanity-check and test runs on lines of their
 * own; elsewhere (logs, CI) it prints plain lines every print_every_n_batches
 * batches and a summary after each validation. The speed is an exponential
 * moving average of the time per batch, so one slow batch does not make the
 * ETA jump. Only rank 0 prints. Everything is formatted into one buffer owned
 * by the instance: nothing is allocated per batch.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kiln/kiln.h>

#include "../common/plugin_common.h"

#define PB_BAR_WIDTH 20   /* characters between the brackets               */
#define PB_LINE_MAX 512   /* one rendered line; metrics are few and short  */
#define PB_SMOOTHING 0.3  /* weight of the newest batch time (tqdm's value) */

/* The metrics a bar shows when the host has them. The ABI cannot enumerate
 * the names logged with KILN_LOG_PROG_BAR, so the bar asks for fixed ones. */
typedef struct pb_metric_name {
    const char *metric; /* name in callback_metrics */
    const char *label;  /* how the bar prints it    */
} pb_metric_name;

static const pb_metric_name pb_train_bar_metrics[] = {
    {"train_loss", "loss"}, {"train_acc", "train_acc"}, {"val_loss", "val_loss"}, {"val_acc", "val_acc"}, {NULL, NULL}};
static const pb_metric_name pb_train_line_metrics[] = {{"train_loss", "loss"}, {"train_acc", "train_acc"}, {NULL, NULL}};
static const pb_metric_name pb_val_metrics[] = {{"val_loss", "val_loss"}, {"val_acc", "val_acc"}, {NULL, NULL}};
static const pb_metric_name pb_test_metrics[] = {{"test_loss", "test_loss"}, {"test_acc", "test_acc"}, {NULL, NULL}};

/* Progress of one run of a loop (a training epoch, or one validation, sanity
 * check or test run). */
typedef struct pb_loop {
    int64_t n;       /* batches finished so far                              */
    int64_t total;   /* batches expected; <= 0 when the host does not know   */
    int64_t printed; /* n at the last plain line (non-TTY), -1 for none      */
    double t_last;   /* CLOCK_MONOTONIC seconds at the last batch end         */
    double ema_dt;   /* smoothed seconds per batch; 0 before the first batch  */
} pb_loop;

enum { PB_EVAL_VAL = 0, PB_EVAL_TEST = 1 };

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    int64_t refresh_rate; /* TTY: redraw every n batches; 0 disables the bar */
    int64_t every;        /* non-TTY: a line every n training batches        */
    int tty;              /* 1: '\r' bars, 0: plain lines                    */
    int sanity;           /* between ON_SANITY_CHECK_START and _END          */
    int eval_kind;        /* PB_EVAL_* of the running evaluation loop        */
    int line_open;        /* a bar line was drawn without its newline        */
    size_t last_len;      /* length of that line, to blank a longer old one  */
    int64_t epoch;        /* current_epoch + 1, as the bar shows it          */
    int64_t max_epochs;   /* <= 0: unbounded                                 */
    pb_loop train, eval;
    char line[PB_LINE_MAX];
};

/* ---------------------------------------------------------------------------
 * Small helpers */

static double pb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Append to self->line at *len, clamping at the buffer's end. */
static void pb_put(kiln_instance *self, size_t *len, const char *fmt, ...) {
    if (*len >= sizeof self->line - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(self->line + *len, sizeof self->line - *len, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    *len += (size_t)k;
    if (*len > sizeof self->line - 1) *len = sizeof self->line - 1;
}

static int pb_metric(kiln_instance *self, const char *name, double *out) {
    const kiln_host_services *svc = self->svc;
    return svc->abi_minor >= 1 && svc->get_metric && svc->get_metric(self->hctx, name, out) == KILN_OK;
}

/* Append " <label> <value>" for each metric of `names` the host has;
 * returns how many were present. */
static int pb_put_metrics(kiln_instance *self, size_t *len, const pb_metric_name *names, const char *sep,
                          const char *fmt) {
    int found = 0;
    for (; names->metric; names++) {
        double v;
        if (!pb_metric(self, names->metric, &v)) continue;
        pb_put(self, len, "%s%s ", sep, names->label);
        pb_put(self, len, fmt, v);
        found++;
    }
    return found;
}

static const kiln_trainer_state *pb_trainer(kiln_instance *self, const kiln_event *ev) {
    return cbc_trainer(self->svc, self->hctx, ev);
}

static void pb_loop_start(pb_loop *l, int64_t total) {
    l->n = 0;
    l->total = total;
    l->printed = -1;
    l->t_last = pb_now();
    l->ema_dt = 0;
}

/* A batch of `l` finished. batch_idx (when >= 0) positions the count, so a
 * run resumed mid-epoch shows the right place; the time since the last batch
 * end is spread over the batches it covered before it enters the average. */
static void pb_loop_tick(pb_loop *l, int64_t batch_idx) {
    int64_t n = batch_idx >= 0 ? batch_idx + 1 : l->n + 1;
    int64_t steps = n > l->n ? n - l->n : 1;
    double now = pb_now();
    double dt = (now - l->t_last) / (double)steps;
    l->ema_dt = l->ema_dt > 0 ? PB_SMOOTHING * dt + (1.0 - PB_SMOOTHING) * l->ema_dt : dt;
    l->t_last = now;
    l->n = n;
}

static double pb_rate(const pb_loop *l) { return l->ema_dt > 1e-12 ? 1.0 / l->ema_dt : 0.0; }

static int pb_due(const pb_loop *l, int64_t every) {
    return (every > 0 && l->n % every == 0) || (l->total > 0 && l->n >= l->total);
}

/* ---------------------------------------------------------------------------
 * Terminal bars */

/* "  210/430 [=====>     ] 48.8%  312.4 it/s  ETA 0:01", or without a known
 * total "  210 it  312.4 it/s". */
static void pb_put_bar(kiln_instance *self, size_t *len, const pb_loop *l) {
    double rate = pb_rate(l);
    if (l->total <= 0) {
        pb_put(self, len, "  %lld it  %.1f it/s", (long long)l->n, rate);
        return;
    }
    int64_t n = l->n < l->total ? l->n : l->total;
    int filled = (int)(n * PB_BAR_WIDTH / l->total);
    char bar[PB_BAR_WIDTH + 1];
    for (int i = 0; i < PB_BAR_WIDTH; i++) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
    bar[PB_BAR_WIDTH] = '\0';
    pb_put(self, len, "  %lld/%lld [%s] %.1f%%  %.1f it/s", (long long)l->n, (long long)l->total, bar,
           100.0 * (double)n / (double)l->total, rate);
    if (l->ema_dt > 0) {
        long long eta = (long long)((double)(l->total - n) * l->ema_dt + 0.5);
        if (eta >= 3600)
            pb_put(self, len, "  ETA %lld:%02lld:%02lld", eta / 3600, eta / 60 % 60, eta % 60);
        else
            pb_put(self, len, "  ETA %lld:%02lld", eta / 60, eta % 60);
    } else {
        pb_put(self, len, "  ETA ?");
    }
}

/* Redraw the open line: '\r', the text, and blanks over what a longer
 * previous text left behind. No newline: the next draw overwrites it. */
static void pb_draw(kiln_instance *self, size_t len) {
    fputc('\r', stdout);
    fwrite(self->line, 1, len, stdout);
    if (self->line_open)
        for (size_t i = len; i < self->last_len; i++) fputc(' ', stdout);
    self->line_open = 1;
    self->last_len = len;
    fflush(stdout);
}

static void pb_close_line(kiln_instance *self) {
    if (!self->line_open) return;
    fputc('\n', stdout);
    fflush(stdout);
    self->line_open = 0;
    self->last_len = 0;
}

static void pb_draw_train(kiln_instance *self) {
    size_t len = 0;
    if (self->max_epochs > 0)
        pb_put(self, &len, "Epoch %lld/%lld", (long long)self->epoch, (long long)self->max_epochs);
    else
        pb_put(self, &len, "Epoch %lld", (long long)self->epoch);
    pb_put_bar(self, &len, &self->train);
    pb_put_metrics(self, &len, pb_train_bar_metrics, "  ", "%.3f");
    pb_draw(self, len);
}

static const char *pb_eval_label(const kiln_instance *self) {
    if (self->eval_kind == PB_EVAL_TEST) return "Testing";
    return self->sanity ? "Sanity check" : "Validation";
}

static void pb_draw_eval(kiln_instance *self) {
    size_t len = 0;
    pb_put(self, &len, "%s", pb_eval_label(self));
    pb_put_bar(self, &len, &self->eval);
    pb_draw(self, len);
}

/* ---------------------------------------------------------------------------
 * Plain lines (not a terminal) */

static void pb_emit(kiln_instance *self, size_t len) {
    fwrite(self->line, 1, len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
}

/* "epoch 3 batch 200/430 loss 0.4120 312.4 it/s" */
static void pb_print_train(kiln_instance *self) {
    size_t len = 0;
    pb_put(self, &len, "epoch %lld batch %lld", (long long)self->epoch, (long long)self->train.n);
    if (self->train.total > 0) pb_put(self, &len, "/%lld", (long long)self->train.total);
    pb_put_metrics(self, &len, pb_train_line_metrics, " ", "%.4f");
    pb_put(self, &len, " %.1f it/s", pb_rate(&self->train));
    pb_emit(self, len);
    self->train.printed = self->train.n;
}

/* "validation epoch 3: val_loss 0.3500 val_acc 0.8740", "test: ...", or the
 * batch count when no metric of the loop was logged. */
static void pb_print_eval_summary(kiln_instance *self, const kiln_trainer_state *ts) {
    size_t len = 0;
    const pb_metric_name *names = pb_val_metrics;
    if (self->eval_kind == PB_EVAL_TEST) {
        pb_put(self, &len, "test:");
        names = pb_test_metrics;
    } else if (ts && ts->stage == KILN_STAGE_VALIDATE) {
        pb_put(self, &len, "validation:");
    } else {
        pb_put(self, &len, "validation epoch %lld:", (long long)self->epoch);
    }
    if (!pb_put_metrics(self, &len, names, " ", "%.4f"))
        pb_put(self, &len, " %lld batches", (long long)self->eval.n);
    pb_emit(self, len);
}

/* ---------------------------------------------------------------------------
 * Events */

static int32_t pb_on_event(kiln_instance *self, kiln_event *ev) {
    if (!self || !ev) return KILN_E_INVALID_ARG;
    if (self->refresh_rate == 0) return KILN_OK;
    const kiln_trainer_state *ts = pb_trainer(self, ev);
    if (ts && ts->rank != 0) return KILN_OK;

    switch (ev->id) {
    case KILN_EV_ON_SANITY_CHECK_START:
        self->sanity = 1;
        break;
    case KILN_EV_ON_SANITY_CHECK_END:
        pb_close_line(self);
        if (!self->tty && self->eval.n > 0) {
            size_t len = 0;
            pb_put(self, &len, "sanity check %lld/%lld", (long long)self->eval.n,
                   (long long)(self->eval.total > 0 ? self->eval.total : self->eval.n));
            pb_emit(self, len);
        }
        self->sanity = 0;
        self->eval.n = 0;
        break;
    case KILN_EV_ON_TRAIN_EPOCH_START:
        pb_close_line(self);
        self->epoch = ts ? ts->current_epoch + 1 : self->epoch + 1;
        self->max_epochs = ts ? ts->max_epochs : 0;
        pb_loop_start(&self->train, ts ? ts->num_training_batches : 0);
        break;
    case KILN_EV_ON_TRAIN_BATCH_END:
        pb_loop_tick(&self->train, ev->batch_idx);
        if (self->tty) {
            if (pb_due(&self->train, self->refresh_rate)) pb_draw_train(self);
        } else if (pb_due(&self->train, self->every)) {
            pb_print_train(self);
        }
        break;
    case KILN_EV_ON_TRAIN_EPOCH_END:
        if (self->tty) {
            /* The final state of the epoch, with the validation metrics
             * that arrived since, stays on screen. */
            pb_draw_train(self);
            pb_close_line(self);
        } else if (self->train.n > 0 && self->train.printed != self->train.n) {
            pb_print_train(self);
        }
        break;
    case KILN_EV_ON_VALIDATION_START:
    case KILN_EV_ON_TEST_START:
        pb_close_line(self);
        self->eval_kind = ev->id == KILN_EV_ON_TEST_START ? PB_EVAL_TEST : PB_EVAL_VAL;
        if (ev->stage == KILN_STAGE_SANITY || (ts && ts->sanity_checking)) self->sanity = 1;
        /* The ABI has no count of test batches (or of sanity steps): the
         * test bar runs without a total, the sanity bar uses the validation
         * count, which the host is expected to limit while sanity checking. */
        pb_loop_start(&self->eval, ts && self->eval_kind == PB_EVAL_VAL ? ts->num_val_batches : 0);
        break;
    case KILN_EV_ON_VALIDATION_BATCH_END:
    case KILN_EV_ON_TEST_BATCH_END:
        pb_loop_tick(&self->eval, ev->batch_idx);
        if (self->tty && pb_due(&self->eval, self->refresh_rate)) pb_draw_eval(self);
        break;
    case KILN_EV_ON_VALIDATION_END:
    case KILN_EV_ON_TEST_END:
        if (self->tty) {
            pb_draw_eval(self);
            pb_close_line(self);
        } else if (!self->sanity) {
            pb_print_eval_summary(self, ts);
        }
        break;
    case KILN_EV_ON_TRAIN_END:
    case KILN_EV_ON_EXCEPTION:
    case KILN_EV_TEARDOWN:
        pb_close_line(self);
        break;
    default:
        break;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Lifecycle */

static int32_t pb_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                         kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    int64_t refresh = kiln_kv_int(config, "refresh_rate", 1);
    int64_t every = kiln_kv_int(config, "print_every_n_batches", 50);
    const char *tty = kiln_kv_str(config, "tty", "auto");
    int32_t rc;
    if ((rc = cbc_at_least(svc, hctx, "", "refresh_rate", refresh, 0, " (0 disables the bar)")) != KILN_OK ||
        (rc = cbc_at_least(svc, hctx, "", "print_every_n_batches", every, 1, "")) != KILN_OK)
        return rc;
    int is_tty;
    if (!strcmp(tty, "auto"))
        is_tty = isatty(STDOUT_FILENO);
    else if (!strcmp(tty, "always"))
        is_tty = 1;
    else if (!strcmp(tty, "never"))
        is_tty = 0;
    else
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "tty must be \"auto\", \"always\" or \"never\", got \"%s\"", tty);

    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "progress: out of memory");
    self->svc = svc;
    self->hctx = hctx;
    /* `kiln -q` lowers the log level below info: a quiet run draws nothing */
    if (svc->log_enabled && !svc->log_enabled(hctx, KILN_LOG_INFO)) refresh = 0;
    self->refresh_rate = refresh;
    self->every = every;
    self->tty = is_tty;
    self->train.printed = self->eval.printed = -1;
    *out = self;
    return KILN_OK;
}

static void pb_destroy(kiln_instance *self) {
    if (!self) return;
    pb_close_line(self);
    free(self);
}

static const kiln_callback_ops pb_ops = {
    .base = {.struct_size = sizeof(kiln_callback_ops), .create = pb_create, .destroy = pb_destroy},
    .on_event = pb_on_event,
};

static const kiln_param pb_params[] = {
    {"refresh_rate", KILN_TYPE_INT, 0, KILN_V_INT(1), "terminal: redraw the bar every n batches (0 disables it)"},
    {"tty", KILN_TYPE_STRING, 0, KILN_V_STR("auto"),
     "\"auto\" (stdout is a terminal), \"always\" ('\\r' bars) or \"never\" (plain lines)"},
    {"print_every_n_batches", KILN_TYPE_INT, 0, KILN_V_INT(50), "not a terminal: a line every n training batches"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const pb_checks[] = {"refresh_rate >= 0", "tty in {auto, always, never}", "print_every_n_batches >= 1"};
static const kiln_kv pb_props[] = {
    {"config_checks", KILN_V_STRS(pb_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc pb_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_CALLBACK,
    .name = "progress",
    .version = "1.0.0",
    .description = "Lightning's progress bar: epochs, validation and speed on stdout (rank 0)",
    .properties = pb_props,
    .params = pb_params,
    .ops = &pb_ops,
};

KILN_DEFINE_LIBRARY("progress", "1.0.0", 1, &pb_desc)
