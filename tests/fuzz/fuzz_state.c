/*
 * tests/fuzz/fuzz_state.c — fuzz target for every built-in plugin's
 * set_state: the blobs a checkpoint carries under "__state__.<role>" are
 * read back by the plugin that wrote them, and a checkpoint is not trusted
 * (docs/security.md), so each set_state must refuse a bad blob in one line
 * and leave the plugin usable. The plugins' sources are compiled into this
 * program (each library's kiln_plugin_init_v1 renamed to fz_init_<lib> by
 * the build, so they link side by side, all instrumented) and driven
 * through the plugin ABI exactly as the host drives them: init, create with
 * the defaults of the declared keys, setup where the host would call it
 * first (optimizers get three small parameters on a host-memory stand-in
 * accelerator), then set_state.
 *
 * Input: byte 0 picks the plugin (modulo the table below), bit 7 of byte 1
 * sets up a data plugin before set_state instead of after, bytes 2-5 are the
 * state version (little endian), the rest is the blob. An accepted blob must
 * survive a round trip (get_state, then set_state of that) and, for the data
 * plugins, an epoch started from the restored position and a few batches
 * read from it: what set_state lets in must not break what comes after.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "kiln/kiln.h"
#include <kiln/testing.h>

static kiln_test_host *g_th; /* the test host (kiln/testing.h) the plugins run under */

/* the renamed library entries (tests/fuzz/CMakeLists.txt) */
int32_t fz_init_adamw(const kiln_host_base *, const kiln_library **);
int32_t fz_init_sgd(const kiln_host_base *, const kiln_library **);
int32_t fz_init_lbfgs(const kiln_host_base *, const kiln_library **);
int32_t fz_init_mixed(const kiln_host_base *, const kiln_library **);
int32_t fz_init_gan(const kiln_host_base *, const kiln_library **);
int32_t fz_init_schedulers(const kiln_host_base *, const kiln_library **);
int32_t fz_init_early_stopping(const kiln_host_base *, const kiln_library **);
int32_t fz_init_checkpoint(const kiln_host_base *, const kiln_library **);
int32_t fz_init_idx(const kiln_host_base *, const kiln_library **);
int32_t fz_init_tokens(const kiln_host_base *, const kiln_library **);

typedef struct fz_plugin {
    kiln_plugin_init_v1_fn init;
    uint32_t kind;
    const char *name;
    const kiln_plugin_desc *desc; /* found at start-up */
} fz_plugin;

static fz_plugin fz_plugins[] = {
    {fz_init_adamw, KILN_KIND_OPTIMIZER, "adamw", NULL},
    {fz_init_sgd, KILN_KIND_OPTIMIZER, "sgd", NULL},
    {fz_init_lbfgs, KILN_KIND_OPTIMIZER, "lbfgs", NULL},
    {fz_init_mixed, KILN_KIND_PRECISION, "16-mixed", NULL},
    {fz_init_gan, KILN_KIND_MODULE, "gan", NULL},
    {fz_init_schedulers, KILN_KIND_SCHEDULER, "plateau", NULL},
    {fz_init_early_stopping, KILN_KIND_CALLBACK, "early_stopping", NULL},
    {fz_init_checkpoint, KILN_KIND_CALLBACK, "checkpoint", NULL},
    {fz_init_idx, KILN_KIND_DATA, "idx", NULL},
    {fz_init_tokens, KILN_KIND_DATA, "tokens", NULL},
};
#define FZ_NPLUGINS ((int)(sizeof fz_plugins / sizeof fz_plugins[0]))

static void fz_check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_state: invariant broken: %s (last error: %s)\n", what, kiln_test_error(g_th));
        abort();
    }
}

/* ------------------------------------------------------------------------
 * A host-memory accelerator: the kernels set_state and setup use (alloc,
 * free, copy, zero, synchronize) work on host memory; every other entry is
 * present (setup checks that the ones a plugin computes with exist) but
 * aborts: restoring a state must not compute, and if it does the fuzzer
 * says so. */

static void fz_not_here(void) {
    fprintf(stderr, "fuzz_state: a compute kernel was called while restoring a state\n");
    abort();
}

