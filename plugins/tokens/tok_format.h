/*
 * The llm.c token shard format, shared by the "tokens" data plugin (which
 * reads shards) and kiln-text2tokens (which writes them): a header of 256
 * little-endian int32 — [0] the magic 20240520, [1] the version 1, [2] the
 * number of tokens — followed by that many little-endian uint16 tokens and
 * nothing else. Kept in one header so reader and writer cannot disagree.
 * Fields are little-endian: dc_get_le32 / dc_put_le32 of
 * ../common/data_common.h read and write them (and the plugin's state blob).
 */
#ifndef KILN_PLUGINS_TOK_FORMAT_H
#define KILN_PLUGINS_TOK_FORMAT_H

#include <stdint.h>

#include "../common/data_common.h"

#define TOK_LLMC_MAGIC 20240520
#define TOK_LLMC_VERSION 1
#define TOK_LLMC_HEADER_INTS 256
#define TOK_LLMC_HEADER_BYTES (TOK_LLMC_HEADER_INTS * 4)
#define TOK_LLMC_TOKEN_BYTES 2
/* header[2] is an int32, so a shard holds at most this many tokens. */
#define TOK_LLMC_MAX_TOKENS INT32_MAX

#endif
