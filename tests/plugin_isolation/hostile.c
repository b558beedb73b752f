/* tests/plugin_isolation/hostile.c — one source, five plugin libraries (a
 * callback each, named HOSTILE_NAME): one that segfaults in a constructor,
 * inside dlopen (ctorsegv); one that segfaults in kiln_plugin_init_v1
 * (initsegv); one that calls exit(0) there (initexit); one that never
 * returns from it (initloop); and a well-behaved one (goodcb). kiln must
 * survive all of them on its search path: discovery probes each file in a
 * child process, so only a run that names one of them fails, in one line
 * naming the file. The real entry point is KILN_DEFINE_LIBRARY's, renamed
 * so the hostile one can run first. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "../plugins/common.h"

/* a store through a pointer the compiler cannot see is NULL: a real SIGSEGV
 * (a constant NULL would be turned into a trap instruction) */
__attribute__((unused)) static void segv(void) {
    volatile int *volatile p = NULL;
    *p = 1;
}

#if defined(HOSTILE_ctorsegv)
__attribute__((constructor)) static void boom(void) { segv(); }
#endif

#define kiln_plugin_init_v1 hostile_real_init
static const kiln_plugin_desc cb = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, HOSTILE_NAME, "1.0.0",
                                    "plugin isolation fixture", 0, NULL, NULL, &fx_ops, NULL};
KILN_DEFINE_LIBRARY(HOSTILE_NAME, "1.0.0", 0, &cb)
#undef kiln_plugin_init_v1

KILN_EXPORT int32_t kiln_plugin_init_v1(const kiln_host_base *host, const kiln_library **out) {
#if defined(HOSTILE_initsegv)
    segv();
#elif defined(HOSTILE_initexit)
    exit(0);
#elif defined(HOSTILE_initloop)
    for (;;) sleep(1);
#endif
    return hostile_real_init(host, out);
}
