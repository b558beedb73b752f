/*
 * host/cli.h — the `kiln` subcommands. Each takes the arguments after its own
 * name and returns the process exit status; only main() exits.
 */
#ifndef KILN_HOST_CLI_H
#define KILN_HOST_CLI_H

#include "config.h"
#include "loader.h"

int cli_plugins(int argc, char **argv);
int cli_config(int argc, char **argv);
int cli_run(const char *verb, int argc, char **argv); /* fit, validate, test */

/* Shared by every command that reads a run file: load it, apply --set
 * overrides, check its structure, and scan the plugin directories it names
 * (plus KILN_PLUGIN_PATH and the built-ins). */
int cli_open_run(const char *path, char **sets, int nsets, hc_config *c, hl_loader *L, char *why, size_t whylen);
/* Resolve every slot and callback of a run file against the loaded plugins:
 * each named plugin must exist and its section must match its declared keys.
 * `need_training` also requires module, data and optimizer. */
int cli_check_run(hc_config *c, hl_loader *L, int need_training, char *why, size_t whylen);

#endif
