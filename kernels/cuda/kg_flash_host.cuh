/*
 * kg_flash_host.cuh: kg_flash.cuh's block programs run on the host, for
 * the tests (test_cuda_flash) and the fake cuda accelerator, which have no
 * GPU. kg_fl_host is the execution policy: each "for each thread / warp /
 * lane" loop of a program visits every one in turn, the barriers only
 * advance counters, a warp's registers are arrays over its 32 lanes, and
 * the warp-wide operations (ldmatrix, mma.sync, shuffles) are loops over
 * them, as the PTX ISA defines them: the products on the 16-bit operands
 * decoded exactly, with float sums. Single-threaded: one block at a time,
 * in launch order.
 *
 * What the host checks, beyond computing the result:
 *  - ldmatrix's rules: every row address in shared memory and 16-byte
 *    aligned, and warp-wide operations called only from a warp loop;
 *  - shared memory is filled with 0xff bytes (NaN in float, bf16 and f16)
 *    before each block, so a read of something never written poisons the
 *    output;
 *  - races: per shared-memory byte, the last writer and the readers since
 *    the last barrier. A read or write by another thread of something
 *    written since the last barrier, or a write of something another
 *    thread read since then, is a race (each lane of an ldmatrix reads
 *    its own row).
 * Every failure is counted and the first one kept as a message
 * (kg_fl_host_failures); the test asserts there is none.
 *
 * On request (kg_fl_banks_begin), it also counts what the programs'
 * shared-memory accesses would cost a GPU's banks (the bank model below),
 * so that a bank conflict, invisible to every result, shows as a number.
 */
#ifndef KILN_KERNELS_CUDA_KG_FLASH_HOST_CUH
#define KILN_KERNELS_CUDA_KG_FLASH_HOST_CUH

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kg_flash.cuh"

/* Who touched a byte: a thread 0..127, or no one. Inside a warp loop (a
 * warp-wide operation's caller) `who` is KG_FL_WARPWIDE + w; ldmatrix's
 * reads are each its lane's own. */
#define KG_FL_WARPWIDE 1000
#define KG_FL_NOBODY (-1)
#define KG_FL_MANY (-2) /* several readers */

struct kg_fl_shadow {
    int32_t wr, rd;
    uint32_t wr_ep, rd_ep;
};

struct kg_fl_host_state {
    unsigned char *smem;
    kg_fl_shadow *sh;
    size_t bytes;
    int who, warp;
    uint32_t epoch;
    long failures;
    char first[512];
};

static kg_fl_host_state kg_fl_hs;

/* No access yet to any of n bytes. */
static inline void kg_fl_shadow_clear(kg_fl_shadow *sh, size_t n) {
    for (size_t i = 0; i < n; i++) sh[i].wr = sh[i].rd = KG_FL_NOBODY, sh[i].wr_ep = sh[i].rd_ep = 0;
}

static inline void kg_fl_host_fail(const char *fmt, const char *what, long off, int a, int b) {
    if (kg_fl_hs.failures++ == 0) snprintf(kg_fl_hs.first, sizeof kg_fl_hs.first, fmt, what, off, a, b);
}

/* "thread 37 (warp 1, lane 5)", "several threads" */
static inline const char *kg_fl_who_name(int who, char *buf, size_t n) {
    if (who >= 0 && who < KG_FL_WARPWIDE) snprintf(buf, n, "thread %d (warp %d, lane %d)", who, who / 32, who % 32);
    else snprintf(buf, n, "several threads");
    return buf;
}

/* A race on byte off between an earlier access and the current thread. */
static inline void kg_fl_race(const char *earlier, int prev, const char *now, long off) {
    if (kg_fl_hs.failures++ == 0) {
        char a[64], b[64];
        snprintf(kg_fl_hs.first, sizeof kg_fl_hs.first,
                 "shared-memory race at byte %ld: %s by %s, then %s by %s with no barrier between", off, earlier,
                 kg_fl_who_name(prev, a, sizeof a), now, kg_fl_who_name(kg_fl_hs.who, b, sizeof b));
    }
}

