#!/usr/bin/env bash
# tests/gpu/run.sh OUT — the GPU check, one prepared script for a machine
# with one NVIDIA GPU (sized for an H200: under 8 minutes). It:
#   1. finds the build: build-gpu/ made by tests/gpu/prepare.sh (carried in;
#      the checkout is linked at the path that build recorded), else builds
#      one here (needs libconfig, CUnit and OpenBLAS development files);
#   2. unpacks .gpu/deps.tar.xz (libraries the machine may lack) to /tmp and
#      finds the CUDA libraries (toolkit, or the nvidia-* Python wheels);
#   3. runs the GPU tests: kernels/cuda's host-side math test, then every
#      kiln_kernels entry of the cuda accelerator against the cpu one
#      (ctest -L gpu), then the same under compute-sanitizer memcheck;
#   4. trains Fashion-MNIST briefly on the GPU in every precision (and once
#      under the ddp strategy, which uses NCCL for device memory);
#      and again launched without MPI (torchrun-style variables, bootstrap tcp);
#   5. runs the GPU benchmark (bench/gpu/run.sh);
# and writes OUT/gpu.log (everything printed) and OUT/results.json (each
# step's status and figures). Exit status: 0 when every check passed.
#   bash tests/gpu/run.sh "$OUT"
set -uo pipefail
out=${1:?usage: tests/gpu/run.sh OUTDIR}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
exec > >(tee -a "$out/gpu.log") 2>&1
t_start=$(date +%s)
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
  mkdir -p /tmp/kiln-deps && tar -C /tmp/kiln-deps -xJf "$root/.gpu/deps.tar.xz"
  export LD_LIBRARY_PATH="/tmp/kiln-deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; p = nvidia.__path__[0]; print(" ".join(os.path.join(p, s, "lib") for s in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && ls "$d" | grep -q -E 'lib(cublasLt|cudart|nccl)\.so' && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
export LD_LIBRARY_PATH
export PATH="/usr/local/cuda/bin:$PATH"

if [ -z "$build" ]; then
  note "no carried build: building here"
  build="$root/build-gpu"
  if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/cmake.log" 2>&1 &&
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

# ---- 3. GPU tests ---------------------------------------------------------------
note "GPU tests"
if KILN_GPU_TEST_REQUIRE=1 timeout 240 ctest --test-dir "$build" -L gpu --output-on-failure &&
   timeout 60 ctest --test-dir "$build" -R test_cuda_math --output-on-failure; then
  record ctest_gpu pass
else
  record ctest_gpu fail
fi
if command -v compute-sanitizer >/dev/null && [ -x "$build/tests/test_cuda_kernels" ]; then
  note "compute-sanitizer memcheck"
  if KILN_GPU_TEST_REQUIRE=1 KILN_PLUGIN_DIR="$build/lib/kiln/plugins" timeout 180 compute-sanitizer --tool memcheck --error-exitcode 9 \
       "$build/tests/test_cuda_kernels" >"$out/memcheck.txt" 2>&1; then
    record memcheck pass
  else
    tail -40 "$out/memcheck.txt"; record memcheck fail
  fi
else
  record memcheck skip
fi

# ---- 4. Fashion-MNIST on the GPU ------------------------------------------------
fm=${KILN_FM_DIR:-}
for d in "$root/.gpu/fashion-mnist" /usr/share/datasets/fashion-mnist; do
  [ -z "$fm" ] && [ -f "$d/train-images-idx3-ubyte.gz" ] && fm=$d
done
fit() { # name precision [extra --set ...]
  local name=$1 prec=$2; shift 2
  local dir="$out/runs_$name"
  note "fit $name ($prec)"
  if timeout 150 "$kiln" fit "$root/examples/fashion_mnist.cfg" --test \
      --set accelerator=cuda --set precision="$prec" --set data.dir="$fm" --set data.val_split=2000 \
      --set trainer.max_epochs=2 --set trainer.default_root_dir="/tmp/kiln-gpu-runs/$name" \
      --set trainer.num_sanity_val_steps=0 "$@" >"$dir.txt" 2>&1; then
    local acc sps
    acc=$(grep -o 'test_acc[ =:]*[0-9.]*' "$dir.txt" | tail -1 | grep -o '[0-9.]*$')
    sps=$(grep -o '([0-9]* samples/s)' "$dir.txt" | tail -1 | grep -o '[0-9]*')
    tail -4 "$dir.txt"
    if [ -n "$acc" ] && awk "BEGIN{exit !($acc >= 0.80)}"; then
      record "fit_$name" pass "\"precision\": \"$prec\", \"test_acc\": $acc, \"samples_per_s\": ${sps:-0}"
    else
      record "fit_$name" fail "\"precision\": \"$prec\", \"test_acc\": \"${acc:-none}\""
    fi
  else
    tail -20 "$dir.txt"; record "fit_$name" fail "\"precision\": \"$prec\""
  fi
}
if [ -n "$fm" ]; then
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
    m_gpu=$(grep '^metrics:' "$out/runs_nf4.txt" | tail -1) m_host=$(grep '^metrics:' "$out/runs_nf4_host.txt" | tail -1)
    if grep -q "quantizing on the GPU with the plugin's CUDA kernel" "$out/runs_nf4.txt" && [ -n "$m_gpu" ] &&
       [ "$m_gpu" = "$m_host" ]; then
      record nf4_cuda_kernel pass
    else
      echo "nf4 kernel vs host: '$m_gpu' / '$m_host'"; record nf4_cuda_kernel fail
    fi
  else
    record fit_nf4 skip "\"why\": \"build-gpu/nf4 not built (rerun tests/gpu/prepare.sh)\""
  fi
  if [ -f "$build/lib/kiln/plugins/libkiln-ddp.so" ]; then
    fit ddp_nccl 32-true --set strategy=ddp
    # the launch without MPI: torchrun's variables pick bootstrap "tcp", and
    # metrics, barriers and plugin collectives run on NCCL too
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 fit ddp_tcp 32-true --set strategy=ddp
  else
    record fit_ddp_nccl skip "\"why\": \"ddp not built (no MPI)\""
  fi
else
  record fashion_mnist skip "\"why\": \"no Fashion-MNIST (run tests/gpu/prepare.sh and carry .gpu)\""
fi

# ---- 5. benchmark ---------------------------------------------------------------
if [ -n "$fm" ]; then
  note "GPU benchmark"
  if KILN_FM_DIR="$fm" timeout 240 bash "$root/bench/gpu/run.sh" "$build" "$out" ; then
    record bench pass
  else
    record bench fail
  fi
  cat "$out/bench.jsonl" >>"$results" 2>/dev/null
fi

# ---- results ----------------------------------------------------------------------
python3 - "$results" "$out/results.json" "$failures" "$(($(date +%s) - t_start))" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump({"failures": int(sys.argv[3]), "seconds": int(sys.argv[4]), "results": rows}, open(sys.argv[2], "w"), indent=1)
PY
note "done: $failures failure(s)"
[ "$failures" -eq 0 ]
