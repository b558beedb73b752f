/*
 * accel_checks.h — the argument checks the two accelerator plugins ("cpu"
 * and "cuda") make before the same kernel-table entries, written once. The
 * contract says a module that runs on one accelerator runs on the other, so
 * both refuse the same calls (a dtype other than float32/float64, a negative
 * size, a NULL buffer that would be touched, a size past the address space,
 * a forbidden overlap: KILN_E_INVALID_ARG; a token or target out of range:
 * KILN_E_DATA) with the same message, which the cuda plugin only prefixes
 * with "cuda: ". Each plugin keeps what differs: where the indices live
 * (host memory, or device memory read back), its launch, and its own early
 * returns.
 *
 * Header only, every function static inline, so each plugin (and each test
 * fixture built from a plugin's sources against an older ABI's headers)
 * compiles its own copy with no library or include path to add. Internal to
 * the plugins; never installed. Names start with ack_ (accelerator checks).
 */
#ifndef KILN_PLUGINS_COMMON_ACCEL_CHECKS_H
#define KILN_PLUGINS_COMMON_ACCEL_CHECKS_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include <kiln/kiln.h>

/* Where a refusal goes: the instance's host services, and the text that
 * starts every message ("" for cpu, "cuda: " for cuda). Built per call with
 * ACK_SINK, since each plugin has its own instance struct. */
typedef struct ack_sink {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    const char *pfx;
} ack_sink;

#define ACK_SINK(acc, pfx) ((ack_sink){(acc)->svc, (acc)->hctx, (pfx)})

/* `fmt` is the message after "<prefix><entry>: "; the variadic arguments
 * follow the entry's name. */
#define ACK_ERR(s, code, fn, fmt, ...) kiln_errorf((s).svc, (s).hctx, (code), "%s%s: " fmt, (s).pfx, (fn), __VA_ARGS__)

/* [a, a + a_bytes) and [b, b + b_bytes) share a byte. */
static inline int ack_ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    const uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

/* The same, where either buffer may be absent (NULL or empty). */
static inline int ack_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    return a && b && a_bytes && b_bytes && ack_ranges_overlap(a, a_bytes, b, b_bytes);
}

/* A NULL pointer is only acceptable when nothing would be read or written. */
static inline int32_t ack_need(ack_sink s, const char *fn, const char *name, const void *p, size_t n) {
    if (n > 0 && !p) return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s is NULL for %zu elements", name, n);
    return KILN_OK;
}

/* p and q (named) must not share a byte. */
static inline int32_t ack_apart(ack_sink s, const char *fn, const char *pn, const void *p, size_t pb, const char *qn,
                                const void *q, size_t qb) {
    if (ack_overlap(p, pb, q, qb)) return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s overlaps %s", pn, qn);
    return KILN_OK;
}

/* softmax_xent_forward / _backward(_ex): their two (B, C) buffers of esz
 * bytes per element. The forward's probs must not share a byte with its
 * logits: a row's probabilities are written while its logits are still
 * being read (the label's logit last, for the loss). The backward's
 * dlogits may be probs itself (each element is read before its own
 * write), but not a part of it. */
static inline int32_t ack_xent_buffers(ack_sink s, const char *fn, int backward, const void *out, const void *in,
                                       int32_t B, int32_t C, size_t esz) {
    const size_t nb = (size_t)B * (size_t)C * esz; /* B, C >= 1, both int32: no overflow */
    if (!backward) return ack_apart(s, fn, "probs", out, nb, "logits", in, nb);
    if (out != in && ack_ranges_overlap(out, nb, in, nb))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s",
                       "dlogits partially overlaps probs (only dlogits == probs may alias)");
    return KILN_OK;
}

/* The float dtypes every sequence and elementwise entry takes. */
static inline int32_t ack_float_dtype(ack_sink s, const char *fn, uint32_t dt) {
    if (dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F64) return KILN_OK;
    return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "dtype must be float32 or float64, got %s (%u)", kiln_dtype_name(dt),
                   (unsigned)dt);
}

static inline int ack_is16(uint32_t dt) { return dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16; }

/* 1.7 (KILN_KERNELS_ACT_16BIT): the entries that keep activations in 16
 * bits take dtype float16 or bfloat16 too, naming the storage of their
 * activation buffers; every other buffer of the call is float32. Built
 * against older headers (the test fixtures) they refuse it as before. */
static inline int ack_act16(uint32_t dt) {
#if KILN_ABI_MINOR >= 7
    return ack_is16(dt);
#else
    (void)dt;
    return 0;
#endif
}

/* The dtype of such an entry: float32, float64, or (1.7) 16-bit storage. */
static inline int32_t ack_act_dtype(ack_sink s, const char *fn, uint32_t dt) {
    if (dt == KILN_DTYPE_F32 || dt == KILN_DTYPE_F64 || ack_act16(dt)) return KILN_OK;
    return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "dtype must be float32 or float64%s, got %s (%u)",
                   ack_act16(KILN_DTYPE_BF16) ? " (or float16/bfloat16 activation storage)" : "",
                   kiln_dtype_name(dt), (unsigned)dt);
}

/* Bytes per element of an activation buffer and of every other floating
 * buffer (statistics, biases, the residual stream) of a call in dt. */
static inline size_t ack_asz(uint32_t dt) { return kiln_dtype_size(dt); }
static inline size_t ack_msz(uint32_t dt) { return ack_act16(dt) ? sizeof(float) : kiln_dtype_size(dt); }

/* The dtype combinations gemm_ex accepts (kiln/training.h): C float32 with
 * A, B each float32, float16 or bfloat16 and round_dtype float32 (none),
 * float16 or bfloat16; everything float64 (round_dtype float32, the ABI's
 * "none", or float64, the same thing there); and from 1.6 a float16 or
 * bfloat16 C with round_dtype C's dtype and A, B each float32 or C's
 * dtype (both accelerators set KILN_KERNELS_STORE_16BIT). */
/* An operand dtype a C dtype takes: float64 beside float64; float32 or
 * C's own format beside a 16-bit C; float32 or either 16-bit format beside
 * float32. */
