/*
 * test_mlp.c — CUnit suite for the "mlp" module plugin, loaded through the
 * test host. The test builds its own kiln_kernels table around the CPU
 * kernels (kc_*), so the module is exercised exactly as an accelerator would
 * drive it, without depending on the cpu accelerator plugin. It checks the
 * registered parameters (names, shapes, order, NO_DECAY), deterministic
 * seeding, the forward loss and accuracy against a double-precision
 * reference written here, the whole backward pass against central finite
 * differences of training_step's loss (ReLU and GELU), gradient
 * accumulation, the logged metrics, the refusals of bad batches and bad
 * configs with messages naming the problem, that no step allocates, and that
 * plain SGD on a separable toy problem learns.
 */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include "cpu_kernels.h"
#include <kiln/testing.h>

#include "plugin_fixture.h"
#include "test_rng.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

#include <CUnit/CUnit.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------- the test kernel table */

/* A stand-in accelerator instance; every kernel checks it is passed back. */
static int g_acc_token;
#define TEST_ACC ((kiln_instance *)&g_acc_token)
static int g_bad_acc;   /* kernel calls that got another acc pointer   */
static int g_allocs;    /* successful alloc calls                      */
static int g_copies;    /* copy calls                                  */
static int g_frees;     /* free calls with a non-NULL pointer          */

static void chk(kiln_instance *acc) {
    if (acc != TEST_ACC) g_bad_acc++;
}

static int32_t t_alloc(kiln_instance *acc, size_t bytes, void **out) {
    chk(acc);
    size_t n = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(out, 64, n ? n : 64)) return KILN_E_NOMEM;
    memset(*out, 0, n ? n : 64);
    g_allocs++;
    return KILN_OK;
}
static void t_free(kiln_instance *acc, void *p) {
    chk(acc);
    if (p) g_frees++;
    free(p);
}
static int32_t t_copy(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind) {
    g_copies++;
    chk(acc);
    (void)kind;
    memmove(dst, src, bytes);
    return KILN_OK;
}
static int32_t t_zero(kiln_instance *acc, void *p, size_t bytes) {
    chk(acc);
    memset(p, 0, bytes);
    return KILN_OK;
}
static int32_t t_sync(kiln_instance *acc) {
    chk(acc);
    return KILN_OK;
}
static int32_t t_gemm(kiln_instance *acc, int32_t ta, int32_t tb, int32_t M, int32_t N, int32_t K, float alpha,
                      const float *A, int32_t lda, const float *B, int32_t ldb, float beta, float *C, int32_t ldc) {
    chk(acc);
    kc_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return KILN_OK;
}
static int32_t t_bias_add(kiln_instance *acc, float *y, const float *b, int32_t rows, int32_t cols) {
    chk(acc);
    kc_bias_add(y, b, rows, cols);
    return KILN_OK;
}
static int32_t t_bias_grad(kiln_instance *acc, float *db, const float *dy, int32_t rows, int32_t cols, int32_t a) {
    chk(acc);
    kc_bias_grad(db, dy, rows, cols, a);
    return KILN_OK;
}
/* An activation's two entries, t_<name>_f (y = f(x)) and t_<name>_b
 * (dx = f'(dy, x)), over the kernels fwd and bwd. */
#define ACT_ENTRIES(name, fwd, bwd)                                                                      \
    static int32_t t_##name##_f(kiln_instance *acc, float *y, const float *x, size_t n) {               \
        chk(acc);                                                                                        \
        fwd(y, x, n);                                                                                    \
        return KILN_OK;                                                                                  \
    }                                                                                                    \
    static int32_t t_##name##_b(kiln_instance *acc, float *dx, const float *dy, const float *x, size_t n) { \
        chk(acc);                                                                                        \
        bwd(dx, dy, x, n);                                                                               \
        return KILN_OK;                                                                                  \
    }
ACT_ENTRIES(relu, kc_relu_forward, kc_relu_backward)
ACT_ENTRIES(gelu, kc_gelu_forward, kc_gelu_backward)
/* The table's contract: a label outside [0, C) is KILN_E_DATA. */
static int32_t t_xent_f(kiln_instance *acc, float *probs, const float *logits, const int32_t *labels, int32_t B,
                        int32_t C, float *loss, int32_t *n_correct) {
    chk(acc);
    for (int32_t i = 0; i < B; i++)
        if (labels[i] < 0 || labels[i] >= C) return KILN_E_DATA;
    int nc = 0;
    *loss = kc_softmax_xent_forward(probs, logits, labels, B, C, &nc);
    if (n_correct) *n_correct = nc;
    return KILN_OK;
}
static int32_t t_xent_b(kiln_instance *acc, float *dlogits, const float *probs, const int32_t *labels, int32_t B,
                        int32_t C, float dloss) {
    chk(acc);
    kc_softmax_xent_backward(dlogits, probs, labels, B, C, dloss);
    return KILN_OK;
}
static int32_t t_sum(kiln_instance *acc, const float *x, size_t n, double *out) {
    chk(acc);
    *out = kc_sum(x, n);
    return KILN_OK;
}
static int32_t t_sumsq(kiln_instance *acc, const float *x, size_t n, double *out) {
    chk(acc);
    *out = kc_sumsq(x, n);
    return KILN_OK;
}
static int32_t t_scale(kiln_instance *acc, float *x, float a, size_t n) {
    chk(acc);
    kc_scale(x, a, n);
    return KILN_OK;
}
static int32_t t_axpy(kiln_instance *acc, float *y, float a, const float *x, size_t n) {
    chk(acc);
    kc_axpy(y, a, x, n);
    return KILN_OK;
}
static int32_t t_all_finite(kiln_instance *acc, const float *x, size_t n, int32_t *finite) {
    chk(acc);
    *finite = kc_all_finite(x, n);
    return KILN_OK;
}
static int32_t t_sgd(kiln_instance *acc, float *p, const float *g, float *buf, size_t n, float lr, float mom,
                     float damp, int32_t nesterov, float wd, int32_t first) {
    chk(acc);
    kc_sgd_update(p, g, buf, n, lr, mom, damp, nesterov, wd, first);
    return KILN_OK;
}
static int32_t t_adamw(kiln_instance *acc, float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                       float b2, float eps, float wd, int64_t step) {
    chk(acc);
    kc_adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, step);
    return KILN_OK;
}

