/*
 * cpu_internal.h: what the kernel source files share and the public header
 * does not expose: the parallel-for entry point of the thread pool
 * (cpu_threads.c), the grain sizes that decide when splitting a loop pays for
 * the wake-up of a sleeping worker, the block decomposition that keeps
 * threaded reductions bit-identical to serial ones, an inlined,
 * vectorizable exp used by GELU, the scalar float16 / bfloat16 conversions
 * and the strided-matrix conversion that cpu_dtype.c and cpu_gemm_ex.c
 * share. Everything here is an implementation detail of kernels/cpu and may
 * change without notice.
 */
#ifndef KILN_KERNELS_CPU_INTERNAL_H
#define KILN_KERNELS_CPU_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* exp, GELU, tanh and sigmoid in float32, shared with the cuda kernels */
#include "../common/km_act.h"

#include <cblas.h>

/* Every GEMM of the kernels: cblas_sgemm / cblas_dgemm's contract, computed
 * by the BLAS kc_blas_use_blis() selected (OpenBLAS by default; see
 * cpu_blas.c). Only CblasRowMajor is supported. */
void kc_blas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                   const blasint M, const blasint N, const blasint K, const float alpha, const float *A,
                   const blasint lda, const float *B, const blasint ldb, const float beta, float *C,
                   const blasint ldc);
void kc_blas_dgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                   const blasint M, const blasint N, const blasint K, const double alpha, const double *A,
                   const blasint lda, const double *B, const blasint ldb, const double beta, double *C,
                   const blasint ldc);

/* The pool never grows beyond this many threads (caller included). */
#define KC_MAX_THREADS 64

/*
 * Minimum elements per thread before a loop is split. Waking a worker that
 * sleeps on a condition variable costs 5-30 us on bare metal and 40-70 us on
 * a virtual machine whose idle vCPU halts (measured on the 2-vCPU machine of
 * docs/benchmarks.md: a ReLU over 128x1024 floats took 19 us serially and
 * 70 us split in two, 262144 floats 47 us vs 96 us; the split only wins from
 * ~512K floats). A streaming loop over 256K floats takes about that long,
 * so below it splitting loses. The optimizer updates and GELU do several
 * times more work per element (AdamW: a sqrt and two divisions), so they
 * split earlier.
 */
#define KC_GRAIN_STREAM ((size_t)1 << 18)
#define KC_GRAIN_HEAVY ((size_t)1 << 16)

/*
 * A range body: processes elements [begin, end) of a loop whose state is in
 * ctx. It must touch only the outputs of its own range, so that any split
 * produces the same bits as the serial loop.
 */
typedef void (*kc_range_fn)(void *ctx, size_t begin, size_t end);

/*
 * Runs fn over [0, n): serially (fn(ctx, 0, n)) when the pool has one thread,
 * when n < 2 * grain, when another thread is already using the pool, or when
 * called from inside a range body; otherwise split into contiguous parts of
 * at least grain units, the caller running the first part. Part boundaries
 * are multiples of align (KC_ALIGN_FLOATS when a unit is one float, so
 * outputs of different threads never share a cache line). Returns when every
 * part is done.
 */
void kc_parallel_for(size_t n, size_t grain, size_t align, kc_range_fn fn, void *ctx);

/* 16 floats: one 64-byte cache line. */
#define KC_ALIGN_FLOATS ((size_t)16)

/*
 * Reductions are computed as per-block partial sums combined in block order.
 * The block size depends on n only (never on the thread count), so any number
 * of threads reproduces the serial result bit for bit. At most
 * KC_RED_MAX_BLOCKS blocks keep the partials on the stack.
 */
#define KC_RED_MIN_BLOCK ((size_t)1 << 14)
#define KC_RED_MAX_BLOCKS 256

static inline size_t kc_red_block_size(size_t n) {
    size_t bs = (n + KC_RED_MAX_BLOCKS - 1) / KC_RED_MAX_BLOCKS;
    if (bs < KC_RED_MIN_BLOCK) bs = KC_RED_MIN_BLOCK;
    return (bs + 15) & ~(size_t)15;
}


#define KC_ALWAYS_INLINE inline __attribute__((always_inline))

