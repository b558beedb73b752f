/*
 * cpu_kernels.h: the CPU numeric kernels kiln's CPU backend trains with: GEMM
 * (through OpenBLAS) with a naive double-accumulating reference, bias add and
 * its gradient, ReLU/GELU/tanh/sigmoid/leaky-ReLU forward and backward, fused
 * softmax + cross-entropy, reductions and BLAS-1 helpers, and the SGD / AdamW
 * parameter updates with PyTorch's single-tensor semantics. Every tensor is
 * float32 and row-major unless a comment says otherwise. No kernel allocates:
 * the caller owns all memory. Kernels that cannot fail return void; the only
 * failure a kernel can see in its data (an out-of-range label) is reported
 * through the result (NAN).
 * Large elementwise, reduction and optimizer loops may be split across a small
 * persistent thread pool (kc_set_num_threads); the split never changes any
 * result bit, because every element is computed by the same arithmetic and
 * reductions use a block decomposition that depends on n only.
 * Besides float32 there are conversions to and from float16, bfloat16 (both
 * stored as uint16_t bit patterns) and float64, in-place rounding of float32
 * arrays through the 16-bit formats (to emulate reduced-precision storage),
 * a mixed-dtype GEMM, and float64 versions of every training kernel with the
 * float ones' semantics (the *_f64 functions).
 */
#ifndef KILN_KERNELS_CPU_KERNELS_H
#define KILN_KERNELS_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- threads */

/*
 * Sets how many threads (the caller included) the kernels may use for large
 * loops; n < 1 is treated as 1, n above 64 as 64. n == 1 stops and joins the
 * pool's workers (do this before the library that contains the kernels is
 * dlclose()d). Idle workers sleep on a condition variable; they never spin.
 * (The library's destructor also joins them, unless a kernel is running.)
 * Must not be called from inside a kernel. Returns the count now in effect,
 * which is lower than n only if creating a worker thread failed (the int
 * return is the only failure report; callers may ignore it). Loops split
 * only above ~32K elements per thread (8K for GELU and the optimizers).
 * GEMM threading is OpenBLAS's own (openblas_set_num_threads or
 * OPENBLAS_NUM_THREADS) and is not changed here. Note that OpenBLAS's pthread
 * workers spin for a while after each GEMM (OPENBLAS_THREAD_TIMEOUT); on a
 * 2-core machine that steals the core these kernels' worker needs, so a host
 * using both should set a small timeout in the environment before OpenBLAS
 * loads (OPENBLAS_THREAD_TIMEOUT=4).
 */
int kc_set_num_threads(int n);
/* The count set by kc_set_num_threads (1 when it was never called). */
int kc_get_num_threads(void);

/* ------------------------------------------------------------------- BLAS */

/*
 * Makes every GEMM of the kernels run on BLIS (Debian's libblis4-serial,
 * loaded with dlopen) instead of the linked OpenBLAS. Call once, before any
 * GEMM. Returns 0, or -1 with a one-line reason in err when BLIS cannot be
 * loaded (OpenBLAS then stays). Why: cpu_blas.c.
 */
int kc_blas_use_blis(char *err, size_t errlen);
/* "OpenBLAS", or "BLIS 0.9.0 (skx kernels)" once BLIS is in use. */
const char *kc_blas_name(void);

/* ------------------------------------------------------------------- GEMM */

/*
 * C = alpha * op(A) * op(B) + beta * C, through cblas_sgemm (row-major).
 *   op(A): (M, K); A is (M, K) with lda >= K when trans_a == 0,
 *          (K, M) with lda >= M when trans_a != 0.
 *   op(B): (K, N); B is (K, N) with ldb >= N when trans_b == 0,
 *          (N, K) with ldb >= K when trans_b != 0.
 *   C:     (M, N) with ldc >= N.
 * As in BLAS, C is not read when beta == 0 (NaN there is overwritten). K == 0
 * gives C = beta * C. M, N or K negative, or M == 0 or N == 0: nothing done.
 */
