/*
 * test_gan.c — CUnit suite for the "gan" module plugin (libkiln-gan.so),
 * loaded through the test host together with the real cpu accelerator
 * (libkiln-cpu.so, whose kernel table is copied so allocations can be
 * counted). The test copies the test host's services table and replaces the
 * ABI 1.2 members with its own fakes, which record every call, call the
 * module's backward op from manual_backward (with a settable loss scale, as
 * the host passes it), mark the other optimizer's parameters
 * KILN_PARAMF_FROZEN on toggle_optimizer (the "owner" of a parameter is its
 * name prefix), and zero the owner's gradients on zero_grad. It checks: the
 * descriptor (properties, declared keys) and the registered parameters; both
 * backward paths (the generator loss through the discriminator into the
 * generator, the discriminator loss) against central finite differences of the
 * losses the module passes to manual_backward, with the noise replayed through
 * get_state/set_state; the exact order of service calls in a training_step;
 * that frozen parameters' gradients stay bit-identical; gradient accumulation
 * and step-every-N (8 batches, g_every 2, d_every 4: 4 generator and 2
 * discriminator steps); known loss values; the logged metrics; evaluation
 * steps; the refusals (one optimizer, a backward outside manual_backward, bad
 * configs, fp16 compute, a host without the 1.2 services); that no step
 * allocates; and the PNG grid (a valid 8-bit grayscale PNG of the right size
 * read back with libpng, the right pixels for a known generator, written
 * atomically, rank 0 and every grid_every epochs only, identical for equal
 * seeds and different for different ones).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <kiln/testing.h>

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */
#define MAX_PARAMS 256         /* more than any config here registers */

#include <CUnit/CUnit.h>
#include <math.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plugin_fixture.h"
#include "testutil.h"

/* ------------------------------------------------------------ fixtures */

static const kiln_plugin_desc *g_desc;     /* the gan module         */
static const kiln_module_ops *g_mod;
static const kiln_accelerator_ops *g_cpu;  /* the cpu accelerator    */
static kiln_instance *g_acc;
static kiln_kernels g_kt;                  /* cpu's table, alloc counted */
static int32_t (*g_real_alloc)(kiln_instance *, size_t, void **);
static int g_allocs;
static kiln_host_services g_svc;           /* test host + 1.2 fakes  */
static kiln_instance *g_inst;              /* the module under test  */
static char g_dir[256];                    /* a temporary run directory */

static int32_t count_alloc(kiln_instance *acc, size_t bytes, void **out) {
    g_allocs++;
    return g_real_alloc(acc, bytes, out);
}

/* --------------------------------------------------- the 1.2 fakes */

/* One recorded service call: T/U toggle/untoggle, B manual_backward, S step,
 * Z zero_grad, with the optimizer index. */
static char g_calls[4096];
static uint32_t g_nopt = 2;
static double g_scale = 1.0;   /* dloss the fake passes to backward       */
static int g_do_backward = 1;  /* 0: manual_backward only records the loss */
static double g_losses[64];    /* every loss passed to manual_backward    */
static int g_nlosses;
static int32_t g_backward_rc;  /* what the module's backward returned     */
static int g_steps[2], g_zeros[2];
static int g_frozen_seen[2];   /* frozen params seen during each backward  */
static int g_frozen_touched;   /* frozen grads that changed in a backward  */
static int g_unfrozen_untouched; /* unfrozen grads a backward left alone   */
static unsigned char g_toggle_set[MAX_PARAMS];

static void rec(const char *s) {
    size_t n = strlen(g_calls);
    snprintf(g_calls + n, sizeof g_calls - n, "%s%s", n ? " " : "", s);
}

/* The record of a service call: its letter and the optimizer index. */
static void rec_call(char what, uint32_t index) {
    char s[16];
    snprintf(s, sizeof s, "%c%u", what, index);
    rec(s);
}

/* Optimizer 0 owns "generator.*", optimizer 1 "discriminator.*". */
static int owner(const kiln_parameter *p) { return strncmp(p->name, "generator.", 10) == 0 ? 0 : 1; }

static uint32_t f_optimizer_count(kiln_host_ctx *h) {
    (void)h;
    return g_nopt;
}

static int32_t f_manual_backward(kiln_host_ctx *h, double loss) {
    (void)h;
    rec("B");
    if (g_nlosses < 64) g_losses[g_nlosses++] = loss;
    if (!g_do_backward) return KILN_OK;
    /* snapshot every gradient, run the module's backward, compare */
    static float before[MAX_PARAMS][256]; /* the tiny configs' tensors fit */
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
        if (kiln_test_param(g_th, i)->numel <= 256) memcpy(before[i], kiln_test_param(g_th, i)->grad, (size_t)kiln_test_param(g_th, i)->numel * 4);
    int32_t rc = g_mod->backward(g_inst, g_scale);
    g_backward_rc = rc;
    int which = g_nlosses % 2 ? 0 : 1; /* first call of a step is G's */
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        const kiln_parameter *p = kiln_test_param(g_th, i);
        if (p->numel > 256) continue;
        const int same = memcmp(before[i], p->grad, (size_t)p->numel * 4) == 0;
        if (p->flags & KILN_PARAMF_FROZEN) {
            g_frozen_seen[which]++;
            g_frozen_touched += !same;
        } else {
            g_unfrozen_untouched += same;
        }
    }
    return rc;
}

static int32_t f_optimizer_step(kiln_host_ctx *h, uint32_t index, const kiln_closure *closure, int32_t *skipped) {
    (void)h;
    rec_call('S', index);
    if (closure) return KILN_E_INVALID_ARG; /* the module passes none */
    if (index < 2) g_steps[index]++;
    if (skipped) *skipped = 0;
    return KILN_OK;
}

static int32_t f_zero_grad(kiln_host_ctx *h, uint32_t index) {
    (void)h;
    rec_call('Z', index);
    if (index < 2) g_zeros[index]++;
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
        if (owner(kiln_test_param(g_th, i)) == (int)index) memset(kiln_test_param(g_th, i)->grad, 0, (size_t)kiln_test_param(g_th, i)->numel * 4);
    return KILN_OK;
}