/*
 * AVX2 dispatch for compute-bound loops (GELU, AdamW: division/sqrt
 * throughput, not memory, bounds them) and for the loops of a step whose data
 * sits in cache (SGD, ReLU, bias add and gradient: with a small model these
 * are most of the per-step time outside the GEMMs, and 4-wide SSE2 ran at
 * half of what the cache delivers). KC_DISPATCHED_RANGE(name) expects a
 * `static KC_ALWAYS_INLINE void name##_impl(void *, size_t, size_t)` range
 * body and defines name##_pick(), which returns a copy of it compiled for
 * AVX2 when the CPU has AVX2 (8-wide vectors) and the baseline SSE2 copy
 * otherwise, so one portable binary uses the wider vectors where it can.
 * Both copies do the same IEEE operations in the same order (no FMA:
 * -ffp-contract=off), so results are identical whichever runs. The choice is
 * made at call time with __builtin_cpu_supports rather than with GCC's
 * target_clones, whose ifunc resolver runs during relocation, before a
 * sanitizer runtime is initialised (ThreadSanitizer crashes on it).
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(KC_NO_AVX2_DISPATCH)
static inline int kc_cpu_has_avx2(void) {
    __builtin_cpu_init(); /* idempotent; needed if called before constructors */
    return __builtin_cpu_supports("avx2");
}
#define KC_DISPATCHED_RANGE(name)                                                  \
    __attribute__((target("avx2"))) static void name##_avx2(void *c, size_t a,     \
                                                            size_t b) {            \
        name##_impl(c, a, b);                                                      \
    }                                                                              \
    static void name##_base(void *c, size_t a, size_t b) { name##_impl(c, a, b); } \
    static kc_range_fn name##_pick(void) {                                         \
        return kc_cpu_has_avx2() ? name##_avx2 : name##_base;                      \
    }
#else
#define KC_DISPATCHED_RANGE(name)                                                  \
    static void name##_base(void *c, size_t a, size_t b) { name##_impl(c, a, b); } \
    static kc_range_fn name##_pick(void) { return name##_base; }
#endif

/*
 * Flush-to-zero scope for the optimizer updates. Optimizer state decays
 * geometrically wherever a gradient is exactly zero (a dead ReLU unit, an
 * input pixel that is 0 in the whole batch): Adam's m shrinks by beta1 per
 * step and reaches the subnormal range (below 2^-126, 1.2e-38) after a few
 * hundred steps, then stays there for ~150 more. Every x86 instruction that
 * reads or produces a subnormal takes a microcode assist of a few hundred
 * cycles, and in the reference MLP at lr 0.01 (AdamW) four fifths of the
 * 1024x1024 layer's m was subnormal from step ~750 on: the update went from
 * 1.3 ms to ~10 ms per step. Inside a range body of an optimizer update,
 * kc_ftz_begin sets MXCSR's FTZ (subnormal results become 0) and DAZ
 * (subnormal inputs read as 0), and kc_ftz_end restores the caller's MXCSR,
 * on every thread that runs a part. This is torch.set_flush_denormal(True)
 * (and TensorFlow's default) for the update alone: values that differ from
 * the IEEE result are below 2^-126 in magnitude, i.e. a subnormal m, v or
 * momentum becomes 0 (its effect on a parameter, step * m / den, is below
 * half an ulp of any parameter larger than ~1e-25 in magnitude). Every
 * other kernel keeps IEEE gradual underflow. No-op off x86-64.
 */
/* kc_set_flush_denormal (cpu_train_f32.c); 1 unless a caller turned it off */
extern int kc_flush_denormal_on;
#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#define KC_MXCSR_FTZ_DAZ 0x8040u /* bit 15 FTZ, bit 6 DAZ */
static inline unsigned int kc_ftz_begin(void) {
    const unsigned int old = _mm_getcsr();
    if (kc_flush_denormal_on) _mm_setcsr(old | KC_MXCSR_FTZ_DAZ);
    return old;
}
static inline void kc_ftz_end(unsigned int old) { _mm_setcsr(old); }
#else
static inline unsigned int kc_ftz_begin(void) { return 0; }
static inline void kc_ftz_end(unsigned int old) { (void)old; }
#endif

/* ------------------------------------------------ 16-bit float formats */

/*
 * float16 in integer arithmetic, for compilers without _Float16 (clang
 * before 15 on x86-64, Debian 12's clang 14 among them) and as the
 * reference the tests hold the compiler's conversion to.
 *
 * double -> float16 bits with one rounding to nearest even: overflow
 * (65520 and up) to inf, subnormals kept, NaN quiet with its top payload
 * bits. A float converts through it exactly (every float is a double).
 */
