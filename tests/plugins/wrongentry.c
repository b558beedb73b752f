/* tests/plugins/wrongentry.c — libraries with the wrong entry point, built
 * without kiln_add_plugin's link-time check (NO_ENTRY_CHECK): WRONG_ENTRY 2
 * exports kiln_plugin_init_v2 (a plugin of another ABI major), WRONG_ENTRY 1
 * a misspelt kiln_plugin_init_vl. The loader must say which. */
#include "kiln/kiln.h"
#if WRONG_ENTRY == 2
KILN_EXPORT int32_t kiln_plugin_init_v2(const void *host, const void **out);
int32_t kiln_plugin_init_v2(const void *host, const void **out) {
    (void)host;
    (void)out;
    return KILN_E_VERSION;
}
#else
KILN_EXPORT int32_t kiln_plugin_init_vl(const kiln_host_base *host, const kiln_library **out);
int32_t kiln_plugin_init_vl(const kiln_host_base *host, const kiln_library **out) {
    (void)host;
    (void)out;
    return KILN_E_VERSION;
}
#endif
