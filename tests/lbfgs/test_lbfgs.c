/*
 * test_lbfgs.c — the "lbfgs" optimizer plugin, loaded through the test host
 * and run on the "cpu" accelerator plugin (handed to the optimizer through
 * the test host's accelerator service, as the real host does). The closure
 * stands in for the host's (training_step, zero_grad, backward): it reads
 * the parameters, evaluates a known objective in double precision, writes
 * its gradient into every p->grad and returns the loss, counting its calls.
 * Objectives: a 7-dimensional convex quadratic 0.5 x^T A x - b^T x split
 * over a (2, 2) "weight" and a (3) "bias", whose minimum A^-1 b the test
 * solves independently; the 2-D Rosenbrock function; a 2-D diagonal
 * quadratic whose first two L-BFGS iterates are derived by hand below; and,
 * for whole trajectories compared with a float64 transliteration of
 * lbfgs.py, Beale's function, |x| + |y| and a concave cubic. The
 * expected closure-call counts are derived from torch.optim.LBFGS.step's
 * control flow (one evaluation before the loop; with line_search "none",
 * one per iteration except the last; the max_eval check after each
 * iteration). Internal counters (n_iter, func_evals) are read from the
 * state blob, whose version-1 header lb_header mirrors.
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include <kiln/testing.h>

#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

#define MAXN 16

static const kiln_plugin_desc *g_cpu, *g_lb;
static kiln_instance *g_acc;
static int g_f64; /* the parameters hold doubles (param_dtype F64) */

static int suite_init(void) {
    g_cpu = fixture_load_plugin(g_th, "cpu", KILN_KIND_ACCELERATOR, "cpu");
    g_lb = fixture_load_plugin(g_th, "lbfgs", KILN_KIND_OPTIMIZER, "lbfgs");
    return g_cpu && g_lb ? 0 : -1;
}

static int suite_clean(void) { return 0; }

static const kiln_optimizer_ops *ops(void) { return g_lb->ops; }

/* ------------------------------------------------------------ objectives */

typedef double (*objective_fn)(const double *x, double *g);
static objective_fn g_obj;
static int g_n; /* total parameter elements */

/* The 7-D quadratic: A is symmetric and strictly diagonally dominant with a
 * positive diagonal, hence SPD. */
#define QN 7
static double QA[QN][QN], QB[QN];

static void quad_init(void) {
    for (int i = 0; i < QN; i++) {
        for (int j = 0; j < QN; j++) {
            int dist = abs(i - j);
            QA[i][j] = dist == 0 ? 4.0 + 0.5 * i : dist == 1 ? -1.0 : dist == 2 ? 0.25 : 0.0;
        }
        QB[i] = 1.0 + 0.3 * i * (i % 2 ? -1.0 : 1.0);
    }
}

static double quad_f(const double *x, double *g) {
    double f = 0.0;
    for (int i = 0; i < QN; i++) {
        double ax = 0.0;
        for (int j = 0; j < QN; j++) ax += QA[i][j] * x[j];
        g[i] = ax - QB[i];
        f += 0.5 * x[i] * ax - QB[i] * x[i];
    }
    return f;
}

/* x* = A^-1 b by Gaussian elimination (A is SPD: no pivoting needed). */
static void quad_solution(double *xs) {
    double m[QN][QN + 1];
    for (int i = 0; i < QN; i++) {
        for (int j = 0; j < QN; j++) m[i][j] = QA[i][j];
        m[i][QN] = QB[i];
    }
    for (int c = 0; c < QN; c++)
        for (int r = c + 1; r < QN; r++) {
            double f = m[r][c] / m[c][c];
            for (int j = c; j <= QN; j++) m[r][j] -= f * m[c][j];
        }
    for (int r = QN - 1; r >= 0; r--) {
        double s = m[r][QN];
        for (int j = r + 1; j < QN; j++) s -= m[r][j] * xs[j];
        xs[r] = s / m[r][r];
    }
}

/* Rosenbrock: (1 - x)^2 + 100 (y - x^2)^2, minimum 0 at (1, 1). */
static double rosen_f(const double *x, double *g) {
    const double a = 1.0 - x[0], b = x[1] - x[0] * x[0];
    g[0] = -2.0 * a - 400.0 * x[0] * b;
    g[1] = 200.0 * b;
    return a * a + 100.0 * b * b;
}

/* The hand-derived case: A = diag(2, 4), b = (-2, 0), minimum (-1, 0). */
static double diag_f(const double *x, double *g) {
    g[0] = 2.0 * x[0] + 2.0;
    g[1] = 4.0 * x[1];
    return x[0] * x[0] + 2.0 * x[1] * x[1] + 2.0 * x[0];
}

/* ----------------------------------------------------------- environment */

typedef struct {
    const char *name;
    uint32_t ndim;
    int64_t shape[2];
} pspec;

static const pspec QUAD_PARAMS[] = {{"weight", 2, {2, 2}}, {"bias", 1, {3, 1}}};
static const pspec PAIR_PARAMS[] = {{"xy", 1, {2, 1}}};

/* Fresh test host with the given parameters (fp64 masters when f64, which
 * the test allocates itself: the test host allocates floats), the cpu
 * accelerator, and the objective. */
static void env_begin(const pspec *ps, int np, int f64, objective_fn obj) {
    kiln_test_reset(g_th);
    g_n = 0;
    for (int i = 0; i < np; i++) {
        kiln_parameter *p = fixture_param(g_th, ps[i].name, ps[i].ndim, ps[i].shape, 0);
        g_n += (int)p->numel;
    }
    CU_ASSERT_FATAL(g_n <= MAXN);
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(g_th), 0);
    g_f64 = f64;
    if (f64) {
        for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
            kiln_parameter *p = kiln_test_params(g_th)[i];
            free(p->data);
            free(p->grad);
            void *d = NULL, *g = NULL;
            CU_ASSERT_EQUAL_FATAL(posix_memalign(&d, 64, (size_t)p->numel * sizeof(double)), 0);
            CU_ASSERT_EQUAL_FATAL(posix_memalign(&g, 64, (size_t)p->numel * sizeof(double)), 0);
            memset(d, 0, (size_t)p->numel * sizeof(double));
            memset(g, 0, (size_t)p->numel * sizeof(double));
            p->data = d; /* kiln_test_reset(g_th) frees them */
            p->grad = g;
            p->compute = d;
            p->param_dtype = KILN_DTYPE_F64;
        }
    }
    g_acc = fixture_accel_install(g_th, g_cpu);
    g_obj = obj;
    quad_init();
}

static void env_end(void) { fixture_accel_remove(g_th, g_cpu, &g_acc); }

/* The parameters as one flat vector (n), in registration order. */
static void read_x(double *x) {
    int off = 0;
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        const kiln_parameter *p = kiln_test_params(g_th)[i];
        for (int64_t j = 0; j < p->numel; j++)
            x[off++] = g_f64 ? ((const double *)(const void *)p->data)[j] : (double)p->data[j];
    }
}

static void write_vec(const double *v, int grads) {
    int off = 0;
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        kiln_parameter *p = kiln_test_params(g_th)[i];
        void *dst = grads ? (void *)p->grad : (void *)p->data;
        for (int64_t j = 0; j < p->numel; j++, off++) {
            if (g_f64)
                ((double *)dst)[j] = v[off];
            else
                ((float *)dst)[j] = (float)v[off];
        }
    }
}

/* The closure: counts calls; fails with KILN_E_NONFINITE on call fail_at,
 * returns a NaN loss on call nan_at (1-based; 0 = never). */
typedef struct {
    int calls;
    int fail_at, nan_at;
    double last_loss;
} closure_ctx;

static int32_t closure_call(void *vctx, double *loss) {
    closure_ctx *c = vctx;
    c->calls++;
    if (c->calls == c->fail_at) {
        kiln_test_services(g_th)->set_error(kiln_test_hctx(g_th), KILN_E_NONFINITE, "closure: forced failure");
        return KILN_E_NONFINITE;
    }
    double x[MAXN], g[MAXN];
    read_x(x);
    double f = g_obj(x, g);
    write_vec(g, 1); /* zero_grad + backward */
    c->last_loss = f;
    *loss = c->calls == c->nan_at ? NAN : f;
    return KILN_OK;
}

