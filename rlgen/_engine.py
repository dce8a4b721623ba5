"""The user-facing `Engine`: one server (owned or attached), its client, and the generate API.

Owns: composing a server process (`_server`), an HTTP client (`_client`), the background loop
(`_loop`), prompt normalisation (`_prompts`), the sampling schema (`_sampling`) and the generate
core (`_generate`) into the object a notebook user holds; its lifecycle state; its server-control
methods. Knows nothing about process signals, padding or HTML: those live in their own modules.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import json
import os
import queue
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeGuard

from . import _loop
from ._client import Client, parse_prometheus
from ._errors import EngineClosedError, EngineError, RequestError, ServerRequestError
from ._generate import GenerateJob, chunks_to_fill, new_rid, run_generate
from ._launch import DEFAULT_GPU_MEMORY_FRACTION, choose_backend, server_argv
from ._models import resolve_model
from ._prompts import normalize_prompts
from ._sampling import SAMPLING_NAMES, Sampling, check_unknown_options

__all__ = ["Engine", "EngineState"]

# generate()'s options that are not sampling parameters, with generate()'s defaults (agenerate and
# stream pass them through **options).
_GENERIC_DEFAULTS: dict[str, Any] = {
    "n": 1, "logprobs": True, "top_logprobs": 0, "stream": False, "sampling_params": None, "chunk_size": 256,
    "max_in_flight": None,
}  # fmt: skip

class EngineState(enum.Enum):
    STARTING = "starting"  # the server is being launched
    READY = "ready"        # generate() works
    FAILED = "failed"      # the server died; create a new Engine
    CLOSED = "closed"      # close() was called


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
        progress: show progress (start-up line, generate bars): True, False, None = auto.
        host, port: where the server listens (loopback and a free port by default).
        log_dir: directory for the server log (default under ~/.cache/rlgen/servers/).
        env: environment variables for the server process.
    """

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
    ) -> None:
        from ._display import PhaseLine
        from ._server import launch_server

        self._init_common(progress=progress, request_timeout=request_timeout)
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
        )
        # 2) Load the tokenizer while the server starts (a kernel's first transformers import took
        #    13 s on the lent H200). Stop servers left behind by dead kernels (their GPU memory is
        #    ours to reuse), then launch and wait for a real one-token generation, showing one
        #    status line.
        tokenizer = _in_background(_load_tokenizer, resolved.path)
        _reap_leftovers()
        line = PhaseLine(f"rlgen {self.backend} server", show=progress)
        try:
            self._server = launch_server(
                argv, host=host, port=port, env=env, log_dir=log_dir,
                startup_timeout=startup_timeout, on_phase=line.update,
            )
        except BaseException:
            self._state = EngineState.FAILED
            line.close(ok=False)
            raise
        line.close(ok=True)
        self.url = self._server.url
        # 3) Client, tokenizer and what the server says about itself.
        try:
            self._connect(tokenizer=tokenizer.result())
        except BaseException:
            self._state = EngineState.FAILED
            self._server.close()
            raise

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        tokenizer: Any = None,
        request_timeout: float | None = None,
        progress: bool | None = None,
    ) -> Engine:
        """Attach to a running SGLang server (remote, multi-node, a router). close() never stops it.

        Args:
            url: the server's base URL, e.g. "http://10.0.0.5:30000".
            tokenizer: a tokenizer object or a local path for it; default: the server's
                `tokenizer_path` (must exist on this machine).
        """
        self = cls.__new__(cls)
        self._init_common(progress=progress, request_timeout=request_timeout)
        self._server = None
        self.url = url.rstrip("/")
        self.backend = "remote"
        self._memory_saver = True  # the server's choice; SGLang answers if it cannot
        self._metrics_enabled = True
        probe = Client(self.url)
        try:
            info = _loop.run_sync(probe.get_info("model", timeout=30))
        finally:
            _loop.run_sync(probe.aclose())
        self.model_path = info.get("model_path", "")
        self.model = Path(self.model_path).name or self.model_path
        self._connect(tokenizer=tokenizer if tokenizer is not None else (info.get("tokenizer_path") or self.model_path))
        return self

    def _init_common(self, *, progress: bool | None, request_timeout: float | None) -> None:
        self._state = EngineState.STARTING
        self._progress = progress
        self._request_timeout = request_timeout
        self.last_result: Any = None  # the last generate()'s Rollouts, also when it was interrupted
        self._weight_updates = 0
        self._weights_path: str | None = None  # where the served weights were last loaded from
        self._released: set[str] = set()      # memory tags released and not yet resumed

    def _connect(self, *, tokenizer: Any) -> None:
        self._client = Client(self.url, request_timeout=self._request_timeout, on_connection_error=self._on_connection_error)
        self.tokenizer = _load_tokenizer(tokenizer)
        self._vocab_size = len(self.tokenizer)  # once: some tokenizers rebuild the vocabulary for len()
        self._server_info = _loop.run_sync(self._client.get_info("server", timeout=60))
        self.context_length = _context_length(self._server_info, self.tokenizer, self.model_path)
        self._state = EngineState.READY
        self._finalizer = weakref.finalize(self, _close_client, self._client)

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        if self._state is EngineState.READY and self._server is not None and not self._server.alive():
            self._state = EngineState.FAILED
        return self._state

    @property
    def log_path(self) -> str | None:
        """The server's log file (None for a server this Engine attached to)."""
        return str(self._server.log_path) if self._server is not None else None

    def close(self) -> None:
        """Stop the server this Engine owns (never one it attached to). Idempotent."""
        if self._state is EngineState.CLOSED:
            return
        self._state = EngineState.CLOSED
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        if getattr(self, "_server", None) is not None:
            self._server.close()
            self._gpu_memory_released = self._server.wait_gpu_memory_released(timeout=30)

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
        """Model, backend, versions, where the server is, and the GPU memory it holds."""
        from . import __version__

        server = self._server
        return {
            "state": self.state.value,
            "model": self.model,
            "model_path": self.model_path,
            "backend": self.backend,
            "url": self.url,
            "pid": server.pid if server is not None else None,
            "port": server.port if server is not None else None,
            "log_path": self.log_path,
            "context_length": self.context_length,
            "server_version": self._server_info.get("version"),
            "rlgen_version": __version__,
            "gpu_memory_mib": _gpu_memory_mib(server.pids()) if server is not None else None,
        }

    def __repr__(self) -> str:
        where = f"pid={self._server.pid} " if getattr(self, "_server", None) is not None else ""
        return f"<rlgen.Engine {self.model!r} backend={self.backend} {where}url={self.url} state={self.state.value}>"

    def _repr_html_(self) -> str:
        from ._display import engine_html

        return engine_html(self)

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Any,
        *,
        n: int = 1,
        max_new_tokens: int = 128,
        min_new_tokens: int = 0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        stop: str | Sequence[str] | None = None,
        stop_token_ids: Sequence[int] | None = None,
        ignore_eos: bool = False,
        seed: int | None = None,
        logprobs: bool = True,
        top_logprobs: int = 0,
        stream: bool = False,
        sampling_params: Mapping[str, Any] | None = None,
        chunk_size: int = 256,
        max_in_flight: int | None = None,
        progress: bool | None = None,
        **unknown: Any,
    ) -> Any:
        """Generate `n` samples for each prompt; returns a `Rollouts` (a row per sample).

        Args:
            prompts: a string, a list of strings, a list of token-id lists, one chat (a list of
                {"role", "content"} messages) or a list of chats (rendered with the model's chat
                template).
            n: samples per prompt.
            max_new_tokens, min_new_tokens, temperature, top_p, top_k, min_p, repetition_penalty,
            stop, stop_token_ids, ignore_eos: SGLang's sampling parameters (temperature=0: greedy).
            seed: per-request sampling seed (SGLang: honoured with --enable-deterministic-inference).
            logprobs: return the logprob of every generated token.
            top_logprobs: also return the k most likely tokens at every position.
            stream: stream over SSE, to measure time-to-first-token and inter-token latency.
            sampling_params: further SGLang sampling parameters, sent as they are.
            chunk_size: prompts per batched /generate request.
            max_in_flight: requests (chunks) in flight at once; with chunk_size, this bounds the
                samples the server runs at once for this call. None: enough to fill the batch the
                server runs at once (SGLang's max_running_requests), plus one chunk waiting.
            progress: show a progress bar (None: auto).

        Raises:
            TypeError / ValueError: bad prompts or options (nothing was sent).
            ServerRequestError: the server rejected a request (`.prompt_index` names the first
                prompt of it). KeyboardInterrupt: Ctrl-C; in-flight requests were aborted on the
                server, finished samples are in `eng.last_result`.
        """
        job, prompt_set, sampling = self._prepare(
            prompts, unknown=unknown,
            generic=dict(n=n, logprobs=logprobs, top_logprobs=top_logprobs, stream=stream,
                         sampling_params=sampling_params, chunk_size=chunk_size, max_in_flight=max_in_flight),
            options=dict(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, temperature=temperature,
                         top_p=top_p, top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty,
                         stop=stop, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, seed=seed),
        )
        with self._progress_bar(job, progress) as advance:
            try:
                _loop.run_sync(run_generate(self._client, job, on_progress=advance))
            except BaseException:
                self.last_result = self._rollouts(job, prompt_set, sampling, failed=True)
                raise
        self.last_result = self._rollouts(job, prompt_set, sampling)
        return self.last_result

    async def agenerate(self, prompts: Any, **options: Any) -> Any:
        """`generate()` for `await` (e.g. at the top level of a notebook cell). Same arguments."""
        progress = options.pop("progress", None)
        job, prompt_set, sampling = self._prepare_from_options(prompts, options)
        with self._progress_bar(job, progress) as advance:
            future = asyncio.run_coroutine_threadsafe(
                run_generate(self._client, job, on_progress=advance), _loop.get_loop()
            )
            try:
                await asyncio.wrap_future(future)
            except BaseException:
                future.cancel()
                self.last_result = self._rollouts(job, prompt_set, sampling, failed=True)
                raise
        self.last_result = self._rollouts(job, prompt_set, sampling)
        return self.last_result

    def _prepare_from_options(self, prompts: Any, options: dict[str, Any]) -> tuple[GenerateJob, Any, Sampling]:
        generic = {k: options.pop(k, default) for k, default in _GENERIC_DEFAULTS.items()}
        sampling_opts = {k: options.pop(k) for k in list(options) if k in SAMPLING_NAMES}
        return self._prepare(prompts, unknown=options, options=sampling_opts, generic=generic)

    def _prepare(
        self,
        prompts: Any,
        *,
        unknown: dict[str, Any],
        options: dict[str, Any],
        generic: dict[str, Any],
    ) -> tuple[GenerateJob, Any, Sampling]:
        """Validate everything and build the job; raises before anything is sent.

        `options`: sampling options; `generic`: every key of _GENERIC_DEFAULTS; `unknown`: the rest.
        """
        self._check_ready()
        check_unknown_options(unknown, known=[*SAMPLING_NAMES, *_GENERIC_DEFAULTS, "progress"])
        n, logprobs, top_logprobs, stream = generic["n"], generic["logprobs"], generic["top_logprobs"], generic["stream"]
        sampling_params, chunk_size, max_in_flight = generic["sampling_params"], generic["chunk_size"], generic["max_in_flight"]
        for name, value, least in (("n", n, 1), ("chunk_size", chunk_size, 1), ("top_logprobs", top_logprobs, 0)):
            if not _is_count(value, least=least):
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        if max_in_flight is None:
            max_in_flight = chunks_to_fill(_running_capacity(self._server_info), chunk_size, n)
        elif not _is_count(max_in_flight):
            raise ValueError(f"max_in_flight must be an int >= 1 or None (fill the server's batch), got {max_in_flight!r}")
        sampling = Sampling(**{k: v for k, v in options.items() if v is not None or k == "seed"})
        if sampling.seed is not None and not self._seed_is_honoured:
            warnings.warn(
                "seed= will not make sampling reproducible on this SGLang server: it honours sampling_seed only "
                "in deterministic mode; start the Engine with server_args={'enable_deterministic_inference': True}",
                stacklevel=3,
            )
        params = sampling.to_sglang()
        if sampling_params:
            clash = set(sampling_params) & set(params)
            if clash:
                raise ValueError(f"{sorted(clash)} given both as arguments and in sampling_params; pass each once")
            params.update(sampling_params)
        prompt_set = normalize_prompts(prompts, tokenizer=self.tokenizer, vocab_size=self._vocab_size,
                                       context_length=self.context_length, max_new_tokens=sampling.max_new_tokens)
        job = GenerateJob(
            prompt_ids=prompt_set.ids, sampling=params, n=n, logprobs=bool(logprobs), top_logprobs=top_logprobs,
            stream=bool(stream), chunk_size=chunk_size, max_in_flight=max_in_flight,
        )
        return job, prompt_set, sampling

    @property
    def _seed_is_honoured(self) -> bool:
        info = self._server_info
        return info.get("rlgen_backend") == "cpu" or bool(info.get("enable_deterministic_inference"))

    @contextlib.contextmanager
    def _progress_bar(self, job: GenerateJob, progress: bool | None) -> Iterator[Any]:
        from ._display import progress_bar

        show = self._progress if progress is None else progress
        # A bar for a handful of samples is noise: auto mode shows it from 2 chunks on.
        if show is None and job.n_samples <= job.chunk_size:
            show = False
        bar = progress_bar(total=job.n_samples, progress=show, desc="generate", unit="sample")
        try:
            yield bar.update
        finally:
            bar.close()

    def _rollouts(self, job: GenerateJob, prompt_set: Any, sampling: Sampling, *, failed: bool = False) -> Any:
        from ._results import Rollouts

        responses = job.results
        if failed or any(r is None for r in responses):
            responses = [r if r is not None else Rollouts.failed_response("aborted before the server answered", reason="abort")
                         for r in (responses or [None] * job.n_samples)]
        extra = {"ttft_s": job.ttft_s, "itl_s": job.itl_s} if job.stream else None
        record = {**job.sampling, "n": job.n}
        return Rollouts.from_responses(
            responses, prompt_ids=prompt_set.ids, prompt_texts=prompt_set.texts, n=job.n,
            pad_token_id=_pad_id(self.tokenizer), extra=extra, model=self.model, sampling=record,
            decode=self._decode_tokens,
        )

    def _decode_tokens(self, ids: list[int]) -> list[str]:
        return self.tokenizer.convert_ids_to_tokens(ids)

    def stream(self, prompt: Any, **options: Any) -> Iterator[str]:
        """Yield the text of one prompt's completion piece by piece, as it is generated.

        Breaking out of the loop aborts the request on the server.
        """
        options.pop("progress", None)
        job, _, _ = self._prepare_from_options(prompt, {**options, "stream": True})
        if len(job.prompt_ids) != 1 or job.n != 1:
            raise ValueError("stream() takes one prompt and n=1; use generate(stream=True) for batches")
        payload = {"input_ids": job.prompt_ids[0], "sampling_params": job.sampling, "rid": new_rid()}
        pieces: queue.Queue[Any] = queue.Queue()
        done = object()

        async def produce() -> None:
            sent = ""
            try:
                async for chunk in self._client.generate_stream(payload):
                    text = chunk.get("text", "")
                    if len(text) > len(sent):
                        pieces.put(text[len(sent):])
                        sent = text
            except BaseException as err:  # includes cancellation: abort on the server
                if not isinstance(err, Exception):
                    with contextlib.suppress(Exception):
                        await self._client.abort([payload["rid"]])
                pieces.put(err)
                raise
            finally:
                pieces.put(done)

        future = asyncio.run_coroutine_threadsafe(produce(), _loop.get_loop())
        try:
            while True:
                item = pieces.get()
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not future.done():
                future.cancel()
                with contextlib.suppress(Exception):
                    future.exception(timeout=10)

    # -- scoring ---------------------------------------------------------------------------------
    def score(self, prompts: Any, completions: Sequence[str] | Sequence[Sequence[int]], *, progress: bool | None = None) -> Any:
        """Logprobs of given completions under the model (one prefill each, no sampling).

        Returns a `Rollouts` whose responses are the given completions and whose `logprobs` are
        the model's log-probabilities of those tokens (raw logits, temperature 1).
        """
        from ._results import Rollouts

        prompt_set = normalize_prompts(prompts, tokenizer=self.tokenizer, vocab_size=self._vocab_size,
                                       context_length=self.context_length, max_new_tokens=1)
        if isinstance(completions, (str, bytes)) or len(completions) != len(prompt_set):
            raise ValueError(f"give one completion per prompt ({len(prompt_set)} prompts)")
        completion_ids = [list(c) if not isinstance(c, str) else self.tokenizer(c, add_special_tokens=False)["input_ids"]
                          for c in completions]
        entries = self._score_ids(prompt_set.ids, completion_ids, progress=progress)
        return Rollouts.from_responses(entries, prompt_ids=prompt_set.ids, prompt_texts=prompt_set.texts, n=1,
                                       pad_token_id=_pad_id(self.tokenizer), model=self.model,
                                       sampling={"score": True}, decode=self._decode_tokens)

    def check_logprobs(self, rollouts: Any) -> dict[str, float]:
        """Re-score the rollouts' own tokens and compare with their sampled logprobs.

        Returns max/mean absolute difference over response tokens (SGLang reports sampled
        logprobs after temperature: compare rollouts sampled at temperature 1).
        """
        from ._results import Rollouts, compare_logprobs

        t = rollouts.tensors()
        prompt_ids = [row[m].tolist() for row, m in zip(t["prompt_ids"], t["prompt_mask"])]
        response_ids = [row[m].tolist() for row, m in zip(t["response_ids"], t["response_mask"])]
        keep = [i for i, r in enumerate(response_ids) if r]
        if not keep:
            raise ValueError("the rollouts have no response tokens to re-score")
        rescored = self._score_ids([prompt_ids[i] for i in keep], [response_ids[i] for i in keep], progress=False)
        rescored_r = Rollouts.from_responses(rescored, prompt_ids=[prompt_ids[i] for i in keep], n=1,
                                             pad_token_id=_pad_id(self.tokenizer))
        return compare_logprobs(rollouts[keep], rescored_r)

    def _score_ids(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], *, progress: bool | None) -> list[dict]:
        """Prefill prompt+completion with input logprobs from the last prompt token on."""
        self._check_ready()
        for i, c in enumerate(completion_ids):
            if not c:
                raise ValueError(f"completion {i} is empty; nothing to score")
        full = [p + c for p, c in zip(prompt_ids, completion_ids)]
        job = GenerateJob(prompt_ids=full, sampling={"max_new_tokens": 1, "temperature": 0.0}, logprobs=True,
                          per_prompt={"logprob_start_len": [len(p) - 1 for p in prompt_ids]})
        with self._progress_bar(job, progress) as advance:
            _loop.run_sync(run_generate(self._client, job, on_progress=advance))
        entries = []
        for p, c, r in zip(prompt_ids, completion_ids, job.results):
            meta = dict(r["meta_info"])
            scored = meta.pop("input_token_logprobs")[1:]  # entry 0 is the last prompt token (None)
            meta.pop("input_top_logprobs", None)
            meta.pop("output_top_logprobs", None)
            meta["output_token_logprobs"] = scored
            meta["completion_tokens"] = len(c)
            meta["prompt_tokens"] = len(p)
            meta["finish_reason"] = {"type": "score"}
            entries.append({"text": self.tokenizer.decode(c, skip_special_tokens=True), "output_ids": c, "meta_info": meta})
        return entries

    # -- server control --------------------------------------------------------------------------
    def flush_cache(self) -> None:
        """Drop the server's prefix (radix) cache. SGLang refuses while requests are running."""
        self._check_ready()
        _loop.run_sync(self._client.post("/flush_cache"))

    def update_weights_from_disk(self, path: str | os.PathLike[str], *, weight_version: str | None = None,
                                 retries: int = 3, backoff_s: float = 1.0) -> str:
        """Load new weights from a checkout on the server's disk; returns the new weight version.

        Retries transient failures (connection errors, HTTP 5xx/503) with backoff; a rejected path
        (HTTP 400) fails at once. The version defaults to "<dir name>@<n>" so rows stay traceable.
        """
        self._check_ready()
        self._weight_updates += 1
        version = weight_version or f"{Path(path).name}@{self._weight_updates}"
        body = {"model_path": str(path), "weight_version": version}
        for attempt in range(retries + 1):
            try:
                result = _loop.run_sync(self._client.post("/update_weights_from_disk", body))
                break
            except ServerRequestError as err:
                if err.status < 500 or attempt == retries:
                    raise ServerRequestError(f"update_weights_from_disk({str(path)!r}) failed: {err.body}",
                                             status=err.status, body=err.body) from None
            except RequestError:
                if attempt == retries or not self._server_alive():
                    raise
            time.sleep(backoff_s * 2**attempt)
        if isinstance(result, dict) and result.get("success") is False:
            raise ServerRequestError(f"update_weights_from_disk failed: {result.get('message')}", status=400)
        self._weights_path = str(path)
        info = _loop.run_sync(self._client.get_info("model", timeout=30))
        return str(info.get("weight_version", version))

    def _server_alive(self) -> bool:
        return self._server is None or self._server.alive()

    def release_memory(self, tags: Sequence[str] | None = None) -> None:
        """Release the server's GPU memory (KV cache, weights); generate() fails until resume_memory()."""
        self._check_ready()
        if not self._memory_saver:
            raise EngineError("release_memory() needs the server started with enable_memory_saver=True")
        body = {"tags": list(tags)} if tags else {}
        _loop.run_sync(self._client.post("/release_memory_occupation", body))
        self._released = set(tags) if tags else {"weights", "kv_cache", "cuda_graph"}

    def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        """Take the GPU memory back; weights released earlier are reloaded so outputs are unchanged."""
        self._check_ready()
        body = {"tags": list(tags)} if tags else {}
        _loop.run_sync(self._client.post("/resume_memory_occupation", body))
        resumed = set(tags) if tags else self._released
        self._released = self._released - resumed
        # Seen on SGLang 0.5.17: resume restores the weights' memory but not their values (greedy
        # output was empty). Reload them from disk, keeping the weight version.
        if "weights" in resumed:
            info = _loop.run_sync(self._client.get_info("model", timeout=30))
            _loop.run_sync(self._client.post("/update_weights_from_disk", {
                "model_path": self._weights_path or self.model_path,
                "weight_version": info.get("weight_version"),
            }))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Free the server's GPU memory for the block (e.g. a training step), then take it back."""
        self.release_memory()
        try:
            yield
        finally:
            self.resume_memory()

    def metrics(self) -> Any:
        """SGLang's Prometheus metrics as a DataFrame (name, labels, value); needs enable_metrics=True."""
        self._check_ready()
        if not self._metrics_enabled:
            raise EngineError("metrics() needs the Engine started with enable_metrics=True")
        import pandas as pd

        text = _loop.run_sync(self._client.get("/metrics", timeout=30))
        return pd.DataFrame(parse_prometheus(str(text)), columns=["name", "labels", "value"])