/* A conflict with an access by `prev` in epoch ep, for the current thread:
 * the same barrier interval and another thread (the programs have no
 * __syncwarp, so nothing else orders two threads). */
static inline bool kg_fl_conflict(int prev, uint32_t ep) {
    return prev != KG_FL_NOBODY && ep == kg_fl_hs.epoch && prev != kg_fl_hs.who;
}

/*
 * The shared-memory bank model (off unless kg_fl_banks_begin turned it on):
 * what a GPU's shared memory makes of the programs' accesses: those of
 * their thread and lane loops, and each ldmatrix (every lane's 16-byte
 * row read, one matrix of 8 lanes at a time, as the hardware serves it).
 * Shared memory serves a warp's access in wavefronts: one for every
 * distinct 32-bit word the busiest of its 32 banks (bank = word mod 32)
 * must deliver; lanes reading one word share it. An access of 8 bytes a
 * lane is served a half warp at a time, one of 16 bytes a quarter warp at
 * a time.
 *
 * The host runs a warp's lanes one after another, so which accesses the
 * GPU would issue together must be worked out: the n-th access a lane makes
 * at one source line, within one pass of a thread or lane loop (or one
 * ldmatrix), goes with the n-th access of every other lane of its warp at
 * that line (a lane that skipped it is not in it). requests counts such warp-wide accesses,
 * wavefronts what they cost, and ideal the least they could cost (one
 * wavefront for each group of lanes served together that has a lane in
 * the access); wavefronts equal to ideal mean no bank conflict. The
 * counts are also kept per source line of kg_flash.cuh, to find the loop
 * that conflicts.
 */
#define KG_FL_BANK_LINES 2048

struct kg_fl_bank_rec {
    int32_t line, thread, n;
    uint32_t seq, off, size;
};

struct kg_fl_bank_state {
    bool on;
    kg_fl_bank_rec *rec;
    size_t nrec, cap;
    uint32_t seq;
    long requests, wavefronts, ideal;
    long line_req[KG_FL_BANK_LINES], line_wf[KG_FL_BANK_LINES], line_ideal[KG_FL_BANK_LINES];
};

static kg_fl_bank_state kg_fl_bk;

static inline void kg_fl_bank_note(size_t off, size_t n, int line) {
    if (kg_fl_bk.nrec == kg_fl_bk.cap) {
        const size_t cap = kg_fl_bk.cap ? 2 * kg_fl_bk.cap : 4096;
        kg_fl_bank_rec *r = (kg_fl_bank_rec *)realloc(kg_fl_bk.rec, cap * sizeof *r);
        if (!r) {
            kg_fl_host_fail("%s: out of memory at offset %ld (%d, %d)", "the bank model", (long)off, 0, 0);
            return;
        }
        kg_fl_bk.rec = r, kg_fl_bk.cap = cap;
    }
    kg_fl_bank_rec *r = &kg_fl_bk.rec[kg_fl_bk.nrec++];
    r->line = line, r->thread = kg_fl_hs.who, r->n = 0;
    r->seq = kg_fl_bk.seq++, r->off = (uint32_t)off, r->size = (uint32_t)n;
}

