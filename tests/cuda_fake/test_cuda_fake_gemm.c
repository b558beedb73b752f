/*
 * test_cuda_fake_gemm.c — the cuda accelerator's GEMMs on the fake CUDA
 * build (part of test_cuda_fake_unit; cuda_fake_test.h): the row-major to
 * column-major mapping for every transpose and leading dimension, K = 0,
 * TF32, misaligned operands and the cuBLASLt plan cache, no workspace; and
 * gemm_ex's operand conversions and rounded outputs (mixed float32 /
 * bfloat16 with beta = 1 and ldc > N, float64, float16 beside bfloat16,
 * float32 operands rounded as autocast rounds them, a 16-bit C) against an
 * exact reference computed here in double.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_fake_test.h"

/* ============================================================= GEMMs */

/* C(M,N; ldc) = alpha op(A) op(B) + beta C, row-major, in double. */
static void ref_gemm(int ta, int tb, int M, int N, int K, double alpha, const float *A, int lda, const float *B,
                     int ldb, double beta, const float *C, int ldc, double *out) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int p = 0; p < K; p++) {
                const double a = ta ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
                const double b = tb ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
                acc += a * b;
            }
            out[(size_t)i * ldc + j] = alpha * acc + (beta != 0.0 ? beta * C[(size_t)i * ldc + j] : 0.0);
        }
}

static void test_gemm_mapping(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const int M = 5, N = 7, K = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int pad = 0; pad < 2; pad++) {
                const int lda = (ta ? M : K) + 2 * pad, ldb = (tb ? K : N) + 3 * pad, ldc = N + pad;
                const int arows = ta ? K : M, brows = tb ? N : K;
                float A[64], B[64], C[64], out[64];
                double want[64];
                for (int i = 0; i < 64; i++) A[i] = val(i, 1), B[i] = val(i, 2), C[i] = val(i, 3);
                const size_t na = (size_t)arows * lda, nb = (size_t)brows * ldb, nc = (size_t)M * ldc;
                float *dA = up(k, acc, A, na * 4), *dB = up(k, acc, B, nb * 4), *dC = up(k, acc, C, nc * 4);
                CU_ASSERT_FATAL(dA && dB && dC);
                int32_t rc = k->gemm(acc, ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, 0.25f, dC, ldc);
                CU_ASSERT_EQUAL(rc, KILN_OK);
                if (rc != KILN_OK) fprintf(stderr, "  gemm ta=%d tb=%d pad=%d: %s\n", ta, tb, pad, kiln_test_error(g_th));
                CU_ASSERT_TRUE(down(k, acc, out, dC, nc * 4));
                ref_gemm(ta, tb, M, N, K, 0.5, A, lda, B, ldb, 0.25, C, ldc, want);
                int bad = 0;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < ldc; j++) {
                        const size_t x = (size_t)i * ldc + j;
                        /* the padding of C is never touched */
                        if (j >= N) bad += out[x] != C[x];
                        else bad += fabs(out[x] - want[x]) > 1e-6 * (1.0 + fabs(want[x]));
                    }
                CU_ASSERT_EQUAL(bad, 0);
                if (bad) fprintf(stderr, "  gemm ta=%d tb=%d pad=%d: %d wrong\n", ta, tb, pad, bad);
                k->free(acc, dA), k->free(acc, dB), k->free(acc, dC);
            }
    /* leading dimensions are checked row-major */
    float *d = NULL;
    CU_ASSERT_EQUAL(k->alloc(acc, 4096, (void **)&d), KILN_OK);
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, M, N, K, 1.0f, d, K - 1, d, N, 0.0f, d, N), KILN_E_INVALID_ARG);
    HAS(kiln_test_error(g_th), "lda");
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 1, M, N, K, 1.0f, d, K, d, K - 1, 0.0f, d, N), KILN_E_INVALID_ARG);
    HAS(kiln_test_error(g_th), "ldb");
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, M, N, K, 1.0f, d, K, d, N, 0.0f, d, N - 1), KILN_E_INVALID_ARG);
    HAS(kiln_test_error(g_th), "ldc");
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, -1, N, K, 1.0f, d, K, d, N, 0.0f, d, N), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 0, N, K, 1.0f, NULL, K, NULL, N, 0.0f, NULL, N), KILN_OK);
    k->free(acc, d);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* K == 0: C = beta * C (no cuBLASLt call), beta == 0 clears NaN; the padding
 * of C stays. */
