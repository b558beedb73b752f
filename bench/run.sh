#!/usr/bin/env bash
# bench/run.sh — the CPU training benchmark of docs/benchmarks.md: the
# GEMM-only bound against a real kiln epoch for 784-1024-1024-10 at batch 128
# (SGD and AdamW, 1 and 2 threads), the tiny 784-32-10 model's per-step
# overhead, page faults per steady-state step, peak RSS and the 2-thread
# speed-up. Medians of RUNS runs (default 3). Run on an idle machine after
# building (cmake --preset default && cmake --build build).
#
# Every configuration runs --paired (bench/benchprobe.c): the GEMM-only step
# is timed right after every steady kiln step, through the accelerator's own
# GEMMs, so bound and epoch see the same machine state; the bound through
# OpenBLAS's threads, measured before each epoch, is printed next to it.
#
#   bash bench/run.sh [BUILD_DIR] [RUNS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
runs=${2:-3}
bin="$build/bench/kiln-bench-mlp"
[ -x "$bin" ] || cmake --build "$build" --target kiln-bench-mlp
common=(--kiln "$build/bin/kiln" --probe-dir "$build/bench/plugins" --runs "$runs" --paired)
out=$(mktemp)
for opt in sgd adamw; do
  for t in 1 2; do
    "$bin" "${common[@]}" --optimizer "$opt" --threads "$t" --steps 429 | tee -a "$out"
  done
done
"$bin" "${common[@]}" --optimizer sgd --threads 1 --layers 784,32,10 --steps 429 --reps 1000 | tee -a "$out"
"$bin" "${common[@]}" --optimizer adamw --threads 1 --layers 784,32,10 --steps 429 --reps 1000 | tee -a "$out"
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l.split("RESULT ", 1)[1]) for l in open(sys.argv[1]) if l.startswith("RESULT ")]
print("\n| model | optimizer | threads | GEMM ms/step | kiln s/epoch | bound/kiln | OpenBLAS-threads bound/kiln | overhead us/step | faults/step | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['layers']} | {r['optimizer']} | {r['threads']} | {r['gemm_ms']:.3f} | {r['kiln_epoch_s']:.3f} | "
          f"{r['ratio']:.3f} | {r['peer_ratio']:.3f} | {r['overhead_us']:.1f} | {r['faults_per_step']:.2f} | {r['peak_rss_mib']:.1f} |")
big = {(r['optimizer'], r['threads']): r for r in rows if r['layers'].startswith('784,1024')}
for opt in ('sgd', 'adamw'):
    if (opt, 1) in big and (opt, 2) in big:
        k1, k2 = big[(opt, 1)], big[(opt, 2)]
        # the machine's own 2-thread scaling: the same GEMMs, paired with the same epochs
        print(f"2 threads vs 1 ({opt}): {k1['kiln_epoch_s'] / k2['kiln_epoch_s']:.2f}x "
              f"(the GEMMs alone: {k1['bound_epoch_s'] / k2['bound_epoch_s']:.2f}x)")
PY
rm -f "$out"
