/*
 * tests/manual/test_manual.c — manual optimisation end to end, through the
 * kiln executable with the manualmod fixture (two parameter groups, two
 * optimizers): the exact hook sequence of one batch (docs/manual-optimization.md) and
 * the hooks that never run in manual mode; toggle_optimizer leaving the
 * other group's gradients untouched (and the same fixture without the
 * toggle proving the check can fail); step-every-N with global_step
 * counting every optimizer step; a closure given to optimizer_step called
 * by the optimizer; a scaler stepping in manual mode; bit-identical resume
 * with both optimizer states; and the refusals (several optimizers in
 * automatic mode, accumulation in manual mode, patterns matching nothing,
 * both optimizer and optimizers).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "testutil.h"

/* `kiln fit` (or `config check`) of fixtures dir + body; returns the exit status. */
/* `extra`: the arguments after the run file, NULL-terminated (TU_ARGS), or NULL. */
static int kiln(const char *verb, const char *body, const char *const extra[], char *out, size_t outlen) {
    char cfg[4200], root[4400];
    tu_write_job(tu_job_path(cfg, sizeof cfg, tu_suite_dir, "m"), body);
    if (!strcmp(verb, "check")) return tu_run_kiln_a(TU_ARGS("config", "check", cfg), extra, out, outlen);
    tu_root_set(root, sizeof root, "%s/runs", tu_suite_dir);
    return tu_run_kiln_a(TU_ARGS("-q", "fit", cfg, "--set", root), extra, out, outlen);
}

/* A two-optimizer manual job; `module_extra` goes into the module section. */
static void job(char *buf, size_t n, const char *module_extra, const char *rec, const char *trace, int n_train,
                const char *precision) {
    char cb[9000] = "";
    if (trace) snprintf(cb, sizeof cb, "callbacks = ( { name = \"hook_trace\"; path = \"%s\"; } );\n", trace);
    snprintf(buf, n,
             "trainer = { max_epochs = 1; num_sanity_val_steps = 0; };\n"
             "data = { name = \"toydata\"; n_train = %d; n_val = 1; };\n"
             "module = { name = \"manualmod\"; path = \"%s\"; %s };\n"
             "precision = \"%s\";\n"
             "optimizers = ( { name = \"sgd\"; params = [\"a.*\"]; lr = 0.05; },\n"
             "               { name = \"sgd\"; params = [\"b.*\"]; lr = 0.02; momentum = 0.9; } );\n%s",
             n_train, rec, module_extra, precision, cb);
}

static int count_lines(const char *path, const char *prefix) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += !strncmp(line, prefix, strlen(prefix));
    fclose(f);
    return n;
}

/* The lines of `path` between the first line starting `from` and the first
 * starting `to` (inclusive), joined with '|'. */
static void slice(const char *path, const char *from, const char *to, char *out, size_t n) {
    FILE *f = fopen(path, "r");
    out[0] = 0;
    if (!f) return;
    char line[512];
    int on = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!on && !strcmp(line, from)) on = 1;
        if (on) snprintf(out + strlen(out), n - strlen(out), "%s|", line);
        if (on && !strcmp(line, to)) break;
    }
    fclose(f);
}

