/*
 * test_kernels_seq.c — the cpu accelerator's ABI 1.4 sequence entries other
 * than attention (embedding_forward/backward, layernorm_forward/backward,
 * xent_fused, add), loaded through the test host as the real host loads the
 * plugin. Each entry is checked in float32 and float64 against naive
 * double-precision loops written here, and its gradient against central
 * finite differences of the forward in float64; the embedding's scatter-add
 * against the serial loop bit for bit; the accumulate/+= semantics, ignored
 * rows and padding of the cross-entropy, float16/bfloat16 rounding of the
 * layer norm; the same bits at 1, 2 and 3 threads with sizes that split;
 * and every refusal (bad token or target with its message, bad dtype,
 * negative size, NULL buffer, overlap). Shapes are deliberately not
 * multiples of the vector widths. One timing (xent_fused at V = 50304) is
 * printed, not asserted.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <CUnit/Basic.h>

#include <kiln/testing.h>

#include "half_bits.h"
#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

static const kiln_plugin_desc *g_desc;
static const kiln_accelerator_ops *g_ops;
static kiln_instance *g_acc;
static const kiln_kernels *g_k;

static const uint32_t F32 = KILN_DTYPE_F32, F64 = KILN_DTYPE_F64;

static int suite_init(void) {
    if (fixture_accel_open(g_th, "cpu", "cpu", &g_desc, &g_ops, &g_acc, &g_k) != 0) return -1;
    return g_k->struct_size >= KILN_KERNELS_SIZE_1_4 ? 0 : -1;
}

static int suite_clean(void) {
    fixture_accel_close(g_th, g_ops, &g_acc);
    return 0;
}

/* ------------------------------------------------------------- helpers */

/* |got - want| <= tol * (1 + |want|) */
static int close_to(double got, double want, double tol) { return fabs(got - want) <= tol * (1.0 + fabs(want)); }

/* Deterministic values in [-1, 1) (tests/support). */
static double val(unsigned i, unsigned salt) { return fixture_val(i, salt); }

static size_t esz(uint32_t dt) { return dt == F32 ? sizeof(float) : sizeof(double); }

/* n elements of dt from the accelerator (zeroed). */
static void *dalloc(uint32_t dt, size_t n) {
    void *p = NULL;
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, n * esz(dt), &p), KILN_OK);
    return p;
}
static void dfree(void *p) { g_k->free(g_acc, p); }

static double ld(uint32_t dt, const void *p, size_t i) {
    return dt == F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}
static void st(uint32_t dt, void *p, size_t i, double v) {
    if (dt == F32) ((float *)p)[i] = (float)v;
    else ((double *)p)[i] = v;
}
/* p[i] = scale * val(i, salt) + offset for i < n */
static void fill(uint32_t dt, void *p, size_t n, unsigned salt, double scale, double offset) {
    for (size_t i = 0; i < n; i++) st(dt, p, i, scale * val((unsigned)i, salt) + offset);
}
/* the values as stored, in double */
static double *to_d(uint32_t dt, const void *p, size_t n) {
    double *d = malloc((n ? n : 1) * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = ld(dt, p, i);
    return d;
}
/* every element of p close to want */
static int all_close(uint32_t dt, const void *p, const double *want, size_t n, double tol) {
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        if (!close_to(ld(dt, p, i), want[i], tol)) {
            if (ok) fprintf(stderr, "  element %zu: got %.17g want %.17g\n", i, ld(dt, p, i), want[i]);
            ok = 0;
        }
    return ok;
}
static double tol_of(uint32_t dt) { return dt == F32 ? 1e-5 : 1e-12; }

static int32_t *tokens_new(size_t n, int32_t V, unsigned salt) {
    int32_t *t = NULL;
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, n * sizeof *t, (void **)&t), KILN_OK);
    /* skewed: low ids repeat often, as in text */
    for (size_t i = 0; i < n; i++) {
        const double u = 0.5 * (val((unsigned)i, salt) + 1.0);
        t[i] = (int32_t)(u * u * V);
        if (t[i] >= V) t[i] = V - 1;
    }
    return t;
}

static int has(const char *needle) {
    if (strstr(kiln_test_error(g_th), needle)) return 1;
    fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", kiln_test_error(g_th), needle);
    return 0;
}

/* ------------------------------------------------------------ references */

static void ref_emb_fwd(double *out, const int32_t *tok, const double *wte, const double *wpe, int B, int T, int C) {
    for (int i = 0; i < B * T; i++)
        for (int j = 0; j < C; j++)
            out[(size_t)i * C + j] = wte[(size_t)tok[i] * C + j] + (wpe ? wpe[(size_t)(i % T) * C + j] : 0.0);
}

/* mean, rstd and y in double */
static void ref_ln_fwd(double *y, double *mean, double *rstd, const double *x, const double *w, const double *b, int N,
                       int C, double eps) {
    for (int i = 0; i < N; i++) {
        const double *xr = x + (size_t)i * C;
        double s = 0, q = 0;
        for (int j = 0; j < C; j++) s += xr[j];
        const double m = s / C;
        for (int j = 0; j < C; j++) q += (xr[j] - m) * (xr[j] - m);
        const double r = 1.0 / sqrt(q / C + eps);
        mean[i] = m;
        rstd[i] = r;
        for (int j = 0; j < C; j++) y[(size_t)i * C + j] = (xr[j] - m) * r * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
    }
}

/* dx = the input gradient (not accumulated); dw, db = the sums (not
 * accumulated); mean and rstd as given (the forward's stored values) */
static void ref_ln_bwd(double *dx, double *dw, double *db, const double *dy, const double *x, const double *w,
                       const double *mean, const double *rstd, int N, int C) {
    for (int j = 0; j < C; j++) dw[j] = db[j] = 0;
    for (int i = 0; i < N; i++) {
        const double *xr = x + (size_t)i * C, *g = dy + (size_t)i * C;
        double a = 0, bs = 0;
        for (int j = 0; j < C; j++) {
            const double h = (xr[j] - mean[i]) * rstd[i], gw = g[j] * (w ? w[j] : 1.0);
            a += gw;
            bs += gw * h;
            dw[j] += g[j] * h;
            db[j] += g[j];
        }
        for (int j = 0; j < C; j++) {
            const double h = (xr[j] - mean[i]) * rstd[i], gw = g[j] * (w ? w[j] : 1.0);
            dx[(size_t)i * C + j] = rstd[i] * (gw - a / C - h * bs / C);
        }
    }
}

