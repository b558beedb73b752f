/*
 * mlp.c — the "mlp" module plugin: a multilayer perceptron classifier in the
 * style of llm.c, i.e. with a hand-written forward and backward pass instead
 * of an autograd graph. The network is Linear(layers[0], layers[1]) ->
 * activation -> ... -> Linear(layers[L-1], layers[L]) followed by softmax
 * cross-entropy against integer labels; parameters are registered with the
 * host in PyTorch nn.Linear layout and naming ("layers.<i>.weight" (out, in),
 * "layers.<i>.bias" (out)) so checkpoints and optimizer semantics line up
 * with the PyTorch equivalent. Every activation buffer lives in ONE arena
 * allocated through the accelerator at create() time for `max_batch` rows, so
 * a training step allocates nothing; every computation goes through the
 * accelerator's kernel table, which is what lets the same module run on any
 * accelerator plugin. Weights are initialised deterministically from the
 * seed the host passes, with a private PRNG (splitmix64 -> xoshiro256**), so
 * runs reproduce bit for bit. Each layer is the SDK's Linear (kiln/nn.h,
 * the one the gpt module builds on): its forward, its backward and its
 * precision handling are written once, there.
 */
#include <kiln/kiln.h>

#include "../common/plugin_common.h"
#include <kiln/nn.h>
#include <kiln/rng.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MLP_VERSION "0.1.0"

enum { MLP_INIT_KAIMING_UNIFORM = 0, MLP_INIT_ZEROS = 1 };

/* Largest sensible depth; keeps name buffers and the per-layer arrays small
 * and catches a runaway `layers` list with a clear message. */
#define MLP_MAX_LAYERS 64

typedef struct mlp {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    kiln_instance *acc;
    const kiln_kernels *k;

    int nlin;                  /* number of Linear layers L = len(layers) - 1      */
    int32_t width[MLP_MAX_LAYERS + 1]; /* layers[0..L]: in, hidden..., classes     */
    int32_t act;               /* KILN_ACT_RELU or KILN_ACT_GELU                   */
    int init;                  /* MLP_INIT_*                                       */
    int32_t max_batch;         /* rows every activation buffer is sized for        */
    int32_t max_grad_width;    /* max(layers[1..L]): the widest dy/dx row          */

    /* Linear l: weight (out, in) "layers.<l>.weight", bias (out); its y is
     * (max_batch, out) x.W^T+b (the logits for the last layer) and, for a
     * hidden layer, its post (max_batch, out) act(y), both in the arena. */
    kiln_nn_linear lin[MLP_MAX_LAYERS];
    kiln_nn_ctx nn;            /* accelerator, table and dtypes of the step         */

    /* The activation arena (accelerator memory) and views into it. Every
     * activation buffer holds `adt` elements: the master dtype of the
     * parameters (fp32, or fp64 under a float64 precision). Under a
     * reduced compute dtype (fp16/bf16 weights) activations stay in fp32
     * storage but every value is rounded through that dtype after each op,
     * which is what computing in it would keep (autocast emulation). */
    void *arena;
    size_t arena_bytes;
    uint32_t adt;              /* KILN_DTYPE_F32 or F64: activation storage        */
    size_t esz;                /* bytes per activation element                     */
    float *x32;                /* (max_batch, layers[0]) F32 staging of the inputs */
    void *x;                   /* (max_batch, layers[0]) inputs in adt             */
    int32_t *labels;           /* (max_batch) copy of the batch targets            */
    const void *in_x;          /* (B, layers[0]) inputs of the last forward, adt:
                                  the batch itself when the accelerator computes in
                                  host memory and nothing converts it, else x/x32 */
    const int32_t *in_labels;  /* (B) targets of the last forward, likewise    */
    void *probs;               /* (max_batch, C) softmax(logits)                   */
    void *grad_a, *grad_b;     /* (max_batch, max_grad_width) ping-pong dy / dx    */
    uint32_t rdt;              /* of the last forward: KILN_DTYPE_F16/BF16 to round
                                  activations through, F32 for none             */
    int fast;                  /* last forward in fp32: the loss takes the 1.1
                                  float kernels (as before the layers moved to
                                  kiln/nn.h; the same bits)                     */

    /* What backward needs from the last training_step. */
    int have_train_forward;    /* 0 after create or an eval step: no backward      */
    int32_t last_batch;        /* B of that forward                                */
} mlp;

