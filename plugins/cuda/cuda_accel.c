/*
 * cuda_accel.c — the "cuda" accelerator plugin: the kiln_kernels table on an
 * NVIDIA GPU. Memory is device memory (the table does not set
 * KILN_KERNELS_HOST_MEMORY, so modules copy batches in and the host copies
 * weights out for checkpoints); every entry queues its work on the
 * instance's one stream and returns without waiting, except those that hand
 * a value back to the host (sum, sumsq, sumsq_many, all_finite, the loss),
 * which wait for it (counted: host_waits). GEMMs go through cuBLASLt
 * (cuda_blas.c), everything else through the kernels of kernels/cuda, whose
 * CPU references are kernels/cpu. The checks
 * here mirror the cpu accelerator's so that a bad call gets the same kind of
 * message on either; a failing CUDA or cuBLAS call becomes KILN_E_CUDA with
 * the call's name and the runtime's error string. The plugin refuses to
 * start (create) when the driver is missing or older than the CUDA runtime
 * it was built with, naming both versions, and when no device is visible;
 * the device is chosen in configure() from the `device` setting or the
 * process's local rank, so one process per GPU needs no configuration.
 * This file is the implementation library (kiln-cuda-impl.so), which the
 * plugin proper (cuda_plugin.c, libkiln-cuda.so) loads when a run asks for
 * the accelerator; the descriptor and its settings are there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_impl.h"
#include "cuda_internal.h"

static_assert((int)KG_F32 == (int)KILN_DTYPE_F32 && (int)KG_F64 == (int)KILN_DTYPE_F64 &&
                  (int)KG_F16 == (int)KILN_DTYPE_F16 && (int)KG_BF16 == (int)KILN_DTYPE_BF16 &&
                  (int)KG_F8E4M3 == (int)KILN_DTYPE_F8E4M3 && (int)KG_F8E5M2 == (int)KILN_DTYPE_F8E5M2,
              "kernels/cuda dtype numbers must equal KILN_DTYPE_*");
static_assert((int)KG_ACT_RELU == (int)KILN_ACT_RELU && (int)KG_ACT_GELU == (int)KILN_ACT_GELU &&
                  (int)KG_ACT_TANH == (int)KILN_ACT_TANH && (int)KG_ACT_SIGMOID == (int)KILN_ACT_SIGMOID &&
                  (int)KG_ACT_LEAKY_RELU == (int)KILN_ACT_LEAKY_RELU,
              "kernels/cuda activation numbers must equal KILN_ACT_*");

static int cu_anydt(uint32_t dt) { return cu_fdt(dt) || dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16; }

/* ---------------------------------------------------------------- GEMMs */

static int32_t cu_check_ld(kiln_instance *acc, const char *fn, char what, int32_t ld, int32_t cols) {
    const int32_t need = cols > 1 ? cols : 1;
    if (ld < need)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: ld%c=%d is smaller than max(1, stored columns of %c) = %d",
                      fn, what + ('a' - 'A'), (int)ld, what, (int)need);
    return KILN_OK;
}

static int32_t cu_check_gemm(kiln_instance *acc, const char *fn, int32_t ta, int32_t tb, int32_t M, int32_t N,
                             int32_t K, int32_t lda, int32_t ldb, int32_t ldc, const void *A, const void *B,
                             const void *C) {
    if (M < 0 || N < 0 || K < 0)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: M, N, K must be >= 0, got M=%d N=%d K=%d", fn, (int)M,
                      (int)N, (int)K);
    int32_t rc;
    if ((rc = cu_check_ld(acc, fn, 'A', lda, ta ? M : K)) != KILN_OK) return rc;
    if ((rc = cu_check_ld(acc, fn, 'B', ldb, tb ? K : N)) != KILN_OK) return rc;
    if ((rc = cu_check_ld(acc, fn, 'C', ldc, N)) != KILN_OK) return rc;
    if (M > 0 && N > 0 && (!C || (K > 0 && (!A || !B))))
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: NULL %s for M=%d N=%d K=%d", fn,
                      !C ? "C" : !A ? "A" : "B", (int)M, (int)N, (int)K);
    CU_READY(acc, fn);
    return KILN_OK;
}

static int32_t cu_gemm(kiln_instance *acc, int32_t ta, int32_t tb, int32_t M, int32_t N, int32_t K, float alpha,
                       const float *A, int32_t lda, const float *B, int32_t ldb, float beta, float *C, int32_t ldc) {
    int32_t rc = cu_check_gemm(acc, "gemm", ta, tb, M, N, K, lda, ldb, ldc, A, B, C);
    if (rc != KILN_OK) return rc;
    return cu_matmul(acc, "gemm", ta != 0, tb != 0, M, N, K, alpha, A, KILN_DTYPE_F32, lda, B, KILN_DTYPE_F32, ldb,
                     beta, C, KILN_DTYPE_F32, ldc);
}

/* Elements a strided operand spans: rows of ld, the last one only `cols`. */
static size_t cu_span(int32_t rows, int32_t cols, int32_t ld) {
    return rows > 0 && cols > 0 ? (size_t)(rows - 1) * (size_t)ld + (size_t)cols : 0;
}


/* gemm_ex into a float16 / bfloat16 C (ABI 1.6; the checks passed): float32
 * operands converted to C's dtype (autocast's operand cast), then one
 * 16-bit matmul whose fp32 result cuBLASLt rounds as it stores it (K == 0:
 * C = beta * C, rounded, by cu_matmul's own path). */
static int32_t cu_gemm_ex_c16(kiln_instance *acc, int32_t ta, int32_t tb, int32_t M, int32_t N, int32_t K,
                              double alpha, const void *A, uint32_t at, int32_t lda, const void *B, uint32_t bt,
                              int32_t ldb, double beta, void *C, uint32_t ct, int32_t ldc) {
    const size_t na = cu_span(ta ? K : M, ta ? M : K, lda), nb = cu_span(tb ? N : K, tb ? K : N, ldb);
    const void *a = NULL, *b = NULL;
    int32_t rc = cu_gemm_operands(acc, "gemm_ex", ct, ct, A, at, na, B, bt, nb, 0, &a, &b, NULL);
    if (rc != KILN_OK) return rc;
    return cu_matmul(acc, "gemm_ex", ta != 0, tb != 0, M, N, K, alpha, a, ct, lda, b, ct, ldb, beta, C, ct, ldc);
}

/*
 * gemm_ex. The tensor cores multiply two operands of one type, so:
 *  - A and B of one dtype go straight to cuBLASLt (fp16/bf16 with fp32
 *    accumulation, fp32, fp64);
 *  - the call is autocast's matmul: float32 operands are rounded to its
 *    16-bit dtype (a 16-bit round_dtype, else the 16-bit operand's) by
 *    converting them to it, and the product runs on the tensor cores. The
 *    conversion is exact for operands the caller rounded already (kiln/nn.h
 *    rounds every activation through the compute dtype, as autocast
 *    stores them). Two different 16-bit operands are widened to float32
 *    (exact) and the product runs in fp32, as do two float32 operands with
 *    round_dtype F32 (TF32 with tf32 = true);
 *  - with round_dtype F16/BF16 the product is rounded before beta*C is
 *    added (the contract). A 16-bit product is written by cuBLASLt in
 *    that dtype (its conversion is the rounding) to scratch, and one pass
 *    widens it into C, adding beta*C: 2 + 2 + 4 bytes per element (+4 to
 *    read C) instead of an fp32 product's 4 + 4 + 4 (+4). A float32
 *    product (two different 16-bit operands) is rounded by that pass, or in
 *    place when beta == 0 and C is packed.
 */
