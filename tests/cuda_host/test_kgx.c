/*
 * test_kgx.c — the host execution of CUDA kernels (kgx.cpp) checked on
 * kernels written for the purpose (kgx_selftest.cu): what is written right
 * computes the right values with no complaint, and each mistake a GPU
 * would punish — a missing barrier, a shuffle naming lanes that have
 * returned, threads of a warp at different barriers, shared memory read
 * before it was written, blocks racing on one output, a launch CUDA
 * refuses, a host pointer — fails its launch with the message kgx.cpp
 * promises. Device memory comes from the fake CUDA runtime
 * (tests/cuda_fake/fake_cudart.c, linked in), whose violation counter and
 * last message the cases read.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>
#include <cuda_runtime_api.h>

#include "fake_internal.h"

cudaError_t st_tree_sum(const float *x, float *out, int blocks, int barrier);
cudaError_t st_warp_sum(const float *x, float *out, int warps, int half_exit);
cudaError_t st_split_barriers(float *out);
cudaError_t st_stale_shared(float *out, int blocks, int wrote);
cudaError_t st_dyn_reverse(const float *x, float *out, int n, size_t smem);
cudaError_t st_block_race(int *out, int blocks);
cudaError_t st_min_found(int *best, int blocks, int every);
cudaError_t st_axpy(const float *x, float *y, size_t n, unsigned grid, unsigned bx, unsigned by);

/* n floats on the "device", copied from host values (NULL: left as
 * cudaMalloc's fill). */
