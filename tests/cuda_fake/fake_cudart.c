/*
 * fake_cudart.c — the CUDA runtime functions the cuda accelerator plugin
 * calls, implemented on host memory with the real signatures of
 * cuda_runtime_api.h, so that the plugin's host logic (allocator, staging
 * ring, scratch, read-backs, error paths) runs and is checked on a machine
 * without a GPU. Device memory is 256-byte aligned host memory filled with
 * 0xFF bytes (NaN in every float format) so unwritten memory is noticed;
 * every live block is in a registry against which pointers are checked
 * (see fake_cuda.h), and is sealed from the host outside the fake's own
 * operations (see "sealed device memory" below). Streams keep a queue:
 * async work that a GPU would run later (copies to or from pinned memory,
 * device-to-device copies, memsets, event records) runs only when
 * something waits for it, so a read-back
 * without a synchronisation, or a pinned buffer reused before its copy has
 * run, gives wrong data here as it would on a GPU. Copies from or to
 * pageable memory run at the call (after draining the stream), which is
 * what the real runtime guarantees for them. The legacy default stream
 * (stream 0, cudaMemcpy, cudaMemset) has a queue too, run as CUDA's
 * synchronisation rules say: cudaMemset, device-to-device cudaMemcpy and a
 * cudaMemcpy from pageable memory to the device (its source staged at the
 * call) return before the device is written; work on a blocking stream
 * waits for it, and work on a cudaStreamNonBlocking stream does not, so
 * mixing the two without ordering them reads stale data here. A blocking
 * copy to the host, cudaDeviceSynchronize, cudaStreamSynchronize(0) and
 * cudaFree run it. The environment knobs
 * (device count, driver and runtime versions, memory capacity, injected
 * failures) are read at every call. The driver refuses only a runtime of a
 * newer major release (CUDA's minor-version compatibility). An injected
 * kernel fault ("kernel_fault" in KILN_FAKE_CUDA_FAIL) is a sticky error as
 * on a GPU: the launch returns success, and from then on every call that
 * would reach the device (launches, synchronisations, copies, memsets,
 * allocations, event records and queries) fails with
 * cudaErrorIllegalAddress, which cudaGetLastError does not clear, until
 * KILN_FAKE_CUDA_FAIL changes (the tests' stand-in for a new process); an
 * injected synchronisation failure is such a fault too (LaunchFailure),
 * while an injected launch failure is a refused launch, which is not
 * (cudaErrorLaunchOutOfResources).
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_internal.h"

fake_cuda_stats fake_stats;

/* --------------------------------------------------------- environment */

static long long fake_env(const char *name, long long fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    return end && *end == 0 ? x : fallback;
}

/* The default capacity: an H200's 141 GiB less what the driver keeps. */
#define FAKE_TOTAL_DEFAULT ((size_t)140 << 30)

static size_t fake_capacity(void) {
    long long cap = fake_env("KILN_FAKE_CUDA_OOM_AFTER", -1);
    return cap >= 0 ? (size_t)cap : FAKE_TOTAL_DEFAULT;
}

/* ----------------------------------------------------- failure injection */

#define FAKE_INJ_MAX 16
static char fake_inj_spec[512];
static unsigned long fake_inj_count[FAKE_INJ_MAX];

int fake_inject(const char *fn) {
    const char *spec = getenv("KILN_FAKE_CUDA_FAIL");
    if (!spec || !*spec) {
        fake_inj_spec[0] = 0;
        return 0;
    }
    if (strncmp(spec, fake_inj_spec, sizeof fake_inj_spec) != 0) {
        /* a new value: counts start again */
        snprintf(fake_inj_spec, sizeof fake_inj_spec, "%s", spec);
        memset(fake_inj_count, 0, sizeof fake_inj_count);
    }
    const size_t fn_len = strlen(fn);
    const char *p = fake_inj_spec;
    for (int i = 0; i < FAKE_INJ_MAX && *p; i++) {
        const size_t len = strcspn(p, ",");
        const size_t name_len = strcspn(p, ",@") < len ? strcspn(p, ",@") : len;
        if (name_len == fn_len && strncmp(p, fn, fn_len) == 0) {
            fake_inj_count[i]++;
            const int every = name_len == len;
            const unsigned long nth = every ? 0 : strtoul(p + name_len + 1, NULL, 10);
            if (every || fake_inj_count[i] == nth) {
                fake_stats.injected++;
                return 1;
            }
        }
        p += len;
        if (*p == ',') p++;
    }
    return 0;
}

/* ------------------------------------------------------------ errors */

static cudaError_t fake_last_error = cudaSuccess;

cudaError_t fake_error(cudaError_t e) {
    if (e != cudaSuccess) fake_last_error = e;
    return e;
}

void fake_violation(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fake_stats.last_violation, sizeof fake_stats.last_violation, fmt, ap);
    va_end(ap);
    fake_stats.violations++;
    const char *quiet = getenv("KILN_FAKE_CUDA_QUIET");
    if (!quiet || !*quiet || strcmp(quiet, "0") == 0)
        fprintf(stderr, "fake cuda: contract violation: %s\n", fake_stats.last_violation);
}

/* A kernel fault's sticky error and the KILN_FAKE_CUDA_FAIL value that
 * injected it: cudaSuccess, or the error every device call returns while
 * that value stays. */
static cudaError_t fake_sticky;
static char fake_sticky_spec[sizeof fake_inj_spec];

cudaError_t fake_lost(void) {
    if (fake_sticky == cudaSuccess) return cudaSuccess;
    const char *spec = getenv("KILN_FAKE_CUDA_FAIL");
    if (!spec || strcmp(spec, fake_sticky_spec) != 0) {
        fake_sticky = cudaSuccess; /* "a new process" */
        return cudaSuccess;
    }
    return fake_error(fake_sticky);
}

void fake_fault(cudaError_t e) {
    const char *spec = getenv("KILN_FAKE_CUDA_FAIL");
    fake_sticky = e;
    snprintf(fake_sticky_spec, sizeof fake_sticky_spec, "%s", spec ? spec : "");
}

cudaError_t CUDARTAPI cudaGetLastError(void) {
    const cudaError_t lost = fake_lost();
    if (lost != cudaSuccess) return lost; /* sticky: not cleared */
    cudaError_t e = fake_last_error;
    fake_last_error = cudaSuccess;
    return e;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) {
    const cudaError_t lost = fake_lost();
    return lost != cudaSuccess ? lost : fake_last_error;
}

/* Names and strings as the real runtime spells them, for the errors the
 * fake produces. */
static const struct {
    cudaError_t e;
    const char *name, *text;
} fake_error_table[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorUnsupportedPtxVersion, "cudaErrorUnsupportedPtxVersion", "the provided PTX was compiled with an "
     "unsupported toolchain."},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice", "no kernel image is available for "
     "execution on the device"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *CUDARTAPI cudaGetErrorName(cudaError_t error) {
    for (size_t i = 0; i < sizeof fake_error_table / sizeof fake_error_table[0]; i++)
        if (fake_error_table[i].e == error) return fake_error_table[i].name;
    return "cudaErrorUnknown";
}

