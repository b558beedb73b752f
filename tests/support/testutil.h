/*
 * tests/support/testutil.h — helpers for the end-to-end suites: private
 * temporary plugin directories, copying fixtures into them, and running the
 * kiln executable with its output captured. kiln runs from an argument
 * vector (no shell), so a run-file value such as a quoted path is written
 * once, as libconfig reads it, never escaped again for a shell.
 */
#ifndef KILN_TESTUTIL_H
#define KILN_TESTUTIL_H
#include <stddef.h>
#include <sys/types.h>

char *tu_mkdtemp(void);                                 /* 0755, under /tmp  */
void tu_rmrf(const char *dir);
const char *tu_fixture(const char *name);               /* libkiln-NAME.so   */
int tu_copy(const char *src, const char *dst, mode_t mode);
int tu_copy_fixture(const char *name, const char *dir); /* keeps the name    */
int tu_write(const char *path, const char *text);
/* Run a shell command; stdout+stderr into out; returns the exit status. */
int tu_run(const char *cmd, char *out, size_t outlen);
/* Run argv[0] (searched in PATH) with argv, no shell; stdout and stderr
 * into out (truncated to outlen - 1 bytes, NUL-terminated); returns the exit
 * status, 128 + the signal that ended it, or -1 when it could not start. */
int tu_run_argv(char *const argv[], char *out, size_t outlen);
/* kiln with `args` (NULL-terminated), then the words of `extra` (split at
 * spaces; NULL for none), as tu_run_argv. */
int tu_run_kiln(const char *const args[], const char *extra, char *out, size_t outlen);
/* <root>/version_N with the largest N into buf; -1 when there is none. */
int tu_latest_run_dir(const char *root, char *buf, size_t n);
const char *tu_kiln(void);                              /* path of kiln      */
#endif
