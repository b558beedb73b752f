/*
 * host/config.c — reading, overriding, checking and resolving run files.
 * libconfig does the parsing (its own lexer types every --set value); this
 * file adds what a run needs on top: includes relative to the including file,
 * a schema for the top level and the trainer, per-plugin key checking against
 * the kiln_param lists plugins declare, and one-line errors with file:line.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

const char *const hc_slots[] = {"accelerator", "precision", "strategy", "data", "module", "optimizer", "scheduler"};
const int hc_nslots = (int)(sizeof hc_slots / sizeof hc_slots[0]);

/* One of the plugin slots (a string there is short for { name = ... }). */
static int is_slot(const char *key) {
    for (size_t i = 0; i < sizeof hc_slots / sizeof hc_slots[0]; i++)
        if (!strcmp(key, hc_slots[i])) return 1;
    return 0;
}

static const char *const top_keys[] = {"trainer",  "plugins", "accelerator", "precision", "strategy", "data",
                                       "module", "optimizer", "scheduler", "callbacks", "optimizers"};
static const char *const plugins_keys[] = {"dirs", "allow_symlinks"};


void hc_where(const hc_config *c, const config_setting_t *s, char *buf, size_t n) {
    const char *f = s ? config_setting_source_file(s) : NULL;
    unsigned line = s ? config_setting_source_line(s) : 0;
    if (!f && line == 0) snprintf(buf, n, "%s (--set)", c->path ? c->path : "config");
    else snprintf(buf, n, "%s:%u", f ? f : (c->path ? c->path : "config"), line);
}

/* ---------------------------------------------------------------------------
 * Did-you-mean */

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    size_t prev[64], cur[64];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t x = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < x) x = prev[j] + 1;
            if (cur[j - 1] + 1 < x) x = cur[j - 1] + 1;
            /* adjacent transposition counts as one edit */
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && prev[j - 1] < x) x = prev[j - 1];
            cur[j] = x;
        }
        memcpy(prev, cur, sizeof(size_t) * (lb + 1));
    }
    return prev[lb];
}

const char *hc_did_you_mean(const char *word, const char *const *cands, int n) {
    const char *best = NULL;
    size_t bestd = 99;
    for (int i = 0; i < n; i++) {
        size_t d = edit_distance(word, cands[i]);
        if (d < bestd) { bestd = d; best = cands[i]; }
    }
    size_t limit = 1 + strlen(word) / 3;
    if (limit > 3) limit = 3;
    return best && bestd <= limit ? best : NULL;
}

/* ---------------------------------------------------------------------------
 * Loading */

static int report_parse_error(hc_config *c, char *why, size_t whylen) {
    const char *f = config_error_file(&c->cfg);
    if (config_error_type(&c->cfg) == CONFIG_ERR_FILE_IO)
        hwhyf(why, whylen, "%s: cannot read run file: %s", f ? f : c->path, errno ? strerror(errno) : "I/O error");
    else
        hwhyf(why, whylen, "%s:%d: %s", f ? f : c->path, config_error_line(&c->cfg), config_error_text(&c->cfg));
    return KILN_E_CONFIG;
}

int hc_load(hc_config *c, const char *path, char *why, size_t whylen) {
    memset(c, 0, sizeof *c);
    config_init(&c->cfg);
    c->loaded = 1;
    c->path = strdup(path);
    /* @include paths resolve relative to the run file, not the CWD.
     * (libconfig 1.5 resolves nested includes against the same directory.) */
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    config_set_include_dir(&c->cfg, dirname(tmp));
    errno = 0;
    if (config_read_file(&c->cfg, path) != CONFIG_TRUE) return report_parse_error(c, why, whylen);
    return KILN_OK;
}

