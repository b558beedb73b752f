#!/usr/bin/env bash
# tests/gpu/run.sh OUT — the GPU check, one prepared script for a machine
# with one NVIDIA GPU. It:
#   0. checks what it needs from the machine, one line each: the driver's
#      CUDA version (nvidia-smi; its major version not older than that of
#      the toolkit the build used, build-gpu/cuda-version), libcudart,
#      libcublasLt, libnccl, ctest, python3 and timeout, and stops at once
#      naming what is missing (KILN_GPU_PREFLIGHT_ONLY=1: stop after this);
#      and whether the MPI-launched ddp run can go ahead (below);
#   1. finds the build: build-gpu/ made by tests/gpu/prepare.sh, which
#      carries it packed as .gpu/build-gpu.tar.xz (unpacked here before the
#      checks of step 0, which read its toolkit version; a build-gpu/
#      carried as a folder is used as it is); the checkout is linked at the
#      path that build recorded (where that path cannot be made, the
#      build's CTest files are rewritten to the checkout instead); else
#      builds one here (needs libconfig, CUnit and OpenBLAS development
#      files);
#   2. unpacks .gpu/deps.tar.xz (libraries the machine may lack) to /tmp and
#      finds the CUDA libraries (toolkit, or the nvidia-* Python wheels);
#      then, still before any check, stops with one line when unpacking
#      fails, when `ldd` finds a library of bin/kiln, the cuda plugin,
#      libkiln-ddp.so or test_cuda_kernels missing ("not found", a GLIBC
#      version too), or when `kiln plugins list` refuses a plugin or lacks
#      the cuda accelerator;
#   3. runs the GPU tests: kernels/cuda's host-side math test, then every
#      kiln_kernels entry of the cuda accelerator against the cpu one
#      (ctest -L gpu, each attention path included), then the same under
#      compute-sanitizer memcheck, and the flash attention under racecheck
#      and memcheck;
#   4. trains Fashion-MNIST briefly on the GPU in every precision, and under
#      the ddp strategy (NCCL for device memory) launched without MPI
#      (torchrun-style variables, bootstrap tcp) and, where this machine's
#      Open MPI (ompi_info) is the version of the libmpi prepare.sh carried
#      (.gpu/openmpi-version), as a singleton MPI process (which needs Open
#      MPI's plugins and orted, not carried from the build machine);
#   4b. the transformer checks (tests/gpu/gpt_checks.sh): a small GPT step by
#      step on the cpu and the GPU (every attention path), 200 steps of the
#      fortunes demo in fp32 and bf16-mixed, GPT-2 124M under ddp over NCCL;
#   5. runs the GPU benchmark (bench/gpu/run.sh);
#   5b. GPT-2 124M's throughput, MFU, step breakdown and memory with the
#      gemm and flash attention paths, against PyTorch eager and
#      torch.compile (bench/gpu/gpt2.sh);
# and writes OUT/gpu.log (everything printed), OUT/results.json (each
# step's status and figures, rewritten after every step) and
# OUT/logs.tar.xz (every log, metrics file and config the steps left).
# The ddp runs over NCCL wait at most 60 s in a collective or NCCL's init
# (strategy.timeout_s; kiln's default is 1800) and run with NCCL_DEBUG=WARN,
# so that a hang ends in time and says where.
# Exit status: 0 when every check passed, 1 when one failed, 3 when none
# failed but the deadline cut some (or a sanitizer ran out of time).
#   bash tests/gpu/run.sh OUT [STEPS] [--deadline SECONDS]
# STEPS (default all) is a comma-separated list of the steps kernels (3),
# sanitizers (3, under compute-sanitizer), fashion (4), bench (5), gpt (4b)
# and gpt2 (5b), or of the parts core (3-5) and transformer (4b, 5b); they
# run in the order kernels, gpt, fashion, gpt2, sanitizers, bench.
# --deadline (or KILN_GPU_DEADLINE_S) gives the run that many seconds: each
# step gets its share of them (tests/gpu/lib.sh, GPU_STEP_SHARES: with
# `--deadline 570`, 60 s for kernels, 140 gpt, 90 fashion, 120 gpt2, 95
# sanitizers, 50 bench, a step's unused time passed on to the later ones,
# none of which loses its least time), each time limit inside a step is cut
# to its share, a check that no longer fits is recorded as skipped, and
# results.json is still written in time. With a device tool that kills a
# command after 10 minutes: `--deadline 570`, and rerun what was skipped or
# failed by name (a step run alone gets all the time the deadline gives).
set -uo pipefail
out=${1:?usage: tests/gpu/run.sh OUTDIR [STEPS] [--deadline SECONDS]}
shift
spec=all deadline_s=${KILN_GPU_DEADLINE_S:-0}
while [ $# -gt 0 ]; do
  case "$1" in
    --deadline) deadline_s=${2:?run.sh: --deadline needs a number of seconds}; shift 2 ;;
    --deadline=*) deadline_s=${1#--deadline=}; shift ;;
    -*) echo "run.sh: unknown option $1: expected --deadline SECONDS" >&2; exit 2 ;;
    *) spec=$1; shift ;;
  esac
