/*
 * kg_attn.cu: causal multi-head self-attention forward and backward on the
 * packed qkv layout of kiln/training.h, as one warp per row of the
 * attention matrix. The forward keeps the row's scores in shared memory,
 * takes the max, the sum of exp(s - max) in double (a fixed warp tree) and
 * lse = max + log(sum), then each lane accumulates its head dimensions over
 * the keys in increasing order in double. The backward recomputes each
 * probability from lse (nothing T x T is stored) and splits the work so
 * that every output element has one writer: dQ row by row (one warp per
 * query row, over its keys), dK and dV column by column (one warp per key
 * row, over the queries that see it); Delta = rowsum(dout * out) is formed
 * first into caller scratch. No atomics, fixed orders: the same bits on
 * every run.
 *
 * This is the exact, simple path: the scores use the CUDA cores in the data
 * type, not the tensor cores, so it is correct at every size the shared
 * memory holds (kg_attention_max_T) and slower than a tiled kernel on
 * tensor cores would be.
 */
#include "kg_internal.cuh"
#include "kg_kernels.h"

#define KG_ATTN_WARPS 8

template <typename A> static __device__ __forceinline__ A kg_attn_warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> static __device__ __forceinline__ A kg_attn_warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) {
        const A u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

static __device__ __forceinline__ float kg_attn_exp(float x) { return km_exp_nonpos(x); }
static __device__ __forceinline__ double kg_attn_exp(double x) { return exp(x); }

template <typename T> static __device__ __forceinline__ T kg_attn_round(T v, int round_dtype) {
    if constexpr (sizeof(T) == sizeof(float)) return kg_round_to_dtype(v, round_dtype);
    else return v;
}

/* dot(a, b) over D in the data type, in increasing d; SD the storage of
 * a and b (T's own dtype, or 1.7's 16 bits widened as read). */
template <typename T, int SD>
static __device__ __forceinline__ T kg_attn_dot(const typename kg_storage<SD>::type *a,
                                                const typename kg_storage<SD>::type *b, int D) {
    T s = (T)0;
    for (int d = 0; d < D; d++) s += kg_ld<T, SD>(a[d]) * kg_ld<T, SD>(b[d]);
    return s;
}

/* Rows (warps) per block whose `per_row` shared elements fit. */
static int kg_attn_warps(size_t per_row_bytes) {
    size_t w = KG_ATTN_SMEM / (per_row_bytes ? per_row_bytes : 1);
    return w > KG_ATTN_WARPS ? KG_ATTN_WARPS : (int)w;
}

/* The (B, NH, T) row a warp owns: r = block * warps + warp, its position
 * t, head h and batch element b, the head size D, qkv's leading dimension
 * ld = 3C and `base`, where its batch element's head columns start in qkv;
 * the warp's lane, and its slice of the block's dynamic shared memory
 * (`per_row` elements of T). false for a warp past the last row. SD: the
 * storage of qkv, out, dout and dqkv (T's own dtype, or 1.7's 16 bits
 * beside float32 arithmetic, lse and shared memory). */
template <typename T, int SD> struct kg_attn_row {
    size_t r, ld;
    int warp, lane, t, h, b, D;
    const typename kg_storage<SD>::type *base;
    T *smem;
};

extern __shared__ unsigned char kg_attn_smem[];

template <typename T, int SD>
static __device__ __forceinline__ bool kg_attn_row_of(const typename kg_storage<SD>::type *qkv, int B, int T_, int C,
                                                      int NH, int warps, size_t per_row, kg_attn_row<T, SD> *w) {
    w->warp = (int)(threadIdx.x >> 5), w->lane = (int)(threadIdx.x & 31u);
    w->r = (size_t)blockIdx.x * (size_t)warps + (size_t)w->warp;
    if (w->warp >= warps || w->r >= (size_t)B * (size_t)NH * (size_t)T_) return false;
    w->t = (int)(w->r % (size_t)T_), w->h = (int)((w->r / (size_t)T_) % (size_t)NH);
    w->b = (int)(w->r / ((size_t)T_ * NH));
    w->D = C / NH;
    w->ld = 3 * (size_t)C;
    w->base = qkv + (size_t)w->b * (size_t)T_ * w->ld + (size_t)w->h * (size_t)w->D;
    w->smem = (T *)kg_attn_smem + (size_t)w->warp * per_row;
    return true;
}

/* The rowwise launchers' dtypes: float32 or float64 data with its
 * round_dtype, or (1.7) 16-bit storage with round_dtype the same. */
static bool kg_attn_dtypes_ok(int fdt, int round_dtype) {
    if (fdt == KG_F16 || fdt == KG_BF16) return round_dtype == fdt;
    if (fdt != KG_F32 && fdt != KG_F64) return false;
    return round_dtype == KG_F32 || (fdt == KG_F32 && (round_dtype == KG_F16 || round_dtype == KG_BF16)) ||
           (fdt == KG_F64 && round_dtype == KG_F64);
}

/* --------------------------------------------------------------- forward */

/* Warp w of block b: row r = b * warps + w of the (B, NH, T) rows. */
template <typename T, int SD>
__global__ void kg_attn_fwd_kernel(typename kg_storage<SD>::type *out, T *lse, const typename kg_storage<SD>::type *qkv,
                                   int B, int T_, int C, int NH, T scale, int round_dtype, int warps) {
    typedef typename kg_storage<SD>::type S;
    kg_attn_row<T, SD> w;
    if (!kg_attn_row_of<T, SD>(qkv, B, T_, C, NH, warps, (size_t)T_, &w)) return;
    const int lane = w.lane, i = w.t, h = w.h, b = w.b, D = w.D;
    const size_t r = w.r, ld = w.ld;
    const S *base = w.base, *q = base + (size_t)i * ld;
    T *s = w.smem;
    T mx = (T)-INFINITY;
    for (int j = lane; j <= i; j += 32) {
        const T v = scale * kg_attn_dot<T, SD>(q, base + (size_t)j * ld + C, D);
        s[j] = v;
        mx = v > mx ? v : mx;
    }
    mx = kg_attn_warp_max(mx);
    double sum = 0.0;
    for (int j = lane; j <= i; j += 32) {
        const T e = kg_attn_exp(s[j] - mx);
        s[j] = e;
        sum += (double)e;
    }
    sum = kg_attn_warp_sum(sum);
    __syncwarp();
    if (lane == 0) lse[r] = (T)((double)mx + log(sum));
    S *o = out + ((size_t)b * (size_t)T_ + (size_t)i) * (size_t)C + (size_t)h * (size_t)D;
    for (int d = lane; d < D; d += 32) {
        double acc = 0.0;
        for (int j = 0; j <= i; j++)
            acc += (double)s[j] * (double)kg_ld<T, SD>(base[(size_t)j * ld + 2 * (size_t)C + d]);
        o[d] = kg_st<T, SD>(kg_attn_round((T)(acc / sum), round_dtype));
    }
}

template <typename T, int SD>
static cudaError_t kg_attn_fwd_t(cudaStream_t st, void *out, void *lse, const void *qkv, int B, int T_, int C, int NH,
                                 int round_dtype) {
    typedef typename kg_storage<SD>::type S;
    const int warps = kg_attn_warps((size_t)T_ * sizeof(T));
    if (warps < 1) return cudaErrorInvalidValue;
    const size_t rows = (size_t)B * (size_t)NH * (size_t)T_;
    const size_t grid = (rows + (size_t)warps - 1) / (size_t)warps;
    if (grid > 0x7fffffffu) return cudaErrorInvalidValue;
    const T scale = (T)(1.0 / sqrt((double)(C / NH)));
    kg_attn_fwd_kernel<T, SD><<<(unsigned)grid, 32 * warps, (size_t)warps * (size_t)T_ * sizeof(T), st>>>(
        (S *)out, (T *)lse, (const S *)qkv, B, T_, C, NH, scale, round_dtype, warps);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_attention_forward(cudaStream_t s, int fdt, void *out, void *lse, const void *qkv, int B,
                                            int T, int C, int NH, int round_dtype) {
    if (!kg_attn_dtypes_ok(fdt, round_dtype) || B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH != 0)
        return cudaErrorInvalidValue;
    if (T > kg_attention_max_T(fdt)) return cudaErrorInvalidValue;
    switch (fdt) {
    case KG_F32: return kg_attn_fwd_t<float, KG_F32>(s, out, lse, qkv, B, T, C, NH, round_dtype);
    /* 16-bit storage: the store rounds */
    case KG_F16: return kg_attn_fwd_t<float, KG_F16>(s, out, lse, qkv, B, T, C, NH, KG_F32);
    case KG_BF16: return kg_attn_fwd_t<float, KG_BF16>(s, out, lse, qkv, B, T, C, NH, KG_F32);
    default: return kg_attn_fwd_t<double, KG_F64>(s, out, lse, qkv, B, T, C, NH, KG_F32);
    }
}

/* -------------------------------------------------------------- backward */

/* Delta(B, NH, T) = sum_d dout * out over the head's columns, in double;
 * SD: the storage of dout and out (T's own dtype, or 16 bits: ABI 1.7). */
template <typename T, int SD>
__global__ void kg_attn_delta_kernel(double *delta, const typename kg_storage<SD>::type *dout,
                                     const typename kg_storage<SD>::type *out, int B, int T_, int C, int NH) {
    const size_t rows = (size_t)B * (size_t)NH * (size_t)T_;
    const int D = C / NH;
    KG_GRID_STRIDE(r, rows) {
        const int i = (int)(r % (size_t)T_), h = (int)((r / (size_t)T_) % (size_t)NH),
                  b = (int)(r / ((size_t)T_ * NH));
        const size_t off = ((size_t)b * (size_t)T_ + (size_t)i) * (size_t)C + (size_t)h * (size_t)D;
        double s = 0.0;
        for (int d = 0; d < D; d++) s += (double)kg_ld<T, SD>(dout[off + d]) * (double)kg_ld<T, SD>(out[off + d]);
        delta[r] = s;
    }
}

/* dQ: warp per query row i; dS over keys j <= i kept in shared memory. */
template <typename T, int SD>
__global__ void kg_attn_dq_kernel(typename kg_storage<SD>::type *dqkv, const typename kg_storage<SD>::type *dout,
                                  const typename kg_storage<SD>::type *qkv, const T *lse, const double *delta, int B,
                                  int T_, int C, int NH, T scale, int round_dtype, int warps) {
    typedef typename kg_storage<SD>::type S;
    kg_attn_row<T, SD> w;
    if (!kg_attn_row_of<T, SD>(qkv, B, T_, C, NH, warps, (size_t)T_, &w)) return;
    const int lane = w.lane, i = w.t, h = w.h, b = w.b, D = w.D;
    const size_t r = w.r, ld = w.ld;
    const S *base = w.base, *q = base + (size_t)i * ld;
    const S *dO = dout + ((size_t)b * (size_t)T_ + (size_t)i) * (size_t)C + (size_t)h * (size_t)D;
    const T l = lse[r];
    const double dl = delta[r];
    T *ds = w.smem;
    for (int j = lane; j <= i; j += 32) {
        const T p = kg_attn_exp(scale * kg_attn_dot<T, SD>(q, base + (size_t)j * ld + C, D) - l);
        const T dp = kg_attn_dot<T, SD>(dO, base + (size_t)j * ld + 2 * (size_t)C, D);
        ds[j] = (T)((double)p * ((double)dp - dl));
    }
    __syncwarp();
    S *dq = dqkv + ((size_t)b * (size_t)T_ + (size_t)i) * ld + (size_t)h * (size_t)D;
    for (int d = lane; d < D; d += 32) {
        double acc = 0.0;
        for (int j = 0; j <= i; j++) acc += (double)ds[j] * (double)kg_ld<T, SD>(base[(size_t)j * ld + C + d]);
        dq[d] = kg_st<T, SD>(kg_attn_round((T)(acc * (double)scale), round_dtype));
    }
}

/* dK, dV: warp per key row j; P and dS over queries i >= j in shared. */
template <typename T, int SD>
__global__ void kg_attn_dkv_kernel(typename kg_storage<SD>::type *dqkv, const typename kg_storage<SD>::type *dout,
                                   const typename kg_storage<SD>::type *qkv, const T *lse, const double *delta, int B,
                                   int T_, int C, int NH, T scale, int round_dtype, int warps) {
    typedef typename kg_storage<SD>::type S;
    kg_attn_row<T, SD> w;
    if (!kg_attn_row_of<T, SD>(qkv, B, T_, C, NH, warps, 2 * (size_t)T_, &w)) return;
    const int lane = w.lane, j = w.t, h = w.h, b = w.b, D = w.D;
    const size_t ld = w.ld, bh = (size_t)b * (size_t)NH + (size_t)h;
    const S *base = w.base;
    const S *k = base + (size_t)j * ld + C, *v = base + (size_t)j * ld + 2 * (size_t)C;
    const S *dObase = dout + (size_t)b * (size_t)T_ * (size_t)C + (size_t)h * (size_t)D;
    T *P = w.smem;
    T *dS = P + T_;
    for (int i = j + lane; i < T_; i += 32) {
        const size_t ri = bh * (size_t)T_ + (size_t)i;
        const T p = kg_attn_exp(scale * kg_attn_dot<T, SD>(base + (size_t)i * ld, k, D) - lse[ri]);
        const T dp = kg_attn_dot<T, SD>(dObase + (size_t)i * (size_t)C, v, D);
        P[i] = p;
        dS[i] = (T)((double)p * ((double)dp - delta[ri]));
    }
    __syncwarp();
    S *dk = dqkv + ((size_t)b * (size_t)T_ + (size_t)j) * ld + C + (size_t)h * (size_t)D;
    S *dv = dk + C;
    for (int d = lane; d < D; d += 32) {
        double ak = 0.0, av = 0.0;
        for (int i = j; i < T_; i++) {
            ak += (double)dS[i] * (double)kg_ld<T, SD>(base[(size_t)i * ld + d]);
            av += (double)P[i] * (double)kg_ld<T, SD>(dObase[(size_t)i * (size_t)C + d]);
        }
        dk[d] = kg_st<T, SD>(kg_attn_round((T)(ak * (double)scale), round_dtype));
        dv[d] = kg_st<T, SD>(kg_attn_round((T)av, round_dtype));
    }
}

template <typename T, int SD>
static cudaError_t kg_attn_bwd_t(cudaStream_t st, void *dqkv, const void *dout, const void *qkv, const void *out,
                                 const void *lse, int B, int T_, int C, int NH, int round_dtype, double *work) {
    typedef typename kg_storage<SD>::type S;
    const size_t rows = (size_t)B * (size_t)NH * (size_t)T_;
    kg_attn_delta_kernel<T, SD><<<kg_grid(rows), KG_THREADS, 0, st>>>(work, (const S *)dout, (const S *)out, B, T_,
                                                                       C, NH);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const T scale = (T)(1.0 / sqrt((double)(C / NH)));
    const int w1 = kg_attn_warps((size_t)T_ * sizeof(T)), w2 = kg_attn_warps(2 * (size_t)T_ * sizeof(T));
    if (w1 < 1 || w2 < 1) return cudaErrorInvalidValue;
    const size_t g1 = (rows + (size_t)w1 - 1) / (size_t)w1, g2 = (rows + (size_t)w2 - 1) / (size_t)w2;
    if (g1 > 0x7fffffffu || g2 > 0x7fffffffu) return cudaErrorInvalidValue;
    kg_attn_dq_kernel<T, SD><<<(unsigned)g1, 32 * w1, (size_t)w1 * (size_t)T_ * sizeof(T), st>>>(
        (S *)dqkv, (const S *)dout, (const S *)qkv, (const T *)lse, work, B, T_, C, NH, scale, round_dtype, w1);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    kg_attn_dkv_kernel<T, SD><<<(unsigned)g2, 32 * w2, (size_t)w2 * 2 * (size_t)T_ * sizeof(T), st>>>(
        (S *)dqkv, (const S *)dout, (const S *)qkv, (const T *)lse, work, B, T_, C, NH, scale, round_dtype, w2);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_attention_backward(cudaStream_t s, int fdt, void *dqkv, const void *dout, const void *qkv,
                                             const void *out, const void *lse, int B, int T, int C, int NH,
                                             int round_dtype, double *work) {
    if (!kg_attn_dtypes_ok(fdt, round_dtype) || B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH != 0 || !work)
        return cudaErrorInvalidValue;
    if (T > kg_attention_max_T(fdt)) return cudaErrorInvalidValue;
    switch (fdt) {
    case KG_F32: return kg_attn_bwd_t<float, KG_F32>(s, dqkv, dout, qkv, out, lse, B, T, C, NH, round_dtype, work);
    case KG_F16: return kg_attn_bwd_t<float, KG_F16>(s, dqkv, dout, qkv, out, lse, B, T, C, NH, KG_F32, work);
    case KG_BF16: return kg_attn_bwd_t<float, KG_BF16>(s, dqkv, dout, qkv, out, lse, B, T, C, NH, KG_F32, work);
    default: return kg_attn_bwd_t<double, KG_F64>(s, dqkv, dout, qkv, out, lse, B, T, C, NH, KG_F32, work);
    }
}

/* ====================================================== the GEMM path ===
 * The steps between cuda_seq.c's cuBLASLt products (see kg_kernels.h):
 * heads split out of the packed layouts into head-major operands of the
 * products' dtype and merged back, the causal softmax of each score row,
 * the probabilities recomputed from lse, and dS = P * (dP - Delta). One warp
 * per score row; the sums in double over a fixed warp tree. */

/* SD: src's storage (the data's dtype; or 1.7's 16-bit activations, then
 * OP == SD and the split is a copy). */
template <int SD, int OP>
__global__ void kg_heads_split_kernel(const typename kg_storage<SD>::type *src, size_t ld, int T_, int NH, int D,
                                      size_t n, typename kg_storage<OP>::type *dst, size_t hs) {
    KG_GRID_STRIDE(e, n) {
        const size_t td = e % ((size_t)D * (size_t)T_), bh = e / ((size_t)D * (size_t)T_);
        const size_t d = td % (size_t)D, t = td / (size_t)D, b = bh / (size_t)NH, h = bh % (size_t)NH;
        dst[bh * hs + td] = kg_convert<OP, SD>(src[(b * (size_t)T_ + t) * ld + h * (size_t)D + d]);
    }
}

/* The merge into 16-bit storage (ABI 1.7): float src, each value stored
 * rounded to nearest even (the float32 merge's rounding, as it is stored). */
template <int SD>
__global__ void kg_heads_merge16_kernel(uint16_t *dst, size_t ld, int T_, int NH, int D, size_t n, const float *src,
                                        size_t hs) {
    KG_GRID_STRIDE(e, n) {
        const size_t td = e % ((size_t)D * (size_t)T_), bh = e / ((size_t)D * (size_t)T_);
        const size_t d = td % (size_t)D, t = td / (size_t)D, b = bh / (size_t)NH, h = bh % (size_t)NH;
        dst[(b * (size_t)T_ + t) * ld + h * (size_t)D + d] = kg_st<float, SD>(src[bh * hs + td]);
    }
}

template <typename T>
__global__ void kg_heads_merge_kernel(T *dst, size_t ld, int T_, int NH, int D, size_t n, const T *src, size_t hs,
                                      int round_dtype) {
    KG_GRID_STRIDE(e, n) {
        const size_t td = e % ((size_t)D * (size_t)T_), bh = e / ((size_t)D * (size_t)T_);
        const size_t d = td % (size_t)D, t = td / (size_t)D, b = bh / (size_t)NH, h = bh % (size_t)NH;
        dst[(b * (size_t)T_ + t) * ld + h * (size_t)D + d] = kg_attn_round(src[bh * hs + td], round_dtype);
    }
}

/* MODE 0: softmax (lse written, P = exp(s - max) / sum); 1: P = exp(s -
 * lse); 2: dS = P * (dP - delta). Above the diagonal: 0. */
template <typename T, int OP, int MODE>
__global__ void kg_attn_rows_kernel(const T *S, const T *dP, T *lse, const double *delta, int T_, size_t rows,
                                    size_t ts, typename kg_storage<OP>::type *out) {
    const int lane = (int)(threadIdx.x & 31u);
    const size_t r = (size_t)blockIdx.x * (KG_THREADS / 32) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int i = (int)(r % (size_t)T_);
    const size_t off = (r / (size_t)T_) * ts + (size_t)i * (size_t)T_; /* the row in its head's (T, T) */
    const T *s = S + off;
    typename kg_storage<OP>::type *o = out + off;
    const typename kg_storage<OP>::type zero = kg_convert<OP, kg_dtype_of<T>::value>((T)0);
    if constexpr (MODE == 0) {
        T mx = (T)-INFINITY;
        for (int j = lane; j <= i; j += 32) mx = s[j] > mx ? s[j] : mx;
        mx = kg_attn_warp_max(mx);
        double sum = 0.0;
        for (int j = lane; j <= i; j += 32) sum += (double)kg_attn_exp(s[j] - mx);
        sum = kg_attn_warp_sum(sum);
        if (lane == 0) lse[r] = (T)((double)mx + log(sum));
        const T inv = (T)(1.0 / sum);
        for (int j = lane; j < T_; j += 32)
            o[j] = j <= i ? kg_convert<OP, kg_dtype_of<T>::value>(kg_attn_exp(s[j] - mx) * inv) : zero;
    } else {
        const T l = lse[r];
        for (int j = lane; j < T_; j += 32) {
            if (j > i) {
                o[j] = zero;
                continue;
            }
            const T p = kg_attn_exp(s[j] - l);
            if constexpr (MODE == 1) o[j] = kg_convert<OP, kg_dtype_of<T>::value>(p);
            else o[j] = kg_convert<OP, kg_dtype_of<T>::value>((T)((double)p * ((double)dP[off + (size_t)j] - delta[r])));
        }
    }
}

#define KG_ATTN_OP_DISPATCH(op, CALL)                 \
    switch (op) {                                     \
    case KG_F32: CALL(KG_F32); break;                 \
    case KG_F64: CALL(KG_F64); break;                 \
    case KG_F16: CALL(KG_F16); break;                 \
    case KG_BF16: CALL(KG_BF16); break;               \
    default: return cudaErrorInvalidValue;            \
    }

/* the operand dtype a score type may feed: its own, or a 16-bit one beside float32 */
static bool kg_attn_op_ok(int fdt, int op) {
    return op == fdt || (fdt == KG_F32 && (op == KG_F16 || op == KG_BF16));
}

extern "C" cudaError_t kg_heads_split(cudaStream_t s, int fdt, const void *src, int ld, int B, int T, int NH, int D,
                                      void *dst, size_t hs, int op) {
    const int s16 = fdt == KG_F16 || fdt == KG_BF16; /* 1.7: 16-bit src, copied */
    if ((fdt != KG_F32 && fdt != KG_F64 && !s16) || (s16 ? op != fdt : !kg_attn_op_ok(fdt, op)) || B < 0 || T < 0 ||
        NH < 0 || D < 0 || hs < (size_t)T * (size_t)D)
        return cudaErrorInvalidValue;
    const size_t n = (size_t)B * (size_t)NH * (size_t)T * (size_t)D;
    if (n == 0) return cudaSuccess;
    if (s16) {
        if (fdt == KG_F16)
            kg_heads_split_kernel<KG_F16, KG_F16><<<kg_grid(n), KG_THREADS, 0, s>>>(
                (const uint16_t *)src, (size_t)ld, T, NH, D, n, (uint16_t *)dst, hs);
        else
            kg_heads_split_kernel<KG_BF16, KG_BF16><<<kg_grid(n), KG_THREADS, 0, s>>>(
                (const uint16_t *)src, (size_t)ld, T, NH, D, n, (uint16_t *)dst, hs);
        return cudaGetLastError();
    }
#define KG_SPLIT(OPV)                                                                                       \
    if (fdt == KG_F32)                                                                                      \
        kg_heads_split_kernel<KG_F32, OPV><<<kg_grid(n), KG_THREADS, 0, s>>>(                               \
            (const float *)src, (size_t)ld, T, NH, D, n, (typename kg_storage<OPV>::type *)dst, hs);        \
    else                                                                                                    \
        kg_heads_split_kernel<KG_F64, OPV><<<kg_grid(n), KG_THREADS, 0, s>>>(                               \
            (const double *)src, (size_t)ld, T, NH, D, n, (typename kg_storage<OPV>::type *)dst, hs)
    KG_ATTN_OP_DISPATCH(op, KG_SPLIT)
#undef KG_SPLIT
    return cudaGetLastError();
}

extern "C" cudaError_t kg_heads_merge(cudaStream_t s, int fdt, void *dst, int ld, int B, int T, int NH, int D,
                                      const void *src, size_t hs, int round_dtype) {
    const int s16 = fdt == KG_F16 || fdt == KG_BF16; /* 1.7: 16-bit dst, the store rounds */
    if ((fdt != KG_F32 && fdt != KG_F64 && !s16) || (s16 && round_dtype != fdt) || B < 0 || T < 0 || NH < 0 ||
        D < 0 || hs < (size_t)T * (size_t)D)
        return cudaErrorInvalidValue;
    const size_t n = (size_t)B * (size_t)NH * (size_t)T * (size_t)D;
    if (n == 0) return cudaSuccess;
    if (fdt == KG_F16)
        kg_heads_merge16_kernel<KG_F16><<<kg_grid(n), KG_THREADS, 0, s>>>((uint16_t *)dst, (size_t)ld, T, NH, D, n,
                                                                         (const float *)src, hs);
    else if (fdt == KG_BF16)
        kg_heads_merge16_kernel<KG_BF16><<<kg_grid(n), KG_THREADS, 0, s>>>((uint16_t *)dst, (size_t)ld, T, NH, D, n,
                                                                          (const float *)src, hs);
    else if (fdt == KG_F32)
        kg_heads_merge_kernel<float><<<kg_grid(n), KG_THREADS, 0, s>>>((float *)dst, (size_t)ld, T, NH, D, n,
                                                                      (const float *)src, hs, round_dtype);
    else
        kg_heads_merge_kernel<double><<<kg_grid(n), KG_THREADS, 0, s>>>((double *)dst, (size_t)ld, T, NH, D, n,
                                                                       (const double *)src, hs, KG_F32);
    return cudaGetLastError();
}

template <int MODE>
static cudaError_t kg_attn_rows(cudaStream_t s, int fdt, const void *S, const void *dP, void *lse,
                                const double *delta, int T, size_t rows, size_t ts, void *out, int op) {
    if ((fdt != KG_F32 && fdt != KG_F64) || !kg_attn_op_ok(fdt, op) || T <= 0 || ts < (size_t)T * (size_t)T ||
        rows % (size_t)T)
        return cudaErrorInvalidValue;
    if (rows == 0) return cudaSuccess;
    const size_t grid = (rows + KG_THREADS / 32 - 1) / (KG_THREADS / 32);
    if (grid > 0x7fffffffu) return cudaErrorInvalidValue;
#define KG_ROWS(OPV)                                                                                              \
    if (fdt == KG_F32)                                                                                            \
        kg_attn_rows_kernel<float, OPV, MODE><<<(unsigned)grid, KG_THREADS, 0, s>>>(                              \
            (const float *)S, (const float *)dP, (float *)lse, delta, T, rows, ts,                                \
            (typename kg_storage<OPV>::type *)out);                                                               \
    else                                                                                                          \
        kg_attn_rows_kernel<double, OPV, MODE><<<(unsigned)grid, KG_THREADS, 0, s>>>(                             \
            (const double *)S, (const double *)dP, (double *)lse, delta, T, rows, ts,                             \
            (typename kg_storage<OPV>::type *)out)
    KG_ATTN_OP_DISPATCH(op, KG_ROWS)
#undef KG_ROWS
    return cudaGetLastError();
}

extern "C" cudaError_t kg_attn_softmax(cudaStream_t s, int fdt, const void *S, int T, size_t rows, size_t ts,
                                       void *lse, void *P, int op) {
    return kg_attn_rows<0>(s, fdt, S, NULL, lse, NULL, T, rows, ts, P, op);
}

extern "C" cudaError_t kg_attn_probs(cudaStream_t s, int fdt, const void *S, const void *lse, int T, size_t rows,
                                     size_t ts, void *P, int op) {
    return kg_attn_rows<1>(s, fdt, S, NULL, (void *)lse, NULL, T, rows, ts, P, op);
}

extern "C" cudaError_t kg_attn_dscores(cudaStream_t s, int fdt, const void *S, const void *dP, const void *lse,
                                       const double *delta, int T, size_t rows, size_t ts, void *dS, int op) {
    return kg_attn_rows<2>(s, fdt, S, dP, (void *)lse, delta, T, rows, ts, dS, op);
}

extern "C" cudaError_t kg_attn_delta(cudaStream_t s, int fdt, const void *dout, const void *out, int B, int T, int C,
                                     int NH, double *delta) {
    if ((fdt != KG_F32 && fdt != KG_F64 && fdt != KG_F16 && fdt != KG_BF16) || B < 0 || T < 0 || C <= 0 || NH <= 0 ||
        C % NH)
        return cudaErrorInvalidValue;
    const size_t rows = (size_t)B * (size_t)NH * (size_t)T;
    if (rows == 0) return cudaSuccess;
    if (fdt == KG_F32)
        kg_attn_delta_kernel<float, KG_F32><<<kg_grid(rows), KG_THREADS, 0, s>>>(delta, (const float *)dout,
                                                                                (const float *)out, B, T, C, NH);
    else if (fdt == KG_F16)
        kg_attn_delta_kernel<float, KG_F16><<<kg_grid(rows), KG_THREADS, 0, s>>>(delta, (const uint16_t *)dout,
                                                                                (const uint16_t *)out, B, T, C, NH);
    else if (fdt == KG_BF16)
        kg_attn_delta_kernel<float, KG_BF16><<<kg_grid(rows), KG_THREADS, 0, s>>>(delta, (const uint16_t *)dout,
                                                                                 (const uint16_t *)out, B, T, C, NH);
    else
        kg_attn_delta_kernel<double, KG_F64><<<kg_grid(rows), KG_THREADS, 0, s>>>(delta, (const double *)dout,
                                                                         (const double *)out, B, T, C, NH);
    return cudaGetLastError();
}