static float *dev_floats(const float *h, size_t n) {
    void *d = NULL;
    CU_ASSERT_FATAL(cudaMalloc(&d, n * sizeof(float)) == cudaSuccess);
    if (h) CU_ASSERT_FATAL(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    return d;
}

static void to_host(void *h, const void *d, size_t bytes) {
    CU_ASSERT_FATAL(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
}

static unsigned long violations0;

/* The launch failed with e, one violation was reported, and its message
 * holds `what`. */
static void expect_failure(cudaError_t got, cudaError_t e, const char *what) {
    CU_ASSERT_EQUAL(got, e);
    CU_ASSERT_EQUAL(fake_stats.violations, violations0 + 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(fake_stats.last_violation, what));
    if (!strstr(fake_stats.last_violation, what))
        fprintf(stderr, "\nexpected \"%s\" in: %s\n", what, fake_stats.last_violation);
    violations0 = fake_stats.violations;
}

static void expect_clean(cudaError_t got) {
    CU_ASSERT_EQUAL(got, cudaSuccess);
    CU_ASSERT_EQUAL(fake_stats.violations, violations0);
    if (fake_stats.violations != violations0) fprintf(stderr, "\nunexpected: %s\n", fake_stats.last_violation);
    violations0 = fake_stats.violations;
}

/* Values whose float sums are exact in any order: small integers. */
static void fill_ints(float *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = (float)((i * 7 + 3) % 11) - 5.0f;
}

static void test_tree_sum(void) {
    enum { B = 3, N = 256 * B };
    float h[N], want[B] = {0}, got[B];
    fill_ints(h, N);
    for (int i = 0; i < N; i++) want[i / 256] += h[i];
    float *x = dev_floats(h, N), *out = dev_floats(NULL, B);
    expect_clean(st_tree_sum(x, out, B, 1));
    to_host(got, out, sizeof got);
    for (int b = 0; b < B; b++) CU_ASSERT_EQUAL(got[b], want[b]);
    /* without barriers, thread 0 adds s[128] before thread 128 stored it
     * when threads run in order, and after when reversed */
    expect_failure(st_tree_sum(x, out, B, 0), cudaErrorLaunchFailure, "depends on the order");
    cudaFree(x), cudaFree(out);
}

static void test_warp_sum(void) {
    enum { W = 4, N = 32 * W };
    float h[N], want[W] = {0}, got[W];
    fill_ints(h, N);
    for (int i = 0; i < N; i++) want[i / 32] += h[i];
    float *x = dev_floats(h, N), *out = dev_floats(NULL, W);
    expect_clean(st_warp_sum(x, out, W, 0));
    to_host(got, out, sizeof got);
    for (int w = 0; w < W; w++) CU_ASSERT_EQUAL(got[w], want[w]);
    expect_failure(st_warp_sum(x, out, W, 1), cudaErrorLaunchFailure, "names lanes that have exited (0xffff0000)");
    cudaFree(x), cudaFree(out);
}

static void test_split_barriers(void) {
    float *out = dev_floats(NULL, 64);
    expect_failure(st_split_barriers(out), cudaErrorLaunchFailure, "deadlocks");
    cudaFree(out);
}

static void test_stale_shared(void) {
    enum { B = 3 };
    float got[B];
    float *out = dev_floats(NULL, B);
    expect_clean(st_stale_shared(out, B, 1));
    to_host(got, out, sizeof got);
    for (int b = 0; b < B; b++) CU_ASSERT_EQUAL(got[b], (float)b);
    /* never written in the block: 0xff bytes, in every block (block 1 does
     * not see the 7 block 0 left) */
    expect_clean(st_stale_shared(out, B, 0));
    uint32_t bits[B];
    to_host(bits, out, sizeof bits);
    for (int b = 0; b < B; b++) CU_ASSERT_EQUAL(bits[b], 0xffffffffu);
    cudaFree(out);
}

static void test_dynamic_shared(void) {
    enum { N = 128 };
    float h[N], got[N];
    fill_ints(h, N);
    float *x = dev_floats(h, N), *out = dev_floats(NULL, N);
    expect_clean(st_dyn_reverse(x, out, N, N * sizeof(float)));
    to_host(got, out, sizeof got);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(got[i], h[N - 1 - i]);
    expect_failure(st_dyn_reverse(x, out, N, (48 << 10) + 4), cudaErrorInvalidConfiguration, "48 KiB");
    cudaFree(x), cudaFree(out);
}

static void test_block_race(void) {
    int *out = NULL, *best = NULL;
    CU_ASSERT_FATAL(cudaMalloc((void **)&out, sizeof *out) == cudaSuccess);
    CU_ASSERT_FATAL(cudaMalloc((void **)&best, sizeof *best) == cudaSuccess);
    expect_failure(st_block_race(out, 8), cudaErrorLaunchFailure, "depends on the order");
    /* a race whose every order gives the same answer is not one */
    const int none = -1;
    CU_ASSERT_FATAL(cudaMemcpy(best, &none, sizeof none, cudaMemcpyHostToDevice) == cudaSuccess);
    expect_clean(st_min_found(best, 40, 7));
    int got;
    to_host(&got, best, sizeof got);
    CU_ASSERT_EQUAL(got, 6);
    cudaFree(out), cudaFree(best);
}

static void test_launch_checks(void) {
    enum { N = 1000 };
    float h[N], got[N];
    fill_ints(h, N);
    float *x = dev_floats(h, N), *y = dev_floats(NULL, N);
    /* 3 blocks of 8 x 16: the grid-stride loop goes round more than once */
    expect_clean(st_axpy(x, y, N, 3, 8, 16));
    to_host(got, y, sizeof got);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(got[i], 2.0f * h[i] + (float)i);
    expect_failure(st_axpy(x, y, N, 1, 64, 32), cudaErrorInvalidConfiguration, "block (64,32,1)");
    expect_failure(st_axpy(x, y, N, 0, 32, 1), cudaErrorInvalidConfiguration, "grid (0,1,1)");
    float host[N];
    expect_failure(st_axpy(host, y, N, 1, 32, 1), cudaErrorIllegalAddress, "pointer argument 1");
    cudaFree(x), cudaFree(y);
}

static int suite_init(void) {
    setenv("KILN_FAKE_CUDA_QUIET", "1", 1);
    violations0 = fake_stats.violations;
    return 0;
}

static void register_tests(void) {
    static CU_TestInfo tests[] = {
        {"a shared-memory tree sum; without its barriers, caught", test_tree_sum},
        {"a warp butterfly; after half the warp returned, caught", test_warp_sum},
        {"threads of a warp at different barriers: a deadlock", test_split_barriers},
        {"shared memory unwritten in the block reads as 0xff bytes", test_stale_shared},
        {"dynamic shared memory, and over 48 KiB refused", test_dynamic_shared},
        {"blocks racing on one output, caught; an order-free race is not", test_block_race},
        {"grid strides and 2-D blocks; bad geometry and host pointers refused", test_launch_checks},
        CU_TEST_INFO_NULL,
    };
    static CU_SuiteInfo suites[] = {
        {"kgx: CUDA kernels run on the host", suite_init, NULL, NULL, NULL, tests},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
