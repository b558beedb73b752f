/*
 * nf4_export.c — the safetensors writer of the nf4/int4 precisions (format
 * in nf4_export.h). A safetensors file is an 8-byte little-endian header
 * length, a JSON header mapping tensor names to dtype, shape and
 * [begin, end) byte offsets into the data section, then the data. The
 * header is built in memory (it is small: a few lines per weight), the data
 * streams from the caller's buffers through a fixed stack chunk that also
 * fixes the byte order, so exporting a large model allocates only the
 * header. Atomic: temporary file in the target's directory, fsync, rename,
 * fsync of the directory; a reader never sees a half-written file.
 */
#define _POSIX_C_SOURCE 200809L

#include "nf4_export.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nf4_quant.h"

/* ---------------------------------------------------------------------------
 * A growable string for the JSON header */

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} nf4x_buf;

static void buf_putn(nf4x_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void buf_puts(nf4x_buf *b, const char *s) { buf_putn(b, s, strlen(s)); }

static void buf_printf(nf4x_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        b->oom = 1; /* only numbers go through here; never this long */
        return;
    }
    buf_putn(b, tmp, (size_t)n);
}

/* A JSON string literal: quotes, backslashes and control characters escaped
 * (parameter names are the module's, not ours to trust). */
static void buf_json_str(nf4x_buf *b, const char *s, const char *suffix) {
    buf_putn(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            buf_putn(b, e, 2);
        } else if (*p < 0x20) {
            buf_printf(b, "\\u%04x", *p);
        } else {
            buf_putn(b, (const char *)p, 1);
        }
    }
    if (suffix) buf_puts(b, suffix);
    buf_putn(b, "\"", 1);
}

/* ---------------------------------------------------------------------------
 * Sizes */

static size_t scale_elem_size(int scale_dtype) { return scale_dtype == NF4X_SCALE_F16 ? 2 : 4; }

void nf4x_sizes(const nf4x_weight *w, size_t n, size_t block_size, int scale_dtype, uint64_t *codes_bytes,
                uint64_t *scale_bytes) {
    uint64_t c = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        c += nf4q_packed_bytes(w[i].numel);
        s += (uint64_t)nf4q_num_blocks(w[i].numel, block_size) * scale_elem_size(scale_dtype);
    }
    *codes_bytes = c;
    *scale_bytes = s;
}

/* ---------------------------------------------------------------------------
 * float16 */

uint16_t nf4x_f16_bits_soft(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN: a quiet NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (and inf): inf */
    if (ax >= 0x38800000u) {                                  /* >= 2^-14: a normal half */
        uint32_t r = ax - 0x38000000u;                        /* exponent bias 127 -> 15 */
        return (uint16_t)(sign | (r + 0xfffu + ((r >> 13) & 1u)) >> 13);
    }
    if (ax < 0x33000000u) return (uint16_t)sign; /* below 2^-25: 0 (2^-25 itself ties to 0) */
    /* a subnormal half: the value in units of 2^-24, rounded to even */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - (ax >> 23);
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    q += rem > half || (rem == half && (q & 1u));
    return (uint16_t)(sign | q);
}

uint16_t nf4x_f16_bits(float f) {
#if defined(__FLT16_MAX__)
    _Float16 h = (_Float16)f;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
#else
    return nf4x_f16_bits_soft(f);
#endif
}

/* ---------------------------------------------------------------------------
 * Writing */

static int write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* The scales in little-endian F32 or F16, through a stack chunk. */
static int write_scales(int fd, const float *absmax, size_t nb, int scale_dtype) {
    unsigned char chunk[4096];
    size_t esz = scale_elem_size(scale_dtype), per = sizeof chunk / esz;
    for (size_t i = 0; i < nb; i += per) {
        size_t m = nb - i < per ? nb - i : per;
        for (size_t j = 0; j < m; j++) {
            uint32_t bits;
            if (scale_dtype == NF4X_SCALE_F16) {
                bits = nf4x_f16_bits(absmax[i + j]);
            } else {
                memcpy(&bits, &absmax[i + j], 4);
            }
            for (size_t k = 0; k < esz; k++) chunk[j * esz + k] = (unsigned char)(bits >> (8 * k));
        }
        if (write_all(fd, chunk, m * esz)) return -1;
    }
    return 0;
}

