/*
 * ddp_tcp.c — the rendezvous of a ddp job started without MPI (torchrun-style
 * variables alone: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
 * It does once what MPI_Bcast does in an MPI launch: rank 0 listens on
 * MASTER_ADDR:MASTER_PORT, every other rank connects there and says who it
 * is, and when all world-1 peers have checked in, rank 0 sends each of them
 * its blob (NCCL's unique id, which lets its holder join NCCL's bootstrap,
 * so it is handed only to authenticated ranks) — the exchange is also a
 * barrier. Every collective after it runs on NCCL; this is not a transport.
 *
 * Wire format, version 2 (integers in network order):
 *   challenge (0 -> peer, at accept): "KILN" u32 version u32 flags  nonce0[32]
 *   hello (peer -> 0): "KILN" u32 version u32 rank u32 world u32 flags
 *                      nonce1[32] mac[32]
 *   reply (0 -> peer): "KILN" u32 status u32 len mac[32], then len bytes
 * flags bit 0: the job has a secret (KILN_RDZV_SECRET). The hello's mac is
 * HMAC-SHA256(secret, "kiln-rdzv-hello" nonce0 hello[0..52)) and the reply's
 * HMAC-SHA256(secret, "kiln-rdzv-reply" nonce0 nonce1 reply[0..12) payload):
 * rank 0's fresh nonce makes a captured hello useless on another
 * connection, and the peer's makes a recorded reply useless to a fake rank
 * 0. Without a secret the macs are zero and anyone who reaches the port can
 * check in (the warning is the caller's). status 0 is success; otherwise
 * the reply carries a message instead of the blob, which the peer reports.
 *
 * Rank 0 serves every connection at once with poll(): a connection has 5 s
 * (or what is left of the deadline) to deliver a whole hello, and one that
 * is silent, malformed, or fails authentication is dropped without
 * affecting the others; at most 256 unauthenticated connections are held
 * (the oldest goes first), so a flood of idle sockets cannot exhaust rank
 * 0. Only an authenticated peer can end the rendezvous early (its WORLD_SIZE
 * differs, or two claim one rank: a mis-launched job); without a secret such
 * a hello is refused and remembered for the final message instead, since
 * anybody could have sent it. One deadline (timeout_s) covers the exchange:
 * peers started before rank 0 retry connecting every 100 ms, and a rank
 * that never appears fails the job with a message saying which ranks are
 * missing.
 *
 * No kiln types here, so the test links this file alone (tests/ddp).
 */
#define _GNU_SOURCE /* accept4 */
#include "ddp_tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#define TCP_MAGIC "KILN"
#define TCP_MAX_BLOB (1u << 20)
#define TCP_HELLO_S 5.0       /* a kiln peer sends its hello at once; a stranger gets this long */
#define TCP_MAX_PENDING 256   /* unauthenticated connections held at once */
#define TCP_MAX_LISTEN 8      /* addresses MASTER_ADDR may resolve to */
#define TCP_MAX_MSG 256       /* a refusal's text */

static const char tcp_hello_label[] = "kiln-rdzv-hello";
static const char tcp_reply_label[] = "kiln-rdzv-reply";

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
 * -1 with errno (ETIMEDOUT past the deadline, ECONNRESET when the peer
 * closed). Works on blocking and non-blocking sockets alike. */
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
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
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

static int tcp_has_secret(const char *secret) { return secret && *secret; }

/* HMAC-SHA256 keyed with secret over the concatenation of up to five
 * pieces (NULL pieces skipped). 0, or -1 when libcrypto fails. */
static int tcp_hmac(const char *secret, const void *const *piece, const size_t *plen, int npieces,
                    unsigned char mac[DDP_TCP_MAC]) {
    size_t total = 0;
    for (int i = 0; i < npieces; i++) total += piece[i] ? plen[i] : 0;
    unsigned char *buf = malloc(total ? total : 1);
    if (!buf) return -1;
    size_t o = 0;
    for (int i = 0; i < npieces; i++)
        if (piece[i] && plen[i]) {
            memcpy(buf + o, piece[i], plen[i]);
            o += plen[i];
        }
    unsigned int mlen = 0;
    unsigned char *r = HMAC(EVP_sha256(), secret, (int)strlen(secret), buf, total, mac, &mlen);
    OPENSSL_cleanse(buf, total);
    free(buf);
    return r && mlen == DDP_TCP_MAC ? 0 : -1;
}