const char *CUDARTAPI cudaGetErrorString(cudaError_t error) {
    for (size_t i = 0; i < sizeof fake_error_table / sizeof fake_error_table[0]; i++)
        if (fake_error_table[i].e == error) return fake_error_table[i].text;
    return "unrecognized error code";
}

/* ------------------------------------------------------ driver, devices */

static _Thread_local int fake_current_device;

/* The runtime "loaded": CUDART_VERSION, or KILN_FAKE_CUDA_RUNTIME (a
 * newer minor release than the driver's, say). */
static long long fake_runtime_version(void) { return fake_env("KILN_FAKE_CUDA_RUNTIME", CUDART_VERSION); }

/* What a call needing a working driver and a device gets when there is
 * none: the runtime's answers for a missing or too old driver and for no
 * device. */
static cudaError_t fake_runtime_state(int *count) {
    const long long drv = fake_env("KILN_FAKE_CUDA_DRIVER", 13000);
    const long long n = fake_env("KILN_FAKE_CUDA_DEVICES", 1);
    *count = 0;
    /* minor-version compatibility: only an older major release refuses */
    if (drv <= 0 || drv / 1000 < fake_runtime_version() / 1000) return cudaErrorInsufficientDriver;
    if (n <= 0) return cudaErrorNoDevice;
    *count = (int)n;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int *driverVersion) {
    if (!driverVersion) return fake_error(cudaErrorInvalidValue);
    if (fake_inject("cudaDriverGetVersion")) return fake_error(cudaErrorUnknown);
    /* documented: 0 when no driver is installed, and still cudaSuccess */
    const long long drv = fake_env("KILN_FAKE_CUDA_DRIVER", 13000);
    *driverVersion = drv > 0 ? (int)drv : 0;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *runtimeVersion) {
    if (!runtimeVersion) return fake_error(cudaErrorInvalidValue);
    *runtimeVersion = (int)fake_runtime_version();
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceCount(int *count) {
    if (!count) return fake_error(cudaErrorInvalidValue);
    if (fake_inject("cudaGetDeviceCount")) return fake_error(cudaErrorUnknown);
    return fake_error(fake_runtime_state(count));
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
    if (fake_inject("cudaSetDevice")) return fake_error(cudaErrorUnknown);
    int count;
    cudaError_t e = fake_runtime_state(&count);
    if (e != cudaSuccess) return fake_error(e);
    if (device < 0 || device >= count) return fake_error(cudaErrorInvalidDevice);
    fake_current_device = device;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int *device) {
    if (!device) return fake_error(cudaErrorInvalidValue);
    int count;
    cudaError_t e = fake_runtime_state(&count);
    if (e != cudaSuccess) return fake_error(e);
    *device = fake_current_device;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (!prop) return fake_error(cudaErrorInvalidValue);
    if (fake_inject("cudaGetDeviceProperties")) return fake_error(cudaErrorUnknown);
    int count;
    cudaError_t e = fake_runtime_state(&count);
    if (e != cudaSuccess) return fake_error(e);
    if (device < 0 || device >= count) return fake_error(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "fake H200");
    prop->major = 9;
    prop->minor = 0;
    prop->totalGlobalMem = fake_capacity();
    prop->multiProcessorCount = 132;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->sharedMemPerBlock = 48 << 10;
    /* an H100/H200's: what kg_flash may opt into */
    prop->sharedMemPerBlockOptin = (size_t)fake_env("KILN_FAKE_CUDA_SMEM_OPTIN", 227 << 10);
    prop->unifiedAddressing = 1;
    return cudaSuccess;
}

/* ------------------------------------------------------ memory registry */

typedef struct fake_block {
    char *ptr;
    size_t size;  /* bytes the caller asked for */
    int device;   /* device current at allocation; -1 for pinned host */
    /* A sealed block (see "sealed device memory" below): its own mapping
     * [map, map + map_len), the last page a guard, PROT_NONE except while
     * an operation of the fake has it open or the fake NCCL holds it
     * (fake_cuda_hold). map is NULL otherwise. */
    char *map;
    size_t map_len;
    int open;        /* opened by the operation in progress       */
    unsigned holds;  /* fake_cuda_hold(p, 1) minus (p, 0)          */
    int rw;          /* what its pages are now: 1 read-write, 0 none */
    /* The latest work (kernel, GEMM, copy, memset) that used the block:
     * its stream and its number there, to tell whether the host has
     * waited for it (see "work the host has waited for"). */
    struct CUstream_st *work_stream;
    unsigned long long work_seq;
} fake_block;

typedef struct fake_registry {
    fake_block *b;
    size_t n, cap;
} fake_registry;

static fake_registry fake_dev, fake_pinned;

static int fake_reg_add(fake_registry *r, char *p, size_t size, int device, char *map, size_t map_len) {
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        fake_block *nb = realloc(r->b, cap * sizeof *nb);
        if (!nb) return -1;
        r->b = nb;
        r->cap = cap;
    }
    r->b[r->n++] = (fake_block){p, size, device, map, map_len, 0, 0, 0, NULL, 0};
    return 0;
}

/* The block containing p (any byte of it), or NULL. */
static fake_block *fake_reg_find(const fake_registry *r, const void *p) {
    const uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < r->n; i++) {
        const uintptr_t s = (uintptr_t)r->b[i].ptr;
        if (a >= s && a < s + (r->b[i].size ? r->b[i].size : 1)) return &r->b[i];
    }
    return NULL;
}

static void fake_reg_remove(fake_registry *r, fake_block *b) { *b = r->b[--r->n]; }

int fake_is_device_ptr(const void *p) { return fake_reg_find(&fake_dev, p) != NULL; }

int fake_is_device_range(const void *p, size_t bytes) {
    if (bytes == 0) return 1;
    const fake_block *b = fake_reg_find(&fake_dev, p);
    return b && (uintptr_t)p + bytes <= (uintptr_t)b->ptr + b->size;
}

int fake_device_block_of(const void *p, void **base, size_t *bytes) {
    const fake_block *b = fake_reg_find(&fake_dev, p);
    if (!b) return 0;
    *base = b->ptr, *bytes = b->size;
    return 1;
}

static int fake_is_pinned_range(const void *p, size_t bytes) {
    const fake_block *b = fake_reg_find(&fake_pinned, p);
    return b && (uintptr_t)p + bytes <= (uintptr_t)b->ptr + b->size;
}

static void fake_open_block(fake_block *b);
static struct CUstream_st *fake_work_stream;
static void fake_stamp(fake_block *b, struct CUstream_st *st, const void *p, size_t bytes);