done
case "$deadline_s" in '' | *[!0-9]*) echo "run.sh: --deadline must be a whole number of seconds, got '$deadline_s'" >&2; exit 2 ;; esac
. "$(dirname "$0")/lib.sh"
plan=$(gpu_plan "$spec") || exit 2
run_deadline=0
[ "$deadline_s" -gt 0 ] && run_deadline=$(($(date +%s) + deadline_s))
KILN_GPU_DEADLINE=$run_deadline
export KILN_GPU_DEADLINE
# OUT gets three files only (a device tool may bring back no more than a
# few, and none large): gpu.log as it is written, results.json after every
# step, and at the end logs.tar.xz, the work folder's files under 4 MiB
# but token shards and checkpoints (the logs, metrics and configs). The
# steps write to the work folder in /tmp.
final=$out
mkdir -p "$final" || exit 2
out=$(mktemp -d /tmp/kiln-gpu-run-XXXXXX) || exit 2
root=$(cd "$(dirname "$0")/../.." && pwd)
# everything printed goes to gpu.log too, through tee; at the end the pipe
# is closed and tee waited for (5 s at most: a process left holding the
# pipe must not hold the run), so that gpu.log keeps the last lines
exec 3>&1 4>&2
exec > >(tee -a "$final/gpu.log") 2>&1
tee_pid=$!
at_exit() {
  local i=0
  exec 1>&3 2>&4 3>&- 4>&-
  while [ "$i" -lt 50 ] && kill -0 "$tee_pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$tee_pid/status" 2>/dev/null; do
    sleep 0.1
    i=$((i + 1))
  done
  [ "$i" -lt 50 ] && wait "$tee_pid" 2>/dev/null
  rm -rf "$out"
}
trap at_exit EXIT
t_start=$(date +%s)
echo "run.sh: writing to $final (gpu.log, results.json, logs.tar.xz); work folder $out"
results="$out/results.jsonl"
: >"$results"
failures=0

note() { echo "== $* ($(($(date +%s) - t_start)) s)"; }
# record NAME STATUS [JSON-OBJECT-FIELDS]
record() {
  local extra=${3:-}
  echo "{\"check\": \"$1\", \"status\": \"$2\"${extra:+, $extra}}" >>"$results"
  [ "$2" = pass ] || [ "$2" = skip ] || failures=$((failures + 1))
  echo "-- $1: $2 ${extra}"
}
# jtext TEXT: TEXT as the inside of a JSON string (one line)
jtext() { printf '%s' "$1" | tr '\t\n\r' '   ' | sed 's/\\/\\\\/g; s/"/\\"/g'; }

# ---- 0. what the machine must have ---------------------------------------------
# The CUDA library folders: the toolkit's, or the nvidia-* Python wheels'.
cuda_dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 - 2>/dev/null <<'PY'
# every folder of the nvidia-* wheels (nvidia/<pkg>/lib, or nvidia/cu13/lib
# as CUDA 13's wheels lay them out), up to three levels down, holding a .so
import os, nvidia
found = []
for top in nvidia.__path__:
    for d, subs, files in os.walk(top):
        if d[len(top):].count(os.sep) >= 3:
            subs[:] = []
        if any(".so" in f for f in files):
            found.append(d)
print(" ".join(found))
PY
); do
  # (grep reads all of ls: under pipefail, grep -q leaving early could kill ls with SIGPIPE)
  [ -d "$d" ] && ls "$d" 2>/dev/null | grep -E 'lib(cublasLt|cudart|nccl)\.so' >/dev/null && cuda_dirs="$cuda_dirs:$d"
