/*
 * act16_cases.h — the ABI 1.7 contract of 16-bit activation storage
 * (KILN_KERNELS_ACT_16BIT), checked on any kernel table through its own
 * alloc/copy entries, so the cpu accelerator and the fake GPU are held to
 * the same cases. For each of the eight entries and each 16-bit dtype, the
 * call on 16-bit buffers must equal, bit for bit, the float32 call on the
 * same values widened (exact), with each 16-bit output rounded to nearest
 * even as it is stored — the rounding done here by half_bits.h, not by the
 * table under test. Plus the refusals the contract names (round_dtype other
 * than dtype, w in the other 16-bit format, y over the 16-bit b of add) and
 * one acceptance the per-buffer sizes imply: a float32 buffer right after a
 * 16-bit one does not overlap it.
 *
 *   act16_run_all(k, acc) — every case, for BF16 and F16, as CUnit asserts.
 *
 * And ABI 1.8's KILN_LAYOUT_ROUND_BIAS (KILN_KERNELS_BIAS_ROUND): the
 * flagged linear_forward_layout equals the unflagged call given the bias
 * rounded here, with float32 and 16-bit storage:
 *
 *   bias_round_run_all(k, acc)
 */
#ifndef KILN_TESTS_ACT16_CASES_H
#define KILN_TESTS_ACT16_CASES_H

#include <CUnit/CUnit.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

#include "half_bits.h"
#include "test_rng.h"

/* One buffer on the accelerator with its host mirror. */
typedef struct {
    void *dev;
    void *host;
    size_t bytes;
} a16_buf;

typedef struct {
    const kiln_kernels *k;
    kiln_instance *acc;
    uint32_t dt;    /* F16 or BF16 */
    test_rng rng;
    int failed;     /* a set-up call failed */
} a16_ctx;

static a16_buf a16_new(a16_ctx *c, size_t bytes) {
    a16_buf b = {NULL, calloc(1, bytes ? bytes : 1), bytes};
    if (c->k->alloc(c->acc, bytes ? bytes : 1, &b.dev) != KILN_OK || !b.host) c->failed = 1;
    return b;
}
static void a16_free(a16_ctx *c, a16_buf *b) {
    if (b->dev) c->k->free(c->acc, b->dev);
    free(b->host);
}
static void a16_put(a16_ctx *c, a16_buf *b) {
    if (c->k->copy(c->acc, b->dev, b->host, b->bytes, KILN_COPY_H2D) != KILN_OK) c->failed = 1;
}
static void a16_get(a16_ctx *c, a16_buf *b) {
    if (c->k->synchronize(c->acc) != KILN_OK ||
        c->k->copy(c->acc, b->host, b->dev, b->bytes, KILN_COPY_D2H) != KILN_OK)
        c->failed = 1;
}

static float a16_uniform(a16_ctx *c, float lo, float hi) {
    return lo + (hi - lo) * (float)test_rng_unit(&c->rng);
}
/* float32 values */
static a16_buf a16_f32(a16_ctx *c, size_t n, float lo, float hi) {
    a16_buf b = a16_new(c, n * sizeof(float));
    for (size_t i = 0; b.host && i < n; i++) ((float *)b.host)[i] = a16_uniform(c, lo, hi);
    a16_put(c, &b);
    return b;
}
static int a16_bf(const a16_ctx *c) { return c->dt == KILN_DTYPE_BF16; }
static float a16_value(const a16_ctx *c, uint16_t h) {
    return a16_bf(c) ? hb_bf16_value(h) : (float)hb_f16_value(h);
}
/* 16-bit values in c->dt, and their float32 widening (*wide, same n) */
static a16_buf a16_h16(a16_ctx *c, size_t n, float lo, float hi, a16_buf *wide) {
    a16_buf b = a16_new(c, n * 2);
    *wide = a16_new(c, n * sizeof(float));
    for (size_t i = 0; b.host && wide->host && i < n; i++) {
        const uint16_t h = hb_round16(a16_bf(c), a16_uniform(c, lo, hi));
        ((uint16_t *)b.host)[i] = h;
        ((float *)wide->host)[i] = a16_value(c, h);
    }
    a16_put(c, &b);
    a16_put(c, wide);
    return b;
}

/* The 16-bit output `got` (n) against the float32 reference `ref` rounded
 * here; both copied back first. Counts mismatches, reports the first. */
