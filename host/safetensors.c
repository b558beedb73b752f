/*
 * host/safetensors.c — see safetensors.h. The writer emits the header the
 * way the reference implementation (huggingface/safetensors, serde_json) does
 * — compact JSON, "__metadata__" first, then each tensor's dtype, shape and
 * data_offsets, padded with spaces to a multiple of 8 — so files compare
 * byte for byte with other writers' output and load anywhere. The reader
 * trusts nothing in the file: a small strict JSON parser covering just what
 * a header may hold (objects, arrays, strings with every escape, non-negative
 * integers) checks the syntax, then every tensor's dtype, shape, offsets and
 * size, and finally that the offsets tile the data with no gap, overlap or
 * trailing byte, mirroring the checks of the reference reader. Each failure
 * is one line naming the file and the broken rule.
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

size_t kst_dtype_size(const char *dtype) {
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

/* "<path>: <message>" into why; returns code so callers can `return`. */
__attribute__((format(printf, 5, 6))) static int st_fail(int code, char *why, size_t whylen, const char *path,
                                                        const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (path) hwhyf(why, whylen, "%s: %s", path, msg);
    else hwhyf(why, whylen, "%s", msg);
    return code;
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
 * A string -> index hash, so duplicate names are caught and kst_find answers
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

struct kst_writer {
    st_wtensor *t;
    int nt, capt;
    st_kv *m;
    int nm, capm;
    st_index tix, mix;
    uint64_t total; /* bytes of data so far: guards the offsets against overflow */
    int no_checksums; /* kst_writer_checksums(w, 0): the reference layout, byte for byte */
};

kst_writer *kst_writer_new(void) { return calloc(1, sizeof(kst_writer)); }

void kst_writer_checksums(kst_writer *w, int on) {
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

void kst_writer_free(kst_writer *w) {
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

int kst_add_tensor(kst_writer *w, const char *name, const char *dtype, const int64_t *shape, int ndim,
                   const void *data, size_t nbytes, char *why, size_t whylen) {
    char q[128], sh[256];
    if (!w || !name) return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "kst_add_tensor: no writer or no name");
    st_q(name, q, sizeof q);
    if (!*name) return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "kst_add_tensor: empty tensor name");
    if (st_utf8_check((const unsigned char *)name, strlen(name)) != strlen(name))
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "tensor name '%s' is not valid UTF-8", q);
    /* the reserved key would turn the tensor into (broken) metadata */
    if (!strcmp(name, "__metadata__"))
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "tensor name '__metadata__' is reserved by the format");
    const st_dtype *dt = st_dtype_find(dtype);
    if (!dt)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "tensor '%s': unknown dtype '%s'", q,
                       dtype ? dtype : "(null)");
    if (ndim < 0 || ndim > KST_MAX_DIMS)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "tensor '%s': %d dimensions, expected 0 to %d", q, ndim,
                       KST_MAX_DIMS);
    if (ndim > 0 && !shape)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "tensor '%s': no shape for %d dimensions", q, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "tensor '%s': shape[%d] is %lld, expected >= 0", q,
                           i, (long long)shape[i]);
    st_fmt_shape(shape, ndim, sh, sizeof sh);
    uint64_t need;
    if (st_nbytes(shape, ndim, dt->size, &need) != 0)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "tensor '%s': shape %s of %s overflows", q, sh,
                       dt->name);
    if (need != nbytes)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL,
                       "tensor '%s': %zu bytes given, but shape %s of %s needs %llu", q, nbytes, sh, dt->name,
                       (unsigned long long)need);
    if (nbytes && !data)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "tensor '%s': no data for %zu bytes", q, nbytes);
    if (w->total > UINT64_MAX - nbytes)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "tensor '%s': total data size overflows", q);
    if (st_index_get(&w->tix, name) >= 0)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "duplicate tensor name '%s'", q);

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
    return st_fail(KILN_E_NOMEM, why, whylen, NULL, "tensor '%s': out of memory", q);
}

