#!/usr/bin/env bash
# Debian's Chromium for tests/test_browser_render.py (the view rendered in a real browser).
# Installs it only when it is missing; needs root (apt-get), as on CI's and the dev machines.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
echo "[rlgen setup] installing Debian's chromium for the browser test" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
chromium --version >&2
