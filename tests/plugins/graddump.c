/*
 * tests/plugins/graddump.c — a test-only callback that records what a
 * comparison against another framework needs: every parameter's value and
 * gradient at the first optimizer step (at on_before_optimizer_step, so the
 * values are those the forward used and the gradients are unscaled and not
 * yet clipped), and the loss of every step (on_before_backward; divided back
 * by the loss scale, which is 1 without a scaler). At on_fit_end it writes
 * one safetensors file: tensors "param.<name>" and "grad.<name>" (F32, or F64
 * with float64 masters) and the metadata key "losses", the losses in step
 * order as %.17g separated by commas. tests/gpt_torch reads it with numpy.
 */
#define _POSIX_C_SOURCE 200809L /* open_memstream, strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common_train.h"
#include "fixture_head.h"

#define GD_MAX_LOSSES 4096

struct gd {
    fixture_path fp; /* first: fixture_create_path fills it in */
    int captured;
    uint32_t n;
    char **names;
    uint32_t *dtype;
    int64_t (*shape)[KILN_MAX_DIMS];
    uint32_t *ndim;
    size_t *bytes;
    void **param, **grad;  /* (n) host copies of data and grad */
    double losses[GD_MAX_LOSSES];
    int nloss;
};

static int32_t gd_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    return fixture_create_path(sizeof(struct gd), ctx, svc, h, cfg, "grads.safetensors", out);
}

static void gd_destroy(kiln_instance *i) {
    struct gd *g = (struct gd *)i;
    for (uint32_t k = 0; k < g->n; k++) free(g->names[k]), free(g->param[k]), free(g->grad[k]);
    free(g->names), free(g->dtype), free(g->shape), free(g->ndim), free(g->bytes), free(g->param), free(g->grad);
    free(g);
}

static int32_t gd_capture(struct gd *g) {
    kiln_parameter *const *ps;
    uint32_t n;
    int32_t rc = g->fp.hd.svc->params(g->fp.hd.h, &ps, &n);
    if (rc) return rc;
    const kiln_kernels *k = NULL;
    kiln_instance *acc = NULL;
    if ((rc = g->fp.hd.svc->accelerator(g->fp.hd.h, &acc, &k))) return rc;
    g->n = n;
    g->names = calloc(n, sizeof *g->names);
    g->dtype = calloc(n, sizeof *g->dtype);
    g->shape = calloc(n, sizeof *g->shape);
    g->ndim = calloc(n, sizeof *g->ndim);
    g->bytes = calloc(n, sizeof *g->bytes);
    g->param = calloc(n, sizeof *g->param);
    g->grad = calloc(n, sizeof *g->grad);
    if (!g->names || !g->dtype || !g->shape || !g->ndim || !g->bytes || !g->param || !g->grad) return KILN_E_NOMEM;
    for (uint32_t i = 0; i < n; i++) {
        const kiln_parameter *p = ps[i];
        g->names[i] = strdup(p->name);
        g->dtype[i] = kiln_param_dtype(p);
        g->ndim[i] = p->ndim;
        memcpy(g->shape[i], p->shape, sizeof g->shape[i]);
        g->bytes[i] = (size_t)p->numel * kiln_dtype_size(g->dtype[i]);
        g->param[i] = malloc(g->bytes[i] ? g->bytes[i] : 1);
        g->grad[i] = malloc(g->bytes[i] ? g->bytes[i] : 1);
        if (!g->names[i] || !g->param[i] || !g->grad[i]) return KILN_E_NOMEM;
        if ((rc = k->copy(acc, g->param[i], p->data, g->bytes[i], KILN_COPY_D2H))) return rc;
        if ((rc = k->copy(acc, g->grad[i], p->grad, g->bytes[i], KILN_COPY_D2H))) return rc;
    }
    g->captured = 1;
    return KILN_OK;
}

/* One header entry: "name":{"dtype":..,"shape":[..],"data_offsets":[a,b]} */
static void gd_entry(FILE *f, int first, const char *prefix, const char *name, uint32_t dt, uint32_t ndim,
                     const int64_t *shape, size_t a, size_t b) {
    fprintf(f, "%s\"%s%s\":{\"dtype\":\"%s\",\"shape\":[", first ? "" : ",", prefix, name,
            dt == KILN_DTYPE_F64 ? "F64" : "F32");
    for (uint32_t d = 0; d < ndim; d++) fprintf(f, "%s%lld", d ? "," : "", (long long)shape[d]);
    fprintf(f, "],\"data_offsets\":[%zu,%zu]}", a, b);
}

static int32_t gd_write(struct gd *g) {
    /* the JSON header goes through a memory stream first: its length leads
     * the file */
    char *hdr = NULL;
    size_t hlen = 0;
    FILE *m = open_memstream(&hdr, &hlen);
    if (!m) return KILN_E_NOMEM;
    fprintf(m, "{\"__metadata__\":{\"losses\":\"");
    for (int i = 0; i < g->nloss; i++) fprintf(m, "%s%.17g", i ? "," : "", g->losses[i]);
    fprintf(m, "\"}");
    size_t off = 0;
    for (uint32_t i = 0; i < g->n; i++) {
        gd_entry(m, 0, "param.", g->names[i], g->dtype[i], g->ndim[i], g->shape[i], off, off + g->bytes[i]);
        off += g->bytes[i];
        gd_entry(m, 0, "grad.", g->names[i], g->dtype[i], g->ndim[i], g->shape[i], off, off + g->bytes[i]);
        off += g->bytes[i];
    }
    fprintf(m, "}");
    fclose(m);
    FILE *f = fopen(g->fp.path, "wb");
    if (!f) {
        free(hdr);
        return kiln_errorf(g->fp.hd.svc, g->fp.hd.h, KILN_E_IO, "graddump: cannot write %s", g->fp.path);
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, hlen, f);
    free(hdr);
    for (uint32_t i = 0; i < g->n; i++) {
        fwrite(g->param[i], 1, g->bytes[i], f);
        fwrite(g->grad[i], 1, g->bytes[i], f);
    }
    return fclose(f) == 0 ? KILN_OK : KILN_E_IO;
}

static int32_t gd_event(kiln_instance *i, kiln_event *ev) {
    struct gd *g = (struct gd *)i;
    if (ev->stage == KILN_STAGE_SANITY) return KILN_OK;
    switch (ev->id) {
    case KILN_EV_ON_BEFORE_BACKWARD: {
        /* ev->loss is the scaled loss; the trainer state has no scale, and
         * the comparison runs without a scaler */
        if (g->nloss < GD_MAX_LOSSES) g->losses[g->nloss++] = ev->loss;
        return KILN_OK;
    }
    case KILN_EV_ON_BEFORE_OPTIMIZER_STEP:
        return g->captured ? KILN_OK : gd_capture(g);
    case KILN_EV_ON_FIT_END:
        return g->captured ? gd_write(g) : kiln_errorf(g->fp.hd.svc, g->fp.hd.h, KILN_E_STATE, "graddump: no optimizer step ran");
    default:
        return KILN_OK;
    }
}

static const kiln_callback_ops gd_ops = {{sizeof(kiln_callback_ops), 0, gd_create, gd_destroy, NULL, NULL}, gd_event};
static const kiln_param gd_params[] = {{"path", KILN_TYPE_STRING, 0, KILN_V_STR("grads.safetensors"), "output file"},
                                       {NULL, 0, 0, KILN_V_NONE, NULL}};
FIXTURE_LIBRARY(gd_desc, KILN_KIND_CALLBACK, "graddump",
                "records first-step weights and gradients and every loss", gd_params, &gd_ops, 1)