int ddp_tcp_hello_mac(const char *secret, const unsigned char challenge[DDP_TCP_NONCE],
                      const unsigned char hello[DDP_TCP_HELLO_BYTES], unsigned char mac[DDP_TCP_MAC]) {
    const void *piece[3] = {tcp_hello_label, challenge, hello};
    const size_t plen[3] = {sizeof tcp_hello_label - 1, DDP_TCP_NONCE, DDP_TCP_HELLO_BYTES - DDP_TCP_MAC};
    return tcp_hmac(secret, piece, plen, 3, mac);
}

static int tcp_reply_mac(const char *secret, const unsigned char challenge[DDP_TCP_NONCE],
                         const unsigned char peer_nonce[DDP_TCP_NONCE], const unsigned char head[12],
                         const void *payload, size_t len, unsigned char mac[DDP_TCP_MAC]) {
    const void *piece[5] = {tcp_reply_label, challenge, peer_nonce, head, payload};
    const size_t plen[5] = {sizeof tcp_reply_label - 1, DDP_TCP_NONCE, DDP_TCP_NONCE, 12, len};
    return tcp_hmac(secret, piece, plen, 5, mac);
}

int ddp_tcp_parse_hello(const unsigned char *buf, size_t len, ddp_tcp_hello *out, char *err, size_t errlen) {
    if (!buf && len) {
        tcp_errf(err, errlen, "hello: no buffer");
        return -1;
    }
    if (len == 0) return 1;
    /* judge what has arrived so far, so a stranger is dropped at its first bytes */
    size_t m = len < 4 ? len : 4;
    if (memcmp(buf, TCP_MAGIC, m) != 0) {
        tcp_errf(err, errlen, "hello: expected the magic \"KILN\", found other bytes (not a kiln peer)");
        return -1;
    }
    if (len >= 8 && tcp_get32(buf + 4) != DDP_TCP_VERSION) {
        tcp_errf(err, errlen, "hello: expected rendezvous version %u, found %u (different kiln builds?)",
                 DDP_TCP_VERSION, tcp_get32(buf + 4));
        return -1;
    }
    if (len < DDP_TCP_HELLO_BYTES) return 1;
    ddp_tcp_hello h;
    h.version = tcp_get32(buf + 4);
    h.rank = tcp_get32(buf + 8);
    h.world = tcp_get32(buf + 12);
    h.flags = tcp_get32(buf + 16);
    memcpy(h.nonce, buf + 20, DDP_TCP_NONCE);
    memcpy(h.mac, buf + 20 + DDP_TCP_NONCE, DDP_TCP_MAC);
    if (h.flags & ~DDP_TCP_FLAG_AUTH) {
        tcp_errf(err, errlen, "hello: expected flags 0 or 1, found 0x%x", h.flags);
        return -1;
    }
    if (h.world == 0 || h.world > 0x7fffffffu || h.rank >= h.world) {
        tcp_errf(err, errlen, "hello: expected 0 <= rank < world size, found rank %u of %u", h.rank, h.world);
        return -1;
    }
    if (out) *out = h;
    return 0;
}

int ddp_tcp_build_hello(unsigned char hello[DDP_TCP_HELLO_BYTES], uint32_t rank, uint32_t world, const char *secret,
                        const unsigned char challenge[DDP_TCP_NONCE], const unsigned char nonce[DDP_TCP_NONCE]) {
    const int auth = tcp_has_secret(secret);
    memcpy(hello, TCP_MAGIC, 4);
    tcp_put32(hello + 4, DDP_TCP_VERSION);
    tcp_put32(hello + 8, rank);
    tcp_put32(hello + 12, world);
    tcp_put32(hello + 16, auth ? DDP_TCP_FLAG_AUTH : 0u);
    memcpy(hello + 20, nonce, DDP_TCP_NONCE);
    memset(hello + 20 + DDP_TCP_NONCE, 0, DDP_TCP_MAC);
    if (!auth) return 0;
    return ddp_tcp_hello_mac(secret, challenge, hello, hello + 20 + DDP_TCP_NONCE);
}

static int tcp_random(unsigned char *p, size_t n) { return RAND_bytes(p, (int)n) == 1 ? 0 : -1; }

