/*
 * CUnit tests for the idx plugin's reader and loader. The reader tests write
 * small IDX files (raw and gzipped through zlib) into a mkdtemp() folder and
 * check both the data and the exact wording promised by the error messages
 * (path, expected and found values). The loader tests run on an in-memory
 * dataset whose images encode their own index in the first two pixels, so
 * every batch can be decoded back to the sample ids it holds and checked for
 * permutation, sharding, resume and determinism properties. One test reads the
 * real Fashion-MNIST test set when the Debian package is installed.
 */
#define _POSIX_C_SOURCE 200809L

#include <CUnit/CUnit.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "cunit_skip.h"
#include "idx_loader.h"
#include "idx_reader.h"

#ifndef FMNIST_DIR /* overridable, e.g. to exercise the skip path */
#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#endif

/* ------------------------------------------------------------------------ */
/* Scratch folder and file helpers */

static char g_dir[64];
#define MAX_FILES 128
static char *g_files[MAX_FILES];
static int g_nfiles;

static int suite_init(void) {
    strcpy(g_dir, "/tmp/kiln-idx-test-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int suite_clean(void) {
    for (int i = 0; i < g_nfiles; i++) {
        unlink(g_files[i]);
        free(g_files[i]);
    }
    g_nfiles = 0;
    return rmdir(g_dir) == 0 ? 0 : -1;
}

/* Returns a path in the scratch folder, remembered for cleanup (the name may repeat). */
static const char *scratch_path(const char *name) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", g_dir, name);
    for (int i = 0; i < g_nfiles; i++)
        if (strcmp(g_files[i], buf) == 0) return g_files[i];
    if (g_nfiles == MAX_FILES) return NULL;
    g_files[g_nfiles] = strdup(buf);
    return g_files[g_nfiles++];
}

/* Writes bytes to name, gzip-compressed when gz; returns the path. */
static const char *write_file(const char *name, const uint8_t *bytes, size_t len, int gz) {
    const char *path = scratch_path(name);
    if (!path) return NULL;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (!f) return NULL;
        if (len > 0 && gzwrite(f, bytes, (unsigned)len) != (int)len) {
            gzclose(f);
            return NULL;
        }
        return gzclose(f) == Z_OK ? path : NULL;
    }
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    size_t w = fwrite(bytes, 1, len, f);
    return fclose(f) == 0 && w == len ? path : NULL;
}

/* Reads a whole file into a malloc'd buffer (to corrupt or cut gzip files). */
static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint8_t known_pixel(uint32_t i, uint32_t d) { return (uint8_t)((i * 7u + d * 3u + (i * d) % 11u) & 255u); }

/* An IDX3 image file image in memory: header (magic, n, r, c) + n*r*c known pixels. */
static uint8_t *make_images(uint32_t magic, uint32_t n, uint32_t r, uint32_t c, size_t *len) {
    size_t payload = (size_t)n * r * c;
    uint8_t *b = malloc(16 + payload);
    put_be32(b, magic);
    put_be32(b + 4, n);
    put_be32(b + 8, r);
    put_be32(b + 12, c);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t d = 0; d < r * c; d++) b[16 + (size_t)i * r * c + d] = known_pixel(i, d);
    *len = 16 + payload;
    return b;
}

static uint8_t *make_labels(uint32_t magic, uint32_t n, int num_classes, size_t *len) {
    uint8_t *b = malloc(8 + n);
    put_be32(b, magic);
    put_be32(b + 4, n);
    for (uint32_t i = 0; i < n; i++) b[8 + i] = (uint8_t)((i * 3u) % (uint32_t)num_classes);
    *len = 8 + n;
    return b;
}

#define ASSERT_MSG_HAS(msg, needle)                                                   \
    do {                                                                              \
        if (!strstr((msg), (needle)))                                                 \
            fprintf(stderr, "\n    message \"%s\" lacks \"%s\"\n", (msg), (needle)); \
        CU_ASSERT_PTR_NOT_NULL(strstr((msg), (needle)));                              \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Reader */

static void check_images_file(int gz) {
    size_t len;
    uint8_t *b = make_images(IDX_MAGIC_IMAGES, 5, 4, 3, &len);
    const char *path = write_file(gz ? "img5.gz" : "img5.raw", b, len, gz);
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    uint8_t *px = NULL;
    uint32_t n = 0, r = 0, c = 0;
    char err[512] = "";
    int rc = idx_read_images(path, &px, &n, &r, &c, err, sizeof err);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc) fprintf(stderr, "\n    %s\n", err);
    CU_ASSERT_EQUAL(n, 5);
    CU_ASSERT_EQUAL(r, 4);
    CU_ASSERT_EQUAL(c, 3);
    CU_ASSERT(px && memcmp(px, b + 16, len - 16) == 0);
    if (px) CU_ASSERT_EQUAL(px[2 * 12 + 5], known_pixel(2, 5));
    idx_free(px);
    free(b);
}

static void test_read_images_raw(void) { check_images_file(0); }
static void test_read_images_gz(void) { check_images_file(1); }

static void test_read_labels_raw_and_gz(void) {
    for (int gz = 0; gz < 2; gz++) {
        size_t len;
        uint8_t *b = make_labels(IDX_MAGIC_LABELS, 7, 10, &len);
        const char *path = write_file(gz ? "lab7.gz" : "lab7.raw", b, len, gz);
        CU_ASSERT_PTR_NOT_NULL_FATAL(path);
        uint8_t *lab = NULL;
        uint32_t n = 0;
        char err[512] = "";
        CU_ASSERT_EQUAL(idx_read_labels(path, &lab, &n, err, sizeof err), 0);
        CU_ASSERT_EQUAL(n, 7);
        CU_ASSERT(lab && memcmp(lab, b + 8, 7) == 0);
        idx_free(lab);
        free(b);
    }
}

