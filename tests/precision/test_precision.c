/*
 * tests/precision/test_precision.c — the precision plugins. Through the mock
 * host on the real cpu accelerator: the fp16/bf16 compute copies against
 * bit patterns worked out by hand, and the 16-mixed GradScaler (skip and
 * back off on inf, growth after the interval, no step without a loss, state
 * round trip, refusal of a 1.1 kernel table). Through the kiln executable:
 * the hooks see the scaled loss and scaled gradients and
 * on_before_optimizer_step the unscaled ones; skipped steps leave the
 * weights untouched while global_step advances; the trace order of a
 * scaler step; 64-true trains with fp64 masters close to 32-true; and the
 * property-based refusals at `kiln config check`.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include <kiln/testing.h>

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */
#include "half_bits.h"
#include "plugin_fixture.h"
#include "testutil.h"

/* ---------------------------------------------------------------- mock env */

static const kiln_plugin_desc *g_cpu, *g_m16, *g_mbf;
static kiln_instance *g_acc;
static kiln_parameter *g_w, *g_b; /* weight (2, 4), bias (2) */
static char *g_dir;

static int suite_init(void) {
    g_cpu = fixture_load_plugin(g_th, "cpu", KILN_KIND_ACCELERATOR, "cpu");
    g_m16 = fixture_load_plugin(g_th, "mixed", KILN_KIND_PRECISION, "16-mixed");
    g_mbf = fixture_load_plugin(g_th, "mixed", KILN_KIND_PRECISION, "bf16-mixed");
    g_dir = tu_mkdtemp();
    return g_cpu && g_m16 && g_mbf && g_dir ? 0 : -1;
}

static int suite_clean(void) {
    if (g_dir) tu_rmrf(g_dir);
    free(g_dir);
    return 0;
}

static void env_begin(void) {
    kiln_test_reset(g_th);
    const int64_t wshape[2] = {2, 4}, bshape[1] = {2};
    g_w = fixture_param(g_th, "w", 2, wshape, 0);
    g_b = fixture_param(g_th, "b", 1, bshape, KILN_PARAMF_NO_DECAY);
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(g_th), 0);
    g_acc = fixture_accel_install(g_th, g_cpu);
}

static void env_end(void) { fixture_accel_remove(g_th, g_cpu, &g_acc); }

static const kiln_precision_ops *pops(const kiln_plugin_desc *d) { return d->ops; }

static kiln_instance *make16(double init_scale, int64_t growth_interval) {
    const kiln_kv cfg[] = {{"init_scale", KILN_V_FLOAT(init_scale)},
                           {"growth_factor", KILN_V_FLOAT(2.0)},
                           {"backoff_factor", KILN_V_FLOAT(0.5)},
                           {"growth_interval", KILN_V_INT(growth_interval)},
                           {NULL, KILN_V_NONE}};
    kiln_instance *inst = NULL;
    CU_ASSERT_EQUAL(pops(g_m16)->base.create(g_m16->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &inst), KILN_OK);
    return inst;
}


/* ----------------------------------------------------- compute copies */

