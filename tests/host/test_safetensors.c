/*
 * tests/host/test_safetensors.c — the checkpoint file format: a round trip
 * of tensors of every common dtype and shape (a 0-element tensor and a
 * scalar included) with metadata strings that need escaping; the exact bytes
 * of tiny files against hand-written ones; the writer's argument checks;
 * atomic replacement (overwrite, a target that cannot be written, a write
 * failing midway and a process dying midway all leave the old file intact);
 * every kind of corruption refused with KILN_E_DATA and a one-line message
 * naming the file; and both directions against independent Python code
 * (struct + json to write, numpy.frombuffer to read, libxxhash through
 * ctypes to check the checksums), skipped with a printed line where python3
 * or numpy is missing. Checksums: a flipped bit in any tensor's bytes, a
 * damaged or missing checksum entry are refused naming the file and the
 * tensor; a file without checksums loads.
 */
#define _GNU_SOURCE
#include <CUnit/CUnit.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "safetensors.h"
#include "testutil.h"

static char *g_dir;

static int suite_init(void) {
    g_dir = tu_mkdtemp();
    return g_dir ? 0 : -1;
}

static int suite_clean(void) {
    tu_rmrf(g_dir);
    free(g_dir);
    return 0;
}

/* A path in the suite's directory; a few rotating buffers. */
static const char *pth(const char *name) {
    static char buf[8][4200];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, 4200, "%s/%s", g_dir, name);
    return p;
}

static int write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    unsigned char *b = malloc(cap);
    size_t k;
    while (b && (k = fread(b + len, 1, cap - len, f)) > 0) {
        len += k;
        if (len == cap) {
            unsigned char *nb = realloc(b, cap * 2);
            if (!nb) { free(b); b = NULL; break; }
            b = nb;
            cap *= 2;
        }
    }
    fclose(f);
    *n = len;
    return b;
}

/* A file with the given header length word, header text and data bytes,
 * for corruptions the writer would never produce. */
