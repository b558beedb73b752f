/*
 * tests/plugins/weightdump.c — a test-only callback that writes every
 * parameter (name, element count, raw master values: fp32, or fp64) to `path` at
 * on_fit_end, through the params() service any plugin may call. The
 * determinism test runs the same job twice and compares the two files byte
 * for byte.
 */
#include <stdio.h>
#include <stdlib.h>

#include "common_train.h"
#include "fixture_head.h"

struct wd { fixture_path fp; }; /* fixture_create_path fills it in */

static int32_t wd_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    return fixture_create_path(sizeof(struct wd), ctx, svc, h, cfg, "weights.bin", out);
}

static void wd_destroy(kiln_instance *i) { free(i); }

static int32_t wd_event(kiln_instance *i, kiln_event *ev) {
    struct wd *w = (struct wd *)i;
    if (ev->id != KILN_EV_ON_FIT_END) return KILN_OK;
    kiln_parameter *const *ps;
    uint32_t n;
    int32_t rc = w->fp.hd.svc->params(w->fp.hd.h, &ps, &n);
    if (rc) return rc;
    FILE *f = fopen(w->fp.path, "wb");
    if (!f) return kiln_errorf(w->fp.hd.svc, w->fp.hd.h, KILN_E_IO, "%s: cannot write", w->fp.path);
    for (uint32_t k = 0; k < n; k++) {
        fprintf(f, "%s %lld\n", ps[k]->name, (long long)ps[k]->numel);
        fwrite(ps[k]->data, kiln_dtype_size(kiln_param_dtype(ps[k])), (size_t)ps[k]->numel, f);
    }
    return fclose(f) == 0 ? KILN_OK : KILN_E_IO;
}

static const kiln_callback_ops wd_ops = {{sizeof(kiln_callback_ops), 0, wd_create, wd_destroy, NULL, NULL}, wd_event};
static const kiln_param wd_params[] = {{"path", KILN_TYPE_STRING, 0, KILN_V_STR("weights.bin"), "output file"},
                                       {NULL, 0, 0, KILN_V_NONE, NULL}};
FIXTURE_LIBRARY(wd_desc, KILN_KIND_CALLBACK, "weightdump", "dumps parameters at fit end", wd_params, &wd_ops, 1)
