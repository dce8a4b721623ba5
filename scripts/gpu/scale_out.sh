#!/usr/bin/env bash
# On the GPU machine: issue 16's proofs on real SGLang, in calls that each fit a call's limit:
#   bash scripts/gpu/scale_out.sh test    # tests/test_gpu_scale_out.py: replicas=2 behind the router
#                                         # (on one GPU both servers share it), tp_size=2 / dp_size=2
#                                         # where there are two GPUs
#   bash scripts/gpu/scale_out.sh bench   # bench/scale_out.py on every visible GPU
# Needs sglang-router: carry .whl-router with the call (scripts/gpu/wheels.sh fetches it).
# Each step writes straight to $OUT, so a call cut by its time limit keeps what it had.
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
python3 bench/_common.py --for "bash scripts/gpu/scale_out.sh $1" > "$OUT/environment-scale-out-$1.json"
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
echo "GPUs: $GPUS"; nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv > "$OUT/nvidia-smi-$1.txt" 2>&1
case "$1" in
  test)
    python3 -m pytest -p no:cacheprovider -rA -s -q tests/test_gpu_scale_out.py \
      --junitxml="$OUT/gpu-scale-out.xml" > "$OUT/gpu-scale-out.txt" 2>&1
    grep -E "changed by|free MiB|gpu_memory_per_gpu|PASSED|FAILED|SKIPPED|Error" "$OUT/gpu-scale-out.txt" | head -30
    tail -2 "$OUT/gpu-scale-out.txt" ;;
  bench)
    python3 bench/scale_out.py --out "$OUT/scale_out.json" --gpus "${BENCH_GPUS:-$GPUS}" ${BENCH_ARGS:-} \
      > "$OUT/scale_out.txt" 2>&1
    tail -30 "$OUT/scale_out.txt" ;;
esac
ps aux | grep -E "[s]glang.launch_server|[s]glang_router|[_]keep_alive" | head -5 > "$OUT/leftover-scale-out-$1.txt"
echo "leftover server/router/watchdog processes: $(wc -l < "$OUT/leftover-scale-out-$1.txt")"
