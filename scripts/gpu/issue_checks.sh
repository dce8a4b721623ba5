#!/usr/bin/env bash
# On the GPU machine: the proofs of the layout and notebook issues, one part per call (each fits a
# call's 600 s): see ../shared/gpu/README.md for the bundle.
#   bash scripts/gpu/issue_checks.sh suites      # conformance, lifecycle and reward suites (check.sh)
#   bash scripts/gpu/issue_checks.sh notebooks   # tutorials 02 and 03 under nbmake: their lessons are asserted
#   bash scripts/gpu/issue_checks.sh reattach    # bench/reattach.py: a fresh interpreter reattaching to a kept server
# Each part writes straight to $OUT, so a call cut by its time limit keeps what it had.
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
python3 bench/_common.py --for "bash scripts/gpu/issue_checks.sh $1" > "$OUT/environment-$1.json"
case "$1" in
  suites)
    bash scripts/gpu/check.sh conformance,lifecycle,rewards
    (cd "$OUT" && tar xzf check.tgz && rm check.tgz) ;;
  notebooks)
    for nb in notebooks/02_reward_debugging.ipynb notebooks/03_group_advantages.ipynb; do
      name=$(basename "$nb" .ipynb)
      timeout 280 python3 -m pytest -p no:cacheprovider -q --nbmake --nbmake-timeout=270 "$nb" > "$OUT/$name.txt" 2>&1
      echo "$name: exit $?"; tail -3 "$OUT/$name.txt"
    done ;;
  reattach)
    python3 bench/reattach.py --backend sglang --out "$OUT/reattach.json" > "$OUT/reattach.txt" 2>&1
    tail -25 "$OUT/reattach.txt" ;;
esac
ps aux | grep -E "[s]glang.launch_server|[_]keep_alive" | head -5 > "$OUT/leftover-$1.txt"
