"""Python's cyclic garbage collector kept off rlgen's hot paths: `gc_paused`.

Owns: one way to pause the cyclic GC for a stretch of work, safe when several stretches overlap
(an episodes call on the background loop while the notebook's thread builds a result, say): the
first to begin pauses it, if it was running, and the last to end resumes it; a GC that the user
had paused stays paused. Knows nothing about what runs inside.

Why: parsing a large `/generate` answer, building a result, and an episodes call allocate tens of
thousands of small containers, and every 700 allocations the collector scans the young ones;
when enough survive, it walks the whole heap (torch, transformers, pandas and the notebook's own
data: about 200 ms a time on a 2-core machine). Pausing it frees nothing later: reference
counting frees everything acyclic at once, and what cycles a stretch leaves are collected after
it. The measurements:
docs/archive/benchmarks-rounds-2026-12.md, "Episodes against a hand-written lockstep loop: round two".
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["gc_paused"]

_lock = threading.Lock()
_depth = 0            # stretches running now
_resume = False       # whether the first of them paused a running GC (so the last resumes it)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC paused for the block (also a decorator: `@gc_paused()`); overlapping blocks
    in any threads pause it once and resume it once, when the last one ends."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
