/*
 * bench/gpu/gpu_gemm.c — the GEMM-only bound of one MLP training step on the
 * GPU, measured with cuBLASLt the way the cuda accelerator calls it: for
 * every Linear layer the forward GEMM (Y = X W^T), the weight-gradient GEMM
 * (dW = dY^T X) and, except for the first layer, the input-gradient GEMM
 * (dX = dY W), in the chosen dtype (fp32, TF32, fp16 or bf16 operands with
 * fp32 accumulation and fp32 output, as gemm_ex does). It times `reps`
 * whole steps with CUDA events after a warm-up, and prints the median step
 * time, the achieved TFLOP/s and that as a fraction of the dense peak for the
 * dtype (from --peak-tflops, else a table of known devices) as one
 * "RESULT {json}" line for bench/gpu/run.sh. A benchmark, not a test.
 *
 *   kiln-gpu-gemm --layers 784,8192,8192,10 --batch 8192 --dtype bf16
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLT_ME "kiln-gpu-gemm"
#include "bench_lt.h"

static int cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Dense peak TFLOP/s of known devices (NVIDIA's data sheets, SXM parts,
 * without sparsity), by dtype: fp32 (CUDA cores), tf32, fp16/bf16. */
static double known_peak(const char *name, const char *dtype) {
    struct { const char *key; double fp32, tf32, half; } t[] = {
        {"H200", 67.0, 494.7, 989.4}, {"H100", 67.0, 494.7, 989.4}, {"A100", 19.5, 156.0, 312.0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strstr(name, t[i].key))
            return !strcmp(dtype, "f32") ? t[i].fp32 : !strcmp(dtype, "tf32") ? t[i].tf32 : t[i].half;
    return 0.0;
}

/* One GEMM of the step and its operands. */
typedef struct {
    blt_gemm p;
    void *A, *B, *C;
    double flops;
} gemm;

static int gemm_make(cublasLtHandle_t lt, gemm *g, int ta, int tb, int M, int N, int K, cudaDataType_t ab,
                     cublasComputeType_t compute, size_t ws) {
    const size_t esz = ab == CUDA_R_32F ? 4 : 2;
    CK(cudaMalloc(&g->A, (size_t)M * K * esz));
    CK(cudaMalloc(&g->B, (size_t)K * N * esz));
    CK(cudaMalloc(&g->C, (size_t)M * N * 4));
    CK(cudaMemset(g->A, 0, (size_t)M * K * esz));
    CK(cudaMemset(g->B, 0, (size_t)K * N * esz));
    if (blt_plan(lt, &g->p, ta, tb, M, N, K, ab, compute, ws, NULL)) return 1;
    g->flops = 2.0 * M * N * K;
    return 0;
}

int main(int argc, char **argv) {
    const char *layers_s = "784,1024,1024,10", *dtype = "f32";
    int B = 128, reps = 50;
    double peak = 0.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers_s = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--peak-tflops") && i + 1 < argc) peak = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: kiln-gpu-gemm [--layers a,b,..] [--batch B] [--dtype f32|tf32|f16|bf16] [--reps N] "
                            "[--peak-tflops T]\n");
            return 2;
        }
    }
    int w[16], nl = 0;
    for (const char *p = layers_s; *p && nl < 16;) {
        w[nl++] = atoi(p);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    if (nl < 2 || B < 1 || reps < 3) {
        fprintf(stderr, "kiln-gpu-gemm: need >= 2 layer widths, batch >= 1, reps >= 3\n");
        return 2;
    }
    const cudaDataType_t ab = !strcmp(dtype, "bf16") ? CUDA_R_16BF : !strcmp(dtype, "f16") ? CUDA_R_16F : CUDA_R_32F;
    const cublasComputeType_t compute = !strcmp(dtype, "tf32") ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (peak <= 0.0) peak = known_peak(prop.name, dtype);

    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    const size_t ws_bytes = (size_t)32 << 20;
    void *ws;
    CK(cudaMalloc(&ws, ws_bytes));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    gemm g[48];
    int ng = 0;
    double flops = 0.0;
    for (int l = 0; l + 1 < nl; l++) {
        const int in = w[l], out = w[l + 1];
        if (gemm_make(lt, &g[ng++], 0, 1, B, out, in, ab, compute, ws_bytes)) return 1;  /* forward */
        if (gemm_make(lt, &g[ng++], 1, 0, out, in, B, ab, compute, ws_bytes)) return 1;  /* weight grad */
        if (l > 0 && gemm_make(lt, &g[ng++], 0, 0, B, in, out, ab, compute, ws_bytes)) return 1; /* input grad */
    }
    for (int i = 0; i < ng; i++) flops += g[i].flops;
    const float one = 1.0f, zero = 0.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double *t = calloc((size_t)reps, sizeof *t);
    if (!t) return 1;
    for (int r = -3; r < reps; r++) { /* 3 warm-up steps */
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < ng; i++)
            CB(cublasLtMatmul(lt, g[i].p.desc, &one, g[i].B, g[i].p.la, g[i].A, g[i].p.lb, &zero, g[i].C, g[i].p.lc,
                              g[i].C, g[i].p.lc, &g[i].p.algo, ws, ws_bytes, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = ms * 1e-3;
    }
    qsort(t, (size_t)reps, sizeof *t, cmpd);
    const double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    const double tflops = flops / med * 1e-12;
    printf("RESULT {\"device\": \"%s\", \"layers\": \"%s\", \"batch\": %d, \"dtype\": \"%s\", \"gemm_step_ms\": %.4f, "
           "\"tflops\": %.1f, \"peak_tflops\": %.1f, \"fraction_of_peak\": %.3f}\n",
           prop.name, layers_s, B, dtype, med * 1e3, tflops, peak, peak > 0 ? tflops / peak : 0.0);
    free(t);
    return 0;
}
