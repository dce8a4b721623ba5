#!/usr/bin/env bash
# On the GPU machine: issue 15's proofs on real SGLang, in calls that each fit a call's limit:
#   bash scripts/gpu/rl_loop.sh bench      # bench/weight_update.py (its Engine pays a fresh machine's cold
#                                          # start), then the perturbed-weights test
#   bash scripts/gpu/rl_loop.sh notebooks  # notebooks 04 (one RL step) and 05 (checkpoint A/B) under nbmake
# Each step writes straight to $OUT, so a call cut by its time limit keeps what it had.
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
python3 bench/_common.py --for "bash scripts/gpu/rl_loop.sh $1" > "$OUT/environment-$1.json"
case "$1" in
  bench)
    python3 bench/weight_update.py --backend sglang --out "$OUT/weight_update.json" > "$OUT/weight_update.txt" 2>&1
    tail -9 "$OUT/weight_update.txt"
    RLGEN_TEST_BACKEND=sglang python3 -m pytest -p no:cacheprovider -rA -q tests/test_weight_versions.py \
      --junitxml="$OUT/weight-versions.xml" > "$OUT/weight-versions.txt" 2>&1
    tail -2 "$OUT/weight-versions.txt" ;;
  notebooks)
    for nb in ${NOTEBOOKS:-notebooks/04_one_rl_step.ipynb notebooks/05_checkpoint_ab.ipynb}; do
      name=$(basename "$nb" .ipynb)
      # Executed with nbclient (in the bundle) and saved with its outputs, so the run can be read.
      python3 -c "import sys, time, nbclient, nbformat; nb = nbformat.read(sys.argv[1], as_version=4); t = time.monotonic()
try:
    nbclient.NotebookClient(nb, timeout=280, kernel_name='python3').execute()
finally:
    nbformat.write(nb, sys.argv[2]); print(f'executed in {time.monotonic() - t:.0f} s')" "$nb" "$OUT/$name.ipynb" \
        > "$OUT/$name.log" 2>&1
      echo "$name: exit $?"; tail -2 "$OUT/$name.log"
    done ;;
esac
ps aux | grep -E "[s]glang.launch_server|[_]keep_alive" | head -5 > "$OUT/leftover-$1.txt"
echo "leftover server/watchdog processes: $(wc -l < "$OUT/leftover-$1.txt")"
