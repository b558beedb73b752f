/*
 * test_cuda_fake_seal.c — the fake CUDA runtime's own checks that only a
 * GPU would otherwise make (part of test_cuda_fake_unit; cuda_fake_test.h):
 * sealed device memory (copies both ways work, a host read of a device
 * pointer faults and the fault names the block, KILN_FAKE_CUDA_SEAL=0
 * turns it off) and the order it asks of a collective that takes device
 * memory from another stream (fake_cuda_hold: not before the host waited
 * for the accelerator's work on the buffer, and no accelerator work on the
 * bytes it holds). The faults are provoked in a forked child.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_fake_test.h"

/* A forked child reads one float at p: 0 when it exited normally, 1 when
 * it died (the read faulted), -1 when it could not be started; what it
 * wrote on stderr in err(cap). */
static int child_reads(const void *p, char *err, size_t cap) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        volatile float x = *(const volatile float *)p; /* the host read under test */
        (void)x;
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fds[0], err + n, cap - 1 - n)) > 0) n += (size_t)r;
    err[n] = 0;
    close(fds[0]);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1; /* 1: it faulted */
}

/* Host code reading device memory faults on a GPU; on the fake it would
 * pass unless the block is sealed (fake_cuda.h). A sealed block still goes
 * through every CUDA path (copies both ways), faults when the host reads
 * it, and the fault names the block; KILN_FAKE_CUDA_SEAL=0 turns it off. */
static void test_sealed_blocks(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const fake_cuda_stats s0 = stats();
    float host[64], back[64];
    for (int i = 0; i < 64; i++) host[i] = val((unsigned)i, 77);
    float *d = up(k, acc, host, sizeof host);
    CU_ASSERT_FATAL(d != NULL);
    CU_ASSERT(stats().mallocs > s0.mallocs);
    CU_ASSERT_EQUAL(stats().sealed_mallocs - s0.sealed_mallocs, stats().mallocs - s0.mallocs);
    CU_ASSERT_TRUE(down(k, acc, back, d, sizeof back));
    CU_ASSERT_EQUAL(memcmp(back, host, sizeof host), 0);
    char err[2048];
    CU_ASSERT_EQUAL(child_reads(d, err, sizeof err), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "fake cuda: contract violation"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "device block"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "by host code, outside any CUDA call"));
    k->free(acc, d);
    g_ops->base.destroy(acc);

    /* KILN_FAKE_CUDA_SEAL=0: the next instance's blocks are plain memory */
    env_set("KILN_FAKE_CUDA_SEAL", "0");
    acc = ready(NULL, &k);
    if (!acc) return;
    const fake_cuda_stats s1 = stats();
    d = up(k, acc, host, sizeof host);
    CU_ASSERT_FATAL(d != NULL);
    CU_ASSERT(stats().mallocs > s1.mallocs);
    CU_ASSERT_EQUAL(stats().sealed_mallocs, s1.sealed_mallocs);
    CU_ASSERT_TRUE(down(k, acc, back, d, sizeof back));
    CU_ASSERT_EQUAL(child_reads(d, err, sizeof err), 0);
    k->free(acc, d);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* What the fake NCCL relies on (fake_cuda_hold): a collective may take a
 * buffer only after the host waited for the accelerator's work on it, the
 * accelerator may not touch bytes a collective holds (other bytes of the
 * block it may), and a held block is open to the host (NCCL's "kernels"
 * are the fake's host code). Each rule has a violation that fires when it
 * is broken and stays quiet when it is kept. */
static void test_collective_order(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    env_set("KILN_FAKE_CUDA_QUIET", "1"); /* the violations below are expected */
    enum { N = 256 };
    static float host[2 * N];
    for (int i = 0; i < 2 * N; i++) host[i] = val((unsigned)i, 78);
    float *d = up(k, acc, host, sizeof host);
    CU_ASSERT_FATAL(d != NULL);
    const size_t half = N * sizeof(float);
    CU_ASSERT_EQUAL(k->scale(acc, d, 2.0f, 2 * N), KILN_OK);

    /* taken before the host waited for the scale: one violation */
    unsigned long v = stats().violations;
    g_hold_fn(d, half, 1);
    CU_ASSERT_EQUAL(stats().violations - v, 1);
    HAS(stats().last_violation, "has not been waited for");
    g_hold_fn(d, half, 0);

    /* after the wait: none; the held block is open to the host */
    CU_ASSERT_EQUAL(k->synchronize(acc), KILN_OK);
    v = stats().violations;
    g_hold_fn(d, half, 1);
    CU_ASSERT_EQUAL(stats().violations, v);
    char err[2048];
    CU_ASSERT_EQUAL(child_reads(d, err, sizeof err), 0);
    /* the other half of the block may be used meanwhile; the held half not */
    CU_ASSERT_EQUAL(k->scale(acc, d + N, 0.5f, N), KILN_OK);
    CU_ASSERT_EQUAL(stats().violations, v);
    CU_ASSERT_EQUAL(k->scale(acc, d + N / 2, 0.5f, N), KILN_OK);
    CU_ASSERT_EQUAL(stats().violations - v, 1);
    HAS(stats().last_violation, "while a collective still holds");
    g_hold_fn(d, half, 0);
    /* released: sealed again, and free to use */
    CU_ASSERT_EQUAL(child_reads(d, err, sizeof err), 1);
    v = stats().violations;
    CU_ASSERT_EQUAL(k->scale(acc, d, 1.0f, 2 * N), KILN_OK);
    CU_ASSERT_EQUAL(k->synchronize(acc), KILN_OK);
    CU_ASSERT_EQUAL(stats().violations, v);
    k->free(acc, d);
    g_ops->base.destroy(acc);
}

/* ============================================================ suite */

void cuda_fake_seal_tests(CU_pSuite s) {
    CU_add_test(s, "sealed device memory: copies work, a host read faults and names the block", test_sealed_blocks);
    CU_add_test(s, "collectives (fake_cuda_hold): after the wait, not on held bytes", test_collective_order);
}
