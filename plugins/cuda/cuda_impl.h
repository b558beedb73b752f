/*
 * cuda_impl.h — the seam between the two libraries of the "cuda"
 * accelerator. The host dlopen()s every libkiln-*.so in its plugin
 * directories to read their descriptors, for every command (`plugins list`,
 * a CPU run); a plugin linked against cuBLASLt would make each of them map
 * the CUDA libraries (0.6 s and ~200 MiB of resident memory measured here).
 * So libkiln-cuda.so (cuda_plugin.c) holds only the descriptor and
 * forwarding ops, with no CUDA dependency, and loads kiln-cuda-impl.so (the
 * kernels, cuBLASLt, the CUDA runtime; no "lib" prefix, so the host's scan
 * skips it) from its own directory the first time a run creates the
 * accelerator. The implementation exports one function returning this
 * table; the instance it creates is the plugin's instance.
 */
#ifndef KILN_PLUGIN_CUDA_IMPL_H
#define KILN_PLUGIN_CUDA_IMPL_H

#include <kiln/kiln.h>

typedef struct kiln_cuda_impl {
    uint32_t struct_size;
    uint32_t reserved;
    int32_t (*create)(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                      kiln_instance **out);
    void (*destroy)(kiln_instance *acc);
    const kiln_kernels *(*kernels)(kiln_instance *acc);
    int32_t (*configure)(kiln_instance *acc, int32_t threads, int32_t local_rank);
} kiln_cuda_impl;

#define KILN_CUDA_IMPL_SYMBOL "kiln_cuda_impl_v1"
#define KILN_CUDA_IMPL_FILE "kiln-cuda-impl.so"
typedef const kiln_cuda_impl *(*kiln_cuda_impl_fn)(void);

#if defined(__GNUC__)
#define KILN_CUDA_IMPL_EXPORT __attribute__((visibility("default")))
#else
#define KILN_CUDA_IMPL_EXPORT
#endif

/* Defined by the implementation (cuda_accel.c). The fake-CUDA test build
 * links both parts into one library and calls it directly
 * (KILN_CUDA_IMPL_STATIC). */
KILN_CUDA_IMPL_EXPORT const kiln_cuda_impl *kiln_cuda_impl_v1(void);

#endif /* KILN_PLUGIN_CUDA_IMPL_H */
