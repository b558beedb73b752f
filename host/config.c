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
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

const char *hc_did_you_mean(const char *word, const char *const *cands, int n) {
    const char *best = NULL;
    size_t bestd = HEDIT_FAR;
    for (int i = 0; i < n; i++) {
        size_t d = hedit_distance(word, cands[i]);
        if (d < bestd) { bestd = d; best = cands[i]; }
    }
    size_t limit = 1 + strlen(word) / 3;
    if (limit > 3) limit = 3;
    return best && bestd <= limit ? best : NULL;
}

/* ---------------------------------------------------------------------------
 * Loading */

static int is_name_start(int ch);
static int is_name_char(int ch);

/* The setting name that starts line `line` of `path` ("lr" of "  lr = 0.1;"),
 * for libconfig's "duplicate setting name", which does not say which. */
static int name_on_line(const char *path, int line, char *name, size_t n) {
    FILE *fp = path ? fopen(path, "r") : NULL;
    if (!fp) return 0;
    char buf[4096];
    int ln = 0, found = 0;
    while (fgets(buf, sizeof buf, fp))
        if (++ln == line) {
            /* the first "name =" or "name :" on the line: the duplicate ends
             * the parse, so nothing after it on the line was read yet */
            const char *p = buf;
            for (const char *s = buf; *s && !found; s++) {
                if (!is_name_start((unsigned char)*s) || (s > buf && is_name_char((unsigned char)s[-1]))) continue;
                const char *e = s;
                while (is_name_char((unsigned char)*e)) e++;
                const char *a = e;
                while (*a == ' ' || *a == '\t') a++;
                if ((*a == '=' || *a == ':') && (size_t)(e - s) < n) {
                    p = s;
                    snprintf(name, n, "%.*s", (int)(e - s), p);
                    found = 1;
                }
                s = e - 1;
            }
            break;
        }
    fclose(fp);
    return found;
}

static int report_parse_error(hc_config *c, ht_error *err) {
    const char *f = config_error_file(&c->cfg);
    const char *text = config_error_text(&c->cfg);
    char name[128];
    if (config_error_type(&c->cfg) == CONFIG_ERR_FILE_IO)
        ht_errorf(err, "%s: cannot read run file: %s", f ? f : c->path, errno ? strerror(errno) : "I/O error");
    else if (text && strstr(text, "duplicate setting name") &&
             name_on_line(f ? f : c->path, config_error_line(&c->cfg), name, sizeof name))
        ht_errorf(err,
              "%s:%d: '%s' is set twice in the same group (also when the first is in an @include file: a run file "
              "cannot override a key it includes); keep one, or change it with --set",
              f ? f : c->path, config_error_line(&c->cfg), name);
    else
        ht_errorf(err, "%s:%d: %s", f ? f : c->path, config_error_line(&c->cfg), text);
    return KILN_E_CONFIG;
}

/* ---------------------------------------------------------------------------
 * Integer literals past int32, float literals past double
 *
 * libconfig 1.5 reads an integer literal without an L suffix into a 32-bit int
 * and wraps it silently (max_steps = 5000000000 becomes 705032704, a layer of
 * 4294967299 units becomes 3), clamps one with L past int64, and turns a
 * float past double's range into an infinity (lr = 1e400). The parse leaves
 * no trace of that, so the source text is scanned for such literals:
 * strings and comments are skipped, setting names are consumed whole (a digit
 * in `layer2` is no literal), @include files are scanned too. */

static int is_scalar(int t);

typedef struct {
    char file[PATH_MAX];
    unsigned line;
    char lit[64];
    int is64;         /* the literal had an L suffix */
    int is_float;     /* a float literal past double's range (libconfig: inf) */
    long long parsed; /* what libconfig made of it, to find its setting */
} bad_int;

static int is_name_start(int ch) { return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || ch == '*'; }
static int is_name_char(int ch) { return is_name_start(ch) || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_'; }
static int is_digit(int ch) { return ch >= '0' && ch <= '9'; }
static int is_xdigit(int ch) { return is_digit(ch) || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'); }

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n < 2) { char *nb = realloc(b, cap *= 2); if (!nb) { free(b); b = NULL; } else b = nb; }
    }
    fclose(f);
    if (b) b[n] = 0;
    return b;
}

