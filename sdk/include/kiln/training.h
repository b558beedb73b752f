/*
 * kiln/training.h — the training part of the ABI (added in 1.1; 1.2
 * appended other-dtype kernels and precision events, 1.3 fused kernels
 * for the unscale and a Linear layer's epilogue, 1.4 the sequence kernels
 * of transformers and the module's predict_step, 1.5 elementwise building
 * blocks for optimizers and clamping, 1.6 16-bit storage for GEMM outputs
 * and the fused cross-entropy, and linear_forward for either weight
 * layout): the kernel
 * table an accelerator provides, the closure and optimizer handles the
 * trainer passes around, the events (hooks) callbacks and modules receive,
 * and the kind-specific ops tables that follow kiln_ops_header for every
 * kind. Semantics are PyTorch Lightning's (docs/semantics.md): the host runs
 * the loops and calls these ops in Lightning's order.
 *
 * Every function returns a kiln_status; on failure it reports the detail with
 * svc->set_error(). Device pointers come from the accelerator's alloc.
 */
#ifndef KILN_TRAINING_H
#define KILN_TRAINING_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/plugin.h"
#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Accelerator kernel table. `acc` is the accelerator instance. Matrices are
 * row-major; gemm computes C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta*C.
 * Append-only: a caller checks struct_size before using a later entry. */
enum { KILN_COPY_H2D = 0, KILN_COPY_D2H = 1, KILN_COPY_D2D = 2 };

/* kiln_kernels.flags */
#define KILN_KERNELS_HOST_MEMORY (1u << 0) /* device pointers are host pointers:
                                              host buffers (batches) may be
                                              passed to kernels directly */
/* 1.6: gemm_ex writes a float16 / bfloat16 C and xent_fused keeps its
 * logits in float16 / bfloat16 (both described at the entries), so a model
 * can hold a large output (GPT's logits) in the 16 bits autocast stores it
 * in. A caller passes those dtypes only where the bit is set: a table
 * written before 1.6 refuses them (KILN_E_INVALID_ARG) at best. */
#define KILN_KERNELS_STORE_16BIT (1u << 1)
/* 1.7: 16-bit activation storage. Where the bit is set, the entries below
 * take `dtype` F16 or BF16 beside float32 masters: dtype then names the
 * storage of the ACTIVATION buffers listed, and every other floating-point
 * buffer of the call is float32:
 *
 *   entry                          16-bit buffers          float32 buffers
 *   layernorm_forward              y                       x w b mean rstd
 *   layernorm_backward             dy                      dx dw db x w mean rstd
 *   linear_forward, _layout        x y post                b (w: w_dtype)
 *   attention_forward              qkv out                 lse
 *   attention_backward             dqkv dout qkv out       lse
 *   act_backward                   dx dy x                 -
 *   bias_grad_ex                   dy                      db
 *   add                            b                       y a
 *
 * The arithmetic is the float32 call's on the 16-bit values widened to
 * float32 (exact), and each 16-bit output is rounded to nearest even as it
 * is stored: the float32 call followed by round_to of its outputs, in one
 * pass. round_dtype, where the entry has one, must be dtype; linear's
 * w_dtype is dtype or F32. So a model keeps the activations autocast keeps
 * in 16 bits (a block's qkv, attention output, projections, GELU input and
 * output, and their gradients) at half the bytes and without a separate
 * rounding pass, the residual stream, the statistics and the parameters'
 * gradients staying float32. A caller passes these dtypes only where the
 * bit is set; kiln/nn.h does for modules that ask (kiln_nn_ctx.act16). */
#define KILN_KERNELS_ACT_16BIT (1u << 2)
/* 1.8: linear_forward_layout takes KILN_LAYOUT_ROUND_BIAS in w_layout:
 * the bias joins the product rounded through round_dtype, as autocast casts
 * a Linear's bias to the compute dtype with its other inputs:
 *   y = round_dtype(x . w + round_dtype(b))
 * (the float32 bias otherwise joins unrounded). A GPU then adds a 16-bit
 * bias in the GEMM's own epilogue and writes a 16-bit y directly, which it
 * cannot do for a float32 bias (cuBLASLt's bias on a 16-bit output has the
 * output's type). A caller passes the flag only where the bit is set;
 * elsewhere it rounds a copy of the bias itself (round_to), with the same
 * result; kiln/nn.h does both for modules that ask (kiln_nn_ctx.round_bias). */
#define KILN_KERNELS_BIAS_ROUND (1u << 3)

