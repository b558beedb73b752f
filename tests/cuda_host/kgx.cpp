/*
 * kgx.cpp: the runtime of the host-execution build (tests/cuda_host): runs
 * a kernel of kernels/cuda, compiled as host C++ through kgx.h, on the CPU
 * with CUDA's execution model, and checks what a GPU would not forgive.
 *
 * Each CUDA thread runs the kernel function on a fiber (ucontext) of its
 * own once it has to wait: a worker fiber takes the block's threads one
 * after another, and a thread that reaches a barrier (__syncthreads,
 * __syncwarp, a shuffle) keeps the worker while a fresh one takes the
 * next thread. When every live thread waits, a warp whose live lanes all
 * wait at a warp barrier goes on, and otherwise, when all wait at
 * __syncthreads, the block does; anything else is a deadlock (threads at
 * different barriers) and fails the launch. Blocks run one at a time, so
 * function-static "__shared__" arrays are the block's shared memory. A
 * thread that never waits costs one function call: the elementwise
 * kernels run at a few ns per element.
 *
 * Checks, each a contract violation (fake_violation) and a failed launch
 * (cudaGetLastError answers it, as a GPU's launch error):
 *  - the launch configuration: 1..1024 threads a block (x, y <= 1024,
 *    z <= 64), grid y and z <= 65535, at most 48 KiB of dynamic shared
 *    memory (the kernels here never opt into more);
 *  - every pointer argument is NULL or device memory of the fake runtime;
 *  - a warp barrier or shuffle whose mask names a lane that has exited, or
 *    a shuffle reading a lane that did not take part;
 *  - deadlocks;
 *  - determinism (KILN_KGX_ORDERS=2, the default): the launch runs twice,
 *    from the same device memory, once with blocks and threads in order and
 *    once with both reversed (barriers release in the reverse order too).
 *    A kernel whose result depends on the schedule — a missing barrier, a
 *    lane reading another's shared memory without __syncwarp, an atomic
 *    race, blocks that race on one output — gives two different results,
 *    and the first differing byte is reported. KILN_KGX_ORDERS=1 runs once.
 * Shared memory is filled with 0xff bytes (NaN in every float format)
 * when each block first reaches an array's declaration, the dynamic part is
 * a heap block of exactly the launch's size (ASan sees a read past it), and
 * device memory comes from the fake runtime's exact-size blocks; with the
 * plugin's `caching` off (test_cuda_hostexec) every tensor is one, so under
 * ASan a kernel that reads or writes past a tensor fails the test that
 * launched it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "kgx.h"

extern "C" {
#include "fake_internal.h"
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define KGX_ASAN 1
#else
#define KGX_ASAN 0
#endif

extern "C" {
kgx_coords kgx_now;
unsigned char *kgx_dyn_smem;
}

/* Device blocks here stay plain host memory of their exact size (no
 * sealing, fake_cuda.h): the real kernels reach memory through any
 * pointer, struct members included, and ASan checks each byte they touch. */
__attribute__((constructor)) static void kgx_unsealed() { fake_seal_off(); }

namespace {

enum { KGX_MAX_THREADS = 1024, KGX_WARPS = KGX_MAX_THREADS / 32 };
enum thread_state { T_UNSTARTED, T_RUNNING, T_READY, T_AT_SYNCTHREADS, T_AT_WARP, T_DONE };

/* A fiber's stack: ASan's frames and the kernels' locals fit many times. */
const size_t kgx_stack_bytes = 256 << 10;

struct fiber {
    ucontext_t ctx; /* its first entry */
    void *jb[5];    /* where it left off (__builtin_setjmp's buffer) */
    char *map;      /* guard page + stack */
    char *stack;
    size_t size;
    void *fake;     /* ASan's fake stack while switched away */
    int thread;     /* the CUDA thread it runs, -1 between threads */
    bool entered, idle;
};

struct block_run {
    /* the launch */
    const kgx::launch_cfg *c;
    void (*fn)(void *);
    void *env;
    bool reverse;
    unsigned nthreads;
    /* the block */
    uint3 bid;
    int state[KGX_MAX_THREADS];
    unsigned wmask[KGX_MAX_THREADS]; /* the mask a thread waits with at a warp barrier */
    fiber *owner[KGX_MAX_THREADS];
    unsigned started, live;
    fiber *ready[KGX_MAX_THREADS];
    unsigned nready, ready_at;
    unsigned arrived[KGX_WARPS];     /* lanes released by the last warp barrier */
    unsigned char xchg[KGX_WARPS][32][8];
    /* the scheduler's side */
    void *main_jb[5];
    void *main_fake;
    const void *main_bottom;
    size_t main_size;
    fiber *cur;
    unsigned long block_no; /* counts blocks run, for kgx_shared_note */
    /* the first failure of this launch */
    bool failed;
    char why[640];
};

block_run R;

/* The __shared__ arrays seen so far and the block that last filled each. */
struct shared_array {
    void *p;
    size_t bytes;
    unsigned long block_no;
};
shared_array shared[64];
int nshared;

fiber *pool[KGX_MAX_THREADS + 1];
int npool;

void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char *fmt, ...) {
    if (R.failed) return;
    R.failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(R.why, sizeof R.why, fmt, ap);
    va_end(ap);
}

