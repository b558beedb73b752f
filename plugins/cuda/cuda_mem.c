/*
 * cuda_mem.c — device memory and copies for the "cuda" accelerator. Training
 * allocates its tensors once and then frees and reallocates the same sizes
 * (activation buffers when the batch size changes, gemm scratch, a module
 * rebuilt for validation), and cudaMalloc/cudaFree synchronise the whole
 * device, so blocks are cached: free() only marks a block unused, alloc()
 * takes the smallest cached block that fits without wasting more than a
 * quarter of it, and cudaMalloc runs only when none does (and, on
 * out-of-memory, once more after the cache has been returned to the driver).
 * With `caching = false` every block is cudaMalloc'ed at its exact size and
 * cudaFree'd when freed, for a memory checker: in a cached, rounded block an
 * overrun lands in slack or in the next tensor, where no checker sees it.
 * All work runs on the instance's one stream, so a block freed and reused is
 * ordered after the kernels that used it without events. The kernel table
 * promises zero-filled memory from alloc(); the zeroing is queued on the
 * stream too. The plugin's own scratch (cu_alloc_scratch, cu_reserve) is
 * not zeroed: its users write it before reading it, and it grows inside
 * kernel entries, on the training step's path.
 * Host-to-device copies go through a ring of pinned staging slots: the host
 * bytes are copied into a slot and the DMA is queued, so the call returns
 * while the device still works on earlier kernels (the host's part of the
 * batch copy overlaps the previous step's compute; the DMA itself runs in
 * stream order, after those kernels), and a slot is reused only after the
 * event recorded behind its DMA has passed. Device-to-host copies wait for the
 * stream, because the caller reads the result as soon as copy() returns.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* The errors after which the CUDA context is unusable: the runtime's
 * documentation says each leaves the process in an inconsistent state in
 * which every later CUDA call fails, until the process is restarted. */
static int cu_sticky(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorContained:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice: return 1;
    default: return 0;
    }
}

