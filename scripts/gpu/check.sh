#!/usr/bin/env bash
# On the GPU machine: every GPU proof in one run (see ../shared/gpu/README.md for the bundle).
#   1. the protocol conformance suite against a real SGLang server
#   2. the Engine lifecycle tests on SGLang (tests/test_gpu.py)
#   3. the generate/result tests on SGLang (tests/test_engine.py with RLGEN_TEST_BACKEND=sglang)
#   4. the quickstart notebook on SGLang (nbmake)
# Results land in $OUT (summaries are committed under docs/gpu/).
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}"
STEPS="${1:-conformance,lifecycle,generate,notebook}"
python3 -c "import sglang, torch, transformers; print('sglang', sglang.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" | tee "$OUT/versions.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/versions.txt"
PYTEST=(python3 -m pytest -p no:cacheprovider -rA -q)

if [[ $STEPS == *conformance* ]]; then
  start_sglang 30000 "$OUT/sglang-conformance.log" --mem-fraction-static 0.2 --enable-memory-saver --disable-cuda-graph || exit 1
  RLGEN_CONFORMANCE_URL=http://127.0.0.1:30000 "${PYTEST[@]}" tests/conformance --junitxml="$OUT/conformance.xml" 2>&1 | tail -80 > "$OUT/conformance.txt"
  python3 scripts/gpu/record_responses.py http://127.0.0.1:30000 "$OUT/sglang-responses.json" > /dev/null 2>&1
  stop_sglang
  tail -3 "$OUT/conformance.txt"
fi
if [[ $STEPS == *lifecycle* ]]; then
  "${PYTEST[@]}" -s tests/test_gpu.py --junitxml="$OUT/lifecycle.xml" 2>&1 | tail -60 > "$OUT/lifecycle.txt"
  tail -3 "$OUT/lifecycle.txt"
fi
if [[ $STEPS == *generate* ]]; then
  RLGEN_TEST_BACKEND=sglang "${PYTEST[@]}" tests/test_engine.py --junitxml="$OUT/generate.xml" 2>&1 | tail -80 > "$OUT/generate.txt"
  tail -3 "$OUT/generate.txt"
fi
if [[ $STEPS == *notebook* ]]; then
  "${PYTEST[@]}" --nbmake --nbmake-timeout=600 notebooks --junitxml="$OUT/notebook.xml" 2>&1 | tail -40 > "$OUT/notebook.txt"
  tail -3 "$OUT/notebook.txt"
fi
ps aux | grep -E "[s]glang|[c]pu_server" | head -5 > "$OUT/leftover-processes.txt"; echo "leftover server processes: $(wc -l < "$OUT/leftover-processes.txt")"
