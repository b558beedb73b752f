/*
 * cuda_plugin.c — the "cuda" accelerator plugin as the host sees it
 * (libkiln-cuda.so): its descriptor, settings and ops, and nothing that
 * needs CUDA. Every command of the host loads every plugin library to read
 * descriptors, so the CUDA libraries stay out of this one (cuda_impl.h):
 * create() loads kiln-cuda-impl.so from this library's own directory, once
 * per process, and the ops forward to it. A machine without the CUDA
 * runtime libraries therefore still lists the plugin, and a run asking for
 * it fails with one line naming the missing library.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <kiln/kiln.h>

#include "cuda_impl.h"

/* The implementation, once loaded (the host never unloads plugins, and the
 * implementation stays loaded with it: RTLD_NODELETE). */
static const kiln_cuda_impl *cp_impl;

#ifdef KILN_CUDA_IMPL_STATIC
static int32_t cp_load(const kiln_host_services *svc, kiln_host_ctx *hctx) {
    (void)svc;
    (void)hctx;
    if (!cp_impl) cp_impl = kiln_cuda_impl_v1();
    return KILN_OK;
}
#else
static int32_t cp_load(const kiln_host_services *svc, kiln_host_ctx *hctx) {
    if (cp_impl) return KILN_OK;
    Dl_info self;
    char path[4096];
    if (!dladdr((void *)&cp_load, &self) || !self.dli_fname)
        return kiln_errorf(svc, hctx, KILN_E_INTERNAL, "cuda: cannot find the plugin's own file (dladdr)");
    const char *slash = strrchr(self.dli_fname, '/');
    const int dirlen = slash ? (int)(slash - self.dli_fname) : 1;
    snprintf(path, sizeof path, "%.*s/%s", dirlen, slash ? self.dli_fname : ".", KILN_CUDA_IMPL_FILE);
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *e = dlerror();
        const int runtime = e && (strstr(e, "libcudart") || strstr(e, "libcublas"));
        return kiln_errorf(svc, hctx, KILN_E_CUDA, "cuda: cannot load %s: %s%s", path, e ? e : "unknown error",
                           runtime ? " (the CUDA runtime libraries are missing: install the CUDA toolkit's runtime "
                                     "or add its lib directory to LD_LIBRARY_PATH)"
                                   : "");
    }
    kiln_cuda_impl_fn fn = (kiln_cuda_impl_fn)dlsym(h, KILN_CUDA_IMPL_SYMBOL);
    const kiln_cuda_impl *impl = fn ? fn() : NULL;
    if (!impl || impl->struct_size < sizeof(kiln_cuda_impl))
        return kiln_errorf(svc, hctx, KILN_E_VERSION,
                           "cuda: %s does not provide %s (or an older table): it belongs to another kiln build",
                           path, KILN_CUDA_IMPL_SYMBOL);
    cp_impl = impl;
    return KILN_OK;
}
#endif

static int32_t cp_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                         const kiln_kv *config, kiln_instance **out) {
    *out = NULL;
    int32_t rc = cp_load(svc, hctx);
    return rc != KILN_OK ? rc : cp_impl->create(plugin_ctx, svc, hctx, config, out);
}

/* An instance exists only after a successful create, hence after the load. */
static void cp_destroy(kiln_instance *acc) {
    if (acc && cp_impl) cp_impl->destroy(acc);
}
static const kiln_kernels *cp_kernels(kiln_instance *acc) { return cp_impl->kernels(acc); }
static int32_t cp_configure(kiln_instance *acc, int32_t threads, int32_t local_rank) {
    return cp_impl->configure(acc, threads, local_rank);
}

static const kiln_accelerator_ops cp_ops = {
    .base = {sizeof(kiln_accelerator_ops), 0, cp_create, cp_destroy, NULL, NULL},
    .kernels = cp_kernels,
    .configure = cp_configure,
};

static const kiln_param cp_params[] = {
    {"device", KILN_TYPE_INT, 0, KILN_V_INT(-1), "CUDA device ordinal; -1: the process's local rank"},
    {"tf32", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "run float32 GEMMs on TF32 tensor cores (faster, ~1e-3 relative)"},
    {"workspace_mib", KILN_TYPE_INT, 0, KILN_V_INT(32), "cuBLASLt workspace, MiB (0..4096)"},
    {"staging_mib", KILN_TYPE_INT, 0, KILN_V_INT(16), "each of the 4 pinned host-to-device staging buffers, MiB"},
    {"attention", KILN_TYPE_STRING, 0, KILN_V_STR("gemm"),
     "attention kernels: gemm (cuBLASLt batched products, tensor cores in 16-bit precisions), rowwise (one warp per "
     "row, no T x T buffers) or flash (fused 64 x 64 tiles on the tensor cores, no T x T buffers; 16-bit mixed "
     "precision with head sizes 16, 32, 64, 128, else gemm)"},
    {"profile", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0),
     "log the GPU time of each kernel-table entry and category at the end of the run (CUDA events; a few us per "
     "entry)"},
    {"caching", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1),
     "keep freed device blocks for reuse (sizes rounded up to 512 bytes, or 2 MiB above 1 MiB); false: cudaMalloc "
     "exactly the bytes asked and cudaFree at once, so a memory checker (compute-sanitizer) sees every overrun; slow"},
    {"attention_workspace_mib", KILN_TYPE_INT, 0, KILN_V_INT(2048),
     "gemm attention: the most score memory a call takes at once, MiB (the batch is split to fit)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const cp_checks[] = {"device >= -1", "workspace_mib in [0, 4096]", "staging_mib in [1, 1024]",
                                        "attention in {gemm, rowwise, flash}", "attention_workspace_mib in [16, 1048576]"};
static const kiln_kv cp_props[] = {
    {"device_type", KILN_V_STR("cuda")}, {"config_checks", KILN_V_STRS(cp_checks)}, {NULL, KILN_V_NONE}};

static const kiln_plugin_desc cp_desc = {
    sizeof(kiln_plugin_desc),
    KILN_KIND_ACCELERATOR,
    "cuda",
    "0.1.0",
    "NVIDIA GPU: cuBLASLt GEMMs (fp32/TF32, fp16, bf16, fp64), CUDA kernels, caching allocator",
    KILN_CAP_NEEDS_CUDA,
    cp_props,
    cp_params,
    &cp_ops,
    NULL,
};

KILN_DEFINE_LIBRARY("cuda", "0.1.0", 1, &cp_desc)
