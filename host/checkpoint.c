/*
 * host/checkpoint.c — saving and loading the weights checkpoint described in
 * checkpoint.h. Parameters live on the accelerator, so they are copied to
 * host buffers (one allocation per save, freed after the atomic write) and
 * back through the kernel table's copy entry. The trainer's counters and
 * the plugin-state entries are JSON objects in the metadata, written and
 * read with jansson and checked before anything is restored.
 */
#define _GNU_SOURCE
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>

#include "log.h"
#include "safetensors.h"
#include "version.h"

/* The slots whose state a checkpoint carries, with their names in it. */
typedef struct ckpt_slot { ht_slot *s; char role[40]; } ckpt_slot;

static int state_slots(ht_trainer *t, ckpt_slot *out) {
    int n = 0;
    ht_slot *fixed[] = {&t->module, &t->opts[0], &t->precision, &t->strategy, &t->data};
    const char *names[] = {"module", "optimizer", "precision", "strategy", "data"};
    for (int i = 0; i < 5; i++)
        if (fixed[i]->p) { out[n].s = fixed[i]; snprintf(out[n].role, sizeof out[n].role, "%s", names[i]); n++; }
    if (t->scheduler.p) {
        out[n].s = &t->scheduler;
        snprintf(out[n].role, sizeof out[n].role, "scheduler");
        n++;
    }
    for (int i = 1; i < t->nopts; i++) { /* optimizers after the first */
        out[n].s = &t->opts[i];
        snprintf(out[n].role, sizeof out[n].role, "optimizers.%d", i);
        n++;
    }
    for (int i = 0; i < t->ncallbacks; i++) {
        out[n].s = &t->callbacks[i];
        snprintf(out[n].role, sizeof out[n].role, "callbacks.%d", i);
        n++;
    }
    return n;
}

/* ---------------------------------------------------------------------------
 * The trainer's counters in the metadata, as JSON objects (jansson), each
 * with its own "format" so a reader knows what it holds (docs/checkpoints.md):
 *
 *   progress  every loop counter (docs/semantics.md), for mid-epoch resume:
 *             {"format":"kiln-progress-2",
 *              "epoch_progress":{"total":{"ready":..,"started":..,
 *                "processed":..,"completed":..},"current":{..}},
 *              "batch_progress":{..},"opt_step":{..},"zero_grad":{..},
 *              "batches_that_stepped":..,"total_batch_idx":..,
 *              "skipped_steps":..,"samples_seen":..}
 *   loops     {"format":"kiln-loops-2","epochs":..,"global_step":..,
 *              "batches_that_stepped":..,"total_batch_idx":..,
 *              "scheduler_steps":..,"lr_factor":..}
 *   state.<role>  {"plugin":"adamw","version":1}
 *
 * Written at a consistent point (end of a batch or of an epoch), so a
 * resume needs no counter repairs. */
#define PROGRESS_FORMAT "kiln-progress-2"
#define LOOPS_FORMAT "kiln-loops-2"
#define PROGRESS_FIELDS 36
static const char *const PROG_NAME[4] = {"epoch_progress", "batch_progress", "opt_step", "zero_grad"};
static const char *const PROG_PART[2] = {"total", "current"};
static const char *const PROG_FIELD[4] = {"ready", "started", "processed", "completed"};
static const char *const PROG_TAIL[4] = {"batches_that_stepped", "total_batch_idx", "skipped_steps", "samples_seen"};
static const char *const LOOPS_NAME[5] = {"epochs", "global_step", "batches_that_stepped", "total_batch_idx",
                                          "scheduler_steps"};

/* A JSON value as compact text (caller frees), consuming the reference;
 * NULL when out of memory. */
static char *json_text(json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return s;
}

static json_t *counts_json(const ht_counts *c) {
    return json_pack("{sI sI sI sI}", PROG_FIELD[0], (json_int_t)c->ready, PROG_FIELD[1], (json_int_t)c->started,
                     PROG_FIELD[2], (json_int_t)c->processed, PROG_FIELD[3], (json_int_t)c->completed);
}

static char *progress_text(const ht_trainer *t) {
    const ht_progress *ps[4] = {&t->epoch_progress, &t->batch_progress, &t->opt_step, &t->zero_grad};
    json_t *o = json_pack("{ss}", "format", PROGRESS_FORMAT);
    for (int i = 0; o && i < 4; i++)
        if (json_object_set_new(o, PROG_NAME[i], json_pack("{so so}", PROG_PART[0], counts_json(&ps[i]->total),
                                                           PROG_PART[1], counts_json(&ps[i]->current))) != 0) {
            json_decref(o);
            o = NULL;
        }
    const int64_t tail[4] = {t->batches_that_stepped, t->total_batch_idx, t->skipped_steps, t->samples_seen};
    for (int i = 0; o && i < 4; i++)
        if (json_object_set_new(o, PROG_TAIL[i], json_integer((json_int_t)tail[i])) != 0) {
            json_decref(o);
            o = NULL;
        }
    return json_text(o);
}

static char *loops_text(const ht_trainer *t) {
    return json_text(json_pack("{ss sI sI sI sI sI so}", "format", LOOPS_FORMAT, LOOPS_NAME[0],
                               (json_int_t)t->epoch_progress.total.completed, LOOPS_NAME[1],
                               (json_int_t)t->opt_step.total.completed, LOOPS_NAME[2],
                               (json_int_t)t->batches_that_stepped, LOOPS_NAME[3], (json_int_t)t->total_batch_idx,
                               LOOPS_NAME[4], (json_int_t)t->sched_steps, "lr_factor", hm_json_real(t->lr_factor)));
}