/* ---------------------------------------------------------------------------
 * Errors */

/* kiln_errorf through the instance's services, the format checked */
#define mlp_fail(m, code, ...) PLUGIN_FAIL((m)->svc, (m)->hctx, (code), __VA_ARGS__)

/* A kernel call failed: name the kernel and where, so a failure deep inside
 * the backward pass is traceable from the message alone. */
#define MLP_K(m, call, what, layer)                                                                       \
    do {                                                                                                  \
        int32_t rc_ = (call);                                                                             \
        if (rc_ != KILN_OK)                                                                               \
            return mlp_fail((m), rc_, "mlp: kernel %s failed (layer %d): %s", (what), (int)(layer),       \
                            kiln_strerror(rc_));                                                          \
    } while (0)

/* ---------------------------------------------------------------------------
 * Config */

static const int64_t mlp_default_layers[] = {784, 1024, 1024, 10};

static const kiln_param mlp_params[] = {
    {"layers", KILN_TYPE_INT_LIST, 0, KILN_V_INTS(mlp_default_layers),
     "layer widths: inputs, hidden..., classes (at least 2 entries, all > 0)"},
    {"activation", KILN_TYPE_STRING, 0, KILN_V_STR("relu"), "hidden activation: relu | gelu (tanh approximation)"},
    {"init", KILN_TYPE_STRING, 0, KILN_V_STR("kaiming_uniform"),
     "weight init: kaiming_uniform (PyTorch nn.Linear default) | zeros"},
    {"max_batch", KILN_TYPE_INT, 0, KILN_V_INT(1024), "largest batch; activation buffers are sized for it once"},
    {NULL, KILN_TYPE_NONE, 0, KILN_V_NONE, NULL},
};

