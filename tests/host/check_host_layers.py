#!/usr/bin/env python3
"""The host's files depend on each other in one direction (docs/architecture.md).

A module is a header and the sources that implement it (loader.h: loader.c,
registry.c, loader_elf.c; config.h: config.c, trainer_params.c; cli.h: cli.c,
cli_run.c). Module A depends on module B when a file of A includes B's header.
This check fails when:
  - two modules depend on each other, directly or through others (a cycle);
  - a module depends on a layer above its own (the LAYERS table below);
  - trainer.c or lr_clip.c reads the run file with libconfig instead of
    through config.c.
  - error.h (the ht_error every layer reports through) includes another
    host header: it must stay below every store.
Usage: check_host_layers.py HOST_DIR
"""
import os
import re
import sys

# Training, bottom to top; a module may use only modules of a lower rank.
# Modules not listed (error, log, config, loader, metrics, services,
# safetensors, compat, param_checks, probe_cache) are the stores below rank 0;
# error.h (ht_error, written by log.c) includes no other host header, so every
# store reports failures the way the layers above do.
LAYERS = {
    "run": 0,
    "run_services": 1, "lr_clip": 1, "checkpoint": 1,
    "closure": 2,
    "manual": 3,
    "loops": 4,
    "plugin_api": 5,
    "trainer": 6,
    "cli": 7,
    "main": 8,
}
IMPLEMENTS = {"registry": "loader", "loader_elf": "loader", "trainer_params": "config", "cli_run": "cli"}
NO_LIBCONFIG = ("trainer.c", "lr_clip.c")
LIBCONFIG = re.compile(r"\b(config_setting_\w+|config_lookup\w*|config_write\w*|config_t|CONFIG_TYPE_\w+|libconfig\.h)\b")


def module_of(name):
    stem = os.path.splitext(name)[0]
    return IMPLEMENTS.get(stem, stem)


def main(host):
    files = sorted(f for f in os.listdir(host) if f.endswith((".c", ".h")))
    headers = {os.path.splitext(f)[0] for f in files if f.endswith(".h")}
    deps = {}
    errors = []
    for f in files:
        text = open(os.path.join(host, f), encoding="utf-8").read()
        m = module_of(f)
        for inc in re.findall(r'^\s*#\s*include\s+"([^"/]+)\.h"', text, re.M):
            if inc in headers and inc != m:
                deps.setdefault(m, set()).add(inc)
                rank_m, rank_i = LAYERS.get(m, -1), LAYERS.get(inc, -1)
                if rank_i > rank_m or (rank_i == rank_m and rank_m >= 0):
                    errors.append(f"{f} includes {inc}.h: {m} (layer {rank_m}) may only use layers below it")
        if f in NO_LIBCONFIG:
            for line_no, line in enumerate(text.splitlines(), 1):
                if LIBCONFIG.search(line.split("//")[0]):
                    errors.append(f"{f}:{line_no}: reads libconfig directly; use config.h's hc_* functions")
    for d in sorted(deps.get("error", ())):
        errors.append(f"error.h includes {d}.h: the error type must stay below every store")
    # cycles, by depth-first search
    state = {}

    def visit(m, path):
        state[m] = 1
        for d in sorted(deps.get(m, ())):
            if state.get(d) == 1:
                errors.append("include cycle: " + " -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(deps):
        if m not in state:
            visit(m, [m])
    for e in errors:
        print(e)
    if not errors:
        print(f"host layers: {len(deps)} modules, one direction, no cycles")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../host")))
