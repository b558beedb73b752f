/*
 * host/metrics.c — the metric store behind log_value()/get_metric(): see
 * metrics.h. Fixed-size tables (a run logs a handful of names), no
 * allocation on the training path. The checkpoint's copy of the store is
 * JSON written and read with jansson.
 */
#include "metrics.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The "format" of the checkpoint text (metrics.h). */
#define HM_FORMAT "kiln-metrics-2"

static ht_metric *find_or_add(ht_metrics *M, const char *name) {
    for (int i = 0; i < M->n; i++)
        if (!strcmp(M->m[i].name, name)) return &M->m[i];
    if (M->n >= HM_MAX) return NULL;
    ht_metric *m = &M->m[M->n++];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    return m;
}

void hm_set_cb(ht_metrics *M, const char *name, double value) {
    for (int i = 0; i < M->ncb; i++)
        if (!strcmp(M->cb_name[i], name)) { M->cb_value[i] = value; return; }
    if (M->ncb >= HM_MAX * 3) return;
    snprintf(M->cb_name[M->ncb], sizeof M->cb_name[0], "%s", name);
    M->cb_value[M->ncb++] = value;
}

int hm_get(const ht_metrics *M, const char *name, double *out) {
    for (int i = 0; i < M->ncb; i++)
        if (!strcmp(M->cb_name[i], name)) { *out = M->cb_value[i]; return 0; }
    return -1;
}

void hm_clear_cb(ht_metrics *M) { M->ncb = 0; }

void hm_log(ht_metrics *M, int stage, const char *name, double value, uint32_t flags, double weight) {
    ht_metric *m = find_or_add(M, name);
    if (!m) return;
    m->flags = flags;
    m->stage = stage;
    if (flags & KILN_LOG_ON_STEP) {
        m->step_value = value;
        m->has_step = 1;
        hm_set_cb(M, name, value);
        if (flags & KILN_LOG_ON_EPOCH) {
            char n[72];
            snprintf(n, sizeof n, "%s_step", name);
            hm_set_cb(M, n, value);
        }
    }
    if (flags & KILN_LOG_ON_EPOCH) {
        if (!(weight > 0)) weight = 1.0;
        m->sum += value * weight;
        m->weight += weight;
        m->in_epoch = 1;
    }
}

int hm_take_step(ht_metrics *M, kiln_kv *kv, int cap, char (*names)[72]) {
    int k = 0;
    for (int i = 0; i < M->n && k < cap; i++) {
        ht_metric *m = &M->m[i];
        if (!m->has_step) continue;
        m->has_step = 0;
        if (m->flags & KILN_LOG_ON_EPOCH) snprintf(names[k], 72, "%s_step", m->name);
        else snprintf(names[k], 72, "%s", m->name);
        kv[k].key = names[k];
        kv[k].value = (kiln_value){KILN_TYPE_FLOAT, 0, {.f = m->step_value}};
        k++;
    }
    return k;
}

int hm_take_epoch(ht_metrics *M, int stage, kiln_kv *kv, int cap, char (*names)[72]) {
    int k = 0;
    for (int i = 0; i < M->n && k < cap; i++) {
        ht_metric *m = &M->m[i];
        if (!m->in_epoch || m->stage != stage) continue;
        double mean = m->sum / m->weight;
        m->sum = m->weight = 0;
        m->in_epoch = 0;
        if (m->flags & KILN_LOG_ON_STEP) snprintf(names[k], 72, "%s_epoch", m->name);
        else snprintf(names[k], 72, "%s", m->name);
        hm_set_cb(M, names[k], mean);
        hm_set_cb(M, m->name, mean); /* callback_metrics[name] is the epoch value */
        kv[k].key = names[k];
        kv[k].value = (kiln_value){KILN_TYPE_FLOAT, 0, {.f = mean}};
        k++;
    }
    return k;
}

void hm_peek_epoch(ht_metrics *M, int stage) {
    char n[72];
    for (int i = 0; i < M->n; i++) {
        const ht_metric *m = &M->m[i];
        if (!m->in_epoch || m->stage != stage) continue;
        const double mean = m->sum / m->weight;
        if (m->flags & KILN_LOG_ON_STEP) {
            snprintf(n, sizeof n, "%s_epoch", m->name);
            hm_set_cb(M, n, mean);
        }
        hm_set_cb(M, m->name, mean);
    }
}

void hm_reset_epoch(ht_metrics *M, int stage) {
    for (int i = 0; i < M->n; i++)
        if (M->m[i].stage == stage) {
            M->m[i].sum = M->m[i].weight = 0;
            M->m[i].in_epoch = 0;
            M->m[i].has_step = 0;
        }
}

/* ---------------------------------------------------------------------------
 * Checkpoint text (metrics.h), in JSON through jansson */

json_t *hm_json_real(double v) {
    if (isnan(v)) return json_string("nan");
    if (isinf(v)) return json_string(v > 0 ? "inf" : "-inf");
    return json_real(v);
}

int hm_json_real_value(const json_t *j, double *out) {
    if (json_is_number(j)) {
        *out = json_number_value(j);
        return 0;
    }
    const char *s = json_string_value(j);
    if (!s) return -1;
    if (!strcmp(s, "nan")) *out = NAN;
    else if (!strcmp(s, "inf")) *out = INFINITY;
    else if (!strcmp(s, "-inf")) *out = -INFINITY;
    else return -1;
    return 0;
}

