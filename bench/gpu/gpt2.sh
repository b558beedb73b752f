#!/usr/bin/env bash
# bench/gpu/gpt2.sh BUILD OUT — GPT-2 124M on one GPU, the figures of
# docs/benchmarks.md's transformer table:
#   - kiln: examples/gpt2_124m.cfg on the cuda accelerator in bf16-mixed, T =
#     1024, one batch per step (no accumulation), on a synthetic llm.c shard,
#     at the largest batch of 64, 32, 16, 8 that fits (llm.c runs 64); the benchprobe callback's
#     steady-state window (after 10 steps) gives the step time, so tokens/s =
#     B * T / step and MFU = tokens/s * FLOPs per token / the GPU's dense
#     bf16 peak (FLOPs per token: 6 N + 6 L C T, N = 124,475,904: llm.c's
#     count); the memory high-water mark is nvidia-smi's, polled during the
#     run;
#   - the same at that batch with attention = "flash" (the fused tiles of
#     kernels/cuda/kg_flash.cu) instead of the default gemm path; both rows
#     are reported, and the faster is kiln's figure (the ratios use it);
#   - the step's breakdown: for each path a second, short run with the accelerator's
#     profile = true (GPU time per category: GEMMs, attention, classifier,
#     layer norm, embedding, optimizer, elementwise, copies, reductions, and
#     the GPU idle after a synchronize, which is host time), the share of
#     GEMM FLOPs on the 16-bit tensor cores and the MB per token gemm_ex
#     spent converting operands (docs/gpu.md's count predicts both);
#   - the peer: bench/gpu/torch_gpt2.py, the same model and step in PyTorch on
#     the same GPU (eager with its fused attention, and torch.compile), at the
#     same batch; kiln's tokens/s as a ratio to each.
# Under tests/gpu/run.sh's deadline (KILN_GPU_DEADLINE, tests/gpu/lib.sh)
# each run's time limit is cut to what is left; a run that no longer fits
# is left out (the profiled runs, then torch.compile, which compiles for a
# minute or more, go first) and the report is still written. A batch run
# that its time limit ends stops the search (a smaller batch would say
# nothing about the larger one): one row says so, a skip for the deadline
# where the deadline had cut that limit, a failure where it was the run's
# own 4 minutes.
# Writes OUT/bench_gpt2.jsonl and prints a table; the runs' logs, probe
# files, memory polls and the PyTorch peer's output (each file's last
# 256 KiB, 2 MiB in all; no token shard or checkpoint) are kept in
# OUT/bench_gpt2/, which run.sh packs into logs.tar.xz. PEAK_TFLOPS
# overrides the peak (default: 989.5, the H100/H200 SXM dense bf16 figure).
set -uo pipefail
build=$(cd "${1:?usage: bench/gpu/gpt2.sh BUILD OUT}" && pwd)
out=${2:?usage: bench/gpu/gpt2.sh BUILD OUT}
root=$(cd "$(dirname "$0")/../.." && pwd)
peak=${PEAK_TFLOPS:-989.5}
work=$(mktemp -d /tmp/kiln-gpt2-bench-XXXXXX)
jsonl="$out/bench_gpt2.jsonl"
mkdir -p "$out" && : >"$jsonl"
. "$root/tests/gpu/lib.sh"
# keep_logs: the small files of the work folder (the kiln logs, probe
# files, memory polls, torch.jsonl and torch.err, the runs' metrics.csv),
# each cut to its last 256 KiB and 2 MiB in all, copied to OUT/bench_gpt2/
# before the work folder goes
keep_logs() {
  python3 - "$work" "$out/bench_gpt2" <<'PY' || echo "bench/gpt2: could not keep the logs in $out/bench_gpt2"
import os, sys
work, keep = sys.argv[1], sys.argv[2]
os.makedirs(keep, exist_ok=True)
each, total = 256 << 10, 0
for d, subs, files in os.walk(work):
    subs[:] = sorted(s for s in subs if s != "checkpoints")
    for f in sorted(files):
        p = os.path.join(d, f)
        if f.endswith((".bin", ".safetensors", ".folded")) or os.path.islink(p) or not os.path.isfile(p):
            continue
        if not (f.endswith((".log", ".txt", ".jsonl", ".err", ".csv"))):
            continue
        size = os.path.getsize(p)
        n = min(size, each, (2 << 20) - total)
        if n <= 0 < size:
            print(f"bench/gpt2: {os.path.relpath(p, work)} not kept: 2 MiB of logs kept already")
            continue
        with open(p, "rb") as src:
            src.seek(size - n)
            data = src.read(n)
        dst = os.path.join(keep, os.path.relpath(p, work))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as o:
            o.write(data)
        total += n
PY
}
trap 'keep_logs; rm -rf "$work"' EXIT

