/*
 * nf4_quant.h — block-wise 4-bit weight quantization, free of any kiln
 * dependency so the test links it directly. A tensor (flattened, row-major)
 * is cut into blocks of `block` elements (the last one may be shorter); each
 * block keeps its absolute maximum in fp32 and one 4-bit code per element,
 * the index of the nearest entry of a 16-value table to w / absmax. Two
 * tables: "nf4", QLoRA's NormalFloat (quantiles of N(0, 1) scaled to
 * [-1, 1]), and "int4", the symmetric integer grid q/7 for q in [-7, 7].
 * Codes are packed two per byte: element 2i in the LOW nibble of byte i,
 * element 2i+1 in the HIGH nibble; an odd tail leaves the last high nibble
 * 0. Since block sizes are even, every block starts on a byte boundary.
 */
#ifndef NF4_QUANT_H
#define NF4_QUANT_H

#include <stddef.h>
#include <stdint.h>

enum { NF4Q_NF4 = 0, NF4Q_INT4 = 1 };

/* QLoRA's NF4 table (bitsandbytes' values), ascending; entry 7 is exactly 0,
 * entries 0 and 15 are exactly -1 and 1. */
extern const float nf4q_nf4_table[16];

/* int4: nibble n stands for (n - 8) / 7 (offset binary). Nibble 0 (-8/7) is
 * never written by the quantizer: the grid is symmetric, q in [-7, 7]. */
extern const float nf4q_int4_table[16];

/* The decoding table of `kind` (NF4Q_NF4 or NF4Q_INT4); NULL for another. */
const float *nf4q_table(int kind);

/* "nf4" / "int4" */
const char *nf4q_kind_name(int kind);

/* Bytes of packed codes for `numel` elements: ceil(numel / 2). */
static inline size_t nf4q_packed_bytes(size_t numel) { return (numel + 1) / 2; }

/* Number of blocks: ceil(numel / block). */
static inline size_t nf4q_num_blocks(size_t numel, size_t block) { return (numel + block - 1) / block; }

/* Nibble i of a packed array (low nibble = even element). */
static inline uint8_t nf4q_get(const uint8_t *packed, size_t i) {
    return (uint8_t)((packed[i >> 1] >> ((i & 1) * 4)) & 0xF);
}

/* Pack `n` nibbles (values 0..15, one per byte) into (n + 1) / 2 bytes. */
void nf4q_pack(const uint8_t *nibbles, size_t n, uint8_t *packed);
/* Unpack (n + 1) / 2 bytes into `n` nibbles, one per byte. */
void nf4q_unpack(const uint8_t *packed, size_t n, uint8_t *nibbles);

/* The code of a normalised value x (nominally in [-1, 1]): the index of the
 * nearest table entry (the lower one on an exact tie); values beyond +-1
 * clamp to the end codes, NaN gives the code of 0. */
uint8_t nf4q_encode(int kind, float x);

/* Quantize one block w(n) (n >= 1; n even unless it is a tensor's last
 * block) into packed codes((n + 1) / 2) and return its absmax. A block of
 * zeros has absmax 0 and decodes to zeros. A block holding inf or NaN gets
 * absmax NaN (codes of 0), so it decodes to NaN: diverged masters stay
 * visible in the forward instead of being silently clamped. */
float nf4q_quantize_block(int kind, const float *w, size_t n, uint8_t *codes);

/* out(n) = absmax * table[code]: the inverse of nf4q_quantize_block. */
void nf4q_dequantize_block(int kind, const uint8_t *codes, size_t n, float absmax, float *out);

/* Whole tensors: w(numel) -> codes(ceil(numel/2)), absmax(ceil(numel/block));
 * block must be even and >= 2. */
void nf4q_quantize(int kind, const float *w, size_t numel, size_t block, uint8_t *codes, float *absmax);
void nf4q_dequantize(int kind, const uint8_t *codes, const float *absmax, size_t numel, size_t block, float *out);

#endif /* NF4_QUANT_H */
