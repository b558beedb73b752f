/* tests/plugins/badprop.c — a precision plugin whose `precision` property is
 * an int instead of a string: that descriptor is refused, the rest kept. */
#include "common.h"
static const kiln_kv props[] = {{"precision", KILN_V_INT(16)}, {NULL, KILN_V_NONE}};
static const kiln_plugin_desc bad = {sizeof(kiln_plugin_desc), KILN_KIND_PRECISION, "badprec", "1.0.0", "bad", 0,
                                     props, NULL, &fx_ops, NULL};
static const kiln_plugin_desc ok = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "goodcb", "1.0.0", "ok", 0,
                                    NULL, NULL, &fx_ops, NULL};
KILN_DEFINE_LIBRARY("badprop", "1.0.0", 0, &bad, &ok)
