/*
 * bwd_fuse_cases.h — the ABI 1.11 contract of act_bias_backward and
 * layernorm_backward_cast, checked on any kernel table through its own
 * alloc/copy entries, so the cpu accelerator, the fake GPU and the device
 * suite are held to the same cases:
 *
 *   act_bias_backward: for each activation, in float32, float64 and, on a
 *   table with KILN_KERNELS_ACT_16BIT, bfloat16 and float16 storage, dx
 *   and db have the bits of act_backward then bias_grad_ex over its dx:
 *   with dx apart from dy and dx == dy, db cleared or accumulated onto, in
 *   one part of rows and in several (the GPU's two-pass sum); db NULL is
 *   act_backward alone; rows = 0 clears db as bias_grad_ex does. Refusals
 *   (KILN_E_INVALID_ARG, dx untouched): db over dx, an unknown act, a NULL
 *   x.
 *
 *   layernorm_backward_cast: for float32 and 16-bit dy, each 16-bit copy
 *   format, with and without the affine weights, dx cleared or accumulated
 *   onto, dx, dw, db and the copy have the bits of layernorm_backward then
 *   cast. Refusals (dx untouched): dtype float64, a float32 copy, the copy
 *   over dx, a NULL copy; N = 0 touches nothing.
 *
 *   bwd_fuse_run_all(k, acc) — every case, as CUnit asserts.
 */
#ifndef KILN_TESTS_BWD_FUSE_CASES_H
#define KILN_TESTS_BWD_FUSE_CASES_H

#include "add_ln_cases.h" /* al_dev, al_same, al_fill */

/* act_bias_backward against act_backward + bias_grad_ex: storage dt, act,
 * rows x cols, dx over dy when alias, db accumulated onto when acc1. */
static void bf_act_case(const kiln_kernels *k, kiln_instance *acc, uint32_t dt, int32_t act, int32_t rows,
                        int32_t cols, int alias, int acc1) {
    const int s16 = dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16;
    const uint32_t bdt = s16 ? KILN_DTYPE_F32 : dt; /* db */
    const size_t n = (size_t)rows * (size_t)cols, se = kiln_dtype_size(dt), be = kiln_dtype_size(bdt);
    test_rng rng;
    test_rng_seed(&rng, 1111 + 13 * dt + 7 * (uint64_t)act + (uint64_t)rows + 3 * (uint64_t)alias);
    unsigned char *hy = malloc(n * se + 1), *hx = malloc(n * se + 1), *hb = malloc((size_t)cols * be + 1);
    int ok = hy && hx && hb;
    CU_ASSERT_FATAL(ok);
    al_fill(&rng, hy, dt, n, 2.0, 0.1);
    al_fill(&rng, hx, dt, n, 6.0, -0.2);
    al_fill(&rng, hb, bdt, (size_t)cols, 1.0, 0.5);
    void *dy1 = al_dev(k, acc, hy, n * se, &ok), *dy2 = al_dev(k, acc, hy, n * se, &ok);
    void *x = al_dev(k, acc, hx, n * se, &ok);
    void *dx1 = alias ? dy1 : al_dev(k, acc, NULL, n * se, &ok), *dx2 = alias ? dy2 : al_dev(k, acc, NULL, n * se, &ok);
    void *db1 = al_dev(k, acc, hb, (size_t)cols * be, &ok), *db2 = al_dev(k, acc, hb, (size_t)cols * be, &ok);
    CU_ASSERT_FATAL(ok);
    CU_ASSERT_EQUAL(k->act_bias_backward(acc, dt, act, dx1, db1, dy1, x, rows, cols, acc1), KILN_OK);
    CU_ASSERT_EQUAL(k->act_backward(acc, dt, act, dx2, dy2, x, n), KILN_OK);
    CU_ASSERT_EQUAL(k->bias_grad_ex(acc, dt, db2, dx2, rows, cols, acc1), KILN_OK);
    CU_ASSERT(al_same(k, acc, dx1, dx2, n * se));
    CU_ASSERT(al_same(k, acc, db1, db2, (size_t)cols * be));
    if (!alias && !acc1) {
        /* the bias gradient is really there */
        void *orig = al_dev(k, acc, hb, (size_t)cols * be, &ok);
        CU_ASSERT(ok && !al_same(k, acc, db1, orig, (size_t)cols * be));
        /* db NULL: act_backward alone (dx2 holds its result) */
        CU_ASSERT_EQUAL(k->zero(acc, dx1, n * se), KILN_OK);
        CU_ASSERT_EQUAL(k->act_bias_backward(acc, dt, act, dx1, NULL, dy1, x, rows, cols, 1), KILN_OK);
        CU_ASSERT(al_same(k, acc, dx1, dx2, n * se));
        /* refusals, dx untouched */
        CU_ASSERT_EQUAL(k->zero(acc, dx1, n * se), KILN_OK);
        void *zeros = al_dev(k, acc, NULL, n * se, &ok);
        CU_ASSERT_EQUAL(k->act_bias_backward(acc, dt, act, dx1, dx1, dy1, x, rows, cols, 1),
                        KILN_E_INVALID_ARG); /* db over dx */
        CU_ASSERT_EQUAL(k->act_bias_backward(acc, dt, 99, dx1, db1, dy1, x, rows, cols, 1), KILN_E_INVALID_ARG);
        CU_ASSERT_EQUAL(k->act_bias_backward(acc, dt, act, dx1, db1, dy1, NULL, rows, cols, 1), KILN_E_INVALID_ARG);
        CU_ASSERT(ok && al_same(k, acc, dx1, zeros, n * se));
        /* no rows: db cleared, as bias_grad_ex clears it */
        CU_ASSERT_EQUAL(k->act_bias_backward(acc, dt, act, dx1, db1, dy1, x, 0, cols, 0), KILN_OK);
        CU_ASSERT_EQUAL(k->bias_grad_ex(acc, dt, db2, dx2, 0, cols, 0), KILN_OK);
        CU_ASSERT(al_same(k, acc, db1, db2, (size_t)cols * be));
        k->free(acc, zeros), k->free(acc, orig);
    }
    void *bufs[] = {dy1, dy2, x, alias ? NULL : dx1, alias ? NULL : dx2, db1, db2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) k->free(acc, bufs[i]);
    free(hy), free(hx), free(hb);
}

