"""The optional extra `rlgen[rewards]`: importing its packages only when a reward needs them.

Owns: the one place that turns a missing optional package into an error that says how to install
it. Knows nothing about what the packages are used for.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["INSTALL_HINT", "require"]

INSTALL_HINT = "pip install 'rlgen[rewards]'"


def require(module: str, *, package: str, needed_by: str) -> ModuleType:
    """Import `module` (from the PyPI package `package`), or raise an ImportError that says what to install.

    Raises:
        ImportError: `module` (or something it imports) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{needed_by} needs the optional package {package!r}, which could not be imported ({exc}); "
            f"install it with: {INSTALL_HINT}",
            name=exc.name,
        ) from exc
