/*
 * gpt.c — the "gpt" module plugin: GPT-2 (Radford et al. 2019) as a
 * language model with a hand-written forward and backward pass, built from
 * the layers of kiln/nn.h over the accelerator's kernel table (ABI 1.4):
 *
 *   x0   = wte[tokens] + wpe[0..T)                      (B*T, C)
 *   x_l  = block_l(x_{l-1}), l = 1..n_layer             pre-LayerNorm blocks
 *   xf   = ln_f(x_L)
 *   loss = mean over targets != -1 of cross_entropy(xf . wte^T, target)
 *
 * Parameters are registered with Hugging Face GPT2LMHeadModel's state-dict
 * names, shapes, layouts (Conv1D: weight (in, out)) and order, so a kiln
 * checkpoint loads into transformers by name; transformer.wte.weight is
 * (vocab_size, C) and doubles as lm_head (tied). The classifier never holds
 * (B*T, vocab) logits twice: it runs over chunks of rows, and each chunk's
 * logits are overwritten by their unit gradient (xent_fused) and folded
 * into the classifier's unit gradients at once, which backward(dloss) then
 * scales. Precision is the module-independent emulation of kiln/nn.h
 * (docs/precision.md): nothing here names a precision. Every activation lives
 * in one arena, measured at create() and allocated by the first forward
 * (once the precision has fixed the masters' dtype and the activations'
 * storage, again only if they change); a later step allocates nothing.
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

#define GPT_VERSION "0.1.0"

/* How init_weights fills a parameter. */
enum { GPT_INIT_NORMAL = 0, GPT_INIT_ZEROS = 1, GPT_INIT_ONES = 2 };

typedef struct gpt {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    kiln_instance *acc;
    const kiln_kernels *k;

    /* config */
    int32_t n_layer, n_head, C;  /* C = n_embd                                       */
    int32_t block_size;          /* longest sequence; rows of wpe                    */
    int32_t V, Vp;               /* vocab_size, and the logits' row stride (>= V)    */
    int32_t max_batch;           /* B the arena is planned for                       */
    int32_t max_rows;            /* max_batch * block_size                           */
    int32_t chunk;               /* classifier rows per chunk (<= max_rows)          */
    double eps;                  /* layer norm epsilon                               */
    double init_std;             /* initializer_range                                */

    /* layers (kiln/nn.h); their parameters in registration order in `params` */
    kiln_nn_embedding emb;       /* wte (V, C), wpe (block_size, C)                  */
    kiln_nn_block *h;            /* (n_layer)                                        */
    kiln_nn_layernorm ln_f;
    kiln_nn_scratch scratch;     /* backward temporaries, max_rows rows              */
    kiln_parameter **params;     /* (nparams) HF state-dict order                    */
    uint8_t *init_kind;          /* (nparams) GPT_INIT_*                             */
    double *init_scale;          /* (nparams) std of GPT_INIT_NORMAL                 */
    uint32_t nparams;

    /* The arena (accelerator memory): the layers' buffers and these. */
    void *arena;
    size_t arena_bytes;
    uint32_t adt;                /* F32 or F64: the dtype the arena is laid out for  */
    size_t esz;                  /* bytes per element in adt (the residual stream)   */
    uint32_t sdt;                /* the activations' storage it is laid out for:
                                  * adt, or bf16 (kiln/nn.h's 16-bit storage)        */
    size_t asz;                  /* bytes per activation element (sdt's)             */
    int32_t *tokens;             /* (max_rows) I32 the inputs of the last forward    */
    int32_t *targets;            /* (max_rows) I32 its targets (-1 = ignore)         */
    void *dres;                  /* (max_rows, C) residual-stream gradient           */
    void *dx_unit;               /* (max_rows, C) d(loss)/d(xf) for dloss = 1        */
    void *dwte_unit;             /* (V, C) the classifier's d(loss)/d(wte), dloss = 1 */
    void *logits;                /* (chunk, Vp) one chunk of logits / their gradient,
                                  * stored in gpt_logits_dtype (bf16 in bf16-mixed)  */
    float *pred32;               /* (Vp) F32 predict_step's logits on the device     */
    float *wte32;                /* (V, C) F32 wte's float16 compute values, for the
                                  * 16-mixed classifier backward; its own block     */
    float *pred_host;            /* (V) F32 host copy predict_step hands out         */

    kiln_nn_ctx ctx;             /* acc, kernels, dtypes of the current step         */

    uint32_t logits_logged;      /* the logits dtype last reported (0: none yet)     */
    uint32_t sdt_logged;         /* the activations' storage last reported (0: none) */

    /* What backward needs from the last training_step. */
    int have_train_forward;
    int32_t B, T;                /* of the last forward                              */
    int64_t n_valid;             /* its targets != -1                                */

    /* Epoch sums for the perplexities (validation, test). */
    double eval_loss_sum, eval_count;
} gpt;

/* ---------------------------------------------------------------------------
 * Errors */

/* kiln_errorf through the instance's services, the format checked */
#define gpt_fail(g, code, ...) PLUGIN_FAIL((g)->svc, (g)->hctx, (code), __VA_ARGS__)

/* An nn.h layer or a kernel failed: ctx.msg names the kernel and layer. */
static int32_t gpt_nn_fail(const gpt *g, int32_t rc, const char *step) {
    if (rc == KILN_E_DATA && strstr(g->ctx.msg, "embedding_forward"))
        return gpt_fail(g, rc, "gpt: %s: a token id is outside [0, vocab_size = %d)", step, g->V);
    return gpt_fail(g, rc, "gpt: %s: %s", step, g->ctx.msg);
}

#define GPT_K(g, call, step, what)                                                                         \
    do {                                                                                                   \
        int32_t rc_ = (call);                                                                              \
        if (rc_ != KILN_OK)                                                                                \
            return gpt_fail((g), rc_, "gpt: %s: kernel %s failed: %s", (step), (what), kiln_strerror(rc_)); \
    } while (0)

/* ---------------------------------------------------------------------------
 * Config */

static const kiln_param gpt_params[] = {
    {"n_layer", KILN_TYPE_INT, 0, KILN_V_INT(12), "transformer blocks"},
    {"n_head", KILN_TYPE_INT, 0, KILN_V_INT(12), "attention heads per block (n_embd % n_head == 0)"},
    {"n_embd", KILN_TYPE_INT, 0, KILN_V_INT(768), "model width C"},
    {"block_size", KILN_TYPE_INT, 0, KILN_V_INT(1024), "longest sequence T (HF n_positions): rows of wpe"},
    {"vocab_size", KILN_TYPE_INT, 0, KILN_V_INT(50257), "token ids are in [0, vocab_size)"},
    {"padded_vocab_size", KILN_TYPE_INT, 0, KILN_V_INT(0),
     "row stride of the logits (>= vocab_size; 0: vocab_size rounded up to a multiple of 64); wte stays "
     "(vocab_size, n_embd) and the padding columns are never computed or predicted"},
    {"max_batch", KILN_TYPE_INT, 0, KILN_V_INT(8), "largest batch B; activation buffers hold max_batch*block_size rows"},
    {"classifier_chunk", KILN_TYPE_INT, 0, KILN_V_INT(0),
     "rows of logits computed at once (memory: classifier_chunk * padded_vocab_size values); 0: automatic, "
     "256 on the cpu, up to 1 GiB of logits on a GPU"},
    {"layer_norm_epsilon", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1e-5), "epsilon of every LayerNorm"},
    {"initializer_range", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.02),
     "std of the normal init of weights and embeddings (residual projections: / sqrt(2 * n_layer))"},
    {NULL, KILN_TYPE_NONE, 0, KILN_V_NONE, NULL},
};

