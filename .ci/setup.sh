#!/usr/bin/env bash
# kiln's set-up on a fresh Debian 12 machine, in two commands (README):
#
#   bash .ci/setup.sh run    install what is missing, build, train the default
#                            job (Fashion-MNIST on the CPU)
#   bash .ci/setup.sh test   the same, then every test: the CUnit suites with
#                            warnings as errors, again under ASan+UBSan, and
#                            an out-of-tree plugin built against the installed
#                            SDK and loaded by the installed kiln
#
# Idempotent: packages already present are not reinstalled, build folders are
# reused. Runs as root or through sudo for apt-get.
set -euo pipefail
mode=${1:-run}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)

# ---------------------------------------------------------------- packages
pkgs=(build-essential cmake pkg-config libconfig-dev libcunit1-dev libopenblas-dev libblis4-serial zlib1g-dev
      libopenmpi-dev openmpi-bin dataset-fashion-mnist python3 python3-numpy libpng-dev libxxhash-dev libssl-dev libjansson-dev)
# the tests also need: the fortunes texts (the GPT demo), Debian's PyTorch
# (the gpt module is checked against it), venv (transformers from PyPI), and
# clang with its libFuzzer runtime (a Recommends of clang-14, which
# --no-install-recommends skips) for the fuzz step
[ "$mode" = test ] && pkgs+=(fortunes python3-torch python3-venv clang libclang-rt-14-dev slurm-wlm munge)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ---------------------------------------------------------------- build
echo "== building (build/)"
cmake --preset ci >/dev/null
cmake --build --preset ci -j "$jobs"

run_default_job() {
  echo "== training the default job: examples/fashion_mnist.cfg"
  ./build/bin/kiln fit examples/fashion_mnist.cfg --test --set "trainer.default_root_dir=\"$root/build/runs\"" \
    | tee build/default-job.log
  # the default job must reach 88% test accuracy (README)
  python3 - build/default-job.log <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.findall(r"test_acc=([0-9.]+)", text)
if not m:
    sys.exit("default job: no test_acc in the summary")
acc = float(m[-1])
print(f"default job: test accuracy {acc:.4f}")
sys.exit(0 if acc >= 0.88 else f"default job: test accuracy {acc:.4f} < 0.88")
PY
  # the checkpoint the fit wrote evaluates to the same accuracy later
  ./build/bin/kiln test examples/fashion_mnist.cfg --ckpt last --set "trainer.default_root_dir=\"$root/build/runs\"" \
    | tee build/default-job-test.log
  python3 - build/default-job.log build/default-job-test.log <<'PY'
import re, sys
a, b = (re.findall(r"test_acc=([0-9.]+)", open(f).read())[-1] for f in sys.argv[1:3])
print(f"test --ckpt last: test accuracy {b} (fit --test: {a})")
sys.exit(0 if a == b else "the saved checkpoint does not reproduce the fit's test accuracy")
PY
  # the checkpoint is plain safetensors: read it with an independent reader
  # (docs/checkpoints.md) and check names, shapes and the metadata
  ck=$(ls -d "$root"/build/runs/version_* | sort -V | tail -1)/checkpoints/last.safetensors
  /usr/bin/python3 - "$ck" <<'PY'
import json, struct, sys, numpy as np
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n)); data = f.read()
meta = header.pop("__metadata__")
want = {"layers.0.weight": [1024, 784], "layers.0.bias": [1024], "layers.1.weight": [1024, 1024],
        "layers.1.bias": [1024], "layers.2.weight": [10, 1024], "layers.2.bias": [10]}
for k, shape in want.items():
    v = header[k]
    a, b = v["data_offsets"]
    x = np.frombuffer(data[a:b], np.float32).reshape(v["shape"])
    assert v["dtype"] == "F32" and v["shape"] == shape and np.isfinite(x).all(), k