/* As the host: freeze what only the other optimizer owns; remember it. */
static int32_t f_toggle(kiln_host_ctx *h, uint32_t index) {
    (void)h;
    rec_call('T', index);
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        kiln_parameter *p = kiln_test_param(g_th, i);
        if (owner(p) != (int)index && !(p->flags & KILN_PARAMF_FROZEN)) {
            p->flags |= KILN_PARAMF_FROZEN;
            g_toggle_set[i] = 1;
        }
    }
    return KILN_OK;
}

static int32_t f_untoggle(kiln_host_ctx *h, uint32_t index) {
    (void)h;
    rec_call('U', index);
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
        if (g_toggle_set[i]) kiln_test_param(g_th, i)->flags &= ~KILN_PARAMF_FROZEN, g_toggle_set[i] = 0;
    return KILN_OK;
}

static void reset_records(void) {
    g_calls[0] = 0;
    g_nlosses = 0;
    g_backward_rc = 0;
    memset(g_steps, 0, sizeof g_steps);
    memset(g_zeros, 0, sizeof g_zeros);
    memset(g_frozen_seen, 0, sizeof g_frozen_seen);
    g_frozen_touched = 0;
    g_unfrozen_untouched = 0;
}

/* ------------------------------------------------------------- helpers */

typedef struct {
    int64_t latent, hidden, image_size, g_every, d_every, samples, grid_every, max_batch;
} gcfg;

static const gcfg TINY = {3, 5, 4, 2, 4, 4, 1, 8};

static kiln_kv g_kv[9];
static const kiln_kv *kv_of(gcfg c) {
    const char *keys[8] = {"latent", "hidden", "image_size", "g_every", "d_every", "samples", "grid_every",
                           "max_batch"};
    const int64_t vals[8] = {c.latent, c.hidden, c.image_size, c.g_every, c.d_every, c.samples, c.grid_every,
                             c.max_batch};
    for (int i = 0; i < 8; i++) {
        g_kv[i].key = keys[i];
        g_kv[i].value = (kiln_value)KILN_V_INT(vals[i]);
    }
    g_kv[8] = (kiln_kv){NULL, KILN_V_NONE};
    return g_kv;
}

static void destroy_module(void) {
    if (g_inst) g_mod->base.destroy(g_inst);
    g_inst = NULL;
}

/* A fresh test host (run seed `seed`) and a module with weights from
 * init_weights(1234); NULL (and the code in *rc) when create fails. */
static kiln_instance *make(gcfg c, uint64_t seed, int32_t *rc_out) {
    destroy_module();
    kiln_test_reset(g_th);
    memset(g_toggle_set, 0, sizeof g_toggle_set);
    kiln_test_set_accelerator(g_th, g_acc, &g_kt);
    kiln_test_set_seed(g_th, seed);
    kiln_instance *inst = NULL;
    int32_t rc = g_mod->base.create(g_desc->plugin_ctx, &g_svc, kiln_test_hctx(g_th), kv_of(c), &inst);
    if (rc_out) *rc_out = rc;
    if (rc != KILN_OK) return NULL;
    CU_ASSERT_FATAL(kiln_test_alloc_params(g_th) == 0);
    CU_ASSERT_FATAL(g_mod->init_weights(inst, 1234) == KILN_OK);
    g_inst = inst;
    reset_records();
    return inst;
}

static kiln_parameter *param(const char *name) {
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
        if (!strcmp(kiln_test_param(g_th, i)->name, name)) return kiln_test_param(g_th, i);
    return NULL;
}

static void zero_all_grads(void) {
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) memset(kiln_test_param(g_th, i)->grad, 0, (size_t)kiln_test_param(g_th, i)->numel * 4);
}

/* A batch of B images of `features` values in [-1, 1] (labels ignored). */
typedef struct {
    float x[64 * 784];
    int32_t y[64];
    kiln_tensor t[2];
    kiln_batch b;
} tbatch;

static tbatch g_b;
static const kiln_batch *batch_of(int B, int features, unsigned salt) {
    for (int i = 0; i < B * features; i++) {
        uint32_t v = (uint32_t)(i + 1) * 2654435761u ^ (salt * 40503u + 0x9E37u);
        v ^= v >> 15;
        v *= 0x5bd1e995u;
        v ^= v >> 13;
        g_b.x[i] = (float)((double)(v & 0xFFFF) / 32768.0 - 1.0);
    }
    for (int i = 0; i < B; i++) g_b.y[i] = i % 10;
    g_b.t[0] = (kiln_tensor){g_b.x, KILN_DTYPE_F32, 2, {B, features, 1, 1}};
    g_b.t[1] = (kiln_tensor){g_b.y, KILN_DTYPE_I32, 1, {B, 1, 1, 1}};
    g_b.b = (kiln_batch){sizeof(kiln_batch), 2, g_b.t, B};
    return &g_b.b;
}

static int32_t train(const kiln_batch *b, int64_t idx, kiln_step_output *out) {
    kiln_step_output o = {sizeof o, 0, 0, 0, 0, 0};
    return g_mod->training_step(g_inst, b, idx, out ? out : &o);
}

/* The module's noise state, to replay a step with the same noise. */
static size_t save_state(unsigned char *buf) {
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_FATAL(g_mod->base.get_state(g_inst, &ver, &blob, &size) == KILN_OK);
    CU_ASSERT_EQUAL(ver, 1);
    memcpy(buf, blob, size);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    return size;
}
static void load_state(const unsigned char *buf, size_t size) {
    CU_ASSERT_FATAL(g_mod->base.set_state(g_inst, 1, buf, size) == KILN_OK);
}

/* ------------------------------------------------------------- suite */

