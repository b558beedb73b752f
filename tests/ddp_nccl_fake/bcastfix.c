/*
 * tests/ddp_nccl_fake/bcastfix.c — a test-only callback for the launch
 * without MPI, where a plugin's broadcast runs on NCCL through ddp's device
 * staging buffer. At on_fit_start rank 0 broadcasts `bytes` bytes of a
 * pattern with no zero byte, larger than any collective before it, so every
 * other rank grows the staging buffer (the cuda accelerator's alloc, whose
 * zero fill is queued on the accelerator's stream) just before NCCL
 * receives into it on its own stream: a missing order between the two
 * shows as zeros. Each rank checks every byte and writes "ok <rank>" to
 * <path>.<rank>, or fails the run naming the first wrong byte.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

#include "fixture_head.h"

struct bf {
    fixture_head hd; /* first: fixture_new fills it in */
    char path[1024];
    size_t bytes;
};

static int32_t bf_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    struct bf *b = fixture_new(sizeof *b, ctx, svc, h);
    if (!b) return KILN_E_NOMEM;
    fixture_str(b->path, sizeof b->path, cfg, "path", "bcast");
    const int64_t n = kiln_kv_int(cfg, "bytes", 65536);
    b->bytes = n > 0 ? (size_t)n : 1;
    *out = (kiln_instance *)b;
    return KILN_OK;
}

static void bf_destroy(kiln_instance *i) { free(i); }

/* never zero, and different at every offset within 251 bytes */
static unsigned char bf_byte(size_t i) { return (unsigned char)(1 + i % 251); }

static int32_t bf_event(kiln_instance *i, kiln_event *ev) {
    struct bf *b = (struct bf *)i;
    if (ev->id != KILN_EV_ON_FIT_START) return KILN_OK;
    const kiln_host_services *s = b->hd.svc;
    const int32_t rank = ev->trainer->rank;
    unsigned char *buf = malloc(b->bytes);
    if (!buf) return KILN_E_NOMEM;
    for (size_t k = 0; k < b->bytes; k++) buf[k] = rank == 0 ? bf_byte(k) : 0xEE;
    int32_t rc = s->broadcast(b->hd.h, buf, b->bytes, 0);
    size_t bad = b->bytes;
    for (size_t k = 0; rc == KILN_OK && k < b->bytes && bad == b->bytes; k++)
        if (buf[k] != bf_byte(k)) bad = k;
    const unsigned got = bad < b->bytes ? buf[bad] : 0;
    free(buf);
    if (rc) return rc;
    if (bad < b->bytes)
        return kiln_errorf(s, b->hd.h, KILN_E_INTERNAL, "bcastfix: rank %d: byte %zu of %zu is %u after the broadcast, "
                           "rank 0 sent %u", (int)rank, bad, b->bytes, got, bf_byte(bad));
    char p[1100];
    snprintf(p, sizeof p, "%s.%d", b->path, (int)rank);
    FILE *f = fopen(p, "w");
    if (!f) return kiln_errorf(s, b->hd.h, KILN_E_IO, "%s: cannot write", p);
    fprintf(f, "ok %d\n", (int)rank);
    return fclose(f) == 0 ? KILN_OK : KILN_E_IO;
}

static const kiln_callback_ops bf_ops = {{sizeof(kiln_callback_ops), 0, bf_create, bf_destroy, NULL, NULL}, bf_event};
static const kiln_param bf_params[] = {
    {"path", KILN_TYPE_STRING, 0, KILN_V_STR("bcast"), "result file prefix"},
    {"bytes", KILN_TYPE_INT, 0, KILN_V_INT(65536), "bytes rank 0 broadcasts"},
    {NULL, 0, 0, KILN_V_NONE, NULL}};
FIXTURE_LIBRARY(bf_desc, KILN_KIND_CALLBACK, "bcastfix",
                "checks a large plugin broadcast from rank 0", bf_params, &bf_ops, 2)
