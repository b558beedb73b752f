/*
 * host/loader.c — finds, vets, dlopen()s and validates plugin libraries
 * (the registry built from them is registry.c; the probe cache
 * probe_cache.c). The checks follow docs/abi.md: directories and files
 * must be owned by root or the effective user and not group/world-writable
 * (ancestors too, except a root-owned sticky directory such as /tmp); symlinks
 * and setuid files are refused; the file is opened O_NOFOLLOW, re-checked on
 * its descriptor, and the inode mapped is compared with the one vetted;
 * dlopen(RTLD_NOW|RTLD_LOCAL|RTLD_NODELETE) and never dlclose(). Everything a
 * library returns is validated before use; each refusal is one line naming
 * the file, what was expected and what was found.
 *
 * A library's code (constructors, kiln_plugin_init) may crash, hang or call
 * exit(), so discovery never runs it in this process: each vetted file is
 * probed in a forked child (16 at a time, each within
 * KILN_PLUGIN_PROBE_TIMEOUT seconds, 10 by default) that loads it, validates
 * it and writes back over a pipe what it offers (kinds, names, aliases, the
 * "default" property), ending with a marker; a child that dies, exits or
 * runs out of time without the marker refuses its file with one line. The
 * registry is built from those records; a library is loaded into this
 * process only when hl_find() first resolves one of its plugins (or for
 * `plugins list`, hl_load_all()). Probe results are cached in memory and on
 * disk (probe_cache.c).
 */
#define _GNU_SOURCE
#include "loader.h"
#include "probe_cache.h"
#include "param_checks.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "version.h"

#define HL_MAX_PLUGINS_PER_LIB 256
#define HL_MAX_PARAMS 256

/* ---------------------------------------------------------------------------
 * Small helpers */

static const char *const kind_names[] = {NULL, "accelerator", "precision", "strategy", "optimizer",
                                         "scheduler", "callback", "module", "data"};

const char *hl_kind_name(uint32_t kind) {
    return kind >= 1 && kind <= KILN_KIND_MAX_KNOWN ? kind_names[kind] : NULL;
}

int hl_kind_from_name(const char *name, uint32_t *kind) {
    for (uint32_t k = 1; k <= KILN_KIND_MAX_KNOWN; k++)
        if (strcmp(kind_names[k], name) == 0) { *kind = k; return 0; }
    return -1;
}

int hl_valid_plugin_name(const char *s) {
    if (!s || !*s) return 0;
    size_t n = strlen(s);
    if (n > 64) return 0;
    if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= '0' && s[0] <= '9'))) return 0;
    for (size_t i = 1; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) return 0;
    }
    return 1;
}

static int valid_param_key(const char *s) {
    if (!s || !(*s >= 'a' && *s <= 'z')) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_')) return 0;
    return 1;
}

static const char *type_name(uint32_t t) {
    static const char *const n[] = {"none", "bool", "int", "float", "string", "int list", "float list",
                                    "string list"};
    return t <= KILN_TYPE_STRING_LIST ? n[t] : "invalid type";
}

/* ---------------------------------------------------------------------------
 * Candidates */

static hl_candidate *add_cand(hl_loader *L, const char *path, int is_dir, int status, const char *reason) {
    L->cands = hmem_realloc(L->cands, sizeof(*L->cands) * (size_t)(L->ncands + 1));
    hl_candidate *c = &L->cands[L->ncands++];
    memset(c, 0, sizeof *c);
    c->path = hmem_strdup(path);
    c->is_dir = is_dir;
    c->status = status;
    c->reason = reason ? hmem_strdup(reason) : NULL;
    return c;
}

static void cand_append_reason(hl_candidate *c, const char *line) {
    size_t a = c->reason ? strlen(c->reason) : 0, b = strlen(line);
    c->reason = hmem_realloc(c->reason, a + b + 2);
    if (a) c->reason[a++] = '\n';
    memcpy(c->reason + a, line, b + 1);
}

/* ---------------------------------------------------------------------------
 * Vetting */

/* Owner and mode rules shared by files and directories. */
static int vet_owner_mode(const char *path, const struct stat *st, const char *what, ht_error *err) {
    uid_t me = geteuid();
    if (st->st_uid != 0 && st->st_uid != me) {
        ht_errorf(err, "%s: %s owned by uid %u, expected root or uid %u", path, what, (unsigned)st->st_uid,
                 (unsigned)me);
        return -1;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        ht_errorf(err, "%s: %s is %s-writable (mode %04o), expected writable by its owner only", path, what,
                 (st->st_mode & S_IWOTH) ? "world" : "group", (unsigned)(st->st_mode & 07777));
        return -1;
    }
    return 0;
}

/* Every ancestor of `real` (an absolute, resolved path) must not be writable
 * by others, except a root-owned sticky directory like /tmp, where nobody but
 * the owner can rename or replace what is inside. */
static int vet_ancestors(const char *real, ht_error *err) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", real);
    for (;;) {
        char *slash = strrchr(buf, '/');
        if (!slash) break;
        if (slash == buf) slash[1] = 0; else *slash = 0;
        struct stat st;
        if (stat(buf, &st) != 0) {
            ht_errorf(err, "%s: cannot stat ancestor directory %s: %s", real, buf, strerror(errno));
            return -1;
        }
        int sticky_root = (st.st_mode & S_ISVTX) && st.st_uid == 0;
        if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !sticky_root) {
            ht_errorf(err, "%s: ancestor directory %s is %s-writable (mode %04o), expected not writable by others",
                     real, buf, (st.st_mode & S_IWOTH) ? "world" : "group", (unsigned)(st.st_mode & 07777));
            return -1;
        }
        if (st.st_uid != 0 && st.st_uid != geteuid()) {
            ht_errorf(err, "%s: ancestor directory %s owned by uid %u, expected root or uid %u", real, buf,
                     (unsigned)st.st_uid, (unsigned)geteuid());
            return -1;
        }
        if (strcmp(buf, "/") == 0) break;
    }
    return 0;
}

