/*
 * tests/host/test_config.c — run files: parse errors as file:line, @include
 * relative to the including file, --set overrides typed by libconfig's parser
 * (int, float, bool, string, arrays, creating missing groups, refusing a
 * wrong type), unknown keys with did-you-mean at the top level, in the
 * trainer and in a plugin section checked against the keys the plugin
 * declares, defaults filled in, required keys, and the effective config
 * printed by `kiln config show`; integer literals past int32 refused (the L
 * suffix for 64-bit), --set of a list element replacing it.
 */
#define _GNU_SOURCE
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "loader.h"
#include "plugin_api.h"
#include "log.h"
#include "testutil.h"

static char *g_dir;

static const char *write_cfg(const char *name, const char *text) {
    static char path[4][4200];
    static int k;
    char *p = path[k++ & 3];
    snprintf(p, 4200, "%s/%s", g_dir, name);
    CU_ASSERT_EQUAL_FATAL(tu_write(p, text), 0);
    return p;
}

/* A loader that scanned a fresh copy of the testgood fixture, whose
 * plugins declare the keys a section is resolved against; 0, or -1 when
 * the copy fails. testgood_free undoes it. */
static int testgood_open(hl_loader *L, char **dir) {
    *dir = tu_mkdtemp();
    if (!*dir || tu_copy_fixture("testgood", *dir) != 0) return -1;
    hl_loader_init(L, hs_host_base());
    hl_add_dir(L, *dir, HL_ORIGIN_CONFIG);
    hl_scan(L);
    return 0;
}

static void testgood_free(hl_loader *L, char *dir) {
    hl_loader_free(L);
    tu_rmrf(dir);
    free(dir);
}

/* Resolve the run file's module section against module `mod`'s keys into
 * *kv; its "layers" list, or NULL when the section does not resolve. */
static const kiln_value *resolved_layers(hc_config *c, const hl_plugin *mod, hc_kvset *kv, ht_error *err) {
    if (hc_resolve(c, config_lookup(&c->cfg, "module"), mod->view.params, "module 'tmlp'", kv, err) != KILN_OK)
        return NULL;
    return kiln_kv_find(kv->kv, "layers");
}

static void test_parse_error_line(void) {
    const char *p = write_cfg("bad.cfg", "trainer = {\n  max_epochs = 3;\n  seed = ;\n};\n");
    hc_config c;
    ht_error err = {0};
    CU_ASSERT_EQUAL(hc_load(&c, p, &err), KILN_E_CONFIG);
    char expect[4300];
    snprintf(expect, sizeof expect, "%s:3: ", p);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, expect));
    hc_free(&c);
}