/* layernorm_backward_cast against layernorm_backward + cast: dy stored in
 * dt (F32 or 16 bits), the copy in ct, N x C, affine or not, accumulate. */
static void bf_ln_case(const kiln_kernels *k, kiln_instance *acc, uint32_t dt, uint32_t ct, int32_t N, int32_t C,
                       int affine, int accumulate) {
    const size_t n = (size_t)N * (size_t)C, se = kiln_dtype_size(dt), f = sizeof(float);
    test_rng rng;
    test_rng_seed(&rng, 2222 + 11 * dt + 5 * ct + (uint64_t)accumulate + 2 * (uint64_t)affine);
    unsigned char *hx = malloc(n * f), *hy = malloc(n * se), *hd = malloc(n * f), *hw = malloc((size_t)C * f);
    unsigned char *hc = malloc((size_t)C * f);
    int ok = hx && hy && hd && hw && hc;
    CU_ASSERT_FATAL(ok);
    al_fill(&rng, hx, KILN_DTYPE_F32, n, 4.0, 0.3);
    al_fill(&rng, hy, dt, n, 2.0, -0.1);
    al_fill(&rng, hd, KILN_DTYPE_F32, n, 1.0, 0.0);
    al_fill(&rng, hw, KILN_DTYPE_F32, (size_t)C, 0.5, 1.0);
    al_fill(&rng, hc, KILN_DTYPE_F32, (size_t)C, 0.2, 0.0);
    void *x = al_dev(k, acc, hx, n * f, &ok), *dy = al_dev(k, acc, hy, n * se, &ok);
    void *w = affine ? al_dev(k, acc, hw, (size_t)C * f, &ok) : NULL;
    void *y = al_dev(k, acc, NULL, n * f, &ok), *mean = al_dev(k, acc, NULL, (size_t)N * f, &ok);
    void *rstd = al_dev(k, acc, NULL, (size_t)N * f, &ok);
    void *dx1 = al_dev(k, acc, hd, n * f, &ok), *dx2 = al_dev(k, acc, hd, n * f, &ok);
    void *dw1 = affine ? al_dev(k, acc, hc, (size_t)C * f, &ok) : NULL;
    void *dw2 = affine ? al_dev(k, acc, hc, (size_t)C * f, &ok) : NULL;
    void *db1 = affine ? al_dev(k, acc, hw, (size_t)C * f, &ok) : NULL;
    void *db2 = affine ? al_dev(k, acc, hw, (size_t)C * f, &ok) : NULL;
    void *c1 = al_dev(k, acc, NULL, n * 2, &ok), *c2 = al_dev(k, acc, NULL, n * 2, &ok);
    CU_ASSERT_FATAL(ok);
    /* the statistics of x, as a forward leaves them */
    CU_ASSERT_EQUAL(k->layernorm_forward(acc, KILN_DTYPE_F32, y, mean, rstd, x, w, NULL, N, C, 1e-5, KILN_DTYPE_F32),
                    KILN_OK);
    CU_ASSERT_EQUAL(k->layernorm_backward_cast(acc, dt, dx1, dw1, db1, dy, x, w, mean, rstd, N, C, accumulate, c1, ct),
                    KILN_OK);
    CU_ASSERT_EQUAL(k->layernorm_backward(acc, dt, dx2, dw2, db2, dy, x, w, mean, rstd, N, C, accumulate), KILN_OK);
    CU_ASSERT_EQUAL(k->cast(acc, c2, ct, dx2, KILN_DTYPE_F32, n), KILN_OK);
    CU_ASSERT(al_same(k, acc, dx1, dx2, n * f));
    CU_ASSERT(al_same(k, acc, c1, c2, n * 2));
    if (affine) {
        CU_ASSERT(al_same(k, acc, dw1, dw2, (size_t)C * f));
        CU_ASSERT(al_same(k, acc, db1, db2, (size_t)C * f));
    }
    void *zeros = al_dev(k, acc, NULL, n * 2, &ok);
    CU_ASSERT(ok && !al_same(k, acc, c1, zeros, n * 2)); /* the copy is really there */
    if (affine && !accumulate && dt == KILN_DTYPE_F32) {
        /* refusals: nothing written (dx keeps what the call above left) */
        CU_ASSERT_EQUAL(k->layernorm_backward_cast(acc, KILN_DTYPE_F64, dx1, dw1, db1, dy, x, w, mean, rstd, N, C, 1,
                                                   c1, ct),
                        KILN_E_INVALID_ARG);
        CU_ASSERT_EQUAL(k->layernorm_backward_cast(acc, dt, dx1, dw1, db1, dy, x, w, mean, rstd, N, C, 1, c1,
                                                   KILN_DTYPE_F32),
                        KILN_E_INVALID_ARG);
        CU_ASSERT_EQUAL(k->layernorm_backward_cast(acc, dt, dx1, dw1, db1, dy, x, w, mean, rstd, N, C, 1, dx1, ct),
                        KILN_E_INVALID_ARG); /* the copy over dx */
        CU_ASSERT_EQUAL(k->layernorm_backward_cast(acc, dt, dx1, dw1, db1, dy, x, w, mean, rstd, N, C, 1, NULL, ct),
                        KILN_E_INVALID_ARG);
        CU_ASSERT(al_same(k, acc, dx1, dx2, n * f));
        CU_ASSERT(al_same(k, acc, dw1, dw2, (size_t)C * f));
        /* no rows: nothing to do, nothing touched */
        CU_ASSERT_EQUAL(k->layernorm_backward_cast(acc, dt, dx1, dw1, db1, dy, x, w, mean, rstd, 0, C, 1, c1, ct),
                        KILN_OK);
        CU_ASSERT(al_same(k, acc, dx1, dx2, n * f));
        CU_ASSERT(al_same(k, acc, c1, c2, n * 2));
    }
    void *bufs[] = {x, dy, w, y, mean, rstd, dx1, dx2, dw1, dw2, db1, db2, c1, c2, zeros};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) k->free(acc, bufs[i]);
    free(hx), free(hy), free(hd), free(hw), free(hc);
}

