#!/usr/bin/env bash
# On the GPU machine: the protocol conformance suite against a real SGLang server, plus a record
# of raw SGLang responses. Writes $OUT/conformance.txt, conformance.xml, sglang-conformance.log,
# sglang-responses.json and environment.json.
source "$(dirname "$0")/common.sh"
python3 bench/_common.py --for "bash scripts/gpu/conformance.sh" | tee "$OUT/environment.json"  # commit, versions, GPU
start_sglang 30000 "$OUT/sglang-conformance.log" --mem-fraction-static 0.3 --enable-memory-saver --disable-cuda-graph || exit 1
RLGEN_CONFORMANCE_URL=http://127.0.0.1:30000 python3 -m pytest tests/conformance -v -p no:cacheprovider \
  --junitxml="$OUT/conformance.xml" 2>&1 | tee "$OUT/conformance.txt"
python3 scripts/gpu/record_responses.py http://127.0.0.1:30000 "$OUT/sglang-responses.json" || true
stop_sglang