/* loss sum and (gs != 0) the gradient over (N, Vp) */
static double ref_xent(double *grad, const double *l, const int32_t *tg, int N, int V, int Vp, double gs) {
    double total = 0;
    for (int i = 0; i < N; i++) {
        const double *r = l + (size_t)i * Vp;
        for (int j = 0; j < Vp; j++) grad[(size_t)i * Vp + j] = 0;
        if (tg[i] < 0) continue;
        double m = r[0];
        for (int j = 1; j < V; j++) m = r[j] > m ? r[j] : m;
        double s = 0;
        for (int j = 0; j < V; j++) s += exp(r[j] - m);
        total += log(s) + m - r[tg[i]];
        for (int j = 0; j < V; j++) grad[(size_t)i * Vp + j] = gs * (exp(r[j] - m) / s - (j == tg[i]));
    }
    return total;
}

/* ---------------------------------------------------------------- table */

static void test_table(void) {
    CU_ASSERT_TRUE(g_k->struct_size >= KILN_KERNELS_SIZE_1_4);
    CU_ASSERT_PTR_NOT_NULL(g_k->embedding_forward);
    CU_ASSERT_PTR_NOT_NULL(g_k->embedding_backward);
    CU_ASSERT_PTR_NOT_NULL(g_k->layernorm_forward);
    CU_ASSERT_PTR_NOT_NULL(g_k->layernorm_backward);
    CU_ASSERT_PTR_NOT_NULL(g_k->xent_fused);
    CU_ASSERT_PTR_NOT_NULL(g_k->add);
}

/* ------------------------------------------------------------- embedding */

static void embedding_case(uint32_t dt, int with_wpe) {
    const int B = 3, T = 5, C = 13, V = 11, n = B * T;
    int32_t *tok = tokens_new((size_t)n, V, 7);
    void *wte = dalloc(dt, (size_t)V * C), *wpe = dalloc(dt, (size_t)(T + 2) * C), *out = dalloc(dt, (size_t)n * C);
    fill(dt, wte, (size_t)V * C, 1, 1.0, 0.0);
    fill(dt, wpe, (size_t)(T + 2) * C, 2, 0.5, 0.0);
    CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, dt, out, tok, wte, with_wpe ? wpe : NULL, B, T, C, V), KILN_OK);
    double *dwte = to_d(dt, wte, (size_t)V * C), *dwpe = to_d(dt, wpe, (size_t)(T + 2) * C);
    double *want = malloc((size_t)n * C * sizeof *want);
    ref_emb_fwd(want, tok, dwte, with_wpe ? dwpe : NULL, B, T, C);
    CU_ASSERT_TRUE(all_close(dt, out, want, (size_t)n * C, tol_of(dt)));

    /* backward: ADDED to gradients that already hold values */
    void *dout = dalloc(dt, (size_t)n * C), *gte = dalloc(dt, (size_t)V * C), *gpe = dalloc(dt, (size_t)T * C);
    fill(dt, dout, (size_t)n * C, 3, 1.0, 0.0);
    fill(dt, gte, (size_t)V * C, 4, 1.0, 0.0);
    fill(dt, gpe, (size_t)T * C, 5, 1.0, 0.0);
    double *d_out = to_d(dt, dout, (size_t)n * C), *wte_g = to_d(dt, gte, (size_t)V * C),
           *wpe_g = to_d(dt, gpe, (size_t)T * C);
    /* the serial scatter in the data type: the kernel must match it bit for
     * bit (each row's contributions in increasing position) */
    void *ser_te = dalloc(dt, (size_t)V * C), *ser_pe = dalloc(dt, (size_t)T * C);
    memcpy(ser_te, gte, (size_t)V * C * esz(dt));
    memcpy(ser_pe, gpe, (size_t)T * C * esz(dt));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < C; j++) {
            const size_t s = (size_t)i * C + j, te = (size_t)tok[i] * C + j, pe = (size_t)(i % T) * C + j;
            if (dt == F32) {
                ((float *)ser_te)[te] += ((float *)dout)[s];
                ((float *)ser_pe)[pe] += ((float *)dout)[s];
            } else {
                ((double *)ser_te)[te] += ((double *)dout)[s];
                ((double *)ser_pe)[pe] += ((double *)dout)[s];
            }
            wte_g[te] += d_out[s];
            wpe_g[pe] += d_out[s];
        }
    CU_ASSERT_EQUAL(g_k->embedding_backward(g_acc, dt, gte, with_wpe ? gpe : NULL, dout, tok, B, T, C, V), KILN_OK);
    CU_ASSERT_TRUE(all_close(dt, gte, wte_g, (size_t)V * C, tol_of(dt)));
    CU_ASSERT_EQUAL(memcmp(gte, ser_te, (size_t)V * C * esz(dt)), 0);
    if (with_wpe) {
        CU_ASSERT_TRUE(all_close(dt, gpe, wpe_g, (size_t)T * C, tol_of(dt)));
        CU_ASSERT_EQUAL(memcmp(gpe, ser_pe, (size_t)T * C * esz(dt)), 0);
    }
    /* a frozen token table: only dwpe moves */
    if (with_wpe) {
        void *before = malloc((size_t)V * C * esz(dt));
        memcpy(before, gte, (size_t)V * C * esz(dt));
        CU_ASSERT_EQUAL(g_k->embedding_backward(g_acc, dt, NULL, gpe, dout, NULL, B, T, C, V), KILN_OK);
        /* the second pass adds dout to dwpe once more */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < C; j++) wpe_g[(size_t)(i % T) * C + j] += d_out[(size_t)i * C + j];
        CU_ASSERT_TRUE(all_close(dt, gpe, wpe_g, (size_t)T * C, tol_of(dt)));
        CU_ASSERT_EQUAL(memcmp(before, gte, (size_t)V * C * esz(dt)), 0);
        free(before);
    }
    free(dwte), free(dwpe), free(want), free(d_out), free(wte_g), free(wpe_g);
    dfree(wte), dfree(wpe), dfree(out), dfree(dout), dfree(gte), dfree(gpe), dfree(ser_te), dfree(ser_pe);
    dfree(tok);
}

