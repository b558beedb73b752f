/*
 * nf4_quant.c — the quantization arithmetic of the nf4/int4 precisions:
 * the two 16-entry tables, nearest-code search, block quantize/dequantize
 * with an fp32 absmax per block, and nibble packing (low nibble = even
 * element). No kiln dependency and no allocation: the plugin calls it on
 * buffers it owns and the test links it directly to check it by brute force.
 */
#include "nf4_quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* QLoRA's NormalFloat table as bitsandbytes ships it (create_normal_map with
 * offset 0.9677083, rounded to fp32): 7 negative quantiles of N(0, 1), zero,
 * 8 positive ones, normalised so the ends are exactly -1 and 1. The test
 * recomputes it from the normal quantile function. */
#define NF4_V0 (-1.0f)
#define NF4_V1 (-0.6961928009986877f)
#define NF4_V2 (-0.5250730514526367f)
#define NF4_V3 (-0.39491748809814453f)
#define NF4_V4 (-0.28444138169288635f)
#define NF4_V5 (-0.18477343022823334f)
#define NF4_V6 (-0.09105003625154495f)
#define NF4_V7 (0.0f)
#define NF4_V8 (0.07958029955625534f)
#define NF4_V9 (0.16093020141124725f)
#define NF4_V10 (0.24611230194568634f)
#define NF4_V11 (0.33791524171829224f)
#define NF4_V12 (0.44070982933044434f)
#define NF4_V13 (0.5626170039176941f)
#define NF4_V14 (0.7229568362236023f)
#define NF4_V15 (1.0f)

const float nf4q_nf4_table[16] = {NF4_V0, NF4_V1, NF4_V2,  NF4_V3,  NF4_V4,  NF4_V5,  NF4_V6,  NF4_V7,
                                  NF4_V8, NF4_V9, NF4_V10, NF4_V11, NF4_V12, NF4_V13, NF4_V14, NF4_V15};

/* Decision thresholds between neighbouring NF4 entries: a value above
 * mid[i] is nearer to entry i+1 than to entry i. The table is ascending, so
 * the code is the number of thresholds below x (a branch-free count the
 * compiler vectorises) instead of 16 distance comparisons. */
#define NF4_MID(a, b) (((a) + (b)) * 0.5f)
static const float nf4_mid[15] = {
    NF4_MID(NF4_V0, NF4_V1),   NF4_MID(NF4_V1, NF4_V2),   NF4_MID(NF4_V2, NF4_V3),   NF4_MID(NF4_V3, NF4_V4),
    NF4_MID(NF4_V4, NF4_V5),   NF4_MID(NF4_V5, NF4_V6),   NF4_MID(NF4_V6, NF4_V7),   NF4_MID(NF4_V7, NF4_V8),
    NF4_MID(NF4_V8, NF4_V9),   NF4_MID(NF4_V9, NF4_V10),  NF4_MID(NF4_V10, NF4_V11), NF4_MID(NF4_V11, NF4_V12),
    NF4_MID(NF4_V12, NF4_V13), NF4_MID(NF4_V13, NF4_V14), NF4_MID(NF4_V14, NF4_V15),
};

/* int4, offset binary: nibble n = q + 8 stands for q / 7. Written as q/7
 * (not q*absmax/7 at decode time) so that q = +-7 decodes to exactly
 * +-absmax. */
#define I4(q) ((float)(q) / 7.0f)
const float nf4q_int4_table[16] = {I4(-8), I4(-7), I4(-6), I4(-5), I4(-4), I4(-3), I4(-2), I4(-1),
                                   I4(0),  I4(1),  I4(2),  I4(3),  I4(4),  I4(5),  I4(6),  I4(7)};

const float *nf4q_table(int kind) {
    switch (kind) {
    case NF4Q_NF4: return nf4q_nf4_table;
    case NF4Q_INT4: return nf4q_int4_table;
    default: return NULL;
    }
}

const char *nf4q_kind_name(int kind) { return kind == NF4Q_INT4 ? "int4" : "nf4"; }

void nf4q_pack(const uint8_t *nibbles, size_t n, uint8_t *packed) {
    for (size_t i = 0; i + 1 < n; i += 2) packed[i / 2] = (uint8_t)((nibbles[i] & 0xF) | (nibbles[i + 1] & 0xF) << 4);
    if (n & 1) packed[n / 2] = (uint8_t)(nibbles[n - 1] & 0xF); /* odd tail: high nibble 0 */
}

void nf4q_unpack(const uint8_t *packed, size_t n, uint8_t *nibbles) {
    for (size_t i = 0; i < n; i++) nibbles[i] = nf4q_get(packed, i);
}

