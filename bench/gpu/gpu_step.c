/*
 * bench/gpu/gpu_step.c — one fp32 MLP training step built from the cuda
 * accelerator's own kernels (kernels/cuda: kg_linear_epilogue, the loss,
 * activation, bias-gradient and SGD kernels) and cuBLASLt GEMMs with the
 * bias epilogue, the way plugins/cuda runs mlp's step, but with nothing
 * read back to the host: the batch copy from pinned memory, zero_grad, the
 * forward, the loss into device memory, the backward and the SGD update.
 * Before timing anything it checks the step's gradients against central
 * differences of its loss, and afterwards that the loss fell.
 * It measures that step two ways, as the GPU benchmark asks:
 *   - eager: every kernel launched from the host each step;
 *   - graph: the step captured once into a CUDA graph and replayed.
 * For each it reports the wall time per step over `reps` back-to-back steps
 * (one synchronisation at the end), the host time per step spent issuing
 * the work, and the GPU time per step (CUDA events around a replayed graph,
 * whose kernels run back to back). Host overhead per step is the step wall
 * time minus the GPU time: what launching, not computing, costs. `kiln fit`
 * pays more than this step (its hooks, and the loss read back each step for
 * the progress bar and closures): this is the launch-bound floor of kiln's
 * kernels, with and without graphs. Every copy and memset runs on the
 * step's one non-blocking stream (the legacy default stream would not be
 * ordered with it). Prints one "RESULT {json}" line for
 * bench/gpu/run.sh. A benchmark, not a test; --eager-only skips the graph,
 * which is how tests/cuda_fake runs it on its fake CUDA runtime.
 *
 *   kiln-gpu-step --layers 784,32,10 --batch 128 --reps 2000
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kg_kernels.h"

#define BLT_ME "kiln-gpu-step"
#include "bench_lt.h"

#define MAXL 8

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A planned fp32 GEMM of the step and the beta it runs with. */
typedef struct {
    blt_gemm p;
    float beta;
} gemm;

static int gemm_make(cublasLtHandle_t lt, gemm *g, int ta, int tb, int M, int N, int K, float beta, const float *bias,
                     size_t ws) {
    g->beta = beta;
    return blt_plan(lt, &g->p, ta, tb, M, N, K, CUDA_R_32F, CUBLAS_COMPUTE_32F, ws, bias);
}

/* The network and its buffers, all device memory but the pinned batch. */
typedef struct {
    int nl, w[MAXL], B;
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    cudaStream_t st;
    float *W[MAXL], *b[MAXL], *dW[MAXL], *db[MAXL]; /* (w[l+1], w[l]), (w[l+1]) */
    float *pre[MAXL], *post[MAXL];                  /* (B, w[l+1]) */
    float *x, *probs, *ga, *gb;                      /* (B, w[0]), (B, C), 2 x (B, max width) */
    int32_t *labels, *row_correct, *bad_row;         /* (B), (B), (1) */
    void *bg_work;                                   /* kg_bias_grad's partials: (parts(B), max width) */
    double *row_loss, *loss;                         /* (B), (2): mean loss, correct */
    float *host_x;                                   /* (B, w[0]) pinned */
    int32_t *host_labels;                            /* (B) pinned */
    gemm fwd[MAXL], wgrad[MAXL], xgrad[MAXL];
} net;

/* The forward: batch in, Linear layers (bias epilogue, ReLU between), the
 * loss into n->loss (device). Enqueued on n->st; nothing waits. */
static int forward(net *n) {
    const float one = 1.0f;
    const int L = n->nl - 1, C = n->w[L];
    CK(cudaMemcpyAsync(n->x, n->host_x, (size_t)n->B * n->w[0] * sizeof(float), cudaMemcpyHostToDevice, n->st));
    CK(cudaMemcpyAsync(n->labels, n->host_labels, (size_t)n->B * sizeof(int32_t), cudaMemcpyHostToDevice, n->st));
    const float *in = n->x;
    for (int l = 0; l < L; l++) { /* y = x W^T + b (epilogue), post = relu(y) */
        gemm *g = &n->fwd[l];
        CB(cublasLtMatmul(n->lt, g->p.desc, &one, n->W[l], g->p.la, in, g->p.lb, &g->beta, n->pre[l], g->p.lc,
                          n->pre[l], g->p.lc, &g->p.algo, n->ws, n->ws_bytes, n->st));
        if (l < L - 1) {
            CK(kg_linear_epilogue(n->st, KG_F32, n->pre[l], NULL, n->B, n->w[l + 1], KG_ACT_RELU, n->post[l], KG_F32));
            in = n->post[l];
        }
    }
    CK(kg_softmax_xent_forward(n->st, KG_F32, n->probs, n->pre[L - 1], n->labels, n->B, C, n->row_loss,
                               n->row_correct, n->bad_row));
    CK(kg_reduce_rows(n->st, n->row_loss, n->row_correct, n->B, n->loss));
    return 0;
}

