/*
 * adamw_many_cases.h — the ABI 1.10 contract of adamw_update_many, checked
 * on any kernel table through its own alloc/copy entries, so the cpu
 * accelerator, the fake GPU and the device suite are held to the same
 * cases: a list of tensors of mixed sizes (empty, one element, a bias, a
 * few blocks' worth, one larger than a launch's grid) with different
 * weight decays, three steps, in float32 and float64. After every step each
 * tensor's p, m and v have the bits of the per-tensor entry on a second
 * copy: adamw_update_ex with the same double hyperparameters, and for
 * float32 also adamw_update with float ones (the list given the floats'
 * values, as the adamw plugin gives them). Then the refusals the contract
 * implies (a 16-bit dtype, step 0, a NULL array, a NULL tensor with
 * elements), each KILN_E_INVALID_ARG, and an empty list that touches
 * nothing.
 *
 *   adamw_many_run_all(k, acc) — every case, as CUnit asserts.
 */
#ifndef KILN_TESTS_ADAMW_MANY_CASES_H
#define KILN_TESTS_ADAMW_MANY_CASES_H

#include <CUnit/CUnit.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

#include "test_rng.h"

#define AM_COUNT 6

/* One side's device buffers: p, m, v of every tensor (g is shared). */
typedef struct am_side {
    void *p[AM_COUNT], *m[AM_COUNT], *v[AM_COUNT];
} am_side;

/* Device buffer of n elements of esz bytes from host data (NULL: zeros). */
static void *am_upload(const kiln_kernels *k, kiln_instance *acc, const void *host, size_t bytes, int *ok) {
    void *d = NULL;
    if (!bytes || !*ok) return NULL;
    *ok &= k->alloc(acc, bytes, &d) == KILN_OK;
    if (*ok) *ok &= host ? k->copy(acc, d, host, bytes, KILN_COPY_H2D) == KILN_OK : k->zero(acc, d, bytes) == KILN_OK;
    return d;
}

/* Whether two device buffers of `bytes` hold the same bits. */
static int am_same(const kiln_kernels *k, kiln_instance *acc, const void *a, const void *b, size_t bytes) {
    if (!bytes) return 1;
    unsigned char *ha = malloc(bytes), *hb = malloc(bytes);
    int same = ha && hb && k->copy(acc, ha, a, bytes, KILN_COPY_D2H) == KILN_OK &&
               k->copy(acc, hb, b, bytes, KILN_COPY_D2H) == KILN_OK && memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    return same;
}

/* Three steps of the list against the per-tensor entry. float_hp (F32
 * only): the reference is adamw_update with float hyperparameters and the
 * list gets their values as doubles; otherwise both get the doubles. */
