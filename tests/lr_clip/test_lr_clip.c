/*
 * tests/lr_clip/test_lr_clip.c — learning-rate scheduling and gradient
 * clipping in the trainer, end to end. A recording scheduler fixture
 * (schedfix: lr = base / (1 + step)) shows when the host steps it: at
 * construction, after every stepping batch (not while accumulating), every
 * `frequency`, per epoch at the last batch, monitored ones after
 * on_train_epoch_end with the metric; the rate the trainer state reports
 * at each batch; resume continuing the schedule bit for bit. Clipping by
 * norm and by value is checked element by element against the gradients
 * on_before_optimizer_step saw and the SGD update that followed; value
 * clipping through the 1.5 clamp entry equals the host loop of older tables
 * bit for bit, and norm clipping through 1.9's sumsq_many the per-parameter
 * sumsq of older tables.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "testutil.h"

#define ARGS TU_ARGS

/* kiln -q fit on a run file of `body`, into <tu_suite_dir>/runs, then `extra`
 * (NULL-terminated; NULL for none). */
static int kiln(const char *body, const char *const extra[], char *out, size_t outlen) {
    char cfg[4200], root[4400];
    tu_write_job(tu_job_path(cfg, sizeof cfg, tu_suite_dir, "l"), body);
    tu_root_set(root, sizeof root, "%s/runs", tu_suite_dir);
    return tu_run_kiln_a(ARGS("-q", "fit", cfg, "--set", root), extra, out, outlen);
}

/* The schedfix record as one string "step epoch|..." (metric dropped). */
static void sched_calls(const char *path, char *out, size_t n, int with_metric) {
    if (with_metric) tu_join_fields(path, NULL, NULL, 0, 0, '|', out, n);
    else tu_join_fields(path, NULL, "restored", 1, 2, '|', out, n);
}

/* The first `max` lines of `path` that equal one of `lines`, each followed
 * by '|' (grep -x -E 'a|b|c' | head -max | tr '\\n' '|'). */
static void first_of(const char *path, const char *const lines[], int max, char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char buf[4096];
    for (int taken = 0; taken < max && fgets(buf, sizeof buf, f);) {
        buf[strcspn(buf, "\n")] = 0;
        for (int i = 0; lines[i]; i++)
            if (!strcmp(buf, lines[i])) {
                size_t l = strlen(out), k = strlen(buf);
                if (l + k + 2 <= n) {
                    memcpy(out + l, buf, k);
                    memcpy(out + l + k, "|", 2);
                }
                taken++;
                break;
            }
    }
    fclose(f);
}

/* The optimizer section job() writes, for a --set that keeps it. */
#define JOB_SGD "optimizer={name=\"sgd\"; lr=0.1;}"

static void job(char *buf, size_t n, const char *trainer_extra, const char *sched, const char *cb, int n_train) {
    snprintf(buf, n,
             "trainer = { max_epochs = 2; num_sanity_val_steps = 0; log_every_n_steps = 1; %s };\n"
             "data = { name = \"toydata\"; n_train = %d; n_val = 1; };\n"
             "module = { name = \"toymod\"; };\n"
             "optimizer = { name = \"sgd\"; lr = 0.1; };\n%s%s",
             trainer_extra, n_train, sched, cb);
}

/* The scheduler section of the schedfix fixture recording to
 * <suite dir>/<name> (its path into rec). */
static void schedfix_line(char *sched, size_t n, char *rec, size_t rn, const char *name) {
    snprintf(rec, rn, "%s/%s", tu_suite_dir, name);
    snprintf(sched, n, "scheduler = { name = \"schedfix\"; path = \"%s\"; };\n", rec);
}

