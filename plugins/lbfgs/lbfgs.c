/*
 * lbfgs.c — the "lbfgs" optimizer plugin: torch.optim.LBFGS re-done for kiln.
 * One step() runs up to max_iter quasi-Newton iterations, calling the closure
 * (training_step, zero_grad, backward) as often as the algorithm needs: the
 * direction comes from the two-loop recursion over the last history_size
 * curvature pairs (s = t*d, y = g - g_prev, kept only when y.s > 1e-10) with
 * the initial inverse Hessian H_diag * I, the step length is min(1, 1/|g|_1)
 * * lr on the very first iteration and lr afterwards, optionally refined by
 * PyTorch's strong-Wolfe line search (cubic interpolation, c1 = 1e-4,
 * c2 = 0.9, at most 25 evaluations), and the loop stops on PyTorch's rules
 * (max_iter, max_eval, max|g| <= tolerance_grad, |t*d| or the loss change
 * below tolerance_change, or a direction that is not a descent direction).
 * The flat parameter and gradient vectors live in HOST memory as doubles and
 * are read and written through the accelerator's copy (D2H/H2D), converting
 * from and to each parameter's master dtype (float32 or float64), so the
 * algorithm works the same on an accelerator whose memory is not host memory.
 * Everything is allocated in setup except the history pairs, which are
 * allocated the first time each slot is used (so a small run never pays for
 * history_size full-size vectors) and reused afterwards. The state kept
 * across step() calls — n_iter, func_evals, d, t, the history, H_diag,
 * prev_flat_grad, prev_loss — is what get_state/set_state serialise (version
 * 1), with the parameter sizes checked so another model's state is refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>
#include <kiln/optim_util.h>

enum { LB_LS_NONE = 0, LB_LS_STRONG_WOLFE = 1 };

/* _strong_wolfe's constants as LBFGS.step calls it (c1, c2, max_ls). */
#define LB_C1 1e-4
#define LB_C2 0.9
#define LB_MAX_LS 25
/* A curvature pair enters the history only when y.s exceeds this (PyTorch). */
#define LB_YS_MIN 1e-10
/* Restored counters stay below 2^53 (exact as doubles), far from overflow. */
#define LB_COUNT_LIMIT ((int64_t)1 << 53)
/* history_size bound: keeps history_size * sizeof(pointer) sane. */
#define LB_MAX_HISTORY 1000000

/* Hyperparameters (max_eval already resolved from 0 to max_iter * 5 / 4). */
typedef struct lb_config {
    double lr, tolerance_grad, tolerance_change;
    int64_t max_iter, max_eval, history_size;
    int line_search; /* LB_LS_* */
} lb_config;

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    lb_config cfg;
    /* set by setup() */
    kiln_instance *acc;
    const kiln_kernels *k;
    kiln_parameter **params; /* (np) in the order setup got them              */
    uint32_t np;
    size_t n;                /* total elements over all parameters            */
    double *x;               /* (n) the parameters, exactly as the masters hold them */
    double *g;               /* (n) flat gradient at x                        */
    double *prev_g;          /* (n) PyTorch's prev_flat_grad                  */
    double *d;               /* (n) search direction                          */
    double *ls_buf[3];       /* (n) each: line-search gradients (strong_wolfe only) */
    void *stage;             /* (largest parameter) one parameter in its master dtype */
    double **dirs, **stps;   /* (history_size) y and s vectors, each (n) once its slot is used */
    double *ro;              /* (history_size) 1 / y.s per slot               */
    double *al;              /* (history_size) two-loop scratch               */
    int64_t hist_start;      /* ring slot of the oldest pair                  */
    int64_t hist_len;        /* pairs held (<= history_size)                  */
    int64_t cur_evals;       /* closure calls in the running step()           */
    /* state kept across step() calls (PyTorch's optimizer state) */
    int64_t n_iter, func_evals;
    double t, h_diag, prev_loss;
};

/* State blob, version 1, native byte order:
 *   lb_state_header
 *   int64_t numel[nparams]            sizes, checked against the parameters
 *   double  d[n], prev_flat_grad[n]   only when n_iter > 0
 *   double  ro[hist_len]              oldest pair first
 *   double  old_dirs[i][n], old_stps[i][n]   for i = 0 .. hist_len-1, oldest first */
#define LB_STATE_VERSION 1u
#define LB_STATE_MAGIC "kiln-lbfgs-state"
typedef struct lb_state_header {
    char magic[16];
    uint32_t nparams;
    uint32_t reserved; /* 0 */
    int64_t n_iter, func_evals, hist_len;
    double lr, t, h_diag, prev_loss;
} lb_state_header;

#define LB_ERR(self, code, ...) kiln_errorf((self)->svc, (self)->hctx, (code), __VA_ARGS__)

/* Python's max(a, b) / min(a, b) (the first argument wins ties and NaN),
 * so the line search takes the same branches as lbfgs.py. */
static double py_max(double a, double b) { return b > a ? b : a; }
static double py_min(double a, double b) { return b < a ? b : a; }

static double lb_dot(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* max |a_i * scale|; NaN when any element is NaN (torch's max propagates
 * NaN, so a NaN gradient never counts as optimal). */
static double lb_absmax(const double *a, double scale, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double v = fabs(a[i] * scale);
        if (isnan(v)) return v;
        if (v > m) m = v;
    }
    return m;
}

/* ---------------------------------------------------------------- create */

