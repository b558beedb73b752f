/*
 * sumsq_many_cases.h — the ABI 1.9 contract of sumsq_many, checked on any
 * kernel table through its own alloc/copy entries, so the cpu accelerator
 * and the fake GPU are held to the same cases: for a list of tensors of
 * mixed sizes (empty, one element, a bias, a few blocks' worth, one larger
 * than a reduction grid's first pass) in float32 and float64, each out[i]
 * has the bits of sumsq_ex on that tensor alone; an empty list touches
 * nothing; and the refusals the contract implies (a 16-bit dtype, a NULL
 * array, a NULL tensor with elements, a NULL out), each KILN_E_INVALID_ARG.
 *
 *   sumsq_many_run_all(k, acc) — every case, as CUnit asserts.
 */
#ifndef KILN_TESTS_SUMSQ_MANY_CASES_H
#define KILN_TESTS_SUMSQ_MANY_CASES_H

#include <CUnit/CUnit.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

#include "test_rng.h"

#define SM_COUNT 6

static void sumsq_many_dtype(const kiln_kernels *k, kiln_instance *acc, uint32_t dt) {
    static const size_t sizes[SM_COUNT] = {0, 1, 768, 4099, 0, 70001};
    const size_t esz = kiln_dtype_size(dt);
    test_rng rng;
    test_rng_seed(&rng, 1900 + dt);
    void *dev[SM_COUNT] = {0};
    const void *x[SM_COUNT];
    size_t n[SM_COUNT];
    int ok = 1;
    for (int i = 0; i < SM_COUNT; i++) {
        n[i] = sizes[i];
        x[i] = NULL; /* the empty ones stay NULL: allowed with n[i] == 0 */
        if (!n[i]) continue;
        void *host = malloc(n[i] * esz);
        ok &= host && k->alloc(acc, n[i] * esz, &dev[i]) == KILN_OK;
        for (size_t j = 0; ok && j < n[i]; j++) {
            /* values over several binades, both signs */
            double v = (test_rng_unit(&rng) - 0.5) * (j % 7 == 0 ? 300.0 : 0.01);
            if (dt == KILN_DTYPE_F32) ((float *)host)[j] = (float)v;
            else ((double *)host)[j] = v;
        }
        ok &= ok && k->copy(acc, dev[i], host, n[i] * esz, KILN_COPY_H2D) == KILN_OK;
        free(host);
        x[i] = dev[i];
    }
    CU_ASSERT_FATAL(ok);
    double out[SM_COUNT], one[SM_COUNT];
    for (int i = 0; i < SM_COUNT; i++) out[i] = -1.0; /* the empty ones must become 0 */
    CU_ASSERT_EQUAL(k->sumsq_many(acc, dt, x, n, SM_COUNT, out), KILN_OK);
    for (int i = 0; i < SM_COUNT; i++) {
        CU_ASSERT_EQUAL(k->sumsq_ex(acc, dt, x[i], n[i], &one[i]), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(&out[i], &one[i], sizeof out[i]), 0); /* the same bits */
        CU_ASSERT(n[i] == 0 ? out[i] == 0.0 : out[i] > 0.0);
    }
    /* a list in another order gives each tensor the same value */
    const void *xr[SM_COUNT];
    size_t nr[SM_COUNT];
    double outr[SM_COUNT];
    for (int i = 0; i < SM_COUNT; i++) xr[i] = x[SM_COUNT - 1 - i], nr[i] = n[SM_COUNT - 1 - i];
    CU_ASSERT_EQUAL(k->sumsq_many(acc, dt, xr, nr, SM_COUNT, outr), KILN_OK);
    for (int i = 0; i < SM_COUNT; i++) CU_ASSERT_EQUAL(memcmp(&outr[i], &out[SM_COUNT - 1 - i], sizeof outr[i]), 0);
    /* refusals */
    CU_ASSERT_EQUAL(k->sumsq_many(acc, dt, NULL, n, SM_COUNT, out), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->sumsq_many(acc, dt, x, NULL, SM_COUNT, out), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->sumsq_many(acc, dt, x, n, SM_COUNT, NULL), KILN_E_INVALID_ARG);
    const void *saved = x[2];
    x[2] = NULL;
    CU_ASSERT_EQUAL(k->sumsq_many(acc, dt, x, n, SM_COUNT, out), KILN_E_INVALID_ARG);
    x[2] = saved;
    for (int i = 0; i < SM_COUNT; i++) k->free(acc, dev[i]);
}

static void sumsq_many_run_all(const kiln_kernels *k, kiln_instance *acc) {
    CU_ASSERT_FATAL(k->struct_size >= KILN_KERNELS_SIZE_1_9 && k->sumsq_many);
    sumsq_many_dtype(k, acc, KILN_DTYPE_F32);
    sumsq_many_dtype(k, acc, KILN_DTYPE_F64);
    /* an empty list is a no-op, with or without arrays */
    CU_ASSERT_EQUAL(k->sumsq_many(acc, KILN_DTYPE_F32, NULL, NULL, 0, NULL), KILN_OK);
    /* the list holds gradients: float32 or float64 only */
    float *d = NULL;
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, 64, (void **)&d), KILN_OK);
    const void *x[1] = {d};
    const size_t n[1] = {8};
    double out[1];
    CU_ASSERT_EQUAL(k->sumsq_many(acc, KILN_DTYPE_BF16, x, n, 1, out), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->sumsq_many(acc, KILN_DTYPE_F16, x, n, 1, out), KILN_E_INVALID_ARG);
    k->free(acc, d);
}

#endif /* KILN_TESTS_SUMSQ_MANY_CASES_H */
