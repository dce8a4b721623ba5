"""Starting, tracking and stopping one child process tree at the OS level, and reaping leftovers.

Owns: spawning a child in its own session with the parent-death signal armed, the tree of it and
every descendant seen while it lived (`ProcessTree`), stopping that tree (`ShutdownReport`),
`reap()` of trees whose owner died (on top of the records in `server/_registry.py`), the check that
a stopped tree's processes released their GPU memory, and which GPUs (by UUID) a tree's processes
use.

Knows nothing about HTTP, ports, readiness, log contents or SGLang's options: to this module a
server is an argv, an environment and a file its output goes to.

How a tree is owned (each point answers a failure seen in the wild: orphaned servers holding a
GPU, Ctrl-C killing the server):

- **Own session.** The child is started with `start_new_session=True`, so it is not in the
  Jupyter kernel's process group: "Interrupt kernel" (SIGINT to that group) does not reach it.
- **Parent-death signal (Linux).** The child is exec'd through `setpriv --pdeathsig KILL --` (or,
  without setpriv, a tiny Python shim that calls `prctl(PR_SET_PDEATHSIG, SIGKILL)` and checks that
  its parent is still the launcher before exec'ing). The kernel then SIGKILLs the server when its
  owner dies, even by SIGKILL. Caveats, from prctl(2):
  - The signal fires when the *thread* that forked the child exits, not the process. Servers are
    therefore spawned from the main thread, or else from one long-lived daemon thread of this
    module (never from a caller's short-lived worker thread).
  - It covers the direct child only. SGLang arms the same signal in its own children: the
    scheduler and detokenizer processes call `kill_itself_when_parent_died()` (from
    `sglang.srt.utils`) first thing, and `sglang/launch_server.py` wraps the server in
    `try/finally: kill_process_tree(os.getpid(), include_parent=False)`; so when the SGLang main
    process dies its workers follow. They also stay in its process group, which `stop()` signals
    as a whole. Other grandchildren survive an owner SIGKILL; `reap()` finds them by group.
  - setpriv leaves a window of about a millisecond between fork and prctl during which an owner
    death goes unnoticed; the registry (`reap()`) is the backstop for that and for macOS, which
    has no parent-death signal at all.
- **Shutdown.** `ProcessTree.stop()` sends SIGTERM to the group, waits `grace` seconds, sends
  SIGKILL to the group, then kills any process of the tree recorded while it was alive
  (descendants that left the group with setsid). It never signals the calling process or its group.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import IO, Any

import psutil

from . import _registry

__all__ = [
    "KILL_WAIT_S",
    "ProcessTree",
    "ShutdownReport",
    "check_grace",
    "gpu_memory_by_device",
    "gpu_memory_by_pid",
    "gpu_memory_mib",
    "gpu_memory_per_gpu",
    "gpu_name",
    "gpu_uuids_of",
    "is_exiting",
    "popen_from_long_lived_thread",
    "reap",
    "spawn",
    "stop_recorded",
    "wait_gpu_memory_released",
]

KILL_WAIT_S = 3.0  # after SIGKILL, how long to wait for the kernel to remove the processes


@dataclass(frozen=True)
class ShutdownReport:
    """What `close()` did.

    Attributes:
        exit_code: the server's exit code (negative: killed by that signal), None if unknown.
        escalated: True if something had to be SIGKILLed after the grace period.
        leftover_pids: processes of the tree still alive afterwards (should be empty).
        seconds: how long the shutdown took.
    """

    exit_code: int | None
    escalated: bool
    leftover_pids: tuple[int, ...]
    seconds: float

    @property
    def clean(self) -> bool:
        return not self.leftover_pids


def check_grace(grace: object) -> None:
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        raise ValueError(f"grace must be a number of seconds >= 0, got {grace!r}")


# ---------------------------------------------------------------------------------------------
# Spawning


_SHIM = (
    "import ctypes, os, signal, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG\n"
    "    raise OSError(ctypes.get_errno(), 'prctl(PR_SET_PDEATHSIG) failed')\n"
    "if os.getppid() != int(sys.argv[1]):  # the launcher died before prctl: nobody will signal us\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def spawn(cmd: list[str], *, env: Mapping[str, str], stdout: IO[bytes], pdeathsig: bool) -> ProcessTree:
    """Start `cmd` in its own session, its output (stdout and stderr) to the file `stdout`."""
    popen_kwargs: dict[str, Any] = dict(
        stdin=subprocess.DEVNULL,
        stdout=stdout,  # a file, never a PIPE: a pipe nobody drains blocks the server when full
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # out of the kernel's process group: "Interrupt kernel" misses it
        close_fds=True,
    )
    if pdeathsig:
        proc = popen_from_long_lived_thread(_with_pdeathsig(cmd), popen_kwargs)
    else:
        proc = subprocess.Popen(cmd, **popen_kwargs)
    return ProcessTree(proc)


def _with_pdeathsig(cmd: list[str]) -> list[str]:
    """Prefix `cmd` so that it is SIGKILLed when the launching thread dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return cmd  # macOS & co. have no PR_SET_PDEATHSIG: the registry and reap() are the backstop
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, "--pdeathsig", "KILL", "--", *cmd]
    return [sys.executable, "-c", _SHIM, str(os.getpid()), *cmd]


