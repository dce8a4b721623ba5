"""The user-facing `Engine`: one server (owned or attached), its client, and the generate API.

Owns: composing a server process (`_server`), an HTTP client (`_client`), the background loop
(`_loop`), prompt normalisation (`_prompts`), the options schema (`_options`) and the generate
core (`_generate`) into the object a notebook user holds; its lifecycle state; its server-control
methods. Knows nothing about process signals, padding, SGLang's response format or HTML: those
live in their own modules.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import enum
import os
import threading
import time
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import Unpack

from ..client import _router
from ..client._generate import GenerateJob, chunks_to_fill, new_rid, request_size, run_generate
from ..client._http import Client, parse_prometheus
from ..client._prompts import PromptBatch, normalize_prompts, prompt_data
from ..core import _loop, _options
from ..core._columns import RESERVED_DATA_NAMES
from ..core._errors import EngineClosedError, EngineError, RequestError, ServerRequestError
from ..core._options import GenerateOptions, StreamOptions, takes_options
from ..core._types import Prompt, Prompts
from ..rollouts._token_text import TokenText
from ..server import _info as _server_info
from ..server import _keep_alive, _replicas
from ..server._command import DEFAULT_GPU_MEMORY_FRACTION, choose_backend, redacted, server_argv
from ..server._models import resolve_model
from ..server._weights import WeightsHash

if TYPE_CHECKING:
    import pandas as pd

    from ..client._completion_cache import CompletionCache
    from ..compare._logprobs import LogprobCheck
    from ..core._progress import ProgressLine
    from ..rollouts._rollouts import Rollouts
    from ..server._process import ServerProcess

__all__ = ["Engine", "EngineState"]

# check_logprobs' default bounds on |sampled - re-scored| per response token. float32 on the CPU
# backend: prefill and decode agree to float error. bf16 on SGLang: a logit of ~20 is rounded to
# steps of 0.125, so single tokens differ by a few tenths while the mean stays small; a comparison
# off by one token is off by nats.
_CPU_MAX_DIFF, _CPU_MEAN_DIFF = 1e-3, 1e-4
_BF16_MAX_DIFF, _BF16_MEAN_DIFF = 1.0, 0.05
# Rows per scoring request on the CPU backend (see Engine._score_ids).
_CPU_SCORE_CHUNK = 8
# The most prompts per /generate request when the caller sets no chunk_size.
_AUTO_CHUNK_MAX = 256


class EngineState(enum.Enum):
    READY = "ready"        # generate() works
    FAILED = "failed"      # the server died; create a new Engine
    CLOSED = "closed"      # close() was called


@dataclass
class _Call:
    """One generate() call: its prompts, the job for the prompts sent to the server, and what the
    completion cache answered (`keys` is None when the call does not use the cache)."""

    batch: PromptBatch
    job: GenerateJob                  # the prompts that go to the server, in `sent` order
    progress: bool | None
    started: float                    # time.time() when the call began
    sent: list[int]                   # the call's prompt positions in the job, in order
    keys: list[str] | None = None     # the cache key of each of the call's prompts
    hits: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # prompt position -> stored answers


def _finished(answer: dict[str, Any]) -> bool:
    """Whether a server answer is a whole sample (finished by a stop or the length limit)."""
    finish = (answer.get("meta_info") or {}).get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    return kind in ("stop", "length")


class Engine:
    """An SGLang server owned by this notebook (or attached to), with a synchronous generate().

    Usage::

        with rlgen.Engine() as eng:                       # the default model; GPU if there is one
            res = eng.generate(["What is 2+2?"], n=4, max_new_tokens=32)
            res.df                                        # one row per sample
            res.tensors()["response_ids"]                 # padded tensors aligned with res.df

    Without `with`, call `eng.close()` when done (it also happens at interpreter exit, when the
    Engine is garbage-collected, and, through a parent-death signal, when the kernel is killed).

    Args:
        model: a local Hugging Face checkout, or None for SmolLM2-135M-Instruct.
        backend: "auto" (SGLang if CUDA and sglang are available, else the CPU backend),
            "sglang" or "cpu".
        gpu_memory_fraction: share of the GPU's memory the SGLang server may take (weights + KV
            cache), so the notebook keeps the rest for its own torch work.
        fast_start: start a few seconds sooner: no prefill CUDA graphs and no warm-up request
            (decode graphs stay: decode without them is about 6x slower).
        enable_memory_saver: start SGLang so that `release_memory()` / `paused()` can free GPU
            memory.
        enable_metrics: expose SGLang's Prometheus metrics for `metrics()`.
        server_args: extra server flags, as a dict (`{"attention_backend": "triton"}` ->
            `--attention-backend triton`; True -> a bare flag) or a list of strings. They win over
            rlgen's defaults.
        startup_timeout: seconds the server may take to become healthy.
        request_timeout: seconds one HTTP request may take (None: no limit; Ctrl-C aborts).
        progress: show progress (the start-up line; a line per call that takes over a second, ending with
            its totals): True, False, None = auto.
        host, port: where the server listens (loopback and a free port by default). A host other
            than loopback (e.g. "0.0.0.0") gets an API key when none is given: a generated one,
            in `eng.api_key`, required by the server for every route but /health*.
        log_dir: directory for the server log (default under ~/.cache/rlgen/servers/).
        env: environment variables for the server process.
        api_key: require this key on the server (SGLang's `--api-key`; every route but /health*
            and /metrics) and send it. It is on the server's command line (visible to local users
            through `ps`), never in rlgen's logs or registry records.
        keep_alive: keep the server after this Engine and its kernel are gone, for this long
            after its last use ("15m", "90s", "1h" or seconds), so that the next Engine with the
            same model and server options, in any kernel of this user, reattaches in about a
            second instead of starting one. It holds its GPU memory while it waits. `close()`
            detaches, `close(stop=True)` stops it; `rlgen.list_servers()` shows kept servers.
            None (default): the server dies with this Engine or its kernel.
        tp_size, dp_size: SGLang's tensor and data parallelism over this host's GPUs (`--tp-size`,
            `--dp-size`): the model split over tp_size GPUs, dp_size copies of it behind SGLang's
            own scheduler; tp_size x dp_size GPUs in all (CUDA_VISIBLE_DEVICES picks them). Not
            yet proven on a GPU machine by rlgen's tests.
        cache: the completion cache for generate() (each call can override it with `cache=`).
            True: a greedy or seeded call whose prompt, sampling parameters, n, weights (their
            content hash) and weight version were seen before returns the stored samples without
            a request, in rows marked `cached`; unseeded sampling still goes to the server (each
            call draws anew). "always": unseeded sampling too (it replays the first draw). False
            (default): off. Entries live under ~/.cache/rlgen/completions; a corrupt or partial
            entry is ignored and removed, never returned.
        replicas: start this many servers with the same options, and an sglang-router
            (`pip install sglang-router`) in front of them, all owned by this Engine: generate()
            and the control calls go as with `Engine.connect(router)` (docs/scale-out.md), and
            `close()` stops the router, then the servers. 1 (default): one server, no router.
            `host=` and `port=` are the router's (beyond loopback it gets the API key, as one
            server would); the servers bind loopback on free ports. On SGLang the servers start
            one after another (servers sharing a GPU each measure free memory), on the CPU backend
            at once. Not with `keep_alive` (yet).
        gpus: with replicas > 1: GPU indices to place the servers on, server i gets
            `CUDA_VISIBLE_DEVICES=gpus[i % len(gpus)]` (one GPU each, so tp_size x dp_size must be 1).
    """

    _api_key: str | None        # sent as Authorization: Bearer <key>
    _kept: _keep_alive.Kept | None  # a kept server (keep_alive=): not owned by this Engine, shared
    _replicas: _replicas.Replicas | None  # Engine(replicas=N): the router and the workers it owns
    reattached: bool            # True when this Engine reattached to a kept server
    # Where the constructor's time went: tokenizer_s (loaded in a background thread while the
    # server starts), server_s (launch until healthy, or finding and attaching a kept server),
    # total_s (the constructor, end to end).
    start_times: dict[str, float]

    # -- construction ----------------------------------------------------------------------------
    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        backend: str = "auto",
        gpu_memory_fraction: float = DEFAULT_GPU_MEMORY_FRACTION,
        fast_start: bool = False,
        enable_memory_saver: bool = False,
        enable_metrics: bool = False,
        server_args: Mapping[str, Any] | Sequence[str] | None = None,
        startup_timeout: float = 900.0,
        request_timeout: float | None = None,
        progress: bool | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        api_key: str | None = None,
        keep_alive: str | float | None = None,
        cache: bool | str = False,
        tp_size: int = 1,
        dp_size: int = 1,
        replicas: int = 1,
        gpus: Sequence[int] | None = None,
    ) -> None:
        from ..core._progress import PhaseLine
        from ..server._process import launch_server

        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise ValueError("api_key must be a non-empty string or None")
        worker_env = _check_replicas(replicas, gpus, keep_alive=keep_alive, tp_size=tp_size, dp_size=dp_size)
        keep_s = None if keep_alive is None else _keep_alive.parse_duration(keep_alive)
        self._init_common(progress=progress, request_timeout=request_timeout, api_key=api_key, cache=cache)
        self._server: ServerProcess | None = None
        if not isinstance(gpu_memory_fraction, (int, float)) or not 0 < gpu_memory_fraction <= 1:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {gpu_memory_fraction!r}")
        # 1) What to serve, and with which backend.
        resolved = resolve_model(model)
        self.model, self.model_path = resolved.name, resolved.path
        self.backend = choose_backend(backend)
        self._memory_saver = enable_memory_saver
        self._metrics_enabled = enable_metrics
        argv = server_argv(
            self.backend,
            resolved.path,
            gpu_memory_fraction=gpu_memory_fraction,
            fast_start=fast_start,
            enable_memory_saver=enable_memory_saver,
            enable_metrics=enable_metrics,
            server_args=server_args,
            tp_size=tp_size,
            dp_size=dp_size,
        )
        # 2) Load the tokenizer while the server starts (a kernel's first transformers import takes
        #    seconds). Stop servers left behind by dead kernels (their GPU memory is ours to reuse),
        #    then launch and wait for a real one-token generation, showing one status line.
        t0 = time.monotonic()
        tokenizer = _in_background(_timed_load_tokenizer, resolved.path, self.start_times)
        self._weights = WeightsHash(resolved.path)  # for records and the cache; read while the server starts
        _reap_leftovers()
        line = PhaseLine(f"rlgen {self.backend} server", show=progress)
        notes: list[str] = []
        if keep_s is not None:
            # 2b) A kept server of this user with these very options: reattach instead of launching.
            key = _keep_alive.options_key(argv, host, port, dict(env or {}))
            kept, notes = _keep_alive.find(key, resolved.path, argv)
            if kept is not None:
                self._reattach(kept, tokenizer, line, notes, t0=t0, keep_alive_s=keep_s)
                return
            api_key = api_key or _keep_alive.new_api_key()  # each kept server requires its own key
            self._api_key = api_key
        if api_key is None and not _is_loopback(host):
            # A server others can reach must not serve anyone who asks: generate a key (SGLang's
            # --api-key; /health* stays open), send it, and let the user read it to share it.
            api_key = self._api_key = _keep_alive.new_api_key()
            notes.append(f"listening on {host}: requests need the API key in eng.api_key")
        if api_key is not None:
            # One argument, so a key that starts with "-" is not read as a flag; kept out of logs
            # and registry records (`redacted`).
            argv.append(f"--api-key={api_key}")
        t_server = time.monotonic()
        if replicas > 1:
            self._launch_replicas(argv, replicas, worker_env, line=line, notes=notes, host=host, port=port, env=env,
                                  log_dir=log_dir, startup_timeout=startup_timeout, api_key=api_key)
            self.start_times["server_s"] = time.monotonic() - t_server
            self._connect_owned(tokenizer, t0)
            return
        try:
            server = launch_server(
                argv, host=host, port=port, env=env, log_dir=log_dir,
                startup_timeout=startup_timeout, on_phase=line.update,
                _pdeathsig=keep_s is None,  # a kept server outlives this process
            )
        except BaseException:
            self._state = EngineState.FAILED
            line.close(ok=False)
            raise
        self.url = server.url
        self.start_times["server_s"] = time.monotonic() - t_server
        if keep_s is not None and api_key is not None:
            server.release()  # its watchdog stops it now, not this process
            self._kept = _keep_alive.keep(
                pid=int(server.pid or 0), key=key, url=server.url, api_key=api_key, keep_alive_s=keep_s,
                model=self.model, model_path=resolved.path, backend=self.backend, argv=argv,
                log_dir=server.log_path.parent,
            )
            notes.insert(0, f"kept {_duration(keep_s)} after its last use")
        else:
            self._server = server
        line.close(ok=True, message="; ".join(["ready", *notes]))
        # 3) Client, tokenizer and what the server says about itself.
        try:
            self._connect(tokenizer=tokenizer.result())
        except BaseException:
            self._state = EngineState.FAILED
            if self._kept is not None:
                _keep_alive.stop(self._kept)
            server.close()
            raise
        self.start_times["total_s"] = time.monotonic() - t0

    def _launch_replicas(self, argv: list[str], replicas: int, worker_env: list[dict[str, str]], *, line: Any,
                         notes: list[str], host: str, port: int | None, env: Mapping[str, str] | None,
                         log_dir: str | os.PathLike[str] | None, startup_timeout: float, api_key: str | None) -> None:
        """`replicas` servers and a router in front (rlgen.server._replicas); this Engine talks to the router."""
        try:
            fleet = _replicas.launch_replicas(
                argv, replicas, concurrent_start=self.backend == "cpu", host=host, port=port, env=env,
                worker_env=worker_env,
                log_dir=log_dir, startup_timeout=startup_timeout, api_key=api_key, on_phase=line.update)
        except BaseException:
            self._state = EngineState.FAILED
            line.close(ok=False)
            raise
        self._replicas = fleet
        self._server = fleet.router
        self._behind_router = True
        self.url = fleet.router.url
        line.close(ok=True, message="; ".join([f"ready: {replicas} servers behind an sglang-router", *notes]))

    def _connect_owned(self, tokenizer: concurrent.futures.Future[Any], t0: float) -> None:
        """Connect to the router of `replicas`; on failure stop everything."""
        try:
            self._connect(tokenizer=tokenizer.result())
        except BaseException:
            self._state = EngineState.FAILED
            if self._replicas is not None:
                self._replicas.close()
            raise
        self.start_times["total_s"] = time.monotonic() - t0

    def _reattach(self, kept: _keep_alive.Kept, tokenizer: concurrent.futures.Future[Any], line: Any, notes: list[str],
                  *, t0: float, keep_alive_s: float) -> None:
        """Use kept server `kept` instead of launching one: attach (this Engine's keep_alive from
        now on), then connect with its key."""
        idle = kept.idle_s()
        self._kept = _keep_alive.attach(kept, keep_alive_s=keep_alive_s)
        self._api_key = kept.api_key
        self.url = kept.url
        self.reattached = True
        self.start_times["server_s"] = time.monotonic() - t0
        try:
            self._connect(tokenizer=tokenizer.result())
            self.start_times["total_s"] = time.monotonic() - t0
        except BaseException:
            self._state = EngineState.FAILED
            _keep_alive.detach(self._kept)
            line.close(ok=False, message=f"could not reattach to kept server pid {kept.pid}")
            raise
        line.close(ok=True, message="; ".join([f"reattached to pid {kept.pid} (idle {_duration(idle)})", *notes]))

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        tokenizer: Any = None,
        request_timeout: float | None = None,
        progress: bool | None = None,
        api_key: str | None = None,
        cache: bool | str = False,
    ) -> Engine:
        """Attach to a running SGLang server (remote, multi-node, a router). close() never stops it.

        Behind an `sglang-router` (detected: its /get_server_info says `router_manager`), generate()
        sends one request per prompt (the router refuses batched ones), and the control methods
        (update_weights_from_disk, release_memory/resume_memory/paused, flush_cache, aborts) go to
        every worker the router lists; `info["router"]` lists them. docs/scale-out.md has the details.

        Args:
            url: the server's base URL, e.g. "http://10.0.0.5:30000".
            tokenizer: a tokenizer object or a local path for it; default: the server's
                `tokenizer_path` (must exist on this machine).
            api_key: the server's `--api-key`, sent as `Authorization: Bearer <key>`.
            cache: as `Engine(cache=)`; it needs the served weights on this machine (their
                content hash is part of every key).
        """
        self = cls.__new__(cls)
        self._init_common(progress=progress, request_timeout=request_timeout, api_key=api_key, cache=cache)
        self._server = None
        self.url = url.rstrip("/")
        self.backend = "remote"
        self._memory_saver = True  # the server's choice; SGLang answers if it cannot
        self._metrics_enabled = True
        probe = Client(self.url, api_key=api_key)
        try:
            info = _loop.run_sync(probe.get_info("model", timeout=30))
            self._behind_router = _loop.run_sync(_router.is_router(probe))
        finally:
            _loop.run_sync(probe.aclose())
        self.model_path = info.get("model_path", "")
        self.model = Path(self.model_path).name or self.model_path
        self._weights = WeightsHash(self.model_path if self.model_path and Path(self.model_path).is_dir() else None)
        self._connect(tokenizer=tokenizer if tokenizer is not None else (info.get("tokenizer_path") or self.model_path))
        return self

    def _init_common(self, *, progress: bool | None, request_timeout: float | None, api_key: str | None = None,
                     cache: bool | str = False) -> None:
        self._cache_mode = _options.cache_mode("cache", cache) or False
        self._completions: CompletionCache | None = None  # opened at the first call that uses it
        self._warned_unseeded = False
        self._weights = WeightsHash(None)
        self._gpu_name: str | None = None
        self._state = EngineState.FAILED  # until _connect() succeeds
        self._progress = progress
        self._api_key = api_key
        self._kept = None
        self.reattached = False
        self.start_times = {}
        self._request_timeout = request_timeout
        self.last_result: Rollouts | None = None  # the last generate()'s result, also when it was interrupted
        self._gpu_memory_released: bool | None = None
        self._weight_updates = 0
        self._weights_path: str | None = None  # where the served weights were last loaded from
        self._released: set[str] = set()      # memory tags released and not yet resumed
        self._behind_router = False           # connect() to an sglang-router: see rlgen.client._router
        self._replicas = None

    def _connect(self, *, tokenizer: Any) -> None:
        client_type = _router.RouterClient if self._behind_router else Client
        self._client = client_type(self.url, request_timeout=self._request_timeout,
                                   on_connection_error=self._on_connection_error, api_key=self._api_key)
        self.tokenizer = _load_tokenizer(tokenizer)
        self._token_text = TokenText(self.tokenizer)  # each result's decode: token text for its view
        self._vocab_size = len(self.tokenizer)  # once: some tokenizers rebuild the vocabulary for len()
        self._server_info = _loop.run_sync(self._client.get_info("server", timeout=60))
        self._weight_version = _loop.run_sync(self._client.get_info("model", timeout=60)).get("weight_version")
        self.context_length = _server_info.context_length(self._server_info, self.tokenizer, self.model_path)
        self._state = EngineState.READY
        self._finalizer = weakref.finalize(self, _close_client, self._client)

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        """READY, FAILED (the server died: create a new Engine) or CLOSED. Reading it changes nothing."""
        if self._state is EngineState.READY and self._server is not None and not self._server.alive():
            return EngineState.FAILED
        return self._state

    @property
    def server_info(self) -> dict[str, Any]:
        """What the server said about itself at connection (SGLang's `/server_info`), as a copy."""
        return dict(self._server_info)

    @property
    def gpu_memory_released(self) -> bool | None:
        """After close(): True once the server's GPU memory was seen freed, False if it was still
        held 30 s later, None where it cannot be measured (no GPU, or the driver hides processes)."""
        return self._gpu_memory_released

    @property
    def api_key(self) -> str | None:
        """The key the server requires (given, generated for a non-loopback host or a kept server), or None."""
        return self._api_key

    @property
    def log_path(self) -> str | None:
        """The server's log file (None for a server this Engine attached to with `connect`)."""
        if self._kept is not None:
            return self._kept.record.log_path
        return str(self._server.log_path) if self._server is not None else None

    def close(self, *, stop: bool = False) -> None:
        """Stop the server this Engine owns (never one it attached to). Idempotent.

        A kept server (`keep_alive=`) is only detached: its idle timer starts now; `stop=True`
        stops it at once.
        """
        if self._state is EngineState.CLOSED:
            return
        self._state = EngineState.CLOSED
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        if self._kept is not None:
            if stop:
                _keep_alive.stop(self._kept)
            else:
                _keep_alive.detach(self._kept)
        fleet = getattr(self, "_replicas", None)
        server = getattr(self, "_server", None)
        if fleet is not None:  # the router first, then the workers
            fleet.close()
            self._gpu_memory_released = fleet.wait_gpu_memory_released(timeout=30)
        elif server is not None:
            server.close()
            self._gpu_memory_released = server.wait_gpu_memory_released(timeout=30)

    def __enter__(self) -> Engine:
        self._check_ready()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_ready(self) -> None:
        state = self.state
        if state is EngineState.CLOSED:
            raise EngineClosedError("this Engine is closed; create a new one with rlgen.Engine(...)")
        if state is EngineState.FAILED:
            if self._server is not None:
                self._server.assert_alive()  # raises ServerDiedError with exit code and log tail
            raise EngineError("this Engine's server has failed; create a new Engine")

    def _on_connection_error(self) -> None:
        if self._server is not None and not self._server.alive():
            self._state = EngineState.FAILED
            self._server.assert_alive()

    # -- introspection ---------------------------------------------------------------------------
    @property
    def info(self) -> dict[str, Any]:
        """Model, backend, versions, where the server is, its command line, and the GPU memory it holds.

        GPU memory, three ways: `gpu_memory_mib` (the driver's count for every process of this
        Engine's servers, all GPUs together), `gpu_memory_per_gpu` (the same per GPU, keyed by the
        driver's GPU index) and `memory_usage` (SGLang's own account per data-parallel rank:
        weights, KV cache, CUDA graphs in GB, as read when the Engine connected). The driver's
        counts are None where it lists none of the processes (CPU machines, some containers).
        """
        from .._version import __version__
        from ..server._process_tree import gpu_memory_per_gpu

        server, kept = self._server, self._kept
        # Where the server is: one this Engine owns, a kept one it shares, or none (connect()).
        pid, port, pids = (
            (server.pid, server.port, self._replicas.pids() if self._replicas is not None else server.pids())
            if server is not None
            else (kept.pid, kept.record.port, [kept.pid]) if kept is not None
            else (None, None, None)
        )
        command = self._command()
        per_gpu = gpu_memory_per_gpu(pids) if pids is not None else None  # one reading of the driver for both
        info = {
            "state": self.state.value,
            "model": self.model,
            "model_path": self.model_path,
            "backend": self.backend,
            "url": self.url,
            "pid": pid,
            "port": port,
            "log_path": self.log_path,
            "command": command,
            "context_length": self.context_length,
            "server_version": self._server_info.get("version"),
            "rlgen_version": __version__,
            "gpu_memory_mib": sum(per_gpu.values()) if per_gpu else None,
            "gpu_memory_per_gpu": per_gpu,
            "memory_usage": _server_info.memory_usage(self._server_info),
            "router": self._router_info(),
        }
        if kept is not None:
            info["kept"] = _registry_kept_summary(kept.pid)
        return info

    def _router_info(self) -> dict[str, Any] | None:
        """Behind a router: its workers as it lists them now (or as last seen, if it does not answer)."""
        client = self._client if self._behind_router and self._state is EngineState.READY else None
        if not isinstance(client, _router.RouterClient):
            return None
        info: dict[str, Any] = {"url": self.url}
        try:
            _loop.run_sync(client.list_workers(timeout=5))
        except RequestError as err:
            info["error"] = str(err)
        info["workers"] = [w.as_dict() for w in client.workers]
        if self._replicas is not None:  # ours: add pid and log path of the router and each worker
            owned = self._replicas.describe()
            info.update(owned["router"])
            by_url = {w["url"]: w for w in owned["workers"]}
            for w in info["workers"]:
                w.update(by_url.get(w["url"], {}))
            info["workers"] += [w for url, w in by_url.items() if url not in {x["url"] for x in info["workers"]}]
        return info

    def _command(self) -> list[str] | None:
        """The server's command line (API key redacted), or None for a server this Engine did not start."""
        server, kept = self._server, self._kept
        return redacted(server.argv) if server is not None else list(kept.record.argv) if kept is not None else None

    def __repr__(self) -> str:
        server, kept = getattr(self, "_server", None), getattr(self, "_kept", None)
        pid = server.pid if server is not None else (kept.pid if kept is not None else None)
        where = (f"pid={pid} " if pid is not None else "") + ("kept " if kept is not None else "")
        if getattr(self, "_behind_router", False):
            where += "router "
        return f"<rlgen.Engine {self.model!r} backend={self.backend} {where}url={self.url} state={self.state.value}>"

    def _repr_html_(self) -> str:
        from ..rollouts._display import engine_html

        return engine_html(self)

    # -- generation ------------------------------------------------------------------------------
    @takes_options(GenerateOptions)
    def generate(self, prompts: Prompts, /, **options: Unpack[GenerateOptions]) -> Rollouts:
        """Generate `n` samples for each prompt; returns a `Rollouts` (a row per sample).

        `prompts`: a string, a list of strings, a list of token-id lists, one chat (a list of
        {"role", "content"} messages) or a list of chats (rendered with the model's chat template).
        The options (below) are SGLang's sampling parameters and rlgen's own; every one is checked
        before anything is sent.

        Raises:
            TypeError / ValueError: bad prompts or options (nothing was sent).
            ServerRequestError: the server rejected a request (`.prompt_index` names the first
                prompt of it). KeyboardInterrupt: Ctrl-C; in-flight requests were aborted on the
                server, finished samples are in `eng.last_result`.
        """
        call = self._prepare(prompts, options)
        if call.job.prompt_ids:  # else every prompt was answered by the completion cache
            with self._progress_line(call.job, call.progress) as line:
                try:
                    _loop.run_sync(run_generate(self._client, call.job, on_progress=line.advance), on_wait=line.tick)
                except BaseException:
                    self.last_result = self._rollouts(call, failed=True)
                    raise
        self.last_result = self._rollouts(call)
        return self.last_result

    @takes_options(GenerateOptions)
    async def agenerate(self, prompts: Prompts, /, **options: Unpack[GenerateOptions]) -> Rollouts:
        """`generate()` for `await` (e.g. at the top level of a notebook cell): the same options."""
        call = self._prepare(prompts, options)
        if call.job.prompt_ids:  # else every prompt was answered by the completion cache
            with self._progress_line(call.job, call.progress) as line:
                future = asyncio.run_coroutine_threadsafe(
                    run_generate(self._client, call.job, on_progress=line.advance), _loop.get_loop()
                )
                waiting = asyncio.wrap_future(future)
                try:
                    while not waiting.done():  # redraw the line from this (the notebook's) thread
                        await asyncio.wait({waiting}, timeout=0.25)
                        line.tick()
                    await waiting
                except BaseException:
                    future.cancel()
                    self.last_result = self._rollouts(call, failed=True)
                    raise
        self.last_result = self._rollouts(call)
        return self.last_result

    @takes_options(StreamOptions)
    def stream(self, prompt: Prompt, /, **options: Unpack[StreamOptions]) -> Iterator[str]:
        """Yield the text of one prompt's completion piece by piece, as it is generated.

        Takes the sampling options of generate(); one prompt, one sample. Breaking out of the loop
        aborts the request on the server.
        """
        self._check_ready()
        resolved = _options.resolve(StreamOptions, options)
        batch = self._normalize(prompt, max_new_tokens=resolved["max_new_tokens"])
        if len(batch) != 1:
            raise ValueError("stream() takes one prompt; use generate(stream=True) for batches")
        self._warn_if_seed_ignored(resolved)
        payload = {"input_ids": batch.ids[0], "sampling_params": _options.to_sglang(resolved), "rid": new_rid()}
        return _loop.iterate(self._text_pieces(payload))

    async def _text_pieces(self, payload: dict[str, Any]) -> AsyncIterator[str]:
        """The new text of each streamed chunk; on cancellation the request is aborted on the server."""
        sent = ""
        try:
            async for chunk in self._client.generate_stream(payload):
                text = chunk.get("text", "")
                if len(text) > len(sent):
                    yield text[len(sent):]
                    sent = text
        except (asyncio.CancelledError, GeneratorExit):
            with contextlib.suppress(Exception):
                await self._client.abort([payload["rid"]])
            raise

    def _prepare(self, prompts: Prompts, options: Mapping[str, Any]) -> _Call:
        """Check everything, look the prompts up in the completion cache, and build the job for
        the rest; raises before anything is sent."""
        self._check_ready()
        started = time.time()
        opts = _options.resolve(GenerateOptions, options)
        self._warn_if_seed_ignored(opts)
        batch = self._normalize(prompts, max_new_tokens=opts["max_new_tokens"])
        chunk_size = opts["chunk_size"] or request_size(len(batch), most=_AUTO_CHUNK_MAX)
        max_in_flight = opts["max_in_flight"]
        if max_in_flight is None:
            max_in_flight = chunks_to_fill(_server_info.running_capacity(self._server_info), chunk_size, opts["n"])
        batch.data = prompt_data(opts["data"], len(batch), reserved=RESERVED_DATA_NAMES)
        job = GenerateJob(
            prompt_ids=batch.ids, sampling=_options.to_sglang(opts), n=opts["n"], logprobs=opts["logprobs"],
            top_logprobs=opts["top_logprobs"], stream=opts["stream"], chunk_size=chunk_size,
            max_in_flight=max_in_flight,
        )
        call = _Call(batch=batch, job=job, progress=opts["progress"], started=started,
                     sent=list(range(len(batch.ids))))
        mode = self._cache_mode if opts["cache"] is None else opts["cache"]
        if mode and self._cacheable(job, mode):
            self._look_up(call)
        return call

    def _cacheable(self, job: GenerateJob, mode: bool | str) -> bool:
        """Whether this call uses the completion cache (see `Engine`'s `cache`)."""
        if job.stream:
            return False  # a streamed call is made to time the stream: it always goes to the server
        greedy = job.sampling.get("temperature") == 0 or job.sampling.get("top_k") == 1
        if mode == "always" or greedy or job.sampling.get("sampling_seed") is not None:
            return True
        if not self._warned_unseeded:
            self._warned_unseeded = True
            warnings.warn("cache=True leaves unseeded sampling uncached (each call draws new samples): pass seed=... "
                          "to cache it, or cache='always' to replay the first draw", stacklevel=5)
        return False

    def _look_up(self, call: _Call) -> None:
        """Fill `call.keys` and `call.hits`; only the prompts the cache did not answer stay in the job."""
        from ..client._completion_cache import CompletionCache, cache_key

        digest = self._weights.result()
        if digest is None:
            raise EngineError("the completion cache needs the served weights on this machine (their content hash is "
                              f"part of every key), and {self._weights.path or self.model_path!r} is not a local "
                              "checkout: pass cache=False")
        if self._completions is None:
            self._completions = CompletionCache()
        job = call.job
        # The weight version as this Engine last set or read it: a lookup makes no request, so it
        # trusts that the served weights change only through this Engine.
        call.keys = [cache_key(weights_sha256=digest, weight_version=self._weight_version, prompt_ids=ids, sampling=job.sampling,
                               n=job.n, logprobs=job.logprobs, top_logprobs=job.top_logprobs) for ids in job.prompt_ids]
        for i, key in enumerate(call.keys):
            answers = self._completions.get(key, n=job.n)
            if answers is not None:
                call.hits[i] = answers
        call.sent = [i for i in range(len(call.keys)) if i not in call.hits]
        job.prompt_ids = [job.prompt_ids[i] for i in call.sent]

    def _normalize(self, prompts: Prompts, *, max_new_tokens: int) -> PromptBatch:
        return normalize_prompts(prompts, tokenizer=self.tokenizer, vocab_size=self._vocab_size,
                                 context_length=self.context_length, max_new_tokens=max_new_tokens)

    def _warn_if_seed_ignored(self, opts: Mapping[str, Any]) -> None:
        if opts["seed"] is not None and not _server_info.honours_seed(self._server_info):
            warnings.warn(
                "seed= will not make sampling reproducible on this SGLang server: it honours sampling_seed only "
                "in deterministic mode; start the Engine with server_args={'enable_deterministic_inference': True}",
                stacklevel=4,
            )

    def _progress_line(self, job: GenerateJob, progress: bool | None, *, label: str = "generate",
                       unit: str = "sample") -> ProgressLine:
        """The call's progress line: auto mode shows it once the call has run a second."""
        from ..core._progress import ProgressLine

        return ProgressLine(label, total=job.n_samples, unit=unit, show=self._progress if progress is None else progress)

    def _rollouts(self, call: _Call, *, failed: bool = False) -> Rollouts:
        from ..rollouts._build import rollouts_from_responses
        from ..rollouts._response_arrays import failed_entry

        job, batch, n = call.job, call.batch, call.job.n
        sent: list[dict[str, Any] | None] = list(job.results) or [None] * job.n_samples
        if call.keys is not None and self._completions is not None and not failed:
            for j, i in enumerate(call.sent):  # store each prompt whose n samples all finished
                answers = sent[j * n:(j + 1) * n]
                if all(a is not None and _finished(a) for a in answers):
                    self._completions.put(call.keys[i], [a for a in answers if a is not None])
        responses: list[dict[str, Any] | None] = [None] * (len(batch.ids) * n)
        for i, stored in call.hits.items():
            responses[i * n:(i + 1) * n] = list(stored)
        for j, i in enumerate(call.sent):
            responses[i * n:(i + 1) * n] = sent[j * n:(j + 1) * n]
        if failed or any(r is None for r in responses):
            responses = [r if r is not None else failed_entry("aborted before the server answered", reason="abort")
                         for r in responses]
        extra: dict[str, list[Any]] = {"ttft_s": job.ttft_s, "itl_s": job.itl_s} if job.stream else {}
        if batch.chats is not None:
            extra["prompt_messages"] = [chat for chat in batch.chats for _ in range(n)]
        extra.update({name: [v for v in values for _ in range(n)] for name, values in batch.data.items()})
        if call.keys is not None:
            extra["cached"] = [i in call.hits for i in range(len(batch.ids)) for _ in range(n)]
        sampling = {**job.sampling, "n": n}
        return rollouts_from_responses(
            responses, prompt_ids=batch.ids, prompt_texts=batch.texts, n=job.n,
            pad_token_id=_pad_id(self.tokenizer), extra=extra, model=self.model, sampling=sampling,
            decode=self._token_text, record=self._record(call, sampling, responses),
        )

    def _record(self, call: _Call, sampling: dict[str, Any], responses: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
        """`Rollouts.record`: what made this call's rows."""
        from .._version import __version__

        versions = sorted({str(v) for r in responses if r is not None
                           and (v := (r.get("meta_info") or {}).get("weight_version")) is not None})
        return {
            "rlgen_version": __version__,
            "server_version": self._server_info.get("version"),
            "backend": self.backend,
            "model": self.model,
            "model_path": self.model_path,
            "weights_path": self._weights_path or self.model_path,
            "weights_sha256": self._weights.result(),
            "weight_versions": versions,
            "server_args": self._command(),
            "sampling": sampling,
            "seed": sampling.get("sampling_seed"),
            "started_utc": datetime.datetime.fromtimestamp(call.started, datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "gpu": self._gpu(),
            "cache": None if call.keys is None else {"hits": len(call.hits), "sent": len(call.sent)},
        }

    def _gpu(self) -> str | None:
        """The GPU's name where the server is on this machine and has one (nvidia-smi, read once)."""
        if self._gpu_name is None and self.backend == "sglang":
            from ..server._process_tree import gpu_name

            self._gpu_name = gpu_name() or ""
        return self._gpu_name or None

    # -- scoring ---------------------------------------------------------------------------------
    def score(self, prompts: Prompts | Rollouts, completions: Sequence[str] | Sequence[Sequence[int]] | None = None,
              *, progress: bool | None = None) -> Rollouts:
        """Logprobs of given tokens under the model (one prefill each, no sampling).

        `eng.score(prompts, completions)`: one completion (text or token ids) per prompt.
        `eng.score(res)`: the exact sampled ids of every row of a `Rollouts` (its prompt ids and
        response ids, the EOS token included), rows in `res`'s order, so that the result's tensors
        have `res.tensors()`'s shapes and masks: `res.logprobs` and `eng.score(res).logprobs` line
        up position by position (the basis of reference-model and KL checks).

        A text completion is tokenized as it is, without the EOS token the model generated after
        it: its logprob sum differs from the sampled row's by that token's logprob (and by any
        token boundary that tokenizing the text draws differently). Re-score a `Rollouts` to
        compare with what was sampled.

        Returns a `Rollouts` whose responses are the scored tokens and whose `logprobs` are the
        model's log-probabilities of them from raw logits (temperature 1, no top-p/top-k);
        finish_reason is "score".
        """
        from ..rollouts._build import rollouts_from_responses
        from ..rollouts._rollouts import Rollouts

        if isinstance(prompts, Rollouts):
            if completions is not None:
                raise ValueError("score(rollouts) re-scores the rollouts' own tokens; pass no completions")
            return self._score_rollouts(prompts, progress=progress)
        if completions is None:
            raise ValueError("give one completion per prompt, or pass a Rollouts to re-score its sampled tokens")
        batch = self._normalize(prompts, max_new_tokens=1)
        if isinstance(completions, (str, bytes)) or len(completions) != len(batch):
            raise ValueError(f"give one completion per prompt ({len(batch)} prompts)")
        completion_ids = [list(c) if not isinstance(c, str) else self.tokenizer(c, add_special_tokens=False)["input_ids"]
                          for c in completions]
        for i, c in enumerate(completion_ids):
            if not c:
                raise ValueError(f"completion {i} is empty; nothing to score")
        entries = self._score_ids(batch.ids, completion_ids, progress=progress)
        return rollouts_from_responses(entries, prompt_ids=batch.ids, prompt_texts=batch.texts, n=1,
                                       pad_token_id=_pad_id(self.tokenizer), model=self.model,
                                       sampling={"score": True}, decode=self._token_text)

    def _score_rollouts(self, rollouts: Rollouts, *, progress: bool | None) -> Rollouts:
        """`score(res)`: every row's prompt + response ids; a row without response tokens stays empty."""
        from ..rollouts._build import rollouts_from_responses

        if len(rollouts) == 0:
            raise ValueError("the rollouts have no rows to re-score")
        prompt_ids = rollouts.id_lists("prompt")
        response_ids = rollouts.id_lists("response")
        entries = self._score_ids(prompt_ids, response_ids, progress=progress)
        return rollouts_from_responses(entries, prompt_ids=prompt_ids, prompt_texts=rollouts.df["prompt"].tolist(),
                                       n=1, pad_token_id=rollouts.pad_token_id, model=self.model,
                                       sampling={"score": True}, decode=self._token_text)

    def check_logprobs(self, rollouts: Rollouts, *, max_diff: float | None = None, mean_diff: float | None = None,
                       progress: bool | None = None) -> LogprobCheck:
        """Re-score the rollouts' own tokens (`score(rollouts)`) and compare with their sampled logprobs.

        Returns a `LogprobCheck`: `passed` (None when the two are not comparable), the differences
        over response tokens, and the bounds used. The default bounds are float rounding on the CPU
        backend (float32) and bf16 rounding on SGLang; pass `max_diff=` / `mean_diff=` to choose.

        Sampled logprobs are comparable with a re-score only when they come from raw logits:
        SGLang reports `log_softmax(logits / temperature)` after penalties and logit bias (and
        before top-p/top-k/min-p filtering, so those do not matter), while a re-score uses the raw
        logits. Rollouts sampled at a temperature other than 1 (greedy counts as 1), or with
        penalties, are therefore not re-scored, and the verdict says why.
        """
        from ..compare._logprobs import check_verdict, compare_logprobs, not_comparable_reason

        if rollouts.logprobs is None:
            raise ValueError("these rollouts have no logprobs; generate with logprobs=True")
        cpu = self._server_info.get("rlgen_backend") == "cpu"
        bounds = {"max_diff": _CPU_MAX_DIFF if cpu else _BF16_MAX_DIFF, "mean_diff": _CPU_MEAN_DIFF if cpu else _BF16_MEAN_DIFF}
        if max_diff is not None:
            bounds["max_diff"] = max_diff
        if mean_diff is not None:
            bounds["mean_diff"] = mean_diff
        reason = not_comparable_reason(rollouts.sampling)
        if reason is not None:
            return check_verdict(None, reason=reason, **bounds)
        if not any(rollouts.id_lists("response")):
            raise ValueError("the rollouts have no response tokens to re-score")
        rescored = self.score(rollouts, progress=progress)
        return check_verdict(compare_logprobs(rollouts, rescored), reason=None, **bounds)

    def _score_ids(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], *,
                   progress: bool | None) -> list[dict[str, Any]]:
        """Prefill prompt+completion with input logprobs from the last prompt token on.

        Identical (prompt, completion) pairs are prefilled once. An empty completion gets an entry
        with no tokens, without a request.
        """
        from ..rollouts._response_arrays import scored_entry

        self._check_ready()
        first: dict[tuple[int, tuple[int, ...]], int] = {}  # distinct (prompt length, ids) -> first row
        for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
            if c:
                first.setdefault((len(p), tuple(p + c)), i)
        # Longest first: rows of similar length share a chunk, and the CPU backend pads a prefill
        # batch to its longest row (SGLang packs rows without padding, so the order costs nothing).
        todo = sorted(first.values(), key=lambda i: len(prompt_ids[i]) + len(completion_ids[i]), reverse=True)
        if self._server_info.get("rlgen_backend") == "cpu":
            # Small chunks, one queued behind the running one: each is prefilled on its own, padded
            # only to its own longest row, and the bar advances per chunk.
            chunk_size, max_in_flight = _CPU_SCORE_CHUNK, 2
        else:
            chunk_size = _AUTO_CHUNK_MAX
            max_in_flight = chunks_to_fill(_server_info.running_capacity(self._server_info), chunk_size, 1)
        job = GenerateJob(
            prompt_ids=[prompt_ids[i] + completion_ids[i] for i in todo],
            sampling={"max_new_tokens": 1, "temperature": 0.0}, n=1, logprobs=True, top_logprobs=0,
            stream=False, chunk_size=chunk_size, max_in_flight=max_in_flight,
            per_prompt={"logprob_start_len": [len(prompt_ids[i]) - 1 for i in todo]},
        )
        with self._progress_line(job, progress, label="score", unit="row") as line:
            # A scoring request generates one throwaway token per row: rows are the measure, not tok/s.
            _loop.run_sync(run_generate(self._client, job, on_progress=lambda rows, _tokens: line.advance(rows)),
                           on_wait=line.tick)
        answers = dict(zip(todo, job.results))
        entries = []
        for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
            if not c:
                entries.append(scored_entry({"meta_info": {"input_token_logprobs": [[None, p[-1] if p else 0]]}},
                                            prompt_len=len(p), completion_ids=[], text=""))
                continue
            r = answers[first[(len(p), tuple(p + c))]]
            if r is None:
                raise RequestError("the server did not answer this scoring request", prompt_index=i)
            entries.append(scored_entry(r, prompt_len=len(p), completion_ids=c,
                                        text=self.tokenizer.decode(c, skip_special_tokens=True)))
        return entries

    # -- server control --------------------------------------------------------------------------
    def flush_cache(self) -> None:
        """Drop the server's prefix (radix) cache. SGLang refuses while requests are running."""
        self._check_ready()
        self._control("/flush_cache", {}, what="flush_cache()")

    def _control(self, path: str, body: dict[str, Any], *, what: str, retries: int = 0, backoff_s: float = 1.0) -> Any:
        """POST a control request to the server; behind a router, to every worker it lists, at once
        (the router has no such routes), raising one WorkerRequestError that names each worker that
        failed after all were tried. Returns the server's answer (behind a router: one worker's)."""
        if isinstance(self._client, _router.RouterClient):
            answers = _loop.run_sync(self._client.fan_out(path, body, what=what, retries=retries, backoff_s=backoff_s))
            return next(iter(answers.values()), None)
        return _loop.run_sync(self._client.post(path, body))

    def update_weights_from_disk(self, path: str | os.PathLike[str], *, weight_version: str | None = None,
                                 retries: int = 3, backoff_s: float = 1.0) -> str:
        """Load new weights from a checkout on the server's disk; returns the new weight version.

        Retries transient failures (connection errors, HTTP 5xx/503) with backoff; a rejected path
        (HTTP 400) fails at once. The version defaults to "<dir name>@<n>" so rows stay traceable.
        Behind a router every worker loads it, at once; if some fail, WorkerRequestError names them.
        """
        self._check_ready()
        self._weight_updates += 1
        version = weight_version or f"{Path(path).name}@{self._weight_updates}"
        body = {"model_path": str(path), "weight_version": version}
        if self._behind_router:  # every worker, retried per worker; a failure names the worker
            result = self._control("/update_weights_from_disk", body, what=f"update_weights_from_disk({str(path)!r})",
                                   retries=retries, backoff_s=backoff_s)
        else:
            result = self._update_weights(body, path, retries=retries, backoff_s=backoff_s)
        if isinstance(result, dict) and result.get("success") is False:
            raise ServerRequestError(f"update_weights_from_disk failed: {result.get('message')}", status=400)
        self._weights_path = str(path)
        self._weights = WeightsHash(path)  # the new weights' content hash, for records and the cache
        info = _loop.run_sync(self._client.get_info("model", timeout=30))
        self._weight_version = info.get("weight_version", version)
        return str(self._weight_version)

    def _update_weights(self, body: dict[str, Any], path: str | os.PathLike[str], *, retries: int,
                        backoff_s: float) -> Any:
        """POST /update_weights_from_disk to the server, retrying transient failures."""
        for attempt in range(retries + 1):
            try:
                return _loop.run_sync(self._client.post("/update_weights_from_disk", body))
            except ServerRequestError as err:
                if err.status < 500 or attempt == retries:
                    raise ServerRequestError(f"update_weights_from_disk({str(path)!r}) failed: {err.body}",
                                             status=err.status, body=err.body) from None
            except RequestError:
                if attempt == retries or not self._server_alive():
                    raise
            time.sleep(backoff_s * 2**attempt)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _server_alive(self) -> bool:
        return self._server is None or self._server.alive()

    def release_memory(self, tags: Sequence[str] | None = None) -> None:
        """Release the server's GPU memory (KV cache, weights); generate() fails until resume_memory()."""
        self._check_ready()
        if not self._memory_saver:
            raise EngineError("release_memory() needs the server started with enable_memory_saver=True")
        body = {"tags": list(tags)} if tags else {}
        self._control("/release_memory_occupation", body, what="release_memory()")
        self._released = set(tags) if tags else {"weights", "kv_cache", "cuda_graph"}

    def resume_memory(self, tags: Sequence[str] | None = None, *, load: str | os.PathLike[str] | None = None,
                      weight_version: str | None = None) -> None:
        """Take the GPU memory back; weights released earlier are reloaded so outputs are unchanged.

        `load`: a checkpoint to load instead (`update_weights_from_disk(load, weight_version=)`):
        one load rather than reloading the old weights and then loading new ones, and the old
        checkpoint need not exist any more.
        """
        self._check_ready()
        body = {"tags": list(tags)} if tags else {}
        self._control("/resume_memory_occupation", body, what="resume_memory()")
        resumed = set(tags) if tags else self._released
        self._released = self._released - resumed
        if load is not None:
            self.update_weights_from_disk(load, weight_version=weight_version)
            return
        # SGLang's resume restores the weights' memory but not their values (greedy output comes back
        # empty; the CPU backend does the same). Reload them from disk, keeping the weight version,
        # so outputs are unchanged. The path and the version are the ones this Engine last loaded
        # (connect or update_weights_from_disk), one source for both.
        if "weights" in resumed:
            self._control("/update_weights_from_disk", {
                "model_path": self._weights_path or self.model_path,
                "weight_version": self._weight_version,
            }, what="resume_memory() reloading the weights")

    @contextlib.contextmanager
    def paused(self, *, load: str | os.PathLike[str] | None = None, weight_version: str | None = None
               ) -> Iterator[None]:
        """Free the server's GPU memory for the block (e.g. a training step), then take it back.

        `load`: the checkpoint the block writes (e.g. `policy.save_pretrained(path)`); leaving the
        block loads it in place of the old weights, as `weight_version` (one load, not a reload of
        the old weights plus `update_weights_from_disk`). If the block raises, the old weights come
        back instead.
        """
        self.release_memory()
        finished = False
        try:
            yield
            finished = True
        finally:
            if finished:
                self.resume_memory(load=load, weight_version=weight_version)
            else:
                self.resume_memory()

    def metrics(self) -> pd.DataFrame:
        """SGLang's Prometheus metrics as a DataFrame (name, labels, value); needs enable_metrics=True."""
        self._check_ready()
        if not self._metrics_enabled:
            raise EngineError("metrics() needs the Engine started with enable_metrics=True")
        import pandas as pd

        text = _loop.run_sync(self._client.get("/metrics", timeout=30))
        return pd.DataFrame(parse_prometheus(str(text)), columns=["name", "labels", "value"])


# ---------------------------------------------------------------------------------------------
# Helpers for construction


def _check_replicas(replicas: int, gpus: Sequence[int] | None, *, keep_alive: object, tp_size: int,
                    dp_size: int) -> list[dict[str, str]]:
    """Check `replicas=` / `gpus=` before anything starts; the per-worker env overrides (gpus)."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an int >= 1, got {replicas!r}")
    if gpus is not None and (isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence) or not gpus
                             or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)):
        raise ValueError(f"gpus must be a non-empty list of GPU indices, e.g. [0, 1], got {gpus!r}")
    if replicas == 1:
        if gpus is not None:
            raise ValueError("gpus= places replicas (replicas > 1); for one server set CUDA_VISIBLE_DEVICES in env=")
        return []
    if keep_alive is not None:
        raise ValueError("replicas > 1 cannot be combined with keep_alive yet: pass one of them")
    if gpus is not None and tp_size * dp_size != 1:
        raise ValueError("gpus= gives each replica one GPU, so tp_size and dp_size must be 1")
    _replicas.check_router_installed()
    return [{"CUDA_VISIBLE_DEVICES": str(gpus[i % len(gpus)])} if gpus is not None else {} for i in range(replicas)]


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _registry_kept_summary(pid: int) -> dict[str, Any] | None:
    from ..server._registry import kept_summary, read_kept

    state = read_kept(pid)
    return None if state is None else kept_summary(state, now=time.time())


def _is_loopback(host: str) -> bool:
    """Whether only this machine can reach a server bound to `host` (a name is looked up)."""
    import ipaddress
    import socket

    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback
                   for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP))
    except (OSError, ValueError):
        return False


def _reap_leftovers() -> None:
    from ..server._process import reap

    stopped = [r for r in reap() if r.get("action") == "stopped"]
    if stopped:
        pids = ", ".join(str(r["pid"]) for r in stopped)
        warnings.warn(f"rlgen stopped {len(stopped)} server(s) whose kernel had died (pid {pids})", stacklevel=3)


def _in_background(fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
    """Run `fn(*args)` in a daemon thread; the future holds its result or its exception."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as err:
            future.set_exception(err)

    threading.Thread(target=run, name="rlgen-tokenizer", daemon=True).start()
    return future


def _timed_load_tokenizer(tokenizer: Any, times: dict[str, float]) -> Any:
    t0 = time.monotonic()
    try:
        return _load_tokenizer(tokenizer)
    finally:
        times["tokenizer_s"] = time.monotonic() - t0


def _load_tokenizer(tokenizer: Any) -> Any:
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(tokenizer))
    except (OSError, ValueError) as err:
        raise EngineError(f"cannot load the tokenizer from {str(tokenizer)!r} ({err}); pass tokenizer= a local path") from err


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else (tokenizer.eos_token_id or 0))


def _close_client(client: Client) -> None:
    with contextlib.suppress(Exception):
        _loop.run_sync(client.aclose(), timeout=5)