static int32_t mlp_parse_config(mlp *m, const kiln_kv *config) {
    const kiln_value *lv = kiln_kv_find(config, "layers");
    if (!lv || lv->type != KILN_TYPE_INT_LIST)
        return mlp_fail(m, KILN_E_CONFIG, "mlp: config key 'layers' must be a list of integers");
    if (lv->count < 2)
        return mlp_fail(m, KILN_E_CONFIG,
                        "mlp: config key 'layers' needs at least 2 entries (inputs and classes), got %u",
                        (unsigned)lv->count);
    if (lv->count > MLP_MAX_LAYERS + 1)
        return mlp_fail(m, KILN_E_CONFIG, "mlp: config key 'layers' has %u entries; at most %d are supported",
                        (unsigned)lv->count, MLP_MAX_LAYERS + 1);
    for (uint32_t i = 0; i < lv->count; i++) {
        if (lv->v.il[i] <= 0 || lv->v.il[i] > INT32_MAX)
            return mlp_fail(m, KILN_E_CONFIG, "mlp: config key 'layers'[%u] must be in [1, %d], got %lld", i,
                            INT32_MAX, (long long)lv->v.il[i]);
        m->width[i] = (int32_t)lv->v.il[i];
    }
    m->nlin = (int)lv->count - 1;

    const char *act = kiln_kv_str(config, "activation", "relu");
    if (!strcmp(act, "relu"))
        m->act = KILN_ACT_RELU;
    else if (!strcmp(act, "gelu"))
        m->act = KILN_ACT_GELU;
    else
        return mlp_fail(m, KILN_E_CONFIG, "mlp: config key 'activation' must be \"relu\" or \"gelu\", got \"%s\"",
                        act);

    const char *init = kiln_kv_str(config, "init", "kaiming_uniform");
    if (!strcmp(init, "kaiming_uniform"))
        m->init = MLP_INIT_KAIMING_UNIFORM;
    else if (!strcmp(init, "zeros"))
        m->init = MLP_INIT_ZEROS;
    else
        return mlp_fail(m, KILN_E_CONFIG,
                        "mlp: config key 'init' must be \"kaiming_uniform\" or \"zeros\", got \"%s\"", init);

    int64_t mb = kiln_kv_int(config, "max_batch", 1024);
    if (mb <= 0 || mb > INT32_MAX)
        return mlp_fail(m, KILN_E_CONFIG, "mlp: config key 'max_batch' must be in [1, %d], got %lld", INT32_MAX,
                        (long long)mb);
    m->max_batch = (int32_t)mb;

    m->max_grad_width = 0;
    for (int l = 1; l <= m->nlin; l++)
        if (m->width[l] > m->max_grad_width) m->max_grad_width = m->width[l];
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * The activation arena: one allocation, carved into 64-byte aligned pieces
 * (kiln/nn.h's arena). mlp_layout runs twice: with base == NULL to measure,
 * then to assign. */

static int mlp_layout(mlp *m, char *base, size_t *total) {
    kiln_nn_arena a;
    kiln_nn_arena_begin(&a, base);
    const size_t B = (size_t)m->max_batch, C = (size_t)m->width[m->nlin], e = m->esz;
    m->x32 = kiln_nn_carve(&a, B * (size_t)m->width[0], sizeof(float));
    m->x = kiln_nn_carve(&a, B * (size_t)m->width[0], e);
    m->labels = kiln_nn_carve(&a, B, sizeof(int32_t));
    for (int l = 0; l < m->nlin; l++) kiln_nn_linear_plan(&a, &m->lin[l], B, e);
    m->probs = kiln_nn_carve(&a, B * C, e);
    m->grad_a = kiln_nn_carve(&a, B * (size_t)m->max_grad_width, e);
    m->grad_b = kiln_nn_carve(&a, B * (size_t)m->max_grad_width, e);
    *total = a.off;
    return a.ok;
}

/* (Re)allocates the arena for activation dtype `adt`: at create() for fp32,
 * and once more in init_weights when the host made fp64 masters (the
 * master dtype is only known once the parameters exist). */
static int32_t mlp_alloc_arena(mlp *m, uint32_t adt) {
    if (m->arena) m->k->free(m->acc, m->arena);
    m->arena = NULL;
    m->adt = adt;
    m->esz = kiln_dtype_size(adt);
    if (!mlp_layout(m, NULL, &m->arena_bytes))
        return mlp_fail(m, KILN_E_CONFIG, "mlp: activation buffers for max_batch %d overflow size_t", m->max_batch);
    int32_t rc = m->k->alloc(m->acc, m->arena_bytes, &m->arena);
    if (rc != KILN_OK || !m->arena) {
        m->arena = NULL;
        return mlp_fail(m, rc != KILN_OK ? rc : KILN_E_NOMEM,
                        "mlp: cannot allocate the %zu-byte activation arena (max_batch %d, %s); lower max_batch",
                        m->arena_bytes, m->max_batch, kiln_dtype_name(adt));
    }
    mlp_layout(m, (char *)m->arena, &m->arena_bytes);
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Lifecycle */

static void mlp_destroy(kiln_instance *inst) {
    mlp *m = (mlp *)inst;
    if (!m) return;
    if (m->arena && m->k && m->k->free) m->k->free(m->acc, m->arena);
    free(m);
}

/* The kernel entries this module calls; a table too old or incomplete for
 * them is refused at create() rather than crashing mid-step. */
static int mlp_kernels_ok(const kiln_kernels *k) {
    if (!k || k->struct_size < offsetof(kiln_kernels, softmax_xent_backward) + sizeof(void *)) return 0;
    return k->alloc && k->free && k->copy && k->zero && k->gemm && k->bias_add && k->bias_grad &&
           k->relu_forward && k->relu_backward && k->gelu_forward && k->gelu_backward && k->softmax_xent_forward &&
           k->softmax_xent_backward;
}

static int32_t mlp_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                          const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    if (!svc || svc->abi_minor < 1 || !svc->accelerator || !svc->param_register)
        return kiln_errorf(svc, hctx, KILN_E_HOST_TOO_OLD,
                           "mlp: needs the ABI 1.1 services (accelerator, param_register)");
    mlp *m = calloc(1, sizeof *m);
    if (!m) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "mlp: cannot allocate the instance");
    m->svc = svc;
    m->hctx = hctx;

    int32_t rc = mlp_parse_config(m, config);
    if (rc != KILN_OK) goto fail;

    rc = svc->accelerator(hctx, &m->acc, &m->k);
    if (rc != KILN_OK) {
        rc = mlp_fail(m, rc, "mlp: no accelerator kernel table available (%s)", kiln_strerror(rc));
        goto fail;
    }
    if (!mlp_kernels_ok(m->k)) {
        rc = mlp_fail(m, KILN_E_UNSUPPORTED,
                      "mlp: the accelerator's kernel table lacks an entry this module needs "
                      "(gemm, bias, relu/gelu, softmax_xent, alloc/copy/zero)");
        goto fail;
    }

    /* The layers' shapes first (the arena is planned from them), the
     * arena once, before any parameter is registered: a failure here leaves
     * nothing behind on the host. */
    for (int l = 0; l < m->nlin; l++) {
        m->lin[l].in = m->width[l];
        m->lin[l].out = m->width[l + 1];
        m->lin[l].layout = KILN_NN_OUT_IN;
        m->lin[l].act = l == m->nlin - 1 ? -1 : m->act;
    }
    m->nn.acc = m->acc;
    m->nn.k = m->k;
    /* 1.5: every Linear output goes through the precision's
     * round_activation (a no-op for the built-in precisions) */
    m->nn.svc = svc;
    m->nn.hctx = hctx;
    rc = mlp_alloc_arena(m, KILN_DTYPE_F32);
    if (rc != KILN_OK) goto fail;

    /* Parameters in nn.Sequential-of-Linear order: weight (out, in) then
     * bias (out, no weight decay) per layer, "layers.<l>.*". */
    for (int l = 0; l < m->nlin; l++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "layers.%d", l);
        rc = kiln_nn_linear_register(svc, hctx, &m->lin[l], prefix, m->width[l], m->width[l + 1], KILN_NN_OUT_IN, 1,
                                     l == m->nlin - 1 ? -1 : m->act);
        if (rc != KILN_OK) {
            rc = mlp_fail(m, rc, "mlp: registering parameters of layer %d failed (%s)", l, kiln_strerror(rc));
            goto fail;
        }
    }
    *out = (kiln_instance *)m;
    return KILN_OK;
fail:
    mlp_destroy((kiln_instance *)m);
    return rc;
}

