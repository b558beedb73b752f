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
 * peak before the probe's buffers: kiln allocates nothing after setup).
 *
 * With `paired = true` it also runs one GEMM-only step after every
 * steady-state batch (in on_train_batch_end) and times both: the kiln step
 * (from the probe's return at the previous batch end to this batch end, so
 * data fetch, hooks, forward, backward and optimizer all count) and the GEMM
 * step next to it. The median of the per-pair differences gives the per-step
 * overhead with the machine's drifts cancelled, which a bound measured before the epoch
 * cannot do for a model whose overhead is a few percent of its step; the
 * probe's own time in the epoch (probe_s) is reported so that the epoch time
 * net of it can be set against the paired GEMM step. The
 * probe's GEMMs run on their own buffers, so they can only evict kiln's data
 * and make its step slower: the overhead measured this way errs high. The
 * paired GEMMs go through the run's accelerator (its gemm entry), not through
 * OpenBLAS's own threads: those spin for a while after each call and, between
 * two kiln steps, would steal the cores from kiln's pool (a 2-thread kiln
 * step measured 43 ms after an OpenBLAS-threaded GEMM step, 36 ms without).
 * A benchmark tool, not for production runs.
 */
#define _GNU_SOURCE
#include <stdbool.h>
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
    char dump[1024]; /* paired mode: every pair appended here when set ("" = none) */
    int64_t warmup;
    double t_epoch, t_steady;
    long flt_steady;
    int64_t steps_steady;
    int w[17], nw, batch, threads, reps;
    double bound_step; /* seconds per step, measured before this epoch */
    long rss_kiln_kib; /* peak RSS before the probe's own bound buffers  */
    /* The bound's buffers, allocated once (first epoch start) and reused. */
    float *W[16], *dW[16], *act[17], *dA[17], *pool[256];
    int npool, pool_i;
    /* paired mode: per steady step, kiln's step and the GEMM step after it (seconds) */
    bool paired;
    kiln_instance *acc;             /* the run's accelerator, for the paired GEMMs */
    const struct kiln_kernels *k;
    double *kiln_t, *gemm_t, t_mark;
    double probe_s; /* the probe's own time inside this epoch (paired GEMM steps) */
    int64_t cap, n_pairs;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Allocates (and touches) the bound's buffers once: W, dW (w[l+1], w[l]),
 * act, dA (batch, w[l]) and a pool of first-layer inputs spanning 32 MiB. */
static int bound_alloc(kiln_instance *b) {
    int nl = b->nw - 1, B = b->batch;
    for (int l = 0; l < nl; l++) {
        if (!(b->W[l] = calloc((size_t)b->w[l + 1] * b->w[l], sizeof(float)))) return -1;
        if (!(b->dW[l] = calloc((size_t)b->w[l + 1] * b->w[l], sizeof(float)))) return -1;
        for (size_t k = 0; k < (size_t)b->w[l + 1] * b->w[l]; k++) b->W[l][k] = (float)(k % 17) * 0.001f;
    }
    for (int l = 0; l <= nl; l++) {
        if (!(b->act[l] = calloc((size_t)B * b->w[l], sizeof(float)))) return -1;
        if (!(b->dA[l] = calloc((size_t)B * b->w[l], sizeof(float)))) return -1;
    }
    size_t in_bytes = (size_t)B * b->w[0] * sizeof(float);
    b->npool = (int)((32u << 20) / in_bytes);
    if (b->npool < 2) b->npool = 2;
    if (b->npool > 256) b->npool = 256;
    for (int i = 0; i < b->npool; i++) {
        if (!(b->pool[i] = malloc(in_bytes))) return -1;
        for (size_t k = 0; k < in_bytes / sizeof(float); k++) b->pool[i][k] = (float)((k * 7 + (size_t)i) % 13) * 0.01f;
    }
    return 0;
}

static void bound_free(kiln_instance *b) {
    for (int i = 0; i < b->npool; i++) free(b->pool[i]);
    for (int l = 0; l < 16; l++) { free(b->W[l]); free(b->dW[l]); }
    for (int l = 0; l < 17; l++) { free(b->act[l]); free(b->dA[l]); }
}

/* The GEMMs of one training step of the MLP w[0..nw-1] at batch B, as the
 * mlp plugin calls them (no input gradient for the first layer); the first
 * layer's input rotates through the pool like fresh data. */
static void gemm(kiln_instance *b, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
                 int ldb, float beta, float *C, int ldc) {
    if (b->k) /* paired mode: the accelerator's GEMM (cpu: kiln's split, OpenBLAS one thread per part) */
        (void)b->k->gemm(b->acc, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A,
                    lda, B, ldb, beta, C, ldc);
}

