/*
 * kiln/nn.h — a small header-only layer library over the accelerator's
 * kernel table (struct kiln_kernels), for module plugins that build a
 * transformer (GPT, a BERT encoder, a ViT) without re-deriving the backward
 * math. Each layer has:
 *
 *   _register  declares its parameters with the host, in PyTorch's state
 *              dict order and naming ("<prefix>.weight", "<prefix>.bias");
 *   _plan      carves its activation buffers out of ONE arena, for a
 *              maximum number of rows fixed at setup (two passes over the
 *              same plan: measure with a NULL base, then assign);
 *   _forward   computes from the parameters' compute copies and keeps what
 *              its backward needs (nothing is allocated per step);
 *   _backward  ADDS the parameter gradients to p->grad (so gradient
 *              accumulation and repeated backward calls work) and writes or
 *              adds the input gradient.
 *
 * Precision follows the ABI's autocast emulation (docs/precision.md): every
 * activation is stored in the master dtype (kiln_nn_ctx.adt: F32, or F64
 * under a float64 precision), matrix weights are read in their compute dtype
 * (p->compute, p->compute_dtype: F16/BF16 under the mixed precisions), and
 * every matmul output (and everything that feeds a matmul: layer norm and
 * attention outputs, activations) is rounded once through kiln_nn_ctx.rdt,
 * which is what storing it in that format would keep. Vectors (biases, layer
 * norm weights) and embedding tables are read from the master copy unless a
 * compute copy exists in the activation dtype: autocast adds a bias in the
 * fp32 accumulator and runs layer norm and embeddings in fp32. (Autocast
 * also casts a Linear's bias to the compute dtype first; a module that sets
 * kiln_nn_ctx.round_bias, ABI 1.8, gets that too.)
 *
 * Rows: a (B, T, C) activation is a (rows = B*T, C) row-major matrix. Every
 * shape below is (rows, features) unless it says otherwise; `max_rows` is
 * what the plan reserved and every forward checks rows <= max_rows is the
 * caller's job (the plan cannot see the batch).
 *
 * Kernels used: gemm_ex, bias_add_ex, bias_grad_ex, act_forward/backward,
 * round_to (1.2); linear_forward (1.3, used when present and the layout is
 * nn.Linear's); embedding_*, layernorm_*, attention_*, add (1.4);
 * linear_forward_layout (1.6, used for both layouts when present: Conv1D
 * layers get the fused epilogue too, with the same bits; with
 * KILN_LAYOUT_ROUND_BIAS where the table sets KILN_KERNELS_BIAS_ROUND, 1.8,
 * and copy + round_to of the bias elsewhere, for round_bias). Check the
 * table once with kiln_nn_kernels_missing(). The Linear alone also runs on
 * a 1.1 table in fp32 (gemm, bias_add, relu/gelu: the same bits on the
 * cpu), which is how the `mlp` module, built on it, still trains on an old
 * accelerator. The attention kernel is causal
 * (GPT); a bidirectional encoder needs a non-causal kernel the ABI does not
 * have yet.
 *
 * 16-bit activation storage (ABI 1.7): a module that sets kiln_nn_ctx.act16
 * before kiln_nn_ctx_setup gets the activations autocast stores in 16 bits
 * (each Linear's input, output and activation, the layer norms' outputs,
 * the attention's qkv and output, and the gradients at all of these) stored
 * in rdt itself, where the accelerator's table sets KILN_KERNELS_ACT_16BIT
 * and KILN_KERNELS_STORE_16BIT: half the bytes and no rounding passes, the
 * same values. kiln_nn_ctx.sdt then says which dtype those buffers are in
 * (adt otherwise); the residual stream, the statistics and the gradients of
 * the parameters stay in adt. Plan the buffers with kiln_nn_act_size().
 *
 * Activations a precision rounds itself (ABI 1.5, e.g. FP8): when the
 * module sets kiln_nn_ctx.svc and .hctx, every Linear's output (what the
 * next layer reads: the activation's output, or y without one) and every
 * attention output go through svc->round_activation after the rounding
 * above, named by the Linear's weight ("<c_attn weight>:attention"); the
 * precision decides the format and scale. Without svc, or with a precision
 * that has no round_activation (every built-in one), nothing changes.
 *
 * Errors: every function returns a kiln_status; on failure ctx->msg names
 * the kernel and the parameter or layer ("gemm_ex (input grad) on
 * transformer.h.3.mlp.c_fc.weight: ..."), for the module to pass to
 * svc->set_error with its own prefix.
 */
#ifndef KILN_NN_H
#define KILN_NN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln/plugin.h"
#include "kiln/status.h"
#include "kiln/tensor.h"
#include "kiln/training.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Context: what every call computes with, set for the current step. */

typedef struct kiln_nn_ctx {
    kiln_instance *acc;     /* the accelerator instance                        */
    const kiln_kernels *k;  /* its kernel table                                */
    uint32_t adt;           /* activation = master = gradient dtype: F32, F64  */
    uint32_t rdt;           /* rounding dtype: F32 (none), F16 or BF16 (adt F32) */
    char msg[256];          /* detail of the last failure                      */
    /* 1.5: the host, for svc->round_activation (the precision's rounding
     * of activations); both NULL (a zeroed ctx): no such call */
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    /* Scratch the next kiln_nn_linear_backward may hold a 16-bit copy of
     * its dy in (dy16_bytes long), so that its two products read dy in
     * their dtype instead of each converting it: set by the composite
     * layers below from kiln_nn_scratch, taken (and cleared) by that call.
     * NULL (a zeroed ctx): no copy. */
    void *dy16;
    size_t dy16_bytes;
    /* 1.7: which reduced dtypes the module lets activations be STORED in
     * (KILN_NN_ACT16_*; 0, a zeroed ctx: none), and the storage dtype
     * kiln_nn_ctx_setup chose from it: rdt where the module allows it and
     * the table has 16-bit activation storage, else adt. Buffers marked
     * "activation" below are in sdt. */
    uint32_t act16;
    uint32_t sdt;
    /* 1.8: 1 adds each Linear's bias rounded through rdt, as autocast casts
     * a Linear's bias to the compute dtype with its other inputs:
     * y = rdt(x . W + rdt(b)). 0 (a zeroed ctx, every 1.7 module): the
     * float32 bias joins the product unrounded. Where the table sets
     * KILN_KERNELS_BIAS_ROUND the accelerator rounds it (a GPU then adds it
     * in the GEMM's epilogue and writes 16-bit activations directly);
     * elsewhere the layer rounds a copy (kiln_nn_linear.bq), with the same
     * result. Nothing changes without a reduced rdt. */
    int round_bias;
    /* 1.11: ready16 holds rdt(ready16_of), written beside a residual
     * gradient by kiln_nn_layernorm_backward_cast; the very next
     * kiln_nn_linear_backward_dt clears both, and reads the copy instead
     * of casting dy where its dy is ready16_of and its dy16 is ready16.
     * NULL (a zeroed ctx): no copy. */
    void *ready16;
    const void *ready16_of;
} kiln_nn_ctx;

/* kiln_nn_ctx.act16 bits */
#define KILN_NN_ACT16_BF16 (1u << 0)
#define KILN_NN_ACT16_F16 (1u << 1)

/* Bytes per element of the activation buffers for storage dtype sdt (what
 * the _plan functions' `asz` takes): the dtype's size. */
static inline size_t kiln_nn_act_size(uint32_t sdt) { return kiln_dtype_size(sdt); }

/* Reports a failed kernel call in ctx->msg and returns its status. */
static inline int32_t kiln_nn__fail(kiln_nn_ctx *c, int32_t rc, const char *kernel, const char *on) {
    snprintf(c->msg, sizeof c->msg, "%s on %s: %s", kernel, on ? on : "?", kiln_strerror(rc));
    return rc;
}
#define KILN_NN__K(c, call, kernel, on)                                                                  \
    do {                                                                                                 \
        int32_t kiln_nn_rc_ = (call);                                                                    \
        if (kiln_nn_rc_ != KILN_OK) return kiln_nn__fail((c), kiln_nn_rc_, (kernel), (on));              \
    } while (0)

/* The first kernel entry these layers need that `k` lacks, or NULL when the
 * table has them all (ABI 1.4 and every pointer set). */