static int32_t cu_gemm_ex(kiln_instance *acc, int32_t ta, int32_t tb, int32_t M, int32_t N, int32_t K, double alpha,
                          const void *A, uint32_t at, int32_t lda, const void *B, uint32_t bt, int32_t ldb,
                          double beta, void *C, uint32_t ct, int32_t ldc, uint32_t rt) {
    int32_t rc = ack_gemm_ex_dtypes(CU_SINK(acc), at, bt, ct, rt);
    if (rc != KILN_OK) return rc;
    rc = cu_check_gemm(acc, "gemm_ex", ta, tb, M, N, K, lda, ldb, ldc, A, B, C);
    if (rc != KILN_OK || M == 0 || N == 0) return rc;
    if (cu_is16(ct)) return cu_gemm_ex_c16(acc, ta, tb, M, N, K, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc);

    const uint32_t op = cu_product_dtype(at, bt, rt);
    const int rounding = ct == KILN_DTYPE_F32 && rt != KILN_DTYPE_F32;
    /* A 16-bit product (op == rt) is rounded by cuBLASLt as it stores it,
     * into 16-bit scratch, and widened into C by one pass; a float32 one
     * (two different 16-bit operands) is rounded by that pass, or in place
     * when beta == 0 and C is packed. */
    const int store16 = rounding && op == rt;
    const int in_place = rounding && !store16 && beta == 0.0 && ldc == N;
    const size_t na = cu_span(ta ? K : M, ta ? M : K, lda), nb = cu_span(tb ? N : K, tb ? K : N, ldb);
    const uint32_t pt = store16 ? rt : KILN_DTYPE_F32; /* the scratch product's dtype */
    const size_t bytes_p = rounding && !in_place ? cu_up256((size_t)M * (size_t)N * kiln_dtype_size(pt)) : 0;
    const void *a = NULL, *b = NULL;
    void *scratch = NULL; /* (M, N) packed product, when rounded out of place */
    const uint32_t ort = (uint32_t)km_gemm_round_dtype((int)at, (int)bt, (int)rt);
    if ((rc = cu_gemm_operands(acc, "gemm_ex", op, ort, A, at, na, B, bt, nb, bytes_p, &a, &b, &scratch)) != KILN_OK)
        return rc;
    if (!rounding)
        return cu_matmul(acc, "gemm_ex", ta != 0, tb != 0, M, N, K, alpha, a, op, lda, b, op, ldb, beta, C, ct, ldc);
    if (in_place) {
        rc = cu_matmul(acc, "gemm_ex", ta != 0, tb != 0, M, N, K, alpha, a, op, lda, b, op, ldb, 0.0, C, ct, ldc);
        if (rc != KILN_OK) return rc;
        CU_LAUNCH(acc, "gemm_ex (rounding)", kg_round_to(acc->stream, C, (int)rt, (size_t)M * (size_t)N));
        return KILN_OK;
    }
    rc = cu_matmul(acc, "gemm_ex", ta != 0, tb != 0, M, N, K, alpha, a, op, lda, b, op, ldb, 0.0, scratch, pt, N);
    if (rc != KILN_OK) return rc;
    CU_LAUNCH(acc, "gemm_ex (rounding)",
              kg_round_add(acc->stream, C, ldc, scratch, (int)pt, M, N, (int)rt, (float)beta));
    return KILN_OK;
}

/* --------------------------------------------------- bias and activations */

/* The bias entries' first checks: the dtype, then rows, cols >= 0.
 * act16: the entry takes 1.7's 16-bit activation storage too (bias_grad's
 * dy; db stays float32). */
static int32_t cu_bias_dims(kiln_instance *acc, const char *fn, uint32_t dt, int32_t rows, int32_t cols, int act16) {
    int32_t rc = act16 ? ack_act_dtype(CU_SINK(acc), fn, dt) : cu_check_fdt(acc, fn, dt);
    if (rc != KILN_OK) return rc;
    if (rows < 0 || cols < 0)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: rows and cols must be >= 0, got %d and %d", fn, (int)rows,
                      (int)cols);
    return KILN_OK;
}

/* The activation entries' first checks: the dtype, then act a KILN_ACT_*.
 * act16 as for cu_bias_dims (act_backward: dx, dy and x all 16-bit). */
static int32_t cu_act_kind(kiln_instance *acc, const char *fn, uint32_t dt, int32_t act, int act16) {
    int32_t rc = act16 ? ack_act_dtype(CU_SINK(acc), fn, dt) : cu_check_fdt(acc, fn, dt);
    if (rc != KILN_OK) return rc;
    if (act < KILN_ACT_RELU || act > KILN_ACT_LEAKY_RELU)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: act must be a KILN_ACT_* (0..4), got %d", fn, (int)act);
    return KILN_OK;
}

static int32_t cu_bias_add_ex(kiln_instance *acc, uint32_t dt, void *y, const void *b, int32_t rows, int32_t cols) {
    int32_t rc = cu_bias_dims(acc, "bias_add", dt, rows, cols, 0);
    if (rc != KILN_OK) return rc;
    const size_t n = (size_t)rows * (size_t)cols;
    CU_NEED(acc, y, n, "bias_add");
    CU_NEED(acc, b, cols, "bias_add");
    if (n == 0) return KILN_OK;
    CU_READY(acc, "bias_add");
    CU_LAUNCH(acc, "bias_add", kg_bias_add(acc->stream, (int)dt, y, b, rows, cols));
    return KILN_OK;
}
static int32_t cu_bias_add(kiln_instance *acc, float *y, const float *b, int32_t rows, int32_t cols) {
    return cu_bias_add_ex(acc, KILN_DTYPE_F32, y, b, rows, cols);
}

static int32_t cu_bias_grad_ex(kiln_instance *acc, uint32_t dt, void *db, const void *dy, int32_t rows, int32_t cols,
                               int32_t accumulate) {
    int32_t rc = cu_bias_dims(acc, "bias_grad", dt, rows, cols, 1);
    if (rc != KILN_OK) return rc;
    CU_NEED(acc, db, cols, "bias_grad");
    CU_NEED(acc, dy, (size_t)rows * (size_t)cols, "bias_grad");
    /* 16-bit dy (1.7): db and the partials float32, the kernel widens dy as it reads it */
    if (cols == 0) return KILN_OK;
    CU_READY(acc, "bias_grad");
    /* the two-pass sum's partials, (parts, cols), in the grow-only gemm
     * scratch: no GEMM runs inside this entry, and the stream orders the
     * next user after these kernels */
    const size_t wb = kg_bias_grad_work_bytes((int)dt, rows, cols);
    if (wb > 0 && (rc = cu_reserve(acc, &acc->ws, &acc->ws_bytes, wb, "bias_grad")) != KILN_OK) return rc;
    CU_LAUNCH(acc, "bias_grad",
              kg_bias_grad(acc->stream, (int)dt, db, dy, rows, cols, accumulate != 0, wb > 0 ? acc->ws : NULL));
    return KILN_OK;
}
static int32_t cu_bias_grad(kiln_instance *acc, float *db, const float *dy, int32_t rows, int32_t cols,
                            int32_t accumulate) {
    return cu_bias_grad_ex(acc, KILN_DTYPE_F32, db, dy, rows, cols, accumulate);
}

