/*
 * hello.c — the smallest useful kiln plugin: a callback that greets the log
 * when it is created and says how often it was asked to. It shows the shape
 * of every plugin: a descriptor with typed properties and declared config
 * keys, an ops table starting with create/destroy, and KILN_DEFINE_LIBRARY to
 * export the single entry point. docs/plugin-guide.md walks through it.
 */
#include <stdlib.h>

#include <kiln/kiln.h>

struct kiln_instance {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    int64_t times;
};

static int32_t hello_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                            const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    int64_t times = kiln_kv_int(config, "times", 1);
    if (times < 1) return kiln_errorf(svc, hctx, KILN_E_CONFIG, "times must be >= 1, got %lld", (long long)times);
    kiln_instance *self = calloc(1, sizeof *self);
    if (!self) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "out of memory");
    self->svc = svc;
    self->hctx = hctx;
    self->times = times;
    for (int64_t i = 0; i < times; i++)
        kiln_logf(svc, hctx, KILN_LOG_INFO, "%s", kiln_kv_str(config, "greeting", "hello"));
    *out = self;
    return KILN_OK;
}

static void hello_destroy(kiln_instance *self) { free(self); }

static const kiln_ops_header hello_ops = {
    .struct_size = sizeof(kiln_ops_header),
    .create = hello_create,
    .destroy = hello_destroy,
};

static const char *const hello_aliases[] = {"hi"};
static const kiln_kv hello_props[] = {
    {"aliases", KILN_V_STRS(hello_aliases)},
    {NULL, KILN_V_NONE},
};
static const kiln_param hello_params[] = {
    {"greeting", KILN_TYPE_STRING, 0, KILN_V_STR("hello"), "what to say"},
    {"times", KILN_TYPE_INT, 0, KILN_V_INT(1), "how often to say it"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};

static const kiln_plugin_desc hello_desc = {
    .struct_size = sizeof(kiln_plugin_desc),
    .kind = KILN_KIND_CALLBACK,
    .name = "hello",
    .version = "1.0.0",
    .description = "greets the log; the example out-of-tree plugin",
    .properties = hello_props,
    .params = hello_params,
    .ops = &hello_ops,
};

KILN_DEFINE_LIBRARY("hello", "1.0.0", 0, &hello_desc)
