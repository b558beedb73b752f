/*
 * tests/plugins/old11.c — a training callback built against the frozen ABI
 * 1.1 headers in tests/abi-1.1/include, never the current ones: it must keep
 * receiving events inside every later host. It counts the hooks it sees and
 * writes the counts at on_fit_end.
 */
#include <stdio.h>
#include <stdlib.h>

#include "kiln/kiln.h"

#if KILN_ABI_MAJOR != 1 || KILN_ABI_MINOR != 1
#error "old11.c must be built against the frozen 1.1 headers"
#endif

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *h;
    char path[1024];
    long batch_ends, epoch_ends, backward;
};

static int32_t o_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                        kiln_instance **out) {
    (void)ctx;
    kiln_instance *o = calloc(1, sizeof *o);
    if (!o) return KILN_E_NOMEM;
    o->svc = svc;
    o->h = h;
    snprintf(o->path, sizeof o->path, "%s", kiln_kv_str(cfg, "path", "old11.txt"));
    *out = o;
    return KILN_OK;
}

static void o_destroy(kiln_instance *o) { free(o); }

static int32_t o_event(kiln_instance *o, kiln_event *ev) {
    switch (ev->id) {
    case KILN_EV_ON_TRAIN_BATCH_END: o->batch_ends++; break;
    case KILN_EV_ON_TRAIN_EPOCH_END: o->epoch_ends++; break;
    case KILN_EV_ON_AFTER_BACKWARD: o->backward++; break;
    case KILN_EV_ON_FIT_END: {
        FILE *f = fopen(o->path, "w");
        if (!f) return kiln_errorf(o->svc, o->h, KILN_E_IO, "%s: cannot write", o->path);
        fprintf(f, "batch_ends=%ld epoch_ends=%ld after_backward=%ld step=%lld\n", o->batch_ends, o->epoch_ends,
                o->backward, (long long)ev->trainer->global_step);
        fclose(f);
        break;
    }
    default: break; /* ids unknown to 1.1 are ignored */
    }
    return KILN_OK;
}

static const kiln_callback_ops o_ops = {{sizeof(kiln_callback_ops), 0, o_create, o_destroy, NULL, NULL}, o_event};
static const kiln_param o_params[] = {{"path", KILN_TYPE_STRING, 0, KILN_V_STR("old11.txt"), "output file"},
                                      {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc o_desc = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "old11cb", "1.1.0",
                                        "built against ABI 1.1", 0, NULL, o_params, &o_ops, NULL};
KILN_DEFINE_LIBRARY("old11", "1.1.0", 1, &o_desc)
