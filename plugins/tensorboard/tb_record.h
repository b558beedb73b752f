/*
 * tb_record.h — the byte-level half of the tensorboard callback: CRC-32C
 * (Castagnoli), the masked CRC TFRecord framing uses, and a hand-written
 * encoder for the two tensorflow.Event messages the logger writes (the
 * file_version header and a Summary of simple_value scalars). No protobuf
 * library: the messages are tiny, fixed in shape, and the field numbers are
 * frozen by TensorBoard's event.proto/summary.proto. Kept apart from the
 * plugin glue so the test can compile this file and check the exact CRC code
 * the plugin runs against the known check values. Nothing here does I/O.
 *
 * Record layout (TFRecord, all little endian):
 *   uint64 length | uint32 masked_crc32c(length bytes) | data[length] |
 *   uint32 masked_crc32c(data)
 */
#ifndef KILN_TB_RECORD_H
#define KILN_TB_RECORD_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of `n` bytes continuing from `crc` (0 to start): the reflected
 * polynomial 0x82F63B78 with the usual ~ pre/post conditioning, so
 * tb_crc32c(tb_crc32c(0, a), b) is the CRC of a followed by b. */
uint32_t tb_crc32c(uint32_t crc, const void *data, size_t n);

/* TensorFlow's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32). It
 * exists so that a CRC stored inside CRC'd data does not checksum to a
 * trivial value. */
uint32_t tb_mask_crc(uint32_t crc);

/* A growable byte buffer; `oom` sticks once an allocation failed, so a run
 * of appends needs one check at the end. */
typedef struct tb_buf {
    unsigned char *data; /* (cap) bytes, the first len used */
    size_t len, cap;
    int oom;
} tb_buf;

void tb_buf_free(tb_buf *b);

/* One scalar of a Summary: Summary.Value{tag, simple_value}. */
typedef struct tb_scalar {
    const char *tag;
    float value;
} tb_scalar;

/* Append one framed record holding Event{wall_time, file_version}.
 * Returns 0, or -1 when out of memory. */
int tb_append_version_record(tb_buf *out, double wall_time, const char *file_version);

/* Append one framed record holding
 * Event{wall_time, step, summary = Summary{value = scalars[0..n)}}.
 * Returns 0, or -1 when out of memory. */
int tb_append_scalars_record(tb_buf *out, double wall_time, int64_t step, const tb_scalar *scalars, size_t n);

#endif /* KILN_TB_RECORD_H */
