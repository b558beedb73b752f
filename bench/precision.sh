#!/usr/bin/env bash
# bench/precision.sh — training speed of each precision plugin against
# 32-true on the default job (MLP 784-1024-1024-10, AdamW, batch 128): for
# each precision, RUNS runs of LIMIT training batches (plus the fixed cost of
# starting a run, which is the same for all), median wall seconds per batch
# from the run summary's "wall" figure, and the ratio to 32-true. fp16/bf16
# are emulated on the CPU (conversions a GPU does not pay), so the ratios
# measure the emulation's cost, not a speed-up. Run on an idle machine after
# building; nf4/int4 are included when NF4_DIR holds libkiln-nf4.so.
#
#   bash bench/precision.sh [BUILD_DIR] [RUNS] [LIMIT]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
runs=${2:-3}
limit=${3:-100}
kiln="$build/bin/kiln"
precs=(32-true 16-mixed bf16-mixed 64-true)
if [ -n "${NF4_DIR:-}" ] && [ -f "$NF4_DIR/libkiln-nf4.so" ]; then
  export KILN_PLUGIN_PATH="$NF4_DIR"
  precs+=(nf4 int4)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for p in "${precs[@]}"; do
  for r in $(seq "$runs"); do
    "$kiln" -q fit "$root/examples/fashion_mnist.cfg" --set precision="$p" --set trainer.max_epochs=1 \
      --set trainer.limit_train_batches="$limit" --set trainer.limit_val_batches=0 \
      --set trainer.num_sanity_val_steps=0 --set "trainer.default_root_dir=\"$tmp/runs\"" \
      | sed -n 's/.*wall: \([0-9.]*\) s.*/\1/p' >> "$tmp/$p"
  done
done
python3 - "$tmp" "$limit" "${precs[@]}" <<'PY'
import statistics, sys
tmp, limit, precs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = {p: statistics.median(float(x) for x in open(f"{tmp}/{p}")) / limit * 1000 for p in precs}
print(f"\n| precision | ms/batch (median of runs) | vs 32-true |")
print("|---|---|---|")
for p in precs:
    print(f"| {p} | {med[p]:.1f} | {med[p] / med['32-true']:.2f}x |")
PY