/* Restored counters stay below 2^53: exact as doubles (loggers, the JSON
 * reader of the metadata) and so far from INT64_MAX that the loops'
 * increments and sums (samples_seen += batch size) cannot overflow. */
#define CKPT_COUNT_LIMIT ((long long)1 << 53)

/* A metadata text as it may appear in a one-line message: control
 * characters escaped (the text comes from the file, and a newline in it
 * must not forge a log line), at most `max` characters shown. */
static const char *meta_q(const char *s, size_t max, char *buf, size_t n) {
    size_t o = 0, k = 0;
    for (; s[k] && k < max && o + 5 < n; k++) {
        unsigned char c = (unsigned char)s[k];
        if (c < 0x20 || c == 0x7F) o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = 0;
    return buf;
}

/* What a JSON value is, for "found ..." in a message. */
static const char *json_kind(const json_t *v) {
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number with a fraction";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return v ? "null" : "nothing";
    }
}

/* A metadata entry parsed as a JSON object (duplicate keys refused); NULL
 * with jansson's words in `found` when it is not one. */
static json_t *meta_object(const char *text, char *found, size_t n) {
    json_error_t e;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &e);
    if (!o) {
        char q[200];
        snprintf(found, n, "invalid JSON (%s at byte %d)", meta_q(e.text, 120, q, sizeof q), e.position);
    } else if (!json_is_object(o)) {
        snprintf(found, n, "%s", json_kind(o));
        json_decref(o);
        o = NULL;
    }
    return o;
}

/* The name of field i of the progress object ("batch_progress.total.ready"). */
static void progress_name(int i, char *buf, size_t n) {
    if (i >= 32) snprintf(buf, n, "%s", PROG_TAIL[i - 32]);
    else snprintf(buf, n, "%s.%s.%s", PROG_NAME[i / 8], PROG_PART[(i / 4) % 2], PROG_FIELD[i % 4]);
}

/* The JSON value of field i of the progress object, NULL when absent. */
static json_t *progress_get(json_t *o, int i) {
    if (i >= 32) return json_object_get(o, PROG_TAIL[i - 32]);
    return json_object_get(json_object_get(json_object_get(o, PROG_NAME[i / 8]), PROG_PART[(i / 4) % 2]),
                           PROG_FIELD[i % 4]);
}

/* The metadata parsers (progress_le to loops_parse) report through an
 * ht_error as the rest of the host does, and need no run:
 * tests/fuzz/fuzz_ckpt_meta.c includes this file and calls them with an
 * ht_error of its own. */

/* Refuses v[a] unless v[a] <= v[b] + slack. */
static int progress_le(const long long *v, int a, int b, long long slack, const char *path, ht_error *err) {
    if (v[a] <= v[b] + slack) return 0;
    char na[64], nb[64];
    progress_name(a, na, sizeof na);
    progress_name(b, nb, sizeof nb);
    ht_errorf(err, "%s: progress counter %s: expected <= %s%s (%lld), found %lld", path, na, nb,
              slack ? " + 1" : "", v[b] + slack, v[a]);
    return -1;
}

/* Only the keys the format defines, at every level: a key this kiln does
 * not know is data it would silently drop. */
static int progress_keys(json_t *o, const char *path, ht_error *err) {
    static const char *const top[9] = {"format", "epoch_progress", "batch_progress", "opt_step", "zero_grad",
                                       "batches_that_stepped", "total_batch_idx", "skipped_steps", "samples_seen"};
    const char *k = hm_json_other_key(o, top, 9);
    char where[64] = "";
    for (int i = 0; !k && i < 4; i++) {
        json_t *p = json_object_get(o, PROG_NAME[i]);
        if (!json_is_object(p)) continue; /* a wrong type is the field checks' to report */
        if ((k = hm_json_other_key(p, PROG_PART, 2))) snprintf(where, sizeof where, " in %s", PROG_NAME[i]);
        for (int j = 0; !k && j < 2; j++) {
            json_t *c = json_object_get(p, PROG_PART[j]);
            if (json_is_object(c) && (k = hm_json_other_key(c, PROG_FIELD, 4)))
                snprintf(where, sizeof where, " in %s.%s", PROG_NAME[i], PROG_PART[j]);
        }
    }
    if (!k) return 0;
    char q[200];
    ht_errorf(err, "%s: __metadata__ progress: expected the %d counters of \"" PROGRESS_FORMAT "\", found an "
              "unknown key \"%s\"%s", path, PROGRESS_FIELDS, meta_q(k, 60, q, sizeof q), where);
    return -1;
}

/* Parses and checks the progress object into v[PROGRESS_FIELDS]. A crafted
 * or damaged file must not steer the loops: counters out of range overflow
 * later, and inconsistent ones can end the fit loop at once (a processed
 * epoch count beyond max_epochs) or restart an epoch at a batch that never
 * ran. Every relation checked here holds at every point where kiln saves. */
