#!/usr/bin/env bash
# On the GPU machine: issue 17's proofs on real SGLang, in two calls (each under a call's limit):
#   bash scripts/gpu/startup.sh restart   # warm-up start, then the Jupyter kernel-restart keep-alive test
#   bash scripts/gpu/startup.sh overhead  # bench/startup_overhead.py: bare launch_server vs Engine(fast_start=True)
# Each step writes straight to $OUT, so a call cut by its time limit keeps what it had.
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}"
python3 bench/_common.py --for "bash scripts/gpu/startup.sh $1" > "$OUT/environment-$1.json"
case "$1" in
  restart)
    warm_sglang > "$OUT/warmup.txt" 2>&1
    RLGEN_TEST_BACKEND=sglang python3 -m pytest -p no:cacheprovider -rA -q -s tests/test_keep_alive.py \
      -k kernel_restart --junitxml="$OUT/kernel-restart.xml" > "$OUT/kernel-restart.txt" 2>&1
    tail -3 "$OUT/kernel-restart.txt" ;;
  overhead)
    python3 bench/startup_overhead.py --backend sglang --repeats "${PAIRS:-4}" --out "$OUT/startup_overhead.json" \
      > "$OUT/startup_overhead.txt" 2>&1
    tail -25 "$OUT/startup_overhead.txt" ;;
esac
ps aux | grep -E "[s]glang.launch_server|[_]keep_alive" | head -5 > "$OUT/leftover-$1.txt"
echo "leftover server/watchdog processes: $(wc -l < "$OUT/leftover-$1.txt")"
