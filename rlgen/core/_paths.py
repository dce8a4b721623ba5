"""Where rlgen keeps its files on disk.

Owns: the cache root (`$RLGEN_CACHE_DIR`, else `~/.cache/rlgen`), under which the converted default
model (`models/`) and the server logs and registry (`servers/`) live. Knows nothing about what
is stored there.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """rlgen's cache root: `$RLGEN_CACHE_DIR`, else `~/.cache/rlgen`."""
    return Path(os.environ.get("RLGEN_CACHE_DIR") or Path.home() / ".cache" / "rlgen").expanduser()