/* The code that decodes to 0 in each table. */
static uint8_t zero_code(int kind) { return kind == NF4Q_INT4 ? 8 : 7; }

static inline uint8_t encode_nf4(float x) {
    if (x != x) return 7; /* NaN: only reachable through the public nf4q_encode */
    int k = 0;
    for (int i = 0; i < 15; i++) k += x > nf4_mid[i];
    return (uint8_t)k;
}

/* q = round(y) half away from zero for |y| <= 7, from the truncation and
 * the exact remainder y - trunc(y) (adding 0.5 before truncating would
 * round 0.49999997 up). Integer-only, so the loops below vectorise. */
static inline int round_half_away(float y) {
    int q = (int)y;
    float r = y - (float)q;
    return q + (r >= 0.5f) - (r <= -0.5f);
}

/* q = round(x * 7), clamped to the symmetric grid. */
static inline uint8_t encode_int4(float x) {
    if (x != x) x = 0.0f; /* NaN: only reachable through the public nf4q_encode */
    if (x > 1.0f) x = 1.0f;
    if (x < -1.0f) x = -1.0f;
    return (uint8_t)(round_half_away(x * 7.0f) + 8);
}

uint8_t nf4q_encode(int kind, float x) { return kind == NF4Q_INT4 ? encode_int4(x) : encode_nf4(x); }

/* Codes of w(n) / m into nib(n), one per byte. Straight loops over whole
 * arrays, so the compiler vectorises the division and the comparisons (the
 * per-element packing loop it cannot). |w| <= m here, so x is in [-1, 1]:
 * no clamping. w / m is a true division, not w * (1/m): the absmax element
 * maps to exactly +-1. */
static void encode_run(int kind, const float *w, size_t n, float m, uint8_t *nib) {
    if (kind == NF4Q_INT4) {
        for (size_t i = 0; i < n; i++) nib[i] = (uint8_t)(round_half_away(w[i] / m * 7.0f) + 8);
    } else {
        for (size_t i = 0; i < n; i++) {
            float x = w[i] / m;
            int k = 0;
            for (int j = 0; j < 15; j++) k += x > nf4_mid[j];
            nib[i] = (uint8_t)k;
        }
    }
}

#define NF4Q_CHUNK 512 /* elements encoded per stack buffer; even */

float nf4q_quantize_block(int kind, const float *w, size_t n, uint8_t *codes) {
    float m = 0.0f;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(w[i]);
        finite &= a <= FLT_MAX; /* false for inf and NaN */
        m = a > m ? a : m;
    }
    if (!finite || m == 0.0f) {
        /* zeros decode to zeros through any absmax; a non-finite block gets
         * absmax NaN so all of it decodes to NaN (see nf4_quant.h) */
        uint8_t z = zero_code(kind);
        memset(codes, z | z << 4, n / 2);
        if (n & 1) codes[n / 2] = z;
        return finite ? 0.0f : NAN;
    }
    uint8_t nib[NF4Q_CHUNK];
    for (size_t s = 0; s < n; s += NF4Q_CHUNK) {
        size_t len = n - s < NF4Q_CHUNK ? n - s : NF4Q_CHUNK;
        encode_run(kind, w + s, len, m, nib);
        nf4q_pack(nib, len, codes + s / 2);
    }
    return m;
}

void nf4q_dequantize_block(int kind, const uint8_t *codes, size_t n, float absmax, float *out) {
    const float *t = nf4q_table(kind);
    if (!t) t = nf4q_nf4_table;
    for (size_t i = 0; i + 1 < n; i += 2) {
        uint8_t c = codes[i / 2];
        out[i] = absmax * t[c & 0xF];
        out[i + 1] = absmax * t[c >> 4];
    }
    if (n & 1) out[n - 1] = absmax * t[codes[n / 2] & 0xF];
}

void nf4q_quantize(int kind, const float *w, size_t numel, size_t block, uint8_t *codes, float *absmax) {
    size_t nb = nf4q_num_blocks(numel, block);
    for (size_t b = 0; b < nb; b++) {
        size_t start = b * block, len = numel - start < block ? numel - start : block;
        absmax[b] = nf4q_quantize_block(kind, w + start, len, codes + start / 2);
    }
}

void nf4q_dequantize(int kind, const uint8_t *codes, const float *absmax, size_t numel, size_t block, float *out) {
    size_t nb = nf4q_num_blocks(numel, block);
    for (size_t b = 0; b < nb; b++) {
        size_t start = b * block, len = numel - start < block ? numel - start : block;
        nf4q_dequantize_block(kind, codes + start / 2, len, absmax[b], out + start);
    }
}
