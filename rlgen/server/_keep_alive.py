"""Kept servers: a server that outlives its kernel, stopped by an idle watchdog, reattached by the
next Engine with the same options.

Owns: the keep-alive policy. `options_key` (what must match to reuse a server), `find` (a kept,
live server of this user with that key, or why none can be reused), `keep` (after a launch: a
per-server API key is already required by the server; this starts the watchdog, hands the registry
record's ownership to it and records the attached engine), `attach` / `detach` (an Engine begins or
ends using it), `stop`, and the watchdog itself (`python -m rlgen.server._keep_alive <pid>`).

The watchdog is a small process in its own session, not a child of the kernel. Every
`POLL_S` it reads the kept state: while the process of any attached engine lives the server is in
use (several kernels may share one); once none is (closed, or kernels died) the idle clock runs from
that moment, and after
`keep_alive_s` the watchdog stops the server's process group, deletes the records and exits. It
also exits when the server dies or its state file disappears (someone stopped it). Because the
registry record names the watchdog as the server's owner, `reap()` leaves a kept server alone while
its watchdog lives and stops it if the watchdog dies.

Safety: state files are mode 0600 in a 0700 directory and are read only if this user owns them;
each kept server requires its own API key (from the state file) on every route but health.

Knows nothing about generation, tokenizers or results; the Engine decides when to keep and attach.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _process_tree, _registry
from ._command import redacted

__all__ = ["Kept", "attach", "detach", "find", "keep", "new_api_key", "options_key", "parse_duration", "stop"]

POLL_S = 0.5  # how often the watchdog looks; an expired server stops within this of its time


def parse_duration(value: str | float | int) -> float:
    """Seconds from 90, 90.0, "90s", "15m", "1h" or "1h30m"; ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"keep_alive must be seconds or a duration like '15m', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (parts := re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", value)) and value.strip():
        h, m, sec = (float(p) if p else 0.0 for p in parts.groups())
        seconds = h * 3600 + m * 60 + sec
    else:
        raise ValueError(f"keep_alive must be seconds or a duration like '90s', '15m', '1h', got {value!r}")
    if not seconds > 0:
        raise ValueError(f"keep_alive must be positive, got {value!r}")
    return seconds


def new_api_key() -> str:
    """48 hex digits: never starts with "-" (which a command line would read as a flag)."""
    return secrets.token_hex(24)