/* ------------------------------------------------------------------ rank 0 */

/* One accepted connection, from accept to the reply. */
typedef struct tcp_conn {
    int fd;                                  /* -1: slot free */
    int rank;                                /* -1 until its hello is accepted */
    double hello_by;                         /* dropped when its hello is not complete by then */
    double born;                             /* accept time: the oldest pending goes first */
    unsigned char nonce[DDP_TCP_NONCE];      /* rank 0's challenge on this connection */
    unsigned char out[DDP_TCP_CHALLENGE_BYTES];
    size_t out_off;                          /* challenge bytes sent */
    unsigned char in[DDP_TCP_HELLO_BYTES];
    size_t in_len;                           /* hello bytes received */
    unsigned char peer_nonce[DDP_TCP_NONCE];
} tcp_conn;

/* Sends a reply: status 0 with the blob, or an error status with a
 * message; authenticated when the job has a secret. Blocking up to the
 * deadline (the reply is small, it fits the socket's buffer). */
static int tcp_reply(int fd, const char *secret, const tcp_conn *c, uint32_t status, const void *data, uint32_t len,
                     double deadline) {
    unsigned char h[DDP_TCP_REPLY_BYTES];
    memcpy(h, TCP_MAGIC, 4);
    tcp_put32(h + 4, status);
    tcp_put32(h + 8, len);
    memset(h + 12, 0, DDP_TCP_MAC);
    if (tcp_has_secret(secret) && tcp_reply_mac(secret, c->nonce, c->peer_nonce, h, data, len, h + 12)) {
        errno = EIO;
        return -1;
    }
    if (tcp_io(fd, h, sizeof h, 0, deadline)) return -1;
    return len ? tcp_io(fd, (void *)data, len, 0, deadline) : 0;
}

/* Best effort, never waiting: tells a refused peer why, then closes. The
 * peer's nonce is known only for a complete hello; the reply is then
 * authenticated like any other. */
static void tcp_refuse(tcp_conn *c, const char *secret, const char *msg) {
    if (c->fd < 0) return;
    int fl = fcntl(c->fd, F_GETFL);
    if (fl >= 0) (void)fcntl(c->fd, F_SETFL, fl | O_NONBLOCK);
    unsigned char h[DDP_TCP_REPLY_BYTES + TCP_MAX_MSG];
    uint32_t len = (uint32_t)strnlen(msg, TCP_MAX_MSG);
    memcpy(h, TCP_MAGIC, 4);
    tcp_put32(h + 4, 1);
    tcp_put32(h + 8, len);
    memset(h + 12, 0, DDP_TCP_MAC);
    if (tcp_has_secret(secret) && c->in_len == DDP_TCP_HELLO_BYTES)
        (void)tcp_reply_mac(secret, c->nonce, c->peer_nonce, h, msg, len, h + 12);
    memcpy(h + DDP_TCP_REPLY_BYTES, msg, len);
    (void)send(c->fd, h, DDP_TCP_REPLY_BYTES + len, MSG_NOSIGNAL | MSG_DONTWAIT);
    close(c->fd);
    c->fd = -1;
}

static void tcp_drop(tcp_conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* Listens on port at every address addr resolves to (MASTER_ADDR's
 * interfaces, not the wildcard: a job's rendezvous is not served to
 * networks the job does not use). Fills lfd[], returns their count, or -1
 * with err. */
static int tcp_listen(const char *addr, const char *port, int *lfd, char *err, size_t errlen) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int g = getaddrinfo(addr, port, &hints, &res);
    if (g) {
        tcp_errf(err, errlen, "cannot resolve MASTER_ADDR '%s' to listen on: %s", addr, gai_strerror(g));
        return -1;
    }
    int n = 0, saved = 0, bound_any = 0;
    char why[NI_MAXHOST + 160] = ""; /* the failing address and why */
    for (struct addrinfo *ai = res; ai && n < TCP_MAX_LISTEN; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128)) {
            saved = errno;
            char host[NI_MAXHOST] = "?";
            getnameinfo(ai->ai_addr, ai->ai_addrlen, host, sizeof host, NULL, 0, NI_NUMERICHOST);
            snprintf(why, sizeof why, "%s: %s", host, strerror(saved));
            close(fd);
            continue;
        }
        bound_any = 1;
        lfd[n++] = fd;
    }
    freeaddrinfo(res);
    if (!bound_any) {
        if (saved == EADDRNOTAVAIL)
            tcp_errf(err, errlen, "cannot listen on MASTER_ADDR '%s' port %s (%s): MASTER_ADDR must be an address "
                     "of rank 0's own host", addr, port, why);
        else
            tcp_errf(err, errlen, "cannot listen on MASTER_ADDR '%s' port %s (%s)", addr, port,
                     why[0] ? why : strerror(saved));
        return -1;
    }
    return n;
}

