/*
 * test_cpu_accel.c — the "cpu" accelerator plugin (libkiln-cpu.so) loaded
 * through the mock host, as the real host would load it. Every entry of its
 * kiln_kernels table is checked against a direct double-precision computation
 * written here (naive loops, not the kernels library), so the test sees the
 * plugin's wiring (argument order, transposes, leading dimensions) as well as
 * the numbers. Also: the table's struct_size covers every entry, memory is
 * 64-byte aligned and zero-filled, an impossible allocation is KILN_E_NOMEM
 * with the size in the message, an out-of-range label is KILN_E_DATA naming
 * the row and the label, all_finite sees NaN and both infinities, and
 * configure() sizes the thread pools without changing any result.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "mockhost.h"

static const kiln_plugin_desc *g_desc;
static const kiln_accelerator_ops *g_ops;
static kiln_instance *g_acc;
static const kiln_kernels *g_k;

static int suite_init(void) {
    mh_reset();
    const char *dir = getenv("KILN_PLUGIN_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/libkiln-cpu.so", dir ? dir : ".");
    g_desc = mh_load(path, KILN_KIND_ACCELERATOR, "cpu");
    if (!g_desc) return -1;
    g_ops = g_desc->ops;
    if (g_ops->base.create(g_desc->plugin_ctx, mh_services(), mh_ctx(), NULL, &g_acc) != KILN_OK) return -1;
    g_k = g_ops->kernels(g_acc);
    return g_k ? 0 : -1;
}

static int suite_clean(void) {
    if (g_acc) g_ops->base.destroy(g_acc);
    g_acc = NULL;
    mh_reset();
    return 0;
}

/* |got - want| <= tol * (1 + |want|) */
static int close_to(double got, double want, double tol) { return fabs(got - want) <= tol * (1.0 + fabs(want)); }

/* Deterministic values in [-1, 1). */
static float val(unsigned i, unsigned salt) {
    uint32_t x = (i + 1u) * 2654435761u ^ (salt * 40503u + 0x9E37u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return (float)((double)(x & 0xFFFFFF) / (double)0x800000 - 1.0);
}

/* ------------------------------------------------------------ descriptor */

static void test_descriptor(void) {
    CU_ASSERT_EQUAL(g_desc->kind, KILN_KIND_ACCELERATOR);
    CU_ASSERT_STRING_EQUAL(g_desc->name, "cpu");
    CU_ASSERT_STRING_EQUAL(kiln_kv_str(g_desc->properties, "device_type", ""), "cpu");
    CU_ASSERT_TRUE(g_ops->base.struct_size >= sizeof(kiln_accelerator_ops));
    CU_ASSERT_PTR_NOT_NULL(g_ops->kernels);
    CU_ASSERT_PTR_NOT_NULL(g_ops->configure);

    /* struct_size must reach the last 1.1 entry, and every function pointer
     * from alloc to struct_size must be set (walked generically, so an entry
     * appended later is covered too). */
    CU_ASSERT_TRUE(g_k->struct_size >= offsetof(kiln_kernels, adamw_update) + sizeof g_k->adamw_update);
    size_t first = offsetof(kiln_kernels, alloc);
    typedef void (*any_fn)(void);
    int n = 0;
    for (size_t off = first; off + sizeof(any_fn) <= g_k->struct_size; off += sizeof(any_fn), n++) {
        any_fn f;
        memcpy(&f, (const char *)g_k + off, sizeof f);
        if (!f) fprintf(stderr, "kernel table entry at offset %zu is NULL\n", off);
        CU_ASSERT_PTR_NOT_NULL((void *)(uintptr_t)f);
    }
    CU_ASSERT_EQUAL(n, 21); /* alloc .. adamw_update in ABI 1.1 */
}

/* ---------------------------------------------------------------- memory */

static void test_alloc(void) {
    static const size_t sizes[] = {0, 1, 3, 63, 64, 100, 4097, 1u << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        void *p = NULL;
        CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, sizes[s], &p), KILN_OK);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        CU_ASSERT_EQUAL((uintptr_t)p % 64, 0);
        const unsigned char *b = p;
        size_t nonzero = 0;
        for (size_t i = 0; i < sizes[s]; i++) nonzero += b[i] != 0;
        CU_ASSERT_EQUAL(nonzero, 0);
        memset(p, 0xAB, sizes[s]); /* the whole requested size is writable */
        g_k->free(g_acc, p);
    }
    /* Memory that was dirtied and freed comes back zeroed. */
    for (int round = 0; round < 4; round++) {
        unsigned char *p = NULL;
        CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, 8192, (void **)&p), KILN_OK);
        int zero = 1;
        for (int i = 0; i < 8192; i++) zero &= p[i] == 0;
        CU_ASSERT_TRUE(zero);
        memset(p, 0xCD, 8192);
        g_k->free(g_acc, p);
    }
    /* A size no allocator can satisfy: KILN_E_NOMEM naming the size. */
    void *p = (void *)&p;
    size_t huge = SIZE_MAX - 8;
    mh.last_error[0] = 0;
    CU_ASSERT_EQUAL(g_k->alloc(g_acc, huge, &p), KILN_E_NOMEM);
    CU_ASSERT_PTR_NULL(p);
    char num[32];
    snprintf(num, sizeof num, "%zu", huge);
    CU_ASSERT_PTR_NOT_NULL(strstr(mh.last_error, num));
    g_k->free(g_acc, NULL); /* a no-op */
}

