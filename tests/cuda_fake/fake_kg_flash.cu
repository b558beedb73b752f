/*
 * fake_kg_flash.cu: the fused ("flash") attention's programs for the fake
 * cuda accelerator, run on the host through kernels/cuda/kg_flash_host.cuh:
 * the same block programs the GPU runs (kg_flash.cuh), emulated thread by
 * thread with the emulation's checks (ldmatrix's alignment rule, reads of
 * unwritten shared memory, races between phases). fake_kg_seq.c's
 * kg_flash_forward / kg_flash_backward make the launch checks and call
 * these; a failed emulation check is reported as a contract violation and
 * the launch fails. Host code compiled by nvcc (the header is CUDA C++),
 * calling no CUDA runtime function.
 */
#include <stdio.h>

#include "fake_kg_flash.h"
#include "kg_flash_host.cuh"

extern "C" size_t kg_flash_smem_bytes(int D) { return kg_fl_smem_most(D); }

/* The emulation's verdict on the programs just run: 0, or -1 with its first
 * failure in why. */
static int fake_flash_verdict(int rc, char *why, size_t whylen) {
    const char *first = NULL;
    const long n = kg_fl_host_failures(&first);
    if (rc != 0) snprintf(why, whylen, "could not allocate the emulated shared memory");
    else if (n) snprintf(why, whylen, "%ld emulation failures, the first: %s", n, first);
    kg_fl_host_reset();
    return rc != 0 || n ? -1 : 0;
}

extern "C" int fake_flash_forward_emu(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int rd,
                                      int s16, char *why, size_t whylen) {
    const int D = C / NH;
    const kg_flash_args a = {qkv, NULL, NULL, NULL, NULL, out, lse, NULL, B, T, C, NH, rd,
                             (float)(1.0 / sqrt((double)D)), s16};
    kg_fl_host_reset();
    return fake_flash_verdict(kg_fl_host_run(KG_FL_FWD, rd, D, a), why, whylen);
}

extern "C" int fake_flash_backward_emu(void *dqkv, const void *dout, const void *qkv, const void *out,
                                       const float *lse, const double *delta, int B, int T, int C, int NH, int rd,
                                       int s16, char *why, size_t whylen) {
    const int D = C / NH;
    const kg_flash_args a = {qkv, dout, out, lse, delta, NULL, NULL, dqkv, B, T, C, NH, rd,
                             (float)(1.0 / sqrt((double)D)), s16};
    kg_fl_host_reset();
    int rc = kg_fl_host_run(KG_FL_DKDV, rd, D, a);
    if (rc == 0) rc = kg_fl_host_run(KG_FL_DQ, rd, D, a);
    return fake_flash_verdict(rc, why, whylen);
}
