/*
 * The llm.c token shard format, shared by the "tokens" data plugin (which
 * reads shards) and kiln-text2tokens (which writes them): a header of 256
 * little-endian int32 — [0] the magic 20240520, [1] the version 1, [2] the
 * number of tokens — followed by that many little-endian uint16 tokens and
 * nothing else. Kept in one header so reader and writer cannot disagree.
 * The little-endian accessors also serve the plugin's state blob.
 */
#ifndef KILN_PLUGINS_TOK_FORMAT_H
#define KILN_PLUGINS_TOK_FORMAT_H

#include <stdint.h>

#define TOK_LLMC_MAGIC 20240520
#define TOK_LLMC_VERSION 1
#define TOK_LLMC_HEADER_INTS 256
#define TOK_LLMC_HEADER_BYTES (TOK_LLMC_HEADER_INTS * 4)
#define TOK_LLMC_TOKEN_BYTES 2
/* header[2] is an int32, so a shard holds at most this many tokens. */
#define TOK_LLMC_MAX_TOKENS INT32_MAX

static inline uint32_t tok_get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void tok_put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t tok_get_le64(const uint8_t *p) {
    return (uint64_t)tok_get_le32(p) | (uint64_t)tok_get_le32(p + 4) << 32;
}

static inline void tok_put_le64(uint8_t *p, uint64_t v) {
    tok_put_le32(p, (uint32_t)v);
    tok_put_le32(p + 4, (uint32_t)(v >> 32));
}

#endif