/* Accepts what is waiting on a listening socket into free slots; when none
 * is free, the oldest unauthenticated connection makes room. */
static void tcp_accept(int lfd, tcp_conn *conns, int nconns, const char *secret, double deadline) {
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) return; /* EAGAIN: nothing more; other errors: the peer gave up already */
        int slot = -1, oldest = -1;
        for (int i = 0; i < nconns; i++) {
            if (conns[i].fd < 0) {
                slot = i;
                break;
            }
            if (conns[i].rank < 0 && (oldest < 0 || conns[i].born < conns[oldest].born)) oldest = i;
        }
        if (slot < 0 && oldest >= 0) {
            tcp_drop(&conns[oldest]);
            slot = oldest;
        }
        if (slot < 0) { /* cannot happen: joined ranks leave TCP_MAX_PENDING slots */
            close(fd);
            continue;
        }
        tcp_conn *c = &conns[slot];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->rank = -1;
        c->born = tcp_now();
        c->hello_by = c->born + TCP_HELLO_S;
        if (deadline > 0 && deadline < c->hello_by) c->hello_by = deadline;
        if (tcp_random(c->nonce, sizeof c->nonce)) {
            tcp_drop(c);
            continue;
        }
        memcpy(c->out, TCP_MAGIC, 4);
        tcp_put32(c->out + 4, DDP_TCP_VERSION);
        tcp_put32(c->out + 8, tcp_has_secret(secret) ? DDP_TCP_FLAG_AUTH : 0u);
        memcpy(c->out + 12, c->nonce, DDP_TCP_NONCE);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
}

