/*
 * IDX file reading for the idx plugin. A file is opened once; its first two
 * bytes decide between a plain read() path and a zlib gzFile path (gzip magic
 * 0x1f 0x8b, whatever the file is called). Sizes promised by the header are
 * computed in 64 bits and checked before anything is allocated; for raw files
 * the payload size is compared with the file size up front, and for gzip the
 * payload buffer grows with the data actually decompressed, so a lying header
 * cannot make us allocate gigabytes. Decompression stops at what the header
 * promises (header + dims x 1-byte elements) plus a small probe past it: the
 * probe must come back empty (exact size), so a gzip bomb is refused after
 * a few KiB beyond the promise, and that read is also what makes zlib reach
 * the member trailer and verify the CRC. Only regular files are read; they
 * are opened non-blocking so a FIFO is refused instead of hanging open().
 */
#define _POSIX_C_SOURCE 200809L

#include "idx_reader.h"
#include "../common/data_common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* First gzip buffer size when the final size is not known from the file size. */
#define IDX_GZ_INITIAL_CAP ((uint64_t)64 << 20)
/* gzread takes an unsigned and returns an int: read in chunks well below INT_MAX. */
#define IDX_READ_CHUNK ((size_t)1 << 30)


static const char *idx_magic_name(uint32_t magic) {
    switch (magic) {
    case IDX_MAGIC_IMAGES: return " (images)";
    case IDX_MAGIC_LABELS: return " (labels)";
    default:
        /* 0x1f8b.... can only be seen if a file was gzipped twice. */
        if ((magic >> 16) == 0x1f8bu) return " (gzip magic inside the decompressed data: gzipped twice?)";
        if ((magic >> 16) != 0) return " (not an IDX file)";
        return "";
    }
}

static uint32_t idx_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* What a non-regular file is, for the one-line refusal. */
static const char *idx_file_kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

/* One open input: a raw file descriptor, or a gzFile that owns that descriptor. */
typedef struct idx_src {
    const char *path;
    int fd;
    gzFile gz;         /* non-NULL iff the file starts with the gzip magic */
    bool size_known;   /* raw regular file: file_size is exact */
    uint64_t file_size;
} idx_src;

