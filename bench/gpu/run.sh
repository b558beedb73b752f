#!/usr/bin/env bash
# bench/gpu/run.sh BUILD OUT — the GPU benchmark of docs/benchmarks.md: for
# three MLP configurations it measures, on GPU 0,
#   - kiln: `kiln fit` on the cuda accelerator with the benchprobe callback,
#     whose steady-state window (after `warmup` batches) gives seconds per
#     training step; samples/s follow from the batch size;
#   - the GEMM-only bound of the same step (kiln-gpu-gemm: cuBLASLt, same
#     shapes, transposes and dtype), its TFLOP/s and its fraction of the
#     device's dense peak for the dtype;
#   - bound ÷ step (how close the whole step comes to its GEMMs) and the
#     per-step time beyond the GEMMs (an upper bound on host overhead: it
#     also holds the elementwise kernels' GPU time).
# Configurations: the CPU benchmark's 784-1024-1024-10 at batch 128 (fp32),
# a GEMM-bound 784-8192-8192-10 at batch 8192 (bf16-mixed) and a
# launch-bound 784-32-10 at batch 128 (fp32). Medians over `epochs` epochs.
# Writes OUT/bench.jsonl and prints a table. Needs Fashion-MNIST
# (KILN_FM_DIR, default Debian's path).
set -euo pipefail
build=$(cd "${1:?usage: bench/gpu/run.sh BUILD OUT}" && pwd)
out=${2:?usage: bench/gpu/run.sh BUILD OUT}
root=$(cd "$(dirname "$0")/../.." && pwd)
fm=${KILN_FM_DIR:-/usr/share/datasets/fashion-mnist}
gemm="$build/bench/kiln-gpu-gemm"
[ -x "$gemm" ] || { echo "bench/gpu/run.sh: $gemm not built (no CUDA?)" >&2; exit 1; }
: >"$out/bench.jsonl"

# one configuration: name layers batch precision bound-dtype epochs warmup
bench() {
  local name=$1 layers=$2 B=$3 prec=$4 dt=$5 epochs=$6 warmup=$7
  local dir
  dir=$(mktemp -d /tmp/kiln-gpu-bench-XXXXXX)
  cat >"$dir/run.cfg" <<EOF
plugins = { dirs = ["$build/bench/plugins"]; };
trainer = { max_epochs = $epochs; limit_val_batches = 0; num_sanity_val_steps = 0; seed = 1;
  default_root_dir = "$dir/runs"; log_every_n_steps = 1000000; };
accelerator = "cuda";
precision = "$prec";
data = { name = "idx"; dir = "$fm"; batch_size = $B; drop_last = true; val_split = 0; };
module = { name = "mlp"; layers = [$layers]; max_batch = $B; };
optimizer = { name = "sgd"; lr = 0.01; };
callbacks = ( { name = "benchprobe"; path = "$dir/probe.txt"; warmup = $warmup; } );
EOF
  "$build/bin/kiln" fit "$dir/run.cfg" >"$dir/kiln.txt" 2>&1 || { tail -20 "$dir/kiln.txt"; return 1; }
  local bound
  bound=$("$gemm" --layers "$layers" --batch "$B" --dtype "$dt" --reps 30 | sed -n 's/^RESULT //p')
  python3 - "$name" "$B" "$prec" "$dir/probe.txt" "$bound" >>"$out/bench.jsonl" <<'PY'
import json, statistics, sys
name, B, prec, probe, bound = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
steps = []
for line in open(probe):
    kv = dict(p.split("=") for p in line.split())
    if int(kv["steady_steps"]) > 0:
        steps.append(float(kv["steady_s"]) / int(kv["steady_steps"]))
step = statistics.median(steps)
g = bound["gemm_step_ms"] / 1e3
print(json.dumps({"check": "bench_" + name, "status": "pass", "layers": bound["layers"], "batch": B,
                  "precision": prec, "dtype": bound["dtype"], "step_ms": round(step * 1e3, 4),
                  "samples_per_s": round(B / step), "gemm_step_ms": bound["gemm_step_ms"],
                  "bound_over_step": round(g / step, 3), "beyond_gemm_us": round((step - g) * 1e6, 1),
                  "gemm_tflops": bound["tflops"], "gemm_fraction_of_peak": bound["fraction_of_peak"],
                  "device": bound["device"]}))
PY
  rm -rf "$dir"
}

bench fm_fp32 784,1024,1024,10 128 32-true f32 3 20
bench gemm_bound_bf16 784,8192,8192,10 8192 bf16-mixed bf16 6 1
bench launch_bound_fp32 784,32,10 128 32-true f32 3 20

python3 - "$out/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| config | precision | step ms | samples/s | GEMM ms | bound/step | beyond GEMM us | GEMM TFLOP/s | of peak |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['check'][6:]} | {r['precision']} | {r['step_ms']:.3f} | {r['samples_per_s']} | {r['gemm_step_ms']:.3f} | "
          f"{r['bound_over_step']:.3f} | {r['beyond_gemm_us']:.0f} | {r['gemm_tflops']:.0f} | {r['gemm_fraction_of_peak']:.2f} |")
PY