int kst_add_metadata(kst_writer *w, const char *key, const char *value, char *why, size_t whylen) {
    char q[128];
    if (!w || !key || !value)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "kst_add_metadata: no writer, key or value");
    st_q(key, q, sizeof q);
    if (st_utf8_check((const unsigned char *)key, strlen(key)) != strlen(key))
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "metadata key '%s' is not valid UTF-8", q);
    if (st_utf8_check((const unsigned char *)value, strlen(value)) != strlen(value))
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "metadata value for key '%s' is not valid UTF-8", q);
    if (st_index_get(&w->mix, key) >= 0)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "duplicate metadata key '%s'", q);
    if (st_is_ck_key(key))
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL,
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
    return st_fail(KILN_E_NOMEM, why, whylen, NULL, "metadata key '%s': out of memory", q);
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
static void st_build_header(const kst_writer *w, st_buf *b) {
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

int kst_write_atomic(kst_writer *w, const char *path, char *why, size_t whylen) {
    if (!w || !path || !*path)
        return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "kst_write_atomic: no writer or no path");
    st_buf h = {0};
    st_build_header(w, &h);
    if (h.oom) {
        free(h.p);
        return st_fail(KILN_E_NOMEM, why, whylen, path, "out of memory building the header");
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    char *dir = malloc(plen + 2);
    if (!tmp || !dir) {
        free(h.p);
        free(tmp);
        free(dir);
        return st_fail(KILN_E_NOMEM, why, whylen, path, "out of memory");
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

    int rc = KILN_OK, err = 0, fd;
    /* O_EXCL|O_NOFOLLOW: never write through a planted link. A leftover of
     * our pid (a crashed earlier process) is ours to replace. */
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && unlink(tmp) == 0)
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = st_fail(KILN_E_IO, why, whylen, path, "cannot create the temporary file %s: %s", tmp, strerror(errno));
        goto out;
    }
    err = st_write_all(fd, h.p, h.n);
    for (int i = 0; !err && i < w->nt; i++)
        if (w->t[i].nbytes) err = st_write_all(fd, w->t[i].data, w->t[i].nbytes);
    if (err) {
        rc = st_fail(KILN_E_IO, why, whylen, path, "cannot write the temporary file %s: %s", tmp, strerror(err));
        close(fd);
        unlink(tmp);
        goto out;
    }
    /* the data must be on disk before the rename makes it the checkpoint,
     * or a crash could leave a renamed but empty file */
    if (fsync(fd) != 0) {
        rc = st_fail(KILN_E_IO, why, whylen, path, "cannot sync the temporary file %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    if (close(fd) != 0) {
        rc = st_fail(KILN_E_IO, why, whylen, path, "cannot close the temporary file %s: %s", tmp, strerror(errno));
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        rc = st_fail(KILN_E_IO, why, whylen, path, "cannot rename %s over it: %s", tmp, strerror(errno));
        unlink(tmp);
        goto out;
    }
    /* the rename itself lives in the directory: sync it so the new name
     * survives a crash. EINVAL: a filesystem that cannot sync directories. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL))
        rc = st_fail(KILN_E_IO, why, whylen, path,
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
    kst_tensor pub;
    uint64_t begin, end;
} st_rtensor;

struct kst_file {
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

void kst_close(kst_file *f) {
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

int kst_count(const kst_file *f) { return f ? f->nt : 0; }

const kst_tensor *kst_get(const kst_file *f, int i) {
    return f && i >= 0 && i < f->nt ? &f->t[i].pub : NULL;
}

const kst_tensor *kst_find(const kst_file *f, const char *name) {
    if (!f || !name) return NULL;
    int i = st_index_get(&f->tix, name);
    return i >= 0 ? &f->t[i].pub : NULL;
}

const char *kst_metadata(const kst_file *f, const char *key) {
    if (!f || !key) return NULL;
    int i = st_index_get(&f->mix, key);
    return i >= 0 ? f->m[i].value : NULL;
}

int kst_metadata_count(const kst_file *f) { return f ? f->nm : 0; }

int kst_checksum_count(const kst_file *f) { return f ? f->nck : 0; }

int kst_metadata_get(const kst_file *f, int i, const char **key, const char **value) {
    if (!f || i < 0 || i >= f->nm) return -1;
    if (key) *key = f->m[i].key;
    if (value) *value = f->m[i].value;
    return 0;
}

/* The whole file with read() (not mmap: a checkpoint rewritten under us
 * must not change the bytes we validated). */
static int st_read_file(const char *path, unsigned char **out, size_t *outlen, char *why, size_t whylen) {
    *out = NULL;
    *outlen = 0;
    /* O_NONBLOCK: a plain open() of a FIFO waits for a writer forever,
     * before fstat() could tell us what the path is. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return st_fail(KILN_E_IO, why, whylen, path, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return st_fail(KILN_E_IO, why, whylen, path, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return st_fail(KILN_E_IO, why, whylen, path, "expected a regular file, found %s", st_file_kind(st.st_mode));
    }
    /* ordinary blocking reads from here on */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return st_fail(KILN_E_IO, why, whylen, path, "cannot clear O_NONBLOCK: %s", strerror(e));
    }
    if ((uint64_t)st.st_size >= SIZE_MAX) {
        close(fd);
        return st_fail(KILN_E_NOMEM, why, whylen, path, "file too large to read (%lld bytes)", (long long)st.st_size);
    }
    /* one spare byte, so EOF is seen without a second allocation when the
     * size did not change */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return st_fail(KILN_E_NOMEM, why, whylen, path, "out of memory reading %zu bytes", cap - 1);
    }
    for (;;) {
        if (n == cap) {
            unsigned char *nb = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                close(fd);
                return st_fail(KILN_E_NOMEM, why, whylen, path, "out of memory reading the file");
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
            return st_fail(KILN_E_IO, why, whylen, path, "cannot read: %s", strerror(e));
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    close(fd);
    *out = buf;
    *outlen = n;
    return KILN_OK;
}

/* The header parser: a cursor over the N header bytes. */
typedef struct st_ps {
    const char *path;
    const unsigned char *beg, *p, *end;
    uint64_t datalen; /* bytes after the header */
    kst_file *f;
    char *why;
    size_t whylen;
} st_ps;

static void st_ws(st_ps *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

/* What the cursor is at, for "found ..." in a message. */
static const char *st_found(const st_ps *ps, char *buf, size_t len) {
    if (ps->p >= ps->end) return "the end of the header";
    unsigned c = *ps->p;
    if (c >= 0x20 && c < 0x7F) snprintf(buf, len, "'%c'", (char)c);
    else snprintf(buf, len, "byte 0x%02x", c);
    return buf;
}

/* A syntax error: where in the header, what was expected, what was found. */
static int st_jfail(st_ps *ps, const char *expected) {
    char fb[16];
    return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                   "invalid header JSON at byte %zu of %zu: expected %s, found %s", (size_t)(ps->p - ps->beg),
                   (size_t)(ps->end - ps->beg), expected, st_found(ps, fb, sizeof fb));
}

/* The kind of JSON value starting at the cursor, for "is a number, expected
 * a string"; NULL when no value can start here. */
static const char *st_kind(const st_ps *ps) {
    if (ps->p >= ps->end) return NULL;
    switch (*ps->p) {
    case '{': return "an object";
    case '[': return "an array";
    case '"': return "a string";
    case 't': case 'f': return "a boolean";
    case 'n': return "null";
    case '-': return "a number";
    default: return *ps->p >= '0' && *ps->p <= '9' ? "a number" : NULL;
    }
}

static int st_expect(st_ps *ps, char c, const char *what) {
    st_ws(ps);
    if (ps->p >= ps->end || *ps->p != (unsigned char)c) return st_jfail(ps, what);
    ps->p++;
    return KILN_OK;
}

static int st_hex4(const unsigned char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

static size_t st_utf8_put(unsigned cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A JSON string at the cursor, decoded to UTF-8 in a new NUL-terminated
 * buffer. Strings holding U+0000 are refused: every name and value is
 * handed out as a C string, and a NUL would silently cut it short. */
static int st_jstring(st_ps *ps, char **out) {
    *out = NULL;
    st_ws(ps);
    if (ps->p >= ps->end || *ps->p != '"') return st_jfail(ps, "a string");
    const unsigned char *start = ps->p;
    ps->p++;
    /* escapes only shrink, so the raw length bounds the decoded one */
    const unsigned char *q = ps->p;
    while (q < ps->end && *q != '"') q += (*q == '\\' && ps->end - q > 1) ? 2 : 1;
    if (q >= ps->end) {
        ps->p = start;
        return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                       "invalid header JSON at byte %zu of %zu: unterminated string", (size_t)(start - ps->beg),
                       (size_t)(ps->end - ps->beg));
    }
    char *s = malloc((size_t)(q - ps->p) + 1);
    if (!s) return st_fail(KILN_E_NOMEM, ps->why, ps->whylen, ps->path, "out of memory parsing the header");
    size_t o = 0;
    for (;;) {
        unsigned c = *ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) {
            free(s);
            return st_jfail(ps, "no control character in a string (it must be escaped)");
        }
        if (c == '\\') {
            ps->p++;
            unsigned e = *ps->p, cp;
            switch (e) {
            case '"': s[o++] = '"'; ps->p++; continue;
            case '\\': s[o++] = '\\'; ps->p++; continue;
            case '/': s[o++] = '/'; ps->p++; continue;
            case 'b': s[o++] = '\b'; ps->p++; continue;
            case 'f': s[o++] = '\f'; ps->p++; continue;
            case 'n': s[o++] = '\n'; ps->p++; continue;
            case 'r': s[o++] = '\r'; ps->p++; continue;
            case 't': s[o++] = '\t'; ps->p++; continue;
            case 'u': break;
            default: free(s); return st_jfail(ps, "an escape (one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
            }
            if (ps->end - ps->p < 5 || st_hex4(ps->p + 1, &cp) != 0) {
                free(s);
                return st_jfail(ps, "4 hex digits after \\u");
            }
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(s);
                return st_jfail(ps, "a high surrogate before the low surrogate \\u escape");
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                /* a code point past U+FFFF: must be a pair \uD8xx\uDCxx */
                unsigned lo;
                if (ps->end - ps->p < 11 || ps->p[5] != '\\' || ps->p[6] != 'u' || st_hex4(ps->p + 7, &lo) != 0 ||
                    lo < 0xDC00 || lo > 0xDFFF) {
                    ps->p += 5;
                    free(s);
                    return st_jfail(ps, "a \\u low surrogate after a high surrogate");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                ps->p += 6;
            }
            if (cp == 0) {
                free(s);
                return st_jfail(ps, "no U+0000 in a string (names and values are C strings)");
            }
            ps->p += 5;
            o += st_utf8_put(cp, s + o);
            continue;
        }
        if (c >= 0x80) {
            size_t len = ps->end - ps->p > 4 ? 4 : (size_t)(ps->end - ps->p);
            /* 0 only when the sequence at the cursor itself is invalid; a
             * later one cut by the 4-byte window gives a larger offset */
            size_t seq = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (st_utf8_check(ps->p, len) == 0) {
                free(s);
                return st_jfail(ps, "valid UTF-8");
            }
            memcpy(s + o, ps->p, seq);
            o += seq;
            ps->p += seq;
            continue;
        }
        s[o++] = (char)c;
        ps->p++;
    }
    s[o] = 0;
    *out = s;
    return KILN_OK;
}

/* A JSON number at the cursor. Syntax errors fail here; otherwise *kind
 * says what the value is: 0 a non-negative integer in *v, 1 negative, 2 not
 * an integer (fraction or exponent), 3 too large for 64 bits. */
static int st_jnumber(st_ps *ps, uint64_t *v, int *kind) {
    st_ws(ps);
    int neg = 0, big = 0, frac = 0;
    uint64_t x = 0;
    if (ps->p < ps->end && *ps->p == '-') { neg = 1; ps->p++; }
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return st_jfail(ps, "a digit");
    if (*ps->p == '0') {
        ps->p++;
        if (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') return st_jfail(ps, "no leading zero in a number");
    } else {
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
            unsigned d = *ps->p++ - '0';
            if (x > (UINT64_MAX - d) / 10) big = 1;
            else x = x * 10 + d;
        }
    }
    if (ps->p < ps->end && *ps->p == '.') {
        frac = 1;
        ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return st_jfail(ps, "a digit after '.'");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        frac = 1;
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return st_jfail(ps, "a digit in the exponent");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    *v = x;
    *kind = neg ? 1 : frac ? 2 : big ? 3 : 0;
    return KILN_OK;
}

/* An array of non-negative integers (a shape or data_offsets) for tensor
 * q's field; at most max elements, each at most lim. */
static int st_juint_array(st_ps *ps, const char *q, const char *field, uint64_t *vals, int max, uint64_t lim,
                          int *n) {
    static const char *const why_bad[] = {"", "negative", "not an integer", "too large"};
    st_ws(ps);
    const char *k = st_kind(ps);
    if (!k) return st_jfail(ps, "a value");
    if (*ps->p != '[')
        return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path, "tensor '%s' %s is %s, expected an array", q,
                       field, k);
    ps->p++;
    *n = 0;
    st_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
        return KILN_OK;
    }
    for (;;) {
        st_ws(ps);
        k = st_kind(ps);
        if (!k) return st_jfail(ps, "a value");
        if (strcmp(k, "a number") != 0)
            return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                           "tensor '%s' %s[%d] is %s, expected a non-negative integer", q, field, *n, k);
        uint64_t v = 0;
        int kind = 0, rc = st_jnumber(ps, &v, &kind);
        if (rc) return rc;
        if (kind == 0 && v > lim) kind = 3;
        if (kind)
            return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                           "tensor '%s' %s[%d] is %s, expected a non-negative integer", q, field, *n, why_bad[kind]);
        if (*n == max)
            return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path, "tensor '%s' %s has more than %d elements", q,
                           field, max);
        vals[(*n)++] = v;
        st_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == ']') { ps->p++; return KILN_OK; }
        return st_jfail(ps, "',' or ']' in an array");
    }
}