/* A positive int32 config key. */
static int32_t gpt_key_pos(gpt *g, const kiln_kv *config, const char *key, int64_t def, int32_t *out) {
    const int64_t v = kiln_kv_int(config, key, def);
    if (v <= 0 || v > INT32_MAX)
        return gpt_fail(g, KILN_E_CONFIG, "gpt: config key '%s' must be in [1, %d], got %lld", key, INT32_MAX,
                        (long long)v);
    *out = (int32_t)v;
    return KILN_OK;
}

static int32_t gpt_parse_config(gpt *g, const kiln_kv *config) {
    int32_t rc = gpt_key_pos(g, config, "n_layer", 12, &g->n_layer);
    if (rc == KILN_OK) rc = gpt_key_pos(g, config, "n_head", 12, &g->n_head);
    if (rc == KILN_OK) rc = gpt_key_pos(g, config, "n_embd", 768, &g->C);
    if (rc == KILN_OK) rc = gpt_key_pos(g, config, "block_size", 1024, &g->block_size);
    if (rc == KILN_OK) rc = gpt_key_pos(g, config, "vocab_size", 50257, &g->V);
    if (rc == KILN_OK) rc = gpt_key_pos(g, config, "max_batch", 8, &g->max_batch);
    if (rc != KILN_OK) return rc;
    const int64_t chunk = kiln_kv_int(config, "classifier_chunk", 0); /* 0: gpt_auto_chunk decides */
    if (chunk < 0 || chunk > INT32_MAX)
        return gpt_fail(g, KILN_E_CONFIG,
                        "gpt: config key 'classifier_chunk' must be in [0, %d] (0: automatic), got %lld", INT32_MAX,
                        (long long)chunk);
    g->chunk = (int32_t)chunk;
    if (g->C % g->n_head != 0)
        return gpt_fail(g, KILN_E_CONFIG,
                        "gpt: n_embd (%d) must be a multiple of n_head (%d): each head takes n_embd / n_head columns",
                        g->C, g->n_head);
    if (g->C > INT32_MAX / 4)
        return gpt_fail(g, KILN_E_CONFIG, "gpt: n_embd (%d) is too large: 4 * n_embd must fit in int32", g->C);
    const int64_t pv = kiln_kv_int(config, "padded_vocab_size", 0);
    if (pv == 0) {
        const int64_t r = ((int64_t)g->V + 63) / 64 * 64;
        g->Vp = r > INT32_MAX ? g->V : (int32_t)r;
    } else if (pv < g->V || pv > INT32_MAX) {
        return gpt_fail(g, KILN_E_CONFIG,
                        "gpt: config key 'padded_vocab_size' (%lld) must be 0 or at least vocab_size (%d)",
                        (long long)pv, g->V);
    } else {
        g->Vp = (int32_t)pv;
    }
    const int64_t rows = (int64_t)g->max_batch * g->block_size;
    if (rows > INT32_MAX)
        return gpt_fail(g, KILN_E_CONFIG, "gpt: max_batch * block_size (%d * %d) must fit in int32", g->max_batch,
                        g->block_size);
    g->max_rows = (int32_t)rows;
    g->eps = kiln_kv_float(config, "layer_norm_epsilon", 1e-5);
    if (!(g->eps > 0.0) || !isfinite(g->eps))
        return gpt_fail(g, KILN_E_CONFIG, "gpt: config key 'layer_norm_epsilon' must be > 0, got %g", g->eps);
    g->init_std = kiln_kv_float(config, "initializer_range", 0.02);
    if (!(g->init_std >= 0.0) || !isfinite(g->init_std))
        return gpt_fail(g, KILN_E_CONFIG, "gpt: config key 'initializer_range' must be >= 0, got %g", g->init_std);
    return KILN_OK;
}

/* classifier_chunk = 0: the rows of logits per chunk, from where the
 * accelerator's memory is. Each chunk's three products stream all of wte
 * (the logits product and the input gradient's) and read and write all of
 * the float32 dwte (the weight gradient's, accumulating): for GPT-2 about
 * 460 MB per chunk whatever its rows. On a CPU that is cheap beside the
 * arithmetic, and a small chunk keeps the logits in cache: 256 rows. On a
 * GPU it is not: 256 rows would be 128 chunks for GPT-2 at batch 32 x 1024,
 * about 59 GB of traffic per step (some 12 ms of an H200's bandwidth) and a
 * wait per chunk for the loss. So a device-memory table gets the fewest
 * equal chunks whose logits buffer stays within 1 GiB at 4 bytes a value
 * (the buffer is sized at the masters' bytes: float64 runs take twice
 * that): for GPT-2 at batch 32, 7 chunks of 4,682 rows and 3.2 GB of that
 * traffic. Never more rows than one forward has. */
static void gpt_auto_chunk(gpt *g) {
    if (g->chunk == 0) {
        if (g->k->flags & KILN_KERNELS_HOST_MEMORY) {
            g->chunk = 256;
        } else {
            const double per_row = (double)g->Vp * 4.0, budget = 1073741824.0;
            const double n = ceil((double)g->max_rows * per_row / budget); /* chunks */
            g->chunk = (int32_t)ceil((double)g->max_rows / (n < 1.0 ? 1.0 : n));
        }
    }
    if (g->chunk > g->max_rows) g->chunk = g->max_rows;
}

/* ---------------------------------------------------------------------------
 * The arena: the same layout runs to measure (base NULL) and to assign. */

static void gpt_layout(gpt *g, kiln_nn_arena *a) {
    const size_t R = (size_t)g->max_rows, C = (size_t)g->C, e = g->esz, as = g->asz;
    g->tokens = kiln_nn_carve(a, R, sizeof(int32_t));
    g->targets = kiln_nn_carve(a, R, sizeof(int32_t));
    kiln_nn_embedding_plan(a, &g->emb, R, e);
    for (int32_t l = 0; l < g->n_layer; l++) kiln_nn_block_plan_sz(a, &g->h[l], R, e, as);
    kiln_nn_layernorm_plan_sz(a, &g->ln_f, R, e, as);
    kiln_nn_scratch_plan(a, &g->scratch, R, g->C, 4 * g->C, as);
    g->dres = kiln_nn_carve(a, R * C, e);
    g->dx_unit = kiln_nn_carve(a, R * C, e);
    g->dwte_unit = kiln_nn_carve(a, (size_t)g->V * C, e);
    g->logits = kiln_nn_carve(a, (size_t)g->chunk * (size_t)g->Vp, e);
    g->pred32 = kiln_nn_carve(a, (size_t)g->Vp, sizeof(float));
}