/* zero_grad, then the backward of the last forward into dW, db. */
static int backward(net *n) {
    const float one = 1.0f;
    const int L = n->nl - 1, C = n->w[L];
    for (int l = 0; l < L; l++) {
        CK(cudaMemsetAsync(n->dW[l], 0, (size_t)n->w[l + 1] * n->w[l] * sizeof(float), n->st));
        CK(cudaMemsetAsync(n->db[l], 0, (size_t)n->w[l + 1] * sizeof(float), n->st));
    }
    float *dy = n->ga, *dx = n->gb;
    CK(kg_softmax_xent_backward(n->st, KG_F32, dy, n->probs, n->labels, n->B, C, 1.0));
    for (int l = L - 1; l >= 0; l--) {
        const float *xin = l == 0 ? n->x : n->post[l - 1];
        gemm *g = &n->wgrad[l]; /* dW += dy^T x */
        CB(cublasLtMatmul(n->lt, g->p.desc, &one, xin, g->p.la, dy, g->p.lb, &g->beta, n->dW[l], g->p.lc, n->dW[l],
                          g->p.lc, &g->p.algo, n->ws, n->ws_bytes, n->st));
        CK(kg_bias_grad(n->st, KG_F32, n->db[l], dy, n->B, n->w[l + 1], 1, n->bg_work));
        if (l > 0) { /* dx = dy W, then relu' */
            gemm *h = &n->xgrad[l];
            CB(cublasLtMatmul(n->lt, h->p.desc, &one, n->W[l], h->p.la, dy, h->p.lb, &h->beta, dx, h->p.lc, dx,
                              h->p.lc, &h->p.algo, n->ws, n->ws_bytes, n->st));
            CK(kg_act_backward(n->st, KG_F32, KG_ACT_RELU, dx, dx, n->pre[l - 1], (size_t)n->B * n->w[l]));
            float *t = dy;
            dy = dx;
            dx = t;
        }
    }
    return 0;
}

/* One training step: forward, backward, SGD. Nothing waits. */
static int step(net *n) {
    if (forward(n) || backward(n)) return 1;
    for (int l = 0; l < n->nl - 1; l++) {
        CK(kg_sgd_update(n->st, KG_F32, n->W[l], n->dW[l], NULL, (size_t)n->w[l + 1] * n->w[l], 0.01, 0.0, 0.0, 0,
                         0.0, 0, NULL, KG_F32));
        CK(kg_sgd_update(n->st, KG_F32, n->b[l], n->db[l], NULL, (size_t)n->w[l + 1], 0.01, 0.0, 0.0, 0, 0.0, 0,
                         NULL, KG_F32));
    }
    return 0;
}

/* The loss of the current weights, waited for. */
static int loss_now(net *n, double *loss) {
    if (forward(n)) return 1;
    double v[2];
    CK(cudaMemcpyAsync(v, n->loss, sizeof v, cudaMemcpyDeviceToHost, n->st));
    CK(cudaStreamSynchronize(n->st));
    *loss = v[0];
    return 0;
}

/* One weight set from the host, ordered on the step's stream. A plain
 * cudaMemcpy runs on the legacy default stream, which does not wait for a
 * cudaStreamNonBlocking stream nor it for it, and from pageable memory it
 * may return before the value has landed: the next forward could read the
 * old weight, and the check below would report a gradient that is not
 * wrong. Waited for, so the host value can go. */
static int set_weight(net *n, float *at, float value) {
    CK(cudaMemcpyAsync(at, &value, sizeof value, cudaMemcpyHostToDevice, n->st));
    CK(cudaStreamSynchronize(n->st));
    return 0;
}

/* The step's gradients against central differences of its loss, at a few
 * entries of every weight and bias (fp32 loss, h = 1e-3: the loss's
 * rounding adds about 1e-4, and a step that small rarely moves a ReLU input
 * across 0; agreement to 1e-3 absolute). A wrong operand, transpose or missing kernel in the step
 * shows here long before it would in the loss curve. */
