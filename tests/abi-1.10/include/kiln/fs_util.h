/*
 * kiln/fs_util.h — header-only file-system help for plugins that write into
 * the run directory (loggers, tracers): mkdir -p of a folder or of a file's
 * parent. Failures are not reported here: they surface, with the path, when
 * the file is opened inside. POSIX; not part of the binary ABI. Strict
 * C11 safe: nothing here needs a feature-test macro (no strdup, which
 * -std=c11 leaves undeclared and a 32-bit implicit declaration truncates).
 */
#ifndef KILN_FS_UTIL_H
#define KILN_FS_UTIL_H

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A malloc'd copy of s, or NULL. */
static inline char *kiln__fs_copy(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = (char *)malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* mkdir -p `dir` (mode 0777 before the umask). */
static inline void kiln_mkdirs(const char *dir) {
    char *d = kiln__fs_copy(dir);
    if (!d) return;
    for (char *p = d + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(d, 0777);
        *p = '/';
    }
    mkdir(d, 0777);
    free(d);
}

/* mkdir -p of the folder `path` is in (nothing for a bare file name). */
static inline void kiln_mkdir_parent(const char *path) {
    char *d = kiln__fs_copy(path);
    if (!d) return;
    char *slash = strrchr(d, '/');
    if (slash && slash != d) {
        *slash = '\0';
        kiln_mkdirs(d);
    }
    free(d);
}

#endif /* KILN_FS_UTIL_H */