void kc_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
             const float *A, int lda, const float *B, int ldb, float beta,
             float *C, int ldc);

/* Same contract as kc_gemm, computed by a naive triple loop accumulating in
 * double; slow, for tests only. */
void kc_gemm_ref(int trans_a, int trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta,
                 float *C, int ldc);

/* y += b broadcast over rows. y: (rows, cols); b: (cols). */
void kc_bias_add(float *y, const float *b, int rows, int cols);

/* db = (accumulate ? db : 0) + sum over rows of dy, accumulated in float row
 * by row (error grows like rows * FLT_EPSILON relative to sum |dy|).
 * db: (cols); dy: (rows, cols). */
void kc_bias_grad(float *db, const float *dy, int rows, int cols, int accumulate);

/* ------------------------------------------------------------ elementwise */

/* y = x < 0 ? 0 : x (NaN stays NaN, as in torch.relu). y, x: (n); y may
 * equal x (in place), no other overlap. */
void kc_relu_forward(float *y, const float *x, size_t n);

/* dx = x > 0 ? dy : 0 (NaN x gives 0). dx, dy, x: (n); dx may equal dy
 * (in place), no other overlap. */
void kc_relu_backward(float *dx, const float *dy, const float *x, size_t n);

/*
 * y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), the tanh
 * approximation (PyTorch approximate='tanh', GPT-2). Evaluated through the
 * identity 0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u)) with an inlined
 * polynomial exp so the loop vectorizes; agrees with the tanh form to a few
 * float ulps, and has no cancellation for negative x. NaN propagates.
 * y, x: (n); y may equal x (in place), no other overlap.
 */
void kc_gelu_forward(float *y, const float *x, size_t n);

/* dx = dy * d gelu(x) / dx for the same approximation. dx, dy, x: (n); dx may
 * equal dy (in place), no other overlap. */
void kc_gelu_backward(float *dx, const float *dy, const float *x, size_t n);

/*
 * The GAN activations (cpu_train.inc). Each backward takes the forward INPUT x:
 * dx = dy * f'(x). All stay finite for any finite or infinite x and
 * propagate NaN; accurate to a few float ulps, including the tails (sigmoid
 * of very negative x comes out as the tiny, possibly subnormal, true value,
 * not 0 or a clamp). Same aliasing rules as ReLU: y may equal x, dx may
 * equal dy, no other overlap. y, x, dx, dy: (n).
 *   tanh:       y = tanh(x); tanh'(x) = 4e / (1 + e)^2, e = exp(-2|x|)
 *   sigmoid:    y = 1 / (1 + exp(-x)); sigmoid'(x) = e / (1 + e)^2, e = exp(-|x|)
 *   leaky ReLU: y = x > 0 ? x : 0.2 x; dx = x > 0 ? dy : 0.2 dy (torch's
 *               negative_slope = 0.2; NaN x gives NaN y and 0.2 dy)
 */
void kc_tanh_forward(float *y, const float *x, size_t n);
void kc_tanh_backward(float *dx, const float *dy, const float *x, size_t n);
void kc_sigmoid_forward(float *y, const float *x, size_t n);
void kc_sigmoid_backward(float *dx, const float *dy, const float *x, size_t n);
void kc_leaky_relu_forward(float *y, const float *x, size_t n);
void kc_leaky_relu_backward(float *dx, const float *dy, const float *x, size_t n);

/* ------------------------------------------------------------------- loss */

/*
 * Fused softmax + mean cross-entropy.
 *   logits: (B, C); labels: (B), each in [0, C); probs: (B, C) output, not
 *   overlapping logits.
 * probs = softmax(logits) per row, computed with the row max subtracted so
 * logits of any magnitude stay finite. Returns the mean over rows of
 * -log p[label], computed in double as log(sum exp(l - max)) + max - l[label]
 * (finite even when p[label] underflows to 0). *n_correct (if non-NULL)
 * receives the number of rows whose argmax (first maximum on ties) equals
 * the label. If any label is outside [0, C), or B or C is < 1, the return is
 * NAN; probs is still filled for every row and n_correct counts only rows
 * with a valid label. NaN logits give NaN probs and a NaN loss.
 */
