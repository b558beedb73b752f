/*
 * test_cuda_flash.cu: the fused ("flash") attention of kernels/cuda
 * (kg_flash.cuh's block programs) run through kg_flash_host.cuh's host
 * policy, against the cpu accelerator's attention kernels (kc_attn_forward
 * and kc_attn_backward, fp32 with the output rounded once) on random
 * inputs, with no GPU: compiled by nvcc as host code, like test_cuda_math.
 * What runs here is the same template code the GPU runs, block by block,
 * thread by thread; the emulation also checks ldmatrix's alignment rule,
 * reads of unwritten shared memory (NaN-filled) and races between phases.
 * The emulation's ldmatrix and mma.sync m16n8k16 are checked against the
 * PTX ISA's layouts, written out element by element.
 *
 * Shapes: every supported head size (16, 32, 64, 128), T below, at and
 * above a tile, T = 1, several heads and batch elements; bf16 and f16
 * outputs. Tolerance: the gemm path's (tests/gpu/cuda_seq_cases.inc), since
 * the flash path rounds the same operands (q, k, v, P, dO, dS) to 16 bits:
 * 3e-2 relative to |value| + the result's rms, plus one 16-bit ulp; lse
 * 4e-3 relative to |lse| + 1. A last case proves the race check can fail:
 * a program that skips its barrier is caught.
 *
 * 16-bit storage (ABI 1.7, kg_flash_args.s16): the same programs reading
 * qkv, dout and out as 16-bit bits and writing 16-bit out and dqkv must
 * give the float32-storage run's values bit for bit (those are rounded to
 * the format already), and the same lse. Inputs one element off a 16-byte
 * boundary take the tile loads' element-wise path: the same bits again.
 *
 * Shared-memory banks: the emulation's bank model is checked against
 * strided accesses whose cost is known, then the programs' accesses
 * (ldmatrix's included) must take no more wavefronts than conflict-free
 * ones would, at every head size.
 */
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cpu_attn.h"
#include "cpu_kernels.h"
#include "kg_flash_host.cuh"
#include "test_rng.h"

static test_rng tf_rng = {0x2545F4914F6CDD1Dull};
static float tf_uniform(float lo, float hi) { return lo + (hi - lo) * (float)test_rng_unit(&tf_rng); }

/* Values a mixed-precision step would hold: 16-bit values in fp32. */
static std::vector<float> tf_rand16(size_t n, int op) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = kg_round_to_dtype(tf_uniform(-1.0f, 1.0f), op);
    return v;
}

/* delta(B, NH, T) = sum over a head's features of dout * out, as
 * kg_attn_delta computes it for the flash backward. */
static std::vector<double> tf_delta(const std::vector<float> &dout, const std::vector<float> &out, int B, int T, int C,
                                    int NH) {
    const int D = C / NH;
    std::vector<double> delta((size_t)B * NH * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double s = 0.0;
                for (int d = 0; d < D; d++) {
                    const size_t i = ((size_t)b * T + t) * C + (size_t)h * D + d;
                    s += (double)dout[i] * (double)out[i];
                }
                delta[((size_t)b * NH + h) * T + t] = s;
            }
    return delta;
}

static double tf_rms(const std::vector<float> &v) {
    double s = 0.0;
    for (float x : v) s += (double)x * x;
    return v.empty() ? 0.0 : sqrt(s / (double)v.size());
}

/* One ulp of the 16-bit format at |w| (bf16: 8 significant bits, f16: 11). */
static double tf_ulp16(double w, int op) {
    const int bits = op == KG_BF16 ? 8 : 11;
    const double a = fabs(w) > 6.1e-5 ? fabs(w) : 6.1e-5;
    return ldexp(1.0, (int)floor(log2(a)) - (bits - 1));
}

/* All of got within rtol * (|want| + floor) + ulp16(want) (op 0: no ulp);
 * prints the worst one on failure. */
static int tf_close(const char *what, const std::vector<float> &want, const std::vector<float> &got, double rtol,
                    double floor, int op) {
    size_t worst = 0;
    double wr = 0.0;
    int ok = 1;
    for (size_t i = 0; i < want.size(); i++) {
        const double tol = rtol * (fabs((double)want[i]) + floor) + (op ? tf_ulp16(want[i], op) : 0.0);
        const double err = fabs((double)got[i] - (double)want[i]);
        if (!(err <= tol)) ok = 0;
        const double r = err / tol;
        if (!(r <= wr)) wr = r, worst = i;
    }
    if (!ok || getenv("KILN_FLASH_TEST_VERBOSE"))
        fprintf(stderr, "  %s: worst element %zu: want %.9g got %.9g (%.3g x the tolerance)\n", what, worst,
                (double)want[worst], (double)got[worst], wr);
    return ok;
}