#define CLOSURE(c) (&(kiln_closure){sizeof(kiln_closure), 0, &(c), closure_call})

/* --------------------------------------------------------------- configs */

typedef struct {
    kiln_kv kv[8];
} config;

#define IKV(k, x) {(k), {KILN_TYPE_INT, 0, {.i = (x)}}}
#define FKV(k, x) {(k), {KILN_TYPE_FLOAT, 0, {.f = (x)}}}
#define SKV(k, x) {(k), {KILN_TYPE_STRING, 0, {.s = (x)}}}

/* Every declared key, as the host would pass them after filling defaults. */
static config cfg(double lr, int64_t max_iter, int64_t max_eval, double tol_grad, double tol_change,
                  int64_t history, const char *ls) {
    config c = {{FKV("lr", lr), IKV("max_iter", max_iter), IKV("max_eval", max_eval),
                 FKV("tolerance_grad", tol_grad), FKV("tolerance_change", tol_change), IKV("history_size", history),
                 SKV("line_search", ls), {NULL, KILN_V_NONE}}};
    return c;
}

/* A created and set-up optimizer; fatal when there is none (no case has
 * anything to test without it). */
static kiln_instance *make(config c) {
    kiln_instance *inst = NULL;
    int32_t rc = ops()->base.create(g_lb->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), c.kv, &inst);
    if (rc != KILN_OK) fprintf(stderr, "create lbfgs: %s\n", kiln_test_error(g_th));
    CU_ASSERT_EQUAL(rc, KILN_OK);
    if (inst) {
        rc = ops()->setup(inst, kiln_test_params(g_th), kiln_test_param_count(g_th));
        if (rc != KILN_OK) fprintf(stderr, "setup lbfgs: %s\n", kiln_test_error(g_th));
        CU_ASSERT_EQUAL(rc, KILN_OK);
    }
    CU_ASSERT_PTR_NOT_NULL_FATAL(inst);
    return inst;
}

/* make() on parameters set to x0 first. */
static kiln_instance *start(const double *x0, config c) {
    write_vec(x0, 0);
    return make(c);
}

/* The version-1 state header (plugins/lbfgs/lbfgs.c, lb_state_header). */
typedef struct {
    char magic[16];
    uint32_t nparams, reserved;
    int64_t n_iter, func_evals, hist_len;
    double lr, t, h_diag, prev_loss;
} lb_header;

static lb_header header_of(kiln_instance *inst) {
    lb_header h = {0};
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL(ops()->base.get_state(inst, &ver, &blob, &size), KILN_OK);
    CU_ASSERT_EQUAL(ver, 1);
    if (blob && size >= sizeof h) memcpy(&h, blob, sizeof h);
    CU_ASSERT_EQUAL(memcmp(h.magic, "kiln-lbfgs-state", 16), 0);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    return h;
}

/* One step() that succeeds, after which the closure has been called
 * `calls` times in all (cc counts across steps). */
static void step_expect(kiln_instance *opt, closure_ctx *cc, int calls) {
    CU_ASSERT_EQUAL(ops()->step(opt, &(kiln_closure){sizeof(kiln_closure), 0, cc, closure_call}), KILN_OK);
    CU_ASSERT_EQUAL(cc->calls, calls);
}

/* The quadratic's float32 parameters (weight 4, bias 3), bit for bit. */
typedef struct {
    float w[4], b[3];
} quad_x;

static quad_x quad_save(void) {
    quad_x q;
    memcpy(q.w, kiln_test_params(g_th)[0]->data, sizeof q.w);
    memcpy(q.b, kiln_test_params(g_th)[1]->data, sizeof q.b);
    return q;
}

static void quad_restore(const quad_x *q) {
    memcpy(kiln_test_params(g_th)[0]->data, q->w, sizeof q->w);
    memcpy(kiln_test_params(g_th)[1]->data, q->b, sizeof q->b);
}

/* The parameters are q's, weight and bias each bit for bit. */
static void expect_quad(const quad_x *q) {
    CU_ASSERT_EQUAL(memcmp(q->w, kiln_test_params(g_th)[0]->data, sizeof q->w), 0);
    CU_ASSERT_EQUAL(memcmp(q->b, kiln_test_params(g_th)[1]->data, sizeof q->b), 0);
}

/* A created optimizer, not set up (fatal when create refuses). */
static kiln_instance *create_only(config c) {
    kiln_instance *inst = NULL;
    CU_ASSERT_EQUAL_FATAL(ops()->base.create(g_lb->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), c.kv, &inst),
                          KILN_OK);
    return inst;
}

/* step_expect counting from 0. */
static void step_fresh(kiln_instance *opt, closure_ctx *cc, int calls) {
    cc->calls = 0;
    step_expect(opt, cc, calls);
}

/* The two parameters of PAIR_PARAMS are `want` within 1e-12. */
static void expect_xy(const double want[2]) {
    double x[2];
    read_x(x);
    CU_ASSERT_DOUBLE_EQUAL(x[0], want[0], 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(x[1], want[1], 1e-12);
}

static double max_err(const double *x, const double *want, int n) {
    double e = 0.0;
    for (int i = 0; i < n; i++) e = fmax(e, fabs(x[i] - want[i]));
    return e;
}

static int verbose(void) { return getenv("LBFGS_TEST_VERBOSE") != NULL; }

/* ------------------------------------------------------- the descriptor */

static void test_descriptor(void) {
    struct {
        const char *key;
        uint32_t type;
        double def;
    } want[] = {
        {"lr", KILN_TYPE_FLOAT, 1.0},          {"max_iter", KILN_TYPE_INT, 20},
        {"max_eval", KILN_TYPE_INT, 0},        {"tolerance_grad", KILN_TYPE_FLOAT, 1e-7},
        {"tolerance_change", KILN_TYPE_FLOAT, 1e-9}, {"history_size", KILN_TYPE_INT, 100},
    };
    int nkeys = 0;
    for (const kiln_param *p = g_lb->params; p && p->key; p++) {
        nkeys++;
        CU_ASSERT_PTR_NOT_NULL(p->help);
    }
    CU_ASSERT_EQUAL(nkeys, 7);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kiln_param *p = g_lb->params;
        while (p && p->key && strcmp(p->key, want[i].key)) p++;
        CU_ASSERT_FATAL(p && p->key);
        CU_ASSERT_EQUAL(p->type, want[i].type);
        CU_ASSERT_EQUAL(p->def.type, want[i].type);
        double def = p->def.type == KILN_TYPE_FLOAT ? p->def.v.f : (double)p->def.v.i;
        CU_ASSERT_DOUBLE_EQUAL(def, want[i].def, 0.0);
    }
    const kiln_param *ls = g_lb->params;
    while (ls->key && strcmp(ls->key, "line_search")) ls++;
    CU_ASSERT_FATAL(ls->key != NULL);
    CU_ASSERT_EQUAL(ls->type, KILN_TYPE_STRING);
    CU_ASSERT_STRING_EQUAL(ls->def.v.s, "none");

    CU_ASSERT_EQUAL(g_lb->kind, KILN_KIND_OPTIMIZER);
    CU_ASSERT_STRING_EQUAL(g_lb->name, "lbfgs");
    CU_ASSERT_TRUE(g_lb->capabilities & KILN_CAP_STATEFUL);
    const kiln_value *rep = kiln_kv_find(g_lb->properties, "repeated_closure");
    CU_ASSERT_FATAL(rep != NULL);
    CU_ASSERT_EQUAL(rep->type, KILN_TYPE_BOOL);
    CU_ASSERT_EQUAL(rep->v.i, 1);
    const kiln_value *dts = kiln_kv_find(g_lb->properties, "param_dtypes");
    CU_ASSERT_FATAL(dts != NULL && dts->type == KILN_TYPE_STRING_LIST && dts->count == 2);
    CU_ASSERT_STRING_EQUAL(dts->v.sl[0], "float32");
    CU_ASSERT_STRING_EQUAL(dts->v.sl[1], "float64");
}

/* ------------------------------------------------------------ convergence */

/* Steps until the parameters are within tol of want (at most max_steps
 * step() calls); returns the steps taken, and the closure calls in *calls. */
