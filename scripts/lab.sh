#!/usr/bin/env bash
# Open JupyterLab on notebooks/ with rlgen's environment: the .venv the README's commands make, with
# what the tutorials need added once (the extra rlgen[lab]: JupyterLab, a kernel, the rewards and
# plots extras; ipywidgets is a dependency of rlgen). No dev tools (pytest, ruff, mypy, the router).
# Pass JupyterLab's own options through, e.g.
#   bash scripts/lab.sh --no-browser --port 8899
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh lab
echo "[rlgen] start with notebooks/01_quickstart.ipynb, then 02_reward_debugging, 03_group_advantages, 04_one_rl_step, 05_checkpoint_ab, 06_multi_turn, 07_lora_rl_step and 08_reward_across_a_run" >&2
exec python -m jupyterlab --notebook-dir=notebooks "$@"