typedef struct kiln_kernels {
    uint32_t struct_size;
    uint32_t flags;           /* KILN_KERNELS_*                                */
    /* memory: 64-byte aligned, zero-filled; free(NULL) is a no-op */
    int32_t (*alloc)(kiln_instance *acc, size_t bytes, void **out);
    void (*free)(kiln_instance *acc, void *ptr);
    int32_t (*copy)(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind);
    int32_t (*zero)(kiln_instance *acc, void *ptr, size_t bytes);
    int32_t (*synchronize)(kiln_instance *acc);
    /* fp32 math */
    int32_t (*gemm)(kiln_instance *acc, int32_t trans_a, int32_t trans_b, int32_t M, int32_t N, int32_t K, float alpha,
                    const float *A, int32_t lda, const float *B, int32_t ldb, float beta, float *C, int32_t ldc);
    /* y(rows, cols) += b(cols) */
    int32_t (*bias_add)(kiln_instance *acc, float *y, const float *b, int32_t rows, int32_t cols);
    /* db(cols) = (accumulate ? db : 0) + sum over rows of dy(rows, cols) */
    int32_t (*bias_grad)(kiln_instance *acc, float *db, const float *dy, int32_t rows, int32_t cols, int32_t accumulate);
    int32_t (*relu_forward)(kiln_instance *acc, float *y, const float *x, size_t n);
    /* dx = dy * (x > 0); dx may alias dy */
    int32_t (*relu_backward)(kiln_instance *acc, float *dx, const float *dy, const float *x, size_t n);
    int32_t (*gelu_forward)(kiln_instance *acc, float *y, const float *x, size_t n); /* tanh approximation */
    int32_t (*gelu_backward)(kiln_instance *acc, float *dx, const float *dy, const float *x, size_t n);
    /* probs(B,C) = softmax(logits); *loss = mean_b -log probs[b, labels[b]];
     * *n_correct = rows whose argmax equals the label (may be NULL). labels
     * (B, int32) is accelerator memory like the tensors (copy() them in);
     * loss and n_correct are host memory. A label outside [0, C) is
     * KILN_E_DATA; probs overlapping logits is KILN_E_INVALID_ARG (both
     * accelerators refuse it). */
    int32_t (*softmax_xent_forward)(kiln_instance *acc, float *probs, const float *logits, const int32_t *labels,
                                    int32_t B, int32_t C, float *loss, int32_t *n_correct);
    /* dlogits = dloss * (probs - onehot(labels)) / B; dlogits may be probs
     * itself, but not overlap it otherwise */
    int32_t (*softmax_xent_backward)(kiln_instance *acc, float *dlogits, const float *probs, const int32_t *labels,
                                     int32_t B, int32_t C, float dloss);
    int32_t (*sum)(kiln_instance *acc, const float *x, size_t n, double *out);
    int32_t (*sumsq)(kiln_instance *acc, const float *x, size_t n, double *out);
    int32_t (*scale)(kiln_instance *acc, float *x, float a, size_t n);
    int32_t (*axpy)(kiln_instance *acc, float *y, float a, const float *x, size_t n);
    /* *finite = 1 when every value is finite */
    int32_t (*all_finite)(kiln_instance *acc, const float *x, size_t n, int32_t *finite);
    /* torch.optim.SGD, one tensor; momentum_buf may be NULL when momentum == 0 */
    int32_t (*sgd_update)(kiln_instance *acc, float *p, const float *g, float *momentum_buf, size_t n, float lr,
                          float momentum, float dampening, int32_t nesterov, float weight_decay, int32_t first_step);
    /* torch.optim.AdamW, one tensor; step is 1-based */
    int32_t (*adamw_update)(kiln_instance *acc, float *p, const float *g, float *m, float *v, size_t n, float lr,
                            float beta1, float beta2, float eps, float weight_decay, int64_t step);

    /* -- 1.2: other dtypes. Check struct_size >= KILN_KERNELS_SIZE_1_2
     * before calling any of these. Reduced precision is emulated where the
     * hardware lacks it by rounding through the real format
     * (round-to-nearest-even; overflow gives inf, underflow subnormals/0), so
     * fp16 overflow and loss-scale skipping behave as on a GPU. -- */
    /* dst(n) = src(n) converted between F32, F64, F16 and BF16 */
    int32_t (*cast)(kiln_instance *acc, void *dst, uint32_t dst_dtype, const void *src, uint32_t src_dtype,
                    size_t n);
    /* x(n), fp32 storage, rounded in place through `dtype` (F16 or BF16; F32
     * is a no-op; from 1.5 also F8E4M3 and F8E5M2: round to nearest even,
     * finite overflow saturating to +-max, NaN kept, inf kept in E5M2 and
     * NaN in E4M3, which has no inf): what storing the values in that
     * format would keep. A 1.5 caller passing an FP8 dtype to an older
     * table gets KILN_E_INVALID_ARG. */
    int32_t (*round_to)(kiln_instance *acc, float *x, uint32_t dtype, size_t n);
    /* C(M,N) = round_dtype(alpha * op(A) * op(B)) + beta * C, accumulated in
     * fp32 (fp64 when C is F64). A and B are F32, F16 or BF16 when C is
     * F32, all F64 when C is F64. round_dtype F16 or BF16 rounds the
     * product before beta*C is added (a reduced-precision matmul whose
     * output is cast up and accumulated, as autocast does for .grad); F32,
     * or C's own dtype, means no rounding. The call is autocast's matmul:
     * its 16-bit dtype is a 16-bit round_dtype, else the 16-bit format of
     * an operand (when only one appears), and F32 operands are rounded
     * through that dtype before the product. That is exact for operands the
     * caller rounded already (kiln/nn.h rounds activations as autocast
     * stores them), and it lets an accelerator run the product on its
     * 16-bit matrix units (the cuda accelerator does). A product of F32
     * values that must not be rounded passes F32 operands and round_dtype
     * F32. The accelerator may allocate conversion scratch on the first
     * call of a size (grow-only). (The first 1.2-1.5 headers promised the
     * operand rounding only for an F32 operand beside one of a 16-bit
     * round_dtype; see docs/abi.md, "Clarified semantics".)
     * 1.6, where flags has KILN_KERNELS_STORE_16BIT: C may be F16 or BF16,
     * with round_dtype C's dtype and A, B each F32 or C's dtype (F32
     * rounded through it, as above). alpha * op(A) op(B) + beta * C is
     * formed in fp32 (C widened) and rounded once, to nearest even, as it
     * is stored: a 16-bit matmul's output, as cuBLAS writes it. */
    int32_t (*gemm_ex)(kiln_instance *acc, int32_t trans_a, int32_t trans_b, int32_t M, int32_t N, int32_t K,
                       double alpha, const void *A, uint32_t a_dtype, int32_t lda, const void *B, uint32_t b_dtype,
                       int32_t ldb, double beta, void *C, uint32_t c_dtype, int32_t ldc, uint32_t round_dtype);
    /* The fp32 entries above for `dtype` F32 or F64; same semantics. */
    int32_t (*bias_add_ex)(kiln_instance *acc, uint32_t dtype, void *y, const void *b, int32_t rows, int32_t cols);
    int32_t (*bias_grad_ex)(kiln_instance *acc, uint32_t dtype, void *db, const void *dy, int32_t rows, int32_t cols,
                            int32_t accumulate);
    /* act: KILN_ACT_*; dx may alias dy */
    int32_t (*act_forward)(kiln_instance *acc, uint32_t dtype, int32_t act, void *y, const void *x, size_t n);
    int32_t (*act_backward)(kiln_instance *acc, uint32_t dtype, int32_t act, void *dx, const void *dy, const void *x,
                            size_t n);
    /* as softmax_xent_forward / _backward, with the same buffer rules */
    int32_t (*softmax_xent_forward_ex)(kiln_instance *acc, uint32_t dtype, void *probs, const void *logits,
                                       const int32_t *labels, int32_t B, int32_t C, double *loss, int32_t *n_correct);
    int32_t (*softmax_xent_backward_ex)(kiln_instance *acc, uint32_t dtype, void *dlogits, const void *probs,
                                        const int32_t *labels, int32_t B, int32_t C, double dloss);
    int32_t (*sumsq_ex)(kiln_instance *acc, uint32_t dtype, const void *x, size_t n, double *out);
    int32_t (*all_finite_ex)(kiln_instance *acc, uint32_t dtype, const void *x, size_t n, int32_t *finite);
    int32_t (*scale_ex)(kiln_instance *acc, uint32_t dtype, void *x, double a, size_t n);
    int32_t (*axpy_ex)(kiln_instance *acc, uint32_t dtype, void *y, double a, const void *x, size_t n);
    int32_t (*sgd_update_ex)(kiln_instance *acc, uint32_t dtype, void *p, const void *g, void *momentum_buf,
                             size_t n, double lr, double momentum, double dampening, int32_t nesterov,
                             double weight_decay, int32_t first_step);
    int32_t (*adamw_update_ex)(kiln_instance *acc, uint32_t dtype, void *p, const void *g, void *m, void *v,
                               size_t n, double lr, double beta1, double beta2, double eps, double weight_decay,
                               int64_t step);

    /* -- 1.3: fused entries. Check struct_size >= KILN_KERNELS_SIZE_1_3
     * (and the pointer) before calling; without them, do the same with the
     * 1.2 entries named in each comment. -- */
    /* GradScaler's unscale_ over a list of tensors in one pass each:
     * x[i](n[i]) *= a for i < count, and *finite = 1 when every value of
     * every x[i] is finite after it (0 otherwise). dtype F32 or F64. The
     * same as scale_ex then all_finite_ex per tensor, but the device is
     * waited on once for the whole list instead of once per tensor. x and n
     * are host arrays; x[i] are accelerator pointers. */
    int32_t (*unscale_check)(kiln_instance *acc, uint32_t dtype, void *const *x, const size_t *n, uint32_t count,
                             double a, int32_t *finite);
    /* A Linear layer's forward with its epilogue:
     *   y(rows, out)    = round_dtype(x(rows, in) . w(out, in)^T + b(out))
     *   post(rows, out) = round_dtype(act(y))     when act >= 0 (KILN_ACT_*)
     * dtype (of x, y, post and b) is F32 or F64; w_dtype is dtype, or F16 /
     * BF16 beside F32 (as gemm_ex's operands). round_dtype is as gemm_ex's
     * but rounds once, after the bias (autocast's addmm: the bias joins the
     * fp32 accumulator, and the output is cast once); F32 means no
     * rounding. b may be NULL (no bias); act < 0 means no activation (post
     * unused, may be NULL). The product rounds an F32 x as gemm_ex
     * rounds its operands (through a 16-bit round_dtype, else through an
     * F16/BF16 w's dtype; exact for the rounded activations callers pass).
     * y must not overlap x or post. The unfused equivalent: gemm_ex
     * (round_dtype F32), bias_add_ex, round_to, act_forward, round_to. An
     * accelerator fuses what its hardware can: the cuda one runs the bias
     * as a cuBLASLt epilogue and the rest as one pass. */
    int32_t (*linear_forward)(kiln_instance *acc, uint32_t dtype, const void *x, const void *w, uint32_t w_dtype,
                              const void *b, int32_t rows, int32_t in, int32_t out, int32_t act, void *y,
                              void *post, uint32_t round_dtype);

    /* -- 1.4: sequence kernels for transformers. Check struct_size >=
     * KILN_KERNELS_SIZE_1_4 (and the pointer) before calling. `dtype` is
     * the dtype of every floating-point buffer of the call: F32 or F64.
     * round_dtype F16 / BF16 (with dtype F32) rounds the named output once,
     * as storing it in that format would (autocast emulation); F32 means
     * no rounding. Integer buffers (tokens, targets) are accelerator
     * memory. Every entry is deterministic: the same bits at any thread
     * count of the accelerator. -- */
    /* out(B*T, C) = wte[tokens[i]] + wpe[i % T] for i < B*T; wte (V, C),
     * wpe (>= T, C) or NULL (no position table). A token outside [0, V)
     * is KILN_E_DATA. */
    int32_t (*embedding_forward)(kiln_instance *acc, uint32_t dtype, void *out, const int32_t *tokens,
                                 const void *wte, const void *wpe, int32_t B, int32_t T, int32_t C, int32_t V);
    /* The scatter-add backward, ADDED to the gradients:
     *   dwte(V, C)[tokens[i]] += dout[i]   dwpe(T, C)[t] += sum_b dout[b*T + t]
     * Either may be NULL (a frozen table). Each row's contributions are
     * added in increasing i, whatever the thread count. */
    int32_t (*embedding_backward)(kiln_instance *acc, uint32_t dtype, void *dwte, void *dwpe, const void *dout,
                                  const int32_t *tokens, int32_t B, int32_t T, int32_t C, int32_t V);
    /* Layer norm over the last axis (torch.nn.LayerNorm, biased variance):
     *   y(N, C) = round_dtype((x - mean) * rstd * w + b)
     *   mean(N), rstd(N) = 1 / sqrt(var + eps), saved for the backward.
     * w and b (C) may be NULL (1 and 0). y must not overlap x. */
    int32_t (*layernorm_forward)(kiln_instance *acc, uint32_t dtype, void *y, void *mean, void *rstd, const void *x,
                                 const void *w, const void *b, int32_t N, int32_t C, double eps,
                                 uint32_t round_dtype);
    /* Its backward: dx(N, C) = (accumulate ? dx : 0) + the input gradient;
     * dw(C) += sum_n dy * xhat, db(C) += sum_n dy (skipped when NULL).
     * dx must not overlap dy. */
    int32_t (*layernorm_backward)(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy,
                                  const void *x, const void *w, const void *mean, const void *rstd, int32_t N,
                                  int32_t C, int32_t accumulate);
    /* Causal multi-head self-attention on a packed qkv(B, T, 3C): q, k, v
     * are columns [0, C), [C, 2C), [2C, 3C) of each row and head h of each
     * is columns [h*D, (h+1)*D), D = C / NH (C % NH == 0):
     *   out(B, T, C)[:, :, head h] = softmax(q_h k_h^T / sqrt(D), causal) v_h
     *   lse(B, NH, T) = the log-sum-exp of each row of the scaled, masked
     *                   scores: all the backward needs besides qkv and out
     * The scores and the softmax are computed in dtype; round_dtype rounds
     * out once (a fused attention's output cast). */
    int32_t (*attention_forward)(kiln_instance *acc, uint32_t dtype, void *out, void *lse, const void *qkv,
                                 int32_t B, int32_t T, int32_t C, int32_t NH, uint32_t round_dtype);
    /* Its backward: dqkv(B, T, 3C) = the gradient (overwritten), from
     * dout(B, T, C) and the forward's qkv, out and lse; round_dtype rounds
     * dqkv once. dqkv must not overlap the other buffers. */
    int32_t (*attention_backward)(kiln_instance *acc, uint32_t dtype, void *dqkv, const void *dout, const void *qkv,
                                  const void *out, const void *lse, int32_t B, int32_t T, int32_t C, int32_t NH,
                                  uint32_t round_dtype);
    /* Softmax cross-entropy over a large vocabulary fused with its
     * gradient, for logits(N, Vp) (row stride Vp; columns [V, Vp) are
     * padding and never predicted) and targets(N), -1 = ignore the row:
     *   *loss_sum = sum over rows with targets[i] >= 0 of
     *               logsumexp(logits[i, :V]) - logits[i, targets[i]]
     *               (accumulated in double; the caller divides)
     *   grad_scale != 0: logits is OVERWRITTEN with
     *               grad_scale * (softmax(logits[i, :V]) - onehot(targets[i]))
     *               and 0 in padding columns and ignored rows, so the
     *               probabilities never exist beside the logits.
     * A target < -1 or >= V is KILN_E_DATA. A caller bounds its memory by
     * calling it on chunks of rows. 1.6, where flags has
     * KILN_KERNELS_STORE_16BIT: dtype may also be F16 or BF16, the storage
     * of the logits and of the gradient written over them. The values are
     * those of the F32 call on the logits widened to float32 (exact), the
     * gradient rounded to nearest even as it is stored: autocast's
     * cross-entropy, which upcasts 16-bit logits and casts the gradient
     * back. (A float16 gradient at unit scale may underflow: a caller that
     * scales the loss later keeps float32 logits.) */
    int32_t (*xent_fused)(kiln_instance *acc, uint32_t dtype, void *logits, const int32_t *targets, int32_t N,
                          int32_t V, int32_t Vp, double grad_scale, double *loss_sum);
    /* y(n) = a(n) + b(n); y may alias a or b (residual connections). */
    int32_t (*add)(kiln_instance *acc, uint32_t dtype, void *y, const void *a, const void *b, size_t n);

    /* -- 1.5: elementwise building blocks, so that an optimizer plugin
     * (Lion, Adafactor, ...) updates on the device through the table alone
     * and the host clamps gradients without touching their memory. Check
     * struct_size >= KILN_KERNELS_SIZE_1_5 (and the pointer) before
     * calling. Every buffer is accelerator memory of `dtype`, F32 or F64,
     * n elements; the double scalars are rounded to dtype once (as a
     * Python float meets a float32 tensor). y may be the same pointer as
     * any input (in place: m = lerp(m, g, w)); any other overlap is
     * KILN_E_INVALID_ARG. No fused multiply-add: each line below is the
     * order of the roundings, the same bits on every accelerator. -- */
    /* torch.lerp: y = |w| < 0.5 ? a + w * (b - a) : b - (b - a) * (1 - w),
     * w = weight (1 - w formed in dtype). Lion's c = lerp(m, g, 1 - beta1). */
    int32_t (*lerp)(kiln_instance *acc, uint32_t dtype, void *y, const void *a, const void *b, double weight,
                    size_t n);
    /* y = +1 (x > 0), -1 (x < 0), +0 (x = +-0); NaN stays NaN. */
    int32_t (*sign)(kiln_instance *acc, uint32_t dtype, void *y, const void *x, size_t n);
    /* y = a * b */
    int32_t (*mul)(kiln_instance *acc, uint32_t dtype, void *y, const void *a, const void *b, size_t n);
    /* torch.addcmul_: y = y + (value * a) * b */
    int32_t (*addcmul)(kiln_instance *acc, uint32_t dtype, void *y, double value, const void *a, const void *b,
                       size_t n);
    /* torch.addcdiv_: y = y + (value * a) / b */
    int32_t (*addcdiv)(kiln_instance *acc, uint32_t dtype, void *y, double value, const void *a, const void *b,
                       size_t n);
    /* y = sqrt(x), IEEE (NaN for x < 0). Spelled sqrt_ex because <tgmath.h>
     * makes sqrt a macro, which would rewrite k->sqrt(...). */
    int32_t (*sqrt_ex)(kiln_instance *acc, uint32_t dtype, void *y, const void *x, size_t n);
    /* y = x > hi ? hi : x < lo ? lo : x (torch.clamp; NaN stays NaN).
     * lo <= hi, neither NaN; +-inf leaves that side open. */
    int32_t (*clamp)(kiln_instance *acc, uint32_t dtype, void *y, const void *x, double lo, double hi, size_t n);

    /* -- 1.6: check struct_size >= KILN_KERNELS_SIZE_1_6 (and the pointer)
     * before calling. (1.6 also added KILN_KERNELS_STORE_16BIT, above.) -- */
    /* linear_forward for either weight layout: w_layout KILN_LAYOUT_OUT_IN
     * is the 1.3 entry (w (out, in), torch.nn.Linear); KILN_LAYOUT_IN_OUT
     * takes w (in, out), GPT-2's Conv1D:
     *   y(rows, out) = round_dtype(x(rows, in) . w(in, out) + b(out))
     * Everything else is linear_forward's, including its unfused
     * equivalent (gemm_ex with B not transposed, ldb = out), so a Conv1D
     * layer gets the fused epilogue too. 1.8: w_layout may also carry
     * KILN_LAYOUT_ROUND_BIAS (below), which rounds b first. */
    int32_t (*linear_forward_layout)(kiln_instance *acc, uint32_t dtype, const void *x, const void *w,
                                     uint32_t w_dtype, int32_t w_layout, const void *b, int32_t rows, int32_t in,
                                     int32_t out, int32_t act, void *y, void *post, uint32_t round_dtype);

    /* -- 1.9: check struct_size >= KILN_KERNELS_SIZE_1_9 (and the pointer)
     * before calling; without it, call sumsq_ex per tensor. -- */
    /* The sum of squares of each tensor of a list, with one wait:
     *   out[i] = sumsq_ex(x[i], n[i])   for i < count
     * dtype F32 or F64. Each out[i] is the value sumsq_ex gives for that
     * tensor, bit for bit, so a caller adding them in its own order gets
     * what the per-tensor loop got. An accelerator whose sumsq_ex waits for
     * the device (a GPU reading the sum back) waits once for the whole list
     * here, not once per tensor: gradient clipping by norm over a GPT's
     * 148 parameters then costs one round trip per step instead of 148.
     * x, n and out are host arrays; x[i] are accelerator pointers (NULL
     * only where n[i] is 0). count 0 is a no-op. */
    int32_t (*sumsq_many)(kiln_instance *acc, uint32_t dtype, const void *const *x, const size_t *n, uint32_t count,
                          double *out);

    /* -- 1.10: check struct_size >= KILN_KERNELS_SIZE_1_10 (and the
     * pointer) before calling; without them, call adamw_update_ex per
     * tensor, and add then layernorm_forward. -- */
    /* torch.optim.AdamW over a list of tensors (PyTorch's foreach/fused
     * AdamW), each with its own weight decay:
     *   adamw_update_ex(dtype, p[i], g[i], m[i], v[i], n[i], lr, beta1,
     *                   beta2, eps, weight_decay[i], step)   for i < count
     * bit for bit, in as few launches as the accelerator can: a GPU's
     * update of a GPT's 148 parameters, most of them small, is a handful of
     * kernels instead of 148, which the host could not issue as fast as
     * the GPU runs them. dtype F32 or F64 (F32 rounds the hyperparameters
     * to float where adamw_update_ex does, so pass (double)(float)x for
     * adamw_update's bits). p, g, m, v, n and weight_decay are host arrays
     * of count; the pointers are accelerator memory, NULL only where n[i]
     * is 0, and no tensor overlaps another's. step is 1-based. count 0 is
     * a no-op. */
    int32_t (*adamw_update_many)(kiln_instance *acc, uint32_t dtype, uint32_t count, void *const *p,
                                 const void *const *g, void *const *m, void *const *v, const size_t *n,
                                 const double *weight_decay, double lr, double beta1, double beta2, double eps,
                                 int64_t step);
    /* A residual connection and the layer norm that reads it, in one pass
     * (llm.c's fused residual forward):
     *   add(dtype, res, a, b, N * C)
     *   layernorm_forward(dtype, y, mean, rstd, res, w, bias, N, C, eps,
     *                     round_dtype)
     * bit for bit, with every check of both. res is written (the residual
     * stream, which the next residual add and the layer norm's backward
     * read) and may be a itself; y, mean and rstd overlap none of res, a
     * and b. A GPU saves the layer norm's read of res from memory and a
     * launch; a GPT block's two residual adds each run fused with the
     * layer norm after them (kiln/nn.h's kiln_nn_blocks_forward). */
    int32_t (*add_layernorm_forward)(kiln_instance *acc, uint32_t dtype, void *res, const void *a, const void *b,
                                     void *y, void *mean, void *rstd, const void *w, const void *bias, int32_t N,
                                     int32_t C, double eps, uint32_t round_dtype);

    /* -- 1.11: check struct_size >= KILN_KERNELS_SIZE_1_11 (and the
     * pointer) before calling; without them, call the entries each one
     * names. Both save a GPU a pass over an activation gradient. -- */
    /* An activation's backward and the bias gradient of the Linear whose
     * output it took, in one pass:
     *   act_backward(dtype, act, dx, dy, x, rows * cols)
     *   bias_grad_ex(dtype, db, dx, rows, cols, accumulate)   (db not NULL)
     * bit for bit, with every check of both: dx may be dy itself, and the
     * bias gradient sums dx as stored (rounded, in 16-bit storage). A GPU
     * sums each element as it writes it, saving the bias sum's read of dx
     * and a launch; kiln/nn.h uses it for every Linear with an activation
     * and a bias (a GPT block's c_fc: 8 C bytes per token less). db NULL
     * is act_backward alone. */
    int32_t (*act_bias_backward)(kiln_instance *acc, uint32_t dtype, int32_t act, void *dx, void *db, const void *dy,
                                 const void *x, int32_t rows, int32_t cols, int32_t accumulate);
    /* A layer norm's backward into a residual stream's gradient, and the
     * 16-bit copy of that gradient which the next matmuls read:
     *   layernorm_backward(dtype, dx, dw, db, dy, x, w, mean, rstd, N, C,
     *                      accumulate)
     *   cast(dx16, dx16_dtype, dx, float32, N * C)
     * bit for bit, with every check of both. dtype is float32 or 16-bit
     * storage (dx is float32 either way; float64 is refused); dx16_dtype
     * is F16 or BF16, and dx16 overlaps no other buffer of the call. A GPU
     * stores the copy as it stores dx, saving the cast's read of dx and a
     * launch; kiln/nn.h's kiln_nn_blocks_backward uses it for each layer
     * norm whose gradient a Linear's backward reads next (a GPT block's
     * two: 8 C bytes per token less). */
    int32_t (*layernorm_backward_cast)(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db,
                                       const void *dy, const void *x, const void *w, const void *mean,
                                       const void *rstd, int32_t N, int32_t C, int32_t accumulate, void *dx16,
                                       uint32_t dx16_dtype);
} kiln_kernels;

