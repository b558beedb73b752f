/*
 * kiln/testing.h — a test host for plugin authors (library kiln_testing:
 * CMake target Kiln::testing, pkg-config kiln-testing). It loads a built
 * plugin library (.so) the way kiln does, creates instances with a config
 * (a kiln_kv array or "key = value" text checked against the plugin's
 * declared keys), and hands them host services that RECORD what the plugin
 * does: log lines with their levels, set_error messages, logged values and
 * metrics, stop and checkpoint requests. The test owns the rest of the
 * host's side: the trainer state, the parameters (fp32 or fp64, with
 * gradients), the accelerator (a real one loaded from its plugin file, e.g.
 * the installed "cpu", or a kernel table of the test's own), the events it
 * sends and the kind ops it calls. Wrappers check the kind and the size of
 * the ops table first, so a missing op is a status and a message, not a
 * crash. Not a trainer: no loops, no hooks run on their own.
 *
 * Conventions: every action returns a kiln_status (KILN_OK = 0) and, on
 * failure, leaves one line in kiln_test_message() (and on stderr); plain
 * accessors return their value. Nothing here exits. One kiln_test_host is
 * one plugin-facing host context, for one thread; several may coexist.
 * Pointers returned by accessors stay valid until kiln_test_reset() or
 * kiln_test_host_free(), except where noted (a log line's or logged
 * value's record moves when the plugin logs again; its text does not).
 * Loaded libraries stay loaded for the life of the process, as in kiln.
 *
 *   kiln_test_host *th;
 *   const kiln_plugin_desc *d;
 *   kiln_instance *cb;
 *   kiln_test_host_new(&th);
 *   kiln_test_load(th, "build/libkiln-hello.so", KILN_KIND_CALLBACK, "hello", &d);
 *   kiln_test_create_text(th, d, "greeting = \"hey\"; times = 2", &cb);
 *   kiln_test_log_find(th, KILN_LOG_INFO, "hey");          // non-NULL
 *   kiln_test_send_event(th, cb, KILN_EV_ON_FIT_START);
 *   kiln_test_host_free(th);                              // destroys cb
 */
#ifndef KILN_TESTING_H
#define KILN_TESTING_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_test_host kiln_test_host;

/* ---------------------------------------------------------------------------
 * The host */

/* A fresh host: no parameters, no accelerator, trainer state as at the
 * start of fit (world_size 1, accumulate_grad_batches 1, automatic
 * optimisation, stage 0, step 0), seed 0, log level KILN_LOG_INFO. */
int32_t kiln_test_host_new(kiln_test_host **out);
/* Destroys what kiln_test_create made (newest first, the accelerator
 * last), then frees the host. NULL is a no-op. */
void kiln_test_host_free(kiln_test_host *th);
/* Back to the fresh state, keeping the host: destroys the instances and
 * the accelerator it created, frees parameters, configs and records. */
int32_t kiln_test_reset(kiln_test_host *th);
/* The last failure of a kiln_test_* call on this host ("" when none). */
const char *kiln_test_message(const kiln_test_host *th);

/* The services table and the context a plugin receives, for calling a
 * plugin's ops directly (every kiln_test_create passes these two). */
const kiln_host_services *kiln_test_services(kiln_test_host *th);
kiln_host_ctx *kiln_test_hctx(kiln_test_host *th);

/* ---------------------------------------------------------------------------
 * Loading */

/* The file of plugin library `lib` ("cpu" -> libkiln-cpu.so): in
 * $KILN_PLUGIN_DIR when set, else in the plugin directory of the kiln
 * installation this library belongs to (<libdir>/kiln/plugins). KILN_E_NOT_FOUND
 * when no such file exists. */
int32_t kiln_test_plugin_path(kiln_test_host *th, const char *lib, char *buf, size_t size);
/* dlopen() `path` and run its kiln_plugin_init_v1 (once per file and
 * process), as kiln loads a plugin library. */
int32_t kiln_test_open(kiln_test_host *th, const char *path, const kiln_library **out);
/* kiln_test_open, then the descriptor of the plugin (kind, name): its
 * name or one of its "aliases". */
int32_t kiln_test_load(kiln_test_host *th, const char *path, uint32_t kind, const char *name,
                       const kiln_plugin_desc **out);

/* ---------------------------------------------------------------------------
 * Config and instances */

