/*
 * add_ln_cases.h — the ABI 1.10 contract of add_layernorm_forward, checked
 * on any kernel table through its own alloc/copy entries, so the cpu
 * accelerator, the fake GPU and the device suite are held to the same
 * cases: for float32 (unrounded and rounded to bfloat16), float64 and, on a
 * table with KILN_KERNELS_ACT_16BIT, bfloat16 and float16 storage of b and
 * y, the fused entry's res, y, mean and rstd have the bits of add followed
 * by layernorm_forward on the same inputs; also with res == a (the sum
 * written over the residual stream it extends) and without w and bias.
 * Then the refusals: y over a, y over b, mean over a, a NULL b, a bad
 * round_dtype, each KILN_E_INVALID_ARG with res untouched; and N = 0, which
 * touches nothing.
 *
 *   add_ln_run_all(k, acc) — every case, as CUnit asserts.
 */
#ifndef KILN_TESTS_ADD_LN_CASES_H
#define KILN_TESTS_ADD_LN_CASES_H

#include <CUnit/CUnit.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

#include "test_rng.h"

/* A device buffer of `bytes` holding host (NULL: zeros). */
static void *al_dev(const kiln_kernels *k, kiln_instance *acc, const void *host, size_t bytes, int *ok) {
    void *d = NULL;
    if (!*ok) return NULL;
    *ok &= k->alloc(acc, bytes, &d) == KILN_OK;
    if (*ok) *ok &= host ? k->copy(acc, d, host, bytes, KILN_COPY_H2D) == KILN_OK : k->zero(acc, d, bytes) == KILN_OK;
    return d;
}

/* Whether device buffers a and b of `bytes` hold the same bits. */
static int al_same(const kiln_kernels *k, kiln_instance *acc, const void *a, const void *b, size_t bytes) {
    unsigned char *ha = malloc(bytes), *hb = malloc(bytes);
    int same = ha && hb && k->copy(acc, ha, a, bytes, KILN_COPY_D2H) == KILN_OK &&
               k->copy(acc, hb, b, bytes, KILN_COPY_D2H) == KILN_OK && memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    return same;
}

/* Random values in storage dtype dt (F32, F64, or 16 bits through a
 * float32 cast on the host: kiln's own rounding is not needed, any bits
 * of the format will do, so the top half of a float32 is taken). */
static void al_fill(test_rng *r, void *h, uint32_t dt, size_t n, double scale, double shift) {
    for (size_t i = 0; i < n; i++) {
        const double v = (test_rng_unit(r) - 0.5) * scale + shift;
        if (dt == KILN_DTYPE_F64) ((double *)h)[i] = v;
        else {
            const float f = (float)v;
            if (dt == KILN_DTYPE_F32) ((float *)h)[i] = f;
            else if (dt == KILN_DTYPE_BF16) {
                uint32_t u;
                memcpy(&u, &f, sizeof u);
                ((uint16_t *)h)[i] = (uint16_t)(u >> 16);
            } else { /* float16: a small integer or half-integer, exact in it */
                const float q = (float)((int)(v * 2.0)) / 2.0f;
                uint16_t hb = 0;
                if (q != 0.0f) {
                    uint32_t u;
                    memcpy(&u, &q, sizeof u);
                    const uint32_t sign = (u >> 16) & 0x8000u, e = (u >> 23) & 0xffu, m = u & 0x7fffffu;
                    hb = (uint16_t)(sign | ((e - 127 + 15) << 10) | (m >> 13));
                }
                ((uint16_t *)h)[i] = hb;
            }
        }
    }
}

/* One case: dtype dt (the storage of b and y), round_dtype rd, N rows of C,
 * with or without w and bias, res == a when alias. */
