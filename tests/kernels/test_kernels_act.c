/*
 * test_kernels_act.c: the third suite of test_kernels_cpu, for the GAN
 * activations of cpu_train.inc (tanh, sigmoid, leaky ReLU with slope 0.2) in
 * float32 and float64. It checks known values (Python's math module, quoted
 * as literals), a dense sweep against double formulas written here (libm's
 * tanh/exp, not the kernels' code), every backward against central finite
 * differences of its forward, the large-|x| behaviour (finite limits, no NaN
 * or overflow, accurate tiny tails), NaN propagation, in-place calls, and
 * that splitting across the thread pool changes no bit. test_kernels_cpu.c
 * registers it.
 */
#include "cpu_kernels.h"
#include "kt_common.h"

#include <CUnit/CUnit.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern CU_TestInfo kt_act_cases[];

/* ------------------------------------------------------------- helpers */

typedef void (*ka_fwd32)(float *, const float *, size_t);
typedef void (*ka_bwd32)(float *, const float *, const float *, size_t);
typedef void (*ka_fwd64)(double *, const double *, size_t);
typedef void (*ka_bwd64)(double *, const double *, const double *, size_t);

enum { KA_TANH, KA_SIGMOID, KA_LEAKY, KA_NACT };
static const char *const ka_names[KA_NACT] = {"tanh", "sigmoid", "leaky_relu"};
static const ka_fwd32 ka_f32[KA_NACT] = {kc_tanh_forward, kc_sigmoid_forward, kc_leaky_relu_forward};
static const ka_bwd32 ka_b32[KA_NACT] = {kc_tanh_backward, kc_sigmoid_backward, kc_leaky_relu_backward};
static const ka_fwd64 ka_f64[KA_NACT] = {kc_tanh_forward_f64, kc_sigmoid_forward_f64, kc_leaky_relu_forward_f64};
static const ka_bwd64 ka_b64[KA_NACT] = {kc_tanh_backward_f64, kc_sigmoid_backward_f64,
                                         kc_leaky_relu_backward_f64};

/* The references, in double, straight from the definitions. sigmoid's
 * negative side uses exp(x) / (1 + exp(x)) only so that the reference itself
 * does not round 1 - tiny. */
static double ref_f(int act, double x) {
    switch (act) {
    case KA_TANH: return tanh(x);
    case KA_SIGMOID: return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
    default: return x > 0 ? x : 0.2 * x;
    }
}
static double ref_df(int act, double x) {
    switch (act) {
    case KA_TANH: {
        const double e = exp(-2.0 * fabs(x)); /* 1 - tanh^2 without cancellation */
        return 4.0 * e / ((1.0 + e) * (1.0 + e));
    }
    case KA_SIGMOID: {
        const double e = exp(-fabs(x));
        return e / ((1.0 + e) * (1.0 + e));
    }
    default: return x > 0 ? 1.0 : 0.2;
    }
}

static test_rng ka_rng = {0x51D2C0FFEEull};
static double ka_unit(void) { return test_rng_unit(&ka_rng); } /* [0, 1) */

/* Counts (and prints the first few) elements outside tolerance. */
static int ka_far(const char *what, int act, const double *x, const double *got, const double *want, size_t n,
                  double rtol, double atol) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!kt_close(got[i], want[i], rtol, atol) && bad++ < 5)
            printf("\n  %s %s(%.9g): got %.17g want %.17g", what, ka_names[act], x[i], got[i], want[i]);
    return bad;
}

/* ---------------------------------------------------------- known values */

/* For x in xs: repr(math.tanh(x)), repr(1/(1+math.exp(-x))), and the
 * derivatives repr(1-math.tanh(x)**2), repr(s*(1-s)). */
static const double kv_x[7] = {0.0, 0.25, 0.5, 1.0, -2.0, 3.5, -0.1};
static const double kv_tanh[7] = {0.0, 0.24491866240370913, 0.46211715726000974, 0.7615941559557649,
                                  -0.9640275800758169, 0.9981778976111987, -0.09966799462495582};
static const double kv_sig[7] = {0.5, 0.5621765008857981, 0.6224593312018546, 0.7310585786300049,
                                 0.11920292202211755, 0.9706877692486436, 0.47502081252106};
