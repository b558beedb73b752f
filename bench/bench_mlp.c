/*
 * bench/bench_mlp.c — how close kiln's training loop comes to the time its
 * matrix multiplies alone need. For an MLP (default 784-1024-1024-10, batch
 * 128) it measures, at a given thread count:
 *   - kiln: real `kiln fit` runs of `epochs` epochs (`steps` batches of
 *     Fashion-MNIST each, no validation, no logging callbacks) with the
 *     benchprobe callback, which reports each epoch's time, a steady-state
 *     window, minor page faults in that window and the peak RSS;
 *   - the GEMM-only bound, measured by benchprobe inside the same process
 *     right before each epoch: the forward GEMMs, the weight-gradient GEMMs
 *     and the input-gradient GEMMs (none for the first layer) of one step,
 *     through OpenBLAS at the same thread count, the first layer's input
 *     rotating through 32 MiB of batches like fresh data;
 * and prints bound ÷ epoch time, the per-step overhead (steady step − GEMM
 * step) and the faults per steady-state step: medians over every epoch of
 * `runs` runs. Measuring each bound next to its epoch, in one process, keeps
 * the drifts of a shared machine out of the ratio. Not a test: run it by hand or
 * through bench/run.sh, on an otherwise idle machine.
 *
 *   kiln-bench-mlp --kiln build/bin/kiln --threads 1 --optimizer sgd
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>



static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    double epoch_s, steady_s, bound_step_s, paired_kiln_s, paired_gemm_s, paired_gemm_mean_s, paired_diff_s, probe_s;
    long steady_steps, steady_minflt, maxrss_kib, paired_steps;
} probe;
#define MAX_EPOCHS 16

/* One kiln run of `epochs` epochs; fills out[0..epochs-1]. */
static int run_kiln(const char *kiln, const char *probe_dir, const char *layers, int B, int steps, int threads,
                    const char *opt, int epochs, int reps, int paired, probe *out) {
    char dir[] = "/tmp/kiln-bench-XXXXXX";
    if (!mkdtemp(dir)) return -1;
    char cfg[256], probefile[256], cmd[4096];
    snprintf(cfg, sizeof cfg, "%s/run.cfg", dir);
    snprintf(probefile, sizeof probefile, "%s/probe.txt", dir);
    FILE *f = fopen(cfg, "w");
    if (!f) return -1;
    fprintf(f,
            "plugins = { dirs = [\"%s\"]; };\n"
            "trainer = { max_epochs = %d; limit_train_batches = %d; limit_val_batches = 0; num_sanity_val_steps = 0;\n"
            "  threads = %d; seed = 1; default_root_dir = \"%s/runs\"; log_every_n_steps = 1000000; };\n"
            "data = { name = \"idx\"; batch_size = %d; drop_last = true; };\n"
            "module = { name = \"mlp\"; layers = [%s]; max_batch = %d; };\n"
            "optimizer = { name = \"%s\"; lr = 0.01; };\n"
            "callbacks = ( { name = \"benchprobe\"; path = \"%s\"; warmup = %d; layers = [%s]; batch = %d;\n"
            "  threads = %d; bound_reps = %d; paired = %s; } );\n",
            probe_dir, epochs, steps, threads, dir, B, layers, B, opt, probefile, steps > 40 ? 20 : steps / 4, layers,
            B, threads, reps, paired ? "true" : "false");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s -q fit %s > %s/out.txt 2>&1", kiln, cfg, dir);
    int rc = system(cmd);
    f = fopen(probefile, "r");
    int ok = f != NULL;
    for (int e = 0; ok && e < epochs; e++)
        ok = fscanf(f,
                    " epoch_s=%lf steady_s=%lf steady_steps=%ld steady_minflt=%ld maxrss_kib=%ld bound_step_s=%lf"
                    " paired_steps=%ld paired_kiln_s=%lf paired_gemm_s=%lf paired_gemm_mean_s=%lf paired_diff_s=%lf probe_s=%lf",
                    &out[e].epoch_s, &out[e].steady_s, &out[e].steady_steps, &out[e].steady_minflt,
                    &out[e].maxrss_kib, &out[e].bound_step_s, &out[e].paired_steps, &out[e].paired_kiln_s,
                    &out[e].paired_gemm_s, &out[e].paired_gemm_mean_s, &out[e].paired_diff_s, &out[e].probe_s) == 12;
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
    int threads = 1, runs = 3, B = 128, steps = 429, reps = 100, epochs = 3, paired = 0;
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
        else if (!strcmp(argv[i], "--epochs") && i + 1 < argc) epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--paired")) paired = 1;
        else {
            fprintf(stderr, "usage: %s [--kiln PATH] [--probe-dir DIR] [--optimizer sgd|adamw] [--layers a,b,c]\n"
                            "          [--threads N] [--runs R] [--batch B] [--steps S] [--reps N] [--epochs E] [--paired]\n", argv[0]);
            return 2;
        }
    }
    if (!probe_dir) { fprintf(stderr, "--probe-dir (where libkiln-benchprobe.so is) is required\n"); return 2; }
    if (runs < 1 || runs > 64) runs = 3;
    if (epochs < 1 || epochs > MAX_EPOCHS) epochs = 3;
    /* Per epoch: gb the GEMM step it is compared with, ep kiln's epoch time
     * (net of the probe's own work), st kiln's steady step; peer the bound
     * through OpenBLAS's own threads, measured before the epoch. */
    double gb[64 * MAX_EPOCHS], ep[64 * MAX_EPOCHS], st[64 * MAX_EPOCHS], ratio[64 * MAX_EPOCHS],
        over[64 * MAX_EPOCHS], peer[64 * MAX_EPOCHS], pratio[64 * MAX_EPOCHS], gmean[64 * MAX_EPOCHS];
    int n = 0;
    long flt = 0, rss = 0, ss = 0;
    for (int r = 0; r < runs; r++) {
        probe p[MAX_EPOCHS];
        if (run_kiln(kiln, probe_dir, layers_s, B, steps, threads, opt, epochs, reps, paired, p)) {
            fprintf(stderr, "kiln run failed\n");
            return 1;
        }
        for (int e = 0; e < epochs; e++, n++) {
            peer[n] = p[e].bound_step_s;
            ep[n] = p[e].epoch_s - p[e].probe_s;
            if (paired) { /* each kiln step against the GEMM step timed right after it (benchprobe.c) */
                st[n] = p[e].paired_kiln_s;
                gb[n] = p[e].paired_gemm_s;
                gmean[n] = p[e].paired_gemm_mean_s; /* an epoch is a sum: its bound is the mean step's */
            } else {
                st[n] = p[e].steady_s / (double)(p[e].steady_steps ? p[e].steady_steps : 1);
                gb[n] = gmean[n] = peer[n];
            }
            ratio[n] = gmean[n] * steps / ep[n];
            pratio[n] = peer[n] * steps / ep[n];
            over[n] = paired ? p[e].paired_diff_s : st[n] - gb[n];
            if (p[e].steady_minflt > flt) flt = p[e].steady_minflt;
            if (p[e].maxrss_kib > rss) rss = p[e].maxrss_kib;
            ss = p[e].steady_steps;
        }
    }
    double gm = median(gmean, n), g = median(gb, n), rmed = median(ratio, n), omed = median(over, n), pg = median(peer, n),
           prmed = median(pratio, n);
    double epoch = median(ep, n), step = median(st, n);
    double bound = gm * steps;
    printf("mlp %s batch %d, %s, %d thread(s), %d steps, median of %d epochs (%d runs)\n", layers_s, B, opt, threads,
           steps, n, runs);
    if (paired)
        printf("  GEMM-only bound: %.3f ms/step (median; mean %.3f), %.3f s/epoch (paired: the accelerator's GEMMs,\n"
               "    one step after each steady kiln step); through OpenBLAS's threads before the epoch: %.3f ms/step\n",
               1e3 * g, 1e3 * gm, bound, 1e3 * pg);
    else
        printf("  GEMM-only bound: %.3f ms/step, %.3f s/epoch (OpenBLAS, measured before each epoch)\n", 1e3 * g, bound);
    printf("  kiln: %.3f s/epoch%s, %.3f ms/step steady\n", epoch, paired ? " (net of the probe)" : "", 1e3 * step);
    printf("  bound / kiln epoch = %.3f (median of per-epoch ratios)\n", rmed);
    if (paired) printf("  OpenBLAS-threads bound / kiln epoch = %.3f\n", prmed);
    printf("  per-step overhead (kiln steady step - GEMM step) = %.1f us (%s)\n", 1e6 * omed,
           paired ? "median over epochs of the median per-pair difference" : "median of per-epoch differences");
    printf("  minor page faults in %ld steady steps: %ld (%.2f per step); peak RSS %.1f MiB\n", ss, flt,
           ss ? (double)flt / (double)ss : 0.0, rss / 1024.0);
    printf("RESULT {\"layers\":\"%s\",\"batch\":%d,\"optimizer\":\"%s\",\"threads\":%d,\"gemm_ms\":%.4f,"
           "\"kiln_epoch_s\":%.4f,\"bound_epoch_s\":%.4f,\"ratio\":%.4f,\"overhead_us\":%.1f,\"faults_per_step\":%.3f,"
           "\"peak_rss_mib\":%.1f,\"paired\":%s,\"peer_gemm_ms\":%.4f,\"peer_ratio\":%.4f}\n",
           layers_s, B, opt, threads, 1e3 * g, epoch, bound, rmed, 1e6 * omed,
           ss ? (double)flt / (double)ss : 0.0, rss / 1024.0, paired ? "true" : "false", 1e3 * pg, prmed);
    return 0;
}