int32_t cu_fail(kiln_instance *acc, cudaError_t e, const char *what, const char *call) {
    (void)cudaGetLastError(); /* clear a non-sticky error so it is reported once */
    const int32_t code = e == cudaErrorMemoryAllocation ? KILN_E_NOMEM : KILN_E_CUDA;
    char drv[16], rt[16];
    cu_version(acc->driver_version, drv, sizeof drv);
    cu_version(acc->runtime_version, rt, sizeof rt);
    if (cu_sticky(e)) {
        /* the fault belongs to whatever kernel ran last, often queued by an
         * earlier entry: the entry named here is only where it surfaced */
        if (acc->lost == cudaSuccess) {
            acc->lost = e;
            snprintf(acc->lost_at, sizeof acc->lost_at, "%s", what);
        }
        return CU_ERR(acc, code,
                      "cuda: %s: %s failed: %s (%s); the CUDA context is lost: a kernel queued up to here faulted "
                      "(not necessarily this entry's), and every later CUDA call in this process fails; rerun "
                      "with CUDA_LAUNCH_BLOCKING=1, or under compute-sanitizer with accelerator.caching = false, to "
                      "find the kernel",
                      what, call, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    if (e == cudaErrorInsufficientDriver || e == cudaErrorUnsupportedPtxVersion ||
        e == cudaErrorCallRequiresNewerDriver)
        return CU_ERR(acc, code,
                      "cuda: %s: %s failed: %s (%s); the driver supports CUDA %s and this plugin runs on CUDA "
                      "runtime %s: install a driver for CUDA %s or newer",
                      what, call, cudaGetErrorName(e), cudaGetErrorString(e), drv, rt, rt);
    if (e == cudaErrorNoKernelImageForDevice)
        return CU_ERR(acc, code,
                      "cuda: %s: %s failed: %s (%s); this build has no code for %s (compute capability %d.%d): "
                      "rebuild kiln with CMAKE_CUDA_ARCHITECTURES naming it",
                      what, call, cudaGetErrorName(e), cudaGetErrorString(e), acc->device_name, acc->cc_major,
                      acc->cc_minor);
    return CU_ERR(acc, code, "cuda: %s: %s failed: %s (%s)", what, call, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* Sizes are rounded so that nearby requests share cached blocks: 512 bytes
 * (cuBLASLt and vector loads like 256-byte alignment; cudaMalloc gives
 * more), and whole 2 MiB above 1 MiB, where the driver maps large pages. */
static size_t cu_round(size_t bytes) {
    if (bytes == 0) return 512;
    if (bytes > ((size_t)1 << 20)) {
        const size_t huge = (size_t)2 << 20;
        return bytes > SIZE_MAX - huge ? 0 : (bytes + huge - 1) & ~(huge - 1);
    }
    return (bytes + 511) & ~(size_t)511;
}

/* Returns every cached (unused) block to the driver. The table stays
 * consistent when a cudaFree fails part-way: a block whose free failed is
 * kept (still cached), the rest are still tried, and the first error is
 * returned. */
static int32_t cu_trim(kiln_instance *acc) {
    size_t w = 0;
    cudaError_t first = cudaSuccess;
    for (size_t i = 0; i < acc->nblocks; i++) {
        cu_block b = acc->blocks[i];
        if (!b.in_use) {
            cudaError_t e = cudaFree(b.ptr);
            if (e == cudaSuccess) {
                acc->bytes_cached -= b.size;
                continue;
            }
            (void)cudaGetLastError();
            if (first == cudaSuccess) first = e;
        }
        acc->blocks[w++] = b;
    }
    acc->nblocks = w;
    if (first != cudaSuccess) return cu_fail(acc, first, "alloc (returning cached memory)", "cudaFree");
    return KILN_OK;
}

/* A block of at least `bytes` from the cache or cudaMalloc, its contents
 * whatever its last user left (zero-filled only when `zero`). No entry
 * prologue (cu_enter): the table's alloc makes it, and the plugin's own
 * callers are inside an entry or configure(), which made the device current
 * already. (A second prologue would also cut the entry's profile interval:
 * its kernels after the allocation would be booked to "alloc".) */
static int32_t cu_take(kiln_instance *acc, size_t bytes, void **out, int zero) {
    if (!out) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: alloc: out is NULL");
    *out = NULL;
    /* caching = false: the exact size (1 byte for 0), never a cached block */
    const size_t want = acc->caching ? cu_round(bytes) : bytes ? bytes : 1;
    if (want == 0) return CU_ERR(acc, KILN_E_NOMEM, "cuda: alloc: %zu bytes is larger than the address space", bytes);

    /* best fit among cached blocks, at most 25% larger than needed */
    cu_block *best = NULL;
    for (size_t i = 0; acc->caching && i < acc->nblocks; i++) {
        cu_block *b = &acc->blocks[i];
        if (b->in_use || b->size < want || b->size - want > want / 4) continue;
        if (!best || b->size < best->size) best = b;
    }
    if (!best) {
        if (acc->nblocks == acc->cap_blocks) {
            size_t cap = acc->cap_blocks ? acc->cap_blocks * 2 : 64;
            cu_block *nb = realloc(acc->blocks, cap * sizeof *nb);
            if (!nb) return CU_ERR(acc, KILN_E_NOMEM, "cuda: alloc: out of host memory for the block table");
            acc->blocks = nb;
            acc->cap_blocks = cap;
        }
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, want);
        if (e == cudaErrorMemoryAllocation && acc->bytes_cached > 0) {
            (void)cudaGetLastError();
            int32_t rc = cu_trim(acc);
            if (rc != KILN_OK) return rc;
            e = cudaMalloc(&p, want);
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            (void)cudaMemGetInfo(&free_b, &total_b);
            (void)cudaGetLastError();
            return CU_ERR(acc, e == cudaErrorMemoryAllocation ? KILN_E_NOMEM : KILN_E_CUDA,
                          "cuda: alloc: cudaMalloc(%zu bytes) failed on device %d: %s (%zu MiB free of %zu MiB, %zu "
                          "MiB held by kiln)",
                          want, acc->device, cudaGetErrorString(e), free_b >> 20, total_b >> 20,
                          (acc->bytes_in_use + acc->bytes_cached) >> 20);
        }
        acc->device_mallocs++;
        best = &acc->blocks[acc->nblocks++];
        best->ptr = p;
        best->size = want;
        best->in_use = 0;
        acc->bytes_cached += want;
    }
    best->in_use = 1;
    acc->bytes_cached -= best->size;
    acc->bytes_in_use += best->size;
    if (zero) CU_CHECK(acc, "alloc (zero fill)", cudaMemsetAsync(best->ptr, 0, best->size, acc->stream));
    *out = best->ptr;
    return KILN_OK;
}

/* The kernel table's alloc: zero-filled, as the ABI promises. */
int32_t cu_alloc(kiln_instance *acc, size_t bytes, void **out) {
    if (out) *out = NULL;
    CU_READY(acc, "alloc");
    return cu_take(acc, bytes, out, 1);
}

/* The plugin's own scratch (cuBLASLt workspace, reduction partials, grow-only
 * scratch inside kernel entries): every user writes before it reads, so
 * the fill would be a memset of the whole block on the step's path (a grown
 * gemm_ex scratch is tens of MiB) for nothing. */
int32_t cu_alloc_scratch(kiln_instance *acc, size_t bytes, void **out) { return cu_take(acc, bytes, out, 0); }

void cu_free(kiln_instance *acc, void *ptr) {
    if (!ptr || !acc) return;
    for (size_t i = acc->nblocks; i-- > 0;) {
        cu_block *b = &acc->blocks[i];
        if (b->ptr != ptr) continue;
        if (b->in_use) {
            b->in_use = 0;
            acc->bytes_in_use -= b->size;
            acc->bytes_cached += b->size;
        }
        cu_labels_touched(acc, b->ptr, b->size); /* the block may come back as other data */
        if (!acc->caching) {
            /* cudaFree waits for the kernels still using the block; it
             * frees on the current device, which another instance or
             * thread may have changed (free() takes no cu_enter) */
            int cur = -1;
            if (cudaGetDevice(&cur) != cudaSuccess || cur != acc->device) (void)cudaSetDevice(acc->device);
            cudaError_t e = cudaFree(b->ptr);
            if (e != cudaSuccess) {
                (void)cudaGetLastError(); /* kept, as cu_trim keeps a block whose free failed */
                return;
            }
            acc->bytes_cached -= b->size;
            *b = acc->blocks[--acc->nblocks];
        }
        return;
    }
    /* free() cannot fail in the ABI; a pointer we never gave out is a
     * caller bug worth a line in the log rather than a crash. */
    kiln_logf(acc->svc, acc->hctx, KILN_LOG_WARN, "cuda: free: %p was not allocated by this accelerator; ignored", ptr);
}

/* The ring's next slot, waiting for its previous DMA and allocating its
 * pinned buffer on first use. */
static int32_t cu_next_stage(kiln_instance *acc, cu_stage **out) {
    cu_stage *s = &acc->stages[acc->next_stage];
    acc->next_stage = (acc->next_stage + 1) % CU_STAGES;
    if (s->pending) {
        CU_CHECK(acc, "copy (staging slot reuse)", cudaEventSynchronize(s->done));
        s->pending = 0;
    }
    if (!s->host) {
        CU_CHECK(acc, "copy (pinned staging buffer)", cudaHostAlloc(&s->host, acc->stage_bytes, cudaHostAllocDefault));
        s->bytes = acc->stage_bytes;
    }
    *out = s;
    return KILN_OK;
}

static int cu_overlap(const void *a, const void *b, size_t n) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + n && y < x + n;
}

int32_t cu_copy(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind) {
    if (kind != KILN_COPY_H2D && kind != KILN_COPY_D2H && kind != KILN_COPY_D2D)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: copy: kind must be KILN_COPY_H2D, D2H or D2D (0..2), got %d",
                      (int)kind);
    if (bytes == 0) return KILN_OK;
    if (!dst || !src)
        return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: copy: %s pointer is NULL for %zu bytes",
                      dst ? "source" : "destination", bytes);
    CU_READY(acc, "copy");
    return cu_copy_in(acc, dst, src, bytes, kind);
}