static void test_embedding(void) {
    embedding_case(F32, 1);
    embedding_case(F32, 0);
    embedding_case(F64, 1);
    embedding_case(F64, 0);
}

/* L = sum(out * R): dL/dwte and dL/dwpe from the backward (dout = R)
 * against central differences of the forward, float64. */
static void test_embedding_gradcheck(void) {
    const int B = 2, T = 3, C = 5, V = 4, n = B * T;
    int32_t *tok = tokens_new((size_t)n, V, 11);
    double *wte = dalloc(F64, (size_t)V * C), *wpe = dalloc(F64, (size_t)T * C), *out = dalloc(F64, (size_t)n * C);
    double *R = dalloc(F64, (size_t)n * C), *gte = dalloc(F64, (size_t)V * C), *gpe = dalloc(F64, (size_t)T * C);
    fill(F64, wte, (size_t)V * C, 1, 1.0, 0.0);
    fill(F64, wpe, (size_t)T * C, 2, 1.0, 0.0);
    fill(F64, R, (size_t)n * C, 3, 1.0, 0.0);
    CU_ASSERT_EQUAL(g_k->embedding_backward(g_acc, F64, gte, gpe, R, tok, B, T, C, V), KILN_OK);
    const double h = 1e-6;
    for (int pass = 0; pass < 2; pass++) {
        double *p = pass ? wpe : wte, *g = pass ? gpe : gte;
        const int np = (pass ? T : V) * C;
        for (int k = 0; k < np; k++) {
            double Lp = 0, Lm = 0;
            const double keep = p[k];
            p[k] = keep + h;
            CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, F64, out, tok, wte, wpe, B, T, C, V), KILN_OK);
            for (int i = 0; i < n * C; i++) Lp += out[i] * R[i];
            p[k] = keep - h;
            CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, F64, out, tok, wte, wpe, B, T, C, V), KILN_OK);
            for (int i = 0; i < n * C; i++) Lm += out[i] * R[i];
            p[k] = keep;
            CU_ASSERT_TRUE(close_to(g[k], (Lp - Lm) / (2 * h), 1e-7));
        }
    }
    dfree(wte), dfree(wpe), dfree(out), dfree(R), dfree(gte), dfree(gpe), dfree(tok);
}

/* ------------------------------------------------------------ layer norm */

static void layernorm_case(uint32_t dt, int N, int C, int with_w, int with_b) {
    const double eps = 1e-5;
    const size_t nx = (size_t)N * C;
    void *x = dalloc(dt, nx), *w = dalloc(dt, (size_t)C), *b = dalloc(dt, (size_t)C), *y = dalloc(dt, nx);
    void *mean = dalloc(dt, (size_t)N), *rstd = dalloc(dt, (size_t)N);
    fill(dt, x, nx, 1, 2.0, 0.3); /* an offset: the mean must come out */
    fill(dt, w, (size_t)C, 2, 0.5, 1.0);
    fill(dt, b, (size_t)C, 3, 0.2, 0.0);
    const void *wp = with_w ? w : NULL, *bp = with_b ? b : NULL;
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, dt, y, mean, rstd, x, wp, bp, N, C, eps, KILN_DTYPE_F32), KILN_OK);
    double *xd = to_d(dt, x, nx), *wd = to_d(dt, w, (size_t)C), *bd = to_d(dt, b, (size_t)C);
    double *yw = malloc(nx * sizeof *yw), *mw = malloc((size_t)N * sizeof *mw), *rw = malloc((size_t)N * sizeof *rw);
    ref_ln_fwd(yw, mw, rw, xd, with_w ? wd : NULL, with_b ? bd : NULL, N, C, eps);
    CU_ASSERT_TRUE(all_close(dt, y, yw, nx, tol_of(dt)));
    CU_ASSERT_TRUE(all_close(dt, mean, mw, (size_t)N, tol_of(dt)));
    CU_ASSERT_TRUE(all_close(dt, rstd, rw, (size_t)N, tol_of(dt)));

    /* backward, not accumulating: dx overwritten (garbage before), dw/db += */
    void *dy = dalloc(dt, nx), *dx = dalloc(dt, nx), *dw = dalloc(dt, (size_t)C), *db = dalloc(dt, (size_t)C);
    fill(dt, dy, nx, 4, 1.0, 0.0);
    fill(dt, dx, nx, 5, 100.0, 0.0);
    fill(dt, dw, (size_t)C, 6, 1.0, 0.0);
    fill(dt, db, (size_t)C, 7, 1.0, 0.0);
    double *dyd = to_d(dt, dy, nx), *dw0 = to_d(dt, dw, (size_t)C), *db0 = to_d(dt, db, (size_t)C);
    double *md = to_d(dt, mean, (size_t)N), *rd = to_d(dt, rstd, (size_t)N);
    double *dxw = malloc(nx * sizeof *dxw), *dww = malloc((size_t)C * sizeof *dww), *dbw = malloc((size_t)C * sizeof *dbw);
    ref_ln_bwd(dxw, dww, dbw, dyd, xd, with_w ? wd : NULL, md, rd, N, C);
    for (int j = 0; j < C; j++) dww[j] += dw0[j], dbw[j] += db0[j];
    CU_ASSERT_EQUAL(g_k->layernorm_backward(g_acc, dt, dx, dw, db, dy, x, wp, mean, rstd, N, C, 0), KILN_OK);
    CU_ASSERT_TRUE(all_close(dt, dx, dxw, nx, tol_of(dt)));
    CU_ASSERT_TRUE(all_close(dt, dw, dww, (size_t)C, tol_of(dt)));
    CU_ASSERT_TRUE(all_close(dt, db, dbw, (size_t)C, tol_of(dt)));

    /* accumulating: dx += the gradient again; dw/db NULL are skipped */
    double *dx2 = malloc(nx * sizeof *dx2);
    for (size_t i = 0; i < nx; i++) dx2[i] = ld(dt, dx, i) + dxw[i];
    void *dw_before = malloc((size_t)C * esz(dt));
    memcpy(dw_before, dw, (size_t)C * esz(dt));
    CU_ASSERT_EQUAL(g_k->layernorm_backward(g_acc, dt, dx, NULL, NULL, dy, x, wp, mean, rstd, N, C, 1), KILN_OK);
    CU_ASSERT_TRUE(all_close(dt, dx, dx2, nx, tol_of(dt)));
    CU_ASSERT_EQUAL(memcmp(dw_before, dw, (size_t)C * esz(dt)), 0);
    /* only db: dw untouched, db += again */
    for (int j = 0; j < C; j++) dbw[j] += dbw[j] - db0[j];
    CU_ASSERT_EQUAL(g_k->layernorm_backward(g_acc, dt, dx, NULL, db, dy, x, wp, mean, rstd, N, C, 0), KILN_OK);
    CU_ASSERT_TRUE(all_close(dt, db, dbw, (size_t)C, tol_of(dt)));
    CU_ASSERT_TRUE(all_close(dt, dx, dxw, nx, tol_of(dt)));

    free(xd), free(wd), free(bd), free(yw), free(mw), free(rw), free(dyd), free(dw0), free(db0), free(md), free(rd);
    free(dxw), free(dww), free(dbw), free(dx2), free(dw_before);
    dfree(x), dfree(w), dfree(b), dfree(y), dfree(mean), dfree(rstd), dfree(dy), dfree(dx), dfree(dw), dfree(db);
}