static int32_t fz_alloc(kiln_instance *acc, size_t bytes, void **out) {
    (void)acc;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 1)) return KILN_E_NOMEM;
    memset(p, 0, bytes ? bytes : 1);
    *out = p;
    return KILN_OK;
}
static void fz_free(kiln_instance *acc, void *p) { (void)acc; free(p); }
static int32_t fz_copy(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind) {
    (void)acc, (void)kind;
    if (bytes) memmove(dst, src, bytes);
    return KILN_OK;
}
static int32_t fz_zero(kiln_instance *acc, void *p, size_t bytes) {
    (void)acc;
    if (bytes) memset(p, 0, bytes);
    return KILN_OK;
}
static int32_t fz_sync(kiln_instance *acc) { (void)acc; return KILN_OK; }

static kiln_kernels fz_kernels;
static int fz_acc_token;

/* three parameters (1, 3x2 and 5 elements) the optimizers set up over */
static kiln_parameter fz_params[3];
static kiln_parameter *fz_param_ptrs[3];

static void fz_make_params(void) {
    static const int64_t numel[3] = {1, 6, 5};
    static const char *const names[3] = {"a.bias", "b.weight", "c.bias"};
    for (int i = 0; i < 3; i++) {
        kiln_parameter *p = &fz_params[i];
        memset(p, 0, sizeof *p);
        p->struct_size = sizeof *p;
        p->name = names[i];
        p->ndim = 1;
        p->shape[0] = numel[i];
        for (int d = 1; d < KILN_MAX_DIMS; d++) p->shape[d] = 1;
        p->numel = numel[i];
        p->data = calloc((size_t)numel[i], sizeof(float));
        p->grad = calloc((size_t)numel[i], sizeof(float));
        p->compute = p->data;
        p->compute_dtype = KILN_DTYPE_F32;
        p->param_dtype = KILN_DTYPE_F32;
        fz_param_ptrs[i] = p;
    }
}

/* ------------------------------------------------------------------------
 * Data for the data plugins: tiny IDX files (20 training images of 2x2,
 * labels 0..9) and a text file, in the private temporary directory. */

static void fz_be32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static void fz_make_data(void) {
    uint8_t img[16 + 20 * 4], lab[8 + 20];
    fz_be32(img, 0x803), fz_be32(img + 4, 20), fz_be32(img + 8, 2), fz_be32(img + 12, 2);
    fz_be32(lab, 0x801), fz_be32(lab + 4, 20);
    for (int i = 0; i < 20; i++) {
        for (int k = 0; k < 4; k++) img[16 + 4 * i + k] = (uint8_t)(i * 13 + k);
        lab[8 + i] = (uint8_t)(i % 10);
    }
    fz_tmpfile("train-images-idx3-ubyte.gz", img, sizeof img);
    fz_tmpfile("train-labels-idx1-ubyte.gz", lab, sizeof lab);
    fz_tmpfile("t10k-images-idx3-ubyte.gz", img, sizeof img);
    fz_tmpfile("t10k-labels-idx1-ubyte.gz", lab, sizeof lab);
    static const char text[] = "the quick brown fox jumps over the lazy dog, again and again and again.\n";
    fz_tmpfile("text.txt", text, sizeof text - 1);
}

/* ------------------------------------------------------------------------
 * Config: every declared key's default, then the few a plugin needs here. */

static kiln_kv fz_kv[64];

