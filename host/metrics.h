/*
 * host/metrics.h — Lightning's logging: values a plugin logs with
 * log_value() become callback_metrics (what get_metric reads), step values
 * are sent to logger callbacks every log_every_n_steps optimizer steps, and
 * epoch values are means weighted by batch size, sent at the end of each
 * train or evaluation epoch. A value logged both on step and on epoch is
 * logged as <name>_step and <name>_epoch, as Lightning does.
 */
#ifndef KILN_HOST_METRICS_H
#define KILN_HOST_METRICS_H

#include <jansson.h>
#include <stdint.h>

#include "error.h"
#include "kiln/plugin.h"

#define HM_MAX 64

typedef struct ht_metric {
    char name[64];
    uint32_t flags;
    double step_value;   /* last value logged                              */
    int has_step;        /* logged since the last step flush               */
    double sum, weight;  /* epoch accumulation                             */
    int in_epoch;        /* accumulated during the current epoch           */
    int stage;           /* loop it was logged in (KILN_STAGE_*)           */
} ht_metric;

typedef struct ht_metrics {
    ht_metric m[HM_MAX];
    int n;
    /* callback_metrics: name -> latest value */
    char cb_name[HM_MAX * 3][72];
    double cb_value[HM_MAX * 3];
    int ncb;
} ht_metrics;

void hm_log(ht_metrics *M, int stage, const char *name, double value, uint32_t flags, double weight);
int hm_get(const ht_metrics *M, const char *name, double *out);
void hm_set_cb(ht_metrics *M, const char *name, double value);
/* Collect step values (names suffixed _step where also on_epoch) into kv;
 * returns the count. Clears the step flags. */
int hm_take_step(ht_metrics *M, kiln_kv *kv, int cap, char (*names)[72]);
/* Reduce epoch means of the metrics logged in loop `stage` into kv and
 * callback_metrics; resets their accumulation. */
int hm_take_epoch(ht_metrics *M, int stage, kiln_kv *kv, int cap, char (*names)[72]);
/* The epoch means so far of loop `stage` into callback_metrics, keeping
 * the accumulation (what monitoring callbacks read at on_train_epoch_end,
 * before the means go to the loggers). */
void hm_peek_epoch(ht_metrics *M, int stage);
/* Forget accumulations of a loop (sanity-check results are not kept). */
void hm_reset_epoch(ht_metrics *M, int stage);
void hm_clear_cb(ht_metrics *M);

/* What a checkpoint keeps of the store, so a run resumed inside an epoch
 * (up to its last batch) ends that epoch as the uninterrupted run would:
 * callback_metrics (early stopping, a plateau schedule or the checkpoint
 * callback read them at on_train_epoch_end) and the epoch accumulations
 * (the epoch means cover every batch of the epoch). The text is one JSON
 * object (docs/checkpoints.md):
 *   {"format":"kiln-metrics-2",
 *    "callback":[{"name":N,"value":V},...],
 *    "epoch":[{"name":N,"stage":S,"flags":F,"sum":X,"weight":W},...]}
 * numbers exact (17 significant digits), a non-finite one as the string
 * "nan", "inf" or "-inf". hm_export returns the text (caller frees), NULL
 * when out of memory. */
char *hm_export(const ht_metrics *M);
/* Parses and checks a hm_export text into *out (a fresh store); on a
 * malformed or out-of-range entry returns -1 with a message (no file
 * name) in err. */
int hm_import(ht_metrics *out, const char *text, ht_error *err);

/* The checkpoint metadata's numbers (metrics, the loops' rate factor): a
 * JSON number, or for a value JSON cannot hold the string "nan", "inf" or
 * "-inf". hm_json_real returns a new reference (NULL when out of memory);
 * hm_json_real_value returns 0 and the value, or -1 for anything else. */
struct json_t;
struct json_t *hm_json_real(double v);
int hm_json_real_value(const struct json_t *j, double *out);

/* The first key of JSON object o that is not among the n in keys, or NULL:
 * the checkpoint's JSON readers (metrics here, progress and loops in
 * checkpoint.c) refuse unknown keys with it. */
const char *hm_json_other_key(json_t *o, const char *const *keys, int n);

#endif
