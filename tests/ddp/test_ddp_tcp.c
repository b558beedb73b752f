/*
 * test_ddp_tcp.c — the TCP rendezvous of a ddp launch without MPI
 * (plugins/ddp/ddp_tcp.c), with real sockets on the loopback interface and
 * one forked process per rank: rank 0's blob reaches every rank; a rank
 * started before rank 0 waits for it; strangers on the port are ignored;
 * every way a job can be mis-launched (a missing rank, a different
 * WORLD_SIZE, a duplicated rank, no rank 0 at all, the port taken) ends
 * within the deadline with a message saying so, on every rank involved.
 * And the attacks a hostile peer tries: rank 0 listens on MASTER_ADDR only (another
 * loopback address is refused); a hello claiming a rank that does not
 * exist, idle sockets (7 of them, also with no deadline), a peer with the
 * wrong secret or none, and a captured hello replayed on a new connection
 * are each dropped while the real ranks rendezvous; a fake rank 0 cannot
 * feed a blob to an authenticated rank; and the hello parser (the pure
 * function a fuzz target calls) judges every field.
 */
#define _POSIX_C_SOURCE 200809L
#include <CUnit/CUnit.h>
#include <arpa/inet.h>
#include <errno.h>
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

/* Built against the rendezvous before authentication (no DDP_TCP_VERSION,
 * no secret argument) the tests that do not need a secret still compile,
 * which is how they were shown to fail there. */
#ifdef DDP_TCP_VERSION
#define BCAST(addr, port, rank, world, t, secret, blob, len, err, errlen) \
    ddp_tcp_bcast(addr, port, rank, world, t, secret, blob, len, err, errlen)
#define HELLO_VERSION DDP_TCP_VERSION
#define HELLO_LEN DDP_TCP_HELLO_BYTES
#else
#define BCAST(addr, port, rank, world, t, secret, blob, len, err, errlen) \
    ((void)(secret), ddp_tcp_bcast(addr, port, rank, world, t, blob, len, err, errlen))
#define HELLO_VERSION 1u
#define HELLO_LEN 16
#endif

#define SECRET "test-secret-0123456789abcdef"
#define OTHER_SECRET "another-secret-0123456789abcdef"

#define BLOB 128

/* An IPv4 socket address: `host` (host byte order) and `port` (0: any). */
static struct sockaddr_in inet_addr_of(uint32_t host, int port) {
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(host);
    return a;
}

