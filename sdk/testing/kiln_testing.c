/*
 * kiln_testing.c — the test host of kiln/testing.h (library kiln_testing):
 * a kiln_host_services table whose every call records into the
 * kiln_test_host behind its context, a loader that dlopen()s plugin files
 * as kiln does, a config resolver that checks "key = value" text against a
 * plugin's declared keys, and wrappers that call a plugin's kind ops after
 * checking the kind and the table's size. Everything a test host owns
 * (parameters, configs, records, instances) is freed by reset; loaded
 * libraries stay for the life of the process.
 */
#define _GNU_SOURCE
#include "kiln/testing.h"
#include "kiln/config_checks.h"

#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef KILN_TESTING_PLUGIN_REL
#define KILN_TESTING_PLUGIN_REL "kiln/plugins" /* <libdir>/kiln/plugins */
#endif

/* ---------------------------------------------------------------------------
 * Internal types. A plugin only sees `hctx`, which points back at its host. */

struct kiln_host_ctx {
    kiln_test_host *th;
};

typedef struct th_inst {
    kiln_instance *inst;
    const kiln_plugin_desc *desc;
} th_inst;

/* Everything a reset frees lives in growable arrays of these. */
typedef struct th_vec {
    void *items;
    size_t n, cap, elem;
} th_vec;

struct kiln_test_host {
    struct kiln_host_ctx hctx;
    pthread_mutex_t lock; /* log, set_error and log_value may come from any thread */
    char message[512];
    /* what the test set */
    const kiln_kv *config;
    kiln_instance *acc;
    const kiln_kernels *kernels;
    kiln_instance *own_acc; /* from kiln_test_use_accelerator: destroyed last */
    const kiln_plugin_desc *own_acc_desc;
    kiln_trainer_state trainer;
    uint64_t seed;
    int32_t log_level;
    int32_t checkpoint_status;
    kiln_test_trainer_hooks hooks;
    /* what the plugin did */
    char error[1024];
    int32_t error_code;
    th_vec log;       /* kiln_test_log_line, text malloc'ed  */
    th_vec logged;    /* kiln_test_value, name malloc'ed     */
    th_vec ckpts;     /* char *                              */
    int stops;
    char stop_reason[256];
    kiln_test_counts counts;
    /* what the host owns */
    th_vec params;    /* kiln_parameter * (stable addresses) */
    th_vec instances; /* th_inst                             */
    th_vec blocks;    /* void *: configs and their strings   */
};

/* ---------------------------------------------------------------------------
 * Small helpers */

static int th_vec_push(th_vec *v, const void *item) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        void *p = realloc(v->items, cap * v->elem);
        if (!p) return -1;
        v->items = p;
        v->cap = cap;
    }
    memcpy((char *)v->items + v->n * v->elem, item, v->elem);
    v->n++;
    return 0;
}

static void *th_vec_at(const th_vec *v, size_t i) { return (char *)v->items + i * v->elem; }

static void th_vec_free(th_vec *v) {
    free(v->items);
    v->items = NULL;
    v->n = v->cap = 0;
}

static char *th_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Record a harness failure (one line) and return `rc`. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int32_t th_fail(kiln_test_host *th, int32_t rc, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (char *c = buf; *c; c++)
        if (*c == '\n') *c = ' ';
    if (th) snprintf(th->message, sizeof th->message, "%s", buf);
    fprintf(stderr, "kiln-testing: %s\n", buf);
    return rc;
}

static kiln_test_host *th_of(kiln_host_ctx *h) { return h ? h->th : NULL; }

/* Errors reported with a NULL context (during kiln_plugin_init_v1) land
 * here, so that kiln_test_open can quote them. */
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_init_error[512];

/* ---------------------------------------------------------------------------
 * The services */

static void s_log(kiln_host_ctx *h, int32_t level, const char *msg) {
    kiln_test_host *th = th_of(h);
    if (!msg) msg = "";
    if (level >= KILN_LOG_WARN || getenv("KILN_TEST_VERBOSE"))
        fprintf(stderr, "kiln-testing: plugin %s: %s\n",
                level >= KILN_LOG_ERROR ? "error" : level == KILN_LOG_WARN ? "warning"
                                                   : level == KILN_LOG_INFO ? "info" : "debug", msg);
    if (!th) return;
    kiln_test_log_line l = {level, th_strdup(msg)};
    if (!l.text) return;
    pthread_mutex_lock(&th->lock);
    if (th_vec_push(&th->log, &l)) free((void *)l.text);
    pthread_mutex_unlock(&th->lock);
}

static int32_t s_log_enabled(kiln_host_ctx *h, int32_t level) {
    kiln_test_host *th = th_of(h);
    return level >= (th ? th->log_level : KILN_LOG_INFO);
}

static void s_set_error(kiln_host_ctx *h, int32_t code, const char *msg) {
    kiln_test_host *th = th_of(h);
    if (!th) {
        pthread_mutex_lock(&g_init_lock);
        snprintf(g_init_error, sizeof g_init_error, "%s", msg ? msg : "");
        pthread_mutex_unlock(&g_init_lock);
        return;
    }
    pthread_mutex_lock(&th->lock);
    th->error_code = code;
    snprintf(th->error, sizeof th->error, "%s", msg ? msg : "");
    pthread_mutex_unlock(&th->lock);
}

static void *s_alloc(kiln_host_ctx *h, size_t size, size_t align) {
    (void)h;
    void *p = NULL;
    if (align < 16) align = 16;
    return posix_memalign(&p, align, size ? size : 1) == 0 ? p : NULL;
}

static void s_free(kiln_host_ctx *h, void *p) {
    (void)h;
    free(p);
}

static int32_t s_config_get(kiln_host_ctx *h, const char *key, kiln_value *out) {
    kiln_test_host *th = th_of(h);
    const kiln_value *v = th && key ? kiln_kv_find(th->config, key) : NULL;
    if (!v) return KILN_E_NOT_FOUND;
    *out = *v;
    return KILN_OK;
}

static void th_record_value(kiln_test_host *th, const char *name, double value, uint32_t flags, double weight,
                            int64_t step, int32_t source) {
    if (!th || !name) return;
    kiln_test_value v = {th_strdup(name), value, flags, weight, step, source};
    if (!v.name) return;
    pthread_mutex_lock(&th->lock);
    if (th_vec_push(&th->logged, &v)) free((void *)v.name);
    pthread_mutex_unlock(&th->lock);
}

static void s_log_metric(kiln_host_ctx *h, const char *name, double value, int64_t step) {
    th_record_value(th_of(h), name, value, KILN_LOG_ON_STEP, 1.0, step, KILN_TEST_LOG_METRIC);
}

static int32_t s_accelerator(kiln_host_ctx *h, kiln_instance **acc, const kiln_kernels **k) {
    kiln_test_host *th = th_of(h);
    if (!th || !th->kernels) return KILN_E_NOT_FOUND;
    *acc = th->acc;
    *k = th->kernels;
    return KILN_OK;
}

static int32_t th_register(kiln_test_host *th, const char *name, uint32_t ndim, const int64_t *shape,
                           uint32_t flags, uint32_t dtype, kiln_parameter **out) {
    if (!th || !name || !shape || !out || ndim == 0 || ndim > KILN_MAX_DIMS) return KILN_E_INVALID_ARG;
    if (dtype != KILN_DTYPE_F32 && dtype != KILN_DTYPE_F64) return KILN_E_INVALID_ARG;
    kiln_parameter *p = calloc(1, sizeof *p);
    char *nm = th_strdup(name);
    if (!p || !nm || th_vec_push(&th->params, &p)) {
        free(p);
        free(nm);
        return KILN_E_NOMEM;
    }
    p->struct_size = sizeof *p;
    p->flags = flags;
    p->name = nm;
    p->ndim = ndim;
    p->numel = 1;
    for (uint32_t i = 0; i < KILN_MAX_DIMS; i++) p->shape[i] = i < ndim ? shape[i] : 1;
    for (uint32_t i = 0; i < ndim; i++) p->numel *= shape[i];
    p->compute_dtype = KILN_DTYPE_F32;
    p->param_dtype = dtype;
    *out = p;
    return KILN_OK;
}

