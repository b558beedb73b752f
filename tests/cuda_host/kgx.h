/*
 * kgx.h: what a kernels/cuda source needs to compile as plain host C++ and
 * run its kernels on the CPU, thread by thread: the host-execution build of
 * the cuda accelerator (tests/cuda_host) force-includes it (g++ -include)
 * into each kg_*.cu after kgx_translate.cmake has rewritten every launch
 *     name<targs><<<grid, block, smem, stream>>>(args)
 * as
 *     name<targs> * kgx::cfg("name<targs>", grid, block, smem, stream)(args)
 * which the operator* below turns into one call of kgx_launch (kgx.cpp):
 * the kernel's parameters are converted as CUDA converts them, packed once,
 * and the function runs once per thread of the grid.
 *
 * The CUDA built-ins are the emulation's: threadIdx and blockIdx read the
 * thread the scheduler is running; __syncthreads, __syncwarp and the warp
 * shuffle suspend it until its block (or warp) arrives; a __shared__
 * array becomes a function static that announces itself (kgx_shared_note)
 * where it is declared, and the first announcement in each block fills it
 * with 0xff bytes (NaN in every float format), so a read of shared memory
 * no thread of the block wrote shows; dynamic shared memory (`extern
 * __shared__ T name[]`, rewritten to `#define name ((T *)kgx_dyn_smem)`)
 * is a heap buffer of exactly the launch's size, so ASan sees a read past
 * it. Blocks run one at a time, so statics shared by "the block" are
 * exactly right. Atomics are plain read-modify-writes: one host thread
 * runs every CUDA thread.
 */
#ifndef KILN_TESTS_CUDA_HOST_KGX_H
#define KILN_TESTS_CUDA_HOST_KGX_H

/* Defined before cuda_runtime.h, whose host_defines.h then keeps them. */
#define __host__
#define __device__
#define __global__
#define __constant__ static
/* kgx_translate.cmake rewrites every __shared__ declaration of a .cu file;
 * one left in a header would not compile, rather than run wrong. */
#define __shared__ kgx_untranslated_shared_declaration

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#undef __forceinline__
#define __forceinline__ inline
#undef __launch_bounds__
#define __launch_bounds__(...)

/* The running thread's coordinates (kgx.cpp sets them at every switch). */
struct kgx_coords {
    uint3 tid, bid;
    dim3 bdim, gdim;
};
extern "C" kgx_coords kgx_now;
extern "C" unsigned char *kgx_dyn_smem;

#define threadIdx (kgx_now.tid)
#define blockIdx (kgx_now.bid)
#define blockDim (kgx_now.bdim)
#define gridDim (kgx_now.gdim)

extern "C" {
/* A __shared__ array's declaration, run by each thread that reaches it. */
void kgx_shared_note(void *p, size_t bytes);
void kgx_syncthreads(void);
void kgx_syncwarp(unsigned mask);
/* Lane lane ^ xor_mask's bytes (n <= 8) as they were when the warp
 * arrived, after the caller's own `n` bytes at v were offered. */
void kgx_shfl_xor(unsigned mask, void *v, size_t n, int xor_mask);
}

static inline void __syncthreads(void) { kgx_syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { kgx_syncwarp(mask); }

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int xor_mask, int width = 32) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a shuffle moves at most 8 bytes");
    (void)width;
    kgx_shfl_xor(mask, &v, sizeof v, xor_mask);
    return v;
}

/* The bit casts of CUDA's device library. */
template <typename D, typename S> static inline D kgx_bits(S s) {
    static_assert(sizeof(D) == sizeof(S), "a bit cast keeps the size");
    D d;
    memcpy(&d, &s, sizeof d);
    return d;
}
static inline int __float_as_int(float x) { return kgx_bits<int>(x); }
static inline unsigned __float_as_uint(float x) { return kgx_bits<unsigned>(x); }
static inline float __int_as_float(int x) { return kgx_bits<float>(x); }
static inline float __uint_as_float(unsigned x) { return kgx_bits<float>(x); }
static inline long long __double_as_longlong(double x) { return kgx_bits<long long>(x); }
static inline double __longlong_as_double(long long x) { return kgx_bits<double>(x); }

template <typename T> static inline T __ldg(const T *p) { return *p; }

static inline int atomicCAS(int *a, int cmp, int val) {
    const int old = *a;
    if (old == cmp) *a = val;
    return old;
}
static inline unsigned atomicCAS(unsigned *a, unsigned cmp, unsigned val) {
    const unsigned old = *a;
    if (old == cmp) *a = val;
    return old;
}
static inline unsigned long long atomicCAS(unsigned long long *a, unsigned long long cmp, unsigned long long val) {
    const unsigned long long old = *a;
    if (old == cmp) *a = val;
    return old;
}

/* ---------------------------------------------------------------- launch */

namespace kgx {

struct launch_cfg {
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};

/* A kernel argument as the runtime sees it: a pointer to read, a pointer
 * to write, or a struct passed by value (pointers inside it found by
 * looking at its 8-byte words). */
enum arg_kind { ARG_IN, ARG_OUT, ARG_STRUCT };
struct arg {
    const void *p;
    size_t bytes;
    int kind;
};

} // namespace kgx

extern "C" {
/* Runs fn(env) once per thread of c's grid (kgx.cpp); args: the kernel's
 * pointer and struct arguments. Returns nothing: a failure is the
 * runtime's last error, as a launch's. */
void kgx_launch(const kgx::launch_cfg *c, void (*fn)(void *env), void *env, const kgx::arg *args, int nargs);
}

namespace kgx {

template <typename... A> struct pending {
    launch_cfg c;
    std::tuple<A...> args;
};

struct cfg {
    launch_cfg c;
    cfg(const char *name, dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0)
        : c{name, grid, block, smem, stream} {}
    template <typename... A> pending<std::decay_t<A>...> operator()(A &&...a) const {
        return {c, std::tuple<std::decay_t<A>...>(std::forward<A>(a)...)};
    }
};

template <typename X> static inline void note_arg(arg *out, int *n, const X &x) {
    if constexpr (std::is_pointer<X>::value)
        out[(*n)++] = {(const void *)x, 0, std::is_const<std::remove_pointer_t<X>>::value ? ARG_IN : ARG_OUT};
    else if constexpr (std::is_class<X>::value)
        out[(*n)++] = {(const void *)&x, sizeof x, ARG_STRUCT};
}

template <typename... P> struct bound {
    void (*f)(P...);
    std::tuple<P...> args;
    static void run(void *env) {
        bound *b = (bound *)env;
        std::apply(b->f, b->args); /* by value: each thread gets its own copies */
    }
};

template <typename... P, typename... A> static inline void operator*(void (*f)(P...), pending<A...> &&p) {
    static_assert(sizeof...(P) == sizeof...(A), "a launch passes every parameter");
    /* a C cast: nvcc has already type-checked the launch; this one also
     * turns g++'s NULL (a long) into the pointer it stands for */
    bound<P...> b{f, std::apply([](auto &...a) { return std::tuple<P...>((P)a...); }, p.args)};
    arg args[sizeof...(P) + 1] = {};
    int n = 0;
    std::apply([&](auto &...a) { (note_arg(args, &n, a), ...); }, b.args);
    kgx_launch(&p.c, &bound<P...>::run, &b, args, n);
}

} // namespace kgx

#endif /* KILN_TESTS_CUDA_HOST_KGX_H */