int hc_load_string(hc_config *c, const char *text, const char *label, char *why, size_t whylen) {
    memset(c, 0, sizeof *c);
    config_init(&c->cfg);
    c->loaded = 1;
    c->path = strdup(label);
    if (config_read_string(&c->cfg, text) != CONFIG_TRUE) {
        hwhyf(why, whylen, "%s:%d: %s", label, config_error_line(&c->cfg), config_error_text(&c->cfg));
        return KILN_E_CONFIG;
    }
    return KILN_OK;
}

void hc_free(hc_config *c) {
    if (c->loaded) config_destroy(&c->cfg);
    free(c->path);
    memset(c, 0, sizeof *c);
}

int hc_write(hc_config *c, const char *path, char *why, size_t whylen) {
    if (config_write_file(&c->cfg, path) != CONFIG_TRUE) {
        hwhyf(why, whylen, "%s: cannot write the effective config: %s", path, strerror(errno));
        return KILN_E_IO;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Overrides */

static int is_scalar(int t) {
    return t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64 || t == CONFIG_TYPE_FLOAT || t == CONFIG_TYPE_STRING ||
           t == CONFIG_TYPE_BOOL;
}

static const char *cfg_type_name(int t) {
    switch (t) {
    case CONFIG_TYPE_INT: case CONFIG_TYPE_INT64: return "int";
    case CONFIG_TYPE_FLOAT: return "float";
    case CONFIG_TYPE_STRING: return "string";
    case CONFIG_TYPE_BOOL: return "bool";
    case CONFIG_TYPE_ARRAY: return "array";
    case CONFIG_TYPE_LIST: return "list";
    case CONFIG_TYPE_GROUP: return "group";
    default: return "nothing";
    }
}

static int set_scalar(config_setting_t *dst, const config_setting_t *src) {
    switch (config_setting_type(src)) {
    case CONFIG_TYPE_INT: return config_setting_set_int(dst, config_setting_get_int(src));
    case CONFIG_TYPE_INT64: return config_setting_set_int64(dst, config_setting_get_int64(src));
    case CONFIG_TYPE_FLOAT: return config_setting_set_float(dst, config_setting_get_float(src));
    case CONFIG_TYPE_STRING: return config_setting_set_string(dst, config_setting_get_string(src));
    case CONFIG_TYPE_BOOL: return config_setting_set_bool(dst, config_setting_get_bool(src));
    default: return CONFIG_FALSE;
    }
}

/* Deep copy of `src` as member `name` of group `parent` (name NULL: append to
 * an array or list). */
static config_setting_t *copy_setting(config_setting_t *parent, const char *name, const config_setting_t *src) {
    int t = config_setting_type(src);
    config_setting_t *d = config_setting_add(parent, name, t);
    if (!d) return NULL;
    if (is_scalar(t)) return set_scalar(d, src) == CONFIG_TRUE ? d : NULL;
    int n = config_setting_length(src);
    for (int i = 0; i < n; i++) {
        const config_setting_t *e = config_setting_get_elem(src, (unsigned)i);
        if (!copy_setting(d, t == CONFIG_TYPE_GROUP ? config_setting_name(e) : NULL, e)) return NULL;
    }
    return d;
}

int hc_override(hc_config *c, const char *assignment, char *why, size_t whylen) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        hwhyf(why, whylen, "--set %s: expected KEY=VALUE (e.g. --set optimizer.lr=0.05)", assignment);
        return KILN_E_CONFIG;
    }
    char key[256];
    size_t kl = (size_t)(eq - assignment);
    if (kl >= sizeof key) { hwhyf(why, whylen, "--set: key too long"); return KILN_E_CONFIG; }
    memcpy(key, assignment, kl);
    key[kl] = 0;
    const char *val = eq + 1;

    /* Type the value with libconfig's own parser; a bare word that is not
     * valid libconfig syntax (bf16-mixed) is taken as a string. */
    config_t tmp;
    config_init(&tmp);
    size_t bl = strlen(val) + 16;
    char *buf = malloc(bl);
    snprintf(buf, bl, "v = %s;", val);
    int parsed = config_read_string(&tmp, buf) == CONFIG_TRUE;
    free(buf);
    if (!parsed) {
        config_destroy(&tmp);
        config_init(&tmp);
        config_setting_t *s = config_setting_add(config_root_setting(&tmp), "v", CONFIG_TYPE_STRING);
        config_setting_set_string(s, val);
    }
    config_setting_t *nv = config_lookup(&tmp, "v");
    int rc = KILN_OK;

    config_setting_t *old = config_lookup(&c->cfg, key);
    if (old) {
        int ot = config_setting_type(old), nt = config_setting_type(nv);
        int o_num = ot == CONFIG_TYPE_INT || ot == CONFIG_TYPE_INT64, n_num = nt == CONFIG_TYPE_INT || nt == CONFIG_TYPE_INT64;
        char where[PATH_MAX + 32];
        hc_where(c, old, where, sizeof where);
        if (ot == nt || (o_num && n_num)) {
            if (is_scalar(ot)) {
                if (ot == CONFIG_TYPE_INT && nt == CONFIG_TYPE_INT64) {
                    /* keep the file's width unless the value needs 64 bits */
                    long long x = config_setting_get_int64(nv);
                    if (x >= INT32_MIN && x <= INT32_MAX) config_setting_set_int(old, (int)x);
                    else { config_setting_t *p = config_setting_parent(old); const char *nm = config_setting_name(old);
                        char nmc[128]; snprintf(nmc, sizeof nmc, "%s", nm); config_setting_remove(p, nmc);
                        copy_setting(p, nmc, nv); }
                } else set_scalar(old, nv);
            } else {
                config_setting_t *p = config_setting_parent(old);
                char nm[128];
                snprintf(nm, sizeof nm, "%s", config_setting_name(old) ? config_setting_name(old) : "");
                if (!*nm) { hwhyf(why, whylen, "--set %s: cannot replace a list element that is not a scalar", key); rc = KILN_E_CONFIG; }
                else { config_setting_remove(p, nm); copy_setting(p, nm, nv); }
            }
        } else if (ot == CONFIG_TYPE_FLOAT && n_num) {
            config_setting_set_float(old, (double)config_setting_get_int64(nv));
        } else if (ot == CONFIG_TYPE_STRING && is_scalar(nt)) {
            /* --set precision.name=16 means the string "16" */
            config_setting_set_string(old, val);
        } else if (ot == CONFIG_TYPE_GROUP && is_slot(key) && is_scalar(nt)) {
            /* --set precision=bf16 over precision = { name = ...; ... }: another
             * plugin, so the old plugin's keys go too */
            config_setting_t *root = config_root_setting(&c->cfg);
            config_setting_remove(root, key);
            config_setting_t *ns = config_setting_add(root, key, CONFIG_TYPE_STRING);
            if (!ns || !config_setting_set_string(ns, val)) {
                hwhyf(why, whylen, "--set %s=%s: cannot replace the group", key, val);
                rc = KILN_E_CONFIG;
            }
        } else {
            hwhyf(why, whylen, "--set %s=%s: expected a %s (as at %s), found a %s", key, val, cfg_type_name(ot), where,
                 cfg_type_name(nt));
            rc = KILN_E_CONFIG;
        }
    } else {
        /* Create missing groups along the path. */
        config_setting_t *parent = config_root_setting(&c->cfg);
        char path[256];
        snprintf(path, sizeof path, "%s", key);
        char *save = NULL, *tok = strtok_r(path, ".", &save);
        while (tok && rc == KILN_OK) {
            char *next = strtok_r(NULL, ".", &save);
            if (tok[0] == '[') {
                hwhyf(why, whylen, "--set %s: list element does not exist", key);
                rc = KILN_E_CONFIG;
                break;
            }
            config_setting_t *m = config_setting_get_member(parent, tok);
            if (!next) {
                if (!copy_setting(parent, tok, nv)) {
                    hwhyf(why, whylen, "--set %s: '%s' is not a valid setting name", key, tok);
                    rc = KILN_E_CONFIG;
                }
            } else if (m && parent == config_root_setting(&c->cfg) && config_setting_type(m) == CONFIG_TYPE_STRING &&
                       is_slot(tok)) {
                /* precision = "16-mixed" plus --set precision.init_scale=...:
                 * the short form becomes { name = "16-mixed"; ... } */
                char nm[256];
                snprintf(nm, sizeof nm, "%s", config_setting_get_string(m));
                config_setting_remove(parent, tok);
                parent = config_setting_add(parent, tok, CONFIG_TYPE_GROUP);
                config_setting_t *n = parent ? config_setting_add(parent, "name", CONFIG_TYPE_STRING) : NULL;
                if (!n || !config_setting_set_string(n, nm)) {
                    hwhyf(why, whylen, "--set %s: cannot turn '%s' into a group", key, tok);
                    rc = KILN_E_CONFIG;
                }
            } else if (m) {
                if (config_setting_type(m) != CONFIG_TYPE_GROUP) {
                    hwhyf(why, whylen, "--set %s: '%s' is a %s, not a group", key, tok, cfg_type_name(config_setting_type(m)));
                    rc = KILN_E_CONFIG;
                }
                parent = m;
            } else {
                parent = config_setting_add(parent, tok, CONFIG_TYPE_GROUP);
                if (!parent) { hwhyf(why, whylen, "--set %s: '%s' is not a valid setting name", key, tok); rc = KILN_E_CONFIG; }
            }
            tok = next;
        }
    }
    config_destroy(&tmp);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Structure */

static int check_members(hc_config *c, config_setting_t *grp, const char *const *allowed, int nallowed,
                         const char *what, char *why, size_t whylen) {
    int n = config_setting_length(grp);
    for (int i = 0; i < n; i++) {
        config_setting_t *m = config_setting_get_elem(grp, (unsigned)i);
        const char *nm = config_setting_name(m);
        int ok = 0;
        for (int k = 0; k < nallowed; k++) ok |= !strcmp(nm, allowed[k]);
        if (!ok) {
            char where[PATH_MAX + 32];
            hc_where(c, m, where, sizeof where);
            const char *dym = hc_did_you_mean(nm, allowed, nallowed);
            char hint[96] = "";
            if (dym) snprintf(hint, sizeof hint, " (did you mean '%s'?)", dym);
            hwhyf(why, whylen, "%s: unknown key '%s' in %s%s", where, nm, what, hint);
            return KILN_E_CONFIG;
        }
    }
    return KILN_OK;
}

int hc_check_structure(hc_config *c, char *why, size_t whylen) {
    config_setting_t *root = config_root_setting(&c->cfg);
    int rc = check_members(c, root, top_keys, (int)(sizeof top_keys / sizeof top_keys[0]), "the run file", why, whylen);
    if (rc) return rc;
    config_setting_t *pl = config_setting_get_member(root, "plugins");
    if (pl) {
        char where[PATH_MAX + 32];
        hc_where(c, pl, where, sizeof where);
        if (config_setting_type(pl) != CONFIG_TYPE_GROUP) {
            hwhyf(why, whylen, "%s: 'plugins' must be a group { dirs = [...]; }, found a %s", where,
                 cfg_type_name(config_setting_type(pl)));
            return KILN_E_CONFIG;
        }
        rc = check_members(c, pl, plugins_keys, 2, "plugins", why, whylen);
        if (rc) return rc;
    }
    config_setting_t *cb = config_setting_get_member(root, "callbacks");
    if (cb && config_setting_type(cb) != CONFIG_TYPE_LIST) {
        char where[PATH_MAX + 32];
        hc_where(c, cb, where, sizeof where);
        hwhyf(why, whylen, "%s: 'callbacks' must be a list ( { name = \"...\"; }, ... ), found a %s", where,
             cfg_type_name(config_setting_type(cb)));
        return KILN_E_CONFIG;
    }
    config_setting_t *ol = config_setting_get_member(root, "optimizers");
    if (ol) {
        char where[PATH_MAX + 32];
        hc_where(c, ol, where, sizeof where);
        if (config_setting_type(ol) != CONFIG_TYPE_LIST || config_setting_length(ol) < 1) {
            hwhyf(why, whylen, "%s: 'optimizers' must be a non-empty list ( { name = \"...\"; params = [\"...\"]; }, ... )",
                  where);
            return KILN_E_CONFIG;
        }
        if (config_setting_get_member(root, "optimizer")) {
            hwhyf(why, whylen, "%s: both 'optimizer' and 'optimizers' are set; use one (optimizers for several)", where);
            return KILN_E_CONFIG;
        }
        for (int i = 0; i < config_setting_length(ol); i++) {
            config_setting_t *e = config_setting_get_elem(ol, (unsigned)i);
            config_setting_t *pr = config_setting_type(e) == CONFIG_TYPE_GROUP ? config_setting_get_member(e, "params")
                                                                               : NULL;
            const char *nm;
            hc_where(c, e, where, sizeof where);
            if (config_setting_type(e) != CONFIG_TYPE_GROUP || !config_setting_lookup_string(e, "name", &nm)) {
                hwhyf(why, whylen, "%s: optimizers.[%d] must be a group with name = \"...\"", where, i);
                return KILN_E_CONFIG;
            }
            int ok = !pr || config_setting_type(pr) == CONFIG_TYPE_ARRAY || config_setting_type(pr) == CONFIG_TYPE_LIST;
            for (int k = 0; ok && pr && k < config_setting_length(pr); k++)
                ok = config_setting_type(config_setting_get_elem(pr, (unsigned)k)) == CONFIG_TYPE_STRING;
            if (!ok) {
                hc_where(c, pr, where, sizeof where);
                hwhyf(why, whylen, "%s: optimizers.[%d].params must be a list of parameter-name patterns "
                                   "([\"generator.*\"]), found a %s", where, i, cfg_type_name(config_setting_type(pr)));
                return KILN_E_CONFIG;
            }
        }
    }
    config_setting_t *tr = config_setting_get_member(root, "trainer");
    if (tr && config_setting_type(tr) != CONFIG_TYPE_GROUP) {
        char where[PATH_MAX + 32];
        hc_where(c, tr, where, sizeof where);
        hwhyf(why, whylen, "%s: 'trainer' must be a group, found a %s", where, cfg_type_name(config_setting_type(tr)));
        return KILN_E_CONFIG;
    }
    hc_kvset tmp;
    rc = hc_resolve(c, tr, hc_trainer_params, "trainer", &tmp, why, whylen);
    if (rc == KILN_OK) hc_kvset_free(&tmp);
    return rc;
}

int hc_plugin_dirs(hc_config *c, const char ***dirs, int *ndirs, int *allow_symlinks, char *why, size_t whylen) {
    *dirs = NULL;
    *ndirs = 0;
    *allow_symlinks = 0;
    config_setting_t *d = config_lookup(&c->cfg, "plugins.dirs");
    config_setting_t *a = config_lookup(&c->cfg, "plugins.allow_symlinks");
    char where[PATH_MAX + 32];
    if (a) {
        if (config_setting_type(a) != CONFIG_TYPE_BOOL) {
            hc_where(c, a, where, sizeof where);
            hwhyf(why, whylen, "%s: plugins.allow_symlinks must be true or false, found a %s", where,
                 cfg_type_name(config_setting_type(a)));
            return KILN_E_CONFIG;
        }
        *allow_symlinks = config_setting_get_bool(a);
    }
    if (!d) return KILN_OK;
    hc_where(c, d, where, sizeof where);
    int t = config_setting_type(d);
    if (t == CONFIG_TYPE_STRING) {
        const char **out = calloc(2, sizeof(char *));
        out[0] = config_setting_get_string(d);
        *dirs = out;
        *ndirs = 1;
    } else if (t == CONFIG_TYPE_ARRAY || t == CONFIG_TYPE_LIST) {
        int n = config_setting_length(d);
        const char **out = calloc((size_t)n + 1, sizeof(char *));
        for (int i = 0; i < n; i++) {
            const char *s = config_setting_get_string_elem(d, i);
            if (!s) {
                free(out);
                hwhyf(why, whylen, "%s: plugins.dirs must hold strings, element %d is not one", where, i);
                return KILN_E_CONFIG;
            }
            out[i] = s;
        }
        *dirs = out; /* the caller frees the array (not the strings) */
        *ndirs = n;
    } else {
        hwhyf(why, whylen, "%s: plugins.dirs must be an array of absolute paths, found a %s", where, cfg_type_name(t));
        return KILN_E_CONFIG;
    }
    for (int i = 0; i < *ndirs; i++)
        if ((*dirs)[i][0] != '/') {
            hwhyf(why, whylen, "%s: plugin directory '%s' must be an absolute path, found a relative one", where,
                 (*dirs)[i]);
            free((void *)*dirs);
            *dirs = NULL;
            *ndirs = 0;
            return KILN_E_CONFIG;
        }
    return KILN_OK;
}

const char *hc_slot_name(hc_config *c, const char *slot, const char *fallback, config_setting_t **section, char *why,
                         size_t whylen) {
    *section = NULL;
    config_setting_t *s = config_setting_get_member(config_root_setting(&c->cfg), slot);
    if (!s) return fallback;
    char where[PATH_MAX + 32];
    hc_where(c, s, where, sizeof where);
    if (config_setting_type(s) == CONFIG_TYPE_STRING) return config_setting_get_string(s);
    if (config_setting_type(s) != CONFIG_TYPE_GROUP) {
        hwhyf(why, whylen, "%s: '%s' must be a plugin name or a group { name = \"...\"; ... }, found a %s", where, slot,
             cfg_type_name(config_setting_type(s)));
        return NULL;
    }
    *section = s;
    const char *name = NULL;
    if (!config_setting_lookup_string(s, "name", &name)) {
        if (fallback) return fallback;
        hwhyf(why, whylen, "%s: the %s section needs name = \"...\" naming its plugin", where, slot);
        return NULL;
    }
    return name;
}

int hc_callback_count(hc_config *c) {
    config_setting_t *cb = config_lookup(&c->cfg, "callbacks");
    return cb ? config_setting_length(cb) : 0;
}

config_setting_t *hc_callback(hc_config *c, int i) {
    config_setting_t *cb = config_lookup(&c->cfg, "callbacks");
    return cb ? config_setting_get_elem(cb, (unsigned)i) : NULL;
}

int hc_optimizer_count(hc_config *c) {
    config_setting_t *o = config_lookup(&c->cfg, "optimizers");
    return o ? config_setting_length(o) : 0;
}

config_setting_t *hc_optimizer(hc_config *c, int i) {
    config_setting_t *o = config_lookup(&c->cfg, "optimizers");
    return o ? config_setting_get_elem(o, (unsigned)i) : NULL;
}

/* ---------------------------------------------------------------------------
 * Resolution against declared keys */

static void *own(hc_kvset *s, void *p) {
    s->owned = realloc(s->owned, sizeof(void *) * (size_t)(s->nowned + 1));
    s->owned[s->nowned++] = p;
    return p;
}

void hc_kvset_free(hc_kvset *s) {
    for (int i = 0; i < s->nowned; i++) free(s->owned[i]);
    free(s->owned);
    free(s->kv);
    memset(s, 0, sizeof *s);
}

static const char *ktype_name(uint32_t t) {
    static const char *const n[] = {"none", "bool", "int", "float", "string", "list of ints", "list of floats",
                                    "list of strings"};
    return t <= KILN_TYPE_STRING_LIST ? n[t] : "?";
}

/* Convert a libconfig setting to a kiln_value of declared type `want`. */
static int convert(hc_kvset *S, const config_setting_t *m, uint32_t want, kiln_value *out, const char **found) {
    int t = config_setting_type(m);
    *found = cfg_type_name(t);
    memset(out, 0, sizeof *out);
    out->type = want;
    switch (want) {
    case KILN_TYPE_BOOL:
        if (t != CONFIG_TYPE_BOOL) return -1;
        out->v.i = config_setting_get_bool(m);
        return 0;
    case KILN_TYPE_INT:
        if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64) return -1;
        out->v.i = config_setting_get_int64(m);
        return 0;
    case KILN_TYPE_FLOAT:
        if (t == CONFIG_TYPE_FLOAT) out->v.f = config_setting_get_float(m);
        else if (t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64) out->v.f = (double)config_setting_get_int64(m);
        else return -1;
        return 0;
    case KILN_TYPE_STRING:
        if (t != CONFIG_TYPE_STRING) return -1;
        out->v.s = own(S, strdup(config_setting_get_string(m)));
        return 0;
    default: break;
    }
    if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST) return -1;
    int n = config_setting_length(m);
    out->count = (uint32_t)n;
    if (want == KILN_TYPE_INT_LIST) {
        int64_t *a = own(S, calloc((size_t)n + 1, sizeof *a));
        for (int i = 0; i < n; i++) {
            const config_setting_t *e = config_setting_get_elem(m, (unsigned)i);
            int et = config_setting_type(e);
            if (et != CONFIG_TYPE_INT && et != CONFIG_TYPE_INT64) { *found = "list with a non-int element"; return -1; }
            a[i] = config_setting_get_int64(e);
        }
        out->v.il = a;
    } else if (want == KILN_TYPE_FLOAT_LIST) {
        double *a = own(S, calloc((size_t)n + 1, sizeof *a));
        for (int i = 0; i < n; i++) {
            const config_setting_t *e = config_setting_get_elem(m, (unsigned)i);
            int et = config_setting_type(e);
            if (et == CONFIG_TYPE_FLOAT) a[i] = config_setting_get_float(e);
            else if (et == CONFIG_TYPE_INT || et == CONFIG_TYPE_INT64) a[i] = (double)config_setting_get_int64(e);
            else { *found = "list with a non-number element"; return -1; }
        }
        out->v.fl = a;
    } else if (want == KILN_TYPE_STRING_LIST) {
        const char **a = own(S, calloc((size_t)n + 1, sizeof *a));
        for (int i = 0; i < n; i++) {
            const config_setting_t *e = config_setting_get_elem(m, (unsigned)i);
            if (config_setting_type(e) != CONFIG_TYPE_STRING) { *found = "list with a non-string element"; return -1; }
            a[i] = own(S, strdup(config_setting_get_string(e)));
        }
        out->v.sl = a;
    } else return -1;
    return 0;
}

