/*
 * host/probe_cache.c — probe results cached in memory for this process and
 * on disk for the next ones (KILN_PLUGIN_CACHE, default
 * ~/.cache/kiln/plugin-probes), so a warm command forks no probe child.
 */
#define _GNU_SOURCE
#include "probe_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

/* Probe results are cached in memory for this process and on disk for the
 * next ones, keyed by the file's path, device, inode, size, mtime and ctime
 * (ctime cannot be set back by the file's owner) and by the identity of the
 * kiln executable (another build may judge a library differently). A warm
 * command forks no child at all. Timeouts are never cached: they may not
 * recur. The cache only spares a probe: every file is still vetted, and a
 * library loaded into this process must offer what its record says. */

static hl_cache_ent *g_cache;
static int g_ncache, g_cache_loaded, g_cache_dirty;

static hl_file_key key_of(const struct stat *st) {
    hl_file_key k;
    memset(&k, 0, sizeof k);
    k.dev = st->st_dev;
    k.ino = st->st_ino;
    k.size = st->st_size;
    k.mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    k.ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
    return k;
}

static int key_eq(const hl_file_key *a, const hl_file_key *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_ns == b->mtime_ns &&
           a->ctime_ns == b->ctime_ns;
}

static const hl_file_key *exe_key(void) {
    static hl_file_key k;
    static int done;
    if (!done) {
        struct stat st;
        if (stat("/proc/self/exe", &st) == 0) k = key_of(&st);
        done = 1;
    }
    return &k;
}

static hl_cache_ent *cache_find_in(const char *real, const hl_file_key *k) {
    for (int i = 0; i < g_ncache; i++) {
        hl_cache_ent *e = &g_cache[i];
        if (key_eq(&e->k, k) && key_eq(&e->exe, exe_key()) && !strcmp(e->real, real)) return e;
    }
    return NULL;
}

static void cache_add(const char *real, const hl_file_key *k, const hl_file_key *exe, int ok, const char *data, size_t len) {
    g_cache = hmem_realloc(g_cache, sizeof *g_cache * (size_t)(g_ncache + 1));
    hl_cache_ent *e = &g_cache[g_ncache++];
    memset(e, 0, sizeof *e);
    e->real = hmem_strdup(real);
    e->k = *k;
    e->exe = *exe;
    e->ok = ok;
    e->data = hmem_realloc(NULL, len + 1);
    memcpy(e->data, data, len);
    e->data[len] = 0;
    e->len = len;
}

/* The cache file: KILN_PLUGIN_CACHE (an absolute path, or "off"), else
 * $XDG_CACHE_HOME/kiln/plugin-probes, else ~/.cache/kiln/plugin-probes.
 * NULL when off or there is no such place. */
static const char *cache_file(void) {
    static char path[PATH_MAX];
    const char *e = secure_getenv("KILN_PLUGIN_CACHE");
    if (e && *e) {
        if (!strcmp(e, "off") || e[0] != '/') return NULL; /* hl_check_env refuses the latter */
        snprintf(path, sizeof path, "%s", e);
        return path;
    }
    const char *x = secure_getenv("XDG_CACHE_HOME"), *h = secure_getenv("HOME");
    if (x && x[0] == '/') snprintf(path, sizeof path, "%s/kiln/plugin-probes", x);
    else if (h && h[0] == '/') snprintf(path, sizeof path, "%s/.cache/kiln/plugin-probes", h);
    else return NULL;
    return path;
}

#define HL_CACHE_MAGIC "kiln-plugin-probes 1\n"
#define HL_CACHE_MAX_BYTES (16u << 20)
#define HL_CACHE_MAX_ENTRIES 4096

/* Read the cache file once per process. Only a regular file of ours that
 * nobody else can write is trusted; anything malformed ends the reading. */
