"""rlgen: study and debug LLM generation and RL rewards in Jupyter, on an SGLang server the notebook owns.

Usage::

    import rlgen
    with rlgen.Engine() as eng:               # SGLang on the GPU, or the CPU backend without one
        res = eng.generate(["What is 2+2?"], n=4, max_new_tokens=32)
        res.df, res.tensors()
"""

from __future__ import annotations

from ._engine import Engine, EngineState
from ._errors import *  # noqa: F403
from ._errors import __all__ as _errors_all
from ._models import DEFAULT_MODEL, resolve_model
from ._registry import list_servers
from ._results import Rollouts, compare_logprobs
from ._server import reap

__version__ = "0.1.0"

__all__ = sorted([
    *_errors_all, "DEFAULT_MODEL", "Engine", "EngineState", "Rollouts", "compare_logprobs",
    "list_servers", "reap", "resolve_model",
])

# Show public objects as `rlgen.X` in reprs and tracebacks (as httpx does).
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        try:
            _obj.__module__ = "rlgen"
        except (AttributeError, TypeError):
            pass
