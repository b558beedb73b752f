#!/usr/bin/env bash
# tests/ddp/ddp_hang.sh — "one rank failing takes the job down with a message
# naming the rank, not a hang": rank 1 stops itself (SIGSTOP, the killer
# fixture) at epoch 0, batch 3 — alive but never answering, which the
# launcher cannot notice — and rank 0 must fail its next collective after
# ddp's timeout_s (3 s here) with one line naming the rank and the
# collective, and the whole job must end well within the test's limit.
# Exit 77 (skipped) without the dataset.
#   ddp_hang.sh KILN MPIEXEC TRAIN_FIXTURES
set -u
kiln=$1 mpiexec=$2 train=$3
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "no $data: skipped"; exit 77; }
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)
timeout -s KILL 120 "$mpiexec" -n 2 "$kiln" -q fit "$root/examples/fashion_mnist.cfg" \
  --set strategy=ddp --set strategy.timeout_s=3.0 --set data.batch_size=32 --set trainer.limit_train_batches=12 \
  --set trainer.limit_val_batches=2 --set trainer.max_epochs=1 --set trainer.threads=1 \
  --set "plugins.dirs=[\"$train\"]" --set 'module.layers=[784, 64, 10]' \
  --set "trainer.default_root_dir=\"$tmp/runs\"" \
  --set 'callbacks=({name="killer"; every=0; kill_at="batch_end"; kill_epoch=0; kill_batch=3; signal="STOP"; rank=1;})' \
  >"$tmp/log" 2>&1
status=$?
took=$(($(date +%s) - t0))
cat "$tmp/log"
[ "$status" -ne 0 ] || { echo "FAIL: the job with a hung rank exited 0"; exit 1; }
[ "$status" -ne 137 ] || { echo "FAIL: the job hung until the test's 120 s limit killed it"; exit 1; }
grep -q "rank 0 of 2: .* did not complete within timeout_s = 3 s" "$tmp/log" ||
  { echo "FAIL: no timeout message naming rank 0 and the collective"; exit 1; }
[ "$took" -lt 60 ] || { echo "FAIL: the job took $took s to end (timeout 3 s)"; exit 1; }
echo "hung rank 1: rank 0 timed out after 3 s, job ended in $took s with status $status"
