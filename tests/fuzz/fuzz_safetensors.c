/*
 * tests/fuzz/fuzz_safetensors.c — fuzz target for kiln's checkpoint reader
 * (host/safetensors.c, safetensors_open). A checkpoint is data kiln did not make
 * itself: it may come from another machine, a download, a disk that lost
 * its tail. The input is the whole file. A refusal is fine; a crash, a
 * sanitizer report, a hang, or an accepted file whose tensors point outside
 * the bytes read, overlap, or cannot be found by their own name is a bug,
 * so an accepted file is walked completely: every tensor's bytes are read
 * (ASan checks the bounds), every name is looked up, every metadata entry
 * is read back. A second pass writes the accepted tensors again with the
 * writer and reads that file back: the writer must accept what the reader
 * accepted (names, dtypes, shapes, metadata) and reproduce it exactly.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "safetensors.h"

static void fz_check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_safetensors: invariant broken: %s\n", what);
        abort();
    }
}

/* The writer's output must read back as the same tensors and metadata. */
static void fz_roundtrip(const safetensors_file *f) {
    ht_error err = {0};
    safetensors_writer *w = safetensors_writer_new();
    if (!w) return;
    int n = safetensors_count(f);
    for (int i = 0; i < n; i++) {
        const safetensors_tensor *t = safetensors_get(f, i);
        int rc = safetensors_add_tensor(w, t->name, t->dtype, t->shape, t->ndim, t->data, t->nbytes, &err);
        fz_check(rc == KILN_OK, err.msg);
    }
    for (int i = 0; i < safetensors_metadata_count(f); i++) {
        const char *k, *v;
        safetensors_metadata_get(f, i, &k, &v);
        int rc = safetensors_add_metadata(w, k, v, &err);
        fz_check(rc == KILN_OK, err.msg);
    }
    /* written to the temporary directory: the writer renames into place */
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", fz_tmpdir());
    int rc = safetensors_write_atomic(w, path, &err);
    fz_check(rc == KILN_OK, err.msg);
    safetensors_file *g = NULL;
    rc = safetensors_open(path, &g, &err);
    fz_check(rc == KILN_OK, err.msg);
    fz_check(safetensors_count(g) == n && safetensors_metadata_count(g) == safetensors_metadata_count(f), "round trip changed the counts");
    for (int i = 0; i < n; i++) {
        const safetensors_tensor *a = safetensors_get(f, i), *b = safetensors_find(g, a->name);
        fz_check(b && !strcmp(a->dtype, b->dtype) && a->ndim == b->ndim && a->nbytes == b->nbytes &&
                     !memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->ndim) &&
                     (a->nbytes == 0 || !memcmp(a->data, b->data, a->nbytes)),
                 "round trip changed a tensor");
    }
    for (int i = 0; i < safetensors_metadata_count(f); i++) {
        const char *k, *v;
        safetensors_metadata_get(f, i, &k, &v);
        const char *v2 = safetensors_metadata(g, k);
        fz_check(v2 && !strcmp(v, v2), "round trip changed a metadata value");
    }
    safetensors_close(g);
    safetensors_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_memfile("ckpt", data, size);
    ht_error err = {0};
    safetensors_file *f = NULL;
    int rc = safetensors_open(path, &f, &err);
    if (rc != KILN_OK) {
        fz_check(f == NULL, "a refused file still returned a handle");
        fz_check(memchr(err.msg, '\n', strnlen(err.msg, sizeof err.msg)) == NULL, "a refusal message spans lines");
        return 0;
    }
    int n = safetensors_count(f);
    unsigned sum = 0;
    for (int i = 0; i < n; i++) {
        const safetensors_tensor *t = safetensors_get(f, i);
        fz_check(t && t->name && t->dtype, "safetensors_get returned an incomplete tensor");
        fz_check(t->ndim >= 0 && t->ndim <= KST_MAX_DIMS, "dimension count out of range");
        fz_check(safetensors_dtype_size(t->dtype) > 0, "accepted an unknown dtype");
        const unsigned char *d = t->data;
        if (t->nbytes) sum += d[0] + d[t->nbytes - 1]; /* ASan checks both ends */
        fz_check(safetensors_find(f, t->name) == t, "a tensor is not found under its own name");
    }
    fz_check(safetensors_get(f, n) == NULL && safetensors_get(f, -1) == NULL, "safetensors_get past the ends");
    for (int i = 0; i < safetensors_metadata_count(f); i++) {
        const char *k = NULL, *v = NULL;
        fz_check(safetensors_metadata_get(f, i, &k, &v) == 0 && k && v, "metadata entry missing");
        fz_check(safetensors_metadata(f, k) == v, "metadata key does not find its own value");
        sum += (unsigned)strlen(v);
    }
    /* the round trip writes a file: only for inputs of a sane size, and
     * without an empty tensor name, which the format allows (the reader
     * accepts it) but no kiln tensor has (the writer refuses it) */
    int empty_name = 0;
    for (int i = 0; i < n; i++) empty_name |= safetensors_get(f, i)->name[0] == 0;
    if (size < (1u << 16) && !empty_name) fz_roundtrip(f);
    safetensors_close(f);
    return (int)(sum & 0);
}
