/*
 * host/loader.c — finds, vets, dlopen()s and validates plugin libraries, and
 * builds the registry. The checks follow docs/abi.md: directories and files
 * must be owned by root or the effective user and not group/world-writable
 * (ancestors too, except a root-owned sticky directory such as /tmp); symlinks
 * and setuid files are refused; the file is opened O_NOFOLLOW, re-checked on
 * its descriptor, and the inode mapped is compared with the one vetted;
 * dlopen(RTLD_NOW|RTLD_LOCAL|RTLD_NODELETE) and never dlclose(). Everything a
 * library returns is validated before use; each refusal is one line naming
 * the file, what was expected and what was found.
 */
#define _GNU_SOURCE
#include "loader.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "version.h"

#define HL_MAX_PLUGINS_PER_LIB 256
#define HL_MAX_PARAMS 256

/* ---------------------------------------------------------------------------
 * Small helpers */

static char *xstrdup(const char *s) {
    char *d = strdup(s ? s : "");
    if (!d) { HLOG_ERROR("out of memory"); abort(); }
    return d;
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q && n) { HLOG_ERROR("out of memory"); abort(); }
    return q;
}


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
    L->cands = xrealloc(L->cands, sizeof(*L->cands) * (size_t)(L->ncands + 1));
    hl_candidate *c = &L->cands[L->ncands++];
    memset(c, 0, sizeof *c);
    c->path = xstrdup(path);
    c->is_dir = is_dir;
    c->status = status;
    c->reason = reason ? xstrdup(reason) : NULL;
    return c;
}

static void cand_append_reason(hl_candidate *c, const char *line) {
    size_t a = c->reason ? strlen(c->reason) : 0, b = strlen(line);
    c->reason = xrealloc(c->reason, a + b + 2);
    if (a) c->reason[a++] = '\n';
    memcpy(c->reason + a, line, b + 1);
}

/* ---------------------------------------------------------------------------
 * Vetting */

/* Owner and mode rules shared by files and directories. */
static int vet_owner_mode(const char *path, const struct stat *st, const char *what, char *why, size_t whylen) {
    uid_t me = geteuid();
    if (st->st_uid != 0 && st->st_uid != me) {
        hwhyf(why, whylen, "%s: %s owned by uid %u, expected root or uid %u", path, what, (unsigned)st->st_uid,
             (unsigned)me);
        return -1;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        hwhyf(why, whylen, "%s: %s is %s-writable (mode %04o), expected writable by its owner only", path, what,
             (st->st_mode & S_IWOTH) ? "world" : "group", (unsigned)(st->st_mode & 07777));
        return -1;
    }
    return 0;
}

/* Every ancestor of `real` (an absolute, resolved path) must not be writable
 * by others, except a root-owned sticky directory like /tmp, where nobody but
 * the owner can rename or replace what is inside. */
static int vet_ancestors(const char *real, char *why, size_t whylen) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", real);
    for (;;) {
        char *slash = strrchr(buf, '/');
        if (!slash) break;
        if (slash == buf) slash[1] = 0; else *slash = 0;
        struct stat st;
        if (stat(buf, &st) != 0) {
            hwhyf(why, whylen, "%s: cannot stat ancestor directory %s: %s", real, buf, strerror(errno));
            return -1;
        }
        int sticky_root = (st.st_mode & S_ISVTX) && st.st_uid == 0;
        if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !sticky_root) {
            hwhyf(why, whylen, "%s: ancestor directory %s is %s-writable (mode %04o), expected not writable by others",
                 real, buf, (st.st_mode & S_IWOTH) ? "world" : "group", (unsigned)(st.st_mode & 07777));
            return -1;
        }
        if (st.st_uid != 0 && st.st_uid != geteuid()) {
            hwhyf(why, whylen, "%s: ancestor directory %s owned by uid %u, expected root or uid %u", real, buf,
                 (unsigned)st.st_uid, (unsigned)geteuid());
            return -1;
        }
        if (strcmp(buf, "/") == 0) break;
    }
    return 0;
}

