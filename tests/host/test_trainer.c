/*
 * tests/host/test_trainer.c — the trainer against Lightning's contract
 * (docs/semantics.md), through the real `kiln fit`
 * with the toy fixtures and the hook_trace callback:
 *  (a) the whole hook sequence of 1 epoch with 2 train + 2 val batches and
 *      the default 2-batch sanity check, written out from Lightning's
 *      test_hooks.py (fit with validation), batch by batch;
 *  (b) accumulate_grad_batches = 2 over 5 batches, and the optimizer call
 *      pattern of test_train_loop_system with accumulate = 3;
 *  (c) -1 from on_train_batch_start ending the epoch without validation;
 *  (d) max_steps stopping mid-epoch;
 *  (e) min_epochs holding back a stop request;
 * and the closure (zero-grad placement, a step that returns no loss), the
 * run directory, limits and validation placement, and bit-identical weights
 * for the same seed.
 */
#define _GNU_SOURCE
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "safetensors.h"
#include "testutil.h"

static char *g_dir;
static int g_loud; /* fit() without -q: warnings reach `out` */
static char *lines[8192];
static int nlines;

/* The pieces of a run file most tests share: the toy data with its
 * batch counts, the toy module with extra keys ("" for none, else each
 * "k = v; "), plain SGD, the resume tests' AdamW. */
#define TOY_DATA(n_train, n_val) "data = { name = \"toydata\"; n_train = " #n_train "; n_val = " #n_val "; };\n"
#define TOY_MODULE(keys) "module = { name = \"toymod\"; " keys "};\n"
#define SGD "optimizer = { name = \"sgd\"; lr = 0.1; };\n"
#define ADAMW "optimizer = { name = \"adamw\"; lr = 0.05; };\n"
/* One callback with a path, given as the format's %s. */
#define CALLBACK_AT(name) "callbacks = ( { name = \"" name "\"; path = \"%s\"; } );\n"

static void free_lines(void) {
    for (int i = 0; i < nlines; i++) free(lines[i]);
    nlines = 0;
}

static void read_lines(const char *path) {
    free_lines();
    FILE *f = fopen(path, "r");
    if (!f) return;
    char buf[512];
    while (nlines < 8192 && fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = 0;
        lines[nlines++] = strdup(buf);
    }
    fclose(f);
}

/* Write a run file from `body` (plus plugin dirs and the trace callback),
 * run `kiln fit` with the `extra` arguments (NULL-terminated, or NULL),
 * load the trace. Returns the exit status; the output is in `out`. */
static int fit_argv(const char *body, const char *const extra[], char *out, size_t outlen) {
    static int k;
    char cfg[4200], trace[4200], text[16384];
    snprintf(cfg, sizeof cfg, "%s/run%d.cfg", g_dir, k);
    snprintf(trace, sizeof trace, "%s/hooks%d.txt", g_dir, k);
    k++;
    snprintf(text, sizeof text,
             "plugins = { dirs = [\"%s\"]; };\n"
             "%s\n",
             getenv("KILN_TRAIN_FIXTURES"), body);
    if (!strstr(body, "callbacks"))
        snprintf(text + strlen(text), sizeof text - strlen(text), CALLBACK_AT("hook_trace"), trace);
    CU_ASSERT_EQUAL_FATAL(tu_write(cfg, text), 0);
    char root[4200];
    snprintf(root, sizeof root, "trainer.default_root_dir=\"%s/runs\"", g_dir);
    const char *quiet[] = {"-q", "fit", cfg, "--set", root, NULL};
    int rc = tu_run_kiln_a(g_loud ? quiet + 1 : quiet, extra, out, outlen);
    read_lines(trace);
    return rc;
}

/* fit_argv with `extra` as words split at spaces (none holds a space). */
static int fit(const char *body, const char *extra, char *out, size_t outlen) {
    char words[4096], *argv[32];
    argv[tu_split_words(extra, words, sizeof words, argv, 0, 31)] = NULL;
    return fit_argv(body, (const char *const *)argv, out, outlen);
}

static const char *BASE =
    "trainer = { max_epochs = 1; seed = 7; };\n"
    TOY_DATA(2, 2) TOY_MODULE("") SGD;

/* The run file <g_dir>/<name>.cfg: the fixtures' plugin directory, then
 * `body`, for the tests that run kiln themselves (checkpoints, resumes).
 * Its path in cfg; 0, or -1 when it cannot be written. */
static int write_run(char *cfg, size_t n, const char *name, const char *body) {
    char text[16384];
    snprintf(cfg, n, "%s/%s.cfg", g_dir, name);
    snprintf(text, sizeof text, "plugins = { dirs = [\"%s\"]; };\n%s", getenv("KILN_TRAIN_FIXTURES"), body);
    return tu_write(cfg, text);
}

/* rc, after printing `out` when it is not 0 (what kiln said is the first
 * thing to read when a run that should pass fails). */
static int shown(int rc, const char *out) {
    if (rc) fprintf(stderr, "\n%s\n", out);
    return rc;
}

/* What the last fit_ok run printed: most tests run a config that must
 * pass and then read its summary, so one buffer serves them all. */
static char g_out[16384];

/* fit() that must exit 0, into g_out (printed when it does not); a
 * failure ends the test, as the run's trace would be meaningless. */
static void fit_ok(const char *body, const char *extra) {
    CU_ASSERT_EQUAL_FATAL(shown(fit(body, extra, g_out, sizeof g_out), g_out), 0);
}

static void expect_sequence(const char *const *exp, int n) {
    int ok = nlines == n;
    for (int i = 0; ok && i < n; i++) ok = !strcmp(lines[i], exp[i]);
    if (!ok) {
        int i = 0;
        while (i < n && i < nlines && !strcmp(lines[i], exp[i])) i++;
        fprintf(stderr, "\n  trace differs at line %d: got '%s', expected '%s' (%d lines, expected %d)\n", i + 1,
                i < nlines ? lines[i] : "<end>", i < n ? exp[i] : "<end>", nlines, n);
    }
    CU_ASSERT(ok);
}

/* (a) Lightning's fit hook order (test_hooks.py) with its batches and validation placement */
static const char *const SEQ_A[] = {
    "callback setup", "module setup", "callback on_fit_start", "module on_fit_start",
    /* sanity check: min(num_sanity_val_steps=2, 2) batches */
    "callback on_sanity_check_start stage=sanity", "module on_validation_model_eval stage=sanity",
    "callback on_validation_start stage=sanity", "module on_validation_start stage=sanity",
    "callback on_validation_epoch_start stage=sanity", "module on_validation_epoch_start stage=sanity",
    "callback on_validation_batch_start batch=0 stage=sanity", "module on_validation_batch_start batch=0 stage=sanity",
    "module validation_step batch=0 stage=sanity", "callback on_validation_batch_end batch=0 stage=sanity",
    "module on_validation_batch_end batch=0 stage=sanity", "callback on_validation_batch_start batch=1 stage=sanity",
    "module on_validation_batch_start batch=1 stage=sanity", "module validation_step batch=1 stage=sanity",
    "callback on_validation_batch_end batch=1 stage=sanity", "module on_validation_batch_end batch=1 stage=sanity",
    "callback on_validation_epoch_end stage=sanity", "module on_validation_epoch_end stage=sanity",
    "callback on_validation_end stage=sanity", "module on_validation_end stage=sanity",
    "module on_validation_model_train stage=sanity", "callback on_sanity_check_end stage=sanity",
    /* fit loop */
    "callback on_train_start", "module on_train_start", "strategy on_train_start", "callback on_train_epoch_start",
    "module on_train_epoch_start",
#define BATCH(i)                                                                                                     \
    "callback on_train_batch_start batch=" #i, "module on_train_batch_start batch=" #i,                              \
        "strategy on_train_batch_start batch=" #i, "module optimizer_step batch=" #i,                                \
        "precision optimizer_step batch=" #i, "optimizer step batch=" #i, "module training_step batch=" #i,          \
        "callback on_before_zero_grad batch=" #i, "module on_before_zero_grad batch=" #i,                            \
        "module optimizer_zero_grad batch=" #i, "optimizer zero_grad batch=" #i, "strategy pre_backward batch=" #i,  \
        "precision pre_backward batch=" #i, "callback on_before_backward batch=" #i,                                 \
        "module on_before_backward batch=" #i, "module backward batch=" #i, "callback on_after_backward batch=" #i,   \
        "module on_after_backward batch=" #i, "strategy post_backward batch=" #i,                                    \
        "callback on_before_optimizer_step batch=" #i, "module on_before_optimizer_step batch=" #i,                  \
        "module configure_gradient_clipping batch=" #i, "callback on_train_batch_end batch=" #i,                     \
        "module on_train_batch_end batch=" #i
    BATCH(0), BATCH(1),
#undef BATCH
    /* validation after the last batch, before on_train_epoch_end */
    "module on_validation_model_zero_grad", "module on_validation_model_eval stage=validate",
    "callback on_validation_start stage=validate", "module on_validation_start stage=validate",
    "callback on_validation_epoch_start stage=validate", "module on_validation_epoch_start stage=validate",
    "callback on_validation_batch_start batch=0 stage=validate", "module on_validation_batch_start batch=0 stage=validate",
    "module validation_step batch=0 stage=validate", "callback on_validation_batch_end batch=0 stage=validate",
    "module on_validation_batch_end batch=0 stage=validate", "callback on_validation_batch_start batch=1 stage=validate",
    "module on_validation_batch_start batch=1 stage=validate", "module validation_step batch=1 stage=validate",
    "callback on_validation_batch_end batch=1 stage=validate", "module on_validation_batch_end batch=1 stage=validate",
    "callback on_validation_epoch_end stage=validate", "module on_validation_epoch_end stage=validate",
    "callback on_validation_end stage=validate", "module on_validation_end stage=validate",
    "module on_validation_model_train stage=validate",
    "callback on_train_epoch_end", "module on_train_epoch_end", "callback on_train_end", "module on_train_end",
    "callback on_fit_end", "module on_fit_end", "callback teardown", "module teardown",
};

