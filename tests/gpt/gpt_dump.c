/*
 * gpt_dump.c — runs ONE training step of the "gpt" module plugin on the cpu
 * accelerator through the test host (no trainer, no optimizer) and writes
 * the loss, every parameter and every gradient to a safetensors file, so a
 * PyTorch script can rebuild the same model (transformers'
 * GPT2LMHeadModel, weights loaded by name), run the same batch and compare
 * loss and gradients tensor by tensor.
 *
 * Command line:
 *   gpt_dump --out FILE --inputs FILE --targets FILE --batch B --seq T
 *            [--precision 32-true|64-true|bf16-mixed|16-mixed] [--seed N]
 *            [--dloss X] [--plugin-dir DIR] [gpt_key=value ...]
 * --inputs / --targets: raw little-endian int32, B*T values each, row-major
 *   (B, T) (numpy: np.asarray(x, np.int32).tofile(path)); targets -1 =
 *   ignored position. gpt_key=value sets a gpt config key (n_layer, n_head,
 *   n_embd, block_size, vocab_size, padded_vocab_size, max_batch,
 *   classifier_chunk, layer_norm_epsilon, initializer_range); unset keys
 *   take gpt's defaults, except max_batch, which defaults to B. The weights
 *   are gpt's own init_weights(seed) (default seed 1234). --precision
 *   emulates what that precision plugin sets up: float64 masters for
 *   64-true, float32 masters with bfloat16 / float16 copies of every matrix
 *   for bf16-mixed / 16-mixed (no loss scaling: --dloss, default 1, is the
 *   backward seed; the gradients are those of dloss * loss).
 *
 * Output (safetensors: an 8-byte little-endian header length, a JSON header
 * padded with spaces to a multiple of 8, then the raw little-endian data):
 *   "<parameter name>"       the weights the step used, masters' dtype (F32,
 *                            or F64 under 64-true), shape as registered:
 *                            Hugging Face GPT2LMHeadModel's names and shapes
 *                            ("transformer.wte.weight" [V, C], Conv1D
 *                            weights [in, out]); lm_head.weight is tied to
 *                            transformer.wte.weight and not written
 *   "grad.<parameter name>"  its gradient after backward(dloss), same dtype
 *   "loss"                   F64 [1] the step's loss (mean cross-entropy over
 *                            targets != -1)
 *   "inputs", "targets"      I32 [B, T] the batch
 *   "__metadata__"           strings: format ("kiln-gpt-dump-1"),
 *                            precision, seed, dloss, loss ("%.17g"), and
 *                            every gpt config key the run used
 * Read with safetensors.numpy.load_file(path) (or parse the header by hand:
 * every data_offsets pair is relative to the end of the header).
 *
 * Exit status: 0 on success, 1 on a usage error, 2 when a step fails (the
 * module's message is printed).
 */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <kiln/testing.h>

static kiln_test_host *g_th; /* the test host (kiln/testing.h) the plugin runs under */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KILN_DEFAULT_PLUGIN_DIR
#define KILN_DEFAULT_PLUGIN_DIR "."
#endif

/* The config keys gpt declares, with their types (INT unless FLOAT). */
static const char *const dump_keys[] = {"n_layer",  "n_head",    "n_embd",           "block_size",
                                        "vocab_size", "padded_vocab_size", "max_batch", "classifier_chunk",
                                        "layer_norm_epsilon", "initializer_range"};
#define DUMP_NKEYS 10

/* A zeroed step output whose struct_size is this build's (the struct grows
 * with the ABI). */
static kiln_step_output step_output(void) {
    kiln_step_output o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    return o;
}

static int usage(const char *msg) {
    fprintf(stderr, "gpt_dump: %s\n", msg);
    fprintf(stderr,
            "usage: gpt_dump --out FILE --inputs FILE --targets FILE --batch B --seq T\n"
            "                [--precision 32-true|64-true|bf16-mixed|16-mixed] [--seed N] [--dloss X]\n"
            "                [--plugin-dir DIR] [gpt_key=value ...]\n");
    return 1;
}

