/*
 * cpu_dtype.c: conversions between the floating-point storage formats of
 * mixed-precision training (float32, float64, and the two 16-bit formats
 * float16 and bfloat16, stored as uint16_t bit patterns), and the in-place
 * "round through" of float32 arrays that emulates reduced-precision storage
 * on a CPU that computes in float32. Every narrowing conversion rounds to
 * nearest-even exactly once, so results match what a GPU's conversion
 * instructions (and PyTorch's .to()) give: fp16 overflow becomes inf, which
 * is what makes loss-scale skipping behave as on a GPU. float16 goes through
 * the compiler's _Float16 (integer arithmetic where the compiler has none,
 * cpu_internal.h); on CPUs with F16C the loops are compiled a second
 * time for AVX2+F16C (hardware conversions) and picked at call time, with
 * identical bits either way. bfloat16 is rounded by integer arithmetic on the
 * float32 bits (cpu_internal.h). Loops split across the pool by elements or,
 * for strided matrices (kc_gemm_ex's operands), by rows; each element is
 * converted by the same code on any thread, so the split changes nothing.
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"

#include <math.h>

size_t kc_dtype_bytes(int dtype) {
    switch (dtype) {
    case KC_F32: return 4;
    case KC_F64: return 8;
    case KC_F16: case KC_BF16: return 2;
    default: return 0;
    }
}

/*
 * double -> bfloat16 bits with one rounding. Converting to float first and
 * then to bfloat16 would round twice (1 + 2^-8 + 2^-30 would become the tie
 * 1 + 2^-8 and then 1.0, instead of 1 + 2^-7). So the float step rounds to
 * odd instead: truncate toward zero and set the lowest bit when anything was
 * dropped. float keeps at least 16 more bits than bfloat16 at every
 * magnitude (their exponent ranges are equal), so the sticky bit then decides
 * the bfloat16 tie correctly. Values beyond float's range truncate to
 * +-FLT_MAX (odd), which bfloat16 rounding sends to +-inf, as it should.
 */
static KC_ALWAYS_INLINE uint16_t kc_bf16_bits_f64(double d) {
    float f = (float)d;
    if (d == d && (double)f != d) { /* inexact and not NaN */
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        if (fabs((double)f) > fabs(d)) u -= 1u; /* magnitude one ulp down: truncation */
        u |= 1u;
        memcpy(&f, &u, sizeof f);
    }
    return kc_bf16_bits(f);
}

/* ------------------------------------------------------ element loops */

/* One loop per (dst, src) pair, over restrict pointers so each vectorizes
 * where its conversion allows. n elements each. */
#define KC_CAST_LOOP(name, DT, ST, EXPR)                                                   \
    static KC_ALWAYS_INLINE void name(DT *restrict d, const ST *restrict s, size_t n) {    \
        for (size_t i = 0; i < n; i++) d[i] = (EXPR);                                      \
    }
KC_CAST_LOOP(kc_loop_f32_f16, uint16_t, float, kc_f16_bits(s[i]))
KC_CAST_LOOP(kc_loop_f16_f32, float, uint16_t, kc_f16_value(s[i]))
KC_CAST_LOOP(kc_loop_f32_bf16, uint16_t, float, kc_bf16_bits(s[i]))
KC_CAST_LOOP(kc_loop_bf16_f32, float, uint16_t, kc_bf16_value(s[i]))
KC_CAST_LOOP(kc_loop_f32_f64, double, float, (double)s[i])
KC_CAST_LOOP(kc_loop_f64_f32, float, double, (float)s[i])
KC_CAST_LOOP(kc_loop_f16_f64, double, uint16_t, (double)kc_f16_value(s[i]))
KC_CAST_LOOP(kc_loop_bf16_f64, double, uint16_t, (double)kc_bf16_value(s[i]))
KC_CAST_LOOP(kc_loop_f64_bf16, uint16_t, double, kc_bf16_bits_f64(s[i]))
/* float16 and bfloat16 values are exact in float, so these round once. */
KC_CAST_LOOP(kc_loop_bf16_f16, uint16_t, uint16_t, kc_f16_bits(kc_bf16_value(s[i])))
KC_CAST_LOOP(kc_loop_f16_bf16, uint16_t, uint16_t, kc_bf16_bits(kc_f16_value(s[i])))
#undef KC_CAST_LOOP