void set_coords(int t) {
    const unsigned bx = kgx_now.bdim.x, by = kgx_now.bdim.y;
    kgx_now.tid = make_uint3((unsigned)t % bx, (unsigned)t / bx % by, (unsigned)t / (bx * by));
    kgx_now.bid = R.bid;
}

/* --------------------------------------------------------------- fibers */

/*
 * Switching: a fiber's first entry goes through its ucontext (setcontext
 * onto its own stack); every later switch, either way, is the compiler's
 * __builtin_setjmp / __builtin_longjmp, which save no signal mask
 * (swapcontext's sigprocmask system call made up most of the run time)
 * and which ASan does not intercept (its hook makes a system call and
 * clears the whole stack's shadow at each jump; the fiber annotations
 * below tell it about the switches instead). A worker never ends: with no
 * thread left to take it parks (idle) and the next block reuses it.
 */
/* These three are not instrumented: ASan would put its no-return hook (a
 * system call and a clear of the whole stack's shadow) before each jump. */
__attribute__((noinline, no_sanitize_address)) void jump_to(void **jb) { __builtin_longjmp(jb, 1); }

__attribute__((no_sanitize_address)) void switch_to(fiber *f) { /* scheduler -> f */
    R.cur = f;
    if (f->thread >= 0) set_coords(f->thread);
    if (__builtin_setjmp(R.main_jb) == 0) {
#if KGX_ASAN
        __sanitizer_start_switch_fiber(&R.main_fake, f->stack, f->size);
#endif
        if (!f->entered) {
            f->entered = true;
            setcontext(&f->ctx);
        }
        jump_to(f->jb);
    }
#if KGX_ASAN
    __sanitizer_finish_switch_fiber(R.main_fake, nullptr, nullptr);
#endif
    R.cur = nullptr;
}

__attribute__((no_sanitize_address)) void switch_back(void) { /* the current fiber -> scheduler */
    if (__builtin_setjmp(R.cur->jb) == 0) {
#if KGX_ASAN
        __sanitizer_start_switch_fiber(&R.cur->fake, R.main_bottom, R.main_size);
#endif
        jump_to(R.main_jb);
    }
#if KGX_ASAN
    __sanitizer_finish_switch_fiber(R.cur->fake, &R.main_bottom, &R.main_size);
#endif
}

int take_unstarted(void) {
    if (R.started == R.nthreads) return -1;
    const unsigned k = R.started++;
    return (int)(R.reverse ? R.nthreads - 1 - k : k);
}

void worker_main(void) {
#if KGX_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &R.main_bottom, &R.main_size);
#endif
    /* R.cur, not a local copy: the kernel may switch away and back (and a
     * local would be a setjmp-"clobbered" value) */
    for (;;) {
        for (int t; (t = take_unstarted()) >= 0;) {
            R.cur->thread = t;
            R.owner[t] = R.cur;
            R.state[t] = T_RUNNING;
            set_coords(t);
            R.fn(R.env);
            R.state[t] = T_DONE;
            R.live--;
            R.cur->thread = -1;
        }
        R.cur->idle = true;
        switch_back();
    }
}

/* Apart from fiber_new: getcontext returns twice, and the caller's locals
 * would be "clobbered" for the compiler. */
__attribute__((noinline)) void fiber_start_at_worker(fiber *f) {
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = f->size;
    f->ctx.uc_link = nullptr;
    makecontext(&f->ctx, worker_main, 0);
}

