/*
 * cpu_accel_seq.c — the cpu accelerator's ABI 1.4 sequence entries other
 * than attention (embedding forward/backward, layer norm forward/backward,
 * the fused cross-entropy, add): thin wrappers over the kc_* kernels of
 * kernels/cpu/cpu_seq.h. As in cpu_accel.c, the wrappers do what the
 * kernels leave out: a dtype other than float32/float64, a negative size, a
 * NULL buffer that would be touched, a size past the address space or a
 * forbidden overlap is KILN_E_INVALID_ARG naming the entry; a token or a
 * target outside its range is KILN_E_DATA naming the index, the value and
 * the valid range, found by a scan before anything is written (the kernels
 * would index out of bounds). The two backward passes that need scratch (the
 * embedding's counting sort, the layer norm's dw/db partials) take it from
 * the instance's grow-only workspace. Compiled against the frozen 1.2 and
 * 1.3 headers for the test fixtures too, where the body is left out.
 */
#include "cpu_accel.h"

#if KILN_ABI_MINOR >= 4

#include <math.h>

#include "cpu_kernels.h"
#include "cpu_seq.h"

/* *out = a * b * c elements, refused when the bytes of it in float64 would
 * not fit in a size_t (so every later `elements * size` is exact). */
static int32_t cpu_seq_elems(kiln_instance *acc, const char *fn, size_t a, size_t b, size_t c, size_t *out) {
    size_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc) || abc > SIZE_MAX / 8)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: %zu x %zu x %zu elements is larger than the address space", fn,
                       a, b, c);
    *out = abc;
    return KILN_OK;
}

/* Overlap of two buffers, either of which may be absent (NULL or empty). */
static int cpu_seq_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    return a && b && a_bytes && b_bytes && cpu_ranges_overlap(a, a_bytes, b, b_bytes);
}