float kc_softmax_xent_forward(float *probs, const float *logits,
                              const int32_t *labels, int B, int C, int *n_correct);

/*
 * dlogits = dloss * (probs - onehot(labels)) / B, the gradient of
 * dloss * (mean loss) w.r.t. logits. dloss is the incoming gradient of the
 * mean loss (typically 1/accumulation_steps or the loss scale).
 *   probs: (B, C) from kc_softmax_xent_forward; labels: (B); dlogits: (B, C),
 *   which may equal probs (in place). Rows whose label is outside [0, C) are
 *   filled with NaN so that an unchecked bad label cannot train silently.
 */
void kc_softmax_xent_backward(float *dlogits, const float *probs,
                              const int32_t *labels, int B, int C, float dloss);

/* ------------------------------------------------- reductions and BLAS-1 */

/* Sum of x: (n), accumulated in double. The summation order depends on n
 * only, so the result is identical for every thread count. */
double kc_sum(const float *x, size_t n);
/* Sum of squares of x: (n), accumulated in double; same determinism. */
double kc_sumsq(const float *x, size_t n);
/* x *= a. x: (n). */
void kc_scale(float *x, float a, size_t n);
/* y += a * x (a * x rounded, then added: no fused multiply-add).
 * y, x: (n), not overlapping. */
void kc_axpy(float *y, float a, const float *x, size_t n);

/* memset(p, 0, bytes), split across the pool for large buffers. */
void kc_zero(void *p, size_t bytes);
/* 1 if every element of x: (n) is finite (no NaN, no +-inf), else 0.
 * n == 0 gives 1. */
int kc_all_finite(const float *x, size_t n);

/* -------------------------------------------------------------- optimizers */

/* Both updates run with subnormals flushed to zero (FTZ/DAZ, as under
 * torch.set_flush_denormal(True)): any value below 2^-126 (1.2e-38) in
 * magnitude, read or produced, counts as 0. State that decays where the
 * gradient is zero would otherwise sit in the subnormal range for hundreds
 * of steps at several hundred cycles per access (cpu_internal.h,
 * kc_ftz_begin). All other results are PyTorch's, bit for bit.
 * kc_set_flush_denormal(0) keeps IEEE gradual underflow in them too
 * (PyTorch's default, bit for bit also below 2^-126); process-wide, set it
 * before the updates run. */
void kc_set_flush_denormal(int on);

/*
 * One step of torch.optim.SGD (foreach=False, maximize=False) on one tensor,
 * in PyTorch's order of operations:
 *   g' = g + weight_decay * p                       (when weight_decay != 0)
 *   if momentum != 0:
 *     buf = first_step ? g' : momentum * buf + (1 - dampening) * g'
 *     g'  = nesterov ? g' + momentum * buf : buf
 *   p = p + (-lr) * g'
 * p, g, momentum_buf: (n), not overlapping; momentum_buf may be NULL when
 * momentum == 0 (it is then not touched). first_step != 0 means the buffer
 * does not exist yet (PyTorch clones g' into it).
 */
void kc_sgd_update(float *p, const float *g, float *momentum_buf, size_t n,
                   float lr, float momentum, float dampening, int nesterov,
                   float weight_decay, int first_step);