/* Check one literal [s, e) (sign included); 1 when it does not fit. */
static int int_literal_bad(const char *s, const char *e, int hex, int is64, const char *file, unsigned line, bad_int *bad) {
    int neg = *s == '-';
    const char *d = (*s == '-' || *s == '+') ? s + 1 : s;
    if (hex) d += 2;
    /* magnitude, saturating: anything past 2^64 is past every limit anyway */
    unsigned long long m = 0;
    int over = 0;
    for (const char *p = d; p < e; p++) {
        unsigned v = is_digit(*p) ? (unsigned)(*p - '0') : (unsigned)((*p | 0x20) - 'a' + 10);
        unsigned base = hex ? 16u : 10u;
        if (m > (ULLONG_MAX - v) / base) over = 1;
        else m = m * base + v;
    }
    /* hex is read as a bit pattern: 0xFFFFFFFF would come out as -1 */
    unsigned long long lim = is64 ? (unsigned long long)INT64_MAX : (unsigned long long)INT32_MAX;
    if (!over && m <= lim + (neg && !hex ? 1u : 0u)) return 0;
    snprintf(bad->file, sizeof bad->file, "%s", file ? file : "");
    bad->line = line;
    size_t l = (size_t)(e - s) < sizeof bad->lit - 1 ? (size_t)(e - s) : sizeof bad->lit - 1;
    memcpy(bad->lit, s, l);
    bad->lit[l] = 0;
    bad->is64 = is64;
    bad->is_float = 0;
    uint32_t u = (uint32_t)m;
    if (neg) u = 0u - u;
    bad->parsed = is64 ? (neg ? INT64_MIN : INT64_MAX) : (long long)(int32_t)u;
    return 1;
}

/* A float literal [s, e) past double's range: libconfig's strtod makes it
 * an infinity without a word (lr = 1e400 would train with lr = inf, and the
 * effective config, written back as "inf", would not load again). 1 when
 * it does not fit. */
static int float_literal_bad(const char *s, const char *e, const char *file, unsigned line, bad_int *bad) {
    if (!isinf(strtod(s, NULL))) return 0;
    snprintf(bad->file, sizeof bad->file, "%s", file ? file : "");
    bad->line = line;
    size_t l = (size_t)(e - s) < sizeof bad->lit - 1 ? (size_t)(e - s) : sizeof bad->lit - 1;
    memcpy(bad->lit, s, l);
    bad->lit[l] = 0;
    bad->is64 = 0;
    bad->is_float = 1;
    bad->parsed = 0;
    return 1;
}

/* Scan `text` (from `file`, NULL for a string); 1 and *bad filled at the first
 * literal that does not fit its type. */
static int scan_ints(const char *text, const char *file, const char *incdir, int depth, bad_int *bad) {
    unsigned line = 1;
    const char *p = text;
    while (*p) {
        int ch = (unsigned char)*p;
        if (ch == '\n') { line++; p++; }
        else if (ch == '#' || (ch == '/' && p[1] == '/')) { while (*p && *p != '\n') p++; }
        else if (ch == '/' && p[1] == '*') {
            p += 2;
            while (*p && !(p[0] == '*' && p[1] == '/')) line += *p++ == '\n';
            if (*p) p += 2;
        } else if (ch == '"') {
            for (p++; *p && *p != '"'; p++) {
                if (*p == '\\' && p[1]) p++;
                line += *p == '\n';
            }
            if (*p) p++;
        } else if (ch == '@' && !strncmp(p, "@include", 8)) {
            p += 8;
            while (*p == ' ' || *p == '\t') p++;
            if (*p != '"') continue;
            const char *nb = ++p;
            while (*p && *p != '"' && *p != '\n') p++;
            if (*p != '"' || depth >= 10) continue;
            char inc[PATH_MAX];
            int nl = (int)(p - nb);
            p++;
            if (*nb == '/' || !incdir) snprintf(inc, sizeof inc, "%.*s", nl, nb);
            else snprintf(inc, sizeof inc, "%s/%.*s", incdir, nl, nb);
            char *sub = slurp(inc);
            /* unreadable: libconfig parsed it already, or reported it */
            int r = sub ? scan_ints(sub, inc, incdir, depth + 1, bad) : 0;
            free(sub);
            if (r) return 1;
        } else if (is_name_start(ch)) {
            while (is_name_char((unsigned char)*p)) p++;
        } else if (is_digit(ch) || ((ch == '-' || ch == '+') && (is_digit(p[1]) || p[1] == '.')) || (ch == '.' && is_digit(p[1]))) {
            const char *s = p;
            if (ch == '-' || ch == '+') p++;
            if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X') && is_xdigit(p[2])) {
                p += 2;
                while (is_xdigit(*p)) p++;
                const char *e = p;
                int l64 = *p == 'L';
                while (*p == 'L') p++;
                if (int_literal_bad(s, e, 1, l64, file, line, bad)) return 1;
                continue;
            }
            while (is_digit(*p)) p++;
            if (*p == '.' || *p == 'e' || *p == 'E') { /* a float: 1.5, 5., .5, 1e10, 2e-4 */
                if (*p == '.') { p++; while (is_digit(*p)) p++; }
                if (*p == 'e' || *p == 'E') {
                    p++;
                    if (*p == '-' || *p == '+') p++;
                    while (is_digit(*p)) p++;
                }
                if (float_literal_bad(s, p, file, line, bad)) return 1;
                continue;
            }
            const char *e = p;
            int l64 = *p == 'L';
            while (*p == 'L') p++;
            if (int_literal_bad(s, e, 0, l64, file, line, bad)) return 1;
        } else p++;
    }
    return 0;
}