static int32_t cu_act_forward(kiln_instance *acc, uint32_t dt, int32_t act, void *y, const void *x, size_t n) {
    int32_t rc = cu_act_kind(acc, "act_forward", dt, act, 0);
    if (rc != KILN_OK) return rc;
    CU_NEED(acc, y, n, "act_forward");
    CU_NEED(acc, x, n, "act_forward");
    if (n == 0) return KILN_OK;
    CU_READY(acc, "act_forward");
    CU_LAUNCH(acc, "act_forward", kg_act_forward(acc->stream, (int)dt, act, y, x, n));
    return KILN_OK;
}
static int32_t cu_act_backward(kiln_instance *acc, uint32_t dt, int32_t act, void *dx, const void *dy, const void *x,
                               size_t n) {
    int32_t rc = cu_act_kind(acc, "act_backward", dt, act, 1);
    if (rc != KILN_OK) return rc;
    CU_NEED(acc, dx, n, "act_backward");
    CU_NEED(acc, dy, n, "act_backward");
    CU_NEED(acc, x, n, "act_backward");
    if (n == 0) return KILN_OK;
    CU_READY(acc, "act_backward");
    CU_LAUNCH(acc, "act_backward", kg_act_backward(acc->stream, (int)dt, act, dx, dy, x, n));
    return KILN_OK;
}
/* 1.11: the activation's backward inside the bias sum's first pass (one
 * kernel instead of two, and dx not read back), checked as both. */
static int32_t cu_act_bias_backward(kiln_instance *acc, uint32_t dt, int32_t act, void *dx, void *db, const void *dy,
                                    const void *x, int32_t rows, int32_t cols, int32_t accumulate) {
    const char *fn = "act_bias_backward";
    int go = 0;
    int32_t rc = ack_act_bias_backward(CU_SINK(acc), fn, dt, act, dx, db, dy, x, rows, cols, accumulate, &go);
    if (rc != KILN_OK || !go) return rc;
    CU_READY(acc, fn);
    /* the partials as bias_grad's (gemm scratch, grow-only) */
    const size_t wb = db ? kg_bias_grad_work_bytes((int)dt, rows, cols) : 0;
    if (wb > 0 && (rc = cu_reserve(acc, &acc->ws, &acc->ws_bytes, wb, fn)) != KILN_OK) return rc;
    CU_LAUNCH(acc, fn,
              kg_act_bias_backward(acc->stream, (int)dt, act, dx, db, dy, x, rows, cols, accumulate != 0,
                                   wb > 0 ? acc->ws : NULL));
    return KILN_OK;
}
static int32_t cu_relu_forward(kiln_instance *acc, float *y, const float *x, size_t n) {
    return cu_act_forward(acc, KILN_DTYPE_F32, KILN_ACT_RELU, y, x, n);
}
static int32_t cu_relu_backward(kiln_instance *acc, float *dx, const float *dy, const float *x, size_t n) {
    return cu_act_backward(acc, KILN_DTYPE_F32, KILN_ACT_RELU, dx, dy, x, n);
}
static int32_t cu_gelu_forward(kiln_instance *acc, float *y, const float *x, size_t n) {
    return cu_act_forward(acc, KILN_DTYPE_F32, KILN_ACT_GELU, y, x, n);
}
static int32_t cu_gelu_backward(kiln_instance *acc, float *dx, const float *dy, const float *x, size_t n) {
    return cu_act_backward(acc, KILN_DTYPE_F32, KILN_ACT_GELU, dx, dy, x, n);
}

/* ------------------------------------------------------------------ loss */

/* a: probs (forward) or dlogits (backward); b: logits or probs. */
static int32_t cu_xent_args(kiln_instance *acc, const char *fn, int backward, uint32_t dt, const void *a,
                            const void *b, const int32_t *labels, int32_t B, int32_t C) {
    int32_t rc = cu_check_fdt(acc, fn, dt);
    if (rc != KILN_OK) return rc;
    if (B < 1 || C < 1)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: B and C must be >= 1, got B=%d C=%d", fn, (int)B, (int)C);
    if (!a || !b || !labels) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: NULL tensor argument", fn);
    if ((rc = ack_xent_buffers(CU_SINK(acc), fn, backward, a, b, B, C, kiln_dtype_size(dt))) != KILN_OK) return rc;
    CU_READY(acc, fn);
    return KILN_OK;
}

/* Reads back the first bad label's row (device int, -1 when none) and, if
 * there is one, the label itself, for the same message the cpu gives. */
static int32_t cu_bad_label(kiln_instance *acc, const char *fn, const int32_t *bad_row_dev, const int32_t *labels,
                            int32_t B, int32_t C) {
    int32_t row = -1, label = 0;
    CU_CHECK(acc, fn, cudaMemcpyAsync(&row, bad_row_dev, sizeof row, cudaMemcpyDeviceToHost, acc->stream));
    CU_CHECK(acc, fn, cu_wait(acc));
    if (row < 0) return KILN_OK;
    CU_CHECK(acc, fn, cudaMemcpy(&label, labels + row, sizeof label, cudaMemcpyDeviceToHost));
    return CU_ERR(acc, KILN_E_DATA, "cuda: %s: label %d at batch index %d is outside [0, %d) (B=%d, C=%d)", fn,
                  (int)label, (int)row, (int)C, (int)B, (int)C);
}

/* Row scratch: row_loss (B doubles), row_correct (B ints), bad_row (1 int). */
static int32_t cu_rows(kiln_instance *acc, int32_t B, double **loss, int32_t **correct, int32_t **bad) {
    const size_t lb = cu_up256((size_t)B * sizeof(double)), cb = cu_up256((size_t)B * sizeof(int32_t));
    int32_t rc = cu_reserve(acc, &acc->row_scratch, &acc->row_scratch_bytes, lb + cb + 256, "softmax_xent");
    if (rc != KILN_OK) return rc;
    char *base = acc->row_scratch;
    *loss = (double *)base;
    *correct = (int32_t *)(base + lb);
    *bad = (int32_t *)(base + lb + cb);
    CU_CHECK(acc, "softmax_xent", cudaMemsetAsync(*bad, 0xff, sizeof(int32_t), acc->stream)); /* -1 */
    return KILN_OK;
}

