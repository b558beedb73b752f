/*
 * host/metrics.c — the metric store behind log_value()/get_metric(): see
 * metrics.h. Fixed-size tables (a run logs a handful of names), no
 * allocation on the training path.
 */
#include "metrics.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
 * Checkpoint text (metrics.h) */

int hm_export(const ht_metrics *M, char *buf, size_t n) {
    size_t l = (size_t)snprintf(buf, n, "kiln-metrics-1\n");
    for (int i = 0; i < M->ncb && l < n; i++)
        l += (size_t)snprintf(buf + l, n - l, "c %.17g %s\n", M->cb_value[i], M->cb_name[i]);
    for (int i = 0; i < M->n && l < n; i++) {
        const ht_metric *m = &M->m[i];
        if (!m->in_epoch) continue;
        l += (size_t)snprintf(buf + l, n - l, "e %d %u %.17g %.17g %s\n", m->stage, (unsigned)m->flags, m->sum,
                              m->weight, m->name);
    }
    return l < n ? (int)l : -1;
}

/* One number of an entry; advances *p past it and one space. */
static int read_num(const char **p, double *out) {
    char *end;
    errno = 0;
    *out = strtod(*p, &end);
    if (end == *p || *end != ' ') return -1;
    *p = end + 1;
    return 0;
}

/* The rest of the line as a name: 1..cap-1 printable bytes. */
static int read_name(const char **p, char *name, size_t cap) {
    size_t k = 0;
    const char *s = *p;
    while (*s && *s != '\n') {
        if ((unsigned char)*s < 0x20 || *s == 0x7f || k + 1 >= cap) return -1;
        name[k++] = *s++;
    }
    name[k] = 0;
    if (*s == '\n') s++;
    *p = s;
    return k ? 0 : -1;
}

int hm_import(ht_metrics *out, const char *text, char *why, size_t whylen) {
    memset(out, 0, sizeof *out);
    const char *p = text;
    if (strncmp(p, "kiln-metrics-1\n", 15) != 0) {
        int k = (int)strcspn(text, "\n");
        snprintf(why, whylen, "expected metrics text \"kiln-metrics-1\", found \"%.*s\"", k < 20 ? k : 20, text);
        return -1;
    }
    p += 15;
    for (int line = 2; *p; line++) {
        const char kind = *p;
        if ((kind != 'c' && kind != 'e') || p[1] != ' ') {
            snprintf(why, whylen, "metrics line %d: expected \"c <value> <name>\" or \"e <stage> <flags> <sum> "
                     "<weight> <name>\"", line);
            return -1;
        }
        p += 2;
        if (kind == 'c') {
            double v;
            char name[sizeof out->cb_name[0]];
            if (read_num(&p, &v) || read_name(&p, name, sizeof name)) {
                snprintf(why, whylen, "metrics line %d: expected \"c <value> <name>\" (a name of 1..%zu printable "
                         "bytes)", line, sizeof name - 1);
                return -1;
            }
            if (out->ncb >= HM_MAX * 3) {
                snprintf(why, whylen, "metrics line %d: more than %d callback metrics", line, HM_MAX * 3);
                return -1;
            }
            hm_set_cb(out, name, v);
        } else {
            double stage, flags, sum, weight;
            char name[sizeof out->m[0].name];
            if (read_num(&p, &stage) || read_num(&p, &flags) || read_num(&p, &sum) || read_num(&p, &weight) ||
                read_name(&p, name, sizeof name)) {
                snprintf(why, whylen, "metrics line %d: expected \"e <stage> <flags> <sum> <weight> <name>\"", line);
                return -1;
            }
            if (stage != floor(stage) || stage < 0 || stage > 16 || flags != floor(flags) || flags < 0 ||
                flags > 0xffff || !isfinite(sum) || !isfinite(weight) || !(weight > 0)) {
                snprintf(why, whylen, "metrics line %d (%s): expected a stage 0..16, flags, a finite sum and a "
                         "weight > 0, found %g %g %g %g", line, name, stage, flags, sum, weight);
                return -1;
            }
            if (out->n >= HM_MAX) {
                snprintf(why, whylen, "metrics line %d: more than %d epoch metrics", line, HM_MAX);
                return -1;
            }
            ht_metric *m = find_or_add(out, name);
            m->stage = (int)stage;
            m->flags = (uint32_t)flags;
            m->sum = sum;
            m->weight = weight;
            m->in_epoch = 1;
        }
    }
    return 0;
}
