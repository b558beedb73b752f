/*
 * bench/bench_attn.c — how fast the CPU causal self-attention kernels
 * (kc_attn_forward / kc_attn_backward, kernels/cpu/cpu_attn.c) run next to
 * the GEMM rate of the same OpenBLAS on the same machine. For the GPT shapes
 * of the project's target (C = 256, 4 heads, so D = 64; B = 16 with T = 128
 * and 256, B = 4 with T = 1024) it prints, at the given thread count, the
 * median forward and backward times over `runs` calls (after one warm-up)
 * and the achieved GFLOP/s, counting only the useful multiply-adds of the
 * causal lower triangle (D * T * (T + 1) per (batch, head) and product):
 * two products in the forward (Q K^T, P V), five in the backward (the
 * recomputed Q K^T, dV, dP, dQ, dK). The bound beside them is the rate of a
 * 512 x 512 x 512 float32 GEMM through kc_gemm (OpenBLAS at one thread per
 * call, split over kiln's pool as training runs it), measured in the same
 * process right before each shape, and the rate of one tile-shaped GEMM
 * (64 x T x 64, the shape the kernels issue) on one thread. Not a test: run
 * it by hand on an otherwise idle machine.
 *
 *   kiln-bench-attn [--threads N] [--runs R] [--T T (only that shape)]
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_attn.h"
#include "cpu_internal.h" /* kc_blas_sgemm: the tile GEMM through the same BLAS as the kernels */
#include "cpu_kernels.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void *xalloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? (bytes + 63) & ~(size_t)63 : 64) != 0) {
        fprintf(stderr, "bench_attn: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

static void fill(float *x, size_t n, unsigned seed) {
    unsigned s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((double)(s >> 8) / (double)(1u << 24) * 2.0 - 1.0);
    }
}

/* GFLOP/s of C(n, n) = A B through kc_gemm (median of `runs`). */
static double gemm_rate(int n, int runs) {
    float *A = xalloc((size_t)n * n * sizeof *A), *B = xalloc((size_t)n * n * sizeof *B),
          *C = xalloc((size_t)n * n * sizeof *C);
    fill(A, (size_t)n * n, 1), fill(B, (size_t)n * n, 2);
    double t[64];
    kc_gemm(0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    for (int r = 0; r < runs; r++) {
        const double t0 = now_s();
        kc_gemm(0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        t[r] = now_s() - t0;
    }
    free(A), free(B), free(C);
    return 2.0 * n * (double)n * n / median(t, runs) * 1e-9;
}

/* GFLOP/s of one S = Q K^T tile GEMM (64 x T x D, strided as in qkv), one
 * thread, repeated enough to time. */
static double tile_rate(int T, int C, int D, int runs) {
    const int ld = 3 * C, m = T < 64 ? T : 64, reps = 200;
    float *qkv = xalloc((size_t)T * ld * sizeof *qkv), *S = xalloc((size_t)64 * T * sizeof *S);
    fill(qkv, (size_t)T * ld, 3);
    double t[64];
    for (int r = 0; r < runs; r++) {
        const double t0 = now_s();
        for (int i = 0; i < reps; i++)
            kc_blas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, T, D, 0.125f, qkv, ld, qkv + C, ld, 0.0f, S, T);
        t[r] = (now_s() - t0) / reps;
    }
    free(qkv), free(S);
    return 2.0 * m * (double)T * D / median(t, runs) * 1e-9;
}

int main(int argc, char **argv) {
    int threads = 1, runs = 7, only_T = 0, blis = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--T") && i + 1 < argc) only_T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--blis")) blis = 1;
        else {
            fprintf(stderr, "usage: %s [--threads N] [--runs R] [--T T] [--blis]\n", argv[0]);
            return 2;
        }
    }
    if (runs < 1) runs = 1;
    if (runs > 64) runs = 64;
    /* as the cpu accelerator's configure(): OpenBLAS one thread per call,
     * kiln's pool sized to the thread count */
    openblas_set_num_threads(1);
    threads = kc_set_num_threads(threads);
    char err[256];
    if (blis && kc_blas_use_blis(err, sizeof err) != 0) { /* as the accelerator's blas = "blis" */
        fprintf(stderr, "bench_attn: %s\n", err);
        return 1;
    }
    printf("bench_attn: %d thread(s), %d runs, GEMMs through %s (OpenBLAS %s, core %s)\n", threads, runs,
           kc_blas_name(), openblas_get_config(), openblas_get_corename());
    printf("%-22s %9s %9s %9s %9s %11s %11s %9s %9s\n", "shape (B,T,C,NH)", "fwd ms", "fwd GF/s", "bwd ms",
           "bwd GF/s", "GEMM GF/s", "tile GF/s", "fwd/GEMM", "bwd/GEMM");
    static const int shapes[][4] = {{16, 128, 256, 4}, {16, 256, 256, 4}, {4, 1024, 256, 4}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int B = shapes[si][0], T = shapes[si][1], C = shapes[si][2], NH = shapes[si][3], D = C / NH;
        if (only_T && T != only_T) continue;
        const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
        float *qkv = xalloc(nq * sizeof(float)), *out = xalloc(no * sizeof(float)), *lse = xalloc(nl * sizeof(float)),
              *dout = xalloc(no * sizeof(float)), *dqkv = xalloc(nq * sizeof(float));
        fill(qkv, nq, 10 + (unsigned)si), fill(dout, no, 20 + (unsigned)si);
        const size_t wsb = kc_attn_workspace_bytes_for(1, sizeof(float), B, T, NH);
        void *ws = xalloc(wsb);
        const double gemm = gemm_rate(512, runs), tile = tile_rate(T, C, D, runs);
        double tf[64], tb[64];
        int bad = kc_attn_forward(out, lse, qkv, B, T, C, NH, KC_F32, ws, wsb) != 0 ||
                  kc_attn_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, KC_F32, ws, wsb) != 0;
        for (int r = 0; r < runs && !bad; r++) {
            double t0 = now_s();
            bad |= kc_attn_forward(out, lse, qkv, B, T, C, NH, KC_F32, ws, wsb) != 0;
            tf[r] = now_s() - t0;
            t0 = now_s();
            bad |= kc_attn_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, KC_F32, ws, wsb) != 0;
            tb[r] = now_s() - t0;
        }
        if (bad) {
            fprintf(stderr, "bench_attn: a kernel refused its call\n");
            return 1;
        }
        const double mf = median(tf, runs), mb = median(tb, runs);
        const double prod = (double)B * NH * 2.0 * D * (double)T * (T + 1) / 2.0; /* flops of one causal product */
        const double gf = 2 * prod / mf * 1e-9, gb = 5 * prod / mb * 1e-9;
        char name[64];
        snprintf(name, sizeof name, "(%d,%d,%d,%d)", B, T, C, NH);
        printf("%-22s %9.3f %9.2f %9.3f %9.2f %11.2f %11.2f %9.2f %9.2f\n", name, mf * 1e3, gf, mb * 1e3, gb, gemm,
               tile, gf / gemm, gb / gemm);
        free(qkv), free(out), free(lse), free(dout), free(dqkv), free(ws);
    }
    kc_set_num_threads(1);
    return 0;
}