/* Lays the arena out (without memory) for master dtype `adt` and
 * activation storage `sdt`: g->arena_bytes. */
static int32_t gpt_measure_arena(gpt *g, uint32_t adt, uint32_t sdt) {
    g->adt = adt;
    g->esz = kiln_dtype_size(adt);
    g->sdt = sdt;
    g->asz = kiln_nn_act_size(sdt);
    kiln_nn_arena a;
    kiln_nn_arena_begin(&a, NULL);
    gpt_layout(g, &a);
    if (!a.ok)
        return gpt_fail(g, KILN_E_CONFIG, "gpt: activation buffers for max_batch %d x block_size %d overflow size_t",
                        g->max_batch, g->block_size);
    g->arena_bytes = a.off;
    return KILN_OK;
}

/* (Re)allocates the arena for master dtype `adt` and activation storage
 * `sdt`. Only gpt_plan calls it, at the first forward and when the dtypes
 * change: the storage is known only once the precision has set up the
 * compute copies, and an arena allocated earlier for float32 would stay in
 * the accelerator's block cache beside the 16-bit one, raising the memory
 * high-water mark by the float32 arena's size. */
static int32_t gpt_alloc_arena(gpt *g, uint32_t adt, uint32_t sdt) {
    if (g->arena) g->k->free(g->acc, g->arena);
    g->arena = NULL;
    int32_t rc = gpt_measure_arena(g, adt, sdt);
    if (rc != KILN_OK) return rc;
    kiln_nn_arena a;
    rc = g->k->alloc(g->acc, g->arena_bytes, &g->arena);
    if (rc != KILN_OK || !g->arena) {
        g->arena = NULL;
        return gpt_fail(g, rc != KILN_OK ? rc : KILN_E_NOMEM,
                        "gpt: cannot allocate the %zu-byte activation arena (max_batch %d, block_size %d, %s); lower "
                        "max_batch or classifier_chunk",
                        g->arena_bytes, g->max_batch, g->block_size, kiln_dtype_name(adt));
    }
    kiln_nn_arena_begin(&a, g->arena);
    gpt_layout(g, &a);
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Parameters */

/* Appends p with its init rule, in registration order. */
static void gpt_track(gpt *g, kiln_parameter *p, int kind, double std) {
    g->params[g->nparams] = p;
    g->init_kind[g->nparams] = (uint8_t)kind;
    g->init_scale[g->nparams] = std;
    g->nparams++;
}

static void gpt_track_linear(gpt *g, const kiln_nn_linear *L, double std) {
    gpt_track(g, L->w, GPT_INIT_NORMAL, std);
    gpt_track(g, L->b, GPT_INIT_ZEROS, 0.0);
}

static void gpt_track_ln(gpt *g, const kiln_nn_layernorm *ln) {
    gpt_track(g, ln->w, GPT_INIT_ONES, 0.0);
    gpt_track(g, ln->b, GPT_INIT_ZEROS, 0.0);
}

/* Registers every parameter in GPT2LMHeadModel.state_dict() order:
 * wte, wpe, per block ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
 * mlp.c_proj (weight then bias each), then ln_f. lm_head.weight is wte
 * itself (tied), not a parameter of its own. */
static int32_t gpt_register(gpt *g) {
    const kiln_host_services *svc = g->svc;
    int32_t rc = kiln_nn_embedding_register(svc, g->hctx, &g->emb, "transformer.wte.weight", g->V,
                                            "transformer.wpe.weight", g->block_size, g->C);
    if (rc != KILN_OK) return gpt_fail(g, rc, "gpt: registering the embeddings failed (%s)", kiln_strerror(rc));
    gpt_track(g, g->emb.wte, GPT_INIT_NORMAL, g->init_std);
    gpt_track(g, g->emb.wpe, GPT_INIT_NORMAL, g->init_std);
    /* GPT-2's scaled init of the projections into the residual stream:
     * their outputs add up over 2 * n_layer residual branches. */
    const double resid_std = g->init_std / sqrt(2.0 * g->n_layer);
    for (int32_t l = 0; l < g->n_layer; l++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "transformer.h.%d", (int)l);
        kiln_nn_block *b = &g->h[l];
        rc = kiln_nn_block_register(svc, g->hctx, b, prefix, g->C, g->n_head, 4 * g->C, KILN_ACT_GELU, g->eps,
                                    KILN_NN_IN_OUT);
        if (rc != KILN_OK)
            return gpt_fail(g, rc, "gpt: registering the parameters of %s failed (%s)", prefix, kiln_strerror(rc));
        gpt_track_ln(g, &b->ln_1);
        gpt_track_linear(g, &b->attn.c_attn, g->init_std);
        gpt_track_linear(g, &b->attn.c_proj, resid_std);
        gpt_track_ln(g, &b->ln_2);
        gpt_track_linear(g, &b->mlp.c_fc, g->init_std);
        gpt_track_linear(g, &b->mlp.c_proj, resid_std);
    }
    rc = kiln_nn_layernorm_register(svc, g->hctx, &g->ln_f, "transformer.ln_f", g->C, g->eps);
    if (rc != KILN_OK) return gpt_fail(g, rc, "gpt: registering transformer.ln_f failed (%s)", kiln_strerror(rc));
    gpt_track_ln(g, &g->ln_f);
    return KILN_OK;
}

/* Parameters in the model, all of them (wte counted once: it is tied). */
static int64_t gpt_num_params(const gpt *g) {
    const int64_t C = g->C, L = g->n_layer;
    const int64_t block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return (int64_t)g->V * C + (int64_t)g->block_size * C + L * block + 2 * C;
}

/* Training FLOPs per token at sequence length T, for throughput and MFU:
 * 6 * N for the matmuls with every parameter (2 forward, 4 backward) plus
 * the attention scores and their product with v, 12 * n_layer * C * T
 * (PaLM appendix B; nanoGPT and llm.c count it the same way), halved when
 * `causal` counts only the unmasked half of the scores (what a causal
 * kernel really computes). N counts wpe, whose "matmul" is a lookup, as
 * llm.c does. The host can multiply by tokens per second (B*T per step
 * over the step time) for the achieved FLOP/s and divide by the device's
 * peak for MFU. */
static double gpt_flops_per_token(const gpt *g, int32_t T, int causal) {
    const double attn = 12.0 * g->n_layer * (double)g->C * (double)T;
    return 6.0 * (double)gpt_num_params(g) + (causal ? 0.5 * attn : attn);
}

/* ---------------------------------------------------------------------------
 * Lifecycle */

static void gpt_destroy(kiln_instance *inst) {
    gpt *g = (gpt *)inst;
    if (!g) return;
    if (g->arena && g->k && g->k->free) g->k->free(g->acc, g->arena);
    if (g->wte32 && g->k && g->k->free) g->k->free(g->acc, g->wte32);
    free(g->h);
    free(g->params);
    free(g->init_kind);
    free(g->init_scale);
    free(g->pred_host);
    free(g);
}

