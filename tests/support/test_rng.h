/*
 * tests/support/test_rng.h — the xorshift64* generator the numeric suites
 * draw their inputs from: the same sequence on every machine, so a failure
 * reproduces and a digest or a tolerance holds everywhere. Header-only (a
 * suite that links nothing else from tests/support includes it as well);
 * each suite keeps its own state and seeds.
 */
#ifndef KILN_TESTS_TEST_RNG_H
#define KILN_TESTS_TEST_RNG_H

#include <stdint.h>

typedef struct test_rng {
    uint64_t s;
} test_rng;

/* A zero seed would stay zero forever: it becomes 1. */
static inline void test_rng_seed(test_rng *r, uint64_t seed) { r->s = seed ? seed : 1; }

static inline uint64_t test_rng_next(test_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [0, 1), from the top 53 bits. */
static inline double test_rng_unit(test_rng *r) {
    return (double)(test_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
