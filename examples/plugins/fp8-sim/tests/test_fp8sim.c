/*
 * test_fp8sim.c — the fp8-sim precision under kiln's installed test host
 * (kiln/testing.h) on the installed "cpu" accelerator, against a reference
 * written here from the OCP FP8 specification (the nearest of the 256 code
 * values, ties to the even code, finite overflow saturating): the
 * per-tensor scale is the power of two that puts amax in the format's top
 * binade; convert_params gives every matrix's compute copy as
 * E4M3(w * s) / s and leaves vectors on their masters; round_activation
 * rounds an activation the same way; the optimizer step rounds the
 * gradients through E5M2 after the closure and before after_closure, skips
 * a parameter without a gradient, and keeps fp32 gradients with
 * grad_dtype = "none"; refusals: fp64 masters, a table older than 1.5, an
 * unknown format name.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>
#include <kiln/kiln.h>
#include <kiln/testing.h>
#include <kiln/testing_cunit.h>

#include "fp8sim_scale.h"

#ifndef FP8SIM_PLUGIN_PATH
#error "FP8SIM_PLUGIN_PATH must name the built libkiln-fp8-sim.so"
#endif

static kiln_test_host *th;
static const kiln_plugin_desc *g_desc;

static int suite_init(void) {
    if (kiln_test_host_new(&th) != KILN_OK) return -1;
    return kiln_test_load(th, FP8SIM_PLUGIN_PATH, KILN_KIND_PRECISION, "fp8-sim", &g_desc) == KILN_OK ? 0 : -1;
}

static int suite_clean(void) {
    kiln_test_host_free(th);
    th = NULL;
    return 0;
}

/* ---------------------------------------------------------- reference */

/* The value of code c: M mantissa bits, bias, E5M2-style infinities. */
static double decode(unsigned c, int M, int bias, int has_inf) {
    const int E = 7 - M, e = (int)((c & 0x7f) >> M), m = (int)(c & ((1u << M) - 1));
    double v;
    if (!has_inf && e == (1 << E) - 1 && m == (1 << M) - 1) return NAN;
    if (has_inf && e == (1 << E) - 1) return m ? NAN : INFINITY;
    v = e == 0 ? ldexp(m, 1 - bias - M) : ldexp((1 << M) + m, e - bias - M);
    return (c & 0x80) ? -v : v;
}

/* x rounded to the nearest finite code (ties: even code), saturating. */
static float ref_round(float x, int e5m2) {
    const int M = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    const double fmax = e5m2 ? 57344.0 : 448.0, a = fabs((double)x);
    if (isnan(x)) return x;
    double best = fmax, bd = INFINITY;
    unsigned bc = 1;
    if (a < fmax)
        for (unsigned c = 0; c < 0x80; c++) {
            const double v = decode(c, M, bias, e5m2);
            if (!isfinite(v)) continue;
            const double d = fabs(a - v);
            if (d < bd || (d == bd && !(c & 1u) && (bc & 1u))) bd = d, best = v, bc = c;
        }
    return (float)(signbit(x) ? -best : best);
}

/* y(n) == FP8(x * s) / s with s from x's amax, element by element. */
static int check_rounded(const float *x, const float *y, size_t n, int e5m2, const char *what) {
    double amax = 0;
    for (size_t i = 0; i < n; i++) amax = fmax(amax, fabs((double)x[i]));
    const double s = fp8sim_scale(amax, e5m2 ? 57344.0 : 448.0, 0);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float want = (float)((double)ref_round((float)(x[i] * s), e5m2) / s);
        if (memcmp(&want, &y[i], sizeof want) != 0 && bad++ < 3)
            fprintf(stderr, "\n  %s[%zu]: %a -> %a, want %a (scale %g)", what, i, x[i], y[i], want, s);
    }
    return bad == 0;
}

/* ----------------------------------------------------------------- tests */