static void test_gemm_k0(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const int M = 3, N = 4, ldc = 6;
    float C[18], out[18];
    for (int i = 0; i < 18; i++) C[i] = (i % 5 == 0) ? NAN : (float)i;
    float *dC = up(k, acc, C, sizeof C);
    CU_ASSERT_PTR_NOT_NULL_FATAL(dC);
    const unsigned long matmuls = stats().matmuls;
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, M, N, 0, 1.0f, NULL, 1, NULL, N, 0.0f, dC, ldc), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
    int bad = 0;
    for (int i = 0; i < 18; i++) {
        const int in = i % ldc < N;
        bad += in ? out[i] != 0.0f : !(out[i] == C[i] || (isnan(out[i]) && isnan(C[i])));
    }
    CU_ASSERT_EQUAL(bad, 0);
    for (int i = 0; i < 18; i++) C[i] = (float)(i + 1);
    CU_ASSERT_EQUAL(k->copy(acc, dC, C, sizeof C, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->gemm(acc, 1, 1, M, N, 0, 1.0f, NULL, M, NULL, 1, 0.5f, dC, ldc), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
    bad = 0;
    for (int i = 0; i < 18; i++) bad += out[i] != (i % ldc < N ? 0.5f * C[i] : C[i]);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(stats().matmuls, matmuls);
    k->free(acc, dC);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* tf32 = true runs float32 GEMMs with TF32 inputs (10 mantissa bits): 1 +
 * 2^-20 becomes 1. 16-bit operands never take the TF32 path. */
static void test_gemm_tf32(void) {
    static const kiln_kv tf[] = {{"tf32", KILN_V_BOOL(1)}, {NULL, KILN_V_NONE}};
    for (int t = 0; t < 2; t++) {
        const kiln_kernels *k = NULL;
        kiln_instance *acc = ready(t ? tf : NULL, &k);
        if (!acc) return;
        const float a = 1.0f + 0x1p-20f, b = 1.0f;
        float out = 0.0f;
        float *dA = up(k, acc, &a, 4), *dB = up(k, acc, &b, 4), *dC = up(k, acc, NULL, 4);
        CU_ASSERT_FATAL(dA && dB && dC);
        CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 1, 1, 1, 1.0f, dA, 1, dB, 1, 0.0f, dC, 1), KILN_OK);
        CU_ASSERT_TRUE(down(k, acc, &out, dC, 4));
        CU_ASSERT_EQUAL(out, t ? 1.0f : a);
        uint16_t h = 0x3C00; /* 1.0 in fp16 */
        uint16_t *dH = up(k, acc, &h, 2);
        CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, 1, 1, 1, 1.0, dH, KILN_DTYPE_F16, 1, dH, KILN_DTYPE_F16, 1, 0.0, dC,
                                   KILN_DTYPE_F32, 1, KILN_DTYPE_F32),
                        KILN_OK);
        CU_ASSERT_TRUE(down(k, acc, &out, dC, 4));
        CU_ASSERT_EQUAL(out, 1.0f);
        k->free(acc, dA), k->free(acc, dB), k->free(acc, dC), k->free(acc, dH);
        g_ops->base.destroy(acc);
    }
    NO_VIOLATIONS();
}

/* Operands that are views at odd offsets: the plan's alignment follows the
 * pointers (a plan chosen for 256-byte operands refuses 4-byte ones). */