static void test_a_full_sequence(void) {
    fit_ok(BASE, NULL);
    expect_sequence(SEQ_A, (int)(sizeof SEQ_A / sizeof SEQ_A[0]));
}

/* The calls of one batch that matter for the optimizer pattern. */
static void pattern(char *buf, size_t n) {
    buf[0] = 0;
    int cur = -1;
    for (int i = 0; i < nlines; i++) {
        const char *b = strstr(lines[i], "batch=");
        if (!b || strstr(lines[i], "stage=")) continue;
        int bi = atoi(b + 6);
        const char *tok = NULL;
        if (!strncmp(lines[i], "optimizer step ", 15)) tok = "step";
        else if (!strncmp(lines[i], "module training_step ", 21)) tok = "training_step";
        else if (!strncmp(lines[i], "optimizer zero_grad ", 20)) tok = "zero_grad";
        else if (!strncmp(lines[i], "module backward ", 16)) tok = "backward";
        if (!tok) continue;
        size_t l = strlen(buf);
        if (bi != cur) { snprintf(buf + l, n - l, "%sb%d:", cur >= 0 ? " " : "", bi); cur = bi; l = strlen(buf); }
        else snprintf(buf + l, n - l, ","), l++;
        snprintf(buf + l, n - l, "%s", tok);
    }
}

/* A trace line and how many times the trace holds it; a line ending in
 * '*' counts the lines that start with what comes before the '*'. */
typedef struct line_count {
    const char *line;
    int n;
} line_count;

static void expect_counts(const line_count *c, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(c[i].line);
        int got = 0;
        for (int k = 0; k < nlines; k++)
            got += l && c[i].line[l - 1] == '*' ? !strncmp(lines[k], c[i].line, l - 1) : !strcmp(lines[k], c[i].line);
        if (got != c[i].n) fprintf(stderr, "\n  '%s': %d in the trace, expected %d\n", c[i].line, got, c[i].n);
        CU_ASSERT_EQUAL(got, c[i].n);
    }
}
#define EXPECT_COUNTS(...)                                                                                          \
    expect_counts((const line_count[]){__VA_ARGS__}, sizeof((const line_count[]){__VA_ARGS__}) / sizeof(line_count))

static void test_b_accumulation(void) {
    char pat[4096];
    const char *body = "trainer = { max_epochs = 1; num_sanity_val_steps = 0; accumulate_grad_batches = 2; };\n"
                       TOY_DATA(5, 1) TOY_MODULE("") SGD;
    fit_ok(body, NULL);
    pattern(pat, sizeof pat);
    /* b0 accumulates (zero-grad: 0 % 2 == 0), b1 steps, b2 accumulates,
     * b3 steps, b4 is the last batch of the epoch and always steps */
    CU_ASSERT_STRING_EQUAL(pat, "b0:training_step,zero_grad,backward b1:step,training_step,backward "
                                "b2:training_step,zero_grad,backward b3:step,training_step,backward "
                                "b4:step,training_step,zero_grad,backward");
    /* no optimizer hooks, clipping or gradient sync on accumulating batches;
     * on_after_backward always */
    EXPECT_COUNTS({"callback on_before_optimizer_step batch=0 acc=1", 0},
                  {"callback on_before_optimizer_step batch=1", 1}, {"strategy post_backward batch=0 acc=1", 0},
                  {"callback on_after_backward batch=0 acc=1", 1}, {"callback on_after_backward batch=2 acc=1", 1},
                  {"callback on_before_optimizer_step*", 3});
    /* the last-batch flush is a stepping batch (no acc=1) */
    EXPECT_COUNTS({"callback on_train_batch_end batch=4", 1});

    /* test_train_loop_system: 5 batches, accumulate = 3 */
    fit_ok(body, "--set trainer.accumulate_grad_batches=3");
    pattern(pat, sizeof pat);
    CU_ASSERT_STRING_EQUAL(pat, "b0:training_step,zero_grad,backward b1:training_step,backward "
                                "b2:step,training_step,backward b3:training_step,zero_grad,backward "
                                "b4:step,training_step,backward");
    /* summary: 2 optimizer steps */
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "steps: 2 "));
}

static void test_c_minus_one(void) {
    const char *body = "trainer = { max_epochs = 1; num_sanity_val_steps = 0; };\n"
                       TOY_DATA(4, 2) TOY_MODULE("minus_one_epoch = 0; minus_one_batch = 1; ") SGD;
    fit_ok(body, NULL);
    EXPECT_COUNTS({"module on_train_batch_start batch=1", 1}, {"module training_step batch=1", 0},
                  {"callback on_train_batch_end batch=1", 0}, {"callback on_train_batch_start batch=2", 0},
                  {"callback on_validation_start*", 0}, /* no validation for that epoch */
                  {"callback on_train_epoch_end", 1}); /* but the epoch still ends */
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "steps: 1 "));
}

static void test_d_max_steps(void) {
    const char *body = "trainer = { max_epochs = 5; max_steps = 3; num_sanity_val_steps = 0; };\n"
                       TOY_DATA(4, 2) TOY_MODULE("") SGD;
    fit_ok(body, NULL);
    EXPECT_COUNTS({"optimizer step *", 3}, {"callback on_train_epoch_start", 1}, {"callback on_train_epoch_end", 1},
                  {"callback on_train_batch_start batch=3", 0},
                  {"callback on_validation_start*", 0}); /* the val-check batch was never reached */
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "steps: 3 "));
    /* across an epoch boundary: 6 steps = one full epoch + 2 batches */
    fit_ok(body, "--set trainer.max_steps=6");
    EXPECT_COUNTS({"callback on_train_epoch_start", 2}, {"callback on_validation_start*", 1});
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "epochs: 2 "));
}

