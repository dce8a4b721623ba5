"""The server an Engine talks to, whatever its kind, behind one face: `ServerHandle`.

Owns: the protocol (`url`, `argv` redacted, `log_path`, `pids`, `alive`, `assert_alive`,
`close(stop=)`, `wait_gpu_memory_released`, `describe`, `details`) and its four kinds: `OwnedServer` (one
process this Python process launched and stops), `KeptServer` (a kept server this process is
attached to: close detaches, `stop=True` stops it), `Fleet` (`replicas=N`: the sglang-router and
its workers, owned together; the router is the one way in) and `AttachedServer` (a server this
process did not start: `Engine.connect`; it owns nothing and stops nothing). Knows nothing about
HTTP, tokenizers or results: what each kind is and how it ends live in `_process`, `_keep_alive`
and `_replicas`.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from . import _keep_alive, _registry
from ._command import redacted
from ._process import ServerProcess
from ._replicas import Replicas

__all__ = ["AttachedServer", "Fleet", "KeptServer", "OwnedServer", "ServerHandle"]


class ServerHandle(Protocol):
    """What an Engine asks of its server, whichever kind it is."""

    @property
    def url(self) -> str:
        """The base URL requests go to."""
        ...

    @property
    def argv(self) -> list[str] | None:
        """The command line, API key redacted; None for a server this process did not start."""
        ...

    @property
    def log_path(self) -> str | None:
        """The server's log file; None where this process does not know it."""
        ...

    def pids(self) -> list[int] | None:
        """The live processes of the server on this machine; None where this process cannot see them."""
        ...

    def alive(self) -> bool:
        """False once the server is seen dead (a kind this process does not watch is always alive)."""
        ...

    def assert_alive(self) -> None:
        """Raise ServerDiedError (exit code, log tail) when the server is seen dead; else nothing."""
        ...

    def close(self, *, stop: bool = False) -> None:
        """End this process's use of the server: an owned one is stopped, a kept one detached (or
        stopped, `stop=True`), an attached one left as it is. Idempotent."""
        ...

    def wait_gpu_memory_released(self, timeout: float = 30.0) -> bool | None:
        """After `close`: True once no process of the server holds GPU memory, False after `timeout`,
        None where it cannot be told (no GPU, processes hidden, a server this process did not stop)."""
        ...

    def describe(self) -> dict[str, Any]:
        """`kind` ("owned", "kept", "fleet", "attached"), `pid` and `port` (None where unknown), read
        without I/O (for a repr)."""
        ...

    def details(self) -> dict[str, Any]:
        """The kind's own details for `Engine.info`: `kept` (a kept server's registry summary),
        `fleet` (the router's and each worker's pid, URL, log path, liveness); else empty."""
        ...


class OwnedServer:
    """One server process this process launched and owns (`launch_server`)."""

    def __init__(self, process: ServerProcess) -> None:
        self.process = process

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def argv(self) -> list[str] | None:
        return redacted(self.process.argv)

    @property
    def log_path(self) -> str | None:
        return str(self.process.log_path)

    def pids(self) -> list[int] | None:
        return self.process.pids()

    def alive(self) -> bool:
        return self.process.alive()

    def assert_alive(self) -> None:
        self.process.assert_alive()

    def close(self, *, stop: bool = False) -> None:
        self.process.close()

    def wait_gpu_memory_released(self, timeout: float = 30.0) -> bool | None:
        return self.process.wait_gpu_memory_released(timeout=timeout)

    def describe(self) -> dict[str, Any]:
        return {"kind": "owned", "pid": self.process.pid, "port": self.process.port}

    def details(self) -> dict[str, Any]:
        return {}


class KeptServer:
    """A kept server (`keep_alive=`) this process is attached to; others may share it."""

    def __init__(self, kept: _keep_alive.Kept) -> None:
        self.kept = kept

    @property
    def url(self) -> str:
        return self.kept.url

    @property
    def argv(self) -> list[str] | None:
        return list(self.kept.record.argv)

    @property
    def log_path(self) -> str | None:
        return self.kept.record.log_path

    def pids(self) -> list[int] | None:
        """The server's process and its descendants (the ones that hold GPU memory)."""
        import psutil

        try:
            root = psutil.Process(self.kept.pid)
            return [root.pid, *(child.pid for child in root.children(recursive=True))]
        except psutil.Error:
            return []

    def alive(self) -> bool:
        return True  # its watchdog watches it; a request to a dead one fails with a RequestError

    def assert_alive(self) -> None:
        return None

    def close(self, *, stop: bool = False) -> None:
        if stop:
            _keep_alive.stop(self.kept)
        else:
            _keep_alive.detach(self.kept)

    def wait_gpu_memory_released(self, timeout: float = 30.0) -> bool | None:
        return None  # shared, or stopped by its recorded owner: not this process's to wait for

    def describe(self) -> dict[str, Any]:
        return {"kind": "kept", "pid": self.kept.pid, "port": self.kept.record.port}

    def details(self) -> dict[str, Any]:
        state = _registry.read_kept(self.kept.pid)
        return {"kept": None if state is None else _registry.kept_summary(state, now=time.time())}


class Fleet:
    """`replicas=N`: an sglang-router and its workers, owned together; requests go to the router."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas

    @property
    def url(self) -> str:
        return self.replicas.router.url

    @property
    def argv(self) -> list[str] | None:
        return redacted(self.replicas.router.argv)

    @property
    def log_path(self) -> str | None:
        return str(self.replicas.router.log_path)

    def pids(self) -> list[int] | None:
        return self.replicas.pids()

    def alive(self) -> bool:
        return self.replicas.router.alive()

    def assert_alive(self) -> None:
        self.replicas.router.assert_alive()

    def close(self, *, stop: bool = False) -> None:
        self.replicas.close()  # the router first, then the workers

    def wait_gpu_memory_released(self, timeout: float = 30.0) -> bool | None:
        return self.replicas.wait_gpu_memory_released(timeout=timeout)

    def describe(self) -> dict[str, Any]:
        router = self.replicas.router
        return {"kind": "fleet", "pid": router.pid, "port": router.port}

    def details(self) -> dict[str, Any]:
        return {"fleet": self.replicas.describe()}


class AttachedServer:
    """A server this process did not start (`Engine.connect`): known by its URL only."""

    def __init__(self, url: str) -> None:
        self._url = url

    @property
    def url(self) -> str:
        return self._url

    @property
    def argv(self) -> list[str] | None:
        return None

    @property
    def log_path(self) -> str | None:
        return None

    def pids(self) -> list[int] | None:
        return None

    def alive(self) -> bool:
        return True

    def assert_alive(self) -> None:
        return None

    def close(self, *, stop: bool = False) -> None:
        return None

    def wait_gpu_memory_released(self, timeout: float = 30.0) -> bool | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": "attached", "pid": None, "port": None}

    def details(self) -> dict[str, Any]:
        return {}
