/*
 * host/safetensors.c — see safetensors.h. The writer emits the header the
 * way the reference implementation (huggingface/safetensors, serde_json) does
 * — compact JSON, "__metadata__" first, then each tensor's dtype, shape and
 * data_offsets, padded with spaces to a multiple of 8 — so files compare
 * byte for byte with other writers' output and load anywhere. The reader
 * trusts nothing in the file: jansson parses the header (strict JSON, UTF-8
 * checked, duplicate keys refused, 64-bit integers), then every tensor's
 * dtype, shape, offsets and size is checked, and finally that the offsets
 * tile the data with no gap, overlap or trailing byte, mirroring the checks
 * of the reference reader. Each failure is one line naming the file and the
 * broken rule. The writer stays our own: jansson's encoder neither orders
 * keys as serde_json does nor pads, and the bytes must match.
 *
 * Checksums: the writer adds one "__metadata__" entry per tensor,
 * "kiln.xxh3.<tensor name>" = the 16 lowercase hex digits of XXH3-64 (seed 0)
 * of the tensor's bytes, so any safetensors reader can verify a file with
 * nothing but a metadata lookup and libxxhash. The reader verifies every
 * checksum before it hands out a tensor, and keeps these entries out of the
 * metadata it reports (they belong to the file, not to its writer's caller);
 * a file without them (another tool's, an older kiln's) loads unverified.
 */
#define _GNU_SOURCE
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include <xxhash.h>

#include "log.h"

/* Tensor bytes go to disk and come back exactly as they are in memory, and
 * the format is little-endian: a big-endian host would need byte swapping. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* ---------------------------------------------------------------------------
 * Dtypes */

typedef struct st_dtype {
    const char *name;
    size_t size;
} st_dtype;

/* The byte-sized dtypes of the safetensors spec. Sub-byte kinds (F4, F6_*)
 * have no whole-byte element size, so product(shape)*size cannot be checked
 * the same way; kiln never writes them and refuses them on read. */
static const st_dtype st_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},
};
#define ST_NDTYPES (sizeof st_dtypes / sizeof st_dtypes[0])

static const st_dtype *st_dtype_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < ST_NDTYPES; i++)
        if (!strcmp(st_dtypes[i].name, name)) return &st_dtypes[i];
    return NULL;
}

size_t safetensors_dtype_size(const char *dtype) {
    const st_dtype *d = st_dtype_find(dtype);
    return d ? d->size : 0;
}

/* ---------------------------------------------------------------------------
 * Messages */

/* A name as it may appear inside a one-line message: control characters
 * escaped (a tensor name may hold a newline) and long names shortened. */
static const char *st_q(const char *s, char *buf, size_t len) {
    size_t o = 0;
    const size_t keep = len > 16 ? len - 8 : len;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (o + 5 >= keep) {
            /* cut on a UTF-8 boundary so the message stays valid text */
            while (o > 0 && ((unsigned char)buf[o - 1] & 0xC0) == 0x80) o--;
            if (o > 0 && (unsigned char)buf[o - 1] >= 0xC0) o--;
            memcpy(buf + o, "...", 4);
            return buf;
        }
        if (*p < 0x20 || *p == 0x7F) o += (size_t)snprintf(buf + o, len - o, "\\x%02x", *p);
        else buf[o++] = (char)*p;
    }
    buf[o] = 0;
    return buf;
}

/* "<path>: <message>" and `code` into err; returns code so callers can
 * `return`. */
__attribute__((format(printf, 4, 5))) static int st_fail(int code, ht_error *err, const char *path, const char *fmt,
                                                        ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (path) return ht_errorc(err, code, "%s: %s", path, msg);
    return ht_errorc(err, code, "%s", msg);
}

static void st_fmt_shape(const int64_t *shape, int ndim, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* Element count times element size, or -1 on overflow. A zero dimension
 * makes the tensor empty whatever the other dimensions are. */
static int st_nbytes(const int64_t *shape, int ndim, size_t esize, uint64_t *out) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) { *out = 0; return 0; }
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (n > UINT64_MAX / d) return -1;
        n *= d;
    }
    if (n > UINT64_MAX / esize) return -1;
    *out = n * esize;
    return 0;
}

/* Offset of the first byte that is not valid UTF-8 (overlong forms,
 * surrogates and code points past U+10FFFF included), or n when valid. */
static size_t st_utf8_check(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return i;
        if (n - i < len) return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += len;
    }
    return n;
}

/* ---------------------------------------------------------------------------
 * A string -> index hash, so duplicate names are caught and safetensors_find answers
 * in constant time even for checkpoints with thousands of tensors. Keys are
 * borrowed: they point at strings owned by the writer or the file. */

typedef struct st_index {
    size_t cap, n;
    const char **key;
    int *val;
} st_index;

static uint64_t st_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return h;
}

static int st_index_get(const st_index *ix, const char *key) {
    if (!ix->cap) return -1;
    for (size_t i = (size_t)st_hash(key) & (ix->cap - 1);; i = (i + 1) & (ix->cap - 1)) {
        if (!ix->key[i]) return -1;
        if (!strcmp(ix->key[i], key)) return ix->val[i];
    }
}

static void st_index_place(const char **keys, int *vals, size_t cap, const char *key, int val) {
    size_t i = (size_t)st_hash(key) & (cap - 1);
    while (keys[i]) i = (i + 1) & (cap - 1);
    keys[i] = key;
    vals[i] = val;
}

/* Insert a key known to be absent; KILN_E_NOMEM or 0. */
static int st_index_put(st_index *ix, const char *key, int val) {
    if ((ix->n + 1) * 2 > ix->cap) {
        size_t cap = ix->cap ? ix->cap * 2 : 16;
        const char **keys = calloc(cap, sizeof *keys);
        int *vals = calloc(cap, sizeof *vals);
        if (!keys || !vals) {
            free(keys);
            free(vals);
            return KILN_E_NOMEM;
        }
        for (size_t i = 0; i < ix->cap; i++)
            if (ix->key[i]) st_index_place(keys, vals, cap, ix->key[i], ix->val[i]);
        free(ix->key);
        free(ix->val);
        ix->key = keys;
        ix->val = vals;
        ix->cap = cap;
    }
    st_index_place(ix->key, ix->val, ix->cap, key, val);
    ix->n++;
    return 0;
}