static void test_copy_zero_sync(void) {
    float host[37], back[37];
    for (int i = 0; i < 37; i++) host[i] = val(i, 1);
    float *d1 = NULL, *d2 = NULL;
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, sizeof host, (void **)&d1), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(g_k->alloc(g_acc, sizeof host, (void **)&d2), KILN_OK);
    CU_ASSERT_EQUAL(g_k->copy(g_acc, d1, host, sizeof host, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(g_k->copy(g_acc, d2, d1, sizeof host, KILN_COPY_D2D), KILN_OK);
    memset(back, 0, sizeof back);
    CU_ASSERT_EQUAL(g_k->copy(g_acc, back, d2, sizeof host, KILN_COPY_D2H), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(back, host, sizeof host), 0);
    /* A partial copy touches only its bytes. */
    CU_ASSERT_EQUAL(g_k->copy(g_acc, d2 + 5, d1, 3 * sizeof(float), KILN_COPY_D2D), KILN_OK);
    CU_ASSERT_EQUAL(d2[4], host[4]);
    CU_ASSERT_EQUAL(d2[5], host[0]);
    CU_ASSERT_EQUAL(d2[7], host[2]);
    CU_ASSERT_EQUAL(d2[8], host[8]);
    CU_ASSERT_EQUAL(g_k->copy(g_acc, NULL, NULL, 0, KILN_COPY_H2D), KILN_OK);
    CU_ASSERT_EQUAL(g_k->copy(g_acc, d1, host, 4, 7), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(mh.last_error, "kind"));

    /* zero clears exactly the bytes asked for. */
    CU_ASSERT_EQUAL(g_k->zero(g_acc, d1 + 2, 10 * sizeof(float)), KILN_OK);
    for (int i = 0; i < 37; i++) CU_ASSERT_EQUAL(d1[i], (i >= 2 && i < 12) ? 0.0f : host[i]);
    CU_ASSERT_EQUAL(g_k->synchronize(g_acc), KILN_OK);
    g_k->free(g_acc, d1);
    g_k->free(g_acc, d2);
}

/* ------------------------------------------------------------------ GEMM */

/* C = alpha op(A) op(B) + beta C in double, from the stored layouts. */
static double ref_gemm_elem(int ta, int tb, int i, int j, int K, const float *A, int lda, const float *B, int ldb) {
    double s = 0.0;
    for (int k = 0; k < K; k++) {
        double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
        double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
        s += a * b;
    }
    return s;
}

static void check_gemm(int M, int N, int K, float alpha, float beta) {
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            /* Leading dimensions wider than the rows, to catch ld mix-ups. */
            int a_rows = ta ? K : M, a_cols = ta ? M : K;
            int b_rows = tb ? N : K, b_cols = tb ? K : N;
            int lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 2;
            float *A = calloc((size_t)a_rows * lda + 1, sizeof *A);
            float *B = calloc((size_t)b_rows * ldb + 1, sizeof *B);
            float *C = calloc((size_t)M * ldc + 1, sizeof *C);
            float *C0 = calloc((size_t)M * ldc + 1, sizeof *C0);
            for (int i = 0; i < a_rows * lda; i++) A[i] = val(i, 10 + ta);
            for (int i = 0; i < b_rows * ldb; i++) B[i] = val(i, 20 + tb);
            for (int i = 0; i < M * ldc; i++) C[i] = C0[i] = val(i, 30);
            CU_ASSERT_EQUAL_FATAL(g_k->gemm(g_acc, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), KILN_OK);
            int bad = 0;
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < ldc; j++) {
                    double got = C[(size_t)i * ldc + j];
                    double want = j < N ? alpha * ref_gemm_elem(ta, tb, i, j, K, A, lda, B, ldb) +
                                              beta * (double)C0[(size_t)i * ldc + j]
                                        : C0[(size_t)i * ldc + j]; /* padding untouched */
                    if (!close_to(got, want, 1e-5)) {
                        if (bad++ < 3)
                            fprintf(stderr, "gemm ta=%d tb=%d %dx%dx%d C[%d,%d] = %.8g, expected %.8g\n", ta, tb, M,
                                    N, K, i, j, got, want);
                    }
                }
            }
            CU_ASSERT_EQUAL(bad, 0);
            free(A);
            free(B);
            free(C);
            free(C0);
        }
    }
}