static int32_t gpt_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                          const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    if (!svc || svc->abi_minor < 1 || !svc->accelerator || !svc->param_register)
        return kiln_errorf(svc, hctx, KILN_E_HOST_TOO_OLD,
                           "gpt: needs the ABI 1.1 services (accelerator, param_register)");
    gpt *g = calloc(1, sizeof *g);
    if (!g) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "gpt: cannot allocate the instance");
    g->svc = svc;
    g->hctx = hctx;

    int32_t rc = gpt_parse_config(g, config);
    if (rc != KILN_OK) goto fail;

    rc = svc->accelerator(hctx, &g->acc, &g->k);
    if (rc != KILN_OK) {
        rc = gpt_fail(g, rc, "gpt: no accelerator kernel table available (%s)", kiln_strerror(rc));
        goto fail;
    }
    const char *missing = kiln_nn_kernels_missing(g->k);
    if (missing) {
        g->k = NULL; /* nothing of it is used, not even free */
        rc = gpt_fail(g, KILN_E_UNSUPPORTED,
                      "gpt: the accelerator's kernel table lacks %s; gpt needs the ABI 1.4 sequence kernels "
                      "(embedding, layernorm, attention, xent_fused, add)",
                      missing);
        goto fail;
    }
    gpt_auto_chunk(g);
    g->ctx.acc = g->acc;
    g->ctx.k = g->k;
    /* 1.5: Linear and attention outputs through the precision's
     * round_activation (a no-op for the built-in precisions) */
    g->ctx.svc = g->svc;
    g->ctx.hctx = g->hctx;

    const uint32_t np = 2 + 12 * (uint32_t)g->n_layer + 2; /* wte, wpe, 12 per block, ln_f */
    g->h = calloc((size_t)g->n_layer, sizeof *g->h);
    g->params = calloc(np, sizeof *g->params);
    g->init_kind = calloc(np, sizeof *g->init_kind);
    g->init_scale = calloc(np, sizeof *g->init_scale);
    g->pred_host = calloc((size_t)g->V, sizeof *g->pred_host);
    if (!g->h || !g->params || !g->init_kind || !g->init_scale || !g->pred_host) {
        rc = gpt_fail(g, KILN_E_NOMEM, "gpt: cannot allocate the layer tables (n_layer %d)", g->n_layer);
        goto fail;
    }

    /* Layer sizes first (the layout reads them), then the arena's size,
     * then the registrations: a refusal leaves nothing on the host. */
    g->emb.V = g->V;
    g->emb.C = g->C;
    g->emb.P = g->block_size;
    for (int32_t l = 0; l < g->n_layer; l++) {
        kiln_nn_block *b = &g->h[l];
        b->ln_1.C = b->ln_2.C = g->C;
        b->attn.C = g->C;
        b->attn.NH = g->n_head;
        b->attn.c_attn = (kiln_nn_linear){.in = g->C, .out = 3 * g->C, .layout = KILN_NN_IN_OUT, .act = -1};
        b->attn.c_proj = (kiln_nn_linear){.in = g->C, .out = g->C, .layout = KILN_NN_IN_OUT, .act = -1};
        b->mlp.c_fc = (kiln_nn_linear){.in = g->C, .out = 4 * g->C, .layout = KILN_NN_IN_OUT, .act = KILN_ACT_GELU};
        b->mlp.c_proj = (kiln_nn_linear){.in = 4 * g->C, .out = g->C, .layout = KILN_NN_IN_OUT, .act = -1};
    }
    g->ln_f.C = g->C;
    /* activations in 16 bits where autocast keeps them, in bf16-mixed (16-mixed
     * keeps float32: its classifier's unit-scale gradients are float32
     * products, which a float16 input would round) */
    g->ctx.act16 = KILN_NN_ACT16_BF16;
    /* each projection's bias joins the product in the compute dtype, as
     * autocast casts it (both mixed precisions): y = bf16(x W + bf16(b)) */
    g->ctx.round_bias = 1;
    /* the arena's size for float32 (the log line, and a size_t overflow
     * refused here); gpt_plan allocates it once the dtypes are known */
    rc = gpt_measure_arena(g, KILN_DTYPE_F32, KILN_DTYPE_F32);
    if (rc != KILN_OK) goto fail;

    rc = gpt_register(g);
    if (rc != KILN_OK) goto fail;

    kiln_logf(svc, hctx, KILN_LOG_INFO,
              "gpt: %d layers, %d heads, n_embd %d, block_size %d, vocab %d (logits stride %d): %lld parameters, "
              "%.3g training FLOPs per token at T = %d; activation arena %.1f MiB (fp32); classifier chunks of %d "
              "rows",
              g->n_layer, g->n_head, g->C, g->block_size, g->V, g->Vp, (long long)gpt_num_params(g),
              gpt_flops_per_token(g, g->block_size, 0), g->block_size, (double)g->arena_bytes / 1048576.0, g->chunk);
    *out = (kiln_instance *)g;
    return KILN_OK;
fail:
    gpt_destroy((kiln_instance *)g);
    return rc;
}

/* ---------------------------------------------------------------------------
 * init_weights: GPT-2's initialisation from one deterministic stream. */

/* A standard normal from the stream (Marsaglia's polar method: only sqrt,
 * which IEEE rounds exactly, and log, so the draws are the same on every
 * libc whose log is correctly rounded). */