static void test_e_min_epochs(void) {
    const char *body = "trainer = { max_epochs = 10; min_epochs = 3; num_sanity_val_steps = 0; };\n"
                       TOY_DATA(2, 1) TOY_MODULE("stop_at_epoch = 0; ") SGD;
    fit_ok(body, NULL);
    EXPECT_COUNTS({"callback on_train_epoch_start", 3}); /* held back until min_epochs */
    fit_ok(body, "--set trainer.min_epochs=0");
    EXPECT_COUNTS({"callback on_train_epoch_start", 1}); /* stops at once */
    /* min_steps holds a stop too: 2 batches per epoch, min_steps 5 → 3 epochs */
    fit_ok(body, "--set trainer.min_epochs=0 --set trainer.min_steps=5");
    EXPECT_COUNTS({"callback on_train_epoch_start", 3});
}

static void test_closure_no_loss(void) {
    const char *body = "trainer = { max_epochs = 1; num_sanity_val_steps = 0; };\n"
                       TOY_DATA(3, 1) TOY_MODULE("no_loss_batch = 1; ") SGD;
    fit_ok(body, NULL);
    /* zero_grad runs even when the loss is None; backward does not */
    EXPECT_COUNTS({"optimizer zero_grad batch=1", 1}, {"module backward batch=1", 0},
                  {"callback on_before_backward batch=1", 0});
    /* the step is still taken and counted */
    EXPECT_COUNTS({"optimizer step batch=1", 1});
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "steps: 3 "));
}

static void test_val_placement(void) {
    const char *body = "trainer = { max_epochs = 2; num_sanity_val_steps = 0; val_check_interval = 0.3; };\n"
                       TOY_DATA(10, 1) TOY_MODULE("") SGD;
    fit_ok(body, NULL);
    /* 0.3 of 10 → every 3 batches: after batches 2, 5, 8, and no end-of-epoch run */
    EXPECT_COUNTS({"callback on_validation_start*", 6});
    int after = 0;
    for (int i = 1; i < nlines; i++)
        if (!strcmp(lines[i], "module on_validation_model_zero_grad")) after += !strcmp(lines[i - 1], "module on_train_batch_end batch=2") ||
                                                                        !strcmp(lines[i - 1], "module on_train_batch_end batch=5") ||
                                                                        !strcmp(lines[i - 1], "module on_train_batch_end batch=8");
    CU_ASSERT_EQUAL(after, 6);
    /* check_val_every_n_epoch = 2: only the second epoch validates */
    fit_ok(body, "--set trainer.val_check_interval=1.0 --set trainer.check_val_every_n_epoch=2");
    EXPECT_COUNTS({"callback on_validation_start*", 1});
    /* limits: int counts and fractions */
    fit_ok(body, "--set trainer.val_check_interval=1.0 --set trainer.limit_train_batches=4");
    EXPECT_COUNTS({"callback on_train_batch_start*", 8});
    fit_ok(body, "--set trainer.val_check_interval=1.0 --set trainer.limit_train_batches=0.5");
    EXPECT_COUNTS({"callback on_train_batch_start*", 10});
    CU_ASSERT_EQUAL(fit(body, "--set trainer.limit_train_batches=0.01", g_out, sizeof g_out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "limit_train_batches = 0.01 of 10 batches gives 0 batches"));
    /* limit_train_batches = 0: training is skipped, no train hooks at all */
    fit_ok(body, "--set trainer.limit_train_batches=0");
    EXPECT_COUNTS({"callback on_train_start", 0}, {"callback on_fit_end", 1});
}

static void test_determinism(void) {
    char a[4200], b[4200], c[4200], body[4096];
    snprintf(a, sizeof a, "%s/w1.bin", g_dir);
    snprintf(b, sizeof b, "%s/w2.bin", g_dir);
    snprintf(c, sizeof c, "%s/w3.bin", g_dir);
    const char *paths[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        snprintf(body, sizeof body,
                 "trainer = { max_epochs = 2; seed = %d; };\n"
                 TOY_DATA(6, 2) TOY_MODULE("")
                 "optimizer = { name = \"adamw\"; lr = 0.01; };\n"
                 CALLBACK_AT("weightdump"), i == 2 ? 8 : 7, paths[i]);
        fit_ok(body, NULL);
    }
    CU_ASSERT_EQUAL(tu_same_file(a, b), 1);     /* same seed: bit-identical */
    CU_ASSERT_NOT_EQUAL(tu_same_file(a, c), 1); /* another seed differs */
}

static void test_run_dir_and_errors(void) {
    char p[4300];
    fit_ok(BASE, NULL);
    fit_ok(BASE, NULL);
    struct stat st;
    snprintf(p, sizeof p, "%s/runs/version_1/config.cfg", g_dir);
    CU_ASSERT_EQUAL(stat(p, &st), 0); /* version_N increments; effective config written */
    /* unknown trainer key, missing optimizer, unknown plugin */
    CU_ASSERT_EQUAL(fit(BASE, "--set trainer.max_epoch=3", g_out, sizeof g_out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "unknown key 'max_epoch' for trainer (did you mean 'max_epochs'?)"));
    CU_ASSERT_EQUAL(fit("data = { name = \"toydata\"; };\nmodule = { name = \"toymod\"; };\n", NULL, g_out, sizeof g_out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "missing the 'optimizer' section"));
    CU_ASSERT_EQUAL(fit(BASE, "--set optimizer.name=sgdd", g_out, sizeof g_out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "did you mean 'sgd'?"));
    CU_ASSERT_EQUAL(fit(BASE, "--ckpt /nonexistent/last.safetensors", g_out, sizeof g_out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "/nonexistent/last.safetensors"));
}

/* Every run gets a directory of its own: with version_<int64 max> present
 * the next number does not exist, and the run is refused in one line
 * before it writes anything (no wrapped number, no reused directory); the
 * same for a number past 2^53 - 2, the largest the ranks can share. A
 * plain gap still numbers after the largest. */
static void test_run_dir_numbers(void) {
    char root[4300], p[4400], set[4400];
    struct stat st;
    const char *full[] = {"9223372036854775807", "99999999999999999999999", "9007199254740990"};
    for (int i = 0; i < 3; i++) {
        snprintf(root, sizeof root, "%s/numbers%d", g_dir, i);
        snprintf(p, sizeof p, "%s/version_%s", root, full[i]);
        CU_ASSERT_EQUAL_FATAL(tu_mkdirs(p), 0);
        char marker[4500];
        snprintf(marker, sizeof marker, "%s/marker", p);
        CU_ASSERT_EQUAL_FATAL(tu_write(marker, ""), 0);
        snprintf(set, sizeof set, "--set trainer.default_root_dir=\"%s\"", root);
        for (int run = 0; run < 2; run++) { /* the second run would have shared the first's */
            CU_ASSERT_EQUAL(fit(BASE, set, g_out, sizeof g_out), 1);
            CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "cannot number a new run: expected the largest version_N below "
                                               "9007199254740990, found version_"));
            CU_ASSERT_PTR_NOT_NULL(strstr(g_out, full[i]));
            CU_ASSERT_PTR_NOT_NULL(strstr(g_out, root));
            int nl = 0;
            for (const char *c = g_out; *c; c++) nl += *c == '\n';
            CU_ASSERT_EQUAL(nl, 1);
        }
        /* nothing written: the root holds the one directory, untouched */
        CU_ASSERT_EQUAL(tu_count_entries(root), 1);
        CU_ASSERT_EQUAL(tu_count_entries(p), 1);
    }
    snprintf(root, sizeof root, "%s/numbers_gap", g_dir);
    for (const char *const *v = (const char *const[]){"3", "9007199254740989", "x", "-7", NULL}; *v; v++) {
        snprintf(p, sizeof p, "%s/version_%s", root, *v);
        CU_ASSERT_EQUAL_FATAL(tu_mkdirs(p), 0);
    }
    snprintf(set, sizeof set, "--set trainer.default_root_dir=\"%s\"", root);
    CU_ASSERT_EQUAL(fit(BASE, set, g_out, sizeof g_out), 0);
    snprintf(p, sizeof p, "%s/version_9007199254740990/config.cfg", root);
    CU_ASSERT_EQUAL(stat(p, &st), 0); /* the largest number a run may take */
    CU_ASSERT_EQUAL(fit(BASE, set, g_out, sizeof g_out), 1); /* and then no more */
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "found version_9007199254740990"));
}

