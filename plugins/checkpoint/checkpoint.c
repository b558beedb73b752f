/*
 * checkpoint.c — Lightning's ModelCheckpoint as a kiln callback plugin. It
 * decides when a checkpoint of the whole run is due and under which name, and
 * asks the host for it with svc->save_checkpoint (ABI 1.2); the host writes
 * the file atomically LATER, at the end of the current batch or epoch, so
 * this plugin never writes checkpoint bytes itself. Triggers follow
 * lightning/pytorch/callbacks/model_checkpoint.py: every_n_train_steps at
 * on_train_batch_end (global_step % n == 0), every_n_epochs at
 * on_train_epoch_end or on_validation_end ((epoch + 1) % n == 0, with
 * Lightning's save_on_train_epoch_end rule when the key is unset), only while
 * fitting, never during the sanity check and never twice at one global step.
 * With `monitor` it keeps the best save_top_k checkpoints by that metric
 * (torch.lt/gt against the k-th best, NaN stored as the worst value); without
 * it, the newest (save_top_k 1) or all (-1). save_last asks for
 * <dirpath>/last.safetensors at every trigger. An evicted file is deleted
 * only once the file that replaced it exists on disk (the host writes it
 * after the hook returns): it waits in a pending list checked at every later
 * hook and at on_fit_end. Only files this callback asked for, inside the
 * current dirpath, are ever deleted; never last.safetensors, and never the
 * file a restored state names as its newest top-k checkpoint (the checkpoint
 * a resumed run most likely started from; the ABI does not say which file
 * that was). Every rank keeps the same bookkeeping; only rank 0 requests,
 * deletes and logs. Differences from Lightning: files end in .safetensors;
 * the filename template does not insert "name=" itself (the default
 * "epoch={epoch}-step={step}" spells it out; Lightning's
 * auto_insert_metric_name = False); field specs are the printf-like subset
 * [+][0][width][.precision][d|f|F|e|E|g|G] (d rounds a float, which Python
 * refuses), a float without a spec is written with the shortest %g that
 * round-trips (Python's repr except for 1e15 <= |x| < 1e16), and a field
 * naming no logged metric is written as 0 as Lightning does, with one
 * warning; a missing monitor metric is KILN_E_CONFIG once a
 * validation run ended while fitting, before that a warning (Lightning:
 * MisconfigurationException / warning likewise); save_weights_only, "link"
 * and train_time_interval are not offered; save_top_k -1 without monitor
 * never overwrites an earlier file of the same name (Lightning reuses the
 * name of best_model_path); a restored state continues the
 * bookkeeping when the configured dirpath string is unchanged (Lightning
 * compares resolved paths, which kiln's fresh version_N run directory would
 * always change), and files it lists outside the current dirpath are kept,
 * never deleted.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kiln/kiln.h>

#include "../common/plugin_common.h"

#define CK_EXT ".safetensors"
#define CK_LAST_NAME "last" CK_EXT
#define CK_PATH_MAX 4096
#define CK_MAX_VERSIONS 100000     /* -vN suffixes tried before giving up     */
#define CK_STATE_VERSION 1u
#define CK_STATE_MAGIC "KCK1"

enum { CK_MODE_MIN = 0, CK_MODE_MAX = 1 };
enum { CK_UNSET = -1 };

/* One piece of the filename template: literal text, or a field
 * {name[:spec]} whose spec is [+][0][width][.precision][type]. */
typedef struct ck_part {
    char *text;       /* the literal text, or the field's name                  */
    int is_field;
    int plus, zero;   /* '+': sign always; '0': zero padding                    */
    int width, prec;  /* prec -1: none                                          */
    char type;        /* 0 or one of d f F e E g G                              */
    int warned;       /* a missing metric was reported once                     */
} ck_part;

typedef struct ck_entry {
    char *path;       /* absolute                                               */
    double score;     /* the monitored value when it was saved (NaN as worst)   */
} ck_entry;

/* A file to delete once the file that replaced it exists. */
typedef struct ck_pending {
    char *victim;
    char *replacement;
} ck_pending;

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    /* configuration (strings valid until destroy) */
    const char *dirpath_cfg;   /* as configured: absolute or run-dir relative */
    const char *monitor;       /* NULL: no monitor                             */
    int mode;                  /* CK_MODE_*                                    */
    int64_t save_top_k;        /* -1 all, 0 none, k                            */
    int save_last, verbose, version_counter;
    int64_t every_n_train_steps, every_n_epochs;
    int save_on_train_epoch_end; /* 0/1, or CK_UNSET: Lightning's rule          */
    ck_part *parts;            /* (nparts) the parsed filename template        */
    size_t nparts;
    char *dirpath;             /* absolute, resolved at on_fit_start          */
    /* this process only */
    int fitting;               /* between on_fit_start and on_fit_end          */
    int val_has_run;           /* a validation run ended while fitting        */
    int warned_missing_monitor;
    /* bookkeeping (checkpointed) */
    int64_t last_step_saved;   /* Lightning's _last_global_step_saved (0)     */
    int64_t last_epoch_saved;  /* -1 before any request                        */
    ck_entry *best_k;          /* (nbest) Lightning's best_k_models, in
                                  insertion order (ties go to the older)      */
    size_t nbest, capbest;
    char *kth_path;            /* the entry evicted next, once k are kept      */
    double kth_value;          /* its score; +inf (min) / -inf (max) before   */
    char *best_path;           /* best_model_path; the newest without monitor */
    double best_score;
    int has_best_score;
    double current_score;
    int has_current_score;
    char *last_model_path;     /* <dirpath>/last.safetensors once requested   */
    char *last_topk_path;      /* the newest top-k request                     */
    ck_pending *pending;       /* (npending) deletions waiting (rank 0)        */
    size_t npending, cappending;
    char *protected_path;      /* a restored state's last_topk_path           */
};

static const char *ck_mode_name(int mode) { return mode == CK_MODE_MAX ? "max" : "min"; }

/* torch.lt (min) / torch.gt (max): strict, so NaN is never better */
static int ck_better(const kiln_instance *self, double a, double b) {
    return self->mode == CK_MODE_MAX ? a > b : a < b;
}

static const kiln_trainer_state *ck_trainer(const kiln_instance *self, const kiln_event *ev) {
    if (ev && ev->trainer) return ev->trainer;
    return self->svc->trainer_state ? self->svc->trainer_state(self->hctx) : NULL;
}

static int ck_rank(const kiln_trainer_state *ts) { return ts ? ts->rank : 0; }

static void ck_set(char **dst, const char *src) {
    free(*dst);
    *dst = src ? strdup(src) : NULL;
}

static int ck_exists(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0;
}

static const char *ck_basename(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* A name relative to a directory that stays inside it: not empty, not
 * absolute, and no component that is empty, "." or "..". Checkpoint names
 * come from the filename template (which may have sub-folders) and, after a
 * resume, from a checkpoint file, which kiln does not trust. */
static int ck_rel_ok(const char *rel) {
    if (!rel || !rel[0] || rel[0] == '/') return 0;
    for (const char *c = rel;;) {
        size_t n = strcspn(c, "/");
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) return 0;
        c += n;
        if (!*c) return 1;
        c++; /* the '/' */
    }
}