/* ---------------------------------------------------------------------------
 * init_weights */

static int32_t mlp_init_weights(kiln_instance *self, uint64_t seed) {
    mlp *m = (mlp *)self;
    const kiln_kernels *k = m->k;
    for (int l = 0; l < m->nlin; l++)
        if (!m->lin[l].w->data || !m->lin[l].b->data || !m->lin[l].w->grad || !m->lin[l].b->grad)
            return mlp_fail(m, KILN_E_STATE, "mlp: init_weights before the host allocated layers.%d", l);

    const uint32_t pdt = kiln_param_dtype(m->lin[0].w);
    if (pdt != KILN_DTYPE_F32 && pdt != KILN_DTYPE_F64)
        return mlp_fail(m, KILN_E_UNSUPPORTED, "mlp: master weights in %s; this module supports float32 and float64",
                        kiln_dtype_name(pdt));
    if (pdt != KILN_DTYPE_F32 && k->struct_size < KILN_KERNELS_SIZE_1_2)
        return mlp_fail(m, KILN_E_UNSUPPORTED,
                        "mlp: %s master weights need the ABI 1.2 kernel entries (gemm_ex, *_ex); the accelerator's "
                        "kernel table is %u bytes (1.2 needs %zu)",
                        kiln_dtype_name(pdt), k->struct_size, (size_t)KILN_KERNELS_SIZE_1_2);
    if (pdt != m->adt) {
        int32_t arc = mlp_alloc_arena(m, pdt);
        if (arc != KILN_OK) return arc;
    }
    const size_t esz = m->esz;

    /* Parameters live in accelerator memory, so values are generated in a
     * host staging buffer (sized for the largest tensor) and copied over.
     * fp64 masters get the same fp32 draws, widened: a 64-true run starts
     * from the weights a 32-true run with the same seed starts from. */
    size_t maxn = 0;
    for (int l = 0; l < m->nlin; l++)
        if ((size_t)m->lin[l].w->numel > maxn) maxn = (size_t)m->lin[l].w->numel;
    float *stage = malloc(maxn * sizeof *stage);
    double *stage64 = pdt == KILN_DTYPE_F64 ? malloc(maxn * sizeof *stage64) : NULL;
    if (!stage || (pdt == KILN_DTYPE_F64 && !stage64)) {
        free(stage);
        free(stage64);
        return mlp_fail(m, KILN_E_NOMEM, "mlp: cannot allocate %zu values to stage init", maxn);
    }

    /* One stream over all tensors in registration order: same seed, same
     * bits; the order is fixed by the config alone. */
    kiln_rng rng;
    kiln_rng_seed(&rng, seed); /* kiln/rng.h: the same bits on every libc */
    int32_t rc = KILN_OK;
    for (int l = 0; l < m->nlin && rc == KILN_OK; l++) {
        /* nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) gives
         * bound = gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + 5)),
         * i.e. 1/sqrt(fan_in); the bias uses the same bound. */
        const float bound = (float)(1.0 / sqrt((double)m->width[l]));
        kiln_parameter *ps[2] = {m->lin[l].w, m->lin[l].b};
        for (int j = 0; j < 2 && rc == KILN_OK; j++) {
            const size_t n = (size_t)ps[j]->numel;
            for (size_t i = 0; i < n; i++)
                stage[i] = m->init == MLP_INIT_ZEROS ? 0.0f : kiln_rng_uniformf(&rng, -bound, bound);
            if (stage64)
                for (size_t i = 0; i < n; i++) stage64[i] = (double)stage[i];
            rc = k->copy(m->acc, ps[j]->data, stage64 ? (const void *)stage64 : (const void *)stage, n * esz,
                         KILN_COPY_H2D);
            if (rc == KILN_OK) rc = k->zero(m->acc, ps[j]->grad, n * esz);
            if (rc != KILN_OK) rc = mlp_fail(m, rc, "mlp: writing %s failed (%s)", ps[j]->name, kiln_strerror(rc));
        }
    }
    free(stage);
    free(stage64);
    m->have_train_forward = 0;
    return rc;
}