# ---------------------------------------------------------------------------------------------
# Helpers for construction


def _reap_leftovers() -> None:
    from ._server import reap

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
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(err)

    threading.Thread(target=run, name="rlgen-tokenizer", daemon=True).start()
    return future


def _load_tokenizer(tokenizer: Any) -> Any:
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(tokenizer))
    except (OSError, ValueError) as err:
        raise EngineError(f"cannot load the tokenizer from {str(tokenizer)!r} ({err}); pass tokenizer= a local path") from err


def _is_count(value: Any, *, least: int = 1) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _running_capacity(server_info: dict[str, Any]) -> int | None:
    """How many requests the server runs at once: SGLang's effective max_running_requests, summed
    over its data-parallel ranks (/server_info's internal_states); None where it does not say."""
    states = server_info.get("internal_states")
    if not isinstance(states, list):
        return None
    total = 0
    for state in states:
        count = state.get("effective_max_running_requests_per_dp") if isinstance(state, dict) else None
        if not _is_count(count):
            return None
        total += count
    return total or None


def _context_length(server_info: dict[str, Any], tokenizer: Any, model_path: str) -> int | None:
    """The model's context: an explicit server setting, else the checkout's config, else what the
    server says is the longest input (SGLang's `max_req_input_len`, a few tokens under the context)."""
    value = server_info.get("context_length")
    if isinstance(value, int) and value > 0:
        return value
    config = Path(model_path) / "config.json"
    if model_path and config.is_file():
        value = json.loads(config.read_text()).get("max_position_embeddings")
        if isinstance(value, int):
            return value
    value = server_info.get("max_req_input_len")
    if isinstance(value, int) and value > 0:
        return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 10**9 else None


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else (tokenizer.eos_token_id or 0))


def _close_client(client: Client) -> None:
    with contextlib.suppress(Exception):
        _loop.run_sync(client.aclose(), timeout=5)


def _gpu_memory_mib(pids: list[int]) -> int | None:
    """GPU memory held by these processes (None where the driver shows none of them)."""
    from ._process_tree import gpu_memory_by_pid

    held = gpu_memory_by_pid() if pids else None
    mine = [held[pid] for pid in pids if pid in held] if held else []
    return sum(mine) if mine else None
