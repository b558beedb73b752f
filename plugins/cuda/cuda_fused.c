/*
 * cuda_fused.c — the fused kernel-table entries of ABI 1.3 on the "cuda"
 * accelerator. unscale_check multiplies every gradient of a list by the
 * inverse loss scale and looks for inf/NaN in one launch per KG_LIST_MAX
 * tensors, and the host waits once for the whole list (the 1.2 way, scale
 * then all_finite per parameter, waits once per parameter). linear_forward
 * runs a Linear layer's bias as a cuBLASLt epilogue of the GEMM, and what
 * is left (rounding through a 16-bit format, the activation, fp64's bias)
 * in one elementwise pass after it (kg_linear_epilogue, whose GELU is the
 * cpu's km_gelu bit for bit), instead of the three or four passes of
 * gemm_ex, bias_add_ex, round_to and act_forward; 1.6's
 * linear_forward_layout does the same for Conv1D's (in, out) weights (the
 * GEMM's B not transposed). The cpu accelerator's
 * entries (plugins/cpu) are the reference both are compared with. Under
 * ABI 1.7's 16-bit activation storage (dtype F16 / BF16) cuBLASLt reads
 * the 16-bit x as its operand directly and the epilogue pass reads and
 * writes 16 bits (cu_linear16). With 1.8's KILN_LAYOUT_ROUND_BIAS the bias
 * is rounded into a 16-bit copy first, which cuBLASLt's epilogue adds to a
 * 16-bit output directly (cu_round_bias).
 */
#include <string.h>

#include "cuda_internal.h"

/* -------------------------------------------------------- unscale_check */

int32_t cu_unscale_check(kiln_instance *acc, uint32_t dt, void *const *x, const size_t *n, uint32_t count, double a,
                         int32_t *finite) {
    int32_t rc = cu_check_fdt(acc, "unscale_check", dt);
    if (rc != KILN_OK) return rc;
    if (!finite) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: unscale_check: finite is NULL");
    if ((rc = ack_tensor_list(CU_SINK(acc), "unscale_check", (const void *const *)x, n, count)) != KILN_OK) return rc;
    CU_READY(acc, "unscale_check");
    /* a device int after the reduction partials and results (cuda_mem.c
     * sizes red_scratch at KG_REDUCE_BLOCKS + 8 doubles) */
    int32_t *flag = (int32_t *)(acc->red_scratch + KG_REDUCE_BLOCKS + 4);
    CU_CHECK(acc, "unscale_check", cudaMemsetAsync(flag, 0, sizeof *flag, acc->stream));
    kg_list list;
    list.count = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (n[i] == 0) continue;
        list.x[list.count] = x[i];
        list.n[list.count] = n[i];
        if (++list.count == KG_LIST_MAX) {
            CU_LAUNCH(acc, "unscale_check", kg_unscale_check(acc->stream, (int)dt, &list, a, flag));
            list.count = 0;
        }
    }
    if (list.count > 0) CU_LAUNCH(acc, "unscale_check", kg_unscale_check(acc->stream, (int)dt, &list, a, flag));
    int32_t *host = (int32_t *)(acc->host_scalars + 3);
    CU_CHECK(acc, "unscale_check", cudaMemcpyAsync(host, flag, sizeof *host, cudaMemcpyDeviceToHost, acc->stream));
    CU_CHECK(acc, "unscale_check", cu_wait(acc));
    *finite = *host == 0;
    return KILN_OK;
}

/* ------------------------------------------------------- linear_forward */

/* 1.8's KILN_LAYOUT_ROUND_BIAS: b (out, float32) rounded through the
 * 16-bit rt into bq16 (out, rt), and, where fp32 is wanted (bqf not NULL),
 * widened back into bqf: the float32 bias the call then adds is exactly
 * the 16-bit one. */
static int32_t cu_round_bias(kiln_instance *acc, uint32_t rt, const void *b, int32_t out, void *bq16, float *bqf) {
    CU_LAUNCH(acc, "linear_forward (bias)", kg_cast(acc->stream, bq16, (int)rt, b, KG_F32, (size_t)out));
    if (bqf) CU_LAUNCH(acc, "linear_forward (bias)", kg_cast(acc->stream, bqf, KG_F32, bq16, (int)rt, (size_t)out));
    return KILN_OK;
}