static void al_case(const kiln_kernels *k, kiln_instance *acc, uint32_t dt, uint32_t rd, int32_t N, int32_t C,
                    int affine, int alias) {
    const int s16 = dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16;
    const uint32_t mdt = s16 ? KILN_DTYPE_F32 : dt; /* a, res, mean, rstd, w, bias */
    const size_t n = (size_t)N * (size_t)C, me = kiln_dtype_size(mdt), se = kiln_dtype_size(dt);
    test_rng rng;
    test_rng_seed(&rng, 1010 + 17 * dt + 5 * rd + (uint64_t)alias);
    unsigned char *ha = malloc(n * me), *hb = malloc(n * se);
    unsigned char *hw = malloc((size_t)C * me), *hc = malloc((size_t)C * me);
    int ok = ha && hb && hw && hc;
    CU_ASSERT_FATAL(ok);
    al_fill(&rng, ha, mdt, n, 4.0, 0.3);
    al_fill(&rng, hb, dt, n, 2.0, -0.1);
    al_fill(&rng, hw, mdt, (size_t)C, 0.5, 1.0);
    al_fill(&rng, hc, mdt, (size_t)C, 0.2, 0.0);
    void *a1 = al_dev(k, acc, ha, n * me, &ok), *a2 = al_dev(k, acc, ha, n * me, &ok);
    void *b = al_dev(k, acc, hb, n * se, &ok);
    void *w = affine ? al_dev(k, acc, hw, (size_t)C * me, &ok) : NULL;
    void *bias = affine ? al_dev(k, acc, hc, (size_t)C * me, &ok) : NULL;
    void *r1 = alias ? a1 : al_dev(k, acc, NULL, n * me, &ok), *r2 = alias ? a2 : al_dev(k, acc, NULL, n * me, &ok);
    void *y1 = al_dev(k, acc, NULL, n * se, &ok), *y2 = al_dev(k, acc, NULL, n * se, &ok);
    void *m1 = al_dev(k, acc, NULL, (size_t)N * me, &ok), *m2 = al_dev(k, acc, NULL, (size_t)N * me, &ok);
    void *s1 = al_dev(k, acc, NULL, (size_t)N * me, &ok), *s2 = al_dev(k, acc, NULL, (size_t)N * me, &ok);
    CU_ASSERT_FATAL(ok);
    const double eps = 1e-5;
    CU_ASSERT_EQUAL(k->add_layernorm_forward(acc, dt, r1, a1, b, y1, m1, s1, w, bias, N, C, eps, rd), KILN_OK);
    CU_ASSERT_EQUAL(k->add(acc, dt, r2, a2, b, n), KILN_OK);
    CU_ASSERT_EQUAL(k->layernorm_forward(acc, dt, y2, m2, s2, r2, w, bias, N, C, eps, rd), KILN_OK);
    CU_ASSERT(al_same(k, acc, r1, r2, n * me));
    CU_ASSERT(al_same(k, acc, y1, y2, n * se));
    CU_ASSERT(al_same(k, acc, m1, m2, (size_t)N * me));
    CU_ASSERT(al_same(k, acc, s1, s2, (size_t)N * me));
    /* the sum is really there: res is not a */
    if (!alias) CU_ASSERT(!al_same(k, acc, r1, a1, n * me));
    /* refusals, res left as it was: save it, make it differ, try, compare */
    if (!alias && affine) {
        CU_ASSERT_EQUAL(k->zero(acc, r1, n * me), KILN_OK);
        CU_ASSERT_EQUAL(k->add_layernorm_forward(acc, dt, r1, a1, b, a1, m1, s1, w, bias, N, C, eps, rd),
                        KILN_E_INVALID_ARG); /* y over a */
        CU_ASSERT_EQUAL(k->add_layernorm_forward(acc, dt, r1, a1, b, b, m1, s1, w, bias, N, C, eps, rd),
                        KILN_E_INVALID_ARG); /* y over b */
        CU_ASSERT_EQUAL(k->add_layernorm_forward(acc, dt, r1, a1, b, y1, a1, s1, w, bias, N, C, eps, rd),
                        KILN_E_INVALID_ARG); /* mean over a */
        CU_ASSERT_EQUAL(k->add_layernorm_forward(acc, dt, r1, a1, NULL, y1, m1, s1, w, bias, N, C, eps, rd),
                        KILN_E_INVALID_ARG); /* no b */
        CU_ASSERT_EQUAL(k->add_layernorm_forward(acc, dt, r1, a1, b, y1, m1, s1, w, bias, N, C, eps,
                                                 dt == KILN_DTYPE_F64 ? KILN_DTYPE_BF16 : KILN_DTYPE_F64),
                        KILN_E_INVALID_ARG); /* round_dtype */
        void *zeros = al_dev(k, acc, NULL, n * me, &ok);
        CU_ASSERT(ok && al_same(k, acc, r1, zeros, n * me)); /* nothing was written */
        /* no rows: nothing to do, nothing touched */
        CU_ASSERT_EQUAL(k->add_layernorm_forward(acc, dt, r1, a1, b, y1, m1, s1, w, bias, 0, C, eps, rd), KILN_OK);
        CU_ASSERT(al_same(k, acc, r1, zeros, n * me));
        k->free(acc, zeros);
    }
    void *bufs[] = {a1, a2, b, w, bias, alias ? NULL : r1, alias ? NULL : r2, y1, y2, m1, m2, s1, s2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) k->free(acc, bufs[i]);
    free(ha), free(hb), free(hw), free(hc);
}

static void add_ln_run_all(const kiln_kernels *k, kiln_instance *acc) {
    CU_ASSERT_FATAL(k->struct_size >= KILN_KERNELS_SIZE_1_10 && k->add_layernorm_forward);
    /* 37 rows of 100: rows do not fill a block's warps, columns not a warp's lanes */
    for (int alias = 0; alias < 2; alias++) {
        al_case(k, acc, KILN_DTYPE_F32, KILN_DTYPE_F32, 37, 100, 1, alias);
        al_case(k, acc, KILN_DTYPE_F64, KILN_DTYPE_F32, 37, 100, 1, alias);
    }
    al_case(k, acc, KILN_DTYPE_F32, KILN_DTYPE_BF16, 37, 100, 1, 0);
    al_case(k, acc, KILN_DTYPE_F32, KILN_DTYPE_F32, 5, 768, 0, 0);
    if (k->flags & KILN_KERNELS_ACT_16BIT) {
        al_case(k, acc, KILN_DTYPE_BF16, KILN_DTYPE_BF16, 37, 100, 1, 0);
        al_case(k, acc, KILN_DTYPE_BF16, KILN_DTYPE_BF16, 37, 100, 1, 1);
        al_case(k, acc, KILN_DTYPE_F16, KILN_DTYPE_F16, 37, 100, 1, 0);
    }
}

#endif /* KILN_TESTS_ADD_LN_CASES_H */
