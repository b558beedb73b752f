/*
 * test_cuda_fake.c — the cuda accelerator plugin's host logic, run on the
 * fake CUDA build (tests/cuda_fake: the unchanged plugin sources linked with
 * a host-memory CUDA runtime, cuBLASLt and kernels), loaded through the mock
 * host. It covers what the entry-by-entry comparison with the cpu plugin
 * (test_cuda_kernels, also run on this build as test_cuda_fake) does not:
 * create() refusing a missing driver, an old one and no device, with the
 * versions and counts in the message; configure() before use, repeated,
 * and with a device that does not exist; the caching allocator (a freed
 * block is reused without a new cudaMalloc and comes back zeroed; best fit
 * within 25%; out of memory returns the cache to the driver and retries;
 * the OOM message); host-to-device copies larger than a staging slot and
 * than the whole ring; overlapping device-to-device copies as memmove; the
 * loss and reductions read back; the fused 1.3 entries' launches; failing
 * CUDA/cuBLAS calls turned into messages; and that destroy() returns every
 * device block, pinned buffer, stream, event and cuBLASLt object. The fake
 * counts what the plugin asked of "the GPU" (fake_cuda_get_stats) and
 * flags contract violations (a pointer outside device memory, an
 * overlapping cudaMemcpyAsync, an algorithm used with the wrong alignment,
 * a double cudaFree...); every test checks that none happened unless it
 * expects one. The regressions at the end are plugin bugs this fake found
 * (a configure() that said OK after a failed one, a failed trim corrupting
 * the block table, entries not making their device current, ...).
 *
 * This file also defines the suite and the helpers the other two share
 * (cuda_fake_test.h): test_cuda_fake_gemm.c tests the GEMM mapping and
 * gemm_ex, test_cuda_fake_seq.c the transformer entries, 16-bit activation
 * storage (1.7) and the rounded bias (1.8).
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "cuda_fake_test.h"
#include "adamw_many_cases.h"
#include "add_ln_cases.h"
#include "bwd_fuse_cases.h"
#include "sumsq_many_cases.h"

kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

const kiln_plugin_desc *g_desc;
const kiln_accelerator_ops *g_ops;
static fake_cuda_get_stats_fn g_stats_fn;
fake_cuda_hold_fn g_hold_fn;

fake_cuda_stats stats(void) {
    fake_cuda_stats s;
    memset(&s, 0, sizeof s);
    if (g_stats_fn) g_stats_fn(&s);
    return s;
}

static const char *const fake_env_vars[] = {"KILN_FAKE_CUDA_DEVICES", "KILN_FAKE_CUDA_DRIVER",
                                            "KILN_FAKE_CUDA_RUNTIME", "KILN_FAKE_CUDA_OOM_AFTER",
                                            "KILN_FAKE_CUDA_FAIL", "KILN_FAKE_CUDA_QUIET",
                                            "KILN_FAKE_CUDA_SEAL", "CUDA_VISIBLE_DEVICES",
                                            "SLURM_GPUS_PER_TASK"};

void env_clear(void) {
    for (size_t i = 0; i < sizeof fake_env_vars / sizeof fake_env_vars[0]; i++) unsetenv(fake_env_vars[i]);
}

void env_set(const char *name, const char *value) { setenv(name, value, 1); }

void env_set_size(const char *name, size_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%zu", v);
    setenv(name, buf, 1);
}

static int suite_init(void) {
    env_clear();
    kiln_test_reset(g_th);
    const char *dir = getenv("KILN_CUDA_FAKE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/libkiln-cuda.so", dir ? dir : ".");
    kiln_test_load(g_th, path, KILN_KIND_ACCELERATOR, "cuda", &g_desc);
    if (!g_desc) {
        fprintf(stderr, "test_cuda_fake: cannot load %s\n", path);
        return -1;
    }
    g_ops = g_desc->ops;
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return -1;
    *(void **)&g_stats_fn = dlsym(h, FAKE_CUDA_GET_STATS);
    *(void **)&g_hold_fn = dlsym(h, FAKE_CUDA_HOLD);
    dlclose(h); /* drops the reference RTLD_NOLOAD took; mh_load's stays */
    if (!g_stats_fn || !g_hold_fn) {
        fprintf(stderr, "test_cuda_fake: %s does not export %s and %s (not the fake build?)\n", path,
                FAKE_CUDA_GET_STATS, FAKE_CUDA_HOLD);
        return -1;
    }
    return 0;
}

static int suite_clean(void) {
    env_clear();
    kiln_test_reset(g_th);
    return 0;
}

/* Each test starts from a clean environment and counts its own
 * violations. */
unsigned long g_violations0;
static void test_setup(void) {
    env_clear();
    kiln_test_clear_error(g_th);
    g_violations0 = stats().violations;
}
static void test_teardown(void) { env_clear(); }

/* ------------------------------------------------------------- helpers */

int32_t make(const kiln_kv *cfg, kiln_instance **acc) {
    kiln_test_clear_error(g_th);
    *acc = NULL;
    return g_ops->base.create(g_desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, acc);
}

/* A created and configured instance (device 0), or NULL after a failed
 * assertion. */
kiln_instance *ready(const kiln_kv *cfg, const kiln_kernels **k) {
    kiln_instance *acc = NULL;
    int32_t rc = make(cfg, &acc);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    if (rc != KILN_OK) {
        fprintf(stderr, "  create: %s\n", kiln_test_error(g_th));
        return NULL;
    }
    rc = g_ops->configure(acc, 0, 0);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    if (rc != KILN_OK) {
        fprintf(stderr, "  configure: %s\n", kiln_test_error(g_th));
        g_ops->base.destroy(acc);
        return NULL;
    }
    *k = g_ops->kernels(acc);
    return acc;
}

/* A device copy of host(bytes). */
void *up(const kiln_kernels *k, kiln_instance *acc, const void *host, size_t bytes) {
    void *p = NULL;
    if (k->alloc(acc, bytes, &p) != KILN_OK) {
        fprintf(stderr, "  alloc(%zu): %s\n", bytes, kiln_test_error(g_th));
        return NULL;
    }
    if (host && k->copy(acc, p, host, bytes, KILN_COPY_H2D) != KILN_OK) {
        fprintf(stderr, "  copy H2D: %s\n", kiln_test_error(g_th));
        k->free(acc, p);
        return NULL;
    }
    return p;
}

/* host(bytes) = dev(bytes) after everything queued has run. */
int down(const kiln_kernels *k, kiln_instance *acc, void *host, const void *dev, size_t bytes) {
    if (k->synchronize(acc) != KILN_OK || k->copy(acc, host, dev, bytes, KILN_COPY_D2H) != KILN_OK) {
        fprintf(stderr, "  read back: %s\n", kiln_test_error(g_th));
        return 0;
    }
    return 1;
}

