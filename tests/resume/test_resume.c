/*
 * tests/resume/test_resume.c — "a run killed with SIGKILL at any point and
 * resumed from its last checkpoint ends with weights bit-identical to an
 * uninterrupted run". The killer fixture requests a checkpoint after every
 * batch (written at the end of the batch) and kills the process on cue:
 * before the first checkpoint, at a batch's start, at a batch's end (before
 * that batch's checkpoint is written), during a mid-epoch validation, at an
 * epoch's end; and SIGTERM, which kiln answers by finishing the batch,
 * checkpointing and exiting with 143. Each case resumes with `--ckpt last`
 * and compares the final weights with the uninterrupted run's. The stack
 * is mlp + AdamW (stateful) under 16-mixed (a stateful scaler) with
 * mid-epoch validation.
 */
#include <dirent.h>
#include <glob.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "testutil.h"

static const char *JOB =
    "trainer = { max_epochs = 3; seed = 9; num_sanity_val_steps = 1; val_check_interval = 0.5; };\n"
    "data = { name = \"toydata\"; n_train = 6; n_val = 2; features = 3; };\n"
    "module = { name = \"mlp\"; layers = [3, 8, 2]; max_batch = 4; };\n"
    "optimizer = { name = \"adamw\"; lr = 0.01; };\n"
    "precision = { name = \"16-mixed\"; init_scale = 4096.0; growth_interval = 5; };\n";

/* fit with the killer callback; returns the exit status */
static int run(const char *root, const char *killer, const char *extra, char *out, size_t outlen) {
    char cfg[4300], root_set[4400];
    tu_write_jobf(tu_job_path(cfg, sizeof cfg, tu_suite_dir, "r"), "%scallbacks = ( { name = \"killer\"; %s } );\n", JOB,
                  killer);
    tu_root_set(root_set, sizeof root_set, "%s", root);
    const char *args[] = {"-q", "fit", cfg, "--set", root_set, NULL};
    return tu_run_kiln(args, extra, out, outlen);
}

static char g_full[4300];

static void test_uninterrupted(void) {
    char out[16384], root[4300], killer[4600];
    snprintf(g_full, sizeof g_full, "%s/full.bin", tu_suite_dir);
    snprintf(root, sizeof root, "%s/full", tu_suite_dir);
    snprintf(killer, sizeof killer, "dump = \"%s\";", g_full);
    tu_require_ok(run(root, killer, NULL, out, sizeof out), out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 18 "));
}

/* kill on cue, resume from last, compare */
static void kill_case(const char *tag, const char *cue, int expect_status) {
    char out[32768], root[4300], killer[4600], dump[4300];
    snprintf(root, sizeof root, "%s/%s", tu_suite_dir, tag);
    snprintf(dump, sizeof dump, "%s/%s.bin", tu_suite_dir, tag);
    snprintf(killer, sizeof killer, "%s dump = \"%s\";", cue, dump);
    int rc = run(root, killer, NULL, out, sizeof out);
    if (expect_status >= 0) {
        CU_ASSERT_EQUAL(rc, expect_status);
    } else {
        CU_ASSERT_NOT_EQUAL(rc, 0);
    }
    if (expect_status < 0) { /* killed: no on_fit_end ran */
        CU_ASSERT_NOT_EQUAL(access(dump, F_OK), 0); /* the weights were never dumped */
    } else { /* stopped cleanly: says where to resume from */
        CU_ASSERT_PTR_NOT_NULL(strstr(out, "SIGTERM: stopped after epoch 1, batch 2"));
        CU_ASSERT_PTR_NOT_NULL(strstr(out, "checkpoints/last.safetensors resumes it"));
    }
    /* resume without the cue */
    snprintf(killer, sizeof killer, "dump = \"%s\";", dump);
    rc = run(root, killer, "--ckpt last", out, sizeof out);
    if (rc) fprintf(stderr, "\n[%s] %s\n", tag, out);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 18 "));
    rc = tu_same_file(g_full, dump);
    if (rc != 1) fprintf(stderr, "\n[%s] weights differ: %s, %s\n", tag, g_full, dump);
    CU_ASSERT_EQUAL(rc, 1);
}

static void test_kill_before_first_checkpoint(void) {
    kill_case("k0", "kill_at = \"batch_start\"; kill_epoch = 0; kill_batch = 0;", -1);
}
static void test_kill_mid_epoch(void) {
    kill_case("k1", "kill_at = \"batch_end\"; kill_epoch = 1; kill_batch = 3;", -1);
    kill_case("k2", "kill_at = \"batch_start\"; kill_epoch = 2; kill_batch = 1;", -1);
}
static void test_kill_during_validation(void) {
    kill_case("k3", "kill_at = \"validation\"; kill_epoch = 1; kill_batch = 1;", -1);
}
static void test_kill_at_epoch_end(void) {
    kill_case("k4", "kill_at = \"epoch_end\"; kill_epoch = 0;", -1);
}
static void test_sigterm(void) {
    /* SIGTERM: the batch finishes, last.safetensors is written, exit 143 */
    kill_case("k5", "kill_at = \"batch_end\"; kill_epoch = 1; kill_batch = 2; signal = \"TERM\"; every = 0;", 143);
}

/* SIGTERM on the last batch of an epoch (issue: a checkpoint there lacked
 * what the epoch end reads): early stopping checking val_loss at
 * on_train_epoch_end (strict), a plateau schedule on val_loss and the
 * checkpoint callback ranking by it all need the callback metrics of that
 * epoch's validation, and the epoch means need the batches run before the
 * stop. The resume must succeed and end with the uninterrupted run's
 * weights and the same best checkpoint. */
static const char *EPOCH_END_CBS =
    "{ name = \"early_stopping\"; monitor = \"val_loss\"; patience = 50; strict = true; check_on_train_epoch_end = true; },\n"
    "{ name = \"checkpoint\"; monitor = \"train_loss_epoch\"; save_top_k = 1; filename = \"best-{epoch}\"; },\n"
    "{ name = \"killer\"; %s dump = \"%s\"; }";

static int run_epoch_end(const char *root, const char *cue, const char *dump, const char *extra, char *out,
                         size_t outlen) {
    char cfg[4300], root_set[4400], cbs[8192];
    snprintf(cbs, sizeof cbs, EPOCH_END_CBS, cue, dump);
    tu_write_jobf(tu_job_path(cfg, sizeof cfg, tu_suite_dir, "ee"),
                  "%s"
                  "scheduler = { name = \"plateau\"; interval = \"epoch\"; monitor = \"val_loss\"; patience = 0; factor = 0.5; };\n"
                  "callbacks = ( %s );\n",
                  JOB, cbs);
    tu_root_set(root_set, sizeof root_set, "%s", root);
    const char *args[] = {"-q", "fit", cfg, "--set", root_set, "--set", "trainer.val_check_interval=1.0", NULL};
    return tu_run_kiln(args, extra, out, outlen);
}

/* The last, in name order, of the files holding `needle` in
 * <root>/<versions>/checkpoints, `versions` a glob pattern (ls | grep |
 * sort | tail -1); "" when there is none. */
static void last_name(const char *root, const char *versions, const char *needle, char *out, size_t n) {
    char pattern[4400];
    snprintf(pattern, sizeof pattern, "%s/%s/checkpoints/*", root, versions);
    out[0] = 0;
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0) return;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *name = strrchr(g.gl_pathv[i], '/') + 1;
        if (strstr(name, needle) && strcmp(name, out) > 0) snprintf(out, n, "%s", name);
    }
    globfree(&g);
}

