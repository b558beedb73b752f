/*
 * csv_logger.c — Lightning's CSVLogger as a kiln callback plugin: every
 * KILN_EV_LOG_METRICS event becomes one row of <run_dir>/metrics.csv, whose
 * columns are "step" followed by every metric name seen so far, in the order
 * they first appeared. Validation metrics usually appear after the first
 * training rows, so a new column must reach rows already written: the logger
 * keeps every row in memory and, whenever the column set grows, rewrites the
 * whole file into <file>.tmp, fsyncs it and renames it over the old one, so a
 * reader (or a crash) only ever sees a complete CSV. Otherwise the row is
 * appended. The file is plain CSV, header first (pandas.read_csv and
 * spreadsheets read it as is). With `hparams` (the default) the run's
 * description goes where Lightning's CSVLogger puts its hyperparameters:
 * hparams.yaml beside the CSV, with every property the precision plugin
 * reports about itself (precision, amp_backend, amp_level, dtypes, anything
 * a third-party precision adds; ABI 1.2 trainer state). Only rank 0
 * writes.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kiln/fs_util.h>
#include <kiln/kiln.h>

#include "../common/plugin_common.h"

/* One logged row. Cells are indexed by column (0 is the first metric column,
 * the step is kept apart); a row only has cells for the columns that existed
 * when it was logged, later columns are empty for it. */
typedef struct csv_row {
    int64_t step;
    uint32_t ncells;
    double *vals;          /* (ncells) values                          */
    unsigned char *has;    /* (ncells) 1 where the row has a value     */
} csv_row;

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    const char *filename;  /* from config, valid until destroy          */
    int64_t flush_every;   /* fflush after this many appended rows      */
    char *path;            /* resolved file path, set at first open     */
    char *tmp_path;        /* path + ".tmp"                             */
    FILE *fp;              /* open for appending, NULL when closed      */
    int written;           /* the file holds the current header         */
    int hparams;           /* write hparams.yaml beside the CSV          */
    int64_t unflushed;     /* rows appended since the last fflush       */
    char **cols;           /* (ncols) metric column names, owned        */
    uint32_t ncols, cap_cols;
    csv_row *rows;         /* (nrows) every row logged                  */
    size_t nrows, cap_rows;
};

/* ---------------------------------------------------------------------------
 * Paths */

static int32_t csv_resolve_path(kiln_instance *self, const kiln_trainer_state *ts) {
    const char *dir = ts && ts->run_dir && ts->run_dir[0] ? ts->run_dir : NULL;
    size_t n = strlen(self->filename) + (dir ? strlen(dir) + 1 : 0) + 1;
    self->path = malloc(n);
    self->tmp_path = malloc(n + 4);
    if (!self->path || !self->tmp_path) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "csv_logger: out of memory");
    if (dir && self->filename[0] != '/')
        snprintf(self->path, n, "%s/%s", dir, self->filename);
    else
        snprintf(self->path, n, "%s", self->filename);
    snprintf(self->tmp_path, n + 4, "%s.tmp", self->path);
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Writing */

