/*
 * test_lion.c — the lion optimizer plugin under kiln's installed test host
 * (kiln/testing.h), on the installed "cpu" accelerator: three steps on a
 * weight and a no-decay bias equal a reference Lion written here from the
 * plugin's formulas, bit for bit, in float32 and float64; a parameter the
 * host marked KILN_PARAMF_NO_GRAD is left alone (weights and momentum);
 * the state moved to a fresh instance continues bit for bit; another
 * model's state and a kernel table older than ABI 1.5 are refused with one
 * line; a configuration outside the ranges is refused at create.
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

#ifndef LION_PLUGIN_PATH
#error "LION_PLUGIN_PATH must name the built libkiln-lion.so"
#endif

static kiln_test_host *th;
static const kiln_plugin_desc *g_desc;

static int suite_init(void) {
    if (kiln_test_host_new(&th) != KILN_OK) return -1;
    return kiln_test_load(th, LION_PLUGIN_PATH, KILN_KIND_OPTIMIZER, "lion", &g_desc) == KILN_OK ? 0 : -1;
}

static int suite_clean(void) {
    kiln_test_host_free(th);
    th = NULL;
    return 0;
}

#define LR 0.01
#define B1 0.9
#define B2 0.99
#define WD 0.1
static const char *const g_cfg = "lr = 0.01; beta1 = 0.9; beta2 = 0.99; weight_decay = 0.1";

/* A fresh host on the cpu accelerator with a weight (3, 5) and a bias (5)
 * flagged no-decay, in `dt`, filled with a fixed pattern. */
static void fresh_params(uint32_t dt) {
    CU_ASSERT_EQUAL_FATAL(kiln_test_reset(th), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_use_accelerator(th, NULL, "cpu", NULL, 1), KILN_OK);
    const int64_t ws[2] = {3, 5}, bs[1] = {5};
    kiln_parameter *w, *b;
    CU_ASSERT_EQUAL_FATAL(kiln_test_add_param(th, "w", 2, ws, 0, dt, &w), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_add_param(th, "b", 1, bs, KILN_PARAMF_NO_DECAY, dt, &b), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(th), KILN_OK);
    for (uint32_t i = 0; i < kiln_test_param_count(th); i++) {
        kiln_parameter *p = kiln_test_param(th, i);
        for (int64_t j = 0; j < p->numel; j++) {
            const double v = sin(1.7 * (double)(j + 11 * i)) * 0.5;
            if (dt == KILN_DTYPE_F64) ((double *)p->data)[j] = v;
            else p->data[j] = (float)v;
        }
    }
}

/* Gradients of step s (host memory: the cpu accelerator's is). Element 4
 * of the bias is 0 at step 1, so sign() sees an exact zero somewhere. */
static void set_grads(uint32_t dt, int s) {
    for (uint32_t i = 0; i < kiln_test_param_count(th); i++) {
        kiln_parameter *p = kiln_test_param(th, i);
        for (int64_t j = 0; j < p->numel; j++) {
            double g = cos(0.9 * (double)(j + 3 * s + 7 * i)) * 0.02;
            if (i == 1 && j == 4 && s == 1) g = 0.0;
            if (dt == KILN_DTYPE_F64) ((double *)p->grad)[j] = g;
            else p->grad[j] = (float)g;
        }
    }
}

/* The reference step of one parameter, from the plugin's formulas: lerp as
 * torch.lerp (weight below 0.5: a + w (b - a)), sign, decoupled decay,
 * p + (-lr) c, m = lerp(m, g, 1 - beta2). Scalars rounded to the type. */
static void ref_f32(float *p, float *m, const float *g, int64_t n, double wd) {
    const float w1 = (float)(1.0 - B1), w2 = (float)(1.0 - B2), decay = (float)(1.0 - LR * wd), nlr = (float)-LR;
    for (int64_t j = 0; j < n; j++) {
        const float c = m[j] + w1 * (g[j] - m[j]);
        const float s = c > 0 ? 1.0f : c < 0 ? -1.0f : 0.0f;
        float q = p[j];
        if (wd != 0.0) q = q * decay;
        p[j] = q + nlr * s;
        m[j] = m[j] + w2 * (g[j] - m[j]);
    }
}
static void ref_f64(double *p, double *m, const double *g, int64_t n, double wd) {
    for (int64_t j = 0; j < n; j++) {
        const double c = m[j] + (1.0 - B1) * (g[j] - m[j]);
        const double s = c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0;
        double q = p[j];
        if (wd != 0.0) q = q * (1.0 - LR * wd);
        p[j] = q + (-LR) * s;
        m[j] = m[j] + (1.0 - B2) * (g[j] - m[j]);
    }
}

