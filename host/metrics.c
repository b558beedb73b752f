/*
 * host/metrics.c — the metric store behind log_value()/get_metric(): see
 * metrics.h. Fixed-size tables (a run logs a handful of names), no
 * allocation on the training path.
 */
#include "metrics.h"

#include <stdio.h>
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