int hl_vet_dir(const char *dir, int allow_symlinks, char *why, size_t whylen) {
    if (!dir || dir[0] != '/') {
        hwhyf(why, whylen, "%s: plugin directory must be an absolute path, found a relative one", dir ? dir : "(null)");
        return -1;
    }
    struct stat st;
    if (lstat(dir, &st) != 0) {
        hwhyf(why, whylen, "%s: cannot access plugin directory: %s", dir, strerror(errno));
        return -1;
    }
    if (S_ISLNK(st.st_mode) && !allow_symlinks) {
        hwhyf(why, whylen, "%s: plugin directory is a symlink (set plugins.allow_symlinks = true to follow)", dir);
        return -1;
    }
    char real[PATH_MAX];
    if (!realpath(dir, real) || stat(real, &st) != 0) {
        hwhyf(why, whylen, "%s: cannot resolve plugin directory: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        hwhyf(why, whylen, "%s: expected a directory, found another kind of file", dir);
        return -1;
    }
    if (vet_owner_mode(dir, &st, "plugin directory", why, whylen)) return -1;
    return vet_ancestors(real, why, whylen);
}

int hl_vet_file(const char *path, int allow_symlinks, char *why, size_t whylen) {
    if (!path || path[0] != '/') {
        hwhyf(why, whylen, "%s: plugin path must be absolute", path ? path : "(null)");
        return -1;
    }
    struct stat st;
    if (lstat(path, &st) != 0) {
        hwhyf(why, whylen, "%s: cannot access: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISLNK(st.st_mode)) {
        if (!allow_symlinks) {
            hwhyf(why, whylen, "%s: is a symlink, expected a regular file (set plugins.allow_symlinks = true to follow)",
                 path);
            return -1;
        }
        /* Following: every check applies to the target and its directory. */
        char real[PATH_MAX];
        if (!realpath(path, real)) {
            hwhyf(why, whylen, "%s: dangling symlink: %s", path, strerror(errno));
            return -1;
        }
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", real);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) *slash = 0;
        if (hl_vet_dir(dir, 0, why, whylen)) return -1;
        return hl_vet_file(real, 0, why, whylen);
    }
    if (!S_ISREG(st.st_mode)) {
        hwhyf(why, whylen, "%s: expected a regular file, found a %s", path,
             S_ISDIR(st.st_mode) ? "directory" : S_ISFIFO(st.st_mode) ? "FIFO" : "special file");
        return -1;
    }
    if (st.st_mode & (S_ISUID | S_ISGID)) {
        hwhyf(why, whylen, "%s: has the set%s bit (mode %04o), expected none", path,
             (st.st_mode & S_ISUID) ? "uid" : "gid", (unsigned)(st.st_mode & 07777));
        return -1;
    }
    return vet_owner_mode(path, &st, "plugin file", why, whylen);
}

/* ---------------------------------------------------------------------------
 * Directories */

void hl_loader_init(hl_loader *L) { memset(L, 0, sizeof *L); }

void hl_add_dir(hl_loader *L, const char *dir, int origin) {
    for (int i = 0; i < L->ndirs; i++)
        if (strcmp(L->dirs[i], dir) == 0) return;
    L->dirs = xrealloc(L->dirs, sizeof(char *) * (size_t)(L->ndirs + 1));
    L->dir_origin = xrealloc(L->dir_origin, sizeof(int) * (size_t)(L->ndirs + 1));
    L->dirs[L->ndirs] = xstrdup(dir);
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
        char *copy = xstrdup(env), *save = NULL;
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
    /* 1.2: compatibility (host/compat.c) */
    {"param_dtypes", KILN_TYPE_STRING_LIST}, {"repeated_closure", KILN_TYPE_BOOL},
    {"allows_repeated_closure", KILN_TYPE_BOOL}, {"automatic_optimization", KILN_TYPE_BOOL},
    {"default", KILN_TYPE_BOOL},
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
static int validate_desc(hl_library *lib, const kiln_plugin_desc *d, uint32_t idx, hl_plugin *out, char *why,
                         size_t whylen) {
    const char *path = lib->path;
    if (!d) {
        hwhyf(why, whylen, "%s: plugin descriptor %u is NULL, expected a descriptor", path, idx);
        return -1;
    }
    if (d->struct_size < sizeof(kiln_plugin_desc)) {
        hwhyf(why, whylen,
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
        hwhyf(why, whylen, "%s: plugin descriptor %u has kind 0, expected a KILN_KIND_* value", path, idx);
        return -1;
    }
    if (v->kind > KILN_KIND_MAX_KNOWN) {
        hwhyf(why, whylen, "%s: plugin '%s' has kind %u, unknown to host ABI %d.%d; skipped", path,
             v->name ? v->name : "?", v->kind, KILN_ABI_MAJOR, KILN_ABI_MINOR);
        return 1;
    }
    const char *kn = hl_kind_name(v->kind);
    if (!hl_valid_plugin_name(v->name)) {
        hwhyf(why, whylen, "%s: %s plugin %u has name '%s', expected [a-z0-9][a-z0-9._-]{0,63}", path, kn, idx,
             v->name ? v->name : "(null)");
        return -1;
    }
    if (!v->version || !*v->version) {
        hwhyf(why, whylen, "%s: %s '%s' has no version string", path, kn, v->name);
        return -1;
    }
    const kiln_ops_header *ops = v->ops;
    if (!ops) {
        hwhyf(why, whylen, "%s: %s '%s' has no ops table, expected one", path, kn, v->name);
        return -1;
    }
    if (ops->struct_size < sizeof(kiln_ops_header)) {
        hwhyf(why, whylen,
             "%s: %s '%s' ops table too small (struct_size %u < %zu required for ABI 1.0); built against a corrupt "
             "or mismatched header",
             path, kn, v->name, ops->struct_size, sizeof(kiln_ops_header));
        return -1;
    }
    if (!ops->create || !ops->destroy) {
        hwhyf(why, whylen, "%s: %s '%s' lacks mandatory op %s", path, kn, v->name, !ops->create ? "create" : "destroy");
        return -1;
    }
    out->ops = ops;
    /* Properties: known keys have fixed types. */
    int np = 0;
    for (const kiln_kv *p = v->properties; p && p->key; p++, np++) {
        if (np >= 256) {
            hwhyf(why, whylen, "%s: %s '%s' has more than 256 properties (unterminated list?)", path, kn, v->name);
            return -1;
        }
        if (!check_value_shape(&p->value)) {
            hwhyf(why, whylen, "%s: %s '%s' property '%s' is malformed (type %u, count %u)", path, kn, v->name, p->key,
                 p->value.type, p->value.count);
            return -1;
        }
        for (size_t k = 0; k < sizeof known_props / sizeof known_props[0]; k++) {
            if (strcmp(known_props[k].key, p->key) == 0 && known_props[k].type != p->value.type) {
                hwhyf(why, whylen, "%s: %s '%s' property '%s' must be a %s, found a %s", path, kn, v->name, p->key,
                     type_name(known_props[k].type), type_name(p->value.type));
                return -1;
            }
        }
        if (strcmp(p->key, "aliases") == 0) {
            for (uint32_t a = 0; a < p->value.count; a++)
                if (!hl_valid_plugin_name(p->value.v.sl[a])) {
                    hwhyf(why, whylen, "%s: %s '%s' alias '%s' is not a valid name", path, kn, v->name,
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
            hwhyf(why, whylen, "%s: %s '%s' declares more than %d config keys (unterminated list?)", path, kn, v->name,
                 HL_MAX_PARAMS);
            return -1;
        }
        if (!valid_param_key(q->key) || strcmp(q->key, "name") == 0) {
            hwhyf(why, whylen, "%s: %s '%s' declares config key '%s', expected [a-z][a-z0-9_]* other than 'name'",
                 path, kn, v->name, q->key);
            return -1;
        }
        if (q->type < KILN_TYPE_BOOL || q->type > KILN_TYPE_STRING_LIST) {
            hwhyf(why, whylen, "%s: %s '%s' config key '%s' has invalid type %u", path, kn, v->name, q->key, q->type);
            return -1;
        }
        int def_ok = q->def.type == KILN_TYPE_NONE || q->def.type == q->type ||
                     (q->type == KILN_TYPE_FLOAT && q->def.type == KILN_TYPE_INT);
        if (!def_ok || !check_value_shape(&q->def)) {
            hwhyf(why, whylen, "%s: %s '%s' config key '%s' is a %s but its default is a %s", path, kn, v->name,
                 q->key, type_name(q->type), type_name(q->def.type));
            return -1;
        }
        for (const kiln_param *r = v->params; r != q; r++)
            if (strcmp(r->key, q->key) == 0) {
                hwhyf(why, whylen, "%s: %s '%s' declares config key '%s' twice", path, kn, v->name, q->key);
                return -1;
            }
    }
    return 0;
}

static void lib_stem(const char *path, char *out, size_t n) {
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

int hl_load_file(hl_loader *L, const char *path, int origin, char *why, size_t whylen) {
    if (hl_vet_file(path, L->allow_symlinks, why, whylen)) {
        add_cand(L, path, 0, HL_CAND_REFUSED, why);
        return -1;
    }
    char real[PATH_MAX];
    if (!realpath(path, real)) {
        hwhyf(why, whylen, "%s: cannot resolve: %s", path, strerror(errno));
        add_cand(L, path, 0, HL_CAND_REFUSED, why);
        return -1;
    }
    int fd = open(real, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        hwhyf(why, whylen, "%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        add_cand(L, path, 0, HL_CAND_REFUSED, why);
        return -1;
    }
    /* Re-check on the descriptor: the file may have been swapped since. */
    if (!S_ISREG(st.st_mode) || (st.st_mode & (S_ISUID | S_ISGID)) ||
        vet_owner_mode(path, &st, "plugin file", why, whylen)) {
        if (S_ISREG(st.st_mode) && !(st.st_mode & (S_ISUID | S_ISGID))) { /* why already set */ }
        else hwhyf(why, whylen, "%s: changed while being checked", path);
        close(fd);
        add_cand(L, path, 0, HL_CAND_REFUSED, why);
        return -1;
    }
    for (int i = 0; i < L->nlibs; i++)
        if (L->libs[i]->dev == st.st_dev && L->libs[i]->ino == st.st_ino) {
            hwhyf(why, whylen, "%s: same file as %s; loaded once", path, L->libs[i]->path);
            close(fd);
            add_cand(L, path, 0, HL_CAND_SKIPPED, why);
            return 1;
        }
    /* dlopen by the resolved absolute path (never a search), then make sure
     * the file mapped is the inode that was vetted through the descriptor.
     * (Not /proc/self/fd/N: glibc recognises loaded objects by name first, so
     * a reused descriptor number would return an earlier library.) */
    hlog_loader("dlopen %s", real);
    dlerror();
    void *h = dlopen(real, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    struct stat st2;
    int swapped = h && (stat(real, &st2) != 0 || st2.st_dev != st.st_dev || st2.st_ino != st.st_ino);
    close(fd);
    if (!h) {
        const char *e = dlerror();
        e = e ? e : "unknown error";
        size_t rl = strlen(real);
        if (!strncmp(e, real, rl) && e[rl] == ':') e += rl + (e[rl + 1] == ' ' ? 2 : 1);
        hwhyf(why, whylen, "%s: cannot be loaded: %s%s", path, e, dlerror_hint(e));
        add_cand(L, path, 0, HL_CAND_REFUSED, why);
        return -1;
    }
    if (swapped) {
        hwhyf(why, whylen, "%s: was replaced while being loaded; refusing it", path);
        add_cand(L, path, 0, HL_CAND_REFUSED, why);
        return -1;
    }
    kiln_plugin_init_v1_fn init;
    *(void **)&init = dlsym(h, KILN_PLUGIN_ENTRY_V1);
    if (!init) {
        hwhyf(why, whylen, "%s: is not a kiln plugin: missing symbol %s", path, KILN_PLUGIN_ENTRY_V1);
        add_cand(L, path, 0, HL_CAND_REFUSED, why); /* left mapped: never dlclose */
        return -1;
    }
    const kiln_library *desc = NULL;
    herr_clear();
    int32_t rc = init(hs_host_base(), &desc);
    if (rc != KILN_OK) {
        hwhyf(why, whylen, "%s: failed to initialize: %s [%s]", path,
             *herr_msg() ? herr_msg() : kiln_strerror(rc), kiln_status_name(rc));
        add_cand(L, path, 0, HL_CAND_REFUSED, why);
        return -1;
    }
    if (!desc) {
        hwhyf(why, whylen, "%s: init returned success but no library descriptor", path);
        add_cand(L, path, 0, HL_CAND_REFUSED, why);
        return -1;
    }
    if (desc->struct_size < sizeof(kiln_library)) {
        hwhyf(why, whylen,
             "%s: library descriptor too small (struct_size %u < %zu required for ABI 1.0); built against a corrupt "
             "or mismatched header",
             path, desc->struct_size, sizeof(kiln_library));
        add_cand(L, path, 0, HL_CAND_REFUSED, why);
        return -1;
    }
    hl_library *lib = calloc(1, sizeof *lib);
    if (!lib) abort();
    memcpy(&lib->view, desc, sizeof(kiln_library));
    lib->path = xstrdup(path);
    char stem[256];
    lib_stem(path, stem, sizeof stem);
    lib->stem = xstrdup(stem);
    lib->origin = origin;
    lib->dev = st.st_dev;
    lib->ino = st.st_ino;
    lib->handle = h;
    const kiln_library *v = &lib->view;
    const char *lname = v->library_name ? v->library_name : "?";
    int bad = 0;
    if (v->abi_major != KILN_ABI_MAJOR) {
        hwhyf(why, whylen, "%s: ABI major %u not supported (host supports %d); rebuild against the kiln SDK %d.x",
             path, v->abi_major, KILN_ABI_MAJOR, KILN_ABI_MAJOR);
        bad = 1;
    } else if (v->min_host_minor > KILN_ABI_MINOR) {
        hwhyf(why, whylen,
             "%s (%s %s) requires host ABI >= %d.%u; this host provides %d.%d (kiln %s); upgrade kiln or use a "
             "build of the plugin for ABI <= %d.%d",
             path, lname, v->library_version ? v->library_version : "?", KILN_ABI_MAJOR, v->min_host_minor,
             KILN_ABI_MAJOR, KILN_ABI_MINOR, hs_host_base()->host_version, KILN_ABI_MAJOR, KILN_ABI_MINOR);
        bad = 1;
    } else if (v->min_host_minor > v->abi_minor) {
        hwhyf(why, whylen, "%s: min_host_minor %u is newer than the ABI minor %u it was built with", path,
             v->min_host_minor, v->abi_minor);
        bad = 1;
    } else if (!v->library_name || !hl_valid_plugin_name(v->library_name)) {
        hwhyf(why, whylen, "%s: library name '%s' invalid, expected [a-z0-9][a-z0-9._-]{0,63}", path,
             v->library_name ? v->library_name : "(null)");
        bad = 1;
    } else if (!v->library_version || !*v->library_version) {
        hwhyf(why, whylen, "%s: library '%s' has no version", path, lname);
        bad = 1;
    } else if (v->plugin_count == 0 || v->plugin_count > HL_MAX_PLUGINS_PER_LIB || !v->plugins) {
        hwhyf(why, whylen, "%s: library '%s' lists %u plugins, expected 1 to %d", path, lname, v->plugin_count,
             HL_MAX_PLUGINS_PER_LIB);
        bad = 1;
    }
    if (bad) {
        add_cand(L, path, 0, HL_CAND_REFUSED, why);
        free(lib->path);
        free(lib->stem);
        free(lib);
        return -1;
    }
    hl_candidate *c = add_cand(L, path, 0, HL_CAND_LOADED, NULL);
    lib->plugins = calloc(v->plugin_count, sizeof(hl_plugin));
    if (!lib->plugins) abort();
    char line[1024];
    for (uint32_t i = 0; i < v->plugin_count; i++) {
        int r = validate_desc(lib, v->plugins[i], i, &lib->plugins[lib->nplugins], line, sizeof line);
        if (r == 0) {
            /* The same kind+name twice inside one library is a build mistake. */
            hl_plugin *np = &lib->plugins[lib->nplugins];
            int dup = 0;
            for (int j = 0; j < lib->nplugins; j++)
                if (lib->plugins[j].view.kind == np->view.kind && !strcmp(lib->plugins[j].view.name, np->view.name))
                    dup = 1;
            if (dup) {
                snprintf(line, sizeof line, "%s: %s '%s' listed twice in one library", path,
                         hl_kind_name(np->view.kind), np->view.name);
                cand_append_reason(c, line);
                HLOG_WARN("%s", line);
                continue;
            }
            lib->nplugins++;
        } else {
            cand_append_reason(c, line);
            if (r > 0) HLOG_INFO("%s", line);
            else HLOG_WARN("%s", line);
        }
    }
    if (lib->nplugins == 0) {
        c->status = HL_CAND_REFUSED;
        hwhyf(why, whylen, "%s: no usable plugin in library '%s'%s%s", path, lname, c->reason ? ": " : "",
             c->reason ? c->reason : "");
        free(lib->plugins);
        free(lib->path);
        free(lib->stem);
        free(lib);
        return -1;
    }
    c->lib = lib;
    L->libs = xrealloc(L->libs, sizeof(hl_library *) * (size_t)(L->nlibs + 1));
    L->libs[L->nlibs++] = lib;
    hlog_loader("loaded %s (%s %s, built ABI %u.%u, host %d.%d): %d plugin(s)", path, lname,
             v->library_version, v->abi_major, v->abi_minor, KILN_ABI_MAJOR, KILN_ABI_MINOR, lib->nplugins);
    return 0;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void hl_scan(hl_loader *L) {
    char why[1024];
    for (int d = 0; d < L->ndirs; d++) {
        const char *dir = L->dirs[d];
        if (hl_vet_dir(dir, L->allow_symlinks, why, sizeof why)) {
            /* A missing built-in or env directory is not worth a warning. */
            struct stat st;
            int missing = dir[0] == '/' && lstat(dir, &st) != 0 && errno == ENOENT;
            add_cand(L, dir, 1, missing ? HL_CAND_SKIPPED : HL_CAND_REFUSED, why);
            if (!missing) HLOG_WARN("refusing plugin directory %s", why);
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
            names = xrealloc(names, sizeof(char *) * (size_t)(nn + 1));
            names[nn++] = xstrdup(e->d_name);
        }
        closedir(dh);
        /* Sorted, so load order (and conflict resolution) is deterministic. */
        if (nn > 1) qsort(names, (size_t)nn, sizeof(char *), name_cmp);
        for (int i = 0; i < nn; i++) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            if (hl_load_file(L, path, L->dir_origin[d], why, sizeof why) < 0) HLOG_DEBUG("%s", why);
            free(names[i]);
        }
        free(names);
    }
    hl_registry_build(L);
}

/* ---------------------------------------------------------------------------
 * Registry */

static void add_warning(hl_loader *L, const char *w) {
    L->warnings = xrealloc(L->warnings, sizeof(char *) * (size_t)(L->nwarnings + 1));
    L->warnings[L->nwarnings++] = xstrdup(w);
    HLOG_WARN("%s", w);
}

/* Which of two plugins keeps a key: an exact name beats an alias; a built-in
 * beats a plugin from another directory (built-ins are replaced only by
 * explicit "stem:name" selection); otherwise the earlier in search order. */
static int keeps(const struct hl_regent *old, const hl_plugin *p, int is_alias) {
    if (old->is_alias != is_alias) return !old->is_alias;
    int ob = old->p->lib->origin == HL_ORIGIN_BUILTIN, nb = p->lib->origin == HL_ORIGIN_BUILTIN;
    if (ob != nb) return ob;
    return 1;
}

static void reg_put(hl_loader *L, hl_plugin *p, const char *key, int is_alias) {
    for (int i = 0; i < L->nreg; i++) {
        struct hl_regent *r = &L->reg[i];
        if (r->kind != p->view.kind || strcmp(r->key, key) != 0) continue;
        if (r->p == p) return;
        int old_wins = keeps(r, p, is_alias);
        const hl_plugin *w = old_wins ? r->p : p, *lo = old_wins ? p : r->p;
        char msg[2048];
        snprintf(msg, sizeof msg,
                 "%s '%s' provided by both %s and %s; using %s (%s). Select the other explicitly with name = "
                 "\"%s:%s\"",
                 hl_kind_name(p->view.kind), key, r->p->lib->path, p->lib->path, w->lib->path,
                 w->lib->origin == HL_ORIGIN_BUILTIN && lo->lib->origin != HL_ORIGIN_BUILTIN ? "built-ins are not "
                                                                                               "replaced implicitly"
                 : (r->is_alias != is_alias) ? "a name beats an alias"
                                             : "search-path order",
                 lo->lib->stem, lo->view.name);
        add_warning(L, msg);
        if (!old_wins) { r->p = p; r->is_alias = is_alias; }
        return;
    }
    L->reg = xrealloc(L->reg, sizeof(*L->reg) * (size_t)(L->nreg + 1));
    L->reg[L->nreg++] = (struct hl_regent){p->view.kind, key, p, is_alias};
}

void hl_registry_build(hl_loader *L) {
    free(L->reg);
    L->reg = NULL;
    L->nreg = 0;
    /* Names first, then aliases, so an alias never shadows a real name. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < L->nlibs; i++)
            for (int j = 0; j < L->libs[i]->nplugins; j++) {
                hl_plugin *p = &L->libs[i]->plugins[j];
                if (pass == 0) reg_put(L, p, p->view.name, 0);
                else
                    for (uint32_t a = 0; a < p->naliases; a++) reg_put(L, p, p->aliases[a], 1);
            }
}

const kiln_value *hl_prop(const hl_plugin *p, const char *key) {
    for (const kiln_kv *kv = p->view.properties; kv && kv->key; kv++)
        if (strcmp(kv->key, key) == 0) return &kv->value;
    return NULL;
}

/* The plugin a slot uses when the run file leaves it out: the first (in
 * search order) of its kind whose "default" property is true. The host
 * names no plugin itself: 32-true, cpu and single declare themselves. */
const char *hl_default_name(const hl_loader *L, const char *slot) {
    uint32_t kind;
    if (hl_kind_from_name(slot, &kind) != 0) return NULL;
    for (int i = 0; i < L->nreg; i++) {
        const struct hl_regent *e = &L->reg[i];
        if (e->kind != kind || e->is_alias) continue;
        const kiln_value *v = hl_prop(e->p, "default");
        if (v && v->type == KILN_TYPE_BOOL && v->v.i) return e->p->view.name;
    }
    return NULL;
}

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return 99;
    size_t prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t c = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < c) c = prev[j] + 1;
            if (cur[j - 1] + 1 < c) c = cur[j - 1] + 1;
            cur[j] = c;
        }
        memcpy(prev, cur, sizeof(size_t) * (lb + 1));
    }
    return prev[lb];
}

const hl_plugin *hl_find(const hl_loader *L, uint32_t kind, const char *query, char *why, size_t whylen) {
    const char *kn = hl_kind_name(kind);
    const char *colon = strchr(query, ':');
    if (colon) {
        size_t sl = (size_t)(colon - query);
        const char *name = colon + 1;
        for (int i = 0; i < L->nlibs; i++) {
            const hl_library *lib = L->libs[i];
            if (strlen(lib->stem) != sl || strncmp(lib->stem, query, sl) != 0) continue;
            for (int j = 0; j < lib->nplugins; j++) {
                const hl_plugin *p = &lib->plugins[j];
                if (p->view.kind != kind) continue;
                if (!strcmp(p->view.name, name)) return p;
                for (uint32_t a = 0; a < p->naliases; a++)
                    if (!strcmp(p->aliases[a], name)) return p;
            }
            hwhyf(why, whylen, "library libkiln-%.*s.so has no %s plugin answering to '%s'", (int)sl, query, kn, name);
            return NULL;
        }
        hwhyf(why, whylen, "no loaded library libkiln-%.*s.so for %s '%s'", (int)sl, query, kn, query);
        return NULL;
    }
    for (int i = 0; i < L->nreg; i++)
        if (L->reg[i].kind == kind && !strcmp(L->reg[i].key, query)) return L->reg[i].p;
    /* Not found: list what exists and the closest match. */
    char known[512] = "";
    const char *best = NULL;
    size_t bestd = 99;
    for (int i = 0; i < L->nreg; i++) {
        if (L->reg[i].kind != kind) continue;
        if (!L->reg[i].is_alias) {
            size_t n = strlen(known);
            snprintf(known + n, sizeof known - n, "%s%s", n ? ", " : "", L->reg[i].key);
        }
        size_t d = edit_distance(query, L->reg[i].key);
        if (d < bestd) { bestd = d; best = L->reg[i].key; }
    }
    int refused = 0;
    for (int i = 0; i < L->ncands; i++) refused += !L->cands[i].is_dir && L->cands[i].status == HL_CAND_REFUSED;
    char hint[256] = "";
    if (best && bestd <= 2 + strlen(query) / 4) snprintf(hint, sizeof hint, "; did you mean '%s'?", best);
    char ref[160] = "";
    if (refused)
        snprintf(ref, sizeof ref, " (%d plugin file(s) were refused; see `kiln plugins list --verbose`)", refused);
    hwhyf(why, whylen, "no %s plugin answers to '%s' (available: %s)%s%s", kn, query, *known ? known : "none", hint,
         ref);
    return NULL;
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
    for (int i = 0; i < L->ndirs; i++) free(L->dirs[i]);
    for (int i = 0; i < L->nwarnings; i++) free(L->warnings[i]);
    free(L->warnings);
    free(L->dirs);
    free(L->dir_origin);
    free(L->cands);
    free(L->libs);
    free(L->reg);
    memset(L, 0, sizeof *L);
}
