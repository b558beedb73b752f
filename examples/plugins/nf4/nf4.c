/*
 * nf4.c — two 4-bit weight precisions in one out-of-tree library: "nf4"
 * (QLoRA's NormalFloat) and "int4" (symmetric integers). The fp32 master
 * weights, the optimizer and the gradients stay fp32; before every forward
 * (convert_params) each linear weight (ndim >= 2) is quantized block-wise
 * with an absmax per block and dequantized into a compute copy the module
 * reads, so training sees exactly the weights a 4-bit deployment would use
 * while updates go straight through to the masters (the straight-through
 * estimator: the module's backward writes p->grad against the compute
 * weights, and the optimizer applies it to the masters). Biases stay fp32,
 * as QLoRA quantizes only linear layers' weights. At on_fit_end rank 0
 * exports the packed codes and scales of the final masters as a safetensors
 * file in the run directory and logs the memory they take. Built only
 * against the installed SDK (find_package(Kiln)); nothing from the kiln tree.
 * On the cuda accelerator, when built with nvcc, convert_params runs the
 * plugin's own CUDA kernel (nf4_cuda.cu) on the device instead of copying
 * the weights to the host and back.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>
#include <kiln/precision_util.h>

#include "nf4_export.h"
#include "nf4_quant.h"
#ifdef NF4_HAVE_CUDA
#include "nf4_cuda.h"
#endif

#define NF4_VERSION "1.0.0"
#define NF4_MAX_BLOCK 4096
#define NF4_MAX_FILE 255

/* What distinguishes the two plugins of the library: passed back to
 * create() as plugin_ctx. */
typedef struct nf4_variant {
    int kind;          /* NF4Q_NF4 or NF4Q_INT4 */
    const char *name;  /* "nf4" / "int4"        */
} nf4_variant;

static nf4_variant nf4_variant_nf4 = {NF4Q_NF4, "nf4"};
static nf4_variant nf4_variant_int4 = {NF4Q_INT4, "int4"};

/* One quantized weight. codes/absmax point into the instance's arrays. */
typedef struct nf4_weight {
    kiln_parameter *p;
    size_t numel;
    size_t nblocks;  /* ceil(numel / block)                                    */
    uint8_t *codes;  /* (ceil(numel / 2)) packed codes, host memory            */
    float *absmax;   /* (nblocks) per-block scales, host memory                */
    void *compute;   /* (shape) compute_dtype, accelerator memory; = p->compute */
} nf4_weight;

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    const nf4_variant *var;
    /* config */
    size_t block;             /* elements per absmax block, even, 2..4096       */
    uint32_t compute_dtype;   /* KILN_DTYPE_F32 or KILN_DTYPE_BF16              */
    int scale_dtype;          /* NF4X_SCALE_F32 / NF4X_SCALE_F16 (export only)  */
    int export_on;
    int cuda_kernel;          /* config: quantize on the GPU when possible      */
    char export_file[NF4_MAX_FILE + 1];
    /* after setup */
    kiln_instance *acc;
    const kiln_kernels *k;
    int host_mem;             /* accelerator pointers are host pointers         */
    int gpu;                  /* masters in CUDA device memory: quantize there  */
    nf4_weight *w;            /* (nw)                                           */
    uint32_t nw;
    size_t max_numel;
    uint8_t *codes;           /* (sum ceil(numel/2)) every weight's codes       */
    float *absmax;            /* (sum nblocks) every weight's scales            */
    float *staging;           /* (max_numel) host fp32; device accelerators only */
    float *dev_f32;           /* (max_numel) accelerator fp32; bf16 compute only */
};

/* ---------------------------------------------------------------------------
 * create / destroy */

/* export_file names a file inside the run directory, nothing else: no
 * path separators, no "." or "..", so a config cannot write elsewhere. */
static int nf4_valid_file_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > NF4_MAX_FILE || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f) return 0;
    return 1;
}