static void test_step_interval(void) {
    char out[16384], rec[4300], probe[4300], trace[4300], body[32768], sched[9000], cb[9000], got[4096];
    schedfix_line(sched, sizeof sched, rec, sizeof rec, "s1.txt");
    snprintf(probe, sizeof probe, "%s/p1.txt", tu_suite_dir);
    snprintf(trace, sizeof trace, "%s/t1.txt", tu_suite_dir);
    snprintf(cb, sizeof cb,
             "callbacks = ( { name = \"ampprobe\"; path = \"%s\"; }, { name = \"hook_trace\"; path = \"%s\"; } );\n",
             probe, trace);
    job(body, sizeof body, "", sched, cb, 3);
    tu_require_ok(kiln(body, NULL, out, sizeof out), out);
    sched_calls(rec, got, sizeof got, 0);
    CU_ASSERT_STRING_EQUAL(got, "0 0|1 0|2 0|3 0|4 1|5 1|6 1|"); /* construction, then after every step */
    /* the rate each batch trains with */
    tu_join_fields(probe, "lr ", NULL, 3, 3, ' ', got, sizeof got);
    double lr[6];
    CU_ASSERT_EQUAL_FATAL(sscanf(got, "%lf %lf %lf %lf %lf %lf", &lr[0], &lr[1], &lr[2], &lr[3], &lr[4], &lr[5]), 6);
    for (int i = 0; i < 6; i++) CU_ASSERT_DOUBLE_EQUAL(lr[i], 0.1 / (1 + i), 1e-15);
    /* stepped after the optimizer step, before on_train_batch_end (Lightning) */
    first_of(trace, (const char *const[]){"optimizer step batch=1", "host lr_scheduler_step batch=1",
                                          "callback on_train_batch_end batch=1", NULL},
             3, got, sizeof got);
    CU_ASSERT_STRING_EQUAL(got, "optimizer step batch=1|host lr_scheduler_step batch=1|callback on_train_batch_end batch=1|");
}

static void test_accumulate_frequency_epoch(void) {
    char out[16384], rec[4300], body[32768], sched[9000], got[4096];
    schedfix_line(sched, sizeof sched, rec, sizeof rec, "s2.txt");
    job(body, sizeof body, "accumulate_grad_batches = 2;", sched, "", 4);
    CU_ASSERT_EQUAL_FATAL(kiln(body, NULL, out, sizeof out), 0);
    sched_calls(rec, got, sizeof got, 0);
    CU_ASSERT_STRING_EQUAL(got, "0 0|1 0|2 0|3 1|4 1|"); /* only batches that step */
    remove(rec);
    snprintf(sched, sizeof sched, "scheduler = { name = \"schedfix\"; path = \"%s\"; frequency = 2; };\n", rec);
    job(body, sizeof body, "", sched, "", 3);
    CU_ASSERT_EQUAL_FATAL(kiln(body, NULL, out, sizeof out), 0);
    sched_calls(rec, got, sizeof got, 0);
    CU_ASSERT_STRING_EQUAL(got, "0 0|1 0|2 1|"); /* batch_idx + 1 = 2 in each epoch */
    remove(rec);
    snprintf(sched, sizeof sched, "scheduler = { name = \"schedfix\"; path = \"%s\"; interval = \"epoch\"; };\n", rec);
    job(body, sizeof body, "", sched, "", 3);
    CU_ASSERT_EQUAL_FATAL(kiln(body, NULL, out, sizeof out), 0);
    sched_calls(rec, got, sizeof got, 0);
    CU_ASSERT_STRING_EQUAL(got, "0 0|1 0|2 1|"); /* at each epoch's last batch */
}

static void test_monitored(void) {
    char out[16384], rec[4300], body[32768], sched[9000], got[4096];
    snprintf(rec, sizeof rec, "%s/s3.txt", tu_suite_dir);
    snprintf(sched, sizeof sched,
             "scheduler = { name = \"schedfix\"; path = \"%s\"; interval = \"epoch\"; monitor = \"val_loss\"; };\n",
             rec);
    job(body, sizeof body, "", sched, "", 3);
    tu_require_ok(kiln(body, NULL, out, sizeof out), out);
    sched_calls(rec, got, sizeof got, 1);
    /* construction without a metric, then once per epoch with val_loss */
    int s0, e0, s1, e1, s2, e2;
    double m0, m1, m2;
    CU_ASSERT_EQUAL_FATAL(sscanf(got, "%d %d %lf|%d %d %lf|%d %d %lf|", &s0, &e0, &m0, &s1, &e1, &m1, &s2, &e2, &m2), 9);
    CU_ASSERT(s0 == 0 && isnan(m0));
    CU_ASSERT(s1 == 1 && e1 == 0 && isfinite(m1) && m1 > 0);
    CU_ASSERT(s2 == 2 && e2 == 1 && isfinite(m2));
    /* a metric nobody logs, and a monitored schedule per step */
    CU_ASSERT_EQUAL(kiln(body, ARGS("--set", "scheduler.monitor=\"nope\""), out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "conditioned on metric 'nope', which is not available"));
    CU_ASSERT_EQUAL(kiln(body, ARGS("--set", "scheduler.interval=\"step\""), out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "updated once per epoch"));
    CU_ASSERT_EQUAL(kiln(body, ARGS("--set", "scheduler.interval=\"hour\""), out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "scheduler.interval must be"));
}

