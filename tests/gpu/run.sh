#!/usr/bin/env bash
# tests/gpu/run.sh OUT — the GPU check, one prepared script for a machine
# with one NVIDIA GPU. It:
#   0. checks what it needs from the machine, one line each: the driver's
#      CUDA version (nvidia-smi; not older than the build's toolkit),
#      libcudart, libcublasLt, libnccl, ctest and python3, and stops at once
#      naming what is missing (KILN_GPU_PREFLIGHT_ONLY=1: stop after this);
#   1. finds the build: build-gpu/ made by tests/gpu/prepare.sh (carried in;
#      the checkout is linked at the path that build recorded), else builds
#      one here (needs libconfig, CUnit and OpenBLAS development files);
#   2. unpacks .gpu/deps.tar.xz (libraries the machine may lack) to /tmp and
#      finds the CUDA libraries (toolkit, or the nvidia-* Python wheels);
#   3. runs the GPU tests: kernels/cuda's host-side math test, then every
#      kiln_kernels entry of the cuda accelerator against the cpu one
#      (ctest -L gpu, each attention path included), then the same under
#      compute-sanitizer memcheck, and the flash attention under racecheck
#      and memcheck;
#   4. trains Fashion-MNIST briefly on the GPU in every precision, and under
#      the ddp strategy (NCCL for device memory) launched without MPI
#      (torchrun-style variables, bootstrap tcp) and, where Open MPI is
#      installed (ompi_info), as a singleton MPI process (which needs Open
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
# Exit status: 0 when every check passed, 1 when one failed, 3 when none
# failed but the deadline cut some.
#   bash tests/gpu/run.sh OUT [STEPS] [--deadline SECONDS]
# STEPS (default all) is a comma-separated list of the steps kernels (3),
# sanitizers (3, under compute-sanitizer), fashion (4), bench (5), gpt (4b)
# and gpt2 (5b), or of the parts core (3-5) and transformer (4b, 5b); they
# run in the order kernels, gpt, gpt2, fashion, sanitizers, bench, the most
# telling first. --deadline (or KILN_GPU_DEADLINE_S) gives the run that many
# seconds: each step's time limit is cut to what is left, a step that no
# longer fits is recorded as skipped, and results.json is still written in
# time (tests/gpu/lib.sh). With a device tool that kills a command after 10
# minutes: `--deadline 570`, and rerun what was skipped or failed by name.
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
KILN_GPU_DEADLINE=0
[ "$deadline_s" -gt 0 ] && KILN_GPU_DEADLINE=$(($(date +%s) + deadline_s))
export KILN_GPU_DEADLINE
# OUT gets three files only (a device tool may bring back no more than a
# few, and none large): gpu.log as it is written, results.json after every
# step, and at the end logs.tar.xz, the work folder's files under 4 MiB
# (the logs, metrics and configs; no checkpoints or token shards). The
# steps write to the work folder in /tmp.
final=$out
mkdir -p "$final" || exit 2
out=$(mktemp -d /tmp/kiln-gpu-run-XXXXXX) || exit 2
trap 'rm -rf "$out"' EXIT
root=$(cd "$(dirname "$0")/../.." && pwd)
exec > >(tee -a "$final/gpu.log") 2>&1
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

# find_lib NAME: the first lib<NAME>.so* in LD_LIBRARY_PATH or the loader's cache
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
# the toolkit the carried build was compiled with (CMakeCache), else unknown
built_cuda=$(sed -n 's/^CMAKE_CUDA_COMPILER_VERSION:[A-Z]*=\([0-9]*\.[0-9]*\).*/\1/p' "$root/build-gpu/CMakeCache.txt" 2>/dev/null | head -1)
if command -v nvidia-smi >/dev/null; then
  drv_cuda=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9][0-9.]*' | head -1 | grep -o '[0-9][0-9.]*$')
  if [ -z "$drv_cuda" ]; then
    pre "driver (nvidia-smi)" missing "nvidia-smi gives no CUDA version (no driver loaded, or no GPU)"
  elif [ -n "$built_cuda" ] && awk -v d="$drv_cuda" -v b="$built_cuda" 'BEGIN {split(d, x, "."); split(b, y, "."); exit !(x[1] < y[1] || (x[1] == y[1] && x[2] < y[2]))}'; then
    pre "driver (nvidia-smi)" missing "the driver supports CUDA $drv_cuda, the build needs $built_cuda or newer"
  else
    pre "driver (nvidia-smi)" ok "CUDA $drv_cuda${built_cuda:+ (build: CUDA $built_cuda)}"
  fi