cudaError_t fake_need_device(const char *fn, const char *what, const void *p, size_t bytes) {
    if (bytes == 0) return cudaSuccess;
    fake_block *b = fake_reg_find(&fake_dev, p);
    if (!b) {
        fake_violation("%s: %s %p (%zu bytes) is not device memory%s", fn, what, p, bytes,
                       fake_reg_find(&fake_pinned, p) ? " (it is pinned host memory)" : "");
        return fake_error(cudaErrorIllegalAddress);
    }
    if ((uintptr_t)p + bytes > (uintptr_t)b->ptr + b->size) {
        fake_violation("%s: %s [%p, +%zu bytes) runs %zu bytes past the end of its %zu-byte device block", fn, what,
                       p, bytes, (size_t)((uintptr_t)p + bytes - ((uintptr_t)b->ptr + b->size)), b->size);
        return fake_error(cudaErrorIllegalAddress);
    }
    if (b->device != fake_current_device) {
        fake_violation("%s: %s %p lives on device %d but the current device is %d", fn, what, p, b->device,
                       fake_current_device);
        return fake_error(cudaErrorIllegalAddress);
    }
    fake_open_block(b);
    fake_stamp(b, fake_work_stream, p, bytes);
    return cudaSuccess;
}

/* 256-byte aligned as cudaMalloc's blocks, but exactly `size` bytes long,
 * so that under ASan a kernel run on the host (tests/cuda_host) that reads
 * or writes one byte past a tensor is caught, padding or not. */
static void *fake_aligned(size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, 256, size ? size : 1) != 0) return NULL;
    memset(p, 0xFF, size ? size : 1); /* NaN in every float format: unwritten memory shows */
    return p;
}

/* ---------------------------------------------- sealed device memory
 *
 * On a GPU, device memory cannot be read or written by host code: a
 * dereference faults or reads garbage. The fake's device memory is host
 * memory, so such a read would pass here and fail on the first GPU run.
 * Unless KILN_FAKE_CUDA_SEAL=0 (read at each cudaMalloc) or
 * fake_seal_off() was called (the host-execution build, whose kernels are
 * checked by ASan at the byte instead), every block is sealed: an mmap of
 * its own, PROT_NONE, the block ending at most 255 bytes before a guard
 * page. The fake opens a block (PROT_READ | PROT_WRITE) only for the
 * operation that declared it: fake_need_device (the launch prologue, the
 * GEMM's operands) and the queued copies and memsets as they run. Each
 * operation is a scope (FAKE_SCOPE, fake_internal.h); when its outermost
 * scope ends, what it opened is sealed again. So the plugin's or the
 * host's own code touching device memory, or a fake kernel touching a
 * block it did not declare, faults at once; the SIGSEGV handler below
 * says which block, then lets the previous handler (ASan's, with the
 * stack, or the default) take the fault. Freed blocks are unmapped, so a
 * use after cudaFree faults too. The fake NCCL (tests/ddp_nccl_fake), in
 * another library, reads and writes its buffers from the host while a
 * collective is in flight (MPI underneath): it holds them open with the
 * exported fake_cuda_hold until the collective completes. */

static int fake_seal_disabled;
static size_t fake_open_n, fake_open_cap, fake_scope_depth;
static char **fake_open_stack; /* the ptr of each block opened, in order */
static struct sigaction fake_prev_segv;
static int fake_segv_installed;

/* The byte ranges collectives of the fake NCCL hold now (fake_cuda_hold). */
typedef struct fake_range {
    const char *p;
    size_t n;
} fake_range;
static fake_range *fake_held;
static size_t fake_held_n, fake_held_cap;

__attribute__((destructor)) static void fake_held_release(void) {
    free(fake_held);
    fake_held = NULL;
    fake_held_n = fake_held_cap = 0;
}

void fake_seal_off(void) { fake_seal_disabled = 1; }

static size_t fake_page(void) {
    static size_t pg;
    if (!pg) pg = (size_t)sysconf(_SC_PAGESIZE);
    return pg;
}

static void fake_say(const char *msg) {
    size_t n = strlen(msg);
    while (n > 0) {
        const ssize_t w = write(STDERR_FILENO, msg, n);
        if (w <= 0) return;
        msg += w, n -= (size_t)w;
    }
}

static void fake_segv(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    const uintptr_t a = (uintptr_t)si->si_addr;
    for (size_t i = 0; i < fake_dev.n; i++) {
        const fake_block *b = &fake_dev.b[i];
        if (!b->map || a < (uintptr_t)b->map || a >= (uintptr_t)b->map + b->map_len) continue;
        char msg[512];
        const uintptr_t s = (uintptr_t)b->ptr;
        if (a >= s && a < s + b->size)
            snprintf(msg, sizeof msg,
                     "fake cuda: contract violation: %p, byte %zu of a %zu-byte device block at %p, was read or "
                     "written %s; on a GPU this faults or reads garbage (copy through the accelerator instead)\n",
                     si->si_addr, (size_t)(a - s), b->size, (void *)b->ptr,
                     fake_scope_depth ? "by a fake CUDA operation that did not declare the block"
                                      : "by host code, outside any CUDA call");
        else
            snprintf(msg, sizeof msg,
                     "fake cuda: contract violation: %p is %s the %zu-byte device block at %p (outside it)\n",
                     si->si_addr, a < s ? "before" : "past the end of", b->size, (void *)b->ptr);
        fake_say(msg);
        break;
    }
    /* the faulting access runs again under the previous handler */
    sigaction(SIGSEGV, &fake_prev_segv, NULL);
    fake_segv_installed = 0;
}

static void fake_segv_install(void) {
    if (fake_segv_installed) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fake_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &fake_prev_segv) == 0) fake_segv_installed = 1;
}

/* A sealed block of `size` bytes (at least 1), 256-byte aligned, filled
 * with 0xFF as fake_aligned's; NULL when out of memory. */
static char *fake_sealed(size_t size, char **map, size_t *map_len) {
    const size_t pg = fake_page(), body = (size + pg - 1) / pg * pg, len = body + pg;
    char *m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *p = m + ((body - size) & ~(size_t)255);
    if (mprotect(m, body, PROT_READ | PROT_WRITE) != 0) {
        munmap(m, len);
        return NULL;
    }
    memset(p, 0xFF, size);
    mprotect(m, body, PROT_NONE);
    fake_segv_install();
    *map = m, *map_len = len;
    return p;
}

/* Scopes nest (a fused launcher calling the entries it fuses, a kernel
 * running the copies queued before it): only the outermost one's end
 * seals, so an inner entry never closes what its caller still uses. */
int fake_scope_begin(void) { return (int)++fake_scope_depth; }

/* Makes b's pages what its state asks: read-write while open or held,
 * none otherwise. 0, or -1 when mprotect fails. */
