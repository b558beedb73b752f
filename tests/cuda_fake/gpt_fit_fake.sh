#!/usr/bin/env bash
# tests/cuda_fake/gpt_fit_fake.sh — the gpt module on the fake cuda
# accelerator ("cudafake:cuda": plugins/cuda's host code over the fake CUDA
# runtime, cuBLASLt and kernels of tests/cuda_fake) against the same run on
# the cpu accelerator: the same module binary, no change to it. A 2-layer,
# 2-head, 32-wide GPT on byte tokens, 12 AdamW steps with warm-up, cosine
# and clipping, a validation pass and a 40-token sample at the end, in
# 32-true, bf16-mixed, 16-mixed (whose classifier backward stays fp32
# through a float32 copy of wte) and 64-true. Every 1.4 sequence entry runs on the
# fake's device memory (embedding with its uploaded buckets, layer norm,
# attention, the fused cross-entropy, add), and the fake checks every
# pointer, size and overlap. Asserts for each precision: both runs
# succeed, no contract violation, and the final training and validation
# losses agree (the fake multiplies in double where OpenBLAS uses fp32:
# 1e-3 relative in fp32, 2e-2 in bf16-mixed and 16-mixed, 1e-9 in fp64). The same in
# bf16-mixed with attention = "flash" (the fused programs, emulated). Then a run with
# the accelerator's profile = true must log the GPU time per category and
# run every GEMM FLOP on the 16-bit tensor cores with no operand converted
# and no rounding pass (bf16 activations, ABI 1.7), and a run of 9 steps
# must call cudaMalloc no more often than one of 3 (32-true, bf16-mixed)
# and wait for the GPU at most 3 times per step more; and the entries a
# steady-state step calls are counted: one update, one zero_grad, one
# weight cast, no allocation. tests/cuda_host runs this script again with
# its host-execution build (kernels/cuda's own kernels, run on the CPU) as
# the "cudafake" plugin: test_gpt_hostexec.
#   gpt_fit_fake.sh KILN TEXT2TOKENS FAKE_DIR WORK
set -u
kiln=$1 t2t=$2 fake=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
export KILN_FAKE_CUDA_QUIET=0
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
for i in $(seq 1 400); do echo "line $i: the quick brown fox jumps over the lazy dog, $((i * 7919 % 1000))"; done > "$work/text.txt"
"$t2t" -o "$work/shard.bin" "$work/text.txt" >/dev/null 2>&1 || { echo "FAIL: text2tokens"; exit 1; }

run() { # TAG ACCEL PRECISION
  mkdir -p "$work/$1"
  cat > "$work/$1/run.cfg" <<CFG
plugins = { dirs = ["$fake"]; };
trainer = { max_steps = 12; seed = 5; default_root_dir = "$work/$1/runs"; num_sanity_val_steps = 0;
  limit_val_batches = 4; val_check_interval = 12; gradient_clip_val = 1.0; threads = 1; log_every_n_steps = 1;
  peak_flops = 1e12; };  # (no GEMM-rate measurement after fit: slow on the fake)
accelerator = $2; precision = "$3";
data = { name = "tokens"; train = "$work/shard.bin"; val_fraction = 0.1; vocab_size = 256; batch_size = 4;
  block_size = 32; };
module = { name = "gpt"; n_layer = 2; n_head = 2; n_embd = 32; block_size = 32; vocab_size = 256; max_batch = 4; };
optimizer = { name = "adamw"; lr = 0.003; weight_decay = 0.1; };
scheduler = { name = "cosine"; warmup_steps = 3; t_max = 12; interval = "step"; };
callbacks = ( { name = "csv_logger"; },
  { name = "sample"; every_n_steps = 12; num_tokens = 40; temperature = 0.0; prompt = "line"; } );
CFG
  timeout -s KILL 300 "$kiln" fit "$work/$1/run.cfg" > "$work/$1/log" 2>&1
}
last() { # TAG COLUMN -> the last value of that column
  python3 - "$work/$1/runs/version_0/metrics.csv" "$2" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("#"))]
vals = [r[sys.argv[2]] for r in rows if r.get(sys.argv[2])]
print(vals[-1] if vals else "nan")
PY
}
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && b == b && d <= t * a) }'; }

for spec in "32-true 1e-3" "bf16-mixed 2e-2" "16-mixed 2e-2" "64-true 1e-9"; do
  set -- $spec
  prec=$1 tol=$2
  run "cpu_$prec" '"cpu"' "$prec" || { tail -5 "$work/cpu_$prec/log"; fail "$prec: the cpu run failed"; continue; }
  run "fake_$prec" '"cudafake:cuda"' "$prec" || { tail -20 "$work/fake_$prec/log"; fail "$prec: the fake cuda run failed"; continue; }
  grep -q "contract violation" "$work/fake_$prec/log" && fail "$prec: $(grep -m1 'contract violation' "$work/fake_$prec/log")"
  for col in train_loss_step val_loss; do
    a=$(last "cpu_$prec" $col) b=$(last "fake_$prec" $col)
    echo "  $prec $col: cpu $a, fake cuda $b"
    close "$a" "$b" "$tol" || fail "$prec: $col differs beyond $tol relative ($a vs $b)"
  done
  grep -q "sample" "$work/fake_$prec/log" || [ -s "$work/fake_$prec/runs/version_0/samples.txt" ] ||
    fail "$prec: no sample written on the fake"