static void test_fp16_compute_copy(void) {
    env_begin();
    const float masters[8] = {1.0f, 1.0f + 0x1p-12f, 70000.0f, 1e-8f, -2.5f, 65519.0f, 3.0e-5f, 0.1f};
    const double expect[8] = {1.0, 1.0, INFINITY, 0.0, -2.5, 65504.0, 503 * 0x1p-24, 0.0999755859375};
    memcpy(g_w->data, masters, sizeof masters);
    kiln_instance *p = make16(65536.0, 2000);
    CU_ASSERT_EQUAL_FATAL(pops(g_m16)->setup(p, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    CU_ASSERT_EQUAL(g_w->compute_dtype, KILN_DTYPE_F16);
    CU_ASSERT_PTR_NOT_EQUAL(g_w->compute, g_w->data);
    CU_ASSERT_EQUAL(g_b->compute_dtype, KILN_DTYPE_F32); /* biases stay fp32 */
    CU_ASSERT_PTR_EQUAL(g_b->compute, g_b->data);
    CU_ASSERT_EQUAL_FATAL(pops(g_m16)->convert_params(p), KILN_OK);
    const uint16_t *h = g_w->compute;
    for (int i = 0; i < 8; i++) {
        double got = hb_f16_value(h[i]);
        if (!(got == expect[i])) fprintf(stderr, "\n  fp16[%d] of %.9g: got %.9g, expected %.9g\n", i, masters[i], got, expect[i]);
        CU_ASSERT(got == expect[i]);
    }
    for (int i = 0; i < 8; i++) CU_ASSERT_EQUAL(g_w->data[i], masters[i]); /* masters untouched */
    pops(g_m16)->base.destroy(p);
    env_end();
}

static void test_bf16_compute_copy(void) {
    env_begin();
    const float masters[8] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 70000.0f, 0.1f, -3.0f, 3.0e38f, 1e-30f, 0.0f};
    const double expect[8] = {1.0, 1.0 + 0x1p-6, 70144.0, 0.10009765625, -3.0, 226 * 0x1p120, 0, 0.0};
    memcpy(g_w->data, masters, sizeof masters);
    kiln_instance *p = NULL;
    CU_ASSERT_EQUAL_FATAL(pops(g_mbf)->base.create(g_mbf->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), NULL, &p), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(pops(g_mbf)->setup(p, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    CU_ASSERT_EQUAL(g_w->compute_dtype, KILN_DTYPE_BF16);
    CU_ASSERT_EQUAL_FATAL(pops(g_mbf)->convert_params(p), KILN_OK);
    const uint16_t *h = g_w->compute;
    for (int i = 0; i < 8; i++) {
        double got = hb_bf16_value(h[i]), want = expect[i];
        if (i == 6) want = hb_bf16_value(0x0DA2); /* 1e-30: 0x0DA24260 rounds down to 0x0DA2 */
        if (!(got == want)) fprintf(stderr, "\n  bf16[%d] of %.9g: got %.17g, expected %.17g\n", i, masters[i], got, want);
        CU_ASSERT(got == want);
    }
    double scale = 0;
    CU_ASSERT_EQUAL(pops(g_mbf)->pre_backward(p, 1.0, &scale), KILN_OK);
    CU_ASSERT_EQUAL(scale, 1.0); /* no scaler */
    pops(g_mbf)->base.destroy(p);
    env_end();
}

/* Masters laid out back to back, as the host's arena lays them out: the
 * weights' copies share one buffer (each at its master's offset, two bytes
 * per element) and convert together, the bias between them converted in
 * passing; a 1-D parameter larger than MX_SPAN_SKIP (65536 elements) and a
 * master not adjacent to the previous one start new buffers. Every copy
 * holds its weight's bf16 values; biases keep compute = masters. */
static void test_copies_share_spans(void) {
    kiln_test_reset(g_th);
    enum { NPAR = 6 };
    const int64_t s44[2] = {4, 4}, s16[1] = {16}, s28[2] = {2, 8}, sbig[1] = {70000};
    kiln_parameter *q[NPAR] = {fixture_param(g_th, "w1", 2, s44, 0), fixture_param(g_th, "b1", 1, s16, 0),
                               fixture_param(g_th, "w2", 2, s28, 0), fixture_param(g_th, "big", 1, sbig, 0),
                               fixture_param(g_th, "w3", 2, s28, 0), fixture_param(g_th, "w4", 2, s44, 0)};
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(g_th), 0);
    g_acc = fixture_accel_install(g_th, g_cpu);
    /* one arena: w1 b1 w2 big w3, then a gap of 16 floats before w4 */
    const size_t at[NPAR] = {0, 16, 32, 48, 70048, 70080};
    float *arena = calloc(70096, sizeof(float)), *own[NPAR];
    CU_ASSERT_FATAL(arena != NULL);
    for (int i = 0; i < NPAR; i++) {
        own[i] = q[i]->data;
        q[i]->data = arena + at[i];
        for (int64_t e = 0; e < q[i]->numel; e++) q[i]->data[e] = 1.0f + (float)(i * 100 + e) * 0x1p-10f;
    }
    kiln_instance *p = NULL;
    CU_ASSERT_EQUAL_FATAL(pops(g_mbf)->base.create(g_mbf->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), NULL, &p), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(pops(g_mbf)->setup(p, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    const char *c0 = q[0]->compute;
    CU_ASSERT_PTR_EQUAL(q[2]->compute, c0 + 32 * 2); /* w2 in w1's buffer, at its master's offset */
    CU_ASSERT_PTR_EQUAL(q[1]->compute, q[1]->data);  /* biases and norms: their masters */
    CU_ASSERT_PTR_EQUAL(q[3]->compute, q[3]->data);
    CU_ASSERT((const char *)q[4]->compute != c0 + 70048 * 2); /* past the large 1-D one: a buffer of its own */
    CU_ASSERT((const char *)q[5]->compute != (const char *)q[4]->compute + 32 * 2); /* after the gap: likewise */
    CU_ASSERT_EQUAL_FATAL(pops(g_mbf)->convert_params(p), KILN_OK);
    int bad = 0;
    for (int i = 0; i < NPAR; i++) {
        if (q[i]->ndim < 2) continue;
        CU_ASSERT_EQUAL(q[i]->compute_dtype, KILN_DTYPE_BF16);
        const uint16_t *h = q[i]->compute;
        for (int64_t e = 0; e < q[i]->numel; e++) {
            uint32_t bits;
            memcpy(&bits, &q[i]->data[e], sizeof bits);
            const uint32_t rne = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16; /* finite values */
            bad += h[e] != (uint16_t)rne;
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    pops(g_mbf)->base.destroy(p);
    for (int i = 0; i < NPAR; i++) q[i]->data = own[i];
    free(arena);
    env_end();
}

/* ---------------------------------------------------------------- scaler */

typedef struct {
    kiln_instance *prec;
    double grad_value;      /* the true gradient of every weight element  */
    int return_no_loss;
    int closure_calls, opt_steps, after_calls;
    float grad_seen_after;  /* w.grad[0] when on_before_optimizer_step ran */
} scaler_ctx;

/* The closure as the host runs it: the loss is scaled by pre_backward's
 * factor, and the backward writes gradients the fp16 matmul would produce
 * (scale * g, rounded through fp16). */
static int32_t fake_closure(void *vctx, double *loss) {
    scaler_ctx *c = vctx;
    c->closure_calls++;
    if (c->return_no_loss) { *loss = NAN; return KILN_OK; }
    double scale = 0;
    CU_ASSERT_EQUAL(pops(g_m16)->pre_backward(c->prec, 0.7, &scale), KILN_OK);
    for (int i = 0; i < 8; i++) g_w->grad[i] = (float)(scale * c->grad_value);
    for (int i = 0; i < 2; i++) g_b->grad[i] = (float)(scale * 0.5);
    CU_ASSERT_EQUAL(kiln_test_kernels(g_th)->round_to(g_acc, g_w->grad, KILN_DTYPE_F16, 8), KILN_OK);
    CU_ASSERT_EQUAL(kiln_test_kernels(g_th)->round_to(g_acc, g_b->grad, KILN_DTYPE_F16, 2), KILN_OK);
    *loss = 0.7;
    return KILN_OK;
}

static int32_t fake_after(void *vctx, double *loss) {
    scaler_ctx *c = vctx;
    (void)loss;
    c->after_calls++;
    c->grad_seen_after = g_w->grad[0];
    return KILN_OK;
}

static int32_t fake_opt_step(void *vctx, const kiln_closure *closure) {
    scaler_ctx *c = vctx;
    CU_ASSERT_PTR_NULL(closure); /* the scaler ran the closure itself */
    c->opt_steps++;
    return KILN_OK;
}

/* One optimizer step through the plugin; returns `skipped`. */
static int scaler_step(scaler_ctx *c) {
    kiln_closure cl = {sizeof cl, 0, c, fake_closure}, after = {sizeof after, 0, c, fake_after};
    kiln_optimizer_ref opt = {sizeof opt, 0, c, fake_opt_step};
    int32_t skipped = -1;
    CU_ASSERT_EQUAL(pops(g_m16)->optimizer_step(c->prec, &opt, &cl, &after, &skipped), KILN_OK);
    return skipped;
}

static double current_scale(kiln_instance *p) {
    double s = 0;
    pops(g_m16)->pre_backward(p, 1.0, &s);
    return s;
}

/* The cpu table with scale and unscale_check counted, whole (1.3) or cut
 * to 1.2's size, to see which way the scaler unscales. */
static const kiln_kernels *g_real_k;
static int g_n_scale, g_n_unscale_check;
static int32_t count_scale(kiln_instance *acc, float *x, float a, size_t n) {
    g_n_scale++;
    return g_real_k->scale(acc, x, a, n);
}
static int32_t count_unscale_check(kiln_instance *acc, uint32_t dt, void *const *x, const size_t *n, uint32_t count,
                                   double a, int32_t *finite) {
    g_n_unscale_check++;
    return g_real_k->unscale_check(acc, dt, x, n, count, a, finite);
}

/* The GradScaler sequence (skips, backoff, growth) with the accelerator's
 * table as of ABI `minor`: 1.3 unscales through unscale_check in one call
 * per step, 1.2 through scale + all_finite per parameter; the same results. */
static void scaler_sequence(int minor) {
    env_begin();
    kiln_kernels counted = *kiln_test_kernels(g_th);
    g_real_k = kiln_test_kernels(g_th);
    counted.scale = count_scale;
    counted.unscale_check = count_unscale_check;
    counted.struct_size = minor >= 3 ? (uint32_t)sizeof counted : (uint32_t)KILN_KERNELS_SIZE_1_2;
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), &counted);
    g_n_scale = g_n_unscale_check = 0;
    scaler_ctx c = {0};
    c.prec = make16(0x1p20, 3);
    c.grad_value = 1.0;
    CU_ASSERT_EQUAL_FATAL(pops(g_m16)->setup(c.prec, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    /* scale*1.0 overflows fp16 (> 65504) at 2^20 .. 2^16: five skips, each
     * halving the scale; at 2^15 the gradients are finite. */
    const double scale_before[9] = {0x1p20, 0x1p19, 0x1p18, 0x1p17, 0x1p16, 0x1p15, 0x1p15, 0x1p15, 0x1p16};
    const int skipped[9] = {1, 1, 1, 1, 1, 0, 0, 0, 1};
    int steps = 0;
    for (int s = 0; s < 9; s++) {
        CU_ASSERT_EQUAL(current_scale(c.prec), scale_before[s]);
        int before = c.opt_steps;
        int sk = scaler_step(&c);
        CU_ASSERT_EQUAL(sk, skipped[s]);
        CU_ASSERT_EQUAL(c.opt_steps - before, skipped[s] ? 0 : 1); /* no update on a skipped step */
        CU_ASSERT_EQUAL(c.after_calls, s + 1);                     /* the hook runs either way */
        /* on_before_optimizer_step sees unscaled gradients: 1.0, or inf */
        if (skipped[s]) {
            CU_ASSERT(isinf(c.grad_seen_after));
        } else {
            CU_ASSERT_EQUAL(c.grad_seen_after, 1.0f);
        }
        steps++;
    }
    /* after 3 clean steps at 2^15 it grew to 2^16, which overflowed again */
    CU_ASSERT_EQUAL(current_scale(c.prec), 0x1p15);
    CU_ASSERT_EQUAL(c.opt_steps, 3);
    CU_ASSERT_EQUAL(c.closure_calls, 9);
    CU_ASSERT_DOUBLE_EQUAL(kiln_test_last_value(g_th, "amp_scale"), 0x1p15, 0);
    CU_ASSERT_EQUAL(g_b->grad[0], 0.5f); /* last step unscaled exactly */

    /* the scaler state round-trips into a fresh instance */
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(pops(g_m16)->base.get_state(c.prec, &ver, &blob, &size), KILN_OK);
    kiln_instance *q = make16(1.0, 3);
    CU_ASSERT_EQUAL(pops(g_m16)->base.set_state(q, ver, blob, size), KILN_OK);
    CU_ASSERT_EQUAL(current_scale(q), 0x1p15);
    CU_ASSERT_EQUAL(pops(g_m16)->base.set_state(q, ver + 1, blob, size), KILN_E_STATE);
    CU_ASSERT_EQUAL(pops(g_m16)->base.set_state(q, ver, blob, size - 1), KILN_E_STATE);
    ((unsigned char *)blob)[0] ^= 0xFF;
    CU_ASSERT_EQUAL(pops(g_m16)->base.set_state(q, ver, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "corrupt"));
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    pops(g_m16)->base.destroy(q);
    pops(g_m16)->base.destroy(c.prec);
    /* 9 unscales: one unscale_check each (1.3), or one scale per parameter */
    CU_ASSERT_EQUAL(g_n_unscale_check, minor >= 3 ? 9 : 0);
    CU_ASSERT_EQUAL(g_n_scale, minor >= 3 ? 0 : 9 * (int)kiln_test_param_count(g_th));
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), g_real_k);
    env_end();
}

static void test_scaler_skip_backoff_growth(void) { scaler_sequence(3); }
static void test_scaler_table_1_2(void) { scaler_sequence(2); }

/* A closure without a loss: Lightning does not step and does not update
 * the scaler. */
static void test_scaler_no_loss(void) {
    env_begin();
    scaler_ctx c = {0};
    c.prec = make16(1024.0, 1);
    c.return_no_loss = 1;
    CU_ASSERT_EQUAL_FATAL(pops(g_m16)->setup(c.prec, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    CU_ASSERT_EQUAL(scaler_step(&c), 0);
    CU_ASSERT_EQUAL(c.opt_steps, 0);
    CU_ASSERT_EQUAL(c.after_calls, 1); /* on_before_optimizer_step still runs */
    CU_ASSERT_EQUAL(current_scale(c.prec), 1024.0); /* growth_interval 1 would have doubled it */
    /* manual optimisation: the module's closure may have no loss, it steps */
    kiln_test_trainer(g_th)->automatic_optimization = 0;
    CU_ASSERT_EQUAL(scaler_step(&c), 0);
    CU_ASSERT_EQUAL(c.opt_steps, 1);
    CU_ASSERT_EQUAL(current_scale(c.prec), 2048.0);
    pops(g_m16)->base.destroy(c.prec);
    env_end();
}

static void test_refusals(void) {
    env_begin();
    /* a 1.1 kernel table has no cast/round_to/gemm_ex */
    kiln_kernels old = *kiln_test_kernels(g_th);
    old.struct_size = KILN_KERNELS_SIZE_1_1;
    const kiln_kernels *real = kiln_test_kernels(g_th);
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), &old);
    kiln_instance *p = make16(1024.0, 10);
    CU_ASSERT_EQUAL(pops(g_m16)->setup(p, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "ABI 1.2"));
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), real);
    pops(g_m16)->base.destroy(p);
    /* bad scaler settings */
    const kiln_kv bad[] = {{"init_scale", KILN_V_FLOAT(1024.0)},
                           {"growth_factor", KILN_V_FLOAT(0.5)},
                           {"backoff_factor", KILN_V_FLOAT(0.5)},
                           {"growth_interval", KILN_V_INT(10)},
                           {NULL, KILN_V_NONE}};
    p = NULL;
    CU_ASSERT_EQUAL(pops(g_m16)->base.create(g_m16->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), bad, &p), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "growth_factor must be > 1, got 0.5"));
    CU_ASSERT_PTR_NULL(p);
    env_end();
}