static void test_resume_schedule(void) {
    char out[32768], rec[4300], body[32768], sched[9000], root[4400], cbs[4400], wa[4300], wb[4300];
    schedfix_line(sched, sizeof sched, rec, sizeof rec, "s4.txt");
    snprintf(wa, sizeof wa, "%s/ws-full.bin", tu_suite_dir);
    snprintf(wb, sizeof wb, "%s/ws-res.bin", tu_suite_dir);
    job(body, sizeof body, "", sched, "", 3);
    snprintf(root, sizeof root, "trainer.default_root_dir=\"%s/sfull\"", tu_suite_dir);
    snprintf(cbs, sizeof cbs, "callbacks=({name=\"weightdump\"; path=\"%s\";})", wa);
    CU_ASSERT_EQUAL_FATAL(kiln(body, ARGS("--set", root, "--set", cbs), out, sizeof out), 0);
    snprintf(root, sizeof root, "trainer.default_root_dir=\"%s/spart\"", tu_suite_dir);
    CU_ASSERT_EQUAL_FATAL(kiln(body, ARGS("--set", root, "--set", "trainer.max_epochs=1"), out, sizeof out), 0);
    remove(rec);
    snprintf(cbs, sizeof cbs, "callbacks=({name=\"weightdump\"; path=\"%s\";})", wb);
    tu_require_ok(kiln(body, ARGS("--set", root, "--ckpt", "last", "--set", cbs), out, sizeof out), out);
    char got[4096];
    sched_calls(rec, got, sizeof got, 1);
    /* constructed (step 0), state restored, then steps 4..6 of epoch 1 */
    CU_ASSERT_PTR_NOT_NULL(strstr(got, "restored 4|4 1 nan|5 1 nan|6 1 nan|"));
    CU_ASSERT_EQUAL(tu_same_file(wa, wb), 1);
}

/* reads "<tag> <batch> v v v ..." (the first line with that tag and batch) */
static int read_vec(const char *path, const char *tag, int batch, double *v, int max) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[8192], t[16];
    int n = -1, b;
    while (fgets(line, sizeof line, f)) {
        int off;
        if (sscanf(line, "%15s %d%n", t, &b, &off) != 2 || strcmp(t, tag) || b != batch) continue;
        n = 0;
        char *p = line + off, *end;
        while (n < max) {
            double x = strtod(p, &end);
            if (end == p) break;
            v[n++] = x;
            p = end;
        }
        break;
    }
    fclose(f);
    return n;
}

/* Every value of column `name` in the latest run's metrics.csv, each
 * followed by '|', as written (so equal strings are equal bits at %.17g). */
static void csv_column(const char *name, char *out, size_t n) {
    char dir[4400], path[4500], line[4096];
    out[0] = 0;
    snprintf(dir, sizeof dir, "%s/runs", tu_suite_dir);
    if (tu_latest_run_dir(dir, path, sizeof path - 16) != 0) return;
    strcat(path, "/metrics.csv");
    FILE *f = fopen(path, "r");
    if (!f) return;
    int col = -1;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        line[strcspn(line, "\n")] = 0;
        char *fields[64];
        int nf = 0;
        for (char *p = line; nf < 64;) { /* fields may be empty: split on every comma */
            fields[nf++] = p;
            char *c = strchr(p, ',');
            if (!c) break;
            *c = 0;
            p = c + 1;
        }
        if (col < 0) {
            for (int i = 0; i < nf; i++)
                if (!strcmp(fields[i], name)) col = i;
            if (col < 0) break;
            continue;
        }
        if (col < nf && fields[col][0]) {
            size_t l = strlen(out), k = strlen(fields[col]);
            if (l + k + 2 <= n) snprintf(out + l, n - l, "%s|", fields[col]);
        }
    }
    fclose(f);
}