static void test_layernorm(void) {
    const uint32_t dts[2] = {F32, F64};
    for (int d = 0; d < 2; d++) {
        layernorm_case(dts[d], 7, 37, 1, 1);
        layernorm_case(dts[d], 5, 3, 1, 0);
        layernorm_case(dts[d], 4, 16, 0, 1);
        layernorm_case(dts[d], 33, 101, 0, 0); /* several dw/db blocks */
        layernorm_case(dts[d], 1, 1, 1, 1);    /* y = b */
    }
}

/* L = sum(y * R): dx, dw, db from the backward against central differences
 * of the forward, float64. */
static void test_layernorm_gradcheck(void) {
    const int N = 3, C = 7;
    const double eps = 1e-5, h = 1e-6;
    const size_t nx = (size_t)N * C;
    double *x = dalloc(F64, nx), *w = dalloc(F64, (size_t)C), *b = dalloc(F64, (size_t)C), *y = dalloc(F64, nx);
    double *mean = dalloc(F64, (size_t)N), *rstd = dalloc(F64, (size_t)N), *R = dalloc(F64, nx);
    double *dx = dalloc(F64, nx), *dw = dalloc(F64, (size_t)C), *db = dalloc(F64, (size_t)C);
    fill(F64, x, nx, 1, 1.0, 0.2);
    fill(F64, w, (size_t)C, 2, 0.5, 1.0);
    fill(F64, b, (size_t)C, 3, 0.5, 0.0);
    fill(F64, R, nx, 4, 1.0, 0.0);
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F64, y, mean, rstd, x, w, b, N, C, eps, KILN_DTYPE_F64), KILN_OK);
    CU_ASSERT_EQUAL(g_k->layernorm_backward(g_acc, F64, dx, dw, db, R, x, w, mean, rstd, N, C, 0), KILN_OK);
    double *ps[3] = {x, w, b}, *gs[3] = {dx, dw, db};
    const size_t ns[3] = {nx, (size_t)C, (size_t)C};
    double *m2 = dalloc(F64, (size_t)N), *r2 = dalloc(F64, (size_t)N);
    for (int p = 0; p < 3; p++)
        for (size_t k = 0; k < ns[p]; k++) {
            double L[2] = {0, 0};
            const double keep = ps[p][k];
            for (int s = 0; s < 2; s++) {
                ps[p][k] = keep + (s ? -h : h);
                CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F64, y, m2, r2, x, w, b, N, C, eps, KILN_DTYPE_F32),
                                KILN_OK);
                for (size_t i = 0; i < nx; i++) L[s] += y[i] * R[i];
            }
            ps[p][k] = keep;
            const double fd = (L[0] - L[1]) / (2 * h);
            if (!close_to(gs[p][k], fd, 1e-7))
                fprintf(stderr, "  param %d index %zu: analytic %.12g, finite difference %.12g\n", p, k, gs[p][k], fd);
            CU_ASSERT_TRUE(close_to(gs[p][k], fd, 1e-7));
        }
    dfree(x), dfree(w), dfree(b), dfree(y), dfree(mean), dfree(rstd), dfree(R), dfree(dx), dfree(dw), dfree(db);
    dfree(m2), dfree(r2);
}

/* round_dtype: float16 / bfloat16 outputs are representable and within
 * half an ulp of the format of the unrounded output; float64 refuses them. */
static void test_layernorm_rounding(void) {
    const int N = 9, C = 45;
    const size_t nx = (size_t)N * C;
    float *x = dalloc(F32, nx), *w = dalloc(F32, (size_t)C), *b = dalloc(F32, (size_t)C);
    float *y = dalloc(F32, nx), *yr = dalloc(F32, nx), *m = dalloc(F32, (size_t)N), *r = dalloc(F32, (size_t)N);
    fill(F32, x, nx, 1, 3.0, 0.0);
    fill(F32, w, (size_t)C, 2, 1.0, 0.0);
    fill(F32, b, (size_t)C, 3, 1.0, 0.0);
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F32, y, m, r, x, w, b, N, C, 1e-5, KILN_DTYPE_F32), KILN_OK);
    const uint32_t rds[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (int k = 0; k < 2; k++) {
        CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F32, yr, m, r, x, w, b, N, C, 1e-5, rds[k]), KILN_OK);
        int representable = 1, close = 1, changed = 0;
        for (size_t i = 0; i < nx; i++) {
            if (rds[k] == KILN_DTYPE_BF16) {
                uint32_t u;
                memcpy(&u, &yr[i], sizeof u);
                representable &= (u & 0xFFFFu) == 0;
                close &= fabsf(yr[i] - y[i]) <= ldexpf(fabsf(y[i]), -8);
            } else {
                representable &= hb_f16_value(hb_f16_bits(yr[i])) == (double)yr[i];
                close &= fabsf(yr[i] - y[i]) <= ldexpf(fabsf(y[i]), -11) + 3e-8f; /* + subnormal spacing */
            }
            changed += yr[i] != y[i];
        }
        CU_ASSERT_TRUE(representable);
        CU_ASSERT_TRUE(close);
        CU_ASSERT_TRUE(changed > 0);
    }
    /* float64 data: float32 and float64 mean "none"; 16-bit formats refused */
    double *xd = dalloc(F64, nx), *yd = dalloc(F64, nx), *yd2 = dalloc(F64, nx), *md = dalloc(F64, (size_t)N),
           *rd = dalloc(F64, (size_t)N);
    fill(F64, xd, nx, 1, 3.0, 0.0);
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F64, yd, md, rd, xd, NULL, NULL, N, C, 1e-5, KILN_DTYPE_F32), KILN_OK);
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F64, yd2, md, rd, xd, NULL, NULL, N, C, 1e-5, KILN_DTYPE_F64),
                    KILN_OK);
    CU_ASSERT_EQUAL(memcmp(yd, yd2, nx * sizeof *yd), 0);
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F64, yd, md, rd, xd, NULL, NULL, N, C, 1e-5, KILN_DTYPE_BF16),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("layernorm_forward") && has("round_dtype"));
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F32, y, m, r, x, w, b, N, C, 1e-5, KILN_DTYPE_F64),
                    KILN_E_INVALID_ARG);
    dfree(x), dfree(w), dfree(b), dfree(y), dfree(yr), dfree(m), dfree(r);
    dfree(xd), dfree(yd), dfree(yd2), dfree(md), dfree(rd);
}