assert meta["format"] == "kiln-checkpoint-1" and json.loads(meta["progress"])["format"] == "kiln-progress-2", meta
end = max(v["data_offsets"][1] for v in header.values())
assert end == len(data), (end, len(data))
print(f"checkpoint read back with numpy: {len(header)} tensors, stack {meta['stack']}")
PY
}

if [ "$mode" = run ]; then
  run_default_job
  exit 0
fi
if [ "$mode" != test ]; then
  echo "usage: bash .ci/setup.sh run|test" >&2
  exit 2
fi

# ---------------------------------------------------------------- tests
# transformers for the Hugging Face check (tests/gpt_torch/check_gpt_hf.py),
# from PyPI into a virtual environment over Debian's torch and numpy: 4.40 is
# the last line that runs on torch 1.13. Test-time only; kiln never needs it.
venv="$root/build/hf-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import transformers, safetensors" 2>/dev/null; then
  echo "== virtual environment for the transformers check ($venv)"
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "transformers==4.40.2" "safetensors>=0.4,<0.5"
fi
export KILN_HF_VENV="$venv"

echo "== tests (warnings as errors)"
ctest --preset ci -j "$jobs"

echo "== tests under ASan+UBSan (build-asan/)"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --preset asan -j "$jobs"

# a second compiler: Debian 12's clang 14 has no _Float16 on x86-64, so this
# builds the integer float16 conversions of kernels/cpu, and its warnings
# differ from gcc's (-Werror here too)
echo "== clang build (build-clang/, no CUDA) and the unit tests"
cmake -S . -B build-clang -DCMAKE_C_COMPILER=clang -DKILN_ENABLE_CUDA=OFF -DKILN_WERROR=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-clang -j "$jobs"
ctest --test-dir build-clang -L unit -j "$jobs" --output-on-failure

echo "== fuzz: each libFuzzer target for 25 s (tests/fuzz/run.sh; longer: --seconds N)"
bash tests/fuzz/run.sh --seconds 25 --jobs 2

echo "== SDK package: install, build examples/hello-plugin out of tree, load it"
prefix=$(mktemp -d /tmp/kiln-prefix.XXXXXX)
chmod 755 "$prefix"
trap 'rm -rf "$prefix"' EXIT
cmake --install build --prefix "$prefix" >/dev/null
# every installed header alone under strict C11, and what they define runs
bash tests/sdk_headers/check_headers.sh "$prefix/include" tests/sdk_headers/headers_run.c cc
cmake -S examples/hello-plugin -B "$prefix/hello-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
cmake --build "$prefix/hello-build"
# its test, under the installed test host (kiln/testing.h, Kiln::testing)
ctest --test-dir "$prefix/hello-build" --output-on-failure
cmake --install "$prefix/hello-build" >/dev/null
"$prefix/bin/kiln" plugins check "$prefix/hello-build/libkiln-hello.so"
"$prefix/bin/kiln" plugins list | tee "$prefix/list.txt"
grep -q "callback     hello" "$prefix/list.txt"
pcdir=$(pkg-config --variable=plugindir "$prefix/lib/pkgconfig/kiln.pc")
[ "$(realpath "$pcdir")" = "$(realpath "$prefix/lib/kiln/plugins")" ] || { echo "kiln.pc plugindir is $pcdir" >&2; exit 1; }
# the same plugin built with pkg-config alone, no CMake
cc -shared -fPIC -fvisibility=hidden $(pkg-config --cflags "$prefix/lib/pkgconfig/kiln.pc") \
  examples/hello-plugin/hello.c -o "$prefix/libkiln-hello-pc.so" -Wl,-z,defs -Wl,--require-defined=kiln_plugin_init_v1
"$prefix/bin/kiln" plugins check "$prefix/libkiln-hello-pc.so" >/dev/null
# ... and its test, built against the installed test host with pkg-config alone
tpc="$prefix/lib/pkgconfig"
cc -std=c11 -Wall -Wextra -Werror $(PKG_CONFIG_PATH="$tpc" pkg-config --cflags kiln-testing) \
  -DHELLO_PLUGIN_PATH="\"$prefix/libkiln-hello-pc.so\"" examples/hello-plugin/tests/test_hello.c \
  -o "$prefix/test_hello_pc" $(PKG_CONFIG_PATH="$tpc" pkg-config --libs kiln-testing)
