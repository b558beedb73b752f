/*
 * test_gpt.c — CUnit suite for the "gpt" module plugin (GPT-2 over
 * kiln/nn.h), loaded through the test host on the real cpu accelerator
 * plugin (the module needs the ABI 1.4 sequence kernels, which only an
 * accelerator provides). It checks the registered parameters against
 * Hugging Face GPT2LMHeadModel's state dict (names, shapes, order, no-decay
 * flags), GPT-2's initialisation statistics, every config and batch refusal
 * with its message, the loss and predict_step's logits against a plain
 * double-precision GPT-2 forward written here, the whole backward pass in
 * float64 against central finite differences for entries of every
 * parameter tensor, gradient accumulation over repeated backward calls,
 * independence from the classifier's chunk size, float32 against float64,
 * float16/bfloat16 compute copies, frozen parameters, the logged metrics,
 * and that no step allocates.
 */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <kiln/nn.h>
#include <kiln/testing.h>

#include "plugin_fixture.h"
#include "test_rng.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */
#define MAX_PARAMS 256         /* more than any config here registers */

#include <CUnit/CUnit.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ plugins */

static const kiln_plugin_desc *g_desc;      /* gpt                              */
static const kiln_plugin_desc *g_cpu_desc;  /* cpu accelerator                  */
static const kiln_accelerator_ops *g_cpu_ops; /* and its ops                    */
static kiln_instance *g_acc;                /* one cpu accelerator for the suite */
static const kiln_kernels *g_cpu;           /* its table                        */
static kiln_kernels g_table;                /* the table the module gets: cpu's,
                                               alloc counted                    */
static int g_allocs;

static const kiln_module_ops *ops(void) { return (const kiln_module_ops *)g_desc->ops; }

static int32_t count_alloc(kiln_instance *acc, size_t bytes, void **out) {
    g_allocs++;
    return g_cpu->alloc(acc, bytes, out);
}

static int load_plugins(void) {
    if (fixture_need_plugin_dir() || fixture_accel_open(g_th, "cpu", "cpu", &g_cpu_desc, &g_cpu_ops, &g_acc, &g_cpu) != 0)
        return -1;
    g_desc = fixture_load_plugin(g_th, "gpt", KILN_KIND_MODULE, "gpt");
    if (!g_desc) return -1;
    g_table = *g_cpu;
    g_table.alloc = count_alloc;
    return 0;
}

/* ------------------------------------------------------------- config */

typedef struct cfg {
    int64_t n_layer, n_head, n_embd, block_size, vocab_size, padded_vocab_size, max_batch, chunk;
    double eps, init_range;
    kiln_kv kv[11];
} cfg;

static const kiln_kv *cfg_build(cfg *c) {
    c->kv[0] = (kiln_kv){"n_layer", KILN_V_INT(c->n_layer)};
    c->kv[1] = (kiln_kv){"n_head", KILN_V_INT(c->n_head)};
    c->kv[2] = (kiln_kv){"n_embd", KILN_V_INT(c->n_embd)};
    c->kv[3] = (kiln_kv){"block_size", KILN_V_INT(c->block_size)};
    c->kv[4] = (kiln_kv){"vocab_size", KILN_V_INT(c->vocab_size)};
    c->kv[5] = (kiln_kv){"padded_vocab_size", KILN_V_INT(c->padded_vocab_size)};
    c->kv[6] = (kiln_kv){"max_batch", KILN_V_INT(c->max_batch)};
    c->kv[7] = (kiln_kv){"classifier_chunk", KILN_V_INT(c->chunk)};
    c->kv[8] = (kiln_kv){"layer_norm_epsilon", KILN_V_FLOAT(c->eps)};
    c->kv[9] = (kiln_kv){"initializer_range", KILN_V_FLOAT(c->init_range)};
    c->kv[10] = (kiln_kv){NULL, KILN_V_NONE};
    return c->kv;
}

/* The tiny model of the gradient check: 2 layers, 2 heads, C = 8, T = 5,
 * V = 11 (logits stride 16), B = 2; the classifier in chunks of 3 rows, so
 * the 10 rows take 4 chunks, the last one partial. */
static cfg tiny_cfg(void) {
    cfg c = {2, 2, 8, 5, 11, 16, 2, 3, 1e-5, 0.02, {{0}}};
    return c;
}

/* ------------------------------------------------------ module set-up */

enum { P_F32 = 0, P_F64 = 1, P_BF16 = 2, P_F16 = 3 }; /* what the precision would set up */

static void *g_compute[MAX_PARAMS]; /* compute copies this file made */

static void free_compute(void) {
    for (int i = 0; i < MAX_PARAMS; i++) {
        free(g_compute[i]);
        g_compute[i] = NULL;
    }
}

static size_t esz_of(const kiln_parameter *p) { return kiln_dtype_size(kiln_param_dtype(p)); }

/* Masters in fp32 or fp64, like the host allocates them (zeroed, aligned). */
static int alloc_params(int f64) {
    if (!f64) return kiln_test_alloc_params(g_th);
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        kiln_parameter *p = kiln_test_param(g_th, i);
        size_t bytes = ((size_t)p->numel * sizeof(double) + 63) & ~(size_t)63;
        if (posix_memalign((void **)&p->data, 64, bytes) || posix_memalign((void **)&p->grad, 64, bytes)) return -1;
        memset(p->data, 0, bytes);
        memset(p->grad, 0, bytes);
        p->param_dtype = KILN_DTYPE_F64;
        p->compute_dtype = KILN_DTYPE_F64;
        p->compute = p->data;
    }
    return 0;
}

/* What 16-mixed / bf16-mixed's convert_params does: a copy of every matrix
 * in the reduced dtype (vectors compute from their masters). */
static void convert_params(int prec) {
    if (prec != P_BF16 && prec != P_F16) return;
    const uint32_t dt = prec == P_BF16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F16;
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        kiln_parameter *p = kiln_test_param(g_th, i);
        if (p->ndim < 2) continue;
        if (!g_compute[i]) g_compute[i] = malloc((size_t)p->numel * 2);
        CU_ASSERT_EQUAL(g_cpu->cast(g_acc, g_compute[i], dt, p->data, KILN_DTYPE_F32, (size_t)p->numel), KILN_OK);
        p->compute = g_compute[i];
        p->compute_dtype = dt;
    }
}

/* Fresh test host + gpt instance; parameters allocated and initialised. */
static kiln_instance *make_module(cfg *c, uint64_t seed, int prec) {
    free_compute();
    kiln_test_reset(g_th);
    kiln_test_set_accelerator(g_th, g_acc, &g_table);
    kiln_instance *inst = fixture_create_checked(g_desc, g_th, cfg_build(c));
    if (!inst) return NULL;
    CU_ASSERT_EQUAL_FATAL(alloc_params(prec == P_F64), 0);
    const int32_t rc = ops()->init_weights(inst, seed);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    if (rc != KILN_OK) printf("\n  init_weights failed: %s", kiln_test_error(g_th));
    convert_params(prec);
    return inst;
}

/* make_module that must succeed (fatal: the case uses the module). */
static kiln_instance *make_ok(cfg *c, uint64_t seed, int prec) {
    kiln_instance *inst = make_module(c, seed, prec);
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    return inst;
}

static void destroy_module(kiln_instance *inst) {
    if (inst) ops()->base.destroy(inst);
    free_compute();
}

/* Create with config c; the status, and kiln_test_error(g_th) holds the message. */
static int32_t try_create(cfg *c) {
    kiln_test_reset(g_th);
    kiln_test_set_accelerator(g_th, g_acc, &g_table);
    kiln_instance *inst = NULL;
    int32_t rc = ops()->base.create(g_desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg_build(c), &inst);
    if (rc == KILN_OK) ops()->base.destroy(inst);
    CU_ASSERT_PTR_NULL(rc == KILN_OK ? NULL : inst);
    return rc;
}

/* ------------------------------------------------------------ batches */

/* A zeroed step output whose struct_size is this build's (the struct grows
 * with the ABI). */
static kiln_step_output step_output(void) {
    kiln_step_output o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    return o;
}

typedef struct tbatch {
    int32_t x[4096];  /* (B, T) inputs  */
    int32_t y[4096];  /* (B, T) targets */
    kiln_tensor t[2];
    kiln_batch b;
} tbatch;

static void batch_wrap(tbatch *tb, int B, int T) {
    tb->t[0] = (kiln_tensor){tb->x, KILN_DTYPE_I32, 2, {B, T, 1, 1}};
    tb->t[1] = (kiln_tensor){tb->y, KILN_DTYPE_I32, 2, {B, T, 1, 1}};
    tb->b = (kiln_batch){sizeof(kiln_batch), 2, tb->t, B};
}

static uint64_t rng_state = 1;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* Random tokens; targets the next token, with every 4th position ignored. */
static void batch_random(tbatch *tb, int B, int T, int V, uint64_t seed) {
    rng_state = seed | 1;
    for (int i = 0; i < B * T; i++) tb->x[i] = (int32_t)(rng_u32() % (uint32_t)V);
    for (int i = 0; i < B * T; i++) tb->y[i] = i % 4 == 3 ? -1 : (int32_t)(rng_u32() % (uint32_t)V);
    batch_wrap(tb, B, T);
}

