/*
 * tests/support/testutil.c — see testutil.h.
 */
#define _GNU_SOURCE
#include "testutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

char *tu_mkdtemp(void) {
    char tmpl[] = "/tmp/kiln-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    if (!d) return NULL;
    chmod(d, 0755);
    return strdup(d);
}

void tu_rmrf(const char *dir) {
    if (!dir || strncmp(dir, "/tmp/kiln-test-", 15) != 0) return;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s' 2>/dev/null; rm -rf '%s'", dir, dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

const char *tu_fixture(const char *name) {
    static char buf[4][4096];
    static int k;
    const char *dir = getenv("KILN_FIXTURES");
    char *b = buf[k++ & 3];
    snprintf(b, 4096, "%s/libkiln-%s.so", dir ? dir : ".", name);
    return b;
}

int tu_copy(const char *src, const char *dst, mode_t mode) {
    int in = open(src, O_RDONLY), out = -1;
    if (in < 0) return -1;
    unlink(dst);
    out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0) { close(in); return -1; }
    char buf[65536];
    ssize_t n;
    int rc = 0;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n) { rc = -1; break; }
    close(in);
    close(out);
    if (chmod(dst, mode) != 0) rc = -1;
    return rc;
}

int tu_copy_fixture(const char *name, const char *dir) {
    char dst[4096];
    snprintf(dst, sizeof dst, "%s/libkiln-%s.so", dir, name);
    return tu_copy(tu_fixture(name), dst, 0755);
}

int tu_write(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

int tu_run(const char *cmd, char *out, size_t outlen) {
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = 0;
    while (fread(full, 1, sizeof full, p) > 0) {}
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

const char *tu_kiln(void) {
    const char *k = getenv("KILN_EXE");
    return k ? k : "kiln";
}