static int progress_parse(const char *text, const char *path, long long *v, ht_error *err) {
    char q[200], found[300];
    if (!text) {
        /* without "progress" a file holds the end-of-epoch loops at most,
         * too little to resume at the batch where it was written */
        return ht_errorc(err, KILN_E_DATA,
                         "%s: no __metadata__ progress: a checkpoint of an older kiln, which cannot resume (its "
                         "weights load with --weights-only)", path);
    }
    json_t *o = meta_object(text, found, sizeof found);
    if (!o && !strncmp(text, "kiln-progress-1", 15)) {
        return ht_errorc(err, KILN_E_DATA,
                         "%s: __metadata__ progress is \"kiln-progress-1\" text, an older kiln's format, which "
                         "cannot resume (expected a JSON object with \"format\": \"" PROGRESS_FORMAT "\"; the weights load "
                         "with --weights-only)", path);
    }
    const char *fmt = json_string_value(json_object_get(o, "format"));
    if (!o || !fmt || strcmp(fmt, PROGRESS_FORMAT) != 0) {
        if (o && fmt) snprintf(found, sizeof found, "\"%s\"", meta_q(fmt, 40, q, sizeof q));
        else if (o) snprintf(found, sizeof found, "%s", json_kind(json_object_get(o, "format")));
        ht_errorf(err, "%s: expected __metadata__ progress to be a JSON object with \"format\": \""
                  PROGRESS_FORMAT "\", found %s", path, found);
        json_decref(o);
        return KILN_E_DATA;
    }
    if (progress_keys(o, path, err)) {
        json_decref(o);
        return KILN_E_DATA;
    }
    for (int i = 0; i < PROGRESS_FIELDS; i++) {
        json_t *x = progress_get(o, i);
        if (!json_is_integer(x)) {
            char n[64];
            progress_name(i, n, sizeof n);
            ht_errorf(err, "%s: progress counter %s: expected an integer, found %s", path, n, json_kind(x));
            json_decref(o);
            return KILN_E_DATA;
        }
        v[i] = (long long)json_integer_value(x);
    }
    json_decref(o);
    for (int i = 0; i < PROGRESS_FIELDS; i++) {
        if (v[i] >= 0 && v[i] < CKPT_COUNT_LIMIT) continue;
        char n[64];
        progress_name(i, n, sizeof n);
        return ht_errorc(err, KILN_E_DATA,
                         "%s: progress counter %s: expected 0 <= value < 2^53, found %lld", path, n, v[i]);
    }
    enum { READY, STARTED, PROCESSED, COMPLETED };
    int bad = 0;
    for (int i = 0; i < 4 && !bad; i++) {
        for (int j = 0; j < 2 && !bad; j++) {
            const int b = 8 * i + 4 * j;
            /* nothing starts, is processed or completes before it is ready
             * (an optimizer step has no started/processed: those stay 0) */
            bad = progress_le(v, b + STARTED, b + READY, 0, path, err) ||
                  progress_le(v, b + PROCESSED, b + READY, 0, path, err) ||
                  progress_le(v, b + COMPLETED, b + READY, 0, path, err);
            /* epochs: kiln saves after an epoch's start hooks and after its
             * end hooks, never between, so ready == started and processed
             * == completed; one epoch at most is in flight */
            if (!bad && i == 0)
                bad = progress_le(v, b + READY, b + STARTED, 0, path, err) ||
                      progress_le(v, b + COMPLETED, b + PROCESSED, 0, path, err) ||
                      progress_le(v, b + PROCESSED, b + COMPLETED, 0, path, err) ||
                      progress_le(v, b + READY, b + COMPLETED, 1, path, err);
            /* a batch completes after its step started and ran; -1 from
             * on_train_batch_start processes a batch that never started */
            if (!bad && i == 1)
                bad = progress_le(v, b + COMPLETED, b + PROCESSED, 0, path, err) ||
                      progress_le(v, b + COMPLETED, b + STARTED, 0, path, err);
            if (!bad && i == 3) bad = progress_le(v, b + COMPLETED, b + STARTED, 0, path, err);
        }
        /* `current` is this run's share of `total` */
        for (int k = 0; k < 4 && !bad; k++) bad = progress_le(v, 8 * i + 4 + k, 8 * i + k, 0, path, err);
    }
    /* batches that stepped are among the batches run, which all completed
     * (a run resumed from a file older than this text counts its earlier
     * batches in total_batch_idx only); skipped steps are counted steps */
    if (!bad)
        bad = progress_le(v, 32, 33, 0, path, err) || progress_le(v, 8 + COMPLETED, 33, 0, path, err) ||
              progress_le(v, 34, 16 + COMPLETED, 0, path, err);
    return bad ? KILN_E_DATA : KILN_OK;
}

static void progress_apply(ht_trainer *t, const long long *v) {
    ht_progress *ps[4] = {&t->epoch_progress, &t->batch_progress, &t->opt_step, &t->zero_grad};
    for (int i = 0; i < 4; i++) {
        ht_counts *c[2] = {&ps[i]->total, &ps[i]->current};
        for (int j = 0; j < 2; j++) {
            const long long *x = v + 8 * i + 4 * j;
            *c[j] = (ht_counts){x[0], x[1], x[2], x[3]};
        }
    }
    t->batches_that_stepped = v[32];
    t->total_batch_idx = v[33];
    t->skipped_steps = v[34];
    t->samples_seen = v[35];
}