/* --------------------------------------------------- fused cross-entropy */

static void xent_case(uint32_t dt, int N, int V, int Vp, double offset) {
    const size_t nl = (size_t)N * Vp;
    void *l = dalloc(dt, nl);
    int32_t *tg = tokens_new((size_t)N, V, 9);
    tg[1 % N] = -1; /* an ignored row */
    tg[N - 1] = V - 1;
    fill(dt, l, nl, 1, 4.0, offset); /* offset: the max must be subtracted */
    double *ld0 = to_d(dt, l, nl), *gw = malloc(nl * sizeof *gw);
    const double gs = 0.37;
    const double want = ref_xent(gw, ld0, tg, N, V, Vp, gs);
    /* grad_scale 0: the loss alone, logits untouched */
    void *copy = malloc(nl * esz(dt));
    memcpy(copy, l, nl * esz(dt));
    double loss0 = NAN, loss = NAN;
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, dt, l, tg, N, V, Vp, 0.0, &loss0), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(copy, l, nl * esz(dt)), 0);
    CU_ASSERT_TRUE(close_to(loss0, want, tol_of(dt)));
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, dt, l, tg, N, V, Vp, gs, &loss), KILN_OK);
    CU_ASSERT_TRUE(close_to(loss, want, tol_of(dt)));
    CU_ASSERT_EQUAL(loss, loss0); /* the same loss either way */
    CU_ASSERT_TRUE(all_close(dt, l, gw, nl, tol_of(dt)));
    /* padding and ignored rows exactly 0 */
    int zeros = 1;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < Vp; j++)
            if ((tg[i] < 0 || j >= V) && ld(dt, l, (size_t)i * Vp + j) != 0.0) zeros = 0;
    CU_ASSERT_TRUE(zeros);
    free(ld0), free(gw), free(copy);
    dfree(l), dfree(tg);
}

static void test_xent(void) {
    const uint32_t dts[2] = {F32, F64};
    for (int d = 0; d < 2; d++) {
        xent_case(dts[d], 6, 37, 48, 0.0);
        xent_case(dts[d], 5, 37, 37, 60.0);   /* no padding, large logits */
        xent_case(dts[d], 3, 1, 3, -30.0);    /* one class: loss 0, gradient 0 */
        xent_case(dts[d], 4, 1001, 1024, 0.5);
    }
}

/* 1.6 (KILN_KERNELS_STORE_16BIT): logits stored in float16 / bfloat16 give
 * the float32 call's loss on the same values, bit for bit, and its
 * gradient rounded to nearest even as it is stored (ignored rows and
 * padding 0); grad_scale 0 leaves them untouched. */
static void xent16_case(uint32_t dt, int N, int V, int Vp, double offset) {
    const size_t nl = (size_t)N * Vp;
    float *l32 = dalloc(F32, nl);
    void *l16 = NULL, *want16 = NULL;
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, nl * 2, &l16), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, nl * 2, &want16), KILN_OK);
    int32_t *tg = tokens_new((size_t)N, V, 11);
    tg[1 % N] = -1;
    fill(F32, l32, nl, 3, 6.0, offset);
    /* the 16-bit logits, and the same values in float32 */
    CU_ASSERT_EQUAL(g_k->cast(g_acc, l16, dt, l32, F32, nl), KILN_OK);
    CU_ASSERT_EQUAL(g_k->cast(g_acc, l32, F32, l16, dt, nl), KILN_OK);
    double want = NAN, got0 = NAN, got = NAN;
    const double gs = 1.0 / 3.0;
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, l32, tg, N, V, Vp, gs, &want), KILN_OK);
    CU_ASSERT_EQUAL(g_k->cast(g_acc, want16, dt, l32, F32, nl), KILN_OK); /* the gradient, rounded */
    void *copy = malloc(nl * 2);
    memcpy(copy, l16, nl * 2);
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, dt, l16, tg, N, V, Vp, 0.0, &got0), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(copy, l16, nl * 2), 0);
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, dt, l16, tg, N, V, Vp, gs, &got), KILN_OK);
    CU_ASSERT_EQUAL(got0, want);
    CU_ASSERT_EQUAL(got, want);
    CU_ASSERT_EQUAL(memcmp(l16, want16, nl * 2), 0);
    /* not vacuous: the gradient is not the logits, and some of it is nonzero */
    CU_ASSERT_NOT_EQUAL(memcmp(l16, copy, nl * 2), 0);
    free(copy);
    dfree(l32), dfree(l16), dfree(want16), dfree(tg);
}

static void test_xent_16bit(void) {
    CU_ASSERT_TRUE(g_k->flags & KILN_KERNELS_STORE_16BIT);
    const uint32_t dts[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        xent16_case(dts[d], 6, 37, 48, 0.0);
        xent16_case(dts[d], 4, 1001, 1024, 20.0);
    }
}

/* A row with -inf logits (masked classes) keeps a finite loss and gives
 * them probability 0; a NaN logit makes its row's loss NaN. */