/* Deterministic values in [-1, 1). */
float val(unsigned i, unsigned salt) {
    uint32_t x = (i + 1u) * 2654435761u ^ (salt * 40503u + 0x9E37u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return (float)((double)(x & 0xFFFFFF) / (double)0x800000 - 1.0);
}

/* float32 -> bfloat16 bits, round to nearest even (NaN kept quiet). */
uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float round_bf16(float x) { return hb_bf16_value(bf16_bits(x)); }

/* The last destroy must leave nothing behind: device blocks, pinned
 * buffers, streams, events and cuBLASLt objects back to `before`. */
void check_released(const fake_cuda_stats *before) {
    const fake_cuda_stats a = stats();
    CU_ASSERT_EQUAL(a.live_blocks, before->live_blocks);
    CU_ASSERT_EQUAL(a.live_bytes, before->live_bytes);
    CU_ASSERT_EQUAL(a.live_host_blocks, before->live_host_blocks);
    CU_ASSERT_EQUAL(a.streams_live, before->streams_live);
    CU_ASSERT_EQUAL(a.events_live, before->events_live);
    CU_ASSERT_EQUAL(a.lt_handles_live, before->lt_handles_live);
    CU_ASSERT_EQUAL(a.lt_objects_live, before->lt_objects_live);
}

const kiln_kv cfg_none[] = {{NULL, KILN_V_NONE}};

/* ============================================================ create */

static void test_create_no_driver(void) {
    env_set("KILN_FAKE_CUDA_DRIVER", "0");
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL(make(NULL, &acc), KILN_E_CUDA);
    CU_ASSERT_PTR_NULL(acc);
    HAS(kiln_test_error(g_th), "no NVIDIA driver");
    HAS(kiln_test_error(g_th), "13.0");
    NO_VIOLATIONS();
}

static void test_create_old_driver(void) {
    env_set("KILN_FAKE_CUDA_DRIVER", "12040");
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL(make(NULL, &acc), KILN_E_VERSION);
    CU_ASSERT_PTR_NULL(acc);
    HAS(kiln_test_error(g_th), "13.0"); /* the runtime it was built with */
    HAS(kiln_test_error(g_th), "12.4"); /* what the driver supports */
    NO_VIOLATIONS();
}

/* CUDA's minor-version compatibility: a driver of the runtime's major
 * release runs it even when its minor version is older (one warning); an
 * older major release is refused, naming both. */
static void test_create_minor_driver(void) {
    env_set("KILN_FAKE_CUDA_DRIVER", "13000");
    env_set("KILN_FAKE_CUDA_RUNTIME", "13020");
    kiln_instance *acc = NULL;
    kiln_test_clear_log(g_th);
    CU_ASSERT_EQUAL_FATAL(make(NULL, &acc), KILN_OK);
    const char *w = kiln_test_log_find(g_th, KILN_LOG_WARN, "minor-version compatibility");
    CU_ASSERT_PTR_NOT_NULL(w);
    if (w) {
        HAS(w, "the driver supports CUDA 13.0");
        HAS(w, "CUDA runtime 13.2");
    }
    g_ops->base.destroy(acc);
    env_set("KILN_FAKE_CUDA_RUNTIME", "14000");
    CU_ASSERT_EQUAL(make(NULL, &acc), KILN_E_VERSION);
    CU_ASSERT_PTR_NULL(acc);
    HAS(kiln_test_error(g_th), "runs on CUDA runtime 14.0");
    HAS(kiln_test_error(g_th), "supports CUDA up to 13.0, an older major release");
    NO_VIOLATIONS();
}

static void test_create_no_device(void) {
    env_set("KILN_FAKE_CUDA_DEVICES", "0");
    env_set("CUDA_VISIBLE_DEVICES", "7");
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL(make(NULL, &acc), KILN_E_CUDA);
    CU_ASSERT_PTR_NULL(acc);
    HAS(kiln_test_error(g_th), "no CUDA device visible");
    HAS(kiln_test_error(g_th), "CUDA_VISIBLE_DEVICES=7");
    NO_VIOLATIONS();
}

static void test_create_bad_settings(void) {
    static const kiln_kv st0[] = {{"staging_mib", KILN_V_INT(0)}, {NULL, KILN_V_NONE}};
    static const kiln_kv dev_neg[] = {{"device", KILN_V_INT(-2)}, {NULL, KILN_V_NONE}};
    static const kiln_kv ws_big[] = {{"workspace_mib", KILN_V_INT(5000)}, {NULL, KILN_V_NONE}};
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL(make(st0, &acc), KILN_E_CONFIG);
    HAS(kiln_test_error(g_th), "staging_mib");
    CU_ASSERT_EQUAL(make(dev_neg, &acc), KILN_E_CONFIG);
    HAS(kiln_test_error(g_th), "device");
    CU_ASSERT_EQUAL(make(ws_big, &acc), KILN_E_CONFIG);
    HAS(kiln_test_error(g_th), "workspace_mib");
    CU_ASSERT_PTR_NULL(acc);
    NO_VIOLATIONS();
}

/* ========================================================= configure */

static void test_configure(void) {
    const fake_cuda_stats before = stats();
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL_FATAL(make(cfg_none, &acc), KILN_OK);
    const kiln_kernels *k = g_ops->kernels(acc);
    CU_ASSERT_PTR_NOT_NULL_FATAL(k);
    CU_ASSERT_EQUAL(k->struct_size >= KILN_KERNELS_SIZE_1_2, 1);
    CU_ASSERT_EQUAL(k->flags & KILN_KERNELS_HOST_MEMORY, 0);

    /* before configure(): refused, with the entry's name */
    void *p = NULL;
    CU_ASSERT_EQUAL(k->alloc(acc, 64, &p), KILN_E_STATE);
    HAS(kiln_test_error(g_th), "before configure");
    float x = 1.0f;
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 1, 1, 1, 1.0f, &x, 1, &x, 1, 0.0f, &x, 1), KILN_E_STATE);
    HAS(kiln_test_error(g_th), "gemm");
    CU_ASSERT_EQUAL(k->synchronize(acc), KILN_E_STATE);
    /* nothing reached the device yet */
    CU_ASSERT_EQUAL(stats().mallocs, before.mallocs);

    CU_ASSERT_EQUAL(g_ops->configure(acc, -1, 0), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_ops->configure(acc, 0, -1), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_ops->configure(acc, 0, 0), KILN_OK);
    /* again on the same device: a no-op */
    const unsigned long mallocs = stats().mallocs;
    CU_ASSERT_EQUAL(g_ops->configure(acc, 4, 0), KILN_OK);
    CU_ASSERT_EQUAL(stats().mallocs, mallocs);
    CU_ASSERT_EQUAL(stats().streams_live, before.streams_live + 1);
    /* local rank 1 of 2 devices asks for device 1: moving is refused */
    env_set("KILN_FAKE_CUDA_DEVICES", "2");
    CU_ASSERT_EQUAL(g_ops->configure(acc, 0, 1), KILN_E_STATE);
    HAS(kiln_test_error(g_th), "cannot move to device 1");
    /* with one device, local rank 1 has no GPU of its own: refused (it
     * would share device 0 with local rank 0), naming both numbers */
    env_clear();
    CU_ASSERT_EQUAL(g_ops->configure(acc, 0, 1), KILN_E_CONFIG);
    HAS(kiln_test_error(g_th), "local_rank 1");
    HAS(kiln_test_error(g_th), "1 CUDA device is visible");
    HAS(kiln_test_error(g_th), "srun --gpus-per-task=1");

    CU_ASSERT_EQUAL(k->alloc(acc, 64, &p), KILN_OK);
    CU_ASSERT_EQUAL((uintptr_t)p % 256, 0);
    k->free(acc, p);
    k->free(acc, NULL);
    g_ops->base.destroy(acc);
    check_released(&before);
    NO_VIOLATIONS();
}

static void test_configure_missing_device(void) {
    static const kiln_kv dev5[] = {{"device", KILN_V_INT(5)}, {NULL, KILN_V_NONE}};
    const fake_cuda_stats before = stats();
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL_FATAL(make(dev5, &acc), KILN_OK); /* the device is chosen in configure() */
    CU_ASSERT_EQUAL(g_ops->configure(acc, 0, 0), KILN_E_CONFIG);
    HAS(kiln_test_error(g_th), "device 5");
    HAS(kiln_test_error(g_th), "only 1 device is visible");
    g_ops->base.destroy(acc);
    /* two devices: the message counts them */
    env_set("KILN_FAKE_CUDA_DEVICES", "2");
    CU_ASSERT_EQUAL_FATAL(make(dev5, &acc), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->configure(acc, 0, 0), KILN_E_CONFIG);
    HAS(kiln_test_error(g_th), "only 2 devices are visible (0..1)");
    g_ops->base.destroy(acc);
    check_released(&before);
    NO_VIOLATIONS();
}

/* Under Slurm's --gpus-per-task each task sees only its own GPUs, so
 * local rank 3 of a node takes device 0, the one it sees, with one info
 * line; a `device` setting still wins. */
static void test_configure_slurm_bound(void) {
    static const kiln_kv dev1[] = {{"device", KILN_V_INT(1)}, {NULL, KILN_V_NONE}};
    const fake_cuda_stats before = stats();
    kiln_instance *acc = NULL;
    env_set("SLURM_GPUS_PER_TASK", "1");
    kiln_test_clear_log(g_th);
    CU_ASSERT_EQUAL_FATAL(make(NULL, &acc), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->configure(acc, 0, 3), KILN_OK);
    const char *l = kiln_test_log_find(g_th, KILN_LOG_INFO, "SLURM_GPUS_PER_TASK");
    CU_ASSERT_PTR_NOT_NULL(l);
    if (l) HAS(l, "local_rank 3 takes the first device it sees, device 0 of 1");
    CU_ASSERT_PTR_NOT_NULL(kiln_test_log_find(g_th, KILN_LOG_INFO, "cuda: device 0 of 1"));
    g_ops->base.destroy(acc);
    env_set("KILN_FAKE_CUDA_DEVICES", "2");
    CU_ASSERT_EQUAL_FATAL(make(dev1, &acc), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->configure(acc, 0, 3), KILN_OK);
    CU_ASSERT_PTR_NOT_NULL(kiln_test_log_find(g_th, KILN_LOG_INFO, "cuda: device 1 of 2"));
    g_ops->base.destroy(acc);
    unsetenv("SLURM_GPUS_PER_TASK");
    check_released(&before);
    NO_VIOLATIONS();
}

/* A configure() whose setup fails (here the pinned result buffer) reports
 * the call, and destroy() still releases what was set up. */
static void test_configure_failure_releases(void) {
    const fake_cuda_stats before = stats();
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL_FATAL(make(NULL, &acc), KILN_OK);
    env_set("KILN_FAKE_CUDA_FAIL", "cudaHostAlloc");
    CU_ASSERT_EQUAL(g_ops->configure(acc, 0, 0), KILN_E_NOMEM);
    HAS(kiln_test_error(g_th), "cudaHostAlloc");
    HAS(kiln_test_error(g_th), "cudaErrorMemoryAllocation");
    env_clear();
    g_ops->base.destroy(acc);
    check_released(&before);
    NO_VIOLATIONS();
}

/* A kernel fault is a sticky error: it surfaces in a later entry (here
 * sum, after the faulting scale), whose message says the context is lost
 * and how to find the kernel; every entry after that is refused without a
 * CUDA call, naming where the fault was first seen; teardown still
 * releases everything. cuBLASLt's "execution failed" on a lost context is
 * reported with the runtime's error behind it. */