/* The loops object (loops_text): the epoch count, global step, batches that
 * stepped and total batch index (the same counters as progress, checked
 * against it by the caller), the scheduler's step count and rate factor.
 * 0, or -1 with a message. */
static int loops_parse(const char *text, const char *path, long long *v, double *lr_factor, ht_error *err) {
    static const char *const keys[7] = {"format", "epochs", "global_step", "batches_that_stepped",
                                        "total_batch_idx", "scheduler_steps", "lr_factor"};
    char q[200], found[300] = "none";
    json_t *o = text ? meta_object(text, found, sizeof found) : NULL;
    const char *fmt = json_string_value(json_object_get(o, "format"));
    const char *other = o ? hm_json_other_key(o, keys, 7) : NULL;
    int bad = !o;
    if (o && (!fmt || strcmp(fmt, LOOPS_FORMAT) != 0)) {
        snprintf(found, sizeof found, "format %s%s%s", fmt ? "\"" : "", fmt ? meta_q(fmt, 40, q, sizeof q) : "none",
                 fmt ? "\"" : "");
        bad = 1;
    } else if (other) {
        snprintf(found, sizeof found, "an unknown key \"%s\"", meta_q(other, 60, q, sizeof q));
        bad = 1;
    }
    for (int i = 0; !bad && i < 5; i++) {
        json_t *x = json_object_get(o, LOOPS_NAME[i]);
        if (json_is_integer(x)) v[i] = (long long)json_integer_value(x);
        else snprintf(found, sizeof found, "%s = %s", LOOPS_NAME[i], json_kind(x)), bad = 1;
    }
    if (!bad && hm_json_real_value(json_object_get(o, "lr_factor"), lr_factor) != 0)
        snprintf(found, sizeof found, "lr_factor = %s", json_kind(json_object_get(o, "lr_factor"))), bad = 1;
    json_decref(o);
    if (bad) {
        ht_errorf(err,
              "%s: expected loop progress (__metadata__ loops = {\"format\": \"" LOOPS_FORMAT "\", \"epochs\", "
              "\"global_step\", \"batches_that_stepped\", \"total_batch_idx\", \"scheduler_steps\": integers, "
              "\"lr_factor\": a number}), found %s", path, found);
        return -1;
    }
    for (int i = 0; i < 5; i++)
        if (v[i] < 0 || v[i] >= CKPT_COUNT_LIMIT) {
            ht_errorf(err, "%s: loops counter %s: expected 0 <= value < 2^53, found %lld", path, LOOPS_NAME[i],
                      v[i]);
            return -1;
        }
    if (v[2] > v[3]) {
        ht_errorf(err, "%s: loops counter batches_that_stepped: expected <= total_batch_idx (%lld), found %lld",
                  path, v[3], v[2]);
        return -1;
    }
    /* step 0 is construction; then one step per stepping batch (interval
     * "step") or per epoch (interval "epoch", whose last batch may step
     * before the epoch completes) */
    if (v[4] > v[3] + v[0] + 2) {
        ht_errorf(err,
              "%s: loops counter scheduler_steps: expected <= total_batch_idx + epochs + 2 (%lld), found %lld", path,
              v[3] + v[0] + 2, v[4]);
        return -1;
    }
    if (!isfinite(*lr_factor) || *lr_factor < 0) {
        ht_errorf(err, "%s: loops lr_factor: expected a finite factor >= 0, found %g", path, *lr_factor);
        return -1;
    }
    return 0;
}

/* state.<role>: {"plugin": the plugin that saved it, "version": its state
 * version}. 0, or -1 with the entry as found in `found`. */
static int state_parse(const char *text, char *plugin, size_t plen, uint32_t *version, char *found, size_t n) {
    json_t *o = meta_object(text, found, n);
    static const char *const keys[2] = {"plugin", "version"};
    const char *p = json_string_value(json_object_get(o, "plugin"));
    json_t *ver = json_object_get(o, "version");
    int ok = o && p && *p && strlen(p) < plen && json_is_integer(ver) && json_integer_value(ver) >= 0 &&
             json_integer_value(ver) <= UINT32_MAX && !hm_json_other_key(o, keys, 2);
    if (ok) {
        snprintf(plugin, plen, "%s", p);
        *version = (uint32_t)json_integer_value(ver);
    } else if (o) {
        char q[200];
        snprintf(found, n, "\"%s\"", meta_q(text, 120, q, sizeof q));
    }
    json_decref(o);
    return ok ? 0 : -1;
}

