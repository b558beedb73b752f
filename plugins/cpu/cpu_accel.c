/*
 * cpu_accel.c — the "cpu" accelerator plugin: "device" memory is ordinary host
 * memory (64-byte aligned so every tensor starts on a cache line and the
 * kernels' vector loops never straddle one at the start, zero-filled because
 * the kernel table promises it), copies are memmove, synchronize has nothing
 * to wait for, and every math entry of kiln_kernels is a thin wrapper over the
 * kc_* functions of kernels/cpu (GEMM through OpenBLAS). The wrappers add what
 * the kernels deliberately leave out: argument checks that turn a caller's
 * mistake into a KILN_E_INVALID_ARG with a message instead of a BLAS xerbla
 * print or a wild read, and the translation of the loss kernel's NaN for an
 * out-of-range label into KILN_E_DATA naming the row and the label. configure()
 * sizes both thread pools (OpenBLAS's for GEMM, the kernels' own for the
 * elementwise, reduction and optimizer loops). The ABI 1.2 entries (other
 * dtypes) follow the same pattern: conversions and rounding through
 * float16/bfloat16, the mixed-dtype gemm_ex, and `_ex` versions of the
 * training kernels that take float32 (the float kernels, double scalars
 * rounded to float, except AdamW's hyperparameters, which its float kernel
 * takes as doubles) or float64 (the kernels' *_f64 versions); any other dtype
 * is KILN_E_INVALID_ARG naming the entry, what it accepts and what it got.
 * act_forward/act_backward take every KILN_ACT_* (ReLU, GELU, and tanh,
 * sigmoid and leaky ReLU with slope 0.2 for GANs) in both dtypes. The 1.5
 * elementwise building blocks (lerp ... clamp) are kc_ew behind the same
 * checks (dtype, NULL, partial overlap). From 1.6 (KILN_KERNELS_STORE_16BIT)
 * gemm_ex writes a float16/bfloat16 C and xent_fused keeps 16-bit logits,
 * both through float32 workspace, and linear_forward_layout takes Conv1D's
 * (in, out) weights too. From 1.7 (KILN_KERNELS_ACT_16BIT) the layer norm,
 * linear, attention, act_backward, bias_grad_ex and add entries keep their
 * activation buffers in 16 bits: each runs its float32 kernel on widened
 * copies (acc->stage) and rounds its outputs into place, which is the
 * entry's definition, so the cpu is the reference the GPU is held to.
 * From 1.8 (KILN_KERNELS_BIAS_ROUND) linear_forward_layout rounds the bias
 * first where w_layout carries KILN_LAYOUT_ROUND_BIAS: a rounded copy in
 * acc->stage, then the plain call.
 */
#define _GNU_SOURCE /* sched_getaffinity / CPU_COUNT */

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h> /* openblas_set_num_threads (OpenBLAS's cblas.h) */
#include <kiln/kiln.h>

#include "cpu_kernels.h"
#include "cpu_accel.h"

/* The kernels' KC_* dtype numbers are the ABI's, so dtypes pass through. */
static_assert((int)KC_F32 == (int)KILN_DTYPE_F32 && (int)KC_F64 == (int)KILN_DTYPE_F64 &&
                  (int)KC_F16 == (int)KILN_DTYPE_F16 && (int)KC_BF16 == (int)KILN_DTYPE_BF16,
              "kernels/cpu dtype numbers must equal KILN_DTYPE_*");

/* Live instances. create/destroy are serialised by the host, so a plain
 * counter suffices; the last destroy stops the kernels' worker threads. */
static int cpu_live_instances;

/* ------------------------------------------------------------------ memory */

static int32_t cpu_alloc(kiln_instance *acc, size_t bytes, void **out) {
    if (!out) return CPU_ERR(acc, KILN_E_INVALID_ARG, "alloc: out is NULL");
    *out = NULL;
    /* Round up to whole cache lines (at least one, so alloc(0) still gives a
     * unique pointer); the guard catches the wrap-around of the rounding. */
    if (bytes > SIZE_MAX - 63)
        return CPU_ERR(acc, KILN_E_NOMEM, "alloc: cannot allocate %zu bytes (larger than the address space)", bytes);
    size_t rounded = bytes == 0 ? 64 : (bytes + 63) & ~(size_t)63;
    void *p = NULL;
    int rc = posix_memalign(&p, 64, rounded);
    if (rc != 0 || !p)
        return CPU_ERR(acc, KILN_E_NOMEM, "alloc: cannot allocate %zu bytes of host memory (%s)", bytes,
                       strerror(rc ? rc : ENOMEM));
    memset(p, 0, rounded);
    *out = p;
    return KILN_OK;
}

static void cpu_free(kiln_instance *acc, void *ptr) {
    (void)acc;
    free(ptr);
}

/* Host and device are the same memory, so every direction is one memmove
 * (memmove, not memcpy: a D2D copy between overlapping views is legal). */
static int32_t cpu_copy(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind) {
    if (kind != KILN_COPY_H2D && kind != KILN_COPY_D2H && kind != KILN_COPY_D2D)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "copy: kind must be KILN_COPY_H2D, D2H or D2D (0..2), got %d",
                       (int)kind);
    if (bytes == 0) return KILN_OK;
    if (!dst || !src)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "copy: %s pointer is NULL for %zu bytes", dst ? "source" : "destination",
                       bytes);
    memmove(dst, src, bytes);
    return KILN_OK;
}

static int32_t cpu_zero(kiln_instance *acc, void *ptr, size_t bytes) {
    CPU_NEED(acc, ptr, bytes, "zero");
    kc_zero(ptr, bytes);
    return KILN_OK;
}

/* Every kernel has returned by the time its wrapper does. */
static int32_t cpu_synchronize(kiln_instance *acc) {
    (void)acc;
    return KILN_OK;
}

/* -------------------------------------------------------------------- GEMM */

/* Checks one operand's leading dimension the way BLAS does (ld >= max(1,
 * stored columns)), so a bad call fails here with a message rather than in
 * OpenBLAS's xerbla, which prints to stderr and does nothing. */
static int32_t cpu_check_ld(kiln_instance *acc, const char *fn, char what, int32_t ld, int32_t cols, int32_t trans,
                            int32_t M, int32_t N, int32_t K) {
    int32_t need = cols > 1 ? cols : 1;
    if (ld < need)
        return CPU_ERR(acc, KILN_E_INVALID_ARG,
                       "%s: ld%c=%d is smaller than max(1, stored columns of %c) = %d (trans=%d, M=%d, N=%d, K=%d)", fn,
                       what + ('a' - 'A'), (int)ld, what, (int)need, (int)(trans != 0), (int)M, (int)N, (int)K);
    return KILN_OK;
}

/* The three leading dimensions of a GEMM: A is stored (M, K) or, transposed,
 * (K, M); B (K, N) or (N, K); C (M, N). */
static int32_t cpu_check_lds(kiln_instance *acc, const char *fn, int32_t trans_a, int32_t trans_b, int32_t M,
                             int32_t N, int32_t K, int32_t lda, int32_t ldb, int32_t ldc) {
    int32_t rc;
    if ((rc = cpu_check_ld(acc, fn, 'A', lda, trans_a ? M : K, trans_a, M, N, K)) != KILN_OK) return rc;
    if ((rc = cpu_check_ld(acc, fn, 'B', ldb, trans_b ? K : N, trans_b, M, N, K)) != KILN_OK) return rc;
    return cpu_check_ld(acc, fn, 'C', ldc, N, 0, M, N, K);
}

