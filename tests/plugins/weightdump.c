/*
 * tests/plugins/weightdump.c — a test-only callback that writes every
 * parameter (name, element count, raw master values: fp32, or fp64) to `path` at
 * on_fit_end, through the params() service any plugin may call. The
 * determinism test runs the same job twice and compares the two files byte
 * for byte. On an accelerator whose memory is not host memory (cuda) the
 * values are read back through its kernel table's copy().
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
    const kiln_host_services *svc = w->fp.hd.svc;
    if (ev->id != KILN_EV_ON_FIT_END) return KILN_OK;
    kiln_parameter *const *ps;
    uint32_t n;
    int32_t rc = svc->params(w->fp.hd.h, &ps, &n);
    if (rc) return rc;
    /* device memory: the host cannot read it directly */
    kiln_instance *acc = NULL;
    const kiln_kernels *kt = NULL;
    if (svc->abi_minor >= 1 && svc->accelerator && svc->accelerator(w->fp.hd.h, &acc, &kt) == KILN_OK && kt &&
        ((kt->flags & KILN_KERNELS_HOST_MEMORY) || !kt->copy))
        kt = NULL;
    FILE *f = fopen(w->fp.path, "wb");
    if (!f) return kiln_errorf(svc, w->fp.hd.h, KILN_E_IO, "%s: cannot write", w->fp.path);
    for (uint32_t k = 0; k < n && rc == KILN_OK; k++) {
        const size_t bytes = kiln_dtype_size(kiln_param_dtype(ps[k])) * (size_t)ps[k]->numel;
        fprintf(f, "%s %lld\n", ps[k]->name, (long long)ps[k]->numel);
        if (!kt) {
            fwrite(ps[k]->data, 1, bytes, f);
            continue;
        }
        void *buf = malloc(bytes ? bytes : 1); /* (numel) */
        if (!buf) rc = KILN_E_NOMEM;
        else if ((rc = kt->copy(acc, buf, ps[k]->data, bytes, KILN_COPY_D2H)) == KILN_OK) fwrite(buf, 1, bytes, f);
        free(buf);
    }
    if (fclose(f) != 0 && rc == KILN_OK) rc = KILN_E_IO;
    return rc;
}

static const kiln_callback_ops wd_ops = {{sizeof(kiln_callback_ops), 0, wd_create, wd_destroy, NULL, NULL}, wd_event};
static const kiln_param wd_params[] = {{"path", KILN_TYPE_STRING, 0, KILN_V_STR("weights.bin"), "output file"},
                                       {NULL, 0, 0, KILN_V_NONE, NULL}};
FIXTURE_LIBRARY(wd_desc, KILN_KIND_CALLBACK, "weightdump", "dumps parameters at fit end", wd_params, &wd_ops, 1)