/*
 * One step of torch.optim.AdamW (amsgrad=False, maximize=False, the
 * single-tensor path) on one tensor; step is the 1-based step count after
 * the increment. In PyTorch's order:
 *   p *= 1 - lr * weight_decay
 *   m.lerp_(g, 1 - beta1)        m + w * (g - m)   (w < 0.5; else
 *                                g - (g - m) * (1 - w))
 *   v = v * beta2 + ((1 - beta2) * g) * g
 *   bc1 = 1 - beta1^step; bc2 = 1 - beta2^step; step_size = lr / bc1
 *   denom = sqrt(v) / sqrt(bc2) + eps
 *   p = p + ((-step_size) * m) / denom
 * Scalars (1 - lr*wd, 1 - beta1, the bias corrections, step_size) are formed
 * in double and rounded once to float, as PyTorch forms them from Python
 * floats. Differences from PyTorch's results come only from (a) PyTorch's
 * vectorized CPU loops fusing some multiply-adds, which this code never does,
 * and (b) the float hyperparameters: (float)0.999 is not 0.999, so 1 - beta2
 * differs from PyTorch's by ~1e-5 relative; use kc_adamw_update_d to pass the
 * hyperparameters as the doubles Python would hold.
 * p, g, m, v: (n), not overlapping; step < 1 is treated as 1.
 */
void kc_adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps,
                     float weight_decay, int64_t step);

/* kc_adamw_update with double hyperparameters, for bit-level fidelity to
 * PyTorch's Python-float hyperparameters (e.g. beta2 = 0.999 exactly as
 * parsed from a config). Same per-element arithmetic. */
void kc_adamw_update_d(float *p, const float *g, float *m, float *v, size_t n,
                       double lr, double beta1, double beta2, double eps,
                       double weight_decay, int64_t step);

/* ------------------------------------------------------------------ dtypes */

/*
 * The floating-point element types of the mixed-precision kernels. The
 * numbers are KILN_DTYPE_F32/F64/F16/BF16's (kiln/tensor.h), so a plugin can
 * pass the ABI's dtype through; this library does not include the SDK.
 * F16 and BF16 data are uint16_t bit patterns (IEEE binary16; the top half of
 * a binary32).
 */
enum { KC_F32 = 1, KC_F64 = 2, KC_F16 = 3, KC_BF16 = 4 };

/* Bytes per element of a KC_* dtype; 0 for anything else. */
size_t kc_dtype_bytes(int dtype);

/*
 * Conversions, dst(n) = src(n), not overlapping. Every narrowing conversion
 * rounds to nearest, ties to even, exactly once (no double rounding, also
 * from float64 to the 16-bit formats); overflow gives +-inf, values below a
 * format's range become its subnormals or +-0 (float16 keeps subnormals down
 * to 2^-24), NaN stays a quiet NaN (never inf) and keeps its sign. Widening
 * conversions are exact. float16 uses the compiler's _Float16 (the F16C
 * instructions when the CPU has them, else libgcc's software conversion),
 * or integer arithmetic with a compiler that has none (clang 14): the same
 * bits every way; bfloat16 is rounded by integer arithmetic on the
 * float32 bits.
 */
void kc_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void kc_f16_to_f32(float *dst, const uint16_t *src, size_t n);
void kc_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void kc_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
void kc_f32_to_f64(double *dst, const float *src, size_t n);
void kc_f64_to_f32(float *dst, const double *src, size_t n);

/* dst(n) = src(n) between any two of KC_F32, KC_F64, KC_F16, KC_BF16 with
 * the rounding rules above (equal dtypes: a copy; dst == src with equal
 * dtypes: nothing to do). Other overlap is not allowed. Returns 0, or -1 for
 * a dtype outside that list (nothing written). */
int kc_cast(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n);

/* x(n) = (float)(fp16)x, in place: the float32 value that storing x as
 * float16 would keep (same rounding as kc_f32_to_f16). */
void kc_round_f16(float *x, size_t n);
/* x(n) = (float)(bf16)x, in place (same rounding as kc_f32_to_bf16). */
void kc_round_bf16(float *x, size_t n);