static void test_context_lost(void) {
    const fake_cuda_stats before = stats();
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    float host[64];
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    float *d = up(k, acc, host, sizeof host);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    env_set("KILN_FAKE_CUDA_FAIL", "kernel_fault@1");
    CU_ASSERT_EQUAL(k->scale(acc, d, 2.0f, 64), KILN_OK); /* its launch is accepted; the kernel faults */
    double sum = 0.0;
    CU_ASSERT_EQUAL(k->sum(acc, d, 64, &sum), KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "cuda: sum: ");
    HAS(kiln_test_error(g_th), "cudaErrorIllegalAddress");
    HAS(kiln_test_error(g_th), "the CUDA context is lost");
    HAS(kiln_test_error(g_th), "CUDA_LAUNCH_BLOCKING=1");
    const fake_cuda_stats mid = stats();
    CU_ASSERT_EQUAL(k->scale(acc, d, 2.0f, 64), KILN_E_CUDA);
    HAS(kiln_test_error(g_th),
        "cuda: scale: refused: the CUDA context was lost earlier (cudaErrorIllegalAddress, first seen in sum)");
    CU_ASSERT_EQUAL(k->copy(acc, host, d, sizeof host, KILN_COPY_D2H), KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "cuda: copy: refused");
    CU_ASSERT_EQUAL(stats().kernels, mid.kernels);
    CU_ASSERT_EQUAL(stats().syncs, mid.syncs);
    k->free(acc, d);
    g_ops->base.destroy(acc); /* while lost: errors ignored, everything released */
    check_released(&before);

    /* a "new process": the fault again, and a GEMM next */
    env_clear();
    acc = ready(NULL, &k);
    if (!acc) return;
    float *a = up(k, acc, host, sizeof host), *c = up(k, acc, NULL, sizeof host);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a && c);
    env_set("KILN_FAKE_CUDA_FAIL", "kernel_fault@1,none");
    CU_ASSERT_EQUAL(k->scale(acc, a, 1.0f, 64), KILN_OK);
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 8, 8, 8, 1.0f, a, 8, a, 8, 0.0f, c, 8), KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "cudaErrorIllegalAddress");
    HAS(kiln_test_error(g_th), "the CUDA context is lost");
    k->free(acc, a);
    k->free(acc, c);
    g_ops->base.destroy(acc);
    env_clear();
    check_released(&before);
    NO_VIOLATIONS();
}

/* ========================================================= allocator */

/* 1 when dev(bytes <= 4096) reads back as zeros. */
static int reads_zero(const kiln_kernels *k, kiln_instance *acc, const void *dev, size_t bytes) {
    unsigned char back[4096];
    memset(back, 0x55, sizeof back);
    if (bytes > sizeof back || !down(k, acc, back, dev, bytes)) return 0;
    for (size_t i = 0; i < bytes; i++)
        if (back[i]) return 0;
    return 1;
}

static void test_alloc_reuse(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    fake_cuda_stats s0 = stats();
    unsigned char host[1000];
    memset(host, 0xAB, sizeof host);
    void *p = up(k, acc, host, sizeof host);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL(stats().mallocs, s0.mallocs + 1);
    k->free(acc, p);

    /* the same size (and one that rounds to the same 1024 bytes): the cached
     * block, no cudaMalloc, zero-filled although it was dirtied */
    for (int round = 0; round < 2; round++) {
        void *q = NULL;
        CU_ASSERT_EQUAL_FATAL(k->alloc(acc, round ? 900 : 1000, &q), KILN_OK);
        CU_ASSERT_PTR_EQUAL(q, p);
        CU_ASSERT_EQUAL(stats().mallocs, s0.mallocs + 1);
        CU_ASSERT_TRUE(reads_zero(k, acc, q, 1000));
        CU_ASSERT_EQUAL(k->copy(acc, q, host, sizeof host, KILN_COPY_H2D), KILN_OK);
        k->free(acc, q);
    }
    /* best fit within 25%: a cached 1024-byte block does not serve 2000
     * bytes, and a cached 4096-byte block does not serve 1024 */
    void *big = NULL, *small = NULL;
    CU_ASSERT_EQUAL(k->alloc(acc, 2000, &big), KILN_OK);
    CU_ASSERT_PTR_NOT_EQUAL(big, p);
    CU_ASSERT_EQUAL(stats().mallocs, s0.mallocs + 2);
    k->free(acc, big);
    CU_ASSERT_EQUAL(k->alloc(acc, 4096, &big), KILN_OK);
    CU_ASSERT_EQUAL(stats().mallocs, s0.mallocs + 3);
    k->free(acc, big);
    CU_ASSERT_EQUAL(k->alloc(acc, 1024, &small), KILN_OK);
    CU_ASSERT_PTR_EQUAL(small, p);
    CU_ASSERT_EQUAL(stats().mallocs, s0.mallocs + 3);
    k->free(acc, small);
    /* a pointer it never gave out: a warning, nothing freed */
    unsigned char other[8];
    const unsigned long frees = stats().frees;
    k->free(acc, other);
    CU_ASSERT_EQUAL(stats().frees, frees);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* caching = false: each alloc a cudaMalloc of exactly its bytes (so a
 * memory checker sees an overrun leave it), each free a cudaFree, and the
 * memory still zero-filled. */
static void test_alloc_no_caching(void) {
    static const kiln_kv cfg[] = {{"caching", KILN_V_BOOL(0)}, {NULL, KILN_V_NONE}};
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(cfg, &k);
    if (!acc) return;
    const fake_cuda_stats s0 = stats();
    for (int round = 0; round < 2; round++) {
        void *p = NULL;
        CU_ASSERT_EQUAL_FATAL(k->alloc(acc, 1000, &p), KILN_OK);
        CU_ASSERT_EQUAL(stats().mallocs, s0.mallocs + 1 + (unsigned long)round);
        CU_ASSERT_EQUAL(stats().live_bytes, s0.live_bytes + 1000);
        CU_ASSERT_TRUE(reads_zero(k, acc, p, 1000));
        k->free(acc, p);
        CU_ASSERT_EQUAL(stats().frees, s0.frees + 1 + (unsigned long)round);
        CU_ASSERT_EQUAL(stats().live_bytes, s0.live_bytes);
    }
    void *z = NULL; /* 0 bytes: one byte, a pointer of its own */
    CU_ASSERT_EQUAL(k->alloc(acc, 0, &z), KILN_OK);
    CU_ASSERT_PTR_NOT_NULL(z);
    CU_ASSERT_EQUAL(stats().live_bytes, s0.live_bytes + 1);
    k->free(acc, z);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

static void test_alloc_oom(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const size_t mib = (size_t)1 << 20;
    void *a = NULL, *b = NULL, *c = NULL;
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, 4 * mib, &a), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, 4 * mib, &b), KILN_OK);
    k->free(acc, a);
    k->free(acc, b);
    /* 8 MiB cached; capacity leaves 5 MiB beyond what is allocated, so a
     * 6 MiB block fits only once the cache has gone back to the driver */
    fake_cuda_stats s0 = stats();
    env_set_size("KILN_FAKE_CUDA_OOM_AFTER", s0.live_bytes + 5 * mib);
    CU_ASSERT_EQUAL(k->alloc(acc, 6 * mib, &c), KILN_OK);
    fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.malloc_failures, s0.malloc_failures + 1);
    CU_ASSERT_EQUAL(s1.frees, s0.frees + 2);
    CU_ASSERT_EQUAL(s1.mallocs, s0.mallocs + 1);
    /* the new block works */
    unsigned char one = 1, back = 0;
    CU_ASSERT_EQUAL(k->copy(acc, (char *)c + 6 * mib - 1, &one, 1, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, &back, (char *)c + 6 * mib - 1, 1));
    CU_ASSERT_EQUAL(back, 1);
    /* nothing cached any more: a plain out-of-memory, with the numbers */
    void *d = NULL;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(k->alloc(acc, 64 * mib, &d), KILN_E_NOMEM);
    CU_ASSERT_PTR_NULL(d);
    HAS(kiln_test_error(g_th), "cudaMalloc(67108864 bytes) failed on device 0");
    HAS(kiln_test_error(g_th), "out of memory");
    HAS(kiln_test_error(g_th), "MiB free of");
    HAS(kiln_test_error(g_th), "held by kiln");
    /* absurd sizes are refused without asking the driver */
    CU_ASSERT_EQUAL(k->alloc(acc, SIZE_MAX - 100, &d), KILN_E_NOMEM);
    env_clear();
    k->free(acc, c);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* ============================================================ copies */

static void test_staging(void) {
    static const kiln_kv st1[] = {{"staging_mib", KILN_V_INT(1)}, {NULL, KILN_V_NONE}};
    const fake_cuda_stats before = stats();
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(st1, &k);
    if (!acc) return;
    const size_t sizes[] = {(size_t)7 << 19 /* 3.5 MiB: 4 slots */, (size_t)13 << 19 /* 6.5 MiB: 7, reuses */};
    for (int t = 0; t < 2; t++) {
        const size_t n = sizes[t];
        unsigned char *h1 = malloc(n), *h2 = malloc(n), *back = malloc(n);
        CU_ASSERT_FATAL(h1 && h2 && back);
        for (size_t i = 0; i < n; i++) {
            h1[i] = (unsigned char)(i * 7u + (i >> 12) + (unsigned)t);
            h2[i] = (unsigned char)(i * 13u + 5u + (i >> 10));
        }
        const unsigned long pinned0 = stats().h2d_async_pinned;
        /* two copies back to back, nothing waited for in between: the
         * second reuses slots the first may still be reading */
        void *d1 = up(k, acc, h1, n), *d2 = up(k, acc, h2, n);
        CU_ASSERT_FATAL(d1 && d2);
        /* the host buffers may change as soon as copy() returns */
        memset(h1, 0, n);
        /* a device-to-host copy waits for the queued work by itself */
        CU_ASSERT_EQUAL(k->copy(acc, back, d2, n, KILN_COPY_D2H), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(back, h2, n), 0);
        CU_ASSERT(stats().h2d_async_pinned >= pinned0 + 2 * ((n + ((size_t)1 << 20) - 1) >> 20));
        CU_ASSERT_TRUE(down(k, acc, back, d2, n));
        CU_ASSERT_EQUAL(memcmp(back, h2, n), 0);
        for (size_t i = 0; i < n; i++) h1[i] = (unsigned char)(i * 7u + (i >> 12) + (unsigned)t);
        CU_ASSERT_TRUE(down(k, acc, back, d1, n));
        CU_ASSERT_EQUAL(memcmp(back, h1, n), 0);
        k->free(acc, d1);
        k->free(acc, d2);
        free(h1), free(h2), free(back);
    }
    /* the ring is 4 pinned slots of staging_mib each, plus the result buffer */
    CU_ASSERT_EQUAL(stats().live_host_blocks, before.live_host_blocks + 5);
    g_ops->base.destroy(acc);
    check_released(&before);
    NO_VIOLATIONS();
}