/* A string from a restored state as it may appear in a message: control
 * characters escaped (a newline in a crafted path or monitor name must not
 * forge a log line), cut to what fits in buf. */
static const char *ck_q(const char *s, char *buf, size_t n) {
    size_t o = 0;
    for (; s && *s && o + 5 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7F) o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = 0;
    return buf;
}

/* An absolute path in normal form: "/" then a safe relative name. */
static int ck_abs_ok(const char *path) { return path && path[0] == '/' && ck_rel_ok(path + 1); }

/* The part of `path` after "<dir>/" when that part is a safe relative name
 * (ck_rel_ok), else NULL. */
static const char *ck_inside(const char *dir, const char *path) {
    if (!dir || !path) return NULL;
    size_t dl = strlen(dir);
    if (strncmp(path, dir, dl) != 0 || path[dl] != '/') return NULL;
    return ck_rel_ok(path + dl + 1) ? path + dl + 1 : NULL;
}

/* The folder that holds `path`, with symbolic links resolved, is `dir` or
 * below it (also resolved): a sub-folder that was replaced by a link to
 * elsewhere does not lead a deletion out of dirpath. A folder that does not
 * exist holds nothing to delete. */
static int ck_parent_resolves_inside(const char *dir, const char *path) {
    char parent[CK_PATH_MAX], rd[CK_PATH_MAX], rp[CK_PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash || (size_t)(slash - path) >= sizeof parent) return 0;
    memcpy(parent, path, (size_t)(slash - path));
    parent[slash - path] = '\0';
    if (!realpath(dir, rd) || !realpath(parent, rp)) return 0;
    size_t dl = strlen(rd);
    return strncmp(rp, rd, dl) == 0 && (rp[dl] == '\0' || rp[dl] == '/' || (dl == 1 && rd[0] == '/'));
}

/* ---------------------------------------------------------------------------
 * The filename template */

/* [+][0][width][.precision][type]; 0 when valid */
static int ck_parse_spec(const char *s, ck_part *p) {
    if (*s == '+') p->plus = 1, s++;
    if (*s == '0') p->zero = 1, s++;
    for (; *s >= '0' && *s <= '9'; s++) {
        p->width = p->width * 10 + (*s - '0');
        if (p->width > 64) return -1;
    }
    if (*s == '.') {
        s++;
        if (*s < '0' || *s > '9') return -1;
        p->prec = 0;
        for (; *s >= '0' && *s <= '9'; s++) {
            p->prec = p->prec * 10 + (*s - '0');
            if (p->prec > 30) return -1;
        }
    }
    if (*s && strchr("dfFeEgG", *s)) p->type = *s++;
    if (*s) return -1;
    return p->type == 'd' && p->prec >= 0 ? -1 : 0; /* Python refuses {x:.2d} */
}

static int32_t ck_template_error(kiln_instance *self, const char *tmpl, const char *what) {
    return kiln_errorf(self->svc, self->hctx, KILN_E_CONFIG,
                       "checkpoint: filename \"%s\": %s (expected text with fields like {epoch}, {step}, "
                       "{val_loss:.4f})",
                       tmpl, what);
}

static void ck_add_literal(kiln_instance *self, char *lit, size_t *nl) {
    if (!*nl) return;
    lit[*nl] = '\0';
    ck_part *p = &self->parts[self->nparts++];
    p->text = strdup(lit);
    *nl = 0;
}

static int32_t ck_parse_template(kiln_instance *self, const char *t) {
    size_t len = strlen(t);
    /* a path inside dirpath: no absolute name, no ".." component */
    if (t[0] == '/') return ck_template_error(self, t, "is absolute; it is relative to dirpath (set dirpath for the folder)");
    for (const char *c = t; *c;) {
        size_t n = strcspn(c, "/");
        if (n == 2 && c[0] == '.' && c[1] == '.')
            return ck_template_error(self, t, "has a \"..\" component; checkpoints stay inside dirpath");
        c += n;
        if (*c == '/') c++;
    }
    self->parts = calloc(len + 1, sizeof *self->parts);
    char *lit = malloc(len + 1);
    if (!self->parts || !lit) {
        free(lit);
        return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "checkpoint: out of memory");
    }
    size_t nl = 0;
    int32_t rc = KILN_OK;
    char msg[160];
    for (size_t i = 0; i < len && rc == KILN_OK; i++) {
        char c = t[i];
        if ((c == '{' || c == '}') && t[i + 1] == c) { /* {{ and }} are literal braces */
            lit[nl++] = c;
            i++;
        } else if (c == '}') {
            snprintf(msg, sizeof msg, "'}' at offset %zu closes no field (write '}}' for a literal brace)", i);
            rc = ck_template_error(self, t, msg);
        } else if (c == '{') {
            const char *close = strchr(t + i + 1, '}');
            const char *open = strchr(t + i + 1, '{');
            if (!close || (open && open < close)) {
                snprintf(msg, sizeof msg, "the field opened at offset %zu is not closed", i);
                rc = ck_template_error(self, t, msg);
                break;
            }
            const char *name = t + i + 1;
            const char *colon = memchr(name, ':', (size_t)(close - name));
            size_t nlen = (size_t)((colon ? colon : close) - name);
            if (nlen == 0) {
                snprintf(msg, sizeof msg, "the field at offset %zu has no name", i);
                rc = ck_template_error(self, t, msg);
                break;
            }
            ck_add_literal(self, lit, &nl);
            ck_part *p = &self->parts[self->nparts++];
            p->is_field = 1;
            p->prec = -1;
            p->text = strndup(name, nlen);
            if (colon) {
                char spec[64];
                size_t sl = (size_t)(close - colon - 1);
                int bad = sl >= sizeof spec;
                if (!bad) {
                    memcpy(spec, colon + 1, sl);
                    spec[sl] = '\0';
                    bad = ck_parse_spec(spec, p) != 0;
                }
                if (bad) {
                    snprintf(msg, sizeof msg,
                             "field {%.*s} has the format spec \"%.*s\"; expected [+][0][width][.precision][type] "
                             "with type d, f, F, e, E, g or G (no precision with d)",
                             (int)nlen, name, (int)(sl < 40 ? sl : 40), colon + 1);
                    rc = ck_template_error(self, t, msg);
                    break;
                }
            }
            i = (size_t)(close - t);
        } else {
            lit[nl++] = c;
        }
    }
    if (rc == KILN_OK) {
        /* "best.safetensors" means "best": the extension is always added */
        size_t el = strlen(CK_EXT);
        if (nl >= el && memcmp(lit + nl - el, CK_EXT, el) == 0) nl -= el;
        ck_add_literal(self, lit, &nl);
        if (self->nparts == 0) rc = ck_template_error(self, t, "gives an empty name");
    }
    free(lit);
    for (size_t i = 0; i < self->nparts; i++)
        if (!self->parts[i].text) rc = kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "checkpoint: out of memory");
    return rc;
}

/* Python's repr(float), nearly: the shortest %g that reads back exactly,
 * with ".0" for an integral value. */