/* ------------------------------------------------------ through kiln fit */

static int run_kiln(const char *verb, const char *body, const char *extra, char *out, size_t outlen) {
    char cfg[4200], root_set[4400];
    tu_write_job(tu_job_path(cfg, sizeof cfg, g_dir, "p"), body);
    tu_root_set(root_set, sizeof root_set, "%s/runs", g_dir);
    const char *check[] = {"config", "check", cfg, NULL}, *fit[] = {"-q", "fit", cfg, "--set", root_set, NULL};
    return tu_run_kiln(!strcmp(verb, "check") ? check : fit, extra, out, outlen);
}

/* The trace lines of one batch (ending in `batch`, e.g. "batch=0") that
 * belong to the optimizer step (optimizer step, training_step,
 * on_before_optimizer_step, clipping), each followed by '|' (grep -E
 * 'batch=0$' | grep -E '...' | tr '\\n' '|'); -1 when the trace cannot be
 * read. */
static int step_calls(const char *trace, const char *batch, char *out, size_t n) {
    static const char *const parts[] = {"optimizer step", "training_step", "on_before_optimizer_step", "clipping"};
    FILE *f = fopen(trace, "r");
    out[0] = 0;
    if (!f) return -1;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        const size_t l = strlen(line), b = strlen(batch);
        if (l < b || strcmp(line + l - b, batch)) continue;
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            if (strstr(line, parts[i])) {
                if (strlen(out) + l + 2 <= n) strcat(strcat(out, line), "|");
                break;
            }
    }
    fclose(f);
    return 0;
}