static void test_gemm(void) {
    check_gemm(3, 4, 5, 0.75f, -0.5f);
    check_gemm(37, 29, 41, 1.0f, 0.0f);
    check_gemm(64, 48, 96, -1.25f, 1.0f);

    /* beta == 0: C is not read, so NaN there disappears. */
    float A[2 * 3] = {1, 2, 3, 4, 5, 6}, B[3 * 2] = {1, 0, 0, 1, 1, 1}, C[4] = {NAN, NAN, NAN, NAN};
    CU_ASSERT_EQUAL(g_k->gemm(g_acc, 0, 0, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2), KILN_OK);
    CU_ASSERT_EQUAL(C[0], 4.0f);
    CU_ASSERT_EQUAL(C[1], 5.0f);
    CU_ASSERT_EQUAL(C[2], 10.0f);
    CU_ASSERT_EQUAL(C[3], 11.0f);

    /* Bad shapes are refused with a message, not handed to BLAS. */
    CU_ASSERT_EQUAL(g_k->gemm(g_acc, 0, 0, 2, 2, 3, 1.0f, A, 2, B, 2, 0.0f, C, 2), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(mh.last_error, "lda"));
    CU_ASSERT_EQUAL(g_k->gemm(g_acc, 0, 0, -1, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2), KILN_E_INVALID_ARG);
}

/* ------------------------------------------------------ bias, activations */

static void test_bias(void) {
    enum { R = 3, Cc = 4 };
    float y[R * Cc], y0[R * Cc], b[Cc], db[Cc];
    for (int i = 0; i < R * Cc; i++) y[i] = y0[i] = val(i, 40);
    for (int j = 0; j < Cc; j++) b[j] = val(j, 41);
    CU_ASSERT_EQUAL(g_k->bias_add(g_acc, y, b, R, Cc), KILN_OK);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < Cc; j++) CU_ASSERT_EQUAL(y[i * Cc + j], y0[i * Cc + j] + b[j]);

    for (int j = 0; j < Cc; j++) db[j] = 100.0f;
    CU_ASSERT_EQUAL(g_k->bias_grad(g_acc, db, y0, R, Cc, 0), KILN_OK);
    for (int j = 0; j < Cc; j++) {
        double s = 0;
        for (int i = 0; i < R; i++) s += y0[i * Cc + j];
        CU_ASSERT_TRUE(close_to(db[j], s, 1e-6));
    }
    CU_ASSERT_EQUAL(g_k->bias_grad(g_acc, db, y0, R, Cc, 1), KILN_OK); /* accumulate: doubles */
    for (int j = 0; j < Cc; j++) {
        double s = 0;
        for (int i = 0; i < R; i++) s += y0[i * Cc + j];
        CU_ASSERT_TRUE(close_to(db[j], 2 * s, 1e-6));
    }
}

