/*
 * test_optim.c — the "sgd" and "adamw" optimizer plugins, loaded through the
 * test host and run on the "cpu" accelerator plugin (also loaded, and handed
 * to the optimizers through the test host's accelerator service, as the real
 * host does). Two parameters are registered: "weight" (2, 3) with no flags
 * and "bias" (3) flagged KILN_PARAMF_NO_DECAY. Each step's gradients are
 * written by the closure, like a backward pass, so the tests also see that
 * the closure runs before the update.
 *
 * The expected values are NOT produced by the kernels: ref_sgd and ref_adamw
 * below are straightforward double-precision re-statements of the update
 * rules in the pseudo-code of the PyTorch documentation (torch.optim.SGD and
 * torch.optim.AdamW, amsgrad=False, maximize=False). The hyperparameters
 * given to the references are the float values the plugins pass through the
 * ABI's kernel table ((double)(float)x), so what remains is float rounding
 * inside the kernels, well inside the 1e-6 relative tolerance.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include <kiln/testing.h>

#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

/* ----------------------------------------------------------- environment */

#define NW 6 /* weight (2, 3) */
#define NB 3 /* bias (3)      */
#define NSTEPS 3

static const kiln_plugin_desc *g_cpu, *g_sgd, *g_adamw;
static kiln_instance *g_acc;
static kiln_parameter *g_w, *g_b;

static int suite_init(void) {
    g_cpu = fixture_load_plugin(g_th, "cpu", KILN_KIND_ACCELERATOR, "cpu");
    g_sgd = fixture_load_plugin(g_th, "sgd", KILN_KIND_OPTIMIZER, "sgd");
    g_adamw = fixture_load_plugin(g_th, "adamw", KILN_KIND_OPTIMIZER, "adamw");
    return g_cpu && g_sgd && g_adamw ? 0 : -1;
}

static int suite_clean(void) { return 0; }

static const kiln_optimizer_ops *ops_of(const kiln_plugin_desc *d) { return d->ops; }

/* Initial parameter values (away from 0 so relative tolerances are meaningful). */
static const float W0[NW] = {0.5f, -0.25f, 0.75f, -1.0f, 0.125f, 1.5f};
static const float B0[NB] = {0.3f, -0.6f, 0.9f};

/* Gradients of each step, weight then bias, as the closure's "backward" writes them. */
static const float GRADS[NSTEPS][NW + NB] = {
    {0.1f, -0.2f, 0.3f, -0.4f, 0.5f, -0.6f, 0.05f, -0.15f, 0.25f},
    {-0.3f, 0.1f, 0.2f, 0.6f, -0.5f, 0.4f, -0.2f, 0.1f, 0.3f},
    {0.25f, 0.35f, -0.45f, 0.15f, 0.05f, -0.55f, 0.4f, -0.35f, -0.1f},
};

/* Fresh test host with the two parameters and the cpu accelerator. */
static void env_begin(void) {
    kiln_test_reset(g_th);
    const int64_t wshape[2] = {2, 3}, bshape[1] = {3};
    g_w = fixture_param(g_th, "weight", 2, wshape, 0);
    g_b = fixture_param(g_th, "bias", 1, bshape, KILN_PARAMF_NO_DECAY);
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(g_th), 0);
    memcpy(g_w->data, W0, sizeof W0);
    memcpy(g_b->data, B0, sizeof B0);
    g_acc = fixture_accel_install(g_th, g_cpu);
}

static void env_end(void) { fixture_accel_remove(g_th, g_cpu, &g_acc); }

/* The closure: counts calls, writes the gradients of step `calls` (like
 * zero_grad + backward), and fails on request. */
typedef struct {
    int calls;
    int fail;
} closure_ctx;

static void set_grads(int step) {
    memcpy(g_w->grad, GRADS[step], NW * sizeof(float));
    memcpy(g_b->grad, GRADS[step] + NW, NB * sizeof(float));
}

static int32_t closure_call(void *vctx, double *loss) {
    closure_ctx *c = vctx;
    if (c->fail) {
        c->calls++;
        kiln_test_services(g_th)->set_error(kiln_test_hctx(g_th), KILN_E_NONFINITE, "closure: the loss is NaN");
        return KILN_E_NONFINITE;
    }
    set_grads(c->calls % NSTEPS);
    c->calls++;
    *loss = 1.0;
    return KILN_OK;
}

