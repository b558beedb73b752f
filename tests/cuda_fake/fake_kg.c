/*
 * fake_kg.c — the launchers of kernels/cuda/kg_kernels.h, run on the host
 * for the fake CUDA build of the cuda accelerator plugin. Each one does
 * what its CUDA counterpart does before launching (the same argument checks
 * and cudaErrorInvalidValue answers, the same "nothing to do" cases), then
 * checks that every buffer it would touch lies inside device memory of the
 * current device (the plugin's scratch arithmetic is what this catches),
 * drains the stream's queued work (a kernel runs after what was queued
 * before it) and computes the result with the CPU reference kernels kc_*
 * of kernels/cpu, which define what the CUDA kernels compute, or with plain
 * loops where kg_kernels.h specifies a contract of its own: the per-row
 * softmax outputs and bad_row, kg_reduce_rows' block order, kg_reduce's
 * partials, kg_unscale_check's list, kg_round_add, and the optimizers' optional
 * compute-dtype copy. kg_ew (the 1.5 elementwise entries) runs kc_ew, whose
 * formulas the CUDA kernel shares (kernels/common/km_ew.h). Overlaps the CUDA kernels do not allow are reported
 * as contract violations. The launchers that take ABI 1.7's 16-bit
 * activation storage (here and in fake_kg_seq.c) compute it as kg_kernels.h
 * defines it: the 16-bit inputs widened to float32, the float32 reference
 * kernel, the 16-bit outputs rounded to nearest even (fake_widen16,
 * fake_store16).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "fake_internal.h"
#include "kg_kernels.h"

_Static_assert((int)KG_EW_LERP == (int)KC_EW_LERP && (int)KG_EW_SIGN == (int)KC_EW_SIGN &&
                   (int)KG_EW_MUL == (int)KC_EW_MUL && (int)KG_EW_ADDCMUL == (int)KC_EW_ADDCMUL &&
                   (int)KG_EW_ADDCDIV == (int)KC_EW_ADDCDIV && (int)KG_EW_SQRT == (int)KC_EW_SQRT &&
                   (int)KG_EW_CLAMP == (int)KC_EW_CLAMP,
               "kg_ew and kc_ew op numbers");

/* ------------------------------------------------------------- helpers */

static size_t fake_dt_size(int dt) {
    switch (dt) {
    case KG_F32: return 4;
    case KG_F64: return 8;
    case KG_F16:
    case KG_BF16: return 2;
    default: return 0;
    }
}

static int fake_fdt(int dt) { return dt == KG_F32 || dt == KG_F64; }

static double fake_value(int dt, const void *x, size_t i) {
    switch (dt) {
    case KG_F32: return ((const float *)x)[i];
    case KG_F64: return ((const double *)x)[i];
    case KG_F16: {
        float f;
        kc_f16_to_f32(&f, (const uint16_t *)x + i, 1);
        return f;
    }
    default: {
        float f;
        kc_bf16_to_f32(&f, (const uint16_t *)x + i, 1);
        return f;
    }
    }
}

/* ---------------------------------------------------------------- bias */

cudaError_t kg_bias_add(cudaStream_t s, int fdt, void *y, const void *b, int rows, int cols) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt) || rows < 0 || cols < 0) return fake_error(cudaErrorInvalidValue);
    if (rows == 0 || cols == 0) return cudaSuccess;
    const size_t esz = fake_dt_size(fdt);
    const fake_buf bufs[] = {{"y", y, (size_t)rows * (size_t)cols * esz}, {"b", b, (size_t)cols * esz}};
    cudaError_t e = fake_launch(__func__, s, bufs, 2);
    if (e != cudaSuccess) return e;
    if (fdt == KG_F32) kc_bias_add(y, b, rows, cols);
    else kc_bias_add_f64(y, b, rows, cols);
    return cudaSuccess;
}

/* kernels/cuda's two-pass column sum in its order (kg_kernels.h): each
 * part's lanes, the lanes left to right, then the parts left to right; the
 * partials go through `work` as on the GPU, so a workspace that is too
 * small or not device memory shows here. */
#define FAKE_BIAS_GRAD(T)                                                                                      \
    do {                                                                                                       \
        T *d = db, *w = work;                                                                                  \
        const T *g = dy;                                                                                       \
        for (size_t p = 0; p < parts; p++) {                                                                   \
            const size_t r0 = p * KG_BIAS_GRAD_ROWS;                                                           \
            const size_t r1 = r0 + KG_BIAS_GRAD_ROWS < (size_t)rows ? r0 + KG_BIAS_GRAD_ROWS : (size_t)rows;   \
            for (size_t j = 0; j < (size_t)cols; j++) {                                                        \
                T part = (T)0;                                                                                 \
                for (int l = 0; l < KG_BIAS_GRAD_LANES; l++) {                                                 \
                    T lane = (T)0;                                                                             \
                    for (size_t r = r0 + (size_t)l; r < r1; r += KG_BIAS_GRAD_LANES) lane = lane + g[r * cols + j]; \
                    part = l == 0 ? lane : part + lane;                                                        \
                }                                                                                              \
                if (parts == 1) d[j] = (accumulate ? d[j] : (T)0) + part;                                     \
                else w[p * cols + j] = part;                                                                   \
            }                                                                                                  \
        }                                                                                                      \
        if (parts > 1)                                                                                         \
            for (size_t j = 0; j < (size_t)cols; j++) {                                                        \
                T acc = accumulate ? d[j] : (T)0;                                                              \
                for (size_t p = 0; p < parts; p++) acc = acc + w[p * cols + j];                                \
                d[j] = acc;                                                                                    \
            }                                                                                                  \
    } while (0)