static double gelu_ref(double x) {
    const double c = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}

static double gelu_grad_ref(double x) {
    const double c = sqrt(2.0 / 3.14159265358979323846);
    double t = tanh(c * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

static void test_activations(void) {
    enum { N = 101 };
    float x[N], y[N], dy[N], dx[N];
    for (int i = 0; i < N; i++) {
        x[i] = -6.0f + 12.0f * (float)i / (N - 1); /* includes 0 at i = 50 */
        dy[i] = val(i, 50);
    }
    CU_ASSERT_EQUAL(g_k->relu_forward(g_acc, y, x, N), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(y[i], x[i] > 0 ? x[i] : 0.0f);
    CU_ASSERT_EQUAL(g_k->relu_backward(g_acc, dx, dy, x, N), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(dx[i], x[i] > 0 ? dy[i] : 0.0f);

    CU_ASSERT_EQUAL(g_k->gelu_forward(g_acc, y, x, N), KILN_OK);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += !close_to(y[i], gelu_ref(x[i]), 2e-6);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(g_k->gelu_backward(g_acc, dx, dy, x, N), KILN_OK);
    bad = 0;
    for (int i = 0; i < N; i++) bad += !close_to(dx[i], dy[i] * gelu_grad_ref(x[i]), 2e-6);
    CU_ASSERT_EQUAL(bad, 0);
}

/* ------------------------------------------------------------------- loss */

static void test_softmax_xent(void) {
    enum { B = 4, C = 5 };
    float logits[B * C], probs[B * C], dl[B * C];
    int32_t labels[B] = {0, 3, 4, 2};
    for (int i = 0; i < B * C; i++) logits[i] = 3.0f * val(i, 60);
    logits[1 * C + 3] = 5.0f; /* row 1 predicts its label */
    float loss = 0;
    int32_t correct = -1;
    CU_ASSERT_EQUAL_FATAL(g_k->softmax_xent_forward(g_acc, probs, logits, labels, B, C, &loss, &correct), KILN_OK);
    double want_loss = 0;
    int want_correct = 0;
    for (int b = 0; b < B; b++) {
        const float *l = logits + b * C;
        double mx = l[0], z = 0;
        int arg = 0;
        for (int j = 1; j < C; j++)
            if (l[j] > mx) mx = l[j], arg = j;
        for (int j = 0; j < C; j++) z += exp(l[j] - mx);
        for (int j = 0; j < C; j++) CU_ASSERT_TRUE(close_to(probs[b * C + j], exp(l[j] - mx) / z, 1e-6));
        want_loss += -(l[labels[b]] - mx - log(z));
        want_correct += arg == labels[b];
    }
    want_loss /= B;
    CU_ASSERT_TRUE(close_to(loss, want_loss, 1e-6));
    CU_ASSERT_EQUAL(correct, want_correct);
    CU_ASSERT_TRUE(want_correct >= 1);
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, probs, logits, labels, B, C, &loss, NULL), KILN_OK);

    const float dloss = 0.5f;
    CU_ASSERT_EQUAL(g_k->softmax_xent_backward(g_acc, dl, probs, labels, B, C, dloss), KILN_OK);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < C; j++) {
            double want = dloss * ((double)probs[b * C + j] - (j == labels[b])) / B;
            CU_ASSERT_TRUE(close_to(dl[b * C + j], want, 1e-6));
        }

    /* A label outside [0, C): KILN_E_DATA, naming the row and the value. */
    int32_t bad[B] = {0, 7, 1, 2};
    mh.last_error[0] = 0;
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, probs, logits, bad, B, C, &loss, &correct), KILN_E_DATA);
    CU_ASSERT_EQUAL(mh.last_error_code, KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(mh.last_error, "label 7"));
    CU_ASSERT_PTR_NOT_NULL(strstr(mh.last_error, "index 1"));
    int32_t neg[B] = {0, 1, -1, 2};
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, probs, logits, neg, B, C, &loss, NULL), KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(mh.last_error, "label -1"));
    CU_ASSERT_PTR_NOT_NULL(strstr(mh.last_error, "index 2"));
    CU_ASSERT_EQUAL(g_k->softmax_xent_backward(g_acc, dl, probs, bad, B, C, 1.0f), KILN_E_DATA);
    CU_ASSERT_PTR_NOT_NULL(strstr(mh.last_error, "label 7"));

    /* A NaN logit with valid labels is a NaN loss, not a data error. */
    logits[2] = NAN;
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, probs, logits, labels, B, C, &loss, NULL), KILN_OK);
    CU_ASSERT_TRUE(isnan(loss));
    CU_ASSERT_EQUAL(g_k->softmax_xent_forward(g_acc, probs, logits, labels, 0, C, &loss, NULL), KILN_E_INVALID_ARG);
}