static int step_until(kiln_instance *opt, const double *want, double tol, int max_steps, int *calls,
                      double *err) {
    closure_ctx c = {0};
    double x[MAXN];
    int s = 0;
    read_x(x);
    *err = max_err(x, want, g_n);
    while (s < max_steps && *err >= tol) {
        CU_ASSERT_EQUAL(ops()->step(opt, CLOSURE(c)), KILN_OK);
        s++;
        read_x(x);
        *err = max_err(x, want, g_n);
    }
    *calls = c.calls;
    return s;
}

/* step_until within tol, which must be reached, saying how it went when it
 * was not (or LBFGS_TEST_VERBOSE is set); the steps taken, and the closure
 * calls in *calls. */
static int converge(kiln_instance *opt, const double *want, double tol, int max_steps, const char *what, int *calls) {
    double err;
    int steps = step_until(opt, want, tol, max_steps, calls, &err);
    if (verbose() || err >= tol)
        fprintf(stderr, "\n  %s: %d step() calls, %d closure calls, max |x - x*| = %.3g\n", what, steps, *calls, err);
    CU_ASSERT_TRUE(err < tol);
    return steps;
}

static const double QX0[QN] = {0.5, -1.0, 2.0, 0.0, -0.75, 1.25, 3.0};

/* The quadratic from QX0 to A^-1 b within 1e-6. Tolerances are tightened
 * (PyTorch's defaults stop once g.d > -1e-9, i.e. around |x - x*| ~ 1e-5 on
 * this problem, which is above the accuracy asked for here). */
static void run_quadratic(int f64, const char *ls, int max_steps, const char *what) {
    env_begin(QUAD_PARAMS, 2, f64, quad_f);
    double xs[QN];
    quad_solution(xs);
    double g[QN];
    (void)quad_f(xs, g);
    for (int i = 0; i < QN; i++) CU_ASSERT_TRUE(fabs(g[i]) < 1e-12); /* the reference solves A x = b */
    config c = cfg(1.0, 20, 0, 1e-12, 1e-15, 100, ls);
    kiln_instance *opt = start(QX0, c);
    int calls;
    CU_ASSERT_TRUE(converge(opt, xs, 1e-6, max_steps, what, &calls) >= 1);
    /* a further step stays at the minimum */
    closure_ctx cc = {0};
    CU_ASSERT_EQUAL(ops()->step(opt, CLOSURE(cc)), KILN_OK);
    double x[QN];
    read_x(x);
    CU_ASSERT_TRUE(max_err(x, xs, QN) < 1e-6);
    ops()->base.destroy(opt);
    env_end();
}

/* One step() (max_iter 20) reaches 1e-6 in every case. Measured closure
 * calls: with lr 1 and no line search 13 in float32 and 12 in float64; with
 * strong_wolfe 24 in float32 and 12 in float64 (there every first trial
 * step is accepted, so both float64 runs take the same iterates). */
static void test_quadratic_none(void) { run_quadratic(0, "none", 1, "quadratic, none, float32"); }
static void test_quadratic_wolfe(void) { run_quadratic(0, "strong_wolfe", 1, "quadratic, strong_wolfe, float32"); }
static void test_quadratic_none_f64(void) { run_quadratic(1, "none", 1, "quadratic, none, float64"); }
static void test_quadratic_wolfe_f64(void) { run_quadratic(1, "strong_wolfe", 1, "quadratic, strong_wolfe, float64"); }

/* Rosenbrock from (-1.5, 2) to (1, 1) within 1e-5 with the line search and
 * PyTorch's defaults (max_iter 20, max_eval 25): 3 step() calls (measured:
 * |x - x*| is 8e-4 after 2, 4e-6 after 3; 52 closure calls in float32, 53
 * in float64). */
static void run_rosenbrock(int f64, int max_steps, const char *what) {
    env_begin(PAIR_PARAMS, 1, f64, rosen_f);
    const double x0[2] = {-1.5, 2.0}, xs[2] = {1.0, 1.0};
    config c = cfg(1.0, 20, 0, 1e-7, 1e-9, 100, "strong_wolfe");
    kiln_instance *opt = start(x0, c);
    int calls;
    converge(opt, xs, 1e-5, max_steps, what, &calls);
    lb_header h = header_of(opt);
    CU_ASSERT_EQUAL(h.func_evals, calls);
    ops()->base.destroy(opt);
    env_end();
}

static void test_rosenbrock(void) { run_rosenbrock(0, 3, "rosenbrock, strong_wolfe, float32"); }
static void test_rosenbrock_f64(void) { run_rosenbrock(1, 3, "rosenbrock, strong_wolfe, float64"); }

/* ----------------------------------------------------- reference values */

/*
 * Hand-derived iterates, line_search "none", lr 1, on
 *   f(x) = 0.5 x^T diag(2, 4) x - (-2, 0).x,  g(x) = (2 x0 + 2, 4 x1),
 * from x0 = (1, 1), float64 masters:
 *
 * iteration 1: g0 = (4, 4), |g0|_1 = 8, so t = min(1, 1/8) * lr = 1/8;
 *   d = -g0 = (-4, -4);  x1 = x0 + t d = (0.5, 0.5).
 * evaluation at x1: g1 = (3, 2).
 * iteration 2: y = g1 - g0 = (-1, -2), s = t d = (-0.5, -0.5),
 *   y.s = 1.5 > 1e-10, so the pair is kept: ro = 2/3, H_diag = y.s / y.y
 *   = 1.5 / 5 = 0.3. Two-loop: q = -g1 = (-3, -2);
 *   al = (s.q) ro = 2.5 * 2/3 = 5/3;  q -= al y -> (-4/3, 4/3);
 *   r = H_diag q = (-0.4, 0.4);  be = (y.r) ro = -0.4 * 2/3 = -4/15;
 *   r += (al - be) s = (29/15) s = (-29/30, -29/30)  ->  d = (-41/30, -17/30).
 *   g1.d = -157/30 < 0 (a descent direction); t = lr = 1;
 *   x2 = x1 + d = (-13/15, -1/15)   (the minimum is (-1, 0)).
 * With lr changed to 0.5 before iteration 2: x2 = x1 + d / 2 = (-11/60, 13/60).
 */
static void test_reference_2d(void) {
    const double x0[2] = {1.0, 1.0};
    const double x1[2] = {0.5, 0.5}, x2[2] = {-13.0 / 15.0, -1.0 / 15.0}, x2_half[2] = {-11.0 / 60.0, 13.0 / 60.0};
    double x[2];

    /* max_iter 2 with the default max_eval 2 * 5 / 4 = 2: after iteration
     * 1 two evaluations are done, so the step ends at x1 */
    env_begin(PAIR_PARAMS, 1, 1, diag_f);
    kiln_instance *opt = start(x0, cfg(1.0, 2, 0, 1e-7, 1e-9, 100, "none"));
    closure_ctx cc = {0};
    step_fresh(opt, &cc, 2);
    CU_ASSERT_EQUAL(header_of(opt).n_iter, 1);
    expect_xy(x1);
    ops()->base.destroy(opt);

    /* max_iter 2, max_eval 10: two closure calls (before iteration 1, after
     * iteration 1; none after the last) */
    config c2 = cfg(1.0, 2, 10, 1e-7, 1e-9, 100, "none");
    opt = start(x0, c2);
    step_fresh(opt, &cc, 2);
    expect_xy(x2);
    lb_header h = header_of(opt);
    CU_ASSERT_EQUAL(h.n_iter, 2);
    CU_ASSERT_EQUAL(h.hist_len, 1);
    CU_ASSERT_DOUBLE_EQUAL(h.h_diag, 0.3, 1e-15);
    CU_ASSERT_DOUBLE_EQUAL(h.t, 1.0, 0.0);
    ops()->base.destroy(opt);

    /* the same iterates one iteration per step(): the history carries over */
    config c1 = cfg(1.0, 1, 0, 1e-7, 1e-9, 100, "none");
    opt = start(x0, c1);
    step_fresh(opt, &cc, 1);
    expect_xy(x1);
    h = header_of(opt);
    CU_ASSERT_DOUBLE_EQUAL(h.t, 0.125, 0.0);
    CU_ASSERT_EQUAL(h.hist_len, 0);
    step_expect(opt, &cc, 2);
    expect_xy(x2);
    ops()->base.destroy(opt);

    /* tolerance_change 100 > -g0.d = 32: iteration 1 stops at the
     * directional-derivative check, before any update (1 call), yet it
     * counts and leaves d and t = 1/8 in the state, as PyTorch does */
    opt = start(x0, cfg(1.0, 20, 0, 1e-7, 100.0, 100, "none"));
    step_fresh(opt, &cc, 1);
    read_x(x);
    CU_ASSERT_EQUAL(memcmp(x, x0, sizeof x), 0);
    h = header_of(opt);
    CU_ASSERT_EQUAL(h.n_iter, 1);
    CU_ASSERT_DOUBLE_EQUAL(h.t, 0.125, 0.0);
    ops()->base.destroy(opt);

    /* tolerance_change 0.6: g.d = -32 passes, x1 is taken and evaluated
     * (2 calls), then max |t d| = 0.5 <= 0.6 ends the step (the loss change
     * 5 - 1.75 = 3.25 would not) */
    opt = start(x0, cfg(1.0, 20, 0, 1e-7, 0.6, 100, "none"));
    step_fresh(opt, &cc, 2);
    CU_ASSERT_EQUAL(header_of(opt).n_iter, 1);
    expect_xy(x1);
    ops()->base.destroy(opt);

    /* set_lr between the steps scales the second iteration's step */
    opt = start(x0, c1);
    CU_ASSERT_EQUAL(ops()->step(opt, CLOSURE(cc)), KILN_OK);
    CU_ASSERT_EQUAL(ops()->set_lr(opt, 0.5), KILN_OK);
    CU_ASSERT_EQUAL(ops()->step(opt, CLOSURE(cc)), KILN_OK);
    expect_xy(x2_half);
    ops()->base.destroy(opt);
    env_end();
}

