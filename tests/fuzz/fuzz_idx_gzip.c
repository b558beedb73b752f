/*
 * tests/fuzz/fuzz_idx_gzip.c — fuzz target for the gzip path of the IDX
 * reader (plugins/idx/idx_reader.c). Mutated compressed bytes are almost
 * never a valid deflate stream, so this target compresses the input itself
 * and then damages the result the ways a real download goes wrong:
 *
 *   byte 0: bit 0 images (else labels); bits 1-3 how to damage the stream:
 *           0 none, 1 cut it short, 2 flip one byte, 3 drop the 8-byte
 *           trailer, 4 append garbage, 5 append a second gzip member of the
 *           same data, 6 wrap it twice (gzip inside gzip); bits 4-7 the
 *           compression level
 *   bytes 1-2: where to cut or flip (little endian, modulo the length)
 *   the rest: the decompressed file (an IDX header and payload)
 *
 * Anything may be refused; a crash, a sanitizer report, or an accepted
 * stream whose contents differ from what was compressed is a bug. The
 * decompression cap (a stream inflating past the header's promise is
 * refused) is what keeps a compressible input from costing more memory.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "fuzz_util.h"
#include "idx_reader.h"

static void fz_check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_idx_gzip: invariant broken: %s\n", what);
        abort();
    }
}

/* A gzip member of src into a malloc'd buffer; NULL on failure. */
static uint8_t *fz_gzip(const uint8_t *src, size_t n, int level, size_t *out_n) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return NULL;
    size_t cap = deflateBound(&z, (uLong)n) + 16;
    uint8_t *out = malloc(cap);
    if (!out) {
        deflateEnd(&z);
        return NULL;
    }
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    int rc = deflate(&z, Z_FINISH);
    *out_n = cap - z.avail_out;
    deflateEnd(&z);
    if (rc != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3 || size > (1u << 20)) return 0;
    fz_in in = {data, size};
    uint8_t ctl = fz_u8(&in);
    uint32_t where = fz_u8(&in);
    where |= (uint32_t)fz_u8(&in) << 8;
    int images = ctl & 1, how = (ctl >> 1) & 7, level = (ctl >> 4) % 10;
    size_t zn = 0;
    uint8_t *z = fz_gzip(in.p, in.n, level, &zn);
    if (!z) return 0;
    int intact = 1;
    switch (how) {
    case 1: zn = zn ? where % zn : 0; intact = 0; break;
    case 2: if (zn) z[where % zn] ^= (uint8_t)(1u << (ctl >> 5)); intact = 0; break;
    case 3: zn = zn > 8 ? zn - 8 : 0; intact = 0; break;
    case 4: {
        uint8_t *g = realloc(z, zn + 4);
        if (!g) { free(z); return 0; }
        z = g;
        memcpy(z + zn, "\x13\x37\x00\xff", 4);
        zn += 4;
        intact = 0;
        break;
    }
    case 5: {
        uint8_t *g = realloc(z, 2 * zn);
        if (!g) { free(z); return 0; }
        z = g;
        memcpy(z + zn, z, zn);
        zn *= 2;
        intact = 0; /* twice the data: more than the header promised */
        break;
    }
    case 6: {
        size_t z2n = 0;
        uint8_t *z2 = fz_gzip(z, zn, level, &z2n);
        free(z);
        if (!z2) return 0;
        z = z2;
        zn = z2n;
        intact = 0;
        break;
    }
    default: break;
    }
    const char *path = fz_memfile("idxgz", z, zn);
    free(z);
    char err[512];
    uint8_t *buf = NULL;
    uint32_t n = 0, r = 0, c = 0;
    int rc;
    size_t hdr = images ? 16 : 8;
    if (images) rc = idx_read_images(path, &buf, &n, &r, &c, err, sizeof err);
    else rc = idx_read_labels(path, &buf, &n, err, sizeof err);
    if (rc == IDX_OK) {
        size_t bytes = images ? (size_t)n * r * c : n;
        /* an intact stream decompresses to the input; a damaged one that is
         * still accepted must at least hold what its header promised */
        if (intact) fz_check(hdr + bytes == in.n && !memcmp(buf, in.p + hdr, bytes), "contents differ");
        volatile uint8_t s = buf[0] ^ buf[bytes - 1];
        (void)s;
        idx_free(buf);
    } else {
        fz_check(buf == NULL, "a refusal returned data");
    }
    return 0;
}