static void test_missing_file(void) {
    hc_config c;
    ht_error err = {0};
    CU_ASSERT_EQUAL(hc_load(&c, "/nonexistent/run.cfg", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/nonexistent/run.cfg: cannot read run file"));
    hc_free(&c);
}

static void test_include_relative(void) {
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/conf", g_dir);
    mkdir(sub, 0755);
    write_cfg("conf/base.cfg", "optimizer = { name = \"tsgd\"; lr = 0.5; };\n");
    const char *p = write_cfg("conf/run.cfg", "@include \"base.cfg\"\ntrainer = { max_epochs = 2; };\n");
    /* load from another working directory: the include must still resolve */
    char cwd[4200];
    CU_ASSERT_PTR_NOT_NULL_FATAL(getcwd(cwd, sizeof cwd));
    CU_ASSERT_EQUAL_FATAL(chdir("/"), 0);
    hc_config c;
    ht_error err = {0};
    int rc = hc_load(&c, p, &err);
    CU_ASSERT_EQUAL_FATAL(chdir(cwd), 0);
    CU_ASSERT_EQUAL_FATAL(rc, KILN_OK);
    double lr = 0;
    CU_ASSERT(config_lookup_float(&c.cfg, "optimizer.lr", &lr));
    CU_ASSERT_DOUBLE_EQUAL(lr, 0.5, 0);
    hc_free(&c);
}

static void test_overrides_typed(void) {
    hc_config c;
    ht_error err = {0};
    CU_ASSERT_EQUAL_FATAL(hc_load_string(&c,
                                         "trainer = { max_epochs = 3; };\n"
                                         "optimizer = { name = \"tsgd\"; lr = 0.1; nesterov = false; };\n"
                                         "precision = { name = \"t16-mixed\"; };\n"
                                         "module = { name = \"tmlp\"; layers = [1, 2]; };\n",
                                         "run.cfg", &err),
                          KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "trainer.max_epochs=7", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "optimizer.lr=1", &err), KILN_OK); /* int into a float */
    CU_ASSERT_EQUAL(hc_override(&c, "optimizer.nesterov=true", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "precision.name=16", &err), KILN_OK); /* "16" the string */
    CU_ASSERT_EQUAL(hc_override(&c, "module.layers=[784, 128, 10]", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "data.batch_size=64", &err), KILN_OK); /* creates the group */
    CU_ASSERT_EQUAL(hc_override(&c, "data.path=/usr/share/x", &err), KILN_OK); /* bare word */
    int ival = 0, b = 0;
    double f = 0;
    const char *s = NULL;
    CU_ASSERT(config_lookup_int(&c.cfg, "trainer.max_epochs", &ival) && ival == 7);
    CU_ASSERT(config_lookup_float(&c.cfg, "optimizer.lr", &f) && f == 1.0);
    CU_ASSERT(config_lookup_bool(&c.cfg, "optimizer.nesterov", &b) && b == 1);
    CU_ASSERT(config_lookup_string(&c.cfg, "precision.name", &s) && !strcmp(s, "16"));
    CU_ASSERT(config_lookup_int(&c.cfg, "data.batch_size", &ival) && ival == 64);
    CU_ASSERT(config_lookup_string(&c.cfg, "data.path", &s) && !strcmp(s, "/usr/share/x"));
    config_setting_t *l = config_lookup(&c.cfg, "module.layers");
    CU_ASSERT_EQUAL(config_setting_length(l), 3);
    CU_ASSERT_EQUAL(config_setting_get_int_elem(l, 2), 10);
    /* a float into an int is refused, naming where the int came from */
    CU_ASSERT_EQUAL(hc_override(&c, "trainer.max_epochs=1.5", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "--set trainer.max_epochs=1.5: expected a int (as at run.cfg:1), found a float"));
    CU_ASSERT_EQUAL(hc_override(&c, "novalue", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "expected KEY=VALUE"));
    CU_ASSERT_EQUAL(hc_override(&c, "trainer.max_epochs.x=1", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "is a int, not a group"));
    hc_free(&c);
}

static void test_unknown_top_and_trainer(void) {
    hc_config c;
    ht_error err = {0};
    CU_ASSERT_EQUAL_FATAL(hc_load_string(&c, "trainer = { max_epochs = 1; };\noptimiser = { name = \"x\"; };\n",
                                         "run.cfg", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_check_structure(&c, &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "run.cfg:2: unknown key 'optimiser' in the run file (did you mean 'optimizer'?)"));
    hc_free(&c);
    CU_ASSERT_EQUAL_FATAL(hc_load_string(&c, "trainer = {\n  max_epoch = 1;\n};\n", "run.cfg", &err),
                          KILN_OK);
    CU_ASSERT_EQUAL(hc_check_structure(&c, &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "run.cfg:2: unknown key 'max_epoch' for trainer (did you mean 'max_epochs'?)"));
    hc_free(&c);
    CU_ASSERT_EQUAL_FATAL(hc_load_string(&c, "trainer = {\n  seed = \"x\";\n};\n", "run.cfg", &err),
                          KILN_OK);
    CU_ASSERT_EQUAL(hc_check_structure(&c, &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "run.cfg:2: trainer.seed must be a int, found a string"));
    hc_free(&c);
    CU_ASSERT_EQUAL_FATAL(hc_load_string(&c, "plugins = { dirs = [\"rel/dir\"]; };\n", "run.cfg", &err),
                          KILN_OK);
    const char **dirs;
    int nd, allow;
    CU_ASSERT_EQUAL(hc_plugin_dirs(&c, &dirs, &nd, &allow, &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "plugin directory 'rel/dir' must be an absolute path"));
    hc_free(&c);
}

/* A plugin section against the keys the plugin declares. */
static void test_plugin_section(void) {
    char *d;
    hl_loader L;
    CU_ASSERT_EQUAL_FATAL(testgood_open(&L, &d), 0);
    ht_error err = {0};
    const hl_plugin *opt = hl_find(&L, KILN_KIND_OPTIMIZER, "tsgd", &err);
    const hl_plugin *mod = hl_find(&L, KILN_KIND_MODULE, "tmlp", &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(opt);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mod);
    hc_config c;
    hc_kvset kv;
    CU_ASSERT_EQUAL_FATAL(hc_load_string(&c,
                                         "optimizer = {\n  name = \"tsgd\";\n  lr = 0.1;\n  momentun = 0.9;\n};\n"
                                         "module = { name = \"tmlp\"; layers = [784, 1024, 10]; };\n",
                                         "run.cfg", &err), KILN_OK);
    config_setting_t *sec = config_lookup(&c.cfg, "optimizer");
    CU_ASSERT_EQUAL(hc_resolve(&c, sec, opt->view.params, "optimizer 'tsgd'", &kv, &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "run.cfg:4: unknown key 'momentun' for optimizer 'tsgd' (did you mean 'momentum'?)"));
    /* fixed: defaults filled in, types converted */
    config_setting_remove(sec, "momentun");
    CU_ASSERT_EQUAL_FATAL(hc_resolve(&c, sec, opt->view.params, "optimizer 'tsgd'", &kv, &err), KILN_OK);
    CU_ASSERT_DOUBLE_EQUAL(kiln_kv_float(kv.kv, "lr", -1), 0.1, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(kiln_kv_float(kv.kv, "momentum", -1), 0.0, 0);
    CU_ASSERT_EQUAL(kiln_kv_int(kv.kv, "nesterov", -1), 0);
    CU_ASSERT_PTR_NULL(kiln_kv_find(kv.kv, "betas")); /* optional, no default */
    hc_kvset_free(&kv);
    /* int list */
    const kiln_value *layers = resolved_layers(&c, mod, &kv, &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(layers);
    CU_ASSERT_EQUAL_FATAL(layers->type, KILN_TYPE_INT_LIST);
    CU_ASSERT_EQUAL(layers->count, 3);
    CU_ASSERT_EQUAL(layers->v.il[1], 1024);
    CU_ASSERT_STRING_EQUAL(kiln_kv_str(kv.kv, "activation", ""), "relu");
    hc_kvset_free(&kv);
    /* required key missing; wrong type */
    config_setting_remove(sec, "lr");
    CU_ASSERT_EQUAL(hc_resolve(&c, sec, opt->view.params, "optimizer 'tsgd'", &kv, &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "run.cfg:1: optimizer 'tsgd' requires key 'lr'"));
    CU_ASSERT_EQUAL(hc_override(&c, "optimizer.lr=\"fast\"", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_resolve(&c, sec, opt->view.params, "optimizer 'tsgd'", &kv, &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "optimizer 'tsgd'.lr must be a float, found a string"));
    hc_free(&c);
    testgood_free(&L, d);
}

/* libconfig 1.5 wraps an int literal past int32 silently; kiln refuses it
 * with the file:line and key, and takes the L suffix end to end. */
static void test_int_range(void) {
    hc_config c;
    ht_error err = {0};
    const char *p = write_cfg("big.cfg", "# 9999999999 in a comment\ntrainer = {\n  name = \"x 8888888888\";\n"
                                         "  max_steps = 5000000000;\n};\n");
    CU_ASSERT_EQUAL(hc_load(&c, p, &err), KILN_E_CONFIG);
    char expect[4400];
    snprintf(expect, sizeof expect,
             "%s:4: trainer.max_steps: expected an integer in -2147483648..2147483647 (write 5000000000L for a "
             "64-bit int), found 5000000000", p);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, expect));
    hc_free(&c);
    /* an included file is scanned too, and an array element is named */
    write_cfg("inc.cfg", "module = {\n  name = \"tmlp\";\n  layers = [784, 4294967299, 10];\n};\n");
    p = write_cfg("inc_run.cfg", "@include \"inc.cfg\"\n");
    CU_ASSERT_EQUAL(hc_load(&c, p, &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "inc.cfg:3: module.layers.[1]: expected an integer"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "found 4294967299"));
    hc_free(&c);
    /* hex is a bit pattern libconfig would make negative; negatives; L past int64 */
    CU_ASSERT_EQUAL(hc_load_string(&c, "a = 1;\nb = 0xFFFFFFFF;\n", "run.cfg", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "run.cfg:2: b: expected an integer"));
    hc_free(&c);
    CU_ASSERT_EQUAL(hc_load_string(&c, "a = -2147483649;\n", "run.cfg", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "run.cfg:1: a: expected an integer in -2147483648..2147483647"));
    hc_free(&c);
    CU_ASSERT_EQUAL(hc_load_string(&c, "a = 99999999999999999999L;\n", "run.cfg", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "run.cfg:1: a: expected an integer in -9223372036854775808..9223372036854775807"));
    hc_free(&c);
    /* what fits is fine: limits, floats, hex, names with digits, L values */
    CU_ASSERT_EQUAL_FATAL(hc_load_string(&c,
                                         "a = -2147483648; b = 2147483647; c = 1e10; d = 2.5e-4; e = .5; f = 5.;\n"
                                         "g = 0x7FFFFFFF; h2h = 5000000000L; i = [1L, 4294967299L]; j = 0x100000000L;\n"
                                         "k = \"\\\"4294967299\"; /* 4294967299 */ l = 1; // 4294967299\n",
                                         "run.cfg", &err), KILN_OK);
    long long v = 0;
    CU_ASSERT(config_lookup_int64(&c.cfg, "h2h", &v) && v == 5000000000LL);
    CU_ASSERT(config_lookup_int64(&c.cfg, "j", &v) && v == 4294967296LL);
    CU_ASSERT_EQUAL(config_setting_get_int64_elem(config_lookup(&c.cfg, "i"), 1), 4294967299LL);
    /* --set: the same rule, and a 64-bit value replaces an int key */
    CU_ASSERT_EQUAL(hc_override(&c, "a=5000000000", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "--set a=5000000000: a: expected an integer in -2147483648..2147483647 "
                                       "(write 5000000000L for a 64-bit int), found 5000000000"));
    CU_ASSERT_EQUAL(hc_override(&c, "m.n=[1, 4294967299]", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "found 4294967299"));
    CU_ASSERT_EQUAL(hc_override(&c, "a=5000000000L", &err), KILN_OK);
    CU_ASSERT(config_lookup_int64(&c.cfg, "a", &v) && v == 5000000000LL);
    CU_ASSERT_EQUAL(hc_override(&c, "h2h=7", &err), KILN_OK);
    CU_ASSERT(config_lookup_int64(&c.cfg, "h2h", &v) && v == 7);
    hc_free(&c);
}

/* A 64-bit value written with L reaches a plugin's int list as int64. */
static void test_int64_to_plugin(void) {
    char *d;
    hl_loader L;
    CU_ASSERT_EQUAL_FATAL(testgood_open(&L, &d), 0);
    ht_error err = {0};
    const hl_plugin *mod = hl_find(&L, KILN_KIND_MODULE, "tmlp", &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mod);
    hc_config c;
    hc_kvset kv;
    CU_ASSERT_EQUAL_FATAL(hc_load_string(&c, "module = { name = \"tmlp\"; layers = [784, 1024, 10]; };\n", "run.cfg",
                                         &err), KILN_OK);
    /* an int array element taking a 64-bit value: the array widens to int64 */
    CU_ASSERT_EQUAL(hc_override(&c, "module.layers.[1]=4294967299L", &err), KILN_OK);
    const kiln_value *layers = resolved_layers(&c, mod, &kv, &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(layers);
    CU_ASSERT_EQUAL_FATAL(layers->count, 3);
    CU_ASSERT_EQUAL(layers->v.il[0], 784);
    CU_ASSERT_EQUAL(layers->v.il[1], 4294967299LL);
    CU_ASSERT_EQUAL(layers->v.il[2], 10);
    hc_kvset_free(&kv);
    /* the effective file reads back (libconfig refuses a mixed array) */
    char out[4200];
    snprintf(out, sizeof out, "%s/eff64.cfg", g_dir);
    CU_ASSERT_EQUAL_FATAL(hc_write(&c, out, &err), KILN_OK);
    hc_free(&c);
    CU_ASSERT_EQUAL(hc_load(&c, out, &err), KILN_OK);
    CU_ASSERT_EQUAL(config_setting_get_int64_elem(config_lookup(&c.cfg, "module.layers"), 1), 4294967299LL);
    hc_free(&c);
    testgood_free(&L, d);
}

/* --set LIST.[i]=VALUE replaces element i whatever its type; an index out of
 * range is refused. */
static void test_override_list_element(void) {
    hc_config c;
    ht_error err = {0};
    CU_ASSERT_EQUAL_FATAL(hc_load_string(&c,
                                         "a = [1, 2, 3];\nf = [0.5, 1.5];\ns = [\"x\", \"y\"];\n"
                                         "l = (1, \"two\", [3], { k = 4; });\nw = [1L, 2L];\n",
                                         "run.cfg", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "a.[1]=20", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "a.[2]=5000000000L", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "f.[0]=2.5", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "f.[1]=3", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "s.[0]=\"z\"", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "l.[0]=6000000000L", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "l.[2]=[7, 8]", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "l.[3]={ k = 9; }", &err), KILN_OK);
    CU_ASSERT_EQUAL(hc_override(&c, "l.[3].m=10", &err), KILN_OK); /* new key in a group element */
    CU_ASSERT_EQUAL(hc_override(&c, "w.[0]=3", &err), KILN_OK);
    config_setting_t *a = config_lookup(&c.cfg, "a"), *f = config_lookup(&c.cfg, "f"), *s = config_lookup(&c.cfg, "s"),
                     *l = config_lookup(&c.cfg, "l"), *w = config_lookup(&c.cfg, "w");
    CU_ASSERT_EQUAL_FATAL(config_setting_length(a), 3);
    CU_ASSERT_EQUAL(config_setting_get_int64_elem(a, 0), 1);
    CU_ASSERT_EQUAL(config_setting_get_int64_elem(a, 1), 20);
    CU_ASSERT_EQUAL(config_setting_get_int64_elem(a, 2), 5000000000LL);
    CU_ASSERT_EQUAL_FATAL(config_setting_length(f), 2);
    CU_ASSERT_DOUBLE_EQUAL(config_setting_get_float_elem(f, 0), 2.5, 0);
    CU_ASSERT_DOUBLE_EQUAL(config_setting_get_float_elem(f, 1), 3.0, 0);
    CU_ASSERT_EQUAL_FATAL(config_setting_length(s), 2);
    CU_ASSERT_STRING_EQUAL(config_setting_get_string_elem(s, 0), "z");
    CU_ASSERT_EQUAL_FATAL(config_setting_length(l), 4);
    CU_ASSERT_EQUAL(config_setting_get_int64_elem(l, 0), 6000000000LL);
    CU_ASSERT_STRING_EQUAL(config_setting_get_string_elem(l, 1), "two");
    CU_ASSERT_EQUAL(config_setting_length(config_setting_get_elem(l, 2)), 2);
    int k = 0;
    CU_ASSERT(config_setting_lookup_int(config_setting_get_elem(l, 3), "k", &k) && k == 9);
    CU_ASSERT(config_setting_lookup_int(config_setting_get_elem(l, 3), "m", &k) && k == 10);
    CU_ASSERT_EQUAL_FATAL(config_setting_length(w), 2);
    CU_ASSERT_EQUAL(config_setting_get_int64_elem(w, 0), 3);
    /* out of range, and a type mismatch, change nothing */
    CU_ASSERT_EQUAL(hc_override(&c, "a.[3]=1", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "--set a.[3]: expected an index in [0..2] (a has 3 elements, at run.cfg:1), "
                                       "found [3]"));
    CU_ASSERT_EQUAL(hc_override(&c, "l.[9].k=1", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "expected an index in [0..3]"));
    CU_ASSERT_EQUAL(hc_override(&c, "a.[0]=\"x\"", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "expected a int"));
    CU_ASSERT_EQUAL(config_setting_length(a), 3);
    hc_free(&c);
}

/* One line and exit status 2 for a command line kiln cannot read; `out`
 * must hold `needle`. */
static void expect_usage_error(const char *args, const char *needle) {
    char out[4096];
    int rc = tu_run_kiln(NULL, args, out, sizeof out); /* the words of args, no shell */
    int nl = 0;
    for (const char *c = out; *c; c++) nl += *c == '\n';
    if (rc != 2 || !strstr(out, needle) || nl != 1) fprintf(stderr, "\n  kiln %s: exit %d: %s\n", args, rc, out);
    CU_ASSERT_EQUAL(rc, 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, needle));
    CU_ASSERT_EQUAL(nl, 1);
}

/* The command line, read by getopt_long once per command: every command's
 * options, both spellings of a value (--set K=V, --set=K=V), and one line
 * with exit status 2 for anything else. */
static void test_command_line(void) {
    expect_usage_error("--bogus fit x.cfg", "unknown flag '--bogus'");
    expect_usage_error("-x fit x.cfg", "unknown flag '-x'");
    expect_usage_error("fit", "usage: kiln fit RUN.cfg");
    expect_usage_error("fit x.cfg y.cfg", "fit: unexpected argument 'y.cfg'");
    expect_usage_error("fit x.cfg --frobnicate", "fit: unexpected argument '--frobnicate'");
    expect_usage_error("fit x.cfg --ckpt", "fit: option '--ckpt' expects a value");
    expect_usage_error("fit x.cfg --set", "fit: option '--set' expects a value");
    expect_usage_error("validate x.cfg --test", "validate: unexpected argument '--test'");
    expect_usage_error("test x.cfg --weights-only", "test: unexpected argument '--weights-only'");
    expect_usage_error("config check", "usage: kiln config check|show RUN.cfg");
    expect_usage_error("config show x.cfg --ckpt last", "config show: unexpected argument '--ckpt'");
    expect_usage_error("plugins list --json extra", "plugins list: unknown argument 'extra'");
    expect_usage_error("plugins list --config", "plugins list: option '--config' expects a value");
    expect_usage_error("plugins list --plugin-dir rel", "--plugin-dir rel: expected an absolute path");
    expect_usage_error("plugins check --verbose x.so", "plugins check: unexpected argument '--verbose'");
    expect_usage_error("plugins check a.so b.so", "plugins check: unexpected argument 'b.so'");
    expect_usage_error("nonsense", "unknown command 'nonsense'");
    /* --set with the value joined or apart, repeated, in order */
    char text[8192], cmd[8192], out[16384];
    snprintf(text, sizeof text,
             "plugins = { dirs = [\"%s\"]; };\n"
             "trainer = { max_epochs = 2; };\n"
             "data = { name = \"toydata\"; };\n"
             "module = { name = \"toymod\"; };\n"
             "optimizer = { name = \"sgd\"; lr = 0.1; };\n",
             getenv("KILN_TRAIN_FIXTURES"));
    const char *p = write_cfg("cmdline.cfg", text);
    snprintf(cmd, sizeof cmd, "%s -qq config show %s --set=trainer.max_epochs=7 --set optimizer.lr=0.5 "
             "--set trainer.max_epochs=8", tu_kiln(), p);
    CU_ASSERT_EQUAL(tu_run_words(cmd, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "max_epochs = 8"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "lr = 0.5"));
    /* global flags repeat and combine; --version answers before any command */
    snprintf(cmd, sizeof cmd, "%s -v -q --quiet -qq --version", tu_kiln());
    CU_ASSERT_EQUAL(tu_run_words(cmd, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "plugin ABI"));
    snprintf(cmd, sizeof cmd, "%s -h", tu_kiln());
    CU_ASSERT_EQUAL(tu_run_words(cmd, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "global flags:"));
}

/* The one edit distance behind every did-you-mean (run-file keys, plugin
 * names, the plugin entry point): an adjacent transposition is one edit. */
static void test_edit_distance(void) {
    CU_ASSERT_EQUAL(hedit_distance("", ""), 0);
    CU_ASSERT_EQUAL(hedit_distance("", "abc"), 3);
    CU_ASSERT_EQUAL(hedit_distance("ab", "ba"), 1);
    CU_ASSERT_EQUAL(hedit_distance("tsdg", "tsgd"), 1);
    CU_ASSERT_EQUAL(hedit_distance("optimiser", "optimizer"), 1);
    CU_ASSERT_EQUAL(hedit_distance("kitten", "sitting"), 3);
    /* optimal string alignment: a transposed pair is not edited again */
    CU_ASSERT_EQUAL(hedit_distance("ca", "abc"), 3);
    CU_ASSERT_EQUAL(hedit_distance("kiln_plugin_init_v1", "kiln_plugin_inti_v1"), 1);
    char longer[80];
    memset(longer, 'a', sizeof longer - 1);
    longer[sizeof longer - 1] = 0;
    CU_ASSERT_EQUAL(hedit_distance(longer, "a"), HEDIT_FAR);
    longer[64] = 0; /* 64 bytes: still measured */
    CU_ASSERT_EQUAL(hedit_distance(longer, longer), 0);
}

static void test_cli_config(void) {
    char text[8192];
    snprintf(text, sizeof text,
             "plugins = { dirs = [\"%s/plugins\", \"%s\"]; };\n"
             "trainer = { max_epochs = 2; };\n"
             "precision = \"32\";\n"
             "data = { name = \"toydata\"; };\n"
             "module = { name = \"toymod\"; };\n"
             "optimizer = { name = \"tsgd\"; lr = 0.1; };\n",
             g_dir, getenv("KILN_TRAIN_FIXTURES"));
    char pd[4200];
    snprintf(pd, sizeof pd, "%s/plugins", g_dir);
    mkdir(pd, 0755);
    CU_ASSERT_EQUAL_FATAL(tu_copy_fixture("testgood", pd), 0);
    const char *p = write_cfg("cli.cfg", text);
    /* kiln -q config VERB cli.cfg MORE...: the exit status and what the
     * output holds (also: a second line it holds, or NULL) */
    static const struct {
        const char *verb, *more[5];
        int rc;
        const char *needle, *also;
    } cases[] = {
        {"show", {"--set", "trainer.max_epochs=9", "--set", "optimizer.lr=0.25"}, 0, "max_epochs = 9", "lr = 0.25"},
        {"check", {NULL}, 0, "cli.cfg: ok", NULL},
        {"check", {"--set", "optimizer.lrr=1"}, 1, "unknown key 'lrr' for optimizer 'tsgd' (did you mean 'lr'?)", NULL},
        {"check", {"--set", "trainer.max_epochs=x"}, 1, "expected a int", NULL},
        {"check", {"--set", "precision=fp8"}, 1, "no precision plugin answers to 'fp8'", NULL},
        {"check", {"--set", "trainer.max_steps=5000000000"}, 1,
         "--set trainer.max_steps=5000000000: trainer.max_steps: expected an integer", NULL},
        /* 1.5 config_checks: values outside a plugin's rules, refused at check time */
        {"check", {"--set", "optimizer.lr=-2"}, 1, "cli.cfg:6: optimizer 'tsgd' key 'lr' must be > 0, found -2", NULL},
        {"check", {"--set", "optimizer.betas=[0.9, 1.0]"}, 1, "key 'betas' must be in [0, 1), found 1 (element 1)", NULL},
        {"check", {"--set", "module.name=tmlp", "--set", "module.activation=\"swish\""}, 1,
         "module 'tmlp' key 'activation' must be one of \"relu\", \"gelu\", found \"swish\"", NULL},
        {"check", {"--set", "module.name=tmlp", "--set", "module.layers=[4, 0, 2]"}, 1,
         "key 'layers' must be >= 1, found 0 (element 1)", NULL},
        {"show", {"--set", "trainer.max_steps=5000000000L"}, 0, "max_steps = 5000000000L", NULL},
    };
    char out[16384];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = tu_run_kiln_a(TU_ARGS("-q", "config", cases[i].verb, p), cases[i].more, out, sizeof out);
        if (rc != cases[i].rc || !strstr(out, cases[i].needle)) fprintf(stderr, "\n  case %zu: %d: %s\n", i, rc, out);
        CU_ASSERT_EQUAL(rc, cases[i].rc);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, cases[i].needle));
        if (cases[i].also) CU_ASSERT_PTR_NOT_NULL(strstr(out, cases[i].also));
    }
    /* shown per key by plugins list --verbose */
    CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "-q", "plugins", "list", "--verbose", "--plugin-dir", pd, NULL), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "key momentum               float       default 0  (in [0, 1))"));
}