fiber *fiber_new(void) {
    fiber *f = (fiber *)calloc(1, sizeof *f);
    if (!f) return nullptr;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    f->map = (char *)mmap(nullptr, kgx_stack_bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (f->map == MAP_FAILED) {
        free(f);
        return nullptr;
    }
    mprotect(f->map, page, PROT_NONE); /* an overflow faults instead of corrupting */
    f->stack = f->map + page;
    f->size = kgx_stack_bytes;
    f->thread = -1;
    fiber_start_at_worker(f);
    return f;
}

/* An idle worker, or a new one. */
fiber *fiber_get(void) {
    fiber *f = npool ? pool[--npool] : fiber_new();
    if (f) f->idle = false;
    return f;
}

void fiber_put(fiber *f) { pool[npool++] = f; }

/* A fiber left waiting in a kernel (a deadlocked block): its stack holds
 * frames that will never return, so it is unmapped, not reused. */
void fiber_drop(fiber *f) {
    munmap(f->map, f->size + (size_t)sysconf(_SC_PAGESIZE));
    free(f);
}

/* The current thread waits at a barrier of kind `st` (warp: with mask). */
void wait_at(int st, unsigned mask) {
    fiber *f = R.cur;
    if (!f || f->thread < 0) {
        fprintf(stderr, "kgx: a barrier outside a kernel\n");
        abort();
    }
    R.state[f->thread] = st;
    R.wmask[f->thread] = mask;
    switch_back();
}

/* ------------------------------------------------------------ scheduler */

void make_ready(int t) {
    R.state[t] = T_READY;
    R.ready[R.nready++] = R.owner[t];
}

/* Releases every warp whose live lanes all wait at a warp barrier; true
 * when one was. */
bool release_warps(void) {
    bool any = false;
    const unsigned nw = (R.nthreads + 31) / 32;
    for (unsigned k = 0; k < nw; k++) {
        const unsigned w = R.reverse ? nw - 1 - k : k;
        unsigned live = 0, waiting = 0, exist = 0;
        for (unsigned l = 0; l < 32 && w * 32 + l < R.nthreads; l++) {
            const int s = R.state[w * 32 + l];
            exist |= 1u << l;
            if (s != T_DONE) live |= 1u << l;
            if (s == T_AT_WARP) waiting |= 1u << l;
        }
        if (!live || waiting != live) continue;
        for (unsigned l = 0; l < 32; l++) {
            if (!(waiting >> l & 1)) continue;
            const unsigned named = R.wmask[w * 32 + l] & exist;
            if (named & ~waiting)
                fail("thread %u of block (%u,%u,%u) waits at a warp barrier or shuffle whose mask 0x%08x names "
                     "lanes that have exited (0x%08x)",
                     w * 32 + l, R.bid.x, R.bid.y, R.bid.z, R.wmask[w * 32 + l], named & ~waiting);
        }
        R.arrived[w] = waiting;
        for (unsigned k2 = 0; k2 < 32; k2++) {
            const unsigned l = R.reverse ? 31 - k2 : k2;
            if (waiting >> l & 1) make_ready((int)(w * 32 + l));
        }
        any = true;
    }
    return any;
}

/* Runs block bid to its end (or to a deadlock, which fails the launch). */
void run_block(uint3 bid) {
    R.bid = bid;
    for (unsigned t = 0; t < R.nthreads; t++) R.state[t] = T_UNSTARTED, R.owner[t] = nullptr;
    R.started = 0;
    R.live = R.nthreads;
    R.nready = R.ready_at = 0;
    R.block_no++; /* every shared array is stale until announced again */
    if (kgx_dyn_smem) memset(kgx_dyn_smem, 0xff, R.c->smem);
    for (;;) {
        fiber *f = nullptr;
        if (R.ready_at < R.nready) {
            f = R.ready[R.ready_at++];
            R.state[f->thread] = T_RUNNING;
        } else if (R.started < R.nthreads) {
            if (!(f = fiber_get())) {
                fail("could not allocate a fiber stack: %s", strerror(errno));
                break;
            }
        }
        if (f) {
            switch_to(f);
            if (f->idle) fiber_put(f);
            continue;
        }
        R.nready = R.ready_at = 0;
        if (R.live == 0) break;
        if (release_warps()) continue;
        unsigned at_sync = 0, first_warp = R.nthreads, first_sync = R.nthreads;
        for (unsigned t = 0; t < R.nthreads; t++) {
            if (R.state[t] == T_AT_SYNCTHREADS) {
                at_sync++;
                if (first_sync == R.nthreads) first_sync = t;
            } else if (R.state[t] == T_AT_WARP && first_warp == R.nthreads) first_warp = t;
        }
        if (at_sync == R.live) {
            for (unsigned k = 0; k < R.nthreads; k++) {
                const unsigned t = R.reverse ? R.nthreads - 1 - k : k;
                if (R.state[t] == T_AT_SYNCTHREADS) make_ready((int)t);
            }
            continue;
        }
        fail("block (%u,%u,%u) deadlocks: thread %u waits at __syncthreads while thread %u waits at a warp barrier "
             "its warp never completes",
             bid.x, bid.y, bid.z, first_sync, first_warp);
        for (unsigned t = 0; t < R.nthreads; t++)
            if (R.state[t] != T_DONE && R.owner[t]) fiber_drop(R.owner[t]), R.owner[t] = nullptr;
        break;
    }
}

/* Every block of the grid, in order or reversed. */
void run_grid(const kgx::launch_cfg *c) {
    const dim3 g = c->grid;
    const size_t nb = (size_t)g.x * g.y * g.z;
    for (size_t k = 0; k < nb && !R.failed; k++) {
        const size_t b = R.reverse ? nb - 1 - k : k;
        run_block(make_uint3((unsigned)(b % g.x), (unsigned)(b / g.x % g.y), (unsigned)(b / ((size_t)g.x * g.y))));
    }
}

/* ------------------------------------------------- the two-schedule check */

/* The device blocks a launch may write: those its output pointers point
 * into, and those any 8-byte word of a struct argument points into (the
 * list launches pass their tensors' pointers in a struct). Their bytes
 * before the first run and after it live in two buffers kept from launch to
 * launch (allocating them anew each time cost more than the kernels). */
struct snap {
    char *p;
    size_t n, at; /* at: offset in the buffers */
    int arg;      /* the (first) argument that reaches it, from 1 */
    bool changed;
};

snap *snaps;
int nsnaps, snaps_cap;
char *before, *after;
size_t snap_cap;

bool snap_add(const void *p, int arg) {
    void *base;
    size_t n;
    if (!p || !fake_device_block_of(p, &base, &n)) return true;
    for (int i = 0; i < nsnaps; i++)
        if (snaps[i].p == (char *)base) return true;
    if (nsnaps == snaps_cap) {
        const int cap = snaps_cap ? 2 * snaps_cap : 64;
        snap *ns = (snap *)realloc(snaps, (size_t)cap * sizeof *ns);
        if (!ns) return false;
        snaps = ns, snaps_cap = cap;
    }
    const size_t at = nsnaps ? snaps[nsnaps - 1].at + snaps[nsnaps - 1].n : 0;
    snaps[nsnaps++] = {(char *)base, n, at, arg, false};
    return true;
}

/* Takes the "before" copies; false when out of host memory. */
bool snap_take(const kgx::arg *args, int nargs) {
    nsnaps = 0;
    for (int i = 0; i < nargs; i++) {
        if (args[i].kind == kgx::ARG_OUT && !snap_add(args[i].p, i + 1)) return false;
        if (args[i].kind != kgx::ARG_STRUCT) continue;
        for (size_t o = 0; o + sizeof(uintptr_t) <= args[i].bytes; o += sizeof(uintptr_t)) {
            uintptr_t w;
            memcpy(&w, (const char *)args[i].p + o, sizeof w);
            if (!snap_add((const void *)w, i + 1)) return false;
        }
    }
    const size_t need = nsnaps ? snaps[nsnaps - 1].at + snaps[nsnaps - 1].n : 0;
    if (need > snap_cap) {
        char *b = (char *)realloc(before, need), *a = b ? (char *)realloc(after, need) : nullptr;
        if (b) before = b;
        if (!a) return false;
        after = a, snap_cap = need;
    }
    for (int i = 0; i < nsnaps; i++) memcpy(before + snaps[i].at, snaps[i].p, snaps[i].n);
    return true;
}

/* After the first run: keeps what it changed and puts the blocks back. */
void snap_rewind(void) {
    for (int i = 0; i < nsnaps; i++) {
        snap *x = &snaps[i];
        x->changed = memcmp(x->p, before + x->at, x->n) != 0;
        if (x->changed) memcpy(after + x->at, x->p, x->n), memcpy(x->p, before + x->at, x->n);
    }
}

/* After the second run: the first byte where the two runs differ, if any. */
void snap_compare(void) {
    for (int i = 0; i < nsnaps && !R.failed; i++) {
        const snap *x = &snaps[i];
        const char *first = (x->changed ? after : before) + x->at;
        if (memcmp(first, x->p, x->n) == 0) continue;
        for (size_t k = 0; k < x->n; k++)
            if (first[k] != x->p[k]) {
                fail("its result depends on the order blocks and threads run in: byte %zu of the %zu-byte device "
                     "block at %p (argument %d's) is 0x%02x in order and 0x%02x with blocks and threads reversed",
                     k, x->n, (void *)x->p, x->arg, (unsigned char)first[k], (unsigned char)x->p[k]);
                break;
            }
    }
}

int orders(void) {
    const char *e = getenv("KILN_KGX_ORDERS");
    return e && strcmp(e, "1") == 0 ? 1 : 2;
}

bool config_ok(const kgx::launch_cfg *c) {
    const dim3 g = c->grid, b = c->block;
    const unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (g.x < 1 || g.y < 1 || g.z < 1 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
        fake_violation("%s: grid (%u,%u,%u) is out of CUDA's range", c->name, g.x, g.y, g.z);
        return false;
    }
    if (threads < 1 || threads > KGX_MAX_THREADS || b.x > 1024 || b.y > 1024 || b.z > 64) {
        fake_violation("%s: block (%u,%u,%u) is out of CUDA's range", c->name, b.x, b.y, b.z);
        return false;
    }
    if (c->smem > 48 << 10) {
        fake_violation("%s: %zu bytes of dynamic shared memory, over the 48 KiB a kernel gets without opting in",
                       c->name, c->smem);
        return false;
    }
    return true;
}

} // namespace