/* One tensor entry {"dtype":..,"shape":[..],"data_offsets":[b,e]}; takes
 * ownership of name. */
static int st_jtensor(st_ps *ps, char *name) {
    kst_file *f = ps->f;
    char q[128], sh[256];
    st_q(name, q, sizeof q);
    int rc = st_grow((void **)&f->t, &f->capt, f->nt, sizeof *f->t);
    if (rc) {
        free(name);
        return st_fail(KILN_E_NOMEM, ps->why, ps->whylen, ps->path, "out of memory parsing the header");
    }
    /* owned by f from here on, so kst_close frees it on any failure */
    st_rtensor *t = &f->t[f->nt++];
    memset(t, 0, sizeof *t);
    t->pub.name = name;

    st_ws(ps);
    const char *k = st_kind(ps);
    if (!k) return st_jfail(ps, "a value");
    if (*ps->p != '{')
        return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path, "tensor '%s' is %s, expected an object", q, k);
    ps->p++;
    enum { HAVE_DTYPE = 1, HAVE_SHAPE = 2, HAVE_OFFSETS = 4 };
    int have = 0;
    const st_dtype *dt = NULL;
    uint64_t shape[KST_MAX_DIMS] = {0}, offs[2] = {0, 0};
    int ndim = 0, noffs = 0;
    st_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') ps->p++;
    else {
        for (;;) {
            char *key;
            if ((rc = st_jstring(ps, &key)) != 0) return rc;
            if ((rc = st_expect(ps, ':', "':' after an object key")) != 0) { free(key); return rc; }
            int bit = !strcmp(key, "dtype") ? HAVE_DTYPE : !strcmp(key, "shape") ? HAVE_SHAPE
                      : !strcmp(key, "data_offsets") ? HAVE_OFFSETS : 0;
            if (!bit) {
                char kq[128];
                rc = st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                             "tensor '%s' has an unknown key '%s' (expected dtype, shape, data_offsets)", q,
                             st_q(key, kq, sizeof kq));
                free(key);
                return rc;
            }
            if (have & bit) {
                rc = st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path, "tensor '%s' has a duplicate key '%s'", q,
                             key);
                free(key);
                return rc;
            }
            free(key);
            have |= bit;
            if (bit == HAVE_DTYPE) {
                st_ws(ps);
                k = st_kind(ps);
                if (!k) return st_jfail(ps, "a value");
                if (*ps->p != '"')
                    return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                                   "tensor '%s' dtype is %s, expected a string", q, k);
                char *d;
                if ((rc = st_jstring(ps, &d)) != 0) return rc;
                dt = st_dtype_find(d);
                if (!dt) {
                    char dq[64];
                    rc = st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                                 "tensor '%s' has unknown dtype '%s' (expected one of BOOL, U8, I8, F8_E5M2, F8_E4M3, "
                                 "F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64)",
                                 q, st_q(d, dq, sizeof dq));
                    free(d);
                    return rc;
                }
                free(d);
            } else if (bit == HAVE_SHAPE) {
                if ((rc = st_juint_array(ps, q, "shape", shape, KST_MAX_DIMS, (uint64_t)INT64_MAX, &ndim)) != 0)
                    return rc;
            } else {
                if ((rc = st_juint_array(ps, q, "data_offsets", offs, 2, UINT64_MAX, &noffs)) != 0) return rc;
                if (noffs != 2)
                    return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                                   "tensor '%s' data_offsets has %d elements, expected 2 [begin, end]", q, noffs);
            }
            st_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
            if (ps->p < ps->end && *ps->p == '}') { ps->p++; break; }
            return st_jfail(ps, "',' or '}' in an object");
        }
    }
    static const char *const names[] = {"dtype", "shape", "", "data_offsets"};
    for (int bit = 1; bit <= 4; bit <<= 1)
        if (!(have & bit))
            return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path, "tensor '%s' has no %s", q, names[bit - 1]);

    t->pub.dtype = dt->name;
    t->pub.ndim = ndim;
    for (int i = 0; i < ndim; i++) t->pub.shape[i] = (int64_t)shape[i];
    st_fmt_shape(t->pub.shape, ndim, sh, sizeof sh);
    t->begin = offs[0];
    t->end = offs[1];
    uint64_t need;
    if (st_nbytes(t->pub.shape, ndim, dt->size, &need) != 0)
        return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path, "tensor '%s' shape %s of %s overflows", q, sh,
                       dt->name);
    if (t->end < t->begin)
        return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                       "tensor '%s' data_offsets [%llu, %llu] end before they begin", q,
                       (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > ps->datalen)
        return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                       "tensor '%s' data_offsets [%llu, %llu] exceed the data (%llu bytes): truncated or corrupt file",
                       q, (unsigned long long)t->begin, (unsigned long long)t->end,
                       (unsigned long long)ps->datalen);
    if (t->end - t->begin != need)
        return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                       "tensor '%s' data_offsets [%llu, %llu] hold %llu bytes, but shape %s of %s needs %llu", q,
                       (unsigned long long)t->begin, (unsigned long long)t->end,
                       (unsigned long long)(t->end - t->begin), sh, dt->name, (unsigned long long)need);
    t->pub.nbytes = (size_t)need;
    if (st_index_put(&f->tix, t->pub.name, f->nt - 1) != 0)
        return st_fail(KILN_E_NOMEM, ps->why, ps->whylen, ps->path, "out of memory parsing the header");
    return KILN_OK;
}