static double train_loss(kiln_instance *inst, const tbatch *tb) {
    kiln_step_output out = step_output();
    int32_t rc = ops()->training_step(inst, &tb->b, 0, &out);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    if (rc != KILN_OK) printf("\n  training_step failed: %s", kiln_test_error(g_th));
    CU_ASSERT_EQUAL(out.has_loss, 1);
    return out.loss;
}

/* ------------------------------------------------------ param access */

static double pget(const kiln_parameter *p, int64_t i) {
    return kiln_param_dtype(p) == KILN_DTYPE_F64 ? ((const double *)p->data)[i] : (double)p->data[i];
}
static void pset(kiln_parameter *p, int64_t i, double v) {
    if (kiln_param_dtype(p) == KILN_DTYPE_F64)
        ((double *)p->data)[i] = v;
    else
        p->data[i] = (float)v;
}
static double gget(const kiln_parameter *p, int64_t i) {
    return kiln_param_dtype(p) == KILN_DTYPE_F64 ? ((const double *)p->grad)[i] : (double)p->grad[i];
}
static void zero_grads(void) {
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) memset(kiln_test_param(g_th, i)->grad, 0, (size_t)kiln_test_param(g_th, i)->numel * esz_of(kiln_test_param(g_th, i)));
}
static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* --------------------------------- a plain double-precision GPT-2 forward */

static double ref_gelu(double x) {
    const double k = 0.79788456080286535588; /* sqrt(2/pi) */
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

/* y(N, C) = layernorm(x) with parameter pair (w, b). */
static void ref_ln(double *y, const double *x, int N, int C, const kiln_parameter *w, const kiln_parameter *b,
                   double eps) {
    for (int r = 0; r < N; r++) {
        double m = 0, v = 0;
        for (int j = 0; j < C; j++) m += x[r * C + j];
        m /= C;
        for (int j = 0; j < C; j++) v += (x[r * C + j] - m) * (x[r * C + j] - m);
        v /= C;
        const double rs = 1.0 / sqrt(v + eps);
        for (int j = 0; j < C; j++) y[r * C + j] = (x[r * C + j] - m) * rs * pget(w, j) + pget(b, j);
    }
}

/* y(N, out) = x(N, in) . W(in, out) + b (Conv1D). */
static void ref_conv1d(double *y, const double *x, int N, int in, int out, const kiln_parameter *W,
                       const kiln_parameter *b) {
    for (int r = 0; r < N; r++)
        for (int o = 0; o < out; o++) {
            double s = pget(b, o);
            for (int i = 0; i < in; i++) s += x[r * in + i] * pget(W, (int64_t)i * out + o);
            y[r * out + o] = s;
        }
}

/* The mean loss of the registered parameters on (B, T) tokens and targets;
 * `last_logits` (V) gets the logits of the last position of sequence B-1. */
static double ref_forward(const cfg *c, const int32_t *x, const int32_t *y, int B, int T, double *last_logits) {
    const int C = (int)c->n_embd, NH = (int)c->n_head, D = C / NH, V = (int)c->vocab_size, N = B * T;
    kiln_parameter *const *P = kiln_test_params(g_th);
    double *h = calloc((size_t)N * C, sizeof *h), *ln = calloc((size_t)N * C, sizeof *ln);
    double *qkv = calloc((size_t)N * 3 * C, sizeof *qkv), *att = calloc((size_t)N * C, sizeof *att);
    double *t = calloc((size_t)N * 4 * C, sizeof *t), *o = calloc((size_t)N * C, sizeof *o);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < C; j++) h[r * C + j] = pget(P[0], (int64_t)x[r] * C + j) + pget(P[1], (r % T) * C + j);
    for (int l = 0; l < c->n_layer; l++) {
        kiln_parameter *const *L = &P[2 + 12 * l];
        ref_ln(ln, h, N, C, L[0], L[1], c->eps);
        ref_conv1d(qkv, ln, N, C, 3 * C, L[2], L[3]);
        for (int b = 0; b < B; b++)
            for (int hd = 0; hd < NH; hd++)
                for (int i = 0; i < T; i++) {
                    const double *q = &qkv[(b * T + i) * 3 * C + hd * D];
                    double s[64], mx = -INFINITY, z = 0;
                    for (int j = 0; j <= i; j++) {
                        const double *k = &qkv[(b * T + j) * 3 * C + C + hd * D];
                        double d = 0;
                        for (int e = 0; e < D; e++) d += q[e] * k[e];
                        s[j] = d / sqrt((double)D);
                        if (s[j] > mx) mx = s[j];
                    }
                    for (int j = 0; j <= i; j++) z += (s[j] = exp(s[j] - mx));
                    for (int e = 0; e < D; e++) {
                        double a = 0;
                        for (int j = 0; j <= i; j++) a += s[j] / z * qkv[(b * T + j) * 3 * C + 2 * C + hd * D + e];
                        att[(b * T + i) * C + hd * D + e] = a;
                    }
                }
        ref_conv1d(o, att, N, C, C, L[4], L[5]);
        for (int i = 0; i < N * C; i++) h[i] += o[i];
        ref_ln(ln, h, N, C, L[6], L[7], c->eps);
        ref_conv1d(t, ln, N, C, 4 * C, L[8], L[9]);
        for (int i = 0; i < N * 4 * C; i++) t[i] = ref_gelu(t[i]);
        ref_conv1d(o, t, N, 4 * C, C, L[10], L[11]);
        for (int i = 0; i < N * C; i++) h[i] += o[i];
    }
    const int lf = 2 + 12 * (int)c->n_layer;
    ref_ln(ln, h, N, C, P[lf], P[lf + 1], c->eps);
    double total = 0;
    int valid = 0;
    double *logit = calloc((size_t)V, sizeof *logit);
    for (int r = 0; r < N; r++) {
        double mx = -INFINITY, z = 0;
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int j = 0; j < C; j++) s += ln[r * C + j] * pget(P[0], (int64_t)v * C + j);
            logit[v] = s;
            if (s > mx) mx = s;
        }
        if (r == N - 1 && last_logits) memcpy(last_logits, logit, (size_t)V * sizeof *logit);
        if (!y || y[r] < 0) continue;
        for (int v = 0; v < V; v++) z += exp(logit[v] - mx);
        total += log(z) + mx - logit[y[r]];
        valid++;
    }
    free(logit);
    free(h), free(ln), free(qkv), free(att), free(t), free(o);
    return valid ? total / valid : 0.0;
}

/* ----------------------------------------------------------------- tests */

