/*
 * ddp_slurm.c — Slurm's side of a ddp launch, as pure functions (see
 * ddp_slurm.h): Slurm's compressed host lists expanded the way `scontrol
 * show hostnames` expands them ("node[01-04,07],login1" is node01, node02,
 * node03, node04, node07, login1; several bracket groups in one name
 * multiply, the rightmost running fastest; a range keeps the width of its
 * lower bound, so [08-10] pads to two digits and [8-10] does not), so a
 * launch without MPI can take rank 0's host from SLURM_JOB_NODELIST; the
 * rendezvous port derived from the job id; and the check, before MPI_Init,
 * that a process Slurm started has a PMIx server to form the MPI world
 * with, so a wrong `srun --mpi=` ends with one line saying what to use
 * instead of Open MPI's abort. Slurm rejects a few odd forms that are
 * accepted here (text after a bracket group, "pre[1-2]post"): this only
 * reads lists, it does not validate them for Slurm.
 */
#define _POSIX_C_SOURCE 200809L
#include "ddp_slurm.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SL_MAX_HOSTS 1000000L /* far above any real job; bounds the products below */
#define SL_MAX_GROUPS 8       /* bracket groups in one name */

static void sl_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* One range "lo-hi" or "lo" of a bracket group; width is strlen(lo), as in
 * Slurm's hostlist.c (the lower bound's digits decide the padding). */
typedef struct sl_range {
    unsigned long lo, hi;
    int width;
} sl_range;

/* Parses the digits at *p (at most 9, so every value fits) into *v; the
 * count of digits, 0 when there are none. */
static int sl_number(const char **p, unsigned long *v) {
    int n = 0;
    *v = 0;
    while (**p >= '0' && **p <= '9') {
        if (++n > 9) return -1;
        *v = *v * 10 + (unsigned long)(**p - '0');
        (*p)++;
    }
    return n;
}

/* Walks the ranges of the bracket group starting after '[' at s and ending
 * at its ']' (*end points past it). With pick < 0 only counts (into *count);
 * otherwise fills *r with the range holding element pick and *value with
 * the element. Returns 0 or -1 (malformed, err set). */
static int sl_group(const char *s, const char **end, long *count, long pick, sl_range *r, unsigned long *value,
                    const char *list, char *err, size_t errlen) {
    const char *p = s;
    long total = 0;
    for (;;) {
        sl_range g;
        const char *lo = p;
        int w = sl_number(&p, &g.lo);
        if (w <= 0) {
            sl_errf(err, errlen, "host list '%s': expected a number of at most 9 digits in brackets at '%.20s'",
                    list, lo);
            return -1;
        }
        g.width = w;
        g.hi = g.lo;
        if (*p == '-') {
            p++;
            const char *hi = p;
            if (sl_number(&p, &g.hi) <= 0) {
                sl_errf(err, errlen, "host list '%s': expected the upper bound of a range at '%.20s'", list, hi);
                return -1;
            }
            if (g.hi < g.lo) {
                sl_errf(err, errlen, "host list '%s': range %.*s goes down", list, (int)(p - lo), lo);
                return -1;
            }
        }
        long n = (long)(g.hi - g.lo + 1);
        if (n > SL_MAX_HOSTS || total > SL_MAX_HOSTS - n) {
            sl_errf(err, errlen, "host list '%s': expected at most %ld hosts, found more", list, SL_MAX_HOSTS);
            return -1;
        }
        if (pick >= total && pick < total + n) {
            *r = g;
            *value = g.lo + (unsigned long)(pick - total);
        }
        total += n;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == ']') break;
        sl_errf(err, errlen, "host list '%s': expected ',' or ']' in brackets at '%.20s'", list, p);
        return -1;
    }
    *end = p + 1;
    *count = total;
    return 0;
}

/* The end of the entry starting at s: the next ',' outside brackets, or the
 * end of the string. -1 when a bracket opens inside one or never closes. */
static int sl_entry_end(const char *s, const char **end, const char *list, char *err, size_t errlen) {
    int depth = 0;
    const char *p = s;
    for (; *p && !(*p == ',' && depth == 0); p++) {
        if (*p == '[') {
            if (depth++) break;
        } else if (*p == ']') {
            if (!depth--) break;
        }
    }
    if (depth != 0 || (*p && *p != ',')) {
        sl_errf(err, errlen, "host list '%s': expected balanced, unnested brackets", list);
        return -1;
    }
    *end = p;
    return 0;
}

/* Counts the hosts of the entry [s, e) into *count, and with pick >= 0
 * writes host number pick of it into out. Returns 0 or -1 (err set). */
