/*
 * The token data of the "tokens" plugin, below batching: a file set (the
 * files one glob pattern matches, sorted by name, each mapped read-only and
 * validated once) and a split view over a token range of that set (which
 * pieces of which files hold its tokens, cut into "streams" that windows
 * never cross). Nothing is copied: views point into the mappings, and a
 * window's T+1 tokens are read straight from them into a batch.
 *
 * Formats: llm.c shards (tok_format.h: uint16 tokens; every shard is its own
 * stream, as llm.c's loader never lets a window cross shards) and raw text
 * (every byte a token; all files of a set run together as one stream).
 */
#ifndef KILN_PLUGINS_TOK_DATA_H
#define KILN_PLUGINS_TOK_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Status codes of this layer (the plugin maps them to kiln statuses). */
enum {
    TOK_OK = 0,
    TOK_EIO = -1,     /* no file matches, cannot open/map, not a regular file */
    TOK_EFORMAT = -2, /* a file's content is not what the format promises     */
    TOK_ENOMEM = -3,
    TOK_EINVAL = -4,  /* a value the configuration chose does not fit the data */
};

enum { TOK_FMT_LLMC = 0, TOK_FMT_TEXT = 1 };

typedef struct tok_file {
    char *path;            /* as glob returned it */
    void *map;             /* the whole file, PROT_READ; NULL for an empty file */
    size_t map_len;
    const uint8_t *tokens; /* first token inside map (after the header for llmc) */
    uint64_t ntok;
} tok_file;

typedef struct tok_fileset {
    int format;        /* TOK_FMT_* */
    uint32_t width;    /* bytes per token: 2 (llmc) or 1 (text) */
    tok_file *files;   /* (nfiles), sorted by path with strcmp */
    uint32_t nfiles;
    uint64_t total;    /* tokens over all files */
} tok_fileset;

/*
 * Opens every file `pattern` matches (glob(3)) whose name (last path
 * component) does not match `exclude` (fnmatch(3); NULL or "": none), in
 * strcmp order, and
 * validates it for `format`: a regular file (opened O_NONBLOCK and checked
 * with fstat before any read, so a FIFO cannot hang), and for llmc the magic,
 * version, a token count that matches the file size exactly, every token
 * below `vocab`, and at least `min_tokens` tokens per shard. `what` names the
 * key in messages ("train"). On failure err holds one line naming the file
 * and fs is left empty (tok_fileset_free is still safe).
 */
int tok_fileset_open(tok_fileset *fs, const char *pattern, const char *exclude, const char *what, int format,
                     uint64_t min_tokens, uint64_t vocab, char *err, size_t errlen);

void tok_fileset_free(tok_fileset *fs);

/* A run of consecutive tokens of one file. */
typedef struct tok_piece {
    const uint8_t *data; /* first token of the run */
    uint64_t ntok;
    uint64_t off;        /* offset of the run's first token inside its stream */
} tok_piece;

/* A sequence windows stay inside: one shard (llmc) or all the text. */
typedef struct tok_stream {
    uint32_t first, npieces; /* pieces [first, first + npieces) of the view */
    uint64_t ntok;
    uint64_t win0;           /* windows of the streams before this one */
    uint64_t nwin;           /* (ntok - 1) / T when ntok > T, else 0 */
} tok_stream;

typedef struct tok_view {
    uint32_t width;       /* bytes per token */
    uint32_t T;           /* block size: a window is T+1 tokens, windows start every T */
    tok_piece *pieces;    /* (npieces) */
    uint32_t npieces;
    tok_stream *streams;  /* (nstreams) */
    uint32_t nstreams;
    uint64_t ntok;        /* tokens in the view */
    uint64_t nwin;        /* windows in the view */
} tok_view;

/*
 * The view of tokens [lo, hi) of the set's concatenation (files in order),
 * with block size T. llmc: one stream per file part; text: one stream.
 * A file cut at lo or hi contributes its part only.
 */
int tok_view_init(tok_view *v, const tok_fileset *fs, uint64_t lo, uint64_t hi, uint32_t T, char *err,
                  size_t errlen);

void tok_view_free(tok_view *v);

/*
 * Window w (< v->nwin): its T+1 tokens as in = tokens[0..T), tg = tokens[1..T]
 * (both (T) int32).
 */
void tok_view_window(const tok_view *v, uint64_t w, int32_t *in, int32_t *tg);

#endif