static void test_descriptor(void) {
    CU_ASSERT_EQUAL(g_desc->kind, KILN_KIND_MODULE);
    CU_ASSERT_STRING_EQUAL(g_desc->name, "gpt");
    CU_ASSERT(ops()->base.struct_size >= KILN_MODULE_OPS_SIZE_1_4);
    CU_ASSERT_PTR_NOT_NULL(ops()->predict_step);
    const struct { const char *key; int64_t def; } want[] = {
        {"n_layer", 12}, {"n_head", 12}, {"n_embd", 768}, {"block_size", 1024}, {"vocab_size", 50257},
        {"padded_vocab_size", 0}, {"max_batch", 8}, {"classifier_chunk", 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kiln_param *p = g_desc->params;
        while (p->key && strcmp(p->key, want[i].key)) p++;
        CU_ASSERT_PTR_NOT_NULL(p->key);
        if (p->key) CU_ASSERT_EQUAL(p->def.v.i, want[i].def);
    }
    const kiln_value *pd = kiln_kv_find(g_desc->properties, "param_dtypes");
    CU_ASSERT_PTR_NOT_NULL_FATAL(pd);
    CU_ASSERT_EQUAL(pd->count, 2);
}

/* Hugging Face GPT2LMHeadModel.state_dict() order, names and shapes. */
static void test_param_layout(void) {
    cfg c = tiny_cfg();
    kiln_instance *inst = make_ok(&c, 1, P_F32);
    const int C = 8, L = 2;
    CU_ASSERT_EQUAL_FATAL(kiln_test_param_count(g_th), 2 + 12 * L + 2);
    struct { char name[64]; int64_t s0, s1; int nodecay; } want[64];
    int n = 0;
#define W(nm, a, b, nd) (snprintf(want[n].name, 64, "%s", nm), want[n].s0 = a, want[n].s1 = b, want[n++].nodecay = nd)
    W("transformer.wte.weight", 11, C, 0);
    W("transformer.wpe.weight", 5, C, 0);
    for (int l = 0; l < L; l++) {
        char p[64];
        const char *leaf[12] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
        const int64_t s0[12] = {C, C, C, 3 * C, C, C, C, C, C, 4 * C, 4 * C, C};
        const int64_t s1[12] = {0, 0, 3 * C, 0, C, 0, 0, 0, 4 * C, 0, C, 0};
        for (int j = 0; j < 12; j++) {
            snprintf(p, sizeof p, "transformer.h.%d.%s", l, leaf[j]);
            W(p, s0[j], s1[j], s1[j] == 0);
        }
    }
    W("transformer.ln_f.weight", C, 0, 1);
    W("transformer.ln_f.bias", C, 0, 1);
#undef W
    for (int i = 0; i < n; i++) {
        const kiln_parameter *p = kiln_test_param(g_th, i);
        CU_ASSERT_STRING_EQUAL(p->name, want[i].name);
        CU_ASSERT_EQUAL(p->ndim, want[i].s1 ? 2u : 1u);
        CU_ASSERT_EQUAL(p->shape[0], want[i].s0);
        if (want[i].s1) CU_ASSERT_EQUAL(p->shape[1], want[i].s1);
        CU_ASSERT_EQUAL((p->flags & KILN_PARAMF_NO_DECAY) != 0, want[i].nodecay);
    }
    destroy_module(inst);
}

/* normal(0, 0.02); residual projections 0.02 / sqrt(2 n_layer); biases 0;
 * LayerNorm weights 1; the same seed gives the same bits. */
static void test_init(void) {
    cfg c = {3, 4, 64, 64, 500, 0, 1, 64, 1e-5, 0.02, {{0}}};
    kiln_instance *inst = make_ok(&c, 7, P_F32);
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        const kiln_parameter *p = kiln_test_param(g_th, i);
        double s = 0, ss = 0, mx = 0;
        for (int64_t j = 0; j < p->numel; j++) {
            s += p->data[j];
            ss += (double)p->data[j] * p->data[j];
            if (fabs(p->data[j]) > mx) mx = fabs(p->data[j]);
        }
        const double mean = s / (double)p->numel, sd = sqrt(ss / (double)p->numel - mean * mean);
        if (p->ndim == 2) {
            const double want = contains(p->name, "c_proj.weight") ? 0.02 / sqrt(6.0) : 0.02;
            CU_ASSERT(fabs(sd - want) < 0.06 * want);
            CU_ASSERT(fabs(mean) < 0.1 * want);
            CU_ASSERT(mx < 6.5 * want && mx > 2.5 * want);
            if (!(fabs(sd - want) < 0.06 * want)) printf("\n  %s: std %g, want %g", p->name, sd, want);
        } else if (contains(p->name, "ln_") && contains(p->name, ".weight")) {
            CU_ASSERT(mean == 1.0 && sd == 0.0);
        } else {
            CU_ASSERT(mx == 0.0);
        }
    }
    /* same seed, same bits; another seed, other bits */
    float *saved = malloc((size_t)kiln_test_param(g_th, 0)->numel * sizeof *saved);
    memcpy(saved, kiln_test_param(g_th, 0)->data, (size_t)kiln_test_param(g_th, 0)->numel * sizeof *saved);
    CU_ASSERT_EQUAL(ops()->init_weights(inst, 7), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(saved, kiln_test_param(g_th, 0)->data, (size_t)kiln_test_param(g_th, 0)->numel * sizeof *saved), 0);
    CU_ASSERT_EQUAL(ops()->init_weights(inst, 8), KILN_OK);
    CU_ASSERT_NOT_EQUAL(memcmp(saved, kiln_test_param(g_th, 0)->data, (size_t)kiln_test_param(g_th, 0)->numel * sizeof *saved), 0);
    free(saved);
    destroy_module(inst);
}

static void expect_config_refusal(cfg *c, const char *a, const char *b) {
    CU_ASSERT_EQUAL(try_create(c), KILN_E_CONFIG);
    CU_ASSERT(contains(kiln_test_error(g_th), a));
    if (b) CU_ASSERT(contains(kiln_test_error(g_th), b));
    CU_ASSERT_PTR_NULL(strchr(kiln_test_error(g_th), '\n'));
    if (!contains(kiln_test_error(g_th), a) || (b && !contains(kiln_test_error(g_th), b))) printf("\n  message: %s", kiln_test_error(g_th));
    CU_ASSERT_EQUAL(kiln_test_param_count(g_th), 0); /* refused before any registration */
}

/* classifier_chunk = 0 (the default) picks the rows per classifier chunk
 * from where the accelerator's memory is: 256 on a host-memory table, and
 * on a device-memory one the fewest equal chunks whose logits (4 bytes a
 * value) stay within 1 GiB, so that a GPU does not stream wte and the
 * float32 dwte once per 256 rows. Never more than a forward's rows; an
 * explicit value is kept. The create line says which. */
static int chunk_of(cfg *c, int host_memory) {
    const uint32_t saved = g_table.flags;
    g_table.flags = host_memory ? saved | KILN_KERNELS_HOST_MEMORY : saved & ~KILN_KERNELS_HOST_MEMORY;
    const int32_t rc = try_create(c);
    g_table.flags = saved;
    CU_ASSERT_EQUAL(rc, KILN_OK);
    const char *line = kiln_test_log_find(g_th, KILN_LOG_INFO, "classifier chunks of ");
    CU_ASSERT_PTR_NOT_NULL_FATAL(line);
    return atoi(strstr(line, "classifier chunks of ") + strlen("classifier chunks of "));
}

static void test_auto_chunk(void) {
    /* 1024 x 8 = 8,192 rows of 50,304 logits: 1.65 GB at 4 bytes, so two chunks */
    cfg c = {1, 1, 8, 8, 50257, 0, 1024, 0, 1e-5, 0.02, {{0}}};
    CU_ASSERT_EQUAL(chunk_of(&c, 1), 256);
    CU_ASSERT_EQUAL(chunk_of(&c, 0), 4096);
    c.max_batch = 1200; /* 9,600 rows: two chunks of 4,800 */
    CU_ASSERT_EQUAL(chunk_of(&c, 0), 4800);
    c.max_batch = 8; /* 64 rows: one chunk, on either table */
    CU_ASSERT_EQUAL(chunk_of(&c, 0), 64);
    CU_ASSERT_EQUAL(chunk_of(&c, 1), 64);
    c.max_batch = 1024;
    c.chunk = 1000; /* an explicit value is kept */
    CU_ASSERT_EQUAL(chunk_of(&c, 0), 1000);
    CU_ASSERT_EQUAL(chunk_of(&c, 1), 1000);
}

static void test_bad_config(void) {
    cfg c = tiny_cfg();
    c.n_embd = 10; /* 10 % 4 != 0 */
    c.n_head = 4;
    expect_config_refusal(&c, "n_embd (10)", "n_head (4)");
    c = tiny_cfg();
    c.padded_vocab_size = 10;
    expect_config_refusal(&c, "padded_vocab_size", "vocab_size (11)");
    const char *keys[] = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size", "max_batch"};
    for (int i = 0; i < 6; i++)
        for (int v = -1; v <= 0; v++) {
            c = tiny_cfg();
            int64_t *f[] = {&c.n_layer, &c.n_head, &c.n_embd, &c.block_size, &c.vocab_size, &c.max_batch};
            *f[i] = v;
            expect_config_refusal(&c, keys[i], "must be in [1,");
        }
    c = tiny_cfg();
    c.chunk = -1; /* 0 is automatic */
    expect_config_refusal(&c, "classifier_chunk", "must be in [0,");
    c = tiny_cfg();
    c.eps = 0.0;
    expect_config_refusal(&c, "layer_norm_epsilon", NULL);
    /* padded_vocab_size 0 is vocab_size rounded up to 64: accepted */
    c = tiny_cfg();
    c.padded_vocab_size = 0;
    CU_ASSERT_EQUAL(try_create(&c), KILN_OK);
}

/* A kernel table older than 1.4 is refused in one line at create(). */
static void test_old_kernel_table(void) {
    kiln_kernels old = *g_cpu;
    old.struct_size = KILN_KERNELS_SIZE_1_3;
    kiln_test_reset(g_th);
    kiln_test_set_accelerator(g_th, g_acc, &old);
    cfg c = tiny_cfg();
    kiln_instance *inst = NULL;
    CU_ASSERT_EQUAL(ops()->base.create(g_desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg_build(&c), &inst),
                    KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NULL(inst);
    CU_ASSERT(contains(kiln_test_error(g_th), "1.4"));
    CU_ASSERT_PTR_NULL(strchr(kiln_test_error(g_th), '\n'));
}

static void expect_batch_refusal(kiln_instance *inst, const kiln_batch *b, const char *a, const char *b2) {
    kiln_step_output out = step_output();
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->training_step(inst, b, 0, &out), KILN_E_DATA);
    CU_ASSERT(contains(kiln_test_error(g_th), "gpt: training_step"));
    CU_ASSERT(contains(kiln_test_error(g_th), a));
    if (b2) CU_ASSERT(contains(kiln_test_error(g_th), b2));
    if (!contains(kiln_test_error(g_th), a) || (b2 && !contains(kiln_test_error(g_th), b2))) printf("\n  message: %s", kiln_test_error(g_th));
    CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_E_STATE); /* nothing to differentiate */
}