/* The number of entries of `dir` whose names match the basic regular
 * expression `re` (ls | grep -c); -1 when the directory cannot be read. */
static int count_matching(const char *dir, const char *re) {
    regex_t rx;
    if (regcomp(&rx, re, REG_NOSUB) != 0) return -1;
    DIR *d = opendir(dir);
    int n = d ? 0 : -1;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.' && regexec(&rx, e->d_name, 0, NULL, 0) == 0;
    if (d) closedir(d);
    regfree(&rx);
    return n;
}

static void test_sigterm_last_batch(void) {
    char out[32768], full[4300], part[4300], wa[4300], wb[4300], best_a[4400], best_b[4400];
    snprintf(full, sizeof full, "%s/ee-full", tu_suite_dir);
    snprintf(part, sizeof part, "%s/ee-part", tu_suite_dir);
    snprintf(wa, sizeof wa, "%s/ee-full.bin", tu_suite_dir);
    snprintf(wb, sizeof wb, "%s/ee-part.bin", tu_suite_dir);
    int rc = run_epoch_end(full, "", wa, NULL, out, sizeof out);
    tu_require_ok(rc, out);
    /* batch 5 is epoch 1's last: it finishes (validation included), the
     * checkpoint is written, exit 143 */
    rc = run_epoch_end(part, "kill_at = \"batch_end\"; kill_epoch = 1; kill_batch = 5; signal = \"TERM\"; every = 0;",
                       wb, NULL, out, sizeof out);
    CU_ASSERT_EQUAL(rc, 143);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "SIGTERM: stopped after epoch 1, batch 5"));
    rc = run_epoch_end(part, "", wb, "--ckpt last", out, sizeof out);
    tu_require_ok(rc, out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 18 "));
    rc = tu_same_file(wa, wb);
    if (rc != 1) fprintf(stderr, "\nweights differ: %s, %s\n", wa, wb);
    CU_ASSERT_EQUAL(rc, 1);
    /* the same best checkpoint: the train_loss_epoch ranking saw every batch */
    last_name(full, "version_*", "best", best_a, sizeof best_a);
    last_name(part, "version_1", "best", best_b, sizeof best_b);
    CU_ASSERT_STRING_EQUAL(best_a, best_b);
    CU_ASSERT_PTR_NOT_NULL(strstr(best_a, "best-2"));
}

/* --weights-only: a new run from the weights, with another optimizer and
 * precision; a resume of the same checkpoint with them is refused. */
