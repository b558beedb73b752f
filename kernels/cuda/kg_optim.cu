/*
 * kg_optim.cu: the SGD and AdamW parameter updates, one fused pass over p,
 * g and the optimizer state, with an optional second output: the updated
 * parameter cast to a compute dtype (the low-precision copy mixed precision
 * trains with), written in the same pass instead of a separate cast. The
 * scalar coefficients are formed on the host by kg_math.cuh's
 * kg_*_make_coef, which repeat the CPU's float/double choices (pow in
 * double for AdamW's bias corrections), and each element is kg_math.cuh's
 * kg_sgd_elem / kg_adamw_elem: plain IEEE operations in PyTorch's order,
 * built without FMA, so with the same inputs the result is the CPU's bit for
 * bit. Kernels are instantiated per element type and compute dtype; the
 * option flags (weight decay, momentum, ...) are uniform branches. The
 * AdamW list kernel (ABI 1.10's adamw_update_many) runs the same element
 * over up to KG_ADAMW_LIST_MAX tensors in one launch, each tensor with the
 * blocks and coefficients its own launch would have had.
 */
#include "kg_internal.cuh"
#include "kg_kernels.h"

/* compute[i] = p converted to CDT; CDT 0: no compute copy. */
template <typename T, int CDT> __device__ __forceinline__ void kg_store_compute(void *compute, size_t i, T p) {
    if constexpr (CDT != 0) {
        ((typename kg_storage<CDT>::type *)compute)[i] = kg_convert<CDT, kg_dtype_of<T>::value>(p);
    }
}

/* ------------------------------------------------------------------- SGD */

/* p(n), g(n), buf(n) (read only with momentum after the first step, written
 * only with momentum; NULL otherwise), compute(n) of CDT or unused. */
template <typename T, int CDT>
__global__ void kg_sgd_kernel(T *__restrict__ p, const T *__restrict__ g, T *__restrict__ buf, size_t n,
                              kg_sgd_coef<T> c, void *__restrict__ compute) {
    KG_GRID_STRIDE(i, n) {
        T pi = p[i];
        T bi = c.has_mom && !c.first ? buf[i] : (T)0;
        kg_sgd_elem(c, &pi, g[i], &bi);
        if (c.has_mom) buf[i] = bi;
        p[i] = pi;
        kg_store_compute<T, CDT>(compute, i, pi);
    }
}

