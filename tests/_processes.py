"""Finding the processes a test started: each test that spawns processes marks its environment
(`MARKER_VAR`, set by conftest's `isolated` fixture) and every child inherits it. A module of its
own, not conftest: `tests/conformance/conftest.py` shadows the name `conftest` in a full run."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

__all__ = ["MARKER_VAR", "REPO_ROOT", "cmdline", "marked_processes", "wait_for_no_marked_processes"]

REPO_ROOT = str(Path(__file__).resolve().parent.parent)
MARKER_VAR = "RLGEN_TEST_MARKER"


def marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARKER_VAR) == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_for_no_marked_processes(marker: str, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (found := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return "?"
