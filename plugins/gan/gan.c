/*
 * gan.c — the "gan" module plugin: a generative adversarial network on
 * flattened images (Fashion-MNIST by default) trained with MANUAL
 * optimisation, Lightning's GAN pattern (automatic_optimization = False, two
 * optimizers, toggle_optimizer / manual_backward / optimizer.step). The
 * generator maps N(0, 1) noise through Linear/LeakyReLU(0.2) layers to a tanh
 * image; the discriminator maps an image to two logits (fake, real) whose
 * softmax cross-entropy is BCE-with-logits on their difference. Each
 * training_step: (a) toggle the generator's optimizer, back-propagate the
 * non-saturating loss CE(D(G(z)), real) through the frozen discriminator into
 * the generator, step it every g_every batches; (b) toggle the
 * discriminator's, back-propagate (CE(D(x), real) + CE(D(G(z).detach()),
 * fake)) / 2, step it every d_every batches. Between steps the gradients
 * accumulate. The module's backward op back-propagates whichever loss it
 * last passed to manual_backward; it refuses to run anywhere else. At the
 * end of every grid_every-th training epoch rank 0 writes a PNG grid of
 * samples from a fixed noise batch into the run directory. Everything a step
 * touches is allocated once at create() (the arena, host staging), so steps
 * allocate nothing; the network code is gan_net.c, the PNG writer gan_png.c.
 */
#include "gan.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper bound on every width: keeps products of widths far from overflow
 * and catches a runaway config with a clear message. */
#define GAN_MAX_WIDTH (1 << 20)

/* ---------------------------------------------------------------------------
 * Config */

static const kiln_param gan_params[] = {
    {"latent", KILN_TYPE_INT, 0, KILN_V_INT(64), "size of the generator's N(0, 1) noise vector"},
    {"hidden", KILN_TYPE_INT, 0, KILN_V_INT(256), "width of both hidden layers of both networks"},
    {"image_size", KILN_TYPE_INT, 0, KILN_V_INT(784), "values per image (28 x 28 = 784 for Fashion-MNIST)"},
    {"g_every", KILN_TYPE_INT, 0, KILN_V_INT(2),
     "the generator steps every g_every batches, accumulating gradients in between (>= 1)"},
    {"d_every", KILN_TYPE_INT, 0, KILN_V_INT(4),
     "the discriminator steps every d_every batches, accumulating gradients in between (>= 1)"},
    {"samples", KILN_TYPE_INT, 0, KILN_V_INT(64), "images in the sample grid; a square number <= max_batch"},
    {"grid_every", KILN_TYPE_INT, 0, KILN_V_INT(1), "write a sample grid PNG every N training epochs (0 = never)"},
    {"max_batch", KILN_TYPE_INT, 0, KILN_V_INT(512), "largest batch; activation buffers are sized for it once"},
    {NULL, KILN_TYPE_NONE, 0, KILN_V_NONE, NULL},
};

/* One integer key in [lo, hi]. */
static int32_t gan_int_key(gan *g, const kiln_kv *config, const char *key, int64_t def, int64_t lo, int64_t hi,
                           int32_t *out) {
    const int64_t v = kiln_kv_int(config, key, def);
    if (v < lo || v > hi)
        return gan_fail(g, KILN_E_CONFIG, "gan: config key '%s' must be in [%lld, %lld], got %lld", key,
                        (long long)lo, (long long)hi, (long long)v);
    *out = (int32_t)v;
    return KILN_OK;
}

static int32_t gan_isqrt(int32_t v) {
    int32_t r = (int32_t)lrint(sqrt((double)v));
    return r * r == v ? r : 0;
}