static int32_t cu_xent_forward(kiln_instance *acc, uint32_t dt, void *probs, const void *logits,
                               const int32_t *labels, int32_t B, int32_t C, double *loss, int32_t *n_correct) {
    int32_t rc = cu_xent_args(acc, "softmax_xent_forward", 0, dt, probs, logits, labels, B, C);
    if (rc != KILN_OK) return rc;
    if (!loss) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: softmax_xent_forward: loss is NULL");
    double *row_loss = NULL;
    int32_t *row_correct = NULL, *bad = NULL;
    if ((rc = cu_rows(acc, B, &row_loss, &row_correct, &bad)) != KILN_OK) return rc;
    CU_LAUNCH(acc, "softmax_xent_forward",
              kg_softmax_xent_forward(acc->stream, (int)dt, probs, logits, labels, B, C, row_loss, row_correct, bad));
    double *out = acc->red_scratch + KG_REDUCE_BLOCKS; /* (2) mean loss, correct count */
    CU_LAUNCH(acc, "softmax_xent_forward", kg_reduce_rows(acc->stream, row_loss, row_correct, B, out));
    CU_CHECK(acc, "softmax_xent_forward",
             cudaMemcpyAsync(acc->host_scalars, out, 2 * sizeof(double), cudaMemcpyDeviceToHost, acc->stream));
    acc->checked_labels = NULL;
    if ((rc = cu_bad_label(acc, "softmax_xent_forward", bad, labels, B, C)) != KILN_OK) return rc;
    acc->checked_labels = labels, acc->checked_B = B, acc->checked_C = C;
    *loss = acc->host_scalars[0];
    if (n_correct) *n_correct = (int32_t)acc->host_scalars[1];
    return KILN_OK;
}
static int32_t cu_softmax_xent_forward(kiln_instance *acc, float *probs, const float *logits, const int32_t *labels,
                                       int32_t B, int32_t C, float *loss, int32_t *n_correct) {
    double l = 0.0;
    int32_t rc = cu_xent_forward(acc, KILN_DTYPE_F32, probs, logits, labels, B, C, loss ? &l : NULL, n_correct);
    if (rc == KILN_OK) *loss = (float)l;
    return rc;
}
static int32_t cu_softmax_xent_forward_ex(kiln_instance *acc, uint32_t dt, void *probs, const void *logits,
                                          const int32_t *labels, int32_t B, int32_t C, double *loss,
                                          int32_t *n_correct) {
    return cu_xent_forward(acc, dt, probs, logits, labels, B, C, loss, n_correct);
}

/* The labels are checked before the gradient is written (as on the cpu).
 * When the forward just checked these labels and nothing has written them
 * since (see checked_labels), that check stands; otherwise one read-back
 * of B ints, which waits for the stream. */
static int32_t cu_xent_backward(kiln_instance *acc, uint32_t dt, void *dlogits, const void *probs,
                                const int32_t *labels, int32_t B, int32_t C, double dloss) {
    int32_t rc = cu_xent_args(acc, "softmax_xent_backward", 1, dt, dlogits, probs, labels, B, C);
    if (rc != KILN_OK) return rc;
    if (acc->checked_labels == (const void *)labels && B <= acc->checked_B && C >= acc->checked_C) {
        CU_LAUNCH(acc, "softmax_xent_backward",
                  kg_softmax_xent_backward(acc->stream, (int)dt, dlogits, probs, labels, B, C, dloss));
        return KILN_OK;
    }
    if ((size_t)B > acc->host_labels_cap) {
        int32_t *h = realloc(acc->host_labels, (size_t)B * sizeof *h);
        if (!h) return CU_ERR(acc, KILN_E_NOMEM, "cuda: softmax_xent_backward: out of host memory for %d labels", B);
        acc->host_labels = h;
        acc->host_labels_cap = (size_t)B;
    }
    CU_CHECK(acc, "softmax_xent_backward",
             cudaMemcpyAsync(acc->host_labels, labels, (size_t)B * sizeof(int32_t), cudaMemcpyDeviceToHost,
                             acc->stream));
    CU_CHECK(acc, "softmax_xent_backward", cu_wait(acc));
    for (int32_t i = 0; i < B; i++)
        if (acc->host_labels[i] < 0 || acc->host_labels[i] >= C)
            return CU_ERR(acc, KILN_E_DATA,
                          "cuda: softmax_xent_backward: label %d at batch index %d is outside [0, %d) (B=%d, C=%d)",
                          (int)acc->host_labels[i], (int)i, (int)C, (int)B, (int)C);
    CU_LAUNCH(acc, "softmax_xent_backward",
              kg_softmax_xent_backward(acc->stream, (int)dt, dlogits, probs, labels, B, C, dloss));
    return KILN_OK;
}
static int32_t cu_softmax_xent_backward(kiln_instance *acc, float *dlogits, const float *probs,
                                        const int32_t *labels, int32_t B, int32_t C, float dloss) {
    return cu_xent_backward(acc, KILN_DTYPE_F32, dlogits, probs, labels, B, C, dloss);
}
static int32_t cu_softmax_xent_backward_ex(kiln_instance *acc, uint32_t dt, void *dlogits, const void *probs,
                                           const int32_t *labels, int32_t B, int32_t C, double dloss) {
    return cu_xent_backward(acc, dt, dlogits, probs, labels, B, C, dloss);
}

/* ------------------------------------------------------------ reductions */

/* One reduction read back to the host (waits for the stream). */
static int32_t cu_reduce(kiln_instance *acc, const char *fn, int op, uint32_t dt, const void *x, size_t n,
                         double *out) {
    if (!out) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: out is NULL", fn);
    if (!cu_anydt(dt))
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: dtype must be float32, float64, float16 or bfloat16, got %s",
                      fn, kiln_dtype_name(dt));
    if (n > 0 && !x) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: %s: x is NULL for %zu elements", fn, n);
    if (n == 0) {
        *out = 0.0;
        return KILN_OK;
    }
    CU_READY(acc, fn);
    double *res = acc->red_scratch + KG_REDUCE_BLOCKS + 2;
    CU_LAUNCH(acc, fn, kg_reduce(acc->stream, op, (int)dt, x, n, acc->red_scratch, res));
    CU_CHECK(acc, fn, cudaMemcpyAsync(acc->host_scalars + 2, res, sizeof(double), cudaMemcpyDeviceToHost, acc->stream));
    CU_CHECK(acc, fn, cu_wait(acc));
    *out = acc->host_scalars[2];
    return KILN_OK;
}
static int32_t cu_sum(kiln_instance *acc, const float *x, size_t n, double *out) {
    return cu_reduce(acc, "sum", KG_SUM, KILN_DTYPE_F32, x, n, out);
}
static int32_t cu_sumsq(kiln_instance *acc, const float *x, size_t n, double *out) {
    return cu_reduce(acc, "sumsq", KG_SUMSQ, KILN_DTYPE_F32, x, n, out);
}
static int32_t cu_sumsq_ex(kiln_instance *acc, uint32_t dt, const void *x, size_t n, double *out) {
    int32_t rc = cu_check_fdt(acc, "sumsq_ex", dt);
    return rc != KILN_OK ? rc : cu_reduce(acc, "sumsq_ex", KG_SUMSQ, dt, x, n, out);
}
/* 1.9: sumsq_ex per tensor with one wait. kg_reduce_list runs up to
 * KG_LIST_MAX tensors in two launches, each tensor's value the bits
 * cu_reduce's kg_reduce gives it, into slot i of a grow-only device array
 * (after the list's partials); then one copy of the array and one wait. */