static const double kv_dtanh[7] = {1.0, 0.940014848806378, 0.7864477329659274, 0.41997434161402614,
                                   0.07065082485316443, 0.003640884720487403, 0.9900662908474398};
static const double kv_dsig[7] = {0.25, 0.24613408273759835, 0.2350037122015945, 0.19661193324148185,
                                  0.1049935854035065, 0.028453023879735598, 0.24937604019289197};

static void test_act_known_values(void) {
    float x32[7], y32[7], g32[7], one32[7];
    double x64[7], y64[7], g64[7], one64[7], got[7];
    for (int i = 0; i < 7; i++) {
        x64[i] = kv_x[i];
        x32[i] = (float)kv_x[i];
        one32[i] = 1.0f;
        one64[i] = 1.0;
    }
    /* The inputs are exact in float except -0.1: compare float results
     * against the literal at the float input, i.e. within the condition. */
    const double *vals[2] = {kv_tanh, kv_sig}, *ders[2] = {kv_dtanh, kv_dsig};
    for (int act = KA_TANH; act <= KA_SIGMOID; act++) {
        ka_f32[act](y32, x32, 7);
        ka_b32[act](g32, one32, x32, 7);
        for (int i = 0; i < 7; i++) got[i] = y32[i];
        CU_ASSERT_EQUAL(ka_far("f32 known", act, x64, got, vals[act], 7, 1e-6, 1e-9), 0);
        for (int i = 0; i < 7; i++) got[i] = g32[i];
        CU_ASSERT_EQUAL(ka_far("f32 known'", act, x64, got, ders[act], 7, 2e-6, 1e-9), 0);
        ka_f64[act](y64, x64, 7);
        ka_b64[act](g64, one64, x64, 7);
        CU_ASSERT_EQUAL(ka_far("f64 known", act, x64, y64, vals[act], 7, 1e-15, 0), 0);
        /* Python's 1 - tanh(3.5)**2 itself cancels to ~1e-13 relative */
        CU_ASSERT_EQUAL(ka_far("f64 known'", act, x64, g64, ders[act], 7, 2e-13, 0), 0);
    }
    CU_ASSERT_EQUAL(y32[0], 0.5f); /* sigmoid(0) exactly */

    /* leaky ReLU: x > 0 ? x : 0.2 x; its backward x > 0 ? dy : 0.2 dy. */
    const float lx[5] = {2.0f, -1.0f, 0.0f, -0.0f, -5.0f};
    const float dy[5] = {3.0f, 3.0f, 3.0f, 3.0f, -1.0f};
    float ly[5], lg[5];
    kc_leaky_relu_forward(ly, lx, 5);
    kc_leaky_relu_backward(lg, dy, lx, 5);
    CU_ASSERT_EQUAL(ly[0], 2.0f);
    CU_ASSERT_EQUAL(ly[1], -1.0f * 0.2f);
    CU_ASSERT_EQUAL(ly[2], 0.0f);
    CU_ASSERT_EQUAL(ly[4], -5.0f * 0.2f);
    CU_ASSERT_EQUAL(lg[0], 3.0f);
    CU_ASSERT_EQUAL(lg[1], 3.0f * 0.2f);
    CU_ASSERT_EQUAL(lg[2], 3.0f * 0.2f); /* x = 0 is not > 0: torch's choice */
    CU_ASSERT_EQUAL(lg[4], -0.2f);
    const double ldx[3] = {2.0, -1.0, -0.5}, ldy[3] = {1.0, 1.0, 4.0};
    double l64[3], lg64[3];
    kc_leaky_relu_forward_f64(l64, ldx, 3);
    kc_leaky_relu_backward_f64(lg64, ldy, ldx, 3);
    CU_ASSERT_EQUAL(l64[0], 2.0);
    CU_ASSERT_EQUAL(l64[1], -0.2); /* the double 0.2, not (double)0.2f */
    CU_ASSERT_EQUAL(l64[2], -0.5 * 0.2);
    CU_ASSERT_EQUAL(lg64[0], 1.0);
    CU_ASSERT_EQUAL(lg64[1], 0.2);
    CU_ASSERT_EQUAL(lg64[2], 4.0 * 0.2);
}

