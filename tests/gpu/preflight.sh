#!/usr/bin/env bash
# tests/gpu/preflight.sh — checks tests/gpu/run.sh's first step without a
# GPU: in a sandbox PATH holding only the tools the script needs, (a) with
# no nvidia-smi it must stop at once, naming the driver in one line, before
# any check runs; and with no ompi_info it must say that the MPI-launched
# ddp run will be skipped; (b) with an nvidia-smi that reports a driver for
# CUDA 99.9 the driver line must pass and name that version
# (KILN_GPU_PREFLIGHT_ONLY=1 stops after the checks); (a) also checks that
# gpu.log keeps the last line when tee is slow; on a stand-in
# checkout whose build-gpu/cuda-version names the build's toolkit, (c) a
# driver for CUDA 12.8 under a CUDA 13.0 build must stop the run with one
# line naming both, (d) a driver for 13.0 under a 13.2 build must pass with
# a line on minor-version compatibility, and (e) an ompi_info of another
# version than .gpu/openmpi-version (the carried libmpi's) must skip the
# MPI-launched run, naming both versions, and one of the same version must
# let it go ahead; (f) a build carried packed (.gpu/build-gpu.tar.xz, as
# prepare.sh leaves it) must be unpacked before the driver check reads its
# toolkit version, replacing a build-gpu/ an earlier call left, absolute
# links and all; (g) an archive that is not one must stop the run with one
# line naming it. Exit 0 when all hold, 77 (skipped) where a tool the
# sandbox needs is missing here.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
for t in bash env mkdir mktemp rm tee date sed grep awk ls head dirname cat python3 ctest ldconfig timeout sleep; do
  p=$(command -v "$t" 2>/dev/null || true)
  [ -z "$p" ] && [ -x "/sbin/$t" ] && p=/sbin/$t
  # the interpreter itself, not a wrapper (pyenv's shim) that needs more tools
  [ "$t" = python3 ] && [ -n "$p" ] && p=$("$p" -c 'import sys; print(sys.executable)' 2>/dev/null)
  [ -n "$p" ] || { echo "preflight.sh: $t not found here: skipped"; exit 77; }
  ln -s "$p" "$tmp/bin/$t"
done
to=$(command -v timeout) || { echo "preflight.sh: timeout not found here: skipped"; exit 77; }
fail() { echo "preflight.sh: FAIL: $*"; exit 1; }
# Every case runs a copy of the scripts in a stand-in checkout, never this
# one: run.sh unpacks a .gpu/build-gpu.tar.xz it finds (prepare.sh's) into
# its checkout, replacing build-gpu/ there. The stand-in: the scripts, a
# build-gpu/ (holding cuda-version from (c) on), .gpu/, and from (c) on
# empty CUDA libraries on LD_LIBRARY_PATH
root="$tmp/root"
mkdir -p "$root/tests/gpu" "$root/build-gpu" "$root/.gpu" "$tmp/lib"
cp "$here/run.sh" "$here/lib.sh" "$root/tests/gpu/"

# (a) no driver, no Open MPI; and a tee that starts a second late, run.sh's
# output going to a file (nothing but run.sh itself waits for tee): gpu.log
# must still hold the last line printed
rm "$tmp/bin/tee"
printf '#!/bin/sh\nsleep 1\nexec %s "$@"\n' "$(command -v tee)" >"$tmp/bin/tee"
chmod +x "$tmp/bin/tee"
PATH="$tmp/bin" "$to" 60 bash "$root/tests/gpu/run.sh" "$tmp/out-a" >"$tmp/a.txt" 2>&1; rc=$?
out=$(cat "$tmp/a.txt" "$tmp/out-a/gpu.log")
cat "$tmp/a.txt"
grep -q '^run.sh: stopping before any check' "$tmp/out-a/gpu.log" || fail "(a) gpu.log lacks the last line printed: tee was not waited for"
[ "$rc" -eq 1 ] || fail "(a) exit status $rc, want 1"
grep -q '^-- need driver (nvidia-smi): MISSING: nvidia-smi not found' <<<"$out" || fail "(a) no line naming the missing nvidia-smi"
grep -q '^run.sh: stopping before any check: this machine lacks driver (nvidia-smi)' <<<"$out" || fail "(a) no summary line"
grep -q 'Open MPI: not installed (no ompi_info): the MPI-launched ddp run will be skipped' <<<"$out" || fail "(a) no Open MPI line"
grep -q -E '^== (GPU tests|kiln plugins list|fit )' <<<"$out" && fail "(a) a check ran after the refusal"
grep -q '"check": "preflight", "status": "fail"' "$tmp/out-a/results.json" || fail "(a) results.json does not record the refusal"

# (b) a driver for CUDA 99.9
. "$here/standin.sh"
standin_driver "$tmp/bin"
out=$(PATH="$tmp/bin" KILN_GPU_PREFLIGHT_ONLY=1 "$to" 60 bash "$root/tests/gpu/run.sh" "$tmp/out-b" 2>&1)
echo "$out"
grep -q '^-- need driver (nvidia-smi): CUDA 99.9' <<<"$out" || fail "(b) the driver line does not pass with CUDA 99.9"
grep -q -E '^== (GPU tests|kiln plugins list|fit )' <<<"$out" && fail "(b) KILN_GPU_PREFLIGHT_ONLY=1 went on"

