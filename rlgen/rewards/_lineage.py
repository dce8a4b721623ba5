"""What a reward function is, written down: the lineage of a score.

Owns: `function_lineage`, a reward function described as plain JSON (its name, a SHA-256 of its
source, the source itself, and its parameters: a `functools.partial`'s bound arguments, a callable
object's public attributes), so that a stored score says which code produced it and an edited
function is told apart from an unchanged one. Knows nothing about where scores are stored.

Two functions with the same source and parameters get the same hash; a function whose source
cannot be read (a built-in, a C extension) is hashed by its qualified name and module, and says so
(`source: null`). A closure's captured values are not part of the hash: pass what a function
depends on as parameters (`functools.partial(f, threshold=0.5)`) for it to be recorded.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import textwrap
from collections.abc import Callable
from typing import Any

__all__ = ["function_lineage"]


def _plain(value: Any) -> Any:
    """A JSON-able stand-in for a parameter value (its repr where JSON cannot hold it)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _source(fn: Callable[..., Any]) -> str | None:
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn)
    try:
        return textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        return None


def function_lineage(name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    """`{"name", "source_sha256", "source", "params", "qualname"}` for a reward function."""
    params: dict[str, Any] = {}
    inner = fn
    while isinstance(inner, functools.partial):
        params = {**{f"arg{i}": _plain(a) for i, a in enumerate(inner.args)},
                  **{k: _plain(v) for k, v in inner.keywords.items()}, **params}
        inner = inner.func
    if not (inspect.isfunction(inner) or inspect.ismethod(inner)):  # a callable object
        params.update({k: _plain(v) for k, v in sorted(vars(inner).items()) if not k.startswith("_")}
                      if hasattr(inner, "__dict__") else {})
    source = _source(inner)
    qualname = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', type(inner).__qualname__)}"
    body = json.dumps({"source": source if source is not None else qualname, "params": params}, sort_keys=True)
    return {"name": name, "source_sha256": hashlib.sha256(body.encode()).hexdigest(), "source": source,
            "params": params, "qualname": qualname}
