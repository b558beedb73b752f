/*
 * test_kernels_attn.c — the cpu accelerator's causal self-attention entries
 * (ABI 1.4 attention_forward / attention_backward), called through the
 * plugin's kernel table as the host would (libkiln-cpu.so via the mock
 * host). Forward out and lse against the naive double reference
 * (kc_attn_forward_ref: one materialised softmax row at a time) in float32
 * and float64 over shapes that exercise T = 1, T below, at and past the
 * query tile, one and several heads, several batches; the float64 backward
 * against central finite differences of L = sum(out * R) and against the
 * reference backward, the float32 one against float64; causality (a change
 * at position t moves nothing before t); the same bits at 1, 2 and 3
 * threads; the float16 / bfloat16 output rounding; and every argument
 * error, refused with KILN_E_INVALID_ARG and a message naming the entry and
 * the values.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "cpu_attn.h"
#include <kiln/testing.h>

#include "half_bits.h"
#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

static const kiln_plugin_desc *g_desc;
static const kiln_accelerator_ops *g_ops;
static kiln_instance *g_acc;
static const kiln_kernels *g_k;

static int suite_init(void) {
    if (fixture_accel_open(g_th, "cpu", "cpu", &g_desc, &g_ops, &g_acc, &g_k) != 0) return -1;
    if (g_k->struct_size < KILN_KERNELS_SIZE_1_4 || !g_k->attention_forward || !g_k->attention_backward)
        return -1;
    return g_ops->configure(g_acc, 1, 0) == KILN_OK ? 0 : -1;
}

static int suite_clean(void) {
    fixture_accel_close(g_th, g_ops, &g_acc);
    return 0;
}

/* Deterministic values in [-1, 1) (tests/support). */
static double val(unsigned i, unsigned salt) { return fixture_val(i, salt); }

typedef struct {
    int B, T, C, NH;
} shape;

/* attention_forward of qkv into out and lse (rounding rf), then
 * attention_backward of dout into dq from qkv, out_b and that lse
 * (rounding rb), in dtype dt; both must succeed. */
static void attn_pass(uint32_t dt, shape s, const void *qkv, const void *dout, void *out, void *lse, void *dq,
                      const void *out_b, uint32_t rf, uint32_t rb) {
    CU_ASSERT_EQUAL(g_k->attention_forward(g_acc, dt, out, lse, qkv, s.B, s.T, s.C, s.NH, rf), KILN_OK);
    CU_ASSERT_EQUAL(g_k->attention_backward(g_acc, dt, dq, dout, qkv, out_b, lse, s.B, s.T, s.C, s.NH, rb), KILN_OK);
}

static size_t n_qkv(shape s) { return (size_t)s.B * (size_t)s.T * 3 * (size_t)s.C; }
static size_t n_out(shape s) { return (size_t)s.B * (size_t)s.T * (size_t)s.C; }
static size_t n_lse(shape s) { return (size_t)s.B * (size_t)s.NH * (size_t)s.T; }

/* qkv values of a few units so that the softmax rows are far from uniform. */
static void fill_qkv(double *x, size_t n, unsigned salt) {
    for (size_t i = 0; i < n; i++) x[i] = 2.5 * val((unsigned)i, salt);
}

static float *to_f32(const double *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}
static double *to_f64(const float *x, size_t n) {
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = (double)x[i];
    return y;
}

/* max over i of |got - want| / (1 + |want|) */
static double max_err_f64(const double *got, const double *want, size_t n) {
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs(got[i] - want[i]) / (1.0 + fabs(want[i]));
        if (!(d <= e)) e = d; /* NaN counts as a maximal error */
    }
    return e;
}
static double max_err_f32(const float *got, const double *want, size_t n) {
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]) / (1.0 + fabs(want[i]));
        if (!(d <= e)) e = d;
    }
    return e;
}

static const shape g_shapes[] = {
    {1, 1, 8, 1},    /* T = 1: one key, softmax weight 1 */
    {2, 5, 12, 3},   /* T below the tile, several heads, B > 1 */
    {1, 64, 16, 2},  /* T = the tile */
    {2, 100, 32, 4}, /* T past the tile, not a multiple of it */
    {1, 130, 8, 1},  /* NH = 1, three tiles */
    {3, 17, 24, 2},
};
#define N_SHAPES (sizeof g_shapes / sizeof g_shapes[0])

