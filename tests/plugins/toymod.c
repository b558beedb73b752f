/*
 * tests/plugins/toymod.c — a tiny module for the trainer tests: a linear
 * classifier (features → 2 classes) written in plain C, with LightningModule
 * hooks that tests steer from the run file: return -1 from
 * on_train_batch_start at a given (epoch, batch), request a stop at the end
 * of a given epoch or of a batch of the first, or return no loss from a given batch; log a metric of
 * its own in on_train_epoch_end (1 + epoch: it gets worse every epoch) for
 * the monitoring callbacks; report (as a warning line) the should_stop it
 * sees in on_validation_end; fail training_step at a batch with a given
 * code. Otherwise it records nothing itself; tests read
 * hook_trace's file.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common_train.h"
#include "fixture_head.h"

struct toy_mod {
    fixture_head hd; /* first: fixture_new fills it in */
    kiln_parameter *w, *b; /* w: (2, F), b: (2) */
    int64_t features;
    int64_t m1_epoch, m1_batch, stop_epoch, stop_batch, noloss_batch, epoch_metric, report_stop, fail_batch, fail_code;
    float *x;      /* (B, F) last inputs  */
    float *dlog;   /* (B, 2) softmax - onehot of the last step, / B */
    int64_t rows;
    double loss;
};

static int32_t tm_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    struct toy_mod *m = fixture_new(sizeof *m, ctx, svc, h);
    if (!m) return KILN_E_NOMEM;
    m->features = kiln_kv_int(cfg, "features", 3);
    m->m1_epoch = kiln_kv_int(cfg, "minus_one_epoch", -1);
    m->m1_batch = kiln_kv_int(cfg, "minus_one_batch", -1);
    m->stop_epoch = kiln_kv_int(cfg, "stop_at_epoch", -1);
    m->stop_batch = kiln_kv_int(cfg, "stop_at_batch", -1);
    m->noloss_batch = kiln_kv_int(cfg, "no_loss_batch", -1);
    m->epoch_metric = kiln_kv_int(cfg, "epoch_metric", 0);
    m->report_stop = kiln_kv_int(cfg, "report_should_stop", 0);
    m->fail_batch = kiln_kv_int(cfg, "fail_at_batch", -1);
    m->fail_code = kiln_kv_int(cfg, "fail_code", KILN_E_DATA);
    int64_t ws[2] = {2, m->features}, bs[1] = {2};
    int32_t rc = svc->param_register(h, "linear.weight", 2, ws, 0, &m->w);
    if (rc == KILN_OK) rc = svc->param_register(h, "linear.bias", 1, bs, KILN_PARAMF_NO_DECAY, &m->b);
    if (rc != KILN_OK) { free(m); return rc; }
    m->x = calloc(1024 * (size_t)m->features, sizeof(float));
    m->dlog = calloc(1024 * 2, sizeof(float));
    *out = (kiln_instance *)m;
    return KILN_OK;
}

static void tm_destroy(kiln_instance *i) {
    struct toy_mod *m = (struct toy_mod *)i;
    free(m->x);
    free(m->dlog);
    free(m);
}