/* The first iteration in float32: x1 = x0 - min(1, 1/|g0|_1) * lr * g0,
 * rounded once to float, bit for bit; one closure call (max_iter 1). */
static void test_first_iteration_f32(void) {
    env_begin(QUAD_PARAMS, 2, 0, quad_f);
    write_vec(QX0, 0);
    double x0[QN], g0[QN];
    read_x(x0);
    (void)quad_f(x0, g0);
    double l1 = 0.0;
    for (int i = 0; i < QN; i++) l1 += fabs(g0[i]);
    CU_ASSERT_TRUE(l1 > 1.0); /* so min(1, 1/|g|_1) is the second */
    const double lr = 0.75, t = fmin(1.0, 1.0 / l1) * lr;
    config c = cfg(lr, 1, 0, 1e-7, 1e-9, 100, "none");
    kiln_instance *opt = make(c);
    closure_ctx cc = {0};
    step_expect(opt, &cc, 1);
    int off = 0;
    for (uint32_t p = 0; p < kiln_test_param_count(g_th); p++)
        for (int64_t j = 0; j < kiln_test_params(g_th)[p]->numel; j++, off++)
            CU_ASSERT_EQUAL(kiln_test_params(g_th)[p]->data[j], (float)(x0[off] + t * -g0[off]));
    ops()->base.destroy(opt);
    env_end();
}

/* Beale's function, minimum 0 at (3, 0.5); a line-search workout far from
 * it (the cubic lands near the bracket ends). */
static double abs_f(const double *x, double *g) {
    g[0] = copysign(1.0, x[0]);
    g[1] = copysign(1.0, x[1]);
    return fabs(x[0]) + fabs(x[1]);
}

static double concave_f(const double *x, double *g) {
    const double s = x[0] + x[1];
    g[0] = g[1] = -(1 + 2 * s + 0.03 * s * s);
    return -(s + s * s + 0.01 * s * s * s);
}

static double beale_f(const double *x, double *g) {
    const double X = x[0], Y = x[1], y2 = Y * Y, y3 = y2 * Y;
    const double t1 = 1.5 - X + X * Y, t2 = 2.25 - X + X * y2, t3 = 2.625 - X + X * y3;
    g[0] = 2 * t1 * (-1 + Y) + 2 * t2 * (-1 + y2) + 2 * t3 * (-1 + y3);
    g[1] = 2 * t1 * X + 2 * t2 * 2 * X * Y + 2 * t3 * 3 * X * y2;
    return t1 * t1 + t2 * t2 + t3 * t3;
}

/*
 * Whole trajectories against a float64 transliteration of lbfgs.py into
 * plain Python (lists instead of tensors, the same operations in the same
 * order), run during development; it is not part of the repository. After
 * every step(): the closure calls so far, n_iter, and the parameters.
 * Plugin and transliteration agreed bit for bit; the relative 1e-9 leaves
 * room for compilers that fuse multiply-adds. The cases were picked to
 * reach every branch of the line search:
 *  A: Rosenbrock from (-1.5, 2), history_size 3 (the ring wraps), max_iter
 *     9, max_eval 12 (which ends every step);
 *  B: Rosenbrock from (2, 2), lr 0.5, history_size 5: the cubic without a
 *     real minimiser (bisection) and an "insufficient progress" mark;
 *  C: Beale from (-1.2, 1), lr 10, history_size 5 (it heads off to x < -30,
 *     which is what L-BFGS does from there): trial steps moved to 0.1 of the
 *     bracket from its end;
 *  D: Rosenbrock from (-2, 2), lr 2, history_size 5: a bracket closed
 *     because the loss stopped decreasing between trial steps, and steps
 *     ended by g.d > -tolerance_change (the 4th makes no update: 1 call);
 *  E: |x| + |y| from (-1.2, 1), history_size 5 (non-smooth): brackets
 *     abandoned once |bracket| * max|d| < tolerance_change, and a step ended
 *     by max |t d| <= tolerance_change;
 *  F: a loss that keeps falling ever faster along d, -(s + s^2 + 0.01 s^3)
 *     with s = x + y, from (0, 0): no bracket is ever found, so the search
 *     gives up after max_ls = 25 iterations at its last trial step. Counted
 *     by hand: 1 evaluation before the loop, 1 first probe, 25 more = 27,
 *     which passes the default max_eval 25 and ends the step after 1
 *     iteration.
 */
typedef struct {
    int calls;
    int64_t n_iter;
    double x[2];
} traj_point;

static void check_trajectory(const char *what, objective_fn obj, const double *x0, const config *c,
                             const traj_point *want, int steps) {
    env_begin(PAIR_PARAMS, 1, 1, obj);
    kiln_instance *opt = start(x0, *c);
    closure_ctx cc = {0};
    for (int k = 0; k < steps; k++) {
        CU_ASSERT_EQUAL(ops()->step(opt, CLOSURE(cc)), KILN_OK);
        double x[2];
        read_x(x);
        lb_header h = header_of(opt);
        int ok = cc.calls == want[k].calls && h.func_evals == want[k].calls && h.n_iter == want[k].n_iter;
        for (int i = 0; i < 2; i++) ok = ok && fabs(x[i] - want[k].x[i]) <= 1e-9 * fabs(want[k].x[i]);
        if (verbose() || !ok)
            fprintf(stderr, "\n  %s, step %d: %d calls, n_iter %lld, x = (%.17g, %.17g)", what, k + 1, cc.calls,
                    (long long)h.n_iter, x[0], x[1]);
        CU_ASSERT_TRUE(ok);
    }
    ops()->base.destroy(opt);
    env_end();
}