static void test_bad_batch(void) {
    cfg c = tiny_cfg();
    kiln_instance *inst = make_ok(&c, 3, P_F32);
    tbatch tb;
    batch_random(&tb, 2, 6, 11, 1); /* T = 6 > block_size = 5 */
    expect_batch_refusal(inst, &tb.b, "T = 6", "block_size = 5");
    batch_random(&tb, 3, 5, 11, 1); /* B = 3 > max_batch = 2 */
    expect_batch_refusal(inst, &tb.b, "batch of 3", "max_batch is 2");
    /* one change each to a good batch */
    enum { X, Y, DTYPE0, NDIM1, SHAPE1_1, NTENSORS, SIZE };
    static const struct {
        int what, at, value;
        const char *a, *b;
    } bad[] = {
        {X, 7, 11, "inputs[1][2] = 11", "vocab_size is 11"},
        {X, 0, -3, "inputs[0][0] = -3", "vocab_size"},
        {Y, 9, 12, "targets[1][4] = 12", "vocab_size = 11"},
        {Y, 1, -2, "targets[0][1] = -2", NULL},
        {DTYPE0, 0, KILN_DTYPE_F32, "inputs as an int32 tensor (B, T)", "float32"},
        {NDIM1, 0, 1, "targets as an int32 tensor (B, T)", "1 dims"},
        {SHAPE1_1, 0, 4, "T = 5", "targets have 4"},
        {NTENSORS, 0, 1, "2 tensors", NULL},
        {SIZE, 0, 0, "empty batch", NULL},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        batch_random(&tb, 2, 5, 11, 1);
        switch (bad[k].what) {
        case X: tb.x[bad[k].at] = bad[k].value; break;
        case Y: tb.y[bad[k].at] = bad[k].value; break;
        case DTYPE0: tb.t[0].dtype = (uint32_t)bad[k].value; break;
        case NDIM1: tb.t[1].ndim = (uint32_t)bad[k].value; break;
        case SHAPE1_1: tb.t[1].shape[1] = bad[k].value; break;
        case NTENSORS: tb.b.ntensors = (uint32_t)bad[k].value; break;
        default: tb.b.size = bad[k].value; break;
        }
        expect_batch_refusal(inst, &tb.b, bad[k].a, bad[k].b);
    }
    /* a good batch still works afterwards */
    batch_random(&tb, 2, 5, 11, 1);
    CU_ASSERT(isfinite(train_loss(inst, &tb)));
    destroy_module(inst);
}

/* Loss and predict_step against the double reference, in fp64 (tight) and
 * fp32 (float tolerance). */
static void check_vs_reference(int prec, double tol) {
    cfg c = tiny_cfg();
    kiln_instance *inst = make_ok(&c, 11, prec);
    tbatch tb;
    batch_random(&tb, 2, 5, 11, 5);
    double ref_last[11];
    const double ref = ref_forward(&c, tb.x, tb.y, 2, 5, ref_last);
    const double loss = train_loss(inst, &tb);
    CU_ASSERT(fabs(loss - ref) <= tol * fabs(ref));
    if (!(fabs(loss - ref) <= tol * fabs(ref))) printf("\n  loss %.17g, reference %.17g", loss, ref);
    CU_ASSERT(fabs(ref - log(11.0)) < 0.1); /* small init: close to uniform */
    /* predict on the last sequence gives its last position's logits */
    kiln_tensor tok = {tb.x + 5, KILN_DTYPE_I32, 2, {1, 5, 1, 1}}, out;
    kiln_batch pb = {sizeof pb, 1, &tok, 1};
    memset(&out, 0, sizeof out);
    int32_t rc = ops()->predict_step(inst, &pb, &out);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(out.dtype, KILN_DTYPE_F32);
    CU_ASSERT_EQUAL(out.ndim, 2);
    CU_ASSERT_EQUAL(out.shape[0], 1);
    CU_ASSERT_EQUAL(out.shape[1], 11);
    const float *lg = out.data;
    double worst = 0, scale = 0;
    for (int v = 0; v < 11; v++) {
        worst = fmax(worst, fabs(lg[v] - ref_last[v]));
        scale = fmax(scale, fabs(ref_last[v]));
    }
    CU_ASSERT(worst <= fmax(tol, 2e-7) * scale + 1e-7); /* predict's logits are float32 */
    if (!(worst <= fmax(tol, 2e-7) * scale + 1e-7)) printf("\n  predict: max |diff| %g (scale %g)", worst, scale);
    /* longer than block_size: the last block_size tokens */
    int32_t longer[8] = {3, 1, 4, tb.x[5], tb.x[6], tb.x[7], tb.x[8], tb.x[9]};
    kiln_tensor tok2 = {longer, KILN_DTYPE_I32, 2, {1, 8, 1, 1}}, out2;
    kiln_batch pb2 = {sizeof pb2, 1, &tok2, 1};
    float first[11];
    memcpy(first, lg, sizeof first);
    CU_ASSERT_EQUAL_FATAL(ops()->predict_step(inst, &pb2, &out2), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(first, out2.data, sizeof first), 0);
    /* predict overwrote the activations: no backward */
    CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_E_STATE);
    destroy_module(inst);
}

static void test_forward_f64(void) { check_vs_reference(P_F64, 1e-12); }
static void test_forward_f32(void) { check_vs_reference(P_F32, 2e-6); }

/* The central-difference check of every parameter tensor in fp64. */
static void test_gradcheck_f64(void) {
    cfg c = tiny_cfg();
    kiln_instance *inst = make_ok(&c, 21, P_F64);
    /* Larger weights than GPT-2's init, so every path carries signal:
     * attention far from uniform, LayerNorm affine parts away from 1/0. */
    rng_state = 99;
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) {
            const double u = (double)rng_u32() / 4294967296.0 - 0.5;
            const int is_ln_w = contains(kiln_test_param(g_th, i)->name, "ln_") && contains(kiln_test_param(g_th, i)->name, "weight");
            pset(kiln_test_param(g_th, i), j, is_ln_w ? 1.0 + 0.6 * u : 0.8 * u);
        }
    tbatch tb;
    batch_random(&tb, 2, 5, 11, 9);
    (void)train_loss(inst, &tb);
    zero_grads();
    CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 1.0), KILN_OK);
    const double h = 1e-5;
    double worst = 0;
    const char *worst_name = "";
    int checked = 0, bad = 0;
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        kiln_parameter *p = kiln_test_param(g_th, i);
        /* up to 7 entries of each tensor, spread over it */
        const int64_t n = p->numel, K = n < 7 ? n : 7;
        double tensor_worst = 0, gmax = 0;
        for (int64_t s = 0; s < K; s++) {
            const int64_t j = (s * 7919 + (int64_t)i * 31) % n;
            const double v = pget(p, j);
            pset(p, j, v + h);
            const double lp = train_loss(inst, &tb);
            pset(p, j, v - h);
            const double lm = train_loss(inst, &tb);
            pset(p, j, v);
            const double num = (lp - lm) / (2 * h), an = gget(p, j);
            const double err = fabs(num - an) / fmax(1e-4, fabs(num) + fabs(an));
            tensor_worst = fmax(tensor_worst, err);
            gmax = fmax(gmax, fabs(an));
            bad += err > 1e-6;
            checked++;
        }
        if (tensor_worst > worst) worst_name = p->name;
        worst = fmax(worst, tensor_worst);
        if (tensor_worst > 1e-6) printf("\n  %s: worst relative error %.3g", p->name, tensor_worst);
        /* every tensor really gets a gradient (wpe rows >= T do not) */
        CU_ASSERT(gmax > 0.0 || contains(p->name, "wpe"));
    }
    printf("\n  gradcheck fp64: %d entries of %u tensors, worst relative error %.3g (%s)", checked, kiln_test_param_count(g_th), worst,
           worst_name);
    CU_ASSERT_EQUAL(bad, 0);
    destroy_module(inst);
}

/* The tiny config's module (make_ok) and a random batch of 2 x 5 tokens
 * (vocabulary 11) from batch_seed into tb. */
static kiln_instance *tiny_module(uint64_t seed, int prec, tbatch *tb, uint64_t batch_seed) {
    cfg c = tiny_cfg();
    kiln_instance *inst = make_ok(&c, seed, prec);
    batch_random(tb, 2, 5, 11, batch_seed);
    return inst;
}

/* backward adds: two calls give twice one; dloss scales linearly (up to
 * float32 rounding: a bias gradient is summed into the grad row by row, so
 * the error is relative to the tensor's gradients, not to one entry, which
 * may be a small difference of large row terms). */
static double grad_tol(const float *g, int64_t n) {
    double m = 0.0;
    for (int64_t j = 0; j < n; j++) m = fmax(m, fabs(g[j]));
    return 1e-5 * m + 1e-10;
}

/* The entries whose gradient is not k times one's within tol_scale times
 * grad_tol of the tensor; the first five are printed. */
static int grads_off(float *const *one, double k, double tol_scale) {
    int bad = 0;
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        const kiln_parameter *p = kiln_test_param(g_th, i);
        const double tol = tol_scale * grad_tol(one[i], p->numel);
        for (int64_t j = 0; j < p->numel; j++)
            if (fabs(p->grad[j] - k * one[i][j]) > tol) {
                if (bad < 5) printf("\n  %s[%lld]: %.9g, want %g * %.9g", p->name, (long long)j, p->grad[j], k, one[i][j]);
                bad++;
            }
    }
    return bad;
}