static int32_t gan_parse_config(gan *g, const kiln_kv *config) {
    int32_t rc;
    if ((rc = gan_int_key(g, config, "latent", 64, 1, GAN_MAX_WIDTH, &g->latent)) ||
        (rc = gan_int_key(g, config, "hidden", 256, 1, GAN_MAX_WIDTH, &g->hidden)) ||
        (rc = gan_int_key(g, config, "image_size", 784, 1, GAN_MAX_WIDTH, &g->image_size)) ||
        (rc = gan_int_key(g, config, "g_every", 2, 1, INT32_MAX, &g->g_every)) ||
        (rc = gan_int_key(g, config, "d_every", 4, 1, INT32_MAX, &g->d_every)) ||
        (rc = gan_int_key(g, config, "grid_every", 1, 0, INT32_MAX, &g->grid_every)) ||
        (rc = gan_int_key(g, config, "max_batch", 512, 1, GAN_MAX_WIDTH, &g->max_batch)) ||
        (rc = gan_int_key(g, config, "samples", 64, 1, GAN_MAX_WIDTH, &g->samples)))
        return rc;
    if (!gan_isqrt(g->samples))
        return gan_fail(g, KILN_E_CONFIG,
                        "gan: config key 'samples' must be a square number (the grid is sqrt x sqrt), got %d",
                        g->samples);
    if (g->samples > g->max_batch)
        return gan_fail(g, KILN_E_CONFIG,
                        "gan: config key 'samples' (%d) must not exceed max_batch (%d): the grid is generated in one "
                        "batch",
                        g->samples, g->max_batch);
    g->side = gan_isqrt(g->image_size);
    if (g->grid_every > 0 && !g->side)
        return gan_fail(g, KILN_E_CONFIG,
                        "gan: image_size %d is not a square number, so the samples cannot be drawn as side x side "
                        "images; set grid_every = 0 or a square image_size",
                        g->image_size);
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * The arena: one allocation carved into 64-byte aligned pieces; gan_layout
 * runs twice, with base == NULL to measure, then to assign. */

static int gan_carve(size_t *off, size_t rows, size_t cols, size_t elem, char *base, void **out) {
    size_t n, bytes;
    if (__builtin_mul_overflow(rows, cols, &n) || __builtin_mul_overflow(n, elem, &bytes)) return 0;
    if (bytes > SIZE_MAX - 63 - *off) return 0;
    if (base && out) *out = base + *off;
    *off += (bytes + 63) & ~(size_t)63;
    return 1;
}

/* One forward pass of `net` over `rows` rows: pre/post per layer (post[2]
 * aliases pre[2] when the net has no output activation), probs for D. */
static int gan_layout_pass(const gan_net *net, gan_acts *a, int with_probs, size_t rows, size_t *off, char *base) {
    int ok = 1;
    for (int l = 0; l < GAN_LAYERS && ok; l++) {
        const size_t w = (size_t)net->width[l + 1];
        ok = gan_carve(off, rows, w, sizeof(float), base, (void **)&a->pre[l]);
        if (l < GAN_LAYERS - 1 || net->out_act >= 0)
            ok = ok && gan_carve(off, rows, w, sizeof(float), base, (void **)&a->post[l]);
        else if (base)
            a->post[l] = a->pre[l];
    }
    if (with_probs) ok = ok && gan_carve(off, rows, GAN_CLASSES, sizeof(float), base, (void **)&a->probs);
    return ok;
}

static int gan_layout(gan *g, char *base, size_t *total) {
    size_t off = 0;
    const size_t R = (size_t)g->max_batch; /* >= samples, checked in config */
    const size_t gw = (size_t)(g->hidden > GAN_CLASSES ? g->hidden : GAN_CLASSES);
    int ok = gan_carve(&off, R, (size_t)g->image_size, sizeof(float), base, (void **)&g->xreal);
    ok = ok && gan_carve(&off, R, (size_t)g->latent, sizeof(float), base, (void **)&g->z);
    ok = ok && gan_carve(&off, R, 1, sizeof(int32_t), base, (void **)&g->labels_real);
    ok = ok && gan_carve(&off, R, 1, sizeof(int32_t), base, (void **)&g->labels_fake);
    ok = ok && gan_layout_pass(&g->gen, &g->ga, 0, R, &off, base);
    ok = ok && gan_layout_pass(&g->disc, &g->dr, 1, R, &off, base);
    ok = ok && gan_layout_pass(&g->disc, &g->df, 1, R, &off, base);
    ok = ok && gan_carve(&off, R, gw, sizeof(float), base, (void **)&g->grad_a);
    ok = ok && gan_carve(&off, R, gw, sizeof(float), base, (void **)&g->grad_b);
    ok = ok && gan_carve(&off, R, (size_t)g->image_size, sizeof(float), base, (void **)&g->dfake);
    *total = off;
    return ok;
}

/* ---------------------------------------------------------------------------
 * Lifecycle */

static void gan_destroy(kiln_instance *inst) {
    gan *g = (gan *)inst;
    if (!g) return;
    if (g->arena && g->k && g->k->free) g->k->free(g->acc, g->arena);
    free(g->zhost);
    free(g->grid_z);
    free(g->grid_img);
    free(g);
}

/* The kernel entries this module calls, the 1.2 activations included. */
static int gan_kernels_ok(const kiln_kernels *k) {
    if (!k || k->struct_size < KILN_KERNELS_SIZE_1_2) return 0;
    return k->alloc && k->free && k->copy && k->zero && k->gemm && k->bias_add && k->bias_grad &&
           k->softmax_xent_forward && k->softmax_xent_backward && k->act_forward && k->act_backward;
}

/* Manual optimisation is the whole point: without the 1.2 services the
 * module cannot train, so say so at create() rather than mid-epoch. */
static int gan_services_ok(const kiln_host_services *svc) {
    return svc->abi_minor >= 2 &&
           svc->struct_size >= offsetof(kiln_host_services, untoggle_optimizer) + sizeof(void *) &&
           svc->optimizer_count && svc->manual_backward && svc->optimizer_step && svc->optimizer_zero_grad &&
           svc->toggle_optimizer && svc->untoggle_optimizer;
}

static int32_t gan_create(void *plugin_ctx, const kiln_host_services *svc, kiln_host_ctx *hctx,
                          const kiln_kv *config, kiln_instance **out) {
    (void)plugin_ctx;
    *out = NULL;
    if (!svc || svc->abi_minor < 1 || !svc->accelerator || !svc->param_register || !svc->seed)
        return kiln_errorf(svc, hctx, KILN_E_HOST_TOO_OLD,
                           "gan: needs the ABI 1.1 services (accelerator, param_register, seed)");
    if (!gan_services_ok(svc))
        return kiln_errorf(svc, hctx, KILN_E_HOST_TOO_OLD,
                           "gan: optimises manually and needs the ABI 1.2 services (optimizer_count, "
                           "manual_backward, optimizer_step, optimizer_zero_grad, toggle_optimizer, "
                           "untoggle_optimizer); the host provides ABI 1.%u without them",
                           (unsigned)svc->abi_minor);
    gan *g = calloc(1, sizeof *g);
    if (!g) return kiln_errorf(svc, hctx, KILN_E_NOMEM, "gan: cannot allocate the instance");
    g->svc = svc;
    g->hctx = hctx;

    int32_t rc = gan_parse_config(g, config);
    if (rc != KILN_OK) goto fail;
    g->gen = (gan_net){.name = "generator",
                       .width = {g->latent, g->hidden, g->hidden, g->image_size},
                       .out_act = KILN_ACT_TANH};
    g->disc = (gan_net){.name = "discriminator",
                        .width = {g->image_size, g->hidden, g->hidden, GAN_CLASSES},
                        .out_act = -1};

    rc = svc->accelerator(hctx, &g->acc, &g->k);
    if (rc != KILN_OK) {
        rc = gan_fail(g, rc, "gan: no accelerator kernel table available (%s)", kiln_strerror(rc));
        goto fail;
    }
    if (!gan_kernels_ok(g->k)) {
        rc = gan_fail(g, KILN_E_UNSUPPORTED,
                      "gan: the accelerator's kernel table (%u bytes) lacks an entry this module needs: gemm, "
                      "bias_add, bias_grad, softmax_xent_* and the ABI 1.2 act_forward/act_backward (tanh, leaky "
                      "ReLU; a 1.2 table is %zu bytes)",
                      g->k ? g->k->struct_size : 0u, (size_t)KILN_KERNELS_SIZE_1_2);
        goto fail;
    }

    /* The arena and host buffers, once, before any parameter is registered:
     * a failure here leaves nothing behind on the host. */
    if (!gan_layout(g, NULL, &g->arena_bytes)) {
        rc = gan_fail(g, KILN_E_CONFIG, "gan: activation buffers for max_batch %d overflow size_t", g->max_batch);
        goto fail;
    }
    rc = g->k->alloc(g->acc, g->arena_bytes, &g->arena);
    if (rc != KILN_OK || !g->arena) {
        g->arena = NULL;
        rc = gan_fail(g, rc != KILN_OK ? rc : KILN_E_NOMEM,
                      "gan: cannot allocate the %zu-byte activation arena (max_batch %d); lower max_batch",
                      g->arena_bytes, g->max_batch);
        goto fail;
    }
    gan_layout(g, (char *)g->arena, &g->arena_bytes);
    const size_t R = (size_t)g->max_batch;
    g->zhost = malloc(R * (size_t)g->latent * sizeof(float));
    g->grid_z = malloc((size_t)g->samples * (size_t)g->latent * sizeof(float));
    g->grid_img = malloc((size_t)g->samples * (size_t)g->image_size * sizeof(float));
    int32_t *ones = malloc(R * sizeof(int32_t));
    if (!g->zhost || !g->grid_z || !g->grid_img || !ones) {
        free(ones);
        rc = gan_fail(g, KILN_E_NOMEM, "gan: cannot allocate the host noise and sample buffers");
        goto fail;
    }
    for (size_t i = 0; i < R; i++) ones[i] = GAN_REAL;
    rc = g->k->copy(g->acc, g->labels_real, ones, R * sizeof(int32_t), KILN_COPY_H2D);
    free(ones);
    if (rc == KILN_OK) rc = g->k->zero(g->acc, g->labels_fake, R * sizeof(int32_t)); /* GAN_FAKE == 0 */
    if (rc != KILN_OK) {
        rc = gan_fail(g, rc, "gan: cannot fill the label buffers (%s)", kiln_strerror(rc));
        goto fail;
    }

    /* Noise streams, each derived from the run seed under its own name: the
     * training noise continues across steps (and is checkpointed); the grid
     * noise is drawn once so every epoch's grid shows the same latents. */
    kiln_rng_seed(&g->noise, svc->seed(hctx, "gan.noise"));
    kiln_rng grid;
    kiln_rng_seed(&grid, svc->seed(hctx, "gan.grid"));
    gan_rng_normal(&grid, g->grid_z, (size_t)g->samples * (size_t)g->latent);
    g->eval_seed = svc->seed(hctx, "gan.eval");

    /* generator first: its parameters are optimizer 0's in the example */
    if ((rc = gan_net_register(g, &g->gen)) != KILN_OK || (rc = gan_net_register(g, &g->disc)) != KILN_OK)
        goto fail;
    *out = (kiln_instance *)g;
    return KILN_OK;
fail:
    gan_destroy((kiln_instance *)g);
    return rc;
}

/* One PRNG stream over all twelve tensors in registration order: the same
 * seed gives the same bits, and the order is fixed by the config alone. */
static int32_t gan_init_weights(kiln_instance *self, uint64_t seed) {
    gan *g = (gan *)self;
    size_t maxn = 0;
    const gan_net *nets[2] = {&g->gen, &g->disc};
    for (int i = 0; i < 2; i++)
        for (int l = 0; l < GAN_LAYERS; l++)
            if ((size_t)nets[i]->weight[l]->numel > maxn) maxn = (size_t)nets[i]->weight[l]->numel;
    float *stage = malloc(maxn * sizeof *stage);
    if (!stage) return gan_fail(g, KILN_E_NOMEM, "gan: cannot allocate %zu values to stage init", maxn);
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    int32_t rc = gan_net_init(g, &g->gen, &rng, stage);
    if (rc == KILN_OK) rc = gan_net_init(g, &g->disc, &rng, stage);
    free(stage);
    g->pending = GAN_LOSS_NONE;
    return rc;
}

/* ---------------------------------------------------------------------------
 * Steps */

/* Checks the batch (inputs (B, features...) F32 with prod(features) ==
 * image_size, 1 <= B <= max_batch; labels, if any, are ignored) and the
 * compute dtypes; returns B and where the forward reads the real images. */
static int32_t gan_prepare(gan *g, const kiln_batch *batch, const char *step, int32_t *B_out, const float **xin) {
    if (!batch || batch->ntensors < 1 || !batch->tensors)
        return gan_fail(g, KILN_E_DATA, "gan: %s expects a batch whose first tensor is the images, got %u tensors",
                        step, batch ? (unsigned)batch->ntensors : 0u);
    const kiln_tensor *x = &batch->tensors[0];
    const int64_t B = batch->size;
    if (B < 1)
        return gan_fail(g, KILN_E_DATA, "gan: %s got an empty batch (size %lld)", step, (long long)B);
    if (B > g->max_batch)
        return gan_fail(g, KILN_E_DATA, "gan: %s got a batch of %lld rows but max_batch is %d (raise gan.max_batch)",
                        step, (long long)B, g->max_batch);
    if (x->dtype != KILN_DTYPE_F32 || x->ndim < 2 || x->ndim > KILN_MAX_DIMS || !x->data)
        return gan_fail(g, KILN_E_DATA, "gan: %s expects images as an F32 tensor (B, features), got %s with %u dims",
                        step, kiln_dtype_name(x->dtype), (unsigned)x->ndim);
    int64_t features = 1;
    for (uint32_t d = 1; d < x->ndim; d++) features *= x->shape[d];
    if (features != g->image_size)
        return gan_fail(g, KILN_E_DATA, "gan: %s expects %d values per image (image_size), got %lld", step,
                        g->image_size, (long long)features);
    if (x->shape[0] < B)
        return gan_fail(g, KILN_E_DATA, "gan: %s: the images have %lld rows but the batch size is %lld", step,
                        (long long)x->shape[0], (long long)B);
    int32_t rc = gan_net_check_compute(g, &g->gen, step);
    if (rc == KILN_OK) rc = gan_net_check_compute(g, &g->disc, step);
    if (rc != KILN_OK) return rc;
    if (g->k->flags & KILN_KERNELS_HOST_MEMORY) {
        *xin = (const float *)x->data;
    } else {
        rc = g->k->copy(g->acc, g->xreal, x->data, (size_t)B * (size_t)g->image_size * sizeof(float),
                        KILN_COPY_H2D);
        if (rc != KILN_OK) return gan_fail(g, rc, "gan: copying the images failed (%s)", kiln_strerror(rc));
        *xin = g->xreal;
    }
    *B_out = (int32_t)B;
    return KILN_OK;
}

/* Noise for B rows from `rng` into g->z, then fake = G(z) in g->ga. */
static int32_t gan_generate(gan *g, kiln_rng *rng, const float *zsrc, int32_t B) {
    const size_t nz = (size_t)B * (size_t)g->latent;
    if (!zsrc) {
        gan_rng_normal(rng, g->zhost, nz);
        zsrc = g->zhost;
    }
    int32_t rc = g->k->copy(g->acc, g->z, zsrc, nz * sizeof(float), KILN_COPY_H2D);
    if (rc != KILN_OK) return gan_fail(g, rc, "gan: copying the noise failed (%s)", kiln_strerror(rc));
    return gan_net_forward(g, &g->gen, &g->ga, B, g->z);
}

/* manual_backward(loss), remembering which loss our backward op must
 * back-propagate; only inside this call does the backward op accept work. */
static int32_t gan_manual_backward(gan *g, int which, double loss) {
    g->pending = which;
    g->in_manual_backward = 1;
    int32_t rc = g->svc->manual_backward(g->hctx, loss);
    g->in_manual_backward = 0;
    return rc;
}

/* optimizer.step(); optimizer.zero_grad() when this batch closes a window
 * of `every` accumulated batches. */
static int32_t gan_maybe_step(gan *g, uint32_t index, int64_t batch_idx, int32_t every) {
    if ((batch_idx + 1) % every != 0) return KILN_OK;
    int32_t rc = g->svc->optimizer_step(g->hctx, index, NULL, NULL);
    if (rc == KILN_OK) rc = g->svc->optimizer_zero_grad(g->hctx, index);
    return rc;
}

/* The discriminator on real and on fake images and its loss
 * (CE(D(x), real) + CE(D(fake), fake)) / 2; D's passes stay in dr / df. */
static int32_t gan_d_loss(gan *g, const float *xin, int32_t B, int recompute_fake, double *d_loss,
                          int32_t *n_real_ok) {
    double lr = 0.0, lf = 0.0;
    int32_t rc = gan_net_forward(g, &g->disc, &g->dr, B, xin);
    if (rc == KILN_OK) rc = gan_xent(g, &g->dr, g->labels_real, B, &lr, n_real_ok);
    if (rc == KILN_OK && recompute_fake) rc = gan_net_forward(g, &g->disc, &g->df, B, g->ga.post[GAN_LAYERS - 1]);
    if (rc == KILN_OK) rc = gan_xent(g, &g->df, g->labels_fake, B, &lf, NULL);
    *d_loss = 0.5 * (lr + lf);
    return rc;
}

static int32_t gan_training_step(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx,
                                 kiln_step_output *out) {
    gan *g = (gan *)self;
    const kiln_host_services *svc = g->svc;
    kiln_host_ctx *h = g->hctx;
    g->pending = GAN_LOSS_NONE;
    const uint32_t nopt = svc->optimizer_count(h);
    if (nopt != 2)
        return gan_fail(g, KILN_E_CONFIG,
                        "gan needs two optimizers (generator, discriminator) in `optimizers = (...)`; the run has %u",
                        (unsigned)nopt);
    int32_t B = 0;
    const float *xin = NULL;
    int32_t rc = gan_prepare(g, batch, "training_step", &B, &xin);
    if (rc != KILN_OK) return rc;
    g->batch = B;
    if ((rc = gan_generate(g, &g->noise, NULL, B)) != KILN_OK) return rc;

    /* (a) generator: non-saturating loss CE(D(G(z)), real) through the
     * frozen discriminator */
    double g_loss = 0.0;
    if ((rc = svc->toggle_optimizer(h, 0)) != KILN_OK) return rc;
    rc = gan_net_forward(g, &g->disc, &g->df, B, g->ga.post[GAN_LAYERS - 1]);
    if (rc == KILN_OK) rc = gan_xent(g, &g->df, g->labels_real, B, &g_loss, NULL);
    if (rc == KILN_OK) rc = gan_manual_backward(g, GAN_LOSS_G, g_loss);
    if (rc == KILN_OK) rc = gan_maybe_step(g, 0, batch_idx, g->g_every);
    if (rc == KILN_OK) rc = svc->untoggle_optimizer(h, 0);
    if (rc != KILN_OK) return rc;

    /* (b) discriminator on real and detached fake images. D(fake) is
     * computed again: the generator step above must not have changed D,
     * but if an optimizer list made it do so, the loss still matches D. */
    double d_loss = 0.0;
    int32_t n_real_ok = 0;
    if ((rc = svc->toggle_optimizer(h, 1)) != KILN_OK) return rc;
    rc = gan_d_loss(g, xin, B, 1, &d_loss, &n_real_ok);
    if (rc == KILN_OK) rc = gan_manual_backward(g, GAN_LOSS_D, d_loss);
    if (rc == KILN_OK) rc = gan_maybe_step(g, 1, batch_idx, g->d_every);
    if (rc == KILN_OK) rc = svc->untoggle_optimizer(h, 1);
    if (rc != KILN_OK) return rc;

    module_step_loss(out, d_loss, B); /* the discriminator's loss */
    if (svc->log_value) {
        const uint32_t f = KILN_LOG_ON_STEP | KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR;
        svc->log_value(h, "g_loss", g_loss, f, (double)B);
        svc->log_value(h, "d_loss", d_loss, f, (double)B);
        svc->log_value(h, "d_real_acc", (double)n_real_ok / (double)B, KILN_LOG_ON_STEP | KILN_LOG_ON_EPOCH,
                       (double)B);
    }
    return KILN_OK;
}

/* The module's backward op: gradients of dloss * (the loss last passed to
 * manual_backward), ADDED to the grads of every parameter not frozen. */
static int32_t gan_backward(kiln_instance *self, double dloss) {
    gan *g = (gan *)self;
    if (!g->in_manual_backward)
        return gan_fail(g, KILN_E_STATE,
                        "gan: backward was called outside manual_backward; this module optimises manually "
                        "(automatic_optimization = false) and back-propagates only inside its own training_step's "
                        "manual_backward calls");
    const kiln_kernels *k = g->k;
    const int32_t B = g->batch;
    const float fd = (float)dloss;
    if (g->pending == GAN_LOSS_G) {
        /* dlogits -> through D (grads only where not frozen) -> dL/dfake */
        int32_t rc = k->softmax_xent_backward(g->acc, g->grad_a, g->df.probs, g->labels_real, B, GAN_CLASSES, fd);
        if (rc != KILN_OK) return gan_fail(g, rc, "gan: kernel softmax_xent_backward failed: %s", kiln_strerror(rc));
        if ((rc = gan_net_backward(g, &g->disc, &g->df, B, g->grad_a, g->dfake)) != KILN_OK) return rc;
        rc = k->act_backward(g->acc, KILN_DTYPE_F32, KILN_ACT_TANH, g->dfake, g->dfake, g->ga.pre[GAN_LAYERS - 1],
                             (size_t)B * (size_t)g->image_size);
        if (rc != KILN_OK) return gan_fail(g, rc, "gan: kernel act_backward(tanh) failed: %s", kiln_strerror(rc));
        return gan_net_backward(g, &g->gen, &g->ga, B, g->dfake, NULL);
    }
    if (g->pending == GAN_LOSS_D) {
        /* d_loss = (CE_real + CE_fake) / 2: each half seeded with dloss / 2;
         * the fake images are detached, so nothing flows into G */
        const gan_acts *passes[2] = {&g->dr, &g->df};
        const int32_t *labels[2] = {g->labels_real, g->labels_fake};
        for (int i = 0; i < 2; i++) {
            int32_t rc = k->softmax_xent_backward(g->acc, g->grad_a, passes[i]->probs, labels[i], B, GAN_CLASSES,
                                                  0.5f * fd);
            if (rc != KILN_OK)
                return gan_fail(g, rc, "gan: kernel softmax_xent_backward failed: %s", kiln_strerror(rc));
            if ((rc = gan_net_backward(g, &g->disc, passes[i], B, g->grad_a, NULL)) != KILN_OK) return rc;
        }
        return KILN_OK;
    }
    return gan_fail(g, KILN_E_STATE, "gan: backward without a forward: no loss of this training_step is pending");
}

/* validation_step / test_step: both losses without backward, on noise that
 * depends only on the run seed and the batch index. D is unchanged between
 * its two passes here, so D(fake) serves both losses. */
static int32_t gan_eval_step(gan *g, const kiln_batch *batch, int64_t batch_idx, kiln_step_output *out,
                             const char *step, const char *g_name, const char *d_name) {
    g->pending = GAN_LOSS_NONE; /* the activations are about to be overwritten */
    int32_t B = 0;
    const float *xin = NULL;
    int32_t rc = gan_prepare(g, batch, step, &B, &xin);
    if (rc != KILN_OK) return rc;
    kiln_rng rng;
    kiln_rng_seed(&rng, g->eval_seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(batch_idx + 1)));
    if ((rc = gan_generate(g, &rng, NULL, B)) != KILN_OK) return rc;
    double g_loss = 0.0, d_loss = 0.0;
    rc = gan_net_forward(g, &g->disc, &g->df, B, g->ga.post[GAN_LAYERS - 1]);
    if (rc == KILN_OK) rc = gan_xent(g, &g->df, g->labels_real, B, &g_loss, NULL);
    if (rc == KILN_OK) rc = gan_d_loss(g, xin, B, 0, &d_loss, NULL);
    if (rc != KILN_OK) return rc;
    module_step_loss(out, d_loss, B); /* the discriminator's loss */
    if (g->svc->log_value) {
        const uint32_t f = KILN_LOG_ON_EPOCH | KILN_LOG_PROG_BAR;
        g->svc->log_value(g->hctx, g_name, g_loss, f, (double)B);
        g->svc->log_value(g->hctx, d_name, d_loss, f, (double)B);
    }
    return KILN_OK;
}