/* The quirks a plugin author met (each fixed or refused in one line):
 * --set NAME.name over the short form, --set NAME=X over a section names
 * the keys it drops, --set NAME={...} over the short form, a new key in a list element, a key set twice (also
 * across @include) names the key, -q silences progress and -qq the
 * summary too. */
static void test_set_quirks(void) {
    hc_config c;
    ht_error err = {0};
    CU_ASSERT_EQUAL_FATAL(hc_load_string(&c,
                                         "precision = \"32-true\";\n"
                                         "optimizer = { name = \"sgd\"; lr = 0.1; momentum = 0.9; };\n"
                                         "callbacks = ( { name = \"a\"; }, { name = \"b\"; x = 1; } );\n",
                                         "run.cfg", &err),
                          KILN_OK);
    const char *s = NULL;
    int ival = 0;
    CU_ASSERT_EQUAL(hc_override(&c, "precision.name=bf16-mixed", &err), KILN_OK);
    CU_ASSERT(config_lookup_string(&c.cfg, "precision.name", &s) && !strcmp(s, "bf16-mixed"));
    CU_ASSERT_EQUAL(hc_override(&c, "callbacks.[1].y=2", &err), KILN_OK); /* a new key */
    CU_ASSERT(config_lookup_int(&c.cfg, "callbacks.[1].y", &ival) && ival == 2);
    CU_ASSERT_EQUAL(hc_override(&c, "callbacks.[1].x=3", &err), KILN_OK); /* an existing one */
    CU_ASSERT(config_lookup_int(&c.cfg, "callbacks.[1].x", &ival) && ival == 3);
    CU_ASSERT_EQUAL(hc_override(&c, "optimizer=adamw", &err), KILN_OK); /* another plugin */
    CU_ASSERT(config_lookup_string(&c.cfg, "optimizer", &s) && !strcmp(s, "adamw"));
    /* a whole section over the short form (accelerator = "cpu" and --set
     * 'accelerator={ name = "cuda"; attention = "flash"; }') */
    CU_ASSERT_EQUAL(hc_override(&c, "optimizer={ name = \"sgd\"; lr = 0.5; }", &err), KILN_OK);
    CU_ASSERT(config_lookup_string(&c.cfg, "optimizer.name", &s) && !strcmp(s, "sgd"));
    double dval = 0;
    CU_ASSERT(config_lookup_float(&c.cfg, "optimizer.lr", &dval) && dval == 0.5);
    /* a section is no value for a string that is not a plugin slot */
    CU_ASSERT_EQUAL(hc_override(&c, "callbacks.[0].name={ x = 1; }", &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "expected a string (as at run.cfg:3), found a group"));
    hc_free(&c);

    /* the info line that says what --set NAME=X dropped, and -q */
    const char *p = write_cfg("quirk.cfg", "optimizer = { name = \"sgd\"; lr = 0.1; momentum = 0.9; };\n");
    char cmd[8192], out[16384];
    snprintf(cmd, sizeof cmd, "%s config show %s --set optimizer=adamw", tu_kiln(), p);
    tu_run_words(cmd, out, sizeof out); /* fails later (no data section): the line comes first */
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "--set optimizer=adamw replaces the whole optimizer section, whose keys lr, "
                                       "momentum are dropped (--set optimizer.name=adamw would keep them)"));
    /* a key set twice, also when the first is in an @include file */
    write_cfg("inc-base.cfg", "trainer = { max_epochs = 1; };\n");
    p = write_cfg("inc-dup.cfg", "@include \"inc-base.cfg\"\ntrainer = { max_epochs = 2; };\n");
    CU_ASSERT_EQUAL(hc_load(&c, p, &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "inc-dup.cfg:2: 'trainer' is set twice in the same group"));
    hc_free(&c);
    p = write_cfg("dup.cfg", "trainer = {\n  max_epochs = 1;\n  seed = 3;\n  max_epochs = 2;\n};\n");
    CU_ASSERT_EQUAL(hc_load(&c, p, &err), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "dup.cfg:4: 'max_epochs' is set twice in the same group"));
    hc_free(&c);
}

