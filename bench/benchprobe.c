/*
 * bench/benchprobe.c — a callback plugin the benchmarks load into a real
 * `kiln fit` to measure it from the inside: the wall time of the training
 * epoch (on_train_epoch_start → on_train_epoch_end), the steady-state window
 * after `warmup` batches (time, steps, minor page faults from getrusage) and
 * the peak RSS. With `layers` set it also measures, in the same process and
 * right before each epoch, the GEMM-only bound of one training step of that
 * MLP (OpenBLAS with `threads` threads, `bound_reps` steps), so the bound and
 * the epoch it is compared with see the same machine state. It appends one
 * line of key=value pairs per epoch to `path` (maxrss_kib is then kiln's
 * peak before the probe's buffers: kiln allocates nothing after setup). A
 * benchmark tool, not for production runs.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include <cblas.h>
#include <kiln/kiln.h>

void openblas_set_num_threads(int);

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    char path[1024];
    int64_t warmup;
    double t_epoch, t_steady;
    long flt_steady;
    int64_t steps_steady;
    int w[17], nw, batch, threads, reps;
    double bound_step; /* seconds per step, measured before this epoch */
    long rss_kiln_kib; /* peak RSS before the probe's own bound buffers  */
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The GEMMs of one training step of the MLP w[0..nw-1] at batch B, as the
 * mlp plugin calls them (no input gradient for the first layer); the first
 * layer's input rotates through 32 MiB of batches like fresh data. */
static double measure_bound(kiln_instance *b) {
    int nl = b->nw - 1, B = b->batch;
    float *W[16], *dW[16], *act[17], *dA[17], *pool[256];
    for (int l = 0; l < nl; l++) {
        W[l] = calloc((size_t)b->w[l + 1] * b->w[l], sizeof(float));
        dW[l] = calloc((size_t)b->w[l + 1] * b->w[l], sizeof(float));
    }
    for (int l = 0; l <= nl; l++) {
        act[l] = calloc((size_t)B * b->w[l], sizeof(float));
        dA[l] = calloc((size_t)B * b->w[l], sizeof(float));
    }
    size_t in_bytes = (size_t)B * b->w[0] * sizeof(float);
    int npool = (int)((32u << 20) / in_bytes);
    if (npool < 2) npool = 2;
    if (npool > 256) npool = 256;
    for (int i = 0; i < npool; i++) {
        pool[i] = malloc(in_bytes);
        for (size_t k = 0; k < in_bytes / sizeof(float); k++) pool[i][k] = (float)((k * 7 + (size_t)i) % 13) * 0.01f;
    }
    for (int l = 0; l < nl; l++)
        for (size_t k = 0; k < (size_t)b->w[l + 1] * b->w[l]; k++) W[l][k] = (float)(k % 17) * 0.001f;
    openblas_set_num_threads(b->threads);
    double t0 = 0;
    for (int s = 0; s <= b->reps; s++) {
        if (s == 1) t0 = now();
        float *x0 = pool[s % npool];
        for (int l = 0; l < nl; l++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, b->w[l + 1], b->w[l], 1.0f, l ? act[l] : x0,
                        b->w[l], W[l], b->w[l], 0.0f, act[l + 1], b->w[l + 1]);
        for (int l = nl - 1; l >= 0; l--) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b->w[l + 1], b->w[l], B, 1.0f, dA[l + 1],
                        b->w[l + 1], l ? act[l] : x0, b->w[l], 1.0f, dW[l], b->w[l]);
            if (l > 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, b->w[l], b->w[l + 1], 1.0f, dA[l + 1],
                            b->w[l + 1], W[l], b->w[l], 0.0f, dA[l], b->w[l]);
        }
    }
    double per = (now() - t0) / b->reps;
    openblas_set_num_threads(1); /* the cpu accelerator runs OpenBLAS one thread per call */
    for (int i = 0; i < npool; i++) free(pool[i]);
    for (int l = 0; l < nl; l++) { free(W[l]); free(dW[l]); }
    for (int l = 0; l <= nl; l++) { free(act[l]); free(dA[l]); }
    return per;
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
    const kiln_value *layers = kiln_kv_find(cfg, "layers");
    if (layers && layers->type == KILN_TYPE_INT_LIST)
        for (uint32_t i = 0; i < layers->count && i < 17; i++) b->w[b->nw++] = (int)layers->v.il[i];
    b->batch = (int)kiln_kv_int(cfg, "batch", 128);
    b->threads = (int)kiln_kv_int(cfg, "threads", 1);
    b->reps = (int)kiln_kv_int(cfg, "bound_reps", 50);
    *out = b;
    return KILN_OK;
}

static void bp_destroy(kiln_instance *b) { free(b); }

static int32_t bp_event(kiln_instance *b, kiln_event *ev) {
    switch (ev->id) {
    case KILN_EV_ON_TRAIN_EPOCH_START:
        if (!b->rss_kiln_kib) { /* kiln's footprint: everything is allocated by now */
            struct rusage ru0;
            getrusage(RUSAGE_SELF, &ru0);
            b->rss_kiln_kib = ru0.ru_maxrss;
        }
        b->bound_step = b->nw >= 2 ? measure_bound(b) : 0.0;
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
        fprintf(fp, "epoch_s=%.6f steady_s=%.6f steady_steps=%lld steady_minflt=%ld maxrss_kib=%ld bound_step_s=%.9f\n",
                t - b->t_epoch, b->t_steady > 0 ? t - b->t_steady : 0.0, (long long)b->steps_steady,
                b->t_steady > 0 ? f - b->flt_steady : -1L, b->nw >= 2 ? b->rss_kiln_kib : ru.ru_maxrss, b->bound_step);
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
    {"layers", KILN_TYPE_INT_LIST, 0, KILN_V_NONE, "MLP whose GEMM-only bound is measured before each epoch"},
    {"batch", KILN_TYPE_INT, 0, KILN_V_INT(128), "batch size of that bound"},
    {"threads", KILN_TYPE_INT, 0, KILN_V_INT(1), "OpenBLAS threads of that bound"},
    {"bound_reps", KILN_TYPE_INT, 0, KILN_V_INT(50), "steps the bound is averaged over"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc bp_desc = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "benchprobe", "1.0.0",
                                         "epoch/steady-state timing, page faults and peak RSS for benchmarks", 0,
                                         NULL, bp_params, &bp_ops, NULL};
KILN_DEFINE_LIBRARY("benchprobe", "1.0.0", 1, &bp_desc)