/* kiln_kernels.linear_forward_layout: how a weight matrix is stored. */
enum { KILN_LAYOUT_OUT_IN = 0, /* (out, in): torch.nn.Linear   */
       KILN_LAYOUT_IN_OUT = 1  /* (in, out): GPT-2's Conv1D    */ };
/* 1.8, OR'd into w_layout where the table sets KILN_KERNELS_BIAS_ROUND: b
 * is rounded through round_dtype (F16 or BF16; F32 is refused) before it
 * joins the product. Without a bias it changes nothing. */
#define KILN_LAYOUT_ROUND_BIAS 0x100

/* kiln_kernels.act_forward / act_backward */
enum { KILN_ACT_RELU = 0, KILN_ACT_GELU = 1, KILN_ACT_TANH = 2, KILN_ACT_SIGMOID = 3, KILN_ACT_LEAKY_RELU = 4 };
/* KILN_ACT_LEAKY_RELU uses negative slope 0.2 (the usual GAN choice). */

/* ---------------------------------------------------------------------------
 * Closures and optimizer handles (Lightning's closure API) */

/* call() runs the wrapped work and reports the loss it produced (NaN when
 * the step returned no loss). A closure may be called once (SGD, AdamW) or
 * many times (LBFGS); every call repeats the whole work. */
