/*
 * test_cuda_fake_seq.c — the cuda accelerator's transformer entries on the
 * fake CUDA build (part of test_cuda_fake_unit; cuda_fake_test.h):
 * - 1.4: the tokens read back once and the embedding backward's buckets
 *   uploaded through the staging ring, xent_fused waiting once per call,
 *   and attention = "flash" running its fused programs (emulated on the
 *   host) or the gemm path where it cannot, saying so once;
 * - 1.7, 16-bit activation storage: each of the eight entries that take
 *   it, in bfloat16 and float16 (attention on the gemm, flash and rowwise
 *   paths), against the same table's float32 call on the widened inputs
 *   with its 16-bit outputs rounded, bit for bit; the refusals of a
 *   round_dtype other than the storage, a mismatched w_dtype, an add whose
 *   y covers its 16-bit b, and an lse whose float32 bytes reach out; and
 *   the cases the cpu accelerator passes too (tests/support/act16_cases.h);
 * - 1.8, KILN_LAYOUT_ROUND_BIAS: the shared cases, cuBLASLt's bias epilogue
 *   on the 16-bit output counted, and the fall-back to float32 scratch
 *   where the device has no algorithm for it.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "act16_cases.h"
#include "cuda_fake_test.h"

/* ======================================================= 1.4 sequence */

/* The profile's exit line for `entry` names `calls` calls. */
static void profile_calls(const char *entry, unsigned calls) {
    char needle[96], want[32];
    snprintf(needle, sizeof needle, "cuda: profile: entry %s ", entry);
    snprintf(want, sizeof want, " %u calls", calls);
    const char *line = kiln_test_log_find(g_th, KILN_LOG_INFO, needle);
    CU_ASSERT_PTR_NOT_NULL(line);
    if (line) HAS(line, want);
}

/* profile = true books each interval to the entry that queued it: an
 * entry's own allocations and uploads (embedding_backward's bucket index,
 * gemm's first scratch) are its own, not "copy" or "alloc" entries, and
 * every entry's count is its calls. */
static void test_profile_attribution(void) {
    enum { B = 2, T = 5, C = 8, V = 7 };
    static const kiln_kv prof[] = {{"profile", KILN_V_BOOL(1)}, {NULL, KILN_V_NONE}};
    const kiln_kernels *k = NULL;
    kiln_test_clear_log(g_th);
    kiln_instance *acc = ready(prof, &k);
    if (!acc) return;
    int32_t tok[B * T] = {1, 2, 1, 6, 0, 3, 3, 3, 5, 1};
    float dout[B * T * C];
    for (unsigned i = 0; i < B * T * C; i++) dout[i] = val(i, 3);
    int32_t *dt = up(k, acc, tok, sizeof tok);
    float *dd = up(k, acc, dout, sizeof dout), *gte = up(k, acc, NULL, V * C * sizeof(float));
    float *logits = up(k, acc, NULL, B * T * V * sizeof(float));
    CU_ASSERT_FATAL(dt && dd && gte && logits);
    for (int i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(k->embedding_backward(acc, KILN_DTYPE_F32, gte, NULL, dd, dt, B, T, C, V), KILN_OK);
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 1, B * T, V, C, 1.0f, dd, C, gte, C, 0.0f, logits, V), KILN_OK);
    k->free(acc, logits);
    k->free(acc, dt);
    k->free(acc, dd);
    k->free(acc, gte);
    g_ops->base.destroy(acc);
    profile_calls("embedding_backward", 3);
    profile_calls("gemm", 1);
    /* the table's own copy and alloc calls: the 2 uploads of data and the
     * 4 buffers (up()), none from inside the entries */
    profile_calls("copy", 2);
    profile_calls("alloc", 4);
    NO_VIOLATIONS();
}

/* embedding_forward reads the tokens back once (its range check); the
 * backward over the same, unwritten tokens uses that copy without waiting,
 * and uploads its bucket index through the staging ring; a copy or zero
 * over the tokens makes the backward read them again. xent_fused waits
 * once per call; attention past its length limit is refused in one line. */
