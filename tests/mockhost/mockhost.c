/*
 * tests/mockhost/mockhost.c — see mockhost.h.
 */
#define _GNU_SOURCE
#include "mockhost.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mh_state mh;
struct kiln_host_ctx { int unused; };
static struct kiln_host_ctx g_ctx;

static void m_log(kiln_host_ctx *h, int32_t level, const char *msg) {
    (void)h;
    if (level >= KILN_LOG_WARN || getenv("MH_VERBOSE")) fprintf(stderr, "mockhost: %d: %s\n", level, msg);
}
static int32_t m_log_enabled(kiln_host_ctx *h, int32_t level) { (void)h; return level >= KILN_LOG_INFO; }
static void m_set_error(kiln_host_ctx *h, int32_t code, const char *msg) {
    (void)h;
    mh.last_error_code = code;
    snprintf(mh.last_error, sizeof mh.last_error, "%s", msg ? msg : "");
}
static void *m_alloc(kiln_host_ctx *h, size_t size, size_t align) {
    (void)h;
    void *p = NULL;
    if (align < 16) align = 16;
    return posix_memalign(&p, align, size ? size : 1) == 0 ? p : NULL;
}
static void m_free(kiln_host_ctx *h, void *p) { (void)h; free(p); }
static int32_t m_config_get(kiln_host_ctx *h, const char *key, kiln_value *out) {
    (void)h;
    const kiln_value *v = kiln_kv_find(mh.config, key);
    if (!v) return KILN_E_NOT_FOUND;
    *out = *v;
    return KILN_OK;
}
static void m_log_metric(kiln_host_ctx *h, const char *name, double value, int64_t step) {
    (void)step;
    extern void m_log_value(kiln_host_ctx *, const char *, double, uint32_t, double);
    m_log_value(h, name, value, KILN_LOG_ON_STEP, 1.0);
}
static int32_t m_accelerator(kiln_host_ctx *h, kiln_instance **acc, const struct kiln_kernels **k) {
    (void)h;
    if (!mh.kernels) return KILN_E_NOT_FOUND;
    *acc = mh.acc;
    *k = mh.kernels;
    return KILN_OK;
}
static int32_t m_param_register(kiln_host_ctx *h, const char *name, uint32_t ndim, const int64_t *shape,
                                uint32_t flags, kiln_parameter **out) {
    (void)h;
    if (mh.nparams >= MH_MAX_PARAMS || ndim == 0 || ndim > KILN_MAX_DIMS) return KILN_E_INVALID_ARG;
    kiln_parameter *p = &mh.params[mh.nparams];
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->flags = flags;
    p->name = strdup(name);
    p->ndim = ndim;
    p->numel = 1;
    for (uint32_t i = 0; i < KILN_MAX_DIMS; i++) p->shape[i] = i < ndim ? shape[i] : 1;
    for (uint32_t i = 0; i < ndim; i++) p->numel *= shape[i];
    p->compute_dtype = KILN_DTYPE_F32;
    p->param_dtype = KILN_DTYPE_F32;
    mh.param_ptrs[mh.nparams++] = p;
    *out = p;
    return KILN_OK;
}
static int32_t m_params(kiln_host_ctx *h, kiln_parameter *const **list, uint32_t *n) {
    (void)h;
    *list = mh.param_ptrs;
    *n = mh.nparams;
    return KILN_OK;
}
static const struct kiln_trainer_state *m_trainer_state(kiln_host_ctx *h) { (void)h; return &mh.trainer; }
void m_log_value(kiln_host_ctx *h, const char *name, double value, uint32_t flags, double weight) {
    (void)h;
    if (mh.nlogged >= MH_MAX_LOGGED) return;
    mh_logged *l = &mh.logged[mh.nlogged++];
    snprintf(l->name, sizeof l->name, "%s", name);
    l->value = value;
    l->flags = flags;
    l->weight = weight;
}
static int32_t m_get_metric(kiln_host_ctx *h, const char *name, double *out) {
    (void)h;
    for (int i = mh.nlogged - 1; i >= 0; i--)
        if (!strcmp(mh.logged[i].name, name)) { *out = mh.logged[i].value; return KILN_OK; }
    return KILN_E_NOT_FOUND;
}
static void m_request_stop(kiln_host_ctx *h, const char *reason) { (void)h; (void)reason; mh.stop_requested = 1; }
static uint64_t m_seed(kiln_host_ctx *h, const char *stream) {
    (void)h;
    uint64_t x = mh.seed ^ 0x9E3779B97F4A7C15ull;
    for (const char *c = stream; *c; c++) x = (x ^ (uint8_t)*c) * 0x100000001B3ull;
    return x;
}

