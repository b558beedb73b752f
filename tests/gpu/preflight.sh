#!/usr/bin/env bash
# tests/gpu/preflight.sh — checks tests/gpu/run.sh's first step without a
# GPU: in a sandbox PATH holding only the tools the script needs, (a) with
# no nvidia-smi it must stop at once, naming the driver in one line, before
# any check runs; and with no ompi_info it must say that the MPI-launched
# ddp run will be skipped; (b) with an nvidia-smi that reports a driver for
# CUDA 99.9 the driver line must pass and name that version
# (KILN_GPU_PREFLIGHT_ONLY=1 stops after the checks). Exit 0 when both hold,
# 77 (skipped) where a tool the sandbox needs is missing here.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
for t in bash env mkdir mktemp rm tee date sed grep awk ls head dirname cat python3 ctest ldconfig; do
  p=$(command -v "$t" 2>/dev/null || true)
  [ -z "$p" ] && [ -x "/sbin/$t" ] && p=/sbin/$t
  [ -n "$p" ] || { echo "preflight.sh: $t not found here: skipped"; exit 77; }
  ln -s "$p" "$tmp/bin/$t"
done
to=$(command -v timeout) || { echo "preflight.sh: timeout not found here: skipped"; exit 77; }
fail() { echo "preflight.sh: FAIL: $*"; exit 1; }

# (a) no driver, no Open MPI
out=$(PATH="$tmp/bin" "$to" 60 bash "$here/run.sh" "$tmp/out-a" 2>&1); rc=$?
echo "$out"
[ "$rc" -eq 1 ] || fail "(a) exit status $rc, want 1"
grep -q '^-- need driver (nvidia-smi): MISSING: nvidia-smi not found' <<<"$out" || fail "(a) no line naming the missing nvidia-smi"
grep -q '^run.sh: stopping before any check: this machine lacks driver (nvidia-smi)' <<<"$out" || fail "(a) no summary line"
grep -q 'Open MPI: not installed (no ompi_info): the MPI-launched ddp run will be skipped' <<<"$out" || fail "(a) no Open MPI line"
grep -q -E '^== (GPU tests|kiln plugins list|fit )' <<<"$out" && fail "(a) a check ran after the refusal"
grep -q '"check": "preflight", "status": "fail"' "$tmp/out-a/results.json" || fail "(a) results.json does not record the refusal"

# (b) a driver for CUDA 99.9
. "$here/standin.sh"
standin_driver "$tmp/bin"
out=$(PATH="$tmp/bin" KILN_GPU_PREFLIGHT_ONLY=1 "$to" 60 bash "$here/run.sh" "$tmp/out-b" 2>&1)
echo "$out"
grep -q '^-- need driver (nvidia-smi): CUDA 99.9' <<<"$out" || fail "(b) the driver line does not pass with CUDA 99.9"
grep -q -E '^== (GPU tests|kiln plugins list|fit )' <<<"$out" && fail "(b) KILN_GPU_PREFLIGHT_ONLY=1 went on"
echo "preflight.sh: ok"
