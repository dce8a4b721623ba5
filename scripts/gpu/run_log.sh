#!/usr/bin/env bash
# On the GPU machine: issue 35's proofs on SGLang (see ../shared/gpu/README.md for the bundle).
#   bash scripts/gpu/run_log.sh tutorial          # notebook 08 on SGLang: the loop live (40 steps), its
#                                                 # log kept in $OUT/08-run-log (notebooks/data/08-run-log)
#   bash scripts/gpu/run_log.sh notebooks [names] # notebooks 04 and 07, which now log their iterations
# Each part writes straight to $OUT, so a call cut by its time limit keeps what it had.
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
part=${1:-tutorial}
python3 bench/_common.py --for "bash scripts/gpu/run_log.sh $part" > "$OUT/environment-$part.json"
run_notebook() {  # run_notebook NAME TIMEOUT
  local nb=$1 limit=$2 t0=$SECONDS
  timeout "$limit" python3 -m pytest -p no:cacheprovider -q "notebooks/$nb.ipynb" --nbmake --nbmake-timeout=$((limit - 10)) \
    --overwrite > "$OUT/nb-$nb.txt" 2>&1
  echo "notebook $nb: exit $? in $((SECONDS - t0)) s"; tail -3 "$OUT/nb-$nb.txt"
  cp "notebooks/$nb.ipynb" "$OUT/$nb.executed.ipynb"
}
if [ "$part" = tutorial ]; then
  RLGEN_08_KEEP_LOG="$OUT/08-run-log" run_notebook 08_reward_across_a_run 540
  tar czf "$OUT/08-run-log.tgz" -C "$OUT" 08-run-log && rm -rf "$OUT/08-run-log"
else
  for nb in ${2:-04_one_rl_step 07_lora_rl_step}; do
    [ -f "notebooks/$nb.ipynb" ] && run_notebook "$nb" 270
  done
fi
ps aux | grep -E "[s]glang.launch_server" | head -5 > "$OUT/leftover-$part.txt"
echo "leftover server processes: $(wc -l < "$OUT/leftover-$part.txt")"