/* ------------------------------------------------------------- forward */

static void test_forward_vs_reference(void) {
    for (size_t si = 0; si < N_SHAPES; si++) {
        const shape s = g_shapes[si];
        double *qkv = malloc(n_qkv(s) * sizeof *qkv), *ref = malloc(n_out(s) * sizeof *ref),
               *ref_lse = malloc(n_lse(s) * sizeof *ref_lse), *scratch = malloc(2 * (size_t)s.T * sizeof *scratch);
        fill_qkv(qkv, n_qkv(s), (unsigned)si);

        /* float64 */
        double *out = malloc(n_out(s) * sizeof *out), *lse = malloc(n_lse(s) * sizeof *lse);
        kc_attn_forward_ref(ref, ref_lse, qkv, s.B, s.T, s.C, s.NH, scratch);
        CU_ASSERT_EQUAL(g_k->attention_forward(g_acc, KILN_DTYPE_F64, out, lse, qkv, s.B, s.T, s.C, s.NH,
                                               KILN_DTYPE_F32),
                        KILN_OK);
        double eo = max_err_f64(out, ref, n_out(s)), el = max_err_f64(lse, ref_lse, n_lse(s));
        if (eo > 1e-12 || el > 1e-12)
            fprintf(stderr, "f64 B=%d T=%d C=%d NH=%d: out err %.3g lse err %.3g\n", s.B, s.T, s.C, s.NH, eo, el);
        CU_ASSERT_TRUE(eo <= 1e-12);
        CU_ASSERT_TRUE(el <= 1e-12);

        /* float32, against the reference on the same (float) inputs */
        float *q32 = to_f32(qkv, n_qkv(s)), *o32 = malloc(n_out(s) * sizeof *o32),
              *l32 = malloc(n_lse(s) * sizeof *l32);
        double *qw = to_f64(q32, n_qkv(s));
        kc_attn_forward_ref(ref, ref_lse, qw, s.B, s.T, s.C, s.NH, scratch);
        CU_ASSERT_EQUAL(g_k->attention_forward(g_acc, KILN_DTYPE_F32, o32, l32, q32, s.B, s.T, s.C, s.NH,
                                               KILN_DTYPE_F32),
                        KILN_OK);
        eo = max_err_f32(o32, ref, n_out(s));
        el = max_err_f32(l32, ref_lse, n_lse(s));
        if (eo > 1e-5 || el > 1e-5)
            fprintf(stderr, "f32 B=%d T=%d C=%d NH=%d: out err %.3g lse err %.3g\n", s.B, s.T, s.C, s.NH, eo, el);
        CU_ASSERT_TRUE(eo <= 1e-5);
        CU_ASSERT_TRUE(el <= 1e-5);
        free(qkv), free(ref), free(ref_lse), free(scratch), free(out), free(lse), free(q32), free(o32), free(l32),
            free(qw);
    }
}

/* ------------------------------------------------------------ backward */

/* L = sum(out * R) by the float64 forward entry. */
static double loss_f64(const double *qkv, const double *R, shape s, double *out, double *lse) {
    if (g_k->attention_forward(g_acc, KILN_DTYPE_F64, out, lse, qkv, s.B, s.T, s.C, s.NH, KILN_DTYPE_F32) != KILN_OK)
        return NAN;
    double L = 0.0;
    for (size_t i = 0; i < n_out(s); i++) L += out[i] * R[i];
    return L;
}