static void test_seq_tokens_memo(void) {
    enum { B = 2, T = 5, C = 8, V = 7 };
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    CU_ASSERT_TRUE_FATAL(k->struct_size >= KILN_KERNELS_SIZE_1_4 && k->embedding_forward && k->xent_fused);
    int32_t tok[B * T] = {1, 2, 1, 6, 0, 3, 3, 3, 5, 1}, tok2[B * T] = {0, 0, 0, 0, 0, 6, 6, 6, 6, 6};
    int32_t bad[B * T] = {1, 2, 1, 6, 0, 3, 7, 3, 5, 1};
    float wte[V * C], wpe[T * C], dout[B * T * C];
    for (unsigned i = 0; i < V * C; i++) wte[i] = val(i, 1);
    for (unsigned i = 0; i < T * C; i++) wpe[i] = val(i, 2);
    for (unsigned i = 0; i < B * T * C; i++) dout[i] = val(i, 3);
    int32_t *dt = up(k, acc, tok, sizeof tok);
    float *dwte = up(k, acc, wte, sizeof wte), *dwpe = up(k, acc, wpe, sizeof wpe), *dd = up(k, acc, dout, sizeof dout);
    float *dy = up(k, acc, NULL, sizeof dout), *gte = up(k, acc, NULL, sizeof wte), *gpe = up(k, acc, NULL, sizeof wpe);
    CU_ASSERT_FATAL(dt && dwte && dwpe && dd && dy && gte && gpe);
    fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->embedding_forward(acc, KILN_DTYPE_F32, dy, dt, dwte, dwpe, B, T, C, V), KILN_OK);
    fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.d2h_copies - s0.d2h_copies, 1);
    CU_ASSERT_EQUAL(s1.kernels - s0.kernels, 1);
    CU_ASSERT_EQUAL(k->embedding_backward(acc, KILN_DTYPE_F32, gte, gpe, dd, dt, B, T, C, V), KILN_OK);
    fake_cuda_stats s2 = stats();
    CU_ASSERT_EQUAL(s2.d2h_copies - s1.d2h_copies, 0);
    CU_ASSERT_EQUAL(s2.kernels - s1.kernels, 2); /* positions, then the token buckets */
    CU_ASSERT(s2.h2d_async_pinned > s1.h2d_async_pinned);
    /* the gradient of token 3 (positions 5, 6, 7) is their rows added in order */
    float g[V * C];
    CU_ASSERT_TRUE(down(k, acc, g, gte, sizeof g));
    CU_ASSERT_EQUAL(g[3 * C + 2], (dout[5 * C + 2] + dout[6 * C + 2]) + dout[7 * C + 2]);
    CU_ASSERT_EQUAL(g[4 * C + 2], 0.0f); /* token 4 does not occur */
    /* rewritten tokens: read again, and used */
    CU_ASSERT_EQUAL(k->copy(acc, dt, tok2, sizeof tok2, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->zero(acc, gte, sizeof wte), KILN_OK);
    s1 = stats();
    CU_ASSERT_EQUAL(k->embedding_backward(acc, KILN_DTYPE_F32, gte, NULL, dd, dt, B, T, C, V), KILN_OK);
    s2 = stats();
    CU_ASSERT_EQUAL(s2.d2h_copies - s1.d2h_copies, 1);
    CU_ASSERT_TRUE(down(k, acc, g, gte, sizeof g));
    CU_ASSERT_EQUAL(g[1 * C], 0.0f);
    CU_ASSERT_EQUAL(g[6 * C + 1], (((dout[5 * C + 1] + dout[6 * C + 1]) + dout[7 * C + 1]) + dout[8 * C + 1]) + dout[9 * C + 1]);
    /* zero() over the tokens forgets them too */
    CU_ASSERT_EQUAL(k->embedding_forward(acc, KILN_DTYPE_F32, dy, dt, dwte, NULL, B, T, C, V), KILN_OK);
    CU_ASSERT_EQUAL(k->zero(acc, dt, sizeof tok), KILN_OK);
    s1 = stats();
    CU_ASSERT_EQUAL(k->embedding_backward(acc, KILN_DTYPE_F32, gte, NULL, dd, dt, B, T, C, V), KILN_OK);
    CU_ASSERT_EQUAL(stats().d2h_copies - s1.d2h_copies, 1);
    /* a bad token: refused by the forward before anything runs, and by a backward after it */
    CU_ASSERT_EQUAL(k->copy(acc, dt, bad, sizeof bad, KILN_COPY_H2D), KILN_OK);
    s1 = stats();
    CU_ASSERT_EQUAL(k->embedding_forward(acc, KILN_DTYPE_F32, dy, dt, dwte, dwpe, B, T, C, V), KILN_E_DATA);
    HAS(kiln_test_error(g_th), "token 7 at index 6 (batch 1, position 1)");
    CU_ASSERT_EQUAL(stats().kernels - s1.kernels, 0);
    CU_ASSERT_EQUAL(k->embedding_backward(acc, KILN_DTYPE_F32, gte, gpe, dd, dt, B, T, C, V), KILN_E_DATA);
    /* xent_fused: one wait per call, the loss and the bad row in one read-back */
    float logits[4 * 9];
    for (unsigned i = 0; i < 4 * 9; i++) logits[i] = val(i, 4);
    int32_t targets[4] = {0, -1, 6, 2};
    float *dl = up(k, acc, logits, sizeof logits);
    int32_t *dtg = up(k, acc, targets, sizeof targets);
    CU_ASSERT_FATAL(dl && dtg);
    double loss = 0;
    s1 = stats();
    CU_ASSERT_EQUAL(k->xent_fused(acc, KILN_DTYPE_F32, dl, dtg, 4, 7, 9, 0.25, &loss), KILN_OK);
    s2 = stats();
    CU_ASSERT_EQUAL(s2.syncs - s1.syncs, 1);
    CU_ASSERT_EQUAL(s2.d2h_copies - s1.d2h_copies, 1);
    CU_ASSERT_TRUE(loss > 0);
    targets[3] = 7;
    CU_ASSERT_EQUAL(k->copy(acc, dtg, targets, sizeof targets, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->xent_fused(acc, KILN_DTYPE_F32, dl, dtg, 4, 7, 9, 0.25, &loss), KILN_E_DATA);
    HAS(kiln_test_error(g_th), "target 7 at row 3 is outside [-1, 7)");
    /* attention = "rowwise" and a T longer than its kernel holds: one line,
     * nothing launched (the gemm path has no such limit) */
    const kiln_kv rowwise[] = {{"attention", KILN_V_STR("rowwise")}, {NULL, KILN_V_NONE}};
    const kiln_kernels *k2 = NULL;
    kiln_instance *acc2 = ready(rowwise, &k2);
    if (acc2) {
        const int32_t Tbig = 1 << 20; /* far past the 48 KiB of shared memory per block */
        s1 = stats();
        CU_ASSERT_EQUAL(k2->attention_forward(acc2, KILN_DTYPE_F32, dy, dy, dd, 1, Tbig, 4, 1, KILN_DTYPE_F32),
                        KILN_E_UNSUPPORTED);
        HAS(kiln_test_error(g_th), "attention_forward: T=");
        CU_ASSERT_EQUAL(stats().kernels - s1.kernels, 0);
        g_ops->base.destroy(acc2);
    }
    /* a bad attention setting */
    const kiln_kv bad_attn[] = {{"attention", KILN_V_STR("fused")}, {NULL, KILN_V_NONE}};
    kiln_instance *acc3 = NULL;
    CU_ASSERT_EQUAL(make(bad_attn, &acc3), KILN_E_CONFIG);
    HAS(kiln_test_error(g_th), "attention must be \"gemm\", \"rowwise\" or \"flash\", got \"fused\"");
    k->free(acc, dt), k->free(acc, dwte), k->free(acc, dwpe), k->free(acc, dd), k->free(acc, dy);
    k->free(acc, gte), k->free(acc, gpe), k->free(acc, dl), k->free(acc, dtg);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* attention = "flash": a 16-bit mixed-precision call with a head size it
 * has runs the fused programs (one launch forward; delta and the programs
 * backward: two), no cuBLASLt product, no violation from the emulation;
 * a call it does not run (unrounded float32, float64, head size 24) takes
 * the gemm path, logged once. */
static void test_attention_flash_dispatch(void) {
    const kiln_kv flash[] = {{"attention", KILN_V_STR("flash")}, {NULL, KILN_V_NONE}};
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(flash, &k);
    if (!acc) return;
    const int32_t B = 1, T = 70, C = 128, NH = 2;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *h = calloc(nq, sizeof *h);
    CU_ASSERT_FATAL(h != NULL);
    for (size_t i = 0; i < nq; i++) h[i] = (float)((int)(i % 7) - 3) * 0.125f;
    void *qkv = up(k, acc, NULL, nq * 8), *out = up(k, acc, NULL, no * 8), *lse = up(k, acc, NULL, nl * 8);
    void *dout = up(k, acc, NULL, no * 8), *dqkv = up(k, acc, NULL, nq * 8);
    CU_ASSERT_EQUAL(k->copy(acc, qkv, h, nq * sizeof *h, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->copy(acc, dout, h, no * sizeof *h, KILN_COPY_H2D), KILN_OK);
    fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F32, out, lse, qkv, B, T, C, NH, KILN_DTYPE_BF16), KILN_OK);
    fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.kernels - s0.kernels, 1);
    CU_ASSERT_EQUAL(s1.matmuls - s0.matmuls, 0);
    CU_ASSERT_EQUAL(k->attention_backward(acc, KILN_DTYPE_F32, dqkv, dout, qkv, out, lse, B, T, C, NH,
                                          KILN_DTYPE_BF16),
                    KILN_OK);
    fake_cuda_stats s2 = stats();
    CU_ASSERT_EQUAL(s2.kernels - s1.kernels, 2);
    CU_ASSERT_EQUAL(s2.matmuls - s1.matmuls, 0);
    CU_ASSERT_PTR_NULL(kiln_test_log_find(g_th, KILN_LOG_INFO, "using the gemm path"));
    /* the outputs are finite: the emulation wrote every element */
    float *o = calloc(nq, sizeof *o);
    CU_ASSERT_FATAL(o != NULL);
    CU_ASSERT_EQUAL(k->copy(acc, o, dqkv, nq * sizeof *o, KILN_COPY_D2H), KILN_OK);
    size_t bad = 0;
    for (size_t i = 0; i < nq; i++) bad += !isfinite(o[i]);
    CU_ASSERT_EQUAL(bad, 0);
    /* calls the flash path does not run: the gemm path, logged once */
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F32, out, lse, qkv, B, T, C, NH, KILN_DTYPE_F32), KILN_OK);
    fake_cuda_stats s3 = stats();
    CU_ASSERT_TRUE(s3.matmuls - s2.matmuls >= 2);
    const char *line = kiln_test_log_find(g_th, KILN_LOG_INFO, "using the gemm path");
    CU_ASSERT_PTR_NOT_NULL(line);
    if (line) HAS(line, "this call is float32 with head size 64");
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F32, out, lse, qkv, B, T, 72, 3, KILN_DTYPE_BF16), KILN_OK);
    CU_ASSERT_TRUE(stats().matmuls - s3.matmuls >= 2);
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F64, out, lse, qkv, B, T, C, NH, KILN_DTYPE_F64), KILN_OK);
    free(h), free(o);
    k->free(acc, qkv), k->free(acc, out), k->free(acc, lse), k->free(acc, dout), k->free(acc, dqkv);
    g_ops->base.destroy(acc);
    /* a device that grants less shared memory than the programs need (32
     * KiB; the dK/dV program takes 36.5 at this head size of 64): the gemm
     * path, and the log names both sizes */
    setenv("KILN_FAKE_CUDA_SMEM_OPTIN", "32768", 1);
    kiln_test_clear_log(g_th);
    acc = ready(flash, &k);
    unsetenv("KILN_FAKE_CUDA_SMEM_OPTIN");
    if (!acc) return;
    qkv = up(k, acc, NULL, nq * 4), out = up(k, acc, NULL, no * 4), lse = up(k, acc, NULL, nl * 4);
    s0 = stats();
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F32, out, lse, qkv, B, T, C, NH, KILN_DTYPE_BF16), KILN_OK);
    CU_ASSERT_TRUE(stats().matmuls - s0.matmuls >= 2);
    line = kiln_test_log_find(g_th, KILN_LOG_INFO, "using the gemm path");
    CU_ASSERT_PTR_NOT_NULL(line);
    if (line) HAS(line, "device allows 32768");
    k->free(acc, qkv), k->free(acc, out), k->free(acc, lse);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* ==================== 1.7: 16-bit activation storage (ACT_16BIT) */

