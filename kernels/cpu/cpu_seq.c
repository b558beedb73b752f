/*
 * cpu_seq.c — CPU kernels for the ABI 1.4 sequence entries other than attention (embedding, layer norm, the fused cross-entropy, add). (Being written.)
 */
#include "cpu_seq.h"