/* The sums of kg_bias_grad (and of 1.11's act_bias_backward over the dx it
 * stored), once its launch is checked. */
static cudaError_t fake_bias_grad_math(int fdt, void *db, const void *dy, int rows, int cols, int accumulate,
                                       void *work) {
    const size_t parts = kg_bias_grad_parts(rows);
    float *dy32 = NULL;
    if (fake_act16(fdt)) {
        if (!(dy32 = fake_widen16(fdt, dy, (size_t)rows * (size_t)cols))) return fake_error(cudaErrorMemoryAllocation);
        dy = dy32;
    }
    if (fdt != KG_F64) FAKE_BIAS_GRAD(float);
    else FAKE_BIAS_GRAD(double);
    free(dy32);
    return cudaSuccess;
}

cudaError_t kg_bias_grad(cudaStream_t s, int fdt, void *db, const void *dy, int rows, int cols, int accumulate,
                         void *work) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int d16 = fake_act16(fdt); /* 1.7: dy in 16 bits, db and work float32 */
    if ((!fake_fdt(fdt) && !d16) || rows < 0 || cols < 0) return fake_error(cudaErrorInvalidValue);
    if (cols == 0 || (rows == 0 && accumulate)) return cudaSuccess;
    const size_t esz = d16 ? sizeof(float) : fake_dt_size(fdt), desz = fake_dt_size(fdt);
    const size_t parts = kg_bias_grad_parts(rows);
    const size_t wb = kg_bias_grad_work_bytes(fdt, rows, cols);
    if (wb > 0 && !work) {
        fake_violation("%s: %d rows in %zu parts need a %zu-byte workspace; work is NULL", __func__, rows, parts, wb);
        return fake_error(cudaErrorInvalidValue);
    }
    const fake_buf bufs[] = {{"db", db, (size_t)cols * esz},
                             {"dy", dy, (size_t)rows * (size_t)cols * desz},
                             {"work", work, wb}};
    cudaError_t e = fake_launch(__func__, s, bufs, 3);
    if (e != cudaSuccess) return e;
    if (wb > 0 && (fake_overlap(__func__, "work", work, wb, "dy", dy, (size_t)rows * (size_t)cols * desz) ||
                   fake_overlap(__func__, "work", work, wb, "db", db, (size_t)cols * esz)))
        return fake_error(cudaErrorInvalidValue);
    fake_stats.kernels += parts > 1; /* the second pass */
    return fake_bias_grad_math(fdt, db, dy, rows, cols, accumulate, work);
}

/* --------------------------------------------------------- activations */

cudaError_t kg_act_forward(cudaStream_t s, int fdt, int act, void *y, const void *x, size_t n) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt) || act < KG_ACT_RELU || act > KG_ACT_LEAKY_RELU) return fake_error(cudaErrorInvalidValue);
    if (n == 0) return cudaSuccess;
    const size_t bytes = n * fake_dt_size(fdt);
    const fake_buf bufs[] = {{"y", y, bytes}, {"x", x, bytes}};
    cudaError_t e = fake_launch(__func__, s, bufs, 2);
    if (e != cudaSuccess) return e;
    if (y != x) fake_overlap(__func__, "y", y, bytes, "x", x, bytes);
    if (fdt == KG_F32) {
        switch (act) {
        case KG_ACT_RELU: kc_relu_forward(y, x, n); break;
        case KG_ACT_GELU: kc_gelu_forward(y, x, n); break;
        case KG_ACT_TANH: kc_tanh_forward(y, x, n); break;
        case KG_ACT_SIGMOID: kc_sigmoid_forward(y, x, n); break;
        default: kc_leaky_relu_forward(y, x, n); break;
        }
    } else {
        switch (act) {
        case KG_ACT_RELU: kc_relu_forward_f64(y, x, n); break;
        case KG_ACT_GELU: kc_gelu_forward_f64(y, x, n); break;
        case KG_ACT_TANH: kc_tanh_forward_f64(y, x, n); break;
        case KG_ACT_SIGMOID: kc_sigmoid_forward_f64(y, x, n); break;
        default: kc_leaky_relu_forward_f64(y, x, n); break;
        }
    }
    return cudaSuccess;
}

static void fake_act_bwd32(int act, float *dx, const float *dy, const float *x, size_t n) {
    switch (act) {
    case KG_ACT_RELU: kc_relu_backward(dx, dy, x, n); break;
    case KG_ACT_GELU: kc_gelu_backward(dx, dy, x, n); break;
    case KG_ACT_TANH: kc_tanh_backward(dx, dy, x, n); break;
    case KG_ACT_SIGMOID: kc_sigmoid_backward(dx, dy, x, n); break;
    default: kc_leaky_relu_backward(dx, dy, x, n); break;
    }
}

/* What kg_act_backward computes, once its launch is checked (and 1.11's
 * act_bias_backward before its sums). */