/* "a.b.[2].c" for a setting */
static void setting_path(const config_setting_t *s, char *buf, size_t n) {
    const config_setting_t *par = config_setting_parent(s);
    if (!par) { buf[0] = 0; return; }
    setting_path(par, buf, n);
    size_t l = strlen(buf);
    const char *nm = config_setting_name(s);
    if (nm) snprintf(buf + l, n - l, "%s%s", l ? "." : "", nm);
    else snprintf(buf + l, n - l, "%s[%d]", l ? "." : "", config_setting_index(s));
}

static int same_file(const char *a, const char *b) {
    if (!a || !b) return !a && !b;
    if (!strcmp(a, b)) return 1;
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

/* The setting the bad literal became: same file and line, same value (an
 * infinity for a float). */
static const config_setting_t *find_bad(const config_setting_t *s, const bad_int *b, const char *file, int anyfile) {
    int t = config_setting_type(s);
    int same = b->is_float ? t == CONFIG_TYPE_FLOAT && isinf(config_setting_get_float(s))
                           : (t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64) && config_setting_get_int64(s) == b->parsed;
    if (same && config_setting_source_line(s) == b->line &&
        (anyfile || same_file(config_setting_source_file(s), file)))
        return s;
    if (is_scalar(t)) return NULL;
    for (int i = 0; i < config_setting_length(s); i++) {
        const config_setting_t *r = find_bad(config_setting_get_elem(s, (unsigned)i), b, file, anyfile);
        if (r) return r;
    }
    return NULL;
}

static void explain_bad(const bad_int *b, char *what, size_t n) {
    if (b->is_float)
        snprintf(what, n, "expected a float of magnitude below 1.8e308 (a double), found %s", b->lit);
    else if (b->is64)
        snprintf(what, n, "expected an integer in -9223372036854775808..9223372036854775807, found %s", b->lit);
    else
        snprintf(what, n, "expected an integer in -2147483648..2147483647 (write %sL for a 64-bit int), found %s",
                 b->lit, b->lit);
}

/* After a successful parse of `text`: refuse a literal libconfig wrapped. */
static int check_ints(hc_config *c, const char *text, const char *file, const char *label, const char *incdir,
                      ht_error *err) {
    bad_int b;
    if (!scan_ints(text, file, incdir, 0, &b)) return KILN_OK;
    const char *shown = b.file[0] ? b.file : label;
    const config_setting_t *s = find_bad(config_root_setting(&c->cfg), &b, b.file[0] ? b.file : NULL, 0);
    /* libconfig 1.5 does not always record an included file's name: then
     * line and wrapped value alone */
    if (!s) s = find_bad(config_root_setting(&c->cfg), &b, NULL, 1);
    char key[512] = "a value", what[256];
    if (s) setting_path(s, key, sizeof key);
    explain_bad(&b, what, sizeof what);
    return ht_errorc(err, KILN_E_CONFIG, "%s:%u: %s: %s", shown, b.line, key, what);
}

int hc_load(hc_config *c, const char *path, ht_error *err) {
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
    if (config_read_file(&c->cfg, path) != CONFIG_TRUE) return report_parse_error(c, err);
    char *text = slurp(path);
    if (!text) {
        return ht_errorc(err, KILN_E_CONFIG, "%s: cannot read run file: %s", path, strerror(errno));
    }
    snprintf(tmp, sizeof tmp, "%s", path);
    int rc = check_ints(c, text, path, path, dirname(tmp), err);
    free(text);
    return rc;
}

int hc_load_string(hc_config *c, const char *text, const char *label, ht_error *err) {
    memset(c, 0, sizeof *c);
    config_init(&c->cfg);
    c->loaded = 1;
    c->path = strdup(label);
    if (config_read_string(&c->cfg, text) != CONFIG_TRUE) {
        return ht_errorc(err, KILN_E_CONFIG, "%s:%d: %s", label, config_error_line(&c->cfg),
                         config_error_text(&c->cfg));
    }
    return check_ints(c, text, NULL, label, NULL, err);
}

void hc_free(hc_config *c) {
    if (c->loaded) config_destroy(&c->cfg);
    free(c->path);
    memset(c, 0, sizeof *c);
}

int hc_write(hc_config *c, const char *path, ht_error *err) {
    if (config_write_file(&c->cfg, path) != CONFIG_TRUE) {
        return ht_errorc(err, KILN_E_IO, "%s: cannot write the effective config: %s", path, strerror(errno));
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

/* Replace element `idx` of an array or list by a copy of `nv`. libconfig 1.5
 * can only append, so the elements from idx on are set aside and appended
 * again. An int array taking a 64-bit value becomes an int64 array: libconfig
 * refuses a mixed array when the effective file is read back. */
static int replace_elem(config_setting_t *list, int idx, const config_setting_t *nv) {
    config_t keep;
    config_init(&keep);
    config_setting_t *saved = config_setting_add(config_root_setting(&keep), "t", CONFIG_TYPE_LIST);
    int n = config_setting_length(list), ok = saved != NULL;
    int widen = config_setting_type(list) == CONFIG_TYPE_ARRAY && config_setting_type(nv) == CONFIG_TYPE_INT64;
    int from = widen ? 0 : idx;
    for (int i = from; ok && i < n; i++)
        ok = copy_setting(saved, NULL, config_setting_get_elem(list, (unsigned)i)) != NULL;
    for (int i = n - 1; ok && i >= from; i--) ok = config_setting_remove_elem(list, (unsigned)i) == CONFIG_TRUE;
    for (int i = from; ok && i < n; i++) {
        const config_setting_t *e = i == idx ? nv : config_setting_get_elem(saved, (unsigned)(i - from));
        if (widen) {
            config_setting_t *d = config_setting_add(list, NULL, CONFIG_TYPE_INT64);
            ok = d && config_setting_set_int64(d, config_setting_get_int64(e)) == CONFIG_TRUE;
        } else ok = copy_setting(list, NULL, e) != NULL;
    }
    config_destroy(&keep);
    return ok;
}

/* Put a copy of `nv` where `old` is: a group member by name, an element of an
 * array or list by index (it has no name). */
static int replace_setting(config_setting_t *old, const config_setting_t *nv) {
    config_setting_t *p = config_setting_parent(old);
    const char *nm = config_setting_name(old);
    if (!nm) return replace_elem(p, config_setting_index(old), nv);
    char nmc[256];
    snprintf(nmc, sizeof nmc, "%s", nm);
    if (config_setting_remove(p, nmc) != CONFIG_TRUE) return 0;
    return copy_setting(p, nmc, nv) != NULL;
}

int hc_override(hc_config *c, const char *assignment, ht_error *err) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        return ht_errorc(err, KILN_E_CONFIG, "--set %s: expected KEY=VALUE (e.g. --set optimizer.lr=0.05)", assignment);
    }
    char key[256];
    size_t kl = (size_t)(eq - assignment);
    if (kl >= sizeof key) return ht_errorc(err, KILN_E_CONFIG, "--set: key too long");
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
    bad_int b;
    if (parsed && scan_ints(val, NULL, NULL, 0, &b)) {
        char what[256];
        explain_bad(&b, what, sizeof what);
        ht_errorf(err, "--set %s=%s: %s: %s", key, val, key, what);
        config_destroy(&tmp);
        return KILN_E_CONFIG;
    }

    config_setting_t *old = config_lookup(&c->cfg, key);
    /* libconfig's lookup of a key made of dots alone ("." or "..") is the
     * root: replacing that would leave the config without one */
    if (old && !config_setting_parent(old)) {
        ht_errorf(err, "--set %s=%s: expected a key naming a setting (e.g. --set optimizer.lr=0.05), found '%s'", key,
                  val, key);
        config_destroy(&tmp);
        return KILN_E_CONFIG;
    }
    if (old) {
        int ot = config_setting_type(old), nt = config_setting_type(nv);
        int o_num = ot == CONFIG_TYPE_INT || ot == CONFIG_TYPE_INT64, n_num = nt == CONFIG_TYPE_INT || nt == CONFIG_TYPE_INT64;
        char where[PATH_MAX + 32];
        hc_where(c, old, where, sizeof where);
        if (ot == nt || (o_num && n_num)) {
            int ok;
            if (ot == CONFIG_TYPE_INT && nt == CONFIG_TYPE_INT64) {
                /* keep the file's width unless the value needs 64 bits */
                long long x = config_setting_get_int64(nv);
                if (x >= INT32_MIN && x <= INT32_MAX) ok = config_setting_set_int(old, (int)x) == CONFIG_TRUE;
                else ok = replace_setting(old, nv);
            } else if (ot == CONFIG_TYPE_INT64 && n_num) {
                ok = config_setting_set_int64(old, config_setting_get_int64(nv)) == CONFIG_TRUE;
            } else if (is_scalar(ot)) {
                ok = set_scalar(old, nv) == CONFIG_TRUE;
            } else {
                ok = replace_setting(old, nv);
            }
            if (!ok) {
                rc = ht_errorc(err, KILN_E_CONFIG,
                               "--set %s=%s: cannot replace the %s (as at %s)", key, val, cfg_type_name(ot), where);
            }
        } else if (ot == CONFIG_TYPE_FLOAT && n_num) {
            config_setting_set_float(old, (double)config_setting_get_int64(nv));
        } else if (ot == CONFIG_TYPE_STRING && is_scalar(nt)) {
            /* --set precision.name=16 means the string "16" */
            config_setting_set_string(old, val);
        } else if (ot == CONFIG_TYPE_STRING && is_slot(key) && nt == CONFIG_TYPE_GROUP) {
            /* --set 'accelerator={ name = "cuda"; attention = "flash"; }'
             * over accelerator = "cpu": the short form is a section holding
             * only its name, so a whole section takes its place */
            if (!replace_setting(old, nv))
                rc = ht_errorc(err, KILN_E_CONFIG, "--set %s=%s: cannot replace the string (as at %s)", key, val,
                               where);
        } else if (ot == CONFIG_TYPE_GROUP && is_slot(key) && is_scalar(nt)) {
            /* --set precision=bf16 over precision = { name = ...; ... }: another
             * plugin, so the old plugin's keys go too; say which (--set
             * precision.name=bf16 keeps them) */
            char dropped[512] = "";
            for (int k = 0; k < config_setting_length(old); k++) {
                const char *mn = config_setting_name(config_setting_get_elem(old, (unsigned)k));
                if (!mn || !strcmp(mn, "name")) continue;
                size_t dl = strlen(dropped);
                snprintf(dropped + dl, sizeof dropped - dl, "%s%s", dl ? ", " : "", mn);
            }
            if (dropped[0])
                HLOG_INFO("--set %s=%s replaces the whole %s section, whose keys %s are dropped (--set %s.name=%s "
                          "would keep them)", key, val, key, dropped, key, val);
            config_setting_t *root = config_root_setting(&c->cfg);
            config_setting_remove(root, key);
            config_setting_t *ns = config_setting_add(root, key, CONFIG_TYPE_STRING);
            if (!ns || !config_setting_set_string(ns, val)) {
                rc = ht_errorc(err, KILN_E_CONFIG, "--set %s=%s: cannot replace the group", key, val);
            }
        } else {
            rc = ht_errorc(err, KILN_E_CONFIG,
                           "--set %s=%s: expected a %s (as at %s), found a %s", key, val, cfg_type_name(ot), where,
                           cfg_type_name(nt));
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
                /* an element the lookup did not find: out of range, or a
                 * group element that gets a new key */
                int pt = config_setting_type(parent), n = config_setting_length(parent);
                char *end = NULL;
                long i = strtol(tok + 1, &end, 10);
                if (pt != CONFIG_TYPE_ARRAY && pt != CONFIG_TYPE_LIST) {
                    rc = ht_errorc(err, KILN_E_CONFIG, "--set %s: %s is not a list", key, tok);
                } else if (!end || end == tok + 1 || strcmp(end, "]") || i < 0 || i >= n) {
                    char where[PATH_MAX + 32], pp[512];
                    hc_where(c, parent, where, sizeof where);
                    setting_path(parent, pp, sizeof pp);
                    rc = ht_errorc(err, KILN_E_CONFIG,
                                   "--set %s: expected an index in [0..%d] (%s has %d element%s, at %s), found %s",
                                   key, n - 1, pp, n, n == 1 ? "" : "s", where, tok);
                } else if (!next || config_setting_type(config_setting_get_elem(parent, (unsigned)i)) != CONFIG_TYPE_GROUP) {
                    rc = ht_errorc(err, KILN_E_CONFIG, "--set %s: element %s is a %s, not a group", key, tok,
                                   cfg_type_name(config_setting_type(config_setting_get_elem(parent, (unsigned)i))));
                } else parent = config_setting_get_elem(parent, (unsigned)i);
                tok = next;
                continue;
            }
            config_setting_t *m = config_setting_get_member(parent, tok);
            /* libconfig creates a setting named true or false, but its own
             * parser reads those words as booleans: the effective config
             * written with one would not load again */
            if (!m && (!strcasecmp(tok, "true") || !strcasecmp(tok, "false"))) {
                rc = ht_errorc(err, KILN_E_CONFIG,
                               "--set %s: '%s' is not a valid setting name (a boolean literal)", key, tok);
                break;
            }
            if (!next && m) {
                /* there now: the short form of a slot just became a group
                 * holding `name` (--set precision.name=X over precision =
                 * "32-true") */
                if (!replace_setting(m, nv)) {
                    rc = ht_errorc(err, KILN_E_CONFIG, "--set %s: cannot replace '%s'", key, tok);
                }
            } else if (!next) {
                if (!copy_setting(parent, tok, nv)) {
                    rc = ht_errorc(err, KILN_E_CONFIG, "--set %s: '%s' is not a valid setting name", key, tok);
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
                    rc = ht_errorc(err, KILN_E_CONFIG, "--set %s: cannot turn '%s' into a group", key, tok);
                }
            } else if (m) {
                int mt = config_setting_type(m);
                if (mt != CONFIG_TYPE_GROUP && !((mt == CONFIG_TYPE_ARRAY || mt == CONFIG_TYPE_LIST) && next[0] == '[')) {
                    rc = ht_errorc(err, KILN_E_CONFIG, "--set %s: '%s' is a %s, not a group", key, tok,
                                   cfg_type_name(config_setting_type(m)));
                }
                parent = m;
            } else {
                parent = config_setting_add(parent, tok, CONFIG_TYPE_GROUP);
                if (!parent) rc = ht_errorc(err, KILN_E_CONFIG, "--set %s: '%s' is not a valid setting name", key, tok);
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
                         const char *what, ht_error *err) {
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
            return ht_errorc(err, KILN_E_CONFIG, "%s: unknown key '%s' in %s%s", where, nm, what, hint);
        }
    }
    return KILN_OK;
}

int hc_check_structure(hc_config *c, ht_error *err) {
    config_setting_t *root = config_root_setting(&c->cfg);
    int rc = check_members(c, root, top_keys, (int)(sizeof top_keys / sizeof top_keys[0]), "the run file", err);
    if (rc) return rc;
    config_setting_t *pl = config_setting_get_member(root, "plugins");
    if (pl) {
        char where[PATH_MAX + 32];
        hc_where(c, pl, where, sizeof where);
        if (config_setting_type(pl) != CONFIG_TYPE_GROUP) {
            return ht_errorc(err, KILN_E_CONFIG, "%s: 'plugins' must be a group { dirs = [...]; }, found a %s", where,
                            cfg_type_name(config_setting_type(pl)));
        }
        rc = check_members(c, pl, plugins_keys, 2, "plugins", err);
        if (rc) return rc;
    }
    config_setting_t *cb = config_setting_get_member(root, "callbacks");
    if (cb && config_setting_type(cb) != CONFIG_TYPE_LIST) {
        char where[PATH_MAX + 32];
        hc_where(c, cb, where, sizeof where);
        return ht_errorc(err, KILN_E_CONFIG,
                         "%s: 'callbacks' must be a list ( { name = \"...\"; }, ... ), found a %s", where,
                         cfg_type_name(config_setting_type(cb)));
    }
    config_setting_t *ol = config_setting_get_member(root, "optimizers");
    if (ol) {
        char where[PATH_MAX + 32];
        hc_where(c, ol, where, sizeof where);
        if (config_setting_type(ol) != CONFIG_TYPE_LIST || config_setting_length(ol) < 1) {
            return ht_errorc(err, KILN_E_CONFIG,
                             "%s: 'optimizers' must be a non-empty list ( { name = \"...\"; params = [\"...\"]; }, ... )",
                             where);
        }
        if (config_setting_get_member(root, "optimizer")) {
            return ht_errorc(err, KILN_E_CONFIG,
                             "%s: both 'optimizer' and 'optimizers' are set; use one (optimizers for several)", where);
        }
        for (int i = 0; i < config_setting_length(ol); i++) {
            config_setting_t *e = config_setting_get_elem(ol, (unsigned)i);
            config_setting_t *pr = config_setting_type(e) == CONFIG_TYPE_GROUP ? config_setting_get_member(e, "params")
                                                                               : NULL;
            const char *nm;
            hc_where(c, e, where, sizeof where);
            if (config_setting_type(e) != CONFIG_TYPE_GROUP || !config_setting_lookup_string(e, "name", &nm)) {
                return ht_errorc(err, KILN_E_CONFIG,
                                 "%s: optimizers.[%d] must be a group with name = \"...\"", where, i);
            }
            int ok = !pr || config_setting_type(pr) == CONFIG_TYPE_ARRAY || config_setting_type(pr) == CONFIG_TYPE_LIST;
            for (int k = 0; ok && pr && k < config_setting_length(pr); k++)
                ok = config_setting_type(config_setting_get_elem(pr, (unsigned)k)) == CONFIG_TYPE_STRING;
            if (!ok) {
                hc_where(c, pr, where, sizeof where);
                return ht_errorc(err, KILN_E_CONFIG,
                                 "%s: optimizers.[%d].params must be a list of parameter-name patterns "
                                 "([\"generator.*\"]), found a %s", where, i, cfg_type_name(config_setting_type(pr)));
            }
        }
    }
    config_setting_t *tr = config_setting_get_member(root, "trainer");
    if (tr && config_setting_type(tr) != CONFIG_TYPE_GROUP) {
        char where[PATH_MAX + 32];
        hc_where(c, tr, where, sizeof where);
        return ht_errorc(err, KILN_E_CONFIG,
                         "%s: 'trainer' must be a group, found a %s", where, cfg_type_name(config_setting_type(tr)));
    }
    hc_kvset tmp;
    rc = hc_resolve(c, tr, hc_trainer_params, "trainer", &tmp, err);
    if (rc == KILN_OK) hc_kvset_free(&tmp);
    return rc;
}

int hc_plugin_dirs(hc_config *c, const char ***dirs, int *ndirs, int *allow_symlinks, ht_error *err) {
    *dirs = NULL;
    *ndirs = 0;
    *allow_symlinks = 0;
    config_setting_t *d = config_lookup(&c->cfg, "plugins.dirs");
    config_setting_t *a = config_lookup(&c->cfg, "plugins.allow_symlinks");
    char where[PATH_MAX + 32];
    if (a) {
        if (config_setting_type(a) != CONFIG_TYPE_BOOL) {
            hc_where(c, a, where, sizeof where);
            return ht_errorc(err, KILN_E_CONFIG, "%s: plugins.allow_symlinks must be true or false, found a %s", where,
                            cfg_type_name(config_setting_type(a)));
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
                return ht_errorc(err, KILN_E_CONFIG,
                                 "%s: plugins.dirs must hold strings, element %d is not one", where, i);
            }
            out[i] = s;
        }
        *dirs = out; /* the caller frees the array (not the strings) */
        *ndirs = n;
    } else {
        return ht_errorc(err, KILN_E_CONFIG,
                         "%s: plugins.dirs must be an array of absolute paths, found a %s", where, cfg_type_name(t));
    }
    for (int i = 0; i < *ndirs; i++)
        if ((*dirs)[i][0] != '/') {
            ht_errorf(err, "%s: plugin directory '%s' must be an absolute path, found a relative one", where,
                     (*dirs)[i]);
            free((void *)*dirs);
            *dirs = NULL;
            *ndirs = 0;
            return KILN_E_CONFIG;
        }
    return KILN_OK;
}