int ht_ckpt_save(ht_trainer *t, const char *path, ht_error *err) {
    size_t total = 0;
    for (uint32_t i = 0; i < t->nparams; i++) total += (size_t)t->params[i]->numel;
    size_t esz = kiln_dtype_size(t->param_dtype);
    const char *st_dtype = t->param_dtype == KILN_DTYPE_F64 ? "F64" : "F32";
    char *host = malloc((total ? total : 1) * esz);
    safetensors_writer *w = safetensors_writer_new();
    char *cfgtext = hc_text(t->cfg);
    int rc = host && w && cfgtext ? KILN_OK : KILN_E_NOMEM;
    if (rc) ht_errorf(err, "%s: out of memory preparing a checkpoint of %zu parameters", path, total);
    size_t off = 0;
    for (uint32_t i = 0; rc == KILN_OK && i < t->nparams; i++) {
        kiln_parameter *p = t->params[i];
        size_t nbytes = (size_t)p->numel * esz;
        herr_clear();
        int32_t crc = t->kernels->copy(t->accel.inst, host + off, p->data, nbytes, KILN_COPY_D2H);
        if (crc) { rc = ht_fail(t, &t->accel, crc, "copy of a parameter for the checkpoint", err); break; }
        rc = safetensors_add_tensor(w, p->name, st_dtype, p->shape, (int)p->ndim, host + off, nbytes,
                err);
        off += nbytes;
    }
    char num[64], stack[768], abi[16], opts[256] = "-";
    for (int i = 0; i < t->nopts; i++)
        snprintf(opts + (i ? strlen(opts) : 0), sizeof opts - (i ? strlen(opts) : 0), "%s%s", i ? "+" : "",
                 t->opts[i].p->view.name);
    snprintf(stack, sizeof stack, "accelerator=%s precision=%s strategy=%s module=%s data=%s optimizer=%s",
             t->accel.p->view.name, t->precision.p->view.name, t->strategy.p->view.name, t->module.p->view.name,
             t->data.p->view.name, opts);
    snprintf(abi, sizeof abi, "%d.%d", KILN_ABI_MAJOR, KILN_ABI_MINOR);
    if (rc == KILN_OK) rc = safetensors_add_metadata(w, "format", HT_CKPT_FORMAT, err);
    if (rc == KILN_OK) rc = safetensors_add_metadata(w, "kiln_version", KILN_VERSION_STRING, err);
    if (rc == KILN_OK) rc = safetensors_add_metadata(w, "abi", abi, err);
    if (rc == KILN_OK) rc = safetensors_add_metadata(w, "stack", stack, err);
    snprintf(num, sizeof num, "%lld", (long long)t->epoch_progress.current.completed);
    if (rc == KILN_OK) rc = safetensors_add_metadata(w, "epoch", num, err);
    snprintf(num, sizeof num, "%lld", (long long)t->opt_step.total.completed);
    if (rc == KILN_OK) rc = safetensors_add_metadata(w, "global_step", num, err);
    if (rc == KILN_OK) rc = safetensors_add_metadata(w, "config", cfgtext, err);
    /* the counters, and what the end of the epoch reads (callback metrics,
     * epoch sums), as JSON */
    char *loops = rc == KILN_OK ? loops_text(t) : NULL, *progress = rc == KILN_OK ? progress_text(t) : NULL;
    char *metrics = rc == KILN_OK ? hm_export(&t->metrics) : NULL;
    if (rc == KILN_OK && (!loops || !progress || !metrics)) {
        ht_errorf(err, "%s: cannot write the loop counters or the logged metrics as JSON (out of memory, or a "
              "metric name that is not UTF-8)", path);
        rc = KILN_E_STATE;
    }
    if (rc == KILN_OK) rc = safetensors_add_metadata(w, "loops", loops, err);
    if (rc == KILN_OK) rc = safetensors_add_metadata(w, "progress", progress, err);
    if (rc == KILN_OK) rc = safetensors_add_metadata(w, "metrics", metrics, err);
    free(loops);
    free(progress);
    free(metrics);
    /* Each plugin's own state (get_state), as a U8 tensor "__state__.<role>"
     * with "state.<role>" = {"plugin":..,"version":..} in the metadata. */
    ckpt_slot cs[9 + HT_MAX_OPTIMIZERS + HT_MAX_CALLBACKS];
    void *blobs[9 + HT_MAX_OPTIMIZERS + HT_MAX_CALLBACKS] = {0};
    int ns = state_slots(t, cs);
    for (int i = 0; rc == KILN_OK && i < ns; i++) {
        ht_slot *sl = cs[i].s;
        if (!sl->p->ops->get_state) continue;
        uint32_t ver = 0;
        size_t size = 0;
        herr_clear();
        int32_t src = sl->p->ops->get_state(sl->inst, &ver, &blobs[i], &size);
        if (src) { rc = ht_fail(t, sl, src, "get_state", err); break; }
        char name[64], meta[160];
        snprintf(name, sizeof name, "__state__.%s", cs[i].role);
        snprintf(meta, sizeof meta, "state.%s", cs[i].role);
        char *val = json_text(json_pack("{ss sI}", "plugin", sl->p->view.name, "version", (json_int_t)ver));
        int64_t shape[1] = {(int64_t)size};
        rc = val ? safetensors_add_tensor(w, name, "U8", shape, 1, blobs[i], size,
                err) : KILN_E_NOMEM;
        if (!val) ht_errorf(err, "%s: out of memory writing the %s state entry", path, cs[i].role);
        if (rc == KILN_OK) rc = safetensors_add_metadata(w, meta, val, err);
        free(val);
    }
    if (rc == KILN_OK) rc = safetensors_write_atomic(w, path, err);
    for (int i = 0; i < ns; i++)
        if (blobs[i]) hs_svc_free(&cs[i].s->hctx, blobs[i]);
    safetensors_writer_free(w);
    free(cfgtext);
    free(host);
    return rc;
}

int ht_ckpt_save_last(ht_trainer *t, ht_error *err) {
    if (t->state.rank != 0 || !t->run_dir[0]) return KILN_OK; /* rank 0 writes */
    char dir[sizeof t->run_dir + 16], path[sizeof dir + 32];
    snprintf(dir, sizeof dir, "%s/checkpoints", t->run_dir);
    int rc = ht_mkdirs(dir, "the checkpoint directory", err);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/last.safetensors", dir);
    return ht_ckpt_save(t, path, err);
}