static inline int ack__gemm_operand_ok(uint32_t c_dtype, uint32_t x) {
    if (c_dtype == KILN_DTYPE_F64) return x == KILN_DTYPE_F64;
    if (ack_is16(c_dtype)) return x == KILN_DTYPE_F32 || x == c_dtype;
    return x == KILN_DTYPE_F32 || ack_is16(x);
}

static inline int32_t ack_gemm_ex_dtypes(ack_sink s, uint32_t a_dtype, uint32_t b_dtype, uint32_t c_dtype,
                                         uint32_t round_dtype) {
    const char *fn = "gemm_ex";
    const int c16 = ack_is16(c_dtype);
    if (c_dtype != KILN_DTYPE_F32 && c_dtype != KILN_DTYPE_F64 && !c16)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "c_dtype must be float32, float64, float16 or bfloat16, got %s (%u)",
                       kiln_dtype_name(c_dtype), (unsigned)c_dtype);
    const int a_ok = ack__gemm_operand_ok(c_dtype, a_dtype), b_ok = ack__gemm_operand_ok(c_dtype, b_dtype);
    if (!a_ok || !b_ok) {
        const uint32_t bad = a_ok ? b_dtype : a_dtype;
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "c_dtype %s needs %s%s A and B, got %s %s (%u)",
                       kiln_dtype_name(c_dtype),
                       c_dtype == KILN_DTYPE_F64 ? "float64" : c16 ? "float32 or " : "float32, float16 or bfloat16",
                       c16 ? kiln_dtype_name(c_dtype) : "", a_ok ? "b_dtype" : "a_dtype", kiln_dtype_name(bad),
                       (unsigned)bad);
    }
    if (c_dtype == KILN_DTYPE_F32 && round_dtype != KILN_DTYPE_F32 && !ack_is16(round_dtype))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn,
                       "round_dtype must be float32 (no rounding), float16 or bfloat16 for c_dtype float32, got "
                       "%s (%u)",
                       kiln_dtype_name(round_dtype), (unsigned)round_dtype);
    if (c_dtype == KILN_DTYPE_F64 && round_dtype != KILN_DTYPE_F32 && round_dtype != KILN_DTYPE_F64)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn,
                       "c_dtype float64 takes round_dtype float32 (no rounding) or float64, got %s (%u) (a float64 "
                       "product is not rounded through 16-bit formats)",
                       kiln_dtype_name(round_dtype), (unsigned)round_dtype);
    if (c16 && round_dtype != c_dtype)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn,
                       "c_dtype %s takes round_dtype %s (its output is stored rounded), got %s (%u)",
                       kiln_dtype_name(c_dtype), kiln_dtype_name(c_dtype), kiln_dtype_name(round_dtype),
                       (unsigned)round_dtype);
    return KILN_OK;
}

/* round_dtype as linear_forward takes it: float32 is "none"; the 16-bit
 * formats round float32 data; float64 data accepts float64 (none) too.
 * `prep` is the message's word before "dtype" ("for", or "with" in the cpu
 * attention entries' older wording, kept as the tests read it). */
static inline int32_t ack_round_dtype(ack_sink s, const char *fn, uint32_t dt, uint32_t rd, const char *prep) {
    const int r16 = rd == KILN_DTYPE_F16 || rd == KILN_DTYPE_BF16;
    if (ack_act16(dt)) { /* 16-bit storage: the store is the rounding */
        if (rd == dt) return KILN_OK;
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "round_dtype must be %s %s %s activation storage, got %s (%u)",
                       kiln_dtype_name(dt), prep, kiln_dtype_name(dt), kiln_dtype_name(rd), (unsigned)rd);
    }
    if (rd == KILN_DTYPE_F32 || (dt == KILN_DTYPE_F32 && r16) || (dt == KILN_DTYPE_F64 && rd == KILN_DTYPE_F64))
        return KILN_OK;
    return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "round_dtype must be %s %s dtype %s, got %s (%u)",
                   dt == KILN_DTYPE_F32 ? "float32 (none), float16 or bfloat16" : "float32 (none) or float64", prep,
                   kiln_dtype_name(dt), kiln_dtype_name(rd), (unsigned)rd);
}

/* *out = a * b * c elements, refused when their bytes in float64 would not
 * fit in a size_t (so every later `elements * size` is exact). */
static inline int32_t ack_elems(ack_sink s, const char *fn, size_t a, size_t b, size_t c, size_t *out) {
    size_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc) || abc > SIZE_MAX / 8)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%zu x %zu x %zu elements is larger than the address space", a, b, c);
    *out = abc;
    return KILN_OK;
}

/* n elements of one buffer: at most what ack_elems allows. */
static inline int32_t ack_count(ack_sink s, const char *fn, size_t n) {
    if (n > SIZE_MAX / 8)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "n=%zu elements is larger than the address space", n);
    return KILN_OK;
}

/* A list of tensors as the list entries take it (unscale_check,
 * sumsq_many): host arrays x(count) and n(count), x[i] NULL only where
 * n[i] is 0, each n[i] a size ack_count allows. */
static inline int32_t ack_tensor_list(ack_sink s, const char *fn, const void *const *x, const size_t *n,
                                      uint32_t count) {
    if (count > 0 && (!x || !n))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "NULL %s array for count=%u", !x ? "x" : "n", (unsigned)count);
    for (uint32_t i = 0; i < count; i++) {
        if (n[i] > 0 && !x[i])
            return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "x[%u] is NULL with n[%u]=%zu", (unsigned)i, (unsigned)i, n[i]);
        int32_t rc = ack_count(s, fn, n[i]);
        if (rc != KILN_OK) return rc;
    }
    return KILN_OK;
}

/* adamw_update_many's lists (1.10): host arrays p, g, m, v, n and
 * weight_decay of count, each tensor's four pointers non-NULL where n[i] >
 * 0, each n[i] a size ack_count allows, and a 1-based step. */