static void test_xent_nonfinite(void) {
    const int N = 2, V = 19;
    float *l = dalloc(F32, (size_t)N * V);
    int32_t *tg = tokens_new((size_t)N, V, 1);
    fill(F32, l, (size_t)N * V, 1, 1.0, 0.0);
    tg[0] = 3;
    tg[1] = -1;
    l[5] = -INFINITY;
    double *ld0 = to_d(F32, l, (size_t)N * V), *gw = malloc((size_t)N * V * sizeof *gw);
    const double want = ref_xent(gw, ld0, tg, N, V, V, 1.0);
    double loss = NAN;
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, l, tg, N, V, V, 1.0, &loss), KILN_OK);
    CU_ASSERT_TRUE(isfinite(loss) && close_to(loss, want, 1e-5));
    CU_ASSERT_EQUAL(l[5], 0.0f);
    CU_ASSERT_TRUE(all_close(F32, l, gw, (size_t)N * V, 1e-5));
    fill(F32, l, (size_t)N * V, 1, 1.0, 0.0);
    l[7] = NAN;
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, l, tg, N, V, V, 1.0, &loss), KILN_OK);
    CU_ASSERT_TRUE(isnan(loss));
    free(ld0), free(gw);
    dfree(l), dfree(tg);
}

/* d loss_sum / d logits with grad_scale 1 against central differences,
 * float64, with an ignored row and padding. */
static void test_xent_gradcheck(void) {
    const int N = 4, V = 9, Vp = 12;
    const size_t nl = (size_t)N * Vp;
    double *l = dalloc(F64, nl), *g = dalloc(F64, nl);
    int32_t *tg = tokens_new((size_t)N, V, 4);
    tg[2] = -1;
    fill(F64, l, nl, 3, 3.0, 0.0);
    memcpy(g, l, nl * sizeof *l);
    double loss = 0;
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F64, g, tg, N, V, Vp, 1.0, &loss), KILN_OK);
    const double h = 1e-6;
    for (size_t k = 0; k < nl; k++) {
        double Lp = 0, Lm = 0;
        const double keep = l[k];
        l[k] = keep + h;
        CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F64, l, tg, N, V, Vp, 0.0, &Lp), KILN_OK);
        l[k] = keep - h;
        CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F64, l, tg, N, V, Vp, 0.0, &Lm), KILN_OK);
        l[k] = keep;
        CU_ASSERT_TRUE(close_to(g[k], (Lp - Lm) / (2 * h), 1e-8));
    }
    dfree(l), dfree(g), dfree(tg);
}

/* ------------------------------------------------------------------- add */

static void test_add(void) {
    const uint32_t dts[2] = {F32, F64};
    const size_t n = 600001; /* above two stream grains: it splits */
    for (int d = 0; d < 2; d++) {
        const uint32_t dt = dts[d];
        void *a = dalloc(dt, n), *b = dalloc(dt, n), *y = dalloc(dt, n);
        fill(dt, a, n, 1, 1.0, 0.0);
        fill(dt, b, n, 2, 1.0, 0.0);
        double *ad = to_d(dt, a, n), *bd = to_d(dt, b, n), *want = malloc(n * sizeof *want);
        for (size_t i = 0; i < n; i++) want[i] = ad[i] + bd[i];
        CU_ASSERT_EQUAL(g_k->add(g_acc, dt, y, a, b, n), KILN_OK);
        CU_ASSERT_TRUE(all_close(dt, y, want, n, tol_of(dt)));
        /* in place on a, then on b, then both */
        CU_ASSERT_EQUAL(g_k->add(g_acc, dt, a, a, b, n), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(a, y, n * esz(dt)), 0);
        fill(dt, a, n, 1, 1.0, 0.0);
        CU_ASSERT_EQUAL(g_k->add(g_acc, dt, b, a, b, n), KILN_OK);
        CU_ASSERT_EQUAL(memcmp(b, y, n * esz(dt)), 0);
        CU_ASSERT_EQUAL(g_k->add(g_acc, dt, a, a, a, 7), KILN_OK);
        for (size_t i = 0; i < 7; i++) want[i] = 2 * ad[i];
        CU_ASSERT_TRUE(all_close(dt, a, want, 7, 0.0));
        CU_ASSERT_EQUAL(g_k->add(g_acc, dt, y, a, b, 0), KILN_OK);
        free(ad), free(bd), free(want);
        dfree(a), dfree(b), dfree(y);
    }
}

/* ------------------------------------------------------------- threads */

/* Every entry on sizes that split, at 1, 2 and 3 threads: the same bits. */
typedef struct {
    void *buf[12];
    size_t bytes[12];
    double loss;
} run_out;

static void run_all(uint32_t dt, run_out *o) {
    const int B = 4, T = 1024, C = 200, V = 500, n = B * T;
    const int XN = 64, XV = 5003, XVp = 5008;
    const size_t na = 600001;
    int32_t *tok = tokens_new((size_t)n, V, 3), *tg = tokens_new((size_t)XN, XV, 5);
    tg[3] = -1;
    void *wte = dalloc(dt, (size_t)V * C), *wpe = dalloc(dt, (size_t)T * C);
    fill(dt, wte, (size_t)V * C, 1, 1.0, 0.0);
    fill(dt, wpe, (size_t)T * C, 2, 1.0, 0.0);
    void *emb = dalloc(dt, (size_t)n * C), *gte = dalloc(dt, (size_t)V * C), *gpe = dalloc(dt, (size_t)T * C);
    fill(dt, gte, (size_t)V * C, 4, 1.0, 0.0);
    CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, dt, emb, tok, wte, wpe, B, T, C, V), KILN_OK);
    CU_ASSERT_EQUAL(g_k->embedding_backward(g_acc, dt, gte, gpe, emb, tok, B, T, C, V), KILN_OK);
    void *y = dalloc(dt, (size_t)n * C), *m = dalloc(dt, (size_t)n), *r = dalloc(dt, (size_t)n);
    void *w = dalloc(dt, (size_t)C), *bb = dalloc(dt, (size_t)C);
    fill(dt, w, (size_t)C, 5, 1.0, 0.5);
    fill(dt, bb, (size_t)C, 6, 1.0, 0.0);
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, dt, y, m, r, emb, w, bb, n, C, 1e-5, KILN_DTYPE_F32), KILN_OK);
    void *dx = dalloc(dt, (size_t)n * C), *dw = dalloc(dt, (size_t)C), *db = dalloc(dt, (size_t)C);
    CU_ASSERT_EQUAL(g_k->layernorm_backward(g_acc, dt, dx, dw, db, y, emb, w, m, r, n, C, 0), KILN_OK);
    void *lg = dalloc(dt, (size_t)XN * XVp);
    fill(dt, lg, (size_t)XN * XVp, 7, 5.0, 0.0);
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, dt, lg, tg, XN, XV, XVp, 0.5, &o->loss), KILN_OK);
    void *s = dalloc(dt, na);
    CU_ASSERT_EQUAL(g_k->add(g_acc, dt, s, emb, y, na), KILN_OK);
    void *keep[12] = {emb, gte, gpe, y, m, r, dx, dw, db, lg, s, NULL};
    const size_t sz[12] = {(size_t)n * C, (size_t)V * C, (size_t)T * C, (size_t)n * C, (size_t)n, (size_t)n,
                           (size_t)n * C, (size_t)C, (size_t)C, (size_t)XN * XVp, na, 0};
    for (int k = 0; k < 12; k++) {
        o->bytes[k] = sz[k] * esz(dt);
        o->buf[k] = keep[k];
    }
    dfree(tok), dfree(tg), dfree(wte), dfree(wpe), dfree(w), dfree(bb);
}