const char *hc_slot_name(hc_config *c, const char *slot, const char *fallback, config_setting_t **section,
                         ht_error *err) {
    *section = NULL;
    config_setting_t *s = config_setting_get_member(config_root_setting(&c->cfg), slot);
    if (!s) return fallback;
    char where[PATH_MAX + 32];
    hc_where(c, s, where, sizeof where);
    if (config_setting_type(s) == CONFIG_TYPE_STRING) return config_setting_get_string(s);
    if (config_setting_type(s) != CONFIG_TYPE_GROUP) {
        ht_errorf(err, "%s: '%s' must be a plugin name or a group { name = \"...\"; ... }, found a %s", where, slot,
                 cfg_type_name(config_setting_type(s)));
        return NULL;
    }
    *section = s;
    const char *name = NULL;
    if (!config_setting_lookup_string(s, "name", &name)) {
        if (fallback) return fallback;
        ht_errorf(err, "%s: the %s section needs name = \"...\" naming its plugin", where, slot);
        return NULL;
    }
    return name;
}

/* The callbacks and optimizers lists: entries of a top-level list (0 and
 * NULL when the run file has none). */
static int list_count(hc_config *c, const char *key) {
    config_setting_t *l = config_lookup(&c->cfg, key);
    return l ? config_setting_length(l) : 0;
}

