/*
 * gan.h — what the three source files of the "gan" module plugin share: the
 * instance (config, the two networks' registered parameters, the activation
 * arena and its views, the noise generators, the manual-optimisation
 * bookkeeping), the network code of gan_net.c (Linear/LeakyReLU/tanh
 * forward and a backward that honours KILN_PARAMF_FROZEN), the private PRNG
 * with its Box-Muller normals, and the PNG grid writer of gan_png.c. All
 * names are gan_-prefixed and have hidden visibility (the plugin exports
 * only kiln_plugin_init_v1).
 */
#ifndef KILN_PLUGIN_GAN_H
#define KILN_PLUGIN_GAN_H

#include <kiln/kiln.h>

#include "../common/plugin_common.h"
#include <kiln/rng.h>

#include <stddef.h>
#include <stdint.h>

#define GAN_VERSION "0.1.0"

/* Every network here is three Linear layers. */
#define GAN_LAYERS 3

/* Which loss the next backward op back-propagates (the one last passed to
 * manual_backward). */
enum { GAN_LOSS_NONE = 0, GAN_LOSS_G = 1, GAN_LOSS_D = 2 };

/* D's two logits: softmax cross-entropy with these class labels is exactly
 * BCE-with-logits on (logit_real - logit_fake). */
enum { GAN_FAKE = 0, GAN_REAL = 1, GAN_CLASSES = 2 };

/* PRNG: kiln/rng.h (splitmix64 seeding into xoshiro256**, as mlp). */
/* n standard normals (Box-Muller, pairs from two uniforms in double). */
void gan_rng_normal(kiln_rng *r, float *out, size_t n);

/* One MLP: Linear(w0, w1) -> LeakyReLU(0.2) -> Linear(w1, w2) -> LeakyReLU
 * -> Linear(w2, w3) -> out_act (KILN_ACT_TANH, or -1 for none). */
typedef struct gan_net {
    const char *name;                      /* "generator" / "discriminator"  */
    int32_t width[GAN_LAYERS + 1];
    int32_t out_act;
    kiln_parameter *weight[GAN_LAYERS];    /* (width[l+1], width[l]) each    */
    kiln_parameter *bias[GAN_LAYERS];      /* (width[l+1]) each              */
    char names[2 * GAN_LAYERS][32];        /* "generator.0.weight" ...       */
} gan_net;

/* The activations of one forward pass of a gan_net over B rows, views into
 * the arena sized for max_batch rows. */
typedef struct gan_acts {
    const float *in;          /* (B, width[0]) the input of the last forward  */
    float *pre[GAN_LAYERS];   /* (B, width[l+1]) x W^T + b                    */
    float *post[GAN_LAYERS];  /* (B, width[l+1]) act(pre); post[2] = pre[2]
                                 when the net has no output activation       */
    float *probs;             /* (B, 2) softmax of the logits (D passes only) */
} gan_acts;

typedef struct gan {
    const kiln_host_services *svc;
    kiln_host_ctx *hctx;
    kiln_instance *acc;
    const kiln_kernels *k;

    /* config */
    int32_t latent, hidden, image_size;
    int32_t g_every, d_every;
    int32_t samples, grid_every;
    int32_t max_batch;
    int32_t side;             /* sqrt(image_size) when it is a square, else 0 */

    gan_net gen, disc;

    /* The activation arena (accelerator memory), allocated once at create()
     * for max_batch rows (and samples rows for the grid). */
    void *arena;
    size_t arena_bytes;
    float *xreal;             /* (max_batch, image_size) the batch, when the
                                 accelerator does not compute in host memory */
    float *z;                 /* (max_batch, latent) noise                    */
    int32_t *labels_real;     /* (max_batch) all GAN_REAL                     */
    int32_t *labels_fake;     /* (max_batch) all GAN_FAKE                     */
    gan_acts ga;              /* the generator's pass: post[2] = fake images  */
    gan_acts dr, df;          /* the discriminator on real / on fake images   */
    float *grad_a, *grad_b;   /* (max_batch, max(hidden, image_size)) ping-pong */
    float *dfake;             /* (max_batch, image_size) dL/dfake (G loss)    */

    /* Host memory, also allocated once. */
    float *zhost;             /* (max_batch, latent) noise staging            */
    float *grid_z;            /* (samples, latent) the fixed grid noise       */
    float *grid_img;          /* (samples, image_size) G(grid_z) read back    */

    kiln_rng noise;            /* training noise, seeded from "gan.noise"      */
    uint64_t eval_seed;       /* validation/test noise: from "gan.eval" and
                                 the batch index                             */

    /* manual optimisation bookkeeping */
    int32_t batch;            /* B of the last training forward               */
    int pending;              /* GAN_LOSS_* last passed to manual_backward    */
    int in_manual_backward;   /* 1 only while our manual_backward call runs   */
} gan;

/* Errors: set_error with a printf message, returns code. */
#define gan_fail(g, code, ...) PLUGIN_FAIL((g)->svc, (g)->hctx, (code), __VA_ARGS__)

/* gan_net.c */
/* Registers the six parameters of `net` (weight then bias per layer). */
int32_t gan_net_register(gan *g, gan_net *net);
/* nn.Linear's default init (kaiming-uniform, bound 1/sqrt(fan_in) for
 * weight and bias) from `rng`, through a host staging buffer of
 * stage_n >= max numel floats. */
int32_t gan_net_init(gan *g, gan_net *net, kiln_rng *rng, float *stage);
/* The compute weights are fp32 (this module computes in float32 only). */
int32_t gan_net_check_compute(gan *g, const gan_net *net, const char *step);
/* Forward of B rows of x: fills a (a->in = x). */
int32_t gan_net_forward(gan *g, const gan_net *net, gan_acts *a, int32_t B, const float *x);
/* Backward of B rows: dy (B, width[3]) is dL/d(pre[2]) (the output
 * activation's backward is the caller's). Adds weight/bias gradients of
 * every parameter not KILN_PARAMF_FROZEN; when dx is not NULL also writes
 * dL/dx (B, width[0]) there. Uses g->grad_a/grad_b as scratch; dy may be
 * one of them. */
int32_t gan_net_backward(gan *g, const gan_net *net, const gan_acts *a, int32_t B, const float *dy, float *dx);
/* D's loss against one label vector: softmax cross-entropy of a->post[2]
 * into a->probs. */
int32_t gan_xent(gan *g, gan_acts *a, const int32_t *labels, int32_t B, double *loss, int32_t *n_correct);

/* gan_png.c */
/* Writes `count` images (count a square, each side x side values in
 * [-1, 1]) as an 8-bit grayscale PNG grid of sqrt(count) x sqrt(count)
 * tiles with a 2-pixel border, to path via path.tmp and rename(). On
 * failure returns a status and a message in err. */
int32_t gan_png_write_grid(const char *path, const float *images, int32_t count, int32_t side, char *err,
                           size_t errlen);
/* Pixel value of one image value: [-1, 1] -> 0..255 (rounded; clamped;
 * NaN -> 0). */
uint8_t gan_png_pixel(float v);

#endif /* KILN_PLUGIN_GAN_H */
