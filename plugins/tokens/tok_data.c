/*
 * File sets and split views of the "tokens" plugin (see tok_data.h): glob,
 * open without blocking, check the file type before reading a byte, map
 * read-only, validate the llm.c header and every token once, and describe a
 * token range as pieces and streams that a window reader walks without
 * copying anything but the window itself.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_POPULATE */

#include "tok_data.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tok_format.h"

/* What a non-regular file is, for the message. */
static const char *tok_file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

static int tok_cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Validates a mapped llm.c shard; f->tokens/ntok are set on success. */
static int tok_check_llmc(tok_file *f, const char *what, uint64_t min_tokens, uint64_t vocab, char *err,
                          size_t errlen) {
    const uint8_t *p = f->map;
    size_t size = f->map_len;
    if (size < TOK_LLMC_HEADER_BYTES) {
        dc_errf(err, errlen,
                "%s shard %s: expected an llm.c token shard (a %d-byte header, then uint16 tokens), found a "
                "file of %zu bytes",
                what, f->path, TOK_LLMC_HEADER_BYTES, size);
        return TOK_EFORMAT;
    }
    int32_t magic = (int32_t)dc_get_le32(p), version = (int32_t)dc_get_le32(p + 4);
    int32_t count = (int32_t)dc_get_le32(p + 8);
    if (magic != TOK_LLMC_MAGIC) {
        dc_errf(err, errlen, "%s shard %s: expected the llm.c magic %d in header[0], found %" PRId32, what, f->path,
                TOK_LLMC_MAGIC, magic);
        return TOK_EFORMAT;
    }
    if (version != TOK_LLMC_VERSION) {
        dc_errf(err, errlen,
                "%s shard %s: expected version %d (uint16 tokens) in header[1], found %" PRId32 "%s", what,
                f->path, TOK_LLMC_VERSION, version, version == 2 ? " (llm.c's uint32 shards are not supported)" : "");
        return TOK_EFORMAT;
    }
    if (count < 0) {
        dc_errf(err, errlen, "%s shard %s: expected a token count >= 0 in header[2], found %" PRId32, what, f->path,
                count);
        return TOK_EFORMAT;
    }
    uint64_t body = (uint64_t)(size - TOK_LLMC_HEADER_BYTES), want = (uint64_t)count * TOK_LLMC_TOKEN_BYTES;
    if (body < want) {
        dc_errf(err, errlen,
                "%s shard %s: the header says %" PRId32 " tokens (%" PRIu64 " bytes after the header) but the "
                "file holds only %" PRIu64 " bytes after it (truncated?)",
                what, f->path, count, want, body);
        return TOK_EFORMAT;
    }
    if (body > want) {
        dc_errf(err, errlen,
                "%s shard %s: the header says %" PRId32 " tokens (%" PRIu64 " bytes after the header) but the "
                "file is longer: %" PRIu64 " extra bytes after the last token",
                what, f->path, count, want, body - want);
        return TOK_EFORMAT;
    }
    if ((uint64_t)count < min_tokens) {
        dc_errf(err, errlen,
                "%s shard %s: expected at least one window of block_size + 1 = %" PRIu64 " tokens, found %" PRId32
                " tokens",
                what, f->path, min_tokens, count);
        return TOK_EFORMAT;
    }
    const uint8_t *t = p + TOK_LLMC_HEADER_BYTES; /* (count) uint16 LE */
    if (vocab <= 0xFFFF) {
        for (uint64_t i = 0; i < (uint64_t)count; i++) {
            uint32_t v = (uint32_t)t[2 * i] | (uint32_t)t[2 * i + 1] << 8;
            if (v >= vocab) {
                dc_errf(err, errlen,
                        "%s shard %s: token %" PRIu64 " (of %" PRId32 ") is %" PRIu32
                        ", expected every token below vocab_size %" PRIu64,
                        what, f->path, i, count, v, vocab);
                return TOK_EFORMAT;
            }
        }
    }
    f->tokens = t;
    f->ntok = (uint64_t)count;
    return TOK_OK;
}

