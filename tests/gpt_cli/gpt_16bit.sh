#!/usr/bin/env bash
# gpt_16bit.sh — 16-bit storage changes no result. gpt in bf16-mixed on the
# cpu accelerator is compared with the same accelerator built against frozen
# older headers, whose table lacks a storage capability:
#   logits       vs "cpu15:cpu" (libkiln-cpu15.so, no KILN_KERNELS_STORE_16BIT,
#                ABI 1.6): the classifier's logits in bfloat16 vs float32;
#   activations  vs "cpu16:cpu" (libkiln-cpu16.so, no KILN_KERNELS_ACT_16BIT,
#                ABI 1.7): every block activation in bfloat16 vs float32;
#   biases       vs "cpu17:cpu" (libkiln-cpu17.so, no KILN_KERNELS_BIAS_ROUND,
#                ABI 1.8): each Linear's bias rounded to bfloat16 by the
#                accelerator vs by kiln/nn.h on a copy;
#   residuals    vs "cpu19:cpu" (libkiln-cpu19.so, no add_layernorm_forward,
#                ABI 1.9): each residual add fused with the layer norm after
#                it vs the two entries apart (also in 32-true and 64-true:
#                the fusion does not depend on the precision);
#   backward     vs "cpu110:cpu" (libkiln-cpu110.so, no act_bias_backward or
#                layernorm_backward_cast, ABI 1.10): c_fc's GELU backward
#                fused with its bias gradient, and each layer norm backward
#                writing the 16-bit copy of its gradient, vs the entries
#                apart (also in 16-mixed, 32-true and 64-true).
# Eight steps of AdamW on the tokens plugin, with a validation pass every
# four, must end with the same weights, bit for bit (the weightdump fixture
# writes them), and log the same losses; each run's log must show which
# storage the module took, so the two runs provably went different ways.
#
#   gpt_16bit.sh KILN TEXT2TOKENS WORKDIR logits|activations|biases|residuals|backward
#   (KILN_PLUGIN_PATH reaches weightdump and the fixture directory)
set -euo pipefail
kiln=$1 t2t=$2 work=$3 what=$4
case $what in
  logits) old=cpu15:cpu new_says="classifier logits stored in bfloat16$"
          old_says="classifier logits stored in float32 (the accelerator's table lacks KILN_KERNELS_STORE_16BIT" ;;
  activations) old=cpu16:cpu new_says="activations stored in bfloat16; activation arena"
          old_says="activations stored in float32 (the accelerator's table lacks KILN_KERNELS_ACT_16BIT" ;;
  biases) old=cpu17:cpu new_says="biases added in bfloat16, rounded by the accelerator$"
          old_says="biases added in bfloat16, rounded by the module (the accelerator's table lacks KILN_KERNELS_BIAS_ROUND" ;;
  residuals) old=cpu19:cpu new_says="gpt: residual adds fused with the layer norms after them;"
          old_says="gpt: residual adds and layer norms apart (the accelerator's table lacks add_layernorm_forward" ;;
  backward) old=cpu110:cpu
          new_says="GELU backward fused with c_fc's bias gradient, layer norm backwards with the 16-bit copies of their gradients$"
          old_says="GELU backward and bias gradients apart (the accelerator's table lacks act_bias_backward" ;;
  *) echo "usage: gpt_16bit.sh KILN TEXT2TOKENS WORKDIR logits|activations|biases|residuals|backward"; exit 2 ;;
esac
precs=bf16-mixed
[ "$what" = residuals ] && precs="bf16-mixed 32-true 64-true"
# backward: two batches accumulated per step, so each fused bias sum adds
# into a gradient that already holds the first batch's
accum=1
[ "$what" = backward ] && precs="bf16-mixed 16-mixed 32-true 64-true" accum=2
rm -rf "$work" && mkdir -p "$work"
for prec in $precs; do
w=$work/$prec
mkdir -p "$w"
for i in $(seq 1 200); do echo "line $i: sphinx of black quartz, judge my vow"; done > "$w/text.txt"
"$t2t" -o "$w/shard.bin" "$w/text.txt" >/dev/null 2>&1
for acc in cpu "$old"; do
  tag=${acc%%:*}
  cat > "$w/run.cfg" <<CFG
trainer = { max_steps = 8; seed = 5; default_root_dir = "$w/runs-$tag"; num_sanity_val_steps = 0; threads = 2;
            val_check_interval = 4; limit_val_batches = 2; accumulate_grad_batches = $accum; };
accelerator = "$acc";
precision = "$prec";
data = { name = "tokens"; train = "$w/shard.bin"; val_fraction = 0.1; vocab_size = 256; batch_size = 2;
         block_size = 16; };
module = { name = "gpt"; n_layer = 2; n_head = 2; n_embd = 32; block_size = 16; vocab_size = 256; max_batch = 2;
           classifier_chunk = 5; };
optimizer = { name = "adamw"; lr = 0.003; };
CFG
  "$kiln" -v fit "$w/run.cfg" --set "callbacks=({name=\"weightdump\"; path=\"$w/w-$tag.bin\";}, {name=\"csv_logger\";})" \
    > "$w/$tag.log" 2>&1 || { echo "FAIL: the run on $acc failed"; cat "$w/$tag.log"; exit 1; }
done
# the module says which storage it chose: the two runs took different paths
grep -q "$new_says" "$w/cpu.log" ||
  { echo "FAIL: the run on cpu did not log \"$new_says\""; grep "stored in" "$w/cpu.log"; exit 1; }
grep -q "$old_says" "$w/${old%%:*}.log" ||
  { echo "FAIL: the run on ${old%%:*} did not log \"$old_says\""; grep "stored in" "$w/${old%%:*}.log"; exit 1; }
m1=$(find "$w/runs-cpu" -name metrics.csv | head -1) m2=$(find "$w/runs-${old%%:*}" -name metrics.csv | head -1)
[ -s "$m1" ] && [ -s "$m2" ] || { echo "FAIL: no metrics.csv"; exit 1; }
grep -q "val_loss" "$m1" || { echo "FAIL: no validation loss was logged"; head -3 "$m1"; exit 1; }
if ! cmp -s "$m1" "$m2"; then echo "FAIL: the logged losses differ"; diff "$m1" "$m2" | head; exit 1; fi
if cmp -s "$w/w-cpu.bin" "$w/w-${old%%:*}.bin"; then
  echo "ok   $prec: the $what on cpu and on ${old%%:*} (two ways) end with the same weights and losses, bit for bit"
else
  echo "FAIL: the weights differ between cpu and ${old%%:*}"; exit 1
fi
done
