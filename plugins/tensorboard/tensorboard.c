/*
 * tensorboard.c — Lightning's TensorBoardLogger (scalars) as a kiln callback
 * plugin: every KILN_EV_LOG_METRICS event becomes one tensorflow.Event record
 * in <run_dir>/<subdir>/events.out.tfevents.<unix time>.<hostname><suffix>,
 * holding all of the event's scalars at its logger step, so TensorBoard (or
 * anything reading TFRecord event files) plots them. The file opens with the
 * Event{file_version "brain.Event:2"} record TensorBoard expects. Records are
 * only ever appended, each whole (tb_record.c builds a record in memory and
 * it goes out in one fwrite), and flushed every `flush_every_n` records, so a
 * crash leaves a readable prefix (TensorBoard tolerates a truncated last
 * record). The file is created at the first logged metrics, with O_EXCL: a
 * second logger in the same run directory within the same second gets
 * ".<n>" after the hostname instead of interleaving with the first. Stage
 * ends and exceptions flush; teardown closes the file, and metrics logged
 * after it (a later trainer.test()) append to the same file. Only rank 0
 * writes. The byte formats live in tb_record.c.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kiln/fs_util.h>
#include <kiln/kiln.h>

#include "../common/plugin_common.h"

#include "tb_record.h" /* defines: tb_append_version_record, tb_append_scalars_record, tb_buf */

/* How many ".<n>" names to try when the plain name already exists. */
#define TB_MAX_NAME_TRIES 1000

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    const char *subdir;    /* from config, valid until destroy            */
    const char *suffix;    /* filename_suffix, from config                */
    int64_t flush_every;   /* fflush after this many appended records     */
    char *path;            /* the event file, set when it is created      */
    FILE *fp;              /* open for appending, NULL when closed        */
    int failed;            /* a write failed: the file may end mid-record */
    int64_t unflushed;     /* records written since the last fflush       */
    double last_wall;      /* wall_time of the last record (monotone)     */
    tb_buf rec;            /* scratch: the record being written           */
    tb_scalar *scalars;    /* (cap_scalars) scratch: one event's scalars  */
    size_t cap_scalars;
};

/* ---------------------------------------------------------------------------
 * Paths */

/* The directory the file goes in: subdir under run_dir, subdir itself when
 * absolute, run_dir when subdir is empty; relative to the working directory
 * when the trainer has no run_dir. Caller frees. */
static char *tb_dir_path(const kiln_instance *self, const kiln_trainer_state *ts) {
    const char *run = ts && ts->run_dir && ts->run_dir[0] ? ts->run_dir : ".";
    const char *sub = self->subdir;
    size_t n = strlen(run) + strlen(sub) + 2;
    char *dir = malloc(n);
    if (!dir) return NULL;
    if (sub[0] == '/')
        snprintf(dir, n, "%s", sub);
    else if (!sub[0])
        snprintf(dir, n, "%s", run);
    else
        snprintf(dir, n, "%s/%s", run, sub);
    return dir;
}

/* The host name as TensorBoard's writer puts it in the file name; a name
 * that cannot be had (or holds a '/') must not break the path. */
static void tb_hostname(char *out, size_t n) {
    if (gethostname(out, n) != 0 || !out[0]) snprintf(out, n, "localhost");
    out[n - 1] = '\0';
    for (char *p = out; *p; p++)
        if (*p == '/') *p = '_';
}

/* Seconds since the epoch as a double, TensorBoard's wall_time. The
 * realtime clock may step back (NTP); wall_time must not, so a reading
 * earlier than the last record's repeats that record's time. */
static double tb_wall_time(kiln_instance *self) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    double now = (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
    if (now < self->last_wall) now = self->last_wall;
    self->last_wall = now;
    return now;
}

static int32_t tb_io_error(kiln_instance *self, const char *what, const char *path, int err) {
    return cbc_io_error(self->svc, self->hctx, "tensorboard", what, path, err);
}

/* ---------------------------------------------------------------------------
 * Writing */

/* Write the record in self->rec; flush when `force` or every flush_every.
 * A short write leaves the file ending mid-record: nothing more may be
 * appended after it, so the logger stops writing (and says so). */
static int32_t tb_write_record(kiln_instance *self, int force) {
    if (self->rec.oom) {
        self->rec.oom = 0;
        self->rec.len = 0;
        return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "tensorboard: out of memory building a record");
    }
    size_t n = self->rec.len;
    self->rec.len = 0;
    int err = 0;
    errno = 0;
    if (fwrite(self->rec.data, 1, n, self->fp) != n) err = errno ? errno : EIO;
    if (!err && (force || ++self->unflushed >= self->flush_every)) {
        if (fflush(self->fp) != 0) err = errno ? errno : EIO;
        self->unflushed = 0;
    }
    if (!err && ferror(self->fp)) err = EIO;
    if (err) {
        self->failed = 1;
        fclose(self->fp);
        self->fp = NULL;
        return tb_io_error(self, "write", self->path, err);
    }
    return KILN_OK;
}