static void test_copy_overlap(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    float h[1024], back[1024], want[1024];
    for (int i = 0; i < 1024; i++) h[i] = (float)i;
    float *d = up(k, acc, h, sizeof h);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    /* forward overlap: dst after src */
    CU_ASSERT_EQUAL(k->copy(acc, d + 16, d, 512 * sizeof(float), KILN_COPY_D2D), KILN_OK);
    memcpy(want, h, sizeof want);
    memmove(want + 16, want, 512 * sizeof(float));
    CU_ASSERT_TRUE(down(k, acc, back, d, sizeof back));
    CU_ASSERT_EQUAL(memcmp(back, want, sizeof want), 0);
    /* backward overlap: dst before src */
    CU_ASSERT_EQUAL(k->copy(acc, d + 3, d + 200, 700 * sizeof(float), KILN_COPY_D2D), KILN_OK);
    memmove(want + 3, want + 200, 700 * sizeof(float));
    CU_ASSERT_TRUE(down(k, acc, back, d, sizeof back));
    CU_ASSERT_EQUAL(memcmp(back, want, sizeof want), 0);
    /* dst == src, zero bytes, bad kind, NULL */
    CU_ASSERT_EQUAL(k->copy(acc, d, d, sizeof h, KILN_COPY_D2D), KILN_OK);
    CU_ASSERT_EQUAL(k->copy(acc, d, NULL, 0, KILN_COPY_D2D), KILN_OK);
    CU_ASSERT_EQUAL(k->copy(acc, d, h, 4, 3), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->copy(acc, NULL, h, 4, KILN_COPY_H2D), KILN_E_INVALID_ARG);
    /* zero() */
    CU_ASSERT_EQUAL(k->zero(acc, d + 10, 5 * sizeof(float)), KILN_OK);
    memset(want + 10, 0, 5 * sizeof(float));
    CU_ASSERT_TRUE(down(k, acc, back, d, sizeof back));
    CU_ASSERT_EQUAL(memcmp(back, want, sizeof want), 0);
    k->free(acc, d);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* An upload whose event record fails: the copy fails in one line, and
 * its slot is not handed out again before its DMA has read it (the stream
 * is waited for), so the ring's next use of that slot (the 4th copy after)
 * cannot change what the failed copy delivers. */
static void test_staging_record_fails(void) {
    static const kiln_kv st1[] = {{"staging_mib", KILN_V_INT(1)}, {NULL, KILN_V_NONE}};
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(st1, &k);
    if (!acc) return;
    enum { N = 4096, SLOTS = 4 };
    static unsigned char h[N], other[N], back[N];
    for (int i = 0; i < N; i++) h[i] = (unsigned char)(i * 7 + 1), other[i] = (unsigned char)(i * 13 + 5);
    void *d = NULL, *e[SLOTS] = {NULL};
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, N, &d), KILN_OK);
    env_set("KILN_FAKE_CUDA_FAIL", "cudaEventRecord@1");
    CU_ASSERT_EQUAL(k->copy(acc, d, h, N, KILN_COPY_H2D), KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "copy (host to device)");
    HAS(kiln_test_error(g_th), "cudaEventRecord");
    env_clear();
    for (int i = 0; i < SLOTS; i++) {
        CU_ASSERT_EQUAL_FATAL(k->alloc(acc, N, &e[i]), KILN_OK);
        CU_ASSERT_EQUAL(k->copy(acc, e[i], other, N, KILN_COPY_H2D), KILN_OK);
    }
    CU_ASSERT_EQUAL(k->copy(acc, back, d, N, KILN_COPY_D2H), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(back, h, N), 0);
    k->free(acc, d);
    for (int i = 0; i < SLOTS; i++) k->free(acc, e[i]);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* ================================================= loss, reductions */

static void test_loss_and_reductions(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    enum { B = 5, C = 4 };
    float logits[B * C], probs[B * C];
    int32_t labels[B] = {0, 3, 1, 2, 3};
    for (int i = 0; i < B * C; i++) logits[i] = val(i, 41) * 3.0f;
    float *dl = up(k, acc, logits, sizeof logits), *dp = up(k, acc, NULL, sizeof probs);
    int32_t *dy = up(k, acc, labels, sizeof labels);
    CU_ASSERT_FATAL(dl && dp && dy);
    float loss = -1.0f;
    int32_t correct = -1;
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, dp, dl, dy, B, C, &loss, &correct), KILN_OK);
    double want = 0.0;
    int want_correct = 0;
    for (int r = 0; r < B; r++) {
        double mx = logits[r * C], s = 0.0;
        int arg = 0;
        for (int j = 1; j < C; j++)
            if (logits[r * C + j] > mx) mx = logits[r * C + j], arg = j;
        for (int j = 0; j < C; j++) s += exp(logits[r * C + j] - mx);
        want += log(s) - (logits[r * C + labels[r]] - mx);
        want_correct += arg == labels[r];
    }
    want /= B;
    CU_ASSERT(fabs(loss - want) < 1e-5);
    CU_ASSERT_EQUAL(correct, want_correct);
    CU_ASSERT_TRUE(down(k, acc, probs, dp, sizeof probs));
    for (int r = 0; r < B; r++) {
        double s = 0.0;
        for (int j = 0; j < C; j++) s += probs[r * C + j];
        CU_ASSERT(fabs(s - 1.0) < 1e-6);
    }
    /* a bad label: KILN_E_DATA naming the first bad row and its label */
    int32_t bad_labels[B] = {0, 9, 1, -1, 3};
    CU_ASSERT_EQUAL(k->copy(acc, dy, bad_labels, sizeof bad_labels, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, dp, dl, dy, B, C, &loss, &correct), KILN_E_DATA);
    HAS(kiln_test_error(g_th), "label 9 at batch index 1");
    /* labels fixed again: the bad-row flag was reset */
    CU_ASSERT_EQUAL(k->copy(acc, dy, labels, sizeof labels, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, dp, dl, dy, B, C, &loss, NULL), KILN_OK);
    CU_ASSERT(fabs(loss - want) < 1e-5);
    /* probs overlapping the logits is refused (a row's label logit is read
     * after its probabilities are written); the backward's dlogits may be
     * probs itself, not a part of it (the same checks as the cpu's) */
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, dl, dl, dy, B, C, &loss, NULL), KILN_E_INVALID_ARG);
    HAS(kiln_test_error(g_th), "cuda: softmax_xent_forward: probs overlaps logits");
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, dl + 3, dl, dy, 1, C, &loss, NULL), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, dl + 4, dl, dy, 1, C, &loss, NULL), KILN_OK);
    CU_ASSERT_EQUAL(k->softmax_xent_backward(acc, dp + 1, dp, dy, B - 1, C, 1.0f), KILN_E_INVALID_ARG);
    HAS(kiln_test_error(g_th), "dlogits partially overlaps probs");
    CU_ASSERT_EQUAL(k->softmax_xent_backward_ex(acc, KILN_DTYPE_F32, dp, dp, dy, B, C, 1.0), KILN_OK);
    /* reductions read back */
    enum { N = 3000 };
    float *x = malloc(N * sizeof *x);
    double s = 0.0, sq = 0.0;
    for (int i = 0; i < N; i++) x[i] = val(i, 42), s += x[i], sq += (double)x[i] * x[i];
    float *dx = up(k, acc, x, N * sizeof *x);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dx);
    double got = 0.0;
    int32_t finite = -1;
    CU_ASSERT_EQUAL(k->sum(acc, dx, N, &got), KILN_OK);
    CU_ASSERT(fabs(got - s) < 1e-9);
    CU_ASSERT_EQUAL(k->sumsq(acc, dx, N, &got), KILN_OK);
    CU_ASSERT(fabs(got - sq) < 1e-9);
    CU_ASSERT_EQUAL(k->all_finite(acc, dx, N, &finite), KILN_OK);
    CU_ASSERT_EQUAL(finite, 1);
    const float inf = INFINITY;
    CU_ASSERT_EQUAL(k->copy(acc, dx + N - 1, &inf, 4, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->all_finite(acc, dx, N, &finite), KILN_OK);
    CU_ASSERT_EQUAL(finite, 0);
    CU_ASSERT_EQUAL(k->sum(acc, dx, 0, &got), KILN_OK);
    CU_ASSERT_EQUAL(got, 0.0);
    CU_ASSERT_EQUAL(k->sumsq_ex(acc, KILN_DTYPE_F16, dx, N, &got), KILN_E_INVALID_ARG);
    free(x);
    k->free(acc, dl), k->free(acc, dp), k->free(acc, dy), k->free(acc, dx);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* 1.9's sumsq_many: the shared cases (tests/support/sumsq_many_cases.h,
 * which the cpu accelerator passes too), then what it is for: a list of
 * 100 tensors costs 3 list launches, one read-back and one wait where the
 * per-tensor entry costs 100 of each, a failing launch is a message naming
 * the entry, and the host-wait counter says so at exit. */
