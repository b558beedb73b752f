/*
 * kiln/tensor.h — data types and the borrowed tensor views that cross the
 * boundary (ABI 1.1; 1.2 adds the master dtype and the dtype helpers, 1.5
 * the two FP8 formats):
 * batches from data plugins, and the parameters the host allocates for a
 * module. A view never transfers ownership; its lifetime is
 * stated where it is handed over. Shapes are row-major, outermost first.
 */
#ifndef KILN_TENSOR_H
#define KILN_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
    /* 1.5: the OCP 8-bit floating-point formats (OFP8), one byte each:
     * E4M3 (bias 7, max 448, no infinities, NaN = S.1111.111; PyTorch's
     * float8_e4m3fn) and E5M2 (bias 15, max 57344, IEEE-style infinities
     * and NaNs). The kernel table's round_to rounds float32 data through
     * them (docs/precision.md states the rounding and saturation). */
    KILN_DTYPE_F8E4M3 = 8,
    KILN_DTYPE_F8E5M2 = 9,
};

/* Bytes per element; 0 for an unknown dtype. */
static inline size_t kiln_dtype_size(uint32_t dt) {
    switch (dt) {
    case KILN_DTYPE_F64: case KILN_DTYPE_I64: return 8;
    case KILN_DTYPE_F32: case KILN_DTYPE_I32: return 4;
    case KILN_DTYPE_F16: case KILN_DTYPE_BF16: return 2;
    case KILN_DTYPE_U8: case KILN_DTYPE_F8E4M3: case KILN_DTYPE_F8E5M2: return 1;
    default: return 0;
    }
}

/* The names used in plugin properties ("param_dtype", "compute_dtype") and
 * in messages: PyTorch's spellings. */
static inline const char *kiln_dtype_name(uint32_t dt) {
    switch (dt) {
    case KILN_DTYPE_F32: return "float32";
    case KILN_DTYPE_F64: return "float64";
    case KILN_DTYPE_F16: return "float16";
    case KILN_DTYPE_BF16: return "bfloat16";
    case KILN_DTYPE_I32: return "int32";
    case KILN_DTYPE_I64: return "int64";
    case KILN_DTYPE_U8: return "uint8";
    case KILN_DTYPE_F8E4M3: return "float8_e4m3fn";
    case KILN_DTYPE_F8E5M2: return "float8_e5m2";
    default: return "invalid";
    }
}

static inline uint32_t kiln_dtype_from_name(const char *s) {
    for (uint32_t dt = KILN_DTYPE_F32; dt <= KILN_DTYPE_F8E5M2; dt++)
        if (s && !strcmp(s, kiln_dtype_name(dt))) return dt;
    return KILN_DTYPE_INVALID;
}

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
#define KILN_PARAMF_FROZEN (1u << 1)   /* 1.2, set by the host: requires_grad is
                                          False (toggle_optimizer); backward must
                                          not touch this parameter's grad      */
#define KILN_PARAMF_NO_GRAD (1u << 2)  /* 1.5, set by the host: the gradient is
                                          None (PyTorch's set_to_none): zero_grad
                                          ran and no backward has reached this
                                          parameter since. `grad` holds zeros; an
                                          optimizer leaves the parameter, its
                                          state and its decay untouched, as
                                          torch optimizers skip p.grad is None */

/* A parameter the host allocated for a module (ABI 1.1). The host owns the
 * memory; the pointers stay valid until the run ends. `data` and `grad` are
 * the master values on the accelerator, in `param_dtype` (1.2; fp32 unless
 * the precision plugin's "param_dtype" property says "float64" — then they
 * point at doubles despite their declared type; read it with
 * kiln_param_dtype()). `compute` is what the forward reads, in
 * `compute_dtype`: equal to `data` when the precision computes in the
 * master dtype, else a copy the precision plugin owns and refreshes in
 * convert_params (fp16, bf16, dequantised 4-bit ...). */
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
    /* -- 1.2 -- */
    uint32_t param_dtype;         /* KILN_DTYPE_F32 or KILN_DTYPE_F64           */
    uint32_t reserved;
} kiln_parameter;

#define KILN_PARAMETER_SIZE_1_2 (offsetof(kiln_parameter, reserved) + sizeof(uint32_t))

/* The dtype of p->data and p->grad; a 1.1 host's struct means fp32. */
static inline uint32_t kiln_param_dtype(const kiln_parameter *p) {
    return p->struct_size >= KILN_PARAMETER_SIZE_1_2 ? p->param_dtype : KILN_DTYPE_F32;
}

#endif /* KILN_TENSOR_H */