static int32_t lb_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                         const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    double lr = kiln_kv_float(config, "lr", 1.0);
    int64_t max_iter = kiln_kv_int(config, "max_iter", 20);
    int64_t max_eval = kiln_kv_int(config, "max_eval", 0);
    double tolerance_grad = kiln_kv_float(config, "tolerance_grad", 1e-7);
    double tolerance_change = kiln_kv_float(config, "tolerance_change", 1e-9);
    int64_t history_size = kiln_kv_int(config, "history_size", 100);
    const char *ls = kiln_kv_str(config, "line_search", "none");

    if (!(lr > 0.0) || !isfinite(lr))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "lr must be a finite number > 0, got %g", lr);
    if (max_iter < 1)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "max_iter must be >= 1, got %lld", (long long)max_iter);
    if (max_eval < 0)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "max_eval must be >= 1, or 0 for max_iter * 5 / 4, got %lld",
                           (long long)max_eval);
    if (!(tolerance_grad >= 0.0) || !isfinite(tolerance_grad))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "tolerance_grad must be a finite number >= 0, got %g",
                           tolerance_grad);
    if (!(tolerance_change >= 0.0) || !isfinite(tolerance_change))
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "tolerance_change must be a finite number >= 0, got %g",
                           tolerance_change);
    if (history_size < 1 || history_size > LB_MAX_HISTORY)
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "history_size must be between 1 and %d, got %lld",
                           LB_MAX_HISTORY, (long long)history_size);
    int line_search;
    if (ls && !strcmp(ls, "none"))
        line_search = LB_LS_NONE;
    else if (ls && !strcmp(ls, "strong_wolfe"))
        line_search = LB_LS_STRONG_WOLFE;
    else
        return kiln_errorf(svc, hctx, KILN_E_CONFIG, "line_search must be \"none\" or \"strong_wolfe\", got \"%s\"",
                           ls ? ls : "(not a string)");

    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "cannot allocate the lbfgs instance");
    self->svc = svc;
    self->hctx = hctx;
    /* PyTorch: max_eval = max_iter * 5 // 4 when not given */
    self->cfg = (lb_config){lr, tolerance_grad, tolerance_change, max_iter, max_eval ? max_eval : max_iter * 5 / 4,
                            history_size, line_search};
    self->h_diag = 1.0;
    self->prev_loss = NAN;
    *out = self;
    return KILN_OK;
}

/* Frees what setup() built and forgets the optimizer state; the instance
 * keeps its configuration and is usable for a new setup. */
static void lb_release(kiln_instance *self) {
    for (int64_t i = 0; self->dirs && i < self->cfg.history_size; i++) free(self->dirs[i]);
    for (int64_t i = 0; self->stps && i < self->cfg.history_size; i++) free(self->stps[i]);
    void *owned[] = {self->dirs, self->stps, self->ro, self->al, self->ls_buf[0], self->ls_buf[1], self->ls_buf[2],
                     self->x, self->g, self->prev_g, self->d, self->stage, self->params};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) free(owned[i]);
    const kiln_host_services *svc = self->svc;
    kiln_host_ctx *hctx = self->hctx;
    const lb_config cfg = self->cfg;
    memset(self, 0, sizeof *self);
    self->svc = svc;
    self->hctx = hctx;
    self->cfg = cfg;
    self->h_diag = 1.0;
    self->prev_loss = NAN;
}

static void lb_destroy(kiln_instance *self) {
    if (!self) return;
    lb_release(self);
    free(self);
}

/* ----------------------------------------------------------------- setup */

static int32_t lb_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t np) {
    if (self->svc->abi_minor < 1 || !self->svc->accelerator)
        return LB_ERR(self, KILN_E_UNSUPPORTED, "the host offers no accelerator service (needs ABI 1.1)");
    kiln_instance *acc = NULL;
    const kiln_kernels *k = NULL;
    int32_t rc = self->svc->accelerator(self->hctx, &acc, &k);
    if (rc != KILN_OK || !k)
        return LB_ERR(self, rc != KILN_OK ? rc : KILN_E_NOT_FOUND,
                      "no accelerator kernel table is available (accelerator service returned %s)",
                      kiln_status_name(rc));
    if (!k->copy || !k->zero)
        return LB_ERR(self, KILN_E_UNSUPPORTED, "the accelerator's kernel table lacks copy or zero");
    if (np == 0 || !params) return LB_ERR(self, KILN_E_INVALID_ARG, "lbfgs got an empty parameter list");
    size_t n = 0, stage_bytes = 0;
    for (uint32_t i = 0; i < np; i++) {
        const kiln_parameter *p = params[i];
        if (!p || p->numel < 0 || (p->numel > 0 && (!p->data || !p->grad)))
            return LB_ERR(self, KILN_E_INVALID_ARG, "parameter %u (%s) has no data/grad memory or a negative size",
                          (unsigned)i, p && p->name ? p->name : "?");
        const uint32_t dt = kiln_param_dtype(p);
        if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F64)
            return LB_ERR(self, KILN_E_UNSUPPORTED, "parameter %s has %s masters; lbfgs handles float32 and float64",
                          p->name ? p->name : "?", kiln_dtype_name(dt));
        n += (size_t)p->numel;
        if (kiln_param_bytes(p) > stage_bytes) stage_bytes = kiln_param_bytes(p);
    }
    if (n == 0) return LB_ERR(self, KILN_E_INVALID_ARG, "lbfgs got %u parameters with 0 elements in total", np);

    lb_release(self); /* a second setup() starts over */
    self->acc = acc;
    self->k = k;
    const size_t hs = (size_t)self->cfg.history_size;
    self->params = calloc(np, sizeof *self->params);
    self->x = malloc(n * sizeof(double));
    self->g = malloc(n * sizeof(double));
    self->prev_g = calloc(n, sizeof(double));
    self->d = calloc(n, sizeof(double));
    self->stage = malloc(stage_bytes);
    self->dirs = calloc(hs, sizeof *self->dirs);
    self->stps = calloc(hs, sizeof *self->stps);
    self->ro = calloc(hs, sizeof(double));
    self->al = calloc(hs, sizeof(double));
    int ok = self->params && self->x && self->g && self->prev_g && self->d && self->stage && self->dirs &&
             self->stps && self->ro && self->al;
    if (ok && self->cfg.line_search == LB_LS_STRONG_WOLFE)
        for (int i = 0; i < 3; i++) ok = ok && (self->ls_buf[i] = malloc(n * sizeof(double))) != NULL;
    if (!ok) {
        lb_release(self);
        return LB_ERR(self, KILN_E_NOMEM, "cannot allocate the lbfgs buffers for %zu parameter elements", n);
    }
    memcpy(self->params, params, np * sizeof *self->params);
    self->np = np;
    self->n = n;
    return KILN_OK;
}