static void test_backward_accumulates(void) {
    tbatch tb;
    kiln_instance *inst = tiny_module(5, P_F32, &tb, 2);
    (void)train_loss(inst, &tb);
    CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 1.0), KILN_OK);
    float **one = calloc(kiln_test_param_count(g_th), sizeof *one);
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        one[i] = malloc((size_t)kiln_test_param(g_th, i)->numel * sizeof(float));
        memcpy(one[i], kiln_test_param(g_th, i)->grad, (size_t)kiln_test_param(g_th, i)->numel * sizeof(float));
    }
    CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 1.0), KILN_OK);
    int nonzero = 0;
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) nonzero += one[i][j] != 0.0f;
    CU_ASSERT_EQUAL(grads_off(one, 2.0, 1.0), 0);
    CU_ASSERT(nonzero > 1000);
    zero_grads();
    CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 0.25), KILN_OK);
    CU_ASSERT_EQUAL(grads_off(one, 0.25, 0.25), 0);
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) free(one[i]);
    free(one);
    destroy_module(inst);
}

/* The classifier's chunk size changes nothing but the summation order. */
static void test_chunks(void) {
    double loss[2];
    float *grads[2] = {NULL, NULL};
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        cfg c = tiny_cfg();
        c.chunk = pass ? 1000 : 3; /* 1000 is clamped to the 10 rows */
        kiln_instance *inst = make_ok(&c, 17, P_F32);
        tbatch tb;
        batch_random(&tb, 2, 5, 11, 4);
        loss[pass] = train_loss(inst, &tb);
        CU_ASSERT_EQUAL_FATAL(ops()->backward(inst, 1.0), KILN_OK);
        total = 0;
        for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) total += (size_t)kiln_test_param(g_th, i)->numel;
        grads[pass] = malloc(total * sizeof(float));
        size_t off = 0;
        for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
            memcpy(grads[pass] + off, kiln_test_param(g_th, i)->grad, (size_t)kiln_test_param(g_th, i)->numel * sizeof(float));
            off += (size_t)kiln_test_param(g_th, i)->numel;
        }
        destroy_module(inst);
    }
    CU_ASSERT(fabs(loss[0] - loss[1]) < 1e-6 * fabs(loss[0]));
    int bad = 0;
    for (size_t j = 0; j < total; j++) bad += fabs(grads[0][j] - grads[1][j]) > 1e-5 * fabs(grads[1][j]) + 1e-9;
    CU_ASSERT_EQUAL(bad, 0);
    free(grads[0]);
    free(grads[1]);
}

/* 32-true and 64-true start from the same weights and agree to ~1e-6;
 * bf16 and f16 compute copies give a loss close to fp32's and finite
 * gradients. */
static void test_precisions(void) {
    const int precs[4] = {P_F32, P_F64, P_BF16, P_F16};
    double loss[4];
    for (int k = 0; k < 4; k++) {
        cfg c = {2, 2, 16, 8, 37, 0, 2, 5, 1e-5, 0.02, {{0}}};
        kiln_instance *inst = make_ok(&c, 23, precs[k]);
        tbatch tb;
        batch_random(&tb, 2, 8, 37, 8);
        loss[k] = train_loss(inst, &tb);
        CU_ASSERT_EQUAL(ops()->backward(inst, 1024.0), KILN_OK);
        int finite = 1;
        for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
            for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) finite &= isfinite(gget(kiln_test_param(g_th, i), j));
        CU_ASSERT(finite);
        destroy_module(inst);
    }
    printf("\n  loss fp32 %.9g fp64 %.9g bf16 %.9g fp16 %.9g", loss[0], loss[1], loss[2], loss[3]);
    CU_ASSERT(fabs(loss[0] - loss[1]) < 1e-6 * loss[1]);
    CU_ASSERT(fabs(loss[2] - loss[0]) < 1e-2 * loss[0]);
    CU_ASSERT(fabs(loss[3] - loss[0]) < 2e-3 * loss[0]);
    CU_ASSERT(loss[2] != loss[0]); /* the rounding really happened */
    CU_ASSERT(loss[3] != loss[0]);
}

/* ABI 1.6 changes no result. On a 1.6 table, bf16-mixed keeps the
 * classifier's logits (and their gradient) in bfloat16
 * (KILN_KERNELS_STORE_16BIT), the Conv1D layers run through
 * linear_forward_layout and each Linear's backward reads one 16-bit copy
 * of its output gradient; on a 1.5-sized table without the bit, float32
 * logits, the unfused Conv1D sequence and dy converted by each product. The losses and every gradient
 * are the same bit for bit. 16-mixed keeps float32 logits (its unit-scale
 * gradient would underflow in fp16). Spies record the logits' dtype and
 * the Conv1D calls. */
static uint32_t g_xent_dtype, g_ln_dtype;
static int g_conv1d_calls, g_casts16, g_round_bias;

/* kiln/nn.h casts each Linear's output gradient to the compute dtype once
 * for its two backward products (on a 1.6 table): count those casts */
static int32_t spy_cast(kiln_instance *acc, void *dst, uint32_t dst_dtype, const void *src, uint32_t src_dtype,
                        size_t n) {
    g_casts16 += src_dtype == KILN_DTYPE_F32 && (dst_dtype == KILN_DTYPE_BF16 || dst_dtype == KILN_DTYPE_F16);
    return g_cpu->cast(acc, dst, dst_dtype, src, src_dtype, n);
}

static int32_t spy_xent_fused(kiln_instance *acc, uint32_t dtype, void *logits, const int32_t *targets, int32_t N,
                              int32_t V, int32_t Vp, double grad_scale, double *loss_sum) {
    g_xent_dtype = dtype;
    return g_cpu->xent_fused(acc, dtype, logits, targets, N, V, Vp, grad_scale, loss_sum);
}

static int32_t spy_layernorm_forward(kiln_instance *acc, uint32_t dtype, void *y, void *mean, void *rstd,
                                     const void *x, const void *w, const void *b, int32_t N, int32_t C, double eps,
                                     uint32_t round_dtype) {
    g_ln_dtype = dtype;
    return g_cpu->layernorm_forward(acc, dtype, y, mean, rstd, x, w, b, N, C, eps, round_dtype);
}

static int32_t spy_linear_layout(kiln_instance *acc, uint32_t dt, const void *x, const void *w, uint32_t wt,
                                 int32_t wl, const void *b, int32_t rows, int32_t in, int32_t out, int32_t act, void *y,
                                 void *post, uint32_t rt) {
    g_conv1d_calls += (wl & ~KILN_LAYOUT_ROUND_BIAS) == KILN_LAYOUT_IN_OUT;
    g_round_bias += (wl & KILN_LAYOUT_ROUND_BIAS) != 0;
    return g_cpu->linear_forward_layout(acc, dt, x, w, wt, wl, b, rows, in, out, act, y, post, rt);
}

typedef struct {
    double train, val;
    float *grads; /* (n) every parameter's, in registration order */
    size_t n;
    uint32_t xent_dtype, ln_dtype;
    int conv1d_calls, casts16, round_bias;
    float predict[37]; /* predict_step's logits for the last sequence */
} logits_run;

/* GPT-2 starts with zero biases, which every rounding keeps: the runs
 * below give them values no 16-bit format holds, so that the way a bias is
 * added shows in the results. */
static void nonzero_biases(void) {
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        kiln_parameter *p = kiln_test_param(g_th, i);
        if (p->ndim != 1 || !strstr(p->name, ".bias")) continue;
        for (int64_t j = 0; j < p->numel; j++) p->data[j] = 0.05f * sinf(0.7f * (float)j + (float)i) + 1e-4f;
        if (p->compute != p->data && p->compute_dtype == KILN_DTYPE_F32)
            memcpy(p->compute, p->data, (size_t)p->numel * sizeof(float));
    }
}

/* One training step, backward and validation step on the cpu table as the
 * ABI minor `abi` (15, 16, 17 or 18; 110 for 1.10, 111 for 1.11, the whole
 * table) would present it. */