/* The lines of `text` that end with `suffix`, each followed by a newline,
 * into out (grep 'suffix$'); returns how many. `text` is cut up. */
static int lines_ending(char *text, const char *suffix, char *out, size_t n) {
    int found = 0;
    out[0] = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        const size_t len = strlen(l), k = strlen(suffix);
        if (len < k || strcmp(l + len - k, suffix)) continue;
        found++;
        if (strlen(out) + len + 2 <= n) strcat(strcat(out, l), "\n");
    }
    return found;
}

#define MLP_JOB(prec, extra_cb)                                                                   \
    "trainer = { max_epochs = 1; seed = 3; num_sanity_val_steps = 0; log_every_n_steps = 5; };\n" \
    "data = { name = \"toydata\"; n_train = 20; n_val = 1; features = 3; };\n"                    \
    "module = { name = \"mlp\"; layers = [3, 8, 2]; max_batch = 4; };\n"                          \
    "optimizer = { name = \"sgd\"; lr = 0.1; };\n"                                                \
    "precision = " prec ";\n"                                                                     \
    "callbacks = ( " extra_cb " );\n"

typedef struct { long batch; double a, b, c, d; } probe_line;

/* Reads the ampprobe lines of one kind ("bb", "be", ...) into out. */
static int read_probe(const char *path, const char *kind, probe_line *out, int max) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512], k[8];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < max) {
        probe_line p = {0, NAN, NAN, NAN, NAN};
        if (sscanf(line, "%7s", k) != 1 || strcmp(k, kind)) continue;
        if (!strcmp(kind, "ws")) sscanf(line, "%*s %lf", &p.a);
        else sscanf(line, "%*s %ld %lf %lf %lf %lf", &p.batch, &p.a, &p.b, &p.c, &p.d);
        out[n++] = p;
    }
    fclose(f);
    return n;
}