static void adamw_many_case(const kiln_kernels *k, kiln_instance *acc, uint32_t dt, int float_hp) {
    static const size_t sizes[AM_COUNT] = {0, 1, 768, 4099, 0, 70001};
    static const double wd[AM_COUNT] = {0.1, 0.1, 0.0, 0.01, 0.0, 0.1};
    double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8;
    if (float_hp) lr = (float)lr, b1 = (float)b1, b2 = (float)b2, eps = (float)eps;
    const size_t esz = kiln_dtype_size(dt);
    test_rng rng;
    test_rng_seed(&rng, 1100 + dt + 7 * (uint64_t)float_hp);
    am_side side[2];
    void *g[AM_COUNT];
    size_t n[AM_COUNT];
    int ok = 1;
    memset(side, 0, sizeof side);
    unsigned char *host = malloc(70001 * 8), *p5_start = malloc(70001 * 8);
    ok &= host && p5_start;
    for (int i = 0; i < AM_COUNT && ok; i++) {
        n[i] = sizes[i];
        for (size_t j = 0; j < n[i]; j++) {
            const double x = (test_rng_unit(&rng) - 0.5) * 2.0;
            if (dt == KILN_DTYPE_F32) ((float *)host)[j] = (float)x;
            else ((double *)host)[j] = x;
        }
        if (i == 5 && p5_start) memcpy(p5_start, host, n[i] * esz);
        for (int s = 0; s < 2; s++) {
            side[s].p[i] = am_upload(k, acc, host, n[i] * esz, &ok);
            side[s].m[i] = am_upload(k, acc, NULL, n[i] * esz, &ok);
            side[s].v[i] = am_upload(k, acc, NULL, n[i] * esz, &ok);
        }
        g[i] = am_upload(k, acc, NULL, n[i] * esz, &ok);
    }
    CU_ASSERT_FATAL(ok);
    for (int64_t step = 1; step <= 3; step++) {
        for (int i = 0; i < AM_COUNT && ok; i++) { /* this step's gradients, over several binades */
            for (size_t j = 0; j < n[i]; j++) {
                const double x = (test_rng_unit(&rng) - 0.5) * (j % 5 == 0 ? 10.0 : 1e-3);
                if (dt == KILN_DTYPE_F32) ((float *)host)[j] = (float)x;
                else ((double *)host)[j] = x;
            }
            if (n[i]) ok &= k->copy(acc, g[i], host, n[i] * esz, KILN_COPY_H2D) == KILN_OK;
        }
        CU_ASSERT_EQUAL(k->adamw_update_many(acc, dt, AM_COUNT, side[0].p, (const void *const *)g, side[0].m,
                                             side[0].v, n, wd, lr, b1, b2, eps, step),
                        KILN_OK);
        for (int i = 0; i < AM_COUNT; i++) {
            int32_t rc;
            if (float_hp)
                rc = k->adamw_update(acc, side[1].p[i], g[i], side[1].m[i], side[1].v[i], n[i], (float)lr, (float)b1,
                                     (float)b2, (float)eps, (float)wd[i], step);
            else
                rc = k->adamw_update_ex(acc, dt, side[1].p[i], g[i], side[1].m[i], side[1].v[i], n[i], lr, b1, b2, eps,
                                        wd[i], step);
            CU_ASSERT_EQUAL(rc, KILN_OK);
        }
        for (int i = 0; i < AM_COUNT; i++) {
            const size_t b = n[i] * esz;
            CU_ASSERT(am_same(k, acc, side[0].p[i], side[1].p[i], b));
            CU_ASSERT(am_same(k, acc, side[0].m[i], side[1].m[i], b));
            CU_ASSERT(am_same(k, acc, side[0].v[i], side[1].v[i], b));
        }
    }
    CU_ASSERT(ok);
    /* the update moved the parameters (a no-op list would pass the above) */
    if (ok && k->copy(acc, host, side[0].p[5], n[5] * esz, KILN_COPY_D2H) == KILN_OK)
        CU_ASSERT(memcmp(host, p5_start, n[5] * esz) != 0);
    /* refusals, each before anything is touched */
    void *const *P = side[0].p;
    const void *const *G = (const void *const *)g;
    CU_ASSERT_EQUAL(k->adamw_update_many(acc, dt, AM_COUNT, P, G, side[0].m, side[0].v, n, wd, lr, b1, b2, eps, 0),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->adamw_update_many(acc, dt, AM_COUNT, NULL, G, side[0].m, side[0].v, n, wd, lr, b1, b2, eps, 4),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->adamw_update_many(acc, dt, AM_COUNT, P, G, side[0].m, side[0].v, n, NULL, lr, b1, b2, eps, 4),
                    KILN_E_INVALID_ARG);
    void *saved = g[3];
    g[3] = NULL;
    CU_ASSERT_EQUAL(k->adamw_update_many(acc, dt, AM_COUNT, P, G, side[0].m, side[0].v, n, wd, lr, b1, b2, eps, 4),
                    KILN_E_INVALID_ARG);
    g[3] = saved;
    CU_ASSERT(am_same(k, acc, side[0].p[5], side[1].p[5], n[5] * esz)); /* still equal: nothing ran */
    for (int i = 0; i < AM_COUNT; i++) {
        for (int s = 0; s < 2; s++) k->free(acc, side[s].p[i]), k->free(acc, side[s].m[i]), k->free(acc, side[s].v[i]);
        k->free(acc, g[i]);
    }
    free(host), free(p5_start);
}

static void adamw_many_run_all(const kiln_kernels *k, kiln_instance *acc) {
    CU_ASSERT_FATAL(k->struct_size >= KILN_KERNELS_SIZE_1_10 && k->adamw_update_many);
    adamw_many_case(k, acc, KILN_DTYPE_F32, 0);
    adamw_many_case(k, acc, KILN_DTYPE_F32, 1);
    adamw_many_case(k, acc, KILN_DTYPE_F64, 0);
    /* an empty list is a no-op, with or without arrays */
    CU_ASSERT_EQUAL(k->adamw_update_many(acc, KILN_DTYPE_F32, 0, NULL, NULL, NULL, NULL, NULL, NULL, 1e-3, 0.9, 0.999,
                                         1e-8, 1),
                    KILN_OK);
    /* masters only: float32 or float64 */
    float *d = NULL;
    CU_ASSERT_EQUAL_FATAL(k->alloc(acc, 4 * 64, (void **)&d), KILN_OK);
    void *p[1] = {d}, *m[1] = {d + 16}, *v[1] = {d + 32};
    const void *g[1] = {d + 48};
    const size_t n[1] = {8};
    const double wd[1] = {0.0};
    CU_ASSERT_EQUAL(k->adamw_update_many(acc, KILN_DTYPE_BF16, 1, p, g, m, v, n, wd, 1e-3, 0.9, 0.999, 1e-8, 1),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->adamw_update_many(acc, KILN_DTYPE_F16, 1, p, g, m, v, n, wd, 1e-3, 0.9, 0.999, 1e-8, 1),
                    KILN_E_INVALID_ARG);
    k->free(acc, d);
}

#endif /* KILN_TESTS_ADAMW_MANY_CASES_H */