static void test_reference_trajectories(void) {
    static const traj_point a[4] = {
        {11, 9, {-1.1382996644053178, 1.2446282267668656}},
        {24, 18, {0.056564218292682766, -0.02217403695653801}},
        {36, 27, {0.69603113292146057, 0.47302343159781179}},
        {48, 36, {0.99812235076471556, 0.99678177923281575}},
    };
    static const traj_point b[3] = {
        {21, 20, {1.4374455367179977, 2.0770479807812365}},
        {46, 39, {1.0002095617758067, 1.0004173353613226}},
        {52, 43, {1.0000191724345096, 1.0000372521099106}},
    };
    static const traj_point cc[3] = {
        {26, 9, {-3.8588917514243, 1.2232019094310005}},
        {54, 17, {-13.922435733197739, 1.0663830673422852}},
        {82, 27, {-31.705754071501332, 1.0303091781715972}},
    };
    static const traj_point d[4] = {
        {26, 13, {0.015891534207330832, -0.0189694844742056}},
        {51, 27, {0.99844297575866325, 0.99655863767232256}},
        {57, 31, {0.99999997852495071, 0.99999991749763639}},
        {58, 32, {0.99999997852495071, 0.99999991749763639}},
    };
    static const traj_point e[3] = {
        {26, 3, {-0.0086177342567538701, -0.00218473801933175}},
        {60, 6, {-3.0078163831132043e-10, -0.0013876611207670328}},
        {71, 7, {3.6779013030998561e-11, -0.0013876611415748752}},
    };
    static const traj_point f[1] = {{27, 1, {1915.4306823915515, 1915.4306823915515}}};
    const double ra[2] = {-1.5, 2.0}, rb[2] = {2.0, 2.0}, bc[2] = {-1.2, 1.0}, rd[2] = {-2.0, 2.0}, zero[2] = {0, 0};
    /* strong_wolfe, tolerances 1e-7 and 1e-9 in every case */
    const struct {
        const char *what;
        objective_fn obj;
        const double *x0;
        double lr;
        int64_t max_iter, max_eval, history;
        const traj_point *want;
        int steps;
    } cases[] = {
        {"A", rosen_f, ra, 1.0, 9, 12, 3, a, 4},  {"B", rosen_f, rb, 0.5, 20, 0, 5, b, 3},
        {"C", beale_f, bc, 10.0, 20, 0, 5, cc, 3}, {"D", rosen_f, rd, 2.0, 20, 0, 5, d, 4},
        {"E", abs_f, bc, 1.0, 20, 0, 5, e, 3},    {"F", concave_f, zero, 1.0, 20, 0, 100, f, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        config c = cfg(cases[i].lr, cases[i].max_iter, cases[i].max_eval, 1e-7, 1e-9, cases[i].history, "strong_wolfe");
        check_trajectory(cases[i].what, cases[i].obj, cases[i].x0, &c, cases[i].want, cases[i].steps);
    }
}

/* ---------------------------------------------------------- call counts */

/* One step() on the quadratic (float32, lr 0.1 so it is nowhere near
 * converged, tolerances 0 so no early stop); returns the closure calls. */
static int count_calls(kiln_instance *opt) {
    closure_ctx cc = {0};
    CU_ASSERT_EQUAL(ops()->step(opt, CLOSURE(cc)), KILN_OK);
    return cc.calls;
}

/* One step() with `calls` closure calls, then the state's n_iter and
 * func_evals (each when >= 0; n_iter < 0: the state is not read). */
static void expect_counts(kiln_instance *opt, int calls, int64_t n_iter, int64_t func_evals) {
    CU_ASSERT_EQUAL(count_calls(opt), calls);
    if (n_iter < 0) return;
    lb_header h = header_of(opt);
    CU_ASSERT_EQUAL(h.n_iter, n_iter);
    if (func_evals >= 0) CU_ASSERT_EQUAL(h.func_evals, func_evals);
}

/*
 * line_search "none": one evaluation before the loop, one after every
 * iteration but the last, so a step of max_iter iterations calls the
 * closure exactly max_iter times (max_eval's default max_iter*5/4 never
 * binds). max_eval is checked after an iteration's evaluation: with
 * max_eval 5 the evaluations are 1 (before), 2..5 (after iterations 1..4),
 * and the step ends after iteration 4; with max_eval 1 it still runs one
 * iteration (2 calls), as PyTorch does.
 */
static void test_counts_none(void) {
    env_begin(QUAD_PARAMS, 2, 0, quad_f);
    kiln_instance *opt = start(QX0, cfg(0.1, 7, 0, 0.0, 0.0, 100, "none"));
    expect_counts(opt, 7, 7, 7);
    expect_counts(opt, 7, 14, 14); /* the counters continue across steps */
    ops()->base.destroy(opt);

    opt = start(QX0, cfg(0.1, 20, 5, 0.0, 0.0, 100, "none"));
    expect_counts(opt, 5, 4, 5);
    ops()->base.destroy(opt);

    opt = start(QX0, cfg(0.1, 20, 1, 0.0, 0.0, 100, "none"));
    expect_counts(opt, 2, 1, -1);
    ops()->base.destroy(opt);

    /* default max_iter 20: 20 calls */
    opt = start(QX0, cfg(0.1, 20, 0, 0.0, 0.0, 100, "none"));
    expect_counts(opt, 20, -1, -1);
    ops()->base.destroy(opt);
    env_end();
}

/* max_eval 0 means max_iter * 5 / 4: with the line search (several
 * evaluations per iteration) and max_iter 4, the default behaves exactly as
 * max_eval 5 (same calls, same parameters) and differently from a
 * non-binding 1000. On Rosenbrock from (-1.5, 2) that is 5 calls over 3
 * iterations against 6 over 4 (the float64 transliteration agrees). */
static void test_counts_default_max_eval(void) {
    const double x0[2] = {-1.5, 2.0};
    const int64_t max_evals[3] = {0, 5, 1000};
    int calls[3];
    int64_t iters[3];
    double xs[3][2];
    env_begin(PAIR_PARAMS, 1, 1, rosen_f);
    for (int i = 0; i < 3; i++) {
        config c = cfg(1.0, 4, max_evals[i], 1e-7, 1e-9, 100, "strong_wolfe");
        kiln_instance *opt = start(x0, c);
        calls[i] = count_calls(opt);
        iters[i] = header_of(opt).n_iter;
        read_x(xs[i]);
        ops()->base.destroy(opt);
    }
    CU_ASSERT_EQUAL(calls[0], 5);
    CU_ASSERT_EQUAL(iters[0], 3);
    CU_ASSERT_EQUAL(calls[1], 5);
    CU_ASSERT_EQUAL(memcmp(xs[0], xs[1], sizeof xs[0]), 0);
    CU_ASSERT_EQUAL(calls[2], 6);
    CU_ASSERT_EQUAL(iters[2], 4);
    CU_ASSERT_NOT_EQUAL(memcmp(xs[0], xs[2], sizeof xs[0]), 0);
    env_end();
}

/* A start whose gradient is exactly zero (b = A x0 computed as the closure
 * computes A x): one closure call per step, nothing changes, no iteration is
 * counted. A non-zero gradient with max |g| <= tolerance_grad is optimal too. */
static void test_optimal_start(void) {
    env_begin(QUAD_PARAMS, 2, 0, quad_f);
    write_vec(QX0, 0);
    double x0[QN];
    read_x(x0);
    for (int i = 0; i < QN; i++) {
        double ax = 0.0;
        for (int j = 0; j < QN; j++) ax += QA[i][j] * x0[j];
        QB[i] = ax;
    }
    const quad_x q0 = quad_save();
    kiln_instance *opt = make(cfg(1.0, 20, 0, 1e-7, 1e-9, 100, "strong_wolfe"));
    CU_ASSERT_EQUAL(count_calls(opt), 1);
    CU_ASSERT_EQUAL(count_calls(opt), 1);
    expect_quad(&q0);
    lb_header h = header_of(opt);
    CU_ASSERT_EQUAL(h.n_iter, 0);
    CU_ASSERT_EQUAL(h.func_evals, 2);
    ops()->base.destroy(opt);

    quad_init(); /* the real b: max |g| at QX0 is about 12 */
    opt = make(cfg(1.0, 20, 0, 100.0, 1e-9, 100, "none"));
    CU_ASSERT_EQUAL(count_calls(opt), 1);
    CU_ASSERT_EQUAL(memcmp(q0.w, kiln_test_params(g_th)[0]->data, sizeof q0.w), 0);
    ops()->base.destroy(opt);
    env_end();
}

/* The state carries over between step() calls: with line_search "none", one
 * step of 10 iterations and two steps of 5 evaluate the same points (the
 * second step's first evaluation is the one the first skipped after its last
 * iteration), so the parameters are bit-identical and the calls equal (10).
 * With strong_wolfe the line search's last evaluation already gave the
 * gradient, so two steps of 3 cost exactly one call more than one of 6, for
 * the same parameters. A fresh optimizer from the midpoint differs. */
static void test_history_persists(void) {
    /* none, quadratic, float32 */
    env_begin(QUAD_PARAMS, 2, 0, quad_f);
    kiln_instance *one = start(QX0, cfg(0.1, 10, 0, 0.0, 0.0, 100, "none"));
    CU_ASSERT_EQUAL(count_calls(one), 10);
    const quad_x q_one = quad_save();
    lb_header h_one = header_of(one);

    const config c5 = cfg(0.1, 5, 0, 0.0, 0.0, 100, "none");
    kiln_instance *two = start(QX0, c5);
    CU_ASSERT_EQUAL(count_calls(two), 5);
    const quad_x q_mid = quad_save();
    CU_ASSERT_EQUAL(count_calls(two), 5);
    expect_quad(&q_one);
    lb_header h_two = header_of(two);
    CU_ASSERT_EQUAL(h_two.n_iter, 10);
    CU_ASSERT_EQUAL(h_one.n_iter, 10);
    CU_ASSERT_EQUAL(h_two.hist_len, h_one.hist_len);
    CU_ASSERT_TRUE(h_one.hist_len >= 5);

    quad_restore(&q_mid);
    kiln_instance *fresh = make(c5);
    CU_ASSERT_EQUAL(count_calls(fresh), 5);
    CU_ASSERT_NOT_EQUAL(memcmp(q_one.w, kiln_test_params(g_th)[0]->data, sizeof q_one.w), 0);
    ops()->base.destroy(fresh);
    ops()->base.destroy(two);
    ops()->base.destroy(one);
    env_end();

    /* strong_wolfe, Rosenbrock, float64 */
    env_begin(PAIR_PARAMS, 1, 1, rosen_f);
    const double x0[2] = {-1.5, 2.0};
    double x_one[2], x_two[2];
    one = start(x0, cfg(1.0, 6, 1000, 1e-7, 1e-9, 100, "strong_wolfe"));
    int calls_one = count_calls(one);
    read_x(x_one);
    CU_ASSERT_EQUAL(header_of(one).n_iter, 6);
    two = start(x0, cfg(1.0, 3, 1000, 1e-7, 1e-9, 100, "strong_wolfe"));
    int calls_two = count_calls(two);
    calls_two += count_calls(two);
    read_x(x_two);
    CU_ASSERT_EQUAL(header_of(two).n_iter, 6);
    CU_ASSERT_EQUAL(calls_two, calls_one + 1);
    CU_ASSERT_EQUAL(memcmp(x_one, x_two, sizeof x_one), 0);
    CU_ASSERT_TRUE(calls_one > 6); /* the line search did more than one probe somewhere */
    ops()->base.destroy(two);
    ops()->base.destroy(one);
    env_end();
}

/* ----------------------------------------------------------------- state */

/* Two steps on A, A's state into a fresh B, then the same third step on
 * both from the same parameters: bit-identical parameters and calls. */
static void check_roundtrip(const pspec *ps, int np, int f64, objective_fn obj, const double *x0, const config *c) {
    env_begin(ps, np, f64, obj);
    kiln_instance *a = start(x0, *c);
    count_calls(a);
    count_calls(a);
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    CU_ASSERT_EQUAL_FATAL(ops()->base.get_state(a, &ver, &blob, &size), KILN_OK);
    CU_ASSERT_EQUAL(ver, 1);

    kiln_instance *b = make(*c);
    CU_ASSERT_EQUAL(ops()->base.set_state(b, ver, blob, size), KILN_OK);
    /* B now saves exactly what A saved (the history in logical order even
     * when A's ring has wrapped) */
    uint32_t ver_b = 0;
    void *blob_b = NULL;
    size_t size_b = 0;
    CU_ASSERT_EQUAL_FATAL(ops()->base.get_state(b, &ver_b, &blob_b, &size_b), KILN_OK);
    CU_ASSERT_EQUAL(size_b, size);
    CU_ASSERT_TRUE(size_b == size && memcmp(blob, blob_b, size) == 0);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob_b);

    double mid[MAXN], xa[MAXN], xb[MAXN], xf[MAXN];
    read_x(mid);
    int calls_a = count_calls(a);
    read_x(xa);
    write_vec(mid, 0);
    int calls_b = count_calls(b);
    read_x(xb);
    CU_ASSERT_EQUAL(calls_a, calls_b);
    CU_ASSERT_EQUAL(memcmp(xa, xb, (size_t)g_n * sizeof(double)), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(xa, mid, (size_t)g_n * sizeof(double)), 0);

    /* without the state the third step differs */
    kiln_instance *fresh = make(*c);
    write_vec(mid, 0);
    count_calls(fresh);
    read_x(xf);
    CU_ASSERT_NOT_EQUAL(memcmp(xa, xf, (size_t)g_n * sizeof(double)), 0);

    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    ops()->base.destroy(fresh);
    ops()->base.destroy(b);
    ops()->base.destroy(a);
    env_end();
}

