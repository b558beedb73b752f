/*
 * kiln/plugin.h — the kiln plugin ABI, major 1. A plugin library (a file named
 * libkiln-<name>.so) exports exactly one symbol, kiln_plugin_init_v1. The host
 * calls it once with a frozen bootstrap struct and receives a static library
 * descriptor listing one or more plugin descriptors (several plugins per .so).
 * Each descriptor carries its kind, name, typed properties the host reads
 * without creating an instance (a precision plugin's `precision`,
 * `amp_backend`, `amp_level`, its aliases), the config keys it accepts, and a
 * kind-specific ops table that starts with a common create/destroy/state
 * header. Host services reach the plugin through one append-only table whose
 * every call takes the host context handle of the instance.
 *
 * Rules (docs/abi.md has the full policy):
 *  - Every struct that crosses the boundary starts with uint32_t struct_size;
 *    enums travel as fixed-width integers; within major 1 structs and function
 *    tables only grow at the end, and every released minor's layout is pinned
 *    by static_assert(offsetof(...)) below.
 *  - The host reads a plugin struct only up to min(struct_size, its own view)
 *    and treats missing tail fields as 0/NULL; it calls a function appended in
 *    minor N only when the library's abi_minor >= N and the pointer is set.
 *  - A plugin calls a service appended in minor N only when
 *    svc->abi_minor >= N and the pointer is non-NULL.
 *  - Plugins return kiln_status codes, never exit() or abort(); details go
 *    through svc->set_error().
 *
 * Threading contract:
 *  - kiln_plugin_init_v1 is called once per process, on the loader thread. It
 *    must be cheap: no threads, no file or network I/O, no CUDA. Library
 *    constructors must do nothing observable.
 *  - Descriptors, properties, params and ops tables are immutable after init
 *    returns; the host reads them from any thread without locks.
 *  - create/destroy of one plugin are serialised by the host. One instance is
 *    never called concurrently unless it reports KILN_CAP_THREAD_SAFE_INSTANCE.
 *  - Host services are thread-safe unless their comment says otherwise.
 *  - The host never dlclose()s a library after a successful init; shutdown is
 *    explicit: destroy every instance (reverse creation order), then each
 *    library's library_fini (reverse load order).
 */
#ifndef KILN_PLUGIN_H
#define KILN_PLUGIN_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/status.h"
#include "kiln/tensor.h"
#include "kiln/value.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Versions */

#define KILN_ABI_MAJOR 1
#define KILN_ABI_MINOR 10

#if defined(__GNUC__)
#define KILN_EXPORT __attribute__((visibility("default")))
#else
#define KILN_EXPORT
#endif

/* ---------------------------------------------------------------------------
 * Plugin kinds. Fixed values, never renumbered; 0 is invalid. A host skips a
 * descriptor of a kind it does not know with one informational line, so a
 * new kind is a minor change. */
enum {
    KILN_KIND_ACCELERATOR = 1, /* device memory, streams, the kernel table     */
    KILN_KIND_PRECISION = 2,   /* dtypes, loss scaling, unscale, clipping       */
    KILN_KIND_STRATEGY = 3,    /* ranks, gradient sync, collectives             */
    KILN_KIND_OPTIMIZER = 4,   /* step(closure), zero_grad, state               */
    KILN_KIND_SCHEDULER = 5,   /* learning rate per step / epoch                */
    KILN_KIND_CALLBACK = 6,    /* every trainer hook                            */
    KILN_KIND_MODULE = 7,      /* the model: parameters, steps, backward        */
    KILN_KIND_DATA = 8,        /* datasets, sampling, resumable position        */
};
#define KILN_KIND_MAX_KNOWN 8

/* Capability bits (uint64). Unknown bits a plugin reports are ignored. */
#define KILN_CAP_THREAD_SAFE_INSTANCE (1ull << 0) /* instance callable from several threads */
#define KILN_CAP_STATEFUL (1ull << 1)             /* get_state/set_state are meaningful      */
#define KILN_CAP_NEEDS_CUDA (1ull << 2)           /* only usable with a CUDA device          */
#define KILN_CAP_DETERMINISTIC (1ull << 3)        /* same inputs give bit-identical outputs  */
#define KILN_CAP_KNOWN_1_0 (KILN_CAP_THREAD_SAFE_INSTANCE | KILN_CAP_STATEFUL | KILN_CAP_NEEDS_CUDA | KILN_CAP_DETERMINISTIC)
/* 1.5: a callback that monitors logged metrics (early stopping, model
 * checkpointing). At on_train_epoch_end the host calls the callbacks without
 * this bit, then the precision plugin and the module, and only then the
 * callbacks with it, so they can monitor a metric the module logs in its own
 * on_train_epoch_end (Lightning's "monitoring callbacks"). A host before 1.5
 * ignores the bit and calls every callback before the module. */