done
# attention = "flash": the fused attention's block programs (emulated on the
# host by the fake, with its race and alignment checks) in bf16-mixed,
# against the cpu run; no call may fall back to the gemm path (head size 16)
if run fake_flash '{ name = "cudafake:cuda"; attention = "flash"; }' bf16-mixed; then
  grep -q "contract violation" "$work/fake_flash/log" && fail "flash: $(grep -m1 'contract violation' "$work/fake_flash/log")"
  grep -q "using the gemm path" "$work/fake_flash/log" && fail "flash: $(grep -m1 'using the gemm path' "$work/fake_flash/log")"
  for col in train_loss_step val_loss; do
    a=$(last "cpu_bf16-mixed" $col) b=$(last fake_flash $col)
    echo "  bf16-mixed flash $col: cpu $a, fake cuda $b"
    close "$a" "$b" 2e-2 || fail "flash: $col differs beyond 2e-2 relative ($a vs $b)"
  done
else
  tail -20 "$work/fake_flash/log"; fail "the flash run failed"
fi
# profile = true: the GPU time per entry and per category in the log at the end
if run fake_profile '{ name = "cudafake:cuda"; profile = true; }' bf16-mixed; then
  for cat in GEMMs attention classifier "layer norm" embedding optimizer; do
    grep -q "cuda: profile: category $cat " "$work/fake_profile/log" || fail "profile: no line for the category $cat"
  done
  grep -q "cuda: profile: entry attention_backward " "$work/fake_profile/log" || fail "profile: no line for attention_backward"
  # ABI 1.6: the Conv1D layers run through the fused linear_forward_layout
  # (never as gemm_ex + bias_add), and the logits GEMM and xent are there
  grep -q "cuda: profile: entry linear_forward_layout " "$work/fake_profile/log" ||
    fail "profile: gpt's Conv1D layers did not run through linear_forward_layout"
  ! grep -q "cuda: profile: entry bias_add " "$work/fake_profile/log" ||
    fail "profile: bias_add ran: a Conv1D layer took the unfused path"
  grep "cuda: profile: category" "$work/fake_profile/log" | head -3 | sed 's/^/  /'
  # every GEMM of a bf16-mixed step on the 16-bit tensor cores: one on the
  # fp32 units runs about 15 times slower on an H100/H200 (forward products
  # beside bf16 weights and weight gradients of two activations once did)
  units=$(grep -m1 "cuda: device 0: GEMMs" "$work/fake_profile/log")
  echo "  ${units#*cuda: }"
  pct=$(printf '%s\n' "$units" | sed -n 's/.*FLOPs: \([0-9.]*\)% on 16-bit tensor cores.*/\1/p')
  gpu_pct_ok() { awk -v p="$1" 'BEGIN { exit !(p ~ /^[0-9.]+$/ && p + 0 >= 99.95) }'; }
  gpu_pct_ok "$pct" || fail "bf16-mixed: ${pct:-no}% of the GEMM FLOPs on 16-bit tensor cores, want 100% ($units)"
  # ABI 1.7: the activations are stored in bfloat16, so no GEMM operand is
  # converted and no separate rounding pass runs
  case $units in *"operand conversions moved 0 bytes"*) ;;
    *) fail "bf16-mixed: GEMM operands were converted, so some activation was stored in float32 ($units)" ;; esac
  ! grep -q "cuda: profile: entry round_to " "$work/fake_profile/log" ||
    fail "profile: round_to ran: an activation was rounded in float32 storage"

else
  tail -5 "$work/fake_profile/log"; fail "the profiled run failed"
