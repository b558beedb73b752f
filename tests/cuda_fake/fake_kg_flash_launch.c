/*
 * fake_kg_flash_launch.c — the fused ("flash") attention's launchers of
 * kernels/cuda/kg_kernels.h for the fake CUDA runtime: kg_kernels.h's
 * refusals, the launch checks and the forbidden overlaps, then the block
 * programs themselves, emulated on the host (fake_kg_flash.cu); a failed
 * emulation check is a contract violation. Apart from fake_kg_seq.c because
 * the host-execution build (tests/cuda_host), which runs the other kernels'
 * own CUDA code, keeps these: the flash kernels' inline PTX (ldmatrix,
 * mma.sync) has a host execution of its own (kg_flash_host.cuh).
 */
#include "fake_internal.h"
#include "fake_kg_flash.h"
#include "kg_kernels.h"

static int fake_flash_args(int B, int T, int C, int NH, int rd, int sdt) {
    return B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0 && kg_flash_supported(KG_F32, rd, C / NH) &&
           (sdt == KG_F32 || sdt == rd);
}

static cudaError_t fake_flash_ran(const char *fn, int rc, const char *why) {
    if (rc == 0) return cudaSuccess;
    fake_violation("%s: %s", fn, why);
    return fake_error(cudaErrorLaunchFailure);
}

cudaError_t kg_flash_forward(cudaStream_t s, void *out, void *lse, const void *qkv, int B, int T, int C, int NH,
                             int round_dtype, int sdt) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_flash_args(B, T, C, NH, round_dtype, sdt)) return fake_error(cudaErrorInvalidValue);
    const size_t rows = (size_t)B * (size_t)T, ob = rows * (size_t)C * (sdt == KG_F32 ? 4 : 2), qb = 3 * ob;
    const size_t lb = rows * (size_t)NH * sizeof(float);
    const fake_buf bufs[] = {{"out", out, ob}, {"lse", lse, lb}, {"qkv", qkv, qb}};
    cudaError_t e = fake_launch(__func__, s, bufs, 3);
    if (e != cudaSuccess) return e;
    if (fake_overlap(__func__, "out", out, ob, "qkv", qkv, qb) || fake_overlap(__func__, "lse", lse, lb, "qkv", qkv, qb))
        return fake_error(cudaErrorInvalidValue);
    char why[600] = "";
    return fake_flash_ran(
        __func__, fake_flash_forward_emu(out, lse, qkv, B, T, C, NH, round_dtype, sdt != KG_F32, why, sizeof why), why);
}

cudaError_t kg_flash_backward(cudaStream_t s, void *dqkv, const void *dout, const void *qkv, const void *out,
                              const void *lse, int B, int T, int C, int NH, int round_dtype, int sdt, double *delta) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_flash_args(B, T, C, NH, round_dtype, sdt) || !delta) return fake_error(cudaErrorInvalidValue);
    const size_t rows = (size_t)B * (size_t)T, ob = rows * (size_t)C * (sdt == KG_F32 ? 4 : 2), qb = 3 * ob;
    const size_t lb = rows * (size_t)NH * sizeof(float);
    const fake_buf bufs[] = {{"dqkv", dqkv, qb}, {"dout", dout, ob}, {"qkv", qkv, qb},
                             {"out", out, ob},   {"lse", lse, lb},   {"delta", delta, rows * (size_t)NH * sizeof(double)}};
    cudaError_t e = fake_launch(__func__, s, bufs, 6);
    if (e != cudaSuccess) return e;
    if (fake_overlap(__func__, "dqkv", dqkv, qb, "qkv", qkv, qb) ||
        fake_overlap(__func__, "dqkv", dqkv, qb, "dout", dout, ob))
        return fake_error(cudaErrorInvalidValue);
    /* as the real launcher: delta first (its own launch), then the programs */
    if ((e = kg_attn_delta(s, sdt, dout, out, B, T, C, NH, delta)) != cudaSuccess) return e;
    char why[600] = "";
    return fake_flash_ran(__func__,
                          fake_flash_backward_emu(dqkv, dout, qkv, out, lse, delta, B, T, C, NH, round_dtype,
                                                  sdt != KG_F32, why, sizeof why),
                          why);
}
