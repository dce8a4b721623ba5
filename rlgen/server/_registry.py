"""The on-disk registry of server processes rlgen launched, and who owns them.

Owns: one small JSON record per launched server in `<cache>/servers/registry/<pid>.json`
(`<cache>` is `$RLGEN_CACHE_DIR`, else `~/.cache/rlgen`), and the identity checks that decide
whether a record's server and its owner are still the processes that wrote it. A pid alone is not
an identity (pids are reused), so every check compares the process's create time as well.

Knows nothing about signals or how to stop a process (that is `server/_process_tree.py`, which also
implements `reap()` on top of these records), nor about HTTP.

Why a registry at all: a server whose owner died without running its cleanup (a Jupyter kernel
killed by SIGKILL on a platform without a parent-death signal, or an owner killed in the instant
between spawning the server and arming it) is invisible to the next kernel. The record lets that
next kernel find and stop it (`rlgen.reap()`).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..core._paths import cache_dir

__all__ = [
    "ServerRecord",
    "kept_path",
    "kept_summary",
    "list_servers",
    "owner_identity",
    "private_registry_dir",
    "process_alive",
    "read_kept",
    "read_record",
    "read_records",
    "record_status",
    "registry_dir",
    "remove_record",
    "servers_dir",
    "write_kept",
    "write_record",
]

# Create times come from /proc (clock ticks since boot plus the boot time), so the same process
# always reports the same value; the tolerance only absorbs float formatting in JSON.
_CREATE_TIME_TOLERANCE_S = 0.01

# Statuses `record_status` returns.
RUNNING = "running"  # server alive, owner alive: hands off
ORPHANED = "orphaned"  # server alive, owner gone (or its pid now belongs to another process)
GONE = "gone"  # the server process no longer exists: the record is stale
OTHER_HOST = "other host"  # written on another machine sharing this cache dir: pids mean nothing here


@dataclass(frozen=True)
class ServerRecord:
    """What rlgen knows about one server it launched: enough to find and stop it later."""

    pid: int  # the server process (after the parent-death shim exec'd into it: same pid)
    pgid: int  # its process group (== pid: it is started in a new session)
    create_time: float  # the server's psutil create_time, to detect pid reuse
    port: int
    host: str
    owner_pid: int  # the Python process that launched it
    owner_start_time: float  # the owner's psutil create_time
    argv: list[str]
    log_path: str
    started_at: float  # time.time() at launch
    hostname: str = field(default_factory=socket.gethostname)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerRecord:
        return cls(
            pid=int(data["pid"]),
            pgid=int(data["pgid"]),
            create_time=float(data["create_time"]),
            port=int(data["port"]),
            host=str(data["host"]),
            owner_pid=int(data["owner_pid"]),
            owner_start_time=float(data["owner_start_time"]),
            argv=[str(a) for a in data["argv"]],
            log_path=str(data["log_path"]),
            started_at=float(data["started_at"]),
            hostname=str(data.get("hostname", "")),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def servers_dir() -> Path:
    """Where server logs and the registry live: `<cache>/servers`."""
    return cache_dir() / "servers"


def registry_dir() -> Path:
    """The registry of launched servers: `<cache>/servers/registry`."""
    return servers_dir() / "registry"


def owner_identity() -> tuple[int, float]:
    """This process's (pid, create_time): how a record names its owner."""
    return os.getpid(), psutil.Process().create_time()


def private_registry_dir() -> Path:
    """The registry directory, created (or tightened) to mode 0700: kept servers' records hold
    their API keys, so no other user may list or read them."""
    directory = registry_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = directory.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        directory.chmod(0o700)
    return directory