#define KILN_CAP_MONITOR (1ull << 4)
#define KILN_CAP_KNOWN_1_5 (KILN_CAP_KNOWN_1_0 | KILN_CAP_MONITOR)

/* Log levels (int32). */
enum {
    KILN_LOG_TRACE = 0,
    KILN_LOG_DEBUG = 1,
    KILN_LOG_INFO = 2,
    KILN_LOG_WARN = 3,
    KILN_LOG_ERROR = 4,
};

/* Opaque handles. kiln_host_ctx identifies one plugin instance (or, during
 * init, the library being loaded) to the host; kiln_instance is the plugin's
 * own per-instance state. */
typedef struct kiln_host_ctx kiln_host_ctx;
typedef struct kiln_instance kiln_instance;
struct kiln_kernels;       /* kiln/training.h */
struct kiln_trainer_state; /* kiln/training.h */
struct kiln_closure;       /* kiln/training.h */

/* log_value flags (1.1) */
#define KILN_LOG_ON_STEP (1u << 0)  /* a per-step value (logged every log_every_n_steps) */
#define KILN_LOG_ON_EPOCH (1u << 1) /* reduced over the epoch: mean weighted by `weight`  */
#define KILN_LOG_PROG_BAR (1u << 2) /* shown by the progress bar                         */

/* ---------------------------------------------------------------------------
 * Host services (append-only). Every call takes the caller's host context;
 * during kiln_plugin_init_v1 there is no instance and hctx may be NULL. */