def options_key(argv: Sequence[str], host: str, port: int | None, env: dict[str, str] | None) -> str:
    """What must match for a kept server to be reused: the server command (API key left out), the
    address, and the server's environment overrides."""
    data = {"argv": _without_api_key(argv), "host": host, "port": port, "env": sorted((env or {}).items())}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _without_api_key(argv: Sequence[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--api-key":
            skip = True
            continue
        if not arg.startswith("--api-key="):
            out.append(arg)
    return out


@dataclass(frozen=True)
class Kept:
    """A kept server found in the registry: where it is, its key, and how long it has been idle."""

    record: _registry.ServerRecord
    state: dict[str, Any]

    @property
    def pid(self) -> int:
        return self.record.pid

    @property
    def url(self) -> str:
        return str(self.state["url"])

    @property
    def api_key(self) -> str:
        return str(self.state["api_key"])

    def idle_s(self, now: float | None = None) -> float:
        summary = _registry.kept_summary(self.state, now=time.time() if now is None else now)
        return float(summary["idle_s"] or 0.0)


def find(key: str, model_path: str, argv: Sequence[str]) -> tuple[Kept | None, list[str]]:
    """A live kept server of this user whose options key is `key`, and for each other kept server
    of the same model a sentence saying why it is not reused (`argv`: the command asked for, to
    name the options that differ)."""
    reasons: list[str] = []
    for record in _registry.read_records():
        state = _registry.read_kept(record.pid)
        if state is None or state.get("model_path") != model_path:
            continue
        status = _registry.record_status(record)
        if status == _registry.GONE:
            reasons.append(f"kept server pid {record.pid} had died: replaced")
            _registry.remove_record(record.pid)
            continue
        if status != _registry.RUNNING:  # its watchdog died: reap() stops it
            reasons.append(f"kept server pid {record.pid} lost its idle watchdog: not reused")
            continue
        if state.get("key") != key:
            reasons.append(f"kept server pid {record.pid} not reused: {_difference(state, argv)}")
            continue
        return Kept(record, state), reasons
    return None, reasons


def _difference(state: dict[str, Any], argv: Sequence[str]) -> str:
    theirs, ours = list(state.get("options") or []), _options_shown(argv)
    added = [a for a in ours if a not in theirs]
    removed = [a for a in theirs if a not in ours]
    parts = [f"this call adds {' '.join(added)}" if added else "", f"it has {' '.join(removed)}" if removed else ""]
    return "; ".join(p for p in parts if p) or "its address or environment differs"


def _options_shown(argv: Sequence[str]) -> list[str]:
    """The server flags a person compares: the command after the module name, without the key."""
    args = _without_api_key(argv)
    return args[3:] if len(args) > 3 and args[1] == "-m" else args


def keep(*, pid: int, key: str, url: str, api_key: str, keep_alive_s: float, model: str, model_path: str,
         backend: str, argv: Sequence[str], log_dir: Path) -> Kept:
    """Make the freshly launched (and released) server `pid` a kept one: write its state with this
    process attached, start its watchdog, and make the watchdog the registry record's owner."""
    record = _registry.read_record(pid)
    if record is None:
        raise RuntimeError(f"server pid {pid} has no registry record to keep")
    me = _registry.owner_identity()
    state: dict[str, Any] = {
        "key": key, "url": url, "api_key": api_key, "keep_alive_s": keep_alive_s, "model": model,
        "model_path": model_path, "backend": backend, "options": _options_shown(redacted(argv)),
        "user": getpass.getuser(), "attached": [list(me)], "idle_since": time.time(), "watchdog": None,
    }
    _registry.write_kept(pid, state)
    log = open(log_dir / "watchdog.log", "ab")  # noqa: SIM115 - the child keeps the descriptor
    try:
        proc = subprocess.Popen([sys.executable, "-m", "rlgen.server._keep_alive", str(pid)], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    finally:
        log.close()
    import psutil

    watchdog = (proc.pid, psutil.Process(proc.pid).create_time())
    state["watchdog"] = list(watchdog)
    _registry.write_kept(pid, state)
    owned = _registry.ServerRecord.from_dict({**record.to_dict(), "owner_pid": watchdog[0],
                                             "owner_start_time": watchdog[1]})
    _registry.write_record(owned)
    return Kept(owned, state)


def attach(kept: Kept, *, keep_alive_s: float | None = None) -> Kept:
    """This process now uses `kept`: its idle clock stops until `detach` (or this process dies).
    `keep_alive_s`: the attaching Engine's keep-alive, which from now on is the server's."""
    state = _registry.read_kept(kept.pid) or kept.state
    me = list(_registry.owner_identity())
    state = {**state, "attached": [*(a for a in _attached(state) if a != me), me]}
    if keep_alive_s is not None:
        state["keep_alive_s"] = keep_alive_s
    _registry.write_kept(kept.pid, state)
    return Kept(kept.record, state)


def detach(kept: Kept) -> None:
    """This process stops using `kept`: its idle clock starts now (if the server is still kept)."""
    state = _registry.read_kept(kept.pid)
    if state is None:
        return
    others = [a for a in _attached(state) if a[0] != os.getpid()]
    _registry.write_kept(kept.pid, {**state, "attached": others, **({} if others else {"idle_since": time.time()})})


def _attached(state: dict[str, Any]) -> list[list[Any]]:
    """The [pid, create_time] of every engine attached to a kept server."""
    value = state.get("attached") or []
    return [list(a) for a in value if isinstance(a, list) and len(a) == 2]


def stop(kept: Kept, *, grace: float = 5.0) -> tuple[int, ...]:
    """Stop a kept server now, and its watchdog; returns pids still alive afterwards."""
    return _process_tree.stop_recorded(kept.record, grace=grace)


# ----------------------------------------------------------------------------------------------
# the watchdog process


def watch(pid: int) -> int:
    """Run the idle watchdog of kept server `pid` until it stops it, the server dies, or its state
    file disappears. Returns the exit status."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    record = _registry.read_record(pid)
    if record is None:
        print(f"watchdog: no record for server {pid}", flush=True)
        return 1
    last_in_use = time.time()
    while True:
        state = _registry.read_kept(pid)
        if state is None:
            print(f"watchdog: server {pid} is no longer kept; exiting", flush=True)
            return 0
        if not _registry.process_alive(record.pid, record.create_time):
            print(f"watchdog: server {pid} died; removing its records", flush=True)
            _registry.remove_record(pid)
            return 0
        now = time.time()
        attached = _attached(state)
        if any(_registry.process_alive(int(engine), float(ctime)) for engine, ctime in attached):
            last_in_use = now
        else:
            idle_since = max(float(state.get("idle_since", now)), last_in_use if attached else 0.0)
            if now - idle_since >= float(state["keep_alive_s"]):
                print(f"watchdog: server {pid} idle for {now - idle_since:.0f} s; stopping it", flush=True)
                _process_tree.stop_recorded(record)
                return 0
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1])))