static void test_state_roundtrip(void) {
    const double r0[2] = {-1.5, 2.0};
    /* none on the quadratic */
    config cn = cfg(1.0, 3, 0, 1e-7, 1e-9, 100, "none");
    check_roundtrip(QUAD_PARAMS, 2, 0, quad_f, QX0, &cn);
    /* strong_wolfe on Rosenbrock with history_size 3: the ring has wrapped
     * (4 iterations per step, 7 pairs offered) when the state is saved */
    config cw = cfg(1.0, 4, 0, 1e-7, 1e-9, 3, "strong_wolfe");
    check_roundtrip(PAIR_PARAMS, 1, 0, rosen_f, r0, &cw);
    check_roundtrip(PAIR_PARAMS, 1, 1, rosen_f, r0, &cw);
}

/* The config of the state refusals: 4 iterations a step, 3 pairs kept. */
static config state_cfg(void) { return cfg(0.1, 4, 0, 1e-7, 1e-9, 100, "none"); }

/* What the state refusals cut up: on the quadratic (float32), an optimizer
 * of state_cfg() after one step and the state it saves (the caller frees
 * the blob through the host). */
static kiln_instance *stepped_state(uint32_t *ver, void **blob, size_t *size) {
    env_begin(QUAD_PARAMS, 2, 0, quad_f);
    kiln_instance *a = start(QX0, state_cfg());
    count_calls(a);
    CU_ASSERT_EQUAL_FATAL(ops()->base.get_state(a, ver, blob, size), KILN_OK);
    return a;
}

/* Blobs that do not fit are refused with a message, leaving the state as
 * it was; a smaller history_size keeps the newest pairs. */
static void test_state_refused(void) {
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    kiln_instance *a = stepped_state(&ver, &blob, &size);
    CU_ASSERT_EQUAL(header_of(a).hist_len, 3);

    const config c = state_cfg();
    kiln_instance *b = make(c);
    count_calls(b); /* b has a state of its own that a refusal must keep */
    lb_header before = header_of(b);
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->base.set_state(b, ver, blob, size - 8), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "bytes"));
    unsigned char *bigger = calloc(1, size + 8);
    CU_ASSERT_PTR_NOT_NULL_FATAL(bigger);
    memcpy(bigger, blob, size);
    CU_ASSERT_EQUAL(ops()->base.set_state(b, ver, bigger, size + 8), KILN_E_STATE);
    bigger[0] ^= 1;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->base.set_state(b, ver, bigger, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "magic"));
    free(bigger);
    CU_ASSERT_EQUAL(ops()->base.set_state(b, ver, blob, 10), KILN_E_STATE);
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->base.set_state(b, 2, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "version"));
    lb_header after = header_of(b);
    CU_ASSERT_EQUAL(memcmp(&before, &after, sizeof before), 0);

    /* another parameter count */
    kiln_instance *one = create_only(c);
    CU_ASSERT_EQUAL(ops()->setup(one, kiln_test_params(g_th), 1), KILN_OK); /* the weight only */
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->base.set_state(one, ver, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "2 parameters"));

    /* same count, other sizes: the bias as (2) instead of (3) */
    kiln_parameter fake_bias = *kiln_test_params(g_th)[1];
    fake_bias.numel = 2;
    fake_bias.shape[0] = 2;
    kiln_parameter *swapped[2] = {kiln_test_params(g_th)[0], &fake_bias};
    kiln_instance *other = create_only(c);
    CU_ASSERT_EQUAL(ops()->setup(other, swapped, 2), KILN_OK);
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->base.set_state(other, ver, blob, size), KILN_E_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "bias"));

    /* history_size 2 < the 3 saved pairs: accepted, the newest 2 kept */
    config c2 = cfg(0.1, 4, 0, 1e-7, 1e-9, 2, "none");
    kiln_instance *small = make(c2);
    CU_ASSERT_EQUAL(ops()->base.set_state(small, ver, blob, size), KILN_OK);
    lb_header hs = header_of(small);
    CU_ASSERT_EQUAL(hs.hist_len, 2);
    CU_ASSERT_EQUAL(hs.n_iter, 4);
    CU_ASSERT_EQUAL(count_calls(small), 4);

    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    ops()->base.destroy(small);
    ops()->base.destroy(other);
    ops()->base.destroy(one);
    ops()->base.destroy(b);
    ops()->base.destroy(a);
    env_end();
}