/* ---------------------------------------------------------------------------
 * Forward */

/* Checks the batch (inputs (B, features...) F32 with prod(features) ==
 * layers[0]; targets (B) I32; 1 <= B <= max_batch) and returns B. */
static int32_t mlp_check_batch(mlp *m, const kiln_batch *batch, const char *step, int32_t *B_out) {
    if (!batch || batch->ntensors < 2 || !batch->tensors)
        return mlp_fail(m, KILN_E_DATA, "mlp: %s expects a batch of 2 tensors (inputs, targets), got %u", step,
                        batch ? (unsigned)batch->ntensors : 0u);
    const kiln_tensor *x = &batch->tensors[0], *y = &batch->tensors[1];
    const int64_t B = batch->size;
    if (B < 1)
        return mlp_fail(m, KILN_E_DATA, "mlp: %s got an empty batch (size %lld)", step, (long long)B);
    if (B > m->max_batch)
        return mlp_fail(m, KILN_E_DATA,
                        "mlp: %s got a batch of %lld rows but max_batch is %d (raise mlp.max_batch)", step,
                        (long long)B, m->max_batch);
    if (x->dtype != KILN_DTYPE_F32 || x->ndim < 2 || x->ndim > KILN_MAX_DIMS || !x->data)
        return mlp_fail(m, KILN_E_DATA, "mlp: %s expects inputs as an F32 tensor (B, features), got dtype %u ndim %u",
                        step, (unsigned)x->dtype, (unsigned)x->ndim);
    int64_t features = 1;
    for (uint32_t d = 1; d < x->ndim; d++) features *= x->shape[d];
    if (features != m->width[0])
        return mlp_fail(m, KILN_E_DATA, "mlp: %s expects %d input features (layers[0]), got %lld", step,
                        m->width[0], (long long)features);
    if (x->shape[0] < B)
        return mlp_fail(m, KILN_E_DATA, "mlp: %s: inputs have %lld rows but the batch size is %lld", step,
                        (long long)x->shape[0], (long long)B);
    if (y->dtype != KILN_DTYPE_I32 || y->ndim != 1 || !y->data)
        return mlp_fail(m, KILN_E_DATA, "mlp: %s expects targets as an I32 tensor (B), got dtype %u ndim %u", step,
                        (unsigned)y->dtype, (unsigned)y->ndim);
    if (y->shape[0] < B)
        return mlp_fail(m, KILN_E_DATA, "mlp: %s: targets have %lld rows but the batch size is %lld", step,
                        (long long)y->shape[0], (long long)B);
    *B_out = (int32_t)B;
    return KILN_OK;
}

