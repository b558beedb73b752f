/*
 * tests/fuzz/fuzz_util.h — what every kiln fuzz target shares: the libFuzzer
 * entry points' prototypes (the replay driver calls the same two), and a
 * place to put the fuzzer's bytes where kiln's readers expect a file. The
 * readers take paths and insist on regular files (a FIFO is refused), so
 * each input is written to a memfd, a regular file that lives in memory and
 * is reached as /proc/self/fd/N: no disk traffic per execution, nothing left
 * behind, and the same file reused for every input of the process. Where a
 * reader globs a directory (the token shards) fz_tmpdir gives a private
 * directory that is removed at exit. Internal names start with fz_.
 */
#ifndef KILN_FUZZ_UTIL_H
#define KILN_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A memory file named `tag` (one per tag and process, at most 8 tags)
 * holding exactly data[0..size); returns its path, valid for the process's
 * life. Aborts when no memfd can be made: a fuzzer without its file is
 * useless, and a silent skip would look like a clean run. */
const char *fz_memfile(const char *tag, const void *data, size_t size);

/* A private temporary directory (under $TMPDIR, /dev/shm when it exists,
 * else /tmp), made once per process and removed with its files at exit. */
const char *fz_tmpdir(void);

/* Write data to <fz_tmpdir()>/<name>; returns the full path (a static
 * buffer per call site is not needed: the result is malloc'd once per name
 * and kept). Aborts on an I/O error. */
const char *fz_tmpfile(const char *name, const void *data, size_t size);

/* Little-endian readers of a fuzz input that never read past its end: a
 * cursor and what is left; a read past the end yields zeros. */
typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in;

uint8_t fz_u8(fz_in *in);
uint32_t fz_u32(fz_in *in);
uint64_t fz_u64(fz_in *in);

#endif
