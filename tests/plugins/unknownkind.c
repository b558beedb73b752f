/* tests/plugins/unknownkind.c — one descriptor of a kind from the future
 * (skipped with an informational line) next to a normal one (kept). */
#include "common.h"
static const kiln_plugin_desc future = {sizeof(kiln_plugin_desc), 42, "fromthefuture", "9.0.0", "kind 42", 0,
                                        NULL, NULL, &fx_ops, NULL};
static const kiln_plugin_desc cb = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "presentday", "1.0.0", "ok", 0,
                                    NULL, NULL, &fx_ops, NULL};
KILN_DEFINE_LIBRARY("unknownkind", "1.0.0", 0, &future, &cb)