static void cache_load(void) {
    if (g_cache_loaded) return;
    g_cache_loaded = 1;
    const char *path = cache_file();
    if (!path) return;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) ||
        st.st_size > (off_t)HL_CACHE_MAX_BYTES) {
        hlog_loader("probe cache %s: not a private regular file of ours; ignored", path);
        close(fd);
        return;
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) abort();
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = 0;
    size_t ml = strlen(HL_CACHE_MAGIC), i = ml;
    if (got < ml || memcmp(buf, HL_CACHE_MAGIC, ml) != 0) { free(buf); return; }
    while (i < got && g_ncache < HL_CACHE_MAX_ENTRIES) {
        /* E ok dev ino size mtime ctime | exe: dev ino size mtime ctime | pathlen datalen\n path data\n */
        char *nl = memchr(buf + i, '\n', got - i);
        if (!nl) break;
        *nl = 0;
        unsigned long long v[14];
        int ok;
        if (sscanf(buf + i, "E %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &ok, &v[0], &v[1],
                   &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11]) != 13)
            break;
        size_t pl = (size_t)v[10], dl = (size_t)v[11];
        i = (size_t)(nl - buf) + 1;
        if (pl == 0 || pl >= PATH_MAX || dl > HL_PROBE_MAX_RECORD || got - i < pl + dl + 1 || buf[i + pl + dl] != '\n')
            break;
        char real[PATH_MAX];
        memcpy(real, buf + i, pl);
        real[pl] = 0;
        if (strlen(real) != pl) break;
        hl_file_key k = {(dev_t)v[0], (ino_t)v[1], (off_t)v[2], (int64_t)v[3], (int64_t)v[4]};
        hl_file_key x = {(dev_t)v[5], (ino_t)v[6], (off_t)v[7], (int64_t)v[8], (int64_t)v[9]};
        cache_add(real, &k, &x, ok != 0, buf + i + pl, dl);
        i += pl + dl + 1;
    }
    free(buf);
}

/* Write the cache back (temp file and rename, so concurrent commands, e.g.
 * the ranks of one job, never see a torn file), keeping only entries whose
 * file is still the one probed. Failures only cost the next command its
 * probes. */
void hl_cache_save(void) {
    const char *path = cache_file();
    if (!path || !g_cache_dirty) return;
    g_cache_dirty = 0;
    char dir[PATH_MAX], tmp[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = 0;
    if (mkdir(dir, 0700) != 0 && errno == ENOENT) {
        /* ~/.cache itself may be missing */
        char *up = strrchr(dir, '/');
        if (up && up != dir) {
            *up = 0;
            mkdir(dir, 0700);
            *up = '/';
        }
        mkdir(dir, 0700);
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        hlog_loader("probe cache %s: cannot write: %s", tmp, strerror(errno));
        return;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) { close(fd); unlink(tmp); return; }
    fputs(HL_CACHE_MAGIC, f);
    int kept = 0;
    for (int i = g_ncache - 1; i >= 0 && kept < HL_CACHE_MAX_ENTRIES; i--) { /* newest first */
        const hl_cache_ent *e = &g_cache[i];
        struct stat st;
        if (stat(e->real, &st) != 0) continue;
        hl_file_key now = key_of(&st);
        if (!key_eq(&now, &e->k)) continue;
        fprintf(f, "E %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %zu %zu\n", e->ok,
                (unsigned long long)e->k.dev, (unsigned long long)e->k.ino, (unsigned long long)e->k.size,
                (unsigned long long)e->k.mtime_ns, (unsigned long long)e->k.ctime_ns, (unsigned long long)e->exe.dev,
                (unsigned long long)e->exe.ino, (unsigned long long)e->exe.size,
                (unsigned long long)e->exe.mtime_ns, (unsigned long long)e->exe.ctime_ns, strlen(e->real), e->len);
        fputs(e->real, f);
        fwrite(e->data, 1, e->len, f);
        fputc('\n', f);
        kept++;
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        hlog_loader("probe cache %s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
    }
}

hl_cache_ent *hl_cache_find(const char *real, const struct stat *st) {
    cache_load();
    hl_file_key k = key_of(st);
    return cache_find_in(real, &k);
}

void hl_cache_put(const char *real, const struct stat *st, int ok, const char *data, size_t len) {
    hl_file_key k = key_of(st);
    hl_cache_ent *e = cache_find_in(real, &k);
    if (e) {
        free(e->data);
        e->ok = ok;
        e->data = hmem_realloc(NULL, len + 1);
        memcpy(e->data, data, len);
        e->data[len] = 0;
        e->len = len;
    } else
        cache_add(real, &k, exe_key(), ok, data, len);
    g_cache_dirty = 1;
}