static int fake_protect(fake_block *b) {
    const int want = b->open || b->holds > 0;
    if (!b->map || want == b->rw) return 0;
    if (mprotect(b->map, b->map_len - fake_page(), want ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) return -1;
    b->rw = want;
    return 0;
}

void fake_scope_end(int *depth) {
    (void)depth;
    if (--fake_scope_depth > 0) return;
    fake_work_stream = NULL;
    for (; fake_open_n > 0; fake_open_n--) {
        fake_block *b = fake_reg_find(&fake_dev, fake_open_stack[fake_open_n - 1]);
        if (b && b->open) {
            b->open = 0;
            fake_protect(b);
        }
    }
}

/* Opens b for the operation in progress, until its outermost scope ends.
 * Already open: nothing to do. */
static void fake_open_block(fake_block *b) {
    if (!b->map || b->open) return;
    if (fake_scope_depth == 0) {
        fake_violation("fake cuda (its own bug): device block %p used outside a FAKE_SCOPE", (void *)b->ptr);
        return;
    }
    if (fake_open_n == fake_open_cap) {
        const size_t cap = fake_open_cap ? 2 * fake_open_cap : 64;
        char **ns = realloc(fake_open_stack, cap * sizeof *ns);
        if (!ns) {
            fake_violation("fake cuda: out of host memory for the open-block list");
            return;
        }
        fake_open_stack = ns, fake_open_cap = cap;
    }
    b->open = 1;
    if (fake_protect(b) != 0) {
        b->open = 0;
        fake_violation("fake cuda: mprotect failed on device block %p", (void *)b->ptr);
        return;
    }
    fake_open_stack[fake_open_n++] = b->ptr;
}

/* Opens the device block holding p, if any (a copy's or memset's side). */
static void fake_open_at(const void *p) {
    fake_block *b = fake_reg_find(&fake_dev, p);
    if (b) fake_open_block(b);
}

__attribute__((destructor)) static void fake_open_release(void) {
    free(fake_open_stack);
    fake_open_stack = NULL;
    fake_open_n = fake_open_cap = 0;
}

static void fake_drain_all(void);
static void fake_waited_all(void);

cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size) {
    FAKE_RETURN_IF_LOST();
    if (!devPtr) return fake_error(cudaErrorInvalidValue);
    *devPtr = NULL;
    int count;
    cudaError_t e = fake_runtime_state(&count);
    if (e != cudaSuccess) return fake_error(e);
    if (size == 0) return cudaSuccess;
    const size_t cap = fake_capacity();
    if (fake_inject("cudaMalloc") || size > cap || fake_stats.live_bytes > cap - size) {
        fake_stats.malloc_failures++;
        return fake_error(cudaErrorMemoryAllocation);
    }
    char *map = NULL;
    size_t map_len = 0;
    const int seal = !fake_seal_disabled && fake_env("KILN_FAKE_CUDA_SEAL", 1) != 0;
    char *p = seal ? fake_sealed(size, &map, &map_len) : fake_aligned(size);
    if (!p || fake_reg_add(&fake_dev, p, size, fake_current_device, map, map_len) != 0) {
        if (map) munmap(map, map_len);
        else free(p);
        fake_stats.malloc_failures++;
        return fake_error(cudaErrorMemoryAllocation);
    }
    fake_stats.mallocs++;
    if (seal) fake_stats.sealed_mallocs++;
    fake_stats.live_blocks++;
    fake_stats.live_bytes += size;
    if (fake_stats.live_bytes > fake_stats.peak_bytes) fake_stats.peak_bytes = fake_stats.live_bytes;
    *devPtr = p;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFree(void *devPtr) {
    if (!devPtr) return cudaSuccess;
    if (fake_inject("cudaFree")) return fake_error(cudaErrorUnknown);
    fake_drain_all(); /* cudaFree synchronises the device */
    fake_waited_all();
    fake_block *b = fake_reg_find(&fake_dev, devPtr);
    if (!b || b->ptr != (char *)devPtr) {
        fake_violation("cudaFree(%p): not the start of a live cudaMalloc block%s", devPtr,
                       b ? " (inside one)" : " (double free or never allocated)");
        return fake_error(cudaErrorInvalidValue);
    }
    fake_stats.frees++;
    fake_stats.live_blocks--;
    fake_stats.live_bytes -= b->size;
    /* ranges an aborted collective left held die with the block */
    for (size_t i = 0; b->holds > 0 && i < fake_held_n;)
        if (fake_held[i].p >= b->ptr && fake_held[i].p < b->ptr + b->size) fake_held[i] = fake_held[--fake_held_n];
        else i++;
    if (b->map) munmap(b->map, b->map_len);
    else free(b->ptr);
    fake_reg_remove(&fake_dev, b);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    (void)flags;
    if (!pHost) return fake_error(cudaErrorInvalidValue);
    *pHost = NULL;
    if (fake_inject("cudaHostAlloc")) return fake_error(cudaErrorMemoryAllocation);
    char *p = fake_aligned(size);
    if (!p || fake_reg_add(&fake_pinned, p, size, -1, NULL, 0) != 0) {
        free(p);
        return fake_error(cudaErrorMemoryAllocation);
    }
    fake_stats.host_allocs++;
    fake_stats.live_host_blocks++;
    *pHost = p;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFreeHost(void *ptr) {
    if (!ptr) return cudaSuccess;
    if (fake_inject("cudaFreeHost")) return fake_error(cudaErrorUnknown);
    fake_drain_all(); /* queued copies may still read it */
    fake_block *b = fake_reg_find(&fake_pinned, ptr);
    if (!b || b->ptr != (char *)ptr) {
        fake_violation("cudaFreeHost(%p): not the start of a live cudaHostAlloc block", ptr);
        return fake_error(cudaErrorInvalidValue);
    }
    fake_stats.live_host_blocks--;
    free(b->ptr);
    fake_reg_remove(&fake_pinned, b);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    FAKE_RETURN_IF_LOST();
    if (!free_bytes || !total) return fake_error(cudaErrorInvalidValue);
    if (fake_inject("cudaMemGetInfo")) return fake_error(cudaErrorUnknown);
    const size_t cap = fake_capacity();
    *total = cap;
    *free_bytes = cap > fake_stats.live_bytes ? cap - fake_stats.live_bytes : 0;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
    if (!attributes) return fake_error(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    const fake_block *b = fake_reg_find(&fake_dev, ptr);
    if (b) {
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = b->device;
        attributes->devicePointer = (void *)(uintptr_t)ptr;
    } else if (fake_reg_find(&fake_pinned, ptr)) {
        attributes->type = cudaMemoryTypeHost;
        attributes->device = fake_current_device;
        attributes->devicePointer = (void *)(uintptr_t)ptr;
        attributes->hostPointer = (void *)(uintptr_t)ptr;
    } else {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = -2;
    }
    return cudaSuccess;
}

/* ------------------------------------------------------------ streams */

enum { FAKE_OP_COPY, FAKE_OP_SET, FAKE_OP_SET2D, FAKE_OP_EVENT };
/* fake_op.owned: the op's private copy of a pageable source (src points
 * into it), freed when the op has run */

/* One piece of queued work. */
typedef struct fake_op {
    int kind;
    char *dst;
    const char *src;
    size_t n;                    /* bytes (copy, set) */
    int value;                   /* set, set2d */
    size_t pitch, width, height; /* set2d */
    cudaEvent_t ev;              /* event */
    unsigned long rec;           /* which record of ev */
    char *owned;                 /* (n) staged source, or NULL */
} fake_op;

#define FAKE_STREAM_MAGIC 0x57AEA3u
#define FAKE_EVENT_MAGIC 0xE7E27u

struct CUstream_st {
    unsigned magic;
    unsigned flags;
    int device;
    fake_op *ops;  /* (cap) ring of queued work, [head, head + n) */
    size_t head, n, cap;
    unsigned long synced;  /* cudaStreamSynchronize / cudaDeviceSynchronize calls that waited for it */
    unsigned long long seq;    /* work issued on it, counted */
    unsigned long long waited; /* the host has waited for work 1..waited */
    struct CUstream_st *next;
};

struct CUevent_st {
    unsigned magic;
    unsigned flags;
    unsigned long recorded; /* records issued */
    unsigned long done;     /* records that have run */
    double when;            /* host time (s) when the latest record ran  */
    cudaStream_t stream;    /* stream of the latest record */
    unsigned long long upto; /* its stream's work count at the latest record */
    struct CUevent_st *next;
};

static struct CUstream_st *fake_streams;
static struct CUevent_st *fake_events;
/* The legacy default stream's queue (stream 0, cudaStreamLegacy and, the
 * plugin being single-threaded, cudaStreamPerThread): not in fake_streams. */
static struct CUstream_st fake_legacy;

static int fake_is_legacy(cudaStream_t s) {
    return s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

static int fake_stream_live(cudaStream_t s) {
    for (struct CUstream_st *p = fake_streams; p; p = p->next)
        if (p == s) return 1;
    return 0;
}

static int fake_event_live(cudaEvent_t e) {
    for (struct CUevent_st *p = fake_events; p; p = p->next)
        if (p == e) return 1;
    return 0;
}

/* -------------------------------------- work the host has waited for
 *
 * The fake runs a kernel when it is launched, so its results are in memory
 * at once; on a GPU they are there only once the host has waited for the
 * stream (a synchronisation, an event, a blocking copy back). A consumer
 * outside the stream's order that forgets the wait reads stale data on a
 * GPU and correct data here. So each block remembers the latest work that
 * used it (its stream and number there, fake_stamp), each stream how much
 * of its work the host has waited for, and the fake NCCL's hold
 * (fake_cuda_hold, a collective on NCCL's own stream taking a buffer) is a
 * violation while the block's latest work is not waited for (by block, so
 * it is conservative: ddp waits for the whole accelerator); so is work on
 * bytes a collective still holds (by byte range: other tensors of the same
 * block may be used meanwhile). */

static struct CUstream_st *fake_stream_of(cudaStream_t s) { return fake_is_legacy(s) ? &fake_legacy : s; }

/* The operation in progress (a launch, a GEMM) runs on s: the blocks
 * fake_need_device checks from now to the end of its scope are its work. */
void fake_work_on(cudaStream_t s) {
    /* a dead stream is refused later, by the stream checks */
    fake_work_stream = fake_is_legacy(s) || fake_stream_live(s) ? fake_stream_of(s) : NULL;
}

/* Records [p, +bytes) of b as used by work on st (NULL: no operation in
 * progress, nothing to record). */
static void fake_stamp(fake_block *b, struct CUstream_st *st, const void *p, size_t bytes) {
    if (!st) return;
    const uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; b->holds > 0 && i < fake_held_n; i++)
        if (a < (uintptr_t)fake_held[i].p + fake_held[i].n && (uintptr_t)fake_held[i].p < a + bytes) {
            fake_violation("work on stream %p uses [%p, +%zu) while a collective still holds [%p, +%zu) (wait for "
                           "NCCL's stream first)",
                           (void *)(st == &fake_legacy ? NULL : st), p, bytes, (const void *)fake_held[i].p,
                           fake_held[i].n);
            break;
        }
    b->work_stream = st;
    b->work_seq = ++st->seq;
}

/* A copy's or memset's device side, as it is submitted on s. */
static void fake_stamp_at(cudaStream_t s, const void *p, size_t bytes) {
    fake_block *b = fake_reg_find(&fake_dev, p);
    if (b) fake_stamp(b, fake_stream_of(s), p, bytes);
}

static void fake_waited(struct CUstream_st *s, unsigned long long upto) {
    if (upto > s->waited) s->waited = upto;
}

/* The legacy stream and every blocking stream (a legacy-stream wait). */
static void fake_waited_blocking(void) {
    fake_waited(&fake_legacy, fake_legacy.seq);
    for (struct CUstream_st *s = fake_streams; s; s = s->next)
        if (!(s->flags & cudaStreamNonBlocking)) fake_waited(s, s->seq);
}

static void fake_waited_all(void) {
    fake_waited(&fake_legacy, fake_legacy.seq);
    for (struct CUstream_st *s = fake_streams; s; s = s->next) fake_waited(s, s->seq);
}

/* Exported (fake_cuda.h): on = 1 holds [p, p + n) of device memory (open,
 * if sealed) until the matching call with on = 0; pointers outside device
 * memory are ignored. */
__attribute__((visibility("default"))) void fake_cuda_hold(const void *p, size_t n, int on);
void fake_cuda_hold(const void *p, size_t n, int on) {
    fake_block *b = fake_reg_find(&fake_dev, p);
    if (!b) return;
    if (on) {
        if (b->work_stream && b->work_seq > b->work_stream->waited)
            fake_violation("a collective takes [%p, +%zu) of device block %p while work on stream %p that uses the "
                           "block has not been waited for (synchronise the accelerator first)",
                           p, n, (void *)b->ptr, (void *)(b->work_stream == &fake_legacy ? NULL : b->work_stream));
        if (fake_held_n == fake_held_cap) {
            const size_t cap = fake_held_cap ? 2 * fake_held_cap : 16;
            fake_range *nr = realloc(fake_held, cap * sizeof *nr);
            if (!nr) {
                fake_violation("fake cuda: out of host memory for the held ranges");
                return;
            }
            fake_held = nr, fake_held_cap = cap;
        }
        fake_held[fake_held_n++] = (fake_range){(const char *)p, n};
        b->holds++;
    } else {
        size_t i = 0;
        while (i < fake_held_n && !(fake_held[i].p == (const char *)p && fake_held[i].n == n)) i++;
        if (i == fake_held_n) return; /* not held (or freed and reallocated) */
        fake_held[i] = fake_held[--fake_held_n];
        if (b->holds > 0) b->holds--;
    }
    if (fake_protect(b) != 0) fake_violation("fake cuda: mprotect failed on device block %p", (void *)b->ptr);
}

static void fake_run_op(const fake_op *op) {
    FAKE_SCOPE();
    if (op->kind == FAKE_OP_COPY || op->kind == FAKE_OP_SET || op->kind == FAKE_OP_SET2D) fake_open_at(op->dst);
    if (op->kind == FAKE_OP_COPY) fake_open_at(op->src);
    switch (op->kind) {
    case FAKE_OP_COPY: {
        const uintptr_t d = (uintptr_t)op->dst, s = (uintptr_t)op->src;
        if (op->dst != op->src && d < s + op->n && s < d + op->n)
            fake_violation("cudaMemcpyAsync: source and destination overlap ([%p, +%zu) and [%p, +%zu)); CUDA does "
                           "not promise memmove",
                           (const void *)op->src, op->n, (void *)op->dst, op->n);
        memmove(op->dst, op->src, op->n);
        break;
    }
    case FAKE_OP_SET: memset(op->dst, op->value, op->n); break;
    case FAKE_OP_SET2D:
        for (size_t r = 0; r < op->height; r++) memset(op->dst + r * op->pitch, op->value, op->width);
        break;
    case FAKE_OP_EVENT:
        if (op->ev->done < op->rec) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            op->ev->done = op->rec;
            op->ev->when = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
        }
        break;
    }
    free(op->owned);
}

/* Runs queued work in order; stops after the record `rec` of `ev` when ev
 * is not NULL. */
static void fake_drain(struct CUstream_st *s, cudaEvent_t ev, unsigned long rec) {
    while (s->n > 0) {
        fake_op op = s->ops[s->head];
        s->head = (s->head + 1) % s->cap;
        s->n--;
        fake_run_op(&op);
        if (ev && op.kind == FAKE_OP_EVENT && op.ev == ev && op.rec == rec) return;
    }
}

static void fake_drain_all(void) {
    fake_drain(&fake_legacy, NULL, 0);
    for (struct CUstream_st *s = fake_streams; s; s = s->next) fake_drain(s, NULL, 0);
}

/* Work on the legacy default stream waits for every blocking stream (and
 * for its own queue). */
static void fake_drain_blocking(void) {
    fake_drain(&fake_legacy, NULL, 0);
    for (struct CUstream_st *s = fake_streams; s; s = s->next)
        if (!(s->flags & cudaStreamNonBlocking)) fake_drain(s, NULL, 0);
}

/* Work on stream s waits for the legacy stream's unless s is non-blocking. */
static void fake_after_legacy(const struct CUstream_st *s) {
    if (!(s->flags & cudaStreamNonBlocking)) fake_drain(&fake_legacy, NULL, 0);
}

/* What the legacy queue still holds at unload (a program that never waited
 * for it): the staged sources, so leak checkers stay quiet. */
__attribute__((destructor)) static void fake_legacy_release(void) {
    for (size_t i = 0; i < fake_legacy.n; i++) free(fake_legacy.ops[(fake_legacy.head + i) % fake_legacy.cap].owned);
    free(fake_legacy.ops);
    fake_legacy.ops = NULL;
    fake_legacy.n = fake_legacy.cap = 0;
}

unsigned long fake_stream_syncs(cudaStream_t s) {
    if (fake_is_legacy(s) || !fake_stream_live(s)) return (unsigned long)-1;
    return s->synced;
}

static cudaError_t fake_enqueue(struct CUstream_st *s, const fake_op *op) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        fake_op *ring = malloc(cap * sizeof *ring);
        if (!ring) return fake_error(cudaErrorMemoryAllocation);
        for (size_t i = 0; i < s->n; i++) ring[i] = s->ops[(s->head + i) % s->cap];
        free(s->ops);
        s->ops = ring;
        s->head = 0;
        s->cap = cap;
    }
    s->ops[(s->head + s->n) % s->cap] = *op;
    s->n++;
    return cudaSuccess;
}

