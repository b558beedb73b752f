#!/usr/bin/env bash
# actround.sh — a precision decides how activations are rounded (ABI 1.5
# round_activation), end to end through the CLI with the actround fixture:
#  - mlp [3, 8, 2] on toydata: the two Linear outputs are the sites
#    ("layers.0.weight", "layers.1.weight"), each once in the log;
#    actround with dtype "none" trains to 32-true's weights bit for bit (the
#    host's service and the layers' calls change nothing by themselves),
#    with float8_e4m3fn the weights differ (the rounding reached the
#    forward), and with float8_e4m3fn at scale 2^-20 (every activation
#    below E4M3's smallest subnormal: zero) the loss is ln 2 exactly;
#  - gpt (1 layer) on a byte shard: every Linear of the block and the
#    attention output ("...attn.c_attn.weight:attention") are sites.
#   actround.sh KILN TEXT2TOKENS FP8_FIXTURES TRAIN_FIXTURES WORKDIR
set -uo pipefail
kiln=$1 t2t=$2 fx=$3 train=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
fail=0
no() { echo "FAIL: $*"; fail=1; }

mlp() { # TAG PRECISION
  cat > "$work/$1.cfg" <<CFG
plugins = { dirs = ["$fx", "$train"]; };
trainer = { max_epochs = 2; seed = 5; default_root_dir = "$work/runs-$1"; num_sanity_val_steps = 0; threads = 1;
  log_every_n_steps = 1; };
data = { name = "toydata"; n_train = 3; n_val = 1; };
module = { name = "mlp"; layers = [3, 8, 2]; };
optimizer = { name = "sgd"; lr = 0.1; };
precision = $2;
callbacks = ( { name = "weightdump"; path = "$work/$1.bin"; }, { name = "csv_logger"; } );
CFG
  "$kiln" fit "$work/$1.cfg" > "$work/$1.log" 2>&1 || { tail -5 "$work/$1.log"; no "mlp $1: the run failed"; }
}
mlp fp32 '"32-true"'
mlp none '{ name = "actround"; dtype = "none"; }'
mlp e4m3 '{ name = "actround"; dtype = "float8_e4m3fn"; }'
mlp zero '{ name = "actround"; dtype = "float8_e4m3fn"; scale = 9.5367431640625e-07; }'
sites=$(grep -o "actround: site [^ ]*" "$work/e4m3.log" | cut -d' ' -f3 | tr '\n' ' ')
[ "$sites" = "layers.0.weight layers.1.weight " ] || no "mlp sites: '$sites'"
cmp -s "$work/fp32.bin" "$work/none.bin" || no "actround with dtype none changed the weights"
cmp -s "$work/fp32.bin" "$work/e4m3.bin" && no "float8_e4m3fn activations did not change the weights"
loss=$(awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="train_loss_step") c=i} NR==2{print $c}' "$work/runs-zero/version_0/metrics.csv")
awk -v l="$loss" 'BEGIN { exit !(l + 0 == 0.693147182) }' || no "all-zero activations: loss $loss, expected ln 2"

# gpt: the block's Linears and the attention output
for i in $(seq 1 100); do echo "the quick brown fox $i jumps over the lazy dog"; done > "$work/text.txt"
"$t2t" -o "$work/shard.bin" "$work/text.txt" >/dev/null || { echo "FAIL: kiln-text2tokens"; exit 1; }
cat > "$work/gpt.cfg" <<CFG
plugins = { dirs = ["$fx"]; };
trainer = { max_steps = 2; seed = 3; default_root_dir = "$work/runs-gpt"; num_sanity_val_steps = 0; threads = 1; };
precision = { name = "actround"; dtype = "float8_e5m2"; };
data = { name = "tokens"; train = "$work/shard.bin"; vocab_size = 256; batch_size = 2; block_size = 8; shuffle = false; };
module = { name = "gpt"; n_layer = 1; n_head = 2; n_embd = 16; block_size = 8; vocab_size = 256; max_batch = 2; };
optimizer = { name = "adamw"; lr = 0.001; };
CFG
"$kiln" fit "$work/gpt.cfg" > "$work/gpt.log" 2>&1 || { tail -5 "$work/gpt.log"; no "gpt: the run failed"; }
for s in transformer.h.0.attn.c_attn.weight transformer.h.0.attn.c_attn.weight:attention \
         transformer.h.0.attn.c_proj.weight transformer.h.0.mlp.c_fc.weight transformer.h.0.mlp.c_proj.weight; do
  grep -q "actround: site $s n=" "$work/gpt.log" || no "gpt: no site $s"
done
[ "$fail" = 0 ] && echo "activation rounding by the precision: ok"
exit $fail
