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
 * row-major to column-major GEMM mapping for every transpose and leading
 * dimension, K = 0, TF32, misaligned operands and the plan cache; gemm_ex's
 * operand conversions and rounded epilogue (mixed float32/bfloat16 with
 * beta = 1 and ldc > N, NaN in C with beta = 0) against an exact
 * reference; the loss and reductions read back; failing CUDA/cuBLAS calls
 * turned into messages; and that destroy() returns every device block,
 * pinned buffer, stream, event and cuBLASLt object. The fake counts what
 * the plugin asked of "the GPU" (fake_cuda_get_stats) and flags contract
 * violations (a pointer outside device memory, an overlapping
 * cudaMemcpyAsync, an algorithm used with the wrong alignment, a double
 * cudaFree...); every test checks that none happened unless it expects one.
 * The last three tests are regressions for plugin bugs this fake found (a
 * configure() that said OK after a failed one, a failed trim corrupting the
 * block table, entries not making their device current). ABI 1.7's 16-bit
 * activation storage has its own test: each of the eight entries that take
 * it, in bfloat16 and float16 (attention on the gemm, flash and rowwise
 * paths), against the same table's float32 call on the widened inputs with
 * its 16-bit outputs rounded, bit for bit, and the refusals of a
 * round_dtype other than the storage, a mismatched w_dtype, an add whose y
 * covers its 16-bit b, and an lse whose float32 bytes reach out.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "act16_cases.h"
#include "fake_cuda.h"
#include "half_bits.h"
#include <kiln/testing.h>

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

static const kiln_plugin_desc *g_desc;
static const kiln_accelerator_ops *g_ops;
static fake_cuda_get_stats_fn g_stats_fn;

static fake_cuda_stats stats(void) {
    fake_cuda_stats s;
    memset(&s, 0, sizeof s);
    if (g_stats_fn) g_stats_fn(&s);
    return s;
}

static const char *const fake_env_vars[] = {"KILN_FAKE_CUDA_DEVICES", "KILN_FAKE_CUDA_DRIVER",
                                            "KILN_FAKE_CUDA_OOM_AFTER", "KILN_FAKE_CUDA_FAIL",
                                            "KILN_FAKE_CUDA_QUIET", "CUDA_VISIBLE_DEVICES"};

static void env_clear(void) {
    for (size_t i = 0; i < sizeof fake_env_vars / sizeof fake_env_vars[0]; i++) unsetenv(fake_env_vars[i]);
}

static void env_set(const char *name, const char *value) { setenv(name, value, 1); }

static void env_set_size(const char *name, size_t v) {
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
    dlclose(h); /* drops the reference RTLD_NOLOAD took; mh_load's stays */
    if (!g_stats_fn) {
        fprintf(stderr, "test_cuda_fake: %s does not export %s (not the fake build?)\n", path, FAKE_CUDA_GET_STATS);
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
static unsigned long g_violations0;
static void test_setup(void) {
    env_clear();
    kiln_test_clear_error(g_th);
    g_violations0 = stats().violations;
}
static void test_teardown(void) { env_clear(); }

#define NO_VIOLATIONS()                                                                            \
    do {                                                                                           \
        fake_cuda_stats s_ = stats();                                                              \
        if (s_.violations != g_violations0)                                                        \
            fprintf(stderr, "  %lu violation(s), last: %s\n", s_.violations - g_violations0,       \
                    s_.last_violation);                                                            \
        CU_ASSERT_EQUAL(s_.violations, g_violations0);                                             \
    } while (0)

#define HAS(msg, part)                                                                              \
    do {                                                                                            \
        const int has_ = strstr((msg), (part)) != NULL;                                             \
        if (!has_) fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", (msg), (part));               \
        CU_ASSERT_TRUE(has_);                                                                       \
    } while (0)

/* ------------------------------------------------------------- helpers */

static int32_t make(const kiln_kv *cfg, kiln_instance **acc) {
    kiln_test_clear_error(g_th);
    *acc = NULL;
    return g_ops->base.create(g_desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, acc);
}

/* A created and configured instance (device 0), or NULL after a failed
 * assertion. */
static kiln_instance *ready(const kiln_kv *cfg, const kiln_kernels **k) {
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
static void *up(const kiln_kernels *k, kiln_instance *acc, const void *host, size_t bytes) {
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
static int down(const kiln_kernels *k, kiln_instance *acc, void *host, const void *dev, size_t bytes) {
    if (k->synchronize(acc) != KILN_OK || k->copy(acc, host, dev, bytes, KILN_COPY_D2H) != KILN_OK) {
        fprintf(stderr, "  read back: %s\n", kiln_test_error(g_th));
        return 0;
    }
    return 1;
}

/* Deterministic values in [-1, 1). */
static float val(unsigned i, unsigned salt) {
    uint32_t x = (i + 1u) * 2654435761u ^ (salt * 40503u + 0x9E37u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return (float)((double)(x & 0xFFFFFF) / (double)0x800000 - 1.0);
}

/* float32 -> bfloat16 bits, round to nearest even (NaN kept quiet). */
static uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float round_bf16(float x) { return hb_bf16_value(bf16_bits(x)); }

/* The last destroy must leave nothing behind: device blocks, pinned
 * buffers, streams, events and cuBLASLt objects back to `before`. */
static void check_released(const fake_cuda_stats *before) {
    const fake_cuda_stats a = stats();
    CU_ASSERT_EQUAL(a.live_blocks, before->live_blocks);
    CU_ASSERT_EQUAL(a.live_bytes, before->live_bytes);
    CU_ASSERT_EQUAL(a.live_host_blocks, before->live_host_blocks);
    CU_ASSERT_EQUAL(a.streams_live, before->streams_live);
    CU_ASSERT_EQUAL(a.events_live, before->events_live);
    CU_ASSERT_EQUAL(a.lt_handles_live, before->lt_handles_live);
    CU_ASSERT_EQUAL(a.lt_objects_live, before->lt_objects_live);
}

static const kiln_kv cfg_none[] = {{NULL, KILN_V_NONE}};

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

/* ========================================================= allocator */

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
        unsigned char back[1000];
        memset(back, 0x55, sizeof back);
        CU_ASSERT_TRUE(down(k, acc, back, q, sizeof back));
        size_t nonzero = 0;
        for (size_t i = 0; i < sizeof back; i++) nonzero += back[i] != 0;
        CU_ASSERT_EQUAL(nonzero, 0);
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

/* ============================================================= GEMMs */

/* C(M,N; ldc) = alpha op(A) op(B) + beta C, row-major, in double. */
static void ref_gemm(int ta, int tb, int M, int N, int K, double alpha, const float *A, int lda, const float *B,
                     int ldb, double beta, const float *C, int ldc, double *out) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int p = 0; p < K; p++) {
                const double a = ta ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
                const double b = tb ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
                acc += a * b;
            }
            out[(size_t)i * ldc + j] = alpha * acc + (beta != 0.0 ? beta * C[(size_t)i * ldc + j] : 0.0);
        }
}

static void test_gemm_mapping(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const int M = 5, N = 7, K = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int pad = 0; pad < 2; pad++) {
                const int lda = (ta ? M : K) + 2 * pad, ldb = (tb ? K : N) + 3 * pad, ldc = N + pad;
                const int arows = ta ? K : M, brows = tb ? N : K;
                float A[64], B[64], C[64], out[64];
                double want[64];
                for (int i = 0; i < 64; i++) A[i] = val(i, 1), B[i] = val(i, 2), C[i] = val(i, 3);
                const size_t na = (size_t)arows * lda, nb = (size_t)brows * ldb, nc = (size_t)M * ldc;
                float *dA = up(k, acc, A, na * 4), *dB = up(k, acc, B, nb * 4), *dC = up(k, acc, C, nc * 4);
                CU_ASSERT_FATAL(dA && dB && dC);
                int32_t rc = k->gemm(acc, ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, 0.25f, dC, ldc);
                CU_ASSERT_EQUAL(rc, KILN_OK);
                if (rc != KILN_OK) fprintf(stderr, "  gemm ta=%d tb=%d pad=%d: %s\n", ta, tb, pad, kiln_test_error(g_th));
                CU_ASSERT_TRUE(down(k, acc, out, dC, nc * 4));
                ref_gemm(ta, tb, M, N, K, 0.5, A, lda, B, ldb, 0.25, C, ldc, want);
                int bad = 0;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < ldc; j++) {
                        const size_t x = (size_t)i * ldc + j;
                        /* the padding of C is never touched */
                        if (j >= N) bad += out[x] != C[x];
                        else bad += fabs(out[x] - want[x]) > 1e-6 * (1.0 + fabs(want[x]));
                    }
                CU_ASSERT_EQUAL(bad, 0);
                if (bad) fprintf(stderr, "  gemm ta=%d tb=%d pad=%d: %d wrong\n", ta, tb, pad, bad);
                k->free(acc, dA), k->free(acc, dB), k->free(acc, dC);
            }
    /* leading dimensions are checked row-major */
    float *d = NULL;
    CU_ASSERT_EQUAL(k->alloc(acc, 4096, (void **)&d), KILN_OK);
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, M, N, K, 1.0f, d, K - 1, d, N, 0.0f, d, N), KILN_E_INVALID_ARG);
    HAS(kiln_test_error(g_th), "lda");
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 1, M, N, K, 1.0f, d, K, d, K - 1, 0.0f, d, N), KILN_E_INVALID_ARG);
    HAS(kiln_test_error(g_th), "ldb");
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, M, N, K, 1.0f, d, K, d, N, 0.0f, d, N - 1), KILN_E_INVALID_ARG);
    HAS(kiln_test_error(g_th), "ldc");
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, -1, N, K, 1.0f, d, K, d, N, 0.0f, d, N), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 0, N, K, 1.0f, NULL, K, NULL, N, 0.0f, NULL, N), KILN_OK);
    k->free(acc, d);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* K == 0: C = beta * C (no cuBLASLt call), beta == 0 clears NaN; the padding
 * of C stays. */