static void tf_no_failures(const char *what) {
    const char *first = NULL;
    const long n = kg_fl_host_failures(&first);
    if (n) fprintf(stderr, "  %s: %ld emulation failures, the first: %s\n", what, n, first);
    CU_ASSERT_EQUAL(n, 0);
    kg_fl_host_reset();
}

/* One case: forward and backward on both sides, compared. */
static void tf_case(int B, int T, int C, int NH, int op) {
    const int D = C / NH;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    char what[128];
    snprintf(what, sizeof what, "B=%d T=%d C=%d NH=%d %s", B, T, C, NH, op == KG_BF16 ? "bf16" : "f16");
    const std::vector<float> qkv = tf_rand16(nq, op), dout = tf_rand16(no, op);
    const int kc_rd = op == KG_BF16 ? KC_BF16 : KC_F16;

    /* the cpu's forward and backward (the backward from its own forward) */
    std::vector<float> out_ref(no), lse_ref(nl), dqkv_ref(nq);
    const size_t wsb = kc_attn_workspace_bytes_for(1, sizeof(float), B, T, NH);
    void *ws = aligned_alloc(64, (wsb + 63) & ~(size_t)63);
    CU_ASSERT_FATAL(ws != NULL);
    CU_ASSERT_EQUAL(kc_attn_forward(out_ref.data(), lse_ref.data(), qkv.data(), B, T, C, NH, kc_rd, ws, wsb), 0);
    CU_ASSERT_EQUAL(kc_attn_backward(dqkv_ref.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(), B, T,
                                     C, NH, kc_rd, ws, wsb),
                    0);
    free(ws);

    /* the flash programs on the host: the forward, then the backward from
     * the cpu's out and lse (as tests/gpu does), delta as kg_attn_delta */
    std::vector<float> out(no, NAN), lse(nl, NAN), dqkv(nq, NAN);
    const std::vector<double> delta = tf_delta(dout, out_ref, B, T, C, NH);
    kg_flash_args a = {qkv.data(), dout.data(), out_ref.data(), lse_ref.data(), delta.data(), out.data(), lse.data(),
                       dqkv.data(), B, T, C, NH, op, (float)(1.0 / sqrt((double)D)), 0};
    kg_fl_host_reset();
    CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_FWD, op, D, a), 0);
    tf_no_failures(what);
    CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_DKDV, op, D, a), 0);
    tf_no_failures(what);
    CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_DQ, op, D, a), 0);
    tf_no_failures(what);

    char w2[200];
    snprintf(w2, sizeof w2, "out %s", what);
    CU_ASSERT_TRUE(tf_close(w2, out_ref, out, 3e-2, tf_rms(out_ref), op));
    snprintf(w2, sizeof w2, "lse %s", what);
    CU_ASSERT_TRUE(tf_close(w2, lse_ref, lse, 4e-3, 1.0, 0));
    snprintf(w2, sizeof w2, "dqkv %s", what);
    CU_ASSERT_TRUE(tf_close(w2, dqkv_ref, dqkv, 3e-2, tf_rms(dqkv_ref), op));
    /* every output written: the NaN fill is gone */
    size_t nan = 0;
    for (float x : out) nan += isnan(x);
    for (float x : lse) nan += isnan(x);
    for (float x : dqkv) nan += isnan(x);
    CU_ASSERT_EQUAL(nan, 0);
}

static void test_flash_head_sizes(void) {
    tf_case(2, 67, 128, 2, KG_BF16);  /* D 64, T past one tile   */
    tf_case(1, 130, 256, 2, KG_BF16); /* D 128, three tiles       */
    tf_case(2, 33, 64, 4, KG_BF16);   /* D 16, below one tile     */
    tf_case(1, 64, 64, 2, KG_BF16);   /* D 32, exactly one tile   */
}