int hl_vet_dir(const char *dir, int allow_symlinks, ht_error *err) {
    if (!dir || dir[0] != '/') {
        ht_errorf(err, "%s: plugin directory must be an absolute path, found a relative one", dir ? dir : "(null)");
        return -1;
    }
    struct stat st;
    if (lstat(dir, &st) != 0) {
        ht_errorf(err, "%s: cannot access plugin directory: %s", dir, strerror(errno));
        return -1;
    }
    if (S_ISLNK(st.st_mode) && !allow_symlinks) {
        ht_errorf(err, "%s: plugin directory is a symlink (set plugins.allow_symlinks = true to follow)", dir);
        return -1;
    }
    char real[PATH_MAX];
    if (!realpath(dir, real) || stat(real, &st) != 0) {
        ht_errorf(err, "%s: cannot resolve plugin directory: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        ht_errorf(err, "%s: expected a directory, found another kind of file", dir);
        return -1;
    }
    if (vet_owner_mode(dir, &st, "plugin directory", err)) return -1;
    return vet_ancestors(real, err);
}

int hl_vet_file(const char *path, int allow_symlinks, ht_error *err) {
    if (!path || path[0] != '/') {
        ht_errorf(err, "%s: plugin path must be absolute", path ? path : "(null)");
        return -1;
    }
    struct stat st;
    if (lstat(path, &st) != 0) {
        ht_errorf(err, "%s: cannot access: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISLNK(st.st_mode)) {
        if (!allow_symlinks) {
            ht_errorf(err, "%s: is a symlink, expected a regular file (set plugins.allow_symlinks = true to follow)",
                     path);
            return -1;
        }
        /* Following: every check applies to the target and its directory. */
        char real[PATH_MAX];
        if (!realpath(path, real)) {
            ht_errorf(err, "%s: dangling symlink: %s", path, strerror(errno));
            return -1;
        }
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", real);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) *slash = 0;
        if (hl_vet_dir(dir, 0, err)) return -1;
        return hl_vet_file(real, 0, err);
    }
    if (!S_ISREG(st.st_mode)) {
        ht_errorf(err, "%s: expected a regular file, found a %s", path,
                 S_ISDIR(st.st_mode) ? "directory" : S_ISFIFO(st.st_mode) ? "FIFO" : "special file");
        return -1;
    }
    if (st.st_mode & (S_ISUID | S_ISGID)) {
        ht_errorf(err, "%s: has the set%s bit (mode %04o), expected none", path,
                 (st.st_mode & S_ISUID) ? "uid" : "gid", (unsigned)(st.st_mode & 07777));
        return -1;
    }
    return vet_owner_mode(path, &st, "plugin file", err);
}

/* ---------------------------------------------------------------------------
 * Directories */

void hl_loader_init(hl_loader *L, const kiln_host_base *host) {
    memset(L, 0, sizeof *L);
    L->host = host;
}

void hl_add_dir(hl_loader *L, const char *dir, int origin) {
    for (int i = 0; i < L->ndirs; i++)
        if (strcmp(L->dirs[i], dir) == 0) return;
    L->dirs = hmem_realloc(L->dirs, sizeof(char *) * (size_t)(L->ndirs + 1));
    L->dir_origin = hmem_realloc(L->dir_origin, sizeof(int) * (size_t)(L->ndirs + 1));
    L->dirs[L->ndirs] = hmem_strdup(dir);
    L->dir_origin[L->ndirs] = origin;
    L->ndirs++;
}

const char *hl_builtin_dir(void) {
    static char dir[PATH_MAX + 32];
    if (dir[0]) return dir;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return "";
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return "";
    *slash = 0; /* <prefix>/bin */
    slash = strrchr(exe, '/');
    if (!slash) return "";
    *slash = 0; /* <prefix> */
    snprintf(dir, sizeof dir, "%s/%s", exe, KILN_PLUGIN_RELDIR);
    return dir;
}

void hl_add_default_dirs(hl_loader *L) {
    /* secure_getenv returns NULL in setuid/setgid (AT_SECURE) processes. */
    const char *env = secure_getenv("KILN_PLUGIN_PATH");
    if (env && *env) {
        char *copy = hmem_strdup(env), *save = NULL;
        for (char *tok = strtok_r(copy, ":", &save); tok; tok = strtok_r(NULL, ":", &save))
            if (*tok) hl_add_dir(L, tok, HL_ORIGIN_ENV);
        free(copy);
    }
    const char *b = hl_builtin_dir();
    if (*b) hl_add_dir(L, b, HL_ORIGIN_BUILTIN);
}

/* ---------------------------------------------------------------------------
 * Validation of what the library returns */

static const struct { const char *key; uint32_t type; } known_props[] = {
    {"aliases", KILN_TYPE_STRING_LIST}, {"precision", KILN_TYPE_STRING},   {"amp_backend", KILN_TYPE_STRING},
    {"amp_level", KILN_TYPE_STRING},    {"param_dtype", KILN_TYPE_STRING}, {"compute_dtype", KILN_TYPE_STRING},
    {"grad_dtype", KILN_TYPE_STRING},   {"needs_grad_scaler", KILN_TYPE_BOOL},
    {"bits_per_weight", KILN_TYPE_FLOAT}, {"device_type", KILN_TYPE_STRING}, {"distributed", KILN_TYPE_BOOL},
    /* 1.2: compatibility (host/stack_checks.c) */
    {"param_dtypes", KILN_TYPE_STRING_LIST}, {"repeated_closure", KILN_TYPE_BOOL},
    {"allows_repeated_closure", KILN_TYPE_BOOL}, {"automatic_optimization", KILN_TYPE_BOOL},
    {"default", KILN_TYPE_BOOL},
    /* 1.5: allowed values of config keys (param_checks.h) */
    {"config_checks", KILN_TYPE_STRING_LIST},
};

static int check_value_shape(const kiln_value *v) {
    switch (v->type) {
    case KILN_TYPE_NONE: case KILN_TYPE_BOOL: case KILN_TYPE_INT: case KILN_TYPE_FLOAT: return 1;
    case KILN_TYPE_STRING: return v->v.s != NULL;
    case KILN_TYPE_INT_LIST: return v->count == 0 || v->v.il != NULL;
    case KILN_TYPE_FLOAT_LIST: return v->count == 0 || v->v.fl != NULL;
    case KILN_TYPE_STRING_LIST:
        if (v->count && !v->v.sl) return 0;
        for (uint32_t i = 0; i < v->count; i++)
            if (!v->v.sl[i]) return 0;
        return 1;
    default: return 0;
    }
}

/* Validate one descriptor; 0 and a filled hl_plugin, -1 refused, 1 skipped. */
static int validate_desc(hl_library *lib, const kiln_plugin_desc *d, uint32_t idx, hl_plugin *out, ht_error *err) {
    const char *path = lib->path;
    if (!d) {
        ht_errorf(err, "%s: plugin descriptor %u is NULL, expected a descriptor", path, idx);
        return -1;
    }
    if (d->struct_size < sizeof(kiln_plugin_desc)) {
        ht_errorf(err,
             "%s: plugin descriptor %u too small (struct_size %u < %zu required for ABI 1.0); built against a "
             "corrupt or mismatched header",
             path, idx, d->struct_size, sizeof(kiln_plugin_desc));
        return -1;
    }
    memset(out, 0, sizeof *out);
    memcpy(&out->view, d, sizeof(kiln_plugin_desc)); /* host view = 1.0 size */
    out->lib = lib;
    const kiln_plugin_desc *v = &out->view;
    if (v->kind == 0) {
        ht_errorf(err, "%s: plugin descriptor %u has kind 0, expected a KILN_KIND_* value", path, idx);
        return -1;
    }
    if (v->kind > KILN_KIND_MAX_KNOWN) {
        ht_errorf(err, "%s: plugin '%s' has kind %u, unknown to host ABI %d.%d; skipped", path,
                 v->name ? v->name : "?", v->kind, KILN_ABI_MAJOR, KILN_ABI_MINOR);
        return 1;
    }
    const char *kn = hl_kind_name(v->kind);
    if (!hl_valid_plugin_name(v->name)) {
        ht_errorf(err, "%s: %s plugin %u has name '%s', expected [a-z0-9][a-z0-9._-]{0,63}", path, kn, idx,
                 v->name ? v->name : "(null)");
        return -1;
    }
    if (!v->version || !*v->version) {
        ht_errorf(err, "%s: %s '%s' has no version string", path, kn, v->name);
        return -1;
    }
    const kiln_ops_header *ops = v->ops;
    if (!ops) {
        ht_errorf(err, "%s: %s '%s' has no ops table, expected one", path, kn, v->name);
        return -1;
    }
    if (ops->struct_size < sizeof(kiln_ops_header)) {
        ht_errorf(err,
             "%s: %s '%s' ops table too small (struct_size %u < %zu required for ABI 1.0); built against a corrupt "
             "or mismatched header",
             path, kn, v->name, ops->struct_size, sizeof(kiln_ops_header));
        return -1;
    }
    if (!ops->create || !ops->destroy) {
        ht_errorf(err, "%s: %s '%s' lacks mandatory op %s", path, kn, v->name, !ops->create ? "create" : "destroy");
        return -1;
    }
    /* KILN_CAP_STATEFUL says get_state/set_state are there (1.5 makes it
     * binding: a library built against 1.5 or later whose descriptor and ops
     * disagree is refused; an older one is taken as it is) */
    const int has_get = ops->get_state != NULL, has_set = ops->set_state != NULL;
    const int says = (v->capabilities & KILN_CAP_STATEFUL) != 0;
    if (lib->view.abi_minor >= 5 && (has_get != has_set || says != has_get)) {
        ht_errorf(err,
              "%s: %s '%s' %s; a plugin with state declares KILN_CAP_STATEFUL and has both get_state and "
              "set_state, one without has neither",
              path, kn, v->name,
              has_get != has_set ? (has_get ? "has get_state but no set_state" : "has set_state but no get_state")
              : says              ? "declares KILN_CAP_STATEFUL but has no get_state/set_state"
                                  : "has get_state/set_state but does not declare KILN_CAP_STATEFUL");
        return -1;
    }
    out->ops = ops;
    /* Properties: known keys have fixed types. */
    int np = 0;
    for (const kiln_kv *p = v->properties; p && p->key; p++, np++) {
        if (np >= 256) {
            ht_errorf(err, "%s: %s '%s' has more than 256 properties (unterminated list?)", path, kn, v->name);
            return -1;
        }
        if (!check_value_shape(&p->value)) {
            ht_errorf(err, "%s: %s '%s' property '%s' is malformed (type %u, count %u)", path, kn, v->name, p->key,
                     p->value.type, p->value.count);
            return -1;
        }
        for (size_t k = 0; k < sizeof known_props / sizeof known_props[0]; k++) {
            if (strcmp(known_props[k].key, p->key) == 0 && known_props[k].type != p->value.type) {
                ht_errorf(err, "%s: %s '%s' property '%s' must be a %s, found a %s", path, kn, v->name, p->key,
                         type_name(known_props[k].type), type_name(p->value.type));
                return -1;
            }
        }
        if (strcmp(p->key, "aliases") == 0) {
            for (uint32_t a = 0; a < p->value.count; a++)
                if (!hl_valid_plugin_name(p->value.v.sl[a])) {
                    ht_errorf(err, "%s: %s '%s' alias '%s' is not a valid name", path, kn, v->name,
                             p->value.v.sl[a]);
                    return -1;
                }
            out->aliases = p->value.v.sl;
            out->naliases = p->value.count;
        }
    }
    /* Declared config keys. */
    int nk = 0;
    for (const kiln_param *q = v->params; q && q->key; q++, nk++) {
        if (nk >= HL_MAX_PARAMS) {
            ht_errorf(err, "%s: %s '%s' declares more than %d config keys (unterminated list?)", path, kn, v->name,
                     HL_MAX_PARAMS);
            return -1;
        }
        if (!valid_param_key(q->key) || strcmp(q->key, "name") == 0) {
            ht_errorf(err, "%s: %s '%s' declares config key '%s', expected [a-z][a-z0-9_]* other than 'name'",
                     path, kn, v->name, q->key);
            return -1;
        }
        if (q->type < KILN_TYPE_BOOL || q->type > KILN_TYPE_STRING_LIST) {
            ht_errorf(err, "%s: %s '%s' config key '%s' has invalid type %u", path, kn, v->name, q->key, q->type);
            return -1;
        }
        int def_ok = q->def.type == KILN_TYPE_NONE || q->def.type == q->type ||
                     (q->type == KILN_TYPE_FLOAT && q->def.type == KILN_TYPE_INT);
        if (!def_ok || !check_value_shape(&q->def)) {
            ht_errorf(err, "%s: %s '%s' config key '%s' is a %s but its default is a %s", path, kn, v->name,
                     q->key, type_name(q->type), type_name(q->def.type));
            return -1;
        }
        for (const kiln_param *r = v->params; r != q; r++)
            if (strcmp(r->key, q->key) == 0) {
                ht_errorf(err, "%s: %s '%s' declares config key '%s' twice", path, kn, v->name, q->key);
                return -1;
            }
    }
    ht_error cerr = {0};
    if (hp_validate_desc(v->properties, v->params, &cerr)) {
        ht_errorf(err, "%s: %s '%s': %s", path, kn, v->name, cerr.msg);
        return -1;
    }
    return 0;
}

void hl_lib_stem(const char *path, char *out, size_t n) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strncmp(base, "libkiln-", 8) == 0) base += 8;
    snprintf(out, n, "%s", base);
    char *dot = strstr(out, ".so");
    if (dot) *dot = 0;
}

