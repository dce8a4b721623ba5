#!/usr/bin/env bash
# On the GPU machine: one benchmark of bench/ per call (each fits in a 10-minute call), e.g.
#   source /tmp/rlgen-env.sh && bash scripts/gpu/bench.sh throughput [extra args...]
# Writes $OUT/<name>.json (rewritten after every phase, so a call cut at its time limit still
# returns what was measured; it starts with the rlgen commit, versions, GPU and command line), $OUT/<name>.txt (the printed tables) and $OUT/<name>-logs.tgz
# (server logs, profiles).
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
export RLGEN_BENCH_SH="bash scripts/gpu/bench.sh $*"  # recorded with the other RLGEN_* variables in the JSON
name=$1; shift
python3 "bench/$name.py" --out "$OUT/$name.json" "$@" 2>&1 | tee "$OUT/$name.txt"
if [ -d "$OUT/$name-logs" ]; then
  tar czf "$OUT/$name-logs.tgz" -C "$OUT" "$name-logs" && rm -rf "$OUT/$name-logs"
fi
ps aux | grep -E "[s]glang|[c]pu_server" | head -5 > "$OUT/leftover-processes.txt"
echo "leftover server processes: $(wc -l < "$OUT/leftover-processes.txt")"