/* The first value in column `name` of the newest run's metrics.csv (0
 * when there is none). */
static double first_csv_value(const char *name) {
    char vals[8192];
    csv_column(name, vals, sizeof vals);
    return atof(vals);
}

static void clip_case(const char *algo, double val, const char *tag) {
    char out[16384], probe[4300], body[32768], cb[9000], tr[256];
    snprintf(probe, sizeof probe, "%s/clip-%s.txt", tu_suite_dir, tag);
    snprintf(cb, sizeof cb, "callbacks = ( { name = \"ampprobe\"; path = \"%s\"; dump = 1; }, { name = \"csv_logger\"; } );\n",
             probe);
    snprintf(tr, sizeof tr, "gradient_clip_val = %.17g; gradient_clip_algorithm = \"%s\"; max_epochs = 1;", val, algo);
    job(body, sizeof body, tr, "", cb, 2);
    char *p = strstr(body, "max_epochs = 2;");
    memcpy(p, "               ", 15); /* the trainer_extra sets it */
    p = strstr(body, "lr = 0.1");
    memcpy(p, "lr = 1.0", 8);
    tu_require_ok(kiln(body, NULL, out, sizeof out), out);
    double g[64], w0[64], w1[64];
    int n = read_vec(probe, "bosg", 0, g, 64);
    CU_ASSERT_FATAL(n > 0);
    CU_ASSERT_EQUAL_FATAL(read_vec(probe, "bsw", 0, w0, 64), n);
    CU_ASSERT_EQUAL_FATAL(read_vec(probe, "bew", 0, w1, 64), n);
    double norm = 0;
    for (int i = 0; i < n; i++) norm += g[i] * g[i];
    norm = sqrt(norm);
    double coef = val / (norm + 1e-6);
    if (coef > 1) coef = 1;
    int clipped = 0;
    for (int i = 0; i < n; i++) {
        double gc = !strcmp(algo, "norm") ? g[i] * coef : (g[i] > val ? val : g[i] < -val ? -val : g[i]);
        clipped |= gc != g[i];
        CU_ASSERT_DOUBLE_EQUAL(w1[i], w0[i] - gc, 1e-6 * (fabs(w0[i]) + 1e-3)); /* SGD, lr 1 */
    }
    CU_ASSERT(clipped); /* the case really clips */
    if (!strcmp(algo, "norm")) { /* the pre-clip total norm is logged */
        CU_ASSERT_DOUBLE_EQUAL(first_csv_value("grad_norm"), norm, 1e-6 * norm);
    }
}

static void test_clipping(void) {
    clip_case("norm", 0.01, "norm");
    clip_case("value", 0.002, "value");
    char out[16384], body[32768];
    job(body, sizeof body, "gradient_clip_algorithm = \"l3\";", "", "", 2);
    CU_ASSERT_EQUAL(kiln(body, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "gradient_clip_algorithm must be \"norm\" or \"value\""));
    const char *manual = "data = { name = \"toydata\"; };\nmodule = { name = \"manualmod\"; path = \"/dev/null\"; };\n"
                         "optimizer = \"sgd\";\ntrainer = { gradient_clip_val = 1.0; };\n";
    CU_ASSERT_EQUAL(kiln(manual, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "automatic clipping is not available in manual optimization"));
    /* and at config check, before anything runs */
    char cfg[4300];
    snprintf(cfg, sizeof cfg, "%s/manual-clip.cfg", tu_suite_dir);
    tu_write_job(cfg, manual);
    CU_ASSERT_EQUAL(tu_run_kiln_l(out, sizeof out, "config", "check", cfg, NULL), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "automatic clipping is not available in manual optimization"));
}

/* mlp (float32 and float64 masters) on toydata's 3 features, 3 epochs
 * clipping as `clip` says, with the optimizer section `optimizer`, on the
 * cpu accelerator and on `fixture` (the cpu accelerator built against
 * older headers, in the directory named by the environment variable
 * `env`): the same weights bit for bit, and the same logged grad_norm
 * values where `norm`. */