static void test_backward_finite_differences(void) {
    const shape s = {2, 70, 12, 3}; /* D = 4; T crosses the tile */
    double *qkv = malloc(n_qkv(s) * sizeof *qkv), *R = malloc(n_out(s) * sizeof *R),
           *out = malloc(n_out(s) * sizeof *out), *lse = malloc(n_lse(s) * sizeof *lse),
           *dq = malloc(n_qkv(s) * sizeof *dq), *o2 = malloc(n_out(s) * sizeof *o2),
           *l2 = malloc(n_lse(s) * sizeof *l2);
    fill_qkv(qkv, n_qkv(s), 11);
    for (size_t i = 0; i < n_out(s); i++) R[i] = val((unsigned)i, 12);
    loss_f64(qkv, R, s, out, lse);
    /* dL/dout = R */
    CU_ASSERT_EQUAL_FATAL(g_k->attention_backward(g_acc, KILN_DTYPE_F64, dq, R, qkv, out, lse, s.B, s.T, s.C, s.NH,
                                                  KILN_DTYPE_F64),
                          KILN_OK);
    const double h = 1e-5;
    double worst = 0.0;
    for (unsigned t = 0; t < 60; t++) {
        /* sampled entries over q, k and v columns, both batches, all rows */
        const size_t i = (size_t)(((uint64_t)t * 2654435761u) % n_qkv(s));
        const double x0 = qkv[i];
        qkv[i] = x0 + h;
        const double lp = loss_f64(qkv, R, s, o2, l2);
        qkv[i] = x0 - h;
        const double lm = loss_f64(qkv, R, s, o2, l2);
        qkv[i] = x0;
        const double fd = (lp - lm) / (2 * h);
        const double e = fabs(fd - dq[i]) / (1.0 + fabs(fd));
        if (e > worst) worst = e;
    }
    if (worst > 1e-7) fprintf(stderr, "finite differences: worst error %.3g\n", worst);
    CU_ASSERT_TRUE(worst <= 1e-7);
    free(qkv), free(R), free(out), free(lse), free(dq), free(o2), free(l2);
}

static void test_backward_vs_reference(void) {
    for (size_t si = 0; si < N_SHAPES; si++) {
        const shape s = g_shapes[si];
        double *qkv = malloc(n_qkv(s) * sizeof *qkv), *dout = malloc(n_out(s) * sizeof *dout),
               *out = malloc(n_out(s) * sizeof *out), *lse = malloc(n_lse(s) * sizeof *lse),
               *dq = malloc(n_qkv(s) * sizeof *dq), *ref = malloc(n_qkv(s) * sizeof *ref),
               *scratch = malloc(2 * (size_t)s.T * sizeof *scratch);
        fill_qkv(qkv, n_qkv(s), 20 + (unsigned)si);
        for (size_t i = 0; i < n_out(s); i++) dout[i] = val((unsigned)i, 30 + (unsigned)si);
        /* dqkv is overwritten: garbage in it must not leak into the result */
        for (size_t i = 0; i < n_qkv(s); i++) dq[i] = 1e30;
        CU_ASSERT_EQUAL(g_k->attention_forward(g_acc, KILN_DTYPE_F64, out, lse, qkv, s.B, s.T, s.C, s.NH,
                                               KILN_DTYPE_F32),
                        KILN_OK);
        CU_ASSERT_EQUAL(g_k->attention_backward(g_acc, KILN_DTYPE_F64, dq, dout, qkv, out, lse, s.B, s.T, s.C, s.NH,
                                                KILN_DTYPE_F32),
                        KILN_OK);
        kc_attn_backward_ref(ref, dout, qkv, s.B, s.T, s.C, s.NH, scratch);
        const double e64 = max_err_f64(dq, ref, n_qkv(s));

        /* float32 from the same (float-representable) inputs, against float64 */
        float *q32 = to_f32(qkv, n_qkv(s)), *g32 = to_f32(dout, n_out(s)), *o32 = malloc(n_out(s) * sizeof *o32),
              *l32 = malloc(n_lse(s) * sizeof *l32), *d32 = malloc(n_qkv(s) * sizeof *d32);
        double *qw = to_f64(q32, n_qkv(s)), *gw = to_f64(g32, n_out(s));
        kc_attn_backward_ref(ref, gw, qw, s.B, s.T, s.C, s.NH, scratch);
        CU_ASSERT_EQUAL(g_k->attention_forward(g_acc, KILN_DTYPE_F32, o32, l32, q32, s.B, s.T, s.C, s.NH,
                                               KILN_DTYPE_F32),
                        KILN_OK);
        CU_ASSERT_EQUAL(g_k->attention_backward(g_acc, KILN_DTYPE_F32, d32, g32, q32, o32, l32, s.B, s.T, s.C, s.NH,
                                                KILN_DTYPE_F32),
                        KILN_OK);
        const double e32 = max_err_f32(d32, ref, n_qkv(s));
        if (e64 > 1e-11 || e32 > 1e-4)
            fprintf(stderr, "backward B=%d T=%d C=%d NH=%d: f64 err %.3g f32 err %.3g\n", s.B, s.T, s.C, s.NH, e64,
                    e32);
        CU_ASSERT_TRUE(e64 <= 1e-11);
        CU_ASSERT_TRUE(e32 <= 1e-4);
        free(qkv), free(dout), free(out), free(lse), free(dq), free(ref), free(scratch), free(q32), free(g32),
            free(o32), free(l32), free(d32), free(qw), free(gw);
    }
}

