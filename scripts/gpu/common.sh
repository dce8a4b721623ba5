# Sourced on the GPU machine (see ../shared/gpu/README.md): SGLang launch helpers for the GPU checks.
# Needs: source /tmp/rlgen-env.sh (PYTHONPATH with SGLang, RLGEN_TEST_MODEL), $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
# Extra wheels the image lacks (pytest-timeout; cloudpickle, math-verify and reasoning-gym with
# their dependencies, for the reward notebooks and tests) travel in .whl, fetched here by
# scripts/gpu/wheels.sh; later calls on the same machine find them installed.
# sglang-router's wheel (30 MB) is in .whl-router: too big to travel with the bundle's last chunk,
# it goes with a later call.
for dir in .whl .whl-router; do
  if [ -d "$dir" ] && ls "$dir"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rlgen-extra "$dir"/*.whl
  fi
done
if [ -d /tmp/rlgen-extra ]; then
  export PYTHONPATH="/tmp/rlgen-extra:$PYTHONPATH" PATH="/tmp/rlgen-extra/bin:$PATH"
fi
# The results name the rlgen commit they ran at (bench/_common.py's environment()). The device
# machine's copy of the tree carries a .git that is not the copied checkout's, so its HEAD is not
# the commit that ran: give it in the command, written out where the tree was copied from, e.g.
# RLGEN_COMMIT=$(git describe --always --dirty --abbrev=40).
if [ -z "${RLGEN_COMMIT:-}" ]; then
  echo "note: RLGEN_COMMIT is unset: the results will name whatever commit the copy's .git holds" >&2
fi
# The bundle has no FA3 kernels: always the triton attention backend there.
SGLANG_FLAGS=(--attention-backend triton --sampling-backend pytorch)

large_model() {  # the random-weight 1.7B Llama ($RLGEN_LARGE_MODEL, else built once per machine); its path
  local model=${RLGEN_LARGE_MODEL:-/tmp/ckpt/llama-1.7b}
  if [ ! -d "$model" ]; then
    mkdir -p /tmp/ckpt; local t0=$SECONDS
    python3 bench/make_checkpoint.py --shape llama-1.7b --out "$model" --device cuda > "$OUT/make-llama-1.7b.txt" 2>&1
    echo "checkpoint llama-1.7b: exit $? in $((SECONDS - t0)) s" >&2
  fi
  echo "$model"
}

start_sglang() {  # start_sglang PORT LOG [extra flags...]; sets SGLANG_PID
  local port=$1 log=$2; shift 2
  setsid python3 -m sglang.launch_server --model-path "$RLGEN_TEST_MODEL" --host 127.0.0.1 --port "$port" \
    "${SGLANG_FLAGS[@]}" "$@" >"$log" 2>&1 &
  SGLANG_PID=$!
  local t0=$SECONDS
  until curl -sf "http://127.0.0.1:$port/health_generate" >/dev/null; do
    if ! kill -0 $SGLANG_PID 2>/dev/null; then echo "sglang died at start"; tail -40 "$log"; return 1; fi
    if [ $((SECONDS - t0)) -gt 400 ]; then echo "sglang start timed out"; tail -40 "$log"; return 1; fi
    sleep 1
  done
  # as rlgen does for every server it launches (rlgen/server/_process.py): the GC frozen once ready
  curl -sf -X POST "http://127.0.0.1:$port/freeze_gc" >/dev/null || echo "note: POST /freeze_gc failed on :$port"
  echo "sglang ready on :$port after $((SECONDS - t0)) s (GC frozen)"
}

stop_sglang() {
  kill -TERM -- -"$SGLANG_PID" 2>/dev/null; sleep 3; kill -KILL -- -"$SGLANG_PID" 2>/dev/null; wait "$SGLANG_PID" 2>/dev/null
  return 0
}

warm_sglang() {  # a throw-away first start: a fresh machine's first SGLang start takes ~130 s (no .pyc, no Triton cache)
  RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" python3 -c "import time, rlgen; t = time.monotonic(); e = rlgen.Engine('$RLGEN_TEST_MODEL', backend='sglang', progress=False, fast_start=True); print(f'warm-up start: {time.monotonic() - t:.0f} s'); e.close()"
}
