/*
 * cpu_fp8.c: round_to through the two OCP FP8 formats (E4M3, E5M2) on
 * float32 data, in place, for simulated FP8 training on a CPU that has no
 * FP8 arithmetic. The conversions are kernels/common/km_fp8.h's integer
 * code, shared with the cuda kernels, so both accelerators keep the same
 * bits; the rounding and saturation rules are stated there. Split across
 * the pool like the other element loops (each element is independent).
 */
#include "cpu_internal.h"
#include "cpu_kernels.h"

#include "../common/km_fp8.h"

static void kc_round_e4m3_range(void *vc, size_t i0, size_t i1) {
    float *x = vc;
    for (size_t i = i0; i < i1; i++) x[i] = km_round_f8e4m3(x[i]);
}

static void kc_round_e5m2_range(void *vc, size_t i0, size_t i1) {
    float *x = vc;
    for (size_t i = i0; i < i1; i++) x[i] = km_round_f8e5m2(x[i]);
}

int kc_round_fp8(float *x, int dtype, size_t n) {
    if (dtype != KC_F8E4M3 && dtype != KC_F8E5M2) return -1;
    if (n == 0) return 0;
    kc_parallel_for(n, KC_GRAIN_STREAM, KC_ALIGN_FLOATS, dtype == KC_F8E4M3 ? kc_round_e4m3_range : kc_round_e5m2_range,
                    x);
    return 0;
}

uint8_t kc_f8e4m3_bits(float x) { return km_f8e4m3_bits(x); }
uint8_t kc_f8e5m2_bits(float x) { return km_f8e5m2_bits(x); }
float kc_f8e4m3_value(uint8_t c) { return km_f8e4m3_value(c); }
float kc_f8e5m2_value(uint8_t c) { return km_f8e5m2_value(c); }
