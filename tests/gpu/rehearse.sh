#!/usr/bin/env bash
# tests/gpu/rehearse.sh — the GPU run's transformer scripts played through
# without a GPU, on the fake CUDA stack (tests/cuda_fake). The runs really
# train there, so what `kiln config check` cannot see is checked too: the
# overrides kiln refuses only once it knows the data (a validation interval
# past the epoch's batches once was one), the files the scripts read back
# (metrics.csv, benchprobe files, the profile's category lines) and the
# verdicts and reports built from them.
#   rehearse.sh BUILD gpt2         bench/gpu/gpt2.sh
#   rehearse.sh BUILD gpt_checks   tests/gpu/gpt_checks.sh (ACCEL=cudafake:cuda,
#                                  GPT_CHECKS_QUICK=1)
# A stand-in kiln runs every `fit` on the fake accelerator (cudafake:cuda)
# with the big models shrunk: GPT-2 124M to one layer, 64 wide, T = 64, a
# vocabulary of 256 (it folds the synthetic shard's ids into it) and a
# batch of 8, at most 14 steps (the probe's 10 warm-up steps and 4
# measured); the fortunes demo to one layer, 64 wide. The reports still say
# the sizes the scripts chose.
# Passes when the script exits 0 (gpt_checks: every check passed but the
# GPT-2 124M ddp run, which needs real NCCL) and its rows hold what the GPU
# run needs (gpt2: and its logs were kept in OUT/bench_gpt2/). 77 (skipped) without the fakes or python3. KEEP=1 keeps the
# scratch folder.
set -uo pipefail
real=$(cd "${1:?usage: rehearse.sh BUILD gpt2|gpt_checks}" && pwd)
what=${2:?usage: rehearse.sh BUILD gpt2|gpt_checks}
src=$(cd "$(dirname "$0")/../.." && pwd)
fakes="$real/tests/cuda-fit-fake-plugins"
[ -d "$fakes" ] && command -v python3 >/dev/null || { echo "rehearse.sh: no $fakes or no python3: skipped"; exit 77; }
tmp=$(mktemp -d)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
fail() { echo "rehearse.sh $what: FAIL: $*"; exit 1; }

. "$(dirname "$0")/standin.sh"
standin_build "$real" "$tmp/build"
cat >"$tmp/build/bin/kiln" <<SH
#!/usr/bin/env bash
# stand-in kiln: every fit on the fake stack, the big models shrunk (rehearse.sh)
if [ "\$1" = fit ]; then
  shift
  args=() shrink=()
  for a in "\$@"; do
    case "\$a" in
      *gpt2_124m.cfg)
        shrink=(--set module.n_layer=1 --set module.n_embd=64 --set module.n_head=2 --set module.block_size=64
                --set data.block_size=64 --set data.vocab_size=256 --set module.vocab_size=256
                --set module.padded_vocab_size=256 --set data.batch_size=8 --set module.max_batch=8) ;;
      *gpt_fortunes.cfg) shrink=(--set module.n_layer=1 --set module.n_embd=64 --set module.n_head=2) ;;
      data.train=*.bin*)
        shard=\${a#data.train=}; shard=\${shard//\\"/}
        # once per shard: its ids folded into 256 (the header stays)
        [ -f "\$shard.folded" ] || python3 -c 'import array, sys; p = sys.argv[1]; b = open(p, "rb").read(); h, t = b[:1024], array.array("H", b[1024:]); t = array.array("H", (x % 256 for x in t)); open(p, "wb").write(h + t.tobytes())' "\$shard"
        : >"\$shard.folded" ;;
      trainer.max_steps=*) [ "\${a#trainer.max_steps=}" -gt 14 ] && a=trainer.max_steps=14 ;;
    esac
    args+=("\${a//\\"cuda\\"/\\"cudafake:cuda\\"}")
  done
  exec "$real/bin/kiln" fit "\${args[@]}" "\${shrink[@]}"
fi
exec "$real/bin/kiln" "\$@"
SH
chmod +x "$tmp/build/bin/kiln"

case "$what" in
gpt2)
  KILN_PLUGIN_PATH="$fakes" timeout 600 bash "$src/bench/gpu/gpt2.sh" "$tmp/build" "$tmp/out" >"$tmp/log" 2>&1
  rc=$?
  grep -v '^kiln: \(info\|warning\)' "$tmp/log" | tail -30
  [ "$rc" -eq 0 ] || fail "gpt2.sh exited $rc"
  python3 - "$tmp/out/bench_gpt2.jsonl" <<'PY' || fail "the report's rows"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
