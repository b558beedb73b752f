/*
 * tests/support/plugin_fixture.h — the scaffolding the plugin suites share
 * (callbacks, stopping, tensorboard, ckpt_callback, optim, precision,
 * lbfgs, and the accelerator suites cpu_accel, kernels_seq, kernels_attn):
 * loading a built plugin into the test host (kiln/testing.h), creating an
 * instance, a temporary run directory, the trainer state of a fit, events,
 * reading a file back, and the deterministic inputs the kernel suites feed. Failures that leave a case nothing
 * to test are fatal CUnit assertions, as they were in each suite.
 */
#ifndef KILN_TESTS_PLUGIN_FIXTURE_H
#define KILN_TESTS_PLUGIN_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kiln/testing.h>

/* $KILN_PLUGIN_DIR/libkiln-<lib>.so (the current directory without the
 * variable) loaded into `th`, and its plugin `name` of `kind`; NULL when
 * either is missing. */
const kiln_plugin_desc *fixture_load_plugin(kiln_test_host *th, const char *lib, uint32_t kind, const char *name);
/* A suite init's first check where the plugins must come from the build:
 * 0 when KILN_PLUGIN_DIR is set, else -1 and a line on stderr saying so. */
int fixture_need_plugin_dir(void);
/* The callback plugin `name` from libkiln-<name>.so; KILN_PLUGIN_DIR, the
 * library and the plugin must exist (fatal assertions). */
const kiln_plugin_desc *fixture_load_callback_desc(kiln_test_host *th, const char *name);
/* Its ops, which must hold on_event (fatal assertion). */
const kiln_callback_ops *fixture_callback_ops(const kiln_plugin_desc *d);

/* The accelerator plugin `name` from libkiln-<lib>.so after a
 * kiln_test_reset(th), one instance of it with no config, and its kernel
 * table; -1 when any is missing (a suite init's failure: every case of the
 * suite needs all four). fixture_accel_close destroys the instance (when
 * there is one) and resets the host: a suite's cleanup. */
int fixture_accel_open(kiln_test_host *th, const char *lib, const char *name, const kiln_plugin_desc **desc,
                       const kiln_accelerator_ops **ops, kiln_instance **acc, const kiln_kernels **k);
void fixture_accel_close(kiln_test_host *th, const kiln_accelerator_ops *ops, kiln_instance **acc);

/* Deterministic values in [-1, 1) for input i of the stream `salt`: the
 * same numbers on every machine, so a kernel's result can be compared
 * bit for bit between runs and implementations. */
double fixture_val(unsigned i, unsigned salt);

/* The resolved config a host passes to create(), built from a suite's own
 * config struct by a table of its keys: each key's type (KILN_TYPE_STRING
 * from a const char *, INT from an int64_t, BOOL from a bool, FLOAT from a
 * double) and the offset of its field. An `optional` string key whose
 * field is NULL is left out (the key not given); every other key is passed
 * as it is. kv needs room for nkeys + 1 entries (the end). */
typedef struct fixture_key {
    const char *key;
    uint32_t type;
    size_t offset;
    int optional;
} fixture_key;
const kiln_kv *fixture_kv_of(const fixture_key *keys, size_t nkeys, const void *cfg, kiln_kv *kv);

/* create() of the plugin `d` (its plugin_ctx) with the test host's
 * services and context and the resolved config `cfg`; *out is NULL first,
 * so a refusal leaves it NULL unless the plugin wrote it. */
int32_t fixture_create_desc(const kiln_plugin_desc *d, kiln_test_host *th, const kiln_kv *cfg, kiln_instance **out);

/* fixture_create_desc that should succeed: when it does not, a failed
 * assertion, the host's message on stdout, and NULL. */
kiln_instance *fixture_create_checked(const kiln_plugin_desc *d, kiln_test_host *th, const kiln_kv *cfg);

/* A config create() refuses (fixture_create with the test host's
 * context): KILN_E_CONFIG, and the error holds needle and, unless NULL,
 * needle2. Returns what create left in the instance (NULL). */
kiln_instance *fixture_config_error(const kiln_ops_header *ops, const kiln_host_services *services,
                                    kiln_test_host *th, const kiln_kv *cfg, const char *needle, const char *needle2);

/* A refused config: create() of `d` with `cfg` answers KILN_E_CONFIG,
 * leaves no instance (the pointer it gets is not NULL before: create
 * must reset it) and the test host's error names `key`. */
void fixture_expect_refused(const kiln_plugin_desc *d, kiln_test_host *th, const kiln_kv *cfg, const char *key);

/* Refused values, each tried alone: the resolved config `base` with the
 * entry `key` holding `value` instead must be refused naming `key`
 * (fixture_expect_refused). A key that base lacks fails the case. */
typedef struct fixture_bad_value {
    const char *key;
    kiln_value value;
} fixture_bad_value;
void fixture_expect_refused_each(const kiln_plugin_desc *d, kiln_test_host *th, const kiln_kv *base,
                                 const fixture_bad_value *bad, size_t n);

/* A data plugin's position restored as a host restores a checkpoint: on
 * `in`, created and not yet set up, set_state(ver, blob), setup for fit as
 * rank 0 of 1 (fatal when it fails), and get_state giving back the same
 * bytes (restored, not yet applied). */
void fixture_data_restore(kiln_test_host *th, const kiln_data_ops *ops, kiln_instance *in, uint32_t ver,
                          const void *blob, size_t size);

/* A parameter registered in th's host (fatal when it is refused). */
kiln_parameter *fixture_param(kiln_test_host *th, const char *name, uint32_t ndim, const int64_t *shape,
                              uint32_t flags);

/* An instance of the accelerator `desc` (fatal when create refuses), set
 * as th's accelerator with its kernel table; fixture_accel_remove destroys
 * it and resets the host. */
kiln_instance *fixture_accel_install(kiln_test_host *th, const kiln_plugin_desc *desc);
void fixture_accel_remove(kiln_test_host *th, const kiln_plugin_desc *desc, kiln_instance **acc);

/* create() of a plugin with `services` and the test host's context; on
 * failure *rc holds the status and no instance may come back. */
kiln_instance *fixture_create(const kiln_ops_header *ops, const kiln_host_services *services, kiln_test_host *th,
                              const kiln_kv *cfg, int32_t *rc);

/* mkdtemp of /tmp/kiln-<tag>-XXXXXX into dir (fatal assertion), and the
 * removal of such a directory with everything in it. */
void fixture_tmpdir(char *dir, size_t n, const char *tag);
void fixture_rmtree(const char *dir);

/* The trainer state of a one-process fit writing into run_dir. */
void fixture_fit_state(kiln_trainer_state *ts, const char *run_dir);

/* An event of `id` at `stage` and `batch` (-1: none) for `trainer`. */
kiln_event fixture_event(uint32_t id, int32_t stage, int64_t batch, const kiln_trainer_state *trainer);

/* The whole file as a string (caller frees), NULL when it does not exist. */
char *fixture_slurp(const char *path);
int fixture_file_exists(const char *path);

#endif
