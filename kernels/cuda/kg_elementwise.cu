/*
 * kg_elementwise.cu: the per-element launchers of kg_kernels.h: bias add and
 * bias gradient, the five activations forward and backward, scale, axpy, the
 * fused unscale + finiteness check over a list of tensors, the Linear
 * layer's bias/rounding/activation epilogue, dtype casts, rounding through
 * the 16-bit formats and the two FP8 formats (kernels/common/km_fp8.h) and
 * the rounded gemm_ex epilogue. Each kernel is a grid-stride
 * loop (size_t indices) over one element formula from kg_math.cuh,
 * instantiated per dtype (and activation, cast pair, rounding format) so no
 * dtype test runs per element. Kernels that need a row/column split of a
 * flat index use 32-bit division when the matrix has fewer than 2^32
 * elements (64-bit division is several times slower on the GPU) and 64-bit
 * otherwise. bias_grad is a two-pass column reduction in a fixed order
 * (kg_kernels.h): the same bits on every run, within the summation bound of
 * the CPU's row-order sum; act_bias_backward (1.11) is its first pass with
 * the activation's backward applied and stored on the way.
 */
#include "kg_internal.cuh"
#include "kg_kernels.h"

#include "../common/km_fp8.h"

/* The run-time act id as a compile-time one: calls launch(kg_act_c<A>())
 * for A = act (-1, no activation, only where allow_none), then returns the
 * launch's error; an unknown id is cudaErrorInvalidValue. Every kernel
 * templated on the activation is launched through it. */
