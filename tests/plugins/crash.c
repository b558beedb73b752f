/* tests/plugins/crash.c — crashes in its constructor, inside dlopen, before
 * any check can run: `kiln plugins check` must survive it (child process). */
#include <signal.h>
#include "common.h"
/* SIGABRT rather than SIGSEGV: sanitizer builds trap SEGV and exit instead. */
__attribute__((constructor)) static void boom(void) { raise(SIGABRT); }
KILN_DEFINE_LIBRARY("crash", "1.0.0", 0, &(const kiln_plugin_desc){sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK,
                                                                     "crash", "1.0.0", "x", 0, NULL, NULL, &fx_ops,
                                                                     NULL})