static int32_t s_param_register(kiln_host_ctx *h, const char *name, uint32_t ndim, const int64_t *shape,
                                uint32_t flags, kiln_parameter **out) {
    return th_register(th_of(h), name, ndim, shape, flags, KILN_DTYPE_F32, out);
}

static int32_t s_params(kiln_host_ctx *h, kiln_parameter *const **list, uint32_t *n) {
    kiln_test_host *th = th_of(h);
    if (!th) return KILN_E_INVALID_ARG;
    *list = kiln_test_params(th);
    *n = (uint32_t)th->params.n;
    return KILN_OK;
}

static const kiln_trainer_state *s_trainer_state(kiln_host_ctx *h) {
    kiln_test_host *th = th_of(h);
    return th ? &th->trainer : NULL;
}

static void s_log_value(kiln_host_ctx *h, const char *name, double value, uint32_t flags, double weight) {
    th_record_value(th_of(h), name, value, flags, weight, -1, KILN_TEST_LOG_VALUE);
}

static int32_t s_get_metric(kiln_host_ctx *h, const char *name, double *out) {
    kiln_test_host *th = th_of(h);
    if (!th || !name) return KILN_E_NOT_FOUND;
    for (size_t i = th->logged.n; i-- > 0;) {
        const kiln_test_value *v = th_vec_at(&th->logged, i);
        if (!strcmp(v->name, name)) {
            *out = v->value;
            return KILN_OK;
        }
    }
    return KILN_E_NOT_FOUND;
}

static void s_request_stop(kiln_host_ctx *h, const char *reason) {
    kiln_test_host *th = th_of(h);
    if (!th) return;
    th->stops++;
    snprintf(th->stop_reason, sizeof th->stop_reason, "%s", reason ? reason : "");
}

/* The same derivation for the same run seed and stream, as kiln promises. */
static uint64_t s_seed(kiln_host_ctx *h, const char *stream) {
    kiln_test_host *th = th_of(h);
    uint64_t x = (th ? th->seed : 0) ^ 0x9E3779B97F4A7C15ull;
    for (const char *c = stream ? stream : ""; *c; c++) x = (x ^ (uint8_t)*c) * 0x100000001B3ull;
    return x;
}

static uint32_t s_optimizer_count(kiln_host_ctx *h) {
    kiln_test_host *th = th_of(h);
    return th ? th->hooks.n_optimizers : 0;
}
static int32_t s_manual_backward(kiln_host_ctx *h, double loss) {
    kiln_test_host *th = th_of(h);
    return th && th->hooks.manual_backward ? th->hooks.manual_backward(th->hooks.ctx, loss) : KILN_E_UNSUPPORTED;
}
static int32_t s_optimizer_step(kiln_host_ctx *h, uint32_t i, const kiln_closure *c, int32_t *skipped) {
    kiln_test_host *th = th_of(h);
    return th && th->hooks.optimizer_step ? th->hooks.optimizer_step(th->hooks.ctx, i, c, skipped)
                                          : KILN_E_UNSUPPORTED;
}
static int32_t s_optimizer_zero_grad(kiln_host_ctx *h, uint32_t i) {
    kiln_test_host *th = th_of(h);
    return th && th->hooks.optimizer_zero_grad ? th->hooks.optimizer_zero_grad(th->hooks.ctx, i)
                                               : KILN_E_UNSUPPORTED;
}
static int32_t s_toggle(kiln_host_ctx *h, uint32_t i) {
    kiln_test_host *th = th_of(h);
    return th && th->hooks.toggle ? th->hooks.toggle(th->hooks.ctx, i, 1) : KILN_E_UNSUPPORTED;
}
static int32_t s_untoggle(kiln_host_ctx *h, uint32_t i) {
    kiln_test_host *th = th_of(h);
    return th && th->hooks.toggle ? th->hooks.toggle(th->hooks.ctx, i, 0) : KILN_E_UNSUPPORTED;
}

static int32_t s_save_checkpoint(kiln_host_ctx *h, const char *path) {
    kiln_test_host *th = th_of(h);
    if (!th || !path) return KILN_E_INVALID_ARG;
    char *p = th_strdup(path);
    if (!p || th_vec_push(&th->ckpts, &p)) {
        free(p);
        return KILN_E_NOMEM;
    }
    return th->checkpoint_status;
}

/* Collectives of one process. */
static int32_t s_barrier(kiln_host_ctx *h, const char *name) {
    (void)h, (void)name;
    return KILN_OK;
}
static int32_t s_reduce(kiln_host_ctx *h, double *v, uint32_t n, int32_t op) {
    (void)h, (void)v, (void)n;
    return op == KILN_REDUCE_SUM || op == KILN_REDUCE_MEAN ? KILN_OK : KILN_E_INVALID_ARG;
}
static int32_t s_broadcast(kiln_host_ctx *h, void *buf, size_t bytes, int32_t root) {
    (void)h, (void)buf, (void)bytes;
    return root == 0 ? KILN_OK : KILN_E_INVALID_ARG;
}
static int32_t s_all_gather(kiln_host_ctx *h, const void *send, size_t bytes, void *recv) {
    (void)h;
    if (bytes) memmove(recv, send, bytes);
    return KILN_OK;
}

static int32_t s_predict(kiln_host_ctx *h, const kiln_batch *batch, kiln_tensor *out) {
    kiln_test_host *th = th_of(h);
    return th && th->hooks.predict ? th->hooks.predict(th->hooks.ctx, batch, out) : KILN_E_UNSUPPORTED;
}

static const kiln_host_services g_services = {
    .struct_size = sizeof(kiln_host_services),
    .abi_major = KILN_ABI_MAJOR,
    .abi_minor = KILN_ABI_MINOR,
    .log = s_log,
    .log_enabled = s_log_enabled,
    .set_error = s_set_error,
    .alloc = s_alloc,
    .free = s_free,
    .config_get = s_config_get,
    .log_metric = s_log_metric,
    .accelerator = s_accelerator,
    .param_register = s_param_register,
    .params = s_params,
    .trainer_state = s_trainer_state,
    .log_value = s_log_value,
    .get_metric = s_get_metric,
    .request_stop = s_request_stop,
    .seed = s_seed,
    .optimizer_count = s_optimizer_count,
    .manual_backward = s_manual_backward,
    .optimizer_step = s_optimizer_step,
    .optimizer_zero_grad = s_optimizer_zero_grad,
    .toggle_optimizer = s_toggle,
    .untoggle_optimizer = s_untoggle,
    .save_checkpoint = s_save_checkpoint,
    .barrier = s_barrier,
    .reduce = s_reduce,
    .broadcast = s_broadcast,
    .all_gather = s_all_gather,
    .predict = s_predict,
};

static const kiln_host_services *s_get_services(uint16_t major, uint16_t min_minor) {
    return major == KILN_ABI_MAJOR && min_minor <= KILN_ABI_MINOR ? &g_services : NULL;
}

static const kiln_host_base g_base = {sizeof(kiln_host_base), KILN_ABI_MAJOR, KILN_ABI_MINOR, "kiln-testing",
                                      s_get_services, KILN_CAP_KNOWN_1_0};

const kiln_host_services *kiln_test_services(kiln_test_host *th) {
    (void)th;
    return &g_services;
}

kiln_host_ctx *kiln_test_hctx(kiln_test_host *th) { return th ? &th->hctx : NULL; }

/* ---------------------------------------------------------------------------
 * Host lifetime */

static void th_defaults(kiln_test_host *th) {
    memset(&th->trainer, 0, sizeof th->trainer);
    th->trainer.struct_size = sizeof th->trainer;
    th->trainer.automatic_optimization = 1;
    th->trainer.world_size = 1;
    th->trainer.accumulate_grad_batches = 1;
    th->log_level = KILN_LOG_INFO;
    th->checkpoint_status = KILN_OK;
    th->counts.last_loss = NAN;
}

