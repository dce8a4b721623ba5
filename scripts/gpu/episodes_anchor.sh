#!/usr/bin/env bash
# On the GPU machine: issue 36's and issue 44's anchors, rlgen's episodes against two hand-written loops
# of the same turns, lockstep (TRL's: one batched /generate per turn) and per-episode (verl's agent
# loop: one asyncio task per episode) (bench/episodes.py, methods episodes, lockstep and per-episode
# on one server, interleaved, each run after /flush_cache), one part per call (each fits a call's
# 600 s with a fresh machine's ~150 s first SGLang start); see ../shared/gpu/README.md for the bundle.
# Three workloads (bench/episodes.py's docstring): fixed (every turn 64 tokens, ignore_eos, the
# environment answers at once), eos (turns end at EOS, at most 256 tokens at 135M and 128 at 1.7B;
# each environment step sleeps uniform 0-50 ms) and longtail (the same, 5% of the steps sleep 1 s);
# an EOS part also runs one timeline run per method through a proxy (the wait after each step).
#   bash scripts/gpu/episodes_anchor.sh small           # 135M ($RLGEN_TEST_MODEL), fixed, 7 repeats (~5-6 min fresh)
#   bash scripts/gpu/episodes_anchor.sh small-eos       # 135M, eos, 256 tokens at most, 7 repeats (~5-7 min fresh)
#   bash scripts/gpu/episodes_anchor.sh small-longtail  # 135M, eos-longtail, 7 repeats (~6-8 min fresh)
#   bash scripts/gpu/episodes_anchor.sh large           # a random-weight 1.7B Llama (bench/make_checkpoint.py
#                                                       # --shape llama-1.7b, ~20 s on the GPU), fixed, 5 repeats
#   bash scripts/gpu/episodes_anchor.sh large-eos       # the 1.7B, eos, 128 tokens at most (random weights
#                                                       # rarely sample EOS: most turns run to 128), 5 repeats
#   bash scripts/gpu/episodes_anchor.sh large-longtail  # the 1.7B, eos-longtail, 128 tokens at most, 5 repeats
#   bash scripts/gpu/episodes_anchor.sh sync    # 135M, fixed, the environment a plain function (a worker thread per step)
#   bash scripts/gpu/episodes_anchor.sh client  # bench/episodes_client.py: the same call against an instant
#                                               # server (no GPU): what rlgen adds, on this machine's CPU, answered
#                                               # at once and after 400 ms (its critical path only) (~2-3 min)
# Each part is killed at 540 s (`timeout`); every run is saved as it ends, so a part cut short keeps
# its runs (`python bench/episodes.py --report-only JSON --out again.json` reports them).
# Each part writes its JSON and text straight to $OUT, so a call cut by its time limit keeps what it had.
# Extra arguments for bench/episodes.py (later ones win): e.g. a dry run of this script on a CPU
# machine, RLGEN_EPISODES_ARGS="--backend cpu --quick --repeats 2 --max-new-tokens 8" (with OUT and
# RLGEN_TEST_MODEL set; RLGEN_LARGE_MODEL names a checkpoint to use instead of building the 1.7B one).
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
PART=${1:-small}
read -r -a EXTRA <<< "${RLGEN_EPISODES_ARGS:-}"
METHODS=episodes,lockstep,per-episode

anchor() {  # anchor NAME MODEL LIMIT_S REPEATS [bench flags...]
  local name=$1 model=$2 limit=$3 repeats=$4; shift 4
  local t0=$SECONDS
  timeout "$limit" python3 bench/episodes.py --backend sglang --model "$model" --methods "$METHODS" \
    --repeats "$repeats" --out "$OUT/episodes_anchor-$name.json" "$@" "${EXTRA[@]}" \
    > "$OUT/episodes_anchor-$name.txt" 2>&1
  echo "anchor $name: exit $? in $((SECONDS - t0)) s"; tail -16 "$OUT/episodes_anchor-$name.txt"
}

python3 bench/_common.py --for "bash scripts/gpu/episodes_anchor.sh $PART" > "$OUT/environment-anchor-$PART.json"
case "$PART" in
  small) anchor 0.135b "$RLGEN_TEST_MODEL" 540 7 --workload fixed ;;
  small-eos) anchor 0.135b-eos "$RLGEN_TEST_MODEL" 540 7 --workload eos --max-new-tokens 256 ;;
  small-longtail) anchor 0.135b-longtail "$RLGEN_TEST_MODEL" 540 7 --workload eos-longtail --max-new-tokens 256 ;;
  sync) anchor 0.135b-sync "$RLGEN_TEST_MODEL" 450 7 --workload fixed --sync-env ;;
  client)
    for env in async sync server400; do
      flag=(); [ "$env" = sync ] && flag=(--sync-env)
      [ "$env" = server400 ] && flag=(--server-ms 400 --repeats 9)  # rlgen's time on the critical path only
      t0=$SECONDS
      timeout 200 python3 bench/episodes_client.py --model "$RLGEN_TEST_MODEL" --out "$OUT/episodes_client-$env.json" \
        "${flag[@]}" > "$OUT/episodes_client-$env.txt" 2>&1
      echo "client $env: exit $? in $((SECONDS - t0)) s"; tail -9 "$OUT/episodes_client-$env.txt"
    done ;;
  large) anchor 1.7b "$(large_model)" 540 5 --workload fixed ;;
  large-eos) anchor 1.7b-eos "$(large_model)" 540 5 --workload eos --max-new-tokens 128 ;;
  large-longtail) anchor 1.7b-longtail "$(large_model)" 540 5 --workload eos-longtail --max-new-tokens 128 ;;
  *) echo "usage: bash scripts/gpu/episodes_anchor.sh small|small-eos|small-longtail|large|large-eos|large-longtail|sync|client" >&2
     exit 2 ;;
esac
ps aux | grep -E "[s]glang.launch_server" | head -5 > "$OUT/leftover-anchor-$PART.txt"
echo "leftover server processes: $(wc -l < "$OUT/leftover-anchor-$PART.txt")"
