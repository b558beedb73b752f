#!/usr/bin/env bash
# tests/fit.sh — a short fit of mlp on Fashion-MNIST under fp8-sim must
# learn: the mean training loss of its last 10 logged steps is below 80 % of
# its first 5's, and the validation accuracy beats 60 %. The same run with
# grad_dtype = "none" must learn too. Exit 77 (skipped) without the data.
#   fit.sh KILN PLUGIN_BUILD_DIR RUN.cfg
set -eu
kiln=$1 plugins=$2 cfg=$3
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "no $data: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export KILN_PLUGIN_PATH=$plugins
for g in float8_e5m2 none; do
  "$kiln" -q fit "$cfg" --set trainer.max_epochs=1 --set trainer.limit_train_batches=60 \
    --set trainer.limit_val_batches=5 --set trainer.log_every_n_steps=1 --set trainer.threads=1 \
    --set "precision.grad_dtype=\"$g\"" --set "trainer.default_root_dir=\"$tmp/$g\"" > "$tmp/$g.txt"
  grep -q "precision: fp8-sim" "$tmp/$g.txt"
  python3 - "$tmp/$g/version_0/metrics.csv" "$g" <<'PY'
import csv, sys
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("#")))
loss = [float(r["train_loss_step"]) for r in rows if r.get("train_loss_step")]
acc = [float(r["val_acc"]) for r in rows if r.get("val_acc")]
first, last = sum(loss[:5]) / 5, sum(loss[-10:]) / 10
print("fp8-sim, gradients %s: loss %.4f -> %.4f over %d steps, val_acc %.3f" % (sys.argv[2], first, last, len(loss), acc[-1]))
if not (last < 0.8 * first and acc[-1] > 0.6):
    sys.exit("fp8-sim did not learn")
PY
done