static inline int kg_fl_bank_by_lane(const void *x, const void *y) {
    const kg_fl_bank_rec *a = (const kg_fl_bank_rec *)x, *b = (const kg_fl_bank_rec *)y;
    if (a->thread != b->thread) return a->thread < b->thread ? -1 : 1;
    if (a->line != b->line) return a->line < b->line ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static inline int kg_fl_bank_by_issue(const void *x, const void *y) {
    const kg_fl_bank_rec *a = (const kg_fl_bank_rec *)x, *b = (const kg_fl_bank_rec *)y;
    if (a->thread / 32 != b->thread / 32) return a->thread / 32 < b->thread / 32 ? -1 : 1;
    if (a->line != b->line) return a->line < b->line ? -1 : 1;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    return a->thread < b->thread ? -1 : a->thread > b->thread;
}

/* The wavefronts of one warp-wide access: g[0..n) (one warp, one line, one
 * issue), served in groups of lanes as wide as the widest access allows;
 * *ideal: the groups with a lane in it. */
static inline long kg_fl_bank_cost(const kg_fl_bank_rec *g, size_t n, long *ideal) {
    uint32_t most = 4;
    for (size_t i = 0; i < n; i++) most = g[i].size > most ? g[i].size : most;
    const int per = most >= 16 ? 8 : most >= 8 ? 16 : 32; /* lanes served together */
    long cost = 0;
    *ideal = 0;
    for (int part = 0; part < 32 / per; part++) {
        /* per bank, the distinct words asked of it: 32 at most (32 lanes of
         * one word, 16 of two, 8 of four) */
        uint32_t words[32][32];
        int nw[32] = {0}, worst = 0;
        for (size_t i = 0; i < n; i++) {
            if ((g[i].thread % 32) / per != part) continue;
            for (uint32_t w = g[i].off / 4; w <= (g[i].off + g[i].size - 1) / 4; w++) {
                const int bank = (int)(w % 32);
                int k = 0;
                while (k < nw[bank] && words[bank][k] != w) k++;
                if (k == nw[bank] && k < 32) words[bank][nw[bank]++] = w;
                worst = nw[bank] > worst ? nw[bank] : worst;
            }
        }
        cost += worst;
        *ideal += worst > 0;
    }
    return cost;
}

/* Ends a pass of a thread or lane loop: its accesses into the counts. */
static inline void kg_fl_bank_flush(void) {
    kg_fl_bank_rec *r = kg_fl_bk.rec;
    const size_t n = kg_fl_bk.nrec;
    if (!kg_fl_bk.on || n == 0) return;
    qsort(r, n, sizeof *r, kg_fl_bank_by_lane);
    for (size_t i = 1; i < n; i++)
        if (r[i].thread == r[i - 1].thread && r[i].line == r[i - 1].line) r[i].n = r[i - 1].n + 1;
    qsort(r, n, sizeof *r, kg_fl_bank_by_issue);
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && r[j].thread / 32 == r[i].thread / 32 && r[j].line == r[i].line && r[j].n == r[i].n) j++;
        long ideal;
        const long wf = kg_fl_bank_cost(r + i, j - i, &ideal);
        const int line = r[i].line >= 0 && r[i].line < KG_FL_BANK_LINES ? r[i].line : 0;
        kg_fl_bk.requests++, kg_fl_bk.wavefronts += wf, kg_fl_bk.ideal += ideal;
        kg_fl_bk.line_req[line]++, kg_fl_bk.line_wf[line] += wf, kg_fl_bk.line_ideal[line] += ideal;
        i = j;
    }
    kg_fl_bk.nrec = 0;
}

/* Counting on, from zero. */
static inline void kg_fl_banks_begin(void) {
    free(kg_fl_bk.rec);
    memset(&kg_fl_bk, 0, sizeof kg_fl_bk);
    kg_fl_bk.on = true;
}

/* Counting off; the counts stay until the next begin. */
static inline void kg_fl_banks_end(void) {
    kg_fl_bank_flush();
    kg_fl_bk.on = false;
    free(kg_fl_bk.rec);
    kg_fl_bk.rec = NULL, kg_fl_bk.nrec = kg_fl_bk.cap = 0;
}