typedef struct kiln_host_services {
    uint32_t struct_size;
    uint16_t abi_major;
    uint16_t abi_minor;
    /* -- 1.0 -- */
    /* One line of text (no trailing newline needed); any thread. */
    void (*log)(kiln_host_ctx *hctx, int32_t level, const char *msg);
    /* Non-zero when `level` would be printed, to skip formatting otherwise. */
    int32_t (*log_enabled)(kiln_host_ctx *hctx, int32_t level);
    /* Detail for the status code the current call is about to return. The
     * host copies the text (thread-local) and prefixes kind, name and file. */
    void (*set_error)(kiln_host_ctx *hctx, int32_t code, const char *msg);
    /* Host memory: anything the host will free (state blobs) comes from here.
     * align is a power of two <= 4096, 0 meaning the default of 16. */
    void *(*alloc)(kiln_host_ctx *hctx, size_t size, size_t align);
    void (*free)(kiln_host_ctx *hctx, void *ptr);
    /* Read a config value: `key` relative to this plugin's section
     * ("lr"), or absolute under "trainer." ("trainer.seed"). The pointed-to
     * data stays valid for the life of the instance. KILN_E_NOT_FOUND if
     * absent. */
    int32_t (*config_get)(kiln_host_ctx *hctx, const char *key, kiln_value *out);
    /* Record a scalar metric (loggers and callback_metrics see it). */
    void (*log_metric)(kiln_host_ctx *hctx, const char *name, double value, int64_t step);
    /* -- 1.1: training -- */
    /* The run's accelerator instance and its kernel table. */
    int32_t (*accelerator)(kiln_host_ctx *hctx, kiln_instance **acc, const struct kiln_kernels **kernels);
    /* Modules, during create(): declare a parameter (the host copies the
     * name). The host allocates every parameter after create() returns and
     * fills data/grad/compute before init_weights(); *out stays valid for
     * the run. If create() then fails, the registrations are discarded. */
    int32_t (*param_register)(kiln_host_ctx *hctx, const char *name, uint32_t ndim, const int64_t *shape,
                              uint32_t flags, kiln_parameter **out);
    /* Every registered parameter, in registration order. The list stays
     * valid for the run once the module's create() has returned; asked for
     * during create(), only until the next param_register (the host grows
     * it: a module registers as many parameters as it has). */
    int32_t (*params)(kiln_host_ctx *hctx, kiln_parameter *const **list, uint32_t *n);
    /* The trainer's state, valid until the current call returns. */
    const struct kiln_trainer_state *(*trainer_state)(kiln_host_ctx *hctx);
    /* Lightning's self.log(): KILN_LOG_* flags; `weight` is the batch size
     * for epoch means. */
    void (*log_value)(kiln_host_ctx *hctx, const char *name, double value, uint32_t flags, double weight);
    /* callback_metrics lookup; KILN_E_NOT_FOUND when absent. */
    int32_t (*get_metric)(kiln_host_ctx *hctx, const char *name, double *out);
    /* trainer.should_stop = True (honours min_epochs/min_steps). */
    void (*request_stop)(kiln_host_ctx *hctx, const char *reason);
    /* A seed derived from the run seed for a named random stream. */
    uint64_t (*seed)(kiln_host_ctx *hctx, const char *stream);
    /* -- 1.2: manual optimisation (Lightning's automatic_optimization =
     * False, LightningOptimizer, manual_backward). Only for a module whose
     * "automatic_optimization" property is false, and only from inside its
     * training_step; anywhere else they return KILN_E_STATE. Optimizers are
     * numbered in config order (`optimizers = ( ... )`, or the single
     * `optimizer`). -- */
    /* How many optimizers the run has (0 outside fit). */
    uint32_t (*optimizer_count)(kiln_host_ctx *hctx);
    /* manual_backward(loss): strategy pre_backward, precision pre_backward
     * (the loss scale), on_before_backward(loss * scale), then the module's
     * own backward op with dloss = scale — it back-propagates the loss it
     * passed here (a module with several losses remembers which) — then
     * on_after_backward and strategy post_backward. */
    int32_t (*manual_backward)(kiln_host_ctx *hctx, double loss);
    /* optimizer.step(closure) of optimizer `index`: precision optimizer_step
     * (unscale, inf check and skip under a scaler) -> the optimizer's step,
     * which calls `closure` (may be NULL: nothing to recompute) and then
     * on_before_optimizer_step; counts one global step. *skipped (may be
     * NULL) is 1 when the precision skipped the update. */
    int32_t (*optimizer_step)(kiln_host_ctx *hctx, uint32_t index, const struct kiln_closure *closure,
                              int32_t *skipped);
    /* optimizer.zero_grad() of optimizer `index`: no hooks (manual mode). */
    int32_t (*optimizer_zero_grad)(kiln_host_ctx *hctx, uint32_t index);
    /* toggle_optimizer: parameters owned only by OTHER optimizers get
     * KILN_PARAMF_FROZEN (requires_grad = False) until untoggle_optimizer;
     * a module's backward leaves frozen parameters' gradients untouched. */
    int32_t (*toggle_optimizer)(kiln_host_ctx *hctx, uint32_t index);
    int32_t (*untoggle_optimizer)(kiln_host_ctx *hctx, uint32_t index);
    /* -- 1.2: checkpoints on request (ModelCheckpoint-style callbacks) --
     * Ask for a checkpoint of the whole run (weights, every plugin's state,
     * loop progress) at `path` (absolute, or relative to the run
     * directory). It is written atomically at the next point where the loops
     * are consistent: the end of the current training batch (after its
     * validation and counters), or, when asked from on_train_epoch_end, the
     * end of that epoch. `kiln fit --ckpt PATH` resumes from any such file
     * exactly. KILN_E_STATE outside fit; KILN_E_IO (with a message) is
     * reported by the run when the write fails. */
    int32_t (*save_checkpoint)(kiln_host_ctx *hctx, const char *path);
    /* -- 1.2: collectives across the ranks of a distributed run, through the
     * strategy (plugins never load MPI or NCCL themselves). Every rank must
     * make the same calls in the same order. With one process they return at
     * once (reduce leaves values, all_gather copies, broadcast does
     * nothing). Host memory only. -- */
    int32_t (*barrier)(kiln_host_ctx *hctx, const char *name);
    /* op: KILN_REDUCE_SUM or KILN_REDUCE_MEAN over `n` doubles, in place */
    int32_t (*reduce)(kiln_host_ctx *hctx, double *values, uint32_t n, int32_t op);
    int32_t (*broadcast)(kiln_host_ctx *hctx, void *buf, size_t bytes, int32_t root);
    /* recv holds world_size * bytes, in rank order */
    int32_t (*all_gather)(kiln_host_ctx *hctx, const void *send, size_t bytes, void *recv);
    /* -- 1.4 (check svc->abi_minor >= 4 and the pointer) -- */
    /* The module's predict_step on `batch` (host memory), for callbacks
     * that run inference (text sampling): the precision plugin refreshes
     * the compute weights first, so the prediction uses the current
     * masters. KILN_E_UNSUPPORTED when the module has no predict_step. Any
     * activations the module kept for a backward are gone afterwards: call
     * it from hooks outside a training step (on_train_batch_end,
     * on_validation_end, on_fit_end, ...). *out as predict_step's. */
    int32_t (*predict)(kiln_host_ctx *hctx, const kiln_batch *batch, kiln_tensor *out);
    /* -- 1.5 (check svc->abi_minor >= 5 and the pointer) -- */
    /* The run's precision plugin rounds an activation the module has just
     * produced (kiln_precision_ops.round_activation): x(n) of `dtype` (F32
     * or F64) in accelerator memory, in place, as that precision stores
     * activations (FP8 with a per-tensor scale, say). `site` names the
     * tensor with the same string every step (kiln/nn.h: the producing
     * Linear's weight name, "<c_attn weight>:attention" for an attention
     * output). Returns KILN_OK without touching x when the precision has no
     * such op (every built-in one) or no run is set up. Modules call it in
     * every forward (training, validation, test, predict) on each Linear
     * layer's output and each attention output, after their own
     * compute-dtype rounding and before anything reads the tensor. */
    int32_t (*round_activation)(kiln_host_ctx *hctx, const char *site, uint32_t dtype, void *x, size_t n);
} kiln_host_services;