static void test_flash_edges(void) {
    tf_case(1, 1, 64, 1, KG_BF16);    /* T = 1                    */
    tf_case(3, 129, 64, 1, KG_BF16);  /* one row past two tiles   */
    tf_case(1, 128, 192, 3, KG_BF16); /* exactly two tiles, 3 heads */
}

static void test_flash_f16(void) {
    tf_case(2, 67, 128, 2, KG_F16);
    tf_case(1, 100, 128, 1, KG_F16);
}

/* The 16-bit bits of float values that hold 16-bit values (exact). */
static std::vector<uint16_t> tf_bits16(const std::vector<float> &v, int op) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); i++) b[i] = op == KG_BF16 ? kg_bf16_bits(v[i]) : kg_f16_bits(v[i]);
    return b;
}

/* Forward and backward with float32 storage and with 16-bit storage on the
 * same values: the 16-bit outputs are the float32 ones' bits, lse equal. */
static void tf_case16(int B, int T, int C, int NH, int op) {
    const int D = C / NH;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    char what[128];
    snprintf(what, sizeof what, "16-bit storage B=%d T=%d C=%d NH=%d %s", B, T, C, NH, op == KG_BF16 ? "bf16" : "f16");
    const std::vector<float> qkv = tf_rand16(nq, op), dout = tf_rand16(no, op);
    const float scale = (float)(1.0 / sqrt((double)D));
    /* float32 storage: the forward, then the backward from its own out and lse */
    std::vector<float> out(no, NAN), lse(nl, NAN), dqkv(nq, NAN);
    kg_flash_args f = {qkv.data(), NULL, NULL, NULL, NULL, out.data(), lse.data(), NULL, B, T, C, NH, op, scale, 0};
    kg_fl_host_reset();
    CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_FWD, op, D, f), 0);
    tf_no_failures(what);
    const std::vector<double> delta = tf_delta(dout, out, B, T, C, NH);
    kg_flash_args g = {qkv.data(), dout.data(), out.data(), lse.data(), delta.data(), NULL, NULL, dqkv.data(),
                       B, T, C, NH, op, scale, 0};
    CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_DKDV, op, D, g), 0);
    CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_DQ, op, D, g), 0);
    tf_no_failures(what);

    /* 16-bit storage of the same values */
    const std::vector<uint16_t> qkv16 = tf_bits16(qkv, op), dout16 = tf_bits16(dout, op), out_in16 = tf_bits16(out, op);
    std::vector<uint16_t> out16(no, 0xffffu), dqkv16(nq, 0xffffu);
    std::vector<float> lse16(nl, NAN);
    kg_flash_args f16 = {qkv16.data(), NULL, NULL, NULL, NULL, out16.data(), lse16.data(), NULL,
                         B, T, C, NH, op, scale, 1};
    CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_FWD, op, D, f16), 0);
    tf_no_failures(what);
    kg_flash_args g16 = {qkv16.data(), dout16.data(), out_in16.data(), lse.data(), delta.data(), NULL, NULL,
                         dqkv16.data(), B, T, C, NH, op, scale, 1};
    CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_DKDV, op, D, g16), 0);
    CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_DQ, op, D, g16), 0);
    tf_no_failures(what);

    const std::vector<uint16_t> want_out = tf_bits16(out, op), want_dqkv = tf_bits16(dqkv, op);
    size_t bad_out = 0, bad_dqkv = 0, bad_lse = 0;
    for (size_t i = 0; i < no; i++) bad_out += out16[i] != want_out[i];
    for (size_t i = 0; i < nq; i++) bad_dqkv += dqkv16[i] != want_dqkv[i];
    for (size_t i = 0; i < nl; i++) bad_lse += memcmp(&lse16[i], &lse[i], sizeof(float)) != 0;
    if (bad_out || bad_dqkv || bad_lse)
        fprintf(stderr, "  %s: %zu out, %zu dqkv, %zu lse elements differ from the float32 storage's\n", what,
                bad_out, bad_dqkv, bad_lse);
    CU_ASSERT_EQUAL(bad_out, 0);
    CU_ASSERT_EQUAL(bad_dqkv, 0);
    CU_ASSERT_EQUAL(bad_lse, 0);
}

static void test_flash_storage16(void) {
    tf_case16(2, 67, 128, 2, KG_BF16); /* D 64, T past one tile */
    tf_case16(1, 33, 64, 4, KG_F16);   /* D 16, below one tile */
    tf_case16(1, 130, 256, 2, KG_F16); /* D 128, three tiles   */
    tf_case16(1, 1, 32, 1, KG_BF16);   /* T = 1, D 32           */
}