static int suite_init(void) {
    const kiln_plugin_desc *cpu = NULL;
    const kiln_kernels *k = NULL;
    if (fixture_need_plugin_dir() || fixture_accel_open(g_th, "cpu", "cpu", &cpu, &g_cpu, &g_acc, &k) != 0) return -1;
    if (k->struct_size < sizeof g_kt) return -1;
    g_kt = *k;
    g_real_alloc = k->alloc;
    g_kt.alloc = count_alloc;
    g_desc = fixture_load_plugin(g_th, "gan", KILN_KIND_MODULE, "gan");
    if (!g_desc) return -1;
    g_mod = g_desc->ops;
    g_svc = *kiln_test_services(g_th);
    g_svc.optimizer_count = f_optimizer_count;
    g_svc.manual_backward = f_manual_backward;
    g_svc.optimizer_step = f_optimizer_step;
    g_svc.optimizer_zero_grad = f_zero_grad;
    g_svc.toggle_optimizer = f_toggle;
    g_svc.untoggle_optimizer = f_untoggle;
    snprintf(g_dir, sizeof g_dir, "/tmp/kiln-test-gan-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int suite_clean(void) {
    destroy_module();
    fixture_accel_close(g_th, g_cpu, &g_acc);
    if (g_dir[0]) tu_rmrf(g_dir);
    return 0;
}

/* ------------------------------------------------ descriptor, params */

static void test_descriptor_and_params(void) {
    CU_ASSERT_EQUAL(g_desc->kind, KILN_KIND_MODULE);
    CU_ASSERT_STRING_EQUAL(g_desc->name, "gan");
    CU_ASSERT(g_desc->capabilities & KILN_CAP_STATEFUL);
    const kiln_value *ao = kiln_kv_find(g_desc->properties, "automatic_optimization");
    CU_ASSERT(ao && ao->type == KILN_TYPE_BOOL && ao->v.i == 0);
    const kiln_value *pd = kiln_kv_find(g_desc->properties, "param_dtypes");
    CU_ASSERT(pd && pd->type == KILN_TYPE_STRING_LIST && pd->count == 1 && !strcmp(pd->v.sl[0], "float32"));

    const char *keys[8] = {"latent", "hidden", "image_size", "g_every", "d_every", "samples", "grid_every",
                           "max_batch"};
    const int64_t defs[8] = {64, 256, 784, 2, 4, 64, 1, 512};
    int n = 0;
    for (const kiln_param *p = g_desc->params; p && p->key; p++, n++) {
        CU_ASSERT(p->help && p->help[0]);
        CU_ASSERT_EQUAL(p->type, KILN_TYPE_INT);
        int found = 0;
        for (int i = 0; i < 8; i++)
            if (!strcmp(p->key, keys[i])) {
                found = 1;
                CU_ASSERT_EQUAL(p->def.v.i, defs[i]);
            }
        CU_ASSERT(found);
    }
    CU_ASSERT_EQUAL(n, 8);

    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 1, NULL));
    /* nn.Sequential layout: Linear at 0, 2, 4; generator first */
    const char *names[12] = {"generator.0.weight",     "generator.0.bias",     "generator.2.weight",
                             "generator.2.bias",       "generator.4.weight",   "generator.4.bias",
                             "discriminator.0.weight", "discriminator.0.bias", "discriminator.2.weight",
                             "discriminator.2.bias",   "discriminator.4.weight", "discriminator.4.bias"};
    const int64_t shapes[12][2] = {{5, 3}, {5, 0}, {5, 5}, {5, 0}, {4, 5}, {4, 0},
                                   {5, 4}, {5, 0}, {5, 5}, {5, 0}, {2, 5}, {2, 0}};
    CU_ASSERT_EQUAL_FATAL(kiln_test_param_count(g_th), 12);
    for (int i = 0; i < 12; i++) {
        const kiln_parameter *p = kiln_test_param(g_th, i);
        CU_ASSERT_STRING_EQUAL(p->name, names[i]);
        const int is_bias = i % 2 == 1;
        CU_ASSERT_EQUAL(p->ndim, is_bias ? 1u : 2u);
        CU_ASSERT_EQUAL(p->shape[0], shapes[i][0]);
        if (!is_bias) CU_ASSERT_EQUAL(p->shape[1], shapes[i][1]);
        CU_ASSERT_EQUAL(!!(p->flags & KILN_PARAMF_NO_DECAY), is_bias);
        /* kaiming-uniform: |w| <= 1/sqrt(fan_in), and not all equal */
        const double bound = 1.0 / sqrt((double)(is_bias ? kiln_test_param(g_th, i - 1)->shape[1] : p->shape[1]));
        int out = 0, distinct = 0;
        for (int64_t j = 0; j < p->numel; j++) {
            out += fabs(p->data[j]) > bound;
            distinct += j > 0 && p->data[j] != p->data[0];
        }
        CU_ASSERT_EQUAL(out, 0);
        CU_ASSERT(distinct > 0 || p->numel == 1);
    }
    /* same init seed, same weights */
    float w0 = kiln_test_param(g_th, 0)->data[0], w11 = kiln_test_param(g_th, 11)->data[1];
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 99, NULL));
    CU_ASSERT_EQUAL(kiln_test_param(g_th, 0)->data[0], w0);
    CU_ASSERT_EQUAL(kiln_test_param(g_th, 11)->data[1], w11);
    destroy_module();
}

/* ------------------------------------------------ finite differences */

/* Both backward paths against central differences of the losses the module
 * hands to manual_backward (g_loss first, d_loss second), with the noise
 * replayed by set_state. With the host's toggles, G's gradients are
 * d g_loss / dG (through the frozen D) and D's are d d_loss / dD; with
 * toggles that freeze nothing, D also collects d g_loss / dD. */
