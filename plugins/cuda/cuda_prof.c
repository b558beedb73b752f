/*
 * cuda_prof.c — the cuda accelerator's `profile = true`: where the GPU's
 * time goes, by kernel-table entry, measured on the GPU itself. Every entry
 * that touches the device passes through cu_enter(); with profiling on, it
 * records a CUDA event on the stream there, so consecutive events bracket
 * what one entry queued. An entry's share is the GPU time from its event to
 * the next one: its own kernels, copies and GEMMs, plus any time the GPU
 * then sat waiting for the host (after a synchronize, that wait is all of
 * it: the share of "synchronize" is the GPU idle while the host worked).
 * Events are read back in batches (a wait on the newest, when the ring is
 * three quarters full), so profiling adds a few microseconds per entry and
 * no synchronisation of its own on the hot path. At destroy() the totals go
 * to the log, one line per entry and one per category, largest first.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#define CU_PROF_RING 1024
#define CU_PROF_NAMES 64

struct cu_prof {
    cudaEvent_t ev[CU_PROF_RING];
    const char *at[CU_PROF_RING]; /* the entry whose work follows event i */
    int first, count;             /* events recorded and not yet accounted */
    const char *name[CU_PROF_NAMES];
    double ms[CU_PROF_NAMES];
    unsigned long calls[CU_PROF_NAMES];
    int nnames;
    double total_ms;
};

int32_t cu_prof_init(kiln_instance *acc) {
    cu_prof *p = calloc(1, sizeof *p);
    if (!p) return CU_ERR(acc, KILN_E_NOMEM, "cuda: profile: out of host memory");
    for (int i = 0; i < CU_PROF_RING; i++) {
        cudaError_t e = cudaEventCreate(&p->ev[i]);
        if (e != cudaSuccess) {
            while (i-- > 0) cudaEventDestroy(p->ev[i]);
            free(p);
            return cu_fail(acc, e, "configure (profile events)", "cudaEventCreate");
        }
    }
    acc->prof = p;
    return KILN_OK;
}

static void cu_prof_add(cu_prof *p, const char *name, double ms) {
    int i = 0;
    while (i < p->nnames && strcmp(p->name[i], name) != 0) i++;
    if (i == p->nnames) {
        if (p->nnames == CU_PROF_NAMES) i = CU_PROF_NAMES - 1; /* more names than slots: the last one */
        else p->name[p->nnames++] = name;
    }
    p->ms[i] += ms;
    p->calls[i]++;
    p->total_ms += ms;
}

/* Accounts every recorded interval but the newest event's, which becomes
 * the first of the next batch. Waits for the newest event. */
static void cu_prof_flush(cu_prof *p) {
    if (p->count < 2) return;
    const int last = (p->first + p->count - 1) % CU_PROF_RING;
    if (cudaEventSynchronize(p->ev[last]) != cudaSuccess) {
        (void)cudaGetLastError();
        p->first = last, p->count = 1;
        return;
    }
    for (int k = 0; k + 1 < p->count; k++) {
        const int a = (p->first + k) % CU_PROF_RING, b = (a + 1) % CU_PROF_RING;
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, p->ev[a], p->ev[b]) == cudaSuccess) cu_prof_add(p, p->at[a], ms);
        else (void)cudaGetLastError();
    }
    p->first = last, p->count = 1;
}

void cu_prof_mark(kiln_instance *acc, const char *entry) {
    cu_prof *p = acc->prof;
    if (p->count == CU_PROF_RING) cu_prof_flush(p);
    const int i = (p->first + p->count) % CU_PROF_RING;
    if (cudaEventRecord(p->ev[i], acc->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    p->at[i] = entry;
    p->count++;
    if (p->count >= CU_PROF_RING * 3 / 4) cu_prof_flush(p);
}

/* The category of an entry, for the rollup. */
static const char *cu_prof_category(const char *n) {
    if (!strncmp(n, "gemm", 4) || !strncmp(n, "linear_forward", 14)) return "GEMMs"; /* and _layout */
    if (!strncmp(n, "attention", 9)) return "attention";
    if (!strcmp(n, "xent_fused") || !strncmp(n, "softmax_xent", 12)) return "classifier";
    if (strstr(n, "layernorm")) return "layer norm"; /* add_layernorm_forward too */
    if (!strncmp(n, "embedding", 9)) return "embedding";
    if (strstr(n, "_update") || !strcmp(n, "lerp") || !strcmp(n, "sign") || !strcmp(n, "addcmul") ||
        !strcmp(n, "addcdiv") || !strcmp(n, "sqrt_ex"))
        return "optimizer";
    if (!strncmp(n, "sum", 3) || !strcmp(n, "all_finite") || !strcmp(n, "unscale_check")) return "reductions";
    if (!strcmp(n, "synchronize")) return "idle after synchronize";
    if (!strncmp(n, "copy", 4) || !strcmp(n, "zero")) return "copies";
    return "elementwise";
}

static int cu_prof_by_ms(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

void cu_prof_report(kiln_instance *acc) {
    cu_prof *p = acc->prof;
    if (!p) return;
    cu_prof_mark(acc, "end");
    cu_prof_flush(p);
    kiln_logf(acc->svc, acc->hctx, KILN_LOG_INFO, "cuda: profile: %.3f ms of GPU time over %d entries", p->total_ms,
              p->nnames);
    /* (ms, index) pairs sorted by ms, for entries and for categories */
    double rows[CU_PROF_NAMES][2];
    for (int i = 0; i < p->nnames; i++) rows[i][0] = p->ms[i], rows[i][1] = i;
    qsort(rows, (size_t)p->nnames, sizeof rows[0], cu_prof_by_ms);
    for (int r = 0; r < p->nnames; r++) {
        const int i = (int)rows[r][1];
        kiln_logf(acc->svc, acc->hctx, KILN_LOG_INFO, "cuda: profile: entry %-24s %10.3f ms %5.1f%% %8lu calls",
                  p->name[i], p->ms[i], p->total_ms > 0 ? 100 * p->ms[i] / p->total_ms : 0.0, p->calls[i]);
    }
    const char *cat[CU_PROF_NAMES];
    double cms[CU_PROF_NAMES][2];
    int ncat = 0;
    for (int i = 0; i < p->nnames; i++) {
        const char *c = cu_prof_category(p->name[i]);
        int j = 0;
        while (j < ncat && strcmp(cat[j], c) != 0) j++;
        if (j == ncat) cat[ncat] = c, cms[ncat][0] = 0, cms[ncat][1] = ncat, ncat++;
        cms[j][0] += p->ms[i];
    }
    qsort(cms, (size_t)ncat, sizeof cms[0], cu_prof_by_ms);
    for (int r = 0; r < ncat; r++)
        kiln_logf(acc->svc, acc->hctx, KILN_LOG_INFO, "cuda: profile: category %-24s %10.3f ms %5.1f%%",
                  cat[(int)cms[r][1]], cms[r][0], p->total_ms > 0 ? 100 * cms[r][0] / p->total_ms : 0.0);
}

void cu_prof_release(kiln_instance *acc) {
    cu_prof *p = acc->prof;
    if (!p) return;
    for (int i = 0; i < CU_PROF_RING; i++) cudaEventDestroy(p->ev[i]);
    free(p);
    acc->prof = NULL;
}
