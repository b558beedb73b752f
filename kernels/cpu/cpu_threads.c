/*
 * cpu_threads.c: the small persistent POSIX thread pool that splits large
 * kernel loops (elementwise, reductions, optimizer updates) across threads.
 * Training calls these kernels hundreds of times per step on arrays of up to a
 * few million floats, so creating threads per call would cost more than the
 * work; instead kc_set_num_threads starts n-1 workers once and each
 * kc_parallel_for hands them one contiguous part each, the caller running the
 * first part itself. Idle workers sleep on a condition variable (never spin),
 * because on a 2-core machine a spinning worker would steal the core that
 * OpenBLAS or the host needs. One parallel region runs at a time; a second
 * caller (another thread, or a range body calling a kernel) simply runs its
 * loop serially, which is always correct because parts never share outputs.
 */
#define _POSIX_C_SOURCE 200809L

#include "cpu_internal.h"
#include "cpu_kernels.h"

#include <pthread.h>
#include <signal.h>

/* Held for a whole parallel region and while the pool is resized; trylock'ed
 * by kc_parallel_for so that contention means "run serially", never waiting. */
static pthread_mutex_t kc_dispatch_mu = PTHREAD_MUTEX_INITIALIZER;

/* Protects everything below; workers wait on kc_wake, the dispatcher on
 * kc_done. */
static pthread_mutex_t kc_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t kc_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t kc_done = PTHREAD_COND_INITIALIZER;

typedef struct {
    int index;               /* 1..n_workers: which part this worker runs */
    unsigned long seen_gen;  /* last job generation this worker looked at */
} kc_worker_arg;

static pthread_t kc_workers[KC_MAX_THREADS - 1];
static kc_worker_arg kc_worker_args[KC_MAX_THREADS - 1];
static int kc_n_workers;      /* running workers; threads in use = this + 1 */
static int kc_quit;           /* set while the pool is being shut down */
static unsigned long kc_gen;  /* bumped once per posted job */
static int kc_pending;        /* parts of the current job not yet finished */

/* The current job: parts [i * chunk, min(n, (i+1) * chunk)) for i < parts. */
static kc_range_fn kc_job_fn;
static void *kc_job_ctx;
static size_t kc_job_n;
static size_t kc_job_chunk;
static int kc_job_parts;

static void *kc_worker_main(void *argp) {
    kc_worker_arg *arg = argp;
    pthread_mutex_lock(&kc_mu);
    for (;;) {
        while (arg->seen_gen == kc_gen && !kc_quit) pthread_cond_wait(&kc_wake, &kc_mu);
        if (kc_quit) break;
        arg->seen_gen = kc_gen;
        if (arg->index >= kc_job_parts) continue; /* nothing for us this time */
        kc_range_fn fn = kc_job_fn;
        void *ctx = kc_job_ctx;
        size_t begin = (size_t)arg->index * kc_job_chunk;
        size_t end = begin + kc_job_chunk;
        if (end > kc_job_n) end = kc_job_n;
        pthread_mutex_unlock(&kc_mu);
        fn(ctx, begin, end);
        pthread_mutex_lock(&kc_mu);
        if (--kc_pending == 0) pthread_cond_signal(&kc_done);
    }
    pthread_mutex_unlock(&kc_mu);
    return NULL;
}

/* Stops and joins every worker. Caller holds kc_dispatch_mu, so no job is in
 * flight and every worker is asleep or about to be. */
static void kc_pool_stop_locked(void) {
    if (kc_n_workers == 0) return;
    pthread_mutex_lock(&kc_mu);
    kc_quit = 1;
    pthread_cond_broadcast(&kc_wake);
    pthread_mutex_unlock(&kc_mu);
    for (int i = 0; i < kc_n_workers; i++) pthread_join(kc_workers[i], NULL);
    pthread_mutex_lock(&kc_mu);
    kc_quit = 0;
    pthread_mutex_unlock(&kc_mu);
    kc_n_workers = 0;
}

/*
 * fork(): the child inherits the pool's bookkeeping but none of its threads,
 * and a region would wait forever for them. Around fork we hold the locks (so
 * no region or resize is half done) and in the child forget the workers; the
 * child starts serial and may call kc_set_num_threads again.
 */