static void test_validate_and_test_commands(void) {
    char cfg[4200], out[16384];
    CU_ASSERT_EQUAL_FATAL(write_run(cfg, sizeof cfg, "eval", BASE), 0);
    CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "-q", "validate", cfg, NULL), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "val_loss="));
    CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "-q", "test", cfg, NULL), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "test_loss="));
}

/* The value printed for `key=` in the last summary line holding it. */
static int summary_value(const char *out, const char *key, char *val, size_t n) {
    const char *p = NULL, *q = out;
    while ((q = strstr(q, key))) p = q++;
    if (!p) return -1;
    p += strlen(key);
    size_t k = strcspn(p, " \n");
    snprintf(val, n, "%.*s", (int)(k < n ? k : n - 1), p);
    return 0;
}

/* The --set value that points a run at `root`, as kiln receives it. */
static const char *root_set(char *buf, size_t n, const char *root) {
    snprintf(buf, n, "trainer.default_root_dir=\"%s\"", root);
    return buf;
}

/* fit writes checkpoints/last.safetensors after every epoch; test --ckpt
 * evaluates exactly those weights; mismatched stacks and corrupt files are
 * refused with the file named. */
static void test_checkpoint_weights(void) {
    char root[4200], cfg[4300], out[16384], a[64] = "", b[64] = "", c[64] = "", rs[4300];
    snprintf(root, sizeof root, "%s/ckptruns", g_dir);
    CU_ASSERT_EQUAL_FATAL(write_run(cfg, sizeof cfg, "ckpt", BASE), 0);
    root_set(rs, sizeof rs, root);
    /* no run yet: last finds nothing */
    CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "-q", "test", cfg, "--set", rs, "--ckpt", "last", NULL), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "--ckpt last: no"));
    CU_ASSERT_EQUAL_FATAL(
        tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", rs, "--set", "trainer.max_epochs=3", "--test", NULL),
        0);
    CU_ASSERT_EQUAL_FATAL(summary_value(out, "test_loss=", a, sizeof a), 0);
    char ck[4400];
    snprintf(ck, sizeof ck, "%s/version_0/checkpoints/last.safetensors", root);
    struct stat st;
    CU_ASSERT_EQUAL_FATAL(stat(ck, &st), 0);
    /* the same weights evaluated later, by "last" and by path */
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "test", cfg, "--set", rs, "--ckpt", "last", NULL), 0);
    CU_ASSERT_EQUAL(summary_value(out, "test_loss=", b, sizeof b), 0);
    CU_ASSERT_STRING_EQUAL(a, b);
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "test", cfg, NULL), 0);
    CU_ASSERT_EQUAL(summary_value(out, "test_loss=", c, sizeof c), 0);
    CU_ASSERT_STRING_NOT_EQUAL(a, c); /* initial weights differ */
    /* another module shape: refused, naming the tensor and both shapes */
    CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "-q", "validate", cfg, "--set", "module.features=4", "--set",
                                  "data.features=4", "--ckpt", ck, NULL),
                    1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "tensor 'linear.weight' is F32 [2, 3], module 'toymod' expects F32 [2, 4]"));
    /* a truncated file: refused by the reader, naming the file */
    char bad[4400];
    snprintf(bad, sizeof bad, "%s/bad.safetensors", g_dir);
    CU_ASSERT_EQUAL_FATAL(tu_copy_head(ck, bad, 100), 0);
    CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "-q", "test", cfg, "--ckpt", bad, NULL), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, bad));
}

/* A resume test's two runs of the run file `name` (write_run with
 * `body`): the uninterrupted one (its root <root>/full, the --set value
 * d1 = cbs with its weight file wa) and the one stopped and resumed
 * (<root>/part, d2 = cbs with wb). The %s of `cbs` are the weight file,
 * then `trace` (cbs may leave it out). 0, or -1 when the run file cannot
 * be written. */
typedef struct resume_pair {
    char cfg[4300], root[4200], wa[4300], wb[4300], full[4400], part[4400], d1[9000], d2[9000];
} resume_pair;

static int resume_pair_init(resume_pair *r, const char *name, const char *body, const char *cbs, const char *trace) {
    snprintf(r->root, sizeof r->root, "%s/%s", g_dir, name);
    snprintf(r->wa, sizeof r->wa, "%s/%s_full.bin", g_dir, name);
    snprintf(r->wb, sizeof r->wb, "%s/%s_resumed.bin", g_dir, name);
    snprintf(r->d1, sizeof r->d1, cbs, r->wa, trace);
    snprintf(r->d2, sizeof r->d2, cbs, r->wb, trace);
    snprintf(r->full, sizeof r->full, "trainer.default_root_dir=\"%s/full\"", r->root);
    snprintf(r->part, sizeof r->part, "trainer.default_root_dir=\"%s/part\"", r->root);
    return write_run(r->cfg, sizeof r->cfg, name, body);
}

/* fit 4 epochs == fit 2 epochs, then fit --ckpt last to 4: bit-identical
 * weights (AdamW: its moments and step count travel in the checkpoint). */
static void test_resume_bit_identical(void) {
    char out[16384], ck[4400];
    resume_pair r;
    CU_ASSERT_EQUAL_FATAL(resume_pair_init(&r, "resume",
                                           "trainer = { max_epochs = 4; seed = 11; num_sanity_val_steps = 0; "
                                           "accumulate_grad_batches = 2; };\n" TOY_DATA(5, 1) TOY_MODULE("") ADAMW,
                                           "callbacks=({name=\"weightdump\"; path=\"%s\";})", NULL),
                          0);
    const char *cfg = r.cfg;
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", r.full, "--set", r.d1, NULL), 0);
    CU_ASSERT_EQUAL_FATAL(
        tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", r.part, "--set", "trainer.max_epochs=2", NULL), 0);
    int rc = tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", r.part, "--ckpt", "last", "--set", r.d2, NULL);
    CU_ASSERT_EQUAL_FATAL(shown(rc, out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "epochs: 4 ")); /* epoch counter restored */
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 12 ")); /* 3 steps an epoch, 4 epochs */
    CU_ASSERT_EQUAL(tu_same_file(r.wa, r.wb), 1);
    /* another optimizer cannot take AdamW's state */
    snprintf(ck, sizeof ck, "%s/part/version_0/checkpoints/last.safetensors", r.root);
    CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", r.part, "--ckpt", ck, "--set",
                                  "optimizer.name=sgd", "--set", "optimizer.lr=0.1", NULL),
                    1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "the optimizer state was saved by 'adamw"));
    /* a checkpoint beyond max_epochs is refused */
    CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", r.part, "--ckpt", "last", "--set",
                                  "trainer.max_epochs=1", NULL),
                    1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "beyond trainer.max_epochs = 1"));
}

/* A copy of checkpoint `src` at `dst` with metadata `key` set to `value`,
 * or left out when `value` is NULL (every tensor and other entry as it was). */
static int rewrite_meta(const char *src, const char *dst, const char *key, const char *value) {
    ht_error err = {0};
    safetensors_file *f = NULL;
    if (safetensors_open(src, &f, &err)) return -1;
    safetensors_writer *w = safetensors_writer_new();
    int rc = w ? 0 : -1;
    for (int i = 0; rc == 0 && i < safetensors_count(f); i++) {
        const safetensors_tensor *x = safetensors_get(f, i);
        rc = safetensors_add_tensor(w, x->name, x->dtype, x->shape, x->ndim, x->data, x->nbytes, &err);
    }
    for (int i = 0; rc == 0 && i < safetensors_metadata_count(f); i++) {
        const char *k, *v;
        safetensors_metadata_get(f, i, &k, &v);
        if (strcmp(k, key) != 0) rc = safetensors_add_metadata(w, k, v, &err);
        else if (value) rc = safetensors_add_metadata(w, k, value, &err);
    }
    if (rc == 0) rc = safetensors_write_atomic(w, dst, &err);
    if (rc) fprintf(stderr, "\nrewrite_meta: %s\n", err.msg);
    safetensors_writer_free(w);
    safetensors_close(f);
    return rc;
}

