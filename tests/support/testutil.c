/*
 * tests/support/testutil.c — see testutil.h.
 */
#define _GNU_SOURCE
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
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

int tu_run_argv(char *const argv[], char *out, size_t outlen) {
    extern char **environ;
    int fd[2];
    if (pipe(fd) != 0) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addclose(&fa, fd[1]);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        return -1;
    }
    size_t n = 0;
    char sink[8192]; /* what does not fit in out is read and dropped */
    for (;;) {
        const int room = n + 1 < outlen;
        ssize_t r = read(fd[0], room ? out + n : sink, room ? outlen - 1 - n : sizeof sink);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (room) n += (size_t)r;
    }
    if (outlen) out[n] = 0;
    close(fd[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

int tu_run_kiln(const char *const args[], const char *extra, char *out, size_t outlen) {
    char *argv[128], words[8192];
    int n = 0;
    argv[n++] = (char *)tu_kiln();
    for (int i = 0; args && args[i] && n < 100; i++) argv[n++] = (char *)args[i];
    snprintf(words, sizeof words, "%s", extra ? extra : "");
    for (char *save = NULL, *w = strtok_r(words, " ", &save); w && n < 127; w = strtok_r(NULL, " ", &save))
        argv[n++] = w;
    argv[n] = NULL;
    return tu_run_argv(argv, out, outlen);
}

int tu_latest_run_dir(const char *root, char *buf, size_t n) {
    DIR *d = opendir(root);
    if (!d) return -1;
    long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        if (strncmp(e->d_name, "version_", 8) != 0) continue;
        long v = strtol(e->d_name + 8, &end, 10);
        if (*end == 0 && end != e->d_name + 8 && v > best) best = v;
    }
    closedir(d);
    if (best < 0) return -1;
    snprintf(buf, n, "%s/version_%ld", root, best);
    return 0;
}
