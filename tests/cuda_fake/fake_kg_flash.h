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

int fake_flash_forward_emu(float *out, float *lse, const float *qkv, int B, int T, int C, int NH, int rd, char *why,
                           size_t whylen);
int fake_flash_backward_emu(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                            const double *delta, int B, int T, int C, int NH, int rd, char *why, size_t whylen);

#ifdef __cplusplus
}
#endif

#endif