/* Gzip is recognised by its magic bytes: a gzip file named .raw and a raw file named .gz both read. */
static void test_gzip_detected_by_magic_not_name(void) {
    size_t len;
    uint8_t *b = make_images(IDX_MAGIC_IMAGES, 3, 2, 2, &len);
    const char *gz_named_raw = write_file("really-gzip.raw", b, len, 1);
    const char *raw_named_gz = write_file("really-raw.gz", b, len, 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(gz_named_raw);
    CU_ASSERT_PTR_NOT_NULL_FATAL(raw_named_gz);
    const char *paths[2] = {gz_named_raw, raw_named_gz};
    for (int i = 0; i < 2; i++) {
        uint8_t *px = NULL;
        uint32_t n, r, c;
        char err[512] = "";
        CU_ASSERT_EQUAL(idx_read_images(paths[i], &px, &n, &r, &c, err, sizeof err), 0);
        CU_ASSERT(px && n == 3 && memcmp(px, b + 16, 12) == 0);
        idx_free(px);
    }
    free(b);
}

static void test_wrong_magic(void) {
    size_t len;
    uint8_t *lab = make_labels(IDX_MAGIC_LABELS, 40, 10, &len);
    const char *lpath = write_file("labels-as-images.gz", lab, len, 1);
    uint8_t *px = NULL;
    uint32_t n = 0, r = 0, c = 0;
    char err[512] = "";
    CU_ASSERT_EQUAL(idx_read_images(lpath, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    CU_ASSERT_PTR_NULL(px);
    ASSERT_MSG_HAS(err, lpath);
    ASSERT_MSG_HAS(err, "expected magic 0x00000803 (images), found 0x00000801");

    uint8_t *img = make_images(IDX_MAGIC_IMAGES, 2, 2, 2, &len);
    const char *ipath = write_file("images-as-labels.raw", img, len, 0);
    uint8_t *l = NULL;
    CU_ASSERT_EQUAL(idx_read_labels(ipath, &l, &n, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, ipath);
    ASSERT_MSG_HAS(err, "expected magic 0x00000801 (labels), found 0x00000803");
    free(img);

    /* A file shorter than the other kind's header still gets the magic diagnosis. */
    free(lab);
    lab = make_labels(IDX_MAGIC_LABELS, 2, 10, &len); /* 10 bytes < 16-byte images header */
    lpath = write_file("short-labels.raw", lab, len, 0);
    CU_ASSERT_EQUAL(idx_read_images(lpath, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, "expected magic 0x00000803 (images), found 0x00000801 (labels)");
    free(lab);

    /* Arbitrary bytes: the found magic is still printed. */
    img = make_images(0x12345678u, 2, 2, 2, &len);
    ipath = write_file("garbage-magic.raw", img, len, 0);
    CU_ASSERT_EQUAL(idx_read_images(ipath, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, "found 0x12345678");
    free(img);
}

static void check_truncated(int gz) {
    size_t len;
    uint8_t *b = make_images(IDX_MAGIC_IMAGES, 5, 4, 3, &len); /* 60 pixel bytes */
    const char *path = write_file(gz ? "trunc.gz" : "trunc.raw", b, len - 7, gz);
    uint8_t *px = NULL;
    uint32_t n = 0, r = 0, c = 0;
    char err[512] = "";
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    CU_ASSERT_PTR_NULL(px);
    ASSERT_MSG_HAS(err, path);
    ASSERT_MSG_HAS(err, "truncated: header says 5 images of 4x3 (60 bytes) but file has 53 bytes of pixel data");
    free(b);

    /* Labels too. */
    b = make_labels(IDX_MAGIC_LABELS, 9, 10, &len);
    path = write_file(gz ? "trunc-lab.gz" : "trunc-lab.raw", b, len - 1, gz);
    uint8_t *l = NULL;
    CU_ASSERT_EQUAL(idx_read_labels(path, &l, &n, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, "truncated: header says 9 labels (9 bytes) but file has 8 bytes of label data");
    free(b);

    /* Shorter than the header. */
    b = make_images(IDX_MAGIC_IMAGES, 1, 1, 1, &len);
    path = write_file(gz ? "trunc-hdr.gz" : "trunc-hdr.raw", b, 10, gz);
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, "truncated: expected a 16-byte IDX header but file has 10 bytes");
    free(b);
}

static void test_truncated_raw(void) { check_truncated(0); }
static void test_truncated_gz(void) { check_truncated(1); }

/* A gzip file cut in the middle of its compressed stream. */
static void test_truncated_gzip_stream(void) {
    size_t len, zlen;
    uint8_t *b = make_images(IDX_MAGIC_IMAGES, 200, 28, 28, &len);
    const char *full = write_file("full.gz", b, len, 1);
    uint8_t *z = slurp(full, &zlen);
    CU_ASSERT_PTR_NOT_NULL_FATAL(z);
    const char *cut = write_file("cut.gz", z, zlen * 6 / 10, 0);
    uint8_t *px = NULL;
    uint32_t n, r, c;
    char err[512] = "";
    CU_ASSERT_EQUAL(idx_read_images(cut, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    CU_ASSERT_PTR_NULL(px);
    ASSERT_MSG_HAS(err, cut);
    ASSERT_MSG_HAS(err, "truncated: header says 200 images of 28x28 (156800 bytes)");
    ASSERT_MSG_HAS(err, "unexpected end of file");

    /* All data there, gzip trailer (CRC + size) cut off. */
    const char *notrailer = write_file("notrailer.gz", z, zlen - 8, 0);
    CU_ASSERT_EQUAL(idx_read_images(notrailer, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, "truncated");
    ASSERT_MSG_HAS(err, "trailer");
    free(z);
    free(b);
}

static void test_trailing_data(void) {
    for (int gz = 0; gz < 2; gz++) {
        size_t len;
        uint8_t *b = make_images(IDX_MAGIC_IMAGES, 5, 4, 3, &len);
        uint8_t *longer = malloc(len + 3);
        memcpy(longer, b, len);
        memset(longer + len, 0xAB, 3);
        const char *path = write_file(gz ? "trailing.gz" : "trailing.raw", longer, len + 3, gz);
        uint8_t *px = NULL;
        uint32_t n, r, c;
        char err[512] = "";
        CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
        CU_ASSERT_PTR_NULL(px);
        ASSERT_MSG_HAS(err, "trailing data: header says 5 images of 4x3 (60 bytes)");
        free(longer);
        free(b);
    }
}

static void test_corrupt_gzip(void) {
    /* A valid gzip header followed by a deflate block of reserved type 3. */
    uint8_t bad[32] = {0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0x03};
    memset(bad + 10, 0xFF, sizeof bad - 10);
    const char *path = write_file("corrupt.gz", bad, sizeof bad, 0);
    uint8_t *px = NULL;
    uint32_t n, r, c;
    char err[512] = "";
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    CU_ASSERT_PTR_NULL(px);
    ASSERT_MSG_HAS(err, path);
    ASSERT_MSG_HAS(err, "corrupt gzip stream: invalid block type");

    /* Intact data, wrong CRC in the trailer: caught by the read past the payload. */
    size_t len, zlen;
    uint8_t *b = make_images(IDX_MAGIC_IMAGES, 5, 4, 3, &len);
    const char *good = write_file("crc.gz", b, len, 1);
    uint8_t *z = slurp(good, &zlen);
    CU_ASSERT_PTR_NOT_NULL_FATAL(z);
    z[zlen - 8] ^= 0x5A;
    path = write_file("crc.gz", z, zlen, 0);
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    CU_ASSERT_PTR_NULL(px);
    ASSERT_MSG_HAS(err, "corrupt gzip stream: incorrect data check");
    free(z);
    free(b);
}

static void test_bad_dimensions(void) {
    size_t len;
    char err[512] = "";
    uint8_t *px = NULL;
    uint32_t n, r, c;
    uint8_t hdr[16];
    put_be32(hdr, IDX_MAGIC_IMAGES);
    put_be32(hdr + 4, 0);
    put_be32(hdr + 8, 28);
    put_be32(hdr + 12, 28);
    const char *path = write_file("zero-count.raw", hdr, 16, 0);
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, "found 0 images of 28x28");

    /* rows*cols would overflow 32 bits; nothing may be allocated for it. */
    put_be32(hdr + 4, 0xFFFFFFFFu);
    put_be32(hdr + 8, 0x10000u);
    put_be32(hdr + 12, 0x10000u);
    path = write_file("huge.raw", hdr, 16, 0);
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, "rows*cols <= 1048576");

    /* A plausible but lying header on a gzip file: truncation, not a giant allocation. */
    put_be32(hdr + 4, 0xFFFFFFFFu);
    put_be32(hdr + 8, 1024);
    put_be32(hdr + 12, 1024);
    path = write_file("liar.gz", hdr, 16, 1);
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, "truncated: header says 4294967295 images of 1024x1024");
    ASSERT_MSG_HAS(err, "file has 0 bytes of pixel data");

    uint8_t *lab = make_labels(IDX_MAGIC_LABELS, 0, 10, &len);
    path = write_file("zero-labels.raw", lab, len, 0);
    uint8_t *l = NULL;
    CU_ASSERT_EQUAL(idx_read_labels(path, &l, &n, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, "expected a label count > 0, found 0");
    free(lab);
}

/* Peak resident set of this process, in KiB. */
static long max_rss_kib(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

/*
 * A gzip bomb: a header promising 5 images of 4x3 (76 bytes with the header)
 * followed by 256 MiB of zeros, about 250 KiB compressed. It must be refused
 * as decompressing past the header's promise, promptly and without the
 * 256 MiB ever being resident.
 */
static void test_gzip_bomb(void) {
    size_t len;
    uint8_t *b = make_images(IDX_MAGIC_IMAGES, 5, 4, 3, &len);
    const char *path = scratch_path("bomb.gz");
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    gzFile f = gzopen(path, "wb9");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(gzwrite(f, b, (unsigned)len), (int)len);
    uint8_t *zeros = calloc(1, 1u << 20);
    CU_ASSERT_PTR_NOT_NULL_FATAL(zeros);
    for (int i = 0; i < 256; i++) CU_ASSERT_EQUAL(gzwrite(f, zeros, 1u << 20), 1 << 20);
    CU_ASSERT_EQUAL_FATAL(gzclose(f), Z_OK);
    free(zeros);
    struct stat st;
    CU_ASSERT_FATAL(stat(path, &st) == 0 && st.st_size < (1 << 20));

    long rss0 = max_rss_kib();
    uint8_t *px = NULL;
    uint32_t n, r, c;
    char err[512] = "";
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EFORMAT);
    CU_ASSERT_PTR_NULL(px);
    long rss1 = max_rss_kib();
    ASSERT_MSG_HAS(err, path);
    ASSERT_MSG_HAS(err, "header says 5 images of 4x3 (60 bytes)");
    ASSERT_MSG_HAS(err, "expected 76 bytes with the header, found more than 4171;");
    CU_ASSERT_PTR_NULL(strchr(err, '\n'));
    /* The peak may not have grown by anything like the bomb's 256 MiB. */
    if (rss1 - rss0 >= 32 * 1024) fprintf(stderr, "\n    peak RSS grew by %ld KiB\n", rss1 - rss0);
    CU_ASSERT(rss1 - rss0 < 32 * 1024);

    /* Same for labels, and a small excess is counted exactly. */
    uint8_t *lab = make_labels(IDX_MAGIC_LABELS, 7, 10, &len);
    uint8_t *longer = calloc(1, len + 100);
    memcpy(longer, lab, len);
    path = write_file("labels-plus-100.gz", longer, len + 100, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    uint8_t *l = NULL;
    CU_ASSERT_EQUAL(idx_read_labels(path, &l, &n, err, sizeof err), IDX_EFORMAT);
    CU_ASSERT_PTR_NULL(l);
    ASSERT_MSG_HAS(err, "expected 15 bytes with the header, found 115;");
    free(longer);
    free(lab);
    free(b);
}

/*
 * A FIFO with no writer: open() without O_NONBLOCK waits forever. The alarm
 * turns a regression into a killed test binary instead of a hung suite.
 */
static void test_fifo_refused(void) {
    const char *path = scratch_path("fifo.gz");
    CU_ASSERT_PTR_NOT_NULL_FATAL(path);
    unlink(path);
    CU_ASSERT_EQUAL_FATAL(mkfifo(path, 0600), 0);
    alarm(10);
    uint8_t *px = NULL;
    uint32_t n, r, c;
    char err[512] = "";
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EIO);
    CU_ASSERT_PTR_NULL(px);
    ASSERT_MSG_HAS(err, path);
    ASSERT_MSG_HAS(err, "expected a regular file, found a FIFO");
    uint8_t *l = NULL;
    CU_ASSERT_EQUAL(idx_read_labels(path, &l, &n, err, sizeof err), IDX_EIO);
    ASSERT_MSG_HAS(err, "expected a regular file, found a FIFO");
    /* A directory is refused the same way. */
    CU_ASSERT_EQUAL(idx_read_labels(g_dir, &l, &n, err, sizeof err), IDX_EIO);
    ASSERT_MSG_HAS(err, "expected a regular file, found a directory");
    alarm(0);
}

static void test_missing_file(void) {
    const char *path = scratch_path("does-not-exist.gz");
    uint8_t *px = NULL;
    uint32_t n, r, c;
    char err[512] = "";
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, err, sizeof err), IDX_EIO);
    ASSERT_MSG_HAS(err, path);
    ASSERT_MSG_HAS(err, "cannot open");
    /* NULL err buffer is allowed. */
    CU_ASSERT_EQUAL(idx_read_images(path, &px, &n, &r, &c, NULL, 0), IDX_EIO);
}

static void test_label_out_of_range(void) {
    uint8_t labels[6] = {0, 1, 9, 12, 3, 200};
    char err[512] = "";
    CU_ASSERT_EQUAL(idx_check_labels(labels, 6, 10, "/x/labels.gz", err, sizeof err), IDX_EINVAL);
    ASSERT_MSG_HAS(err, "/x/labels.gz");
    ASSERT_MSG_HAS(err, "label at index 3 is 12, expected 0..9");
    CU_ASSERT_EQUAL(idx_check_labels(labels, 3, 10, "/x/labels.gz", err, sizeof err), 0);
    CU_ASSERT_EQUAL(idx_check_labels(labels, 6, 256, "/x/labels.gz", err, sizeof err), 0);
    CU_ASSERT_EQUAL(idx_check_labels(labels, 6, 0, "/x/labels.gz", err, sizeof err), IDX_EINVAL);

    /* Through idx_open_dataset. */
    size_t len;
    uint8_t *img = make_images(IDX_MAGIC_IMAGES, 5, 2, 2, &len);
    const char *ipath = write_file("ds5-images.gz", img, len, 1);
    uint8_t *lab = make_labels(IDX_MAGIC_LABELS, 5, 10, &len);
    lab[8 + 4] = 10;
    const char *lpath = write_file("ds5-badlabels.gz", lab, len, 1);
    idx_dataset ds;
    CU_ASSERT_EQUAL(idx_open_dataset(ipath, lpath, 10, &ds, err, sizeof err), IDX_EINVAL);
    ASSERT_MSG_HAS(err, lpath);
    ASSERT_MSG_HAS(err, "label at index 4 is 10");
    CU_ASSERT_PTR_NULL(ds.pixels);
    CU_ASSERT_PTR_NULL(ds.labels);
    free(img);
    free(lab);
}

static void test_open_dataset_and_count_mismatch(void) {
    size_t len;
    uint8_t *img = make_images(IDX_MAGIC_IMAGES, 5, 2, 3, &len);
    const char *ipath = write_file("ds-images.gz", img, len, 1);
    uint8_t *lab = make_labels(IDX_MAGIC_LABELS, 5, 10, &len);
    const char *lpath = write_file("ds-labels.raw", lab, len, 0);
    uint8_t *lab4 = make_labels(IDX_MAGIC_LABELS, 4, 10, &len);
    const char *l4path = write_file("ds-labels4.gz", lab4, len, 1);
    char err[512] = "";
    idx_dataset ds;
    CU_ASSERT_EQUAL_FATAL(idx_open_dataset(ipath, lpath, 10, &ds, err, sizeof err), 0);
    CU_ASSERT(ds.n == 5 && ds.rows == 2 && ds.cols == 3);
    CU_ASSERT(memcmp(ds.pixels, img + 16, 30) == 0);
    CU_ASSERT(memcmp(ds.labels, lab + 8, 5) == 0);
    idx_dataset_free(&ds);
    CU_ASSERT_PTR_NULL(ds.pixels);
    idx_dataset_free(&ds); /* twice is fine */

    CU_ASSERT_EQUAL(idx_open_dataset(ipath, l4path, 10, &ds, err, sizeof err), IDX_EFORMAT);
    ASSERT_MSG_HAS(err, "count mismatch");
    ASSERT_MSG_HAS(err, ipath);
    ASSERT_MSG_HAS(err, "5 images");
    ASSERT_MSG_HAS(err, l4path);
    ASSERT_MSG_HAS(err, "4 labels");
    CU_ASSERT_PTR_NULL(ds.pixels);
    free(img);
    free(lab);
    free(lab4);
}

/* ------------------------------------------------------------------------ */
/* Loader on a synthetic in-memory dataset */

#define SYN_R 3
#define SYN_C 4
#define SYN_D (SYN_R * SYN_C)

/* Image i: pixels 0 and 1 hold i (low, high byte); the rest is known content. Label i % 10. */
static idx_dataset make_syn(uint32_t n) {
    idx_dataset ds = {0};
    ds.n = n;
    ds.rows = SYN_R;
    ds.cols = SYN_C;
    ds.pixels = malloc((size_t)n * SYN_D);
    ds.labels = malloc(n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *p = ds.pixels + (size_t)i * SYN_D;
        p[0] = (uint8_t)(i & 255);
        p[1] = (uint8_t)(i >> 8);
        for (int d = 2; d < SYN_D; d++) p[d] = known_pixel(i, (uint32_t)d);
        ds.labels[i] = (uint8_t)(i % 10);
    }
    return ds;
}

/* The loader defaults over ds with batch_size; seed != 0: shuffled with
 * that seed (the defaults keep the order, seed 0). */
static idx_loader_config loader_cfg(const idx_dataset *ds, uint32_t batch_size, uint64_t seed) {
    idx_loader_config cfg;
    idx_loader_config_defaults(&cfg, ds);
    cfg.batch_size = batch_size;
    cfg.shuffle = seed != 0;
    cfg.seed = seed;
    return cfg;
}

/* idx_loader_init that must succeed (fatal: the case reads from it). */
static void loader_open(idx_loader *L, const idx_loader_config *cfg) {
    char err[256] = "";
    const int rc = idx_loader_init(L, cfg, err, sizeof err);
    if (rc) fprintf(stderr, "\n    idx_loader_init: %s\n", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
}

/* Sample id of row x (D) under the default normalisation (x = p/255). */
static long decode_id(const float *x) {
    return lround(x[0] * 255.0f) + 256 * lround(x[1] * 255.0f);
}

/* Checks row j of a batch against the dataset exactly; returns the id or -1. */
static long check_row(const idx_dataset *ds, const float *x, const int32_t *y, int j) {
    long id = decode_id(x + (size_t)j * SYN_D);
    if (id < 0 || id >= (long)ds->n) return -1;
    for (int d = 0; d < SYN_D; d++)
        if (x[(size_t)j * SYN_D + d] != (float)ds->pixels[(size_t)id * SYN_D + d] / 255.0f) return -1;
    if (y[j] != ds->labels[id]) return -1;
    return id;
}

/*
 * Runs one epoch from start_batch; writes sample ids in order to ids (up to cap)
 * and batch lengths to lens. Returns the number of samples, or -1 on inconsistency.
 */
static long run_epoch(idx_loader *L, const idx_dataset *ds, uint64_t epoch, uint64_t start, long *ids,
                      long cap, int *lens, int *nbatches) {
    if (idx_loader_start_epoch(L, epoch, start) != 0) return -1;
    long n = 0;
    int nb = 0;
    const float *x;
    const int32_t *y;
    int len, rc;
    while ((rc = idx_loader_next(L, &x, &y, &len)) == 1) {
        if (lens) lens[nb] = len;
        nb++;
        for (int j = 0; j < len; j++) {
            long id = check_row(ds, x, y, j);
            if (id < 0) return -1;
            if (n < cap) ids[n] = id;
            n++;
        }
    }
    if (rc != 0) return -1;
    if (nbatches) *nbatches = nb;
    return n;
}

static void test_loader_sequential(void) {
    idx_dataset ds = make_syn(10);
    idx_loader_config cfg;
    idx_loader_config_defaults(&cfg, &ds);
    cfg.batch_size = 4;
    idx_loader L;
    loader_open(&L, &cfg);
    CU_ASSERT_EQUAL(idx_loader_num_batches(&L), 3);
    CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 0, 0), 0);
    const float *x;
    const int32_t *y;
    int len;
    long expect = 0;
    for (int b = 0; b < 3; b++) {
        CU_ASSERT_EQUAL_FATAL(idx_loader_next(&L, &x, &y, &len), 1);
        CU_ASSERT_EQUAL(len, b < 2 ? 4 : 2);
        for (int j = 0; j < len; j++) CU_ASSERT_EQUAL(check_row(&ds, x, y, j), expect++);
        if (b == 2) { /* the padding rows of a partial batch: x 0, y -1 */
            for (int j = len; j < 4; j++) {
                CU_ASSERT_EQUAL(y[j], -1);
                for (int d = 0; d < SYN_D; d++) CU_ASSERT_EQUAL(x[j * SYN_D + d], 0.0f);
            }
        }
    }
    CU_ASSERT_EQUAL(idx_loader_next(&L, &x, &y, &len), 0);
    CU_ASSERT_EQUAL(idx_loader_next(&L, &x, &y, &len), 0); /* stays at the end */
    idx_loader_free(&L);

    /* A sub-range [3, 8) as for a validation split. */
    cfg.begin = 3;
    cfg.end = 8;
    loader_open(&L, &cfg);
    long ids[8];
    CU_ASSERT_EQUAL(run_epoch(&L, &ds, 0, 0, ids, 8, NULL, NULL), 5);
    for (int i = 0; i < 5; i++) CU_ASSERT_EQUAL(ids[i], 3 + i);
    idx_loader_free(&L);
    idx_dataset_free(&ds);
}

static int is_permutation_of_range(const long *ids, long n, long begin) {
    char *seen = calloc((size_t)n, 1);
    int ok = 1;
    for (long i = 0; i < n && ok; i++) {
        long k = ids[i] - begin;
        if (k < 0 || k >= n || seen[k]) ok = 0;
        else seen[k] = 1;
    }
    free(seen);
    return ok;
}

static void test_loader_shuffle(void) {
    enum { N = 1000, BEGIN = 100 };
    idx_dataset ds = make_syn(1200);
    idx_loader_config cfg = loader_cfg(&ds, 32, 42);
    cfg.begin = BEGIN;
    cfg.end = BEGIN + N;
    idx_loader A, B;
    loader_open(&A, &cfg);
    loader_open(&B, &cfg);
    static long e0[N], e1[N], e1b[N], e0again[N], other[N];
    CU_ASSERT_EQUAL(run_epoch(&A, &ds, 0, 0, e0, N, NULL, NULL), N);
    CU_ASSERT_EQUAL(run_epoch(&A, &ds, 1, 0, e1, N, NULL, NULL), N);
    CU_ASSERT_EQUAL(run_epoch(&B, &ds, 1, 0, e1b, N, NULL, NULL), N);
    CU_ASSERT_EQUAL(run_epoch(&A, &ds, 0, 0, e0again, N, NULL, NULL), N);
    CU_ASSERT(is_permutation_of_range(e0, N, BEGIN));
    CU_ASSERT(is_permutation_of_range(e1, N, BEGIN));
    CU_ASSERT(memcmp(e0, e1, sizeof e0) != 0);      /* epochs differ */
    CU_ASSERT(memcmp(e1, e1b, sizeof e1) == 0);     /* same (seed, epoch), other loader */
    CU_ASSERT(memcmp(e0, e0again, sizeof e0) == 0); /* same (seed, epoch), later */
    long fixed = 0, ascending = 0;
    for (int i = 0; i < N; i++) fixed += e0[i] == BEGIN + i;
    for (int i = 1; i < N; i++) ascending += e0[i] > e0[i - 1];
    CU_ASSERT(fixed < 20);                           /* ~1 expected for a random permutation */
    CU_ASSERT(ascending > 400 && ascending < 600);   /* ~N/2 expected */
    idx_loader_free(&B);

    cfg.seed = 43;
    loader_open(&B, &cfg);
    CU_ASSERT_EQUAL(run_epoch(&B, &ds, 0, 0, other, N, NULL, NULL), N);
    CU_ASSERT(memcmp(e0, other, sizeof e0) != 0); /* another seed, another order */
    idx_loader_free(&A);
    idx_loader_free(&B);
    idx_dataset_free(&ds);
}

/* Shards of W ranks vs. the single-rank order with the same seed (PyTorch DistributedSampler). */
static void check_distributed(uint32_t N, uint32_t W, int drop_last, uint32_t B) {
    idx_dataset ds = make_syn(N + 3);
    idx_loader_config cfg = loader_cfg(&ds, B, 7);
    cfg.begin = 2;
    cfg.end = 2 + N;
    cfg.drop_last = false;
    idx_loader full;
    loader_open(&full, &cfg);
    long *order = calloc(N, sizeof *order);
    CU_ASSERT_EQUAL(run_epoch(&full, &ds, 3, 0, order, N, NULL, NULL), (long)N);
    idx_loader_free(&full);

    uint64_t per = drop_last ? N / W : (N + W - 1) / W;
    uint64_t total = per * W;
    int *hits = calloc(total, sizeof *hits); /* per padded position */
    long *shard = calloc(per + 1, sizeof *shard);
    cfg.drop_last = drop_last != 0;
    cfg.world_size = W;
    for (uint32_t rank = 0; rank < W; rank++) {
        cfg.rank = rank;
        idx_loader L;
        loader_open(&L, &cfg);
        CU_ASSERT_EQUAL(idx_loader_num_samples(&L), per);
        long got = run_epoch(&L, &ds, 3, 0, shard, (long)per + 1, NULL, NULL);
        /* with drop_last, whole batches only */
        uint64_t expect = drop_last ? per / B * B : per;
        CU_ASSERT_EQUAL(got, (long)expect);
        for (long i = 0; i < got && i < (long)per; i++) {
            uint64_t pos = rank + (uint64_t)i * W; /* this rank's i-th padded position */
            CU_ASSERT_EQUAL(shard[i], order[pos % N]);
            hits[pos]++;
        }
        idx_loader_free(&L);
    }
    /* Disjoint and covering: every padded position exactly once (when no batch was dropped). */
    if (!drop_last || per % B == 0)
        for (uint64_t p = 0; p < total; p++) CU_ASSERT_EQUAL(hits[p], 1);
    free(hits);
    free(shard);
    free(order);
    idx_dataset_free(&ds);
}

static void test_loader_distributed(void) {
    check_distributed(11, 2, 0, 1); /* padded to 12: order[0] appears twice */
    check_distributed(11, 2, 1, 1); /* truncated to 10: disjoint, no repeat */
    check_distributed(11, 2, 0, 4); /* 6 per rank: batches 4 + 2 */
    check_distributed(2, 5, 0, 1);  /* padding longer than the range wraps repeatedly */
    check_distributed(100, 3, 1, 8);

    /* Explicit: W=2, N=11, padded set = order + order[0]; rank shards are disjoint positions. */
    idx_dataset ds = make_syn(11);
    idx_loader_config cfg = loader_cfg(&ds, 5, 99);
    cfg.world_size = 2;
    long ids[2][8];
    int count[11] = {0};
    for (uint32_t r = 0; r < 2; r++) {
        cfg.rank = r;
        idx_loader L;
        loader_open(&L, &cfg);
        CU_ASSERT_EQUAL(idx_loader_num_batches(&L), 2); /* 6 samples: 5 + 1 */
        CU_ASSERT_EQUAL(run_epoch(&L, &ds, 0, 0, ids[r], 8, NULL, NULL), 6);
        for (int i = 0; i < 6; i++) count[ids[r][i]]++;
        idx_loader_free(&L);
    }
    int twice = 0;
    for (int i = 0; i < 11; i++) {
        CU_ASSERT(count[i] == 1 || count[i] == 2);
        twice += count[i] == 2;
    }
    CU_ASSERT_EQUAL(twice, 1);
    CU_ASSERT_EQUAL(count[ids[0][0]], 2); /* the repeated one is the first of the epoch order */
    idx_dataset_free(&ds);
}

static void test_loader_drop_last(void) {
    idx_dataset ds = make_syn(10);
    idx_loader_config cfg = loader_cfg(&ds, 3, 5);
    char err[256] = "";
    idx_loader L;
    int lens[8];
    int nb = 0;
    long ids[16];
    cfg.drop_last = true;
    loader_open(&L, &cfg);
    CU_ASSERT_EQUAL(idx_loader_num_batches(&L), 3);
    CU_ASSERT_EQUAL(run_epoch(&L, &ds, 0, 0, ids, 16, lens, &nb), 9);
    CU_ASSERT_EQUAL(nb, 3);
    for (int b = 0; b < nb; b++) CU_ASSERT_EQUAL(lens[b], 3);
    idx_loader_free(&L);

    cfg.drop_last = false;
    loader_open(&L, &cfg);
    CU_ASSERT_EQUAL(idx_loader_num_batches(&L), 4);
    CU_ASSERT_EQUAL(run_epoch(&L, &ds, 0, 0, ids, 16, lens, &nb), 10);
    CU_ASSERT_EQUAL(nb, 4);
    CU_ASSERT_EQUAL(lens[3], 1);
    idx_loader_free(&L);

    /* drop_last with fewer samples than one batch is a configuration error. */
    cfg.drop_last = true;
    cfg.batch_size = 11;
    CU_ASSERT_EQUAL(idx_loader_init(&L, &cfg, err, sizeof err), IDX_EINVAL);
    ASSERT_MSG_HAS(err, "fewer than batch_size 11");
    idx_dataset_free(&ds);
}

/* Copies of every batch of one full pass, for bitwise comparisons. */
typedef struct pass {
    int nb;
    int len[64];
    float x[64][8 * SYN_D]; /* (batch, B*D) with B <= 8 */
    int32_t y[64][8];
} pass;

/* Records a pass; copies exactly the loader's B rows of every batch (padding rows included). */
static int record_pass(idx_loader *L, uint64_t epoch, uint64_t start, pass *p, long pause_us) {
    memset(p, 0, sizeof *p);
    const uint32_t B = L->cfg.batch_size;
    if (B > 8) return -1;
    if (idx_loader_start_epoch(L, epoch, start) != 0) return -1;
    const float *x;
    const int32_t *y;
    int len, rc;
    while ((rc = idx_loader_next(L, &x, &y, &len)) == 1) {
        if (p->nb == 64) return -1;
        p->len[p->nb] = len;
        memcpy(p->x[p->nb], x, (size_t)B * SYN_D * sizeof *x);
        memcpy(p->y[p->nb], y, (size_t)B * sizeof *y);
        p->nb++;
        if (pause_us) {
            struct timespec ts = {0, pause_us * 1000};
            nanosleep(&ts, NULL); /* a slow "training step": the producer runs ahead */
        }
    }
    return rc;
}

static int same_batch(const pass *a, int ia, const pass *b, int ib) {
    return a->len[ia] == b->len[ib] && memcmp(a->x[ia], b->x[ib], sizeof a->x[0]) == 0 &&
           memcmp(a->y[ia], b->y[ib], sizeof a->y[0]) == 0;
}

static void test_loader_resume_from_batch(void) {
    idx_dataset ds = make_syn(45);
    idx_loader_config cfg = loader_cfg(&ds, 8, 1234);
    idx_loader L;
    loader_open(&L, &cfg);
    static pass full, part;
    CU_ASSERT_EQUAL_FATAL(record_pass(&L, 2, 0, &full, 0), 0);
    CU_ASSERT_EQUAL(full.nb, 6);
    for (int k = 0; k <= full.nb; k++) {
        CU_ASSERT_EQUAL_FATAL(record_pass(&L, 2, (uint64_t)k, &part, 0), 0);
        CU_ASSERT_EQUAL(part.nb, full.nb - k);
        for (int b = 0; b < part.nb; b++) CU_ASSERT(same_batch(&part, b, &full, k + b));
    }
    CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 2, 7), IDX_EINVAL); /* past the end */
    idx_loader_free(&L);
    idx_dataset_free(&ds);
}

static void test_loader_position(void) {
    idx_dataset ds = make_syn(45);
    idx_loader_config cfg = loader_cfg(&ds, 8, 77);
    cfg.prefetch = 4;
    idx_loader L;
    loader_open(&L, &cfg);
    static pass full;
    CU_ASSERT_EQUAL_FATAL(record_pass(&L, 3, 0, &full, 0), 0);

    uint64_t e = 99, b = 99;
    CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 3, 0), 0);
    idx_loader_position(&L, &e, &b);
    CU_ASSERT(e == 3 && b == 0);
    const float *x;
    const int32_t *y;
    int len;
    uint64_t saved_e = 0, saved_b = 0;
    for (int k = 0; k < 6; k++) {
        /* Let the prefetcher run ahead: the position must not follow it. */
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        idx_loader_position(&L, &e, &b);
        CU_ASSERT(e == 3 && b == (uint64_t)k);
        CU_ASSERT_EQUAL_FATAL(idx_loader_next(&L, &x, &y, &len), 1);
        idx_loader_position(&L, &e, &b);
        CU_ASSERT(e == 3 && b == (uint64_t)k + 1);
        if (k == 2) idx_loader_position(&L, &saved_e, &saved_b); /* "checkpoint after batch 2" */
    }
    CU_ASSERT_EQUAL(idx_loader_next(&L, &x, &y, &len), 0);
    idx_loader_position(&L, &e, &b);
    CU_ASSERT(e == 3 && b == 6 && b == (uint64_t)idx_loader_num_batches(&L));
    idx_loader_free(&L);

    /* Resume in a fresh loader from the checkpoint: batch 3 onwards, identical data. */
    loader_open(&L, &cfg);
    static pass rest;
    CU_ASSERT_EQUAL_FATAL(record_pass(&L, saved_e, saved_b, &rest, 0), 0);
    CU_ASSERT_EQUAL(saved_b, 3);
    CU_ASSERT_EQUAL(rest.nb, 3);
    for (int i = 0; i < rest.nb; i++) CU_ASSERT(same_batch(&rest, i, &full, 3 + i));
    idx_loader_free(&L);
    idx_dataset_free(&ds);
}

