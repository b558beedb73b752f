/*
 * test_ddp_slurm.c — plugins/ddp/ddp_slurm.c: Slurm host lists expanded
 * exactly as `scontrol show hostnames` prints them (the expected lists
 * below are scontrol's output from Slurm 22.05), malformed lists refused
 * with one line, the rendezvous port formula, and the decision before
 * MPI_Init for each way Slurm (or mpirun inside an allocation) can start a
 * process, on environments given as tables.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <string.h>

#include "ddp_slurm.h"

/* Expands list with ddp_slurm_hostlist_nth into one space-separated string. */
static void expand(const char *list, char *out, size_t outlen) {
    char err[300] = "", host[64];
    long n = ddp_slurm_hostlist_count(list, err, sizeof err);
    out[0] = 0;
    if (n < 0) {
        snprintf(out, outlen, "ERROR %s", err);
        return;
    }
    size_t o = 0;
    for (long i = 0; i < n; i++) {
        int r = ddp_slurm_hostlist_nth(list, i, host, sizeof host, err, sizeof err);
        CU_ASSERT_EQUAL(r, 0);
        if (r) return;
        o += (size_t)snprintf(out + o, outlen - o, "%s%s", i ? " " : "", host);
    }
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_nth(list, n, host, sizeof host, err, sizeof err), 1); /* past the end */
}

static void check(const char *list, const char *want) {
    char got[1024];
    expand(list, got, sizeof got);
    if (strcmp(got, want)) fprintf(stderr, "\n    '%s': expected '%s', found '%s'\n", list, want, got);
    CU_ASSERT_STRING_EQUAL(got, want);
}

static void test_scontrol_forms(void) {
    check("node[01-04,07]", "node01 node02 node03 node04 node07");
    check("a[1-2],b3", "a1 a2 b3");
    check("a[1-2]-b[3-4]", "a1-b3 a1-b4 a2-b3 a2-b4");
    check("n[8-10]", "n8 n9 n10");
    check("n[008-10]", "n008 n009 n010");
    check("n[1-010]", "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10");
    check("x[3]", "x3");
    check("a,b,,c", "a b c");
    check("vm", "vm");
    check("gpu[1-2],cpu[001-002],login", "gpu1 gpu2 cpu001 cpu002 login");
    check("r[1-2]n[09-10]", "r1n09 r1n10 r2n09 r2n10");
}

static void test_first_host(void) {
    char host[64], err[300];
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_nth("node[07-09],a1", 0, host, sizeof host, err, sizeof err), 0);
    CU_ASSERT_STRING_EQUAL(host, "node07");
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_nth("node[07-09],a1", 3, host, sizeof host, err, sizeof err), 0);
    CU_ASSERT_STRING_EQUAL(host, "a1");
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_nth("", 0, host, sizeof host, err, sizeof err), 1); /* empty list */
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_count("", err, sizeof err), 0);
    /* the last host of a large range without walking it */
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_count("n[000000-999999]", err, sizeof err), 1000000);
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_nth("n[000000-999999]", 999999, host, sizeof host, err, sizeof err), 0);
    CU_ASSERT_STRING_EQUAL(host, "n999999");
    /* a name that does not fit is an error, not a truncated host */
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_nth("averylonghostname[1-2]", 0, host, 8, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "longer than 7 bytes"));
}

static void refused(const char *list, const char *want) {
    char err[300] = "", host[64];
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_count(list, err, sizeof err), -1);
    if (!strstr(err, want)) fprintf(stderr, "\n    '%s': expected an error with '%s', found '%s'\n", list, want, err);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_nth(list, 0, host, sizeof host, err, sizeof err), -1);
}

static void test_malformed(void) {
    refused("n[2-1]", "range 2-1 goes down");
    refused("n[1-2", "balanced, unnested brackets");
    refused("n1-2]", "balanced, unnested brackets");
    refused("n[[1]]", "balanced, unnested brackets");
    refused("n[]", "expected a number");
    refused("n[a-b]", "expected a number");
    refused("n[1-]", "upper bound");
    refused("n[1;2]", "expected ',' or ']'");
    refused("n[1234567890]", "at most 9 digits");
    refused("a[0-999999]b[0-9]", "at most 1000000 hosts");
    refused("a[0-999999],b[0-9]", "at most 1000000 hosts");
    refused("a[1]b[1]c[1]d[1]e[1]f[1]g[1]h[1]i[1]", "at most 8 bracket groups");
    char err[100];
    CU_ASSERT_EQUAL(ddp_slurm_hostlist_count(NULL, err, sizeof err), -1);
}