/* The checkpoints callbacks asked for (save_checkpoint), written now that
 * the loops are consistent. Rank 0 writes; parent folders are created. */
int ht_ckpt_flush(ht_trainer *t, ht_error *err) {
    int rc = KILN_OK;
    for (int i = 0; i < t->nckpt_pending && rc == KILN_OK; i++) {
        const char *path = t->ckpt_pending[i];
        if (t->state.rank != 0) continue;
        char parent[sizeof t->ckpt_pending[0]];
        snprintf(parent, sizeof parent, "%s", path);
        char *slash = strrchr(parent, '/');
        if (slash && slash != parent) {
            *slash = 0;
            rc = ht_mkdirs(parent, "the checkpoint directory", err);
        }
        if (rc == KILN_OK) rc = ht_ckpt_save(t, path, err);
    }
    t->nckpt_pending = 0;
    return rc;
}

int32_t ht_svc_save_checkpoint(kiln_host_ctx *h, const char *path) {
    ht_trainer *t = h ? h->trainer : NULL;
    if (!t || !t->fitting || t->stage == KILN_STAGE_SANITY || !t->run_dir[0]) {
        herr_set(KILN_E_STATE, "save_checkpoint is only available during fit (after its sanity check)");
        return KILN_E_STATE;
    }
    if (!path || !*path) {
        herr_set(KILN_E_INVALID_ARG, "save_checkpoint: expected a file path, found an empty one");
        return KILN_E_INVALID_ARG;
    }
    if (t->nckpt_pending >= (int)(sizeof t->ckpt_pending / sizeof t->ckpt_pending[0])) {
        herr_set(KILN_E_STATE, "save_checkpoint: more than 8 checkpoints requested for one batch");
        return KILN_E_STATE;
    }
    char *dst = t->ckpt_pending[t->nckpt_pending];
    int n = path[0] == '/' ? snprintf(dst, sizeof t->ckpt_pending[0], "%s", path)
                           : snprintf(dst, sizeof t->ckpt_pending[0], "%s/%s", t->run_dir, path);
    if (n < 0 || (size_t)n >= sizeof t->ckpt_pending[0]) {
        herr_set(KILN_E_INVALID_ARG, "save_checkpoint: the path is too long");
        return KILN_E_INVALID_ARG;
    }
    t->nckpt_pending++;
    return KILN_OK;
}

/* The tensor for parameter `name`: under its own name, or, in a plain
 * safetensors file (`plain`), under the name without its first component,
 * which is how a model saved from its inner part names it (Hugging Face's
 * published GPT-2 weights say "h.0.ln_1.weight" for GPT2LMHeadModel's
 * "transformer.h.0.ln_1.weight"). */
static const safetensors_tensor *find_weight(safetensors_file *f, const char *name, int plain) {
    const safetensors_tensor *x = safetensors_find(f, name);
    const char *dot = strchr(name, '.');
    if (!x && plain && dot && dot[1]) x = safetensors_find(f, dot + 1);
    return x;
}

/* Copy the weights of an open checkpoint into the parameters. With
 * `plain_ok` (--weights-only, test/validate --ckpt) a safetensors file that
 * kiln did not write is accepted too: its tensors are matched by name. */