static void test_gemm_alignment_and_plans(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    static float h[1024];
    float out[64];
    double want[64];
    for (int i = 0; i < 1024; i++) h[i] = val(i, 9);
    float *d = up(k, acc, h, sizeof h), *dC = up(k, acc, NULL, sizeof out);
    CU_ASSERT_FATAL(d && dC);
    const fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 4, 4, 4, 1.0f, d, 4, d + 64, 4, 0.0f, dC, 4), KILN_OK);
    for (int off = 1; off < 4; off++) {
        CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 4, 4, 4, 1.0f, d + off, 4, d + 64, 4, 0.0f, dC, 4), KILN_OK);
        CU_ASSERT_TRUE(down(k, acc, out, dC, 16 * 4));
        ref_gemm(0, 0, 4, 4, 4, 1.0, h + off, 4, h + 64, 4, 0.0, out, 4, want);
        int bad = 0;
        for (int i = 0; i < 16; i++) bad += fabs(out[i] - want[i]) > 1e-6;
        CU_ASSERT_EQUAL(bad, 0);
    }
    /* the same shape and alignment again: a cached plan, no heuristic */
    const unsigned long heur = stats().heuristics;
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 4, 4, 4, 1.0f, d, 4, d + 64, 4, 0.0f, dC, 4), KILN_OK);
    CU_ASSERT_EQUAL(stats().heuristics, heur);
    CU_ASSERT(heur >= s0.heuristics + 2);
    /* more shapes than the cache holds (64): old plans are evicted and
     * destroyed, the first shape is planned again and still right */
    for (int n = 1; n <= 70; n++) {
        const int cols = n % 8 + 1; /* B(n, cols) fits in the 1024 floats */
        CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 1, cols, n, 1.0f, d, n, d, cols, 0.0f, dC, cols), KILN_OK);
    }
    CU_ASSERT(stats().lt_objects_live <= s0.lt_objects_live + 64 * 4 + 4);
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 4, 4, 4, 1.0f, d, 4, d + 64, 4, 0.0f, dC, 4), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, 16 * 4));
    ref_gemm(0, 0, 4, 4, 4, 1.0, h, 4, h + 64, 4, 0.0, out, 4, want);
    int bad = 0;
    for (int i = 0; i < 16; i++) bad += fabs(out[i] - want[i]) > 1e-6;
    CU_ASSERT_EQUAL(bad, 0);
    k->free(acc, d), k->free(acc, dC);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* No cuBLASLt workspace at all (workspace_mib = 0) still multiplies. */