else
  pre "driver (nvidia-smi)" missing "nvidia-smi not found (no NVIDIA driver)"
fi
for l in cudart cublasLt nccl; do
  if f=$(find_lib "$l"); then pre "lib$l" ok "$f"; else pre "lib$l" missing "lib$l.so not in LD_LIBRARY_PATH, the toolkit or the loader's cache"; fi
done
for t in ctest python3; do
  if command -v "$t" >/dev/null; then pre "$t" ok "$(command -v "$t")"; else pre "$t" missing "$t not on PATH"; fi
done
# Open MPI is optional: without it the MPI-launched ddp run is skipped
if command -v ompi_info >/dev/null; then have_ompi=1; echo "-- Open MPI: $(command -v ompi_info)"
else have_ompi=0; echo "-- Open MPI: not installed (no ompi_info): the MPI-launched ddp run will be skipped; the torchrun-style launch covers the same NCCL path"; fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "run.sh: stopping before any check: this machine lacks ${missing[*]}"
  row="{\"check\": \"preflight\", \"status\": \"fail\", \"missing\": \"${missing[*]}\"}"
  echo "$row" >>"$results"
  echo "{\"failures\": 1, \"seconds\": $(($(date +%s) - t_start)), \"results\": [$row]}" >"$final/results.json"
  exit 1
fi
echo "{\"check\": \"preflight\", \"status\": \"pass\"}" >>"$results"
[ "${KILN_GPU_PREFLIGHT_ONLY:-0}" = 1 ] && exit 0

# ---- 1. the build -----------------------------------------------------------
build=""
if [ -f "$root/build-gpu/CMakeCache.txt" ]; then
  recorded=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$root/build-gpu/CMakeCache.txt")
  if [ "$recorded" != "$root" ]; then
    # the carried build's paths (ctest files, plugin dirs) name `recorded`
    if [ ! -e "$recorded" ]; then mkdir -p "$(dirname "$recorded")" && ln -s "$root" "$recorded"; fi
  fi
  if [ -d "$recorded/build-gpu" ]; then build="$recorded/build-gpu"; root="$recorded"; fi
fi

# ---- 2. libraries -------------------------------------------------------------
if [ -f "$root/.gpu/deps.tar.xz" ]; then
  # through Python's tarfile: the GPU machine's image may have no xz
  mkdir -p /tmp/kiln-deps && python3 - "$root/.gpu/deps.tar.xz" /tmp/kiln-deps <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    try:
        t.extractall(sys.argv[2], filter="data")
    except TypeError:  # a Python without extraction filters
        t.extractall(sys.argv[2])
PY
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
nvidia-smi -L || true
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
note "kiln plugins list"
if "$kiln" plugins list >"$out/plugins.txt" 2>&1 && grep -q -w cuda "$out/plugins.txt"; then
  record plugins_list pass
else
  cat "$out/plugins.txt"; record plugins_list fail
fi