static void test_sumsq_many(void) {
    const kiln_kernels *k = NULL;
    kiln_test_clear_log(g_th);
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    sumsq_many_run_all(k, acc);
    enum { L = 100, N = 300 };
    float *d = NULL;
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, (size_t)L * N * sizeof(float), (void **)&d), KILN_OK);
    float h[N];
    for (int i = 0; i < N; i++) h[i] = val((unsigned)i, 19u);
    const void *x[L];
    size_t n[L];
    for (int i = 0; i < L; i++) {
        x[i] = d + (size_t)i * N, n[i] = (size_t)(N - i);
        CU_ASSERT_EQUAL(k->copy(acc, d + (size_t)i * N, h, sizeof h, KILN_COPY_H2D), KILN_OK);
    }
    double out[L], one;
    const fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->sumsq_many(acc, KILN_DTYPE_F32, x, n, L, out), KILN_OK);
    const fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.syncs - s0.syncs, 1u);
    CU_ASSERT_EQUAL(s1.d2h_copies - s0.d2h_copies, 1u);
    CU_ASSERT_EQUAL(s1.kernels - s0.kernels, 3u); /* kg_reduce_list on lists of 48, 48 and 4 */
    for (int i = 0; i < L; i++) {
        CU_ASSERT_EQUAL(k->sumsq_ex(acc, KILN_DTYPE_F32, x[i], n[i], &one), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(&one, &out[i], sizeof one), 0);
    }
    CU_ASSERT_EQUAL(stats().syncs - s1.syncs, (unsigned long)L); /* the loop: one wait per tensor */
    env_set("KILN_FAKE_CUDA_FAIL", "kg_reduce_list");
    CU_ASSERT_EQUAL(k->sumsq_many(acc, KILN_DTYPE_F32, x, n, L, out), KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "sumsq_many");
    HAS(kiln_test_error(g_th), "kg_reduce_list");
    env_clear();
    CU_ASSERT_EQUAL(k->sumsq_many(acc, KILN_DTYPE_F32, x, n, L, out), KILN_OK); /* and works again */
    k->free(acc, d);
    /* the exit line (debug level) counts the waits */
    kiln_test_set_log_level(g_th, KILN_LOG_DEBUG);
    g_ops->base.destroy(acc);
    kiln_test_set_log_level(g_th, KILN_LOG_INFO);
    CU_ASSERT_PTR_NOT_NULL(kiln_test_log_find(g_th, KILN_LOG_DEBUG, " host waits, "));
    NO_VIOLATIONS();
}

/* 1.10's add_layernorm_forward: the shared cases, then what it is for: one
 * launch where add and layernorm_forward take two; a failing launch is a
 * message naming the entry and the kernel. */
static void test_add_ln(void) {
    const kiln_kernels *k = NULL;
    kiln_test_clear_log(g_th);
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    add_ln_run_all(k, acc);
    enum { N = 8, C = 64 };
    float *d = NULL;
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, (size_t)(4 * N * C + 2 * N) * sizeof(float), (void **)&d), KILN_OK);
    float *res = d, *a = d + N * C, *b = d + 2 * N * C, *y = d + 3 * N * C, *mean = d + 4 * N * C, *rstd = mean + N;
    const fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->add_layernorm_forward(acc, KILN_DTYPE_F32, res, a, b, y, mean, rstd, NULL, NULL, N, C, 1e-5,
                                             KILN_DTYPE_F32),
                    KILN_OK);
    CU_ASSERT_EQUAL(stats().kernels - s0.kernels, 1u);
    env_set("KILN_FAKE_CUDA_FAIL", "kg_add_layernorm_forward");
    CU_ASSERT_EQUAL(k->add_layernorm_forward(acc, KILN_DTYPE_F32, res, a, b, y, mean, rstd, NULL, NULL, N, C, 1e-5,
                                             KILN_DTYPE_F32),
                    KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "add_layernorm_forward");
    HAS(kiln_test_error(g_th), "kg_add_layernorm_forward");
    env_clear();
    k->free(acc, d);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* 1.11's act_bias_backward and layernorm_backward_cast: the shared cases
 * (tests/support/bwd_fuse_cases.h, which the cpu accelerator passes too),
 * then what they are for: one launch where act_backward and bias_grad_ex
 * take two (three with the sum's second pass: two), and one where
 * layernorm_backward and cast take two (with dw and db: four and five);
 * a failing launch is a message naming the entry and the kernel. */
static void test_bwd_fuse(void) {
    const kiln_kernels *k = NULL;
    kiln_test_clear_log(g_th);
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    bwd_fuse_run_all(k, acc);
    enum { N = 600, C = 64 }; /* 600 rows: the column sum in three parts */
    float *d = NULL;
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, (size_t)(4 * N * C + 4 * C + 2 * N) * sizeof(float), (void **)&d), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(k->zero(acc, d, (size_t)(4 * N * C + 4 * C + 2 * N) * sizeof(float)), KILN_OK);
    float *dx = d, *dy = d + N * C, *x = d + 2 * N * C, *c16 = d + 3 * N * C, *db = d + 4 * N * C, *dw = db + C;
    float *mean = dw + C, *rstd = mean + N;
    fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->act_bias_backward(acc, KILN_DTYPE_F32, KILN_ACT_GELU, dx, db, dy, x, N, C, 1), KILN_OK);
    CU_ASSERT_EQUAL(stats().kernels - s0.kernels, 2u); /* the pass that fuses, and the parts' sum */
    s0 = stats();
    CU_ASSERT_EQUAL(k->act_backward(acc, KILN_DTYPE_F32, KILN_ACT_GELU, dx, dy, x, (size_t)N * C), KILN_OK);
    CU_ASSERT_EQUAL(k->bias_grad_ex(acc, KILN_DTYPE_F32, db, dx, N, C, 1), KILN_OK);
    CU_ASSERT_EQUAL(stats().kernels - s0.kernels, 3u);
    s0 = stats();
    CU_ASSERT_EQUAL(k->layernorm_backward_cast(acc, KILN_DTYPE_F32, dx, NULL, NULL, dy, x, NULL, mean, rstd, N, C, 1,
                                               c16, KILN_DTYPE_BF16),
                    KILN_OK);
    CU_ASSERT_EQUAL(stats().kernels - s0.kernels, 1u);
    s0 = stats();
    CU_ASSERT_EQUAL(k->layernorm_backward(acc, KILN_DTYPE_F32, dx, NULL, NULL, dy, x, NULL, mean, rstd, N, C, 1),
                    KILN_OK);
    CU_ASSERT_EQUAL(k->cast(acc, c16, KILN_DTYPE_BF16, dx, KILN_DTYPE_F32, (size_t)N * C), KILN_OK);
    CU_ASSERT_EQUAL(stats().kernels - s0.kernels, 2u);
    env_set("KILN_FAKE_CUDA_FAIL", "kg_act_bias_backward");
    CU_ASSERT_EQUAL(k->act_bias_backward(acc, KILN_DTYPE_F32, KILN_ACT_GELU, dx, db, dy, x, N, C, 1), KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "act_bias_backward");
    HAS(kiln_test_error(g_th), "kg_act_bias_backward");
    env_set("KILN_FAKE_CUDA_FAIL", "kg_layernorm_backward_cast");
    CU_ASSERT_EQUAL(k->layernorm_backward_cast(acc, KILN_DTYPE_F32, dx, dw, db, dy, x, NULL, mean, rstd, N, C, 1, c16,
                                               KILN_DTYPE_BF16),
                    KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "layernorm_backward_cast");
    HAS(kiln_test_error(g_th), "kg_layernorm_backward_cast");
    env_clear();
    k->free(acc, d);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* 1.10's adamw_update_many: the shared cases (tests/support/
 * adamw_many_cases.h, which the cpu accelerator passes too), then what it
 * is for: 100 parameters updated in 3 launches (lists of 48, 48 and 4)
 * where the per-tensor entry takes 100, with no wait and no read-back; a
 * list of empty tensors launches nothing; a failing launch is a message
 * naming the entry and the kernel. */