static int32_t cu_sumsq_many(kiln_instance *acc, uint32_t dt, const void *const *x, const size_t *n, uint32_t count,
                             double *out) {
    const char *fn = "sumsq_many";
    int32_t rc = cu_check_fdt(acc, fn, dt);
    if (rc == KILN_OK) rc = ack_tensor_list(CU_SINK(acc), fn, x, n, count);
    if (rc != KILN_OK) return rc;
    if (count > 0 && !out)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: sumsq_many: out is NULL for count=%u", (unsigned)count);
    if (count == 0) return KILN_OK;
    CU_READY(acc, fn);
    const size_t np = (size_t)KG_LIST_MAX * KG_REDUCE_BLOCKS; /* one list's partials */
    if ((rc = cu_reserve(acc, &acc->many_dev, &acc->many_dev_bytes, (np + count) * sizeof(double), fn)) != KILN_OK)
        return rc;
    double *partials = acc->many_dev, *res = partials + np;
    kg_list list;
    for (uint32_t i0 = 0; i0 < count; i0 += KG_LIST_MAX) {
        list.count = (int)(count - i0 < KG_LIST_MAX ? count - i0 : KG_LIST_MAX);
        for (int t = 0; t < list.count; t++) list.x[t] = (void *)x[i0 + t], list.n[t] = n[i0 + t];
        CU_LAUNCH(acc, fn, kg_reduce_list(acc->stream, KG_SUMSQ, (int)dt, &list, partials, res + i0));
    }
    CU_CHECK(acc, fn, cudaMemcpyAsync(out, res, (size_t)count * sizeof(double), cudaMemcpyDeviceToHost, acc->stream));
    CU_CHECK(acc, fn, cu_wait(acc));
    return KILN_OK;
}

static int32_t cu_all_finite_ex(kiln_instance *acc, uint32_t dt, const void *x, size_t n, int32_t *finite) {
    if (!finite) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: all_finite: finite is NULL");
    int32_t rc = cu_check_fdt(acc, "all_finite", dt);
    if (rc != KILN_OK) return rc;
    double bad = 0.0;
    if ((rc = cu_reduce(acc, "all_finite", KG_NONFINITE, dt, x, n, &bad)) != KILN_OK) return rc;
    *finite = bad == 0.0;
    return KILN_OK;
}
static int32_t cu_all_finite(kiln_instance *acc, const float *x, size_t n, int32_t *finite) {
    return cu_all_finite_ex(acc, KILN_DTYPE_F32, x, n, finite);
}

static int32_t cu_scale_ex(kiln_instance *acc, uint32_t dt, void *x, double a, size_t n) {
    int32_t rc = cu_check_fdt(acc, "scale", dt);
    if (rc != KILN_OK) return rc;
    CU_NEED(acc, x, n, "scale");
    if (n == 0) return KILN_OK;
    CU_READY(acc, "scale");
    CU_LAUNCH(acc, "scale", kg_scale(acc->stream, (int)dt, x, a, n));
    return KILN_OK;
}
static int32_t cu_scale(kiln_instance *acc, float *x, float a, size_t n) {
    return cu_scale_ex(acc, KILN_DTYPE_F32, x, a, n);
}
static int32_t cu_axpy_ex(kiln_instance *acc, uint32_t dt, void *y, double a, const void *x, size_t n) {
    int32_t rc = cu_check_fdt(acc, "axpy", dt);
    if (rc != KILN_OK) return rc;
    CU_NEED(acc, y, n, "axpy");
    CU_NEED(acc, x, n, "axpy");
    if (n == 0) return KILN_OK;
    CU_READY(acc, "axpy");
    CU_LAUNCH(acc, "axpy", kg_axpy(acc->stream, (int)dt, y, a, x, n));
    return KILN_OK;
}
static int32_t cu_axpy(kiln_instance *acc, float *y, float a, const float *x, size_t n) {
    return cu_axpy_ex(acc, KILN_DTYPE_F32, y, a, x, n);
}

/* ------------------------------------------------------------ optimizers */

static int32_t cu_sgd_update_ex(kiln_instance *acc, uint32_t dt, void *p, const void *g, void *buf, size_t n,
                                double lr, double momentum, double dampening, int32_t nesterov, double wd,
                                int32_t first_step) {
    int32_t rc = cu_check_fdt(acc, "sgd_update", dt);
    if (rc != KILN_OK) return rc;
    CU_NEED(acc, p, n, "sgd_update");
    CU_NEED(acc, g, n, "sgd_update");
    if (momentum != 0.0) CU_NEED(acc, buf, n, "sgd_update");
    if (n == 0) return KILN_OK;
    CU_READY(acc, "sgd_update");
    CU_LAUNCH(acc, "sgd_update",
              kg_sgd_update(acc->stream, (int)dt, p, g, momentum != 0.0 ? buf : NULL, n, lr, momentum, dampening,
                            nesterov != 0, wd, first_step != 0, NULL, KG_F32));
    return KILN_OK;
}
static int32_t cu_sgd_update(kiln_instance *acc, float *p, const float *g, float *buf, size_t n, float lr,
                             float momentum, float dampening, int32_t nesterov, float wd, int32_t first_step) {
    return cu_sgd_update_ex(acc, KILN_DTYPE_F32, p, g, buf, n, lr, momentum, dampening, nesterov, wd, first_step);
}
static int32_t cu_adamw_update_ex(kiln_instance *acc, uint32_t dt, void *p, const void *g, void *m, void *v, size_t n,
                                  double lr, double beta1, double beta2, double eps, double wd, int64_t step) {
    int32_t rc = cu_check_fdt(acc, "adamw_update", dt);
    if (rc != KILN_OK) return rc;
    if (step < 1)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: adamw_update: step is 1-based, got %lld", (long long)step);
    CU_NEED(acc, p, n, "adamw_update");
    CU_NEED(acc, g, n, "adamw_update");
    CU_NEED(acc, m, n, "adamw_update");
    CU_NEED(acc, v, n, "adamw_update");
    if (n == 0) return KILN_OK;
    CU_READY(acc, "adamw_update");
    CU_LAUNCH(acc, "adamw_update",
              kg_adamw_update(acc->stream, (int)dt, p, g, m, v, n, lr, beta1, beta2, eps, wd, step, NULL, KG_F32));
    return KILN_OK;
}
static int32_t cu_adamw_update(kiln_instance *acc, float *p, const float *g, float *m, float *v, size_t n, float lr,
                               float beta1, float beta2, float eps, float wd, int64_t step) {
    return cu_adamw_update_ex(acc, KILN_DTYPE_F32, p, g, m, v, n, lr, beta1, beta2, eps, wd, step);
}

/* 1.10: the list in launches of up to KG_ADAMW_LIST_MAX tensors, each
 * tensor with the blocks and coefficients of its own adamw_update_ex
 * launch, so the same bits; nothing is read back and nothing waits.
 * GPT-2's 148 parameters are 4 launches where they were 148. */
static int32_t cu_adamw_update_many(kiln_instance *acc, uint32_t dt, uint32_t count, void *const *p,
                                    const void *const *g, void *const *m, void *const *v, const size_t *n,
                                    const double *weight_decay, double lr, double beta1, double beta2, double eps,
                                    int64_t step) {
    const char *fn = "adamw_update_many";
    int32_t rc = cu_check_fdt(acc, fn, dt);
    if (rc == KILN_OK) rc = ack_adamw_list(CU_SINK(acc), fn, count, p, g, m, v, n, weight_decay, step);
    if (rc != KILN_OK) return rc;
    if (count == 0) return KILN_OK;
    CU_READY(acc, fn);
    kg_adamw_list list;
    for (uint32_t i0 = 0; i0 < count;) {
        list.count = 0;
        for (; i0 < count && list.count < KG_ADAMW_LIST_MAX; i0++) {
            if (n[i0] == 0) continue; /* its pointers may be NULL: never in a launch */
            const int t = list.count++;
            list.p[t] = p[i0], list.g[t] = g[i0], list.m[t] = m[i0], list.v[t] = v[i0];
            list.n[t] = n[i0], list.weight_decay[t] = weight_decay[i0];
        }
        if (list.count > 0)
            CU_LAUNCH(acc, fn, kg_adamw_update_list(acc->stream, (int)dt, &list, lr, beta1, beta2, eps, step));
    }
    return KILN_OK;
}

