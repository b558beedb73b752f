/*
 * tests/ddp/test_ddp.c — the ddp strategy plugin through its ABI, loaded by
 * the test host. The same program runs twice under CTest: as one plain
 * process (a singleton MPI world: config validation, where the rank comes
 * from — explicit config, OpenMPI, torchrun-style, Slurm variables, in that
 * order — and the refusal, with launch advice, of a rank that the MPI world
 * does not confirm), and under `mpirun -n 2` (rank 0's weights broadcast to
 * every rank in setup, gradients averaged by post_backward for float32 and
 * float64 masters, staged through the kernel table's copy when the
 * accelerator's memory is not host memory, reduce_sum, and the collective
 * counts in the destroy log line). The program initialises MPI itself, so the
 * plugin joins the existing world and never finalizes it.
 */
#define _GNU_SOURCE
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <CUnit/CUnit.h>

#include <kiln/testing.h>

#include "plugin_fixture.h"

static kiln_test_host *g_th; /* the test host (kiln/testing.h) every suite here uses */

static const kiln_plugin_desc *g_desc;
static int g_rank, g_world;

static const kiln_strategy_ops *ops(void) { return (const kiln_strategy_ops *)g_desc->ops; }

/* The resolved config the host would pass: every declared key present. */
static kiln_kv g_cfg[5];
static const kiln_kv *cfg(int64_t rank, int64_t world, int64_t local, double bucket_mb) {
    g_cfg[0] = (kiln_kv){"rank", KILN_V_INT(rank)};
    g_cfg[1] = (kiln_kv){"world_size", KILN_V_INT(world)};
    g_cfg[2] = (kiln_kv){"local_rank", KILN_V_INT(local)};
    g_cfg[3] = (kiln_kv){"bucket_mb", KILN_V_FLOAT(bucket_mb)};
    g_cfg[4] = (kiln_kv){NULL, KILN_V_NONE};
    return g_cfg;
}

static int32_t create(const kiln_kv *c, kiln_instance **inst) {
    *inst = NULL;
    kiln_test_clear_error(g_th);
    kiln_test_clear_error(g_th);
    return ops()->base.create(g_desc->plugin_ctx, kiln_test_services(g_th), kiln_test_hctx(g_th), c, inst);
}

/* Destroy `inst` with stderr captured, and read its "ddp: rank R: B
 * broadcasts, A all-reduces (N bytes)" line. Returns 1 when found. */
static int destroy_counts(kiln_instance *inst, unsigned long long *bcast, unsigned long long *allred,
                          unsigned long long *bytes) {
    char path[] = "/tmp/kiln-test-ddp-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { ops()->base.destroy(inst); return 0; }
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    ops()->base.destroy(inst);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    FILE *f = fopen(path, "r");
    int found = 0;
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        fputs(line, stderr); /* keep it visible in the test log */
        const char *s = strstr(line, "ddp: rank ");
        int r;
        if (s && sscanf(s, "ddp: rank %d: %llu broadcasts, %llu all-reduces (%llu bytes)", &r, bcast, allred,
                        bytes) == 4 && r == g_rank)
            found = 1;
    }
    if (f) fclose(f);
    unlink(path);
    return found;
}

static const char *const g_vars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                                     "SLURM_LOCALID"};
static void clear_env(void) {
    for (size_t i = 0; i < sizeof g_vars / sizeof g_vars[0]; i++) unsetenv(g_vars[i]);
}

/* ------------------------------------------------------------------------ */
/* One process */

static void test_descriptor(void) {
    CU_ASSERT_EQUAL(g_desc->kind, KILN_KIND_STRATEGY);
    const kiln_value *d = kiln_kv_find(g_desc->properties, "distributed");
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    CU_ASSERT_EQUAL(d->type, KILN_TYPE_BOOL);
    CU_ASSERT_EQUAL(d->v.i, 1);
    const char *keys[] = {"rank", "world_size", "local_rank", "bucket_mb"};
    for (size_t k = 0; k < 4; k++) {
        int seen = 0;
        for (const kiln_param *p = g_desc->params; p && p->key; p++) seen |= !strcmp(p->key, keys[k]);
        CU_ASSERT(seen);
    }
    CU_ASSERT(ops()->base.struct_size >= KILN_STRATEGY_OPS_SIZE_1_1);
}