static inline int32_t ack_adamw_list(ack_sink s, const char *fn, uint32_t count, void *const *p, const void *const *g,
                                     void *const *m, void *const *v, const size_t *n, const double *weight_decay,
                                     int64_t step) {
    if (step < 1) return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "step is 1-based, got %lld", (long long)step);
    if (count == 0) return KILN_OK;
    const char *null = !p ? "p" : !g ? "g" : !m ? "m" : !v ? "v" : !n ? "n" : !weight_decay ? "weight_decay" : NULL;
    if (null) return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "NULL %s array for count=%u", null, (unsigned)count);
    for (uint32_t i = 0; i < count; i++) {
        int32_t rc = ack_count(s, fn, n[i]);
        if (rc != KILN_OK) return rc;
        if (n[i] == 0) continue;
        const char *t = !p[i] ? "p" : !g[i] ? "g" : !m[i] ? "m" : !v[i] ? "v" : NULL;
        if (t)
            return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s[%u] is NULL with n[%u]=%zu", t, (unsigned)i, (unsigned)i,
                           n[i]);
    }
    return KILN_OK;
}

/* tokens(B*T), on the host, all in [0, V), else KILN_E_DATA naming the
 * first bad one with its batch and position. */
static inline int32_t ack_tokens_in_range(ack_sink s, const char *fn, const int32_t *tokens, int32_t B, int32_t T,
                                          int32_t V) {
    const size_t n = (size_t)B * (size_t)T;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return ACK_ERR(s, KILN_E_DATA, fn,
                           "token %d at index %zu (batch %zu, position %zu) is outside [0, %d) (vocabulary size V=%d)",
                           (int)tokens[i], i, i / (size_t)T, i % (size_t)T, (int)V, (int)V);
    return KILN_OK;
}

/* The fused cross-entropy's refusal of a target outside [-1, V). */
static inline int32_t ack_bad_target(ack_sink s, const char *fn, int32_t target, int32_t row, int32_t V) {
    return ACK_ERR(s, KILN_E_DATA, fn, "target %d at row %d is outside [-1, %d) (-1 ignores the row; V=%d)",
                   (int)target, (int)row, (int)V, (int)V);
}

/* act: one of the KILN_ACT_* ids. */
static inline int32_t ack_act(ack_sink s, const char *fn, int32_t act) {
    if (act >= KILN_ACT_RELU && act <= KILN_ACT_LEAKY_RELU) return KILN_OK;
    return ACK_ERR(s, KILN_E_INVALID_ARG, fn,
                   "act must be KILN_ACT_RELU (%d), KILN_ACT_GELU (%d), KILN_ACT_TANH (%d), KILN_ACT_SIGMOID "
                   "(%d) or KILN_ACT_LEAKY_RELU (%d), got %d",
                   (int)KILN_ACT_RELU, (int)KILN_ACT_GELU, (int)KILN_ACT_TANH, (int)KILN_ACT_SIGMOID,
                   (int)KILN_ACT_LEAKY_RELU, (int)act);
}

/* ----------------------------------------------------------- Linear layer */

/* 1.8: linear_forward_layout's w_layout may carry KILN_LAYOUT_ROUND_BIAS.
 * ack_layout strips it (the weight layout proper), ack_round_bias says
 * whether it is there. Built against older headers (the test fixtures)
 * there is no flag, so it stays part of an unknown layout and is refused. */
static inline int32_t ack_layout(int32_t w_layout) {
#if KILN_ABI_MINOR >= 8
    return w_layout & ~(int32_t)KILN_LAYOUT_ROUND_BIAS;
#else
    return w_layout;
#endif
}
static inline int ack_round_bias(int32_t w_layout) { return ack_layout(w_layout) != w_layout; }

/* linear_forward's and (1.6) linear_forward_layout's checks, in this order:
 * the layout (0: w (out, in), 1: w (in, out); KILN_LAYOUT_* as numbers,
 * since the fixtures built against older headers lack the names; 1.8's
 * bias rounding needs a 16-bit round_dtype), dtype,
 * act (< 0: none), sizes, round_dtype, w_dtype (dt, or a 16-bit format
 * beside float32), the buffers the call touches, and the overlaps the
 * backward forbids. *go = 0 when rows * out == 0 (nothing to compute). */
static inline int32_t ack_linear(ack_sink s, const char *fn, uint32_t dt, const void *x, const void *w, uint32_t wt,
                                 int32_t w_layout, int32_t rows, int32_t in, int32_t out, int32_t act, const void *y,
                                 const void *post, uint32_t rt, int *go) {
    int32_t rc;
    *go = 0;
    const int32_t lay = ack_layout(w_layout);
    if (lay != 0 && lay != 1)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn,
                       "w_layout must be KILN_LAYOUT_OUT_IN (0) or KILN_LAYOUT_IN_OUT (1)%s, got %d",
                       ack_round_bias(~0) ? ", optionally | KILN_LAYOUT_ROUND_BIAS" : "", (int)w_layout);
    if (ack_round_bias(w_layout) && !ack_is16(rt))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn,
                       "KILN_LAYOUT_ROUND_BIAS rounds the bias through round_dtype, which must then be float16 or "
                       "bfloat16, got %s (%u)",
                       kiln_dtype_name(rt), (unsigned)rt);
    if ((rc = ack_act_dtype(s, fn, dt)) != KILN_OK) return rc;
    if (act >= 0 && (rc = ack_act(s, fn, act)) != KILN_OK) return rc;
    if (rows < 0 || in < 0 || out < 0)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "rows, in, out must be >= 0, got %d, %d, %d", (int)rows, (int)in,
                       (int)out);
    if ((rc = ack_round_dtype(s, fn, dt, rt, "for")) != KILN_OK) return rc;
    if (!(wt == dt || (dt == KILN_DTYPE_F32 && ack_is16(wt)) || (ack_act16(dt) && wt == KILN_DTYPE_F32)))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "w_dtype must be %s%s, got %s (%u)", kiln_dtype_name(dt),
                       dt == KILN_DTYPE_F32 ? ", float16 or bfloat16" : ack_act16(dt) ? " or float32" : "",
                       kiln_dtype_name(wt), (unsigned)wt);
    /* x, y and post are activations (16-bit under 1.7 storage) */
    const size_t ny = (size_t)rows * (size_t)out, nx = (size_t)rows * (size_t)in, esz = ack_asz(dt);
    if (ny == 0) return KILN_OK;
    if ((rc = ack_need(s, fn, "y", y, ny)) != KILN_OK) return rc;
    if (act >= 0 && !post)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "post is NULL for %zu elements (act >= 0)", ny);
    if ((rc = ack_need(s, fn, "x", x, nx)) != KILN_OK ||
        (rc = ack_need(s, fn, "w", w, (size_t)out * (size_t)in)) != KILN_OK)
        return rc;
    if (act >= 0 && ack_ranges_overlap(y, ny * esz, post, ny * esz))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s", "y and post overlap (the backward needs both)");
    if (in > 0 && ack_ranges_overlap(y, ny * esz, x, nx * esz))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s", "y overlaps the input x");
    *go = 1;
    return KILN_OK;
}