/* n int32 values from a raw file; 0 on success. */
static int read_i32(const char *path, int32_t *dst, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t got = fread(dst, sizeof *dst, n, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    return got == n && !extra ? 0 : -1;
}

/* One tensor of the output file. */
typedef struct dump_tensor {
    char name[160];
    const char *dtype; /* "F32", "F64", "I32" */
    int64_t shape[4];
    uint32_t ndim;
    const void *data;
    size_t bytes;
} dump_tensor;

static int write_safetensors(const char *path, const dump_tensor *t, size_t n, const char *metadata) {
    size_t cap = 4096 + n * 256 + strlen(metadata), len = 0, off = 0;
    char *hdr = malloc(cap);
    if (!hdr) return -1;
    len += (size_t)snprintf(hdr + len, cap - len, "{\"__metadata__\":{%s}", metadata);
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name, t[i].dtype);
        for (uint32_t d = 0; d < t[i].ndim; d++)
            len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].bytes);
        off += t[i].bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return -1;
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)len >> (8 * i));
    int ok = fwrite(le, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len;
    for (size_t i = 0; i < n && ok; i++) ok = fwrite(t[i].data, 1, t[i].bytes, f) == t[i].bytes;
    ok = fclose(f) == 0 && ok;
    free(hdr);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    const char *out_path = NULL, *in_path = NULL, *tg_path = NULL, *precision = "32-true";
    const char *plugin_dir = getenv("KILN_PLUGIN_DIR") ? getenv("KILN_PLUGIN_DIR") : KILN_DEFAULT_PLUGIN_DIR;
    long long B = 0, T = 0;
    unsigned long long seed = 1234;
    double dloss = 1.0;
    /* gpt's config, every declared key present (the host would fill the
     * defaults; here they are restated) */
    kiln_kv kv[DUMP_NKEYS + 1];
    int64_t ival[DUMP_NKEYS] = {12, 12, 768, 1024, 50257, 0, 0, 256, 0, 0};
    double fval[DUMP_NKEYS] = {0, 0, 0, 0, 0, 0, 0, 0, 1e-5, 0.02};
    int max_batch_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--out") && v) out_path = argv[++i];
        else if (!strcmp(a, "--inputs") && v) in_path = argv[++i];
        else if (!strcmp(a, "--targets") && v) tg_path = argv[++i];
        else if (!strcmp(a, "--batch") && v) B = atoll(argv[++i]);
        else if (!strcmp(a, "--seq") && v) T = atoll(argv[++i]);
        else if (!strcmp(a, "--precision") && v) precision = argv[++i];
        else if (!strcmp(a, "--seed") && v) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--dloss") && v) dloss = atof(argv[++i]);
        else if (!strcmp(a, "--plugin-dir") && v) plugin_dir = argv[++i];
        else if (strchr(a, '=')) {
            int k = 0;
            const size_t kl = (size_t)(strchr(a, '=') - a);
            while (k < DUMP_NKEYS && !(strlen(dump_keys[k]) == kl && !strncmp(a, dump_keys[k], kl))) k++;
            if (k == DUMP_NKEYS) return usage("unknown gpt config key");
            if (k >= 8)
                fval[k] = atof(a + kl + 1);
            else
                ival[k] = atoll(a + kl + 1);
            max_batch_set |= k == 6;
        } else {
            return usage("unknown argument");
        }
    }
    if (!out_path || !in_path || !tg_path || B < 1 || T < 1 || B * T > (1ll << 30))
        return usage("--out, --inputs, --targets, --batch B >= 1 and --seq T >= 1 are required");
    if (!max_batch_set) ival[6] = B;
    const int f64 = !strcmp(precision, "64-true");
    const uint32_t reduced = !strcmp(precision, "bf16-mixed") ? KILN_DTYPE_BF16
                             : !strcmp(precision, "16-mixed") ? KILN_DTYPE_F16
                                                              : 0;
    if (!f64 && !reduced && strcmp(precision, "32-true")) return usage("unknown --precision");
    for (int k = 0; k < DUMP_NKEYS; k++)
        kv[k] = k >= 8 ? (kiln_kv){dump_keys[k], KILN_V_FLOAT(fval[k])} : (kiln_kv){dump_keys[k], KILN_V_INT(ival[k])};
    kv[DUMP_NKEYS] = (kiln_kv){NULL, KILN_V_NONE};

    const size_t n = (size_t)(B * T);
    int32_t *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    if (!x || !y || read_i32(in_path, x, n) || read_i32(tg_path, y, n)) {
        fprintf(stderr, "gpt_dump: %s and %s must hold exactly B*T = %zu int32 values each\n", in_path, tg_path, n);
        return 1;
    }

    /* the plugins */
    char path[4096];
    if (kiln_test_host_new(&g_th) != KILN_OK) return 1;
    snprintf(path, sizeof path, "%s/libkiln-gpt.so", plugin_dir);
    const kiln_plugin_desc *gd = NULL;
    kiln_test_load(g_th, path, KILN_KIND_MODULE, "gpt", &gd);
    snprintf(path, sizeof path, "%s/libkiln-cpu.so", plugin_dir);
    const kiln_plugin_desc *cd = NULL;
    kiln_test_load(g_th, path, KILN_KIND_ACCELERATOR, "cpu", &cd);
    if (!gd || !cd) {
        fprintf(stderr, "gpt_dump: cannot load libkiln-gpt.so and libkiln-cpu.so from %s\n", plugin_dir);
        return 2;
    }
    const kiln_accelerator_ops *aops = cd->ops;
    const kiln_module_ops *mops = gd->ops;
    kiln_instance *acc = NULL, *m = NULL;
    if (aops->base.create(cd->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), NULL, &acc) != KILN_OK) {
        fprintf(stderr, "gpt_dump: cpu accelerator: %s\n", kiln_test_error(g_th));
        return 2;
    }
    const kiln_kernels *k = aops->kernels(acc);
    kiln_test_set_accelerator(g_th, acc, k);
    if (mops->base.create(gd->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), kv, &m) != KILN_OK) {
        fprintf(stderr, "gpt_dump: %s\n", kiln_test_error(g_th));
        return 2;
    }

    /* masters (and compute copies) as the precision plugin would make them */
    void **copies = calloc(kiln_test_param_count(g_th), sizeof *copies);
    const size_t pes = f64 ? sizeof(double) : sizeof(float);
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
        kiln_parameter *p = kiln_test_param(g_th, i);
        const size_t bytes = ((size_t)p->numel * pes + 63) & ~(size_t)63;
        if (posix_memalign((void **)&p->data, 64, bytes) || posix_memalign((void **)&p->grad, 64, bytes)) return 2;
        memset(p->data, 0, bytes);
        memset(p->grad, 0, bytes);
        p->param_dtype = p->compute_dtype = f64 ? KILN_DTYPE_F64 : KILN_DTYPE_F32;
        p->compute = p->data;
    }
    int32_t rc = mops->init_weights(m, seed);
    for (uint32_t i = 0; i < kiln_test_param_count(g_th) && rc == KILN_OK && reduced; i++) {
        kiln_parameter *p = kiln_test_param(g_th, i);
        if (p->ndim < 2) continue;
        copies[i] = malloc((size_t)p->numel * 2);
        rc = copies[i] ? k->cast(acc, copies[i], reduced, p->data, KILN_DTYPE_F32, (size_t)p->numel) : KILN_E_NOMEM;
        p->compute = copies[i];
        p->compute_dtype = reduced;
    }

    /* the step */
    kiln_tensor bt[2] = {{x, KILN_DTYPE_I32, 2, {B, T, 1, 1}}, {y, KILN_DTYPE_I32, 2, {B, T, 1, 1}}};
    kiln_batch batch = {sizeof batch, 2, bt, B};
    kiln_step_output so = step_output();
    if (rc == KILN_OK) rc = mops->training_step(m, &batch, 0, &so);
    if (rc == KILN_OK) rc = mops->backward(m, dloss);
    if (rc != KILN_OK) {
        fprintf(stderr, "gpt_dump: %s (%s)\n", kiln_test_error(g_th), kiln_strerror(rc));
        return 2;
    }

    /* the file */
    dump_tensor *t = calloc(2 * (size_t)kiln_test_param_count(g_th) + 3, sizeof *t);
    size_t nt = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) {
            const kiln_parameter *p = kiln_test_param(g_th, i);
            dump_tensor *d = &t[nt++];
            snprintf(d->name, sizeof d->name, "%s%s", pass ? "grad." : "", p->name);
            d->dtype = f64 ? "F64" : "F32";
            d->ndim = p->ndim;
            memcpy(d->shape, p->shape, sizeof d->shape);
            d->data = pass ? (const void *)p->grad : (const void *)p->data;
            d->bytes = (size_t)p->numel * pes;
        }
    const double loss = so.loss;
    t[nt++] = (dump_tensor){"loss", "F64", {1, 1, 1, 1}, 1, &loss, sizeof loss};
    t[nt++] = (dump_tensor){"inputs", "I32", {B, T, 1, 1}, 2, x, n * sizeof *x};
    t[nt++] = (dump_tensor){"targets", "I32", {B, T, 1, 1}, 2, y, n * sizeof *y};
    char meta[2048];
    int ml = snprintf(meta, sizeof meta,
                      "\"format\":\"kiln-gpt-dump-1\",\"precision\":\"%s\",\"seed\":\"%llu\",\"dloss\":\"%.17g\","
                      "\"loss\":\"%.17g\"",
                      precision, seed, dloss, loss);
    for (int kk = 0; kk < DUMP_NKEYS; kk++)
        ml += kk >= 8 ? snprintf(meta + ml, sizeof meta - (size_t)ml, ",\"%s\":\"%.17g\"", dump_keys[kk], fval[kk])
                      : snprintf(meta + ml, sizeof meta - (size_t)ml, ",\"%s\":\"%lld\"", dump_keys[kk],
                                 (long long)ival[kk]);
    if (write_safetensors(out_path, t, nt, meta)) {
        fprintf(stderr, "gpt_dump: cannot write %s\n", out_path);
        return 2;
    }
    printf("loss %.17g\n", loss);

    mops->base.destroy(m);
    aops->base.destroy(acc);
    for (uint32_t i = 0; i < kiln_test_param_count(g_th); i++) free(copies[i]);
    free(copies);
    free(t);
    free(x);
    free(y);
    kiln_test_host_free(g_th);
    return 0;
}