static int32_t cpu_gemm(kiln_instance *acc, int32_t trans_a, int32_t trans_b, int32_t M, int32_t N, int32_t K,
                        float alpha, const float *A, int32_t lda, const float *B, int32_t ldb, float beta, float *C,
                        int32_t ldc) {
    if (M < 0 || N < 0 || K < 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "gemm: M, N, K must be >= 0, got M=%d N=%d K=%d", (int)M, (int)N,
                       (int)K);
    int32_t rc = cpu_check_lds(acc, "gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
    if (rc != KILN_OK) return rc;
    if (M == 0 || N == 0) return KILN_OK;
    if (!C || (K > 0 && (!A || !B)))
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "gemm: NULL %s for M=%d N=%d K=%d", !C ? "C" : !A ? "A" : "B",
                       (int)M, (int)N, (int)K);
    kc_gemm(trans_a != 0, trans_b != 0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return KILN_OK;
}

/* ------------------------------------------------------- bias, activations */

static int32_t cpu_bias_add(kiln_instance *acc, float *y, const float *b, int32_t rows, int32_t cols) {
    if (rows < 0 || cols < 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "bias_add: rows and cols must be >= 0, got %d x %d", (int)rows,
                       (int)cols);
    CPU_NEED(acc, y, (size_t)rows * (size_t)cols, "bias_add");
    CPU_NEED(acc, b, rows > 0 ? (size_t)cols : 0, "bias_add");
    kc_bias_add(y, b, rows, cols);
    return KILN_OK;
}

static int32_t cpu_bias_grad(kiln_instance *acc, float *db, const float *dy, int32_t rows, int32_t cols,
                             int32_t accumulate) {
    if (rows < 0 || cols < 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "bias_grad: rows and cols must be >= 0, got %d x %d", (int)rows,
                       (int)cols);
    CPU_NEED(acc, db, (size_t)cols, "bias_grad");
    CPU_NEED(acc, dy, (size_t)rows * (size_t)cols, "bias_grad");
    kc_bias_grad(db, dy, rows, cols, accumulate != 0);
    return KILN_OK;
}

/* The buffers of an activation's forward (y, x) and backward (dx, dy, x),
 * checked for NULL as every activation entry checks them. */
static int32_t cpu_act_need_fwd(kiln_instance *acc, const char *fn, const void *y, const void *x, size_t n) {
    int32_t rc = ack_need(CPU_SINK(acc), fn, "y", y, n);
    return rc != KILN_OK ? rc : ack_need(CPU_SINK(acc), fn, "x", x, n);
}

static int32_t cpu_act_need_bwd(kiln_instance *acc, const char *fn, const void *dx, const void *dy, const void *x,
                                size_t n) {
    int32_t rc = ack_need(CPU_SINK(acc), fn, "dx", dx, n);
    if (rc == KILN_OK) rc = ack_need(CPU_SINK(acc), fn, "dy", dy, n);
    return rc != KILN_OK ? rc : ack_need(CPU_SINK(acc), fn, "x", x, n);
}

/* The float32 relu and gelu entries: the checks, then the kernel passed. */
static int32_t cpu_act32_fwd(kiln_instance *acc, const char *fn, void (*kernel)(float *, const float *, size_t),
                             float *y, const float *x, size_t n) {
    int32_t rc = cpu_act_need_fwd(acc, fn, y, x, n);
    if (rc == KILN_OK) kernel(y, x, n);
    return rc;
}
static int32_t cpu_act32_bwd(kiln_instance *acc, const char *fn,
                             void (*kernel)(float *, const float *, const float *, size_t), float *dx,
                             const float *dy, const float *x, size_t n) {
    int32_t rc = cpu_act_need_bwd(acc, fn, dx, dy, x, n);
    if (rc == KILN_OK) kernel(dx, dy, x, n);
    return rc;
}
static int32_t cpu_relu_forward(kiln_instance *acc, float *y, const float *x, size_t n) {
    return cpu_act32_fwd(acc, "relu_forward", kc_relu_forward, y, x, n);
}
static int32_t cpu_relu_backward(kiln_instance *acc, float *dx, const float *dy, const float *x, size_t n) {
    return cpu_act32_bwd(acc, "relu_backward", kc_relu_backward, dx, dy, x, n);
}
static int32_t cpu_gelu_forward(kiln_instance *acc, float *y, const float *x, size_t n) {
    return cpu_act32_fwd(acc, "gelu_forward", kc_gelu_forward, y, x, n);
}
static int32_t cpu_gelu_backward(kiln_instance *acc, float *dx, const float *dy, const float *x, size_t n) {
    return cpu_act32_bwd(acc, "gelu_backward", kc_gelu_backward, dx, dy, x, n);
}

/* -------------------------------------------------------------------- loss */

/* The first row whose label is outside [0, C), or -1. labels: (B). */
static int32_t cpu_bad_label_row(const int32_t *labels, int32_t B, int32_t C) {
    for (int32_t i = 0; i < B; i++)
        if (labels[i] < 0 || labels[i] >= C) return i;
    return -1;
}

/* a: probs (forward) or dlogits (backward); b: logits or probs; esz:
 * bytes per element. */
static int32_t cpu_xent_args(kiln_instance *acc, const char *fn, int backward, size_t esz, const void *a,
                             const void *b, const int32_t *labels, int32_t B, int32_t C) {
    if (B < 1 || C < 1)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: B and C must be >= 1, got B=%d C=%d", fn, (int)B, (int)C);
    if (!a || !b || !labels) return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: NULL tensor argument", fn);
    return ack_xent_buffers(CPU_SINK(acc), fn, backward, a, b, B, C, esz);
}

/*
 * The kernel reports a bad label only as a NaN loss; NaN logits give a NaN
 * loss too, and that one is not a data error (it is the non-finite loss the
 * trainer deals with). So on NaN the labels are scanned, which costs O(B) on
 * a path that is rare, and only a real bad label becomes KILN_E_DATA.
 */
static int32_t cpu_softmax_xent_forward(kiln_instance *acc, float *probs, const float *logits,
                                        const int32_t *labels, int32_t B, int32_t C, float *loss,
                                        int32_t *n_correct) {
    int32_t rc = cpu_xent_args(acc, "softmax_xent_forward", 0, sizeof(float), probs, logits, labels, B, C);
    if (rc != KILN_OK) return rc;
    if (!loss) return CPU_ERR(acc, KILN_E_INVALID_ARG, "softmax_xent_forward: loss is NULL");
    int correct = 0;
    float l = kc_softmax_xent_forward(probs, logits, labels, B, C, &correct);
    if (isnan(l)) {
        int32_t row = cpu_bad_label_row(labels, B, C);
        if (row >= 0)
            return CPU_ERR(acc, KILN_E_DATA,
                           "softmax_xent_forward: label %d at batch index %d is outside [0, %d) (B=%d, C=%d)",
                           (int)labels[row], (int)row, (int)C, (int)B, (int)C);
    }
    *loss = l;
    if (n_correct) *n_correct = correct;
    return KILN_OK;
}

/* The backward checks the labels up front (O(B) next to the O(B*C) pass):
 * the kernel would fill a bad row with NaN, which is only a safety net. */
static int32_t cpu_softmax_xent_backward(kiln_instance *acc, float *dlogits, const float *probs,
                                         const int32_t *labels, int32_t B, int32_t C, float dloss) {
    int32_t rc = cpu_xent_args(acc, "softmax_xent_backward", 1, sizeof(float), dlogits, probs, labels, B, C);
    if (rc != KILN_OK) return rc;
    int32_t row = cpu_bad_label_row(labels, B, C);
    if (row >= 0)
        return CPU_ERR(acc, KILN_E_DATA,
                       "softmax_xent_backward: label %d at batch index %d is outside [0, %d) (B=%d, C=%d)",
                       (int)labels[row], (int)row, (int)C, (int)B, (int)C);
    kc_softmax_xent_backward(dlogits, probs, labels, B, C, dloss);
    return KILN_OK;
}

/* ---------------------------------------------------- reductions, BLAS-1 */

static int32_t cpu_sum(kiln_instance *acc, const float *x, size_t n, double *out) {
    CPU_NEED(acc, x, n, "sum");
    if (!out) return CPU_ERR(acc, KILN_E_INVALID_ARG, "sum: out is NULL");
    *out = kc_sum(x, n);
    return KILN_OK;
}

static int32_t cpu_sumsq(kiln_instance *acc, const float *x, size_t n, double *out) {
    CPU_NEED(acc, x, n, "sumsq");
    if (!out) return CPU_ERR(acc, KILN_E_INVALID_ARG, "sumsq: out is NULL");
    *out = kc_sumsq(x, n);
    return KILN_OK;
}

static int32_t cpu_scale(kiln_instance *acc, float *x, float a, size_t n) {
    CPU_NEED(acc, x, n, "scale");
    kc_scale(x, a, n);
    return KILN_OK;
}

static int32_t cpu_axpy(kiln_instance *acc, float *y, float a, const float *x, size_t n) {
    CPU_NEED(acc, y, n, "axpy");
    CPU_NEED(acc, x, n, "axpy");
    kc_axpy(y, a, x, n);
    return KILN_OK;
}

static int32_t cpu_all_finite(kiln_instance *acc, const float *x, size_t n, int32_t *finite) {
    CPU_NEED(acc, x, n, "all_finite");
    if (!finite) return CPU_ERR(acc, KILN_E_INVALID_ARG, "all_finite: finite is NULL");
    *finite = kc_all_finite(x, n);
    return KILN_OK;
}

/* -------------------------------------------------------------- optimizers */

static int32_t cpu_sgd_update(kiln_instance *acc, float *p, const float *g, float *momentum_buf, size_t n, float lr,
                              float momentum, float dampening, int32_t nesterov, float weight_decay,
                              int32_t first_step) {
    CPU_NEED(acc, p, n, "sgd_update");
    CPU_NEED(acc, g, n, "sgd_update");
    /* The kernel silently skips momentum without a buffer; that would train
     * with different maths than configured, so it is an error here. */
    if (momentum != 0.0f) CPU_NEED(acc, momentum_buf, n, "sgd_update (momentum != 0)");
    kc_sgd_update(p, g, momentum_buf, n, lr, momentum, dampening, nesterov != 0, weight_decay, first_step != 0);
    return KILN_OK;
}

static int32_t cpu_adamw_update(kiln_instance *acc, float *p, const float *g, float *m, float *v, size_t n, float lr,
                                float beta1, float beta2, float eps, float weight_decay, int64_t step) {
    CPU_NEED(acc, p, n, "adamw_update");
    CPU_NEED(acc, g, n, "adamw_update");
    CPU_NEED(acc, m, n, "adamw_update");
    CPU_NEED(acc, v, n, "adamw_update");
    if (step < 1)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "adamw_update: step is 1-based, got %lld", (long long)step);
    kc_adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    return KILN_OK;
}

