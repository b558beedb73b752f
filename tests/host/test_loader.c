/*
 * tests/host/test_loader.c — the plugin loader and registry: every refusal
 * path with its message (wrong major, missing entry, short struct sizes,
 * newer host minor required, failing init, bad property type, unknown kind,
 * duplicate names, world-writable directory, group-writable file and
 * ancestor, foreign owner, setuid, symlink, relative directory), and the
 * positive paths (several plugins per file, aliases, explicit selection,
 * built-in precedence, the frozen-1.0 plugin, properties without an
 * instance, create/destroy through the services, `kiln plugins check` in a
 * child process surviving a crashing constructor, and `plugins list --json`).
 */
#define _GNU_SOURCE
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loader.h"
#include "plugin_api.h"
#include "services.h"
#include "testutil.h"

/* A fresh loader that scanned `dir` as a run file's plugin directory. */
static void scan_dir(hl_loader *L, const char *dir) {
    hl_loader_init(L, hs_host_base());
    hl_add_dir(L, dir, HL_ORIGIN_CONFIG);
    hl_scan(L);
}

/* Scan a fresh directory holding the named fixtures; returns the dir. */
static char *scan_with(hl_loader *L, const char *const *names, int n) {
    char *d = tu_mkdtemp();
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    for (int i = 0; i < n; i++) CU_ASSERT_EQUAL_FATAL(tu_copy_fixture(names[i], d), 0);
    scan_dir(L, d);
    return d;
}

/* Undo scan_with. */
static void scan_free(hl_loader *L, char *dir) {
    hl_loader_free(L);
    tu_rmrf(dir);
    free(dir);
}

/* The reason recorded for the candidate whose path ends with `suffix`. */
static const char *reason_for(const hl_loader *L, const char *suffix, int *status) {
    for (int i = 0; i < L->ncands; i++) {
        size_t lp = strlen(L->cands[i].path), ls = strlen(suffix);
        if (lp >= ls && !strcmp(L->cands[i].path + lp - ls, suffix)) {
            if (status) *status = L->cands[i].status;
            return L->cands[i].reason ? L->cands[i].reason : "";
        }
    }
    if (status) *status = -1;
    return NULL;
}

static void expect_refused(const char *fixture, const char *needle) {
    hl_loader L;
    char *d = scan_with(&L, (const char *const[]){fixture}, 1);
    char suffix[128];
    snprintf(suffix, sizeof suffix, "libkiln-%s.so", fixture);
    int st;
    const char *r = reason_for(&L, suffix, &st);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT_EQUAL(st, HL_CAND_REFUSED);
    if (!strstr(r, needle)) fprintf(stderr, "\n  reason was: %s\n  expected to contain: %s\n", r, needle);
    CU_ASSERT_PTR_NOT_NULL(strstr(r, needle));
    CU_ASSERT_PTR_NOT_NULL(strstr(r, d)); /* names the file */
    CU_ASSERT_EQUAL(L.nlibs, 0);
    scan_free(&L, d);
}

static void test_wrong_major(void) { expect_refused("raw1", "ABI major 2 not supported (host supports 1)"); }
static void test_missing_entry(void) {
    expect_refused("nosym", "missing symbol kiln_plugin_init_v1: it exports no kiln entry point");
    expect_refused("nosym", "define it with KILN_DEFINE_LIBRARY");
    /* another ABI major's entry, and a misspelt one, are named */
    expect_refused("entryv2", "it exports kiln_plugin_init_v2, so it was built for plugin ABI 2; this kiln speaks "
                              "ABI 1");
    expect_refused("entrytypo", "it exports 'kiln_plugin_init_vl' instead");
}
static void test_short_library(void) { expect_refused("raw2", "library descriptor too small (struct_size 40 < 96"); }
static void test_newer_host_minor(void) {
    char needle[128];
    snprintf(needle, sizeof needle, "requires host ABI >= 1.%d; this host provides 1.%d", KILN_ABI_MINOR + 1,
             KILN_ABI_MINOR);
    expect_refused("raw3", needle);
}
static void test_init_fails(void) {
    expect_refused("raw4", "failed to initialize: this test plugin refuses to start [KILN_E_UNSUPPORTED]");
}
static void test_short_ops(void) { expect_refused("raw5", "ops table too small (struct_size 16 < 40"); }
static void test_short_desc(void) { expect_refused("raw6", "plugin descriptor 0 too small (struct_size 24 < 72"); }

