#!/usr/bin/env bash
# The test suite: CPU backend on machines without a GPU (gpu tests skip), real SGLang where there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh dev
exec python -m pytest tests notebooks --nbmake --nbmake-timeout=600 --durations=30 "$@"
