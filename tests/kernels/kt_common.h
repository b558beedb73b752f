/*
 * kt_common.h — what the three files of test_kernels_cpu (test_kernels_cpu.c,
 * test_kernels_ex.c, test_kernels_act.c) all need besides the kernels: an
 * allocation that fails the case when it cannot be had, and the closeness
 * test their tolerances are written for. Their inputs come from
 * tests/support/test_rng.h, each file with its own state.
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

#endif
