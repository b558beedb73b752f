/* tests/plugins/nosym.c — a shared object named like a plugin that exports
 * no kiln_plugin_init_v1. */
#include "kiln/kiln.h"
KILN_EXPORT int not_a_kiln_entry(void);
int not_a_kiln_entry(void) { return 42; }
