#!/usr/bin/env bash
# Open JupyterLab on notebooks/ with rlgen's environment: the .venv the README's commands make, with
# JupyterLab, a kernel and ipywidgets added (once). Pass JupyterLab's own options through, e.g.
#   bash scripts/lab.sh --no-browser --port 8899
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh dev
if ! python -c "import jupyterlab, ipykernel, ipywidgets" >/dev/null 2>&1; then
  echo "[rlgen setup] installing JupyterLab, ipykernel and ipywidgets into $(dirname "$(dirname "$(command -v python)")")" >&2
  python -m pip install -q "jupyterlab>=4" ipykernel "ipywidgets>=8"
fi
echo "[rlgen] start with notebooks/01_quickstart.ipynb, then 02_reward_debugging, 03_group_advantages, 04_one_rl_step and 05_checkpoint_ab" >&2
exec python -m jupyterlab --notebook-dir=notebooks "$@"