static void fd_case(int freeze) {
    const gcfg c = {3, 5, 4, 1000, 1000, 4, 0, 8}; /* no optimizer steps */
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(c, 3, NULL));
    const kiln_batch *b = batch_of(2, 4, 11);
    unsigned char S[64];
    const size_t ns = save_state(S);

    static float ana[12][32];
    zero_all_grads();
    g_do_backward = 1;
    reset_records();
    CU_ASSERT_EQUAL_FATAL(train(b, 0, NULL), KILN_OK);
    CU_ASSERT_EQUAL(g_backward_rc, KILN_OK);
    CU_ASSERT_EQUAL(g_nlosses, 2);
    int nonzero = 0, total = 0;
    for (int i = 0; i < 12; i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++, total++) {
            ana[i][j] = kiln_test_param(g_th, i)->grad[j];
            nonzero += ana[i][j] != 0.0f;
        }
    CU_ASSERT(nonzero > total * 9 / 10);

    g_do_backward = 0;
    int bad = 0;
    for (int i = 0; i < 12; i++) {
        kiln_parameter *p = kiln_test_param(g_th, i);
        for (int64_t j = 0; j < p->numel; j++) {
            const float orig = p->data[j];
            double L[2][2]; /* [+/-][g, d] */
            float xs[2] = {orig + 1e-2f, orig - 1e-2f};
            for (int s = 0; s < 2; s++) {
                p->data[j] = xs[s];
                load_state(S, ns);
                reset_records();
                CU_ASSERT_EQUAL_FATAL(train(b, 0, NULL), KILN_OK);
                L[s][0] = g_losses[0];
                L[s][1] = g_losses[1];
            }
            p->data[j] = orig;
            const double h2 = (double)xs[0] - (double)xs[1];
            const double dg = (L[0][0] - L[1][0]) / h2, dd = (L[0][1] - L[1][1]) / h2;
            const double num = owner(p) == 0 ? dg : freeze ? dd : dg + dd;
            if (fabs(ana[i][j] - num) > 2e-4 + 1e-2 * fabs(num)) {
                if (bad++ < 8)
                    printf("\n  %s[%lld]: backward %.6g, finite differences %.6g", p->name, (long long)j,
                           (double)ana[i][j], num);
            }
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    g_do_backward = 1;
    g_svc.toggle_optimizer = f_toggle;
    destroy_module();
}

static int32_t f_toggle_nofreeze(kiln_host_ctx *h, uint32_t index) {
    (void)h;
    rec_call('T', index);
    return KILN_OK;
}

static void test_backward_fd_toggled(void) { fd_case(1); }

static void test_backward_fd_unfrozen(void) {
    g_svc.toggle_optimizer = f_toggle_nofreeze;
    fd_case(0);
    g_svc.toggle_optimizer = f_toggle;
}

/* ------------------------------------------------ call order, frozen */

static void test_call_order(void) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 1, NULL)); /* g_every 2, d_every 4 */
    const kiln_batch *b = batch_of(2, 4, 1);
    struct {
        int64_t idx;
        const char *want;
    } cases[5] = {
        {0, "T0 B U0 T1 B U1"},
        {1, "T0 B S0 Z0 U0 T1 B U1"},
        {2, "T0 B U0 T1 B U1"},
        {3, "T0 B S0 Z0 U0 T1 B S1 Z1 U1"},
        {7, "T0 B S0 Z0 U0 T1 B S1 Z1 U1"},
    };
    for (int i = 0; i < 5; i++) {
        reset_records();
        CU_ASSERT_EQUAL(train(b, cases[i].idx, NULL), KILN_OK);
        CU_ASSERT_STRING_EQUAL(g_calls, cases[i].want);
        CU_ASSERT_EQUAL(g_backward_rc, KILN_OK);
        if (strcmp(g_calls, cases[i].want)) printf("\n  batch %lld: got \"%s\"", (long long)cases[i].idx, g_calls);
    }
    destroy_module();
}

static void fill_grads(unsigned salt) {
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++)
            kiln_test_param(g_th, i)->grad[j] = (float)((double)((j * 7 + i * 13 + salt) % 17) / 17.0 - 0.5);
}

static void test_frozen_grads_untouched(void) {
    const gcfg c = {3, 5, 4, 1000, 1000, 4, 0, 8};
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(c, 1, NULL));
    const kiln_batch *b = batch_of(2, 4, 2);
    fill_grads(1);
    reset_records();
    CU_ASSERT_EQUAL(train(b, 0, NULL), KILN_OK);
    CU_ASSERT_EQUAL(g_frozen_seen[0], 6); /* D's six tensors during G's backward */
    CU_ASSERT_EQUAL(g_frozen_seen[1], 6); /* G's six during D's                */
    CU_ASSERT_EQUAL(g_frozen_touched, 0); /* none of their grads changed a bit */
    CU_ASSERT_EQUAL(g_unfrozen_untouched, 0); /* every trainable grad did      */
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) CU_ASSERT_EQUAL(kiln_test_param(g_th, i)->flags & KILN_PARAMF_FROZEN, 0u);

    /* One parameter frozen by itself: its grad stays, the rest of G still
     * trains, and gradients propagate THROUGH a frozen weight unchanged. */
    unsigned char S[64];
    const size_t ns = save_state(S);
    kiln_parameter *w4 = param("generator.4.weight"), *w0 = param("generator.0.weight");
    float ref0[32], keep4[32];
    zero_all_grads();
    CU_ASSERT_EQUAL(train(b, 0, NULL), KILN_OK);
    memcpy(ref0, w0->grad, (size_t)w0->numel * 4);
    zero_all_grads();
    fill_grads(2);
    memcpy(keep4, w4->grad, (size_t)w4->numel * 4);
    for (int64_t j = 0; j < w0->numel; j++) w0->grad[j] = 0.0f;
    w4->flags |= KILN_PARAMF_FROZEN;
    load_state(S, ns);
    reset_records();
    CU_ASSERT_EQUAL(train(b, 0, NULL), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(keep4, w4->grad, (size_t)w4->numel * 4), 0);
    CU_ASSERT_EQUAL(memcmp(ref0, w0->grad, (size_t)w0->numel * 4), 0); /* same as unfrozen */
    CU_ASSERT(w4->flags & KILN_PARAMF_FROZEN); /* the host's flag, not the module's to clear */
    w4->flags &= ~KILN_PARAMF_FROZEN;
    destroy_module();
}

/* ------------------------------------------ stepping and accumulation */