/* ------------------------------------------------ 1.2: other dtypes */

static int cpu_is_float_dtype(uint32_t dt) {
    return dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F64 || dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16;
}

/* The `_ex` training entries take float32 or float64 data. */
int32_t cpu_check_dtype(kiln_instance *acc, const char *fn, uint32_t dtype) {
    return ack_float_dtype(CPU_SINK(acc), fn, dtype);
}

/* dst(n) = src(n) converted; dst may equal src only with equal dtypes (a
 * no-op), no other overlap (elements of different sizes would overwrite
 * inputs not yet read). */
static int32_t cpu_cast(kiln_instance *acc, void *dst, uint32_t dst_dtype, const void *src, uint32_t src_dtype,
                        size_t n) {
    if (!cpu_is_float_dtype(dst_dtype))
        return CPU_ERR(acc, KILN_E_INVALID_ARG,
                       "cast: dst_dtype must be float32, float64, float16 or bfloat16, got " CPU_DT_FMT,
                       CPU_DT_ARG(dst_dtype));
    if (!cpu_is_float_dtype(src_dtype))
        return CPU_ERR(acc, KILN_E_INVALID_ARG,
                       "cast: src_dtype must be float32, float64, float16 or bfloat16, got " CPU_DT_FMT,
                       CPU_DT_ARG(src_dtype));
    CPU_NEED(acc, dst, n, "cast");
    CPU_NEED(acc, src, n, "cast");
    if (n == 0) return KILN_OK;
    const size_t dsz = kiln_dtype_size(dst_dtype), ssz = kiln_dtype_size(src_dtype);
    if (n > SIZE_MAX / 8)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "cast: n=%zu elements is larger than the address space", n);
    if (!(dst == src && dst_dtype == src_dtype) && ack_ranges_overlap(dst, n * dsz, src, n * ssz))
        return CPU_ERR(acc, KILN_E_INVALID_ARG,
                       "cast: dst (%s) and src (%s) overlap; only dst == src with equal dtypes may alias (n=%zu)",
                       kiln_dtype_name(dst_dtype), kiln_dtype_name(src_dtype), n);
    kc_cast(dst, (int)dst_dtype, src, (int)src_dtype, n);
    return KILN_OK;
}

int32_t cpu_round_to(kiln_instance *acc, float *x, uint32_t dtype, size_t n) {
    CPU_NEED(acc, x, n, "round_to");
    switch (dtype) {
    case KILN_DTYPE_F32: return KILN_OK; /* storing fp32 as fp32 keeps everything */
    case KILN_DTYPE_F16: kc_round_f16(x, n); return KILN_OK;
    case KILN_DTYPE_BF16: kc_round_bf16(x, n); return KILN_OK;
#if KILN_ABI_MINOR >= 5
    case KILN_DTYPE_F8E4M3: case KILN_DTYPE_F8E5M2: kc_round_fp8(x, (int)dtype, n); return KILN_OK;
#endif
    default:
        return CPU_ERR(acc, KILN_E_INVALID_ARG,
                       "round_to: dtype must be float32 (no-op), float16, bfloat16, float8_e4m3fn or float8_e5m2, "
                       "got " CPU_DT_FMT " (x is float32 storage)",
                       CPU_DT_ARG(dtype));
    }
}

/* Makes *buf (*have bytes, 64-byte aligned) at least `bytes` long: the
 * grow-only scratch of struct kiln_instance; `what` names it in a failure. */
static int32_t cpu_grow(kiln_instance *acc, void **buf, size_t *have, size_t bytes, const char *what) {
    if (bytes <= *have) return KILN_OK;
    if (bytes > SIZE_MAX - 63)
        return CPU_ERR(acc, KILN_E_NOMEM, "%s of %zu bytes is larger than the address space", what, bytes);
    const size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = NULL;
    int rc = posix_memalign(&p, 64, rounded);
    if (rc != 0 || !p)
        return CPU_ERR(acc, KILN_E_NOMEM, "cannot allocate a %zu-byte %s (%s)", rounded, what,
                       strerror(rc ? rc : ENOMEM));
    free(*buf);
    *buf = p;
    *have = rounded;
    return KILN_OK;
}

/* Makes acc->ws at least `bytes` long (see struct kiln_instance). */
int32_t cpu_reserve_workspace(kiln_instance *acc, size_t bytes) {
    return cpu_grow(acc, &acc->ws, &acc->ws_bytes, bytes, "kernel workspace");
}

#if KILN_ABI_MINOR >= 7
int32_t cpu_reserve_stage(kiln_instance *acc, size_t floats) {
    if (floats > SIZE_MAX / sizeof(float))
        return CPU_ERR(acc, KILN_E_NOMEM, "a %zu-float buffer for 16-bit activations is larger than the address space",
                       floats);
    void *p = acc->stage;
    int32_t rc = cpu_grow(acc, &p, &acc->stage_bytes, floats * sizeof(float), "buffer for 16-bit activations");
    acc->stage = p;
    return rc;
}

/* The 16-bit storage widens and rounds with kc_cast, on the ABI's dtype ids */
static_assert((int)KC_F32 == (int)KILN_DTYPE_F32 && (int)KC_F16 == (int)KILN_DTYPE_F16 &&
                  (int)KC_BF16 == (int)KILN_DTYPE_BF16,
              "kc_cast takes the ABI's dtype ids");
#endif