/* ------------------------------------------------------------ conversions */

static int32_t cu_cast(kiln_instance *acc, void *dst, uint32_t ddt, const void *src, uint32_t sdt, size_t n) {
    if (!cu_anydt(ddt) || !cu_anydt(sdt))
        return CU_ERR(acc, KILN_E_INVALID_ARG,
                      "cuda: cast: dtypes must be float32, float64, float16 or bfloat16, got %s -> %s",
                      kiln_dtype_name(sdt), kiln_dtype_name(ddt));
    CU_NEED(acc, dst, n, "cast");
    CU_NEED(acc, src, n, "cast");
    if (n == 0 || (dst == src && ddt == sdt)) return KILN_OK;
    const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    const size_t db = n * kiln_dtype_size(ddt), sb = n * kiln_dtype_size(sdt);
    if (d < s + sb && s < d + db)
        return CU_ERR(acc, KILN_E_INVALID_ARG,
                      "cuda: cast: dst (%s) and src (%s) overlap; only dst == src with equal dtypes may alias (n=%zu)",
                      kiln_dtype_name(ddt), kiln_dtype_name(sdt), n);
    CU_READY(acc, "cast");
    CU_LAUNCH(acc, "cast", kg_cast(acc->stream, dst, (int)ddt, src, (int)sdt, n));
    return KILN_OK;
}

static int32_t cu_round_to(kiln_instance *acc, float *x, uint32_t dt, size_t n) {
    if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16 && dt != KILN_DTYPE_F8E4M3 &&
        dt != KILN_DTYPE_F8E5M2)
        return CU_ERR(acc, KILN_E_INVALID_ARG,
                      "cuda: round_to: dtype must be float32 (no-op), float16, bfloat16, float8_e4m3fn or "
                      "float8_e5m2, got %s (x is float32 storage)",
                      kiln_dtype_name(dt));
    CU_NEED(acc, x, n, "round_to");
    if (n == 0 || dt == KILN_DTYPE_F32) return KILN_OK;
    CU_READY(acc, "round_to");
    CU_LAUNCH(acc, "round_to", kg_round_to(acc->stream, x, (int)dt, n));
    return KILN_OK;
}

/* ------------------------------------- 1.5: elementwise building blocks */

static_assert(KILN_ABI_MINOR >= 6, "the cuda plugin's table carries the 1.6 entries");

/* Every 1.5 elementwise entry: the cpu plugin's checks (ack_ew: dtype,
 * NULL pointers, y an input's very pointer or apart from it), then kg_ew.
 * an/bn name the inputs in messages; bn NULL: unary. */
static int32_t cu_ew(kiln_instance *acc, const char *fn, int op, uint32_t dt, void *y, const void *a, const char *an,
                     const void *b, const char *bn, double s0, double s1, size_t n) {
    int go = 0;
    int32_t rc = ack_ew(CU_SINK(acc), fn, dt, y, a, an, b, bn, n, &go);
    if (rc != KILN_OK || !go) return rc;
    CU_READY(acc, fn);
    CU_LAUNCH(acc, fn, kg_ew(acc->stream, op, (int)dt, y, a, bn ? b : NULL, s0, s1, n));
    return KILN_OK;
}

/* lerp, sign, mul, addcmul, addcdiv, sqrt_ex, clamp */
ACK_DEFINE_EW_ENTRIES(cu_, cu_ew, KG_EW_, CU_SINK)

/* ------------------------------------------------------------- the table */

static const kiln_kernels cu_kernel_table = {
    /* 1.11's size: every entry through layernorm_backward_cast */
    .struct_size = KILN_KERNELS_SIZE_1_11,
    /* device memory: callers copy host data in and out; gemm_ex and
     * xent_fused take 16-bit outputs and logits (1.6); the layer norm,
     * linear, attention, act_backward, bias_grad_ex and add entries keep
     * activations in 16 bits (1.7); linear_forward_layout rounds the bias
     * where asked (1.8) */
#if KILN_ABI_MINOR >= 8
    .flags = KILN_KERNELS_STORE_16BIT | KILN_KERNELS_ACT_16BIT | KILN_KERNELS_BIAS_ROUND,
#elif KILN_ABI_MINOR >= 7
    .flags = KILN_KERNELS_STORE_16BIT | KILN_KERNELS_ACT_16BIT,
#else
    .flags = KILN_KERNELS_STORE_16BIT,
#endif
    .alloc = cu_alloc,
    .free = cu_free,
    .copy = cu_copy,
    .zero = cu_zero,
    .synchronize = cu_synchronize,
    .gemm = cu_gemm,
    .bias_add = cu_bias_add,
    .bias_grad = cu_bias_grad,
    .relu_forward = cu_relu_forward,
    .relu_backward = cu_relu_backward,
    .gelu_forward = cu_gelu_forward,
    .gelu_backward = cu_gelu_backward,
    .softmax_xent_forward = cu_softmax_xent_forward,
    .softmax_xent_backward = cu_softmax_xent_backward,
    .sum = cu_sum,
    .sumsq = cu_sumsq,
    .scale = cu_scale,
    .axpy = cu_axpy,
    .all_finite = cu_all_finite,
    .sgd_update = cu_sgd_update,
    .adamw_update = cu_adamw_update,
    .cast = cu_cast,
    .round_to = cu_round_to,
    .gemm_ex = cu_gemm_ex,
    .bias_add_ex = cu_bias_add_ex,
    .bias_grad_ex = cu_bias_grad_ex,
    .act_forward = cu_act_forward,
    .act_backward = cu_act_backward,
    .softmax_xent_forward_ex = cu_softmax_xent_forward_ex,
    .softmax_xent_backward_ex = cu_softmax_xent_backward_ex,
    .sumsq_ex = cu_sumsq_ex,
    .all_finite_ex = cu_all_finite_ex,
    .scale_ex = cu_scale_ex,
    .axpy_ex = cu_axpy_ex,
    .sgd_update_ex = cu_sgd_update_ex,
    .adamw_update_ex = cu_adamw_update_ex,
    /* 1.3 (cuda_fused.c) */
    .unscale_check = cu_unscale_check,
    .linear_forward = cu_linear_forward,
    /* 1.4 (cuda_seq.c) */
    .embedding_forward = cu_embedding_forward,
    .embedding_backward = cu_embedding_backward,
    .layernorm_forward = cu_layernorm_forward,
    .layernorm_backward = cu_layernorm_backward,
    .attention_forward = cu_attention_forward,
    .attention_backward = cu_attention_backward,
    .xent_fused = cu_xent_fused,
    .add = cu_add,
    /* 1.5 */
    .lerp = cu_lerp,
    .sign = cu_sign,
    .mul = cu_mul,
    .addcmul = cu_addcmul,
    .addcdiv = cu_addcdiv,
    .sqrt_ex = cu_sqrt_ex,
    .clamp = cu_clamp,
    /* 1.6 */
    .linear_forward_layout = cu_linear_forward_layout,
    /* 1.9 */
    .sumsq_many = cu_sumsq_many,
    .adamw_update_many = cu_adamw_update_many,
    .add_layernorm_forward = cu_add_layernorm_forward,
    /* 1.11 */
    .act_bias_backward = cu_act_bias_backward,
    .layernorm_backward_cast = cu_layernorm_backward_cast,
};
static_assert(sizeof(kiln_kernels) >= KILN_KERNELS_SIZE_1_11, "kiln_kernels covers ABI 1.11");