static void test_gemm_k0(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const int M = 3, N = 4, ldc = 6;
    float C[18], out[18];
    for (int i = 0; i < 18; i++) C[i] = (i % 5 == 0) ? NAN : (float)i;
    float *dC = up(k, acc, C, sizeof C);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dC);
    const unsigned long matmuls = stats().matmuls;
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, M, N, 0, 1.0f, NULL, 1, NULL, N, 0.0f, dC, ldc), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
    int bad = 0;
    for (int i = 0; i < 18; i++) {
        const int in = i % ldc < N;
        bad += in ? out[i] != 0.0f : !(out[i] == C[i] || (isnan(out[i]) && isnan(C[i])));
    }
    CU_ASSERT_EQUAL(bad, 0);
    for (int i = 0; i < 18; i++) C[i] = (float)(i + 1);
    CU_ASSERT_EQUAL(k->copy(acc, dC, C, sizeof C, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->gemm(acc, 1, 1, M, N, 0, 1.0f, NULL, M, NULL, 1, 0.5f, dC, ldc), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
    bad = 0;
    for (int i = 0; i < 18; i++) bad += out[i] != (i % ldc < N ? 0.5f * C[i] : C[i]);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(stats().matmuls, matmuls);
    k->free(acc, dC);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* tf32 = true runs float32 GEMMs with TF32 inputs (10 mantissa bits): 1 +
 * 2^-20 becomes 1. 16-bit operands never take the TF32 path. */
static void test_gemm_tf32(void) {
    static const kiln_kv tf[] = {{"tf32", KILN_V_BOOL(1)}, {NULL, KILN_V_NONE}};
    for (int t = 0; t < 2; t++) {
        const kiln_kernels *k = NULL;
        kiln_instance *acc = ready(t ? tf : NULL, &k);
        if (!acc) return;
        const float a = 1.0f + 0x1p-20f, b = 1.0f;
        float out = 0.0f;
        float *dA = up(k, acc, &a, 4), *dB = up(k, acc, &b, 4), *dC = up(k, acc, NULL, 4);
        CU_ASSERT_FATAL(dA && dB && dC);
        CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 1, 1, 1, 1.0f, dA, 1, dB, 1, 0.0f, dC, 1), KILN_OK);
        CU_ASSERT_TRUE(down(k, acc, &out, dC, 4));
        CU_ASSERT_EQUAL(out, t ? 1.0f : a);
        uint16_t h = 0x3C00; /* 1.0 in fp16 */
        uint16_t *dH = up(k, acc, &h, 2);
        CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, 1, 1, 1, 1.0, dH, KILN_DTYPE_F16, 1, dH, KILN_DTYPE_F16, 1, 0.0, dC,
                                   KILN_DTYPE_F32, 1, KILN_DTYPE_F32),
                        KILN_OK);
        CU_ASSERT_TRUE(down(k, acc, &out, dC, 4));
        CU_ASSERT_EQUAL(out, 1.0f);
        k->free(acc, dA), k->free(acc, dB), k->free(acc, dC), k->free(acc, dH);
        g_ops->base.destroy(acc);
    }
    NO_VIOLATIONS();
}

/* Operands that are views at odd offsets: the plan's alignment follows the
 * pointers (a plan chosen for 256-byte operands refuses 4-byte ones). */
static void test_gemm_alignment_and_plans(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    static float h[1024];
    float out[64];
    double want[64];
    for (int i = 0; i < 1024; i++) h[i] = val(i, 9);
    float *d = up(k, acc, h, sizeof h), *dC = up(k, acc, NULL, sizeof out);
    CU_ASSERT_FATAL(d && dC);
    const fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 4, 4, 4, 1.0f, d, 4, d + 64, 4, 0.0f, dC, 4), KILN_OK);
    for (int off = 1; off < 4; off++) {
        CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 4, 4, 4, 1.0f, d + off, 4, d + 64, 4, 0.0f, dC, 4), KILN_OK);
        CU_ASSERT_TRUE(down(k, acc, out, dC, 16 * 4));
        ref_gemm(0, 0, 4, 4, 4, 1.0, h + off, 4, h + 64, 4, 0.0, out, 4, want);
        int bad = 0;
        for (int i = 0; i < 16; i++) bad += fabs(out[i] - want[i]) > 1e-6;
        CU_ASSERT_EQUAL(bad, 0);
    }
    /* the same shape and alignment again: a cached plan, no heuristic */
    const unsigned long heur = stats().heuristics;
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 4, 4, 4, 1.0f, d, 4, d + 64, 4, 0.0f, dC, 4), KILN_OK);
    CU_ASSERT_EQUAL(stats().heuristics, heur);
    CU_ASSERT(heur >= s0.heuristics + 2);
    /* more shapes than the cache holds (64): old plans are evicted and
     * destroyed, the first shape is planned again and still right */
    for (int n = 1; n <= 70; n++) {
        const int cols = n % 8 + 1; /* B(n, cols) fits in the 1024 floats */
        CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 1, cols, n, 1.0f, d, n, d, cols, 0.0f, dC, cols), KILN_OK);
    }
    CU_ASSERT(stats().lt_objects_live <= s0.lt_objects_live + 64 * 4 + 4);
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 4, 4, 4, 1.0f, d, 4, d + 64, 4, 0.0f, dC, 4), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, 16 * 4));
    ref_gemm(0, 0, 4, 4, 4, 1.0, h, 4, h + 64, 4, 0.0, out, 4, want);
    int bad = 0;
    for (int i = 0; i < 16; i++) bad += fabs(out[i] - want[i]) > 1e-6;
    CU_ASSERT_EQUAL(bad, 0);
    k->free(acc, d), k->free(acc, dC);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* No cuBLASLt workspace at all (workspace_mib = 0) still multiplies. */
static void test_gemm_no_workspace(void) {
    static const kiln_kv ws0[] = {{"workspace_mib", KILN_V_INT(0)}, {NULL, KILN_V_NONE}};
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(ws0, &k);
    if (!acc) return;
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 0, 1, 1, 1}, out[4];
    float *dA = up(k, acc, A, sizeof A), *dB = up(k, acc, B, sizeof B), *dC = up(k, acc, NULL, sizeof out);
    CU_ASSERT_FATAL(dA && dB && dC);
    /* (2x3) (3x2) */
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 2, 2, 3, 1.0f, dA, 3, dB, 2, 0.0f, dC, 2), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
    CU_ASSERT(out[0] == 4.0f && out[1] == 5.0f && out[2] == 10.0f && out[3] == 11.0f);
    k->free(acc, dA), k->free(acc, dB), k->free(acc, dC);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* gemm_ex, float32 A (values bfloat16 can hold, as mixed precision passes
 * them) with bfloat16 B and the other way round, round_dtype bfloat16:
 * C = bf16(fp32(alpha op(A) op(B))) + beta C with beta = 1 and ldc > N, the
 * padding untouched; then beta = 0 over NaN, with ldc > N and ldc == N.
 * Every call has cuBLASLt write the product in bfloat16 (its rounding) and
 * one pass widen it into C. Exact: the reference takes the same exact
 * products and sums them in the same order. */