static void st_index_free(st_index *ix) {
    free(ix->key);
    free(ix->val);
    memset(ix, 0, sizeof *ix);
}

/* Grow a dynamic array to hold one more element; 0 or KILN_E_NOMEM. */
static int st_grow(void **arr, int *cap, int n, size_t elem) {
    if (n < *cap) return 0;
    if (*cap > INT_MAX / 2) return KILN_E_NOMEM;
    int nc = *cap ? *cap * 2 : 8;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return KILN_E_NOMEM;
    *arr = p;
    *cap = nc;
    return 0;
}

typedef struct st_kv {
    char *key, *value;
} st_kv;

/* ---------------------------------------------------------------------------
 * Writer */

typedef struct st_wtensor {
    char *name;
    const char *dtype; /* points into st_dtypes */
    int ndim;
    int64_t shape[KST_MAX_DIMS];
    const void *data;
    size_t nbytes;
} st_wtensor;

struct safetensors_writer {
    st_wtensor *t;
    int nt, capt;
    st_kv *m;
    int nm, capm;
    st_index tix, mix;
    uint64_t total; /* bytes of data so far: guards the offsets against overflow */
    int no_checksums; /* safetensors_writer_checksums(w, 0): the reference layout, byte for byte */
};

safetensors_writer *safetensors_writer_new(void) { return calloc(1, sizeof(safetensors_writer)); }

void safetensors_writer_checksums(safetensors_writer *w, int on) {
    if (w) w->no_checksums = !on;
}

/* The reserved metadata prefix of the per-tensor checksums. */
#define ST_CK_PREFIX "kiln.xxh3."
#define ST_CK_PREFIX_LEN (sizeof ST_CK_PREFIX - 1)

static int st_is_ck_key(const char *key) { return strncmp(key, ST_CK_PREFIX, ST_CK_PREFIX_LEN) == 0; }

/* The checksum of one tensor's bytes, as written: 16 lowercase hex digits. */
static void st_ck_hex(const void *data, size_t n, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits(data, n));
}

void safetensors_writer_free(safetensors_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->nt; i++) free(w->t[i].name);
    for (int i = 0; i < w->nm; i++) {
        free(w->m[i].key);
        free(w->m[i].value);
    }
    free(w->t);
    free(w->m);
    st_index_free(&w->tix);
    st_index_free(&w->mix);
    free(w);
}

int safetensors_add_tensor(safetensors_writer *w, const char *name, const char *dtype, const int64_t *shape, int ndim,
                   const void *data, size_t nbytes, ht_error *err) {
    char q[128], sh[256];
    if (!w || !name) return st_fail(KILN_E_INVALID_ARG, err, NULL, "safetensors_add_tensor: no writer or no name");
    st_q(name, q, sizeof q);
    if (!*name) return st_fail(KILN_E_INVALID_ARG, err, NULL, "safetensors_add_tensor: empty tensor name");
    if (st_utf8_check((const unsigned char *)name, strlen(name)) != strlen(name))
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "tensor name '%s' is not valid UTF-8", q);
    /* the reserved key would turn the tensor into (broken) metadata */
    if (!strcmp(name, "__metadata__"))
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "tensor name '__metadata__' is reserved by the format");
    const st_dtype *dt = st_dtype_find(dtype);
    if (!dt)
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "tensor '%s': unknown dtype '%s'", q,
                       dtype ? dtype : "(null)");
    if (ndim < 0 || ndim > KST_MAX_DIMS)
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "tensor '%s': %d dimensions, expected 0 to %d", q, ndim,
                       KST_MAX_DIMS);
    if (ndim > 0 && !shape)
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "tensor '%s': no shape for %d dimensions", q, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return st_fail(KILN_E_INVALID_ARG, err, NULL, "tensor '%s': shape[%d] is %lld, expected >= 0", q,
                           i, (long long)shape[i]);
    st_fmt_shape(shape, ndim, sh, sizeof sh);
    uint64_t need;
    if (st_nbytes(shape, ndim, dt->size, &need) != 0)
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "tensor '%s': shape %s of %s overflows", q, sh,
                       dt->name);
    if (need != nbytes)
        return st_fail(KILN_E_INVALID_ARG, err, NULL,
                       "tensor '%s': %zu bytes given, but shape %s of %s needs %llu", q, nbytes, sh, dt->name,
                       (unsigned long long)need);
    if (nbytes && !data)
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "tensor '%s': no data for %zu bytes", q, nbytes);
    if (w->total > UINT64_MAX - nbytes)
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "tensor '%s': total data size overflows", q);
    if (st_index_get(&w->tix, name) >= 0)
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "duplicate tensor name '%s'", q);

    if (st_grow((void **)&w->t, &w->capt, w->nt, sizeof *w->t) != 0) goto nomem;
    st_wtensor *t = &w->t[w->nt];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) goto nomem;
    if (st_index_put(&w->tix, t->name, w->nt) != 0) {
        free(t->name);
        goto nomem;
    }
    t->dtype = dt->name;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
    t->nbytes = nbytes;
    w->total += nbytes;
    w->nt++;
    return KILN_OK;
nomem:
    return st_fail(KILN_E_NOMEM, err, NULL, "tensor '%s': out of memory", q);
}