/* Opens, checks and maps one file. */
static int tok_open_file(tok_file *f, const char *what, int format, uint64_t min_tokens, uint64_t vocab, char *err,
                         size_t errlen) {
    /* O_NONBLOCK: opening a FIFO without a writer would otherwise wait for one. */
    int fd = open(f->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        dc_errf(err, errlen, "%s: cannot open %s: %s", what, f->path, strerror(errno));
        return TOK_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        dc_errf(err, errlen, "%s: cannot stat %s: %s", what, f->path, strerror(errno));
        close(fd);
        return TOK_EIO;
    }
    if (!S_ISREG(st.st_mode)) {
        dc_errf(err, errlen, "%s: %s: expected a regular file, found %s", what, f->path, tok_file_kind(st.st_mode));
        close(fd);
        return TOK_EIO;
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        dc_errf(err, errlen, "%s: %s: %" PRIu64 " bytes do not fit this address space", what, f->path,
                (uint64_t)st.st_size);
        close(fd);
        return TOK_EIO;
    }
    f->map_len = (size_t)st.st_size;
    if (f->map_len > 0) {
        /* MAP_POPULATE: every page is read at setup anyway (the llmc check
         * scans every token), so populating costs nothing more and the
         * steady-state steps take no page fault on the data (text files,
         * which are not scanned, would otherwise fault a page at a time) */
#ifdef MAP_POPULATE
        const int populate = MAP_POPULATE;
#else
        const int populate = 0;
#endif
        void *m = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE | populate, fd, 0);
        if (m == MAP_FAILED) {
            dc_errf(err, errlen, "%s: cannot map %s (%zu bytes): %s", what, f->path, f->map_len, strerror(errno));
            close(fd);
            f->map_len = 0;
            return TOK_EIO;
        }
        f->map = m;
    }
    close(fd); /* the mapping keeps the file */
    if (format == TOK_FMT_LLMC) return tok_check_llmc(f, what, min_tokens, vocab, err, errlen);
    f->tokens = f->map;
    f->ntok = f->map_len;
    return TOK_OK;
}

int tok_fileset_open(tok_fileset *fs, const char *pattern, const char *exclude, const char *what, int format,
                     uint64_t min_tokens, uint64_t vocab, char *err, size_t errlen) {
    memset(fs, 0, sizeof *fs);
    fs->format = format;
    fs->width = format == TOK_FMT_LLMC ? TOK_LLMC_TOKEN_BYTES : 1;
    glob_t g;
    memset(&g, 0, sizeof g);
    /* GLOB_NOSORT: sorted below with strcmp, independent of the locale's collation. */
    int grc = glob(pattern, GLOB_NOSORT, NULL, &g);
    if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        dc_errf(err, errlen, "%s: no file matches '%s'", what, pattern);
        return TOK_EIO;
    }
    if (grc != 0) {
        globfree(&g);
        dc_errf(err, errlen, "%s: cannot expand '%s' (%s)", what, pattern,
                grc == GLOB_NOSPACE ? "out of memory" : "read error");
        return grc == GLOB_NOSPACE ? TOK_ENOMEM : TOK_EIO;
    }
    if (g.gl_pathc > UINT32_MAX / 2) {
        globfree(&g);
        dc_errf(err, errlen, "%s: '%s' matches too many files", what, pattern);
        return TOK_EINVAL;
    }
    /* `exclude` drops matches by file name (fnmatch on the last path
     * component): the kept paths are swapped to the front, so globfree
     * still frees every one */
    size_t kept = g.gl_pathc;
    if (exclude && exclude[0]) {
        kept = 0;
        for (size_t i = 0; i < g.gl_pathc; i++) {
            const char *slash = strrchr(g.gl_pathv[i], '/');
            if (fnmatch(exclude, slash ? slash + 1 : g.gl_pathv[i], 0) == 0) continue;
            char *t = g.gl_pathv[kept];
            g.gl_pathv[kept++] = g.gl_pathv[i];
            g.gl_pathv[i] = t;
        }
        if (kept == 0) {
            globfree(&g);
            dc_errf(err, errlen, "%s: every file '%s' matches is excluded by '%s'", what, pattern, exclude);
            return TOK_EIO;
        }
    }
    qsort(g.gl_pathv, kept, sizeof *g.gl_pathv, tok_cmp_str);
    fs->files = calloc(kept, sizeof *fs->files);
    if (!fs->files) {
        globfree(&g);
        dc_errf(err, errlen, "%s: out of memory", what);
        return TOK_ENOMEM;
    }
    fs->nfiles = (uint32_t)kept;
    int rc = TOK_OK;
    for (uint32_t i = 0; i < fs->nfiles && rc == TOK_OK; i++) {
        fs->files[i].path = strdup(g.gl_pathv[i]);
        if (!fs->files[i].path) {
            dc_errf(err, errlen, "%s: out of memory", what);
            rc = TOK_ENOMEM;
            break;
        }
        rc = tok_open_file(&fs->files[i], what, format, min_tokens, vocab, err, errlen);
        if (rc == TOK_OK) fs->total += fs->files[i].ntok;
    }
    globfree(&g);
    if (rc != TOK_OK) tok_fileset_free(fs);
    return rc;
}