static cudaError_t fake_act_bwd_math(int fdt, int act, void *dx, const void *dy, const void *x, size_t n) {
    if (n == 0) return cudaSuccess;
    if (fake_act16(fdt)) {
        /* the float32 kernel on the widened values, dx rounded as stored */
        float *dy32 = fake_widen16(fdt, dy, n), *x32 = fake_widen16(fdt, x, n);
        if (!dy32 || !x32) {
            free(dy32), free(x32);
            return fake_error(cudaErrorMemoryAllocation);
        }
        fake_act_bwd32(act, dy32, dy32, x32, n);
        fake_store16(fdt, dx, dy32, n);
        free(dy32), free(x32);
        return cudaSuccess;
    }
    if (fdt == KG_F32) {
        fake_act_bwd32(act, dx, dy, x, n);
    } else {
        switch (act) {
        case KG_ACT_RELU: kc_relu_backward_f64(dx, dy, x, n); break;
        case KG_ACT_GELU: kc_gelu_backward_f64(dx, dy, x, n); break;
        case KG_ACT_TANH: kc_tanh_backward_f64(dx, dy, x, n); break;
        case KG_ACT_SIGMOID: kc_sigmoid_backward_f64(dx, dy, x, n); break;
        default: kc_leaky_relu_backward_f64(dx, dy, x, n); break;
        }
    }
    return cudaSuccess;
}

cudaError_t kg_act_backward(cudaStream_t s, int fdt, int act, void *dx, const void *dy, const void *x, size_t n) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int s16 = fake_act16(fdt); /* 1.7: dx, dy, x in 16 bits */
    if ((!fake_fdt(fdt) && !s16) || act < KG_ACT_RELU || act > KG_ACT_LEAKY_RELU)
        return fake_error(cudaErrorInvalidValue);
    if (n == 0) return cudaSuccess;
    const size_t bytes = n * fake_dt_size(fdt);
    const fake_buf bufs[] = {{"dx", dx, bytes}, {"dy", dy, bytes}, {"x", x, bytes}};
    cudaError_t e = fake_launch(__func__, s, bufs, 3);
    if (e != cudaSuccess) return e;
    if (dx != dy) fake_overlap(__func__, "dx", dx, bytes, "dy", dy, bytes);
    fake_overlap(__func__, "dx", dx, bytes, "x", x, bytes);
    return fake_act_bwd_math(fdt, act, dx, dy, x, n);
}

/* 1.11: one launch (and the bias sum's second pass where it has parts),
 * computing what kg_act_backward then kg_bias_grad compute. */
cudaError_t kg_act_bias_backward(cudaStream_t s, int fdt, int act, void *dx, void *db, const void *dy, const void *x,
                                 int rows, int cols, int accumulate, void *work) {
    FAKE_SCOPE();
    const int s16 = fake_act16(fdt);
    if ((!fake_fdt(fdt) && !s16) || act < KG_ACT_RELU || act > KG_ACT_LEAKY_RELU || rows < 0 || cols < 0)
        return fake_error(cudaErrorInvalidValue);
    if (!db) return kg_act_backward(s, fdt, act, dx, dy, x, (size_t)rows * (size_t)cols);
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (cols == 0 || (rows == 0 && accumulate)) return cudaSuccess;
    const size_t n = (size_t)rows * (size_t)cols, bytes = n * fake_dt_size(fdt),
                 dbb = (size_t)cols * (s16 ? sizeof(float) : fake_dt_size(fdt)),
                 wb = kg_bias_grad_work_bytes(fdt, rows, cols);
    if (wb > 0 && !work) {
        fake_violation("%s: %d rows need a %zu-byte workspace; work is NULL", __func__, rows, wb);
        return fake_error(cudaErrorInvalidValue);
    }
    const fake_buf bufs[] = {
        {"dx", dx, bytes}, {"db", db, dbb}, {"dy", dy, bytes}, {"x", x, bytes}, {"work", work, wb}};
    cudaError_t e = fake_launch(__func__, s, bufs, 5);
    if (e != cudaSuccess) return e;
    /* dx may be dy, and the two inputs (dy, x) may overlap; no other
     * pair of the five may share a byte */
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (!(i == 0 && j == 2 && dx == dy) && !(i == 2 && j == 3) &&
                fake_overlap(__func__, bufs[i].what, bufs[i].p, bufs[i].bytes, bufs[j].what, bufs[j].p, bufs[j].bytes))
                return fake_error(cudaErrorInvalidValue);
    fake_stats.kernels += kg_bias_grad_parts(rows) > 1; /* the second pass */
    if ((e = fake_act_bwd_math(fdt, act, dx, dy, x, n)) != cudaSuccess) return e;
    return fake_bias_grad_math(fdt, db, dx, rows, cols, accumulate, work);
}

/* ---------------------------------------------------------------- loss */

/* -log softmax(l)[y] for one float row, as kc_xent_row computes it (max
 * from l[0] with strict >, exp in float, sums and log in double), kept in
 * double: kc_softmax_xent_forward only returns the mean rounded to float. */
static double fake_row_loss_f32(const float *l, int C, int y) {
    float mx = l[0];
    for (int j = 1; j < C; j++)
        if (l[j] > mx) mx = l[j];
    double denom = 0.0;
    for (int j = 0; j < C; j++) denom += (double)expf(l[j] - mx);
    return log(denom) - ((double)l[y] - (double)mx);
}

