"""Several servers behind an sglang-router, launched and owned together: `Engine(model, replicas=N)`.

Owns: launching N servers ("workers") with one argv and then an `sglang-router` in front of them,
each through `launch_server` (so each has its own session, parent-death signal, registry record,
log file, readiness probe and close, and `reap()` finds leftovers of any of them); the start-up
error that names which process failed; and stopping them in order (router, then workers).

How:
- Workers bind loopback on free ports. On the CPU backend they start at once (threads); on
  SGLang one after another, since servers that share a GPU each measure free memory at start.
  Each worker's GC is frozen at its launch (`server/_process.py`); the router gets no
  `/freeze_gc` (not SGLang: it answers 404).
- The router: `python -m sglang_router.launch_router --worker-urls ... --policy round_robin
  --disable-circuit-breaker`, readiness `GET /health`, then `GET /workers` until it lists every
  worker healthy. Round robin, not the router's default cache_aware: cache_aware sends prompts
  that share a prefix (a chat template's system prompt) to one worker until it is 64 requests
  ahead, so a batch of rollouts would not spread; the n samples of one prompt go in one request
  anyway (one worker, one prefix cache). No circuit breaker: after a few 5xx (e.g. memory
  released) it would block a worker for 60 s. An API key goes to every worker (`--api-key`) and
  to the router (its `--api-key` is the key it sends to the workers, and the one it requires on
  /generate, /workers, /flush_cache; /health, /get_server_info and /v1/models stay open).
- The router's health checks and retries: `router_args` (its flags as a dict, over
  `ROUTER_DEFAULTS`: a health check every second that marks a worker down at its first failure,
  and 10 retries of a failed request, about 5 s with backoff), so that the requests of a worker
  that dies are retried on a live one before their tries run out (sglang-router's defaults: checks
  every 60 s, three failures, 5 retries).
- Only the router binds the Engine's `host`; the workers always bind loopback, so beyond this
  machine the router (with the key) is the one way in.

Knows nothing about /generate payloads, tokenizers or results.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..core._errors import EngineError, ServerStartupError
from . import _log as _server_log
from ._command import mapping_flags
from ._process import ServerProcess, free_port, launch_server
from ._process_tree import ShutdownReport, wait_gpu_memory_released

__all__ = ["ROUTER_DEFAULTS", "ROUTER_POLICY", "Replicas", "check_router_args", "check_router_installed",
           "launch_replicas", "router_flags"]

ROUTER_POLICY = "round_robin"
# rlgen's defaults for the router's health checks and retries (sglang-router 0.3.2 flag names,
# without "--"); `Engine(replicas=N, router_args={...})` overrides them, None drops one.
ROUTER_DEFAULTS: dict[str, Any] = {
    "health_check_interval_secs": 1,
    "health_failure_threshold": 1,
    "retry_max_retries": 10,
}
_WORKERS_LISTED_TIMEOUT_S = 60.0


def check_router_installed() -> None:
    """Raise EngineError if sglang-router cannot be imported (checked before anything starts)."""
    if importlib.util.find_spec("sglang_router") is None:
        raise EngineError("Engine(replicas=N) needs the sglang-router package for its router: pip install sglang-router")


def check_router_args(router_args: Mapping[str, Any] | None) -> None:
    """Refuse a router_args that is not a dict of flag name -> value (before anything starts)."""
    if router_args is None:
        return
    if not isinstance(router_args, Mapping) or not all(isinstance(k, str) and k for k in router_args):
        raise TypeError("router_args must be a dict of sglang-router flags, e.g. {'retry_max_retries': 20}, "
                        f"got {router_args!r}")
    for key in ("worker_urls", "policy", "host", "port", "api_key", "prometheus_port", "prometheus_host"):
        if key in {k.lstrip("-").replace("-", "_") for k in router_args}:
            raise ValueError(f"router_args: {key!r} is set by rlgen (use Engine's own option where there is one)")


def router_flags(router_args: Mapping[str, Any] | None) -> list[str]:
    """`ROUTER_DEFAULTS` with `router_args` over them, as router flags: {"retry_max_retries": 10} ->
    ["--retry-max-retries", "10"]; True -> a bare flag; False or None -> left out (drops a default)."""
    merged = {k.lstrip("-").replace("-", "_"): v for k, v in {**ROUTER_DEFAULTS, **(router_args or {})}.items()}
    return mapping_flags(merged)


@dataclass
class Replicas:
    """The processes of one `Engine(replicas=N)`: the router and its workers, all owned."""

    router: ServerProcess
    workers: list[ServerProcess]
    metrics_port: int | None = None  # the router's Prometheus /metrics (loopback)

    def close(self) -> ShutdownReport:
        """Stop the router (no new requests reach the workers), then the workers. Idempotent."""
        report = self.router.close()
        for worker in self.workers:
            worker.close()
        return report

    def pids(self) -> list[int]:
        return [*self.router.pids(), *(pid for w in self.workers for pid in w.pids())]

    def wait_gpu_memory_released(self, timeout: float = 30.0) -> bool | None:
        return wait_gpu_memory_released(self.pids_seen(), timeout=timeout)

    def pids_seen(self) -> list[int]:
        """Every pid any of the trees had (alive or not), for the GPU-memory check after close."""
        return [pid for s in (self.router, *self.workers) if (t := s._owned.tree) is not None for pid in t.known]

    def workers_alive(self) -> dict[str, bool]:
        """Worker URL -> whether its process runs (what rlgen sees, not the router's health flag)."""
        return {w.url: w.alive() for w in self.workers}

    def describe(self) -> dict[str, Any]:
        """pid, url and log path of the router and of each worker; each worker's `alive` and
        `exit_code` (None while it runs; negative: killed by that signal)."""
        return {
            "router": {"pid": self.router.pid, "url": self.router.url, "log_path": str(self.router.log_path),
                       "prometheus_port": self.metrics_port},
            "workers": [{"pid": w.pid, "url": w.url, "log_path": str(w.log_path), "alive": w.alive(),
                         "exit_code": w.exit_code} for w in self.workers],
        }


def launch_replicas(
    argv: Sequence[str],
    replicas: int,
    *,
    concurrent_start: bool,
    host: str = "127.0.0.1",
    port: int | None,
    env: Mapping[str, str | None] | None,
    worker_env: Sequence[Mapping[str, str]] = (),
    log_dir: str | os.PathLike[str] | None,
    startup_timeout: float,
    api_key: str | None,
    router_args: Mapping[str, Any] | None = None,
    on_phase: Callable[[str, float], None] | None = None,
) -> Replicas:
    """Start `replicas` workers with `argv` on loopback, then the router on `host`:`port`; return once the router lists
    every worker healthy. On any failure (or Ctrl-C) stop everything started, then raise a
    ServerStartupError that names the process that failed (its log tail attached)."""
    workers: list[ServerProcess] = []
    router: ServerProcess | None = None

    def start_worker(i: int) -> ServerProcess:
        env_i: dict[str, str | None] = {**(env or {}), **(worker_env[i] if i < len(worker_env) else {})}
        try:
            return launch_server(argv, env=env_i, log_dir=_sub_dir(log_dir, f"worker{i}"),
                                 startup_timeout=startup_timeout, on_phase=on_phase if i == 0 else None)
        except ServerStartupError as err:
            raise _named(err, f"replica worker {i} of {replicas}") from err

    try:
        if concurrent_start:
            with concurrent.futures.ThreadPoolExecutor(replicas, thread_name_prefix="rlgen-replica") as pool:
                futures = [pool.submit(start_worker, i) for i in range(replicas)]
                try:
                    concurrent.futures.wait(futures)
                finally:  # also on Ctrl-C: keep each started worker, to stop it below
                    for future in futures:
                        if future.done() and future.exception() is None:
                            workers.append(future.result())
                for future in futures:  # the first failing worker, by index
                    if future.exception() is not None:
                        future.result()
        else:
            for i in range(replicas):
                workers.append(start_worker(i))
        metrics_port = free_port("127.0.0.1")
        router_argv = [sys.executable, "-m", "sglang_router.launch_router",
                       "--worker-urls", *(w.url for w in workers),
                       "--policy", ROUTER_POLICY, "--disable-circuit-breaker",
                       "--worker-startup-check-interval", "1",
                       "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                       *router_flags(router_args)]
        if api_key is not None:
            router_argv.append(f"--api-key={api_key}")
        try:
            router = launch_server(router_argv, host=host, port=port, env=env, log_dir=_sub_dir(log_dir, "router"),
                                   startup_timeout=min(startup_timeout, 120.0), health_path="/health",
                                   freeze_gc=False)  # not SGLang: its workers are what gets frozen
        except ServerStartupError as err:
            raise _named(err, "the sglang-router") from err
        _wait_workers_listed(router, [w.url for w in workers], api_key=api_key)
        return Replicas(router=router, workers=workers, metrics_port=metrics_port)
    except BaseException:
        if router is not None:
            router.close()
        for worker in workers:
            worker.close()
        raise


def _sub_dir(log_dir: str | os.PathLike[str] | None, name: str) -> str | None:
    return None if log_dir is None else os.path.join(os.fspath(log_dir), name)


def _named(err: ServerStartupError, who: str) -> ServerStartupError:
    """`err` again, its message starting with which process failed."""
    first = str(err).split("\n", 1)[0]
    return type(err)(f"{who}: {first}", exit_code=err.exit_code, log_path=err.log_path, log_tail=err.log_tail,
                     hint=err.hint)


def _wait_workers_listed(router: ServerProcess, urls: list[str], *, api_key: str | None) -> None:
    """Poll the router's `GET /workers` until it lists every URL healthy; else a ServerStartupError."""
    deadline = time.monotonic() + _WORKERS_LISTED_TIMEOUT_S
    healthy: set[str] = set()
    last = ""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
    while time.monotonic() < deadline:
        if not router.alive():
            code = router.exit_code
            raise _server_log.startup_error(
                f"the sglang-router {_server_log.describe_exit(code)} while registering its workers",
                code, router.log_path)
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
            conn = http.client.HTTPConnection(urlsplit(router.url).hostname or "127.0.0.1", int(router.port or 0),
                                              timeout=5)
            try:
                conn.request("GET", "/workers", headers=headers)
                response = conn.getresponse()
                raw = response.read()
                last = f"HTTP {response.status}: {raw[:200]!r}"
                body = json.loads(raw or b"null")
            finally:
                conn.close()
            if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
                raise ValueError(last)
            healthy = {str(w.get("url", "")).rstrip("/") for w in body.get("workers", []) if w.get("is_healthy")}
            if set(urls) <= healthy:
                return
        time.sleep(0.3)
    missing = sorted(set(urls) - healthy)
    raise _server_log.timeout_error(
        f"the sglang-router did not list {', '.join(missing)} as healthy within {_WORKERS_LISTED_TIMEOUT_S:g} s "
        f"(its /workers answered {last or 'nothing'})",
        router.log_path)