/* The integers of a JSON text in order, as (offset, length) spans outside
 * its strings: the progress object holds its 36 counters in the order of
 * docs/checkpoints.md, so counter i is span i (read without a JSON library,
 * as an independent reader could). Returns the count. */
static int json_int_spans(const char *t, size_t (*span)[2], int max) {
    int n = 0;
    for (size_t i = 0; t[i] && n < max;) {
        if (t[i] == '"') {
            for (i++; t[i] && t[i] != '"'; i += t[i] == '\\' ? 2 : 1) {}
            if (t[i]) i++;
        } else if (t[i] == '-' || (t[i] >= '0' && t[i] <= '9')) {
            size_t j = i + 1;
            while (t[j] >= '0' && t[j] <= '9') j++;
            span[n][0] = i;
            span[n][1] = j - i;
            n++;
            i = j;
        } else {
            i++;
        }
    }
    return n;
}

/* `progress` of `ck` with counter `idx` (0-based, in the order of the
 * object) set to the JSON text `value`. */
static void progress_with(const char *ck, int idx, const char *value, char *out, size_t n) {
    ht_error err = {0};
    char text[2048];
    size_t span[36][2];
    safetensors_file *f = NULL;
    CU_ASSERT_EQUAL_FATAL(safetensors_open(ck, &f, &err), 0);
    snprintf(text, sizeof text, "%s", safetensors_metadata(f, "progress"));
    safetensors_close(f);
    CU_ASSERT_EQUAL_FATAL(json_int_spans(text, span, 36), 36);
    snprintf(out, n, "%.*s%s%s", (int)span[idx][0], text, value, text + span[idx][0] + span[idx][1]);
}

/* The counters of a checkpoint are checked before it resumes: out of range,
 * inconsistent with each other or with the loops text, each is refused in
 * one line naming the file, the counter, what was expected and what was
 * found; the same file unaltered still resumes. */
static void test_resume_refuses_bad_counters(void) {
    char out[16384], cfg[4300], rs[4300], root[4200], ck[4400], bad[4400], val[2048];
    snprintf(root, sizeof root, "%s/counters", g_dir);
    snprintf(bad, sizeof bad, "%s/counters-bad.safetensors", g_dir);
    snprintf(ck, sizeof ck, "%s/version_0/checkpoints/last.safetensors", root);
    CU_ASSERT_EQUAL_FATAL(write_run(cfg, sizeof cfg, "counters", BASE), 0);
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", root_set(rs, sizeof rs, root), NULL),
                          0);
    /* epoch 1 done, 2 batches, 2 steps; progress counters in the order of
     * the object: epoch (0-7), batch (8-15), opt_step (16-23), zero_grad
     * (24-31), each total then current as ready started processed
     * completed; then stepped, total batch idx, skipped steps, samples seen */
#define LOOPS(e, s, st, b, ss, f)                                                                                  \
    "{\"format\":\"kiln-loops-2\",\"epochs\":" e ",\"global_step\":" s ",\"batches_that_stepped\":" st           \
    ",\"total_batch_idx\":" b ",\"scheduler_steps\":" ss ",\"lr_factor\":" f "}"
    struct {
        const char *key;
        int idx;          /* progress field, or -1: `value` is the whole text */
        const char *value;
        const char *needle;
    } cases[] = {
        /* an epoch count that ends the fit loop at once: exit 0 without training */
        {"progress", 6, "1000000",
         "progress counter epoch_progress.current.processed: expected <= epoch_progress.current.ready (1), found "
         "1000000"},
        {"progress", 35, "9223372036854775807",
         "progress counter samples_seen: expected 0 <= value < 2^53, found 9223372036854775807"},
        /* past 64 bits: jansson refuses the text before any range check */
        {"progress", 35, "99999999999999999999", "found invalid JSON (too big integer near '99999999999999999999'"},
        {"progress", 9, "-1", "progress counter batch_progress.total.started: expected 0 <= value < 2^53, found -1"},
        {"progress", 11, "5",
         "progress counter batch_progress.total.completed: expected <= batch_progress.total.ready (2), found 5"},
        {"progress", 19, "3", "progress counter opt_step.total.completed: expected <= opt_step.total.ready (2), found 3"},
        {"progress", 12, "3",
         "progress counter batch_progress.current.ready: expected <= batch_progress.total.ready (2), found 3"},
        {"progress", 34, "3",
         "progress counter skipped_steps: expected <= opt_step.total.completed (2), found 3"},
        {"progress", 32, "5", "progress counter batches_that_stepped: expected <= total_batch_idx (2), found 5"},
        {"progress", 7, "0",
         "progress counter epoch_progress.current.processed: expected <= epoch_progress.current.completed (0), "
         "found 1"},
        {"progress", -1,
         "{\"format\":\"kiln-progress-2\",\"epoch_progress\":{\"total\":{\"ready\":1,\"started\":1,\"processed\":1,"
         "\"completed\":1},\"current\":{}}}",
         "progress counter epoch_progress.current.ready: expected an integer, found nothing"},
        {"progress", -1, "{\"format\":\"kiln-progress-9\"}",
         "expected __metadata__ progress to be a JSON object with \"format\": \"kiln-progress-2\", found "
         "\"kiln-progress-9\""},
        {"progress", -1, "{\"format\":\"kiln-progress-2\",\"bogus\":1}",
         "__metadata__ progress: expected the 36 counters of \"kiln-progress-2\", found an unknown key \"bogus\""},
        /* the older formats: text counters, or no progress at all */
        {"progress", -1, "kiln-progress-1 1 1 1 1 1 1 1 1 2 2 2 2 2 2 2 2 2 0 0 2 2 0 0 2 2 2 2 0 2 2 2 0 2 2 2 0 8",
         "__metadata__ progress is \"kiln-progress-1\" text, an older kiln's format"},
        {"progress", -1, NULL, "no __metadata__ progress: a checkpoint of an older kiln"},
        /* loops: the same counters as progress, in range */
        {"loops", -1, LOOPS("1", "7", "2", "2", "3", "1.0"),
         "loops counter global_step: expected 2 (progress counter opt_step.total.completed), found 7"},
        {"loops", -1, LOOPS("4611686018427387904", "2", "2", "2", "3", "1.0"),
         "loops counter epochs: expected 0 <= value < 2^53, found 4611686018427387904"},
        {"loops", -1, LOOPS("1", "2", "2", "2", "3", "\"nan\""), "loops lr_factor: expected a finite factor >= 0, found nan"},
        {"loops", -1, LOOPS("1", "2", "2", "2", "9", "1.0"),
         "loops counter scheduler_steps: expected <= total_batch_idx + epochs + 2 (5), found 9"},
        {"loops", -1, "{\"format\":\"kiln-loops-2\",\"epochs\":1,\"global_step\":2,\"batches_that_stepped\":2}",
         "expected loop progress"},
        {"loops", -1,
         "{\"format\":\"kiln-loops-2\",\"epochs\":1,\"global_step\":2,\"batches_that_stepped\":2,\"total_batch_idx\":2,"
         "\"scheduler_steps\":3,\"lr_factor\":1.0,\"extra\":0}",
         "expected loop progress"},
        {"loops", -1, "1 2 2 2 3 1", "expected loop progress"},
        /* metrics: what the epoch end reads, checked the same way */
        {"metrics", -1, "{\"format\":\"kiln-metrics-9\",\"callback\":[],\"epoch\":[]}",
         "__metadata__ metrics: expected a metrics object {\"format\": \"kiln-metrics-2\""},
        {"metrics", -1, "{\"format\":\"kiln-metrics-2\",\"callback\":[{\"kind\":\"x\",\"value\":1,\"name\":\"val_loss\"}],"
                        "\"epoch\":[]}",
         "metrics callback[0]: expected {\"name\": a name of 1..71 printable bytes, \"value\": a number}"},
        {"metrics", -1,
         "{\"format\":\"kiln-metrics-2\",\"callback\":[{\"name\":\"val_loss\",\"value\":0.5}],\"epoch\":[{\"name\":"
         "\"train_loss\",\"stage\":1,\"flags\":3,\"sum\":\"nan\",\"weight\":2}]}",
         "metrics epoch[0] (train_loss): expected a stage 0..16, flags, a finite sum and a weight > 0, found 1 3 nan 2"},
        {"metrics", -1,
         "{\"format\":\"kiln-metrics-2\",\"callback\":[],\"epoch\":[{\"name\":\"train_loss\",\"stage\":1,\"flags\":3,"
         "\"sum\":0.5,\"weight\":0}]}",
         "a weight > 0"},
        {"metrics", -1, "{\"format\":\"kiln-metrics-2\",\"callback\":[{\"name\":\"\",\"value\":0.5}],\"epoch\":[]}",
         "a name of 1..71 printable bytes"},
        /* a plugin's state entry: the plugin and its state version */
        {"state.optimizer", -1, "adamw 1",
         "__metadata__ state.optimizer: expected {\"plugin\": a name, \"version\": an integer 0..4294967295}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].idx >= 0) progress_with(ck, cases[i].idx, cases[i].value, val, sizeof val);
        else snprintf(val, sizeof val, "%s", cases[i].value ? cases[i].value : "(none)");
        CU_ASSERT_EQUAL_FATAL(rewrite_meta(ck, bad, cases[i].key, cases[i].idx < 0 && !cases[i].value ? NULL : val), 0);
        int rc = tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", rs, "--set", "trainer.max_epochs=3", "--ckpt",
                               bad, NULL);
        int nl = 0;
        for (const char *c = out; *c; c++) nl += *c == '\n';
        int ok = rc == 1 && strstr(out, cases[i].needle) && strstr(out, bad) && nl == 1;
        if (!ok) fprintf(stderr, "\ncase %zu (%s = \"%s\"): exit %d\n%s\n", i, cases[i].key, val, rc, out);
        CU_ASSERT_EQUAL(rc, 1);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, cases[i].needle));
        CU_ASSERT_PTR_NOT_NULL(strstr(out, bad));
        CU_ASSERT_EQUAL(nl, 1); /* one line */
    }
    /* the file rewritten unchanged still resumes, to the same counters */
    safetensors_file *f = NULL;
    ht_error err = {0};
    CU_ASSERT_EQUAL_FATAL(safetensors_open(ck, &f, &err), 0);
    char progress[2048];
    snprintf(progress, sizeof progress, "%s", safetensors_metadata(f, "progress"));
    safetensors_close(f);
    CU_ASSERT_EQUAL_FATAL(rewrite_meta(ck, bad, "progress", progress), 0);
    int rc = tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", rs, "--set", "trainer.max_epochs=3", "--ckpt", bad,
                           NULL);
    CU_ASSERT_EQUAL(shown(rc, out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "epochs: 3 "));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 6 "));