static void test_config_errors(void) {
    clear_env();
    kiln_instance *inst;
    CU_ASSERT_EQUAL(create(cfg(-1, -1, -1, 0.0), &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(inst);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "bucket_mb"));
    CU_ASSERT_EQUAL(create(cfg(0, -1, -1, 25), &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "both rank and world_size"));
    CU_ASSERT_EQUAL(create(cfg(2, 2, -1, 25), &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "rank < world_size"));
    CU_ASSERT_EQUAL(create(cfg(-1, 0, -1, 25), &inst), KILN_E_CONFIG);
    setenv("RANK", "one", 1);
    setenv("WORLD_SIZE", "2", 1);
    CU_ASSERT_EQUAL(create(cfg(-1, -1, -1, 25), &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "RANK: expected a non-negative integer, found 'one'"));
    unsetenv("WORLD_SIZE");
    setenv("RANK", "0", 1);
    CU_ASSERT_EQUAL(create(cfg(-1, -1, -1, 25), &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "both are needed"));
    clear_env();
}

/* No launcher variables: the MPI world (rank 0 of 1) is the answer. */
static void test_singleton_world(void) {
    clear_env();
    kiln_instance *inst;
    CU_ASSERT_EQUAL_FATAL(create(cfg(-1, -1, -1, 25), &inst), KILN_OK);
    int32_t r = -1, w = -1, l = -1;
    CU_ASSERT_EQUAL(ops()->world(inst, &r, &w, &l), KILN_OK);
    CU_ASSERT_EQUAL(r, 0);
    CU_ASSERT_EQUAL(w, 1);
    CU_ASSERT_EQUAL(l, 0);
    /* one rank: the sum is the value, barrier returns, no gradient traffic */
    double v[2] = {1.25, -3};
    CU_ASSERT_EQUAL(ops()->reduce_sum(inst, v, 2), KILN_OK);
    CU_ASSERT_EQUAL(v[0], 1.25);
    CU_ASSERT_EQUAL(v[1], -3);
    CU_ASSERT_EQUAL(ops()->barrier(inst, "test"), KILN_OK);
    kiln_parameter *p;
    int64_t shape[1] = {4};
    CU_ASSERT_EQUAL_FATAL(kiln_test_services(g_th)->param_register(kiln_test_hctx(g_th), "w", 1, shape, 0, &p), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(g_th), 0);
    for (int i = 0; i < 4; i++) p->grad[i] = (float)i + 0.5f;
    CU_ASSERT_EQUAL(ops()->setup(inst, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    CU_ASSERT_EQUAL(ops()->post_backward(inst), KILN_OK);
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(p->grad[i], (float)i + 0.5f);
    unsigned long long b = 99, a = 99, n = 99;
    CU_ASSERT(destroy_counts(inst, &b, &a, &n));
    CU_ASSERT_EQUAL(b, 0);
    CU_ASSERT_EQUAL(a, 0);
    kiln_test_reset(g_th);
}

/* The sources in order; each refusal names the source that won and says how
 * to launch. A source that agrees with MPI (rank 0 of 1) is accepted. */
static void test_rank_sources(void) {
    kiln_instance *inst;
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "1", 1);
    /* explicit config beats every variable */
    CU_ASSERT_EQUAL(create(cfg(0, 1, 5, 25), &inst), KILN_OK);
    if (inst) {
        int32_t r, w, l;
        ops()->world(inst, &r, &w, &l);
        CU_ASSERT_EQUAL(l, 5);
        ops()->base.destroy(inst);
    }
    CU_ASSERT_EQUAL(create(cfg(1, 2, -1, 25), &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "explicit config"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "MPI world is rank 0 of 1"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "mpirun -n 2"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "srun"));
    /* then OpenMPI's variables */
    CU_ASSERT_EQUAL(create(cfg(-1, -1, -1, 25), &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NULL(inst);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "OMPI_COMM_WORLD_RANK"));
    /* then torchrun-style, whose LOCAL_RANK is taken as given */
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    setenv("LOCAL_RANK", "3", 1);
    CU_ASSERT_EQUAL(create(cfg(-1, -1, -1, 25), &inst), KILN_OK);
    if (inst) {
        int32_t r = -1, w = -1, l = -1;
        ops()->world(inst, &r, &w, &l);
        CU_ASSERT_EQUAL(r, 0);
        CU_ASSERT_EQUAL(w, 1);
        CU_ASSERT_EQUAL(l, 3);
        ops()->base.destroy(inst);
    }
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    CU_ASSERT_EQUAL(create(cfg(-1, -1, -1, 25), &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "torchrun-style"));
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "cannot form an MPI world"));
    /* then Slurm */
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_NTASKS", "2", 1);
    CU_ASSERT_EQUAL(create(cfg(-1, -1, -1, 25), &inst), KILN_E_CONFIG);
    CU_ASSERT_PTR_NOT_NULL(strstr(kiln_test_error(g_th), "SLURM_PROCID"));
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "1", 1);
    CU_ASSERT_EQUAL(create(cfg(-1, -1, -1, 25), &inst), KILN_OK);
    if (inst) ops()->base.destroy(inst);
    clear_env();
}