/* The counts, and each line that conflicts. */
static inline void kg_fl_banks_print(FILE *f, const char *what) {
    fprintf(f, "%s: %ld shared-memory requests, %ld wavefronts, %ld without conflicts\n", what, kg_fl_bk.requests,
            kg_fl_bk.wavefronts, kg_fl_bk.ideal);
    for (int l = 0; l < KG_FL_BANK_LINES; l++)
        if (kg_fl_bk.line_wf[l] > kg_fl_bk.line_ideal[l])
            fprintf(f, "  line %d: %ld requests, %ld wavefronts, %ld without conflicts\n", l, kg_fl_bk.line_req[l],
                    kg_fl_bk.line_wf[l], kg_fl_bk.line_ideal[l]);
}

static inline void kg_fl_access(const void *p, size_t n, bool write, int line) {
    const unsigned char *c = (const unsigned char *)p;
    if (c < kg_fl_hs.smem || c + n > kg_fl_hs.smem + kg_fl_hs.bytes) {
        kg_fl_host_fail("%s outside shared memory at offset %ld (thread %d, %d)", write ? "write" : "read",
                        (long)(c - kg_fl_hs.smem), kg_fl_hs.who, 0);
        return;
    }
    const int me = kg_fl_hs.who;
    if (me == KG_FL_NOBODY || me >= KG_FL_WARPWIDE) {
        kg_fl_host_fail("%s at offset %ld outside any thread or lane loop (%d, %d)", write ? "write" : "read",
                        (long)(c - kg_fl_hs.smem), 0, 0);
        return;
    }
    if (kg_fl_bk.on) kg_fl_bank_note((size_t)(c - kg_fl_hs.smem), n, line);
    for (size_t i = 0; i < n; i++) {
        const size_t off = (size_t)(c - kg_fl_hs.smem) + i;
        kg_fl_shadow *s = &kg_fl_hs.sh[off];
        if (kg_fl_conflict(s->wr, s->wr_ep)) kg_fl_race("written", s->wr, write ? "written" : "read", (long)off);
        if (write) {
            if (kg_fl_conflict(s->rd, s->rd_ep)) kg_fl_race("read", s->rd, "written", (long)off);
            s->wr = me, s->wr_ep = kg_fl_hs.epoch;
        } else if (!kg_fl_conflict(s->rd, s->rd_ep)) {
            /* no reader since the last barrier but this thread */
            s->rd = me, s->rd_ep = kg_fl_hs.epoch;
        } else {
            s->rd = KG_FL_MANY; /* a later write by anyone races */
        }
    }
}

struct kg_fl_host {
    static int tid0() { return 0; }
    static int tstep() { return 1; }
    static bool tin(int t) {
        kg_fl_hs.who = t < KG_FL_THREADS ? t : KG_FL_NOBODY;
        if (t >= KG_FL_THREADS) kg_fl_bank_flush();
        return t < KG_FL_THREADS;
    }
    static int warp0() { return 0; }
    static int wstep() { return 1; }
    static bool win(int w) {
        kg_fl_hs.warp = w;
        kg_fl_hs.who = w < KG_FL_WARPS ? KG_FL_WARPWIDE + w : KG_FL_NOBODY;
        return w < KG_FL_WARPS;
    }
    static int lane0() { return 0; }
    static int lstep() { return 1; }
    static bool lin(int w, int l) {
        kg_fl_hs.who = l < 32 ? 32 * w + l : KG_FL_WARPWIDE + w;
        if (l >= 32) kg_fl_bank_flush();
        return l < 32;
    }
    static void sync() { kg_fl_hs.epoch++; }
    /* line: the caller's, for the bank model */
    template <class T> static T ld(const T *p, int line = __builtin_LINE()) {
        kg_fl_access(p, sizeof *p, false, line);
        return *p;
    }
    template <class T> static void st(T *p, T v, int line = __builtin_LINE()) {
        kg_fl_access(p, sizeof *p, true, line);
        *p = v;
    }

    /* Registers: a warp's 32 lanes side by side; what a warp keeps across
     * barriers, once per warp (kg_flash.cuh's policy contract). */
    static constexpr int NL = 32;
    static int li(int l) { return l; }
    static constexpr int kSlots = KG_FL_WARPS;
    static int slot(int w) { return w; }

