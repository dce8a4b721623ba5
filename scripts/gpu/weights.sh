#!/usr/bin/env bash
# On the GPU machine: the proof of Engine.update_weights (weights from the notebook, no disk) on real
# SGLang, in one call (two SGLang starts: ~130 s on a fresh machine, ~50 s after; the checks ~2-3 min):
# see ../shared/gpu/README.md for the bundle.
#   bash scripts/gpu/weights.sh
# Writes to $OUT: weights_check.json/.txt (scripts/gpu/weights_check.py: noise, pushes vs disk and vs a fresh
# server, checksums, buckets, timing, paused(), refusals, a wrong shape sent raw), names.txt (the
# server-free tests), sglang_tensor_source.txt (SGLang's code for the endpoint as installed), logs.tgz.
# Each part writes straight to $OUT, so a call cut by its time limit keeps what it had.
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
python3 bench/_common.py --for "bash scripts/gpu/weights.sh" > "$OUT/environment-weights.json"
# Extra arguments for weights_check.py (a later --backend wins): e.g. a dry run of this script on a CPU
# machine, RLGEN_WEIGHTS_ARGS="--backend cpu --quick --repeats 1" (with OUT and RLGEN_TEST_MODEL set).
read -r -a EXTRA <<< "${RLGEN_WEIGHTS_ARGS:-}"

# SGLang's own code for what update_weights relies on, as installed: the request, the unpickler's
# allow-list, the reduction patch (device UUIDs), the TP worker and weight updater, llama's loader.
sg=$(python3 -c "import os, sglang; print(os.path.dirname(sglang.__file__))" 2>/dev/null)
if [ -n "$sg" ]; then
  { python3 -c "import sglang, torch; print('# sglang', sglang.__version__, 'torch', torch.__version__)"
    sed -n '/"\/update_weights_from_tensor"/,/^@app/p' "$sg/srt/entrypoints/http_server.py"
    grep -A 22 "class UpdateWeightsFromTensorReqInput" "$sg/srt/managers/io_struct.py"
    sed -n '/^class SafeUnpickler/,/^def safe_pickle_load/p' "$sg/srt/utils/common.py"
    grep -n -B2 -A12 "def _reduce_tensor_modified\|def _rebuild_cuda_tensor_modified\|def _device_from_maybe_uuid" \
      "$sg/srt/utils/patch_torch.py"
    grep -rn -A14 "def update_weights_from_tensor" "$sg/srt/managers/" "$sg/srt/model_executor/"
    grep -rn -A30 "def _update_weights_from_flattened_bucket" "$sg/srt/model_executor/"
    grep -rn -B3 -A8 "def _unwrap_tensor" "$sg/srt/model_executor/"
    sed -n '/def load_weights/,/def get_weights_by_name/p' "$sg/srt/models/llama.py"
  } > "$OUT/sglang_tensor_source.txt" 2>&1
fi

python3 -m pytest -p no:cacheprovider -q tests/test_weight_tensor_names.py > "$OUT/names.txt" 2>&1
echo "names tests: $(tail -1 "$OUT/names.txt")"

timeout 520 python3 scripts/gpu/weights_check.py --out "$OUT/weights_check.json" "${EXTRA[@]}" \
  > "$OUT/weights_check.txt" 2>&1
echo "weights_check: exit $?"; tail -45 "$OUT/weights_check.txt"

# The servers' logs (the unknown-name warning, a shape mismatch's traceback), newest first.
logs=$(ls -td "${RLGEN_CACHE_DIR:-$HOME/.cache/rlgen}"/servers/2*/ 2>/dev/null | head -3)
[ -n "$logs" ] && tar czf "$OUT/logs.tgz" $logs 2>/dev/null
ps aux | grep -E "[s]glang.launch_server" | head -5 > "$OUT/leftover-weights.txt"
echo "leftover server processes: $(wc -l < "$OUT/leftover-weights.txt")"
