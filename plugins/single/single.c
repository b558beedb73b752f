/*
 * single.c — the "single" strategy (Lightning's SingleDeviceStrategy): one
 * process, one device, rank 0 of 1. Gradient synchronisation, barriers and
 * reductions are no-ops; it exists so the trainer always talks to a strategy
 * and ddp can replace it without the trainer changing.
 */
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

struct kiln_instance {
    int unused;
};

static int32_t single_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                             const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    (void)config;
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "out of memory");
    *out = self;
    return KILN_OK;
}

static void single_destroy(kiln_instance *self) { free(self); }

static int32_t single_setup(kiln_instance *self, kiln_parameter *const *params, uint32_t n) {
    (void)self;
    (void)params;
    (void)n;
    return KILN_OK;
}

static int32_t single_world(kiln_instance *self, int32_t *rank, int32_t *world_size, int32_t *local_rank) {
    (void)self;
    *rank = 0;
    *world_size = 1;
    *local_rank = 0;
    return KILN_OK;
}

static int32_t single_noop(kiln_instance *self) {
    (void)self;
    return KILN_OK;
}

static int32_t single_barrier(kiln_instance *self, const char *name) {
    (void)self;
    (void)name;
    return KILN_OK;
}

static int32_t single_reduce_sum(kiln_instance *self, double *values, uint32_t n) {
    (void)self;
    (void)values;
    (void)n;
    return KILN_OK; /* one rank: the sum is the value */
}

/* One rank: the broadcast has nothing to send, the gather is a copy. */
static int32_t single_broadcast(kiln_instance *self, void *buf, size_t bytes, int32_t root) {
    (void)self, (void)buf, (void)bytes, (void)root;
    return KILN_OK;
}

static int32_t single_all_gather(kiln_instance *self, const void *send, size_t bytes, void *recv) {
    (void)self;
    if (bytes) memmove(recv, send, bytes);
    return KILN_OK;
}

static const kiln_strategy_ops single_ops = {
    .base = {sizeof(kiln_strategy_ops), 0, single_create, single_destroy, NULL, NULL},
    .setup = single_setup,
    .world = single_world,
    .pre_backward = single_noop,
    .post_backward = single_noop,
    .barrier = single_barrier,
    .reduce_sum = single_reduce_sum,
    .broadcast = single_broadcast,
    .all_gather = single_all_gather,
};

static const kiln_kv single_props[] = {
    {"distributed", KILN_V_BOOL(0)},
    {"default", KILN_V_BOOL(1)}, /* the strategy when none is named */
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc single_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_STRATEGY,
    .name = "single",
    .version = "1.0.0",
    .description = "one process on one device (rank 0 of 1)",
    .capabilities = KILN_CAP_DETERMINISTIC,
    .properties = single_props,
    .ops = &single_ops,
};

KILN_DEFINE_LIBRARY("single", "1.0.0", 1, &single_desc)