/* Checks a stream argument: legacy handles and live streams. */
static cudaError_t fake_check_stream(cudaStream_t s, const char *fn) {
    if (fake_is_legacy(s) || fake_stream_live(s)) return cudaSuccess;
    fake_violation("%s: stream %p is not a live stream (destroyed, or never created)", fn, (void *)s);
    return fake_error(cudaErrorInvalidResourceHandle);
}

cudaError_t fake_stream_drain(cudaStream_t s, const char *fn) {
    cudaError_t e = fake_check_stream(s, fn);
    if (e != cudaSuccess) return e;
    if (fake_is_legacy(s)) {
        fake_drain_blocking();
        return cudaSuccess;
    }
    if (s->device != fake_current_device) {
        fake_violation("%s: stream %p belongs to device %d but the current device is %d", fn, (void *)s, s->device,
                       fake_current_device);
        return fake_error(cudaErrorInvalidResourceHandle);
    }
    fake_after_legacy(s);
    fake_drain(s, NULL, 0);
    return cudaSuccess;
}

/* Runs op now (after the work it must follow), or queues it on s. */
static cudaError_t fake_submit(cudaStream_t s, const fake_op *op, int now) {
    if (op->kind == FAKE_OP_COPY || op->kind == FAKE_OP_SET) {
        fake_stamp_at(s, op->dst, op->n);
        if (op->kind == FAKE_OP_COPY) fake_stamp_at(s, op->src, op->n);
    } else if (op->kind == FAKE_OP_SET2D && op->height > 0) {
        fake_stamp_at(s, op->dst, (op->height - 1) * op->pitch + op->width);
    }
    if (fake_is_legacy(s)) {
        fake_drain_blocking(); /* what it follows; itself queued unless now */
        if (!now) return fake_enqueue(&fake_legacy, op);
        fake_run_op(op);
        return cudaSuccess;
    }
    fake_after_legacy(s);
    if (now) {
        fake_drain(s, NULL, 0);
        fake_run_op(op);
        return cudaSuccess;
    }
    return fake_enqueue(s, op);
}