cudaError_t kg_softmax_xent_forward(cudaStream_t s, int fdt, void *probs, const void *logits, const int32_t *labels,
                                    int B, int C, double *row_loss, int32_t *row_correct, int32_t *bad_row) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt) || B < 0 || C < 1) return fake_error(cudaErrorInvalidValue);
    if (B == 0) return cudaSuccess;
    const size_t bytes = (size_t)B * (size_t)C * fake_dt_size(fdt);
    const fake_buf bufs[] = {{"probs", probs, bytes},
                             {"logits", logits, bytes},
                             {"labels", labels, (size_t)B * sizeof(int32_t)},
                             {"row_loss", row_loss, (size_t)B * sizeof(double)},
                             {"row_correct", row_correct, (size_t)B * sizeof(int32_t)},
                             {"bad_row", bad_row, sizeof(int32_t)}};
    cudaError_t e = fake_launch(__func__, s, bufs, 6);
    if (e != cudaSuccess) return e;
    fake_overlap(__func__, "probs", probs, bytes, "logits", logits, bytes);
    for (int r = 0; r < B; r++) {
        const int32_t y = labels[r];
        const size_t off = (size_t)r * (size_t)C;
        int hit = 0;
        double loss;
        if (fdt == KG_F32) {
            (void)kc_softmax_xent_forward((float *)probs + off, (const float *)logits + off, &labels[r], 1, C, &hit);
            loss = y >= 0 && y < C ? fake_row_loss_f32((const float *)logits + off, C, y) : NAN;
        } else {
            /* one row: the mean is the row's loss, already in double */
            loss = kc_softmax_xent_forward_f64((double *)probs + off, (const double *)logits + off, &labels[r], 1, C,
                                               &hit);
        }
        if (y < 0 || y >= C) {
            row_loss[r] = NAN;
            row_correct[r] = 0;
            if (*bad_row < 0 || r < *bad_row) *bad_row = r;
        } else {
            row_loss[r] = loss;
            row_correct[r] = hit;
        }
    }
    return cudaSuccess;
}

cudaError_t kg_reduce_rows(cudaStream_t s, const double *row_loss, const int32_t *row_correct, int B, double *out) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (B < 0) return fake_error(cudaErrorInvalidValue);
    const fake_buf bufs[] = {{"row_loss", row_loss, (size_t)B * sizeof(double)},
                             {"row_correct", row_correct, (size_t)B * sizeof(int32_t)},
                             {"out", out, 2 * sizeof(double)}};
    cudaError_t e = fake_launch(__func__, s, bufs, 3);
    if (e != cudaSuccess) return e;
    if (B == 0) {
        out[0] = NAN;
        out[1] = 0.0;
        return cudaSuccess;
    }
    /* the CPU's order: blocks of ceil(B / 256) rows, each summed from 0.0,
     * then the block sums in block order */
    const int per = (B + 255) / 256;
    double total = 0.0;
    long long correct = 0;
    for (int r0 = 0; r0 < B; r0 += per) {
        double block = 0.0;
        const int r1 = r0 + per < B ? r0 + per : B;
        for (int r = r0; r < r1; r++) {
            block += row_loss[r];
            correct += row_correct[r];
        }
        total += block;
    }
    out[0] = total / (double)B;
    out[1] = (double)correct;
    return cudaSuccess;
}

cudaError_t kg_softmax_xent_backward(cudaStream_t s, int fdt, void *dlogits, const void *probs,
                                     const int32_t *labels, int B, int C, double dloss) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt) || B < 0 || C < 0) return fake_error(cudaErrorInvalidValue);
    if (B == 0 || C == 0) return cudaSuccess;
    const size_t bytes = (size_t)B * (size_t)C * fake_dt_size(fdt);
    const fake_buf bufs[] = {
        {"dlogits", dlogits, bytes}, {"probs", probs, bytes}, {"labels", labels, (size_t)B * sizeof(int32_t)}};
    cudaError_t e = fake_launch(__func__, s, bufs, 3);
    if (e != cudaSuccess) return e;
    if (dlogits != probs) fake_overlap(__func__, "dlogits", dlogits, bytes, "probs", probs, bytes);
    if (fdt == KG_F32) kc_softmax_xent_backward(dlogits, probs, labels, B, C, (float)dloss);
    else kc_softmax_xent_backward_f64(dlogits, probs, labels, B, C, dloss);
    return cudaSuccess;
}

/* ---------------------------------------------------------- reductions */

/* kg_reduce's arithmetic on one tensor: pass 1's KG_REDUCE_BLOCKS blocks
 * of 256 threads, grid-stride (element i belongs to block (i mod (blocks *
 * 256)) / 256), then pass 2 adding the partials. */
static void fake_reduce_one(int op, int dtype, const void *x, size_t n, double *partials, double *out) {
    const size_t threads = (size_t)KG_REDUCE_BLOCKS * 256;
    for (int b = 0; b < KG_REDUCE_BLOCKS; b++) partials[b] = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double v = fake_value(dtype, x, i);
        const double t = op == KG_SUM ? v : op == KG_SUMSQ ? v * v : (isfinite(v) ? 0.0 : 1.0);
        partials[(i % threads) / 256] += t;
    }
    double total = 0.0;
    for (int b = 0; b < KG_REDUCE_BLOCKS; b++) total += partials[b];
    *out = total;
}