static void test_gemm_ex_mixed_bf16(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const int M = 6, N = 5, K = 9;
    for (int variant = 0; variant < 4; variant++) {
        const int a_is_f32 = variant < 2, ta = variant & 1, tb = !(variant & 1);
        const int lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 3;
        const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
        float af[128], bf[128], C[64], out[64], want[64];
        uint16_t a16[128], b16[128];
        for (size_t i = 0; i < 128; i++) {
            /* bfloat16-representable values for the float32 operand */
            af[i] = round_bf16(val((unsigned)i, 11) * 3.0f);
            bf[i] = round_bf16(val((unsigned)i, 12) * 2.0f);
            a16[i] = bf16_bits(af[i]);
            b16[i] = bf16_bits(bf[i]);
        }
        for (size_t i = 0; i < nc; i++) C[i] = val((unsigned)i, 13);
        const void *hA = a_is_f32 ? (const void *)af : (const void *)a16;
        const void *hB = a_is_f32 ? (const void *)b16 : (const void *)bf;
        const uint32_t at = a_is_f32 ? KILN_DTYPE_F32 : KILN_DTYPE_BF16;
        const uint32_t bt = a_is_f32 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
        void *dA = up(k, acc, hA, na * kiln_dtype_size(at)), *dB = up(k, acc, hB, nb * kiln_dtype_size(bt));
        float *dC = up(k, acc, C, nc * 4);
        CU_ASSERT_FATAL(dA && dB && dC);
        const double alpha = 0.75;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < ldc; j++) {
                const size_t x = (size_t)i * ldc + j;
                if (j >= N) {
                    want[x] = C[x];
                    continue;
                }
                double s = 0.0;
                for (int p = 0; p < K; p++) {
                    const double a = ta ? af[(size_t)p * lda + i] : af[(size_t)i * lda + p];
                    const double b = tb ? bf[(size_t)j * ldb + p] : bf[(size_t)p * ldb + j];
                    s += a * b;
                }
                want[x] = round_bf16((float)(alpha * s)) + 1.0f * C[x];
            }
        const fake_cuda_stats s0 = stats();
        int32_t rc = k->gemm_ex(acc, ta, tb, M, N, K, alpha, dA, at, lda, dB, bt, ldb, 1.0, dC, KILN_DTYPE_F32, ldc,
                                KILN_DTYPE_BF16);
        CU_ASSERT_EQUAL(rc, KILN_OK);
        CU_ASSERT_EQUAL(stats().round_add_16bit - s0.round_add_16bit, 1); /* a bf16 product, widened */
        if (rc != KILN_OK) fprintf(stderr, "  gemm_ex variant %d: %s\n", variant, kiln_test_error(g_th));
        CU_ASSERT_TRUE(down(k, acc, out, dC, nc * 4));
        int bad = 0;
        for (size_t i = 0; i < nc; i++) bad += out[i] != want[i];
        CU_ASSERT_EQUAL(bad, 0);
        if (bad) fprintf(stderr, "  gemm_ex mixed variant %d: %d of %zu differ\n", variant, bad, nc);

        /* beta = 0 over NaN: not read, in both epilogues */
        for (int in_place = 0; in_place < 2; in_place++) {
            const int ldc2 = in_place ? N : ldc;
            float nanC[64];
            for (int i = 0; i < 64; i++) nanC[i] = NAN;
            CU_ASSERT_EQUAL(k->copy(acc, dC, nanC, (size_t)M * ldc2 * 4, KILN_COPY_H2D), KILN_OK);
            CU_ASSERT_EQUAL(k->gemm_ex(acc, ta, tb, M, N, K, alpha, dA, at, lda, dB, bt, ldb, 0.0, dC,
                                       KILN_DTYPE_F32, ldc2, KILN_DTYPE_BF16),
                            KILN_OK);
            CU_ASSERT_TRUE(down(k, acc, out, dC, (size_t)M * ldc2 * 4));
            /* exactly the rounded product */
            int exact_bad = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0.0;
                    for (int p = 0; p < K; p++) {
                        const double a = ta ? af[(size_t)p * lda + i] : af[(size_t)i * lda + p];
                        const double b = tb ? bf[(size_t)j * ldb + p] : bf[(size_t)p * ldb + j];
                        s += a * b;
                    }
                    exact_bad += out[(size_t)i * ldc2 + j] != round_bf16((float)(alpha * s));
                }
            CU_ASSERT_EQUAL(exact_bad, 0);
            if (exact_bad) fprintf(stderr, "  gemm_ex mixed variant %d, beta 0, ldc %d: %d differ\n", variant, ldc2, exact_bad);
        }
        k->free(acc, dA), k->free(acc, dB), k->free(acc, dC);
    }
    /* dtype checks */
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, 1, 1, 1, 1.0, NULL, KILN_DTYPE_F64, 1, NULL, KILN_DTYPE_F32, 1, 0.0, NULL,
                               KILN_DTYPE_F32, 1, KILN_DTYPE_F32),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, 1, 1, 1, 1.0, NULL, KILN_DTYPE_F64, 1, NULL, KILN_DTYPE_F64, 1, 0.0, NULL,
                               KILN_DTYPE_F64, 1, KILN_DTYPE_BF16),
                    KILN_E_INVALID_ARG);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* gemm_ex is autocast's matmul (training.h): float32 operands that are NOT
 * bfloat16-representable are rounded through the matmul's 16-bit dtype,
 * and the product runs on the tensor cores (one bf16 x bf16 cuBLASLt
 * matmul, no fp32 one):
 *  - F32 x F32, round_dtype BF16 (a weight gradient dy^T . x): both rounded,
 *    product rounded, beta C added;
 *  - F32 x BF16, round_dtype F32 (a Conv1D forward before its bias): the
 *    F32 operand rounded, the product left in float32;
 *  - F32 x F32, round_dtype F32: full fp32, nothing rounded (one fp32 matmul);
 *  - F32 x F16, round_dtype BF16: the F32 operand rounded through bf16 in a
 *    copy, the F16 one widened, an fp32 product rounded through bf16.
 * Exact: the references sum the same exact products in the same order. */
static void test_gemm_ex_rounds_f32_operands(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    enum { M = 5, N = 7, K = 6 };
    float a[M * K], b[K * N], bq[K * N], hq[K * N], C[M * N], out[M * N];
    uint16_t b16[K * N], h16[K * N];
    for (int i = 0; i < M * K; i++) a[i] = val((unsigned)i, 21) * 3.0f + 1e-3f;
    for (int i = 0; i < K * N; i++) {
        b[i] = val((unsigned)i, 22) * 2.0f - 1e-3f;
        bq[i] = round_bf16(b[i]);
        b16[i] = bf16_bits(b[i]);
        h16[i] = hb_f16_bits(b[i]);
        hq[i] = (float)hb_f16_value(h16[i]);
    }
    int unrounded = 0; /* the inputs must need the rounding */
    for (int i = 0; i < M * K; i++) unrounded += round_bf16(a[i]) != a[i];
    CU_ASSERT_TRUE(unrounded > M * K / 2);
    for (int i = 0; i < M * N; i++) C[i] = val((unsigned)i, 23);
    float *dA = up(k, acc, a, sizeof a), *dB = up(k, acc, b, sizeof b), *dC = up(k, acc, C, sizeof C);
    void *dB16 = up(k, acc, b16, sizeof b16), *dH16 = up(k, acc, h16, sizeof h16);
    CU_ASSERT_FATAL(dA && dB && dC && dB16 && dH16);
    const double alpha = 0.5;
    for (int c = 0; c < 4; c++) {
        const uint32_t bt = c == 1 ? KILN_DTYPE_BF16 : c == 3 ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
        const uint32_t rt = c == 0 || c == 3 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
        const void *dBc = c == 1 ? dB16 : c == 3 ? dH16 : (void *)dB;
        const double beta = c == 0 ? 1.0 : 0.0;
        CU_ASSERT_EQUAL(k->copy(acc, dC, C, sizeof C, KILN_COPY_H2D), KILN_OK);
        const fake_cuda_stats s0 = stats();
        CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, M, N, K, alpha, dA, KILN_DTYPE_F32, K, dBc, bt, N, beta, dC,
                                   KILN_DTYPE_F32, N, rt),
                        KILN_OK);
        const fake_cuda_stats s1 = stats();
        CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
        CU_ASSERT_EQUAL(s1.matmuls - s0.matmuls, 1);
        CU_ASSERT_EQUAL(s1.matmuls_16bit - s0.matmuls_16bit, c < 2 ? 1u : 0u);
        CU_ASSERT_EQUAL(s1.matmuls_fp32 - s0.matmuls_fp32, c < 2 ? 0u : 1u);
        /* a rounded bf16 product is stored in bf16 by the GEMM; the fp32
         * product of F32 x F16 (case 3) is rounded by the widening pass */
        CU_ASSERT_EQUAL(s1.round_add_16bit - s0.round_add_16bit, c == 0 ? 1u : 0u);
        int bad = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double sum = 0.0;
                for (int p = 0; p < K; p++) {
                    const double av = c == 2 ? a[i * K + p] : round_bf16(a[i * K + p]);
                    const double bv = c < 2 ? bq[p * N + j] : c == 3 ? hq[p * N + j] : b[p * N + j];
                    sum += av * bv;
                }
                const float prod = (float)(alpha * sum);
                const float want = c == 0 ? round_bf16(prod) + C[i * N + j] : c == 3 ? round_bf16(prod) : prod;
                bad += out[i * N + j] != want;
            }
        CU_ASSERT_EQUAL(bad, 0);
        if (bad) fprintf(stderr, "  gemm_ex rounding case %d: %d of %d differ\n", c, bad, M * N);
    }
    k->free(acc, dA), k->free(acc, dB), k->free(acc, dC), k->free(acc, dB16), k->free(acc, dH16);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* 1.6: gemm_ex into a bfloat16 C. An F32 A is converted once, a bf16 B is
 * taken as it is, and one 16-bit matmul writes C, whose fp32 result is
 * rounded once as it is stored (bits checked against the exact model);
 * K = 0 leaves beta * C rounded, through the row-wise path. The flag that
 * tells callers is set. */