static void test_step_every_n(void) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 1, NULL)); /* g_every 2, d_every 4 */
    reset_records();
    for (int64_t i = 0; i < 8; i++) CU_ASSERT_EQUAL(train(batch_of(2, 4, (unsigned)i), i, NULL), KILN_OK);
    CU_ASSERT_EQUAL(g_steps[0], 4);
    CU_ASSERT_EQUAL(g_steps[1], 2);
    CU_ASSERT_EQUAL(g_zeros[0], 4);
    CU_ASSERT_EQUAL(g_zeros[1], 2);
    CU_ASSERT_EQUAL(g_nlosses, 16);

    /* Between steps the gradients of successive batches add up. */
    const gcfg c = {3, 5, 4, 1000, 1000, 4, 0, 8};
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(c, 1, NULL));
    unsigned char S0[64];
    const size_t ns = save_state(S0);
    static float A0[12][32], A1[12][32];
    zero_all_grads();
    CU_ASSERT_EQUAL(train(batch_of(2, 4, 20), 0, NULL), KILN_OK);
    for (int i = 0; i < 12; i++) memcpy(A0[i], kiln_test_param(g_th, i)->grad, (size_t)kiln_test_param(g_th, i)->numel * 4);
    zero_all_grads(); /* batch 1 alone, with the noise that follows batch 0's */
    CU_ASSERT_EQUAL(train(batch_of(2, 4, 21), 1, NULL), KILN_OK);
    for (int i = 0; i < 12; i++) memcpy(A1[i], kiln_test_param(g_th, i)->grad, (size_t)kiln_test_param(g_th, i)->numel * 4);
    zero_all_grads();
    load_state(S0, ns);
    CU_ASSERT_EQUAL(train(batch_of(2, 4, 20), 0, NULL), KILN_OK);
    CU_ASSERT_EQUAL(train(batch_of(2, 4, 21), 1, NULL), KILN_OK);
    int bad = 0;
    for (int i = 0; i < 12; i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) {
            const double want = (double)A0[i][j] + (double)A1[i][j];
            bad += fabs(kiln_test_param(g_th, i)->grad[j] - want) > 1e-6 + 1e-5 * fabs(want);
        }
    CU_ASSERT_EQUAL(bad, 0);

    /* the loss scale the host passes as dloss scales every gradient */
    zero_all_grads();
    load_state(S0, ns);
    g_scale = 0.5;
    CU_ASSERT_EQUAL(train(batch_of(2, 4, 20), 0, NULL), KILN_OK);
    g_scale = 1.0;
    bad = 0;
    for (int i = 0; i < 12; i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++)
            bad += fabs(kiln_test_param(g_th, i)->grad[j] - 0.5 * A0[i][j]) > 1e-7 * (1.0 + fabs(A0[i][j]));
    CU_ASSERT_EQUAL(bad, 0);
    destroy_module();
}

/* ---------------------------------------------- losses and logging */

static const kiln_test_value *logged(const char *name) {
    for (int i = (int)kiln_test_logged_count(g_th) - 1; i >= 0; i--)
        if (!strcmp(kiln_test_logged(g_th, i)->name, name)) return kiln_test_logged(g_th, i);
    return NULL;
}

/* A discriminator whose last layer is zero but for its bias gives the same
 * logits (b0, b1) for every image, so every loss is known in closed form. */
static void set_d_output(float b_fake, float b_real) {
    kiln_parameter *w = param("discriminator.4.weight"), *bias = param("discriminator.4.bias");
    memset(w->data, 0, (size_t)w->numel * 4);
    bias->data[0] = b_fake;
    bias->data[1] = b_real;
}

static void test_known_losses_and_logging(void) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 1, NULL));
    const kiln_batch *b = batch_of(2, 4, 3);
    kiln_step_output out = {sizeof out, 0, 0, 0, 0, 0};

    set_d_output(0.0f, 0.0f); /* p = 1/2 everywhere: every CE is ln 2 */
    reset_records();
    CU_ASSERT_EQUAL(train(b, 0, &out), KILN_OK);
    CU_ASSERT_EQUAL(out.has_loss, 1);
    CU_ASSERT_EQUAL(out.batch_size, 2);
    CU_ASSERT(fabs(out.loss - log(2.0)) < 1e-6);
    CU_ASSERT(fabs(g_losses[0] - log(2.0)) < 1e-6); /* g_loss */
    CU_ASSERT_EQUAL(g_losses[1], out.loss);          /* d_loss is the step's loss */
    const uint32_t f = KILN_LOG_ON_STEP | KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR;
    const kiln_test_value *lg = logged("g_loss"), *ld = logged("d_loss"), *la = logged("d_real_acc");
    CU_ASSERT_PTR_NOT_NULL_FATAL(lg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ld);
    CU_ASSERT_PTR_NOT_NULL_FATAL(la);
    CU_ASSERT_EQUAL(lg->value, g_losses[0]);
    CU_ASSERT_EQUAL(ld->value, out.loss);
    CU_ASSERT_EQUAL(lg->flags, f);
    CU_ASSERT_EQUAL(ld->flags, f);
    CU_ASSERT(la->flags & KILN_LOG_ON_EPOCH);
    CU_ASSERT_EQUAL(lg->weight, 2.0);
    CU_ASSERT_EQUAL(la->weight, 2.0);
    CU_ASSERT_EQUAL(la->value, 0.0); /* a tie is argmax 0: classified fake */

    /* D says "real" with logit margin 5: CE(real) = log(1 + e^-5) */
    set_d_output(0.0f, 5.0f);
    CU_ASSERT_EQUAL(train(b, 0, &out), KILN_OK);
    const double lo = log1p(exp(-5.0)), hi = log1p(exp(5.0));
    CU_ASSERT(fabs(logged("g_loss")->value - lo) < 1e-6);
    CU_ASSERT(fabs(out.loss - 0.5 * (lo + hi)) < 1e-5);
    CU_ASSERT_EQUAL(logged("d_real_acc")->value, 1.0);
    set_d_output(5.0f, 0.0f);
    CU_ASSERT_EQUAL(train(b, 0, &out), KILN_OK);
    CU_ASSERT(fabs(logged("g_loss")->value - hi) < 1e-5);
    CU_ASSERT_EQUAL(logged("d_real_acc")->value, 0.0);
    destroy_module();
}

