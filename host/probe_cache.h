/*
 * host/probe_cache.h — the cache of plugin probe results (probe_cache.c),
 * shared by discovery (loader.c) only.
 */
#ifndef KILN_HOST_PROBE_CACHE_H
#define KILN_HOST_PROBE_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

typedef struct hl_file_key {
    dev_t dev;
    ino_t ino;
    off_t size;
    int64_t mtime_ns, ctime_ns;
} hl_file_key;

typedef struct hl_cache_ent {
    char *real;
    hl_file_key k;
    hl_file_key exe;
    int ok;       /* 1: data is a record; 0: data is a refusal text after "<path>: " */
    char *data;
    size_t len;
} hl_cache_ent;

/* the largest probe record a child may send (and the cache keeps) */
#define HL_PROBE_MAX_RECORD (1u << 20)

/* The cached result for the file at `real` as it is now (path, device,
 * inode, size, mtime, ctime and this kiln executable must all match), or
 * NULL. */
hl_cache_ent *hl_cache_find(const char *real, const struct stat *st);
/* Record a result: ok with the probe's record, or a refusal text. */
void hl_cache_put(const char *real, const struct stat *st, int ok, const char *data, size_t len);
/* Write the cache file when something changed (atomic, private). */
void hl_cache_save(void);

#endif
