/*
 * cpu_accel_attn.c — the cpu accelerator's ABI 1.4 attention entries
 * (attention_forward, attention_backward of kiln_kernels): argument checks
 * that turn a caller's mistake into KILN_E_INVALID_ARG with a one-line
 * message naming the entry and the values, the instance workspace reserved
 * for the kernels' per-thread query-tile scratch, then the kc_attn_* kernels
 * of kernels/cpu/cpu_attn.c (float32 or float64). The body is compiled only
 * against 1.4 headers: the same file builds the frozen 1.2 / 1.3 fixtures.
 */
#include "cpu_accel.h"

#if KILN_ABI_MINOR >= 4
#include <limits.h>
#include <stdint.h>

#include "cpu_attn.h"
#include "cpu_kernels.h"

/* Sizes, round_dtype and the element counts of qkv (B, T, 3C) and out
 * (B, T, C); lse (B, NH, T) has B*T*NH <= B*T*C elements. */
static int32_t cpu_attn_args(kiln_instance *acc, const char *fn, uint32_t dtype, int32_t B, int32_t T, int32_t C,
                             int32_t NH, uint32_t round_dtype, size_t *n_qkv, size_t *n_out, size_t *n_lse) {
    int32_t rc = cpu_check_dtype(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: B, T, C and NH must be > 0, got B=%d T=%d C=%d NH=%d", fn,
                       (int)B, (int)T, (int)C, (int)NH);
    if (C % NH != 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: C=%d is not a multiple of NH=%d (head size C/NH)", fn, (int)C,
                       (int)NH);
    /* The GEMMs take the row stride 3C as an int. */
    if (C > INT_MAX / 3)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: C=%d is too large (3C must fit in an int)", fn, (int)C);
    const size_t rows = (size_t)B * (size_t)T, elem = kiln_dtype_size(dtype);
    if (rows > SIZE_MAX / (3 * (size_t)C) / elem)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: B=%d T=%d C=%d is larger than the address space", fn, (int)B,
                       (int)T, (int)C);
    const int round_ok = dtype == KILN_DTYPE_F32 ? (round_dtype == KILN_DTYPE_F32 || round_dtype == KILN_DTYPE_F16 ||
                                                    round_dtype == KILN_DTYPE_BF16)
                                                 : (round_dtype == KILN_DTYPE_F32 || round_dtype == KILN_DTYPE_F64);
    if (!round_ok)
        return CPU_ERR(acc, KILN_E_INVALID_ARG,
                       "%s: round_dtype must be %s with dtype %s, got " CPU_DT_FMT, fn,
                       dtype == KILN_DTYPE_F32 ? "float32 (none), float16 or bfloat16" : "float32 (none) or float64",
                       kiln_dtype_name(dtype), CPU_DT_ARG(round_dtype));
    *n_qkv = rows * 3 * (size_t)C;
    *n_out = rows * (size_t)C;
    *n_lse = rows * (size_t)NH;
    return KILN_OK;
}

int32_t cpu_attention_forward(kiln_instance *acc, uint32_t dtype, void *out, void *lse, const void *qkv, int32_t B,
                              int32_t T, int32_t C, int32_t NH, uint32_t round_dtype) {
    static const char fn[] = "attention_forward";
    size_t n_qkv, n_out, n_lse;
    int32_t rc = cpu_attn_args(acc, fn, dtype, B, T, C, NH, round_dtype, &n_qkv, &n_out, &n_lse);
    if (rc != KILN_OK) return rc;
    CPU_NEED(acc, out, n_out, "attention_forward");
    CPU_NEED(acc, lse, n_lse, "attention_forward");
    CPU_NEED(acc, qkv, n_qkv, "attention_forward");
    const size_t elem = kiln_dtype_size(dtype);
    if (cpu_ranges_overlap(out, n_out * elem, qkv, n_qkv * elem) ||
        cpu_ranges_overlap(lse, n_lse * elem, qkv, n_qkv * elem) ||
        cpu_ranges_overlap(lse, n_lse * elem, out, n_out * elem))
        return CPU_ERR(acc, KILN_E_INVALID_ARG,
                       "%s: out, lse and qkv must not overlap (B=%d T=%d C=%d NH=%d, %s)", fn, (int)B, (int)T, (int)C,
                       (int)NH, kiln_dtype_name(dtype));
    const size_t need = kc_attn_workspace_bytes_for(0, elem, B, T, NH);
    if ((rc = cpu_reserve_workspace(acc, need)) != KILN_OK) return rc;
    const int k = dtype == KILN_DTYPE_F32
                      ? kc_attn_forward(out, lse, qkv, B, T, C, NH, (int)round_dtype, acc->ws, acc->ws_bytes)
                      : kc_attn_forward_f64(out, lse, qkv, B, T, C, NH, acc->ws, acc->ws_bytes);
    if (k != 0)
        return CPU_ERR(acc, KILN_E_INTERNAL, "%s: the kernel refused a call the checks accepted (workspace %zu of %zu)",
                       fn, acc->ws_bytes, need);
    return KILN_OK;
}

int32_t cpu_attention_backward(kiln_instance *acc, uint32_t dtype, void *dqkv, const void *dout, const void *qkv,
                               const void *out, const void *lse, int32_t B, int32_t T, int32_t C, int32_t NH,
                               uint32_t round_dtype) {
    static const char fn[] = "attention_backward";
    size_t n_qkv, n_out, n_lse;
    int32_t rc = cpu_attn_args(acc, fn, dtype, B, T, C, NH, round_dtype, &n_qkv, &n_out, &n_lse);
    if (rc != KILN_OK) return rc;
    CPU_NEED(acc, dqkv, n_qkv, "attention_backward");
    CPU_NEED(acc, dout, n_out, "attention_backward");
    CPU_NEED(acc, qkv, n_qkv, "attention_backward");
    CPU_NEED(acc, out, n_out, "attention_backward");
    CPU_NEED(acc, lse, n_lse, "attention_backward");
    const size_t elem = kiln_dtype_size(dtype), dq_bytes = n_qkv * elem;
    const char *hit = cpu_ranges_overlap(dqkv, dq_bytes, dout, n_out * elem) ? "dout"
                      : cpu_ranges_overlap(dqkv, dq_bytes, qkv, n_qkv * elem) ? "qkv"
                      : cpu_ranges_overlap(dqkv, dq_bytes, out, n_out * elem) ? "out"
                      : cpu_ranges_overlap(dqkv, dq_bytes, lse, n_lse * elem) ? "lse"
                                                                               : NULL;
    if (hit)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: dqkv overlaps %s (B=%d T=%d C=%d NH=%d, %s)", fn, hit, (int)B,
                       (int)T, (int)C, (int)NH, kiln_dtype_name(dtype));
    const size_t need = kc_attn_workspace_bytes_for(1, elem, B, T, NH);
    if ((rc = cpu_reserve_workspace(acc, need)) != KILN_OK) return rc;
    const int k = dtype == KILN_DTYPE_F32 ? kc_attn_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, (int)round_dtype,
                                                             acc->ws, acc->ws_bytes)
                                          : kc_attn_backward_f64(dqkv, dout, qkv, out, lse, B, T, C, NH, acc->ws,
                                                                 acc->ws_bytes);
    if (k != 0)
        return CPU_ERR(acc, KILN_E_INTERNAL, "%s: the kernel refused a call the checks accepted (workspace %zu of %zu)",
                       fn, acc->ws_bytes, need);
    return KILN_OK;
}
#endif