/* A 1.1-sized table (no 1.2 entries): the module must train in fp32 with it. */
static const kiln_kernels g_table = {
    .struct_size = KILN_KERNELS_SIZE_1_1, .flags = 0, .alloc = t_alloc, .free = t_free, .copy = t_copy,
    .zero = t_zero, .synchronize = t_sync, .gemm = t_gemm, .bias_add = t_bias_add, .bias_grad = t_bias_grad,
    .relu_forward = t_relu_f, .relu_backward = t_relu_b, .gelu_forward = t_gelu_f, .gelu_backward = t_gelu_b,
    .softmax_xent_forward = t_xent_f, .softmax_xent_backward = t_xent_b, .sum = t_sum, .sumsq = t_sumsq,
    .scale = t_scale, .axpy = t_axpy, .all_finite = t_all_finite, .sgd_update = t_sgd, .adamw_update = t_adamw,
};

/* ------------------------------------------------------------- helpers */

/* The same table, declaring that device memory is host memory: the module
 * then reads the batch in place instead of copying it. */
static kiln_kernels g_table_host;
static const kiln_kernels *g_create_table; /* table make_module installs (NULL: g_table) */
static kiln_instance *g_create_acc;        /* and its accelerator (NULL: TEST_ACC)    */

static test_rng g_rng = {0x9E3779B97F4A7C15ull};
static void rng_seed(uint64_t s) { test_rng_seed(&g_rng, s); }
static double rng_unit(void) { return test_rng_unit(&g_rng); } /* [0, 1) */
static float rng_uniform(float lo, float hi) { return lo + (hi - lo) * (float)rng_unit(); }

static const kiln_plugin_desc *g_desc;
static const kiln_module_ops *ops(void) { return (const kiln_module_ops *)g_desc->ops; }

static int load_plugin(void) {
    if (fixture_need_plugin_dir()) return -1;
    kiln_test_reset(g_th);
    g_desc = fixture_load_plugin(g_th, "mlp", KILN_KIND_MODULE, "mlp");
    return g_desc ? 0 : -1;
}

/* The resolved config the host would pass: every declared key present. */
typedef struct cfg {
    int64_t layers[8];
    uint32_t nlayers;
    const char *activation;
    const char *init;
    int64_t max_batch;
    kiln_kv kv[5];
} cfg;

static const kiln_kv *cfg_build(cfg *c) {
    c->kv[0] = (kiln_kv){"layers", {KILN_TYPE_INT_LIST, c->nlayers, {.il = c->layers}}};
    c->kv[1] = (kiln_kv){"activation", {KILN_TYPE_STRING, 0, {.s = c->activation}}};
    c->kv[2] = (kiln_kv){"init", {KILN_TYPE_STRING, 0, {.s = c->init}}};
    c->kv[3] = (kiln_kv){"max_batch", {KILN_TYPE_INT, 0, {.i = c->max_batch}}};
    c->kv[4] = (kiln_kv){NULL, KILN_V_NONE};
    return c->kv;
}

static cfg small_cfg(const char *activation) {
    cfg c = {{5, 7, 6, 3}, 4, activation, "kaiming_uniform", 16, {{0}}};
    return c;
}

/* Fresh test host + module instance; parameters allocated and initialised. */
static kiln_instance *make_module(cfg *c, uint64_t seed) {
    kiln_test_reset(g_th);
    kiln_test_set_accelerator(g_th, g_create_acc ? g_create_acc : TEST_ACC, g_create_table ? g_create_table : &g_table);
    kiln_instance *inst = fixture_create_checked(g_desc, g_th, cfg_build(c));
    if (!inst) return NULL;
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(g_th), 0);
    CU_ASSERT_EQUAL(ops()->init_weights(inst, seed), KILN_OK);
    return inst;
}

static void destroy_module(kiln_instance *inst) {
    if (inst) ops()->base.destroy(inst);
}

/* A classification batch over caller-owned storage. */
typedef struct tbatch {
    float x[64 * 8];   /* (B, F) */
    int32_t y[64];     /* (B)    */
    kiln_tensor t[2];
    kiln_batch b;
} tbatch;

static void batch_wrap(tbatch *tb, int B, int F) {
    tb->t[0] = (kiln_tensor){tb->x, KILN_DTYPE_F32, 2, {B, F, 1, 1}};
    tb->t[1] = (kiln_tensor){tb->y, KILN_DTYPE_I32, 1, {B, 1, 1, 1}};
    tb->b = (kiln_batch){sizeof(kiln_batch), 2, tb->t, B};
}

static void batch_random(tbatch *tb, int B, int F, int C, uint64_t seed) {
    rng_seed(seed);
    for (int i = 0; i < B * F; i++) tb->x[i] = rng_uniform(-1.5f, 1.5f);
    for (int i = 0; i < B; i++) tb->y[i] = (int32_t)(rng_unit() * C);
    batch_wrap(tb, B, F);
}