/* -------------------------------------------------- parameters <-> host */

/* Every parameter's master values (grads = 0) or gradients (grads = 1),
 * D2H and converted to doubles, into out (n), in parameter order. */
static int32_t lb_gather(kiln_instance *self, int grads, double *out) {
    size_t off = 0;
    for (uint32_t i = 0; i < self->np; i++) {
        const kiln_parameter *p = self->params[i];
        const size_t m = (size_t)p->numel;
        if (m == 0) continue;
        const void *src = grads ? (const void *)p->grad : (const void *)p->data;
        int32_t rc;
        if (kiln_param_dtype(p) == KILN_DTYPE_F64) {
            rc = self->k->copy(self->acc, out + off, src, m * sizeof(double), KILN_COPY_D2H);
        } else {
            rc = self->k->copy(self->acc, self->stage, src, m * sizeof(float), KILN_COPY_D2H);
            const float *f = self->stage; /* (m) */
            if (rc == KILN_OK)
                for (size_t j = 0; j < m; j++) out[off + j] = f[j];
        }
        if (rc != KILN_OK) return rc;
        off += m;
    }
    return KILN_OK;
}

/* Writes x + t * d (x alone when d is NULL) to the masters, H2D, rounded to
 * each parameter's dtype. commit = 1 makes it the new x (PyTorch's
 * _add_grad): x then holds exactly what the masters hold, so writing x back
 * later (_set_param after a line-search probe) restores them bit for bit. */
static int32_t lb_put(kiln_instance *self, double t, const double *d, int commit) {
    size_t off = 0;
    for (uint32_t i = 0; i < self->np; i++) {
        kiln_parameter *p = self->params[i];
        const size_t m = (size_t)p->numel;
        if (m == 0) continue;
        double *x = self->x + off;
        const double *dd = d ? d + off : NULL;
        int32_t rc;
        if (kiln_param_dtype(p) == KILN_DTYPE_F64) {
            double *s = self->stage; /* (m) */
            for (size_t j = 0; j < m; j++) s[j] = dd ? x[j] + t * dd[j] : x[j];
            rc = self->k->copy(self->acc, p->data, s, m * sizeof(double), KILN_COPY_H2D);
            if (rc == KILN_OK && commit) memcpy(x, s, m * sizeof(double));
        } else {
            float *s = self->stage; /* (m) */
            for (size_t j = 0; j < m; j++) s[j] = (float)(dd ? x[j] + t * dd[j] : x[j]);
            rc = self->k->copy(self->acc, p->data, s, m * sizeof(float), KILN_COPY_H2D);
            if (rc == KILN_OK && commit)
                for (size_t j = 0; j < m; j++) x[j] = s[j];
        }
        if (rc != KILN_OK) return rc;
        off += m;
    }
    return KILN_OK;
}

/* One closure call: the loss into *loss, the gradients into grad (n). */
/* The first evaluation of a step may find no loss (returns 1): the step
 * then changes nothing, as every built-in optimizer after a training_step
 * that returned none (torch's LBFGS would fail on float(None)). */
static int32_t lb_eval_ex(kiln_instance *self, const kiln_closure *cl, double *loss, double *grad, int first) {
    double f = NAN;
    int32_t rc = cl->call(cl->ctx, &f);
    self->cur_evals++;
    self->func_evals++;
    if (rc != KILN_OK) return rc; /* the closure described its own failure */
    if (isnan(f) && first && !kiln_params_any_grad(self->params, (uint32_t)self->np)) return 1;
    if (isnan(f))
        return LB_ERR(self, KILN_E_STATE,
                      "lbfgs: the closure returned no loss (NaN) on evaluation %lld of this step; LBFGS compares "
                      "losses between evaluations, so every training_step must return a loss",
                      (long long)self->cur_evals);
    *loss = f;
    return lb_gather(self, 1, grad);
}

static int32_t lb_eval(kiln_instance *self, const kiln_closure *cl, double *loss, double *grad) {
    return lb_eval_ex(self, cl, loss, grad, 0);
}

/* PyTorch's _directional_evaluate: evaluate at x + t * d, then put x back
 * (also when the closure failed, so an error leaves the weights at x). A
 * non-finite t (the interpolation met an infinite loss or gradient) is
 * refused here, where PyTorch would go on with NaN weights. */