python3 "$root/tests/gpu/synthetic_shard.py" "$work/shard.bin" 4000000

# kiln fit of GPT-2 124M: TAG BATCH STEPS ACCEL [extra --set ...], under a
# time limit of 4 minutes cut to the deadline (fit_limit: the limit it ran
# under). Status 0 when it ran, 2 when under 30 s were left to start it,
# 3 when its time limit ended it, 1 when it failed otherwise.
fit_limit=0
fit() {
  local tag=$1 B=$2 steps=$3 acc=$4 rc=0
  shift 4
  fit_limit=$(gpu_budget 240 30) || {
    fit_limit=0
    echo "bench/gpt2: no time left for run $tag ($(gpu_left) s to the deadline)" >"$work/$tag.log"
    return 2
  }
  timeout -k 10 "$fit_limit" "$build/bin/kiln" fit "$root/examples/gpt2_124m.cfg" --set "plugins.dirs=[\"$build/bench/plugins\"]" \
    --set "accelerator=$acc" --set "data.train=\"$work/shard.bin\"" --set "data.val=\"$work/shard.bin\"" \
    --set "data.batch_size=$B" --set "module.max_batch=$B" --set trainer.accumulate_grad_batches=1 \
    --set "trainer.max_steps=$steps" --set trainer.limit_val_batches=0 --set trainer.num_sanity_val_steps=0 \
    --set "trainer.val_check_interval=$steps" --set "trainer.default_root_dir=\"$work/runs-$tag\"" \
    --set "trainer.peak_flops=${peak}e12" \
    --set "callbacks=({name=\"benchprobe\"; path=\"$work/probe-$tag.txt\"; warmup=10;})" "$@" >"$work/$tag.log" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] && return 0
  gpu_timed_out "$rc" && { echo "bench/gpt2: run $tag: ended by its time limit of $fit_limit s" >>"$work/$tag.log"; return 3; }
  return 1
}

# the largest batch that fits; a run cut by its time limit or left out for
# the deadline stops the search, with one row saying so
batch=0
for B in 64 32 16 8; do
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 >"$work/mem-$B.txt" 2>/dev/null &
  smi=$!
  fit "b$B" "$B" 40 '"cuda"'
  rc=$?
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  case $rc in
    0) batch=$B; break ;;
    2)
      echo "bench/gpt2: no time left for batch $B: the search stops"
      echo "{\"check\": \"bench_gpt2\", \"status\": \"skip\", $(gpu_skip_why), \"batch\": $B}" >>"$jsonl"
      exit 0 ;;
    3)
      tail -5 "$work/b$B.log"
      if [ "$fit_limit" -lt 240 ]; then
        echo "bench/gpt2: batch $B was cut by the deadline at $fit_limit s: the search stops (rerun the gpt2 step by name)"
        echo "{\"check\": \"bench_gpt2\", \"status\": \"skip\", \"why\": \"the deadline: batch $B cut at $fit_limit s (its own limit: 240 s)\", \"batch\": $B}" >>"$jsonl"
        exit 0
      fi
      echo "bench/gpt2: batch $B timed out after $fit_limit s: the search stops"
      echo "{\"check\": \"bench_gpt2\", \"status\": \"fail\", \"why\": \"batch $B timed out after $fit_limit s\", \"batch\": $B}" >>"$jsonl"
      exit 1 ;;
  esac
  echo "bench/gpt2: batch $B did not run: $(grep -m1 -E 'error|out of memory' "$work/b$B.log")"
done
if [ "$batch" = 0 ]; then
  echo "bench/gpt2: no batch size ran"; tail -20 "$work/b8.log"
  echo '{"check": "bench_gpt2", "status": "fail"}' >>"$jsonl"
  exit 1