static void test_adamw_many(void) {
    const kiln_kernels *k = NULL;
    kiln_test_clear_log(g_th);
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    adamw_many_run_all(k, acc);
    enum { L = 100, N = 64 };
    float *d = NULL;
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, (size_t)4 * L * N * sizeof(float), (void **)&d), KILN_OK);
    void *p[L], *m[L], *v[L];
    const void *g[L];
    size_t n[L];
    double wd[L];
    for (int i = 0; i < L; i++) {
        float *t = d + (size_t)4 * N * i;
        p[i] = t, g[i] = t + N, m[i] = t + 2 * N, v[i] = t + 3 * N;
        n[i] = (size_t)(N - i % 7), wd[i] = i % 2 ? 0.1 : 0.0;
    }
    const fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->adamw_update_many(acc, KILN_DTYPE_F32, L, p, g, m, v, n, wd, 1e-3, 0.9, 0.999, 1e-8, 1),
                    KILN_OK);
    const fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.kernels - s0.kernels, 3u);
    CU_ASSERT_EQUAL(s1.syncs - s0.syncs, 0u);
    CU_ASSERT_EQUAL(s1.d2h_copies - s0.d2h_copies, 0u);
    size_t zero[L] = {0};
    CU_ASSERT_EQUAL(k->adamw_update_many(acc, KILN_DTYPE_F32, L, p, g, m, v, zero, wd, 1e-3, 0.9, 0.999, 1e-8, 2),
                    KILN_OK);
    CU_ASSERT_EQUAL(stats().kernels - s1.kernels, 0u);
    env_set("KILN_FAKE_CUDA_FAIL", "kg_adamw_update_list");
    CU_ASSERT_EQUAL(k->adamw_update_many(acc, KILN_DTYPE_F32, L, p, g, m, v, n, wd, 1e-3, 0.9, 0.999, 1e-8, 2),
                    KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "adamw_update_many");
    HAS(kiln_test_error(g_th), "kg_adamw_update_list");
    env_clear();
    k->free(acc, d);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* ====================================================== error paths */

static void test_failing_calls(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    float h[16] = {0};
    float *d = up(k, acc, h, sizeof h);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    env_set("KILN_FAKE_CUDA_FAIL", "cublasLtMatmul");
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 2, 3, 2, 1.0f, d, 2, d, 3, 0.0f, d + 8, 3), KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "cublasLtMatmul");
    HAS(kiln_test_error(g_th), "2x3x2");
    env_set("KILN_FAKE_CUDA_FAIL", "kg_scale");
    CU_ASSERT_EQUAL(k->scale(acc, d, 2.0f, 16), KILN_E_CUDA); /* a refused launch: not sticky */
    HAS(kiln_test_error(g_th), "kg_scale");
    HAS(kiln_test_error(g_th), "cudaErrorLaunchOutOfResources");
    env_set("KILN_FAKE_CUDA_FAIL", "cublasLtMatmulAlgoGetHeuristic");
    /* the heuristic's NOT_SUPPORTED: no algorithm, KILN_E_UNSUPPORTED */
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 3, 3, 1, 1.0f, d, 1, d, 3, 0.0f, d + 4, 3), KILN_E_UNSUPPORTED);
    HAS(kiln_test_error(g_th), "cuBLAS status 15");
    env_clear();
    /* the failed plan left nothing behind and the shape works now */
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 3, 3, 1, 1.0f, d, 1, d, 3, 0.0f, d + 4, 3), KILN_OK);
    CU_ASSERT_EQUAL(k->synchronize(acc), KILN_OK);
    /* a failed wait is a faulted kernel: the context is lost (sticky) */
    env_set("KILN_FAKE_CUDA_FAIL", "cudaStreamSynchronize");
    CU_ASSERT_EQUAL(k->synchronize(acc), KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "unspecified launch failure");
    HAS(kiln_test_error(g_th), "the CUDA context is lost");
    k->free(acc, d);
    g_ops->base.destroy(acc);
    env_clear();
    NO_VIOLATIONS();
}

/* The fused 1.3 entries do the work in the launches promised: the bias
 * epilogue alone without an activation; the bias epilogue and one kernel
 * with one (GELU too: cuBLASLt's GELU epilogue is not kiln's GELU), plus
 * the input's cast to bf16. The plan cache keys the bias pointer's own
 * alignment. unscale_check: one launch per 48 tensors and one
 * synchronisation. */
static void test_fused_launches(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    CU_ASSERT_FATAL(k->struct_size >= KILN_KERNELS_SIZE_1_3 && k->linear_forward && k->unscale_check);
    enum { R = 16, I = 24, O = 32 };
    float hx[R * I], hw[O * I], hb[O], y[R * O], post[R * O], yc[R * O], pc[R * O];
    uint16_t hw16[O * I];
    for (int i = 0; i < R * I; i++) hx[i] = round_bf16(val((unsigned)i, 21));
    for (int i = 0; i < O * I; i++) hw[i] = round_bf16(val((unsigned)i, 22)), hw16[i] = bf16_bits(hw[i]);
    for (int i = 0; i < O; i++) hb[i] = val((unsigned)i, 23);
    float *dx = up(k, acc, hx, sizeof hx), *dw = up(k, acc, hw, sizeof hw), *db = up(k, acc, hb, sizeof hb);
    void *dw16 = up(k, acc, hw16, sizeof hw16);
    float *dy = up(k, acc, NULL, sizeof y), *dp = up(k, acc, NULL, sizeof post);
    CU_ASSERT_FATAL(dx && dw && db && dw16 && dy && dp);
    /* the reference: the cpu kernels' formulas, one rounding after the bias */
    for (int r = 0; r < R; r++)
        for (int o = 0; o < O; o++) {
            double s = 0;
            for (int i = 0; i < I; i++) s += (double)hx[r * I + i] * hw[o * I + i];
            yc[r * O + o] = (float)s + hb[o];
        }
    struct {
        int out, act;
        uint32_t wt, rt;
        unsigned long matmuls, kernels;
    } cases[] = {
        {O, KILN_ACT_GELU, KILN_DTYPE_F32, KILN_DTYPE_F32, 1, 1},      /* BIAS + kiln's GELU kernel */
        {O - 2, KILN_ACT_GELU, KILN_DTYPE_F32, KILN_DTYPE_F32, 1, 1},  /* the same, out not a multiple of 8 */
        {O, KILN_ACT_RELU, KILN_DTYPE_F32, KILN_DTYPE_F32, 1, 1},      /* BIAS + kernel */
        {O, -1, KILN_DTYPE_F32, KILN_DTYPE_F32, 1, 0},                 /* BIAS alone */
        {O, KILN_ACT_GELU, KILN_DTYPE_BF16, KILN_DTYPE_BF16, 1, 2},    /* x to bf16, BIAS, kernel */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int out = cases[c].out, act = cases[c].act;
        const fake_cuda_stats s0 = stats();
        CU_ASSERT_EQUAL(k->linear_forward(acc, KILN_DTYPE_F32, dx, cases[c].wt == KILN_DTYPE_F32 ? (void *)dw : dw16,
                                          cases[c].wt, db, R, I, out, act, dy, act >= 0 ? dp : NULL, cases[c].rt),
                        KILN_OK);
        const fake_cuda_stats s1 = stats();
        CU_ASSERT_EQUAL(s1.matmuls - s0.matmuls, cases[c].matmuls);
        CU_ASSERT_EQUAL(s1.kernels - s0.kernels, cases[c].kernels);
        CU_ASSERT_TRUE(down(k, acc, y, dy, sizeof(float) * R * out));
        if (act >= 0) CU_ASSERT_TRUE(down(k, acc, post, dp, sizeof(float) * R * out));
        int bad = 0;
        for (int r = 0; r < R; r++)
            for (int o = 0; o < out; o++) {
                float want = yc[r * O + o];
                if (cases[c].rt == KILN_DTYPE_BF16) want = round_bf16(want);
                bad += fabsf(y[r * out + o] - want) > 1e-6f * (1 + fabsf(want));
                float pw = act == KILN_ACT_RELU ? (want > 0 ? want : 0.0f) : act == KILN_ACT_GELU
                           ? (float)(0.5 * want * (1 + tanh(0.7978845608 * (want + 0.044715 * want * want * want))))
                           : 0.0f;
                if (cases[c].rt == KILN_DTYPE_BF16) pw = round_bf16(pw);
                if (act >= 0) bad += fabsf(post[r * out + o] - pw) > 1e-5f * (1 + fabsf(pw)) + (cases[c].rt == KILN_DTYPE_BF16 ? 0.01f * fabsf(pw) : 0.0f);
            }
        CU_ASSERT_EQUAL(bad, 0);
        if (bad) fprintf(stderr, "  linear_forward case %zu: %d values off\n", c, bad);
    }
    /* The plan cache and the bias's alignment: the heuristic sees the bias
     * pointer itself, so a plan chosen with a 256-byte aligned bias (and a
     * 4-byte aligned x) must not serve a 4-byte aligned bias (with an
     * aligned x), though the smallest alignment of all five is 4 both
     * times. The fake's algorithm remembers the bias alignment it saw. */
    float *dbx = up(k, acc, NULL, sizeof hb + 256), *dxx = up(k, acc, NULL, sizeof hx + 256);
    CU_ASSERT_FATAL(dbx && dxx);
    CU_ASSERT_EQUAL(k->copy(acc, dbx + 1, hb, sizeof hb, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->copy(acc, dxx + 1, hx, sizeof hx, KILN_COPY_H2D), KILN_OK);
    const unsigned long v0 = stats().violations;
    CU_ASSERT_EQUAL(k->linear_forward(acc, KILN_DTYPE_F32, dxx + 1, dw, KILN_DTYPE_F32, db, R - 1, I, O, -1, dy, NULL,
                                      KILN_DTYPE_F32),
                    KILN_OK);
    CU_ASSERT_EQUAL(k->linear_forward(acc, KILN_DTYPE_F32, dx, dw, KILN_DTYPE_F32, dbx + 1, R - 1, I, O, -1, dy, NULL,
                                      KILN_DTYPE_F32),
                    KILN_OK);
    CU_ASSERT_EQUAL(stats().violations, v0);
    CU_ASSERT_TRUE(down(k, acc, pc, dy, sizeof(float) * (R - 1) * O));
    int bad = 0;
    for (int i = 0; i < (R - 1) * O; i++) bad += fabsf(pc[i] - yc[i]) > 1e-6f * (1 + fabsf(yc[i]));
    CU_ASSERT_EQUAL(bad, 0);
    k->free(acc, dbx), k->free(acc, dxx);

    /* unscale_check: 50 tensors of 8 floats in one buffer, two launches,
     * one synchronisation */
    float *dg = up(k, acc, NULL, 50 * 8 * sizeof(float));
    CU_ASSERT_FATAL(dg != NULL);
    void *ptr[50];
    size_t n[50];
    for (int t = 0; t < 50; t++) ptr[t] = dg + 8 * t, n[t] = 8;
    int32_t fin = -1;
    const fake_cuda_stats u0 = stats();
    CU_ASSERT_EQUAL(k->unscale_check(acc, KILN_DTYPE_F32, ptr, n, 50, 0.5, &fin), KILN_OK);
    const fake_cuda_stats u1 = stats();
    CU_ASSERT_EQUAL(fin, 1);
    CU_ASSERT_EQUAL(u1.kernels - u0.kernels, 2);
    CU_ASSERT_EQUAL(u1.syncs - u0.syncs, 1);
    /* an empty list: finite */
    CU_ASSERT_EQUAL(k->unscale_check(acc, KILN_DTYPE_F32, ptr, n, 0, 0.5, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 1);
    k->free(acc, dx), k->free(acc, dw), k->free(acc, db), k->free(acc, dw16), k->free(acc, dy), k->free(acc, dp);
    k->free(acc, dg);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* A run's worth of calls, then destroy(): everything returned. */
static void test_destroy_releases_all(void) {
    const fake_cuda_stats before = stats();
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    float h[64];
    int32_t lab[4] = {0, 1, 2, 3};
    for (int i = 0; i < 64; i++) h[i] = val(i, 51);
    float *d = up(k, acc, h, sizeof h), *e = up(k, acc, NULL, sizeof h);
    int32_t *dl = up(k, acc, lab, sizeof lab);
    CU_ASSERT_FATAL(d && e && dl);
    float loss;
    double sq;
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 1, 4, 4, 4, 1.0f, d, 4, d + 16, 4, 0.0f, e, 4), KILN_OK);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, 4, 4, 4, 1.0, d, KILN_DTYPE_F32, 4, d, KILN_DTYPE_F32, 4, 1.0, e,
                               KILN_DTYPE_F32, 4, KILN_DTYPE_F16),
                    KILN_OK);
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, e + 16, d, dl, 4, 4, &loss, NULL), KILN_OK);
    CU_ASSERT_EQUAL(k->sumsq(acc, d, 64, &sq), KILN_OK);
    CU_ASSERT_EQUAL(k->copy(acc, e, d, 32, KILN_COPY_D2D), KILN_OK);
    /* d and e deliberately not freed: destroy() returns them too */
    g_ops->base.destroy(acc);
    check_released(&before);
    NO_VIOLATIONS();
}