/* A program with a missing barrier: every thread writes its element, then
 * (without X::sync) reads its neighbour's, written by another warp's
 * thread for t = 31 -> 32. The race check must report it; with the
 * barrier, nothing. */
template <class X> static void tf_racy(unsigned char *sm, bool with_barrier) {
    float *v = (float *)sm;
    for (int t = X::tid0(); X::tin(t); t += X::tstep()) X::st(&v[t], (float)t);
    if (with_barrier) X::sync();
    float s = 0.0f;
    for (int t = X::tid0(); X::tin(t); t += X::tstep()) s += X::ld(&v[(t + 1) % KG_FL_THREADS]);
    (void)s;
}

static void test_flash_race_check(void) {
    static unsigned char sm[KG_FL_THREADS * sizeof(float)] __attribute__((aligned(128)));
    static kg_fl_shadow sh[sizeof sm];
    kg_fl_shadow_clear(sh, sizeof sm);
    kg_fl_hs.smem = sm, kg_fl_hs.sh = sh, kg_fl_hs.bytes = sizeof sm;
    kg_fl_host_reset();
    kg_fl_hs.epoch++;
    tf_racy<kg_fl_host>(sm, true);
    CU_ASSERT_EQUAL(kg_fl_host_failures(NULL), 0);
    kg_fl_hs.epoch++;
    tf_racy<kg_fl_host>(sm, false);
    const char *first = NULL;
    CU_ASSERT_TRUE(kg_fl_host_failures(&first) > 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(first, "race"));
    kg_fl_hs.smem = NULL, kg_fl_hs.sh = NULL;
    kg_fl_host_reset();
}

/* The tile loads read 16 bytes at a time where the source is 16-byte
 * aligned and one element at a time where not: inputs one element past an
 * aligned start (qkv, dout; both storages) must give the aligned inputs'
 * outputs bit for bit. */
template <class S> static void tf_unaligned(int op, int s16) {
    const int B = 1, T = 100, NH = 2, C = 128, D = C / NH;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    const std::vector<float> qf = tf_rand16(nq, op), df = tf_rand16(no, op);
    /* the values in S's storage: 16-bit bits (tf_bits16), or the floats */
    std::vector<S> q(nq + 1), dO(no + 1);
    memcpy(q.data(), s16 ? (const void *)tf_bits16(qf, op).data() : (const void *)qf.data(), nq * sizeof(S));
    memcpy(dO.data(), s16 ? (const void *)tf_bits16(df, op).data() : (const void *)df.data(), no * sizeof(S));
    std::vector<S> q1(nq + 1), dO1(no + 1); /* the same values from element 1 */
    memcpy(q1.data() + 1, q.data(), nq * sizeof(S));
    memcpy(dO1.data() + 1, dO.data(), no * sizeof(S));
    const float scale = (float)(1.0 / sqrt((double)D));
    std::vector<S> out[2], dqkv[2];
    std::vector<float> lse[2];
    const std::vector<double> delta(nl, 0.125);
    for (int k = 0; k < 2; k++) {
        const S *qp = k ? q1.data() + 1 : q.data(), *dp = k ? dO1.data() + 1 : dO.data();
        out[k].assign(no, (S)0), dqkv[k].assign(nq, (S)0), lse[k].assign(nl, 0.0f);
        kg_flash_args f = {qp, NULL, NULL, NULL, NULL, out[k].data(), lse[k].data(), NULL, B, T, C, NH, op, scale,
                           s16};
        kg_fl_host_reset();
        CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_FWD, op, D, f), 0);
        kg_flash_args g = {qp, dp, out[0].data(), lse[0].data(), delta.data(), NULL, NULL, dqkv[k].data(),
                           B, T, C, NH, op, scale, s16};
        CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_DKDV, op, D, g), 0);
        CU_ASSERT_EQUAL(kg_fl_host_run(KG_FL_DQ, op, D, g), 0);
        tf_no_failures(s16 ? "unaligned 16-bit" : "unaligned float32");
    }
    CU_ASSERT_EQUAL(memcmp(out[0].data(), out[1].data(), no * sizeof(S)), 0);
    CU_ASSERT_EQUAL(memcmp(lse[0].data(), lse[1].data(), nl * sizeof(float)), 0);
    CU_ASSERT_EQUAL(memcmp(dqkv[0].data(), dqkv[1].data(), nq * sizeof(S)), 0);
}