static void test_gemm_ex_c16(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    CU_ASSERT_TRUE(k->flags & KILN_KERNELS_STORE_16BIT);
    enum { M = 4, N = 6, K = 5, LDC = 8 };
    float a[M * K];
    uint16_t b16[K * N], c16[M * LDC], out[M * LDC];
    for (int i = 0; i < M * K; i++) a[i] = val((unsigned)i, 31) * 3.0f;
    for (int i = 0; i < K * N; i++) b16[i] = bf16_bits(val((unsigned)i, 32));
    for (int i = 0; i < M * LDC; i++) c16[i] = bf16_bits(i % LDC < N ? val((unsigned)i, 33) : 7.0f);
    void *dA = up(k, acc, a, sizeof a), *dB = up(k, acc, b16, sizeof b16), *dC = up(k, acc, c16, sizeof c16);
    CU_ASSERT_FATAL(dA && dB && dC);
    const fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, M, N, K, 0.5, dA, KILN_DTYPE_F32, K, dB, KILN_DTYPE_BF16, N, -1.0, dC,
                               KILN_DTYPE_BF16, LDC, KILN_DTYPE_BF16),
                    KILN_OK);
    const fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.matmuls - s0.matmuls, 1);
    CU_ASSERT_EQUAL(s1.matmuls_16bit - s0.matmuls_16bit, 1);
    CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < LDC; j++) {
            uint16_t want = c16[i * LDC + j]; /* the padding keeps its bits */
            if (j < N) {
                double sum = 0.0;
                for (int p = 0; p < K; p++) sum += (double)round_bf16(a[i * K + p]) * hb_bf16_value(b16[p * N + j]);
                want = bf16_bits((float)(0.5 * sum - 1.0 * hb_bf16_value(c16[i * LDC + j])));
            }
            bad += out[i * LDC + j] != want;
        }
    CU_ASSERT_EQUAL(bad, 0);
    /* K = 0: C = 0.5 * C, rounded, padding kept */
    CU_ASSERT_EQUAL(k->copy(acc, dC, c16, sizeof c16, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, M, N, 0, 1.0, NULL, KILN_DTYPE_F32, 1, NULL, KILN_DTYPE_F32, N, 0.5, dC,
                               KILN_DTYPE_BF16, LDC, KILN_DTYPE_BF16),
                    KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
    bad = 0;
    for (int i = 0; i < M * LDC; i++)
        bad += out[i] != (i % LDC < N ? bf16_bits(0.5f * hb_bf16_value(c16[i])) : c16[i]);
    CU_ASSERT_EQUAL(bad, 0);
    /* a round_dtype other than C's is refused, naming both */
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, M, N, K, 1.0, dA, KILN_DTYPE_F32, K, dB, KILN_DTYPE_BF16, N, 0.0, dC,
                               KILN_DTYPE_BF16, LDC, KILN_DTYPE_F32),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "cuda: gemm_ex: c_dtype bfloat16 takes round_dtype bfloat16"));
    k->free(acc, dA), k->free(acc, dB), k->free(acc, dC);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* gemm_ex in float64 and with two different 16-bit dtypes (both widened to
 * float32), against double references. */
static void test_gemm_ex_f64_and_f16_bf16(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const int M = 4, N = 3, K = 5;
    double A[32], B[32], C[16], out[16];
    for (int i = 0; i < 32; i++) A[i] = val(i, 21) * 1.1, B[i] = val(i, 22) * 0.9;
    for (int i = 0; i < 16; i++) C[i] = val(i, 23);
    double *dA = up(k, acc, A, sizeof A), *dB = up(k, acc, B, sizeof B), *dC = up(k, acc, C, sizeof C);
    CU_ASSERT_FATAL(dA && dB && dC);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 1, 0, M, N, K, 2.0, dA, KILN_DTYPE_F64, M, dB, KILN_DTYPE_F64, N, -1.0, dC,
                               KILN_DTYPE_F64, N, KILN_DTYPE_F64),
                    KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, (size_t)M * N * 8));
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int p = 0; p < K; p++) s += A[p * M + i] * B[p * N + j];
            const double w = 2.0 * s - C[i * N + j];
            bad += fabs(out[i * N + j] - w) > 1e-14;
        }
    CU_ASSERT_EQUAL(bad, 0);
    /* fp16 A, bf16 B, rounded to fp16 */
    uint16_t h[32], b[32];
    float hf[32], bfl[32], outf[16];
    for (int i = 0; i < 32; i++) {
        hf[i] = (float)(int)(val(i, 31) * 16.0f) / 16.0f; /* exact in fp16 and bf16 */
        bfl[i] = (float)(int)(val(i, 32) * 8.0f) / 8.0f;
        h[i] = 0; /* fp16 bits of hf */
        {
            const float v = hf[i];
            if (v == 0.0f) h[i] = 0;
            else {
                int e;
                const float f = frexpf(fabsf(v), &e); /* v = f 2^e, f in [0.5,1) */
                const unsigned mant = (unsigned)ldexpf(f, 11) - 1024u;
                h[i] = (uint16_t)((v < 0 ? 0x8000u : 0u) | ((unsigned)(e - 1 + 15) << 10) | mant);
            }
        }
        b[i] = bf16_bits(bfl[i]);
    }
    uint16_t *dH = up(k, acc, h, sizeof h), *dBb = up(k, acc, b, sizeof b);
    float *dCf = up(k, acc, NULL, 16 * 4);
    CU_ASSERT_FATAL(dH && dBb && dCf);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 1, M, N, K, 1.0, dH, KILN_DTYPE_F16, K, dBb, KILN_DTYPE_BF16, K, 0.0, dCf,
                               KILN_DTYPE_F32, N, KILN_DTYPE_F32),
                    KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, outf, dCf, (size_t)M * N * 4));
    bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int p = 0; p < K; p++) s += (double)hf[i * K + p] * bfl[j * K + p];
            bad += outf[i * N + j] != (float)s;
        }
    CU_ASSERT_EQUAL(bad, 0);
    k->free(acc, dA), k->free(acc, dB), k->free(acc, dC), k->free(acc, dH), k->free(acc, dBb), k->free(acc, dCf);
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
    CU_ASSERT_EQUAL(k->scale(acc, d, 2.0f, 16), KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "kg_scale");
    HAS(kiln_test_error(g_th), "cudaErrorLaunchFailure");
    env_set("KILN_FAKE_CUDA_FAIL", "cudaStreamSynchronize");
    CU_ASSERT_EQUAL(k->synchronize(acc), KILN_E_CUDA);
    HAS(kiln_test_error(g_th), "unspecified launch failure");
    env_set("KILN_FAKE_CUDA_FAIL", "cublasLtMatmulAlgoGetHeuristic");
    /* the heuristic's NOT_SUPPORTED: no algorithm, KILN_E_UNSUPPORTED */
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 3, 3, 1, 1.0f, d, 1, d, 3, 0.0f, d + 4, 3), KILN_E_UNSUPPORTED);
    HAS(kiln_test_error(g_th), "cuBLAS status 15");
    env_clear();
    /* the failed plan left nothing behind and the shape works now */
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 3, 3, 1, 1.0f, d, 1, d, 3, 0.0f, d + 4, 3), KILN_OK);
    CU_ASSERT_EQUAL(k->synchronize(acc), KILN_OK);
    k->free(acc, d);
    g_ops->base.destroy(acc);
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

/* ======================================================= 1.4 sequence */

/* embedding_forward reads the tokens back once (its range check); the
 * backward over the same, unwritten tokens uses that copy without waiting,
 * and uploads its bucket index through the staging ring; a copy or zero
 * over the tokens makes the backward read them again. xent_fused waits
 * once per call; attention past its length limit is refused in one line. */