class _Spawner:
    """A daemon thread that lives as long as the interpreter and does the fork for callers that
    are not the main thread: the parent-death signal fires when the *forking thread* exits."""

    _lock = threading.Lock()
    _queue: SimpleQueue[tuple[list[str], dict[str, Any], Future[subprocess.Popen[bytes]]]] | None = None

    @classmethod
    def popen(cls, cmd: list[str], kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
        with cls._lock:
            if cls._queue is None:
                cls._queue = SimpleQueue()
                threading.Thread(target=cls._run, args=(cls._queue,), name="rlgen-spawner", daemon=True).start()
        future: Future[subprocess.Popen[bytes]] = Future()
        cls._queue.put((cmd, kwargs, future))
        return future.result()

    @staticmethod
    def _run(queue: SimpleQueue[tuple[list[str], dict[str, Any], Future[subprocess.Popen[bytes]]]]) -> None:
        while True:
            cmd, kwargs, future = queue.get()
            try:
                future.set_result(subprocess.Popen(cmd, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)


def popen_from_long_lived_thread(cmd: list[str], kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(cmd, **kwargs)`, forked from the main thread or a long-lived daemon thread
    (never a caller's short-lived one), so that a parent-death signal the child arms fires only
    when this process dies."""
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(cmd, **kwargs)
    return _Spawner.popen(cmd, kwargs)


# ---------------------------------------------------------------------------------------------
# The tree


@dataclass
class ProcessTree:
    """One launched process and every descendant seen while it lived (pid -> create time)."""

    proc: subprocess.Popen[bytes]
    pgid: int = 0
    known: dict[int, float] = field(default_factory=dict)
    has_record: bool = False
    owner_pid: int = field(default_factory=os.getpid)
    report: ShutdownReport | None = None

    def __post_init__(self) -> None:
        # start_new_session makes the child a session and group leader: pgid == pid.
        self.pgid = self.proc.pid
        with contextlib.suppress(psutil.Error):  # already gone: poll() reports its exit
            self.known[self.proc.pid] = psutil.Process(self.proc.pid).create_time()

    def refresh(self) -> None:
        """Record the current descendants (psutil can only find them while their parent lives)."""
        if self.proc.poll() is not None:
            return
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.known.setdefault(child.pid, child.create_time())
        except psutil.Error:
            pass

    def listens_on(self, port: int) -> bool | None:
        """True if a process of the tree listens on `port`, False if none does, None if unknowable."""
        unknowable = False
        for pid in list(self.known):  # the server itself first: SGLang's HTTP server runs there
            try:
                proc = psutil.Process(pid)
                # psutil >= 6 renamed connections() to net_connections().
                listing = proc.net_connections if hasattr(proc, "net_connections") else proc.connections
                conns = listing(kind="inet")
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                unknowable = True
                continue
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns):
                return True
        return None if unknowable else False

    def stop(self, *, grace: float) -> ShutdownReport:
        """Stop the tree once; later calls return the first report."""
        if self.report is not None:
            return self.report
        if os.getpid() != self.owner_pid:
            # A forked copy of the owner (multiprocessing fork) must not stop the owner's server
            # when its copy of this object is collected.
            return ShutdownReport(None, False, (), 0.0)
        t0 = time.monotonic()
        self.refresh()
        escalated, leftovers = _terminate_tree(
            self.pgid, self.known.get(self.proc.pid), self.known, grace=grace, popen=self.proc
        )
        if self.has_record:
            _registry.remove_record(self.proc.pid)
        self.report = ShutdownReport(self.proc.poll(), escalated, leftovers, time.monotonic() - t0)
        return self.report


def is_exiting(pid: int) -> bool:
    """True once the process's main thread is gone: /proc shows it as a zombie while its other
    threads finish tearing down, before waitpid can report the exit."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------------------------
# Stopping


def _terminate_tree(
    pgid: int,
    leader_create_time: float | None,
    known: Mapping[int, float],
    *,
    grace: float,
    popen: subprocess.Popen[bytes] | None = None,
) -> tuple[bool, tuple[int, ...]]:
    """SIGTERM the group and the known processes, wait `grace`, SIGKILL what is left, wait for it.

    Returns (escalated: SIGKILL was needed, pids still alive afterwards).
    """
    # The group may be signalled only while its id still means our group: if the leader is gone
    # and no member is left, the pid can be reused by an unrelated session leader.
    group = pgid if _group_is_ours(pgid, leader_create_time) else None
    # 1. Ask politely.
    _signal_all(group, known, signal.SIGTERM)
    # 2. Wait for the whole tree (not only the leader: its workers flush and exit too).
    deadline = time.monotonic() + grace
    while (remaining := _alive(group, known, popen)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not remaining:
        return False, ()
    # 3. Insist, then wait for the kernel to remove them (SIGKILL cannot be ignored).
    _signal_all(group, known, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while (remaining := _alive(group, known, popen)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True, tuple(sorted(remaining))


def _group_is_ours(pgid: int, leader_create_time: float | None) -> bool:
    if pgid <= 1 or pgid == os.getpgrp():
        return False  # never our own group (or init's)
    try:
        leader = psutil.Process(pgid)
    except psutil.NoSuchProcess:
        return True  # leader gone; a pid stays reserved while its group has members
    if leader_create_time is None:
        return False
    try:
        return bool(abs(leader.create_time() - leader_create_time) < 0.01)
    except psutil.Error:
        return False


def _signal_all(group: int | None, known: Mapping[int, float], sig: signal.Signals) -> None:
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
    me = os.getpid()
    for pid, ctime in known.items():
        # Only descendants that left the group (setsid): a second SIGTERM to a group member is not
        # harmless (uvicorn, SGLang's HTTP server, skips its graceful shutdown on a second signal).
        if pid == me or not _registry.process_alive(pid, ctime) or _pgid(pid) == group:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _alive(group: int | None, known: Mapping[int, float], popen: subprocess.Popen[bytes] | None) -> set[int]:
    """Pids of the tree still alive: known processes plus current members of the group."""
    alive = {pid for pid, ctime in known.items() if _registry.process_alive(pid, ctime)}
    if group is not None:
        alive |= _group_members(group)
    if popen is not None:
        # Our own child counts until waitpid says it exited (see is_exiting: the zombie state
        # /proc shows comes earlier, while freeing a large KV cache can take a second); waitpid
        # also reaps it.
        alive.discard(popen.pid)
        if popen.poll() is None:
            alive.add(popen.pid)
    alive.discard(os.getpid())
    return alive


def _group_members(pgid: int) -> set[int]:
    members = set()
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                members.add(pid)
        except (OSError, psutil.Error):
            continue
    return members


# ---------------------------------------------------------------------------------------------
# Reaping servers whose owner died


def stop_recorded(record: _registry.ServerRecord, *, grace: float = 5.0) -> tuple[int, ...]:
    """Stop the tree of a recorded server this process did not spawn (a kept server): SIGTERM its
    group, `grace` s, SIGKILL; delete its records; and SIGTERM its idle watchdog, if it has one and
    that is not this process (the watchdog itself stops servers this way). Returns the pids still
    alive after it."""
    watchdog = (_registry.read_kept(record.pid) or {}).get("watchdog")
    _, leftovers = _terminate_tree(record.pgid, record.create_time, {record.pid: record.create_time}, grace=grace)
    _registry.remove_record(record.pid)
    if watchdog:  # its server is gone: it would also exit at its next poll
        _signal_all(None, {int(watchdog[0]): float(watchdog[1])}, signal.SIGTERM)
    return leftovers


def reap(*, dry_run: bool = False, grace: float = 5.0, kept: bool = False) -> list[dict[str, Any]]:
    """Stop servers whose owner process is gone, and delete stale records.

    A server is reaped when its owner pid is not alive, or is alive but is a different process
    (pid reuse: another create time). Servers of live owners, including this process, are never
    touched. A kept server (`Engine(keep_alive=...)`) is owned by its idle watchdog, so it is left
    alone until it expires, unless `kept=True` asks to stop kept servers too. Returns one dict per
    record acted on: the record plus `status` ("orphaned", "gone" or "kept"), `action` ("stopped",
    "record removed", or with dry_run "would stop" / "would remove record") and `leftover_pids`.
    """
    check_grace(grace)
    found = []
    for record in _registry.read_records():
        status = _registry.record_status(record)
        if kept and status == _registry.RUNNING and _registry.read_kept(record.pid) is not None:
            entry = {**record.to_dict(), "status": "kept", "leftover_pids": []}
            if dry_run:
                entry["action"] = "would stop"
            else:
                entry["leftover_pids"] = list(stop_recorded(record, grace=grace))
                entry["action"] = "stopped"
            found.append(entry)
            continue
        if status in (_registry.RUNNING, _registry.OTHER_HOST):
            continue
        entry = {**record.to_dict(), "status": status, "leftover_pids": []}
        if dry_run:
            entry["action"] = "would stop" if status == _registry.ORPHANED else "would remove record"
            found.append(entry)
            continue
        owner_alive = _registry.process_alive(record.owner_pid, record.owner_start_time)
        if status == _registry.ORPHANED or not owner_alive:
            # Orphaned: stop it. Gone with a dead owner: its group may still hold grandchildren.
            known = {record.pid: record.create_time} if status == _registry.ORPHANED else {}
            _, leftovers = _terminate_tree(record.pgid, record.create_time, known, grace=grace)
            entry["leftover_pids"] = list(leftovers)
        entry["action"] = "stopped" if status == _registry.ORPHANED else "record removed"
        _registry.remove_record(record.pid)
        found.append(entry)
    return found


# ---------------------------------------------------------------------------------------------
# GPU memory


def wait_gpu_memory_released(pids: Sequence[int], *, timeout: float = 30.0, interval: float = 0.5) -> bool | None:
    """Poll until none of `pids` holds GPU memory: True once so, False on timeout, None if unknown.

    Uses pynvml if importable, else `nvidia-smi`; returns None at once on machines without either
    (CPU machines pay nothing). Inside a container the driver may report host pids, so a True
    there means "none of these pids is listed", which is the best this check can say.
    """
    deadline = time.monotonic() + timeout
    wanted = set(pids)
    while True:
        holders = _gpu_pids()
        if holders is None:
            return None
        if not wanted & holders:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _gpu_pids() -> set[int] | None:
    """Pids of processes holding GPU memory, or None if that cannot be known here."""
    held = gpu_memory_by_pid()
    return None if held is None else set(held)


def gpu_memory_mib(pids: list[int]) -> int | None:
    """GPU memory (MiB) held by these processes together, over all GPUs (None where the driver
    shows none of them)."""
    per_gpu = gpu_memory_per_gpu(pids)
    return sum(per_gpu.values()) if per_gpu else None


def gpu_memory_per_gpu(pids: list[int]) -> dict[int, int] | None:
    """GPU memory (MiB) these processes hold on each GPU, by the driver's GPU index (not the index
    under CUDA_VISIBLE_DEVICES); None where the driver shows none of them."""
    devices = gpu_memory_by_device() if pids else None
    wanted = set(pids)
    mine = {gpu: sum(mib for pid, mib in held.items() if pid in wanted)
            for gpu, held in (devices or {}).items() if wanted & set(held)}
    return mine or None


def gpu_memory_by_pid() -> dict[int, int] | None:
    """GPU memory (MiB) held per process over all GPUs, or None if that cannot be known here."""
    devices = gpu_memory_by_device()
    if devices is None:
        return None
    held: dict[int, int] = {}
    for per_pid in devices.values():
        for pid, mib in per_pid.items():
            held[pid] = held.get(pid, 0) + mib
    return held


def gpu_memory_by_device() -> dict[int, dict[int, int]] | None:
    """GPU memory (MiB) held per process on each GPU ({driver GPU index: {pid: MiB}}), or None if
    that cannot be known here.

    Uses pynvml if importable, else `nvidia-smi`. In a container the driver may list no processes
    at all (callers then see no pids), or list them with no memory figure (0 MiB here).
    """
    try:
        import pynvml
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            try:
                devices: dict[int, dict[int, int]] = {}
                for i in range(pynvml.nvmlDeviceGetCount()):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                    held = devices.setdefault(i, {})
                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                        held[p.pid] = held.get(p.pid, 0) + (p.usedGpuMemory or 0) // (1 << 20)
                return devices
            finally:
                pynvml.nvmlShutdown()
        except Exception:
            pass
    gpus = _nvidia_smi("--query-gpu=index,uuid")
    apps = _nvidia_smi("--query-compute-apps=gpu_uuid,pid,used_memory")
    if gpus is None or apps is None:
        return None
    index = {row[1]: int(row[0]) for row in gpus if len(row) == 2 and row[0].isdigit()}
    devices = {i: {} for i in index.values()}
    for row in apps:  # an app on a GPU the first query did not list goes under -1
        if len(row) == 3 and row[1].isdigit():
            held = devices.setdefault(index.get(row[0], -1), {})
            held[int(row[1])] = held.get(int(row[1]), 0) + (int(row[2]) if row[2].isdigit() else 0)
    return devices


def _nvidia_smi(query: str) -> list[list[str]] | None:
    """`nvidia-smi <query> --format=csv,noheader,nounits` as rows of stripped fields; None where it
    is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [[field.strip() for field in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_uuids_of(pids: Sequence[int]) -> set[str] | None:
    """The UUIDs (lowercase, without nvidia-smi's "GPU-" prefix: torch's `get_device_properties().uuid`
    form) of the GPUs on which any of `pids` holds memory; None where the driver shows none of them
    (no GPU or nvidia-smi here, or a container that hides processes)."""
    wanted = set(pids)
    rows = _nvidia_smi("--query-compute-apps=gpu_uuid,pid") if wanted else None
    found = {row[0].lower().removeprefix("gpu-") for row in rows or []
             if len(row) == 2 and row[1].isdigit() and int(row[1]) in wanted}
    return found or None


def gpu_total_mib() -> int | None:
    """The memory of the smallest GPU this process may use (CUDA_VISIBLE_DEVICES honoured where it
    lists indices), in MiB, as `nvidia-smi` gives it; None where there is none to ask."""
    rows = _nvidia_smi("--query-gpu=index,memory.total")
    totals = {int(r[0]): int(r[1]) for r in rows or [] if len(r) == 2 and r[0].isdigit() and r[1].isdigit()}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and all(v.strip().isdigit() for v in visible.split(",") if v.strip()):
        totals = {i: t for i, t in totals.items() if str(i) in {v.strip() for v in visible.split(",")}}
    return min(totals.values()) if totals else None


def gpu_name() -> str | None:
    """The first GPU's name as `nvidia-smi` gives it, or None where there is none to ask."""
    rows = _nvidia_smi("--query-gpu=name")
    return ", ".join(rows[0]) if rows else None