static int32_t nf4_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                          const kiln_kv *config, kiln_instance **out) {
    const nf4_variant *var = plugin_ctx;
    if (!var) return kiln_errorf(svc, hctx, KILN_E_INTERNAL, "nf4: descriptor without its variant");
    const char *me = var->name;

    int64_t block = kiln_kv_int(config, "block_size", 64);
    if (block < 2 || block > NF4_MAX_BLOCK || block % 2)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "%s: block_size must be an even number in [2, %d] (two 4-bit codes per byte, "
                           "each block starting on a byte), got %lld",
                           me, NF4_MAX_BLOCK, (long long)block);

    const char *cd = kiln_kv_str(config, "compute_dtype", "float32");
    uint32_t compute_dtype = kiln_dtype_from_name(cd);
    if (compute_dtype != KILN_DTYPE_F32 && compute_dtype != KILN_DTYPE_BF16)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "%s: compute_dtype must be \"float32\" or \"bfloat16\" (what the dequantized weights "
                           "are stored in), got \"%s\"",
                           me, cd);

    const char *sd = kiln_kv_str(config, "scale_dtype", "float32");
    int scale_dtype;
    if (!strcmp(sd, "float32")) scale_dtype = NF4X_SCALE_F32;
    else if (!strcmp(sd, "float16")) scale_dtype = NF4X_SCALE_F16;
    else
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "%s: scale_dtype must be \"float32\" or \"float16\" (the exported absmax), got \"%s\"",
                           me, sd);

    const char *file = kiln_kv_str(config, "export_file", "nf4_weights.safetensors");
    if (!nf4_valid_file_name(file))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "%s: export_file must be a plain file name (1..%d characters, no '/', not '.' or "
                           "'..', no control characters) written inside the run directory, got \"%s\"",
                           me, NF4_MAX_FILE, file);

    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "%s: out of memory", me);
    self->svc = svc;
    self->hctx = hctx;
    self->var = var;
    self->block = (size_t)block;
    self->compute_dtype = compute_dtype;
    self->scale_dtype = scale_dtype;
    self->export_on = kiln_kv_int(config, "export", 1) != 0;
    self->cuda_kernel = kiln_kv_int(config, "cuda_kernel", 1) != 0;
    snprintf(self->export_file, sizeof self->export_file, "%s", file);
    *out = self;
    return KILN_OK;
}

/* Free everything setup made (the accelerator outlives the precision: the
 * host destroys instances in reverse creation order). */
static void nf4_release(kiln_instance *self) {
    if (self->k) {
        for (uint32_t i = 0; i < self->nw; i++) self->k->free(self->acc, self->w[i].compute);
        self->k->free(self->acc, self->dev_f32);
    }
    free(self->w);
    free(self->codes);
    free(self->absmax);
    free(self->staging);
    self->w = NULL;
    self->codes = NULL;
    self->absmax = NULL;
    self->staging = NULL;
    self->dev_f32 = NULL;
    self->nw = 0;
    self->max_numel = 0;
}

static void nf4_destroy(kiln_instance *self) {
    if (!self) return;
    nf4_release(self);
    free(self);
}

/* ---------------------------------------------------------------------------
 * setup / convert_params */

/* Quantized: linear weights. 1-D parameters (biases) stay fp32 like in
 * QLoRA: they are a tiny share of the memory and quantizing them costs
 * accuracy for nothing; an empty tensor has nothing to quantize. */
static int nf4_is_quantized(const kiln_parameter *p) { return p->ndim >= 2 && p->numel > 0; }

