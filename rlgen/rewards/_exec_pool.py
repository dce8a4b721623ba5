"""Process mode of `run_calls`, the parent's side: the pool of worker processes, and one run on it.

Owns: the pool (`_Worker`s kept from one run to the next while what they inherited still holds:
`_checkout`, `_checkin`, `_spawn`, `_kill`, `close_pools`, the kill at exit) and `_ProcessRun`, one
run: batches out, outcomes back, deadlines, deaths. Workers are fresh interpreters (never a fork of
the caller, a Jupyter kernel with threads), each in its own session, so "Interrupt kernel" misses
them. Calls go out in batches, pipelined so that a worker never waits for its next one, and each
outcome comes back as soon as its call finishes: the parent knows which call a worker is running
and since when. A call that outlives `timeout` is stopped by SIGKILLing its worker's process group
("timeout"); the calls queued on that worker go to another, and a replacement starts. A worker that
dies (segfault, `os._exit`, OOM killer) marks the call it was running "error" (exit code or signal,
and the stack faulthandler wrote), and the run goes on. Ctrl-C kills the workers running calls.
Knows nothing about what a worker does with its messages (`_exec_worker.py`, which also owns the
frames this side speaks), threads, inline runs, argument checks or `RunInterrupted` (`_exec.py`).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from ..core._loop import is_async
from ._exec_types import Call, Outcome
from ._exec_worker import _PICKLE, _dump_function, _error_text, _frame, _Frames, _worker_command

# How long a worker may take to start and load the function (its imports included) before the run
# fails; an async call's grace after its timeout, for the worker's own cancellation to report before
# the parent kills the worker; how often the parent checks that busy workers are alive when their
# socket cannot tell (a process the function forked may hold it open).
LOAD_TIMEOUT_S = 120.0
ASYNC_GRACE_S = 1.0
LIVENESS_POLL_S = 1.0
# Batches: about this many seconds of calls each (from the calls measured so far), at most this
# many calls, and no more than a quarter of a worker's share of what is left (so the run ends with
# small batches and no worker idles while another has a queue).
BATCH_SECONDS = 0.05
MAX_BATCH = 256
FIRST_BATCH = 8
KILL_WAIT_S = 3.0


# ---------------------------------------------------------------------------------------------
# Workers and the pool


@dataclass(eq=False)
class _Worker:
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    crash_log: IO[bytes]  # unnamed: it goes when the parent and the worker have both closed it
    key: tuple[Any, ...]
    owner_pid: int = field(default_factory=os.getpid)  # a forked copy of the owner must leave it alone
    frames: _Frames = field(default_factory=_Frames)
    out: bytearray = field(default_factory=bytearray)
    # per run
    loaded: bool = False
    load_deadline: float = 0.0
    sent: dict[int, None] = field(default_factory=dict)      # calls sent and not yet reported, in order
    running: dict[int, float] = field(default_factory=dict)  # calls running -> monotonic start, as seen here
    dead: bool = False

    def reset(self) -> None:
        self.loaded, self.dead = False, False
        self.sent.clear()
        self.running.clear()
        self.load_deadline = time.monotonic() + LOAD_TIMEOUT_S

    def queue(self, message: tuple[Any, ...]) -> None:
        self.out += _frame(message)

    def flush(self) -> None:
        """Send what the socket takes now (the parent never blocks on a worker); raises OSError if it is gone."""
        while self.out:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                return
            del self.out[:sent]


_pool_lock = threading.Lock()
_idle: list[_Worker] = []
_live: set[_Worker] = set()  # every worker not yet reaped: atexit kills them


def close_pools() -> None:
    """Stop every idle worker process; the next process-mode run starts fresh ones.

    Workers keep the modules a function imported; a run starts fresh workers by itself when the
    environment, the working directory, `sys.path` or a loaded module's file (outside site-packages
    and the standard library) changed. Call this to free their memory, or after changing something
    that check cannot see.
    """
    with _pool_lock:
        _forget_inherited()
        idle = list(_idle)
        _idle.clear()
    for worker in idle:
        _kill(worker)


def _cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _pool_key() -> tuple[Any, ...]:
    """What a worker inherited when it started: a worker is reused only while all of it still holds."""
    return (sys.executable, os.getcwd(), tuple(sys.path), hash(frozenset(os.environ.items())), _user_modules())


def _user_modules() -> frozenset[tuple[str, float]]:
    """(file, mtime) of loaded modules outside the standard library and site-packages: a worker that
    imported one of them before it was edited would run the old code."""
    paths = sysconfig.get_paths()
    installed = tuple({os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths})
    stamps = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or path.startswith(installed):
            continue
        with contextlib.suppress(OSError):
            stamps.add((path, os.stat(path).st_mtime))
    return frozenset(stamps)


def _checkout(key: tuple[Any, ...], count: int) -> list[_Worker]:
    """Up to `count` idle workers started with this key (the run starts the rest). Idle workers
    with another key are stopped."""
    with _pool_lock:
        _forget_inherited()
        stale = [w for w in _idle if w.key != key or w.proc.poll() is not None]
        mine = [w for w in _idle if w not in stale][:count]
        _idle[:] = [w for w in _idle if w not in stale and w not in mine]
    for worker in stale:
        _kill(worker)
    return mine


def _forget_inherited() -> None:
    """In a forked copy of the owner (multiprocessing's fork): drop the owner's workers unharmed."""
    if any(w.owner_pid != os.getpid() for w in _live):
        _idle[:] = [w for w in _idle if w.owner_pid == os.getpid()]
        for worker in [w for w in _live if w.owner_pid != os.getpid()]:
            _live.discard(worker)


def _checkin(workers: list[_Worker]) -> None:
    """Keep a run's healthy workers for the next run: as many as it had, or as there are CPUs,
    whichever is more (runs from several threads at once do not leave their sum behind)."""
    with _pool_lock:
        _idle.extend(w for w in workers if not w.dead and not w.sent and not w.out and w.proc.poll() is None)
        keep = max(_cpu_count(), len(workers))
        extra = _idle[:-keep] if len(_idle) > keep else []
        del _idle[:len(extra)]
    for worker in extra:
        _kill(worker)


def _spawn(key: tuple[Any, ...]) -> _Worker:
    from ..server._process_tree import popen_from_long_lived_thread

    mine, theirs = socket.socketpair()
    crash_log = tempfile.TemporaryFile()  # noqa: SIM115 - open for the worker's life, closed by _kill
    try:
        cmd = _worker_command(theirs.fileno(), crash_log.fileno())  # runs _exec_worker.py, loaded by path
        proc = popen_from_long_lived_thread(cmd, dict(
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(), crash_log.fileno()),
            start_new_session=True,  # out of the kernel's process group: "Interrupt kernel" misses it
            close_fds=True,
        ))
    except BaseException as exc:
        mine.close()
        crash_log.close()
        if isinstance(exc, Exception):
            raise RuntimeError(f"could not start a worker process ({sys.executable}): {_error_text(exc)}") from exc
        raise
    finally:
        theirs.close()
    mine.setblocking(False)
    worker = _Worker(proc, mine, crash_log, key)
    worker.queue(("init", list(sys.path)))
    with _pool_lock:
        _live.add(worker)
    return worker


def _kill(worker: _Worker) -> None:
    """SIGKILL the worker's process group (it is its session's leader: what the function started
    without leaving the group goes too) and reap it."""
    worker.dead = True
    with contextlib.suppress(OSError):
        worker.sock.close()
    if worker.proc.poll() is None:  # not reaped yet: its pid, and so its group id, cannot be reused
        with contextlib.suppress(OSError):
            os.killpg(worker.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            worker.proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        worker.proc.wait(KILL_WAIT_S)
    worker.crash_log.close()
    with _pool_lock:
        _live.discard(worker)


def _kill_all() -> None:
    with _pool_lock:
        _forget_inherited()
        workers = list(_live)
        _idle.clear()
    for worker in workers:
        _kill(worker)


atexit.register(_kill_all)


def _exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "exit code unknown"
    if returncode < 0:
        try:
            return f"exit code {returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"exit code {returncode}"
    return f"exit code {returncode}"


def _crash_text(worker: _Worker) -> str | None:
    try:
        text = os.pread(worker.crash_log.fileno(), 1 << 20, 0).decode(errors="replace").strip()
    except (OSError, ValueError):
        return None
    return text or None


# ---------------------------------------------------------------------------------------------
# A process-mode run


class _ProcessRun:
    def __init__(self, fn: Callable[..., Any], calls: list[Call], outcomes: list[Outcome | None], *,
                 timeout: float | None, workers: int, batch_size: int | None, concurrency: int,
                 progress: Callable[[int], None]) -> None:
        try:
            payload = _dump_function(fn)
        except Exception as exc:
            raise TypeError(f"fn cannot be sent to a worker process ({_error_text(exc)}). Create locks, clients and "
                            "open files inside the function instead of capturing them, or use mode='thread'") from exc
        self.calls, self.outcomes, self.progress = calls, outcomes, progress
        self.timeout, self.workers, self.batch_size = timeout, workers, batch_size
        self.is_async = is_async(fn)
        self.concurrency = concurrency
        self.token = time.monotonic_ns()
        self.fn_message = ("fn", self.token, payload, self.is_async, timeout, concurrency)
        self.pending: deque[int] = deque(range(len(calls)))
        self.left = len(calls)
        self.seconds_sum, self.seconds_n = 0.0, 0
        self.key = _pool_key()
        self.team: list[_Worker] = []
        self.selector = selectors.DefaultSelector()
        # async calls get a grace period for the worker's own cancellation to report first
        self.limit = None if timeout is None else timeout + (ASYNC_GRACE_S if self.is_async else 0.0)

    # -- the loop

    def run(self) -> None:
        try:
            for worker in _checkout(self.key, self.workers):
                self.enlist(worker)
            while len(self.team) < self.workers:
                self.enlist(_spawn(self.key))
            last_poll = time.monotonic()
            while self.left:
                self.refill()
                events = self.selector.select(self.wait())
                finished = 0
                for key, mask in events:
                    worker = key.data
                    if worker.dead:
                        continue
                    if mask & selectors.EVENT_WRITE:
                        self.flush(worker)
                    if mask & selectors.EVENT_READ and not worker.dead:
                        finished += self.read(worker)
                now = time.monotonic()
                finished += self.expire(now)
                if now - last_poll >= LIVENESS_POLL_S:
                    last_poll = now
                    for worker in list(self.team):
                        if worker.sent and worker.proc.poll() is not None:
                            finished += self.read(worker, exited=True)
                self.left -= finished
                if finished:
                    self.progress(finished)
        except KeyboardInterrupt:
            self.keep_what_arrived()
            raise
        finally:
            self.end()

    def wait(self) -> float | None:
        """Seconds until the next deadline (None: none), capped for the liveness poll while busy."""
        now = time.monotonic()
        deadlines = []
        for worker in self.team:
            if not worker.loaded:
                deadlines.append(worker.load_deadline)
            if self.limit is not None:
                deadlines.extend(t0 + self.limit for t0 in worker.running.values())
            if worker.sent:
                deadlines.append(now + LIVENESS_POLL_S)
        return max(0.0, min(deadlines) - now) if deadlines else None

    def enlist(self, worker: _Worker) -> None:
        worker.reset()
        worker.queue(self.fn_message)
        self.team.append(worker)
        self.selector.register(worker.sock, selectors.EVENT_READ, worker)
        self.flush(worker)

    def end(self) -> None:
        """Kill the workers still running calls (after an interrupt or an error); keep the others."""
        for worker in self.team:
            if worker.sent and not worker.dead:
                _kill(worker)
        with contextlib.suppress(Exception):
            self.selector.close()
        _checkin(self.team)

    # -- sending

    def next_batch_size(self) -> int:
        if self.batch_size is not None:
            return self.batch_size
        share = math.ceil(len(self.pending) / (4 * max(1, len(self.team))))
        by_time = FIRST_BATCH if not self.seconds_n else int(BATCH_SECONDS / max(self.seconds_sum / self.seconds_n, 1e-7))
        return max(1, min(MAX_BATCH, share, by_time))

    def refill(self) -> None:
        """Keep every worker's queue above half a batch (plus `concurrency` for async calls), so it
        never waits for its next batch."""
        for worker in self.team:
            while self.pending and not worker.dead:
                size = self.next_batch_size()
                if len(worker.sent) > size // 2 + (self.concurrency if self.is_async else 0):
                    break
                self.send_batch(worker, [self.pending.popleft() for _ in range(min(size, len(self.pending)))])

    def send_batch(self, worker: _Worker, indices: list[int]) -> None:
        items = [(self.calls[i].args, dict(self.calls[i].kwargs)) for i in indices]
        try:
            payload = pickle.dumps(items, protocol=_PICKLE)
        except Exception:
            payload, indices = self.dump_each(indices)
        if not indices:
            return
        for i in indices:
            worker.sent[i] = None
        if worker.loaded and not self.is_async and len(worker.running) == 0:
            worker.running[indices[0]] = time.monotonic()
        worker.queue(("batch", indices, payload))
        self.flush(worker)

    def dump_each(self, indices: list[int]) -> tuple[bytes, list[int]]:
        """cloudpickle, call by call: those that cannot be sent are errors, the rest go."""
        import cloudpickle

        kept, items = [], []
        for i in indices:
            item = (self.calls[i].args, dict(self.calls[i].kwargs))
            try:
                cloudpickle.dumps(item, protocol=_PICKLE)
            except Exception as exc:
                self.finish(i, Outcome("error", error=(
                    f"PicklingError: the arguments could not be sent to a worker process ({_error_text(exc)}); pass "
                    "plain values, or use mode='thread'")))
                self.left -= 1
                self.progress(1)
                continue
            kept.append(i)
            items.append(item)
        return cloudpickle.dumps(items, protocol=_PICKLE), kept

    def flush(self, worker: _Worker) -> None:
        try:
            worker.flush()
        except OSError:
            return  # the worker is gone: reading its socket reports that
        with contextlib.suppress(KeyError, ValueError):
            self.selector.modify(worker.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if worker.out else 0),
                                 worker)

    # -- receiving

    def read(self, worker: _Worker, *, exited: bool = False) -> int:
        """Take what the worker sent; returns the number of calls that finished."""
        closed = exited
        while True:
            try:
                data = worker.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                closed = True
                break
            worker.frames.feed(data)
            if len(data) < 1 << 20:
                break
        finished = 0
        while (message := worker.frames.pop()) is not None:
            finished += self.on_message(worker, message)
        if closed:
            finished += self.on_death(worker)
        return finished

    def on_message(self, worker: _Worker, message: tuple[Any, ...]) -> int:
        kind = message[0]
        if kind == "loaded":
            _, token, error, tb = message
            if token != self.token:
                return 0  # from an earlier run that ended before the worker answered
            if error is not None:
                raise TypeError(f"fn could not be loaded in a worker process: {error}. Define it in a module the "
                                f"workers can import, or in the notebook; or use mode='thread'.\n{tb}")
            worker.loaded = True
            if worker.sent and not self.is_async:
                worker.running[next(iter(worker.sent))] = time.monotonic()
            return 0
        if kind == "start":
            if message[1] in worker.sent:
                worker.running[message[1]] = time.monotonic()
            return 0
        _, i, status, value_payload, error, tb, seconds = message
        if i not in worker.sent:
            return 0
        del worker.sent[i]
        worker.running.pop(i, None)
        if worker.sent and not self.is_async and not worker.running:
            worker.running[next(iter(worker.sent))] = time.monotonic()
        value = None
        if status == "ok" and value_payload is not None:
            try:
                value = pickle.loads(value_payload)
            except Exception as exc:
                status, error, tb = "error", (
                    f"UnpicklingError: the return value could not be read back in this process ({_error_text(exc)}); "
                    "return plain values (numbers, strings, lists, dicts)"), None
        self.seconds_sum += seconds
        self.seconds_n += 1
        return self.finish(i, Outcome(status, value, error, tb, seconds))

    def finish(self, i: int, outcome: Outcome) -> int:
        if self.outcomes[i] is not None:
            return 0
        self.outcomes[i] = outcome
        return 1

    # -- workers that die or time out

    def on_death(self, worker: _Worker) -> int:
        was_loaded = worker.loaded
        self.retire(worker)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.proc.wait(KILL_WAIT_S)
        exit_text = _exit_text(worker.proc.returncode)
        crash = _crash_text(worker)
        if not was_loaded:
            _kill(worker)
            raise RuntimeError(f"a worker process exited ({exit_text}) before it had loaded the function"
                               + (f":\n{crash}" if crash else ""))
        now = time.monotonic()
        finished = 0
        for i, t0 in worker.running.items():
            finished += self.finish(i, Outcome("error", error=f"WorkerDied: {exit_text}", traceback=crash,
                                               seconds=now - t0))
        self.requeue(worker)
        _kill(worker)
        self.replace()
        return finished

    def expire(self, now: float) -> int:
        finished = 0
        for worker in list(self.team):
            if not worker.loaded and now >= worker.load_deadline:
                raise RuntimeError(f"a worker process did not start and load the function within {LOAD_TIMEOUT_S:g} s")
            if self.limit is None:
                continue
            late = {i: t0 for i, t0 in worker.running.items() if now >= t0 + self.limit}
            if not late:
                continue
            self.retire(worker)
            _kill(worker)
            for i, t0 in late.items():
                finished += self.finish(i, Outcome("timeout", error=(
                    f"TimeoutError: did not finish within {self.timeout:g} s; its worker process was killed"),
                    seconds=now - t0))
                worker.running.pop(i)
            self.requeue(worker)
            self.replace()
        return finished

    def retire(self, worker: _Worker) -> None:
        worker.dead = True
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(worker.sock)
        self.team.remove(worker)

    def requeue(self, worker: _Worker) -> None:
        """Put the calls a retired worker had not finished first in line for the others."""
        rest = [i for i in worker.sent if i not in worker.running and self.outcomes[i] is None]
        worker.sent.clear()
        worker.running.clear()
        self.pending.extendleft(reversed(rest))

    def replace(self) -> None:
        if self.pending and len(self.team) < self.workers:
            self.enlist(_spawn(self.key))

    def keep_what_arrived(self) -> None:
        """After Ctrl-C: the outcomes already in the sockets still count."""
        for worker in list(self.team):
            with contextlib.suppress(Exception):
                while True:
                    data = worker.sock.recv(1 << 20)
                    if not data:
                        break
                    worker.frames.feed(data)
            with contextlib.suppress(Exception):
                while (message := worker.frames.pop()) is not None:
                    if message[0] == "done":
                        self.on_message(worker, message)