static int tcp_serve(const char *addr, const char *port, int world, const char *secret, const void *blob, size_t len,
                     double deadline, char *err, size_t errlen) {
    int lfd[TCP_MAX_LISTEN], nl = tcp_listen(addr, port, lfd, err, errlen);
    if (nl < 0) return -1;
    const int nconns = world - 1 + TCP_MAX_PENDING;
    const int auth = tcp_has_secret(secret);
    tcp_conn *conns = calloc((size_t)nconns, sizeof *conns);
    int *peer = malloc(sizeof(int) * (size_t)world); /* peer[r]: the slot of rank r, -1 until it checks in */
    struct pollfd *pf = calloc((size_t)(nconns + nl), sizeof *pf);
    if (!conns || !peer || !pf) {
        free(conns);
        free(peer);
        free(pf);
        for (int i = 0; i < nl; i++) close(lfd[i]);
        tcp_errf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < nconns; i++) conns[i].fd = -1;
    for (int r = 0; r < world; r++) peer[r] = -1;
    char refused[TCP_MAX_MSG + 64] = ""; /* the last unauthenticated refusal, for the final message */
    int joined = 1, rc = 0, dropped = 0;
    while (joined < world) {
        /* what to wait for: new connections, challenges to send, hellos,
         * and the end of joined peers (a rank that died frees its slot) */
        int np = 0;
        double wake = deadline;
        for (int i = 0; i < nl; i++) pf[np++] = (struct pollfd){lfd[i], POLLIN, 0};
        for (int i = 0; i < nconns; i++) {
            tcp_conn *c = &conns[i];
            if (c->fd < 0) continue;
            short ev = c->rank < 0 && c->out_off < sizeof c->out ? POLLOUT : POLLIN;
            pf[np++] = (struct pollfd){c->fd, ev, 0};
            if (c->rank < 0 && (wake <= 0 || c->hello_by < wake)) wake = c->hello_by;
        }
        int pr = poll(pf, (nfds_t)np, tcp_left_ms(wake));
        if (pr < 0 && errno != EINTR) {
            tcp_errf(err, errlen, "poll failed: %s", strerror(errno));
            rc = -1;
            break;
        }
        const double now = tcp_now();
        if (deadline > 0 && now >= deadline) {
            char missing[256] = "";
            size_t o = 0;
            int shown = 0;
            for (int r = 1; r < world && o < sizeof missing - 16; r++)
                if (peer[r] < 0 && shown++ < 16) o += (size_t)snprintf(missing + o, sizeof missing - o, " %d", r);
            tcp_errf(err, errlen, "%d of %d ranks checked in at %s:%s before the deadline; missing:%s%s%s%s", joined,
                     world, addr, port, missing, shown > 16 ? " ..." : "", refused[0] ? "; refused a peer: " : "",
                     refused);
            rc = -1;
            break;
        }
        if (pr <= 0) pr = 0;
        /* the poll array lists listeners first, then live connections in slot order */
        int k = nl;
        for (int i = 0; i < nconns && pr > 0; i++) { /* pr == 0: nothing happened, only deadlines */
            tcp_conn *c = &conns[i];
            if (c->fd < 0) continue;
            short re = pf[k++].revents;
            if (!re) continue;
            if (c->rank >= 0) { /* a joined peer never speaks again: data or EOF means it is gone */
                peer[c->rank] = -1;
                joined--;
                tcp_drop(c);
                continue;
            }
            if (c->out_off < sizeof c->out) {
                ssize_t s = send(c->fd, c->out + c->out_off, sizeof c->out - c->out_off, MSG_NOSIGNAL);
                if (s > 0) c->out_off += (size_t)s;
                else if (s < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) tcp_drop(c);
                continue;
            }
            ssize_t got = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, 0);
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                tcp_drop(c);
                continue;
            }
            if (got < 0) continue;
            c->in_len += (size_t)got;
            ddp_tcp_hello h;
            char why[200];
            int p = ddp_tcp_parse_hello(c->in, c->in_len, &h, why, sizeof why);
            if (p == 1) continue;
            if (p < 0) { /* not a kiln peer, or another version: tell it, carry on */
                tcp_refuse(c, secret, why);
                dropped++;
                continue;
            }
            memcpy(c->peer_nonce, h.nonce, DDP_TCP_NONCE);
            if (auth != ((h.flags & DDP_TCP_FLAG_AUTH) != 0)) {
                tcp_refuse(c, secret, auth ? "rank 0 has KILN_RDZV_SECRET and this rank has none: set the same "
                                             "secret on every rank"
                                           : "this rank has KILN_RDZV_SECRET and rank 0 has none: set the same "
                                             "secret on every rank");
                dropped++;
                continue;
            }
            if (auth) {
                unsigned char want[DDP_TCP_MAC];
                if (ddp_tcp_hello_mac(secret, c->nonce, c->in, want) ||
                    CRYPTO_memcmp(want, h.mac, DDP_TCP_MAC) != 0) {
                    tcp_refuse(c, secret, "authentication failed: this rank's KILN_RDZV_SECRET differs from rank 0's");
                    dropped++;
                    continue;
                }
            }
            char msg[200];
            msg[0] = 0;
            if (h.world != (uint32_t)world)
                snprintf(msg, sizeof msg, "rank %u says WORLD_SIZE %u, rank 0 says %d", h.rank, h.world, world);
            else if (h.rank == 0)
                snprintf(msg, sizeof msg, "a peer says it is rank 0; expected 1..%d", world - 1);
            else if (peer[h.rank] >= 0)
                snprintf(msg, sizeof msg, "two processes say they are rank %u", h.rank);
            if (msg[0] && auth) { /* a rank of this very job is mis-launched: end it now, on every rank */
                (void)tcp_reply(c->fd, secret, c, 1, msg, (uint32_t)strlen(msg), tcp_now() + 5.0);
                tcp_drop(c);
                tcp_errf(err, errlen, "%s", msg);
                rc = -1;
                break;
            }
            if (msg[0]) { /* anybody could have said so: refuse it, keep waiting for the real ranks */
                tcp_refuse(c, secret, msg);
                snprintf(refused, sizeof refused, "%s", msg);
                dropped++;
                continue;
            }
            c->rank = (int)h.rank;
            peer[h.rank] = i;
            joined++;
        }
        if (rc) break;
        /* listeners after the connections: a new one may take a slot freed above */
        for (int i = 0; i < nl; i++)
            if (pf[i].revents) tcp_accept(lfd[i], conns, nconns, secret, deadline);
        /* silent or slow strangers: dropped at their own deadline, nobody else waits for them */
        const double after = tcp_now();
        for (int i = 0; i < nconns; i++)
            if (conns[i].fd >= 0 && conns[i].rank < 0 && after >= conns[i].hello_by) {
                tcp_drop(&conns[i]);
                dropped++;
            }
    }
    for (int i = 0; i < nl; i++) close(lfd[i]);
    for (int r = 1; r < world; r++) {
        if (peer[r] < 0) continue;
        tcp_conn *c = &conns[peer[r]];
        if (rc == 0 && tcp_reply(c->fd, secret, c, 0, blob, (uint32_t)len, deadline)) {
            tcp_errf(err, errlen, "sending the id to rank %d failed: %s", r, strerror(errno));
            rc = -1;
        } else if (rc != 0) {
            const char *why = "rank 0 gave up waiting for the other ranks";
            (void)tcp_reply(c->fd, secret, c, 2, why, (uint32_t)strlen(why), tcp_now() + 1.0);
        }
        tcp_drop(c);
    }
    for (int i = 0; i < nconns; i++) tcp_drop(&conns[i]);
    (void)dropped;
    free(conns);
    free(peer);
    free(pf);
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
            if (fd < 0) {
                saved = errno;
                continue;
            }
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