static double gpt_normal(kiln_rng *r) {
    for (;;) {
        const double u = (double)(kiln_rng_next(r) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
        const double v = (double)(kiln_rng_next(r) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
        const double s = u * u + v * v;
        if (s > 0.0 && s < 1.0) return u * sqrt(-2.0 * log(s) / s); /* the second normal is dropped */
    }
}

static int32_t gpt_init_weights(kiln_instance *self, uint64_t seed) {
    gpt *g = (gpt *)self;
    const kiln_kernels *k = g->k;
    for (uint32_t i = 0; i < g->nparams; i++)
        if (!g->params[i]->data || !g->params[i]->grad)
            return gpt_fail(g, KILN_E_STATE, "gpt: init_weights before the host allocated %s", g->params[i]->name);
    const uint32_t pdt = kiln_param_dtype(g->params[0]);
    if (pdt != KILN_DTYPE_F32 && pdt != KILN_DTYPE_F64)
        return gpt_fail(g, KILN_E_UNSUPPORTED, "gpt: master weights in %s; this module supports float32 and float64",
                        kiln_dtype_name(pdt));
    const size_t esz = kiln_dtype_size(pdt); /* the arena waits for gpt_plan */

    /* Values are drawn as fp32 (what a 32-true run starts from) in a host
     * buffer sized for the largest tensor, widened for fp64 masters, and
     * copied over: a 64-true run starts from the same weights. */
    size_t maxn = 0;
    for (uint32_t i = 0; i < g->nparams; i++)
        if ((size_t)g->params[i]->numel > maxn) maxn = (size_t)g->params[i]->numel;
    float *stage = malloc(maxn * sizeof *stage);
    double *stage64 = pdt == KILN_DTYPE_F64 ? malloc(maxn * sizeof *stage64) : NULL;
    if (!stage || (pdt == KILN_DTYPE_F64 && !stage64)) {
        free(stage);
        free(stage64);
        return gpt_fail(g, KILN_E_NOMEM, "gpt: cannot allocate %zu values to stage init", maxn);
    }
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    int32_t rc = KILN_OK;
    for (uint32_t i = 0; i < g->nparams && rc == KILN_OK; i++) {
        kiln_parameter *p = g->params[i];
        const size_t n = (size_t)p->numel;
        for (size_t j = 0; j < n; j++)
            stage[j] = g->init_kind[i] == GPT_INIT_NORMAL ? (float)(g->init_scale[i] * gpt_normal(&rng))
                       : g->init_kind[i] == GPT_INIT_ONES ? 1.0f
                                                          : 0.0f;
        if (stage64)
            for (size_t j = 0; j < n; j++) stage64[j] = (double)stage[j];
        rc = k->copy(g->acc, p->data, stage64 ? (const void *)stage64 : (const void *)stage, n * esz, KILN_COPY_H2D);
        if (rc == KILN_OK) rc = k->zero(g->acc, p->grad, n * esz);
        if (rc != KILN_OK) rc = gpt_fail(g, rc, "gpt: writing %s failed (%s)", p->name, kiln_strerror(rc));
    }
    free(stage);
    free(stage64);
    g->have_train_forward = 0;
    return rc;
}

/* ---------------------------------------------------------------------------
 * Forward */

/* A token tensor (B, T) I32 of the batch (`which`: "inputs" / "targets"). */
static int32_t gpt_check_tokens(gpt *g, const kiln_tensor *t, const char *step, const char *which, int64_t B,
                                int64_t *T) {
    if (t->dtype != KILN_DTYPE_I32 || t->ndim != 2 || !t->data)
        return gpt_fail(g, KILN_E_DATA, "gpt: %s expects %s as an int32 tensor (B, T), got %s with %u dims", step,
                        which, kiln_dtype_name(t->dtype), (unsigned)t->ndim);
    if (t->shape[0] < B)
        return gpt_fail(g, KILN_E_DATA, "gpt: %s: %s have %lld rows but the batch size is %lld", step, which,
                        (long long)t->shape[0], (long long)B);
    *T = t->shape[1];
    return KILN_OK;
}

/* Checks the batch (inputs and targets (B, T) int32, 1 <= B <= max_batch,
 * 1 <= T <= block_size, token ids in [0, vocab_size), targets in [-1,
 * vocab_size)), counts the targets that are not -1 (from host memory: the
 * loss divides by it before any kernel runs) and copies both to the
 * accelerator. */
static int32_t gpt_stage_batch(gpt *g, const kiln_batch *batch, const char *step, int32_t *B_out, int32_t *T_out) {
    if (!batch || batch->ntensors < 2 || !batch->tensors)
        return gpt_fail(g, KILN_E_DATA, "gpt: %s expects a batch of 2 tensors (inputs, targets), got %u", step,
                        batch ? (unsigned)batch->ntensors : 0u);
    const int64_t B = batch->size;
    if (B < 1) return gpt_fail(g, KILN_E_DATA, "gpt: %s got an empty batch (size %lld)", step, (long long)B);
    if (B > g->max_batch)
        return gpt_fail(g, KILN_E_DATA, "gpt: %s got a batch of %lld sequences but max_batch is %d (raise gpt.max_batch)",
                        step, (long long)B, g->max_batch);
    int64_t T = 0, Ty = 0;
    int32_t rc = gpt_check_tokens(g, &batch->tensors[0], step, "inputs", B, &T);
    if (rc == KILN_OK) rc = gpt_check_tokens(g, &batch->tensors[1], step, "targets", B, &Ty);
    if (rc != KILN_OK) return rc;
    if (Ty != T)
        return gpt_fail(g, KILN_E_DATA, "gpt: %s: inputs have T = %lld positions but targets have %lld", step,
                        (long long)T, (long long)Ty);
    if (T < 1 || T > g->block_size)
        return gpt_fail(g, KILN_E_DATA, "gpt: %s: sequence length T = %lld must be in [1, block_size = %d]", step,
                        (long long)T, g->block_size);
    const int32_t *x = batch->tensors[0].data, *y = batch->tensors[1].data;
    const int64_t n = B * T;
    int64_t valid = 0;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] < 0 || x[i] >= g->V)
            return gpt_fail(g, KILN_E_DATA,
                            "gpt: %s: inputs[%lld][%lld] = %d is not a token id: vocab_size is %d", step,
                            (long long)(i / T), (long long)(i % T), (int)x[i], g->V);
        if (y[i] < -1 || y[i] >= g->V)
            return gpt_fail(g, KILN_E_DATA,
                            "gpt: %s: targets[%lld][%lld] = %d is outside [0, vocab_size = %d) and not -1 (ignore)",
                            step, (long long)(i / T), (long long)(i % T), (int)y[i], g->V);
        valid += y[i] >= 0;
    }
    GPT_K(g, g->k->copy(g->acc, g->tokens, x, (size_t)n * sizeof(int32_t), KILN_COPY_H2D), step, "copy (inputs)");
    GPT_K(g, g->k->copy(g->acc, g->targets, y, (size_t)n * sizeof(int32_t), KILN_COPY_H2D), step, "copy (targets)");
    g->n_valid = valid;
    *B_out = (int32_t)B;
    *T_out = (int32_t)T;
    return KILN_OK;
}

/* The dtypes of this step from the parameters the precision set up;
 * allocates the arena at the first call and lays it out again when the
 * masters' dtype or the activations' storage changed since. */
static int32_t gpt_plan(gpt *g, const char *step) {
    int32_t rc = kiln_nn_ctx_setup(&g->ctx, g->params, g->nparams);
    if (rc != KILN_OK) return gpt_fail(g, rc, "gpt: %s: %s", step, g->ctx.msg);
    const uint32_t sdt = kiln_nn_sdt(&g->ctx);
    if (!g->arena || g->ctx.adt != g->adt || sdt != g->sdt) rc = gpt_alloc_arena(g, g->ctx.adt, sdt);
    if (rc == KILN_OK && sdt != g->sdt_logged) { /* once per change: the precision decides it after create() */
        /* and who rounds the biases (kiln_nn_ctx.round_bias): the
         * accelerator where its table says it can (ABI 1.8), else kiln/nn.h */
        char biases[160] = "";
        if (g->ctx.rdt != KILN_DTYPE_F32 && g->ctx.adt == KILN_DTYPE_F32)
            snprintf(biases, sizeof biases, "; biases added in %s, rounded by the %s", kiln_dtype_name(g->ctx.rdt),
                     (g->k->flags & KILN_KERNELS_BIAS_ROUND)
                         ? "accelerator"
                         : "module (the accelerator's table lacks KILN_KERNELS_BIAS_ROUND, ABI 1.8)");
        kiln_logf(g->svc, g->hctx, KILN_LOG_DEBUG, "gpt: activations stored in %s%s; activation arena %.1f MiB%s",
                  kiln_dtype_name(sdt),
                  sdt == g->ctx.adt && g->ctx.rdt == KILN_DTYPE_BF16
                      ? " (the accelerator's table lacks KILN_KERNELS_ACT_16BIT, ABI 1.7)"
                      : "",
                  (double)g->arena_bytes / 1048576.0, biases);
        kiln_logf(g->svc, g->hctx, KILN_LOG_DEBUG, "gpt: %s; %s",
                  kiln_nn_has_add_ln(&g->ctx)
                      ? "residual adds fused with the layer norms after them"
                      : "residual adds and layer norms apart (the accelerator's table lacks add_layernorm_forward, "
                        "ABI 1.10)",
                  kiln_nn_has_act_bias(&g->ctx) && kiln_nn_has_ln_cast(&g->ctx)
                      ? "GELU backward fused with c_fc's bias gradient, layer norm backwards with the 16-bit copies "
                        "of their gradients"
                      : "GELU backward and bias gradients apart (the accelerator's table lacks act_bias_backward and "
                        "layernorm_backward_cast, ABI 1.11)");
        g->sdt_logged = sdt;
    }
    return rc;
}