int32_t kiln_test_host_new(kiln_test_host **out) {
    if (!out) return th_fail(NULL, KILN_E_INVALID_ARG, "kiln_test_host_new: out is NULL");
    *out = NULL;
    kiln_test_host *th = calloc(1, sizeof *th);
    if (!th) return th_fail(NULL, KILN_E_NOMEM, "kiln_test_host_new: out of memory");
    th->hctx.th = th;
    pthread_mutex_init(&th->lock, NULL);
    th->log.elem = sizeof(kiln_test_log_line);
    th->logged.elem = sizeof(kiln_test_value);
    th->ckpts.elem = sizeof(char *);
    th->params.elem = sizeof(kiln_parameter *);
    th->instances.elem = sizeof(th_inst);
    th->blocks.elem = sizeof(void *);
    th_defaults(th);
    *out = th;
    return KILN_OK;
}

static void th_destroy_instances(kiln_test_host *th) {
    /* newest first: a later instance may hold memory of an earlier one */
    for (size_t i = th->instances.n; i-- > 0;) {
        th_inst *e = th_vec_at(&th->instances, i);
        const kiln_ops_header *ops = e->desc->ops;
        if (e->inst && ops->destroy) ops->destroy(e->inst);
    }
    th->instances.n = 0;
    if (th->own_acc) {
        const kiln_ops_header *ops = th->own_acc_desc->ops;
        ops->destroy(th->own_acc);
    }
    th->own_acc = NULL;
    th->own_acc_desc = NULL;
}

static void th_free_records(kiln_test_host *th) {
    for (size_t i = 0; i < th->log.n; i++) free((void *)((kiln_test_log_line *)th_vec_at(&th->log, i))->text);
    for (size_t i = 0; i < th->logged.n; i++) free((void *)((kiln_test_value *)th_vec_at(&th->logged, i))->name);
    for (size_t i = 0; i < th->ckpts.n; i++) free(*(char **)th_vec_at(&th->ckpts, i));
    for (size_t i = 0; i < th->params.n; i++) {
        kiln_parameter *p = *(kiln_parameter **)th_vec_at(&th->params, i);
        free((void *)p->name);
        free(p->data);
        free(p->grad);
        free(p);
    }
    for (size_t i = 0; i < th->blocks.n; i++) free(*(void **)th_vec_at(&th->blocks, i));
    th->log.n = th->logged.n = th->ckpts.n = th->params.n = th->blocks.n = 0;
}

int32_t kiln_test_reset(kiln_test_host *th) {
    if (!th) return th_fail(NULL, KILN_E_INVALID_ARG, "kiln_test_reset: no host");
    th_destroy_instances(th);
    th_free_records(th);
    th->config = NULL;
    th->acc = NULL;
    th->kernels = NULL;
    th->seed = 0;
    th->error[0] = 0;
    th->error_code = 0;
    th->message[0] = 0;
    th->stops = 0;
    th->stop_reason[0] = 0;
    memset(&th->hooks, 0, sizeof th->hooks);
    memset(&th->counts, 0, sizeof th->counts);
    th_defaults(th);
    return KILN_OK;
}

void kiln_test_host_free(kiln_test_host *th) {
    if (!th) return;
    th_destroy_instances(th);
    th_free_records(th);
    th_vec_free(&th->log);
    th_vec_free(&th->logged);
    th_vec_free(&th->ckpts);
    th_vec_free(&th->params);
    th_vec_free(&th->instances);
    th_vec_free(&th->blocks);
    pthread_mutex_destroy(&th->lock);
    free(th);
}

const char *kiln_test_message(const kiln_test_host *th) { return th ? th->message : ""; }

/* ---------------------------------------------------------------------------
 * Loading. One init per file and process: a library's static state (its
 * services pointer) is shared by every host, as it would be in kiln. */

typedef struct th_lib {
    char *path;
    const kiln_library *lib;
    struct th_lib *next;
} th_lib;
static th_lib *g_libs;
static pthread_mutex_t g_libs_lock = PTHREAD_MUTEX_INITIALIZER;

int32_t kiln_test_plugin_path(kiln_test_host *th, const char *lib, char *buf, size_t size) {
    if (!lib || !buf || !size) return th_fail(th, KILN_E_INVALID_ARG, "kiln_test_plugin_path: NULL argument");
    char dir[PATH_MAX];
    const char *env = getenv("KILN_PLUGIN_DIR");
    if (env && *env) {
        snprintf(dir, sizeof dir, "%s", env);
    } else {
        /* this library's own directory: <libdir>/libkiln_testing.so */
        Dl_info info;
        if (!dladdr((void *)&kiln_test_plugin_path, &info) || !info.dli_fname)
            return th_fail(th, KILN_E_NOT_FOUND, "plugin %s: KILN_PLUGIN_DIR is not set and kiln_testing cannot "
                                                 "find its own directory", lib);
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        size_t l = strlen(dir);
        snprintf(dir + l, sizeof dir - l, "/%s", KILN_TESTING_PLUGIN_REL);
    }
    int n = snprintf(buf, size, "%s/libkiln-%s.so", dir, lib);
    if (n < 0 || (size_t)n >= size) return th_fail(th, KILN_E_INVALID_ARG, "plugin %s: path longer than the buffer", lib);
    struct stat st;
    if (stat(buf, &st) != 0)
        return th_fail(th, KILN_E_NOT_FOUND, "plugin %s: no file %s (set KILN_PLUGIN_DIR to its directory)", lib, buf);
    return KILN_OK;
}

int32_t kiln_test_open(kiln_test_host *th, const char *path, const kiln_library **out) {
    if (!path || !out) return th_fail(th, KILN_E_INVALID_ARG, "kiln_test_open: NULL argument");
    *out = NULL;
    pthread_mutex_lock(&g_libs_lock);
    for (th_lib *l = g_libs; l; l = l->next)
        if (!strcmp(l->path, path)) {
            *out = l->lib;
            pthread_mutex_unlock(&g_libs_lock);
            return KILN_OK;
        }
    int32_t rc = KILN_OK;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        rc = th_fail(th, KILN_E_NOT_FOUND, "%s", dlerror());
        goto done;
    }
    kiln_plugin_init_v1_fn init;
    void *sym = dlsym(h, KILN_PLUGIN_ENTRY_V1);
    if (!sym) {
        rc = th_fail(th, KILN_E_NOT_FOUND, "%s: no %s (not a kiln plugin library)", path, KILN_PLUGIN_ENTRY_V1);
        goto done;
    }
    memcpy(&init, &sym, sizeof init);
    const kiln_library *lib = NULL;
    pthread_mutex_lock(&g_init_lock);
    g_init_error[0] = 0;
    pthread_mutex_unlock(&g_init_lock);
    rc = init(&g_base, &lib);
    if (rc != KILN_OK || !lib) {
        pthread_mutex_lock(&g_init_lock);
        rc = th_fail(th, rc ? rc : KILN_E_INTERNAL, "%s: %s failed (%s)%s%s", path, KILN_PLUGIN_ENTRY_V1,
                     kiln_status_name(rc), g_init_error[0] ? ": " : "", g_init_error);
        pthread_mutex_unlock(&g_init_lock);
        goto done;
    }
    if (lib->abi_major != KILN_ABI_MAJOR || lib->struct_size < sizeof(kiln_library)) {
        rc = th_fail(th, KILN_E_VERSION, "%s: library built for ABI %u (this host is %d.%d)", path,
                     (unsigned)lib->abi_major, KILN_ABI_MAJOR, KILN_ABI_MINOR);
        goto done;
    }
    th_lib *l = calloc(1, sizeof *l);
    if (!l || !(l->path = th_strdup(path))) {
        free(l);
        rc = th_fail(th, KILN_E_NOMEM, "kiln_test_open: out of memory");
        goto done;
    }
    l->lib = lib;
    l->next = g_libs;
    g_libs = l;
    *out = lib;
    /* the handle stays open, as in kiln */
done:
    pthread_mutex_unlock(&g_libs_lock);
    return rc;
}