/* Which dtypes the next forward computes in, from the parameters the
 * precision plugin set up: m->fast when everything is fp32 (the 1.1 kernels,
 * bit-identical to before 1.2), else m->rdt = the reduced compute dtype of
 * the weights (F16/BF16, or F32 when the weights compute in the master
 * dtype). Biases are added in the activation dtype; one kept in a reduced
 * dtype is read from its master copy, and the sum is rounded anyway. */
static int32_t mlp_plan(mlp *m, const char *step) {
    const kiln_kernels *k = m->k;
    uint32_t rdt = KILN_DTYPE_F32;
    for (int l = 0; l < m->nlin; l++) {
        const kiln_parameter *ps[2] = {m->lin[l].w, m->lin[l].b};
        for (int j = 0; j < 2; j++)
            if (!ps[j]->compute)
                return mlp_fail(m, KILN_E_STATE, "mlp: %s has no compute weights (host did not set them up)",
                                ps[j]->name);
        const uint32_t cd = m->lin[l].w->compute_dtype;
        const int reduced = cd == KILN_DTYPE_F16 || cd == KILN_DTYPE_BF16;
        if (cd != m->adt && !(reduced && m->adt == KILN_DTYPE_F32))
            return mlp_fail(m, KILN_E_UNSUPPORTED,
                            "mlp: %s: %s computes in %s with %s masters; this module computes in the master dtype "
                            "or, over float32 masters, in float16/bfloat16",
                            step, m->lin[l].w->name, kiln_dtype_name(cd), kiln_dtype_name(m->adt));
        if (reduced) {
            if (rdt != KILN_DTYPE_F32 && rdt != cd)
                return mlp_fail(m, KILN_E_UNSUPPORTED, "mlp: %s: weights mix %s and %s compute dtypes", step,
                                kiln_dtype_name(rdt), kiln_dtype_name(cd));
            rdt = cd;
        }
    }
    m->rdt = rdt;
    m->fast = m->adt == KILN_DTYPE_F32 && rdt == KILN_DTYPE_F32;
    m->nn.adt = m->adt;
    m->nn.rdt = rdt;
    if (!m->fast && (k->struct_size < KILN_KERNELS_SIZE_1_2 || !k->gemm_ex || !k->round_to || !k->cast))
        return mlp_fail(m, KILN_E_UNSUPPORTED,
                        "mlp: %s: computing in %s needs the ABI 1.2 kernel entries (gemm_ex, round_to, cast, *_ex); "
                        "the accelerator's kernel table is %u bytes (1.2 needs %zu)",
                        step, kiln_dtype_name(m->rdt != KILN_DTYPE_F32 ? m->rdt : m->adt), k->struct_size,
                        (size_t)KILN_KERNELS_SIZE_1_2);
    return KILN_OK;
}

/* Rounds n activation values through m->rdt (no-op without one). */
static int32_t mlp_round(mlp *m, void *x, size_t n, const char *what, int layer) {
    if (m->rdt == KILN_DTYPE_F32) return KILN_OK;
    MLP_K(m, m->k->round_to(m->acc, (float *)x, m->rdt, n), what, layer);
    return KILN_OK;
}

/* Puts the batch where the forward reads it: in place when the accelerator
 * computes in host memory and nothing converts it; else a copy (x32), then
 * rounded through the compute dtype (autocast casts a matmul's inputs) or
 * widened to fp64. */
static int32_t mlp_stage_inputs(mlp *m, const kiln_batch *batch, int32_t B) {
    const kiln_kernels *k = m->k;
    kiln_instance *acc = m->acc;
    const size_t nx = (size_t)B * (size_t)m->width[0];
    const void *src = batch->tensors[0].data;
    if (k->flags & KILN_KERNELS_HOST_MEMORY) {
        m->in_labels = (const int32_t *)batch->tensors[1].data;
    } else {
        MLP_K(m, k->copy(acc, m->x32, src, nx * sizeof(float), KILN_COPY_H2D), "copy(inputs)", 0);
        MLP_K(m, k->copy(acc, m->labels, batch->tensors[1].data, (size_t)B * sizeof(int32_t), KILN_COPY_H2D),
              "copy(targets)", 0);
        m->in_labels = m->labels;
        src = m->x32;
    }
    if (m->adt == KILN_DTYPE_F64) {
        MLP_K(m, k->cast(acc, m->x, KILN_DTYPE_F64, src, KILN_DTYPE_F32, nx), "cast(inputs)", 0);
        m->in_x = m->x;
    } else if (m->rdt != KILN_DTYPE_F32) {
        if (src != m->x32) MLP_K(m, k->copy(acc, m->x32, src, nx * sizeof(float), KILN_COPY_D2D), "copy(inputs)", 0);
        int32_t rc = mlp_round(m, m->x32, nx, "round_to(inputs)", 0);
        if (rc != KILN_OK) return rc;
        m->in_x = m->x32;
    } else {
        m->in_x = src;
    }
    return KILN_OK;
}

