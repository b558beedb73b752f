#!/usr/bin/env bash
# gpt_resume.sh — exact resume of a transformer run: gpt on the `tokens`
# plugin (shuffled byte windows), AdamW with a warm-up + cosine schedule,
# gradient clipping. An 8-step run writes checkpoints every 3 steps (inside
# its first epoch); resuming from the step-3 checkpoint to step 8 must end
# with the same weights, bit for bit (the weightdump fixture writes them at
# the end of each fit), in 32-true, bf16-mixed and 16-mixed (the loss
# scaler's state too), and with 24 blocks in 32-true: 292 parameters, as
# GPT-2 medium has (the host once refused more than 256). The resumed run's
# summary reports its MFU against a GEMM rate measured in the precision's
# compute dtype (bfloat16 in bf16-mixed, float16 in 16-mixed).
# With FAKE_DIR, the same on the fake cuda accelerator ("cudafake:cuda",
# tests/cuda_fake) in the three precisions with 2 blocks: checkpoints
# written from and loaded into device memory, every tensor through the
# accelerator (the fake's device memory is sealed from host code), the
# optimizer's moments and the loss scaler's state included. The fake
# measures no GEMM rate (peak_flops is given), so no MFU check there. Then
# the resumed run's step-6 checkpoint, written from device memory, is
# validated on the cpu accelerator and on the fake: the same val_loss
# (the summary's 4 decimals, within 2 units of the last).
#
#   gpt_resume.sh KILN TEXT2TOKENS WORKDIR [FAKE_DIR]
#   (KILN_PLUGIN_PATH reaches weightdump)
set -euo pipefail
kiln=$1 t2t=$2 work=$3 fake=${4:-}
specs=("32-true 2" "bf16-mixed 2" "16-mixed 2" "32-true 24")
accel="" peak=""
if [ -n "$fake" ]; then
  specs=("32-true 2" "bf16-mixed 2" "16-mixed 2")
  accel="plugins = { dirs = [\"$fake\"]; }; accelerator = \"cudafake:cuda\";"
  peak="peak_flops = 1e12;"
  export KILN_FAKE_CUDA_QUIET=0
fi
rm -rf "$work" && mkdir -p "$work"
for i in $(seq 1 300); do echo "line $i: pack my box with five dozen liquor jugs"; done > "$work/text.txt"
"$t2t" -o "$work/shard.bin" "$work/text.txt" >/dev/null 2>&1
for spec in "${specs[@]}"; do
  read -r prec layers <<<"$spec"
  tag=$prec
  [ "$layers" = 2 ] || tag=$prec-$layers
  cat > "$work/run.cfg" <<CFG
trainer = { max_steps = 8; seed = 11; default_root_dir = "$work/runs-$tag"; num_sanity_val_steps = 0;
            gradient_clip_val = 1.0; threads = 2; $peak };
precision = "$prec"; $accel
data = { name = "tokens"; train = "$work/shard.bin"; vocab_size = 256; batch_size = 2; block_size = 16; shuffle = true; };
module = { name = "gpt"; n_layer = $layers; n_head = 2; n_embd = 32; block_size = 16; vocab_size = 256; max_batch = 2; };
optimizer = { name = "adamw"; lr = 0.003; weight_decay = 0.1; };
scheduler = { name = "cosine"; warmup_steps = 2; t_max = 8; interval = "step"; };
CFG
  ckcb='{name="checkpoint"; every_n_train_steps=3; save_top_k=-1;}'
  "$kiln" fit "$work/run.cfg" --set "callbacks=({name=\"weightdump\"; path=\"$work/full-$tag.bin\";}, $ckcb)" \
    > "$work/full-$tag.log" 2>&1 || { echo "FAIL $tag: the 8-step run failed"; tail -5 "$work/full-$tag.log"; exit 1; }
  ck="$work/runs-$tag/version_0/checkpoints/epoch=0-step=3.safetensors"
  [ -s "$ck" ] || { echo "FAIL: no step-3 checkpoint ($ck)"; exit 1; }
  "$kiln" fit "$work/run.cfg" --ckpt "$ck" \
    --set "callbacks=({name=\"weightdump\"; path=\"$work/resumed-$tag.bin\";}, $ckcb)" > "$work/resume-$tag.log" 2>&1 ||
    { echo "FAIL $tag: the resumed run failed"; tail -5 "$work/resume-$tag.log"; exit 1; }
  grep -q "resuming inside epoch 0" "$work/resume-$tag.log" || { echo "FAIL $tag: not a mid-epoch resume"; cat "$work/resume-$tag.log"; exit 1; }
  if grep -h "contract violation" "$work/full-$tag.log" "$work/resume-$tag.log"; then
    echo "FAIL $tag: the fake cuda runtime saw a contract violation"; exit 1
  fi
  # the summary's MFU is against a GEMM rate measured in the step's compute dtype
  case $prec in bf16-mixed) gd=bfloat16 ;; 16-mixed) gd=float16 ;; *) gd=float32 ;; esac
  [ -n "$fake" ] || grep -q "MFU .*measured $gd GEMM)" "$work/resume-$tag.log" ||
    { echo "FAIL $tag: the summary's MFU is not against a $gd GEMM: $(grep -m1 MFU "$work/resume-$tag.log")"; exit 1; }
  if [ -n "$fake" ]; then
    ck6="$work/runs-$tag/version_1/checkpoints/epoch=0-step=6.safetensors"
    [ -s "$ck6" ] || { echo "FAIL $tag: no step-6 checkpoint from the resumed run ($ck6)"; exit 1; }
    for a in cpu cudafake:cuda; do
      "$kiln" validate "$work/run.cfg" --ckpt "$ck6" --set "accelerator=\"$a\"" --set data.val_fraction=0.2 \
        > "$work/validate-$tag-$a.log" 2>&1 || { echo "FAIL $tag: validate on $a failed"; tail -5 "$work/validate-$tag-$a.log"; exit 1; }
    done
    v1=$(sed -n 's/^metrics: .*val_loss=\([0-9.]*\).*/\1/p' "$work/validate-$tag-cpu.log")
    v2=$(sed -n 's/^metrics: .*val_loss=\([0-9.]*\).*/\1/p' "$work/validate-$tag-cudafake:cuda.log")
    awk -v a="$v1" -v b="$v2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 2e-4) }' ||
      { echo "FAIL $tag: the checkpoint validates to val_loss '$v1' on the cpu and '$v2' on the fake cuda"; exit 1; }
    grep -h "contract violation" "$work/validate-$tag-cudafake:cuda.log" && { echo "FAIL $tag: a contract violation"; exit 1; }
    echo "ok   $prec: the checkpoint written from the fake GPU validates to val_loss $v1 on the cpu, $v2 on the fake"
  fi
  if cmp -s "$work/full-$tag.bin" "$work/resumed-$tag.bin"; then
    echo "ok   $prec, $layers blocks: 8 steps, and 3 steps + a resume to 8, end with the same weights, bit for bit"
  else
    echo "FAIL $prec, $layers blocks: the resumed run's weights differ from the uninterrupted run's"; exit 1
  fi
done