/* Values out of range are refused with KILN_E_DATA and one line naming
 * the value, leaving the optimizer as it was: counters that would
 * overflow, counters that contradict each other, non-finite scalars, and
 * non-finite vectors or curvature pairs (which the next step would spread
 * into NaN weights and a checkpoint set_state itself refuses). The blob
 * they were cut from still restores. */
static void test_state_bounds(void) {
    uint32_t ver = 0;
    void *blob = NULL;
    size_t size = 0;
    kiln_instance *a = stepped_state(&ver, &blob, &size);
    lb_header h0;
    memcpy(&h0, blob, sizeof h0);
    CU_ASSERT_EQUAL_FATAL(h0.n_iter, 4);
    CU_ASSERT_EQUAL_FATAL(h0.hist_len, 3);
    /* header, 2 sizes, d[7], prev_flat_grad[7], ro[3], 3 x (y[7], s[7]) */
    const size_t vecs = sizeof(lb_header) + 2 * sizeof(int64_t), n = 7;
    CU_ASSERT_EQUAL_FATAL(size, vecs + (2 * n + 3 + 3 * 2 * n) * sizeof(double));
    kiln_instance *b = make(state_cfg());
    count_calls(b);
    lb_header before = header_of(b);
    unsigned char *bad = malloc(size);
    CU_ASSERT_PTR_NOT_NULL_FATAL(bad);
    enum { N_ITER, FUNC_EVALS, HIST_LEN, RESERVED, LR, H_DIAG, PREV_LOSS, VEC };
    const struct {
        int what;
        double v;  /* the header field's value, or a vector element's */
        size_t at; /* VEC: the double's index after the sizes */
        const char *needle;
    } cases[] = {
        {N_ITER, 9223372036854775807.0, 0, "lbfgs state n_iter: expected 0 <= value < 2^53, found 9223372036854775807"},
        {FUNC_EVALS, -1, 0, "lbfgs state func_evals: expected 0 <= value < 2^53, found -1"},
        {HIST_LEN, 9007199254740992.0, 0, "lbfgs state history length: expected 0 <= value < 2^53, found 9007199254740992"},
        {FUNC_EVALS, 2, 0, "lbfgs state func_evals: expected >= n_iter (4), found 2"},
        {HIST_LEN, 4, 0, "lbfgs state history length: expected <= n_iter - 1 (3), found 4"},
        {RESERVED, 1, 0, "lbfgs state reserved word: expected 0, found 1"},
        {LR, INFINITY, 0, "lbfgs state lr: expected a finite value > 0, found inf"},
        {H_DIAG, NAN, 0, "lbfgs state H_diag: expected a finite value >= 0, found nan"},
        {H_DIAG, -0.5, 0, "lbfgs state H_diag: expected a finite value >= 0, found -0.5"},
        {PREV_LOSS, NAN, 0, "lbfgs state prev_loss: expected a loss after 4 iterations, found nan"},
        {VEC, INFINITY, 2, "lbfgs state d[2]: expected a finite value, found inf"},
        {VEC, NAN, 7, "lbfgs state prev_flat_grad[0]: expected a finite value, found nan"},
        {VEC, -1, 15, "lbfgs state ro[1]: expected a finite value > 0, found -1"},
        {VEC, NAN, 14 + 3 + 2 * 14 + 5, "lbfgs state history pair[2]: expected a finite value, found nan"},
        {VEC, -INFINITY, 14 + 3 + 13, "lbfgs state history pair[0]: expected a finite value, found -inf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(bad, blob, size);
        lb_header h = h0;
        switch (cases[i].what) {
        case N_ITER: h.n_iter = cases[i].v >= 9.2e18 ? INT64_MAX : (int64_t)cases[i].v; break;
        case FUNC_EVALS: h.func_evals = (int64_t)cases[i].v; break;
        case HIST_LEN: h.hist_len = (int64_t)cases[i].v; break;
        case RESERVED: h.reserved = (uint32_t)cases[i].v; break;
        case LR: h.lr = cases[i].v; break;
        case H_DIAG: h.h_diag = cases[i].v; break;
        case PREV_LOSS: h.prev_loss = cases[i].v; break;
        default: memcpy(bad + vecs + cases[i].at * sizeof(double), &cases[i].v, sizeof(double)); break;
        }
        memcpy(bad, &h, sizeof h);
        kiln_test_clear_error(g_th);
        CU_ASSERT_EQUAL(ops()->base.set_state(b, ver, bad, size), KILN_E_DATA);
        if (!strstr(kiln_test_error(g_th), cases[i].needle)) fprintf(stderr, "\ncase %zu: %s\n", i, kiln_test_error(g_th));
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), cases[i].needle));
        CU_ASSERT_PTR_NULL(strchr(kiln_test_error(g_th), '\n'));
        lb_header after = header_of(b);
        CU_ASSERT_EQUAL(memcmp(&before, &after, sizeof before), 0);
    }
    /* the blob they came from restores, and B then saves exactly it */
    CU_ASSERT_EQUAL(ops()->base.set_state(b, ver, blob, size), KILN_OK);
    void *again = NULL;
    size_t size2 = 0;
    CU_ASSERT_EQUAL_FATAL(ops()->base.get_state(b, &ver, &again, &size2), KILN_OK);
    CU_ASSERT_TRUE(size2 == size && memcmp(again, blob, size) == 0);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), again);
    free(bad);
    kiln_test_services(g_th)->free(kiln_test_hctx(g_th), blob);
    ops()->base.destroy(b);
    ops()->base.destroy(a);
    env_end();
}

/* ---------------------------------------------------- errors and misuse */

static void test_closure_errors(void) {
    env_begin(PAIR_PARAMS, 1, 0, rosen_f);
    const double x0[2] = {-1.5, 2.0};
    write_vec(x0, 0);
    float start[2];
    memcpy(start, kiln_test_params(g_th)[0]->data, sizeof start);
    config c = cfg(1.0, 20, 0, 1e-7, 1e-9, 100, "strong_wolfe");
    kiln_instance *opt = make(c);

    /* no closure */
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->step(opt, NULL), KILN_E_INVALID_ARG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "closure"));
    kiln_closure empty = {sizeof empty, 0, NULL, NULL};
    CU_ASSERT_EQUAL(ops()->step(opt, &empty), KILN_E_INVALID_ARG);

    /* a NaN loss (the step returned no loss) on the first call, and inside
     * the line search (call 3): KILN_E_STATE, parameters back at the start */
    closure_ctx nan1 = {0, 0, 1, 0.0};
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->step(opt, CLOSURE(nan1)), KILN_E_STATE);
    CU_ASSERT_EQUAL(nan1.calls, 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "loss"));
    closure_ctx nan3 = {0, 0, 3, 0.0};
    CU_ASSERT_EQUAL(ops()->step(opt, CLOSURE(nan3)), KILN_E_STATE);
    CU_ASSERT_EQUAL(nan3.calls, 3);
    CU_ASSERT_EQUAL(memcmp(start, kiln_test_params(g_th)[0]->data, sizeof start), 0);

    /* a failing closure during the first line search: its status comes
     * back and the probe's parameters are put back */
    closure_ctx fail2 = {0, 2, 0, 0.0};
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->step(opt, CLOSURE(fail2)), KILN_E_NONFINITE);
    CU_ASSERT_EQUAL(fail2.calls, 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "forced"));
    CU_ASSERT_EQUAL(memcmp(start, kiln_test_params(g_th)[0]->data, sizeof start), 0);
    ops()->base.destroy(opt);

    /* line_search none: a NaN loss after the first iteration */
    config cn = cfg(1.0, 20, 0, 1e-7, 1e-9, 100, "none");
    opt = make(cn);
    closure_ctx nan2 = {0, 0, 2, 0.0};
    CU_ASSERT_EQUAL(ops()->step(opt, CLOSURE(nan2)), KILN_E_STATE);
    ops()->base.destroy(opt);

    /* before setup */
    kiln_instance *bare = create_only(c);
    closure_ctx cc = {0};
    CU_ASSERT_EQUAL(ops()->step(bare, CLOSURE(cc)), KILN_E_STATE);
    CU_ASSERT_EQUAL(cc.calls, 0);
    CU_ASSERT_EQUAL(ops()->zero_grad(bare), KILN_E_STATE);
    uint32_t ver;
    void *blob = NULL;
    size_t size;
    CU_ASSERT_EQUAL(ops()->base.get_state(bare, &ver, &blob, &size), KILN_E_STATE);
    ops()->base.destroy(bare);
    env_end();
}