static int32_t nf4_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t n) {
    const kiln_host_services *svc = self->svc;
    const char *me = self->var->name;
    nf4_release(self);

    kiln_instance *acc = NULL;
    const kiln_kernels *k = NULL;
    int32_t rc = svc->accelerator ? svc->accelerator(self->hctx, &acc, &k) : KILN_E_UNSUPPORTED;
    if (rc != KILN_OK || !k)
        return kiln_errorf(svc, self->hctx, KILN_E_STATE, "%s: the host gave no accelerator (%s)", me,
                           kiln_strerror(rc));
    if (k->struct_size < KILN_KERNELS_SIZE_1_1 || !k->alloc || !k->free || !k->copy)
        return kiln_errorf(svc, self->hctx, KILN_E_UNSUPPORTED,
                           "%s: the accelerator's kernel table is too small (%u bytes, need >= %zu with "
                           "alloc/free/copy)",
                           me, (unsigned)k->struct_size, (size_t)KILN_KERNELS_SIZE_1_1);
    if (self->compute_dtype == KILN_DTYPE_BF16 && k->struct_size < KILN_KERNELS_SIZE_1_2)
        return kiln_errorf(svc, self->hctx, KILN_E_UNSUPPORTED,
                           "%s: compute_dtype = \"bfloat16\" needs the accelerator's 1.2 `cast` kernel, but its "
                           "kernel table is a 1.1 one (%u bytes, 1.2 has %zu); use compute_dtype = \"float32\"",
                           me, (unsigned)k->struct_size, (size_t)KILN_KERNELS_SIZE_1_2);
    if (self->compute_dtype == KILN_DTYPE_BF16 && !k->cast)
        return kiln_errorf(svc, self->hctx, KILN_E_UNSUPPORTED,
                           "%s: compute_dtype = \"bfloat16\" needs the accelerator's `cast` kernel, which this "
                           "accelerator leaves NULL; use compute_dtype = \"float32\"",
                           me);

    /* Check everything before allocating anything. */
    uint32_t nw = 0;
    size_t ncodes = 0, nblocks = 0, max_numel = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kiln_parameter *p = params[i];
        uint32_t pdt = kiln_param_dtype(p);
        if (pdt != KILN_DTYPE_F32)
            return kiln_errorf(svc, self->hctx, KILN_E_CONFIG,
                               "%s: parameter %s has %s master weights; this precision quantizes float32 "
                               "masters only",
                               me, p->name, kiln_dtype_name(pdt));
        if (!nf4_is_quantized(p)) continue;
        size_t numel = (size_t)p->numel;
        nw++;
        ncodes += nf4q_packed_bytes(numel);
        nblocks += nf4q_num_blocks(numel, self->block);
        if (numel > max_numel) max_numel = numel;
    }

    self->acc = acc;
    self->k = k;
    self->host_mem = (k->flags & KILN_KERNELS_HOST_MEMORY) != 0;
    self->w = calloc(nw ? nw : 1, sizeof *self->w);
    self->codes = malloc(ncodes ? ncodes : 1);
    self->absmax = malloc((nblocks ? nblocks : 1) * sizeof(float));
    if (!self->host_mem) self->staging = malloc((max_numel ? max_numel : 1) * sizeof(float));
    if (!self->w || !self->codes || !self->absmax || (!self->host_mem && !self->staging)) {
        nf4_release(self);
        return kiln_errorf(svc, self->hctx, KILN_E_NOMEM, "%s: out of memory for %zu bytes of codes", me, ncodes);
    }
    self->max_numel = max_numel;
    if (self->compute_dtype == KILN_DTYPE_BF16 && max_numel) {
        void *scratch = NULL;
        rc = k->alloc(acc, max_numel * sizeof(float), &scratch);
        self->dev_f32 = scratch;
        if (rc != KILN_OK) {
            nf4_release(self);
            return kiln_errorf(svc, self->hctx, rc, "%s: cannot allocate the %zu-byte fp32 scratch buffer: %s", me,
                               max_numel * sizeof(float), kiln_strerror(rc));
        }
    }

    size_t co = 0, bo = 0, esz = kiln_dtype_size(self->compute_dtype);
    for (uint32_t i = 0; i < n; i++) {
        kiln_parameter *p = params[i];
        if (!nf4_is_quantized(p)) continue;
        nf4_weight *w = &self->w[self->nw];
        w->p = p;
        w->numel = (size_t)p->numel;
        w->nblocks = nf4q_num_blocks(w->numel, self->block);
        w->codes = self->codes + co;
        w->absmax = self->absmax + bo;
        co += nf4q_packed_bytes(w->numel);
        bo += w->nblocks;
        rc = k->alloc(acc, w->numel * esz, &w->compute);
        if (rc != KILN_OK) {
            nf4_release(self); /* frees the compute buffers of the first nw */
            return kiln_errorf(svc, self->hctx, rc, "%s: cannot allocate the %s compute copy of %s (%zu bytes): %s",
                               me, kiln_dtype_name(self->compute_dtype), p->name, w->numel * esz,
                               kiln_strerror(rc));
        }
        self->nw++;
    }

    /* Only now, with nothing left to fail, hand the buffers to the module. */
    uint32_t j = 0;
    for (uint32_t i = 0; i < n; i++) {
        kiln_parameter *p = params[i];
        if (nf4_is_quantized(p)) {
            p->compute = self->w[j++].compute;
            p->compute_dtype = self->compute_dtype;
        } else {
            p->compute = p->data;
            p->compute_dtype = KILN_DTYPE_F32;
        }
    }
#ifdef NF4_HAVE_CUDA
    /* Device memory that CUDA knows: quantize with our own kernel, in place
     * on the device. Anything else (host memory, no driver) takes the host
     * path through the kernel table's copies. */
    self->gpu = self->cuda_kernel && !self->host_mem && self->nw > 0 && nf4_cuda_usable(self->w[0].p->data);