static void test_loader_bit_identical(void) {
    idx_dataset ds = make_syn(300);
    idx_loader_config cfg = loader_cfg(&ds, 7, 0xDEADBEEFull);
    cfg.mean = 0.2860f;
    cfg.std = 0.3530f;
    cfg.begin = 10;
    cfg.end = 290;
    cfg.world_size = 3;
    cfg.rank = 1;
    idx_loader A, B;
    cfg.prefetch = 1;
    loader_open(&A, &cfg);
    cfg.prefetch = IDX_LOADER_MAX_PREFETCH;
    loader_open(&B, &cfg);
    static pass pa, pb;
    for (uint64_t epoch = 0; epoch < 3; epoch++) {
        /* A consumes fast, B slowly so its producer is always ahead: same bytes anyway. */
        CU_ASSERT_EQUAL_FATAL(record_pass(&A, epoch, 0, &pa, 0), 0);
        CU_ASSERT_EQUAL_FATAL(record_pass(&B, epoch, 0, &pb, 300), 0);
        CU_ASSERT_EQUAL(pa.nb, 14); /* ceil(280/3) = 94 samples -> 13 x 7 + 3 */
        CU_ASSERT_EQUAL(pa.nb, pb.nb);
        CU_ASSERT(memcmp(&pa, &pb, sizeof pa) == 0);
    }
    idx_loader_free(&A);
    idx_loader_free(&B);
    idx_dataset_free(&ds);
}