static double train_loss(kiln_instance *inst, const tbatch *tb) {
    kiln_step_output out = {sizeof out, 0, 0, 0, 0, 0};
    int32_t rc = ops()->training_step(inst, &tb->b, 0, &out);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(out.has_loss, 1);
    return out.loss;
}

static void zero_grads(void) {
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) memset(kiln_test_param(g_th, i)->grad, 0, (size_t)kiln_test_param(g_th, i)->numel * sizeof(float));
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* Number of entries of `name` logged, and the last one. */
static int find_logged(const char *name, kiln_test_value *last) {
    int n = 0;
    for (int i = 0; i < (int)kiln_test_logged_count(g_th); i++)
        if (!strcmp(kiln_test_logged(g_th, i)->name, name)) {
            n++;
            if (last) *last = (*kiln_test_logged(g_th, i));
        }
    return n;
}

/* ---------------------------------------- double-precision reference */

static double ref_gelu(double x) {
    const double k = 0.79788456080286535588; /* sqrt(2/pi) */
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

/* Loss and accuracy of the registered parameters on `tb`, computed in
 * double straight from the nn.Linear definition y = x W^T + b. */
static void ref_forward(const cfg *c, const tbatch *tb, int B, double *loss, double *acc) {
    double a[64][64], z[64][64];
    const int L = (int)c->nlayers - 1;
    for (int r = 0; r < B; r++)
        for (int j = 0; j < c->layers[0]; j++) a[r][j] = tb->x[r * c->layers[0] + j];
    for (int l = 0; l < L; l++) {
        const int in = (int)c->layers[l], out = (int)c->layers[l + 1];
        const float *W = kiln_test_param(g_th, 2 * l)->data, *b = kiln_test_param(g_th, 2 * l + 1)->data;
        for (int r = 0; r < B; r++)
            for (int o = 0; o < out; o++) {
                double s = b[o];
                for (int i = 0; i < in; i++) s += (double)W[o * in + i] * a[r][i];
                z[r][o] = s;
            }
        for (int r = 0; r < B; r++)
            for (int o = 0; o < out; o++)
                a[r][o] = l == L - 1 ? z[r][o] : !strcmp(c->activation, "gelu") ? ref_gelu(z[r][o])
                                                                                 : (z[r][o] > 0 ? z[r][o] : 0.0);
    }
    const int C = (int)c->layers[L];
    double total = 0;
    int correct = 0;
    for (int r = 0; r < B; r++) {
        double mx = a[r][0];
        int arg = 0;
        for (int k = 1; k < C; k++)
            if (a[r][k] > mx) mx = a[r][k], arg = k;
        double se = 0;
        for (int k = 0; k < C; k++) se += exp(a[r][k] - mx);
        total += log(se) + mx - a[r][tb->y[r]];
        correct += arg == tb->y[r];
    }
    *loss = total / B;
    *acc = (double)correct / B;
}

/* ----------------------------------------------------------------- tests */

static void test_descriptor(void) {
    CU_ASSERT_EQUAL(g_desc->kind, KILN_KIND_MODULE);
    CU_ASSERT_STRING_EQUAL(g_desc->name, "mlp");
    CU_ASSERT_PTR_NOT_NULL(g_desc->description);
    CU_ASSERT_PTR_NULL(ops()->on_event);
    CU_ASSERT_EQUAL(ops()->base.struct_size, sizeof(kiln_module_ops));
    /* Every key create() reads is declared, with the documented defaults. */
    const char *want[] = {"layers", "activation", "init", "max_batch"};
    for (int i = 0; i < 4; i++) {
        const kiln_param *p = g_desc->params;
        while (p->key && strcmp(p->key, want[i])) p++;
        CU_ASSERT_PTR_NOT_NULL(p->key);
        if (!p->key) continue;
        if (i == 0) {
            CU_ASSERT_EQUAL(p->def.type, KILN_TYPE_INT_LIST);
            CU_ASSERT_EQUAL_FATAL(p->def.count, 4);
            CU_ASSERT(p->def.v.il[0] == 784 && p->def.v.il[1] == 1024 && p->def.v.il[2] == 1024 &&
                      p->def.v.il[3] == 10);
        } else if (i == 1) {
            CU_ASSERT_STRING_EQUAL(p->def.v.s, "relu");
        } else if (i == 2) {
            CU_ASSERT_STRING_EQUAL(p->def.v.s, "kaiming_uniform");
        } else {
            CU_ASSERT_EQUAL(p->def.v.i, 1024);
        }
    }
}

static void test_param_layout(void) {
    cfg c = small_cfg("relu");
    kiln_instance *inst = make_module(&c, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    CU_ASSERT_EQUAL_FATAL(kiln_test_param_count(g_th), 6);
    for (int l = 0; l < 3; l++) {
        char wn[32], bn[32];
        snprintf(wn, sizeof wn, "layers.%d.weight", l);
        snprintf(bn, sizeof bn, "layers.%d.bias", l);
        const kiln_parameter *w = kiln_test_param(g_th, 2 * l), *b = kiln_test_param(g_th, 2 * l + 1);
        CU_ASSERT_STRING_EQUAL(w->name, wn);
        CU_ASSERT_STRING_EQUAL(b->name, bn);
        CU_ASSERT_EQUAL(w->ndim, 2);
        CU_ASSERT_EQUAL(w->shape[0], c.layers[l + 1]); /* (out, in) like nn.Linear */
        CU_ASSERT_EQUAL(w->shape[1], c.layers[l]);
        CU_ASSERT_EQUAL(w->numel, c.layers[l] * c.layers[l + 1]);
        CU_ASSERT_EQUAL(w->flags & KILN_PARAMF_NO_DECAY, 0);
        CU_ASSERT_EQUAL(b->ndim, 1);
        CU_ASSERT_EQUAL(b->shape[0], c.layers[l + 1]);
        CU_ASSERT_EQUAL(b->flags & KILN_PARAMF_NO_DECAY, KILN_PARAMF_NO_DECAY);
    }
    destroy_module(inst);
}

static void test_init_deterministic(void) {
    cfg c = small_cfg("relu");
    enum { MAXN = 64 };
    static float saved[6][MAXN];
    kiln_instance *inst = make_module(&c, 42);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    for (uint32_t i = 0; i < 6; i++) {
        const kiln_parameter *p = kiln_test_param(g_th, i);
        CU_ASSERT_FATAL(p->numel <= MAXN);
        memcpy(saved[i], p->data, (size_t)p->numel * sizeof(float));
        /* PyTorch's nn.Linear bound 1/sqrt(fan_in) for weight and bias. */
        const double bound = (float)(1.0 / sqrt((double)c.layers[i / 2]));
        int nonzero = 0;
        double maxabs = 0;
        for (int64_t j = 0; j < p->numel; j++) {
            nonzero += p->data[j] != 0.0f;
            if (fabs(p->data[j]) > maxabs) maxabs = fabs(p->data[j]);
        }
        CU_ASSERT(maxabs <= bound);
        CU_ASSERT(maxabs > 0.5 * bound); /* really spread over the range */
        CU_ASSERT_EQUAL(nonzero, p->numel);
    }
    /* Dirty the grads: init_weights must zero them. */
    for (uint32_t i = 0; i < 6; i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) kiln_test_param(g_th, i)->grad[j] = 1.0f;
    CU_ASSERT_EQUAL(ops()->init_weights(inst, 42), KILN_OK);
    for (uint32_t i = 0; i < 6; i++) {
        CU_ASSERT_EQUAL(memcmp(saved[i], kiln_test_param(g_th, i)->data, (size_t)kiln_test_param(g_th, i)->numel * sizeof(float)), 0);
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) CU_ASSERT_EQUAL(kiln_test_param(g_th, i)->grad[j], 0.0f);
    }
    destroy_module(inst);

    /* A brand-new instance with the same seed: the same bits. */
    inst = make_module(&c, 42);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    for (uint32_t i = 0; i < 6; i++)
        CU_ASSERT_EQUAL(memcmp(saved[i], kiln_test_param(g_th, i)->data, (size_t)kiln_test_param(g_th, i)->numel * sizeof(float)), 0);
    /* Another seed: every tensor differs. */
    CU_ASSERT_EQUAL(ops()->init_weights(inst, 43), KILN_OK);
    for (uint32_t i = 0; i < 6; i++)
        CU_ASSERT_NOT_EQUAL(memcmp(saved[i], kiln_test_param(g_th, i)->data, (size_t)kiln_test_param(g_th, i)->numel * sizeof(float)), 0);
    destroy_module(inst);

    /* init = zeros */
    c.init = "zeros";
    inst = make_module(&c, 42);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    for (uint32_t i = 0; i < 6; i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) CU_ASSERT_EQUAL(kiln_test_param(g_th, i)->data[j], 0.0f);
    destroy_module(inst);
}

/* Loss/accuracy against the double reference, the logged values and the
 * step output, for both activations. */
static void forward_case(const char *activation) {
    cfg c = small_cfg(activation);
    kiln_instance *inst = make_module(&c, 7);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    tbatch tb;
    const int B = 12;
    batch_random(&tb, B, 5, 3, 99);
    /* Larger weights than the default init so the accuracy is not trivial
     * and the activations matter. */
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) kiln_test_param(g_th, i)->data[j] *= 3.0f;

    kiln_step_output out = {sizeof out, 0, 0, 0, 0, 0};
    CU_ASSERT_EQUAL_FATAL(ops()->training_step(inst, &tb.b, 3, &out), KILN_OK);
    double want_loss, want_acc;
    ref_forward(&c, &tb, B, &want_loss, &want_acc);
    CU_ASSERT_EQUAL(out.has_loss, 1);
    CU_ASSERT_EQUAL(out.batch_size, B);
    CU_ASSERT(fabs(out.loss - want_loss) <= 1e-5 * fabs(want_loss));
    if (fabs(out.loss - want_loss) > 1e-5 * fabs(want_loss))
        printf("\n  %s loss %.9g want %.9g", activation, out.loss, want_loss);

    kiln_test_value l = {0};
    CU_ASSERT_EQUAL(find_logged("train_loss", &l), 1);
    CU_ASSERT_EQUAL(l.value, out.loss);
    CU_ASSERT_EQUAL(l.flags, KILN_LOG_ON_STEP | KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR);
    CU_ASSERT_EQUAL(l.weight, B);
    CU_ASSERT_EQUAL(find_logged("train_acc", &l), 1);
    CU_ASSERT(fabs(l.value - want_acc) < 1e-12);
    CU_ASSERT_EQUAL(l.flags, KILN_LOG_ON_STEP | KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR);
    CU_ASSERT_EQUAL(l.weight, B);

    /* validation_step / test_step: same forward, epoch-only metrics. */
    const char *names[2][2] = {{"val_loss", "val_acc"}, {"test_loss", "test_acc"}};
    for (int s = 0; s < 2; s++) {
        kiln_step_output eo = {sizeof eo, 0, 0, 0, 0, 0};
        int32_t rc = s == 0 ? ops()->validation_step(inst, &tb.b, 0, &eo) : ops()->test_step(inst, &tb.b, 0, &eo);
        CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
        CU_ASSERT_EQUAL(eo.loss, out.loss);
        CU_ASSERT_EQUAL(eo.batch_size, B);
        CU_ASSERT_EQUAL(find_logged(names[s][0], &l), 1);
        CU_ASSERT_EQUAL(l.value, out.loss);
        CU_ASSERT_EQUAL(l.flags, KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR);
        CU_ASSERT_EQUAL(l.weight, B);
        CU_ASSERT_EQUAL(find_logged(names[s][1], &l), 1);
        CU_ASSERT(fabs(l.value - want_acc) < 1e-12);
        CU_ASSERT_EQUAL(l.flags, KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR);
    }
    /* Eval steps leave nothing for backward. */
    CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_E_STATE);
    CU_ASSERT(contains(kiln_test_error(g_th), "training_step"));
    destroy_module(inst);
}
static void test_forward_relu(void) { forward_case("relu"); }
static void test_forward_gelu(void) { forward_case("gelu"); }