/* "__metadata__": an object of string values. */
static int st_jmetadata(st_ps *ps) {
    kst_file *f = ps->f;
    int rc;
    st_ws(ps);
    const char *k = st_kind(ps);
    if (!k) return st_jfail(ps, "a value");
    if (*ps->p != '{')
        return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path, "__metadata__ is %s, expected an object of strings",
                       k);
    ps->p++;
    st_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return KILN_OK;
    }
    for (;;) {
        char *key, *val, q[128];
        if ((rc = st_jstring(ps, &key)) != 0) return rc;
        st_q(key, q, sizeof q);
        if ((rc = st_expect(ps, ':', "':' after an object key")) != 0) { free(key); return rc; }
        st_ws(ps);
        k = st_kind(ps);
        if (!k) { free(key); return st_jfail(ps, "a value"); }
        if (*ps->p != '"') {
            free(key);
            return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path,
                           "__metadata__ value for key '%s' is %s, expected a string", q, k);
        }
        if ((rc = st_jstring(ps, &val)) != 0) { free(key); return rc; }
        /* checksums go to their own table, keyed by the tensor name */
        int ck = st_is_ck_key(key);
        st_kv **arr = ck ? &f->ck : &f->m;
        int *n = ck ? &f->nck : &f->nm, *cap = ck ? &f->capck : &f->capm;
        st_index *ix = ck ? &f->cix : &f->mix;
        const char *ixkey = ck ? key + ST_CK_PREFIX_LEN : key;
        if (st_index_get(ix, ixkey) >= 0) {
            free(key);
            free(val);
            return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path, "duplicate __metadata__ key '%s'", q);
        }
        if (st_grow((void **)arr, cap, *n, sizeof **arr) != 0 || st_index_put(ix, ixkey, *n) != 0) {
            free(key);
            free(val);
            return st_fail(KILN_E_NOMEM, ps->why, ps->whylen, ps->path, "out of memory parsing the header");
        }
        (*arr)[*n].key = key;
        (*arr)[*n].value = val;
        (*n)++;
        st_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == '}') { ps->p++; return KILN_OK; }
        return st_jfail(ps, "',' or '}' in an object");
    }
}