static config_setting_t *list_entry(hc_config *c, const char *key, int i) {
    config_setting_t *l = config_lookup(&c->cfg, key);
    return l ? config_setting_get_elem(l, (unsigned)i) : NULL;
}

int hc_callback_count(hc_config *c) { return list_count(c, "callbacks"); }
config_setting_t *hc_callback(hc_config *c, int i) { return list_entry(c, "callbacks", i); }
int hc_optimizer_count(hc_config *c) { return list_count(c, "optimizers"); }
config_setting_t *hc_optimizer(hc_config *c, int i) { return list_entry(c, "optimizers", i); }

/* ---------------------------------------------------------------------------
 * Reading settings for the trainer (config.h's hc_node API): the trainer
 * and the schedule read the run file through these, never libconfig. */

hc_node *hc_lookup(const hc_config *c, const char *path) { return config_lookup(&c->cfg, path); }

int hc_is_int(const hc_node *s) {
    return s && (config_setting_type(s) == CONFIG_TYPE_INT || config_setting_type(s) == CONFIG_TYPE_INT64);
}

hc_node *hc_member(const hc_node *s, const char *key) { return s ? config_setting_get_member(s, key) : NULL; }

const char *hc_member_string(const hc_node *s, const char *key) {
    const char *v = NULL;
    if (s) config_setting_lookup_string(s, key, &v);
    return v;
}