static void a16_same16(a16_ctx *c, a16_buf *got, a16_buf *ref, size_t n, const char *what) {
    a16_get(c, got);
    a16_get(c, ref);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const uint16_t want = hb_round16(a16_bf(c), ((const float *)ref->host)[i]);
        if (((const uint16_t *)got->host)[i] != want && bad++ == 0) first = i;
    }
    if (bad)
        printf("\n  %s (%s): %zu of %zu differ, first at %zu: 0x%04x, want 0x%04x", what, kiln_dtype_name(c->dt), bad,
               n, first, ((const uint16_t *)got->host)[first],
               hb_round16(a16_bf(c), ((const float *)ref->host)[first]));
    CU_ASSERT_EQUAL(bad, 0);
}
/* float32 outputs: the same bits */
static void a16_same32(a16_ctx *c, a16_buf *got, a16_buf *ref, const char *what) {
    a16_get(c, got);
    a16_get(c, ref);
    const int same = got->bytes == ref->bytes && memcmp(got->host, ref->host, got->bytes) == 0;
    if (!same) printf("\n  %s (%s): float32 outputs differ", what, kiln_dtype_name(c->dt));
    CU_ASSERT(same);
}

/* ---------------------------------------------------------------- cases */

static void a16_layernorm(a16_ctx *c) {
    const int N = 7, C = 40;
    const size_t n = (size_t)N * C;
    a16_buf x = a16_f32(c, n, -2, 3), w = a16_f32(c, C, 0.5f, 1.5f), b = a16_f32(c, C, -0.5f, 0.5f);
    a16_buf y16 = a16_new(c, n * 2), y32 = a16_new(c, n * 4), m = a16_new(c, N * 4), r = a16_new(c, N * 4),
            m2 = a16_new(c, N * 4), r2 = a16_new(c, N * 4);
    if (c->failed) goto out;
    CU_ASSERT_EQUAL(c->k->layernorm_forward(c->acc, c->dt, y16.dev, m.dev, r.dev, x.dev, w.dev, b.dev, N, C, 1e-5,
                                            c->dt), KILN_OK);
    CU_ASSERT_EQUAL(c->k->layernorm_forward(c->acc, KILN_DTYPE_F32, y32.dev, m2.dev, r2.dev, x.dev, w.dev, b.dev, N,
                                            C, 1e-5, c->dt), KILN_OK);
    a16_same16(c, &y16, &y32, n, "layernorm_forward y");
    a16_same32(c, &m, &m2, "layernorm_forward mean");
    a16_same32(c, &r, &r2, "layernorm_forward rstd");
    /* the store is the rounding: round_dtype float32 with 16-bit storage is refused */
    CU_ASSERT_EQUAL(c->k->layernorm_forward(c->acc, c->dt, y16.dev, m.dev, r.dev, x.dev, w.dev, b.dev, N, C, 1e-5,
                                            KILN_DTYPE_F32), KILN_E_INVALID_ARG);
    /* backward: dy 16-bit, dx accumulated into float32 */
    {
        a16_buf dyw, dy = a16_h16(c, n, -1, 1, &dyw);
        a16_buf dx = a16_f32(c, n, -1, 1), dw = a16_f32(c, C, -1, 1), db = a16_f32(c, C, -1, 1);
        a16_buf dx2 = a16_new(c, n * 4), dw2 = a16_new(c, C * 4), db2 = a16_new(c, C * 4);
        memcpy(dx2.host, dx.host, n * 4), memcpy(dw2.host, dw.host, C * 4), memcpy(db2.host, db.host, C * 4);
        a16_put(c, &dx2), a16_put(c, &dw2), a16_put(c, &db2);
        if (!c->failed) {
            CU_ASSERT_EQUAL(c->k->layernorm_backward(c->acc, c->dt, dx.dev, dw.dev, db.dev, dy.dev, x.dev, w.dev,
                                                     m.dev, r.dev, N, C, 1), KILN_OK);
            CU_ASSERT_EQUAL(c->k->layernorm_backward(c->acc, KILN_DTYPE_F32, dx2.dev, dw2.dev, db2.dev, dyw.dev, x.dev,
                                                     w.dev, m.dev, r.dev, N, C, 1), KILN_OK);
            a16_same32(c, &dx, &dx2, "layernorm_backward dx");
            a16_same32(c, &dw, &dw2, "layernorm_backward dw");
            a16_same32(c, &db, &db2, "layernorm_backward db");
        }
        a16_buf *all[] = {&dyw, &dy, &dx, &dw, &db, &dx2, &dw2, &db2};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) a16_free(c, all[i]);
    }
