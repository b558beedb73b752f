/*
 * ddp_tcp.c — the rendezvous of a ddp job started without MPI (torchrun-style
 * variables alone: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
 * It does once what MPI_Bcast does in an MPI launch: rank 0 listens on
 * MASTER_PORT, every other rank connects to MASTER_ADDR:MASTER_PORT and says
 * who it is, and when all world-1 peers have checked in, rank 0 sends each
 * of them its blob (NCCL's unique id) — so the exchange is also a barrier.
 * Every collective after it runs on NCCL; this is not a transport.
 *
 * Wire format (integers in network order):
 *   hello (peer -> 0):  "KILN" u32 version u32 rank u32 world
 *   reply (0 -> peer):  "KILN" u32 status  u32 len  then len bytes
 * status 0 is success; otherwise the reply carries a message instead of the
 * blob, which the peer reports. One deadline (timeout_s) covers the whole
 * exchange: peers started before rank 0 retry connecting every 100 ms, and
 * a rank that never appears fails the job with a message saying which ranks
 * are missing. A connection that does not speak this protocol (a port
 * scanner, a stale process) is closed and ignored.
 *
 * No kiln types here, so the test links this file alone (tests/ddp).
 */
#define _POSIX_C_SOURCE 200809L
#include "ddp_tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TCP_MAGIC "KILN"
#define TCP_VERSION 1u
#define TCP_MAX_BLOB (1u << 20)

static void tcp_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static double tcp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Milliseconds left until deadline for poll(): -1 (for ever) when there is none. */
static int tcp_left_ms(double deadline) {
    if (deadline <= 0) return -1;
    double left = deadline - tcp_now();
    if (left <= 0) return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

/* Moves exactly n bytes (recv when rd, else send) before the deadline; 0, or
 * -1 with errno (ETIMEDOUT past the deadline, ECONNRESET when the peer closed). */
static int tcp_io(int fd, void *buf, size_t n, int rd, double deadline) {
    unsigned char *p = buf;
    while (n) {
        struct pollfd pf = {fd, (short)(rd ? POLLIN : POLLOUT), 0};
        int pr = poll(&pf, 1, tcp_left_ms(deadline));
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return -1;
        if (pr == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        ssize_t k = rd ? recv(fd, p, n, 0) : send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) {
            errno = ECONNRESET;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void tcp_put32(unsigned char *p, uint32_t v) {
    v = htonl(v);
    memcpy(p, &v, 4);
}

static uint32_t tcp_get32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return ntohl(v);
}

/* Sends a reply: status 0 with the blob, or an error status with msg. */
static int tcp_reply(int fd, uint32_t status, const void *data, uint32_t len, double deadline) {
    unsigned char h[12];
    memcpy(h, TCP_MAGIC, 4);
    tcp_put32(h + 4, status);
    tcp_put32(h + 8, len);
    if (tcp_io(fd, h, sizeof h, 0, deadline)) return -1;
    return len ? tcp_io(fd, (void *)data, len, 0, deadline) : 0;
}

/* ------------------------------------------------------------------ rank 0 */

static int tcp_listen(const char *port, char *err, size_t errlen) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int g = getaddrinfo(NULL, port, &hints, &res);
    if (g) {
        tcp_errf(err, errlen, "cannot resolve the wildcard address for port %s: %s", port, gai_strerror(g));
        return -1;
    }
    int fd = -1, saved = 0;
    /* Prefer IPv6's wildcard: on Linux it accepts IPv4 peers too. */
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
            if ((pass == 0) != (ai->ai_family == AF_INET6)) continue;
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) { saved = errno; continue; }
            int one = 1, zero = 0;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128)) {
                saved = errno;
                close(fd);
                fd = -1;
            }
        }
    }
    freeaddrinfo(res);
    if (fd < 0) tcp_errf(err, errlen, "cannot listen on port %s: %s", port, strerror(saved));
    return fd;
}

static int tcp_serve(const char *port, int world, const void *blob, size_t len, double deadline, char *err,
                     size_t errlen) {
    int lfd = tcp_listen(port, err, errlen);
    if (lfd < 0) return -1;
    int *peer = malloc(sizeof(int) * (size_t)world); /* peer[r]: the connection of rank r, -1 until it checks in */
    if (!peer) {
        close(lfd);
        tcp_errf(err, errlen, "out of memory");
        return -1;
    }
    for (int r = 0; r < world; r++) peer[r] = -1;
    int joined = 1, rc = 0;
    while (joined < world) {
        struct pollfd pf = {lfd, POLLIN, 0};
        int pr = poll(&pf, 1, tcp_left_ms(deadline));
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) {
            char missing[256] = "";
            size_t o = 0;
            int shown = 0;
            for (int r = 1; r < world && o < sizeof missing - 16; r++)
                if (peer[r] < 0 && shown++ < 16) o += (size_t)snprintf(missing + o, sizeof missing - o, " %d", r);
            tcp_errf(err, errlen, "%d of %d ranks checked in on port %s before the deadline; missing:%s%s", joined,
                     world, port, missing, shown > 16 ? " ..." : "");
            rc = -1;
            break;
        }
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        unsigned char h[16];
        /* a hello arrives at once from a kiln peer: give a stranger 5 s at most */
        double hello_by = tcp_now() + 5.0;
        if (deadline > 0 && deadline < hello_by) hello_by = deadline;
        if (tcp_io(fd, h, sizeof h, 1, hello_by) || memcmp(h, TCP_MAGIC, 4) != 0) {
            close(fd); /* not a kiln peer: ignore it */
            continue;
        }
        uint32_t ver = tcp_get32(h + 4), r = tcp_get32(h + 8), w = tcp_get32(h + 12);
        char msg[200];
        msg[0] = 0;
        if (ver != TCP_VERSION)
            snprintf(msg, sizeof msg, "rank %u speaks rendezvous version %u, rank 0 version %u (different kiln "
                     "builds?)", r, ver, TCP_VERSION);
        else if (w != (uint32_t)world)
            snprintf(msg, sizeof msg, "rank %u says WORLD_SIZE %u, rank 0 says %d", r, w, world);
        else if (r == 0 || r >= (uint32_t)world)
            snprintf(msg, sizeof msg, "a peer says it is rank %u; expected 1..%d", r, world - 1);
        else if (peer[r] >= 0)
            snprintf(msg, sizeof msg, "two processes say they are rank %u", r);
        if (msg[0]) {
            (void)tcp_reply(fd, 1, msg, (uint32_t)strlen(msg), tcp_now() + 5.0);
            close(fd);
            tcp_errf(err, errlen, "%s", msg);
            rc = -1;
            break;
        }
        peer[r] = fd;
        joined++;
    }
    for (int r = 1; r < world; r++) {
        if (peer[r] < 0) continue;
        if (rc == 0 && tcp_reply(peer[r], 0, blob, (uint32_t)len, deadline)) {
            tcp_errf(err, errlen, "sending the id to rank %d failed: %s", r, strerror(errno));
            rc = -1;
        } else if (rc != 0) {
            const char *why = "rank 0 gave up waiting for the other ranks";
            (void)tcp_reply(peer[r], 2, why, (uint32_t)strlen(why), tcp_now() + 1.0);
        }
        close(peer[r]);
    }
    free(peer);
    close(lfd);
    return rc;
}