/*
 * The OCP 8-bit formats (cpu_fp8.c; numbers KILN_DTYPE_F8E4M3/F8E5M2):
 * x(n) float32 rounded in place through KC_F8E4M3 or KC_F8E5M2 — round to
 * nearest even, finite overflow saturating to +-max (448, 57344), NaN kept,
 * +-inf kept in E5M2 and NaN in E4M3 (kernels/common/km_fp8.h says why).
 * Returns 0, or -1 for another dtype (nothing written). The scalar codecs
 * are for tests and the fake CUDA stack.
 */
enum { KC_F8E4M3 = 8, KC_F8E5M2 = 9 };
int kc_round_fp8(float *x, int dtype, size_t n);
uint8_t kc_f8e4m3_bits(float x);
uint8_t kc_f8e5m2_bits(float x);
float kc_f8e4m3_value(uint8_t c);
float kc_f8e5m2_value(uint8_t c);

/* ------------------------------------------- elementwise building blocks */

/*
 * The ABI 1.5 elementwise entries (cpu_ew.c), one call for all of them, on
 * dtype KC_F32 or KC_F64 data of n elements; formulas in
 * kernels/common/km_ew.h (kiln/training.h states them):
 *   KC_EW_LERP     y = lerp(a, b, weight = s0)        (torch.lerp)
 *   KC_EW_SIGN     y = sign(a)                        (b unused)
 *   KC_EW_MUL      y = a * b
 *   KC_EW_ADDCMUL  y = y + (s0 * a) * b
 *   KC_EW_ADDCDIV  y = y + (s0 * a) / b
 *   KC_EW_SQRT     y = sqrt(a)                        (b unused)
 *   KC_EW_CLAMP    y = a > s1 ? s1 : a < s0 ? s0 : a  (b unused)
 * Scalars are rounded to float once for KC_F32. y may equal a or b (in
 * place); no other overlap. IEEE subnormals (no flush). Returns 0, or -1
 * for an unknown op or dtype (nothing written).
 */
enum { KC_EW_LERP = 0, KC_EW_SIGN = 1, KC_EW_MUL = 2, KC_EW_ADDCMUL = 3, KC_EW_ADDCDIV = 4, KC_EW_SQRT = 5,
       KC_EW_CLAMP = 6 };
int kc_ew(int op, int dtype, void *y, const void *a, const void *b, double s0, double s1, size_t n);

/* ----------------------------------------------------- mixed-dtype GEMM */

/*
 * C = round(alpha * op(A) * op(B)) + beta * C, with the shapes, transposes
 * and leading dimensions of kc_gemm. Two families:
 *  - C float32: A and B each KC_F32, KC_F16 or KC_BF16. 16-bit operands are
 *    converted (exactly) to float32 in the workspace, compacted to their
 *    stored shape, then kc_gemm multiplies with float32 accumulation, alpha
 *    and beta rounded to float. round_dtype KC_F32 means no rounding;
 *    KC_F16 / KC_BF16 round the product alpha*op(A)op(B) through that format
 *    before beta * C is added (a reduced-precision matmul whose output is
 *    cast up and accumulated into a float32 gradient). With beta == 0 the
 *    product is written to C and rounded there; otherwise it is formed in the
 *    workspace, rounded, and C = product + beta * C. Products beyond the
 *    format's range become +-inf, as on a GPU.
 *  - C float64: A and B KC_F64, computed by kc_dgemm; round_dtype must be
 *    KC_F32 (none, the ABI's spelling) or KC_F64.
 *  - C KC_F16 or KC_BF16: A and B each KC_F32 or C's dtype, round_dtype
 *    C's dtype. alpha * op(A) op(B) + beta * C is formed in float32 in the
 *    workspace (C widened when beta != 0; operands as in the float32
 *    family) and stored rounded once to nearest even: a 16-bit matmul's
 *    output.
 * As in BLAS, C is not read when beta == 0 (whether beta is zero is judged
 * after rounding it to C's type). M or N <= 0, or K < 0: nothing done; K == 0
 * gives C = beta * C. `ws` is caller-provided scratch of ws_bytes bytes
 * (16-byte aligned; kc_gemm_ex_workspace says how much; may be NULL when that
 * is 0). Returns 0, or -1 (nothing written) for an unsupported dtype
 * combination or a workspace smaller than kc_gemm_ex_workspace's answer.
 */