static int check_gradients(net *n, int *bad) {
    const double h = 1e-3;
    *bad = 0;
    if (forward(n) || backward(n)) return 1;
    CK(cudaStreamSynchronize(n->st));
    for (int l = 0; l < n->nl - 1; l++)
        for (int which = 0; which < 2; which++) {
            float *p = which ? n->b[l] : n->W[l], *g = which ? n->db[l] : n->dW[l];
            const size_t cnt = which ? (size_t)n->w[l + 1] : (size_t)n->w[l + 1] * n->w[l];
            const size_t at[3] = {0, cnt / 2, cnt - 1};
            for (int k = 0; k < 3; k++) {
                float v, grad;
                CK(cudaMemcpyAsync(&v, p + at[k], sizeof v, cudaMemcpyDeviceToHost, n->st));
                CK(cudaMemcpyAsync(&grad, g + at[k], sizeof grad, cudaMemcpyDeviceToHost, n->st));
                CK(cudaStreamSynchronize(n->st));
                double lp, lm;
                if (set_weight(n, p + at[k], (float)(v + h)) || loss_now(n, &lp)) return 1;
                if (set_weight(n, p + at[k], (float)(v - h)) || loss_now(n, &lm)) return 1;
                if (set_weight(n, p + at[k], v)) return 1;
                const double fd = (lp - lm) / (2 * h);
                if (!(fabs(fd - grad) <= 1e-3 + 0.05 * fabs(fd))) {
                    fprintf(stderr, BLT_ME ": layer %d %s[%zu]: gradient %.6g, central difference %.6g\n", l,
                            which ? "b" : "W", at[k], (double)grad, fd);
                    (*bad)++;
                }
            }
        }
    return 0;
}

/* count uniform values in [-scale, scale), copied on stream st (the
 * step's: see set_weight) and waited for before the host buffer goes. */
static float *dev_uniform(cudaStream_t st, size_t count, float scale, unsigned *seed) {
    float *h = malloc(count * sizeof *h), *d = NULL;
    if (!h) return NULL;
    for (size_t i = 0; i < count; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        h[i] = scale * ((float)(*seed >> 8) / 8388608.0f - 1.0f);
    }
    if (cudaMalloc((void **)&d, count * sizeof *d) != cudaSuccess ||
        cudaMemcpyAsync(d, h, count * sizeof *d, cudaMemcpyHostToDevice, st) != cudaSuccess ||
        cudaStreamSynchronize(st) != cudaSuccess)
        d = NULL;
    free(h);
    return d;
}

/* A zeroed device buffer; the memset is queued on the step's stream, so
 * every later use on that stream follows it (net_make waits once at the
 * end anyway). */
#define DEV(ptr, count)                                                                            \
    do {                                                                                           \
        CK(cudaMalloc((void **)&(ptr), (size_t)(count) * sizeof *(ptr)));                          \
        CK(cudaMemsetAsync((ptr), 0, (size_t)(count) * sizeof *(ptr), n->st));                     \
    } while (0)

