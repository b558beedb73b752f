/*
 * tests/support/plugin_fixture.c — see plugin_fixture.h.
 */
#define _GNU_SOURCE
#include "plugin_fixture.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CUnit/CUnit.h>

const kiln_plugin_desc *fixture_load_plugin(kiln_test_host *th, const char *lib, uint32_t kind, const char *name) {
    const char *dir = getenv("KILN_PLUGIN_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/libkiln-%s.so", dir ? dir : ".", lib);
    const kiln_plugin_desc *d = NULL;
    kiln_test_load(th, path, kind, name, &d);
    return d;
}

int fixture_need_plugin_dir(void) {
    if (getenv("KILN_PLUGIN_DIR")) return 0;
    fprintf(stderr, "KILN_PLUGIN_DIR is not set\n");
    return -1;
}

const kiln_kv *fixture_kv_of(const fixture_key *keys, size_t nkeys, const void *cfg, kiln_kv *kv) {
    const char *base = cfg;
    size_t n = 0;
    for (size_t i = 0; i < nkeys; i++) {
        const void *field = base + keys[i].offset;
        kiln_value v = {keys[i].type, 0, {.i = 0}};
        switch (keys[i].type) {
        case KILN_TYPE_STRING: v.v.s = *(const char *const *)field; break;
        case KILN_TYPE_INT: v.v.i = *(const int64_t *)field; break;
        case KILN_TYPE_BOOL: v.v.i = *(const bool *)field; break;
        case KILN_TYPE_FLOAT: v.v.f = *(const double *)field; break;
        default: abort(); /* a key type this table does not read */
        }
        if (keys[i].optional && keys[i].type == KILN_TYPE_STRING && !v.v.s) continue;
        kv[n++] = (kiln_kv){keys[i].key, v};
    }
    kv[n] = (kiln_kv){NULL, KILN_V_NONE};
    return kv;
}

int fixture_accel_open(kiln_test_host *th, const char *lib, const char *name, const kiln_plugin_desc **desc,
                       const kiln_accelerator_ops **ops, kiln_instance **acc, const kiln_kernels **k) {
    kiln_test_reset(th);
    *desc = fixture_load_plugin(th, lib, KILN_KIND_ACCELERATOR, name);
    if (!*desc) return -1;
    *ops = (*desc)->ops;
    if ((*ops)->base.create((*desc)->plugin_ctx, kiln_test_services(th), kiln_test_hctx(th), NULL, acc) != KILN_OK)
        return -1;
    *k = (*ops)->kernels(*acc);
    return *k ? 0 : -1;
}

void fixture_accel_close(kiln_test_host *th, const kiln_accelerator_ops *ops, kiln_instance **acc) {
    if (*acc) ops->base.destroy(*acc);
    *acc = NULL;
    kiln_test_reset(th);
}

double fixture_val(unsigned i, unsigned salt) {
    uint32_t x = (i + 1u) * 2654435761u ^ (salt * 40503u + 0x9E37u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return (double)(x & 0xFFFFFF) / (double)0x800000 - 1.0;
}

const kiln_plugin_desc *fixture_load_callback_desc(kiln_test_host *th, const char *name) {
    CU_ASSERT_PTR_NOT_NULL_FATAL(getenv("KILN_PLUGIN_DIR"));
    const kiln_plugin_desc *d = fixture_load_plugin(th, name, KILN_KIND_CALLBACK, name);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    return d;
}

const kiln_callback_ops *fixture_callback_ops(const kiln_plugin_desc *d) {
    const kiln_callback_ops *ops = d->ops;
    CU_ASSERT_FATAL(ops->base.struct_size >= sizeof(kiln_callback_ops) && ops->on_event != NULL);
    return ops;
}

int32_t fixture_create_desc(const kiln_plugin_desc *d, kiln_test_host *th, const kiln_kv *cfg, kiln_instance **out) {
    *out = NULL;
    const kiln_ops_header *ops = d->ops;
    return ops->create(d->plugin_ctx, kiln_test_services(th), kiln_test_hctx(th), cfg, out);
}

kiln_instance *fixture_create_checked(const kiln_plugin_desc *d, kiln_test_host *th, const kiln_kv *cfg) {
    kiln_instance *inst;
    const int32_t rc = fixture_create_desc(d, th, cfg, &inst);
    CU_ASSERT_EQUAL(rc, KILN_OK);
    if (rc == KILN_OK) return inst;
    printf("\n  create failed: %s", kiln_test_error(th));
    return NULL;
}

kiln_instance *fixture_config_error(const kiln_ops_header *ops, const kiln_host_services *services,
                                    kiln_test_host *th, const kiln_kv *cfg, const char *needle, const char *needle2) {
    int32_t rc;
    kiln_instance *inst = fixture_create(ops, services, th, cfg, &rc);
    CU_ASSERT_EQUAL(rc, KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), needle));
    if (needle2) CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), needle2));
    return inst;
}

