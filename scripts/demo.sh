#!/usr/bin/env bash
# The demo: launch an engine on the default model, generate for a few prompts, print the DataFrame.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
exec python -m rlgen "$@"