static int net_make(net *n) {
    unsigned seed = 12345u;
    const int L = n->nl - 1;
    int maxw = 0;
    for (int l = 0; l < n->nl; l++) maxw = n->w[l] > maxw ? n->w[l] : maxw;
    CB(cublasLtCreate(&n->lt));
    n->ws_bytes = (size_t)32 << 20;
    CK(cudaMalloc(&n->ws, n->ws_bytes));
    CK(cudaStreamCreateWithFlags(&n->st, cudaStreamNonBlocking));
    for (int l = 0; l < L; l++) {
        const int in = n->w[l], out = n->w[l + 1];
        if (!(n->W[l] = dev_uniform(n->st, (size_t)out * in, 1.0f / sqrtf((float)in), &seed))) return 1;
        if (!(n->b[l] = dev_uniform(n->st, (size_t)out, 0.01f, &seed))) return 1;
        DEV(n->dW[l], (size_t)out * in);
        DEV(n->db[l], out);
        DEV(n->pre[l], (size_t)n->B * out);
        DEV(n->post[l], (size_t)n->B * out);
        if (gemm_make(n->lt, &n->fwd[l], 0, 1, n->B, out, in, 0.0f, n->b[l], n->ws_bytes)) return 1;
        if (gemm_make(n->lt, &n->wgrad[l], 1, 0, out, in, n->B, 1.0f, NULL, n->ws_bytes)) return 1;
        if (l > 0 && gemm_make(n->lt, &n->xgrad[l], 0, 0, n->B, in, out, 0.0f, NULL, n->ws_bytes)) return 1;
    }
    DEV(n->x, (size_t)n->B * n->w[0]);
    DEV(n->probs, (size_t)n->B * n->w[L]);
    DEV(n->ga, (size_t)n->B * maxw);
    DEV(n->gb, (size_t)n->B * maxw);
    DEV(n->labels, n->B);
    DEV(n->row_correct, n->B);
    DEV(n->bad_row, 1);
    DEV(n->row_loss, n->B);
    DEV(n->loss, 2);
    size_t bg = 0; /* the largest bias_grad workspace of the layers */
    for (int l = 0; l < L; l++) {
        const size_t b = kg_bias_grad_work_bytes(KG_F32, n->B, n->w[l + 1]);
        bg = b > bg ? b : bg;
    }
    if (bg > 0) CK(cudaMalloc(&n->bg_work, bg));
    CK(cudaHostAlloc((void **)&n->host_x, (size_t)n->B * n->w[0] * sizeof(float), cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&n->host_labels, (size_t)n->B * sizeof(int32_t), cudaHostAllocDefault));
    for (int i = 0; i < n->B * n->w[0]; i++) n->host_x[i] = (float)((i * 7919) % 255) / 255.0f;
    for (int i = 0; i < n->B; i++) n->host_labels[i] = i % n->w[L];
    CK(cudaStreamSynchronize(n->st)); /* the memsets above, before anything else reads */
    return 0;
}

static void gemm_free(gemm *g) {
    if (!g->p.desc) return;
    cublasLtMatrixLayoutDestroy(g->p.la);
    cublasLtMatrixLayoutDestroy(g->p.lb);
    cublasLtMatrixLayoutDestroy(g->p.lc);
    cublasLtMatmulDescDestroy(g->p.desc);
}

/* Everything net_make made (a clean exit, so sanitizers see no leaks). */
static void net_free(net *n) {
    if (n->st) cudaStreamSynchronize(n->st); /* nothing queued may outlive its buffers */
    for (int l = 0; l < n->nl - 1; l++) {
        cudaFree(n->W[l]), cudaFree(n->b[l]), cudaFree(n->dW[l]), cudaFree(n->db[l]);
        cudaFree(n->pre[l]), cudaFree(n->post[l]);
        gemm_free(&n->fwd[l]), gemm_free(&n->wgrad[l]), gemm_free(&n->xgrad[l]);
    }
    cudaFree(n->x), cudaFree(n->probs), cudaFree(n->ga), cudaFree(n->gb), cudaFree(n->labels);
    cudaFree(n->row_correct), cudaFree(n->bad_row), cudaFree(n->row_loss), cudaFree(n->loss), cudaFree(n->ws);
    cudaFree(n->bg_work);
    cudaFreeHost(n->host_x), cudaFreeHost(n->host_labels);
    if (n->st) cudaStreamDestroy(n->st);
    if (n->lt) cublasLtDestroy(n->lt);
}

