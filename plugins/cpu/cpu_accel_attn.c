/*
 * cpu_accel_attn.c — the cpu accelerator's ABI 1.4 attention entries.
 * (Being written: every entry answers KILN_E_UNSUPPORTED.)
 */
#include "cpu_accel.h"

#if KILN_ABI_MINOR >= 4
int32_t cpu_attention_forward(kiln_instance *acc, uint32_t dtype, void *out, void *lse, const void *qkv, int32_t B,
                              int32_t T, int32_t C, int32_t NH, uint32_t round_dtype) {
    (void)dtype, (void)out, (void)lse, (void)qkv, (void)B, (void)T, (void)C, (void)NH, (void)round_dtype;
    return CPU_ERR(acc, KILN_E_UNSUPPORTED, "attention_forward: not implemented yet");
}
int32_t cpu_attention_backward(kiln_instance *acc, uint32_t dtype, void *dqkv, const void *dout, const void *qkv,
                               const void *out, const void *lse, int32_t B, int32_t T, int32_t C, int32_t NH,
                               uint32_t round_dtype) {
    (void)dtype, (void)dqkv, (void)dout, (void)qkv, (void)out, (void)lse, (void)B, (void)T, (void)C, (void)NH,
        (void)round_dtype;
    return CPU_ERR(acc, KILN_E_UNSUPPORTED, "attention_backward: not implemented yet");
}
#endif