/* Zero weights: uniform probabilities, loss ln(C), argmax = class 0 (first
 * maximum), so accuracy = share of label 0. Exact values. */
static void test_forward_zeros(void) {
    cfg c = small_cfg("relu");
    c.init = "zeros";
    kiln_instance *inst = make_module(&c, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    tbatch tb;
    batch_random(&tb, 10, 5, 3, 5);
    int zeros = 0;
    for (int i = 0; i < 10; i++) zeros += tb.y[i] == 0;
    const double loss = train_loss(inst, &tb);
    CU_ASSERT(fabs(loss - log(3.0)) < 1e-6);
    CU_ASSERT(fabs(kiln_test_last_value(g_th, "train_acc") - zeros / 10.0) < 1e-12);
    destroy_module(inst);
}

/* Backward against central differences of training_step's loss, for every
 * weight and bias entry of layers [5, 7, 6, 3], batch 4. The perturbation
 * actually applied is the float-rounded one, divided out exactly. */
static void gradcheck_case(const char *activation, uint64_t seed) {
    cfg c = small_cfg(activation);
    kiln_instance *inst = make_module(&c, seed);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    tbatch tb;
    batch_random(&tb, 4, 5, 3, seed * 31 + 1);
    /* Scale the weights up so every layer carries a gradient well above
     * the float noise of the loss. */
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) kiln_test_param(g_th, i)->data[j] *= 2.0f;

    (void)train_loss(inst, &tb);
    CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 1.0), KILN_OK);
    const double eps = 1e-3;
    int bad = 0, checked = 0;
    double worst = 0;
    for (uint32_t pi = 0; pi < kiln_test_param_count(g_th); pi++) {
        kiln_parameter *p = kiln_test_param(g_th, pi);
        for (int64_t j = 0; j < p->numel; j++) {
            const float orig = p->data[j];
            const float up = (float)(orig + eps), dn = (float)(orig - eps);
            p->data[j] = up;
            const double lp = train_loss(inst, &tb);
            p->data[j] = dn;
            const double lm = train_loss(inst, &tb);
            p->data[j] = orig;
            const double fd = (lp - lm) / ((double)up - (double)dn);
            const double g = p->grad[j];
            const double err = fabs(g - fd), tol = 2e-2 * fmax(fabs(g), fabs(fd)) + 3e-4;
            if (err / tol > worst) worst = err / tol;
            if (err > tol) {
                if (bad < 5) printf("\n  %s %s[%lld]: backward %.7g, finite difference %.7g", activation, p->name,
                                    (long long)j, g, fd);
                bad++;
            }
            checked++;
        }
    }
    CU_ASSERT_EQUAL(checked, 5 * 7 + 7 + 7 * 6 + 6 + 6 * 3 + 3);
    CU_ASSERT_EQUAL(bad, 0);
    (void)worst;
    destroy_module(inst);
}
static void test_gradcheck_relu(void) { gradcheck_case("relu", 11); }
static void test_gradcheck_gelu(void) { gradcheck_case("gelu", 12); }