static int cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *layers_s = "784,32,10";
    int reps = 2000, eager_only = 0;
    net n;
    memset(&n, 0, sizeof n);
    n.B = 128;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers_s = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) n.B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--eager-only")) eager_only = 1;
        else {
            fprintf(stderr, "usage: " BLT_ME " [--layers a,b,..] [--batch B] [--reps N] [--eager-only]\n");
            return 2;
        }
    }
    for (const char *p = layers_s; *p && n.nl < MAXL;) {
        n.w[n.nl++] = atoi(p);
        if (!(p = strchr(p, ','))) break;
        p++;
    }
    if (n.nl < 2 || n.B < 1 || reps < 10) {
        fprintf(stderr, BLT_ME ": need 2..%d layer widths, batch >= 1, reps >= 10\n", MAXL);
        return 2;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    if (net_make(&n)) return 1;

    /* the step's gradients first: a wrong step must not be timed */
    int bad = 0;
    if (check_gradients(&n, &bad)) return 1;
    if (bad) {
        fprintf(stderr, BLT_ME ": %d gradient entries disagree with central differences: the step is wrong\n", bad);
        return 1;
    }
    /* warm-up, and the loss must fall (the step really trains) */
    double loss0[2], loss1[2];
    if (step(&n)) return 1;
    CK(cudaMemcpyAsync(loss0, n.loss, sizeof loss0, cudaMemcpyDeviceToHost, n.st));
    CK(cudaStreamSynchronize(n.st));
    for (int i = 0; i < 50; i++)
        if (step(&n)) return 1;

    /* eager: issue `reps` steps, then wait once (best of 3 rounds) */
    double eager_wall = 1e30, eager_host = 1e30;
    for (int round = 0; round < 3; round++) {
        CK(cudaStreamSynchronize(n.st));
        const double t0 = now();
        for (int i = 0; i < reps; i++)
            if (step(&n)) return 1;
        const double t1 = now();
        CK(cudaStreamSynchronize(n.st));
        const double t2 = now();
        if ((t2 - t0) / reps < eager_wall) eager_wall = (t2 - t0) / reps, eager_host = (t1 - t0) / reps;
    }

    if (eager_only) { /* no graph (the fake CUDA runtime of tests/cuda_fake cannot record one) */
        CK(cudaMemcpyAsync(loss1, n.loss, sizeof loss1, cudaMemcpyDeviceToHost, n.st));
        CK(cudaStreamSynchronize(n.st));
        if (!(isfinite(loss1[0]) && loss1[0] < loss0[0])) {
            fprintf(stderr, BLT_ME ": the loss did not fall (%g -> %g): the step is wrong\n", loss0[0], loss1[0]);
            return 1;
        }
        printf("RESULT {\"device\": \"%s\", \"layers\": \"%s\", \"batch\": %d, \"loss_first\": %.4f, "
               "\"loss_last\": %.4f, \"eager_step_us\": %.2f, \"eager_host_us\": %.2f}\n",
               prop.name, layers_s, n.B, loss0[0], loss1[0], eager_wall * 1e6, eager_host * 1e6);
        net_free(&n);
        return 0;
    }

    /* graph: capture one step, replay it */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(n.st, cudaStreamCaptureModeThreadLocal));
    if (step(&n)) return 1;
    CK(cudaStreamEndCapture(n.st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    size_t nodes = 0;
    CK(cudaGraphGetNodes(graph, NULL, &nodes));
    for (int i = 0; i < 50; i++) CK(cudaGraphLaunch(exec, n.st));
    double graph_wall = 1e30, graph_host = 1e30;
    for (int round = 0; round < 3; round++) {
        CK(cudaStreamSynchronize(n.st));
        const double t0 = now();
        for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(exec, n.st));
        const double t1 = now();
        CK(cudaStreamSynchronize(n.st));
        const double t2 = now();
        if ((t2 - t0) / reps < graph_wall) graph_wall = (t2 - t0) / reps, graph_host = (t1 - t0) / reps;
    }
    /* GPU time of one step: events around single replays (median of 101) */
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double gpu[101];
    for (int i = 0; i < 101; i++) {
        CK(cudaEventRecord(e0, n.st));
        CK(cudaGraphLaunch(exec, n.st));
        CK(cudaEventRecord(e1, n.st));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        gpu[i] = ms * 1e-3;
    }
    qsort(gpu, 101, sizeof gpu[0], cmpd);
    CK(cudaMemcpyAsync(loss1, n.loss, sizeof loss1, cudaMemcpyDeviceToHost, n.st));
    CK(cudaStreamSynchronize(n.st));
    if (!(isfinite(loss1[0]) && loss1[0] < loss0[0])) {
        fprintf(stderr, BLT_ME ": the loss did not fall (%g -> %g): the step is wrong\n", loss0[0], loss1[0]);
        return 1;
    }
    const double g = gpu[50];
    printf("RESULT {\"device\": \"%s\", \"layers\": \"%s\", \"batch\": %d, \"graph_nodes\": %zu, "
           "\"loss_first\": %.4f, \"loss_last\": %.4f, \"gpu_step_us\": %.2f, "
           "\"eager_step_us\": %.2f, \"eager_host_us\": %.2f, \"eager_overhead_us\": %.2f, "
           "\"graph_step_us\": %.2f, \"graph_host_us\": %.2f, \"graph_overhead_us\": %.2f}\n",
           prop.name, layers_s, n.B, nodes, loss0[0], loss1[0], g * 1e6, eager_wall * 1e6, eager_host * 1e6,
           (eager_wall - g) * 1e6, graph_wall * 1e6, graph_host * 1e6, (graph_wall - g) * 1e6);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    net_free(&n);
    return 0;
}