static void test_seq_tokens_memo(void) {
    enum { B = 2, T = 5, C = 8, V = 7 };
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    CU_ASSERT_TRUE_FATAL(k->struct_size >= KILN_KERNELS_SIZE_1_4 && k->embedding_forward && k->xent_fused);
    int32_t tok[B * T] = {1, 2, 1, 6, 0, 3, 3, 3, 5, 1}, tok2[B * T] = {0, 0, 0, 0, 0, 6, 6, 6, 6, 6};
    int32_t bad[B * T] = {1, 2, 1, 6, 0, 3, 7, 3, 5, 1};
    float wte[V * C], wpe[T * C], dout[B * T * C];
    for (unsigned i = 0; i < V * C; i++) wte[i] = val(i, 1);
    for (unsigned i = 0; i < T * C; i++) wpe[i] = val(i, 2);
    for (unsigned i = 0; i < B * T * C; i++) dout[i] = val(i, 3);
    int32_t *dt = up(k, acc, tok, sizeof tok);
    float *dwte = up(k, acc, wte, sizeof wte), *dwpe = up(k, acc, wpe, sizeof wpe), *dd = up(k, acc, dout, sizeof dout);
    float *dy = up(k, acc, NULL, sizeof dout), *gte = up(k, acc, NULL, sizeof wte), *gpe = up(k, acc, NULL, sizeof wpe);
    CU_ASSERT_FATAL(dt && dwte && dwpe && dd && dy && gte && gpe);
    fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->embedding_forward(acc, KILN_DTYPE_F32, dy, dt, dwte, dwpe, B, T, C, V), KILN_OK);
    fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.d2h_copies - s0.d2h_copies, 1);
    CU_ASSERT_EQUAL(s1.kernels - s0.kernels, 1);
    CU_ASSERT_EQUAL(k->embedding_backward(acc, KILN_DTYPE_F32, gte, gpe, dd, dt, B, T, C, V), KILN_OK);
    fake_cuda_stats s2 = stats();
    CU_ASSERT_EQUAL(s2.d2h_copies - s1.d2h_copies, 0);
    CU_ASSERT_EQUAL(s2.kernels - s1.kernels, 2); /* positions, then the token buckets */
    CU_ASSERT(s2.h2d_async_pinned > s1.h2d_async_pinned);
    /* the gradient of token 3 (positions 5, 6, 7) is their rows added in order */
    float g[V * C];
    CU_ASSERT_TRUE(down(k, acc, g, gte, sizeof g));
    CU_ASSERT_EQUAL(g[3 * C + 2], (dout[5 * C + 2] + dout[6 * C + 2]) + dout[7 * C + 2]);
    CU_ASSERT_EQUAL(g[4 * C + 2], 0.0f); /* token 4 does not occur */
    /* rewritten tokens: read again, and used */
    CU_ASSERT_EQUAL(k->copy(acc, dt, tok2, sizeof tok2, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->zero(acc, gte, sizeof wte), KILN_OK);
    s1 = stats();
    CU_ASSERT_EQUAL(k->embedding_backward(acc, KILN_DTYPE_F32, gte, NULL, dd, dt, B, T, C, V), KILN_OK);
    s2 = stats();
    CU_ASSERT_EQUAL(s2.d2h_copies - s1.d2h_copies, 1);
    CU_ASSERT_TRUE(down(k, acc, g, gte, sizeof g));
    CU_ASSERT_EQUAL(g[1 * C], 0.0f);
    CU_ASSERT_EQUAL(g[6 * C + 1], (((dout[5 * C + 1] + dout[6 * C + 1]) + dout[7 * C + 1]) + dout[8 * C + 1]) + dout[9 * C + 1]);
    /* zero() over the tokens forgets them too */
    CU_ASSERT_EQUAL(k->embedding_forward(acc, KILN_DTYPE_F32, dy, dt, dwte, NULL, B, T, C, V), KILN_OK);
    CU_ASSERT_EQUAL(k->zero(acc, dt, sizeof tok), KILN_OK);
    s1 = stats();
    CU_ASSERT_EQUAL(k->embedding_backward(acc, KILN_DTYPE_F32, gte, NULL, dd, dt, B, T, C, V), KILN_OK);
    CU_ASSERT_EQUAL(stats().d2h_copies - s1.d2h_copies, 1);
    /* a bad token: refused by the forward before anything runs, and by a backward after it */
    CU_ASSERT_EQUAL(k->copy(acc, dt, bad, sizeof bad, KILN_COPY_H2D), KILN_OK);
    s1 = stats();
    CU_ASSERT_EQUAL(k->embedding_forward(acc, KILN_DTYPE_F32, dy, dt, dwte, dwpe, B, T, C, V), KILN_E_DATA);
    HAS(kiln_test_error(g_th), "token 7 at index 6 (batch 1, position 1)");
    CU_ASSERT_EQUAL(stats().kernels - s1.kernels, 0);
    CU_ASSERT_EQUAL(k->embedding_backward(acc, KILN_DTYPE_F32, gte, gpe, dd, dt, B, T, C, V), KILN_E_DATA);
    /* xent_fused: one wait per call, the loss and the bad row in one read-back */
    float logits[4 * 9];
    for (unsigned i = 0; i < 4 * 9; i++) logits[i] = val(i, 4);
    int32_t targets[4] = {0, -1, 6, 2};
    float *dl = up(k, acc, logits, sizeof logits);
    int32_t *dtg = up(k, acc, targets, sizeof targets);
    CU_ASSERT_FATAL(dl && dtg);
    double loss = 0;
    s1 = stats();
    CU_ASSERT_EQUAL(k->xent_fused(acc, KILN_DTYPE_F32, dl, dtg, 4, 7, 9, 0.25, &loss), KILN_OK);
    s2 = stats();
    CU_ASSERT_EQUAL(s2.syncs - s1.syncs, 1);
    CU_ASSERT_EQUAL(s2.d2h_copies - s1.d2h_copies, 1);
    CU_ASSERT_TRUE(loss > 0);
    targets[3] = 7;
    CU_ASSERT_EQUAL(k->copy(acc, dtg, targets, sizeof targets, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->xent_fused(acc, KILN_DTYPE_F32, dl, dtg, 4, 7, 9, 0.25, &loss), KILN_E_DATA);
    HAS(kiln_test_error(g_th), "target 7 at row 3 is outside [-1, 7)");
    /* attention = "rowwise" and a T longer than its kernel holds: one line,
     * nothing launched (the gemm path has no such limit) */
    const kiln_kv rowwise[] = {{"attention", KILN_V_STR("rowwise")}, {NULL, KILN_V_NONE}};
    const kiln_kernels *k2 = NULL;
    kiln_instance *acc2 = ready(rowwise, &k2);
    if (acc2) {
        const int32_t Tbig = 1 << 20; /* far past the 48 KiB of shared memory per block */
        s1 = stats();
        CU_ASSERT_EQUAL(k2->attention_forward(acc2, KILN_DTYPE_F32, dy, dy, dd, 1, Tbig, 4, 1, KILN_DTYPE_F32),
                        KILN_E_UNSUPPORTED);
        HAS(kiln_test_error(g_th), "attention_forward: T=");
        CU_ASSERT_EQUAL(stats().kernels - s1.kernels, 0);
        g_ops->base.destroy(acc2);
    }
    /* a bad attention setting */
    const kiln_kv bad_attn[] = {{"attention", KILN_V_STR("fused")}, {NULL, KILN_V_NONE}};
    kiln_instance *acc3 = NULL;
    CU_ASSERT_EQUAL(make(bad_attn, &acc3), KILN_E_CONFIG);
    HAS(kiln_test_error(g_th), "attention must be \"gemm\", \"rowwise\" or \"flash\", got \"fused\"");
    k->free(acc, dt), k->free(acc, dwte), k->free(acc, dwpe), k->free(acc, dd), k->free(acc, dy);
    k->free(acc, gte), k->free(acc, gpe), k->free(acc, dl), k->free(acc, dtg);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* attention = "flash": a 16-bit mixed-precision call with a head size it
 * has runs the fused programs (one launch forward; delta and the programs
 * backward: two), no cuBLASLt product, no violation from the emulation;
 * a call it does not run (unrounded float32, float64, head size 24) takes
 * the gemm path, logged once. */
static void test_attention_flash_dispatch(void) {
    const kiln_kv flash[] = {{"attention", KILN_V_STR("flash")}, {NULL, KILN_V_NONE}};
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(flash, &k);
    if (!acc) return;
    const int32_t B = 1, T = 70, C = 128, NH = 2;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *h = calloc(nq, sizeof *h);
    CU_ASSERT_FATAL(h != NULL);
    for (size_t i = 0; i < nq; i++) h[i] = (float)((int)(i % 7) - 3) * 0.125f;
    void *qkv = up(k, acc, NULL, nq * 8), *out = up(k, acc, NULL, no * 8), *lse = up(k, acc, NULL, nl * 8);
    void *dout = up(k, acc, NULL, no * 8), *dqkv = up(k, acc, NULL, nq * 8);
    CU_ASSERT_EQUAL(k->copy(acc, qkv, h, nq * sizeof *h, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->copy(acc, dout, h, no * sizeof *h, KILN_COPY_H2D), KILN_OK);
    fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F32, out, lse, qkv, B, T, C, NH, KILN_DTYPE_BF16), KILN_OK);
    fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.kernels - s0.kernels, 1);
    CU_ASSERT_EQUAL(s1.matmuls - s0.matmuls, 0);
    CU_ASSERT_EQUAL(k->attention_backward(acc, KILN_DTYPE_F32, dqkv, dout, qkv, out, lse, B, T, C, NH,
                                          KILN_DTYPE_BF16),
                    KILN_OK);
    fake_cuda_stats s2 = stats();
    CU_ASSERT_EQUAL(s2.kernels - s1.kernels, 2);
    CU_ASSERT_EQUAL(s2.matmuls - s1.matmuls, 0);
    CU_ASSERT_PTR_NULL(kiln_test_log_find(g_th, KILN_LOG_INFO, "using the gemm path"));
    /* the outputs are finite: the emulation wrote every element */
    float *o = calloc(nq, sizeof *o);
    CU_ASSERT_FATAL(o != NULL);
    CU_ASSERT_EQUAL(k->copy(acc, o, dqkv, nq * sizeof *o, KILN_COPY_D2H), KILN_OK);
    size_t bad = 0;
    for (size_t i = 0; i < nq; i++) bad += !isfinite(o[i]);
    CU_ASSERT_EQUAL(bad, 0);
    /* calls the flash path does not run: the gemm path, logged once */
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F32, out, lse, qkv, B, T, C, NH, KILN_DTYPE_F32), KILN_OK);
    fake_cuda_stats s3 = stats();
    CU_ASSERT_TRUE(s3.matmuls - s2.matmuls >= 2);
    const char *line = kiln_test_log_find(g_th, KILN_LOG_INFO, "using the gemm path");
    CU_ASSERT_PTR_NOT_NULL(line);
    if (line) HAS(line, "this call is float32 with head size 64");
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F32, out, lse, qkv, B, T, 72, 3, KILN_DTYPE_BF16), KILN_OK);
    CU_ASSERT_TRUE(stats().matmuls - s3.matmuls >= 2);
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F64, out, lse, qkv, B, T, C, NH, KILN_DTYPE_F64), KILN_OK);
    free(h), free(o);
    k->free(acc, qkv), k->free(acc, out), k->free(acc, lse), k->free(acc, dout), k->free(acc, dqkv);
    g_ops->base.destroy(acc);
    /* a device that grants less shared memory than the programs need (48
     * KiB, an older GPU's): the gemm path, and the log names both sizes */
    setenv("KILN_FAKE_CUDA_SMEM_OPTIN", "49152", 1);
    kiln_test_clear_log(g_th);
    acc = ready(flash, &k);
    unsetenv("KILN_FAKE_CUDA_SMEM_OPTIN");
    if (!acc) return;
    qkv = up(k, acc, NULL, nq * 4), out = up(k, acc, NULL, no * 4), lse = up(k, acc, NULL, nl * 4);
    s0 = stats();
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F32, out, lse, qkv, B, T, C, NH, KILN_DTYPE_BF16), KILN_OK);
    CU_ASSERT_TRUE(stats().matmuls - s0.matmuls >= 2);
    line = kiln_test_log_find(g_th, KILN_LOG_INFO, "using the gemm path");
    CU_ASSERT_PTR_NOT_NULL(line);
    if (line) HAS(line, "device allows 49152");
    k->free(acc, qkv), k->free(acc, out), k->free(acc, lse);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* ==================== 1.7: 16-bit activation storage (ACT_16BIT) */

/* x rounded to dt's 16 bits (nearest even) and its value. */
static uint16_t fk16_bits(uint32_t dt, float x) { return hb_round16(dt == KILN_DTYPE_BF16, x); }
static float fk16_value(uint32_t dt, uint16_t b) {
    return dt == KILN_DTYPE_BF16 ? hb_bf16_value(b) : (float)hb_f16_value(b);
}