/* -------------------------------------------------------------- instance */

void cu_version(int v, char *buf, size_t len) { snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10); }

/* The driver must support the runtime this plugin runs on (a newer
 * runtime on an older driver fails on its first call with an error that
 * does not say so); and there must be a device. "Support" is CUDA's
 * minor-version compatibility: a driver of the runtime's major release
 * runs it even when its minor version is older, except for features that
 * need the newer driver and for compiling PTX newer than the driver knows
 * (a GPU newer than the sm_80 / sm_90 code this plugin carries). That
 * case runs, with one warning; an older major release is refused. */
static int32_t cu_check_driver(kiln_instance *acc) {
    int drv = 0, rt = 0;
    char have[16], need[16];
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess || rt <= 0) rt = CUDART_VERSION;
    (void)cudaGetLastError();
    acc->runtime_version = rt;
    cu_version(rt, need, sizeof need);
    cudaError_t e = cudaDriverGetVersion(&drv);
    if (e != cudaSuccess || drv == 0) {
        (void)cudaGetLastError();
        return CU_ERR(acc, KILN_E_CUDA,
                      "cuda: no NVIDIA driver found (libcuda.so.1 is missing or cannot be loaded); this plugin was "
                      "built with CUDA runtime %s and needs a driver supporting CUDA %s or newer — use accelerator = "
                      "\"cpu\" on this machine",
                      need, need);
    }
    acc->driver_version = drv;
    cu_version(drv, have, sizeof have);
    if (drv / 1000 < rt / 1000)
        return CU_ERR(acc, KILN_E_VERSION,
                      "cuda: this plugin runs on CUDA runtime %s but the installed driver supports CUDA up to %s, an "
                      "older major release; install a driver for CUDA %d.0 or newer, or rebuild kiln with a CUDA "
                      "%d toolkit",
                      need, have, rt / 1000, drv / 1000);
    if (drv < rt)
        kiln_logf(acc->svc, acc->hctx, KILN_LOG_WARN,
                  "cuda: the driver supports CUDA %s, older than the CUDA runtime %s this plugin runs on: running "
                  "under CUDA's minor-version compatibility (a GPU newer than sm_90 needs a driver for CUDA %s or "
                  "newer)",
                  have, need, need);
    int count = 0;
    e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return CU_ERR(acc, KILN_E_CUDA, "cuda: no CUDA device visible (%s; driver for CUDA %s%s%s)",
                      e != cudaSuccess ? cudaGetErrorString(e) : "device count 0", have,
                      vis ? ", CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "");
    }
    return KILN_OK;
}

static int32_t cu_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                         kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    kiln_instance *acc = calloc(1, sizeof *acc);
    if (!acc) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "cuda: cannot allocate the accelerator instance");
    acc->svc = svc;
    acc->hctx = hctx;
    acc->device_cfg = (int32_t)kiln_kv_int(config, "device", -1);
    acc->tf32 = kiln_kv_int(config, "tf32", 0) != 0;
    acc->caching = kiln_kv_int(config, "caching", 1) != 0;
    const int64_t ws_mib = kiln_kv_int(config, "workspace_mib", 32);
    const int64_t st_mib = kiln_kv_int(config, "staging_mib", 16);
    const char *attn = kiln_kv_str(config, "attention", "gemm");
    const int64_t attn_mib = kiln_kv_int(config, "attention_workspace_mib", 2048);
    int32_t rc = KILN_OK;
    if (acc->device_cfg < -1)
        rc = CU_ERR(acc, KILN_E_CONFIG, "cuda: device must be >= 0, or -1 for the local rank's device; got %d",
                    (int)acc->device_cfg);
    else if (ws_mib < 0 || ws_mib > 4096)
        rc = CU_ERR(acc, KILN_E_CONFIG, "cuda: workspace_mib must be in 0..4096, got %lld", (long long)ws_mib);
    else if (st_mib < 1 || st_mib > 1024)
        rc = CU_ERR(acc, KILN_E_CONFIG, "cuda: staging_mib must be in 1..1024, got %lld", (long long)st_mib);
    else if (strcmp(attn, "gemm") != 0 && strcmp(attn, "rowwise") != 0 && strcmp(attn, "flash") != 0)
        rc = CU_ERR(acc, KILN_E_CONFIG, "cuda: attention must be \"gemm\", \"rowwise\" or \"flash\", got \"%s\"",
                    attn);
    else if (attn_mib < 16 || attn_mib > 1048576)
        rc = CU_ERR(acc, KILN_E_CONFIG, "cuda: attention_workspace_mib must be in 16..1048576, got %lld",
                    (long long)attn_mib);
    if (rc == KILN_OK) rc = cu_check_driver(acc);
    if (rc != KILN_OK) {
        free(acc);
        return rc;
    }
    acc->workspace_bytes = (size_t)ws_mib << 20;
    acc->stage_bytes = (size_t)st_mib << 20;
    acc->attn_path = strcmp(attn, "rowwise") == 0 ? CU_ATTN_ROWWISE
                     : strcmp(attn, "flash") == 0 ? CU_ATTN_FLASH
                                                  : CU_ATTN_GEMM;
    acc->profile = kiln_kv_int(config, "profile", 0) != 0;
    acc->attn_cap = (size_t)attn_mib << 20;
    *out = acc;
    return KILN_OK;
}

/* At exit: where the GEMM FLOPs ran, and what converting their operands
 * moved. A mixed-precision run whose FLOPs are not nearly all on 16-bit
 * tensor cores runs some products 15 times slower (an H100/H200's fp32
 * units against its bf16 tensor cores): the line shows it without a
 * profiler. Info with profile = true, debug otherwise. */
static void cu_log_gemm_units(kiln_instance *acc) {
    const double *f = acc->gemm_flops, all = f[0] + f[1] + f[2] + f[3];
    if (all <= 0.0) return;
    kiln_logf(acc->svc, acc->hctx, acc->profile ? KILN_LOG_INFO : KILN_LOG_DEBUG,
              "cuda: device %d: GEMMs %.4g FLOPs: %.1f%% on 16-bit tensor cores, %.1f%% TF32, %.1f%% fp32, "
              "%.1f%% fp64; operand conversions moved %.4g bytes",
              acc->device, all, 100.0 * f[CU_FLOPS_16] / all, 100.0 * f[CU_FLOPS_TF32] / all,
              100.0 * f[CU_FLOPS_32] / all, 100.0 * f[CU_FLOPS_64] / all, acc->gemm_convert_bytes);
}

