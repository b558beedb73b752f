/*
 * fake_launch.c — what every fake launcher shares (fake_internal.h): the
 * launch prologue (device-memory checks, draining the stream, the kernel
 * count), the overlap check, and 1.7's 16-bit storage as the kernels define
 * it (widened to float32, rounded to nearest even when stored). Used by the
 * fake kernels (fake_kg.c, fake_kg_seq.c) and by the flash launchers
 * (fake_kg_flash_launch.c), which the host-execution build
 * (tests/cuda_host) keeps beside the real kernels.
 */
#include <stdint.h>
#include <stdlib.h>

#include "cpu_kernels.h"
#include "fake_internal.h"
#include "kg_kernels.h"

int fake_act16(int dt) { return dt == KG_F16 || dt == KG_BF16; }

float *fake_widen16(int dt, const void *src, size_t n) {
    float *w = malloc((n ? n : 1) * sizeof *w);
    if (w && n) kc_cast(w, KG_F32, src, dt, n);
    return w;
}

void fake_store16(int dt, void *dst, const float *src, size_t n) {
    if (n) kc_cast(dst, dt, src, KG_F32, n);
}

cudaError_t fake_launch(const char *fn, cudaStream_t s, const fake_buf *bufs, int nbufs) {
    FAKE_RETURN_IF_LOST();
    /* a kernel fault surfaces later, as on a GPU: this launch succeeds */
    if (fake_inject("kernel_fault")) fake_fault(cudaErrorIllegalAddress);
    fake_work_on(s);
    for (int i = 0; i < nbufs; i++) {
        cudaError_t e = fake_need_device(fn, bufs[i].what, bufs[i].p, bufs[i].bytes);
        if (e != cudaSuccess) return e;
    }
    cudaError_t e = fake_stream_drain(s, fn);
    if (e != cudaSuccess) return e;
    fake_stats.kernels++;
    return cudaSuccess;
}

int fake_overlap(const char *fn, const char *wa, const void *a, size_t na, const char *wb, const void *b,
                        size_t nb) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    if (na == 0 || nb == 0 || !(x < y + nb && y < x + na)) return 0;
    fake_violation("%s: %s [%p, +%zu) and %s [%p, +%zu) overlap", fn, wa, a, na, wb, b, nb);
    return 1;
}