/* The loss backward checks the labels as the cpu does: KILN_E_DATA naming
 * the row and the label, nothing launched (the kernel alone would only fill
 * the row with NaN). */
static void test_xent_backward_bad_label(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    float probs[6] = {0.2f, 0.3f, 0.5f, 0.1f, 0.1f, 0.8f};
    int32_t labels[2] = {0, 7};
    float *dp = up(k, acc, probs, sizeof probs), *dg = up(k, acc, NULL, sizeof probs);
    int32_t *dy = up(k, acc, labels, sizeof labels);
    CU_ASSERT_FATAL(dp && dg && dy);
    CU_ASSERT_EQUAL(k->softmax_xent_backward(acc, dg, dp, dy, 2, 3, 1.0f), KILN_E_DATA);
    CU_ASSERT_EQUAL(k->softmax_xent_backward_ex(acc, KILN_DTYPE_F32, dg, dp, dy, 2, 3, 1.0), KILN_E_DATA);
    HAS(kiln_test_error(g_th), "label 7 at batch index 1");
    k->free(acc, dp), k->free(acc, dg), k->free(acc, dy);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* The backward trusts the labels its forward just checked (no read-back, no
 * wait), and only until copy() or zero() writes them: a bad label copied in
 * between is still refused. */
static void test_xent_backward_trusts_forward(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    float logits[6] = {0.2f, 0.3f, 0.5f, 0.1f, 0.1f, 0.8f};
    int32_t good[2] = {0, 2}, bad[2] = {0, 7};
    float *dl = up(k, acc, logits, sizeof logits), *dp = up(k, acc, NULL, sizeof logits);
    float *dg = up(k, acc, NULL, sizeof logits);
    int32_t *dy = up(k, acc, good, sizeof good);
    CU_ASSERT_FATAL(dl && dp && dg && dy);
    float loss = 0;
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, dp, dl, dy, 2, 3, &loss, NULL), KILN_OK);
    fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->softmax_xent_backward(acc, dg, dp, dy, 2, 3, 1.0f), KILN_OK);
    CU_ASSERT_EQUAL(k->softmax_xent_backward(acc, dg, dp, dy, 1, 3, 1.0f), KILN_OK); /* fewer rows: still checked */
    fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.syncs - s0.syncs, 0);
    CU_ASSERT_EQUAL(s1.kernels - s0.kernels, 2);
    /* fewer classes than checked: checked again */
    CU_ASSERT_EQUAL(k->softmax_xent_backward(acc, dg, dp, dy, 2, 2, 1.0f), KILN_E_DATA);
    HAS(kiln_test_error(g_th), "label 2 at batch index 1");
    /* a bad label copied over the checked ones */
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, dp, dl, dy, 2, 3, &loss, NULL), KILN_OK);
    CU_ASSERT_EQUAL(k->copy(acc, dy, bad, sizeof bad, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->softmax_xent_backward(acc, dg, dp, dy, 2, 3, 1.0f), KILN_E_DATA);
    HAS(kiln_test_error(g_th), "label 7 at batch index 1");
    /* zero() forgets them too; zeros are valid labels: checked, accepted */
    CU_ASSERT_EQUAL(k->copy(acc, dy, good, sizeof good, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, dp, dl, dy, 2, 3, &loss, NULL), KILN_OK);
    CU_ASSERT_EQUAL(k->zero(acc, dy, sizeof good), KILN_OK);
    s0 = stats();
    CU_ASSERT_EQUAL(k->softmax_xent_backward(acc, dg, dp, dy, 2, 3, 1.0f), KILN_OK);
    s1 = stats();
    CU_ASSERT_EQUAL(s1.syncs - s0.syncs, 1);
    /* a forward that finds a bad label trusts nothing */
    CU_ASSERT_EQUAL(k->copy(acc, dy, bad, sizeof bad, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->softmax_xent_forward(acc, dp, dl, dy, 2, 3, &loss, NULL), KILN_E_DATA);
    CU_ASSERT_EQUAL(k->softmax_xent_backward(acc, dg, dp, dy, 2, 3, 1.0f), KILN_E_DATA);
    k->free(acc, dl), k->free(acc, dp), k->free(acc, dg), k->free(acc, dy);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* ============================== regressions: bugs this fake found */

/* (gemm_ex rounds a float32 operand through the matmul's 16-bit dtype, as
 * autocast does, and the plugin converts such operands to use the 16-bit
 * matrix units; the exact cases are test_gemm_ex_mixed_bf16's and
 * test_gemm_ex_rounds_f32_operands'.) */

/*
 * cu_configure once set `configured` before cu_mem_init/cu_blas_init, so
 * after one of them failed a second configure() returned KILN_OK at once,
 * leaving an instance without a cuBLASLt handle whose GEMMs failed. Now a
 * failed configure() leaves the instance refusing (KILN_E_STATE); a working
 * instance after an OK would also pass.
 */
static void test_configure_retry_after_failure(void) {
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL_FATAL(make(NULL, &acc), KILN_OK);
    const kiln_kernels *k = g_ops->kernels(acc);
    env_set("KILN_FAKE_CUDA_FAIL", "cublasLtCreate");
    CU_ASSERT_EQUAL(g_ops->configure(acc, 0, 0), KILN_E_CUDA);
    env_clear();
    const int32_t rc = g_ops->configure(acc, 0, 0);
    CU_ASSERT(rc == KILN_OK || rc == KILN_E_STATE);
    if (rc == KILN_OK) {
        /* then it must work */
        float h[4] = {1, 2, 3, 4};
        float *d = up(k, acc, h, sizeof h);
        CU_ASSERT_PTR_NOT_NULL_FATAL(d);
        const int32_t g = k->gemm(acc, 0, 0, 1, 1, 1, 1.0f, d, 1, d + 1, 1, 0.0f, d + 2, 1);
        if (g != KILN_OK) fprintf(stderr, "  configure() said OK after a failed one, then gemm: %s\n", kiln_test_error(g_th));
        CU_ASSERT_EQUAL(g, KILN_OK);
        k->free(acc, d);
    }
    g_ops->base.destroy(acc);
}

/*
 * cu_trim once returned on a failed cudaFree before updating the table's
 * length, so the table kept freed pointers and duplicates of live ones:
 * [red, ws, A cached, B in use, C cached] became [red, ws, B, B, C] with A
 * already freed, and destroy() then cudaFree()d B twice.
 */
static void test_trim_partial_failure(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const size_t mib = (size_t)1 << 20;
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, 2 * mib, &a), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, 2 * mib, &b), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, 2 * mib, &c), KILN_OK);
    k->free(acc, a);
    k->free(acc, c);
    /* a 16 MiB block needs the trim; the trim's second cudaFree fails */
    env_set_size("KILN_FAKE_CUDA_OOM_AFTER", stats().live_bytes + 15 * mib);
    env_set("KILN_FAKE_CUDA_FAIL", "cudaFree@2");
    env_set("KILN_FAKE_CUDA_QUIET", "1");
    CU_ASSERT_NOT_EQUAL(k->alloc(acc, 16 * mib, &d), KILN_OK);
    env_clear();
    env_set("KILN_FAKE_CUDA_QUIET", "1");
    k->free(acc, b);
    g_ops->base.destroy(acc);
    const fake_cuda_stats s = stats();
    if (s.violations != g_violations0) fprintf(stderr, "  after a failed trim: %s\n", s.last_violation);
    CU_ASSERT_EQUAL(s.violations, g_violations0);
}