/* ------------------------------------------------------------------------ */
/* Two ranks */

/* Three parameters, 15 + 3 + 1000 elements, with rank-dependent values.
 * bucket_mb 0.001 is 1048 bytes: 262 floats or 131 doubles per bucket, so the
 * 1000-element parameter is split across buckets. */
#define NP 3
static const int64_t g_numel[NP] = {15, 3, 1000};
static double master0(uint32_t k, int64_t i) { return 0.25 * (double)(k + 1) + 0.001 * (double)i; }
static double local_val(int rank, uint32_t k, int64_t i) { return rank ? -7.0 - (double)i : master0(k, i); }
static double grad_val(int rank, uint32_t k, int64_t i) { return (double)(rank + 1) * (0.1 * (double)(k + 1) + 0.013 * (double)i); }

static void make_params(uint32_t dtype) {
    for (uint32_t k = 0; k < NP; k++) {
        kiln_parameter *p;
        char name[16];
        snprintf(name, sizeof name, "p%u", k);
        int64_t shape[1] = {g_numel[k]};
        CU_ASSERT_EQUAL_FATAL(kiln_test_services(g_th)->param_register(kiln_test_hctx(g_th), name, 1, shape, 0, &p), KILN_OK);
    }
    CU_ASSERT_EQUAL_FATAL(kiln_test_alloc_params(g_th), 0);
    for (uint32_t k = 0; k < NP; k++) {
        kiln_parameter *p = kiln_test_params(g_th)[k];
        if (dtype == KILN_DTYPE_F64) { /* doubles behind the float pointers, as the host does */
            free(p->data);
            free(p->grad);
            p->data = malloc((size_t)p->numel * sizeof(double));
            p->grad = malloc((size_t)p->numel * sizeof(double));
            p->param_dtype = KILN_DTYPE_F64;
            p->compute = p->data;
            CU_ASSERT_FATAL(p->data && p->grad);
            for (int64_t i = 0; i < p->numel; i++) {
                ((double *)p->data)[i] = local_val(g_rank, k, i);
                ((double *)p->grad)[i] = grad_val(g_rank, k, i);
            }
        } else {
            for (int64_t i = 0; i < p->numel; i++) {
                p->data[i] = (float)local_val(g_rank, k, i);
                p->grad[i] = (float)grad_val(g_rank, k, i);
            }
        }
    }
}