/* ------------------------------------------------------------- embedding */

/* The embedding's sizes: B, T, C, V >= 0, and the element counts of out or
 * dout (B, T, C), wte (V, C) and wpe (T, C). */
static inline int32_t ack_emb_sizes(ack_sink s, const char *fn, int32_t B, int32_t T, int32_t C, int32_t V,
                                    size_t *nbtc, size_t *nwte, size_t *nwpe) {
    if (B < 0 || T < 0 || C < 0 || V < 0)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "B, T, C, V must be >= 0, got %d, %d, %d, %d", (int)B, (int)T,
                       (int)C, (int)V);
    int32_t rc;
    if ((rc = ack_elems(s, fn, (size_t)B, (size_t)T, (size_t)C, nbtc)) != KILN_OK ||
        (rc = ack_elems(s, fn, (size_t)V, (size_t)C, 1, nwte)) != KILN_OK ||
        (rc = ack_elems(s, fn, (size_t)T, (size_t)C, 1, nwpe)) != KILN_OK)
        return rc;
    return KILN_OK;
}

/* embedding_forward's checks short of the tokens' range: dtype, sizes, the
 * NULL buffers, the overlaps. *nout = B*T*C; *go = 0 when there are no
 * positions (nothing to check or write). */
static inline int32_t ack_emb_forward(ack_sink s, const char *fn, uint32_t dtype, void *out, const int32_t *tokens,
                                      const void *wte, const void *wpe, int32_t B, int32_t T, int32_t C, int32_t V,
                                      size_t *nout, int *go) {
    size_t nwte = 0, nwpe = 0;
    int32_t rc;
    *go = 0;
    if ((rc = ack_float_dtype(s, fn, dtype)) != KILN_OK ||
        (rc = ack_emb_sizes(s, fn, B, T, C, V, nout, &nwte, &nwpe)) != KILN_OK)
        return rc;
    const size_t n = (size_t)B * (size_t)T, esz = kiln_dtype_size(dtype), ob = *nout * esz;
    if ((rc = ack_need(s, fn, "tokens", tokens, n)) != KILN_OK ||
        (rc = ack_need(s, fn, "out", out, *nout)) != KILN_OK || (rc = ack_need(s, fn, "wte", wte, *nout)) != KILN_OK)
        return rc;
    if (n == 0) return KILN_OK;
    if ((rc = ack_apart(s, fn, "out", out, ob, "wte", wte, nwte * esz)) != KILN_OK ||
        (rc = ack_apart(s, fn, "out", out, ob, "wpe", wpe, nwpe * esz)) != KILN_OK ||
        (rc = ack_apart(s, fn, "out", out, ob, "tokens", tokens, n * sizeof *tokens)) != KILN_OK)
        return rc;
    *go = 1;
    return KILN_OK;
}

/* embedding_backward's checks short of the tokens' range, the same way;
 * max_n is the most positions the plugin's bucket index holds. *go = 0 also
 * when both tables are frozen (dwte and dwpe NULL). */
static inline int32_t ack_emb_backward(ack_sink s, const char *fn, uint32_t dtype, void *dwte, void *dwpe,
                                       const void *dout, const int32_t *tokens, int32_t B, int32_t T, int32_t C,
                                       int32_t V, size_t max_n, size_t *ndout, int *go) {
    size_t nwte = 0, nwpe = 0;
    int32_t rc;
    *go = 0;
    if ((rc = ack_float_dtype(s, fn, dtype)) != KILN_OK ||
        (rc = ack_emb_sizes(s, fn, B, T, C, V, ndout, &nwte, &nwpe)) != KILN_OK)
        return rc;
    if (!dwte && !dwpe) return KILN_OK; /* both tables frozen */
    const size_t n = (size_t)B * (size_t)T, esz = kiln_dtype_size(dtype);
    if ((rc = ack_need(s, fn, "dout", dout, *ndout)) != KILN_OK) return rc;
    if (dwte && (rc = ack_need(s, fn, "tokens", tokens, n)) != KILN_OK) return rc;
    if (dwte && n > max_n)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "B*T = %zu positions is above %d", n, (int)max_n);
    if (n == 0) return KILN_OK;
    const size_t wb = nwte * esz, pb = nwpe * esz, db = *ndout * esz, tb = n * sizeof *tokens;
    if ((rc = ack_apart(s, fn, "dwte", dwte, wb, "dout", dout, db)) != KILN_OK ||
        (rc = ack_apart(s, fn, "dwpe", dwpe, pb, "dout", dout, db)) != KILN_OK ||
        (rc = ack_apart(s, fn, "dwte", dwte, wb, "dwpe", dwpe, pb)) != KILN_OK)
        return rc;
    if (tokens && ((rc = ack_apart(s, fn, "dwte", dwte, wb, "tokens", tokens, tb)) != KILN_OK ||
                   (rc = ack_apart(s, fn, "dwpe", dwpe, pb, "tokens", tokens, tb)) != KILN_OK))
        return rc;
    *go = 1;
    return KILN_OK;
}