static void bound_step(kiln_instance *b) {
    int nl = b->nw - 1, B = b->batch;
    float *x0 = b->pool[b->pool_i++ % b->npool];
    for (int l = 0; l < nl; l++)
        gemm(b, 0, 1, B, b->w[l + 1], b->w[l], l ? b->act[l] : x0, b->w[l], b->W[l], b->w[l], 0.0f, b->act[l + 1],
             b->w[l + 1]);
    for (int l = nl - 1; l >= 0; l--) {
        gemm(b, 1, 0, b->w[l + 1], b->w[l], B, b->dA[l + 1], b->w[l + 1], l ? b->act[l] : x0, b->w[l], 1.0f, b->dW[l],
             b->w[l]);
        if (l > 0)
            gemm(b, 0, 0, B, b->w[l], b->w[l + 1], b->dA[l + 1], b->w[l + 1], b->W[l], b->w[l], 0.0f, b->dA[l],
                 b->w[l]);
    }
}

/* Seconds per GEMM-only step through OpenBLAS's own threads, averaged over
 * `reps` steps after one warm-up. */
static double measure_bound(kiln_instance *b) {
    const struct kiln_kernels *k = b->k;
    b->k = NULL;
    openblas_set_num_threads(b->threads);
    double t0 = 0;
    for (int s = 0; s <= b->reps; s++) {
        if (s == 1) t0 = now();
        bound_step(b);
    }
    double per = (now() - t0) / b->reps;
    openblas_set_num_threads(1); /* the cpu accelerator runs OpenBLAS one thread per call */
    b->k = k;
    return per;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v (n) in place and returns its median; 0 for no values. */
static double median_of(double *v, int64_t n) {
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
    snprintf(b->dump, sizeof b->dump, "%s", kiln_kv_str(cfg, "dump", ""));
    b->warmup = kiln_kv_int(cfg, "warmup", 20);
    const kiln_value *layers = kiln_kv_find(cfg, "layers");
    if (layers && layers->type == KILN_TYPE_INT_LIST)
        for (uint32_t i = 0; i < layers->count && i < 17; i++) b->w[b->nw++] = (int)layers->v.il[i];
    b->batch = (int)kiln_kv_int(cfg, "batch", 128);
    b->threads = (int)kiln_kv_int(cfg, "threads", 1);
    b->reps = (int)kiln_kv_int(cfg, "bound_reps", 50);
    b->paired = kiln_kv_int(cfg, "paired", 0) != 0 && b->nw >= 2;
    b->cap = kiln_kv_int(cfg, "max_steps", 100000);
    if (b->paired) {
        b->kiln_t = calloc((size_t)b->cap, sizeof(double)); /* calloc'd and touched now: no faults in the window */
        b->gemm_t = calloc((size_t)b->cap, sizeof(double));
        if (!b->kiln_t || !b->gemm_t) { free(b->kiln_t); free(b->gemm_t); free(b); return KILN_E_NOMEM; }
        for (int64_t i = 0; i < b->cap; i++) b->kiln_t[i] = b->gemm_t[i] = 0.0;
    }
    *out = b;
    return KILN_OK;
}

static void bp_destroy(kiln_instance *b) {
    bound_free(b);
    free(b->kiln_t);
    free(b->gemm_t);
    free(b);
}

static int32_t bp_event(kiln_instance *b, kiln_event *ev) {
    switch (ev->id) {
    case KILN_EV_ON_TRAIN_EPOCH_START:
        if (!b->rss_kiln_kib) { /* kiln's footprint: everything is allocated by now */
            struct rusage ru0;
            getrusage(RUSAGE_SELF, &ru0);
            b->rss_kiln_kib = ru0.ru_maxrss;
        }
        if (b->nw >= 2 && !b->npool && bound_alloc(b))
            return kiln_errorf(b->svc, b->hctx, KILN_E_NOMEM, "benchprobe: cannot allocate the bound's buffers");
        if (b->paired && !b->k) {
            int32_t rc = b->svc->accelerator(b->hctx, &b->acc, &b->k);
            if (rc != KILN_OK) return rc;
            /* the bound's buffers are host memory (bound_alloc), which only a
             * host-memory accelerator's GEMM may read */
            if (!(b->k->flags & KILN_KERNELS_HOST_MEMORY))
                return kiln_errorf(b->svc, b->hctx, KILN_E_CONFIG,
                                   "benchprobe: paired = true needs an accelerator whose memory is host memory "
                                   "(its GEMM runs on the bound's host buffers); use paired = false here");
        }
        b->bound_step = b->nw >= 2 ? measure_bound(b) : 0.0;
        b->t_epoch = now();
        b->t_steady = 0;
        b->steps_steady = 0;
        b->n_pairs = 0;
        b->probe_s = 0.0;
        break;
    case KILN_EV_ON_TRAIN_BATCH_START:
        if (ev->batch_idx == b->warmup) {
            b->flt_steady = minflt();
            b->t_steady = now();
        }
        break;
    case KILN_EV_ON_TRAIN_BATCH_END:
        if (ev->batch_idx >= b->warmup) b->steps_steady++;
        if (b->paired && ev->batch_idx + 1 >= b->warmup) {
            double t0 = now();
            /* the first pair starts at the end of the last warm-up batch */
            if (ev->batch_idx >= b->warmup && b->n_pairs < b->cap) b->kiln_t[b->n_pairs] = t0 - b->t_mark;
            bound_step(b);
            double t1 = now();
            if (ev->batch_idx >= b->warmup && b->n_pairs < b->cap) b->gemm_t[b->n_pairs++] = t1 - t0;
            b->t_mark = now();
            b->probe_s += b->t_mark - t0;
        }
        break;
    case KILN_EV_ON_TRAIN_EPOCH_END: {
        double t = now();
        long f = minflt();
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        FILE *fp = fopen(b->path, "a");
        if (!fp) return kiln_errorf(b->svc, b->hctx, KILN_E_IO, "%s: cannot append", b->path);
        if (b->dump[0] && b->n_pairs) { /* before median_of sorts them */
            FILE *d = fopen(b->dump, "a");
            if (!d) return kiln_errorf(b->svc, b->hctx, KILN_E_IO, "%s: cannot append", b->dump);
            for (int64_t i = 0; i < b->n_pairs; i++) fprintf(d, "%lld %.9f %.9f\n", (long long)i, b->kiln_t[i], b->gemm_t[i]);
            fclose(d);
        }
        double sg = 0.0; /* the mean GEMM step: the bound of an epoch is a sum, and medians of a bimodal
                          * machine (the second vCPU fast, then slow, for seconds) would not add up */
        for (int64_t i = 0; i < b->n_pairs; i++) sg += b->gemm_t[i];
        double mg = b->n_pairs ? sg / (double)b->n_pairs : 0.0;
        /* the overhead: median of per-pair differences, each pair timed back to back (same machine state) */
        double *diff = b->n_pairs ? malloc((size_t)b->n_pairs * sizeof *diff) : NULL;
        for (int64_t i = 0; diff && i < b->n_pairs; i++) diff[i] = b->kiln_t[i] - b->gemm_t[i];
        double pd = diff ? median_of(diff, b->n_pairs) : 0.0;
        free(diff);
        double pk = median_of(b->kiln_t, b->n_pairs), pg = median_of(b->gemm_t, b->n_pairs);
        fprintf(fp,
                "epoch_s=%.6f steady_s=%.6f steady_steps=%lld steady_minflt=%ld maxrss_kib=%ld bound_step_s=%.9f "
                "paired_steps=%lld paired_kiln_s=%.9f paired_gemm_s=%.9f paired_gemm_mean_s=%.9f paired_diff_s=%.9f probe_s=%.6f\n",
                t - b->t_epoch, b->t_steady > 0 ? t - b->t_steady : 0.0, (long long)b->steps_steady,
                b->t_steady > 0 ? f - b->flt_steady : -1L, b->nw >= 2 ? b->rss_kiln_kib : ru.ru_maxrss, b->bound_step,
                (long long)b->n_pairs, pk, pg, mg, pd, b->probe_s);
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
    {"paired", KILN_TYPE_BOOL, 0, KILN_V_BOOL(false), "also time a GEMM-only step after every steady-state batch"},
    {"max_steps", KILN_TYPE_INT, 0, KILN_V_INT(100000), "most steady-state pairs recorded per epoch"},
    {"dump", KILN_TYPE_STRING, 0, KILN_V_STR(""), "paired mode: file every (step, kiln s, GEMM s) is appended to"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc bp_desc = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "benchprobe", "1.0.0",
                                         "epoch/steady-state timing, page faults and peak RSS for benchmarks", 0,
                                         NULL, bp_params, &bp_ops, NULL};
KILN_DEFINE_LIBRARY("benchprobe", "1.0.0", 1, &bp_desc)