static KC_ALWAYS_INLINE uint16_t kc_f16_bits_soft(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 48) & 0x8000u);
    const uint64_t a = u & 0x7fffffffffffffffull;
    if (a > 0x7ff0000000000000ull) return (uint16_t)(sign | 0x7e00u | ((a >> 42) & 0x3ffu)); /* NaN */
    if (a >= 0x40effe0000000000ull) return (uint16_t)(sign | 0x7c00u);                      /* >= 65520: inf */
    if (a >= 0x3f10000000000000ull) { /* >= 2^-14: a normal half; rebias 1023 -> 15, keep 10 bits */
        const uint64_t r = a - ((uint64_t)(1023 - 15) << 52);
        return (uint16_t)(sign | ((r + 0x1ffffffffffull + ((r >> 42) & 1u)) >> 42));
    }
    if (a <= 0x3e60000000000000ull) return sign; /* <= 2^-25 (which ties to 0): zero */
    /* a subnormal half: the value in units of 2^-24, rounded to even (a
     * carry into 1024 is the smallest normal's pattern, as it should be) */
    const unsigned shift = (unsigned)(1051u - (unsigned)(a >> 52)); /* 43..53 */
    const uint64_t m = (a & 0xfffffffffffffull) | (1ull << 52);
    const uint64_t rem = m & ((1ull << shift) - 1u), half = 1ull << (shift - 1u);
    uint64_t q = m >> shift;
    q += rem > half || (rem == half && (q & 1u));
    return (uint16_t)(sign | q);
}

/* float16 bits -> float (exact; a NaN comes back quiet, as F16C's does). */
static KC_ALWAYS_INLINE float kc_f16_value_soft(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    uint32_t u;
    if (e == 31u)
        u = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
    else if (e)
        u = sign | ((e + 112u) << 23) | (m << 13);
    else { /* zero or subnormal: m * 2^-24, a normal float (exact) */
        const float f = (float)m * 0x1p-24f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The conversions the kernels use: the compiler's _Float16 (F16C or
 * libgcc) where it has one, else the integer ones above; the same bits
 * either way (test_kernels_dtype compares them). */
#if defined(__FLT16_MAX__) && !defined(KC_SOFT_F16)
#define KC_HAVE_FLOAT16 1
/* float -> float16 bits, round to nearest even, overflow to inf, subnormals
 * kept, NaN quiet. */
static KC_ALWAYS_INLINE uint16_t kc_f16_bits(float x) {
    const _Float16 h = (_Float16)x;
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}
/* double -> float16 bits, one rounding (libgcc's __truncdfhf2). */
static KC_ALWAYS_INLINE uint16_t kc_f16_bits_f64(double x) {
    const _Float16 h = (_Float16)x;
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}
/* float16 bits -> float (exact). */
static KC_ALWAYS_INLINE float kc_f16_value(uint16_t u) {
    _Float16 h;
    memcpy(&h, &u, sizeof h);
    return (float)h;
}
#else
#define KC_HAVE_FLOAT16 0
static KC_ALWAYS_INLINE uint16_t kc_f16_bits(float x) { return kc_f16_bits_soft((double)x); }
static KC_ALWAYS_INLINE uint16_t kc_f16_bits_f64(double x) { return kc_f16_bits_soft(x); }
static KC_ALWAYS_INLINE float kc_f16_value(uint16_t u) { return kc_f16_value_soft(u); }
#endif

/*
 * float -> bfloat16 bits, round to nearest even: adding 0x7fff plus the
 * lowest kept bit carries into the kept half exactly when the dropped half
 * is above the midpoint, or at it with an odd kept half. Finite values past
 * the largest bfloat16 (3.3895e38) round up into the inf pattern, as IEEE
 * rounding does. NaN is handled apart, because the carry could turn a NaN
 * whose payload lives in the dropped half into inf: it keeps its sign and
 * top payload bits and gets the quiet bit.
 */
static KC_ALWAYS_INLINE uint16_t kc_bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t quiet_nan = (u >> 16) | 0x0040u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* bfloat16 bits -> float (exact: the bits are the top half). */
static KC_ALWAYS_INLINE float kc_bf16_value(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/*
 * Rows of a (rows, cols) matrix converted between KC_* dtypes (cpu_dtype.c):
 * dst row r at dst + r * dst_ld elements, src row r at src + r * src_ld,
 * split across the pool by rows (by elements when both are contiguous).
 * op is KC_CAST (dst_dtype <- src_dtype) or one of the in-place float32
 * roundings (dst == src, both float32). Used by kc_gemm_ex to widen its
 * operands and round its product.
 */
enum { KC_CAST = 0, KC_ROUND_F16 = 1, KC_ROUND_BF16 = 2 };
void kc_cast_rows(int op, void *dst, int dst_dtype, size_t dst_ld, const void *src, int src_dtype,
                  size_t src_ld, size_t rows, size_t cols);

#endif