static void test_scale(void) {
    const double amaxes[] = {3e-5, 0.75, 1.0, 447.0, 448.0, 449.0, 1e20};
    for (size_t i = 0; i < sizeof amaxes / sizeof *amaxes; i++) {
        const double s = fp8sim_scale(amaxes[i], 448.0, 0);
        int e;
        CU_ASSERT_EQUAL(frexp(s, &e), 0.5); /* a power of two */
        CU_ASSERT(amaxes[i] * s <= 448.0 && amaxes[i] * s > 224.0);
        CU_ASSERT_EQUAL(fp8sim_scale(amaxes[i], 448.0, 2), s / 4); /* margin: headroom */
    }
    CU_ASSERT_EQUAL(fp8sim_scale(1e-30, 448.0, 0), 0x1p100); /* limited */
    CU_ASSERT_EQUAL(fp8sim_scale(0.0, 448.0, 0), 1.0);
    CU_ASSERT_EQUAL(fp8sim_scale(INFINITY, 448.0, 0), 1.0);
    CU_ASSERT_EQUAL(fp8sim_scale(NAN, 57344.0, 0), 1.0);
}

/* A cpu host with a weight (6, 7), a bias (7) and a weight (7, 3), filled
 * with values of very different magnitudes per tensor. */
static kiln_instance *fresh(const char *cfg, uint32_t dtype) {
    if (kiln_test_reset(th) != KILN_OK || kiln_test_use_accelerator(th, NULL, "cpu", NULL, 1) != KILN_OK) return NULL;
    const int64_t s0[2] = {6, 7}, s1[1] = {7}, s2[2] = {7, 3};
    kiln_parameter *p;
    if (kiln_test_add_param(th, "l0.weight", 2, s0, 0, dtype, &p) || kiln_test_add_param(th, "l0.bias", 1, s1,
                                                                                          KILN_PARAMF_NO_DECAY, dtype, &p) ||
        kiln_test_add_param(th, "l1.weight", 2, s2, 0, dtype, &p) || kiln_test_alloc_params(th))
        return NULL;
    for (uint32_t i = 0; dtype == KILN_DTYPE_F32 && i < 3; i++) {
        p = kiln_test_param(th, i);
        for (int64_t j = 0; j < p->numel; j++) p->data[j] = (float)(sin(1.3 * (double)j + i) * pow(10.0, 2.0 * i - 2));
    }
    kiln_instance *prec = NULL;
    if (kiln_test_create_text(th, g_desc, cfg, &prec) != KILN_OK) return NULL;
    return prec;
}

