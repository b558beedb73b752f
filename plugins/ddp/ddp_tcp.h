/*
 * ddp_tcp.h — the one-time TCP rendezvous of a ddp job launched without MPI
 * (ddp_tcp.c): rank 0's blob (NCCL's unique id) to every rank, through
 * MASTER_ADDR:MASTER_PORT, peers authenticated with a per-job secret. Free
 * of kiln and MPI types so tests (and a fuzz target of the hello parser)
 * link it alone.
 */
#ifndef KILN_PLUGIN_DDP_TCP_H
#define KILN_PLUGIN_DDP_TCP_H

#include <stddef.h>
#include <stdint.h>

/* Wire sizes of protocol version 2 (ddp_tcp.c describes the fields). */
#define DDP_TCP_VERSION 2u
#define DDP_TCP_NONCE 32
#define DDP_TCP_MAC 32
#define DDP_TCP_CHALLENGE_BYTES (12 + DDP_TCP_NONCE)                /* 0 -> peer, on accept */
#define DDP_TCP_HELLO_BYTES (20 + DDP_TCP_NONCE + DDP_TCP_MAC)      /* peer -> 0 */
#define DDP_TCP_REPLY_BYTES (12 + DDP_TCP_MAC)                      /* 0 -> peer, then the payload */
#define DDP_TCP_FLAG_AUTH 1u                                        /* HMAC-SHA256 with the job's secret */
/* A secret shorter than this is refused: it could be guessed offline from
 * one captured hello. */
#define DDP_TCP_MIN_SECRET 16

/* A hello's fields, as ddp_tcp_parse_hello reads them. */
typedef struct ddp_tcp_hello {
    uint32_t version, rank, world, flags;
    unsigned char nonce[DDP_TCP_NONCE]; /* the peer's, for the reply's MAC */
    unsigned char mac[DDP_TCP_MAC];     /* zero when flags lacks DDP_TCP_FLAG_AUTH */
} ddp_tcp_hello;

/*
 * The hello parser, pure (no I/O, no state: a fuzz target may call it with
 * any bytes): buf holds the first len bytes a peer sent. Returns 1 when
 * they are a valid beginning of a hello but more are needed, 0 when
 * len >= DDP_TCP_HELLO_BYTES and the first DDP_TCP_HELLO_BYTES are a
 * well-formed hello (*out filled; rank and world are not checked against a
 * job, nor the MAC: ddp_tcp_hello_mac does that), and -1 with one line in
 * err (when err is not NULL) when they cannot be one: another magic,
 * another protocol version, unknown flags, a world size of 0 or rank >=
 * world.
 */
int ddp_tcp_parse_hello(const unsigned char *buf, size_t len, ddp_tcp_hello *out, char *err, size_t errlen);

/*
 * The MAC a hello must carry: HMAC-SHA256 keyed with secret over a label,
 * rank 0's challenge nonce and the hello's first 52 bytes (everything but
 * the MAC), into mac. Returns 0, or -1 when libcrypto fails.
 */
int ddp_tcp_hello_mac(const char *secret, const unsigned char challenge[DDP_TCP_NONCE],
                      const unsigned char hello[DDP_TCP_HELLO_BYTES], unsigned char mac[DDP_TCP_MAC]);

/*
 * Writes a complete hello for rank of world into hello (what a peer sends
 * once it has read rank 0's challenge nonce): the peer nonce from nonce,
 * authenticated when secret is not NULL or empty. Returns 0 or -1
 * (libcrypto failed). The tests use it to forge and replay hellos.
 */
int ddp_tcp_build_hello(unsigned char hello[DDP_TCP_HELLO_BYTES], uint32_t rank, uint32_t world, const char *secret,
                        const unsigned char challenge[DDP_TCP_NONCE], const unsigned char nonce[DDP_TCP_NONCE]);

/*
 * Rank 0 listens on port at addr's addresses only (MASTER_ADDR: the
 * interface the other ranks reach it on) until the other world-1 ranks
 * have connected to addr:port and checked in, then sends each of them blob
 * (len bytes); the others receive it into blob. Connections are served
 * concurrently: a peer whose hello is not complete within 5 s (or the
 * deadline), malformed, or not authenticated is dropped, and the rest carry
 * on. secret (KILN_RDZV_SECRET; NULL or "" for none) authenticates both
 * ways with HMAC-SHA256 over rank 0's per-connection nonce, so a captured
 * hello cannot be replayed and a stranger on the port cannot get the blob
 * or feed one; every rank must have the same secret, or none. timeout_s
 * bounds the whole exchange (0: no deadline). Returns 0, or -1 with one
 * line in err (which ranks are missing, a peer with another WORLD_SIZE, a
 * port in use, a secret mismatch, ...). world 1 returns 0 at once.
 */
int ddp_tcp_bcast(const char *addr, int port, int rank, int world, double timeout_s, const char *secret, void *blob,
                  size_t len, char *err, size_t errlen);

#endif /* KILN_PLUGIN_DDP_TCP_H */
