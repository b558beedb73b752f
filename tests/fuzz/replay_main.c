/*
 * tests/fuzz/replay_main.c — the main() that turns a fuzz target into a
 * regression test where libFuzzer is not available (gcc builds, the ASan
 * build): every file named on the command line, or found (not recursively)
 * in a directory named there, is read and handed to LLVMFuzzerTestOneInput
 * once, in name order. A crash, a sanitizer report or an abort() in the
 * target fails the test, as it would fail the fuzzer; the count of inputs
 * replayed is printed so an empty corpus is visible in the log.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"

/* Weak: a target without LLVMFuzzerInitialize links too. */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int rp_one(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            unsigned char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", path);
        return -1;
    }
    /* an exact-size copy, so ASan sees a read one past the input's end */
    unsigned char *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int rp_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int count = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            bad++;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad += rp_one(argv[i]) != 0;
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            perror(argv[i]);
            bad++;
            continue;
        }
        char **names = NULL;
        size_t nn = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue; /* ., .., and .gitkeep-style markers */
            char **nb = realloc(names, (nn + 1) * sizeof *names);
            if (!nb) break;
            names = nb;
            names[nn++] = strdup(e->d_name);
        }
        closedir(d);
        qsort(names, nn, sizeof *names, rp_cmp);
        for (size_t j = 0; j < nn; j++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], names[j]);
            if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
                bad += rp_one(p) != 0;
                count++;
            }
            free(names[j]);
        }
        free(names);
    }
    printf("replayed %d input%s, %d unreadable\n", count, count == 1 ? "" : "s", bad);
    return bad ? 1 : 0;
}