static inline const char *kiln_nn_kernels_missing(const kiln_kernels *k) {
    if (!k) return "the kernel table";
    if (k->struct_size < KILN_KERNELS_SIZE_1_4) return "the ABI 1.4 entries (table too old)";
#define KILN_NN__NEED(f) \
    if (!k->f) return #f;
    KILN_NN__NEED(alloc) KILN_NN__NEED(free) KILN_NN__NEED(copy) KILN_NN__NEED(zero) KILN_NN__NEED(cast)
    KILN_NN__NEED(round_to) KILN_NN__NEED(gemm_ex) KILN_NN__NEED(bias_add_ex) KILN_NN__NEED(bias_grad_ex)
    KILN_NN__NEED(act_forward) KILN_NN__NEED(act_backward) KILN_NN__NEED(scale_ex) KILN_NN__NEED(axpy_ex)
    KILN_NN__NEED(embedding_forward) KILN_NN__NEED(embedding_backward) KILN_NN__NEED(layernorm_forward)
    KILN_NN__NEED(layernorm_backward) KILN_NN__NEED(attention_forward) KILN_NN__NEED(attention_backward)
    KILN_NN__NEED(xent_fused) KILN_NN__NEED(add)
#undef KILN_NN__NEED
    return NULL;
}

/* Sets ctx->adt and ctx->rdt from the parameters a precision plugin set up
 * (call before every forward: convert_params may have run): adt is the
 * master dtype, rdt the reduced compute dtype of the weights (F16/BF16) or
 * F32 when they compute in the master dtype. Refuses compute copies it
 * cannot emulate (a reduced dtype over F64 masters, two reduced dtypes, a
 * missing compute pointer) with ctx->msg naming the parameter. */
static inline int32_t kiln_nn_ctx_setup(kiln_nn_ctx *c, kiln_parameter *const *params, uint32_t n) {
    if (n == 0) {
        snprintf(c->msg, sizeof c->msg, "no parameters");
        return KILN_E_STATE;
    }
    const uint32_t adt = kiln_param_dtype(params[0]);
    uint32_t rdt = KILN_DTYPE_F32;
    if (adt != KILN_DTYPE_F32 && adt != KILN_DTYPE_F64) {
        snprintf(c->msg, sizeof c->msg, "master weights in %s; float32 and float64 are supported",
                 kiln_dtype_name(adt));
        return KILN_E_UNSUPPORTED;
    }
    for (uint32_t i = 0; i < n; i++) {
        const kiln_parameter *p = params[i];
        if (!p->compute || !p->data || !p->grad) {
            snprintf(c->msg, sizeof c->msg, "%s has no memory (the host did not set it up)", p->name);
            return KILN_E_STATE;
        }
        if (kiln_param_dtype(p) != adt) {
            snprintf(c->msg, sizeof c->msg, "%s has %s masters beside %s ones", p->name,
                     kiln_dtype_name(kiln_param_dtype(p)), kiln_dtype_name(adt));
            return KILN_E_UNSUPPORTED;
        }
        const uint32_t cd = p->compute_dtype;
        const int reduced = cd == KILN_DTYPE_F16 || cd == KILN_DTYPE_BF16;
        if (cd != adt && !(reduced && adt == KILN_DTYPE_F32)) {
            snprintf(c->msg, sizeof c->msg,
                     "%s computes in %s with %s masters; supported: the master dtype or, over float32 "
                     "masters, float16/bfloat16",
                     p->name, kiln_dtype_name(cd), kiln_dtype_name(adt));
            return KILN_E_UNSUPPORTED;
        }
        if (reduced) {
            if (rdt != KILN_DTYPE_F32 && rdt != cd) {
                snprintf(c->msg, sizeof c->msg, "weights mix %s and %s compute dtypes", kiln_dtype_name(rdt),
                         kiln_dtype_name(cd));
                return KILN_E_UNSUPPORTED;
            }
            rdt = cd;
        }
    }
    c->adt = adt;
    c->rdt = rdt;
    c->sdt = adt;
#if KILN_ABI_MINOR >= 7
    {
        const uint32_t want = rdt == KILN_DTYPE_BF16  ? KILN_NN_ACT16_BF16
                              : rdt == KILN_DTYPE_F16 ? KILN_NN_ACT16_F16
                                                      : 0u;
        const uint32_t need = KILN_KERNELS_ACT_16BIT | KILN_KERNELS_STORE_16BIT;
        if (adt == KILN_DTYPE_F32 && (c->act16 & want) && c->k && (c->k->flags & need) == need) c->sdt = rdt;
    }
#endif
    return KILN_OK;
}

/* The activation storage dtype in effect: sdt as kiln_nn_ctx_setup chose
 * it, or adt for a ctx whose adt and rdt the module set itself (a 1.6
 * module's, where sdt is 0). */
static inline uint32_t kiln_nn_sdt(const kiln_nn_ctx *c) {
    return c->adt == KILN_DTYPE_F32 && c->sdt == c->rdt ? c->sdt : c->adt;
}

/* 1 when activation storage is 16-bit. */
static inline int kiln_nn__s16(const kiln_nn_ctx *c) { return kiln_nn_sdt(c) != c->adt; }

/* 1 when kiln_nn_round does something (float32 storage, a reduced rdt). */
static inline int kiln_nn__rounds(const kiln_nn_ctx *c) {
    return c->rdt != KILN_DTYPE_F32 && c->adt == KILN_DTYPE_F32 && !kiln_nn__s16(c);
}

/* x(n), activation storage, rounded through ctx->rdt (no-op without one,
 * and for 16-bit storage, which holds rounded values already). */
static inline int32_t kiln_nn_round(kiln_nn_ctx *c, void *x, size_t n, const char *on) {
    if (!kiln_nn__rounds(c)) return KILN_OK;
    KILN_NN__K(c, c->k->round_to(c->acc, (float *)x, c->rdt, n), "round_to", on);
    return KILN_OK;
}

/* Whether a float32 gradient of n values is read by the matmuls as a
 * 16-bit copy in rdt, kept in buf (bytes long): a reduced rdt over float32
 * masters, on a table where 16-bit storage pays (KILN_KERNELS_STORE_16BIT),
 * with room for the copy. */
static inline int kiln_nn__copy16(const kiln_nn_ctx *c, const void *buf, size_t bytes, size_t n) {
    return buf && c->adt == KILN_DTYPE_F32 && c->rdt != KILN_DTYPE_F32 &&
           (c->k->flags & KILN_KERNELS_STORE_16BIT) && n * 2 <= bytes;
}

/* Whether the table has ABI 1.11's act_bias_backward and
 * layernorm_backward_cast (one pass fewer over an activation gradient
 * each; kiln_nn_linear_backward_dt and kiln_nn_layernorm_backward_cast
 * call the older entries without them, with the same values). */
static inline int kiln_nn_has_act_bias(const kiln_nn_ctx *c) {
    return c->k->struct_size >= KILN_KERNELS_SIZE_1_11 && c->k->act_bias_backward;
}
static inline int kiln_nn_has_ln_cast(const kiln_nn_ctx *c) {
    return c->k->struct_size >= KILN_KERNELS_SIZE_1_11 && c->k->layernorm_backward_cast;
}

/* Lets the run's precision round an activation the layers produced
 * (svc->round_activation, ABI 1.5) when the module set ctx->svc; `site`
 * names the tensor, `on` the layer in a failure message. Nothing to do
 * without svc or on an older host. */
static inline int32_t kiln_nn_round_activation(kiln_nn_ctx *c, void *x, size_t n, const char *site, const char *on) {
#if KILN_ABI_MINOR >= 5
    const kiln_host_services *svc = c->svc;
    if (!svc || svc->abi_minor < 5 || svc->struct_size < offsetof(kiln_host_services, round_activation) +
                                                             sizeof svc->round_activation || !svc->round_activation)
        return KILN_OK;
    /* x is an activation: in sdt (a precision that rounds activations sees
     * 16-bit storage only where the module asked for it) */
    KILN_NN__K(c, svc->round_activation(c->hctx, site, kiln_nn_sdt(c), x, n),
               "round_activation (precision)", on);
#else
    (void)c, (void)x, (void)n, (void)site, (void)on;
#endif
    return KILN_OK;
}

/* A vector parameter (bias, layer norm weight) as the activation dtype
 * reads it: its compute copy when that is in the activation dtype, else
 * the master (autocast adds biases in the fp32 accumulator). NULL for no
 * parameter. */
static inline const void *kiln_nn_vec(const kiln_nn_ctx *c, const kiln_parameter *p) {
    if (!p) return NULL;
    return p->compute_dtype == c->adt ? p->compute : (const void *)p->data;
}

/* p's gradient, or NULL when p is absent or frozen (toggle_optimizer):
 * a backward never touches a frozen parameter's grad. */
static inline void *kiln_nn_grad(const kiln_parameter *p) {
    return p && !(p->flags & KILN_PARAMF_FROZEN) ? (void *)p->grad : NULL;
}