#undef LOOPS
}

/* A callback built against the frozen 1.1 headers trains in this host. */
static void test_frozen_abi_1_1_callback(void) {
    char body[8192], path[4200], text[512] = "";
    snprintf(path, sizeof path, "%s/old11.txt", g_dir);
    snprintf(body, sizeof body,
             "trainer = { max_epochs = 2; num_sanity_val_steps = 0; accumulate_grad_batches = 2; };\n"
             TOY_DATA(3, 1) TOY_MODULE("") SGD CALLBACK_AT("old11cb"), path);
    fit_ok(body, NULL);
    FILE *f = fopen(path, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_PTR_NOT_NULL(fgets(text, sizeof text, f));
    fclose(f);
    /* 3 batches per epoch, accumulate 2: steps after batches 1 and 2 (last) */
    CU_ASSERT_STRING_EQUAL(text, "batch_ends=6 epoch_ends=2 after_backward=6 step=4\n");
}

/* ---------------------------------------------------------------------------
 * Lightning 2.6 conformance (each test names the Lightning code it encodes) */

/* The progress counters of checkpoint `ck` as numbers, in order. */
static int progress_fields(const char *ck, long long *v, int n) {
    ht_error err = {0};
    size_t span[36][2];
    safetensors_file *f = NULL;
    if (safetensors_open(ck, &f, &err)) return -1;
    const char *p = safetensors_metadata(f, "progress");
    int k = 0;
    if (p && strstr(p, "\"format\":\"kiln-progress-2\"")) {
        k = json_int_spans(p, span, n < 36 ? n : 36);
        for (int i = 0; i < k; i++) v[i] = strtoll(p + span[i][0], NULL, 10);
    }
    safetensors_close(f);
    return k;
}

/* 1. training_epoch_loop.advance (should_skip_rest_of_epoch): the batch whose
 * on_train_batch_start returned -1 still updates the schedulers as the
 * epoch's last: a step schedule steps, an epoch schedule steps for the
 * epoch. */
static void test_conf_minus_one_schedulers(void) {
    const char *body = "trainer = { max_epochs = 2; num_sanity_val_steps = 0; };\n"
                       TOY_DATA(4, 1) TOY_MODULE("minus_one_epoch = 0; minus_one_batch = 1; ") SGD
                       "scheduler = { name = \"step\"; step_size = 1; gamma = 0.5; };\n";
    fit_ok(body, NULL);
    /* epoch 0: after batch 0 and for the skipped batch 1; epoch 1: 4 */
    EXPECT_COUNTS({"host lr_scheduler_step*", 6}, {"host lr_scheduler_step batch=1", 2});
    fit_ok(body, "--set scheduler.interval=\"epoch\"");
    /* one epoch step per epoch, the first at the skipped batch */
    EXPECT_COUNTS({"host lr_scheduler_step*", 2}, {"host lr_scheduler_step batch=1", 1},
                  {"host lr_scheduler_step batch=3", 1});
}

/* 2. loops/utilities._parse_loop_limits: min_steps without min_epochs sets
 * min_epochs = 1, so a stop requested inside the first epoch finishes it. */
static void test_conf_min_steps_alone(void) {
    const char *body = "trainer = { max_epochs = 5; num_sanity_val_steps = 0; min_steps = 1; };\n"
                       TOY_DATA(4, 1) TOY_MODULE("stop_at_batch = 0; ") SGD;
    fit_ok(body, NULL);
    EXPECT_COUNTS({"callback on_train_batch_end*", 4}, /* the first epoch, whole */
                  {"callback on_train_epoch_start", 1});
    /* min_epochs = 0 written g_out: the stop takes effect at once */
    fit_ok(body, "--set trainer.min_epochs=0");
    EXPECT_COUNTS({"callback on_train_batch_end*", 1});
}

/* 3. fit_loop.on_advance_end with call._call_callback_hooks(...,
 * monitoring_callbacks=False/True): early stopping and the checkpoint
 * callback run after the module's on_train_epoch_end and can monitor what
 * it logs there. */
static void test_conf_monitoring_callbacks(void) {
    char body[8192], dir[4200], p[4400];
    snprintf(dir, sizeof dir, "%s/monitor-ck", g_dir);
    snprintf(body, sizeof body,
             "trainer = { max_epochs = 5; num_sanity_val_steps = 0; limit_val_batches = 0; };\n"
             TOY_DATA(2, 1) TOY_MODULE("epoch_metric = 1; ") SGD
             "callbacks = ( { name = \"hook_trace\"; path = \"%s/monitor-trace.txt\"; },\n"
             "  { name = \"early_stopping\"; monitor = \"epoch_metric\"; patience = 0; strict = true;\n"
             "    check_on_train_epoch_end = true; },\n"
             "  { name = \"checkpoint\"; dirpath = \"%s\"; monitor = \"epoch_metric\"; save_top_k = 1;\n"
             "    filename = \"best-{epoch}\"; } );\n",
             g_dir, dir);
    fit_ok(body, NULL);
    snprintf(p, sizeof p, "%s/monitor-trace.txt", g_dir);
    read_lines(p);
    /* epoch_metric = 1 + epoch never improves after epoch 0: patience 0 stops after epoch 1 */
    EXPECT_COUNTS({"callback on_train_epoch_start", 2});
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "epochs: 2 "));
    /* the checkpoint callback ranked by it: epoch 0 is the best */
    struct stat st;
    snprintf(p, sizeof p, "%s/best-0.safetensors", dir);
    CU_ASSERT_EQUAL(stat(p, &st), 0);
    snprintf(p, sizeof p, "%s/best-1.safetensors", dir);
    CU_ASSERT_NOT_EQUAL(stat(p, &st), 0);
}