/* ------------------------------------------------------------ causality */

static void test_causality(void) {
    const shape s = {2, 90, 16, 2};
    double *qkv = malloc(n_qkv(s) * sizeof *qkv), *o1 = malloc(n_out(s) * sizeof *o1),
           *o2 = malloc(n_out(s) * sizeof *o2), *l1 = malloc(n_lse(s) * sizeof *l1),
           *l2 = malloc(n_lse(s) * sizeof *l2);
    fill_qkv(qkv, n_qkv(s), 40);
    CU_ASSERT_EQUAL(g_k->attention_forward(g_acc, KILN_DTYPE_F64, o1, l1, qkv, s.B, s.T, s.C, s.NH, KILN_DTYPE_F32),
                    KILN_OK);
    static const int ts[] = {0, 1, 63, 64, 65, 89};
    for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
        const int t = ts[ti], b = (int)(ti % 2);
        double *row = qkv + ((size_t)b * (size_t)s.T + (size_t)t) * 3 * (size_t)s.C;
        double saved[48];
        memcpy(saved, row, sizeof saved);
        for (int j = 0; j < 3 * s.C; j++) row[j] += 0.75;
        CU_ASSERT_EQUAL(
            g_k->attention_forward(g_acc, KILN_DTYPE_F64, o2, l2, qkv, s.B, s.T, s.C, s.NH, KILN_DTYPE_F32), KILN_OK);
        memcpy(row, saved, sizeof saved);
        /* rows before t: the same bits; row t: changed; other batch: same */
        const size_t before = ((size_t)b * (size_t)s.T + (size_t)t) * (size_t)s.C;
        CU_ASSERT_EQUAL(memcmp(o1, o2, before * sizeof *o1), 0);
        CU_ASSERT_NOT_EQUAL(memcmp(o1 + before, o2 + before, (size_t)s.C * sizeof *o1), 0);
        for (int h = 0; h < s.NH; h++) {
            const size_t l0 = ((size_t)b * (size_t)s.NH + (size_t)h) * (size_t)s.T;
            CU_ASSERT_EQUAL(memcmp(l1 + l0, l2 + l0, (size_t)t * sizeof *l1), 0);
        }
        const size_t other = (size_t)(1 - b) * (size_t)s.T * (size_t)s.C;
        CU_ASSERT_EQUAL(memcmp(o1 + other, o2 + other, (size_t)s.T * (size_t)s.C * sizeof *o1), 0);
    }
    free(qkv), free(o1), free(o2), free(l1), free(l2);
}

/* ----------------------------------------------------- thread-count bits */