static void write_raw_n(const char *path, uint64_t n, const char *header, size_t hlen, const void *data,
                        size_t dlen) {
    size_t total = 8 + hlen + dlen;
    unsigned char *b = malloc(total + 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
    if (hlen) memcpy(b + 8, header, hlen);
    if (dlen) memcpy(b + 8 + hlen, data, dlen);
    CU_ASSERT_EQUAL_FATAL(write_bytes(path, b, total), 0);
    free(b);
}

static void write_raw(const char *path, const char *header, const void *data, size_t dlen) {
    write_raw_n(path, strlen(header), header, strlen(header), data, dlen);
}

/* safetensors_open must refuse path with KILN_E_DATA and a one-line message that
 * names the file and contains fragment. */
static void expect_corrupt_at(const char *path, const char *fragment, int line) {
    safetensors_file *f = (safetensors_file *)1;
    ht_error err = {0};
    int rc = safetensors_open(path, &f, &err);
    int ok = rc == KILN_E_DATA && f == NULL && strncmp(err.msg, path, strlen(path)) == 0 && strstr(err.msg, fragment) &&
             !strchr(err.msg, '\n');
    if (!ok)
        fprintf(stderr, "\n  line %d: rc %d (%s), want KILN_E_DATA with '%s'; why: %s\n", line, rc,
                kiln_status_name(rc), fragment, err.msg);
    CU_ASSERT_TRUE(ok);
    if (rc == KILN_OK) safetensors_close(f);
}
#define expect_corrupt(path, fragment) expect_corrupt_at(path, fragment, __LINE__)

static void expect_corrupt_header_at(const char *header, const void *data, size_t dlen, const char *fragment,
                                     int line) {
    const char *p = pth("corrupt.safetensors");
    write_raw(p, header, data, dlen);
    expect_corrupt_at(p, fragment, line);
}
#define expect_corrupt_header(h, d, n, fragment) expect_corrupt_header_at(h, d, n, fragment, __LINE__)

/* Leftover "<name>.tmp.<pid>" files in the suite's directory. */
static int count_tmp(void) {
    DIR *d = opendir(g_dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static uint16_t g_f16[3] = {0x3c00, 0xc000, 0x7bff};   /* 1, -2, 65504 */
static uint16_t g_bf16[4] = {0x3f80, 0xbfc0, 0x0000, 0x7f80}; /* 1, -1.5, 0, inf */

/* Several tensors of different dtypes and shapes, including empty ones and a
 * scalar, and metadata that needs every kind of JSON escape. */
static void test_round_trip(void) {
    const float f32[6] = {0.5f, -1.0f, 2.0f, 3.25f, 1e30f, -0.0f};
    const double f64[4] = {3.141592653589793, -1e-300, 0.0, 1e300};
    const int32_t i32[1] = {-7};
    const int64_t step = 123456789012345LL;
    const uint8_t u8[5] = {0, 1, 2, 254, 255};
    const uint8_t flags[2] = {1, 0};
    const int64_t empty_dummy = 0;
    struct {
        const char *name, *dtype;
        int ndim;
        int64_t shape[4];
        const void *data;
        size_t nbytes;
    } T[] = {
        {"w.f32", "F32", 2, {2, 3}, f32, sizeof f32},
        {"w.f64", "F64", 1, {4}, f64, sizeof f64},
        {"idx.i32", "I32", 3, {1, 1, 1}, i32, sizeof i32},
        {"step", "I64", 0, {0}, &step, sizeof step},
        {"bytes.u8", "U8", 1, {5}, u8, sizeof u8},
        {"h.f16", "F16", 1, {3}, g_f16, sizeof g_f16},
        {"h.bf16", "BF16", 2, {2, 2}, g_bf16, sizeof g_bf16},
        {"empty", "F32", 2, {0, 4}, NULL, 0},
        {"empty1", "I64", 1, {0}, &empty_dummy, 0},
        {"na\xc3\xafve/\xe5\x90\x8d \"q\" \\ x", "BOOL", 1, {2}, flags, sizeof flags},
    };
    const int nt = (int)(sizeof T / sizeof T[0]);
    const char *M[][2] = {
        {"quote", "he said \"hi\""},
        {"backslash", "C:\\dir\\n is not a newline \\"},
        {"newline", "line1\nline2\r\n\tend\b\f"},
        {"utf8", "na\xc3\xafve \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x99\x82"},
        {"control", "\x01\x1f\x7f"},
        {"empty", ""},
        {"key \"with\" \\ and\nnewline", "v"},
        {"/slash", "a/b"},
    };
    const int nm = (int)(sizeof M / sizeof M[0]);
    ht_error err = {0};
    safetensors_writer *w = safetensors_writer_new();
    CU_ASSERT_PTR_NOT_NULL_FATAL(w);
    for (int i = 0; i < nt; i++)
        CU_ASSERT_EQUAL(safetensors_add_tensor(w, T[i].name, T[i].dtype, T[i].shape, T[i].ndim, T[i].data, T[i].nbytes, &err),
                        KILN_OK);
    for (int i = 0; i < nm; i++) CU_ASSERT_EQUAL(safetensors_add_metadata(w, M[i][0], M[i][1], &err), KILN_OK);
    const char *p = pth("round.safetensors");
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    CU_ASSERT_EQUAL(count_tmp(), 0);

    safetensors_file *f = NULL;
    int rc = safetensors_open(p, &f, &err);
    if (rc) fprintf(stderr, "\n  %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(safetensors_count(f), nt);
    for (int i = 0; i < nt; i++) {
        const safetensors_tensor *t = safetensors_get(f, i);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        CU_ASSERT_STRING_EQUAL(t->name, T[i].name); /* header order is the order added */
        CU_ASSERT_PTR_EQUAL(safetensors_find(f, T[i].name), t);
        CU_ASSERT_STRING_EQUAL(t->dtype, T[i].dtype);
        CU_ASSERT_EQUAL(t->ndim, T[i].ndim);
        for (int d = 0; d < T[i].ndim; d++) CU_ASSERT_EQUAL(t->shape[d], T[i].shape[d]);
        CU_ASSERT_EQUAL(t->nbytes, T[i].nbytes);
        if (T[i].nbytes) CU_ASSERT_EQUAL(memcmp(t->data, T[i].data, T[i].nbytes), 0);
    }
    /* read elements through memcpy: no alignment is promised */
    float x;
    memcpy(&x, (const char *)safetensors_find(f, "w.f32")->data + 4 * sizeof(float), sizeof x);
    CU_ASSERT_EQUAL(x, 1e30f);
    int64_t s;
    memcpy(&s, safetensors_find(f, "step")->data, sizeof s);
    CU_ASSERT_EQUAL(s, step);
    CU_ASSERT_PTR_NULL(safetensors_get(f, nt));
    CU_ASSERT_PTR_NULL(safetensors_get(f, -1));
    CU_ASSERT_PTR_NULL(safetensors_find(f, "absent"));
    CU_ASSERT_EQUAL(safetensors_metadata_count(f), nm);
    for (int i = 0; i < nm; i++) {
        const char *v = safetensors_metadata(f, M[i][0]), *k = NULL;
        CU_ASSERT_PTR_NOT_NULL_FATAL(v);
        CU_ASSERT_STRING_EQUAL(v, M[i][1]);
        CU_ASSERT_EQUAL(safetensors_metadata_get(f, i, &k, &v), 0);
        CU_ASSERT_STRING_EQUAL(k, M[i][0]);
    }
    CU_ASSERT_PTR_NULL(safetensors_metadata(f, "absent"));
    CU_ASSERT_EQUAL(safetensors_metadata_get(f, nm, NULL, NULL), -1);
    safetensors_close(f);

    /* the header padding puts the data 8-aligned in the file */
    size_t n;
    unsigned char *b = read_bytes(p, &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL(b[0] % 8, 0);
    free(b);
}

/* Byte-for-byte layout. The expected bytes are written by hand from the
 * format spec (huggingface/safetensors README, "Format"): an 8-byte
 * little-endian header length N; N bytes of JSON, here as the reference
 * writer (serde_json, compact) emits it — "__metadata__" first, then each
 * tensor as {"dtype","shape","data_offsets"} — padded with spaces so N is a
 * multiple of 8; then the tensors' little-endian bytes, packed in order. */
static void test_exact_layout(void) {
    /* 132 bytes of JSON + 4 spaces = N = 136 = 0x88 */
    static const unsigned char expect[] =
        "\x88\0\0\0\0\0\0\0"
        "{\"__metadata__\":{\"k\":\"v\"},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]}}"
        "    "
        "\x00\x00\x80\x3f" /* 1.0f  = 0x3f800000 */
        "\x00\x00\x00\xc0" /* -2.0f = 0xc0000000 */
        "\x07\0\0\0\0\0\0\0"; /* (int64_t)7 */
    CU_ASSERT_EQUAL_FATAL(sizeof expect - 1, 8 + 136 + 16);
    const float a[2] = {1.0f, -2.0f};
    const int64_t sv = 7, two = 2;
    ht_error err = {0};
    safetensors_writer *w = safetensors_writer_new();
    safetensors_writer_checksums(w, 0); /* the reference writer's bytes */
    CU_ASSERT_EQUAL(safetensors_add_metadata(w, "k", "v", &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "a", "F32", &two, 1, a, sizeof a, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "s", "I64", NULL, 0, &sv, sizeof sv, &err), KILN_OK);
    const char *p = pth("tiny.safetensors");
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    size_t n;
    unsigned char *b = read_bytes(p, &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL(n, sizeof expect - 1);
    CU_ASSERT(n == sizeof expect - 1 && memcmp(b, expect, n) == 0);
    free(b);

    /* with checksums (the default): one "kiln.xxh3.<name>" entry per tensor
     * after the caller's metadata, XXH3-64 of the bytes in lowercase hex
     * (values from libxxhash 0.8: XXH3_64bits of the 8 bytes of each) */
    static const unsigned char expect_ck[] =
        "\xc8\0\0\0\0\0\0\0" /* 198 bytes of JSON + 2 spaces */
        "{\"__metadata__\":{\"k\":\"v\",\"kiln.xxh3.a\":\"28a0ba9c345d3723\",\"kiln.xxh3.s\":\"81671e58d6b596af\"},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]}}"
        "  "
        "\x00\x00\x80\x3f\x00\x00\x00\xc0\x07\0\0\0\0\0\0\0";
    safetensors_writer_checksums(w, 1);
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    b = read_bytes(p, &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL(n, sizeof expect_ck - 1);
    CU_ASSERT(n == sizeof expect_ck - 1 && memcmp(b, expect_ck, n) == 0);
    if (n != sizeof expect_ck - 1 || memcmp(b, expect_ck, n)) fprintf(stderr, "\n  got: %.*s\n", (int)n, (const char *)b);
    free(b);

    /* no tensor, no metadata: "{}" padded with 6 spaces, N = 8, no data */
    static const unsigned char empty[] = "\x08\0\0\0\0\0\0\0{}      ";
    w = safetensors_writer_new();
    p = pth("empty.safetensors");
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    b = read_bytes(p, &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT(n == sizeof empty - 1 && memcmp(b, empty, n) == 0);
    free(b);
    safetensors_file *f = NULL;
    CU_ASSERT_EQUAL(safetensors_open(p, &f, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_count(f), 0);
    safetensors_close(f);

    /* a control character in metadata is written as \u00XX, a quote and a
     * backslash with a backslash, UTF-8 verbatim */
    static const unsigned char esc[] =
        "\x28\0\0\0\0\0\0\0"
        "{\"__metadata__\":{\"q\\\"\":\"\\u0001\\\\\xc3\xa9\\n\"}}" /* 39 bytes */
        " ";
    w = safetensors_writer_new();
    CU_ASSERT_EQUAL(safetensors_add_metadata(w, "q\"", "\x01\\\xc3\xa9\n", &err), KILN_OK);
    p = pth("esc.safetensors");
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    b = read_bytes(p, &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL(sizeof esc - 1, 8 + 40);
    CU_ASSERT(n == sizeof esc - 1 && memcmp(b, esc, n) == 0);
    free(b);
}

static void expect_arg_error(int rc, const char *why, const char *fragment) {
    CU_ASSERT_EQUAL(rc, KILN_E_INVALID_ARG);
    if (!strstr(why, fragment)) fprintf(stderr, "\n  want '%s' in: %s\n", fragment, why);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, fragment));
}

static void test_writer_args(void) {
    ht_error err = {0};
    const float d[6] = {0};
    const int64_t s23[2] = {2, 3}, neg[1] = {-1}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    const int64_t huge[3] = {INT64_MAX, INT64_MAX, 2};
    safetensors_writer *w = safetensors_writer_new();
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "a", "F32", s23, 2, d, sizeof d, &err), KILN_OK);
    expect_arg_error(safetensors_add_tensor(w, "a", "F32", s23, 2, d, sizeof d, &err), err.msg,
                     "duplicate tensor name 'a'");
    expect_arg_error(safetensors_add_tensor(w, "b", "F32", s23, 2, d, 20, &err), err.msg,
                     "tensor 'b': 20 bytes given, but shape [2, 3] of F32 needs 24");
    expect_arg_error(safetensors_add_tensor(w, "b", "F31", s23, 2, d, sizeof d, &err), err.msg, "unknown dtype 'F31'");
    expect_arg_error(safetensors_add_tensor(w, "b", "F32", neg, 1, d, 0, &err), err.msg, "shape[0] is -1");
    expect_arg_error(safetensors_add_tensor(w, "b", "U8", nine, 9, d, 1, &err), err.msg, "9 dimensions");
    expect_arg_error(safetensors_add_tensor(w, "b", "F32", huge, 3, d, 0, &err), err.msg, "overflows");
    expect_arg_error(safetensors_add_tensor(w, "b", "F32", s23, 2, NULL, sizeof d, &err), err.msg, "no data");
    expect_arg_error(safetensors_add_tensor(w, "__metadata__", "F32", s23, 2, d, sizeof d, &err), err.msg, "reserved");
    expect_arg_error(safetensors_add_tensor(w, "", "F32", s23, 2, d, sizeof d, &err), err.msg, "empty tensor name");
    expect_arg_error(safetensors_add_tensor(w, "bad\xff", "F32", s23, 2, d, sizeof d, &err), err.msg,
                     "not valid UTF-8");
    /* a newline in a name is escaped in the one-line message */
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "x\ny", "U8", NULL, 0, d, 1, &err), KILN_OK);
    expect_arg_error(safetensors_add_tensor(w, "x\ny", "U8", NULL, 0, d, 1, &err), err.msg,
                     "duplicate tensor name 'x\\x0ay'");
    CU_ASSERT_EQUAL(safetensors_add_metadata(w, "k", "v", &err), KILN_OK);
    expect_arg_error(safetensors_add_metadata(w, "k", "w", &err), err.msg, "duplicate metadata key 'k'");
    expect_arg_error(safetensors_add_metadata(w, "k2", "\xc0\xaf", &err), err.msg, "not valid UTF-8");
    expect_arg_error(safetensors_add_metadata(w, "\xed\xa0\x80", "v", &err), err.msg, "not valid UTF-8");
    expect_arg_error(safetensors_write_atomic(w, "", &err), err.msg, "no path");
    /* the refused calls left the writer as it was */
    const char *p = pth("args.safetensors");
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    safetensors_file *f = NULL;
    CU_ASSERT_EQUAL_FATAL(safetensors_open(p, &f, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_count(f), 2);
    CU_ASSERT_EQUAL(safetensors_metadata_count(f), 1);
    CU_ASSERT_PTR_NOT_NULL(safetensors_find(f, "x\ny"));
    safetensors_close(f);
    safetensors_writer_free(NULL);
    safetensors_close(NULL);
}

/* A writer holding one U8 tensor of n bytes, all of value v. */
static safetensors_writer *writer_of(size_t n, unsigned char v, unsigned char **buf) {
    ht_error err = {0};
    *buf = malloc(n ? n : 1);
    memset(*buf, v, n);
    int64_t shape = (int64_t)n;
    safetensors_writer *w = safetensors_writer_new();
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "x", "U8", &shape, 1, *buf, n, &err), KILN_OK);
    return w;
}

/* path must hold the one-tensor file writer_of(n, v) wrote. */
static void expect_content(const char *path, size_t n, unsigned char v) {
    ht_error err = {0};
    safetensors_file *f = NULL;
    int rc = safetensors_open(path, &f, &err);
    if (rc) fprintf(stderr, "\n  %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    const safetensors_tensor *t = safetensors_find(f, "x");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_EQUAL(t->nbytes, n);
    int same = 1;
    for (size_t i = 0; i < t->nbytes; i++) same &= ((const unsigned char *)t->data)[i] == v;
    CU_ASSERT_TRUE(same);
    safetensors_close(f);
}

static void test_atomic_replace(void) {
    ht_error err = {0};
    unsigned char *b1, *b2;
    const char *p = pth("ckpt.safetensors");
    safetensors_writer *w = writer_of(100, 0x11, &b1);
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    free(b1);
    expect_content(p, 100, 0x11);
    w = writer_of(3000, 0x22, &b2);
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    /* the writer is not consumed: writing it again gives the same file */
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    free(b2);
    expect_content(p, 3000, 0x22);
    CU_ASSERT_EQUAL(count_tmp(), 0);
    /* a relative path (no directory part) works too: the directory to sync is "." */
    char cwd[4200];
    CU_ASSERT_PTR_NOT_NULL_FATAL(getcwd(cwd, sizeof cwd));
    CU_ASSERT_EQUAL_FATAL(chdir(g_dir), 0);
    w = writer_of(5, 0x33, &b1);
    CU_ASSERT_EQUAL(safetensors_write_atomic(w, "rel.safetensors", &err), KILN_OK);
    safetensors_writer_free(w);
    free(b1);
    CU_ASSERT_EQUAL_FATAL(chdir(cwd), 0);
    expect_content(pth("rel.safetensors"), 5, 0x33);
}

static void test_atomic_failures(void) {
    ht_error err = {0};
    unsigned char *b;
    safetensors_writer *w = writer_of(64, 0x44, &b);

    /* the target is a directory: rename fails, the directory stays, no temp */
    const char *d = pth("isdir.safetensors");
    CU_ASSERT_EQUAL_FATAL(mkdir(d, 0755), 0);
    CU_ASSERT_EQUAL(safetensors_write_atomic(w, d, &err), KILN_E_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, d));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "cannot rename"));
    struct stat st;
    CU_ASSERT(stat(d, &st) == 0 && S_ISDIR(st.st_mode));
    CU_ASSERT_EQUAL(count_tmp(), 0);

    /* the parent directory does not exist: nothing is created */
    const char *np = pth("missing/ckpt.safetensors");
    CU_ASSERT_EQUAL(safetensors_write_atomic(w, np, &err), KILN_E_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, np));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "cannot create the temporary file"));
    CU_ASSERT_NOT_EQUAL(stat(pth("missing"), &st), 0);
    safetensors_writer_free(w);
    free(b);

    /* reading them fails with KILN_E_IO, not KILN_E_DATA */
    safetensors_file *f = (safetensors_file *)1;
    CU_ASSERT_EQUAL(safetensors_open(d, &f, &err), KILN_E_IO);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_EQUAL(safetensors_open(np, &f, &err), KILN_E_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, np));
}

