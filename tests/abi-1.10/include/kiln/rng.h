/*
 * kiln/rng.h — header-only, platform-independent pseudo-random numbers for
 * plugins that must reproduce bit for bit on every libc (weight init,
 * shuffling, noise): splitmix64, which also expands a 64-bit seed into the
 * state of xoshiro256** (the seeding its authors recommend), and uniform
 * floats from the top 24 bits, so every value in [0, 1) is exact. Not part
 * of the binary ABI; no dependency beyond <stdint.h>.
 */
#ifndef KILN_RNG_H
#define KILN_RNG_H

#include <stdint.h>

typedef struct kiln_rng {
    uint64_t s[4]; /* xoshiro256** state, never all zero */
} kiln_rng;

/* The next splitmix64 output; advances *state. */
static inline uint64_t kiln_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* State from four splitmix64 outputs of `seed`. */
static inline void kiln_rng_seed(kiln_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = kiln_splitmix64(&x);
}

static inline uint64_t kiln__rotl(uint64_t v, int k) { return (v << k) | (v >> (64 - k)); }

/* xoshiro256** */
static inline uint64_t kiln_rng_next(kiln_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = kiln__rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = kiln__rotl(s[3], 45);
    return result;
}

/* Uniform in [lo, hi) from the top 24 bits. */
static inline float kiln_rng_uniformf(kiln_rng *r, float lo, float hi) {
    float u = (float)(kiln_rng_next(r) >> 40) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
}

#endif /* KILN_RNG_H */