/* on_before_backward gets loss * scale, on_after_backward the scaled
 * gradients, on_before_optimizer_step the unscaled ones (docs/precision.md). */
static void test_hooks_see_scaled_values(void) {
    char out[16384], probe[4300], body[16384], cb[4400];
    snprintf(probe, sizeof probe, "%s/amp16.txt", g_dir);
    snprintf(cb, sizeof cb, "{ name = \"ampprobe\"; path = \"%s\"; }, { name = \"csv_logger\"; }", probe);
    snprintf(body, sizeof body,
             MLP_JOB("{ name = \"16-mixed\"; init_scale = 1024.0; growth_interval = 1000; }", "%s"), cb);
    tu_require_ok(run_kiln("fit", body, NULL, out, sizeof out), out);
    probe_line bb[64], ab[64], bos[64], be[64];
    int n = read_probe(probe, "bb", bb, 64);
    CU_ASSERT_EQUAL_FATAL(n, 20);
    CU_ASSERT_EQUAL(read_probe(probe, "ab", ab, 64), 20);
    CU_ASSERT_EQUAL(read_probe(probe, "bos", bos, 64), 20);
    CU_ASSERT_EQUAL(read_probe(probe, "be", be, 64), 20);
    for (int i = 0; i < n; i++) {
        CU_ASSERT_DOUBLE_EQUAL(bb[i].a, 1024.0 * be[i].a, 1e-12 * fabs(bb[i].a));
        CU_ASSERT(ab[i].a > 0);
        CU_ASSERT_DOUBLE_EQUAL(ab[i].a / bos[i].a, 1024.0 * 1024.0, 1e-6);
        CU_ASSERT_EQUAL(be[i].b, i + 1); /* no skips at this scale: every step counted */
        CU_ASSERT_EQUAL(be[i].d, 1024.0);
    }
    /* the summary prints every property the plugin reports, in its order */
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "precision: 16-mixed amp_backend=native amp_level=none param_dtype=float32 "
                                       "compute_dtype=float16 grad_dtype=float32 needs_grad_scaler=true"));
    /* metrics.csv is plain CSV, header first; the precision as the plugin
     * describes itself is in hparams.yaml beside it */
    char runs[4300], run_dir[4400], path[4500];
    snprintf(runs, sizeof runs, "%s/runs", g_dir);
    CU_ASSERT_EQUAL_FATAL(tu_latest_run_dir(runs, run_dir, sizeof run_dir), 0);
    snprintf(path, sizeof path, "%s/metrics.csv", run_dir);
    char *csv = fixture_slurp(path);
    snprintf(path, sizeof path, "%s/hparams.yaml", run_dir);
    char *hparams = fixture_slurp(path);
    CU_ASSERT_PTR_NOT_NULL_FATAL(csv);
    CU_ASSERT_PTR_NOT_NULL_FATAL(hparams);
    size_t header = strcspn(csv, "\n") + (csv[strcspn(csv, "\n")] == '\n'); /* head -1 */
    snprintf(out, sizeof out, "%.*s%s", (int)header, csv, hparams);
    free(csv);
    free(hparams);
    CU_ASSERT_EQUAL(strncmp(out, "step,", 5), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "amp_scale"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "precision:\n  \"precision\": \"16-mixed\"\n  \"amp_backend\": \"native\"\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "  \"needs_grad_scaler\": true\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "  \"aliases\": ["));

    /* the same job in 32-true: scale 1, nothing to unscale */
    snprintf(body, sizeof body, MLP_JOB("\"32-true\"", "%s"), cb);
    CU_ASSERT_EQUAL_FATAL(run_kiln("fit", body, NULL, out, sizeof out), 0);
    CU_ASSERT_EQUAL_FATAL(read_probe(probe, "bb", bb, 64), 20);
    read_probe(probe, "ab", ab, 64);
    read_probe(probe, "bos", bos, 64);
    read_probe(probe, "be", be, 64);
    for (int i = 0; i < 20; i++) {
        CU_ASSERT_EQUAL(bb[i].a, be[i].a);
        CU_ASSERT_EQUAL(ab[i].a, bos[i].a);
        CU_ASSERT(isnan(be[i].d)); /* 32-true logs no scale */
    }
}

