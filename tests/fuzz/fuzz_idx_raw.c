/*
 * tests/fuzz/fuzz_idx_raw.c — fuzz target for the IDX reader of the idx
 * data plugin (plugins/idx/idx_reader.c) on files as they are on disk: the
 * input is the whole file, read once as an image file and once as a label
 * file (a file that starts with the gzip magic takes the zlib path here
 * too; fuzz_idx_gzip builds valid gzip streams around its input to get
 * deeper into that path). Data files are not trusted: a refusal is fine, a
 * crash, a sanitizer report, an allocation far beyond the file's size or an
 * accepted file whose sizes disagree with what was read is a bug.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "idx_reader.h"

static void fz_check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_idx: invariant broken: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_memfile("idx", data, size);
    char err[512];
    uint8_t *px = NULL, *lab = NULL;
    uint32_t n = 0, r = 0, c = 0;
    int rc = idx_read_images(path, &px, &n, &r, &c, err, sizeof err);
    if (rc == IDX_OK) {
        uint64_t bytes = (uint64_t)n * r * c;
        fz_check(n > 0 && r > 0 && c > 0 && (uint64_t)r * c <= IDX_MAX_IMAGE_PIXELS, "accepted bad dimensions");
        /* a raw file holds exactly header + payload */
        if (!(size >= 2 && data[0] == 0x1f && data[1] == 0x8b)) fz_check(bytes + 16 == size, "raw size mismatch");
        volatile uint8_t s = px[0] ^ px[bytes - 1]; /* ASan checks both ends */
        (void)s;
        idx_free(px);
    } else {
        fz_check(rc < 0 && px == NULL, "a refusal returned pixels");
    }
    rc = idx_read_labels(path, &lab, &n, err, sizeof err);
    if (rc == IDX_OK) {
        fz_check(n > 0, "accepted zero labels");
        if (!(size >= 2 && data[0] == 0x1f && data[1] == 0x8b)) fz_check((uint64_t)n + 8 == size, "raw size mismatch");
        volatile uint8_t s = lab[0] ^ lab[n - 1];
        (void)s;
        rc = idx_check_labels(lab, n, 10, path, err, sizeof err);
        fz_check(rc == IDX_OK || rc == IDX_EINVAL, "idx_check_labels: unexpected status");
        idx_free(lab);
    }
    return 0;
}
