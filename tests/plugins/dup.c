/* tests/plugins/dup.c — built twice (DUP_LIB = "dupa" / "dupb") so two files
 * claim optimizer "dupopt"; the registry must name both. */
#include "common.h"
static const kiln_plugin_desc opt = {sizeof(kiln_plugin_desc), KILN_KIND_OPTIMIZER, "dupopt", "1.0.0", DUP_LIB,
                                     0, NULL, NULL, &fx_ops, NULL};
KILN_DEFINE_LIBRARY(DUP_LIB, "1.0.0", 0, &opt)
