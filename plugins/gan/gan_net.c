/*
 * gan_net.c — the networks of the "gan" module: a three-layer perceptron
 * (Linear -> LeakyReLU(0.2) -> Linear -> LeakyReLU -> Linear -> optional
 * tanh) registered in PyTorch nn.Sequential naming ("generator.0.weight",
 * "generator.2.bias", ... — indices 1 and 3 are the activations, which have
 * no parameters), initialised like nn.Linear, and run forward and backward
 * entirely through the accelerator's float32 kernels (gemm, bias_add,
 * bias_grad, softmax_xent_*) plus the 1.2 act_forward/act_backward entries
 * for LeakyReLU and tanh. The backward is the piece manual optimisation
 * needs beyond mlp.c's: it can return the gradient with respect to the
 * network's INPUT (the generator loss flows through the discriminator into
 * the fake images), and it skips the gradient writes of every parameter the
 * host marked KILN_PARAMF_FROZEN (toggle_optimizer) while still propagating
 * through its weights. Also here: the private PRNG and its normals.
 */
#include "gan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* A kernel call failed: name the kernel, the network and the layer. */
#define GAN_K(g, call, what, net, layer)                                                                  \
    do {                                                                                                  \
        int32_t rc_ = (call);                                                                             \
        if (rc_ != KILN_OK)                                                                               \
            return gan_fail((g), rc_, "gan: kernel %s failed (%s layer %d): %s", (what), (net)->name,     \
                            (int)(layer), kiln_strerror(rc_));                                            \
    } while (0)

/* ---------------------------------------------------------------------------
 * Normal noise over kiln/rng.h's generator. */

/* Box-Muller: u1 in (0, 1] (53 bits, never 0, so the log is finite),
 * u2 in [0, 1); each pair gives two independent N(0, 1). */
