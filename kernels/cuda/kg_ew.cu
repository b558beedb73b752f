/*
 * kg_ew.cu: the launcher of the ABI 1.5 elementwise building blocks (lerp,
 * sign, mul, addcmul, addcdiv, sqrt, clamp; kg_kernels.h), with which an
 * optimizer plugin updates on the GPU through the kernel table alone and
 * the host clamps gradients in device memory. One grid-stride kernel per
 * (op, element type), instantiated from a template so no op test runs per
 * element; the per-element formulas are kernels/common/km_ew.h's, the same
 * functions the cpu kernels inline, so with --fmad=false and IEEE sqrt the
 * results are the cpu's bit for bit. The output may be the same pointer as
 * an input (in place), so no pointer is __restrict__.
 */
#include "kg_internal.cuh"
#include "kg_kernels.h"

#include "../common/km_ew.h"

/* The element formulas by type: float -> *_f32, double -> *_f64. */
template <typename T> struct kg_ew_of;
/* One specialization per type T whose km_ew.h functions end in _SFX. */
#define KG_EW_OF(T, SFX)                                                                                         \
    template <> struct kg_ew_of<T> {                                                                             \
        typedef km_ew_scalars_##SFX S;                                                                            \
        static __device__ __forceinline__ T lerp(T a, T b, const S *s) { return km_lerp_##SFX(a, b, s); }         \
        static __device__ __forceinline__ T sign(T x) { return km_sign_##SFX(x); }                                \
        static __device__ __forceinline__ T addcmul(T y, T v, T a, T b) { return km_addcmul_##SFX(y, v, a, b); }  \
        static __device__ __forceinline__ T addcdiv(T y, T v, T a, T b) { return km_addcdiv_##SFX(y, v, a, b); }  \
        static __device__ __forceinline__ T sqrt_(T x) { return km_sqrt_##SFX(x); }                               \
        static __device__ __forceinline__ T clamp(T x, T lo, T hi) { return km_clamp_##SFX(x, lo, hi); }          \
        static S make(double w, double s0, double s1) { return km_ew_scalars_##SFX##_make(w, s0, s1); }           \
    };
KG_EW_OF(float, f32)
KG_EW_OF(double, f64)
#undef KG_EW_OF

/* y(n) = OP(a, b); the scalars by value (a few bytes of kernel parameters). */
template <int OP, typename T>
__global__ void kg_ew_kernel(T *y, const T *a, const T *b, const typename kg_ew_of<T>::S s, size_t n) {
    typedef kg_ew_of<T> F;
    KG_GRID_STRIDE(i, n) {
        if constexpr (OP == KG_EW_LERP) y[i] = F::lerp(a[i], b[i], &s);
        else if constexpr (OP == KG_EW_SIGN) y[i] = F::sign(a[i]);
        else if constexpr (OP == KG_EW_MUL) y[i] = a[i] * b[i];
        else if constexpr (OP == KG_EW_ADDCMUL) y[i] = F::addcmul(y[i], s.s0, a[i], b[i]);
        else if constexpr (OP == KG_EW_ADDCDIV) y[i] = F::addcdiv(y[i], s.s0, a[i], b[i]);
        else if constexpr (OP == KG_EW_SQRT) y[i] = F::sqrt_(a[i]);
        else y[i] = F::clamp(a[i], s.s0, s.s1);
    }
}

template <typename T>
static cudaError_t kg_ew_t(cudaStream_t st, int op, void *yv, const void *av, const void *bv, double s0, double s1,
                           size_t n) {
    T *y = (T *)yv;
    const T *a = (const T *)av, *b = (const T *)bv;
    /* lerp's weight is s0; the scalars are rounded on the host, once */
    const typename kg_ew_of<T>::S s = kg_ew_of<T>::make(op == KG_EW_LERP ? s0 : 0.0, s0, s1);
    const unsigned g = kg_grid(n);
    switch (op) {
    case KG_EW_LERP: kg_ew_kernel<KG_EW_LERP, T><<<g, KG_THREADS, 0, st>>>(y, a, b, s, n); break;
    case KG_EW_SIGN: kg_ew_kernel<KG_EW_SIGN, T><<<g, KG_THREADS, 0, st>>>(y, a, b, s, n); break;
    case KG_EW_MUL: kg_ew_kernel<KG_EW_MUL, T><<<g, KG_THREADS, 0, st>>>(y, a, b, s, n); break;
    case KG_EW_ADDCMUL: kg_ew_kernel<KG_EW_ADDCMUL, T><<<g, KG_THREADS, 0, st>>>(y, a, b, s, n); break;
    case KG_EW_ADDCDIV: kg_ew_kernel<KG_EW_ADDCDIV, T><<<g, KG_THREADS, 0, st>>>(y, a, b, s, n); break;
    case KG_EW_SQRT: kg_ew_kernel<KG_EW_SQRT, T><<<g, KG_THREADS, 0, st>>>(y, a, b, s, n); break;
    case KG_EW_CLAMP: kg_ew_kernel<KG_EW_CLAMP, T><<<g, KG_THREADS, 0, st>>>(y, a, b, s, n); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t kg_ew(cudaStream_t s, int op, int fdt, void *y, const void *a, const void *b, double s0,
                             double s1, size_t n) {
    if ((fdt != KG_F32 && fdt != KG_F64) || op < KG_EW_LERP || op > KG_EW_CLAMP) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (fdt == KG_F32) return kg_ew_t<float>(s, op, y, a, b, s0, s1, n);
    return kg_ew_t<double>(s, op, y, a, b, s0, s1, n);
}