#define CPU_NO_OVERLAP(acc, fn, p, pbytes, q, qbytes)                                                             \
    do {                                                                                                        \
        if (cpu_seq_overlap(p, pbytes, q, qbytes))                                                              \
            return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: " #p " overlaps " #q, fn);                              \
    } while (0)

/* tokens(B*T) all in [0, V), else KILN_E_DATA naming the first bad one. */
static int32_t cpu_check_tokens(kiln_instance *acc, const char *fn, const int32_t *tokens, int32_t B, int32_t T,
                                int32_t V) {
    const size_t n = (size_t)B * (size_t)T;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return CPU_ERR(acc, KILN_E_DATA,
                           "%s: token %d at index %zu (batch %zu, position %zu) is outside [0, %d) (vocabulary "
                           "size V=%d)",
                           fn, (int)tokens[i], i, i / (size_t)T, i % (size_t)T, (int)V, (int)V);
    return KILN_OK;
}

/* ------------------------------------------------------------- embedding */

int32_t cpu_embedding_forward(kiln_instance *acc, uint32_t dtype, void *out, const int32_t *tokens, const void *wte,
                              const void *wpe, int32_t B, int32_t T, int32_t C, int32_t V) {
    const char *fn = "embedding_forward";
    int32_t rc = cpu_check_dtype(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (B < 0 || T < 0 || C < 0 || V < 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: B, T, C, V must be >= 0, got %d, %d, %d, %d", fn, (int)B,
                       (int)T, (int)C, (int)V);
    size_t nout = 0, nwte = 0, nwpe = 0;
    if ((rc = cpu_seq_elems(acc, fn, (size_t)B, (size_t)T, (size_t)C, &nout)) != KILN_OK ||
        (rc = cpu_seq_elems(acc, fn, (size_t)V, (size_t)C, 1, &nwte)) != KILN_OK ||
        (rc = cpu_seq_elems(acc, fn, (size_t)T, (size_t)C, 1, &nwpe)) != KILN_OK)
        return rc;
    const size_t n = (size_t)B * (size_t)T, esz = kiln_dtype_size(dtype);
    CPU_NEED(acc, tokens, n, "embedding_forward");
    CPU_NEED(acc, out, nout, "embedding_forward");
    CPU_NEED(acc, wte, nout, "embedding_forward");
    if (nout == 0) return cpu_check_tokens(acc, fn, tokens, B, T, V);
    CPU_NO_OVERLAP(acc, fn, out, nout * esz, wte, nwte * esz);
    CPU_NO_OVERLAP(acc, fn, out, nout * esz, wpe, nwpe * esz);
    CPU_NO_OVERLAP(acc, fn, out, nout * esz, tokens, n * sizeof *tokens);
    if ((rc = cpu_check_tokens(acc, fn, tokens, B, T, V)) != KILN_OK) return rc;
    if (dtype == KILN_DTYPE_F32) kc_embedding_forward(out, tokens, wte, wpe, B, T, C);
    else kc_embedding_forward_f64(out, tokens, wte, wpe, B, T, C);
    return KILN_OK;
}

int32_t cpu_embedding_backward(kiln_instance *acc, uint32_t dtype, void *dwte, void *dwpe, const void *dout,
                               const int32_t *tokens, int32_t B, int32_t T, int32_t C, int32_t V) {
    const char *fn = "embedding_backward";
    int32_t rc = cpu_check_dtype(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (B < 0 || T < 0 || C < 0 || V < 0)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: B, T, C, V must be >= 0, got %d, %d, %d, %d", fn, (int)B,
                       (int)T, (int)C, (int)V);
    size_t ndout = 0, nwte = 0, nwpe = 0;
    if ((rc = cpu_seq_elems(acc, fn, (size_t)B, (size_t)T, (size_t)C, &ndout)) != KILN_OK ||
        (rc = cpu_seq_elems(acc, fn, (size_t)V, (size_t)C, 1, &nwte)) != KILN_OK ||
        (rc = cpu_seq_elems(acc, fn, (size_t)T, (size_t)C, 1, &nwpe)) != KILN_OK)
        return rc;
    if (!dwte && !dwpe) return KILN_OK; /* both tables frozen */
    const size_t n = (size_t)B * (size_t)T, esz = kiln_dtype_size(dtype);
    CPU_NEED(acc, dout, ndout, "embedding_backward");
    if (dwte) CPU_NEED(acc, tokens, n, "embedding_backward");
    /* the sort's offsets are int32 */
    if (dwte && n > (size_t)INT32_MAX)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: B*T = %zu positions is above %d", fn, n, (int)INT32_MAX);
    if (ndout == 0) return dwte ? cpu_check_tokens(acc, fn, tokens, B, T, V) : KILN_OK;
    CPU_NO_OVERLAP(acc, fn, dwte, nwte * esz, dout, ndout * esz);
    CPU_NO_OVERLAP(acc, fn, dwpe, nwpe * esz, dout, ndout * esz);
    CPU_NO_OVERLAP(acc, fn, dwte, nwte * esz, dwpe, nwpe * esz);
    if (tokens) {
        CPU_NO_OVERLAP(acc, fn, dwte, nwte * esz, tokens, n * sizeof *tokens);
        CPU_NO_OVERLAP(acc, fn, dwpe, nwpe * esz, tokens, n * sizeof *tokens);
    }
    if (dwte && (rc = cpu_check_tokens(acc, fn, tokens, B, T, V)) != KILN_OK) return rc;
    const size_t ws = kc_embedding_backward_workspace(B, T, V, dwte != NULL);
    if (ws && (rc = cpu_reserve_workspace(acc, ws)) != KILN_OK) return rc;
    if (dtype == KILN_DTYPE_F32) kc_embedding_backward(dwte, dwpe, dout, tokens, B, T, C, V, acc->ws);
    else kc_embedding_backward_f64(dwte, dwpe, dout, tokens, B, T, C, V, acc->ws);
    return KILN_OK;
}

/* ------------------------------------------------------------ layer norm */

int32_t cpu_layernorm_forward(kiln_instance *acc, uint32_t dtype, void *y, void *mean, void *rstd, const void *x,
                              const void *w, const void *b, int32_t N, int32_t C, double eps, uint32_t round_dtype) {
    const char *fn = "layernorm_forward";
    int32_t rc = cpu_check_dtype(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    /* round_dtype as linear_forward takes it: float32 is "none"; the 16-bit
     * formats round float32 data; float64 data accepts float64 (none) too */
    const int r16 = round_dtype == KILN_DTYPE_F16 || round_dtype == KILN_DTYPE_BF16;
    if (!(round_dtype == KILN_DTYPE_F32 || (dtype == KILN_DTYPE_F32 && r16) ||
          (dtype == KILN_DTYPE_F64 && round_dtype == KILN_DTYPE_F64)))
        return CPU_ERR(acc, KILN_E_INVALID_ARG,
                       "%s: round_dtype must be float32 (none)%s for dtype %s, got " CPU_DT_FMT, fn,
                       dtype == KILN_DTYPE_F32 ? ", float16 or bfloat16" : " or float64", kiln_dtype_name(dtype),
                       CPU_DT_ARG(round_dtype));
    if (N < 0 || C < 0 || (N > 0 && C == 0))
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: N must be >= 0 and C >= 1, got N=%d C=%d", fn, (int)N, (int)C);
    if (!(eps >= 0.0))
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: eps must be >= 0, got %g", fn, eps);
    size_t nx = 0;
    if ((rc = cpu_seq_elems(acc, fn, (size_t)N, (size_t)C, 1, &nx)) != KILN_OK) return rc;
    if (nx == 0) return KILN_OK;
    CPU_NEED(acc, y, nx, "layernorm_forward");
    CPU_NEED(acc, x, nx, "layernorm_forward");
    CPU_NEED(acc, mean, (size_t)N, "layernorm_forward");
    CPU_NEED(acc, rstd, (size_t)N, "layernorm_forward");
    const size_t esz = kiln_dtype_size(dtype), xb = nx * esz, rb = (size_t)N * esz, cb = (size_t)C * esz;
    CPU_NO_OVERLAP(acc, fn, y, xb, x, xb);
    CPU_NO_OVERLAP(acc, fn, y, xb, w, cb);
    CPU_NO_OVERLAP(acc, fn, y, xb, b, cb);
    CPU_NO_OVERLAP(acc, fn, mean, rb, rstd, rb);
    CPU_NO_OVERLAP(acc, fn, mean, rb, y, xb);
    CPU_NO_OVERLAP(acc, fn, mean, rb, x, xb);
    CPU_NO_OVERLAP(acc, fn, rstd, rb, y, xb);
    CPU_NO_OVERLAP(acc, fn, rstd, rb, x, xb);
    if (dtype == KILN_DTYPE_F32)
        kc_layernorm_forward(y, mean, rstd, x, w, b, N, C, eps, r16 ? (int)round_dtype : KC_F32);
    else
        kc_layernorm_forward_f64(y, mean, rstd, x, w, b, N, C, eps);
    return KILN_OK;
}

/* The contract forbids only dx over dy; dx over the other inputs (x, w, mean,
 * rstd) or dw/db over anything would have a row's output overwrite what a
 * later element or row still reads, so those are refused too. */
int32_t cpu_layernorm_backward(kiln_instance *acc, uint32_t dtype, void *dx, void *dw, void *db, const void *dy,
                               const void *x, const void *w, const void *mean, const void *rstd, int32_t N, int32_t C,
                               int32_t accumulate) {
    const char *fn = "layernorm_backward";
    int32_t rc = cpu_check_dtype(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (N < 0 || C < 0 || (N > 0 && C == 0))
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: N must be >= 0 and C >= 1, got N=%d C=%d", fn, (int)N, (int)C);
    size_t nx = 0;
    if ((rc = cpu_seq_elems(acc, fn, (size_t)N, (size_t)C, 1, &nx)) != KILN_OK) return rc;
    if (nx == 0) return KILN_OK;
    CPU_NEED(acc, dx, nx, "layernorm_backward");
    CPU_NEED(acc, dy, nx, "layernorm_backward");
    CPU_NEED(acc, x, nx, "layernorm_backward");
    CPU_NEED(acc, mean, (size_t)N, "layernorm_backward");
    CPU_NEED(acc, rstd, (size_t)N, "layernorm_backward");
    const size_t esz = kiln_dtype_size(dtype), xb = nx * esz, rb = (size_t)N * esz, cb = (size_t)C * esz;
    CPU_NO_OVERLAP(acc, fn, dx, xb, dy, xb);
    CPU_NO_OVERLAP(acc, fn, dx, xb, x, xb);
    CPU_NO_OVERLAP(acc, fn, dx, xb, w, cb);
    CPU_NO_OVERLAP(acc, fn, dx, xb, mean, rb);
    CPU_NO_OVERLAP(acc, fn, dx, xb, rstd, rb);
    CPU_NO_OVERLAP(acc, fn, dw, cb, db, cb);
    const void *outs[3] = {dx, dw, db};
    const size_t out_bytes[3] = {xb, cb, cb};
    static const char *const in_names[5] = {"dy", "x", "w", "mean", "rstd"};
    const void *ins[5] = {dy, x, w, mean, rstd};
    const size_t in_bytes[5] = {xb, xb, cb, rb, rb};
    for (int o = 1; o < 3; o++) {
        if (cpu_seq_overlap(outs[o], out_bytes[o], dx, xb))
            return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: %s overlaps dx", fn, o == 1 ? "dw" : "db");
        for (int i = 0; i < 5; i++)
            if (cpu_seq_overlap(outs[o], out_bytes[o], ins[i], in_bytes[i]))
                return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: %s overlaps the input %s", fn, o == 1 ? "dw" : "db",
                               in_names[i]);
    }
    const size_t ws = kc_layernorm_backward_workspace(N, C, dw != NULL, db != NULL);
    if (ws && (rc = cpu_reserve_workspace(acc, ws)) != KILN_OK) return rc;
    if (dtype == KILN_DTYPE_F32)
        kc_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate != 0, acc->ws);
    else
        kc_layernorm_backward_f64(dx, dw, db, dy, x, w, mean, rstd, N, C, accumulate != 0, acc->ws);
    return KILN_OK;
}

/* --------------------------------------------------- fused cross-entropy */

int32_t cpu_xent_fused(kiln_instance *acc, uint32_t dtype, void *logits, const int32_t *targets, int32_t N, int32_t V,
                       int32_t Vp, double grad_scale, double *loss_sum) {
    const char *fn = "xent_fused";
    int32_t rc = cpu_check_dtype(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (N < 0 || V < 1 || Vp < V)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: need N >= 0, V >= 1 and Vp >= V, got N=%d V=%d Vp=%d", fn,
                       (int)N, (int)V, (int)Vp);
    if (!loss_sum) return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: loss_sum is NULL", fn);
    size_t nl = 0;
    if ((rc = cpu_seq_elems(acc, fn, (size_t)N, (size_t)Vp, 1, &nl)) != KILN_OK) return rc;
    CPU_NEED(acc, logits, nl, "xent_fused");
    CPU_NEED(acc, targets, (size_t)N, "xent_fused");
    const size_t esz = kiln_dtype_size(dtype);
    CPU_NO_OVERLAP(acc, fn, logits, nl * esz, targets, (size_t)N * sizeof *targets);
    CPU_NO_OVERLAP(acc, fn, logits, nl * esz, loss_sum, sizeof *loss_sum);
    for (int32_t i = 0; i < N; i++)
        if (targets[i] < -1 || targets[i] >= V)
            return CPU_ERR(acc, KILN_E_DATA, "%s: target %d at row %d is outside [-1, %d) (-1 ignores the row; V=%d)",
                           fn, (int)targets[i], (int)i, (int)V, (int)V);
    *loss_sum = dtype == KILN_DTYPE_F32 ? kc_xent_fused(logits, targets, N, V, Vp, grad_scale)
                                        : kc_xent_fused_f64(logits, targets, N, V, Vp, grad_scale);
    return KILN_OK;
}

/* ------------------------------------------------------------------- add */

int32_t cpu_add(kiln_instance *acc, uint32_t dtype, void *y, const void *a, const void *b, size_t n) {
    const char *fn = "add";
    int32_t rc = cpu_check_dtype(acc, fn, dtype);
    if (rc != KILN_OK) return rc;
    if (n > SIZE_MAX / 8)
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: n=%zu elements is larger than the address space", fn, n);
    CPU_NEED(acc, y, n, "add");
    CPU_NEED(acc, a, n, "add");
    CPU_NEED(acc, b, n, "add");
    if (n == 0) return KILN_OK;
    /* y == a or y == b is the in-place residual add; a shifted overlap would
     * overwrite inputs not yet read */
    const size_t nb = n * kiln_dtype_size(dtype);
    if (y != a && cpu_ranges_overlap(y, nb, a, nb))
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: y partially overlaps a (only y == a may alias)", fn);
    if (y != b && cpu_ranges_overlap(y, nb, b, nb))
        return CPU_ERR(acc, KILN_E_INVALID_ARG, "%s: y partially overlaps b (only y == b may alias)", fn);
    if (dtype == KILN_DTYPE_F32) kc_add(y, a, b, n);
    else kc_add_f64(y, a, b, n);
    return KILN_OK;
}

#endif /* KILN_ABI_MINOR >= 4 */
