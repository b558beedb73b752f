/*
 * fp8sim_scale.h — the per-tensor scaling of the fp8-sim precision, with no
 * kiln dependency so the unit test checks it directly: the largest
 * magnitude (amax) of a tensor picks a power of two that brings amax just
 * below the FP8 format's largest value, the tensor is multiplied by it,
 * rounded through FP8, and divided by it again. A power of two keeps both
 * multiplications exact (away from float's own limits), so the only error
 * is FP8's rounding — as with a real FP8 GEMM whose inputs carry a scale.
 */
#ifndef FP8SIM_SCALE_H
#define FP8SIM_SCALE_H

#include <math.h>

/* 2^(floor(log2(fmax / amax)) - margin): amax * scale <= fmax, and above
 * fmax / 2 when margin is 0. 1 for amax 0 or not finite (nothing to
 * scale: zeros stay zeros, inf/NaN are left to the format's rules), and
 * limited to 2^-100 .. 2^100. */
static inline double fp8sim_scale(double amax, double fmax, int margin) {
    if (!(amax > 0.0) || !isfinite(amax)) return 1.0;
    int e = (int)floor(log2(fmax / amax)) - margin;
    if (ldexp(amax, e + margin) > fmax) e--; /* log2's rounding at an exact power of two */
    if (e > 100) e = 100;
    if (e < -100) e = -100;
    return ldexp(1.0, e);
}

#endif /* FP8SIM_SCALE_H */