static void test_gemm_no_workspace(void) {
    static const kiln_kv ws0[] = {{"workspace_mib", KILN_V_INT(0)}, {NULL, KILN_V_NONE}};
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(ws0, &k);
    if (!acc) return;
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 0, 0, 1, 1, 1}, out[4];
    float *dA = up(k, acc, A, sizeof A), *dB = up(k, acc, B, sizeof B), *dC = up(k, acc, NULL, sizeof out);
    CU_ASSERT_FATAL(dA && dB && dC);
    /* (2x3) (3x2) */
    CU_ASSERT_EQUAL(k->gemm(acc, 0, 0, 2, 2, 3, 1.0f, dA, 3, dB, 2, 0.0f, dC, 2), KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
    CU_ASSERT(out[0] == 4.0f && out[1] == 5.0f && out[2] == 10.0f && out[3] == 11.0f);
    k->free(acc, dA), k->free(acc, dB), k->free(acc, dC);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* gemm_ex, float32 A (values bfloat16 can hold, as mixed precision passes
 * them) with bfloat16 B and the other way round, round_dtype bfloat16:
 * C = bf16(fp32(alpha op(A) op(B))) + beta C with beta = 1 and ldc > N, the
 * padding untouched; then beta = 0 over NaN, with ldc > N and ldc == N.
 * Every call has cuBLASLt write the product in bfloat16 (its rounding) and
 * one pass widen it into C. Exact: the reference takes the same exact
 * products and sums them in the same order. */
static void test_gemm_ex_mixed_bf16(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const int M = 6, N = 5, K = 9;
    for (int variant = 0; variant < 4; variant++) {
        const int a_is_f32 = variant < 2, ta = variant & 1, tb = !(variant & 1);
        const int lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 3;
        const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
        float af[128], bf[128], C[64], out[64], want[64];
        uint16_t a16[128], b16[128];
        for (size_t i = 0; i < 128; i++) {
            /* bfloat16-representable values for the float32 operand */
            af[i] = round_bf16(val((unsigned)i, 11) * 3.0f);
            bf[i] = round_bf16(val((unsigned)i, 12) * 2.0f);
            a16[i] = bf16_bits(af[i]);
            b16[i] = bf16_bits(bf[i]);
        }
        for (size_t i = 0; i < nc; i++) C[i] = val((unsigned)i, 13);
        const void *hA = a_is_f32 ? (const void *)af : (const void *)a16;
        const void *hB = a_is_f32 ? (const void *)b16 : (const void *)bf;
        const uint32_t at = a_is_f32 ? KILN_DTYPE_F32 : KILN_DTYPE_BF16;
        const uint32_t bt = a_is_f32 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
        void *dA = up(k, acc, hA, na * kiln_dtype_size(at)), *dB = up(k, acc, hB, nb * kiln_dtype_size(bt));
        float *dC = up(k, acc, C, nc * 4);
        CU_ASSERT_FATAL(dA && dB && dC);
        const double alpha = 0.75;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < ldc; j++) {
                const size_t x = (size_t)i * ldc + j;
                if (j >= N) {
                    want[x] = C[x];
                    continue;
                }
                double s = 0.0;
                for (int p = 0; p < K; p++) {
                    const double a = ta ? af[(size_t)p * lda + i] : af[(size_t)i * lda + p];
                    const double b = tb ? bf[(size_t)j * ldb + p] : bf[(size_t)p * ldb + j];
                    s += a * b;
                }
                want[x] = round_bf16((float)(alpha * s)) + 1.0f * C[x];
            }
        const fake_cuda_stats s0 = stats();
        int32_t rc = k->gemm_ex(acc, ta, tb, M, N, K, alpha, dA, at, lda, dB, bt, ldb, 1.0, dC, KILN_DTYPE_F32, ldc,
                                KILN_DTYPE_BF16);
        CU_ASSERT_EQUAL(rc, KILN_OK);
        CU_ASSERT_EQUAL(stats().round_add_16bit - s0.round_add_16bit, 1); /* a bf16 product, widened */
        if (rc != KILN_OK) fprintf(stderr, "  gemm_ex variant %d: %s\n", variant, kiln_test_error(g_th));
        CU_ASSERT_TRUE(down(k, acc, out, dC, nc * 4));
        int bad = 0;
        for (size_t i = 0; i < nc; i++) bad += out[i] != want[i];
        CU_ASSERT_EQUAL(bad, 0);
        if (bad) fprintf(stderr, "  gemm_ex mixed variant %d: %d of %zu differ\n", variant, bad, nc);

        /* beta = 0 over NaN: not read, in both epilogues */
        for (int in_place = 0; in_place < 2; in_place++) {
            const int ldc2 = in_place ? N : ldc;
            float nanC[64];
            for (int i = 0; i < 64; i++) nanC[i] = NAN;
            CU_ASSERT_EQUAL(k->copy(acc, dC, nanC, (size_t)M * ldc2 * 4, KILN_COPY_H2D), KILN_OK);
            CU_ASSERT_EQUAL(k->gemm_ex(acc, ta, tb, M, N, K, alpha, dA, at, lda, dB, bt, ldb, 0.0, dC,
                                       KILN_DTYPE_F32, ldc2, KILN_DTYPE_BF16),
                            KILN_OK);
            CU_ASSERT_TRUE(down(k, acc, out, dC, (size_t)M * ldc2 * 4));
            /* exactly the rounded product */
            int exact_bad = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0.0;
                    for (int p = 0; p < K; p++) {
                        const double a = ta ? af[(size_t)p * lda + i] : af[(size_t)i * lda + p];
                        const double b = tb ? bf[(size_t)j * ldb + p] : bf[(size_t)p * ldb + j];
                        s += a * b;
                    }
                    exact_bad += out[(size_t)i * ldc2 + j] != round_bf16((float)(alpha * s));
                }
            CU_ASSERT_EQUAL(exact_bad, 0);
            if (exact_bad) fprintf(stderr, "  gemm_ex mixed variant %d, beta 0, ldc %d: %d differ\n", variant, ldc2, exact_bad);
        }
        k->free(acc, dA), k->free(acc, dB), k->free(acc, dC);
    }
    /* dtype checks */
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, 1, 1, 1, 1.0, NULL, KILN_DTYPE_F64, 1, NULL, KILN_DTYPE_F32, 1, 0.0, NULL,
                               KILN_DTYPE_F32, 1, KILN_DTYPE_F32),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, 1, 1, 1, 1.0, NULL, KILN_DTYPE_F64, 1, NULL, KILN_DTYPE_F64, 1, 0.0, NULL,
                               KILN_DTYPE_F64, 1, KILN_DTYPE_BF16),
                    KILN_E_INVALID_ARG);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* gemm_ex is autocast's matmul (training.h): float32 operands that are NOT
 * bfloat16-representable are rounded through the matmul's 16-bit dtype,
 * and the product runs on the tensor cores (one bf16 x bf16 cuBLASLt
 * matmul, no fp32 one):
 *  - F32 x F32, round_dtype BF16 (a weight gradient dy^T . x): both rounded,
 *    product rounded, beta C added;
 *  - F32 x BF16, round_dtype F32 (a Conv1D forward before its bias): the
 *    F32 operand rounded, the product left in float32;
 *  - F32 x F32, round_dtype F32: full fp32, nothing rounded (one fp32 matmul);
 *  - F32 x F16, round_dtype BF16: the F32 operand rounded through bf16 in a
 *    copy, the F16 one widened, an fp32 product rounded through bf16.
 * Exact: the references sum the same exact products in the same order. */