int32_t cu_copy_in(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind) {
    if (kind != KILN_COPY_D2H) cu_labels_touched(acc, dst, bytes);
    if (kind == KILN_COPY_H2D) {
        for (size_t off = 0; off < bytes;) {
            cu_stage *s = NULL;
            int32_t rc = cu_next_stage(acc, &s);
            if (rc != KILN_OK) return rc;
            const size_t chunk = bytes - off < s->bytes ? bytes - off : s->bytes;
            memcpy(s->host, (const char *)src + off, chunk);
            CU_CHECK(acc, "copy (host to device)",
                     cudaMemcpyAsync((char *)dst + off, s->host, chunk, cudaMemcpyHostToDevice, acc->stream));
            const cudaError_t e = cudaEventRecord(s->done, acc->stream);
            if (e != cudaSuccess) {
                /* the DMA is queued, but nothing marks when it has read the
                 * slot: wait for it, or the slot's next user could
                 * overwrite bytes still being copied */
                (void)cudaStreamSynchronize(acc->stream);
                return cu_fail(acc, e, "copy (host to device)", "cudaEventRecord(s->done, acc->stream)");
            }
            s->pending = 1;
            off += chunk;
        }
        return KILN_OK;
    }
    if (kind == KILN_COPY_D2H) {
        CU_CHECK(acc, "copy (device to host)", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, acc->stream));
        CU_CHECK(acc, "copy (device to host)", cu_wait(acc));
        return KILN_OK;
    }
    if (dst == src) return KILN_OK;
    if (cu_overlap(dst, src, bytes)) {
        /* cudaMemcpy does not promise memmove semantics; bounce through
         * scratch (rare: only overlapping views of one buffer). */
        int32_t rc = cu_reserve(acc, &acc->ws, &acc->ws_bytes, bytes, "copy (overlap scratch)");
        if (rc != KILN_OK) return rc;
        CU_CHECK(acc, "copy (device to device)",
                 cudaMemcpyAsync(acc->ws, src, bytes, cudaMemcpyDeviceToDevice, acc->stream));
        src = acc->ws;
    }
    CU_CHECK(acc, "copy (device to device)", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, acc->stream));
    return KILN_OK;
}