template <int A> struct kg_act_c {
    static constexpr int value = A;
};
template <typename L> static cudaError_t kg_with_act(int act, bool allow_none, L &&launch) {
    switch (act) {
    case -1:
        if (!allow_none) return cudaErrorInvalidValue;
        launch(kg_act_c<-1>());
        break;
    case KG_ACT_RELU: launch(kg_act_c<KG_ACT_RELU>()); break;
    case KG_ACT_GELU: launch(kg_act_c<KG_ACT_GELU>()); break;
    case KG_ACT_TANH: launch(kg_act_c<KG_ACT_TANH>()); break;
    case KG_ACT_SIGMOID: launch(kg_act_c<KG_ACT_SIGMOID>()); break;
    case KG_ACT_LEAKY_RELU: launch(kg_act_c<KG_ACT_LEAKY_RELU>()); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* ------------------------------------------------------------------- bias */

/* y(rows, cols) += b(cols), flat over total = rows * cols elements. */
template <typename T, typename IdxT>
__global__ void kg_bias_add_kernel(T *__restrict__ y, const T *__restrict__ b, size_t total, IdxT cols) {
    KG_GRID_STRIDE(i, total) {
        const IdxT j = (IdxT)i % cols;
        y[i] = y[i] + b[j];
    }
}

template <typename T> static cudaError_t kg_bias_add_t(cudaStream_t s, T *y, const T *b, int rows, int cols) {
    const size_t total = (size_t)rows * (size_t)cols;
    if (total <= UINT32_MAX)
        kg_bias_add_kernel<T, uint32_t><<<kg_grid(total), KG_THREADS, 0, s>>>(y, b, total, (uint32_t)cols);
    else
        kg_bias_add_kernel<T, size_t><<<kg_grid(total), KG_THREADS, 0, s>>>(y, b, total, (size_t)cols);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_bias_add(cudaStream_t s, int fdt, void *y, const void *b, int rows, int cols) {
    if (fdt != KG_F32 && fdt != KG_F64) return cudaErrorInvalidValue;
    if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
    if (rows == 0 || cols == 0) return cudaSuccess;
    if (fdt == KG_F32) return kg_bias_add_t(s, (float *)y, (const float *)b, rows, cols);
    return kg_bias_add_t(s, (double *)y, (const double *)b, rows, cols);
}

/*
 * db(cols) = (accumulate ? db : 0) + sum over rows of dy(rows, cols), in the
 * order kg_kernels.h fixes. One thread per column, as before, summed 8192
 * rows one after another (a millisecond for batch 8192 beside a ~5 ms
 * step): too few threads, and each a long dependent chain. Now pass 1 runs a
 * (cols / 32, parts) grid of 32 x KG_BIAS_GRAD_LANES blocks: block (bx, p)
 * takes 32 neighbouring columns of part p's rows (each row's 32 loads
 * coalesce), every thread sums KG_BIAS_GRAD_ROWS / LANES rows of its column,
 * and the LANES sums of a column are added in lane order through shared
 * memory. Pass 2 (only with more than one part) adds the parts of each
 * column in order. Neither order depends on the grid or on timing.
 */
#define KG_BG_COLS 32 /* columns per pass-1 block (a warp across a row) */

/* ACT >= 0 (ABI 1.11's act_bias_backward): each element visited is first
 * dx = act_backward(dy, x), stored, and the sum adds dx as stored. Every
 * element is visited by exactly one thread, so dx may be dy, and the sums
 * are those kg_bias_grad forms over the dx kg_act_backward writes: the
 * same order, and the same rounding as it is stored. */
template <typename T, int SD, int ACT>
__global__ void kg_bias_grad_parts_kernel(T *__restrict__ out, typename kg_storage<SD>::type *dx,
                                          const typename kg_storage<SD>::type *dy,
                                          const typename kg_storage<SD>::type *x, size_t rows, size_t cols,
                                          size_t parts, int direct, int accumulate) {
    __shared__ T lane_sum[KG_BIAS_GRAD_LANES][KG_BG_COLS + 1];
    const size_t j = (size_t)blockIdx.x * KG_BG_COLS + threadIdx.x;
    /* gridDim.y is capped at 65535: more parts take a stride */
    for (size_t p = blockIdx.y; p < parts; p += gridDim.y) {
        const size_t r0 = p * KG_BIAS_GRAD_ROWS;
        const size_t r1 = r0 + KG_BIAS_GRAD_ROWS < rows ? r0 + KG_BIAS_GRAD_ROWS : rows;
        T acc = (T)0;
        if (j < cols)
            for (size_t r = r0 + threadIdx.y; r < r1; r += KG_BIAS_GRAD_LANES) {
                const size_t e = r * cols + j;
                /* dy through the read-only cache (__ldg) only where this
                 * kernel writes nothing: with an activation, dx may be dy
                 * (act_bias_backward in place), and the non-coherent path
                 * is defined only for data no thread writes during the
                 * kernel; x stays read-only either way */
                if constexpr (ACT < 0) {
                    acc = acc + kg_ld<T, SD>(__ldg(dy + e));
                } else {
                    const typename kg_storage<SD>::type d =
                        kg_st<T, SD>(kg_act_bwd<ACT>(kg_ld<T, SD>(dy[e]), kg_ld<T, SD>(__ldg(x + e))));
                    dx[e] = d;
                    acc = acc + kg_ld<T, SD>(d);
                }
            }
        lane_sum[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.y == 0 && j < cols) {
            T part = lane_sum[0][threadIdx.x];
            for (int l = 1; l < KG_BIAS_GRAD_LANES; l++) part = part + lane_sum[l][threadIdx.x];
            if (direct) out[j] = (accumulate ? out[j] : (T)0) + part; /* one part: out is db */
            else out[p * cols + j] = part;
        }
        __syncthreads(); /* lane_sum is reused by the next part */
    }
}

/* db(cols) = init + work(0, j) + work(1, j) + ... in part order. */
template <typename T>
__global__ void kg_bias_grad_sum_kernel(T *__restrict__ db, const T *__restrict__ work, size_t parts, size_t cols,
                                        int accumulate) {
    KG_GRID_STRIDE(j, cols) {
        T acc = accumulate ? db[j] : (T)0;
        for (size_t p = 0; p < parts; p++) acc = acc + work[p * cols + j];
        db[j] = acc;
    }
}

/* T the sums' type, SD dy's storage (T's own dtype, or 16 bits with float
 * sums: ABI 1.7's activation storage, db and the partials float32). act
 * -1: the bias gradient of dy; else of dx = act_backward(dy, x), which is
 * written (act_bias_backward). */
template <typename T, int SD>
static cudaError_t kg_bias_grad_t(cudaStream_t s, T *db, const void *dy, int rows, int cols, int accumulate,
                                  T *work, int act = -1, void *dx = NULL, const void *x = NULL) {
    typedef typename kg_storage<SD>::type S;
    const size_t r = (size_t)rows, c = (size_t)cols, parts = kg_bias_grad_parts(rows);
    const int direct = parts == 1;
    if (!direct && !work) return cudaErrorInvalidValue;
    const dim3 block(KG_BG_COLS, KG_BIAS_GRAD_LANES);
    const dim3 grid((unsigned)((c + KG_BG_COLS - 1) / KG_BG_COLS), (unsigned)(parts < 65535 ? parts : 65535));
    cudaError_t e = kg_with_act(act, true, [&](auto a) {
        kg_bias_grad_parts_kernel<T, SD, decltype(a)::value><<<grid, block, 0, s>>>(
            direct ? db : work, (S *)dx, (const S *)dy, (const S *)x, r, c, parts, direct, accumulate);
    });
    if (e != cudaSuccess || direct) return e;
    kg_bias_grad_sum_kernel<T><<<kg_grid(c), KG_THREADS, 0, s>>>(db, work, parts, c, accumulate);
    return cudaGetLastError();
}

/* The checks and dtype switch of kg_bias_grad (act -1) and of 1.11's
 * kg_act_bias_backward (act a KG_ACT_*, dx written). */
static cudaError_t kg_bias_grad_act(cudaStream_t s, int fdt, int act, void *dx, void *db, const void *dy,
                                    const void *x, int rows, int cols, int accumulate, void *work) {
    if (fdt != KG_F32 && fdt != KG_F64 && fdt != KG_F16 && fdt != KG_BF16) return cudaErrorInvalidValue;
    if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
    /* rows == 0 still zeroes db unless accumulating (one empty part). */
    if (cols == 0 || (rows == 0 && accumulate)) return cudaSuccess;
    const int a = accumulate != 0;
    switch (fdt) {
    case KG_F32: return kg_bias_grad_t<float, KG_F32>(s, (float *)db, dy, rows, cols, a, (float *)work, act, dx, x);
    case KG_F16: return kg_bias_grad_t<float, KG_F16>(s, (float *)db, dy, rows, cols, a, (float *)work, act, dx, x);
    case KG_BF16: return kg_bias_grad_t<float, KG_BF16>(s, (float *)db, dy, rows, cols, a, (float *)work, act, dx, x);
    default: return kg_bias_grad_t<double, KG_F64>(s, (double *)db, dy, rows, cols, a, (double *)work, act, dx, x);
    }
}

extern "C" cudaError_t kg_bias_grad(cudaStream_t s, int fdt, void *db, const void *dy, int rows, int cols,
                                    int accumulate, void *work) {
    return kg_bias_grad_act(s, fdt, -1, NULL, db, dy, NULL, rows, cols, accumulate, work);
}

/* ------------------------------------------------------------ activations */

/* y(n) = act(x); y may equal x (each element reads only its own input). */
template <int ACT, typename T> __global__ void kg_act_fwd_kernel(T *y, const T *x, size_t n) {
    KG_GRID_STRIDE(i, n) y[i] = kg_act_fwd<ACT>(x[i]);
}

/* dx(n) = dy * act'(x); dx may equal dy. T the arithmetic, SD the storage
 * of all three (T's own dtype, or 16 bits with float arithmetic: 1.7). */
template <int ACT, typename T, int SD>
__global__ void kg_act_bwd_kernel(typename kg_storage<SD>::type *dx, const typename kg_storage<SD>::type *dy,
                                  const typename kg_storage<SD>::type *__restrict__ x, size_t n) {
    KG_GRID_STRIDE(i, n) dx[i] = kg_st<T, SD>(kg_act_bwd<ACT>(kg_ld<T, SD>(dy[i]), kg_ld<T, SD>(x[i])));
}

template <typename T> static cudaError_t kg_act_fwd_t(cudaStream_t s, int act, T *y, const T *x, size_t n) {
    const unsigned g = kg_grid(n);
    return kg_with_act(act, false, [&](auto a) {
        kg_act_fwd_kernel<decltype(a)::value, T><<<g, KG_THREADS, 0, s>>>(y, x, n);
    });
}

template <typename T, int SD>
static cudaError_t kg_act_bwd_t(cudaStream_t s, int act, void *dx_, const void *dy_, const void *x_, size_t n) {
    typedef typename kg_storage<SD>::type S;
    S *dx = (S *)dx_;
    const S *dy = (const S *)dy_, *x = (const S *)x_;
    const unsigned g = kg_grid(n);
    return kg_with_act(act, false, [&](auto a) {
        kg_act_bwd_kernel<decltype(a)::value, T, SD><<<g, KG_THREADS, 0, s>>>(dx, dy, x, n);
    });
}

static int kg_act_valid(int act) { return act >= KG_ACT_RELU && act <= KG_ACT_LEAKY_RELU; }

extern "C" cudaError_t kg_act_forward(cudaStream_t s, int fdt, int act, void *y, const void *x, size_t n) {
    if ((fdt != KG_F32 && fdt != KG_F64) || !kg_act_valid(act)) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (fdt == KG_F32) return kg_act_fwd_t(s, act, (float *)y, (const float *)x, n);
    return kg_act_fwd_t(s, act, (double *)y, (const double *)x, n);
}

extern "C" cudaError_t kg_act_backward(cudaStream_t s, int fdt, int act, void *dx, const void *dy, const void *x,
                                       size_t n) {
    if ((fdt != KG_F32 && fdt != KG_F64 && fdt != KG_F16 && fdt != KG_BF16) || !kg_act_valid(act))
        return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    switch (fdt) {
    case KG_F32: return kg_act_bwd_t<float, KG_F32>(s, act, dx, dy, x, n);
    case KG_F16: return kg_act_bwd_t<float, KG_F16>(s, act, dx, dy, x, n);
    case KG_BF16: return kg_act_bwd_t<float, KG_BF16>(s, act, dx, dy, x, n);
    default: return kg_act_bwd_t<double, KG_F64>(s, act, dx, dy, x, n);
    }
}

/* ABI 1.11: kg_act_backward, then kg_bias_grad of the dx it wrote, in one
 * pass over the gradient (the bias sum's pass 1, which also applies the
 * activation's backward and stores dx). */
extern "C" cudaError_t kg_act_bias_backward(cudaStream_t s, int fdt, int act, void *dx, void *db, const void *dy,
                                            const void *x, int rows, int cols, int accumulate, void *work) {
    if (!kg_act_valid(act) || rows < 0 || cols < 0) return cudaErrorInvalidValue;
    if (!db) return kg_act_backward(s, fdt, act, dx, dy, x, (size_t)rows * (size_t)cols);
    return kg_bias_grad_act(s, fdt, act, dx, db, dy, x, rows, cols, accumulate, work);
}

/* ----------------------------------------------------------------- BLAS-1 */

/* x(n) *= a */
template <typename T> __global__ void kg_scale_kernel(T *__restrict__ x, T a, size_t n) {
    KG_GRID_STRIDE(i, n) x[i] = x[i] * a;
}

/* The same on 16-bit storage SD: widened, multiplied in float, rounded. */
template <int SD> __global__ void kg_scale16_kernel(uint16_t *__restrict__ x, float a, size_t n) {
    KG_GRID_STRIDE(i, n) x[i] = kg_convert<SD, KG_F32>(kg_convert<KG_F32, SD>(x[i]) * a);
}

/* y(n) += a * x(n), product rounded first */
template <typename T> __global__ void kg_axpy_kernel(T *__restrict__ y, T a, const T *__restrict__ x, size_t n) {
    KG_GRID_STRIDE(i, n) y[i] = kg_axpy_elem(y[i], a, x[i]);
}

/* Every x[t] of the list *= a, and *nonfinite = 1 if any product is
 * inf/NaN (an overflow of the multiply counts, as on the cpu: the check
 * follows scale). blockIdx.y picks the tensor, the x blocks stride over it.
 * Every writer stores the same 1, so the unordered stores need no atomics. */
template <typename T>
__global__ void kg_unscale_check_kernel(const kg_list list, T a, int32_t *__restrict__ nonfinite) {
    T *__restrict__ x = (T *)list.x[blockIdx.y];
    const size_t n = list.n[blockIdx.y];
    int bad = 0;
    KG_GRID_STRIDE(i, n) {
        const T v = x[i] * a;
        bad |= kg_nonfinite<kg_dtype_of<T>::value>(v);
        x[i] = v;
    }
    if (bad) *nonfinite = 1;
}

extern "C" cudaError_t kg_scale(cudaStream_t s, int fdt, void *x, double a, size_t n) {
    if (fdt != KG_F32 && fdt != KG_F64 && fdt != KG_F16 && fdt != KG_BF16) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (fdt == KG_F16 || fdt == KG_BF16) {
        if (fdt == KG_F16)
            kg_scale16_kernel<KG_F16><<<kg_grid(n), KG_THREADS, 0, s>>>((uint16_t *)x, kg_scalar<float>(a), n);
        else
            kg_scale16_kernel<KG_BF16><<<kg_grid(n), KG_THREADS, 0, s>>>((uint16_t *)x, kg_scalar<float>(a), n);
        return cudaGetLastError();
    }
    if (fdt == KG_F32) kg_scale_kernel<float><<<kg_grid(n), KG_THREADS, 0, s>>>((float *)x, kg_scalar<float>(a), n);
    else kg_scale_kernel<double><<<kg_grid(n), KG_THREADS, 0, s>>>((double *)x, kg_scalar<double>(a), n);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_axpy(cudaStream_t s, int fdt, void *y, double a, const void *x, size_t n) {
    if (fdt != KG_F32 && fdt != KG_F64) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (fdt == KG_F32)
        kg_axpy_kernel<float><<<kg_grid(n), KG_THREADS, 0, s>>>((float *)y, kg_scalar<float>(a), (const float *)x, n);
    else
        kg_axpy_kernel<double><<<kg_grid(n), KG_THREADS, 0, s>>>((double *)y, kg_scalar<double>(a),
                                                                 (const double *)x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_unscale_check(cudaStream_t s, int fdt, const kg_list *list, double a,
                                        int32_t *nonfinite) {
    if (fdt != KG_F32 && fdt != KG_F64) return cudaErrorInvalidValue;
    if (list->count < 0 || list->count > KG_LIST_MAX) return cudaErrorInvalidValue;
    size_t most = 0;
    for (int t = 0; t < list->count; t++) most = list->n[t] > most ? list->n[t] : most;
    if (most == 0) return cudaSuccess;
    /* the grid's x covers the largest tensor; smaller ones leave blocks idle */
    const dim3 grid(kg_grid(most), (unsigned)list->count);
    if (fdt == KG_F32)
        kg_unscale_check_kernel<float><<<grid, KG_THREADS, 0, s>>>(*list, kg_scalar<float>(a), nonfinite);
    else
        kg_unscale_check_kernel<double><<<grid, KG_THREADS, 0, s>>>(*list, kg_scalar<double>(a), nonfinite);
    return cudaGetLastError();
}

/* ------------------------------------------------------ Linear epilogue */

/* What linear_forward's cuBLASLt epilogue left to do, in one pass over
 * y(total = rows * cols): v = y + b[col] (b may be NULL), rounded through
 * rdt (float only; F32: not), stored to y; post = rdt(act(v)) for ACT >= 0. */
template <typename T, int ACT, typename IdxT>
__global__ void kg_linear_epilogue_kernel(T *__restrict__ y, const T *__restrict__ b, T *__restrict__ post,
                                          size_t total, IdxT cols, int rdt) {
    KG_GRID_STRIDE(i, total) {
        T v = y[i];
        if (b) v = v + b[(IdxT)i % cols];
        if constexpr (sizeof(T) == sizeof(float)) v = kg_round_to_dtype(v, rdt);
        y[i] = v;
        if constexpr (ACT >= 0) {
            T p = kg_act_fwd<ACT>(v);
            if constexpr (sizeof(T) == sizeof(float)) p = kg_round_to_dtype(p, rdt);
            post[i] = p;
        }
    }
}

template <typename T, int ACT>
static void kg_linear_epilogue_launch(cudaStream_t s, T *y, const T *b, T *post, size_t total, size_t cols, int rdt) {
    if (total <= UINT32_MAX)
        kg_linear_epilogue_kernel<T, ACT, uint32_t><<<kg_grid(total), KG_THREADS, 0, s>>>(y, b, post, total,
                                                                                         (uint32_t)cols, rdt);
    else
        kg_linear_epilogue_kernel<T, ACT, size_t><<<kg_grid(total), KG_THREADS, 0, s>>>(y, b, post, total, cols,
                                                                                       rdt);
}

template <typename T>
static cudaError_t kg_linear_epilogue_t(cudaStream_t s, int act, T *y, const T *b, T *post, size_t total,
                                        size_t cols, int rdt) {
    return kg_with_act(act, true, [&](auto a) {
        kg_linear_epilogue_launch<T, decltype(a)::value>(s, y, b, post, total, cols, rdt);
    });
}

extern "C" cudaError_t kg_linear_epilogue(cudaStream_t s, int fdt, void *y, const void *b, int rows, int cols,
                                          int act, void *post, int round_dtype) {
    if ((fdt != KG_F32 && fdt != KG_F64) || (act != -1 && !kg_act_valid(act)) || rows < 0 || cols < 0)
        return cudaErrorInvalidValue;
    if (round_dtype != KG_F32 && !(fdt == KG_F32 && (round_dtype == KG_F16 || round_dtype == KG_BF16)))
        return cudaErrorInvalidValue;
    const size_t total = (size_t)rows * (size_t)cols;
    if (total == 0) return cudaSuccess;
    if (fdt == KG_F32)
        return kg_linear_epilogue_t(s, act, (float *)y, (const float *)b, (float *)post, total, (size_t)cols,
                                    round_dtype);
    return kg_linear_epilogue_t(s, act, (double *)y, (const double *)b, (double *)post, total, (size_t)cols,
                                KG_F32);
}

/* The same pass for 16-bit activation storage (ABI 1.7), SD the format of
 * y and post: v = src + b[col] in float (src the float32 product; NULL:
 * y itself holds the product, rounded by the GEMM as it stored it, and is
 * not written again), stored to y rounded to nearest even; post =
 * SD(act(v)) from the rounded v, as the float32 pass computes it. */
template <int SD, int ACT, typename IdxT>
__global__ void kg_linear_epilogue16_kernel(uint16_t *__restrict__ y, const float *__restrict__ src,
                                            const float *__restrict__ b, uint16_t *__restrict__ post, size_t total,
                                            IdxT cols) {
    KG_GRID_STRIDE(i, total) {
        float v;
        if (src) {
            v = src[i];
            if (b) v = v + b[(IdxT)i % cols];
            const uint16_t r = kg_st<float, SD>(v);
            y[i] = r;
            v = kg_ld<float, SD>(r);
        } else {
            v = kg_ld<float, SD>(y[i]);
        }
        if constexpr (ACT >= 0) post[i] = kg_st<float, SD>(kg_act_fwd<ACT>(v));
    }
}

template <int SD, int ACT>
static void kg_linear_epilogue16_launch(cudaStream_t s, uint16_t *y, const float *src, const float *b,
                                        uint16_t *post, size_t total, size_t cols) {
    if (total <= UINT32_MAX)
        kg_linear_epilogue16_kernel<SD, ACT, uint32_t><<<kg_grid(total), KG_THREADS, 0, s>>>(y, src, b, post, total,
                                                                                            (uint32_t)cols);
    else
        kg_linear_epilogue16_kernel<SD, ACT, size_t><<<kg_grid(total), KG_THREADS, 0, s>>>(y, src, b, post, total,
                                                                                          cols);
}

template <int SD>
static cudaError_t kg_linear_epilogue16_t(cudaStream_t s, int act, uint16_t *y, const float *src, const float *b,
                                          uint16_t *post, size_t total, size_t cols) {
    return kg_with_act(act, true, [&](auto a) {
        kg_linear_epilogue16_launch<SD, decltype(a)::value>(s, y, src, b, post, total, cols);
    });
}

extern "C" cudaError_t kg_linear_epilogue16(cudaStream_t s, int sdt, void *y, const float *src, const float *b,
                                            int rows, int cols, int act, void *post) {
    if ((sdt != KG_F16 && sdt != KG_BF16) || (act != -1 && !kg_act_valid(act)) || rows < 0 || cols < 0 ||
        (!src && b))
        return cudaErrorInvalidValue;
    const size_t total = (size_t)rows * (size_t)cols;
    if (total == 0 || (!src && act < 0)) return cudaSuccess;
    return sdt == KG_BF16
               ? kg_linear_epilogue16_t<KG_BF16>(s, act, (uint16_t *)y, src, b, (uint16_t *)post, total, (size_t)cols)
               : kg_linear_epilogue16_t<KG_F16>(s, act, (uint16_t *)y, src, b, (uint16_t *)post, total, (size_t)cols);
}

/* ------------------------------------------------------------------ casts */

static size_t kg_dtype_bytes(int dt) {
    switch (dt) {
    case KG_F32: return 4;
    case KG_F64: return 8;
    case KG_F16: case KG_BF16: return 2;
    default: return 0;
    }
}

/* dst(n) of dtype D = src(n) of dtype S. */
template <int D, int S>
__global__ void kg_cast_kernel(typename kg_storage<D>::type *__restrict__ dst,
                               const typename kg_storage<S>::type *__restrict__ src, size_t n) {
    KG_GRID_STRIDE(i, n) dst[i] = kg_convert<D, S>(src[i]);
}

template <int D, int S> static cudaError_t kg_cast_t(cudaStream_t s, void *dst, const void *src, size_t n) {
    kg_cast_kernel<D, S><<<kg_grid(n), KG_THREADS, 0, s>>>((typename kg_storage<D>::type *)dst,
                                                           (const typename kg_storage<S>::type *)src, n);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_cast(cudaStream_t s, void *dst, int dst_dtype, const void *src, int src_dtype, size_t n) {
    const size_t dsz = kg_dtype_bytes(dst_dtype);
    if (dsz == 0 || kg_dtype_bytes(src_dtype) == 0) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (dst_dtype == src_dtype) {
        if (dst == src) return cudaSuccess;
        return cudaMemcpyAsync(dst, src, n * dsz, cudaMemcpyDeviceToDevice, s);
    }
#define KG_CAST_CASE(D, S) \
    if (dst_dtype == (D) && src_dtype == (S)) return kg_cast_t<D, S>(s, dst, src, n);
    KG_CAST_CASE(KG_F32, KG_F64)
    KG_CAST_CASE(KG_F32, KG_F16)
    KG_CAST_CASE(KG_F32, KG_BF16)
    KG_CAST_CASE(KG_F64, KG_F32)
    KG_CAST_CASE(KG_F64, KG_F16)
    KG_CAST_CASE(KG_F64, KG_BF16)
    KG_CAST_CASE(KG_F16, KG_F32)
    KG_CAST_CASE(KG_F16, KG_F64)
    KG_CAST_CASE(KG_F16, KG_BF16)
    KG_CAST_CASE(KG_BF16, KG_F32)
    KG_CAST_CASE(KG_BF16, KG_F64)
    KG_CAST_CASE(KG_BF16, KG_F16)
#undef KG_CAST_CASE
    return cudaErrorInvalidValue; /* unreachable: every pair is listed */
}

/* ----------------------------------------------------------- rounding */

/* x(n) float32 = round_through_RDT(x), in place. */
template <int RDT> __global__ void kg_round_to_kernel(float *__restrict__ x, size_t n) {
    KG_GRID_STRIDE(i, n) x[i] = kg_round_to_dtype(x[i], RDT);
}

/* x(n) float32 = round_through_FP8(x), in place: the shared integer codec
 * (kernels/common/km_fp8.h), the cpu's bits. */
template <int RDT> __global__ void kg_round_fp8_kernel(float *__restrict__ x, size_t n) {
    KG_GRID_STRIDE(i, n) x[i] = RDT == KG_F8E4M3 ? km_round_f8e4m3(x[i]) : km_round_f8e5m2(x[i]);
}

extern "C" cudaError_t kg_round_to(cudaStream_t s, float *x, int dtype, size_t n) {
    if (dtype != KG_F32 && dtype != KG_F16 && dtype != KG_BF16 && dtype != KG_F8E4M3 && dtype != KG_F8E5M2)
        return cudaErrorInvalidValue;
    if (dtype == KG_F32 || n == 0) return cudaSuccess; /* float32 storage keeps everything */
    if (dtype == KG_F16) kg_round_to_kernel<KG_F16><<<kg_grid(n), KG_THREADS, 0, s>>>(x, n);
    else if (dtype == KG_BF16) kg_round_to_kernel<KG_BF16><<<kg_grid(n), KG_THREADS, 0, s>>>(x, n);
    else if (dtype == KG_F8E4M3) kg_round_fp8_kernel<KG_F8E4M3><<<kg_grid(n), KG_THREADS, 0, s>>>(x, n);
    else kg_round_fp8_kernel<KG_F8E5M2><<<kg_grid(n), KG_THREADS, 0, s>>>(x, n);
    return cudaGetLastError();
}

/*
 * c(rows, cols; ldc) = round_RDT(p(rows, cols; packed)) + beta * c, c not
 * read when beta == 0 (it may hold NaN then). p is stored as PDT: float32
 * (rounded here), or RDT itself (rounded by the GEMM that wrote it: widened,
 * which gives the same value). Flat over p's total elements; IdxT does the
 * row/column split.
 */
template <int PDT, int RDT, typename IdxT>
__global__ void kg_round_add_kernel(float *__restrict__ c, size_t ldc, const typename kg_storage<PDT>::type *__restrict__ p,
                                    size_t total, IdxT cols, float beta) {
    KG_GRID_STRIDE(i, total) {
        const IdxT r = (IdxT)i / cols;
        const IdxT j = (IdxT)i - r * cols;
        float *ci = c + (size_t)r * ldc + j;
        const float cv = beta == 0.0f ? 0.0f : *ci;
        if constexpr (PDT == KG_F32) *ci = kg_round_add_elem(p[i], cv, beta, RDT);
        else *ci = kg_round_add_elem(kg_convert<KG_F32, PDT>(p[i]), cv, beta, KG_F32);
    }
}

template <int PDT, int RDT>
static cudaError_t kg_round_add_t(cudaStream_t s, float *c, int ldc, const void *pv, int rows, int cols, float beta) {
    const size_t total = (size_t)rows * (size_t)cols;
    const typename kg_storage<PDT>::type *p = (const typename kg_storage<PDT>::type *)pv;
    if (total <= UINT32_MAX)
        kg_round_add_kernel<PDT, RDT, uint32_t><<<kg_grid(total), KG_THREADS, 0, s>>>(c, (size_t)ldc, p, total,
                                                                                      (uint32_t)cols, beta);
    else
        kg_round_add_kernel<PDT, RDT, size_t><<<kg_grid(total), KG_THREADS, 0, s>>>(c, (size_t)ldc, p, total,
                                                                                    (size_t)cols, beta);
    return cudaGetLastError();
}

extern "C" cudaError_t kg_round_add(cudaStream_t s, float *c, int ldc, const void *p, int p_dtype, int rows, int cols,
                                    int round_dtype, float beta) {
    if (round_dtype != KG_F32 && round_dtype != KG_F16 && round_dtype != KG_BF16) return cudaErrorInvalidValue;
    if (p_dtype != KG_F32 && p_dtype != round_dtype) return cudaErrorInvalidValue;
    if (rows < 0 || cols < 0 || ldc < cols) return cudaErrorInvalidValue;
    if (rows == 0 || cols == 0) return cudaSuccess;
    if (p_dtype == KG_F16) return kg_round_add_t<KG_F16, KG_F16>(s, c, ldc, p, rows, cols, beta);
    if (p_dtype == KG_BF16) return kg_round_add_t<KG_BF16, KG_BF16>(s, c, ldc, p, rows, cols, beta);
    if (round_dtype == KG_F16) return kg_round_add_t<KG_F32, KG_F16>(s, c, ldc, p, rows, cols, beta);
    if (round_dtype == KG_BF16) return kg_round_add_t<KG_F32, KG_BF16>(s, c, ldc, p, rows, cols, beta);
    return kg_round_add_t<KG_F32, KG_F32>(s, c, ldc, p, rows, cols, beta);
}
