/*
 * tests/support/testutil.c — see testutil.h.
 */
#define _GNU_SOURCE
#include "testutil.h"

#include <CUnit/CUnit.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <stdarg.h>
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

char *tu_suite_dir;
int tu_suite_dir_init(void) { return (tu_suite_dir = tu_mkdtemp()) ? 0 : -1; }
int tu_suite_dir_clean(void) {
    if (tu_suite_dir) tu_rmrf(tu_suite_dir);
    free(tu_suite_dir);
    tu_suite_dir = NULL;
    return 0;
}

static int make_writable(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)ftw;
    if (type == FTW_D) chmod(path, st->st_mode | S_IWUSR); /* a read-only folder: its entries can go */
    return 0;
}

static int remove_path(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    remove(path);
    return 0;
}

void tu_rmrf(const char *dir) {
    if (!dir || strncmp(dir, "/tmp/kiln-test-", 15) != 0) return;
    nftw(dir, make_writable, 16, FTW_PHYS);
    nftw(dir, remove_path, 16, FTW_DEPTH | FTW_PHYS);
    if (access(dir, F_OK) == 0) fprintf(stderr, "warning: could not remove %s\n", dir);
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

const char *tu_kiln(void) {
    const char *k = getenv("KILN_EXE");
    return k ? k : "kiln";
}

/* posix_spawnp of argv with stdout and stderr on fd; the pid in *pid. */
static int spawn_to(char *const argv[], int fd, int close_fd, pid_t *pid) {
    extern char **environ;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fd, STDERR_FILENO);
    if (close_fd >= 0) posix_spawn_file_actions_addclose(&fa, close_fd);
    posix_spawn_file_actions_addclose(&fa, fd);
    int rc = posix_spawnp(pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc;
}

/* The exit status of pid: its code, 128 + the signal that ended it, -1. */
static int wait_status(pid_t pid) {
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

int tu_run_argv(char *const argv[], char *out, size_t outlen) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid;
    int rc = spawn_to(argv, fd[1], fd[0], &pid);
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
    return wait_status(pid);
}

int tu_run_argv_log(char *const argv[], const char *log) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    pid_t pid;
    int rc = spawn_to(argv, fd, -1, &pid);
    close(fd);
    return rc != 0 ? -1 : wait_status(pid);
}

int tu_split_words(const char *text, char *buf, size_t n, char *argv[], int at, int max) {
    snprintf(buf, n, "%s", text ? text : "");
    for (char *save = NULL, *w = strtok_r(buf, " ", &save); w && at < max; w = strtok_r(NULL, " ", &save))
        argv[at++] = w;
    return at;
}

int tu_run_words(const char *cmd, char *out, size_t outlen) {
    char *argv[128], words[8192];
    int n = tu_split_words(cmd, words, sizeof words, argv, 0, 127);
    argv[n] = NULL;
    return n ? tu_run_argv(argv, out, outlen) : -1;
}

int tu_run_kiln(const char *const args[], const char *extra, char *out, size_t outlen) {
    char *argv[128], words[8192];
    int n = 0;
    argv[n++] = (char *)tu_kiln();
    for (int i = 0; args && args[i] && n < 100; i++) argv[n++] = (char *)args[i];
    n = tu_split_words(extra, words, sizeof words, argv, n, 127);
    argv[n] = NULL;
    return tu_run_argv(argv, out, outlen);
}

const char *tu_job_path(char *buf, size_t n, const char *dir, const char *tag) {
    static int k;
    snprintf(buf, n, "%s/%s%d.cfg", dir, tag, k++);
    return buf;
}

/* The run file's text written to cfg: tu_write's status. */
static int write_job(const char *cfg, const char *body) {
    char *text = NULL;
    if (asprintf(&text, "plugins = { dirs = [\"%s\"]; };\n%s", getenv("KILN_TRAIN_FIXTURES"), body) < 0) abort();
    const int rc = tu_write(cfg, text);
    free(text);
    return rc;
}

const char *tu_write_job(const char *cfg, const char *body) {
    CU_ASSERT_EQUAL_FATAL(write_job(cfg, body), 0);
    return cfg;
}

const char *tu_write_jobf(const char *cfg, const char *fmt, ...) {
    char *body = NULL;
    va_list ap;
    va_start(ap, fmt);
    const int len = vasprintf(&body, fmt, ap);
    va_end(ap);
    if (len < 0) abort();
    const int rc = write_job(cfg, body);
    free(body); /* before the assertion, which leaves the case when it fails */
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    return cfg;
}