/* The refusals every create call starts with: no place for the handle,
 * or a failure injected into `what` (KILN_FAKE_CUDA_FAIL). */
static cudaError_t fake_create_refused(const void *out, const char *what) {
    if (!out) return fake_error(cudaErrorInvalidValue);
    if (fake_inject(what)) return fake_error(cudaErrorUnknown);
    return cudaSuccess;
}

/* FAKE_LINKED puts `node` at the front of the list at `head`, counts it in
 * `live` and hands it out through `out`, and is cudaSuccess, what a create
 * call then returns; FAKE_UNLINK takes it (a struct `type` *) out again:
 * the live streams and events are kept in singly linked lists of their own
 * types. */
#define FAKE_LINKED(head, node, live, out)                                                                             \
    ((node)->next = (head), (head) = (node), (live)++, *(out) = (node), cudaSuccess)
#define FAKE_UNLINK(type, head, node)                                                                                  \
    do {                                                                                                               \
        for (type **pp_ = &(head); *pp_; pp_ = &(*pp_)->next)                                                          \
            if (*pp_ == (node)) {                                                                                      \
                *pp_ = (node)->next;                                                                                   \
                break;                                                                                                 \
            }                                                                                                          \
    } while (0)

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    cudaError_t e = fake_create_refused(pStream, "cudaStreamCreateWithFlags");
    if (e != cudaSuccess) return e;
    int count;
    e = fake_runtime_state(&count);
    if (e != cudaSuccess) return fake_error(e);
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return fake_error(cudaErrorMemoryAllocation);
    s->magic = FAKE_STREAM_MAGIC;
    s->flags = flags;
    s->device = fake_current_device;
    return FAKE_LINKED(fake_streams, s, fake_stats.streams_live, pStream);
}

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t *pStream) { return cudaStreamCreateWithFlags(pStream, 0); }

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
    if (fake_is_legacy(stream) || !fake_stream_live(stream)) {
        fake_violation("cudaStreamDestroy(%p): not a live stream", (void *)stream);
        return fake_error(cudaErrorInvalidResourceHandle);
    }
    fake_drain(stream, NULL, 0); /* queued work still completes */
    for (size_t i = 0; i < fake_dev.n; i++)
        if (fake_dev.b[i].work_stream == stream) fake_dev.b[i].work_stream = NULL;
    FAKE_UNLINK(struct CUstream_st, fake_streams, stream);
    free(stream->ops);
    free(stream);
    fake_stats.streams_live--;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
    FAKE_RETURN_IF_LOST();
    cudaError_t e = fake_check_stream(stream, "cudaStreamSynchronize");
    if (e != cudaSuccess) return e;
    if (fake_inject("cudaStreamSynchronize")) { /* a kernel that faulted: sticky */
        fake_fault(cudaErrorLaunchFailure);
        return fake_error(cudaErrorLaunchFailure);
    }
    fake_stats.syncs++;
    if (fake_is_legacy(stream)) {
        fake_drain_blocking();
        fake_waited_blocking();
    } else {
        fake_after_legacy(stream);
        fake_drain(stream, NULL, 0);
        stream->synced++;
        fake_waited(stream, stream->seq);
        if (!(stream->flags & cudaStreamNonBlocking)) fake_waited(&fake_legacy, fake_legacy.seq);
    }
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
    FAKE_RETURN_IF_LOST();
    fake_stats.syncs++;
    fake_drain_all();
    for (struct CUstream_st *s = fake_streams; s; s = s->next) s->synced++;
    fake_waited_all();
    return cudaSuccess;
}