static void bwd_fuse_run_all(const kiln_kernels *k, kiln_instance *acc) {
    CU_ASSERT_FATAL(k->struct_size >= KILN_KERNELS_SIZE_1_11 && k->act_bias_backward && k->layernorm_backward_cast);
    const int act16 = (k->flags & KILN_KERNELS_ACT_16BIT) != 0;
    /* 37 rows: one part of the GPU's column sum; 700: three, through its
     * workspace; 100 columns do not fill its 32-column blocks */
    for (int32_t act = KILN_ACT_RELU; act <= KILN_ACT_LEAKY_RELU; act++) {
        bf_act_case(k, acc, KILN_DTYPE_F32, act, 37, 100, 0, 0);
        bf_act_case(k, acc, KILN_DTYPE_F64, act, 37, 100, 0, 0);
    }
    for (int alias = 0; alias < 2; alias++)
        for (int acc1 = 0; acc1 < 2; acc1++) {
            bf_act_case(k, acc, KILN_DTYPE_F32, KILN_ACT_GELU, 700, 100, alias, acc1);
            bf_act_case(k, acc, KILN_DTYPE_F64, KILN_ACT_TANH, 700, 100, alias, acc1);
            if (act16) {
                bf_act_case(k, acc, KILN_DTYPE_BF16, KILN_ACT_GELU, 700, 100, alias, acc1);
                bf_act_case(k, acc, KILN_DTYPE_F16, KILN_ACT_GELU, 37, 100, alias, acc1);
            }
        }
    for (int affine = 0; affine < 2; affine++)
        for (int accumulate = 0; accumulate < 2; accumulate++) {
            bf_ln_case(k, acc, KILN_DTYPE_F32, KILN_DTYPE_BF16, 37, 100, affine, accumulate);
            bf_ln_case(k, acc, KILN_DTYPE_F32, KILN_DTYPE_F16, 37, 100, affine, accumulate);
            if (act16) {
                bf_ln_case(k, acc, KILN_DTYPE_BF16, KILN_DTYPE_BF16, 37, 100, affine, accumulate);
                bf_ln_case(k, acc, KILN_DTYPE_F16, KILN_DTYPE_F16, 37, 100, affine, accumulate);
            }
        }
    bf_ln_case(k, acc, KILN_DTYPE_BF16, KILN_DTYPE_BF16, 300, 768, 1, 1); /* GPT-2's width, rows past a block */
}

#endif /* KILN_TESTS_BWD_FUSE_CASES_H */
