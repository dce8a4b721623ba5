#!/usr/bin/env bash
# On the GPU machine: one throw-away SGLang start, so that the next calls' starts are warm.
#   source /tmp/rlgen-env.sh && bash scripts/gpu/warmup.sh
source "$(dirname "$0")/common.sh"
warm_sglang 2>&1 | tail -3