/* 4. evaluation_loop._on_evaluation_end: should_stop set by early stopping
 * in on_validation_end is visible to the module's on_validation_end. */
static void test_conf_should_stop_live(void) {
    const char *body = "trainer = { max_epochs = 3; num_sanity_val_steps = 0; };\n"
                       TOY_DATA(2, 1) TOY_MODULE("report_should_stop = 1; ") SGD
                       "callbacks = ( { name = \"early_stopping\"; monitor = \"val_loss\"; stopping_threshold = 1000.0;\n"
                       "                check_on_train_epoch_end = false; } );\n";
    g_loud = 1;
    int rc = fit(body, NULL, g_out, sizeof g_out);
    g_loud = 0;
    CU_ASSERT_EQUAL_FATAL(shown(rc, g_out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "on_validation_end in epoch 0 sees should_stop=1"));
    CU_ASSERT_PTR_NOT_NULL(strstr(g_out, "epochs: 1 "));
}

/* 5. strategies/strategy.py runs post_backward after every backward, with
 * the gradient sync suppressed separately while accumulating; kiln's rule
 * (docs/semantics.md, "Where kiln differs"): S.post_backward is where the
 * sync happens, so it runs only after the backward of a stepping batch. */
static void test_conf_post_backward_rule(void) {
    const char *body = "trainer = { max_epochs = 1; num_sanity_val_steps = 0; accumulate_grad_batches = 2; };\n"
                       TOY_DATA(5, 1) TOY_MODULE("") SGD;
    fit_ok(body, NULL);
    EXPECT_COUNTS({"module backward*", 5}, {"strategy post_backward*", 3}, /* batches 1, 3 and the last, 4 */
                  {"strategy post_backward batch=0", 0}, {"strategy post_backward batch=4", 1});
}

/* 6. trainer._run_sanity_check (not val_loop.restarting) with
 * fit_loop.restarting: a checkpoint of a finished epoch with max_steps = -1
 * is not a restart, so the sanity check runs again; with max_steps set it
 * is (_iteration_based_training) and the check is skipped. */
static void test_conf_resume_sanity(void) {
    char out[16384], cfg[4300], body[8192], root[4200], trace[4400];
    snprintf(root, sizeof root, "%s/sanity", g_dir);
    snprintf(trace, sizeof trace, "%s/sanity-trace.txt", g_dir);
    snprintf(body, sizeof body, "trainer = { max_epochs = 1; seed = 3; };\n" TOY_DATA(2, 2) TOY_MODULE("") SGD
             CALLBACK_AT("hook_trace"), trace);
    CU_ASSERT_EQUAL_FATAL(write_run(cfg, sizeof cfg, "sanity", body), 0);
    char rs[4300];
    root_set(rs, sizeof rs, root);
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", rs, NULL), 0);
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", rs, "--ckpt", "last", "--set",
                                        "trainer.max_epochs=2", NULL),
                          0);
    read_lines(trace);
    EXPECT_COUNTS({"callback on_sanity_check_start stage=sanity", 1}, {"callback on_train_epoch_start", 1});
    /* the same resume of a step-limited run: no sanity check */
    char ck[4400];
    snprintf(ck, sizeof ck, "%s/version_0/checkpoints/last.safetensors", root);
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", rs, "--ckpt", ck, "--set",
                                        "trainer.max_epochs=2", "--set", "trainer.max_steps=4", NULL),
                          0);
    read_lines(trace);
    EXPECT_COUNTS({"callback on_sanity_check_start stage=sanity", 0}, {"callback on_train_epoch_start", 1});
}

/* 7. test_hooks.py, test_trainer_model_hook_system_fit_no_val_and_resume_max_steps
 * (fit_loop RESTARTED_ON_EPOCH_END): a run stopped by max_steps inside an
 * epoch resumes inside it: no on_train_epoch_start, the next batch, the
 * same current_epoch; and the weights equal an uninterrupted run's. */
static void test_conf_resume_after_max_steps(void) {
    char out[16384], trace[4400], ck[4400];
    snprintf(trace, sizeof trace, "%s/maxsteps-trace.txt", g_dir);
    resume_pair r;
    CU_ASSERT_EQUAL_FATAL(
        resume_pair_init(&r, "maxsteps",
                         "trainer = { max_epochs = 2; seed = 5; num_sanity_val_steps = 0; limit_val_batches = 0; };\n"
                         TOY_DATA(4, 1) TOY_MODULE("") ADAMW,
                         "callbacks=({name=\"weightdump\"; path=\"%s\";}, {name=\"hook_trace\"; path=\"%s\";})", trace),
        0);
    const char *cfg = r.cfg;
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", r.full, "--set", "trainer.max_steps=3",
                                        "--set", r.d1, NULL),
                          0);
    CU_ASSERT_EQUAL_FATAL(
        tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", r.part, "--set", "trainer.max_steps=1", NULL), 0);
    snprintf(ck, sizeof ck, "%s/part/version_0/checkpoints/last.safetensors", r.root);
    ht_error err = {0};
    safetensors_file *f = NULL;
    CU_ASSERT_EQUAL_FATAL(safetensors_open(ck, &f, &err), 0);
    CU_ASSERT_STRING_EQUAL(safetensors_metadata(f, "epoch"), "0"); /* loaded_ckpt "epoch": 0 */
    CU_ASSERT_STRING_EQUAL(safetensors_metadata(f, "global_step"), "1");
    safetensors_close(f);
    int rc = tu_run_kiln_l(out, sizeof out, "fit", cfg, "--set", r.part, "--ckpt", "last", "--set", "trainer.max_steps=3",
                           "--set", r.d2, NULL);
    CU_ASSERT_EQUAL_FATAL(shown(rc, out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "resuming inside epoch 0 after batch 0"));
    read_lines(trace);
    EXPECT_COUNTS({"callback on_train_epoch_start", 0}, {"callback on_train_batch_start batch=0", 0},
                  {"callback on_train_batch_start batch=1", 1}, {"callback on_train_batch_start batch=2", 1},
                  {"callback on_train_batch_start batch=3", 0}, {"callback on_train_epoch_end", 1});
    CU_ASSERT_EQUAL(tu_same_file(r.wa, r.wb), 1);
}

/* 8. loops/optimization/automatic.py with torch's zero_grad(set_to_none=True):
 * after a training_step that returned no loss every gradient is None and
 * the optimizers skip every parameter, so the step changes nothing
 * (KILN_PARAMF_NO_GRAD); a 1.4 optimizer, which cannot know, still steps on
 * the zeroed gradients as before. */
static void no_loss_run(const char *opt, const char *extra, const char *dump) {
    char body[8192];
    snprintf(body, sizeof body,
             "trainer = { max_epochs = 1; seed = 9; num_sanity_val_steps = 0; };\n"
             TOY_DATA(3, 1) TOY_MODULE("no_loss_batch = 2; ")
             "optimizer = %s;\n"
             CALLBACK_AT("weightdump"), opt, dump);
    fit_ok(body, extra);
}