static void test_gemm_ex_rounds_f32_operands(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    enum { M = 5, N = 7, K = 6 };
    float a[M * K], b[K * N], bq[K * N], hq[K * N], C[M * N], out[M * N];
    uint16_t b16[K * N], h16[K * N];
    for (int i = 0; i < M * K; i++) a[i] = val((unsigned)i, 21) * 3.0f + 1e-3f;
    for (int i = 0; i < K * N; i++) {
        b[i] = val((unsigned)i, 22) * 2.0f - 1e-3f;
        bq[i] = round_bf16(b[i]);
        b16[i] = bf16_bits(b[i]);
        h16[i] = hb_f16_bits(b[i]);
        hq[i] = (float)hb_f16_value(h16[i]);
    }
    int unrounded = 0; /* the inputs must need the rounding */
    for (int i = 0; i < M * K; i++) unrounded += round_bf16(a[i]) != a[i];
    CU_ASSERT_TRUE(unrounded > M * K / 2);
    for (int i = 0; i < M * N; i++) C[i] = val((unsigned)i, 23);
    float *dA = up(k, acc, a, sizeof a), *dB = up(k, acc, b, sizeof b), *dC = up(k, acc, C, sizeof C);
    void *dB16 = up(k, acc, b16, sizeof b16), *dH16 = up(k, acc, h16, sizeof h16);
    CU_ASSERT_FATAL(dA && dB && dC && dB16 && dH16);
    const double alpha = 0.5;
    for (int c = 0; c < 4; c++) {
        const uint32_t bt = c == 1 ? KILN_DTYPE_BF16 : c == 3 ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
        const uint32_t rt = c == 0 || c == 3 ? KILN_DTYPE_BF16 : KILN_DTYPE_F32;
        const void *dBc = c == 1 ? dB16 : c == 3 ? dH16 : (void *)dB;
        const double beta = c == 0 ? 1.0 : 0.0;
        CU_ASSERT_EQUAL(k->copy(acc, dC, C, sizeof C, KILN_COPY_H2D), KILN_OK);
        const fake_cuda_stats s0 = stats();
        CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, M, N, K, alpha, dA, KILN_DTYPE_F32, K, dBc, bt, N, beta, dC,
                                   KILN_DTYPE_F32, N, rt),
                        KILN_OK);
        const fake_cuda_stats s1 = stats();
        CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
        CU_ASSERT_EQUAL(s1.matmuls - s0.matmuls, 1);
        CU_ASSERT_EQUAL(s1.matmuls_16bit - s0.matmuls_16bit, c < 2 ? 1u : 0u);
        CU_ASSERT_EQUAL(s1.matmuls_fp32 - s0.matmuls_fp32, c < 2 ? 0u : 1u);
        /* a rounded bf16 product is stored in bf16 by the GEMM; the fp32
         * product of F32 x F16 (case 3) is rounded by the widening pass */
        CU_ASSERT_EQUAL(s1.round_add_16bit - s0.round_add_16bit, c == 0 ? 1u : 0u);
        int bad = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double sum = 0.0;
                for (int p = 0; p < K; p++) {
                    const double av = c == 2 ? a[i * K + p] : round_bf16(a[i * K + p]);
                    const double bv = c < 2 ? bq[p * N + j] : c == 3 ? hq[p * N + j] : b[p * N + j];
                    sum += av * bv;
                }
                const float prod = (float)(alpha * sum);
                const float want = c == 0 ? round_bf16(prod) + C[i * N + j] : c == 3 ? round_bf16(prod) : prod;
                bad += out[i * N + j] != want;
            }
        CU_ASSERT_EQUAL(bad, 0);
        if (bad) fprintf(stderr, "  gemm_ex rounding case %d: %d of %d differ\n", c, bad, M * N);
    }
    k->free(acc, dA), k->free(acc, dB), k->free(acc, dC), k->free(acc, dB16), k->free(acc, dH16);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* 1.6: gemm_ex into a bfloat16 C. An F32 A is converted once, a bf16 B is
 * taken as it is, and one 16-bit matmul writes C, whose fp32 result is
 * rounded once as it is stored (bits checked against the exact model);
 * K = 0 leaves beta * C rounded, through the row-wise path. The flag that
 * tells callers is set. */