"$prefix/test_hello_pc" >/dev/null
echo "installed SDK: ok"

# example_plugin DIR BUILD WERROR_OPTION LIBRARY LIST_PATTERN: examples/plugins/DIR built out of tree
# in $prefix/BUILD-build against the installed SDK alone, warnings as errors, its tests run (ctest),
# LIBRARY checked by the installed kiln, and the installed kiln lists it (LIST_PATTERN)
example_plugin() {
  local out="$prefix/$2-build"
  cmake -S "examples/plugins/$1" -B "$out" -DCMAKE_PREFIX_PATH="$prefix" "-D$3=ON" >/dev/null
  cmake --build "$out"
  ctest --test-dir "$out" --output-on-failure
  "$prefix/bin/kiln" plugins check "$out/$4"
  KILN_PLUGIN_PATH="$out" "$prefix/bin/kiln" plugins list | grep -E "$5"
}

# fake_cuda_fit BUILD CONFIG OUT [--set ...]: a short fit of CONFIG with the plugin in $prefix/BUILD-build on
# the fake cuda accelerator (device pointers the fake checks), its output in $prefix/OUT.txt; a contract
# violation the fake reports fails it
fake_cuda_fit() {
  local build="$prefix/$1-build" cfg=$2 out="$prefix/$3.txt"
  shift 3
  KILN_FAKE_CUDA_QUIET=0 KILN_PLUGIN_PATH="$build:$fake" "$prefix/bin/kiln" fit "$cfg" \
    --set 'accelerator="cudafake:cuda"' --set trainer.max_epochs=1 --set trainer.limit_train_batches=10 \
    --set trainer.limit_val_batches=0 "$@" --set "trainer.default_root_dir=\"${out%.txt}-runs\"" > "$out" 2>&1 ||
    { tail -20 "$out"; exit 1; }
  if grep -q "contract violation" "$out"; then grep -m3 "contract violation" "$out"; exit 1; fi
}

# example_fit BUILD CONFIG OUT [KILN_OPTION...]: a short fit (one epoch of 20 train and 2 validation batches)
# of CONFIG with the plugin in $prefix/BUILD-build, shown and kept (stderr too) in $prefix/OUT.txt, its runs in
# $prefix/OUT-runs
example_fit() {
  local build="$prefix/$1-build" cfg=$2 out=$3
  shift 3
  KILN_PLUGIN_PATH="$build" "$prefix/bin/kiln" "$@" fit "$cfg" --set trainer.max_epochs=1 \
    --set trainer.limit_train_batches=20 --set trainer.limit_val_batches=2 \
    --set "trainer.default_root_dir=\"$prefix/$out-runs\"" 2>&1 | tee "$prefix/$out.txt"
}

# the fake cuda accelerator's plugins, where the build has them (absolute: the loader ignores relative entries)
fake=$PWD/build/tests/cuda-fit-fake-plugins

echo "== examples/plugins/nf4: a 4-bit precision built from the installed SDK alone, its tests, a short run"
example_plugin nf4 nf4 NF4_WERROR libkiln-nf4.so "precision +(nf4|int4)"
if [ -d /usr/share/datasets/fashion-mnist ]; then
  example_fit nf4 examples/plugins/nf4/fashion_mnist_nf4.cfg nf4 -q
  grep -q "precision: nf4" "$prefix/nf4.txt"
  [ -s "$prefix/nf4-runs/version_0/nf4_weights.safetensors" ] || { echo "nf4 export missing" >&2; exit 1; }
  # built with its CUDA quantizer where nvcc exists: on the fake cuda
  # accelerator (device pointers that CUDA does not know, no driver) it
  # must take the host path and train
  if [ -f "$fake/libkiln-cudafake.so" ]; then
    KILN_PLUGIN_PATH="$prefix/nf4-build:$fake" "$prefix/bin/kiln" -v fit examples/plugins/nf4/fashion_mnist_nf4.cfg \
      --set 'accelerator="cudafake:cuda"' --set trainer.max_epochs=1 --set trainer.limit_train_batches=5 \
      --set trainer.limit_val_batches=0 --set "trainer.default_root_dir=\"$prefix/nf4-fake-runs\"" > "$prefix/nf4-fake.txt" 2>&1 ||
      { tail -20 "$prefix/nf4-fake.txt"; exit 1; }
    grep -q "compute float32, on the host" "$prefix/nf4-fake.txt" || { grep nf4 "$prefix/nf4-fake.txt"; exit 1; }
  fi
