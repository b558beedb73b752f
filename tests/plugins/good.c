/* tests/plugins/good.c — a well-formed library with three plugins of three
 * kinds, aliases, typed properties and declared config keys. */
#include "common.h"

static const char *const prec_aliases[] = {"t16", "tfp16"};
static const kiln_kv prec_props[] = {
    {"precision", KILN_V_STR("t16-mixed")}, {"amp_backend", KILN_V_STR("native")},
    {"amp_level", KILN_V_STR("O1")},        {"needs_grad_scaler", KILN_V_BOOL(1)},
    {"aliases", KILN_V_STRS(prec_aliases)}, {NULL, KILN_V_NONE}};
static const kiln_param prec_params[] = {
    {"init_scale", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(65536.0), "initial loss scale"},
    {"growth_interval", KILN_TYPE_INT, 0, KILN_V_INT(2000), "steps between scale growth"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc prec = {sizeof(kiln_plugin_desc), KILN_KIND_PRECISION, "t16-mixed", "1.0.0",
                                      "test precision", 0, prec_props, prec_params, &fx_ops, NULL};

static const kiln_param opt_params[] = {
    {"lr", KILN_TYPE_FLOAT, KILN_PARAM_REQUIRED, KILN_V_NONE, "learning rate"},
    {"momentum", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0), "momentum factor"},
    {"nesterov", KILN_TYPE_BOOL, 0, KILN_V_BOOL(0), "Nesterov momentum"},
    {"betas", KILN_TYPE_FLOAT_LIST, 0, KILN_V_NONE, "two betas"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
/* 1.5 rules: a bound, an interval over a list's elements */
static const char *const opt_checks[] = {"lr > 0", "momentum in [0, 1)", "betas in [0, 1)"};
static const kiln_kv opt_props[] = {{"config_checks", KILN_V_STRS(opt_checks)}, {NULL, KILN_V_NONE}};
static const kiln_plugin_desc opt = {sizeof(kiln_plugin_desc), KILN_KIND_OPTIMIZER, "tsgd", "0.3.1",
                                     "test optimizer", 0, opt_props, opt_params, &fx_ops, NULL};

static const int64_t def_layers[] = {4, 3, 2};
static const kiln_param mod_params[] = {
    {"layers", KILN_TYPE_INT_LIST, 0, KILN_V_INTS(def_layers), "layer sizes"},
    {"activation", KILN_TYPE_STRING, 0, KILN_V_STR("relu"), "relu or gelu"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const char *const mod_checks[] = {"layers >= 1", "activation in {relu, gelu}"};
static const kiln_kv mod_props[] = {{"config_checks", KILN_V_STRS(mod_checks)}, {NULL, KILN_V_NONE}};
static const kiln_plugin_desc mod = {sizeof(kiln_plugin_desc), KILN_KIND_MODULE, "tmlp", "0.1.0", "test module",
                                     0, mod_props, mod_params, &fx_ops, NULL};

static const kiln_plugin_desc cb = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "tcb", "0.1.0", "test callback",
                                    0, NULL, NULL, &fx_ops, NULL};

KILN_DEFINE_LIBRARY("testgood", "1.0.0", 0, &prec, &opt, &mod, &cb)
