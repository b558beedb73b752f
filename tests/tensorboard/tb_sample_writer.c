/*
 * tb_sample_writer.c — writes one TensorBoard event file with the
 * tensorboard callback plugin, for tb_tensorboard_reader.py to read back
 * with TensorBoard's own Python reader. Usage:
 *     tb_sample_writer <plugin_dir> <run_dir>
 * It loads <plugin_dir>/libkiln-tensorboard.so through the test host, runs
 * a short Lightning-ordered sequence (setup, fit start, a few epochs of train
 * metrics, validation metrics at the epoch ends, fit end, teardown) with
 * <run_dir> as the trainer's run directory, and prints on stdout what it
 * logged, one line per scalar, then where the file went:
 *     scalar <step> <tag> <value %.17g>
 *     dir <run_dir>/tensorboard
 * The reader compares TensorBoard's view of the file with these lines, so the
 * expectations live in one place. Exit status 0 on success, 1 on any plugin
 * error (with the host's error text on stderr).
 */
#include <stdio.h>
#include <string.h>

#include <kiln/testing.h>

static kiln_test_host *g_th; /* the test host (kiln/testing.h) the plugin runs under */

/* The event sequence's shape: a tiny fit of EPOCHS epochs of BATCHES
 * steps each, logging every step. */
#define EPOCHS 3
#define BATCHES 4

static const kiln_callback_ops *g_ops;
static kiln_instance *g_inst;
static kiln_trainer_state g_ts;

static int send(uint32_t id, const kiln_kv *metrics, int64_t step) {
    kiln_event e;
    memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
    e.id = id;
    e.stage = KILN_STAGE_FIT;
    e.batch_idx = -1;
    e.trainer = &g_ts;
    e.metrics = metrics;
    e.step = step;
    int32_t rc = g_ops->on_event(g_inst, &e);
    if (rc != KILN_OK) {
        fprintf(stderr, "tb_sample_writer: %s on %s: %s\n", kiln_status_name(rc), kiln_event_name(id), kiln_test_error(g_th));
        return 1;
    }
    for (const kiln_kv *kv = metrics; kv && kv->key; kv++)
        printf("scalar %lld %s %.17g\n", (long long)step, kv->key, kv->value.v.f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: tb_sample_writer <plugin_dir> <run_dir>\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/libkiln-tensorboard.so", argv[1]);
    if (kiln_test_host_new(&g_th) != KILN_OK) return 1;
    const kiln_plugin_desc *d = NULL;
    kiln_test_load(g_th, path, KILN_KIND_CALLBACK, "tensorboard", &d);
    if (!d) {
        fprintf(stderr, "tb_sample_writer: cannot load the tensorboard plugin from %s\n", path);
        return 1;
    }
    g_ops = d->ops;
    static const kiln_kv cfg[] = {
        {"subdir", KILN_V_STR("tensorboard")},
        {"flush_every_n", KILN_V_INT(2)},
        {"filename_suffix", KILN_V_STR("")},
        {NULL, KILN_V_NONE},
    };
    if (g_ops->base.create(d->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), cfg, &g_inst) != KILN_OK) {
        fprintf(stderr, "tb_sample_writer: create failed: %s\n", kiln_test_error(g_th));
        return 1;
    }
    memset(&g_ts, 0, sizeof g_ts);
    g_ts.struct_size = sizeof g_ts;
    g_ts.stage = KILN_STAGE_FIT;
    g_ts.run_dir = argv[2];
    g_ts.world_size = 1;
    g_ts.accumulate_grad_batches = 1;
    (*kiln_test_trainer(g_th)) = g_ts;

    int bad = send(KILN_EV_SETUP, NULL, 0) || send(KILN_EV_ON_FIT_START, NULL, 0);
    int64_t step = 0;
    for (int ep = 0; ep < EPOCHS && !bad; ep++) {
        for (int b = 0; b < BATCHES && !bad; b++, step++) {
            /* a loss that decays, a learning rate that steps per epoch */
            kiln_kv m[] = {{"train_loss", KILN_V_FLOAT(2.0 / (1.0 + (double)step))},
                           {"lr", KILN_V_FLOAT(0.1 / (double)(1 << ep))},
                           {NULL, KILN_V_NONE}};
            bad = send(KILN_EV_LOG_METRICS, m, step);
        }
        kiln_kv v[] = {{"val_loss", KILN_V_FLOAT(1.5 - 0.25 * ep)},
                       {"val_acc", KILN_V_FLOAT(0.5 + 0.125 * ep)},
                       {"epoch", KILN_V_FLOAT((double)ep)},
                       {NULL, KILN_V_NONE}};
        if (!bad) bad = send(KILN_EV_LOG_METRICS, v, step - 1);
        if (!bad) bad = send(KILN_EV_ON_TRAIN_EPOCH_END, NULL, 0);
    }
    if (!bad) bad = send(KILN_EV_ON_FIT_END, NULL, 0) || send(KILN_EV_TEARDOWN, NULL, 0);
    g_ops->base.destroy(g_inst);
    printf("dir %s/tensorboard\n", argv[2]);
    return bad ? 1 : 0;
}