typedef struct kiln_closure {
    uint32_t struct_size;
    uint32_t reserved;
    void *ctx;
    int32_t (*call)(void *ctx, double *loss);
} kiln_closure;

/* The host's handle on the optimizer instance, given to precision plugins so
 * they can drive `optimizer.step(closure)` (skipping it on inf/NaN). */
typedef struct kiln_optimizer_ref {
    uint32_t struct_size;
    uint32_t reserved;
    void *ctx;
    /* closure may be NULL: update from the gradients already present */
    int32_t (*step)(void *ctx, const kiln_closure *closure);
} kiln_optimizer_ref;

/* ---------------------------------------------------------------------------
 * Trainer state and events (hooks) */

enum { KILN_STAGE_FIT = 1, KILN_STAGE_VALIDATE = 2, KILN_STAGE_TEST = 3, KILN_STAGE_SANITY = 4 };

/* Read-only view of the trainer, valid during the call that hands it out. */
typedef struct kiln_trainer_state {
    uint32_t struct_size;
    int32_t stage;                 /* KILN_STAGE_* of the running loop          */
    int64_t current_epoch;         /* epoch_progress.current.completed          */
    int64_t global_step;           /* optimizer steps taken                     */
    int64_t max_epochs, max_steps;
    int64_t num_training_batches;  /* this epoch, after limit_train_batches     */
    int64_t num_val_batches;       /* per validation run                        */
    int64_t batches_that_stepped;  /* the logger step                           */
    int32_t sanity_checking;
    int32_t should_stop;
    const char *run_dir;           /* <default_root_dir>/version_N              */
    int32_t rank, world_size;
    int32_t accumulate_grad_batches;
    int32_t reserved;
    /* -- 1.2 (check struct_size) -- */
    /* the precision plugin's properties ("precision", "amp_backend",
     * "amp_level", ...), NULL-terminated, for loggers and summaries */
    const kiln_kv *precision;
    /* 0 when the module optimises manually (its "automatic_optimization"
     * property is false): a precision must then step even when the closure
     * returned no loss (Lightning's skip applies to automatic mode only) */
    int32_t automatic_optimization;
    uint32_t num_optimizers;
    /* (num_optimizers) each optimizer's current learning rate, after the
     * scheduler's latest update (for lr_monitor-style callbacks) */
    const double *lr;
} kiln_trainer_state;