/* fp16 overflow forced by a huge initial scale: the first steps are skipped
 * (weights untouched), the scale halves each time until the gradients are
 * finite, and global_step counts every step. */
static void test_overflow_skips_steps(void) {
    char out[32768], probe[4300], trace[4300], body[16384], cb[9000];
    snprintf(probe, sizeof probe, "%s/ampskip.txt", g_dir);
    snprintf(trace, sizeof trace, "%s/ampskip-trace.txt", g_dir);
    snprintf(cb, sizeof cb, "{ name = \"ampprobe\"; path = \"%s\"; }, { name = \"hook_trace\"; path = \"%s\"; }", probe,
             trace);
    snprintf(body, sizeof body,
             MLP_JOB("{ name = \"16-mixed\"; init_scale = 16777216.0; growth_interval = 1000; }", "%s"), cb);
    tu_require_ok(run_kiln("fit", body, NULL, out, sizeof out), out);
    probe_line ws[2], be[64];
    CU_ASSERT_EQUAL_FATAL(read_probe(probe, "ws", ws, 2), 1);
    int n = read_probe(probe, "be", be, 64);
    CU_ASSERT_EQUAL_FATAL(n, 20);
    double prev_scale = 16777216.0, prev_ws = ws[0].a;
    int nskipped = 0, first_clean = -1;
    for (int i = 0; i < n; i++) {
        CU_ASSERT_EQUAL(be[i].b, i + 1); /* global_step advances on skipped steps too */
        int skipped = be[i].d == prev_scale / 2;
        if (!skipped) {
            CU_ASSERT_EQUAL(be[i].d, prev_scale);
        }
        if (skipped) {
            nskipped++;
            CU_ASSERT_EQUAL(be[i].c, prev_ws); /* weights untouched */
        } else {
            if (first_clean < 0) first_clean = i;
            CU_ASSERT_NOT_EQUAL(be[i].c, prev_ws);
        }
        prev_scale = be[i].d;
        prev_ws = be[i].c;
    }
    CU_ASSERT(nskipped >= 3);
    CU_ASSERT(first_clean >= 3 && first_clean < 15);
    for (int i = 0; i < first_clean; i++) CU_ASSERT_EQUAL(be[i].d, 16777216.0 / (double)(2 << i)); /* halved each time */
    char want[128];
    snprintf(want, sizeof want, "steps: 20  skipped steps: %d", nskipped);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, want));

    /* trace: the scaler runs the closure itself, then on_before_optimizer_step,
     * then the optimizer only on a clean step */
    CU_ASSERT_EQUAL(step_calls(trace, "batch=0", out, sizeof out), 0);
    CU_ASSERT_STRING_EQUAL(out, "module training_step batch=0|callback on_before_optimizer_step batch=0|"
                                "module on_before_optimizer_step batch=0|module configure_gradient_clipping batch=0|");
    CU_ASSERT_EQUAL(step_calls(trace, "batch=19", out, sizeof out), 0);
    CU_ASSERT_STRING_EQUAL(out, "module training_step batch=19|callback on_before_optimizer_step batch=19|"
                                "module on_before_optimizer_step batch=19|module configure_gradient_clipping batch=19|"
                                "optimizer step batch=19|");
}

/* Every precision trains mlp to the same weights, bit for bit, on the cpu
 * accelerator (ABI 1.4; mlp's Linear layers through linear_forward, the
 * scaler through unscale_check), on the same accelerator built against the
 * frozen 1.2 headers (tests/abi-1.2, libkiln-cpu12.so: mlp and the scaler
 * take their 1.2 fallbacks) and against the frozen 1.3 headers
 * (tests/abi-1.3, libkiln-cpu13.so: a table without the 1.4 entries, which
 * mlp does not use). 16-mixed starts at a scale that overflows, so the skip
 * path is compared too. */