static int32_t lb_probe(kiln_instance *self, const kiln_closure *cl, double t, double *loss, double *grad) {
    if (!isfinite(t))
        return LB_ERR(self, KILN_E_NONFINITE,
                      "lbfgs: the strong-Wolfe line search computed a non-finite trial step (%g) because the loss "
                      "or gradient at an earlier trial point was not finite; lower lr",
                      t);
    int32_t rc = lb_put(self, t, self->d, 0);
    if (rc == KILN_OK) rc = lb_eval(self, cl, loss, grad);
    int32_t rc2 = lb_put(self, 0.0, NULL, 0);
    return rc != KILN_OK ? rc : rc2;
}

/* ----------------------------------------------------------- line search */

/* _cubic_interpolate: the minimiser of the cubic through (x1, f1, g1) and
 * (x2, f2, g2), clamped to bounds (default: between x1 and x2); the
 * midpoint of the bounds when the cubic has no real minimiser. */
static double lb_cubic(double x1, double f1, double g1, double x2, double f2, double g2, const double *bounds) {
    double lo, hi;
    if (bounds) {
        lo = bounds[0];
        hi = bounds[1];
    } else if (x1 <= x2) {
        lo = x1;
        hi = x2;
    } else {
        lo = x2;
        hi = x1;
    }
    const double d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2);
    const double d2_square = d1 * d1 - g1 * g2;
    if (d2_square >= 0) {
        const double d2 = sqrt(d2_square);
        double min_pos;
        if (x1 <= x2)
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2));
        else
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2));
        return py_min(py_max(min_pos, lo), hi);
    }
    return (lo + hi) / 2.0;
}

/* A line-search gradient buffer that neither a nor b refers to. PyTorch
 * clones g_new whenever it is kept; here gradients are never changed once
 * evaluated, so the kept ones are shared pointers and a new evaluation only
 * needs a buffer no kept pointer uses (at most two are kept at a time). */
static double *lb_free_buf(kiln_instance *self, const double *a, const double *b) {
    for (int i = 0; i < 3; i++)
        if (self->ls_buf[i] != a && self->ls_buf[i] != b) return self->ls_buf[i];
    return NULL; /* unreachable: three buffers, two exclusions */
}

/* _strong_wolfe from x along d starting at step t, with f = loss, g = self->g
 * and gtd = g.d at x. Returns the accepted step in *t_out, its loss in
 * *f_out and its gradient in self->g. */
static int32_t lb_strong_wolfe(kiln_instance *self, const kiln_closure *cl, double t, double f, double gtd,
                               double *f_out, double *t_out) {
    const size_t n = self->n;
    const double *d = self->d;
    double *g = self->g;
    const double d_norm = lb_absmax(d, 1.0, n);
    double f_new = 0.0, *g_new = self->ls_buf[0];
    int32_t rc = lb_probe(self, cl, t, &f_new, g_new);
    if (rc != KILN_OK) return rc;
    double gtd_new = lb_dot(g_new, d, n);

    /* bracket an interval containing a point satisfying the Wolfe criteria */
    double t_prev = 0, f_prev = f, gtd_prev = gtd;
    double *g_prev = g;
    double br[2] = {0, 0}, bf[2] = {0, 0}, bgtd[2] = {0, 0};
    double *bg[2] = {NULL, NULL};
    int nbr = 0, done = 0, ls_iter = 0;
    while (ls_iter < LB_MAX_LS) {
        /* lbfgs.py's three checks in its order: no sufficient decrease (or
         * a rise after two extrapolations) brackets [t_prev, t]; else the
         * strong Wolfe conditions end the search at t; else a non-negative
         * slope brackets [t_prev, t] too */
        const int no_decrease = f_new > (f + LB_C1 * t * gtd) || (ls_iter > 1 && f_new >= f_prev);
        if (!no_decrease && fabs(gtd_new) <= -LB_C2 * gtd) {
            br[0] = t, bf[0] = f_new, bg[0] = g_new;
            nbr = 1;
            done = 1;
            break;
        }
        if (no_decrease || gtd_new >= 0) {
            br[0] = t_prev, br[1] = t, bf[0] = f_prev, bf[1] = f_new;
            bg[0] = g_prev, bg[1] = g_new, bgtd[0] = gtd_prev, bgtd[1] = gtd_new;
            nbr = 2;
            break;
        }
        /* interpolate within [t + 0.01 (t - t_prev), 10 t] */
        const double bounds[2] = {t + 0.01 * (t - t_prev), t * 10};
        const double tmp = t;
        t = lb_cubic(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds);
        t_prev = tmp;
        f_prev = f_new;
        g_prev = g_new;
        gtd_prev = gtd_new;
        g_new = lb_free_buf(self, g_prev, NULL);
        if ((rc = lb_probe(self, cl, t, &f_new, g_new)) != KILN_OK) return rc;
        gtd_new = lb_dot(g_new, d, n);
        ls_iter++;
    }
    if (ls_iter == LB_MAX_LS) { /* no bracket found: fall back to [0, t] */
        br[0] = 0, br[1] = t, bf[0] = f, bf[1] = f_new, bg[0] = g, bg[1] = g_new;
        nbr = 2;
    }

    /* zoom: shrink the bracket until a point satisfies the criteria */
    int insuf_progress = 0;
    int low = bf[0] <= bf[nbr - 1] ? 0 : 1, high = 1 - low;
    while (!done && ls_iter < LB_MAX_LS) {
        if (fabs(br[1] - br[0]) * d_norm < self->cfg.tolerance_change) break; /* bracket too small */
        t = lb_cubic(br[0], bf[0], bgtd[0], br[1], bf[1], bgtd[1], NULL);
        /* Too close to an end of the bracket (twice in a row, or outside
         * it): move to 0.1 * its length from the nearer end. */
        const double bmax = py_max(br[0], br[1]), bmin = py_min(br[0], br[1]);
        const double eps = 0.1 * (bmax - bmin);
        if (py_min(bmax - t, t - bmin) < eps) {
            if (insuf_progress || t >= bmax || t <= bmin) {
                t = fabs(t - bmax) < fabs(t - bmin) ? bmax - eps : bmin + eps;
                insuf_progress = 0;
            } else {
                insuf_progress = 1;
            }
        } else {
            insuf_progress = 0;
        }
        g_new = lb_free_buf(self, bg[0], bg[1]);
        if ((rc = lb_probe(self, cl, t, &f_new, g_new)) != KILN_OK) return rc;
        gtd_new = lb_dot(g_new, d, n);
        ls_iter++;
        if (f_new > (f + LB_C1 * t * gtd) || f_new >= bf[low]) {
            /* Armijo fails or no lower than the lowest point: new high end */
            br[high] = t, bf[high] = f_new, bg[high] = g_new, bgtd[high] = gtd_new;
            low = bf[0] <= bf[1] ? 0 : 1;
            high = 1 - low;
        } else {
            if (fabs(gtd_new) <= -LB_C2 * gtd) {
                done = 1; /* strong Wolfe conditions hold */
            } else if (gtd_new * (br[high] - br[low]) >= 0) {
                /* the old high end becomes the new low end */
                br[high] = br[low], bf[high] = bf[low], bg[high] = bg[low], bgtd[high] = bgtd[low];
            }
            br[low] = t, bf[low] = f_new, bg[low] = g_new, bgtd[low] = gtd_new;
        }
    }
    *t_out = br[low];
    *f_out = bf[low];
    if (bg[low] != g) memcpy(g, bg[low], n * sizeof(double));
    return KILN_OK;
}