cudaError_t kg_reduce(cudaStream_t s, int op, int dtype, const void *x, size_t n, double *partials, double *out) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (op != KG_SUM && op != KG_SUMSQ && op != KG_NONFINITE) return fake_error(cudaErrorInvalidValue);
    const size_t esz = fake_dt_size(dtype);
    if (esz == 0) return fake_error(cudaErrorInvalidValue);
    /* n == 0 still runs (fixed grid): the partials and *out become 0 */
    const fake_buf bufs[] = {{"x", x, n * esz},
                             {"partials", partials, KG_REDUCE_BLOCKS * sizeof(double)},
                             {"out", out, sizeof(double)}};
    cudaError_t e = fake_launch(__func__, s, bufs, 3);
    if (e != cudaSuccess) return e;
    fake_overlap(__func__, "partials", partials, KG_REDUCE_BLOCKS * sizeof(double), "out", out, sizeof(double));
    fake_reduce_one(op, dtype, x, n, partials, out);
    return cudaSuccess;
}

/* Each tensor as kg_reduce computes it (the same blocks), in "one" launch:
 * partials(count, KG_REDUCE_BLOCKS), out(count). */
cudaError_t kg_reduce_list(cudaStream_t s, int op, int dtype, const kg_list *list, double *partials, double *out) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (op != KG_SUM && op != KG_SUMSQ && op != KG_NONFINITE) return fake_error(cudaErrorInvalidValue);
    const size_t esz = fake_dt_size(dtype);
    if (esz == 0 || list->count < 0 || list->count > KG_LIST_MAX) return fake_error(cudaErrorInvalidValue);
    if (list->count == 0) return cudaSuccess;
    for (int t = 0; t < list->count; t++) {
        if (list->n[t] == 0) continue; /* never read */
        cudaError_t e = fake_need_device(__func__, "x[t]", list->x[t], list->n[t] * esz);
        if (e != cudaSuccess) return e;
    }
    const size_t pb = (size_t)list->count * KG_REDUCE_BLOCKS * sizeof(double), ob = (size_t)list->count * sizeof(double);
    const fake_buf bufs[] = {{"partials", partials, pb}, {"out", out, ob}};
    cudaError_t e = fake_launch(__func__, s, bufs, 2);
    if (e != cudaSuccess) return e;
    fake_overlap(__func__, "partials", partials, pb, "out", out, ob);
    for (int t = 0; t < list->count; t++)
        fake_reduce_one(op, dtype, list->x[t], list->n[t], partials + (size_t)t * KG_REDUCE_BLOCKS, out + t);
    return cudaSuccess;
}

/* -------------------------------------------------------------- BLAS-1 */

cudaError_t kg_scale(cudaStream_t s, int fdt, void *x, double a, size_t n) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const int is16 = fdt == KG_F16 || fdt == KG_BF16;
    if (!fake_fdt(fdt) && !is16) return fake_error(cudaErrorInvalidValue);
    if (n == 0) return cudaSuccess;
    const fake_buf bufs[] = {{"x", x, n * fake_dt_size(fdt)}};
    cudaError_t e = fake_launch(__func__, s, bufs, 1);
    if (e != cudaSuccess) return e;
    if (is16) { /* widened, scaled in float, rounded back: one element at a time */
        for (size_t i = 0; i < n; i++) {
            float v;
            kc_cast(&v, KC_F32, (uint16_t *)x + i, fdt, 1);
            v *= (float)a;
            kc_cast((uint16_t *)x + i, fdt, &v, KC_F32, 1);
        }
        return cudaSuccess;
    }
    if (fdt == KG_F32) kc_scale(x, (float)a, n);
    else kc_scale_f64(x, a, n);
    return cudaSuccess;
}

cudaError_t kg_axpy(cudaStream_t s, int fdt, void *y, double a, const void *x, size_t n) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt)) return fake_error(cudaErrorInvalidValue);
    if (n == 0) return cudaSuccess;
    const size_t bytes = n * fake_dt_size(fdt);
    const fake_buf bufs[] = {{"y", y, bytes}, {"x", x, bytes}};
    cudaError_t e = fake_launch(__func__, s, bufs, 2);
    if (e != cudaSuccess) return e;
    fake_overlap(__func__, "y", y, bytes, "x", x, bytes);
    if (fdt == KG_F32) kc_axpy(y, (float)a, x, n);
    else kc_axpy_f64(y, a, x, n);
    return cudaSuccess;
}

/* The 1.5 elementwise launcher: y may be a or b itself (the kernel reads
 * each element before writing it) but must not partly overlap them. */
cudaError_t kg_ew(cudaStream_t s, int op, int fdt, void *y, const void *a, const void *b, double s0, double s1,
                  size_t n) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt) || op < KG_EW_LERP || op > KG_EW_CLAMP) return fake_error(cudaErrorInvalidValue);
    if (n == 0) return cudaSuccess;
    const int binary = op == KG_EW_LERP || op == KG_EW_MUL || op == KG_EW_ADDCMUL || op == KG_EW_ADDCDIV;
    const size_t bytes = n * fake_dt_size(fdt);
    const fake_buf bufs[] = {{"y", y, bytes}, {"a", a, bytes}, {"b", b, bytes}};
    cudaError_t e = fake_launch(__func__, s, bufs, binary ? 3 : 2);
    if (e != cudaSuccess) return e;
    if (a != y) fake_overlap(__func__, "y", y, bytes, "a", a, bytes);
    if (binary && b != y) fake_overlap(__func__, "y", y, bytes, "b", b, bytes);
    /* KG_EW_* and KC_EW_* are the same numbers (kg_kernels.h) */
    kc_ew(op, fdt, y, a, binary ? b : NULL, s0, s1, n);
    return cudaSuccess;
}