#endif
    kiln_logf(svc, self->hctx, KILN_LOG_DEBUG, "%s: %u of %u parameters quantized, block %zu, compute %s, on the %s",
              me, self->nw, n, self->block, kiln_dtype_name(self->compute_dtype),
              self->gpu ? "GPU (the plugin's CUDA kernel)" : "host");
    if (self->gpu)
        kiln_logf(svc, self->hctx, KILN_LOG_INFO, "%s: quantizing on the GPU with the plugin's CUDA kernel", me);
    return KILN_OK;
}

#ifdef NF4_HAVE_CUDA
/* convert_params on the GPU: the plugin's kernel reads the masters and
 * writes the compute copies on the device. The host codes are not updated
 * (export quantizes the final masters on the host). */
static int32_t nf4_convert_gpu(kiln_instance *self) {
    const char *me = self->var->name;
    /* the optimizer's update of the masters is queued on the accelerator's
     * stream; our kernel runs on another */
    int32_t rc = self->k->synchronize ? self->k->synchronize(self->acc) : KILN_OK;
    if (rc != KILN_OK)
        return kiln_errorf(self->svc, self->hctx, rc, "%s: waiting for the accelerator failed: %s", me,
                           kiln_strerror(rc));
    char err[256];
    for (uint32_t i = 0; i < self->nw; i++) {
        const nf4_weight *w = &self->w[i];
        if (nf4_cuda_fake_quant(self->var->kind, w->p->data, w->numel, self->block, w->compute,
                                self->compute_dtype == KILN_DTYPE_BF16, err, sizeof err) != 0)
            return kiln_errorf(self->svc, self->hctx, KILN_E_INTERNAL, "%s: quantizing %s on the GPU: %s", me,
                               w->p->name, err);
    }
    if (nf4_cuda_finish(err, sizeof err) != 0) /* one wait for all the weights */
        return kiln_errorf(self->svc, self->hctx, KILN_E_INTERNAL, "%s: quantizing on the GPU: %s", me, err);
    return KILN_OK;
}
#endif

/* Quantize every weight's masters into codes/absmax on the host and write
 * the dequantized values to its compute copy. No allocation: all buffers
 * come from setup. */
static int32_t nf4_convert_host(kiln_instance *self) {
    const kiln_kernels *k = self->k;
    const char *me = self->var->name;
    const int bf16 = self->compute_dtype == KILN_DTYPE_BF16;
    for (uint32_t i = 0; i < self->nw; i++) {
        nf4_weight *w = &self->w[i];
        size_t bytes = w->numel * sizeof(float);
        const float *src = w->p->data; /* (numel) fp32 masters */
        int32_t rc;
        if (!self->host_mem) {
            rc = k->copy(self->acc, self->staging, w->p->data, bytes, KILN_COPY_D2H);
            if (rc != KILN_OK)
                return kiln_errorf(self->svc, self->hctx, rc, "%s: copying %s to the host failed: %s", me,
                                   w->p->name, kiln_strerror(rc));
            src = self->staging;
        }
        nf4q_quantize(self->var->kind, src, w->numel, self->block, w->codes, w->absmax);
        /* fp32 destination the host can write: the compute copy itself, the
         * bf16 path's fp32 scratch, or (device memory) the staging buffer,
         * whose masters are no longer needed */
        float *dst = !self->host_mem ? self->staging : bf16 ? self->dev_f32 : (float *)w->compute;
        nf4q_dequantize(self->var->kind, w->codes, w->absmax, w->numel, self->block, dst);
        if (!self->host_mem) {
            rc = k->copy(self->acc, bf16 ? (void *)self->dev_f32 : w->compute, self->staging, bytes, KILN_COPY_H2D);
            if (rc != KILN_OK)
                return kiln_errorf(self->svc, self->hctx, rc, "%s: copying %s back to the accelerator failed: %s",
                                   me, w->p->name, kiln_strerror(rc));
        }
        if (bf16) {
            rc = k->cast(self->acc, w->compute, KILN_DTYPE_BF16, self->dev_f32, KILN_DTYPE_F32, w->numel);
            if (rc != KILN_OK)
                return kiln_errorf(self->svc, self->hctx, rc, "%s: casting %s to bfloat16 failed: %s", me,
                                   w->p->name, kiln_strerror(rc));
        }
    }
    return KILN_OK;
}

/* convert_params: before every forward. */
static int32_t nf4_convert(kiln_instance *self) {
#ifdef NF4_HAVE_CUDA
    if (self->gpu) return nf4_convert_gpu(self);
#endif
    return nf4_convert_host(self);
}