static int th_desc_has_alias(const kiln_plugin_desc *d, const char *name) {
    const kiln_value *a = kiln_kv_find(d->properties, "aliases");
    if (!a || a->type != KILN_TYPE_STRING_LIST) return 0;
    for (uint32_t i = 0; i < a->count; i++)
        if (a->v.sl[i] && !strcmp(a->v.sl[i], name)) return 1;
    return 0;
}

int32_t kiln_test_load(kiln_test_host *th, const char *path, uint32_t kind, const char *name,
                       const kiln_plugin_desc **out) {
    if (!out || !name) return th_fail(th, KILN_E_INVALID_ARG, "kiln_test_load: NULL argument");
    *out = NULL;
    const kiln_library *lib;
    int32_t rc = kiln_test_open(th, path, &lib);
    if (rc) return rc;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < lib->plugin_count; i++) {
            const kiln_plugin_desc *d = lib->plugins[i];
            if (d->kind == kind && (pass ? th_desc_has_alias(d, name) : !strcmp(d->name, name))) {
                *out = d;
                return KILN_OK;
            }
        }
    return th_fail(th, KILN_E_NOT_FOUND, "%s has no plugin \"%s\" of kind %u", path, name, (unsigned)kind);
}

/* ---------------------------------------------------------------------------
 * Config text. Values are parsed by the declared type of their key. */

static void *th_keep(kiln_test_host *th, size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (p && th_vec_push(&th->blocks, &p)) {
        free(p);
        return NULL;
    }
    return p;
}

static const char *th_skip_ws(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    return s;
}

/* One scalar token of `text` starting at *s: a "quoted string" or the run
 * up to a separator. Returned in kept memory; *quoted says which. */
static char *th_token(kiln_test_host *th, const char **s, const char *stops, int *quoted) {
    const char *p = th_skip_ws(*s);
    *quoted = *p == '"';
    if (*quoted) {
        const char *e = strchr(p + 1, '"');
        if (!e) return NULL;
        char *t = th_keep(th, (size_t)(e - p));
        if (t) memcpy(t, p + 1, (size_t)(e - p - 1));
        *s = e + 1;
        return t;
    }
    const char *e = p;
    while (*e && !strchr(stops, *e)) e++;
    const char *end = e;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) end--;
    char *t = th_keep(th, (size_t)(end - p) + 1);
    if (t) memcpy(t, p, (size_t)(end - p));
    *s = e;
    return t;
}

static int th_parse_int(const char *t, int64_t *out) {
    char *e;
    if (!*t) return -1;
    long long v = strtoll(t, &e, 0);
    if (*e) return -1;
    *out = v;
    return 0;
}

static int th_parse_float(const char *t, double *out) {
    char *e;
    if (!*t) return -1;
    double v = strtod(t, &e);
    if (*e) return -1;
    *out = v;
    return 0;
}

static int th_parse_scalar(uint32_t type, const char *t, int quoted, kiln_value *v) {
    v->type = type;
    v->count = 0;
    switch (type) {
    case KILN_TYPE_BOOL:
        if (quoted) return -1;
        if (!strcmp(t, "true")) v->v.i = 1;
        else if (!strcmp(t, "false")) v->v.i = 0;
        else return -1;
        return 0;
    case KILN_TYPE_INT: return quoted ? -1 : th_parse_int(t, &v->v.i);
    case KILN_TYPE_FLOAT: return quoted ? -1 : th_parse_float(t, &v->v.f);
    case KILN_TYPE_STRING: v->v.s = t; return 0;
    default: return -1;
    }
}

static int32_t th_parse_value(kiln_test_host *th, const char *key, uint32_t type, const char **s, kiln_value *v) {
    int quoted;
    const char *p = th_skip_ws(*s);
    if (type == KILN_TYPE_INT_LIST || type == KILN_TYPE_FLOAT_LIST || type == KILN_TYPE_STRING_LIST) {
        if (*p != '[') return th_fail(th, KILN_E_CONFIG, "config key %s: expected a [list]", key);
        p++;
        size_t cap = 8, n = 0;
        size_t esz = type == KILN_TYPE_STRING_LIST ? sizeof(char *) : 8;
        char *items = th_keep(th, cap * esz);
        if (!items) return th_fail(th, KILN_E_NOMEM, "config: out of memory");
        p = th_skip_ws(p);
        if (*p == ']') p++;
        else
            for (;;) {
                char *t = th_token(th, &p, ",]\n;", &quoted);
                if (!t) return th_fail(th, KILN_E_CONFIG, "config key %s: bad list item", key);
                if (n == cap) {
                    char *bigger = th_keep(th, cap * 2 * esz);
                    if (!bigger) return th_fail(th, KILN_E_NOMEM, "config: out of memory");
                    memcpy(bigger, items, cap * esz);
                    items = bigger;
                    cap *= 2;
                }
                kiln_value one;
                uint32_t et = type == KILN_TYPE_INT_LIST ? KILN_TYPE_INT
                              : type == KILN_TYPE_FLOAT_LIST ? KILN_TYPE_FLOAT : KILN_TYPE_STRING;
                if (th_parse_scalar(et, t, quoted, &one))
                    return th_fail(th, KILN_E_CONFIG, "config key %s: bad list item \"%s\"", key, t);
                if (et == KILN_TYPE_INT) ((int64_t *)(void *)items)[n] = one.v.i;
                else if (et == KILN_TYPE_FLOAT) ((double *)(void *)items)[n] = one.v.f;
                else ((const char **)(void *)items)[n] = one.v.s;
                n++;
                p = th_skip_ws(p);
                if (*p == ',') { p++; continue; }
                if (*p == ']') { p++; break; }
                return th_fail(th, KILN_E_CONFIG, "config key %s: unterminated list", key);
            }
        v->type = type;
        v->count = (uint32_t)n;
        if (type == KILN_TYPE_INT_LIST) v->v.il = (const int64_t *)(void *)items;
        else if (type == KILN_TYPE_FLOAT_LIST) v->v.fl = (const double *)(void *)items;
        else v->v.sl = (const char *const *)(void *)items;
        *s = p;
        return KILN_OK;
    }
    char *t = th_token(th, &p, ";\n", &quoted);
    if (!t) return th_fail(th, KILN_E_CONFIG, "config key %s: unterminated string", key);
    /* an int where a float is declared is fine, as in a run file */
    if (th_parse_scalar(type, t, quoted, v))
        return th_fail(th, KILN_E_CONFIG, "config key %s: \"%s\" is not %s", key, t,
                       type == KILN_TYPE_BOOL ? "true or false" : type == KILN_TYPE_INT ? "an integer"
                                                                : type == KILN_TYPE_FLOAT ? "a number" : "a value");
    *s = p;
    return KILN_OK;
}

