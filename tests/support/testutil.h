/*
 * tests/support/testutil.h — helpers for the end-to-end suites: private temporary
 * plugin directories, copying fixtures into them, and running the kiln
 * executable with its output captured.
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
const char *tu_kiln(void);                              /* path of kiln      */
#endif