static int32_t cpu_gemm_ex(kiln_instance *acc, int32_t trans_a, int32_t trans_b, int32_t M, int32_t N, int32_t K,
                           double alpha, const void *A, uint32_t a_dtype, int32_t lda, const void *B,
                           uint32_t b_dtype, int32_t ldb, double beta, void *C, uint32_t c_dtype, int32_t ldc,
                           uint32_t round_dtype) {
    if (M < 0 || N < 0 || K < 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "gemm_ex: M, N, K must be >= 0, got M=%d N=%d K=%d", (int)M, (int)N,
                       (int)K);
    int32_t rc = ack_gemm_ex_dtypes(CPU_SINK(acc), a_dtype, b_dtype, c_dtype, round_dtype);
    if (rc != KILN_OK) return rc;
    if ((rc = cpu_check_lds(acc, "gemm_ex", trans_a, trans_b, M, N, K, lda, ldb, ldc)) != KILN_OK) return rc;
    if (M == 0 || N == 0) return KILN_OK;
    if (!C || (K > 0 && (!A || !B)))
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "gemm_ex: NULL %s for M=%d N=%d K=%d", !C ? "C" : !A ? "A" : "B",
                       (int)M, (int)N, (int)K);
    const size_t need = kc_gemm_ex_workspace(M, N, K, (int)a_dtype, (int)b_dtype, (int)c_dtype, (int)round_dtype, beta);
    if ((rc = cpu_reserve_workspace(acc, need)) != KILN_OK) return rc;
    if (kc_gemm_ex(trans_a != 0, trans_b != 0, M, N, K, alpha, A, (int)a_dtype, lda, B, (int)b_dtype, ldb, beta, C,
                   (int)c_dtype, ldc, (int)round_dtype, acc->ws, acc->ws_bytes) != 0)
        return CPU_ERR(acc, KILN_E_INTERNAL,
                       "gemm_ex: the kernel refused a call the checks accepted (a=%s b=%s c=%s round=%s, workspace "
                       "%zu of %zu bytes)",
                       kiln_dtype_name(a_dtype), kiln_dtype_name(b_dtype), kiln_dtype_name(c_dtype),
                       kiln_dtype_name(round_dtype), acc->ws_bytes, need);
    return KILN_OK;
}

static int32_t cpu_bias_add_ex(kiln_instance *acc, uint32_t dtype, void *y, const void *b, int32_t rows,
                               int32_t cols) {
    int32_t rc = cpu_check_dtype(acc, "bias_add_ex", dtype);
    if (rc != KILN_OK) return rc;
    if (rows < 0 || cols < 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "bias_add_ex: rows and cols must be >= 0, got %d x %d", (int)rows,
                       (int)cols);
    CPU_NEED(acc, y, (size_t)rows * (size_t)cols, "bias_add_ex");
    CPU_NEED(acc, b, rows > 0 ? (size_t)cols : 0, "bias_add_ex");
    if (dtype == KILN_DTYPE_F32) kc_bias_add(y, b, rows, cols);
    else kc_bias_add_f64(y, b, rows, cols);
    return KILN_OK;
}

static int32_t cpu_bias_grad_ex(kiln_instance *acc, uint32_t dtype, void *db, const void *dy, int32_t rows,
                                int32_t cols, int32_t accumulate) {
    int32_t rc = ack_act_dtype(CPU_SINK(acc), "bias_grad_ex", dtype);
    if (rc != KILN_OK) return rc;
    if (rows < 0 || cols < 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "bias_grad_ex: rows and cols must be >= 0, got %d x %d", (int)rows,
                       (int)cols);
    CPU_NEED(acc, db, (size_t)cols, "bias_grad_ex");
    CPU_NEED(acc, dy, (size_t)rows * (size_t)cols, "bias_grad_ex");
#if KILN_ABI_MINOR >= 7
    if (ack_act16(dtype)) { /* dy 16-bit, db float32 */
        const size_t n = (size_t)rows * (size_t)cols;
        if ((rc = cpu_reserve_stage(acc, n)) != KILN_OK) return rc;
        kc_cast(acc->stage, KC_F32, dy, (int)dtype, n);
        kc_bias_grad(db, acc->stage, rows, cols, accumulate != 0);
        return KILN_OK;
    }
#endif
    if (dtype == KILN_DTYPE_F32) kc_bias_grad(db, dy, rows, cols, accumulate != 0);
    else kc_bias_grad_f64(db, dy, rows, cols, accumulate != 0);
    return KILN_OK;
}

static int32_t cpu_check_act(kiln_instance *acc, const char *fn, int32_t act) {
    return ack_act(CPU_SINK(acc), fn, act);
}

/* The kernels of each activation, indexed by KILN_ACT_* (checked above). */
typedef void (*cpu_act_fwd32)(float *, const float *, size_t);
typedef void (*cpu_act_bwd32)(float *, const float *, const float *, size_t);
typedef void (*cpu_act_fwd64)(double *, const double *, size_t);
typedef void (*cpu_act_bwd64)(double *, const double *, const double *, size_t);
static const cpu_act_fwd32 cpu_act_f32[] = {kc_relu_forward, kc_gelu_forward, kc_tanh_forward, kc_sigmoid_forward,
                                            kc_leaky_relu_forward};
static const cpu_act_bwd32 cpu_act_b32[] = {kc_relu_backward, kc_gelu_backward, kc_tanh_backward,
                                            kc_sigmoid_backward, kc_leaky_relu_backward};
static const cpu_act_fwd64 cpu_act_f64[] = {kc_relu_forward_f64, kc_gelu_forward_f64, kc_tanh_forward_f64,
                                            kc_sigmoid_forward_f64, kc_leaky_relu_forward_f64};
static const cpu_act_bwd64 cpu_act_b64[] = {kc_relu_backward_f64, kc_gelu_backward_f64, kc_tanh_backward_f64,
                                            kc_sigmoid_backward_f64, kc_leaky_relu_backward_f64};
static_assert(KILN_ACT_RELU == 0 && KILN_ACT_GELU == 1 && KILN_ACT_TANH == 2 && KILN_ACT_SIGMOID == 3 &&
                  KILN_ACT_LEAKY_RELU == 4 && sizeof cpu_act_f32 / sizeof cpu_act_f32[0] == 5,
              "cpu_act_* tables are indexed by KILN_ACT_*");

static int32_t cpu_act_forward(kiln_instance *acc, uint32_t dtype, int32_t act, void *y, const void *x, size_t n) {
    int32_t rc = cpu_check_dtype(acc, "act_forward", dtype);
    if (rc != KILN_OK || (rc = cpu_check_act(acc, "act_forward", act)) != KILN_OK) return rc;
    if ((rc = cpu_act_need_fwd(acc, "act_forward", y, x, n)) != KILN_OK) return rc;
    if (dtype == KILN_DTYPE_F32) cpu_act_f32[act](y, x, n);
    else cpu_act_f64[act](y, x, n);
    return KILN_OK;
}

static int32_t cpu_act_backward(kiln_instance *acc, uint32_t dtype, int32_t act, void *dx, const void *dy,
                                const void *x, size_t n) {
    int32_t rc = ack_act_dtype(CPU_SINK(acc), "act_backward", dtype);
    if (rc != KILN_OK || (rc = cpu_check_act(acc, "act_backward", act)) != KILN_OK) return rc;
    if ((rc = cpu_act_need_bwd(acc, "act_backward", dx, dy, x, n)) != KILN_OK) return rc;
#if KILN_ABI_MINOR >= 7
    if (ack_act16(dtype)) { /* dx, dy, x 16-bit: the float32 kernel on widened copies, dx rounded into place */
        if (n > SIZE_MAX / 2 || (rc = cpu_reserve_stage(acc, 2 * n)) != KILN_OK)
            return rc != KILN_OK ? rc : CPU_ERR(acc, KILN_E_INVALID_ARG, "act_backward: n=%zu is too large", n);
        float *g = acc->stage, *xs = acc->stage + n;
        kc_cast(g, KC_F32, dy, (int)dtype, n);
        kc_cast(xs, KC_F32, x, (int)dtype, n);
        cpu_act_b32[act](g, g, xs, n);
        kc_cast(dx, (int)dtype, g, KC_F32, n);
        return KILN_OK;
    }
#endif
    if (dtype == KILN_DTYPE_F32) cpu_act_b32[act](dx, dy, x, n);
    else cpu_act_b64[act](dx, dy, x, n);
    return KILN_OK;
}

#if KILN_ABI_MINOR >= 11
/* 1.11: the two entries in a row, after the checks of both, as
 * add_layernorm_forward (cpu_accel_seq.c): nothing to save on the cpu. */