/* start_epoch while batches are prefetched or held, repeatedly; free with a full ring. */
static void test_loader_restart_mid_epoch(void) {
    idx_dataset ds = make_syn(200);
    idx_loader_config cfg = loader_cfg(&ds, 4, 3);
    idx_loader L;
    loader_open(&L, &cfg);
    static pass ref[3], got;
    for (int e = 0; e < 3; e++) CU_ASSERT_EQUAL_FATAL(record_pass(&L, (uint64_t)e, 0, &ref[e], 0), 0);
    const float *x;
    const int32_t *y;
    int len;
    for (int round = 0; round < 200; round++) {
        uint64_t e = (uint64_t)round % 3;
        CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, e, (uint64_t)round % 7), 0);
        for (int k = 0; k < round % 5; k++) {
            CU_ASSERT_EQUAL_FATAL(idx_loader_next(&L, &x, &y, &len), 1);
            int b = round % 7 + k;
            CU_ASSERT(len == ref[e].len[b] && memcmp(x, ref[e].x[b], (size_t)len * SYN_D * sizeof *x) == 0);
        }
    }
    /* After all that churn, a full pass is still exact. */
    CU_ASSERT_EQUAL_FATAL(record_pass(&L, 1, 0, &got, 0), 0);
    CU_ASSERT(memcmp(&got, &ref[1], sizeof got) == 0);
    /* Free with a full ring and the producer asleep. */
    CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 0, 0), 0);
    CU_ASSERT_EQUAL(idx_loader_next(&L, &x, &y, &len), 1);
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
    idx_loader_free(&L);
    /* Free right after start_epoch, producer busy. */
    loader_open(&L, &cfg);
    CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 0, 0), 0);
    idx_loader_free(&L);
    idx_loader_free(&L); /* twice is fine */
    idx_dataset_free(&ds);
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* With the ring full (or the epoch done) the producer must sleep, not spin. */
static void test_loader_producer_sleeps(void) {
    idx_dataset ds = make_syn(200);
    idx_loader_config cfg;
    idx_loader_config_defaults(&cfg, &ds);
    cfg.batch_size = 4;
    idx_loader L;
    loader_open(&L, &cfg);
    struct timespec settle = {0, 20000000}, wait = {0, 300000000};
    /* Idle before the first epoch, then with a full ring mid-epoch. */
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1) CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 0, 0), 0);
        nanosleep(&settle, NULL);
        double t0 = cpu_seconds();
        nanosleep(&wait, NULL);
        double used = cpu_seconds() - t0;
        if (used >= 0.05) fprintf(stderr, "\n    phase %d: %.3f s of CPU in 0.3 s of waiting\n", phase, used);
        CU_ASSERT(used < 0.05);
    }
    idx_loader_free(&L);
    idx_dataset_free(&ds);
}