static void test_good_several_plugins(void) {
    hl_loader L;
    char *d = scan_with(&L, (const char *const[]){"testgood"}, 1);
    CU_ASSERT_EQUAL_FATAL(L.nlibs, 1);
    CU_ASSERT_EQUAL(L.libs[0]->nplugins, 4);
    ht_error err = {0};
    const hl_plugin *p = hl_find(&L, KILN_KIND_PRECISION, "t16-mixed", &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    /* aliases and explicit selection resolve to the same plugin */
    CU_ASSERT_PTR_EQUAL(hl_find(&L, KILN_KIND_PRECISION, "t16", &err), p);
    CU_ASSERT_PTR_EQUAL(hl_find(&L, KILN_KIND_PRECISION, "tfp16", &err), p);
    CU_ASSERT_PTR_EQUAL(hl_find(&L, KILN_KIND_PRECISION, "testgood:t16", &err), p);
    /* an alias is per kind */
    CU_ASSERT_PTR_NULL(hl_find(&L, KILN_KIND_OPTIMIZER, "t16", &err));
    /* properties read without an instance */
    const kiln_value *v = hl_prop(p, "precision");
    CU_ASSERT_PTR_NOT_NULL_FATAL(v);
    CU_ASSERT_STRING_EQUAL(v->v.s, "t16-mixed");
    CU_ASSERT_STRING_EQUAL(hl_prop(p, "amp_backend")->v.s, "native");
    CU_ASSERT_STRING_EQUAL(hl_prop(p, "amp_level")->v.s, "O1");
    /* unknown names: a did-you-mean and the list of what exists */
    CU_ASSERT_PTR_NULL(hl_find(&L, KILN_KIND_OPTIMIZER, "tsdg", &err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "did you mean 'tsgd'?"));
    /* create and destroy through the host services */
    kiln_host_ctx h;
    hs_ctx_init(&h, p, NULL, NULL);
    kiln_instance *inst = NULL;
    CU_ASSERT_EQUAL(hs_create(&h, hs_services(), p, &inst, &err), KILN_OK);
    CU_ASSERT_PTR_NOT_NULL(inst);
    hs_destroy(&h, inst);
    hl_shutdown(&L);
    scan_free(&L, d);
}

static void test_old_abi_plugin_loads(void) {
    hl_loader L;
    char *d = scan_with(&L, (const char *const[]){"old10"}, 1);
    CU_ASSERT_EQUAL_FATAL(L.nlibs, 1);
    CU_ASSERT_EQUAL(L.libs[0]->view.abi_minor, 0);
    ht_error err = {0};
    const hl_plugin *p = hl_find(&L, KILN_KIND_OPTIMIZER, "legacy", &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_STRING_EQUAL(p->view.name, "oldopt");
    scan_free(&L, d);
}

static void test_unknown_kind_skipped(void) {
    hl_loader L;
    char *d = scan_with(&L, (const char *const[]){"unknownkind"}, 1);
    CU_ASSERT_EQUAL_FATAL(L.nlibs, 1);
    CU_ASSERT_EQUAL(L.libs[0]->nplugins, 1);
    int st;
    const char *r = reason_for(&L, "libkiln-unknownkind.so", &st);
    CU_ASSERT_EQUAL(st, HL_CAND_LOADED);
    char needle[128];
    snprintf(needle, sizeof needle, "kind 42, unknown to host ABI 1.%d; skipped", KILN_ABI_MINOR);
    CU_ASSERT_PTR_NOT_NULL(strstr(r, needle));
    ht_error err = {0};
    CU_ASSERT_PTR_NOT_NULL(hl_find(&L, KILN_KIND_CALLBACK, "presentday", &err));
    scan_free(&L, d);
}

static void test_bad_property_type(void) {
    hl_loader L;
    char *d = scan_with(&L, (const char *const[]){"badprop"}, 1);
    CU_ASSERT_EQUAL_FATAL(L.nlibs, 1);
    CU_ASSERT_EQUAL(L.libs[0]->nplugins, 2); /* goodcb and chkok */
    const char *r = reason_for(&L, "libkiln-badprop.so", NULL);
    CU_ASSERT_PTR_NOT_NULL(strstr(r, "precision 'badprec' property 'precision' must be a string, found a int"));
    /* 1.5 config_checks: each bad rule refuses its descriptor, in one line */
    CU_ASSERT_PTR_NOT_NULL(strstr(r, "callback 'chkparse': config check \"lr ~ 3\": expected \"lr > N\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(r, "callback 'chkkey': config check \"rate > 0\": 'rate' is not one of its "
                                     "declared config keys"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r, "callback 'chktype': config check \"lr in {a, b}\": choices fit string keys"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r, "callback 'chkdefault': config check \"lr > 0\": the default of 'lr', -1, is "
                                     "not > 0"));
    /* 1.5: the stateful capability and the state ops agree */
    CU_ASSERT_PTR_NOT_NULL(strstr(r, "callback 'nocap' has get_state/set_state but does not declare "
                                     "KILN_CAP_STATEFUL"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r, "callback 'capnostate' declares KILN_CAP_STATEFUL but has no "
                                     "get_state/set_state"));
    scan_free(&L, d);
}

static void test_duplicate_names(void) {
    hl_loader L;
    const char *names[] = {"dupa", "dupb"};
    char *d = scan_with(&L, names, 2);
    CU_ASSERT_EQUAL_FATAL(L.nlibs, 2);
    CU_ASSERT_EQUAL_FATAL(L.nwarnings, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(L.warnings[0], "libkiln-dupa.so"));
    CU_ASSERT_PTR_NOT_NULL(strstr(L.warnings[0], "libkiln-dupb.so"));
    CU_ASSERT_PTR_NOT_NULL(strstr(L.warnings[0], "search-path order"));
    ht_error err = {0};
    const hl_plugin *p = hl_find(&L, KILN_KIND_OPTIMIZER, "dupopt", &err);
    CU_ASSERT_STRING_EQUAL(p->lib->stem, "dupa"); /* first in (sorted) search order */
    p = hl_find(&L, KILN_KIND_OPTIMIZER, "dupb:dupopt", &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_STRING_EQUAL(p->lib->stem, "dupb");
    scan_free(&L, d);
}

static void test_builtin_not_replaced_implicitly(void) {
    /* dupb sits in a run-file directory searched before the built-in one that
     * holds dupa: the built-in still wins unless selected explicitly. */
    char *user = tu_mkdtemp(), *builtin = tu_mkdtemp();
    CU_ASSERT_EQUAL_FATAL(tu_copy_fixture("dupb", user), 0);
    CU_ASSERT_EQUAL_FATAL(tu_copy_fixture("dupa", builtin), 0);
    hl_loader L;
    hl_loader_init(&L, hs_host_base());
    hl_add_dir(&L, user, HL_ORIGIN_CONFIG);
    hl_add_dir(&L, builtin, HL_ORIGIN_BUILTIN);
    hl_scan(&L);
    ht_error err = {0};
    const hl_plugin *p = hl_find(&L, KILN_KIND_OPTIMIZER, "dupopt", &err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_STRING_EQUAL(p->lib->stem, "dupa");
    CU_ASSERT_EQUAL_FATAL(L.nwarnings, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(L.warnings[0], "built-ins are not replaced implicitly"));
    CU_ASSERT_STRING_EQUAL(hl_find(&L, KILN_KIND_OPTIMIZER, "dupb:dupopt", &err)->lib->stem, "dupb");
    hl_loader_free(&L);
    tu_rmrf(user);
    tu_rmrf(builtin);
    free(user);
    free(builtin);
}

static void test_world_writable_dir(void) {
    char *d = tu_mkdtemp();
    CU_ASSERT_EQUAL_FATAL(tu_copy_fixture("testgood", d), 0);
    chmod(d, 0777);
    hl_loader L;
    scan_dir(&L, d);
    CU_ASSERT_EQUAL(L.nlibs, 0);
    int st;
    const char *r = reason_for(&L, d, &st);
    CU_ASSERT_EQUAL(st, HL_CAND_REFUSED);
    CU_ASSERT_TRUE(r && strstr(r, "plugin directory is world-writable (mode 0777)"));
    scan_free(&L, d);
}

static void test_group_writable_ancestor(void) {
    char *d = tu_mkdtemp();
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/plugins", d);
    mkdir(sub, 0755);
    CU_ASSERT_EQUAL_FATAL(tu_copy_fixture("testgood", sub), 0);
    chmod(d, 0775);
    ht_error err = {0};
    CU_ASSERT_EQUAL(hl_vet_dir(sub, 0, &err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "ancestor directory"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "group-writable (mode 0775)"));
    chmod(d, 0755);
    CU_ASSERT_EQUAL(hl_vet_dir(sub, 0, &err), 0);
    tu_rmrf(d);
    free(d);
}

static void file_refusal(mode_t mode, uid_t owner, const char *needle) {
    char *d = tu_mkdtemp();
    CU_ASSERT_EQUAL_FATAL(tu_copy_fixture("testgood", d), 0);
    char f[4200];
    snprintf(f, sizeof f, "%s/libkiln-testgood.so", d);
    if (owner != (uid_t)-1) CU_ASSERT_EQUAL_FATAL(chown(f, owner, (gid_t)-1), 0);
    chmod(f, mode);
    hl_loader L;
    scan_dir(&L, d);
    CU_ASSERT_EQUAL(L.nlibs, 0);
    int st;
    const char *r = reason_for(&L, "libkiln-testgood.so", &st);
    CU_ASSERT_EQUAL(st, HL_CAND_REFUSED);
    if (r && !strstr(r, needle)) fprintf(stderr, "\n  reason was: %s\n", r);
    CU_ASSERT_TRUE(r && strstr(r, needle));
    scan_free(&L, d);
}

static void test_group_writable_file(void) { file_refusal(0775, (uid_t)-1, "plugin file is group-writable (mode 0775)"); }
static void test_setuid_file(void) { file_refusal(04755, (uid_t)-1, "has the setuid bit (mode 4755)"); }
static void test_foreign_owner(void) {
    char needle[128];
    snprintf(needle, sizeof needle, "plugin file owned by uid 4242, expected root or uid %u", (unsigned)geteuid());
    if (geteuid() != 0) { fprintf(stderr, "(not root: chown to another uid impossible; checked by vet only)\n"); return; }
    file_refusal(0755, 4242, needle);
}

static void test_symlink(void) {
    char *d = tu_mkdtemp(), *store = tu_mkdtemp();
    CU_ASSERT_EQUAL_FATAL(tu_copy_fixture("testgood", store), 0);
    char target[4200], link[4200];
    snprintf(target, sizeof target, "%s/libkiln-testgood.so", store);
    snprintf(link, sizeof link, "%s/libkiln-testgood.so", d);
    CU_ASSERT_EQUAL_FATAL(symlink(target, link), 0);
    hl_loader L;
    scan_dir(&L, d);
    CU_ASSERT_EQUAL(L.nlibs, 0);
    const char *r = reason_for(&L, "libkiln-testgood.so", NULL);
    CU_ASSERT_TRUE(r && strstr(r, "is a symlink, expected a regular file (set plugins.allow_symlinks = true"));
    hl_loader_free(&L);
    /* allowed explicitly: the target and its directory are vetted instead */
    hl_loader_init(&L, hs_host_base());
    L.allow_symlinks = 1;
    hl_add_dir(&L, d, HL_ORIGIN_CONFIG);
    hl_scan(&L);
    CU_ASSERT_EQUAL(L.nlibs, 1);
    hl_loader_free(&L);
    tu_rmrf(d);
    tu_rmrf(store);
    free(d);
    free(store);
}

static void test_relative_dir(void) {
    hl_loader L;
    hl_loader_init(&L, hs_host_base());
    hl_add_dir(&L, "relative/plugins", HL_ORIGIN_CONFIG);
    hl_scan(&L);
    const char *r = reason_for(&L, "relative/plugins", NULL);
    CU_ASSERT_TRUE(r && strstr(r, "must be an absolute path, found a relative one"));
    hl_loader_free(&L);
}

static void test_other_names_ignored(void) {
    char *d = tu_mkdtemp();
    char p[4200];
    snprintf(p, sizeof p, "%s/notkiln.so", d);
    CU_ASSERT_EQUAL_FATAL(tu_copy(tu_fixture("testgood"), p, 0755), 0);
    snprintf(p, sizeof p, "%s/.libkiln-hidden.so", d);
    CU_ASSERT_EQUAL_FATAL(tu_copy(tu_fixture("testgood"), p, 0755), 0);
    hl_loader L;
    scan_dir(&L, d);
    CU_ASSERT_EQUAL(L.nlibs, 0);
    CU_ASSERT_EQUAL(L.ncands, 1); /* the directory only */
    scan_free(&L, d);
}

static void test_cli_check(void) {
    char *d = tu_mkdtemp();
    /* kiln plugins check DIR/libkiln-<fixture>.so: the exit status and
     * what the output holds (also: a second line it holds, or NULL) */
    static const struct {
        const char *fixture;
        int rc;
        const char *needle, *also;
    } cases[] = {
        {"testgood", 0, "ok — library testgood 1.0.0", "precision = \"t16-mixed\""},
        {"crash", 1, "crashed while being loaded (signal 6", NULL},
        {"raw1", 1, "ABI major 2 not supported", NULL},
    };
    const size_t n = sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < n; i++) CU_ASSERT_EQUAL_FATAL(tu_copy_fixture(cases[i].fixture, d), 0);
    char file[8192], out[16384];
    for (size_t i = 0; i < n; i++) {
        snprintf(file, sizeof file, "%s/libkiln-%s.so", d, cases[i].fixture);
        CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "plugins", "check", file, NULL), cases[i].rc);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, cases[i].needle));
        if (cases[i].also) CU_ASSERT_PTR_NOT_NULL(strstr(out, cases[i].also));
    }
    /* list --json with the crashing file absent */
    snprintf(file, sizeof file, "%s/libkiln-crash.so", d);
    CU_ASSERT_EQUAL(unlink(file), 0);
    CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "plugins", "list", "--json", "--plugin-dir", d, NULL), 0);
    static const char *const listed[] = {"\"precision\":\"t16-mixed\"", "\"amp_backend\":\"native\"",
                                         "\"aliases\":[\"t16\",\"tfp16\"]", "\"status\":\"refused\""};
    for (size_t i = 0; i < sizeof listed / sizeof listed[0]; i++) CU_ASSERT_PTR_NOT_NULL(strstr(out, listed[i]));
    tu_rmrf(d);
    free(d);
}

