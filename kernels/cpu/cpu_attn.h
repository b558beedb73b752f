/*
 * cpu_attn.h — CPU kernels for the ABI 1.4 causal self-attention entries. (Being written; see cpu_attn.c.)
 */
#ifndef KILN_KERNELS_CPU_ATTN_H
#define KILN_KERNELS_CPU_ATTN_H
#endif