static void ck_repr(double v, char *out, size_t n) {
    if (isnan(v)) { snprintf(out, n, "nan"); return; }
    if (isinf(v)) { snprintf(out, n, v > 0 ? "inf" : "-inf"); return; }
    for (int p = 1; p <= 17; p++) {
        snprintf(out, n, "%.*g", p, v);
        if (strtod(out, NULL) == v) break;
    }
    if (!strpbrk(out, ".e")) strncat(out, ".0", n - strlen(out) - 1);
}

/* Pad `s` to the field's width: zeros after the sign with '0', else spaces
 * on the left (Python right-aligns numbers). */
static void ck_pad(const ck_part *p, const char *s, char *out, size_t n) {
    size_t len = strlen(s), o = 0;
    size_t w = (size_t)p->width > len ? (size_t)p->width - len : 0;
    size_t sign = (s[0] == '+' || s[0] == '-') ? 1 : 0;
    int zeros = p->zero && isdigit((unsigned char)s[sign]);
    if (zeros && sign && o + 1 < n) out[o++] = s[0];
    for (size_t i = 0; i < w && o + 1 < n; i++) out[o++] = zeros ? '0' : ' ';
    for (const char *c = s + (zeros ? sign : 0); *c && o + 1 < n; c++) out[o++] = *c;
    out[o] = '\0';
}

/* One field's text: `v` is an integer when is_int (epoch, step, a missing
 * metric's 0), else a float. */
static void ck_format_value(const ck_part *p, double v, int is_int, char *out, size_t n) {
    char tmp[128], fmt[32];
    if (is_int && (p->type == 0 || p->type == 'd')) {
        snprintf(fmt, sizeof fmt, "%%%s%s%.0dlld", p->plus ? "+" : "", p->zero ? "0" : "", p->width);
        snprintf(out, n, fmt, (long long)v);
        return;
    }
    if (p->type == 'd') { /* a float as an integer: rounded */
        if (!isfinite(v)) ck_repr(v, tmp, sizeof tmp);
        else snprintf(tmp, sizeof tmp, p->plus ? "%+.0f" : "%.0f", nearbyint(v));
        ck_pad(p, tmp, out, n);
        return;
    }
    if (p->type == 0 && p->prec < 0) {
        char r[64];
        ck_repr(v, r, sizeof r);
        snprintf(tmp, sizeof tmp, "%s%s", p->plus && !signbit(v) ? "+" : "", r);
        ck_pad(p, tmp, out, n);
        return;
    }
    snprintf(fmt, sizeof fmt, "%%%s%s%.0d.%d%c", p->plus ? "+" : "", p->zero ? "0" : "", p->width,
             p->prec < 0 ? 6 : p->prec, p->type ? p->type : 'g');
    snprintf(out, n, fmt, v);
}

/* A name the filename or the monitor may use: epoch and step come from the
 * trainer, anything else from callback_metrics. 1 when found. */
static int ck_lookup(const kiln_instance *self, const kiln_trainer_state *ts, const char *name, double *v,
                     int *is_int) {
    *is_int = 0;
    if (!strcmp(name, "epoch") && ts) {
        *v = (double)ts->current_epoch;
        *is_int = 1;
        return 1;
    }
    if (!strcmp(name, "step") && ts) {
        *v = (double)ts->global_step;
        *is_int = 1;
        return 1;
    }
    return self->svc->get_metric && self->svc->get_metric(self->hctx, name, v) == KILN_OK;
}

/* <dirpath>/<formatted template>[-v<ver>].safetensors into out[n] */
static int32_t ck_format_path(kiln_instance *self, const kiln_trainer_state *ts, int64_t ver, char *out, size_t n) {
    size_t len = (size_t)snprintf(out, n, "%s/", self->dirpath);
    for (size_t i = 0; i < self->nparts && len < n; i++) {
        ck_part *p = &self->parts[i];
        char buf[256];
        const char *piece = p->text;
        if (p->is_field) {
            double v = 0.0;
            int is_int = 0;
            if (!ck_lookup(self, ts, p->text, &v, &is_int)) {
                /* Lightning formats a key it cannot find as 0 */
                if (!p->warned && ck_rank(ts) == 0)
                    kiln_logf(self->svc, self->hctx, KILN_LOG_WARN,
                              "checkpoint: filename field {%s} is not a logged metric (step %lld); it is written as "
                              "0 as Lightning does",
                              p->text, (long long)(ts ? ts->global_step : 0));
                for (size_t j = 0; j < self->nparts; j++) /* once per name */
                    if (self->parts[j].is_field && !strcmp(self->parts[j].text, p->text)) self->parts[j].warned = 1;
                v = 0.0;
                is_int = 1;
            }
            ck_format_value(p, v, is_int, buf, sizeof buf);
            piece = buf;
        }
        len += (size_t)snprintf(out + len, n - len, "%s", piece);
    }
    if (ver > 0 && len < n) len += (size_t)snprintf(out + len, n - len, "-v%lld", (long long)ver);
    if (len < n) len += (size_t)snprintf(out + len, n - len, "%s", CK_EXT);
    if (len >= n)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG,
                           "checkpoint: the checkpoint path in %s would exceed %zu bytes", self->dirpath, n - 1);
    return KILN_OK;
}

/* Lightning's version counter: -v1, -v2, ... while the name is taken on
 * disk, except by the file this save replaces (`del`, overwritten). */
static int32_t ck_pick_path(kiln_instance *self, const kiln_trainer_state *ts, const char *del, char *out, size_t n) {
    int32_t rc = ck_format_path(self, ts, 0, out, n);
    if (rc || !self->version_counter) return rc;
    for (int64_t ver = 1; ck_exists(out) && !(del && !strcmp(out, del)); ver++) {
        if (ver > CK_MAX_VERSIONS)
            return kiln_errorf(self->svc, self->hctx, KILN_E_IO,
                               "checkpoint: %lld versions of %s already exist; clean dirpath or change filename",
                               (long long)CK_MAX_VERSIONS, out);
        if ((rc = ck_format_path(self, ts, ver, out, n))) return rc;
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Directory and deletions */

static int32_t ck_resolve_dir(kiln_instance *self, const kiln_trainer_state *ts) {
    char buf[CK_PATH_MAX], cwd[CK_PATH_MAX] = "";
    const char *d = self->dirpath_cfg;
    int n;
    if (d[0] == '/') {
        n = snprintf(buf, sizeof buf, "%s", d);
    } else {
        /* relative to the run directory, itself made absolute so the host
         * (which resolves relative paths against the run directory) and
         * stat/unlink here agree */
        const char *run = ts && ts->run_dir && ts->run_dir[0] ? ts->run_dir : "";
        if (run[0] != '/' && !getcwd(cwd, sizeof cwd))
            return kiln_errorf(self->svc, self->hctx, KILN_E_IO,
                               "checkpoint: cannot resolve dirpath \"%s\": getcwd failed: %s", d, strerror(errno));
        n = snprintf(buf, sizeof buf, "%s%s%s%s%s", cwd, cwd[0] && run[0] ? "/" : "", run,
                     cwd[0] || run[0] ? "/" : "", d);
    }
    if (n < 0 || (size_t)n >= sizeof buf)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG,
                           "checkpoint: dirpath \"%s\" resolves to more than %zu bytes", d, sizeof buf - 1);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    ck_set(&self->dirpath, buf);
    if (!self->dirpath) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "checkpoint: out of memory");
    return KILN_OK;
}