/* x rounded to dt's 16 bits (nearest even) and its value. */
static uint16_t fk16_bits(uint32_t dt, float x) { return hb_round16(dt == KILN_DTYPE_BF16, x); }
static float fk16_value(uint32_t dt, uint16_t b) {
    return dt == KILN_DTYPE_BF16 ? hb_bf16_value(b) : (float)hb_f16_value(b);
}

/* n values of dt in [-scale, scale): the widened floats in f, the bits in h. */
static void fk16_fill(uint32_t dt, float *f, uint16_t *h, size_t n, unsigned salt, float scale) {
    for (size_t i = 0; i < n; i++) {
        h[i] = fk16_bits(dt, scale * val((unsigned)i, salt));
        f[i] = fk16_value(dt, h[i]);
    }
}

/* Device 16-bit got(n) against want(n) float32 rounded to dt, bit for bit. */
static size_t fk16_diff16(const kiln_kernels *k, kiln_instance *acc, uint32_t dt, const void *got, const float *want,
                         size_t n) {
    uint16_t *h = malloc(n * sizeof *h);
    size_t bad = n;
    if (h && down(k, acc, h, got, n * sizeof *h)) {
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += h[i] != fk16_bits(dt, want[i]);
    }
    free(h);
    return bad;
}

/* Device float32 got(n) against want(n), bit for bit. */
static size_t fk16_diff32(const kiln_kernels *k, kiln_instance *acc, const void *got, const float *want, size_t n) {
    float *h = malloc(n * sizeof *h);
    size_t bad = n;
    if (h && down(k, acc, h, got, n * sizeof *h)) {
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += memcmp(&h[i], &want[i], sizeof *h) != 0;
    }
    free(h);
    return bad;
}

