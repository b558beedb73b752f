/*
 * cpu_accel_seq.c — the cpu accelerator's ABI 1.4 entries other than
 * attention. (Being written: every entry answers KILN_E_UNSUPPORTED.)
 */
#include "cpu_accel.h"

#if KILN_ABI_MINOR >= 4
int32_t cpu_embedding_forward(kiln_instance *acc, uint32_t dtype, void *out, const int32_t *tokens, const void *wte,
                              const void *wpe, int32_t B, int32_t T, int32_t C, int32_t V) {
    (void)dtype, (void)out, (void)tokens, (void)wte, (void)wpe, (void)B, (void)T, (void)C, (void)V;
    return CPU_ERR(acc, KILN_E_UNSUPPORTED, "embedding_forward: not implemented yet");
}
int32_t cpu_embedding_backward(kiln_instance *acc, uint32_t dtype, void *dwte, void *dwpe, const void *dout,
                               const int32_t *tokens, int32_t B, int32_t T, int32_t C, int32_t V) {
    (void)dtype, (void)dwte, (void)dwpe, (void)dout, (void)tokens, (void)B, (void)T, (void)C, (void)V;
    return CPU_ERR(acc, KILN_E_UNSUPPORTED, "embedding_backward: not implemented yet");
}
int32_t cpu_layernorm_forward(kiln_instance *acc, uint32_t dtype, void *y, void *mean, void *rstd, const void *x,
                              const void *w, const void *b, int32_t N, int32_t C, double eps, uint32_t round_dtype) {
    (void)dtype, (void)y, (void)mean, (void)rstd, (void)x, (void)w, (void)b, (void)N, (void)C, (void)eps,
        (void)round_dtype;
    return CPU_ERR(acc, KILN_E_UNSUPPORTED, "layernorm_forward: not implemented yet");
}
int32_t cpu_layernorm_backward(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy,
                               const void *x, const void *w, const void *mean, const void *rstd, int32_t N, int32_t C,
                               int32_t accumulate) {
    (void)dtype, (void)dx, (void)dw, (void)db, (void)dy, (void)x, (void)w, (void)mean, (void)rstd, (void)N, (void)C,
        (void)accumulate;
    return CPU_ERR(acc, KILN_E_UNSUPPORTED, "layernorm_backward: not implemented yet");
}
int32_t cpu_xent_fused(kiln_instance *acc, uint32_t dtype, void *logits, const int32_t *targets, int32_t N, int32_t V,
                       int32_t Vp, double grad_scale, double *loss_sum) {
    (void)dtype, (void)logits, (void)targets, (void)N, (void)V, (void)Vp, (void)grad_scale, (void)loss_sum;
    return CPU_ERR(acc, KILN_E_UNSUPPORTED, "xent_fused: not implemented yet");
}
int32_t cpu_add(kiln_instance *acc, uint32_t dtype, void *y, const void *a, const void *b, size_t n) {
    (void)dtype, (void)y, (void)a, (void)b, (void)n;
    return CPU_ERR(acc, KILN_E_UNSUPPORTED, "add: not implemented yet");
}
#endif
