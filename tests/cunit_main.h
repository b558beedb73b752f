/*
 * The one CUnit runner every kiln test executable uses. A test file defines
 * `static void register_tests(void)` (adding its suites, as a rule from
 * CUnit's own tables: CU_TestInfo per suite, CU_SuiteInfo, then
 * CU_register_suites), then includes this header once, which supplies
 * main(). main() reads the failure counts *before*
 * CU_cleanup_registry() (which zeroes them) and exits non-zero on any failed
 * test or suite; CU_get_error() alone reports framework errors only, so a
 * runner returning it would let CI pass with failing tests. A file that
 * includes cunit_skip.h first exits 77 (skipped) when a case was skipped
 * and none failed.
 */
#ifndef KILN_TESTS_CUNIT_MAIN_H
#define KILN_TESTS_CUNIT_MAIN_H

#include <CUnit/Basic.h>
#include <stdio.h>

static void register_tests(void);

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) {
        fprintf(stderr, "CUnit: cannot initialise the registry: %s\n", CU_get_error_msg());
        return 2;
    }
    register_tests();
    if (CU_get_error() != CUE_SUCCESS) {
        fprintf(stderr, "CUnit: cannot register tests: %s\n", CU_get_error_msg());
        CU_cleanup_registry();
        return 2;
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_suites_failed();
    unsigned ran = CU_get_number_of_tests_run();
    int err = CU_get_error();
    CU_cleanup_registry();
    if (failed) return 1;
    if (err) return 2;
    if (ran == 0) { fprintf(stderr, "CUnit: no test ran\n"); return 3; }
#ifdef KILN_TESTS_CUNIT_SKIP_H
    if (cunit_skipped_cases) return 77;
#endif
    return 0;
}

#endif