/* ------------------------------------------------------------------ step */

/* The L-BFGS direction into self->d: first the history update from the
 * previous iteration (y = g - prev_g, s = d * t, kept when y.s > 1e-10,
 * dropping the oldest pair when full; H_diag = y.s / y.y), then the
 * two-loop recursion d = -H g with H_0 = H_diag * I. */
static int32_t lb_direction(kiln_instance *self) {
    const size_t n = self->n;
    const int64_t cap = self->cfg.history_size;
    double *d = self->d, *g = self->g, *pg = self->prev_g;
    const double t = self->t;
    double ys = 0.0;
    for (size_t i = 0; i < n; i++) ys += (g[i] - pg[i]) * (d[i] * t);
    if (ys > LB_YS_MIN) {
        int64_t slot;
        if (self->hist_len == cap) { /* shift the history by one */
            slot = self->hist_start;
            self->hist_start = (self->hist_start + 1) % cap;
        } else {
            slot = (self->hist_start + self->hist_len) % cap;
        }
        if (!self->dirs[slot]) self->dirs[slot] = malloc(n * sizeof(double));
        if (!self->stps[slot]) self->stps[slot] = malloc(n * sizeof(double));
        if (!self->dirs[slot] || !self->stps[slot])
            return LB_ERR(self, KILN_E_NOMEM, "cannot allocate lbfgs history pair %lld (2 x %zu doubles)",
                          (long long)slot, n);
        if (self->hist_len < cap) self->hist_len++;
        double *y = self->dirs[slot], *s = self->stps[slot];
        for (size_t i = 0; i < n; i++) {
            y[i] = g[i] - pg[i];
            s[i] = d[i] * t;
        }
        self->ro[slot] = 1.0 / ys;
        self->h_diag = ys / lb_dot(y, y, n);
    }
    /* two-loop recursion, q and r both living in d */
    for (size_t i = 0; i < n; i++) d[i] = -g[i];
    for (int64_t i = self->hist_len - 1; i >= 0; i--) {
        const int64_t slot = (self->hist_start + i) % cap;
        const double *y = self->dirs[slot];
        self->al[i] = lb_dot(self->stps[slot], d, n) * self->ro[slot];
        for (size_t j = 0; j < n; j++) d[j] += -self->al[i] * y[j];
    }
    for (size_t j = 0; j < n; j++) d[j] *= self->h_diag;
    for (int64_t i = 0; i < self->hist_len; i++) {
        const int64_t slot = (self->hist_start + i) % cap;
        const double *s = self->stps[slot];
        const double be_i = lb_dot(self->dirs[slot], d, n) * self->ro[slot];
        for (size_t j = 0; j < n; j++) d[j] += (self->al[i] - be_i) * s[j];
    }
    return KILN_OK;
}