/* What a training/validation/test step produced. */
typedef struct kiln_step_output {
    uint32_t struct_size;
    int32_t has_loss;              /* 0: the step returned no loss (skip)       */
    double loss;                   /* from a step op: the raw loss; in the
                                      outputs of on_train_batch_end: divided
                                      by accumulate_grad_batches (Lightning) */
    int64_t batch_size;
    /* -- 1.4 (a host reads them only when struct_size covers them) -- */
    int64_t tokens;                /* training_step: items of the batch that
                                      count for throughput (a language model:
                                      the B*T positions); 0: not reported   */
    double flops;                  /* training_step: floating-point operations
                                      of this step's forward AND backward (for
                                      MFU); 0: not reported                 */
} kiln_step_output;

#define KILN_STEP_OUTPUT_SIZE_1_4 (offsetof(kiln_step_output, flops) + sizeof(double))

/* Event ids: every Lightning callback hook, the module-only hooks, and trace
 * points for precision/strategy/optimizer calls. Fixed numbers; receivers
 * ignore ids they do not know (new ids are a minor change). */
#define KILN_EVENT_LIST(X)                                   \
    X(SETUP, 1)                                              \
    X(TEARDOWN, 2)                                           \
    X(ON_FIT_START, 3)                                       \
    X(ON_FIT_END, 4)                                         \
    X(ON_SANITY_CHECK_START, 5)                              \
    X(ON_SANITY_CHECK_END, 6)                                \
    X(ON_TRAIN_START, 7)                                     \
    X(ON_TRAIN_END, 8)                                       \
    X(ON_TRAIN_EPOCH_START, 9)                               \
    X(ON_TRAIN_EPOCH_END, 10)                                \
    X(ON_TRAIN_BATCH_START, 11)                              \
    X(ON_TRAIN_BATCH_END, 12)                                \
    X(ON_VALIDATION_START, 13)                               \
    X(ON_VALIDATION_END, 14)                                 \
    X(ON_VALIDATION_EPOCH_START, 15)                         \
    X(ON_VALIDATION_EPOCH_END, 16)                           \
    X(ON_VALIDATION_BATCH_START, 17)                         \
    X(ON_VALIDATION_BATCH_END, 18)                           \
    X(ON_TEST_START, 19)                                     \
    X(ON_TEST_END, 20)                                       \
    X(ON_TEST_EPOCH_START, 21)                               \
    X(ON_TEST_EPOCH_END, 22)                                 \
    X(ON_TEST_BATCH_START, 23)                               \
    X(ON_TEST_BATCH_END, 24)                                 \
    X(ON_BEFORE_BACKWARD, 25)                                \
    X(ON_AFTER_BACKWARD, 26)                                 \
    X(ON_BEFORE_OPTIMIZER_STEP, 27)                          \
    X(ON_BEFORE_ZERO_GRAD, 28)                               \
    X(ON_EXCEPTION, 29)                                      \
    X(ON_VALIDATION_MODEL_ZERO_GRAD, 30) /* module only */   \
    X(OPTIMIZER_STEP, 31)                /* module/trace */  \
    X(OPTIMIZER_ZERO_GRAD, 32)           /* module/trace */  \
    X(TRAINING_STEP, 33)                 /* trace */         \
    X(BACKWARD, 34)                      /* trace */         \
    X(VALIDATION_STEP, 35)               /* trace */         \
    X(TEST_STEP, 36)                     /* trace */         \
    X(LOG_METRICS, 37)                   /* loggers */       \
    X(TRACE, 38)                         /* other calls, named in `detail` */