extern "C" void kgx_shared_note(void *p, size_t bytes) {
    int i = 0;
    while (i < nshared && shared[i].p != p) i++;
    if (i == nshared) {
        if (nshared == (int)(sizeof shared / sizeof shared[0])) {
            fprintf(stderr, "kgx: more than %d __shared__ arrays\n", nshared);
            abort();
        }
        shared[nshared++] = {p, bytes, 0};
    }
    if (shared[i].block_no != R.block_no) {
        memset(p, 0xff, bytes);
        shared[i].block_no = R.block_no;
    }
}

extern "C" void kgx_syncthreads(void) { wait_at(T_AT_SYNCTHREADS, 0); }

extern "C" void kgx_syncwarp(unsigned mask) { wait_at(T_AT_WARP, mask); }

extern "C" void kgx_shfl_xor(unsigned mask, void *v, size_t n, int xor_mask) {
    const int t = R.cur->thread, w = t / 32, lane = t % 32, src = (lane ^ xor_mask) & 31;
    memcpy(R.xchg[w][lane], v, n);
    wait_at(T_AT_WARP, mask);
    if (!(R.arrived[w] >> src & 1))
        fail("thread %d of block (%u,%u,%u) shuffles from lane %d, which is not at the shuffle", t, R.bid.x, R.bid.y,
             R.bid.z, src);
    memcpy(v, R.xchg[w][src], n);
    wait_at(T_AT_WARP, mask); /* nobody offers a new value before all have read */
}