static int32_t cpu_act_bias_backward(kiln_instance *acc, uint32_t dtype, int32_t act, void *dx, void *db,
                                     const void *dy, const void *x, int32_t rows, int32_t cols, int32_t accumulate) {
    int go = 0;
    int32_t rc = ack_act_bias_backward(CPU_SINK(acc), "act_bias_backward", dtype, act, dx, db, dy, x, rows, cols,
                                       accumulate, &go);
    if (rc != KILN_OK || !go) return rc;
    rc = cpu_act_backward(acc, dtype, act, dx, dy, x, (size_t)rows * (size_t)cols);
    if (rc != KILN_OK || !db) return rc;
    return cpu_bias_grad_ex(acc, dtype, db, dx, rows, cols, accumulate);
}
#endif

/* As softmax_xent_forward: a NaN loss is a data error only when a label is
 * out of range (NaN logits give a NaN loss the trainer handles). */
static int32_t cpu_softmax_xent_forward_ex(kiln_instance *acc, uint32_t dtype, void *probs, const void *logits,
                                           const int32_t *labels, int32_t B, int32_t C, double *loss,
                                           int32_t *n_correct) {
    int32_t rc = cpu_check_dtype(acc, "softmax_xent_forward_ex", dtype);
    if (rc != KILN_OK) return rc;
    if ((rc = cpu_xent_args(acc, "softmax_xent_forward_ex", 0, kiln_dtype_size(dtype), probs, logits, labels, B,
                            C)) != KILN_OK)
        return rc;
    if (!loss) return CPU_ERR(acc, KILN_E_INVALID_ARG, "softmax_xent_forward_ex: loss is NULL");
    int correct = 0;
    const double l = dtype == KILN_DTYPE_F32 ? (double)kc_softmax_xent_forward(probs, logits, labels, B, C, &correct)
                                             : kc_softmax_xent_forward_f64(probs, logits, labels, B, C, &correct);
    if (isnan(l)) {
        int32_t row = cpu_bad_label_row(labels, B, C);
        if (row >= 0)
            return CPU_ERR(acc, KILN_E_DATA,
                           "softmax_xent_forward_ex: label %d at batch index %d is outside [0, %d) (B=%d, C=%d)",
                           (int)labels[row], (int)row, (int)C, (int)B, (int)C);
    }
    *loss = l;
    if (n_correct) *n_correct = correct;
    return KILN_OK;
}

static int32_t cpu_softmax_xent_backward_ex(kiln_instance *acc, uint32_t dtype, void *dlogits, const void *probs,
                                            const int32_t *labels, int32_t B, int32_t C, double dloss) {
    int32_t rc = cpu_check_dtype(acc, "softmax_xent_backward_ex", dtype);
    if (rc != KILN_OK) return rc;
    if ((rc = cpu_xent_args(acc, "softmax_xent_backward_ex", 1, kiln_dtype_size(dtype),
                             dlogits, probs, labels, B, C)) != KILN_OK) return rc;
    int32_t row = cpu_bad_label_row(labels, B, C);
    if (row >= 0)
        return CPU_ERR(acc, KILN_E_DATA,
                       "softmax_xent_backward_ex: label %d at batch index %d is outside [0, %d) (B=%d, C=%d)",
                       (int)labels[row], (int)row, (int)C, (int)B, (int)C);
    if (dtype == KILN_DTYPE_F32) kc_softmax_xent_backward(dlogits, probs, labels, B, C, (float)dloss);
    else kc_softmax_xent_backward_f64(dlogits, probs, labels, B, C, dloss);
    return KILN_OK;
}

static int32_t cpu_sumsq_ex(kiln_instance *acc, uint32_t dtype, const void *x, size_t n, double *out) {
    int32_t rc = cpu_check_dtype(acc, "sumsq_ex", dtype);
    if (rc != KILN_OK) return rc;
    CPU_NEED(acc, x, n, "sumsq_ex");
    if (!out) return CPU_ERR(acc, KILN_E_INVALID_ARG, "sumsq_ex: out is NULL");
    *out = dtype == KILN_DTYPE_F32 ? kc_sumsq(x, n) : kc_sumsq_f64(x, n);
    return KILN_OK;
}

#if KILN_ABI_MINOR >= 9
/* 1.9: sumsq_ex per tensor. On the cpu there is no device to wait on, so
 * the list form is just the loop (and so the same bits). */
static int32_t cpu_sumsq_many(kiln_instance *acc, uint32_t dtype, const void *const *x, const size_t *n,
                              uint32_t count, double *out) {
    int32_t rc = cpu_check_dtype(acc, "sumsq_many", dtype);
    if (rc != KILN_OK) return rc;
    if ((rc = ack_tensor_list(CPU_SINK(acc), "sumsq_many", x, n, count)) != KILN_OK) return rc;
    if (count > 0 && !out)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "sumsq_many: out is NULL for count=%u", (unsigned)count);
    for (uint32_t i = 0; i < count; i++)
        out[i] = dtype == KILN_DTYPE_F32 ? kc_sumsq(x[i], n[i]) : kc_sumsq_f64(x[i], n[i]);
    return KILN_OK;
}
#endif

static int32_t cpu_all_finite_ex(kiln_instance *acc, uint32_t dtype, const void *x, size_t n, int32_t *finite) {
    int32_t rc = cpu_check_dtype(acc, "all_finite_ex", dtype);
    if (rc != KILN_OK) return rc;
    CPU_NEED(acc, x, n, "all_finite_ex");
    if (!finite) return CPU_ERR(acc, KILN_E_INVALID_ARG, "all_finite_ex: finite is NULL");
    *finite = dtype == KILN_DTYPE_F32 ? kc_all_finite(x, n) : kc_all_finite_f64(x, n);
    return KILN_OK;
}

static int32_t cpu_scale_ex(kiln_instance *acc, uint32_t dtype, void *x, double a, size_t n) {
    int32_t rc = cpu_check_dtype(acc, "scale_ex", dtype);
    if (rc != KILN_OK) return rc;
    CPU_NEED(acc, x, n, "scale_ex");
    if (dtype == KILN_DTYPE_F32) kc_scale(x, (float)a, n);
    else kc_scale_f64(x, a, n);
    return KILN_OK;
}

static int32_t cpu_axpy_ex(kiln_instance *acc, uint32_t dtype, void *y, double a, const void *x, size_t n) {
    int32_t rc = cpu_check_dtype(acc, "axpy_ex", dtype);
    if (rc != KILN_OK) return rc;
    CPU_NEED(acc, y, n, "axpy_ex");
    CPU_NEED(acc, x, n, "axpy_ex");
    if (dtype == KILN_DTYPE_F32) kc_axpy(y, (float)a, x, n);
    else kc_axpy_f64(y, a, x, n);
    return KILN_OK;
}

static int32_t cpu_sgd_update_ex(kiln_instance *acc, uint32_t dtype, void *p, const void *g, void *momentum_buf,
                                 size_t n, double lr, double momentum, double dampening, int32_t nesterov,
                                 double weight_decay, int32_t first_step) {
    int32_t rc = cpu_check_dtype(acc, "sgd_update_ex", dtype);
    if (rc != KILN_OK) return rc;
    CPU_NEED(acc, p, n, "sgd_update_ex");
    CPU_NEED(acc, g, n, "sgd_update_ex");
    /* As in sgd_update: momentum without a buffer would silently train
     * plain SGD. */
    if (momentum != 0.0) CPU_NEED(acc, momentum_buf, n, "sgd_update_ex (momentum != 0)");
    if (dtype == KILN_DTYPE_F32)
        kc_sgd_update(p, g, momentum_buf, n, (float)lr, (float)momentum, (float)dampening, nesterov != 0,
                      (float)weight_decay, first_step != 0);
    else
        kc_sgd_update_f64(p, g, momentum_buf, n, lr, momentum, dampening, nesterov != 0, weight_decay,
                          first_step != 0);
    return KILN_OK;
}

/* float32 goes through kc_adamw_update_d, the float kernel that takes the
 * hyperparameters as doubles (PyTorch's Python floats) and rounds each
 * derived scalar once, closer to PyTorch than rounding lr, betas and eps to
 * float first. */
