/*
 * kiln/testing_cunit.h — the CUnit main() of a plugin's own tests, so each
 * test file registers its suites and leaves the running to one function
 * (kiln's example plugins do: examples/plugins/<name>/tests). Header only, in
 * the test's own executable: the test host library (kiln/testing.h,
 * Kiln::testing) itself does not depend on CUnit; the test links CUnit
 * (pkg-config cunit; kiln_add_plugin_test() in the SDK's CMake helpers
 * does both).
 *
 *   static void register_tests(void) {
 *       CU_pSuite s = CU_add_suite("mine", NULL, NULL);
 *       CU_add_test(s, "does the thing", test_thing);
 *   }
 *   int main(void) { return kiln_testing_run_cunit(register_tests); }
 *
 * The exit status tells a CI every way a run can go wrong: 0 when every
 * test passed, 1 when a test or a suite's init/cleanup failed, 2 when CUnit
 * itself failed (registry, registration), 3 when no test ran at all. The
 * counts are read before CU_cleanup_registry(), which zeroes them; a runner
 * returning CU_get_error() alone would pass with failing tests.
 *
 * Without the CUnit headers (they are optional for the SDK) the header
 * declares nothing, so it still compiles everywhere the SDK does.
 */
#ifndef KILN_TESTING_CUNIT_H
#define KILN_TESTING_CUNIT_H

#if defined(__has_include)
#if __has_include(<CUnit/Basic.h>)
#define KILN_TESTING_HAVE_CUNIT 1
#endif
#endif

#ifdef KILN_TESTING_HAVE_CUNIT
#include <CUnit/Basic.h>
#include <stdio.h>

/* Registers the suites (add_suites adds them to CUnit's registry), runs
 * every test verbosely, and returns the exit status described above. */
static inline int kiln_testing_run_cunit(void (*add_suites)(void)) {
    if (CU_initialize_registry() != CUE_SUCCESS) {
        fprintf(stderr, "CUnit: cannot initialise the registry: %s\n", CU_get_error_msg());
        return 2;
    }
    add_suites();
    if (CU_get_error() != CUE_SUCCESS) {
        fprintf(stderr, "CUnit: cannot register tests: %s\n", CU_get_error_msg());
        CU_cleanup_registry();
        return 2;
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_suites_failed();
    const unsigned ran = CU_get_number_of_tests_run();
    const int err = CU_get_error();
    CU_cleanup_registry();
    if (failed) return 1;
    if (err) return 2;
    if (ran == 0) {
        fprintf(stderr, "CUnit: no test ran\n");
        return 3;
    }
    return 0;
}
#endif /* KILN_TESTING_HAVE_CUNIT */

#endif /* KILN_TESTING_CUNIT_H */