static void test_eval_steps(void) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 1, NULL));
    const kiln_batch *b = batch_of(2, 4, 4);
    kiln_step_output out = {sizeof out, 0, 0, 0, 0, 0};
    reset_records();
    CU_ASSERT_EQUAL(g_mod->validation_step(g_inst, b, 3, &out), KILN_OK);
    CU_ASSERT_STRING_EQUAL(g_calls, ""); /* no optimisation services */
    const kiln_test_value *vg = logged("val_g_loss"), *vd = logged("val_d_loss");
    CU_ASSERT_PTR_NOT_NULL_FATAL(vg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(vd);
    CU_ASSERT_EQUAL(vg->flags, KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR);
    CU_ASSERT_EQUAL(vd->weight, 2.0);
    CU_ASSERT_EQUAL(out.loss, vd->value);
    CU_ASSERT(isfinite(vg->value) && vg->value > 0);
    const double g3 = vg->value, d3 = vd->value;
    /* fixed noise per batch index: the same index gives the same losses
     * (even after a training step drew noise), another index other noise */
    CU_ASSERT_EQUAL(train(b, 0, NULL), KILN_OK);
    CU_ASSERT_EQUAL(g_mod->validation_step(g_inst, b, 3, &out), KILN_OK);
    CU_ASSERT_EQUAL(logged("val_g_loss")->value, g3);
    CU_ASSERT_EQUAL(logged("val_d_loss")->value, d3);
    CU_ASSERT_EQUAL(g_mod->validation_step(g_inst, b, 4, &out), KILN_OK);
    CU_ASSERT_NOT_EQUAL(logged("val_g_loss")->value, g3);
    CU_ASSERT_EQUAL(g_mod->test_step(g_inst, b, 3, &out), KILN_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(logged("test_g_loss"));
    CU_ASSERT_EQUAL(logged("test_g_loss")->value, g3);
    CU_ASSERT_EQUAL(logged("test_d_loss")->value, d3);
    /* after an eval step there is nothing to back-propagate */
    CU_ASSERT_EQUAL(g_mod->backward(g_inst, 1.0), KILN_E_STATE);
    destroy_module();
}

/* ------------------------------------------------------------ refusals */

static int msg_has(const char *frag) {
    const int ok = strstr(kiln_test_error(g_th), frag) != NULL;
    if (!ok) printf("\n  expected \"%s\" in: %s", frag, kiln_test_error(g_th));
    return ok;
}

static void test_refusals(void) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 1, NULL));
    const kiln_batch *b = batch_of(2, 4, 5);
    g_nopt = 1;
    reset_records();
    CU_ASSERT_EQUAL(train(b, 0, NULL), KILN_E_CONFIG);
    CU_ASSERT(msg_has("gan needs two optimizers (generator, discriminator) in `optimizers = (...)`"));
    CU_ASSERT_STRING_EQUAL(g_calls, "");
    g_nopt = 2;

    /* the backward op outside manual_backward, before and after a step */
    CU_ASSERT_EQUAL(g_mod->backward(g_inst, 1.0), KILN_E_STATE);
    CU_ASSERT(msg_has("outside manual_backward"));
    CU_ASSERT_EQUAL(train(b, 0, NULL), KILN_OK);
    CU_ASSERT_EQUAL(g_mod->backward(g_inst, 1.0), KILN_E_STATE);

    /* float32 compute only */
    kiln_parameter *p = param("discriminator.2.weight");
    p->compute_dtype = KILN_DTYPE_F16;
    CU_ASSERT_EQUAL(train(b, 0, NULL), KILN_E_UNSUPPORTED);
    CU_ASSERT(msg_has("float32 only"));
    CU_ASSERT(msg_has("float16"));
    p->compute_dtype = KILN_DTYPE_F32;

    /* bad batches */
    CU_ASSERT_EQUAL(train(batch_of(2, 5, 1), 0, NULL), KILN_E_DATA);
    CU_ASSERT(msg_has("expects 4 values per image"));
    CU_ASSERT_EQUAL(train(batch_of(9, 4, 1), 0, NULL), KILN_E_DATA);
    CU_ASSERT(msg_has("max_batch is 8"));

    /* bad configs */
    int32_t rc = 0;
    gcfg c = TINY;
    c.samples = 5;
    CU_ASSERT_PTR_NULL(make(c, 1, &rc));
    CU_ASSERT_EQUAL(rc, KILN_E_CONFIG);
    CU_ASSERT(msg_has("square number"));
    CU_ASSERT_EQUAL(kiln_test_param_count(g_th), 0);
    c = TINY;
    c.g_every = 0;
    CU_ASSERT_PTR_NULL(make(c, 1, &rc));
    CU_ASSERT(rc == KILN_E_CONFIG && msg_has("'g_every' must be in [1,"));
    c = TINY;
    c.samples = 16; /* > max_batch 8 */
    CU_ASSERT_PTR_NULL(make(c, 1, &rc));
    CU_ASSERT(rc == KILN_E_CONFIG && msg_has("must not exceed max_batch"));
    c = TINY;
    c.image_size = 5;
    CU_ASSERT_PTR_NULL(make(c, 1, &rc));
    CU_ASSERT(rc == KILN_E_CONFIG && msg_has("image_size 5 is not a square"));
    c.grid_every = 0; /* no grid: any image size */
    CU_ASSERT_PTR_NOT_NULL(make(c, 1, &rc));
    CU_ASSERT_EQUAL(train(batch_of(2, 5, 1), 0, NULL), KILN_OK);
    c = TINY;
    c.hidden = 0;
    CU_ASSERT_PTR_NULL(make(c, 1, &rc));
    CU_ASSERT(rc == KILN_E_CONFIG && msg_has("'hidden'"));

    /* a 1.1 host, and a 1.2 table missing a service */
    destroy_module();
    kiln_test_reset(g_th);
    kiln_test_set_accelerator(g_th, g_acc, &g_kt);
    kiln_host_services old = g_svc;
    old.abi_minor = 1;
    kiln_instance *inst = NULL;
    rc = g_mod->base.create(g_desc->plugin_ctx, &old, kiln_test_hctx(g_th), kv_of(TINY), &inst);
    CU_ASSERT_EQUAL(rc, KILN_E_HOST_TOO_OLD);
    CU_ASSERT_PTR_NULL(inst);
    CU_ASSERT(msg_has("manual_backward"));
    old = g_svc;
    old.untoggle_optimizer = NULL;
    rc = g_mod->base.create(g_desc->plugin_ctx, &old, kiln_test_hctx(g_th), kv_of(TINY), &inst);
    CU_ASSERT_EQUAL(rc, KILN_E_HOST_TOO_OLD);
    CU_ASSERT_PTR_NULL(inst);
    CU_ASSERT_EQUAL(kiln_test_param_count(g_th), 0);

    /* set_state refuses what it did not write */
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 1, NULL));
    unsigned char S[64];
    const size_t ns = save_state(S);
    CU_ASSERT_EQUAL(g_mod->base.set_state(g_inst, 2, S, ns), KILN_E_STATE);
    CU_ASSERT_EQUAL(g_mod->base.set_state(g_inst, 1, S, ns - 1), KILN_E_STATE);
    S[0] = 'X';
    CU_ASSERT_EQUAL(g_mod->base.set_state(g_inst, 1, S, ns), KILN_E_STATE);
    destroy_module();
}