cudaError_t kg_unscale_check(cudaStream_t s, int fdt, const kg_list *list, double a, int32_t *nonfinite) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt) || list->count < 0 || list->count > KG_LIST_MAX) return fake_error(cudaErrorInvalidValue);
    size_t most = 0;
    for (int t = 0; t < list->count; t++) most = list->n[t] > most ? list->n[t] : most;
    if (most == 0) return cudaSuccess;
    const size_t esz = fake_dt_size(fdt);
    for (int t = 0; t < list->count; t++) {
        if (list->n[t] == 0) continue;
        cudaError_t e = fake_need_device(__func__, "x[t]", list->x[t], list->n[t] * esz);
        if (e != cudaSuccess) return e;
    }
    const fake_buf bufs[] = {{"nonfinite", nonfinite, sizeof(int32_t)}};
    cudaError_t e = fake_launch(__func__, s, bufs, 1);
    if (e != cudaSuccess) return e;
    int bad = 0;
    for (int t = 0; t < list->count; t++) {
        const size_t n = list->n[t];
        if (fdt == KG_F32) {
            float *v = list->x[t];
            const float af = (float)a;
            for (size_t i = 0; i < n; i++) {
                v[i] = v[i] * af;
                bad |= !isfinite(v[i]);
            }
        } else {
            double *v = list->x[t];
            for (size_t i = 0; i < n; i++) {
                v[i] = v[i] * a;
                bad |= !isfinite(v[i]);
            }
        }
    }
    if (bad) *nonfinite = 1;
    return cudaSuccess;
}

/* ------------------------------------------------------ Linear epilogue */

typedef void (*fake_act32)(float *, const float *, size_t);
typedef void (*fake_act64)(double *, const double *, size_t);
static const fake_act32 fake_acts32[] = {kc_relu_forward, kc_gelu_forward, kc_tanh_forward, kc_sigmoid_forward,
                                         kc_leaky_relu_forward};
static const fake_act64 fake_acts64[] = {kc_relu_forward_f64, kc_gelu_forward_f64, kc_tanh_forward_f64,
                                         kc_sigmoid_forward_f64, kc_leaky_relu_forward_f64};

cudaError_t kg_linear_epilogue(cudaStream_t s, int fdt, void *y, const void *b, int rows, int cols, int act,
                               void *post, int round_dtype) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt) || act < -1 || act > KG_ACT_LEAKY_RELU || rows < 0 || cols < 0)
        return fake_error(cudaErrorInvalidValue);
    if (round_dtype != KG_F32 && !(fdt == KG_F32 && (round_dtype == KG_F16 || round_dtype == KG_BF16)))
        return fake_error(cudaErrorInvalidValue);
    const size_t n = (size_t)rows * (size_t)cols, esz = fake_dt_size(fdt);
    if (n == 0) return cudaSuccess;
    const fake_buf bufs[] = {{"y", y, n * esz}, {"b", b, b ? (size_t)cols * esz : 0}, {"post", post, act >= 0 ? n * esz : 0}};
    cudaError_t e = fake_launch(__func__, s, bufs, 3);
    if (e != cudaSuccess) return e;
    if (act >= 0) fake_overlap(__func__, "y", y, n * esz, "post", post, n * esz);
    if (fdt == KG_F32) {
        if (b) kc_bias_add(y, b, rows, cols);
        if (round_dtype == KG_F16) kc_round_f16(y, n);
        if (round_dtype == KG_BF16) kc_round_bf16(y, n);
        if (act < 0) return cudaSuccess;
        fake_acts32[act](post, y, n);
        if (round_dtype == KG_F16) kc_round_f16(post, n);
        if (round_dtype == KG_BF16) kc_round_bf16(post, n);
    } else {
        if (b) kc_bias_add_f64(y, b, rows, cols);
        if (act >= 0) fake_acts64[act](post, y, n);
    }
    return cudaSuccess;
}

/* 1.7's 16-bit form (kg_kernels.h): with src, y = sdt(src + b); without,
 * y holds the GEMM's rounded product and is only read. */
