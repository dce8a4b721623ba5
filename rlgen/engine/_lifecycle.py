"""An Engine's construction and lifecycle: which server to start, starting or attaching to it,
connecting, and what `info` says.

Owns: `EngineState`; `LaunchPlan` (the model, backend and server command an `Engine(...)` asks
for, checked before anything starts: `plan_launch`); `start_or_attach` (reattach to a kept server
with these options, or launch one server, a kept one, or a fleet behind an sglang-router: one
`ServerHandle` and what the start-up line says); `open_connection` (the client, the server's info,
the tokenizer: a `Connection`); and `engine_info` / `router_info` (what `Engine.info` reports).
Knows nothing about generation, scoring, weights or adapters, and nothing about processes beyond
`rlgen.server`'s launch functions and handles.
"""

from __future__ import annotations

import concurrent.futures
import enum
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..client import _router
from ..client._http import Client
from ..core import _loop, _options
from ..core._errors import RequestError
from ..server import _info as _server_info
from ..server import _keep_alive, _replicas
from ..server._command import choose_backend, memory_fraction, server_argv
from ..server._handle import Fleet, KeptServer, OwnedServer, ServerHandle
from ..server._models import resolve_model
from ..server._process_tree import gpu_total_mib
from . import _startup
from ._connection import Connection
from ._startup import close_client, duration, is_loopback

__all__ = ["EngineState", "LaunchPlan", "Started", "engine_info", "open_connection", "plan_launch", "router_info",
           "start_or_attach"]


class EngineState(enum.Enum):
    READY = "ready"        # generate() works
    FAILED = "failed"      # the server died; create a new Engine
    CLOSED = "closed"      # close() was called


@dataclass
class LaunchPlan:
    """What `Engine(...)` starts: the model, the backend and the server's command line (no API key yet)."""

    model: str
    model_path: str
    backend: str
    argv: list[str]
    keep_alive_s: float | None
    worker_env: list[dict[str, str]]   # replicas > 1: each worker's environment overrides; else empty


def plan_launch(model: str | os.PathLike[str] | None, *, backend: str, gpu_memory_fraction: float | None,
                fast_start: bool, enable_memory_saver: bool, enable_metrics: bool,
                server_args: Mapping[str, Any] | Sequence[str] | None, api_key: str | None,
                keep_alive: str | float | None, tp_size: int, dp_size: int, replicas: int,
                gpus: Sequence[int] | None, router_args: Mapping[str, Any] | None,
                lora: bool | Mapping[str, Any] | None) -> LaunchPlan:
    """Check `Engine(...)`'s options and choose what to start; raises before anything starts."""
    if api_key is not None and (not isinstance(api_key, str) or not api_key):
        raise ValueError("api_key must be a non-empty string or None")
    worker_env = _startup.check_replicas(replicas, gpus, keep_alive=keep_alive, tp_size=tp_size, dp_size=dp_size,
                                         router_args=router_args)
    keep_s = None if keep_alive is None else _keep_alive.parse_duration(keep_alive)
    if gpu_memory_fraction is not None and (isinstance(gpu_memory_fraction, bool)
                                            or not isinstance(gpu_memory_fraction, (int, float))
                                            or not 0 < gpu_memory_fraction <= 1):
        raise ValueError(f"gpu_memory_fraction must be in (0, 1] or None (rlgen's default), got {gpu_memory_fraction!r}")
    resolved = resolve_model(model)
    chosen = choose_backend(backend)
    if gpu_memory_fraction is None:
        gpu_total = gpu_total_mib() if chosen == "sglang" else None
        gpu_memory_fraction = memory_fraction(resolved.path, gpu_total_mib=gpu_total, tp_size=tp_size)
    argv = server_argv(chosen, resolved.path, gpu_memory_fraction=gpu_memory_fraction, fast_start=fast_start,
                       enable_memory_saver=enable_memory_saver, enable_metrics=enable_metrics,
                       server_args=server_args, tp_size=tp_size, dp_size=dp_size, lora=_options.lora_options(lora))
    return LaunchPlan(model=resolved.name, model_path=resolved.path, backend=chosen, argv=argv, keep_alive_s=keep_s,
                      worker_env=worker_env)


@dataclass
class Started:
    """A server started or attached to: its handle, the API key it requires, and the start-up line's words."""

    server: ServerHandle
    api_key: str | None
    reattached: bool                  # a kept server found and attached to, not launched
    server_s: float                   # launch until healthy, or finding and attaching a kept server
    line_open: bool = False           # the start-up line waits for the connection (a reattach)
    message: str = ""                 # then its closing words once connected,
    failure: str = ""                 # and if connecting fails