/*
 * The entries once never made the instance's device current (only
 * configure() and destroy() called cudaSetDevice), so with two instances on
 * devices 0 and 1 in one process (or a call from another thread) memory
 * went to the wrong device and kernels to another device's stream. Case:
 * 2 devices, instance A on device 0, instance B on device 1, then
 * A->alloc + A->scale.
 */
static void test_device_made_current(void) {
    static const kiln_kv dev1[] = {{"device", KILN_V_INT(1)}, {NULL, KILN_V_NONE}};
    env_set("KILN_FAKE_CUDA_DEVICES", "2");
    const kiln_kernels *k = NULL;
    kiln_instance *a = ready(NULL, &k);
    kiln_instance *b = ready(dev1, &k);
    if (!a || !b) return;
    float h[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
    float *d = up(k, a, h, sizeof h);
    CU_ASSERT_PTR_NOT_NULL(d);
    if (d) {
        const int32_t rc = k->scale(a, d, 2.0f, 8);
        if (rc != KILN_OK) fprintf(stderr, "  instance on device 0 after one on device 1: %s\n", kiln_test_error(g_th));
        CU_ASSERT_EQUAL(rc, KILN_OK);
        CU_ASSERT_TRUE(down(k, a, out, d, sizeof out));
        CU_ASSERT_EQUAL(out[7], 16.0f);
        k->free(a, d);
    }
    g_ops->base.destroy(b);
    g_ops->base.destroy(a);
    NO_VIOLATIONS();
}

/* destroy() right after a GEMM, with nothing waited for: the stream is
 * synchronised before the cuBLASLt handle goes (the fake's
 * cublasLtDestroy reports a GEMM still queued on an unsynchronised
 * stream). */
static void test_destroy_after_unwaited_gemm(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    float h[64];
    for (int i = 0; i < 64; i++) h[i] = val((unsigned)i, 31);
    float *d = up(k, acc, h, sizeof h);
    CU_ASSERT_FATAL(d != NULL);
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 4, 4, 4, 1.0f, d, 4, d + 16, 4, 0.0f, d + 32, 4), KILN_OK);
    k->free(acc, d);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* alloc() zero-fills (the table's promise); scratch that grows inside an
 * entry (gemm_ex's rounded product, bias_grad's partials) does not: no
 * memset beyond what the entry itself needs. */
static void test_scratch_not_zeroed(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    enum { M = 64, N = 64, K = 32, ROWS = 1000, COLS = 48 };
    static float ha[M * K], hb[K * N], hdy[ROWS * COLS];
    for (int i = 0; i < M * K; i++) ha[i] = val((unsigned)i, 41);
    for (int i = 0; i < K * N; i++) hb[i] = val((unsigned)i, 42);
    for (int i = 0; i < ROWS * COLS; i++) hdy[i] = val((unsigned)i, 43);
    float *da = up(k, acc, ha, sizeof ha), *dbm = up(k, acc, hb, sizeof hb), *dc = up(k, acc, NULL, M * N * 4);
    float *ddy = up(k, acc, hdy, sizeof hdy), *ddb = up(k, acc, NULL, COLS * 4);
    CU_ASSERT_FATAL(da && dbm && dc && ddy && ddb);
    fake_cuda_stats s0 = stats();
    void *p = NULL;
    CU_ASSERT_EQUAL(k->alloc(acc, 4096, &p), KILN_OK);
    CU_ASSERT_EQUAL(stats().memsets - s0.memsets, 1);
    k->free(acc, p);
    /* gemm_ex rounding through bf16 with beta != 0 forms its product in
     * scratch */
    s0 = stats();
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, M, N, K, 1.0, da, KILN_DTYPE_F32, K, dbm, KILN_DTYPE_F32, N, 1.0, dc,
                               KILN_DTYPE_F32, N, KILN_DTYPE_BF16),
                    KILN_OK);
    fake_cuda_stats s1 = stats();
    CU_ASSERT(s1.mallocs > s0.mallocs); /* the scratch grew */
    CU_ASSERT_EQUAL(s1.memsets - s0.memsets, 0);
    /* bias_grad over 1000 rows: 4 parts of partials in scratch */
    s0 = stats();
    CU_ASSERT_EQUAL(k->bias_grad(acc, ddb, ddy, ROWS, COLS, 0), KILN_OK);
    s1 = stats();
    CU_ASSERT_EQUAL(s1.memsets - s0.memsets, 0);
    CU_ASSERT_EQUAL(s1.kernels - s0.kernels, 2); /* the two passes */
    float db[COLS];
    CU_ASSERT_TRUE(down(k, acc, db, ddb, sizeof db));
    int bad = 0;
    for (int j = 0; j < COLS; j++) {
        double want = 0, mag = 0;
        for (int r = 0; r < ROWS; r++) want += hdy[r * COLS + j], mag += fabsf(hdy[r * COLS + j]);
        bad += fabs(db[j] - want) > 2.0 * (ROWS + 4) * 0x1p-24 * mag;
    }
    CU_ASSERT_EQUAL(bad, 0);
    k->free(acc, da), k->free(acc, dbm), k->free(acc, dc), k->free(acc, ddy), k->free(acc, ddb);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* ============================================================ suites */

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_pSuite s = CU_add_suite_with_setup_and_teardown("cuda plugin on fake CUDA", suite_init, suite_clean,
                                                       test_setup, test_teardown);
    if (!s) return;
    CU_add_test(s, "create: no driver", test_create_no_driver);
    CU_add_test(s, "create: driver older than the runtime", test_create_old_driver);
    CU_add_test(s, "create: driver of an older minor release", test_create_minor_driver);
    CU_add_test(s, "create: no device", test_create_no_device);
    CU_add_test(s, "create: bad settings", test_create_bad_settings);
    CU_add_test(s, "configure: before use, again, moving", test_configure);
    CU_add_test(s, "configure: device 5 of 1 and of 2", test_configure_missing_device);
    CU_add_test(s, "configure: Slurm's per-task GPUs", test_configure_slurm_bound);
    CU_add_test(s, "configure: failing setup is released", test_configure_failure_releases);
    CU_add_test(s, "a kernel fault: the context lost, later entries refused", test_context_lost);
    CU_add_test(s, "allocator: reuse, zero fill, best fit", test_alloc_reuse);
    CU_add_test(s, "allocator: caching = false, exact cudaMalloc and cudaFree", test_alloc_no_caching);
    CU_add_test(s, "allocator: out of memory, trim and retry", test_alloc_oom);
    CU_add_test(s, "copy: H2D through the staging ring", test_staging);
    CU_add_test(s, "copy: a failed event record does not free its slot early", test_staging_record_fails);
    CU_add_test(s, "copy: overlapping D2D is memmove; zero", test_copy_overlap);
    CU_add_test(s, "1.3: linear_forward epilogues, unscale_check launches", test_fused_launches);
    CU_add_test(s, "loss backward trusts its forward's label check until written", test_xent_backward_trusts_forward);
    CU_add_test(s, "loss and reductions read back", test_loss_and_reductions);
    CU_add_test(s, "1.9: sumsq_many = sumsq_ex per tensor, with one wait", test_sumsq_many);
    CU_add_test(s, "1.10: adamw_update_many = adamw_update_ex per tensor, in a launch per 48", test_adamw_many);
    CU_add_test(s, "1.10: add_layernorm_forward = add then layernorm_forward, in one launch", test_add_ln);
    CU_add_test(s, "1.11: act_bias_backward and layernorm_backward_cast, one launch each", test_bwd_fuse);
    CU_add_test(s, "failing CUDA/cuBLAS calls become messages", test_failing_calls);
    CU_add_test(s, "softmax_xent_backward refuses a bad label", test_xent_backward_bad_label);
    CU_add_test(s, "destroy returns everything", test_destroy_releases_all);
    CU_add_test(s, "configure: refused again after a failed one", test_configure_retry_after_failure);
    CU_add_test(s, "allocator: a failed trim keeps the block table", test_trim_partial_failure);
    CU_add_test(s, "entries make the instance's device current", test_device_made_current);
    CU_add_test(s, "destroy waits for queued GEMMs before the cuBLASLt handle", test_destroy_after_unwaited_gemm);
    CU_add_test(s, "scratch grown inside entries is not zero-filled", test_scratch_not_zeroed);
    cuda_fake_gemm_tests(s);
    cuda_fake_seq_tests(s);
    cuda_fake_seal_tests(s);
}

#include "cunit_main.h"