static int32_t cpu_adamw_update_ex(kiln_instance *acc, uint32_t dtype, void *p, const void *g, void *m, void *v,
                                   size_t n, double lr, double beta1, double beta2, double eps, double weight_decay,
                                   int64_t step) {
    int32_t rc = cpu_check_dtype(acc, "adamw_update_ex", dtype);
    if (rc != KILN_OK) return rc;
    CPU_NEED(acc, p, n, "adamw_update_ex");
    CPU_NEED(acc, g, n, "adamw_update_ex");
    CPU_NEED(acc, m, n, "adamw_update_ex");
    CPU_NEED(acc, v, n, "adamw_update_ex");
    if (step < 1)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "adamw_update_ex: step is 1-based, got %lld", (long long)step);
    if (dtype == KILN_DTYPE_F32)
        kc_adamw_update_d(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    else
        kc_adamw_update_f64(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    return KILN_OK;
}

#if KILN_ABI_MINOR >= 10
/* 1.10: adamw_update_ex per tensor. Nothing here waits or launches, so
 * the list form is the loop, with the loop's bits. */
static int32_t cpu_adamw_update_many(kiln_instance *acc, uint32_t dtype, uint32_t count, void *const *p,
                                     const void *const *g, void *const *m, void *const *v, const size_t *n,
                                     const double *weight_decay, double lr, double beta1, double beta2, double eps,
                                     int64_t step) {
    int32_t rc = cpu_check_dtype(acc, "adamw_update_many", dtype);
    if (rc != KILN_OK) return rc;
    rc = ack_adamw_list(CPU_SINK(acc), "adamw_update_many", count, p, g, m, v, n, weight_decay, step);
    if (rc != KILN_OK) return rc;
    for (uint32_t i = 0; i < count; i++) {
        if (n[i] == 0) continue;
        if (dtype == KILN_DTYPE_F32)
            kc_adamw_update_d(p[i], g[i], m[i], v[i], n[i], lr, beta1, beta2, eps, weight_decay[i], step);
        else
            kc_adamw_update_f64(p[i], g[i], m[i], v[i], n[i], lr, beta1, beta2, eps, weight_decay[i], step);
    }
    return KILN_OK;
}
#endif

/* ------------------------------------------------------------ 1.3 fused */

/* Guarded so this file still builds against the 1.2 headers: the test
 * fixture libkiln-cpu12.so (tests/CMakeLists.txt) is this plugin as a 1.2
 * accelerator, for the 1.3 consumers' fallback paths. */
#if KILN_ABI_MINOR >= 3

/* One pass of scale_ex then all_finite_ex per tensor: on the cpu there is
 * no device to wait on, so the list form is just the loop. */
static int32_t cpu_unscale_check(kiln_instance *acc, uint32_t dtype, void *const *x, const size_t *n, uint32_t count,
                                 double a, int32_t *finite) {
    int32_t rc = cpu_check_dtype(acc, "unscale_check", dtype);
    if (rc != KILN_OK) return rc;
    if (!finite) return CPU_ERR(acc, KILN_E_INVALID_ARG, "unscale_check: finite is NULL");
    if ((rc = ack_tensor_list(CPU_SINK(acc), "unscale_check", (const void *const *)x, n, count)) != KILN_OK) return rc;
    int ok = 1;
    for (uint32_t i = 0; i < count; i++) {
        if (n[i] == 0) continue;
        if (dtype == KILN_DTYPE_F32) {
            kc_scale(x[i], (float)a, n[i]);
            ok &= kc_all_finite(x[i], n[i]);
        } else {
            kc_scale_f64(x[i], a, n[i]);
            ok &= kc_all_finite_f64(x[i], n[i]);
        }
    }
    *finite = ok;
    return KILN_OK;
}

/* linear_forward and (1.6) linear_forward_layout, the reference the cuda
 * accelerator's cuBLASLt epilogues are compared with: the unfused sequence
 * the ABI comment names, one rounding after the bias, so the results are
 * its bits. w_layout 1 is w (in, out) (Conv1D), 0 w (out, in). The
 * all-fp32 case takes gemm's own path, so a module moving from gemm +
 * bias_add + act to this entry computes the same bits. */
static int32_t cpu_linear(kiln_instance *acc, const char *fn, uint32_t dtype, const void *x, const void *w,
                          uint32_t w_dtype, int32_t w_layout, const void *b, int32_t rows, int32_t in, int32_t out,
                          int32_t act, void *y, void *post, uint32_t round_dtype) {
    int go = 0;
    int32_t rc = ack_linear(CPU_SINK(acc), fn, dtype, x, w, w_dtype, w_layout, rows, in, out, act, y, post,
                            round_dtype, &go);
    if (rc != KILN_OK || !go) return rc;
    const int32_t lay = ack_layout(w_layout); /* without 1.8's KILN_LAYOUT_ROUND_BIAS */
#if KILN_ABI_MINOR >= 7
    /* 1.8's rounded bias and 1.7's 16-bit storage: the plain float32 call
     * on copies in acc->stage ([bias (out)] [x (rows, in)] [y] [post]), its
     * outputs rounded into place as they are stored. */
    const int rb = ack_round_bias(w_layout) && b;
    if (ack_act16(dtype) || rb) {
        const int s16 = ack_act16(dtype);
        const size_t nb = rb ? (size_t)out : 0, nx = (size_t)rows * (size_t)in, ny = (size_t)rows * (size_t)out;
        if ((rc = cpu_reserve_stage(acc, nb + (s16 ? nx + ny * (act >= 0 ? 2 : 1) : 0))) != KILN_OK) return rc;
        if (rb) { /* autocast's cast of the bias, as a 16-bit store would keep it */
            memcpy(acc->stage, b, nb * sizeof(float));
            if ((rc = cpu_round_to(acc, acc->stage, round_dtype, nb)) != KILN_OK) return rc;
            b = acc->stage;
        }
        if (!s16) return cpu_linear(acc, fn, dtype, x, w, w_dtype, lay, b, rows, in, out, act, y, post, round_dtype);
        float *xs = acc->stage + nb, *ys = xs + nx, *ps = act >= 0 ? ys + ny : NULL;
        kc_cast(xs, KC_F32, x, (int)dtype, nx);
        rc = cpu_linear(acc, fn, KILN_DTYPE_F32, xs, w, w_dtype, lay, b, rows, in, out, act, ys, ps, dtype);
        if (rc != KILN_OK) return rc;
        kc_cast(y, (int)dtype, ys, KC_F32, ny);
        if (ps) kc_cast(post, (int)dtype, ps, KC_F32, ny);
        return KILN_OK;
    }
#endif
    const int r16 = round_dtype == KILN_DTYPE_F16 || round_dtype == KILN_DTYPE_BF16;
    const size_t ny = (size_t)rows * (size_t)out;
    const int in_out = lay == 1; /* KILN_LAYOUT_IN_OUT: Conv1D */
    const int32_t ld = in > 0 ? in : 1; /* in == 0: y = b, and gemm wants ld >= 1 */
    const int32_t ldw = in_out ? out : ld;
    if (dtype == KILN_DTYPE_F32 && w_dtype == KILN_DTYPE_F32)
        rc = cpu_gemm(acc, 0, !in_out, rows, out, in, 1.0f, x, ld, w, ldw, 0.0f, y, out);
    else
        rc = cpu_gemm_ex(acc, 0, !in_out, rows, out, in, 1.0, x, dtype, ld, w, w_dtype, ldw, 0.0, y, dtype, out,
                         KILN_DTYPE_F32);
    if (rc == KILN_OK && b) rc = cpu_bias_add_ex(acc, dtype, y, b, rows, out);
    if (rc == KILN_OK && r16) rc = cpu_round_to(acc, y, round_dtype, ny);
    if (rc != KILN_OK || act < 0) return rc;
    if (dtype == KILN_DTYPE_F32) cpu_act_f32[act](post, y, ny);
    else cpu_act_f64[act](post, y, ny);
    return r16 ? cpu_round_to(acc, post, round_dtype, ny) : KILN_OK;
}

static int32_t cpu_linear_forward(kiln_instance *acc, uint32_t dtype, const void *x, const void *w, uint32_t w_dtype,
                                  const void *b, int32_t rows, int32_t in, int32_t out, int32_t act, void *y,
                                  void *post, uint32_t round_dtype) {
    return cpu_linear(acc, "linear_forward", dtype, x, w, w_dtype, 0, b, rows, in, out, act, y, post, round_dtype);
}
#endif /* KILN_ABI_MINOR >= 3 */

#if KILN_ABI_MINOR >= 6
static int32_t cpu_linear_forward_layout(kiln_instance *acc, uint32_t dtype, const void *x, const void *w,
                                         uint32_t w_dtype, int32_t w_layout, const void *b, int32_t rows, int32_t in,
                                         int32_t out, int32_t act, void *y, void *post, uint32_t round_dtype) {
    return cpu_linear(acc, "linear_forward_layout", dtype, x, w, w_dtype, w_layout, b, rows, in, out, act, y, post,
                      round_dtype);
}
#endif

#if KILN_ABI_MINOR >= 5
/* ------------------------------------- 1.5: elementwise building blocks */

static_assert((int)KC_F32 == (int)KILN_DTYPE_F32 && (int)KC_F64 == (int)KILN_DTYPE_F64, "kc_ew dtypes");
static_assert((int)KC_F8E4M3 == (int)KILN_DTYPE_F8E4M3 && (int)KC_F8E5M2 == (int)KILN_DTYPE_F8E5M2, "fp8 dtypes");

/* Every 1.5 elementwise entry: the checks the cuda plugin makes too
 * (ack_ew: dtype, NULL pointers, y an input's very pointer or apart from
 * it), then kc_ew. an/bn name the inputs in messages; bn NULL: unary. */
static int32_t cpu_ew(kiln_instance *acc, const char *fn, int op, uint32_t dtype, void *y, const void *a,
                      const char *an, const void *b, const char *bn, double s0, double s1, size_t n) {
    int go = 0;
    int32_t rc = ack_ew(CPU_SINK(acc), fn, dtype, y, a, an, b, bn, n, &go);
    if (rc != KILN_OK || !go) return rc;
    kc_ew(op, (int)dtype, y, a, bn ? b : NULL, s0, s1, n);
    return KILN_OK;
}

/* lerp, sign, mul, addcmul, addcdiv, sqrt_ex, clamp */
ACK_DEFINE_EW_ENTRIES(cpu_, cpu_ew, KC_EW_, CPU_SINK)
#endif /* KILN_ABI_MINOR >= 5 */

static const kiln_kernels cpu_kernel_table = {
    .struct_size = sizeof(kiln_kernels),
#if KILN_ABI_MINOR >= 8 /* tests build this file against older headers too (libkiln-cpu15, -cpu16, -cpu17) */
    .flags = KILN_KERNELS_HOST_MEMORY | KILN_KERNELS_STORE_16BIT | KILN_KERNELS_ACT_16BIT | KILN_KERNELS_BIAS_ROUND,
#elif KILN_ABI_MINOR >= 7
    .flags = KILN_KERNELS_HOST_MEMORY | KILN_KERNELS_STORE_16BIT | KILN_KERNELS_ACT_16BIT,
#elif KILN_ABI_MINOR >= 6
    .flags = KILN_KERNELS_HOST_MEMORY | KILN_KERNELS_STORE_16BIT,
#else
    .flags = KILN_KERNELS_HOST_MEMORY, /* cpu "device" memory is host memory */
#endif
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .synchronize = cpu_synchronize,
    .gemm = cpu_gemm,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .softmax_xent_forward = cpu_softmax_xent_forward,
    .softmax_xent_backward = cpu_softmax_xent_backward,
    .sum = cpu_sum,
    .sumsq = cpu_sumsq,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .all_finite = cpu_all_finite,
    .sgd_update = cpu_sgd_update,
    .adamw_update = cpu_adamw_update,
    /* 1.2 */
    .cast = cpu_cast,
    .round_to = cpu_round_to,
    .gemm_ex = cpu_gemm_ex,
    .bias_add_ex = cpu_bias_add_ex,
    .bias_grad_ex = cpu_bias_grad_ex,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .softmax_xent_forward_ex = cpu_softmax_xent_forward_ex,
    .softmax_xent_backward_ex = cpu_softmax_xent_backward_ex,
    .sumsq_ex = cpu_sumsq_ex,
    .all_finite_ex = cpu_all_finite_ex,
    .scale_ex = cpu_scale_ex,
    .axpy_ex = cpu_axpy_ex,
    .sgd_update_ex = cpu_sgd_update_ex,
    .adamw_update_ex = cpu_adamw_update_ex,
#if KILN_ABI_MINOR >= 3
    .unscale_check = cpu_unscale_check,
    .linear_forward = cpu_linear_forward,
#endif
#if KILN_ABI_MINOR >= 4
    /* 1.4: cpu_accel_seq.c */
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .xent_fused = cpu_xent_fused,
    .add = cpu_add,
#endif
#if KILN_ABI_MINOR >= 5
    /* 1.5: elementwise building blocks */
    .lerp = cpu_lerp,
    .sign = cpu_sign,
    .mul = cpu_mul,
    .addcmul = cpu_addcmul,
    .addcdiv = cpu_addcdiv,
    .sqrt_ex = cpu_sqrt_ex,
    .clamp = cpu_clamp,
#endif
#if KILN_ABI_MINOR >= 6
    .linear_forward_layout = cpu_linear_forward_layout,
#endif
#if KILN_ABI_MINOR >= 9
    .sumsq_many = cpu_sumsq_many,
#endif
#if KILN_ABI_MINOR >= 10
    .adamw_update_many = cpu_adamw_update_many,
    .add_layernorm_forward = cpu_add_layernorm_forward,
#endif
#if KILN_ABI_MINOR >= 11
    .act_bias_backward = cpu_act_bias_backward,
    .layernorm_backward_cast = cpu_layernorm_backward_cast,
#endif
};
/* The table is built with this header's size: every entry above is set, and
 * a caller checks struct_size against KILN_KERNELS_SIZE_1_11 (1_10, 1_9,
 * 1_6, 1_5, 1_3 and 1_2 in the fixtures built against the frozen 1.10 ...
 * 1.2 headers). */
#if KILN_ABI_MINOR >= 11
static_assert(sizeof(kiln_kernels) == KILN_KERNELS_SIZE_1_11, "kiln_kernels is ABI 1.11's");
#elif KILN_ABI_MINOR >= 10
static_assert(sizeof(kiln_kernels) == KILN_KERNELS_SIZE_1_10, "kiln_kernels is ABI 1.10's");
#elif KILN_ABI_MINOR >= 9
static_assert(sizeof(kiln_kernels) == KILN_KERNELS_SIZE_1_9, "kiln_kernels is ABI 1.9's");
#elif KILN_ABI_MINOR >= 6
static_assert(sizeof(kiln_kernels) == KILN_KERNELS_SIZE_1_6, "kiln_kernels is ABI 1.6's");
#elif KILN_ABI_MINOR >= 5
static_assert(sizeof(kiln_kernels) == KILN_KERNELS_SIZE_1_5, "kiln_kernels is ABI 1.5's");
#elif KILN_ABI_MINOR >= 4
static_assert(sizeof(kiln_kernels) == KILN_KERNELS_SIZE_1_4, "kiln_kernels is ABI 1.4's");
#elif KILN_ABI_MINOR >= 3
static_assert(sizeof(kiln_kernels) == KILN_KERNELS_SIZE_1_3, "kiln_kernels is ABI 1.3's");
#else
static_assert(sizeof(kiln_kernels) == KILN_KERNELS_SIZE_1_2, "kiln_kernels is ABI 1.2's");
#endif

/* --------------------------------------------------------------- instance */

/* OpenBLAS fell back to its generic SSE3 kernels on a CPU with wider
 * vectors (it did not recognise the model): its GEMMs run at a fraction of
 * what the CPU can do. */
static int cpu_openblas_degraded(void) {
    const char *core = openblas_get_corename();
    return core && !strcmp(core, "Prescott") && __builtin_cpu_supports("avx2");
}

/* The `blas` key: which library computes the GEMMs (process-wide, chosen
 * before the first GEMM). "auto" keeps OpenBLAS unless it runs degraded
 * and BLIS is installed. */
static int32_t cpu_pick_blas(const kiln_host_services *svc, kiln_host_ctx *hctx, const char *want) {
    char err[256] = "";
    if (!strcmp(want, "openblas")) {
        if (strncmp(kc_blas_name(), "OpenBLAS", 8) != 0)
            kiln_logf(svc, hctx, KILN_LOG_WARN, "cpu: blas = \"openblas\" asked for, but this process already "
                                                "computes its GEMMs with %s", kc_blas_name());
        return KILN_OK;
    }
    if (!strcmp(want, "blis")) {
        if (kc_blas_use_blis(err, sizeof err) != 0)
            return kiln_errorf(svc, hctx, KILN_E_UNSUPPORTED, "cpu: blas = \"blis\": %s", err);
    } else if (!strcmp(want, "auto")) {
        if (!cpu_openblas_degraded()) return KILN_OK;
#if defined(__SANITIZE_ADDRESS__)
        /* An AddressSanitizer build stays with OpenBLAS: LeakSanitizer's
         * exit-time thread suspension crashes reading the thread-local
         * storage of a library dlopen'd after other threads started
         * (OpenBLAS's, which exist from its load), as BLIS is. blas =
         * "blis" still loads it there. */
        kiln_logf(svc, hctx, KILN_LOG_DEBUG, "cpu: blas = auto: OpenBLAS in a sanitizer build");
        return KILN_OK;
#endif
        if (kc_blas_use_blis(err, sizeof err) != 0) {
            kiln_logf(svc, hctx, KILN_LOG_DEBUG, "cpu: blas = auto: staying with OpenBLAS: %s", err);
            return KILN_OK;
        }
        kiln_logf(svc, hctx, KILN_LOG_INFO,
                  "cpu: GEMMs through %s: OpenBLAS (%s) would use its generic Prescott kernels on this CPU "
                  "(blas = \"openblas\" keeps it)",
                  kc_blas_name(), openblas_get_config());
        return KILN_OK;
    } else {
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "cpu: blas must be \"auto\", \"openblas\" or \"blis\", got \"%s\"",
                           want);
    }
    kiln_logf(svc, hctx, KILN_LOG_DEBUG, "cpu: GEMMs through %s", kc_blas_name());
    return KILN_OK;
}

