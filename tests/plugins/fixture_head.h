/*
 * tests/plugins/fixture_head.h — the start every test-only plugin instance
 * shares (toymod, killer, graddump, weightdump here; collfix in tests/ddp,
 * bcastfix in tests/ddp_nccl_fake): the host's services and context that
 * create() is handed, kept as the instance's first member, the zeroed
 * allocation that fills them in, and the descriptor and library they end
 * with. Header only and static, so each fixture
 * is still built alone, like a real plugin, from the SDK and this.
 */
#ifndef KILN_TEST_FIXTURE_HEAD_H
#define KILN_TEST_FIXTURE_HEAD_H

#include <stdio.h>
#include <stdlib.h>

#include "kiln/kiln.h"

/* What create() is handed and the hooks call back into. */
typedef struct fixture_head {
    const kiln_host_services *svc;
    kiln_host_ctx *h;
} fixture_head;

/* A zeroed instance of `size` bytes, a struct whose first member is a
 * fixture_head (so the pointer is also one to its head), with the head
 * filled in from create()'s arguments as they come (ctx, the plugin's own
 * context, is unused: the fixtures keep none); NULL when out of memory. */
static inline void *fixture_new(size_t size, void *ctx, const kiln_host_services *svc, kiln_host_ctx *h) {
    (void)ctx;
    fixture_head *hd = calloc(1, size);
    if (hd) {
        hd->svc = svc;
        hd->h = h;
    }
    return hd;
}

/* The string setting `key` (def when absent) into dst[n], cut to fit. */
static inline void fixture_str(char *dst, size_t n, const kiln_kv *cfg, const char *key, const char *def) {
    snprintf(dst, n, "%s", kiln_kv_str(cfg, key, def));
}

/* The whole create() of a fixture whose one setting is a string `path`
 * (def when absent): an instance of `size` bytes that starts with a
 * fixture_path. */
typedef struct fixture_path {
    fixture_head hd;
    char path[1024];
} fixture_path;

static inline int32_t fixture_create_path(size_t size, void *ctx, const kiln_host_services *svc, kiln_host_ctx *h,
                                          const kiln_kv *cfg, const char *def, kiln_instance **out) {
    fixture_path *p = fixture_new(size, ctx, svc, h);
    if (!p) return KILN_E_NOMEM;
    fixture_str(p->path, sizeof p->path, cfg, "path", def);
    *out = (kiln_instance *)p;
    return KILN_OK;
}

/* A fixture library of one plugin: its descriptor `desc` (version 1.0.0, no
 * capabilities or properties, no plugin context) and the library that
 * exports it under the plugin's `name`, for hosts of ABI 1.`min_minor` on. */
#define FIXTURE_LIBRARY(desc, kind, name, help, params, ops, min_minor)                                               \
    static const kiln_plugin_desc desc = {sizeof(kiln_plugin_desc), kind, name, "1.0.0", help, 0, NULL, params, ops, \
                                          NULL};                                                                       \
    KILN_DEFINE_LIBRARY(name, "1.0.0", min_minor, &desc)

#endif
