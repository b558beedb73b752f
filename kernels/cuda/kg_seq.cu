/*
 * kg_seq.cu: the ABI 1.4 sequence kernels other than attention: token and
 * position embedding (forward, and a scatter-add backward that never uses
 * float atomics), layer norm forward and backward, the softmax
 * cross-entropy over a vocabulary fused with its gradient, and the residual
 * add. Every result is deterministic: sums inside a row use a fixed warp or
 * block tree, sums over rows go through the row blocks of
 * kernels/common/km_seq.h (the cpu kernels' blocks) added in block order,
 * and each embedding gradient row receives its contributions one at a time
 * in increasing position, as the cpu does. Where the cpu sums a row
 * sequentially (a layer norm's statistics, a softmax's denominator) the
 * tree gives a double that may differ in its last bits, so a float result
 * agrees with the cpu's to an ulp or two; the embedding, dw, db, add and
 * every elementwise formula are the cpu's operations in the cpu's order
 * (built with --fmad=false), bit for bit: the layer norm's output and input
 * gradient and the cross-entropy's target gradient are km_seq.h's functions,
 * which the cpu kernels call too.
 */
#include "../common/km_seq.h"
#include "kg_internal.cuh"
#include "kg_kernels.h"

#define KG_WARPS (KG_THREADS / 32)

/* Butterfly sum over the 32 lanes of a warp: every lane ends with the same
 * bits (each level adds the same two group sums, in either order), and the
 * tree depends on nothing but the lane numbers. */
template <typename A> static __device__ __forceinline__ A kg_warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* kernels/common/km_seq.h's formulas, by element type */
static __device__ __forceinline__ float kg_ln_y(float x, float m, float r, float w, float b, int hw, int hb) {
    return km_ln_y_f32(x, m, r, w, b, hw, hb);
}
static __device__ __forceinline__ double kg_ln_y(double x, double m, double r, double w, double b, int hw, int hb) {
    return km_ln_y_f64(x, m, r, w, b, hw, hb);
}
static __device__ __forceinline__ float kg_ln_dx(float g, float x, float m, float r, float am, float bm) {
    return km_ln_dx_f32(g, x, m, r, am, bm);
}
static __device__ __forceinline__ double kg_ln_dx(double g, double x, double m, double r, double am, double bm) {
    return km_ln_dx_f64(g, x, m, r, am, bm);
}
static __device__ __forceinline__ float kg_xent_target(float e, double sum, double gs) {
    return km_xent_target_f32(e, sum, gs);
}
static __device__ __forceinline__ double kg_xent_target(double e, double sum, double gs) {
    return km_xent_target_f64(e, sum, gs);
}

template <typename T> static __device__ __forceinline__ T kg_seq_round(T v, int round_dtype) {
    if constexpr (sizeof(T) == sizeof(float)) return kg_round_to_dtype(v, round_dtype);
    else return v;
}

/* ------------------------------------------------------------- embedding */

template <typename T>
__global__ void kg_emb_fwd_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe, size_t n, size_t T_,
                                  size_t C) {
    KG_GRID_STRIDE(e, n * C) {
        const size_t i = e / C, j = e % C;
        const T w = wte[(size_t)tokens[i] * C + j];
        out[e] = wpe ? w + wpe[(i % T_) * C + j] : w;
    }
}

/* One thread per element of dwpe: its B contributions in increasing b. */
template <typename T>
__global__ void kg_emb_bwd_pos_kernel(T *dwpe, const T *dout, size_t B, size_t T_, size_t C) {
    KG_GRID_STRIDE(e, T_ * C) {
        const size_t t = e / C, j = e % C;
        T g = dwpe[e];
        for (size_t b = 0; b < B; b++) g += dout[(b * T_ + t) * C + j];
        dwpe[e] = g;
    }
}

/* blockIdx.x: the bucket (one token); blockIdx.y * KG_THREADS + threadIdx.x:
 * the column. */