fi
# no allocation in the steady-state step: 3 steps and 9 steps make the same
# number of cudaMalloc calls (the accelerator's debug line at exit); and at
# most 3 host waits per step (the token check, the loss, and gradient
# clipping's norm, one sumsq_many call since ABI 1.9 where it was one wait
# per parameter: each wait leaves the GPU idle until the next launch)
steady_cfg() { # FROM TO STEPS: run FROM's config for STEPS steps into TO, no validation, no sample
  mkdir -p "$work/$2"
  sed -e "s|max_steps = 12;|max_steps = $3;|" -e "s|limit_val_batches = 4; val_check_interval = 12;|limit_val_batches = 0;|" \
      -e "s|$work/$1/runs|$work/$2/runs|" -e '/name = "sample"/d' -e 's|{ name = "csv_logger"; },|{ name = "csv_logger"; } );|' \
      "$work/$1/run.cfg" >"$work/$2/run.cfg"
}
mallocs() { # STEPS PRECISION -> "cudaMalloc calls, host waits" of a run that long
  steady_cfg "fake_$2" "steady_$1" "$1"
  # (a failed run prints to stderr and gives nothing, which fails below)
  timeout -s KILL 300 "$kiln" -v fit "$work/steady_$1/run.cfg" >"$work/steady_$1/log" 2>&1 ||
    { tail -5 "$work/steady_$1/log" >&2; return 1; }
  sed -n 's/.*cuda: device [0-9]*: \([0-9]*\) cudaMalloc calls, \([0-9]*\) host waits.*/\1 \2/p' "$work/steady_$1/log" |
    tail -1
}
# (bf16-mixed too: gpt lays its arena out again for 16-bit activations in
# its first step, never later)
for prec in 32-true bf16-mixed; do
  read -r m3 w3 <<<"$(mallocs 3 $prec)"
  read -r m9 w9 <<<"$(mallocs 9 $prec)"
  echo "  $prec: cudaMalloc calls: $m3 in 3 steps, $m9 in 9 steps; host waits: $w3 and $w9"
  [ -n "$m3" ] && [ "$m3" = "$m9" ] || fail "$prec: the steady-state step allocates ($m3 cudaMalloc calls in 3 steps, $m9 in 9)"
  [ -n "$w3" ] && [ -n "$w9" ] && [ $(( (w9 - w3) )) -le $((6 * 3)) ] ||
    fail "$prec: more than 3 host waits per steady-state step ($w3 in 3 steps, $w9 in 9; 28 parameters clipped)"
done
# the launches of a steady-state step, from the profiled entry counts of
# bf16-mixed runs of 3 and 9 steps: adamw updates every parameter with one
# adamw_update_many call (ABI 1.10; it was one adamw_update per parameter,
# 28 here and 148 in GPT-2), zero_grad clears the gradients, which lie side
# by side, with one zero (was 28), mixed precision refreshes its 10 weight
# copies with one cast (kiln/nn.h casts 5 output gradients to bf16 per
# step beside it), nothing is allocated, not even from the cache (the
# embedding's bucket index once grew with a batch's distinct tokens), and
# every residual add runs fused with the layer norm after it (ABI 1.10: 2
# per block, the last into ln_f), leaving the first block's ln_1 alone.
# ABI 1.11: each c_fc's GELU backward sums its bias gradient (1 per block;
# the other 3 Linears of a block sum theirs with bias_grad), and each layer
# norm backward whose gradient a Linear reads next writes that Linear's
# bf16 copy of it (ln_f's, and 2 per block but the first block's ln_1), so
# of the 5 output gradient casts only gpt's own of ln_f's gradient is left
# (cast: it and the weight copies)
calls() { # STEPS -> "entry calls" lines of a profiled bf16-mixed run that long
  steady_cfg fake_profile "calls_$1" "$1"
  timeout -s KILL 300 "$kiln" fit "$work/calls_$1/run.cfg" >"$work/calls_$1/log" 2>&1 ||
    { tail -5 "$work/calls_$1/log" >&2; return 1; }
  sed -n 's/.*cuda: profile: entry \([a-z_0-9]*\) .* \([0-9]*\) calls$/\1 \2/p' "$work/calls_$1/log"
}
if calls 3 >"$work/calls3.txt" && calls 9 >"$work/calls9.txt"; then
  per_step() { # ENTRY -> its calls per steady-state step
    awk -v e="$1" 'FNR == 1 { f++ } $1 == e { c[f] = $2 } END { printf "%g", (c[2] - c[1]) / 6 }' \
      "$work/calls3.txt" "$work/calls9.txt"
  }
  for spec in "adamw_update_many 1" "adamw_update 0" "zero 1" "cast 2" "alloc 0" \
              "add_layernorm_forward 4" "add 0" "layernorm_forward 1" "act_bias_backward 2" "act_backward 0" \
              "bias_grad 6" "layernorm_backward_cast 4" "layernorm_backward 1"; do
    set -- $spec
    got=$(per_step "$1")
    echo "  bf16-mixed: $1 calls per steady-state step: $got (want $2)"
    [ "$got" = "$2" ] || fail "bf16-mixed: $got $1 calls per steady-state step, want $2"
  done
else
  fail "the profiled 3- and 9-step runs failed"
fi
grep -q "gpt: activations stored in bfloat16" "$work/steady_9/log" ||
  fail "bf16-mixed: gpt did not store its activations in bfloat16 on the cuda table (ABI 1.7)"
[ "$fails" = 0 ] && echo "gpt on the fake cuda accelerator: ok" || exit 1