int safetensors_add_metadata(safetensors_writer *w, const char *key, const char *value, ht_error *err) {
    char q[128];
    if (!w || !key || !value)
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "safetensors_add_metadata: no writer, key or value");
    st_q(key, q, sizeof q);
    if (st_utf8_check((const unsigned char *)key, strlen(key)) != strlen(key))
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "metadata key '%s' is not valid UTF-8", q);
    if (st_utf8_check((const unsigned char *)value, strlen(value)) != strlen(value))
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "metadata value for key '%s' is not valid UTF-8", q);
    if (st_index_get(&w->mix, key) >= 0)
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "duplicate metadata key '%s'", q);
    if (st_is_ck_key(key))
        return st_fail(KILN_E_INVALID_ARG, err, NULL,
                       "metadata key '%s': the prefix '" ST_CK_PREFIX "' is reserved for the tensors' checksums", q);
    if (st_grow((void **)&w->m, &w->capm, w->nm, sizeof *w->m) != 0) goto nomem;
    st_kv *kv = &w->m[w->nm];
    kv->key = strdup(key);
    kv->value = strdup(value);
    if (!kv->key || !kv->value || st_index_put(&w->mix, kv->key, w->nm) != 0) {
        free(kv->key);
        free(kv->value);
        goto nomem;
    }
    w->nm++;
    return KILN_OK;
nomem:
    return st_fail(KILN_E_NOMEM, err, NULL, "metadata key '%s': out of memory", q);
}

/* A growable byte buffer; oom is sticky so the header can be built without
 * checking every append. */
typedef struct st_buf {
    char *p;
    size_t n, cap;
    int oom;
} st_buf;

static void st_put(st_buf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) { b->oom = 1; return; }
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void st_puts(st_buf *b, const char *s) { st_put(b, s, strlen(s)); }

static void st_putu(st_buf *b, uint64_t v) {
    char t[24];
    st_put(b, t, (size_t)snprintf(t, sizeof t, "%llu", (unsigned long long)v));
}

/* A JSON string as serde_json writes it: quote, backslash and control
 * characters escaped, everything else (all of UTF-8, DEL) verbatim. */
/* A string's JSON escapes, without the quotes. */
static void st_put_jesc(st_buf *b, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        switch (*p) {
        case '"': st_put(b, "\\\"", 2); break;
        case '\\': st_put(b, "\\\\", 2); break;
        case '\b': st_put(b, "\\b", 2); break;
        case '\f': st_put(b, "\\f", 2); break;
        case '\n': st_put(b, "\\n", 2); break;
        case '\r': st_put(b, "\\r", 2); break;
        case '\t': st_put(b, "\\t", 2); break;
        default:
            if (*p < 0x20) st_put(b, e, (size_t)snprintf(e, sizeof e, "\\u%04x", *p));
            else st_put(b, p, 1);
        }
    }
}

static void st_put_jstr(st_buf *b, const char *s) {
    st_put(b, "\"", 1);
    st_put_jesc(b, s);
    st_put(b, "\"", 1);
}

/* The 8-byte length word followed by the padded header JSON. */
static void st_build_header(const safetensors_writer *w, st_buf *b) {
    st_put(b, "\0\0\0\0\0\0\0\0", 8); /* filled in below */
    st_put(b, "{", 1);
    int first = 1;
    int ck = !w->no_checksums && w->nt > 0;
    if (w->nm || ck) {
        st_puts(b, "\"__metadata__\":{");
        for (int i = 0; i < w->nm; i++) {
            if (i) st_put(b, ",", 1);
            st_put_jstr(b, w->m[i].key);
            st_put(b, ":", 1);
            st_put_jstr(b, w->m[i].value);
        }
        /* after the caller's entries, in tensor order; computed at each
         * write, as the referenced data may have changed between writes */
        for (int i = 0; ck && i < w->nt; i++) {
            char hex[17];
            if (i || w->nm) st_put(b, ",", 1);
            st_put(b, "\"" ST_CK_PREFIX, 1 + ST_CK_PREFIX_LEN);
            st_put_jesc(b, w->t[i].name);
            st_ck_hex(w->t[i].data, w->t[i].nbytes, hex);
            st_puts(b, "\":\"");
            st_puts(b, hex);
            st_put(b, "\"", 1);
        }
        st_put(b, "}", 1);
        first = 0;
    }
    uint64_t off = 0;
    for (int i = 0; i < w->nt; i++) {
        const st_wtensor *t = &w->t[i];
        if (!first) st_put(b, ",", 1);
        first = 0;
        st_put_jstr(b, t->name);
        st_puts(b, ":{\"dtype\":");
        st_put_jstr(b, t->dtype);
        st_puts(b, ",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) st_put(b, ",", 1);
            st_putu(b, (uint64_t)t->shape[d]);
        }
        st_puts(b, "],\"data_offsets\":[");
        st_putu(b, off);
        st_put(b, ",", 1);
        off += t->nbytes;
        st_putu(b, off);
        st_puts(b, "]}");
    }
    st_put(b, "}", 1);
    /* spaces up to a multiple of 8, as the reference writer pads, so the data
     * starts 8-aligned in the file */
    while (!b->oom && (b->n - 8) % 8) st_put(b, " ", 1);
    if (b->oom) return;
    uint64_t n = b->n - 8;
    for (int i = 0; i < 8; i++) b->p[i] = (char)(unsigned char)(n >> (8 * i));
}

/* write() until done; 0 or an errno. */
static int st_write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (k == 0) return EIO;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* What a non-regular file is, for the one-line refusal. */
static const char *st_file_kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a regular file";
}

/* The pid in a name "<base>.tmp.<pid>" (base = tmp_base, the name of the
 * file being written, or any name ending in ".safetensors"), or 0 when the
 * name is not one of our temporary files. Only plain decimal digits with no
 * leading zero and a value that fits a pid_t are accepted. */
static pid_t st_tmp_pid(const char *name, const char *tmp_base) {
    const char *mark = strstr(name, ".tmp.");
    if (!mark) return 0;
    /* the last ".tmp." is the suffix */
    for (const char *n2; (n2 = strstr(mark + 1, ".tmp.")); mark = n2) {}
    size_t blen = (size_t)(mark - name);
    static const char ext[] = ".safetensors";
    int ours = (blen == strlen(tmp_base) && memcmp(name, tmp_base, blen) == 0) ||
               (blen > sizeof ext - 1 && memcmp(mark - (sizeof ext - 1), ext, sizeof ext - 1) == 0);
    if (!ours) return 0;
    const char *d = mark + 5;
    if (*d < '1' || *d > '9') return 0;
    long long v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') return 0;
        v = v * 10 + (*d - '0');
        if (v > INT_MAX) return 0;
    }
    return (pid_t)v;
}

