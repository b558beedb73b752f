/*
 * kiln-text2tokens: turns text into a byte-level llm.c token shard that the
 * "tokens" data plugin reads with format = "llmc" (vocab_size >= 256): every
 * input byte becomes one uint16 token, the files in the order given (stdin
 * when none is given or for "-"), with nothing inserted between them.
 *
 *   kiln-text2tokens -o out.bin in1.txt [in2.txt ...]
 *
 * The shard is written to a temporary file beside the output, its header
 * completed once the token count is known, synced, and renamed over the
 * output, so a reader never sees half a shard and a failure leaves any
 * earlier output untouched. Errors are one line on stderr; exit status 0 on
 * success, 1 on an error, 2 on bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tok_format.h"

#define PROG "kiln-text2tokens"
#define CHUNK 65536

static void usage(FILE *f) {
    fprintf(f,
            "usage: " PROG " -o OUT.bin [FILE ...]\n"
            "Writes an llm.c token shard (magic %d, version %d, uint16 tokens) holding every byte of the\n"
            "FILEs (stdin when none is given, or for \"-\") as one token, for kiln's `tokens` data plugin.\n",
            TOK_LLMC_MAGIC, TOK_LLMC_VERSION);
}

/* Writes all of buf; false with errno on failure. */
static bool write_all(int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Appends the bytes of `in` (named `name`) as tokens; false after printing an error. */
static bool convert(int in, const char *name, int out, const char *tmp, uint64_t *count) {
    static uint8_t buf[CHUNK];      /* (CHUNK) input bytes */
    static uint8_t tok[2 * CHUNK];  /* (CHUNK) uint16 LE tokens */
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, PROG ": cannot read %s: %s\n", name, strerror(errno));
            return false;
        }
        if (r == 0) return true;
        if (*count + (uint64_t)r > (uint64_t)TOK_LLMC_MAX_TOKENS) {
            fprintf(stderr, PROG ": more than %d bytes of input: an llm.c shard holds at most that many tokens "
                            "(split the text into several shards)\n",
                    TOK_LLMC_MAX_TOKENS);
            return false;
        }
        for (ssize_t i = 0; i < r; i++) {
            tok[2 * i] = buf[i];
            tok[2 * i + 1] = 0;
        }
        if (!write_all(out, tok, 2 * (size_t)r)) {
            fprintf(stderr, PROG ": cannot write %s: %s\n", tmp, strerror(errno));
            return false;
        }
        *count += (uint64_t)r;
    }
}

int main(int argc, char **argv) {
    const char *outp = NULL;
    int first = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o")) {
            if (i + 1 >= argc) {
                fprintf(stderr, PROG ": -o needs a file name\n");
                usage(stderr);
                return 2;
            }
            outp = argv[++i];
        } else if (!strcmp(argv[i], "--")) {
            first = i + 1;
            break;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, PROG ": unknown option %s\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            /* Inputs run to the end; options may come first only. */
            first = i;
            break;
        }
    }
    if (!outp || !outp[0]) {
        fprintf(stderr, PROG ": the output file is required (-o OUT.bin)\n");
        usage(stderr);
        return 2;
    }

    /* The temporary file lives in the output's folder, so rename() is atomic. */
    size_t lo = strlen(outp);
    char *tmp = malloc(lo + 16);
    if (!tmp) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    snprintf(tmp, lo + 16, "%s.tmp.XXXXXX", outp);
    int out = mkstemp(tmp);
    if (out < 0) {
        fprintf(stderr, PROG ": cannot create a temporary file beside %s: %s\n", outp, strerror(errno));
        free(tmp);
        return 1;
    }
    /* mkstemp makes 0600; give the shard the mode a plain creat() would. */
    mode_t um = umask(0);
    umask(um);
    (void)fchmod(out, 0666 & ~um);

    bool ok = true;
    uint8_t header[TOK_LLMC_HEADER_BYTES]; /* (256) int32 LE, count filled in at the end */
    memset(header, 0, sizeof header);
    ok = write_all(out, header, sizeof header);
    if (!ok) fprintf(stderr, PROG ": cannot write %s: %s\n", tmp, strerror(errno));
    uint64_t count = 0;
    int nfiles = 0;
    for (int i = first; ok && (i < argc || nfiles == 0); i++) {
        const char *name = i < argc ? argv[i] : "-";
        nfiles++;
        if (!strcmp(name, "-")) {
            ok = convert(STDIN_FILENO, "stdin", out, tmp, &count);
            continue;
        }
        int in = open(name, O_RDONLY | O_CLOEXEC);
        if (in < 0) {
            fprintf(stderr, PROG ": cannot open %s: %s\n", name, strerror(errno));
            ok = false;
            break;
        }
        struct stat st;
        if (fstat(in, &st) == 0 && S_ISDIR(st.st_mode)) {
            fprintf(stderr, PROG ": %s: expected a text file, found a directory\n", name);
            ok = false;
        } else {
            ok = convert(in, name, out, tmp, &count);
        }
        close(in);
    }
    if (ok && count == 0) {
        fprintf(stderr, PROG ": the input is empty: no tokens to write\n");
        ok = false;
    }
    if (ok) {
        dc_put_le32(header, (uint32_t)TOK_LLMC_MAGIC);
        dc_put_le32(header + 4, (uint32_t)TOK_LLMC_VERSION);
        dc_put_le32(header + 8, (uint32_t)count);
        if (lseek(out, 0, SEEK_SET) != 0 || !write_all(out, header, sizeof header) || fsync(out) != 0) {
            fprintf(stderr, PROG ": cannot write %s: %s\n", tmp, strerror(errno));
            ok = false;
        }
    }
    if (close(out) != 0 && ok) {
        fprintf(stderr, PROG ": cannot write %s: %s\n", tmp, strerror(errno));
        ok = false;
    }
    if (ok && rename(tmp, outp) != 0) {
        fprintf(stderr, PROG ": cannot rename %s to %s: %s\n", tmp, outp, strerror(errno));
        ok = false;
    }
    if (!ok) {
        unlink(tmp);
        free(tmp);
        return 1;
    }
    fprintf(stderr, PROG ": wrote %" PRIu64 " tokens from %d input(s) to %s\n", count, nfiles, outp);
    free(tmp);
    return 0;
}