/* ----------------------------------------------------------- dense sweep */

/* x from -40 to 40: float results within a few ulps of the double formula
 * (relative, tails included: sigmoid(-40) ~ 4e-18 must be right, not 0). */
static void test_act_sweep(void) {
    const size_t n = 20001;
    float *x = kt_alloc(n * sizeof *x), *y = kt_alloc(n * sizeof *y), *one = kt_alloc(n * sizeof *one);
    double *xd = kt_alloc(n * sizeof *xd), *got = kt_alloc(n * sizeof *got), *want = kt_alloc(n * sizeof *want);
    double *yd = kt_alloc(n * sizeof *yd), *oned = kt_alloc(n * sizeof *oned);
    for (size_t i = 0; i < n; i++) {
        x[i] = -40.0f + 80.0f * (float)i / (float)(n - 1);
        xd[i] = x[i];
        one[i] = 1.0f;
        oned[i] = 1.0;
    }
    for (int act = 0; act < KA_NACT; act++) {
        ka_f32[act](y, x, n);
        for (size_t i = 0; i < n; i++) got[i] = y[i], want[i] = ref_f(act, xd[i]);
        CU_ASSERT_EQUAL(ka_far("f32 sweep", act, xd, got, want, n, 6e-7, 0), 0);
        ka_b32[act](y, one, x, n);
        for (size_t i = 0; i < n; i++) got[i] = y[i], want[i] = ref_df(act, xd[i]);
        CU_ASSERT_EQUAL(ka_far("f32 sweep'", act, xd, got, want, n, 8e-7, 0), 0);
        ka_f64[act](yd, xd, n);
        for (size_t i = 0; i < n; i++) want[i] = ref_f(act, xd[i]);
        CU_ASSERT_EQUAL(ka_far("f64 sweep", act, xd, yd, want, n, 1e-15, 0), 0);
        ka_b64[act](yd, oned, xd, n);
        for (size_t i = 0; i < n; i++) want[i] = ref_df(act, xd[i]);
        CU_ASSERT_EQUAL(ka_far("f64 sweep'", act, xd, yd, want, n, 2e-15, 0), 0);
    }
    /* Small |x|, where tanh switches to its polynomial and 1 - e would
     * cancel: relative accuracy must hold down to denormal-free tiny x. */
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)((i % 2 ? 1.0 : -1.0) * ldexp(1.0 + ka_unit(), -(int)(i % 40)));
        xd[i] = x[i];
    }
    ka_f32[KA_TANH](y, x, n);
    for (size_t i = 0; i < n; i++) got[i] = y[i], want[i] = tanh(xd[i]);
    CU_ASSERT_EQUAL(ka_far("f32 small", KA_TANH, xd, got, want, n, 3e-7, 0), 0);
    ka_b32[KA_TANH](y, one, x, n);
    for (size_t i = 0; i < n; i++) {
        got[i] = y[i], want[i] = ref_df(KA_TANH, xd[i]);
        CU_ASSERT(y[i] <= 1.0f); /* never above the true maximum */
    }
    CU_ASSERT_EQUAL(ka_far("f32 small'", KA_TANH, xd, got, want, n, 3e-7, 0), 0);
    free(x), free(y), free(one), free(xd), free(got), free(want), free(yd), free(oned);
}

/* ------------------------------------------------- finite differences */

/* L = sum(W .* f(x)): dL/dx_i = W_i f'(x_i). Central differences of the
 * kernels' own forward (float: eps 1e-2 in double from float outputs; double:
 * eps 1e-6), away from leaky ReLU's kink. */