static void test_gemm_ex_c16(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    CU_ASSERT_TRUE(k->flags & KILN_KERNELS_STORE_16BIT);
    enum { M = 4, N = 6, K = 5, LDC = 8 };
    float a[M * K];
    uint16_t b16[K * N], c16[M * LDC], out[M * LDC];
    for (int i = 0; i < M * K; i++) a[i] = val((unsigned)i, 31) * 3.0f;
    for (int i = 0; i < K * N; i++) b16[i] = bf16_bits(val((unsigned)i, 32));
    for (int i = 0; i < M * LDC; i++) c16[i] = bf16_bits(i % LDC < N ? val((unsigned)i, 33) : 7.0f);
    void *dA = up(k, acc, a, sizeof a), *dB = up(k, acc, b16, sizeof b16), *dC = up(k, acc, c16, sizeof c16);
    CU_ASSERT_FATAL(dA && dB && dC);
    const fake_cuda_stats s0 = stats();
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, M, N, K, 0.5, dA, KILN_DTYPE_F32, K, dB, KILN_DTYPE_BF16, N, -1.0, dC,
                               KILN_DTYPE_BF16, LDC, KILN_DTYPE_BF16),
                    KILN_OK);
    const fake_cuda_stats s1 = stats();
    CU_ASSERT_EQUAL(s1.matmuls - s0.matmuls, 1);
    CU_ASSERT_EQUAL(s1.matmuls_16bit - s0.matmuls_16bit, 1);
    CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < LDC; j++) {
            uint16_t want = c16[i * LDC + j]; /* the padding keeps its bits */
            if (j < N) {
                double sum = 0.0;
                for (int p = 0; p < K; p++) sum += (double)round_bf16(a[i * K + p]) * hb_bf16_value(b16[p * N + j]);
                want = bf16_bits((float)(0.5 * sum - 1.0 * hb_bf16_value(c16[i * LDC + j])));
            }
            bad += out[i * LDC + j] != want;
        }
    CU_ASSERT_EQUAL(bad, 0);
    /* K = 0: C = 0.5 * C, rounded, padding kept */
    CU_ASSERT_EQUAL(k->copy(acc, dC, c16, sizeof c16, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, M, N, 0, 1.0, NULL, KILN_DTYPE_F32, 1, NULL, KILN_DTYPE_F32, N, 0.5, dC,
                               KILN_DTYPE_BF16, LDC, KILN_DTYPE_BF16),
                    KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, sizeof out));
    bad = 0;
    for (int i = 0; i < M * LDC; i++)
        bad += out[i] != (i % LDC < N ? bf16_bits(0.5f * hb_bf16_value(c16[i])) : c16[i]);
    CU_ASSERT_EQUAL(bad, 0);
    /* a round_dtype other than C's is refused, naming both */
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 0, M, N, K, 1.0, dA, KILN_DTYPE_F32, K, dB, KILN_DTYPE_BF16, N, 0.0, dC,
                               KILN_DTYPE_BF16, LDC, KILN_DTYPE_F32),
                    KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "cuda: gemm_ex: c_dtype bfloat16 takes round_dtype bfloat16"));
    k->free(acc, dA), k->free(acc, dB), k->free(acc, dC);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

/* gemm_ex in float64 and with two different 16-bit dtypes (both widened to
 * float32), against double references. */