static logits_run run_logits(int prec, int abi) {
    logits_run r = {NAN, NAN, NULL, 0, 0, 0, 0, 0, 0, {0}};
    const kiln_kernels saved = g_table;
    g_table.xent_fused = spy_xent_fused;
    g_table.linear_forward_layout = spy_linear_layout;
    g_table.layernorm_forward = spy_layernorm_forward;
    g_table.cast = spy_cast;
    g_table.flags = g_cpu->flags & ~(abi < 16   ? KILN_KERNELS_STORE_16BIT | KILN_KERNELS_ACT_16BIT
                                     : abi < 17 ? KILN_KERNELS_ACT_16BIT
                                                : 0u);
    if (abi < 18) g_table.flags &= ~KILN_KERNELS_BIAS_ROUND;
    if (abi < 16) g_table.struct_size = KILN_KERNELS_SIZE_1_5;
    else if (abi < 19) g_table.struct_size = KILN_KERNELS_SIZE_1_6; /* 1.7 and 1.8 appended no entry */
    else if (abi == 110) g_table.struct_size = KILN_KERNELS_SIZE_1_10;
    g_xent_dtype = g_ln_dtype = 0;
    g_conv1d_calls = g_casts16 = g_round_bias = 0;
    /* 16 rows in chunks of 5 (the last one partial), logits stride 40 */
    cfg c = {2, 2, 16, 8, 37, 40, 2, 5, 1e-5, 0.02, {{0}}};
    kiln_instance *inst = make_ok(&c, 29, prec);
    nonzero_biases();
    tbatch tb;
    batch_random(&tb, 2, 8, 37, 12);
    r.train = train_loss(inst, &tb);
    CU_ASSERT_EQUAL(ops()->backward(inst, 3.0), KILN_OK);
    r.xent_dtype = g_xent_dtype;
    r.ln_dtype = g_ln_dtype;
    r.casts16 = g_casts16;
    size_t total = 0;
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) total += (size_t)kiln_test_param(g_th, i)->numel;
    r.grads = malloc(total * sizeof *r.grads);
    r.n = total;
    for (uint32_t i = 0, off = 0; i < kiln_test_param_count(g_th); i++) {
        const kiln_parameter *p = kiln_test_param(g_th, i);
        memcpy(r.grads + off, p->grad, (size_t)p->numel * sizeof(float));
        off += (uint32_t)p->numel;
    }
    kiln_step_output out = step_output();
    CU_ASSERT_EQUAL(ops()->validation_step(inst, &tb.b, 0, &out), KILN_OK);
    r.val = out.loss;
    r.conv1d_calls = g_conv1d_calls;
    r.round_bias = g_round_bias;
    kiln_tensor tok = {tb.x + 8, KILN_DTYPE_I32, 2, {1, 8, 1, 1}}, pout;
    kiln_batch pb = {sizeof pb, 1, &tok, 1};
    memset(&pout, 0, sizeof pout);
    CU_ASSERT_EQUAL(ops()->predict_step(inst, &pb, &pout), KILN_OK);
    if (pout.data && pout.shape[1] == 37) memcpy(r.predict, pout.data, sizeof r.predict);
    destroy_module(inst);
    g_table = saved;
    return r;
}

/* Two runs that must agree bit for bit: losses and every gradient (then
 * the gradients are freed). */
static void expect_same_run(logits_run *a, logits_run *b) {
    CU_ASSERT_EQUAL(a->train, b->train);
    CU_ASSERT_EQUAL(a->val, b->val);
    CU_ASSERT_TRUE(isfinite(a->train) && a->train > 0.0);
    CU_ASSERT_TRUE(a->n > 0 && a->n == b->n);
    CU_ASSERT_EQUAL(memcmp(a->grads, b->grads, a->n * sizeof(float)), 0);
    free(a->grads);
    free(b->grads);
}

static void test_logits_16bit(void) {
    CU_ASSERT_TRUE_FATAL(g_cpu->flags & KILN_KERNELS_STORE_16BIT);
    const int precs[3] = {P_BF16, P_F16, P_F32};
    const uint32_t want16[3] = {KILN_DTYPE_BF16, KILN_DTYPE_F32, KILN_DTYPE_F32};
    for (int k = 0; k < 3; k++) {
        logits_run a = run_logits(precs[k], 16), b = run_logits(precs[k], 15);
        CU_ASSERT_EQUAL(a.xent_dtype, want16[k]);
        CU_ASSERT_EQUAL(b.xent_dtype, KILN_DTYPE_F32);
        CU_ASSERT_EQUAL(a.conv1d_calls, 2 * 4 * 2); /* (training + validation) x 4 Conv1D x 2 layers */
        CU_ASSERT_EQUAL(b.conv1d_calls, 0);
        /* one 16-bit copy of dy per Linear backward (4 per layer) in mixed
         * precision on the 1.6 table, none on the 1.5 one */
        CU_ASSERT_EQUAL(a.casts16, precs[k] == P_F32 ? 0 : 2 * 4);
        CU_ASSERT_EQUAL(b.casts16, 0);
        expect_same_run(&a, &b);
    }
}

/* ABI 1.7 changes no result either. On a 1.7 table, bf16-mixed stores the
 * activations in bfloat16 (KILN_KERNELS_ACT_16BIT: the layer norms write
 * bf16, and the only casts of an output gradient left are those of the
 * float32 residual stream's: the two Linears that read it per layer, and
 * ln_f's); on the 1.6 table float32. Losses and every gradient are the same
 * bits. 16-mixed and 32-true store float32 on both. */
static void test_act_16bit(void) {
    CU_ASSERT_TRUE_FATAL(g_cpu->flags & KILN_KERNELS_ACT_16BIT);
    const int precs[3] = {P_BF16, P_F16, P_F32};
    for (int k = 0; k < 3; k++) {
        logits_run a = run_logits(precs[k], 17), b = run_logits(precs[k], 16);
        CU_ASSERT_EQUAL(a.ln_dtype, precs[k] == P_BF16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32);
        CU_ASSERT_EQUAL(b.ln_dtype, KILN_DTYPE_F32);
        CU_ASSERT_EQUAL(a.casts16, precs[k] == P_BF16 ? 2 * 2 + 1 : b.casts16);
        CU_ASSERT_EQUAL(memcmp(a.predict, b.predict, sizeof a.predict), 0);
        CU_ASSERT(a.predict[0] != 0.0f || a.predict[1] != 0.0f); /* predict_step filled them */
        expect_same_run(&a, &b);
    }
}

/* ABI 1.8 changes no result between tables: gpt asks for its biases
 * rounded through the compute dtype (kiln_nn_ctx.round_bias, autocast's
 * cast), and on a 1.8 table the accelerator rounds them (every Linear call
 * carries KILN_LAYOUT_ROUND_BIAS in the mixed precisions, none in 32-true),
 * on a 1.7 one kiln/nn.h rounds a copy. Losses, gradients and predictions
 * are the same bits. */
static void test_bias_round(void) {
    CU_ASSERT_TRUE_FATAL(g_cpu->flags & KILN_KERNELS_BIAS_ROUND);
    const int precs[3] = {P_BF16, P_F16, P_F32};
    for (int k = 0; k < 3; k++) {
        logits_run a = run_logits(precs[k], 18), b = run_logits(precs[k], 17);
        CU_ASSERT_EQUAL(a.round_bias, precs[k] == P_F32 ? 0 : 2 * 4 * 2); /* (train + val) x 4 Linears x 2 layers */
        CU_ASSERT_EQUAL(b.round_bias, 0);
        CU_ASSERT_EQUAL(a.conv1d_calls, 2 * 4 * 2);
        CU_ASSERT_EQUAL(memcmp(a.predict, b.predict, sizeof a.predict), 0);
        expect_same_run(&a, &b);
    }
}

/* ABI 1.11 changes no result either: on the whole table each c_fc's GELU
 * backward sums its bias gradient (act_bias_backward) and each layer norm
 * backward that a Linear's backward follows writes that Linear's 16-bit
 * copy of the residual gradient (layernorm_backward_cast), so of the
 * casts the 1.10 table makes only those of gradients kept in float32
 * storage are left: gpt's own of ln_f's gradient in bf16-mixed, c_attn's
 * and c_fc's in 16-mixed (2 per layer). Losses, gradients and predictions
 * are the same bits. */
static void test_bwd_fuse(void) {
    const int precs[3] = {P_BF16, P_F16, P_F32};
    const int casts[3][2] = {{1, 2 * 2 + 1}, {2 * 2, 2 * 4}, {0, 0}}; /* 1.11, 1.10 */
    for (int k = 0; k < 3; k++) {
        logits_run a = run_logits(precs[k], 111), b = run_logits(precs[k], 110);
        CU_ASSERT_EQUAL(a.casts16, casts[k][0]);
        CU_ASSERT_EQUAL(b.casts16, casts[k][1]);
        CU_ASSERT_EQUAL(memcmp(a.predict, b.predict, sizeof a.predict), 0);
        expect_same_run(&a, &b);
    }
}

/* One Linear through kiln/nn.h on table k: x (R, IN) of 16-bit-exact
 * values, W (IN, OUT) Conv1D in dt, a float32 bias; the output widened
 * to float32 into got (R * OUT). */