standin_libs "$tmp/lib"
pre() { # OUT: run.sh's preflight on the stand-in checkout
  PATH="$tmp/bin" LD_LIBRARY_PATH="$tmp/lib" KILN_GPU_PREFLIGHT_ONLY=1 "$to" 60 bash "$root/tests/gpu/run.sh" "$tmp/$1" 2>&1
}
# pre_status CASE OUT RC: the preflight run into OUT, printed and kept in
# $out; it must exit with RC
pre_status() {
  local rc
  out=$(pre "$2"); rc=$?
  echo "$out"
  [ "$rc" -eq "$3" ] || fail "($1) exit status $rc, want $3"
}

# (c) a CUDA 13 build, a driver for CUDA 12.8
echo 13.0.88 >"$root/build-gpu/cuda-version"
standin_driver "$tmp/bin" 12.8
pre_status c out-c 1
grep -q '^-- need driver (nvidia-smi): MISSING: the driver supports CUDA 12.8, the build needs CUDA 13 (its toolkit: 13.0.88)' <<<"$out" ||
  fail "(c) no line naming the driver's and the build's CUDA"
grep -q '^run.sh: stopping before any check' <<<"$out" || fail "(c) the run did not stop"

# (d) a CUDA 13.2 build, a driver for CUDA 13.0: minor-version compatibility
echo 13.2.1 >"$root/build-gpu/cuda-version"
standin_driver "$tmp/bin" 13.0
pre_status d out-d 0
grep -q '^-- need driver (nvidia-smi): CUDA 13.0 (build: CUDA 13.2.1)' <<<"$out" || fail "(d) the driver line does not pass"
[ "$(grep -c "minor-version compatibility" <<<"$out")" -eq 1 ] || fail "(d) no line (or several) on minor-version compatibility"

# (e) Open MPI here against the carried libmpi's version
echo 4.1.4 >"$root/.gpu/openmpi-version"
standin_ompi "$tmp/bin" 5.0.3
out=$(pre out-e1)
echo "$out"
grep -q "^-- Open MPI: .*the MPI-launched ddp run will be skipped: this machine's Open MPI is 5.0.3 (ompi_info), the carried libmpi is 4.1.4" <<<"$out" ||
  fail "(e) another Open MPI version did not skip the MPI-launched run"
standin_ompi "$tmp/bin" 4.1.4
out=$(pre out-e2)
echo "$out"
grep -q "^-- Open MPI: .*4.1.4, as the carried libmpi: the MPI-launched ddp run goes ahead" <<<"$out" ||
  fail "(e) the same Open MPI version did not let the MPI-launched run go ahead"

# (f) the build packed: a CUDA 13 build in the archive, a stale CUDA 99
# build-gpu/ beside it
pack() { # pack DIR: DIR/build-gpu into $root/.gpu/build-gpu.tar.xz
  python3 - "$1" "$root/.gpu/build-gpu.tar.xz" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[2], "w:xz") as t:
    t.add(sys.argv[1] + "/build-gpu", "build-gpu")
PY
}
mkdir -p "$tmp/pk/build-gpu/tests/plugins"
echo 13.0.88 >"$tmp/pk/build-gpu/cuda-version"
echo "CMAKE_HOME_DIRECTORY:INTERNAL=$root" >"$tmp/pk/build-gpu/CMakeCache.txt"
ln -s /nonexistent/build-gpu/lib/libkiln-cpu.so "$tmp/pk/build-gpu/tests/plugins/libkiln-cpu.so"
pack "$tmp/pk" || fail "(f) could not make the archive"
echo 99.0 >"$root/build-gpu/cuda-version"
standin_driver "$tmp/bin" 12.8
pre_status f out-f1 1
grep -q "^-- need build (.gpu/build-gpu.tar.xz): unpacked into $root/build-gpu" <<<"$out" || fail "(f) no line on the unpacked build"
grep -q '^-- need driver (nvidia-smi): MISSING: the driver supports CUDA 12.8, the build needs CUDA 13 (its toolkit: 13.0.88)' <<<"$out" ||
  fail "(f) the driver check did not read the unpacked build's toolkit version"
[ -L "$root/build-gpu/tests/plugins/libkiln-cpu.so" ] || fail "(f) the absolute link was not unpacked"
standin_driver "$tmp/bin" 13.0
pre_status f out-f2 0
grep -q '^-- need driver (nvidia-smi): CUDA 13.0 (build: CUDA 13.0.88)' <<<"$out" || fail "(f) the driver line does not pass"

# (g) an archive that is not one
echo "not an archive" >"$root/.gpu/build-gpu.tar.xz"
pre_status g out-g 1
grep -q '^-- need build (.gpu/build-gpu.tar.xz): MISSING: could not unpack it into .*(rerun tests/gpu/prepare.sh)$' <<<"$out" ||
  fail "(g) no line naming the archive that could not be unpacked"
grep -q '^run.sh: stopping before any check: this machine lacks build (.gpu/build-gpu.tar.xz)' <<<"$out" || fail "(g) the run did not stop"
echo "preflight.sh: ok"
