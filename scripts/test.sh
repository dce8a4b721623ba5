#!/usr/bin/env bash
# The test suite: CPU backend on machines without a GPU (gpu tests skip), real SGLang where there is one.
# Without a GPU it runs on two pytest-xdist workers, a test file per worker at a time (`--dist
# loadfile`: module-scoped servers stay in one worker); the CPU backend's server uses one torch
# thread on 2 cores, so two workers each driving their own server keep both cores busy.
# `--no-loadscope-reorder` keeps the order tests/conftest.py gives (the longest files first).
# On a GPU machine it runs in one process: the GPU tests each expect the whole GPU.
# RLGEN_TEST_WORKERS=N sets the number of workers (0: one process, no xdist).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh dev
if [ -z "${RLGEN_TEST_WORKERS:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    RLGEN_TEST_WORKERS=0
  else
    RLGEN_TEST_WORKERS=2
  fi
fi
XDIST=()
if [ "$RLGEN_TEST_WORKERS" != 0 ]; then
  XDIST=(-n "$RLGEN_TEST_WORKERS" --dist loadfile --no-loadscope-reorder)
  # Torch in the test processes and the notebooks' kernels (the trainers) gets its worker's share
  # of the cores, not all of them: threads beyond it only contend with the other worker.
  CORES="$(nproc 2>/dev/null || echo 2)"
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( CORES > RLGEN_TEST_WORKERS ? CORES / RLGEN_TEST_WORKERS : 1 ))}"
fi
exec python -m pytest tests notebooks --nbmake --nbmake-timeout=600 --durations=30 ${XDIST[@]+"${XDIST[@]}"} "$@"
