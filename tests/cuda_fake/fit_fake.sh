#!/usr/bin/env bash
# tests/cuda_fake/fit_fake.sh — `kiln fit` end to end on the fake cuda
# accelerator ("cudafake:cuda": plugins/cuda's host code over the fake CUDA
# runtime, cuBLASLt and kernels of tests/cuda_fake, which check every call),
# against the same run on the cpu accelerator: Fashion-MNIST, mlp
# [784, 64, 10] with GELU (so linear_forward takes cuBLASLt's GELU_AUX_BIAS
# epilogue), AdamW, 20 steps, in 32-true, bf16-mixed, 64-true and 16-mixed started at
# a scale that overflows (so unscale_check finds inf and steps are skipped).
# Asserts for each: both runs succeed, the fake saw no contract violation,
# the same number of skipped steps, and the final training loss agrees (the
# fake multiplies in double where OpenBLAS uses fp32 FMAs: 1e-3 relative in
# fp32, 2e-2 where 16-bit rounding can fall the other way). And once more
# in 32-true with gradient clipping by value (the 1.5 clamp entry), and
# in 64-true with L-BFGS instead of AdamW (it amplifies rounding
# differences: in fp32 the two runs end 10% apart, in float64 within 1e-6,
# where a wrong copy of its state would not). And the
# gan module (manual optimization: two AdamW optimizers toggled, manual
# backward, a sample grid read back from the device each epoch): the same
# final losses (1e-3 relative) and the grid written. And nan_guard on a
# run whose first step makes every weight infinite (lr = 1e300): both stop
# with the same line, the fake's through its read-back of device memory.
# The fake's device
# memory is sealed from host code, so any plugin or host path here that
# reads a tensor without copying it back fails the run.
# Exit 77 (skipped) without the dataset.
#   fit_fake.sh KILN TRAIN_FIXTURES FAKE_DIR
set -u
kiln=$1 train=$2 fake=$3
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "no $data: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export KILN_FAKE_CUDA_QUIET=0
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

run() { # TAG ACCEL PRECISION [TRAINER_KEYS]   (OPT: another optimizer)
  local opt=${OPT:-'{ name = "adamw"; lr = 1e-3; }'}
  mkdir -p "$tmp/$1"
  cat > "$tmp/$1/run.cfg" <<CFG
plugins = { dirs = ["$train", "$fake"]; };
trainer = { max_epochs = 1; seed = 7; default_root_dir = "$tmp/$1/runs"; limit_train_batches = 20;
  limit_val_batches = 0; num_sanity_val_steps = 0; threads = 1; log_every_n_steps = 1; ${4:-} };
accelerator = "$2"; precision = $3;
data = { name = "idx"; dir = "$data"; batch_size = 32; };
module = { name = "mlp"; layers = [784, 64, 10]; activation = "gelu"; };
optimizer = $opt;
callbacks = ( { name = "csv_logger"; } );
CFG
  timeout -s KILL 300 "$kiln" fit "$tmp/$1/run.cfg" > "$tmp/$1/log" 2>&1
}
last_loss() { # TAG [COLUMN] -> COLUMN (train_loss_epoch) of the last row that has it
  python3 - "$tmp/$1/runs/version_0/metrics.csv" "${2:-train_loss_epoch}" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("#"))]
vals = [r[sys.argv[2]] for r in rows if r.get(sys.argv[2])]
print(vals[-1] if vals else "nan")
PY
}
skipped() { sed -n 's/.*skipped steps: \([0-9]*\).*/\1/p' "$tmp/$1/log" | head -1; }

check() { # NAME PRECISION TOL [TRAINER_KEYS]
  local name=$1 prec=$2 tol=$3 keys=${4:-}
  run "cpu_$name" cpu "$prec" "$keys" || { tail -5 "$tmp/cpu_$name/log"; fail "$name: the cpu run failed"; return; }
  run "fake_$name" cudafake:cuda "$prec" "$keys" || { tail -20 "$tmp/fake_$name/log"; fail "$name: the fake cuda run failed"; return; }
  grep -q "contract violation" "$tmp/fake_$name/log" && fail "$name: $(grep -m1 'contract violation' "$tmp/fake_$name/log")"
  local a b sa sb
  a=$(last_loss "cpu_$name") b=$(last_loss "fake_$name") sa=$(skipped "cpu_$name") sb=$(skipped "fake_$name")
  echo "  $name: train loss cpu $a, fake cuda $b; skipped steps $sa / $sb"
  [ -n "$sa" ] && [ "$sa" = "$sb" ] || fail "$name: skipped steps differ ($sa on the cpu, $sb on the fake)"
  awk -v a="$a" -v b="$b" -v t="$tol" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && b == b && d <= t * a) }' ||
    fail "$name: losses differ beyond $tol relative ($a vs $b)"
}
check fp32 '"32-true"' 1e-3
check bf16 '"bf16-mixed"' 2e-2
check fp16 '{ name = "16-mixed"; init_scale = 16777216.0; }' 2e-2
check fp64 '"64-true"' 1e-9
# gradient clipping by value: the kernel table's clamp entry (ABI 1.5) on
# device memory, which the host could not clip before
check clipval '"32-true"' 1e-3 'gradient_clip_val = 0.001; gradient_clip_algorithm = "value";'
# L-BFGS: its closure evaluated several times per step, its history and
# line search staged through copies of device memory
OPT='{ name = "lbfgs"; lr = 1.0; max_iter = 5; history_size = 5; }' check lbfgs '"64-true"' 1e-6
grep -q "skipped steps: 0" "$tmp/fake_fp16/log" && fail "fp16: no step was skipped (the overflow path was not exercised)"