/* A header cell, quoted as RFC 4180 asks when the name needs it. */
static void csv_put_name(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void csv_put_header(const kiln_instance *self, FILE *f) {
    fputs("step", f);
    for (uint32_t c = 0; c < self->ncols; c++) {
        fputc(',', f);
        csv_put_name(f, self->cols[c]);
    }
    fputc('\n', f);
}

static void csv_put_row(const kiln_instance *self, FILE *f, const csv_row *r) {
    fprintf(f, "%lld", (long long)r->step);
    for (uint32_t c = 0; c < self->ncols; c++) {
        fputc(',', f);
        if (c < r->ncells && r->has[c]) fprintf(f, "%.9g", r->vals[c]);
    }
    fputc('\n', f);
}

static int32_t csv_io_error(kiln_instance *self, const char *what, const char *path, int err) {
    return cbc_io_error(self->svc, self->hctx, "csv_logger", what, path, err);
}

/* Write header and every row to <file>.tmp, make it durable, rename it over
 * <file>, and reopen <file> for appending. */
static int32_t csv_rewrite(kiln_instance *self) {
    self->written = 0; /* until it succeeds, the next row retries the rewrite */
    FILE *t = fopen(self->tmp_path, "w");
    if (!t) return csv_io_error(self, "create", self->tmp_path, errno);
    csv_put_header(self, t);
    for (size_t i = 0; i < self->nrows; i++) csv_put_row(self, t, &self->rows[i]);
    int err = 0;
    if (fflush(t) != 0 || ferror(t)) err = errno ? errno : EIO;
    if (!err && fsync(fileno(t)) != 0) err = errno;
    if (fclose(t) != 0 && !err) err = errno;
    if (err) {
        unlink(self->tmp_path);
        return csv_io_error(self, "write", self->tmp_path, err);
    }
    /* The old stream points at the file about to be replaced; everything it
     * buffered is in the new file already. */
    if (self->fp) {
        fclose(self->fp);
        self->fp = NULL;
    }
    if (rename(self->tmp_path, self->path) != 0) {
        err = errno;
        unlink(self->tmp_path);
        return csv_io_error(self, "rename onto", self->path, err);
    }
    /* Make the rename itself durable (best effort). */
    char *slash = strrchr(self->path, '/');
    int dfd = -1;
    if (slash == self->path) {
        dfd = open("/", O_RDONLY);
    } else if (slash) {
        *slash = '\0';
        dfd = open(self->path, O_RDONLY);
        *slash = '/';
    } else {
        dfd = open(".", O_RDONLY);
    }
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    self->fp = fopen(self->path, "a");
    if (!self->fp) return csv_io_error(self, "open", self->path, errno);
    self->written = 1;
    self->unflushed = 0;
    return KILN_OK;
}

static int32_t csv_append_last(kiln_instance *self) {
    if (!self->fp) {
        self->fp = fopen(self->path, "a");
        if (!self->fp) return csv_io_error(self, "open", self->path, errno);
    }
    csv_put_row(self, self->fp, &self->rows[self->nrows - 1]);
    if (++self->unflushed >= self->flush_every) {
        if (fflush(self->fp) != 0) return csv_io_error(self, "write", self->path, errno);
        self->unflushed = 0;
    }
    if (ferror(self->fp)) return csv_io_error(self, "write", self->path, errno ? errno : EIO);
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Rows in memory */

static int32_t csv_column(kiln_instance *self, const char *name, uint32_t *idx, int *grew) {
    for (uint32_t c = 0; c < self->ncols; c++)
        if (!strcmp(self->cols[c], name)) {
            *idx = c;
            return KILN_OK;
        }
    if (self->ncols == self->cap_cols) {
        uint32_t cap = self->cap_cols ? 2 * self->cap_cols : 8;
        char **cols = realloc(self->cols, cap * sizeof *cols);
        if (!cols) return KILN_E_NOMEM;
        self->cols = cols;
        self->cap_cols = cap;
    }
    char *copy = strdup(name);
    if (!copy) return KILN_E_NOMEM;
    self->cols[self->ncols] = copy;
    *idx = self->ncols++;
    *grew = 1;
    return KILN_OK;
}

/* Add the event's metrics as a new row (later duplicates of a name win);
 * *grew is set when a new column appeared. */
static int32_t csv_add_row(kiln_instance *self, const kiln_event *ev, int *grew) {
    if (self->nrows == self->cap_rows) {
        size_t cap = self->cap_rows ? 2 * self->cap_rows : 64;
        csv_row *rows = realloc(self->rows, cap * sizeof *rows);
        if (!rows) return KILN_E_NOMEM;
        self->rows = rows;
        self->cap_rows = cap;
    }
    for (const kiln_kv *kv = ev->metrics; kv && kv->key; kv++) {
        if (kv->value.type != KILN_TYPE_FLOAT && kv->value.type != KILN_TYPE_INT) continue;
        uint32_t idx;
        int32_t rc = csv_column(self, kv->key, &idx, grew);
        if (rc != KILN_OK) return rc;
    }
    csv_row *r = &self->rows[self->nrows];
    r->step = ev->step;
    r->ncells = self->ncols;
    r->vals = calloc(self->ncols ? self->ncols : 1, sizeof *r->vals);
    r->has = calloc(self->ncols ? self->ncols : 1, 1);
    if (!r->vals || !r->has) {
        free(r->vals);
        free(r->has);
        return KILN_E_NOMEM;
    }
    for (const kiln_kv *kv = ev->metrics; kv && kv->key; kv++) {
        if (kv->value.type != KILN_TYPE_FLOAT && kv->value.type != KILN_TYPE_INT) continue;
        uint32_t idx = 0;
        csv_column(self, kv->key, &idx, grew); /* present now: a lookup only */
        r->vals[idx] = kv->value.type == KILN_TYPE_FLOAT ? kv->value.v.f : (double)kv->value.v.i;
        r->has[idx] = 1;
    }
    self->nrows++;
    return KILN_OK;
}

/* A YAML scalar: strings double-quoted with \\ and \" escaped (control
 * bytes as \\xNN), numbers and booleans bare, lists in flow style. */
static void yaml_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void yaml_float(FILE *f, double x) {
    if (x != x) fputs(".nan", f);
    else if (x > 1.7976931348623157e308) fputs(".inf", f);
    else if (x < -1.7976931348623157e308) fputs("-.inf", f);
    else fprintf(f, "%.17g", x);
}

static void yaml_value(FILE *f, const kiln_value *v) {
    switch (v->type) {
    case KILN_TYPE_BOOL: fputs(v->v.i ? "true" : "false", f); break;
    case KILN_TYPE_INT: fprintf(f, "%lld", (long long)v->v.i); break;
    case KILN_TYPE_FLOAT: yaml_float(f, v->v.f); break;
    case KILN_TYPE_STRING: yaml_string(f, v->v.s); break;
    case KILN_TYPE_INT_LIST:
    case KILN_TYPE_FLOAT_LIST:
    case KILN_TYPE_STRING_LIST:
        fputc('[', f);
        for (uint32_t i = 0; i < v->count; i++) {
            if (i) fputs(", ", f);
            if (v->type == KILN_TYPE_INT_LIST) fprintf(f, "%lld", (long long)v->v.il[i]);
            else if (v->type == KILN_TYPE_FLOAT_LIST) yaml_float(f, v->v.fl[i]);
            else yaml_string(f, v->v.sl[i]);
        }
        fputc(']', f);
        break;
    default: fputs("null", f); break;
    }
}

/* hparams.yaml beside the CSV (Lightning's CSVLogger.log_hyperparams): the
 * run's precision as its plugin describes itself, every property it reports
 * (a host before 1.2 has none to give: no file). Written to a temporary
 * name and renamed, so a reader never sees half of it. */
static int32_t csv_write_hparams(kiln_instance *self, const kiln_trainer_state *ts) {
    if (!self->hparams || !ts || ts->struct_size < KILN_TRAINER_STATE_SIZE_1_2 || !ts->precision) return KILN_OK;
    const char *slash = strrchr(self->path, '/');
    size_t dl = slash ? (size_t)(slash - self->path) + 1 : 0;
    size_t n = dl + sizeof "hparams.yaml.tmp";
    char *path = malloc(n), *tmp = malloc(n);
    if (!path || !tmp) {
        free(path);
        free(tmp);
        return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "csv_logger: out of memory");
    }
    snprintf(path, n, "%.*shparams.yaml", (int)dl, self->path);
    snprintf(tmp, n, "%s.tmp", path);
    int32_t rc = KILN_OK;
    FILE *f = fopen(tmp, "w");
    if (!f) rc = csv_io_error(self, "create", tmp, errno);
    if (f) {
        fputs("# the run's description, written by kiln's csv_logger beside metrics.csv\n", f);
        fputs("precision:\n", f);
        for (const kiln_kv *kv = ts->precision; kv->key; kv++) {
            fputs("  ", f);
            yaml_string(f, kv->key);
            fputs(": ", f);
            yaml_value(f, &kv->value);
            fputc('\n', f);
        }
        int err = ferror(f) ? (errno ? errno : EIO) : 0;
        if (fclose(f) != 0 && !err) err = errno;
        if (!err && rename(tmp, path) != 0) err = errno;
        if (err) {
            unlink(tmp);
            rc = csv_io_error(self, "write", path, err);
        }
    }
    free(path);
    free(tmp);
    return rc;
}

static int32_t csv_log_metrics(kiln_instance *self, const kiln_event *ev, const kiln_trainer_state *ts) {
    if (!self->path) {
        int32_t rc = csv_resolve_path(self, ts);
        if (rc != KILN_OK) return rc;
        kiln_mkdir_parent(self->path);
        if ((rc = csv_write_hparams(self, ts)) != KILN_OK) return rc;
    }
    int grew = 0;
    int32_t rc = csv_add_row(self, ev, &grew);
    if (rc == KILN_E_NOMEM) return kiln_errorf(self->svc, self->hctx, rc, "csv_logger: out of memory");
    if (rc != KILN_OK) return rc;
    if (grew || !self->written) return csv_rewrite(self);
    return csv_append_last(self);
}

static int32_t csv_close(kiln_instance *self) {
    if (!self->fp) return KILN_OK;
    const int err = cbc_fclose(&self->fp);
    self->unflushed = 0;
    return err ? csv_io_error(self, "close", self->path, err) : KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Events and lifecycle */

static int32_t csv_on_event(kiln_instance *self, kiln_event *ev) {
    if (!self || !ev) return KILN_E_INVALID_ARG;
    const kiln_trainer_state *ts;
    if (!cbc_rank0(self->svc, self->hctx, ev, &ts)) return KILN_OK;
    switch (ev->id) {
    case KILN_EV_LOG_METRICS:
        return csv_log_metrics(self, ev, ts);
    case KILN_EV_TEARDOWN:
    case KILN_EV_ON_EXCEPTION: /* a failed run: what was logged reaches the disk */
        return csv_close(self);
    default:
        return KILN_OK;
    }
}

static void csv_destroy(kiln_instance *self) {
    if (!self) return;
    csv_close(self);
    for (uint32_t c = 0; c < self->ncols; c++) free(self->cols[c]);
    free(self->cols);
    for (size_t i = 0; i < self->nrows; i++) {
        free(self->rows[i].vals);
        free(self->rows[i].has);
    }
    free(self->rows);
    free(self->path);
    free(self->tmp_path);
    free(self);
}

static int32_t csv_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                          kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const char *filename = kiln_kv_str(config, "filename", "metrics.csv");
    int64_t flush_every = kiln_kv_int(config, "flush_every_n", 1);
    if (!filename[0] || filename[strlen(filename) - 1] == '/')
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "filename must name a file, got \"%s\"", filename);
    if (flush_every < 1)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "flush_every_n must be >= 1, got %lld", (long long)flush_every);
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "csv_logger: out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->filename = filename;
    self->flush_every = flush_every;
    /* run_comment: the key's name before hparams.yaml replaced the '#' line */
    const kiln_value *hp = kiln_kv_find(config, "hparams"), *rcv = kiln_kv_find(config, "run_comment");
    self->hparams = (!hp || hp->type != KILN_TYPE_BOOL || hp->v.i) && (!rcv || rcv->type != KILN_TYPE_BOOL || rcv->v.i);
    *out = self;
    return KILN_OK;
}

