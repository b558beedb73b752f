/*
 * tests/plugins/logitdump.c — a test-only callback that reads a language
 * model's logits through the host's predict service (ABI 1.4) at
 * on_fit_end: for each prefix tokens[0..t] of its `tokens` list it asks for
 * the logits of the last position, and writes the rows, one per position,
 * as one F32 tensor "logits" (n, vocab) in a safetensors file at `path`.
 * The Hugging Face check compares them with GPT2LMHeadModel's logits for the
 * same tokens, which also exercises predict_step and svc->predict in the
 * real host.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common_train.h"

struct ld {
    const kiln_host_services *svc;
    kiln_host_ctx *h;
    char path[1024];
    int32_t tokens[256];
    int64_t n;
};

static int32_t ld_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)ctx;
    struct ld *l = calloc(1, sizeof *l);
    if (!l) return KILN_E_NOMEM;
    l->svc = svc;
    l->h = h;
    snprintf(l->path, sizeof l->path, "%s", kiln_kv_str(cfg, "path", "logits.safetensors"));
    const kiln_value *t = kiln_kv_find(cfg, "tokens");
    for (uint32_t i = 0; t && t->type == KILN_TYPE_INT_LIST && i < t->count && i < 256; i++)
        l->tokens[l->n++] = (int32_t)t->v.il[i];
    *out = (kiln_instance *)l;
    return KILN_OK;
}

static void ld_destroy(kiln_instance *i) { free(i); }

static int32_t ld_event(kiln_instance *i, kiln_event *ev) {
    struct ld *l = (struct ld *)i;
    if (ev->id != KILN_EV_ON_FIT_END || l->n == 0) return KILN_OK;
    float *rows = NULL;
    int64_t V = 0;
    int32_t rc = KILN_OK;
    for (int64_t t = 1; t <= l->n && rc == KILN_OK; t++) {
        kiln_tensor in = {l->tokens, KILN_DTYPE_I32, 2, {1, t, 1, 1}};
        kiln_batch b = {sizeof b, 1, &in, 1};
        kiln_tensor out;
        if ((rc = l->svc->predict(l->h, &b, &out)) != KILN_OK) break;
        if (!rows) {
            V = out.shape[out.ndim - 1];
            rows = malloc((size_t)(l->n * V) * sizeof *rows);
            if (!rows) return KILN_E_NOMEM;
        }
        memcpy(rows + (t - 1) * V, out.data, (size_t)V * sizeof *rows);
    }
    if (rc != KILN_OK) {
        free(rows);
        return rc;
    }
    char hdr[256];
    int hl = snprintf(hdr, sizeof hdr, "{\"logits\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[0,%lld]}}",
                      (long long)l->n, (long long)V, (long long)(l->n * V * 4));
    FILE *f = fopen(l->path, "wb");
    if (!f) {
        free(rows);
        return kiln_errorf(l->svc, l->h, KILN_E_IO, "logitdump: cannot write %s", l->path);
    }
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, (size_t)hl, f);
    fwrite(rows, sizeof *rows, (size_t)(l->n * V), f);
    free(rows);
    return fclose(f) == 0 ? KILN_OK : KILN_E_IO;
}

static const kiln_callback_ops ld_ops = {{sizeof(kiln_callback_ops), 0, ld_create, ld_destroy, NULL, NULL}, ld_event};
static const int64_t ld_no_tokens[] = {0};
static const kiln_param ld_params[] = {
    {"path", KILN_TYPE_STRING, 0, KILN_V_STR("logits.safetensors"), "output file"},
    {"tokens", KILN_TYPE_INT_LIST, 0, KILN_V_INTS(ld_no_tokens), "the token sequence (at most 256)"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc ld_desc = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "logitdump", "1.0.0",
                                         "writes a language model's logits through svc->predict at fit end", 0, NULL,
                                         ld_params, &ld_ops, NULL};
KILN_DEFINE_LIBRARY("logitdump", "1.0.0", 4, &ld_desc)
