/*
 * tests/plugins/ampprobe.c — a test-only callback that records what mixed
 * precision must show the hooks: the loss handed to on_before_backward, the
 * gradients' sum of squares at on_after_backward and at
 * on_before_optimizer_step, and at each on_train_batch_end the step's loss,
 * global_step, the sum of all master weights (to see skipped updates) and
 * the logged loss scale. One line per event in `path`:
 *   ws <weight_sum> (at on_train_start)
 *   bb <batch> <loss>          ab <batch> <sumsq>        bos <batch> <sumsq>
 *   be <batch> <loss> <global_step> <weight_sum> <amp_scale or nan>
 * With dump = 1 also every value: "bsw"/"bew" <batch> weights at batch
 * start/end, "bosg" <batch> gradients at on_before_optimizer_step; and
 * "lr <batch> <rate>" from the 1.2 trainer state at each batch start.
 * Works with fp32 and fp64 masters.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common_train.h"

struct ap { const kiln_host_services *svc; kiln_host_ctx *h; FILE *f; int dump; };

static int32_t ap_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)ctx;
    struct ap *a = calloc(1, sizeof *a);
    if (!a) return KILN_E_NOMEM;
    a->svc = svc;
    a->h = h;
    const char *path = kiln_kv_str(cfg, "path", "amp.txt");
    a->dump = (int)kiln_kv_int(cfg, "dump", 0);
    a->f = fopen(path, "w");
    if (!a->f) {
        free(a);
        return kiln_errorf(svc, h, KILN_E_IO, "%s: cannot write", path);
    }
    *out = (kiln_instance *)a;
    return KILN_OK;
}

static void ap_destroy(kiln_instance *i) {
    struct ap *a = (struct ap *)i;
    if (a->f) fclose(a->f);
    free(a);
}

/* sum of x (or of x^2) over every parameter's data (or grad), in double */
static double ap_sum(struct ap *a, int grad, int squares) {
    kiln_parameter *const *ps;
    uint32_t n;
    if (a->svc->params(a->h, &ps, &n) != KILN_OK) return NAN;
    double s = 0;
    for (uint32_t k = 0; k < n; k++) {
        const void *v = grad ? (const void *)ps[k]->grad : (const void *)ps[k]->data;
        int f64 = kiln_param_dtype(ps[k]) == KILN_DTYPE_F64;
        for (int64_t j = 0; j < ps[k]->numel; j++) {
            double x = f64 ? ((const double *)v)[j] : (double)((const float *)v)[j];
            s += squares ? x * x : x;
        }
    }
    return s;
}

/* every value of every parameter's grad (or data), for small models */
static void ap_dump(struct ap *a, const char *tag, int64_t batch, int grad) {
    kiln_parameter *const *ps;
    uint32_t n;
    if (a->svc->params(a->h, &ps, &n) != KILN_OK) return;
    fprintf(a->f, "%s %lld", tag, (long long)batch);
    for (uint32_t k = 0; k < n; k++) {
        const void *v = grad ? (const void *)ps[k]->grad : (const void *)ps[k]->data;
        int f64 = kiln_param_dtype(ps[k]) == KILN_DTYPE_F64;
        for (int64_t j = 0; j < ps[k]->numel; j++)
            fprintf(a->f, " %.17g", f64 ? ((const double *)v)[j] : (double)((const float *)v)[j]);
    }
    fprintf(a->f, "\n");
}

static int32_t ap_event(kiln_instance *i, kiln_event *ev) {
    struct ap *a = (struct ap *)i;
    switch (ev->id) {
    case KILN_EV_ON_TRAIN_START: fprintf(a->f, "ws %.17g\n", ap_sum(a, 0, 0)); break;
    case KILN_EV_ON_BEFORE_BACKWARD: fprintf(a->f, "bb %lld %.17g\n", (long long)ev->batch_idx, ev->loss); break;
    case KILN_EV_ON_AFTER_BACKWARD: fprintf(a->f, "ab %lld %.17g\n", (long long)ev->batch_idx, ap_sum(a, 1, 1)); break;
    case KILN_EV_ON_BEFORE_OPTIMIZER_STEP:
        fprintf(a->f, "bos %lld %.17g\n", (long long)ev->batch_idx, ap_sum(a, 1, 1));
        if (a->dump) ap_dump(a, "bosg", ev->batch_idx, 1);
        break;
    case KILN_EV_ON_TRAIN_BATCH_START:
        if (a->dump) ap_dump(a, "bsw", ev->batch_idx, 0);
        if (ev->trainer->struct_size >= KILN_TRAINER_STATE_SIZE_1_2 && ev->trainer->lr)
            fprintf(a->f, "lr %lld %.17g\n", (long long)ev->batch_idx, ev->trainer->lr[0]);
        break;
    case KILN_EV_ON_TRAIN_BATCH_END: {
        if (a->dump) ap_dump(a, "bew", ev->batch_idx, 0);
        double scale = NAN;
        if (a->svc->get_metric) a->svc->get_metric(a->h, "amp_scale", &scale);
        fprintf(a->f, "be %lld %.17g %lld %.17g %.17g\n", (long long)ev->batch_idx,
                ev->outputs ? ev->outputs->loss : NAN, (long long)ev->trainer->global_step, ap_sum(a, 0, 0), scale);
        break;
    }
    default: break;
    }
    return KILN_OK;
}

static const kiln_callback_ops ap_ops = {{sizeof(kiln_callback_ops), 0, ap_create, ap_destroy, NULL, NULL}, ap_event};
static const kiln_param ap_params[] = {{"path", KILN_TYPE_STRING, 0, KILN_V_STR("amp.txt"), "output file"},
                                       {"dump", KILN_TYPE_INT, 0, KILN_V_INT(0), "1: every value (small models)"},
                                       {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc ap_desc = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "ampprobe", "1.0.0",
                                         "records loss/gradients/weights around backward", 0, NULL, ap_params,
                                         &ap_ops, NULL};
KILN_DEFINE_LIBRARY("ampprobe", "1.0.0", 1, &ap_desc)