fi
echo "nf4 example: ok"

echo "== examples/plugins/lion: an optimizer made of kernel-table entries only, from the installed SDK alone"
# test_lion, and test_lion_resume (fit 4 = fit 2 + --ckpt last, bit for bit; skipped without the data)
example_plugin lion lion LION_WERROR libkiln-lion.so "optimizer +lion"
if [ -d /usr/share/datasets/fashion-mnist ]; then
  example_fit lion examples/plugins/lion/fashion_mnist_lion.cfg lion -q
  grep -q "optimizer=lion" "$prefix/lion.txt"
  # on the fake cuda accelerator the update runs through the cuda table
  # (device pointers the fake checks), with value clipping through its clamp
  if [ -f "$fake/libkiln-cudafake.so" ]; then
    fake_cuda_fit lion examples/plugins/lion/fashion_mnist_lion.cfg lion-fake --set trainer.gradient_clip_val=0.01 \
      --set 'trainer.gradient_clip_algorithm="value"'
    grep -q "optimizer=lion" "$prefix/lion-fake.txt"
  fi
fi
echo "lion example: ok"

echo "== examples/plugins/fp8-sim: simulated FP8 (round_to's FP8 dtypes, round_activation) from the installed SDK alone"
# test_fp8sim, and test_fp8sim_fit (60 steps must learn; skipped without the data)
example_plugin fp8-sim fp8 FP8SIM_WERROR libkiln-fp8-sim.so "precision +fp8-sim"
if [ -d /usr/share/datasets/fashion-mnist ]; then
  example_fit fp8 examples/plugins/fp8-sim/fashion_mnist_fp8.cfg fp8
  grep -q "precision: fp8-sim" "$prefix/fp8.txt"
  grep -q "fp8-sim: [0-9]* tensors rounded" "$prefix/fp8.txt"
  # on the fake cuda accelerator: the rounding through the cuda table's round_to
  if [ -f "$fake/libkiln-cudafake.so" ]; then
    fake_cuda_fit fp8 examples/plugins/fp8-sim/fashion_mnist_fp8.cfg fp8-fake
    grep -q "fp8-sim: [0-9]* tensors rounded" "$prefix/fp8-fake.txt"
  fi
fi
echo "fp8-sim example: ok"

echo "== examples/gan_fashion_mnist.cfg: manual optimization, two optimizers, a sample grid per epoch (short run)"
if [ -d /usr/share/datasets/fashion-mnist ]; then
  ./build/bin/kiln -q fit examples/gan_fashion_mnist.cfg --set trainer.max_epochs=2 --set trainer.limit_train_batches=30 \
    --set trainer.limit_val_batches=2 --set "trainer.default_root_dir=\"$prefix/gan-runs\"" | tee "$prefix/gan.txt"
  grep -q "optimizer=adamw+adamw (manual optimization)" "$prefix/gan.txt"
  grep -q "steps: 120 " "$prefix/gan.txt"
  for e in 000 001; do
    head -c 8 "$prefix/gan-runs/version_0/samples_epoch_$e.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" \
      || { echo "GAN sample grid $e missing or not a PNG" >&2; exit 1; }
  done
  echo "gan example: ok"
fi

