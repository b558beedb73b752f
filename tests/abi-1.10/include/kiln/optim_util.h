/*
 * kiln/optim_util.h — header-only helpers for optimizer plugins: the pieces
 * every optimizer writes the same way over its parameter list — zeroing the
 * gradients, the total element count and bytes (fp32 or fp64 masters),
 * and copying per-parameter buffers
 * (momenta, moments) between accelerator memory and a state blob, with the
 * parameter sizes recorded in the blob so a state of another model is
 * refused instead of misread. Nothing here is part of the binary ABI (no
 * struct crosses the boundary); plugins may use it or not.
 */
#ifndef KILN_OPTIM_UTIL_H
#define KILN_OPTIM_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kiln/training.h"

/* Bytes of one master (or gradient, or per-parameter optimizer buffer):
 * numel elements of the parameter's master dtype (fp32, or fp64). */
static inline size_t kiln_param_bytes(const kiln_parameter *p) {
    return (size_t)p->numel * kiln_dtype_size(kiln_param_dtype(p));
}

/* Sum of kiln_param_bytes over the parameters. */
static inline size_t kiln_params_bytes(kiln_parameter *const *params, uint32_t n) {
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) total += kiln_param_bytes(params[i]);
    return total;
}

/* Sum of numel over the parameters. */
static inline size_t kiln_params_numel(kiln_parameter *const *params, uint32_t n) {
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) total += (size_t)params[i]->numel;
    return total;
}

/* Whether a parameter has a gradient this step: not when the host marked it
 * KILN_PARAMF_NO_GRAD (1.5; torch's p.grad is None: zero_grad ran and no
 * backward reached it since, e.g. after a training_step that returned no
 * loss). An optimizer skips such a parameter entirely: no update, no weight
 * decay, no change to its momenta or moments. A host before 1.5 never sets
 * the bit, so every parameter has one there. */
static inline int kiln_param_has_grad(const kiln_parameter *p) {
#ifdef KILN_PARAMF_NO_GRAD
    return !(p->flags & KILN_PARAMF_NO_GRAD);
#else
    (void)p;
    return 1;
#endif
}

/* Whether any of the parameters has a gradient this step; when none has,
 * a step changes nothing at all (not even its step count), as a torch
 * optimizer whose every p.grad is None. */
static inline int kiln_params_any_grad(kiln_parameter *const *params, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (kiln_param_has_grad(params[i])) return 1;
    return 0;
}

/* optimizer.zero_grad(): every gradient to 0 through the accelerator.
 * Gradients that follow each other in memory (the next one starting where
 * this one ends, as they do in the kiln host's gradient arena whenever the
 * sizes are multiples of 16 elements: every GPT-2 parameter) are cleared
 * by one zero call over the run, so a GPU clears a GPT's 148 gradients
 * with one memset instead of 148. Nothing outside the gradients is
 * touched: only exact neighbours merge, never across a gap. */
static inline int32_t kiln_params_zero_grad(const kiln_kernels *k, kiln_instance *acc, kiln_parameter *const *params,
                                            uint32_t n) {
    unsigned char *run = NULL; /* the run being merged: [run, run + bytes) */
    size_t bytes = 0;
    for (uint32_t i = 0; i <= n; i++) {
        unsigned char *g = i < n ? (unsigned char *)params[i]->grad : NULL;
        const size_t b = i < n ? kiln_param_bytes(params[i]) : 0;
        if (i < n && b == 0) continue;
        if (run && g == run + bytes) { /* the next one: extend the run */
            bytes += b;
            continue;
        }
        if (run) {
            int32_t rc = k->zero(acc, run, bytes);
            if (rc != KILN_OK) return rc;
        }
        run = g, bytes = b;
    }
    return KILN_OK;
}

/* Copy one buffer per parameter (bufs[i] holds params[i]->numel elements of
 * the parameter's master dtype on the accelerator; typed float* for source
 * compatibility with 1.1 — an fp64 run's buffers hold doubles) into blob at
 * *off, concatenated in parameter order; *off advances. */
static inline int32_t kiln_params_save_bufs(const kiln_kernels *k, kiln_instance *acc, kiln_parameter *const *params,
                                            uint32_t n, float *const *bufs, unsigned char *blob, size_t *off) {
    for (uint32_t i = 0; i < n; i++) {
        size_t nb = kiln_param_bytes(params[i]);
        if (nb == 0) continue;
        int32_t rc = k->copy(acc, blob + *off, bufs[i], nb, KILN_COPY_D2H);
        if (rc != KILN_OK) return rc;
        *off += nb;
    }
    return KILN_OK;
}

/* The inverse of kiln_params_save_bufs. */
static inline int32_t kiln_params_load_bufs(const kiln_kernels *k, kiln_instance *acc, kiln_parameter *const *params,
                                            uint32_t n, float *const *bufs, const unsigned char *blob, size_t *off) {
    for (uint32_t i = 0; i < n; i++) {
        size_t nb = kiln_param_bytes(params[i]);
        if (nb == 0) continue;
        int32_t rc = k->copy(acc, bufs[i], blob + *off, nb, KILN_COPY_H2D);
        if (rc != KILN_OK) return rc;
        *off += nb;
    }
    return KILN_OK;
}

/* Record every parameter's numel (int64) in blob at *off; *off advances. */
static inline void kiln_params_write_sizes(kiln_parameter *const *params, uint32_t n, unsigned char *blob,
                                           size_t *off) {
    for (uint32_t i = 0; i < n; i++, *off += sizeof(int64_t)) memcpy(blob + *off, &params[i]->numel, sizeof(int64_t));
}

/* Check sizes recorded by kiln_params_write_sizes against the parameters.
 * Returns -1 when they all match (and advances *off), else the index of the
 * first mismatch with the recorded size in *found. The caller has checked
 * that the blob holds n sizes from *off. */
static inline int64_t kiln_params_check_sizes(kiln_parameter *const *params, uint32_t n, const unsigned char *blob,
                                              size_t *off, int64_t *found) {
    size_t o = *off;
    for (uint32_t i = 0; i < n; i++, o += sizeof(int64_t)) {
        memcpy(found, blob + o, sizeof *found);
        if (*found != params[i]->numel) return (int64_t)i;
    }
    *off = o;
    return -1;
}

#endif /* KILN_OPTIM_UTIL_H */