def start_or_attach(plan: LaunchPlan, *, line: Any, api_key: str | None, host: str, port: int | None,
                    env: Mapping[str, str] | None, log_dir: str | os.PathLike[str] | None, startup_timeout: float,
                    replicas: int, router_args: Mapping[str, Any] | None, t0: float) -> Started:
    """Reattach to a kept server with these very options, or launch (one server, a kept one, or
    `replicas` behind a router). A launch closes `line`; a reattach leaves it for the connection.
    On a failed launch `line` is closed as failed and nothing is left running."""
    notes: list[str] = []
    key = ""
    if plan.keep_alive_s is not None:
        key = _keep_alive.options_key(plan.argv, host, port, dict(env or {}))
        kept, notes = _keep_alive.find(key, plan.model_path, plan.argv)
        if kept is not None:
            idle = kept.idle_s()
            attached = _keep_alive.attach(kept, keep_alive_s=plan.keep_alive_s)
            return Started(KeptServer(attached), kept.api_key, reattached=True, server_s=time.monotonic() - t0,
                           line_open=True,
                           message="; ".join([f"reattached to pid {kept.pid} (idle {duration(idle)})", *notes]),
                           failure=f"could not reattach to kept server pid {kept.pid}")
        api_key = api_key or _keep_alive.new_api_key()  # each kept server requires its own key
    if api_key is None and not is_loopback(host):
        # A server others can reach must not serve anyone who asks: generate a key (SGLang's
        # --api-key; /health* stays open), send it, and let the user read it to share it.
        api_key = _keep_alive.new_api_key()
        notes.append(f"listening on {host}: requests need the API key in eng.api_key")
    argv = list(plan.argv)
    if api_key is not None:
        # One argument, so a key that starts with "-" is not read as a flag; kept out of logs
        # and registry records (`redacted`).
        argv.append(f"--api-key={api_key}")
    t_server = time.monotonic()
    try:
        if replicas > 1:
            fleet = _replicas.launch_replicas(
                argv, replicas, concurrent_start=plan.backend == "cpu", host=host, port=port, env=env,
                worker_env=plan.worker_env, log_dir=log_dir, startup_timeout=startup_timeout, api_key=api_key,
                router_args=router_args, on_phase=line.update)
            server: ServerHandle = Fleet(fleet)
            ready = f"ready: {replicas} servers behind an sglang-router"
        else:
            server, ready = _launch_one(plan, argv, key=key, api_key=api_key, host=host, port=port, env=env,
                                        log_dir=log_dir, startup_timeout=startup_timeout, line=line, notes=notes)
    except BaseException:
        line.close(ok=False)
        raise
    line.close(ok=True, message="; ".join([ready, *notes]))
    return Started(server, api_key, reattached=False, server_s=time.monotonic() - t_server)


def _launch_one(plan: LaunchPlan, argv: list[str], *, key: str, api_key: str | None, host: str, port: int | None,
                env: Mapping[str, str] | None, log_dir: str | os.PathLike[str] | None, startup_timeout: float,
                line: Any, notes: list[str]) -> tuple[ServerHandle, str]:
    """One server: owned by this process, or (`keep_alive`) handed to its idle watchdog and kept."""
    from ..server._process import launch_server

    keep_s = plan.keep_alive_s
    process = launch_server(argv, host=host, port=port, env=env, log_dir=log_dir, startup_timeout=startup_timeout,
                            on_phase=line.update, _pdeathsig=keep_s is None)  # a kept server outlives this process
    if keep_s is None or api_key is None:
        return OwnedServer(process), "ready"
    process.release()  # its watchdog stops it now, not this process
    kept = _keep_alive.keep(pid=int(process.pid or 0), key=key, url=process.url, api_key=api_key,
                            keep_alive_s=keep_s, model=plan.model, model_path=plan.model_path,
                            backend=plan.backend, argv=argv, log_dir=process.log_path.parent)
    notes.insert(0, f"kept {duration(keep_s)} after its last use")
    return KeptServer(kept), "ready"


