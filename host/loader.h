/*
 * host/loader.h — plugin discovery, vetting, loading, validation and the
 * registry that resolves (kind, name-or-alias) to a loaded plugin.
 *
 * Discovery order: the run file's plugins.dirs, then KILN_PLUGIN_PATH (both
 * absolute paths only), then the built-in directory next to the executable
 * (<exe>/../<libdir>/kiln/plugins). Never the current directory or
 * LD_LIBRARY_PATH. Only files named libkiln-*.so are considered. Every
 * examined directory and file becomes a candidate with a status and, when
 * refused or skipped, a one-line reason naming the file, what was expected and
 * what was found; `kiln plugins list --verbose` prints them all.
 *
 * Discovery (hl_discover) runs no plugin code in this process: each file is
 * probed in a child process with a time limit, and the registry is built
 * from what the probes report. A library is dlopen()ed here only when a
 * lookup (hl_find) first answers with one of its plugins, or by hl_load_all.
 */
#ifndef KILN_HOST_LOADER_H
#define KILN_HOST_LOADER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "error.h"
#include "kiln/plugin.h"

enum { HL_ORIGIN_CONFIG = 0, HL_ORIGIN_ENV = 1, HL_ORIGIN_BUILTIN = 2, HL_ORIGIN_EXPLICIT = 3 };
enum { HL_CAND_LOADED = 0, HL_CAND_REFUSED = 1, HL_CAND_SKIPPED = 2 };

typedef struct hl_library hl_library;

/* One accepted plugin descriptor. */
typedef struct hl_plugin {
    hl_library *lib;
    kiln_plugin_desc view; /* the descriptor, read up to its struct_size      */
    const kiln_ops_header *ops;
    const char *const *aliases; /* from the "aliases" property, may be NULL   */
    uint32_t naliases;
} hl_plugin;

struct hl_library {
    char *path;          /* absolute path as found                          */
    char *stem;          /* "acme" for libkiln-acme.so (explicit selection) */
    int origin;          /* HL_ORIGIN_*                                     */
    dev_t dev;
    ino_t ino;
    void *handle;        /* never dlclose()d                                */
    kiln_library view;   /* the library descriptor, read up to struct_size  */
    hl_plugin *plugins;  /* accepted descriptors                            */
    int nplugins;
};

/* One plugin as its library's probe reported it. */
typedef struct hl_pmeta {
    uint32_t kind;
    char *name, *version;
    char **aliases;
    uint32_t naliases;
    int is_default;      /* the "default" property is true                 */
} hl_pmeta;

/* A library whose probe passed: what it offers, and the library itself
 * once loaded into this process. */
typedef struct hl_probe {
    char *path, *stem;
    int origin;
    dev_t dev;
    ino_t ino;
    off_t size;
    int64_t mtime_ns;    /* must be unchanged when it is loaded here        */
    char *libname, *libversion;
    uint32_t abi_major, abi_minor;
    hl_pmeta *plugins;
    int nplugins;
    hl_library *lib;     /* NULL until loaded                               */
    int failed;          /* loading here failed after a good probe          */
    int cand;            /* its index in cands                              */
} hl_probe;

/* A file or directory the loader looked at. */
typedef struct hl_candidate {
    char *path;
    int is_dir;
    int status;          /* HL_CAND_*                                       */
    char *reason;        /* refusal/skip reason(s), '\n'-separated; or NULL */
    hl_library *lib;     /* when loaded                                     */
} hl_candidate;

typedef struct hl_loader {
    const kiln_host_base *host; /* what each library's kiln_plugin_init_v1 gets */
    int allow_symlinks;
    char **dirs;         /* search path in order                            */
    int *dir_origin;
    int ndirs;
    hl_candidate *cands;
    int ncands;
    hl_library **libs;   /* loaded into this process, in load order         */
    int nlibs;
    hl_probe **probes;   /* usable libraries, in search order               */
    int nprobes;
    /* registry: (kind, key) -> a probe's plugin, keys are names and aliases */
    struct hl_regent { uint32_t kind; const char *key; hl_probe *pr; int pi; int is_alias; } *reg;
    int nreg;
    char **warnings;     /* registry conflicts, already logged              */
    int nwarnings;
} hl_loader;

