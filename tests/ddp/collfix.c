/*
 * tests/ddp/collfix.c — a test-only callback that exercises the host's
 * collective services (1.2) at on_fit_start: all_gather of each rank's
 * number, a broadcast from the last rank, reduce SUM and MEAN, a barrier.
 * It checks the results itself and writes "ok <rank> <world>" to
 * <path>.<rank>, or fails the run naming what it got.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

#include "fixture_head.h"

struct cf { fixture_path fp; }; /* fixture_create_path fills it in */

static int32_t cf_create(void *ctx, const kiln_host_services *svc, kiln_host_ctx *h, const kiln_kv *cfg,
                         kiln_instance **out) {
    return fixture_create_path(sizeof(struct cf), ctx, svc, h, cfg, "coll", out);
}
static void cf_destroy(kiln_instance *i) { free(i); }

static int32_t cf_event(kiln_instance *i, kiln_event *ev) {
    struct cf *c = (struct cf *)i;
    if (ev->id != KILN_EV_ON_FIT_START) return KILN_OK;
    const kiln_host_services *s = c->fp.hd.svc;
    const int32_t rank = ev->trainer->rank, world = ev->trainer->world_size;
    int32_t mine = 100 + rank, all[64];
    if (world > 64) return KILN_E_INTERNAL;
    int32_t rc = s->all_gather(c->fp.hd.h, &mine, sizeof mine, all);
    for (int r = 0; rc == KILN_OK && r < world; r++)
        if (all[r] != 100 + r) return kiln_errorf(s, c->fp.hd.h, KILN_E_INTERNAL, "all_gather[%d] = %d", r, all[r]);
    char msg[32] = "";
    if (rank == world - 1) snprintf(msg, sizeof msg, "from rank %d", rank);
    if (rc == KILN_OK) rc = s->broadcast(c->fp.hd.h, msg, sizeof msg, world - 1);
    char want[32];
    snprintf(want, sizeof want, "from rank %d", world - 1);
    if (rc == KILN_OK && strcmp(msg, want)) return kiln_errorf(s, c->fp.hd.h, KILN_E_INTERNAL, "broadcast gave '%s'", msg);
    double v[2] = {rank + 1.0, 2.0};
    if (rc == KILN_OK) rc = s->reduce(c->fp.hd.h, v, 2, KILN_REDUCE_SUM);
    if (rc == KILN_OK && (v[0] != world * (world + 1) / 2.0 || v[1] != 2.0 * world))
        return kiln_errorf(s, c->fp.hd.h, KILN_E_INTERNAL, "reduce SUM gave %g %g", v[0], v[1]);
    double m = rank;
    if (rc == KILN_OK) rc = s->reduce(c->fp.hd.h, &m, 1, KILN_REDUCE_MEAN);
    if (rc == KILN_OK && m != (world - 1) / 2.0) return kiln_errorf(s, c->fp.hd.h, KILN_E_INTERNAL, "reduce MEAN gave %g", m);
    if (rc == KILN_OK) rc = s->barrier(c->fp.hd.h, "collfix");
    if (rc == KILN_OK && s->reduce(c->fp.hd.h, &m, 1, 7) != KILN_E_INVALID_ARG)
        return kiln_errorf(s, c->fp.hd.h, KILN_E_INTERNAL, "reduce op 7 was not refused");
    if (rc) return rc;
    char p[1100];
    snprintf(p, sizeof p, "%s.%d", c->fp.path, rank);
    FILE *f = fopen(p, "w");
    if (!f) return kiln_errorf(s, c->fp.hd.h, KILN_E_IO, "%s: cannot write", p);
    fprintf(f, "ok %d %d\n", rank, world);
    return fclose(f) == 0 ? KILN_OK : KILN_E_IO;
}

static const kiln_callback_ops cf_ops = {{sizeof(kiln_callback_ops), 0, cf_create, cf_destroy, NULL, NULL}, cf_event};
static const kiln_param cf_params[] = {{"path", KILN_TYPE_STRING, 0, KILN_V_STR("coll"), "result file prefix"},
                                       {NULL, 0, 0, KILN_V_NONE, NULL}};
FIXTURE_LIBRARY(cf_desc, KILN_KIND_CALLBACK, "collfix", "checks the host's collectives", cf_params, &cf_ops, 2)