static void test_threads_bit_identical(void) {
    const shape s = {3, 150, 64, 4}; /* 12 (batch, head) items */
    double *x = malloc(n_qkv(s) * sizeof *x);
    fill_qkv(x, n_qkv(s), 50);
    float *qkv = to_f32(x, n_qkv(s)), *dout = to_f32(x + 7, n_out(s));
    enum { NT = 3 };
    float *out[NT], *lse[NT], *dq[NT], *outr[NT], *dqr[NT];
    double *out64[NT], *lse64[NT], *dq64[NT];
    double *qkv64 = x, *dout64 = to_f64(dout, n_out(s));
    for (int n = 0; n < NT; n++) {
        CU_ASSERT_EQUAL_FATAL(g_ops->configure(g_acc, n + 1, 0), KILN_OK);
        out[n] = malloc(n_out(s) * sizeof(float)), lse[n] = malloc(n_lse(s) * sizeof(float));
        dq[n] = malloc(n_qkv(s) * sizeof(float)), outr[n] = malloc(n_out(s) * sizeof(float));
        dqr[n] = malloc(n_qkv(s) * sizeof(float));
        out64[n] = malloc(n_out(s) * sizeof(double)), lse64[n] = malloc(n_lse(s) * sizeof(double));
        dq64[n] = malloc(n_qkv(s) * sizeof(double));
        attn_pass(KILN_DTYPE_F32, s, qkv, dout, out[n], lse[n], dq[n], out[n], KILN_DTYPE_F32, KILN_DTYPE_F32);
        /* rounded: the backward reads the unrounded forward's out and the rounded one's lse */
        attn_pass(KILN_DTYPE_F32, s, qkv, dout, outr[n], lse[n], dqr[n], out[n], KILN_DTYPE_BF16, KILN_DTYPE_F16);
        attn_pass(KILN_DTYPE_F64, s, qkv64, dout64, out64[n], lse64[n], dq64[n], out64[n], KILN_DTYPE_F32,
                  KILN_DTYPE_F32);
    }
    for (int n = 1; n < NT; n++) {
        CU_ASSERT_EQUAL(memcmp(out[0], out[n], n_out(s) * sizeof(float)), 0);
        CU_ASSERT_EQUAL(memcmp(lse[0], lse[n], n_lse(s) * sizeof(float)), 0);
        CU_ASSERT_EQUAL(memcmp(dq[0], dq[n], n_qkv(s) * sizeof(float)), 0);
        CU_ASSERT_EQUAL(memcmp(outr[0], outr[n], n_out(s) * sizeof(float)), 0);
        CU_ASSERT_EQUAL(memcmp(dqr[0], dqr[n], n_qkv(s) * sizeof(float)), 0);
        CU_ASSERT_EQUAL(memcmp(out64[0], out64[n], n_out(s) * sizeof(double)), 0);
        CU_ASSERT_EQUAL(memcmp(lse64[0], lse64[n], n_lse(s) * sizeof(double)), 0);
        CU_ASSERT_EQUAL(memcmp(dq64[0], dq64[n], n_qkv(s) * sizeof(double)), 0);
    }
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 1, 0), KILN_OK);
    for (int n = 0; n < NT; n++)
        free(out[n]), free(lse[n]), free(dq[n]), free(outr[n]), free(dqr[n]), free(out64[n]), free(lse64[n]),
            free(dq64[n]);
    free(x), free(qkv), free(dout), free(dout64);
}

/* ------------------------------------------------------------- rounding */

static int is_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0xFFFFu) == 0;
}
static int is_f16(float x) { return hb_f16_value(hb_f16_bits(x)) == (double)x; }