static void cu_destroy(kiln_instance *acc) {
    if (!acc) return;
    free(acc->host_labels);
    free(acc->tok_host);
    free(acc->emb_count);
    free(acc->emb_index);
    if (acc->setup_started) {
        int prev = -1;
        const int had_prev = cudaGetDevice(&prev) == cudaSuccess;
        (void)cudaSetDevice(acc->device);
        kiln_logf(acc->svc, acc->hctx, acc->profile ? KILN_LOG_INFO : KILN_LOG_DEBUG,
                  "cuda: device %d: %lu cudaMalloc calls, %lu host waits, %zu MiB held at exit (%zu MiB cached)",
                  acc->device, acc->device_mallocs, acc->host_waits, (acc->bytes_in_use + acc->bytes_cached) >> 20,
                  acc->bytes_cached >> 20);
        cu_log_gemm_units(acc);
        /* queued GEMMs use the cuBLASLt handle and its workspace: wait for
         * them before the handle goes (cu_mem_release would wait too, but
         * only after the handle was destroyed) */
        if (acc->stream) (void)cudaStreamSynchronize(acc->stream);
        if (acc->stream) cu_prof_report(acc);
        cu_prof_release(acc);
        cu_blas_release(acc);
        cu_mem_release(acc);
        if (acc->stream) (void)cudaStreamDestroy(acc->stream);
        if (had_prev && prev != acc->device) (void)cudaSetDevice(prev); /* leave the thread as it was */
        (void)cudaGetLastError();
    }
    free(acc);
}

int32_t cu_enter(kiln_instance *acc, const char *fn) {
    if (!acc->configured)
        return CU_ERR(acc, KILN_E_STATE, "cuda: %s called before configure() chose a device%s", fn,
                      acc->setup_started ? " (configure() failed)" : "");
    if (acc->lost != cudaSuccess)
        return CU_ERR(acc, KILN_E_CUDA,
                      "cuda: %s: refused: the CUDA context was lost earlier (%s, first seen in %s); nothing more can "
                      "run on %s in this process",
                      fn, cudaGetErrorName(acc->lost), acc->lost_at, acc->device_name);
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != acc->device) CU_CHECK(acc, fn, cudaSetDevice(acc->device));
    if (acc->prof) cu_prof_mark(acc, fn);
    return KILN_OK;
}

static const kiln_kernels *cu_kernels(kiln_instance *acc) {
    (void)acc;
    return &cu_kernel_table;
}

/* threads is the host's CPU thread budget, which GPU kernels do not use.
 * The device: the `device` setting, else the device numbered local_rank
 * (one process per GPU under mpirun/srun/torchrun; a local rank without a
 * GPU of its own is refused), or device 0 where Slurm bound GPUs to each
 * task. Calling it again
 * with the same device is a no-op; switching devices is refused, because
 * memory already handed out lives on the first one. */
static int32_t cu_configure(kiln_instance *acc, int32_t threads, int32_t local_rank) {
    if (threads < 0)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: configure: threads must be >= 0 (0: all CPUs), got %d",
                      (int)threads);
    if (local_rank < 0)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: configure: local_rank must be >= 0, got %d", (int)local_rank);
    int count = 0;
    CU_CHECK(acc, "configure", cudaGetDeviceCount(&count));
    /* Without a `device` setting each local rank takes its own GPU. More
     * local ranks than GPUs would put two processes on one GPU (each with
     * its own context, memory and stream, competing for it); refuse that
     * rather than wrap around. Except where the launcher bound GPUs to
     * each task: under Slurm's --gpus-per-task each task sees only its own
     * (CUDA_VISIBLE_DEVICES set per task), so a local rank past them takes
     * the first device it sees, which no other task sees. */
    const char *per_task = getenv("SLURM_GPUS_PER_TASK");
    const int bound = per_task ? atoi(per_task) : 0; /* GPUs per task; 0: not bound */
    if (acc->device_cfg < 0 && local_rank >= count && bound <= 0)
        return CU_ERR(acc, KILN_E_CONFIG,
                      "cuda: configure: local_rank %d has no GPU of its own: %d CUDA device%s visible on this node; "
                      "start at most %d process%s per node, or set accelerator.device (or, under Slurm, bind a GPU "
                      "to each task with srun --gpus-per-task=1)",
                      (int)local_rank, count, count == 1 ? " is" : "s are", count, count == 1 ? "" : "es");
    const int dev = acc->device_cfg >= 0 ? acc->device_cfg : local_rank < count ? local_rank : 0;
    if (acc->device_cfg < 0 && local_rank >= count && !acc->configured)
        kiln_logf(acc->svc, acc->hctx, KILN_LOG_INFO,
                  "cuda: Slurm bound %d GPU%s to this task (SLURM_GPUS_PER_TASK): local_rank %d takes the first "
                  "device it sees, device 0 of %d",
                  bound, bound == 1 ? "" : "s", (int)local_rank, count);
    if (dev >= count)
        return CU_ERR(acc, KILN_E_CONFIG, "cuda: device %d asked for, but only %d device%s visible (0..%d)", dev, count,
                      count == 1 ? " is" : "s are", count - 1);
    if (acc->setup_started && !acc->configured)
        return CU_ERR(acc, KILN_E_STATE, "cuda: configure: an earlier configure() of this instance failed; create "
                      "a new one");
    if (acc->configured) {
        if (dev == acc->device) return KILN_OK;
        return CU_ERR(acc, KILN_E_STATE, "cuda: configure: already running on device %d, cannot move to device %d",
                      acc->device, dev);
    }
    CU_CHECK(acc, "configure", cudaSetDevice(dev));
    struct cudaDeviceProp prop;
    CU_CHECK(acc, "configure", cudaGetDeviceProperties(&prop, dev));
    acc->device = dev;
    snprintf(acc->device_name, sizeof acc->device_name, "%s", prop.name);
    acc->cc_major = prop.major;
    acc->cc_minor = prop.minor;
    acc->smem_optin = prop.sharedMemPerBlockOptin;
    acc->setup_started = 1; /* from here destroy() releases what exists */
    CU_CHECK(acc, "configure", cudaStreamCreateWithFlags(&acc->stream, cudaStreamNonBlocking));
    /* cu_mem_init and cu_blas_init allocate through cu_alloc, which needs a
     * configured instance; a failure below leaves it unusable */
    acc->configured = 1;
    int32_t rc = cu_mem_init(acc);
    if (rc == KILN_OK) rc = cu_blas_init(acc);
    if (rc == KILN_OK && acc->profile && !acc->prof) rc = cu_prof_init(acc);
    if (rc != KILN_OK) {
        acc->configured = 0;
        return rc;
    }
    int drv = 0, rt = 0;
    (void)cudaDriverGetVersion(&drv);
    (void)cudaRuntimeGetVersion(&rt);
    kiln_logf(acc->svc, acc->hctx, KILN_LOG_INFO,
              "cuda: device %d of %d: %s (sm_%d%d, %zu MiB), driver %d.%d, runtime %d.%d, fp32 GEMMs %s", dev, count,
              prop.name, prop.major, prop.minor, (size_t)(prop.totalGlobalMem >> 20), drv / 1000, (drv % 1000) / 10,
              rt / 1000, (rt % 1000) / 10, acc->tf32 ? "on TF32 tensor cores" : "in full fp32");
    return KILN_OK;
}

/* What libkiln-cuda.so (cuda_plugin.c) loads at create(): the only symbol
 * this library exports (see cuda_impl.h for why the plugin is split). */
static const kiln_cuda_impl cu_impl = {
    sizeof(kiln_cuda_impl), 0, cu_create, cu_destroy, cu_kernels, cu_configure,
};

KILN_CUDA_IMPL_EXPORT const kiln_cuda_impl *kiln_cuda_impl_v1(void) { return &cu_impl; }