/* ------------------------------------------------------------ layer norm */

/* The layer norm's sizes: N >= 0, C >= 1 (unless N = 0), and *nx = N * C. */
static inline int32_t ack_ln_elems(ack_sink s, const char *fn, int32_t N, int32_t C, size_t *nx) {
    if (N < 0 || C < 0 || (N > 0 && C == 0))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "N must be >= 0 and C >= 1, got N=%d C=%d", (int)N, (int)C);
    return ack_elems(s, fn, (size_t)N, (size_t)C, 1, nx);
}

/* layernorm_forward's checks: dtype, round_dtype, N and C, eps, the NULL
 * buffers and the overlaps. eps_first: eps is checked before N and C (the
 * cuda plugin's order; the cpu checks N and C first), so a call wrong in
 * both is named as each plugin always named it. *go = 0 when there are no
 * elements. */
static inline int32_t ack_ln_forward(ack_sink s, const char *fn, uint32_t dtype, void *y, void *mean, void *rstd,
                                     const void *x, const void *w, const void *b, int32_t N, int32_t C, double eps,
                                     uint32_t round_dtype, int eps_first, int *go) {
    int32_t rc;
    size_t nx = 0;
    *go = 0;
    if ((rc = ack_act_dtype(s, fn, dtype)) != KILN_OK ||
        (rc = ack_round_dtype(s, fn, dtype, round_dtype, "for")) != KILN_OK)
        return rc;
    for (int step = 0; step < 2; step++) {
        if (step == (eps_first ? 0 : 1) && !(eps >= 0.0))
            return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "eps must be >= 0, got %g", eps);
        if (step == (eps_first ? 1 : 0) && (N < 0 || C < 0 || (N > 0 && C == 0)))
            return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "N must be >= 0 and C >= 1, got N=%d C=%d", (int)N, (int)C);
    }
    if ((rc = ack_ln_elems(s, fn, N, C, &nx)) != KILN_OK) return rc;
    if (nx == 0) return KILN_OK;
    if ((rc = ack_need(s, fn, "y", y, nx)) != KILN_OK || (rc = ack_need(s, fn, "x", x, nx)) != KILN_OK ||
        (rc = ack_need(s, fn, "mean", mean, (size_t)N)) != KILN_OK ||
        (rc = ack_need(s, fn, "rstd", rstd, (size_t)N)) != KILN_OK)
        return rc;
    /* y is the activation (16-bit under 1.7 storage), the rest float32 */
    const size_t esz = ack_msz(dtype), xb = nx * esz, yb = nx * ack_asz(dtype), rb = (size_t)N * esz,
                 cb = (size_t)C * esz;
    if ((rc = ack_apart(s, fn, "y", y, yb, "x", x, xb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "y", y, yb, "w", w, cb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "y", y, yb, "b", b, cb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "mean", mean, rb, "rstd", rstd, rb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "mean", mean, rb, "y", y, yb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "mean", mean, rb, "x", x, xb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "rstd", rstd, rb, "y", y, yb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "rstd", rstd, rb, "x", x, xb)) != KILN_OK)
        return rc;
    *go = 1;
    return KILN_OK;
}

/* layernorm_backward's checks. The contract forbids only dx over dy; dx over
 * the other inputs (x, w, mean, rstd) or dw/db over anything would have a
 * row's output overwrite what a later element or row still reads, so those
 * are refused too. *go = 0 when there are no elements. */
static inline int32_t ack_ln_backward(ack_sink s, const char *fn, uint32_t dtype, void *dx, void *dw, void *db,
                                      const void *dy, const void *x, const void *w, const void *mean,
                                      const void *rstd, int32_t N, int32_t C, int *go) {
    int32_t rc;
    size_t nx = 0;
    *go = 0;
    if ((rc = ack_act_dtype(s, fn, dtype)) != KILN_OK || (rc = ack_ln_elems(s, fn, N, C, &nx)) != KILN_OK)
        return rc;
    if (nx == 0) return KILN_OK;
    if ((rc = ack_need(s, fn, "dx", dx, nx)) != KILN_OK || (rc = ack_need(s, fn, "dy", dy, nx)) != KILN_OK ||
        (rc = ack_need(s, fn, "x", x, nx)) != KILN_OK || (rc = ack_need(s, fn, "mean", mean, (size_t)N)) != KILN_OK ||
        (rc = ack_need(s, fn, "rstd", rstd, (size_t)N)) != KILN_OK)
        return rc;
    /* dy is the activation gradient (16-bit under 1.7 storage) */
    const size_t esz = ack_msz(dtype), xb = nx * esz, rb = (size_t)N * esz, cb = (size_t)C * esz;
    static const char *const in_names[5] = {"dy", "x", "w", "mean", "rstd"};
    const void *ins[5] = {dy, x, w, mean, rstd};
    const size_t in_bytes[5] = {nx * ack_asz(dtype), xb, cb, rb, rb};
    for (int i = 0; i < 5; i++)
        if ((rc = ack_apart(s, fn, "dx", dx, xb, in_names[i], ins[i], in_bytes[i])) != KILN_OK) return rc;
    if ((rc = ack_apart(s, fn, "dw", dw, cb, "db", db, cb)) != KILN_OK) return rc;
    for (int o = 0; o < 2; o++) {
        const void *g = o == 0 ? dw : db;
        const char *gn = o == 0 ? "dw" : "db";
        if (ack_overlap(g, cb, dx, xb)) return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s overlaps dx", gn);
        for (int i = 0; i < 5; i++)
            if (ack_overlap(g, cb, ins[i], in_bytes[i]))
                return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s overlaps the input %s", gn, in_names[i]);
    }
    *go = 1;
    return KILN_OK;
}

/* ------------------------------------------------------------- attention */