static void kc_atfork_prepare(void) {
    pthread_mutex_lock(&kc_dispatch_mu);
    pthread_mutex_lock(&kc_mu);
}
static void kc_atfork_parent(void) {
    pthread_mutex_unlock(&kc_mu);
    pthread_mutex_unlock(&kc_dispatch_mu);
}
static void kc_atfork_child(void) {
    kc_n_workers = 0;
    kc_quit = 0;
    kc_pending = 0;
    /* The parent's workers were waiting on these; nobody waits in the child. */
    pthread_cond_init(&kc_wake, NULL);
    pthread_cond_init(&kc_done, NULL);
    pthread_mutex_unlock(&kc_mu);
    pthread_mutex_unlock(&kc_dispatch_mu);
}
static pthread_once_t kc_atfork_once = PTHREAD_ONCE_INIT;
static void kc_atfork_register(void) {
    pthread_atfork(kc_atfork_prepare, kc_atfork_parent, kc_atfork_child);
}

int kc_set_num_threads(int n) {
    if (n < 1) n = 1;
    if (n > KC_MAX_THREADS) n = KC_MAX_THREADS;
    pthread_once(&kc_atfork_once, kc_atfork_register);
    pthread_mutex_lock(&kc_dispatch_mu);
    if (n - 1 != kc_n_workers) {
        kc_pool_stop_locked();
        /* Workers block every signal so that process-directed signals (SIGINT,
         * SIGTERM) keep going to the host's own threads. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_mutex_lock(&kc_mu);
        unsigned long gen = kc_gen;
        pthread_mutex_unlock(&kc_mu);
        for (int i = 0; i < n - 1; i++) {
            kc_worker_args[i].index = i + 1;
            kc_worker_args[i].seen_gen = gen;
            if (pthread_create(&kc_workers[i], NULL, kc_worker_main, &kc_worker_args[i]) != 0)
                break;
            kc_n_workers = i + 1;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    int now = kc_n_workers + 1;
    pthread_mutex_unlock(&kc_dispatch_mu);
    return now;
}

int kc_get_num_threads(void) {
    pthread_mutex_lock(&kc_dispatch_mu);
    int now = kc_n_workers + 1;
    pthread_mutex_unlock(&kc_dispatch_mu);
    return now;
}

void kc_parallel_for(size_t n, size_t grain, size_t align, kc_range_fn fn, void *ctx) {
    if (n == 0) return;
    if (grain < 1) grain = 1;
    if (align < 1) align = 1;
    if (n < 2 * grain || pthread_mutex_trylock(&kc_dispatch_mu) != 0) {
        fn(ctx, 0, n);
        return;
    }
    size_t threads = (size_t)kc_n_workers + 1;
    size_t parts = n / grain;
    if (parts > threads) parts = threads;
    if (parts < 2) {
        pthread_mutex_unlock(&kc_dispatch_mu);
        fn(ctx, 0, n);
        return;
    }
    size_t chunk = (n + parts - 1) / parts;
    chunk = (chunk + align - 1) / align * align;
    parts = (n + chunk - 1) / chunk; /* rounding up the chunk may drop a part */

    pthread_mutex_lock(&kc_mu);
    kc_job_fn = fn;
    kc_job_ctx = ctx;
    kc_job_n = n;
    kc_job_chunk = chunk;
    kc_job_parts = (int)parts;
    kc_pending = (int)parts - 1;
    kc_gen++;
    if (kc_pending > 0) pthread_cond_broadcast(&kc_wake);
    pthread_mutex_unlock(&kc_mu);

    fn(ctx, 0, chunk < n ? chunk : n);

    pthread_mutex_lock(&kc_mu);
    while (kc_pending > 0) pthread_cond_wait(&kc_done, &kc_mu);
    pthread_mutex_unlock(&kc_mu);
    pthread_mutex_unlock(&kc_dispatch_mu);
}

/*
 * Joins the workers when the kernels' image is unloaded (dlclose of the
 * plugin) or the process exits, so no thread is left sleeping in code that is
 * about to be unmapped. trylock: if exit() happens while another thread is in
 * a parallel region, waiting for it could hang the exit, so leave it be.
 */
__attribute__((destructor)) static void kc_pool_fini(void) {
    if (pthread_mutex_trylock(&kc_dispatch_mu) != 0) return;
    kc_pool_stop_locked();
    pthread_mutex_unlock(&kc_dispatch_mu);
}
