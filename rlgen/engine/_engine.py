"""The user-facing `Engine`: one server (owned, kept, a fleet behind a router, or attached to) and its client.

Owns: construction (`Engine(...)`: launch, reattach to a kept server, or `replicas=` behind an
sglang-router; `Engine.connect(url)`), the client and tokenizer it connects with, its lifecycle
(`close`, context manager, state) and introspection (`info`, reprs). Its calls come from mixins,
one module per job: generation (`_generation`), scoring (`_scoring`), server control
(`_control`), weights pushed from tensors (`_weights`), over the shared state in `_base`. Knows
nothing about process signals, padding, SGLang's response format or HTML: those live in
`rlgen.server`, `rlgen.client` and `rlgen.rollouts`.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..client import _router
from ..client._http import Client
from ..core import _loop, _options
from ..core._errors import RequestError
from ..rollouts._token_text import TokenText
from ..server import _info as _server_info
from ..server import _keep_alive, _replicas
from ..server._command import choose_backend, memory_fraction, server_argv
from ..server._models import resolve_model
from ..server._process_tree import gpu_total_mib
from ..server._weights import WeightsHash
from ._adapter_choice import adapters_at_start
from ._adapters import AdaptersMixin
from ._base import EngineState
from ._episodes import EpisodesMixin
from ._generation import GenerationMixin
from ._scoring import ScoringMixin
from ._startup import (
    check_replicas,
    close_client,
    duration,
    in_background,
    is_loopback,
    load_tokenizer,
    reap_leftovers,
    registry_kept_summary,
    timed_load_tokenizer,
)

if TYPE_CHECKING:

    from ..client._completion_cache import CompletionCache
    from ..rollouts._rollouts import Rollouts
    from ..server._process import ServerProcess

__all__ = ["Engine", "EngineState"]

class Engine(GenerationMixin, ScoringMixin, EpisodesMixin, AdaptersMixin):
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
            cache), so the notebook keeps the rest for its own torch work. None (default): 0.2 for
            the KV cache and activations plus the weights' own share (0.2 for a 135M model, ~0.3
            for 7B on an H200), so a large model keeps the cache a small one gets.
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
        router_args: with replicas > 1: sglang-router flags, as a dict like `server_args`
            (`{"retry_max_retries": 20}` -> `--retry-max-retries 20`; True -> a bare flag; None or
            False drops one of rlgen's defaults). They go over rlgen's defaults for the router's
            health checks and retries, `health_check_interval_secs=1`, `health_failure_threshold=1`,
            `retry_max_retries=10` (sglang-router's own: 60, 3, 5), so that the requests of a
            server that dies are retried on a live one (docs/scale-out.md). A request whose server
            died and that the router could not place is sent again by rlgen (up to 3 times, while
            another server runs). Not the flags rlgen sets itself (worker URLs, policy, host, port, API key).
        lora: serve LoRA adapters (SGLang's `--enable-lora`): True for the defaults, or a dict of
            `rlgen.LoraOptions`: `max_rank` (16), `target_modules` ('all' linear layers, or names),
            `max_loras_per_batch` (8, the base model counted), `adapters` ({name: PEFT directory}
            loaded at start). Then `eng.load_adapter(name, peft_model_or_directory)` and
            `generate(..., adapter=name)`; the adapters' memory is reserved at start. None: no LoRA.
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
        gpu_memory_fraction: float | None = None,
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
        router_args: Mapping[str, Any] | None = None,
        lora: bool | Mapping[str, Any] | None = None,
    ) -> None:
        from ..core._progress import PhaseLine
        from ..server._process import launch_server

        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise ValueError("api_key must be a non-empty string or None")
        worker_env = check_replicas(replicas, gpus, keep_alive=keep_alive, tp_size=tp_size, dp_size=dp_size,
                                    router_args=router_args)
        keep_s = None if keep_alive is None else _keep_alive.parse_duration(keep_alive)
        self._init_common(progress=progress, request_timeout=request_timeout, api_key=api_key, cache=cache)
        self._server: ServerProcess | None = None
        if gpu_memory_fraction is not None and (isinstance(gpu_memory_fraction, bool)
                                                or not isinstance(gpu_memory_fraction, (int, float))
                                                or not 0 < gpu_memory_fraction <= 1):
            raise ValueError(f"gpu_memory_fraction must be in (0, 1] or None (rlgen's default), got {gpu_memory_fraction!r}")
        # 1) What to serve, and with which backend.
        resolved = resolve_model(model)
        self.model, self.model_path = resolved.name, resolved.path
        self.backend = choose_backend(backend)
        if gpu_memory_fraction is None:
            gpu_total = gpu_total_mib() if self.backend == "sglang" else None
            gpu_memory_fraction = memory_fraction(resolved.path, gpu_total_mib=gpu_total, tp_size=tp_size)
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
            lora=_options.lora_options(lora),
        )
        # 2) Load the tokenizer while the server starts (a kernel's first transformers import takes
        #    seconds). Stop servers left behind by dead kernels (their GPU memory is ours to reuse),
        #    then launch and wait for a real one-token generation, showing one status line.
        t0 = time.monotonic()
        tokenizer = in_background(timed_load_tokenizer, resolved.path, self.start_times)
        self._weights = WeightsHash(resolved.path)  # for records and the cache; read while the server starts
        reap_leftovers()
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
        if api_key is None and not is_loopback(host):
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
                                  log_dir=log_dir, startup_timeout=startup_timeout, api_key=api_key,
                                  router_args=router_args)
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
            notes.insert(0, f"kept {duration(keep_s)} after its last use")
        else:
            self._server = server
        line.close(ok=True, message="; ".join(["ready", *notes]))
        # 3) Client, tokenizer and what the server says about itself.
        try:
            self._connect(tokenizer=tokenizer)
        except BaseException:
            self._state = EngineState.FAILED
            if self._kept is not None:
                _keep_alive.stop(self._kept)
            server.close()
            raise
        self.start_times["total_s"] = time.monotonic() - t0

    def _launch_replicas(self, argv: list[str], replicas: int, worker_env: list[dict[str, str]], *, line: Any,
                         notes: list[str], host: str, port: int | None, env: Mapping[str, str] | None,
                         log_dir: str | os.PathLike[str] | None, startup_timeout: float, api_key: str | None,
                         router_args: Mapping[str, Any] | None) -> None:
        """`replicas` servers and a router in front (rlgen.server._replicas); this Engine talks to the router."""
        try:
            fleet = _replicas.launch_replicas(
                argv, replicas, concurrent_start=self.backend == "cpu", host=host, port=port, env=env,
                worker_env=worker_env,
                log_dir=log_dir, startup_timeout=startup_timeout, api_key=api_key, router_args=router_args,
                on_phase=line.update)
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
            self._connect(tokenizer=tokenizer)
        except BaseException:
            self._state = EngineState.FAILED
            if self._replicas is not None:
                self._replicas.close()
            raise
        if isinstance(self._client, _router.RouterClient) and self._replicas is not None:
            # Ours: rlgen sees the workers' processes, so it may re-send what a dead one dropped.
            self._client.workers_alive = self._replicas.workers_alive
            self._client.resend_limit = _router.OWNED_RESEND_LIMIT
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
            self._connect(tokenizer=tokenizer)
            self.start_times["total_s"] = time.monotonic() - t0
        except BaseException:
            self._state = EngineState.FAILED
            _keep_alive.detach(self._kept)
            line.close(ok=False, message=f"could not reattach to kept server pid {kept.pid}")
            raise
        line.close(ok=True, message="; ".join([f"reattached to pid {kept.pid} (idle {duration(idle)})", *notes]))

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
        self._weights_pushed: str | None = None  # the version pushed from tensors, while the server serves it
        self._disk_version: str | None = None    # the version the weights at _weights_path had before that push
        self._released: set[str] = set()      # memory tags released and not yet resumed
        self._behind_router = False           # connect() to an sglang-router: see rlgen.client._router
        self._replicas = None
        self._adapters = {}                   # LoRA adapters the server holds, by name (engine._adapters)
        self._adapter_loads: dict[str, int] = {}  # loads per adapter name

    def _connect(self, *, tokenizer: Any) -> None:
        """Client, server info and tokenizer (an object, a path, or the future of the one loading in a
        thread: the server is asked first, so that the first request's imports, aiohttp's, overlap
        the tokenizer's load instead of following it)."""
        client_type = _router.RouterClient if self._behind_router else Client
        self._client = client_type(self.url, request_timeout=self._request_timeout,
                                   on_connection_error=self._on_connection_error, api_key=self._api_key)
        try:
            self._server_info = _loop.run_sync(self._client.get_info("server", timeout=60))
            self._weight_version = _loop.run_sync(self._client.get_info("model", timeout=60)).get("weight_version")
            self._adapters = adapters_at_start(self._server_info)
            if isinstance(tokenizer, concurrent.futures.Future):
                tokenizer = tokenizer.result()
            self.tokenizer = load_tokenizer(tokenizer)
        except BaseException:
            close_client(self._client)  # its session is open now: no "unclosed session" at exit
            raise
        self._token_text = TokenText(self.tokenizer)  # each result's decode: token text for its view
        self._vocab_size = len(self.tokenizer)  # once: some tokenizers rebuild the vocabulary for len()
        self.context_length = _server_info.context_length(self._server_info, self.tokenizer, self.model_path)
        self._state = EngineState.READY
        self._finalizer = weakref.finalize(self, close_client, self._client)

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
            info["kept"] = registry_kept_summary(kept.pid)
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
                w["router_healthy"] = w["healthy"]  # the router's flag: stale until its next health check
                w.update(by_url.get(w["url"], {}))
            info["workers"] += [{**w, "healthy": None, "router_healthy": None}
                                for url, w in by_url.items() if url not in {x["url"] for x in info["workers"]}]
            for w in info["workers"]:  # what rlgen sees: a dead process is unhealthy, whatever the router says
                alive = w.pop("alive", None)
                if alive is False:
                    w["healthy"] = False
        return info

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