/* Hints for common dlopen failures. */
static const char *dlerror_hint(const char *msg) {
    if (strstr(msg, "libcudart.so") || strstr(msg, "libcublas")) return " (hint: the plugin was built for another CUDA "
                                                                       "runtime than this machine provides)";
    if (strstr(msg, "GLIBCXX_")) return " (hint: built with a newer libstdc++; rebuild with the system toolchain)";
    if (strstr(msg, "undefined symbol")) return " (hint: build plugins with -Wl,-z,defs so this fails at link time)";
    return "";
}

/* ---------------------------------------------------------------------------
 * Opening and loading one library */

/* The checks on a file before any of its code runs: vetting, the resolved
 * path, and a descriptor-based re-check (the file may have been swapped
 * between the two). 0 with real and st filled, or -1 with the reason in err. */
static int vet_open(const hl_loader *L, const char *path, char *real, struct stat *st, ht_error *err) {
    if (hl_vet_file(path, L->allow_symlinks, err)) return -1;
    if (!realpath(path, real)) {
        ht_errorf(err, "%s: cannot resolve: %s", path, strerror(errno));
        return -1;
    }
    int fd = open(real, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || fstat(fd, st) != 0) {
        ht_errorf(err, "%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    if (!S_ISREG(st->st_mode) || (st->st_mode & (S_ISUID | S_ISGID))) {
        ht_errorf(err, "%s: changed while being checked", path);
        return -1;
    }
    return vet_owner_mode(path, st, "plugin file", err);
}

/* A note on one descriptor of a library (skipped or refused): appended to
 * its candidate, and logged unless the library's probe logged it already.
 * sev collects one severity letter per note ('I' info, 'W' warning) for a
 * probe child to send back; NULL elsewhere. */
typedef struct note_sink {
    hl_candidate *c;
    int quiet;
    char sev[HL_MAX_PLUGINS_PER_LIB * 2 + 2];
} note_sink;

static void note(note_sink *ns, int info, const char *line) {
    cand_append_reason(ns->c, line);
    size_t n = strlen(ns->sev);
    if (n + 1 < sizeof ns->sev) { ns->sev[n] = info ? 'I' : 'W'; ns->sev[n + 1] = 0; }
    if (ns->quiet) return;
    if (info) HLOG_INFO("%s", line);
    else HLOG_WARN("%s", line);
}

/* dlopen the vetted file, run its entry point and validate everything it
 * returns. The library's code runs here: in-process only for a file whose
 * probe passed (or for `plugins check`, itself in a child). Returns the
 * library (not yet in L->libs) or NULL with the reason in err. */
static hl_library *load_lib(const kiln_host_base *host, const char *path, const char *real, const struct stat *st,
                            int origin, note_sink *ns, ht_error *err) {
    /* dlopen by the resolved absolute path (never a search), then make sure
     * the file mapped is the inode that was vetted through the descriptor.
     * (Not /proc/self/fd/N: glibc recognises loaded objects by name first, so
     * a reused descriptor number would return an earlier library.) */
    hlog_loader("dlopen %s", real);
    dlerror();
    void *h = dlopen(real, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    struct stat st2;
    int swapped = h && (stat(real, &st2) != 0 || st2.st_dev != st->st_dev || st2.st_ino != st->st_ino);
    if (!h) {
        const char *e = dlerror();
        e = e ? e : "unknown error";
        size_t rl = strlen(real);
        if (!strncmp(e, real, rl) && e[rl] == ':') e += rl + (e[rl + 1] == ' ' ? 2 : 1);
        ht_errorf(err, "%s: cannot be loaded: %s%s", path, e, dlerror_hint(e));
        return NULL;
    }
    if (swapped) {
        ht_errorf(err, "%s: was replaced while being loaded; refusing it", path);
        return NULL;
    }
    kiln_plugin_init_v1_fn init;
    *(void **)&init = dlsym(h, KILN_PLUGIN_ENTRY_V1);
    if (!init) {
        char diag[512];
        hl_entry_diagnosis(real, diag, sizeof diag);
        ht_errorf(err, "%s: is not a kiln plugin: %s", path, diag);
        return NULL; /* left mapped: never dlclose */
    }
    const kiln_library *desc = NULL;
    herr_clear();
    int32_t rc = init(host, &desc);
    if (rc != KILN_OK) {
        ht_errorf(err, "%s: failed to initialize: %s [%s]", path,
                 *herr_msg() ? herr_msg() : kiln_strerror(rc), kiln_status_name(rc));
        return NULL;
    }
    if (!desc) {
        ht_errorf(err, "%s: init returned success but no library descriptor", path);
        return NULL;
    }
    if (desc->struct_size < sizeof(kiln_library)) {
        ht_errorf(err,
             "%s: library descriptor too small (struct_size %u < %zu required for ABI 1.0); built against a corrupt "
             "or mismatched header",
             path, desc->struct_size, sizeof(kiln_library));
        return NULL;
    }
    hl_library *lib = calloc(1, sizeof *lib);
    if (!lib) abort();
    memcpy(&lib->view, desc, sizeof(kiln_library));
    lib->path = hmem_strdup(path);
    char stem[256];
    hl_lib_stem(path, stem, sizeof stem);
    lib->stem = hmem_strdup(stem);
    lib->origin = origin;
    lib->dev = st->st_dev;
    lib->ino = st->st_ino;
    lib->handle = h;
    const kiln_library *v = &lib->view;
    const char *lname = v->library_name ? v->library_name : "?";
    int bad = 0;
    if (v->abi_major != KILN_ABI_MAJOR) {
        ht_errorf(err, "%s: ABI major %u not supported (host supports %d); rebuild against the kiln SDK %d.x",
                 path, v->abi_major, KILN_ABI_MAJOR, KILN_ABI_MAJOR);
        bad = 1;
    } else if (v->min_host_minor > KILN_ABI_MINOR) {
        ht_errorf(err,
             "%s (%s %s) requires host ABI >= %d.%u; this host provides %d.%d (kiln %s); upgrade kiln or use a "
             "build of the plugin for ABI <= %d.%d",
             path, lname, v->library_version ? v->library_version : "?", KILN_ABI_MAJOR, v->min_host_minor,
             KILN_ABI_MAJOR, KILN_ABI_MINOR, host->host_version, KILN_ABI_MAJOR, KILN_ABI_MINOR);
        bad = 1;
    } else if (v->min_host_minor > v->abi_minor) {
        ht_errorf(err, "%s: min_host_minor %u is newer than the ABI minor %u it was built with", path,
                 v->min_host_minor, v->abi_minor);
        bad = 1;
    } else if (!v->library_name || !hl_valid_plugin_name(v->library_name)) {
        ht_errorf(err, "%s: library name '%s' invalid, expected [a-z0-9][a-z0-9._-]{0,63}", path,
                 v->library_name ? v->library_name : "(null)");
        bad = 1;
    } else if (!v->library_version || !*v->library_version) {
        ht_errorf(err, "%s: library '%s' has no version", path, lname);
        bad = 1;
    } else if (v->plugin_count == 0 || v->plugin_count > HL_MAX_PLUGINS_PER_LIB || !v->plugins) {
        ht_errorf(err, "%s: library '%s' lists %u plugins, expected 1 to %d", path, lname, v->plugin_count,
                 HL_MAX_PLUGINS_PER_LIB);
        bad = 1;
    }
    if (bad) {
        free(lib->path);
        free(lib->stem);
        free(lib);
        return NULL;
    }
    lib->plugins = calloc(v->plugin_count, sizeof(hl_plugin));
    if (!lib->plugins) abort();
    ht_error line = {0}; /* a plugin refused: a note, the library may go on */
    for (uint32_t i = 0; i < v->plugin_count; i++) {
        int r = validate_desc(lib, v->plugins[i], i, &lib->plugins[lib->nplugins], &line);
        if (r == 0) {
            /* The same kind+name twice inside one library is a build mistake. */
            hl_plugin *np = &lib->plugins[lib->nplugins];
            int dup = 0;
            for (int j = 0; j < lib->nplugins; j++)
                if (lib->plugins[j].view.kind == np->view.kind && !strcmp(lib->plugins[j].view.name, np->view.name))
                    dup = 1;
            if (dup) {
                ht_errorf(&line, "%s: %s '%s' listed twice in one library", path, hl_kind_name(np->view.kind),
                          np->view.name);
                note(ns, 0, line.msg);
                continue;
            }
            lib->nplugins++;
        } else
            note(ns, r > 0, line.msg);
    }
    if (lib->nplugins == 0) {
        ht_errorf(err, "%s: no usable plugin in library '%s'%s%s", path, lname, ns->c->reason ? ": " : "",
                 ns->c->reason ? ns->c->reason : "");
        free(lib->plugins);
        free(lib->path);
        free(lib->stem);
        free(lib);
        return NULL;
    }
    hlog_loader("loaded %s (%s %s, built ABI %u.%u, host %d.%d): %d plugin(s)", path, lname,
             v->library_version, v->abi_major, v->abi_minor, KILN_ABI_MAJOR, KILN_ABI_MINOR, lib->nplugins);
    return lib;
}

/* ---------------------------------------------------------------------------
 * Probe records: what a library offers, as the registry needs it, without
 * its code in this process. */

static void free_probe(hl_probe *p) {
    if (!p) return;
    for (int i = 0; i < p->nplugins; i++) {
        free(p->plugins[i].name);
        free(p->plugins[i].version);
        for (uint32_t a = 0; a < p->plugins[i].naliases; a++) free(p->plugins[i].aliases[a]);
        free(p->plugins[i].aliases);
    }
    free(p->plugins);
    free(p->path);
    free(p->stem);
    free(p->libname);
    free(p->libversion);
    free(p);
}

static hl_probe *new_probe(const char *path, int origin, const struct stat *st) {
    hl_probe *p = calloc(1, sizeof *p);
    if (!p) abort();
    p->path = hmem_strdup(path);
    char stem[256];
    hl_lib_stem(path, stem, sizeof stem);
    p->stem = hmem_strdup(stem);
    p->origin = origin;
    p->dev = st->st_dev;
    p->ino = st->st_ino;
    p->size = st->st_size;
    p->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    p->cand = -1;
    return p;
}

static hl_pmeta *probe_add_plugin(hl_probe *p) {
    p->plugins = hmem_realloc(p->plugins, sizeof(hl_pmeta) * (size_t)(p->nplugins + 1));
    hl_pmeta *m = &p->plugins[p->nplugins++];
    memset(m, 0, sizeof *m);
    return m;
}

static void pmeta_add_alias(hl_pmeta *m, const char *a) {
    m->aliases = hmem_realloc(m->aliases, sizeof(char *) * (m->naliases + 1));
    m->aliases[m->naliases++] = hmem_strdup(a);
}

/* The record of an in-process library (hl_load_file, and the child). */
static void probe_fill_from_lib(hl_probe *p, const hl_library *lib) {
    p->libname = hmem_strdup(lib->view.library_name);
    p->libversion = hmem_strdup(lib->view.library_version);
    p->abi_major = lib->view.abi_major;
    p->abi_minor = lib->view.abi_minor;
    for (int j = 0; j < lib->nplugins; j++) {
        const hl_plugin *q = &lib->plugins[j];
        hl_pmeta *m = probe_add_plugin(p);
        m->kind = q->view.kind;
        m->name = hmem_strdup(q->view.name);
        m->version = hmem_strdup(q->view.version);
        for (uint32_t a = 0; a < q->naliases; a++) pmeta_add_alias(m, q->aliases[a]);
        const kiln_value *d = hl_prop(q, "default");
        m->is_default = d && d->type == KILN_TYPE_BOOL && d->v.i;
    }
}

/* The wire form, child to parent: fields "<tag><length>:<bytes>", ending
 * with "K2:ok". The marker is what proves the probe finished: a child that
 * exits (even with status 0) or dies before it sent nothing trustworthy. */
typedef struct wbuf { char *p; size_t n, cap; } wbuf;

static void wput(wbuf *b, char tag, const char *s, size_t len) {
    char head[32];
    int hn = snprintf(head, sizeof head, "%c%zu:", tag, len);
    if (b->n + (size_t)hn + len > b->cap) {
        b->cap = (b->n + (size_t)hn + len) * 2 + 256;
        b->p = hmem_realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, head, (size_t)hn);
    memcpy(b->p + b->n + hn, s, len);
    b->n += (size_t)hn + len;
}

static void wputs(wbuf *b, char tag, const char *s) { wput(b, tag, s, strlen(s)); }

static void wputu(wbuf *b, char tag, unsigned long long v) {
    char t[32];
    snprintf(t, sizeof t, "%llu", v);
    wputs(b, tag, t);
}

/* Parse a record into p (ok) or a refusal reason (*reason, malloc'd).
 * 0 when well formed and finished by the marker, else -1. */
static int parse_record(const char *buf, size_t len, hl_probe *p, char **reason, char **notes, char **sevs) {
    size_t i = 0;
    hl_pmeta *m = NULL;
    int done = 0;
    *reason = *notes = *sevs = NULL;
    while (i < len && !done) {
        char tag = buf[i++];
        size_t n = 0, digits = 0;
        while (i < len && buf[i] >= '0' && buf[i] <= '9' && digits < 10) n = n * 10 + (size_t)(buf[i++] - '0'), digits++;
        if (!digits || i >= len || buf[i] != ':' || n > len - i - 1) return -1;
        i++;
        char *s = malloc(n + 1);
        if (!s) abort();
        memcpy(s, buf + i, n);
        s[n] = 0;
        i += n;
        if (strlen(s) != n) { free(s); return -1; } /* no NUL inside a field */
        unsigned long long u = strtoull(s, NULL, 10);
        switch (tag) {
        case 'R': free(*reason); *reason = s; s = NULL; break;
        case 'N': free(p->libname); p->libname = s; s = NULL; break;
        case 'V': free(p->libversion); p->libversion = s; s = NULL; break;
        case 'M': p->abi_major = (uint32_t)u; break;
        case 'm': p->abi_minor = (uint32_t)u; break;
        case 'P': m = probe_add_plugin(p); m->kind = (uint32_t)u; break;
        case 'n': if (!m) { free(s); return -1; } free(m->name); m->name = s; s = NULL; break;
        case 'v': if (!m) { free(s); return -1; } free(m->version); m->version = s; s = NULL; break;
        case 'a': if (!m) { free(s); return -1; } pmeta_add_alias(m, s); break;
        case 'd': if (!m) { free(s); return -1; } m->is_default = u != 0; break;
        case 'T': free(*notes); *notes = s; s = NULL; break;
        case 'S': free(*sevs); *sevs = s; s = NULL; break;
        case 'K': done = !strcmp(s, "ok"); break;
        default: free(s); return -1;
        }
        free(s);
        if (tag == 'K' && !done) return -1;
    }
    if (!done || i != len) return -1;
    if (*reason) return 0;
    if (!p->libname || !p->libversion || p->nplugins == 0) return -1;
    for (int k = 0; k < p->nplugins; k++)
        if (!p->plugins[k].name || !p->plugins[k].version || !hl_valid_plugin_name(p->plugins[k].name) ||
            !hl_kind_name(p->plugins[k].kind))
            return -1;
    return 0;
}

/* In the child: load the library here and send what it offers. Never
 * returns. Its output goes nowhere (the library runs again in the parent
 * if used, and prints there) unless loader tracing is on. */
static void __attribute__((noreturn)) probe_child(const kiln_host_base *host, int wfd, const char *path,
                                                  const char *real, const struct stat *st, int origin) {
    if (!hlog_loader_debug()) {
        int nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (nul >= 0) { dup2(nul, 1); dup2(nul, 2); close(nul); }
    }
    hl_candidate c;
    memset(&c, 0, sizeof c);
    note_sink ns = {.c = &c, .quiet = 1};
    ht_error err = {0};
    hl_library *lib = load_lib(host, path, real, st, origin, &ns, &err);
    wbuf b = {0};
    if (!lib) wputs(&b, 'R', err.msg);
    else {
        wputs(&b, 'N', lib->view.library_name);
        wputs(&b, 'V', lib->view.library_version);
        wputu(&b, 'M', lib->view.abi_major);
        wputu(&b, 'm', lib->view.abi_minor);
        for (int j = 0; j < lib->nplugins; j++) {
            const hl_plugin *q = &lib->plugins[j];
            wputu(&b, 'P', q->view.kind);
            wputs(&b, 'n', q->view.name);
            wputs(&b, 'v', q->view.version);
            for (uint32_t a = 0; a < q->naliases; a++) wputs(&b, 'a', q->aliases[a]);
            const kiln_value *d = hl_prop(q, "default");
            wputu(&b, 'd', d && d->type == KILN_TYPE_BOOL && d->v.i);
        }
    }
    if (c.reason) { wputs(&b, 'T', c.reason); wputs(&b, 'S', ns.sev); }
    wputs(&b, 'K', "ok");
    const char *p = b.p;
    size_t n = b.n;
    while (n) {
        ssize_t w = write(wfd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        p += w;
        n -= (size_t)w;
    }
    _exit(0);
}

/* ---------------------------------------------------------------------------
 * Probing in child processes */

#define HL_PROBE_DEFAULT_TIMEOUT 10.0
#define HL_PROBE_MAX_PARALLEL 16

int hl_probe_timeout(double *seconds, ht_error *err) {
    *seconds = HL_PROBE_DEFAULT_TIMEOUT;
    const char *e = getenv("KILN_PLUGIN_PROBE_TIMEOUT");
    if (!e || !*e) return 0;
    char *end = NULL;
    errno = 0;
    double v = strtod(e, &end);
    if (errno || end == e || *end || !(v > 0) || v > 86400) {
        ht_errorf(err, "KILN_PLUGIN_PROBE_TIMEOUT: expected seconds > 0 and <= 86400 (e.g. 10 or 2.5), found '%s'",
                  e);
        return -1;
    }
    *seconds = v;
    return 0;
}

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int hl_check_env(ht_error *err) {
    double t;
    if (hl_probe_timeout(&t, err)) return -1;
    const char *e = getenv("KILN_PLUGIN_CACHE");
    if (e && *e && strcmp(e, "off") != 0 && e[0] != '/') {
        ht_errorf(err, "KILN_PLUGIN_CACHE: expected an absolute file path or 'off', found '%s'", e);
        return -1;
    }
    return 0;
}

typedef struct probe_job {
    int cand;           /* index in L->cands */
    int origin;
    char real[PATH_MAX];
    struct stat st;
    pid_t pid;
    int fd;             /* read end; -1 at EOF */
    char *buf;
    size_t len, cap;
    int cached, started, finished, status, timed_out, overflow;
    double deadline;
} probe_job;

/* Turn a finished job (or a cached result) into a probe or a refusal. */
static void probe_settle(hl_loader *L, int cand, int origin, const struct stat *st, int ok, const char *data,
                         size_t len) {
    hl_candidate *c = &L->cands[cand];
    if (!ok) {
        char why[2048];
        snprintf(why, sizeof why, "%s: %s", c->path, data);
        c->status = HL_CAND_REFUSED;
        free(c->reason);
        c->reason = hmem_strdup(why);
        HLOG_WARN("%s", why);
        return;
    }
    hl_probe *p = new_probe(c->path, origin, st);
    char *reason = NULL, *notes = NULL, *sevs = NULL;
    if (parse_record(data, len, p, &reason, &notes, &sevs) != 0) {
        /* cannot happen with our own child; never trust it anyway */
        c->status = HL_CAND_REFUSED;
        free(c->reason);
        char why[PATH_MAX + 128];
        snprintf(why, sizeof why, "%s: its probe sent an unreadable report; not used", c->path);
        c->reason = hmem_strdup(why);
        HLOG_WARN("%s", why);
        free_probe(p);
        free(reason);
        free(notes);
        free(sevs);
        return;
    }
    /* the notes on single descriptors, logged once here as a load did */
    if (notes) {
        char *save = NULL;
        int k = 0;
        for (char *ln = strtok_r(notes, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save), k++) {
            if (!reason) cand_append_reason(c, ln);
            if (sevs && sevs[k] == 'I') HLOG_INFO("%s", ln);
            else HLOG_WARN("%s", ln);
        }
    }
    if (reason) {
        c->status = HL_CAND_REFUSED;
        free(c->reason);
        c->reason = reason;
        reason = NULL;
        HLOG_DEBUG("%s", c->reason);
        free_probe(p);
    } else {
        c->status = HL_CAND_LOADED;
        p->cand = cand;
        L->probes = hmem_realloc(L->probes, sizeof(hl_probe *) * (size_t)(L->nprobes + 1));
        L->probes[L->nprobes++] = p;
        hlog_loader("probed %s (%s %s, ABI %u.%u): %d plugin(s)", c->path, p->libname, p->libversion, p->abi_major,
                    p->abi_minor, p->nplugins);
    }
    free(reason);
    free(notes);
    free(sevs);
}

static void job_start(probe_job *j, const hl_loader *L) {
    j->started = 1;
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        j->finished = 1;
        j->status = -errno;
        j->fd = -1;
        return;
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(pfd[0]);
        close(pfd[1]);
        j->finished = 1;
        j->status = -e;
        j->fd = -1;
        return;
    }
    if (pid == 0) {
        close(pfd[0]);
        probe_child(L->host, pfd[1], L->cands[j->cand].path, j->real, &j->st, j->origin);
    }
    close(pfd[1]);
    j->pid = pid;
    j->fd = pfd[0];
}

/* Run every job, HL_PROBE_MAX_PARALLEL at a time, each within the timeout. */
static void run_jobs(hl_loader *L, probe_job *jobs, int n, double timeout) {
    /* buffered output must not be written twice by a child that exit()s */
    fflush(NULL);
    int next = 0, running = 0;
    struct pollfd *pf = calloc((size_t)(n ? n : 1), sizeof *pf);
    int *map = calloc((size_t)(n ? n : 1), sizeof *map);
    if (!pf || !map) abort();
    while (next < n || running) {
        while (next < n && running < HL_PROBE_MAX_PARALLEL) {
            probe_job *j = &jobs[next++];
            if (j->cached) continue;
            job_start(j, L);
            if (!j->finished) {
                j->deadline = mono_now() + timeout;
                running++;
            }
        }
        if (!running) continue;
        int np = 0, reap_soon = 0;
        double now = mono_now(), wait_s = timeout;
        for (int i = 0; i < next; i++) {
            probe_job *j = &jobs[i];
            if (!j->started || j->finished) continue;
            if (j->fd >= 0) {
                pf[np].fd = j->fd;
                pf[np].events = POLLIN;
                map[np++] = i;
            } else
                reap_soon = 1; /* EOF seen: the child is exiting */
            if (j->deadline - now < wait_s) wait_s = j->deadline - now;
        }
        int ms = wait_s <= 0 ? 0 : (int)(wait_s * 1000) + 1;
        if (reap_soon && ms > 1) ms = 1;
        if (ms > 100) ms = 100; /* also notices a child that exited but whose pipe a grandchild holds */
        int pr = poll(pf, (nfds_t)np, ms);
        for (int k = 0; pr > 0 && k < np; k++) {
            if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            probe_job *j = &jobs[map[k]];
            if (j->cap - j->len < 4096) {
                j->cap = j->cap ? j->cap * 2 : 8192;
                j->buf = hmem_realloc(j->buf, j->cap);
            }
            ssize_t r = read(j->fd, j->buf + j->len, j->cap - j->len);
            if (r > 0) {
                j->len += (size_t)r;
                if (j->len > HL_PROBE_MAX_RECORD) { j->overflow = 1; close(j->fd); j->fd = -1; }
            } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
                close(j->fd);
                j->fd = -1;
            }
        }
        now = mono_now();
        for (int i = 0; i < next; i++) {
            probe_job *j = &jobs[i];
            if (!j->started || j->finished) continue;
            int st = 0;
            pid_t w = waitpid(j->pid, &st, WNOHANG);
            if (w == j->pid) {
                /* exited: drain what is already in the pipe, without
                 * waiting for an EOF a grandchild could withhold */
                if (j->fd >= 0) {
                    int fl = fcntl(j->fd, F_GETFL);
                    if (fl >= 0) fcntl(j->fd, F_SETFL, fl | O_NONBLOCK);
                    for (;;) {
                        if (j->cap - j->len < 4096) {
                            j->cap = j->cap ? j->cap * 2 : 8192;
                            j->buf = hmem_realloc(j->buf, j->cap);
                        }
                        ssize_t r = read(j->fd, j->buf + j->len, j->cap - j->len);
                        if (r <= 0 || (j->len += (size_t)r) > HL_PROBE_MAX_RECORD) break;
                    }
                    close(j->fd);
                    j->fd = -1;
                }
                j->status = st;
                j->finished = 1;
                running--;
            } else if (now >= j->deadline) {
                kill(j->pid, SIGKILL);
                while (waitpid(j->pid, &st, 0) < 0 && errno == EINTR) {}
                if (j->fd >= 0) { close(j->fd); j->fd = -1; }
                j->timed_out = 1;
                j->finished = 1;
                running--;
            }
        }
    }
    free(pf);
    free(map);
}

/* What a finished job amounts to: a record (ok) or a refusal text. */
static int job_verdict(const probe_job *j, double timeout, char *text, size_t textlen) {
    if (j->timed_out) {
        snprintf(text, textlen,
                 "did not finish loading and initialising within %g s (KILN_PLUGIN_PROBE_TIMEOUT), so it was stopped; "
                 "not used",
                 timeout);
        return 0;
    }
    if (!j->pid) {
        snprintf(text, textlen, "cannot be probed: %s", strerror(-j->status));
        return 0;
    }
    int marked = !j->overflow && j->len >= 5 && !memcmp(j->buf + j->len - 5, "K2:ok", 5);
    if (marked) return 1;
    if (WIFSIGNALED(j->status))
        snprintf(text, textlen, "crashed while being loaded and initialised (signal %d, %s); not used",
                 WTERMSIG(j->status), strsignal(WTERMSIG(j->status)));
    else if (j->overflow)
        snprintf(text, textlen, "its probe sent more than %u bytes; not used", HL_PROBE_MAX_RECORD);
    else
        snprintf(text, textlen,
                 "exited the process (status %d) while being loaded and initialised, before it finished; a plugin "
                 "must never exit(); not used",
                 WIFEXITED(j->status) ? WEXITSTATUS(j->status) : -1);
    return 0;
}

/* ---------------------------------------------------------------------------
 * Discovery */

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int same_file_seen(hl_loader *L, const probe_job *jobs, int njobs, const struct stat *st, const char **other) {
    for (int i = 0; i < L->nprobes; i++)
        if (L->probes[i]->dev == st->st_dev && L->probes[i]->ino == st->st_ino) { *other = L->probes[i]->path; return 1; }
    for (int i = 0; i < njobs; i++)
        if (jobs[i].st.st_dev == st->st_dev && jobs[i].st.st_ino == st->st_ino) {
            *other = L->cands[jobs[i].cand].path;
            return 1;
        }
    return 0;
}

void hl_discover(hl_loader *L) {
    ht_error err = {0};
    double timeout;
    if (hl_probe_timeout(&timeout, &err)) {
        HLOG_WARN("%s; using %g s", err.msg, HL_PROBE_DEFAULT_TIMEOUT);
        timeout = HL_PROBE_DEFAULT_TIMEOUT;
    }
    probe_job *jobs = NULL;
    int njobs = 0;
    for (int d = 0; d < L->ndirs; d++) {
        const char *dir = L->dirs[d];
        if (hl_vet_dir(dir, L->allow_symlinks, &err)) {
            /* A missing built-in or env directory is not worth a warning. */
            struct stat st;
            int missing = dir[0] == '/' && lstat(dir, &st) != 0 && errno == ENOENT;
            add_cand(L, dir, 1, missing ? HL_CAND_SKIPPED : HL_CAND_REFUSED, err.msg);
            if (!missing) HLOG_WARN("refusing plugin directory %s", err.msg);
            continue;
        }
        add_cand(L, dir, 1, HL_CAND_LOADED, NULL);
        DIR *dh = opendir(dir);
        if (!dh) continue;
        char **names = NULL;
        int nn = 0;
        struct dirent *e;
        while ((e = readdir(dh))) {
            if (e->d_name[0] == '.') continue;
            if (fnmatch("libkiln-*.so", e->d_name, 0) != 0) continue;
            names = hmem_realloc(names, sizeof(char *) * (size_t)(nn + 1));
            names[nn++] = hmem_strdup(e->d_name);
        }
        closedir(dh);
        /* Sorted, so search order (and conflict resolution) is deterministic. */
        if (nn > 1) qsort(names, (size_t)nn, sizeof(char *), name_cmp);
        for (int i = 0; i < nn; i++) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            free(names[i]);
            char real[PATH_MAX];
            struct stat st;
            if (vet_open(L, path, real, &st, &err)) {
                add_cand(L, path, 0, HL_CAND_REFUSED, err.msg);
                HLOG_DEBUG("%s", err.msg);
                continue;
            }
            const char *other;
            if (same_file_seen(L, jobs, njobs, &st, &other)) {
                ht_errorf(&err, "%s: same file as %s; loaded once", path, other);
                add_cand(L, path, 0, HL_CAND_SKIPPED, err.msg);
                continue;
            }
            add_cand(L, path, 0, HL_CAND_REFUSED, NULL); /* settled below */
            jobs = hmem_realloc(jobs, sizeof *jobs * (size_t)(njobs + 1));
            probe_job *j = &jobs[njobs++];
            memset(j, 0, sizeof *j);
            j->cand = L->ncands - 1;
            j->origin = L->dir_origin[d];
            snprintf(j->real, sizeof j->real, "%s", real);
            j->st = st;
            j->fd = -1;
        }
        free(names);
    }
    /* cached results need no child */
    for (int i = 0; i < njobs; i++)
        if (hl_cache_find(jobs[i].real, &jobs[i].st)) {
            jobs[i].cached = 1;
            hlog_loader("probe of %s: from the cache", L->cands[jobs[i].cand].path);
        }
    run_jobs(L, jobs, njobs, timeout);
    /* settled in search order: the order probes enter the registry */
    for (int i = 0; i < njobs; i++) {
        probe_job *j = &jobs[i];
        if (!j->cached) {
            char text[1024];
            int ok = job_verdict(j, timeout, text, sizeof text);
            if (ok) hl_cache_put(j->real, &j->st, 1, j->buf, j->len);
            else if (!j->timed_out && j->pid) hl_cache_put(j->real, &j->st, 0, text, strlen(text));
            else {
                /* a timeout or a failed fork may not recur: not cached */
                probe_settle(L, j->cand, j->origin, &j->st, 0, text, strlen(text));
                free(j->buf);
                continue;
            }
            free(j->buf);
        }
        hl_cache_ent *e = hl_cache_find(j->real, &j->st);
        probe_settle(L, j->cand, j->origin, &j->st, e->ok, e->data, e->len);
    }
    free(jobs);
    hl_cache_save();
    hl_registry_build(L);
}

