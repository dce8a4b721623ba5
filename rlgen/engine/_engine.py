"""The user-facing `Engine`: a thin face over its parts.

Owns: the public surface of `Engine` (every method, property and docstring a user sees), its
lifecycle state (`state`, `close`, the context manager) and which part each call goes to: the
server (`server._handle.ServerHandle`: owned, kept, a fleet behind a router, or attached), the
connection (`_connection.Connection`: client, server info, tokenizer), the served weights
(`_served.ServedWeights`), the adapters (`_adapter_choice.AdapterSet`), server control and memory
(`_memory.ServerControl`), the completion cache (`_generation.CachePolicy`) and the provenance of
results (`_provenance.Provenance`). The work is done in the modules of those parts and in
`_lifecycle` (construction, `info`), `_generation`, `_scoring`, `_weights`, `_adapters`,
`_episodes`, `_jobs` (background jobs, `submit`) and `_pause` (the server's generation paused
around a weight update while jobs run). Knows nothing about process signals, padding, SGLang's answer format or HTML: those
live in `rlgen.server`, `rlgen.client` and `rlgen.rollouts`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from typing_extensions import Unpack

from ..core import _loop, _options
from ..core._errors import EngineClosedError, EngineError
from ..core._options import EpisodeOptions, GenerateOptions, PauseOptions, StreamOptions, takes_options
from ..core._types import Prompt, Prompts
from ..server._handle import AttachedServer, Fleet, ServerHandle
from . import _adapters, _episodes, _generation, _jobs, _lifecycle, _scoring, _weights
from ._adapter_choice import Adapter, AdapterSet
from ._connection import Connection
from ._episodes import EpisodesJob
from ._jobs import GenerationJob, PartialRollouts
from ._lifecycle import EngineState
from ._memory import ServerControl
from ._pause import Pauses
from ._provenance import Provenance
from ._served import ServedWeights
from ._startup import close_client, in_background, reap_leftovers, timed_load_tokenizer
from ._weights import Pausing

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from ..client._http import Client
    from ..compare._logprobs import LogprobCheck
    from ..episodes import Episodes
    from ..rollouts._rollouts import Rollouts

__all__ = ["Engine", "EngineState"]

# A public method's `stacklevel` for warnings: the user's line is one frame up from it.
_USER = 2


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
            cache), so the notebook keeps the rest for its own torch work. None (default): 0.2 for
            the KV cache and activations plus the weights' own share (0.2 for a 135M model, ~0.3
            for 7B on an H200), so a large model keeps the cache a small one gets.
        fast_start: start a few seconds sooner: no prefill CUDA graphs and no warm-up request
            (decode graphs stay).
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
            own scheduler; tp_size x dp_size GPUs in all (CUDA_VISIBLE_DEVICES picks them).
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

    model: str                  # the served model's name
    model_path: str             # its checkout (as the server names it)
    backend: str                # "sglang", "cpu", or "remote" (Engine.connect)
    url: str                    # where requests go
    reattached: bool            # True when this Engine reattached to a kept server
    # Where the constructor's time went: tokenizer_s (loaded in a background thread while the
    # server starts), server_s (launch until healthy, or finding and attaching a kept server),
    # total_s (the constructor, end to end).
    start_times: dict[str, float]
    last_result: Rollouts | None         # the last generate()'s result, also when it was interrupted
    last_episodes: Episodes | None = None  # the last episodes()' result, also when it was interrupted

    _state: EngineState
    _server: ServerHandle
    _conn: Connection
    _weights: ServedWeights
    _adapters: AdapterSet
    _control: ServerControl
    _provenance: Provenance

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

        self._init_common(progress=progress, request_timeout=request_timeout, api_key=api_key, cache=cache)
        plan = _lifecycle.plan_launch(
            model, backend=backend, gpu_memory_fraction=gpu_memory_fraction, fast_start=fast_start,
            enable_memory_saver=enable_memory_saver, enable_metrics=enable_metrics, server_args=server_args,
            api_key=api_key, keep_alive=keep_alive, tp_size=tp_size, dp_size=dp_size, replicas=replicas, gpus=gpus,
            router_args=router_args, lora=lora)
        self.model, self.model_path, self.backend = plan.model, plan.model_path, plan.backend
        # Load the tokenizer and hash the weights while the server starts (a kernel's first
        # transformers import takes seconds). Stop servers left behind by dead kernels (their GPU
        # memory is ours to reuse), then start or reattach, showing one status line.
        t0 = time.monotonic()
        tokenizer = in_background(timed_load_tokenizer, plan.model_path, self.start_times)
        weights = ServedWeights(plan.model_path)
        reap_leftovers()
        line = PhaseLine(f"rlgen {self.backend} server", show=progress)
        started = _lifecycle.start_or_attach(
            plan, line=line, api_key=api_key, host=host, port=port, env=env, log_dir=log_dir,
            startup_timeout=startup_timeout, replicas=replicas, router_args=router_args, t0=t0)
        self._server, self._api_key, self.url = started.server, started.api_key, started.server.url
        self.reattached = started.reattached
        self.start_times["server_s"] = started.server_s
        try:
            self._connect(tokenizer, weights, memory_saver=enable_memory_saver, metrics_enabled=enable_metrics)
            if started.reattached:  # a kernel that died in a paused weight update left it paused
                Pauses.continue_after_attach(self._control)
        except BaseException:
            self._server.close(stop=not started.reattached)  # a reattached kept server is only detached
            if started.line_open:
                line.close(ok=False, message=started.failure)
            raise
        self.start_times["total_s"] = time.monotonic() - t0
        if started.line_open:
            line.close(ok=True, message=started.message)

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
        self.url = url.rstrip("/")
        self._server = AttachedServer(self.url)
        self.backend = "remote"
        model_info, behind_router = _lifecycle.probe(self.url, api_key=api_key)
        self.model_path = model_info.get("model_path", "")
        self.model = Path(self.model_path).name or self.model_path
        weights = ServedWeights(self.model_path, hashable=ServedWeights.is_local(self.model_path))
        # The server's choices: SGLang answers if it cannot release memory or has no metrics.
        self._connect(tokenizer if tokenizer is not None else (model_info.get("tokenizer_path") or self.model_path),
                      weights, memory_saver=True, metrics_enabled=True, model_info=model_info,
                      behind_router=behind_router)
        return self

    def _init_common(self, *, progress: bool | None, request_timeout: float | None, api_key: str | None,
                     cache: bool | str) -> None:
        """What every Engine holds before its server is known."""
        self._cache = _generation.CachePolicy(_options.cache_mode("cache", cache) or False)
        self._hints = _generation.CallWarnings()
        self._pauses = Pauses()
        self._state = EngineState.FAILED  # until _connect() succeeds
        self._progress = progress
        self._api_key = api_key
        self._request_timeout = request_timeout
        self.reattached = False
        self.start_times = {}
        self.last_result = None
        self.last_episodes = None
        self._gpu_memory_released: bool | None = None

    def _connect(self, tokenizer: Any, weights: ServedWeights, *, memory_saver: bool, metrics_enabled: bool,
                 model_info: Mapping[str, Any] | None = None, behind_router: bool | None = None) -> None:
        """Connect to `self._server` and build the parts; on failure `_state` stays FAILED."""
        fleet = self._server if isinstance(self._server, Fleet) else None
        conn, version = _lifecycle.open_connection(
            self.url, behind_router=fleet is not None if behind_router is None else behind_router,
            request_timeout=self._request_timeout, api_key=self._api_key,
            on_connection_error=self._on_connection_error, check_ready=self._check_ready, tokenizer=tokenizer,
            model_path=self.model_path, progress=self._progress, model_info=model_info,
            workers_alive=fleet.replicas.workers_alive if fleet is not None else None)
        weights.connected(version)
        self._conn, self._weights = conn, weights
        self._adapters = AdapterSet(conn.server_info)
        self._control = ServerControl(conn.client, memory_saver=memory_saver, metrics_enabled=metrics_enabled)
        self._provenance = Provenance(model=self.model, model_path=self.model_path, backend=self.backend,
                                      server_version=conn.server_info.get("version"), server=self._server,
                                      weights=weights, adapters=self._adapters)
        self._state = EngineState.READY
        self._finalizer = weakref.finalize(self, close_client, conn.client)

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        """READY, FAILED (the server died: create a new Engine) or CLOSED. Reading it changes nothing."""
        server = getattr(self, "_server", None)
        if self._state is EngineState.READY and server is not None and not server.alive():
            return EngineState.FAILED
        return self._state

    def _check_ready(self) -> None:
        state = self.state
        if state is EngineState.CLOSED:
            raise EngineClosedError("this Engine is closed; create a new one with rlgen.Engine(...)")
        if state is EngineState.FAILED:
            self._server.assert_alive()  # an owned server: ServerDiedError with exit code and log tail
            raise EngineError("this Engine's server has failed; create a new Engine")

    def _on_connection_error(self) -> None:
        if not self._server.alive():
            self._state = EngineState.FAILED
            self._server.assert_alive()

    def close(self, *, stop: bool = False) -> None:
        """Stop the server this Engine owns (never one it attached to). Idempotent.

        A kept server (`keep_alive=`) is only detached: its idle timer starts now; `stop=True`
        stops it at once.
        """
        if self._state is EngineState.CLOSED:
            return
        if self._state is EngineState.READY and self._pauses.jobs:
            with contextlib.suppress(Exception):
                self._pauses.close_jobs("the Engine was closed")  # their requests aborted before the client closes
        self._state = EngineState.CLOSED
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        server = getattr(self, "_server", None)
        if server is not None:
            server.close(stop=stop)
            self._gpu_memory_released = server.wait_gpu_memory_released(timeout=30)

    def __enter__(self) -> Engine:
        self._check_ready()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- introspection ---------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """The tokenizer this Engine encodes prompts and decodes tokens with."""
        return self._conn.tokenizer

    @property
    def context_length(self) -> int | None:
        """The server's context length (prompt + completion tokens), None where it says none."""
        return self._conn.context_length

    @property
    def _client(self) -> Client:
        """The HTTP client (the connection's)."""
        return self._conn.client

    @property
    def server_info(self) -> dict[str, Any]:
        """What the server said about itself at connection (SGLang's `/server_info`), as a copy."""
        return dict(self._conn.server_info)

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
        return self._server.log_path

    @property
    def info(self) -> dict[str, Any]:
        """Model, backend, versions, where the server is, its command line, and the GPU memory it holds.

        GPU memory, three ways: `gpu_memory_mib` (the driver's count for every process of this
        Engine's servers, all GPUs together), `gpu_memory_per_gpu` (the same per GPU, keyed by the
        driver's GPU index) and `memory_usage` (SGLang's own account per data-parallel rank:
        weights, KV cache, CUDA graphs in GB, as read when the Engine connected). The driver's
        counts are None where it lists none of the processes (CPU machines, some containers).
        """
        where = _lifecycle.engine_info(server=self._server, conn=self._conn, url=self.url,
                                       ready=self._state is EngineState.READY)
        return {"state": self.state.value, "model": self.model, "model_path": self.model_path,
                "backend": self.backend, "url": self.url, **where}

    def __repr__(self) -> str:
        server = getattr(self, "_server", None)
        where = server.describe() if server is not None else {"kind": None, "pid": None}  # no I/O
        text = (f"pid={where['pid']} " if where["pid"] is not None else "") + ("kept " if where["kind"] == "kept" else "")
        conn = getattr(self, "_conn", None)
        if conn is not None and conn.behind_router:
            text += "router "
        return f"<rlgen.Engine {self.model!r} backend={self.backend} {text}url={self.url} state={self.state.value}>"

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
        try:  # checked here, so a mistyped option's traceback is the caller's line and this one
            opts = _options.resolve(GenerateOptions, options)
        except (TypeError, ValueError) as err:
            raise err.with_traceback(None) from None
        call = self._prepare(prompts, options, resolved=opts, stacklevel=_USER + 1)
        try:
            _generation.send(self._conn, call)
        except BaseException:
            self.last_result = self._build(call, failed=True)
            raise
        self.last_result = self._build(call)
        return self.last_result

    @takes_options(GenerateOptions)
    async def agenerate(self, prompts: Prompts, /, **options: Unpack[GenerateOptions]) -> Rollouts:
        """`generate()` for `await` (e.g. at the top level of a notebook cell): the same options."""
        try:  # checked here, so a mistyped option's traceback is the caller's line and this one
            opts = _options.resolve(GenerateOptions, options)
        except (TypeError, ValueError) as err:
            raise err.with_traceback(None) from None
        call = self._prepare(prompts, options, resolved=opts, stacklevel=_USER + 1)
        try:
            await _generation.asend(self._conn, call)
        except BaseException:
            self.last_result = self._build(call, failed=True)
            raise
        self.last_result = self._build(call)
        return self.last_result

    @takes_options(StreamOptions)
    def stream(self, prompt: Prompt, /, **options: Unpack[StreamOptions]) -> Iterator[str]:
        """Yield the text of one prompt's completion piece by piece, as it is generated.

        Takes the sampling options of generate(); one prompt, one sample. Breaking out of the loop
        aborts the request on the server.
        """
        try:  # checked here, so a mistyped option's traceback is the caller's line and this one
            opts = _options.resolve(StreamOptions, options)
        except (TypeError, ValueError) as err:
            raise err.with_traceback(None) from None
        payload = _generation.stream_payload(self._conn, self._adapters, prompt, opts, stacklevel=_USER + 1)
        return _loop.iterate(_generation.text_pieces(self._conn, payload))

    def _prepare(self, prompts: Prompts, options: Mapping[str, Any], *, resolved: dict[str, Any] | None = None,
                 stacklevel: int = _USER) -> _generation.Call:
        """A generate() call checked and prepared (nothing sent yet). `resolved`: the options already checked."""
        opts = _options.resolve(GenerateOptions, options) if resolved is None else resolved
        return _generation.prepare(self._conn, self._adapters, self._cache, self._weights, self._hints, prompts,
                                   opts, stacklevel=stacklevel + 1)

    def _build(self, call: _generation.Call, *, failed: bool = False) -> Rollouts:
        return _generation.build(self._conn, self._adapters, self._provenance, self._cache, call, failed=failed,
                                 weights=self._weights)

    # -- background jobs -------------------------------------------------------------------------
    @takes_options(GenerateOptions)
    def submit(self, prompts: Prompts | PartialRollouts, /, **options: Unpack[GenerateOptions]) -> GenerationJob:
        """Start generating in the background; returns a `GenerationJob` at once (the cell is free).

        Takes generate()'s prompts and options (checked before anything is sent; not `stream=`
        or `cache=`), or a `PartialRollouts` (`job.partial`) to go on with. While it runs, other
        calls work, among them `update_weights(...)` / `update_weights_from_disk(...)` /
        `load_adapter(...)`: they pause the server's generation (`pause=`, default "abort"), push,
        and continue it; a sample the pause ended goes on as the same sequence under the new
        weights, and every token records the version index that sampled it (`res.versions`,
        the columns `version_min`, `version_max`, `staleness`, `n_segments`, `kv_staleness`).

        `job.result()` returns the rows (`min_done=0.8`: once 80% of the prompt groups are done;
        `rest="recycle"`: the rest stopped and handed back in `job.partial`), `job.done()`,
        `job.progress`, `job.cancel()`. docs/generation.md, "Jobs that span a weight update".

        Raises:
            TypeError / ValueError: bad prompts or options (nothing was sent).
        """
        try:  # checked here, so a mistyped option's traceback is the caller's line and this one
            if not isinstance(prompts, PartialRollouts):
                _options.resolve(GenerateOptions, options)
        except (TypeError, ValueError) as err:
            raise err.with_traceback(None) from None
        self._check_ready()
        return _jobs.submit(self._job_parts, self._cache, self._hints, prompts, options, stacklevel=_USER + 1)

    @property
    def _job_parts(self) -> _jobs.JobParts:
        return _jobs.JobParts(conn=self._conn, adapters=self._adapters, pauses=self._pauses, weights=self._weights,
                              provenance=self._provenance)

    @property
    def version_index(self) -> int:
        """The served weights' version index: 0 for those this Engine started with, +1 for every
        change this Engine made (a weight update, a reload, an adapter replaced). Background jobs
        label each sampled token with it (`res.versions`)."""
        return self._weights.index

    def _pausing(self, pause: str | None) -> Pausing:
        """An update's pause, checked before anything is sent (`core._options.PauseOptions`)."""
        try:
            mode = _options.resolve(PauseOptions, {"pause": pause})["pause"]
        except (TypeError, ValueError) as err:
            raise err.with_traceback(None) from None
        return functools.partial(self._pauses.pausing, mode, control=self._control, weights=self._weights)

    # -- scoring ---------------------------------------------------------------------------------
    def score(self, prompts: Prompts | Rollouts, completions: Sequence[str] | Sequence[Sequence[int]] | None = None,
              *, adapter: str | Sequence[str | None] | EllipsisType | None = ..., progress: bool | None = None) -> Rollouts:
        """Logprobs of given tokens under the model (one prefill each, no sampling).

        `adapter`: the LoRA adapter to score under, or one per prompt/row (None = the base model).
        Default: a `Rollouts`' rows under the adapter each was sampled with (its `adapter` column),
        prompts under the base model; `adapter=None` re-scores any rows under the base model. A
        name means the adapter loaded under it now: rows sampled with an earlier load of "policy"
        are scored under the latest (their `res.record["adapters"]` says which load made them).

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
        return _scoring.score(self._conn, self._adapters, prompts, completions, model=self.model, adapter=adapter,
                              progress=progress)

    def check_logprobs(self, rollouts: Rollouts, *, max_diff: float | None = None, mean_diff: float | None = None,
                       progress: bool | None = None) -> LogprobCheck:
        """Re-score the rollouts' own tokens (`score(rollouts)`) and compare with their sampled logprobs.

        Returns a `LogprobCheck` that answers two questions apart: `aligned` (no more than 1% of
        tokens off by more than `max_diff`: catches an off-by-one or another model, which are off
        by nats) and `weights_match` (mean |diff| within `mean_diff`, the backend's rounding noise:
        weights that differ by less than that noise cannot be told apart). The default bounds are
        float rounding on the CPU backend (float32) and bf16 rounding on SGLang (docs/decisions.md,
        "check_logprobs"); pass `max_diff=` / `mean_diff=` to choose.

        Sampled logprobs are comparable with a re-score only when they come from raw logits:
        SGLang reports `log_softmax(logits / temperature)` after penalties and logit bias (and
        before top-p/top-k/min-p filtering, so those do not matter), while a re-score uses the raw
        logits. Rollouts sampled at a temperature other than 1 (greedy counts as 1), or with
        penalties, are therefore not re-scored, and the verdict says why.
        """
        return _scoring.check_logprobs(self._conn, self._adapters, rollouts, model=self.model, max_diff=max_diff,
                                       mean_diff=mean_diff, progress=progress)

    # -- episodes --------------------------------------------------------------------------------
    @takes_options(EpisodeOptions)
    def episodes(self, prompts: Any, *, env: Any, **options: Unpack[EpisodeOptions]) -> Episodes:
        """Run `n` multi-turn episodes per prompt, concurrently; returns `Episodes`, a `Rollouts`
        with a row per episode (`.df`; `.turns` a row per turn; `.tensors()` with `loss_mask`,
        `turn_ids` and `roles`; `.check_drift()`; rewards, parquet, the view as for `generate`).

        Each assistant turn is sampled token in, token out: the next request is the previous ids
        plus the chat template's delta for the environment's new messages, sent as `input_ids`, so
        the history is never re-tokenized and the server's prefix cache serves it.

        Args:
            prompts: a chat, a str, or a list of them (a str is one user message).
            env: a function `env(messages, data)` (sync or async) returning the next message(s)
                (a str, a message dict, a list of them) or None / "done"; a class with
                `reset(data)` / `step(messages)` (one instance per episode) or a factory of such
                objects; or `rlgen.episodes.tool_env(tools)` (or a list of tool functions).

        The options (below) are generate()'s sampling parameters, per assistant turn (`seed=`, or
        its SGLang name `sampling_seed=`: episode j of a prompt draws with seed + j), and the
        episodes' own; every one is checked before anything is sent.

        Raises:
            TypeError / ValueError: bad prompts, env, data or options, or a chat template that does
                not compile (nothing was sent).
            KeyboardInterrupt: Ctrl-C; in-flight requests were aborted on the server, and
                `eng.last_episodes` holds every episode (the unfinished ones "cancelled").
        """
        try:  # checked here, so a mistyped option's traceback is the caller's line and this one
            opts = _options.resolve(EpisodeOptions, options)
        except (TypeError, ValueError) as err:
            raise err.with_traceback(None) from None
        return _episodes.episodes(self._conn, self._provenance, self._weights, self._keep_episodes, prompts,
                                  env=env, opts=opts)

    def submit_episodes(self, prompts: Any, *, env: Any, **options: Unpack[EpisodeOptions]) -> EpisodesJob:
        """Start `episodes(prompts, env=env, **options)` in the background; returns an `EpisodesJob`
        at once: `job.result(timeout=None)` (the `Episodes`), `job.done()`, `job.cancel()`,
        `job.progress` (episodes ended / total, turns, tokens, updates).

        While it runs, `update_weights(...)` / `update_weights_from_disk(...)` / `load_adapter(...)`
        pause the server's generation (`pause=`, default "abort" while it runs), push, and continue;
        a turn whose request the pause ended goes on as the same sequence (its tokens so far sent
        as ids with the rest of its budget): no turn is cut short, no token sampled twice.
        docs/generation.md, "Jobs that span a weight update".

        Raises:
            TypeError / ValueError: bad prompts, env, data or options (nothing was sent).
        """
        try:  # checked here, so a mistyped option's traceback is the caller's line and this one
            opts = _options.resolve(EpisodeOptions, options)
        except (TypeError, ValueError) as err:
            raise err.with_traceback(None) from None
        return _episodes.submit_episodes(self._job_parts, self._keep_episodes, prompts, env=env, opts=opts)

    def _keep_episodes(self, episodes: Episodes) -> None:
        self.last_episodes = episodes

    # -- weights ---------------------------------------------------------------------------------
    def update_weights_from_disk(self, path: str | os.PathLike[str], *, weight_version: str | None = None,
                                 retries: int = 3, backoff_s: float = 1.0, pause: str | None = None) -> str:
        """Load new weights from a checkout on the server's disk; returns the new weight version.

        Retries transient failures (connection errors, HTTP 5xx/503) with backoff; a rejected path
        (HTTP 400) fails at once. The version defaults to "<dir name>@<n>" so rows stay traceable.
        Behind a router every worker loads it, at once; if some fail, WorkerRequestError names them.

        `pause`: "abort", "retract" or "in_place": the server's generation is paused around the
        load and continued after it, also when it fails or Ctrl-C stops it (None: "abort" while a
        background job runs, else no pause; see `eng.submit` and docs/generation.md).
        """
        pausing = self._pausing(pause)
        return _weights.from_disk(self._conn, self._control, self._weights, self._server, path,
                                  weight_version=weight_version, retries=retries, backoff_s=backoff_s, pausing=pausing)

    def update_weights(self, weights: torch.nn.Module | Mapping[str, Any] | Iterable[tuple[str, Any]], *,
                       weight_version: str | None = None, bucket_mb: float | None = None, flatten: bool = False,
                       retries: int = 3, backoff_s: float = 1.0, progress: bool | None = None,
                       pause: str | None = None) -> str:
        """Load the trainer's weights into the server from memory; returns the new weight version.

        `weights`: a transformers `PreTrainedModel` (or any torch module whose `state_dict()` has
        the checkpoint's names), its `state_dict()`, or (name, tensor) pairs; a subset of the
        tensors updates those only. Wrapper names are undone (torch.compile, DDP, PEFT); LoRA
        weights must be merged first (`model.merge_adapter()`); a head tied to the embedding is
        not sent. Names and shapes are checked against the served checkpoint before anything is
        sent (WeightsError: nothing changed).

        On SGLang the tensors stay where they are: the server maps their GPU memory (CUDA IPC),
        so they must be on the server's GPU, in this machine; otherwise save them and use
        `update_weights_from_disk`. The CPU backend gets them by value. Don't change them until
        the call returns.

        `bucket_mb`: tensors per request, by size (None: 512 MiB by CUDA IPC, 64 MiB by value): what
        a request costs in extra memory (by value:
        CPU copies and their encoding; `flatten=True`: one flat copy of the bucket on the GPU,
        SGLang's "flattened_bucket" format, one IPC handle per bucket instead of one per tensor).
        The prefix cache is flushed, and `weight_version` (default "tensors@<n>") set, with the
        last request; rows record it. A failure after some requests leaves a mix of weights (the
        message says so). Retries transient failures (5xx, lost connections) like
        `update_weights_from_disk`. Inside `with eng.paused():` the weights' memory comes back
        first, and the old weights are reloaded from disk under a push that does not cover
        every tensor; the rest of the memory comes back when the block ends.

        `pause`: "abort", "retract" or "in_place": after the checks, the server's generation is
        paused around the push and continued after it, also when it fails or Ctrl-C stops it
        (None: "abort" while a background job runs, else no pause). Under "retract" and
        "in_place" the prefix cache is not flushed (SGLang 0.5.17's scheduler dies on a flush with
        requests queued): it keeps prefixes the old weights computed. See `eng.submit` and
        docs/generation.md ("Jobs that span a weight update").
        """
        pausing = self._pausing(pause)
        return _weights.from_tensors(self._conn, self._control, self._weights, self._server, weights, url=self.url,
                                     weight_version=weight_version, bucket_mb=bucket_mb, flatten=flatten,
                                     retries=retries, backoff_s=backoff_s, progress=progress, pausing=pausing)

    # -- memory and server control ---------------------------------------------------------------
    def flush_cache(self) -> None:
        """Drop the server's prefix (radix) cache. SGLang refuses while requests are running."""
        self._check_ready()
        self._control.flush_cache()
        self._pauses.flushed()

    def release_memory(self, tags: Sequence[str] | None = None) -> None:
        """Release the server's GPU memory (KV cache, weights); generate() fails until resume_memory().

        Raises:
            EngineError: a background job (`submit`, `submit_episodes`) is running: its requests
                would fail once the memory is gone; wait for it (`job.result()`) or `job.cancel()`.
        """
        self._check_ready()
        if self._pauses.jobs:
            raise EngineError(f"{len(self._pauses.jobs)} background job(s) are running (eng.submit / "
                              "eng.submit_episodes): releasing the memory would fail their requests; wait for "
                              "them (job.result()) or cancel them (job.cancel()) first")
        self._control.release(tags)

    def resume_memory(self, tags: Sequence[str] | None = None, *, load: str | os.PathLike[str] | None = None,
                      weight_version: str | None = None) -> None:
        """Take the GPU memory back; weights released earlier are reloaded so outputs are unchanged.

        `load`: a checkpoint to load instead (`update_weights_from_disk(load, weight_version=)`):
        one load rather than reloading the old weights and then loading new ones, and the old
        checkpoint need not exist any more.

        Weights pushed from tensors (`update_weights`) are not on disk: a reload brings back the
        checkpoint loaded before them, under its version. Push inside `paused()` to avoid that.
        """
        self._check_ready()
        resumed = self._control.resume(tags)
        if load is not None:
            self.update_weights_from_disk(load, weight_version=weight_version)
        elif "weights" in resumed:
            # SGLang's resume restores the weights' memory but not their values (greedy output comes
            # back empty; the CPU backend does the same): reload them from disk, under their version.
            _weights.reload_from_disk(self._control, self._weights, "resume_memory() reloading the weights")

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
        return self._control.metrics()

    # -- adapters --------------------------------------------------------------------------------
    @property
    def adapters(self) -> dict[str, Adapter]:
        """The LoRA adapters the server holds, by name (a copy): where each came from, its rank and
        content hash. Empty when the server serves no adapters (see `Engine(lora=...)`)."""
        return dict(self._adapters.by_name)

    @property
    def serves_lora(self) -> bool:
        """Whether the server was started with LoRA serving (`Engine(lora=...)`)."""
        return self._adapters.serves_lora

    def load_adapter(self, name: str, adapter: Any, *, adapter_name: str = "default", pinned: bool = False,
                     pause: str | None = None) -> Adapter:
        """Load a LoRA adapter into the server under `name`; `generate(..., adapter=name)` then samples with it.

        `adapter`: a directory PEFT's `save_pretrained` wrote (the server reads it: it must be on the
        server's machine), or a PEFT model in memory (`peft.PeftModel`; `adapter_name` picks one of
        its adapters): its LoRA tensors go to the server without disk, by CUDA IPC when they are on
        the server's GPU, else by value (an adapter is small). A name already loaded is replaced (e.g.
        the adapter after another training step). `pinned`: SGLang keeps it in GPU memory.

        The server must serve LoRA (`Engine(lora=True)` or `lora={...}`), with a `max_rank` and
        `target_modules` that cover the adapter; AdapterError says what to change otherwise, before
        anything is sent. Returns what the Engine records about it (also in `eng.adapters`).

        `pause`: "abort" pauses the server's generation around the load (None: "abort" while a
        background job runs, else no pause); replacing an adapter counts one more version index.
        Not "retract" / "in_place": SGLang unloads an adapter once the requests that use it end,
        and such a pause holds them.
        """
        if pause in ("retract", "in_place"):
            raise ValueError(f"load_adapter() takes pause='abort' or None, not {pause!r}: the old adapter is unloaded "
                             "once the requests that use it end, and that pause holds them")
        return _adapters.load_adapter(self._conn, self._control, self._adapters, self._server, name, adapter,
                                      adapter_name=adapter_name, pinned=pinned, weights=self._weights,
                                      pausing=self._pausing(pause))

    def unload_adapter(self, name: str) -> None:
        """Remove adapter `name` from the server (SGLang waits for the requests that use it)."""
        _adapters.unload_adapter(self._conn, self._control, self._adapters, name)