/* tokens (B*T, already on the accelerator) -> g->ln_f.y (B*T, C). */
static int32_t gpt_trunk(gpt *g, int32_t B, int32_t T, const char *step) {
    kiln_nn_ctx *c = &g->ctx;
    int32_t rc = kiln_nn_embedding_forward(c, &g->emb, g->tokens, B, T);
    /* the residual stream from the embedding's output through every block
     * into ln_f, each residual add fused with its layer norm (ABI 1.10) */
    if (rc == KILN_OK) rc = kiln_nn_blocks_forward(c, g->h, g->n_layer, g->emb.y, B, T, &g->ln_f);
    return rc != KILN_OK ? gpt_nn_fail(g, rc, step) : KILN_OK;
}

/* The dtype the classifier's logits are stored in: bfloat16 in bf16-mixed
 * on a table with 16-bit storage (ABI 1.6), else the activations'. */
static uint32_t gpt_logits_dtype(const gpt *g) {
    if (g->ctx.adt == KILN_DTYPE_F32 && g->ctx.rdt == KILN_DTYPE_BF16 && (g->k->flags & KILN_KERNELS_STORE_16BIT))
        return KILN_DTYPE_BF16;
    return g->ctx.adt;
}

/* The classifier and the loss over N = B*T rows of g->ln_f.y, chunk by
 * chunk: logits(rows, Vp) = xf . wte^T (rounded like any matmul output;
 * columns [V, Vp) are never written), then xent_fused. With `train`, the
 * chunk's logits become their unit gradient (grad_scale = 1 / n_valid, the
 * mean's factor) and are folded at once into
 *   dx_unit(chunk rows, C) = dlogits . wte       (the input gradient)
 *   dwte_unit(V, C)       += dlogits^T . xf      (the tied weight's)
 * which backward(dloss) scales. In bf16-mixed both are bfloat16 matmuls
 * (gemm_ex rounds dlogits and the product through bf16, as autocast's
 * matmul backward does, and an accelerator with tensor cores runs them
 * there: two thirds of the classifier's FLOPs). In 16-mixed they stay
 * float32, with wte's float16 values widened into wte32 (gemm_ex would
 * round an F32 operand beside an F16 one): at unit scale float16 would
 * flush the unit gradients to zero, which the loss scale exists to
 * prevent; backward rounds dloss * dx_unit instead. *loss_sum is the sum
 * over valid rows (the mean divides).
 *
 * In bf16-mixed the logits are stored in bfloat16 where the table allows
 * it (KILN_KERNELS_STORE_16BIT, ABI 1.6), as autocast stores them: the
 * logits GEMM writes them rounded, xent_fused reads them widened and writes
 * the gradient rounded, and the backward products read it as it is. The
 * values are the float32 path's bit for bit (that path rounds the same
 * logits, and the backward products round the same gradient as operands),
 * with about a third of the classifier's memory traffic: no rounding pass,
 * no operand conversions, and half the bytes each time the logits are
 * read or written. */
static int32_t gpt_classifier(gpt *g, int32_t N, int train, double *loss_sum, const char *step) {
    const kiln_kernels *k = g->k;
    kiln_instance *acc = g->acc;
    const uint32_t adt = g->ctx.adt;
    const kiln_parameter *wte = g->emb.wte;
    const size_t esz = g->esz, C = (size_t)g->C;
    const char *xf = g->ln_f.y; /* (N, C) in g->sdt, the activations' storage */
    const uint32_t brt = g->ctx.rdt == KILN_DTYPE_BF16 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32; /* the backward's */
    const uint32_t ldt = gpt_logits_dtype(g); /* the logits' storage */
    if (ldt != g->logits_logged) { /* once per change: the precision decides it after create() */
        kiln_logf(g->svc, g->hctx, KILN_LOG_DEBUG, "gpt: classifier logits stored in %s%s", kiln_dtype_name(ldt),
                  ldt == KILN_DTYPE_F32 && g->ctx.rdt == KILN_DTYPE_BF16
                      ? " (the accelerator's table lacks KILN_KERNELS_STORE_16BIT, ABI 1.6)"
                      : "");
        g->logits_logged = ldt;
    }
    const double grad_scale = train && g->n_valid > 0 ? 1.0 / (double)g->n_valid : 0.0;
    *loss_sum = 0.0;
    if (train && g->n_valid == 0) { /* nothing to learn from: zero unit gradients */
        GPT_K(g, k->zero(acc, g->dx_unit, (size_t)N * C * esz), step, "zero (dx_unit)");
        GPT_K(g, k->zero(acc, g->dwte_unit, (size_t)g->V * C * esz), step, "zero (dwte_unit)");
        return KILN_OK;
    }
    /* the input gradient's weight operand: wte as the forward saw it */
    const void *wb = wte->compute;
    uint32_t wbt = wte->compute_dtype;
    if (train && brt == KILN_DTYPE_F32 && (wbt == KILN_DTYPE_F16 || wbt == KILN_DTYPE_BF16)) {
        const size_t nw = (size_t)g->V * C;
        if (!g->wte32) {
            void *p = NULL;
            int32_t rc = k->alloc(acc, nw * sizeof(float), &p);
            if (rc != KILN_OK || !p)
                return gpt_fail(g, rc != KILN_OK ? rc : KILN_E_NOMEM,
                                "gpt: %s: cannot allocate the %zu-byte float32 copy of wte for the classifier", step,
                                nw * sizeof(float));
            g->wte32 = p;
        }
        GPT_K(g, k->cast(acc, g->wte32, KILN_DTYPE_F32, wb, wbt, nw), step, "cast (wte to float32)");
        wb = g->wte32;
        wbt = KILN_DTYPE_F32;
    }
    for (int32_t r0 = 0; r0 < N; r0 += g->chunk) {
        const int32_t rows = N - r0 < g->chunk ? N - r0 : g->chunk;
        const void *x = xf + (size_t)r0 * C * g->asz; /* (rows, C) */
        GPT_K(g,
              k->gemm_ex(acc, 0, 1, rows, g->V, g->C, 1.0, x, g->sdt, g->C, wte->compute, wte->compute_dtype, g->C, 0.0,
                         g->logits, ldt, g->Vp, g->ctx.rdt),
              step, "gemm_ex (logits)");
        double ls = 0.0;
        int32_t rc = k->xent_fused(acc, ldt, g->logits, g->targets + r0, rows, g->V, g->Vp, grad_scale, &ls);
        if (rc == KILN_E_DATA)
            return gpt_fail(g, rc, "gpt: %s: a target is outside [0, vocab_size = %d) and not -1", step, g->V);
        if (rc != KILN_OK) return gpt_fail(g, rc, "gpt: %s: kernel xent_fused failed: %s", step, kiln_strerror(rc));
        *loss_sum += ls;
        if (!train) continue;
        GPT_K(g,
              k->gemm_ex(acc, 0, 0, rows, g->C, g->V, 1.0, g->logits, ldt, g->Vp, wb, wbt, g->C, 0.0,
                         (char *)g->dx_unit + (size_t)r0 * C * esz, adt, g->C, brt),
              step, "gemm_ex (classifier input grad)");
        GPT_K(g,
              k->gemm_ex(acc, 1, 0, g->V, g->C, rows, 1.0, g->logits, ldt, g->Vp, x, g->sdt, g->C, r0 == 0 ? 0.0 : 1.0,
                         g->dwte_unit, adt, g->C, brt),
              step, "gemm_ex (classifier weight grad)");
    }
    return KILN_OK;
}

