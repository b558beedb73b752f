/*
 * tests/fuzz/fuzz_ddp_hello.c — fuzz target for the hello of the ddp TCP
 * rendezvous (plugins/ddp/ddp_tcp.c, ddp_tcp_parse_hello): the first bytes
 * rank 0 reads from anyone who connects to MASTER_ADDR:MASTER_PORT, so the
 * most exposed parser kiln has. The input is what a peer sends. Rank 0
 * calls the parser each time bytes arrive, on the prefix received so far,
 * so the target does too, for every prefix length, and checks what the
 * protocol needs from it:
 *   - a prefix is "need more" (1) until it is judged; once refused (-1) a
 *     longer prefix stays refused, once accepted (0, at DDP_TCP_HELLO_BYTES)
 *     it stays accepted: a stranger is dropped at its first bad bytes and a
 *     peer is never judged twice differently;
 *   - an accepted hello has flags 0 or 1, 0 < world < 2^31, rank < world,
 *     and the fields the bytes hold (network order);
 *   - it survives the round trip through ddp_tcp_build_hello, and its MAC
 *     under a secret is what ddp_tcp_build_hello writes.
 * KILN_FUZZ_DDP_SEEDS=DIR (make_seeds.py) writes hellos as kiln builds them.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_tcp.h"
#include "fuzz_util.h"

static void fz_check(int ok, const char *what, const char *err) {
    if (!ok) {
        fprintf(stderr, "fuzz_ddp_hello: invariant broken: %s (%s)\n", what, err ? err : "");
        abort();
    }
}

static uint32_t fz_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static const char fz_secret[] = "fuzz-secret-0123456789";

static void fz_write_seeds(const char *dir) {
    static const struct { uint32_t rank, world; int auth; } v[] = {{1, 2, 0}, {1, 2, 1}, {3, 8, 1}, {0, 1, 0}};
    unsigned char ch[DDP_TCP_NONCE], nonce[DDP_TCP_NONCE], hello[DDP_TCP_HELLO_BYTES];
    for (int i = 0; i < DDP_TCP_NONCE; i++) ch[i] = (unsigned char)(i * 7), nonce[i] = (unsigned char)(255 - i);
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        if (ddp_tcp_build_hello(hello, v[i].rank, v[i].world, v[i].auth ? fz_secret : NULL, ch, nonce)) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/hello-rank%u-of%u%s", dir, v[i].rank, v[i].world, v[i].auth ? "-auth" : "");
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(hello, 1, sizeof hello, f);
            fclose(f);
        }
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *d = getenv("KILN_FUZZ_DDP_SEEDS");
    if (d && d[0]) fz_write_seeds(d);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    int last = 1;
    ddp_tcp_hello h;
    size_t n = size < 4 * DDP_TCP_HELLO_BYTES ? size : 4 * DDP_TCP_HELLO_BYTES;
    for (size_t len = 0; len <= n; len++) {
        /* an exact-size copy: a read past the prefix is an ASan report */
        uint8_t *p = malloc(len ? len : 1);
        if (!p) return 0;
        memcpy(p, data, len);
        err[0] = 0;
        memset(&h, 0xA5, sizeof h);
        int r = ddp_tcp_parse_hello(p, len, &h, err, sizeof err);
        free(p);
        fz_check(r == 1 || r == 0 || r == -1, "a status outside -1, 0, 1", err);
        if (last == -1) fz_check(r == -1, "a refused prefix accepted once longer", err);
        if (last == 0) fz_check(r == 0, "an accepted hello refused once longer", err);
        if (r == 1) fz_check(len < DDP_TCP_HELLO_BYTES, "a whole hello still needs more", NULL);
        if (r == -1) fz_check(err[0] && !strchr(err, '\n'), "a refusal without one line", err);
        if (r == 0) {
            fz_check(len >= DDP_TCP_HELLO_BYTES, "accepted before the whole hello arrived", NULL);
            fz_check(h.flags <= DDP_TCP_FLAG_AUTH && h.world > 0 && h.world <= 0x7fffffffu && h.rank < h.world,
                     "accepted fields out of range", NULL);
            fz_check(h.version == DDP_TCP_VERSION && h.rank == fz_be32(data + 8) && h.world == fz_be32(data + 12) &&
                         h.flags == fz_be32(data + 16) && !memcmp(h.nonce, data + 20, DDP_TCP_NONCE) &&
                         !memcmp(h.mac, data + 20 + DDP_TCP_NONCE, DDP_TCP_MAC),
                     "the fields are not the bytes'", NULL);
        }
        last = r;
    }
    if (last != 0) return 0;
    /* round trip: rebuild the hello from its fields, with and without a
     * secret; the challenge is taken from the input's tail when there is one */
    unsigned char ch[DDP_TCP_NONCE] = {0}, out[DDP_TCP_HELLO_BYTES], mac[DDP_TCP_MAC];
    if (size >= DDP_TCP_HELLO_BYTES + DDP_TCP_NONCE) memcpy(ch, data + DDP_TCP_HELLO_BYTES, DDP_TCP_NONCE);
    int auth = h.flags & DDP_TCP_FLAG_AUTH;
    fz_check(ddp_tcp_build_hello(out, h.rank, h.world, auth ? fz_secret : NULL, ch, h.nonce) == 0, "build failed",
             NULL);
    ddp_tcp_hello h2;
    fz_check(ddp_tcp_parse_hello(out, sizeof out, &h2, err, sizeof err) == 0, "a built hello is refused", err);
    fz_check(h2.rank == h.rank && h2.world == h.world && h2.flags == h.flags && !memcmp(h2.nonce, h.nonce, sizeof h.nonce),
             "the round trip changed a field", NULL);
    if (auth) {
        fz_check(ddp_tcp_hello_mac(fz_secret, ch, out, mac) == 0, "hello_mac failed", NULL);
        fz_check(!memcmp(mac, out + 20 + DDP_TCP_NONCE, DDP_TCP_MAC), "build and hello_mac disagree", NULL);
        /* the MAC covers the fields: another rank must give another MAC */
        out[11] ^= 1;
        unsigned char mac2[DDP_TCP_MAC];
        fz_check(ddp_tcp_hello_mac(fz_secret, ch, out, mac2) == 0 && memcmp(mac, mac2, DDP_TCP_MAC),
                 "the MAC does not cover the rank", NULL);
    }
    return 0;
}