/* The JSON header, space-padded so 8 + its length is a multiple of 8. */
static int build_header(nf4x_buf *b, const char *quant, size_t block_size, int scale_dtype, const nf4x_weight *w,
                        size_t n) {
    buf_puts(b, "{\"__metadata__\":{\"format\":\"kiln-nf4-1\",\"quant\":");
    buf_json_str(b, quant, NULL);
    buf_printf(b, ",\"block_size\":\"%zu\",\"scale_dtype\":\"%s\"", block_size,
               scale_dtype == NF4X_SCALE_F16 ? "float16" : "float32");
    for (size_t i = 0; i < n; i++) {
        buf_puts(b, ",");
        buf_json_str(b, w[i].name, ".shape");
        buf_puts(b, ":\"[");
        for (uint32_t d = 0; d < w[i].ndim; d++) buf_printf(b, d ? ",%lld" : "%lld", (long long)w[i].shape[d]);
        buf_puts(b, "]\"");
    }
    buf_puts(b, "}");
    uint64_t off = 0;
    const char *sdt = scale_dtype == NF4X_SCALE_F16 ? "F16" : "F32";
    for (size_t i = 0; i < n; i++) { /* all scales first: they stay 2/4-byte aligned */
        size_t nb = nf4q_num_blocks(w[i].numel, block_size);
        uint64_t end = off + (uint64_t)nb * scale_elem_size(scale_dtype);
        buf_puts(b, ",");
        buf_json_str(b, w[i].name, ".absmax");
        buf_printf(b, ":{\"dtype\":\"%s\",\"shape\":[%zu],\"data_offsets\":[%llu,%llu]}", sdt, nb,
                   (unsigned long long)off, (unsigned long long)end);
        off = end;
    }
    for (size_t i = 0; i < n; i++) {
        size_t nc = nf4q_packed_bytes(w[i].numel);
        buf_puts(b, ",");
        buf_json_str(b, w[i].name, ".codes");
        buf_printf(b, ":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[%llu,%llu]}", nc,
                   (unsigned long long)off, (unsigned long long)(off + nc));
        off += nc;
    }
    buf_puts(b, "}");
    while (!b->oom && (8 + b->len) % 8) buf_puts(b, " ");
    return b->oom ? -1 : 0;
}

static int fail(char *err, size_t errlen, const char *what, const char *path, int e) {
    snprintf(err, errlen, "%s %s: %s", what, path, strerror(e));
    return -1;
}

int nf4x_write(const char *path, const char *quant, size_t block_size, int scale_dtype, const nf4x_weight *w,
               size_t n, char *err, size_t errlen) {
    if (!path || !*path || !quant || block_size < 2 || (n && !w)) {
        snprintf(err, errlen, "nf4x_write: invalid arguments");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (!w[i].name || !w[i].codes || !w[i].absmax || !w[i].numel || w[i].ndim < 1 || w[i].ndim > 8) {
            snprintf(err, errlen, "nf4x_write: weight %zu (%s) is empty or malformed", i,
                     w[i].name ? w[i].name : "(unnamed)");
            return -1;
        }
    nf4x_buf hdr = {0};
    if (build_header(&hdr, quant, block_size, scale_dtype, w, n)) {
        free(hdr.s);
        snprintf(err, errlen, "out of memory building the safetensors header for %s", path);
        return -1;
    }

    /* Same directory as the target, so rename() is atomic. */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) {
        free(hdr.s);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int rc = fail(err, errlen, "cannot create", tmp, errno);
        free(hdr.s);
        free(tmp);
        return rc;
    }
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)hdr.len >> (8 * k));
    int bad = write_all(fd, len8, 8) || write_all(fd, hdr.s, hdr.len);
    for (size_t i = 0; i < n && !bad; i++)
        bad = write_scales(fd, w[i].absmax, nf4q_num_blocks(w[i].numel, block_size), scale_dtype);
    for (size_t i = 0; i < n && !bad; i++) bad = write_all(fd, w[i].codes, nf4q_packed_bytes(w[i].numel));
    free(hdr.s);
    if (bad || fsync(fd)) {
        int e = errno;
        close(fd);
        unlink(tmp);
        int rc = fail(err, errlen, "cannot write", tmp, e);
        free(tmp);
        return rc;
    }
    if (close(fd)) {
        int rc = fail(err, errlen, "cannot close", tmp, errno);
        unlink(tmp);
        free(tmp);
        return rc;
    }
    if (rename(tmp, path)) {
        int rc = fail(err, errlen, "cannot rename the temporary file to", path, errno);
        unlink(tmp);
        free(tmp);
        return rc;
    }
    free(tmp);

    /* Make the rename itself durable; best effort (some filesystems refuse
     * fsync on a directory, and the data is already safe). */
    char *dir = strdup(path);
    if (dir) {
        char *slash = strrchr(dir, '/');
        const char *d = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
        int dfd = open(d, O_RDONLY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    return 0;
}