fi
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 >"$work/mem-flash.txt" 2>/dev/null &
smi=$!
fit flash "$batch" 40 '{ name = "cuda"; attention = "flash"; }' ||
  echo "bench/gpt2: the flash run did not finish: $(grep -m1 -E 'error|out of memory' "$work/flash.log")"
kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
fit profile "$batch" 12 '{ name = "cuda"; profile = true; }' ||
  echo "bench/gpt2: the profiled run failed: $(tail -1 "$work/profile.log")"
fit profile-flash "$batch" 12 '{ name = "cuda"; profile = true; attention = "flash"; }' ||
  echo "bench/gpt2: the profiled flash run failed: $(tail -1 "$work/profile-flash.log")"
# the peer: eager and torch.compile given 3 minutes or more, eager alone
# given one, nothing given less
if t=$(gpu_budget 300 180); then peer=()
elif t=$(gpu_budget 120 60); then peer=(--no-compile); echo "bench/gpt2: $(gpu_left) s to the deadline: the PyTorch peer runs eager only"
else t=0; echo "bench/gpt2: $(gpu_left) s to the deadline: no time for the PyTorch peer"; fi
if [ "$t" -gt 0 ]; then
  timeout -k 10 "$t" python3 "$root/bench/gpu/torch_gpt2.py" --batch "$batch" "${peer[@]}" >"$work/torch.jsonl" 2>"$work/torch.err"
  case $? in
    0) ;;
    77) echo "bench/gpt2: the PyTorch peer did not run: no torch with CUDA here ($(tail -1 "$work/torch.jsonl"))" ;;
    *) echo "bench/gpt2: the PyTorch peer failed: $(tail -1 "$work/torch.err")" ;;
  esac
fi

python3 - "$work" "$batch" "$peak" "$jsonl" <<'PY'
import json, os, re, statistics, sys
work, B, peak, jsonl = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) * 1e12, sys.argv[4]
T, L, C, N = 1024, 12, 768, 124475904
fpt = 6 * N + 6 * L * C * T
def measure(tag, attention, memfile, proflog):
    """The row of one path's run, or None when it did not run."""
    steps = []
    try:
        for line in open(os.path.join(work, f"probe-{tag}.txt")):
            kv = dict(p.split("=") for p in line.split())
            if int(kv["steady_steps"]) > 0:
                steps.append(float(kv["steady_s"]) / int(kv["steady_steps"]))
    except OSError:
        return None
    if not steps:
        return None
    step = statistics.median(steps)
    tps = B * T / step
    mem = [int(x) for x in open(os.path.join(work, memfile)).read().split() if x.isdigit()]
    row = {"check": "bench_gpt2", "status": "pass", "attention": attention, "batch": B, "seq": T,
           "precision": "bf16-mixed", "step_ms": round(step * 1e3, 2), "tokens_per_s": round(tps),
           "tflops": round(tps * fpt / 1e12, 1), "mfu": round(tps * fpt / peak, 4), "peak_tflops": peak / 1e12,
           "mem_high_water_mib": max(mem) if mem else None}
    prof = {}
    try:
        for line in open(os.path.join(work, proflog), errors="replace"):
            m = re.search(r"cuda: profile: category (.+?)\s+([0-9.]+) ms\s+([0-9.]+)%", line)
            if m:
                prof[m.group(1).strip()] = {"ms": float(m.group(2)), "percent": float(m.group(3))}
            # where the GEMM FLOPs ran: anything off the 16-bit tensor cores
            # in a bf16-mixed step is a slow path
            m = re.search(r"GEMMs \S+ FLOPs: ([0-9.]+)% on 16-bit tensor cores, ([0-9.]+)% TF32, ([0-9.]+)% fp32", line)
            if m:
                row["gemm_flops_16bit_percent"] = float(m.group(1))
                row["gemm_flops_fp32_percent"] = float(m.group(3))
            # the bytes gemm_ex's operand conversions moved over the 12
            # profiled steps, per token: docs/gpu.md's count predicts them
            m = re.search(r"operand conversions moved ([0-9.e+]+) bytes", line)
            if m:
                row["gemm_convert_mb_per_token"] = round(float(m.group(1)) / (12 * B * T) / 1e6, 6)
            # the waits for the GPU over the whole profiled run (set-up
            # included: docs/gpu.md counts 9 per step at B = 32) and the
            # classifier's chunk, which sets how many of them there are
            m = re.search(r"cuda: device \d+: \d+ cudaMalloc calls, (\d+) host waits", line)
            if m:
                row["host_waits_profiled_run"] = int(m.group(1))
            m = re.search(r"classifier chunks of (\d+) rows", line)
            if m:
                row["classifier_chunk_rows"] = int(m.group(1))
            # the kernel-table calls of the 12 profiled steps (set-up
            # included): the optimizer's (one adamw_update_many per step,
            # ABI 1.10; no adamw_update), zero_grad's memsets (one per
            # step), the casts, and the backward's fused entries (ABI
            # 1.11: 12 act_bias_backward and 24 layernorm_backward_cast
            # per step, no act_backward); the total says how many
            # launches the host issues per step
            m = re.search(r"cuda: profile: entry (\S+)\s+[0-9.]+ ms\s+[0-9.]+%\s+(\d+) calls", line)
            if m:
                calls = row.setdefault("entry_calls_profiled_run", {"total": 0})
                calls["total"] += int(m.group(2))
                if m.group(1) in ("adamw_update_many", "adamw_update", "zero", "cast", "act_bias_backward",
                                  "act_backward", "layernorm_backward_cast"):
                    calls[m.group(1)] = int(m.group(2))
    except OSError:
        pass
    row["breakdown"] = prof
    return row

