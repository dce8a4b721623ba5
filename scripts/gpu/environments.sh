#!/usr/bin/env bash
# On the GPU machine: issue 36's proof that other frameworks' environments run unchanged on SGLang
# (see ../shared/gpu/README.md for the bundle; trl, skyrl-gym and what they import travel in .whl).
#   bash scripts/gpu/environments.sh tests      # tests/envs with RLGEN_TEST_BACKEND=sglang (TRL, SkyRL-gym, verl; not verifiers)
#   bash scripts/gpu/environments.sh notebook   # notebooks/09_your_environment.ipynb under nbmake (its lessons are asserted)
#   bash scripts/gpu/environments.sh all        # both (about 6-8 min with CUDA graphs off)
# Each part writes straight to $OUT, so a call cut by its time limit keeps what it had.
source "$(dirname "$0")/common.sh"
# CUDA graphs off: every test module starts its own server, and capture would cost ~50 s each
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]} --disable-cuda-graph" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
PART=${1:-all}

part_tests() {
  # verifiers' 34 wheels (openai, mcp, openai-agents, ...) do not fit a call's carry beside the bundle:
  # its adapter reaches the server only through the runner's /generate sender, which the others use too
  RLGEN_TEST_BACKEND=sglang timeout 420 python3 -m pytest -p no:cacheprovider -q -rs tests/envs \
    --ignore=tests/envs/test_verifiers.py \
    > "$OUT/envs_tests.txt" 2>&1
  echo "tests/envs on SGLang: exit $?"; tail -30 "$OUT/envs_tests.txt"
}

part_notebook() {
  timeout 420 python3 -m pytest -p no:cacheprovider -q --nbmake --nbmake-timeout=400 \
    notebooks/09_your_environment.ipynb > "$OUT/09_your_environment.txt" 2>&1
  echo "notebook 09: exit $?"; tail -30 "$OUT/09_your_environment.txt"
}

python3 bench/_common.py --for "bash scripts/gpu/environments.sh $PART" > "$OUT/environment-envs-$PART.json"
case "$PART" in
  tests) part_tests ;;
  notebook) part_notebook ;;
  all) part_tests; part_notebook ;;
  *) echo "usage: bash scripts/gpu/environments.sh tests|notebook|all" >&2; exit 2 ;;
esac
ps aux | grep -E "[s]glang.launch_server|[_]keep_alive" | head -5 > "$OUT/leftover-envs-$PART.txt"
