/*
 * cpu_seq.h — CPU kernels for the ABI 1.4 sequence entries other than
 * attention: token + position embedding and its scatter-add backward, layer
 * norm forward and backward, the softmax cross-entropy over a large
 * vocabulary fused with its gradient, and an elementwise add (residuals).
 * Each comes as a float32 function and a float64 *_f64 one with the same
 * contract. Like the rest of kernels/cpu they do not allocate (the backward
 * passes that need scratch take a caller's workspace, sized by the
 * *_workspace functions), do not validate (the plugin checks arguments and
 * indices before calling; an index out of range here is undefined), and give
 * the same bits for every thread count: rows are split across the pool, and
 * every reduction across rows is a per-block partial sum whose blocks depend
 * on the sizes only, combined in block order.
 */
#ifndef KILN_KERNELS_CPU_SEQ_H
#define KILN_KERNELS_CPU_SEQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * out(B*T, C) = wte[tokens[i]] + wpe[i % T] for i < B*T (wpe NULL: no
 * position term). tokens: (B*T), each in [0, V); wte: (V, C); wpe: (>= T, C).
 * out must not overlap the inputs.
 */
void kc_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T, int C);
void kc_embedding_forward_f64(double *out, const int32_t *tokens, const double *wte, const double *wpe, int B, int T,
                              int C);

/* Bytes of workspace kc_embedding_backward needs (the counting sort of the
 * B*T positions by token, V + 1 + B*T int32); 0 without dwte. */
size_t kc_embedding_backward_workspace(int B, int T, int V, int has_dwte);

/*
 * The scatter-add backward, ADDED to the gradients:
 *   dwte(V, C)[tokens[i]] += dout[i]      (skipped when dwte is NULL)
 *   dwpe(T, C)[t] += dout[b*T + t], b = 0, 1, ...   (skipped when NULL)
 * Every gradient row receives its contributions one at a time in increasing
 * i (dout row index), so the result equals the serial loop bit for bit.
 * dout: (B*T, C); tokens: (B*T), each in [0, V). ws: at least
 * kc_embedding_backward_workspace(B, T, V, dwte != NULL) bytes, 4-byte
 * aligned. No buffer may overlap another.
 */
void kc_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C,
                           int V, void *ws);
void kc_embedding_backward_f64(double *dwte, double *dwpe, const double *dout, const int32_t *tokens, int B, int T,
                               int C, int V, void *ws);

/*
 * Layer norm over the last axis (torch.nn.LayerNorm, biased variance):
 *   mean(N), rstd(N) = 1 / sqrt(var + eps)  (row statistics accumulated in
 *                      double, two passes, then stored in the data type)
 *   y(N, C) = (x - mean) * rstd * w + b     (w, b: (C) or NULL for 1 and 0)
 * round_dtype (float32 only): KC_F32 none, KC_F16 / KC_BF16 round y through
 * that format once. y, mean, rstd must not overlap x, w, b or each other.
 */
void kc_layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *w, const float *b, int N,
                          int C, double eps, int round_dtype);
void kc_layernorm_forward_f64(double *y, double *mean, double *rstd, const double *x, const double *w,
                              const double *b, int N, int C, double eps);

/* Bytes of workspace kc_layernorm_backward needs: the per-row-block partial
 * sums of dw and db, in double (0 when both are NULL). */
size_t kc_layernorm_backward_workspace(int N, int C, int has_dw, int has_db);

/*
 * Its backward, with xhat = (x - mean) * rstd and g = dy * w:
 *   dx(N, C) = (accumulate ? dx : 0) + rstd * (g - mean_C(g) - xhat * mean_C(g * xhat))
 *   dw(C) += sum_n dy * xhat,  db(C) += sum_n dy   (each skipped when NULL)
 * The row sums are accumulated in double; dw and db are per-block partial
 * sums in double (blocks of rows sized from N only) added in block order
 * and rounded once. dy, x: (N, C); w: (C) or NULL; mean, rstd: (N) from the
 * forward. ws: kc_layernorm_backward_workspace bytes, 8-byte aligned. The
 * outputs must not overlap each other or the inputs.
 */
void kc_layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                           const float *mean, const float *rstd, int N, int C, int accumulate, void *ws);
void kc_layernorm_backward_f64(double *dx, double *dw, double *db, const double *dy, const double *x,
                               const double *w, const double *mean, const double *rstd, int N, int C,
                               int accumulate, void *ws);

/*
 * Softmax cross-entropy fused with its gradient. logits: (N, Vp), columns
 * [V, Vp) padding; targets: (N), each in [-1, V), -1 = ignore the row.
 * Returns the sum over non-ignored rows of logsumexp(logits[i, :V]) -
 * logits[i, targets[i]], in double (each row's loss in double, summed in
 * fixed row blocks combined in block order). grad_scale != 0: logits is
 * overwritten with grad_scale * (softmax - onehot) in [0, V), 0 in the
 * padding and on ignored rows; grad_scale == 0 leaves logits untouched. The
 * softmax subtracts the row max; float32 sums its exponentials in double.
 * A row holding inf or NaN takes a scalar libm path, so NaN propagates and
 * -inf logits (masked classes) get probability 0.
 */
double kc_xent_fused(float *logits, const int32_t *targets, int N, int V, int Vp, double grad_scale);
double kc_xent_fused_f64(double *logits, const int32_t *targets, int N, int V, int Vp, double grad_scale);
/* The same over logits(N, Vp) stored in dtype KC_F16 or KC_BF16: computed
 * as kc_xent_fused on the values widened into ws (N * Vp floats), the
 * gradient stored rounded to nearest even. */
double kc_xent_fused_16(int dtype, void *logits, const int32_t *targets, int N, int V, int Vp, double grad_scale,
                        float *ws);

/* y(n) = a(n) + b(n); y may equal a or b (in place), no other overlap. */
void kc_add(float *y, const float *a, const float *b, size_t n);
void kc_add_f64(double *y, const double *a, const double *b, size_t n);

#ifdef __cplusplus
}
#endif

#endif