/* A process killed mid-save (SIGKILL, OOM killer, power loss) leaves its
 * "<path>.tmp.<pid>" behind, as large as the checkpoint, and nothing else
 * would ever remove it. Each save removes, in its own directory, such files
 * whose pid is no live process (kill(pid, 0) fails with ESRCH): a live
 * process's temp file is a save in progress, and EPERM means alive too.
 * Our own pid is skipped (our open(O_EXCL) below replaces it). Only regular
 * files are removed, never links. Best effort: failures change nothing. */
static void st_clean_stale_tmp(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    if (!d) return;
    int dfd = dirfd(d);
    pid_t self = getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        pid_t pid = st_tmp_pid(e->d_name, base);
        if (pid <= 0 || pid == self) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue;
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
        if (unlinkat(dfd, e->d_name, 0) == 0)
            HLOG_INFO("%s/%s: removed the temporary file of a save that died (pid %ld is gone)", dir,
                 e->d_name, (long)pid);
    }
    closedir(d);
}

int safetensors_write_atomic(safetensors_writer *w, const char *path, ht_error *err) {
    if (!w || !path || !*path)
        return st_fail(KILN_E_INVALID_ARG, err, NULL, "safetensors_write_atomic: no writer or no path");
    st_buf h = {0};
    st_build_header(w, &h);
    if (h.oom) {
        free(h.p);
        return st_fail(KILN_E_NOMEM, err, path, "out of memory building the header");
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    char *dir = malloc(plen + 2);
    if (!tmp || !dir) {
        free(h.p);
        free(tmp);
        free(dir);
        return st_fail(KILN_E_NOMEM, err, path, "out of memory");
    }
    /* same directory as path, so rename() is atomic (never across devices) */
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    memcpy(dir, path, plen + 1);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? path + (slash - dir) + 1 : path;
    if (!slash) strcpy(dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    /* before our own temp file: the space a dead save holds may be what
     * this one needs */
    st_clean_stale_tmp(dir, base);

    int rc = KILN_OK, werr = 0, fd;
    /* O_EXCL|O_NOFOLLOW: never write through a planted link. A leftover of
     * our pid (a crashed earlier process) is ours to replace. */
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && unlink(tmp) == 0)
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = st_fail(KILN_E_IO, err, path, "cannot create the temporary file %s: %s", tmp, strerror(errno));
        goto out;
    }
    werr = st_write_all(fd, h.p, h.n);
    for (int i = 0; !werr && i < w->nt; i++)
        if (w->t[i].nbytes) werr = st_write_all(fd, w->t[i].data, w->t[i].nbytes);
    if (werr) {
        rc = st_fail(KILN_E_IO, err, path, "cannot write the temporary file %s: %s", tmp, strerror(werr));
        close(fd);
        unlink(tmp);
        goto out;
    }
    /* the data must be on disk before the rename makes it the checkpoint,
     * or a crash could leave a renamed but empty file */
    if (fsync(fd) != 0) {
        rc = st_fail(KILN_E_IO, err, path, "cannot sync the temporary file %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    if (close(fd) != 0) {
        rc = st_fail(KILN_E_IO, err, path, "cannot close the temporary file %s: %s", tmp, strerror(errno));
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        rc = st_fail(KILN_E_IO, err, path, "cannot rename %s over it: %s", tmp, strerror(errno));
        unlink(tmp);
        goto out;
    }
    /* the rename itself lives in the directory: sync it so the new name
     * survives a crash. EINVAL: a filesystem that cannot sync directories. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL))
        rc = st_fail(KILN_E_IO, err, path,
                     "written, but syncing the directory %s failed: %s (the new file may not survive a crash)", dir,
                     strerror(errno));
    if (dfd >= 0) close(dfd);
out:
    free(h.p);
    free(tmp);
    free(dir);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Reader */

typedef struct st_rtensor {
    safetensors_tensor pub;
    uint64_t begin, end;
} st_rtensor;

struct safetensors_file {
    unsigned char *buf; /* the whole file */
    size_t size;
    st_rtensor *t;
    int nt, capt;
    st_kv *m;
    int nm, capm;
    st_index tix, mix;
    st_kv *ck;       /* the "kiln.xxh3.*" entries, kept apart from m */
    int nck, capck;
    st_index cix;
};

void safetensors_close(safetensors_file *f) {
    if (!f) return;
    for (int i = 0; i < f->nt; i++) free((char *)f->t[i].pub.name);
    for (int i = 0; i < f->nm; i++) {
        free(f->m[i].key);
        free(f->m[i].value);
    }
    for (int i = 0; i < f->nck; i++) {
        free(f->ck[i].key);
        free(f->ck[i].value);
    }
    free(f->t);
    free(f->m);
    free(f->ck);
    st_index_free(&f->tix);
    st_index_free(&f->mix);
    st_index_free(&f->cix);
    free(f->buf);
    free(f);
}

int safetensors_count(const safetensors_file *f) { return f ? f->nt : 0; }

const safetensors_tensor *safetensors_get(const safetensors_file *f, int i) {
    return f && i >= 0 && i < f->nt ? &f->t[i].pub : NULL;
}

const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name) {
    if (!f || !name) return NULL;
    int i = st_index_get(&f->tix, name);
    return i >= 0 ? &f->t[i].pub : NULL;
}

const char *safetensors_metadata(const safetensors_file *f, const char *key) {
    if (!f || !key) return NULL;
    int i = st_index_get(&f->mix, key);
    return i >= 0 ? f->m[i].value : NULL;
}

int safetensors_metadata_count(const safetensors_file *f) { return f ? f->nm : 0; }

int safetensors_checksum_count(const safetensors_file *f) { return f ? f->nck : 0; }

int safetensors_metadata_get(const safetensors_file *f, int i, const char **key, const char **value) {
    if (!f || i < 0 || i >= f->nm) return -1;
    if (key) *key = f->m[i].key;
    if (value) *value = f->m[i].value;
    return 0;
}

/* The whole file with read() (not mmap: a checkpoint rewritten under us
 * must not change the bytes we validated). */
static int st_read_file(const char *path, unsigned char **out, size_t *outlen, ht_error *err) {
    *out = NULL;
    *outlen = 0;
    /* O_NONBLOCK: a plain open() of a FIFO waits for a writer forever,
     * before fstat() could tell us what the path is. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return st_fail(KILN_E_IO, err, path, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return st_fail(KILN_E_IO, err, path, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return st_fail(KILN_E_IO, err, path, "expected a regular file, found %s", st_file_kind(st.st_mode));
    }
    /* ordinary blocking reads from here on */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return st_fail(KILN_E_IO, err, path, "cannot clear O_NONBLOCK: %s", strerror(e));
    }
    if ((uint64_t)st.st_size >= SIZE_MAX) {
        close(fd);
        return st_fail(KILN_E_NOMEM, err, path, "file too large to read (%lld bytes)", (long long)st.st_size);
    }
    /* one spare byte, so EOF is seen without a second allocation when the
     * size did not change */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return st_fail(KILN_E_NOMEM, err, path, "out of memory reading %zu bytes", cap - 1);
    }
    for (;;) {
        if (n == cap) {
            unsigned char *nb = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                close(fd);
                return st_fail(KILN_E_NOMEM, err, path, "out of memory reading the file");
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            free(buf);
            close(fd);
            return st_fail(KILN_E_IO, err, path, "cannot read: %s", strerror(e));
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    close(fd);
    *out = buf;
    *outlen = n;
    return KILN_OK;
}

/* The header parse: jansson reads the JSON (strict RFC 8259, UTF-8 checked,
 * duplicate keys refused, \u0000 refused so every name and value is a C
 * string); the rules of the format are then checked on the parsed tree, in
 * header order, so the first broken rule is the one reported. */
typedef struct st_ps {
    const char *path;
    const unsigned char *beg; /* the header bytes */
    size_t n;
    uint64_t datalen; /* bytes after the header */
    safetensors_file *f;
    ht_error *err;
} st_ps;

/* A byte of the header as "found ..." in a message. */
static const char *st_found_at(const st_ps *ps, size_t at, char *buf, size_t len) {
    if (at >= ps->n) return "the end of the header";
    unsigned c = ps->beg[at];
    if (c >= 0x20 && c < 0x7F) snprintf(buf, len, "'%c'", (char)c);
    else snprintf(buf, len, "byte 0x%02x", c);
    return buf;
}

static int st_is_ws(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Where a byte offset of a header lies, found by walking its tokens: jansson
 * reports an error's offset but not the path to it, and "duplicate tensor
 * name 'a'" or "tensor 'a' shape[2] is too large" needs the path. The bytes
 * before the offset have passed jansson's lexer, so only strings (which may
 * hold any bracket) need real tokenizing. Levels deeper than 3 are counted,
 * not recorded: no rule of the format looks there. */
#define ST_WHERE_LEVELS 4
typedef struct st_where {
    int depth;                               /* open containers (1: the header object) */
    char kind[ST_WHERE_LEVELS];              /* '{' or '[' of levels 1..3 */
    const unsigned char *key[ST_WHERE_LEVELS]; /* the raw key token (quotes included) at object levels */
    size_t keylen[ST_WHERE_LEVELS];
    int index[ST_WHERE_LEVELS];              /* the element index at array levels */
    const unsigned char *last;               /* the last string token before the offset */
    size_t lastlen;
    size_t root_end;                         /* offset just past the header object; 0 before it closed */
} st_where;

static void st_where_at(const unsigned char *s, size_t pos, st_where *w) {
    memset(w, 0, sizeof *w);
    for (size_t i = 0; i < pos; i++) {
        unsigned c = s[i];
        if (c == '"') {
            size_t j = i + 1;
            while (j < pos && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
            if (j >= pos) return; /* the offset is inside this string */
            w->last = s + i;
            w->lastlen = j + 1 - i;
            i = j;
        } else if (c == '{' || c == '[') {
            if (++w->depth < ST_WHERE_LEVELS) {
                w->kind[w->depth] = (char)c;
                w->index[w->depth] = 0;
                w->key[w->depth] = NULL;
            }
        } else if (c == '}' || c == ']') {
            if (--w->depth == 0) {
                w->root_end = i + 1;
                return;
            }
        } else if (c == ',' && w->depth < ST_WHERE_LEVELS && w->kind[w->depth] == '[') {
            w->index[w->depth]++;
        } else if (c == ':' && w->depth < ST_WHERE_LEVELS) {
            w->key[w->depth] = w->last;
            w->keylen[w->depth] = w->lastlen;
        }
    }
}

/* A raw key token decoded (jansson again: the token is a JSON string) and
 * quoted for a message; "?" when there is none. */
static const char *st_key_q(const unsigned char *raw, size_t len, char *buf, size_t n) {
    json_t *k = raw ? json_loadb((const char *)raw, len, JSON_DECODE_ANY, NULL) : NULL;
    if (json_is_string(k)) st_q(json_string_value(k), buf, n);
    else snprintf(buf, n, "?");
    json_decref(k);
    return buf;
}

static int st_key_is(const unsigned char *raw, size_t len, const char *name) {
    size_t l = strlen(name);
    return raw && len == l + 2 && memcmp(raw + 1, name, l) == 0;
}

/* jansson's refusal as one line. Duplicate keys and integers past 64 bits
 * are rules of the format too, so those name the tensor or the metadata
 * key the way the checks on the parsed tree do; anything else is a syntax
 * error, reported with jansson's words and the offset. */
static int st_json_error(st_ps *ps, const json_error_t *e) {
    char q[128], q2[128], t[256];
    const size_t pos = e->position > 0 ? (size_t)e->position : 0;
    st_where w;
    st_where_at(ps->beg, pos < ps->n ? pos : ps->n, &w);
    switch (json_error_code(e)) {
    case json_error_duplicate_key:
        if (w.depth == 1 && st_key_is(w.last, w.lastlen, "__metadata__"))
            return st_fail(KILN_E_DATA, ps->err, ps->path, "duplicate __metadata__ object");
        if (w.depth == 1)
            return st_fail(KILN_E_DATA, ps->err, ps->path, "duplicate tensor name '%s'",
                           st_key_q(w.last, w.lastlen, q, sizeof q));
        if (w.depth == 2 && st_key_is(w.key[1], w.keylen[1], "__metadata__"))
            return st_fail(KILN_E_DATA, ps->err, ps->path, "duplicate __metadata__ key '%s'",
                           st_key_q(w.last, w.lastlen, q, sizeof q));
        if (w.depth == 2)
            return st_fail(KILN_E_DATA, ps->err, ps->path, "tensor '%s' has a duplicate key '%s'",
                           st_key_q(w.key[1], w.keylen[1], q, sizeof q), st_key_q(w.last, w.lastlen, q2, sizeof q2));
        break;
    case json_error_numeric_overflow:
        if (w.depth == 3 && w.kind[3] == '[' && !st_key_is(w.key[1], w.keylen[1], "__metadata__") &&
            (st_key_is(w.key[2], w.keylen[2], "shape") || st_key_is(w.key[2], w.keylen[2], "data_offsets")))
            return st_fail(KILN_E_DATA, ps->err, ps->path,
                           "tensor '%s' %s[%d] is %s, expected a non-negative integer",
                           st_key_q(w.key[1], w.keylen[1], q, sizeof q),
                           st_key_is(w.key[2], w.keylen[2], "shape") ? "shape" : "data_offsets", w.index[3],
                           strstr(e->text, "negative") ? "negative" : "too large");
        break;
    case json_error_end_of_input_expected:
        /* after the header object: what the padding may not hold */
        if (w.root_end || pos >= ps->n) {
            size_t at = w.root_end;
            while (at < ps->n && st_is_ws(ps->beg[at])) at++;
            return st_fail(KILN_E_DATA, ps->err, ps->path,
                           "invalid header JSON at byte %zu of %zu: expected only padding spaces after the header "
                           "object, found %s",
                           at, ps->n, st_found_at(ps, at, q, sizeof q));
        }
        break;
    default:
        break;
    }
    return st_fail(KILN_E_DATA, ps->err, ps->path, "invalid header JSON at byte %zu of %zu: %s", pos, ps->n,
                   st_q(e->text, t, sizeof t));
}

/* What a JSON value is, for "is a number, expected a string". */
static const char *st_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    default: return "a number";
    }
}