static void check_reference(uint32_t dt) {
    fresh_params(dt);
    kiln_instance *opt;
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(th, g_desc, g_cfg, &opt), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_setup(th, opt), KILN_OK);
    const size_t sz = dt == KILN_DTYPE_F64 ? 8 : 4;
    /* the reference's copies: weights and momenta of both parameters */
    void *rp[2], *rm[2];
    for (uint32_t i = 0; i < 2; i++) {
        kiln_parameter *p = kiln_test_param(th, i);
        rp[i] = malloc((size_t)p->numel * sz);
        rm[i] = calloc((size_t)p->numel, sz);
        memcpy(rp[i], p->data, (size_t)p->numel * sz);
    }
    for (int s = 0; s < 3; s++) {
        set_grads(dt, s);
        CU_ASSERT_EQUAL(kiln_test_optimizer_step(th, opt, NULL, NULL), KILN_OK);
        for (uint32_t i = 0; i < 2; i++) {
            kiln_parameter *p = kiln_test_param(th, i);
            const double wd = i == 1 ? 0.0 : WD; /* the bias is no-decay */
            if (dt == KILN_DTYPE_F64) ref_f64(rp[i], rm[i], (const double *)p->grad, p->numel, wd);
            else ref_f32(rp[i], rm[i], p->grad, p->numel, wd);
            if (memcmp(rp[i], p->data, (size_t)p->numel * sz) != 0) {
                fprintf(stderr, "\n  %s, step %d, %s: weights differ from the reference\n", kiln_dtype_name(dt), s,
                        p->name);
                CU_FAIL("lion differs from the reference");
            }
        }
    }
    for (int i = 0; i < 2; i++) free(rp[i]), free(rm[i]);
}

static void test_reference_f32(void) { check_reference(KILN_DTYPE_F32); }
static void test_reference_f64(void) { check_reference(KILN_DTYPE_F64); }

/* A parameter without a gradient: nothing of it moves, including its
 * momentum (the next step with a gradient equals a step from m = 0). */
static void test_no_grad(void) {
    fresh_params(KILN_DTYPE_F32);
    kiln_instance *opt, *twin;
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(th, g_desc, g_cfg, &opt), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(th, g_desc, g_cfg, &twin), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_setup(th, opt), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_setup(th, twin), KILN_OK);
    kiln_parameter *w = kiln_test_param(th, 0);
    float before[15];
    memcpy(before, w->data, sizeof before);
    set_grads(KILN_DTYPE_F32, 0);
    w->flags |= KILN_PARAMF_NO_GRAD;
    CU_ASSERT_EQUAL(kiln_test_optimizer_step(th, opt, NULL, NULL), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(before, w->data, sizeof before), 0);
    /* opt's momentum of w is still zero: its step now equals the twin's first */
    w->flags &= ~KILN_PARAMF_NO_GRAD;
    set_grads(KILN_DTYPE_F32, 1);
    CU_ASSERT_EQUAL(kiln_test_optimizer_step(th, opt, NULL, NULL), KILN_OK);
    float after_opt[15];
    memcpy(after_opt, w->data, sizeof after_opt);
    memcpy(w->data, before, sizeof before);
    CU_ASSERT_EQUAL(kiln_test_optimizer_step(th, twin, NULL, NULL), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(after_opt, w->data, sizeof after_opt), 0);
    /* no gradient anywhere: not even the bias moves */
    kiln_parameter *b = kiln_test_param(th, 1);
    float bb[5];
    memcpy(bb, b->data, sizeof bb);
    w->flags |= KILN_PARAMF_NO_GRAD;
    b->flags |= KILN_PARAMF_NO_GRAD;
    CU_ASSERT_EQUAL(kiln_test_optimizer_step(th, opt, NULL, NULL), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(bb, b->data, sizeof bb), 0);
}

/* The state of an optimizer after three steps, moved into a fresh one:
 * the fourth step is the same on both. */