/* backward ADDS: two calls with dloss 0.5 equal one with dloss 1, and
 * gradients already present are kept. */
/* KILN_KERNELS_HOST_MEMORY: same loss and gradients, no input copy. */
static void test_host_memory_in_place(void) {
    static float grads[2][6][64]; /* tails beyond numel stay 0 */
    double loss[2];
    int copies[2];
    g_table_host = g_table;
    g_table_host.flags = KILN_KERNELS_HOST_MEMORY;
    for (int pass = 0; pass < 2; pass++) {
        cfg c = small_cfg("relu");
        g_create_table = pass ? &g_table_host : NULL;
        kiln_instance *inst = make_module(&c, 21);
        g_create_table = NULL;
        CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
        tbatch tb;
        batch_random(&tb, 4, 5, 3, 23);
        int before = g_copies;
        loss[pass] = train_loss(inst, &tb);
        copies[pass] = g_copies - before;
        CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 1.0), KILN_OK);
        for (uint32_t i = 0; i < 6; i++)
            memcpy(grads[pass][i], kiln_test_param(g_th, i)->grad, (size_t)kiln_test_param(g_th, i)->numel * sizeof(float));
        destroy_module(inst);
    }
    CU_ASSERT_EQUAL(copies[0], 2); /* inputs and targets copied */
    CU_ASSERT_EQUAL(copies[1], 0); /* read in place */
    CU_ASSERT_EQUAL(loss[0], loss[1]);
    CU_ASSERT_EQUAL(memcmp(grads[0], grads[1], sizeof grads[0]), 0);
}