enum {
#define KILN__EV(name, v) KILN_EV_##name = v,
    KILN_EVENT_LIST(KILN__EV)
#undef KILN__EV
};

/* Who a hook was dispatched to, for traces. */
enum { KILN_SRC_CALLBACK = 1, KILN_SRC_MODULE = 2, KILN_SRC_PRECISION = 3, KILN_SRC_STRATEGY = 4,
       KILN_SRC_OPTIMIZER = 5, KILN_SRC_HOST = 6 };

typedef struct kiln_event {
    uint32_t struct_size;
    uint32_t id;                   /* KILN_EV_*                                  */
    int32_t stage;                 /* KILN_STAGE_*                               */
    int32_t source;                /* for TRACE copies: KILN_SRC_* of the callee */
    int64_t batch_idx;             /* batch hooks, else -1                       */
    const kiln_batch *batch;       /* batch hooks                                */
    const kiln_step_output *outputs; /* *_batch_end                              */
    double loss;                   /* ON_BEFORE_BACKWARD: the (scaled) loss      */
    const kiln_trainer_state *trainer;
    const char *detail;            /* TRACE: "precision.pre_backward"; else NULL */
    const kiln_kv *metrics;        /* LOG_METRICS: FLOAT values, NULL-terminated */
    int64_t step;                  /* LOG_METRICS: the logger step               */
    int32_t accumulating;          /* 1 on a batch that does not step            */
    int32_t result;                /* out: ON_TRAIN_BATCH_START on a module may
                                      set -1 to end the epoch                    */
    uint32_t trace_event;          /* TRACE copies of hooks: the original id     */
    uint32_t reserved;
} kiln_event;

static inline const char *kiln_event_name(uint32_t id) {
    switch (id) {
#define KILN__EVN(name, v) case v: return #name;
        KILN_EVENT_LIST(KILN__EVN)
#undef KILN__EVN
    default: return "UNKNOWN";
    }
}

/* ---------------------------------------------------------------------------
 * Kind ops tables (the 1.1 members follow the 1.0 header) */

typedef struct kiln_accelerator_ops {
    kiln_ops_header base;
    /* -- 1.1 -- */
    const kiln_kernels *(*kernels)(kiln_instance *acc);
    /* CPU threads the kernels may use (0: all cores); device by local rank */
    int32_t (*configure)(kiln_instance *acc, int32_t threads, int32_t local_rank);
} kiln_accelerator_ops;

typedef struct kiln_precision_ops {
    kiln_ops_header base;
    /* -- 1.1 -- */
    /* After the module's parameters exist: allocate compute copies (or point
     * p->compute at p->data) and set p->compute_dtype. */
    int32_t (*setup)(kiln_instance *self, kiln_parameter *const *params, uint32_t n);
    /* Before every forward: refresh compute weights from the masters. */
    int32_t (*convert_params)(kiln_instance *self);
    /* P.pre_backward: the factor the backward seed is multiplied by (the
     * loss scale; 1 without scaling). The host then calls
     * on_before_backward with loss * *scale. */
    int32_t (*pre_backward)(kiln_instance *self, double loss, double *scale);
    /* P.optimizer_step: run `closure` (training_step, zero_grad, backward),
     * then `after_closure` (on_before_optimizer_step and clipping; gradients
     * must be unscaled by then), then the update through `opt` unless the
     * gradients are not finite. *skipped = 1 when the update was skipped. */
    int32_t (*optimizer_step)(kiln_instance *self, const kiln_optimizer_ref *opt, const kiln_closure *closure,
                              const kiln_closure *after_closure, int32_t *skipped);
    /* -- 1.2 -- */
    /* May be NULL. Receives the trainer's events after the callbacks and
     * before the module (setup, on_fit_end, teardown ...), so a precision can
     * export or report at the end of a run. */
    int32_t (*on_event)(kiln_instance *self, kiln_event *ev);
    /* -- 1.5 (may be NULL; the host calls it only for a library of ABI
     * >= 1.5 whose table reaches KILN_PRECISION_OPS_SIZE_1_5) -- */
    /* How this precision stores activations: x(n) of dtype (F32 or F64),
     * accelerator memory, rounded in place (round_to through FP8 after a
     * per-tensor scale, for instance). Reached from the module's forward
     * through svc->round_activation, on every Linear and attention output
     * (`site` names it, stable across steps, so per-tensor state such as
     * an amax history can be kept per site; state that must survive a
     * resume goes through get_state). NULL: activations stay as the module
     * rounds them (the compute dtype), which is every 1.4 precision. */
    int32_t (*round_activation)(kiln_instance *self, const char *site, uint32_t dtype, void *x, size_t n);
} kiln_precision_ops;