static void test_same_weights_on_older_accelerators(void) {
    static const char *const precs[] = {"{ name = \"16-mixed\"; init_scale = 16777216.0; growth_interval = 4; }",
                                        "\"bf16-mixed\"", "\"32-true\"", "\"64-true\""};
    static const char *const env[3] = {NULL, "KILN_ABI12_FIXTURES", "KILN_ABI13_FIXTURES"};
    static const char *const accel[3] = {"cpu", "cpu12:cpu", "cpu13:cpu"};
    for (size_t p = 0; p < sizeof precs / sizeof precs[0]; p++) {
        char out[16384], body[16384], cb[4400], wpath[4300], extra[128];
        void *bytes[3] = {NULL, NULL, NULL};
        size_t len[3] = {0, 0, 0};
        for (int v = 0; v < 3; v++) {
            snprintf(wpath, sizeof wpath, "%s/w12_%zu_%d.bin", g_dir, p, v);
            snprintf(cb, sizeof cb, "{ name = \"weightdump\"; path = \"%s\"; }", wpath);
            snprintf(body, sizeof body, MLP_JOB("%s", "%s"), precs[p], cb);
            /* an older build is found through KILN_PLUGIN_PATH, by explicit name */
            if (env[v]) setenv("KILN_PLUGIN_PATH", getenv(env[v]), 1);
            snprintf(extra, sizeof extra, "--set accelerator=\"%s\"", accel[v]);
            int rc = run_kiln("fit", body, extra, out, sizeof out);
            unsetenv("KILN_PLUGIN_PATH");
            tu_require_ok(rc, out);
            FILE *f = fopen(wpath, "rb");
            CU_ASSERT_PTR_NOT_NULL_FATAL(f);
            fseek(f, 0, SEEK_END);
            len[v] = (size_t)ftell(f);
            rewind(f);
            bytes[v] = malloc(len[v] ? len[v] : 1);
            CU_ASSERT_FATAL(bytes[v] && fread(bytes[v], 1, len[v], f) == len[v]);
            fclose(f);
        }
        CU_ASSERT(len[0] > 100);
        if (p == 0) { /* the fixtures are 1.2 and 1.3 libraries */
            for (int v = 1; v < 3; v++) {
                /* KILN_PLUGIN_PATH=<dir> kiln plugins list --verbose: the library's line */
                char lib[64];
                snprintf(lib, sizeof lib, "libkiln-cpu1%d.so", v + 1);
                setenv("KILN_PLUGIN_PATH", getenv(env[v]), 1);
                tu_run_kiln_l(out, sizeof out, "plugins", "list", "--verbose", NULL);
                unsetenv("KILN_PLUGIN_PATH");
                char lines[8192];
                CU_ASSERT(lines_ending(out, lib, lines, sizeof lines) > 0);
                CU_ASSERT_PTR_NOT_NULL(strstr(lines, v == 1 ? "ABI 1.2" : "ABI 1.3"));
            }
        }
        for (int v = 1; v < 3; v++) {
            CU_ASSERT_EQUAL(len[0], len[v]);
            const int same = len[0] == len[v] && memcmp(bytes[0], bytes[v], len[0]) == 0;
            if (!same)
                fprintf(stderr, "\n  precision %s: weights differ between the 1.4 and %s accelerators\n", precs[p],
                        accel[v]);
            CU_ASSERT_TRUE(same);
        }
        free(bytes[0]), free(bytes[1]), free(bytes[2]);
    }
}

/* 64-true: fp64 masters end to end, close to the 32-true result. */
static void test_64_true(void) {
    char out[16384], w64[4300], w32[4300], body[16384], cb[4400];
    snprintf(w64, sizeof w64, "%s/w64.bin", g_dir);
    snprintf(w32, sizeof w32, "%s/w32.bin", g_dir);
    snprintf(cb, sizeof cb, "{ name = \"weightdump\"; path = \"%s\"; }", w64);
    snprintf(body, sizeof body, MLP_JOB("\"64-true\"", "%s"), cb);
    tu_require_ok(run_kiln("fit", body, NULL, out, sizeof out), out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "param_dtype=float64"));
    snprintf(cb, sizeof cb, "{ name = \"weightdump\"; path = \"%s\"; }", w32);
    snprintf(body, sizeof body, MLP_JOB("\"32\"", "%s"), cb);
    CU_ASSERT_EQUAL_FATAL(run_kiln("fit", body, NULL, out, sizeof out), 0);
    /* layers.0.weight (8, 3), layers.0.bias (8), layers.1.weight (2, 8), layers.1.bias (2) */
    FILE *a = fopen(w64, "rb"), *b = fopen(w32, "rb");
    CU_ASSERT_FATAL(a && b);
    char na[64], nb[64];
    long long ca, cbn;
    int tensors = 0;
    double maxrel = 0;
    while (fscanf(a, "%63s %lld", na, &ca) == 2 && fscanf(b, "%63s %lld", nb, &cbn) == 2) {
        fgetc(a), fgetc(b);
        CU_ASSERT_STRING_EQUAL(na, nb);
        CU_ASSERT_EQUAL_FATAL(ca, cbn);
        for (long long i = 0; i < ca; i++) {
            double d = 0.0;
            float f = 0.0f;
            CU_ASSERT_FATAL(fread(&d, 8, 1, a) == 1 && fread(&f, 4, 1, b) == 1);
            double rel = fabs(d - f) / (fabs(d) + 1e-3);
            if (rel > maxrel) maxrel = rel;
        }
        tensors++;
    }
    fclose(a);
    fclose(b);
    CU_ASSERT_EQUAL(tensors, 4);
    CU_ASSERT(maxrel < 1e-4);
    CU_ASSERT(maxrel > 0); /* really computed in another precision */
}

/* The scaler state travels in the checkpoint: 2 epochs straight and 1 + a
 * resumed 1 give the same weights bit for bit, with fp16 overflow skipping
 * the first steps (a resumed run that restarted from init_scale would skip
 * again and differ). The same for 64-true's fp64 weights. */
