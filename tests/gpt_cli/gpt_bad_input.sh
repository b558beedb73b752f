#!/usr/bin/env bash
# gpt_bad_input.sh — bad input to a `kiln fit` of the gpt module, end to end
# through the CLI: each case must exit non-zero with exactly one error line
# that names what was expected and what was found, and must leave an
# existing checkpoint byte for byte as it was.
#
#   gpt_bad_input.sh KILN TEXT2TOKENS WORKDIR
set -uo pipefail
kiln=$1 t2t=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail=0
# a byte-level shard (tokens are bytes: up to 'z' = 122)
for i in $(seq 1 200); do echo "the quick brown fox $i jumps over the lazy dog"; done > "$work/text.txt"
"$t2t" -o "$work/shard.bin" "$work/text.txt" >/dev/null || { echo "FAIL: kiln-text2tokens"; exit 1; }

cfg() { # $1 = file, then overrides of the module keys as text
  cat > "$1" <<CFG
trainer = { max_steps = 2; seed = 3; default_root_dir = "$work/runs"; num_sanity_val_steps = 0; threads = 1; };
accelerator = "cpu";
precision = "32-true";
data = { name = "tokens"; train = "$work/shard.bin"; vocab_size = 256; batch_size = 2; block_size = 8; shuffle = false; };
module = { name = "gpt"; n_layer = 1; n_head = 2; n_embd = 16; block_size = 8; vocab_size = 256; max_batch = 2; };
optimizer = { name = "adamw"; lr = 0.001; };
CFG
}
cfg "$work/good.cfg"

# expect NAME NEEDLE... -- ARGS: kiln fails with one error line holding every needle
expect() {
  local name=$1; shift
  local needles=()
  while [ "$1" != "--" ]; do needles+=("$1"); shift; done
  shift
  "$kiln" -q "$@" > "$work/$name.out" 2> "$work/$name.err"
  local rc=$?
  local lines
  lines=$(grep -c "error" "$work/$name.err")
  local ok=1
  [ $rc -ne 0 ] || ok=0
  [ "$lines" -eq 1 ] || ok=0
  for n in "${needles[@]}"; do grep -qF -- "$n" "$work/$name.err" || ok=0; done
  if [ $ok = 1 ]; then echo "ok   $name: $(grep error "$work/$name.err")"
  else echo "FAIL $name (exit $rc, $lines error lines; wanted: ${needles[*]}):"; cat "$work/$name.err"; fail=1; fi
}

# a good run leaves a checkpoint the later cases must not touch
"$kiln" -q fit "$work/good.cfg" > "$work/good.out" 2>&1 || { echo "FAIL: the good run"; cat "$work/good.out"; exit 1; }
ck="$work/runs/version_0/checkpoints/last.safetensors"
[ -s "$ck" ] || { echo "FAIL: no checkpoint $ck"; exit 1; }
sum_before=$(sha256sum "$ck" | cut -d' ' -f1)

expect windows-longer-than-block_size "block_size" "16" "8" -- \
  fit "$work/good.cfg" --set data.block_size=16
expect token-beyond-vocab "vocab_size" "64" -- \
  fit "$work/good.cfg" --set module.vocab_size=64
expect n_embd-not-divisible "n_embd" "n_head" "18" -- \
  fit "$work/good.cfg" --set module.n_embd=18 --set module.n_head=4
expect checkpoint-other-width "transformer.wte.weight" "[256, 16]" "[256, 32]" -- \
  fit "$work/good.cfg" --set module.n_embd=32 --ckpt "$ck" --weights-only
expect block_size-beyond-wpe "transformer.wpe.weight" "[8, 16]" "[16, 16]" -- \
  fit "$work/good.cfg" --set module.block_size=16 --ckpt "$ck" --weights-only
expect checkpoint-other-depth "transformer.h.1.ln_1.weight" -- \
  fit "$work/good.cfg" --set module.n_layer=2 --ckpt "$ck"
# another model's weights (an MLP's names) as a plain safetensors file
python3 - "$work/mlp.safetensors" <<'PY2'
import json, struct, sys
hdr = json.dumps({"layers.0.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(hdr)) + hdr + bytes(16))
PY2
expect other-architecture "has no tensor" "transformer.wte.weight" -- \
  test "$work/good.cfg" --ckpt "$work/mlp.safetensors"

sum_after=$(sha256sum "$ck" | cut -d' ' -f1)
if [ "$sum_before" != "$sum_after" ]; then echo "FAIL: the checkpoint changed"; fail=1; else echo "ok   checkpoint unchanged"; fi
[ $fail = 0 ] && echo "all bad-input cases refused in one line" || exit 1