int kc_gemm_ex(int trans_a, int trans_b, int M, int N, int K, double alpha,
               const void *A, int a_dtype, int lda, const void *B, int b_dtype, int ldb,
               double beta, void *C, int c_dtype, int ldc, int round_dtype,
               void *ws, size_t ws_bytes);

/* Workspace bytes kc_gemm_ex needs for these arguments (0 for none, and for
 * an unsupported combination, which kc_gemm_ex rejects anyway). */
size_t kc_gemm_ex_workspace(int M, int N, int K, int a_dtype, int b_dtype, int c_dtype,
                            int round_dtype, double beta);

/* kc_gemm's contract in float64, through cblas_dgemm, split across the pool
 * like kc_gemm (each thread a block of C's columns or rows with the full K). */
void kc_dgemm(int trans_a, int trans_b, int M, int N, int K, double alpha,
              const double *A, int lda, const double *B, int ldb, double beta,
              double *C, int ldc);

/* ------------------------------------------------------------- float64 */

/*
 * The float32 kernels above for float64 data, with the same contracts,
 * aliasing rules and PyTorch semantics (see each float version): scalars are
 * doubles and used as such (no rounding to float). Reductions accumulate in
 * double with the same n-only block decomposition, so results are the same
 * for every thread count. GELU is the same tanh approximation, evaluated as
 * x / (1 + exp(-2u)) with libm's exp; the loss forward returns NAN for a bad
 * label (probs still filled), the backward fills such a row with NaN.
 */
void kc_bias_add_f64(double *y, const double *b, int rows, int cols);
void kc_bias_grad_f64(double *db, const double *dy, int rows, int cols, int accumulate);
void kc_relu_forward_f64(double *y, const double *x, size_t n);
void kc_relu_backward_f64(double *dx, const double *dy, const double *x, size_t n);
void kc_gelu_forward_f64(double *y, const double *x, size_t n);
void kc_gelu_backward_f64(double *dx, const double *dy, const double *x, size_t n);
/* The GAN activations in float64 (tanh through libm, the rest as above). */
void kc_tanh_forward_f64(double *y, const double *x, size_t n);
void kc_tanh_backward_f64(double *dx, const double *dy, const double *x, size_t n);
void kc_sigmoid_forward_f64(double *y, const double *x, size_t n);
void kc_sigmoid_backward_f64(double *dx, const double *dy, const double *x, size_t n);
void kc_leaky_relu_forward_f64(double *y, const double *x, size_t n);
void kc_leaky_relu_backward_f64(double *dx, const double *dy, const double *x, size_t n);
double kc_softmax_xent_forward_f64(double *probs, const double *logits, const int32_t *labels,
                                   int B, int C, int *n_correct);
void kc_softmax_xent_backward_f64(double *dlogits, const double *probs, const int32_t *labels,
                                  int B, int C, double dloss);
double kc_sumsq_f64(const double *x, size_t n);
int kc_all_finite_f64(const double *x, size_t n);
void kc_scale_f64(double *x, double a, size_t n);
void kc_axpy_f64(double *y, double a, const double *x, size_t n);
void kc_sgd_update_f64(double *p, const double *g, double *momentum_buf, size_t n,
                       double lr, double momentum, double dampening, int nesterov,
                       double weight_decay, int first_step);
void kc_adamw_update_f64(double *p, const double *g, double *m, double *v, size_t n,
                         double lr, double beta1, double beta2, double eps,
                         double weight_decay, int64_t step);

#ifdef __cplusplus
}
#endif

#endif