static void test_threads_bitwise(void) {
    const uint32_t dts[2] = {F32, F64};
    for (int d = 0; d < 2; d++) {
        run_out ref, got;
        CU_ASSERT_EQUAL_FATAL(g_ops->configure(g_acc, 1, 0), KILN_OK);
        run_all(dts[d], &ref);
        for (int th = 2; th <= 3; th++) {
            CU_ASSERT_EQUAL_FATAL(g_ops->configure(g_acc, th, 0), KILN_OK);
            run_all(dts[d], &got);
            for (int k = 0; k < 12 && got.buf[k]; k++) {
                const int same = memcmp(ref.buf[k], got.buf[k], ref.bytes[k]) == 0;
                if (!same) fprintf(stderr, "  dtype %u, %d threads: output %d differs\n", dts[d], th, k);
                CU_ASSERT_TRUE(same);
                dfree(got.buf[k]);
            }
            CU_ASSERT_EQUAL(memcmp(&ref.loss, &got.loss, sizeof ref.loss), 0);
        }
        for (int k = 0; k < 12 && ref.buf[k]; k++) dfree(ref.buf[k]);
    }
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 1, 0), KILN_OK);
}

/* ---------------------------------------------------------------- errors */

static void test_errors(void) {
    const int B = 2, T = 4, C = 3, V = 11, n = B * T;
    int32_t *tok = tokens_new((size_t)n, V, 2);
    float *wte = dalloc(F32, (size_t)V * C), *out = dalloc(F32, (size_t)n * C), *g = dalloc(F32, (size_t)V * C);
    fill(F32, wte, (size_t)V * C, 1, 1.0, 0.0);
    fill(F32, out, (size_t)n * C, 2, 1.0, 0.0);
    float *out0 = malloc((size_t)n * C * sizeof *out0);
    memcpy(out0, out, (size_t)n * C * sizeof *out0);

    /* a bad token: KILN_E_DATA naming index, value and range; nothing written */
    tok[7] = 57;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, F32, out, tok, wte, NULL, B, T, C, V), KILN_E_DATA);
    CU_ASSERT_TRUE(has("embedding_forward") && has("token 57") && has("index 7") && has("[0, 11)"));
    CU_ASSERT_EQUAL(memcmp(out, out0, (size_t)n * C * sizeof *out0), 0);
    tok[7] = -1;
    CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, F32, out, tok, wte, NULL, B, T, C, V), KILN_E_DATA);
    CU_ASSERT_TRUE(has("token -1") && has("index 7"));
    CU_ASSERT_EQUAL(g_k->embedding_backward(g_acc, F32, g, NULL, out, tok, B, T, C, V), KILN_E_DATA);
    CU_ASSERT_TRUE(has("embedding_backward") && has("token -1"));
    for (int k = 0; k < V * C; k++) CU_ASSERT_EQUAL(g[k], 0.0f);
    /* a frozen token table does not read tokens */
    CU_ASSERT_EQUAL(g_k->embedding_backward(g_acc, F32, NULL, NULL, out, tok, B, T, C, V), KILN_OK);
    tok[7] = 0;

    /* bad dtype, each entry names itself */
    const uint32_t bad = KILN_DTYPE_F16;
    double loss = 0;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, bad, out, tok, wte, NULL, B, T, C, V), KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("embedding_forward") && has("float16"));
    CU_ASSERT_EQUAL(g_k->embedding_backward(g_acc, bad, g, NULL, out, tok, B, T, C, V), KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("embedding_backward"));
    /* (the layer norms and add take 16-bit activation storage from 1.7:
     * tests/support/act16_cases.h) */
    const uint32_t bad_int = KILN_DTYPE_I32;
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, bad_int, out, g, g + 4, wte, NULL, NULL, 2, 3, 1e-5, F32),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("layernorm_forward") && has("int32"));
    CU_ASSERT_EQUAL(g_k->layernorm_backward(g_acc, bad_int, out, NULL, NULL, wte, wte, NULL, g, g, 2, 3, 0),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("layernorm_backward") && has("int32"));
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, KILN_DTYPE_U8, out, tok, 2, 3, 3, 1.0, &loss), KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("xent_fused") && has("uint8")); /* 16-bit logits are 1.6 storage (its own test) */
    CU_ASSERT_EQUAL(g_k->add(g_acc, bad_int, out, wte, wte, 4), KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("add") && has("int32"));
    CU_ASSERT_EQUAL(g_k->add(g_acc, 99, out, wte, wte, 4), KILN_E_INVALID_ARG);

    /* negative sizes, NULL buffers */
    CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, F32, out, tok, wte, NULL, -1, T, C, V), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, F32, out, tok, NULL, NULL, B, T, C, V), KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("wte is NULL"));
    CU_ASSERT_EQUAL(g_k->embedding_backward(g_acc, F32, g, NULL, NULL, tok, B, T, C, V), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F32, out, g, g + 4, wte, NULL, NULL, 2, -3, 1e-5, F32),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F32, out, NULL, g + 4, wte, NULL, NULL, 2, 3, 1e-5, F32),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_k->layernorm_backward(g_acc, F32, out, NULL, NULL, NULL, wte, NULL, g, g, 2, 3, 0),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, out, tok, 2, 3, 2, 1.0, &loss), KILN_E_INVALID_ARG); /* Vp < V */
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, out, tok, 2, 3, 3, 1.0, NULL), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, NULL, tok, 2, 3, 3, 1.0, &loss), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(g_k->add(g_acc, F32, out, NULL, wte, 4), KILN_E_INVALID_ARG);
    /* empty calls are fine */
    CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, F32, NULL, NULL, NULL, NULL, 0, T, C, V), KILN_OK);
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F32, NULL, NULL, NULL, NULL, NULL, NULL, 0, 5, 1e-5, F32), KILN_OK);
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, NULL, NULL, 0, 3, 3, 1.0, &loss), KILN_OK);
    CU_ASSERT_EQUAL(loss, 0.0);

    /* overlaps */
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F32, out, g, g + 4, out, NULL, NULL, 2, 3, 1e-5, F32),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("layernorm_forward") && has("y overlaps x"));
    CU_ASSERT_EQUAL(g_k->layernorm_forward(g_acc, F32, out, g, g + 1, wte, NULL, NULL, 2, 3, 1e-5, F32),
                    KILN_E_INVALID_ARG); /* mean over rstd */
    CU_ASSERT_EQUAL(g_k->layernorm_backward(g_acc, F32, out, NULL, NULL, out + 3, wte, NULL, g, g + 4, 2, 3, 0),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("layernorm_backward") && has("dx overlaps dy"));
    CU_ASSERT_EQUAL(g_k->embedding_forward(g_acc, F32, wte + 2, tok, wte, NULL, B, T, C, V), KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("embedding_forward") && has("out overlaps wte"));
    CU_ASSERT_EQUAL(g_k->embedding_backward(g_acc, F32, out, NULL, out, tok, B, T, C, V), KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("embedding_backward") && has("overlaps"));
    CU_ASSERT_EQUAL(g_k->add(g_acc, F32, out + 1, out, wte, 5), KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("add") && has("partially overlaps a"));
    CU_ASSERT_EQUAL(g_k->add(g_acc, F32, wte, out, wte + 2, 5), KILN_E_INVALID_ARG);
    CU_ASSERT_TRUE(has("partially overlaps b"));

    /* targets: < -1 and >= V are KILN_E_DATA naming row, value and range;
     * nothing written */
    int32_t *tg = tokens_new(4, 5, 3);
    float *lg = dalloc(F32, 4 * 6);
    fill(F32, lg, 24, 4, 1.0, 0.0);
    float before[24];
    memcpy(before, lg, sizeof before);
    tg[2] = -2;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, lg, tg, 4, 5, 6, 1.0, &loss), KILN_E_DATA);
    CU_ASSERT_TRUE(has("xent_fused") && has("target -2") && has("row 2") && has("[-1, 5)"));
    tg[2] = 5;
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, lg, tg, 4, 5, 6, 1.0, &loss), KILN_E_DATA);
    CU_ASSERT_TRUE(has("target 5") && has("row 2"));
    CU_ASSERT_EQUAL(memcmp(before, lg, sizeof before), 0);
    tg[2] = -1;
    CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, lg, tg, 4, 5, 6, 1.0, &loss), KILN_OK);

    free(out0);
    dfree(tok), dfree(wte), dfree(out), dfree(g), dfree(tg), dfree(lg);
}