echo "== examples/gpt_fortunes.cfg: a byte-level GPT on the fortunes texts (shortened), against a byte-bigram baseline"
./build/bin/kiln fit examples/gpt_fortunes.cfg --set trainer.limit_train_batches=400 --set scheduler.t_max=400 \
  --set trainer.val_check_interval=200 --set "trainer.default_root_dir=\"$prefix/gpt-runs\"" 2>&1 | tee "$prefix/gpt.txt"
python3 - "$prefix/gpt.txt" <<'PY2'
# the baseline: a byte-bigram model (add-one counts) fitted on the training
# bytes and scored on the validation bytes, split as the run splits them
# (the files without a dot in name order, the last 5 % validating)
import glob, math, os, re, sys
files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*") if "." not in os.path.basename(f))
data = b"".join(open(f, "rb").read() for f in files)
nval = int(len(data) * 0.05)
train, val = data[:len(data) - nval], data[len(data) - nval:]
counts = [[1] * 256 for _ in range(256)]
for a, b in zip(train, train[1:]):
    counts[a][b] += 1
rows = [sum(r) for r in counts]
bigram = -sum(math.log(counts[a][b] / rows[a]) for a, b in zip(val, val[1:])) / (len(val) - 1)
text = open(sys.argv[1]).read()
vl = float(re.findall(r"val_loss=([0-9.]+)", text)[-1])
print(f"gpt demo: val_loss {vl:.4f} nats/byte, byte-bigram baseline {bigram:.4f}, margin {bigram - vl:.3f}")
sys.exit(0 if vl <= bigram - 0.5 else "gpt demo: val_loss is not 0.5 nats below the bigram baseline")
PY2
grep -q "sample during training (step 400)" "$prefix/gpt.txt" || { echo "gpt demo: no sample printed at the last step" >&2; exit 1; }
[ -s "$prefix/gpt-runs/version_0/samples.txt" ] || { echo "gpt demo: samples.txt missing" >&2; exit 1; }
grep -q "tokens/s" "$prefix/gpt.txt" || { echo "gpt demo: no tokens/s in the summary" >&2; exit 1; }

echo "== examples/gpt2_124m.cfg: GPT-2 124M starts on the CPU and takes a few steps (small batch and context)"
"$prefix/bin/kiln-text2tokens" -o "$prefix/fortunes.bin" /usr/share/games/fortunes/fortunes /usr/share/games/fortunes/wisdom
./build/bin/kiln fit examples/gpt2_124m.cfg --set trainer.max_steps=3 --set trainer.accumulate_grad_batches=1 \
  --set trainer.val_check_interval=3 --set trainer.limit_val_batches=1 --set trainer.num_sanity_val_steps=0 \
  --set trainer.log_every_n_steps=1 --set "data.train=\"$prefix/fortunes.bin\"" --set "data.val=\"$prefix/fortunes.bin\"" \
  --set data.batch_size=1 --set data.block_size=64 --set module.max_batch=1 \
  --set "callbacks=({name=\"progress\";})" --set "trainer.default_root_dir=\"$prefix/gpt2-runs\"" | tee "$prefix/gpt2.txt"
grep -q "steps: 3 " "$prefix/gpt2.txt" || { echo "gpt2_124m: did not take 3 steps" >&2; exit 1; }
echo "gpt examples: ok"

# The GPU run's package (tests/gpu/prepare.sh: a Release build for sm_80
# and sm_90, the libraries kiln links, a Fashion-MNIST subset, the fortunes
# texts), where this build has the cuda accelerator: it must still build
# and fit the device tool's 64 MiB carry (the script checks), so that a
# session lent a GPU can start its one run at once. About 5 minutes.
if [ -f build/lib/kiln/plugins/libkiln-cuda.so ] && [ -d /usr/share/datasets/fashion-mnist ]; then
  echo "== tests/gpu/prepare.sh: the GPU run's package builds and fits the device tool's carry"
  bash tests/gpu/prepare.sh
fi

if [ -f examples/fashion_mnist.cfg ]; then
  run_default_job
fi
echo "== all checks passed"