/* Sizes, round_dtype (worded with `prep`, see ack_round_dtype) and the
 * element counts n[] of qkv (B, T, 3C), out (B, T, C) and lse (B, NH, T),
 * indexed by ACK_QKV, ACK_OUT and ACK_LSE below. n[] is zero on a refusal,
 * so it is set on every path (gcc -O3 warns of its callers otherwise). */
static inline int32_t ack_attn_args(ack_sink s, const char *fn, uint32_t dtype, int32_t B, int32_t T, int32_t C,
                                    int32_t NH, uint32_t round_dtype, const char *prep, size_t n[3]) {
    n[0] = n[1] = n[2] = 0;
    int32_t rc = ack_act_dtype(s, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "B, T, C and NH must be > 0, got B=%d T=%d C=%d NH=%d", (int)B,
                       (int)T, (int)C, (int)NH);
    if (C % NH != 0)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "C=%d is not a multiple of NH=%d (head size C/NH)", (int)C, (int)NH);
    /* The GEMMs take the row stride 3C as an int. */
    if (C > INT_MAX / 3)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "C=%d is too large (3C must fit in an int)", (int)C);
    const size_t rows = (size_t)B * (size_t)T, elem = ack_msz(dtype);
    if (rows > SIZE_MAX / (3 * (size_t)C) / elem)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "B=%d T=%d C=%d is larger than the address space", (int)B, (int)T,
                       (int)C);
    if ((rc = ack_round_dtype(s, fn, dtype, round_dtype, prep)) != KILN_OK) return rc;
    n[0] = rows * 3 * (size_t)C; /* ACK_QKV */
    n[1] = rows * (size_t)C;     /* ACK_OUT */
    n[2] = rows * (size_t)NH;    /* ACK_LSE */
    return KILN_OK;
}

/* Which of ack_attn_args's counts (n[]) a buffer has. */
enum { ACK_QKV, ACK_OUT, ACK_LSE };

/* Bytes per element of a buffer of that kind: lse is float32 beside 16-bit
 * storage (1.7), the others are activations. */
static inline size_t ack_attn_esz(uint32_t dtype, int kind) {
    return kind == ACK_LSE ? ack_msz(dtype) : ack_asz(dtype);
}

/* The NULL checks of the nbuf buffers an attention pass touches, in order:
 * bufs[i] (named names[i]) holds n[kinds[i]] elements. */
static inline int32_t ack_attn_need(ack_sink s, const char *fn, int nbuf, const char *const names[],
                                    const void *const bufs[], const int kinds[], const size_t n[3]) {
    int32_t rc = KILN_OK;
    for (int i = 0; rc == KILN_OK && i < nbuf; i++) rc = ack_need(s, fn, names[i], bufs[i], n[kinds[i]]);
    return rc;
}

/* ------------------------------------------------------ cross-entropy, add */

/* xent_fused's checks short of the targets' range (16-bit logits: 1.6).
 * *nl = N * Vp. */
static inline int32_t ack_xent(ack_sink s, const char *fn, uint32_t dtype, void *logits, const int32_t *targets,
                               int32_t N, int32_t V, int32_t Vp, const double *loss_sum, size_t *nl) {
    int32_t rc = KILN_OK;
    if (dtype != KILN_DTYPE_F32 && dtype != KILN_DTYPE_F64 && !ack_is16(dtype)) /* 16-bit: 1.6 */
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "dtype must be float32, float64, float16 or bfloat16, got %s (%u)",
                       kiln_dtype_name(dtype), (unsigned)dtype);
    if (N < 0 || V < 1 || Vp < V)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "need N >= 0, V >= 1 and Vp >= V, got N=%d V=%d Vp=%d", (int)N,
                       (int)V, (int)Vp);
    if (!loss_sum) return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s", "loss_sum is NULL");
    if ((rc = ack_elems(s, fn, (size_t)N, (size_t)Vp, 1, nl)) != KILN_OK ||
        (rc = ack_need(s, fn, "logits", logits, *nl)) != KILN_OK ||
        (rc = ack_need(s, fn, "targets", targets, (size_t)N)) != KILN_OK)
        return rc;
    return ack_apart(s, fn, "logits", logits, *nl * kiln_dtype_size(dtype), "targets", targets,
                     (size_t)N * sizeof *targets);
}

/* add's checks: y == a or y == b is the in-place residual add; a shifted
 * overlap would overwrite inputs not yet read. *go = 0 when n = 0. */
static inline int32_t ack_add(ack_sink s, const char *fn, uint32_t dtype, void *y, const void *a, const void *b,
                              size_t n, int *go) {
    int32_t rc;
    *go = 0;
    if ((rc = ack_act_dtype(s, fn, dtype)) != KILN_OK || (rc = ack_count(s, fn, n)) != KILN_OK ||
        (rc = ack_need(s, fn, "y", y, n)) != KILN_OK || (rc = ack_need(s, fn, "a", a, n)) != KILN_OK ||
        (rc = ack_need(s, fn, "b", b, n)) != KILN_OK)
        return rc;
    if (n == 0) return KILN_OK;
    /* 1.7 storage: b is the 16-bit activation added to the float32 y = a */
    const size_t nb = n * ack_msz(dtype), nbb = n * ack_asz(dtype);
    if (y != a && ack_ranges_overlap(y, nb, a, nb))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s", "y partially overlaps a (only y == a may alias)");
    if (ack_act16(dtype) && ack_ranges_overlap(y, nb, b, nbb))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "y overlaps the %s b (only y == a may alias)",
                       kiln_dtype_name(dtype));
    if (!ack_act16(dtype) && y != b && ack_ranges_overlap(y, nb, b, nb))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s", "y partially overlaps b (only y == b may alias)");
    *go = 1;
    return KILN_OK;
}

/* add_layernorm_forward's checks (1.10): layernorm_forward's with x = res,
 * then add's over its N * C elements, then the outputs y, mean and rstd
 * apart from the inputs a and b (a row's outputs must not land on what a
 * later row still reads). *go = 0 when there are no elements. */
