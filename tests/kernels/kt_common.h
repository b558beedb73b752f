/*
 * kt_common.h — what the three files of test_kernels_cpu (test_kernels_cpu.c,
 * test_kernels_ex.c, test_kernels_act.c) all need besides the kernels: an
 * allocation that fails the case when it cannot be had, and the closeness
 * test their tolerances are written for. Their inputs come from
 * tests/support/test_rng.h, each file with its own state. And what the
 * float32 checks (test_kernels_cpu.c) and their float64 repeats
 * (test_kernels_ex.c) share: the textbook SGD and AdamW steps in double,
 * and the Python literals of AdamW with the check written for any storage
 * type, each file keeping its own tolerances.
 */
#ifndef KILN_TESTS_KT_COMMON_H
#define KILN_TESTS_KT_COMMON_H

#include <CUnit/CUnit.h>
#include <math.h>
#include <stdlib.h>

#include "test_rng.h"

/* bytes (at least 1) from malloc; fatal when there are none. */
static inline void *kt_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    CU_ASSERT_FATAL(p != NULL);
    return p;
}

/* |got - want| <= atol + rtol * max(|got|, |want|) */
static inline int kt_close(double got, double want, double rtol, double atol) {
    return fabs(got - want) <= atol + rtol * fmax(fabs(got), fabs(want));
}

/* One step of torch.optim.SGD's documented algorithm, in double, on n
 * elements: p and the momentum buffer buf (first: the buffer starts as the
 * gradient) from g. */
static inline void kt_sgd_textbook(double *p, double *buf, const double *g, size_t n, double lr, double mu,
                                   double damp, int nest, double wd, int first) {
    for (size_t i = 0; i < n; i++) {
        double d = g[i] + wd * p[i];
        if (mu != 0.0) {
            buf[i] = first ? d : mu * buf[i] + (1.0 - damp) * d;
            d = nest ? d + mu * buf[i] : buf[i];
        }
        p[i] -= lr * d;
    }
}

/* The SGD checks' 16 option combinations, by the bits of `mode`: momentum
 * 0.9, dampening 0.25, Nesterov (with momentum only), weight decay 0.01;
 * lr 0.05 throughout. Float, as the float32 kernel takes them. */
typedef struct kt_sgd_opts {
    float lr, mu, damp, wd;
    int nest;
} kt_sgd_opts;
static inline kt_sgd_opts kt_sgd_mode(int mode) {
    kt_sgd_opts o = {0.05f, (mode & 1) ? 0.9f : 0.0f, (mode & 2) ? 0.25f : 0.0f, (mode & 8) ? 0.01f : 0.0f, 0};
    o.nest = (mode & 4) && o.mu != 0.0f;
    return o;
}

/* Step t (from 1) of torch.optim.AdamW's documented algorithm, in double,
 * on n elements: p, m, v from g. */
static inline void kt_adamw_textbook(double *p, double *m, double *v, const double *g, size_t n, double lr, double b1,
                                     double b2, double eps, double wd, int t) {
    const double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
    for (size_t i = 0; i < n; i++) {
        p[i] *= 1.0 - lr * wd;
        m[i] = b1 * m[i] + (1.0 - b1) * g[i];
        v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
        p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
    }
}

/*
 * AdamW literals from this Python 3 script (double precision, the textbook
 * AdamW of torch.optim.AdamW's documentation, written independently of the
 * kernel):
 *   import math
 *   p = [1.0, -0.5, 0.25, 2.0, 0.0, -3.0]
 *   gs = [[0.1, -0.2, 0.003, -0.0005, 1.5, 0.02],
 *         [0.05, 0.1, -0.002, 0.0007, -1.0, 0.02],
 *         [-0.08, 0.3, 0.001, 0.0002, 0.5, -0.01]]
 *   lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-3, 0.1
 *   m = [0.0]*6; v = [0.0]*6
 *   for t, g in enumerate(gs, 1):
 *       for i in range(6):
 *           p[i] *= 1 - lr*wd
 *           m[i] = b1*m[i] + (1-b1)*g[i]
 *           v[i] = b2*v[i] + (1-b2)*g[i]*g[i]
 *           mhat = m[i]/(1-b1**t)
 *           denom = math.sqrt(v[i])/math.sqrt(1-b2**t) + eps
 *           p[i] -= lr*mhat/denom
 *       print(p)
 *   print(m, v)
 * eps = 1e-3 is comparable to the small gradients, so its placement (outside
 * the sqrt, after the bias correction) matters to the result.
 */
static const double kt_adamw_p0[6] = {1.0, -0.5, 0.25, 2.0, 0.0, -3.0};
static const double kt_adamw_g[3][6] = {{0.1, -0.2, 0.003, -0.0005, 1.5, 0.02},
                                        {0.05, 0.1, -0.002, 0.0007, -1.0, 0.02},
                                        {-0.08, 0.3, 0.001, 0.0002, 0.5, -0.01}};
static const double kt_adamw_want_p[3][6] = {
    {0.9890990099009901, -0.4895497512437811, 0.24225, 2.001333333333333, -0.009993337774816789,
     -3.0065238095238094},
    {0.9789045713400174, -0.48641357236092314, 0.24096972915089504, 1.9985138886191638, -0.011427416801647095,
     -3.013041095238095},
    {0.9758135316367045, -0.4898031176890792, 0.23882513100578306, 1.9954766734705558, -0.014198501680711918,
     -3.0149030814168105}};
static const double kt_adamw_want_m[6] = {0.0046, 0.02279999999999999, 0.00016299999999999998,
                                          4.249999999999999e-05, 0.08149999999999999, 0.0024200000000000003};
static const double kt_adamw_want_v[6] = {1.887751000000002e-05, 0.00013991004000000015, 1.3978009000000012e-08,
                                          7.790102500000008e-10, 0.003494502250000003, 8.988004000000009e-07};

/*
 * The script above through `update` (an AdamW kernel taking T storage and
 * the script's double hyperparameters) on the literals stored as T (each
 * input's T is the T of its decimal: checked for float, where the
 * conversion rounds twice), p after each step and m, v at the end checked
 * with the file's `count_far` (what, got, want, n, rtol, atol) under
 * rtol_p/atol_p and rtol_mv; the messages start with `name`. A macro, to
 * serve float and double storage alike.
 */
#define KT_ADAMW_LITERALS(T, update, count_far, name, rtol_p, atol_p, rtol_mv)                                        \
    do {                                                                                                               \
        T p_[6], m_[6] = {0}, v_[6] = {0}, g_[3][6];                                                                   \
        for (int i_ = 0; i_ < 6; i_++) {                                                                               \
            p_[i_] = (T)kt_adamw_p0[i_];                                                                               \
            for (int t_ = 0; t_ < 3; t_++) g_[t_][i_] = (T)kt_adamw_g[t_][i_];                                         \
        }                                                                                                              \
        for (int t_ = 0; t_ < 3; t_++) {                                                                               \
            update(p_, g_[t_], m_, v_, 6, 0.01, 0.9, 0.999, 1e-3, 0.1, t_ + 1);                                        \
            CU_ASSERT_EQUAL(count_far(name " p", p_, kt_adamw_want_p[t_], 6, rtol_p, atol_p), 0);                      \
        }                                                                                                              \
        CU_ASSERT_EQUAL(count_far(name " m", m_, kt_adamw_want_m, 6, rtol_mv, 0), 0);                                  \
        CU_ASSERT_EQUAL(count_far(name " v", v_, kt_adamw_want_v, 6, rtol_mv, 0), 0);                                 \
    } while (0)

#endif