static void test_quiet_levels(void) {
    char text[8192], cmd[8192], out[16384];
    snprintf(text, sizeof text,
             "plugins = { dirs = [\"%s\"]; };\n"
             "trainer = { max_epochs = 1; num_sanity_val_steps = 0; default_root_dir = \"%s/quiet-runs\"; };\n"
             "data = { name = \"toydata\"; n_train = 2; n_val = 1; };\n"
             "module = { name = \"toymod\"; };\n"
             "optimizer = { name = \"sgd\"; lr = 0.1; };\n"
             "callbacks = ( { name = \"progress\"; tty = \"never\"; print_every_n_batches = 1; } );\n",
             getenv("KILN_TRAIN_FIXTURES"), g_dir);
    const char *p = write_cfg("quiet.cfg", text);
    snprintf(cmd, sizeof cmd, "%s fit %s", tu_kiln(), p);
    CU_ASSERT_EQUAL_FATAL(tu_run_words(cmd, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "epoch 1 batch 1/2")); /* the progress lines */
    snprintf(cmd, sizeof cmd, "%s -q fit %s", tu_kiln(), p);
    CU_ASSERT_EQUAL_FATAL(tu_run_words(cmd, out, sizeof out), 0);
    CU_ASSERT_PTR_NULL(strstr(out, "info:"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "== kiln fit summary")); /* the result */
    CU_ASSERT_EQUAL(strncmp(out, "\n== kiln fit summary", 20), 0); /* nothing before it */
    snprintf(cmd, sizeof cmd, "%s -qq fit %s", tu_kiln(), p);
    CU_ASSERT_EQUAL_FATAL(tu_run_words(cmd, out, sizeof out), 0);
    CU_ASSERT_STRING_EQUAL(out, "");
}