/* The fused entries, ABI 1.6's linear_forward_layout and 1.3's
 * linear_forward, against the 1.2 sequence mlp falls back to (gemm_ex,
 * bias_add_ex, round_to, act_forward, round_to) on the real cpu
 * accelerator: the same loss and gradients bit for bit, in fp32 and with
 * bf16 compute copies of the weights (what bf16-mixed gives the module),
 * and each entry used only when the table has it (1.6's where both are). */
static const kiln_kernels *g_cpu_k;
static int g_n_linear, g_n_layout;
static int32_t count_linear(kiln_instance *acc, uint32_t dt, const void *x, const void *w, uint32_t wt, const void *b,
                            int32_t rows, int32_t in, int32_t out, int32_t act, void *y, void *post, uint32_t rt) {
    g_n_linear++;
    return g_cpu_k->linear_forward(acc, dt, x, w, wt, b, rows, in, out, act, y, post, rt);
}
static int32_t count_layout(kiln_instance *acc, uint32_t dt, const void *x, const void *w, uint32_t wt, int32_t wl,
                            const void *b, int32_t rows, int32_t in, int32_t out, int32_t act, void *y, void *post,
                            uint32_t rt) {
    g_n_layout += wl == KILN_LAYOUT_OUT_IN; /* mlp's layers are nn.Linear's */
    return g_cpu_k->linear_forward_layout(acc, dt, x, w, wt, wl, b, rows, in, out, act, y, post, rt);
}

static void test_linear_forward_vs_1_2(void) {
    const char *dir = getenv("KILN_PLUGIN_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/libkiln-cpu.so", dir ? dir : ".");
    const kiln_plugin_desc *cpu = NULL;
    kiln_test_load(g_th, path, KILN_KIND_ACCELERATOR, "cpu", &cpu);
    CU_ASSERT_PTR_NOT_NULL_FATAL(cpu);
    const kiln_accelerator_ops *aops = cpu->ops;
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL_FATAL(aops->base.create(cpu->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), NULL, &acc), KILN_OK);
    g_cpu_k = aops->kernels(acc);
    CU_ASSERT_FATAL(g_cpu_k->struct_size >= KILN_KERNELS_SIZE_1_3);
    CU_ASSERT_FATAL(g_cpu_k->struct_size >= KILN_KERNELS_SIZE_1_6 && g_cpu_k->linear_forward_layout);
    /* a 1.3-1.5 table, a 1.2 one, the 1.6 one */
    kiln_kernels tables[3] = {*g_cpu_k, *g_cpu_k, *g_cpu_k};
    tables[0].linear_forward = count_linear;
    tables[0].struct_size = KILN_KERNELS_SIZE_1_5;
    tables[1].struct_size = KILN_KERNELS_SIZE_1_2;
    tables[2].linear_forward = count_linear;
    tables[2].linear_forward_layout = count_layout;
    static float grads[3][6][64];
    static uint16_t copies[3][64];
    for (int variant = 0; variant < 4; variant++) {
        const int bf16 = variant >= 2;
        double loss[3];
        int calls[3], layout_calls[3];
        memset(grads, 0, sizeof grads);
        for (int pass = 0; pass < 3; pass++) {
            cfg c = small_cfg(variant & 1 ? "gelu" : "relu");
            g_create_table = &tables[pass];
            g_create_acc = acc;
            kiln_instance *inst = make_module(&c, 31);
            CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
            if (bf16) /* what bf16-mixed's convert_params does */
                for (uint32_t l = 0; l < 3; l++) {
                    kiln_parameter *W = kiln_test_param(g_th, 2 * l);
                    CU_ASSERT_EQUAL(g_cpu_k->cast(acc, copies[l], KILN_DTYPE_BF16, W->data, KILN_DTYPE_F32,
                                                  (size_t)W->numel),
                                    KILN_OK);
                    W->compute = copies[l];
                    W->compute_dtype = KILN_DTYPE_BF16;
                }
            tbatch tb;
            batch_random(&tb, 6, 5, 3, 37);
            g_n_linear = g_n_layout = 0;
            loss[pass] = train_loss(inst, &tb);
            calls[pass] = g_n_linear;
            layout_calls[pass] = g_n_layout;
            CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_OK);
            for (uint32_t i = 0; i < 6; i++)
                memcpy(grads[pass][i], kiln_test_param(g_th, i)->grad, (size_t)kiln_test_param(g_th, i)->numel * sizeof(float));
            destroy_module(inst);
            g_create_table = NULL;
            g_create_acc = NULL;
        }
        CU_ASSERT_EQUAL(calls[0], 3); /* one per Linear */
        CU_ASSERT_EQUAL(calls[1], 0);
        CU_ASSERT_EQUAL(calls[2], 0);
        CU_ASSERT_EQUAL(layout_calls[2], 3);
        CU_ASSERT_EQUAL(layout_calls[0] + layout_calls[1], 0);
        CU_ASSERT_TRUE(isfinite(loss[0]));
        CU_ASSERT_EQUAL(loss[0], loss[1]);
        CU_ASSERT_EQUAL(loss[2], loss[1]);
        CU_ASSERT_EQUAL(memcmp(grads[0], grads[1], sizeof grads[0]), 0);
        CU_ASSERT_EQUAL(memcmp(grads[2], grads[1], sizeof grads[0]), 0);
        if (loss[0] != loss[1] || loss[2] != loss[1])
            printf("\n  variant %d: loss %.17g (1.3) %.17g (1.6) vs %.17g (1.2)", variant, loss[0], loss[2], loss[1]);
    }
    aops->base.destroy(acc);
}