static int32_t cpu_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                          const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    /* process-wide, like torch.set_flush_denormal (one accelerator a run) */
    kc_set_flush_denormal(kiln_kv_int(config, "flush_denormal", 1) != 0);
    int32_t brc = cpu_pick_blas(svc, hctx, kiln_kv_str(config, "blas", "auto"));
    if (brc != KILN_OK) return brc;
    kiln_instance *acc = calloc(1, sizeof *acc);
    if (!acc) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "cpu: cannot allocate the accelerator instance");
    acc->svc = svc;
    acc->hctx = hctx;
    acc->threads = kc_get_num_threads();
    cpu_live_instances++;
    *out = acc;
    return KILN_OK;
}

/* The last instance stops the kernels' worker threads, so none is left
 * sleeping when the host shuts down (the library itself is never unloaded,
 * and KILN_DEFINE_LIBRARY offers no library_fini to do it there). */
static void cpu_destroy(kiln_instance *acc) {
    if (!acc) return;
    if (--cpu_live_instances == 0) kc_set_num_threads(1);
    free(acc->ws);
#if KILN_ABI_MINOR >= 7
    free(acc->stage);
#endif
    free(acc);
}

static const kiln_kernels *cpu_kernels(kiln_instance *acc) {
    (void)acc;
    return &cpu_kernel_table;
}