rows = [r for r in (measure(f"b{B}", "gemm", f"mem-{B}.txt", "profile.log"),
                    measure("flash", "flash", "mem-flash.txt", "profile-flash.log")) if r]
if not rows:
    print(f"bench/gpt2: batch {B} ran, but no run left a steady-state step time (probe-b{B}.txt)")
    with open(jsonl, "a") as f:
        f.write(json.dumps({"check": "bench_gpt2", "status": "fail", "why": "no steady-state step time"}) + "\n")
    sys.exit(1)
best = max(rows, key=lambda r: r["tokens_per_s"])
tps, prof = best["tokens_per_s"], best["breakdown"]
row = best
for r in rows:
    r["kiln_figure"] = r is best
peers = {}
try:
    for line in open(os.path.join(work, "torch.jsonl")):
        r = json.loads(line)
        if "tokens_per_s" in r:
            peers[r["check"]] = r
            row["ratio_to_" + r["check"]] = round(tps / r["tokens_per_s"], 3)
except OSError:
    pass
with open(jsonl, "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
    for r in peers.values():
        r["status"] = "pass"
        f.write(json.dumps(r) + "\n")
print(f"| GPT-2 124M | batch | step ms | tokens/s | TFLOP/s | MFU | memory MiB |")
print(f"|---|---|---|---|---|---|---|")
for r in rows:
    mark = " (kiln's figure)" if r is best else ""
    print(f"| kiln bf16-mixed, attention {r['attention']}{mark} | {B} | {r['step_ms']} | {r['tokens_per_s']} | "
          f"{r['tflops']} | {100 * r['mfu']:.1f}% | {r['mem_high_water_mib']} |")
for k, r in peers.items():
    print(f"| {k} | {r['batch']} | {r['step_ms']} | {r['tokens_per_s']} | {r['tokens_per_s'] * fpt / 1e12:.1f} | "
          f"{100 * r['tokens_per_s'] * fpt / peak:.1f}% | {r['peak_mem_gib'] * 1024:.0f} (allocated) |")
print()
for r in rows:
    if "gemm_flops_16bit_percent" in r:
        print(f"attention {r['attention']}: {r['gemm_flops_16bit_percent']:.1f}% of the GEMM FLOPs on 16-bit tensor cores, "
              f"{r['gemm_flops_fp32_percent']:.1f}% on the fp32 units, operand conversions "
              f"{r.get('gemm_convert_mb_per_token', float('nan')):.4f} MB per token")
print(f"attention {best['attention']}:")
print("| category | GPU ms | share |")
print("|---|---|---|")
for k, v in sorted(prof.items(), key=lambda kv: -kv[1]["ms"]):
    print(f"| {k} | {v['ms']:.1f} | {v['percent']:.1f}% |")
PY
exit $?
