#!/usr/bin/env bash
# tests/gpu/no_gpu.sh — the cuda accelerator on a machine without a GPU or
# driver (CI's machines): `kiln plugins list` still works and lists it, and
# a run that asks for it fails before anything else with exactly one line
# naming the plugin and the reason, and a non-zero exit status. Skipped (77)
# where a GPU is usable, since the run then gets past the accelerator.
#   no_gpu.sh KILN
set -u
kiln=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kiln" plugins list >"$tmp/list" 2>&1 || { cat "$tmp/list"; echo "FAIL: plugins list exited $?"; exit 1; }
grep -q -E '^ +accelerator +cuda ' "$tmp/list" || { cat "$tmp/list"; echo "FAIL: cuda not listed"; exit 1; }
"$kiln" fit "$root/examples/fashion_mnist.cfg" --set accelerator=cuda --set data.dir=/nonexistent \
  --set "trainer.default_root_dir=\"$tmp/runs\"" >"$tmp/out" 2>"$tmp/err"
status=$?
if ! grep -q -E 'no NVIDIA driver found|no CUDA device visible|driver supports CUDA up to' "$tmp/err"; then
  echo "a GPU seems usable here (the run got past the accelerator): skipped"; cat "$tmp/err"; exit 77
fi
[ "$status" -ne 0 ] || { echo "FAIL: exit status 0"; exit 1; }
lines=$(wc -l <"$tmp/err")
[ "$lines" -eq 1 ] || { cat "$tmp/err"; echo "FAIL: expected one line on stderr, got $lines"; exit 1; }
grep -q "^kiln: error: accelerator 'cuda' (.*libkiln-cuda.so): create failed: cuda: " "$tmp/err" ||
  { cat "$tmp/err"; echo "FAIL: the line does not name the accelerator and its plugin"; exit 1; }
[ ! -s "$tmp/out" ] || { cat "$tmp/out"; echo "FAIL: stdout not empty"; exit 1; }
echo "no GPU: listed, and refused with one line: $(cat "$tmp/err")"
