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

/* dot(a, b) over D in the data type, in increasing d. */
template <typename T> static __device__ __forceinline__ T kg_attn_dot(const T *a, const T *b, int D) {
    T s = (T)0;
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* Rows (warps) per block whose `per_row` shared elements fit. */
static int kg_attn_warps(size_t per_row_bytes) {
    size_t w = KG_ATTN_SMEM / (per_row_bytes ? per_row_bytes : 1);
    return w > KG_ATTN_WARPS ? KG_ATTN_WARPS : (int)w;
}

/* --------------------------------------------------------------- forward */

/* Warp w of block b: row r = b * warps + w of the (B, NH, T) rows. */
template <typename T>
__global__ void kg_attn_fwd_kernel(T *out, T *lse, const T *qkv, int B, int T_, int C, int NH, T scale,
                                   int round_dtype, int warps) {
    extern __shared__ unsigned char kg_attn_smem[];
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    const size_t r = (size_t)blockIdx.x * (size_t)warps + (size_t)warp;
    if (warp >= warps || r >= (size_t)B * (size_t)NH * (size_t)T_) return;
    const int i = (int)(r % (size_t)T_), h = (int)((r / (size_t)T_) % (size_t)NH), b = (int)(r / ((size_t)T_ * NH));
    const int D = C / NH;
    const size_t ld = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * (size_t)T_ * ld + (size_t)h * (size_t)D;
    const T *q = base + (size_t)i * ld;
    T *s = (T *)kg_attn_smem + (size_t)warp * (size_t)T_;
    T mx = (T)-INFINITY;
    for (int j = lane; j <= i; j += 32) {
        const T v = scale * kg_attn_dot(q, base + (size_t)j * ld + C, D);
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
    T *o = out + ((size_t)b * (size_t)T_ + (size_t)i) * (size_t)C + (size_t)h * (size_t)D;
    for (int d = lane; d < D; d += 32) {
        double acc = 0.0;
        for (int j = 0; j <= i; j++) acc += (double)s[j] * (double)base[(size_t)j * ld + 2 * (size_t)C + d];
        o[d] = kg_attn_round((T)(acc / sum), round_dtype);
    }
}

template <typename T>
static cudaError_t kg_attn_fwd_t(cudaStream_t st, void *out, void *lse, const void *qkv, int B, int T_, int C, int NH,
                                 int round_dtype) {
    const int warps = kg_attn_warps((size_t)T_ * sizeof(T));
    if (warps < 1) return cudaErrorInvalidValue;
    const size_t rows = (size_t)B * (size_t)NH * (size_t)T_;
    const size_t grid = (rows + (size_t)warps - 1) / (size_t)warps;
    if (grid > 0x7fffffffu) return cudaErrorInvalidValue;
    const T scale = (T)(1.0 / sqrt((double)(C / NH)));
    kg_attn_fwd_kernel<T><<<(unsigned)grid, 32 * warps, (size_t)warps * (size_t)T_ * sizeof(T), st>>>(
        (T *)out, (T *)lse, (const T *)qkv, B, T_, C, NH, scale, round_dtype, warps);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_attention_forward(cudaStream_t s, int fdt, void *out, void *lse, const void *qkv, int B,
                                            int T, int C, int NH, int round_dtype) {
    if ((fdt != KG_F32 && fdt != KG_F64) || B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH != 0)
        return cudaErrorInvalidValue;
    if (T > kg_attention_max_T(fdt)) return cudaErrorInvalidValue;
    if (round_dtype != KG_F32 && !(fdt == KG_F32 && (round_dtype == KG_F16 || round_dtype == KG_BF16)) &&
        !(fdt == KG_F64 && round_dtype == KG_F64))
        return cudaErrorInvalidValue;
    return fdt == KG_F32 ? kg_attn_fwd_t<float>(s, out, lse, qkv, B, T, C, NH, round_dtype)
                         : kg_attn_fwd_t<double>(s, out, lse, qkv, B, T, C, NH, KG_F32);
}

/* -------------------------------------------------------------- backward */

/* Delta(B, NH, T) = sum_d dout * out over the head's columns, in double. */
template <typename T>
__global__ void kg_attn_delta_kernel(double *delta, const T *dout, const T *out, int B, int T_, int C, int NH) {
    const size_t rows = (size_t)B * (size_t)NH * (size_t)T_;
    const int D = C / NH;
    KG_GRID_STRIDE(r, rows) {
        const int i = (int)(r % (size_t)T_), h = (int)((r / (size_t)T_) % (size_t)NH),
                  b = (int)(r / ((size_t)T_ * NH));
        const size_t off = ((size_t)b * (size_t)T_ + (size_t)i) * (size_t)C + (size_t)h * (size_t)D;
        double s = 0.0;
        for (int d = 0; d < D; d++) s += (double)dout[off + d] * (double)out[off + d];
        delta[r] = s;
    }
}

/* dQ: warp per query row i; dS over keys j <= i kept in shared memory. */
template <typename T>
__global__ void kg_attn_dq_kernel(T *dqkv, const T *dout, const T *qkv, const T *lse, const double *delta, int B,
                                  int T_, int C, int NH, T scale, int round_dtype, int warps) {
    extern __shared__ unsigned char kg_attn_smem[];
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    const size_t r = (size_t)blockIdx.x * (size_t)warps + (size_t)warp;
    if (warp >= warps || r >= (size_t)B * (size_t)NH * (size_t)T_) return;
    const int i = (int)(r % (size_t)T_), h = (int)((r / (size_t)T_) % (size_t)NH), b = (int)(r / ((size_t)T_ * NH));
    const int D = C / NH;
    const size_t ld = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * (size_t)T_ * ld + (size_t)h * (size_t)D;
    const T *q = base + (size_t)i * ld;
    const T *dO = dout + ((size_t)b * (size_t)T_ + (size_t)i) * (size_t)C + (size_t)h * (size_t)D;
    const T l = lse[r];
    const double dl = delta[r];
    T *ds = (T *)kg_attn_smem + (size_t)warp * (size_t)T_;
    for (int j = lane; j <= i; j += 32) {
        const T p = kg_attn_exp(scale * kg_attn_dot(q, base + (size_t)j * ld + C, D) - l);
        const T dp = kg_attn_dot(dO, base + (size_t)j * ld + 2 * (size_t)C, D);
        ds[j] = (T)((double)p * ((double)dp - dl));
    }
    __syncwarp();
    T *dq = dqkv + ((size_t)b * (size_t)T_ + (size_t)i) * ld + (size_t)h * (size_t)D;
    for (int d = lane; d < D; d += 32) {
        double acc = 0.0;
        for (int j = 0; j <= i; j++) acc += (double)ds[j] * (double)base[(size_t)j * ld + C + d];
        dq[d] = kg_attn_round((T)(acc * (double)scale), round_dtype);
    }
}

/* dK, dV: warp per key row j; P and dS over queries i >= j in shared. */
template <typename T>
__global__ void kg_attn_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const T *lse, const double *delta, int B,
                                   int T_, int C, int NH, T scale, int round_dtype, int warps) {
    extern __shared__ unsigned char kg_attn_smem[];
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    const size_t r = (size_t)blockIdx.x * (size_t)warps + (size_t)warp;
    if (warp >= warps || r >= (size_t)B * (size_t)NH * (size_t)T_) return;
    const int j = (int)(r % (size_t)T_), h = (int)((r / (size_t)T_) % (size_t)NH), b = (int)(r / ((size_t)T_ * NH));
    const int D = C / NH;
    const size_t ld = 3 * (size_t)C;
    const size_t bh = (size_t)b * (size_t)NH + (size_t)h;
    const T *base = qkv + (size_t)b * (size_t)T_ * ld + (size_t)h * (size_t)D;
    const T *k = base + (size_t)j * ld + C, *v = base + (size_t)j * ld + 2 * (size_t)C;
    const T *dObase = dout + (size_t)b * (size_t)T_ * (size_t)C + (size_t)h * (size_t)D;
    T *P = (T *)kg_attn_smem + (size_t)warp * 2 * (size_t)T_;
    T *dS = P + T_;
    for (int i = j + lane; i < T_; i += 32) {
        const size_t ri = bh * (size_t)T_ + (size_t)i;
        const T p = kg_attn_exp(scale * kg_attn_dot(base + (size_t)i * ld, k, D) - lse[ri]);
        const T dp = kg_attn_dot(dObase + (size_t)i * (size_t)C, v, D);
        P[i] = p;
        dS[i] = (T)((double)p * ((double)dp - delta[ri]));
    }
    __syncwarp();
    T *dk = dqkv + ((size_t)b * (size_t)T_ + (size_t)j) * ld + C + (size_t)h * (size_t)D;
    T *dv = dk + C;
    for (int d = lane; d < D; d += 32) {
        double ak = 0.0, av = 0.0;
        for (int i = j; i < T_; i++) {
            ak += (double)dS[i] * (double)base[(size_t)i * ld + d];
            av += (double)P[i] * (double)dObase[(size_t)i * (size_t)C + d];
        }
        dk[d] = kg_attn_round((T)(ak * (double)scale), round_dtype);
        dv[d] = kg_attn_round((T)av, round_dtype);
    }
}

template <typename T>
static cudaError_t kg_attn_bwd_t(cudaStream_t st, void *dqkv, const void *dout, const void *qkv, const void *out,
                                 const void *lse, int B, int T_, int C, int NH, int round_dtype, double *work) {
    const size_t rows = (size_t)B * (size_t)NH * (size_t)T_;
    kg_attn_delta_kernel<T><<<kg_grid(rows), KG_THREADS, 0, st>>>(work, (const T *)dout, (const T *)out, B, T_, C, NH);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const T scale = (T)(1.0 / sqrt((double)(C / NH)));
    const int w1 = kg_attn_warps((size_t)T_ * sizeof(T)), w2 = kg_attn_warps(2 * (size_t)T_ * sizeof(T));
    if (w1 < 1 || w2 < 1) return cudaErrorInvalidValue;
    const size_t g1 = (rows + (size_t)w1 - 1) / (size_t)w1, g2 = (rows + (size_t)w2 - 1) / (size_t)w2;
    if (g1 > 0x7fffffffu || g2 > 0x7fffffffu) return cudaErrorInvalidValue;
    kg_attn_dq_kernel<T><<<(unsigned)g1, 32 * w1, (size_t)w1 * (size_t)T_ * sizeof(T), st>>>(
        (T *)dqkv, (const T *)dout, (const T *)qkv, (const T *)lse, work, B, T_, C, NH, scale, round_dtype, w1);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    kg_attn_dkv_kernel<T><<<(unsigned)g2, 32 * w2, (size_t)w2 * 2 * (size_t)T_ * sizeof(T), st>>>(
        (T *)dqkv, (const T *)dout, (const T *)qkv, (const T *)lse, work, B, T_, C, NH, scale, round_dtype, w2);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_attention_backward(cudaStream_t s, int fdt, void *dqkv, const void *dout, const void *qkv,
                                             const void *out, const void *lse, int B, int T, int C, int NH,
                                             int round_dtype, double *work) {
    if ((fdt != KG_F32 && fdt != KG_F64) || B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH != 0 || !work)
        return cudaErrorInvalidValue;
    if (T > kg_attention_max_T(fdt)) return cudaErrorInvalidValue;
    if (round_dtype != KG_F32 && !(fdt == KG_F32 && (round_dtype == KG_F16 || round_dtype == KG_BF16)) &&
        !(fdt == KG_F64 && round_dtype == KG_F64))
        return cudaErrorInvalidValue;
    return fdt == KG_F32 ? kg_attn_bwd_t<float>(s, dqkv, dout, qkv, out, lse, B, T, C, NH, round_dtype, work)
                         : kg_attn_bwd_t<double>(s, dqkv, dout, qkv, out, lse, B, T, C, NH, KG_F32, work);
}