int hc_member_int64(const hc_node *s, const char *key, int64_t *out) {
    if (!s) return 0;
    long long v;
    int i;
    int found = config_setting_lookup_int64(s, key, &v) == CONFIG_TRUE;
    if (config_setting_lookup_int(s, key, &i) == CONFIG_TRUE) v = i, found = 1;
    if (found) *out = (int64_t)v;
    return found;
}

int hc_list_length(const hc_node *s) { return s ? config_setting_length(s) : 0; }

const char *hc_list_string(const hc_node *s, int i) { return config_setting_get_string_elem(s, i); }

const char *hc_entry_name(hc_node *entry, hc_node **section) {
    *section = NULL;
    if (!entry) return NULL;
    if (config_setting_type(entry) == CONFIG_TYPE_STRING) return config_setting_get_string(entry);
    const char *name = NULL;
    if (config_setting_type(entry) != CONFIG_TYPE_GROUP || !config_setting_lookup_string(entry, "name", &name))
        return NULL;
    *section = entry;
    return name;
}

char *hc_text(const hc_config *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    config_write(&c->cfg, f);
    fclose(f);
    return buf;
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
               hc_kvset *out, ht_error *err) {
    return hc_resolve_host(c, section, params, NULL, what, out, err);
}

int hc_resolve_host(const hc_config *c, config_setting_t *section, const kiln_param *params,
                    const char *const *host_keys, const char *what, hc_kvset *out, ht_error *err) {
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
            if (dym) ht_errorf(err, "%s: unknown key '%s' for %s (did you mean '%s'?)", where, nmk, what, dym);
            else ht_errorf(err, "%s: unknown key '%s' for %s (accepted: %s)", where, nmk, what, np ? list : "none");
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
                rc = ht_errorc(err, KILN_E_CONFIG,
                               "%s: %s.%s must be a %s, found a %s", where, what, p->key, ktype_name(p->type), found);
                break;
            }
        } else if (p->flags & KILN_PARAM_REQUIRED || p->def.type == KILN_TYPE_NONE) {
            if (p->flags & KILN_PARAM_REQUIRED) {
                hc_where(c, section, where, sizeof where);
                rc = ht_errorc(err, KILN_E_CONFIG,
                               "%s: %s requires key '%s' (%s: %s)", section ? where : c->path, what, p->key,
                               ktype_name(p->type), p->help ? p->help : "");
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