static void test_flash_unaligned(void) {
    tf_unaligned<uint16_t>(KG_BF16, 1);
    tf_unaligned<float>(KG_F16, 0);
}

/* The bank model's counts for the three programs at head size D, 16-bit
 * storage (gpt's bf16-mixed call), T = 256: 4 query and 4 key tiles, so
 * both the diagonal tiles and the full ones count. */
static void tf_banks(int D, long req[3], long wf[3], long ideal[3]) {
    const int B = 1, T = 256, NH = 2, C = NH * D, op = KG_BF16;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    const std::vector<uint16_t> qkv = tf_bits16(tf_rand16(nq, op), op), dout = tf_bits16(tf_rand16(no, op), op);
    std::vector<uint16_t> out(no), dqkv(nq);
    std::vector<float> lse(nl);
    const float scale = (float)(1.0 / sqrt((double)D));
    kg_flash_args f = {qkv.data(), NULL, NULL, NULL, NULL, out.data(), lse.data(), NULL, B, T, C, NH, op, scale, 1};
    std::vector<double> delta(nl, 0.25);
    kg_flash_args g = {qkv.data(), dout.data(), out.data(), lse.data(), delta.data(), NULL, NULL, dqkv.data(),
                       B, T, C, NH, op, scale, 1};
    static const char *names[3] = {"forward", "dK/dV", "dQ"};
    kg_fl_host_reset();
    for (int prog = KG_FL_FWD; prog <= KG_FL_DQ; prog++) {
        kg_fl_banks_begin();
        CU_ASSERT_EQUAL(kg_fl_host_run(prog, op, D, prog == KG_FL_FWD ? f : g), 0);
        kg_fl_banks_end();
        char what[64];
        snprintf(what, sizeof what, "  D=%d %s", D, names[prog]);
        kg_fl_banks_print(stderr, what);
        req[prog] = kg_fl_bk.requests, wf[prog] = kg_fl_bk.wavefronts, ideal[prog] = kg_fl_bk.ideal;
    }
    tf_no_failures("bank model");
}

/* Shared memory of `bytes` for a hand-written program: its shadow cleared
 * and the host state pointed at it (tf_smem_off to detach). */
static void tf_smem_on(unsigned char *sm, kg_fl_shadow *sh, size_t bytes) {
    kg_fl_shadow_clear(sh, bytes);
    kg_fl_hs.smem = sm, kg_fl_hs.sh = sh, kg_fl_hs.bytes = bytes;
    kg_fl_host_reset();
    kg_fl_hs.epoch++;
}
static void tf_smem_off(void) { kg_fl_hs.smem = NULL, kg_fl_hs.sh = NULL; }

/* The host's ldmatrix against the PTX ISA's definition, written out
 * element by element: a 32 x 24 tile (leading dimension 24) holding r * 256
 * + c at (r, c); lane l gives row l of column block 1 (columns 8..15), so
 * matrix i is rows 8i..8i+7 of those columns. Register i of lane l holds
 * elements (8i + l/4, 8 + 2(l%4)) and the next column (no .trans), or
 * (8i + 2(l%4), 8 + l/4) and the next row (.trans), the first in the low
 * half. */
static void test_flash_isa_ldmatrix(void) {
    static unsigned char sm[32 * 24 * 2] __attribute__((aligned(128)));
    static kg_fl_shadow sh[sizeof sm];
    typedef kg_fl_host X;
    uint16_t *tile = (uint16_t *)sm;
    tf_smem_on(sm, sh, sizeof sm);
    for (int t = X::tid0(); X::tin(t); t += X::tstep())
        for (int i = t; i < 32 * 24; i += KG_FL_THREADS) X::st(&tile[i], (uint16_t)((i / 24) * 256 + i % 24));
    X::sync();
    uint32_t r[2][4][X::NL];
    for (int w = X::warp0(); X::win(w); w += X::wstep()) {
        if (w != 1) continue;
        const uint16_t *p[X::NL];
        for (int l = X::lane0(); X::lin(w, l); l += X::lstep()) p[X::li(l)] = tile + l * 24 + 8;
        X::ldsm<0>(r[0], p);
        X::ldsm<1>(r[1], p);
    }
    tf_smem_off();
    tf_no_failures("ldmatrix");
    int bad = 0;
    for (int i = 0; i < 4; i++)
        for (int l = 0; l < 32; l++) {
            const uint32_t want0 = (uint32_t)((8 * i + l / 4) * 256 + 8 + 2 * (l % 4)),
                           want1 = (uint32_t)((8 * i + 2 * (l % 4)) * 256 + 8 + l / 4);
            bad += r[0][i][l] != (want0 | (want0 + 1) << 16);
            bad += r[1][i][l] != (want1 | (want1 + 256) << 16);
        }
    CU_ASSERT_EQUAL(bad, 0);
}