def open_connection(url: str, *, behind_router: bool, request_timeout: float | None, api_key: str | None,
                    on_connection_error: Callable[[], None], check_ready: Callable[[], None], tokenizer: Any,
                    model_path: str, progress: bool | None, model_info: Mapping[str, Any] | None = None,
                    workers_alive: Callable[[], dict[str, bool]] | None = None) -> tuple[Connection, str | None]:
    """The client, the server's info and the tokenizer (an object, a path, or the future of the one
    loading in a thread: the server is asked first, so that the first request's imports, aiohttp's,
    overlap the tokenizer's load instead of following it); and the served weight version.
    `model_info`: the server's model info when the caller already asked for it. `workers_alive`:
    behind a router whose workers this process owns, which of them run (so that what a dead one
    dropped may be sent again)."""
    client_type = _router.RouterClient if behind_router else Client
    client = client_type(url, request_timeout=request_timeout, on_connection_error=on_connection_error,
                         api_key=api_key)
    try:
        server_info = _loop.run_sync(client.get_info("server", timeout=60))
        if model_info is None:
            model_info = _loop.run_sync(client.get_info("model", timeout=60))
        if isinstance(tokenizer, concurrent.futures.Future):
            tokenizer = tokenizer.result()
        tokenizer = _startup.load_tokenizer(tokenizer)
    except BaseException:
        close_client(client)  # its session is open now: no "unclosed session" at exit
        raise
    context_length = _server_info.context_length(server_info, tokenizer, model_path)
    if isinstance(client, _router.RouterClient) and workers_alive is not None:
        client.workers_alive = workers_alive
        client.resend_limit = _router.OWNED_RESEND_LIMIT
    conn = Connection(client=client, server_info=server_info, tokenizer=tokenizer, context_length=context_length,
                      progress=progress, check_ready=check_ready, behind_router=behind_router)
    return conn, model_info.get("weight_version")


def probe(url: str, *, api_key: str | None) -> tuple[dict[str, Any], bool]:
    """An attached server's model info, and whether it is an sglang-router (one short-lived client)."""
    client = Client(url, api_key=api_key)
    try:
        info = _loop.run_sync(client.get_info("model", timeout=30))
        behind_router = _loop.run_sync(_router.is_router(client))
    finally:
        _loop.run_sync(client.aclose())
    return dict(info), behind_router


def engine_info(*, server: ServerHandle, conn: Connection, url: str, ready: bool) -> dict[str, Any]:
    """Where the server is, its command line, its versions and the GPU memory it holds (`Engine.info`
    adds the Engine's own fields)."""
    from .._version import __version__
    from ..server._process_tree import gpu_memory_per_gpu

    where = server.describe()
    details = server.details()
    pids = server.pids()
    per_gpu = gpu_memory_per_gpu(pids) if pids is not None else None  # one reading of the driver for both
    info: dict[str, Any] = {
        "pid": where["pid"],
        "port": where["port"],
        "log_path": server.log_path,
        "command": server.argv,
        "context_length": conn.context_length,
        "server_version": conn.server_info.get("version"),
        "rlgen_version": __version__,
        "gpu_memory_mib": sum(per_gpu.values()) if per_gpu else None,
        "gpu_memory_per_gpu": per_gpu,
        "memory_usage": _server_info.memory_usage(conn.server_info),
        "router": router_info(conn, url=url, owned=details.get("fleet")) if ready else None,
    }
    if "kept" in details:
        info["kept"] = details["kept"]
    return info


def router_info(conn: Connection, *, url: str, owned: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Behind a router: its workers as it lists them now (or as last seen, if it does not answer);
    `owned` (a fleet's `describe`): the pid and log path of the router and of each worker."""
    client = conn.client
    if not conn.behind_router or not isinstance(client, _router.RouterClient):
        return None
    info: dict[str, Any] = {"url": url}
    try:
        _loop.run_sync(client.list_workers(timeout=5))
    except RequestError as err:
        info["error"] = str(err)
    info["workers"] = [w.as_dict() for w in client.workers]
    if owned is not None:  # ours: add pid and log path of the router and each worker
        info.update(owned["router"])
        by_url = {w["url"]: w for w in owned["workers"]}
        for w in info["workers"]:
            w["router_healthy"] = w["healthy"]  # the router's flag: stale until its next health check
            w.update(by_url.get(w["url"], {}))
        info["workers"] += [{**w, "healthy": None, "router_healthy": None}
                            for url, w in by_url.items() if url not in {x["url"] for x in info["workers"]}]
        for w in info["workers"]:  # what rlgen sees: a dead process is unhealthy, whatever the router says
            alive = w.pop("alive", None)
            if alive is False:
                w["healthy"] = False
    return info