typedef struct kiln_strategy_ops {
    kiln_ops_header base;
    /* -- 1.1 -- */
    int32_t (*setup)(kiln_instance *self, kiln_parameter *const *params, uint32_t n);
    int32_t (*world)(kiln_instance *self, int32_t *rank, int32_t *world_size, int32_t *local_rank);
    int32_t (*pre_backward)(kiln_instance *self);
    /* Gradient synchronisation. An ABI rule (unlike Lightning, which calls
     * it after every backward and suppresses the sync with no_sync): called
     * only after the backward of a batch that steps, and after every
     * manual_backward; never after an accumulating backward, so the
     * gradients it sees are final for the step. */
    int32_t (*post_backward)(kiln_instance *self);
    int32_t (*barrier)(kiln_instance *self, const char *name);
    /* sum `n` doubles across ranks, in place */
    int32_t (*reduce_sum)(kiln_instance *self, double *values, uint32_t n);
    /* -- 1.2 (optional; the host answers for one process without them) -- */
    /* `bytes` of host memory from rank `root` to every rank, in place */
    int32_t (*broadcast)(kiln_instance *self, void *buf, size_t bytes, int32_t root);
    /* every rank's `bytes` from `send` into recv (world_size * bytes, rank
     * order) */
    int32_t (*all_gather)(kiln_instance *self, const void *send, size_t bytes, void *recv);
} kiln_strategy_ops;

typedef struct kiln_optimizer_ops {
    kiln_ops_header base;
    /* -- 1.1 -- */
    /* The parameters this optimizer updates; the array and the parameters
     * stay valid until destroy. set_state (a resume) comes after setup. */
    int32_t (*setup)(kiln_instance *self, kiln_parameter *const *params, uint32_t n);
    /* optimizer.step(closure): call the closure (when not NULL) as often as
     * the algorithm needs, then update the parameters that have a gradient:
     * skip KILN_PARAMF_NO_GRAD ones (1.5), and change nothing when none has
     * one (kiln/optim_util.h: kiln_param_has_grad). */
    int32_t (*step)(kiln_instance *self, const kiln_closure *closure);
    int32_t (*zero_grad)(kiln_instance *self);
    double (*get_lr)(kiln_instance *self);
    int32_t (*set_lr)(kiln_instance *self, double lr);
} kiln_optimizer_ops;

typedef struct kiln_scheduler_ops {
    kiln_ops_header base;
    /* -- 1.1 -- */
    /* scheduler.step(): the learning rate after `step` scheduler steps
     * (PyTorch's last_epoch; 0 is the rate at construction, before any
     * optimizer step), for an optimizer whose configured rate is base_lr.
     * `epoch` is the current epoch; `metric` the monitored value (NaN when
     * none is configured or logged). Called exactly once per scheduler step
     * in order (0, 1, 2, ...), so a stateful schedule (plateau) may keep its
     * state (and checkpoint it with get_state/set_state). The host calls it
     * per optimizer step or per epoch, as the section's host keys say
     * (interval = "step" | "epoch", frequency, monitor). */
    int32_t (*lr_at)(kiln_instance *self, double base_lr, int64_t step, int64_t epoch, double metric, double *lr);
} kiln_scheduler_ops;

typedef struct kiln_callback_ops {
    kiln_ops_header base;
    /* -- 1.1 -- */
    int32_t (*on_event)(kiln_instance *self, kiln_event *ev);
} kiln_callback_ops;

enum { KILN_SPLIT_TRAIN = 0, KILN_SPLIT_VAL = 1, KILN_SPLIT_TEST = 2 };

typedef struct kiln_data_ops {
    kiln_ops_header base;
    /* -- 1.1 -- */
    /* load/validate the data for a stage (KILN_STAGE_*): once per stage a
     * command runs (fit, then test again on the same instance under
     * `fit --test`); set_state, on a resume, comes before it */
    int32_t (*setup)(kiln_instance *self, int32_t stage, int32_t rank, int32_t world_size);
    int32_t (*num_batches)(kiln_instance *self, int32_t split, int64_t *n);
    /* start (or restart) an epoch of `split` at batch `start_batch`: the
     * training epoch (shuffle with it) and a non-zero start only on a
     * resume inside an epoch; validation and test passes get 0, 0 */
    int32_t (*start_epoch)(kiln_instance *self, int32_t split, uint64_t epoch, int64_t start_batch);
    /* 1 and *out filled, 0 at the end of the epoch, negative on error. The
     * batch stays valid until the next call for the same split. */
    int32_t (*next)(kiln_instance *self, int32_t split, kiln_batch *out);
} kiln_data_ops;

typedef struct kiln_module_ops {
    kiln_ops_header base;
    /* -- 1.1 -- */
    /* After the host allocated the registered parameters: initialise them
     * deterministically from `seed`. */
    int32_t (*init_weights)(kiln_instance *self, uint64_t seed);
    /* Forward and loss on one batch; keeps what backward needs. The loss in
     * *out is the raw (not divided) loss. */
    int32_t (*training_step)(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx, kiln_step_output *out);
    /* Gradients of the last training_step's loss times `dloss`, ADDED to
     * every parameter's grad (accumulation relies on this). */
    int32_t (*backward)(kiln_instance *self, double dloss);
    int32_t (*validation_step)(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx, kiln_step_output *out);
    int32_t (*test_step)(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx, kiln_step_output *out);
    /* Lightning's LightningModule hooks; may be NULL */
    int32_t (*on_event)(kiln_instance *self, kiln_event *ev);
    /* -- 1.4 (may be NULL; check struct_size >= KILN_MODULE_OPS_SIZE_1_4) --
     * Lightning's predict_step: inference on one batch, no loss, nothing
     * kept for a backward (it may overwrite what the last training_step
     * kept). *out is a view of HOST memory the module owns, valid until its
     * next call. A language model takes tokens (1, t) I32 and returns the
     * logits of the last position, (1, vocab_size) F32 (the `sample`
     * callback reaches it through svc->predict). */
    int32_t (*predict_step)(kiln_instance *self, const kiln_batch *batch, kiln_tensor *out);
} kiln_module_ops;