static int32_t lb_step(kiln_instance *self, const kiln_closure *closure) {
    if (!self->params) return LB_ERR(self, KILN_E_STATE, "step() before setup()");
    if (!closure || !closure->call)
        return LB_ERR(self, KILN_E_INVALID_ARG,
                      "LBFGS needs a closure: step() re-evaluates the loss and gradients several times "
                      "(torch.optim.LBFGS.step(closure)), got none");
    const size_t n = self->n;
    self->cur_evals = 0;
    /* x mirrors the masters; read them now, whatever changed them since */
    int32_t rc = lb_gather(self, 0, self->x);
    if (rc != KILN_OK) return rc;
    double loss = NAN;
    if ((rc = lb_eval_ex(self, closure, &loss, self->g, 1)) == 1) {
        kiln_logf(self->svc, self->hctx, KILN_LOG_DEBUG, "lbfgs: training_step returned no loss, no update");
        return KILN_OK;
    }
    if (rc != KILN_OK) return rc;
    int opt_cond = lb_absmax(self->g, 1.0, n) <= self->cfg.tolerance_grad;
    if (opt_cond) { /* already optimal: nothing changes but func_evals */
        kiln_logf(self->svc, self->hctx, KILN_LOG_DEBUG, "lbfgs: max |g| <= tolerance_grad at the start, no update");
        return KILN_OK;
    }
    const char *why = NULL;
    int64_t n_iter = 0;
    while (n_iter < self->cfg.max_iter) {
        n_iter++;
        self->n_iter++;
        /* direction */
        if (self->n_iter == 1) {
            for (size_t i = 0; i < n; i++) self->d[i] = -self->g[i];
            self->hist_start = self->hist_len = 0;
            self->h_diag = 1.0;
        } else if ((rc = lb_direction(self)) != KILN_OK) {
            return rc;
        }
        memcpy(self->prev_g, self->g, n * sizeof(double));
        self->prev_loss = loss;

        /* step length: min(1, 1/|g|_1) * lr on the very first iteration */
        if (self->n_iter == 1) {
            double l1 = 0.0;
            for (size_t i = 0; i < n; i++) l1 += fabs(self->g[i]);
            self->t = py_min(1.0, 1.0 / l1) * self->cfg.lr;
        } else {
            self->t = self->cfg.lr;
        }
        const double gtd = lb_dot(self->g, self->d, n);
        if (gtd > -self->cfg.tolerance_change) {
            why = "directional derivative above -tolerance_change";
            break;
        }

        if (self->cfg.line_search == LB_LS_STRONG_WOLFE) {
            if ((rc = lb_strong_wolfe(self, closure, self->t, loss, gtd, &loss, &self->t)) != KILN_OK) return rc;
            if ((rc = lb_put(self, self->t, self->d, 1)) != KILN_OK) return rc;
            opt_cond = lb_absmax(self->g, 1.0, n) <= self->cfg.tolerance_grad;
        } else {
            if ((rc = lb_put(self, self->t, self->d, 1)) != KILN_OK) return rc;
            /* no re-evaluation after the last iteration (the next step's
             * first closure call would repeat it) */
            if (n_iter != self->cfg.max_iter) {
                if ((rc = lb_eval(self, closure, &loss, self->g)) != KILN_OK) return rc;
                opt_cond = lb_absmax(self->g, 1.0, n) <= self->cfg.tolerance_grad;
            }
        }

        /* PyTorch's stopping rules, in its order */
        if (n_iter == self->cfg.max_iter)
            why = "max_iter";
        else if (self->cur_evals >= self->cfg.max_eval)
            why = "max_eval";
        else if (opt_cond)
            why = "tolerance_grad";
        else if (lb_absmax(self->d, self->t, n) <= self->cfg.tolerance_change)
            why = "step below tolerance_change";
        else if (fabs(loss - self->prev_loss) < self->cfg.tolerance_change)
            why = "loss change below tolerance_change";
        if (why) break;
    }
    kiln_logf(self->svc, self->hctx, KILN_LOG_DEBUG, "lbfgs: step ended (%s) after %lld iterations, %lld evaluations",
              why ? why : "?", (long long)n_iter, (long long)self->cur_evals);
    return KILN_OK;
}

static int32_t lb_zero_grad(kiln_instance *self) {
    if (!self->params) return LB_ERR(self, KILN_E_STATE, "zero_grad() before setup()");
    return kiln_params_zero_grad(self->k, self->acc, self->params, self->np);
}

static double lb_get_lr(kiln_instance *self) { return self->cfg.lr; }

static int32_t lb_set_lr(kiln_instance *self, double lr) {
    if (!(lr > 0.0) || !isfinite(lr))
        return LB_ERR(self, KILN_E_INVALID_ARG, "lr must be a finite number > 0, got %g", lr);
    self->cfg.lr = lr;
    return KILN_OK;
}

/* ----------------------------------------------------------------- state */

static int32_t lb_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    if (!self->params) return LB_ERR(self, KILN_E_STATE, "get_state() before setup()");
    const size_t n = self->n, nh = (size_t)self->hist_len;
    const size_t vec = n * sizeof(double);
    size_t bytes = sizeof(lb_state_header) + self->np * sizeof(int64_t) + (self->n_iter > 0 ? 2 * vec : 0) +
                   nh * (sizeof(double) + 2 * vec);
    unsigned char *blob = self->svc->alloc(self->hctx, bytes, 16);
    if (!blob) return LB_ERR(self, KILN_E_NOMEM, "cannot allocate %zu bytes for the lbfgs state", bytes);

    lb_state_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, LB_STATE_MAGIC, sizeof h.magic);
    h.nparams = self->np;
    h.n_iter = self->n_iter;
    h.func_evals = self->func_evals;
    h.hist_len = self->hist_len;
    h.lr = self->cfg.lr;
    h.t = self->t;
    h.h_diag = self->h_diag;
    h.prev_loss = self->prev_loss;
    memcpy(blob, &h, sizeof h);
    size_t off = sizeof h;
    kiln_params_write_sizes(self->params, self->np, blob, &off);
    if (self->n_iter > 0) {
        memcpy(blob + off, self->d, vec);
        memcpy(blob + off + vec, self->prev_g, vec);
        off += 2 * vec;
    }
    for (size_t i = 0; i < nh; i++, off += sizeof(double))
        memcpy(blob + off, &self->ro[(self->hist_start + (int64_t)i) % self->cfg.history_size], sizeof(double));
    for (size_t i = 0; i < nh; i++, off += 2 * vec) {
        const int64_t slot = (self->hist_start + (int64_t)i) % self->cfg.history_size;
        memcpy(blob + off, self->dirs[slot], vec);
        memcpy(blob + off + vec, self->stps[slot], vec);
    }
    *state_version = LB_STATE_VERSION;
    *data = blob;
    *size = bytes;
    return KILN_OK;
}

