/*
 * The one CUnit runner every kiln test executable uses. A test file defines
 * `static void register_tests(void)` (adding its suites, as a rule from
 * CUnit's own tables: CU_TestInfo per suite, CU_SuiteInfo, then
 * CU_register_suites), then includes this header once, which supplies
 * main(). main() is the SDK's kiln_testing_run_cunit (kiln/testing_cunit.h):
 * it reads the failure counts *before* CU_cleanup_registry() (which zeroes
 * them) and exits non-zero on any failed test or suite; CU_get_error()
 * alone reports framework errors only, so a runner returning it would let
 * CI pass with failing tests. A file that
 * includes cunit_skip.h first exits 77 (skipped) when a case was skipped
 * and none failed.
 */
#ifndef KILN_TESTS_CUNIT_MAIN_H
#define KILN_TESTS_CUNIT_MAIN_H

#include <kiln/testing_cunit.h>

static void register_tests(void);

/* The SDK's runner (the one the example plugins' tests use), plus the
 * skipped-case rule of kiln's own suites. */
int main(void) {
    int rc = kiln_testing_run_cunit(register_tests);
#ifdef KILN_TESTS_CUNIT_SKIP_H
    if (rc == 0 && cunit_skipped_cases) return 77;
#endif
    return rc;
}
#endif