/* A port the kernel just handed out, closed again for the test to reuse. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = inet_addr_of(INADDR_LOOPBACK, 0);
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
static pid_t spawn_s(int port, int rank, int world, double timeout_s, long delay_ms, const char *secret, int want_ok,
                     const char *want_err) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    nap_ms(delay_ms);
    unsigned char blob[BLOB], want[BLOB];
    pattern(want, port);
    if (rank == 0) memcpy(blob, want, BLOB);
    else memset(blob, 0, BLOB);
    char err[512] = "";
    int rc = BCAST("127.0.0.1", port, rank, world, timeout_s, secret, blob, BLOB, err, sizeof err);
    int ok = want_ok ? rc == 0 && memcmp(blob, want, BLOB) == 0 : rc != 0 && strstr(err, want_err) != NULL;
    if (!ok) fprintf(stderr, "\n    rank %d of %d: rc %d, err '%s' (expected %s)\n", rank, world, rc, err,
                     want_ok ? "success" : want_err);
    _exit(ok ? 0 : 1);
}

/* A rank without a secret (the unauthenticated rendezvous). */
static pid_t spawn(int port, int rank, int world, double timeout_s, long delay_ms, int want_ok, const char *want_err) {
    return spawn_s(port, rank, world, timeout_s, delay_ms, NULL, want_ok, want_err);
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

/* One process of a rendezvous (spawn_s's arguments). */
typedef struct {
    int rank, world;
    double timeout_s;
    long delay_ms;
    const char *secret;
    int want_ok;
    const char *want_err;
} rank_run;

/* The processes of `runs` on one free port, started in order; each must
 * end as it expects within reap_s (reaped in the same order). */
static void run_world(const rank_run *runs, int n, double reap_s) {
    int port = free_port();
    pid_t pid[8];
    for (int i = 0; i < n; i++)
        pid[i] = spawn_s(port, runs[i].rank, runs[i].world, runs[i].timeout_s, runs[i].delay_ms, runs[i].secret,
                         runs[i].want_ok, runs[i].want_err);
    for (int i = 0; i < n; i++) CU_ASSERT_EQUAL(reap(pid[i], reap_s), 0);
}

static void test_blob_reaches_every_rank(void) {
    rank_run runs[4];
    for (int r = 0; r < 4; r++) runs[r] = (rank_run){r, 4, 20.0, 0, NULL, 1, NULL};
    run_world(runs, 4, 20.0);
}

static void test_peer_before_rank0(void) {
    /* rank 0 half a second late: rank 1 retries */
    const rank_run runs[] = {{1, 2, 20.0, 0, NULL, 1, NULL}, {0, 2, 20.0, 500, NULL, 1, NULL}};
    run_world(runs, 2, 20.0);
}

static void test_stranger_ignored(void) {
    int port = free_port();
    pid_t z = spawn(port, 0, 2, 20.0, 0, 1, NULL);
    nap_ms(200);
    /* something that is not kiln connects first and talks nonsense */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = inet_addr_of(INADDR_LOOPBACK, port);
    CU_ASSERT_EQUAL(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    CU_ASSERT_EQUAL(send(fd, "GET / HTTP/1.0\r\n\r\n", 18, 0), 18);
    pid_t one = spawn(port, 1, 2, 20.0, 100, 1, NULL);
    CU_ASSERT_EQUAL(reap(one, 20.0), 0);
    CU_ASSERT_EQUAL(reap(z, 20.0), 0);
    close(fd);
}

static void test_missing_rank(void) {
    const rank_run runs[] = {{0, 3, 2.0, 0, NULL, 0, "missing: 2"}, {1, 3, 6.0, 0, NULL, 0, "rank 0 gave up waiting"}};
    run_world(runs, 2, 10.0);
}

static void test_world_mismatch(void) {
    const rank_run runs[] = {{0, 2, 5.0, 0, NULL, 0, "rank 1 says WORLD_SIZE 3, rank 0 says 2"},
                             {1, 3, 5.0, 0, NULL, 0, "rank 0 refused: rank 1 says WORLD_SIZE 3"}};
    run_world(runs, 2, 10.0);
}

static void test_duplicate_rank(void) {
    /* one of the two rank 1s is told why, the other that rank 0 gave up */
    const rank_run runs[] = {{0, 3, 5.0, 0, NULL, 0, "two processes say they are rank 1"},
                             {1, 3, 5.0, 0, NULL, 0, ""},
                             {1, 3, 5.0, 200, NULL, 0, ""}};
    run_world(runs, 3, 10.0);
}

static void test_no_rank0(void) {
    const rank_run runs[] = {{1, 2, 0.5, 0, NULL, 0, "cannot connect to rank 0 at 127.0.0.1:"}};
    run_world(runs, 1, 10.0);
}

static void test_port_taken_and_args(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = inet_addr_of(INADDR_ANY, 0);
    socklen_t len = sizeof a;
    CU_ASSERT_FATAL(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0 &&
                    getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    int port = ntohs(a.sin_port);
    unsigned char blob[BLOB] = {0};
    char err[512] = "";
    CU_ASSERT_EQUAL(BCAST("127.0.0.1", port, 0, 2, 1.0, NULL, blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot listen on"));
    close(fd);
    /* world 1: nothing to exchange, no socket */
    CU_ASSERT_EQUAL(BCAST(NULL, 1, 0, 1, 1.0, NULL, blob, BLOB, err, sizeof err), 0);
    CU_ASSERT_EQUAL(BCAST("127.0.0.1", 0, 0, 2, 1.0, NULL, blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_EQUAL(BCAST("127.0.0.1", port, 2, 2, 1.0, NULL, blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_EQUAL(BCAST("", port, 1, 2, 1.0, NULL, blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_EQUAL(BCAST("no-such-host.invalid", port, 1, 2, 1.0, NULL, blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot resolve MASTER_ADDR 'no-such-host.invalid'"));
}

/* ------------------------------------------------- hostile peers at the rendezvous */

/* A TCP connection from the test to addr:port; -1 when refused. */
static int dial(const char *addr, int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, addr, &a.sin_addr);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* dial, retrying for 2 s while rank 0 starts listening */
static int dial_retry(int port) {
    for (int i = 0; i < 200; i++) {
        int fd = dial("127.0.0.1", port);
        if (fd >= 0) return fd;
        nap_ms(10);
    }
    return -1;
}

static void put32(unsigned char *p, uint32_t v) {
    v = htonl(v);
    memcpy(p, &v, 4);
}

/* Rank 0 listens on MASTER_ADDR's address only: on a loopback alias of
 * the same host (127.0.0.2) nothing answers, and the rendezvous still
 * works at MASTER_ADDR. */
static void test_bound_to_master_addr(void) {
    int port = free_port();
    pid_t z = spawn(port, 0, 2, 10.0, 0, 1, NULL);
    int fd = dial_retry(port);
    CU_ASSERT(fd >= 0); /* rank 0 is up at 127.0.0.1 */
    if (fd >= 0) close(fd);
    int other = dial("127.0.0.2", port);
    CU_ASSERT_EQUAL(other, -1);
    if (other >= 0) close(other);
    pid_t one = spawn(port, 1, 2, 10.0, 0, 1, NULL);
    CU_ASSERT_EQUAL(reap(one, 12.0), 0);
    CU_ASSERT_EQUAL(reap(z, 12.0), 0);
}

/* A well-formed hello of this protocol version claiming rank 7 of 2 (no
 * such rank), sent without waiting for anything: dropped, and the real
 * ranks carry on. */
static void test_bad_hello_ignored(void) {
    int port = free_port();
    pid_t z = spawn(port, 0, 2, 10.0, 0, 1, NULL);
    int fd = dial_retry(port);
    CU_ASSERT_FATAL(fd >= 0);
    unsigned char h[HELLO_LEN];
    memset(h, 0, sizeof h);
    memcpy(h, "KILN", 4);
    put32(h + 4, HELLO_VERSION);
    put32(h + 8, 7);
    put32(h + 12, 2);
    CU_ASSERT_EQUAL(send(fd, h, sizeof h, MSG_NOSIGNAL), (ssize_t)sizeof h);
    nap_ms(200);
    pid_t one = spawn(port, 1, 2, 10.0, 0, 1, NULL);
    CU_ASSERT_EQUAL(reap(one, 12.0), 0);
    CU_ASSERT_EQUAL(reap(z, 12.0), 0);
    close(fd);
}

/* Seven silent sockets connect before the real ranks; they must cost
 * nothing: with a 4 s deadline (served one after the other, each would
 * take 5 s) and with none at all (timeout_s = 0: waited out in turn, they
 * would hold the rendezvous 35 s). */
static void idle_sockets(double timeout_s) {
    int port = free_port();
    pid_t z = spawn(port, 0, 3, timeout_s, 0, 1, NULL);
    int idle[7];
    idle[0] = dial_retry(port);
    for (int i = 1; i < 7; i++) idle[i] = dial("127.0.0.1", port);
    for (int i = 0; i < 7; i++) CU_ASSERT(idle[i] >= 0);
    nap_ms(100);
    pid_t a = spawn(port, 1, 3, timeout_s, 0, 1, NULL);
    pid_t b = spawn(port, 2, 3, timeout_s, 0, 1, NULL);
    /* 6 s of slack for a loaded machine: still far below the 35 s seven
     * idle sockets waited out in turn would cost */
    CU_ASSERT_EQUAL(reap(a, 6.0), 0);
    CU_ASSERT_EQUAL(reap(b, 6.0), 0);
    CU_ASSERT_EQUAL(reap(z, 6.0), 0);
    for (int i = 0; i < 7; i++)
        if (idle[i] >= 0) close(idle[i]);
}
static void test_idle_sockets(void) { idle_sockets(4.0); }
static void test_idle_sockets_no_deadline(void) { idle_sockets(0.0); }

#ifdef DDP_TCP_VERSION
static void test_authenticated(void) {
    rank_run runs[4];
    for (int r = 0; r < 4; r++) runs[r] = (rank_run){r, 4, 20.0, 0, SECRET, 1, NULL};
    run_world(runs, 4, 20.0);
}

/* A process with another secret claims rank 1 first: it is refused (and
 * told why); the real rank 1 takes its place. */
static void test_wrong_secret(void) {
    int port = free_port();
    pid_t z = spawn_s(port, 0, 2, 10.0, 0, SECRET, 1, NULL);
    pid_t bad = spawn_s(port, 1, 2, 10.0, 0, OTHER_SECRET, 0,
                        "rank 0 refused (an unauthenticated reply): authentication failed");
    CU_ASSERT_EQUAL(reap(bad, 12.0), 0);
    pid_t one = spawn_s(port, 1, 2, 10.0, 0, SECRET, 1, NULL);
    CU_ASSERT_EQUAL(reap(one, 12.0), 0);
    CU_ASSERT_EQUAL(reap(z, 12.0), 0);
}

/* A secret on one side only: the rank that notices says so, rank 0 is
 * not disturbed (and a rank 0 without one is not trusted by a rank with one). */
static void test_secret_on_one_side(void) {
    int port = free_port();
    pid_t z = spawn_s(port, 0, 2, 10.0, 0, SECRET, 1, NULL);
    pid_t none = spawn_s(port, 1, 2, 10.0, 0, NULL, 0, "requires KILN_RDZV_SECRET and this rank has none");
    CU_ASSERT_EQUAL(reap(none, 12.0), 0);
    pid_t one = spawn_s(port, 1, 2, 10.0, 0, SECRET, 1, NULL);
    CU_ASSERT_EQUAL(reap(one, 12.0), 0);
    CU_ASSERT_EQUAL(reap(z, 12.0), 0);

    port = free_port();
    z = spawn_s(port, 0, 2, 2.0, 0, NULL, 0, "missing: 1");
    pid_t with = spawn_s(port, 1, 2, 10.0, 0, SECRET, 0, "this rank has KILN_RDZV_SECRET and rank 0 at 127.0.0.1:");
    CU_ASSERT_EQUAL(reap(with, 12.0), 0);
    CU_ASSERT_EQUAL(reap(z, 12.0), 0);
}

/* A hello made with the right secret for one connection's challenge (as
 * if captured on the wire) is refused on another connection: the
 * challenge differs. The real rank 1 then joins. */
static void test_replayed_hello(void) {
    int port = free_port();
    pid_t z = spawn_s(port, 0, 2, 10.0, 0, SECRET, 1, NULL);
    int a = dial_retry(port), b = dial("127.0.0.1", port);
    CU_ASSERT_FATAL(a >= 0 && b >= 0);
    unsigned char cha[DDP_TCP_CHALLENGE_BYTES], chb[DDP_TCP_CHALLENGE_BYTES];
    CU_ASSERT_EQUAL_FATAL(recv(a, cha, sizeof cha, MSG_WAITALL), (ssize_t)sizeof cha);
    CU_ASSERT_EQUAL_FATAL(recv(b, chb, sizeof chb, MSG_WAITALL), (ssize_t)sizeof chb);
    CU_ASSERT(memcmp(cha + 12, chb + 12, DDP_TCP_NONCE) != 0); /* a fresh nonce per connection */
    unsigned char nonce[DDP_TCP_NONCE] = {1, 2, 3}, hello[DDP_TCP_HELLO_BYTES];
    CU_ASSERT_EQUAL_FATAL(ddp_tcp_build_hello(hello, 1, 2, SECRET, cha + 12, nonce), 0);
    CU_ASSERT_EQUAL(send(b, hello, sizeof hello, MSG_NOSIGNAL), (ssize_t)sizeof hello);
    unsigned char reply[DDP_TCP_REPLY_BYTES + 256];
    ssize_t got = recv(b, reply, sizeof reply, MSG_WAITALL);
    CU_ASSERT(got >= DDP_TCP_REPLY_BYTES);
    if (got >= DDP_TCP_REPLY_BYTES) {
        uint32_t status;
        memcpy(&status, reply + 4, 4);
        CU_ASSERT_NOT_EQUAL(ntohl(status), 0);
        reply[got < (ssize_t)sizeof reply ? got : (ssize_t)sizeof reply - 1] = 0;
        CU_ASSERT_PTR_NOT_NULL(strstr((char *)reply + DDP_TCP_REPLY_BYTES, "authentication failed"));
    }
    close(b);
    pid_t one = spawn_s(port, 1, 2, 10.0, 0, SECRET, 1, NULL);
    CU_ASSERT_EQUAL(reap(one, 12.0), 0);
    CU_ASSERT_EQUAL(reap(z, 12.0), 0);
    close(a);
}

/* A fake rank 0 that does not know the secret: it sends a challenge that
 * asks for authentication, then a blob with a zero MAC. The peer must not
 * take the blob. */
static void test_fake_rank0(void) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = inet_addr_of(INADDR_LOOPBACK, 0);
    socklen_t alen = sizeof a;
    CU_ASSERT_FATAL(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 4) == 0 &&
                    getsockname(lfd, (struct sockaddr *)&a, &alen) == 0);
    int port = ntohs(a.sin_port);
    pid_t one = spawn_s(port, 1, 2, 5.0, 0, SECRET, 0, "failed authentication");
    int fd = accept(lfd, NULL, NULL);
    CU_ASSERT_FATAL(fd >= 0);
    unsigned char ch[DDP_TCP_CHALLENGE_BYTES] = "KILN";
    put32(ch + 4, DDP_TCP_VERSION);
    put32(ch + 8, DDP_TCP_FLAG_AUTH);
    CU_ASSERT_EQUAL(send(fd, ch, sizeof ch, MSG_NOSIGNAL), (ssize_t)sizeof ch);
    unsigned char hello[DDP_TCP_HELLO_BYTES];
    CU_ASSERT_EQUAL(recv(fd, hello, sizeof hello, MSG_WAITALL), (ssize_t)sizeof hello);
    unsigned char reply[DDP_TCP_REPLY_BYTES + BLOB];
    memset(reply, 0, sizeof reply);
    memcpy(reply, "KILN", 4);
    put32(reply + 8, BLOB);
    pattern(reply + DDP_TCP_REPLY_BYTES, port); /* even the right blob: unauthenticated, refused */
    CU_ASSERT_EQUAL(send(fd, reply, sizeof reply, MSG_NOSIGNAL), (ssize_t)sizeof reply);
    CU_ASSERT_EQUAL(reap(one, 8.0), 0);
    close(fd);
    close(lfd);
}

/* With a secret, a mis-launched job still ends at once on every rank: an
 * authenticated peer's WORLD_SIZE is believed. */
static void test_world_mismatch_authenticated(void) {
    const rank_run runs[] = {{0, 2, 30.0, 0, SECRET, 0, "rank 1 says WORLD_SIZE 3, rank 0 says 2"},
                             {1, 3, 30.0, 0, SECRET, 0, "rank 0 refused: rank 1 says WORLD_SIZE 3"}};
    run_world(runs, 2, 5.0); /* long before the 30 s deadline */
}

static void test_short_secret(void) {
    unsigned char blob[BLOB] = {0};
    char err[512] = "";
    CU_ASSERT_EQUAL(ddp_tcp_bcast("127.0.0.1", free_port(), 1, 2, 1.0, "short", blob, BLOB, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "KILN_RDZV_SECRET: expected at least 16 characters, found 5"));
}

/* The pure hello parser: every field judged, partial input asks for more. */
static void test_parse_hello(void) {
    unsigned char ch[DDP_TCP_NONCE] = {9}, nonce[DDP_TCP_NONCE] = {7}, h[DDP_TCP_HELLO_BYTES + 4];
    CU_ASSERT_EQUAL_FATAL(ddp_tcp_build_hello(h, 3, 4, SECRET, ch, nonce), 0);
    ddp_tcp_hello out;
    char err[200] = "";
    CU_ASSERT_EQUAL(ddp_tcp_parse_hello(h, DDP_TCP_HELLO_BYTES, &out, err, sizeof err), 0);
    CU_ASSERT(out.rank == 3 && out.world == 4 && out.flags == DDP_TCP_FLAG_AUTH && out.version == DDP_TCP_VERSION);
    CU_ASSERT(memcmp(out.nonce, nonce, DDP_TCP_NONCE) == 0);
    unsigned char mac[DDP_TCP_MAC];
    CU_ASSERT_EQUAL(ddp_tcp_hello_mac(SECRET, ch, h, mac), 0);
    CU_ASSERT(memcmp(mac, out.mac, DDP_TCP_MAC) == 0);
    CU_ASSERT_EQUAL(ddp_tcp_hello_mac(OTHER_SECRET, ch, h, mac), 0);
    CU_ASSERT(memcmp(mac, out.mac, DDP_TCP_MAC) != 0);
    for (size_t n = 0; n < DDP_TCP_HELLO_BYTES; n++) CU_ASSERT_EQUAL(ddp_tcp_parse_hello(h, n, &out, NULL, 0), 1);
    CU_ASSERT_EQUAL(ddp_tcp_parse_hello(NULL, 0, &out, NULL, 0), 1);
    CU_ASSERT_EQUAL(ddp_tcp_parse_hello(h, sizeof h, &out, err, sizeof err), 0); /* trailing bytes: not its business */
    CU_ASSERT_EQUAL(ddp_tcp_parse_hello((const unsigned char *)"G", 1, &out, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "expected the magic"));
    unsigned char b[DDP_TCP_HELLO_BYTES];
    memcpy(b, h, sizeof b);
    put32(b + 4, 1);
    CU_ASSERT_EQUAL(ddp_tcp_parse_hello(b, 8, &out, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "expected rendezvous version 2, found 1"));
    memcpy(b, h, sizeof b);
    put32(b + 16, 6);
    CU_ASSERT_EQUAL(ddp_tcp_parse_hello(b, sizeof b, &out, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "expected flags 0 or 1, found 0x6"));
    memcpy(b, h, sizeof b);
    put32(b + 8, 4);
    CU_ASSERT_EQUAL(ddp_tcp_parse_hello(b, sizeof b, &out, err, sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "found rank 4 of 4"));
    put32(b + 8, 0);
    put32(b + 12, 0);
    CU_ASSERT_EQUAL(ddp_tcp_parse_hello(b, sizeof b, &out, err, sizeof err), -1);
    /* without a secret the MAC field is zero and the flag clear */
    CU_ASSERT_EQUAL_FATAL(ddp_tcp_build_hello(h, 1, 2, NULL, ch, nonce), 0);
    CU_ASSERT_EQUAL(ddp_tcp_parse_hello(h, DDP_TCP_HELLO_BYTES, &out, err, sizeof err), 0);
    CU_ASSERT_EQUAL(out.flags, 0);
    static const unsigned char zero[DDP_TCP_MAC];
    CU_ASSERT(memcmp(out.mac, zero, DDP_TCP_MAC) == 0);
}
#endif

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
    CU_add_test(s, "bound_to_master_addr", test_bound_to_master_addr);
    CU_add_test(s, "bad_hello_ignored", test_bad_hello_ignored);
    CU_add_test(s, "idle_sockets", test_idle_sockets);
    CU_add_test(s, "idle_sockets_no_deadline", test_idle_sockets_no_deadline);
#ifdef DDP_TCP_VERSION
    CU_add_test(s, "authenticated", test_authenticated);
    CU_add_test(s, "wrong_secret", test_wrong_secret);
    CU_add_test(s, "secret_on_one_side", test_secret_on_one_side);
    CU_add_test(s, "replayed_hello", test_replayed_hello);
    CU_add_test(s, "fake_rank0", test_fake_rank0);
    CU_add_test(s, "world_mismatch_authenticated", test_world_mismatch_authenticated);
    CU_add_test(s, "short_secret", test_short_secret);
    CU_add_test(s, "parse_hello", test_parse_hello);
#endif
}

#include "../cunit_main.h"
