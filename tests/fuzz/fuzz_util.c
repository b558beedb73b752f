/*
 * tests/fuzz/fuzz_util.c — see fuzz_util.h. memfd_create needs Linux 3.17
 * and glibc 2.27; kiln's CI (Debian 12) has both.
 */
#define _GNU_SOURCE
#include "fuzz_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct fz_mem {
    const char *tag;
    int fd;
    char path[64];
} fz_mem;

static fz_mem fz_mems[8];

static void fz_die(const char *what) {
    fprintf(stderr, "fuzz harness: %s: %s\n", what, strerror(errno));
    abort();
}

static void fz_write_all(int fd, const void *data, size_t size, const char *what) {
    const uint8_t *p = data;
    size_t off = 0;
    while (off < size) {
        ssize_t k = pwrite(fd, p + off, size - off, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) fz_die(what);
        off += (size_t)k;
    }
}

const char *fz_memfile(const char *tag, const void *data, size_t size) {
    fz_mem *m = NULL;
    for (int i = 0; i < 8 && !m; i++)
        if (!fz_mems[i].tag || !strcmp(fz_mems[i].tag, tag)) m = &fz_mems[i];
    if (!m) {
        errno = EMFILE;
        fz_die("more than 8 memory files");
    }
    if (!m->tag) {
        m->fd = memfd_create(tag, MFD_CLOEXEC);
        if (m->fd < 0) fz_die("memfd_create");
        snprintf(m->path, sizeof m->path, "/proc/self/fd/%d", m->fd);
        m->tag = tag;
    }
    /* shrink first: the previous input may have been longer */
    if (ftruncate(m->fd, 0) != 0) fz_die("ftruncate");
    fz_write_all(m->fd, data, size, "writing a memory file");
    return m->path;
}

static char fz_dir[256];

static void fz_rmdir(void) {
    DIR *d = opendir(fz_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[512];
            snprintf(p, sizeof p, "%s/%s", fz_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(fz_dir);
}

const char *fz_tmpdir(void) {
    if (fz_dir[0]) return fz_dir;
    const char *base = getenv("TMPDIR");
    struct stat st;
    if (!base || !base[0]) base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(fz_dir, sizeof fz_dir, "%s/kiln-fuzz.XXXXXX", base);
    if (!mkdtemp(fz_dir)) fz_die("mkdtemp");
    atexit(fz_rmdir);
    return fz_dir;
}

const char *fz_tmpfile(const char *name, const void *data, size_t size) {
    static struct { char *name, *path; } known[32];
    char *path = NULL;
    int i;
    for (i = 0; i < 32 && known[i].name; i++)
        if (!strcmp(known[i].name, name)) { path = known[i].path; break; }
    if (!path) {
        if (i == 32) {
            errno = EMFILE;
            fz_die("more than 32 temporary files");
        }
        size_t l = strlen(fz_tmpdir()) + strlen(name) + 2;
        path = malloc(l);
        if (!path) fz_die("malloc");
        snprintf(path, l, "%s/%s", fz_tmpdir(), name);
        known[i].name = strdup(name);
        known[i].path = path;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) fz_die(path);
    fz_write_all(fd, data, size, path);
    close(fd);
    return path;
}

uint8_t fz_u8(fz_in *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

uint32_t fz_u32(fz_in *in) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fz_u8(in) << (8 * i);
    return v;
}

uint64_t fz_u64(fz_in *in) {
    uint64_t lo = fz_u32(in);
    return lo | (uint64_t)fz_u32(in) << 32;
}