static int32_t gan_validation_step(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx,
                                   kiln_step_output *out) {
    return gan_eval_step((gan *)self, batch, batch_idx, out, "validation_step", "val_g_loss", "val_d_loss");
}

static int32_t gan_test_step(kiln_instance *self, const kiln_batch *batch, int64_t batch_idx, kiln_step_output *out) {
    return gan_eval_step((gan *)self, batch, batch_idx, out, "test_step", "test_g_loss", "test_d_loss");
}

/* ---------------------------------------------------------------------------
 * The sample grid (on_train_epoch_end) */

static int32_t gan_write_grid(gan *g, const char *run_dir, int64_t epoch) {
    int32_t rc = gan_net_check_compute(g, &g->gen, "on_train_epoch_end");
    if (rc != KILN_OK) return rc;
    g->pending = GAN_LOSS_NONE; /* G's training activations are overwritten */
    if ((rc = gan_generate(g, NULL, g->grid_z, g->samples)) != KILN_OK) return rc;
    const size_t n = (size_t)g->samples * (size_t)g->image_size;
    rc = g->k->copy(g->acc, g->grid_img, g->ga.post[GAN_LAYERS - 1], n * sizeof(float), KILN_COPY_D2H);
    if (rc == KILN_OK && g->k->synchronize) rc = g->k->synchronize(g->acc);
    if (rc != KILN_OK) return gan_fail(g, rc, "gan: reading back the samples failed (%s)", kiln_strerror(rc));
    char path[4096], err[512];
    if (snprintf(path, sizeof path, "%s/samples_epoch_%03lld.png", run_dir, (long long)epoch) >= (int)sizeof path)
        return gan_fail(g, KILN_E_IO, "gan: run directory path too long: %s", run_dir);
    rc = gan_png_write_grid(path, g->grid_img, g->samples, g->side, err, sizeof err);
    if (rc != KILN_OK) return gan_fail(g, rc, "gan: sample grid for epoch %lld: %s", (long long)epoch, err);
    kiln_logf(g->svc, g->hctx, KILN_LOG_INFO, "gan: wrote %d samples of epoch %lld to %s", g->samples,
              (long long)epoch, path);
    return KILN_OK;
}

