/*
 * tests/support/testutil.h — helpers for the end-to-end suites: private
 * temporary plugin directories, copying fixtures into them, running the
 * kiln executable (or another program) with its output captured, and
 * reading the files a run leaves. Nothing goes through a shell: programs
 * run from an argument vector, so a run-file value such as a quoted path
 * is written once, as libconfig reads it, never escaped again; what the
 * suites once piped through grep, cut, cmp or ls is done here in C.
 */
#ifndef KILN_TESTUTIL_H
#define KILN_TESTUTIL_H
#include <stddef.h>
#include <sys/types.h>

char *tu_mkdtemp(void);                                 /* 0755, under /tmp  */
void tu_rmrf(const char *dir);
/* The one private directory of a suite that keeps its runs in a single
 * place: tu_suite_dir_init makes it (a CUnit suite init: 0, or -1 when it
 * cannot), tu_suite_dir_clean removes it with everything in it. */
extern char *tu_suite_dir;
int tu_suite_dir_init(void);
int tu_suite_dir_clean(void);
const char *tu_fixture(const char *name);               /* libkiln-NAME.so   */
int tu_copy(const char *src, const char *dst, mode_t mode);
int tu_copy_fixture(const char *name, const char *dir); /* keeps the name    */
int tu_write(const char *path, const char *text);
/* Run argv[0] (searched in PATH) with argv, no shell; stdout and stderr
 * into out (truncated to outlen - 1 bytes, NUL-terminated); returns the exit
 * status, 128 + the signal that ended it, or -1 when it could not start. */
int tu_run_argv(char *const argv[], char *out, size_t outlen);
/* Run argv[0] (searched in PATH) with argv, no shell, its stdout and stderr
 * written to the file `log`; the exit status as tu_run_argv. */
int tu_run_argv_log(char *const argv[], const char *log);
/* argv[at..] = the words of `text` (split at spaces; NULL for none), copied
 * into buf; returns the index after the last (at most max). */
int tu_split_words(const char *text, char *buf, size_t n, char *argv[], int at, int max);
/* The words of `cmd` (split at spaces, no quoting: for commands whose
 * words hold no spaces) as an argument vector, as tu_run_argv. */
int tu_run_words(const char *cmd, char *out, size_t outlen);
/* kiln with `args` (NULL-terminated), then the words of `extra` (split at
 * spaces; NULL for none), as tu_run_argv. */
int tu_run_kiln(const char *const args[], const char *extra, char *out, size_t outlen);
/* kiln with `args`, then `more` (each NULL-terminated, or NULL for none),
 * as tu_run_argv; TU_ARGS("--set", "k=v") writes such a list in place. */
int tu_run_kiln_a(const char *const args[], const char *const more[], char *out, size_t outlen);
#define TU_ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
/* kiln with each argument given on its own, up to a NULL (no shell, no
 * splitting: a value with quotes or spaces is passed as written), as
 * tu_run_argv. */
int tu_run_kiln_l(char *out, size_t outlen, const char *arg, ...) __attribute__((sentinel));
/* What the suites asked the shell for, as C: 1 when the two files hold the
 * same bytes, 0 when they differ, -1 when one cannot be read (cmp); mkdir -p;
 * the number of entries in a directory, -1 when it cannot be read (ls -A |
 * wc -l); the first n bytes of src as dst (head -c). */
int tu_same_file(const char *a, const char *b);
int tu_mkdirs(const char *path);
int tu_count_entries(const char *dir);
int tu_copy_head(const char *src, const char *dst, size_t n);
/* Reading a text file the suites' shell pipelines read: the number of
 * lines equal to `line` (grep -c -x), -1 when the file cannot be read; and
 * fields f1..f2 (1-based, space-separated; 0 and 0 for the whole line) of
 * every line that starts with `prefix` (NULL: any) and does not contain
 * `skip` (NULL: none), each followed by `sep`, into out (grep | cut -d' ' |
 * tr '\n' sep); returns the number of lines taken, -1 when the file cannot
 * be read. */
int tu_count_lines(const char *path, const char *line);
int tu_join_fields(const char *path, const char *prefix, const char *skip, int f1, int f2, char sep, char *out,
                   size_t n);
/* The run files of the suites that train on the fixtures: <dir>/<tag>N.cfg
 * into buf, N counting up in the process, so each run has a file of its
 * own; the file `cfg` holding the plugin directory $KILN_TRAIN_FIXTURES and
 * then `body` (tu_write_jobf: a printf format and its arguments), a fatal
 * assertion when it cannot be written; and into buf the --set value that
 * puts a run's output under the directory the format names
 * (trainer.default_root_dir="..."). The last two return buf or cfg. */
const char *tu_job_path(char *buf, size_t n, const char *dir, const char *tag);
const char *tu_write_job(const char *cfg, const char *body);
const char *tu_write_jobf(const char *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *tu_root_set(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The number of lines of the file equal to `line` (tu_count_lines) is
 * `want`; the line and the count go to stderr when it is not. */
void tu_expect_lines(const char *path, const char *line, int want);
/* The usual start of such a job: one epoch without a sanity check over
 * toydata's n_train + n_val batches, and toymod with `keys` ("" for none,
 * else each "k = v; "); the optimizer and the rest follow. */
#define TU_TOY_EPOCH(n_train, n_val, keys)                                                                             \
    "trainer = { max_epochs = 1; num_sanity_val_steps = 0; };\n"                                                      \
    "data = { name = \"toydata\"; n_train = " #n_train "; n_val = " #n_val "; };\n"                                   \
    "module = { name = \"toymod\"; " keys "};\n"
/* A run file body: `job`, then the hook_trace fixture writing every hook
 * to <dir>/<name>, whose path goes into trace. */
void tu_traced_job(char *body, size_t n, char *trace, size_t tn, const char *dir, const char *name, const char *job);
/* The status `rc` of a run whose output is `out` must be 0; when it is
 * not the output goes to stderr first. tu_require_ok's assertion is fatal
 * (the case goes on to read what the run wrote), tu_check_ok's is not. */
void tu_require_ok(int rc, const char *out);
void tu_check_ok(int rc, const char *out);
/* <root>/version_N with the largest N into buf; -1 when there is none. */
int tu_latest_run_dir(const char *root, char *buf, size_t n);
const char *tu_kiln(void);                              /* path of kiln      */
#endif