/* Automatic prefetch sizes the ring by bytes; a slow consumer does not pay
 * for waking the producer (it sleeps on timed waits sized from the pace),
 * and still finds its batches ready. */
static void test_loader_auto_prefetch_wakes(void) {
    idx_dataset ds = make_syn(400);
    idx_loader_config cfg;
    idx_loader_config_defaults(&cfg, &ds);
    cfg.batch_size = 4;
    char err[256] = "";
    idx_loader L;
    loader_open(&L, &cfg);
    CU_ASSERT_EQUAL(L.nslots, IDX_LOADER_AUTO_MAX + 1);
    CU_ASSERT_EQUAL(L.wake_free, (IDX_LOADER_AUTO_MAX + 2) / 2);
    CU_ASSERT_EQUAL_FATAL(idx_loader_start_epoch(&L, 0, 0), 0);
    const float *x;
    const int32_t *y;
    int len, nb = 0;
    struct timespec slow = {0, 2000000};
    while (idx_loader_next(&L, &x, &y, &len) == 1) {
        CU_ASSERT_EQUAL(y[0], ds.labels[(size_t)nb * 4]); /* in order: no shuffle */
        nb++;
        nanosleep(&slow, NULL); /* the producer fills the ring and sleeps */
    }
    CU_ASSERT_EQUAL(nb, 100);
    /* Once the consumer's pace is known (after two batches) the producer
     * sleeps on timed waits and wakes itself: the consumer woke it at most
     * a couple of times at the start, and found a batch ready nearly every
     * time (the first one of the epoch may not be). Waking it per batch
     * would be ~100 wakes, at half a ring free ~20; the bounds leave room
     * for a loaded machine (a late timed wake-up means one wait and one wake). */
    fprintf(stderr, "\n    %d batches: producer woken %llu times, consumer waited %llu times\n", nb,
            (unsigned long long)L.prod_wakes, (unsigned long long)L.cons_waits);
    CU_ASSERT(L.prod_wakes <= 10);
    CU_ASSERT(L.cons_waits <= 10);
    idx_loader_free(&L);
    idx_dataset_free(&ds);

    /* A batch of 4.2 MB: 32 MiB holds 7 of them. A 20 MB one: the minimum 2. */
    ds = make_syn(2);
    ds.rows = 1024;
    ds.cols = 1024; /* the pixels are never read: only sizes matter here */
    ds.n = 1;
    idx_loader_config_defaults(&cfg, &ds);
    cfg.batch_size = 1;
    loader_open(&L, &cfg);
    CU_ASSERT_EQUAL(L.nslots, 7 + 1);
    idx_loader_free(&L);
    cfg.batch_size = 5; /* more than n is allowed: the batch pads */
    if (idx_loader_init(&L, &cfg, err, sizeof err) == 0) {
        CU_ASSERT_EQUAL(L.nslots, 2 + 1);
        idx_loader_free(&L);
    }
    ds.rows = SYN_R;
    ds.cols = SYN_C;
    ds.n = 2;
    idx_dataset_free(&ds);
}