/* double -> float16 directly (one rounding; there is no hardware
 * instruction for it). */
static KC_ALWAYS_INLINE void kc_loop_f64_f16(uint16_t *restrict d, const double *restrict s, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = kc_f16_bits_f64(s[i]);
}

static KC_ALWAYS_INLINE void kc_loop_round_f16(float *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = kc_f16_value(kc_f16_bits(x[i]));
}
static KC_ALWAYS_INLINE void kc_loop_round_bf16(float *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = kc_bf16_value(kc_bf16_bits(x[i]));
}

/* What one span converts: the op and, for KC_CAST, the dtype pair. */
typedef struct {
    int op;     /* KC_CAST, KC_ROUND_F16, KC_ROUND_BF16 */
    int dt, st; /* dst, src dtype */
} kc_cast_kind;

#define KC_PAIR(d, s) ((d) * 8 + (s))

/* n elements from s to d. Equal dtypes never reach here (kc_cast_rows
 * copies those), nor unknown ones (rejected by the public entries). */
static KC_ALWAYS_INLINE void kc_cast_span_impl(const kc_cast_kind *k, void *d, const void *s, size_t n) {
    if (k->op == KC_ROUND_F16) {
        kc_loop_round_f16(d, n);
        return;
    }
    if (k->op == KC_ROUND_BF16) {
        kc_loop_round_bf16(d, n);
        return;
    }
    switch (KC_PAIR(k->dt, k->st)) {
    case KC_PAIR(KC_F16, KC_F32): kc_loop_f32_f16(d, s, n); break;
    case KC_PAIR(KC_F32, KC_F16): kc_loop_f16_f32(d, s, n); break;
    case KC_PAIR(KC_BF16, KC_F32): kc_loop_f32_bf16(d, s, n); break;
    case KC_PAIR(KC_F32, KC_BF16): kc_loop_bf16_f32(d, s, n); break;
    case KC_PAIR(KC_F64, KC_F32): kc_loop_f32_f64(d, s, n); break;
    case KC_PAIR(KC_F32, KC_F64): kc_loop_f64_f32(d, s, n); break;
    case KC_PAIR(KC_F64, KC_F16): kc_loop_f16_f64(d, s, n); break;
    case KC_PAIR(KC_F16, KC_F64): kc_loop_f64_f16(d, s, n); break;
    case KC_PAIR(KC_F64, KC_BF16): kc_loop_bf16_f64(d, s, n); break;
    case KC_PAIR(KC_BF16, KC_F64): kc_loop_f64_bf16(d, s, n); break;
    case KC_PAIR(KC_F16, KC_BF16): kc_loop_bf16_f16(d, s, n); break;
    case KC_PAIR(KC_BF16, KC_F16): kc_loop_f16_bf16(d, s, n); break;
    default: break;
    }
}

typedef void (*kc_span_fn)(const kc_cast_kind *k, void *d, const void *s, size_t n);

/* Two compiled copies, like KC_DISPATCHED_RANGE but for AVX2 + F16C: with
 * F16C the float16 conversions are single instructions instead of libgcc
 * calls. Both round the same way (IEEE round-to-nearest-even; MXCSR is never
 * changed here), so the choice does not change any bit. */