#define A16_SAME(what, nbad)                                                                              \
    do {                                                                                                  \
        const size_t nbad_ = (nbad);                                                                      \
        if (nbad_) fprintf(stderr, "  %s %s: %zu elements differ\n", kiln_dtype_name(dt), (what), nbad_); \
        CU_ASSERT_EQUAL(nbad_, 0);                                                                        \
    } while (0)

/* The float32 reference of a call: device float32 buffers from host
 * arrays, the call, the result read back into host arrays. */
static float *fk16_up32(const kiln_kernels *k, kiln_instance *acc, const float *h, size_t n) {
    return up(k, acc, h, n * sizeof(float));
}
static void *fk16_up16(const kiln_kernels *k, kiln_instance *acc, const uint16_t *h, size_t n) {
    return up(k, acc, h, n * sizeof(uint16_t));
}

/* layernorm_forward/backward, linear_forward(_layout), act_backward,
 * bias_grad_ex and add: the 16-bit call equals the float32 call on the
 * widened inputs, its 16-bit outputs rounded (round_dtype dt in the
 * float32 call where the entry has one: its only rounding is the store). */
static void fk16_dense(const kiln_kernels *k, kiln_instance *acc, uint32_t dt) {
    enum { N = 6, C = 40, I = 24 };
    float x[N * C], w[C], b[C], y[N * C], mean[N], rstd[N], dyf[N * C], dx[N * C], dw[C], db[C];
    uint16_t dyh[N * C];
    for (int i = 0; i < N * C; i++) x[i] = 2.0f * val((unsigned)i, 71) + 0.25f;
    for (int i = 0; i < C; i++) w[i] = 1.0f + 0.5f * val((unsigned)i, 72), b[i] = 0.1f * val((unsigned)i, 73);
    fk16_fill(dt, dyf, dyh, N * C, 74, 1.0f);
    float *dx_ = fk16_up32(k, acc, x, N * C), *dw_ = fk16_up32(k, acc, w, C), *db_ = fk16_up32(k, acc, b, C);
    float *dm = fk16_up32(k, acc, NULL, N), *dr = fk16_up32(k, acc, NULL, N), *dy32 = fk16_up32(k, acc, NULL, N * C);
    void *dy16 = fk16_up16(k, acc, NULL, N * C), *dyg16 = fk16_up16(k, acc, dyh, N * C);
    float *dyg32 = fk16_up32(k, acc, dyf, N * C), *gx = fk16_up32(k, acc, NULL, N * C);
    float *gw = fk16_up32(k, acc, NULL, C), *gb = fk16_up32(k, acc, NULL, C);
    CU_ASSERT_FATAL(dx_ && dw_ && db_ && dm && dr && dy32 && dy16 && dyg16 && dyg32 && gx && gw && gb);

    /* layernorm_forward: y 16-bit */
    CU_ASSERT_EQUAL(k->layernorm_forward(acc, KILN_DTYPE_F32, dy32, dm, dr, dx_, dw_, db_, N, C, 1e-5, dt), KILN_OK);
    CU_ASSERT_FATAL(down(k, acc, y, dy32, sizeof y) && down(k, acc, mean, dm, sizeof mean) &&
                    down(k, acc, rstd, dr, sizeof rstd));
    CU_ASSERT_EQUAL(k->zero(acc, dm, sizeof mean), KILN_OK);
    CU_ASSERT_EQUAL(k->layernorm_forward(acc, dt, dy16, dm, dr, dx_, dw_, db_, N, C, 1e-5, dt), KILN_OK);
    A16_SAME("layernorm_forward y", fk16_diff16(k, acc, dt, dy16, y, N * C));
    A16_SAME("layernorm_forward mean", fk16_diff32(k, acc, dm, mean, N));
    A16_SAME("layernorm_forward rstd", fk16_diff32(k, acc, dr, rstd, N));
    CU_ASSERT_EQUAL(k->layernorm_forward(acc, dt, dy16, dm, dr, dx_, dw_, db_, N, C, 1e-5, KILN_DTYPE_F32),
                    KILN_E_INVALID_ARG);

    /* layernorm_backward: dy 16-bit; dx overwritten or accumulated onto x's
     * values, dw and db added to b's */
    for (int accu = 0; accu < 2; accu++) {
        for (int pass = 0; pass < 2; pass++) {
            CU_ASSERT_EQUAL(k->copy(acc, gx, x, sizeof dx, KILN_COPY_H2D), KILN_OK);
            CU_ASSERT_EQUAL(k->copy(acc, gw, b, sizeof dw, KILN_COPY_H2D), KILN_OK);
            CU_ASSERT_EQUAL(k->copy(acc, gb, b, sizeof db, KILN_COPY_H2D), KILN_OK);
            CU_ASSERT_EQUAL(k->layernorm_backward(acc, pass ? dt : KILN_DTYPE_F32, gx, gw, gb,
                                                  pass ? dyg16 : (void *)dyg32, dx_, dw_, dm, dr, N, C, accu),
                            KILN_OK);
            if (pass) break;
            CU_ASSERT_FATAL(down(k, acc, dx, gx, sizeof dx) && down(k, acc, dw, gw, sizeof dw) &&
                            down(k, acc, db, gb, sizeof db));
        }
        A16_SAME("layernorm_backward dx", fk16_diff32(k, acc, gx, dx, N * C));
        A16_SAME("layernorm_backward dw", fk16_diff32(k, acc, gw, dw, C));
        A16_SAME("layernorm_backward db", fk16_diff32(k, acc, gb, db, C));
    }

    /* act_backward: dx, dy, x 16-bit, every activation; dx over dy in place */
    float xa[N * C], ga[N * C];
    uint16_t xah[N * C];
    fk16_fill(dt, xa, xah, N * C, 75, 3.0f);
    void *xa16 = fk16_up16(k, acc, xah, N * C), *gx16 = fk16_up16(k, acc, NULL, N * C);
    float *xa32 = fk16_up32(k, acc, xa, N * C);
    CU_ASSERT_FATAL(xa16 && gx16 && xa32);
    for (int act = KILN_ACT_RELU; act <= KILN_ACT_LEAKY_RELU; act++) {
        CU_ASSERT_EQUAL(k->act_backward(acc, KILN_DTYPE_F32, act, gx, dyg32, xa32, N * C), KILN_OK);
        CU_ASSERT_FATAL(down(k, acc, ga, gx, sizeof ga));
        CU_ASSERT_EQUAL(k->act_backward(acc, dt, act, gx16, dyg16, xa16, N * C), KILN_OK);
        A16_SAME("act_backward dx", fk16_diff16(k, acc, dt, gx16, ga, N * C));
        CU_ASSERT_EQUAL(k->copy(acc, gx16, dyh, sizeof dyh, KILN_COPY_H2D), KILN_OK);
        CU_ASSERT_EQUAL(k->act_backward(acc, dt, act, gx16, gx16, xa16, N * C), KILN_OK);
        A16_SAME("act_backward dx in place", fk16_diff16(k, acc, dt, gx16, ga, N * C));
    }

    /* bias_grad_ex: dy 16-bit (one part and several), db float32 */
    {
        enum { R = 600, BC = 24 };
        float *gf = malloc(R * BC * sizeof *gf), dbw[BC];
        uint16_t *gh = malloc(R * BC * sizeof *gh);
        CU_ASSERT_FATAL(gf && gh);
        fk16_fill(dt, gf, gh, R * BC, 76, 1.0f);
        float *g32 = fk16_up32(k, acc, gf, R * BC), *dbd = fk16_up32(k, acc, NULL, BC);
        void *g16 = fk16_up16(k, acc, gh, R * BC);
        CU_ASSERT_FATAL(g32 && g16 && dbd);
        for (int rows = 7; rows <= R; rows += R - 7)
            for (int accu = 0; accu < 2; accu++) {
                CU_ASSERT_EQUAL(k->copy(acc, dbd, b, BC * sizeof(float), KILN_COPY_H2D), KILN_OK);
                CU_ASSERT_EQUAL(k->bias_grad_ex(acc, KILN_DTYPE_F32, dbd, g32, rows, BC, accu), KILN_OK);
                CU_ASSERT_FATAL(down(k, acc, dbw, dbd, sizeof dbw));
                CU_ASSERT_EQUAL(k->copy(acc, dbd, b, BC * sizeof(float), KILN_COPY_H2D), KILN_OK);
                CU_ASSERT_EQUAL(k->bias_grad_ex(acc, dt, dbd, g16, rows, BC, accu), KILN_OK);
                A16_SAME("bias_grad_ex db", fk16_diff32(k, acc, dbd, dbw, BC));
            }
        k->free(acc, g32), k->free(acc, dbd), k->free(acc, g16);
        free(gf), free(gh);
    }

    /* add: b 16-bit, y and a float32; y == a in place; y over b refused */
    {
        float sum[N * C];
        CU_ASSERT_EQUAL(k->add(acc, KILN_DTYPE_F32, gx, dx_, dyg32, N * C), KILN_OK);
        CU_ASSERT_FATAL(down(k, acc, sum, gx, sizeof sum));
        CU_ASSERT_EQUAL(k->add(acc, dt, gx, dx_, dyg16, N * C), KILN_OK);
        A16_SAME("add y", fk16_diff32(k, acc, gx, sum, N * C));
        CU_ASSERT_EQUAL(k->copy(acc, gx, x, sizeof x, KILN_COPY_H2D), KILN_OK);
        CU_ASSERT_EQUAL(k->add(acc, dt, gx, gx, dyg16, N * C), KILN_OK);
        A16_SAME("add y = a in place", fk16_diff32(k, acc, gx, sum, N * C));
        CU_ASSERT_EQUAL(k->add(acc, dt, dyg16, dyg16, dyg16, N * C / 2), KILN_E_INVALID_ARG);
    }

    /* linear_forward and _layout: x, y, post 16-bit; w float32 or dt; b
     * float32 or none; every activation and none; in = 0 */
    {
        enum { R = 6, O = 40 };
        float xl[R * I], wl[O * I], yw[R * O], pw[R * O];
        uint16_t xlh[R * I], wlh[O * I];
        fk16_fill(dt, xl, xlh, R * I, 77, 1.0f);
        for (int i = 0; i < O * I; i++) wl[i] = 0.3f * val((unsigned)i, 78); /* not 16-bit values */
        for (int i = 0; i < O * I; i++) wlh[i] = fk16_bits(dt, wl[i]);
        float *x32 = fk16_up32(k, acc, xl, R * I), *w32 = fk16_up32(k, acc, wl, O * I);
        void *x16 = fk16_up16(k, acc, xlh, R * I), *w16 = fk16_up16(k, acc, wlh, O * I);
        float *y32 = fk16_up32(k, acc, NULL, R * O), *p32 = fk16_up32(k, acc, NULL, R * O);
        void *y16 = fk16_up16(k, acc, NULL, R * O), *p16 = fk16_up16(k, acc, NULL, R * O);
        CU_ASSERT_FATAL(x32 && w32 && x16 && w16 && y32 && p32 && y16 && p16);
        for (int layout = 0; layout < 2; layout++)
            for (int wdt = 0; wdt < 2; wdt++)
                for (int hasb = 0; hasb < 2; hasb++)
                    for (int act = -1; act <= KILN_ACT_LEAKY_RELU; act++)
                        for (int in = 0; in <= I; in += I) {
                            const void *wv = wdt ? w16 : (const void *)w32;
                            const uint32_t wt = wdt ? dt : KILN_DTYPE_F32;
                            const float *bv = hasb ? db_ : NULL;
                            /* in = 0 reads no x or w: the layouts agree */
                            CU_ASSERT_EQUAL(k->linear_forward_layout(acc, KILN_DTYPE_F32, x32, wv, wt, layout, bv, R,
                                                                     in, O, act, y32, p32, dt),
                                            KILN_OK);
                            CU_ASSERT_FATAL(down(k, acc, yw, y32, sizeof yw));
                            if (act >= 0) CU_ASSERT_FATAL(down(k, acc, pw, p32, sizeof pw));
                            const int32_t rc = layout ? k->linear_forward_layout(acc, dt, x16, wv, wt, layout, bv, R,
                                                                                 in, O, act, y16, p16, dt)
                                                      : k->linear_forward(acc, dt, x16, wv, wt, bv, R, in, O, act,
                                                                          y16, p16, dt);
                            CU_ASSERT_EQUAL(rc, KILN_OK);
                            if (rc != KILN_OK) fprintf(stderr, "  linear_forward: %s\n", kiln_test_error(g_th));
                            A16_SAME("linear_forward y", fk16_diff16(k, acc, dt, y16, yw, R * O));
                            if (act >= 0) A16_SAME("linear_forward post", fk16_diff16(k, acc, dt, p16, pw, R * O));
                        }
        /* round_dtype other than dt, a w of the other 16-bit format */
        const uint32_t other = dt == KILN_DTYPE_BF16 ? KILN_DTYPE_F16 : KILN_DTYPE_BF16;
        CU_ASSERT_EQUAL(k->linear_forward(acc, dt, x16, w32, KILN_DTYPE_F32, NULL, R, I, O, -1, y16, NULL,
                                          KILN_DTYPE_F32),
                        KILN_E_INVALID_ARG);
        CU_ASSERT_EQUAL(k->linear_forward(acc, dt, x16, w16, other, NULL, R, I, O, -1, y16, NULL, dt),
                        KILN_E_INVALID_ARG);
        k->free(acc, x32), k->free(acc, w32), k->free(acc, x16), k->free(acc, w16);
        k->free(acc, y32), k->free(acc, p32), k->free(acc, y16), k->free(acc, p16);
    }
    k->free(acc, xa16), k->free(acc, gx16), k->free(acc, xa32);
    k->free(acc, dx_), k->free(acc, dw_), k->free(acc, db_), k->free(acc, dm), k->free(acc, dr);
    k->free(acc, dy32), k->free(acc, dy16), k->free(acc, dyg16), k->free(acc, dyg32);
    k->free(acc, gx), k->free(acc, gw), k->free(acc, gb);
}

