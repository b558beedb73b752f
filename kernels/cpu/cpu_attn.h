/*
 * cpu_attn.h — CPU kernels for the ABI 1.4 causal multi-head self-attention
 * entries (attention_forward, attention_backward of kiln_kernels), float32
 * and float64, plus naive double-precision references the tests compare
 * against. The fast kernels never materialise a T x T matrix beyond one
 * query tile per thread: the forward saves only the log-sum-exp of each
 * score row, and the backward recomputes the probabilities from it (flash
 * style). Their GEMMs are OpenBLAS calls made inside kiln's pool, one
 * (batch, head) pair per thread at a time, so every result bit is the same
 * at any thread count.
 *
 * Layouts (row-major, as in sdk/include/kiln/training.h):
 *   qkv  (B, T, 3C): q = columns [0, C), k = [C, 2C), v = [2C, 3C); head h
 *                    of each is columns [h*D, (h+1)*D), D = C / NH
 *   out  (B, T, C):  head h in columns [h*D, (h+1)*D)
 *   lse  (B, NH, T): log-sum-exp of each row of the scaled (1/sqrt(D)),
 *                    causally masked scores
 *   dout (B, T, C), dqkv (B, T, 3C) as out and qkv.
 * The caller checks the sizes (all > 0, C % NH == 0, 3C fits an int) and
 * owns every buffer, the workspace included; nothing here allocates.
 */
#ifndef KILN_KERNELS_CPU_ATTN_H
#define KILN_KERNELS_CPU_ATTN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Workspace bytes the call needs so that each of `parts` threads has its
 * own query-tile scratch (backward != 0: the backward's, which is twice the
 * forward's). elem_size is sizeof(float) or sizeof(double).
 */
size_t kc_attn_workspace_bytes(int backward, size_t elem_size, int T, int parts);
/* The same for the pool's current thread count and B * NH work items: what
 * an entry reserves before calling the kernels below. */
size_t kc_attn_workspace_bytes_for(int backward, size_t elem_size, int B, int T, int NH);

/*
 * Forward: out(B, T, C), lse(B, NH, T) from qkv(B, T, 3C). round_dtype
 * (float32 only) is KC_F32 (none), KC_F16 or KC_BF16: out is rounded
 * through that format once, after it is computed. ws: ws_bytes of scratch,
 * 64-byte aligned; the kernel uses as many threads (up to the pool's) as it
 * holds per-part scratch for. Returns 0, or -1 when ws cannot hold one part
 * or round_dtype is unknown (nothing written then).
 */
int kc_attn_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH, int round_dtype,
                    void *ws, size_t ws_bytes);
int kc_attn_forward_f64(double *out, double *lse, const double *qkv, int B, int T, int C, int NH, void *ws,
                        size_t ws_bytes);

/*
 * Backward: dqkv(B, T, 3C) overwritten with the gradient of the forward
 * from dout(B, T, C) and the forward's qkv(B, T, 3C), out(B, T, C) and
 * lse(B, NH, T); round_dtype as above (rounds dqkv). dqkv must not overlap
 * the inputs. Same workspace rule and return as the forward.
 */
int kc_attn_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse, int B,
                     int T, int C, int NH, int round_dtype, void *ws, size_t ws_bytes);
int kc_attn_backward_f64(double *dqkv, const double *dout, const double *qkv, const double *out,
                         const double *lse, int B, int T, int C, int NH, void *ws, size_t ws_bytes);

/*
 * The references: the textbook computation in double, one materialised
 * softmax row at a time (scores, max, exp, sum, then the weighted sums), no
 * BLAS, no threads. The backward uses Delta_i = sum_j P_ij dP_ij (not the
 * forward's out), so it checks the fast kernels' identity independently.
 * Shapes as above (double buffers); scratch: 2 * T doubles.
 */
void kc_attn_forward_ref(double *out, double *lse, const double *qkv, int B, int T, int C, int NH,
                         double *scratch);
void kc_attn_backward_ref(double *dqkv, const double *dout, const double *qkv, int B, int T, int C, int NH,
                          double *scratch);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KERNELS_CPU_ATTN_H */
