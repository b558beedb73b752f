/*
 * cpu_seq.h — CPU kernels for the ABI 1.4 sequence entries other than attention (embedding, layer norm, the fused cross-entropy, add). (Being written; see cpu_seq.c.)
 */
#ifndef KILN_KERNELS_CPU_SEQ_H
#define KILN_KERNELS_CPU_SEQ_H
#endif