static const kiln_kv *fz_config(const fz_plugin *p) {
    static char dir[512], text[600];
    snprintf(dir, sizeof dir, "%s", fz_tmpdir());
    snprintf(text, sizeof text, "%s/text.txt", fz_tmpdir());
    int n = 0;
    for (const kiln_param *k = p->desc->params; k && k->key && n < 60; k++) {
        if (k->def.type == KILN_TYPE_NONE) continue;
        fz_kv[n].key = k->key;
        fz_kv[n].value = k->def;
        if (k->type == KILN_TYPE_FLOAT && k->def.type == KILN_TYPE_INT) {
            fz_kv[n].value.type = KILN_TYPE_FLOAT;
            fz_kv[n].value.v.f = (double)k->def.v.i;
        }
        n++;
    }
    /* overrides: set an existing key or add it */
#define FZ_SET(K, T, FIELD, X)                                                     \
    do {                                                                           \
        int i_ = 0;                                                                \
        while (i_ < n && strcmp(fz_kv[i_].key, K)) i_++;                           \
        if (i_ == n) n++;                                                          \
        fz_kv[i_].key = K;                                                         \
        fz_kv[i_].value = (kiln_value){.type = T};                                 \
        fz_kv[i_].value.v.FIELD = X;                                               \
    } while (0)
    if (!strcmp(p->name, "early_stopping")) FZ_SET("monitor", KILN_TYPE_STRING, s, "val_loss");
    if (!strcmp(p->name, "checkpoint")) {
        FZ_SET("monitor", KILN_TYPE_STRING, s, "val_loss");
        /* fixed, so the state seeds do not depend on the temporary
         * directory; set_state never touches the files it names */
        FZ_SET("dirpath", KILN_TYPE_STRING, s, "/kiln-fuzz-nonexistent/checkpoints");
    }
    if (!strcmp(p->name, "plateau")) FZ_SET("monitor", KILN_TYPE_STRING, s, "val_loss");
    if (!strcmp(p->name, "idx")) {
        FZ_SET("dir", KILN_TYPE_STRING, s, dir);
        FZ_SET("batch_size", KILN_TYPE_INT, i, 3);
        FZ_SET("val_split", KILN_TYPE_INT, i, 4);
    }
    if (!strcmp(p->name, "tokens")) {
        FZ_SET("format", KILN_TYPE_STRING, s, "text");
        FZ_SET("train", KILN_TYPE_STRING, s, text);
        FZ_SET("block_size", KILN_TYPE_INT, i, 4);
        FZ_SET("batch_size", KILN_TYPE_INT, i, 2);
        FZ_SET("vocab_size", KILN_TYPE_INT, i, 256);
        FZ_SET("val_fraction", KILN_TYPE_FLOAT, f, 0.25);
    }
#undef FZ_SET
    fz_kv[n].key = NULL;
    fz_kv[n].value = (kiln_value){.type = KILN_TYPE_NONE};
    return fz_kv;
}

/* The bootstrap struct a library's init receives: the test host's own is
 * reached only through kiln_test_load (a dlopen), so this one hands out the
 * same services table. */
/* the test host's services, but quiet: a warning per refused blob would flood the
 * fuzzer's output and slow it down (set KILN_FUZZ_VERBOSE=1 to see them) */
static kiln_host_services fz_svc;
static int fz_restoring; /* inside set_state: what it logs comes from the blob */

static void fz_log(kiln_host_ctx *h, int32_t level, const char *msg) {
    (void)h;
    if (getenv("KILN_FUZZ_VERBOSE")) fprintf(stderr, "fuzz_state: log %d: %s\n", level, msg);
    /* a newline from a blob in a log line forges the next one */
    if (fz_restoring && strchr(msg, '\n')) {
        fprintf(stderr, "fuzz_state: invariant broken: set_state logged more than one line: %s\n", msg);
        abort();
    }
}

static const kiln_host_services *fz_services(void) {
    if (!fz_svc.struct_size) {
        fz_svc = *kiln_test_services(g_th);
        fz_svc.log = fz_log;
    }
    return &fz_svc;
}

static const kiln_host_services *fz_get_services(uint16_t major, uint16_t minor) {
    return major == KILN_ABI_MAJOR && minor <= KILN_ABI_MINOR ? fz_services() : NULL;
}
static const kiln_host_base fz_base_storage = {sizeof(kiln_host_base), KILN_ABI_MAJOR, KILN_ABI_MINOR, "fuzz",
                                               fz_get_services, KILN_CAP_KNOWN_1_0};
static const kiln_host_base *fz_base(void) { return &fz_base_storage; }

