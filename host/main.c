/*
 * host/main.c — the `kiln` executable's entry: global flags, help, version,
 * and dispatch to the subcommands in cli_*.c. This is the only place in kiln
 * that decides to stop the process; everything below returns status codes.
 * Flags are read with getopt_long, here and in each command (cli_parse).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kiln/plugin.h"
#include "log.h"
#include "version.h"

static void usage(FILE *f) {
    fprintf(f,
            "kiln %s — a training runtime driven by plugins\n"
            "\n"
            "usage: kiln [-v|-q] COMMAND [ARGS]\n"
            "\n"
            "commands:\n"
            "  fit RUN.cfg [--set KEY=VALUE]... [--ckpt PATH|last [--weights-only]] [--test]\n"
            "                      train; the run goes to <trainer.default_root_dir>/version_N/ and the\n"
            "                      weights to its checkpoints/last.safetensors after every epoch;\n"
            "                      --ckpt resumes exactly from a checkpoint (also one written inside\n"
            "                      an epoch); --weights-only starts a new run from its weights only;\n"
            "                      SIGINT/SIGTERM finish the batch, checkpoint and exit (128+signal);\n"
            "                      --test also runs the test loop on the final weights\n"
            "  validate RUN.cfg [--set KEY=VALUE]... [--ckpt PATH|last]\n"
            "  test RUN.cfg [--set KEY=VALUE]... [--ckpt PATH|last]\n"
            "                      one pass over the validation / test data, with the weights of a\n"
            "                      checkpoint (last: the newest run's checkpoints/last.safetensors)\n"
            "                      or else the initial weights\n"
            "  plugins list [--verbose] [--json] [--config RUN.cfg] [--plugin-dir DIR]...\n"
            "                      every plugin file found, with status and reason, and every plugin\n"
            "                      with its kind, version, ABI, aliases and properties\n"
            "  plugins check FILE.so [--json]\n"
            "                      vet and load one plugin file in a child process; exit 0 if it reports\n"
            "                      success within KILN_PLUGIN_PROBE_TIMEOUT\n"
            "  config check RUN.cfg [--set KEY=VALUE]...\n"
            "                      parse a run file and check every key against the plugins it names\n"
            "  config show RUN.cfg [--set KEY=VALUE]...\n"
            "                      print the effective run file (includes and overrides applied)\n"
            "\n"
            "global flags:\n"
            "  -v, --verbose       more log output (repeat for trace); KILN_LOG=debug does the same\n"
            "  -q, --quiet         no chatter: no progress bar, no info or warning lines; errors and\n"
            "                      the end-of-run summary (the result) still print; -qq: errors only\n"
            "  -h, --help          this text\n"
            "      --version       kiln and plugin ABI versions\n"
            "\n"
            "environment:\n"
            "  KILN_PLUGIN_PATH    colon-separated absolute plugin directories, searched after the run\n"
            "                      file's plugins.dirs and before the built-in directory\n"
            "  KILN_PLUGIN_DEBUG=1 trace plugin discovery and loading\n"
            "  KILN_PLUGIN_PROBE_TIMEOUT  seconds each plugin file may take to load in its probe\n"
            "                      (a child process) and in `plugins check` (default 10)\n"
            "  KILN_PLUGIN_CACHE   the probe cache file (absolute), or off; default\n"
            "                      ~/.cache/kiln/plugin-probes\n"
            "\n"
            "Documentation: docs/user-guide.md, docs/config.md, docs/plugin-guide.md, docs/abi.md\n",
            KILN_VERSION_STRING);
}

int main(int argc, char **argv) {
    hlog_init_from_env();
    /* the global flags, up to the command ("+": getopt stops at the first
     * word that is not an option; the command parses the rest) */
    static const struct option globals[] = {
        {"verbose", no_argument, NULL, 'v'}, {"quiet", no_argument, NULL, 'q'}, {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'}, {NULL, 0, NULL, 0},
    };
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "+vqh", globals, NULL)) != -1) {
        switch (c) {
        case 'h': usage(stdout); return 0;
        case 'V':
            printf("kiln %s\nplugin ABI %d.%d\nbuild: %s\n", KILN_VERSION_STRING, KILN_ABI_MAJOR, KILN_ABI_MINOR,
                   KILN_BUILD_DESCRIPTION);
            return 0;
        case 'v': hlog_set_level(hlog_level() > KILN_LOG_TRACE ? hlog_level() - 1 : KILN_LOG_TRACE); break;
        case 'q': /* -qq is two of these */
            hlog_set_level(KILN_LOG_ERROR);
            hlog_set_quiet(hlog_quiet() + 1);
            break;
        default: {
            char shortname[3] = {'-', (char)optopt, 0};
            fprintf(stderr, "kiln: error: unknown flag '%s' (see kiln --help)\n", optopt ? shortname : argv[optind - 1]);
            return 2;
        }
        }
    }
    int i = optind;
    if (i >= argc) { usage(stderr); return 2; }
    const char *cmd = argv[i];
    if (!strcmp(cmd, "plugins")) return cli_plugins(argc - i - 1, argv + i + 1);
    if (!strcmp(cmd, "config")) return cli_config(argc - i - 1, argv + i + 1);
    if (!strcmp(cmd, "fit") || !strcmp(cmd, "validate") || !strcmp(cmd, "test")) return cli_run(argc - i, argv + i);
    if (!strcmp(cmd, "help")) { usage(stdout); return 0; }
    fprintf(stderr, "kiln: error: unknown command '%s' (see kiln --help)\n", cmd);
    return 2;
}
