/*
 * host/cli_run.c — `kiln fit|validate|test RUN.cfg`: open the run file,
 * check it against the plugins it names, instantiate the stack, create the
 * run directory (fit), run the loops and print the summary. `fit --test` runs
 * the test loop on the final weights in the same process. `validate` and
 * `test` take --ckpt PATH|last to evaluate saved weights; `fit --ckpt`
 * resumes from an end-of-epoch checkpoint. Options are read by cli_parse
 * (cli.c), the parser every command shares.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "log.h"
#include "plugin_api.h"
#include "checkpoint.h"
#include "trainer.h"

static void on_signal(int sig) { ht_signal = sig; }

int cli_run(int argc, char **argv) {
    const char *verb = argv[0];
    const int fit = !strcmp(verb, "fit");
    cli_args a;
    int prc = cli_parse(verb, argc, argv, CLI_O_SET | CLI_O_CKPT | (fit ? CLI_O_WEIGHTS_ONLY | CLI_O_TEST : 0u), &a);
    if (prc) return prc;
    if (a.noperands != 1) {
        if (a.noperands) fprintf(stderr, "kiln: error: %s: unexpected argument '%s' (see kiln --help)\n", verb, a.operands[1]);
        else
            fprintf(stderr, "kiln: error: usage: kiln %s RUN.cfg [--set KEY=VALUE]...%s\n", verb,
                    fit ? " [--ckpt PATH|last [--weights-only]] [--test]" : " [--ckpt PATH|last]");
        cli_args_free(&a);
        return 2;
    }
    const char *path = a.operands[0], *ckpt = a.ckpt;
    char **sets = a.sets;
    const int nsets = a.nsets, weights_only = a.weights_only;
    int run_test = a.run_test;
    int stage = !strcmp(verb, "fit") ? KILN_STAGE_FIT : !strcmp(verb, "validate") ? KILN_STAGE_VALIDATE : KILN_STAGE_TEST;
    hc_config c;
    hl_loader L;
    hl_loader_init(&L, hs_host_base());
    ht_error err = {0}; /* the run's failure, printed once at the end */
    ht_trainer *t = calloc(1, sizeof *t);
    int opened = 0, interrupted = 0;
    int rc = cli_open_run(path, sets, nsets, &c, &L, &err);
    if (rc == KILN_OK) rc = cli_check_run(&c, &L, stage == KILN_STAGE_FIT, &err);
    if (rc == KILN_OK) { rc = ht_open(t, &c, &L, stage, &err); opened = rc == KILN_OK; }
    char ckpt_path[4096] = "";
    /* resolve "last" before this run's own directory exists */
    if (rc == KILN_OK && ckpt) {
        rc = ht_ckpt_resolve(t, ckpt, ckpt_path, sizeof ckpt_path, &err);
        if (rc == KILN_E_NOT_FOUND && stage == KILN_STAGE_FIT && !strcmp(ckpt, "last")) {
            /* Lightning: ckpt_path="last" without one warns and starts fresh */
            HLOG_WARN("%s; starting from scratch", err.msg);
            ckpt = NULL;
            rc = KILN_OK;
        }
    }
    if (rc == KILN_OK && stage == KILN_STAGE_FIT) rc = ht_make_run_dir(t, &err);
    if (rc == KILN_OK && ckpt)
        /* --weights-only: a new run from the checkpoint's weights (any
         * optimizer, precision or data; the module's names and shapes must
         * match); otherwise resume everything exactly */
        rc = stage == KILN_STAGE_FIT && !weights_only ? ht_ckpt_resume(t, ckpt_path, &err)
                                                      : ht_ckpt_load_weights(t, ckpt_path, &err);
    if (rc == KILN_OK && weights_only && !ckpt) {
        ht_errorf(&err, "fit --weights-only needs --ckpt PATH|last");
        rc = KILN_E_CONFIG;
    }
    if (rc == KILN_OK) {
        if (t->run_dir[0]) HLOG_INFO("run directory: %s", t->run_dir);
        if (stage == KILN_STAGE_FIT) {
            /* SIGINT/SIGTERM: finish the batch, checkpoint, stop (loops.c);
             * a second signal kills as usual */
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_signal;
            sa.sa_flags = (int)SA_RESETHAND;
            sigaction(SIGINT, &sa, NULL);
            sigaction(SIGTERM, &sa, NULL);
            rc = ht_fit(t, &err);
            if (rc == KILN_OK) ht_print_summary(t, "fit");
            if (rc == KILN_OK && t->interrupted) {
                /* always said, also under -q: the run did not finish */
                interrupted = t->interrupted;
                run_test = 0;
                fprintf(stderr,
                        "kiln: %s: stopped after epoch %lld, batch %lld (global step %lld); "
                        "%s/checkpoints/last.safetensors resumes it: kiln fit %s --ckpt last\n",
                        interrupted == SIGINT ? "SIGINT" : "SIGTERM", (long long)t->interrupted_epoch,
                        (long long)t->interrupted_batch, (long long)t->opt_step.total.completed, t->run_dir, path);
            }
            if (rc == KILN_OK && run_test) {
                rc = ht_evaluate(t, KILN_STAGE_TEST, &err);
                if (rc == KILN_OK) ht_print_summary(t, "test");
            }
        } else {
            rc = ht_evaluate(t, stage, &err);
            if (rc == KILN_OK) ht_print_summary(t, verb);
        }
    }
    if (rc != KILN_OK) fprintf(stderr, "kiln: error: %s\n", err.msg);
    if (opened) ht_close(t);
    free(t);
    hc_free(&c);
    hl_shutdown(&L);
    hl_loader_free(&L);
    cli_args_free(&a);
    if (rc == KILN_OK && interrupted) return 128 + interrupted; /* as a shell reports the signal */
    return rc == KILN_OK ? 0 : 1;
}
