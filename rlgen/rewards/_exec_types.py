"""The values `run_calls` takes and gives back, shared by its runners: `Call`, `Outcome`, `Mode`.

Owns: `Call` (one argument set), `Outcome` (what one call did) and the `Mode` and `Status` names.
Knows nothing about how calls run: `_exec.py` is the entry, `_exec_threads.py`, `_exec_pool.py` and
`_exec_worker.py` the runners. The worker process never imports this module (it loads only the
standard library, see `_exec_worker.py`): it sends plain tuples in `Outcome`'s field order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Call", "Mode", "Outcome", "Status"]

Mode = Literal["process", "thread", "inline"]
Status = Literal["ok", "error", "timeout", "cancelled"]


@dataclass(frozen=True)
class Call:
    """One invocation of the function: `fn(*args, **kwargs)`."""

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What one call did.

    Attributes:
        status: "ok", "error" (the function raised, its worker died, or its value or arguments could
            not travel), "timeout", or "cancelled" (Ctrl-C came before it finished).
        value: the return value when ok (not inspected), else None.
        error: "ExcType: message" (e.g. "ZeroDivisionError: division by zero", "WorkerDied: exit
            code -11 (SIGSEGV)"), None when ok.
        traceback: the full traceback text where there is one (for a crashed worker: the Python
            stack faulthandler wrote), else None.
        seconds: the call's own wall time, not counting time queued; for a timeout, the time until
            it was given up.
    """

    status: Status
    value: Any = None
    error: str | None = None
    traceback: str | None = None
    seconds: float = 0.0