static void test_rounding(void) {
    const shape s = {2, 80, 32, 2};
    double *x = malloc(n_qkv(s) * sizeof *x);
    fill_qkv(x, n_qkv(s), 60);
    float *qkv = to_f32(x, n_qkv(s)), *dout = to_f32(x + 3, n_out(s));
    float *o = malloc(n_out(s) * sizeof *o), *orr = malloc(n_out(s) * sizeof *orr),
          *l = malloc(n_lse(s) * sizeof *l), *lr = malloc(n_lse(s) * sizeof *lr), *d = malloc(n_qkv(s) * sizeof *d),
          *dr = malloc(n_qkv(s) * sizeof *dr);
    CU_ASSERT_EQUAL(
        g_k->attention_forward(g_acc, KILN_DTYPE_F32, o, l, qkv, s.B, s.T, s.C, s.NH, KILN_DTYPE_F32), KILN_OK);
    CU_ASSERT_EQUAL(g_k->attention_backward(g_acc, KILN_DTYPE_F32, d, dout, qkv, o, l, s.B, s.T, s.C, s.NH,
                                            KILN_DTYPE_F32),
                    KILN_OK);
    static const uint32_t rd[] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (int r = 0; r < 2; r++) {
        /* bf16 keeps 8 significant bits, f16 11: half an ulp is at most 2^-8
         * and 2^-11 of the value */
        const float rel = rd[r] == KILN_DTYPE_BF16 ? 1.0f / 256 : 1.0f / 2048;
        int (*repr)(float) = rd[r] == KILN_DTYPE_BF16 ? is_bf16 : is_f16;
        CU_ASSERT_EQUAL(
            g_k->attention_forward(g_acc, KILN_DTYPE_F32, orr, lr, qkv, s.B, s.T, s.C, s.NH, rd[r]), KILN_OK);
        /* lse is not rounded: the same bits as unrounded */
        CU_ASSERT_EQUAL(memcmp(l, lr, n_lse(s) * sizeof *l), 0);
        int bad_repr = 0, bad_close = 0;
        for (size_t i = 0; i < n_out(s); i++) {
            bad_repr += !repr(orr[i]);
            bad_close += !(fabsf(orr[i] - o[i]) <= rel * fabsf(o[i]) + 1e-7f);
        }
        CU_ASSERT_EQUAL(bad_repr, 0);
        CU_ASSERT_EQUAL(bad_close, 0);
        /* the backward from the unrounded forward, dqkv rounded */
        CU_ASSERT_EQUAL(g_k->attention_backward(g_acc, KILN_DTYPE_F32, dr, dout, qkv, o, l, s.B, s.T, s.C, s.NH,
                                                rd[r]),
                        KILN_OK);
        bad_repr = bad_close = 0;
        for (size_t i = 0; i < n_qkv(s); i++) {
            bad_repr += !repr(dr[i]);
            bad_close += !(fabsf(dr[i] - d[i]) <= rel * fabsf(d[i]) + 1e-7f);
        }
        CU_ASSERT_EQUAL(bad_repr, 0);
        CU_ASSERT_EQUAL(bad_close, 0);
    }
    free(x), free(qkv), free(dout), free(o), free(orr), free(l), free(lr), free(d), free(dr);
}

/* --------------------------------------------------------------- errors */

/* The call returned KILN_E_INVALID_ARG with a message holding every
 * fragment (NULL-terminated). */
static void expect_invalid(int32_t rc, const char *const *frags) {
    CU_ASSERT_EQUAL(rc, KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(kiln_test_error_code(g_th), KILN_E_INVALID_ARG);
    for (; *frags; frags++) {
        if (!strstr(kiln_test_error(g_th), *frags)) fprintf(stderr, "message \"%s\" lacks \"%s\"\n", kiln_test_error(g_th), *frags);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), *frags));
    }
    kiln_test_clear_error(g_th);
    kiln_test_clear_error(g_th);
}
#define EXPECT_INVALID(call, ...) expect_invalid((call), (const char *const[]){__VA_ARGS__, NULL})

