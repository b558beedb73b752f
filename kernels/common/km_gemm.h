/*
 * km_gemm.h — gemm_ex's operand rule (kiln/training.h), written once for
 * the cpu kernels (kc_gemm_ex) and the cuda accelerator (cu_gemm_ex and
 * linear_forward), so both round the same operands. The call is autocast's
 * matmul: its 16-bit dtype is a 16-bit round_dtype, else the 16-bit format
 * of an operand (when only one appears), and float32 operands are rounded
 * through that dtype before the product. Dtypes are kiln/tensor.h's
 * numbers, which kernels/cpu's KC_* share (plugins/cpu asserts it).
 */
#ifndef KILN_KERNELS_COMMON_KM_GEMM_H
#define KILN_KERNELS_COMMON_KM_GEMM_H

enum { KM_DT_F32 = 1, KM_DT_F16 = 3, KM_DT_BF16 = 4 }; /* kiln/tensor.h's KILN_DTYPE_* */

static inline int km_is16(int dt) { return dt == KM_DT_F16 || dt == KM_DT_BF16; }

/* The dtype a matmul of an a_dtype and a b_dtype operand, rounded through
 * round_dtype, rounds its float32 operands through: a 16-bit round_dtype;
 * else the one 16-bit format among the operands; KM_DT_F32 (no rounding)
 * when there is none, or two different ones. */
static inline int km_gemm_round_dtype(int a_dtype, int b_dtype, int round_dtype) {
    if (km_is16(round_dtype)) return round_dtype;
    if (km_is16(a_dtype) && !(km_is16(b_dtype) && b_dtype != a_dtype)) return a_dtype;
    if (km_is16(b_dtype) && !km_is16(a_dtype)) return b_dtype;
    return KM_DT_F32;
}

#endif