/* kiln_host_services.reduce ops (1.2) */
enum { KILN_REDUCE_SUM = 0, KILN_REDUCE_MEAN = 1 };

/* ---------------------------------------------------------------------------
 * The bootstrap struct the host passes to kiln_plugin_init_v1. FROZEN FOREVER
 * (its size and offsets are pinned below): it is how a plugin of any minor
 * asks for the services it needs. */
typedef struct kiln_host_base {
    uint32_t struct_size;
    uint16_t abi_major; /* host's major                                          */
    uint16_t abi_minor; /* host's minor                                          */
    const char *host_version; /* "0.1.0 (gcc 12.2.0)"                              */
    /* Services of major `major` with at least minor `min_minor`; NULL if this
     * host cannot provide them. Ask for the lowest minor you need. */
    const kiln_host_services *(*get_services)(uint16_t major, uint16_t min_minor);
    uint64_t known_capabilities; /* every KILN_CAP_* bit this host understands */
} kiln_host_base;

/* ---------------------------------------------------------------------------
 * The ops header every kind-specific ops table starts with. create and
 * destroy are mandatory; get_state/set_state are optional (NULL).
 *
 * create: `config` is the plugin's resolved section: every declared key
 *   present with its declared type (defaults filled in), NULL-terminated,
 *   valid until destroy. On failure return a negative status after
 *   svc->set_error(); *out must then be left NULL and nothing leaked.
 * get_state: serialise into memory from svc->alloc (the host frees it);
 *   *state_version is the plugin's own format number (independent of the ABI).
 * set_state: restore from a blob this plugin (any version it still accepts)
 *   wrote; KILN_E_STATE with a message for a version it cannot read. */
typedef struct kiln_ops_header {
    uint32_t struct_size; /* sizeof the whole kind-specific table as built   */
    uint32_t reserved;
    int32_t (*create)(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                      const kiln_kv *config, kiln_instance **out);
    void (*destroy)(kiln_instance *inst);
    int32_t (*get_state)(kiln_instance *inst, uint32_t *state_version, void **data, size_t *size);
    int32_t (*set_state)(kiln_instance *inst, uint32_t state_version, const void *data, size_t size);
} kiln_ops_header;

/* ---------------------------------------------------------------------------
 * A plugin descriptor (static, one per plugin).
 *
 * name: [a-z0-9][a-z0-9._-]{0,63}, unique per kind among loaded plugins.
 * properties: NULL-terminated typed facts the host reads without an instance.
 *   Keys the host knows have fixed types (a wrong type rejects the
 *   descriptor); unknown keys are kept and shown, never interpreted:
 *     aliases           STRING_LIST  other names this plugin answers to
 *     precision         STRING       precision plugins: e.g. "16-mixed"
 *     amp_backend       STRING       precision plugins: "native", "none", ...
 *     amp_level         STRING       precision plugins (may be absent)
 *     param_dtype, compute_dtype, grad_dtype   STRING  ("float32", "bfloat16")
 *     needs_grad_scaler BOOL
 *     bits_per_weight   FLOAT
 *     device_type       STRING       accelerators: "cpu", "cuda"
 *     distributed       BOOL         strategies
 * params: NULL-terminated config keys accepted in the plugin's run-file
 *   section (besides `name`), or NULL for none.
 * ops: the kind's ops table, starting with kiln_ops_header. */
