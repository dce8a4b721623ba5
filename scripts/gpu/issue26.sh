#!/usr/bin/env bash
# On the GPU machine: issue 26's proofs and the size table, in two calls (see ../shared/gpu/README.md).
#   bash scripts/gpu/issue26.sh small      # 135M: LoRA checks and the size row (~6 min on a fresh machine)
#   bash scripts/gpu/issue26.sh notebooks [names]  # notebooks 07 (LoRA RL step) and 04 (tensor path) on SGLang
#   bash scripts/gpu/issue26.sh default7b  # a 7B model with rlgen's default memory share beside its trainer
#   bash scripts/gpu/issue26.sh large [shape]  # random-weight Llama 1.7B and 7B (or one): their size rows
# Each part writes straight to $OUT, so a call cut by its time limit keeps what it had.
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
part=${1:-small}
python3 bench/_common.py --for "bash scripts/gpu/issue26.sh $part" > "$OUT/environment-$part.json"
if [ "$part" = small ]; then
  timeout 200 python3 scripts/gpu/lora_check.py --out "$OUT/lora_check.json" > "$OUT/lora_check.txt" 2>&1
  echo "lora_check: exit $?"; grep -E "PASS|FAIL|checks passed" "$OUT/lora_check.txt" | cut -c1-220
  timeout 150 python3 bench/sizes.py --out "$OUT/sizes-0.135b.json" --model "$RLGEN_TEST_MODEL" > "$OUT/sizes-0.135b.txt" 2>&1
  echo "sizes 0.135b: exit $?"; tail -22 "$OUT/sizes-0.135b.txt"
elif [ "$part" = default7b ]; then
  mkdir -p /tmp/ckpt
  [ -d /tmp/ckpt/llama-7b ] || python3 bench/make_checkpoint.py --shape llama-7b --out /tmp/ckpt/llama-7b --device cuda \
    > "$OUT/make-llama-7b.txt" 2>&1
  timeout 280 python3 scripts/gpu/default_7b.py --model /tmp/ckpt/llama-7b --out "$OUT/default_7b.json" \
    > "$OUT/default_7b.txt" 2>&1
  echo "default_7b: exit $?"; tail -3 "$OUT/default_7b.txt" | cut -c1-600
elif [ "$part" = notebooks ]; then
  for nb in ${2:-07_lora_rl_step 04_one_rl_step}; do
    [ -f "notebooks/$nb.ipynb" ] || continue
    t0=$SECONDS
    timeout 240 python3 -m pytest -p no:cacheprovider -q "notebooks/$nb.ipynb" --nbmake --nbmake-timeout=230 \
      --overwrite > "$OUT/nb-$nb.txt" 2>&1
    echo "notebook $nb: exit $? in $((SECONDS - t0)) s"; tail -3 "$OUT/nb-$nb.txt"
    cp "notebooks/$nb.ipynb" "$OUT/$nb.executed.ipynb"
  done
else
  mkdir -p /tmp/ckpt
  for shape in ${2:-llama-1.7b llama-7b}; do
    t0=$SECONDS
    [ -d "/tmp/ckpt/$shape" ] || python3 bench/make_checkpoint.py --shape "$shape" --out "/tmp/ckpt/$shape" --device cuda \
      > "$OUT/make-$shape.txt" 2>&1
    echo "checkpoint $shape: $((SECONDS - t0)) s"
    timeout 330 python3 bench/sizes.py --out "$OUT/sizes-$shape.json" --model "/tmp/ckpt/$shape" > "$OUT/sizes-$shape.txt" 2>&1
    echo "sizes $shape: exit $?"; tail -22 "$OUT/sizes-$shape.txt"
  done
fi
ps aux | grep -E "[s]glang.launch_server" | head -5 > "$OUT/leftover-$part.txt"
echo "leftover server processes: $(wc -l < "$OUT/leftover-$part.txt")"
