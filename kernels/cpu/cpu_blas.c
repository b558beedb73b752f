/*
 * cpu_blas.c: which BLAS library computes the kernels' GEMMs. Every GEMM of
 * kernels/cpu goes through kc_blas_sgemm / kc_blas_dgemm, which have
 * cblas_sgemm's and cblas_dgemm's signatures and call either OpenBLAS (linked
 * in; the default) or BLIS, loaded at run time by kc_blas_use_blis().
 *
 * Why two: Debian 12's OpenBLAS (0.3.21) picks its kernels from the CPU's
 * model number and, on a CPU newer than itself, falls back to its generic
 * "Prescott" SSE3 kernels even when the CPU has AVX2 or AVX-512: 15-28
 * GFLOP/s on one core of the machine docs/benchmarks.md reports, where BLIS
 * (Debian's libblis4-serial, 0.9.0), which picks its kernels from the CPU's
 * feature flags, reaches ~60. BLIS is reached through its native typed API
 * (bli_sgemm / bli_dgemm): those names exist in BLIS alone, so a program
 * that also has OpenBLAS's cblas_* and sgemm_ in its global scope (the test
 * executables link the kernels statically) cannot divert BLIS's internal
 * calls to OpenBLAS, and no RTLD_DEEPBIND (which the sanitizers refuse) is
 * needed. The serial BLIS build is loaded: kiln's own pool does the
 * threading, one BLAS thread per call, as with OpenBLAS.
 *
 * The choice is process-wide and made once, before the first GEMM (the cpu
 * accelerator's create()); switching while a GEMM runs is not supported.
 */
#define _GNU_SOURCE /* dlopen flags */
#include "cpu_internal.h"
#include "cpu_kernels.h"

#include <dlfcn.h>
#include <stdio.h>

#include <cblas.h>

/* BLIS's typed gemm: trans_t is an enum (0: no transpose, 8: transpose),
 * dim_t and inc_t are int64_t on 64-bit targets (BLIS's default there,
 * which Debian's libblis4 packages keep). */
typedef void (*kc_bli_sgemm_fn)(int transa, int transb, int64_t m, int64_t n, int64_t k, const float *alpha,
                                const float *a, int64_t rs_a, int64_t cs_a, const float *b, int64_t rs_b, int64_t cs_b,
                                const float *beta, float *c, int64_t rs_c, int64_t cs_c);
typedef void (*kc_bli_dgemm_fn)(int transa, int transb, int64_t m, int64_t n, int64_t k, const double *alpha,
                                const double *a, int64_t rs_a, int64_t cs_a, const double *b, int64_t rs_b,
                                int64_t cs_b, const double *beta, double *c, int64_t rs_c, int64_t cs_c);
enum { KC_BLI_NO_TRANSPOSE = 0, KC_BLI_TRANSPOSE = 8 };

static kc_bli_sgemm_fn kc_bli_sgemm;
static kc_bli_dgemm_fn kc_bli_dgemm;
static char kc_blas_desc[128] = "OpenBLAS";

/* Where Debian installs the serial BLIS, then whatever the loader finds. */
static const char *const kc_blis_paths[] = {
    "/usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4",
    "/usr/lib/aarch64-linux-gnu/blis-serial/libblis.so.4",
    "libblis.so.4",
};

int kc_blas_use_blis(char *err, size_t errlen) {
    if (kc_bli_sgemm) return 0;
    void *h = NULL;
    const char *path = NULL;
    for (size_t i = 0; i < sizeof kc_blis_paths / sizeof *kc_blis_paths && !h; i++) {
        path = kc_blis_paths[i];
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        if (err) snprintf(err, errlen, "cannot load BLIS (%s; install libblis4-serial)", dlerror());
        return -1;
    }
    kc_bli_sgemm_fn s = (kc_bli_sgemm_fn)(uintptr_t)dlsym(h, "bli_sgemm");
    kc_bli_dgemm_fn d = (kc_bli_dgemm_fn)(uintptr_t)dlsym(h, "bli_dgemm");
    const char *(*version)(void) = (const char *(*)(void))(uintptr_t)dlsym(h, "bli_info_get_version_str");
    const char *(*arch_str)(int) = (const char *(*)(int))(uintptr_t)dlsym(h, "bli_arch_string");
    int (*arch_id)(void) = (int (*)(void))(uintptr_t)dlsym(h, "bli_arch_query_id");
    if (!s || !d) {
        if (err) snprintf(err, errlen, "%s has no bli_sgemm/bli_dgemm", path);
        dlclose(h);
        return -1;
    }
    snprintf(kc_blas_desc, sizeof kc_blas_desc, "BLIS %s (%s kernels)", version ? version() : "?",
             arch_str && arch_id ? arch_str(arch_id()) : "?");
    /* never dlclose'd: the pointers stay valid for the process */
    kc_bli_dgemm = d;
    kc_bli_sgemm = s;
    return 0;
}

const char *kc_blas_name(void) { return kc_blas_desc; }

/* Row-major op(A)(M, K): stored (M, K) with leading dimension lda, or (K, M)
 * when transposed; BLIS takes the stored matrix with its strides and a
 * transpose flag, as cblas does. One body for both precisions: NAME over
 * the element type T, cblas' CBLAS_FN or (when loaded) BLIS' BLI_FN. kiln
 * only calls row-major, so `order` goes to cblas alone. */
#define KC_BLAS_GEMM(NAME, T, CBLAS_FN, BLI_FN)                                                                 \
    void NAME(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,         \
              const blasint M, const blasint N, const blasint K, const T alpha, const T *A, const blasint lda,    \
              const T *B, const blasint ldb, const T beta, T *C, const blasint ldc) {                             \
        if (!BLI_FN) {                                                                                          \
            CBLAS_FN(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);                              \
            return;                                                                                             \
        }                                                                                                       \
        BLI_FN(ta == CblasTrans ? KC_BLI_TRANSPOSE : KC_BLI_NO_TRANSPOSE,                                       \
               tb == CblasTrans ? KC_BLI_TRANSPOSE : KC_BLI_NO_TRANSPOSE, M, N, K, &alpha, A, lda, 1, B, ldb, 1,  \
               &beta, C, ldc, 1);                                                                               \
    }

KC_BLAS_GEMM(kc_blas_sgemm, float, cblas_sgemm, kc_bli_sgemm)
KC_BLAS_GEMM(kc_blas_dgemm, double, cblas_dgemm, kc_bli_dgemm)