static void kc_cast_span_base(const kc_cast_kind *k, void *d, const void *s, size_t n) {
    kc_cast_span_impl(k, d, s, n);
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(KC_NO_AVX2_DISPATCH) && KC_HAVE_FLOAT16
/* (without _Float16 the conversions are integer code that F16C cannot
 * speed up, and clang 14's __builtin_cpu_supports does not know "f16c") */
__attribute__((target("avx2,f16c"))) static void kc_cast_span_f16c(const kc_cast_kind *k, void *d, const void *s,
                                                                   size_t n) {
    kc_cast_span_impl(k, d, s, n);
}
static kc_span_fn kc_cast_span_pick(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? kc_cast_span_f16c
                                                                              : kc_cast_span_base;
}
#else
static kc_span_fn kc_cast_span_pick(void) { return kc_cast_span_base; }
#endif

/* ------------------------------------------------------- range bodies */

typedef struct {
    kc_cast_kind kind;
    kc_span_fn span;
    char *dst;             /* rows of dst_ld elements of dsz bytes */
    const char *src;       /* rows of src_ld elements of ssz bytes */
    size_t dsz, ssz;
    size_t dst_ld, src_ld; /* in elements; row mode only */
    size_t cols;           /* row mode only */
} kc_cast_ctx;

/* Elements [i0, i1) of contiguous data. */
static void kc_cast_elems_range(void *vc, size_t i0, size_t i1) {
    const kc_cast_ctx *c = vc;
    c->span(&c->kind, c->dst + i0 * c->dsz, c->src + i0 * c->ssz, i1 - i0);
}

/* Rows [r0, r1) of strided data. */
static void kc_cast_rows_range(void *vc, size_t r0, size_t r1) {
    const kc_cast_ctx *c = vc;
    for (size_t r = r0; r < r1; r++)
        c->span(&c->kind, c->dst + r * c->dst_ld * c->dsz, c->src + r * c->src_ld * c->ssz, c->cols);
}

void kc_cast_rows(int op, void *dst, int dst_dtype, size_t dst_ld, const void *src, int src_dtype,
                  size_t src_ld, size_t rows, size_t cols) {
    if (rows == 0 || cols == 0) return;
    kc_cast_ctx c;
    c.kind.op = op;
    c.kind.dt = dst_dtype;
    c.kind.st = src_dtype;
    c.dst = dst;
    c.src = src;
    c.dsz = kc_dtype_bytes(dst_dtype);
    c.ssz = kc_dtype_bytes(src_dtype);
    c.dst_ld = dst_ld;
    c.src_ld = src_ld;
    c.cols = cols;
    if (op == KC_CAST && dst_dtype == src_dtype) {
        /* A plain copy, row by row (nothing to do in place). */
        if (dst == src) return;
        for (size_t r = 0; r < rows; r++)
            memcpy(c.dst + r * dst_ld * c.dsz, c.src + r * src_ld * c.ssz, cols * c.dsz);
        return;
    }
    c.span = kc_cast_span_pick();
    if (rows == 1 || (dst_ld == cols && src_ld == cols)) {
        /* Contiguous: split by elements; 32-element boundaries keep every
         * thread's output on its own cache lines for 2-, 4- and 8-byte
         * destinations alike. */
        kc_parallel_for(rows * cols, KC_GRAIN_STREAM, 32, kc_cast_elems_range, &c);
    } else {
        const size_t grain = KC_GRAIN_STREAM / cols;
        kc_parallel_for(rows, grain ? grain : 1, 1, kc_cast_rows_range, &c);
    }
}

/* ----------------------------------------------------------- public */

int kc_cast(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n) {
    if (kc_dtype_bytes(dst_dtype) == 0 || kc_dtype_bytes(src_dtype) == 0) return -1;
    kc_cast_rows(KC_CAST, dst, dst_dtype, n, src, src_dtype, n, 1, n);
    return 0;
}

void kc_f32_to_f16(uint16_t *dst, const float *src, size_t n) { kc_cast(dst, KC_F16, src, KC_F32, n); }
void kc_f16_to_f32(float *dst, const uint16_t *src, size_t n) { kc_cast(dst, KC_F32, src, KC_F16, n); }
void kc_f32_to_bf16(uint16_t *dst, const float *src, size_t n) { kc_cast(dst, KC_BF16, src, KC_F32, n); }
void kc_bf16_to_f32(float *dst, const uint16_t *src, size_t n) { kc_cast(dst, KC_F32, src, KC_BF16, n); }
void kc_f32_to_f64(double *dst, const float *src, size_t n) { kc_cast(dst, KC_F64, src, KC_F32, n); }
void kc_f64_to_f32(float *dst, const double *src, size_t n) { kc_cast(dst, KC_F32, src, KC_F64, n); }

void kc_round_f16(float *x, size_t n) { kc_cast_rows(KC_ROUND_F16, x, KC_F32, n, x, KC_F32, n, 1, n); }
void kc_round_bf16(float *x, size_t n) { kc_cast_rows(KC_ROUND_BF16, x, KC_F32, n, x, KC_F32, n, 1, n); }