kiln = {r["attention"]: r for r in rows if r["check"] == "bench_gpt2"}
assert set(kiln) == {"gemm", "flash"}, rows
assert sum(r["kiln_figure"] for r in kiln.values()) == 1, rows
for a, r in kiln.items():
    assert r["status"] == "pass" and r["batch"] == 64, r  # the first batch gpt2.sh tries
    assert r["step_ms"] > 0 and r["tokens_per_s"] > 0, r
    cats = r["breakdown"]
    assert any("gemm" in k.lower() for k in cats) and any("attention" in k.lower() for k in cats), (a, cats)
    assert r.get("gemm_flops_16bit_percent") == 100.0 and r.get("gemm_flops_fp32_percent") == 0.0, (a, r)
    # the count's conversions, measured: 0 where the model keeps its activations in 16 bits (ABI 1.7's
    # KILN_KERNELS_ACT_16BIT, which the cuda table sets), every product's operands already 16-bit
    assert r.get("gemm_convert_mb_per_token", -1) == 0.0, (a, r)
    # read from the profiled run's log: the waits for the GPU and the classifier's chunk
    assert r.get("host_waits_profiled_run", 0) > 0 and r.get("classifier_chunk_rows", 0) > 0, (a, r)
    # and its kernel-table calls: one AdamW list per step of the 12, never one call per parameter
    calls = r.get("entry_calls_profiled_run", {})
    assert calls.get("adamw_update_many") == 12 and "adamw_update" not in calls and calls["total"] > 100, (a, calls)
    # and the backward's fused entries (ABI 1.11): one GELU backward with its bias sum per block, none apart
    assert calls.get("act_bias_backward", 0) > 0 and "act_backward" not in calls, (a, calls)
    assert calls.get("layernorm_backward_cast", 0) > 0, (a, calls)
print("rehearse.sh gpt2: rows:", {a: (r["step_ms"], r["tokens_per_s"], sorted(r["breakdown"])) for a, r in kiln.items()})
PY
  # the work folder's logs, probe files and memory polls kept for run.sh's
  # logs.tar.xz (each file's tail; no token shard)
  for f in b64.log flash.log profile.log profile-flash.log probe-b64.txt probe-flash.txt mem-64.txt mem-flash.txt torch.err; do
    [ -f "$tmp/out/bench_gpt2/$f" ] || { ls -la "$tmp/out/bench_gpt2"; fail "gpt2.sh did not keep $f in OUT/bench_gpt2"; }
  done
  compgen -G "$tmp/out/bench_gpt2/*.bin" >/dev/null && fail "gpt2.sh kept the token shard"
  ;;
gpt_checks)
  fortunes=/usr/share/games/fortunes
  [ -f "$fortunes/fortunes" ] || { mkdir -p "$tmp/fortunes"; for i in $(seq 400); do printf 'Fortune %d: a stitch in time saves nine.\n%%\n' "$i"; done >"$tmp/fortunes/fortunes"; fortunes="$tmp/fortunes"; }
  KILN_FORTUNES_DIR="$fortunes" KILN_PLUGIN_PATH="$fakes" ACCEL=cudafake:cuda GPT_CHECKS_QUICK=1 timeout 900 \
    bash "$src/tests/gpu/gpt_checks.sh" "$tmp/build" "$tmp/out" >"$tmp/log" 2>&1
  grep '^-- \|^   ' "$tmp/log"
  python3 - "$tmp/out/gpt.jsonl" <<'PY' || fail "the checks' rows"
import json, sys
rows = {r["check"]: r for r in map(json.loads, open(sys.argv[1]))}
for c in ("gpt_step_gemm", "gpt_step_rowwise", "gpt_step_flash", "gpt_fortunes"):
    assert rows[c]["status"] == "pass", rows.get(c)
assert rows["gpt2_124m_ddp"]["status"] == "skip", rows["gpt2_124m_ddp"]
f = rows["gpt_fortunes"]
assert all(f[k] > 0 for k in ("val_loss_fp32", "val_loss_bf16", "val_loss_bf16_flash", "tokens_per_s_bf16_flash")), f
PY
  ;;
*) echo "rehearse.sh: expected gpt2 or gpt_checks, got $what" >&2; exit 2 ;;
esac
echo "rehearse.sh $what: ok"
