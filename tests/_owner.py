"""A stand-in "kernel" for the process tests: a Python process in its own session that launches a
server with rlgen, prints the server's pid/port/log as JSON, and closes it when its stdin closes.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys

OWNER_SCRIPT = r"""
import json, signal, sys
from rlgen.server._process import launch_server
signal.signal(signal.SIGINT, lambda *_: print("interrupted", flush=True))
cfg = json.loads(sys.argv[1])
server = launch_server(cfg["argv"], env=cfg["env"], startup_timeout=60, _pdeathsig=cfg["pdeathsig"])
print(json.dumps({"pid": server.pid, "port": server.port, "log_path": str(server.log_path)}), flush=True)
sys.stdin.read()
server.close()
print("closed", flush=True)
"""


def spawn_owner(argv: list[str], *, env: dict[str, str] | None = None, pdeathsig: bool = True) -> subprocess.Popen[str]:
    """Start the owner; read its server's info with `read_line`."""
    cfg = {"argv": argv, "env": env or {}, "pdeathsig": pdeathsig}
    return subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        raise AssertionError("the owner process printed nothing in time")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the owner process exited with {proc.wait()} before printing")
    return line