static void test_port(void) {
    CU_ASSERT_EQUAL(ddp_slurm_port("0"), 20000);
    CU_ASSERT_EQUAL(ddp_slurm_port("12345"), 32345);
    CU_ASSERT_EQUAL(ddp_slurm_port("19999"), 39999);
    CU_ASSERT_EQUAL(ddp_slurm_port("20000"), 20000);
    CU_ASSERT_EQUAL(ddp_slurm_port("98765432101234567890"), 20000 + 7890); /* longer than 64 bits */
    CU_ASSERT_EQUAL(ddp_slurm_port(""), -1);
    CU_ASSERT_EQUAL(ddp_slurm_port("12_3"), -1); /* a job array's "12_3" is SLURM_ARRAY_*; SLURM_JOB_ID is plain */
    CU_ASSERT_EQUAL(ddp_slurm_port(NULL), -1);
}

/* A test environment: NULL-terminated name/value pairs. */
static const char *const *g_env;
static const char *table_get(const char *name) {
    for (const char *const *p = g_env; p && p[0]; p += 2)
        if (!strcmp(p[0], name)) return p[1];
    return NULL;
}
static int decide(const char *const *env, int pmi_counts, char *msg, size_t len) {
    g_env = env;
    return ddp_slurm_mpi_check(table_get, pmi_counts, msg, len);
}

static void test_mpi_check(void) {
    char msg[512];
    static const char *const none[] = {NULL};
    CU_ASSERT_EQUAL(decide(none, 0, msg, sizeof msg), 0); /* not Slurm at all */
    /* srun --mpi=pmix */
    static const char *const pmix[] = {"SLURM_PROCID", "1", "SLURM_NTASKS", "2", "PMIX_RANK", "1",
                                       "PMIX_SERVER_URI41", "pmix-server.1;tcp4://127.0.0.1:1", NULL};
    CU_ASSERT_EQUAL(decide(pmix, 0, msg, sizeof msg), 0);
    static const char *const uri_only[] = {"SLURM_PROCID", "1", "SLURM_NTASKS", "2", "PMIX_SERVER_URI2", "x", NULL};
    CU_ASSERT_EQUAL(decide(uri_only, 0, msg, sizeof msg), 0);
    /* mpirun inside an allocation: SLURM_* inherited, OMPI_* and PMIX_* set by mpirun */
    static const char *const mpirun[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "1", "OMPI_COMM_WORLD_SIZE", "4",
                                         "OMPI_COMM_WORLD_RANK", "3", NULL};
    CU_ASSERT_EQUAL(decide(mpirun, 0, msg, sizeof msg), 0);
    /* srun --mpi=none, 2 tasks: the line */
    static const char *const bare[] = {"SLURM_PROCID", "1", "SLURM_NTASKS", "2", NULL};
    CU_ASSERT_EQUAL(decide(bare, 0, msg, sizeof msg), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "task 1 of 2"));
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "srun --mpi=pmix"));
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "mpirun"));
    CU_ASSERT_PTR_NULL(strchr(msg, '\n'));
    /* one task: runs (as a singleton) */
    static const char *const one[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "1", NULL};
    CU_ASSERT_EQUAL(decide(one, 0, msg, sizeof msg), 1);
    /* srun --mpi=pmi2: Open MPI cannot use it, MPICH can */
    static const char *const pmi2[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "2", "PMI_RANK", "0", "PMI_FD", "11",
                                       NULL};
    CU_ASSERT_EQUAL(decide(pmi2, 0, msg, sizeof msg), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "PMI-2"));
    CU_ASSERT_EQUAL(decide(pmi2, 1, msg, sizeof msg), 0);
    /* a batch script's own environment (sbatch -n 2, kiln run without srun) */
    static const char *const batch[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_JOB_ID", "7", NULL};
    CU_ASSERT_EQUAL(decide(batch, 0, msg, sizeof msg), -1);
    /* only one of the two: not a Slurm task as far as ranks go */
    static const char *const half[] = {"SLURM_NTASKS", "2", NULL};
    CU_ASSERT_EQUAL(decide(half, 0, msg, sizeof msg), 0);
}

static CU_TestInfo cases_ddp_slurm[] = {
    {"host lists as scontrol expands them", test_scontrol_forms},
    {"first and n-th host, bounds", test_first_host},
    {"malformed lists refused", test_malformed},
    {"rendezvous port from the job id", test_port},
    {"MPI check before MPI_Init", test_mpi_check},
    CU_TEST_INFO_NULL,
};

static void register_tests(void) {
    CU_SuiteInfo suites[] = {
        {.pName = "ddp_slurm", .pTests = cases_ddp_slurm},
        CU_SUITE_INFO_NULL,
    };
    CU_register_suites(suites);
}

#include "../cunit_main.h"