/* One attempt: connect, read the challenge, send the hello, read the reply.
 * Returns 0, -1 (failed for good, err set) or 1 (rank 0 closed before
 * answering: it may have shed this connection under load; try again). */
static int tcp_join_once(const char *addr, const char *port, int rank, int world, const char *secret, void *blob,
                         size_t len, double deadline, char *err, size_t errlen) {
    int fd = tcp_connect(addr, port, deadline, err, errlen);
    if (fd < 0) return -1;
    unsigned char ch[DDP_TCP_CHALLENGE_BYTES];
    if (tcp_io(fd, ch, sizeof ch, 1, deadline)) {
        int e = errno;
        close(fd);
        if (e == ECONNRESET) return 1;
        tcp_errf(err, errlen, "no challenge from rank 0 at %s:%s: %s", addr, port,
                 e == ETIMEDOUT ? "deadline passed" : strerror(e));
        return -1;
    }
    if (memcmp(ch, TCP_MAGIC, 4) != 0) {
        tcp_errf(err, errlen, "%s:%s answered, but not as kiln's rank 0 (another service on MASTER_PORT?)", addr,
                 port);
        close(fd);
        return -1;
    }
    if (tcp_get32(ch + 4) != DDP_TCP_VERSION) {
        tcp_errf(err, errlen, "rank 0 at %s:%s speaks rendezvous version %u, this rank version %u (different kiln "
                 "builds?)", addr, port, tcp_get32(ch + 4), DDP_TCP_VERSION);
        close(fd);
        return -1;
    }
    const int auth0 = (tcp_get32(ch + 8) & DDP_TCP_FLAG_AUTH) != 0, auth = tcp_has_secret(secret);
    if (auth0 != auth) { /* a rank 0 without a secret is refused too: it could be an impostor */
        tcp_errf(err, errlen, auth ? "this rank has KILN_RDZV_SECRET and rank 0 at %s:%s has none: set the same "
                                     "secret on every rank"
                                   : "rank 0 at %s:%s requires KILN_RDZV_SECRET and this rank has none: set the "
                                     "same secret on every rank",
                 addr, port);
        close(fd);
        return -1;
    }
    const unsigned char *challenge = ch + 12;
    unsigned char nonce[DDP_TCP_NONCE], hello[DDP_TCP_HELLO_BYTES];
    if (tcp_random(nonce, sizeof nonce) ||
        ddp_tcp_build_hello(hello, (uint32_t)rank, (uint32_t)world, secret, challenge, nonce)) {
        tcp_errf(err, errlen, "libcrypto failed to make the hello");
        close(fd);
        return -1;
    }
    unsigned char r[DDP_TCP_REPLY_BYTES];
    if (tcp_io(fd, hello, sizeof hello, 0, deadline) || tcp_io(fd, r, sizeof r, 1, deadline)) {
        int e = errno;
        close(fd);
        if (e == ECONNRESET || e == EPIPE) return 1;
        tcp_errf(err, errlen, "no answer from rank 0 at %s:%s: %s", addr, port,
                 e == ETIMEDOUT ? "deadline passed (are all WORLD_SIZE ranks started?)" : strerror(e));
        return -1;
    }
    uint32_t status = tcp_get32(r + 4), n = tcp_get32(r + 8);
    if (memcmp(r, TCP_MAGIC, 4) != 0 || n > TCP_MAX_BLOB || (status != 0 && n > TCP_MAX_MSG)) {
        tcp_errf(err, errlen, "%s:%s answered, but not as kiln's rank 0 (another service on MASTER_PORT?)", addr,
                 port);
        close(fd);
        return -1;
    }
    unsigned char *payload = malloc(n ? n : 1);
    if (!payload) {
        tcp_errf(err, errlen, "out of memory");
        close(fd);
        return -1;
    }
    if (n && tcp_io(fd, payload, n, 1, deadline)) {
        tcp_errf(err, errlen, "reading rank 0's reply failed: %s", strerror(errno));
        free(payload);
        close(fd);
        return -1;
    }
    close(fd);
    int verified = 1;
    if (auth) {
        unsigned char want[DDP_TCP_MAC];
        verified = tcp_reply_mac(secret, challenge, nonce, r, payload, n, want) == 0 &&
                   CRYPTO_memcmp(want, r + 12, DDP_TCP_MAC) == 0;
    }
    int rc = -1;
    if (status != 0) {
        char msg[TCP_MAX_MSG + 1];
        size_t m = 0;
        for (; m < n; m++) msg[m] = payload[m] >= 32 && payload[m] < 127 ? (char)payload[m] : '?';
        msg[m] = 0;
        tcp_errf(err, errlen, "rank 0 refused%s: %s", verified ? "" : " (an unauthenticated reply)",
                 m ? msg : "(no reason given)");
    } else if (!verified) {
        tcp_errf(err, errlen, "the reply from %s:%s failed authentication: not this job's rank 0, or another "
                 "KILN_RDZV_SECRET", addr, port);
    } else if (n != len) {
        tcp_errf(err, errlen, "rank 0 sent %u bytes of id, expected %zu (different kiln builds?)", n, len);
    } else {
        memcpy(blob, payload, len);
        rc = 0;
    }
    OPENSSL_cleanse(payload, n);
    free(payload);
    return rc;
}

