/*
 * ddp_tcp.h — the one-time TCP rendezvous of a ddp job launched without MPI
 * (ddp_tcp.c): rank 0's blob (NCCL's unique id) to every rank, through
 * MASTER_ADDR:MASTER_PORT. Free of kiln and MPI types so tests link it alone.
 */
#ifndef KILN_PLUGIN_DDP_TCP_H
#define KILN_PLUGIN_DDP_TCP_H

#include <stddef.h>

/*
 * Rank 0 listens on port (all interfaces) until the other world-1 ranks have
 * connected to addr:port and checked in, then sends each of them blob (len
 * bytes); the others receive it into blob. timeout_s bounds the whole
 * exchange (0: no deadline). Returns 0, or -1 with one line in err (which
 * ranks are missing, a peer with another WORLD_SIZE, a port in use, ...).
 * world 1 returns 0 at once.
 */
int ddp_tcp_bcast(const char *addr, int port, int rank, int world, double timeout_s, void *blob, size_t len,
                  char *err, size_t errlen);

#endif /* KILN_PLUGIN_DDP_TCP_H */
