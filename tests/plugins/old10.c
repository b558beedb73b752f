/* tests/plugins/old10.c — built against the frozen ABI 1.0 headers in
 * tests/abi-1.0/include, never the current ones: it must keep loading after
 * every later minor. */
#include "common.h"

static const char *const aliases[] = {"legacy"};
static const kiln_kv props[] = {{"aliases", KILN_V_STRS(aliases)}, {NULL, KILN_V_NONE}};
static const kiln_param params[] = {{"lr", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.1), "learning rate"},
                                    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc opt = {sizeof(kiln_plugin_desc), KILN_KIND_OPTIMIZER, "oldopt", "1.0.0",
                                     "built against ABI 1.0", 0, props, params, &fx_ops, NULL};

#if KILN_ABI_MAJOR != 1 || KILN_ABI_MINOR != 0
#error "old10.c must be built against the frozen 1.0 headers"
#endif
KILN_DEFINE_LIBRARY("old10", "1.0.0", 0, &opt)