static void test_state_roundtrip(void) {
    fresh_params(KILN_DTYPE_F32);
    kiln_instance *a, *b;
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(th, g_desc, g_cfg, &a), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_setup(th, a), KILN_OK);
    for (int s = 0; s < 3; s++) {
        set_grads(KILN_DTYPE_F32, s);
        CU_ASSERT_EQUAL(kiln_test_optimizer_step(th, a, NULL, NULL), KILN_OK);
    }
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(th, g_desc, "lr = 0.5; weight_decay = 0.1", &b), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_setup(th, b), KILN_OK);
    uint32_t version = 0;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(kiln_test_state_roundtrip(th, a, b, &version, &size), KILN_OK);
    CU_ASSERT_EQUAL(version, 1u);
    double lr = 0;
    CU_ASSERT_EQUAL(kiln_test_get_lr(th, b, &lr), KILN_OK);
    CU_ASSERT_EQUAL(lr, LR); /* the learning rate travels with the state */
    kiln_parameter *w = kiln_test_param(th, 0);
    float snap[15], after_a[15];
    memcpy(snap, w->data, sizeof snap);
    set_grads(KILN_DTYPE_F32, 3);
    CU_ASSERT_EQUAL(kiln_test_optimizer_step(th, a, NULL, NULL), KILN_OK);
    memcpy(after_a, w->data, sizeof after_a);
    memcpy(w->data, snap, sizeof snap);
    /* b's weights: restore the bias too, a stepped it */
    CU_ASSERT_EQUAL(kiln_test_optimizer_step(th, b, NULL, NULL), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(after_a, w->data, sizeof after_a), 0);

    /* another model's state: one line naming the parameter and both sizes */
    void *blob;
    CU_ASSERT_EQUAL_FATAL(kiln_test_get_state(th, a, &version, &blob, &size), KILN_OK);
    unsigned char *bad = malloc(size);
    memcpy(bad, blob, size);
    const int64_t other = 7; /* w's recorded numel, after the 32-byte header */
    memcpy(bad + 32, &other, sizeof other);
    CU_ASSERT_EQUAL(kiln_test_set_state(th, b, version, bad, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "parameter 0 (w) has 7 elements there, 15 here"));
    CU_ASSERT_EQUAL(kiln_test_set_state(th, b, version, blob, size - 4), KILN_E_STATE);
    free(bad);
    kiln_test_free_state(th, blob);
}

/* The cpu table cut to ABI 1.4's size: setup refuses it in one line. */
static void test_old_table(void) {
    fresh_params(KILN_DTYPE_F32);
    static kiln_kernels old;
    memcpy(&old, kiln_test_kernels(th), sizeof old);
    old.struct_size = KILN_KERNELS_SIZE_1_4;
    CU_ASSERT_EQUAL_FATAL(kiln_test_set_accelerator(th, kiln_test_acc(th), &old), KILN_OK);
    kiln_instance *opt;
    CU_ASSERT_EQUAL_FATAL(kiln_test_create_text(th, g_desc, g_cfg, &opt), KILN_OK);
    CU_ASSERT_EQUAL(kiln_test_setup(th, opt), KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "ABI 1.5 kernel entries lerp and sign"));
    CU_ASSERT_PTR_NULL(strchr(kiln_test_error(th), '\n'));
}

static void test_config(void) {
    CU_ASSERT_EQUAL(kiln_test_reset(th), KILN_OK);
    kiln_instance *opt;
    CU_ASSERT_EQUAL(kiln_test_create_text(th, g_desc, "beta1 = 1.5", &opt), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), "beta1 must be in [0, 1], got 1.5"));
    CU_ASSERT_EQUAL(kiln_test_create_text(th, g_desc, "lr = -1.0", &opt), KILN_E_CONFIG);
    CU_ASSERT_EQUAL(kiln_test_create_text(th, g_desc, "weight_decay = -0.1", &opt), KILN_E_CONFIG);
}

static void register_tests(void) {
    CU_pSuite s = CU_add_suite("lion", suite_init, suite_clean);
    CU_add_test(s, "three steps = the reference, float32, bit for bit", test_reference_f32);
    CU_add_test(s, "three steps = the reference, float64, bit for bit", test_reference_f64);
    CU_add_test(s, "KILN_PARAMF_NO_GRAD: weights and momentum untouched", test_no_grad);
    CU_add_test(s, "state round trip continues bit for bit; other models refused", test_state_roundtrip);
    CU_add_test(s, "a kernel table older than 1.5 refused", test_old_table);
    CU_add_test(s, "configuration ranges", test_config);
}

int main(void) { return kiln_testing_run_cunit(register_tests); }
