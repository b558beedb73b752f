/*
 * tests/plugins/common.h — shared bits of the test-only plugins: a trivial
 * instance type and create/destroy that every fixture's ops table can use.
 * The fixtures exist to drive the loader's refusal and acceptance paths.
 */
#ifndef KILN_TEST_PLUGINS_COMMON_H
#define KILN_TEST_PLUGINS_COMMON_H

#include <stdlib.h>

#include "kiln/kiln.h"

struct kiln_instance { int dummy; };

static int32_t fx_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)ctx; (void)svc; (void)h; (void)cfg;
    *out = calloc(1, sizeof **out);
    return *out ? KILN_OK : KILN_E_NOMEM;
}
static void fx_destroy(kiln_instance *i) { free(i); }

static const kiln_ops_header fx_ops = {sizeof(kiln_ops_header), 0, fx_create, fx_destroy, NULL, NULL};

#endif