/* Forward through every layer and the loss; leaves pre/post/logits/probs
 * filled for the first B rows. The loss (softmax + cross-entropy) runs in
 * the activation dtype without rounding: autocast runs it in fp32. */
static int32_t mlp_forward(mlp *m, const kiln_batch *batch, const char *step, int32_t *B_out, double *loss,
                           int32_t *n_correct) {
    const kiln_kernels *k = m->k;
    kiln_instance *acc = m->acc;
    int32_t B = 0;
    int32_t rc = mlp_check_batch(m, batch, step, &B);
    if (rc == KILN_OK) rc = mlp_plan(m, step);
    if (rc == KILN_OK) rc = mlp_stage_inputs(m, batch, B);
    if (rc != KILN_OK) return rc;

    const void *x = m->in_x; /* (B, width[l]) input of layer l */
    for (int l = 0; l < m->nlin; l++) {
        /* y = x . W^T + b, rounded once through rdt, then the activation
         * (kiln/nn.h: linear_forward where the table has it) */
        if ((rc = kiln_nn_linear_forward(&m->nn, &m->lin[l], x, B)) != KILN_OK)
            return mlp_fail(m, rc, "mlp: layer %d forward: %s", l, m->nn.msg);
        x = kiln_nn_linear_output(&m->lin[l]);
    }

    const int32_t C = m->width[m->nlin];
    if (m->fast) {
        float lf = 0.0f;
        rc = k->softmax_xent_forward(acc, m->probs, m->lin[m->nlin - 1].y, m->in_labels, B, C, &lf, n_correct);
        *loss = (double)lf;
    } else {
        rc = k->softmax_xent_forward_ex(acc, m->adt, m->probs, m->lin[m->nlin - 1].y, m->in_labels, B, C, loss,
                                        n_correct);
    }
    if (rc == KILN_E_DATA)
        return mlp_fail(m, KILN_E_DATA, "mlp: %s: a target label is outside [0, %d) (layers[-1] = %d classes)", step,
                        C, C);
    if (rc != KILN_OK)
        return mlp_fail(m, rc, "mlp: kernel softmax_xent_forward failed: %s", kiln_strerror(rc));
    *B_out = B;
    return KILN_OK;
}

static int32_t mlp_training_step(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx,
                                 kiln_step_output *out) {
    mlp *m = (mlp *)self;
    (void)batch_idx;
    m->have_train_forward = 0;
    double loss = 0.0;
    int32_t B = 0, n_correct = 0;
    int32_t rc = mlp_forward(m, batch, "training_step", &B, &loss, &n_correct);
    if (rc != KILN_OK) return rc;
    m->have_train_forward = 1;
    m->last_batch = B;
    module_step_loss(out, loss, B);
    if (m->svc->log_value) {
        const uint32_t f = KILN_LOG_ON_STEP | KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR;
        m->svc->log_value(m->hctx, "train_loss", loss, f, (double)B);
        m->svc->log_value(m->hctx, "train_acc", (double)n_correct / (double)B, f, (double)B);
    }
    return KILN_OK;
}

/* validation_step / test_step: forward only; the train activations are
 * overwritten, so a backward must not follow. */
static int32_t mlp_eval_step(mlp *m, const kiln_batch *batch, kiln_step_output *out, const char *step,
                             const char *loss_name, const char *acc_name) {
    m->have_train_forward = 0;
    double loss = 0.0;
    int32_t B = 0, n_correct = 0;
    int32_t rc = mlp_forward(m, batch, step, &B, &loss, &n_correct);
    if (rc != KILN_OK) return rc;
    module_step_loss(out, loss, B);
    if (m->svc->log_value) {
        const uint32_t f = KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR;
        m->svc->log_value(m->hctx, loss_name, loss, f, (double)B);
        m->svc->log_value(m->hctx, acc_name, (double)n_correct / (double)B, f, (double)B);
    }
    return KILN_OK;
}

