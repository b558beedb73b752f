/* tests/plugins/badprop.c — a precision plugin whose `precision` property is
 * an int instead of a string, and callbacks whose 1.5 config_checks do not
 * parse, name an undeclared key, put choices on a float key or reject the
 * key's own default: those descriptors are refused, the rest kept. */
#include "common.h"
static const kiln_kv props[] = {{"precision", KILN_V_INT(16)}, {NULL, KILN_V_NONE}};
static const kiln_plugin_desc bad = {sizeof(kiln_plugin_desc), KILN_KIND_PRECISION, "badprec", "1.0.0", "bad", 0,
                                     props, NULL, &fx_ops, NULL};
static const kiln_plugin_desc ok = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "goodcb", "1.0.0", "ok", 0,
                                    NULL, NULL, &fx_ops, NULL};
static const kiln_param cparams[] = {
    {"lr", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(-1.0), "a float whose default is negative"},
    {"mode", KILN_TYPE_STRING, 0, KILN_V_STR("min"), "a string"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
#define CHECKED(var, name, ...)                                                                                      \
    static const char *const var##_rules[] = {__VA_ARGS__};                                                         \
    static const kiln_kv var##_props[] = {{"config_checks", KILN_V_STRS(var##_rules)}, {NULL, KILN_V_NONE}};        \
    static const kiln_plugin_desc var = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, name, "1.0.0", "checks", 0,    \
                                         var##_props, cparams, &fx_ops, NULL};
CHECKED(chk_parse, "chkparse", "lr ~ 3")
CHECKED(chk_key, "chkkey", "rate > 0")
CHECKED(chk_type, "chktype", "lr in {a, b}")
CHECKED(chk_default, "chkdefault", "lr > 0")
CHECKED(chk_ok, "chkok", "lr in [-1, 1]", "mode in {min, max}")
/* 1.5: KILN_CAP_STATEFUL and the state ops must agree */
static int32_t st_get(kiln_instance *i, uint32_t *v, void **d, size_t *n) {
    (void)i; (void)v; (void)d; (void)n;
    return KILN_E_UNSUPPORTED;
}
static int32_t st_set(kiln_instance *i, uint32_t v, const void *d, size_t n) {
    (void)i; (void)v; (void)d; (void)n;
    return KILN_E_UNSUPPORTED;
}
static const kiln_ops_header st_ops = {sizeof(kiln_ops_header), 0, fx_create, fx_destroy, st_get, st_set};
static const kiln_plugin_desc nocap = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "nocap", "1.0.0", "state, no cap",
                                       0, NULL, NULL, &st_ops, NULL};
static const kiln_plugin_desc capnostate = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "capnostate", "1.0.0",
                                            "cap, no state", KILN_CAP_STATEFUL, NULL, NULL, &fx_ops, NULL};
KILN_DEFINE_LIBRARY("badprop", "1.0.0", 0, &bad, &ok, &chk_parse, &chk_key, &chk_type, &chk_default, &chk_ok, &nocap,
                    &capnostate)