/* Only create() allocates accelerator memory: steps, evaluation and the
 * grid reuse the arena. */
static void test_no_steady_state_alloc(void) {
    g_allocs = 0;
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 1, NULL));
    const int after_create = g_allocs;
    CU_ASSERT_EQUAL(after_create, 1);
    for (int64_t i = 0; i < 4; i++) CU_ASSERT_EQUAL(train(batch_of(2, 4, 30), i, NULL), KILN_OK);
    kiln_step_output out = {sizeof out, 0, 0, 0, 0, 0};
    CU_ASSERT_EQUAL(g_mod->validation_step(g_inst, batch_of(8, 4, 31), 0, &out), KILN_OK);
    kiln_test_trainer(g_th)->run_dir = g_dir;
    kiln_event ev = {sizeof ev, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT, 0, -1, NULL, NULL, 0, kiln_test_trainer(g_th),
                     NULL, NULL, 0, 0, 0, 0, 0};
    kiln_test_trainer(g_th)->current_epoch = 50;
    CU_ASSERT_EQUAL(g_mod->on_event(g_inst, &ev), KILN_OK);
    CU_ASSERT_EQUAL(g_allocs, after_create);
    destroy_module();
}

/* ----------------------------------------------------------------- PNG */

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

/* Reads `path` back: IHDR fields from the bytes, then a full decode by
 * libpng (signature, CRCs, zlib) into pixels (w * h gray bytes). */
static int read_png(const char *path, uint32_t *w, uint32_t *h, unsigned char **pixels) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned char hdr[33];
    const size_t got = fread(hdr, 1, sizeof hdr, f);
    fclose(f);
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (got != sizeof hdr || memcmp(hdr, sig, 8) || memcmp(hdr + 12, "IHDR", 4)) return -2;
    *w = (uint32_t)hdr[16] << 24 | (uint32_t)hdr[17] << 16 | (uint32_t)hdr[18] << 8 | hdr[19];
    *h = (uint32_t)hdr[20] << 24 | (uint32_t)hdr[21] << 16 | (uint32_t)hdr[22] << 8 | hdr[23];
    if (hdr[24] != 8 || hdr[25] != 0) return -3; /* 8-bit, color type 0 = grayscale */
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) return -4;
    if (img.width != *w || img.height != *h || img.format != PNG_FORMAT_GRAY) {
        png_image_free(&img);
        return -5;
    }
    *pixels = malloc(PNG_IMAGE_SIZE(img));
    if (!*pixels || !png_image_finish_read(&img, NULL, *pixels, 0, NULL)) {
        free(*pixels);
        png_image_free(&img);
        return -6;
    }
    return 0;
}

static int32_t epoch_end(int64_t epoch, int32_t rank) {
    kiln_test_trainer(g_th)->current_epoch = epoch;
    kiln_test_trainer(g_th)->rank = rank;
    kiln_event ev = {sizeof ev, KILN_EV_ON_TRAIN_EPOCH_END, KILN_STAGE_FIT, 0, -1, NULL, NULL, 0, kiln_test_trainer(g_th),
                     NULL, NULL, 0, 0, 0, 0, 0};
    return g_mod->on_event(g_inst, &ev);
}

/* The end of `epoch` on `rank` succeeds and writes that epoch's grid or
 * not, as `written` says. */