/* ------------------------------------------------------------- events */

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    cudaError_t err = fake_create_refused(event, "cudaEventCreateWithFlags");
    if (err != cudaSuccess) return err;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e) return fake_error(cudaErrorMemoryAllocation);
    e->magic = FAKE_EVENT_MAGIC;
    e->flags = flags;
    return FAKE_LINKED(fake_events, e, fake_stats.events_live, event);
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
    if (!fake_event_live(event)) {
        fake_violation("cudaEventDestroy(%p): not a live event", (void *)event);
        return fake_error(cudaErrorInvalidResourceHandle);
    }
    /* a queued record still refers to it: let the queues run first */
    fake_drain_all();
    FAKE_UNLINK(struct CUevent_st, fake_events, event);
    free(event);
    fake_stats.events_live--;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    FAKE_RETURN_IF_LOST();
    if (!fake_event_live(event)) {
        fake_violation("cudaEventRecord(%p): not a live event", (void *)event);
        return fake_error(cudaErrorInvalidResourceHandle);
    }
    cudaError_t e = fake_check_stream(stream, "cudaEventRecord");
    if (e != cudaSuccess) return e;
    if (fake_inject("cudaEventRecord")) return fake_error(cudaErrorUnknown);
    event->recorded++;
    event->stream = stream;
    event->upto = fake_stream_of(stream)->seq;
    fake_op op = {.kind = FAKE_OP_EVENT, .ev = event, .rec = event->recorded};
    return fake_submit(stream, &op, 0);
}

/* The host time between the moments the two records ran (the fake's
 * "GPU" is the host, which runs each launch when it is made): what the
 * work queued between them took here. Both must have completed
 * (cudaErrorNotReady otherwise) and be timing events. */
cudaError_t CUDARTAPI cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms || !fake_event_live(start) || !fake_event_live(end)) return fake_error(cudaErrorInvalidResourceHandle);
    if ((start->flags | end->flags) & cudaEventDisableTiming) return fake_error(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded || start->done < start->recorded || end->done < end->recorded)
        return fake_error(cudaErrorNotReady);
    *ms = (float)((end->when - start->when) * 1e3);
    return cudaSuccess;
}

/* Not modelled: the fake runs every launch when it is made, so it cannot
 * record a stream into a graph. Callers get cudaErrorNotSupported
 * (kiln-gpu-step-fake runs --eager-only). */
cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    (void)stream, (void)mode;
    return fake_error(cudaErrorNotSupported);
}
cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
    (void)stream, (void)graph;
    return fake_error(cudaErrorNotSupported);
}
cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    (void)exec, (void)graph, (void)flags;
    return fake_error(cudaErrorNotSupported);
}
cudaError_t CUDARTAPI cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *count) {
    (void)graph, (void)nodes, (void)count;
    return fake_error(cudaErrorNotSupported);
}
cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    (void)exec, (void)stream;
    return fake_error(cudaErrorNotSupported);
}
cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t exec) {
    (void)exec;
    return fake_error(cudaErrorNotSupported);
}
cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
    (void)graph;
    return fake_error(cudaErrorNotSupported);
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
    FAKE_RETURN_IF_LOST();
    if (!fake_event_live(event)) {
        fake_violation("cudaEventSynchronize(%p): not a live event", (void *)event);
        return fake_error(cudaErrorInvalidResourceHandle);
    }
    if (fake_inject("cudaEventSynchronize")) { /* a kernel that faulted: sticky */
        fake_fault(cudaErrorLaunchFailure);
        return fake_error(cudaErrorLaunchFailure);
    }
    fake_stats.syncs++;
    /* waits for the latest record only: later work on its stream stays queued */
    if (event->done < event->recorded && fake_is_legacy(event->stream))
        fake_drain(&fake_legacy, event, event->recorded);
    else if (event->done < event->recorded && fake_stream_live(event->stream))
        fake_drain(event->stream, event, event->recorded);
    if (event->recorded && (fake_is_legacy(event->stream) || fake_stream_live(event->stream)))
        fake_waited(fake_stream_of(event->stream), event->upto);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
    FAKE_RETURN_IF_LOST();
    /* a GPU gets there eventually; here "eventually" is now */
    return cudaEventSynchronize(event);
}

/* ------------------------------------------------------------- copies */

static const char *fake_kind_name(enum cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost: return "HostToHost";
    case cudaMemcpyHostToDevice: return "HostToDevice";
    case cudaMemcpyDeviceToHost: return "DeviceToHost";
    case cudaMemcpyDeviceToDevice: return "DeviceToDevice";
    default: return "Default";
    }
}

/* Checks one side of a copy against the kind's promise. */
static cudaError_t fake_copy_side(const char *fn, enum cudaMemcpyKind kind, const char *what, const void *p,
                                  size_t count, int want_device) {
    if (want_device) {
        if (fake_is_device_range(p, count)) return cudaSuccess;
        fake_violation("%s(%s): %s %p (%zu bytes) is not %s", fn, fake_kind_name(kind), what, p, count,
                       fake_is_device_ptr(p) ? "inside one device block" : "device memory");
        return fake_error(cudaErrorInvalidValue);
    }
    if (!fake_is_device_ptr(p)) return cudaSuccess;
    fake_violation("%s(%s): %s %p is device memory", fn, fake_kind_name(kind), what, p);
    return fake_error(cudaErrorInvalidValue);
}

