/*
 * cpu_ew.c: the elementwise building blocks of ABI 1.5 (lerp, sign, mul,
 * addcmul, addcdiv, sqrt, clamp) in float32 and float64, from which an
 * optimizer plugin composes its update on the accelerator and the host
 * clamps gradients (value clipping). The per-element formulas are
 * kernels/common/km_ew.h's, shared with the cuda kernels. The output may be
 * the same pointer as an input (m = lerp(m, g, w) in place), so the loops
 * do not use restrict; each element reads only its own inputs, so any split
 * across the pool gives the serial loop's bits. Unlike the SGD/AdamW
 * updates these keep IEEE subnormals (no FTZ): they are general arithmetic,
 * and the cuda build (--ftz=false) must agree with them.
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"

#include "../common/km_ew.h"

typedef struct {
    int op;          /* KC_EW_* */
    void *y;         /* (n) output */
    const void *a;   /* (n) first input (x for the unary ones) */
    const void *b;   /* (n) second input, or NULL */
    km_ew_scalars_f32 s32;
    km_ew_scalars_f64 s64;
} kc_ew_ctx15;

/* The loop of one op over [i0, i1), for element type T with scalars S and
 * functions suffixed SFX. The switch is outside the loops. */
#define KC_EW_BODY(T, SFX, S)                                                                 \
    do {                                                                                      \
        T *y = (T *)c->y;                                                                     \
        const T *a = (const T *)c->a, *b = (const T *)c->b;                                   \
        const km_ew_scalars_##SFX *s = &c->S;                                                 \
        switch (c->op) {                                                                      \
        case KC_EW_LERP:                                                                      \
            for (size_t i = i0; i < i1; i++) y[i] = km_lerp_##SFX(a[i], b[i], s);             \
            break;                                                                            \
        case KC_EW_SIGN:                                                                      \
            for (size_t i = i0; i < i1; i++) y[i] = km_sign_##SFX(a[i]);                      \
            break;                                                                            \
        case KC_EW_MUL:                                                                       \
            for (size_t i = i0; i < i1; i++) y[i] = a[i] * b[i];                              \
            break;                                                                            \
        case KC_EW_ADDCMUL:                                                                   \
            for (size_t i = i0; i < i1; i++) y[i] = km_addcmul_##SFX(y[i], s->s0, a[i], b[i]); \
            break;                                                                            \
        case KC_EW_ADDCDIV:                                                                   \
            for (size_t i = i0; i < i1; i++) y[i] = km_addcdiv_##SFX(y[i], s->s0, a[i], b[i]); \
            break;                                                                            \
        case KC_EW_SQRT:                                                                      \
            for (size_t i = i0; i < i1; i++) y[i] = km_sqrt_##SFX(a[i]);                      \
            break;                                                                            \
        case KC_EW_CLAMP:                                                                     \
            for (size_t i = i0; i < i1; i++) y[i] = km_clamp_##SFX(a[i], s->s0, s->s1);       \
            break;                                                                            \
        default: break;                                                                       \
        }                                                                                     \
    } while (0)

static void kc_ew_range_f32(void *vc, size_t i0, size_t i1) {
    const kc_ew_ctx15 *c = vc;
    KC_EW_BODY(float, f32, s32);
}

static void kc_ew_range_f64(void *vc, size_t i0, size_t i1) {
    const kc_ew_ctx15 *c = vc;
    KC_EW_BODY(double, f64, s64);
}

#undef KC_EW_BODY

int kc_ew(int op, int dtype, void *y, const void *a, const void *b, double s0, double s1, size_t n) {
    if (op < KC_EW_LERP || op > KC_EW_CLAMP || (dtype != KC_F32 && dtype != KC_F64)) return -1;
    if (n == 0) return 0;
    kc_ew_ctx15 c;
    c.op = op;
    c.y = y;
    c.a = a;
    c.b = b;
    /* lerp takes its weight in s0; the other entries their value / bounds */
    c.s32 = km_ew_scalars_f32_make(op == KC_EW_LERP ? s0 : 0.0, s0, s1);
    c.s64 = km_ew_scalars_f64_make(op == KC_EW_LERP ? s0 : 0.0, s0, s1);
    kc_parallel_for(n, KC_GRAIN_STREAM, KC_ALIGN_FLOATS, dtype == KC_F32 ? kc_ew_range_f32 : kc_ew_range_f64, &c);
    return 0;
}