cudaError_t kg_linear_epilogue16(cudaStream_t s, int sdt, void *y, const float *src, const float *b, int rows,
                                 int cols, int act, void *post) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_act16(sdt) || act < -1 || act > KG_ACT_LEAKY_RELU || rows < 0 || cols < 0 || (!src && b))
        return fake_error(cudaErrorInvalidValue);
    const size_t n = (size_t)rows * (size_t)cols;
    if (n == 0 || (!src && act < 0)) return cudaSuccess;
    const fake_buf bufs[] = {{"y", y, n * 2},
                             {"src", src, src ? n * sizeof(float) : 0},
                             {"b", b, b ? (size_t)cols * sizeof(float) : 0},
                             {"post", post, act >= 0 ? n * 2 : 0}};
    cudaError_t e = fake_launch(__func__, s, bufs, 4);
    if (e != cudaSuccess) return e;
    if ((act >= 0 && fake_overlap(__func__, "y", y, n * 2, "post", post, n * 2)) ||
        (src && fake_overlap(__func__, "y", y, n * 2, "src", src, n * sizeof(float))))
        return fake_error(cudaErrorInvalidValue);
    float *v = malloc(n * sizeof *v);
    if (!v) return fake_error(cudaErrorMemoryAllocation);
    if (src) {
        memcpy(v, src, n * sizeof *v);
        if (b) kc_bias_add(v, b, rows, cols);
        fake_store16(sdt, y, v, n);
    }
    kc_cast(v, KG_F32, y, sdt, n); /* the rounded y, as the activation reads it */
    if (act >= 0) {
        float *p = malloc(n * sizeof *p);
        if (!p) {
            free(v);
            return fake_error(cudaErrorMemoryAllocation);
        }
        fake_acts32[act](p, v, n);
        fake_store16(sdt, post, p, n);
        free(p);
    }
    free(v);
    return cudaSuccess;
}

/* ----------------------------------------------------- casts, rounding */

cudaError_t kg_cast(cudaStream_t s, void *dst, int dst_dtype, const void *src, int src_dtype, size_t n) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    const size_t dsz = fake_dt_size(dst_dtype), ssz = fake_dt_size(src_dtype);
    if (dsz == 0 || ssz == 0) return fake_error(cudaErrorInvalidValue);
    if (n == 0) return cudaSuccess;
    if (dst_dtype == src_dtype && dst == src) return cudaSuccess;
    const fake_buf bufs[] = {{"dst", dst, n * dsz}, {"src", src, n * ssz}};
    cudaError_t e = fake_launch(__func__, s, bufs, 2);
    if (e != cudaSuccess) return e;
    if (fake_overlap(__func__, "dst", dst, n * dsz, "src", src, n * ssz)) return fake_error(cudaErrorInvalidValue);
    if (kc_cast(dst, dst_dtype, src, src_dtype, n) != 0) return fake_error(cudaErrorInvalidValue);
    return cudaSuccess;
}

cudaError_t kg_round_to(cudaStream_t s, float *x, int dtype, size_t n) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (dtype != KG_F32 && dtype != KG_F16 && dtype != KG_BF16 && dtype != KG_F8E4M3 && dtype != KG_F8E5M2)
        return fake_error(cudaErrorInvalidValue);
    if (dtype == KG_F32 || n == 0) return cudaSuccess;
    const fake_buf bufs[] = {{"x", x, n * sizeof(float)}};
    cudaError_t e = fake_launch(__func__, s, bufs, 1);
    if (e != cudaSuccess) return e;
    if (dtype == KG_F16) kc_round_f16(x, n);
    else if (dtype == KG_BF16) kc_round_bf16(x, n);
    else kc_round_fp8(x, dtype, n); /* KG_F8* are the KC_F8* numbers */
    return cudaSuccess;
}

cudaError_t kg_round_add(cudaStream_t s, float *c, int ldc, const void *p, int p_dtype, int rows, int cols,
                         int round_dtype, float beta) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (round_dtype != KG_F32 && round_dtype != KG_F16 && round_dtype != KG_BF16)
        return fake_error(cudaErrorInvalidValue);
    if (p_dtype != KG_F32 && p_dtype != round_dtype) return fake_error(cudaErrorInvalidValue);
    if (rows < 0 || cols < 0 || ldc < cols) return fake_error(cudaErrorInvalidValue);
    if (rows == 0 || cols == 0) return cudaSuccess;
    const size_t cspan = ((size_t)(rows - 1) * (size_t)ldc + (size_t)cols) * sizeof(float);
    const size_t pbytes = (size_t)rows * (size_t)cols * fake_dt_size(p_dtype);
    const fake_buf bufs[] = {{"c", c, cspan}, {"p", p, pbytes}};
    cudaError_t e = fake_launch(__func__, s, bufs, 2);
    if (e != cudaSuccess) return e;
    fake_overlap(__func__, "c", c, cspan, "p", p, pbytes);
    fake_stats.round_add_16bit += p_dtype != KG_F32;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            const size_t pi = (size_t)r * (size_t)cols + (size_t)j;
            float v;
            if (p_dtype == KG_F32) v = ((const float *)p)[pi]; /* rounded here */
            else kc_cast(&v, KC_F32, (const uint16_t *)p + pi, p_dtype, 1); /* rounded by the GEMM: widened */
            if (p_dtype == KG_F32 && round_dtype == KG_F16) kc_round_f16(&v, 1);
            else if (p_dtype == KG_F32 && round_dtype == KG_BF16) kc_round_bf16(&v, 1);
            float *ci = c + (size_t)r * (size_t)ldc + (size_t)j;
            /* c is not read when beta == 0 (it may hold NaN) */
            *ci = beta == 0.0f ? v : v + beta * *ci;
        }
    return cudaSuccess;
}

/* ---------------------------------------------------------- optimizers */

static int fake_compute_ok(const void *compute, int compute_dtype) {
    return !compute || fake_dt_size(compute_dtype) != 0;
}