static kiln_instance *make(const kiln_plugin_desc *d, const kiln_kv *cfg) {
    kiln_instance *inst = NULL;
    int32_t rc = ops_of(d)->base.create(d->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &inst);
    if (rc != KILN_OK) fprintf(stderr, "create %s: %s\n", d->name, kiln_test_error(g_th));
    CU_ASSERT_EQUAL(rc, KILN_OK);
    if (inst) CU_ASSERT_EQUAL(ops_of(d)->setup(inst, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    return inst;
}

/* Compares both parameters with the reference, 1e-6 relative. */
static void expect_params(const double *rw, const double *rb, const char *what) {
    int bad = 0;
    for (int i = 0; i < NW + NB; i++) {
        double got = i < NW ? g_w->data[i] : g_b->data[i - NW];
        double want = i < NW ? rw[i] : rb[i - NW];
        if (fabs(got - want) > 1e-6 * fabs(want) + 1e-9) {
            if (bad++ < 3) fprintf(stderr, "%s: element %d is %.9g, expected %.9g\n", what, i, got, want);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* NSTEPS steps of the optimizer `d` with `cfg`, one closure call each, on
 * the fresh environment (which it ends), then the parameters against the
 * reference theta (weight, then bias). */
static void run_steps(const kiln_plugin_desc *d, const kiln_kv *cfg, const double *theta, const char *what) {
    kiln_instance *opt = make(d, cfg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(opt);
    closure_ctx c = {0, 0};
    kiln_closure cl = {sizeof cl, 0, &c, closure_call};
    for (int s = 0; s < NSTEPS; s++) CU_ASSERT_EQUAL(ops_of(d)->step(opt, &cl), KILN_OK);
    CU_ASSERT_EQUAL(c.calls, NSTEPS);
    expect_params(theta, theta + NW, what);
    ops_of(d)->base.destroy(opt);
    env_end();
}

#define FKV(k, x) {(k), {KILN_TYPE_FLOAT, 0, {.f = (x)}}}
#define BKV(k, x) {(k), {KILN_TYPE_BOOL, 0, {.i = (x)}}}
#define END_KV {NULL, KILN_V_NONE}
#define F(x) ((double)(float)(x)) /* what reaches the kernel through the ABI */

/* ------------------------------------------------------------------- SGD */

typedef struct {
    double lr, momentum, dampening, weight_decay;
    int nesterov;
} sgd_hp;

/*
 * torch.optim.SGD, from its documentation's pseudo-code:
 *   g_t = grad
 *   if weight_decay != 0: g_t = g_t + weight_decay * theta
 *   if momentum != 0:
 *     b_t = (t > 1) ? momentum * b_{t-1} + (1 - dampening) * g_t : g_t
 *     g_t = nesterov ? g_t + momentum * b_t : b_t
 *   theta = theta - lr * g_t
 * Weight decay applies to every parameter, the bias included.
 */
static void ref_sgd(const sgd_hp *h, int steps, double *theta /* (NW+NB) */) {
    double buf[NW + NB] = {0};
    for (int i = 0; i < NW; i++) theta[i] = W0[i];
    for (int i = 0; i < NB; i++) theta[NW + i] = B0[i];
    for (int t = 1; t <= steps; t++) {
        for (int i = 0; i < NW + NB; i++) {
            double g = GRADS[t - 1][i];
            if (h->weight_decay != 0) g += F(h->weight_decay) * theta[i];
            if (h->momentum != 0) {
                buf[i] = t > 1 ? F(h->momentum) * buf[i] + (1.0 - F(h->dampening)) * g : g;
                g = h->nesterov ? g + F(h->momentum) * buf[i] : buf[i];
            }
            theta[i] -= F(h->lr) * g;
        }
    }
}

static void run_sgd_case(const sgd_hp *h, const char *what) {
    env_begin();
    const kiln_kv cfg[] = {FKV("lr", h->lr), FKV("momentum", h->momentum), FKV("dampening", h->dampening),
                           BKV("nesterov", h->nesterov), FKV("weight_decay", h->weight_decay), END_KV};
    double theta[NW + NB];
    ref_sgd(h, NSTEPS, theta);
    run_steps(g_sgd, cfg, theta, what);
}

static void test_sgd_plain(void) {
    sgd_hp h = {0.1, 0.0, 0.0, 0.0, 0};
    run_sgd_case(&h, "sgd plain");
}
static void test_sgd_momentum(void) {
    sgd_hp h = {0.1, 0.9, 0.0, 0.0, 0};
    run_sgd_case(&h, "sgd momentum");
}
static void test_sgd_nesterov(void) {
    sgd_hp h = {0.05, 0.9, 0.0, 0.0, 1};
    run_sgd_case(&h, "sgd nesterov");
}
static void test_sgd_dampening(void) {
    sgd_hp h = {0.1, 0.8, 0.3, 0.0, 0};
    run_sgd_case(&h, "sgd dampening");
}
static void test_sgd_weight_decay(void) {
    sgd_hp h = {0.1, 0.5, 0.0, 0.05, 0};
    run_sgd_case(&h, "sgd weight decay");
    /* The bias is decayed too (torch.optim.SGD decays every parameter):
     * the result must differ from an undecayed run by far more than the
     * tolerance, or the comparison above proves nothing. */
    sgd_hp h0 = h;
    h0.weight_decay = 0.0;
    double with[NW + NB], without[NW + NB];
    ref_sgd(&h, NSTEPS, with);
    ref_sgd(&h0, NSTEPS, without);
    CU_ASSERT_TRUE(fabs(with[NW] - without[NW]) > 1e-4);
}

/* ----------------------------------------------------------------- AdamW */

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int decay_bias;
} adamw_hp;

/*
 * torch.optim.AdamW, from its documentation's pseudo-code (amsgrad off):
 *   theta = theta - lr * weight_decay * theta
 *   m = beta1 * m + (1 - beta1) * g
 *   v = beta2 * v + (1 - beta2) * g^2
 *   m_hat = m / (1 - beta1^t);  v_hat = v / (1 - beta2^t)
 *   theta = theta - lr * m_hat / (sqrt(v_hat) + eps)
 * kiln's one difference: the bias (KILN_PARAMF_NO_DECAY) gets weight decay 0
 * unless decay_bias.
 */
static void ref_adamw(const adamw_hp *h, int steps, double *theta /* (NW+NB) */) {
    double m[NW + NB] = {0}, v[NW + NB] = {0};
    const double lr = F(h->lr), b1 = F(h->beta1), b2 = F(h->beta2), eps = F(h->eps);
    for (int i = 0; i < NW; i++) theta[i] = W0[i];
    for (int i = 0; i < NB; i++) theta[NW + i] = B0[i];
    for (int t = 1; t <= steps; t++) {
        for (int i = 0; i < NW + NB; i++) {
            const double wd = (i >= NW && !h->decay_bias) ? 0.0 : F(h->weight_decay);
            const double g = GRADS[t - 1][i];
            theta[i] -= lr * wd * theta[i];
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            const double mhat = m[i] / (1.0 - pow(b1, t)), vhat = v[i] / (1.0 - pow(b2, t));
            theta[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
    }
}

static void run_adamw_case(const adamw_hp *h, const char *what) {
    env_begin();
    const kiln_kv cfg[] = {FKV("lr", h->lr),
                           FKV("beta1", h->beta1),
                           FKV("beta2", h->beta2),
                           FKV("eps", h->eps),
                           FKV("weight_decay", h->weight_decay),
                           BKV("decay_bias", h->decay_bias),
                           END_KV};
    double theta[NW + NB];
    ref_adamw(h, NSTEPS, theta);
    run_steps(g_adamw, cfg, theta, what);
}

static void test_adamw_default_no_bias_decay(void) {
    adamw_hp h = {0.01, 0.9, 0.999, 1e-8, 0.01, 0};
    run_adamw_case(&h, "adamw, bias not decayed");
    /* The case is only discriminating if decaying the bias would have moved
     * it by much more than the tolerance. */
    adamw_hp hd = h;
    hd.decay_bias = 1;
    double a[NW + NB], b[NW + NB];
    ref_adamw(&h, NSTEPS, a);
    ref_adamw(&hd, NSTEPS, b);
    for (int i = NW; i < NW + NB; i++) CU_ASSERT_TRUE(fabs(a[i] - b[i]) > 10 * 1e-6 * fabs(a[i]));
}

static void test_adamw_decay_bias(void) {
    adamw_hp h = {0.01, 0.9, 0.999, 1e-8, 0.01, 1};
    run_adamw_case(&h, "adamw, decay_bias = true");
}

static void test_adamw_other_betas(void) {
    adamw_hp h = {0.05, 0.5, 0.9, 1e-3, 0.1, 0}; /* beta1 0.5: the kernel's other lerp form */
    run_adamw_case(&h, "adamw, beta1 0.5");
}

/* ----------------------------------------------- closure, zero_grad, lr */

static const kiln_kv SGD_MOM_CFG[] = {FKV("lr", 0.1),  FKV("momentum", 0.9),     FKV("dampening", 0.0),
                                      BKV("nesterov", 0), FKV("weight_decay", 0.0), END_KV};
static const kiln_kv ADAMW_CFG[] = {FKV("lr", 0.01),   FKV("beta1", 0.9),         FKV("beta2", 0.999),
                                    FKV("eps", 1e-8),  FKV("weight_decay", 0.01), BKV("decay_bias", 0),
                                    END_KV};

static void check_closure(const kiln_plugin_desc *d, const kiln_kv *cfg) {
    env_begin();
    kiln_instance *opt = make(d, cfg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(opt);
    closure_ctx c = {0, 0};
    kiln_closure cl = {sizeof cl, 0, &c, closure_call};
    CU_ASSERT_EQUAL(ops_of(d)->step(opt, &cl), KILN_OK);
    CU_ASSERT_EQUAL(c.calls, 1);
    CU_ASSERT_EQUAL(ops_of(d)->step(opt, &cl), KILN_OK);
    CU_ASSERT_EQUAL(c.calls, 2);

    /* A failing closure: its status comes back and nothing is updated. */
    float w[NW], b[NB];
    memcpy(w, g_w->data, sizeof w);
    memcpy(b, g_b->data, sizeof b);
    c.fail = 1;
    CU_ASSERT_EQUAL(ops_of(d)->step(opt, &cl), KILN_E_NONFINITE);
    CU_ASSERT_EQUAL(c.calls, 3);
    CU_ASSERT_EQUAL(memcmp(w, g_w->data, sizeof w), 0);
    CU_ASSERT_EQUAL(memcmp(b, g_b->data, sizeof b), 0);

    /* No closure: updates from the gradients present. */
    CU_ASSERT_EQUAL(ops_of(d)->step(opt, NULL), KILN_OK);
    CU_ASSERT_NOT_EQUAL(memcmp(w, g_w->data, sizeof w), 0);

    /* zero_grad zeroes every gradient. */
    set_grads(0);
    CU_ASSERT_EQUAL(ops_of(d)->zero_grad(opt), KILN_OK);
    for (int i = 0; i < NW; i++) CU_ASSERT_EQUAL(g_w->grad[i], 0.0f);
    for (int i = 0; i < NB; i++) CU_ASSERT_EQUAL(g_b->grad[i], 0.0f);

    /* get_lr / set_lr */
    CU_ASSERT_DOUBLE_EQUAL(ops_of(d)->get_lr(opt), kiln_kv_float(cfg, "lr", -1), 0.0);
    CU_ASSERT_EQUAL(ops_of(d)->set_lr(opt, 0.125), KILN_OK);
    CU_ASSERT_DOUBLE_EQUAL(ops_of(d)->get_lr(opt), 0.125, 0.0);
    CU_ASSERT_EQUAL(ops_of(d)->set_lr(opt, -1.0), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "lr"));
    CU_ASSERT_DOUBLE_EQUAL(ops_of(d)->get_lr(opt), 0.125, 0.0);
    ops_of(d)->base.destroy(opt);
    env_end();
}

static void test_closure_zero_grad_lr_sgd(void) { check_closure(g_sgd, SGD_MOM_CFG); }
static void test_closure_zero_grad_lr_adamw(void) { check_closure(g_adamw, ADAMW_CFG); }

/* Without an accelerator, setup is refused with a message. */
static void test_setup_needs_accelerator(void) {
    env_begin();
    const kiln_kernels *k = kiln_test_kernels(g_th);
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), NULL);
    const kiln_plugin_desc *ds[2] = {g_sgd, g_adamw};
    const kiln_kv *cfgs[2] = {SGD_MOM_CFG, ADAMW_CFG};
    for (int i = 0; i < 2; i++) {
        kiln_instance *opt = NULL;
        CU_ASSERT_EQUAL_FATAL(
            ops_of(ds[i])->base.create(ds[i]->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfgs[i], &opt), KILN_OK);
        kiln_test_clear_error(g_th);
        CU_ASSERT_NOT_EQUAL(ops_of(ds[i])->setup(opt, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "accelerator"));
        CU_ASSERT_EQUAL(ops_of(ds[i])->step(opt, NULL), KILN_E_STATE);
        ops_of(ds[i])->base.destroy(opt);
    }
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), k);
    env_end();
}

/* ----------------------------------------------------------------- state */

/* Two steps on A; A's state into a fresh B; then the same third step on
 * both, from the same weights, must give bit-identical weights. */
static void check_state_roundtrip(const kiln_plugin_desc *d, const kiln_kv *cfg) {
    env_begin();
    const kiln_optimizer_ops *o = ops_of(d);
    kiln_instance *a = make(d, cfg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    closure_ctx c = {0, 0};
    kiln_closure cl = {sizeof cl, 0, &c, closure_call};
    CU_ASSERT_EQUAL(o->step(a, &cl), KILN_OK);
    CU_ASSERT_EQUAL(o->step(a, &cl), KILN_OK);
    CU_ASSERT_EQUAL(o->set_lr(a, 0.0625), KILN_OK); /* a scheduler's change is part of the state */

    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(o->base.get_state(a, &ver, &blob, &size), KILN_OK);
    CU_ASSERT_EQUAL(ver, 1);
    CU_ASSERT_TRUE(size > 0);

    kiln_instance *b = make(d, cfg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL(o->base.set_state(b, ver, blob, size), KILN_OK);
    CU_ASSERT_DOUBLE_EQUAL(o->get_lr(b), 0.0625, 0.0);

    float w0[NW], b0[NB], wa[NW], ba[NB];
    memcpy(w0, g_w->data, sizeof w0);
    memcpy(b0, g_b->data, sizeof b0);
    closure_ctx c3 = {2, 0}; /* both take step 3's gradients */
    CU_ASSERT_EQUAL(o->step(a, &(kiln_closure){sizeof cl, 0, &c3, closure_call}), KILN_OK);
    memcpy(wa, g_w->data, sizeof wa);
    memcpy(ba, g_b->data, sizeof ba);
    memcpy(g_w->data, w0, sizeof w0);
    memcpy(g_b->data, b0, sizeof b0);
    c3.calls = 2;
    CU_ASSERT_EQUAL(o->step(b, &(kiln_closure){sizeof cl, 0, &c3, closure_call}), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(wa, g_w->data, sizeof wa), 0);
    CU_ASSERT_EQUAL(memcmp(ba, g_b->data, sizeof ba), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(w0, g_w->data, sizeof w0), 0);

    /* A fresh optimizer (no restored state) would have stepped differently:
     * otherwise the comparison above proves nothing. */
    kiln_instance *fresh = make(d, cfg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(fresh);
    CU_ASSERT_EQUAL(o->set_lr(fresh, 0.0625), KILN_OK);
    memcpy(g_w->data, w0, sizeof w0);
    memcpy(g_b->data, b0, sizeof b0);
    c3.calls = 2;
    CU_ASSERT_EQUAL(o->step(fresh, &(kiln_closure){sizeof cl, 0, &c3, closure_call}), KILN_OK);
    CU_ASSERT_NOT_EQUAL(memcmp(wa, g_w->data, sizeof wa), 0);

    /* Refusals: a truncated or padded blob, another version, another model. */
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(o->base.set_state(fresh, ver, blob, size - 4), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "bytes"));
    unsigned char *bigger = calloc(1, size + 4);
    memcpy(bigger, blob, size);
    CU_ASSERT_EQUAL(o->base.set_state(fresh, ver, bigger, size + 4), KILN_E_STATE);
    free(bigger);
    CU_ASSERT_EQUAL(o->base.set_state(fresh, ver, blob, 10), KILN_E_STATE);
    CU_ASSERT_EQUAL(o->base.set_state(fresh, 2, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "version"));

    kiln_instance *one = NULL;
    CU_ASSERT_EQUAL_FATAL(o->base.create(d->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &one), KILN_OK);
    CU_ASSERT_EQUAL(o->setup(one, kiln_test_params(g_th), 1), KILN_OK); /* the weight only */
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(o->base.set_state(one, ver, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "2 parameters"));

    /* Same count, other sizes: the bias registered as (2) instead of (3). */
    kiln_parameter *swapped[2] = {g_w, g_b};
    kiln_parameter fake_bias = *g_b;
    fake_bias.numel = 2;
    fake_bias.shape[0] = 2;
    swapped[1] = &fake_bias;
    kiln_instance *other = NULL;
    CU_ASSERT_EQUAL_FATAL(o->base.create(d->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &other), KILN_OK);
    CU_ASSERT_EQUAL(o->setup(other, swapped, 2), KILN_OK);
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(o->base.set_state(other, ver, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "bias"));

    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    o->base.destroy(other);
    o->base.destroy(one);
    o->base.destroy(fresh);
    o->base.destroy(b);
    o->base.destroy(a);
    env_end();
}

static void test_state_sgd(void) { check_state_roundtrip(g_sgd, SGD_MOM_CFG); }
static void test_state_adamw(void) { check_state_roundtrip(g_adamw, ADAMW_CFG); }

/* ---------------------------------------------------------- bad config */

/* create() refuses `cfg` with KILN_E_CONFIG, a message naming `key`, and
 * no instance. */
static void expect_refused(const kiln_plugin_desc *d, const kiln_kv *cfg, const char *key) {
    kiln_instance *inst = (kiln_instance *)&inst;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops_of(d)->base.create(d->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(inst);
    if (!strstr(kiln_test_error(g_th), key)) fprintf(stderr, "message for %s: \"%s\"\n", key, kiln_test_error(g_th));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), key));
}

static void test_bad_config(void) {
    kiln_test_reset(g_th);
#define SGD_CFG(lr, mom, damp, nest, wd)                                                                     \
    (const kiln_kv[]) {                                                                                      \
        FKV("lr", lr), FKV("momentum", mom), FKV("dampening", damp), BKV("nesterov", nest),                  \
            FKV("weight_decay", wd), END_KV                                                                  \
    }
    expect_refused(g_sgd, SGD_CFG(-0.1, 0.0, 0.0, 0, 0.0), "lr");
    expect_refused(g_sgd, SGD_CFG(NAN, 0.0, 0.0, 0, 0.0), "lr");
    expect_refused(g_sgd, SGD_CFG(0.1, -0.5, 0.0, 0, 0.0), "momentum");
    expect_refused(g_sgd, SGD_CFG(0.1, 0.0, 0.0, 0, -1.0), "weight_decay");
    expect_refused(g_sgd, SGD_CFG(0.1, 0.0, 0.0, 1, 0.0), "nesterov");
    expect_refused(g_sgd, SGD_CFG(0.1, 0.9, 0.1, 1, 0.0), "dampening");
#define ADAMW_CFG_(lr, b1, b2, eps, wd)                                                                      \
    (const kiln_kv[]) {                                                                                      \
        FKV("lr", lr), FKV("beta1", b1), FKV("beta2", b2), FKV("eps", eps), FKV("weight_decay", wd),         \
            BKV("decay_bias", 0), END_KV                                                                     \
    }
    expect_refused(g_adamw, ADAMW_CFG_(-1e-3, 0.9, 0.999, 1e-8, 0.01), "lr");
    expect_refused(g_adamw, ADAMW_CFG_(1e-3, 1.0, 0.999, 1e-8, 0.01), "beta1");
    expect_refused(g_adamw, ADAMW_CFG_(1e-3, -0.1, 0.999, 1e-8, 0.01), "beta1");
    expect_refused(g_adamw, ADAMW_CFG_(1e-3, 0.9, 1.5, 1e-8, 0.01), "beta2");
    expect_refused(g_adamw, ADAMW_CFG_(1e-3, 0.9, 0.999, -1e-8, 0.01), "eps");
    expect_refused(g_adamw, ADAMW_CFG_(1e-3, 0.9, 0.999, 1e-8, -0.01), "weight_decay");

    /* Boundary values PyTorch accepts are accepted. */
    kiln_instance *inst = NULL;
    CU_ASSERT_EQUAL(ops_of(g_sgd)->base.create(g_sgd->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th),
                                               SGD_CFG(0.0, 0.9, 0.0, 1, 0.0), &inst),
                    KILN_OK);
    ops_of(g_sgd)->base.destroy(inst);
    inst = NULL;
    CU_ASSERT_EQUAL(ops_of(g_adamw)->base.create(g_adamw->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th),
                                                 ADAMW_CFG_(0.0, 0.0, 0.0, 0.0, 0.0), &inst),
                    KILN_OK);
    ops_of(g_adamw)->base.destroy(inst);
#undef SGD_CFG
#undef ADAMW_CFG_
}

/* The descriptors declare every key create() reads, with PyTorch's defaults
 * (decay_bias aside, which is kiln's own). */
static void test_declared_keys(void) {
    struct {
        const kiln_plugin_desc **d;
        const char *key;
        uint32_t type;
        double def;
    } want[] = {
        {&g_sgd, "lr", KILN_TYPE_FLOAT, 0.01},         {&g_sgd, "momentum", KILN_TYPE_FLOAT, 0.0},
        {&g_sgd, "dampening", KILN_TYPE_FLOAT, 0.0},   {&g_sgd, "nesterov", KILN_TYPE_BOOL, 0},
        {&g_sgd, "weight_decay", KILN_TYPE_FLOAT, 0},  {&g_adamw, "lr", KILN_TYPE_FLOAT, 1e-3},
        {&g_adamw, "beta1", KILN_TYPE_FLOAT, 0.9},     {&g_adamw, "beta2", KILN_TYPE_FLOAT, 0.999},
        {&g_adamw, "eps", KILN_TYPE_FLOAT, 1e-8},      {&g_adamw, "weight_decay", KILN_TYPE_FLOAT, 0.01},
        {&g_adamw, "decay_bias", KILN_TYPE_BOOL, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kiln_param *p = (*want[i].d)->params;
        while (p && p->key && strcmp(p->key, want[i].key)) p++;
        CU_ASSERT_FATAL(p && p->key);
        CU_ASSERT_EQUAL(p->type, want[i].type);
        double def = p->def.type == KILN_TYPE_FLOAT ? p->def.v.f : (double)p->def.v.i;
        CU_ASSERT_DOUBLE_EQUAL(def, want[i].def, 0.0);
    }
    CU_ASSERT_EQUAL(g_sgd->kind, KILN_KIND_OPTIMIZER);
    CU_ASSERT_EQUAL(g_adamw->kind, KILN_KIND_OPTIMIZER);
    CU_ASSERT_TRUE(g_sgd->capabilities & KILN_CAP_STATEFUL);
    CU_ASSERT_TRUE(g_adamw->capabilities & KILN_CAP_STATEFUL);
}

static CU_TestInfo cases_optim[] = {
    {"declared keys and defaults", test_declared_keys},
    {"sgd plain", test_sgd_plain},
    {"sgd momentum 0.9, 3 steps", test_sgd_momentum},
    {"sgd nesterov", test_sgd_nesterov},
    {"sgd dampening", test_sgd_dampening},
    {"sgd weight decay (bias too)", test_sgd_weight_decay},
    {"adamw 3 steps, bias not decayed", test_adamw_default_no_bias_decay},
    {"adamw decay_bias = true", test_adamw_decay_bias},
    {"adamw beta1 0.5, eps 1e-3", test_adamw_other_betas},
    {"sgd closure, zero_grad, lr", test_closure_zero_grad_lr_sgd},
    {"adamw closure, zero_grad, lr", test_closure_zero_grad_lr_adamw},
    {"setup without accelerator", test_setup_needs_accelerator},
    {"sgd state round trip and refusals", test_state_sgd},
    {"adamw state round trip and refusals", test_state_adamw},
    {"bad config refused", test_bad_config},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "optim", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_optim},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