typedef struct kiln_plugin_desc {
    uint32_t struct_size;
    uint32_t kind;          /* KILN_KIND_*                                       */
    const char *name;
    const char *version;    /* semver                                            */
    const char *description;
    uint64_t capabilities;  /* KILN_CAP_*                                        */
    const kiln_kv *properties;
    const kiln_param *params;
    const void *ops;
    void *plugin_ctx;       /* passed back to create()                           */
} kiln_plugin_desc;

/* The library descriptor kiln_plugin_init_v1 returns (static storage, valid
 * until the process exits). */
typedef struct kiln_library {
    uint32_t struct_size;
    uint16_t abi_major;       /* KILN_ABI_MAJOR the library was built against    */
    uint16_t abi_minor;       /* KILN_ABI_MINOR of the headers it was built with */
    uint16_t min_host_minor;  /* lowest host minor it runs on                    */
    uint16_t reserved0;
    uint32_t cuda_runtime_version; /* e.g. 12040, or 0 without CUDA              */
    const char *library_name;
    const char *library_version;
    const char *build_info;   /* free text: compiler, CUDA, architectures        */
    uint32_t plugin_count;    /* at most 256                                     */
    uint32_t reserved1;
    const kiln_plugin_desc *const *plugins;
    void (*library_fini)(void); /* optional; called once at host shutdown        */
    const void *reserved[4];  /* must be NULL                                    */
} kiln_library;

/* The one exported entry. Returns KILN_OK and sets *out, or a negative status
 * (after host->get_services(1, 0)->set_error(NULL, code, msg) when it can). */
typedef int32_t (*kiln_plugin_init_v1_fn)(const kiln_host_base *host, const kiln_library **out);
#define KILN_PLUGIN_ENTRY_V1 "kiln_plugin_init_v1"

/* ---------------------------------------------------------------------------
 * Layout pins. These are the 1.0 layouts on LP64; a change that moves any of
 * them is a major-version change. Appended members get their own pins. */
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
static_assert(sizeof(kiln_value) == 16, "kiln_value layout is frozen");
static_assert(sizeof(kiln_kv) == 24, "kiln_kv layout is frozen");
static_assert(offsetof(kiln_param, def) == 16 && sizeof(kiln_param) == 40, "kiln_param layout is frozen");
static_assert(offsetof(kiln_host_base, get_services) == 16 && sizeof(kiln_host_base) == 32,
              "kiln_host_base is frozen forever");
static_assert(offsetof(kiln_host_services, log) == 8, "kiln_host_services 1.0");
static_assert(offsetof(kiln_host_services, log_metric) == 56, "kiln_host_services 1.0");
static_assert(offsetof(kiln_host_services, accelerator) == 64, "kiln_host_services 1.1");
static_assert(offsetof(kiln_host_services, seed) == 120, "kiln_host_services 1.1");
static_assert(offsetof(kiln_host_services, optimizer_count) == 128 &&
                  offsetof(kiln_host_services, untoggle_optimizer) == 168,
              "kiln_host_services 1.2");
static_assert(offsetof(kiln_host_services, save_checkpoint) == 176 &&
                  offsetof(kiln_host_services, all_gather) == 208,
              "kiln_host_services 1.2");
static_assert(offsetof(kiln_host_services, predict) == 216, "kiln_host_services 1.4");
static_assert(offsetof(kiln_host_services, round_activation) == 224, "kiln_host_services 1.5");
static_assert(offsetof(kiln_ops_header, create) == 8 && offsetof(kiln_ops_header, set_state) == 32 &&
                  sizeof(kiln_ops_header) == 40, "kiln_ops_header 1.0");
static_assert(offsetof(kiln_plugin_desc, kind) == 4 && offsetof(kiln_plugin_desc, name) == 8 &&
                  offsetof(kiln_plugin_desc, capabilities) == 32 && offsetof(kiln_plugin_desc, ops) == 56 &&
                  offsetof(kiln_plugin_desc, plugin_ctx) == 64 && sizeof(kiln_plugin_desc) == 72,
              "kiln_plugin_desc 1.0");
static_assert(offsetof(kiln_library, cuda_runtime_version) == 12 && offsetof(kiln_library, plugin_count) == 40 &&
                  offsetof(kiln_library, plugins) == 48 && offsetof(kiln_library, library_fini) == 56 &&
                  sizeof(kiln_library) == 96, "kiln_library 1.0");
#endif

#ifdef __cplusplus
}
#endif

#endif /* KILN_PLUGIN_H */
