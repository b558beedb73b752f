/*
 * tests/ddp/ddpdump.c — a test-only callback for the multi-process ddp tests.
 * At on_fit_end it writes every parameter's raw master values (fp32 or fp64,
 * in registration order, nothing else; copied out through the kernel
 * table, so device memory too) to `<path>.<rank>`, the rank taken
 * from the trainer state, so a test can compare ranks with each other and
 * with a single-process run. With kill_rank/kill_batch set it raises SIGKILL
 * on that rank at the start of that training batch, so a test can check that
 * the MPI job ends (non-zero) instead of hanging in a collective.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <kiln/kiln.h>

struct ddpdump {
    const kiln_host_services *svc;
    kiln_host_ctx *h;
    char path[1024];
    int64_t kill_rank, kill_batch;
};

static int32_t dd_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    (void)ctx;
    struct ddpdump *d = calloc(1, sizeof *d);
    if (!d) return kiln_errorf(svc, h, KILN_E_NOMEM, "ddpdump: out of memory");
    d->svc = svc;
    d->h = h;
    snprintf(d->path, sizeof d->path, "%s", kiln_kv_str(cfg, "path", ""));
    d->kill_rank = kiln_kv_int(cfg, "kill_rank", -1);
    d->kill_batch = kiln_kv_int(cfg, "kill_batch", -1);
    *out = (kiln_instance *)d;
    return KILN_OK;
}

static void dd_destroy(kiln_instance *i) { free(i); }

static int32_t dd_dump(struct ddpdump *d, int32_t rank) {
    if (!d->path[0]) return KILN_OK;
    kiln_parameter *const *ps;
    uint32_t n;
    int32_t rc = d->svc->params(d->h, &ps, &n);
    if (rc) return rc;
    char file[1100];
    snprintf(file, sizeof file, "%s.%d", d->path, (int)rank);
    /* the values come through the kernel table's copy(): on a GPU they are
     * device memory, which the host cannot read directly */
    kiln_instance *acc = NULL;
    const kiln_kernels *kt = NULL;
    if ((rc = d->svc->accelerator(d->h, &acc, &kt))) return rc;
    FILE *f = fopen(file, "wb");
    if (!f) return kiln_errorf(d->svc, d->h, KILN_E_IO, "ddpdump: %s: cannot write", file);
    for (uint32_t k = 0; k < n && rc == KILN_OK; k++) {
        const size_t bytes = kiln_dtype_size(kiln_param_dtype(ps[k])) * (size_t)ps[k]->numel;
        void *buf = malloc(bytes ? bytes : 1); /* (numel) */
        if (!buf) rc = KILN_E_NOMEM;
        else if ((rc = kt->copy(acc, buf, ps[k]->data, bytes, KILN_COPY_D2H)) == KILN_OK) fwrite(buf, 1, bytes, f);
        free(buf);
    }
    if (fclose(f) != 0 && rc == KILN_OK) rc = kiln_errorf(d->svc, d->h, KILN_E_IO, "ddpdump: %s: write failed", file);
    return rc;
}

static int32_t dd_event(kiln_instance *i, kiln_event *ev) {
    struct ddpdump *d = (struct ddpdump *)i;
    if (!ev->trainer) return KILN_OK;
    const int32_t rank = ev->trainer->rank;
    if (ev->id == KILN_EV_ON_TRAIN_BATCH_START && ev->trainer->stage == KILN_STAGE_FIT && rank == d->kill_rank &&
        ev->batch_idx == d->kill_batch) {
        fprintf(stderr, "ddpdump: rank %d: SIGKILL at batch %lld\n", (int)rank, (long long)ev->batch_idx);
        fflush(NULL);
        raise(SIGKILL);
    }
    if (ev->id == KILN_EV_ON_FIT_END) return dd_dump(d, rank);
    return KILN_OK;
}

static const kiln_callback_ops dd_ops = {{sizeof(kiln_callback_ops), 0, dd_create, dd_destroy, NULL, NULL},
                                         dd_event};
static const kiln_param dd_params[] = {
    {"path", KILN_TYPE_STRING, 0, KILN_V_STR(""), "weights go to <path>.<rank> at on_fit_end (empty: none)"},
    {"kill_rank", KILN_TYPE_INT, 0, KILN_V_INT(-1), "rank that raises SIGKILL (-1: none)"},
    {"kill_batch", KILN_TYPE_INT, 0, KILN_V_INT(-1), "training batch index at whose start it does"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
static const kiln_plugin_desc dd_desc = {sizeof(kiln_plugin_desc), KILN_KIND_CALLBACK, "ddpdump", "1.0.0",
                                         "ddp tests: per-rank weight dump, SIGKILL on one rank", 0, NULL, dd_params,
                                         &dd_ops, NULL};
KILN_DEFINE_LIBRARY("ddpdump", "1.0.0", 1, &dd_desc)