/* Lightning's _should_remove_checkpoint, plus kiln's rules: a file inside
 * the current dirpath, not the replacement itself, not last.safetensors,
 * not the checkpoint a restored state points at. */
static int ck_should_remove(const kiln_instance *self, const char *prev, const char *cur) {
    if (!prev || !self->dirpath || (cur && !strcmp(prev, cur))) return 0;
    if (self->protected_path && !strcmp(prev, self->protected_path)) return 0;
    if (!strcmp(ck_basename(prev), CK_LAST_NAME)) return 0;
    return ck_inside(self->dirpath, prev) != NULL && ck_parent_resolves_inside(self->dirpath, prev);
}

static void ck_pend(kiln_instance *self, const kiln_trainer_state *ts, const char *victim, const char *replacement) {
    if (ck_rank(ts) != 0) return; /* rank 0 deletes */
    if (self->npending == self->cappending) {
        size_t cap = self->cappending ? 2 * self->cappending : 4;
        ck_pending *p = realloc(self->pending, cap * sizeof *p);
        if (!p) return; /* the file is kept: safe */
        self->pending = p;
        self->cappending = cap;
    }
    ck_pending *e = &self->pending[self->npending];
    e->victim = strdup(victim);
    e->replacement = strdup(replacement);
    if (!e->victim || !e->replacement) {
        free(e->victim);
        free(e->replacement);
        return;
    }
    self->npending++;
}

/* Never delete a file that was just asked for again. */
static void ck_unpend(kiln_instance *self, const char *path) {
    size_t j = 0;
    for (size_t i = 0; i < self->npending; i++) {
        if (!strcmp(self->pending[i].victim, path)) {
            free(self->pending[i].victim);
            free(self->pending[i].replacement);
        } else {
            self->pending[j++] = self->pending[i];
        }
    }
    self->npending = j;
}

/* Delete every victim whose replacement now exists; at the end of the fit
 * (`final`) report and forget the others (their files stay). */
static void ck_process_pending(kiln_instance *self, const kiln_trainer_state *ts, int final) {
    /* a restored list before on_fit_start: wait for the directory, which
     * decides what may be deleted */
    if (!self->dirpath && !final) return;
    size_t j = 0;
    for (size_t i = 0; i < self->npending; i++) {
        ck_pending *p = &self->pending[i];
        int done = 1;
        if (ck_rank(ts) != 0) {
            /* a restored list on another rank: rank 0 handles it */
        } else if (ck_exists(p->replacement)) {
            if (!ck_should_remove(self, p->victim, p->replacement)) {
                kiln_logf(self->svc, self->hctx, KILN_LOG_DEBUG, "checkpoint: keeping %s (outside %s or protected)",
                          p->victim, self->dirpath ? self->dirpath : "dirpath");
            } else if (unlink(p->victim) == 0) {
                if (self->verbose)
                    kiln_logf(self->svc, self->hctx, KILN_LOG_INFO, "checkpoint: removed %s (replaced by %s)",
                              p->victim, p->replacement);
            } else if (errno != ENOENT) {
                kiln_logf(self->svc, self->hctx, KILN_LOG_WARN, "checkpoint: could not remove %s: %s", p->victim,
                          strerror(errno));
            }
        } else if (final) {
            kiln_logf(self->svc, self->hctx, KILN_LOG_WARN,
                      "checkpoint: keeping %s: the checkpoint that replaced it, %s, was never written", p->victim,
                      p->replacement);
        } else {
            done = 0;
        }
        if (done) {
            free(p->victim);
            free(p->replacement);
        } else {
            self->pending[j++] = *p;
        }
    }
    self->npending = j;
}

/* ---------------------------------------------------------------------------
 * Saving */

/* Ask the host for a checkpoint at `path` (rank 0) and record the step. */
static int32_t ck_request(kiln_instance *self, const kiln_trainer_state *ts, const char *path, const char *why) {
    self->last_step_saved = ts->global_step;
    self->last_epoch_saved = ts->current_epoch;
    ck_unpend(self, path);
    if (ck_rank(ts) != 0) return KILN_OK;
    int32_t rc = self->svc->save_checkpoint(self->hctx, path);
    if (rc != KILN_OK)
        return kiln_errorf(self->svc, self->hctx, rc, "checkpoint: the host refused save_checkpoint(\"%s\"): %s (%s)",
                           path, kiln_status_name(rc), kiln_strerror(rc));
    kiln_logf(self->svc, self->hctx, KILN_LOG_INFO, "checkpoint: epoch %lld, global step %lld: saving %s%s",
              (long long)ts->current_epoch, (long long)ts->global_step, path, why);
    return KILN_OK;
}

static size_t ck_find(const kiln_instance *self, const char *path) {
    for (size_t i = 0; path && i < self->nbest; i++)
        if (!strcmp(self->best_k[i].path, path)) return i;
    return self->nbest;
}

/* The worst (want_best 0) or best kept entry; the older one on ties, as
 * Python's max/min over a dict in insertion order. */
static size_t ck_extreme(const kiln_instance *self, int want_best) {
    size_t k = 0;
    for (size_t i = 1; i < self->nbest; i++) {
        int better = ck_better(self, self->best_k[i].score, self->best_k[k].score);
        int worse = ck_better(self, self->best_k[k].score, self->best_k[i].score);
        if (want_best ? better : worse) k = i;
    }
    return k;
}

/* Lightning's check_monitor_top_k */
static int ck_check_top_k(const kiln_instance *self, double current) {
    if (self->save_top_k == -1) return 1;
    if ((int64_t)self->nbest < self->save_top_k) return 1;
    return ck_better(self, current, self->kth_value);
}