static void test_weights_only(void) {
    char out[32768], root[4300], cfg_extra[9000];
    snprintf(root, sizeof root, "%s/full", tu_suite_dir); /* the reference run's checkpoints */
    snprintf(cfg_extra, sizeof cfg_extra, "--ckpt last --set optimizer.name=sgd --set precision=32-true");
    CU_ASSERT_EQUAL(run(root, "", cfg_extra, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "resume with the same stack"));
    snprintf(cfg_extra, sizeof cfg_extra,
             "--ckpt last --weights-only --set optimizer.name=sgd --set precision=32-true --set trainer.max_epochs=1");
    tu_check_ok(run(root, "", cfg_extra, out, sizeof out), out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 6 ")); /* a new run: epoch 0 again */
    CU_ASSERT_EQUAL(run(root, "", "--weights-only", out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "--weights-only needs --ckpt"));
}

/* JOB with `callbacks` in <suite dir>/<name>.cfg, its runs under
 * <suite dir>/<name>: the root (4300 bytes), the run file (4300) and the
 * --set value for the root (4400). */
static void named_job(const char *name, const char *callbacks, char *root, char *cfg, char *root_set) {
    snprintf(root, 4300, "%s/%s", tu_suite_dir, name);
    snprintf(cfg, 4300, "%s/%s.cfg", tu_suite_dir, name);
    tu_write_jobf(cfg, "%scallbacks = ( %s );\n", JOB, callbacks);
    tu_root_set(root_set, 4400, "%s", root);
}

/* The checkpoint callback end to end: top-2 by val_loss over 3 epochs
 * keeps exactly two files, named from the template; one of them resumes. */
static void test_checkpoint_callback(void) {
    char out[32768], root[4300], cfg[4300], dir[4400], root_set[4400];
    named_job("topk",
              "{ name = \"checkpoint\"; monitor = \"val_loss\"; save_top_k = 2; filename = \"epoch={epoch}-{val_loss:.4f}\"; }",
              root, cfg, root_set);
    const char *fit[] = {"-q", "fit", cfg, "--set", root_set, NULL};
    int rc = tu_run_kiln(fit, NULL, out, sizeof out);
    tu_require_ok(rc, out);
    snprintf(dir, sizeof dir, "%s/version_0/checkpoints", root);
    CU_ASSERT_EQUAL(count_matching(dir, "^epoch=[0-9]*-[0-9.]*\\.safetensors$"), 2);
    /* the first of the top-k files, in name order */
    char pattern[4400], first[4400] = "";
    glob_t g;
    snprintf(pattern, sizeof pattern, "%s/version_0/checkpoints/epoch=*", root);
    if (glob(pattern, 0, NULL, &g) == 0) {
        snprintf(first, sizeof first, "%s", g.gl_pathv[0]);
        globfree(&g);
    }
    const char *resume[] = {"-q", "fit", cfg, "--set", root_set, "--set", "trainer.max_epochs=4", "--ckpt", first, NULL};
    rc = tu_run_kiln(resume, NULL, out, sizeof out);
    tu_check_ok(rc, out);
}

/* nan_guard stops the run at a NaN weight, naming it; the last checkpoint
 * written before it stays loadable and finite. */
static void test_nan_guard_keeps_last_good(void) {
    char out[32768], root[4300], cfg[4300], root_set[4400];
    named_job("nan",
              "{ name = \"killer\"; kill_at = \"batch_end\"; kill_epoch = 1; kill_batch = 2; signal = \"POISON\"; }, "
              "{ name = \"nan_guard\"; }",
              root, cfg, root_set);
    const char *fit[] = {"-q", "fit", cfg, "--set", root_set, NULL};
    CU_ASSERT_EQUAL(tu_run_kiln(fit, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "nan_guard: parameter layers.0.weight[0] is nan"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "epoch 1, batch 2"));
    const char *validate[] = {"validate", cfg, "--set", root_set, "--ckpt", "last", NULL};
    tu_check_ok(tu_run_kiln(validate, NULL, out, sizeof out), out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "global step 8)")); /* the checkpoint after epoch 1, batch 1 */
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "val_loss="));
    CU_ASSERT_PTR_NULL(strstr(out, "=nan")); /* finite metrics from the last good weights */
}

static CU_TestInfo cases_resume[] = {
    {"uninterrupted reference run", test_uninterrupted},
    {"SIGKILL before the first checkpoint", test_kill_before_first_checkpoint},
    {"SIGKILL mid-epoch", test_kill_mid_epoch},
    {"SIGKILL during validation", test_kill_during_validation},
    {"SIGKILL at an epoch's end", test_kill_at_epoch_end},
    {"SIGTERM: checkpoint and clean exit", test_sigterm},
    {"SIGTERM on an epoch's last batch: exact resume", test_sigterm_last_batch},
    {"--weights-only into another stack", test_weights_only},
    {"checkpoint callback: top-k files, resume from one", test_checkpoint_callback},
    {"nan_guard stops; the last checkpoint stays good", test_nan_guard_keeps_last_good},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    CU_SuiteInfo suites[] = {
        {.pName = "resume", .pInitFunc = tu_suite_dir_init, .pCleanupFunc = tu_suite_dir_clean, .pTests = cases_resume},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