/* An array of non-negative integers (a shape or data_offsets) for tensor
 * q's field; at most max elements, each at most lim. An element is checked
 * before the count, as the file is read front to back. */
static int st_uint_array(st_ps *ps, const json_t *a, const char *q, const char *field, uint64_t *vals, int max,
                         uint64_t lim, int *n) {
    if (!json_is_array(a))
        return st_fail(KILN_E_DATA, ps->err, ps->path, "tensor '%s' %s is %s, expected an array", q,
                       field, st_kind(a));
    *n = 0;
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *x = json_array_get(a, i);
        const char *bad = NULL;
        if (json_is_integer(x)) {
            json_int_t v = json_integer_value(x);
            bad = v < 0 ? "negative" : (uint64_t)v > lim ? "too large" : NULL;
        } else if (json_is_real(x)) {
            bad = json_real_value(x) < 0 ? "negative" : "not an integer";
        } else {
            bad = st_kind(x);
        }
        if (bad)
            return st_fail(KILN_E_DATA, ps->err, ps->path,
                           "tensor '%s' %s[%zu] is %s, expected a non-negative integer", q, field, i, bad);
        if ((int)i == max)
            return st_fail(KILN_E_DATA, ps->err, ps->path, "tensor '%s' %s has more than %d elements", q,
                           field, max);
        vals[(*n)++] = (uint64_t)json_integer_value(x);
    }
    return KILN_OK;
}