static int32_t gan_on_event(kiln_instance *self, kiln_event *ev) {
    gan *g = (gan *)self;
    if (!ev || ev->id != KILN_EV_ON_TRAIN_EPOCH_END || g->grid_every <= 0) return KILN_OK;
    const kiln_trainer_state *ts = ev->trainer ? ev->trainer : g->svc->trainer_state(g->hctx);
    if (!ts || ts->rank != 0) return KILN_OK; /* rank 0 writes for everyone */
    if ((ts->current_epoch + 1) % g->grid_every != 0) return KILN_OK;
    if (!ts->run_dir || !ts->run_dir[0]) {
        kiln_logf(g->svc, g->hctx, KILN_LOG_WARN, "gan: no run directory; skipping the sample grid of epoch %lld",
                  (long long)ts->current_epoch);
        return KILN_OK;
    }
    return gan_write_grid(g, ts->run_dir, ts->current_epoch);
}

/* ---------------------------------------------------------------------------
 * State: the training noise stream, so a resumed run draws the noise an
 * uninterrupted one would. Version 1: "GANN" then four uint64 (xoshiro). */

#define GAN_STATE_VERSION 1u
#define GAN_STATE_BYTES (4 + 4 * sizeof(uint64_t))

static int32_t gan_get_state(kiln_instance *self, uint32_t *state_version, void **data, size_t *size) {
    gan *g = (gan *)self;
    unsigned char *blob = g->svc->alloc(g->hctx, GAN_STATE_BYTES, 0);
    if (!blob) return gan_fail(g, KILN_E_NOMEM, "gan: cannot allocate %zu bytes of state", (size_t)GAN_STATE_BYTES);
    memcpy(blob, "GANN", 4);
    memcpy(blob + 4, g->noise.s, 4 * sizeof(uint64_t));
    *state_version = GAN_STATE_VERSION;
    *data = blob;
    *size = GAN_STATE_BYTES;
    return KILN_OK;
}