static void test_hook_sequence(void) {
    char out[16384], rec[4300], trace[4300], body[16384], got[16384];
    snprintf(rec, sizeof rec, "%s/seq.txt", tu_suite_dir);
    snprintf(trace, sizeof trace, "%s/seq-trace.txt", tu_suite_dir);
    job(body, sizeof body, "", rec, trace, 2, "32-true");
    tu_require_ok(kiln("fit", body, NULL, out, sizeof out), out);
    slice(trace, "callback on_train_batch_start batch=0", "module on_train_batch_end batch=0", got, sizeof got);
#define OPT(i)                                                                                                     \
    "host toggle_optimizer[" #i "] batch=0|strategy pre_backward batch=0|precision pre_backward batch=0|"           \
    "callback on_before_backward batch=0|module on_before_backward batch=0|module backward batch=0|"               \
    "callback on_after_backward batch=0|module on_after_backward batch=0|strategy post_backward batch=0|"          \
    "precision optimizer_step batch=0|optimizer step[" #i "] batch=0|callback on_before_optimizer_step batch=0|"   \
    "module on_before_optimizer_step batch=0|optimizer zero_grad[" #i "] batch=0|host untoggle_optimizer[" #i      \
    "] batch=0|"
    const char *expect = "callback on_train_batch_start batch=0|module on_train_batch_start batch=0|"
                         "strategy on_train_batch_start batch=0|module training_step batch=0|" OPT(0) OPT(1)
                         "callback on_train_batch_end batch=0|module on_train_batch_end batch=0|";
#undef OPT
    if (strcmp(got, expect)) fprintf(stderr, "\n  got:    %s\n  expect: %s\n", got, expect);
    CU_ASSERT_STRING_EQUAL(got, expect);
    /* never in manual mode (Lightning runs no automatic step then) */
    const char *never[] = {"module optimizer_step", "module optimizer_zero_grad", "callback on_before_zero_grad",
                           "module on_before_zero_grad", "module configure_gradient_clipping"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++) CU_ASSERT_EQUAL(count_lines(trace, never[i]), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 4 ")); /* 2 batches x 2 optimizers */
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "optimizer=sgd+sgd (manual optimization)"));
}

/* "g" lines: the other group's gradient before and after a backward. */
static int other_grads_untouched(const char *rec, int *nlines) {
    FILE *f = fopen(rec, "r");
    if (!f) return -1;
    char line[512];
    int same = 1;
    *nlines = 0;
    while (fgets(line, sizeof line, f)) {
        double b0, b1, a0, a1;
        if (sscanf(line, "g %*d %*d %lf %lf %lf %lf", &b0, &b1, &a0, &a1) != 4) continue;
        (*nlines)++;
        same &= b0 == a0 && b1 == a1;
    }
    fclose(f);
    return same;
}

static void test_toggle(void) {
    char out[16384], rec[4300], body[16384];
    snprintf(rec, sizeof rec, "%s/toggle.txt", tu_suite_dir);
    job(body, sizeof body, "every_0 = 2; every_1 = 2;", rec, NULL, 4, "32-true");
    CU_ASSERT_EQUAL_FATAL(kiln("fit", body, NULL, out, sizeof out), 0);
    int n = 0;
    CU_ASSERT_EQUAL(other_grads_untouched(rec, &n), 1);
    CU_ASSERT_EQUAL(n, 8);
    /* the same without toggling: the other group's gradients do change */
    job(body, sizeof body, "every_0 = 2; every_1 = 2; use_toggle = 0;", rec, NULL, 4, "32-true");
    CU_ASSERT_EQUAL_FATAL(kiln("fit", body, NULL, out, sizeof out), 0);
    CU_ASSERT_EQUAL(other_grads_untouched(rec, &n), 0);
}