/* A whole forward on a batch: *loss = the mean cross-entropy over the
 * targets that are not -1 (0 when there is none). */
static int32_t gpt_forward(gpt *g, const kiln_batch *batch, const char *step, int train, double *loss) {
    int32_t B = 0, T = 0;
    /* the plan first: it may lay the arena out again, tokens included */
    int32_t rc = gpt_plan(g, step);
    if (rc == KILN_OK) rc = gpt_stage_batch(g, batch, step, &B, &T);
    if (rc == KILN_OK) rc = gpt_trunk(g, B, T, step);
    double loss_sum = 0.0;
    if (rc == KILN_OK) rc = gpt_classifier(g, B * T, train, &loss_sum, step);
    if (rc != KILN_OK) return rc;
    g->B = B;
    g->T = T;
    *loss = g->n_valid > 0 ? loss_sum / (double)g->n_valid : 0.0;
    return KILN_OK;
}

/* The step's result. out->struct_size is the host's: the 1.4 throughput
 * fields are written only when its struct has them. */
static void gpt_fill_output(const gpt *g, kiln_step_output *out, double loss, int train) {
    if (!out) return;
    out->has_loss = 1;
    out->loss = loss;
    out->batch_size = g->B;
#ifdef KILN_STEP_OUTPUT_SIZE_1_4
    if (train && out->struct_size >= KILN_STEP_OUTPUT_SIZE_1_4) {
        const double tokens = (double)g->B * (double)g->T;
        out->tokens = (int64_t)g->B * g->T;
        out->flops = tokens * gpt_flops_per_token(g, g->T, 0);
    }
#else
    (void)train;
#endif
}

static int32_t gpt_training_step(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx,
                                 kiln_step_output *out) {
    gpt *g = (gpt *)self;
    (void)batch_idx;
    g->have_train_forward = 0;
    double loss = 0.0;
    int32_t rc = gpt_forward(g, batch, "training_step", 1, &loss);
    if (rc != KILN_OK) return rc;
    g->have_train_forward = 1;
    gpt_fill_output(g, out, loss, 1);
    /* Weighted by the tokens that count, so the epoch mean is the mean over
     * tokens; a batch whose targets are all -1 has no loss to log. */
    if (g->svc->log_value && g->n_valid > 0)
        g->svc->log_value(g->hctx, "train_loss", loss, KILN_LOG_ON_STEP | KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR,
                          (double)g->n_valid);
    return KILN_OK;
}

/* validation_step / test_step: forward only (the train activations are
 * overwritten, so a backward must not follow). The perplexity is logged at
 * the epoch's end, from the epoch's token-weighted mean loss. */
static int32_t gpt_eval_step(gpt *g, const kiln_batch *batch, kiln_step_output *out, const char *step,
                             const char *loss_name) {
    g->have_train_forward = 0;
    double loss = 0.0;
    int32_t rc = gpt_forward(g, batch, step, 0, &loss);
    if (rc != KILN_OK) return rc;
    gpt_fill_output(g, out, loss, 0);
    g->eval_loss_sum += loss * (double)g->n_valid;
    g->eval_count += (double)g->n_valid;
    if (g->svc->log_value && g->n_valid > 0)
        g->svc->log_value(g->hctx, loss_name, loss, KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR, (double)g->n_valid);
    return KILN_OK;
}

static int32_t gpt_validation_step(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx,
                                   kiln_step_output *out) {
    (void)batch_idx;
    return gpt_eval_step((gpt *)self, batch, out, "validation_step", "val_loss");
}

static int32_t gpt_test_step(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx, kiln_step_output *out) {
    (void)batch_idx;
    return gpt_eval_step((gpt *)self, batch, out, "test_step", "test_loss");
}

/* Epoch starts reset the evaluation sums; epoch ends log the perplexity
 * exp(mean loss), summed over the ranks first (every rank gets the same
 * event, so the collective lines up). */