static int32_t mlp_validation_step(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx,
                                   kiln_step_output *out) {
    (void)batch_idx;
    return mlp_eval_step((mlp *)self, batch, out, "validation_step", "val_loss", "val_acc");
}

static int32_t mlp_test_step(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx, kiln_step_output *out) {
    (void)batch_idx;
    return mlp_eval_step((mlp *)self, batch, out, "test_step", "test_loss", "test_acc");
}

/* ---------------------------------------------------------------------------
 * Backward: gradients of dloss * (last training loss), ADDED to p->grad.
 * Reads only the forward state, never overwrites it, so it may be called
 * more than once per forward (each call adds again). */

static int32_t mlp_backward(kiln_instance *self, double dloss) {
    mlp *m = (mlp *)self;
    const kiln_kernels *k = m->k;
    kiln_instance *acc = m->acc;
    if (!m->have_train_forward)
        return mlp_fail(m, KILN_E_STATE, "mlp: backward called without a preceding training_step");
    const int32_t B = m->last_batch, C = m->width[m->nlin];
    void *dy = m->grad_a; /* (B, width[l+1]) gradient at layer l's output */
    void *dx = m->grad_b; /* (B, width[l])   gradient at layer l's input  */
    if (m->fast) {
        MLP_K(m, k->softmax_xent_backward(acc, dy, m->probs, m->in_labels, B, C, (float)dloss),
              "softmax_xent_backward", m->nlin - 1);
    } else {
        /* the scaled loss's gradient, rounded as a reduced-precision
         * backward would hold it (fp16 overflow shows up here as inf, which
         * the precision plugin then finds and skips) */
        MLP_K(m, k->softmax_xent_backward_ex(acc, m->adt, dy, m->probs, m->in_labels, B, C, dloss),
              "softmax_xent_backward_ex", m->nlin - 1);
        int32_t rc = mlp_round(m, dy, (size_t)B * (size_t)C, "round_to(dlogits)", m->nlin - 1);
        if (rc != KILN_OK) return rc;
    }
    for (int l = m->nlin - 1; l >= 0; l--) {
        /* dW += dy^T . x, db += sum dy, dx = dy . W (none for the data),
         * through layer l's activation first (kiln/nn.h) */
        int32_t rc = kiln_nn_linear_backward(&m->nn, &m->lin[l], dy, l == 0 ? NULL : dx, 0);
        if (rc != KILN_OK) return mlp_fail(m, rc, "mlp: layer %d backward: %s", l, m->nn.msg);
        void *t = dy;
        dy = dx;
        dx = t;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Descriptor */

static const kiln_module_ops mlp_ops = {
    .base = {sizeof(kiln_module_ops), 0, mlp_create, mlp_destroy, NULL, NULL},
    .init_weights = mlp_init_weights,
    .training_step = mlp_training_step,
    .backward = mlp_backward,
    .validation_step = mlp_validation_step,
    .test_step = mlp_test_step,
    .on_event = NULL, /* no LightningModule hooks of its own */
};

/* Master dtypes this module handles (host/stack_checks.c reads it). */
static const char *const mlp_param_dtypes[] = {"float32", "float64"};
/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const mlp_checks[] = {"layers in [1, 2147483647]", "activation in {relu, gelu}", "init in {kaiming_uniform, zeros}", "max_batch >= 1"};
static const kiln_kv mlp_props[] = {
    {"param_dtypes", KILN_V_STRS(mlp_param_dtypes)},
    {"config_checks", KILN_V_STRS(mlp_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc mlp_desc = {
    sizeof(kiln_plugin_desc),
    KILN_KIND_MODULE,
    "mlp",
    MLP_VERSION,
    "multilayer perceptron classifier (Linear + ReLU/GELU, softmax cross-entropy); explicit forward/backward",
    0,
    mlp_props,
    mlp_params,
    &mlp_ops,
    NULL,
};

KILN_DEFINE_LIBRARY("mlp", MLP_VERSION, 1, &mlp_desc)
