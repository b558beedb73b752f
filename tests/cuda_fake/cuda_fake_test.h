/*
 * cuda_fake_test.h — what the four files of test_cuda_fake_unit share: the
 * test host and the loaded fake cuda plugin, the fake's counters, the
 * environment switches it reads, and the helpers that make an instance and
 * move data, all defined in test_cuda_fake.c. test_cuda_fake_gemm.c (the
 * GEMM mapping and gemm_ex), test_cuda_fake_seq.c (the 1.4 sequence
 * entries, 1.7's 16-bit storage, 1.8's rounded bias) and
 * test_cuda_fake_seal.c (the fake's sealed memory and collective order)
 * add their tests to the one suite that file registers; each test starts
 * from a clean environment (the suite's setup) and checks the fake saw no
 * contract violation unless it expects one.
 */
#ifndef KILN_TESTS_CUDA_FAKE_TEST_H
#define KILN_TESTS_CUDA_FAKE_TEST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "fake_cuda.h"
#include "half_bits.h"
#include <kiln/testing.h>

extern kiln_test_host *g_th;               /* the test host                       */
extern const kiln_plugin_desc *g_desc;     /* the fake build's cuda plugin        */
extern const kiln_accelerator_ops *g_ops;  /* and its ops                         */
extern unsigned long g_violations0;        /* the fake's violations at test start */
extern fake_cuda_hold_fn g_hold_fn;        /* the fake's exported fake_cuda_hold  */
extern const kiln_kv cfg_none[];           /* an empty config                     */

/* What the plugin asked of "the GPU" so far (fake_cuda_get_stats). */
fake_cuda_stats stats(void);
/* KILN_FAKE_CUDA_* switches: all cleared, one set (a string or a size). */
void env_clear(void);
void env_set(const char *name, const char *value);
void env_set_size(const char *name, size_t v);
/* create(cfg) into *acc: the status. */
int32_t make(const kiln_kv *cfg, kiln_instance **acc);
/* A created and configured instance (device 0) and its table, or NULL
 * after a failed assertion. */
kiln_instance *ready(const kiln_kv *cfg, const kiln_kernels **k);
/* A device copy of host(bytes) (host NULL: uninitialised), or NULL. */
void *up(const kiln_kernels *k, kiln_instance *acc, const void *host, size_t bytes);
/* host(bytes) = dev(bytes) after everything queued has run; 0 on failure. */
int down(const kiln_kernels *k, kiln_instance *acc, void *host, const void *dev, size_t bytes);
/* Deterministic values in [-1, 1). */
float val(unsigned i, unsigned salt);
/* float32 -> bfloat16 bits (nearest even) and the value they hold. */
uint16_t bf16_bits(float x);
float round_bf16(float x);
/* Everything the instances took is back to `before`. */
void check_released(const fake_cuda_stats *before);

/* The tests of the other two files, added to the suite s. */
void cuda_fake_gemm_tests(CU_pSuite s);
void cuda_fake_seq_tests(CU_pSuite s);
void cuda_fake_seal_tests(CU_pSuite s);

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

#endif /* KILN_TESTS_CUDA_FAKE_TEST_H */