void fixture_expect_refused(const kiln_plugin_desc *d, kiln_test_host *th, const kiln_kv *cfg, const char *key) {
    const kiln_ops_header *ops = d->ops;
    kiln_instance *in = (kiln_instance *)&in; /* create must reset it */
    kiln_test_clear_error(th);
    int32_t rc = ops->create(d->plugin_ctx, kiln_test_services(th), kiln_test_hctx(th), cfg, &in);
    CU_ASSERT_EQUAL(rc, KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(in);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(th), key));
    if (rc == KILN_OK && in) ops->destroy(in);
}

void fixture_expect_refused_each(const kiln_plugin_desc *d, kiln_test_host *th, const kiln_kv *base,
                                 const fixture_bad_value *bad, size_t n) {
    size_t len = 0;
    while (base[len].key) len++;
    kiln_kv *kv = malloc((len + 1) * sizeof *kv);
    if (!kv) abort();
    for (size_t i = 0; i < n; i++) {
        memcpy(kv, base, (len + 1) * sizeof *kv);
        size_t k = 0;
        while (k < len && strcmp(kv[k].key, bad[i].key) != 0) k++;
        if (k == len) {
            fprintf(stderr, "\n  %s: not a key of the config\n", bad[i].key);
            CU_FAIL("a refused value names a key the config does not have");
            continue;
        }
        kv[k].value = bad[i].value;
        fixture_expect_refused(d, th, kv, bad[i].key);
    }
    free(kv);
}

void fixture_data_restore(kiln_test_host *th, const kiln_data_ops *ops, kiln_instance *in, uint32_t ver,
                          const void *blob, size_t size) {
    CU_ASSERT_EQUAL(ops->base.set_state(in, ver, blob, size), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(ops->setup(in, KILN_STAGE_FIT, 0, 1), KILN_OK);
    void *blob2 = NULL;
    size_t size2 = 0;
    CU_ASSERT_EQUAL(ops->base.get_state(in, &ver, &blob2, &size2), KILN_OK);
    CU_ASSERT(size2 == size && memcmp(blob, blob2, size) == 0);
    kiln_test_services(th)->free(kiln_test_hctx(th), blob2);
}

kiln_parameter *fixture_param(kiln_test_host *th, const char *name, uint32_t ndim, const int64_t *shape,
                              uint32_t flags) {
    kiln_parameter *p = NULL;
    CU_ASSERT_EQUAL_FATAL(kiln_test_services(th)->param_register(kiln_test_hctx(th), name, ndim, shape, flags, &p),
                          KILN_OK);
    return p;
}

kiln_instance *fixture_accel_install(kiln_test_host *th, const kiln_plugin_desc *desc) {
    const kiln_accelerator_ops *aops = desc->ops;
    kiln_instance *acc = NULL;
    CU_ASSERT_EQUAL_FATAL(aops->base.create(desc->plugin_ctx, kiln_test_services(th), kiln_test_hctx(th), NULL, &acc),
                          KILN_OK);
    kiln_test_set_accelerator(th, acc, aops->kernels(acc));
    return acc;
}

void fixture_accel_remove(kiln_test_host *th, const kiln_plugin_desc *desc, kiln_instance **acc) {
    fixture_accel_close(th, desc->ops, acc);
}

kiln_instance *fixture_create(const kiln_ops_header *ops, const kiln_host_services *services, kiln_test_host *th,
                              const kiln_kv *cfg, int32_t *rc) {
    kiln_instance *inst = NULL;
    *rc = ops->create(NULL, services, kiln_test_hctx(th), cfg, &inst);
    if (*rc != KILN_OK) CU_ASSERT_PTR_NULL(inst);
    return inst;
}

void fixture_tmpdir(char *dir, size_t n, const char *tag) {
    snprintf(dir, n, "/tmp/kiln-%s-XXXXXX", tag);
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

void fixture_rmtree(const char *dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

void fixture_fit_state(kiln_trainer_state *ts, const char *run_dir) {
    memset(ts, 0, sizeof *ts);
    ts->struct_size = sizeof *ts;
    ts->stage = KILN_STAGE_FIT;
    ts->run_dir = run_dir;
    ts->world_size = 1;
    ts->accumulate_grad_batches = 1;
}

kiln_event fixture_event(uint32_t id, int32_t stage, int64_t batch, const kiln_trainer_state *trainer) {
    kiln_event e;
    memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
    e.id = id;
    e.stage = stage;
    e.batch_idx = batch;
    e.trainer = trainer;
    return e;
}

char *fixture_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

int fixture_file_exists(const char *path) { return access(path, F_OK) == 0; }
