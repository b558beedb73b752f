#!/usr/bin/env bash
# tests/ddp/ddp_resume.sh — "a checkpoint written under 2 ranks resumes under
# 2 ranks exactly": Fashion-MNIST (idx, sharded), mlp, AdamW on 2 ranks; the
# killer fixture requests a checkpoint after every batch and SIGKILLs the
# job at epoch 1, batch 7; the resumed job's final weights (each rank's, from
# ddpdump) must equal an uninterrupted 2-rank run's byte for byte.
# Then 16-mixed with a huge initial scale under 2 ranks: steps are skipped
# and both ranks stay identical. Exit 77 (skipped) without the dataset.
#   ddp_resume.sh KILN MPIEXEC TRAIN_FIXTURES DDP_FIXTURES
set -u
kiln=$1 mpiexec=$2 train=$3 ddp=$4
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "no $data: skipped"; exit 77; }
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--set strategy=ddp --set data.batch_size=32 --set trainer.limit_train_batches=12 --set trainer.limit_val_batches=2
        --set trainer.max_epochs=2 --set trainer.threads=1 --set "plugins.dirs=[\"$train\", \"$ddp\"]"
        --set 'module.layers=[784, 64, 10]')
run() { # root dir, killer settings, dump path, extra args...
  local dir=$1 killer=$2 dump=$3; shift 3
  "$mpiexec" -n 2 "$kiln" -q fit "$root/examples/fashion_mnist.cfg" "${common[@]}" \
    --set "trainer.default_root_dir=\"$dir\"" \
    --set "callbacks=({name=\"killer\"; $killer}, {name=\"ddpdump\"; path=\"$dump\";})" "$@"
}
run "$tmp/full" "every=0;" "$tmp/full.bin" >"$tmp/full.log" 2>&1 || { cat "$tmp/full.log"; exit 1; }
run "$tmp/k" "every=1; kill_at=\"batch_end\"; kill_epoch=1; kill_batch=7;" "$tmp/k.bin" >"$tmp/k.log" 2>&1
status=$?
[ "$status" -ne 0 ] || { echo "the killed job exited 0"; exit 1; }
[ ! -e "$tmp/k.bin.0" ] || { echo "the killed job reached on_fit_end"; exit 1; }
run "$tmp/k" "every=1;" "$tmp/k.bin" --ckpt last >"$tmp/r.log" 2>&1 || { cat "$tmp/r.log"; exit 1; }
grep -q "steps: 24 " "$tmp/r.log" || { echo "resumed job did not end at step 24"; cat "$tmp/r.log"; exit 1; }
for r in 0 1; do
  cmp "$tmp/full.bin.$r" "$tmp/k.bin.$r" || { echo "rank $r: resumed weights differ"; exit 1; }
done
cmp "$tmp/full.bin.0" "$tmp/full.bin.1" || { echo "ranks differ"; exit 1; }
echo "2-rank kill at epoch 1 batch 7 and resume: weights identical on both ranks"

# 16-mixed under ddp: an fp16 overflow on either rank is inf on both after
# the all-reduce, so both skip the same steps and stay bit-identical.
run "$tmp/amp" "every=0;" "$tmp/amp.bin" --set precision=16-mixed --set precision.init_scale=16777216.0 \
  >"$tmp/amp.log" 2>&1 || { cat "$tmp/amp.log"; exit 1; }
skipped=$(sed -n 's/.*skipped steps: \([0-9]*\).*/\1/p' "$tmp/amp.log" | head -1)
[ -n "$skipped" ] && [ "$skipped" -gt 0 ] || { echo "16-mixed under ddp: expected skipped steps, found '$skipped'"; exit 1; }
cmp "$tmp/amp.bin.0" "$tmp/amp.bin.1" || { echo "16-mixed under ddp: ranks differ"; exit 1; }
echo "16-mixed under ddp: $skipped skipped steps, ranks identical"