static inline int32_t ack_add_ln_forward(ack_sink s, const char *fn, uint32_t dtype, void *res, const void *a,
                                         const void *b, void *y, void *mean, void *rstd, const void *w,
                                         const void *bias, int32_t N, int32_t C, double eps, uint32_t round_dtype,
                                         int eps_first, int *go) {
    int ln = 0, add = 0;
    *go = 0;
    int32_t rc = ack_ln_forward(s, fn, dtype, y, mean, rstd, res, w, bias, N, C, eps, round_dtype, eps_first, &ln);
    if (rc != KILN_OK || !ln) return rc;
    const size_t n = (size_t)N * (size_t)C;
    if ((rc = ack_add(s, fn, dtype, res, a, b, n, &add)) != KILN_OK) return rc;
    const size_t xb = n * ack_msz(dtype), bb = n * ack_asz(dtype), yb = n * ack_asz(dtype),
                 rb = (size_t)N * ack_msz(dtype);
    if ((rc = ack_apart(s, fn, "y", y, yb, "a", a, xb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "y", y, yb, "b", b, bb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "mean", mean, rb, "a", a, xb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "mean", mean, rb, "b", b, bb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "rstd", rstd, rb, "a", a, xb)) != KILN_OK ||
        (rc = ack_apart(s, fn, "rstd", rstd, rb, "b", b, bb)) != KILN_OK)
        return rc;
    *go = add;
    return KILN_OK;
}

/* 1.11's act_bias_backward: the checks of act_backward and bias_grad_ex
 * over dx (dtype, act, rows and cols, the NULL buffers), and db apart from
 * dx, dy and x (the sum would read what it writes). dx may be dy itself.
 * *go = 0 when there is nothing to do (rows * cols == 0 and no db to
 * clear: bias_grad_ex zeroes db for rows == 0 unless accumulating). */
static inline int32_t ack_act_bias_backward(ack_sink s, const char *fn, uint32_t dtype, int32_t act, void *dx,
                                            void *db, const void *dy, const void *x, int32_t rows, int32_t cols,
                                            int32_t accumulate, int *go) {
    int32_t rc;
    size_t n = 0;
    *go = 0;
    if ((rc = ack_act_dtype(s, fn, dtype)) != KILN_OK || (rc = ack_act(s, fn, act)) != KILN_OK) return rc;
    if (rows < 0 || cols < 0)
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "rows and cols must be >= 0, got %d x %d", (int)rows, (int)cols);
    if ((rc = ack_elems(s, fn, (size_t)rows, (size_t)cols, 1, &n)) != KILN_OK) return rc;
    if ((rc = ack_need(s, fn, "dx", dx, n)) != KILN_OK || (rc = ack_need(s, fn, "dy", dy, n)) != KILN_OK ||
        (rc = ack_need(s, fn, "x", x, n)) != KILN_OK)
        return rc;
    if (db) {
        const size_t ab = n * ack_asz(dtype), cb = (size_t)cols * ack_msz(dtype);
        if ((rc = ack_apart(s, fn, "db", db, cb, "dx", dx, ab)) != KILN_OK ||
            (rc = ack_apart(s, fn, "db", db, cb, "dy", dy, ab)) != KILN_OK ||
            (rc = ack_apart(s, fn, "db", db, cb, "x", x, ab)) != KILN_OK)
            return rc;
    }
    *go = n > 0 || (db && cols > 0 && !accumulate);
    return KILN_OK;
}

/* 1.11's layernorm_backward_cast: layernorm_backward's checks, dtype not
 * float64 (dx is the float32 the copy is cast from), dx16_dtype a 16-bit
 * format, and dx16 apart from every other buffer. *go as there. */
static inline int32_t ack_ln_backward_cast(ack_sink s, const char *fn, uint32_t dtype, void *dx, void *dw, void *db,
                                           const void *dy, const void *x, const void *w, const void *mean,
                                           const void *rstd, int32_t N, int32_t C, void *dx16, uint32_t dx16_dtype,
                                           int *go) {
    int32_t rc = ack_ln_backward(s, fn, dtype, dx, dw, db, dy, x, w, mean, rstd, N, C, go);
    if (rc != KILN_OK) return rc;
    if (dtype == KILN_DTYPE_F64 || !ack_is16(dx16_dtype)) {
        *go = 0;
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn,
                       "the copy casts a float32 dx to float16 or bfloat16: dtype must not be float64 and dx16_dtype "
                       "must be float16 or bfloat16, got dtype %s and dx16_dtype %s (%u)",
                       kiln_dtype_name(dtype), kiln_dtype_name(dx16_dtype), (unsigned)dx16_dtype);
    }
    if (!*go) return KILN_OK;
    *go = 0;
    const size_t nx = (size_t)N * (size_t)C, esz = ack_msz(dtype), xb = nx * esz, cb = (size_t)C * esz,
                 rb = (size_t)N * esz;
    if ((rc = ack_need(s, fn, "dx16", dx16, nx)) != KILN_OK) return rc;
    static const char *const names[8] = {"dx", "dy", "x", "w", "mean", "rstd", "dw", "db"};
    const void *bufs[8] = {dx, dy, x, w, mean, rstd, dw, db};
    const size_t bytes[8] = {xb, nx * ack_asz(dtype), xb, cb, rb, rb, cb, cb};
    for (int i = 0; i < 8; i++)
        if ((rc = ack_apart(s, fn, "dx16", dx16, nx * 2, names[i], bufs[i], bytes[i])) != KILN_OK)
            return rc;
    *go = 1;
    return KILN_OK;
}

/* ------------------------------------------------------------ elementwise */

/* What every ABI 1.5 elementwise entry checks: the dtype, NULL pointers, and
 * overlap: y may be an input's very pointer (in place), never a shifted view
 * of it (an element would read a neighbour already written). an/bn name the
 * inputs in messages; bn NULL: unary. *go = 0 when n = 0. */
