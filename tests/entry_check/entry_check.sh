#!/usr/bin/env bash
# tests/entry_check/entry_check.sh — kiln_add_plugin refuses to link a plugin
# without kiln_plugin_init_v1 (the entry KILN_DEFINE_LIBRARY defines): a
# library that forgot the macro, or misspelt its entry, fails at build time
# with the linker naming the symbol, while the same project with the macro
# builds. Usage: entry_check.sh SDK_CMAKE_DIR SDK_INCLUDE_DIR C_COMPILER
set -euo pipefail
cmake_dir=$1 inc=$2 cc=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(entry_check C)
include("$cmake_dir/KilnPluginHelpers.cmake")
kiln_add_plugin(\${WHICH} SOURCES \${WHICH}.c INCLUDE_SDK "$inc" NO_INSTALL)
CMAKE
cat > "$tmp/good.c" <<'C'
#include <kiln/kiln.h>
static const kiln_callback_ops ops = {.base = {.struct_size = sizeof(kiln_callback_ops)}};
static const kiln_plugin_desc d = {.struct_size = sizeof(kiln_plugin_desc), .kind = KILN_KIND_CALLBACK,
                                   .name = "good", .version = "1.0.0", .ops = &ops};
KILN_DEFINE_LIBRARY("good", "1.0.0", 0, &d)
C
cat > "$tmp/noentry.c" <<'C'
#include <kiln/kiln.h>
/* a plugin whose author forgot KILN_DEFINE_LIBRARY */
int32_t helper(void);
int32_t helper(void) { return KILN_OK; }
C
for which in good noentry; do
  if cmake -S "$tmp" -B "$tmp/b-$which" -DWHICH=$which -DCMAKE_C_COMPILER="$cc" > "$tmp/$which.log" 2>&1 &&
     cmake --build "$tmp/b-$which" >> "$tmp/$which.log" 2>&1; then built=1; else built=0; fi
  if [ $which = good ] && [ $built = 0 ]; then cat "$tmp/$which.log"; echo "entry_check: the good plugin did not build" >&2; exit 1; fi
  if [ $which = noentry ]; then
    [ $built = 0 ] || { echo "entry_check: a plugin without kiln_plugin_init_v1 linked" >&2; exit 1; }
    grep -q "kiln_plugin_init_v1" "$tmp/$which.log" || { cat "$tmp/$which.log"; echo "entry_check: the link error does not name kiln_plugin_init_v1" >&2; exit 1; }
  fi
done
echo "entry_check: a plugin without kiln_plugin_init_v1 fails to link, naming it; one with KILN_DEFINE_LIBRARY builds"