/* `host` is the bootstrap struct every loaded library is initialised with
 * (plugin_api.c's ht_host_base()). */
void hl_loader_init(hl_loader *L, const kiln_host_base *host);
void hl_loader_free(hl_loader *L); /* frees host memory; libraries stay mapped */

/* Add a search directory (origin HL_ORIGIN_*). Relative paths are recorded as
 * refused candidates. */
void hl_add_dir(hl_loader *L, const char *dir, int origin);
/* Add KILN_PLUGIN_PATH entries (colon-separated) and the built-in directory. */
void hl_add_default_dirs(hl_loader *L);
/* The built-in plugin directory derived from /proc/self/exe ("" if unknown). */
const char *hl_builtin_dir(void);

/* Scan every directory, probe every file in a child process, and build the
 * registry from the probes. Loads nothing into this process. */
void hl_discover(hl_loader *L);
/* Load every library whose probe passed (what `plugins list` shows); -1 when
 * one failed here (refused and logged, registry rebuilt without it). */
int hl_load_all(hl_loader *L);
/* hl_discover then hl_load_all. */
void hl_scan(hl_loader *L);
/* Vet and load one file into this process, no probe (`kiln plugins check`
 * does it in a child of its own). Returns 0 when the library loaded with at
 * least one plugin; otherwise -1 with the reason in err. */
int hl_load_file(hl_loader *L, const char *path, int origin, ht_error *err);
/* (Re)build the name/alias registry from the probes. */
void hl_registry_build(hl_loader *L);
/* The probe time limit: KILN_PLUGIN_PROBE_TIMEOUT seconds, 10 by default.
 * -1 with a one-line reason when the variable is set to something else
 * than a number of seconds in (0, 86400]. */
int hl_probe_timeout(double *seconds, ht_error *err);
/* Both variables discovery reads: KILN_PLUGIN_PROBE_TIMEOUT as above, and
 * KILN_PLUGIN_CACHE (the probe cache file: an absolute path, or "off"; by
 * default $XDG_CACHE_HOME/kiln/plugin-probes or ~/.cache/kiln/plugin-probes).
 * -1 with a one-line reason when one is malformed. */
int hl_check_env(ht_error *err);

/* Resolve "name", an alias, or "stem:name" for a kind, loading the library
 * that answers into this process on first use. NULL with a one-line reason
 * in err when nothing answers or that library fails to load here (a
 * refused file named like the query is named in the reason). */
const hl_plugin *hl_find(hl_loader *L, uint32_t kind, const char *query, ht_error *err);

/* library_fini of every library, reverse load order. Instances must already
 * be destroyed. Idempotent. */
void hl_shutdown(hl_loader *L);

/* Vetting, exposed for tests: 0 if acceptable, else -1 and a reason. */
int hl_vet_dir(const char *dir, int allow_symlinks, ht_error *err);
int hl_vet_file(const char *path, int allow_symlinks, ht_error *err);

const char *hl_kind_name(uint32_t kind);            /* "precision", or NULL   */
int hl_kind_from_name(const char *name, uint32_t *kind);
int hl_valid_plugin_name(const char *name);
/* Property of a plugin by key, or NULL. */
const kiln_value *hl_prop(const hl_plugin *p, const char *key);
/* Name of the plugin a slot ("precision") defaults to: the first of its kind
 * whose "default" property is true; NULL when none says so. From the
 * probes: loads nothing. */
const char *hl_default_name(const hl_loader *L, const char *slot);

/* Why a library lacks kiln_plugin_init_v1, from its exported symbols
 * (loader_elf.c; no code of it runs): another ABI major's entry, a misspelt
 * one, or none. One line into buf, starting "missing symbol ...". */
void hl_entry_diagnosis(const char *path, char *buf, size_t n);

/* Shared by loader.c and registry.c only. */
void hl_lib_stem(const char *path, char *out, size_t n); /* "libkiln-x.so" → "x" */
/* Load the library a probe describes into this process (once); 0, or -1
 * with one line in err. */
int hl_probe_load(hl_loader *L, hl_probe *p, ht_error *err);

#endif