static void test_weights(void) {
    kiln_instance *prec = fresh("", KILN_DTYPE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(prec);
    CU_ASSERT_EQUAL_FATAL(kiln_test_setup(th, prec), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_convert_params(th, prec), KILN_OK);
    kiln_parameter *w0 = kiln_test_param(th, 0), *b = kiln_test_param(th, 1), *w1 = kiln_test_param(th, 2);
    CU_ASSERT(w0->compute != (void *)w0->data && w1->compute != (void *)w1->data);
    CU_ASSERT_EQUAL(w0->compute_dtype, (uint32_t)KILN_DTYPE_F32);
    CU_ASSERT(b->compute == (void *)b->data); /* vectors stay fp32 */
    CU_ASSERT(check_rounded(w0->data, w0->compute, (size_t)w0->numel, 0, "l0.weight"));
    CU_ASSERT(check_rounded(w1->data, w1->compute, (size_t)w1->numel, 0, "l1.weight"));
    /* the masters are untouched, and some weight really changed */
    int changed = 0;
    for (int64_t j = 0; j < w1->numel; j++) changed += ((float *)w1->compute)[j] != w1->data[j];
    CU_ASSERT(changed > 0);
}

static void test_activations(void) {
    kiln_instance *prec = fresh("activation_dtype = \"float8_e5m2\"", KILN_DTYPE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(prec);
    CU_ASSERT_EQUAL_FATAL(kiln_test_setup(th, prec), KILN_OK);
    const kiln_precision_ops *ops = g_desc->ops;
    CU_ASSERT_FATAL(ops->base.struct_size >= KILN_PRECISION_OPS_SIZE_1_5 && ops->round_activation);
    enum { N = 1000 };
    float *x, orig[N];
    const kiln_kernels *k = kiln_test_kernels(th);
    CU_ASSERT_EQUAL_FATAL(k->alloc(kiln_test_acc(th), sizeof orig, (void **)&x), KILN_OK);
    for (int i = 0; i < N; i++) orig[i] = x[i] = (float)(cos(0.37 * i) * exp(0.02 * i - 10)); /* 5e-5 .. 1e4 */
    CU_ASSERT_EQUAL(ops->round_activation(prec, "layers.0.weight", KILN_DTYPE_F32, x, N), KILN_OK);
    CU_ASSERT(check_rounded(orig, x, N, 1, "activation"));
    /* float64 activations are refused in one line naming the site */
    CU_ASSERT_EQUAL(ops->round_activation(prec, "layers.3.weight", KILN_DTYPE_F64, x, N / 2), KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "activation layers.3.weight is float64"));
    k->free(kiln_test_acc(th), x);
}

/* The closure script: the gradients a backward would leave. */
static int32_t write_grads(void *ctx, double *loss) {
    (void)ctx;
    for (uint32_t i = 0; i < 3; i++) {
        kiln_parameter *p = kiln_test_param(th, i);
        for (int64_t j = 0; j < p->numel; j++) p->grad[j] = (float)(sin(0.7 * (double)j + 3 * i) * pow(10.0, -3.0 * i));
    }
    *loss = 1.0;
    return KILN_OK;
}

static void test_gradients(void) {
    for (int none = 0; none < 2; none++) {
        kiln_instance *prec = fresh(none ? "grad_dtype = \"none\"" : "", KILN_DTYPE_F32);
        CU_ASSERT_PTR_NOT_NULL_FATAL(prec);
        CU_ASSERT_EQUAL_FATAL(kiln_test_setup(th, prec), KILN_OK);
        kiln_parameter *b = kiln_test_param(th, 1);
        b->flags |= KILN_PARAMF_NO_GRAD; /* no backward reached it: left alone */
        int32_t skipped = -1;
        CU_ASSERT_EQUAL(kiln_test_precision_step(th, prec, NULL, write_grads, NULL, &skipped), KILN_OK);
        CU_ASSERT_EQUAL(skipped, 0);
        CU_ASSERT_EQUAL(kiln_test_counters(th)->after_closure, 1); /* after the rounding, once */
        float got[3][64], want[64];
        double dummy;
        for (uint32_t i = 0; i < 3; i++)
            memcpy(got[i], kiln_test_param(th, i)->grad, (size_t)kiln_test_param(th, i)->numel * sizeof(float));
        write_grads(NULL, &dummy); /* the raw gradients again */
        for (uint32_t i = 0; i < 3; i++) {
            kiln_parameter *p = kiln_test_param(th, i);
            memcpy(want, p->grad, (size_t)p->numel * sizeof(float));
            if (none || i == 1) {
                CU_ASSERT_EQUAL(memcmp(got[i], want, (size_t)p->numel * sizeof(float)), 0);
            } else {
                CU_ASSERT(check_rounded(want, got[i], (size_t)p->numel, 1, p->name));
            }
        }
    }
}

static void test_refusals(void) {
    kiln_instance *prec = fresh("", KILN_DTYPE_F64);
    CU_ASSERT_PTR_NOT_NULL_FATAL(prec);
    CU_ASSERT_EQUAL(kiln_test_setup(th, prec), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "l0.weight has float64 masters; expected float32"));

    prec = fresh("", KILN_DTYPE_F32);
    CU_ASSERT_PTR_NOT_NULL_FATAL(prec);
    static kiln_kernels old;
    memcpy(&old, kiln_test_kernels(th), sizeof old);
    old.struct_size = KILN_KERNELS_SIZE_1_4;
    CU_ASSERT_EQUAL_FATAL(kiln_test_set_accelerator(th, kiln_test_acc(th), &old), KILN_OK);
    CU_ASSERT_EQUAL(kiln_test_setup(th, prec), KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "needs an ABI 1.5 kernel table"));

    CU_ASSERT_EQUAL(kiln_test_reset(th), KILN_OK);
    kiln_instance *bad;
    CU_ASSERT_EQUAL(kiln_test_create_text(th, g_desc, "weight_dtype = \"float16\"", &bad), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(
        strstr(kiln_test_error(th), "weight_dtype must be \"float8_e4m3fn\" or \"float8_e5m2\", got \"float16\""));
}

static void register_tests(void) {
    CU_pSuite s = CU_add_suite("fp8sim", suite_init, suite_clean);
    CU_add_test(s, "per-tensor power-of-two scale", test_scale);
    CU_add_test(s, "convert_params: matrices E4M3(w s)/s, vectors fp32", test_weights);
    CU_add_test(s, "round_activation: E5M2(x s)/s; float64 refused", test_activations);
    CU_add_test(s, "gradients E5M2 before after_closure; NO_GRAD skipped; none", test_gradients);
    CU_add_test(s, "refusals: fp64 masters, a 1.4 table, a format name", test_refusals);
}

int main(void) { return kiln_testing_run_cunit(register_tests); }
