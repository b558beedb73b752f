/*
 * cpu_gemm_ex.c: the GEMMs of the other dtypes. kc_gemm_ex is the
 * mixed-precision GEMM autocast-style training needs on a CPU: float16 or
 * bfloat16 operands are widened (exactly) to float32 in caller-provided
 * scratch and multiplied by the float32 kc_gemm, so accumulation is float32
 * as in a GPU's tensor-core GEMM. The call is autocast's matmul: its
 * 16-bit dtype is a float16/bfloat16 round_dtype, else the 16-bit format
 * of an operand, and float32 operands are rounded through it first (into
 * the scratch; exact, and then only a copy, when the caller rounded them
 * already). With a 16-bit round_dtype the product is rounded through it
 * before it is added to C, which is what a reduced-precision matmul whose
 * output is cast up and accumulated (a .grad += ...) produces, overflow to
 * inf included. kc_dgemm is the float64 GEMM (cblas_dgemm) with
 * kc_gemm's split across kiln's pool. A float16/bfloat16 C (ABI 1.6) gets
 * the float32 result rounded once as it is stored. Nothing here allocates: the caller asks
 * kc_gemm_ex_workspace how much scratch a call needs and provides it (the cpu
 * accelerator keeps one grow-only buffer for that).
 */
#include "../common/km_gemm.h"
#include "cpu_internal.h"
#include "cpu_kernels.h"

#include <cblas.h>

/* ------------------------------------------------------------- dgemm */

typedef struct {
    int trans_a, trans_b, M, N, K;
    double alpha, beta;
    const double *A, *B; /* op(A): (M, K), op(B): (K, N) */
    double *C;           /* (M, N) */
    int lda, ldb, ldc;
} kc_dgemm_ctx;

static void kc_dgemm_call(const kc_dgemm_ctx *g, int M, int N, const double *A, const double *B, double *C) {
    kc_blas_dgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans, M,
                N, g->K, g->alpha, A, g->lda, B, g->ldb, g->beta, C, g->ldc);
}

/* C[:, j0:j1] = op(A) op(B)[:, j0:j1] */
static void kc_dgemm_cols(void *vc, size_t j0, size_t j1) {
    const kc_dgemm_ctx *g = vc;
    const double *B = g->trans_b ? g->B + j0 * (size_t)g->ldb : g->B + j0;
    kc_dgemm_call(g, g->M, (int)(j1 - j0), g->A, B, g->C + j0);
}

/* C[i0:i1, :] = op(A)[i0:i1, :] op(B) */
static void kc_dgemm_rows(void *vc, size_t i0, size_t i1) {
    const kc_dgemm_ctx *g = vc;
    const double *A = g->trans_a ? g->A + i0 : g->A + i0 * (size_t)g->lda;
    kc_dgemm_call(g, (int)(i1 - i0), g->N, A, g->B, g->C + i0 * (size_t)g->ldc);
}

/* The same thresholds as kc_gemm (a double multiply-add costs about twice a
 * float one, so splitting pays off at least as early). Column blocks start on
 * multiples of 8 doubles: one cache line. */
#define KC_DGEMM_SPLIT_MIN_FLOPS ((double)(1 << 21))
#define KC_DGEMM_SPLIT_GRAIN ((size_t)64)

void kc_dgemm(int trans_a, int trans_b, int M, int N, int K, double alpha,
              const double *A, int lda, const double *B, int ldb, double beta,
              double *C, int ldc) {
    if (M <= 0 || N <= 0 || K < 0) return;
    if (K == 0) {
        /* BLAS would reject lda < 1 for K == 0; the result is beta * C, with
         * beta == 0 overwriting (C not read). */
        for (int i = 0; i < M; i++) {
            double *c = C + (size_t)i * (size_t)ldc;
            for (int j = 0; j < N; j++) c[j] = beta == 0.0 ? 0.0 : beta * c[j];
        }
        return;
    }
    kc_dgemm_ctx g = {trans_a, trans_b, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc};
    const int big = (double)M * (double)N * (double)K >= KC_DGEMM_SPLIT_MIN_FLOPS && kc_get_num_threads() > 1;
    if (big && (size_t)N >= 2 * KC_DGEMM_SPLIT_GRAIN)
        kc_parallel_for((size_t)N, KC_DGEMM_SPLIT_GRAIN, 8, kc_dgemm_cols, &g);
    else if (big && (size_t)M >= 2 * KC_DGEMM_SPLIT_GRAIN)
        kc_parallel_for((size_t)M, KC_DGEMM_SPLIT_GRAIN, 1, kc_dgemm_rows, &g);
    else
        kc_dgemm_call(&g, M, N, A, B, C);
}

