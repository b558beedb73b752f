/*
 * ddp_slurm.h — what the "ddp" strategy reads from a Slurm launch
 * (ddp_slurm.c): the expansion of Slurm's compressed host lists
 * (SLURM_JOB_NODELIST, as `scontrol show hostnames` expands it), the
 * rendezvous address and port a launch without MPI derives from the job
 * (first host of the job, a port from the job id), and whether a process
 * that Slurm started can reach a PMIx server at all. Free of kiln and MPI
 * types, and every input is passed in (no getenv here), so the CUnit suite
 * links this file alone.
 */
#ifndef KILN_PLUGIN_DDP_SLURM_H
#define KILN_PLUGIN_DDP_SLURM_H

#include <stddef.h>

/* The rendezvous port of a Slurm job whose MASTER_PORT is unset:
 * DDP_SLURM_PORT_BASE + jobid % DDP_SLURM_PORT_SPAN, so jobs sharing a node
 * rarely collide and the port stays below the usual ephemeral range. */
#define DDP_SLURM_PORT_BASE 20000
#define DDP_SLURM_PORT_SPAN 20000

/* Hosts in a host list such as "node[01-04,07],login1,a[1-2]-b[3-4]"
 * (several bracket groups in one name expand as their product, in
 * scontrol's order). Returns the count, or -1 with one line in err when the
 * list is malformed (unbalanced brackets, a range going down, a bad number)
 * or expands to more than 1,000,000 hosts. */
long ddp_slurm_hostlist_count(const char *list, char *err, size_t errlen);

/* The n-th host (0-based) of list into out (outlen bytes, zero padding of a
 * range kept: "node[08-10]" gives node08, node09, node10). Returns 0, 1 when
 * n is past the end, or -1 with one line in err (malformed list, a name
 * longer than outlen - 1). */
int ddp_slurm_hostlist_nth(const char *list, long n, char *out, size_t outlen, char *err, size_t errlen);

/* DDP_SLURM_PORT_BASE + jobid % DDP_SLURM_PORT_SPAN for a decimal job id
 * (SLURM_JOB_ID); -1 when jobid is not a non-negative decimal number. */
int ddp_slurm_port(const char *jobid);

/* An environment lookup (getenv, or a test's table). */
typedef const char *(*ddp_slurm_getenv_fn)(const char *name);

/* Whether MPI can form the world of a process that Slurm started, before
 * MPI_Init is tried. Returns 0 when it can or when this is no Slurm task
 * (SLURM_PROCID or SLURM_NTASKS unset), a launcher that set up MPI is
 * around (OpenMPI's mpirun inside the allocation sets OMPI_COMM_WORLD_* and
 * PMIX_* next to the inherited SLURM_*), a PMIx server is reachable
 * (PMIX_RANK or a PMIX_SERVER_URI* variable), or, when pmi_counts, a PMI-1/2
 * one (PMI_RANK, PMI_FD: MPICH speaks it, Debian's Open MPI does not).
 * Returns 1 for a Slurm world of one task without any of them (MPI can
 * start as a singleton once it no longer sees a direct launch), and -1 for
 * a world of several tasks without them, with one line in msg saying what
 * to do instead. */
int ddp_slurm_mpi_check(ddp_slurm_getenv_fn get, int pmi_counts, char *msg, size_t msglen);

#endif /* KILN_PLUGIN_DDP_SLURM_H */