static inline int32_t ack_ew(ack_sink s, const char *fn, uint32_t dtype, const void *y, const void *a, const char *an,
                             const void *b, const char *bn, size_t n, int *go) {
    int32_t rc = ack_float_dtype(s, fn, dtype);
    *go = 0;
    if (rc != KILN_OK || n == 0) return rc;
    if (!y || !a || (bn && !b))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "%s is NULL for %zu elements", !y ? "y" : !a ? an : bn, n);
    if ((rc = ack_count(s, fn, n)) != KILN_OK) return rc;
    const size_t bytes = n * kiln_dtype_size(dtype);
    if (a != y && ack_ranges_overlap(y, bytes, a, bytes))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "y overlaps %s without being the same pointer (n=%zu)", an, n);
    if (bn && b != y && ack_ranges_overlap(y, bytes, b, bytes))
        return ACK_ERR(s, KILN_E_INVALID_ARG, fn, "y overlaps %s without being the same pointer (n=%zu)", bn, n);
    *go = 1;
    return KILN_OK;
}

/* The prototypes of the ABI 1.4 sequence entries (kiln_kernels' signatures)
 * under the plugin's prefix P: P##embedding_forward ... P##attention_backward,
 * defined in the plugin's sequence source. */
#define ACK_DECLARE_SEQ_ENTRIES(P)                                                                                  \
    int32_t P##embedding_forward(kiln_instance *acc, uint32_t dtype, void *out, const int32_t *tokens,             \
                                 const void *wte, const void *wpe, int32_t B, int32_t T, int32_t C, int32_t V);   \
    int32_t P##embedding_backward(kiln_instance *acc, uint32_t dtype, void *dwte, void *dwpe, const void *dout,    \
                                  const int32_t *tokens, int32_t B, int32_t T, int32_t C, int32_t V);             \
    int32_t P##layernorm_forward(kiln_instance *acc, uint32_t dtype, void *y, void *mean, void *rstd, const void *x, \
                                 const void *w, const void *b, int32_t N, int32_t C, double eps,                  \
                                 uint32_t round_dtype);                                                           \
    int32_t P##layernorm_backward(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy, \
                                  const void *x, const void *w, const void *mean, const void *rstd, int32_t N,    \
                                  int32_t C, int32_t accumulate);                                                 \
    int32_t P##xent_fused(kiln_instance *acc, uint32_t dtype, void *logits, const int32_t *targets, int32_t N,     \
                          int32_t V, int32_t Vp, double grad_scale, double *loss_sum);                            \
    int32_t P##add(kiln_instance *acc, uint32_t dtype, void *y, const void *a, const void *b, size_t n);          \
    int32_t P##attention_forward(kiln_instance *acc, uint32_t dtype, void *out, void *lse, const void *qkv,        \
                                 int32_t B, int32_t T, int32_t C, int32_t NH, uint32_t round_dtype);              \
    int32_t P##attention_backward(kiln_instance *acc, uint32_t dtype, void *dqkv, const void *dout, const void *qkv, \
                                  const void *out, const void *lse, int32_t B, int32_t T, int32_t C, int32_t NH,  \
                                  uint32_t round_dtype);

/* The seven ABI 1.5 elementwise entries of the kernel table, each one call
 * of the plugin's checked elementwise function EW(acc, fn, op, dtype, y, a,
 * an, b, bn, s0, s1, n) (which runs ack_ew, then its kernel), defined as
 * static functions named P##lerp ... P##clamp. OP is the plugin's prefix of
 * the kernel op enum (KC_EW_ or KG_EW_), SINK its sink macro (clamp's own
 * check of lo <= hi reports through it). One list, so the two plugins name
 * the inputs and pass the scalars alike. */
#define ACK_DEFINE_EW_ENTRIES(P, EW, OP, SINK)                                                                   \
    static int32_t P##lerp(kiln_instance *acc, uint32_t dt, void *y, const void *a, const void *b, double weight, \
                           size_t n) {                                                                           \
        return EW(acc, "lerp", OP##LERP, dt, y, a, "a", b, "b", weight, 0.0, n);                                  \
    }                                                                                                            \
    static int32_t P##sign(kiln_instance *acc, uint32_t dt, void *y, const void *x, size_t n) {                   \
        return EW(acc, "sign", OP##SIGN, dt, y, x, "x", NULL, NULL, 0.0, 0.0, n);                                 \
    }                                                                                                            \
    static int32_t P##mul(kiln_instance *acc, uint32_t dt, void *y, const void *a, const void *b, size_t n) {     \
        return EW(acc, "mul", OP##MUL, dt, y, a, "a", b, "b", 0.0, 0.0, n);                                       \
    }                                                                                                            \
    static int32_t P##addcmul(kiln_instance *acc, uint32_t dt, void *y, double value, const void *a,              \
                              const void *b, size_t n) {                                                         \
        return EW(acc, "addcmul", OP##ADDCMUL, dt, y, a, "a", b, "b", value, 0.0, n);                             \
    }                                                                                                            \
    static int32_t P##addcdiv(kiln_instance *acc, uint32_t dt, void *y, double value, const void *a,              \
                              const void *b, size_t n) {                                                         \
        return EW(acc, "addcdiv", OP##ADDCDIV, dt, y, a, "a", b, "b", value, 0.0, n);                             \
    }                                                                                                            \
    static int32_t P##sqrt_ex(kiln_instance *acc, uint32_t dt, void *y, const void *x, size_t n) {                \
        return EW(acc, "sqrt_ex", OP##SQRT, dt, y, x, "x", NULL, NULL, 0.0, 0.0, n);                              \
    }                                                                                                            \
    static int32_t P##clamp(kiln_instance *acc, uint32_t dt, void *y, const void *x, double lo, double hi,        \
                            size_t n) {                                                                          \
        if (!(lo <= hi))                                                                                         \
            return ACK_ERR(SINK(acc), KILN_E_INVALID_ARG, "clamp", "expected lo <= hi (neither NaN), got lo=%g hi=%g", \
                           lo, hi);                                                                              \
        return EW(acc, "clamp", OP##CLAMP, dt, y, x, "x", NULL, NULL, lo, hi, n);                                 \
    }

#endif /* KILN_PLUGINS_COMMON_ACCEL_CHECKS_H */