static void copy_default(hc_kvset *S, const kiln_param *p, kiln_value *out) {
    *out = p->def;
    if (p->type == KILN_TYPE_FLOAT && p->def.type == KILN_TYPE_INT) {
        out->type = KILN_TYPE_FLOAT;
        out->v.f = (double)p->def.v.i;
    }
    (void)S; /* defaults point into the plugin's static tables: they outlive us */
}

/* Keys of a plugin section that belong to the host, not the plugin. */
const char *const *hc_host_keys(uint32_t kind) {
    static const char *const plain[] = {"name", NULL};
    static const char *const optimizer[] = {"name", "params", NULL};          /* docs/manual-optimization.md */
    static const char *const scheduler[] = {"name", "interval", "frequency", "monitor", NULL}; /* docs/callbacks.md */
    return kind == KILN_KIND_OPTIMIZER ? optimizer : kind == KILN_KIND_SCHEDULER ? scheduler : plain;
}

int hc_resolve(const hc_config *c, config_setting_t *section, const kiln_param *params, const char *what,
               hc_kvset *out, char *why, size_t whylen) {
    return hc_resolve_host(c, section, params, NULL, what, out, why, whylen);
}

int hc_resolve_host(const hc_config *c, config_setting_t *section, const kiln_param *params,
                    const char *const *host_keys, const char *what, hc_kvset *out, char *why, size_t whylen) {
    static const char *const name_only[] = {"name", NULL};
    if (!host_keys) host_keys = name_only;
    memset(out, 0, sizeof *out);
    int np = 0;
    for (const kiln_param *p = params; p && p->key; p++) np++;
    const char **keys = calloc((size_t)np + 1, sizeof(char *));
    for (int i = 0; i < np; i++) keys[i] = params[i].key;
    char where[PATH_MAX + 32];
    int rc = KILN_OK;
    /* Unknown keys first: a typo is the likeliest mistake. */
    int nm = section ? config_setting_length(section) : 0;
    for (int i = 0; i < nm && rc == KILN_OK; i++) {
        config_setting_t *m = config_setting_get_elem(section, (unsigned)i);
        const char *nmk = config_setting_name(m);
        int host = !nmk;
        for (const char *const *k = host_keys; !host && *k; k++) host = !strcmp(nmk, *k);
        if (host) continue;
        int found = 0;
        for (int k = 0; k < np; k++) found |= !strcmp(keys[k], nmk);
        if (!found) {
            hc_where(c, m, where, sizeof where);
            const char *dym = hc_did_you_mean(nmk, keys, np);
            char list[512] = "";
            for (int k = 0; k < np; k++) {
                size_t l = strlen(list);
                snprintf(list + l, sizeof list - l, "%s%s", k ? ", " : "", keys[k]);
            }
            if (dym) hwhyf(why, whylen, "%s: unknown key '%s' for %s (did you mean '%s'?)", where, nmk, what, dym);
            else hwhyf(why, whylen, "%s: unknown key '%s' for %s (accepted: %s)", where, nmk, what, np ? list : "none");
            rc = KILN_E_CONFIG;
        }
    }
    out->kv = calloc((size_t)np + 1, sizeof(kiln_kv));
    for (int k = 0; k < np && rc == KILN_OK; k++) {
        const kiln_param *p = &params[k];
        config_setting_t *m = section ? config_setting_get_member(section, p->key) : NULL;
        kiln_kv *kv = &out->kv[out->n];
        kv->key = p->key;
        if (m) {
            const char *found;
            if (convert(out, m, p->type, &kv->value, &found)) {
                hc_where(c, m, where, sizeof where);
                hwhyf(why, whylen, "%s: %s.%s must be a %s, found a %s", where, what, p->key, ktype_name(p->type), found);
                rc = KILN_E_CONFIG;
                break;
            }
        } else if (p->flags & KILN_PARAM_REQUIRED || p->def.type == KILN_TYPE_NONE) {
            if (p->flags & KILN_PARAM_REQUIRED) {
                hc_where(c, section, where, sizeof where);
                hwhyf(why, whylen, "%s: %s requires key '%s' (%s: %s)", section ? where : c->path, what, p->key,
                     ktype_name(p->type), p->help ? p->help : "");
                rc = KILN_E_CONFIG;
                break;
            }
            kv->key = NULL;
            continue; /* optional without default: absent */
        } else {
            copy_default(out, p, &kv->value);
        }
        out->n++;
    }
    free(keys);
    if (rc) hc_kvset_free(out);
    return rc;
}
