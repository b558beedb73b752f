/*
 * host/cli.h — the `kiln` subcommands. Each takes the arguments after its own
 * name and returns the process exit status; only main() exits.
 */
#ifndef KILN_HOST_CLI_H
#define KILN_HOST_CLI_H

#include "config.h"
#include "error.h"
#include "loader.h"

/* Each gets its own arguments with argv[0] the name it is called by
 * ("list", "check", "fit", ...), as getopt_long expects. */
int cli_plugins(int argc, char **argv);
int cli_config(int argc, char **argv);
int cli_run(int argc, char **argv); /* fit, validate, test */

/* What a command's options said: the one parser (getopt_long) behind every
 * command, so --set and its siblings mean the same everywhere. */
typedef struct cli_args {
    char **sets;      /* --set KEY=VALUE, in order */
    int nsets;
    const char *ckpt; /* --ckpt PATH|last */
    int weights_only, run_test, verbose, json;
    const char *config; /* --config RUN.cfg */
    char **dirs;        /* --plugin-dir DIR, in order */
    int ndirs;
    char **operands;    /* the arguments that are not options, in order */
    int noperands;
} cli_args;

/* The option names a command accepts (CLI_O_* bits). */
enum {
    CLI_O_SET = 1 << 0,
    CLI_O_CKPT = 1 << 1,
    CLI_O_WEIGHTS_ONLY = 1 << 2,
    CLI_O_TEST = 1 << 3,
    CLI_O_VERBOSE = 1 << 4, /* --verbose and -v */
    CLI_O_JSON = 1 << 5,
    CLI_O_CONFIG = 1 << 6,
    CLI_O_PLUGIN_DIR = 1 << 7,
};

/* Parses argv[1..] (argv[0] names the command in messages, e.g. "plugins
 * list") accepting the options in `accepted`. 0, or 2 (the exit status)
 * after printing one line: an option the command does not take, or one
 * without its value. cli_args_free releases *a either way. */
int cli_parse(const char *cmd, int argc, char **argv, unsigned accepted, cli_args *a);
void cli_args_free(cli_args *a);

/* Shared by every command that reads a run file: load it, apply --set
 * overrides, check its structure, and scan the plugin directories it names
 * (plus KILN_PLUGIN_PATH and the built-ins). */
int cli_open_run(const char *path, char **sets, int nsets, hc_config *c, hl_loader *L, ht_error *err);
/* Resolve every slot and callback of a run file against the loaded plugins:
 * each named plugin must exist and its section must match its declared keys.
 * `need_training` also requires module, data and optimizer. */
int cli_check_run(hc_config *c, hl_loader *L, int need_training, ht_error *err);

#endif