int32_t kiln_test_config(kiln_test_host *th, const kiln_plugin_desc *d, const char *text, const kiln_kv **out) {
    if (!th || !d || !out) return th_fail(th, KILN_E_INVALID_ARG, "kiln_test_config: NULL argument");
    *out = NULL;
    size_t np = 0;
    for (const kiln_param *p = d->params; p && p->key; p++) np++;
    kiln_kv *kv = th_keep(th, (np + 1) * sizeof *kv);
    int *set = th_keep(th, (np + 1) * sizeof *set);
    if (!kv || !set) return th_fail(th, KILN_E_NOMEM, "config: out of memory");
    const char *s = text ? text : "";
    for (;;) {
        s = th_skip_ws(s);
        while (*s == ';' || *s == '\n') s = th_skip_ws(s + 1);
        if (!*s) break;
        const char *k = s;
        while (*s && *s != '=' && *s != ';' && *s != '\n' && *s != ' ' && *s != '\t') s++;
        size_t klen = (size_t)(s - k);
        s = th_skip_ws(s);
        if (*s != '=' || klen == 0)
            return th_fail(th, KILN_E_CONFIG, "config: expected key = value near \"%.20s\"", k);
        s++;
        size_t i = 0;
        for (; i < np; i++)
            if (strlen(d->params[i].key) == klen && !strncmp(d->params[i].key, k, klen)) break;
        if (i == np) return th_fail(th, KILN_E_CONFIG, "config: %s declares no key \"%.*s\"", d->name, (int)klen, k);
        if (set[i]) return th_fail(th, KILN_E_CONFIG, "config: key %s set twice", d->params[i].key);
        int32_t rc = th_parse_value(th, d->params[i].key, d->params[i].type, &s, &kv[i].value);
        if (rc) return rc;
        set[i] = 1;
        s = th_skip_ws(s);
        if (*s && *s != ';' && *s != '\n')
            return th_fail(th, KILN_E_CONFIG, "config key %s: unexpected text \"%.20s\"", d->params[i].key, s);
    }
    /* declared order, defaults filled, unset keys without a default left out */
    size_t n = 0;
    for (size_t i = 0; i < np; i++) {
        const kiln_param *p = &d->params[i];
        kiln_value v = kv[i].value;
        if (!set[i]) {
            if (p->flags & KILN_PARAM_REQUIRED)
                return th_fail(th, KILN_E_CONFIG, "config: %s requires key %s", d->name, p->key);
            if (p->def.type == KILN_TYPE_NONE) continue;
            v = p->def;
            if (p->type == KILN_TYPE_FLOAT && v.type == KILN_TYPE_INT) {
                v.type = KILN_TYPE_FLOAT;
                v.v.f = (double)p->def.v.i;
            }
        }
        kv[n].key = p->key;
        kv[n].value = v;
        n++;
    }
    kv[n].key = NULL;
    *out = kv;
    return KILN_OK;
}