/* The host's mma.sync m16n8k16 against the PTX ISA's fragment tables,
 * written out element by element (groupID g = l >> 2, threadID_in_group t
 * = l % 4): A's elements a0..a7 (two to a register, a0 low) at row g for
 * a0, a1, a4, a5 and g + 8 otherwise, column 2t + (i & 1), plus 8 for a4..
 * a7; B's b0..b3 at row 2t + (i & 1), plus 8 for b2, b3, column g; C's
 * c0..c3 at row g, plus 8 for c2, c3, column 2t + (i & 1). D must be C +
 * A B for random bf16 A, B and float C (within float rounding), and for f16
 * operands too. */
template <int OP> static void tf_isa_mma(void) {
    typedef kg_fl_host X;
    float A[16][16], B[16][8], C[16][8];
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 16; k++) A[i][k] = kg_fl_dec<OP>(kg_fl_enc<OP>(tf_uniform(-2.0f, 2.0f)));
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) B[k][n] = kg_fl_dec<OP>(kg_fl_enc<OP>(tf_uniform(-2.0f, 2.0f)));
    for (int i = 0; i < 16; i++)
        for (int n = 0; n < 8; n++) C[i][n] = tf_uniform(-1.0f, 1.0f);
    uint32_t a[4][X::NL], b[4][X::NL];
    float d[4][X::NL];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l % 4;
        for (int i = 0; i < 8; i++) {
            const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8, col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
            const uint32_t bits = kg_fl_enc<OP>(A[row][col]);
            if (i % 2 == 0) a[i / 2][l] = bits;
            else a[i / 2][l] |= bits << 16;
        }
        /* B in registers 2 and 3 (h = 1); 0 and 1 hold garbage it must not read */
        b[0][l] = b[1][l] = 0x7fc07fc0u;
        for (int i = 0; i < 4; i++) {
            const uint32_t bits = kg_fl_enc<OP>(B[2 * t + (i & 1) + (i >= 2 ? 8 : 0)][g]);
            if (i % 2 == 0) b[2 + i / 2][l] = bits;
            else b[2 + i / 2][l] |= bits << 16;
        }
        for (int i = 0; i < 4; i++) d[i][l] = C[g + (i >= 2 ? 8 : 0)][2 * t + (i & 1)];
    }
    kg_fl_host_reset();
    for (int w = X::warp0(); X::win(w); w += X::wstep())
        if (w == 0) X::mma<OP>(d, a, b, 1);
    tf_no_failures("mma");
    double worst = 0.0;
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l % 4;
        for (int i = 0; i < 4; i++) {
            const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
            double want = C[row][col];
            for (int k = 0; k < 16; k++) want += (double)A[row][k] * (double)B[k][col];
            const double e = fabs((double)d[i][l] - want);
            worst = e > worst ? e : worst;
        }
    }
    CU_ASSERT_TRUE(worst < 1e-4);
}

static void test_flash_isa_mma(void) {
    tf_isa_mma<KG_BF16>();
    tf_isa_mma<KG_F16>();
}

/* A program of one warp's lanes, each reading shared memory `reps` times at
 * its own place: element l * stride (of type T) for lane l. */
template <class X, class T> static void tf_strided(unsigned char *sm, int stride) {
    T *v = (T *)sm;
    for (int t = X::tid0(); X::tin(t); t += X::tstep())
        if (t < 32) X::st(&v[t * stride], (T)0);
    X::sync();
    float s = 0.0f;
    for (int l = X::lane0(); X::lin(0, l); l += X::lstep())
        for (int k = 0; k < 3; k++) s += (float)X::ld(&v[l * stride]);
    (void)s;
}