/* _update_best_and_save */
static int32_t ck_save_monitor(kiln_instance *self, const kiln_trainer_state *ts, double current) {
    if (!ck_check_top_k(self, current)) {
        if (self->verbose && ck_rank(ts) == 0)
            kiln_logf(self->svc, self->hctx, KILN_LOG_INFO,
                      "checkpoint: epoch %lld, global step %lld: %s = %g was not in top %lld",
                      (long long)ts->current_epoch, (long long)ts->global_step, self->monitor, current,
                      (long long)self->save_top_k);
        return KILN_OK;
    }
    size_t k = self->save_top_k == -1 ? self->nbest + 1 : (size_t)self->save_top_k;
    char *del = NULL;
    if (self->nbest == k && k > 0) {
        size_t i = ck_find(self, self->kth_path);
        if (i == self->nbest) i = ck_extreme(self, 0);
        del = self->best_k[i].path;
        memmove(&self->best_k[i], &self->best_k[i + 1], (self->nbest - i - 1) * sizeof *self->best_k);
        self->nbest--;
    }
    if (isnan(current)) current = self->mode == CK_MODE_MIN ? INFINITY : -INFINITY; /* NaN is the worst */
    char path[CK_PATH_MAX];
    int32_t rc = ck_pick_path(self, ts, del, path, sizeof path);
    if (rc == KILN_OK && self->nbest == self->capbest) {
        size_t cap = self->capbest ? 2 * self->capbest : 4;
        ck_entry *b = realloc(self->best_k, cap * sizeof *b);
        if (!b) rc = kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "checkpoint: out of memory");
        else self->best_k = b, self->capbest = cap;
    }
    char *dup = rc == KILN_OK ? strdup(path) : NULL;
    if (rc == KILN_OK && !dup) rc = kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "checkpoint: out of memory");
    if (rc != KILN_OK) {
        free(del);
        return rc;
    }
    self->current_score = current;
    self->has_current_score = 1;
    self->best_k[self->nbest++] = (ck_entry){dup, current};
    if (self->nbest == k) {
        size_t w = ck_extreme(self, 0);
        ck_set(&self->kth_path, self->best_k[w].path);
        self->kth_value = self->best_k[w].score;
    }
    size_t b = ck_extreme(self, 1);
    ck_set(&self->best_path, self->best_k[b].path);
    self->best_score = self->best_k[b].score;
    self->has_best_score = 1;
    ck_set(&self->last_topk_path, path);
    char why[160];
    snprintf(why, sizeof why, " (%s = %.5f, best %.5f, top %lld)", self->monitor, current, self->best_score,
             (long long)k);
    rc = ck_request(self, ts, path, why);
    if (rc == KILN_OK && del && ck_should_remove(self, del, path)) ck_pend(self, ts, del, path);
    free(del);
    return rc;
}

/* _save_none_monitor_checkpoint: the newest is the best */
static int32_t ck_save_none_monitor(kiln_instance *self, const kiln_trainer_state *ts) {
    char path[CK_PATH_MAX];
    /* top 1 may overwrite the file it replaces; with -1 nothing is replaced
     * (Lightning passes best_model_path either way, so a fixed name would be
     * overwritten under "keep all") */
    int32_t rc = ck_pick_path(self, ts, self->save_top_k == 1 ? self->best_path : NULL, path, sizeof path);
    if (rc) return rc;
    char *previous = self->best_path;
    self->best_path = strdup(path);
    ck_set(&self->last_topk_path, path);
    rc = ck_request(self, ts, path, "");
    if (rc == KILN_OK && self->save_top_k == 1 && ck_should_remove(self, previous, path))
        ck_pend(self, ts, previous, path);
    free(previous);
    return rc;
}

static int32_t ck_save_topk(kiln_instance *self, const kiln_trainer_state *ts, const char *hook) {
    if (self->save_top_k == 0) return KILN_OK;
    if (!self->monitor) return ck_save_none_monitor(self, ts);
    double current = NAN;
    int is_int = 0;
    if (!ck_lookup(self, ts, self->monitor, &current, &is_int)) {
        /* The ABI cannot list callback_metrics, so unlike Lightning the
         * message cannot name the keys that do exist. */
        if (self->val_has_run)
            return kiln_errorf(self->svc, self->hctx, KILN_E_CONFIG,
                               "checkpoint: monitor `%s` is not among the logged metrics at %s (epoch %lld, global "
                               "step %lld); log it (self.log / log_value) before this hook, or monitor a metric that "
                               "is logged",
                               self->monitor, hook, (long long)ts->current_epoch, (long long)ts->global_step);
        if (!self->warned_missing_monitor && ck_rank(ts) == 0)
            kiln_logf(self->svc, self->hctx, KILN_LOG_WARN,
                      "checkpoint: monitor `%s` is not logged yet at %s (epoch %lld, global step %lld, before any "
                      "validation); no top-k checkpoint until it is",
                      self->monitor, hook, (long long)ts->current_epoch, (long long)ts->global_step);
        self->warned_missing_monitor = 1;
        return KILN_OK;
    }
    return ck_save_monitor(self, ts, current);
}