/* The whole header: one object of tensors and at most one __metadata__,
 * then nothing but whitespace (the padding). */
static int st_jheader(st_ps *ps) {
    int rc, seen_meta = 0;
    if ((rc = st_expect(ps, '{', "'{' opening the header object")) != 0) return rc;
    st_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') ps->p++;
    else {
        for (;;) {
            char *key, q[128];
            if ((rc = st_jstring(ps, &key)) != 0) return rc;
            if ((rc = st_expect(ps, ':', "':' after an object key")) != 0) { free(key); return rc; }
            if (!strcmp(key, "__metadata__")) {
                free(key);
                if (seen_meta)
                    return st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path, "duplicate __metadata__ object");
                seen_meta = 1;
                if ((rc = st_jmetadata(ps)) != 0) return rc;
            } else {
                if (st_index_get(&ps->f->tix, key) >= 0) {
                    rc = st_fail(KILN_E_DATA, ps->why, ps->whylen, ps->path, "duplicate tensor name '%s'",
                                 st_q(key, q, sizeof q));
                    free(key);
                    return rc;
                }
                if ((rc = st_jtensor(ps, key)) != 0) return rc;
            }
            st_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
            if (ps->p < ps->end && *ps->p == '}') { ps->p++; break; }
            return st_jfail(ps, "',' or '}' in an object");
        }
    }
    st_ws(ps);
    if (ps->p != ps->end) return st_jfail(ps, "only padding spaces after the header object");
    return KILN_OK;
}