static void fz_write_seeds(const char *dir);
static int32_t fz_setup(const fz_plugin *p, kiln_instance *inst);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static int done; /* libFuzzer calls it; so does the first input when it did not */
    if (done++) return 0;
    if (kiln_test_host_new(&g_th) != KILN_OK) return 1;
    /* Every slot after flags is a function pointer (kiln/training.h),
     * and every slot first gets the aborting stub. Restoring a state
     * calls only alloc, free, copy, zero and synchronize: those five
     * then get real ones. */
    void (*stub)(void) = fz_not_here;
    for (size_t off = offsetof(kiln_kernels, alloc); off + sizeof stub <= sizeof fz_kernels; off += sizeof stub)
        memcpy((char *)&fz_kernels + off, &stub, sizeof stub);
    fz_kernels.struct_size = sizeof fz_kernels;
    fz_kernels.alloc = fz_alloc;
    fz_kernels.free = fz_free;
    fz_kernels.copy = fz_copy;
    fz_kernels.zero = fz_zero;
    fz_kernels.synchronize = fz_sync;
    fz_make_params();
    fz_make_data();
    for (int i = 0; i < FZ_NPLUGINS; i++) {
        const kiln_library *lib = NULL;
        fz_check(fz_plugins[i].init(fz_base(), &lib) == KILN_OK && lib, "a plugin library did not initialise");
        for (uint32_t k = 0; k < lib->plugin_count; k++)
            if (lib->plugins[k]->kind == fz_plugins[i].kind && !strcmp(lib->plugins[k]->name, fz_plugins[i].name))
                fz_plugins[i].desc = lib->plugins[k];
        fz_check(fz_plugins[i].desc != NULL, fz_plugins[i].name);
        /* the table lists only plugins with a state (bf16-mixed has none) */
        fz_check(((const kiln_ops_header *)fz_plugins[i].desc->ops)->set_state != NULL, fz_plugins[i].name);
    }
    const char *seeds = getenv("KILN_FUZZ_STATE_SEEDS");
    if (seeds && seeds[0]) fz_write_seeds(seeds);
    return 0;
}

/* setup as the host calls it before set_state (optimizers, precisions) */
static int32_t fz_setup(const fz_plugin *p, kiln_instance *inst) {
    if (p->kind == KILN_KIND_OPTIMIZER)
        return ((const kiln_optimizer_ops *)p->desc->ops)->setup(inst, fz_param_ptrs, 3);
    if (p->kind == KILN_KIND_PRECISION) {
        const kiln_precision_ops *o = p->desc->ops;
        return o->setup ? o->setup(inst, fz_param_ptrs, 3) : KILN_OK;
    }
    return KILN_OK;
}

static void fz_data_epoch(const fz_plugin *p, kiln_instance *inst, int already, const uint8_t *blob, size_t n) {
    const kiln_data_ops *o = p->desc->ops;
    if (!already && o->setup(inst, KILN_STAGE_FIT, 0, 1) != KILN_OK) return;
    int64_t nb = 0;
    o->num_batches(inst, KILN_SPLIT_TRAIN, &nb);
    uint64_t epoch = 0;
    for (size_t i = 0; i < 8 && 8 + i < n; i++) epoch |= (uint64_t)blob[8 + i] << (8 * i);
    /* -1: from the restored position, as the host resumes an epoch */
    if (o->start_epoch(inst, KILN_SPLIT_TRAIN, epoch, -1) != KILN_OK) return;
    kiln_batch b;
    for (int i = 0; i < 8; i++) {
        memset(&b, 0, sizeof b);
        if (o->next(inst, KILN_SPLIT_TRAIN, &b) != 1) break;
    }
}

/* KILN_FUZZ_STATE_SEEDS=DIR (make_seeds.py): write each plugin's own state,
 * as this harness sets it up, framed as an input, into DIR: seeds that the
 * instances here accept, so mutation starts inside the checks. */
