/*
 * cpu_attn.c — CPU kernels for the ABI 1.4 causal self-attention entries. (Being written.)
 */
#include "cpu_attn.h"
