#!/usr/bin/env bash
# bench/gpt_cpu/run.sh — kiln's gpt against PyTorch 1.13 eager (Debian's
# python3-torch) on the CPU, side by side: the same GPT (4 layers, 4 heads,
# C = 256 wide by default, T = 128, B = 16, byte vocabulary) trained with
# AdamW, at 1 and 2 threads, the two interleaved in every round, RUNS rounds
# (default 3), medians. kiln trains on the fortunes texts (the demo's data)
# through `kiln fit` with bench/benchprobe.c measuring its steady-state
# window (after 10 batches): tokens/s, minor page faults per step, peak RSS.
# PyTorch trains on random bytes (bench/gpt_cpu/torch_gpt.py): the same
# FLOPs per step. Run on an idle machine after building.
#
#   bash bench/gpt_cpu/run.sh [BUILD_DIR] [RUNS] [C]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
runs=${2:-3}
C=${3:-256}
steps=40 warm=10 B=16
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[ -f "$build/bench/plugins/libkiln-benchprobe.so" ] || cmake --build "$build" --target kiln-benchprobe
for r in $(seq 1 "$runs"); do
  for t in 1 2; do
    probe="$out/probe-$t-$r.txt"
    "$build/bin/kiln" -q fit "$root/examples/gpt_fortunes.cfg" \
      --set trainer.max_steps=$steps --set trainer.threads=$t --set trainer.num_sanity_val_steps=0 \
      --set trainer.limit_val_batches=0 --set trainer.val_check_interval=$steps --set module.n_embd=$C \
      --set data.batch_size=$B --set module.max_batch=$B --set "trainer.default_root_dir=\"$out/runs\"" \
      --set "plugins={dirs=[\"$build/bench/plugins\"];}" \
      --set "callbacks=({name=\"benchprobe\"; path=\"$probe\"; warmup=$warm;})" > "$out/kiln-$t-$r.log"
    /usr/bin/python3 "$root/bench/gpt_cpu/torch_gpt.py" $t $C $B 25 5 | grep RESULT | sed 's/^RESULT //' > "$out/torch-$t-$r.json"
    echo "round $r, $t thread(s): kiln $(grep -o 'steady_s=[0-9.]*' "$probe"), torch $(cat "$out/torch-$t-$r.json")"
  done
done
python3 - "$out" "$runs" "$B" "$C" <<'PY'
import json, re, statistics, sys
out, runs, B, C = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
T = 128
print(f"\n| threads | kiln tokens/s | PyTorch tokens/s | kiln / PyTorch | kiln faults/step | kiln peak RSS MiB | PyTorch peak RSS MiB |")
print("|---|---|---|---|---|---|---|")
for t in (1, 2):
    k, p, f, rk, rp = [], [], [], [], []
    for r in range(1, runs + 1):
        kv = dict(x.split("=") for x in open(f"{out}/probe-{t}-{r}.txt").read().split())
        steps = int(kv["steady_steps"])
        k.append(steps * B * T / float(kv["steady_s"]))
        f.append(int(kv["steady_minflt"]) / steps)
        rk.append(int(kv["maxrss_kib"]) / 1024)
        j = json.load(open(f"{out}/torch-{t}-{r}.json"))
        p.append(j["tokens_per_s"]); rp.append(j["peak_rss_mib"])
    mk, mp = statistics.median(k), statistics.median(p)
    print(f"| {t} | {mk:.0f} | {mp:.0f} | {mk / mp:.2f} | {statistics.median(f):.2f} | {statistics.median(rk):.1f} | "
          f"{statistics.median(rp):.1f} |")
print(f"\n(GPT 4 layers, 4 heads, C = {C}, T = {T}, B = {B}, AdamW; medians of {runs} interleaved rounds)")
PY