/* attention_forward/backward: qkv, out, dout, dqkv 16-bit, lse float32;
 * on the instance's path (gemm, flash) the 16-bit call equals the float32
 * call with round_dtype dt on the widened inputs. */
static void fk16_attention(const kiln_kernels *k, kiln_instance *acc, uint32_t dt, int32_t B, int32_t T, int32_t C,
                          int32_t NH) {
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qf = malloc(nq * 4), *gf = malloc(no * 4), *out = malloc(no * 4), *lse = malloc(nl * 4);
    float *dq = malloc(nq * 4);
    uint16_t *qh = malloc(nq * 2), *gh = malloc(no * 2), *oh = malloc(no * 2);
    CU_ASSERT_FATAL(qf && gf && out && lse && dq && qh && gh && oh);
    fk16_fill(dt, qf, qh, nq, 81, 1.0f);
    fk16_fill(dt, gf, gh, no, 82, 1.0f);
    float *q32 = fk16_up32(k, acc, qf, nq), *g32 = fk16_up32(k, acc, gf, no), *o32 = fk16_up32(k, acc, NULL, no);
    float *l32 = fk16_up32(k, acc, NULL, nl), *d32 = fk16_up32(k, acc, NULL, nq), *l16 = fk16_up32(k, acc, NULL, nl);
    void *q16 = fk16_up16(k, acc, qh, nq), *g16 = fk16_up16(k, acc, gh, no), *o16 = fk16_up16(k, acc, NULL, no);
    void *d16 = fk16_up16(k, acc, NULL, nq);
    CU_ASSERT_FATAL(q32 && g32 && o32 && l32 && d32 && l16 && q16 && g16 && o16 && d16);
    CU_ASSERT_EQUAL(k->attention_forward(acc, KILN_DTYPE_F32, o32, l32, q32, B, T, C, NH, dt), KILN_OK);
    CU_ASSERT_FATAL(down(k, acc, out, o32, no * 4) && down(k, acc, lse, l32, nl * 4));
    CU_ASSERT_EQUAL(k->attention_forward(acc, dt, o16, l16, q16, B, T, C, NH, dt), KILN_OK);
    A16_SAME("attention_forward out", fk16_diff16(k, acc, dt, o16, out, no));
    A16_SAME("attention_forward lse", fk16_diff32(k, acc, l16, lse, nl));
    /* the backward from the forward's out (16-bit values in both) and lse */
    CU_ASSERT_EQUAL(k->attention_backward(acc, KILN_DTYPE_F32, d32, g32, q32, o32, l32, B, T, C, NH, dt), KILN_OK);
    CU_ASSERT_FATAL(down(k, acc, dq, d32, nq * 4));
    CU_ASSERT_EQUAL(k->attention_backward(acc, dt, d16, g16, q16, o16, l16, B, T, C, NH, dt), KILN_OK);
    A16_SAME("attention_backward dqkv", fk16_diff16(k, acc, dt, d16, dq, nq));
    /* refusals: round_dtype other than dt; lse (float32, twice a 16-bit
     * element) overlapping out where 16-bit bytes would not */
    CU_ASSERT_EQUAL(k->attention_forward(acc, dt, o16, l16, q16, B, T, C, NH, KILN_DTYPE_F32), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->attention_backward(acc, dt, d16, g16, q16, o16, l16, B, T, C, NH, KILN_DTYPE_F32),
                    KILN_E_INVALID_ARG);
    void *big = up(k, acc, NULL, no * 2 + nl * 4);
    CU_ASSERT_FATAL(big != NULL);
    /* lse at the start, out 2 * nl bytes on: apart if lse were 16-bit */
    CU_ASSERT_EQUAL(k->attention_forward(acc, dt, (char *)big + nl * 2, big, q16, B, T, C, NH, dt),
                    KILN_E_INVALID_ARG);
    k->free(acc, big);
    k->free(acc, q32), k->free(acc, g32), k->free(acc, o32), k->free(acc, l32), k->free(acc, d32);
    k->free(acc, l16), k->free(acc, q16), k->free(acc, g16), k->free(acc, o16), k->free(acc, d16);
    free(qf), free(gf), free(out), free(lse), free(dq), free(qh), free(gh), free(oh);
}