/* Create a fresh event file: events.out.tfevents.<%010 unix time>.<host>
 * [.<n>]<suffix>, exclusively, and write the file_version record. */
static int32_t tb_create_file(kiln_instance *self, const kiln_trainer_state *ts) {
    char *dir = tb_dir_path(self, ts);
    if (!dir) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "tensorboard: out of memory");
    kiln_mkdirs(dir);
    char host[256];
    tb_hostname(host, sizeof host);
    double wall = tb_wall_time(self);
    long long secs = (long long)wall; /* whole seconds, as TensorBoard names files */
    size_t n = strlen(dir) + strlen(host) + strlen(self->suffix) + 64;
    char *path = malloc(n);
    if (!path) {
        free(dir);
        return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "tensorboard: out of memory");
    }
    int fd = -1, err = 0;
    for (int k = 0; k < TB_MAX_NAME_TRIES; k++) {
        if (k == 0)
            snprintf(path, n, "%s/events.out.tfevents.%010lld.%s%s", dir, secs, host, self->suffix);
        else
            snprintf(path, n, "%s/events.out.tfevents.%010lld.%s.%d%s", dir, secs, host, k, self->suffix);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) break;
    }
    err = errno;
    free(dir);
    /* self->path is only set once the file exists, so a failed attempt is
     * retried from scratch (never reopened without its version record). */
    if (fd >= 0 && !(self->fp = fdopen(fd, "ab"))) {
        err = errno;
        close(fd);
        unlink(path);
        fd = -1;
    }
    if (fd < 0) {
        int32_t rc = tb_io_error(self, "create", path, err);
        free(path);
        return rc;
    }
    self->path = path;
    /* TensorBoard reads a file's version from its first event. */
    tb_append_version_record(&self->rec, wall, "brain.Event:2");
    return tb_write_record(self, 1);
}

/* double -> float32 the way numpy (and so TensorBoard's writer) does it:
 * beyond float's range a finite value becomes +-inf (C leaves that
 * conversion undefined, so it is spelled out). */
static float tb_to_float(double v) {
    if (v > FLT_MAX) return INFINITY;
    if (v < -FLT_MAX) return -INFINITY;
    return (float)v; /* NaN stays NaN */
}

/* Collect the event's numeric metrics into self->scalars; *n is how many.
 * Values are doubles in kiln, float32 in Summary.Value.simple_value (what
 * TensorBoard's add_scalar stores too). */
static int32_t tb_collect(kiln_instance *self, const kiln_kv *metrics, size_t *n) {
    size_t count = 0;
    for (const kiln_kv *kv = metrics; kv && kv->key; kv++) count++;
    if (count > self->cap_scalars) {
        tb_scalar *s = realloc(self->scalars, count * sizeof *s);
        if (!s) return kiln_errorf(self->svc, self->hctx, KILN_E_NOMEM, "tensorboard: out of memory");
        self->scalars = s;
        self->cap_scalars = count;
    }
    *n = 0;
    for (const kiln_kv *kv = metrics; kv && kv->key; kv++) {
        double v;
        if (kv->value.type == KILN_TYPE_FLOAT)
            v = kv->value.v.f;
        else if (kv->value.type == KILN_TYPE_INT)
            v = (double)kv->value.v.i;
        else
            continue; /* not a scalar TensorBoard can plot */
        self->scalars[*n].tag = kv->key;
        self->scalars[*n].value = tb_to_float(v);
        (*n)++;
    }
    return KILN_OK;
}

static int32_t tb_log_metrics(kiln_instance *self, const kiln_event *ev, const kiln_trainer_state *ts) {
    if (self->failed)
        return kiln_errorf(self->svc, self->hctx, KILN_E_IO,
                           "tensorboard: %s may end in a partly written record after an earlier write error; "
                           "not appending to it",
                           self->path ? self->path : "the event file");
    int32_t rc;
    if (!self->path) {
        if ((rc = tb_create_file(self, ts)) != KILN_OK) return rc;
    } else if (!self->fp) {
        /* Closed at teardown; a later stage's metrics go to the same file.
         * If it was removed meanwhile, start a new one (with its version
         * record) rather than recreate it headless. */
        int fd = open(self->path, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
            free(self->path);
            self->path = NULL;
            if ((rc = tb_create_file(self, ts)) != KILN_OK) return rc;
        } else if (fd < 0 || !(self->fp = fdopen(fd, "ab"))) {
            int err = errno;
            if (fd >= 0) close(fd);
            return tb_io_error(self, "reopen", self->path, err);
        }
    }
    size_t n = 0;
    if ((rc = tb_collect(self, ev->metrics, &n)) != KILN_OK) return rc;
    if (n == 0) return KILN_OK; /* TensorBoardLogger writes nothing for no scalars */
    tb_append_scalars_record(&self->rec, tb_wall_time(self), ev->step, self->scalars, n);
    return tb_write_record(self, 0);
}