static void test_act_fd(void) {
    enum { N = 301 };
    float x[N], xp[N], xm[N], yp[N], ym[N], W[N], dx[N];
    double xd[N], xpd[N], xmd[N], ypd[N], ymd[N], Wd[N], dxd[N], got[N], num[N];
    for (int i = 0; i < N; i++) {
        double v = -6.0 + 12.0 * ka_unit();
        if (fabs(v) < 0.05) v = v < 0 ? -0.05 : 0.05;
        xd[i] = x[i] = (float)v;
        Wd[i] = W[i] = (float)(2.0 * ka_unit() - 1.0);
    }
    for (int act = 0; act < KA_NACT; act++) {
        for (int i = 0; i < N; i++) xp[i] = x[i] + 1e-2f, xm[i] = x[i] - 1e-2f;
        ka_f32[act](yp, xp, N);
        ka_f32[act](ym, xm, N);
        ka_b32[act](dx, W, x, N);
        for (int i = 0; i < N; i++) {
            got[i] = dx[i];
            num[i] = (double)W[i] * ((double)yp[i] - (double)ym[i]) / ((double)xp[i] - (double)xm[i]);
        }
        /* truncation eps^2 |f'''| / 6 < 3e-5; float rounding ~ 1e-7 / eps */
        CU_ASSERT_EQUAL(ka_far("f32 fd", act, xd, got, num, N, 2e-3, 5e-5), 0);

        for (int i = 0; i < N; i++) xpd[i] = xd[i] + 1e-6, xmd[i] = xd[i] - 1e-6;
        ka_f64[act](ypd, xpd, N);
        ka_f64[act](ymd, xmd, N);
        ka_b64[act](dxd, Wd, xd, N);
        for (int i = 0; i < N; i++) num[i] = Wd[i] * (ypd[i] - ymd[i]) / (xpd[i] - xmd[i]);
        CU_ASSERT_EQUAL(ka_far("f64 fd", act, xd, dxd, num, N, 1e-7, 1e-9), 0);
    }
}

/* ------------------------------------------------------- large |x|, NaN */

static void test_act_extremes(void) {
    enum { N = 12 };
    const float x[N] = {1e4f, -1e4f, 100.0f, -100.0f, 40.0f, -40.0f, FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, NAN,
                        -87.0f};
    const float dy[N] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    float y[N], g[N];
    double xd[N], yd[N], gd[N], dyd[N];
    for (int i = 0; i < N; i++) xd[i] = x[i], dyd[i] = 1.0;

    kc_tanh_forward(y, x, N);
    kc_tanh_backward(g, dy, x, N);
    for (int i = 0; i < N - 2; i++) {
        CU_ASSERT_EQUAL(y[i], i % 2 ? -1.0f : 1.0f);
        CU_ASSERT(g[i] >= 0.0f && g[i] < 1e-30f); /* 4 e^-80 ~ 7e-35 at 40 */
    }
    CU_ASSERT(isnan(y[10]) && isnan(g[10]));
    CU_ASSERT_EQUAL(y[11], -1.0f);
    CU_ASSERT_EQUAL(g[11], 0.0f); /* 4 e^-174 underflows */

    kc_sigmoid_forward(y, x, N);
    kc_sigmoid_backward(g, dy, x, N);
    for (int i = 0; i < N - 2; i++) {
        if (i % 2 == 0) CU_ASSERT_EQUAL(y[i], 1.0f);
        if (i == 1 || i == 7 || i == 9) CU_ASSERT_EQUAL(y[i], 0.0f); /* -1e4, -FLT_MAX, -inf */
        CU_ASSERT(g[i] >= 0.0f && isfinite(g[i]));
    }
    /* the tails are the true tiny values, not 0 and not a clamp */
    CU_ASSERT(kt_close(y[5], exp(-40.0), 1e-6, 0));
    CU_ASSERT(kt_close(g[4], exp(-40.0), 1e-6, 0));
    CU_ASSERT(kt_close(y[11], exp(-87.0), 1e-6, 0)); /* 1.6e-38: near FLT_MIN */
    CU_ASSERT(y[3] > 0.0f && kt_close(y[3], 3.7200759760208356e-44, 0.05, 0)); /* subnormal */
    CU_ASSERT(isnan(y[10]) && isnan(g[10]));

    kc_leaky_relu_forward(y, x, N);
    CU_ASSERT_EQUAL(y[0], 1e4f);
    CU_ASSERT_EQUAL(y[1], -1e4f * 0.2f);
    CU_ASSERT(isinf(y[8]) && y[8] > 0 && isinf(y[9]) && y[9] < 0);
    CU_ASSERT(isnan(y[10]));

    kc_tanh_forward_f64(yd, xd, N);
    kc_tanh_backward_f64(gd, dyd, xd, N);
    for (int i = 0; i < N - 2; i++) {
        CU_ASSERT_EQUAL(yd[i], i % 2 ? -1.0 : 1.0);
        CU_ASSERT(gd[i] >= 0.0 && gd[i] < 1e-30);
    }
    CU_ASSERT(isnan(yd[10]) && isnan(gd[10]));
    kc_sigmoid_forward_f64(yd, xd, N);
    kc_sigmoid_backward_f64(gd, dyd, xd, N);
    CU_ASSERT_EQUAL(yd[0], 1.0);
    CU_ASSERT(kt_close(yd[3], exp(-100.0), 1e-14, 0));
    CU_ASSERT(kt_close(yd[5], exp(-40.0) / (1.0 + exp(-40.0)), 1e-14, 0));
    CU_ASSERT_EQUAL(yd[9], 0.0);
    CU_ASSERT_EQUAL(gd[8], 0.0);
    CU_ASSERT(isnan(yd[10]) && isnan(gd[10]));
    for (int i = 0; i < N - 2; i++) CU_ASSERT(isfinite(gd[i]));
}