void tok_fileset_free(tok_fileset *fs) {
    if (!fs) return;
    for (uint32_t i = 0; i < fs->nfiles; i++) {
        if (fs->files[i].map) munmap(fs->files[i].map, fs->files[i].map_len);
        free(fs->files[i].path);
    }
    free(fs->files);
    memset(fs, 0, sizeof *fs);
}

/* ------------------------------------------------------------------------ */
/* Views */

int tok_view_init(tok_view *v, const tok_fileset *fs, uint64_t lo, uint64_t hi, uint32_t T, char *err,
                  size_t errlen) {
    memset(v, 0, sizeof *v);
    v->width = fs->width;
    v->T = T;
    if (T == 0 || lo > hi || hi > fs->total) {
        dc_errf(err, errlen, "internal: bad view [%" PRIu64 ", %" PRIu64 ") of %" PRIu64 " tokens, T %u", lo, hi,
                fs->total, T);
        return TOK_EINVAL;
    }
    /* At most one piece (and, for llmc, one stream) per file. */
    v->pieces = calloc(fs->nfiles ? fs->nfiles : 1, sizeof *v->pieces);
    v->streams = calloc(fs->nfiles ? fs->nfiles : 1, sizeof *v->streams);
    if (!v->pieces || !v->streams) {
        tok_view_free(v);
        dc_errf(err, errlen, "out of memory");
        return TOK_ENOMEM;
    }
    const bool per_file = fs->format == TOK_FMT_LLMC;
    uint64_t pos = 0; /* first token of file i in the concatenation */
    for (uint32_t i = 0; i < fs->nfiles; pos += fs->files[i].ntok, i++) {
        const tok_file *f = &fs->files[i];
        uint64_t a = lo > pos ? lo - pos : 0;                      /* the file's tokens [a, b) are in range */
        uint64_t b = hi < pos + f->ntok ? hi - pos : f->ntok;
        if (hi <= pos || lo >= pos + f->ntok || a >= b) continue;
        if (per_file || v->nstreams == 0) {
            tok_stream *s = &v->streams[v->nstreams++];
            s->first = v->npieces;
        }
        tok_stream *s = &v->streams[v->nstreams - 1];
        tok_piece *p = &v->pieces[v->npieces++];
        p->data = f->tokens + a * fs->width;
        p->ntok = b - a;
        p->off = s->ntok;
        s->npieces++;
        s->ntok += p->ntok;
        v->ntok += p->ntok;
    }
    for (uint32_t k = 0; k < v->nstreams; k++) {
        tok_stream *s = &v->streams[k];
        s->win0 = v->nwin;
        s->nwin = s->ntok > T ? (s->ntok - 1) / T : 0;
        v->nwin += s->nwin;
    }
    return TOK_OK;
}

void tok_view_free(tok_view *v) {
    if (!v) return;
    free(v->pieces);
    free(v->streams);
    memset(v, 0, sizeof *v);
}

static inline int32_t tok_at(const uint8_t *d, uint32_t width, uint64_t i) {
    return width == 2 ? (int32_t)((uint32_t)d[2 * i] | (uint32_t)d[2 * i + 1] << 8) : (int32_t)d[i];
}

void tok_view_window(const tok_view *v, uint64_t w, int32_t *in, int32_t *tg) {
    /* The stream: the last one whose win0 <= w. Streams without windows share win0 with the next one, so
     * the last such stream is the one whose windows [win0, win0 + nwin) hold w. */
    uint32_t lo = 0, hi = v->nstreams;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (v->streams[mid].win0 <= w) lo = mid;
        else hi = mid;
    }
    const tok_stream *s = &v->streams[lo];
    uint64_t pos = (w - s->win0) * v->T; /* first token of the window inside the stream */
    /* The piece holding pos. */
    uint32_t a = s->first, b = s->first + s->npieces;
    while (b - a > 1) {
        uint32_t mid = a + (b - a) / 2;
        if (v->pieces[mid].off <= pos) a = mid;
        else b = mid;
    }
    const tok_piece *p = &v->pieces[a];
    uint64_t i = pos - p->off;
    const uint32_t T = v->T;
    for (uint32_t t = 0; t <= T; t++) {
        while (i >= p->ntok) { /* the window runs on into the next file of the stream */
            p++;
            i = 0;
        }
        int32_t tok = tok_at(p->data, v->width, i++);
        if (t < T) in[t] = tok;
        if (t > 0) tg[t - 1] = tok;
    }
}