static int32_t tm_init(kiln_instance *i, uint64_t seed) {
    struct toy_mod *m = (struct toy_mod *)i;
    uint64_t s = seed | 1;
    for (int64_t k = 0; k < m->w->numel; k++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        m->w->data[k] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    memset(m->b->data, 0, sizeof(float) * 2);
    return KILN_OK;
}

static int32_t forward(struct toy_mod *m, const kiln_batch *b, double *loss, double *acc) {
    const float *x = b->tensors[0].data;
    const int32_t *y = b->tensors[1].data;
    int64_t B = b->size, F = m->features;
    if (B > 1024 || b->tensors[0].shape[1] != F)
        return kiln_errorf(m->hd.svc, m->hd.h, KILN_E_DATA, "toymod: batch of %lld x %lld, expected <= 1024 x %lld",
                           (long long)B, (long long)b->tensors[0].shape[1], (long long)F);
    const float *W = m->w->compute, *bias = m->b->data;
    double L = 0;
    int correct = 0;
    for (int64_t r = 0; r < B; r++) {
        double z[2];
        for (int c = 0; c < 2; c++) {
            z[c] = bias[c];
            for (int64_t f = 0; f < F; f++) z[c] += (double)W[c * F + f] * x[r * F + f];
        }
        double mx = z[0] > z[1] ? z[0] : z[1];
        double e0 = exp(z[0] - mx), e1 = exp(z[1] - mx), s = e0 + e1;
        double p[2] = {e0 / s, e1 / s};
        L -= log(p[y[r]]);
        correct += (z[1] > z[0]) == (y[r] == 1);
        for (int c = 0; c < 2; c++) m->dlog[r * 2 + c] = (float)((p[c] - (c == y[r])) / (double)B);
    }
    memcpy(m->x, x, sizeof(float) * (size_t)(B * F));
    m->rows = B;
    *loss = L / (double)B;
    *acc = (double)correct / (double)B;
    return KILN_OK;
}

static int32_t tm_train(kiln_instance *i, const kiln_batch *b, int64_t idx, kiln_step_output *out) {
    struct toy_mod *m = (struct toy_mod *)i;
    if (idx == m->fail_batch) {
        if (m->fail_code < 0) return kiln_errorf(m->hd.svc, m->hd.h, (int32_t)m->fail_code, "toymod: failing at batch %lld",
                                                 (long long)idx);
        return (int32_t)m->fail_code; /* a positive "status", which is none */
    }
    double loss, acc;
    int32_t rc = forward(m, b, &loss, &acc);
    if (rc) return rc;
    m->loss = loss;
    out->has_loss = idx != m->noloss_batch;
    out->loss = loss;
    out->batch_size = b->size;
    m->hd.svc->log_value(m->hd.h, "train_loss", loss, KILN_LOG_ON_STEP | KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR,
                      (double)b->size);
    return KILN_OK;
}

static int32_t tm_backward(kiln_instance *i, double dloss) {
    struct toy_mod *m = (struct toy_mod *)i;
    int64_t F = m->features;
    for (int64_t r = 0; r < m->rows; r++)
        for (int c = 0; c < 2; c++) {
            float g = (float)(dloss * m->dlog[r * 2 + c]);
            m->b->grad[c] += g;
            for (int64_t f = 0; f < F; f++) m->w->grad[c * F + f] += g * m->x[r * F + f];
        }
    return KILN_OK;
}

static int32_t tm_eval(struct toy_mod *m, const kiln_batch *b, kiln_step_output *out, const char *prefix) {
    double loss, acc;
    int32_t rc = forward(m, b, &loss, &acc);
    if (rc) return rc;
    out->has_loss = 1;
    out->loss = loss;
    out->batch_size = b->size;
    char n[32];
    strcpy(n, prefix);
    strcat(n, "_loss");
    m->hd.svc->log_value(m->hd.h, n, loss, KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR, (double)b->size);
    strcpy(n, prefix);
    strcat(n, "_acc");
    m->hd.svc->log_value(m->hd.h, n, acc, KILN_LOG_ON_EPOCH, (double)b->size);
    return KILN_OK;
}

static int32_t tm_val(kiln_instance *i, const kiln_batch *b, int64_t idx, kiln_step_output *out) {
    (void)idx;
    return tm_eval((struct toy_mod *)i, b, out, "val");
}

static int32_t tm_test(kiln_instance *i, const kiln_batch *b, int64_t idx, kiln_step_output *out) {
    (void)idx;
    return tm_eval((struct toy_mod *)i, b, out, "test");
}

static int32_t tm_event(kiln_instance *i, kiln_event *ev) {
    struct toy_mod *m = (struct toy_mod *)i;
    if (ev->id == KILN_EV_ON_TRAIN_BATCH_START && ev->trainer->current_epoch == m->m1_epoch &&
        ev->batch_idx == m->m1_batch)
        ev->result = -1;
    /* The closure's cached result: on_train_batch_end sees this step's loss
     * divided by accumulate_grad_batches (docs/semantics.md). */
    if (ev->id == KILN_EV_ON_TRAIN_BATCH_END && ev->outputs && ev->outputs->has_loss) {
        double want = m->loss / (double)ev->trainer->accumulate_grad_batches;
        if (fabs(ev->outputs->loss - want) > 1e-12 * fabs(want))
            return kiln_errorf(m->hd.svc, m->hd.h, KILN_E_STATE,
                               "toymod: on_train_batch_end outputs.loss = %.17g, expected %.17g (the step's loss / %d)",
                               ev->outputs->loss, want, ev->trainer->accumulate_grad_batches);
    }
    if (ev->id == KILN_EV_ON_TRAIN_EPOCH_END && ev->trainer->current_epoch >= m->stop_epoch && m->stop_epoch >= 0)
        m->hd.svc->request_stop(m->hd.h, "toymod stop_at_epoch");
    if (ev->id == KILN_EV_ON_TRAIN_BATCH_END && ev->trainer->current_epoch == 0 && ev->batch_idx == m->stop_batch)
        m->hd.svc->request_stop(m->hd.h, "toymod stop_at_batch");
    if (ev->id == KILN_EV_ON_TRAIN_EPOCH_END && m->epoch_metric)
        m->hd.svc->log_value(m->hd.h, "epoch_metric", 1.0 + (double)ev->trainer->current_epoch, KILN_LOG_ON_EPOCH, 1.0);
    if (ev->id == KILN_EV_ON_VALIDATION_END && m->report_stop)
        kiln_logf(m->hd.svc, m->hd.h, KILN_LOG_WARN, "toymod: on_validation_end in epoch %lld sees should_stop=%d",
                  (long long)ev->trainer->current_epoch, (int)ev->trainer->should_stop);
    return KILN_OK;
}

static const kiln_module_ops tm_ops = {{sizeof(kiln_module_ops), 0, tm_create, tm_destroy, NULL, NULL},
                                       tm_init, tm_train, tm_backward, tm_val, tm_test, tm_event, NULL};
static const kiln_param tm_params[] = {
    {"features", KILN_TYPE_INT, 0, KILN_V_INT(3), "inputs per row"},
    {"minus_one_epoch", KILN_TYPE_INT, 0, KILN_V_INT(-1), "epoch whose on_train_batch_start returns -1"},
    {"minus_one_batch", KILN_TYPE_INT, 0, KILN_V_INT(-1), "batch whose on_train_batch_start returns -1"},
    {"stop_at_epoch", KILN_TYPE_INT, 0, KILN_V_INT(-1), "request a stop at the end of this epoch"},
    {"stop_at_batch", KILN_TYPE_INT, 0, KILN_V_INT(-1), "request a stop at the end of this batch of epoch 0"},
    {"no_loss_batch", KILN_TYPE_INT, 0, KILN_V_INT(-1), "training_step returns no loss for this batch"},
    {"fail_at_batch", KILN_TYPE_INT, 0, KILN_V_INT(-1), "training_step fails at this batch (every epoch)"},
    {"fail_code", KILN_TYPE_INT, 0, KILN_V_INT(KILN_E_DATA), "what it returns then (a positive value tests misuse)"},
    {"epoch_metric", KILN_TYPE_INT, 0, KILN_V_INT(0), "1: log epoch_metric = 1 + epoch in on_train_epoch_end"},
    {"report_should_stop", KILN_TYPE_INT, 0, KILN_V_INT(0), "1: warn the should_stop seen in on_validation_end"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
FIXTURE_LIBRARY(tm_desc, KILN_KIND_MODULE, "toymod", "linear classifier with steerable hooks", tm_params, &tm_ops, 1)