static int32_t ck_save_last_ckpt(kiln_instance *self, const kiln_trainer_state *ts) {
    char path[CK_PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", self->dirpath, CK_LAST_NAME);
    if (n < 0 || (size_t)n >= sizeof path)
        return kiln_errorf(self->svc, self->hctx, KILN_E_INVALID_ARG, "checkpoint: %s/%s is too long", self->dirpath,
                           CK_LAST_NAME);
    ck_set(&self->last_model_path, path);
    return ck_request(self, ts, path, " (save_last)");
}

/* One trigger: top-k when `topk`, then save_last. */
static int32_t ck_trigger(kiln_instance *self, const kiln_trainer_state *ts, int topk, const char *hook) {
    int32_t rc = KILN_OK;
    if (!self->dirpath) rc = ck_resolve_dir(self, ts);
    if (rc == KILN_OK && topk) rc = ck_save_topk(self, ts, hook);
    if (rc == KILN_OK && self->save_last) rc = ck_save_last_ckpt(self, ts);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Timing */

/* _should_skip_saving_checkpoint: outside fit, the sanity check, or a
 * global step already saved (0 included: no step, nothing to save). */
static int ck_skip(const kiln_instance *self, const kiln_event *ev, const kiln_trainer_state *ts) {
    if (!self->fitting || !ts) return 1;
    if (ev->stage == KILN_STAGE_SANITY || ts->sanity_checking) return 1;
    return ts->global_step == self->last_step_saved;
}

/* _should_save_on_train_epoch_end */
static int ck_on_train_epoch_end(const kiln_instance *self, const kiln_trainer_state *ts) {
    if (self->save_on_train_epoch_end != CK_UNSET) return self->save_on_train_epoch_end;
    int64_t every = 1;
    double vci = 1.0;
    kiln_value v;
    if (self->svc->config_get && self->svc->config_get(self->hctx, "trainer.check_val_every_n_epoch", &v) == KILN_OK &&
        v.type == KILN_TYPE_INT)
        every = v.v.i;
    if (every != 1) return 0; /* validation epochs are unknown: save after validation */
    if (ts && ts->num_val_batches == 0) return 1;
    if (self->svc->config_get && self->svc->config_get(self->hctx, "trainer.val_check_interval", &v) == KILN_OK) {
        if (v.type == KILN_TYPE_FLOAT) vci = v.v.f;
        else if (v.type == KILN_TYPE_INT) vci = (double)v.v.i;
    }
    return vci == 1.0;
}

static int ck_epoch_due(const kiln_instance *self, const kiln_trainer_state *ts) {
    return self->every_n_epochs >= 1 && (ts->current_epoch + 1) % self->every_n_epochs == 0;
}

static int32_t ck_on_event(kiln_instance *self, kiln_event *ev) {
    if (!self || !ev) return KILN_E_INVALID_ARG;
    const kiln_trainer_state *ts = ck_trainer(self, ev);
    if (!self->dirpath && (self->dirpath_cfg[0] == '/' || (ts && ts->run_dir && ts->run_dir[0]))) {
        int32_t rc = ck_resolve_dir(self, ts);
        if (rc != KILN_OK) return rc;
    }
    if (self->npending && ev->id != KILN_EV_ON_FIT_END) ck_process_pending(self, ts, 0);
    switch (ev->id) {
    case KILN_EV_ON_FIT_START:
        self->fitting = 1;
        self->val_has_run = 0;
        return ck_resolve_dir(self, ts);
    case KILN_EV_ON_FIT_END:
        ck_process_pending(self, ts, 1);
        self->fitting = 0;
        return KILN_OK;
    case KILN_EV_TEARDOWN:
        self->fitting = 0;
        return KILN_OK;
    case KILN_EV_ON_TRAIN_BATCH_END:
        if (self->every_n_train_steps < 1 || ck_skip(self, ev, ts)) return KILN_OK;
        if (ts->global_step % self->every_n_train_steps != 0) return KILN_OK;
        return ck_trigger(self, ts, 1, "on_train_batch_end");
    case KILN_EV_ON_TRAIN_EPOCH_END:
        if (ck_skip(self, ev, ts) || !ck_on_train_epoch_end(self, ts)) return KILN_OK;
        return ck_trigger(self, ts, ck_epoch_due(self, ts), "on_train_epoch_end");
    case KILN_EV_ON_VALIDATION_END:
        if (self->fitting && ev->stage != KILN_STAGE_SANITY && ts && !ts->sanity_checking) self->val_has_run = 1;
        if (ck_skip(self, ev, ts) || ck_on_train_epoch_end(self, ts)) return KILN_OK;
        return ck_trigger(self, ts, ck_epoch_due(self, ts), "on_validation_end");
    default:
        return KILN_OK;
    }
}

/* ---------------------------------------------------------------------------
 * State (state_dict / load_state_dict). Version 1, little-endian; a string
 * is a uint32 length and its bytes (no NUL; empty means none):
 *   "KCK1"  u32 mode  u32 flags (1 best_score set, 2 current_score set)
 *   i64 last_step_saved  i64 last_epoch_saved
 *   f64 best_score  f64 kth_value  f64 current_score
 *   str monitor  str dirpath as configured  str dirpath resolved
 *   str best_model_path  str kth_best_model_path  str last_model_path
 *   str newest top-k path
 *   u32 n, n x (str path, f64 score)            best_k_models
 *   u32 m, m x (str victim, str replacement)    deletions still waiting */

typedef struct ck_buf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} ck_buf;

static void ck_put(ck_buf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void ck_put_u64(ck_buf *b, uint64_t x) {
    unsigned char t[8];
    for (int i = 0; i < 8; i++) t[i] = (unsigned char)(x >> (8 * i));
    ck_put(b, t, 8);
}
static void ck_put_u32(ck_buf *b, uint32_t x) {
    unsigned char t[4];
    for (int i = 0; i < 4; i++) t[i] = (unsigned char)(x >> (8 * i));
    ck_put(b, t, 4);
}
static void ck_put_f64(ck_buf *b, double d) {
    uint64_t x;
    memcpy(&x, &d, sizeof x);
    ck_put_u64(b, x);
}
static void ck_put_str(ck_buf *b, const char *s) {
    size_t n = s ? strlen(s) : 0;
    ck_put_u32(b, (uint32_t)n);
    if (n) ck_put(b, s, n);
}

typedef struct ck_rd {
    const unsigned char *p;
    size_t n, off;
    int bad;
} ck_rd;

static const unsigned char *ck_take(ck_rd *r, size_t n) {
    if (r->bad || n > r->n - r->off) { r->bad = 1; return NULL; }
    const unsigned char *q = r->p + r->off;
    r->off += n;
    return q;
}
static uint64_t ck_get_u64(ck_rd *r) {
    const unsigned char *q = ck_take(r, 8);
    uint64_t x = 0;
    for (int i = 0; q && i < 8; i++) x |= (uint64_t)q[i] << (8 * i);
    return x;
}
static uint32_t ck_get_u32(ck_rd *r) {
    const unsigned char *q = ck_take(r, 4);
    uint32_t x = 0;
    for (int i = 0; q && i < 4; i++) x |= (uint32_t)q[i] << (8 * i);
    return x;
}
static double ck_get_f64(ck_rd *r) {
    uint64_t x = ck_get_u64(r);
    double d;
    memcpy(&d, &x, sizeof d);
    return d;
}
/* malloc'd, NULL when empty (or on error: check r->bad) */
static char *ck_get_str(ck_rd *r) {
    uint32_t n = ck_get_u32(r);
    const unsigned char *q = ck_take(r, n);
    if (!q || n == 0) return NULL;
    if (memchr(q, '\0', n)) { r->bad = 1; return NULL; }
    char *s = strndup((const char *)q, n);
    if (!s) r->bad = 1;
    return s;
}

static int32_t ck_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    if (!self || !state_version || !data || !size) return KILN_E_INVALID_ARG;
    ck_buf b = {NULL, 0, 0, 0};
    ck_put(&b, CK_STATE_MAGIC, 4);
    ck_put_u32(&b, (uint32_t)self->mode);
    ck_put_u32(&b, (self->has_best_score ? 1u : 0u) | (self->has_current_score ? 2u : 0u));
    ck_put_u64(&b, (uint64_t)self->last_step_saved);
    ck_put_u64(&b, (uint64_t)self->last_epoch_saved);
    ck_put_f64(&b, self->best_score);
    ck_put_f64(&b, self->kth_value);
    ck_put_f64(&b, self->current_score);
    ck_put_str(&b, self->monitor);
    ck_put_str(&b, self->dirpath_cfg);
    ck_put_str(&b, self->dirpath);
    ck_put_str(&b, self->best_path);
    ck_put_str(&b, self->kth_path);
    ck_put_str(&b, self->last_model_path);
    ck_put_str(&b, self->last_topk_path);
    ck_put_u32(&b, (uint32_t)self->nbest);
    for (size_t i = 0; i < self->nbest; i++) {
        ck_put_str(&b, self->best_k[i].path);
        ck_put_f64(&b, self->best_k[i].score);
    }
    ck_put_u32(&b, (uint32_t)self->npending);
    for (size_t i = 0; i < self->npending; i++) {
        ck_put_str(&b, self->pending[i].victim);
        ck_put_str(&b, self->pending[i].replacement);
    }
    void *out = b.oom ? NULL : self->svc->alloc(self->hctx, b.n, 0);
    if (!out) {
        free(b.p);
        return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "checkpoint: out of memory for a %zu-byte state", b.n);
    }
    memcpy(out, b.p, b.n);
    free(b.p);
    *state_version = CK_STATE_VERSION;
    *data = out;
    *size = b.n;
    return KILN_OK;
}

static void ck_free_entries(ck_entry *e, size_t n) {
    for (size_t i = 0; i < n; i++) free(e[i].path);
    free(e);
}
static void ck_free_pending(ck_pending *p, size_t n) {
    for (size_t i = 0; i < n; i++) free(p[i].victim), free(p[i].replacement);
    free(p);
}