static int load_weights_from(ht_trainer *t, safetensors_file *f, const char *path, int plain_ok, ht_error *err) {
    int rc = KILN_OK;
    const char *fmt = safetensors_metadata(f, "format");
    const int plain = plain_ok && (!fmt || strcmp(fmt, HT_CKPT_FORMAT) != 0);
    if (plain)
        HLOG_INFO("%s: not a kiln checkpoint (format %s); loading the module's weights from it by name", path,
                  fmt ? fmt : "not given");
    if (!plain && (!fmt || strcmp(fmt, HT_CKPT_FORMAT) != 0)) {
        ht_errorf(err, "%s: expected a kiln checkpoint (__metadata__ format = \"%s\"), found %s%s%s", path,
              HT_CKPT_FORMAT, fmt ? "\"" : "", fmt ? fmt : "no format entry", fmt ? "\"" : "");
        return KILN_E_DATA;
    }
    for (uint32_t i = 0; rc == KILN_OK && i < t->nparams; i++) {
        kiln_parameter *p = t->params[i];
        const safetensors_tensor *x = find_weight(f, p->name, plain);
        char want[96] = "", got[96] = "";
        for (uint32_t d = 0; d < p->ndim; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "", (long long)p->shape[d]);
        if (!x) {
            ht_errorf(err, "%s: has no tensor '%s' (%s) that module '%s' expects (stack in the file: %s)", path,
                  p->name, want, t->module.p->view.name, safetensors_metadata(f, "stack") ? safetensors_metadata(f, "stack") : "?");
            rc = KILN_E_STATE;
            break;
        }
        const char *want_dt = t->param_dtype == KILN_DTYPE_F64 ? "F64" : "F32";
        uint32_t file_dt = !strcmp(x->dtype, "F64") ? KILN_DTYPE_F64 : !strcmp(x->dtype, "F32") ? KILN_DTYPE_F32 : 0;
        /* float32 <-> float64 masters convert (a 64-true checkpoint tested
         * under 32-true, or the reverse) where the kernels can cast in
         * place; anything else is refused. */
        int castable = file_dt && file_dt != t->param_dtype && t->kernels->struct_size >= KILN_KERNELS_SIZE_1_2 &&
                       t->kernels->cast && (t->kernels->flags & KILN_KERNELS_HOST_MEMORY);
        int same = x->ndim == (int)p->ndim && (file_dt == t->param_dtype || castable);
        for (int d = 0; d < x->ndim; d++) {
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)x->shape[d]);
            if (same && x->shape[d] != p->shape[d]) same = 0;
        }
        if (!same) {
            ht_errorf(err, "%s: tensor '%s' is %s [%s], module '%s' expects %s [%s]", path, p->name, x->dtype, got,
                  t->module.p->view.name, want_dt, want);
            rc = KILN_E_STATE;
            break;
        }
        herr_clear();
        int32_t crc;
        if (file_dt == t->param_dtype) {
            crc = t->kernels->copy(t->accel.inst, p->data, x->data, x->nbytes, KILN_COPY_H2D);
        } else {
            if (i == 0) HLOG_INFO("%s: converting %s weights to %s", path, x->dtype, want_dt);
            crc = t->kernels->cast(t->accel.inst, p->data, t->param_dtype, x->data, file_dt, (size_t)p->numel);
        }
        if (crc) rc = ht_fail(t, &t->accel, crc, "copy of a checkpoint tensor", err);
    }
    if (rc == KILN_OK) {
        /* name what is ignored: another model's file fails loudly above,
         * extra tensors (buffers, a tied output head) only warn */
        int nextra = 0;
        char names[256] = "";
        for (int i = 0; i < safetensors_count(f); i++) {
            const char *n = safetensors_get(f, i)->name;
            if (!strncmp(n, "__state__.", 10)) continue;
            int used = 0;
            for (uint32_t j = 0; j < t->nparams && !used; j++) used = find_weight(f, t->params[j]->name, plain) == safetensors_get(f, i);
            if (used) continue;
            if (nextra++ < 3)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", nextra > 1 ? ", " : "", n);
        }
        if (nextra)
            HLOG_WARN("%s: %d tensor(s) in the file are not parameters of module '%s' and are ignored (%s%s)", path,
                      nextra, t->module.p->view.name, names, nextra > 3 ? ", ..." : "");
    }
    if (rc == KILN_OK) {
        const char *e = safetensors_metadata(f, "epoch"), *s = safetensors_metadata(f, "global_step");
        HLOG_INFO("loaded weights from %s (epoch %s, global step %s)", path, e ? e : "?", s ? s : "?");
    }
    return rc;
}

int ht_ckpt_load_weights(ht_trainer *t, const char *path, ht_error *err) {
    safetensors_file *f = NULL;
    int rc = safetensors_open(path, &f, err);
    if (rc) return rc;
    rc = load_weights_from(t, f, path, 1, err);
    safetensors_close(f);
    return rc;
}