/* The config kiln would pass to create(): every key `d` declares, with its
 * declared type, set from `text` or else its default (a key without a
 * default is left out unless set; a required one must be set). `text` is
 * "key = value" items separated by ';' or newlines: true/false, integers,
 * floats, "strings" (or bare words), [lists]. An undeclared key, a value of
 * the wrong type or a missing required key is KILN_E_CONFIG. The array
 * lives until reset. text may be NULL (all defaults). */
int32_t kiln_test_config(kiln_test_host *th, const kiln_plugin_desc *d, const char *text, const kiln_kv **out);
/* What the config_get service reads (absolute "trainer.*" keys included);
 * NULL: nothing (KILN_E_NOT_FOUND). The array must outlive its use. */
int32_t kiln_test_set_config(kiln_test_host *th, const kiln_kv *config);

/* create() with this host's services and context; the instance is
 * remembered (so the wrappers below know its kind) and destroyed by reset
 * unless kiln_test_destroy came first. On failure *out is NULL and the
 * plugin's own message is kiln_test_error(). config may be NULL. Any ops
 * table is created (as `kiln plugins check` does); the wrappers below
 * refuse an op the table is too short to hold (a run needs the 1.1 table). */
int32_t kiln_test_create(kiln_test_host *th, const kiln_plugin_desc *d, const kiln_kv *config, kiln_instance **out);
/* kiln_test_config(text), then kiln_test_create. */
int32_t kiln_test_create_text(kiln_test_host *th, const kiln_plugin_desc *d, const char *text, kiln_instance **out);
int32_t kiln_test_destroy(kiln_test_host *th, kiln_instance *inst);
/* The descriptor an instance was created from (NULL if not ours). */
const kiln_plugin_desc *kiln_test_desc_of(kiln_test_host *th, const kiln_instance *inst);

/* ---------------------------------------------------------------------------
 * Accelerator, trainer state, seed */

/* Load the accelerator plugin `name` from `path` (NULL: the "cpu" plugin
 * found by kiln_test_plugin_path), create it with `config_text`, limit it
 * to `threads` CPU threads (0: its default) and make it what the
 * accelerator service returns. Destroyed by reset. */
int32_t kiln_test_use_accelerator(kiln_test_host *th, const char *path, const char *name, const char *config_text,
                                  int32_t threads);
/* Or a kernel table of the test's own (acc is passed back to its entries);
 * kernels NULL: no accelerator (the service answers KILN_E_NOT_FOUND). */
int32_t kiln_test_set_accelerator(kiln_test_host *th, kiln_instance *acc, const kiln_kernels *kernels);
kiln_instance *kiln_test_acc(const kiln_test_host *th);
const kiln_kernels *kiln_test_kernels(const kiln_test_host *th);

/* What the trainer_state service returns and events carry: the test
 * writes it directly (stage, global_step, current_epoch, run_dir, rank...). */
kiln_trainer_state *kiln_test_trainer(kiln_test_host *th);
/* The run seed the seed service derives named streams from. */
int32_t kiln_test_set_seed(kiln_test_host *th, uint64_t seed);

/* ---------------------------------------------------------------------------
 * Parameters. A module registers its own through the param_register
 * service during create(); other kinds get them from the test. */

/* Register a parameter as a module would; dtype KILN_DTYPE_F32 or F64. */
int32_t kiln_test_add_param(kiln_test_host *th, const char *name, uint32_t ndim, const int64_t *shape, uint32_t flags,
                            uint32_t dtype, kiln_parameter **out);
/* Allocate data and grad (zeroed, 64-byte aligned, in each parameter's
 * param_dtype) for every parameter not yet allocated; compute = data.
 * kiln does this after a module's create(). */
int32_t kiln_test_alloc_params(kiln_test_host *th);
uint32_t kiln_test_param_count(const kiln_test_host *th);
/* Parameter i in registration order, NULL past the end. */
kiln_parameter *kiln_test_param(kiln_test_host *th, uint32_t i);
/* All of them (what the params service and the setup wrappers pass). The
 * array moves when a parameter is added. */
kiln_parameter *const *kiln_test_params(kiln_test_host *th);
kiln_parameter *kiln_test_find_param(kiln_test_host *th, const char *name);

/* ---------------------------------------------------------------------------
 * Events and kind ops. Each looks up the instance's kind, checks that the
 * op exists in the table as built (struct_size), and calls it. */

