#!/usr/bin/env bash
# tests/resume.sh — exact resume with the lion optimizer: a fit of 4 short
# epochs against a fit of 2 epochs resumed (--ckpt last) to 4. Every tensor
# of the two final checkpoints/last.safetensors (the weights and lion's
# momenta) must be equal bit for bit. Exit 77 (skipped) without the data.
#   resume.sh KILN PLUGIN_BUILD_DIR RUN.cfg
set -eu
kiln=$1 plugins=$2 cfg=$3
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "no $data: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export KILN_PLUGIN_PATH=$plugins
short=(--set trainer.limit_train_batches=12 --set trainer.limit_val_batches=2 --set trainer.num_sanity_val_steps=0
       --set trainer.threads=1 --set 'module.layers=[784, 32, 10]' --set optimizer.lr=0.001)
"$kiln" -q fit "$cfg" "${short[@]}" --set trainer.max_epochs=4 --set "trainer.default_root_dir=\"$tmp/full\""
"$kiln" -q fit "$cfg" "${short[@]}" --set trainer.max_epochs=2 --set "trainer.default_root_dir=\"$tmp/part\""
"$kiln" -q fit "$cfg" "${short[@]}" --set trainer.max_epochs=4 --set "trainer.default_root_dir=\"$tmp/part\"" \
  --ckpt last
python3 - "$tmp/full/version_0/checkpoints/last.safetensors" "$tmp/part/version_1/checkpoints/last.safetensors" <<'PY'
# every tensor of two safetensors files, by name: equal bytes (the JSON
# header's metadata, e.g. paths, may differ)
import json, struct, sys
def tensors(path):
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n])
    body = blob[8 + n:]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
if a.keys() != b.keys():
    sys.exit("tensor names differ: %s" % sorted(set(a) ^ set(b)))
bad = [k for k in a if a[k] != b[k]]
if bad:
    sys.exit("tensors differ after resume: %s" % ", ".join(sorted(bad)))
print("resume: %d tensors equal bit for bit (%s)" % (len(a), ", ".join(sorted(a)[:6])))
PY