extern "C" void kgx_launch(const kgx::launch_cfg *c, void (*fn)(void *), void *env, const kgx::arg *args,
                           int nargs) {
    if (!config_ok(c)) {
        fake_error(cudaErrorInvalidConfiguration);
        return;
    }
    for (int i = 0; i < nargs; i++)
        if (args[i].kind != kgx::ARG_STRUCT && args[i].p && !fake_is_device_ptr(args[i].p)) {
            fake_violation("%s: pointer argument %d (%p) is not device memory", c->name, i + 1, args[i].p);
            fake_error(cudaErrorIllegalAddress);
            return;
        }
    if (fake_stream_drain(c->stream, c->name) != cudaSuccess) return;
    fake_stats.kernels++;

    R.c = c, R.fn = fn, R.env = env, R.failed = false, R.why[0] = 0;
    R.nthreads = c->block.x * c->block.y * c->block.z;
    kgx_now.bdim = c->block, kgx_now.gdim = c->grid;
    kgx_dyn_smem = c->smem ? (unsigned char *)malloc(c->smem) : nullptr;
    const bool twice = orders() == 2;
    if ((c->smem && !kgx_dyn_smem) || (twice && !snap_take(args, nargs))) {
        free(kgx_dyn_smem), kgx_dyn_smem = nullptr;
        fake_violation("%s: out of host memory for the emulation", c->name);
        fake_error(cudaErrorMemoryAllocation);
        return;
    }
    R.reverse = false;
    run_grid(c);
    if (twice && !R.failed) {
        snap_rewind();
        R.reverse = true;
        run_grid(c);
        snap_compare();
    }
    free(kgx_dyn_smem), kgx_dyn_smem = nullptr;
    if (R.failed) {
        fake_violation("%s<<<(%u,%u,%u), (%u,%u,%u), %zu>>>: %s", c->name, c->grid.x, c->grid.y, c->grid.z,
                       c->block.x, c->block.y, c->block.z, c->smem, R.why);
        fake_error(cudaErrorLaunchFailure);
    }
}
