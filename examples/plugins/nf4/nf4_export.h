/*
 * nf4_export.h — writes quantized weights as a safetensors file, free of any
 * kiln dependency (the test calls it directly). Per weight two tensors:
 * "<name>.codes" (U8, [ceil(numel/2)], packed as in nf4_quant.h) and
 * "<name>.absmax" (F32 or F16, [nblocks]); "__metadata__" holds format
 * "kiln-nf4-1", quant, block_size, scale_dtype, and "<name>.shape" (the
 * weight's original shape as a JSON list in a string, e.g. "[1024,784]").
 * Data layout: every absmax tensor first, then every codes tensor, in the
 * order given, contiguous; the header is space-padded so the data starts on
 * an 8-byte boundary (as the reference implementation does). The file is
 * written atomically: a temporary file in the same directory, fsync, rename.
 */
#ifndef NF4_EXPORT_H
#define NF4_EXPORT_H

#include <stddef.h>
#include <stdint.h>

typedef struct nf4x_weight {
    const char *name;      /* "layers.0.weight"                                  */
    uint32_t ndim;         /* 1..8                                               */
    const int64_t *shape;  /* (ndim)                                             */
    size_t numel;          /* product of shape                                   */
    const uint8_t *codes;  /* (ceil(numel/2)) packed 4-bit codes                 */
    const float *absmax;   /* (ceil(numel/block_size)) per-block scales          */
} nf4x_weight;

/* Scale dtypes of the file. */
enum { NF4X_SCALE_F32 = 0, NF4X_SCALE_F16 = 1 };

/* Write `path` (its directory must exist). Returns 0, or -1 with a message
 * in err (what failed, the path and strerror) and no file left behind. */
int nf4x_write(const char *path, const char *quant, size_t block_size, int scale_dtype, const nf4x_weight *w,
               size_t n, char *err, size_t errlen);

/* IEEE binary16 bits of f, round to nearest even (65520 and above give inf,
 * NaN stays NaN, small values become subnormals or 0): the compiler's
 * _Float16 where it has one, else nf4x_f16_bits_soft, the same conversion
 * in integer arithmetic (for compilers without _Float16, e.g. clang < 15 on
 * x86). */
uint16_t nf4x_f16_bits(float f);
uint16_t nf4x_f16_bits_soft(float f);

/* Sizes in bytes the file's tensors take: packed codes, and scales in
 * `scale_dtype`. For the memory report. */
void nf4x_sizes(const nf4x_weight *w, size_t n, size_t block_size, int scale_dtype, uint64_t *codes_bytes,
                uint64_t *scale_bytes);

#endif /* NF4_EXPORT_H */