/* A write that fails midway (the file size limit stands in for a full
 * disk: as root, permissions cannot make a write fail) and a process that
 * dies midway (killed by SIGXFSZ at the same point) both leave the old file
 * intact at path. Forked so the limit and the death stay in the child. */
static void test_atomic_midway(void) {
    ht_error err = {0};
    unsigned char *b;
    const char *p = pth("midway.safetensors");
    safetensors_writer *w = writer_of(200, 0x55, &b);
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    free(b);
    size_t n0;
    unsigned char *before = read_bytes(p, &n0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(before);

    for (int crash = 0; crash < 2; crash++) {
        fflush(NULL);
        pid_t pid = fork();
        CU_ASSERT_FATAL(pid >= 0);
        if (pid == 0) {
            struct rlimit fl = {4096, 4096}, core = {0, 0};
            setrlimit(RLIMIT_CORE, &core);
            signal(SIGXFSZ, crash ? SIG_DFL : SIG_IGN);
            if (setrlimit(RLIMIT_FSIZE, &fl) != 0) _exit(10);
            unsigned char *cb;
            safetensors_writer *cw = writer_of(1 << 20, 0x66, &cb);
            ht_error cerr = {0};
            int rc = safetensors_write_atomic(cw, p, &cerr);
            /* only reached without the crash */
            int ok = rc == KILN_E_IO && strstr(cerr.msg, p) && strstr(cerr.msg, "cannot write the temporary file");
            if (!ok) fprintf(stderr, "\n  child: rc %d: %s\n", rc, cerr.msg);
            safetensors_writer_free(cw);
            free(cb);
            _exit(ok ? 0 : 11);
        }
        int status;
        CU_ASSERT_EQUAL_FATAL(waitpid(pid, &status, 0), pid);
        if (crash) {
            CU_ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ);
            /* the dead process's partial temp file is all it left */
            char tmp[4300];
            snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)pid);
            struct stat st;
            CU_ASSERT(stat(tmp, &st) == 0 && st.st_size == 4096);
            CU_ASSERT_EQUAL(count_tmp(), 1);
            unlink(tmp);
        } else {
            CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            CU_ASSERT_EQUAL(count_tmp(), 0);
        }
        size_t n1;
        unsigned char *after = read_bytes(p, &n1);
        CU_ASSERT_PTR_NOT_NULL_FATAL(after);
        CU_ASSERT(n1 == n0 && memcmp(after, before, n0) == 0);
        free(after);
        expect_content(p, 200, 0x55);
    }
    free(before);
}