/* ---------------------------------------------------------------------------
 * The arena: one accelerator allocation carved into 64-byte aligned pieces.
 *
 *   kiln_nn_arena a;
 *   kiln_nn_arena_begin(&a, NULL);  my_layout(&a, ...);  // a.off = bytes
 *   k->alloc(acc, a.off, &base);
 *   kiln_nn_arena_begin(&a, base);  my_layout(&a, ...);  // pointers set
 *
 * The same layout function runs twice, so measuring and assigning cannot
 * disagree. a.ok turns 0 on size_t overflow. */

typedef struct kiln_nn_arena {
    char *base;  /* NULL while measuring          */
    size_t off;  /* bytes used so far             */
    int ok;      /* 0 after an overflow           */
} kiln_nn_arena;

static inline void kiln_nn_arena_begin(kiln_nn_arena *a, void *base) {
    a->base = (char *)base;
    a->off = 0;
    a->ok = 1;
}

/* Reserves count * elem bytes (rounded up to 64); the piece's address, or
 * NULL while measuring (and after an overflow). */
static inline void *kiln_nn_carve(kiln_nn_arena *a, size_t count, size_t elem) {
    size_t bytes;
    if (!a->ok || __builtin_mul_overflow(count, elem, &bytes) || bytes > SIZE_MAX - 63 - a->off) {
        a->ok = 0;
        return NULL;
    }
    void *p = a->base ? a->base + a->off : NULL;
    a->off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* Registers "<prefix>.<leaf>" (the host copies the name). */
static inline int32_t kiln_nn__register(const kiln_host_services *svc, kiln_host_ctx *h, const char *prefix,
                                        const char *leaf, uint32_t ndim, const int64_t *shape, uint32_t flags,
                                        kiln_parameter **out) {
    char name[256];
    int len = snprintf(name, sizeof name, "%s.%s", prefix, leaf);
    if (len < 0 || (size_t)len >= sizeof name) return KILN_E_INVALID_ARG;
    return svc->param_register(h, name, ndim, shape, flags, out);
}

/* ---------------------------------------------------------------------------
 * Linear: y = x . W^T + b (torch.nn.Linear, weight (out, in)) or y = x . W
 * + b (GPT-2's Conv1D, weight (in, out)), then an optional activation. */

enum { KILN_NN_OUT_IN = 0, /* torch.nn.Linear: weight (out, in) */
       KILN_NN_IN_OUT = 1  /* GPT-2 Conv1D:    weight (in, out) */ };

typedef struct kiln_nn_linear {
    kiln_parameter *w;  /* (out, in) KILN_NN_OUT_IN or (in, out) KILN_NN_IN_OUT      */
    kiln_parameter *b;  /* (out), or NULL: no bias                                   */
    int32_t in, out;
    int32_t layout;     /* KILN_NN_OUT_IN or KILN_NN_IN_OUT                           */
    int32_t act;        /* KILN_ACT_* applied after the bias, or -1 for none          */
    void *y;            /* (max_rows, out) x.W + b: the output, or the pre-activation;
                           activation storage (sdt), as are post and x               */
    void *post;         /* (max_rows, out) act(y); NULL without an activation         */
    const void *x;      /* (rows, in) input of the last forward; the caller's memory,
                           which must hold it until the backward                      */
    int32_t rows;       /* rows of the last forward                                   */
    void *bq;           /* (out) float32: the bias rounded through rdt, where the
                           layer rounds it itself (kiln_nn_ctx.round_bias); NULL
                           without a bias                                             */
} kiln_nn_linear;

/* Registers "<prefix>.weight" (shape by layout; decayed) and, when `bias`,
 * "<prefix>.bias" (out) with KILN_PARAMF_NO_DECAY, and fills in the layer. */
static inline int32_t kiln_nn_linear_register(const kiln_host_services *svc, kiln_host_ctx *h, kiln_nn_linear *L,
                                              const char *prefix, int32_t in, int32_t out, int32_t layout,
                                              int bias, int32_t act) {
    L->in = in;
    L->out = out;
    L->layout = layout;
    L->act = act;
    L->b = NULL;
    const int64_t wshape[2] = {layout == KILN_NN_IN_OUT ? in : out, layout == KILN_NN_IN_OUT ? out : in};
    const int64_t bshape[1] = {out};
    int32_t rc = kiln_nn__register(svc, h, prefix, "weight", 2, wshape, 0, &L->w);
    if (rc == KILN_OK && bias) rc = kiln_nn__register(svc, h, prefix, "bias", 1, bshape, KILN_PARAMF_NO_DECAY, &L->b);
    return rc;
}

/* esz: bytes per activation element, kiln_nn_act_size(sdt) (the master
 * dtype's size without 16-bit storage). */
static inline void kiln_nn_linear_plan(kiln_nn_arena *a, kiln_nn_linear *L, size_t max_rows, size_t esz) {
    L->y = kiln_nn_carve(a, max_rows * (size_t)L->out, esz);
    L->post = L->act >= 0 ? kiln_nn_carve(a, max_rows * (size_t)L->out, esz) : NULL;
    L->bq = L->b ? kiln_nn_carve(a, (size_t)L->out, sizeof(float)) : NULL;
}

/* (rows, out): what the layer hands to the next one. */
static inline void *kiln_nn_linear_output(const kiln_nn_linear *L) { return L->act >= 0 ? L->post : L->y; }

/* A Linear runs on an ABI 1.1 kernel table too, through its fp32 entries
 * (gemm, bias_add, relu/gelu), when everything is fp32 and its activation
 * is ReLU or GELU: the results are those of the 1.2 entries bit for bit on
 * the cpu accelerator, so an MLP built from this layer still trains on an
 * old accelerator. 1 when the call must take that path; -1 when it cannot
 * run on this table at all. */
static inline int kiln_nn__linear_11(const kiln_nn_ctx *c, const kiln_nn_linear *L) {
    if (c->k->struct_size >= KILN_KERNELS_SIZE_1_2) return 0;
    const int act_ok = L->act < 0 || L->act == KILN_ACT_RELU || L->act == KILN_ACT_GELU;
    return c->adt == KILN_DTYPE_F32 && c->rdt == KILN_DTYPE_F32 && L->layout == KILN_NN_OUT_IN && act_ok ? 1 : -1;
}

static inline int32_t kiln_nn__linear_11_refused(kiln_nn_ctx *c, const kiln_nn_linear *L) {
    snprintf(c->msg, sizeof c->msg,
             "%s: computing in %s (%s layout, activation %d) needs the ABI 1.2 kernel entries; the table is %u bytes",
             L->w->name, kiln_dtype_name(c->rdt != KILN_DTYPE_F32 ? c->rdt : c->adt),
             L->layout == KILN_NN_OUT_IN ? "nn.Linear" : "Conv1D", (int)L->act, (unsigned)c->k->struct_size);
    return KILN_E_UNSUPPORTED;
}

/* The bias as L's product takes it (*bias; NULL without one), and the
 * w_layout flag that goes with it (*lay_flags): where the module asks for
 * autocast's rounded bias (round_bias) under a reduced rdt, the accelerator
 * rounds it (1.8, KILN_LAYOUT_ROUND_BIAS) or, on an older table, this
 * rounds a copy into L->bq (copy + round_to: the same values). */
static inline int32_t kiln_nn__linear_bias(kiln_nn_ctx *c, const kiln_nn_linear *L, const void **bias,
                                           int32_t *lay_flags) {
    const kiln_kernels *k = c->k;
    *bias = kiln_nn_vec(c, L->b);
    *lay_flags = 0;
    if (!*bias || !c->round_bias || c->adt != KILN_DTYPE_F32 || c->rdt == KILN_DTYPE_F32) return KILN_OK;
#if KILN_ABI_MINOR >= 8
    if ((k->flags & KILN_KERNELS_BIAS_ROUND) && k->struct_size >= KILN_KERNELS_SIZE_1_6 && k->linear_forward_layout) {
        *lay_flags = KILN_LAYOUT_ROUND_BIAS;
        return KILN_OK;
    }
#endif
    const char *on = L->w->name;
    if (!L->bq) {
        snprintf(c->msg, sizeof c->msg, "%s: no planned buffer for the rounded bias (kiln_nn_linear_plan)", on);
        return KILN_E_STATE;
    }
    KILN_NN__K(c, k->copy(c->acc, L->bq, *bias, (size_t)L->out * sizeof(float), KILN_COPY_D2D), "copy (bias)", on);
    KILN_NN__K(c, k->round_to(c->acc, (float *)L->bq, c->rdt, (size_t)L->out), "round_to (bias)", on);
    *bias = L->bq;
    return KILN_OK;
}

/* x (rows, in) -> kiln_nn_linear_output(L) (rows, out). One rounding
 * after the bias (autocast's addmm) and one after the activation. */
static inline int32_t kiln_nn_linear_forward(kiln_nn_ctx *c, kiln_nn_linear *L, const void *x, int32_t rows) {
    const kiln_kernels *k = c->k;
    const kiln_parameter *W = L->w;
    const char *on = W->name;
    const size_t n = (size_t)rows * (size_t)L->out;
    L->x = x;
    L->rows = rows;
    const int old = kiln_nn__linear_11(c, L);
    if (old < 0) return kiln_nn__linear_11_refused(c, L);
    if (old) { /* ABI 1.1: y = x . W^T + b, then the activation */
        float *y = (float *)L->y;
        KILN_NN__K(c,
                   k->gemm(c->acc, 0, 1, rows, L->out, L->in, 1.0f, (const float *)x, L->in,
                           (const float *)W->compute, L->in, 0.0f, y, L->out),
                   "gemm (forward)", on);
        if (L->b) KILN_NN__K(c, k->bias_add(c->acc, y, (const float *)L->b->compute, rows, L->out), "bias_add", on);
        if (L->act == KILN_ACT_RELU) KILN_NN__K(c, k->relu_forward(c->acc, (float *)L->post, y, n), "relu_forward", on);
        if (L->act == KILN_ACT_GELU) KILN_NN__K(c, k->gelu_forward(c->acc, (float *)L->post, y, n), "gelu_forward", on);
        return kiln_nn_round_activation(c, kiln_nn_linear_output(L), n, on, on);
    }
    const void *bias = NULL;
    int32_t lay_flags = 0;
    int32_t rc = kiln_nn__linear_bias(c, L, &bias, &lay_flags);
    if (rc != KILN_OK) return rc;
#if KILN_ABI_MINOR >= 6
    if (k->struct_size >= KILN_KERNELS_SIZE_1_6 && k->linear_forward_layout) { /* either layout, fused */
        KILN_NN__K(c,
                   k->linear_forward_layout(c->acc, kiln_nn_sdt(c), x, W->compute, W->compute_dtype,
                                            (L->layout == KILN_NN_IN_OUT ? KILN_LAYOUT_IN_OUT : KILN_LAYOUT_OUT_IN) |
                                                lay_flags,
                                            bias, rows, L->in, L->out, L->act, L->y, L->post, c->rdt),
                   "linear_forward_layout", on);
        return kiln_nn_round_activation(c, kiln_nn_linear_output(L), n, on, on);
    }
#endif
    if (kiln_nn__s16(c)) { /* cannot happen: a 1.7 table has linear_forward_layout */
        snprintf(c->msg, sizeof c->msg, "%s: 16-bit activation storage needs linear_forward_layout", on);
        return KILN_E_UNSUPPORTED;
    }
    if (L->layout == KILN_NN_OUT_IN && k->struct_size >= KILN_KERNELS_SIZE_1_3 && k->linear_forward) {
        KILN_NN__K(c,
                   k->linear_forward(c->acc, c->adt, x, W->compute, W->compute_dtype, bias, rows,
                                     L->in, L->out, L->act, L->y, L->post, c->rdt),
                   "linear_forward", on);
        return kiln_nn_round_activation(c, kiln_nn_linear_output(L), n, on, on);
    }
    /* The unfused sequence linear_forward stands for. */
    if (L->layout == KILN_NN_OUT_IN) /* y(rows, out) = x(rows, in) . W(out, in)^T */
        KILN_NN__K(c,
                   k->gemm_ex(c->acc, 0, 1, rows, L->out, L->in, 1.0, x, c->adt, L->in, W->compute, W->compute_dtype,
                              L->in, 0.0, L->y, c->adt, L->out, KILN_DTYPE_F32),
                   "gemm_ex (forward)", on);
    else /* y(rows, out) = x(rows, in) . W(in, out) */
        KILN_NN__K(c,
                   k->gemm_ex(c->acc, 0, 0, rows, L->out, L->in, 1.0, x, c->adt, L->in, W->compute, W->compute_dtype,
                              L->out, 0.0, L->y, c->adt, L->out, KILN_DTYPE_F32),
                   "gemm_ex (forward)", on);
    if (bias) KILN_NN__K(c, k->bias_add_ex(c->acc, c->adt, L->y, bias, rows, L->out), "bias_add_ex", on);
    rc = kiln_nn_round(c, L->y, n, on);
    if (rc == KILN_OK && L->act >= 0) {
        KILN_NN__K(c, k->act_forward(c->acc, c->adt, L->act, L->post, L->y, n), "act_forward", on);
        rc = kiln_nn_round(c, L->post, n, on);
    }
    return rc == KILN_OK ? kiln_nn_round_activation(c, kiln_nn_linear_output(L), n, on, on) : rc;
}

/* dy (rows, out) in dtype dy_dt (sdt, or adt for a residual stream's
 * gradient): the gradient at the layer's output; with an activation it is
 * OVERWRITTEN with the gradient at y (the pre-activation), which saves a
 * buffer, and must then be in sdt. Adds dW and db to the parameters' grads
 * (unless frozen) and, when dx (rows, in) is not NULL, writes dx = dy . W
 * in dtype dx_dt (accumulate_dx: adds it instead, for a residual stream;
 * not into 16-bit storage, where the sum would be rounded once more). dx
 * must not overlap dy. Takes c->dy16 (scratch for a 16-bit copy of dy,
 * which must overlap neither) when the caller lent one, and clears it. */
static inline int32_t kiln_nn_linear_backward_dt(kiln_nn_ctx *c, kiln_nn_linear *L, void *dy, uint32_t dy_dt,
                                                 void *dx, uint32_t dx_dt, int accumulate_dx) {
    const kiln_kernels *k = c->k;
    const kiln_parameter *W = L->w;
    const char *on = W->name;
    const int32_t rows = L->rows, in = L->in, out = L->out;
    void *const dy16 = c->dy16; /* lent for this call only */
    const size_t dy16_bytes = c->dy16_bytes;
    const int ready16 = dy16 && c->ready16 == dy16 && c->ready16_of == dy; /* the copy is made */
    c->dy16 = NULL;
    c->dy16_bytes = 0;
    c->ready16 = NULL;
    c->ready16_of = NULL;
    const int old = kiln_nn__linear_11(c, L);
    if (old < 0) return kiln_nn__linear_11_refused(c, L);
    if (old) { /* ABI 1.1, all fp32: the same operations through the 1.1 entries */
        float *g = (float *)dy;
        const size_t n = (size_t)rows * (size_t)out;
        if (L->act == KILN_ACT_RELU)
            KILN_NN__K(c, k->relu_backward(c->acc, g, g, (const float *)L->y, n), "relu_backward", on);
        if (L->act == KILN_ACT_GELU)
            KILN_NN__K(c, k->gelu_backward(c->acc, g, g, (const float *)L->y, n), "gelu_backward", on);
        float *dw = (float *)kiln_nn_grad(L->w), *db = (float *)kiln_nn_grad(L->b);
        if (dw)
            KILN_NN__K(c, k->gemm(c->acc, 1, 0, out, in, rows, 1.0f, g, out, (const float *)L->x, in, 1.0f, dw, in),
                       "gemm (weight grad)", on);
        if (db) KILN_NN__K(c, k->bias_grad(c->acc, db, g, rows, out, 1), "bias_grad", on);
        if (dx)
            KILN_NN__K(c,
                       k->gemm(c->acc, 0, 0, rows, in, out, 1.0f, g, out, (const float *)W->compute, in,
                               accumulate_dx ? 1.0f : 0.0f, (float *)dx, in),
                       "gemm (input grad)", on);
        return KILN_OK;
    }
    if ((dy_dt != kiln_nn_sdt(c) && dy_dt != c->adt) || (dx && dx_dt != kiln_nn_sdt(c) && dx_dt != c->adt) ||
        (L->act >= 0 && dy_dt != kiln_nn_sdt(c)) || (dx && accumulate_dx && dx_dt != c->adt)) {
        snprintf(c->msg, sizeof c->msg,
                 "%s: backward with dy in %s and dx in %s%s (activations in %s, masters in %s): unsupported", on,
                 kiln_dtype_name(dy_dt), kiln_dtype_name(dx_dt), accumulate_dx ? ", accumulated" : "",
                 kiln_dtype_name(kiln_nn_sdt(c)), kiln_dtype_name(c->adt));
        return KILN_E_UNSUPPORTED;
    }
    void *dw = kiln_nn_grad(L->w), *db = kiln_nn_grad(L->b);
    if (L->act >= 0 && db && kiln_nn_has_act_bias(c) && !kiln_nn__rounds(c)) {
        /* 1.11: the bias sum in the activation backward's pass; nothing
         * rounds between them here (16-bit storage rounds as it stores) */
        KILN_NN__K(c, k->act_bias_backward(c->acc, kiln_nn_sdt(c), L->act, dy, db, dy, L->y, rows, out, 1),
                   "act_bias_backward", on);
        db = NULL; /* summed */
    } else if (L->act >= 0) { /* 16-bit storage rounds as it stores; float32 storage rounds after */
        const size_t n = (size_t)rows * (size_t)out;
        KILN_NN__K(c, k->act_backward(c->acc, kiln_nn_sdt(c), L->act, dy, dy, L->y, n), "act_backward", on);
        int32_t rc = kiln_nn_round(c, dy, n, on);
        if (rc != KILN_OK) return rc;
    }
    /* dy as the products read it. Both round it through rdt (gemm_ex's
     * operand rule), so where the accelerator says 16-bit storage pays
     * (KILN_KERNELS_STORE_16BIT) and the caller lent scratch, dy is cast
     * to rdt once and both read the copy: the same values, one conversion
     * instead of two. */
    const void *g = dy;
    uint32_t gt = dy_dt;
#if KILN_ABI_MINOR >= 6
    if (dw && dx && dy_dt == KILN_DTYPE_F32 && kiln_nn__copy16(c, dy16, dy16_bytes, (size_t)rows * (size_t)out)) {
        if (!ready16)
            KILN_NN__K(c, k->cast(c->acc, dy16, c->rdt, dy, KILN_DTYPE_F32, (size_t)rows * (size_t)out),
                       "cast (output grad to the compute dtype)", on);
        g = dy16;
        gt = c->rdt;
    }
#else
    (void)dy16, (void)dy16_bytes;
#endif
    /* Weight gradients: a reduced-precision product added to the master
     * grad (autocast's cast-back into .grad). */
    if (dw && L->layout == KILN_NN_OUT_IN) /* dW(out, in) += dy^T . x */
        KILN_NN__K(c,
                   k->gemm_ex(c->acc, 1, 0, out, in, rows, 1.0, g, gt, out, L->x, kiln_nn_sdt(c), in, 1.0, dw,
                              c->adt, in, c->rdt),
                   "gemm_ex (weight grad)", on);
    else if (dw) /* dW(in, out) += x^T . dy */
        KILN_NN__K(c,
                   k->gemm_ex(c->acc, 1, 0, in, out, rows, 1.0, L->x, kiln_nn_sdt(c), in, g, gt, out, 1.0, dw,
                              c->adt, out, c->rdt),
                   "gemm_ex (weight grad)", on);
    if (db) KILN_NN__K(c, k->bias_grad_ex(c->acc, dy_dt, db, dy, rows, out, 1), "bias_grad_ex", on);
    if (!dx) return KILN_OK;
    const double beta = accumulate_dx ? 1.0 : 0.0;
    if (L->layout == KILN_NN_OUT_IN) /* dx(rows, in) = dy(rows, out) . W(out, in) */
        KILN_NN__K(c,
                   k->gemm_ex(c->acc, 0, 0, rows, in, out, 1.0, g, gt, out, W->compute, W->compute_dtype, in, beta,
                              dx, dx_dt, in, c->rdt),
                   "gemm_ex (input grad)", on);
    else /* dx(rows, in) = dy(rows, out) . W(in, out)^T */
        KILN_NN__K(c,
                   k->gemm_ex(c->acc, 0, 1, rows, in, out, 1.0, g, gt, out, W->compute, W->compute_dtype, out, beta,
                              dx, dx_dt, in, c->rdt),
                   "gemm_ex (input grad)", on);
    return KILN_OK;
}

/* kiln_nn_linear_backward_dt with dy and dx in activation storage (sdt;
 * adt, the master dtype, without 16-bit storage). */
static inline int32_t kiln_nn_linear_backward(kiln_nn_ctx *c, kiln_nn_linear *L, void *dy, void *dx,
                                              int accumulate_dx) {
    return kiln_nn_linear_backward_dt(c, L, dy, kiln_nn_sdt(c), dx, kiln_nn_sdt(c), accumulate_dx);
}

/* ---------------------------------------------------------------------------
 * LayerNorm over the last axis (torch.nn.LayerNorm(C, eps), elementwise
 * affine). Its output is rounded through rdt: it feeds a matmul. */

typedef struct kiln_nn_layernorm {
    kiln_parameter *w, *b; /* (C) each: "<prefix>.weight", "<prefix>.bias"     */
    int32_t C;
    double eps;
    void *y;               /* (max_rows, C) normalised, scaled and shifted;
                              activation storage (sdt)                           */
    void *mean, *rstd;     /* (max_rows) each, saved for the backward (adt)      */
    const void *x;         /* (rows, C) input of the last forward (caller's)     */
    int32_t rows;
} kiln_nn_layernorm;

/* Registers "<prefix>.weight" and "<prefix>.bias" (C), both NO_DECAY. */
static inline int32_t kiln_nn_layernorm_register(const kiln_host_services *svc, kiln_host_ctx *h,
                                                 kiln_nn_layernorm *ln, const char *prefix, int32_t C, double eps) {
    const int64_t shape[1] = {C};
    ln->C = C;
    ln->eps = eps;
    int32_t rc = kiln_nn__register(svc, h, prefix, "weight", 1, shape, KILN_PARAMF_NO_DECAY, &ln->w);
    if (rc == KILN_OK) rc = kiln_nn__register(svc, h, prefix, "bias", 1, shape, KILN_PARAMF_NO_DECAY, &ln->b);
    return rc;
}

/* esz: bytes per master element; asz: per activation element,
 * kiln_nn_act_size(sdt). */
static inline void kiln_nn_layernorm_plan_sz(kiln_nn_arena *a, kiln_nn_layernorm *ln, size_t max_rows, size_t esz,
                                             size_t asz) {
    ln->y = kiln_nn_carve(a, max_rows * (size_t)ln->C, asz);
    ln->mean = kiln_nn_carve(a, max_rows, esz);
    ln->rstd = kiln_nn_carve(a, max_rows, esz);
}

/* The plan without 16-bit storage (activations in the master dtype). */
static inline void kiln_nn_layernorm_plan(kiln_nn_arena *a, kiln_nn_layernorm *ln, size_t max_rows, size_t esz) {
    kiln_nn_layernorm_plan_sz(a, ln, max_rows, esz, esz);
}

/* x (rows, C) in adt (a residual stream) -> ln->y (rows, C) in sdt. */
static inline int32_t kiln_nn_layernorm_forward(kiln_nn_ctx *c, kiln_nn_layernorm *ln, const void *x, int32_t rows) {
    ln->x = x;
    ln->rows = rows;
    KILN_NN__K(c,
               c->k->layernorm_forward(c->acc, kiln_nn_sdt(c), ln->y, ln->mean, ln->rstd, x, kiln_nn_vec(c, ln->w),
                                       kiln_nn_vec(c, ln->b), rows, ln->C, ln->eps, c->rdt),
               "layernorm_forward", ln->w ? ln->w->name : "layernorm");
    return KILN_OK;
}

/* dy (rows, C) at ln->y, in sdt -> dx (rows, C) in adt (accumulate_dx:
 * added, for a residual stream), dw and db added. dx must not overlap dy.
 * Not rounded: autocast runs layer norm in fp32. */
static inline int32_t kiln_nn_layernorm_backward(kiln_nn_ctx *c, kiln_nn_layernorm *ln, const void *dy, void *dx,
                                                 int accumulate_dx) {
    KILN_NN__K(c,
               c->k->layernorm_backward(c->acc, kiln_nn_sdt(c), dx, kiln_nn_grad(ln->w), kiln_nn_grad(ln->b), dy, ln->x,
                                        kiln_nn_vec(c, ln->w), ln->mean, ln->rstd, ln->rows, ln->C,
                                        accumulate_dx ? 1 : 0),
               "layernorm_backward", ln->w ? ln->w->name : "layernorm");
    return KILN_OK;
}

/* kiln_nn_layernorm_backward into dx, a residual stream's gradient in adt
 * that a Linear's backward reads next as its dy, lending buf (bytes long)
 * as that Linear's dy16: where the Linear would cast dx into buf (16-bit
 * products on a KILN_KERNELS_STORE_16BIT table) and the table has 1.11's
 * layernorm_backward_cast, the layer norm writes the copy as it writes dx
 * and the Linear reads it (one pass over dx fewer). The caller still lends
 * buf to that Linear. The same values either way. */
static inline int32_t kiln_nn_layernorm_backward_cast(kiln_nn_ctx *c, kiln_nn_layernorm *ln, const void *dy, void *dx,
                                                      int accumulate_dx, void *buf, size_t bytes) {
    if (!kiln_nn_has_ln_cast(c) || !kiln_nn__copy16(c, buf, bytes, (size_t)ln->rows * (size_t)ln->C))
        return kiln_nn_layernorm_backward(c, ln, dy, dx, accumulate_dx);
    KILN_NN__K(c,
               c->k->layernorm_backward_cast(c->acc, kiln_nn_sdt(c), dx, kiln_nn_grad(ln->w), kiln_nn_grad(ln->b), dy,
                                             ln->x, kiln_nn_vec(c, ln->w), ln->mean, ln->rstd, ln->rows, ln->C,
                                             accumulate_dx ? 1 : 0, buf, c->rdt),
               "layernorm_backward_cast", ln->w ? ln->w->name : "layernorm");
    c->ready16 = buf;
    c->ready16_of = dx;
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Embedding: y[b*T + t] = wte[tokens[b*T + t]] + wpe[t] (token plus learned
 * position). The tables are read from the masters: an embedding lookup is
 * not a matmul, so nothing is rounded. */

typedef struct kiln_nn_embedding {
    kiln_parameter *wte;   /* (V, C) token table                                */
    kiln_parameter *wpe;   /* (P, C) position table, or NULL                    */
    int32_t V, C, P;
    void *y;               /* (max_rows, C)                                     */
    const int32_t *tokens; /* (B*T) accelerator memory of the last forward      */
    int32_t B, T;
} kiln_nn_embedding;

/* Registers wte_name (V, C) and, when wpe_name is not NULL, wpe_name (P, C);
 * full names (GPT-2: "transformer.wte.weight", "transformer.wpe.weight").
 * Both decay (they are matrices), as in GPT-2's usual optimizer groups. */
static inline int32_t kiln_nn_embedding_register(const kiln_host_services *svc, kiln_host_ctx *h,
                                                 kiln_nn_embedding *e, const char *wte_name, int32_t V,
                                                 const char *wpe_name, int32_t P, int32_t C) {
    const int64_t tshape[2] = {V, C}, pshape[2] = {P, C};
    e->V = V;
    e->C = C;
    e->P = wpe_name ? P : 0;
    e->wpe = NULL;
    int32_t rc = svc->param_register(h, wte_name, 2, tshape, 0, &e->wte);
    if (rc == KILN_OK && wpe_name) rc = svc->param_register(h, wpe_name, 2, pshape, 0, &e->wpe);
    return rc;
}

static inline void kiln_nn_embedding_plan(kiln_nn_arena *a, kiln_nn_embedding *e, size_t max_rows, size_t esz) {
    e->y = kiln_nn_carve(a, max_rows * (size_t)e->C, esz);
}

/* tokens (B, T) I32 in accelerator memory, kept until the backward; T <= P.
 * A token outside [0, V) is KILN_E_DATA. -> e->y (B*T, C). */
static inline int32_t kiln_nn_embedding_forward(kiln_nn_ctx *c, kiln_nn_embedding *e, const int32_t *tokens,
                                                int32_t B, int32_t T) {
    e->tokens = tokens;
    e->B = B;
    e->T = T;
    KILN_NN__K(c,
               c->k->embedding_forward(c->acc, c->adt, e->y, tokens, e->wte->data, e->wpe ? e->wpe->data : NULL, B,
                                       T, e->C, e->V),
               "embedding_forward", e->wte->name);
    return KILN_OK;
}

/* dy (B*T, C) at e->y: the scatter-add into the tables' grads. */
static inline int32_t kiln_nn_embedding_backward(kiln_nn_ctx *c, kiln_nn_embedding *e, const void *dy) {
    void *dwte = kiln_nn_grad(e->wte), *dwpe = kiln_nn_grad(e->wpe);
    if (!dwte && !dwpe) return KILN_OK;
    KILN_NN__K(c, c->k->embedding_backward(c->acc, c->adt, dwte, dwpe, dy, e->tokens, e->B, e->T, e->C, e->V),
               "embedding_backward", e->wte->name);
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Backward temporaries shared by every layer of a model (one set: the
 * backward runs one layer at a time). Plan it once with the widest C and
 * MLP hidden width H of the model. */

typedef struct kiln_nn_scratch {
    void *d_ln;   /* (max_rows, C)  gradient at a layer norm's output        */
    void *d_att;  /* (max_rows, C)  gradient at the attention output         */
    void *d_qkv;  /* (max_rows, 3C) gradient at the packed q|k|v             */
    void *d_h;    /* (max_rows, H)  gradient at the MLP's hidden activation  */
    size_t d_qkv_bytes, d_h_bytes; /* their sizes: each also lends itself as
                                      kiln_nn_ctx.dy16 while it is free      */
} kiln_nn_scratch;

/* esz: bytes per activation element, kiln_nn_act_size(sdt) (the scratch
 * holds gradients at activations). */
static inline void kiln_nn_scratch_plan(kiln_nn_arena *a, kiln_nn_scratch *s, size_t max_rows, int32_t C, int32_t H,
                                        size_t esz) {
    s->d_ln = kiln_nn_carve(a, max_rows * (size_t)C, esz);
    s->d_att = kiln_nn_carve(a, max_rows * (size_t)C, esz);
    s->d_qkv = kiln_nn_carve(a, max_rows * 3 * (size_t)C, esz);
    s->d_h = kiln_nn_carve(a, max_rows * (size_t)H, esz);
    s->d_qkv_bytes = max_rows * 3 * (size_t)C * esz;
    s->d_h_bytes = max_rows * (size_t)H * esz;
}

/* Lends buf (bytes long) to the next kiln_nn_linear_backward as its dy16. */
static inline void kiln_nn__lend(kiln_nn_ctx *c, void *buf, size_t bytes) {
    c->dy16 = buf;
    c->dy16_bytes = bytes;
}

/* ---------------------------------------------------------------------------
 * Causal self-attention (GPT-2's GPT2Attention without dropout):
 *   qkv = c_attn(x)           (rows, 3C), q | k | v along the features,
 *                             head h = columns [h*D, (h+1)*D) of each, D = C/NH
 *   att = softmax(q k^T / sqrt(D), causal) v, heads side by side (rows, C)
 *   out = c_proj(att)         (rows, C) */

typedef struct kiln_nn_attention {
    kiln_nn_linear c_attn; /* C -> 3C, no activation                        */
    kiln_nn_linear c_proj; /* C -> C, no activation; its y is the output    */
    int32_t C, NH;
    void *att;             /* (max_rows, C) attention output, rounded (it feeds c_proj); sdt */
    void *lse;             /* (max_rows * NH) = (B, NH, T) log-sum-exp of each score row; adt */
    int32_t B, T;
} kiln_nn_attention;

/* Registers "<prefix>.c_attn.*" then "<prefix>.c_proj.*" (weights in
 * `layout`, with biases). C % NH must be 0 (the caller checks, to name its
 * own config keys). */
static inline int32_t kiln_nn_attention_register(const kiln_host_services *svc, kiln_host_ctx *h,
                                                 kiln_nn_attention *a, const char *prefix, int32_t C, int32_t NH,
                                                 int32_t layout) {
    char p[240];
    a->C = C;
    a->NH = NH;
    snprintf(p, sizeof p, "%s.c_attn", prefix);
    int32_t rc = kiln_nn_linear_register(svc, h, &a->c_attn, p, C, 3 * C, layout, 1, -1);
    snprintf(p, sizeof p, "%s.c_proj", prefix);
    if (rc == KILN_OK) rc = kiln_nn_linear_register(svc, h, &a->c_proj, p, C, C, layout, 1, -1);
    return rc;
}

/* esz: bytes per master element; asz: per activation element. */
static inline void kiln_nn_attention_plan_sz(kiln_nn_arena *a, kiln_nn_attention *at, size_t max_rows, size_t esz,
                                             size_t asz) {
    kiln_nn_linear_plan(a, &at->c_attn, max_rows, asz);
    at->att = kiln_nn_carve(a, max_rows * (size_t)at->C, asz);
    at->lse = kiln_nn_carve(a, max_rows * (size_t)at->NH, esz);
    kiln_nn_linear_plan(a, &at->c_proj, max_rows, asz);
}

static inline void kiln_nn_attention_plan(kiln_nn_arena *a, kiln_nn_attention *at, size_t max_rows, size_t esz) {
    kiln_nn_attention_plan_sz(a, at, max_rows, esz, esz);
}

/* x (B*T, C) -> at->c_proj.y (B*T, C), both in sdt. */
static inline int32_t kiln_nn_attention_forward(kiln_nn_ctx *c, kiln_nn_attention *at, const void *x, int32_t B,
                                                int32_t T) {
    const int32_t rows = B * T;
    at->B = B;
    at->T = T;
    int32_t rc = kiln_nn_linear_forward(c, &at->c_attn, x, rows);
    if (rc != KILN_OK) return rc;
    KILN_NN__K(c,
               c->k->attention_forward(c->acc, kiln_nn_sdt(c), at->att, at->lse, at->c_attn.y, B, T, at->C, at->NH,
                                       c->rdt),
               "attention_forward", at->c_attn.w->name);
    /* the attention output as the precision stores it (the backward reads
     * att, so it sees what c_proj saw) */
    char site[300];
    snprintf(site, sizeof site, "%s:attention", at->c_attn.w->name);
    rc = kiln_nn_round_activation(c, at->att, (size_t)rows * (size_t)at->C, site, at->c_attn.w->name);
    if (rc != KILN_OK) return rc;
    return kiln_nn_linear_forward(c, &at->c_proj, at->att, rows);
}

/* dy (B*T, C) at the output (not modified), in adt: a residual stream's
 * gradient -> dx (B*T, C) in sdt (accumulate_dx: added; only without
 * 16-bit storage); uses s->d_att and s->d_qkv, and s->d_h for a 16-bit
 * copy of dy. */
static inline int32_t kiln_nn_attention_backward(kiln_nn_ctx *c, kiln_nn_attention *at, void *dy, void *dx,
                                                 int accumulate_dx, const kiln_nn_scratch *s) {
    const uint32_t sdt = kiln_nn_sdt(c);
    /* d_qkv is free until attention_backward writes it, d_h (the MLP's)
     * throughout: each holds a 16-bit dy for one Linear */
    kiln_nn__lend(c, s->d_qkv, s->d_qkv_bytes);
    int32_t rc = kiln_nn_linear_backward_dt(c, &at->c_proj, dy, c->adt, s->d_att, sdt, 0);
    if (rc != KILN_OK) return rc;
    KILN_NN__K(c,
               c->k->attention_backward(c->acc, sdt, s->d_qkv, s->d_att, at->c_attn.y, at->att, at->lse, at->B,
                                        at->T, at->C, at->NH, c->rdt),
               "attention_backward", at->c_attn.w->name);
    kiln_nn__lend(c, s->d_h, s->d_h_bytes);
    return kiln_nn_linear_backward_dt(c, &at->c_attn, s->d_qkv, sdt, dx, sdt, accumulate_dx);
}

/* ---------------------------------------------------------------------------
 * The MLP of a transformer block: c_proj(act(c_fc(x))), C -> H -> C. */

typedef struct kiln_nn_mlp {
    kiln_nn_linear c_fc;   /* C -> H with the activation (GELU for GPT-2)   */
    kiln_nn_linear c_proj; /* H -> C; its y is the output                   */
} kiln_nn_mlp;

/* Registers "<prefix>.c_fc.*" then "<prefix>.c_proj.*". */
static inline int32_t kiln_nn_mlp_register(const kiln_host_services *svc, kiln_host_ctx *h, kiln_nn_mlp *m,
                                           const char *prefix, int32_t C, int32_t H, int32_t act, int32_t layout) {
    char p[240];
    snprintf(p, sizeof p, "%s.c_fc", prefix);
    int32_t rc = kiln_nn_linear_register(svc, h, &m->c_fc, p, C, H, layout, 1, act);
    snprintf(p, sizeof p, "%s.c_proj", prefix);
    if (rc == KILN_OK) rc = kiln_nn_linear_register(svc, h, &m->c_proj, p, H, C, layout, 1, -1);
    return rc;
}

/* esz: bytes per activation element (every buffer of the MLP is one). */
static inline void kiln_nn_mlp_plan(kiln_nn_arena *a, kiln_nn_mlp *m, size_t max_rows, size_t esz) {
    kiln_nn_linear_plan(a, &m->c_fc, max_rows, esz);
    kiln_nn_linear_plan(a, &m->c_proj, max_rows, esz);
}

/* x (rows, C) -> m->c_proj.y (rows, C). */
static inline int32_t kiln_nn_mlp_forward(kiln_nn_ctx *c, kiln_nn_mlp *m, const void *x, int32_t rows) {
    int32_t rc = kiln_nn_linear_forward(c, &m->c_fc, x, rows);
    return rc != KILN_OK ? rc : kiln_nn_linear_forward(c, &m->c_proj, kiln_nn_linear_output(&m->c_fc), rows);
}

/* dy (rows, C) at the output (not modified), in adt: a residual stream's
 * gradient -> dx (rows, C) in sdt (accumulate_dx: added; only without
 * 16-bit storage); uses s->d_h, and s->d_qkv for a 16-bit copy of dy. */
static inline int32_t kiln_nn_mlp_backward(kiln_nn_ctx *c, kiln_nn_mlp *m, void *dy, void *dx, int accumulate_dx,
                                           const kiln_nn_scratch *s) {
    const uint32_t sdt = kiln_nn_sdt(c);
    /* d_qkv (the attention's) is free here: it holds each Linear's 16-bit dy */
    kiln_nn__lend(c, s->d_qkv, s->d_qkv_bytes);
    int32_t rc = kiln_nn_linear_backward_dt(c, &m->c_proj, dy, c->adt, s->d_h, sdt, 0);
    if (rc != KILN_OK) return rc;
    kiln_nn__lend(c, s->d_qkv, s->d_qkv_bytes);
    return kiln_nn_linear_backward_dt(c, &m->c_fc, s->d_h, sdt, dx, sdt, accumulate_dx);
}

/* ---------------------------------------------------------------------------
 * A pre-LayerNorm transformer block (GPT-2's GPT2Block):
 *   res1 = x + attn(ln_1(x))
 *   out  = res1 + mlp(ln_2(res1))
 * The residual sums are not rounded: autocast adds an fp16 matmul output to
 * an fp32 residual in fp32. */

typedef struct kiln_nn_block {
    kiln_nn_layernorm ln_1;
    kiln_nn_attention attn;
    kiln_nn_layernorm ln_2;
    kiln_nn_mlp mlp;
    void *res1;            /* (max_rows, C) x + attn(ln_1(x))                */
    void *out;             /* (max_rows, C) the block's output               */
    int32_t rows;
} kiln_nn_block;

/* Registers, in PyTorch's order, "<prefix>.ln_1.*", "<prefix>.attn.c_attn.*",
 * "<prefix>.attn.c_proj.*", "<prefix>.ln_2.*", "<prefix>.mlp.c_fc.*",
 * "<prefix>.mlp.c_proj.*". H is the MLP width (4C in GPT-2), act its
 * activation, eps the layer norms'. */
static inline int32_t kiln_nn_block_register(const kiln_host_services *svc, kiln_host_ctx *h, kiln_nn_block *blk,
                                             const char *prefix, int32_t C, int32_t NH, int32_t H, int32_t act,
                                             double eps, int32_t layout) {
    char p[224];
    snprintf(p, sizeof p, "%s.ln_1", prefix);
    int32_t rc = kiln_nn_layernorm_register(svc, h, &blk->ln_1, p, C, eps);
    snprintf(p, sizeof p, "%s.attn", prefix);
    if (rc == KILN_OK) rc = kiln_nn_attention_register(svc, h, &blk->attn, p, C, NH, layout);
    snprintf(p, sizeof p, "%s.ln_2", prefix);
    if (rc == KILN_OK) rc = kiln_nn_layernorm_register(svc, h, &blk->ln_2, p, C, eps);
    snprintf(p, sizeof p, "%s.mlp", prefix);
    if (rc == KILN_OK) rc = kiln_nn_mlp_register(svc, h, &blk->mlp, p, C, H, act, layout);
    return rc;
}

/* esz: bytes per master element (the residual stream, the statistics);
 * asz: per activation element, kiln_nn_act_size(sdt). */
static inline void kiln_nn_block_plan_sz(kiln_nn_arena *a, kiln_nn_block *blk, size_t max_rows, size_t esz,
                                         size_t asz) {
    const size_t C = (size_t)blk->ln_1.C;
    kiln_nn_layernorm_plan_sz(a, &blk->ln_1, max_rows, esz, asz);
    kiln_nn_attention_plan_sz(a, &blk->attn, max_rows, esz, asz);
    blk->res1 = kiln_nn_carve(a, max_rows * C, esz);
    kiln_nn_layernorm_plan_sz(a, &blk->ln_2, max_rows, esz, asz);
    kiln_nn_mlp_plan(a, &blk->mlp, max_rows, asz);
    blk->out = kiln_nn_carve(a, max_rows * C, esz);
}

static inline void kiln_nn_block_plan(kiln_nn_arena *a, kiln_nn_block *blk, size_t max_rows, size_t esz) {
    kiln_nn_block_plan_sz(a, blk, max_rows, esz, esz);
}

/* Whether the table fuses a residual add with the layer norm that reads
 * its sum (ABI 1.10's add_layernorm_forward). */
static inline int kiln_nn_has_add_ln(const kiln_nn_ctx *c) {
    return c->k->struct_size >= KILN_KERNELS_SIZE_1_10 && c->k->add_layernorm_forward;
}

/* res = a + b (rows, C) in adt, b in sdt (a residual stream and a branch's
 * output), then ln's forward on res: one entry where the table fuses them,
 * else add and layernorm_forward, with the same values. what: the add, for
 * messages. */
static inline int32_t kiln_nn_add_layernorm_forward(kiln_nn_ctx *c, kiln_nn_layernorm *ln, void *res, const void *a,
                                                    const void *b, int32_t rows, const char *what) {
    const char *on = ln->w ? ln->w->name : "layernorm";
    if (!kiln_nn_has_add_ln(c)) {
        KILN_NN__K(c, c->k->add(c->acc, kiln_nn_sdt(c), res, a, b, (size_t)rows * (size_t)ln->C), what, on);
        return kiln_nn_layernorm_forward(c, ln, res, rows);
    }
    ln->x = res;
    ln->rows = rows;
    KILN_NN__K(c,
               c->k->add_layernorm_forward(c->acc, kiln_nn_sdt(c), res, a, b, ln->y, ln->mean, ln->rstd,
                                           kiln_nn_vec(c, ln->w), kiln_nn_vec(c, ln->b), rows, ln->C, ln->eps, c->rdt),
               "add_layernorm_forward", on);
    return KILN_OK;
}

/* A block's forward; ln1_done: blk->ln_1 already holds the layer norm of
 * x (the previous block computed it with its last residual add); next: the
 * layer norm that reads blk->out (the next block's ln_1, or the model's
 * final one), computed here with the last residual add, or NULL. */
static inline int32_t kiln_nn__block_forward(kiln_nn_ctx *c, kiln_nn_block *blk, const void *x, int32_t B, int32_t T,
                                             int ln1_done, kiln_nn_layernorm *next) {
    const int32_t rows = B * T;
    blk->rows = rows;
    int32_t rc = ln1_done ? KILN_OK : kiln_nn_layernorm_forward(c, &blk->ln_1, x, rows);
    if (rc == KILN_OK) rc = kiln_nn_attention_forward(c, &blk->attn, blk->ln_1.y, B, T);
    /* adt + sdt -> adt: with 16-bit storage, add's b is the 16-bit one */
    if (rc == KILN_OK)
        rc = kiln_nn_add_layernorm_forward(c, &blk->ln_2, blk->res1, x, blk->attn.c_proj.y, rows,
                                           "add (attention residual)");
    if (rc == KILN_OK) rc = kiln_nn_mlp_forward(c, &blk->mlp, blk->ln_2.y, rows);
    if (rc != KILN_OK) return rc;
    if (next) return kiln_nn_add_layernorm_forward(c, next, blk->out, blk->res1, blk->mlp.c_proj.y, rows,
                                                   "add (mlp residual)");
    KILN_NN__K(c,
               c->k->add(c->acc, kiln_nn_sdt(c), blk->out, blk->res1, blk->mlp.c_proj.y,
                         (size_t)rows * (size_t)blk->ln_1.C),
               "add (mlp residual)", blk->ln_1.w->name);
    return KILN_OK;
}

/* x (B*T, C), kept by the caller until the backward -> blk->out (B*T, C). */
static inline int32_t kiln_nn_block_forward(kiln_nn_ctx *c, kiln_nn_block *blk, const void *x, int32_t B, int32_t T) {
    return kiln_nn__block_forward(c, blk, x, B, T, 0, NULL);
}

/* A stack of n blocks and the layer norm after it: x (B*T, C), kept by the
 * caller until the backward -> blocks[n - 1].out and final->y (final may be
 * NULL). Every residual add runs fused with the layer norm that reads its
 * sum (the block's ln_2, the next block's ln_1, final) where the table has
 * 1.10's add_layernorm_forward: per block two launches fewer, and one read
 * of the residual stream fewer each time. The same values either way. */
static inline int32_t kiln_nn_blocks_forward(kiln_nn_ctx *c, kiln_nn_block *blocks, int32_t n, const void *x, int32_t B,
                                             int32_t T, kiln_nn_layernorm *final) {
    if (n == 0) return final ? kiln_nn_layernorm_forward(c, final, x, B * T) : KILN_OK;
    int32_t rc = KILN_OK;
    for (int32_t l = 0; l < n && rc == KILN_OK; l++) {
        rc = kiln_nn__block_forward(c, &blocks[l], x, B, T, l > 0, l + 1 < n ? &blocks[l + 1].ln_1 : final);
        x = blocks[l].out;
    }
    return rc;
}

/* A block's backward; cast_out: a Linear's backward reads dres next (the
 * previous block's MLP), so ln_1's backward may leave its 16-bit copy. */
static inline int32_t kiln_nn__block_backward(kiln_nn_ctx *c, kiln_nn_block *blk, void *dres, const kiln_nn_scratch *s,
                                              int cast_out) {
    /* out = res1 + mlp(ln_2(res1)): dres already is d(res1) through the
     * identity branch; add the MLP branch's. The attention's c_proj reads
     * the sum next, its 16-bit copy from d_qkv (attention_backward lends
     * it), which ln_2's backward may write. */
    int32_t rc = kiln_nn_mlp_backward(c, &blk->mlp, dres, s->d_ln, 0, s);
    if (rc == KILN_OK) rc = kiln_nn_layernorm_backward_cast(c, &blk->ln_2, s->d_ln, dres, 1, s->d_qkv, s->d_qkv_bytes);
    /* res1 = x + attn(ln_1(x)): likewise; the MLP's c_proj lends d_qkv. */
    if (rc == KILN_OK) rc = kiln_nn_attention_backward(c, &blk->attn, dres, s->d_ln, 0, s);
    if (rc == KILN_OK)
        rc = kiln_nn_layernorm_backward_cast(c, &blk->ln_1, s->d_ln, dres, 1, cast_out ? s->d_qkv : NULL,
                                             s->d_qkv_bytes);
    return rc;
}

/* dres (rows, C): on entry the gradient at blk->out, on return the gradient
 * at the block's input x (updated in place: both residual branches add
 * into it). Uses every scratch buffer. */
static inline int32_t kiln_nn_block_backward(kiln_nn_ctx *c, kiln_nn_block *blk, void *dres,
                                             const kiln_nn_scratch *s) {
    return kiln_nn__block_backward(c, blk, dres, s, 0);
}

/* The backward of kiln_nn_blocks_forward: d_final (rows, C), in sdt, is
 * the gradient at final->y (final NULL: dres holds the gradient at
 * blocks[n - 1].out on entry). dres (rows, C), in adt, is written with the
 * gradient at the first block's input. Each layer norm whose gradient a
 * Linear's backward reads next (final, every ln_2, each ln_1 but the first
 * block's) writes that Linear's 16-bit copy of it where the table has
 * 1.11's layernorm_backward_cast: two passes per block fewer. The same
 * values either way. */
static inline int32_t kiln_nn_blocks_backward(kiln_nn_ctx *c, kiln_nn_block *blocks, int32_t n, void *dres,
                                              const kiln_nn_scratch *s, kiln_nn_layernorm *final,
                                              const void *d_final) {
    c->ready16 = NULL; /* nothing stale from an unfinished backward */
    c->ready16_of = NULL;
    int32_t rc = final ? kiln_nn_layernorm_backward_cast(c, final, d_final, dres, 0, n > 0 ? s->d_qkv : NULL,
                                                         s->d_qkv_bytes)
                       : KILN_OK;
    for (int32_t l = n - 1; l >= 0 && rc == KILN_OK; l--) rc = kiln_nn__block_backward(c, &blocks[l], dres, s, l > 0);
    return rc;
}

#undef KILN_NN__K

#ifdef __cplusplus
}
#endif

#endif /* KILN_NN_H */