static int32_t ck_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    if (!self || (!data && size)) return KILN_E_INVALID_ARG;
    if (state_version != CK_STATE_VERSION)
        return kiln_errorf(self->svc, self->hctx, KILN_E_STATE,
                           "checkpoint: cannot read state version %u (this build reads version %u)", state_version,
                           CK_STATE_VERSION);
    ck_rd r = {data, size, 0, 0};
    const unsigned char *magic = ck_take(&r, 4);
    if (!magic || memcmp(magic, CK_STATE_MAGIC, 4) != 0)
        return kiln_errorf(self->svc, self->hctx, KILN_E_DATA,
                           "checkpoint: state of %zu bytes is not a checkpoint callback state (expected it to start "
                           "with \"%s\")",
                           size, CK_STATE_MAGIC);
    uint32_t mode = ck_get_u32(&r), flags = ck_get_u32(&r);
    int64_t last_step = (int64_t)ck_get_u64(&r), last_epoch = (int64_t)ck_get_u64(&r);
    double best_score = ck_get_f64(&r), kth_value = ck_get_f64(&r), current = ck_get_f64(&r);
    char *monitor = ck_get_str(&r), *dir_cfg = ck_get_str(&r), *dir = ck_get_str(&r);
    char *best_path = ck_get_str(&r), *kth_path = ck_get_str(&r), *last_path = ck_get_str(&r);
    char *topk_path = ck_get_str(&r);
    uint32_t nbest = ck_get_u32(&r);
    ck_entry *best_k = NULL;
    ck_pending *pend = NULL;
    uint32_t nb = 0, np = 0, npend = 0;
    /* each entry takes at least 12 bytes, each deletion 8: bound the counts
     * by what is left before allocating */
    if (!r.bad && nbest > (r.n - r.off) / 12) r.bad = 1;
    if (!r.bad && nbest) best_k = calloc(nbest, sizeof *best_k);
    for (; !r.bad && best_k && nb < nbest; nb++) {
        best_k[nb].path = ck_get_str(&r);
        best_k[nb].score = ck_get_f64(&r);
        if (!best_k[nb].path) r.bad = 1;
    }
    if (!r.bad) npend = ck_get_u32(&r);
    if (!r.bad && npend > (r.n - r.off) / 8) r.bad = 1;
    if (!r.bad && npend) pend = calloc(npend, sizeof *pend);
    for (; !r.bad && pend && np < npend; np++) {
        pend[np].victim = ck_get_str(&r);
        pend[np].replacement = ck_get_str(&r);
        if (!pend[np].victim || !pend[np].replacement) r.bad = 1;
    }
    int32_t rc = KILN_OK;
    const char *mine = self->monitor ? self->monitor : "";
    /* Every path in the blob names a file this callback may later delete
     * or overwrite: a crafted one ("<dirpath>/../../x") must not survive
     * the restore, whatever ck_should_remove would later decide. */
    const char *bad_path = NULL, *bad_what = NULL;
    if (!r.bad) {
        const char *one[] = {dir, best_path, kth_path, last_path, topk_path};
        const char *names[] = {"dirpath", "best_model_path", "kth_best_model_path", "last_model_path",
                               "newest top-k path"};
        for (int i = 0; i < 5 && !bad_path; i++)
            if (one[i] && !ck_abs_ok(one[i])) bad_path = one[i], bad_what = names[i];
        for (uint32_t i = 0; i < nb && !bad_path; i++)
            if (!ck_abs_ok(best_k[i].path)) bad_path = best_k[i].path, bad_what = "kept checkpoint";
        for (uint32_t i = 0; i < np && !bad_path; i++) {
            if (!ck_abs_ok(pend[i].victim)) bad_path = pend[i].victim, bad_what = "pending deletion";
            else if (!ck_abs_ok(pend[i].replacement)) bad_path = pend[i].replacement, bad_what = "pending replacement";
        }
    }
    if (bad_path) {
        char q[600];
        rc = kiln_errorf(self->svc, self->hctx, KILN_E_DATA,
                         "checkpoint: corrupt state: the %s \"%s\" is not an absolute path without \".\", "
                         "\"..\" or empty components; refusing to restore it",
                         bad_what, ck_q(bad_path, q, sizeof q));
        goto out;
    }
    if (r.bad || r.off != r.n || mode > CK_MODE_MAX || (nbest && !best_k) || (npend && !pend)) {
        rc = kiln_errorf(self->svc, self->hctx, KILN_E_DATA,
                         "checkpoint: corrupt state (%zu bytes, read %zu, mode %u, %u kept checkpoints, %u pending "
                         "deletions)",
                         size, r.off, mode, nbest, npend);
        goto out;
    }
    /* Lightning keys the state by monitor and mode: another checkpoint
     * callback's bookkeeping is not this one's, so it starts fresh. */
    if ((int)mode != self->mode || strcmp(monitor ? monitor : "", mine) != 0) {
        char q[300];
        kiln_logf(self->svc, self->hctx, KILN_LOG_WARN,
                  "checkpoint: the checkpoint's state is for monitor `%s` mode %s, this callback monitors `%s` mode "
                  "%s; starting fresh",
                  ck_q(monitor, q, sizeof q), ck_mode_name((int)mode), mine, ck_mode_name(self->mode));
        goto out;
    }
    self->last_step_saved = last_step;
    self->last_epoch_saved = last_epoch;
    ck_set(&self->best_path, best_path);
    if (strcmp(dir_cfg ? dir_cfg : "", self->dirpath_cfg) != 0) {
        char q1[600], q2[600];
        kiln_logf(self->svc, self->hctx, KILN_LOG_WARN,
                  "checkpoint: dirpath changed from \"%s\" to \"%s\": only best_model_path (%s) is restored, the top-k "
                  "bookkeeping starts fresh",
                  ck_q(dir_cfg, q1, sizeof q1), self->dirpath_cfg, best_path ? ck_q(best_path, q2, sizeof q2) : "none");
        goto out;
    }
    self->has_best_score = (flags & 1u) != 0;
    self->best_score = best_score;
    self->has_current_score = (flags & 2u) != 0;
    self->current_score = current;
    self->kth_value = kth_value;
    ck_set(&self->kth_path, kth_path);
    ck_set(&self->last_model_path, last_path);
    ck_set(&self->last_topk_path, topk_path);
    /* the newest top-k file is where a resumed run most likely came from */
    ck_set(&self->protected_path, topk_path);
    ck_free_entries(self->best_k, self->nbest);
    self->best_k = best_k;
    self->nbest = self->capbest = nbest;
    best_k = NULL;
    nb = 0;
    ck_free_pending(self->pending, self->npending);
    self->pending = pend;
    self->npending = self->cappending = npend;
    pend = NULL;
    np = 0;
    kiln_logf(self->svc, self->hctx, KILN_LOG_DEBUG,
              "checkpoint: restored %u kept checkpoints (best %s) written under %s", nbest,
              best_path ? best_path : "none", dir ? dir : "?");
out:
    ck_free_entries(best_k, nb);
    ck_free_pending(pend, np);
    free(monitor), free(dir_cfg), free(dir), free(best_path), free(kth_path), free(last_path), free(topk_path);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Lifecycle */

static void ck_destroy(kiln_instance *self) {
    if (!self) return;
    for (size_t i = 0; i < self->nparts; i++) free(self->parts[i].text);
    free(self->parts);
    ck_free_entries(self->best_k, self->nbest);
    ck_free_pending(self->pending, self->npending);
    free(self->dirpath);
    free(self->kth_path);
    free(self->best_path);
    free(self->last_model_path);
    free(self->last_topk_path);
    free(self->protected_path);
    free(self);
}