static void test_errors(void) {
    const shape s = {2, 8, 8, 2};
    float *qkv = calloc(n_qkv(s) + n_out(s) * 2, sizeof *qkv), *out = calloc(n_out(s), sizeof *out),
          *lse = calloc(n_lse(s), sizeof *lse), *dout = calloc(n_out(s), sizeof *dout),
          *dq = calloc(n_qkv(s), sizeof *dq);
    const uint32_t F32 = KILN_DTYPE_F32;
    const kiln_kernels *k = g_k;
    /* forward */
    EXPECT_INVALID(k->attention_forward(g_acc, F32, out, lse, qkv, 2, 8, 10, 4, F32), "attention_forward", "C=10",
                   "NH=4");
    EXPECT_INVALID(k->attention_forward(g_acc, F32, out, lse, qkv, 0, 8, 8, 2, F32), "attention_forward", "B=0");
    EXPECT_INVALID(k->attention_forward(g_acc, F32, out, lse, qkv, 2, -1, 8, 2, F32), "attention_forward", "T=-1");
    EXPECT_INVALID(k->attention_forward(g_acc, F32, out, lse, qkv, 2, 8, 0, 2, F32), "attention_forward", "C=0");
    EXPECT_INVALID(k->attention_forward(g_acc, F32, out, lse, qkv, 2, 8, 8, 0, F32), "attention_forward", "NH=0");
    EXPECT_INVALID(k->attention_forward(g_acc, KILN_DTYPE_F16, out, lse, qkv, 2, 8, 8, 2, F32),
                   "attention_forward", "dtype", "float16");
    EXPECT_INVALID(k->attention_forward(g_acc, F32, out, lse, qkv, 2, 8, 8, 2, KILN_DTYPE_F64), "attention_forward",
                   "round_dtype", "float64");
    EXPECT_INVALID(k->attention_forward(g_acc, KILN_DTYPE_F64, out, lse, qkv, 1, 4, 8, 2, KILN_DTYPE_BF16),
                   "attention_forward", "round_dtype", "bfloat16");
    EXPECT_INVALID(k->attention_forward(g_acc, F32, NULL, lse, qkv, 2, 8, 8, 2, F32), "attention_forward", "out");
    EXPECT_INVALID(k->attention_forward(g_acc, F32, out, NULL, qkv, 2, 8, 8, 2, F32), "attention_forward", "lse");
    EXPECT_INVALID(k->attention_forward(g_acc, F32, out, lse, NULL, 2, 8, 8, 2, F32), "attention_forward", "qkv");
    EXPECT_INVALID(k->attention_forward(g_acc, F32, qkv + 16, lse, qkv, 2, 8, 8, 2, F32), "attention_forward",
                   "overlap", "B=2");
    EXPECT_INVALID(k->attention_forward(g_acc, F32, out, out + 4, qkv, 2, 8, 8, 2, F32), "attention_forward",
                   "overlap");
    /* backward */
    EXPECT_INVALID(k->attention_backward(g_acc, F32, dq, dout, qkv, out, lse, 2, 8, 9, 2, F32), "attention_backward",
                   "C=9", "NH=2");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, dq, dout, qkv, out, lse, 2, 0, 8, 2, F32), "attention_backward",
                   "T=0");
    EXPECT_INVALID(k->attention_backward(g_acc, 99, dq, dout, qkv, out, lse, 2, 8, 8, 2, F32), "attention_backward",
                   "dtype", "99");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, dq, dout, qkv, out, lse, 2, 8, 8, 2, 99), "attention_backward",
                   "round_dtype");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, NULL, dout, qkv, out, lse, 2, 8, 8, 2, F32),
                   "attention_backward", "dqkv");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, dq, NULL, qkv, out, lse, 2, 8, 8, 2, F32), "attention_backward",
                   "dout");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, dq, dout, NULL, out, lse, 2, 8, 8, 2, F32), "attention_backward",
                   "qkv");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, dq, dout, qkv, NULL, lse, 2, 8, 8, 2, F32), "attention_backward",
                   "out");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, dq, dout, qkv, out, NULL, 2, 8, 8, 2, F32), "attention_backward",
                   "lse");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, dq, dout, dq, out, lse, 2, 8, 8, 2, F32), "attention_backward",
                   "overlaps qkv");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, qkv + n_qkv(s), qkv + n_qkv(s) + 8, qkv, out, lse, 2, 8, 8, 2,
                                         F32),
                   "attention_backward", "overlaps dout");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, dq, dout, qkv, dq + 5, lse, 2, 8, 8, 2, F32),
                   "attention_backward", "overlaps out");
    EXPECT_INVALID(k->attention_backward(g_acc, F32, dq, dout, qkv, out, dq + 100, 2, 8, 8, 2, F32),
                   "attention_backward", "overlaps lse");
    /* and the valid call next to them works */
    CU_ASSERT_EQUAL(k->attention_forward(g_acc, F32, out, lse, qkv, 2, 8, 8, 2, F32), KILN_OK);
    CU_ASSERT_EQUAL(k->attention_backward(g_acc, F32, dq, dout, qkv, out, lse, 2, 8, 8, 2, F32), KILN_OK);
    free(qkv), free(out), free(lse), free(dout), free(dq);
}

static CU_TestInfo cases_cpu_attention[] = {
    {"forward vs reference (f32, f64, shapes)", test_forward_vs_reference},
    {"backward vs finite differences (f64)", test_backward_finite_differences},
    {"backward vs reference (f64), f32 vs f64", test_backward_vs_reference},
    {"causality", test_causality},
    {"same bits at 1, 2, 3 threads", test_threads_bit_identical},
    {"f16 / bf16 rounding", test_rounding},
    {"argument errors", test_errors},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "cpu attention", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_cpu_attention},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
