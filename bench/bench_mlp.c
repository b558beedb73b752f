/*
 * bench/bench_mlp.c — how close kiln's training loop comes to the time its
 * matrix multiplies alone need. For an MLP (default 784-1024-1024-10, batch
 * 128) it measures, at a given thread count:
 *   - the GEMM-only bound: the forward GEMMs, the weight-gradient GEMMs and
 *     the input-gradient GEMMs (none for the first layer) of one training
 *     step, called through OpenBLAS exactly as the mlp plugin calls them,
 *     timed over many steps; the first layer's input rotates through a pool
 *     of batches (32 MiB) because a real step reads a new batch from memory,
 *     while everything else stays as hot as in training;
 *   - kiln: a real `kiln fit` of one epoch (`steps` batches of Fashion-MNIST,
 *     no validation, no logging callbacks) with the benchprobe callback,
 *     which reports the epoch time, a steady-state window, minor page faults
 *     in that window and the peak RSS (median of `runs` runs);
 * and prints bound ÷ kiln epoch time, the per-step overhead (kiln step − GEMM
 * step) and the faults per steady-state step. The bound and a kiln run
 * alternate, `runs` times, and the ratio reported is the median of the
 * per-pair ratios, so slow drifts of a shared machine cancel out. Not a test: run it by hand or
 * through bench/run.sh, on an otherwise idle machine.
 *
 *   kiln-bench-mlp --kiln build/bin/kiln --threads 1 --optimizer sgd
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void openblas_set_num_threads(int);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static float *randbuf(size_t n) {
    float *p = aligned_alloc(64, ((n * sizeof(float)) + 63) & ~(size_t)63);
    for (size_t i = 0; i < n; i++) p[i] = (float)((double)rand() / RAND_MAX - 0.5);
    return p;
}

/* Per-step seconds of the GEMMs of one training step, averaged over `reps`
 * steps (after one warm-up step). */
static double gemm_bound(const int *w, int nl, int B, int threads, int reps) {
    openblas_set_num_threads(threads);
    float *W[16], *dW[16], *act[17], *dA[17];
    for (int l = 0; l < nl; l++) {
        W[l] = randbuf((size_t)w[l + 1] * w[l]);
        dW[l] = randbuf((size_t)w[l + 1] * w[l]);
    }
    for (int l = 0; l <= nl; l++) {
        act[l] = randbuf((size_t)B * w[l]);
        dA[l] = randbuf((size_t)B * w[l]);
    }
    /* a pool of input batches, like a data loader's fresh batches */
    size_t in_bytes = (size_t)B * w[0] * sizeof(float);
    int npool = (int)((32u << 20) / in_bytes);
    if (npool < 2) npool = 2;
    if (npool > 256) npool = 256;
    float *pool[256];
    for (int i = 0; i < npool; i++) pool[i] = randbuf((size_t)B * w[0]);
    double t0 = 0;
    for (int s = 0; s <= reps; s++) {
        if (s == 1) t0 = now();
        act[0] = pool[s % npool];
        for (int l = 0; l < nl; l++) /* y(B,out) = x(B,in) W(out,in)^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, w[l + 1], w[l], 1.0f, act[l], w[l], W[l], w[l],
                        0.0f, act[l + 1], w[l + 1]);
        for (int l = nl - 1; l >= 0; l--) {
            /* dW(out,in) += dy^T x */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, w[l + 1], w[l], B, 1.0f, dA[l + 1], w[l + 1], act[l],
                        w[l], 1.0f, dW[l], w[l]);
            if (l > 0) /* dx(B,in) = dy W */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, w[l], w[l + 1], 1.0f, dA[l + 1], w[l + 1],
                            W[l], w[l], 0.0f, dA[l], w[l]);
        }
    }
    double per = (now() - t0) / reps;
    for (int i = 0; i < npool; i++) free(pool[i]);
    act[0] = NULL;
    for (int l = 0; l < nl; l++) { free(W[l]); free(dW[l]); }
    for (int l = 1; l <= nl; l++) free(act[l]);
    for (int l = 0; l <= nl; l++) free(dA[l]);
    return per;
}

typedef struct { double epoch_s, steady_s; long steady_steps, steady_minflt, maxrss_kib; } probe;

