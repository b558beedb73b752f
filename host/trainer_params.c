/*
 * host/trainer_params.c — the keys of a run file's `trainer` section, with
 * types, defaults and one line of help each. The same kiln_param machinery
 * that checks plugin sections checks this one, so a typo in the trainer gets
 * the same did-you-mean as a typo in a plugin. docs/config.md lists them.
 *
 * limit_*_batches and val_check_interval accept an int (a batch count) or a
 * float (a fraction of the epoch), as in Lightning; the trainer reads which
 * one was written from the run file itself.
 */
#include "config.h"

const kiln_param hc_trainer_params[] = {
    {"max_epochs", KILN_TYPE_INT, 0, KILN_V_INT(-1), "stop after this many epochs (-1: 1000 unless max_steps is set)"},
    {"max_steps", KILN_TYPE_INT, 0, KILN_V_INT(-1), "stop after this many optimizer steps (-1: no limit)"},
    {"min_epochs", KILN_TYPE_INT, 0, KILN_V_INT(0), "a stop request is held back until this many epochs ran"},
    {"min_steps", KILN_TYPE_INT, 0, KILN_V_INT(-1), "a stop request is held back until this many steps ran"},
    {"limit_train_batches", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1.0), "int: batches per epoch; float: fraction"},
    {"limit_val_batches", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1.0), "int: validation batches; float: fraction"},
    {"limit_test_batches", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1.0), "int: test batches; float: fraction"},
    {"val_check_interval", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(1.0),
     "float: validate every fraction of an epoch; int: every N training batches"},
    {"check_val_every_n_epoch", KILN_TYPE_INT, 0, KILN_V_INT(1), "validate every N epochs"},
    {"num_sanity_val_steps", KILN_TYPE_INT, 0, KILN_V_INT(2), "validation batches run before training (-1: all)"},
    {"accumulate_grad_batches", KILN_TYPE_INT, 0, KILN_V_INT(1), "batches whose gradients add up before a step"},
    {"seed", KILN_TYPE_INT, 0, KILN_V_INT(0), "seed of every random stream (init, shuffle)"},
    {"default_root_dir", KILN_TYPE_STRING, 0, KILN_V_STR("runs"), "runs are written to <this>/version_N/"},
    {"log_every_n_steps", KILN_TYPE_INT, 0, KILN_V_INT(50), "log training metrics every N optimizer steps"},
    {"threads", KILN_TYPE_INT, 0, KILN_V_INT(0), "CPU threads for kernels (0: all cores)"},
    {"gradient_clip_val", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0),
     "clip gradients before each optimizer step (0: off); the total norm is logged as grad_norm"},
    {"peak_flops", KILN_TYPE_FLOAT, 0, KILN_V_FLOAT(0.0),
     "the accelerator's peak FLOP/s for the summary's MFU (0: measure its float32 GEMM rate after fit)"},
    {"gradient_clip_algorithm", KILN_TYPE_STRING, 0, KILN_V_STR("norm"), "norm (total L2 norm) | value (each element)"},
    {NULL, 0, 0, KILN_V_NONE, NULL},
};
