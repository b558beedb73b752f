/*
 * test_hello.c — the hello plugin under kiln's test host (kiln/testing.h,
 * library Kiln::testing): the built libkiln-hello.so is loaded as kiln
 * loads it, created from "key = value" config text, and what it logged or
 * reported is read back. Plain C, no test framework: each CHECK prints the
 * line that failed, and the exit status is the number of failures.
 */
#include <stdio.h>
#include <string.h>

#include <kiln/testing.h>

#ifndef HELLO_PLUGIN_PATH
#error "HELLO_PLUGIN_PATH must name the built libkiln-hello.so"
#endif

static int failures;

#define CHECK(cond)                                                                                   \
    do {                                                                                              \
        if (!(cond)) {                                                                                \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);                  \
            failures++;                                                                               \
        }                                                                                             \
    } while (0)

int main(void) {
    kiln_test_host *th;
    if (kiln_test_host_new(&th) != KILN_OK) return 2;

    /* found by its name and by its alias */
    const kiln_plugin_desc *d = NULL, *alias = NULL;
    CHECK(kiln_test_load(th, HELLO_PLUGIN_PATH, KILN_KIND_CALLBACK, "hello", &d) == KILN_OK);
    if (!d) return 1;
    CHECK(kiln_test_load(th, HELLO_PLUGIN_PATH, KILN_KIND_CALLBACK, "hi", &alias) == KILN_OK && alias == d);

    /* the defaults: one "hello" at info level */
    kiln_instance *cb = NULL;
    CHECK(kiln_test_create_text(th, d, NULL, &cb) == KILN_OK);
    CHECK(kiln_test_log_count(th) == 1);
    CHECK(kiln_test_log(th, 0) && kiln_test_log(th, 0)->level == KILN_LOG_INFO &&
          !strcmp(kiln_test_log(th, 0)->text, "hello"));
    CHECK(kiln_test_destroy(th, cb) == KILN_OK);

    /* its two keys */
    kiln_test_clear_log(th);
    CHECK(kiln_test_create_text(th, d, "greeting = \"hey there\"; times = 3", &cb) == KILN_OK);
    CHECK(kiln_test_log_count(th) == 3);
    CHECK(kiln_test_log_find(th, KILN_LOG_INFO, "hey there") != NULL);
    CHECK(kiln_test_log_find(th, KILN_LOG_WARN, NULL) == NULL); /* nothing above info */

    /* its table is the 1.0 header alone: kiln would not run it in fit, and
     * the test host says so instead of calling past the table */
    CHECK(kiln_test_send_event(th, cb, KILN_EV_ON_FIT_START) == KILN_E_UNSUPPORTED);
    CHECK(strstr(kiln_test_message(th), "predates") != NULL);

    /* a bad value is the plugin's own KILN_E_CONFIG, with its message */
    kiln_instance *bad = NULL;
    CHECK(kiln_test_create_text(th, d, "times = 0", &bad) == KILN_E_CONFIG && bad == NULL);
    CHECK(kiln_test_error_code(th) == KILN_E_CONFIG);
    CHECK(strstr(kiln_test_error(th), "times must be >= 1, got 0") != NULL);
    /* a key it does not declare, or a value of the wrong type, never
     * reaches it: the config is refused as kiln would refuse the run file */
    CHECK(kiln_test_create_text(th, d, "loudness = 11", &bad) == KILN_E_CONFIG);
    CHECK(strstr(kiln_test_message(th), "loudness") != NULL);
    CHECK(kiln_test_create_text(th, d, "times = \"twice\"", &bad) == KILN_E_CONFIG);

    /* the installed cpu accelerator, found next to the test host's library
     * (<libdir>/kiln/plugins), for plugins that compute */
    CHECK(kiln_test_use_accelerator(th, NULL, "cpu", NULL, 1) == KILN_OK);
    CHECK(kiln_test_kernels(th) && kiln_test_kernels(th)->struct_size >= KILN_KERNELS_SIZE_1_1);

    kiln_test_host_free(th); /* destroys cb */
    if (failures) fprintf(stderr, "test_hello: %d check(s) failed\n", failures);
    else printf("test_hello: all checks passed\n");
    return failures ? 1 : 0;
}