static void test_step_every_n(void) {
    char out[16384], rec[4300], body[16384];
    snprintf(rec, sizeof rec, "%s/every.txt", tu_suite_dir);
    job(body, sizeof body, "every_0 = 2; every_1 = 4;", rec, NULL, 8, "32-true");
    CU_ASSERT_EQUAL_FATAL(kiln("fit", body, NULL, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 6 ")); /* 4 + 2: every optimizer step counts */
    CU_ASSERT(tu_join_fields(rec, "s ", NULL, 2, 3, '|', out, sizeof out) >= 0);
    CU_ASSERT_STRING_EQUAL(out, "1 0|3 0|3 1|5 0|7 0|7 1|");
}

static void test_closure_and_scaler(void) {
    char out[16384], rec[4300], body[16384];
    snprintf(rec, sizeof rec, "%s/closure.txt", tu_suite_dir);
    job(body, sizeof body, "pass_closure = 1;", rec, NULL, 3, "32-true");
    CU_ASSERT_EQUAL_FATAL(kiln("fit", body, NULL, out, sizeof out), 0);
    /* grep '^c ' | cut -d' ' -f4 | sort | uniq -c: every step's closure count */
    CU_ASSERT(tu_join_fields(rec, "c ", NULL, 4, 4, '\n', out, sizeof out) >= 0);
    CU_ASSERT_STRING_EQUAL(out, "1\n1\n1\n1\n1\n1\n"); /* sgd calls the module's closure once per step */
    /* 16-mixed in manual mode: the no-op closure has no loss, yet it steps */
    job(body, sizeof body, "", rec, NULL, 3, "16-mixed");
    tu_require_ok(kiln("fit", body, NULL, out, sizeof out), out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 6  skipped steps: 0"));
    CU_ASSERT_EQUAL(count_lines(rec, "s "), 6);
    CU_ASSERT(tu_join_fields(rec, "s ", NULL, 0, 0, '\n', out, sizeof out) >= 0);
    int ends_0 = 0; /* grep -c '^s .* 0$' */
    for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        ends_0 += strlen(l) >= 3 && !strcmp(l + strlen(l) - 2, " 0");
    CU_ASSERT_EQUAL(ends_0, 6);
}

static void test_resume_two_optimizers(void) {
    char out[32768], rec[4300], body[16384], root[4400], cbs[4400], wa[4300], wb[4300];
    snprintf(rec, sizeof rec, "%s/resume.txt", tu_suite_dir);
    snprintf(wa, sizeof wa, "%s/wm-full.bin", tu_suite_dir);
    snprintf(wb, sizeof wb, "%s/wm-resumed.bin", tu_suite_dir);
    job(body, sizeof body, "every_1 = 2;", rec, NULL, 4, "32-true");
    char *p = strstr(body, "max_epochs = 1");
    p[13] = '2';
    snprintf(root, sizeof root, "trainer.default_root_dir=\"%s/rfull\"", tu_suite_dir);
    snprintf(cbs, sizeof cbs, "callbacks=({name=\"weightdump\"; path=\"%s\";})", wa);
    CU_ASSERT_EQUAL_FATAL(kiln("fit", body, TU_ARGS("--set", root, "--set", cbs), out, sizeof out), 0);
    snprintf(root, sizeof root, "trainer.default_root_dir=\"%s/rpart\"", tu_suite_dir);
    CU_ASSERT_EQUAL_FATAL(kiln("fit", body, TU_ARGS("--set", root, "--set", "trainer.max_epochs=1"), out, sizeof out), 0);
    snprintf(cbs, sizeof cbs, "callbacks=({name=\"weightdump\"; path=\"%s\";})", wb);
    tu_require_ok(kiln("fit", body, TU_ARGS("--set", root, "--ckpt", "last", "--set", cbs), out, sizeof out), out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 12 ")); /* 2 epochs x (4 + 2) */
    CU_ASSERT_EQUAL(tu_same_file(wa, wb), 1); /* momentum buffer of optimizers.1 restored too */
}

static void test_refusals(void) {
    char out[16384], rec[4300], body[16384];
    snprintf(rec, sizeof rec, "%s/refuse.txt", tu_suite_dir);
    /* several optimizers with an automatic module */
    const char *auto2 = "data = { name = \"toydata\"; };\nmodule = { name = \"toymod\"; };\n"
                        "optimizers = ( { name = \"sgd\"; params = [\"linear.weight\"]; },"
                        " { name = \"sgd\"; params = [\"linear.bias\"]; } );\n";
    CU_ASSERT_EQUAL(kiln("check", auto2, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "module 'toymod' uses automatic optimization"));
    CU_ASSERT_EQUAL(kiln("fit", auto2, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "must optimise manually"));
    /* accumulation in manual mode */
    job(body, sizeof body, "", rec, NULL, 2, "32-true");
    CU_ASSERT_EQUAL(kiln("check", body, TU_ARGS("--set", "trainer.accumulate_grad_batches=2"), out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "not available in manual optimization"));
    CU_ASSERT_EQUAL(kiln("fit", body, TU_ARGS("--set", "trainer.accumulate_grad_batches=2"), out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "not available in manual optimization"));
    /* a pattern that matches nothing names the parameters there are */
    char *p = strstr(body, "\"b.*\"");
    memcpy(p, "\"c.*\"", 5);
    CU_ASSERT_EQUAL(kiln("fit", body, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "optimizers.[1].params matches no parameter of module 'manualmod' "
                                       "(its parameters: a.w, b.w)"));
    /* both forms at once; an unknown optimizer key is still caught */
    job(body, sizeof body, "", rec, NULL, 2, "32-true");
    strcat(body, "optimizer = \"sgd\";\n");
    CU_ASSERT_EQUAL(kiln("check", body, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "both 'optimizer' and 'optimizers' are set"));
    job(body, sizeof body, "", rec, NULL, 2, "32-true");
    CU_ASSERT_EQUAL(kiln("check", body, TU_ARGS("--set", "optimizers.[0].lrr=0.1"), out, sizeof out), 1);
    /* a service called outside training_step is refused (the fixture checks) */
    job(body, sizeof body, "bad_call = 1;", rec, NULL, 2, "32-true");
    CU_ASSERT_EQUAL(kiln("fit", body, NULL, out, sizeof out), 0);
}

/* LBFGS in automatic mode (docs/semantics.md, the closure): every closure call runs
 * training_step, zero_grad, backward and on_before_optimizer_step; the
 * optimizer steps once per batch. */
static void test_lbfgs_automatic(void) {
    char out[16384], trace[4300], body[8192];
    tu_traced_job(body, sizeof body, trace, sizeof trace, tu_suite_dir, "lbfgs-trace.txt",
                  TU_TOY_EPOCH(2, 1, "")
                  "optimizer = { name = \"lbfgs\"; lr = 0.1; max_iter = 5; tolerance_grad = 0.0; tolerance_change = 0.0; };\n");
    tu_require_ok(kiln("fit", body, NULL, out, sizeof out), out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 2 "));
    const char *per_call[] = {"module training_step", "optimizer zero_grad", "module optimizer_zero_grad",
                              "callback on_before_zero_grad", "module backward", "callback on_before_optimizer_step",
                              "module configure_gradient_clipping"};
    for (int b = 0; b < 2; b++) {
        for (size_t i = 0; i < sizeof per_call / sizeof per_call[0]; i++) {
            char line[256];
            snprintf(line, sizeof line, "%s batch=%d", per_call[i], b);
            tu_expect_lines(trace, line, 5); /* max_iter closure calls */
        }
        char line[256];
        snprintf(line, sizeof line, "optimizer step batch=%d", b);
        CU_ASSERT_EQUAL(tu_count_lines(trace, line), 1);
    }
    /* a loss-scaling precision refuses it, by properties, at config check */
    CU_ASSERT_EQUAL(kiln("check", body, TU_ARGS("--set", "precision=16-mixed"), out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "cannot drive optimizer 'lbfgs'"));
    CU_ASSERT_EQUAL(kiln("check", body, TU_ARGS("--set", "precision=bf16-mixed"), out, sizeof out), 0);
}

static CU_TestInfo cases_manual[] = {
    {"hook sequence of one manual batch", test_hook_sequence},
    {"toggle leaves the other optimizer's gradients", test_toggle},
    {"step every N, global_step counts every step", test_step_every_n},
    {"closures and a scaler in manual mode", test_closure_and_scaler},
    {"resume restores both optimizers", test_resume_two_optimizers},
    {"refusals", test_refusals},
    {"lbfgs in automatic mode: hooks per closure call", test_lbfgs_automatic},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    CU_SuiteInfo suites[] = {
        {.pName = "manual", .pInitFunc = tu_suite_dir_init, .pCleanupFunc = tu_suite_dir_clean, .pTests = cases_manual},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