int ht_ckpt_resume(ht_trainer *t, const char *path, ht_error *err) {
    safetensors_file *f = NULL;
    int rc = safetensors_open(path, &f, err);
    if (rc) return rc;
    if ((rc = load_weights_from(t, f, path, 0, err))) {
        safetensors_close(f);
        return rc;
    }
    /* Every counter is checked before any plugin state is touched: a
     * refused file leaves nothing half-restored. The progress first: an
     * older kiln's file is told apart by it. */
    long long pv[PROGRESS_FIELDS];
    if ((rc = progress_parse(safetensors_metadata(f, "progress"), path, pv, err)) != KILN_OK) {
        safetensors_close(f);
        return rc;
    }
    long long lv[5] = {0, 0, 0, 0, 0};
    double lr_factor = 1.0;
    if (loops_parse(safetensors_metadata(f, "loops"), path, lv, &lr_factor, err) != 0) {
        safetensors_close(f);
        return KILN_E_DATA;
    }
    const long long ep = lv[0], step = lv[1], stepped = lv[2], tbi = lv[3], sched_steps = lv[4];
    if (t->set.max_epochs != -1 && ep > t->set.max_epochs) {
        ht_errorf(err, "%s: the checkpoint is after epoch %lld, beyond trainer.max_epochs = %lld", path, ep,
              (long long)t->set.max_epochs);
        safetensors_close(f);
        return KILN_E_CONFIG;
    }
    /* both objects are written from the same counters at the same point */
    const long long *pair[4][2] = {{&ep, &pv[3]}, {&step, &pv[16 + 3]}, {&stepped, &pv[32]}, {&tbi, &pv[33]}};
    for (int i = 0; i < 4; i++) {
        if (*pair[i][0] == *pair[i][1]) continue;
        char n[64];
        progress_name((int)(pair[i][1] - pv), n, sizeof n);
        ht_errorf(err, "%s: loops counter %s: expected %lld (progress counter %s), found %lld", path,
              LOOPS_NAME[i], *pair[i][1], n, *pair[i][0]);
        safetensors_close(f);
        return KILN_E_DATA;
    }
    /* the metric store as saved */
    const char *mm = safetensors_metadata(f, "metrics");
    ht_error mwhy = {.msg = "expected a metrics object, found none"};
    ht_metrics *saved_metrics = malloc(sizeof *saved_metrics);
    const int bad = !saved_metrics ? KILN_E_NOMEM
                    : !mm || hm_import(saved_metrics, mm, &mwhy) ? KILN_E_DATA
                                                                             : KILN_OK;
    if (bad) {
        if (bad == KILN_E_DATA) ht_errorf(err, "%s: __metadata__ metrics: %s", path, mwhy.msg);
        else ht_errorf(err, "%s: out of memory reading the metrics", path);
        free(saved_metrics);
        safetensors_close(f);
        return bad;
    }
    ckpt_slot cs[9 + HT_MAX_OPTIMIZERS + HT_MAX_CALLBACKS];
    int ns = state_slots(t, cs);
    for (int i = 0; rc == KILN_OK && i < ns; i++) {
        ht_slot *sl = cs[i].s;
        char name[64], meta[64];
        snprintf(name, sizeof name, "__state__.%s", cs[i].role);
        snprintf(meta, sizeof meta, "state.%s", cs[i].role);
        const safetensors_tensor *x = safetensors_find(f, name);
        const char *m = safetensors_metadata(f, meta);
        if (!x || !m) continue; /* nothing saved for this role: it starts fresh */
        char plugin[128] = "", found[300];
        uint32_t ver = 0;
        if (state_parse(m, plugin, sizeof plugin, &ver, found, sizeof found) != 0) {
            ht_errorf(err, "%s: __metadata__ %s: expected {\"plugin\": a name, \"version\": an integer "
                  "0..4294967295}, found %s", path, meta, found);
            rc = KILN_E_DATA;
            break;
        }
        if (strcmp(plugin, sl->p->view.name) != 0) {
            char q[512];
            ht_errorf(err, "%s: the %s state was saved by '%s', this run uses %s '%s'; resume with the same stack",
                  path, cs[i].role, meta_q(plugin, 120, q, sizeof q), hl_kind_name(sl->p->view.kind),
                  sl->p->view.name);
            rc = KILN_E_STATE;
            break;
        }
        if (!sl->p->ops->set_state) {
            ht_errorf(err, "%s: has a %s state but %s '%s' cannot restore state", path, cs[i].role,
                  hl_kind_name(sl->p->view.kind), sl->p->view.name);
            rc = KILN_E_STATE;
            break;
        }
        herr_clear();
        int32_t src = sl->p->ops->set_state(sl->inst, ver, x->data, x->nbytes);
        if (src) rc = ht_fail(t, sl, src, "set_state", err);
    }
    safetensors_close(f);
    if (rc) {
        free(saved_metrics);
        return rc;
    }
    t->metrics = *saved_metrics;
    free(saved_metrics);
    progress_apply(t, pv);
    /* Every counter as saved. Inside an epoch (its start hooks ran, it has
     * not been processed) the epoch loop picks up at the next batch:
     * reset_on_restart of the batch progress is a no-op here, because the
     * save happened after the batch completed. A checkpoint written at an
     * epoch's end: the next epoch starts fresh (processed == completed). */
    t->restart_mid_epoch = t->epoch_progress.current.started > t->epoch_progress.current.processed;
    ht_counts *bc = &t->batch_progress.current;
    bc->ready = bc->started = bc->processed = bc->completed;
    t->resumed = 1;
    /* the schedule continues where it was (its plugin restored its own
     * state above); without a scheduler the factor is 1 */
    if (t->scheduler.p) {
        t->sched_steps = sched_steps;
        for (int i = 0; i < t->nopts; i++) {
            double lr = t->base_lr[i] * lr_factor;
            herr_clear();
            int32_t src = t->opt_ops[i]->set_lr(t->opts[i].inst, lr);
            if (src) return ht_fail(t, &t->opts[i], src, "set_lr", err);
            t->lr[i] = lr;
        }
        t->lr_factor = lr_factor;
    }
    if (t->restart_mid_epoch)
        HLOG_INFO("resuming inside epoch %lld after batch %lld, global step %lld",
                  (long long)t->epoch_progress.current.completed, (long long)t->batch_progress.current.completed - 1,
                  (long long)t->opt_step.total.completed);
    else
        HLOG_INFO("resuming after epoch %lld, global step %lld", ep, step);
    return KILN_OK;
}

int ht_ckpt_resolve(const ht_trainer *t, const char *arg, char *out, size_t outlen, ht_error *err) {
    if (strcmp(arg, "last") != 0) {
        snprintf(out, outlen, "%s", arg);
        return KILN_OK;
    }
    const char *root = t->set.default_root_dir;
    DIR *d = opendir(root);
    long best = -1;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            char *end;
            if (strncmp(e->d_name, "version_", 8) != 0) continue;
            long v = strtol(e->d_name + 8, &end, 10);
            if (*end || v <= best) continue;
            char p[4096];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s/checkpoints/last.safetensors", root, e->d_name);
            if (stat(p, &st) == 0) best = v;
        }
        closedir(d);
    }
    if (best < 0) {
        ht_errorf(err, "--ckpt last: no %s/version_N/checkpoints/last.safetensors found (trainer.default_root_dir = "
              "\"%s\"); train first or give a path", root, root);
        return KILN_E_NOT_FOUND;
    }
    snprintf(out, outlen, "%s/version_%ld/checkpoints/last.safetensors", root, best);
    return KILN_OK;
}