/* The bank model's wavefronts per request for one strided program, and
 * the least it could take (*ideal, per request). */
template <class T> static double tf_strided_cost(int stride, double *ideal = NULL) {
    static unsigned char sm[32 * 64 * 16] __attribute__((aligned(128)));
    static kg_fl_shadow sh[sizeof sm];
    kg_fl_shadow_clear(sh, sizeof sm);
    kg_fl_hs.smem = sm, kg_fl_hs.sh = sh, kg_fl_hs.bytes = sizeof sm;
    kg_fl_host_reset();
    kg_fl_hs.epoch++;
    kg_fl_banks_begin();
    tf_strided<kg_fl_host, T>(sm, stride);
    kg_fl_banks_end();
    kg_fl_hs.smem = NULL, kg_fl_hs.sh = NULL;
    tf_no_failures("strided");
    /* the stores: one request; the reads: three */
    CU_ASSERT_EQUAL(kg_fl_bk.requests, 4);
    if (ideal) *ideal = kg_fl_bk.requests ? (double)kg_fl_bk.ideal / (double)kg_fl_bk.requests : 0.0;
    return kg_fl_bk.requests ? (double)kg_fl_bk.wavefronts / (double)kg_fl_bk.requests : 0.0;
}

/* The model against what shared memory does with strided accesses: floats
 * at stride 1 or an odd stride one wavefront, stride 2 two, 32 thirty-two;
 * 16-bit values at stride 1 (two lanes to a word) one, at stride 64 (every
 * lane in bank 0) thirty-two; doubles, served a half warp at a time, two
 * at stride 1 (and two without conflicts), four at stride 2. */
static void test_flash_bank_model(void) {
    CU_ASSERT_DOUBLE_EQUAL(tf_strided_cost<float>(1), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(tf_strided_cost<float>(33), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(tf_strided_cost<float>(32), 32.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(tf_strided_cost<uint16_t>(1), 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(tf_strided_cost<uint16_t>(64), 32.0, 1e-12);
    double ideal = 0.0;
    CU_ASSERT_DOUBLE_EQUAL(tf_strided_cost<float>(2, &ideal), 2.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(ideal, 1.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(tf_strided_cost<double>(1, &ideal), 2.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(ideal, 2.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(tf_strided_cost<double>(2), 4.0, 1e-12);
}

/* The programs' shared-memory accesses (their tile loads, the dK/dV
 * program's lse and delta reads, every ldmatrix) take no more wavefronts
 * than conflict-free ones, at every head size. */
static void test_flash_banks(void) {
    long req[3], wf[3], ideal[3];
    fprintf(stderr, "\n");
    for (int D = 16; D <= 128; D *= 2) {
        tf_banks(D, req, wf, ideal);
        for (int prog = 0; prog < 3; prog++) {
            CU_ASSERT_TRUE(req[prog] > 1000);
            CU_ASSERT_TRUE(ideal[prog] >= req[prog]);
            CU_ASSERT_EQUAL(wf[prog], ideal[prog]);
        }
    }
}

static void register_tests(void) {
    CU_pSuite s = CU_add_suite("cuda_flash", NULL, NULL);
    CU_add_test(s, "flash attention vs cpu, head sizes 16..128 (bf16)", test_flash_head_sizes);
    CU_add_test(s, "flash attention vs cpu, T = 1 and tile edges", test_flash_edges);
    CU_add_test(s, "flash attention vs cpu, f16 outputs", test_flash_f16);
    CU_add_test(s, "16-bit storage (1.7) equals float32 storage rounded", test_flash_storage16);
    CU_add_test(s, "the emulation's race check fails a missing barrier", test_flash_race_check);
    CU_add_test(s, "unaligned inputs give the aligned inputs' bits", test_flash_unaligned);
    CU_add_test(s, "the host's ldmatrix is the PTX ISA's", test_flash_isa_ldmatrix);
    CU_add_test(s, "the host's mma.sync m16n8k16 is the PTX ISA's", test_flash_isa_mma);
    CU_add_test(s, "the bank model counts strided accesses as shared memory serves them", test_flash_bank_model);
    CU_add_test(s, "the programs' shared-memory accesses are free of bank conflicts", test_flash_banks);
}

#include "cunit_main.h"