static int sl_entry(const char *s, const char *e, long *count, long pick, char *out, size_t outlen,
                    const char *list, char *err, size_t errlen) {
    long gn[SL_MAX_GROUPS]; /* hosts in each group */
    int ng = 0;
    long total = 1;
    for (const char *p = s; p < e;) {
        if (*p != '[') {
            p++;
            continue;
        }
        if (ng == SL_MAX_GROUPS) {
            sl_errf(err, errlen, "host list '%s': expected at most %d bracket groups in one name", list,
                    SL_MAX_GROUPS);
            return -1;
        }
        const char *after;
        sl_range r;
        unsigned long v;
        if (sl_group(p + 1, &after, &gn[ng], -1, &r, &v, list, err, errlen)) return -1;
        if (total > SL_MAX_HOSTS / gn[ng]) {
            sl_errf(err, errlen, "host list '%s': expected at most %ld hosts, found more", list, SL_MAX_HOSTS);
            return -1;
        }
        total *= gn[ng++];
        p = after;
    }
    *count = total;
    if (pick < 0) return 0;
    /* mixed radix, the rightmost group running fastest */
    long idx[SL_MAX_GROUPS];
    long rest = pick;
    for (int g = ng - 1; g >= 0; g--) {
        idx[g] = rest % gn[g];
        rest /= gn[g];
    }
    size_t o = 0;
    int g = 0;
    for (const char *p = s; p < e;) {
        char piece[32];
        size_t len;
        const char *src;
        if (*p == '[') {
            const char *after;
            long n;
            sl_range r = {0, 0, 0};
            unsigned long v = 0;
            if (sl_group(p + 1, &after, &n, idx[g++], &r, &v, list, err, errlen)) return -1;
            len = (size_t)snprintf(piece, sizeof piece, "%0*lu", r.width, v);
            src = piece;
            p = after;
        } else {
            src = p;
            len = 1;
            p++;
        }
        if (o + len >= outlen) {
            sl_errf(err, errlen, "host list '%s': a host name is longer than %zu bytes", list,
                    outlen ? outlen - 1 : 0);
            return -1;
        }
        memcpy(out + o, src, len);
        o += len;
    }
    out[o] = 0;
    return 0;
}

/* Walks the entries of list; with pick >= 0 writes host number pick into
 * out (*found = 1). Returns the count, or -1 (err set). */
static long sl_walk(const char *list, long pick, char *out, size_t outlen, int *found, char *err, size_t errlen) {
    if (!list) {
        sl_errf(err, errlen, "host list: expected a list, found none");
        return -1;
    }
    long total = 0;
    for (const char *p = list; *p;) {
        const char *e;
        if (sl_entry_end(p, &e, list, err, errlen)) return -1;
        if (e > p) { /* "a,,b" has an empty entry: scontrol skips it too */
            long n = 0;
            if (sl_entry(p, e, &n, -1, NULL, 0, list, err, errlen)) return -1;
            if (total > SL_MAX_HOSTS - n) {
                sl_errf(err, errlen, "host list '%s': expected at most %ld hosts, found more", list, SL_MAX_HOSTS);
                return -1;
            }
            if (pick >= total && pick < total + n) {
                if (sl_entry(p, e, &n, pick - total, out, outlen, list, err, errlen)) return -1;
                *found = 1;
            }
            total += n;
        }
        p = *e ? e + 1 : e;
    }
    return total;
}

long ddp_slurm_hostlist_count(const char *list, char *err, size_t errlen) {
    int found = 0;
    return sl_walk(list, -1, NULL, 0, &found, err, errlen);
}

int ddp_slurm_hostlist_nth(const char *list, long n, char *out, size_t outlen, char *err, size_t errlen) {
    if (!out || !outlen) {
        sl_errf(err, errlen, "host list: no room for the host name");
        return -1;
    }
    out[0] = 0;
    int found = 0;
    long total = sl_walk(list, n < 0 ? -2 : n, out, outlen, &found, err, errlen);
    if (total < 0) return -1;
    return found ? 0 : 1;
}

int ddp_slurm_port(const char *jobid) {
    if (!jobid || !*jobid) return -1;
    unsigned long long v = 0;
    for (const char *p = jobid; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = (v * 10 + (unsigned long long)(*p - '0')) % DDP_SLURM_PORT_SPAN; /* only the remainder matters */
    }
    return DDP_SLURM_PORT_BASE + (int)v;
}

/* A whole-string non-negative decimal below 2^31; -1 otherwise. */
static long sl_count(const char *s) {
    if (!s || !*s) return -1;
    errno = 0;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0 || v > 0x7fffffffL) return -1;
    return v;
}

int ddp_slurm_mpi_check(ddp_slurm_getenv_fn get, int pmi_counts, char *msg, size_t msglen) {
    if (msg && msglen) msg[0] = 0;
    const char *procid = get("SLURM_PROCID"), *ntasks = get("SLURM_NTASKS");
    if (!procid || !ntasks) return 0; /* not a Slurm task */
    /* mpirun (inside an allocation or not) has set up the world itself */
    if (get("OMPI_COMM_WORLD_SIZE") || get("OMPI_COMM_WORLD_RANK")) return 0;
    static const char *const pmix[] = {"PMIX_RANK",         "PMIX_SERVER_URI",   "PMIX_SERVER_URI2",
                                       "PMIX_SERVER_URI21", "PMIX_SERVER_URI3",  "PMIX_SERVER_URI4",
                                       "PMIX_SERVER_URI41", "PMIX_SERVER_URI5"};
    for (size_t i = 0; i < sizeof pmix / sizeof pmix[0]; i++)
        if (get(pmix[i])) return 0;
    const int pmi = get("PMI_RANK") || get("PMI_FD");
    if (pmi && pmi_counts) return 0;
    long n = sl_count(ntasks);
    if (n == 1) return 1;
    sl_errf(msg, msglen,
            "Slurm started this process as task %s of %s (SLURM_PROCID/SLURM_NTASKS) %s, so MPI cannot form the "
            "world: launch with `srun --mpi=pmix`, or run `mpirun` inside the allocation",
            procid, ntasks,
            pmi ? "with PMI-2 (srun --mpi=pmi2), which this Open MPI cannot use; no PMIx server is reachable"
                : "but no PMIx server is reachable (PMIX_RANK and PMIX_SERVER_URI* are unset)");
    return -1;
}