/* CPUs this process may run on: the affinity mask (what taskset, cgroups'
 * cpusets or mpirun's binding allow), else every online CPU. Counting online
 * CPUs alone would oversubscribe a process bound to a few cores. */
static int cpu_available_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n < 4096 ? n : 4096) : 1;
}

/* threads: 0 means every available CPU. Both pools get the same count; they
 * never run at the same time (a GEMM and an elementwise kernel are called one
 * after the other), so they do not oversubscribe each other. local_rank
 * selects a device on GPUs and has no meaning for host memory. */
/* OpenBLAS picks its kernels from the CPUID it recognises; an older build on
 * a newer (or virtualised) CPU falls back to its generic SSE3 "Prescott"
 * kernels, several times slower than the AVX2/AVX-512 ones the CPU has (3.3x
 * on the machine docs/benchmarks.md reports). The choice is made when
 * OpenBLAS loads, before any plugin code runs, so all we can do is say so. */
static void cpu_check_blas_core(kiln_instance *acc) {
    const char *core = openblas_get_corename();
    if (!core || strcmp(core, "Prescott") != 0) return;
    if (strncmp(kc_blas_name(), "OpenBLAS", 8) != 0) return; /* BLIS computes the GEMMs */
    const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : NULL;
    if (better)
        kiln_logf(acc->svc, acc->hctx, KILN_LOG_WARN,
                  "cpu: OpenBLAS (%s) did not recognise this CPU and uses its generic Prescott kernels although the "
                  "CPU has %s; install BLIS (libblis4-serial; blas = \"auto\" then uses it) or set OPENBLAS_CORETYPE=%s "
                  "in the environment for much faster matrix multiplies",
                  openblas_get_config(), better[0] == 'S' ? "AVX-512" : "AVX2", better);
}

static int32_t cpu_configure(kiln_instance *acc, int32_t threads, int32_t local_rank) {
    if (threads < 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "configure: threads must be >= 0 (0: all CPUs), got %d",
                       (int)threads);
    if (local_rank < 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "configure: local_rank must be >= 0, got %d", (int)local_rank);
    int n = threads == 0 ? cpu_available_cpus() : threads;
    /* kc_gemm splits large GEMMs across kiln's pool (see kernels/cpu/cpu_gemm.c):
     * OpenBLAS runs one thread per call, so its spinning workers never
     * compete with ours. */
    openblas_set_num_threads(1);
    int got = kc_set_num_threads(n);
    if (got < n)
        kiln_logf(acc->svc, acc->hctx, KILN_LOG_WARN,
                  "cpu: asked for %d kernel threads, running with %d (thread creation failed or above the "
                  "kernels' limit)",
                  n, got);
    acc->threads = got;
    kiln_logf(acc->svc, acc->hctx, KILN_LOG_DEBUG, "cpu: %d kernel threads, GEMMs through %s, one BLAS thread per "
              "call (OpenBLAS core %s)", got, kc_blas_name(), openblas_get_corename());
    cpu_check_blas_core(acc);
    return KILN_OK;
}

static const kiln_accelerator_ops cpu_ops = {
    .base = {sizeof(kiln_accelerator_ops), 0, cpu_create, cpu_destroy, NULL, NULL},
    .kernels = cpu_kernels,
    .configure = cpu_configure,
};

static const kiln_param cpu_params[] = {
    {"flush_denormal", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1),
     "SGD/AdamW updates flush subnormal state to zero (torch.set_flush_denormal(True)); false: IEEE, slower "
     "when state decays"},
    {"blas", KILN_TYPE_STRING, 0, KILN_V_STR("auto"),
     "library of the GEMMs: auto (OpenBLAS, or BLIS where OpenBLAS would run its generic kernels) | openblas | "
     "blis (libblis4-serial)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const cpu_checks[] = {"blas in {auto, openblas, blis}"};
static const kiln_kv cpu_props[] = {{"device_type", KILN_V_STR("cpu")},
                                    {"default", KILN_V_BOOL(1)}, /* the accelerator when none is named */
                                    {"config_checks", KILN_V_STRS(cpu_checks)},
                                    {NULL, KILN_V_NONE}};

/* Deterministic: the kernels give the same bits for any thread split, and
 * OpenBLAS's SGEMM is reproducible for a fixed thread count. */
static const kiln_plugin_desc cpu_desc = {
    sizeof(kiln_plugin_desc),
    KILN_KIND_ACCELERATOR,
    "cpu",
    "0.1.0",
    "host memory; OpenBLAS GEMM and threaded C kernels",
    KILN_CAP_DETERMINISTIC,
    cpu_props,
    cpu_params,
    &cpu_ops,
    NULL,
};

KILN_DEFINE_LIBRARY("cpu", "0.1.0", 1, &cpu_desc)