static int run_kiln(const char *kiln, const char *probe_dir, const char *fixtures, const char *layers, int B, int steps,
                    int threads, const char *opt, probe *out) {
    char dir[] = "/tmp/kiln-bench-XXXXXX";
    if (!mkdtemp(dir)) return -1;
    char cfg[256], probefile[256], cmd[4096];
    snprintf(cfg, sizeof cfg, "%s/run.cfg", dir);
    snprintf(probefile, sizeof probefile, "%s/probe.txt", dir);
    FILE *f = fopen(cfg, "w");
    if (!f) return -1;
    fprintf(f,
            "plugins = { dirs = [\"%s\"]; };\n"
            "trainer = { max_epochs = 1; limit_train_batches = %d; limit_val_batches = 0; num_sanity_val_steps = 0;\n"
            "  threads = %d; seed = 1; default_root_dir = \"%s/runs\"; log_every_n_steps = 1000000; };\n"
            "data = { name = \"idx\"; batch_size = %d; drop_last = true; };\n"
            "module = { name = \"mlp\"; layers = [%s]; max_batch = %d; };\n"
            "optimizer = { name = \"%s\"; lr = 0.01; };\n"
            "callbacks = ( { name = \"benchprobe\"; path = \"%s\"; warmup = %d; } );\n",
            probe_dir, steps, threads, dir, B, layers, B, opt, probefile, steps > 40 ? 20 : steps / 4);
    fclose(f);
    (void)fixtures;
    snprintf(cmd, sizeof cmd, "%s -q fit %s > %s/out.txt 2>&1", kiln, cfg, dir);
    int rc = system(cmd);
    f = fopen(probefile, "r");
    int ok = f && fscanf(f, "epoch_s=%lf steady_s=%lf steady_steps=%ld steady_minflt=%ld maxrss_kib=%ld",
                         &out->epoch_s, &out->steady_s, &out->steady_steps, &out->steady_minflt,
                         &out->maxrss_kib) == 5;
    if (f) fclose(f);
    if (rc != 0 || !ok) {
        snprintf(cmd, sizeof cmd, "cat %s/out.txt >&2", dir);
        if (system(cmd)) {}
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return rc == 0 && ok ? 0 : -1;
}

int main(int argc, char **argv) {
    const char *kiln = "build/bin/kiln", *probe_dir = NULL, *opt = "sgd", *layers_s = "784,1024,1024,10";
    int threads = 1, runs = 3, B = 128, steps = 429, reps = 100;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kiln") && i + 1 < argc) kiln = argv[++i];
        else if (!strcmp(argv[i], "--probe-dir") && i + 1 < argc) probe_dir = argv[++i];
        else if (!strcmp(argv[i], "--optimizer") && i + 1 < argc) opt = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers_s = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--kiln PATH] [--probe-dir DIR] [--optimizer sgd|adamw] [--layers a,b,c]\n"
                            "          [--threads N] [--runs R] [--batch B] [--steps S] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (!probe_dir) { fprintf(stderr, "--probe-dir (where libkiln-benchprobe.so is) is required\n"); return 2; }
    if (runs < 1 || runs > 64) runs = 3;
    int w[17], nw = 0;
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", layers_s);
    for (char *t = strtok(tmp, ","); t && nw < 17; t = strtok(NULL, ",")) w[nw++] = atoi(t);
    double gb[64], ep[64], st[64], ratio[64], over[64];
    long flt = 0, rss = 0, ss = 0;
    for (int r = 0; r < runs; r++) { /* alternate: bound, then kiln */
        gb[r] = gemm_bound(w, nw - 1, B, threads, reps);
        probe p;
        if (run_kiln(kiln, probe_dir, NULL, layers_s, B, steps, threads, opt, &p)) {
            fprintf(stderr, "kiln run failed\n");
            return 1;
        }
        ep[r] = p.epoch_s;
        st[r] = p.steady_s / (double)(p.steady_steps ? p.steady_steps : 1);
        ratio[r] = gb[r] * steps / ep[r];
        over[r] = st[r] - gb[r];
        if (p.steady_minflt > flt) flt = p.steady_minflt;
        if (p.maxrss_kib > rss) rss = p.maxrss_kib;
        ss = p.steady_steps;
    }
    double g = median(gb, runs), rmed = median(ratio, runs), omed = median(over, runs);
    double epoch = median(ep, runs), step = median(st, runs);
    double bound = g * steps;
    printf("mlp %s batch %d, %s, %d thread(s), %d steps, median of %d runs\n", layers_s, B, opt, threads, steps, runs);
    printf("  GEMM-only bound: %.3f ms/step, %.3f s/epoch\n", 1e3 * g, bound);
    printf("  kiln: %.3f s/epoch, %.3f ms/step steady\n", epoch, 1e3 * step);
    printf("  bound / kiln epoch = %.3f (median of per-run ratios)\n", rmed);
    printf("  per-step overhead (kiln steady step - GEMM step) = %.1f us (median of per-run differences)\n", 1e6 * omed);
    printf("  minor page faults in %ld steady steps: %ld (%.2f per step); peak RSS %.1f MiB\n", ss, flt,
           ss ? (double)flt / (double)ss : 0.0, rss / 1024.0);
    printf("RESULT {\"layers\":\"%s\",\"batch\":%d,\"optimizer\":\"%s\",\"threads\":%d,\"gemm_ms\":%.4f,"
           "\"kiln_epoch_s\":%.4f,\"bound_epoch_s\":%.4f,\"ratio\":%.4f,\"overhead_us\":%.1f,\"faults_per_step\":%.3f,"
           "\"peak_rss_mib\":%.1f}\n",
           layers_s, B, opt, threads, 1e3 * g, epoch, bound, rmed, 1e6 * omed,
           ss ? (double)flt / (double)ss : 0.0, rss / 1024.0);
    return 0;
}