/* 1.2 manual optimisation: forwarded to the hooks a test sets in mh */
static uint32_t m_optimizer_count(kiln_host_ctx *h) { (void)h; return mh.n_optimizers; }
static int32_t m_manual_backward(kiln_host_ctx *h, double loss) {
    (void)h;
    return mh.manual_backward ? mh.manual_backward(loss) : KILN_E_UNSUPPORTED;
}
static int32_t m_optimizer_step(kiln_host_ctx *h, uint32_t i, const struct kiln_closure *c, int32_t *skipped) {
    (void)h;
    return mh.optimizer_step ? mh.optimizer_step(i, c, skipped) : KILN_E_UNSUPPORTED;
}
static int32_t m_optimizer_zero_grad(kiln_host_ctx *h, uint32_t i) {
    (void)h;
    return mh.optimizer_zero_grad ? mh.optimizer_zero_grad(i) : KILN_E_UNSUPPORTED;
}
static int32_t m_toggle(kiln_host_ctx *h, uint32_t i) { (void)h; return mh.toggle ? mh.toggle(i, 1) : KILN_E_UNSUPPORTED; }
static int32_t m_untoggle(kiln_host_ctx *h, uint32_t i) { (void)h; return mh.toggle ? mh.toggle(i, 0) : KILN_E_UNSUPPORTED; }
/* 1.2 collectives of one process */
static int32_t m_barrier(kiln_host_ctx *h, const char *name) { (void)h, (void)name; return KILN_OK; }
static int32_t m_reduce(kiln_host_ctx *h, double *v, uint32_t n, int32_t op) {
    (void)h, (void)v, (void)n;
    return op == KILN_REDUCE_SUM || op == KILN_REDUCE_MEAN ? KILN_OK : KILN_E_INVALID_ARG;
}
static int32_t m_broadcast(kiln_host_ctx *h, void *buf, size_t bytes, int32_t root) {
    (void)h, (void)buf, (void)bytes;
    return root == 0 ? KILN_OK : KILN_E_INVALID_ARG;
}
static int32_t m_all_gather(kiln_host_ctx *h, const void *send, size_t bytes, void *recv) {
    (void)h;
    if (bytes) memmove(recv, send, bytes);
    return KILN_OK;
}
static int32_t m_save_checkpoint(kiln_host_ctx *h, const char *path) {
    (void)h;
    return mh.save_checkpoint ? mh.save_checkpoint(path) : KILN_E_UNSUPPORTED;
}

/* 1.4 predict: forwarded to the hook a test sets in mh */
static int32_t m_predict(kiln_host_ctx *h, const kiln_batch *batch, kiln_tensor *out) {
    (void)h;
    return mh.predict ? mh.predict(batch, out) : KILN_E_UNSUPPORTED;
}

static const kiln_host_services g_svc = {
    sizeof(kiln_host_services), KILN_ABI_MAJOR, KILN_ABI_MINOR, m_log, m_log_enabled, m_set_error, m_alloc, m_free,
    m_config_get, m_log_metric, m_accelerator, m_param_register, m_params, m_trainer_state, m_log_value,
    m_get_metric, m_request_stop, m_seed, m_optimizer_count, m_manual_backward, m_optimizer_step,
    m_optimizer_zero_grad, m_toggle, m_untoggle, m_save_checkpoint, m_barrier, m_reduce, m_broadcast, m_all_gather,
    m_predict,
};

static const kiln_host_services *m_get_services(uint16_t major, uint16_t minor) {
    return major == KILN_ABI_MAJOR && minor <= KILN_ABI_MINOR ? &g_svc : NULL;
}
static const kiln_host_base g_base = {sizeof(kiln_host_base), KILN_ABI_MAJOR, KILN_ABI_MINOR, "mockhost",
                                      m_get_services, KILN_CAP_KNOWN_1_0};

const kiln_host_services *mh_services(void) { return &g_svc; }
kiln_host_ctx *mh_ctx(void) { return &g_ctx; }

void mh_reset(void) {
    for (uint32_t i = 0; i < mh.nparams; i++) {
        free((void *)mh.params[i].name);
        free(mh.params[i].data);
        free(mh.params[i].grad);
    }
    memset(&mh, 0, sizeof mh);
    mh.trainer.struct_size = sizeof mh.trainer;
    mh.trainer.automatic_optimization = 1;
    mh.trainer.world_size = 1;
    mh.trainer.accumulate_grad_batches = 1;
}

int mh_alloc_params(void) {
    for (uint32_t i = 0; i < mh.nparams; i++) {
        kiln_parameter *p = &mh.params[i];
        size_t bytes = ((size_t)p->numel * sizeof(float) + 63) & ~(size_t)63;
        if (posix_memalign((void **)&p->data, 64, bytes) || posix_memalign((void **)&p->grad, 64, bytes)) return -1;
        memset(p->data, 0, bytes);
        memset(p->grad, 0, bytes);
        p->compute = p->data;
    }
    return 0;
}

const kiln_plugin_desc *mh_load(const char *path, uint32_t kind, const char *name) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "mockhost: %s\n", dlerror()); return NULL; }
    kiln_plugin_init_v1_fn init;
    *(void **)&init = dlsym(h, KILN_PLUGIN_ENTRY_V1);
    const kiln_library *lib = NULL;
    if (!init || init(&g_base, &lib) != KILN_OK || !lib) return NULL;
    for (uint32_t i = 0; i < lib->plugin_count; i++)
        if (lib->plugins[i]->kind == kind && !strcmp(lib->plugins[i]->name, name)) return lib->plugins[i];
    return NULL;
}

double mh_last_logged(const char *name) {
    for (int i = mh.nlogged - 1; i >= 0; i--)
        if (!strcmp(mh.logged[i].name, name)) return mh.logged[i].value;
    return NAN;
}