/* ----------------------------------------------------------------- rank > 0 */

/* Connects to addr:port, retrying refused or unreachable attempts every
 * 100 ms until the deadline (rank 0 may not listen yet). */
static int tcp_connect(const char *addr, const char *port, double deadline, char *err, size_t errlen) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(addr, port, &hints, &res);
    if (g) {
        tcp_errf(err, errlen, "cannot resolve MASTER_ADDR '%s': %s", addr, gai_strerror(g));
        return -1;
    }
    int saved = 0;
    for (;;) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) { saved = errno; continue; }
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                freeaddrinfo(res);
                return fd;
            }
            saved = errno;
            close(fd);
        }
        if (deadline > 0 && tcp_now() >= deadline) break;
        struct timespec nap = {0, 100000000};
        nanosleep(&nap, NULL);
    }
    freeaddrinfo(res);
    tcp_errf(err, errlen, "cannot connect to rank 0 at %s:%s before the deadline: %s", addr, port, strerror(saved));
    return -1;
}

static int tcp_join(const char *addr, const char *port, int rank, int world, void *blob, size_t len,
                    double deadline, char *err, size_t errlen) {
    int fd = tcp_connect(addr, port, deadline, err, errlen);
    if (fd < 0) return -1;
    unsigned char h[16];
    memcpy(h, TCP_MAGIC, 4);
    tcp_put32(h + 4, TCP_VERSION);
    tcp_put32(h + 8, (uint32_t)rank);
    tcp_put32(h + 12, (uint32_t)world);
    unsigned char r[12];
    if (tcp_io(fd, h, sizeof h, 0, deadline) || tcp_io(fd, r, sizeof r, 1, deadline)) {
        tcp_errf(err, errlen, "no answer from rank 0 at %s:%s: %s", addr, port,
                 errno == ETIMEDOUT ? "deadline passed (are all WORLD_SIZE ranks started?)" : strerror(errno));
        close(fd);
        return -1;
    }
    uint32_t status = tcp_get32(r + 4), n = tcp_get32(r + 8);
    if (memcmp(r, TCP_MAGIC, 4) != 0 || n > TCP_MAX_BLOB) {
        tcp_errf(err, errlen, "%s:%s answered, but not as kiln's rank 0 (another service on MASTER_PORT?)", addr,
                 port);
        close(fd);
        return -1;
    }
    if (status != 0) {
        char msg[256];
        size_t m = n < sizeof msg - 1 ? n : sizeof msg - 1;
        if (tcp_io(fd, msg, m, 1, deadline)) m = 0;
        msg[m] = 0;
        tcp_errf(err, errlen, "rank 0 refused: %s", m ? msg : "(no reason given)");
        close(fd);
        return -1;
    }
    if (n != len) {
        tcp_errf(err, errlen, "rank 0 sent %u bytes of id, expected %zu (different kiln builds?)", n, len);
        close(fd);
        return -1;
    }
    int rc = tcp_io(fd, blob, len, 1, deadline);
    if (rc) tcp_errf(err, errlen, "reading the id from rank 0 failed: %s", strerror(errno));
    close(fd);
    return rc;
}

int ddp_tcp_bcast(const char *addr, int port, int rank, int world, double timeout_s, void *blob, size_t len,
                  char *err, size_t errlen) {
    if (world < 1 || rank < 0 || rank >= world || port < 1 || port > 65535 || !blob || len > TCP_MAX_BLOB ||
        (rank > 0 && (!addr || !*addr))) {
        tcp_errf(err, errlen, "bad arguments: rank %d of %d, port %d", rank, world, port);
        return -1;
    }
    if (world == 1) return 0;
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    double deadline = timeout_s > 0 ? tcp_now() + timeout_s : 0;
    return rank == 0 ? tcp_serve(ps, world, blob, len, deadline, err, errlen)
                     : tcp_join(addr, ps, rank, world, blob, len, deadline, err, errlen);
}