int32_t kiln_test_set_config(kiln_test_host *th, const kiln_kv *config) {
    if (!th) return th_fail(NULL, KILN_E_INVALID_ARG, "kiln_test_set_config: no host");
    th->config = config;
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Instances */

int32_t kiln_test_create(kiln_test_host *th, const kiln_plugin_desc *d, const kiln_kv *config, kiln_instance **out) {
    if (!th || !d || !out) return th_fail(th, KILN_E_INVALID_ARG, "kiln_test_create: NULL argument");
    *out = NULL;
    const kiln_ops_header *ops = d->ops;
    if (!ops || !ops->create || !ops->destroy)
        return th_fail(th, KILN_E_INVALID_ARG, "plugin %s: no create/destroy in its ops", d->name);
    static const kiln_kv empty[1] = {{NULL, KILN_V_NONE}};
    /* the plugin's config_checks (1.5), as kiln applies them before create */
    char rule_why[1024];
    if (kiln_config_rules_validate(d->properties, d->params, rule_why, sizeof rule_why))
        return th_fail(th, KILN_E_CONFIG, "plugin %s: %s", d->name, rule_why);
    if (kiln_config_rules_check(d->properties, config ? config : empty, rule_why, sizeof rule_why))
        return th_fail(th, KILN_E_CONFIG, "plugin %s: config %s", d->name, rule_why);
    kiln_instance *inst = NULL;
    int32_t rc = ops->create(d->plugin_ctx, &g_services, &th->hctx, config ? config : empty, &inst);
    if (rc != KILN_OK) {
        if (inst) return th_fail(th, KILN_E_INTERNAL, "plugin %s: create failed (%s) but set *out", d->name,
                                 kiln_status_name(rc));
        return th_fail(th, rc, "plugin %s: create: %s: %s", d->name, kiln_status_name(rc),
                       th->error[0] ? th->error : "(no message)");
    }
    if (!inst) return th_fail(th, KILN_E_INTERNAL, "plugin %s: create returned KILN_OK without an instance", d->name);
    th_inst e = {inst, d};
    if (th_vec_push(&th->instances, &e)) {
        ops->destroy(inst);
        return th_fail(th, KILN_E_NOMEM, "kiln_test_create: out of memory");
    }
    *out = inst;
    return KILN_OK;
}

int32_t kiln_test_create_text(kiln_test_host *th, const kiln_plugin_desc *d, const char *text, kiln_instance **out) {
    if (out) *out = NULL;
    const kiln_kv *kv;
    int32_t rc = kiln_test_config(th, d, text, &kv);
    return rc ? rc : kiln_test_create(th, d, kv, out);
}

static th_inst *th_find(kiln_test_host *th, const kiln_instance *inst) {
    for (size_t i = 0; th && i < th->instances.n; i++) {
        th_inst *e = th_vec_at(&th->instances, i);
        if (e->inst == inst) return e;
    }
    return NULL;
}

const kiln_plugin_desc *kiln_test_desc_of(kiln_test_host *th, const kiln_instance *inst) {
    th_inst *e = th_find(th, inst);
    return e ? e->desc : NULL;
}

int32_t kiln_test_destroy(kiln_test_host *th, kiln_instance *inst) {
    th_inst *e = th_find(th, inst);
    if (!e) return th_fail(th, KILN_E_INVALID_ARG, "kiln_test_destroy: not an instance kiln_test_create made");
    const kiln_ops_header *ops = e->desc->ops;
    ops->destroy(inst);
    size_t i = (size_t)(e - (th_inst *)th->instances.items);
    memmove(e, e + 1, (th->instances.n - i - 1) * sizeof *e);
    th->instances.n--;
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Accelerator, trainer, seed */

int32_t kiln_test_use_accelerator(kiln_test_host *th, const char *path, const char *name, const char *config_text,
                                  int32_t threads) {
    if (!th) return th_fail(NULL, KILN_E_INVALID_ARG, "kiln_test_use_accelerator: no host");
    char buf[PATH_MAX];
    if (!path) {
        int32_t rc = kiln_test_plugin_path(th, "cpu", buf, sizeof buf);
        if (rc) return rc;
        path = buf;
    }
    const kiln_plugin_desc *d;
    int32_t rc = kiln_test_load(th, path, KILN_KIND_ACCELERATOR, name ? name : "cpu", &d);
    if (rc) return rc;
    const kiln_kv *kv;
    if ((rc = kiln_test_config(th, d, config_text, &kv))) return rc;
    const kiln_accelerator_ops *ops = d->ops;
    kiln_instance *acc = NULL;
    rc = ops->base.create(d->plugin_ctx, &g_services, &th->hctx, kv, &acc);
    if (rc || !acc) return th_fail(th, rc ? rc : KILN_E_INTERNAL, "accelerator %s: create: %s", d->name, th->error);
    if (ops->configure && (rc = ops->configure(acc, threads, 0))) {
        ops->base.destroy(acc);
        return th_fail(th, rc, "accelerator %s: configure: %s", d->name, th->error);
    }
    const kiln_kernels *k = ops->kernels ? ops->kernels(acc) : NULL;
    if (!k) {
        ops->base.destroy(acc);
        return th_fail(th, KILN_E_INTERNAL, "accelerator %s: no kernel table", d->name);
    }
    if (th->own_acc) ((const kiln_ops_header *)th->own_acc_desc->ops)->destroy(th->own_acc);
    th->own_acc = acc;
    th->own_acc_desc = d;
    th->acc = acc;
    th->kernels = k;
    return KILN_OK;
}

int32_t kiln_test_set_accelerator(kiln_test_host *th, kiln_instance *acc, const kiln_kernels *kernels) {
    if (!th) return th_fail(NULL, KILN_E_INVALID_ARG, "kiln_test_set_accelerator: no host");
    th->acc = acc;
    th->kernels = kernels;
    return KILN_OK;
}

kiln_instance *kiln_test_acc(const kiln_test_host *th) { return th ? th->acc : NULL; }
const kiln_kernels *kiln_test_kernels(const kiln_test_host *th) { return th ? th->kernels : NULL; }
kiln_trainer_state *kiln_test_trainer(kiln_test_host *th) { return th ? &th->trainer : NULL; }

int32_t kiln_test_set_seed(kiln_test_host *th, uint64_t seed) {
    if (!th) return th_fail(NULL, KILN_E_INVALID_ARG, "kiln_test_set_seed: no host");
    th->seed = seed;
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Parameters */

int32_t kiln_test_add_param(kiln_test_host *th, const char *name, uint32_t ndim, const int64_t *shape, uint32_t flags,
                            uint32_t dtype, kiln_parameter **out) {
    int32_t rc = th_register(th, name, ndim, shape, flags, dtype, out);
    if (rc) return th_fail(th, rc, "kiln_test_add_param %s: %s (ndim 1..%d, dtype F32 or F64)", name ? name : "(null)",
                           kiln_status_name(rc), KILN_MAX_DIMS);
    return KILN_OK;
}

int32_t kiln_test_alloc_params(kiln_test_host *th) {
    if (!th) return th_fail(NULL, KILN_E_INVALID_ARG, "kiln_test_alloc_params: no host");
    for (size_t i = 0; i < th->params.n; i++) {
        kiln_parameter *p = *(kiln_parameter **)th_vec_at(&th->params, i);
        if (p->data) continue;
        size_t esz = kiln_param_dtype(p) == KILN_DTYPE_F64 ? 8 : 4;
        size_t bytes = ((size_t)p->numel * esz + 63) & ~(size_t)63;
        void *d = NULL, *g = NULL;
        if (posix_memalign(&d, 64, bytes ? bytes : 64) || posix_memalign(&g, 64, bytes ? bytes : 64)) {
            free(d);
            return th_fail(th, KILN_E_NOMEM, "parameter %s: cannot allocate %zu bytes", p->name, bytes);
        }
        memset(d, 0, bytes ? bytes : 64);
        memset(g, 0, bytes ? bytes : 64);
        p->data = d;
        p->grad = g;
        p->compute = d;
    }
    return KILN_OK;
}

uint32_t kiln_test_param_count(const kiln_test_host *th) { return th ? (uint32_t)th->params.n : 0; }

kiln_parameter *kiln_test_param(kiln_test_host *th, uint32_t i) {
    return th && i < th->params.n ? *(kiln_parameter **)th_vec_at(&th->params, i) : NULL;
}

kiln_parameter *const *kiln_test_params(kiln_test_host *th) {
    return th ? (kiln_parameter *const *)th->params.items : NULL;
}

kiln_parameter *kiln_test_find_param(kiln_test_host *th, const char *name) {
    for (uint32_t i = 0; name && i < kiln_test_param_count(th); i++)
        if (!strcmp(kiln_test_param(th, i)->name, name)) return kiln_test_param(th, i);
    return NULL;
}

/* ---------------------------------------------------------------------------
 * Kind ops */

/* The instance's descriptor if it is of `kind` (0: any) and its table holds
 * `end` bytes; else NULL after a message. */
static int32_t th_ops(kiln_test_host *th, kiln_instance *inst, uint32_t kind, size_t end, const char *op,
                      const kiln_plugin_desc **d) {
    th_inst *e = th_find(th, inst);
    *d = NULL;
    if (!e) return th_fail(th, KILN_E_INVALID_ARG, "%s: not an instance kiln_test_create made", op);
    if (kind && e->desc->kind != kind)
        return th_fail(th, KILN_E_INVALID_ARG, "%s: plugin %s is of kind %u, not %u", op, e->desc->name,
                       (unsigned)e->desc->kind, (unsigned)kind);
    const kiln_ops_header *h = e->desc->ops;
    if (h->struct_size < end)
        return th_fail(th, KILN_E_UNSUPPORTED, "%s: plugin %s's ops table (%u bytes) predates this op", op,
                       e->desc->name, (unsigned)h->struct_size);
    *d = e->desc;
    return KILN_OK;
}

#define TH_END(type, member) (offsetof(type, member) + sizeof(((type *)0)->member))
/* The opening of an op wrapper: d, the instance's descriptor, and ops, its
 * ops table as `type`, once th_ops has found the instance of that kind with
 * a table that has the op (else th_ops's status is returned). Declares d
 * and ops in the wrapper's scope, so it is no do-while. */
#define TH_OPS(type, th, inst, kind, end, op)                                  \
    const kiln_plugin_desc *d;                                                 \
    const int32_t th_rc_ = th_ops((th), (inst), (kind), (end), (op), &d);      \
    if (th_rc_) return th_rc_;                                                 \
    const type *ops = d->ops

#define TH_NOOP(th, d, op) th_fail((th), KILN_E_UNSUPPORTED, "%s: plugin %s has no such op (NULL)", (op), (d)->name)

int32_t kiln_test_event(kiln_test_host *th, kiln_instance *inst, kiln_event *ev) {
    th_inst *e = th_find(th, inst);
    if (!e || !ev) return th_fail(th, KILN_E_INVALID_ARG, "kiln_test_event: unknown instance or NULL event");
    if (!ev->struct_size) ev->struct_size = sizeof *ev;
    if (!ev->trainer) ev->trainer = &th->trainer;
    if (!ev->stage) ev->stage = th->trainer.stage;
    const kiln_plugin_desc *d = e->desc;
    int32_t (*fn)(kiln_instance *, kiln_event *) = NULL;
    int32_t rc;
    if (d->kind == KILN_KIND_CALLBACK) {
        if ((rc = th_ops(th, inst, 0, KILN_CALLBACK_OPS_SIZE_1_1, "on_event", &d))) return rc;
        fn = ((const kiln_callback_ops *)d->ops)->on_event;
        if (!fn) return TH_NOOP(th, d, "on_event");
    } else if (d->kind == KILN_KIND_MODULE) {
        if ((rc = th_ops(th, inst, 0, KILN_MODULE_OPS_SIZE_1_1, "on_event", &d))) return rc;
        fn = ((const kiln_module_ops *)d->ops)->on_event;
    } else if (d->kind == KILN_KIND_PRECISION) {
        /* on_event came in 1.2: a 1.1 table has none, as a NULL one */
        const kiln_precision_ops *p = d->ops;
        fn = p->base.struct_size >= KILN_PRECISION_OPS_SIZE_1_2 ? p->on_event : NULL;
    } else {
        return th_fail(th, KILN_E_INVALID_ARG, "kiln_test_event: plugin %s's kind takes no events", d->name);
    }
    return fn ? fn(inst, ev) : KILN_OK;
}

int32_t kiln_test_send_event(kiln_test_host *th, kiln_instance *inst, uint32_t id) {
    kiln_event ev;
    memset(&ev, 0, sizeof ev);
    ev.id = id;
    ev.batch_idx = -1;
    return kiln_test_event(th, inst, &ev);
}

int32_t kiln_test_setup(kiln_test_host *th, kiln_instance *inst) {
    th_inst *e = th_find(th, inst);
    if (!e) return th_fail(th, KILN_E_INVALID_ARG, "kiln_test_setup: not an instance kiln_test_create made");
    int32_t rc = kiln_test_alloc_params(th);
    if (rc) return rc;
    int32_t (*fn)(kiln_instance *, kiln_parameter *const *, uint32_t) = NULL;
    size_t need = e->desc->kind == KILN_KIND_PRECISION   ? KILN_PRECISION_OPS_SIZE_1_1
                  : e->desc->kind == KILN_KIND_STRATEGY  ? KILN_STRATEGY_OPS_SIZE_1_1
                  : e->desc->kind == KILN_KIND_OPTIMIZER ? KILN_OPTIMIZER_OPS_SIZE_1_1 : 0;
    const kiln_plugin_desc *d;
    if (need && (rc = th_ops(th, inst, 0, need, "setup", &d))) return rc;
    switch (e->desc->kind) {
    case KILN_KIND_PRECISION: fn = ((const kiln_precision_ops *)e->desc->ops)->setup; break;
    case KILN_KIND_STRATEGY: fn = ((const kiln_strategy_ops *)e->desc->ops)->setup; break;
    case KILN_KIND_OPTIMIZER: fn = ((const kiln_optimizer_ops *)e->desc->ops)->setup; break;
    default: return th_fail(th, KILN_E_INVALID_ARG, "kiln_test_setup: plugin %s's kind has no setup(params)",
                            e->desc->name);
    }
    if (!fn) return TH_NOOP(th, e->desc, "setup");
    return fn(inst, kiln_test_params(th), kiln_test_param_count(th));
}

const kiln_test_counts *kiln_test_counters(const kiln_test_host *th) { return th ? &th->counts : NULL; }

typedef struct th_closure {
    kiln_test_host *th;
    kiln_test_closure_fn fn;
    void *ctx;
} th_closure;

static int32_t th_closure_call(void *c, double *loss) {
    th_closure *cl = c;
    double l = NAN;
    cl->th->counts.closure_calls++;
    int32_t rc = cl->fn(cl->ctx, &l);
    cl->th->counts.last_loss = l;
    if (loss) *loss = l;
    return rc;
}

int32_t kiln_test_optimizer_step(kiln_test_host *th, kiln_instance *opt, kiln_test_closure_fn fn, void *ctx) {
    TH_OPS(kiln_optimizer_ops, th, opt, KILN_KIND_OPTIMIZER, KILN_OPTIMIZER_OPS_SIZE_1_1, "optimizer step");
    if (!ops->step) return TH_NOOP(th, d, "step");
    th_closure cl = {th, fn, ctx};
    kiln_closure c = {sizeof c, 0, &cl, th_closure_call};
    return ops->step(opt, fn ? &c : NULL);
}

int32_t kiln_test_zero_grad(kiln_test_host *th, kiln_instance *opt) {
    TH_OPS(kiln_optimizer_ops, th, opt, KILN_KIND_OPTIMIZER, KILN_OPTIMIZER_OPS_SIZE_1_1, "zero_grad");
    return ops->zero_grad ? ops->zero_grad(opt) : TH_NOOP(th, d, "zero_grad");
}

int32_t kiln_test_get_lr(kiln_test_host *th, kiln_instance *opt, double *lr) {
    TH_OPS(kiln_optimizer_ops, th, opt, KILN_KIND_OPTIMIZER, KILN_OPTIMIZER_OPS_SIZE_1_1, "get_lr");
    if (!lr) return th_fail(th, KILN_E_INVALID_ARG, "get_lr: lr is NULL");
    if (!ops->get_lr) return TH_NOOP(th, d, "get_lr");
    *lr = ops->get_lr(opt);
    return KILN_OK;
}

int32_t kiln_test_set_lr(kiln_test_host *th, kiln_instance *opt, double lr) {
    TH_OPS(kiln_optimizer_ops, th, opt, KILN_KIND_OPTIMIZER, KILN_OPTIMIZER_OPS_SIZE_1_1, "set_lr");
    return ops->set_lr ? ops->set_lr(opt, lr) : TH_NOOP(th, d, "set_lr");
}

int32_t kiln_test_convert_params(kiln_test_host *th, kiln_instance *prec) {
    TH_OPS(kiln_precision_ops, th, prec, KILN_KIND_PRECISION, KILN_PRECISION_OPS_SIZE_1_1, "convert_params");
    return ops->convert_params ? ops->convert_params(prec) : TH_NOOP(th, d, "convert_params");
}

int32_t kiln_test_pre_backward(kiln_test_host *th, kiln_instance *prec, double loss, double *scale) {
    TH_OPS(kiln_precision_ops, th, prec, KILN_KIND_PRECISION, KILN_PRECISION_OPS_SIZE_1_1, "pre_backward");
    if (!scale) return th_fail(th, KILN_E_INVALID_ARG, "pre_backward: scale is NULL");
    return ops->pre_backward ? ops->pre_backward(prec, loss, scale) : TH_NOOP(th, d, "pre_backward");
}

typedef struct th_optref {
    kiln_test_host *th;
    kiln_instance *opt;
} th_optref;

static int32_t th_opt_step(void *c, const kiln_closure *closure) {
    th_optref *r = c;
    r->th->counts.updates++;
    if (r->opt) {
        const kiln_optimizer_ops *ops = kiln_test_desc_of(r->th, r->opt)->ops;
        return ops->step(r->opt, closure);
    }
    double loss;
    return closure ? closure->call(closure->ctx, &loss) : KILN_OK;
}

static int32_t th_after_closure(void *c, double *loss) {
    kiln_test_host *th = c;
    (void)loss;
    th->counts.after_closure++;
    return KILN_OK;
}

int32_t kiln_test_precision_step(kiln_test_host *th, kiln_instance *prec, kiln_instance *opt,
                                 kiln_test_closure_fn fn, void *ctx, int32_t *skipped) {
    TH_OPS(kiln_precision_ops, th, prec, KILN_KIND_PRECISION, KILN_PRECISION_OPS_SIZE_1_1, "optimizer_step");
    const kiln_plugin_desc *od;
    int32_t rc_;
    if (opt && (rc_ = th_ops(th, opt, KILN_KIND_OPTIMIZER, KILN_OPTIMIZER_OPS_SIZE_1_1, "optimizer_step (optimizer)",
                             &od)))
        return rc_;
    if (!ops->optimizer_step) return TH_NOOP(th, d, "optimizer_step");
    th_closure cl = {th, fn, ctx};
    kiln_closure c = {sizeof c, 0, &cl, th_closure_call};
    kiln_closure after = {sizeof after, 0, th, th_after_closure};
    th_optref r = {th, opt};
    kiln_optimizer_ref ref = {sizeof ref, 0, &r, th_opt_step};
    int32_t sk = 0;
    int32_t rc = ops->optimizer_step(prec, &ref, fn ? &c : NULL, &after, &sk);
    if (skipped) *skipped = sk;
    return rc;
}

int32_t kiln_test_init_weights(kiln_test_host *th, kiln_instance *module, uint64_t seed) {
    TH_OPS(kiln_module_ops, th, module, KILN_KIND_MODULE, KILN_MODULE_OPS_SIZE_1_1, "init_weights");
    int32_t rc = kiln_test_alloc_params(th);
    if (rc) return rc;
    return ops->init_weights ? ops->init_weights(module, seed) : TH_NOOP(th, d, "init_weights");
}

int32_t kiln_test_step(kiln_test_host *th, kiln_instance *module, int32_t split, const kiln_batch *batch,
                       int64_t batch_idx, kiln_step_output *out) {
    TH_OPS(kiln_module_ops, th, module, KILN_KIND_MODULE, KILN_MODULE_OPS_SIZE_1_1, "step");
    if (!out) return th_fail(th, KILN_E_INVALID_ARG, "step: out is NULL");
    int32_t (*fn)(kiln_instance *, const kiln_batch *, int64_t, kiln_step_output *) =
        split == KILN_SPLIT_TRAIN ? ops->training_step : split == KILN_SPLIT_VAL ? ops->validation_step
        : split == KILN_SPLIT_TEST ? ops->test_step : NULL;
    if (split < KILN_SPLIT_TRAIN || split > KILN_SPLIT_TEST)
        return th_fail(th, KILN_E_INVALID_ARG, "step: split %d is not KILN_SPLIT_*", (int)split);
    if (!fn) return TH_NOOP(th, d, split == KILN_SPLIT_TRAIN ? "training_step" : split == KILN_SPLIT_VAL
                                                               ? "validation_step" : "test_step");
    if (!out->struct_size) out->struct_size = sizeof *out;
    return fn(module, batch, batch_idx, out);
}

int32_t kiln_test_backward(kiln_test_host *th, kiln_instance *module, double dloss) {
    TH_OPS(kiln_module_ops, th, module, KILN_KIND_MODULE, KILN_MODULE_OPS_SIZE_1_1, "backward");
    return ops->backward ? ops->backward(module, dloss) : TH_NOOP(th, d, "backward");
}

int32_t kiln_test_predict_step(kiln_test_host *th, kiln_instance *module, const kiln_batch *batch, kiln_tensor *out) {
    TH_OPS(kiln_module_ops, th, module, KILN_KIND_MODULE, KILN_MODULE_OPS_SIZE_1_4, "predict_step");
    return ops->predict_step ? ops->predict_step(module, batch, out) : TH_NOOP(th, d, "predict_step");
}

int32_t kiln_test_data_setup(kiln_test_host *th, kiln_instance *data, int32_t stage, int32_t rank,
                             int32_t world_size) {
    TH_OPS(kiln_data_ops, th, data, KILN_KIND_DATA, KILN_DATA_OPS_SIZE_1_1, "data setup");
    return ops->setup ? ops->setup(data, stage, rank, world_size) : TH_NOOP(th, d, "setup");
}

int32_t kiln_test_num_batches(kiln_test_host *th, kiln_instance *data, int32_t split, int64_t *n) {
    TH_OPS(kiln_data_ops, th, data, KILN_KIND_DATA, KILN_DATA_OPS_SIZE_1_1, "num_batches");
    if (!n) return th_fail(th, KILN_E_INVALID_ARG, "num_batches: n is NULL");
    return ops->num_batches ? ops->num_batches(data, split, n) : TH_NOOP(th, d, "num_batches");
}

int32_t kiln_test_start_epoch(kiln_test_host *th, kiln_instance *data, int32_t split, uint64_t epoch,
                              int64_t start_batch) {
    TH_OPS(kiln_data_ops, th, data, KILN_KIND_DATA, KILN_DATA_OPS_SIZE_1_1, "start_epoch");
    return ops->start_epoch ? ops->start_epoch(data, split, epoch, start_batch) : TH_NOOP(th, d, "start_epoch");
}

int32_t kiln_test_data_next(kiln_test_host *th, kiln_instance *data, int32_t split, kiln_batch *out) {
    TH_OPS(kiln_data_ops, th, data, KILN_KIND_DATA, KILN_DATA_OPS_SIZE_1_1, "next");
    if (!out) return th_fail(th, KILN_E_INVALID_ARG, "next: out is NULL");
    if (!ops->next) return TH_NOOP(th, d, "next");
    if (!out->struct_size) out->struct_size = sizeof *out;
    return ops->next(data, split, out);
}

int32_t kiln_test_lr_at(kiln_test_host *th, kiln_instance *sched, double base_lr, int64_t step, int64_t epoch,
                        double metric, double *lr) {
    TH_OPS(kiln_scheduler_ops, th, sched, KILN_KIND_SCHEDULER, KILN_SCHEDULER_OPS_SIZE_1_1, "lr_at");
    if (!lr) return th_fail(th, KILN_E_INVALID_ARG, "lr_at: lr is NULL");
    return ops->lr_at ? ops->lr_at(sched, base_lr, step, epoch, metric, lr) : TH_NOOP(th, d, "lr_at");
}

int32_t kiln_test_get_state(kiln_test_host *th, kiln_instance *inst, uint32_t *version, void **data, size_t *size) {
    TH_OPS(kiln_ops_header, th, inst, 0, sizeof(kiln_ops_header), "get_state");
    if (!version || !data || !size) return th_fail(th, KILN_E_INVALID_ARG, "get_state: NULL argument");
    *data = NULL;
    *size = 0;
    return ops->get_state ? ops->get_state(inst, version, data, size) : TH_NOOP(th, d, "get_state");
}

int32_t kiln_test_set_state(kiln_test_host *th, kiln_instance *inst, uint32_t version, const void *data, size_t size) {
    TH_OPS(kiln_ops_header, th, inst, 0, sizeof(kiln_ops_header), "set_state");
    return ops->set_state ? ops->set_state(inst, version, data, size) : TH_NOOP(th, d, "set_state");
}

void kiln_test_free_state(kiln_test_host *th, void *data) { s_free(kiln_test_hctx(th), data); }

int32_t kiln_test_state_roundtrip(kiln_test_host *th, kiln_instance *from, kiln_instance *to, uint32_t *version,
                                  size_t *size) {
    const kiln_plugin_desc *a = kiln_test_desc_of(th, from), *b = kiln_test_desc_of(th, to);
    if (!a || !b) return th_fail(th, KILN_E_INVALID_ARG, "state round trip: not instances kiln_test_create made");
    if (a != b) return th_fail(th, KILN_E_INVALID_ARG, "state round trip: %s and %s are different plugins", a->name,
                               b->name);
    uint32_t ver = 0;
    void *blob = NULL;
    size_t n = 0;
    int32_t rc = kiln_test_get_state(th, from, &ver, &blob, &n);
    if (rc == KILN_OK) rc = kiln_test_set_state(th, to, ver, blob, n);
    kiln_test_free_state(th, blob);
    if (version) *version = ver;
    if (size) *size = n;
    return rc;
}

/* ---------------------------------------------------------------------------
 * Records */

int32_t kiln_test_error_code(const kiln_test_host *th) { return th ? th->error_code : 0; }
const char *kiln_test_error(const kiln_test_host *th) { return th ? th->error : ""; }

void kiln_test_clear_error(kiln_test_host *th) {
    if (!th) return;
    th->error[0] = 0;
    th->error_code = 0;
}

int32_t kiln_test_set_log_level(kiln_test_host *th, int32_t level) {
    if (!th) return th_fail(NULL, KILN_E_INVALID_ARG, "kiln_test_set_log_level: no host");
    th->log_level = level;
    return KILN_OK;
}

size_t kiln_test_log_count(const kiln_test_host *th) { return th ? th->log.n : 0; }

const kiln_test_log_line *kiln_test_log(const kiln_test_host *th, size_t i) {
    return th && i < th->log.n ? th_vec_at(&th->log, i) : NULL;
}

const char *kiln_test_log_find(const kiln_test_host *th, int32_t min_level, const char *needle) {
    for (size_t i = th ? th->log.n : 0; i-- > 0;) {
        const kiln_test_log_line *l = th_vec_at(&th->log, i);
        if (l->level >= min_level && (!needle || strstr(l->text, needle))) return l->text;
    }
    return NULL;
}

void kiln_test_clear_log(kiln_test_host *th) {
    if (!th) return;
    for (size_t i = 0; i < th->log.n; i++) free((void *)((kiln_test_log_line *)th_vec_at(&th->log, i))->text);
    th->log.n = 0;
}

size_t kiln_test_logged_count(const kiln_test_host *th) { return th ? th->logged.n : 0; }

const kiln_test_value *kiln_test_logged(const kiln_test_host *th, size_t i) {
    return th && i < th->logged.n ? th_vec_at(&th->logged, i) : NULL;
}

double kiln_test_last_value(const kiln_test_host *th, const char *name) {
    for (size_t i = th && name ? th->logged.n : 0; i-- > 0;) {
        const kiln_test_value *v = th_vec_at(&th->logged, i);
        if (!strcmp(v->name, name)) return v->value;
    }
    return NAN;
}

void kiln_test_clear_logged(kiln_test_host *th) {
    if (!th) return;
    for (size_t i = 0; i < th->logged.n; i++) free((void *)((kiln_test_value *)th_vec_at(&th->logged, i))->name);
    th->logged.n = 0;
}

int kiln_test_stop_count(const kiln_test_host *th) { return th ? th->stops : 0; }
const char *kiln_test_stop_reason(const kiln_test_host *th) { return th ? th->stop_reason : ""; }

size_t kiln_test_checkpoint_count(const kiln_test_host *th) { return th ? th->ckpts.n : 0; }

const char *kiln_test_checkpoint(const kiln_test_host *th, size_t i) {
    return th && i < th->ckpts.n ? *(char **)th_vec_at(&th->ckpts, i) : NULL;
}

int32_t kiln_test_set_checkpoint_status(kiln_test_host *th, int32_t status) {
    if (!th) return th_fail(NULL, KILN_E_INVALID_ARG, "kiln_test_set_checkpoint_status: no host");
    th->checkpoint_status = status;
    return KILN_OK;
}

int32_t kiln_test_set_trainer_hooks(kiln_test_host *th, const kiln_test_trainer_hooks *hooks) {
    if (!th) return th_fail(NULL, KILN_E_INVALID_ARG, "kiln_test_set_trainer_hooks: no host");
    if (hooks) th->hooks = *hooks;
    else memset(&th->hooks, 0, sizeof th->hooks);
    return KILN_OK;
}
