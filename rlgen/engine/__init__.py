"""The top layer: `Engine`, the object a notebook holds.

Owns: composing a server process (`rlgen.server`), an HTTP client (`rlgen.client`) and the result
object (`rlgen.rollouts`) into `Engine`, split by job: construction and lifecycle (`engine._engine`,
`_startup`), generation (`_generation`), scoring (`_scoring`), server control (`_control`), the
shared state (`_base`). Knows nothing below its layers' public functions.
"""

from __future__ import annotations

from ._base import EngineState
from ._engine import Engine

__all__ = ["Engine", "EngineState"]