/* One tensor entry {"dtype":..,"shape":[..],"data_offsets":[b,e]}. */
static int st_tensor(st_ps *ps, const char *key, const json_t *v) {
    safetensors_file *f = ps->f;
    char q[128], sh[256];
    st_q(key, q, sizeof q);
    char *name = strdup(key);
    if (!name || st_grow((void **)&f->t, &f->capt, f->nt, sizeof *f->t) != 0) {
        free(name);
        return st_fail(KILN_E_NOMEM, ps->err, ps->path, "out of memory parsing the header");
    }
    /* owned by f from here on, so safetensors_close frees it on any failure */
    st_rtensor *t = &f->t[f->nt++];
    memset(t, 0, sizeof *t);
    t->pub.name = name;
    if (!json_is_object(v))
        return st_fail(KILN_E_DATA, ps->err, ps->path, "tensor '%s' is %s, expected an object", q,
                       st_kind(v));
    enum { HAVE_DTYPE = 1, HAVE_SHAPE = 2, HAVE_OFFSETS = 4 };
    int have = 0, rc;
    const st_dtype *dt = NULL;
    uint64_t shape[KST_MAX_DIMS] = {0}, offs[2] = {0, 0};
    int ndim = 0, noffs = 0;
    const char *fk;
    const json_t *fv;
    json_object_foreach((json_t *)v, fk, fv) {
        int bit = !strcmp(fk, "dtype") ? HAVE_DTYPE : !strcmp(fk, "shape") ? HAVE_SHAPE
                  : !strcmp(fk, "data_offsets") ? HAVE_OFFSETS : 0;
        if (!bit) {
            char kq[128];
            return st_fail(KILN_E_DATA, ps->err, ps->path,
                           "tensor '%s' has an unknown key '%s' (expected dtype, shape, data_offsets)", q,
                           st_q(fk, kq, sizeof kq));
        }
        have |= bit;
        if (bit == HAVE_DTYPE) {
            if (!json_is_string(fv))
                return st_fail(KILN_E_DATA, ps->err, ps->path, "tensor '%s' dtype is %s, expected a string",
                               q, st_kind(fv));
            dt = st_dtype_find(json_string_value(fv));
            if (!dt) {
                char dq[64];
                return st_fail(KILN_E_DATA, ps->err, ps->path,
                               "tensor '%s' has unknown dtype '%s' (expected one of BOOL, U8, I8, F8_E5M2, F8_E4M3, "
                               "F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64)",
                               q, st_q(json_string_value(fv), dq, sizeof dq));
            }
        } else if (bit == HAVE_SHAPE) {
            if ((rc = st_uint_array(ps, fv, q, "shape", shape, KST_MAX_DIMS, (uint64_t)INT64_MAX, &ndim)) != 0)
                return rc;
        } else {
            if ((rc = st_uint_array(ps, fv, q, "data_offsets", offs, 2, UINT64_MAX, &noffs)) != 0) return rc;
            if (noffs != 2)
                return st_fail(KILN_E_DATA, ps->err, ps->path,
                               "tensor '%s' data_offsets has %d elements, expected 2 [begin, end]", q, noffs);
        }
    }
    static const char *const names[] = {"dtype", "shape", "", "data_offsets"};
    for (int bit = 1; bit <= 4; bit <<= 1)
        if (!(have & bit))
            return st_fail(KILN_E_DATA, ps->err, ps->path, "tensor '%s' has no %s", q, names[bit - 1]);

    t->pub.dtype = dt->name;
    t->pub.ndim = ndim;
    for (int i = 0; i < ndim; i++) t->pub.shape[i] = (int64_t)shape[i];
    st_fmt_shape(t->pub.shape, ndim, sh, sizeof sh);
    t->begin = offs[0];
    t->end = offs[1];
    uint64_t need;
    if (st_nbytes(t->pub.shape, ndim, dt->size, &need) != 0)
        return st_fail(KILN_E_DATA, ps->err, ps->path, "tensor '%s' shape %s of %s overflows", q, sh,
                       dt->name);
    if (t->end < t->begin)
        return st_fail(KILN_E_DATA, ps->err, ps->path,
                       "tensor '%s' data_offsets [%llu, %llu] end before they begin", q,
                       (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > ps->datalen)
        return st_fail(KILN_E_DATA, ps->err, ps->path,
                       "tensor '%s' data_offsets [%llu, %llu] exceed the data (%llu bytes): truncated or corrupt file",
                       q, (unsigned long long)t->begin, (unsigned long long)t->end,
                       (unsigned long long)ps->datalen);
    if (t->end - t->begin != need)
        return st_fail(KILN_E_DATA, ps->err, ps->path,
                       "tensor '%s' data_offsets [%llu, %llu] hold %llu bytes, but shape %s of %s needs %llu", q,
                       (unsigned long long)t->begin, (unsigned long long)t->end,
                       (unsigned long long)(t->end - t->begin), sh, dt->name, (unsigned long long)need);
    t->pub.nbytes = (size_t)need;
    if (st_index_put(&f->tix, t->pub.name, f->nt - 1) != 0)
        return st_fail(KILN_E_NOMEM, ps->err, ps->path, "out of memory parsing the header");
    return KILN_OK;
}

/* "__metadata__": an object of string values. */
static int st_metadata(st_ps *ps, const json_t *v) {
    safetensors_file *f = ps->f;
    if (!json_is_object(v))
        return st_fail(KILN_E_DATA, ps->err, ps->path, "__metadata__ is %s, expected an object of strings",
                       st_kind(v));
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        char q[128];
        if (!json_is_string(val))
            return st_fail(KILN_E_DATA, ps->err, ps->path,
                           "__metadata__ value for key '%s' is %s, expected a string", st_q(key, q, sizeof q),
                           st_kind(val));
        /* checksums go to their own table, keyed by the tensor name (the
         * keys are distinct: jansson refused duplicates) */
        int ck = st_is_ck_key(key);
        st_kv **arr = ck ? &f->ck : &f->m;
        int *n = ck ? &f->nck : &f->nm, *cap = ck ? &f->capck : &f->capm;
        st_index *ix = ck ? &f->cix : &f->mix;
        char *k = strdup(key), *s = strdup(json_string_value(val));
        if (!k || !s || st_grow((void **)arr, cap, *n, sizeof **arr) != 0 ||
            st_index_put(ix, ck ? k + ST_CK_PREFIX_LEN : k, *n) != 0) {
            free(k);
            free(s);
            return st_fail(KILN_E_NOMEM, ps->err, ps->path, "out of memory parsing the header");
        }
        (*arr)[*n].key = k;
        (*arr)[*n].value = s;
        (*n)++;
    }
    return KILN_OK;
}