out:;
    a16_buf *all[] = {&x, &w, &b, &y16, &y32, &m, &r, &m2, &r2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) a16_free(c, all[i]);
}

static void a16_linear(a16_ctx *c, int layout, int32_t act) {
    const int rows = 9, in = 24, out = 20;
    const size_t nx = (size_t)rows * in, ny = (size_t)rows * out;
    a16_buf xw, x = a16_h16(c, nx, -1, 1, &xw);
    a16_buf ww, w = a16_h16(c, (size_t)in * out, -0.3f, 0.3f, &ww);
    a16_buf b = a16_f32(c, out, -0.5f, 0.5f);
    a16_buf y = a16_new(c, ny * 2), p = a16_new(c, ny * 2), y2 = a16_new(c, ny * 4), p2 = a16_new(c, ny * 4);
    char what[96];
    if (!c->failed) {
        CU_ASSERT_EQUAL(c->k->linear_forward_layout(c->acc, c->dt, x.dev, w.dev, c->dt, layout, b.dev, rows, in, out,
                                                    act, y.dev, act >= 0 ? p.dev : NULL, c->dt), KILN_OK);
        CU_ASSERT_EQUAL(c->k->linear_forward_layout(c->acc, KILN_DTYPE_F32, xw.dev, w.dev, c->dt, layout, b.dev, rows,
                                                    in, out, act, y2.dev, act >= 0 ? p2.dev : NULL, c->dt), KILN_OK);
        snprintf(what, sizeof what, "linear_forward_layout %d act %d: y", layout, (int)act);
        a16_same16(c, &y, &y2, ny, what);
        if (act >= 0) {
            snprintf(what, sizeof what, "linear_forward_layout %d act %d: post", layout, (int)act);
            a16_same16(c, &p, &p2, ny, what);
        }
        /* a float32 w beside 16-bit storage is allowed: it equals the float32 call with that w */
        CU_ASSERT_EQUAL(c->k->linear_forward_layout(c->acc, c->dt, x.dev, ww.dev, KILN_DTYPE_F32, layout, b.dev, rows,
                                                    in, out, -1, y.dev, NULL, c->dt), KILN_OK);
        CU_ASSERT_EQUAL(c->k->linear_forward_layout(c->acc, KILN_DTYPE_F32, xw.dev, ww.dev, KILN_DTYPE_F32, layout,
                                                    b.dev, rows, in, out, -1, y2.dev, NULL, c->dt), KILN_OK);
        snprintf(what, sizeof what, "linear_forward_layout %d, float32 w: y", layout);
        a16_same16(c, &y, &y2, ny, what);
        /* the other 16-bit format for w, or round_dtype float32: refused */
        const uint32_t other = a16_bf(c) ? KILN_DTYPE_F16 : KILN_DTYPE_BF16;
        CU_ASSERT_EQUAL(c->k->linear_forward_layout(c->acc, c->dt, x.dev, w.dev, other, layout, b.dev, rows, in, out,
                                                    -1, y.dev, NULL, c->dt), KILN_E_INVALID_ARG);
        CU_ASSERT_EQUAL(c->k->linear_forward_layout(c->acc, c->dt, x.dev, w.dev, c->dt, layout, b.dev, rows, in, out,
                                                    -1, y.dev, NULL, KILN_DTYPE_F32), KILN_E_INVALID_ARG);
        /* the 1.3 entry takes the same storage */
        if (layout == KILN_LAYOUT_OUT_IN) {
            CU_ASSERT_EQUAL(c->k->linear_forward(c->acc, c->dt, x.dev, w.dev, c->dt, b.dev, rows, in, out, act, y.dev,
                                                 act >= 0 ? p.dev : NULL, c->dt), KILN_OK);
            CU_ASSERT_EQUAL(c->k->linear_forward(c->acc, KILN_DTYPE_F32, xw.dev, w.dev, c->dt, b.dev, rows, in, out,
                                                 act, y2.dev, act >= 0 ? p2.dev : NULL, c->dt), KILN_OK);
            a16_same16(c, &y, &y2, ny, "linear_forward y");
        }
    }
    a16_buf *all[] = {&xw, &x, &ww, &w, &b, &y, &p, &y2, &p2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) a16_free(c, all[i]);
}