/* The size of each table as released in 1.1: the least a host accepts for
 * training. A later minor appends members; a host reading one checks the
 * table's struct_size first and treats a shorter table's tail as NULL. */
#define KILN__END(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))
#define KILN_ACCELERATOR_OPS_SIZE_1_1 KILN__END(kiln_accelerator_ops, configure)
#define KILN_PRECISION_OPS_SIZE_1_1 KILN__END(kiln_precision_ops, optimizer_step)
#define KILN_STRATEGY_OPS_SIZE_1_1 KILN__END(kiln_strategy_ops, reduce_sum)
#define KILN_OPTIMIZER_OPS_SIZE_1_1 KILN__END(kiln_optimizer_ops, set_lr)
#define KILN_SCHEDULER_OPS_SIZE_1_1 KILN__END(kiln_scheduler_ops, lr_at)
#define KILN_CALLBACK_OPS_SIZE_1_1 KILN__END(kiln_callback_ops, on_event)
#define KILN_DATA_OPS_SIZE_1_1 KILN__END(kiln_data_ops, next)
#define KILN_MODULE_OPS_SIZE_1_1 KILN__END(kiln_module_ops, on_event)
#define KILN_KERNELS_SIZE_1_1 KILN__END(kiln_kernels, adamw_update)

/* What 1.2 appended. */
#define KILN_PRECISION_OPS_SIZE_1_2 KILN__END(kiln_precision_ops, on_event)
#define KILN_STRATEGY_OPS_SIZE_1_2 KILN__END(kiln_strategy_ops, all_gather)
#define KILN_KERNELS_SIZE_1_2 KILN__END(kiln_kernels, adamw_update_ex)
#define KILN_TRAINER_STATE_SIZE_1_2 KILN__END(kiln_trainer_state, lr)

/* What 1.3 appended. */
#define KILN_KERNELS_SIZE_1_3 KILN__END(kiln_kernels, linear_forward)

/* What 1.4 appended. */
#define KILN_KERNELS_SIZE_1_4 KILN__END(kiln_kernels, add)
#define KILN_MODULE_OPS_SIZE_1_4 KILN__END(kiln_module_ops, predict_step)

/* What 1.5 appended. */
#define KILN_KERNELS_SIZE_1_5 KILN__END(kiln_kernels, clamp)
#define KILN_PRECISION_OPS_SIZE_1_5 KILN__END(kiln_precision_ops, round_activation)

/* What 1.6 appended (besides the flag KILN_KERNELS_STORE_16BIT). */
#define KILN_KERNELS_SIZE_1_6 KILN__END(kiln_kernels, linear_forward_layout)
/* 1.7 appended nothing to the tables: it added the flag KILN_KERNELS_ACT_16BIT. */
/* 1.8 appended nothing either: the flag KILN_KERNELS_BIAS_ROUND and
 * linear_forward_layout's KILN_LAYOUT_ROUND_BIAS. */

/* What 1.9 appended. */
#define KILN_KERNELS_SIZE_1_9 KILN__END(kiln_kernels, sumsq_many)

/* What 1.10 appended. */
#define KILN_KERNELS_SIZE_1_10 KILN__END(kiln_kernels, add_layernorm_forward)

/* What 1.11 appended. */
#define KILN_KERNELS_SIZE_1_11 KILN__END(kiln_kernels, layernorm_backward_cast)

/* Layout pins of the 1.1 tables (and what 1.2 appended). */
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
static_assert(offsetof(kiln_accelerator_ops, kernels) == 40, "kiln_accelerator_ops 1.1");
static_assert(offsetof(kiln_precision_ops, optimizer_step) == 64, "kiln_precision_ops 1.1");
static_assert(offsetof(kiln_strategy_ops, reduce_sum) == 80, "kiln_strategy_ops 1.1");
static_assert(offsetof(kiln_optimizer_ops, set_lr) == 72, "kiln_optimizer_ops 1.1");
static_assert(offsetof(kiln_callback_ops, on_event) == 40, "kiln_callback_ops 1.1");
static_assert(offsetof(kiln_data_ops, next) == 64, "kiln_data_ops 1.1");
static_assert(offsetof(kiln_module_ops, on_event) == 80, "kiln_module_ops 1.1");
static_assert(offsetof(kiln_kernels, adamw_update) == 168, "kiln_kernels 1.1");
static_assert(sizeof(kiln_event) == 96, "kiln_event 1.1");
static_assert(offsetof(kiln_parameter, param_dtype) == 88, "kiln_parameter 1.1");
static_assert(offsetof(kiln_kernels, cast) == 176 && offsetof(kiln_kernels, adamw_update_ex) == 288,
              "kiln_kernels 1.2");
static_assert(offsetof(kiln_precision_ops, on_event) == 72, "kiln_precision_ops 1.2");
static_assert(offsetof(kiln_strategy_ops, all_gather) == 96, "kiln_strategy_ops 1.2");
static_assert(offsetof(kiln_trainer_state, precision) == 96, "kiln_trainer_state 1.2");
static_assert(offsetof(kiln_kernels, unscale_check) == 296 && offsetof(kiln_kernels, linear_forward) == 304,
              "kiln_kernels 1.3");
static_assert(offsetof(kiln_kernels, embedding_forward) == 312 && offsetof(kiln_kernels, add) == 368,
              "kiln_kernels 1.4");
static_assert(offsetof(kiln_module_ops, predict_step) == 88, "kiln_module_ops 1.4");
static_assert(offsetof(kiln_kernels, lerp) == 376 && offsetof(kiln_kernels, clamp) == 424, "kiln_kernels 1.5");
static_assert(offsetof(kiln_kernels, linear_forward_layout) == 432, "kiln_kernels 1.6");
static_assert(offsetof(kiln_kernels, sumsq_many) == 440, "kiln_kernels 1.9");
static_assert(offsetof(kiln_kernels, adamw_update_many) == 448 && offsetof(kiln_kernels, add_layernorm_forward) == 456,
              "kiln_kernels 1.10");
static_assert(offsetof(kiln_kernels, act_bias_backward) == 464 &&
                  offsetof(kiln_kernels, layernorm_backward_cast) == 472,
              "kiln_kernels 1.11");
static_assert(offsetof(kiln_precision_ops, round_activation) == 80, "kiln_precision_ops 1.5");
static_assert(offsetof(kiln_step_output, tokens) == 24 && sizeof(kiln_step_output) == 40, "kiln_step_output 1.4");
#endif

#ifdef __cplusplus
}
#endif

#endif /* KILN_TRAINING_H */
