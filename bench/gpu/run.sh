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
# Then kiln-gpu-step: the same step built from kiln's cuda kernels with
# nothing read back, issued eagerly and replayed as a CUDA graph, for the
# launch-bound and the fp32 configuration (host overhead both ways).
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
  local bound st
  bound=$("$gemm" --layers "$layers" --batch "$B" --dtype "$dt" --reps 30 | sed -n 's/^RESULT //p')
  [ -n "$bound" ] || { echo "bench/gpu/run.sh: kiln-gpu-gemm $name gave no result" >&2; rm -rf "$dir"; return 1; }
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
  st=$?
  rm -rf "$dir"
  return "$st"
}

fail=0
bench fm_fp32 784,1024,1024,10 128 32-true f32 3 20 || fail=1
bench gemm_bound_bf16 784,8192,8192,10 8192 bf16-mixed bf16 6 1 || fail=1
bench launch_bound_fp32 784,32,10 128 32-true f32 3 20 || fail=1

# the kernel-level step, eager and as a CUDA graph (kiln-gpu-step): host
# overhead per step = step wall time - GPU time, both ways
step() {
  local name=$1 layers=$2 B=$3 reps=$4 res
  res=$("$build/bench/kiln-gpu-step" --layers "$layers" --batch "$B" --reps "$reps" | sed -n 's/^RESULT //p') || true
  [ -n "$res" ] || { echo "bench/gpu/run.sh: kiln-gpu-step $name failed" >&2; return 1; }
  python3 -c 'import json,sys; r=json.loads(sys.argv[2]); r.update({"check": "step_" + sys.argv[1], "status": "pass"}); print(json.dumps(r))' \
    "$name" "$res" >>"$out/bench.jsonl"
}
step launch_bound_fp32 784,32,10 128 3000 || fail=1
step fm_fp32 784,1024,1024,10 128 500 || fail=1

python3 - "$out/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if r["check"].startswith("step_")]
rows = [r for r in rows if r["check"].startswith("bench_")]
print("| config | precision | step ms | samples/s | GEMM ms | bound/step | beyond GEMM us | GEMM TFLOP/s | of peak |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['check'][6:]} | {r['precision']} | {r['step_ms']:.3f} | {r['samples_per_s']} | {r['gemm_step_ms']:.3f} | "
          f"{r['bound_over_step']:.3f} | {r['beyond_gemm_us']:.0f} | {r['gemm_tflops']:.0f} | {r['gemm_fraction_of_peak']:.2f} |")
# kiln fit's own host overhead per step: its step time minus the GPU time of
# the same step's kernels (kiln-gpu-step runs the same kernels; kiln fit adds
# only the loss read-back to them)
print()
print("| kiln fit | step us | GPU us (same kernels) | host overhead us |")
print("|---|---|---|---|")
with open(sys.argv[1], "a") as out:
    for r in rows:
        m = [t for t in steps if t["check"] == "step_" + r["check"][6:]]
        if not m:
            continue
        step_us, gpu_us = r["step_ms"] * 1e3, m[0]["gpu_step_us"]
        print(f"| {r['check'][6:]} | {step_us:.1f} | {gpu_us:.1f} | {step_us - gpu_us:.1f} |")
        out.write(json.dumps({"check": "overhead_" + r["check"][6:], "status": "pass", "kiln_step_us": round(step_us, 1),
                              "gpu_step_us": gpu_us, "host_overhead_us": round(step_us - gpu_us, 1)}) + "\n")
print()
print("| kernel-level step | GPU us | eager us/step | eager host us | eager overhead us | graph us/step | graph host us | graph overhead us | nodes |")
print("|---|---|---|---|---|---|---|---|---|")
for r in steps:
    print(f"| {r['check'][5:]} | {r['gpu_step_us']:.1f} | {r['eager_step_us']:.1f} | {r['eager_host_us']:.1f} | "
          f"{r['eager_overhead_us']:.1f} | {r['graph_step_us']:.1f} | {r['graph_host_us']:.1f} | {r['graph_overhead_us']:.1f} | {r['graph_nodes']} |")
PY
exit $fail
