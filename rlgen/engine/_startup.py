"""The construction helpers of `Engine`: checks and loads that run before or while a server starts.

Owns: checking `replicas=` / `gpus=` / `router_args=`, loading the tokenizer in a background thread, stopping
servers of dead kernels before a start, whether a host is loopback, durations as text, and closing
a client at garbage collection.
Knows nothing about the Engine object itself.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..client._http import Client
from ..core import _loop
from ..core._errors import EngineError
from ..server import _replicas

__all__ = ["check_replicas", "close_client", "duration", "in_background", "is_loopback", "load_tokenizer",
           "reap_leftovers", "timed_load_tokenizer"]


def check_replicas(replicas: int, gpus: Sequence[int] | None, *, keep_alive: object, tp_size: int,
                    dp_size: int, router_args: Any = None) -> list[dict[str, str]]:
    """Check `replicas=` / `gpus=` / `router_args=` before anything starts; the per-worker env overrides (gpus)."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an int >= 1, got {replicas!r}")
    if gpus is not None and (isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence) or not gpus
                             or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)):
        raise ValueError(f"gpus must be a non-empty list of GPU indices, e.g. [0, 1], got {gpus!r}")
    if replicas == 1:
        if router_args is not None:
            raise ValueError("router_args= configures the router of replicas > 1; one server has no router")
        if gpus is not None:
            raise ValueError("gpus= places replicas (replicas > 1); for one server set CUDA_VISIBLE_DEVICES in env=")
        return []
    if keep_alive is not None:
        raise ValueError("replicas > 1 cannot be combined with keep_alive yet: pass one of them")
    if gpus is not None and tp_size * dp_size != 1:
        raise ValueError("gpus= gives each replica one GPU, so tp_size and dp_size must be 1")
    _replicas.check_router_args(router_args)
    _replicas.check_router_installed()
    return [{"CUDA_VISIBLE_DEVICES": str(gpus[i % len(gpus)])} if gpus is not None else {} for i in range(replicas)]


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach a server bound to `host` (a name is looked up)."""
    import ipaddress
    import socket

    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback
                   for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP))
    except (OSError, ValueError):
        return False


def reap_leftovers() -> None:
    from ..server._process import reap

    stopped = [r for r in reap() if r.get("action") == "stopped"]
    if stopped:
        pids = ", ".join(str(r["pid"]) for r in stopped)
        warnings.warn(f"rlgen stopped {len(stopped)} server(s) whose kernel had died (pid {pids})", stacklevel=3)


def in_background(fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
    """Run `fn(*args)` in a daemon thread; the future holds its result or its exception."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as err:
            future.set_exception(err)

    threading.Thread(target=run, name="rlgen-tokenizer", daemon=True).start()
    return future


def timed_load_tokenizer(tokenizer: Any, times: dict[str, float]) -> Any:
    t0 = time.monotonic()
    try:
        return load_tokenizer(tokenizer)
    finally:
        times["tokenizer_s"] = time.monotonic() - t0


def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object as given (used as is), or the one of a path: what `AutoTokenizer` gives,
    through `client._tokenizer`'s lighter path when it knows that path gives the same object (a
    kernel that reattaches to a kept server then imports neither torch nor transformers' model stack)."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    from ..client._tokenizer import load_tokenizer as load

    try:
        return load(tokenizer)
    except (OSError, ValueError) as err:
        raise EngineError(f"cannot load the tokenizer from {str(tokenizer)!r} ({err}); pass tokenizer= a local path") from err


def close_client(client: Client) -> None:
    with contextlib.suppress(Exception):
        _loop.run_sync(client.aclose(), timeout=5)