cudaError_t kg_sgd_update(cudaStream_t s, int fdt, void *p, const void *g, void *momentum_buf, size_t n, double lr,
                          double momentum, double dampening, int nesterov, double weight_decay, int first_step,
                          void *compute, int compute_dtype) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt) || !fake_compute_ok(compute, compute_dtype)) return fake_error(cudaErrorInvalidValue);
    if (n == 0) return cudaSuccess;
    const int has_mom = fdt == KG_F32 ? (float)momentum != 0.0f : momentum != 0.0;
    /* momentum without a buffer would silently train plain SGD */
    if (has_mom && !momentum_buf) return fake_error(cudaErrorInvalidValue);
    const size_t bytes = n * fake_dt_size(fdt);
    const fake_buf bufs[] = {{"p", p, bytes},
                             {"g", g, bytes},
                             {"momentum_buf", momentum_buf, has_mom ? bytes : 0},
                             {"compute", compute, compute ? n * fake_dt_size(compute_dtype) : 0}};
    cudaError_t e = fake_launch(__func__, s, bufs, 4);
    if (e != cudaSuccess) return e;
    if (fdt == KG_F32)
        kc_sgd_update(p, g, has_mom ? momentum_buf : NULL, n, (float)lr, (float)momentum, (float)dampening, nesterov,
                      (float)weight_decay, first_step);
    else
        kc_sgd_update_f64(p, g, has_mom ? momentum_buf : NULL, n, lr, momentum, dampening, nesterov, weight_decay,
                          first_step);
    if (compute && kc_cast(compute, compute_dtype, p, fdt, n) != 0) return fake_error(cudaErrorInvalidValue);
    return cudaSuccess;
}

cudaError_t kg_adamw_update(cudaStream_t s, int fdt, void *p, const void *g, void *m, void *v, size_t n, double lr,
                            double beta1, double beta2, double eps, double weight_decay, int64_t step, void *compute,
                            int compute_dtype) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt) || !fake_compute_ok(compute, compute_dtype)) return fake_error(cudaErrorInvalidValue);
    if (n == 0) return cudaSuccess;
    const size_t bytes = n * fake_dt_size(fdt);
    const fake_buf bufs[] = {{"p", p, bytes},
                             {"g", g, bytes},
                             {"m", m, bytes},
                             {"v", v, bytes},
                             {"compute", compute, compute ? n * fake_dt_size(compute_dtype) : 0}};
    cudaError_t e = fake_launch(__func__, s, bufs, 5);
    if (e != cudaSuccess) return e;
    if (fdt == KG_F32) kc_adamw_update_d(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    else kc_adamw_update_f64(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    if (compute && kc_cast(compute, compute_dtype, p, fdt, n) != 0) return fake_error(cudaErrorInvalidValue);
    return cudaSuccess;
}

/* The 1.10 list: each tensor checked as device memory of its size, no two
 * of its 4 x count buffers overlapping (the kernel's threads would race),
 * then each updated as kg_adamw_update updates it. One launch, none when
 * every tensor is empty (the grid would have no blocks). The device-side
 * first[] and decay[] are the CUDA launcher's business and not filled. */
cudaError_t kg_adamw_update_list(cudaStream_t s, int fdt, kg_adamw_list *list, double lr, double beta1, double beta2,
                                 double eps, int64_t step) {
    FAKE_SCOPE();
    if (fake_inject(__func__)) return fake_error(cudaErrorLaunchOutOfResources);
    if (!fake_fdt(fdt) || list->count < 0 || list->count > KG_ADAMW_LIST_MAX) return fake_error(cudaErrorInvalidValue);
    const size_t esz = fake_dt_size(fdt);
    static const char *const names[4] = {"p[t]", "g[t]", "m[t]", "v[t]"};
    size_t total = 0;
    for (int t = 0; t < list->count; t++) {
        if (list->n[t] == 0) continue;
        total += list->n[t];
        const size_t b = list->n[t] * esz;
        const void *bufs[4] = {list->p[t], list->g[t], list->m[t], list->v[t]};
        for (int j = 0; j < 4; j++) {
            cudaError_t e = fake_need_device(__func__, names[j], bufs[j], b);
            if (e != cudaSuccess) return e;
        }
        for (int u = 0; u <= t; u++) {
            if (list->n[u] == 0) continue;
            const void *ub[4] = {list->p[u], list->g[u], list->m[u], list->v[u]};
            for (int j = 0; j < 4; j++)
                for (int k = u == t ? j + 1 : 0; k < 4; k++)
                    fake_overlap(__func__, names[j], bufs[j], b, names[k], ub[k], list->n[u] * esz);
        }
    }
    if (total == 0) return cudaSuccess;
    cudaError_t e = fake_launch(__func__, s, NULL, 0);
    if (e != cudaSuccess) return e;
    for (int t = 0; t < list->count; t++) {
        if (list->n[t] == 0) continue;
        if (fdt == KG_F32)
            kc_adamw_update_d(list->p[t], list->g[t], list->m[t], list->v[t], list->n[t], lr, beta1, beta2, eps,
                              list->weight_decay[t], step);
        else
            kc_adamw_update_f64(list->p[t], list->g[t], list->m[t], list->v[t], list->n[t], lr, beta1, beta2, eps,
                                list->weight_decay[t], step);
    }
    return cudaSuccess;
}
