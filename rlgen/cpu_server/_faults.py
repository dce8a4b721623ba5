"""Fault injection for lifecycle tests, driven by environment variables.

Owns the contract with the launcher's tests (keep these names and behaviours exactly):

- `RLGEN_CPU_FAULT`: a comma-separated set of
  - `die_at_start`: after "Load weight begin", print a CUDA OOM line to stderr and exit 1
    (before binding the port).
  - `hang_at_start`: print "Load weight begin", then sleep forever without binding the port.
  - `die_mid_request`: on the first POST /generate, `os._exit(13)` without answering.
  - `ignore_sigterm`: ignore SIGTERM.
  - `spawn_grandchild`: at start, spawn `sleep 1000` in the same session and print
    `grandchild pid=N`.
- `RLGEN_CPU_STARTUP_DELAY`: seconds to sleep before binding the port.
- `RLGEN_CPU_STEP_DELAY`: seconds to sleep per decode step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

_KNOWN = {"die_at_start", "hang_at_start", "die_mid_request", "ignore_sigterm", "spawn_grandchild"}


def active() -> frozenset[str]:
    """The fault modes named in RLGEN_CPU_FAULT (unknown names are reported and ignored)."""
    names = {name.strip() for name in os.environ.get("RLGEN_CPU_FAULT", "").split(",") if name.strip()}
    for name in sorted(names - _KNOWN):
        print(f"WARNING: unknown RLGEN_CPU_FAULT mode ignored: {name}", flush=True)
    return frozenset(names & _KNOWN)


def on_process_start() -> None:
    """Faults that act as soon as the process starts, before anything is loaded."""
    faults = active()
    if "ignore_sigterm" in faults:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "spawn_grandchild" in faults:
        child = subprocess.Popen(["sleep", "1000"])
        print(f"grandchild pid={child.pid}", flush=True)


def on_load_begin() -> None:
    """Faults that act right after "Load weight begin" was printed."""
    faults = active()
    if "die_at_start" in faults:
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", file=sys.stderr, flush=True)
        sys.exit(1)
    if "hang_at_start" in faults:
        while True:
            time.sleep(3600)


def sleep_before_bind() -> None:
    delay = _float_env("RLGEN_CPU_STARTUP_DELAY")
    if delay > 0:
        time.sleep(delay)


def step_delay() -> float:
    return _float_env("RLGEN_CPU_STEP_DELAY")


class MidRequestDeath:
    """`die_mid_request`: the first POST /generate kills the process without an answer."""

    def __init__(self) -> None:
        self.armed = "die_mid_request" in active()

    def maybe_die(self) -> None:
        if self.armed:
            sys.stdout.flush()
            os._exit(13)


def _float_env(name: str) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return 0.0
    try:
        return float(raw)
    except ValueError:
        print(f"WARNING: {name}={raw!r} is not a number; ignored", flush=True)
        return 0.0