/* A FIFO with no writer: a blocking open() would wait forever. The alarm
 * turns a regression into a killed test binary instead of a hung suite. */
static void test_fifo_refused(void) {
    const char *p = pth("fifo.safetensors");
    unlink(p);
    CU_ASSERT_EQUAL_FATAL(mkfifo(p, 0600), 0);
    alarm(10);
    safetensors_file *f = (safetensors_file *)1;
    ht_error err = {0};
    CU_ASSERT_EQUAL(safetensors_open(p, &f, &err), KILN_E_IO);
    alarm(0);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_EQUAL(strncmp(err.msg, p, strlen(p)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "expected a regular file, found a FIFO"));
    CU_ASSERT_PTR_NULL(strchr(err.msg, '\n'));
    unlink(p);
}

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* A pid that is no live process: a reaped child's. */
static pid_t dead_pid(void) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return pid;
}

/* A save removes the temp files of dead saves in its directory, and only
 * those: "<name>.tmp.<pid>" with no live process of that pid, for the file
 * being saved or any *.safetensors. A live process's temp file (a save in
 * progress), names that merely look alike, other files and links stay. */
static void test_stale_tmp_cleanup(void) {
    ht_error err = {0};
    char name[4300];
    const char *ck = pth("last.safetensors");
    pid_t dead = dead_pid(), live = getppid();
    CU_ASSERT_FATAL(dead > 0 && kill(dead, 0) != 0 && errno == ESRCH);
    CU_ASSERT_FATAL(kill(live, 0) == 0);

    char stale_same[4300], stale_other[4300], stale_link[4300], live_tmp[4300];
    snprintf(stale_same, sizeof stale_same, "%s.tmp.%ld", ck, (long)dead);
    snprintf(stale_other, sizeof stale_other, "%s.tmp.%ld", pth("epoch-3.safetensors"), (long)dead);
    snprintf(live_tmp, sizeof live_tmp, "%s.tmp.%ld", ck, (long)live);
    snprintf(stale_link, sizeof stale_link, "%s.tmp.%ld", pth("link.safetensors"), (long)dead);
    const char *keep[] = {
        live_tmp,
        pth("notes.txt"),
        pth("last.safetensors.tmp.12x"),
        pth("last.safetensors.tmp.0"),
        pth("last.safetensors.tmp."),
        pth("last.safetensors.tmp.99999999999999999999"),
        pth("data.bin.tmp.1"), /* not a checkpoint name: never ours */
    };
    char dead_bin[4300];
    snprintf(dead_bin, sizeof dead_bin, "%s.tmp.%ld", pth("data.bin"), (long)dead);
    const size_t nkeep = sizeof keep / sizeof keep[0];
    CU_ASSERT_EQUAL_FATAL(write_bytes(stale_same, "partial", 7), 0);
    CU_ASSERT_EQUAL_FATAL(write_bytes(stale_other, "partial", 7), 0);
    CU_ASSERT_EQUAL_FATAL(write_bytes(dead_bin, "x", 1), 0);
    for (size_t i = 0; i < nkeep; i++) CU_ASSERT_EQUAL_FATAL(write_bytes(keep[i], "x", 1), 0);
    /* a dead pid's name that is a symbolic link: not removed (not a file we wrote) */
    CU_ASSERT_EQUAL_FATAL(symlink("notes.txt", stale_link), 0);

    unsigned char *b;
    safetensors_writer *w = writer_of(32, 0x77, &b);
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, ck, &err), KILN_OK);
    safetensors_writer_free(w);
    free(b);
    expect_content(ck, 32, 0x77);

    CU_ASSERT_FALSE(exists(stale_same));
    CU_ASSERT_FALSE(exists(stale_other));
    CU_ASSERT_TRUE(exists(dead_bin));
    CU_ASSERT_TRUE(exists(stale_link));
    for (size_t i = 0; i < nkeep; i++) {
        if (!exists(keep[i])) fprintf(stderr, "\n  removed %s\n", keep[i]);
        CU_ASSERT_TRUE(exists(keep[i]));
    }
    CU_ASSERT_TRUE(exists(pth("notes.txt")));
    for (size_t i = 0; i < nkeep; i++) unlink(keep[i]);
    unlink(dead_bin);
    unlink(stale_link);
    snprintf(name, sizeof name, "%s", ck);
    unlink(name);
    CU_ASSERT_EQUAL(count_tmp(), 0);
}

/* A valid file to cut short. */
static unsigned char *valid_file(size_t *n, uint64_t *hlen) {
    ht_error err = {0};
    float wt[16];
    for (int i = 0; i < 16; i++) wt[i] = (float)i;
    const int64_t s44[2] = {4, 4}, s3 = 3;
    const uint8_t u[3] = {1, 2, 3};
    safetensors_writer *w = safetensors_writer_new();
    safetensors_add_tensor(w, "layers.0.weight", "F32", s44, 2, wt, sizeof wt, &err);
    safetensors_add_tensor(w, "b", "U8", &s3, 1, u, sizeof u, &err);
    safetensors_add_metadata(w, "epoch", "3", &err);
    const char *p = pth("valid.safetensors");
    CU_ASSERT_EQUAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    unsigned char *b = read_bytes(p, n);
    *hlen = 0;
    for (int i = 7; i >= 0; i--) *hlen = *hlen << 8 | b[i];
    return b;
}

static void test_truncated(void) {
    size_t n;
    uint64_t h;
    unsigned char *b = valid_file(&n, &h);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL_FATAL(n, 8 + h + 64 + 3);
    const char *p = pth("trunc.safetensors");
    struct {
        size_t len;
        const char *fragment;
    } cuts[] = {
        {0, "file is 0 bytes, shorter than the 8-byte header length"},
        {5, "file is 5 bytes"},
        {8, "exceeds the 0 bytes after the length word: truncated"},
        {8 + (size_t)h / 2, "exceeds the"},
        {8 + (size_t)h, "exceed the data (0 bytes): truncated or corrupt file"},
        {8 + (size_t)h + 10, "tensor 'layers.0.weight' data_offsets [0, 64] exceed the data (10 bytes): truncated"},
        {n - 1, "tensor 'b' data_offsets [64, 67] exceed the data (66 bytes)"},
    };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        CU_ASSERT_EQUAL_FATAL(write_bytes(p, b, cuts[i].len), 0);
        expect_corrupt(p, cuts[i].fragment);
    }
    /* the whole file is fine */
    CU_ASSERT_EQUAL_FATAL(write_bytes(p, b, n), 0);
    safetensors_file *f = NULL;
    ht_error err = {0};
    CU_ASSERT_EQUAL(safetensors_open(p, &f, &err), KILN_OK);
    safetensors_close(f);
    /* one byte too many */
    unsigned char *b2 = malloc(n + 1);
    memcpy(b2, b, n);
    b2[n] = 0;
    CU_ASSERT_EQUAL_FATAL(write_bytes(p, b2, n + 1), 0);
    expect_corrupt(p, "1 trailing bytes after the last tensor: the data is 68 bytes, the tensors cover 67");
    free(b2);
    free(b);
}

