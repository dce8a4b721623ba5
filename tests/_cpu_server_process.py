"""A `python -m rlgen.cpu_server` process for the CPU backend's own tests: started in its own
session with its output collected, and JSON POSTs to it. A module of its own (not a test module),
so that test modules share it without importing each other."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["READY_LINE", "Server", "free_port", "generated", "post", "running_server"]

REPO = Path(__file__).resolve().parents[1]
READY_LINE = "The server is fired up and ready to roll!"


# Test servers' ports are drawn from here, below the kernel's ephemeral range (Linux: 32768-60999).
_PORTS_FROM = 20000


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 49152, 65535  # IANA's range, macOS's default


def free_port() -> int:
    """A loopback port that nothing holds right now, for a server the test starts on it.

    Not a port from bind(("127.0.0.1", 0)): the kernel gives those from its ephemeral range, which
    every process on the machine draws from between picking a port and binding it (the other xdist
    worker's servers, Jupyter kernels, other jobs' tests; outgoing connections too, when the range
    runs short), and a full run saw a router exit with "Address already in use" on a port picked
    that way. Below the range only a process that binds that very port takes it."""
    lo, _ = _ephemeral_range()
    rng = random.SystemRandom()  # not seeded alike in two workers started at the same instant
    for _ in range(100 if lo > _PORTS_FROM + 1000 else 0):
        port = rng.randrange(_PORTS_FROM, lo)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A `python -m rlgen.cpu_server` process in its own session, with its output collected."""

    def __init__(self, model_path: str, port: int, faults: str = "", extra_env: dict[str, str] | None = None,
                 args: Sequence[str] = ()) -> None:  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO), "RLGEN_CPU_FAULT": faults, **(extra_env or {})}
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlgen.cpu_server", "--model-path", model_path, "--port", str(port), *args],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []

    def wait_for(self, needle: str, timeout: float = 60) -> bool:
        """Read output until a line contains `needle` (True) or the process exits (False)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                return False
            self.lines.append(line)
            if needle in line:
                return True
        raise TimeoutError(f"no {needle!r} in {timeout}s; output so far:\n{''.join(self.lines)}")

    def rest_of_output(self) -> str:
        assert self.proc.stdout is not None
        self.lines.append(self.proc.stdout.read())
        return "".join(self.lines)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


@contextlib.contextmanager
def running_server(model_path: str, args: Sequence[str] = ()) -> Iterator[Server]:
    """A server on a free port, ready (its ready line printed); killed on exit. `args`: more flags."""
    srv = Server(model_path, free_port(), args=args)
    try:
        assert srv.wait_for(READY_LINE), srv.rest_of_output()
        yield srv
    finally:
        srv.kill()


def post(url: str, body: Any, timeout: float = 60) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    return status, json.loads(raw) if raw else None


def generated(server: Server, body: dict[str, Any]) -> Any:
    """The server's answer to a /generate with `body`, which must succeed (HTTP 200)."""
    status, answer = post(server.url + "/generate", body)
    assert status == 200, (status, answer)
    return answer


def stepped_engine(model_path: str, **options: Any) -> Any:
    """An rlgen Engine on the CPU backend whose decode steps take 20 ms each (long enough for a
    test to act while a request runs), with the server's metrics on: use it as a context manager."""
    import rlgen

    return rlgen.Engine(model_path, backend="cpu", progress=False, enable_metrics=True,
                        env={"RLGEN_CPU_STEP_DELAY": "0.02"}, **options)