static void a16_attention(a16_ctx *c) {
    const int B = 2, T = 9, C = 32, NH = 2;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    a16_buf qw, qkv = a16_h16(c, nq, -1, 1, &qw);
    /* out16 then lse packed right after it: float32 lse beside 16-bit out
     * must not count as an overlap */
    a16_buf ol = a16_new(c, no * 2 + nl * 4);
    a16_buf o2 = a16_new(c, no * 4), l2 = a16_new(c, nl * 4);
    a16_buf o16 = a16_new(c, no * 2), ow = a16_new(c, no * 4), l16 = a16_new(c, nl * 4);
    if (!c->failed) {
        void *lse = (char *)ol.dev + no * 2;
        CU_ASSERT_EQUAL(c->k->attention_forward(c->acc, c->dt, ol.dev, lse, qkv.dev, B, T, C, NH, c->dt), KILN_OK);
        CU_ASSERT_EQUAL(c->k->attention_forward(c->acc, KILN_DTYPE_F32, o2.dev, l2.dev, qw.dev, B, T, C, NH, c->dt),
                        KILN_OK);
        /* split the packed result into its two parts */
        a16_get(c, &ol);
        memcpy(o16.host, ol.host, no * 2);
        memcpy(l16.host, (char *)ol.host + no * 2, nl * 4);
        a16_put(c, &o16), a16_put(c, &l16);
        a16_same16(c, &o16, &o2, no, "attention_forward out");
        a16_same32(c, &l16, &l2, "attention_forward lse");
        CU_ASSERT_EQUAL(c->k->attention_forward(c->acc, c->dt, ol.dev, lse, qkv.dev, B, T, C, NH, KILN_DTYPE_F32),
                        KILN_E_INVALID_ARG);
        /* backward on the forward's own outputs */
        for (size_t i = 0; i < no; i++) ((float *)ow.host)[i] = a16_value(c, ((uint16_t *)o16.host)[i]);
        a16_put(c, &ow);
        a16_buf dow, dout = a16_h16(c, no, -1, 1, &dow);
        a16_buf dq = a16_new(c, nq * 2), dq2 = a16_new(c, nq * 4);
        if (!c->failed) {
            CU_ASSERT_EQUAL(c->k->attention_backward(c->acc, c->dt, dq.dev, dout.dev, qkv.dev, o16.dev, l16.dev, B, T,
                                                     C, NH, c->dt), KILN_OK);
            CU_ASSERT_EQUAL(c->k->attention_backward(c->acc, KILN_DTYPE_F32, dq2.dev, dow.dev, qw.dev, ow.dev,
                                                     l16.dev, B, T, C, NH, c->dt), KILN_OK);
            a16_same16(c, &dq, &dq2, nq, "attention_backward dqkv");
        }
        a16_buf *tmp[] = {&dow, &dout, &dq, &dq2};
        for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) a16_free(c, tmp[i]);
    }
    a16_buf *all[] = {&qw, &qkv, &ol, &o2, &l2, &o16, &ow, &l16};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) a16_free(c, all[i]);
}