static int st_cmp_offsets(const void *a, const void *b) {
    const st_rtensor *x = *(const st_rtensor *const *)a, *y = *(const st_rtensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* The tensors, sorted by offset, must tile [0, datalen) exactly, as the
 * reference reader demands: each one starts where the previous ended. */
static int st_check_coverage(kst_file *f, const char *path, uint64_t datalen, char *why, size_t whylen) {
    if (f->nt == 0) {
        if (datalen)
            return st_fail(KILN_E_DATA, why, whylen, path,
                           "%llu trailing bytes after the header, but the header lists no tensor",
                           (unsigned long long)datalen);
        return KILN_OK;
    }
    st_rtensor **ord = malloc((size_t)f->nt * sizeof *ord);
    if (!ord) return st_fail(KILN_E_NOMEM, why, whylen, path, "out of memory");
    for (int i = 0; i < f->nt; i++) ord[i] = &f->t[i];
    qsort(ord, (size_t)f->nt, sizeof *ord, st_cmp_offsets);
    uint64_t at = 0;
    const st_rtensor *prev = NULL;
    int rc = KILN_OK;
    char q1[128], q2[128];
    for (int i = 0; i < f->nt && !rc; i++) {
        const st_rtensor *t = ord[i];
        if (t->begin > at)
            rc = st_fail(KILN_E_DATA, why, whylen, path,
                         "gap in the data: no tensor covers bytes [%llu, %llu) before tensor '%s'",
                         (unsigned long long)at, (unsigned long long)t->begin, st_q(t->pub.name, q1, sizeof q1));
        else if (t->begin < at)
            rc = st_fail(KILN_E_DATA, why, whylen, path,
                         "tensor '%s' data_offsets [%llu, %llu] overlap tensor '%s' data_offsets [%llu, %llu]",
                         st_q(t->pub.name, q1, sizeof q1), (unsigned long long)t->begin, (unsigned long long)t->end,
                         st_q(prev->pub.name, q2, sizeof q2), (unsigned long long)prev->begin,
                         (unsigned long long)prev->end);
        at = t->end;
        prev = t;
    }
    if (!rc && at < datalen)
        rc = st_fail(KILN_E_DATA, why, whylen, path,
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
static int st_verify_checksums(kst_file *f, const char *path, char *why, size_t whylen) {
    if (f->nck == 0) return KILN_OK;
    char q[128];
    for (int i = 0; i < f->nck; i++) {
        const char *name = f->ck[i].key + ST_CK_PREFIX_LEN;
        int ti = st_index_get(&f->tix, name);
        if (ti < 0)
            return st_fail(KILN_E_DATA, why, whylen, path,
                           "__metadata__ has a checksum for tensor '%s', which the file does not hold: the header is "
                           "damaged",
                           st_q(name, q, sizeof q));
        uint64_t stored;
        if (st_parse_hex64(f->ck[i].value, &stored) != 0) {
            char qv[64];
            return st_fail(KILN_E_DATA, why, whylen, path,
                           "tensor '%s': checksum '%s' is not 16 hex digits (XXH3-64): the header is damaged",
                           st_q(name, q, sizeof q), st_q(f->ck[i].value, qv, sizeof qv));
        }
        const kst_tensor *t = &f->t[ti].pub;
        uint64_t got = XXH3_64bits(t->data, t->nbytes);
        if (got != stored)
            return st_fail(KILN_E_DATA, why, whylen, path,
                           "tensor '%s': checksum mismatch (stored %016llx, computed %016llx): the file is damaged",
                           st_q(name, q, sizeof q), (unsigned long long)stored, (unsigned long long)got);
    }
    if (f->nck != f->nt)
        for (int i = 0; i < f->nt; i++)
            if (st_index_get(&f->cix, f->t[i].pub.name) < 0)
                return st_fail(KILN_E_DATA, why, whylen, path,
                               "tensor '%s' has no checksum while %d other tensor(s) have one: the header is damaged",
                               st_q(f->t[i].pub.name, q, sizeof q), f->nck);
    return KILN_OK;
}

int kst_open(const char *path, kst_file **out, char *why, size_t whylen) {
    if (out) *out = NULL;
    if (!path || !out) return st_fail(KILN_E_INVALID_ARG, why, whylen, NULL, "kst_open: no path or no out pointer");
    kst_file *f = calloc(1, sizeof *f);
    if (!f) return st_fail(KILN_E_NOMEM, why, whylen, path, "out of memory");
    int rc = st_read_file(path, &f->buf, &f->size, why, whylen);
    if (rc) goto fail;
    if (f->size < 8) {
        rc = st_fail(KILN_E_DATA, why, whylen, path,
                     "file is %zu bytes, shorter than the 8-byte header length: truncated or not a safetensors file",
                     f->size);
        goto fail;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | f->buf[i];
    if (n > KST_MAX_HEADER_BYTES) {
        rc = st_fail(KILN_E_DATA, why, whylen, path,
                     "header length %llu exceeds the %llu-byte limit: corrupt or not a safetensors file",
                     (unsigned long long)n, (unsigned long long)KST_MAX_HEADER_BYTES);
        goto fail;
    }
    if (n > f->size - 8) {
        rc = st_fail(KILN_E_DATA, why, whylen, path,
                     "header length %llu exceeds the %zu bytes after the length word: truncated or corrupt file",
                     (unsigned long long)n, f->size - 8);
        goto fail;
    }
    st_ps ps = {.path = path,
                .beg = f->buf + 8,
                .p = f->buf + 8,
                .end = f->buf + 8 + n,
                .datalen = f->size - 8 - n,
                .f = f,
                .why = why,
                .whylen = whylen};
    if ((rc = st_jheader(&ps)) != 0) goto fail;
    if ((rc = st_check_coverage(f, path, ps.datalen, why, whylen)) != 0) goto fail;
    const unsigned char *data = f->buf + 8 + n;
    for (int i = 0; i < f->nt; i++) f->t[i].pub.data = data + f->t[i].begin;
    if ((rc = st_verify_checksums(f, path, why, whylen)) != 0) goto fail;
    *out = f;
    return KILN_OK;
fail:
    kst_close(f);
    return rc;
}