/*
 * The 16-bit storage form (1.7; dt F16 / BF16, round_dtype dt, the checks
 * passed; rb only with a bias): x is already the product's operand, an F32 w is converted to
 * dt as the float32 call rounds it. Without a bias cuBLASLt writes y in dt
 * itself (its fp32 result rounded once as stored: the float32 call's
 * rounding) and only an activation needs a pass (reading y, writing
 * post). With a bias rounded first (1.8, rb), the same: cuBLASLt's bias
 * epilogue on a 16-bit output takes the bias in the output's type, adds it
 * to the fp32 sum and rounds once, which is the call's definition. With a
 * float32 bias (no rb) that epilogue would round the bias, so the product
 * and bias go to float32 scratch through the fp32 epilogue and one pass
 * rounds them into y (and post): 4 + 4 bytes of scratch traffic per element
 * beside the 2 of y, still less than the float32 call's y (4 + 4 + 4).
 * K = 0 (y = the bias) takes the scratch path with the rounded bias.
 */
static int32_t cu_linear16(kiln_instance *acc, const char *fn, uint32_t dt, const void *x, const void *w,
                           uint32_t wt, int in_out, const void *b, int rb, int32_t rows, int32_t in, int32_t out,
                           int32_t act, void *y, void *post) {
    const size_t ny = (size_t)rows * (size_t)out;
    const int direct = !b || (rb && in > 0 && !acc->no_bias16); /* cuBLASLt writes y in dt */
    const size_t bq16_bytes = rb ? cu_up256((size_t)out * 2) : 0;
    const size_t bqf_bytes = rb && !direct ? cu_up256((size_t)out * sizeof(float)) : 0;
    const size_t prod_bytes = direct ? 0 : cu_up256(ny * sizeof(float));
    const void *xa = NULL, *wa = NULL;
    void *extra = NULL;
    int32_t rc = cu_gemm_operands(acc, fn, dt, dt, x, dt, (size_t)rows * (size_t)in, w, wt, (size_t)out * (size_t)in,
                                  bq16_bytes + bqf_bytes + prod_bytes, &xa, &wa, &extra);
    if (rc != KILN_OK) return rc;
    char *bq16 = (char *)extra, *bqf = bq16 + bq16_bytes, *prod = bqf + bqf_bytes;
    if (rb && (rc = cu_round_bias(acc, dt, b, out, bq16, bqf_bytes ? (float *)bqf : NULL)) != KILN_OK) return rc;
    if (direct) {
        cu_ep ep = {CUBLASLT_EPILOGUE_BIAS, bq16, NULL, 0};
        rc = cu_matmul_ep(acc, fn, 0, !in_out, rows, out, in, 1.0, xa, dt, in, wa, dt, in_out ? out : in, 0.0, y, dt,
                          out, b ? &ep : NULL);
        if (rc == KILN_E_UNSUPPORTED && b) {
            /* no algorithm for the 16-bit bias epilogue on this device and
             * library: the float32 scratch path, with the same values, from
             * now on (nothing was queued for this call but the bias copy) */
            acc->no_bias16 = 1;
            kiln_logf(acc->svc, acc->hctx, KILN_LOG_INFO,
                      "cuda: device %d: cuBLASLt has no bias epilogue for a %s output here; linear_forward adds "
                      "the rounded bias through float32 scratch instead",
                      acc->device, kiln_dtype_name(dt));
            return cu_linear16(acc, fn, dt, x, w, wt, in_out, b, 1, rows, in, out, act, y, post);
        }
        if (rc != KILN_OK || act < 0) return rc;
        CU_LAUNCH(acc, "linear_forward (epilogue)",
                  kg_linear_epilogue16(acc->stream, (int)dt, y, NULL, NULL, rows, out, act, post));
        return KILN_OK;
    }
    if (rb) b = bqf;
    cu_ep ep = {CUBLASLT_EPILOGUE_BIAS, b, NULL, 0};
    rc = cu_matmul_ep(acc, fn, 0, !in_out, rows, out, in, 1.0, xa, dt, in, wa, dt, in_out ? out : in, 0.0, prod,
                      KILN_DTYPE_F32, out, in > 0 ? &ep : NULL);
    if (rc != KILN_OK) return rc;
    CU_LAUNCH(acc, "linear_forward (epilogue)",
              kg_linear_epilogue16(acc->stream, (int)dt, y, (const float *)prod, in > 0 ? NULL : (const float *)b,
                                   rows, out, act, post));
    return KILN_OK;
}

/* Both entries, after the cpu accelerator's checks (accel_checks.h:
 * ack_linear); w_layout 1 (KILN_LAYOUT_IN_OUT): w is (in, out) (Conv1D),
 * the GEMM's B not transposed; 1.8's KILN_LAYOUT_ROUND_BIAS rounds b
 * through the 16-bit rt first (cu_round_bias). */