static int32_t tb_flush(kiln_instance *self) {
    if (!self->fp || self->unflushed == 0) return KILN_OK;
    self->unflushed = 0;
    if (fflush(self->fp) != 0) {
        int err = errno;
        self->failed = 1;
        fclose(self->fp);
        self->fp = NULL;
        return tb_io_error(self, "write", self->path, err);
    }
    return KILN_OK;
}

static int32_t tb_close(kiln_instance *self) {
    if (!self->fp) return KILN_OK;
    const int err = cbc_fclose(&self->fp);
    self->unflushed = 0;
    if (!err) return KILN_OK;
    self->failed = 1;
    return tb_io_error(self, "close", self->path, err);
}

/* ---------------------------------------------------------------------------
 * Events and lifecycle */

static int32_t tb_on_event(kiln_instance *self, kiln_event *ev) {
    if (!self || !ev) return KILN_E_INVALID_ARG;
    const kiln_trainer_state *ts;
    if (!cbc_rank0(self->svc, self->hctx, ev, &ts)) return KILN_OK;
    switch (ev->id) {
    case KILN_EV_LOG_METRICS:
        return tb_log_metrics(self, ev, ts);
    /* With flush_every_n > 1, records buffered at the end of a stage (or
     * before a crash is reported) reach the file now rather than at exit. */
    case KILN_EV_ON_TRAIN_EPOCH_END:
    case KILN_EV_ON_VALIDATION_END:
    case KILN_EV_ON_TEST_END:
    case KILN_EV_ON_FIT_END:
    case KILN_EV_ON_EXCEPTION:
        return tb_flush(self);
    case KILN_EV_TEARDOWN:
        return tb_close(self);
    default:
        return KILN_OK;
    }
}

static void tb_destroy(kiln_instance *self) {
    if (!self) return;
    tb_close(self);
    tb_buf_free(&self->rec);
    free(self->scalars);
    free(self->path);
    free(self);
}

static int32_t tb_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx, const kiln_kv *config,
                         kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    const char *subdir = kiln_kv_str(config, "subdir", "tensorboard");
    const char *suffix = kiln_kv_str(config, "filename_suffix", "");
    int64_t flush_every = kiln_kv_int(config, "flush_every_n", 1);
    if (flush_every < 1)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "flush_every_n must be >= 1, got %lld", (long long)flush_every);
    if (strchr(suffix, '/'))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG,
                           "filename_suffix is appended to the file name and must not contain '/', got \"%s\"",
                           suffix);
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "tensorboard: out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->subdir = subdir;
    self->suffix = suffix;
    self->flush_every = flush_every;
    *out = self;
    return KILN_OK;
}

static const kiln_callback_ops tb_ops = {
    .base = {.struct_size = sizeof(kiln_callback_ops), .create = tb_create, .destroy = tb_destroy},
    .on_event = tb_on_event,
};

static const kiln_param tb_params[] = {
    {"subdir", KILN_TYPE_STRING, 0, KILN_V_STR("tensorboard"),
     "folder of the event file, relative to the run directory unless absolute (\"\": the run directory)"},
    {"flush_every_n", KILN_TYPE_INT, 0, KILN_V_INT(1), "flush appended records to the file every n records"},
    {"filename_suffix", KILN_TYPE_STRING, 0, KILN_V_STR(""),
     "text appended to events.out.tfevents.<time>.<host> (no '/')"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const tb_checks[] = {"flush_every_n >= 1"};
static const kiln_kv tb_props[] = {
    {"config_checks", KILN_V_STRS(tb_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc tb_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_CALLBACK,
    .name = "tensorboard",
    .version = "1.0.0",
    .description = "Lightning's TensorBoardLogger: logged scalars as TensorBoard event files (rank 0)",
    .properties = tb_props,
    .params = tb_params,
    .ops = &tb_ops,
};

KILN_DEFINE_LIBRARY("tensorboard", "1.0.0", 1, &tb_desc)