enum { NRB_R = 6, NRB_IN = 8, NRB_OUT = 12 };
static int nn_linear_once(const kiln_kernels *k, uint32_t dt, int act16, int round_bias, int32_t act,
                          const float *xf, const void *w16, const float *bias, float *got) {
    float wm[NRB_IN * NRB_OUT] = {0}, wg[NRB_IN * NRB_OUT], bg[NRB_OUT], bm[NRB_OUT];
    memcpy(bm, bias, sizeof bm);
    kiln_parameter w = {sizeof w, 0, "h.0.mlp.c_fc.weight", 2, dt, {NRB_IN, NRB_OUT}, NRB_IN * NRB_OUT, wm, wg,
                        (void *)w16, KILN_DTYPE_F32, 0};
    kiln_parameter b = {sizeof b, KILN_PARAMF_NO_DECAY, "h.0.mlp.c_fc.bias", 1, KILN_DTYPE_F32, {NRB_OUT}, NRB_OUT,
                        bm, bg, bm, KILN_DTYPE_F32, 0};
    kiln_parameter *ps[2] = {&w, &b};
    kiln_nn_ctx c;
    memset(&c, 0, sizeof c);
    c.acc = g_acc;
    c.k = k;
    c.act16 = act16 ? KILN_NN_ACT16_BF16 | KILN_NN_ACT16_F16 : 0;
    c.round_bias = round_bias;
    if (kiln_nn_ctx_setup(&c, ps, 2) != KILN_OK) return -1;
    kiln_nn_linear L = {.w = &w, .b = &b, .in = NRB_IN, .out = NRB_OUT, .layout = KILN_NN_IN_OUT, .act = act};
    const uint32_t sdt = kiln_nn_sdt(&c);
    kiln_nn_arena a;
    kiln_nn_arena_begin(&a, NULL);
    kiln_nn_linear_plan(&a, &L, NRB_R, kiln_nn_act_size(sdt));
    void *arena = NULL, *x = NULL;
    int rc = -1;
    if (g_cpu->alloc(g_acc, a.off + NRB_R * NRB_IN * sizeof(float), &arena) != KILN_OK) return -1;
    kiln_nn_arena_begin(&a, arena);
    kiln_nn_linear_plan(&a, &L, NRB_R, kiln_nn_act_size(sdt));
    x = (char *)arena + a.off;
    if (g_cpu->cast(g_acc, x, sdt, xf, KILN_DTYPE_F32, NRB_R * NRB_IN) == KILN_OK &&
        kiln_nn_linear_forward(&c, &L, x, NRB_R) == KILN_OK &&
        g_cpu->cast(g_acc, got, KILN_DTYPE_F32, kiln_nn_linear_output(&L), sdt, NRB_R * NRB_OUT) == KILN_OK)
        rc = (int)(sdt != KILN_DTYPE_F32); /* 1: the activations were 16-bit */
    else
        printf("\n  nn_linear_once: %s", c.msg);
    g_cpu->free(g_acc, arena);
    return rc;
}

/* kiln_nn_ctx.round_bias (ABI 1.8) on one Linear: y = rdt(x W + rdt(b))
 * and GELU's output after it, the bits of the float32 call given a bias
 * rounded by the test, whether the accelerator rounds it (the cpu table:
 * KILN_LAYOUT_ROUND_BIAS), kiln/nn.h does (the same table without
 * KILN_KERNELS_BIAS_ROUND), or the unfused sequence does (a 1.5-sized
 * table); with float32 and 16-bit storage, bf16 and f16. round_bias 0 adds
 * the float32 bias and differs. */
static void test_nn_round_bias(void) {
    test_rng rng = {0x5EEDB1A5ull};
    kiln_kernels t18 = *g_cpu, t17 = *g_cpu, t15 = *g_cpu;
    t18.linear_forward_layout = t17.linear_forward_layout = spy_linear_layout;
    t17.flags &= ~KILN_KERNELS_BIAS_ROUND;
    t15.flags &= ~(KILN_KERNELS_BIAS_ROUND | KILN_KERNELS_ACT_16BIT | KILN_KERNELS_STORE_16BIT);
    t15.struct_size = KILN_KERNELS_SIZE_1_5;
    const uint32_t dts[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        const uint32_t dt = dts[d];
        float xf[NRB_R * NRB_IN], wf[NRB_IN * NRB_OUT], bias[NRB_OUT], bq[NRB_OUT];
        uint16_t w16[NRB_IN * NRB_OUT];
        for (int i = 0; i < NRB_R * NRB_IN; i++) xf[i] = (float)(test_rng_unit(&rng) * 2.0 - 1.0);
        for (int i = 0; i < NRB_IN * NRB_OUT; i++) wf[i] = (float)(test_rng_unit(&rng) * 0.6 - 0.3);
        for (int i = 0; i < NRB_OUT; i++) bias[i] = (float)(test_rng_unit(&rng) - 0.5);
        /* x, W and the reference bias hold dt's values (bias kept raw) */
        CU_ASSERT_EQUAL_FATAL(g_cpu->round_to(g_acc, xf, dt, NRB_R * NRB_IN), KILN_OK);
        CU_ASSERT_EQUAL_FATAL(g_cpu->cast(g_acc, w16, dt, wf, KILN_DTYPE_F32, NRB_IN * NRB_OUT), KILN_OK);
        memcpy(bq, bias, sizeof bq);
        CU_ASSERT_EQUAL_FATAL(g_cpu->round_to(g_acc, bq, dt, NRB_OUT), KILN_OK);
        CU_ASSERT(memcmp(bq, bias, sizeof bq) != 0); /* the rounding moves the bias */
        for (int ai = 0; ai < 2; ai++) {
            const int32_t act = ai ? KILN_ACT_GELU : -1;
            float want[NRB_R * NRB_OUT], y[NRB_R * NRB_OUT], post[NRB_R * NRB_OUT];
            CU_ASSERT_EQUAL_FATAL(g_cpu->linear_forward_layout(g_acc, KILN_DTYPE_F32, xf, w16, dt, KILN_LAYOUT_IN_OUT,
                                                               bq, NRB_R, NRB_IN, NRB_OUT, act, y, post, dt),
                                  KILN_OK);
            memcpy(want, act >= 0 ? post : y, sizeof want);
            for (int s16 = 0; s16 < 2; s16++) {
                const kiln_kernels *tabs[3] = {&t18, &t17, &t15};
                for (int t = 0; t < 3; t++) {
                    float got[NRB_R * NRB_OUT], raw[NRB_R * NRB_OUT];
                    g_round_bias = 0;
                    const int stored16 = nn_linear_once(tabs[t], dt, s16, 1, act, xf, w16, bias, got);
                    CU_ASSERT_EQUAL(stored16, s16 && t < 2);
                    CU_ASSERT_EQUAL(g_round_bias, t == 0);
                    const int same = memcmp(got, want, sizeof want) == 0;
                    if (!same)
                        printf("\n  %s act %d storage16 %d table %d: differs from the rounded-bias call",
                               kiln_dtype_name(dt), (int)act, s16, 18 - t);
                    CU_ASSERT(same);
                    CU_ASSERT_EQUAL(nn_linear_once(tabs[t], dt, s16, 0, act, xf, w16, bias, raw), stored16);
                    CU_ASSERT(memcmp(raw, want, sizeof want) != 0);
                }
            }
        }
    }
}

/* kiln/nn.h's choice of activation storage and its refusals (ABI 1.7):
 * 16-bit only where the module allows that dtype, the masters are float32
 * and the table has both storage bits; a ctx whose dtypes the module set
 * itself (sdt 0, as a 1.6 module's) keeps the master dtype; a Linear with
 * an activation refuses a float32 dy beside 16-bit storage, and no input
 * gradient is accumulated into 16-bit storage. */
static void test_nn_storage(void) {
    float buf[64] = {0};
    kiln_parameter w = {sizeof w, 0, "h.0.mlp.c_fc.weight", 2, KILN_DTYPE_BF16, {4, 4}, 16, buf, buf, buf,
                        KILN_DTYPE_F32, 0};
    kiln_parameter *ps[1] = {&w};
    kiln_kernels no_act16 = *g_cpu;
    no_act16.flags &= ~KILN_KERNELS_ACT_16BIT;
    const struct {
        uint32_t compute, act16;
        const kiln_kernels *k;
        uint32_t want;
    } cases[] = {
        {KILN_DTYPE_BF16, 0, g_cpu, KILN_DTYPE_F32},
        {KILN_DTYPE_BF16, KILN_NN_ACT16_BF16, g_cpu, KILN_DTYPE_BF16},
        {KILN_DTYPE_BF16, KILN_NN_ACT16_F16, g_cpu, KILN_DTYPE_F32},
        {KILN_DTYPE_BF16, KILN_NN_ACT16_BF16, &no_act16, KILN_DTYPE_F32},
        {KILN_DTYPE_F16, KILN_NN_ACT16_BF16 | KILN_NN_ACT16_F16, g_cpu, KILN_DTYPE_F16},
        {KILN_DTYPE_F32, KILN_NN_ACT16_BF16, g_cpu, KILN_DTYPE_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kiln_nn_ctx c;
        memset(&c, 0, sizeof c);
        c.k = cases[i].k;
        c.act16 = cases[i].act16;
        w.compute_dtype = cases[i].compute;
        CU_ASSERT_EQUAL_FATAL(kiln_nn_ctx_setup(&c, ps, 1), KILN_OK);
        CU_ASSERT_EQUAL(kiln_nn_sdt(&c), cases[i].want);
        if (kiln_nn_sdt(&c) != cases[i].want)
            printf("\n  case %zu: storage %u, want %u", i, (unsigned)kiln_nn_sdt(&c), (unsigned)cases[i].want);
    }
    /* a module that sets its dtypes itself: the master dtype */
    kiln_nn_ctx m;
    memset(&m, 0, sizeof m);
    m.k = g_cpu;
    m.adt = KILN_DTYPE_F32;
    m.rdt = KILN_DTYPE_BF16;
    CU_ASSERT_EQUAL(kiln_nn_sdt(&m), KILN_DTYPE_F32);
    /* refusals, before any kernel runs */
    kiln_nn_ctx c;
    memset(&c, 0, sizeof c);
    c.k = g_cpu;
    c.act16 = KILN_NN_ACT16_BF16;
    w.compute_dtype = KILN_DTYPE_BF16;
    CU_ASSERT_EQUAL_FATAL(kiln_nn_ctx_setup(&c, ps, 1), KILN_OK);
    kiln_nn_linear L = {&w, NULL, 4, 4, KILN_NN_IN_OUT, KILN_ACT_GELU, buf, buf + 16, buf + 32, 2, NULL};
    CU_ASSERT_EQUAL(kiln_nn_linear_backward_dt(&c, &L, buf, KILN_DTYPE_F32, buf + 48, KILN_DTYPE_BF16, 0),
                    KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(c.msg, "h.0.mlp.c_fc.weight: backward with dy in float32"));
    L.act = -1;
    CU_ASSERT_EQUAL(kiln_nn_linear_backward_dt(&c, &L, buf, KILN_DTYPE_BF16, buf + 48, KILN_DTYPE_BF16, 1),
                    KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(c.msg, "accumulated"));
    for (int i = 0; i < 64; i++) CU_ASSERT_EQUAL(buf[i], 0.0f); /* nothing written */
}

/* All targets ignored: loss 0, no gradient, nothing logged. */
static void test_all_ignored(void) {
    tbatch tb;
    kiln_instance *inst = tiny_module(2, P_F32, &tb, 3);
    for (int i = 0; i < 10; i++) tb.y[i] = -1;
    CU_ASSERT_EQUAL(train_loss(inst, &tb), 0.0);
    CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_OK);
    double s = 0;
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++)
        for (int64_t j = 0; j < kiln_test_param(g_th, i)->numel; j++) s += fabs(kiln_test_param(g_th, i)->grad[j]);
    CU_ASSERT_EQUAL(s, 0.0);
    CU_ASSERT(isnan(kiln_test_last_value(g_th, "train_loss")));
    destroy_module(inst);
}