static void clip_same_on_fixture(const char *env, const char *fixture, const char *clip, const char *optimizer,
                                 int norm) {
    const char *dir = getenv(env);
    if (!dir) {
        CU_FAIL("a fixture directory's environment variable is not set");
        return;
    }
    static const char *const precs[2] = {"32-true", "64-true"};
    for (int pi = 0; pi < 2; pi++) {
        char w[2][4300], out[16384], body[32768], dirs[9000], accel[64], prec[64], cbs[9000], gn[2][8192];
        for (int side = 0; side < 2; side++) {
            snprintf(w[side], sizeof w[side], "%s/clip-%s-%d-%d.bin", tu_suite_dir, fixture, pi, side);
            job(body, sizeof body, clip, "", "", 3);
            snprintf(dirs, sizeof dirs, "plugins.dirs=[\"%s\", \"%s\"]", getenv("KILN_TRAIN_FIXTURES"), dir);
            snprintf(accel, sizeof accel, "accelerator=\"%s\"", side ? fixture : "cpu");
            snprintf(prec, sizeof prec, "precision=\"%s\"", precs[pi]);
            snprintf(cbs, sizeof cbs, "callbacks=({name=\"weightdump\"; path=\"%s\";}, {name=\"csv_logger\";})",
                     w[side]);
            int rc = kiln(body,
                          ARGS("--set", dirs, "--set", accel, "--set", prec, "--set",
                               "module={name=\"mlp\"; layers=[3, 8, 2];}", "--set", cbs, "--set", optimizer),
                          out, sizeof out);
            tu_require_ok(rc, out);
            csv_column("grad_norm", gn[side], sizeof gn[side]);
        }
        CU_ASSERT_EQUAL(tu_same_file(w[0], w[1]), 1);
        if (norm) {
            CU_ASSERT(strlen(gn[0]) > 8); /* one value per step */
            CU_ASSERT_STRING_EQUAL(gn[0], gn[1]);
        }
    }
}

/* Value clipping through the 1.5 table's clamp entry (the cpu
 * accelerator) against the host loop it replaced, which still serves older
 * host-memory tables (cpu13: the cpu accelerator built against the 1.3
 * headers), in float32 and float64. */
static void test_clip_value_clamp_entry(void) {
    clip_same_on_fixture("KILN_ABI13_FIXTURES", "cpu13:cpu",
                         "gradient_clip_val = 0.002; gradient_clip_algorithm = \"value\";", JOB_SGD, 0);
}

/* Norm clipping through 1.9's sumsq_many (one call for every gradient)
 * against one sumsq per parameter, which a 1.8 table (cpu18) still gets:
 * the same norms and weights, bit for bit. */
static void test_clip_norm_sumsq_many(void) {
    clip_same_on_fixture("KILN_ABI18_FIXTURES", "cpu18:cpu",
                         "gradient_clip_val = 0.002; gradient_clip_algorithm = \"norm\";", JOB_SGD, 1);
}

/* adamw through 1.10's adamw_update_many (one call for every parameter)
 * against one adamw_update per parameter, which a 1.9 table (cpu19) still
 * gets: the same weights, bit for bit, with weight decay on the weights
 * and none on the biases (the list's per-tensor decay), in float32 and
 * float64. */
static void test_adamw_update_many(void) {
    clip_same_on_fixture("KILN_ABI19_FIXTURES", "cpu19:cpu", "gradient_clip_val = 0.5;",
                         "optimizer={name=\"adamw\"; lr=0.05; weight_decay=0.3; beta2=0.95;}", 1);
}

static CU_TestInfo cases_lr_clip[] = {
    {"scheduler per step: timing and rates", test_step_interval},
    {"scheduler: accumulation, frequency, per epoch", test_accumulate_frequency_epoch},
    {"monitored scheduler and its errors", test_monitored},
    {"resume continues the schedule", test_resume_schedule},
    {"clipping by norm and by value", test_clipping},
    {"clipping by value: the clamp entry equals the host loop bit for bit", test_clip_value_clamp_entry},
    {"clipping by norm: sumsq_many equals one sumsq per parameter bit for bit", test_clip_norm_sumsq_many},
    {"adamw: adamw_update_many equals one update per parameter bit for bit", test_adamw_update_many},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    CU_SuiteInfo suites[] = {
        {.pName = "lr_clip", .pInitFunc = tu_suite_dir_init, .pCleanupFunc = tu_suite_dir_clean, .pTests = cases_lr_clip},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