static int idx_src_open(idx_src *s, const char *path, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->path = path;
    s->fd = -1;
    if (!path) {
        dc_errf(err, errlen, "(null): no file path given");
        return IDX_EINVAL;
    }
    /* O_NONBLOCK: a plain open() of a FIFO waits for a writer forever,
     * before fstat() could tell us what the path is. */
    s->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (s->fd < 0) {
        dc_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return IDX_EIO;
    }
    struct stat st;
    if (fstat(s->fd, &st) != 0) {
        dc_errf(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(s->fd);
        s->fd = -1;
        return IDX_EIO;
    }
    /* Only regular files: a FIFO or device could block a read or never end. */
    if (!S_ISREG(st.st_mode)) {
        dc_errf(err, errlen, "%s: expected a regular file, found %s", path, idx_file_kind(st.st_mode));
        close(s->fd);
        s->fd = -1;
        return IDX_EIO;
    }
    int fl = fcntl(s->fd, F_GETFL);
    if (fl < 0 || fcntl(s->fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        dc_errf(err, errlen, "%s: cannot clear O_NONBLOCK: %s", path, strerror(errno));
        close(s->fd);
        s->fd = -1;
        return IDX_EIO;
    }
    uint8_t magic[2];
    ssize_t got;
    do got = pread(s->fd, magic, 2, 0);
    while (got < 0 && errno == EINTR);
    if (got < 0) {
        dc_errf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        close(s->fd);
        s->fd = -1;
        return IDX_EIO;
    }
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        s->gz = gzdopen(s->fd, "rb");
        if (!s->gz) {
            dc_errf(err, errlen, "%s: cannot start gzip decompression (out of memory)", path);
            close(s->fd);
            s->fd = -1;
            return IDX_ENOMEM;
        }
        gzbuffer(s->gz, 1u << 17); /* fewer read() calls than the 8 KiB default */
        return IDX_OK;
    }
    s->size_known = true;
    s->file_size = (uint64_t)st.st_size;
    return IDX_OK;
}

static void idx_src_close(idx_src *s) {
    if (s->gz) gzclose(s->gz); /* also closes fd */
    else if (s->fd >= 0) close(s->fd);
    s->gz = NULL;
    s->fd = -1;
}

/*
 * zlib's message for a gzdopen()ed file starts with "<fd:N>: "; our messages
 * already name the path, so keep only zlib's own words.
 */
static const char *idx_gz_msg(gzFile gz, int *zerr) {
    const char *msg = gzerror(gz, zerr);
    if (msg && strncmp(msg, "<fd:", 4) == 0) {
        const char *colon = strstr(msg, ": ");
        if (colon) msg = colon + 2;
    }
    return msg ? msg : "unknown zlib error";
}

/*
 * How a short read ended: IDX_SRC_EOF is a clean end of data, IDX_SRC_GZ_TRUNC
 * a gzip stream cut off before its end (zlib's Z_BUF_ERROR); anything else has
 * already produced an error message.
 */
enum { IDX_SRC_EOF = 0, IDX_SRC_GZ_TRUNC = 1 };

/*
 * Reads up to n bytes into buf; *got is how many arrived. Returns IDX_SRC_EOF or
 * IDX_SRC_GZ_TRUNC when fewer than n arrived for those reasons (or n arrived),
 * negative on an I/O error or a corrupt gzip stream (message written).
 */
static int idx_src_read(idx_src *s, void *buf, size_t n, size_t *got, char *err, size_t errlen) {
    uint8_t *p = buf;
    *got = 0;
    while (*got < n) {
        size_t want = n - *got;
        if (want > IDX_READ_CHUNK) want = IDX_READ_CHUNK;
        if (s->gz) {
            int r = gzread(s->gz, p + *got, (unsigned)want);
            if (r < 0) {
                int zerr = Z_OK;
                const char *msg = idx_gz_msg(s->gz, &zerr);
                if (zerr == Z_ERRNO)
                    dc_errf(err, errlen, "%s: cannot read: %s", s->path, strerror(errno));
                else
                    dc_errf(err, errlen, "%s: corrupt gzip stream: %s", s->path, msg);
                return zerr == Z_ERRNO ? IDX_EIO : IDX_EFORMAT;
            }
            *got += (size_t)r;
            if ((size_t)r < want) break; /* end of data or error: inspected below */
        } else {
            ssize_t r = read(s->fd, p + *got, want);
            if (r < 0) {
                if (errno == EINTR) continue;
                dc_errf(err, errlen, "%s: cannot read: %s", s->path, strerror(errno));
                return IDX_EIO;
            }
            if (r == 0) return IDX_SRC_EOF;
            *got += (size_t)r;
        }
    }
    if (s->gz && *got < n) {
        int zerr = Z_OK;
        const char *msg = idx_gz_msg(s->gz, &zerr);
        if (zerr == Z_BUF_ERROR) return IDX_SRC_GZ_TRUNC; /* "unexpected end of file" */
        if (zerr == Z_ERRNO) {
            dc_errf(err, errlen, "%s: cannot read: %s", s->path, strerror(errno));
            return IDX_EIO;
        }
        if (zerr != Z_OK) {
            dc_errf(err, errlen, "%s: corrupt gzip stream: %s", s->path, msg);
            return IDX_EFORMAT;
        }
    }
    return IDX_SRC_EOF;
}

/* " (gzip stream ended early: ...)" when the compressed file itself was cut off. */
static const char *idx_trunc_note(int how) {
    return how == IDX_SRC_GZ_TRUNC ? " (gzip stream ended early: unexpected end of file)" : "";
}

/*
 * Reads the header of hdr_len bytes (8 or 16) into hdr and checks its magic.
 * The magic is judged as soon as its 4 bytes are in, so a short label file
 * handed to the image reader is reported as the wrong kind of file, not as a
 * truncated one. A file shorter than its header is a truncation error.
 */
static int idx_read_header(idx_src *s, uint8_t *hdr, size_t hdr_len, uint32_t want_magic,
                           const char *kind, char *err, size_t errlen) {
    size_t got = 0;
    int how = idx_src_read(s, hdr, hdr_len, &got, err, errlen);
    if (how < 0) return how;
    if (got >= 4 && idx_be32(hdr) != want_magic) {
        uint32_t magic = idx_be32(hdr);
        dc_errf(err, errlen, "%s: expected magic 0x%08X (%s), found 0x%08X%s", s->path, want_magic, kind,
                 magic, idx_magic_name(magic));
        return IDX_EFORMAT;
    }
    if (got < hdr_len) {
        dc_errf(err, errlen, "%s: truncated: expected a %zu-byte IDX header but file has %zu bytes%s",
                 s->path, hdr_len, got, idx_trunc_note(how));
        return IDX_EFORMAT;
    }
    return IDX_OK;
}

/*
 * Reads exactly `need` payload bytes after the header, then checks there is
 * nothing more. `what` describes the header's promise for messages, e.g.
 * "60000 images of 28x28", and `kind` the payload ("pixel" / "label").
 * On success *out is a malloc'd buffer of `need` bytes.
 */
static int idx_read_payload(idx_src *s, size_t hdr_len, uint64_t need, const char *what,
                            const char *kind, uint8_t **out, char *err, size_t errlen) {
    if (need > SIZE_MAX) {
        dc_errf(err, errlen, "%s: header says %s (%llu bytes), more than this machine can address",
                 s->path, what, (unsigned long long)need);
        return IDX_EFORMAT;
    }
    if (s->size_known) {
        /* Raw file: decide truncation / trailing data before allocating anything. */
        /* The header was read in full, so only a file shrinking under us makes this < hdr_len. */
        uint64_t have = s->file_size > hdr_len ? s->file_size - hdr_len : 0;
        if (have < need) {
            dc_errf(err, errlen, "%s: truncated: header says %s (%llu bytes) but file has %llu bytes of %s data",
                     s->path, what, (unsigned long long)need, (unsigned long long)have, kind);
            return IDX_EFORMAT;
        }
        if (have > need) {
            dc_errf(err, errlen, "%s: trailing data: header says %s (%llu bytes) but file has %llu bytes of %s data",
                     s->path, what, (unsigned long long)need, (unsigned long long)have, kind);
            return IDX_EFORMAT;
        }
    }
    uint64_t cap = s->size_known || need < IDX_GZ_INITIAL_CAP ? need : IDX_GZ_INITIAL_CAP;
    uint8_t *buf = malloc((size_t)cap);
    if (!buf) {
        dc_errf(err, errlen, "%s: out of memory allocating %llu bytes of %s data", s->path,
                 (unsigned long long)cap, kind);
        return IDX_ENOMEM;
    }
    uint64_t have = 0;
    for (;;) {
        size_t got = 0;
        int how = idx_src_read(s, buf + have, (size_t)(cap - have), &got, err, errlen);
        if (how < 0) {
            free(buf);
            return how;
        }
        have += got;
        if (have < cap) {
            dc_errf(err, errlen, "%s: truncated: header says %s (%llu bytes) but file has %llu bytes of %s data%s",
                     s->path, what, (unsigned long long)need, (unsigned long long)have, kind,
                     idx_trunc_note(how));
            free(buf);
            return IDX_EFORMAT;
        }
        if (have == need) break;
        /* Only gzip gets here: grow geometrically towards the promised size. */
        uint64_t ncap = cap * 2 < need ? cap * 2 : need;
        uint8_t *nbuf = realloc(buf, (size_t)ncap);
        if (!nbuf) {
            dc_errf(err, errlen, "%s: out of memory allocating %llu bytes of %s data", s->path,
                     (unsigned long long)ncap, kind);
            free(buf);
            return IDX_ENOMEM;
        }
        buf = nbuf;
        cap = ncap;
    }
    /*
     * Exact size: no byte may follow. For gzip this read also verifies the CRC.
     * It is also the decompressed-size cap: a gzip bomb (a few MB inflating to
     * gigabytes) behind a small header is refused here, having cost at most
     * the header's promise in memory plus this small probe, never its size.
     */
    uint8_t extra[4096];
    size_t got = 0;
    int how = idx_src_read(s, extra, s->gz ? sizeof extra : 1, &got, err, errlen);
    if (how < 0) {
        free(buf);
        return how;
    }
    if (got > 0) {
        /* A full probe means there may be more: say "more than", not a size. */
        bool more = got == sizeof extra;
        uint64_t expect = hdr_len + need, found = expect + got - (more ? 1 : 0);
        if (s->gz)
            dc_errf(err, errlen, "%s: trailing data: header says %s (%llu bytes) but the gzip stream decompresses "
                     "to more: expected %llu bytes with the header, found %s%llu; refused without reading further",
                     s->path, what, (unsigned long long)need, (unsigned long long)expect, more ? "more than " : "",
                     (unsigned long long)found);
        else
            dc_errf(err, errlen, "%s: trailing data: header says %s (%llu bytes) but file has more %s data",
                     s->path, what, (unsigned long long)need, kind);
        free(buf);
        return IDX_EFORMAT;
    }
    if (how == IDX_SRC_GZ_TRUNC) {
        /* All data present but the gzip trailer (CRC, size) is missing. */
        dc_errf(err, errlen, "%s: truncated: gzip stream ends before its trailer (unexpected end of file) "
                 "after all %llu bytes of %s data", s->path, (unsigned long long)need, kind);
        free(buf);
        return IDX_EFORMAT;
    }
    *out = buf;
    return IDX_OK;
}

int idx_read_images(const char *path, uint8_t **pixels, uint32_t *count, uint32_t *rows,
                    uint32_t *cols, char *err, size_t errlen) {
    if (!pixels || !count || !rows || !cols) {
        dc_errf(err, errlen, "%s: idx_read_images: NULL output pointer", path ? path : "(null)");
        return IDX_EINVAL;
    }
    idx_src s;
    int rc = idx_src_open(&s, path, err, errlen);
    if (rc) return rc;
    uint8_t hdr[16];
    rc = idx_read_header(&s, hdr, sizeof hdr, IDX_MAGIC_IMAGES, "images", err, errlen);
    if (rc) goto done;
    uint32_t n = idx_be32(hdr + 4), r = idx_be32(hdr + 8), c = idx_be32(hdr + 12);
    uint64_t per = (uint64_t)r * c; /* both < 2^32: no overflow in 64 bits */
    if (n == 0 || r == 0 || c == 0 || per > IDX_MAX_IMAGE_PIXELS) {
        dc_errf(err, errlen, "%s: expected count > 0 and 0 < rows*cols <= %u, found %u images of %ux%u",
                 path, IDX_MAX_IMAGE_PIXELS, n, r, c);
        rc = IDX_EFORMAT;
        goto done;
    }
    char what[96];
    snprintf(what, sizeof what, "%u images of %ux%u", n, r, c);
    uint8_t *buf = NULL;
    /* n < 2^32 and per <= 2^20, so the product fits in 52 bits. */
    rc = idx_read_payload(&s, sizeof hdr, (uint64_t)n * per, what, "pixel", &buf, err, errlen);
    if (rc) goto done;
    *pixels = buf;
    *count = n;
    *rows = r;
    *cols = c;
done:
    idx_src_close(&s);
    return rc;
}

int idx_read_labels(const char *path, uint8_t **labels, uint32_t *count, char *err, size_t errlen) {
    if (!labels || !count) {
        dc_errf(err, errlen, "%s: idx_read_labels: NULL output pointer", path ? path : "(null)");
        return IDX_EINVAL;
    }
    idx_src s;
    int rc = idx_src_open(&s, path, err, errlen);
    if (rc) return rc;
    uint8_t hdr[8];
    rc = idx_read_header(&s, hdr, sizeof hdr, IDX_MAGIC_LABELS, "labels", err, errlen);
    if (rc) goto done;
    uint32_t n = idx_be32(hdr + 4);
    if (n == 0) {
        dc_errf(err, errlen, "%s: expected a label count > 0, found 0", path);
        rc = IDX_EFORMAT;
        goto done;
    }
    char what[64];
    snprintf(what, sizeof what, "%u labels", n);
    uint8_t *buf = NULL;
    rc = idx_read_payload(&s, sizeof hdr, n, what, "label", &buf, err, errlen);
    if (rc) goto done;
    *labels = buf;
    *count = n;
done:
    idx_src_close(&s);
    return rc;
}

void idx_free(void *p) { free(p); }

int idx_check_labels(const uint8_t *labels, uint32_t n, int num_classes, const char *path,
                     char *err, size_t errlen) {
    const char *name = path ? path : "(labels)";
    if (num_classes < 1 || num_classes > 256) {
        dc_errf(err, errlen, "%s: num_classes must be in 1..256 for uint8 labels, got %d", name, num_classes);
        return IDX_EINVAL;
    }
    if (n > 0 && !labels) {
        dc_errf(err, errlen, "%s: no label array given", name);
        return IDX_EINVAL;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (labels[i] >= num_classes) {
            dc_errf(err, errlen, "%s: label at index %u is %u, expected 0..%d (num_classes %d)", name, i,
                     (unsigned)labels[i], num_classes - 1, num_classes);
            return IDX_EINVAL;
        }
    }
    return IDX_OK;
}

int idx_open_dataset(const char *images_path, const char *labels_path, int num_classes,
                     idx_dataset *out, char *err, size_t errlen) {
    if (!out) {
        dc_errf(err, errlen, "idx_open_dataset: NULL output dataset");
        return IDX_EINVAL;
    }
    memset(out, 0, sizeof *out);
    idx_dataset ds = {0};
    uint32_t nlab = 0;
    int rc = idx_read_images(images_path, &ds.pixels, &ds.n, &ds.rows, &ds.cols, err, errlen);
    if (rc) return rc;
    rc = idx_read_labels(labels_path, &ds.labels, &nlab, err, errlen);
    if (rc) goto fail;
    if (nlab != ds.n) {
        dc_errf(err, errlen, "count mismatch: %s has %u images but %s has %u labels", images_path, ds.n,
                 labels_path, nlab);
        rc = IDX_EFORMAT;
        goto fail;
    }
    rc = idx_check_labels(ds.labels, ds.n, num_classes, labels_path, err, errlen);
    if (rc) goto fail;
    *out = ds;
    return IDX_OK;
fail:
    idx_dataset_free(&ds);
    return rc;
}

void idx_dataset_free(idx_dataset *ds) {
    if (!ds) return;
    free(ds->pixels);
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
}