static void test_grad_accumulation(void) {
    cfg c = small_cfg("gelu");
    kiln_instance *inst = make_module(&c, 3);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    tbatch tb;
    batch_random(&tb, 4, 5, 3, 17);
    (void)train_loss(inst, &tb);
    static float full[6][64];
    CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 1.0), KILN_OK);
    for (uint32_t i = 0; i < 6; i++) memcpy(full[i], kiln_test_param(g_th, i)->grad, (size_t)kiln_test_param(g_th, i)->numel * sizeof(float));
    zero_grads();
    CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 0.5), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 0.5), KILN_OK);
    int bad = 0, nonzero = 0;
    for (uint32_t i = 0; i < 6; i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) {
            const double a = full[i][j], b = kiln_test_param(g_th, i)->grad[j];
            nonzero += a != 0.0;
            bad += fabs(a - b) > 1e-6 * fabs(a) + 1e-12;
        }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(nonzero > 100); /* gelu: essentially every gradient is live */
    /* A third call on top of those: grads become 1.5x the single one. */
    CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 0.5), KILN_OK);
    bad = 0;
    for (uint32_t i = 0; i < 6; i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++)
            bad += fabs(1.5 * full[i][j] - kiln_test_param(g_th, i)->grad[j]) > 1e-6 * fabs(full[i][j]) + 1e-12;
    CU_ASSERT_EQUAL(bad, 0);
    destroy_module(inst);
}

static void test_backward_needs_forward(void) {
    cfg c = small_cfg("relu");
    kiln_instance *inst = make_module(&c, 3);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_E_STATE);
    CU_ASSERT(contains(kiln_test_error(g_th), "training_step"));
    destroy_module(inst);
}

static void expect_batch_error(kiln_instance *inst, const kiln_batch *b, const char *a, const char *b2) {
    kiln_step_output out = {sizeof out, 0, 0, 0, 0, 0};
    kiln_test_clear_error(g_th);
    int32_t rc = ops()->training_step(inst, b, 0, &out);
    CU_ASSERT_EQUAL(rc, KILN_E_DATA);
    CU_ASSERT(contains(kiln_test_error(g_th), a));
    if (b2) CU_ASSERT(contains(kiln_test_error(g_th), b2));
    if (!contains(kiln_test_error(g_th), a) || (b2 && !contains(kiln_test_error(g_th), b2)))
        printf("\n  message: %s", kiln_test_error(g_th));
    CU_ASSERT_EQUAL(out.has_loss, 0);
}

static void test_bad_batch(void) {
    cfg c = small_cfg("relu");
    c.max_batch = 8;
    kiln_instance *inst = make_module(&c, 3);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    tbatch tb;

    batch_random(&tb, 4, 6, 3, 1); /* 6 features, layers[0] = 5 */
    expect_batch_error(inst, &tb.b, "5 input features", "got 6");

    batch_random(&tb, 9, 5, 3, 1); /* 9 rows, max_batch = 8 */
    expect_batch_error(inst, &tb.b, "9 rows", "max_batch is 8");

    batch_random(&tb, 4, 5, 3, 1);
    tb.y[2] = 3; /* C = 3 */
    expect_batch_error(inst, &tb.b, "label", "[0, 3)");
    tb.y[2] = -1;
    expect_batch_error(inst, &tb.b, "label", NULL);
    tb.y[2] = 0;

    tb.t[1].dtype = KILN_DTYPE_F32;
    expect_batch_error(inst, &tb.b, "targets", "I32");
    tb.t[1].dtype = KILN_DTYPE_I32;
    tb.t[0].dtype = KILN_DTYPE_F64;
    expect_batch_error(inst, &tb.b, "inputs", "F32");
    tb.t[0].dtype = KILN_DTYPE_F32;
    tb.b.ntensors = 1;
    expect_batch_error(inst, &tb.b, "2 tensors", NULL);
    tb.b.ntensors = 2;

    /* The eval steps check the same way. */
    batch_random(&tb, 9, 5, 3, 1);
    kiln_step_output out = {sizeof out, 0, 0, 0, 0, 0};
    CU_ASSERT_EQUAL(ops()->validation_step(inst, &tb.b, 0, &out), KILN_E_DATA);
    CU_ASSERT(contains(kiln_test_error(g_th), "validation_step"));
    CU_ASSERT_EQUAL(ops()->test_step(inst, &tb.b, 0, &out), KILN_E_DATA);
    CU_ASSERT(contains(kiln_test_error(g_th), "test_step"));

    /* A rejected batch leaves no forward for backward, and a good batch of
     * exactly max_batch rows (fed as (B, 1, 5) images) still works. */
    CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_E_STATE);
    batch_random(&tb, 8, 5, 3, 2);
    tb.t[0].ndim = 3;
    tb.t[0].shape[1] = 1;
    tb.t[0].shape[2] = 5;
    CU_ASSERT(isfinite(train_loss(inst, &tb)));
    CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_OK);
    destroy_module(inst);
}

