/*
 * tests/fuzz/fuzz_tokens.c — fuzz target for the token-shard reader of the
 * "tokens" data plugin (plugins/tokens/tok_data.c: llm.c shards and raw
 * text) and the window sampler on top of it (tok_sampler.c). Token files are
 * data, not trusted: a refusal is fine; a crash, a sanitizer report, or a
 * window whose tokens are not the file's tokens at that place is a bug.
 *
 * Input layout (little endian):
 *   byte 0: bit 0 text format (else llmc), bits 1-2 number of files - 1
 *           (1..3, at most 3), bit 3 shuffle, bit 4 drop_last
 *   byte 1: block size T - 1 (T in 1..64)
 *   bytes 2-3: vocab size (0 means 65536)
 *   byte 4: where the view starts, byte 5 where it ends (x/255 of the tokens)
 *   byte 6: batch size - 1 (1..8); byte 7: rank, byte 8: world size - 1
 *           (1..4; the rank taken modulo it); byte 9: first batch
 *   then each file but the last: a 2-byte length and that many bytes;
 *   the last file: the rest.
 * The windows are checked against an independent reading of the files:
 * the concatenated tokens, cut into streams at file boundaries for llmc
 * (windows never cross shards) or one stream for text.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "tok_data.h"
#include "tok_format.h"
#include "tok_sampler.h"

static void fz_check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_tokens: invariant broken: %s\n", what);
        abort();
    }
}

/* Every file's tokens read the obvious way, after the set accepted them. */
static int32_t *fz_flat(const tok_fileset *fs, uint64_t **starts) {
    int32_t *all = malloc((fs->total ? fs->total : 1) * sizeof *all);
    *starts = malloc((fs->nfiles + 1) * sizeof **starts);
    if (!all || !*starts) abort();
    uint64_t k = 0;
    for (uint32_t i = 0; i < fs->nfiles; i++) {
        (*starts)[i] = k;
        const tok_file *f = &fs->files[i];
        for (uint64_t j = 0; j < f->ntok; j++)
            all[k++] = fs->width == 2 ? (int32_t)(f->tokens[2 * j] | f->tokens[2 * j + 1] << 8) : f->tokens[j];
    }
    (*starts)[fs->nfiles] = k;
    fz_check(k == fs->total, "total differs from the files' token counts");
    return all;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 18)) return 0;
    fz_in in = {data, size};
    uint8_t ctl = fz_u8(&in);
    int text = ctl & 1, nfiles = 1 + ((ctl >> 1) & 3) % 3;
    uint32_t T = 1 + fz_u8(&in) % 64;
    uint32_t vocab = fz_u8(&in);
    vocab |= (uint32_t)fz_u8(&in) << 8;
    if (!vocab) vocab = 65536;
    uint8_t lo8 = fz_u8(&in), hi8 = fz_u8(&in);
    uint32_t B = 1 + fz_u8(&in) % 8, rank = fz_u8(&in), world = 1 + fz_u8(&in) % 4;
    uint8_t first = fz_u8(&in);
    rank %= world;
    for (int i = 0; i < nfiles; i++) {
        size_t len = in.n;
        if (i < nfiles - 1) {
            len = fz_u8(&in);
            len |= (size_t)fz_u8(&in) << 8;
            if (len > in.n) len = in.n;
        }
        char name[16];
        snprintf(name, sizeof name, "shard%d.bin", i);
        fz_tmpfile(name, in.p, len);
        in.p += len;
        in.n -= len;
    }
    /* files a previous input left: a fixed set of 3, emptied when unused */
    for (int i = nfiles; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "shard%d.bin", i);
        fz_tmpfile(name, "", 0);
    }
    char pattern[512], err[512];
    snprintf(pattern, sizeof pattern, "%s/shard*.bin", fz_tmpdir());
    tok_fileset fs;
    /* min_tokens as the plugin asks it: one window of T + 1 tokens per llmc shard */
    int rc = tok_fileset_open(&fs, pattern, NULL, "train", text ? TOK_FMT_TEXT : TOK_FMT_LLMC, text ? 0 : T + 1,
                              vocab, err, sizeof err);
    if (rc != TOK_OK) {
        fz_check(fs.nfiles == 0 && fs.files == NULL, "a refused set is not empty");
        tok_fileset_free(&fs);
        return 0;
    }
    uint64_t *starts;
    int32_t *all = fz_flat(&fs, &starts);
    if (!text)
        for (uint64_t i = 0; i < fs.total; i++) fz_check((uint32_t)all[i] < vocab, "a token at or past vocab");
    uint64_t lo = fs.total * lo8 / 255, hi = fs.total * hi8 / 255;
    if (lo > hi) { uint64_t t = lo; lo = hi; hi = t; }
    tok_view v;
    rc = tok_view_init(&v, &fs, lo, hi, T, err, sizeof err);
    fz_check(rc == TOK_OK, err);
    fz_check(v.ntok == hi - lo, "the view holds another number of tokens than asked");
    /* the independent enumeration of windows: streams of [lo, hi) */
    int32_t *in_t = malloc(T * sizeof *in_t), *tg_t = malloc(T * sizeof *tg_t);
    uint64_t w = 0;
    uint32_t nst = text ? 1 : fs.nfiles;
    for (uint32_t s = 0; s < nst; s++) {
        uint64_t a = text ? lo : starts[s], b = text ? hi : starts[s + 1];
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (b <= a) continue;
        uint64_t n = b - a, nwin = n > T ? (n - 1) / T : 0;
        for (uint64_t k = 0; k < nwin; k++, w++) {
            if (w >= 256) continue; /* enough windows checked; keep counting */
            tok_view_window(&v, w, in_t, tg_t);
            for (uint32_t t = 0; t < T; t++)
                fz_check(in_t[t] == all[a + k * T + t] && tg_t[t] == all[a + k * T + t + 1],
                         "a window differs from the files' tokens");
        }
    }
    fz_check(w == v.nwin, "the view counts another number of windows");
    free(in_t);
    free(tg_t);

    /* the sampler over the view, as the plugin drives it */
    tok_sampler S;
    memset(&S, 0, sizeof S);
    tok_sampler_config cfg = {.view = &v, .batch_size = B, .rank = rank, .world_size = world,
                              .shuffle = (ctl >> 3) & 1, .seed = ctl, .drop_last = (ctl >> 4) & 1};
    if (v.nwin <= UINT32_MAX && tok_sampler_init(&S, &cfg, err, sizeof err) == TOK_OK) {
        uint64_t start = S.num_batches ? first % (S.num_batches + 1) : 0;
        if (first == 255) start = S.num_batches + 1; /* past the end: must be refused */
        rc = tok_sampler_start_epoch(&S, lo8, start);
        fz_check(start <= S.num_batches ? rc == TOK_OK : rc == TOK_EINVAL, "start_epoch's bound");
        uint32_t len;
        for (int b = 0; rc == TOK_OK && b < 16 && tok_sampler_next(&S, &len) == 1; b++) {
            fz_check(len >= 1 && len <= B, "a batch of impossible length");
            for (uint32_t j = 0; j < len * T; j++)
                fz_check(S.inputs[j] >= 0 && (text || (uint32_t)S.inputs[j] < vocab), "a bad input token");
        }
    }
    tok_sampler_free(&S);
    tok_view_free(&v);
    free(all);
    free(starts);
    tok_fileset_free(&fs);
    return 0;
}