/* n values of dt in [-scale, scale): the widened floats in f, the bits in h. */
static void fk16_fill(uint32_t dt, float *f, uint16_t *h, size_t n, unsigned salt, float scale) {
    for (size_t i = 0; i < n; i++) {
        h[i] = fk16_bits(dt, scale * val((unsigned)i, salt));
        f[i] = fk16_value(dt, h[i]);
    }
}

/* Device 16-bit got(n) against want(n) float32 rounded to dt, bit for bit. */
static size_t fk16_diff16(const kiln_kernels *k, kiln_instance *acc, uint32_t dt, const void *got, const float *want,
                         size_t n) {
    uint16_t *h = malloc(n * sizeof *h);
    size_t bad = n;
    if (h && down(k, acc, h, got, n * sizeof *h)) {
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += h[i] != fk16_bits(dt, want[i]);
    }
    free(h);
    return bad;
}

/* Device float32 got(n) against want(n), bit for bit. */
static size_t fk16_diff32(const kiln_kernels *k, kiln_instance *acc, const void *got, const float *want, size_t n) {
    float *h = malloc(n * sizeof *h);
    size_t bad = n;
    if (h && down(k, acc, h, got, n * sizeof *h)) {
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += memcmp(&h[i], &want[i], sizeof *h) != 0;
    }
    free(h);
    return bad;
}

#define A16_SAME(what, nbad)                                                                              \
    do {                                                                                                  \
        const size_t nbad_ = (nbad);                                                                      \
        if (nbad_) fprintf(stderr, "  %s %s: %zu elements differ\n", kiln_dtype_name(dt), (what), nbad_); \
        CU_ASSERT_EQUAL(nbad_, 0);                                                                        \
    } while (0)

/* The float32 reference of a call: device float32 buffers from host
 * arrays, the call, the result read back into host arrays. */
static float *fk16_up32(const kiln_kernels *k, kiln_instance *acc, const float *h, size_t n) {
    return up(k, acc, h, n * sizeof(float));
}
static void *fk16_up16(const kiln_kernels *k, kiln_instance *acc, const uint16_t *h, size_t n) {
    return up(k, acc, h, n * sizeof(uint16_t));
}

/* layernorm_forward/backward, linear_forward(_layout), act_backward,
 * bias_grad_ex and add: the 16-bit call equals the float32 call on the
 * widened inputs, its 16-bit outputs rounded (round_dtype dt in the
 * float32 call where the entry has one: its only rounding is the store). */
static void fk16_dense(const kiln_kernels *k, kiln_instance *acc, uint32_t dt) {
    enum { N = 6, C = 40, I = 24 };
    float x[N * C], w[C], b[C], y[N * C], mean[N], rstd[N], dyf[N * C], dx[N * C], dw[C], db[C];
    uint16_t dyh[N * C];
    for (int i = 0; i < N * C; i++) x[i] = 2.0f * val((unsigned)i, 71) + 0.25f;
    for (int i = 0; i < C; i++) w[i] = 1.0f + 0.5f * val((unsigned)i, 72), b[i] = 0.1f * val((unsigned)i, 73);
    fk16_fill(dt, dyf, dyh, N * C, 74, 1.0f);
    float *dx_ = fk16_up32(k, acc, x, N * C), *dw_ = fk16_up32(k, acc, w, C), *db_ = fk16_up32(k, acc, b, C);
    float *dm = fk16_up32(k, acc, NULL, N), *dr = fk16_up32(k, acc, NULL, N), *dy32 = fk16_up32(k, acc, NULL, N * C);
    void *dy16 = fk16_up16(k, acc, NULL, N * C), *dyg16 = fk16_up16(k, acc, dyh, N * C);
    float *dyg32 = fk16_up32(k, acc, dyf, N * C), *gx = fk16_up32(k, acc, NULL, N * C);
    float *gw = fk16_up32(k, acc, NULL, C), *gb = fk16_up32(k, acc, NULL, C);
    CU_ASSERT_FATAL(dx_ && dw_ && db_ && dm && dr && dy32 && dy16 && dyg16 && dyg32 && gx && gw && gb);

    /* layernorm_forward: y 16-bit */
    CU_ASSERT_EQUAL(k->layernorm_forward(acc, KILN_DTYPE_F32, dy32, dm, dr, dx_, dw_, db_, N, C, 1e-5, dt), KILN_OK);
    CU_ASSERT_FATAL(down(k, acc, y, dy32, sizeof y) && down(k, acc, mean, dm, sizeof mean) &&
                    down(k, acc, rstd, dr, sizeof rstd));
    CU_ASSERT_EQUAL(k->zero(acc, dm, sizeof mean), KILN_OK);
    CU_ASSERT_EQUAL(k->layernorm_forward(acc, dt, dy16, dm, dr, dx_, dw_, db_, N, C, 1e-5, dt), KILN_OK);
    A16_SAME("layernorm_forward y", fk16_diff16(k, acc, dt, dy16, y, N * C));
    A16_SAME("layernorm_forward mean", fk16_diff32(k, acc, dm, mean, N));
    A16_SAME("layernorm_forward rstd", fk16_diff32(k, acc, dr, rstd, N));
    CU_ASSERT_EQUAL(k->layernorm_forward(acc, dt, dy16, dm, dr, dx_, dw_, db_, N, C, 1e-5, KILN_DTYPE_F32),
                    KILN_E_INVALID_ARG);

    /* layernorm_backward: dy 16-bit; dx overwritten or accumulated onto x's
     * values, dw and db added to b's */
    for (int accu = 0; accu < 2; accu++) {
        for (int pass = 0; pass < 2; pass++) {
            CU_ASSERT_EQUAL(k->copy(acc, gx, x, sizeof dx, KILN_COPY_H2D), KILN_OK);
            CU_ASSERT_EQUAL(k->copy(acc, gw, b, sizeof dw, KILN_COPY_H2D), KILN_OK);
            CU_ASSERT_EQUAL(k->copy(acc, gb, b, sizeof db, KILN_COPY_H2D), KILN_OK);
            CU_ASSERT_EQUAL(k->layernorm_backward(acc, pass ? dt : KILN_DTYPE_F32, gx, gw, gb,
                                                  pass ? dyg16 : (void *)dyg32, dx_, dw_, dm, dr, N, C, accu),
                            KILN_OK);
            if (pass) break;
            CU_ASSERT_FATAL(down(k, acc, dx, gx, sizeof dx) && down(k, acc, dw, gw, sizeof dw) &&
                            down(k, acc, db, gb, sizeof db));
        }
        A16_SAME("layernorm_backward dx", fk16_diff32(k, acc, gx, dx, N * C));
        A16_SAME("layernorm_backward dw", fk16_diff32(k, acc, gw, dw, C));
        A16_SAME("layernorm_backward db", fk16_diff32(k, acc, gb, db, C));
    }

    /* act_backward: dx, dy, x 16-bit, every activation; dx over dy in place */
    float xa[N * C], ga[N * C];
    uint16_t xah[N * C];
    fk16_fill(dt, xa, xah, N * C, 75, 3.0f);
    void *xa16 = fk16_up16(k, acc, xah, N * C), *gx16 = fk16_up16(k, acc, NULL, N * C);
    float *xa32 = fk16_up32(k, acc, xa, N * C);
    CU_ASSERT_FATAL(xa16 && gx16 && xa32);
    for (int act = KILN_ACT_RELU; act <= KILN_ACT_LEAKY_RELU; act++) {
        CU_ASSERT_EQUAL(k->act_backward(acc, KILN_DTYPE_F32, act, gx, dyg32, xa32, N * C), KILN_OK);
        CU_ASSERT_FATAL(down(k, acc, ga, gx, sizeof ga));
        CU_ASSERT_EQUAL(k->act_backward(acc, dt, act, gx16, dyg16, xa16, N * C), KILN_OK);
        A16_SAME("act_backward dx", fk16_diff16(k, acc, dt, gx16, ga, N * C));
        CU_ASSERT_EQUAL(k->copy(acc, gx16, dyh, sizeof dyh, KILN_COPY_H2D), KILN_OK);
        CU_ASSERT_EQUAL(k->act_backward(acc, dt, act, gx16, gx16, xa16, N * C), KILN_OK);
        A16_SAME("act_backward dx in place", fk16_diff16(k, acc, dt, gx16, ga, N * C));
    }

    /* bias_grad_ex: dy 16-bit (one part and several), db float32 */
    {
        enum { R = 600, BC = 24 };
        float *gf = malloc(R * BC * sizeof *gf), dbw[BC];
        uint16_t *gh = malloc(R * BC * sizeof *gh);
        CU_ASSERT_FATAL(gf && gh);
        fk16_fill(dt, gf, gh, R * BC, 76, 1.0f);
        float *g32 = fk16_up32(k, acc, gf, R * BC), *dbd = fk16_up32(k, acc, NULL, BC);
        void *g16 = fk16_up16(k, acc, gh, R * BC);
        CU_ASSERT_FATAL(g32 && g16 && dbd);
        for (int rows = 7; rows <= R; rows += R - 7)
            for (int accu = 0; accu < 2; accu++) {
                CU_ASSERT_EQUAL(k->copy(acc, dbd, b, BC * sizeof(float), KILN_COPY_H2D), KILN_OK);
                CU_ASSERT_EQUAL(k->bias_grad_ex(acc, KILN_DTYPE_F32, dbd, g32, rows, BC, accu), KILN_OK);
                CU_ASSERT_FATAL(down(k, acc, dbw, dbd, sizeof dbw));
                CU_ASSERT_EQUAL(k->copy(acc, dbd, b, BC * sizeof(float), KILN_COPY_H2D), KILN_OK);
                CU_ASSERT_EQUAL(k->bias_grad_ex(acc, dt, dbd, g16, rows, BC, accu), KILN_OK);
                A16_SAME("bias_grad_ex db", fk16_diff32(k, acc, dbd, dbw, BC));
            }
        k->free(acc, g32), k->free(acc, dbd), k->free(acc, g16);
        free(gf), free(gh);
    }

    /* add: b 16-bit, y and a float32; y == a in place; y over b refused */
    {
        float sum[N * C];
        CU_ASSERT_EQUAL(k->add(acc, KILN_DTYPE_F32, gx, dx_, dyg32, N * C), KILN_OK);
        CU_ASSERT_FATAL(down(k, acc, sum, gx, sizeof sum));
        CU_ASSERT_EQUAL(k->add(acc, dt, gx, dx_, dyg16, N * C), KILN_OK);
        A16_SAME("add y", fk16_diff32(k, acc, gx, sum, N * C));
        CU_ASSERT_EQUAL(k->copy(acc, gx, x, sizeof x, KILN_COPY_H2D), KILN_OK);
        CU_ASSERT_EQUAL(k->add(acc, dt, gx, gx, dyg16, N * C), KILN_OK);
        A16_SAME("add y = a in place", fk16_diff32(k, acc, gx, sum, N * C));
        CU_ASSERT_EQUAL(k->add(acc, dt, dyg16, dyg16, dyg16, N * C / 2), KILN_E_INVALID_ARG);
    }

    /* linear_forward and _layout: x, y, post 16-bit; w float32 or dt; b
     * float32 or none; every activation and none; in = 0 */
    {
        enum { R = 6, O = 40 };
        float xl[R * I], wl[O * I], yw[R * O], pw[R * O];
        uint16_t xlh[R * I], wlh[O * I];
        fk16_fill(dt, xl, xlh, R * I, 77, 1.0f);
        for (int i = 0; i < O * I; i++) wl[i] = 0.3f * val((unsigned)i, 78); /* not 16-bit values */
        for (int i = 0; i < O * I; i++) wlh[i] = fk16_bits(dt, wl[i]);
        float *x32 = fk16_up32(k, acc, xl, R * I), *w32 = fk16_up32(k, acc, wl, O * I);
        void *x16 = fk16_up16(k, acc, xlh, R * I), *w16 = fk16_up16(k, acc, wlh, O * I);
        float *y32 = fk16_up32(k, acc, NULL, R * O), *p32 = fk16_up32(k, acc, NULL, R * O);
        void *y16 = fk16_up16(k, acc, NULL, R * O), *p16 = fk16_up16(k, acc, NULL, R * O);
        CU_ASSERT_FATAL(x32 && w32 && x16 && w16 && y32 && p32 && y16 && p16);
        for (int layout = 0; layout < 2; layout++)
            for (int wdt = 0; wdt < 2; wdt++)
                for (int hasb = 0; hasb < 2; hasb++)
                    for (int act = -1; act <= KILN_ACT_LEAKY_RELU; act++)
                        for (int in = 0; in <= I; in += I) {
                            const void *wv = wdt ? w16 : (const void *)w32;
                            const uint32_t wt = wdt ? dt : KILN_DTYPE_F32;
                            const float *bv = hasb ? db_ : NULL;
                            /* in = 0 reads no x or w: the layouts agree */
                            CU_ASSERT_EQUAL(k->linear_forward_layout(acc, KILN_DTYPE_F32, x32, wv, wt, layout, bv, R,
                                                                     in, O, act, y32, p32, dt),
                                            KILN_OK);
                            CU_ASSERT_FATAL(down(k, acc, yw, y32, sizeof yw));
                            if (act >= 0) CU_ASSERT_FATAL(down(k, acc, pw, p32, sizeof pw));
                            const int32_t rc = layout ? k->linear_forward_layout(acc, dt, x16, wv, wt, layout, bv, R,
                                                                                 in, O, act, y16, p16, dt)
                                                      : k->linear_forward(acc, dt, x16, wv, wt, bv, R, in, O, act,
                                                                          y16, p16, dt);
                            CU_ASSERT_EQUAL(rc, KILN_OK);
                            if (rc != KILN_OK) fprintf(stderr, "  linear_forward: %s\n", kiln_test_error(g_th));
                            A16_SAME("linear_forward y", fk16_diff16(k, acc, dt, y16, yw, R * O));
                            if (act >= 0) A16_SAME("linear_forward post", fk16_diff16(k, acc, dt, p16, pw, R * O));
                        }
        /* round_dtype other than dt, a w of the other 16-bit format */
        const uint32_t other = dt == KILN_DTYPE_BF16 ? KILN_DTYPE_F16 : KILN_DTYPE_BF16;
        CU_ASSERT_EQUAL(k->linear_forward(acc, dt, x16, w32, KILN_DTYPE_F32, NULL, R, I, O, -1, y16, NULL,
                                          KILN_DTYPE_F32),
                        KILN_E_INVALID_ARG);
        CU_ASSERT_EQUAL(k->linear_forward(acc, dt, x16, w16, other, NULL, R, I, O, -1, y16, NULL, dt),
                        KILN_E_INVALID_ARG);
        k->free(acc, x32), k->free(acc, w32), k->free(acc, x16), k->free(acc, w16);
        k->free(acc, y32), k->free(acc, p32), k->free(acc, y16), k->free(acc, p16);
    }
    k->free(acc, xa16), k->free(acc, gx16), k->free(acc, xa32);
    k->free(acc, dx_), k->free(acc, dw_), k->free(acc, db_), k->free(acc, dm), k->free(acc, dr);
    k->free(acc, dy32), k->free(acc, dy16), k->free(acc, dyg16), k->free(acc, dyg32);
    k->free(acc, gx), k->free(acc, gw), k->free(acc, gb);
}

