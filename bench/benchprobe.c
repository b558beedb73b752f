/*
 * bench/benchprobe.c — a callback plugin the benchmarks load into a real
 * `kiln fit` to measure it from the inside: the wall time of the training
 * epoch (on_train_epoch_start → on_train_epoch_end), the steady-state window
 * after `warmup` batches (time, steps, minor page faults from getrusage) and
 * the peak RSS. It appends one line of key=value pairs per epoch to `path`.
 * A benchmark tool, not for production runs.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include <kiln/kiln.h>

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    char path[1024];
    int64_t warmup;
    double t_epoch, t_steady;
    long flt_steady;
    int64_t steps_steady;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long minflt(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static int32_t bp_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)ctx;
    kiln_instance *b = calloc(1, sizeof *b);
    if (!b) return KILN_E_NOMEM;
    b->svc = svc;
    b->hctx = h;
    snprintf(b->path, sizeof b->path, "%s", kiln_kv_str(cfg, "path", "probe.txt"));
    b->warmup = kiln_kv_int(cfg, "warmup", 20);
    *out = b;
    return KILN_OK;
}

static void bp_destroy(kiln_instance *b) { free(b); }

static int32_t bp_event(kiln_instance *b, kiln_event *ev) {
    switch (ev->id) {
    case KILN_EV_ON_TRAIN_EPOCH_START:
        b->t_epoch = now();
        b->t_steady = 0;
        b->steps_steady = 0;
        break;
    case KILN_EV_ON_TRAIN_BATCH_START:
        if (ev->batch_idx == b->warmup) {
            b->flt_steady = minflt();
            b->t_steady = now();
        }
        break;
    case KILN_EV_ON_TRAIN_BATCH_END:
        if (ev->batch_idx >= b->warmup) b->steps_steady++;
        break;
    case KILN_EV_ON_TRAIN_EPOCH_END: {
        double t = now();
        long f = minflt();
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        FILE *fp = fopen(b->path, "a");
        if (!fp) return kiln_errorf(b->svc, b->hctx, KILN_E_IO, "%s: cannot append", b->path);
        fprintf(fp, "epoch_s=%.6f steady_s=%.6f steady_steps=%lld steady_minflt=%ld maxrss_kib=%ld\n", t - b->t_epoch,
                b->t_steady > 0 ? t - b->t_steady : 0.0, (long long)b->steps_steady,
                b->t_steady > 0 ? f - b->flt_steady : -1L, ru.ru_maxrss);
        fclose(fp);
        break;
    }
    default: break;
    }
    return KILN_OK;
}

static const kiln_callback_ops bp_ops = {{sizeof(kiln_callback_ops), 0, bp_create, bp_destroy, NULL, NULL}, bp_event};
static const kiln_param bp_params[] = {
    {"path", KILN_TYPE_STRING, 0, KILN_V_STR("probe.txt"), "file the measurements are appended to"},
    {"warmup", KILN_TYPE_INT, 0, KILN_V_INT(20), "batches before the steady-state window opens"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc bp_desc = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "benchprobe", "1.0.0",
                                         "epoch/steady-state timing, page faults and peak RSS for benchmarks", 0,
                                         NULL, bp_params, &bp_ops, NULL};
KILN_DEFINE_LIBRARY("benchprobe", "1.0.0", 1, &bp_desc)
