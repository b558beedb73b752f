/* tests/plugins/rawlib.c — hand-written library descriptors, one variant per
 * build (RAW_VARIANT), for the refusals the macro would never produce:
 *   1 wrong ABI major, 2 short library struct_size, 3 requires a newer host
 *   minor, 4 init fails with a message, 5 short ops table, 6 short plugin
 *   descriptor. */
#include "common.h"

static const kiln_ops_header short_ops = {16, 0, fx_create, fx_destroy, NULL, NULL};
static const kiln_plugin_desc desc = {
    RAW_VARIANT == 6 ? 24 : sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "rawcb", "1.0.0", "raw", 0, NULL, NULL,
    RAW_VARIANT == 5 ? &short_ops : &fx_ops, NULL};
static const kiln_plugin_desc *const plugins[] = {&desc};
static const kiln_library lib = {
    RAW_VARIANT == 2 ? 40 : sizeof(kiln_library),
    RAW_VARIANT == 1 ? 2 : KILN_ABI_MAJOR,
    RAW_VARIANT == 3 ? KILN_ABI_MINOR + 1 : KILN_ABI_MINOR,
    RAW_VARIANT == 3 ? KILN_ABI_MINOR + 1 : 0,
    0, 0, "raw", "1.0.0", "test", 1, 0, plugins, NULL, {NULL, NULL, NULL, NULL}};

KILN_EXPORT int32_t kiln_plugin_init_v1(const kiln_host_base *host, const kiln_library **out) {
    if (RAW_VARIANT == 4) {
        host->get_services(1, 0)->set_error(NULL, KILN_E_UNSUPPORTED, "this test plugin refuses to start");
        return KILN_E_UNSUPPORTED;
    }
    *out = &lib;
    return KILN_OK;
}