static void test_loader_normalisation(void) {
    idx_dataset ds = {0};
    uint8_t px[4] = {0, 51, 128, 255};
    uint8_t lab[1] = {3};
    ds.pixels = px;
    ds.labels = lab;
    ds.n = 1;
    ds.rows = 2;
    ds.cols = 2;
    idx_loader_config cfg;
    idx_loader_config_defaults(&cfg, &ds);
    idx_loader L;
    const float *x;
    const int32_t *y;
    int len;
    /* Defaults: mean 0, std 1 -> p/255. */
    loader_open(&L, &cfg);
    CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 0, 0), 0);
    CU_ASSERT_EQUAL_FATAL(idx_loader_next(&L, &x, &y, &len), 1);
    CU_ASSERT_EQUAL(len, 1);
    CU_ASSERT_EQUAL(y[0], 3);
    CU_ASSERT_EQUAL(x[0], 0.0f);
    CU_ASSERT_DOUBLE_EQUAL(x[1], 0.2, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(x[2], 128.0 / 255.0, 1e-6);
    CU_ASSERT_EQUAL(x[3], 1.0f);
    idx_loader_free(&L);
    /* mean 0.5, std 0.25: (p/255 - 0.5)/0.25 -> -2, -1.2, 0.00784.., 2 */
    cfg.mean = 0.5f;
    cfg.std = 0.25f;
    loader_open(&L, &cfg);
    CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 0, 0), 0);
    CU_ASSERT_EQUAL_FATAL(idx_loader_next(&L, &x, &y, &len), 1);
    CU_ASSERT_DOUBLE_EQUAL(x[0], -2.0, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(x[1], -1.2, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(x[2], (128.0 / 255.0 - 0.5) / 0.25, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(x[3], 2.0, 1e-6);
    idx_loader_free(&L);
}

static void test_loader_config_errors(void) {
    idx_dataset ds = make_syn(10);
    idx_loader_config cfg;
    idx_loader L;
    char err[256] = "";
    idx_loader_config_defaults(&cfg, &ds);
    cfg.batch_size = 0;
    CU_ASSERT_EQUAL(idx_loader_init(&L, &cfg, err, sizeof err), IDX_EINVAL);
    ASSERT_MSG_HAS(err, "batch_size > 0");
    idx_loader_config_defaults(&cfg, &ds);
    cfg.rank = 2;
    cfg.world_size = 2;
    CU_ASSERT_EQUAL(idx_loader_init(&L, &cfg, err, sizeof err), IDX_EINVAL);
    ASSERT_MSG_HAS(err, "rank 2, world_size 2");
    idx_loader_config_defaults(&cfg, &ds);
    cfg.begin = 5;
    cfg.end = 5;
    CU_ASSERT_EQUAL(idx_loader_init(&L, &cfg, err, sizeof err), IDX_EINVAL);
    ASSERT_MSG_HAS(err, "found [5, 5)");
    idx_loader_config_defaults(&cfg, &ds);
    cfg.end = 11;
    CU_ASSERT_EQUAL(idx_loader_init(&L, &cfg, err, sizeof err), IDX_EINVAL);
    ASSERT_MSG_HAS(err, "end <= 10");
    idx_loader_config_defaults(&cfg, &ds);
    cfg.std = 0.0f;
    CU_ASSERT_EQUAL(idx_loader_init(&L, &cfg, err, sizeof err), IDX_EINVAL);
    ASSERT_MSG_HAS(err, "std > 0");
    idx_loader_config_defaults(&cfg, &ds);
    cfg.mean = NAN;
    CU_ASSERT_EQUAL(idx_loader_init(&L, &cfg, err, sizeof err), IDX_EINVAL);
    idx_loader_config_defaults(&cfg, &ds);
    cfg.prefetch = IDX_LOADER_MAX_PREFETCH + 1;
    CU_ASSERT_EQUAL(idx_loader_init(&L, &cfg, err, sizeof err), IDX_EINVAL);
    idx_loader_config_defaults(&cfg, &ds);
    cfg.world_size = 11;
    cfg.drop_last = true;
    CU_ASSERT_EQUAL(idx_loader_init(&L, &cfg, err, sizeof err), IDX_EINVAL);
    ASSERT_MSG_HAS(err, "fewer than world_size 11");
    idx_loader_config_defaults(&cfg, NULL);
    CU_ASSERT_EQUAL(idx_loader_init(&L, &cfg, err, sizeof err), IDX_EINVAL);
    idx_loader_free(&L); /* after a failed init: safe */

    /* next before start_epoch */
    idx_loader_config_defaults(&cfg, &ds);
    loader_open(&L, &cfg);
    const float *x;
    const int32_t *y;
    int len;
    CU_ASSERT_EQUAL(idx_loader_next(&L, &x, &y, &len), IDX_ESTATE);
    CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 0, 11), IDX_EINVAL);
    CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 0, 10), 0); /* empty remainder */
    CU_ASSERT_EQUAL(idx_loader_next(&L, &x, &y, &len), 0);
    CU_ASSERT_PTR_NOT_NULL(idx_loader_strerror(IDX_ESTATE));
    idx_loader_free(&L);
    idx_loader zeroed;
    memset(&zeroed, 0, sizeof zeroed);
    idx_loader_free(&zeroed);
    idx_dataset_free(&ds);
}