static int32_t gpt_on_event(kiln_instance *self, kiln_event *ev) {
    gpt *g = (gpt *)self;
    const char *name = NULL;
    switch (ev->id) {
    case KILN_EV_ON_VALIDATION_EPOCH_START:
    case KILN_EV_ON_TEST_EPOCH_START:
        g->eval_loss_sum = g->eval_count = 0.0;
        return KILN_OK;
    case KILN_EV_ON_VALIDATION_EPOCH_END: name = "val_ppl"; break;
    case KILN_EV_ON_TEST_EPOCH_END: name = "test_ppl"; break;
    default: return KILN_OK;
    }
    double sums[2] = {g->eval_loss_sum, g->eval_count};
    if (g->svc->abi_minor >= 2 && g->svc->reduce) {
        int32_t rc = g->svc->reduce(g->hctx, sums, 2, KILN_REDUCE_SUM);
        if (rc != KILN_OK)
            return gpt_fail(g, rc, "gpt: summing the %s loss over the ranks failed (%s)", name, kiln_strerror(rc));
    }
    if (sums[1] > 0 && g->svc->log_value) g->svc->log_value(g->hctx, name, exp(sums[0] / sums[1]), KILN_LOG_ON_EPOCH, 1.0);
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Backward: gradients of dloss * (last training loss), ADDED to p->grad.
 * It reads only what the forward left (the unit classifier gradients and
 * the layers' activations) and writes only the scratch buffers and the
 * grads, so every call adds dloss times the same gradients again. */

static int32_t gpt_backward(kiln_instance *self, double dloss) {
    gpt *g = (gpt *)self;
    const kiln_kernels *k = g->k;
    kiln_nn_ctx *c = &g->ctx;
    const char *step = "backward";
    if (!g->have_train_forward)
        return gpt_fail(g, KILN_E_STATE, "gpt: backward called without a preceding training_step");
    const int32_t N = g->B * g->T;
    const size_t nC = (size_t)N * (size_t)g->C;
    void *d_lnf = g->scratch.d_ln; /* (N, C) gradient at ln_f's output, in g->sdt */

    /* The classifier: d(xf) = dloss * dx_unit, rounded where the autocast
     * matmul's output would be (the loss scale's overflow shows up here).
     * With 16-bit activations the product is formed in dres (free until
     * ln_f's backward writes it) and the cast into d_lnf is the rounding. */
    const int s16 = g->sdt != c->adt;
    void *prod = s16 ? g->dres : d_lnf; /* where dloss * dx_unit is formed, in adt */
    GPT_K(g, k->copy(g->acc, prod, g->dx_unit, nC * g->esz, KILN_COPY_D2D), step, "copy (dx_unit)");
    GPT_K(g, k->scale_ex(g->acc, c->adt, prod, dloss, nC), step, "scale_ex (dx_unit)");
    if (s16) GPT_K(g, k->cast(g->acc, d_lnf, g->sdt, prod, c->adt, nC), step, "cast (ln_f output grad)");
    int32_t rc = kiln_nn_round(c, d_lnf, nC, "transformer.ln_f"); /* a no-op for 16-bit storage */
    if (rc == KILN_OK) rc = kiln_nn_blocks_backward(c, g->h, g->n_layer, g->dres, &g->scratch, &g->ln_f, d_lnf);
    if (rc == KILN_OK) rc = kiln_nn_embedding_backward(c, &g->emb, g->dres);
    if (rc != KILN_OK) return gpt_nn_fail(g, rc, step);
    void *dwte = kiln_nn_grad(g->emb.wte);
    if (dwte)
        GPT_K(g, k->axpy_ex(g->acc, c->adt, dwte, dloss, g->dwte_unit, (size_t)g->V * (size_t)g->C), step,
              "axpy_ex (tied wte grad)");
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * predict_step: the logits of the last position, (1, vocab_size) F32. */

static int32_t gpt_predict_step(kiln_instance *self, const kiln_batch *batch, kiln_tensor *out) {
    gpt *g = (gpt *)self;
    const kiln_kernels *k = g->k;
    const char *step = "predict_step";
    g->have_train_forward = 0; /* the activations are about to be overwritten */
    if (!batch || batch->ntensors < 1 || !batch->tensors || !out)
        return gpt_fail(g, KILN_E_DATA, "gpt: predict_step expects a batch with a tokens tensor (1, t)");
    const kiln_tensor *t = &batch->tensors[0];
    if (t->dtype != KILN_DTYPE_I32 || t->ndim < 1 || t->ndim > 2 || !t->data || (t->ndim == 2 && t->shape[0] != 1))
        return gpt_fail(g, KILN_E_DATA, "gpt: predict_step expects tokens as an int32 tensor (1, t), got %s with %u dims",
                        kiln_dtype_name(t->dtype), (unsigned)t->ndim);
    const int64_t len = t->shape[t->ndim - 1];
    if (len < 1) return gpt_fail(g, KILN_E_DATA, "gpt: predict_step got no tokens");
    /* The model sees at most block_size positions: the last ones. */
    const int32_t T = len > g->block_size ? g->block_size : (int32_t)len;
    const int32_t *tok = (const int32_t *)t->data + (len - T);
    for (int32_t i = 0; i < T; i++)
        if (tok[i] < 0 || tok[i] >= g->V)
            return gpt_fail(g, KILN_E_DATA, "gpt: predict_step: token %d at position %lld is not a token id: vocab_size is %d",
                            (int)tok[i], (long long)(len - T + i), g->V);
    int32_t rc = gpt_plan(g, step); /* first: it may lay the arena out again */
    if (rc != KILN_OK) return rc;
    GPT_K(g, k->copy(g->acc, g->tokens, tok, (size_t)T * sizeof(int32_t), KILN_COPY_H2D), step, "copy (tokens)");
    rc = gpt_trunk(g, 1, T, step);
    if (rc != KILN_OK) return rc;
    const kiln_parameter *wte = g->emb.wte;
    const uint32_t adt = g->ctx.adt;
    const void *x = (const char *)g->ln_f.y + (size_t)(T - 1) * (size_t)g->C * g->asz; /* (1, C) in sdt */
    GPT_K(g,
          k->gemm_ex(g->acc, 0, 1, 1, g->V, g->C, 1.0, x, g->sdt, g->C, wte->compute, wte->compute_dtype, g->C, 0.0,
                     g->logits, adt, g->V, g->ctx.rdt),
          step, "gemm_ex (logits)");
    const void *src = g->logits;
    if (adt != KILN_DTYPE_F32) {
        GPT_K(g, k->cast(g->acc, g->pred32, KILN_DTYPE_F32, g->logits, adt, (size_t)g->V), step, "cast (logits)");
        src = g->pred32;
    }
    GPT_K(g, k->copy(g->acc, g->pred_host, src, (size_t)g->V * sizeof(float), KILN_COPY_D2H), step, "copy (logits)");
    *out = (kiln_tensor){g->pred_host, KILN_DTYPE_F32, 2, {1, g->V, 1, 1}};
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Descriptor */

static const kiln_module_ops gpt_ops = {
    .base = {sizeof(kiln_module_ops), 0, gpt_create, gpt_destroy, NULL, NULL},
    .init_weights = gpt_init_weights,
    .training_step = gpt_training_step,
    .backward = gpt_backward,
    .validation_step = gpt_validation_step,
    .test_step = gpt_test_step,
    .on_event = gpt_on_event,
    .predict_step = gpt_predict_step,
};

/* Master dtypes this module handles (host/stack_checks.c reads it). */
static const char *const gpt_param_dtypes[] = {"float32", "float64"};
/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const gpt_checks[] = {"n_layer in [1, 2147483647]", "n_head in [1, 2147483647]", "n_embd in [1, 2147483647]", "block_size in [1, 2147483647]", "vocab_size in [1, 2147483647]", "padded_vocab_size >= 0", "max_batch in [1, 2147483647]", "classifier_chunk in [0, 2147483647]", "layer_norm_epsilon > 0", "initializer_range >= 0"};
static const kiln_kv gpt_props[] = {
    {"param_dtypes", KILN_V_STRS(gpt_param_dtypes)},
    {"config_checks", KILN_V_STRS(gpt_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc gpt_desc = {
    sizeof(kiln_plugin_desc),
    KILN_KIND_MODULE,
    "gpt",
    GPT_VERSION,
    "GPT-2 language model (Hugging Face GPT2LMHeadModel's parameters); explicit forward/backward over kiln/nn.h",
    0,
    gpt_props,
    gpt_params,
    &gpt_ops,
    NULL,
};

KILN_DEFINE_LIBRARY("gpt", GPT_VERSION, 1, &gpt_desc)