/* Bring a probed library into this process. 0, or -1 with err (and the
 * probe marked failed, its candidate refused). */
int hl_probe_load(hl_loader *L, hl_probe *p, ht_error *err) {
    if (p->lib) return 0;
    if (p->failed) {
        ht_errorf(err, "%s", p->cand >= 0 && L->cands[p->cand].reason ? L->cands[p->cand].reason : p->path);
        return -1;
    }
    char real[PATH_MAX];
    struct stat st;
    hl_candidate scratch;
    memset(&scratch, 0, sizeof scratch);
    note_sink ns = {.c = &scratch, .quiet = 1}; /* the probe logged the notes */
    hl_library *lib = NULL;
    if (vet_open(L, p->path, real, &st, err) == 0) {
        int64_t mt = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        if (st.st_dev != p->dev || st.st_ino != p->ino || st.st_size != p->size || mt != p->mtime_ns)
            ht_errorf(err, "%s: changed since it was probed; refusing it (run the command again)", p->path);
        else
            lib = load_lib(L->host, p->path, real, &st, p->origin, &ns, err);
    }
    free(scratch.reason);
    if (lib) hlog_loader("loaded into this process: %s", p->path);
    if (lib) {
        /* what runs here must be what the probe saw */
        int same = lib->nplugins == p->nplugins;
        for (int i = 0; same && i < p->nplugins; i++)
            same = lib->plugins[i].view.kind == p->plugins[i].kind && !strcmp(lib->plugins[i].view.name, p->plugins[i].name);
        if (!same) {
            ht_errorf(err, "%s: offers other plugins in this process than in its probe; refusing it", p->path);
            free(lib->plugins);
            free(lib->path);
            free(lib->stem);
            free(lib);
            lib = NULL;
        }
    }
    if (!lib) {
        p->failed = 1;
        if (p->cand >= 0) {
            hl_candidate *c = &L->cands[p->cand];
            c->status = HL_CAND_REFUSED;
            free(c->reason);
            c->reason = hmem_strdup(err->msg);
        }
        return -1;
    }
    p->lib = lib;
    if (p->cand >= 0) L->cands[p->cand].lib = lib;
    L->libs = hmem_realloc(L->libs, sizeof(hl_library *) * (size_t)(L->nlibs + 1));
    L->libs[L->nlibs++] = lib;
    return 0;
}