/* Deliver `ev` to a callback, module or precision instance (their on_event;
 * KILN_OK without calling when a module or precision has none). Zero
 * fields are filled: struct_size, trainer (this host's), stage (the
 * trainer state's). */
int32_t kiln_test_event(kiln_test_host *th, kiln_instance *inst, kiln_event *ev);
/* kiln_test_event of a bare event `id` (KILN_EV_*, batch_idx -1). */
int32_t kiln_test_send_event(kiln_test_host *th, kiln_instance *inst, uint32_t id);

/* setup(params) of a precision, strategy or optimizer instance with this
 * host's parameters (allocated first if needed). */
int32_t kiln_test_setup(kiln_test_host *th, kiln_instance *inst);

/* A closure script: what the trainer's closure would do (zero_grad,
 * training_step, backward); write gradients and report the loss. */
typedef int32_t (*kiln_test_closure_fn)(void *ctx, double *loss);

/* What the step wrappers saw since the last reset. */
typedef struct kiln_test_counts {
    int64_t closure_calls;  /* the closure script ran                     */
    int64_t after_closure;  /* precision: after_closure ran               */
    int64_t updates;        /* precision: the optimizer's step was called */
    double last_loss;       /* the last loss a closure reported (NaN)     */
} kiln_test_counts;
const kiln_test_counts *kiln_test_counters(const kiln_test_host *th);

/* optimizer.step(closure); fn NULL passes no closure. */
int32_t kiln_test_optimizer_step(kiln_test_host *th, kiln_instance *opt, kiln_test_closure_fn fn, void *ctx);
int32_t kiln_test_zero_grad(kiln_test_host *th, kiln_instance *opt);
int32_t kiln_test_get_lr(kiln_test_host *th, kiln_instance *opt, double *lr);
int32_t kiln_test_set_lr(kiln_test_host *th, kiln_instance *opt, double lr);

/* Precision ops. kiln_test_precision_step runs precision.optimizer_step
 * with the closure script and an optimizer handle that steps `opt` (an
 * optimizer instance of this host) or, with opt NULL, only calls the
 * closure; *skipped (may be NULL) as the precision reports it. */
int32_t kiln_test_convert_params(kiln_test_host *th, kiln_instance *prec);
int32_t kiln_test_pre_backward(kiln_test_host *th, kiln_instance *prec, double loss, double *scale);
int32_t kiln_test_precision_step(kiln_test_host *th, kiln_instance *prec, kiln_instance *opt,
                                 kiln_test_closure_fn fn, void *ctx, int32_t *skipped);

/* Module ops. init_weights allocates the registered parameters first.
 * kiln_test_step runs training_step (KILN_SPLIT_TRAIN), validation_step or
 * test_step on a batch the test built. */
int32_t kiln_test_init_weights(kiln_test_host *th, kiln_instance *module, uint64_t seed);
int32_t kiln_test_step(kiln_test_host *th, kiln_instance *module, int32_t split, const kiln_batch *batch,
                       int64_t batch_idx, kiln_step_output *out);
int32_t kiln_test_backward(kiln_test_host *th, kiln_instance *module, double dloss);
int32_t kiln_test_predict_step(kiln_test_host *th, kiln_instance *module, const kiln_batch *batch, kiln_tensor *out);

/* Data ops. kiln_test_data_next returns 1 with *out filled, 0 at the end
 * of the epoch, or a negative status. */
int32_t kiln_test_data_setup(kiln_test_host *th, kiln_instance *data, int32_t stage, int32_t rank, int32_t world_size);
int32_t kiln_test_num_batches(kiln_test_host *th, kiln_instance *data, int32_t split, int64_t *n);
int32_t kiln_test_start_epoch(kiln_test_host *th, kiln_instance *data, int32_t split, uint64_t epoch,
                              int64_t start_batch);
int32_t kiln_test_data_next(kiln_test_host *th, kiln_instance *data, int32_t split, kiln_batch *out);

/* Scheduler: lr_at. */
int32_t kiln_test_lr_at(kiln_test_host *th, kiln_instance *sched, double base_lr, int64_t step, int64_t epoch,
                        double metric, double *lr);

/* State. kiln_test_get_state's blob comes from the alloc service: release
 * it with kiln_test_free_state. kiln_test_state_roundtrip copies the state
 * of `from` into `to` (instances of the same plugin) and reports the
 * version and size it moved (either may be NULL). */