/* Everything is validated (and any history slot allocated) before the state
 * changes, so a refused blob leaves the optimizer exactly as it was. */
static int32_t lb_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    if (state_version != LB_STATE_VERSION)
        return LB_ERR(self, KILN_E_STATE, "lbfgs state version %u is not supported (this build reads version %u)",
                      (unsigned)state_version, LB_STATE_VERSION);
    if (!self->params) return LB_ERR(self, KILN_E_STATE, "set_state() before setup(): no parameters to match");
    const unsigned char *blob = data;
    lb_state_header h;
    if (!blob || size < sizeof h)
        return LB_ERR(self, KILN_E_STATE, "lbfgs state is %zu bytes, shorter than its %zu-byte header", size,
                      sizeof h);
    memcpy(&h, blob, sizeof h);
    if (memcmp(h.magic, LB_STATE_MAGIC, sizeof h.magic) != 0)
        return LB_ERR(self, KILN_E_STATE, "not an lbfgs state (wrong magic)");
    if (h.nparams != self->np)
        return LB_ERR(self, KILN_E_STATE, "lbfgs state holds %u parameters, the optimizer has %u",
                      (unsigned)h.nparams, (unsigned)self->np);
    /* Every value is bounded before anything is restored: counters that
     * would overflow later, and non-finite numbers the next step would
     * turn into NaN weights (and a checkpoint this function refuses). */
    const struct { const char *name; int64_t v; } counts[] = {
        {"n_iter", h.n_iter}, {"func_evals", h.func_evals}, {"history length", h.hist_len}};
    for (int i = 0; i < 3; i++)
        if (counts[i].v < 0 || counts[i].v >= LB_COUNT_LIMIT)
            return LB_ERR(self, KILN_E_DATA, "lbfgs state %s: expected 0 <= value < 2^53, found %lld", counts[i].name,
                          (long long)counts[i].v);
    /* every step evaluates once before its first iteration and once per
     * later iteration; a curvature pair comes from each iteration after
     * the first */
    if (h.func_evals < h.n_iter)
        return LB_ERR(self, KILN_E_DATA, "lbfgs state func_evals: expected >= n_iter (%lld), found %lld",
                      (long long)h.n_iter, (long long)h.func_evals);
    if (h.hist_len > (h.n_iter > 0 ? h.n_iter - 1 : 0))
        return LB_ERR(self, KILN_E_DATA, "lbfgs state history length: expected <= n_iter - 1 (%lld), found %lld",
                      (long long)(h.n_iter > 0 ? h.n_iter - 1 : 0), (long long)h.hist_len);
    if (h.reserved != 0)
        return LB_ERR(self, KILN_E_DATA, "lbfgs state reserved word: expected 0, found %u", (unsigned)h.reserved);
    if (!(h.lr > 0.0) || !isfinite(h.lr))
        return LB_ERR(self, KILN_E_DATA, "lbfgs state lr: expected a finite value > 0, found %g", h.lr);
    if (!isfinite(h.t))
        return LB_ERR(self, KILN_E_DATA, "lbfgs state t: expected a finite step length, found %g", h.t);
    /* H_diag = y.s / y.y of an accepted pair (y.s > 0), or 1 */
    if (!(h.h_diag >= 0.0) || !isfinite(h.h_diag))
        return LB_ERR(self, KILN_E_DATA, "lbfgs state H_diag: expected a finite value >= 0, found %g", h.h_diag);
    /* the loss of the last iteration: never NaN (an evaluation refuses it) */
    if (h.n_iter > 0 && isnan(h.prev_loss))
        return LB_ERR(self, KILN_E_DATA, "lbfgs state prev_loss: expected a loss after %lld iterations, found nan",
                      (long long)h.n_iter);
    size_t off = sizeof h;
    if (size < off + self->np * sizeof(int64_t))
        return LB_ERR(self, KILN_E_STATE, "lbfgs state is %zu bytes, too short for %u parameter sizes", size,
                      (unsigned)self->np);
    int64_t numel;
    int64_t bad = kiln_params_check_sizes(self->params, self->np, blob, &off, &numel);
    if (bad >= 0)
        return LB_ERR(self, KILN_E_STATE, "lbfgs state: parameter %u (%s) has %lld elements there, %lld here",
                      (unsigned)bad, self->params[bad]->name ? self->params[bad]->name : "?", (long long)numel,
                      (long long)self->params[bad]->numel);
    const size_t n = self->n, vec = n * sizeof(double), nh = (size_t)h.hist_len;
    /* the size check is done in doubles' units first so a huge hist_len
     * cannot overflow the byte count */
    const size_t rest = size - off;
    const size_t need_dir = h.n_iter > 0 ? 2 * vec : 0;
    if (rest < need_dir || (rest - need_dir) / (sizeof(double) + 2 * vec) != nh ||
        (rest - need_dir) % (sizeof(double) + 2 * vec) != 0)
        return LB_ERR(self, KILN_E_STATE,
                      "lbfgs state is %zu bytes, expected %zu for these parameters (%zu elements) and %lld history "
                      "pairs",
                      size, off + need_dir + nh * (sizeof(double) + 2 * vec), n, (long long)h.hist_len);

    /* d, prev_flat_grad, ro and the pairs: finite, and ro = 1 / y.s > 0 */
    {
        const size_t nd = h.n_iter > 0 ? 2 * n : 0, total = nd + nh + 2 * nh * n;
        for (size_t i = 0; i < total; i++) {
            double x;
            memcpy(&x, blob + off + i * sizeof(double), sizeof x);
            const int is_ro = i >= nd && i < nd + nh;
            if (isfinite(x) && (!is_ro || x > 0.0)) continue;
            const char *what = i < n && nd ? "d" : i < nd ? "prev_flat_grad" : is_ro ? "ro" : "history pair";
            const size_t at = i < n && nd ? i : i < nd ? i - n : is_ro ? i - nd : (i - nd - nh) / (2 * n);
            return LB_ERR(self, KILN_E_DATA, "lbfgs state %s[%zu]: expected a finite value%s, found %g", what, at,
                          is_ro ? " > 0" : "", x);
        }
    }

    /* A smaller history_size than the saved run's keeps the newest pairs. */
    const size_t cap = (size_t)self->cfg.history_size;
    const size_t keep = nh < cap ? nh : cap, skip = nh - keep;
    if (skip)
        kiln_logf(self->svc, self->hctx, KILN_LOG_INFO,
                  "lbfgs: the state holds %zu history pairs, history_size is %zu: the oldest %zu are dropped", nh,
                  cap, skip);
    for (size_t i = 0; i < keep; i++) {
        if (!self->dirs[i]) self->dirs[i] = malloc(vec);
        if (!self->stps[i]) self->stps[i] = malloc(vec);
        if (!self->dirs[i] || !self->stps[i])
            return LB_ERR(self, KILN_E_NOMEM, "cannot allocate lbfgs history pair %zu (2 x %zu doubles)", i, n);
    }

    if (h.n_iter > 0) {
        memcpy(self->d, blob + off, vec);
        memcpy(self->prev_g, blob + off + vec, vec);
        off += 2 * vec;
    } else {
        memset(self->d, 0, vec);
        memset(self->prev_g, 0, vec);
    }
    const size_t vecs = off + nh * sizeof(double);
    for (size_t i = 0; i < keep; i++) {
        memcpy(&self->ro[i], blob + off + (skip + i) * sizeof(double), sizeof(double));
        memcpy(self->dirs[i], blob + vecs + (skip + i) * 2 * vec, vec);
        memcpy(self->stps[i], blob + vecs + (skip + i) * 2 * vec + vec, vec);
    }
    self->hist_start = 0;
    self->hist_len = (int64_t)keep;
    self->n_iter = h.n_iter;
    self->func_evals = h.func_evals;
    self->cfg.lr = h.lr;
    self->t = h.t;
    self->h_diag = h.h_diag;
    self->prev_loss = h.prev_loss;
    return KILN_OK;
}