/* Every rank holds rank 0's weights and the mean of both ranks' gradients. */
static void check_params(uint32_t dtype) {
    int bad_w = 0, bad_g = 0;
    for (uint32_t k = 0; k < NP; k++) {
        const kiln_parameter *p = kiln_test_params(g_th)[k];
        for (int64_t i = 0; i < p->numel; i++) {
            if (dtype == KILN_DTYPE_F64) {
                bad_w += ((double *)p->data)[i] != master0(k, i);
                bad_g += ((double *)p->grad)[i] != (grad_val(0, k, i) + grad_val(1, k, i)) / 2.0;
            } else {
                bad_w += p->data[i] != (float)master0(k, i);
                bad_g += p->grad[i] != ((float)grad_val(0, k, i) + (float)grad_val(1, k, i)) / 2.0f;
            }
        }
    }
    CU_ASSERT_EQUAL(bad_w, 0);
    CU_ASSERT_EQUAL(bad_g, 0);
}

static void run_two_rank(uint32_t dtype, unsigned expect_buckets) {
    kiln_test_reset(g_th);
    make_params(dtype);
    kiln_instance *inst;
    CU_ASSERT_EQUAL_FATAL(create(cfg(-1, -1, -1, 0.001), &inst), KILN_OK);
    int32_t r = -1, w = -1, l = -1;
    ops()->world(inst, &r, &w, &l);
    CU_ASSERT_EQUAL(r, g_rank);
    CU_ASSERT_EQUAL(w, 2);
    /* before setup, the ranks' weights differ */
    CU_ASSERT(g_rank == 0 || kiln_test_params(g_th)[0]->data[0] != (float)master0(0, 0));
    CU_ASSERT_EQUAL_FATAL(ops()->setup(inst, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    CU_ASSERT_EQUAL(ops()->pre_backward(inst), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(ops()->post_backward(inst), KILN_OK);
    check_params(dtype);
    CU_ASSERT_EQUAL(ops()->barrier(inst, "after"), KILN_OK);
    unsigned long long b = 0, a = 0, n = 0;
    CU_ASSERT_FATAL(destroy_counts(inst, &b, &a, &n));
    CU_ASSERT_EQUAL(b, expect_buckets);
    CU_ASSERT_EQUAL(a, expect_buckets);
    CU_ASSERT_EQUAL(n, 1018ull * kiln_dtype_size(dtype));
    kiln_test_reset(g_th);
}

/* 1018 floats in buckets of 262: 4 broadcasts, 4 all-reduces. */
static void test_bcast_allreduce_f32(void) { run_two_rank(KILN_DTYPE_F32, 4); }
/* 1018 doubles in buckets of 131: 8 of each. */
static void test_bcast_allreduce_f64(void) { run_two_rank(KILN_DTYPE_F64, 8); }

/* A fake accelerator whose memory is "not host memory": every byte must go
 * through its copy (counted); the memory is really host memory, so the
 * result can be checked. */
static int g_copies[3], g_syncs;
static int32_t fake_copy(kiln_instance *acc, void *dst, const void *src, size_t bytes, int32_t kind) {
    (void)acc;
    if (kind < 0 || kind > 2) return KILN_E_INVALID_ARG;
    g_copies[kind]++;
    memcpy(dst, src, bytes);
    return KILN_OK;
}
static int32_t fake_sync(kiln_instance *acc) { (void)acc; g_syncs++; return KILN_OK; }

static void test_device_memory_staging(void) {
    kiln_test_reset(g_th);
    /* device memory (flags 0): the plugin must stage through copy */
    static kiln_kernels k;
    k = (kiln_kernels){.struct_size = sizeof k, .flags = 0, .copy = fake_copy, .synchronize = fake_sync};
    memset(g_copies, 0, sizeof g_copies);
    g_syncs = 0;
    make_params(KILN_DTYPE_F32);
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), &k);
    kiln_instance *inst;
    CU_ASSERT_EQUAL_FATAL(create(cfg(-1, -1, -1, 0.001), &inst), KILN_OK);
    CU_ASSERT_EQUAL_FATAL(ops()->setup(inst, kiln_test_params(g_th), kiln_test_param_count(g_th)), KILN_OK);
    /* rank 0 reads its weights (D2H), the others write them (H2D) */
    CU_ASSERT(g_rank == 0 ? g_copies[KILN_COPY_D2H] > 0 && g_copies[KILN_COPY_H2D] == 0
                          : g_copies[KILN_COPY_H2D] > 0 && g_copies[KILN_COPY_D2H] == 0);
    memset(g_copies, 0, sizeof g_copies);
    CU_ASSERT_EQUAL_FATAL(ops()->post_backward(inst), KILN_OK);
    /* 6 segments: p0, p1 and p2 split over 4 buckets (244, 262, 262, 232 of p2) */
    CU_ASSERT_EQUAL(g_copies[KILN_COPY_D2H], 6);
    CU_ASSERT_EQUAL(g_copies[KILN_COPY_H2D], 6);
    CU_ASSERT(g_syncs > 0);
    check_params(KILN_DTYPE_F32);
    ops()->base.destroy(inst);
    kiln_test_set_accelerator(g_th, kiln_test_acc(g_th), NULL);
    kiln_test_reset(g_th);
}

static void test_reduce_sum_two(void) {
    kiln_test_reset(g_th);
    kiln_instance *inst;
    CU_ASSERT_EQUAL_FATAL(create(cfg(-1, -1, -1, 25), &inst), KILN_OK);
    double v[3] = {(double)g_rank, 1.5, g_rank ? 0.25 : 1e10};
    CU_ASSERT_EQUAL(ops()->reduce_sum(inst, v, 3), KILN_OK);
    CU_ASSERT_EQUAL(v[0], 1.0);
    CU_ASSERT_EQUAL(v[1], 3.0);
    CU_ASSERT_EQUAL(v[2], 1e10 + 0.25);
    CU_ASSERT_EQUAL(ops()->reduce_sum(inst, v, 0), KILN_OK);
    /* accumulation: no post_backward, no all-reduce; the metric sums are not gradient all-reduces */
    unsigned long long b = 9, a = 9, n = 9;
    CU_ASSERT(destroy_counts(inst, &b, &a, &n));
    CU_ASSERT_EQUAL(a, 0);
    kiln_test_reset(g_th);
}

/* ------------------------------------------------------------------------ */

static int suite_clean(void) { return MPI_Finalize() == MPI_SUCCESS ? 0 : 1; }

static void register_tests(void) {
    if (kiln_test_host_new(&g_th) != KILN_OK) return; /* no suite: the runner fails */
    setenv("KILN_TEST_VERBOSE", "1", 1); /* the test host prints info lines: the destroy counts */
    MPI_Init(NULL, NULL);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    kiln_test_reset(g_th);
    g_desc = fixture_load_plugin(g_th, "ddp", KILN_KIND_STRATEGY, "ddp");
    if (!g_desc) {
        fprintf(stderr, "cannot load libkiln-ddp.so from $KILN_PLUGIN_DIR\n");
        CU_add_suite("ddp (plugin missing)", NULL, suite_clean);
        return;
    }
    if (g_world == 1) {
        CU_pSuite s = CU_add_suite("ddp, one process", NULL, suite_clean);
        CU_add_test(s, "descriptor: distributed, declared keys", test_descriptor);
        CU_add_test(s, "config errors", test_config_errors);
        CU_add_test(s, "singleton MPI world", test_singleton_world);
        CU_add_test(s, "rank sources: config > OpenMPI > torchrun > Slurm", test_rank_sources);
    } else if (g_world == 2) {
        CU_pSuite s = CU_add_suite("ddp, two ranks", NULL, suite_clean);
        CU_add_test(s, "broadcast + all-reduce, float32, split buckets", test_bcast_allreduce_f32);
        CU_add_test(s, "broadcast + all-reduce, float64", test_bcast_allreduce_f64);
        CU_add_test(s, "device memory staged through the kernel copy", test_device_memory_staging);
        CU_add_test(s, "reduce_sum", test_reduce_sum_two);
    } else {
        fprintf(stderr, "test_ddp: run with 1 or 2 processes, found %d\n", g_world);
        CU_add_suite("ddp (wrong world size)", NULL, suite_clean);
    }
}

#include "cunit_main.h"