static void fz_write_seeds(const char *dir) {
    for (int i = 0; i < FZ_NPLUGINS; i++) {
        const fz_plugin *p = &fz_plugins[i];
        const kiln_ops_header *ops = p->desc->ops;
        kiln_instance *inst = NULL;
        kiln_test_set_accelerator(g_th, (kiln_instance *)&fz_acc_token, &fz_kernels);
        if (ops->create(p->desc->plugin_ctx, fz_services(), kiln_test_hctx(g_th), fz_config(p), &inst) != KILN_OK) continue;
        if (fz_setup(p, inst) == KILN_OK && p->kind == KILN_KIND_DATA) {
            /* a position inside an epoch: two batches into epoch 1 */
            const kiln_data_ops *o = p->desc->ops;
            kiln_batch b;
            if (o->setup(inst, KILN_STAGE_FIT, 0, 1) == KILN_OK && o->start_epoch(inst, KILN_SPLIT_TRAIN, 1, 0) == 0)
                for (int k = 0; k < 2; k++) o->next(inst, KILN_SPLIT_TRAIN, &b);
        }
        uint32_t v = 0;
        void *blob = NULL;
        size_t n = 0;
        if (ops->get_state && ops->get_state(inst, &v, &blob, &n) == KILN_OK) {
            for (int flags = 0; flags <= 0x80; flags += 0x80) {
                char path[1024];
                snprintf(path, sizeof path, "%s/harness-%s-%02x", dir, p->name, flags);
                FILE *f = fopen(path, "wb");
                uint8_t head[6] = {(uint8_t)i, (uint8_t)flags, (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16),
                                   (uint8_t)(v >> 24)};
                if (f) {
                    fwrite(head, 1, sizeof head, f);
                    fwrite(blob, 1, n, f);
                    fclose(f);
                }
            }
            fz_services()->free(kiln_test_hctx(g_th), blob);
        }
        ops->destroy(inst);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) ready = LLVMFuzzerInitialize(NULL, NULL) == 0;
    fz_in in = {data, size};
    const fz_plugin *p = &fz_plugins[fz_u8(&in) % FZ_NPLUGINS];
    int data_first = (fz_u8(&in) & 0x80) != 0;
    uint32_t version = fz_u32(&in);
    const kiln_ops_header *ops = p->desc->ops;

    /* a fresh host: parameters a module registered last time (gan) go, as
     * a new run's would, and the records with them */
    kiln_test_reset(g_th);
    /* what the test host hands every instance */
    kiln_test_set_accelerator(g_th, (kiln_instance *)&fz_acc_token, &fz_kernels);
    kiln_test_set_config(g_th, NULL);
    kiln_test_clear_error(g_th);
    kiln_instance *inst = NULL;
    if (ops->create(p->desc->plugin_ctx, fz_services(), kiln_test_hctx(g_th), fz_config(p), &inst) != KILN_OK || !inst) {
        fprintf(stderr, "fuzz_state: %s: create failed: %s\n", p->name, kiln_test_error(g_th));
        abort();
    }
    int rc = fz_setup(p, inst);
    fz_check(rc == KILN_OK, "setup failed");
    int already = 0;
    if (p->kind == KILN_KIND_DATA && data_first) {
        rc = ((const kiln_data_ops *)p->desc->ops)->setup(inst, KILN_STAGE_FIT, 0, 1);
        fz_check(rc == KILN_OK, "data setup failed");
        already = 1;
    }
    /* the blob is the input itself: libFuzzer and replay_main.c hand over an
     * exact-size heap copy, so a read past its end is an ASan report */
    fz_restoring = 1;
    rc = ops->set_state(inst, version, in.p, in.n);
    fz_restoring = 0;
    if (rc == KILN_OK) {
        uint32_t v2 = 0;
        void *blob = NULL;
        size_t n2 = 0;
        if (ops->get_state && ops->get_state(inst, &v2, &blob, &n2) == KILN_OK) {
            rc = ops->set_state(inst, v2, blob, n2);
            fz_check(rc == KILN_OK, "the plugin refuses its own state after accepting a blob");
            fz_services()->free(kiln_test_hctx(g_th), blob);
        }
        if (p->kind == KILN_KIND_DATA) fz_data_epoch(p, inst, already, in.p, in.n);
    } else {
        fz_check(rc < 0, "set_state refused with a non-negative status");
        fz_check(strchr(kiln_test_error(g_th), '\n') == NULL, "a refusal message spans lines");
    }
    ops->destroy(inst);
    return 0;
}