/* ------------------------------------------------ in place and threads */

/* Activation act's forward (out = f(in)) or backward (out = f'(x) * in,
 * in = dy), in float32 or float64. */
static void act_call(int act, int f64, int bwd, void *out, const void *in, const void *x, size_t n) {
    if (!f64 && !bwd) ka_f32[act](out, in, n);
    else if (!f64) ka_b32[act](out, in, x, n);
    else if (!bwd) ka_f64[act](out, in, n);
    else ka_b64[act](out, in, x, n);
}

/* act_call at 1 thread into a, then in place on b (a copy of in) at
 * `threads`, maybe split: the same bytes. */
static void check_in_place(int act, int f64, int bwd, int threads, void *a, void *b, const void *in, const void *x,
                           size_t n) {
    const size_t bytes = n * (f64 ? sizeof(double) : sizeof(float));
    kc_set_num_threads(1);
    act_call(act, f64, bwd, a, in, x, n);
    kc_set_num_threads(threads);
    memcpy(b, in, bytes);
    act_call(act, f64, bwd, b, b, x, n);
    CU_ASSERT(memcmp(a, b, bytes) == 0);
}

static void test_act_in_place_and_threads(void) {
    /* Big enough that 2 threads split it (> 2 * KC_GRAIN_STREAM floats). */
    const size_t n = 3 * ((size_t)1 << 18) + 77;
    float *x = kt_alloc(n * sizeof *x), *dy = kt_alloc(n * sizeof *dy), *a = kt_alloc(n * sizeof *a);
    float *b = kt_alloc(n * sizeof *b);
    double *xd = kt_alloc(n * sizeof *xd), *dyd = kt_alloc(n * sizeof *dyd), *ad = kt_alloc(n * sizeof *ad);
    double *bd = kt_alloc(n * sizeof *bd);
    for (size_t i = 0; i < n; i++) {
        xd[i] = x[i] = (float)(16.0 * ka_unit() - 8.0);
        dyd[i] = dy[i] = (float)(2.0 * ka_unit() - 1.0);
    }
    for (int act = 0; act < KA_NACT; act++) {
        for (int threads = 1; threads <= 2; threads++) {
            /* float32 forward, backward, then float64 forward, backward */
            check_in_place(act, 0, 0, threads, a, b, x, x, n);
            check_in_place(act, 0, 1, threads, a, b, dy, x, n);
            check_in_place(act, 1, 0, threads, ad, bd, xd, xd, n);
            check_in_place(act, 1, 1, threads, ad, bd, dyd, xd, n);
        }
    }
    CU_ASSERT_EQUAL(kc_set_num_threads(1), 1);
    free(x), free(dy), free(a), free(b), free(xd), free(dyd), free(ad), free(bd);
}

/* ------------------------------------------------------------------ main */

/* The cases of this suite; test_kernels_cpu.c registers them. */
CU_TestInfo kt_act_cases[] = {
    {"act_known_values", test_act_known_values},
    {"act_sweep_vs_double", test_act_sweep},
    {"act_backward_fd", test_act_fd},
    {"act_large_x_and_nan", test_act_extremes},
    {"act_in_place_and_threads", test_act_in_place_and_threads},
    CU_TEST_INFO_NULL,
};