static void expect_config_error(cfg *c, const char *key) {
    kiln_test_reset(g_th);
    kiln_test_set_accelerator(g_th, TEST_ACC, g_create_table ? g_create_table : &g_table);
    const int allocs = g_allocs, frees = g_frees;
    kiln_instance *inst = (kiln_instance *)&g_acc_token; /* must be reset to NULL */
    int32_t rc = ops()->base.create(g_desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg_build(c), &inst);
    CU_ASSERT_EQUAL(rc, KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(inst);
    CU_ASSERT(contains(kiln_test_error(g_th), key));
    if (!contains(kiln_test_error(g_th), key)) printf("\n  message: %s", kiln_test_error(g_th));
    CU_ASSERT_EQUAL(kiln_test_param_count(g_th), 0);                     /* nothing registered */
    CU_ASSERT_EQUAL(g_allocs - allocs, g_frees - frees); /* nothing leaked     */
    if (rc == KILN_OK && inst) ops()->base.destroy(inst);
}

static void test_bad_config(void) {
    cfg c = small_cfg("relu");
    c.nlayers = 1;
    expect_config_error(&c, "'layers'");
    c = small_cfg("relu");
    c.layers[2] = 0;
    expect_config_error(&c, "'layers'");
    c = small_cfg("tanh");
    expect_config_error(&c, "'activation'");
    CU_ASSERT(contains(kiln_test_error(g_th), "tanh"));
    c = small_cfg("relu");
    c.init = "xavier";
    expect_config_error(&c, "'init'");
    c = small_cfg("relu");
    c.max_batch = 0;
    expect_config_error(&c, "'max_batch'");

    /* No accelerator: create fails cleanly too. */
    kiln_test_reset(g_th);
    c = small_cfg("relu");
    kiln_instance *inst = NULL;
    CU_ASSERT_NOT_EQUAL(ops()->base.create(g_desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg_build(&c), &inst),
                        KILN_OK);
    CU_ASSERT_PTR_NULL(inst);
    CU_ASSERT(contains(kiln_test_error(g_th), "accelerator"));
}

/* The arena is allocated once in create() and freed in destroy(); steps
 * allocate nothing, and every kernel got the accelerator instance back. */
static void test_no_step_allocations(void) {
    cfg c = small_cfg("gelu");
    const int allocs0 = g_allocs, frees0 = g_frees;
    g_bad_acc = 0;
    kiln_instance *inst = make_module(&c, 5);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    CU_ASSERT_EQUAL(g_allocs - allocs0, 1);
    tbatch tb;
    batch_random(&tb, 16, 5, 3, 8);
    for (int i = 0; i < 5; i++) {
        (void)train_loss(inst, &tb);
        CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_OK);
        kiln_step_output out = {sizeof out, 0, 0, 0, 0, 0};
        CU_ASSERT_EQUAL(ops()->validation_step(inst, &tb.b, i, &out), KILN_OK);
    }
    CU_ASSERT_EQUAL(g_allocs - allocs0, 1);
    destroy_module(inst);
    CU_ASSERT_EQUAL(g_frees - frees0, 1);
    CU_ASSERT_EQUAL(g_bad_acc, 0);
}

/* 200 steps of plain SGD (lr 0.1) on three well-separated Gaussian blobs:
 * the loss must fall by more than 5x. */
static void test_learns_toy_problem(void) {
    cfg c = {{4, 16, 3}, 3, "relu", "kaiming_uniform", 64, {{0}}};
    kiln_instance *inst = make_module(&c, 2024);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    tbatch tb;
    const int B = 48, F = 4;
    rng_seed(77);
    for (int r = 0; r < B; r++) {
        const int cls = r % 3;
        tb.y[r] = cls;
        for (int j = 0; j < F; j++) tb.x[r * F + j] = (j == cls ? 2.0f : 0.0f) + rng_uniform(-0.5f, 0.5f);
    }
    batch_wrap(&tb, B, F);
    const double first = train_loss(inst, &tb);
    double last = first;
    for (int step = 0; step < 200; step++) {
        last = train_loss(inst, &tb);
        CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 1.0), KILN_OK);
        for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
            kiln_parameter *p = kiln_test_param(g_th, i);
            for (int64_t j = 0; j < p->numel; j++) p->data[j] -= 0.1f * p->grad[j];
        }
        zero_grads();
    }
    last = train_loss(inst, &tb);
    CU_ASSERT(last < first / 5.0);
    if (!(last < first / 5.0)) printf("\n  loss %.5g -> %.5g", first, last);
    CU_ASSERT(fabs(kiln_test_last_value(g_th, "train_acc") - 1.0) < 1e-12);
    destroy_module(inst);
}

static int suite_clean(void) {
    kiln_test_reset(g_th);
    return 0;
}

static CU_TestInfo cases_mlp[] = {
    {"descriptor and declared config", test_descriptor},
    {"parameter names, shapes, order, flags", test_param_layout},
    {"init_weights is deterministic per seed", test_init_deterministic},
    {"forward matches a double reference (relu)", test_forward_relu},
    {"forward matches a double reference (gelu)", test_forward_gelu},
    {"zero weights give ln(C) and first-class argmax", test_forward_zeros},
    {"backward vs finite differences (relu)", test_gradcheck_relu},
    {"backward vs finite differences (gelu)", test_gradcheck_gelu},
    {"backward accumulates", test_grad_accumulation},
    {"host-memory accelerator: batch read in place", test_host_memory_in_place},
    {"cpu: linear_forward (1.3) and linear_forward_layout (1.6) = the 1.2 sequence, fp32 and bf16", test_linear_forward_vs_1_2},
    {"backward without training_step fails", test_backward_needs_forward},
    {"bad batches are refused with a message", test_bad_batch},
    {"bad configs are refused naming the key", test_bad_config},
    {"no allocation per step", test_no_step_allocations},
    {"SGD learns a separable toy problem", test_learns_toy_problem},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "mlp", .pInitFunc = load_plugin, .pCleanupFunc = suite_clean, .pTests = cases_mlp},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