    /* ldmatrix.x4 as the PTX ISA defines it: lane l gives row l % 8 of
     * matrix l / 8 (16 bytes, 16-byte aligned, in shared memory); r[i]
     * holds matrix i's fragment. Each lane's row is one 16-byte read of
     * its own for the race check and the bank model (which serves 16-byte
     * accesses a quarter warp, one matrix, at a time, as ldmatrix does). */
    template <int TRANS>
    static void ldsm(uint32_t (&r)[4][NL], const uint16_t *const (&p)[NL], int line = __builtin_LINE()) {
        const int me = kg_fl_hs.who;
        uint16_t rows[32][8];
        memset(rows, 0, sizeof rows);
        if (me < KG_FL_WARPWIDE) {
            kg_fl_host_fail("%s at offset %ld: a warp-wide operation outside a warp loop (thread %d, %d)", "ldmatrix",
                            0, me, 0);
        } else {
            for (int l = 0; l < 32; l++) {
                const unsigned char *c = (const unsigned char *)p[l];
                if (c < kg_fl_hs.smem || c + 16 > kg_fl_hs.smem + kg_fl_hs.bytes || (uintptr_t)c % 16u != 0) {
                    kg_fl_host_fail("%s: lane %ld's row address at offset %d is outside shared memory or not "
                                    "16-byte aligned (%d)",
                                    "ldmatrix", (long)l, (int)(c - kg_fl_hs.smem), 0);
                    continue;
                }
                kg_fl_hs.who = 32 * (me - KG_FL_WARPWIDE) + l;
                kg_fl_access(c, 16, false, line);
                memcpy(rows[l], c, 16);
            }
            kg_fl_hs.who = me;
            kg_fl_bank_flush();
        }
        for (int i = 0; i < 4; i++)
            for (int l = 0; l < 32; l++) {
                const int g = l >> 2, c = 2 * (l & 3);
                const uint16_t lo = TRANS ? rows[8 * i + c][g] : rows[8 * i + g][c];
                const uint16_t hi = TRANS ? rows[8 * i + c + 1][g] : rows[8 * i + g][c + 1];
                r[i][l] = (uint32_t)lo | (uint32_t)hi << 16;
            }
    }

    /* mma.sync m16n8k16 as the PTX ISA lays out its fragments: the
     * operands decoded exactly, each D element its C plus the products in
     * increasing k, summed in float (the tensor cores' order and internal
     * precision are their own, which the tolerances allow for). */
    template <int OP>
    static void mma(float (&d)[4][NL], const uint32_t (&a)[4][NL], const uint32_t (&b)[4][NL], int h) {
        if (kg_fl_hs.who < KG_FL_WARPWIDE)
            kg_fl_host_fail("%s at offset %ld: a warp-wide operation outside a warp loop (thread %d, %d)", "mma", 0,
                            kg_fl_hs.who, 0);
        float A[16][16], B[16][8], C[16][8];
        for (int l = 0; l < 32; l++) {
            const int g = l >> 2, c = 2 * (l & 3);
            for (int j = 0; j < 2; j++) {
                A[g][c + j] = kg_fl_dec<OP>((uint16_t)(a[0][l] >> 16 * j));
                A[g + 8][c + j] = kg_fl_dec<OP>((uint16_t)(a[1][l] >> 16 * j));
                A[g][c + 8 + j] = kg_fl_dec<OP>((uint16_t)(a[2][l] >> 16 * j));
                A[g + 8][c + 8 + j] = kg_fl_dec<OP>((uint16_t)(a[3][l] >> 16 * j));
                B[c + j][g] = kg_fl_dec<OP>((uint16_t)(b[2 * h][l] >> 16 * j));
                B[c + 8 + j][g] = kg_fl_dec<OP>((uint16_t)(b[2 * h + 1][l] >> 16 * j));
                C[g][c + j] = d[j][l];
                C[g + 8][c + j] = d[2 + j][l];
            }
        }
        for (int i = 0; i < 16; i++)
            for (int n = 0; n < 8; n++) {
                float s = C[i][n];
                for (int k = 0; k < 16; k++) s += A[i][k] * B[k][n];
                C[i][n] = s;
            }
        for (int l = 0; l < 32; l++) {
            const int g = l >> 2, c = 2 * (l & 3);
            for (int j = 0; j < 2; j++) d[j][l] = C[g][c + j], d[2 + j][l] = C[g + 8][c + j];
        }
    }