static void expect_grid(int64_t epoch, int32_t rank, int written) {
    CU_ASSERT_EQUAL(epoch_end(epoch, rank), KILN_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/samples_epoch_%03lld.png", g_dir, (long long)epoch);
    CU_ASSERT(file_exists(path) == written);
}

static void test_png_grid(void) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 1, NULL)); /* 4 samples of 2x2 */
    kiln_test_trainer(g_th)->run_dir = g_dir;
    /* a generator whose output ignores the noise: tanh(bias) per pixel */
    kiln_parameter *w = param("generator.4.weight"), *bias = param("generator.4.bias");
    memset(w->data, 0, (size_t)w->numel * 4);
    const float bv[4] = {-10.0f, 0.1f, 0.5f, 10.0f};
    memcpy(bias->data, bv, sizeof bv);
    CU_ASSERT_EQUAL(epoch_end(2, 0), KILN_OK);
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/samples_epoch_002.png", g_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CU_ASSERT_FATAL(file_exists(path));
    CU_ASSERT(!file_exists(tmp)); /* written atomically: no temp left */
    uint32_t W = 0, H = 0;
    unsigned char *px = NULL;
    CU_ASSERT_EQUAL_FATAL(read_png(path, &W, &H, &px), 0);
    CU_ASSERT_EQUAL(W, 2 * 2 + 3 * 2); /* 2 tiles of 2 px, three 2-px borders */
    CU_ASSERT_EQUAL(H, W);
    unsigned char want[4];
    for (int i = 0; i < 4; i++) want[i] = (unsigned char)lrint((tanh((double)bv[i]) + 1.0) * 127.5);
    CU_ASSERT_EQUAL(want[0], 0);
    CU_ASSERT_EQUAL(want[3], 255);
    int bad = 0, border = 0;
    for (uint32_t y = 0; y < H; y++)
        for (uint32_t x = 0; x < W; x++) {
            const int in_tile = (x % 4 >= 2) && (y % 4 >= 2); /* tiles start at 2 and 6 */
            const unsigned char v = px[y * W + x];
            if (in_tile) bad += v != want[(y % 4 - 2) * 2 + (x % 4 - 2)];
            else border += v == 255;
        }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(border, (int)(W * H - 16));
    free(px);

    /* every grid_every-th epoch, rank 0 only, and no run_dir is no file */
    gcfg c = TINY;
    c.grid_every = 2;
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(c, 1, NULL));
    kiln_test_trainer(g_th)->run_dir = g_dir;
    expect_grid(4, 0, 0); /* (4 + 1) % 2 != 0 */
    expect_grid(5, 1, 0); /* rank 1 */
    expect_grid(5, 0, 1);
    kiln_test_trainer(g_th)->run_dir = NULL;
    expect_grid(7, 0, 0);
    c.grid_every = 0;
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(c, 1, NULL));
    kiln_test_trainer(g_th)->run_dir = g_dir;
    expect_grid(8, 0, 0);
    /* an unwritable run directory is an I/O error naming the file */
    c.grid_every = 1;
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(c, 1, NULL));
    kiln_test_trainer(g_th)->run_dir = "/nonexistent/kiln-gan";
    CU_ASSERT_EQUAL(epoch_end(0, 0), KILN_E_IO);
    CU_ASSERT(msg_has("/nonexistent/kiln-gan/samples_epoch_000.png.tmp"));

    /* Fashion-MNIST's size: 64 samples of 28x28 -> 8 * 28 + 9 * 2 = 242 */
    const gcfg fm = {8, 16, 784, 2, 4, 64, 1, 64};
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(fm, 1, NULL));
    kiln_test_trainer(g_th)->run_dir = g_dir;
    CU_ASSERT_EQUAL(epoch_end(0, 0), KILN_OK);
    snprintf(path, sizeof path, "%s/samples_epoch_000.png", g_dir);
    CU_ASSERT_EQUAL_FATAL(read_png(path, &W, &H, &px), 0);
    CU_ASSERT_EQUAL(W, 242);
    CU_ASSERT_EQUAL(H, 242);
    int distinct = 0;
    for (uint32_t i = 1; i < W * H; i++) distinct += px[i] != px[i - 1];
    CU_ASSERT(distinct > 1000); /* real samples, not a flat image */
    free(px);
    destroy_module();
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = malloc(1 << 20);
    *n = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    return buf;
}

/* The grid noise and the training noise depend on the run seed only. */
static void test_determinism(void) {
    const gcfg fm = {8, 16, 784, 2, 4, 16, 1, 16};
    const uint64_t seeds[3] = {7, 7, 8};
    unsigned char *files[3];
    size_t sizes[3];
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_PTR_NOT_NULL_FATAL(make(fm, seeds[i], NULL));
        kiln_test_trainer(g_th)->run_dir = g_dir;
        CU_ASSERT_EQUAL(epoch_end(20 + i, 0), KILN_OK);
        char path[512];
        snprintf(path, sizeof path, "%s/samples_epoch_%03d.png", g_dir, 20 + i);
        files[i] = slurp(path, &sizes[i]);
        CU_ASSERT_PTR_NOT_NULL_FATAL(files[i]);
    }
    CU_ASSERT(sizes[0] == sizes[1] && memcmp(files[0], files[1], sizes[0]) == 0);
    CU_ASSERT(sizes[0] != sizes[2] || memcmp(files[0], files[2], sizes[0]) != 0);
    for (int i = 0; i < 3; i++) free(files[i]);

    /* training losses over three steps; the batch-copy path (an
     * accelerator without host memory) gives the same bits */
    double L[4][6];
    const uint64_t s2[4] = {5, 5, 6, 5};
    for (int r = 0; r < 4; r++) {
        if (r == 3) g_kt.flags &= ~KILN_KERNELS_HOST_MEMORY;
        CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, s2[r], NULL));
        for (int64_t i = 0; i < 3; i++) CU_ASSERT_EQUAL(train(batch_of(2, 4, 40 + (unsigned)i), i, NULL), KILN_OK);
        CU_ASSERT_EQUAL(g_nlosses, 6);
        memcpy(L[r], g_losses, sizeof L[r]);
    }
    g_kt = *g_cpu->kernels(g_acc);
    g_kt.alloc = count_alloc;
    CU_ASSERT_EQUAL(memcmp(L[0], L[1], sizeof L[0]), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(L[0], L[2], sizeof L[0]), 0);
    CU_ASSERT_EQUAL(memcmp(L[0], L[3], sizeof L[0]), 0);
    /* a restored noise state replays the same losses */
    CU_ASSERT_PTR_NOT_NULL_FATAL(make(TINY, 5, NULL));
    CU_ASSERT_EQUAL(train(batch_of(2, 4, 40), 0, NULL), KILN_OK);
    unsigned char S[64];
    const size_t ns = save_state(S);
    reset_records();
    CU_ASSERT_EQUAL(train(batch_of(2, 4, 41), 1, NULL), KILN_OK);
    const double g1 = g_losses[0];
    load_state(S, ns);
    reset_records();
    CU_ASSERT_EQUAL(train(batch_of(2, 4, 41), 1, NULL), KILN_OK);
    CU_ASSERT_EQUAL(g_losses[0], g1);
    destroy_module();
}

/* ------------------------------------------------------------------ main */

static CU_TestInfo cases_gan[] = {
    {"descriptor, properties, parameters", test_descriptor_and_params},
    {"backward vs finite differences (toggled)", test_backward_fd_toggled},
    {"backward vs finite differences (nothing frozen)", test_backward_fd_unfrozen},
    {"service call order in training_step", test_call_order},
    {"frozen parameters' grads bit-identical", test_frozen_grads_untouched},
    {"step every N, accumulation, loss scale", test_step_every_n},
    {"known losses and logged metrics", test_known_losses_and_logging},
    {"validation and test steps", test_eval_steps},
    {"refusals", test_refusals},
    {"no allocation after create", test_no_steady_state_alloc},
    {"PNG sample grid", test_png_grid},
    {"determinism per seed", test_determinism},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "gan", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_gan},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