static int32_t gan_set_state(kiln_instance *self, uint32_t state_version, const void *data, size_t size) {
    gan *g = (gan *)self;
    if (state_version != GAN_STATE_VERSION)
        return gan_fail(g, KILN_E_STATE, "gan: state version %u; this build reads version %u", state_version,
                        GAN_STATE_VERSION);
    if (!data || size != GAN_STATE_BYTES || memcmp(data, "GANN", 4) != 0)
        return gan_fail(g, KILN_E_STATE, "gan: state of %zu bytes is not a gan noise state (expected %zu bytes "
                        "starting with \"GANN\")", size, (size_t)GAN_STATE_BYTES);
    memcpy(g->noise.s, (const unsigned char *)data + 4, 4 * sizeof(uint64_t));
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Descriptor */

static const kiln_module_ops gan_ops = {
    .base = {sizeof(kiln_module_ops), 0, gan_create, gan_destroy, gan_get_state, gan_set_state},
    .init_weights = gan_init_weights,
    .training_step = gan_training_step,
    .backward = gan_backward,
    .validation_step = gan_validation_step,
    .test_step = gan_test_step,
    .on_event = gan_on_event,
};

/* Manual optimisation (the host checks the optimizers and hands out the 1.2
 * services), float32 masters only. */
static const char *const gan_param_dtypes[] = {"float32"};
/* allowed values, enforced by the host before create() (ABI 1.5) */
static const char *const gan_checks[] = {"latent in [1, 1048576]", "hidden in [1, 1048576]", "image_size in [1, 1048576]", "g_every >= 1", "d_every >= 1", "grid_every >= 0", "max_batch in [1, 1048576]", "samples in [1, 1048576]"};
static const kiln_kv gan_props[] = {
    {"automatic_optimization", KILN_V_BOOL(0)},
    {"param_dtypes", KILN_V_STRS(gan_param_dtypes)},
    {"config_checks", KILN_V_STRS(gan_checks)},
    {NULL, KILN_V_NONE},
};

static const kiln_plugin_desc gan_desc = {
    sizeof(kiln_plugin_desc),
    KILN_KIND_MODULE,
    "gan",
    GAN_VERSION,
    "GAN (MLP generator and discriminator, LeakyReLU/tanh) trained with manual optimisation and two optimizers; "
    "writes a PNG grid of samples per epoch",
    KILN_CAP_STATEFUL,
    gan_props,
    gan_params,
    &gan_ops,
    NULL,
};

/* Needs the ABI 1.2 services (manual optimisation), hence min host minor 2. */
KILN_DEFINE_LIBRARY("gan", GAN_VERSION, 2, &gan_desc)