done
LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}$cuda_dirs"
LD_LIBRARY_PATH=${LD_LIBRARY_PATH#:}
export LD_LIBRARY_PATH
export PATH="/usr/local/cuda/bin:$PATH"

# find_lib NAME: the first lib<NAME>.so* in LD_LIBRARY_PATH or the loader's
# cache (any version: step 2's ldd checks the ones the build needs)
find_lib() {
  local d f
  for d in ${LD_LIBRARY_PATH//:/ }; do
    for f in "$d"/lib"$1".so*; do [ -e "$f" ] && { echo "$f"; return 0; }; done
  done
  command -v ldconfig >/dev/null && ldconfig -p 2>/dev/null | awk -v n="lib$1.so" 'index($1, n) == 1 {print $NF; f = 1; exit} END {exit !f}'
}
missing=()
pre() { # pre WHAT OK DETAIL: one line per requirement
  if [ "$2" = ok ]; then echo "-- need $1: $3"; else echo "-- need $1: MISSING: $3"; missing+=("$1"); fi
}
note "what this machine has"
for t in ctest python3 timeout; do
  if command -v "$t" >/dev/null; then pre "$t" ok "$(command -v "$t")"; else pre "$t" missing "$t not on PATH"; fi
done
# bounded SECONDS COMMAND...: COMMAND under timeout (where timeout is missing
# the preflight stops anyway; the command then runs unbounded)
bounded() { if command -v timeout >/dev/null; then timeout -k 5 "$@"; else shift; "$@"; fi; }
# untar ARCHIVE DEST FILTER [TOP]: ARCHIVE unpacked into DEST through
# Python's tarfile (the image may have no xz) with extraction filter
# FILTER, every entry under TOP/ when TOP is given; on failure one line
# on stderr saying why, and a non-zero status
untar() {
  python3 - "$@" <<'PY'
import sys, tarfile
archive, dest, filt = sys.argv[1:4]
top = sys.argv[4] if len(sys.argv) > 4 else None
try:
    with tarfile.open(archive) as t:
        if top and any(m.name.split("/")[0] != top for m in t.getmembers()):
            sys.exit("an entry outside " + top + "/")
        try:
            t.extractall(dest, filter=filt)
        except TypeError:  # a Python without extraction filters
            t.extractall(dest)
except tarfile.ReadError:
    sys.exit("not a tar archive, or a truncated one")
except Exception as e:  # lzma.LZMAError, EOFError, OSError ...
    sys.exit(type(e).__name__ + ": " + " ".join(str(e).split()))
PY
}
# The carried build: prepare.sh packs build-gpu/ into .gpu/build-gpu.tar.xz
# (38 MiB of binaries as a folder, about 6 packed: the device tool carries
# 64 MiB in all). Unpacked into the checkout on every run, replacing a
# build-gpu/ an earlier call on this machine left (the archive is what this
# call carried), with the "tar" filter: the archive is ours, and its test
# plugin folders hold absolute links into the build, which the "data"
# filter refuses.
if [ -f "$root/.gpu/build-gpu.tar.xz" ]; then
  if unpack_err=$(rm -rf "$root/build-gpu" 2>&1 && untar "$root/.gpu/build-gpu.tar.xz" "$root" tar build-gpu 2>&1) &&
     [ -f "$root/build-gpu/CMakeCache.txt" ]; then
    pre "build (.gpu/build-gpu.tar.xz)" ok "unpacked into $root/build-gpu"
  else
    unpack_err=${unpack_err:-no build-gpu/CMakeCache.txt in it}
    pre "build (.gpu/build-gpu.tar.xz)" missing "could not unpack it into $root/build-gpu: ${unpack_err##*$'\n'} (rerun tests/gpu/prepare.sh)"
  fi
fi
# The toolkit the carried build was compiled with: prepare.sh writes it to
# build-gpu/cuda-version (CMake keeps it only in the CMakeFiles folder
# prepare.sh deletes). A driver runs what a toolkit of its own major
# version or older built (a newer minor: CUDA's minor-version
# compatibility), not a newer major's.
built_cuda=$(head -1 "$root/build-gpu/cuda-version" 2>/dev/null | grep -o -E '^[0-9]+(\.[0-9]+)*')
if command -v nvidia-smi >/dev/null; then
  drv_cuda=$(bounded 30 nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9][0-9.]*' | head -1 | grep -o '[0-9][0-9.]*$')
  cmp=$(awk -v d="$drv_cuda" -v b="$built_cuda" 'BEGIN {
    split(d, x, "."); split(b, y, ".")
    if (b == "") print "unknown"; else if (x[1] + 0 < y[1] + 0) print "older"
    else if (x[1] + 0 == y[1] + 0 && x[2] + 0 < y[2] + 0) print "minor"; else print "ok" }')
  if [ -z "$drv_cuda" ]; then
    pre "driver (nvidia-smi)" missing "nvidia-smi gives no CUDA version within 30 s (no driver loaded, or no GPU)"
  elif [ "$cmp" = older ]; then
    pre "driver (nvidia-smi)" missing "the driver supports CUDA $drv_cuda, the build needs CUDA ${built_cuda%%.*} (its toolkit: $built_cuda): a driver for CUDA ${built_cuda%%.*} or newer, or a build with a CUDA ${drv_cuda%%.*} toolkit"
  elif [ "$cmp" = unknown ]; then
    pre "driver (nvidia-smi)" ok "CUDA $drv_cuda (the build's CUDA version is unknown: no build-gpu/cuda-version, which tests/gpu/prepare.sh writes)"
  else
    pre "driver (nvidia-smi)" ok "CUDA $drv_cuda (build: CUDA $built_cuda)"
    [ "$cmp" = minor ] && echo "-- note: the build's CUDA $built_cuda is newer than the driver's $drv_cuda in the same major version: it runs under CUDA's minor-version compatibility (the build's machine code for this GPU; PTX from the newer toolkit would not compile here)"
  fi
else
  pre "driver (nvidia-smi)" missing "nvidia-smi not found (no NVIDIA driver)"
fi
for l in cudart cublasLt nccl; do
  if f=$(find_lib "$l"); then pre "lib$l" ok "$f"; else pre "lib$l" missing "lib$l.so not in LD_LIBRARY_PATH, the toolkit or the loader's cache"; fi
done
# Open MPI is optional. The MPI-launched ddp run loads the carried libmpi
# (Debian's, prepare.sh records its version in .gpu/openmpi-version) and
# this machine's Open MPI plugins and orted: it runs only where the two
# are the same version (asked before the carried libraries are on
# LD_LIBRARY_PATH); otherwise it is skipped with the reason
# (mpi_skip_why), and the torchrun-style launch covers the same NCCL path.
carried_ompi=$(head -1 "$root/.gpu/openmpi-version" 2>/dev/null)
mpi_skip_why=""
if command -v ompi_info >/dev/null; then
  sys_ompi=$(bounded 20 ompi_info --version 2>/dev/null | sed -n 's/.*Open MPI v\([0-9][0-9A-Za-z.]*\).*/\1/p' | head -1)
  if [ -z "$carried_ompi" ]; then
    mpi_skip_why="the carried libmpi's version is unknown (no .gpu/openmpi-version: rerun tests/gpu/prepare.sh)"
  elif [ "$sys_ompi" != "$carried_ompi" ]; then
    mpi_skip_why="this machine's Open MPI is ${sys_ompi:-of an unknown version} (ompi_info), the carried libmpi is $carried_ompi: the MPI-launched run would mix them"
  fi
  if [ -z "$mpi_skip_why" ]; then echo "-- Open MPI: $(command -v ompi_info), $sys_ompi, as the carried libmpi: the MPI-launched ddp run goes ahead"
  else echo "-- Open MPI: $(command -v ompi_info): the MPI-launched ddp run will be skipped: $mpi_skip_why"; fi
else
  mpi_skip_why="no Open MPI (ompi_info) on this machine"
  echo "-- Open MPI: not installed (no ompi_info): the MPI-launched ddp run will be skipped; the torchrun-style launch covers the same NCCL path"
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "run.sh: stopping before any check: this machine lacks ${missing[*]}"
  row="{\"check\": \"preflight\", \"status\": \"fail\", \"missing\": \"${missing[*]}\"}"
  echo "$row" >>"$results"
  echo "{\"failures\": 1, \"seconds\": $(($(date +%s) - t_start)), \"results\": [$row]}" >"$final/results.json"
  exit 1
fi
echo "{\"check\": \"preflight\", \"status\": \"pass\"}" >>"$results"
[ "${KILN_GPU_PREFLIGHT_ONLY:-0}" = 1 ] && exit 0

# ---- results ----------------------------------------------------------------------
# write_results: OUT/results.json from the rows so far. A check the
# deadline skipped did not pass, so the exit status says so (3), and so
# does a sanitizer that ran out of time; a row that is not JSON (a
# script's bug) is kept as a failed check of its own (unreadable_row), so
# that results.json is always written and the run cannot pass. Sets cut
# (the checks skipped for the deadline or timed out) and bad.
write_results() {
  local counts
  counts=$(python3 - "$results" "$final/results.json" "$failures" "$(($(date +%s) - t_start))" "$plan" <<'PY'
import json, os, sys
rows, bad = [], 0
for l in open(sys.argv[1]):
    if not l.strip():
        continue
    try:
        rows.append(json.loads(l))
    except ValueError:
        rows.append({"check": "unreadable_row", "status": "fail", "row": l.strip()})
        bad += 1
cut = sum(1 for r in rows if isinstance(r, dict) and r.get("status") == "skip"
          and str(r.get("why", "")).startswith(("the deadline", "timed out")))
tmp = sys.argv[2] + ".tmp"
json.dump({"failures": int(sys.argv[3]) + bad, "seconds": int(sys.argv[4]), "cut_by_deadline": cut,
           "steps": sys.argv[5].split(), "results": rows}, open(tmp, "w"), indent=1)
os.replace(tmp, sys.argv[2])
print(bad, cut)
PY
)
  read -r bad cut <<<"$counts"
  bad=${bad:-1} cut=${cut:-0}
}

# finish: results.json and logs.tar.xz written, and the exit status
finish() {
  write_results
  [ "$bad" -gt 0 ] && echo "run.sh: $bad result row(s) were not JSON (kept as unreadable_row)"
  failures=$((failures + bad))
  python3 - "$out" "$final/logs.tar.xz" <<'PY' || echo "run.sh: could not pack the logs into $final/logs.tar.xz"
import os, sys, tarfile
# through Python's tarfile (the image may have no xz): files under 4 MiB,
# but token shards (.bin) and checkpoints (.safetensors, checkpoints/)
with tarfile.open(sys.argv[2], "w:xz") as t:
    for d, subs, files in os.walk(sys.argv[1]):
        subs[:] = sorted(s for s in subs if s != "checkpoints")
        for f in sorted(files):
            p = os.path.join(d, f)
            if f.endswith((".bin", ".safetensors")) or os.path.islink(p) or not os.path.isfile(p):
                continue
            if os.path.getsize(p) < 4 << 20:
                t.add(p, os.path.relpath(p, sys.argv[1]))
PY
  note "done: $failures failure(s), $cut check(s) cut by the deadline"
  [ "$failures" -eq 0 ] || exit 1
  [ "$cut" -eq 0 ] || exit 3
  exit 0
}

# stop_early CHECK LINE: the run stops before any check, LINE (one line)
# saying why; results.json and logs.tar.xz are still written
stop_early() {
  echo "run.sh: stopping before any check: $2"
  record "$1" fail "\"why\": \"$(jtext "$2")\""
  finish
}

# ---- 1. the build -----------------------------------------------------------
build=""
if [ -f "$root/build-gpu/CMakeCache.txt" ]; then
  recorded=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$root/build-gpu/CMakeCache.txt")
  if [ "$recorded" != "$root" ]; then
    # the carried build's paths (ctest files, plugin dirs) name `recorded`
    if [ ! -e "$recorded" ]; then mkdir -p "$(dirname "$recorded")" 2>/dev/null && ln -s "$root" "$recorded" 2>/dev/null; fi
  fi
  if [ -n "$recorded" ] && [ -d "$recorded/build-gpu" ]; then
    build="$recorded/build-gpu"; root="$recorded"
  else
    # The recorded path could not be linked here (no right to create it,
    # or another folder already there): the CTest files, the one place
    # ctest reads those paths from, are rewritten to this checkout (a copy
    # the device tool made, or the one just unpacked). The binaries find
    # their plugins beside themselves and their libraries in the carried
    # ones, so they need no rewriting.
    echo "-- note: the build records ${recorded:-no checkout}, which cannot be linked to $root here: its CTest files are rewritten to $root"
    if [ -n "$recorded" ] && find "$root/build-gpu" -name CTestTestfile.cmake -exec sed -i "s|$recorded|$root|g" {} +; then
      build="$root/build-gpu"
    fi
  fi
fi

# ---- 2. libraries -------------------------------------------------------------
if [ -f "$root/.gpu/deps.tar.xz" ]; then
  if ! { mkdir -p /tmp/kiln-deps && untar "$root/.gpu/deps.tar.xz" /tmp/kiln-deps data; }; then
    stop_early deps "could not unpack $root/.gpu/deps.tar.xz into /tmp/kiln-deps (the error above): kiln would miss the Debian libraries it links"
  fi
  export LD_LIBRARY_PATH="/tmp/kiln-deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export LD_LIBRARY_PATH # (the CUDA folders were added in step 0)

if [ -z "$build" ]; then
  note "no carried build: building here"
  build="$root/build-gpu"
  if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="80-real;90" >"$out/cmake.log" 2>&1 &&
     cmake --build "$build" -j"$(nproc)" >>"$out/cmake.log" 2>&1; then
    record build pass
  else
    tail -30 "$out/cmake.log"
    record build fail
  fi
else
  record build pass "\"from\": \"carried $build\""
fi
kiln="$build/bin/kiln"
[ -x "$kiln" ] || stop_early build "no $kiln"

# every library the programs that every step runs need, with the final
# LD_LIBRARY_PATH: a missing one ("=> not found"), or a glibc or libstdc++
# older than the build's ("version `GLIBC_2.38' not found"), would fail
# every check that loads it, each with its own error
note "the libraries the build links (ldd)"
if command -v ldd >/dev/null; then
  for f in "$kiln" "$build"/lib/kiln/plugins/*cuda*.so "$build/lib/kiln/plugins/libkiln-ddp.so" \
           "$build/tests/test_cuda_kernels"; do
    [ -f "$f" ] || continue
    lost=$(bounded 30 ldd "$f" 2>&1 | grep -E 'not found|version `GLIBC' | sed 's/^[[:space:]]*//; s/ (0x[0-9a-f]*)//' | head -3 | paste -s -d ';' -)
    [ -z "$lost" ] || stop_early libraries "${f#"$build"/} cannot load: $lost"
    echo "-- ldd ${f#"$build"/}: every library found"
  done
else
  echo "-- ldd: not on this machine: the build's libraries are not checked before the runs"
fi

# kiln plugins list, over every plugin folder the run uses: a refused
# plugin (the loader refuses plugins, and folders, writable by group or
# others or owned by another user than root or this one, ancestors
# included) would fail every run that needs it
note "kiln plugins list"
rc=0
KILN_PLUGIN_PATH="$build/nf4:$build/bench/plugins" bounded 60 "$kiln" plugins list >"$out/plugins.txt" 2>&1 || rc=$?
grep -v '^      ' "$out/plugins.txt"
refused=$( { awk '/^refused \(/ {f = 1; next} /^[^ ]/ {f = 0} f' "$out/plugins.txt"; grep '^kiln: warning: refusing' "$out/plugins.txt"; } |
          sed 's/^[[:space:]]*//' | head -1)
if [ -n "$refused" ]; then
  stop_early plugins_list "kiln refused a plugin: $refused (this checkout's owner and permissions on the GPU machine were not known beforehand; the loader wants plugin files and folders, and the folders above them, writable by their owner only and owned by root or uid $(id -u))"
elif [ "$rc" -ne 0 ]; then
  stop_early plugins_list "kiln plugins list failed (exit status $rc): $(tail -1 "$out/plugins.txt")"
elif ! grep -q -E '^ +accelerator +cuda ' "$out/plugins.txt"; then
  stop_early plugins_list "kiln plugins list does not list the cuda accelerator"
fi
record plugins_list pass
bounded 30 nvidia-smi -L || true
bounded 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true

# outcome NAME STATUS LIMIT [WANT]: NAME recorded as passed (STATUS 0), or
# failed, saying when it was the time limit (LIMIT s) that ended it; or
# skipped, when that limit was the deadline's, under the run's own WANT
outcome() {
  if [ "$2" -eq 0 ]; then record "$1" pass
  elif gpu_timed_out "$2" && [ -n "${4:-}" ] && [ "$3" -lt "$4" ]; then record "$1" skip "$(gpu_cut_why "$3" "$4")"
  elif gpu_timed_out "$2"; then record "$1" fail "\"why\": \"timed out after $3 s\""
  else record "$1" fail; fi
}
# budget NAME WANT MIN [HOLD]: the seconds step NAME may take (gpu_budget,
# HOLD kept back for what follows in the same step), or NAME recorded as
# skipped for the deadline (the run then exits 3 if nothing failed) when
# the deadline leaves under MIN
budget() {
  local t
  if t=$(gpu_budget "$2" "$3" "${4:-0}"); then echo "$t"; return 0; fi
  record "$1" skip "$(gpu_skip_why)" >&2
  return 1
}
# scripted NAME SECONDS MIN ROWS SCRIPT ARGS...: `bash SCRIPT ARGS` under a
# time limit cut to the deadline (which the script sees, less a reserve
# for its own report), recorded as NAME pass or fail, then the rows it left
# in $out/ROWS (JSON lines) added to the results
scripted() {
  local name=$1 rows=$4 t
  t=$(budget "$name" "$2" "$3") || return 0
  shift 4
  KILN_GPU_DEADLINE=$(($(date +%s) + t)) timeout -k 5 "$((t + 10))" bash "$@"
  outcome "$name" $? "$((t + 10))"
  cat "$out/$rows" >>"$results" 2>/dev/null
}

# ---- 3. GPU tests ---------------------------------------------------------------
# ctest -L gpu and then test_cuda_math, under one time limit
step_kernels() {
  local t
  note "GPU tests"
  t=$(budget ctest_gpu 300 30) || return 0
  KILN_GPU_TEST_REQUIRE=1 timeout -k 10 "$t" bash -c \
    'ctest --test-dir "$1" -L gpu --output-on-failure && ctest --test-dir "$1" -R test_cuda_math --output-on-failure' \
    ctest_gpu "$build"
  outcome ctest_gpu $? "$t" 300
}

# ---- 3, under compute-sanitizer ----------------------------------------------------
# memcheck on every kernel; then the fused attention's shared memory on the
# hardware: racecheck (hazards between the threads of a block; the host
# emulation checks the same program's phases, this checks what the GPU
# really ran) and memcheck, on the attention case alone with attention =
# "flash". memcheck runs with the plugin's `caching` off
# (KILN_GPU_TEST_CACHING=0): each tensor its own exact-size cudaMalloc, so
# an overrun cannot land unseen in a rounded block's slack. memcheck keeps
# 45 s for the two flash runs (20 s each, their least, and the slack of a
# stopped tool), racecheck 20 s for the last, as far as their own least
# time allows (gpu_budget).
# sanitizer_refused LOG: compute-sanitizer could not run on this device at
# all (seen in gVisor sandboxes: "Device not supported"), which says
# nothing about kiln: the step is then skipped with that reason
sanitizer_refused() { grep -q -i "device not supported" "$1"; }
refused_why='"why": "compute-sanitizer: device not supported on this machine"'
# sanitizer_found LOG: the tool reported an error before it was stopped
sanitizer_found() {
  grep -q -E '^=+ +(Invalid (__global__|__shared__|__local__)|(Error|ERROR): Race reported|Race reported|Uninitialized __global__|Barrier error|Warning: .*hazard)' "$1"
}
# sanitized NAME SECONDS ENV...: test_cuda_kernels under compute-sanitizer
# (NAME flash_TOOL or TOOL) with the environment ENV, into $out/NAME.txt;
# recorded as passed, failed, skipped when the device is refused (status
# 2), or skipped as timed out when its limit stopped it before it reported
# any error (a slow tool is not a finding)
sanitized() {
  local name=$1 t=$2 rc=0
  shift 2
  env KILN_GPU_TEST_REQUIRE=1 KILN_GPU_TEST_CACHING=0 KILN_PLUGIN_DIR="$build/lib/kiln/plugins" "$@" \
    timeout -k 10 "$t" compute-sanitizer --tool "${name#flash_}" --error-exitcode 9 \
    "$build/tests/test_cuda_kernels" >"$out/$name.txt" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then record "$name" pass
  elif sanitizer_refused "$out/$name.txt"; then return 2
  elif gpu_timed_out "$rc" && ! sanitizer_found "$out/$name.txt"; then
    tail -5 "$out/$name.txt"; record "$name" skip "\"why\": \"timed out after $t s\""
  elif gpu_timed_out "$rc"; then
    tail -40 "$out/$name.txt"; record "$name" fail "\"why\": \"timed out after $t s, having reported errors\""
  else
    tail -40 "$out/$name.txt"; record "$name" fail
  fi
  return 0
}
step_sanitizers() {
  local t tool fmin=${KILN_GPU_TEST_MIN:-20}
  if ! command -v compute-sanitizer >/dev/null || [ ! -x "$build/tests/test_cuda_kernels" ]; then
    record memcheck skip "\"why\": \"no compute-sanitizer or no test_cuda_kernels\""
    return 0
  fi
  note "compute-sanitizer memcheck"
  if t=$(budget memcheck 180 30 $((2 * fmin + 5))); then
    sanitized memcheck "$t"
    if [ $? -eq 2 ]; then
      for tool in memcheck flash_racecheck flash_memcheck; do record "$tool" skip "$refused_why"; done
      return 0
    fi
  fi
  note "compute-sanitizer racecheck, attention = flash"
  if t=$(budget flash_racecheck 150 20 "$fmin"); then
    sanitized flash_racecheck "$t" KILN_GPU_TEST_ATTENTION=flash KILN_GPU_TEST_ONLY=attention
    [ $? -eq 2 ] && record flash_racecheck skip "$refused_why"
  fi
  note "compute-sanitizer memcheck, attention = flash"
  if t=$(budget flash_memcheck 150 20); then
    sanitized flash_memcheck "$t" KILN_GPU_TEST_ATTENTION=flash KILN_GPU_TEST_ONLY=attention
    [ $? -eq 2 ] && record flash_memcheck skip "$refused_why"
  fi
}

# ---- 4. Fashion-MNIST on the GPU ------------------------------------------------
fm=${KILN_FM_DIR:-}
for d in "$root/.gpu/fashion-mnist" /usr/share/datasets/fashion-mnist; do
  [ -z "$fm" ] && [ -f "$d/train-images-idx3-ubyte.gz" ] && fm=$d
done
# fit NAME PRECISION [extra --set ...]: 2 epochs, each run checked against
# the budget before it starts (150 s at most, 20 s at least); its log is
# $out/runs_NAME.txt, its metrics.csv under $out/runs_NAME/. Sets fit_done
# (1 when kiln finished). A run its limit ended is skipped for the
# deadline when the deadline had cut that limit, failed otherwise.
fit() {
  local name=$1 prec=$2 t rc=0
  shift 2
  local dir="$out/runs_$name"
  fit_done=0
  t=$(budget "fit_$name" 150 20) || return 0
  note "fit $name ($prec)"
  timeout -k 10 "$t" "$kiln" fit "$root/examples/fashion_mnist.cfg" --test \
    --set accelerator=cuda --set precision="$prec" --set data.dir="$fm" --set data.val_split=2000 \
    --set trainer.max_epochs=2 --set trainer.default_root_dir="$dir" \
    --set trainer.num_sanity_val_steps=0 "$@" >"$dir.txt" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    fit_done=1
    local acc sps
    acc=$(grep -o 'test_acc[ =:]*[0-9.]*' "$dir.txt" | tail -1 | grep -o '[0-9.]*$')
    sps=$(grep -o '([0-9]* samples/s)' "$dir.txt" | tail -1 | grep -o '[0-9]*')
    tail -4 "$dir.txt"
    gpu_isnum "$acc" && fit_acc[$name]=$acc
    if gpu_isnum "$acc" && awk -v a="$acc" 'BEGIN { exit !(a >= 0.80) }'; then
      record "fit_$name" pass "\"precision\": \"$prec\", \"test_acc\": $acc, \"samples_per_s\": ${sps:-0}"
    else
      record "fit_$name" fail "\"precision\": \"$prec\", \"test_acc\": \"${acc:-none}\""
    fi
  elif gpu_timed_out "$rc" && [ "$t" -lt 150 ]; then
    tail -5 "$dir.txt"; record "fit_$name" skip "$(gpu_cut_why "$t" 150), \"precision\": \"$prec\""
  elif gpu_timed_out "$rc"; then
    tail -5 "$dir.txt"; record "fit_$name" fail "\"precision\": \"$prec\", \"why\": \"timed out after $t s\""
  else
    tail -20 "$dir.txt"; record "fit_$name" fail "\"precision\": \"$prec\""
  fi
}
declare -A fit_acc # NAME -> test_acc of the fits that finished
# The precisions against fp32 (the same data, seed and 2 epochs). 0.80 alone
# is loose: training the last layer on random ReLU features reaches about
# that, so a broken hidden-layer gradient could pass it; a precision that
# learns clearly less than fp32 fails here. Margins below fp32 (a better
# accuracy always passes): tf32 and fp64 0.01, bf16 and fp16 0.015 (their
# rounding), nf4 0.03 (4-bit weights). Precisions that did not finish are
# left out (their own rows say why).
fashion_vs_fp32() {
  local ref=${fit_acc[fp32]:-} spec name lim a bad="" fields=""
  if ! gpu_isnum "$ref"; then
    record fashion_vs_fp32 skip "\"why\": \"no fp32 accuracy to compare with\""
    return 0
  fi
  for spec in tf32:0.01 fp64:0.01 bf16:0.015 fp16:0.015 nf4:0.03; do
    name=${spec%%:*} lim=${spec#*:} a=${fit_acc[${spec%%:*}]:-}
    gpu_isnum "$a" || continue
    fields+=", \"$name\": $a"
    awk -v a="$a" -v r="$ref" -v l="$lim" 'BEGIN { exit !(a >= r - l) }' || bad+=" $name"
  done
  if [ -n "$bad" ]; then
    record fashion_vs_fp32 fail "\"fp32\": $ref$fields, \"why\": \"more than its margin below fp32:$bad\""
  else
    record fashion_vs_fp32 pass "\"fp32\": $ref$fields"
  fi
}
step_fashion() {
  if [ -z "$fm" ]; then
    record fashion_mnist skip "\"why\": \"no Fashion-MNIST (run tests/gpu/prepare.sh and carry .gpu)\""
    return 0
  fi
  fit fp32 32-true
  fit fp16 16-mixed
  fit bf16 bf16-mixed
  fit fp64 64-true
  fit tf32 32-true --set accelerator.tf32=true
  # the out-of-tree 4-bit precision (prepare.sh builds it from the SDK)
  if [ -f "$build/nf4/libkiln-nf4.so" ]; then
    local nf4_done m_gpu m_host
    KILN_PLUGIN_PATH="$build/nf4" fit nf4 nf4
    nf4_done=$fit_done
    # its own CUDA kernel against its host path: the same run must give the
    # same metrics bit for bit (the kernel reproduces nf4_quant.c exactly)
    KILN_PLUGIN_PATH="$build/nf4" fit nf4_host nf4 --set precision.cuda_kernel=false
    m_gpu=$(grep '^metrics:' "$out/runs_nf4.txt" 2>/dev/null | tail -1)
    m_host=$(grep '^metrics:' "$out/runs_nf4_host.txt" 2>/dev/null | tail -1)
    if [ "$nf4_done" != 1 ] || [ "$fit_done" != 1 ]; then
      record nf4_cuda_kernel skip "\"why\": \"fit_nf4 and fit_nf4_host did not both finish (their rows say why)\""
    elif grep -q "quantizing on the GPU with the plugin's CUDA kernel" "$out/runs_nf4.txt" && [ -n "$m_gpu" ] &&
         [ "$m_gpu" = "$m_host" ]; then
      record nf4_cuda_kernel pass
    else
      echo "nf4 kernel vs host: '$m_gpu' / '$m_host'"; record nf4_cuda_kernel fail
    fi
  else
    record fit_nf4 skip "\"why\": \"build-gpu/nf4 not built (rerun tests/gpu/prepare.sh)\""
  fi
  fashion_vs_fp32
  if [ -f "$build/lib/kiln/plugins/libkiln-ddp.so" ]; then
    # ddp over NCCL: a collective or NCCL's init waits 60 s at most (kiln's
    # default is 1800 s), and NCCL says where it stopped (NCCL_DEBUG=WARN,
    # into the run's log)
    # the MPI bootstrap as a singleton (no mpirun): MPI_Init needs Open MPI's
    # plugin folder and orted on this machine, which prepare.sh does not
    # carry (only the libraries ldd lists), of the carried libmpi's version
    # (step 0 says why it is skipped otherwise)
    if [ -z "$mpi_skip_why" ]; then
      NCCL_DEBUG=WARN fit ddp_nccl 32-true --set strategy=ddp --set strategy.timeout_s=60
    else
      echo "-- fit_ddp_nccl: skipped: $mpi_skip_why; fit_ddp_tcp below takes the same NCCL path"
      record fit_ddp_nccl skip "\"why\": \"$(jtext "$mpi_skip_why")\""
    fi
    # the launch without MPI: torchrun's variables pick bootstrap "tcp", and
    # metrics, barriers and plugin collectives run on NCCL too
    NCCL_DEBUG=WARN RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
      fit ddp_tcp 32-true --set strategy=ddp --set strategy.timeout_s=60
  else
    record fit_ddp_nccl skip "\"why\": \"ddp not built (no MPI)\""
  fi
}

# ---- 5. benchmark ---------------------------------------------------------------
step_bench() {
  if [ -z "$fm" ]; then
    record bench skip "\"why\": \"no Fashion-MNIST (run tests/gpu/prepare.sh and carry .gpu)\""
    return 0
  fi
  note "GPU benchmark"
  KILN_FM_DIR="$fm" scripted bench 240 40 bench.jsonl "$root/bench/gpu/run.sh" "$build" "$out"
}

# ---- 4b. the transformer on the GPU -----------------------------------------------
step_gpt() {
  note "transformer checks"
  scripted gpt_checks 420 60 gpt.jsonl "$root/tests/gpu/gpt_checks.sh" "$build" "$out"
}

# ---- 5b. GPT-2 124M benchmark -----------------------------------------------------
step_gpt2() {
  note "GPT-2 124M benchmark"
  scripted bench_gpt2_run 360 60 bench_gpt2.jsonl "$root/bench/gpu/gpt2.sh" "$build" "$out"
}

# ---- the steps, each in its share of the time (tests/gpu/lib.sh) --------------------
if [ "$run_deadline" -gt 0 ]; then note "steps: $plan; the deadline in $(gpu_left) s"; else note "steps: $plan"; fi
set -- $plan
while [ $# -gt 0 ]; do
  step=$1
  shift
  if [ "$run_deadline" -gt 0 ]; then
    KILN_GPU_DEADLINE=$(gpu_window "$step" "$@")
    note "step $step: $(($(gpu_left) - ${KILN_GPU_RESERVE:-15})) s, its share of the $(($(date +%s) > run_deadline ? 0 : run_deadline - $(date +%s))) s left"
  fi
  "step_$step"
  KILN_GPU_DEADLINE=$run_deadline
  write_results
done
finish