def _write_json(path: Path, data: dict[str, Any]) -> Path:
    """Write `data` to `path` atomically (temp file + rename) and private (mkstemp's mode 0600), so
    a reader never sees half a record and no other user reads it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_record(record: ServerRecord) -> Path:
    """Write `record` atomically and privately (see `_write_json`)."""
    return _write_json(private_registry_dir() / f"{record.pid}.json", record.to_dict())


def remove_record(pid: int) -> None:
    """Delete the record of server `pid` and its keep-alive state, if there are any."""
    (registry_dir() / f"{pid}.json").unlink(missing_ok=True)
    (registry_dir() / f"{pid}.kept.json").unlink(missing_ok=True)


# -- keep-alive state: `<pid>.kept.json` beside a kept server's record ---------------------------


def kept_path(pid: int) -> Path:
    return registry_dir() / f"{pid}.kept.json"


def write_kept(pid: int, state: dict[str, Any]) -> Path:
    """Write a kept server's state (see `server._keep_alive.KeptState`), atomically and privately."""
    return _write_json(private_registry_dir() / f"{pid}.kept.json", state)


def read_kept(pid: int) -> dict[str, Any] | None:
    """A kept server's state, or None if there is none, it does not parse, or another user owns it
    (only the user who kept a server may reattach to it)."""
    path = kept_path(pid)
    try:
        if path.stat().st_uid != os.getuid():
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_record(pid: int) -> ServerRecord | None:
    """The record of server `pid`, or None if there is none or it does not parse."""
    try:
        return ServerRecord.from_dict(json.loads((registry_dir() / f"{pid}.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_records() -> list[ServerRecord]:
    """Every readable record, oldest first. Unreadable or foreign files are skipped, not deleted:
    a record being written by another process is never half-visible (atomic rename), so a file that
    does not parse was not written by rlgen and is not ours to remove."""
    directory = registry_dir()
    if not directory.is_dir():
        return []
    records = []
    for path in directory.glob("*.json"):
        if path.name.endswith(".kept.json"):
            continue
        try:
            records.append(ServerRecord.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(records, key=lambda r: r.started_at)


def process_alive(pid: int, create_time: float) -> bool:
    """True if process `pid` exists, is not a zombie, and is the one created at `create_time`."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > _CREATE_TIME_TOLERANCE_S:
            return False  # the pid was reused by an unrelated process
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # it exists; we cannot look closer, so assume the worst (alive)


def record_status(record: ServerRecord) -> str:
    """One of "running", "orphaned", "gone", "other host" (see the module constants)."""
    if record.hostname and record.hostname != socket.gethostname():
        return OTHER_HOST
    if not process_alive(record.pid, record.create_time):
        return GONE
    if process_alive(record.owner_pid, record.owner_start_time):
        return RUNNING
    return ORPHANED


def list_servers() -> list[dict[str, Any]]:
    """All registered servers, each as its record (a dict) plus `status` and `age_s`.

    `status` is "running" (server and owner alive), "orphaned" (server alive, owner gone: `reap()`
    stops it), "gone" (the server exited: a stale record `reap()` deletes), or "other host".
    """
    now = time.time()
    out = []
    for record in read_records():
        entry = {**record.to_dict(), "status": record_status(record), "age_s": round(now - record.started_at, 1)}
        kept = read_kept(record.pid)
        if kept is not None:
            entry["kept"] = kept_summary(kept, now=now)
        out.append(entry)
    return out


def kept_summary(kept: dict[str, Any], *, now: float) -> dict[str, Any]:
    """What `list_servers` shows of a kept server: keep-alive, attached engine, idle time and time
    left (None while an engine is attached: the idle timer does not run then). No API key."""
    attached = [a for a in kept.get("attached") or [] if isinstance(a, list) and len(a) == 2]
    live = [int(pid) for pid, ctime in attached if process_alive(int(pid), float(ctime))]
    idle = None if live else max(0.0, now - float(kept.get("idle_since", now)))
    keep = float(kept.get("keep_alive_s", 0))
    return {
        "keep_alive_s": keep,
        "attached_pids": live,
        "idle_s": None if idle is None else round(idle, 1),
        "time_left_s": None if idle is None else round(max(0.0, keep - idle), 1),
        "model": kept.get("model"),
        "options": kept.get("options"),
        "user": kept.get("user"),
    }