    static void shfl_xor(float (&v)[NL], int m) {
        float o[NL];
        for (int l = 0; l < 32; l++) o[l] = v[l ^ m];
        memcpy(v, o, sizeof o);
    }

    template <int OP> static uint32_t pack2(float lo, float hi) {
        return (uint32_t)kg_fl_enc<OP>(lo) | (uint32_t)kg_fl_enc<OP>(hi) << 16;
    }
};

/* Runs program prog for every block of the call (a's sizes), in launch
 * order; 0, or -1 when the shared memory cannot be had. */
template <int OP, int DN> static int kg_fl_host_prog(int prog, const kg_flash_args &a) {
    const kg_fl_layout L = kg_fl_layout_of(prog, 16 * DN);
    unsigned char *sm = (unsigned char *)aligned_alloc(128, kg_fl_up128(L.bytes));
    kg_fl_shadow *sh = (kg_fl_shadow *)malloc(L.bytes * sizeof *sh);
    if (!sm || !sh) {
        free(sm), free(sh);
        return -1;
    }
    kg_fl_shadow_clear(sh, L.bytes);
    kg_fl_hs.smem = sm, kg_fl_hs.sh = sh, kg_fl_hs.bytes = L.bytes;
    const size_t nb = kg_fl_blocks(a.B, a.NH, a.T);
    for (size_t i = 0; i < nb; i++) {
        int tile, bh;
        kg_fl_block_of(prog, i, a.B, a.NH, a.T, &tile, &bh);
        memset(sm, 0xff, L.bytes);
        kg_fl_hs.epoch++;
        kg_fl_hs.who = KG_FL_NOBODY;
        if (prog == KG_FL_FWD) kg_fl_forward_block<kg_fl_host, OP, DN>(a, sm, tile, bh);
        else if (prog == KG_FL_DKDV) kg_fl_dkdv_block<kg_fl_host, OP, DN>(a, sm, tile, bh);
        else kg_fl_dq_block<kg_fl_host, OP, DN>(a, sm, tile, bh);
    }
    kg_fl_hs.smem = NULL, kg_fl_hs.sh = NULL;
    free(sm), free(sh);
    return 0;
}

/* Dispatch on OP (KG_BF16 or KG_F16) and D (16, 32, 64, 128). */
template <int OP> static int kg_fl_host_run_op(int prog, int D, const kg_flash_args &a) {
    switch (D) {
    case 16: return kg_fl_host_prog<OP, 1>(prog, a);
    case 32: return kg_fl_host_prog<OP, 2>(prog, a);
    case 64: return kg_fl_host_prog<OP, 4>(prog, a);
    case 128: return kg_fl_host_prog<OP, 8>(prog, a);
    default: return -1;
    }
}
static inline int kg_fl_host_run(int prog, int op, int D, const kg_flash_args &a) {
    return op == KG_BF16 ? kg_fl_host_run_op<KG_BF16>(prog, D, a) : kg_fl_host_run_op<KG_F16>(prog, D, a);
}

/* Failures since the last reset (and the first one's message). */
static inline long kg_fl_host_failures(const char **first) {
    if (first) *first = kg_fl_hs.first;
    return kg_fl_hs.failures;
}
static inline void kg_fl_host_reset(void) {
    kg_fl_hs.failures = 0;
    kg_fl_hs.first[0] = 0;
}

#endif