const char *tu_root_set(char *buf, size_t n, const char *fmt, ...) {
    char root[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(root, sizeof root, fmt, ap);
    va_end(ap);
    snprintf(buf, n, "trainer.default_root_dir=\"%s\"", root);
    return buf;
}

void tu_expect_lines(const char *path, const char *line, int want) {
    const int n = tu_count_lines(path, line);
    if (n != want) fprintf(stderr, "\n  '%s': %d", line, n);
    CU_ASSERT_EQUAL(n, want);
}

void tu_traced_job(char *body, size_t n, char *trace, size_t tn, const char *dir, const char *name, const char *job) {
    snprintf(trace, tn, "%s/%s", dir, name);
    snprintf(body, n, "%scallbacks = ( { name = \"hook_trace\"; path = \"%s\"; } );\n", job, trace);
}

void tu_require_ok(int rc, const char *out) {
    if (rc) fprintf(stderr, "\n%s\n", out);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
}

void tu_check_ok(int rc, const char *out) {
    if (rc) fprintf(stderr, "\n%s\n", out);
    CU_ASSERT_EQUAL(rc, 0);
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

int tu_run_kiln_a(const char *const args[], const char *const more[], char *out, size_t outlen) {
    char *argv[128];
    int n = 0;
    argv[n++] = (char *)tu_kiln();
    for (int i = 0; args && args[i] && n < 64; i++) argv[n++] = (char *)args[i];
    for (int i = 0; more && more[i] && n < 127; i++) argv[n++] = (char *)more[i];
    argv[n] = NULL;
    return tu_run_argv(argv, out, outlen);
}

int tu_run_kiln_l(char *out, size_t outlen, const char *arg, ...) {
    char *argv[128];
    int n = 0;
    argv[n++] = (char *)tu_kiln();
    va_list ap;
    va_start(ap, arg);
    for (const char *a = arg; a && n < 127; a = va_arg(ap, const char *)) argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    return tu_run_argv(argv, out, outlen);
}

int tu_same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb ? 1 : -1;
    while (same == 1) {
        int ca = getc(fa), cb = getc(fb);
        if (ca != cb) same = 0;
        else if (ca == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

int tu_mkdirs(const char *path) {
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755); /* exists already, or the last mkdir reports */
            *s = '/';
        }
    return mkdir(p, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

int tu_count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

int tu_copy_head(const char *src, const char *dst, size_t n) {
    FILE *in = fopen(src, "rb");
    if (!in) return -1;
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int c = getc(in);
        if (c == EOF) break;
        if (putc(c, out) == EOF) rc = -1;
    }
    fclose(in);
    return fclose(out) == 0 ? rc : -1;
}

int tu_count_lines(const char *path, const char *line) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[8192];
    int n = 0;
    while (fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = 0;
        n += !strcmp(buf, line);
    }
    fclose(f);
    return n;
}

int tu_join_fields(const char *path, const char *prefix, const char *skip, int f1, int f2, char sep, char *out,
                   size_t n) {
    FILE *f = fopen(path, "r");
    if (n) out[0] = 0;
    if (!f) return -1;
    char buf[8192];
    size_t used = 0;
    int taken = 0;
    while (fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = 0;
        if ((prefix && strncmp(buf, prefix, strlen(prefix))) || (skip && strstr(buf, skip))) continue;
        taken++;
        char *field[256], line[8192] = "";
        int nf = 0;
        field[nf++] = buf;
        for (char *p = buf; *p && nf < 256; p++)
            if (*p == ' ') {
                *p = 0;
                field[nf++] = p + 1;
            }
        if (f1 > 0 && nf > 1) { /* cut: a line without the delimiter is kept whole */
            for (int k = f1; k <= f2 && k <= nf; k++)
                snprintf(line + strlen(line), sizeof line - strlen(line), "%s%s", k > f1 ? " " : "", field[k - 1]);
        } else {
            for (int k = 0; k < nf; k++)
                snprintf(line + strlen(line), sizeof line - strlen(line), "%s%s", k ? " " : "", field[k]);
        }
        if (used + strlen(line) + 2 <= n) {
            used += (size_t)snprintf(out + used, n - used, "%s%c", line, sep);
        }
    }
    fclose(f);
    return taken;
}
