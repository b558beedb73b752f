/*
 * tests/mockhost/mockhost.h — a stand-in host for testing one plugin in
 * isolation: a complete kiln_host_services table whose state the test sets
 * and inspects (config, accelerator, trainer state, registered parameters,
 * logged values, stop requests, the last error), and a loader that dlopen()s
 * a built plugin file and returns one of its descriptors. Single-threaded,
 * one context; not for the real host's tests.
 */
#ifndef KILN_MOCKHOST_H
#define KILN_MOCKHOST_H

#include "kiln/kiln.h"

typedef struct mh_logged {
    char name[64];
    double value;
    uint32_t flags;
    double weight;
} mh_logged;

#define MH_MAX_LOGGED 4096
#define MH_MAX_PARAMS 256

typedef struct mh_state {
    const kiln_kv *config;          /* what config_get reads                 */
    kiln_instance *acc;             /* what accelerator() returns            */
    const kiln_kernels *kernels;
    kiln_trainer_state trainer;     /* what trainer_state() returns          */
    kiln_parameter params[MH_MAX_PARAMS];
    kiln_parameter *param_ptrs[MH_MAX_PARAMS];
    uint32_t nparams;
    mh_logged logged[MH_MAX_LOGGED];
    int nlogged;
    int stop_requested;
    char last_error[1024];
    int32_t last_error_code;
    uint64_t seed;
    /* 1.2 manual-optimisation services: what the fakes forward to (unset:
     * KILN_E_UNSUPPORTED); toggle gets on = 1 / 0 for toggle / untoggle */
    uint32_t n_optimizers;
    int32_t (*manual_backward)(double loss);
    int32_t (*optimizer_step)(uint32_t index, const struct kiln_closure *closure, int32_t *skipped);
    int32_t (*optimizer_zero_grad)(uint32_t index);
    int32_t (*toggle)(uint32_t index, int on);
    int32_t (*save_checkpoint)(const char *path); /* 1.2: what save_checkpoint forwards to */
    int32_t (*predict)(const kiln_batch *batch, kiln_tensor *out); /* 1.4: what predict forwards to */
} mh_state;

extern mh_state mh;

void mh_reset(void);                         /* zero everything, free params */
const kiln_host_services *mh_services(void);
kiln_host_ctx *mh_ctx(void);
/* Allocate data/grad (zeroed, 64-byte aligned) for every registered param. */
int mh_alloc_params(void);
/* dlopen `path`, run its init, return the descriptor of (kind, name). */
const kiln_plugin_desc *mh_load(const char *path, uint32_t kind, const char *name);
/* Last value logged under `name` (NAN if none). */
double mh_last_logged(const char *name);

#endif