static void test_bad_length(void) {
    const char *p = pth("len.safetensors");
    write_raw_n(p, 1000, "{}", 2, NULL, 0);
    expect_corrupt(p, "header length 1000 exceeds the 2 bytes after the length word");
    write_raw_n(p, (uint64_t)200 << 20, "{}", 2, NULL, 0);
    expect_corrupt(p, "header length 209715200 exceeds the 104857600-byte limit");
    write_raw_n(p, UINT64_MAX, "{}", 2, NULL, 0);
    expect_corrupt(p, "exceeds the 104857600-byte limit");
    write_raw_n(p, 0, "", 0, NULL, 0);
    expect_corrupt(p, "expected '{' opening the header object, found the end of the header");
}

static void test_invalid_json(void) {
    const char *J = "invalid header JSON";
    static const char d4[4] = {0};
    struct {
        const char *h, *fragment;
    } bad[] = {
        {"{\"a\":", "at byte 5 of 5: unexpected token near end of file"},
        {"{\"a\" {}}", "':' expected near '{'"},
        {"{} x", "expected only padding spaces after the header object, found 'x'"},
        {"{}\0\0", "found byte 0x00"}, /* (strlen stops at the NUL: written below) */
        {"[]", "expected '{' opening the header object, found '['"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},}", "string or '}' expected near '}'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}", "'}' expected near end of file"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4,],\"data_offsets\":[0,4]}}", "unexpected token near ']'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4 4],\"data_offsets\":[0,4]}}", "']' expected near '4'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[04],\"data_offsets\":[0,4]}}", "invalid token near '0'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4.],\"data_offsets\":[0,4]}}", "invalid token near '4.'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4e],\"data_offsets\":[0,4]}}", "invalid token near '4e'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-],\"data_offsets\":[0,4]}}", "invalid token near '-'"},
        {"{\"a\\x\":{}}", "invalid escape near '\"a\\x'"},
        {"{\"a\\u12g4\":{}}", "invalid escape near '\"a\\u12g'"},
        {"{\"a\\udc00\":{}}", "invalid Unicode '\\uDC00'"},
        {"{\"a\\ud83dx\":{}}", "invalid Unicode '\\uD83D'"},
        {"{\"a\\ud83d\\u0041\":{}}", "invalid Unicode '\\uD83D\\u0041'"},
        {"{\"a\\u0000\":{}}", "NUL byte in object key not supported"},
        {"{\"a\xff\":{}}", "unable to decode byte 0xff"},
        {"{\"a\xc0\xaf\":{}}", "unable to decode byte 0xc0"},           /* overlong '/' */
        {"{\"a\xed\xa0\x80\":{}}", "unable to decode byte 0xed"},       /* encoded surrogate */
        {"{\"a\xe6\x97\":{}}", "unable to decode byte 0xe6"},           /* cut sequence */
        {"{\"a\nb\":{}}", "unexpected newline near '\"a'"},
        {"{\"abc", "premature end of input near '\"abc'"},
        {"{\"abc\\", "invalid escape near '\"abc\\'"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}}", "only padding spaces"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}} \x01", "found byte 0x01"},
        {"\xef\xbb\xbf{}", "expected '{'"}, /* a BOM is not JSON whitespace */
        {"{\"a\":x}", "invalid token near 'x'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = pth("json.safetensors");
        if (i == 3) write_raw_n(p, 4, bad[i].h, 4, NULL, 0);
        else write_raw(p, bad[i].h, d4, sizeof d4);
        expect_corrupt_at(p, J, __LINE__);
        expect_corrupt_at(p, bad[i].fragment, (int)i);
    }
}