/* ---------------------------------------------------------------------------
 * backward / optimizer step: plain fp32, as 32-true */

static int32_t nf4_pre_backward(kiln_instance *self, double loss, double *scale) {
    (void)self;
    (void)loss;
    *scale = 1.0; /* fp32 gradients: no loss scaling */
    return KILN_OK;
}

/* Precision.optimizer_step: the optimizer runs the host's closure, then
 * after_closure (kiln/precision_util.h); the straight-through gradients need
 * nothing more. */
static int32_t nf4_optimizer_step(kiln_instance *self, const kiln_optimizer_ref *opt, const kiln_closure *closure,
                                  const kiln_closure *after_closure, int32_t *skipped) {
    (void)self;
    return kiln_precision_default_step(opt, closure, after_closure, skipped);
}

/* ---------------------------------------------------------------------------
 * on_fit_end: export and report */

static double nf4_mib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* One info line: "nf4: 1861632 weights in 4-bit: 0.89 MiB codes + 0.11 MiB
 * scales = 1.00 MiB vs 7.10 MiB fp32 (14.1%)" (scales counted in the
 * export's scale_dtype; fp32 is what the same weights take unquantized). */
static void nf4_report(kiln_instance *self) {
    uint64_t codes = 0, scales = 0, numel = 0;
    size_t ssz = self->scale_dtype == NF4X_SCALE_F16 ? 2 : 4;
    for (uint32_t i = 0; i < self->nw; i++) {
        numel += self->w[i].numel;
        codes += nf4q_packed_bytes(self->w[i].numel);
        scales += (uint64_t)self->w[i].nblocks * ssz;
    }
    uint64_t fp32 = numel * 4;
    kiln_logf(self->svc, self->hctx, KILN_LOG_INFO,
              "%s: %llu weights in 4-bit: %.2f MiB codes + %.2f MiB scales = %.2f MiB vs %.2f MiB fp32 (%.1f%%)",
              self->var->name, (unsigned long long)numel, nf4_mib(codes), nf4_mib(scales), nf4_mib(codes + scales),
              nf4_mib(fp32), fp32 ? 100.0 * (double)(codes + scales) / (double)fp32 : 0.0);
}

static int32_t nf4_export(kiln_instance *self, const kiln_trainer_state *tr) {
    const kiln_host_services *svc = self->svc;
    const char *me = self->var->name;
    if (!tr || !tr->run_dir || !tr->run_dir[0]) {
        kiln_logf(svc, self->hctx, KILN_LOG_INFO, "%s: no run directory; the quantized weights are not exported",
                  me);
        return KILN_OK;
    }
    /* The codes of the final masters (the last convert_params ran before
     * the last optimizer step), on the host whatever convert_params used. */
    int32_t rc = nf4_convert_host(self);
    if (rc != KILN_OK) return rc;

    nf4x_weight *xw = calloc(self->nw ? self->nw : 1, sizeof *xw);
    size_t plen = strlen(tr->run_dir) + 1 + strlen(self->export_file) + 1;
    char *path = malloc(plen);
    if (!xw || !path) {
        free(xw);
        free(path);
        return kiln_errorf(svc, self->hctx, KILN_E_NOMEM, "%s: out of memory", me);
    }
    snprintf(path, plen, "%s/%s", tr->run_dir, self->export_file);
    size_t f16_overflow = 0;
    for (uint32_t i = 0; i < self->nw; i++) {
        const nf4_weight *w = &self->w[i];
        xw[i] = (nf4x_weight){w->p->name, w->p->ndim, w->p->shape, w->numel, w->codes, w->absmax};
        if (self->scale_dtype == NF4X_SCALE_F16)
            for (size_t b = 0; b < w->nblocks; b++) f16_overflow += w->absmax[b] >= 65520.0f; /* rounds to inf */
    }
    if (f16_overflow)
        kiln_logf(svc, self->hctx, KILN_LOG_WARN,
                  "%s: %zu block scales are beyond float16's range (>= 65520) and are exported as inf; use "
                  "scale_dtype = \"float32\"",
                  me, f16_overflow);
    char err[512];
    if (nf4x_write(path, nf4q_kind_name(self->var->kind), self->block, self->scale_dtype, xw, self->nw, err,
                   sizeof err)) {
        free(xw);
        free(path);
        return kiln_errorf(svc, self->hctx, KILN_E_IO, "%s: exporting the quantized weights failed: %s", me, err);
    }
    kiln_logf(svc, self->hctx, KILN_LOG_INFO, "%s: exported %u quantized weights to %s", me, self->nw, path);
    free(xw);
    free(path);
    return KILN_OK;
}

