"""The daemon threads that environments' and tools' plain (not `async def`) calls run in: `run_in_worker`.

Owns: a process-wide set of daemon worker threads that take calls from one queue. A call goes to
a worker that is idle, or to a new one when none is: so a call that hangs (it cannot be stopped:
Python cannot kill a thread) keeps its worker and never delays another call, and the calls of
hundreds of episodes' steps reuse a few threads instead of starting one each (starting a thread
cost about 100 us of the event loop's time per call: docs/archive/benchmarks-rounds-2026-12.md,
"Episodes against a hand-written lockstep loop: round two"). A worker idle for `IDLE_S` exits.
How many calls run at once is the caller's bound (`_tools.MAX_THREADS`). Knows nothing about event loops,
timeouts or what the calls are: it runs a function and hands its outcome to a callback, on the worker's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from queue import Empty, SimpleQueue

__all__ = ["IDLE_S", "run_in_worker"]

IDLE_S = 10.0  # a worker with nothing to do for this long exits

_Job = Callable[[], None]
_jobs: SimpleQueue[_Job] = SimpleQueue()
_lock = threading.Lock()
_idle = 0  # workers waiting for a job and not yet promised one


def run_in_worker(job: _Job) -> None:
    """Run `job()` on an idle worker thread, or on a new one; `job` must not raise (it reports its
    own outcome)."""
    global _idle
    with _lock:
        if _idle > 0:
            _idle -= 1  # promised to this job: the queue holds one more job than idle workers take
            _jobs.put(job)
            return
    threading.Thread(target=_work, args=(job,), name="rlgen-call", daemon=True).start()


def _work(job: _Job) -> None:
    global _idle
    while True:
        job()
        with _lock:
            _idle += 1
        while True:
            try:
                job = _jobs.get(timeout=IDLE_S)
                break  # a job promised to an idle worker: this one takes it
            except Empty:
                with _lock:
                    if _jobs.empty():  # no job promised to an idle worker is waiting: leave
                        _idle -= 1
                        return