int32_t cu_zero(kiln_instance *acc, void *ptr, size_t bytes) {
    if (bytes == 0) return KILN_OK;
    if (!ptr) return CU_ERR(acc, KILN_E_INVALID_ARG, "cuda: zero: ptr is NULL for %zu bytes", bytes);
    CU_READY(acc, "zero");
    cu_labels_touched(acc, ptr, bytes);
    CU_CHECK(acc, "zero", cudaMemsetAsync(ptr, 0, bytes, acc->stream));
    return KILN_OK;
}

int32_t cu_synchronize(kiln_instance *acc) {
    CU_READY(acc, "synchronize");
    CU_CHECK(acc, "synchronize", cu_wait(acc));
    return KILN_OK;
}

int32_t cu_reserve(kiln_instance *acc, void **buf, size_t *have, size_t bytes, const char *what) {
    if (*buf && *have >= bytes) return KILN_OK;
    /* the old scratch may still be read by queued kernels: cu_free only
     * marks it, and the stream orders its reuse after them */
    cu_free(acc, *buf);
    *buf = NULL;
    *have = 0;
    void *p = NULL;
    int32_t rc = cu_alloc_scratch(acc, bytes, &p);
    if (rc != KILN_OK) {
        kiln_logf(acc->svc, acc->hctx, KILN_LOG_DEBUG, "cuda: %s: scratch of %zu bytes unavailable", what, bytes);
        return rc;
    }
    *buf = p;
    *have = bytes;
    return KILN_OK;
}

int32_t cu_mem_init(kiln_instance *acc) {
    for (int i = 0; i < CU_STAGES; i++)
        CU_CHECK(acc, "configure (staging events)",
                 cudaEventCreateWithFlags(&acc->stages[i].done, cudaEventDisableTiming));
    CU_CHECK(acc, "configure (pinned result buffer)",
             cudaHostAlloc((void **)&acc->host_scalars, 8 * sizeof(double), cudaHostAllocDefault));
    void *p = NULL;
    int32_t rc = cu_alloc_scratch(acc, (KG_REDUCE_BLOCKS + 8) * sizeof(double), &p);
    if (rc != KILN_OK) return rc;
    acc->red_scratch = p;
    return KILN_OK;
}

void cu_mem_release(kiln_instance *acc) {
    if (acc->stream) (void)cudaStreamSynchronize(acc->stream);
    for (int i = 0; i < CU_STAGES; i++) {
        if (acc->stages[i].host) (void)cudaFreeHost(acc->stages[i].host);
        if (acc->stages[i].done) (void)cudaEventDestroy(acc->stages[i].done);
        acc->stages[i].host = NULL;
        acc->stages[i].done = NULL;
    }
    if (acc->host_scalars) (void)cudaFreeHost(acc->host_scalars);
    acc->host_scalars = NULL;
    for (size_t i = 0; i < acc->nblocks; i++) (void)cudaFree(acc->blocks[i].ptr);
    free(acc->blocks);
    acc->blocks = NULL;
    acc->nblocks = acc->cap_blocks = 0;
    acc->bytes_cached = acc->bytes_in_use = 0;
    (void)cudaGetLastError();
}