static void test_bad_entries(void) {
    static const unsigned char d[16] = {0};
#define TENSOR_JSON(dt, shape, offs) "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}"
    struct {
        const char *h;
        size_t dlen;
        const char *fragment;
    } bad[] = {
        {"{\"a\":" TENSOR_JSON("F7", "[1]", "[0,4]") "}", 4,
         "tensor 'a' has unknown dtype 'F7' (expected one of BOOL, U8"},
        {"{\"a\":" TENSOR_JSON("F4", "[2]", "[0,1]") "}", 1, "unknown dtype 'F4'"},
        {"{\"a\":" TENSOR_JSON("F32", "[2]", "[0,4]") "}", 4,
         "tensor 'a' data_offsets [0, 4] hold 4 bytes, but shape [2] of F32 needs 8"},
        {"{\"a\":" TENSOR_JSON("F32", "[]", "[0,0]") "}", 0, "hold 0 bytes, but shape [] of F32 needs 4"},
        {"{\"a\":" TENSOR_JSON("F32", "[2]", "[0,8]") ",\"b\":" TENSOR_JSON("F32", "[2]", "[4,12]") "}", 12,
         "tensor 'b' data_offsets [4, 12] overlap tensor 'a' data_offsets [0, 8]"},
        {"{\"a\":" TENSOR_JSON("F32", "[2]", "[0,8]") ",\"e\":" TENSOR_JSON("F32", "[0]", "[4,4]") "}", 8, "overlap"},
        {"{\"a\":" TENSOR_JSON("F32", "[1]", "[0,4]") ",\"b\":" TENSOR_JSON("F32", "[1]", "[8,12]") "}", 12,
         "gap in the data: no tensor covers bytes [4, 8) before tensor 'b'"},
        {"{\"b\":" TENSOR_JSON("F32", "[1]", "[4,8]") "}", 8, "gap in the data: no tensor covers bytes [0, 4)"},
        {"{\"a\":" TENSOR_JSON("F32", "[1]", "[0,4]") "}", 8, "4 trailing bytes after the last tensor"},
        {"{}", 3, "3 trailing bytes after the header, but the header lists no tensor"},
        {"{\"a\":" TENSOR_JSON("F32", "[1]", "[0,4]") ",\"a\":" TENSOR_JSON("F32", "[1]", "[4,8]") "}", 8,
         "duplicate tensor name 'a'"},
        {"{\"__metadata__\":{\"epoch\":3}}", 0, "__metadata__ value for key 'epoch' is a number, expected a string"},
        {"{\"__metadata__\":{\"ok\":\"x\",\"n\":null}}", 0, "value for key 'n' is null"},
        {"{\"__metadata__\":{\"l\":[\"x\"]}}", 0, "value for key 'l' is an array"},
        {"{\"__metadata__\":{\"o\":{}}}", 0, "value for key 'o' is an object"},
        {"{\"__metadata__\":{\"b\":true}}", 0, "value for key 'b' is a boolean"},
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate __metadata__ key 'k'"},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate __metadata__ object"},
        {"{\"__metadata__\":[]}", 0, "__metadata__ is an array, expected an object of strings"},
        {"{\"a\":" TENSOR_JSON("F32", "[-1]", "[0,0]") "}", 0, "tensor 'a' shape[0] is negative"},
        {"{\"a\":" TENSOR_JSON("F32", "[1,2.0]", "[0,8]") "}", 8, "tensor 'a' shape[1] is not an integer"},
        {"{\"a\":" TENSOR_JSON("F32", "[1e0]", "[0,4]") "}", 4, "shape[0] is not an integer"},
        {"{\"a\":" TENSOR_JSON("F32", "[\"2\"]", "[0,8]") "}", 8, "tensor 'a' shape[0] is a string"},
        {"{\"a\":" TENSOR_JSON("F32", "[9223372036854775808]", "[0,0]") "}", 0, "shape[0] is too large"},
        {"{\"a\":" TENSOR_JSON("F32", "[99999999999999999999999]", "[0,0]") "}", 0, "shape[0] is too large"},
        {"{\"a\":" TENSOR_JSON("F32", "[4294967296,4294967296,16]", "[0,0]") "}", 0, "overflows"},
        {"{\"a\":" TENSOR_JSON("U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1, "shape has more than 8 elements"},
        {"{\"a\":" TENSOR_JSON("F32", "[1]", "[8,4]") "}", 8, "tensor 'a' data_offsets [8, 4] end before they begin"},
        {"{\"a\":" TENSOR_JSON("F32", "[1]", "[0,4,8]") "}", 8, "data_offsets has more than 2 elements"},
        {"{\"a\":" TENSOR_JSON("F32", "[1]", "[4]") "}", 8, "data_offsets has 1 elements, expected 2"},
        {"{\"a\":" TENSOR_JSON("F32", "[1]", "[0,-4]") "}", 8, "data_offsets[1] is negative"},
        {"{\"a\":" TENSOR_JSON("F32", "[1]", "[0,18446744073709551616]") "}", 8, "data_offsets[1] is too large"},
        /* past 2^63 - 1, the reader's 64-bit integers: no file is that large */
        {"{\"a\":" TENSOR_JSON("F32", "[1]", "[0,18446744073709551615]") "}", 8, "tensor 'a' data_offsets[1] is too large"},
        {"{\"a\":" TENSOR_JSON("F32", "[1]", "{}") "}", 4, "tensor 'a' data_offsets is an object, expected an array"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'a' has no data_offsets"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a' has no dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'a' has no shape"},
        {"{\"a\":{}}", 0, "tensor 'a' has no dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "tensor 'a' has a duplicate key 'dtype'"},
        {"{\"a\":{\"dtype\":\"F32\",\"foo\":1,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "tensor 'a' has an unknown key 'foo'"},
        {"{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a' dtype is a number"},
        {"{\"a\":\"F32\"}", 0, "tensor 'a' is a string, expected an object"},
        {"{\"a\\nb\":\"F32\"}", 0, "tensor 'a\\x0ab' is a string"},
    };
#undef T
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_corrupt_header_at(bad[i].h, d, bad[i].dlen, bad[i].fragment, (int)i);
}

/* What the reader must accept although kst's writer never produces it. */
static void test_accepts(void) {
    ht_error err = {0};
    static const unsigned char d[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const char *p = pth("ok.safetensors");
    safetensors_file *f = NULL;
    /* JSON whitespace everywhere, unpadded header, keys in any order, two
     * empty tensors at one offset, escapes \/ and a surrogate pair, an empty
     * tensor name, \u escapes for ASCII, trailing newline before the data */
    write_raw(p,
              " { \"__metadata__\" : { \"a\\/b\" : \"\\ud83d\\ude42\\u00e9\\u0041\" } ,\n"
              "\t\"z\" : { \"data_offsets\" : [ 4 , 8 ] , \"shape\" : [ 2 , 2 ] , \"dtype\" : \"U8\" } ,\r\n"
              "\"e1\":{\"dtype\":\"F64\",\"shape\":[0],\"data_offsets\":[4,4]},"
              "\"e2\":{\"dtype\":\"F64\",\"shape\":[3,0],\"data_offsets\":[4,4]},"
              "\"\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]}}\n",
              d, sizeof d);
    int rc = safetensors_open(p, &f, &err);
    if (rc) fprintf(stderr, "\n  %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(safetensors_count(f), 4);
    CU_ASSERT_STRING_EQUAL(safetensors_metadata(f, "a/b"), "\xf0\x9f\x99\x82\xc3\xa9"
                                                   "A");
    const safetensors_tensor *t = safetensors_find(f, "z");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_EQUAL(t->nbytes, 4);
    CU_ASSERT_EQUAL(((const unsigned char *)t->data)[0], 5);
    t = safetensors_find(f, "");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_EQUAL(t->ndim, 0);
    CU_ASSERT_EQUAL(memcmp(t->data, d, 4), 0);
    CU_ASSERT_EQUAL(safetensors_find(f, "e2")->nbytes, 0);
    CU_ASSERT_EQUAL(safetensors_find(f, "e2")->shape[1], 0);
    safetensors_close(f);
    /* every byte-sized dtype is known */
    const char *dts[] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16",
                         "F16",  "BF16", "I32", "U32", "F32", "I64", "U64", "F64"};
    const size_t sz[] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
    for (int i = 0; i < 16; i++) CU_ASSERT_EQUAL(safetensors_dtype_size(dts[i]), sz[i]);
    CU_ASSERT_EQUAL(safetensors_dtype_size("f32"), 0);
    CU_ASSERT_EQUAL(safetensors_dtype_size(NULL), 0);
}

/* ---------------------------------------------------------------------------
 * Independent Python code on either side */

/* An interpreter that can import the given modules, or NULL. python3 on
 * PATH may be a private build without numpy; Debian's has python3-numpy. */
static const char *find_python(const char *modules) {
    static const char *const cands[] = {"python3", "/usr/bin/python3"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        char import[256], out[1024];
        snprintf(import, sizeof import, "import %s", modules);
        char *argv[] = {(char *)cands[i], "-c", import, NULL};
        if (tu_run_argv(argv, out, sizeof out) == 0) return cands[i];
    }
    return NULL;
}

/* The writer uses only struct and json (the safetensors package is not
 * needed). json.dumps with its defaults exercises the reader further: ", "
 * and ": " separators and \uXXXX escapes for all non-ASCII, astral
 * characters as surrogate pairs. chr() keeps backslashes out of the source. */
static const char py_writer[] =
    "import json, struct, sys\n"
    "def f32(*v): return struct.pack('<%df' % len(v), *v)\n"
    "tensors = [\n"
    "  ('embed.weight', 'F32', [2, 3], f32(1.0, -2.5, 3.0, 0.125, -0.0, 1e-3)),\n"
    "  ('count', 'I64', [], struct.pack('<q', -42)),\n"
    "  ('mask', 'U8', [4], bytes([1, 0, 255, 7])),\n"
    "  ('bf', 'BF16', [2], struct.pack('<f', 1.5)[2:] + struct.pack('<f', -2.0)[2:]),\n"
    "  ('empty', 'F16', [0, 3], b''),\n"
    "  ('i32', 'I32', [3, 1], struct.pack('<3i', 1, -2, 2147483647)),\n"
    "  ('d', 'F64', [2], struct.pack('<2d', 3.141592653589793, -1e300)),\n"
    "  ('smile' + chr(0x1F642), 'U8', [1], bytes([42])),\n"
    "]\n"
    "note = 'quote ' + chr(34) + ' backslash ' + chr(92) + ' newline ' + chr(10) + ' tab ' + chr(9)\n"
    "utf = 'caf' + chr(0xe9) + ' ' + chr(0x65e5) + chr(0x672c) + ' ' + chr(0x1F642)\n"
    "hdr = {'__metadata__': {'format': 'pt', 'note': note, 'utf': utf}}\n"
    "data = b''\n"
    "for name, dt, shape, raw in tensors:\n"
    "    hdr[name] = {'dtype': dt, 'shape': shape, 'data_offsets': [len(data), len(data) + len(raw)]}\n"
    "    data += raw\n"
    "h = json.dumps(hdr).encode('ascii')\n"
    "h += b' ' * (-len(h) % 8)\n"
    "open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h + data)\n";

static void test_python_written(void) {
    const char *py = find_python("json, struct");
    if (!py) {
        printf("\n  SKIPPED: no python3 to write an independent safetensors file\n  ");
        return;
    }
    const char *script = pth("pywrite.py"), *p = pth("py.safetensors");
    CU_ASSERT_EQUAL_FATAL(tu_write(script, py_writer), 0);
    char out[4096];
    int rc = tu_run_argv((char *[]){(char *)py, (char *)script, (char *)p, NULL}, out, sizeof out);
    if (rc) fprintf(stderr, "\n  %s\n", out);
    CU_ASSERT_EQUAL_FATAL(rc, 0);

    ht_error err = {0};
    safetensors_file *f = NULL;
    rc = safetensors_open(p, &f, &err);
    if (rc) fprintf(stderr, "\n  %s\n", err.msg);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    CU_ASSERT_EQUAL(safetensors_count(f), 8);
    CU_ASSERT_STRING_EQUAL(safetensors_get(f, 0)->name, "embed.weight");
    CU_ASSERT_STRING_EQUAL(safetensors_metadata(f, "format"), "pt");
    CU_ASSERT_STRING_EQUAL(safetensors_metadata(f, "note"), "quote \" backslash \\ newline \n tab \t");
    CU_ASSERT_STRING_EQUAL(safetensors_metadata(f, "utf"), "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82");

    const safetensors_tensor *t = safetensors_find(f, "embed.weight");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_STRING_EQUAL(t->dtype, "F32");
    CU_ASSERT(t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->nbytes == 24);
    const float ef[6] = {1.0f, -2.5f, 3.0f, 0.125f, -0.0f, 1e-3f};
    CU_ASSERT_EQUAL(memcmp(t->data, ef, sizeof ef), 0);

    t = safetensors_find(f, "count");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    int64_t c;
    memcpy(&c, t->data, sizeof c);
    CU_ASSERT(t->ndim == 0 && t->nbytes == 8 && c == -42 && !strcmp(t->dtype, "I64"));

    t = safetensors_find(f, "mask");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT(t->nbytes == 4 && memcmp(t->data, "\x01\x00\xff\x07", 4) == 0);

    t = safetensors_find(f, "bf");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    const uint16_t ebf[2] = {0x3fc0, 0xc000};
    CU_ASSERT(!strcmp(t->dtype, "BF16") && t->nbytes == 4 && memcmp(t->data, ebf, 4) == 0);

    t = safetensors_find(f, "empty");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT(t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 3 && t->nbytes == 0);

    t = safetensors_find(f, "i32");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    const int32_t ei[3] = {1, -2, 2147483647};
    CU_ASSERT(t->shape[0] == 3 && t->shape[1] == 1 && memcmp(t->data, ei, sizeof ei) == 0);

    t = safetensors_find(f, "d");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    const double ed[2] = {3.141592653589793, -1e300};
    CU_ASSERT(t->nbytes == 16 && memcmp(t->data, ed, sizeof ed) == 0);

    t = safetensors_find(f, "smile\xf0\x9f\x99\x82");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_EQUAL(((const unsigned char *)t->data)[0], 42);
    safetensors_close(f);
}

/* The reader checks the layout rules itself and the values with
 * numpy.frombuffer; prints OK only when everything matched. */
static const char py_reader[] =
    "import json, struct, sys\n"
    "import numpy as np\n"
    "b = open(sys.argv[1], 'rb').read()\n"
    "n = struct.unpack('<Q', b[:8])[0]\n"
    "assert n % 8 == 0, 'header not padded'\n"
    "hdr = json.loads(b[8:8 + n].decode('utf-8'))\n"
    "meta = hdr.pop('__metadata__')\n"
    "data = b[8 + n:]\n"
    "dt = {'F32': '<f4', 'F64': '<f8', 'I32': '<i4', 'I64': '<i8', 'U8': 'u1', 'F16': '<f2'}\n"
    "spans = sorted(tuple(v['data_offsets']) for v in hdr.values())\n"
    "at = 0\n"
    "for s, e in spans:\n"
    "    assert s == at, ('gap or overlap', s, at)\n"
    "    at = e\n"
    "assert at == len(data), ('trailing', at, len(data))\n"
    "t = {}\n"
    "for k, v in hdr.items():\n"
    "    s, e = v['data_offsets']\n"
    "    t[k] = np.frombuffer(data[s:e], dtype=np.dtype(dt[v['dtype']])).reshape(v['shape'])\n"
    "assert list(hdr) == ['w', 'step', 'h', 'empty', 'u8', 'caf' + chr(0xe9)], list(hdr)\n"
    "assert t['w'].shape == (2, 3) and t['w'].dtype == np.float32\n"
    "assert (t['w'] == np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5).all(), t['w']\n"
    "assert t['step'].shape == () and int(t['step']) == -9000000000, t['step']\n"
    "assert t['h'].tolist() == [1.0, -2.0, 0.5], t['h']\n"
    "assert t['empty'].shape == (0, 2) and t['empty'].dtype == np.float64\n"
    "assert t['u8'].tolist() == [[7], [8], [255]]\n"
    "assert t['caf' + chr(0xe9)].tolist() == [-1, 2147483647]\n"
    "ck = {k[len('kiln.xxh3.'):]: v for k, v in meta.items() if k.startswith('kiln.xxh3.')}\n"
    "meta = {k: v for k, v in meta.items() if not k.startswith('kiln.xxh3.')}\n"
    "assert meta == {'note': 'a' + chr(34) + 'b' + chr(92) + 'c' + chr(10) + 'd', "
    "'utf': chr(0xe9) + chr(0x1F642), 'epoch': '12'}, meta\n"
    "assert sorted(ck) == sorted(hdr), (ck, list(hdr))\n"
    "import ctypes, ctypes.util\n"
    "lib = ctypes.util.find_library('xxhash') or 'libxxhash.so.0'\n"
    "x = ctypes.CDLL(lib)\n"
    "x.XXH3_64bits.restype = ctypes.c_uint64\n"
    "x.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]\n"
    "for k, v in hdr.items():\n"
    "    s, e = v['data_offsets']\n"
    "    assert ck[k] == '%016x' % x.XXH3_64bits(data[s:e], e - s), (k, ck[k])\n"
    "print('OK')\n";

static void test_python_reads(void) {
    const char *py = find_python("json, struct, numpy");
    if (!py) {
        printf("\n  SKIPPED: no python3 with numpy to read a kst-written file\n  ");
        return;
    }
    float w6[6];
    for (int i = 0; i < 6; i++) w6[i] = 0.5f * (float)i;
    const int64_t step = -9000000000LL;
    const uint16_t h[3] = {0x3c00, 0xc000, 0x3800}; /* 1, -2, 0.5 */
    const uint8_t u8[3] = {7, 8, 255};
    const int32_t i2[2] = {-1, 2147483647};
    const int64_t s23[2] = {2, 3}, s3 = 3, s02[2] = {0, 2}, s31[2] = {3, 1}, s2 = 2;
    ht_error err = {0};
    safetensors_writer *w = safetensors_writer_new();
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "w", "F32", s23, 2, w6, sizeof w6, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "step", "I64", NULL, 0, &step, sizeof step, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "h", "F16", &s3, 1, h, sizeof h, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "empty", "F64", s02, 2, NULL, 0, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "u8", "U8", s31, 2, u8, sizeof u8, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "caf\xc3\xa9", "I32", &s2, 1, i2, sizeof i2, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_metadata(w, "note", "a\"b\\c\nd", &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_metadata(w, "utf", "\xc3\xa9\xf0\x9f\x99\x82", &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_metadata(w, "epoch", "12", &err), KILN_OK);
    const char *p = pth("for-python.safetensors"), *script = pth("pyread.py");
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    CU_ASSERT_EQUAL_FATAL(tu_write(script, py_reader), 0);
    char out[8192];
    int rc = tu_run_argv((char *[]){(char *)py, (char *)script, (char *)p, NULL}, out, sizeof out);
    if (rc || strcmp(out, "OK\n") != 0) fprintf(stderr, "\n  python reader: %s\n", out);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_STRING_EQUAL(out, "OK\n");
}

/* A two-tensor file (a weight and a U8 state blob, as a checkpoint holds
 * them), then one bit flipped in each tensor's bytes in turn: refused with
 * the file, the tensor and both checksums named. */
static void test_checksum_bitflip(void) {
    float wv[4] = {0.25f, -1.0f, 3.5f, 7.0f};
    unsigned char blob[5] = {1, 2, 3, 4, 5};
    const int64_t s4 = 4, s5 = 5;
    ht_error err = {0};
    safetensors_writer *w = safetensors_writer_new();
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "layers.0.weight", "F32", &s4, 1, wv, sizeof wv, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "__state__.optimizer", "U8", &s5, 1, blob, sizeof blob, &err),
                    KILN_OK);
    CU_ASSERT_EQUAL(safetensors_add_metadata(w, "format", "x", &err), KILN_OK);
    const char *p = pth("ck.safetensors");
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    safetensors_file *f = NULL;
    CU_ASSERT_EQUAL_FATAL(safetensors_open(p, &f, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_checksum_count(f), 2);
    CU_ASSERT_EQUAL(safetensors_metadata_count(f), 1); /* the checksums are not metadata to the caller */
    CU_ASSERT_PTR_NULL(safetensors_metadata(f, "kiln.xxh3.layers.0.weight"));
    safetensors_close(f);
    size_t n;
    unsigned char *b = read_bytes(p, &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    /* data = the last 16 + 5 bytes: the weight first, then the blob */
    struct { size_t at; const char *tensor; } flips[] = {{n - 21 + 6, "layers.0.weight"}, {n - 2, "__state__.optimizer"}};
    for (size_t i = 0; i < 2; i++) {
        b[flips[i].at] ^= 0x10;
        const char *q = pth("ck-flipped.safetensors");
        CU_ASSERT_EQUAL_FATAL(write_bytes(q, b, n), 0);
        b[flips[i].at] ^= 0x10;
        f = NULL;
        err.msg[0] = 0;
        CU_ASSERT_EQUAL(safetensors_open(q, &f, &err), KILN_E_DATA);
        CU_ASSERT_PTR_NULL(f);
        char want[256];
        snprintf(want, sizeof want, "%s: tensor '%s': checksum mismatch (stored ", q, flips[i].tensor);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, want));
        CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "): the file is damaged"));
        CU_ASSERT_PTR_NULL(strchr(err.msg, '\n'));
        if (!strstr(err.msg, want)) fprintf(stderr, "\n  got: %s\n", err.msg);
    }
    free(b);
}

/* Files without checksums (other tools', older kiln's) load unverified;
 * a damaged checksum entry and a tensor left without one are refused. */
static void test_checksum_absent_or_damaged(void) {
    ht_error err = {0};
    const float a[2] = {1.0f, -2.0f};
    const int64_t two = 2;
    safetensors_writer *w = safetensors_writer_new();
    safetensors_writer_checksums(w, 0);
    CU_ASSERT_EQUAL(safetensors_add_tensor(w, "a", "F32", &two, 1, a, sizeof a, &err), KILN_OK);
    const char *p = pth("nock.safetensors");
    CU_ASSERT_EQUAL_FATAL(safetensors_write_atomic(w, p, &err), KILN_OK);
    safetensors_writer_free(w);
    safetensors_file *f = NULL;
    CU_ASSERT_EQUAL_FATAL(safetensors_open(p, &f, &err), KILN_OK);
    CU_ASSERT_EQUAL(safetensors_checksum_count(f), 0);
    CU_ASSERT_EQUAL(safetensors_count(f), 1);
    safetensors_close(f);

    /* the reserved prefix is not the caller's to write */
    w = safetensors_writer_new();
    CU_ASSERT_EQUAL(safetensors_add_metadata(w, "kiln.xxh3.a", "0000000000000000", &err), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "reserved"));
    safetensors_writer_free(w);

    static const struct { const char *hdr; const char *err; } bad[] = {
        {"{\"__metadata__\":{\"kiln.xxh3.a\":\"28a0ba9c345d372\"},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         "tensor 'a': checksum '28a0ba9c345d372' is not 16 hex digits"},
        {"{\"__metadata__\":{\"kiln.xxh3.b\":\"28a0ba9c345d3723\"},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         "checksum for tensor 'b', which the file does not hold"},
        {"{\"__metadata__\":{\"kiln.xxh3.a\":\"28a0ba9c345d3723\"},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"c\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}",
         "tensor 'c' has no checksum while 1 other tensor(s) have one"},
        {"{\"__metadata__\":{\"kiln.xxh3.a\":\"28A0BA9C345D3723\"},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         NULL}, /* upper-case hex is the same number */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t hl = strlen(bad[i].hdr), pad = (8 - hl % 8) % 8, tot = 8 + hl + pad + 8;
        unsigned char buf[512];
        for (int k = 0; k < 8; k++) buf[k] = (unsigned char)((hl + pad) >> (8 * k));
        memcpy(buf + 8, bad[i].hdr, hl);
        memset(buf + 8 + hl, ' ', pad);
        memcpy(buf + 8 + hl + pad, a, sizeof a);
        const char *q = pth("ckbad.safetensors");
        CU_ASSERT_EQUAL_FATAL(write_bytes(q, buf, tot), 0);
        f = NULL;
        err.msg[0] = 0;
        int rc = safetensors_open(q, &f, &err);
        if (!bad[i].err) {
            CU_ASSERT_EQUAL(rc, KILN_OK);
            CU_ASSERT_EQUAL(safetensors_checksum_count(f), 1);
        } else {
            CU_ASSERT_EQUAL(rc, KILN_E_DATA);
            CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, bad[i].err));
            CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, q));
            if (!strstr(err.msg, bad[i].err)) fprintf(stderr, "\n  case %zu got: %s\n", i, err.msg);
        }
        safetensors_close(f);
    }
}