static void test_act16_entries(void) {
    static const uint32_t dts[2] = {KILN_DTYPE_BF16, KILN_DTYPE_F16};
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    CU_ASSERT_TRUE((k->flags & KILN_KERNELS_ACT_16BIT) != 0);
    for (int i = 0; i < 2; i++) {
        fk16_dense(k, acc, dts[i]);
        fk16_attention(k, acc, dts[i], 2, 9, 32, 2); /* the gemm path */
    }
    g_ops->base.destroy(acc);
    /* the flash path (its programs emulated), and rowwise, which takes the
     * gemm path for 16-bit storage */
    static const char *const paths[2] = {"flash", "rowwise"};
    for (int p = 0; p < 2; p++) {
        const kiln_kv cfg[] = {{"attention", KILN_V_STR(paths[p])}, {NULL, KILN_V_NONE}};
        kiln_test_clear_log(g_th);
        acc = ready(cfg, &k);
        if (!acc) return;
        for (int i = 0; i < 2; i++) {
            const fake_cuda_stats s0 = stats();
            fk16_attention(k, acc, dts[i], 2, 70, 64, 2);
            if (p == 0) CU_ASSERT_EQUAL(stats().matmuls, s0.matmuls); /* flash: no cuBLASLt product */
        }
        if (p == 0) CU_ASSERT_PTR_NULL(kiln_test_log_find(g_th, KILN_LOG_INFO, "using the gemm path"));
        g_ops->base.destroy(acc);
    }
    NO_VIOLATIONS();
}

