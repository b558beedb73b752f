/*
 * fake_kg_flash.h — the fake cuda accelerator's host emulation of the fused
 * ("flash") attention programs (fake_kg_flash.cu), called by
 * fake_kg_seq.c's kg_flash_forward and kg_flash_backward once their launch
 * checks pass. Buffers and shapes as kernels/cuda/kg_kernels.h's
 * launchers (float32 data, rd = KG_BF16 or KG_F16, D = C / NH supported);
 * each returns 0, or -1 with the emulation's first failure in why.
 */
#ifndef KILN_TESTS_FAKE_KG_FLASH_H
#define KILN_TESTS_FAKE_KG_FLASH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* s16: qkv, out, dout and dqkv stored in rd's 16 bits (ABI 1.7) instead
 * of float32; lse float32 either way. */
int fake_flash_forward_emu(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int rd, int s16,
                           char *why, size_t whylen);
int fake_flash_backward_emu(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                            const double *delta, int B, int T, int C, int NH, int rd, int s16, char *why,
                            size_t whylen);

#ifdef __cplusplus
}
#endif

#endif
