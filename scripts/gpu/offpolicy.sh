#!/usr/bin/env bash
# On the GPU machine: issue 46's performance targets (bench/offpolicy.py; its docstring says what each
# number is and how each verdict is judged), one part per call (each fits a call's 600 s with a fresh
# machine's ~150 s first SGLang start); see ../shared/gpu/README.md for the bundle.
# Phase span: one job of 256 chat prompts x 512 tokens (ignore_eos, T=1, logprobs), with a push of the
# trainer's whole state dict at 30% of its tokens under each pause mode (abort, retract, in_place),
# against the job alone (none) and the push alone (push), interleaved, each run after a cache flush.
# Phase trainer: rlgen.sampler_vs_trainer of one such job's rollouts (batch 32) against one forward
# pass of the same 256 rows. The server takes half the GPU (--gpu-memory-fraction 0.5); the trainer
# (transformers, bf16) the rest of it.
#   bash scripts/gpu/offpolicy.sh small        # 135M ($RLGEN_TEST_MODEL), 7 repeats (~4-6 min fresh)
#   bash scripts/gpu/offpolicy.sh large        # a random-weight 1.7B Llama (bench/make_checkpoint.py --shape
#                                              # llama-1.7b, ~20 s on the GPU; the targets' size), 5 repeats:
#                                              # the trainer phase first, then span until --budget-s 470
#                                              # (a round of span is 4 jobs + a push, ~30-45 s at 1.7B: 5 rounds
#                                              # may not all fit a fresh machine's call; the report says how many ran)
#   bash scripts/gpu/offpolicy.sh deterministic  # 135M: phase deterministic only (not in small or large): sampler
#                                              # vs trainer with --enable-deterministic-inference off, then on (a
#                                              # server each; one seeded batch, sampled twice) (~3-5 min fresh)
#   bash scripts/gpu/offpolicy.sh conformance  # tests/conformance/test_pause.py against a real SGLang server
#                                              # (pause and continue on the wire, every mode) (~3-4 min fresh)
# Each bench part is killed at 540 s (`timeout`) and stops starting rounds at 470 s (--budget-s), so it
# ends with its report; every run is saved as it ends, so a part cut short keeps its runs
# (`python bench/offpolicy.py --report-only JSON --out again.json` reports them).
# Each part writes its JSON and text straight to $OUT (the server logs as one .tgz), so a call cut by its
# time limit keeps what it had.
# Extra arguments for bench/offpolicy.py (later ones win): e.g. a dry run of this script on a CPU
# machine, RLGEN_OFFPOLICY_ARGS="--backend cpu --quick --max-new-tokens 8" (with OUT and RLGEN_TEST_MODEL
# set; RLGEN_LARGE_MODEL names a checkpoint to use instead of building the 1.7B one).
source "$(dirname "$0")/common.sh"
export RLGEN_SGLANG_ARGS="${SGLANG_FLAGS[*]}" RLGEN_DEFAULT_MODEL="$RLGEN_TEST_MODEL"
PART=${1:-small}
read -r -a EXTRA <<< "${RLGEN_OFFPOLICY_ARGS:-}"

bench() {  # bench NAME MODEL REPEATS [bench flags...]
  local name=$1 model=$2 repeats=$3; shift 3
  local t0=$SECONDS
  timeout 540 python3 bench/offpolicy.py --backend sglang --model "$model" --repeats "$repeats" --budget-s 470 \
    --out "$OUT/offpolicy-$name.json" "$@" "${EXTRA[@]}" > "$OUT/offpolicy-$name.txt" 2>&1
  echo "offpolicy $name: exit $? in $((SECONDS - t0)) s"; tail -60 "$OUT/offpolicy-$name.txt"
  if [ -d "$OUT/offpolicy-$name-logs" ]; then  # few files come back from $OUT: the server logs as one
    tar czf "$OUT/offpolicy-$name-logs.tgz" -C "$OUT" "offpolicy-$name-logs" && rm -rf "$OUT/offpolicy-$name-logs"
  fi
}

python3 bench/_common.py --for "bash scripts/gpu/offpolicy.sh $PART" > "$OUT/environment-offpolicy-$PART.json"
case "$PART" in
  small) bench 0.135b "$RLGEN_TEST_MODEL" 7 ;;
  large) bench 1.7b "$(large_model)" 5 --phases trainer,span ;;
  deterministic) bench 0.135b-deterministic "$RLGEN_TEST_MODEL" 1 --phases deterministic ;;
  conformance)
    start_sglang 30000 "$OUT/sglang-conformance-pause.log" --mem-fraction-static 0.3 --enable-memory-saver \
      --disable-cuda-graph || exit 1
    RLGEN_CONFORMANCE_URL=http://127.0.0.1:30000 timeout 540 python3 -m pytest tests/conformance/test_pause.py -v \
      -p no:cacheprovider --junitxml="$OUT/conformance-pause.xml" > "$OUT/conformance-pause.txt" 2>&1
    echo "conformance test_pause.py: exit $?"; tail -30 "$OUT/conformance-pause.txt"
    stop_sglang ;;
  *) echo "usage: bash scripts/gpu/offpolicy.sh small|large|deterministic|conformance" >&2
     exit 2 ;;
esac
ps aux | grep -E "[s]glang.launch_server" | head -5 > "$OUT/leftover-offpolicy-$PART.txt"
echo "leftover server processes: $(wc -l < "$OUT/leftover-offpolicy-$PART.txt")"