static void register_tests(void) {
    CU_pSuite s = CU_add_suite("loader", NULL, NULL);
    CU_add_test(s, "wrong ABI major", test_wrong_major);
    CU_add_test(s, "missing entry symbol", test_missing_entry);
    CU_add_test(s, "short library struct_size", test_short_library);
    CU_add_test(s, "requires newer host minor", test_newer_host_minor);
    CU_add_test(s, "init fails with message", test_init_fails);
    CU_add_test(s, "short ops table", test_short_ops);
    CU_add_test(s, "short plugin descriptor", test_short_desc);
    CU_add_test(s, "several plugins, aliases, properties", test_good_several_plugins);
    CU_add_test(s, "plugin built against frozen 1.0 headers", test_old_abi_plugin_loads);
    CU_add_test(s, "unknown kind skipped", test_unknown_kind_skipped);
    CU_add_test(s, "bad property type", test_bad_property_type);
    CU_add_test(s, "duplicate names", test_duplicate_names);
    CU_add_test(s, "built-in not replaced implicitly", test_builtin_not_replaced_implicitly);
    CU_add_test(s, "world-writable directory", test_world_writable_dir);
    CU_add_test(s, "group-writable ancestor", test_group_writable_ancestor);
    CU_add_test(s, "group-writable file", test_group_writable_file);
    CU_add_test(s, "setuid file", test_setuid_file);
    CU_add_test(s, "foreign owner", test_foreign_owner);
    CU_add_test(s, "symlink", test_symlink);
    CU_add_test(s, "relative directory", test_relative_dir);
    CU_add_test(s, "other file names ignored", test_other_names_ignored);
    CU_add_test(s, "kiln plugins check/list", test_cli_check);
}

#include "cunit_main.h"