static void a16_elementwise(a16_ctx *c) {
    const int rows = 11, cols = 13;
    const size_t n = (size_t)rows * cols;
    a16_buf xw, x = a16_h16(c, n, -3, 3, &xw);
    a16_buf gw, g = a16_h16(c, n, -1, 1, &gw);
    a16_buf dx = a16_new(c, n * 2), dx2 = a16_new(c, n * 4);
    a16_buf db = a16_f32(c, cols, -1, 1), db2 = a16_new(c, cols * 4);
    a16_buf a = a16_f32(c, n, -2, 2), y2 = a16_new(c, n * 4), a2 = a16_new(c, n * 4);
    if (!c->failed) {
        for (int32_t act = KILN_ACT_RELU; act <= KILN_ACT_LEAKY_RELU; act++) {
            CU_ASSERT_EQUAL(c->k->act_backward(c->acc, c->dt, act, dx.dev, g.dev, x.dev, n), KILN_OK);
            CU_ASSERT_EQUAL(c->k->act_backward(c->acc, KILN_DTYPE_F32, act, dx2.dev, gw.dev, xw.dev, n), KILN_OK);
            char what[48];
            snprintf(what, sizeof what, "act_backward %d", (int)act);
            a16_same16(c, &dx, &dx2, n, what);
        }
        /* in place (dx == dy), as kiln/nn.h calls it */
        CU_ASSERT_EQUAL(c->k->act_backward(c->acc, c->dt, KILN_ACT_GELU, g.dev, g.dev, x.dev, n), KILN_OK);
        CU_ASSERT_EQUAL(c->k->act_backward(c->acc, KILN_DTYPE_F32, KILN_ACT_GELU, dx2.dev, gw.dev, xw.dev, n), KILN_OK);
        a16_same16(c, &g, &dx2, n, "act_backward in place");
        /* bias_grad_ex: 16-bit dy, float32 db accumulated */
        memcpy(db2.host, db.host, cols * 4);
        a16_put(c, &db2);
        CU_ASSERT_EQUAL(c->k->bias_grad_ex(c->acc, c->dt, db.dev, x.dev, rows, cols, 1), KILN_OK);
        CU_ASSERT_EQUAL(c->k->bias_grad_ex(c->acc, KILN_DTYPE_F32, db2.dev, xw.dev, rows, cols, 1), KILN_OK);
        a16_same32(c, &db, &db2, "bias_grad_ex db");
        /* add: y = a (float32, in place) + b (16-bit) */
        memcpy(a2.host, a.host, n * 4);
        a16_put(c, &a2);
        CU_ASSERT_EQUAL(c->k->add(c->acc, c->dt, a.dev, a.dev, x.dev, n), KILN_OK);
        CU_ASSERT_EQUAL(c->k->add(c->acc, KILN_DTYPE_F32, y2.dev, a2.dev, xw.dev, n), KILN_OK);
        a16_same32(c, &a, &y2, "add y");
        /* y over the 16-bit b: refused (only y == a may alias) */
        CU_ASSERT_EQUAL(c->k->add(c->acc, c->dt, x.dev, a.dev, x.dev, n / 2), KILN_E_INVALID_ARG);
    }
    a16_buf *all[] = {&xw, &x, &gw, &g, &dx, &dx2, &db, &db2, &a, &y2, &a2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) a16_free(c, all[i]);
}

/* Every case for BF16 and F16 on table k. The table must set the flag. */
static void act16_run_all(const kiln_kernels *k, kiln_instance *acc) {
    CU_ASSERT_FATAL(k != NULL);
    CU_ASSERT((k->flags & KILN_KERNELS_ACT_16BIT) != 0);
    CU_ASSERT((k->flags & KILN_KERNELS_STORE_16BIT) != 0);
    const uint32_t dts[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        a16_ctx c = {k, acc, dts[d], {0x9E3779B97F4A7C15ull + (uint64_t)d}, 0};
        a16_layernorm(&c);
        for (int layout = 0; layout < 2; layout++) {
            a16_linear(&c, layout, -1);
            a16_linear(&c, layout, KILN_ACT_GELU);
        }
        a16_attention(&c);
        a16_elementwise(&c);
        CU_ASSERT_EQUAL(c.failed, 0);
    }
}

/* ------------------------------------------- 1.8: KILN_LAYOUT_ROUND_BIAS */

/* linear_forward_layout with KILN_LAYOUT_ROUND_BIAS against the same call
 * without it and a bias rounded here: the same bits, for float32 storage
 * (round_dtype c->dt) and 16-bit storage (dtype c->dt), either layout, with
 * and without GELU; and different from the raw bias's result, so the flag
 * provably rounds. K = 0 gives the rounded bias itself. */