static const kiln_callback_ops csv_ops = {
    .base = {.struct_size = sizeof(kiln_callback_ops), .create = csv_create, .destroy = csv_destroy},
    .on_event = csv_on_event,
};

static const kiln_param csv_params[] = {
    {"filename", KILN_TYPE_STRING, 0, KILN_V_STR("metrics.csv"), "metrics file, relative to the run directory unless absolute"},
    {"flush_every_n", KILN_TYPE_INT, 0, KILN_V_INT(1), "flush appended rows to the file every n rows"},
    {"hparams", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1),
     "write hparams.yaml beside the CSV: every property of the run's precision plugin"},
    {"run_comment", KILN_TYPE_BOOL, 0, KILN_V_BOOL(1), "the old name of hparams (false: no hparams.yaml)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const csv_checks[] = {"flush_every_n >= 1"};
static const kiln_kv csv_props[] = {
    {"config_checks", KILN_V_STRS(csv_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc csv_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_CALLBACK,
    .name = "csv_logger",
    .version = "1.0.0",
    .description = "Lightning's CSVLogger: logged metrics as rows of <run_dir>/metrics.csv (rank 0)",
    .properties = csv_props,
    .params = csv_params,
    .ops = &csv_ops,
};

KILN_DEFINE_LIBRARY("csv_logger", "1.0.0", 1, &csv_desc)