static void register_tests(void) {
    CU_pSuite s = CU_add_suite("safetensors", suite_init, suite_clean);
    CU_add_test(s, "round trip of dtypes, shapes and awkward metadata", test_round_trip);
    CU_add_test(s, "exact on-disk layout against hand-written bytes", test_exact_layout);
    CU_add_test(s, "writer refuses bad arguments", test_writer_args);
    CU_add_test(s, "atomic write replaces the file", test_atomic_replace);
    CU_add_test(s, "failed writes leave the target untouched", test_atomic_failures);
    CU_add_test(s, "a write failing or dying midway keeps the old file", test_atomic_midway);
    CU_add_test(s, "a FIFO is refused without hanging", test_fifo_refused);
    CU_add_test(s, "a save removes dead saves' temp files, only those", test_stale_tmp_cleanup);
    CU_add_test(s, "truncated files refused", test_truncated);
    CU_add_test(s, "bad header length refused", test_bad_length);
    CU_add_test(s, "invalid header JSON refused", test_invalid_json);
    CU_add_test(s, "bad tensor entries and metadata refused", test_bad_entries);
    CU_add_test(s, "reader accepts what other writers produce", test_accepts);
    CU_add_test(s, "reads a file written by independent Python", test_python_written);
    CU_add_test(s, "independent Python (numpy) reads a kst file", test_python_reads);
    CU_add_test(s, "a flipped bit in a weight or a state blob is refused", test_checksum_bitflip);
    CU_add_test(s, "files without checksums load; damaged entries refused", test_checksum_absent_or_damaged);
}

#include "cunit_main.h"