int hl_load_all(hl_loader *L) {
    ht_error err = {0};
    int failed = 0;
    for (int i = 0; i < L->nprobes; i++) {
        hl_probe *p = L->probes[i];
        if (p->lib || p->failed) continue;
        if (hl_probe_load(L, p, &err)) {
            HLOG_WARN("%s", err.msg);
            failed++;
        }
    }
    if (failed) hl_registry_build(L);
    return failed ? -1 : 0;
}

void hl_scan(hl_loader *L) {
    hl_discover(L);
    hl_load_all(L);
}

int hl_load_file(hl_loader *L, const char *path, int origin, ht_error *err) {
    char real[PATH_MAX];
    struct stat st;
    if (vet_open(L, path, real, &st, err)) {
        add_cand(L, path, 0, HL_CAND_REFUSED, err->msg);
        return -1;
    }
    for (int i = 0; i < L->nlibs; i++)
        if (L->libs[i]->dev == st.st_dev && L->libs[i]->ino == st.st_ino) {
            ht_errorf(err, "%s: same file as %s; loaded once", path, L->libs[i]->path);
            add_cand(L, path, 0, HL_CAND_SKIPPED, err->msg);
            return 1;
        }
    hl_candidate *c = add_cand(L, path, 0, HL_CAND_LOADED, NULL);
    int ci = L->ncands - 1;
    note_sink ns = {.c = c, .quiet = 0};
    hl_library *lib = load_lib(L->host, path, real, &st, origin, &ns, err);
    c = &L->cands[ci];
    if (!lib) {
        c->status = HL_CAND_REFUSED;
        if (!c->reason) c->reason = hmem_strdup(err->msg);
        return -1;
    }
    c->lib = lib;
    hl_probe *p = new_probe(path, origin, &st);
    probe_fill_from_lib(p, lib);
    p->lib = lib;
    p->cand = ci;
    L->probes = hmem_realloc(L->probes, sizeof(hl_probe *) * (size_t)(L->nprobes + 1));
    L->probes[L->nprobes++] = p;
    L->libs = hmem_realloc(L->libs, sizeof(hl_library *) * (size_t)(L->nlibs + 1));
    L->libs[L->nlibs++] = lib;
    return 0;
}

void hl_shutdown(hl_loader *L) {
    for (int i = L->nlibs - 1; i >= 0; i--) {
        hl_library *lib = L->libs[i];
        if (lib->view.library_fini) {
            lib->view.library_fini();
            lib->view.library_fini = NULL;
        }
    }
}

void hl_loader_free(hl_loader *L) {
    for (int i = 0; i < L->ncands; i++) {
        free(L->cands[i].path);
        free(L->cands[i].reason);
    }
    for (int i = 0; i < L->nlibs; i++) {
        free(L->libs[i]->plugins);
        free(L->libs[i]->path);
        free(L->libs[i]->stem);
        free(L->libs[i]);
    }
    for (int i = 0; i < L->nprobes; i++) free_probe(L->probes[i]);
    for (int i = 0; i < L->ndirs; i++) free(L->dirs[i]);
    for (int i = 0; i < L->nwarnings; i++) free(L->warnings[i]);
    free(L->warnings);
    free(L->dirs);
    free(L->dir_origin);
    free(L->cands);
    free(L->libs);
    free(L->probes);
    free(L->reg);
    memset(L, 0, sizeof *L);
}