/* ------------------------------------------------------------------------ */
/* Real data */

static void test_fashion_mnist_t10k(void) {
    const char *ipath = FMNIST_DIR "/t10k-images-idx3-ubyte.gz";
    const char *lpath = FMNIST_DIR "/t10k-labels-idx1-ubyte.gz";
    if (access(ipath, R_OK) != 0 || access(lpath, R_OK) != 0) {
        cunit_skip_case(FMNIST_DIR " not found (install dataset-fashion-mnist); the real-data test did not run");
        return;
    }
    idx_dataset ds;
    char err[512] = "";
    int rc = idx_open_dataset(ipath, lpath, 10, &ds, err, sizeof err);
    if (rc) fprintf(stderr, "\n    %s\n", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(ds.n, 10000);
    CU_ASSERT_EQUAL(ds.rows, 28);
    CU_ASSERT_EQUAL(ds.cols, 28);
    const uint8_t first[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
    CU_ASSERT(memcmp(ds.labels, first, 10) == 0);
    int per_class[10] = {0};
    for (uint32_t i = 0; i < ds.n; i++) per_class[ds.labels[i]]++;
    for (int k = 0; k < 10; k++) CU_ASSERT_EQUAL(per_class[k], 1000);
    long sum0 = 0;
    for (int d = 0; d < 784; d++) sum0 += ds.pixels[d];
    CU_ASSERT_EQUAL(sum0, 33456); /* first image, checked with zcat | od */

    /* One shuffled epoch through the loader sees every image once: class counts are exact. */
    idx_loader_config cfg = loader_cfg(&ds, 128, 1);
    cfg.mean = 0.2860f;
    cfg.std = 0.3530f;
    idx_loader L;
    loader_open(&L, &cfg);
    CU_ASSERT_EQUAL(idx_loader_num_batches(&L), 79);
    CU_ASSERT_EQUAL(idx_loader_start_epoch(&L, 0, 0), 0);
    int seen[10] = {0};
    long total = 0;
    double xsum = 0;
    const float *x;
    const int32_t *y;
    int len;
    while (idx_loader_next(&L, &x, &y, &len) == 1) {
        for (int j = 0; j < len; j++) {
            CU_ASSERT(y[j] >= 0 && y[j] < 10);
            if (y[j] >= 0 && y[j] < 10) seen[y[j]]++;
        }
        for (long i = 0; i < (long)len * 784; i++) xsum += x[i];
        total += len;
    }
    CU_ASSERT_EQUAL(total, 10000);
    for (int k = 0; k < 10; k++) CU_ASSERT_EQUAL(seen[k], 1000);
    /* With the Fashion-MNIST mean/std the normalised data is roughly centred. */
    CU_ASSERT(fabs(xsum / (10000.0 * 784.0)) < 0.05);
    idx_loader_free(&L);
    idx_dataset_free(&ds);
}

/* ------------------------------------------------------------------------ */

static CU_TestInfo cases_idx_reader[] = {
    {"read_images_raw", test_read_images_raw},
    {"read_images_gz", test_read_images_gz},
    {"read_labels_raw_and_gz", test_read_labels_raw_and_gz},
    {"gzip_detected_by_magic_not_name", test_gzip_detected_by_magic_not_name},
    {"wrong_magic", test_wrong_magic},
    {"truncated_raw", test_truncated_raw},
    {"truncated_gz", test_truncated_gz},
    {"truncated_gzip_stream", test_truncated_gzip_stream},
    {"trailing_data", test_trailing_data},
    {"corrupt_gzip", test_corrupt_gzip},
    {"bad_dimensions", test_bad_dimensions},
    {"gzip_bomb", test_gzip_bomb},
    {"fifo_refused", test_fifo_refused},
    {"missing_file", test_missing_file},
    {"label_out_of_range", test_label_out_of_range},
    {"open_dataset_and_count_mismatch", test_open_dataset_and_count_mismatch},
    CU_TEST_INFO_NULL,
};

static CU_TestInfo cases_idx_loader[] = {
    {"sequential", test_loader_sequential},
    {"shuffle", test_loader_shuffle},
    {"distributed", test_loader_distributed},
    {"drop_last", test_loader_drop_last},
    {"resume_from_batch", test_loader_resume_from_batch},
    {"position", test_loader_position},
    {"bit_identical", test_loader_bit_identical},
    {"restart_mid_epoch", test_loader_restart_mid_epoch},
    {"producer_sleeps", test_loader_producer_sleeps},
    {"auto_prefetch_wakes", test_loader_auto_prefetch_wakes},
    {"normalisation", test_loader_normalisation},
    {"config_errors", test_loader_config_errors},
    CU_TEST_INFO_NULL,
};

static CU_TestInfo cases_idx_fashion_mnist[] = {
    {"t10k", test_fashion_mnist_t10k},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    CU_SuiteInfo suites[] = {
        {.pName = "idx_reader", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_idx_reader},
        {.pName = "idx_loader", .pTests = cases_idx_loader},
        {.pName = "idx_fashion_mnist", .pTests = cases_idx_fashion_mnist},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