/* ------------------------------------------------------------ descriptor */

static const kiln_optimizer_ops lb_ops = {
    .base = {sizeof(kiln_optimizer_ops), 0, lb_create, lb_destroy, lb_get_state, lb_set_state},
    .setup = lb_setup,
    .step = lb_step,
    .zero_grad = lb_zero_grad,
    .get_lr = lb_get_lr,
    .set_lr = lb_set_lr,
};

static const kiln_param lb_params[] = {
    {"lr", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1.0),
     "step length (> 0); the very first iteration uses min(1, 1/|g|_1) * lr"},
    {"max_iter", KILN_TYPE_INT, 0, KILN_V_INT(20), "maximal number of iterations per step() (>= 1)"},
    {"max_eval", KILN_TYPE_INT, 0, KILN_V_INT(0),
     "maximal number of closure evaluations per step(); 0 means max_iter * 5 / 4"},
    {"tolerance_grad", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1e-7),
     "stop when max |gradient| <= this (first-order optimality, >= 0)"},
    {"tolerance_change", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1e-9),
     "stop when the step, the loss change or the directional derivative falls below this (>= 0)"},
    {"history_size", KILN_TYPE_INT, 0, KILN_V_INT(100),
     "curvature pairs kept (>= 1); costs 2 * history_size * numel doubles of host memory"},
    {"line_search", KILN_TYPE_STRING, 0, KILN_V_STR("none"),
     "\"none\" (fixed step lr) or \"strong_wolfe\" (PyTorch's strong-Wolfe line search)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

/* Master dtypes this optimizer updates, and that it calls its closure
 * several times per step (host/stack_checks.c reads both). */
static const char *const lb_param_dtypes[] = {"float32", "float64"};
/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const lb_checks[] = {"lr > 0", "max_iter >= 1", "max_eval >= 0", "tolerance_grad >= 0", "tolerance_change >= 0", "history_size >= 1", "line_search in {none, strong_wolfe}"};
static const kiln_kv lb_props[] = {
    {"repeated_closure", KILN_V_BOOL(1)},
    {"param_dtypes", KILN_V_STRS(lb_param_dtypes)},
    {"config_checks", KILN_V_STRS(lb_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc lb_desc = {
    sizeof(kiln_plugin_desc),
    KILN_KIND_OPTIMIZER,
    "lbfgs",
    "0.1.0",
    "limited-memory BFGS with optional strong-Wolfe line search (torch.optim.LBFGS)",
    KILN_CAP_STATEFUL | KILN_CAP_DETERMINISTIC,
    lb_props,
    lb_params,
    &lb_ops,
    NULL,
};

KILN_DEFINE_LIBRARY("lbfgs", "0.1.0", 1, &lb_desc)
