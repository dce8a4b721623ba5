#!/usr/bin/env bash
# On the GPU machine: every GPU proof in one run (see ../shared/gpu/README.md for the bundle).
#   1. the protocol conformance suite against a real SGLang server
#   2. the Engine lifecycle tests on SGLang (tests/test_gpu.py)
#   3. the generate/result tests on SGLang (tests/test_engine.py with RLGEN_TEST_BACKEND=sglang)
#   4. the notebooks on SGLang (nbmake): quickstart, reward debugging, group advantages
#   5. the reward tests (no server; they run on the GPU machine's Python and packages)
#   6. view: the notebook view and browser executed on SGLang (scripts/gpu/view.py), and
#      bench/request_size.py (generate's ~16 requests per call vs one request of up to 256 prompts)
# Results land in $OUT (summaries are committed under docs/gpu/).
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
STEPS="${1:-conformance,lifecycle,generate,notebook,rewards}"  # or a subset, e.g. "generate,notebook"
FINAL_OUT="$OUT"; OUT="$(mktemp -d)"  # a call returns at most 8 files: everything is packed at the end
# rlgen commit (and dirty or not), versions, Python, GPU and this command, as every bench/ JSON has them
python3 bench/_common.py --for "bash scripts/gpu/check.sh $STEPS" | tee "$OUT/environment.json"
PYTEST=(python3 -m pytest -p no:cacheprovider -rA -q)

# One step after another: SGLang servers that start at the same time on one GPU each count the
# other's allocations while sizing their KV cache, and fail (seen 2026-11-30).
conformance() {
  start_sglang 30000 "$OUT/sglang-conformance.log" --mem-fraction-static 0.2 --enable-memory-saver --disable-cuda-graph || return 1
  RLGEN_CONFORMANCE_URL=http://127.0.0.1:30000 "${PYTEST[@]}" tests/conformance --junitxml="$OUT/conformance.xml" > "$OUT/conformance.txt" 2>&1
  python3 scripts/gpu/record_responses.py http://127.0.0.1:30000 "$OUT/sglang-responses.json" > /dev/null 2>&1
  stop_sglang
}
generate() {
  # A fresh machine's first SGLang start takes ~130 s (no .pyc, no Triton cache), more than the
  # tests' per-test timeouts allow their module fixture: pay it once here, outside the tests.
  warm_sglang > "$OUT/warmup.txt" 2>&1
  RLGEN_TEST_BACKEND=sglang "${PYTEST[@]}" tests/test_engine.py --junitxml="$OUT/generate.xml" > "$OUT/generate.txt" 2>&1
}
notebook() {
  "${PYTEST[@]}" --nbmake --nbmake-timeout=600 notebooks --junitxml="$OUT/notebook.xml" > "$OUT/notebook.txt" 2>&1
}
rewards() {
  "${PYTEST[@]}" tests/test_rewards.py tests/rewards tests/test_reward_exec.py tests/test_reward_styles.py \
    tests/test_group_stats.py tests/test_plots.py --junitxml="$OUT/rewards.xml" > "$OUT/rewards.txt" 2>&1
}
view() {
  python3 scripts/gpu/view.py > "$OUT/view.txt" 2>&1
  python3 bench/request_size.py --out "$OUT/request_size.json" > "$OUT/request_size.txt" 2>&1
  tail -12 "$OUT/request_size.txt" >> "$OUT/view.txt"
}
lifecycle() {
  "${PYTEST[@]}" -s tests/test_gpu.py --junitxml="$OUT/lifecycle.xml" > "$OUT/lifecycle.txt" 2>&1
}
for step in conformance generate notebook lifecycle rewards view; do
  if [[ $STEPS == *$step* ]]; then $step; fi
done
for step in conformance generate notebook lifecycle rewards view; do
  [ -f "$OUT/$step.txt" ] && { echo "== $step"; tail -2 "$OUT/$step.txt"; }
done
ps aux | grep -E "[s]glang|[c]pu_server" | head -5 > "$OUT/leftover-processes.txt"; echo "leftover server processes: $(wc -l < "$OUT/leftover-processes.txt")"
tar czf "$FINAL_OUT/check.tgz" -C "$OUT" .