/* The whole header: one object of tensors and at most one __metadata__,
 * then nothing but whitespace (the padding). */
static int st_header(st_ps *ps) {
    /* a header that is not an object at all: said in the format's terms,
     * before jansson's more general words */
    size_t at = 0;
    while (at < ps->n && st_is_ws(ps->beg[at])) at++;
    if (at >= ps->n || ps->beg[at] != '{') {
        char fb[16];
        return st_fail(KILN_E_DATA, ps->err, ps->path,
                       "invalid header JSON at byte %zu of %zu: expected '{' opening the header object, found %s", at,
                       ps->n, st_found_at(ps, at, fb, sizeof fb));
    }
    json_error_t e;
    json_t *root = json_loadb((const char *)ps->beg, ps->n, JSON_REJECT_DUPLICATES, &e);
    if (!root) return st_json_error(ps, &e);
    int rc = KILN_OK;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        rc = !strcmp(key, "__metadata__") ? st_metadata(ps, v) : st_tensor(ps, key, v);
        if (rc) break;
    }
    json_decref(root);
    return rc;
}

static int st_cmp_offsets(const void *a, const void *b) {
    const st_rtensor *x = *(const st_rtensor *const *)a, *y = *(const st_rtensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* The tensors, sorted by offset, must tile [0, datalen) exactly, as the
 * reference reader demands: each one starts where the previous ended. */
static int st_check_coverage(safetensors_file *f, const char *path, uint64_t datalen, ht_error *err) {
    if (f->nt == 0) {
        if (datalen)
            return st_fail(KILN_E_DATA, err, path,
                           "%llu trailing bytes after the header, but the header lists no tensor",
                           (unsigned long long)datalen);
        return KILN_OK;
    }
    st_rtensor **ord = malloc((size_t)f->nt * sizeof *ord);
    if (!ord) return st_fail(KILN_E_NOMEM, err, path, "out of memory");
    for (int i = 0; i < f->nt; i++) ord[i] = &f->t[i];
    qsort(ord, (size_t)f->nt, sizeof *ord, st_cmp_offsets);
    uint64_t at = 0;
    const st_rtensor *prev = NULL;
    int rc = KILN_OK;
    char q1[128], q2[128];
    for (int i = 0; i < f->nt && !rc; i++) {
        const st_rtensor *t = ord[i];
        if (t->begin > at)
            rc = st_fail(KILN_E_DATA, err, path,
                         "gap in the data: no tensor covers bytes [%llu, %llu) before tensor '%s'",
                         (unsigned long long)at, (unsigned long long)t->begin, st_q(t->pub.name, q1, sizeof q1));
        else if (t->begin < at)
            rc = st_fail(KILN_E_DATA, err, path,
                         "tensor '%s' data_offsets [%llu, %llu] overlap tensor '%s' data_offsets [%llu, %llu]",
                         st_q(t->pub.name, q1, sizeof q1), (unsigned long long)t->begin, (unsigned long long)t->end,
                         st_q(prev->pub.name, q2, sizeof q2), (unsigned long long)prev->begin,
                         (unsigned long long)prev->end);
        at = t->end;
        prev = t;
    }
    if (!rc && at < datalen)
        rc = st_fail(KILN_E_DATA, err, path,
                     "%llu trailing bytes after the last tensor: the data is %llu bytes, the tensors cover %llu",
                     (unsigned long long)(datalen - at), (unsigned long long)datalen, (unsigned long long)at);
    free(ord);
    return rc;
}

/* 16 hex digits (either case) into v; -1 when the text is anything else. */
static int st_parse_hex64(const char *s, uint64_t *v) {
    uint64_t x = 0;
    int i = 0;
    for (; s[i]; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0 || i >= 16) return -1;
        x = x << 4 | (uint64_t)d;
    }
    if (i != 16) return -1;
    *v = x;
    return 0;
}

/* Every checksum names a tensor of the file and matches its bytes; and once
 * a file has checksums, every tensor has one (a damaged header could
 * otherwise drop a tensor's entry and with it the check). */
static int st_verify_checksums(safetensors_file *f, const char *path, ht_error *err) {
    if (f->nck == 0) return KILN_OK;
    char q[128];
    for (int i = 0; i < f->nck; i++) {
        const char *name = f->ck[i].key + ST_CK_PREFIX_LEN;
        int ti = st_index_get(&f->tix, name);
        if (ti < 0)
            return st_fail(KILN_E_DATA, err, path,
                           "__metadata__ has a checksum for tensor '%s', which the file does not hold: the header is "
                           "damaged",
                           st_q(name, q, sizeof q));
        uint64_t stored;
        if (st_parse_hex64(f->ck[i].value, &stored) != 0) {
            char qv[64];
            return st_fail(KILN_E_DATA, err, path,
                           "tensor '%s': checksum '%s' is not 16 hex digits (XXH3-64): the header is damaged",
                           st_q(name, q, sizeof q), st_q(f->ck[i].value, qv, sizeof qv));
        }
        const safetensors_tensor *t = &f->t[ti].pub;
        uint64_t got = XXH3_64bits(t->data, t->nbytes);
        if (got != stored)
            return st_fail(KILN_E_DATA, err, path,
                           "tensor '%s': checksum mismatch (stored %016llx, computed %016llx): the file is damaged",
                           st_q(name, q, sizeof q), (unsigned long long)stored, (unsigned long long)got);
    }
    if (f->nck != f->nt)
        for (int i = 0; i < f->nt; i++)
            if (st_index_get(&f->cix, f->t[i].pub.name) < 0)
                return st_fail(KILN_E_DATA, err, path,
                               "tensor '%s' has no checksum while %d other tensor(s) have one: the header is damaged",
                               st_q(f->t[i].pub.name, q, sizeof q), f->nck);
    return KILN_OK;
}

int safetensors_open(const char *path, safetensors_file **out, ht_error *err) {
    if (out) *out = NULL;
    if (!path || !out) return st_fail(KILN_E_INVALID_ARG, err, NULL, "safetensors_open: no path or no out pointer");
    safetensors_file *f = calloc(1, sizeof *f);
    if (!f) return st_fail(KILN_E_NOMEM, err, path, "out of memory");
    int rc = st_read_file(path, &f->buf, &f->size, err);
    if (rc) goto fail;
    if (f->size < 8) {
        rc = st_fail(KILN_E_DATA, err, path,
                     "file is %zu bytes, shorter than the 8-byte header length: truncated or not a safetensors file",
                     f->size);
        goto fail;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | f->buf[i];
    if (n > KST_MAX_HEADER_BYTES) {
        rc = st_fail(KILN_E_DATA, err, path,
                     "header length %llu exceeds the %llu-byte limit: corrupt or not a safetensors file",
                     (unsigned long long)n, (unsigned long long)KST_MAX_HEADER_BYTES);
        goto fail;
    }
    if (n > f->size - 8) {
        rc = st_fail(KILN_E_DATA, err, path,
                     "header length %llu exceeds the %zu bytes after the length word: truncated or corrupt file",
                     (unsigned long long)n, f->size - 8);
        goto fail;
    }
    st_ps ps = {.path = path,
                .beg = f->buf + 8,
                .n = (size_t)n,
                .datalen = f->size - 8 - n,
                .f = f,
                .err = err};
    if ((rc = st_header(&ps)) != 0) goto fail;
    if ((rc = st_check_coverage(f, path, ps.datalen, err)) != 0) goto fail;
    const unsigned char *data = f->buf + 8 + n;
    for (int i = 0; i < f->nt; i++) f->t[i].pub.data = data + f->t[i].begin;
    if ((rc = st_verify_checksums(f, path, err)) != 0) goto fail;
    *out = f;
    return KILN_OK;
fail:
    safetensors_close(f);
    return rc;
}