/* ----------------------------------------------------------- gemm_ex */

/* Workspace parts start on 64-byte boundaries (a cache line; more than any
 * vector load needs). */
static size_t kc_ws_round(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

static int kc_is_f32_operand(int dt) { return dt == KC_F32 || dt == KC_F16 || dt == KC_BF16; }

/* The float32 family's layout: [A as float (M*K)] [B as float (K*N)]
 * [product (M*N)], each part present only when needed: an operand is
 * copied when it is 16-bit (widened) or when the matmul's 16-bit dtype
 * rounds it (km_gemm_round_dtype); the product when it is rounded before
 * beta * C joins it, or when C is 16-bit. Offsets in bytes. */
typedef struct {
    size_t a_off, b_off, p_off, total;
} kc_ws_layout;

static kc_ws_layout kc_gemm_ex_layout(int M, int N, int K, int a_dtype, int b_dtype, int c_dtype, int round_dtype,
                                      float beta) {
    kc_ws_layout l = {0, 0, 0, 0};
    const size_t m = (size_t)M, n = (size_t)N, k = (size_t)K;
    const int rounds = km_gemm_round_dtype(a_dtype, b_dtype, round_dtype) != KC_F32;
    if (a_dtype != KC_F32 || rounds) {
        l.a_off = l.total;
        l.total += kc_ws_round(m * k * sizeof(float));
    }
    if (b_dtype != KC_F32 || rounds) {
        l.b_off = l.total;
        l.total += kc_ws_round(k * n * sizeof(float));
    }
    if ((round_dtype != KC_F32 && beta != 0.0f) || c_dtype != KC_F32) {
        l.p_off = l.total;
        l.total += kc_ws_round(m * n * sizeof(float));
    }
    return l;
}

/* 0: the float32 family (C float32, or 16-bit: 2); 1: the float64 one;
 * -1: unsupported. */
static int kc_gemm_ex_family(int a_dtype, int b_dtype, int c_dtype, int round_dtype) {
    if (c_dtype == KC_F32 && kc_is_f32_operand(a_dtype) && kc_is_f32_operand(b_dtype) &&
        kc_is_f32_operand(round_dtype))
        return 0;
    if ((c_dtype == KC_F16 || c_dtype == KC_BF16) && round_dtype == c_dtype &&
        (a_dtype == KC_F32 || a_dtype == c_dtype) && (b_dtype == KC_F32 || b_dtype == c_dtype))
        return 2;
    if (c_dtype == KC_F64 && a_dtype == KC_F64 && b_dtype == KC_F64 &&
        (round_dtype == KC_F32 || round_dtype == KC_F64))
        return 1;
    return -1;
}

size_t kc_gemm_ex_workspace(int M, int N, int K, int a_dtype, int b_dtype, int c_dtype,
                            int round_dtype, double beta) {
    if (M <= 0 || N <= 0 || K < 0) return 0;
    const int family = kc_gemm_ex_family(a_dtype, b_dtype, c_dtype, round_dtype);
    if (family != 0 && family != 2) return 0;
    return kc_gemm_ex_layout(M, N, K, a_dtype, b_dtype, c_dtype, round_dtype, (float)beta).total;
}

typedef struct {
    float *C;       /* (M, N), leading dimension ldc */
    const float *P; /* (M, N) contiguous: the rounded product */
    size_t N, ldc;
    float beta;
} kc_combine_ctx;

/* Rows [r0, r1): C = P + beta * C (rounded product first, as autocast's
 * output is cast up and then added). */
static void kc_combine_range(void *vc, size_t r0, size_t r1) {
    const kc_combine_ctx *c = vc;
    const float beta = c->beta;
    for (size_t r = r0; r < r1; r++) {
        float *restrict cr = c->C + r * c->ldc;
        const float *restrict pr = c->P + r * c->N;
        for (size_t j = 0; j < c->N; j++) cr[j] = pr[j] + beta * cr[j];
    }
}

/* One operand of the float32 family as float32: itself when it is float32
 * and rop (KC_CAST, KC_ROUND_F16 or KC_ROUND_BF16) rounds nothing; else
 * widened and/or rounded into dst, compacted to its stored rows x cols,
 * with *ld set to match. */
static const float *kc_operand_f32(const void *X, int dtype, int *ld, int rows, int cols, int rop, void *dst) {
    if (dtype == KC_F32 && rop == KC_CAST) return X;
    const size_t r = (size_t)rows, c = (size_t)cols;
    kc_cast_rows(KC_CAST, dst, KC_F32, c, X, dtype, (size_t)*ld, r, c);
    if (dtype == KC_F32) kc_cast_rows(rop, dst, KC_F32, c, dst, KC_F32, c, r, c);
    *ld = cols > 0 ? cols : 1;
    return dst;
}

int kc_gemm_ex(int trans_a, int trans_b, int M, int N, int K, double alpha,
               const void *A, int a_dtype, int lda, const void *B, int b_dtype, int ldb,
               double beta, void *C, int c_dtype, int ldc, int round_dtype,
               void *ws, size_t ws_bytes) {
    const int family = kc_gemm_ex_family(a_dtype, b_dtype, c_dtype, round_dtype);
    if (family < 0) return -1;
    if (M <= 0 || N <= 0 || K < 0) return 0;
    if (family == 1) {
        kc_dgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return 0;
    }
    const float alpha_f = (float)alpha, beta_f = (float)beta;
    const kc_ws_layout l = kc_gemm_ex_layout(M, N, K, a_dtype, b_dtype, c_dtype, round_dtype, beta_f);
    if (l.total > ws_bytes || (l.total > 0 && !ws)) return -1;
    char *w = ws;

    /* Operands as float32, compacted to their stored shapes: A is stored
     * (M, K), or (K, M) when transposed; B (K, N) or (N, K). A float32
     * operand is rounded through the matmul's 16-bit dtype, when it has
     * one (autocast casts both operands to it). */
    const int ort = km_gemm_round_dtype(a_dtype, b_dtype, round_dtype);
    const int rop = ort == KC_F16 ? KC_ROUND_F16 : ort == KC_BF16 ? KC_ROUND_BF16 : KC_CAST;
    int lda_f = lda, ldb_f = ldb;
    const float *Af = kc_operand_f32(A, a_dtype, &lda_f, trans_a ? K : M, trans_a ? M : K, rop, w + l.a_off);
    const float *Bf = kc_operand_f32(B, b_dtype, &ldb_f, trans_b ? N : K, trans_b ? K : N, rop, w + l.b_off);
    if (family == 2) {
        /* A 16-bit C: P (M, N) = alpha op(A) op(B) + beta C in float32 (C
         * widened, read only when beta != 0), stored rounded once. */
        float *P = (float *)(void *)(w + l.p_off);
        if (beta_f != 0.0f) kc_cast_rows(KC_CAST, P, KC_F32, (size_t)N, C, c_dtype, (size_t)ldc, (size_t)M, (size_t)N);
        kc_gemm(trans_a, trans_b, M, N, K, alpha_f, Af, lda_f, Bf, ldb_f, beta_f, P, N);
        kc_cast_rows(KC_CAST, C, c_dtype, (size_t)ldc, P, KC_F32, (size_t)N, (size_t)M, (size_t)N);
        return 0;
    }
    const int op = round_dtype == KC_F16 ? KC_ROUND_F16 : round_dtype == KC_BF16 ? KC_ROUND_BF16 : KC_CAST;

    float *Cf = C;
    if (op == KC_CAST) {
        kc_gemm(trans_a, trans_b, M, N, K, alpha_f, Af, lda_f, Bf, ldb_f, beta_f, Cf, ldc);
        return 0;
    }
    if (beta_f == 0.0f) {
        /* The product lands in C; round it there (C's padding untouched). */
        kc_gemm(trans_a, trans_b, M, N, K, alpha_f, Af, lda_f, Bf, ldb_f, 0.0f, Cf, ldc);
        kc_cast_rows(op, Cf, KC_F32, (size_t)ldc, Cf, KC_F32, (size_t)ldc, (size_t)M, (size_t)N);
        return 0;
    }
    /* P (M, N) = alpha op(A) op(B) in the workspace, rounded, then added. */
    float *P = (float *)(void *)(w + l.p_off);
    kc_gemm(trans_a, trans_b, M, N, K, alpha_f, Af, lda_f, Bf, ldb_f, 0.0f, P, N);
    kc_cast_rows(op, P, KC_F32, (size_t)N, P, KC_F32, (size_t)N, (size_t)M, (size_t)N);
    kc_combine_ctx cc = {Cf, P, (size_t)N, (size_t)ldc, beta_f};
    const size_t grain = KC_GRAIN_STREAM / (size_t)N;
    kc_parallel_for((size_t)M, grain ? grain : 1, 1, kc_combine_range, &cc);
    return 0;
}
