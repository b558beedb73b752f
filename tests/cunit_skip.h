/*
 * For a CUnit test file with a case that needs something the machine may
 * lack (a Debian data set): include this before the cases, call
 * cunit_skip_case() from the case instead of passing silently, and the
 * runner (cunit_main.h) exits 77 when nothing failed, which CTest reports
 * as skipped (SKIP_RETURN_CODE 77), as the shell tests do.
 */
#ifndef KILN_TESTS_CUNIT_SKIP_H
#define KILN_TESTS_CUNIT_SKIP_H

#include <stdio.h>

static int cunit_skipped_cases;

/* Say why the case does not run; the executable then exits 77. */
static inline void cunit_skip_case(const char *why) {
    fprintf(stderr, "\n  skipped: %s\n", why);
    cunit_skipped_cases++;
}

#endif