/* ------------------------------------------------------------- timing */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xent_fused over a GPT-2 vocabulary: printed, not asserted (the loss is
 * checked to be finite and near log(V) for logits this small). */
static void test_xent_speed(void) {
    const int N = 64, V = 50257, Vp = 50304;
    float *l = dalloc(F32, (size_t)N * Vp);
    int32_t *tg = tokens_new((size_t)N, V, 8);
    for (int th = 1; th <= 2; th++) {
        CU_ASSERT_EQUAL_FATAL(g_ops->configure(g_acc, th, 0), KILN_OK);
        double best = 1e30, loss = 0;
        for (int rep = 0; rep < 3; rep++) {
            fill(F32, l, (size_t)N * Vp, 1, 0.1, 0.0);
            const double t0 = now_s();
            CU_ASSERT_EQUAL(g_k->xent_fused(g_acc, F32, l, tg, N, V, Vp, 1.0 / N, &loss), KILN_OK);
            const double dt = now_s() - t0;
            best = dt < best ? dt : best;
        }
        CU_ASSERT_TRUE(isfinite(loss) && fabs(loss / N - log((double)V)) < 0.05);
        printf("\n  xent_fused f32 V=%d Vp=%d, %d rows, %d thread(s): %.2f ms, %.0f rows/s ", V, Vp, N, th,
               1e3 * best, N / best);
    }
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 1, 0), KILN_OK);
    dfree(l), dfree(tg);
}

static CU_TestInfo cases_kernels_seq[] = {
    {"1.4 table entries present", test_table},
    {"embedding forward/backward vs naive, += and serial bits (f32, f64)", test_embedding},
    {"embedding backward vs finite differences (f64)", test_embedding_gradcheck},
    {"layernorm forward/backward vs naive, accumulate, NULL w/b/dw/db (f32, f64)", test_layernorm},
    {"layernorm backward vs finite differences (f64)", test_layernorm_gradcheck},
    {"layernorm round_dtype bf16/f16, refused for f64", test_layernorm_rounding},
    {"xent_fused vs naive, ignored rows, padding, grad_scale 0 (f32, f64)", test_xent},
    {"xent_fused -inf and NaN logits", test_xent_nonfinite},
    {"1.6: xent_fused on bf16/f16 logits = f32 on the same values, gradient rounded", test_xent_16bit},
    {"xent_fused gradient vs finite differences (f64)", test_xent_gradcheck},
    {"add, in place on a, b, both (f32, f64)", test_add},
    {"same bits at 1, 2, 3 threads (f32, f64)", test_threads_bitwise},
    {"refusals: bad token/target, dtype, sizes, NULL, overlap", test_errors},
    {"xent_fused speed at V=50304 (printed)", test_xent_speed},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "kernels_seq", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_kernels_seq},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