/* The shared cases of tests/support/act16_cases.h, which the cpu
 * accelerator passes too: 1.7's eight entries and 1.8's rounded bias (on
 * 16-bit storage cuBLASLt's bias epilogue writes the 16-bit y itself). */
static void test_act16_shared(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    act16_run_all(k, acc);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

static void test_bias_round(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const fake_cuda_stats s0 = stats();
    bias_round_run_all(k, acc);
    /* the flagged calls on 16-bit storage with K > 0 (2 dtypes x 2 layouts
     * x with and without GELU) ran cuBLASLt's bias epilogue on the 16-bit
     * output, with no float32 scratch; nothing else did */
    CU_ASSERT_EQUAL(stats().matmuls_bias16 - s0.matmuls_bias16, 8u);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* A device or cuBLASLt without an algorithm for the bias epilogue on a
 * 16-bit output: the rounded-bias call falls back to float32 scratch, with
 * the same bits, says so once, and does not ask the heuristic again. */
static void test_bias_round_fallback(void) {
    const kiln_kernels *k = NULL;
    kiln_test_clear_log(g_th);
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    enum { R = 5, I = 16, O = 24 };
    float bf[O], bq[O];
    uint16_t xh[R * I], wh[I * O], y[2][R * O];
    for (int i = 0; i < R * I; i++) xh[i] = fk16_bits(KILN_DTYPE_BF16, val((unsigned)i, 11u));
    for (int i = 0; i < I * O; i++) wh[i] = fk16_bits(KILN_DTYPE_BF16, 0.3f * val((unsigned)i, 12u));
    for (int i = 0; i < O; i++) {
        bf[i] = 0.5f * val((unsigned)i, 13u);
        bq[i] = fk16_value(KILN_DTYPE_BF16, fk16_bits(KILN_DTYPE_BF16, bf[i]));
    }
    void *dx = up(k, acc, xh, sizeof xh), *dw = up(k, acc, wh, sizeof wh), *db = up(k, acc, bf, sizeof bf);
    void *dq = up(k, acc, bq, sizeof bq), *dy = up(k, acc, y[0], sizeof y[0]), *dy2 = up(k, acc, y[1], sizeof y[1]);
    CU_ASSERT_FATAL(dx && dw && db && dq && dy && dy2);
    /* the first heuristic call (the 16-bit bias epilogue's plan) finds nothing */
    env_set("KILN_FAKE_CUDA_FAIL", "cublasLtMatmulAlgoGetHeuristic@1");
    const fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->linear_forward_layout(acc, KILN_DTYPE_BF16, dx, dw, KILN_DTYPE_BF16,
                                             KILN_LAYOUT_IN_OUT | KILN_LAYOUT_ROUND_BIAS, db, R, I, O, -1, dy, NULL,
                                             KILN_DTYPE_BF16), KILN_OK);
    CU_ASSERT_EQUAL(stats().injected - s0.injected, 1u);
    CU_ASSERT_PTR_NOT_NULL(kiln_test_log_find(g_th, KILN_LOG_INFO, "no bias epilogue for a bfloat16 output"));
    env_clear();
    const fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(k->linear_forward_layout(acc, KILN_DTYPE_BF16, dx, dw, KILN_DTYPE_BF16,
                                             KILN_LAYOUT_IN_OUT | KILN_LAYOUT_ROUND_BIAS, db, R, I, O, -1, dy, NULL,
                                             KILN_DTYPE_BF16), KILN_OK);
    CU_ASSERT_EQUAL(stats().matmuls_bias16 - s0.matmuls_bias16, 0u); /* scratch both times, */
    CU_ASSERT_EQUAL(stats().heuristics - s1.heuristics, 0u);         /* its plan cached      */
    CU_ASSERT_EQUAL(k->linear_forward_layout(acc, KILN_DTYPE_BF16, dx, dw, KILN_DTYPE_BF16, KILN_LAYOUT_IN_OUT, dq, R,
                                             I, O, -1, dy2, NULL, KILN_DTYPE_BF16), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, y[0], dy, sizeof y[0]) && down(k, acc, y[1], dy2, sizeof y[1]));
    CU_ASSERT_EQUAL(memcmp(y[0], y[1], sizeof y[0]), 0);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

void cuda_fake_seq_tests(CU_pSuite s) {
    CU_add_test(s, "profile: an entry's own uploads and scratch are booked to it", test_profile_attribution);
    CU_add_test(s, "1.4: tokens read back once, buckets uploaded, xent_fused waits once", test_seq_tokens_memo);
    CU_add_test(s, "attention = flash: fused programs, or the gemm path when it cannot", test_attention_flash_dispatch);
    CU_add_test(s, "1.7: 16-bit activation storage equals the float32 call rounded", test_act16_entries);
    CU_add_test(s, "1.7: the shared 16-bit storage cases (act16_cases.h)", test_act16_shared);
    CU_add_test(s, "1.8: KILN_LAYOUT_ROUND_BIAS = the call with the bias rounded first", test_bias_round);
    CU_add_test(s, "1.8: no 16-bit bias epilogue on the device: float32 scratch, same bits", test_bias_round_fallback);
}
