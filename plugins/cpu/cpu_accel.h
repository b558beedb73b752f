/*
 * cpu_accel.h — what the files of the "cpu" accelerator plugin share: the
 * instance (host memory needs no more than a thread count and one scratch
 * workspace), the error macros every entry uses to turn a caller's mistake
 * into KILN_E_INVALID_ARG with a one-line message, the argument helpers (the
 * checks the cuda plugin makes too live in ../common/accel_checks.h), and
 * the kernel-table entries defined outside cpu_accel.c (the ABI 1.4 sequence
 * entries: cpu_accel_seq.c). Internal to the plugin; never
 * installed.
 */
#ifndef KILN_PLUGINS_CPU_ACCEL_H
#define KILN_PLUGINS_CPU_ACCEL_H

#include <kiln/kiln.h>

#include "../common/accel_checks.h"

/* One instance may be used from one thread at a time (the plugin does not
 * report KILN_CAP_THREAD_SAFE_INSTANCE): gemm_ex's workspace below is
 * per-instance scratch without a lock. */
struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    int32_t threads; /* threads in effect after configure(); 1 before */
    /* gemm_ex's scratch (16-bit operands widened to float32, the product
     * before rounding): grow-only, allocated on first need, reused while big
     * enough (never freed or reallocated then), freed in destroy. The only
     * memory the kernel entries allocate. */
    void *ws;
    size_t ws_bytes;
    /* 1.7's 16-bit activation storage: the float32 copies a call's 16-bit
     * buffers are widened into (and its 16-bit outputs computed in before
     * they are rounded into place), beside ws because the float32 kernels
     * they feed use ws themselves. Grow-only like ws, freed in destroy. */
    float *stage;
    size_t stage_bytes;
};

#define CPU_ERR(acc, code, ...) kiln_errorf((acc)->svc, (acc)->hctx, (code), __VA_ARGS__)

/* The checks shared with the cuda plugin (accel_checks.h) report through
 * this sink; the cpu's messages carry no prefix. */
#define CPU_SINK(acc) ACK_SINK(acc, "")

/* A NULL pointer is only acceptable when nothing would be read or written. */
#define CPU_NEED(acc, ptr, n, fn)                                                                   \
    do {                                                                                            \
        if ((n) > 0 && !(ptr))                                                                      \
            return CPU_ERR(acc, KILN_E_INVALID_ARG, fn ": " #ptr " is NULL for %zu elements",      \
                           (size_t)(n));                                                            \
    } while (0)

/* "float16 (3)": the ABI's name of a dtype and its number, for messages
 * (the number tells an unknown value apart from "invalid"). */
#define CPU_DT_FMT "%s (%u)"
#define CPU_DT_ARG(dt) kiln_dtype_name(dt), (unsigned)(dt)

int32_t cpu_check_dtype(kiln_instance *acc, const char *fn, uint32_t dtype);
int32_t cpu_round_to(kiln_instance *acc, float *x, uint32_t dtype, size_t n);
/* Makes acc->ws at least `bytes` long (grow-only; the one scratch buffer of
 * an instance: valid until the next entry that reserves it). */
int32_t cpu_reserve_workspace(kiln_instance *acc, size_t bytes);

#if KILN_ABI_MINOR >= 7
/* Makes acc->stage at least `floats` long (grow-only, as ws). The cpu runs
 * an entry on 16-bit storage (KILN_KERNELS_ACT_16BIT) as its definition
 * reads: the float32 kernel on widened copies, each output rounded as it is
 * stored (kc_cast both ways); the copies live here. */
int32_t cpu_reserve_stage(kiln_instance *acc, size_t floats);
#endif

#if KILN_ABI_MINOR >= 4
/* cpu_accel_seq.c: cpu_embedding_forward ... cpu_attention_backward */
ACK_DECLARE_SEQ_ENTRIES(cpu_)
#endif
#if KILN_ABI_MINOR >= 10
/* cpu_accel_seq.c: 1.10's residual add and layer norm */
int32_t cpu_add_layernorm_forward(kiln_instance *acc, uint32_t dtype, void *res, const void *a, const void *b, void *y,
                                  void *mean, void *rstd, const void *w, const void *bias, int32_t N, int32_t C,
                                  double eps, uint32_t round_dtype);
#endif
#if KILN_ABI_MINOR >= 11
/* cpu_accel_seq.c: 1.11's layer norm backward with a 16-bit copy of dx */
int32_t cpu_layernorm_backward_cast(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy,
                                    const void *x, const void *w, const void *mean, const void *rstd, int32_t N,
                                    int32_t C, int32_t accumulate, void *dx16, uint32_t dx16_dtype);
#endif

#endif /* KILN_PLUGINS_CPU_ACCEL_H */
