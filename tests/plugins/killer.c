/*
 * tests/plugins/killer.c — a test-only callback for the kill-and-resume
 * tests: it asks the host for checkpoints/last.safetensors after every
 * `every`-th training batch (save_checkpoint, written at the end of that
 * batch), kills its own process with SIGKILL (or SIGTERM) at a chosen
 * point — at a batch's start or end, during validation, at an epoch's
 * end — or poisons the first weight with a NaN (signal = "POISON", for
 * nan_guard), or stops itself with SIGSTOP (signal = "STOP": a hung rank,
 * for ddp's collective timeout), optionally on one `rank` only, and writes
 * every parameter's raw values to `dump` at on_fit_end, so a resumed run can
 * be compared with an uninterrupted one.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common_train.h"
#include "fixture_head.h"

struct kl {
    fixture_head hd; /* first: fixture_new fills it in */
    int64_t every, epoch, batch, rank;
    char at[32], sig[8], dump[1024];
};

static int32_t kl_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    struct kl *k = fixture_new(sizeof *k, ctx, svc, h);
    if (!k) return KILN_E_NOMEM;
    k->every = kiln_kv_int(cfg, "every", 1);
    k->epoch = kiln_kv_int(cfg, "kill_epoch", -1);
    k->batch = kiln_kv_int(cfg, "kill_batch", -1);
    k->rank = kiln_kv_int(cfg, "rank", -1);
    fixture_str(k->at, sizeof k->at, cfg, "kill_at", "none");
    fixture_str(k->sig, sizeof k->sig, cfg, "signal", "KILL");
    fixture_str(k->dump, sizeof k->dump, cfg, "dump", "");
    *out = (kiln_instance *)k;
    return KILN_OK;
}

static void kl_destroy(kiln_instance *i) { free(i); }

static void kl_maybe_kill(struct kl *k, const char *where, const kiln_event *ev) {
    if (strcmp(k->at, where) || ev->trainer->current_epoch != k->epoch) return;
    if (k->batch >= 0 && ev->batch_idx != k->batch) return;
    if (k->rank >= 0 && ev->trainer->rank != k->rank) return;
    if (!strcmp(k->sig, "POISON")) { /* a NaN weight instead of a signal, for nan_guard */
        kiln_parameter *const *ps;
        uint32_t n;
        if (k->hd.svc->params(k->hd.h, &ps, &n) == KILN_OK && n > 0) ((float *)ps[0]->data)[0] = NAN;
        return;
    }
    fflush(NULL);
    raise(!strcmp(k->sig, "TERM") ? SIGTERM : !strcmp(k->sig, "STOP") ? SIGSTOP : SIGKILL);
}

static int32_t kl_dump(struct kl *k) {
    kiln_parameter *const *ps;
    uint32_t n;
    int32_t rc = k->hd.svc->params(k->hd.h, &ps, &n);
    if (rc) return rc;
    FILE *f = fopen(k->dump, "wb");
    if (!f) return kiln_errorf(k->hd.svc, k->hd.h, KILN_E_IO, "%s: cannot write", k->dump);
    for (uint32_t i = 0; i < n; i++)
        fwrite(ps[i]->data, kiln_dtype_size(kiln_param_dtype(ps[i])), (size_t)ps[i]->numel, f);
    return fclose(f) == 0 ? KILN_OK : KILN_E_IO;
}

static int32_t kl_event(kiln_instance *i, kiln_event *ev) {
    struct kl *k = (struct kl *)i;
    const int fit = ev->trainer && ev->trainer->stage != KILN_STAGE_SANITY;
    switch (ev->id) {
    case KILN_EV_ON_TRAIN_BATCH_START: if (fit) kl_maybe_kill(k, "batch_start", ev); break;
    case KILN_EV_ON_TRAIN_BATCH_END:
        if (k->every > 0 && ev->trainer->global_step % k->every == 0) {
            int32_t rc = k->hd.svc->save_checkpoint(k->hd.h, "checkpoints/last.safetensors");
            if (rc) return rc;
        }
        kl_maybe_kill(k, "batch_end", ev);
        break;
    case KILN_EV_ON_VALIDATION_BATCH_END: if (fit) kl_maybe_kill(k, "validation", ev); break;
    case KILN_EV_ON_TRAIN_EPOCH_END: kl_maybe_kill(k, "epoch_end", ev); break;
    case KILN_EV_ON_FIT_END: return k->dump[0] ? kl_dump(k) : KILN_OK;
    default: break;
    }
    return KILN_OK;
}

static const kiln_callback_ops kl_ops = {{sizeof(kiln_callback_ops), 0, kl_create, kl_destroy, NULL, NULL}, kl_event};
static const kiln_param kl_params[] = {
    {"every", KILN_TYPE_INT, 0, KILN_V_INT(1), "request a checkpoint every N global steps (0: never)"},
    {"kill_epoch", KILN_TYPE_INT, 0, KILN_V_INT(-1), "epoch of the kill"},
    {"kill_batch", KILN_TYPE_INT, 0, KILN_V_INT(-1), "batch of the kill (-1: any)"},
    {"kill_at", KILN_TYPE_STRING, 0, KILN_V_STR("none"), "batch_start | batch_end | validation | epoch_end | none"},
    {"signal", KILN_TYPE_STRING, 0, KILN_V_STR("KILL"),
     "KILL, TERM, STOP (hang), or POISON (a NaN into the first weight)"},
    {"rank", KILN_TYPE_INT, 0, KILN_V_INT(-1), "only on this global rank (-1: every rank)"},
    {"dump", KILN_TYPE_STRING, 0, KILN_V_STR(""), "write the weights here at on_fit_end"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
FIXTURE_LIBRARY(kl_desc, KILN_KIND_CALLBACK, "killer",
                "checkpoints every step and kills itself on cue", kl_params, &kl_ops, 2)