static int32_t cu_linear(kiln_instance *acc, const char *fn, uint32_t dt, const void *x, const void *w, uint32_t wt,
                         int32_t w_layout, const void *b, int32_t rows, int32_t in, int32_t out, int32_t act, void *y,
                         void *post, uint32_t rt) {
    int go = 0;
    int32_t rc = ack_linear(CU_SINK(acc), fn, dt, x, w, wt, w_layout, rows, in, out, act, y, post, rt, &go);
    if (rc != KILN_OK || !go) return rc;
    const int in_out = ack_layout(w_layout) == KILN_LAYOUT_IN_OUT;
    const int rb = ack_round_bias(w_layout) && b;
    CU_READY(acc, fn);
    const int r16 = cu_is16(rt);
    if (act < 0) act = -1;
    if (cu_is16(dt)) return cu_linear16(acc, fn, dt, x, w, wt, in_out, b, rb, rows, in, out, act, y, post);

    /* The operands in the dtype the product runs in, as gemm_ex picks it;
     * after them in the scratch, the rounded bias (rb) */
    const uint32_t op = cu_product_dtype(dt, wt, rt);
    const void *xa = NULL, *wa = NULL;
    const size_t bq16_bytes = rb ? cu_up256((size_t)out * 2) : 0;
    void *extra = NULL;
    rc = cu_gemm_operands(acc, fn, op, (uint32_t)km_gemm_round_dtype((int)dt, (int)wt, (int)rt), x, dt,
                          (size_t)rows * (size_t)in, w, wt, (size_t)out * (size_t)in,
                          rb ? bq16_bytes + cu_up256((size_t)out * sizeof(float)) : 0, &xa, &wa, &extra);
    if (rc != KILN_OK) return rc;
    if (rb) {
        float *bqf = (float *)((char *)extra + bq16_bytes);
        if ((rc = cu_round_bias(acc, rt, b, out, extra, bqf)) != KILN_OK) return rc;
        b = bqf;
    }

    /* The epilogue cuBLASLt runs: the bias alone (fp64 and a K of 0 take
     * none). Never its GELU (GELU_AUX_BIAS): cuBLASLt evaluates its own tanh
     * approximation, whose bits differ from km_gelu's (kernels/common/
     * km_act.h), and the table promises the cpu accelerator's GELU bit for
     * bit. The activation runs in kg_linear_epilogue below, which calls
     * km_gelu: one more elementwise pass over y, small beside the GEMM. */
    cu_ep ep = {CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0};
    if (dt == KILN_DTYPE_F32 && b && in > 0) {
        ep.kind = CUBLASLT_EPILOGUE_BIAS;
        ep.bias = b;
    }
    const uint32_t ct = dt; /* y's dtype: F32 (or F64) */
    rc = cu_matmul_ep(acc, fn, 0, !in_out, rows, out, in, 1.0, xa, op, in, wa, op, in_out ? out : in, 0.0, y, ct,
                      out, ep.kind == CUBLASLT_EPILOGUE_DEFAULT ? NULL : &ep);
    if (rc != KILN_OK) return rc;
    const void *b_left = ep.kind == CUBLASLT_EPILOGUE_DEFAULT ? b : NULL;
    if (!b_left && !r16 && act < 0) return KILN_OK;
    /* round_dtype F64 with F64 data is the ABI's "no rounding", as F32 */
    CU_LAUNCH(acc, "linear_forward (epilogue)",
              kg_linear_epilogue(acc->stream, (int)dt, y, b_left, rows, out, act, post, r16 ? (int)rt : KG_F32));
    return KILN_OK;
}

int32_t cu_linear_forward(kiln_instance *acc, uint32_t dt, const void *x, const void *w, uint32_t wt, const void *b,
                          int32_t rows, int32_t in, int32_t out, int32_t act, void *y, void *post, uint32_t rt) {
    return cu_linear(acc, "linear_forward", dt, x, w, wt, 0, b, rows, in, out, act, y, post, rt);
}

int32_t cu_linear_forward_layout(kiln_instance *acc, uint32_t dt, const void *x, const void *w, uint32_t wt,
                                 int32_t w_layout, const void *b, int32_t rows, int32_t in, int32_t out, int32_t act,
                                 void *y, void *post, uint32_t rt) {
    return cu_linear(acc, "linear_forward_layout", dt, x, w, wt, w_layout, b, rows, in, out, act, y, post, rt);
}