static void resume_case(const char *prec, const char *tag) {
    char out[32768], cfg[4300], root[4400], wa[4300], wb[4300];
    snprintf(cfg, sizeof cfg, "%s/resume-%s.cfg", g_dir, tag);
    snprintf(wa, sizeof wa, "%s/w-full-%s.bin", g_dir, tag);
    snprintf(wb, sizeof wb, "%s/w-resumed-%s.bin", g_dir, tag);
    tu_write_jobf(cfg,
                  "trainer = { max_epochs = 2; seed = 5; num_sanity_val_steps = 0; };\n"
                  "data = { name = \"toydata\"; n_train = 12; n_val = 1; features = 3; };\n"
                  "module = { name = \"mlp\"; layers = [3, 8, 2]; max_batch = 4; };\n"
                  "optimizer = { name = \"adamw\"; lr = 0.01; };\n"
                  "precision = %s;\n",
                  prec);
    const char *dump = "callbacks=({name=\"weightdump\"; path=\"%s\";})";
    char d1[4600], d2[4600];
    snprintf(d1, sizeof d1, dump, wa);
    snprintf(d2, sizeof d2, dump, wb);
    snprintf(root, sizeof root, "trainer.default_root_dir=\"%s/res-%s-full\"", g_dir, tag);
    CU_ASSERT_EQUAL_FATAL(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", root, "--set", d1, NULL), 0);
    char *sk = strstr(out, "skipped steps: ");
    int skipped_full = sk ? atoi(sk + 15) : -1;
    snprintf(root, sizeof root, "trainer.default_root_dir=\"%s/res-%s-part\"", g_dir, tag);
    CU_ASSERT_EQUAL_FATAL(
        tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", root, "--set", "trainer.max_epochs=1", NULL), 0);
    sk = strstr(out, "skipped steps: ");
    int skipped_part = sk ? atoi(sk + 15) : -1;
    tu_require_ok(tu_run_kiln_l(out, sizeof out, "-q", "fit", cfg, "--set", root, "--ckpt", "last", "--set", d2, NULL), out);
    sk = strstr(out, "skipped steps: ");
    int skipped_resumed = sk ? atoi(sk + 15) : -1;
    if (!strcmp(tag, "fp16")) {
        CU_ASSERT(skipped_part > 0);                                 /* epoch 1 overflowed ... */
        /* ... epoch 2 did not start over, and the count carries over */
        CU_ASSERT_EQUAL(skipped_resumed, skipped_full);
    }
    CU_ASSERT_EQUAL(tu_same_file(wa, wb), 1);
}

static void test_resume_keeps_precision_state(void) {
    resume_case("{ name = \"16-mixed\"; init_scale = 16777216.0; growth_interval = 4; }", "fp16");
    resume_case("\"64-true\"", "fp64");
    resume_case("\"bf16\"", "bf16");
}

/* Lightning's test_amp_integration: a training_step without a loss under
 * a scaler takes no optimizer step, yet the step is counted and the hooks
 * around it still run. */
static void test_no_loss_step_counted(void) {
    char out[16384], trace[4300], body[8192];
    tu_traced_job(body, sizeof body, trace, sizeof trace, g_dir, "noloss-trace.txt",
                  TU_TOY_EPOCH(3, 1, "no_loss_batch = 1; ")
                  "optimizer = { name = \"sgd\"; lr = 0.1; };\n"
                  "precision = \"16-mixed\";\n");
    tu_require_ok(run_kiln("fit", body, NULL, out, sizeof out), out);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "steps: 3  skipped steps: 0"));
    const char *expect[][2] = {{"optimizer step batch=0", "1"}, {"optimizer step batch=1", "0"},
                               {"optimizer step batch=2", "1"}, {"callback on_before_optimizer_step batch=1", "1"},
                               {"module backward batch=1", "0"}};
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) tu_expect_lines(trace, expect[i][0], atoi(expect[i][1]));
}

/* Refusals come from properties alone, at config check. */
static void test_config_check_refusals(void) {
    char out[16384];
    const char *repeat = "trainer = { max_epochs = 1; };\n"
                         "data = { name = \"toydata\"; };\n"
                         "module = { name = \"mlp\"; layers = [3, 2]; };\n"
                         "optimizer = { name = \"repeatopt\"; };\n";
    char body[2048];
    snprintf(body, sizeof body, "%sprecision = \"16\";\n", repeat);
    CU_ASSERT_EQUAL(run_kiln("check", body, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "precision '16-mixed'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "cannot drive optimizer 'repeatopt'"));
    snprintf(body, sizeof body, "%sprecision = \"bf16\";\n", repeat);
    CU_ASSERT_EQUAL(run_kiln("check", body, NULL, out, sizeof out), 0);
    /* 64-true with a module that handles float32 only */
    snprintf(body, sizeof body,
             "data = { name = \"toydata\"; };\nmodule = { name = \"toymod\"; };\n"
             "optimizer = { name = \"sgd\"; };\nprecision = \"64-true\";\n");
    CU_ASSERT_EQUAL(run_kiln("check", body, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "module 'toymod'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "does not list \"float64\""));
    /* and the same refusal when running, before anything is created */
    CU_ASSERT_EQUAL(run_kiln("fit", body, NULL, out, sizeof out), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "does not list \"float64\""));
}

static CU_TestInfo cases_precision[] = {
    {"fp16 compute copies round to nearest even", test_fp16_compute_copy},
    {"bf16 compute copies round to nearest even", test_bf16_compute_copy},
    {"copies of adjacent masters share a buffer and a cast", test_copies_share_spans},
    {"scaler: skip, back off, grow, state", test_scaler_skip_backoff_growth},
    {"scaler: the same with a 1.2 kernel table (scale + all_finite)", test_scaler_table_1_2},
    {"fit: the same weights on 1.2- and 1.3-built cpu accelerators", test_same_weights_on_older_accelerators},
    {"scaler: no loss, no step, no update", test_scaler_no_loss},
    {"refusals: 1.1 kernel table, bad settings", test_refusals},
    {"hooks see scaled loss and gradients", test_hooks_see_scaled_values},
    {"fp16 overflow skips steps, global_step advances", test_overflow_skips_steps},
    {"64-true trains in fp64 close to 32-true", test_64_true},
    {"resume restores the scaler; fp64 and bf16 resume exactly", test_resume_keeps_precision_state},
    {"no loss: no step under the scaler, still counted", test_no_loss_step_counted},
    {"config check refuses incompatible stacks", test_config_check_refusals},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "precision", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_precision},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