static void a16_round_bias(a16_ctx *c, int layout, int32_t act, int s16, int in) {
    const int rows = 7, out = 24;
    const size_t nx = (size_t)rows * (size_t)in, ny = (size_t)rows * (size_t)out;
    const uint32_t dt = s16 ? c->dt : KILN_DTYPE_F32, esz = s16 ? 2 : 4;
    a16_buf xw, x = a16_h16(c, nx, -1, 1, &xw);
    a16_buf ww, w = a16_h16(c, (size_t)in * out, -0.3f, 0.3f, &ww);
    a16_buf b = a16_f32(c, out, -0.5f, 0.5f), bq = a16_new(c, (size_t)out * 4);
    a16_buf y = a16_new(c, ny * esz), p = a16_new(c, ny * esz), y2 = a16_new(c, ny * esz), p2 = a16_new(c, ny * esz);
    char what[128];
    for (int i = 0; bq.host && b.host && i < out; i++) /* the bias as the compute dtype holds it */
        ((float *)bq.host)[i] = a16_value(c, hb_round16(a16_bf(c), ((const float *)b.host)[i]));
    a16_put(c, &bq);
    if (!c->failed) {
        const void *xs = s16 ? x.dev : xw.dev;
        const int32_t flagged = layout | KILN_LAYOUT_ROUND_BIAS;
        CU_ASSERT_EQUAL(c->k->linear_forward_layout(c->acc, dt, xs, w.dev, c->dt, flagged, b.dev, rows, in, out, act,
                                                    y.dev, act >= 0 ? p.dev : NULL, c->dt), KILN_OK);
        CU_ASSERT_EQUAL(c->k->linear_forward_layout(c->acc, dt, xs, w.dev, c->dt, layout, bq.dev, rows, in, out, act,
                                                    y2.dev, act >= 0 ? p2.dev : NULL, c->dt), KILN_OK);
        a16_buf *got = act >= 0 ? &p : &y, *want = act >= 0 ? &p2 : &y2;
        a16_get(c, got);
        a16_get(c, want);
        snprintf(what, sizeof what, "round_bias %s storage, layout %d, act %d, K %d", s16 ? "16-bit" : "float32",
                 layout, (int)act, in);
        const int same = memcmp(got->host, want->host, ny * esz) == 0;
        if (!same) printf("\n  %s (%s): differs from the call with the bias rounded first", what, kiln_dtype_name(c->dt));
        CU_ASSERT(same);
        /* the raw float32 bias gives another result (not with K = 0, where
         * y = rdt(b) either way: rounding twice through one format is once) */
        CU_ASSERT_EQUAL(c->k->linear_forward_layout(c->acc, dt, xs, w.dev, c->dt, layout, b.dev, rows, in, out, act,
                                                    y2.dev, act >= 0 ? p2.dev : NULL, c->dt), KILN_OK);
        a16_get(c, want);
        if (in > 0) CU_ASSERT(memcmp(got->host, want->host, ny * esz) != 0);
        if (in == 0 && !s16 && act < 0) /* y = the rounded bias in every row */
            for (int r = 0; r < rows; r++) CU_ASSERT(memcmp((float *)y.host + (size_t)r * out, bq.host, out * 4) == 0);
    }
    a16_buf *all[] = {&xw, &x, &ww, &w, &b, &bq, &y, &p, &y2, &p2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) a16_free(c, all[i]);
}

/* Every 1.8 case for BF16 and F16 on table k, which must set
 * KILN_KERNELS_BIAS_ROUND, and the flag's refusals. */
static void bias_round_run_all(const kiln_kernels *k, kiln_instance *acc) {
    CU_ASSERT_FATAL(k != NULL);
    CU_ASSERT((k->flags & KILN_KERNELS_BIAS_ROUND) != 0);
    const uint32_t dts[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        a16_ctx c = {k, acc, dts[d], {0xB1A5B1A5ull + (uint64_t)d}, 0};
        for (int layout = 0; layout < 2; layout++)
            for (int s16 = 0; s16 < 2; s16++) {
                a16_round_bias(&c, layout, -1, s16, 16);
                a16_round_bias(&c, layout, KILN_ACT_GELU, s16, 16);
                a16_round_bias(&c, layout, -1, s16, 0);
            }
        CU_ASSERT_EQUAL(c.failed, 0);
    }
    /* refused: the flag with nothing to round through (round_dtype float32),
     * and a layout the flag does not make valid */
    a16_ctx c = {k, acc, KILN_DTYPE_BF16, {7}, 0};
    a16_buf x = a16_f32(&c, 4 * 4, -1, 1), w = a16_f32(&c, 4 * 4, -1, 1), b = a16_f32(&c, 4, -1, 1),
            y = a16_new(&c, 16 * 4);
    if (!c.failed) {
        CU_ASSERT_EQUAL(k->linear_forward_layout(acc, KILN_DTYPE_F32, x.dev, w.dev, KILN_DTYPE_F32,
                                                 KILN_LAYOUT_IN_OUT | KILN_LAYOUT_ROUND_BIAS, b.dev, 4, 4, 4, -1, y.dev,
                                                 NULL, KILN_DTYPE_F32), KILN_E_INVALID_ARG);
        CU_ASSERT_EQUAL(k->linear_forward_layout(acc, KILN_DTYPE_F32, x.dev, w.dev, KILN_DTYPE_F32,
                                                 2 | KILN_LAYOUT_ROUND_BIAS, b.dev, 4, 4, 4, -1, y.dev, NULL,
                                                 KILN_DTYPE_BF16), KILN_E_INVALID_ARG);
    }
    CU_ASSERT_EQUAL(c.failed, 0);
    a16_buf *all[] = {&x, &w, &b, &y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) a16_free(&c, all[i]);
}

#endif /* KILN_TESTS_ACT16_CASES_H */