static cudaError_t fake_memcpy(const char *fn, void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                               cudaStream_t stream, int blocking) {
    if (fake_inject(fn)) return fake_error(cudaErrorUnknown);
    cudaError_t e = fake_check_stream(stream, fn);
    if (e != cudaSuccess) return e;
    if (count == 0) return cudaSuccess;
    if (!dst || !src) return fake_error(cudaErrorInvalidValue);
    if (kind == cudaMemcpyDefault) {
        const int dd = fake_is_device_ptr(dst), sd = fake_is_device_ptr(src);
        kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                  : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    }
    if (kind != cudaMemcpyHostToHost && kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost &&
        kind != cudaMemcpyDeviceToDevice)
        return fake_error(cudaErrorInvalidValue);
    const int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((e = fake_copy_side(fn, kind, "destination", dst, count, dst_dev)) != cudaSuccess) return e;
    if ((e = fake_copy_side(fn, kind, "source", src, count, src_dev)) != cudaSuccess) return e;
    /* When the host side is pageable the runtime finishes with it before
     * returning (staged or synchronous); only pinned memory and
     * device-to-device copies stay queued. The blocking cudaMemcpy
     * (legacy stream) returns before the device is written when it copies
     * device to device, or pageable memory to the device (staged: the
     * source is copied at the call); see the file's comment. */
    int now = blocking;
    char *owned = NULL;
    if (kind == cudaMemcpyHostToDevice) {
        const int pinned = fake_is_pinned_range(src, count);
        now |= !pinned;
        if (!now) fake_stats.h2d_async_pinned++;
        if (blocking && !pinned && fake_is_legacy(stream)) {
            if (!(owned = malloc(count))) return fake_error(cudaErrorMemoryAllocation);
            memcpy(owned, src, count);
            src = owned;
            now = 0;
        }
    } else if (kind == cudaMemcpyDeviceToHost) {
        fake_stats.d2h_copies++;
        now |= !fake_is_pinned_range(dst, count);
    } else if (kind == cudaMemcpyHostToHost) {
        now = 1;
    } else if (blocking && fake_is_legacy(stream)) {
        now = 0; /* device to device: no host-side synchronisation */
    }
    fake_op op = {.kind = FAKE_OP_COPY, .dst = dst, .src = src, .n = count, .owned = owned};
    cudaError_t r = fake_submit(stream, &op, now);
    if (r != cudaSuccess) free(owned);
    /* a copy to the host that returns complete has waited for its stream
     * (and a blocking cudaMemcpy for what the legacy stream follows) */
    if (r == cudaSuccess && kind == cudaMemcpyDeviceToHost && now) {
        if (fake_is_legacy(stream)) fake_waited_blocking();
        else fake_waited(stream, stream->seq);
    }
    return r;
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                      cudaStream_t stream) {
    FAKE_RETURN_IF_LOST();
    return fake_memcpy("cudaMemcpyAsync", dst, src, count, kind, stream, 0);
}

cudaError_t CUDARTAPI cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    FAKE_RETURN_IF_LOST();
    /* the legacy default stream: waits for blocking streams only (the
     * plugin's stream is non-blocking, so not for it) */
    return fake_memcpy("cudaMemcpy", dst, src, count, kind, NULL, 1);
}

cudaError_t CUDARTAPI cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    FAKE_RETURN_IF_LOST();
    if (fake_inject("cudaMemsetAsync")) return fake_error(cudaErrorUnknown);
    cudaError_t e = fake_check_stream(stream, "cudaMemsetAsync");
    if (e != cudaSuccess) return e;
    if (count == 0) return cudaSuccess;
    if (!fake_is_device_range(devPtr, count)) {
        fake_violation("cudaMemsetAsync: [%p, +%zu bytes) is not inside one device block", devPtr, count);
        return fake_error(cudaErrorInvalidValue);
    }
    fake_stats.memsets++;
    fake_stats.memset_bytes += count;
    fake_op op = {.kind = FAKE_OP_SET, .dst = devPtr, .n = count, .value = value};
    return fake_submit(stream, &op, 0);
}

cudaError_t CUDARTAPI cudaMemset(void *devPtr, int value, size_t count) {
    FAKE_RETURN_IF_LOST();
    return cudaMemsetAsync(devPtr, value, count, NULL);
}

cudaError_t CUDARTAPI cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width, size_t height,
                                        cudaStream_t stream) {
    FAKE_RETURN_IF_LOST();
    if (fake_inject("cudaMemset2DAsync")) return fake_error(cudaErrorUnknown);
    cudaError_t e = fake_check_stream(stream, "cudaMemset2DAsync");
    if (e != cudaSuccess) return e;
    if (width == 0 || height == 0) return cudaSuccess;
    if (width > pitch) {
        fake_violation("cudaMemset2DAsync: width %zu is larger than pitch %zu", width, pitch);
        return fake_error(cudaErrorInvalidValue);
    }
    const size_t span = (height - 1) * pitch + width;
    if (!fake_is_device_range(devPtr, span)) {
        fake_violation("cudaMemset2DAsync: %zu rows of %zu bytes, pitch %zu, at %p: not inside one device block",
                       height, width, pitch, devPtr);
        return fake_error(cudaErrorInvalidValue);
    }
    fake_stats.memsets++;
    fake_stats.memset_bytes += width * height;
    fake_op op = {.kind = FAKE_OP_SET2D, .dst = devPtr, .value = value, .pitch = pitch, .width = width,
                  .height = height};
    return fake_submit(stream, &op, 0);
}

/* ------------------------------------------------------------- stats */

__attribute__((visibility("default"))) void fake_cuda_get_stats(fake_cuda_stats *out);
void fake_cuda_get_stats(fake_cuda_stats *out) {
    if (out) *out = fake_stats;
}

/* ------------------------------------------------ nvcc's module hooks */

/* nvcc's host code registers each .cu file's device image at load time
 * through these (crt/host_runtime.h). The fake's one .cu file,
 * fake_kg_flash.cu, is host code only, with an empty image: accepted and
 * ignored. */
void **CUDARTAPI __cudaRegisterFatBinary(void *fatCubin);
void CUDARTAPI __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void CUDARTAPI __cudaUnregisterFatBinary(void **fatCubinHandle);
char CUDARTAPI __cudaInitModule(void **fatCubinHandle);

void **CUDARTAPI __cudaRegisterFatBinary(void *fatCubin) {
    static void *handle;
    (void)fatCubin;
    return &handle;
}
void CUDARTAPI __cudaRegisterFatBinaryEnd(void **fatCubinHandle) { (void)fatCubinHandle; }
void CUDARTAPI __cudaUnregisterFatBinary(void **fatCubinHandle) { (void)fatCubinHandle; }
char CUDARTAPI __cudaInitModule(void **fatCubinHandle) {
    (void)fatCubinHandle;
    return 0;
}