char *hm_export(const ht_metrics *M) {
    json_t *cb = json_array(), *ep = json_array();
    json_t *o = json_pack("{ss so so}", "format", HM_FORMAT, "callback", cb, "epoch", ep);
    int bad = !o;
    for (int i = 0; !bad && i < M->ncb; i++)
        bad = json_array_append_new(cb, json_pack("{ss so}", "name", M->cb_name[i], "value",
                                                  hm_json_real(M->cb_value[i]))) != 0;
    for (int i = 0; !bad && i < M->n; i++) {
        const ht_metric *m = &M->m[i];
        if (!m->in_epoch) continue;
        bad = json_array_append_new(ep, json_pack("{ss si sI so so}", "name", m->name, "stage", m->stage, "flags",
                                                  (json_int_t)m->flags, "sum", hm_json_real(m->sum), "weight",
                                                  hm_json_real(m->weight))) != 0;
    }
    char *text = bad ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

/* A name as stored: 1..cap-1 bytes, no control character. */
static int name_ok(const char *s, size_t cap) {
    size_t k = 0;
    for (; s && s[k]; k++)
        if ((unsigned char)s[k] < 0x20 || s[k] == 0x7f || k + 1 >= cap) return 0;
    return k > 0;
}

const char *hm_json_other_key(json_t *o, const char *const *keys, int n) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int known = 0;
        for (int i = 0; i < n && !known; i++) known = !strcmp(k, keys[i]);
        if (!known) return k;
    }
    return NULL;
}

int hm_import(ht_metrics *out, const char *text, ht_error *err) {
    memset(out, 0, sizeof *out);
    json_error_t e;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &e);
    static const char *const top[] = {"format", "callback", "epoch"};
    const char *fmt = json_string_value(json_object_get(o, "format"));
    json_t *cb = json_object_get(o, "callback"), *ep = json_object_get(o, "epoch");
    if (!json_is_object(o) || !fmt || strcmp(fmt, HM_FORMAT) != 0 || !json_is_array(cb) || !json_is_array(ep) ||
        hm_json_other_key(o, top, 3)) {
        char found[96];
        if (!o) snprintf(found, sizeof found, "invalid JSON (%.60s)", e.text);
        else if (!json_is_object(o)) snprintf(found, sizeof found, "a JSON value that is not an object");
        else if (!fmt) snprintf(found, sizeof found, "no format");
        else if (strcmp(fmt, HM_FORMAT) != 0) snprintf(found, sizeof found, "format \"%.40s\"", fmt);
        else if (hm_json_other_key(o, top, 3)) snprintf(found, sizeof found, "an unknown key \"%.40s\"", hm_json_other_key(o, top, 3));
        else snprintf(found, sizeof found, "%s that is not an array", json_is_array(cb) ? "\"epoch\"" : "\"callback\"");
        for (char *c = found; *c; c++)
            if ((unsigned char)*c < 0x20) *c = ' '; /* one line */
        ht_errorf(err, "expected a metrics object {\"format\": \"" HM_FORMAT "\", \"callback\": [...], "
                  "\"epoch\": [...]}, found %s", found);
        json_decref(o);
        return -1;
    }
    int rc = 0;
    static const char *const cbkeys[] = {"name", "value"};
    for (size_t i = 0; !rc && i < json_array_size(cb); i++) {
        json_t *x = json_array_get(cb, i);
        const char *name = json_string_value(json_object_get(x, "name"));
        double v;
        if (!json_is_object(x) || hm_json_other_key(x, cbkeys, 2) || !name_ok(name, sizeof out->cb_name[0]) ||
            hm_json_real_value(json_object_get(x, "value"), &v)) {
            ht_errorf(err, "metrics callback[%zu]: expected {\"name\": a name of 1..%zu printable bytes, "
                      "\"value\": a number}", i, sizeof out->cb_name[0] - 1);
            rc = -1;
        } else if (out->ncb >= HM_MAX * 3) {
            ht_errorf(err, "metrics callback[%zu]: more than %d callback metrics", i, HM_MAX * 3);
            rc = -1;
        } else {
            hm_set_cb(out, name, v);
        }
    }
    static const char *const epkeys[] = {"name", "stage", "flags", "sum", "weight"};
    for (size_t i = 0; !rc && i < json_array_size(ep); i++) {
        json_t *x = json_array_get(ep, i);
        const char *name = json_string_value(json_object_get(x, "name"));
        double stage, flags, sum, weight;
        if (!json_is_object(x) || hm_json_other_key(x, epkeys, 5) || !name_ok(name, sizeof out->m[0].name) ||
            hm_json_real_value(json_object_get(x, "stage"), &stage) ||
            hm_json_real_value(json_object_get(x, "flags"), &flags) ||
            hm_json_real_value(json_object_get(x, "sum"), &sum) ||
            hm_json_real_value(json_object_get(x, "weight"), &weight)) {
            ht_errorf(err, "metrics epoch[%zu]: expected {\"name\": a name of 1..%zu printable bytes, "
                      "\"stage\", \"flags\", \"sum\", \"weight\": numbers}", i, sizeof out->m[0].name - 1);
            rc = -1;
        } else if (stage != floor(stage) || stage < 0 || stage > 16 || flags != floor(flags) || flags < 0 ||
                   flags > 0xffff || !isfinite(sum) || !isfinite(weight) || !(weight > 0)) {
            ht_errorf(err, "metrics epoch[%zu] (%s): expected a stage 0..16, flags, a finite sum and a "
                      "weight > 0, found %g %g %g %g", i, name, stage, flags, sum, weight);
            rc = -1;
        } else if (out->n >= HM_MAX) {
            ht_errorf(err, "metrics epoch[%zu]: more than %d epoch metrics", i, HM_MAX);
            rc = -1;
        } else {
            ht_metric *m = find_or_add(out, name);
            m->stage = (int)stage;
            m->flags = (uint32_t)flags;
            m->sum = sum;
            m->weight = weight;
            m->in_epoch = 1;
        }
    }
    json_decref(o);
    return rc;
}