/* ---------------------------------------------------- reductions, BLAS-1 */

static void test_reductions(void) {
    enum { N = 1000 };
    float x[N], y[N], y0[N];
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) {
        x[i] = val(i, 70);
        y[i] = y0[i] = val(i, 71);
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    double out = 0;
    CU_ASSERT_EQUAL(g_k->sum(g_acc, x, N, &out), KILN_OK);
    CU_ASSERT_TRUE(close_to(out, s, 1e-12));
    CU_ASSERT_EQUAL(g_k->sumsq(g_acc, x, N, &out), KILN_OK);
    CU_ASSERT_TRUE(close_to(out, s2, 1e-12));

    CU_ASSERT_EQUAL(g_k->axpy(g_acc, y, -0.25f, x, N), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_TRUE(close_to(y[i], y0[i] + -0.25 * x[i], 1e-7));
    CU_ASSERT_EQUAL(g_k->scale(g_acc, y0, 3.0f, N), KILN_OK);
    for (int i = 0; i < N; i++) CU_ASSERT_EQUAL(y0[i], 3.0f * val(i, 71));

    int32_t fin = -1;
    CU_ASSERT_EQUAL(g_k->all_finite(g_acc, x, N, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 1);
    const float specials[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        float keep = x[N - 7];
        x[N - 7] = specials[k];
        fin = -1;
        CU_ASSERT_EQUAL(g_k->all_finite(g_acc, x, N, &fin), KILN_OK);
        CU_ASSERT_EQUAL(fin, 0);
        x[N - 7] = keep;
    }
    fin = -1;
    CU_ASSERT_EQUAL(g_k->all_finite(g_acc, NULL, 0, &fin), KILN_OK);
    CU_ASSERT_EQUAL(fin, 1);
}

/* -------------------------------------------------------------- optimizers */

static void test_optimizer_kernels(void) {
    enum { N = 9 };
    float p[N], g[N], buf[N];
    double rp[N], rb[N];
    const float lr = 0.1f, mom = 0.9f, wd = 0.01f;
    for (int i = 0; i < N; i++) {
        p[i] = val(i, 80);
        g[i] = val(i, 81);
        rp[i] = p[i];
    }
    /* Two Nesterov steps with weight decay, from torch.optim.SGD's rules. */
    for (int step = 0; step < 2; step++) {
        CU_ASSERT_EQUAL(g_k->sgd_update(g_acc, p, g, buf, N, lr, mom, 0.0f, 1, wd, step == 0), KILN_OK);
        for (int i = 0; i < N; i++) {
            double d = g[i] + (double)wd * rp[i];
            rb[i] = step == 0 ? d : (double)mom * rb[i] + d;
            d = d + (double)mom * rb[i];
            rp[i] -= (double)lr * d;
            CU_ASSERT_TRUE(close_to(p[i], rp[i], 1e-6));
            CU_ASSERT_TRUE(close_to(buf[i], rb[i], 1e-6));
        }
    }
    CU_ASSERT_EQUAL(g_k->sgd_update(g_acc, p, g, NULL, N, lr, mom, 0.0f, 0, 0.0f, 1), KILN_E_INVALID_ARG);

    /* Two AdamW steps, from torch.optim.AdamW's rules. */
    float m[N] = {0}, v[N] = {0};
    double rm[N] = {0}, rv[N] = {0};
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    for (int i = 0; i < N; i++) rp[i] = p[i];
    for (int step = 1; step <= 2; step++) {
        CU_ASSERT_EQUAL(g_k->adamw_update(g_acc, p, g, m, v, N, lr, b1, b2, eps, wd, step), KILN_OK);
        for (int i = 0; i < N; i++) {
            rp[i] *= 1.0 - (double)lr * wd;
            rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1.0 - b2) * (double)g[i] * g[i];
            double mhat = rm[i] / (1.0 - pow(b1, step)), vh = rv[i] / (1.0 - pow(b2, step));
            rp[i] -= (double)lr * mhat / (sqrt(vh) + eps);
            CU_ASSERT_TRUE(close_to(p[i], rp[i], 1e-6));
            CU_ASSERT_TRUE(close_to(m[i], rm[i], 1e-6));
            CU_ASSERT_TRUE(close_to(v[i], rv[i], 1e-6));
        }
    }
    CU_ASSERT_EQUAL(g_k->adamw_update(g_acc, p, g, m, v, N, lr, b1, b2, eps, wd, 0), KILN_E_INVALID_ARG);
}

/* -------------------------------------------------------------- configure */

static void test_configure(void) {
    /* Large enough that the kernels split the loops across the pool. */
    enum { N = 1 << 18 };
    float *x = malloc(N * sizeof *x), *y1 = malloc(N * sizeof *y1), *yn = malloc(N * sizeof *yn);
    CU_ASSERT_PTR_NOT_NULL_FATAL(x);
    CU_ASSERT_PTR_NOT_NULL_FATAL(y1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(yn);
    for (int i = 0; i < N; i++) x[i] = 4.0f * val(i, 90);
    double s1, sn;
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 1, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_k->gelu_forward(g_acc, y1, x, N), KILN_OK);
    CU_ASSERT_EQUAL(g_k->sum(g_acc, x, N, &s1), KILN_OK);
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 3, 0), KILN_OK);
    CU_ASSERT_EQUAL(g_k->gelu_forward(g_acc, yn, x, N), KILN_OK);
    CU_ASSERT_EQUAL(g_k->sum(g_acc, x, N, &sn), KILN_OK);
    /* The thread split never changes a bit. */
    CU_ASSERT_EQUAL(memcmp(y1, yn, N * sizeof *y1), 0);
    CU_ASSERT_EQUAL(s1, sn);
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 0, 0), KILN_OK); /* all CPUs */
    CU_ASSERT_EQUAL(g_k->gelu_forward(g_acc, yn, x, N), KILN_OK);
    CU_ASSERT_EQUAL(memcmp(y1, yn, N * sizeof *y1), 0);
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, -1, 0), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(mh.last_error, "threads"));
    CU_ASSERT_EQUAL(g_ops->configure(g_acc, 1, 0), KILN_OK);
    free(x);
    free(y1);
    free(yn);
}

static void register_tests(void) {
    CU_pSuite s = CU_add_suite("cpu_accel", suite_init, suite_clean);
    CU_add_test(s, "descriptor and kernel table", test_descriptor);
    CU_add_test(s, "alloc: aligned, zeroed, NOMEM", test_alloc);
    CU_add_test(s, "copy, zero, synchronize", test_copy_zero_sync);
    CU_add_test(s, "gemm: four transposes vs naive", test_gemm);
    CU_add_test(s, "bias_add, bias_grad", test_bias);
    CU_add_test(s, "relu, gelu forward/backward", test_activations);
    CU_add_test(s, "softmax_xent and bad labels", test_softmax_xent);
    CU_add_test(s, "sum, sumsq, scale, axpy, all_finite", test_reductions);
    CU_add_test(s, "sgd_update, adamw_update", test_optimizer_kernels);
    CU_add_test(s, "configure threads", test_configure);
}

#include "cunit_main.h"
