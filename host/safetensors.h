/*
 * host/safetensors.h — kiln's checkpoint file format: one file per checkpoint
 * in the safetensors layout (an 8-byte little-endian header length N, N bytes
 * of JSON mapping tensor names to dtype, shape and data_offsets plus an
 * optional "__metadata__" object of strings, padded with spaces to a multiple
 * of 8, then the tensors' bytes packed back to back). The writer collects
 * tensors and metadata and replaces the target file atomically (temp file,
 * fsync, rename, fsync of the directory), so a crash leaves the old checkpoint
 * or the new one, never a torn one. The reader loads a whole file and
 * validates every structural rule of the format before handing out a tensor,
 * so a truncated or corrupt checkpoint is refused with a one-line reason
 * rather than read as garbage. Every tensor's XXH3-64 is stored in the
 * metadata as "kiln.xxh3.<name>" = 16 lowercase hex digits and verified on
 * every read (a file without these entries loads unverified). Every function returns a kiln_status code and,
 * on failure, writes the status and a one-line message into the caller's
 * ht_error (error.h).
 */
#ifndef KILN_HOST_SAFETENSORS_H
#define KILN_HOST_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "kiln/status.h"

/* Most dimensions a tensor may have; enough for every tensor kiln trains. */
#define KST_MAX_DIMS 8

/* Largest header the reader accepts; a larger N means a corrupt length word. */
#define KST_MAX_HEADER_BYTES ((uint64_t)100 << 20)

/* Bytes per element of a safetensors dtype name ("F32", "BF16", "I64", ...);
 * 0 when the name is unknown. Byte-sized dtypes only: BOOL, U8, I8, F8_E5M2,
 * F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64 (the
 * sub-byte F4/F6 kinds are refused). */
size_t safetensors_dtype_size(const char *dtype);

/* ---------------------------------------------------------------------------
 * Writer */

typedef struct safetensors_writer safetensors_writer;

/* NULL when out of memory. */
safetensors_writer *safetensors_writer_new(void);

/* Add a tensor. The data is REFERENCED, not copied: it must stay valid and
 * unchanged until the last safetensors_write_atomic() that should contain it has
 * returned (checkpoints are the size of the model; a copy would double the
 * host memory a save needs). data may be NULL when nbytes is 0. Tensors are
 * written in the order added, packed with no alignment padding. ndim is 0..
 * KST_MAX_DIMS (0 is a scalar, one element); nbytes must equal the product
 * of shape times safetensors_dtype_size(dtype). Refused with KILN_E_INVALID_ARG: an
 * unknown dtype, a bad shape, a size mismatch, an empty name, a name that is
 * not valid UTF-8, the reserved name "__metadata__", a duplicate name. */
int safetensors_add_tensor(safetensors_writer *w, const char *name, const char *dtype, const int64_t *shape, int ndim,
                   const void *data, size_t nbytes, ht_error *err);

/* Add one "__metadata__" entry. Key and value are copied; both must be valid
 * UTF-8 (any characters, quotes, backslashes and newlines included: they are
 * escaped in the JSON). Duplicate keys are refused (KILN_E_INVALID_ARG). */
int safetensors_add_metadata(safetensors_writer *w, const char *key, const char *value, ht_error *err);

/* Write everything added so far to path: the file is built as
 * "<path>.tmp.<pid>" in the same directory, fsynced, renamed over path, and
 * the directory fsynced. On failure the temp file is removed and path is left
 * as it was (KILN_E_IO, or KILN_E_NOMEM); the one exception is a failing
 * fsync of the directory after the rename, reported as KILN_E_IO with the new
 * file already in place. The writer is not consumed: it may be written again. */
int safetensors_write_atomic(safetensors_writer *w, const char *path, ht_error *err);

/* Checksums are on by default; off writes exactly the reference writer's
 * bytes (tests that compare layouts). */
void safetensors_writer_checksums(safetensors_writer *w, int on);

void safetensors_writer_free(safetensors_writer *w);

/* ---------------------------------------------------------------------------
 * Reader */

typedef struct safetensors_tensor {
    const char *name;   /* UTF-8, NUL-terminated                             */
    const char *dtype;  /* "F32", "BF16", ...                                */
    int ndim;
    int64_t shape[KST_MAX_DIMS];
    const void *data;   /* into the file's bytes: no alignment is promised,  */
    size_t nbytes;      /* so read elements with memcpy                      */
} safetensors_tensor;

typedef struct safetensors_file safetensors_file;

/* Read and validate the whole file at path. KILN_E_IO when it cannot be read,
 * KILN_E_NOMEM, KILN_E_DATA when it breaks any rule of the format or a
 * tensor's bytes do not match its stored checksum (the message names the
 * file, the rule or the tensor). *out is NULL on failure. */
int safetensors_open(const char *path, safetensors_file **out, ht_error *err);

int safetensors_count(const safetensors_file *f);
/* Tensors in the order of the header; NULL when i is out of range. */
const safetensors_tensor *safetensors_get(const safetensors_file *f, int i);
/* NULL when there is no tensor of that name. */
const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name);
/* The "__metadata__" value for key, or NULL when absent. The checksum
 * entries ("kiln.xxh3.*") are not part of this view: they are checked by
 * safetensors_open and counted by safetensors_checksum_count. */
const char *safetensors_metadata(const safetensors_file *f, const char *key);
int safetensors_metadata_count(const safetensors_file *f);
/* i-th metadata entry in header order; returns 0, or -1 when out of range. */
int safetensors_metadata_get(const safetensors_file *f, int i, const char **key, const char **value);
/* How many tensors' checksums safetensors_open verified: safetensors_count(f) for a file
 * kiln wrote, 0 for one without checksums. */
int safetensors_checksum_count(const safetensors_file *f);

void safetensors_close(safetensors_file *f);

#endif