static void test_gemm_ex_f64_and_f16_bf16(void) {
    const kiln_kernels *k = NULL;
    kiln_instance *acc = ready(NULL, &k);
    if (!acc) return;
    const int M = 4, N = 3, K = 5;
    double A[32], B[32], C[16], out[16];
    for (int i = 0; i < 32; i++) A[i] = val(i, 21) * 1.1, B[i] = val(i, 22) * 0.9;
    for (int i = 0; i < 16; i++) C[i] = val(i, 23);
    double *dA = up(k, acc, A, sizeof A), *dB = up(k, acc, B, sizeof B), *dC = up(k, acc, C, sizeof C);
    CU_ASSERT_FATAL(dA && dB && dC);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 1, 0, M, N, K, 2.0, dA, KILN_DTYPE_F64, M, dB, KILN_DTYPE_F64, N, -1.0, dC,
                               KILN_DTYPE_F64, N, KILN_DTYPE_F64),
                    KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, out, dC, (size_t)M * N * 8));
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int p = 0; p < K; p++) s += A[p * M + i] * B[p * N + j];
            const double w = 2.0 * s - C[i * N + j];
            bad += fabs(out[i * N + j] - w) > 1e-14;
        }
    CU_ASSERT_EQUAL(bad, 0);
    /* fp16 A, bf16 B, rounded to fp16 */
    uint16_t h[32], b[32];
    float hf[32], bfl[32], outf[16];
    for (int i = 0; i < 32; i++) {
        hf[i] = (float)(int)(val(i, 31) * 16.0f) / 16.0f; /* exact in fp16 and bf16 */
        bfl[i] = (float)(int)(val(i, 32) * 8.0f) / 8.0f;
        h[i] = 0; /* fp16 bits of hf */
        {
            const float v = hf[i];
            if (v == 0.0f) h[i] = 0;
            else {
                int e;
                const float f = frexpf(fabsf(v), &e); /* v = f 2^e, f in [0.5,1) */
                const unsigned mant = (unsigned)ldexpf(f, 11) - 1024u;
                h[i] = (uint16_t)((v < 0 ? 0x8000u : 0u) | ((unsigned)(e - 1 + 15) << 10) | mant);
            }
        }
        b[i] = bf16_bits(bfl[i]);
    }
    uint16_t *dH = up(k, acc, h, sizeof h), *dBb = up(k, acc, b, sizeof b);
    float *dCf = up(k, acc, NULL, 16 * 4);
    CU_ASSERT_FATAL(dH && dBb && dCf);
    CU_ASSERT_EQUAL(k->gemm_ex(acc, 0, 1, M, N, K, 1.0, dH, KILN_DTYPE_F16, K, dBb, KILN_DTYPE_BF16, K, 0.0, dCf,
                               KILN_DTYPE_F32, N, KILN_DTYPE_F32),
                    KILN_OK);
    CU_ASSERT_TRUE(down(k, acc, outf, dCf, (size_t)M * N * 4));
    bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int p = 0; p < K; p++) s += (double)hf[i * K + p] * bfl[j * K + p];
            bad += outf[i * N + j] != (float)s;
        }
    CU_ASSERT_EQUAL(bad, 0);
    k->free(acc, dA), k->free(acc, dB), k->free(acc, dC), k->free(acc, dH), k->free(acc, dBb), k->free(acc, dCf);
    g_ops->base.destroy(acc);
    NO_VIOLATIONS();
}

void cuda_fake_gemm_tests(CU_pSuite s) {
    CU_add_test(s, "gemm: row-major mapping, transposes, ld", test_gemm_mapping);
    CU_add_test(s, "gemm: K = 0", test_gemm_k0);
    CU_add_test(s, "gemm: tf32 setting", test_gemm_tf32);
    CU_add_test(s, "gemm: alignment and the plan cache", test_gemm_alignment_and_plans);
    CU_add_test(s, "gemm_ex: F32 x BF16 rounded to BF16, beta 1, ldc > N", test_gemm_ex_mixed_bf16);
    CU_add_test(s, "gemm_ex: F64; F16 x BF16", test_gemm_ex_f64_and_f16_bf16);
    CU_add_test(s, "gemm_ex: F32 operands rounded as autocast, on the tensor cores", test_gemm_ex_rounds_f32_operands);
    CU_add_test(s, "1.6 gemm_ex into a bfloat16 C: one 16-bit matmul, rounded once; K = 0", test_gemm_ex_c16);
    CU_add_test(s, "gemm: workspace_mib = 0", test_gemm_no_workspace);
}