nan_run() { # TAG ACCEL -> status of a run nan_guard must stop
  mkdir -p "$tmp/$1"
  cat > "$tmp/$1/run.cfg" <<CFG
plugins = { dirs = ["$train", "$fake"]; };
trainer = { max_epochs = 1; seed = 7; default_root_dir = "$tmp/$1/runs"; limit_train_batches = 5;
  limit_val_batches = 0; num_sanity_val_steps = 0; threads = 1; };
accelerator = "$2"; precision = "32-true";
data = { name = "idx"; dir = "$data"; batch_size = 32; };
module = { name = "mlp"; layers = [784, 64, 10]; activation = "gelu"; };
optimizer = { name = "sgd"; lr = 1e300; };
callbacks = ( { name = "nan_guard"; } );
CFG
  timeout -s KILL 300 "$kiln" fit "$tmp/$1/run.cfg" > "$tmp/$1/log" 2>&1
}
nan_line() { sed -n 's/.*failed: \(nan_guard: .*\) \[KILN_E_.*/\1/p' "$tmp/$1/log" | head -1; }
nan_run cpu_nan cpu && fail "nan_guard: the cpu run with lr = 1e300 succeeded"
nan_run fake_nan cudafake:cuda && fail "nan_guard: the fake cuda run with lr = 1e300 succeeded"
grep -q "contract violation" "$tmp/fake_nan/log" && fail "nan_guard: $(grep -m1 'contract violation' "$tmp/fake_nan/log")"
a=$(nan_line cpu_nan) b=$(nan_line fake_nan)
echo "  nan_guard: cpu '$a'"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "nan_guard: the fake cuda run stopped with '$b'"

gan() { # TAG ACCEL
  mkdir -p "$tmp/$1"
  cat > "$tmp/$1/run.cfg" <<CFG
plugins = { dirs = ["$train", "$fake"]; };
trainer = { max_epochs = 1; seed = 42; default_root_dir = "$tmp/$1/runs"; limit_train_batches = 20;
  limit_val_batches = 2; num_sanity_val_steps = 0; threads = 1; log_every_n_steps = 1; };
accelerator = "$2"; precision = "32-true";
data = { name = "idx"; dir = "$data"; batch_size = 32; val_split = 5000; normalize_mean = 0.5; normalize_std = 0.5; };
module = { name = "gan"; latent = 16; hidden = 64; image_size = 784; samples = 16; grid_every = 1; };
optimizers = (
  { name = "adamw"; params = ["generator.*"]; lr = 2e-4; beta1 = 0.5; weight_decay = 0.0; },
  { name = "adamw"; params = ["discriminator.*"]; lr = 2e-4; beta1 = 0.5; weight_decay = 0.0; } );
callbacks = ( { name = "csv_logger"; } );
CFG
  timeout -s KILL 300 "$kiln" fit "$tmp/$1/run.cfg" > "$tmp/$1/log" 2>&1
}
if ! gan cpu_gan cpu; then tail -5 "$tmp/cpu_gan/log"; fail "gan: the cpu run failed"
elif ! gan fake_gan cudafake:cuda; then tail -20 "$tmp/fake_gan/log"; fail "gan: the fake cuda run failed"
else
  grep -q "contract violation" "$tmp/fake_gan/log" && fail "gan: $(grep -m1 'contract violation' "$tmp/fake_gan/log")"
  [ -s "$tmp/fake_gan/runs/version_0/samples_epoch_000.png" ] || fail "gan: no sample grid on the fake cuda run"
  for col in g_loss_epoch d_loss_epoch; do
    a=$(last_loss cpu_gan $col) b=$(last_loss fake_gan $col)
    echo "  gan: $col cpu $a, fake cuda $b"
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a == a && b == b && d <= 1e-3 * a) }' ||
      fail "gan: $col differs beyond 1e-3 relative ($a vs $b)"
  done
fi
[ "$fails" = 0 ] && echo "fit on the fake cuda accelerator: ok" || exit 1