/* attention_forward/backward: qkv, out, dout, dqkv 16-bit, lse float32;
 * on the instance's path (gemm, flash) the 16-bit call equals the float32
 * call with round_dtype dt on the widened inputs. */
static void fk16_attention(const kiln_kernels *k, kiln_instance *acc, uint32_t dt, int32_t B, int32_t T, int32_t C,
                          int32_t NH) {
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qf = malloc(nq * 4), *gf = malloc(no * 4), *out = malloc(no * 4), *lse = malloc(nl * 4);
    float *dq = malloc(nq * 4);
    uint16_t *qh = malloc(nq * 2), *gh = malloc(no * 2), *oh = malloc(no * 2);
    CU_ASSERT_FATAL(qf && gf && out && lse && dq && qh && gh && oh);
    fk16_fill(dt, qf, qh, nq, 81, 1.0f);
    fk16_fill(dt, gf, gh, no, 82, 1.0f);
    float *q32 = fk16_up32(k, acc, qf, nq), *g32 = fk16_up32(k, acc, gf, no), *o32 = fk16_up32(k, acc, NULL, no);
    float *l32 = fk16_up32(k, acc, NULL, nl), *d32 = fk16_up32(k, acc, NULL, nq), *l16 = fk16_up32(k, acc, NULL, nl);
    void *q16 = fk16_up16(k, acc, qh, nq), *g16 = fk16_up16(k, acc, gh, no), *o16 = fk16_up16(k, acc, NULL, no);
    void *d16 = fk16_up16(k, acc, NULL, nq);
    CU_ASSERT_FATAL(q32 && g32 && o32 && l32 && d32 && l16 && q16 && g16 && o16 && d16);
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F32, o32, l32, q32, B, T, C, NH, dt), KILN_OK);
    CU_ASSERT_FATAL(down(k, acc, out, o32, no * 4) && down(k, acc, lse, l32, nl * 4));
    CU_ASSERT_EQUAL(k->attention_forward(acc, dt, o16, l16, q16, B, T, C, NH, dt), KILN_OK);
    A16_SAME("attention_forward out", fk16_diff16(k, acc, dt, o16, out, no));
    A16_SAME("attention_forward lse", fk16_diff32(k, acc, l16, lse, nl));
    /* the backward from the forward's out (16-bit values in both) and lse */
    CU_ASSERT_EQUAL(k->attention_backward(acc, KILN_DTYPE_F32, d32, g32, q32, o32, l32, B, T, C, NH, dt), KILN_OK);
    CU_ASSERT_FATAL(down(k, acc, dq, d32, nq * 4));
    CU_ASSERT_EQUAL(k->attention_backward(acc, dt, d16, g16, q16, o16, l16, B, T, C, NH, dt), KILN_OK);
    A16_SAME("attention_backward dqkv", fk16_diff16(k, acc, dt, d16, dq, nq));
    /* refusals: round_dtype other than dt; lse (float32, twice a 16-bit
     * element) overlapping out where 16-bit bytes would not */
    CU_ASSERT_EQUAL(k->attention_forward(acc, dt, o16, l16, q16, B, T, C, NH, KILN_DTYPE_F32), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->attention_backward(acc, dt, d16, g16, q16, o16, l16, B, T, C, NH, KILN_DTYPE_F32),
                    KILN_E_INVALID_ARG);
    void *big = up(k, acc, NULL, no * 2 + nl * 4);
    CU_ASSERT_FATAL(big != NULL);
    /* lse at the start, out 2 * nl bytes on: apart if lse were 16-bit */
    CU_ASSERT_EQUAL(k->attention_forward(acc, dt, (char *)big + nl * 2, big, q16, B, T, C, NH, dt),
                    KILN_E_INVALID_ARG);
    k->free(acc, big);
    k->free(acc, q32), k->free(acc, g32), k->free(acc, o32), k->free(acc, l32), k->free(acc, d32);
    k->free(acc, l16), k->free(acc, q16), k->free(acc, g16), k->free(acc, o16), k->free(acc, d16);
    free(qf), free(gf), free(out), free(lse), free(dq), free(qh), free(gh), free(oh);
}