static int tcp_join(const char *addr, const char *port, int rank, int world, const char *secret, void *blob,
                    size_t len, double deadline, char *err, size_t errlen) {
    for (;;) {
        int rc = tcp_join_once(addr, port, rank, world, secret, blob, len, deadline, err, errlen);
        if (rc <= 0) return rc;
        if (deadline > 0 && tcp_now() >= deadline) {
            tcp_errf(err, errlen, "rank 0 at %s:%s kept closing the connection before answering", addr, port);
            return -1;
        }
        struct timespec nap = {0, 100000000};
        nanosleep(&nap, NULL);
    }
}

int ddp_tcp_bcast(const char *addr, int port, int rank, int world, double timeout_s, const char *secret, void *blob,
                  size_t len, char *err, size_t errlen) {
    if (world < 1 || rank < 0 || rank >= world || port < 1 || port > 65535 || !blob || len > TCP_MAX_BLOB ||
        (world > 1 && (!addr || !*addr))) {
        tcp_errf(err, errlen, "bad arguments: rank %d of %d, port %d, MASTER_ADDR '%s'", rank, world, port,
                 addr ? addr : "(none)");
        return -1;
    }
    if (world == 1) return 0;
    if (tcp_has_secret(secret) && strlen(secret) < DDP_TCP_MIN_SECRET) {
        tcp_errf(err, errlen, "KILN_RDZV_SECRET: expected at least %d characters, found %zu", DDP_TCP_MIN_SECRET,
                 strlen(secret));
        return -1;
    }
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    double deadline = timeout_s > 0 ? tcp_now() + timeout_s : 0;
    return rank == 0 ? tcp_serve(addr, ps, world, secret, blob, len, deadline, err, errlen)
                     : tcp_join(addr, ps, rank, world, secret, blob, len, deadline, err, errlen);
}
