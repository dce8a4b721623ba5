#!/usr/bin/env bash
# Lint and type-check: ruff on the whole tree, mypy --strict on rlgen/ (both configured in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh dev
ruff check .
mypy