/* An optional INT key (no default): *set = 0 when the run file omits it. */
static int64_t ck_opt_int(const kiln_kv *config, const char *key, int *set) {
    const kiln_value *v = kiln_kv_find(config, key);
    *set = v && v->type == KILN_TYPE_INT;
    return *set ? v->v.i : 0;
}

static int32_t ck_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                         kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    if (svc->abi_minor < 2 || svc->struct_size < offsetof(kiln_host_services, save_checkpoint) + sizeof(void *) ||
        !svc->save_checkpoint)
        return kiln_errorf(svc, hctx, KILN_E_HOST_TOO_OLD,
                           "checkpoint: needs the host service save_checkpoint (ABI 1.2); this host offers ABI 1.%u%s",
                           (unsigned)svc->abi_minor, svc->abi_minor >= 2 ? " without it" : "");
    const char *dirpath = kiln_kv_str(config, "dirpath", "checkpoints");
    if (!dirpath[0])
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "checkpoint: dirpath must name a folder (absolute, or relative to the run directory), got "
                           "an empty string");
    const char *monitor = kiln_kv_str(config, "monitor", "");
    const char *mode = kiln_kv_str(config, "mode", "min");
    if (strcmp(mode, "min") != 0 && strcmp(mode, "max") != 0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "checkpoint: mode can be \"min\" or \"max\", got \"%s\"", mode);
    int64_t top_k = kiln_kv_int(config, "save_top_k", 1);
    if (top_k < -1)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "checkpoint: save_top_k must be >= -1 (-1: all), got %lld",
                           (long long)top_k);
    if (!monitor[0] && top_k != -1 && top_k != 0 && top_k != 1)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "checkpoint: save_top_k = %lld needs a monitor to rank checkpoints by; without monitor it "
                           "can be -1 (all), 0 (none) or 1 (the newest)",
                           (long long)top_k);
    int has_steps, has_epochs;
    int64_t steps = ck_opt_int(config, "every_n_train_steps", &has_steps);
    int64_t epochs = ck_opt_int(config, "every_n_epochs", &has_epochs);
    int32_t rc;
    if ((rc = cbc_at_least(svc, hctx, "checkpoint: ", "every_n_train_steps", steps, 0, " (0: off)")) != KILN_OK ||
        (rc = cbc_at_least(svc, hctx, "checkpoint: ", "every_n_epochs", epochs, 0, " (0: off)")) != KILN_OK)
        return rc;
    /* Lightning: neither trigger set means every epoch; setting one leaves
     * the other off */
    if (!has_steps && !has_epochs) epochs = 1;
    if (steps >= 1 && epochs >= 1)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "checkpoint: every_n_train_steps = %lld and every_n_epochs = %lld are mutually exclusive; "
                           "set one of them",
                           (long long)steps, (long long)epochs);
    if (kiln_kv_int(config, "save_weights_only", 0))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "checkpoint: save_weights_only = true is not supported: kiln has one checkpoint format "
                           "(weights, every plugin's state, loop progress), which `kiln test --ckpt` reads for the "
                           "weights alone; set it to false");

    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "checkpoint: out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->dirpath_cfg = dirpath;
    self->monitor = monitor[0] ? monitor : NULL;
    self->mode = strcmp(mode, "max") == 0 ? CK_MODE_MAX : CK_MODE_MIN;
    self->save_top_k = top_k;
    self->save_last = kiln_kv_int(config, "save_last", 0) != 0;
    self->verbose = kiln_kv_int(config, "verbose", 0) != 0;
    self->version_counter = kiln_kv_int(config, "enable_version_counter", 1) != 0;
    self->every_n_train_steps = steps;
    self->every_n_epochs = epochs;
    const kiln_value *st = kiln_kv_find(config, "save_on_train_epoch_end");
    self->save_on_train_epoch_end = st && st->type == KILN_TYPE_BOOL ? st->v.i != 0 : CK_UNSET;
    self->last_step_saved = 0; /* Lightning: no step taken, nothing to save */
    self->last_epoch_saved = -1;
    self->kth_value = self->mode == CK_MODE_MIN ? INFINITY : -INFINITY;
    self->best_score = NAN;
    self->current_score = NAN;
    rc = ck_parse_template(self, kiln_kv_str(config, "filename", "epoch={epoch}-step={step}"));
    if (rc != KILN_OK) {
        ck_destroy(self);
        return rc;
    }
    *out = self;
    return KILN_OK;
}

static const kiln_callback_ops ck_ops = {
    .base = {.struct_size = sizeof(kiln_callback_ops),
             .create = ck_create,
             .destroy = ck_destroy,
             .get_state = ck_get_state,
             .set_state = ck_set_state},
    .on_event = ck_on_event,
};

static const kiln_param ck_params[] = {
    {"dirpath", KILN_TYPE_STRING, 0, KILN_V_STR("checkpoints"),
     "folder for the checkpoints: absolute, or relative to the run directory"},
    {"filename", KILN_TYPE_STRING, 0, KILN_V_STR("epoch={epoch}-step={step}"),
     "name template: {epoch}, {step}, {<metric>} or {<metric>:.4f}; .safetensors is appended"},
    {"monitor", KILN_TYPE_STRING, 0, KILN_V_STR(""), "metric that ranks checkpoints (\"\": the newest are kept)"},
    {"mode", KILN_TYPE_STRING, 0, KILN_V_STR("min"), "\"min\": lower monitor is better; \"max\": higher is better"},
    {"save_top_k", KILN_TYPE_INT, 0, KILN_V_INT(1), "checkpoints kept: k best (-1 all, 0 none; 1 without monitor)"},
    {"save_last", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "also write <dirpath>/last.safetensors at every trigger"},
    {"every_n_train_steps", KILN_TYPE_INT, 0, KILN_V_NONE,
     "save when global_step % n == 0 at on_train_batch_end (unset: 0, off)"},
    {"every_n_epochs", KILN_TYPE_INT, 0, KILN_V_NONE,
     "save every n epochs (unset: 1 unless every_n_train_steps is set; 0 off)"},
    {"save_on_train_epoch_end", KILN_TYPE_BOOL, 0, KILN_V_NONE,
     "epoch saves at on_train_epoch_end, else on_validation_end (unset: Lightning's rule)"},
    {"save_weights_only", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "not supported (must stay false): one checkpoint format"},
    {"enable_version_counter", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1),
     "add -v1, -v2 ... when the formatted name already exists"},
    {"verbose", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "also log checkpoints not in the top k and removed files"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const ck_checks[] = {"mode in {min, max}", "save_top_k >= -1"};
static const kiln_kv ck_props[] = {
    {"config_checks", KILN_V_STRS(ck_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc ck_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_CALLBACK,
    .name = "checkpoint",
    .version = "1.0.0",
    .description = "Lightning's ModelCheckpoint: top-k checkpoints by a metric or recency, save_last, step/epoch "
                   "triggers",
    .capabilities = KILN_CAP_STATEFUL | KILN_CAP_MONITOR, /* after the module at on_train_epoch_end */
    .properties = ck_props,
    .params = ck_params,
    .ops = &ck_ops,
};

/* ABI 1.2: save_checkpoint */
KILN_DEFINE_LIBRARY("checkpoint", "1.0.0", 2, &ck_desc)
