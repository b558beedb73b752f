/*
 * nf4_cuda.h — the nf4/int4 quantizer on an NVIDIA GPU, for when the
 * accelerator's memory is CUDA device memory: the plugin's own CUDA kernel
 * (nf4_cuda.cu), built only when CMake finds nvcc (NF4_HAVE_CUDA). It does
 * on the device what nf4_convert does on the host with nf4_quant.c, bit for
 * bit: per block, absmax, the nearest code, and absmax * table[code] written
 * to the compute copy (fp32, or bf16 rounded to nearest even), with no copy
 * of the weights to the host and back. Plain C interface; the CUDA runtime
 * is linked statically, so the plugin still loads where there is none.
 */
#ifndef NF4_CUDA_H
#define NF4_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when p is CUDA device memory of a device this process can use (then
 * that device is made current for the quantizer), 0 otherwise: no driver,
 * no device, or host memory (the cpu accelerator, a fake one). */
int nf4_cuda_usable(const void *p);

/* Queues compute(numel) = dequantize(quantize(w(numel))) in blocks of
 * `block`, kind NF4Q_NF4 or NF4Q_INT4, into fp32 (bf16 = 0) or bfloat16
 * (bf16 = 1); w and compute are device pointers. 0, or -1 with the failing
 * call and CUDA's text in err. */
int nf4_cuda_fake_quant(int kind, const float *w, size_t numel, size_t block, void *compute, int bf16, char *err,
                        size_t errlen);
/* Waits until everything queued has finished: 0, or -1 as above. */
int nf4_cuda_finish(char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* NF4_CUDA_H */