void gan_rng_normal(kiln_rng *r, float *out, size_t n) {
    const double two_pi = 6.283185307179586476925;
    for (size_t i = 0; i < n; i += 2) {
        const double u1 = ((double)(kiln_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
        const double u2 = (double)(kiln_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
        const double rad = sqrt(-2.0 * log(u1));
        out[i] = (float)(rad * cos(two_pi * u2));
        if (i + 1 < n) out[i + 1] = (float)(rad * sin(two_pi * u2));
    }
}

/* ---------------------------------------------------------------------------
 * Parameters */

int32_t gan_net_register(gan *g, gan_net *net) {
    for (int l = 0; l < GAN_LAYERS; l++) {
        const int64_t wshape[2] = {net->width[l + 1], net->width[l]}; /* (out, in) */
        const int64_t bshape[1] = {net->width[l + 1]};                /* (out)     */
        char *wname = net->names[2 * l], *bname = net->names[2 * l + 1];
        /* nn.Sequential indices: Linear layers sit at 0, 2, 4 */
        snprintf(wname, sizeof net->names[0], "%s.%d.weight", net->name, 2 * l);
        snprintf(bname, sizeof net->names[0], "%s.%d.bias", net->name, 2 * l);
        int32_t rc = g->svc->param_register(g->hctx, wname, 2, wshape, 0, &net->weight[l]);
        if (rc == KILN_OK)
            rc = g->svc->param_register(g->hctx, bname, 1, bshape, KILN_PARAMF_NO_DECAY, &net->bias[l]);
        if (rc != KILN_OK)
            return gan_fail(g, rc, "gan: registering %s / %s failed (%s)", wname, bname, kiln_strerror(rc));
    }
    return KILN_OK;
}

int32_t gan_net_init(gan *g, gan_net *net, kiln_rng *rng, float *stage) {
    for (int l = 0; l < GAN_LAYERS; l++) {
        /* nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) is
         * U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias uses the same bound. */
        const float bound = (float)(1.0 / sqrt((double)net->width[l]));
        kiln_parameter *ps[2] = {net->weight[l], net->bias[l]};
        for (int j = 0; j < 2; j++) {
            kiln_parameter *p = ps[j];
            if (!p->data || !p->grad)
                return gan_fail(g, KILN_E_STATE, "gan: init_weights before the host allocated %s", p->name);
            if (kiln_param_dtype(p) != KILN_DTYPE_F32)
                return gan_fail(g, KILN_E_UNSUPPORTED,
                                "gan: %s has %s master weights; this module supports float32 only "
                                "(use precision 32-true)",
                                p->name, kiln_dtype_name(kiln_param_dtype(p)));
            const size_t n = (size_t)p->numel;
            for (size_t i = 0; i < n; i++) stage[i] = kiln_rng_uniformf(rng, -bound, bound);
            int32_t rc = g->k->copy(g->acc, p->data, stage, n * sizeof(float), KILN_COPY_H2D);
            if (rc == KILN_OK) rc = g->k->zero(g->acc, p->grad, n * sizeof(float));
            if (rc != KILN_OK) return gan_fail(g, rc, "gan: writing %s failed (%s)", p->name, kiln_strerror(rc));
        }
    }
    return KILN_OK;
}

int32_t gan_net_check_compute(gan *g, const gan_net *net, const char *step) {
    for (int l = 0; l < GAN_LAYERS; l++) {
        const kiln_parameter *ps[2] = {net->weight[l], net->bias[l]};
        for (int j = 0; j < 2; j++) {
            const kiln_parameter *p = ps[j];
            if (!p->compute || !p->grad)
                return gan_fail(g, KILN_E_STATE,
                                "gan: %s: %s has no compute weights or gradient (host did not set them up)", step,
                                p->name);
            if (p->compute_dtype != KILN_DTYPE_F32 || kiln_param_dtype(p) != KILN_DTYPE_F32)
                return gan_fail(g, KILN_E_UNSUPPORTED,
                                "gan: %s: %s computes in %s with %s masters; this module computes in float32 only "
                                "(use precision 32-true)",
                                step, p->name, kiln_dtype_name(p->compute_dtype),
                                kiln_dtype_name(kiln_param_dtype(p)));
        }
    }
    return KILN_OK;
}

/* ---------------------------------------------------------------------------
 * Forward / backward */

int32_t gan_net_forward(gan *g, const gan_net *net, gan_acts *a, int32_t B, const float *x) {
    const kiln_kernels *k = g->k;
    kiln_instance *acc = g->acc;
    a->in = x;
    for (int l = 0; l < GAN_LAYERS; l++) {
        const int32_t in = net->width[l], out = net->width[l + 1];
        const float *W = (const float *)net->weight[l]->compute; /* (out, in) */
        const float *b = (const float *)net->bias[l]->compute;   /* (out)     */
        const size_t n = (size_t)B * (size_t)out;
        /* pre = x . W^T + b */
        GAN_K(g, k->gemm(acc, 0, 1, B, out, in, 1.0f, x, in, W, in, 0.0f, a->pre[l], out), "gemm(forward)", net, l);
        GAN_K(g, k->bias_add(acc, a->pre[l], b, B, out), "bias_add", net, l);
        if (l < GAN_LAYERS - 1)
            GAN_K(g, k->act_forward(acc, KILN_DTYPE_F32, KILN_ACT_LEAKY_RELU, a->post[l], a->pre[l], n),
                  "act_forward(leaky_relu)", net, l);
        else if (net->out_act >= 0)
            GAN_K(g, k->act_forward(acc, KILN_DTYPE_F32, net->out_act, a->post[l], a->pre[l], n),
                  "act_forward(output)", net, l);
        x = a->post[l];
    }
    return KILN_OK;
}

int32_t gan_net_backward(gan *g, const gan_net *net, const gan_acts *a, int32_t B, const float *dy, float *dx) {
    const kiln_kernels *k = g->k;
    kiln_instance *acc = g->acc;
    for (int l = GAN_LAYERS - 1; l >= 0; l--) {
        const int32_t in = net->width[l], out = net->width[l + 1];
        const float *x = l == 0 ? a->in : a->post[l - 1]; /* (B, in) the layer's input */
        kiln_parameter *W = net->weight[l], *bias = net->bias[l];
        /* requires_grad = False (toggle_optimizer): leave its .grad alone */
        if (!(W->flags & KILN_PARAMF_FROZEN)) /* dW(out, in) += dy^T . x */
            GAN_K(g, k->gemm(acc, 1, 0, out, in, B, 1.0f, dy, out, x, in, 1.0f, W->grad, in), "gemm(weight grad)",
                  net, l);
        if (!(bias->flags & KILN_PARAMF_FROZEN))
            GAN_K(g, k->bias_grad(acc, bias->grad, dy, B, out, 1), "bias_grad", net, l);
        if (l == 0 && !dx) break; /* nobody needs dL/dinput */
        /* dprev(B, in) = dy . W, through the previous layer's LeakyReLU */
        float *dst = l == 0 ? dx : (dy == g->grad_a ? g->grad_b : g->grad_a);
        GAN_K(g, k->gemm(acc, 0, 0, B, in, out, 1.0f, dy, out, (const float *)W->compute, in, 0.0f, dst, in),
              "gemm(input grad)", net, l);
        if (l > 0)
            GAN_K(g, k->act_backward(acc, KILN_DTYPE_F32, KILN_ACT_LEAKY_RELU, dst, dst, a->pre[l - 1],
                                     (size_t)B * (size_t)in),
                  "act_backward(leaky_relu)", net, l - 1);
        dy = dst;
    }
    return KILN_OK;
}

int32_t gan_xent(gan *g, gan_acts *a, const int32_t *labels, int32_t B, double *loss, int32_t *n_correct) {
    float lf = 0.0f;
    int32_t rc = g->k->softmax_xent_forward(g->acc, a->probs, a->post[GAN_LAYERS - 1], labels, B, GAN_CLASSES, &lf,
                                            n_correct);
    if (rc != KILN_OK)
        return gan_fail(g, rc, "gan: kernel softmax_xent_forward failed (discriminator logits): %s",
                        kiln_strerror(rc));
    *loss = (double)lf;
    return KILN_OK;
}