/* A frozen parameter's grad stays untouched; the others still get theirs. */
static void test_frozen(void) {
    tbatch tb;
    kiln_instance *inst = tiny_module(2, P_F32, &tb, 3);
    (void)train_loss(inst, &tb);
    const uint32_t frozen[3] = {0, 4, kiln_test_param_count(g_th) - 2}; /* wte, h.0.attn.c_attn.weight, ln_f.weight */
    for (int i = 0; i < 3; i++) kiln_test_param(g_th, frozen[i])->flags |= KILN_PARAMF_FROZEN;
    CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_OK);
    for (int i = 0; i < 3; i++) {
        double s = 0;
        for (int64_t j = 0; j < kiln_test_param(g_th, frozen[i])->numel; j++) s += fabs(kiln_test_param(g_th, frozen[i])->grad[j]);
        CU_ASSERT_EQUAL(s, 0.0);
    }
    double s = 0;
    for (int64_t j = 0; j < kiln_test_param(g_th, 1)->numel; j++) s += fabs(kiln_test_param(g_th, 1)->grad[j]);
    CU_ASSERT(s > 0.0);
    destroy_module(inst);
}

/* train_loss on step and epoch; val_loss and, at the epoch's end,
 * val_ppl = exp(token-weighted mean val_loss); test likewise. */
static void test_logging(void) {
    tbatch tb;
    kiln_instance *inst = tiny_module(2, P_F32, &tb, 3);
    const double l = train_loss(inst, &tb);
    const kiln_test_value *e = NULL;
    for (int i = 0; i < (int)kiln_test_logged_count(g_th); i++)
        if (!strcmp(kiln_test_logged(g_th, i)->name, "train_loss")) e = kiln_test_logged(g_th, i);
    CU_ASSERT_PTR_NOT_NULL_FATAL(e);
    CU_ASSERT_EQUAL(e->value, l);
    CU_ASSERT_EQUAL(e->flags, KILN_LOG_ON_STEP | KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR);
    CU_ASSERT_EQUAL(e->weight, 8.0); /* 10 positions, every 4th ignored */
    /* the step's throughput for the host's tokens/s and MFU */
    kiln_step_output so = step_output();
    CU_ASSERT_EQUAL(ops()->training_step(inst, &tb.b, 0, &so), KILN_OK);
    CU_ASSERT_EQUAL(so.tokens, 10);
    {
        /* 6 N + 12 L C T per token, N = every parameter (wte once) */
        double N = 0;
        for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) N += (double)kiln_test_param(g_th, i)->numel;
        const double want = 10.0 * (6.0 * N + 12.0 * 2 * 8 * 5);
        CU_ASSERT(fabs(so.flops - want) <= 1e-12 * want);
        if (!(fabs(so.flops - want) <= 1e-12 * want)) printf("\n  flops %.17g, want %.17g", so.flops, want);
    }
    const uint32_t ids[2][2] = {{KILN_EV_ON_VALIDATION_EPOCH_START, KILN_EV_ON_VALIDATION_EPOCH_END},
                                {KILN_EV_ON_TEST_EPOCH_START, KILN_EV_ON_TEST_EPOCH_END}};
    const char *names[2][2] = {{"val_loss", "val_ppl"}, {"test_loss", "test_ppl"}};
    for (int s = 0; s < 2; s++) {
        kiln_event ev = {sizeof ev, ids[s][0], 0, 0, -1, NULL, NULL, 0, NULL, NULL, NULL, 0, 0, 0, 0, 0};
        CU_ASSERT_EQUAL(ops()->on_event(inst, &ev), KILN_OK);
        double sum = 0, n = 0;
        for (int k = 0; k < 2; k++) {
            batch_random(&tb, 2, 5, 11, 30 + (uint64_t)k);
            if (k == 1) tb.y[0] = tb.y[1] = -1; /* another weight */
            kiln_step_output out = step_output();
            CU_ASSERT_EQUAL(s ? ops()->test_step(inst, &tb.b, k, &out) : ops()->validation_step(inst, &tb.b, k, &out),
                            KILN_OK);
            int valid = 0;
            for (int i = 0; i < 10; i++) valid += tb.y[i] >= 0;
            sum += out.loss * valid;
            n += valid;
            CU_ASSERT_EQUAL(kiln_test_last_value(g_th, names[s][0]), out.loss);
        }
        ev.id = ids[s][1];
        CU_ASSERT_EQUAL(ops()->on_event(inst, &ev), KILN_OK);
        CU_ASSERT(fabs(kiln_test_last_value(g_th, names[s][1]) - exp(sum / n)) < 1e-12 * exp(sum / n));
    }
    CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_E_STATE); /* after an eval step */
    destroy_module(inst);
}

/* After create, no step allocates accelerator memory. */
static void test_no_step_allocations(void) {
    tbatch tb;
    kiln_instance *inst = tiny_module(2, P_F32, &tb, 3);
    (void)train_loss(inst, &tb); /* first call: kernels may size their scratch */
    CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_OK);
    const int before = g_allocs;
    for (int i = 0; i < 3; i++) {
        (void)train_loss(inst, &tb);
        CU_ASSERT_EQUAL(ops()->backward(inst, 1.0), KILN_OK);
    }
    CU_ASSERT_EQUAL(g_allocs, before);
    destroy_module(inst);
}

static int suite_clean(void) {
    free_compute();
    fixture_accel_close(g_th, g_cpu_ops, &g_acc);
    return 0;
}

static CU_TestInfo cases_gpt[] = {
    {"descriptor and declared config", test_descriptor},
    {"parameters: HF GPT2LMHeadModel names, shapes, order, no-decay", test_param_layout},
    {"init: GPT-2 statistics, deterministic per seed", test_init},
    {"bad configs are refused naming the keys", test_bad_config},
    {"classifier_chunk = 0: 256 rows on the cpu, chunks of at most 1 GiB of logits on a GPU", test_auto_chunk},
    {"a pre-1.4 kernel table is refused in one line", test_old_kernel_table},
    {"bad batches are refused with a message", test_bad_batch},
    {"fp64: loss and predict_step = a double GPT-2 forward", test_forward_f64},
    {"fp32: loss and predict_step = a double GPT-2 forward", test_forward_f32},
    {"fp64: backward vs central differences, every tensor", test_gradcheck_f64},
    {"backward adds, linear in dloss", test_backward_accumulates},
    {"classifier chunk size changes nothing", test_chunks},
    {"fp32 vs fp64; bf16 and f16 compute copies", test_precisions},
    {"1.6: bf16 logits, fused Conv1D = the 1.5 table's results, bit for bit", test_logits_16bit},
    {"1.7: bf16 activations = the 1.6 table's results, bit for bit", test_act_16bit},
    {"1.7: kiln/nn.h picks the storage; refuses what it cannot store", test_nn_storage},
    {"1.8: rounded biases = the 1.7 table's results, bit for bit", test_bias_round},
    {"1.11: fused backward entries = the 1.10 table's results, bit for bit", test_bwd_fuse},
    {"1.8: kiln/nn.h's round_bias is y = rdt(x W + rdt(b)) on every table", test_nn_round_bias},
    {"all targets ignored: loss 0, no gradient", test_all_ignored},
    {"frozen parameters keep their grads", test_frozen},
    {"train/val/test losses and perplexities are logged", test_logging},
    {"no allocation per step", test_no_step_allocations},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "gpt", .pInitFunc = load_plugins, .pCleanupFunc = suite_clean, .pTests = cases_gpt},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