int32_t kiln_test_get_state(kiln_test_host *th, kiln_instance *inst, uint32_t *version, void **data, size_t *size);
int32_t kiln_test_set_state(kiln_test_host *th, kiln_instance *inst, uint32_t version, const void *data, size_t size);
void kiln_test_free_state(kiln_test_host *th, void *data);
int32_t kiln_test_state_roundtrip(kiln_test_host *th, kiln_instance *from, kiln_instance *to, uint32_t *version,
                                  size_t *size);

/* ---------------------------------------------------------------------------
 * What the plugin did */

/* The last set_error (code 0 and "" after reset or clear). */
int32_t kiln_test_error_code(const kiln_test_host *th);
const char *kiln_test_error(const kiln_test_host *th);
void kiln_test_clear_error(kiln_test_host *th);

/* Log lines, every level, in order. log_enabled answers level >= the log
 * level (KILN_LOG_INFO by default); every line is recorded all the same.
 * Lines at KILN_LOG_WARN and above also go to stderr (all of them with
 * KILN_TEST_VERBOSE=1 in the environment). */
typedef struct kiln_test_log_line {
    int32_t level; /* KILN_LOG_* */
    const char *text;
} kiln_test_log_line;
int32_t kiln_test_set_log_level(kiln_test_host *th, int32_t level);
size_t kiln_test_log_count(const kiln_test_host *th);
/* Line i (NULL past the end); the record is valid until the next line. */
const kiln_test_log_line *kiln_test_log(const kiln_test_host *th, size_t i);
/* The newest line at `min_level` or above containing `needle` (NULL: none). */
const char *kiln_test_log_find(const kiln_test_host *th, int32_t min_level, const char *needle);
void kiln_test_clear_log(kiln_test_host *th);

/* Values from log_value (Lightning's self.log) and log_metric, in order.
 * get_metric answers the newest value of a name. */
enum { KILN_TEST_LOG_VALUE = 0, KILN_TEST_LOG_METRIC = 1 };
typedef struct kiln_test_value {
    const char *name;
    double value;
    uint32_t flags;  /* KILN_LOG_ON_STEP ...; log_metric records ON_STEP */
    double weight;   /* log_value's weight; 1 for log_metric             */
    int64_t step;    /* log_metric's step; -1 for log_value              */
    int32_t source;  /* KILN_TEST_LOG_VALUE or KILN_TEST_LOG_METRIC      */
} kiln_test_value;
size_t kiln_test_logged_count(const kiln_test_host *th);
/* Value i (NULL past the end); the record is valid until the next value. */
const kiln_test_value *kiln_test_logged(const kiln_test_host *th, size_t i);
/* The newest value logged under `name`, NaN when none. */
double kiln_test_last_value(const kiln_test_host *th, const char *name);
void kiln_test_clear_logged(kiln_test_host *th);

/* request_stop calls and the newest reason. */
int kiln_test_stop_count(const kiln_test_host *th);
const char *kiln_test_stop_reason(const kiln_test_host *th);

/* save_checkpoint requests, in order; the service returns `status`
 * (KILN_OK by default; e.g. KILN_E_STATE to act outside fit). */
size_t kiln_test_checkpoint_count(const kiln_test_host *th);
const char *kiln_test_checkpoint(const kiln_test_host *th, size_t i);
int32_t kiln_test_set_checkpoint_status(kiln_test_host *th, int32_t status);

/* ---------------------------------------------------------------------------
 * The services that reach into a trainer: forwarded to the test's
 * functions (unset: KILN_E_UNSUPPORTED, optimizer_count 0). Collectives
 * answer as one process. */
typedef struct kiln_test_trainer_hooks {
    void *ctx;
    uint32_t n_optimizers;
    int32_t (*manual_backward)(void *ctx, double loss);
    int32_t (*optimizer_step)(void *ctx, uint32_t index, const kiln_closure *closure, int32_t *skipped);
    int32_t (*optimizer_zero_grad)(void *ctx, uint32_t index);
    int32_t (*toggle)(void *ctx, uint32_t index, int on); /* on: 1 toggle, 0 untoggle */
    int32_t (*predict)(void *ctx, const kiln_batch *batch, kiln_tensor *out);
} kiln_test_trainer_hooks;
/* Copied; NULL clears them. */
int32_t kiln_test_set_trainer_hooks(kiln_test_host *th, const kiln_test_trainer_hooks *hooks);

#ifdef __cplusplus
}
#endif

#endif /* KILN_TESTING_H */