template <typename T>
__global__ void __launch_bounds__(KG_THREADS)
    kg_emb_bwd_tok_kernel(T *dwte, const T *dout, const int32_t *index, int nb, int C) {
    const int k = (int)blockIdx.x;
    const size_t j = (size_t)blockIdx.y * KG_THREADS + threadIdx.x;
    if (j >= (size_t)C) return;
    const int32_t *token = index, *start = index + nb, *order = start + nb + 1;
    T *g = dwte + (size_t)token[k] * (size_t)C + j;
    T acc = *g;
    for (int32_t p = start[k]; p < start[k + 1]; p++) acc += dout[(size_t)order[p] * (size_t)C + j];
    *g = acc;
}

template <typename T>
static cudaError_t kg_emb_fwd_t(cudaStream_t s, void *out, const int32_t *tokens, const void *wte, const void *wpe,
                                int B, int T_, int C) {
    const size_t n = (size_t)B * (size_t)T_;
    kg_emb_fwd_kernel<T><<<kg_grid(n * (size_t)C), KG_THREADS, 0, s>>>((T *)out, tokens, (const T *)wte,
                                                                       (const T *)wpe, n, (size_t)T_, (size_t)C);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_embedding_forward(cudaStream_t s, int fdt, void *out, const int32_t *tokens,
                                            const void *wte, const void *wpe, int B, int T, int C) {
    if ((fdt != KG_F32 && fdt != KG_F64) || B < 0 || T < 0 || C < 0) return cudaErrorInvalidValue;
    if (B == 0 || T == 0 || C == 0) return cudaSuccess;
    return fdt == KG_F32 ? kg_emb_fwd_t<float>(s, out, tokens, wte, wpe, B, T, C)
                         : kg_emb_fwd_t<double>(s, out, tokens, wte, wpe, B, T, C);
}

extern "C" cudaError_t kg_embedding_backward_pos(cudaStream_t s, int fdt, void *dwpe, const void *dout, int B, int T,
                                                 int C) {
    if ((fdt != KG_F32 && fdt != KG_F64) || B < 0 || T < 0 || C < 0) return cudaErrorInvalidValue;
    if (B == 0 || T == 0 || C == 0) return cudaSuccess;
    const size_t n = (size_t)T * (size_t)C;
    if (fdt == KG_F32)
        kg_emb_bwd_pos_kernel<float><<<kg_grid(n), KG_THREADS, 0, s>>>((float *)dwpe, (const float *)dout, (size_t)B,
                                                                       (size_t)T, (size_t)C);
    else
        kg_emb_bwd_pos_kernel<double><<<kg_grid(n), KG_THREADS, 0, s>>>((double *)dwpe, (const double *)dout,
                                                                        (size_t)B, (size_t)T, (size_t)C);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_embedding_backward_tok(cudaStream_t s, int fdt, void *dwte, const void *dout,
                                                 const int32_t *index, int nb, int C) {
    if ((fdt != KG_F32 && fdt != KG_F64) || nb < 0 || C < 0) return cudaErrorInvalidValue;
    if (nb == 0 || C == 0) return cudaSuccess;
    const dim3 grid((unsigned)nb, (unsigned)(((size_t)C + KG_THREADS - 1) / KG_THREADS));
    if (grid.y > 65535u) return cudaErrorInvalidValue;
    if (fdt == KG_F32)
        kg_emb_bwd_tok_kernel<float><<<grid, KG_THREADS, 0, s>>>((float *)dwte, (const float *)dout, index, nb, C);
    else
        kg_emb_bwd_tok_kernel<double><<<grid, KG_THREADS, 0, s>>>((double *)dwte, (const double *)dout, index, nb, C);
    return cudaGetLastError();
}

/* ------------------------------------------------------------ layer norm */

/* One warp per row (KG_WARPS rows per block). SY: y's storage (T's own
 * dtype, or 16 bits beside float32 statistics and parameters: ABI 1.7,
 * where the store is the rounding). ADD (ABI 1.10's add_layernorm_forward):
 * x is not read; each row is first res = ra + rb, rb stored as y is (the
 * residual add of kg_add_kernel, the same operation), written to res as
 * its statistics are summed, then normalised from res as x would be. */
template <typename T, int SY, bool ADD>
__global__ void __launch_bounds__(KG_THREADS)
    kg_ln_fwd_kernel(typename kg_storage<SY>::type *y, T *mean, T *rstd, const T *x, const T *w, const T *b, int N,
                     int C, double eps, int round_dtype, T *res, const T *ra,
                     const typename kg_storage<SY>::type *rb) {
    const int lane = (int)(threadIdx.x & 31u);
    const int row = (int)blockIdx.x * KG_WARPS + (int)(threadIdx.x >> 5);
    if (row >= N) return;
    const size_t off = (size_t)row * (size_t)C;
    typename kg_storage<SY>::type *yr = y + off;
    const T *xr;
    double s = 0.0;
    if constexpr (ADD) { /* each lane reads back below only what it wrote here */
        T *rr = res + off;
        for (int j = lane; j < C; j += 32) {
            const T v = ra[off + j] + kg_ld<T, SY>(rb[off + j]);
            rr[j] = v;
            s += (double)v;
        }
        xr = rr;
    } else {
        xr = x + off;
        for (int j = lane; j < C; j += 32) s += (double)xr[j];
    }
    const double mean_d = kg_warp_sum(s) / (double)C;
    double q = 0.0;
    for (int j = lane; j < C; j += 32) {
        const double d = (double)xr[j] - mean_d;
        q += d * d;
    }
    const double rstd_d = 1.0 / sqrt(kg_warp_sum(q) / (double)C + eps);
    const T m = (T)mean_d, r = (T)rstd_d;
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
    for (int j = lane; j < C; j += 32)
        yr[j] = kg_st<T, SY>(kg_seq_round(
            kg_ln_y(xr[j], m, r, w ? w[j] : (T)0, b ? b[j] : (T)0, w != NULL, b != NULL), round_dtype));
}

/* dx, one warp per row. SD: dy's storage (T's own dtype, or 16 bits
 * beside float32 everything else: ABI 1.7), widened as it is read. D16
 * (ABI 1.11's layernorm_backward_cast, T float): KG_F16 or KG_BF16 also
 * stores each dx as kg_cast would convert it into dx16; 0 does not. */
template <typename T, int SD, int D16>
__global__ void __launch_bounds__(KG_THREADS)
    kg_ln_bwd_dx_kernel(T *dx, const typename kg_storage<SD>::type *dy, const T *x, const T *w, const T *mean,
                        const T *rstd, int N, int C, int accumulate, uint16_t *dx16) {
    const int lane = (int)(threadIdx.x & 31u);
    const int row = (int)blockIdx.x * KG_WARPS + (int)(threadIdx.x >> 5);
    if (row >= N) return;
    const size_t off = (size_t)row * (size_t)C;
    const T *xr = x + off;
    const typename kg_storage<SD>::type *dyr = dy + off;
    T *dxr = dx + off;
    const T m = mean[row], r = rstd[row];
    double sa = 0.0, sb = 0.0;
    for (int j = lane; j < C; j += 32) {
        const T dyj = kg_ld<T, SD>(dyr[j]);
        const T h = (xr[j] - m) * r, g = w ? dyj * w[j] : dyj;
        sa += (double)g;
        sb += (double)g * (double)h;
    }
    const T am = (T)(kg_warp_sum(sa) / (double)C), bm = (T)(kg_warp_sum(sb) / (double)C);
    for (int j = lane; j < C; j += 32) {
        const T dyj = kg_ld<T, SD>(dyr[j]);
        const T v = kg_ln_dx(w ? dyj * w[j] : dyj, xr[j], m, r, am, bm);
        const T d = accumulate ? dxr[j] + v : v;
        dxr[j] = d;
        if constexpr (D16 != 0) dx16[off + (size_t)j] = kg_convert<D16, KG_F32>(d);
    }
}

/* dw/db partials: blockIdx.x the row block, one column per thread, the
 * block's rows in order (the cpu's loop per column). */
template <typename T, int SD>
__global__ void __launch_bounds__(KG_THREADS)
    kg_ln_bwd_part_kernel(double *pw, double *pb, const typename kg_storage<SD>::type *dy, const T *x, const T *mean,
                          const T *rstd, int N, int C, int rpb) {
    const size_t j = (size_t)blockIdx.y * KG_THREADS + threadIdx.x;
    if (j >= (size_t)C) return;
    const int blk = (int)blockIdx.x, r0 = blk * rpb, r1 = r0 + rpb < N ? r0 + rpb : N;
    double aw = 0.0, ab = 0.0;
    for (int i = r0; i < r1; i++) {
        const size_t e = (size_t)i * (size_t)C + j;
        const T dye = kg_ld<T, SD>(dy[e]);
        if (pw) aw += (double)dye * (double)((x[e] - mean[i]) * rstd[i]);
        if (pb) ab += (double)dye;
    }
    if (pw) pw[(size_t)blk * (size_t)C + j] = aw;
    if (pb) pb[(size_t)blk * (size_t)C + j] = ab;
}

/* g(C) = round(g + the partials of every block, in block order). */
template <typename T> __global__ void kg_ln_combine_kernel(T *g, const double *p, int nblocks, int C) {
    KG_GRID_STRIDE(j, (size_t)C) {
        double s = p[j];
        for (int blk = 1; blk < nblocks; blk++) s += p[(size_t)blk * (size_t)C + j];
        g[j] = (T)((double)g[j] + s);
    }
}

template <typename T, int SY>
static cudaError_t kg_ln_fwd_t(cudaStream_t s, void *y, void *mean, void *rstd, const void *x, const void *w,
                               const void *b, int N, int C, double eps, int round_dtype, void *res, const void *ra,
                               const void *rb) {
    const unsigned grid = (unsigned)(((size_t)N + KG_WARPS - 1) / KG_WARPS);
    typedef typename kg_storage<SY>::type S;
    if (res)
        kg_ln_fwd_kernel<T, SY, true><<<grid, KG_THREADS, 0, s>>>((S *)y, (T *)mean, (T *)rstd, NULL, (const T *)w,
                                                                  (const T *)b, N, C, eps, round_dtype, (T *)res,
                                                                  (const T *)ra, (const S *)rb);
    else
        kg_ln_fwd_kernel<T, SY, false><<<grid, KG_THREADS, 0, s>>>((S *)y, (T *)mean, (T *)rstd, (const T *)x,
                                                                   (const T *)w, (const T *)b, N, C, eps, round_dtype,
                                                                   NULL, NULL, NULL);
    return cudaGetLastError();
}

/* kg_layernorm_forward, with the residual add first when res is given. */
static cudaError_t kg_ln_fwd(cudaStream_t s, int fdt, void *y, void *mean, void *rstd, const void *x, const void *w,
                             const void *b, int N, int C, double eps, int round_dtype, void *res, const void *ra,
                             const void *rb) {
    const int y16 = fdt == KG_F16 || fdt == KG_BF16; /* 1.7: y stored in 16 bits */
    if ((fdt != KG_F32 && fdt != KG_F64 && !y16) || N < 0 || C < 0) return cudaErrorInvalidValue;
    if (y16 ? round_dtype != fdt
            : round_dtype != KG_F32 && !(fdt == KG_F32 && (round_dtype == KG_F16 || round_dtype == KG_BF16)) &&
                  !(fdt == KG_F64 && round_dtype == KG_F64))
        return cudaErrorInvalidValue;
    if (N == 0 || C == 0) return cudaSuccess;
    switch (fdt) {
    case KG_F32: return kg_ln_fwd_t<float, KG_F32>(s, y, mean, rstd, x, w, b, N, C, eps, round_dtype, res, ra, rb);
    /* the 16-bit store rounds: no rounding before it */
    case KG_F16: return kg_ln_fwd_t<float, KG_F16>(s, y, mean, rstd, x, w, b, N, C, eps, KG_F32, res, ra, rb);
    case KG_BF16: return kg_ln_fwd_t<float, KG_BF16>(s, y, mean, rstd, x, w, b, N, C, eps, KG_F32, res, ra, rb);
    default: return kg_ln_fwd_t<double, KG_F64>(s, y, mean, rstd, x, w, b, N, C, eps, KG_F32, res, ra, rb);
    }
}

extern "C" cudaError_t kg_layernorm_forward(cudaStream_t s, int fdt, void *y, void *mean, void *rstd, const void *x,
                                            const void *w, const void *b, int N, int C, double eps,
                                            int round_dtype) {
    return kg_ln_fwd(s, fdt, y, mean, rstd, x, w, b, N, C, eps, round_dtype, NULL, NULL, NULL);
}

extern "C" cudaError_t kg_add_layernorm_forward(cudaStream_t s, int fdt, void *res, const void *a, const void *rb,
                                                void *y, void *mean, void *rstd, const void *w, const void *b, int N,
                                                int C, double eps, int round_dtype) {
    if (!res || !a || !rb) return cudaErrorInvalidValue;
    return kg_ln_fwd(s, fdt, y, mean, rstd, NULL, w, b, N, C, eps, round_dtype, res, a, rb);
}

/* D16 and dx16 as kg_ln_bwd_dx_kernel's. */
template <typename T, int SD, int D16 = 0>
static cudaError_t kg_ln_bwd_t(cudaStream_t s, void *dx, void *dw, void *db, const void *dy, const void *x,
                               const void *w, const void *mean, const void *rstd, int N, int C, int accumulate,
                               void *work, void *dx16 = NULL) {
    const unsigned grid = (unsigned)(((size_t)N + KG_WARPS - 1) / KG_WARPS);
    typedef typename kg_storage<SD>::type S;
    kg_ln_bwd_dx_kernel<T, SD, D16><<<grid, KG_THREADS, 0, s>>>((T *)dx, (const S *)dy, (const T *)x, (const T *)w,
                                                                (const T *)mean, (const T *)rstd, N, C,
                                                                accumulate != 0, (uint16_t *)dx16);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || (!dw && !db)) return e;
    const size_t rpb = km_ln_rows_per_block((size_t)N), nblocks = km_ln_blocks((size_t)N);
    double *pw = dw ? (double *)work : NULL;
    double *pb = db ? (double *)work + (dw ? nblocks * (size_t)C : 0) : NULL;
    const dim3 pgrid((unsigned)nblocks, (unsigned)(((size_t)C + KG_THREADS - 1) / KG_THREADS));
    kg_ln_bwd_part_kernel<T, SD><<<pgrid, KG_THREADS, 0, s>>>(pw, pb, (const S *)dy, (const T *)x, (const T *)mean,
                                                              (const T *)rstd, N, C, (int)rpb);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if (dw) kg_ln_combine_kernel<T><<<kg_grid((size_t)C), KG_THREADS, 0, s>>>((T *)dw, pw, (int)nblocks, C);
    if (db) kg_ln_combine_kernel<T><<<kg_grid((size_t)C), KG_THREADS, 0, s>>>((T *)db, pb, (int)nblocks, C);
    return cudaGetLastError();
}

/* The dtype switch of both backwards: D16 0, or (1.11) the 16-bit copy's
 * format, which needs a float dx (no KG_F64). */
template <int D16>
static cudaError_t kg_ln_bwd_d(cudaStream_t s, int fdt, void *dx, void *dw, void *db, const void *dy, const void *x,
                               const void *w, const void *mean, const void *rstd, int N, int C, int accumulate,
                               void *work, void *dx16) {
    switch (fdt) {
    case KG_F32:
        return kg_ln_bwd_t<float, KG_F32, D16>(s, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, work, dx16);
    case KG_F16:
        return kg_ln_bwd_t<float, KG_F16, D16>(s, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, work, dx16);
    case KG_BF16:
        return kg_ln_bwd_t<float, KG_BF16, D16>(s, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, work, dx16);
    default:
        if constexpr (D16 == 0)
            return kg_ln_bwd_t<double, KG_F64>(s, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, work);
        else
            return cudaErrorInvalidValue;
    }
}

/* kg_layernorm_backward, and (dx16_fdt KG_F16 / KG_BF16, 0 for none) the
 * 16-bit copy of dx stored by the same kernel. */
static cudaError_t kg_ln_bwd(cudaStream_t s, int fdt, void *dx, void *dw, void *db, const void *dy, const void *x,
                             const void *w, const void *mean, const void *rstd, int N, int C, int accumulate,
                             void *work, void *dx16, int dx16_fdt) {
    if ((fdt != KG_F32 && fdt != KG_F64 && fdt != KG_F16 && fdt != KG_BF16) || N < 0 || C < 0)
        return cudaErrorInvalidValue;
    if (dx16_fdt != 0 && ((dx16_fdt != KG_F16 && dx16_fdt != KG_BF16) || fdt == KG_F64))
        return cudaErrorInvalidValue;
    if (N == 0 || C == 0) return cudaSuccess;
    if (((dw || db) && !work) || (dx16_fdt != 0 && !dx16)) return cudaErrorInvalidValue;
    if (((size_t)C + KG_THREADS - 1) / KG_THREADS > 65535u) return cudaErrorInvalidValue;
    if (dx16_fdt == KG_F16)
        return kg_ln_bwd_d<KG_F16>(s, fdt, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, work, dx16);
    if (dx16_fdt == KG_BF16)
        return kg_ln_bwd_d<KG_BF16>(s, fdt, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, work, dx16);
    return kg_ln_bwd_d<0>(s, fdt, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, work, NULL);
}

extern "C" cudaError_t kg_layernorm_backward(cudaStream_t s, int fdt, void *dx, void *dw, void *db, const void *dy,
                                             const void *x, const void *w, const void *mean, const void *rstd, int N,
                                             int C, int accumulate, void *work) {
    return kg_ln_bwd(s, fdt, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, work, NULL, 0);
}

/* ABI 1.11: the 16-bit copy of dx in the dx kernel's store. */
extern "C" cudaError_t kg_layernorm_backward_cast(cudaStream_t s, int fdt, void *dx, void *dw, void *db,
                                                  const void *dy, const void *x, const void *w, const void *mean,
                                                  const void *rstd, int N, int C, int accumulate, void *work,
                                                  void *dx16, int dx16_fdt) {
    if (dx16_fdt != KG_F16 && dx16_fdt != KG_BF16) return cudaErrorInvalidValue;
    return kg_ln_bwd(s, fdt, dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate, work, dx16, dx16_fdt);
}

/* --------------------------------------------------- fused cross-entropy */

/* exp of a value <= 0: float32 the cpu's branch-free km_exp_nonpos (exact
 * range reduction into the subnormals), float64 CUDA's exp. */
static __device__ __forceinline__ float kg_exp_nonpos(float x) { return km_exp_nonpos(x); }
static __device__ __forceinline__ double kg_exp_nonpos(double x) { return exp(x); }
static __device__ __forceinline__ float kg_exp_any(float x) { return expf(x); }
static __device__ __forceinline__ double kg_exp_any(double x) { return exp(x); }

/* Order-preserving integer key of a float (the cpu's kc_xent_rowmax key):
 * the max of keys maps back to the max value, with no NaN semantics to
 * worry about (the row holds no NaN when the key is used). */
template <typename T> struct kg_key;
template <> struct kg_key<float> {
    typedef int32_t K;
    static __device__ __forceinline__ K of(float v) {
        const int32_t s = __float_as_int(v);
        return s ^ ((s >> 31) & 0x7fffffff);
    }
    static __device__ __forceinline__ float value(K k) { return __int_as_float(k ^ ((k >> 31) & 0x7fffffff)); }
    static __device__ __forceinline__ bool nonfinite(float v) { return (__float_as_int(v) & 0x7f800000) == 0x7f800000; }
};
template <> struct kg_key<double> {
    typedef long long K;
    static __device__ __forceinline__ K of(double v) {
        const long long s = __double_as_longlong(v);
        return s ^ ((s >> 63) & 0x7fffffffffffffffLL);
    }
    static __device__ __forceinline__ double value(K k) {
        return __longlong_as_double(k ^ ((k >> 63) & 0x7fffffffffffffffLL));
    }
    static __device__ __forceinline__ bool nonfinite(double v) {
        return (__double_as_longlong(v) & 0x7ff0000000000000LL) == 0x7ff0000000000000LL;
    }
};

/* One block per row; T the arithmetic (float or double), SD the logits'
 * storage: T's own dtype, or (1.6) KG_F16 / KG_BF16 with T float. */
template <typename T, int SD>
__global__ void __launch_bounds__(KG_THREADS)
    kg_xent_fused_kernel(typename kg_storage<SD>::type *logits, const int32_t *targets, int V, int Vp, double gs,
                         double *row_loss, int32_t *bad_row) {
    typedef typename kg_key<T>::K K;
    __shared__ K s_key[KG_THREADS];
    __shared__ int s_bad[KG_THREADS];
    __shared__ double s_sum[KG_THREADS];
    const unsigned tid = threadIdx.x;
    const int32_t row = (int32_t)blockIdx.x, t = targets[row];
    typename kg_storage<SD>::type *l = logits + (size_t)row * (size_t)Vp;
    if (t < -1 || t >= V) {
        if (tid == 0) {
            kg_note_bad_row(bad_row, row);
            row_loss[row] = 0.0;
        }
        return;
    }
    if (t == -1) {
        if (gs != 0.0)
            for (int j = (int)tid; j < Vp; j += KG_THREADS) l[j] = kg_st<T, SD>((T)0);
        if (tid == 0) row_loss[row] = 0.0;
        return;
    }
    /* pass 1: the max (as integer keys) and whether anything is inf/NaN */
    K km = kg_key<T>::of((T)-INFINITY);
    int bad = 0;
    for (int j = (int)tid; j < V; j += KG_THREADS) {
        const T v = kg_ld<T, SD>(l[j]);
        const K k = kg_key<T>::of(v);
        km = k > km ? k : km;
        bad |= kg_key<T>::nonfinite(v);
    }
    s_key[tid] = km;
    s_bad[tid] = bad;
    __syncthreads();
    for (unsigned h = KG_THREADS / 2; h > 0; h >>= 1) {
        if (tid < h) {
            s_key[tid] = s_key[tid + h] > s_key[tid] ? s_key[tid + h] : s_key[tid];
            s_bad[tid] |= s_bad[tid + h];
        }
        __syncthreads();
    }
    const bool nonfinite = s_bad[0] != 0;
    T m = kg_key<T>::value(s_key[0]);
    const T lt = kg_ld<T, SD>(l[t]);
    if (nonfinite) {
        /* the cpu's scalar path: the max of the values that compare (NaN
         * never wins), libm-style exp, NaN propagating into the sum */
        T mx = (T)-INFINITY;
        for (int j = (int)tid; j < V; j += KG_THREADS)
            if (kg_ld<T, SD>(l[j]) > mx) mx = kg_ld<T, SD>(l[j]);
        __syncthreads();
        s_key[tid] = kg_key<T>::of(mx); /* no NaN among these */
        __syncthreads();
        for (unsigned h = KG_THREADS / 2; h > 0; h >>= 1) {
            if (tid < h) s_key[tid] = s_key[tid + h] > s_key[tid] ? s_key[tid + h] : s_key[tid];
            __syncthreads();
        }
        m = kg_key<T>::value(s_key[0]);
    }
    double sum = 0.0;
    for (int j = (int)tid; j < V; j += KG_THREADS)
        sum += (double)(nonfinite ? kg_exp_any(kg_ld<T, SD>(l[j]) - m) : kg_exp_nonpos(kg_ld<T, SD>(l[j]) - m));
    s_sum[tid] = sum;
    kg_block_tree_sum(s_sum);
    sum = s_sum[0];
    if (tid == 0) row_loss[row] = log(sum) + (double)m - (double)lt;
    if (gs == 0.0) return;
    if (nonfinite) {
        for (int j = (int)tid; j < V; j += KG_THREADS) {
            const double p = (double)kg_exp_any(kg_ld<T, SD>(l[j]) - m) / sum;
            l[j] = kg_st<T, SD>((T)(gs * (j == t ? p - 1.0 : p)));
        }
    } else {
        const T sc = (T)(gs / sum);
        for (int j = (int)tid; j < V; j += KG_THREADS) {
            const T e = kg_exp_nonpos(kg_ld<T, SD>(l[j]) - m);
            /* the target's entry in double from its own exponential, so
             * p - 1 does not cancel in the data type */
            l[j] = kg_st<T, SD>(j == t ? kg_xent_target(e, sum, gs) : e * sc);
        }
    }
    for (int j = V + (int)tid; j < Vp; j += KG_THREADS) l[j] = kg_st<T, SD>((T)0);
}

/* *loss_sum: row losses in km_seq.h's blocks, each block's rows in order,
 * then the blocks in order (one thread: N is a few thousand rows). */
__global__ void kg_xent_sum_kernel(const double *row_loss, int N, double *loss_sum) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const size_t rpb = km_xent_rows_per_block((size_t)N);
    double total = 0.0;
    for (size_t r0 = 0; r0 < (size_t)N; r0 += rpb) {
        const size_t r1 = r0 + rpb < (size_t)N ? r0 + rpb : (size_t)N;
        double s = 0.0;
        for (size_t i = r0; i < r1; i++) s += row_loss[i];
        total += s;
    }
    *loss_sum = total;
}

