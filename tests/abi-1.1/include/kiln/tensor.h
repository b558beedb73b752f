/*
 * kiln/tensor.h — data types and the borrowed tensor views that cross the
 * boundary (ABI 1.1): batches from data plugins, and the parameters the host
 * allocates for a module. A view never transfers ownership; its lifetime is
 * stated where it is handed over. Shapes are row-major, outermost first.
 */
#ifndef KILN_TENSOR_H
#define KILN_TENSOR_H

#include <stdint.h>

/* Element types (uint32, fixed values, never renumbered). */
enum {
    KILN_DTYPE_INVALID = 0,
    KILN_DTYPE_F32 = 1,
    KILN_DTYPE_F64 = 2,
    KILN_DTYPE_F16 = 3,
    KILN_DTYPE_BF16 = 4,
    KILN_DTYPE_I32 = 5,
    KILN_DTYPE_I64 = 6,
    KILN_DTYPE_U8 = 7,
};

#define KILN_MAX_DIMS 4

/* A borrowed, dense, row-major view. */
typedef struct kiln_tensor {
    void *data;
    uint32_t dtype;               /* KILN_DTYPE_*                               */
    uint32_t ndim;                /* 0..KILN_MAX_DIMS                           */
    int64_t shape[KILN_MAX_DIMS]; /* unused dims are 1                          */
} kiln_tensor;

/* One batch from a data plugin, in HOST memory (a module copies it to its
 * accelerator; on the cpu accelerator that is a memcpy). Read-only for the
 * consumer. Valid until the next `next` call of the same data instance and
 * split. For classification data:
 *   tensors[0]: inputs  (B, features) F32
 *   tensors[1]: targets (B)           I32 */
typedef struct kiln_batch {
    uint32_t struct_size;
    uint32_t ntensors;
    const kiln_tensor *tensors;
    int64_t size;                 /* B, the number of real samples              */
} kiln_batch;

/* Flags of a registered parameter. */
#define KILN_PARAMF_NO_DECAY (1u << 0) /* optimizers skip weight decay (biases) */

/* A parameter the host allocated for a module (ABI 1.1). The host owns the
 * memory; the pointers stay valid until the run ends. `data` and `grad` are
 * fp32 master values on the accelerator; `compute` is what the forward reads,
 * in `compute_dtype` (equal to `data` when the precision computes in fp32). */
typedef struct kiln_parameter {
    uint32_t struct_size;
    uint32_t flags;               /* KILN_PARAMF_*                              */
    const char *name;             /* "layers.0.weight"                          */
    uint32_t ndim;
    uint32_t compute_dtype;       /* KILN_DTYPE_*                               */
    int64_t shape[KILN_MAX_DIMS];
    int64_t numel;
    float *data;                  /* (shape) fp32 master weights                */
    float *grad;                  /* (shape) fp32 gradients, accumulated (+=)   */
    void *compute;                /* (shape) compute-dtype weights              */
} kiln_parameter;

#endif /* KILN_TENSOR_H */
