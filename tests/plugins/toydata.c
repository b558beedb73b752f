/*
 * tests/plugins/toydata.c — a synthetic data plugin for the trainer tests:
 * n_train/n_val/n_test batches of `batch_size` rows with `features` inputs
 * and two classes, generated from the batch index so every epoch and every
 * run sees the same numbers. No files, no threads: hook-order tests stay
 * fast and independent of the real data plugin.
 */
#include <math.h>
#include <stdlib.h>

#include "common_train.h"

struct toy_data {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    int64_t n[3], bs, features, pos[3], last_partial;
    float *x;       /* (bs, features) */
    int32_t *y;     /* (bs) */
    kiln_tensor t[2];
};

static int32_t td_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)ctx;
    struct toy_data *d = calloc(1, sizeof *d);
    if (!d) return KILN_E_NOMEM;
    d->svc = svc;
    d->hctx = h;
    d->n[KILN_SPLIT_TRAIN] = kiln_kv_int(cfg, "n_train", 4);
    d->n[KILN_SPLIT_VAL] = kiln_kv_int(cfg, "n_val", 2);
    d->n[KILN_SPLIT_TEST] = kiln_kv_int(cfg, "n_test", 2);
    d->bs = kiln_kv_int(cfg, "batch_size", 2);
    d->features = kiln_kv_int(cfg, "features", 3);
    d->last_partial = kiln_kv_int(cfg, "last_partial", 0);
    if (d->bs < 1 || d->features < 1) {
        free(d);
        return kiln_errorf(svc, h, KILN_E_CONFIG, "batch_size and features must be >= 1");
    }
    d->x = calloc((size_t)(d->bs * d->features), sizeof(float));
    d->y = calloc((size_t)d->bs, sizeof(int32_t));
    *out = (kiln_instance *)d;
    return KILN_OK;
}

static void td_destroy(kiln_instance *i) {
    struct toy_data *d = (struct toy_data *)i;
    free(d->x);
    free(d->y);
    free(d);
}

static int32_t td_setup(kiln_instance *i, int32_t stage, int32_t rank, int32_t world) {
    (void)i; (void)stage; (void)rank; (void)world;
    return KILN_OK;
}

static int32_t td_num(kiln_instance *i, int32_t split, int64_t *n) {
    *n = ((struct toy_data *)i)->n[split];
    return KILN_OK;
}

static int32_t td_start(kiln_instance *i, int32_t split, uint64_t epoch, int64_t start) {
    (void)epoch;
    ((struct toy_data *)i)->pos[split] = start;
    return KILN_OK;
}

static int32_t td_next(kiln_instance *i, int32_t split, kiln_batch *out) {
    struct toy_data *d = (struct toy_data *)i;
    if (d->pos[split] >= d->n[split]) return 0;
    int64_t b = d->pos[split]++;
    int64_t rows = d->bs;
    if (d->last_partial && b == d->n[split] - 1 && rows > 1) rows--;
    for (int64_t r = 0; r < rows; r++) {
        int cls = (int)((b + r + split) % 2);
        d->y[r] = cls;
        for (int64_t f = 0; f < d->features; f++)
            d->x[r * d->features + f] = (float)(sin((double)(7 * b + 3 * r + f + 11 * split)) + (cls ? 0.5 : -0.5));
    }
    d->t[0] = (kiln_tensor){d->x, KILN_DTYPE_F32, 2, {rows, d->features, 1, 1}};
    d->t[1] = (kiln_tensor){d->y, KILN_DTYPE_I32, 1, {rows, 1, 1, 1}};
    out->ntensors = 2;
    out->tensors = d->t;
    out->size = rows;
    return 1;
}

static const kiln_data_ops td_ops = {{sizeof(kiln_data_ops), 0, td_create, td_destroy, NULL, NULL},
                                     td_setup, td_num, td_start, td_next};
static const kiln_param td_params[] = {
    {"n_train", KILN_TYPE_INT, 0, KILN_V_INT(4), "training batches per epoch"},
    {"n_val", KILN_TYPE_INT, 0, KILN_V_INT(2), "validation batches"},
    {"n_test", KILN_TYPE_INT, 0, KILN_V_INT(2), "test batches"},
    {"batch_size", KILN_TYPE_INT, 0, KILN_V_INT(2), "rows per batch"},
    {"features", KILN_TYPE_INT, 0, KILN_V_INT(3), "inputs per row"},
    {"last_partial", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "last batch one row short"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc td_desc = {sizeof(kiln_plugin_desc), KILN_KIND_DATA, "toydata", "1.0.0",
                                         "synthetic batches for trainer tests", 0, NULL, td_params, &td_ops, NULL};
KILN_DEFINE_LIBRARY("toydata", "1.0.0", 1, &td_desc)
