#!/usr/bin/env bash
# On the GPU machine: the proofs of multi-turn episodes, one part per call (each fits a call's 600 s
# with a fresh machine's ~150 s first SGLang start): see ../shared/gpu/README.md for the bundle.
#   bash scripts/gpu/episodes.sh parse      # SGLang (--tool-call-parser hermes) answering /parse_function_call
#                                           # on tests/data/parse_function_call_cases.json, diffed against the
#                                           # CPU backend's recorded answers (scripts/gpu/parse_parity.py)
#   bash scripts/gpu/episodes.sh episodes   # calculator-tool episodes through rlgen's Engine on SGLang: statuses,
#                                           # success, drift by cause, concurrency (scripts/gpu/episodes_check.py)
#   bash scripts/gpu/episodes.sh bench      # bench/episodes.py: episodes vs one generate, prefix cache, rlgen's time
#   bash scripts/gpu/episodes.sh notebook   # notebooks/06_multi_turn.ipynb under nbmake (its lessons are asserted)
#   bash scripts/gpu/episodes.sh all        # the three, one after the other (~10-15 min: more than one call)
# Each part writes straight to $OUT, so a call cut by its time limit keeps what it had.
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
PART=${1:-all}
# Extra arguments for the episodes and bench parts' Python (a later --backend wins): e.g. a dry run of
# this script on a CPU machine, RLGEN_EPISODES_ARGS="--backend cpu --quick" (with OUT and RLGEN_TEST_MODEL set).
read -r -a EXTRA <<< "${RLGEN_EPISODES_ARGS:-}"

part_parse() {
  # SGLang's own source of the endpoint and the hermes parser, as installed: what the answers come from
  local sg
  sg=$(python3 -c "import os, sglang; print(os.path.dirname(sglang.__file__))")
  { python3 -c "import sglang; print('# sglang', sglang.__version__)"
    sed -n '/"\/parse_function_call"/,/return ORJSONResponse/p' "$sg/srt/entrypoints/http_server.py"
    grep -A 12 "class ParseFunctionCallReq" "$sg/srt/managers/io_struct.py"
    grep -A 12 "class ToolCallItem" "$sg/srt/function_call/core_types.py"
    sed -n '/def parse_base_json/,/return results/p' "$sg/srt/function_call/base_format_detector.py"
    cat "$sg/srt/function_call/hermes_detector.py"; } > "$OUT/sglang_parse_source.txt" 2>&1
  start_sglang 30311 "$OUT/sglang-parse.log" --tool-call-parser hermes --disable-cuda-graph --mem-fraction-static 0.2 \
    || return 1
  timeout 120 python3 scripts/gpu/parse_parity.py compare --url http://127.0.0.1:30311 \
    --out "$OUT/parse_parity.json" > "$OUT/parse_parity.txt" 2>&1
  echo "parse: exit $?"; tail -30 "$OUT/parse_parity.txt"
  stop_sglang
}

part_episodes() {
  timeout 450 python3 scripts/gpu/episodes_check.py --backend sglang --out "$OUT/episodes_check.json" "${EXTRA[@]}" \
    > "$OUT/episodes_check.txt" 2>&1
  echo "episodes: exit $?"; tail -15 "$OUT/episodes_check.txt"
}

part_notebook() {
  # tutorial 06 on SGLang: its lessons are asserted in the notebook
  timeout 420 python3 -m pytest -p no:cacheprovider -q --nbmake --nbmake-timeout=400 notebooks/06_multi_turn.ipynb \
    > "$OUT/06_multi_turn.txt" 2>&1
  echo "notebook 06: exit $?"; tail -30 "$OUT/06_multi_turn.txt"
}

part_bench() {
  timeout 480 python3 bench/episodes.py --backend sglang --out "$OUT/episodes_bench.json" "${EXTRA[@]}" \
    > "$OUT/episodes_bench.txt" 2>&1
  echo "bench: exit $?"; tail -30 "$OUT/episodes_bench.txt"
}

python3 bench/_common.py --for "bash scripts/gpu/episodes.sh $PART" > "$OUT/environment-episodes-$PART.json"
case "$PART" in
  parse) part_parse ;;
  episodes) part_episodes ;;
  bench) part_bench ;;
  notebook) part_notebook ;;
  all) part_parse; part_episodes; part_bench ;;
  *) echo "usage: bash scripts/gpu/episodes.sh parse|episodes|bench|notebook|all" >&2; exit 2 ;;
esac
ps aux | grep -E "[s]glang.launch_server|[_]keep_alive" | head -5 > "$OUT/leftover-episodes-$PART.txt"