static void test_act16_entries(void) {
    static const uint32_t dts[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    CU_ASSERT_TRUE((k->flags & KILN_KERNELS_ACT_16BIT) != 0);
    for (int i = 0; i < 2; i++) {
        fk16_dense(k, acc, dts[i]);
        fk16_attention(k, acc, dts[i], 2, 9, 32, 2); /* the gemm path */
    }
    g_ops->base.destroy(acc);
    /* the flash path (its programs emulated), and rowwise, which takes the
     * gemm path for 16-bit storage */
    static const char *const paths[2] = {"flash", "rowwise"};
    for (int p = 0; p < 2; p++) {
        const kiln_kv cfg[] = {{"attention", KILN_V_STR(paths[p])}, {NULL, KILN_V_NONE}};
        kiln_test_clear_log(g_th);
        acc = ready(cfg, &k);
        if (!acc) return;
        for (int i = 0; i < 2; i++) {
            const fake_cuda_stats s0 = stats();
            fk16_attention(k, acc, dts[i], 2, 70, 64, 2);
            if (p == 0) CU_ASSERT_EQUAL(stats().matmuls, s0.matmuls); /* flash: no cuBLASLt product */
        }
        if (p == 0) CU_ASSERT_PTR_NULL(kiln_test_log_find(g_th, KILN_LOG_INFO, "using the gemm path"));
        g_ops->base.destroy(acc);
    }
    NO_VIOLATIONS();
}

/* The shared cases of tests/support/act16_cases.h, which the cpu
 * accelerator passes too: 1.7's eight entries and 1.8's rounded bias (on
 * 16-bit storage cuBLASLt's bias epilogue writes the 16-bit y itself). */
static void test_act16_shared(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    act16_run_all(k, acc);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

static void test_bias_round(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const fake_cuda_stats s0 = stats();
    bias_round_run_all(k, acc);
    /* the flagged calls on 16-bit storage with K > 0 (2 dtypes x 2 layouts
     * x with and without GELU) ran cuBLASLt's bias epilogue on the 16-bit
     * output, with no float32 scratch; nothing else did */
    CU_ASSERT_EQUAL(stats().matmuls_bias16 - s0.matmuls_bias16, 8u);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* A device or cuBLASLt without an algorithm for the bias epilogue on a
 * 16-bit output: the rounded-bias call falls back to float32 scratch, with
 * the same bits, says so once, and does not ask the heuristic again. */
static void test_bias_round_fallback(void) {
    const kiln_kernels *k = NULL;
    kiln_test_clear_log(g_th);
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    enum { R = 5, I = 16, O = 24 };
    float bf[O], bq[O];
    uint16_t xh[R * I], wh[I * O], y[2][R * O];
    for (int i = 0; i < R * I; i++) xh[i] = fk16_bits(KILN_DTYPE_BF16, val((unsigned)i, 11u));
    for (int i = 0; i < I * O; i++) wh[i] = fk16_bits(KILN_DTYPE_BF16, 0.3f * val((unsigned)i, 12u));
    for (int i = 0; i < O; i++) {
        bf[i] = 0.5f * val((unsigned)i, 13u);
        bq[i] = fk16_value(KILN_DTYPE_BF16, fk16_bits(KILN_DTYPE_BF16, bf[i]));
    }
    void *dx = up(k, acc, xh, sizeof xh), *dw = up(k, acc, wh, sizeof wh), *db = up(k, acc, bf, sizeof bf);
    void *dq = up(k, acc, bq, sizeof bq), *dy = up(k, acc, y[0], sizeof y[0]), *dy2 = up(k, acc, y[1], sizeof y[1]);
    CU_ASSERT_FATAL(dx && dw && db && dq && dy && dy2);
    /* the first heuristic call (the 16-bit bias epilogue's plan) finds nothing */
    env_set("KILN_FAKE_CUDA_FAIL", "cublasLtMatmulAlgoGetHeuristic@1");
    const fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->linear_forward_layout(acc, KILN_DTYPE_BF16, dx, dw, KILN_DTYPE_BF16,
                                             KILN_LAYOUT_IN_OUT | KILN_LAYOUT_ROUND_BIAS, db, R, I, O, -1, dy, NULL,
                                             KILN_DTYPE_BF16), KILN_OK);
    CU_ASSERT_EQUAL(stats().injected - s0.injected, 1u);
    CU_ASSERT_PTR_NOT_NULL(kiln_test_log_find(g_th, KILN_LOG_INFO, "no bias epilogue for a bfloat16 output"));
    env_clear();
    const fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(k->linear_forward_layout(acc, KILN_DTYPE_BF16, dx, dw, KILN_DTYPE_BF16,
                                             KILN_LAYOUT_IN_OUT | KILN_LAYOUT_ROUND_BIAS, db, R, I, O, -1, dy, NULL,
                                             KILN_DTYPE_BF16), KILN_OK);
    CU_ASSERT_EQUAL(stats().matmuls_bias16 - s0.matmuls_bias16, 0u); /* scratch both times, */
    CU_ASSERT_EQUAL(stats().heuristics - s1.heuristics, 0u);         /* its plan cached      */
    CU_ASSERT_EQUAL(k->linear_forward_layout(acc, KILN_DTYPE_BF16, dx, dw, KILN_DTYPE_BF16, KILN_LAYOUT_IN_OUT, dq, R,
                                             I, O, -1, dy2, NULL, KILN_DTYPE_BF16), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, y[0], dy, sizeof y[0]) && down(k, acc, y[1], dy2, sizeof y[1]));
    CU_ASSERT_EQUAL(memcmp(y[0], y[1], sizeof y[0]), 0);
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
    CU_add_test(s, "create: no device", test_create_no_device);
    CU_add_test(s, "create: bad settings", test_create_bad_settings);
    CU_add_test(s, "configure: before use, again, moving", test_configure);
    CU_add_test(s, "configure: device 5 of 1 and of 2", test_configure_missing_device);
    CU_add_test(s, "configure: failing setup is released", test_configure_failure_releases);
    CU_add_test(s, "allocator: reuse, zero fill, best fit", test_alloc_reuse);
    CU_add_test(s, "allocator: out of memory, trim and retry", test_alloc_oom);
    CU_add_test(s, "copy: H2D through the staging ring", test_staging);
    CU_add_test(s, "copy: overlapping D2D is memmove; zero", test_copy_overlap);
    CU_add_test(s, "gemm: row-major mapping, transposes, ld", test_gemm_mapping);
    CU_add_test(s, "gemm: K = 0", test_gemm_k0);
    CU_add_test(s, "1.3: linear_forward epilogues, unscale_check launches", test_fused_launches);
    CU_add_test(s, "loss backward trusts its forward's label check until written", test_xent_backward_trusts_forward);
    CU_add_test(s, "gemm: tf32 setting", test_gemm_tf32);
    CU_add_test(s, "gemm: alignment and the plan cache", test_gemm_alignment_and_plans);
    CU_add_test(s, "gemm_ex: F32 x BF16 rounded to BF16, beta 1, ldc > N", test_gemm_ex_mixed_bf16);
    CU_add_test(s, "gemm_ex: F64; F16 x BF16", test_gemm_ex_f64_and_f16_bf16);
    CU_add_test(s, "gemm_ex: F32 operands rounded as autocast, on the tensor cores", test_gemm_ex_rounds_f32_operands);
    CU_add_test(s, "1.6 gemm_ex into a bfloat16 C: one 16-bit matmul, rounded once; K = 0", test_gemm_ex_c16);
    CU_add_test(s, "loss and reductions read back", test_loss_and_reductions);
    CU_add_test(s, "failing CUDA/cuBLAS calls become messages", test_failing_calls);
    CU_add_test(s, "softmax_xent_backward refuses a bad label", test_xent_backward_bad_label);
    CU_add_test(s, "gemm: workspace_mib = 0", test_gemm_no_workspace);
    CU_add_test(s, "destroy returns everything", test_destroy_releases_all);
    CU_add_test(s, "configure: refused again after a failed one", test_configure_retry_after_failure);
    CU_add_test(s, "allocator: a failed trim keeps the block table", test_trim_partial_failure);
    CU_add_test(s, "entries make the instance's device current", test_device_made_current);
    CU_add_test(s, "destroy waits for queued GEMMs before the cuBLASLt handle", test_destroy_after_unwaited_gemm);
    CU_add_test(s, "scratch grown inside entries is not zero-filled", test_scratch_not_zeroed);
    CU_add_test(s, "1.4: tokens read back once, buckets uploaded, xent_fused waits once", test_seq_tokens_memo);
    CU_add_test(s, "attention = flash: fused programs, or the gemm path when it cannot", test_attention_flash_dispatch);
    CU_add_test(s, "1.7: 16-bit activation storage equals the float32 call rounded", test_act16_entries);
    CU_add_test(s, "1.7: the shared 16-bit storage cases (act16_cases.h)", test_act16_shared);
    CU_add_test(s, "1.8: KILN_LAYOUT_ROUND_BIAS = the call with the bias rounded first", test_bias_round);
    CU_add_test(s, "1.8: no 16-bit bias epilogue on the device: float32 scratch, same bits", test_bias_round_fallback);
}

#include "cunit_main.h"