static void test_zero_grad_lr(void) {
    for (int f64 = 0; f64 <= 1; f64++) {
        env_begin(QUAD_PARAMS, 2, f64, quad_f);
        config c = cfg(1.0, 20, 0, 1e-7, 1e-9, 100, "none");
        kiln_instance *opt = make(c);
        const double g[QN] = {1, -2, 3, -4, 5, -6, 7};
        write_vec(g, 1);
        CU_ASSERT_EQUAL(ops()->zero_grad(opt), KILN_OK);
        for (uint32_t p = 0; p < kiln_test_param_count(g_th); p++) {
            const unsigned char *bytes = (const unsigned char *)kiln_test_params(g_th)[p]->grad;
            size_t nb = (size_t)kiln_test_params(g_th)[p]->numel * (f64 ? 8 : 4);
            for (size_t i = 0; i < nb; i++) CU_ASSERT_EQUAL(bytes[i], 0);
        }
        CU_ASSERT_DOUBLE_EQUAL(ops()->get_lr(opt), 1.0, 0.0);
        CU_ASSERT_EQUAL(ops()->set_lr(opt, 0.25), KILN_OK);
        CU_ASSERT_DOUBLE_EQUAL(ops()->get_lr(opt), 0.25, 0.0);
        kiln_test_clear_error(g_th);
        CU_ASSERT_EQUAL(ops()->set_lr(opt, 0.0), KILN_E_INVALID_ARG);
        CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "lr"));
        CU_ASSERT_EQUAL(ops()->set_lr(opt, -1.0), KILN_E_INVALID_ARG);
        CU_ASSERT_EQUAL(ops()->set_lr(opt, NAN), KILN_E_INVALID_ARG);
        CU_ASSERT_DOUBLE_EQUAL(ops()->get_lr(opt), 0.25, 0.0);
        ops()->base.destroy(opt);
        env_end();
    }
}

/* setup refuses a missing accelerator and masters other than fp32/fp64. */
static void test_setup_refusals(void) {
    env_begin(QUAD_PARAMS, 2, 0, quad_f);
    config c = cfg(1.0, 20, 0, 1e-7, 1e-9, 100, "none");
    kiln_instance *opt = create_only(c);
    const kiln_kernels *k = kiln_test_kernels(g_th);
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), NULL);
    kiln_test_clear_error(g_th);
    CU_ASSERT_NOT_EQUAL(ops()->setup(opt, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "accelerator"));
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), k);
    kiln_test_params(g_th)[1]->param_dtype = KILN_DTYPE_F16;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->setup(opt, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_E_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "float16"));
    kiln_test_params(g_th)[1]->param_dtype = KILN_DTYPE_F32;
    CU_ASSERT_EQUAL(ops()->setup(opt, kiln_test_params(g_th), 0), KILN_E_INVALID_ARG);
    CU_ASSERT_EQUAL(ops()->setup(opt, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    ops()->base.destroy(opt);
    env_end();
}

/* create() refuses `c` with KILN_E_CONFIG, a message naming `key`, and no
 * instance. */
static void expect_refused(config c, const char *key) {
    kiln_instance *inst = (kiln_instance *)&inst;
    kiln_test_clear_error(g_th);
    CU_ASSERT_EQUAL(ops()->base.create(g_lb->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), c.kv, &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(inst);
    if (!strstr(kiln_test_error(g_th), key)) fprintf(stderr, "message for %s: \"%s\"\n", key, kiln_test_error(g_th));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), key));
}

static void test_bad_config(void) {
    kiln_test_reset(g_th);
    expect_refused(cfg(0.0, 20, 0, 1e-7, 1e-9, 100, "none"), "lr");
    expect_refused(cfg(-1.0, 20, 0, 1e-7, 1e-9, 100, "none"), "lr");
    expect_refused(cfg(NAN, 20, 0, 1e-7, 1e-9, 100, "none"), "lr");
    expect_refused(cfg(INFINITY, 20, 0, 1e-7, 1e-9, 100, "none"), "lr");
    expect_refused(cfg(1.0, 0, 0, 1e-7, 1e-9, 100, "none"), "max_iter");
    expect_refused(cfg(1.0, 20, -1, 1e-7, 1e-9, 100, "none"), "max_eval");
    expect_refused(cfg(1.0, 20, 0, -1e-7, 1e-9, 100, "none"), "tolerance_grad");
    expect_refused(cfg(1.0, 20, 0, 1e-7, NAN, 100, "none"), "tolerance_change");
    expect_refused(cfg(1.0, 20, 0, 1e-7, 1e-9, 0, "none"), "history_size");
    expect_refused(cfg(1.0, 20, 0, 1e-7, 1e-9, -5, "none"), "history_size");
    expect_refused(cfg(1.0, 20, 0, 1e-7, 1e-9, 100, "armijo"), "line_search");
    expect_refused(cfg(1.0, 20, 0, 1e-7, 1e-9, 100, "Strong_Wolfe"), "Strong_Wolfe");
    expect_refused(cfg(1.0, 20, 0, 1e-7, 1e-9, 100, ""), "strong_wolfe");
    /* accepted boundaries: tolerances 0, history_size 1, max_eval 1 */
    kiln_instance *inst = NULL;
    config ok = cfg(1e-3, 1, 1, 0.0, 0.0, 1, "strong_wolfe");
    CU_ASSERT_EQUAL(ops()->base.create(g_lb->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), ok.kv, &inst), KILN_OK);
    ops()->base.destroy(inst);
}

static CU_TestInfo cases_lbfgs[] = {
    {"descriptor: keys, defaults, properties", test_descriptor},
    {"quadratic to A^-1 b, none, float32", test_quadratic_none},
    {"quadratic to A^-1 b, strong_wolfe, float32", test_quadratic_wolfe},
    {"quadratic to A^-1 b, none, float64 masters", test_quadratic_none_f64},
    {"quadratic to A^-1 b, strong_wolfe, float64 masters", test_quadratic_wolfe_f64},
    {"rosenbrock to (1, 1), strong_wolfe, float32", test_rosenbrock},
    {"rosenbrock to (1, 1), strong_wolfe, float64 masters", test_rosenbrock_f64},
    {"hand-derived 2-D iterates", test_reference_2d},
    {"first iteration bit for bit, float32", test_first_iteration_f32},
    {"reference trajectories (every line-search branch)", test_reference_trajectories},
    {"closure calls, line_search none", test_counts_none},
    {"closure calls, default max_eval", test_counts_default_max_eval},
    {"optimal start: one call, no change", test_optimal_start},
    {"history persists across step() calls", test_history_persists},
    {"state round trip, bit-identical third step", test_state_roundtrip},
    {"state refusals", test_state_refused},
    {"state values bounded; a bad blob refused", test_state_bounds},
    {"closure errors and misuse", test_closure_errors},
    {"zero_grad and lr", test_zero_grad_lr},
    {"setup refusals", test_setup_refusals},
    {"bad config refused", test_bad_config},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    CU_SuiteInfo suites[] = {
        {.pName = "lbfgs", .pInitFunc = suite_init, .pCleanupFunc = suite_clean, .pTests = cases_lbfgs},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "cunit_main.h"