template <typename T>
static cudaError_t kg_sgd_t(cudaStream_t s, T *p, const T *g, T *buf, size_t n, const kg_sgd_coef<T> &c,
                            void *compute, int compute_dtype) {
    const unsigned grid = kg_grid(n);
    const int cdt = compute ? compute_dtype : 0;
    switch (cdt) {
    case 0: kg_sgd_kernel<T, 0><<<grid, KG_THREADS, 0, s>>>(p, g, buf, n, c, compute); break;
    case KG_F32: kg_sgd_kernel<T, KG_F32><<<grid, KG_THREADS, 0, s>>>(p, g, buf, n, c, compute); break;
    case KG_F64: kg_sgd_kernel<T, KG_F64><<<grid, KG_THREADS, 0, s>>>(p, g, buf, n, c, compute); break;
    case KG_F16: kg_sgd_kernel<T, KG_F16><<<grid, KG_THREADS, 0, s>>>(p, g, buf, n, c, compute); break;
    case KG_BF16: kg_sgd_kernel<T, KG_BF16><<<grid, KG_THREADS, 0, s>>>(p, g, buf, n, c, compute); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

static int kg_compute_dtype_ok(const void *compute, int compute_dtype) {
    return !compute || compute_dtype == KG_F32 || compute_dtype == KG_F64 || compute_dtype == KG_F16 ||
           compute_dtype == KG_BF16;
}

extern "C" cudaError_t kg_sgd_update(cudaStream_t s, int fdt, void *p, const void *g, void *momentum_buf, size_t n,
                                     double lr, double momentum, double dampening, int nesterov,
                                     double weight_decay, int first_step, void *compute, int compute_dtype) {
    if (fdt != KG_F32 && fdt != KG_F64) return cudaErrorInvalidValue;
    if (!kg_compute_dtype_ok(compute, compute_dtype)) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (fdt == KG_F32) {
        const kg_sgd_coef<float> c =
            kg_sgd_make_coef<float>(lr, momentum, dampening, nesterov, weight_decay, first_step, 1);
        /* Momentum without a buffer would silently train plain SGD. */
        if (c.has_mom && !momentum_buf) return cudaErrorInvalidValue;
        return kg_sgd_t(s, (float *)p, (const float *)g, (float *)momentum_buf, n, c, compute, compute_dtype);
    }
    const kg_sgd_coef<double> c =
        kg_sgd_make_coef<double>(lr, momentum, dampening, nesterov, weight_decay, first_step, 1);
    if (c.has_mom && !momentum_buf) return cudaErrorInvalidValue;
    return kg_sgd_t(s, (double *)p, (const double *)g, (double *)momentum_buf, n, c, compute, compute_dtype);
}

/* ----------------------------------------------------------------- AdamW */

/* p(n), g(n), m(n), v(n), compute(n) of CDT or unused. */
template <typename T, int CDT>
__global__ void kg_adamw_kernel(T *__restrict__ p, const T *__restrict__ g, T *__restrict__ m, T *__restrict__ v,
                                size_t n, kg_adamw_coef<T> c, void *__restrict__ compute) {
    KG_GRID_STRIDE(i, n) {
        T pi = p[i], mi = m[i], vi = v[i];
        kg_adamw_elem(c, &pi, g[i], &mi, &vi);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        kg_store_compute<T, CDT>(compute, i, pi);
    }
}

template <typename T>
static cudaError_t kg_adamw_t(cudaStream_t s, T *p, const T *g, T *m, T *v, size_t n, const kg_adamw_coef<T> &c,
                              void *compute, int compute_dtype) {
    const unsigned grid = kg_grid(n);
    const int cdt = compute ? compute_dtype : 0;
    switch (cdt) {
    case 0: kg_adamw_kernel<T, 0><<<grid, KG_THREADS, 0, s>>>(p, g, m, v, n, c, compute); break;
    case KG_F32: kg_adamw_kernel<T, KG_F32><<<grid, KG_THREADS, 0, s>>>(p, g, m, v, n, c, compute); break;
    case KG_F64: kg_adamw_kernel<T, KG_F64><<<grid, KG_THREADS, 0, s>>>(p, g, m, v, n, c, compute); break;
    case KG_F16: kg_adamw_kernel<T, KG_F16><<<grid, KG_THREADS, 0, s>>>(p, g, m, v, n, c, compute); break;
    case KG_BF16: kg_adamw_kernel<T, KG_BF16><<<grid, KG_THREADS, 0, s>>>(p, g, m, v, n, c, compute); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t kg_adamw_update(cudaStream_t s, int fdt, void *p, const void *g, void *m, void *v, size_t n,
                                       double lr, double beta1, double beta2, double eps, double weight_decay,
                                       int64_t step, void *compute, int compute_dtype) {
    if (fdt != KG_F32 && fdt != KG_F64) return cudaErrorInvalidValue;
    if (!kg_compute_dtype_ok(compute, compute_dtype)) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (fdt == KG_F32)
        return kg_adamw_t(s, (float *)p, (const float *)g, (float *)m, (float *)v, n,
                          kg_adamw_make_coef<float>(lr, beta1, beta2, eps, weight_decay, step), compute,
                          compute_dtype);
    return kg_adamw_t(s, (double *)p, (const double *)g, (double *)m, (double *)v, n,
                      kg_adamw_make_coef<double>(lr, beta1, beta2, eps, weight_decay, step), compute, compute_dtype);
}

/* The list: block b works on its tensor (kg_list_owner, uniform per
 * block), grid-striding over it with that tensor's blocks; c is the list's
 * common coefficients, its decay replaced by the tensor's own. */
template <typename T> __global__ void kg_adamw_list_kernel(const kg_adamw_list list, kg_adamw_coef<T> c) {
    const int t = kg_list_owner(list.first, list.count, blockIdx.x);
    c.decay = (T)list.decay[t]; /* exact: a T's value held in a double */
    T *__restrict__ p = (T *)list.p[t];
    const T *__restrict__ g = (const T *)list.g[t];
    T *__restrict__ m = (T *)list.m[t];
    T *__restrict__ v = (T *)list.v[t];
    const size_t n = list.n[t];
    const size_t stride = (size_t)(list.first[t + 1] - list.first[t]) * blockDim.x;
    for (size_t i = (size_t)(blockIdx.x - list.first[t]) * blockDim.x + threadIdx.x; i < n; i += stride) {
        T pi = p[i], mi = m[i], vi = v[i];
        kg_adamw_elem(c, &pi, g[i], &mi, &vi);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
    }
}

extern "C" cudaError_t kg_adamw_update_list(cudaStream_t s, int fdt, kg_adamw_list *list, double lr, double beta1,
                                            double beta2, double eps, int64_t step) {
    if (fdt != KG_F32 && fdt != KG_F64) return cudaErrorInvalidValue;
    if (list->count < 0 || list->count > KG_ADAMW_LIST_MAX) return cudaErrorInvalidValue;
    /* each tensor's blocks as kg_grid gives them to its own launch, and
     * its decay as kg_adamw_make_coef forms it for its own launch */
    const unsigned blocks = kg_list_blocks(list->n, list->count, list->first);
    for (int t = 0; t < list->count; t++) {
        const double wd = list->weight_decay[t];
        list->decay[t] = fdt == KG_F32 ? (double)kg_adamw_make_coef<float>(lr, beta1, beta2, eps, wd, step).decay
                                       : kg_adamw_make_coef<double>(lr, beta1, beta2, eps, wd, step).decay;
    }
    if (blocks == 0) return cudaSuccess;
    if (fdt == KG_F32)
        kg_adamw_list_kernel<float>
            <<<blocks, KG_THREADS, 0, s>>>(*list, kg_adamw_make_coef<float>(lr, beta1, beta2, eps, 0.0, step));
    else
        kg_adamw_list_kernel<double>
            <<<blocks, KG_THREADS, 0, s>>>(*list, kg_adamw_make_coef<double>(lr, beta1, beta2, eps, 0.0, step));
    return cudaGetLastError();
}