static int32_t nf4_on_event(kiln_instance *self, kiln_event *ev) {
    if (!ev || ev->id != KILN_EV_ON_FIT_END) return KILN_OK;
    const kiln_trainer_state *tr = ev->trainer;
    if (tr && tr->rank != 0) return KILN_OK; /* one writer, one report: rank 0 */
    int32_t rc = self->export_on ? nf4_export(self, tr) : KILN_OK;
    if (rc == KILN_OK) nf4_report(self);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Descriptors */

static const kiln_precision_ops nf4_ops = {
    .base = {sizeof(kiln_precision_ops), 0, nf4_create, nf4_destroy, NULL, NULL},
    .setup = nf4_setup,
    .convert_params = nf4_convert,
    .pre_backward = nf4_pre_backward,
    .optimizer_step = nf4_optimizer_step,
    .on_event = nf4_on_event,
};

static const kiln_param nf4_params[] = {
    {"block_size", KILN_TYPE_INT, 0, KILN_V_INT(64),
     "elements per absmax block (even, 2..4096; the last block of a weight may be shorter)"},
    {"compute_dtype", KILN_TYPE_STRING, 0, KILN_V_STR("float32"),
     "dtype of the dequantized weights the forward reads: float32 or bfloat16 (needs the 1.2 cast kernel)"},
    {"scale_dtype", KILN_TYPE_STRING, 0, KILN_V_STR("float32"), "dtype of the exported absmax: float32 or float16"},
    {"export", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1),
     "at on_fit_end, rank 0 writes the packed codes and scales to <run_dir>/<export_file>"},
    {"export_file", KILN_TYPE_STRING, 0, KILN_V_STR("nf4_weights.safetensors"),
     "file name (no directory) of the safetensors export inside the run directory"},
    {"cuda_kernel", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1),
     "on the cuda accelerator, quantize with this plugin's CUDA kernel on the device (when built with nvcc); "
     "false: copy the weights to the host and back, as on any accelerator"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* compute_dtype here is the default; the config's compute_dtype overrides
 * it per run (properties are static, read without an instance). */
#define NF4_PROPS(prec)                                                                                  \
    {"precision", KILN_V_STR(prec)},                                                                     \
    {"amp_backend", KILN_V_STR("kiln-example-4bit")},                                                    \
    {"amp_level", KILN_V_STR("none")},                                                                   \
    {"param_dtype", KILN_V_STR("float32")},                                                              \
    {"compute_dtype", KILN_V_STR("float32")},                                                            \
    {"grad_dtype", KILN_V_STR("float32")},                                                               \
    {"needs_grad_scaler", KILN_V_BOOL(0)},                                                               \
    {"bits_per_weight", KILN_V_FLOAT(4.0)},                                                              \
    {NULL, KILN_V_NONE}

static const kiln_kv nf4_props[] = {NF4_PROPS("nf4")};
static const kiln_kv int4_props[] = {NF4_PROPS("int4")};

static const kiln_plugin_desc nf4_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_PRECISION,
    .name = "nf4",
    .version = NF4_VERSION,
    .description = "QLoRA 4-bit NormalFloat weights: linear weights quantized block-wise (absmax per block) "
                   "before every forward, fp32 masters/gradients (straight-through), biases fp32; 4 bits per "
                   "weight for the codes, scales add 32/block_size; exports safetensors at fit end",
    .capabilities = KILN_CAP_DETERMINISTIC,
    .properties = nf4_props,
    .params = nf4_params,
    .ops = &nf4_ops,
    .plugin_ctx = &nf4_variant_nf4,
};

static const kiln_plugin_desc int4_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_PRECISION,
    .name = "int4",
    .version = NF4_VERSION,
    .description = "symmetric 4-bit integer weights (q in [-7, 7], absmax per block) before every forward, fp32 "
                   "masters/gradients (straight-through), biases fp32; 4 bits per weight for the codes, scales "
                   "add 32/block_size; exports safetensors at fit end",
    .capabilities = KILN_CAP_DETERMINISTIC,
    .properties = int4_props,
    .params = nf4_params,
    .ops = &nf4_ops,
    .plugin_ctx = &nf4_variant_int4,
};

KILN_DEFINE_LIBRARY("nf4", NF4_VERSION, 2, &nf4_desc, &int4_desc)
