#!/usr/bin/env bash
# tests/sdk_headers/check_headers.sh — every installed SDK header compiles
# alone, warning-free, under the strictest flags a plugin author may use
# (-std=c11 without GNU extensions: no feature-test macros, so a POSIX call
# such as strdup is undeclared), and what the headers define runs
# (headers_run.c). Usage: check_headers.sh INCLUDE_DIR RUN_C [CC]
# INCLUDE_DIR is sdk/include in the build tree, or <prefix>/include after
# `cmake --install` (.ci/setup.sh checks both).
set -euo pipefail
inc=$1 run_c=$2 cc=${3:-cc}
flags=(-std=c11 -Wall -Wextra -Werror -Werror=implicit-function-declaration -Wstrict-prototypes -I "$inc")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for h in "$inc"/kiln/*.h; do
  name=$(basename "$h")
  # alone, first include of the unit: it must bring everything it needs
  printf '#include <kiln/%s>\nint main(void) { return 0; }\n' "$name" > "$tmp/one.c"
  if ! "$cc" "${flags[@]}" "$tmp/one.c" -o "$tmp/one" 2> "$tmp/err"; then
    echo "kiln/$name does not compile alone under ${flags[*]}:" >&2
    cat "$tmp/err" >&2
    exit 1
  fi
  # twice: the include guard holds
  printf '#include <kiln/%s>\n#include <kiln/%s>\nint main(void) { return 0; }\n' "$name" "$name" > "$tmp/two.c"
  "$cc" "${flags[@]}" -fsyntax-only "$tmp/two.c" 2> "$tmp/err" || { echo "kiln/$name: included twice:" >&2; cat "$tmp/err" >&2; exit 1; }
  n=$((n + 1))
done
[ "$n" -ge 10 ] || { echo "expected the SDK headers in $inc/kiln, found $n" >&2; exit 1; }
"$cc" "${flags[@]}" "$run_c" -o "$tmp/run" -lm 2> "$tmp/err" || { echo "headers_run.c:" >&2; cat "$tmp/err" >&2; exit 1; }
(cd "$tmp" && ./run)
echo "sdk headers: $n compile alone under strict C11; headers_run passed"
