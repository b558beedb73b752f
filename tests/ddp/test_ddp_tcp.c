/*
 * test_ddp_tcp.c — the TCP rendezvous of a ddp launch without MPI
 * (plugins/ddp/ddp_tcp.c), with real sockets on the loopback interface and
 * one forked process per rank: rank 0's blob reaches every rank; a rank
 * started before rank 0 waits for it; strangers on the port are ignored;
 * and every way a job can be mis-launched (a missing rank, a different
 * WORLD_SIZE, a duplicated rank, no rank 0 at all, the port taken) ends
 * within the deadline with a message saying so, on every rank involved.
 */
#define _POSIX_C_SOURCE 200809L
#include <CUnit/CUnit.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ddp_tcp.h"

#define BLOB 128

/* A port the kernel just handed out, closed again for the test to reuse. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) {
        if (fd >= 0) close(fd);
        return 29500;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Rank 0's blob: a pattern derived from the port, so each test's differs. */
static void pattern(unsigned char *b, int port) {
    for (int i = 0; i < BLOB; i++) b[i] = (unsigned char)(i * 31 + port);
}

/*
 * Forks a process that runs one rank and exits 0 when the exchange ended as
 * expected: with the blob (want_ok) or with an error containing want_err.
 * The child writes its error line to stderr when it did not expect it.
 */
static pid_t spawn(int port, int rank, int world, double timeout_s, long delay_ms, int want_ok, const char *want_err) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    nap_ms(delay_ms);
    unsigned char blob[BLOB], want[BLOB];
    pattern(want, port);
    if (rank == 0) memcpy(blob, want, BLOB);
    else memset(blob, 0, BLOB);
    char err[512] = "";
    int rc = ddp_tcp_bcast("127.0.0.1", port, rank, world, timeout_s, blob, BLOB, err, sizeof err);
    int ok = want_ok ? rc == 0 && memcmp(blob, want, BLOB) == 0 : rc != 0 && strstr(err, want_err) != NULL;
    if (!ok) fprintf(stderr, "\n    rank %d of %d: rc %d, err '%s' (expected %s)\n", rank, world, rc, err,
                     want_ok ? "success" : want_err);
    _exit(ok ? 0 : 1);
}

/* 0 when the child exited 0 within limit_s, else -1 (and it is killed). */
static int reap(pid_t pid, double limit_s) {
    for (double t = 0; t < limit_s; t += 0.01) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
        nap_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fprintf(stderr, "\n    a rank was still running after %.1f s\n", limit_s);
    return -1;
}

static void test_blob_reaches_every_rank(void) {
    int port = free_port();
    pid_t p[4];
    for (int r = 0; r < 4; r++) p[r] = spawn(port, r, 4, 20.0, 0, 1, NULL);
    for (int r = 0; r < 4; r++) CU_ASSERT_EQUAL(reap(p[r], 20.0), 0);
}

static void test_peer_before_rank0(void) {
    int port = free_port();
    pid_t a = spawn(port, 1, 2, 20.0, 0, 1, NULL);
    pid_t b = spawn(port, 0, 2, 20.0, 500, 1, NULL); /* rank 0 half a second late: rank 1 retries */
    CU_ASSERT_EQUAL(reap(a, 20.0), 0);
    CU_ASSERT_EQUAL(reap(b, 20.0), 0);
}

static void test_stranger_ignored(void) {
    int port = free_port();
    pid_t z = spawn(port, 0, 2, 20.0, 0, 1, NULL);
    nap_ms(200);
    /* something that is not kiln connects first and talks nonsense */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CU_ASSERT_EQUAL(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    CU_ASSERT_EQUAL(send(fd, "GET / HTTP/1.0\r\n\r\n", 18, 0), 18);
    pid_t one = spawn(port, 1, 2, 20.0, 100, 1, NULL);
    CU_ASSERT_EQUAL(reap(one, 20.0), 0);
    CU_ASSERT_EQUAL(reap(z, 20.0), 0);
    close(fd);
}

static void test_missing_rank(void) {
    int port = free_port();
    pid_t z = spawn(port, 0, 3, 2.0, 0, 0, "missing: 2");
    pid_t one = spawn(port, 1, 3, 6.0, 0, 0, "rank 0 gave up waiting");
    CU_ASSERT_EQUAL(reap(z, 10.0), 0);
    CU_ASSERT_EQUAL(reap(one, 10.0), 0);
}

static void test_world_mismatch(void) {
    int port = free_port();
    pid_t z = spawn(port, 0, 2, 5.0, 0, 0, "rank 1 says WORLD_SIZE 3, rank 0 says 2");
    pid_t one = spawn(port, 1, 3, 5.0, 0, 0, "rank 0 refused: rank 1 says WORLD_SIZE 3");
    CU_ASSERT_EQUAL(reap(z, 10.0), 0);
    CU_ASSERT_EQUAL(reap(one, 10.0), 0);
}

static void test_duplicate_rank(void) {
    int port = free_port();
    pid_t z = spawn(port, 0, 3, 5.0, 0, 0, "two processes say they are rank 1");
    pid_t a = spawn(port, 1, 3, 5.0, 0, 0, "");     /* one of the two is told why, the other that rank 0 gave up */
    pid_t b = spawn(port, 1, 3, 5.0, 200, 0, "");
    CU_ASSERT_EQUAL(reap(z, 10.0), 0);
    CU_ASSERT_EQUAL(reap(a, 10.0), 0);
    CU_ASSERT_EQUAL(reap(b, 10.0), 0);
}

static void test_no_rank0(void) {
    int port = free_port();
    pid_t one = spawn(port, 1, 2, 0.5, 0, 0, "cannot connect to rank 0 at 127.0.0.1:");
    CU_ASSERT_EQUAL(reap(one, 10.0), 0);
}

static void test_port_taken_and_args(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    CU_ASSERT_FATAL(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0 &&
                    getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    int port = ntohs(a.sin_port);
    unsigned char blob[BLOB] = {0};
    char err[512] = "";
    CU_ASSERT_EQUAL(ddp_tcp_bcast("127.0.0.1", port, 0, 2, 1.0, blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot listen on port"));
    close(fd);
    /* world 1: nothing to exchange, no socket */
    CU_ASSERT_EQUAL(ddp_tcp_bcast(NULL, 1, 0, 1, 1.0, blob, BLOB, err, sizeof err), 0);
    CU_ASSERT_EQUAL(ddp_tcp_bcast("127.0.0.1", 0, 0, 2, 1.0, blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_EQUAL(ddp_tcp_bcast("127.0.0.1", port, 2, 2, 1.0, blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_EQUAL(ddp_tcp_bcast("", port, 1, 2, 1.0, blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_EQUAL(ddp_tcp_bcast("no-such-host.invalid", port, 1, 2, 1.0, blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot resolve MASTER_ADDR 'no-such-host.invalid'"));
}

static void register_tests(void) {
    CU_pSuite s = CU_add_suite("ddp_tcp_rendezvous", NULL, NULL);
    CU_add_test(s, "blob_reaches_every_rank", test_blob_reaches_every_rank);
    CU_add_test(s, "peer_before_rank0", test_peer_before_rank0);
    CU_add_test(s, "stranger_ignored", test_stranger_ignored);
    CU_add_test(s, "missing_rank", test_missing_rank);
    CU_add_test(s, "world_mismatch", test_world_mismatch);
    CU_add_test(s, "duplicate_rank", test_duplicate_rank);
    CU_add_test(s, "no_rank0", test_no_rank0);
    CU_add_test(s, "port_taken_and_args", test_port_taken_and_args);
}

#include "../cunit_main.h"