extern "C" cudaError_t kg_xent_fused(cudaStream_t s, int fdt, void *logits, const int32_t *targets, int N, int V,
                                     int Vp, double grad_scale, double *row_loss, int32_t *bad_row,
                                     double *loss_sum) {
    if ((fdt != KG_F32 && fdt != KG_F64 && fdt != KG_F16 && fdt != KG_BF16) || N < 0 || V < 1 || Vp < V)
        return cudaErrorInvalidValue;
    if (N > 0) {
        if (fdt == KG_F32)
            kg_xent_fused_kernel<float, KG_F32><<<(unsigned)N, KG_THREADS, 0, s>>>((float *)logits, targets, V, Vp,
                                                                                   grad_scale, row_loss, bad_row);
        else if (fdt == KG_BF16)
            kg_xent_fused_kernel<float, KG_BF16><<<(unsigned)N, KG_THREADS, 0, s>>>((uint16_t *)logits, targets, V,
                                                                                    Vp, grad_scale, row_loss, bad_row);
        else if (fdt == KG_F16)
            kg_xent_fused_kernel<float, KG_F16><<<(unsigned)N, KG_THREADS, 0, s>>>((uint16_t *)logits, targets, V,
                                                                                   Vp, grad_scale, row_loss, bad_row);
        else
            kg_xent_fused_kernel<double, KG_F64><<<(unsigned)N, KG_THREADS, 0, s>>>((double *)logits, targets, V, Vp,
                                                                                    grad_scale, row_loss, bad_row);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    kg_xent_sum_kernel<<<1, 32, 0, s>>>(row_loss, N, loss_sum);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------- add */

/* SB: b's storage (T's own dtype, or 16 bits beside float32 y and a: ABI
 * 1.7's residual add of a 16-bit branch output). */
template <typename T, int SB>
__global__ void kg_add_kernel(T *y, const T *a, const typename kg_storage<SB>::type *b, size_t n) {
    KG_GRID_STRIDE(i, n) y[i] = a[i] + kg_ld<T, SB>(b[i]);
}

extern "C" cudaError_t kg_add(cudaStream_t s, int fdt, void *y, const void *a, const void *b, size_t n) {
    if (fdt != KG_F32 && fdt != KG_F64 && fdt != KG_F16 && fdt != KG_BF16) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    const unsigned g = kg_grid(n);
    if (fdt == KG_F32)
        kg_add_kernel<float, KG_F32><<<g, KG_THREADS, 0, s>>>((float *)y, (const float *)a, (const float *)b, n);
    else if (fdt == KG_F16)
        kg_add_kernel<float, KG_F16><<<g, KG_THREADS, 0, s>>>((float *)y, (const float *)a, (const uint16_t *)b, n);
    else if (fdt == KG_BF16)
        kg_add_kernel<float, KG_BF16><<<g, KG_THREADS, 0, s>>>((float *)y, (const float *)a, (const uint16_t *)b, n);
    else
        kg_add_kernel<double, KG_F64><<<g, KG_THREADS, 0, s>>>((double *)y, (const double *)a, (const double *)b, n);
    return cudaGetLastError();
}
