#!/usr/bin/env bash
# gpt_store16.sh — ABI 1.6's 16-bit logits change no result: gpt in
# bf16-mixed keeps the classifier's logits in bfloat16 on the 1.6 cpu
# accelerator (KILN_KERNELS_STORE_16BIT) and in float32 on the same
# accelerator built against the frozen 1.5 headers (libkiln-cpu15.so, named
# "cpu15:cpu"). Eight steps of AdamW on the tokens plugin must end with the
# same weights, bit for bit (the weightdump fixture writes them), and log
# the same losses.
#
#   gpt_store16.sh KILN TEXT2TOKENS WORKDIR
#   (KILN_PLUGIN_PATH reaches weightdump and the abi15 fixture directory)
set -euo pipefail
kiln=$1 t2t=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
for i in $(seq 1 200); do echo "line $i: sphinx of black quartz, judge my vow"; done > "$work/text.txt"
"$t2t" -o "$work/shard.bin" "$work/text.txt" >/dev/null 2>&1
for acc in cpu cpu15:cpu; do
  tag=${acc%%:*}
  cat > "$work/run.cfg" <<CFG
trainer = { max_steps = 8; seed = 5; default_root_dir = "$work/runs-$tag"; num_sanity_val_steps = 0; threads = 2; };
accelerator = "$acc";
precision = "bf16-mixed";
data = { name = "tokens"; train = "$work/shard.bin"; vocab_size = 256; batch_size = 2; block_size = 16; };
module = { name = "gpt"; n_layer = 2; n_head = 2; n_embd = 32; block_size = 16; vocab_size = 256; max_batch = 2;
           classifier_chunk = 5; };
optimizer = { name = "adamw"; lr = 0.003; };
CFG
  "$kiln" -v fit "$work/run.cfg" --set "callbacks=({name=\"weightdump\"; path=\"$work/w-$tag.bin\";}, {name=\"csv_logger\";})" \
    > "$work/$tag.log" 2>&1 || { echo "FAIL: the run on $acc failed"; cat "$work/$tag.log"; exit 1; }
done
# the module says which storage it chose: the two runs took different paths
grep -q "classifier logits stored in bfloat16$" "$work/cpu.log" ||
  { echo "FAIL: on the 1.6 accelerator the logits were not bfloat16"; grep "logits stored" "$work/cpu.log"; exit 1; }
grep -q "classifier logits stored in float32 (the accelerator's table lacks KILN_KERNELS_STORE_16BIT" "$work/cpu15.log" ||
  { echo "FAIL: on the 1.5 accelerator (cpu15) the logits were not float32"; grep "logits stored" "$work/cpu15.log"; exit 1; }
m1=$(find "$work/runs-cpu" -name metrics.csv | head -1) m2=$(find "$work/runs-cpu15" -name metrics.csv | head -1)
[ -s "$m1" ] && [ -s "$m2" ] || { echo "FAIL: no metrics.csv"; exit 1; }
if ! cmp -s "$m1" "$m2"; then echo "FAIL: the logged losses differ"; diff "$m1" "$m2" | head; exit 1; fi
if cmp -s "$work/w-cpu.bin" "$work/w-cpu15.bin"; then
  echo "ok   bf16-mixed: bfloat16 logits (1.6 table) and float32 logits (1.5 table) end with the same weights and losses, bit for bit"
else
  echo "FAIL: the weights differ between the 1.6 and the 1.5 accelerator"; exit 1
fi