# timed_out STATUS: timeout's status for a command it stopped (124, or 137
# when the command outlived the grace period and was killed)
timed_out() { [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; }
# outcome NAME STATUS SECONDS: NAME recorded as passed (STATUS 0), or
# failed, saying when it was the time limit that ended it
outcome() {
  if [ "$2" -eq 0 ]; then record "$1" pass
  elif timed_out "$2"; then record "$1" fail "\"why\": \"timed out after $3 s\""
  else record "$1" fail; fi
}
# budget NAME WANT MIN: the seconds step NAME may take (gpu_budget), or
# NAME recorded as skipped for the deadline (the run then exits 3 if
# nothing failed) when the deadline leaves under MIN
budget() {
  local t
  if t=$(gpu_budget "$2" "$3"); then echo "$t"; return 0; fi
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
step_kernels() {
  local t
  note "GPU tests"
  t=$(budget ctest_gpu 300 30) || return 0
  KILN_GPU_TEST_REQUIRE=1 timeout -k 10 "$t" ctest --test-dir "$build" -L gpu --output-on-failure &&
    timeout 60 ctest --test-dir "$build" -R test_cuda_math --output-on-failure
  outcome ctest_gpu $? "$t"
}

# ---- 3, under compute-sanitizer ----------------------------------------------------
# memcheck on every kernel; then the fused attention's shared memory on the
# hardware: racecheck (hazards between the threads of a block; the host
# emulation checks the same program's phases, this checks what the GPU
# really ran) and memcheck, on the attention case alone with attention =
# "flash". memcheck runs with the plugin's `caching` off
# (KILN_GPU_TEST_CACHING=0): each tensor its own exact-size cudaMalloc, so
# an overrun cannot land unseen in a rounded block's slack.
# sanitizer_refused LOG: compute-sanitizer could not run on this device at
# all (seen in gVisor sandboxes: "Device not supported"), which says
# nothing about kiln: the step is then skipped with that reason
sanitizer_refused() { grep -q -i "device not supported" "$1"; }
refused_why='"why": "compute-sanitizer: device not supported on this machine"'
step_sanitizers() {
  local t tool
  if ! command -v compute-sanitizer >/dev/null || [ ! -x "$build/tests/test_cuda_kernels" ]; then
    record memcheck skip "\"why\": \"no compute-sanitizer or no test_cuda_kernels\""
    return 0
  fi
  note "compute-sanitizer memcheck"
  if t=$(budget memcheck 180 60); then
    if KILN_GPU_TEST_REQUIRE=1 KILN_GPU_TEST_CACHING=0 KILN_PLUGIN_DIR="$build/lib/kiln/plugins" \
         timeout -k 10 "$t" compute-sanitizer --tool memcheck \
         --error-exitcode 9 "$build/tests/test_cuda_kernels" >"$out/memcheck.txt" 2>&1; then
      record memcheck pass
    elif sanitizer_refused "$out/memcheck.txt"; then
      for tool in memcheck flash_racecheck flash_memcheck; do record "$tool" skip "$refused_why"; done
      return 0
    else
      tail -40 "$out/memcheck.txt"; record memcheck fail
    fi
  fi
  for tool in racecheck memcheck; do
    note "compute-sanitizer $tool, attention = flash"
    t=$(budget "flash_$tool" 150 45) || continue
    if KILN_GPU_TEST_REQUIRE=1 KILN_GPU_TEST_ATTENTION=flash KILN_GPU_TEST_ONLY=attention KILN_GPU_TEST_CACHING=0 \
         KILN_PLUGIN_DIR="$build/lib/kiln/plugins" timeout -k 10 "$t" compute-sanitizer --tool "$tool" --error-exitcode 9 \
         "$build/tests/test_cuda_kernels" >"$out/flash_$tool.txt" 2>&1; then
      record "flash_$tool" pass
    elif sanitizer_refused "$out/flash_$tool.txt"; then
      record "flash_$tool" skip "$refused_why"
    else
      tail -40 "$out/flash_$tool.txt"; record "flash_$tool" fail
    fi
  done
}

# ---- 4. Fashion-MNIST on the GPU ------------------------------------------------
fm=${KILN_FM_DIR:-}
for d in "$root/.gpu/fashion-mnist" /usr/share/datasets/fashion-mnist; do
  [ -z "$fm" ] && [ -f "$d/train-images-idx3-ubyte.gz" ] && fm=$d
done
fit() { # name precision [extra --set ...]
  local name=$1 prec=$2 t; shift 2
  local dir="$out/runs_$name"
  t=$(budget "fit_$name" 150 20) || return 0
  note "fit $name ($prec)"
  local rc=0
  timeout -k 10 "$t" "$kiln" fit "$root/examples/fashion_mnist.cfg" --test \
    --set accelerator=cuda --set precision="$prec" --set data.dir="$fm" --set data.val_split=2000 \
    --set trainer.max_epochs=2 --set trainer.default_root_dir="/tmp/kiln-gpu-runs/$name" \
    --set trainer.num_sanity_val_steps=0 "$@" >"$dir.txt" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    local acc sps
    acc=$(grep -o 'test_acc[ =:]*[0-9.]*' "$dir.txt" | tail -1 | grep -o '[0-9.]*$')
    sps=$(grep -o '([0-9]* samples/s)' "$dir.txt" | tail -1 | grep -o '[0-9]*')
    tail -4 "$dir.txt"
    if gpu_isnum "$acc" && awk -v a="$acc" 'BEGIN { exit !(a >= 0.80) }'; then
      record "fit_$name" pass "\"precision\": \"$prec\", \"test_acc\": $acc, \"samples_per_s\": ${sps:-0}"
    else
      record "fit_$name" fail "\"precision\": \"$prec\", \"test_acc\": \"${acc:-none}\""
    fi
  elif timed_out "$rc"; then
    tail -5 "$dir.txt"; record "fit_$name" fail "\"precision\": \"$prec\", \"why\": \"timed out after $t s\""
  else
    tail -20 "$dir.txt"; record "fit_$name" fail "\"precision\": \"$prec\""
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
    KILN_PLUGIN_PATH="$build/nf4" fit nf4 nf4
    # its own CUDA kernel against its host path: the same run must give the
    # same metrics bit for bit (the kernel reproduces nf4_quant.c exactly)
    KILN_PLUGIN_PATH="$build/nf4" fit nf4_host nf4 --set precision.cuda_kernel=false
    local m_gpu m_host
    m_gpu=$(grep '^metrics:' "$out/runs_nf4.txt" 2>/dev/null | tail -1)
    m_host=$(grep '^metrics:' "$out/runs_nf4_host.txt" 2>/dev/null | tail -1)
    if [ ! -f "$out/runs_nf4_host.txt" ]; then
      : # skipped for the deadline (recorded by fit)
    elif grep -q "quantizing on the GPU with the plugin's CUDA kernel" "$out/runs_nf4.txt" && [ -n "$m_gpu" ] &&
         [ "$m_gpu" = "$m_host" ]; then
      record nf4_cuda_kernel pass
    else
      echo "nf4 kernel vs host: '$m_gpu' / '$m_host'"; record nf4_cuda_kernel fail
    fi
  else
    record fit_nf4 skip "\"why\": \"build-gpu/nf4 not built (rerun tests/gpu/prepare.sh)\""
  fi
  if [ -f "$build/lib/kiln/plugins/libkiln-ddp.so" ]; then
    # the MPI bootstrap as a singleton (no mpirun): MPI_Init needs Open MPI's
    # plugin folder and orted on this machine, which prepare.sh does not
    # carry (only the libraries ldd lists); without them it is skipped
    if [ "$have_ompi" = 1 ]; then
      fit ddp_nccl 32-true --set strategy=ddp
    else
      echo "-- fit_ddp_nccl: skipped: Open MPI is not installed here (no ompi_info); fit_ddp_tcp below takes the same NCCL path"
      record fit_ddp_nccl skip "\"why\": \"no Open MPI (ompi_info) on this machine\""
    fi
    # the launch without MPI: torchrun's variables pick bootstrap "tcp", and
    # metrics, barriers and plugin collectives run on NCCL too
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 fit ddp_tcp 32-true --set strategy=ddp
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
  KILN_FM_DIR="$fm" scripted bench 240 60 bench.jsonl "$root/bench/gpu/run.sh" "$build" "$out"
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

# ---- results ----------------------------------------------------------------------
# write_results: OUT/results.json from the rows so far. A check the
# deadline skipped did not pass, so the exit status says so (3); a row that
# is not JSON (a script's bug) is kept as a failed check of its own
# (unreadable_row), so that results.json is always written and the run
# cannot pass. Sets cut and bad.
write_results() {
  cut=$(grep -c '"why": "the deadline' "$results")
  bad=$(python3 - "$results" "$final/results.json" "$failures" "$(($(date +%s) - t_start))" "$cut" "$plan" <<'PY'
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
tmp = sys.argv[2] + ".tmp"
json.dump({"failures": int(sys.argv[3]) + bad, "seconds": int(sys.argv[4]), "cut_by_deadline": int(sys.argv[5]),
           "steps": sys.argv[6].split(), "results": rows}, open(tmp, "w"), indent=1)
os.replace(tmp, sys.argv[2])
print(bad)
PY
)
}

if [ "$KILN_GPU_DEADLINE" -gt 0 ]; then note "steps: $plan; the deadline in $(gpu_left) s"; else note "steps: $plan"; fi
for step in $plan; do "step_$step"; write_results; done
[ "${bad:-0}" -gt 0 ] && echo "run.sh: $bad result row(s) were not JSON (kept as unreadable_row)"
failures=$((failures + ${bad:-1}))
python3 - "$out" "$final/logs.tar.xz" <<'PY' || echo "run.sh: could not pack the logs into $final/logs.tar.xz"
import os, sys, tarfile
# through Python's tarfile (the image may have no xz): files under 4 MiB
with tarfile.open(sys.argv[2], "w:xz") as t:
    for d, _, files in os.walk(sys.argv[1]):
        for f in sorted(files):
            p = os.path.join(d, f)
            if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) < 4 << 20:
                t.add(p, os.path.relpath(p, sys.argv[1]))
PY
note "done: $failures failure(s), $cut check(s) cut by the deadline"
[ "$failures" -eq 0 ] || exit 1
[ "$cut" -eq 0 ] || exit 3