static int setup(void) { g_dir = tu_mkdtemp(); return g_dir ? 0 : 1; }
static int teardown(void) { tu_rmrf(g_dir); free(g_dir); return 0; }

static void register_tests(void) {
    CU_pSuite s = CU_add_suite("config", setup, teardown);
    CU_add_test(s, "parse error with line", test_parse_error_line);
    CU_add_test(s, "missing file", test_missing_file);
    CU_add_test(s, "include relative to file", test_include_relative);
    CU_add_test(s, "overrides typed", test_overrides_typed);
    CU_add_test(s, "unknown keys top/trainer", test_unknown_top_and_trainer);
    CU_add_test(s, "plugin section keys", test_plugin_section);
    CU_add_test(s, "int literals past int32", test_int_range);
    CU_add_test(s, "int64 reaches a plugin", test_int64_to_plugin);
    CU_add_test(s, "--set list element", test_override_list_element);
    CU_add_test(s, "one edit distance for every did-you-mean", test_edit_distance);
    CU_add_test(s, "the command line (getopt_long)", test_command_line);
    CU_add_test(s, "kiln config show/check", test_cli_config);
    CU_add_test(s, "--set and run-file quirks", test_set_quirks);
    CU_add_test(s, "-q and -qq", test_quiet_levels);
}

#include "cunit_main.h"
