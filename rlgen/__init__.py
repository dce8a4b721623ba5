"""rlgen: study and debug LLM generation and RL rewards in Jupyter, on an SGLang server the notebook owns."""

from __future__ import annotations

from ._errors import *  # noqa: F403
from ._errors import __all__ as _errors_all
from ._models import DEFAULT_MODEL, resolve_model

__version__ = "0.1.0"

__all__ = sorted([*_errors_all, "DEFAULT_MODEL", "resolve_model"])

for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and not isinstance(_obj, str):
        try:
            _obj.__module__ = "rlgen"
        except (AttributeError, TypeError):
            pass