static void test_conf_no_loss_is_a_no_op(void) {
    const char *opts[] = {"{ name = \"sgd\"; lr = 0.1; momentum = 0.9; weight_decay = 0.1; }",
                          "{ name = \"adamw\"; lr = 0.05; weight_decay = 0.1; }",
                          "{ name = \"lbfgs\"; lr = 0.5; max_iter = 3; }"};
    char a[4300], b[4300];
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/noloss%d_a.bin", g_dir, i);
        snprintf(b, sizeof b, "%s/noloss%d_b.bin", g_dir, i);
        no_loss_run(opts[i], NULL, a);                          /* batches 0, 1, and 2 without a loss */
        no_loss_run(opts[i], "--set trainer.max_steps=2", b);    /* batches 0 and 1 only */
        CU_ASSERT_EQUAL(tu_same_file(a, b), 1);
    }
    /* the same sgd built against the frozen 1.4 headers: the old behaviour */
    char plugdirs[9000];
    snprintf(plugdirs, sizeof plugdirs, "--set plugins.dirs=[\"%s\",\"%s\"]", getenv("KILN_TRAIN_FIXTURES"),
             getenv("KILN_ABI14_FIXTURES"));
    const char *old = "{ name = \"sgd14:sgd\"; lr = 0.1; momentum = 0.9; weight_decay = 0.1; }";
    snprintf(a, sizeof a, "%s/noloss14_a.bin", g_dir);
    snprintf(b, sizeof b, "%s/noloss14_b.bin", g_dir);
    no_loss_run(old, plugdirs, a);
    char extra[9100];
    snprintf(extra, sizeof extra, "%s --set trainer.max_steps=2", plugdirs);
    no_loss_run(old, extra, b);
    CU_ASSERT_NOT_EQUAL(tu_same_file(a, b), 1);
}

/* 9. training_epoch_loop.reset (reset_on_run of the optimisation progress):
 * the `current` optimizer-step and zero-grad counters count the epoch's. */
static void test_conf_progress_current_per_epoch(void) {
    char out[16384], cfg[4300], root[4200], ck[4400], rs[4300];
    snprintf(root, sizeof root, "%s/current", g_dir);
    CU_ASSERT_EQUAL_FATAL(write_run(cfg, sizeof cfg, "current", BASE), 0);
    root_set(rs, sizeof rs, root);
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", rs, "--set", "trainer.max_epochs=3",
                                        "--set", "data.n_train=4", NULL),
                          0);
    snprintf(ck, sizeof ck, "%s/version_0/checkpoints/last.safetensors", root);
    long long v[36];
    CU_ASSERT_EQUAL_FATAL(progress_fields(ck, v, 36), 36);
    CU_ASSERT_EQUAL(v[16 + 3], 12); /* opt_step.total.completed: global_step */
    CU_ASSERT_EQUAL(v[20 + 3], 4);  /* opt_step.current.completed: this epoch's */
    CU_ASSERT_EQUAL(v[24 + 3], 12); /* zero_grad.total.completed */
    CU_ASSERT_EQUAL(v[28 + 3], 4);  /* zero_grad.current.completed */
    /* it still resumes, and the global step continues from the total */
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", rs, "--set", "trainer.max_epochs=4",
                                        "--set", "data.n_train=4", "--ckpt", "last", NULL),
                          0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 16 "));
}

/* A failed run: on_exception reaches every callback (the trace's last
 * line; no teardown hook after it, as in Lightning), the csv logger's rows
 * are on disk, and the message says where: stage, epoch, batch, step. A
 * positive return is named as the misuse it is. */
static void test_failure_on_exception(void) {
    char out[16384], body[8192], csv[4400];
    snprintf(body, sizeof body,
             "trainer = { max_epochs = 2; num_sanity_val_steps = 0; log_every_n_steps = 1; };\n"
             TOY_DATA(3, 1) TOY_MODULE("fail_at_batch = 2; ") SGD
             "callbacks = ( { name = \"hook_trace\"; path = \"%s/fail-trace.txt\"; },\n"
             "  { name = \"csv_logger\"; filename = \"%s/fail-metrics.csv\"; flush_every_n = 100; } );\n",
             g_dir, g_dir);
    CU_ASSERT_EQUAL_FATAL(fit(body, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "training_step: toymod: failing at batch 2 [KILN_E_DATA] (train: epoch 0, "
                                       "batch 2, global step 2)"));
    char p[4400];
    snprintf(p, sizeof p, "%s/fail-trace.txt", g_dir);
    read_lines(p);
    CU_ASSERT_FATAL(nlines > 0);
    CU_ASSERT_STRING_EQUAL(lines[nlines - 1], "callback on_exception");
    EXPECT_COUNTS({"callback teardown", 0});
    /* the rows logged before the failure were flushed at on_exception */
    snprintf(csv, sizeof csv, "%s/fail-metrics.csv", g_dir);
    char rows[16384];
    CU_ASSERT_FATAL(tu_join_fields(csv, NULL, NULL, 0, 0, '\n', rows, sizeof rows) >= 0); /* cat */
    CU_ASSERT_EQUAL(strncmp(rows, "step,", 5), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(rows, "\n1,"));
    /* a positive return code */
    CU_ASSERT_EQUAL_FATAL(fit(body, "--set module.fail_code=7", out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "training_step: returned 7, which is not a kiln status"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "[KILN_E_INTERNAL] (train: epoch 0, batch 2, global step 2)"));
    /* a failing validation hook says so */
    CU_ASSERT_EQUAL_FATAL(fit_argv(body,
                                   TU_ARGS("--set", "module.fail_at_batch=-1", "--set", "trainer.num_sanity_val_steps=1",
                                           "--set",
                                           "callbacks=({name=\"early_stopping\"; monitor=\"nope\"; "
                                           "check_on_train_epoch_end=false;})"),
                                   out, sizeof out),
                          1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "[KILN_E_CONFIG] (validation: epoch 0, global step 3)"));
}

static int setup(void) { g_dir = tu_mkdtemp(); return g_dir ? 0 : 1; }
static int teardown(void) {
    free_lines();
    tu_rmrf(g_dir);
    free(g_dir);
    return 0;
}

static void register_tests(void) {
    CU_pSuite s = CU_add_suite("trainer", setup, teardown);
    CU_add_test(s, "(a) full hook sequence, 1 epoch 2+2 batches", test_a_full_sequence);
    CU_add_test(s, "(b) accumulation patterns", test_b_accumulation);
    CU_add_test(s, "(c) -1 from on_train_batch_start", test_c_minus_one);
    CU_add_test(s, "(d) max_steps mid-epoch", test_d_max_steps);
    CU_add_test(s, "(e) min_epochs / min_steps hold a stop", test_e_min_epochs);
    CU_add_test(s, "closure: step without loss", test_closure_no_loss);
    CU_add_test(s, "validation placement and limits", test_val_placement);
    CU_add_test(s, "same seed, bit-identical weights", test_determinism);
    CU_add_test(s, "run directory and errors", test_run_dir_and_errors);
    CU_add_test(s, "run directory numbers: no overflow, never shared", test_run_dir_numbers);
    CU_add_test(s, "kiln validate / kiln test", test_validate_and_test_commands);
    CU_add_test(s, "callback built against frozen ABI 1.1", test_frozen_abi_1_1_callback);
    CU_add_test(s, "a failure: on_exception, flushed logs, where it happened", test_failure_on_exception);
    CU_add_test(s, "checkpoint weights: save, test --ckpt, refusals", test_checkpoint_weights);
    CU_add_test(s, "resume from an epoch-end checkpoint is bit-identical", test_resume_bit_identical);
    CU_add_test(s, "resume refuses out-of-range or inconsistent counters", test_resume_refuses_bad_counters);
    CU_pSuite c = CU_add_suite("lightning conformance", setup, teardown);
    CU_add_test(c, "1. -1 from on_train_batch_start updates the schedulers", test_conf_minus_one_schedulers);
    CU_add_test(c, "2. min_steps alone implies min_epochs = 1", test_conf_min_steps_alone);
    CU_add_test(c, "3. monitoring callbacks after the module at on_train_epoch_end", test_conf_monitoring_callbacks);
    CU_add_test(c, "4. should_stop is live in on_validation_end", test_conf_should_stop_live);
    CU_add_test(c, "5. post_backward only on stepping batches (kiln's rule)", test_conf_post_backward_rule);
    CU_add_test(c, "6. sanity check again after an epoch-end checkpoint", test_conf_resume_sanity);
    CU_add_test(c, "7. resume inside an epoch cut by max_steps", test_conf_resume_after_max_steps);
    CU_add_test(c, "8. a step without a loss changes nothing", test_conf_no_loss_is_a_no_op);
    CU_add_test(c, "9. per-epoch current optimizer/zero-grad counters", test_conf_progress_current_per_epoch);
}

#include "cunit_main.h"
