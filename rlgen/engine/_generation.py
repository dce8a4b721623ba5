"""Generation: `Engine.generate`, `agenerate` and `stream`, and how a call becomes a result.

Owns: checking a call's options and prompts, the completion cache's look-up and store, sending the
job through the generate core (`client._generate`) on the background loop, Ctrl-C (finished
samples kept in `last_result`), and the `Rollouts` and provenance record (`record`) of a call.
Knows nothing about server processes, scoring or weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from typing_extensions import Unpack

from ..client._answer import failed_entry, read_answer
from ..client._generate import GenerateJob, chunks_to_fill, new_rid, request_size, run_generate
from ..client._prompts import PromptBatch, prompt_data
from ..core import _loop, _options
from ..core._columns import RESERVED_DATA_NAMES
from ..core._errors import EngineError
from ..core._options import GenerateOptions, StreamOptions, takes_options
from ..core._types import Prompt, Prompts
from ..server import _info as _server_info
from ._adapter_choice import AdapterChoiceMixin
from ._base import AUTO_CHUNK_MAX
from ._startup import pad_id

if TYPE_CHECKING:
    from ..core._progress import ProgressLine
    from ..rollouts._rollouts import Rollouts

__all__ = ["GenerationMixin"]





@dataclass
class _Call:
    """One generate() call: its prompts, the job for the prompts sent to the server, and what the
    completion cache answered (`keys` is None when the call does not use the cache)."""

    batch: PromptBatch
    job: GenerateJob                  # the prompts that go to the server, in `sent` order
    progress: bool | None
    started: float                    # time.time() when the call began
    sent: list[int]                   # the call's prompt positions in the job, in order
    adapters: list[str | None] | None = None  # each prompt's LoRA adapter; None: the base model for all
    keys: list[str] | None = None     # the cache key of each of the call's prompts
    hits: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # prompt position -> stored answers


class GenerationMixin(AdapterChoiceMixin):
    """Generation methods of `Engine` (mixed into it)."""

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
        call = self._prepare(prompts, options, resolved=opts)
        if call.job.prompt_ids:  # else every prompt was answered by the completion cache
            with self._progress_line(call.job, call.progress) as line:
                try:
                    _loop.run_sync(run_generate(self._client, call.job, on_progress=line.advance,
                                                on_load=_load_note(line)), on_wait=line.tick)
                except BaseException:
                    self.last_result = self._rollouts(call, failed=True)
                    raise
        self.last_result = self._rollouts(call)
        return self.last_result

    @takes_options(GenerateOptions)
    async def agenerate(self, prompts: Prompts, /, **options: Unpack[GenerateOptions]) -> Rollouts:
        """`generate()` for `await` (e.g. at the top level of a notebook cell): the same options."""
        try:  # checked here, so a mistyped option's traceback is the caller's line and this one
            opts = _options.resolve(GenerateOptions, options)
        except (TypeError, ValueError) as err:
            raise err.with_traceback(None) from None
        call = self._prepare(prompts, options, resolved=opts)
        if call.job.prompt_ids:  # else every prompt was answered by the completion cache
            with self._progress_line(call.job, call.progress) as line:
                future = asyncio.run_coroutine_threadsafe(
                    run_generate(self._client, call.job, on_progress=line.advance, on_load=_load_note(line)),
                    _loop.get_loop()
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
        try:  # checked here, so a mistyped option's traceback is the caller's line and this one
            resolved = _options.resolve(StreamOptions, options)
        except (TypeError, ValueError) as err:
            raise err.with_traceback(None) from None
        self._check_ready()
        batch = self._normalize(prompt, max_new_tokens=resolved["max_new_tokens"])
        if len(batch) != 1:
            raise ValueError("stream() takes one prompt; use generate(stream=True) for batches")
        self._warn_if_seed_ignored(resolved)
        adapters = self._adapter_names(resolved["adapter"], 1)
        payload: dict[str, Any] = {"input_ids": batch.ids[0], "sampling_params": _options.to_sglang(resolved), "rid": new_rid()}
        if adapters is not None:
            payload["lora_path"] = adapters[0]
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

    def _prepare(self, prompts: Prompts, options: Mapping[str, Any], *, resolved: dict[str, Any] | None = None) -> _Call:
        """Check everything, look the prompts up in the completion cache, and build the job for
        the rest; raises before anything is sent. `resolved`: the options already checked."""
        opts = _options.resolve(GenerateOptions, options) if resolved is None else resolved
        self._check_ready()
        started = time.time()
        self._warn_if_seed_ignored(opts)
        self._warn_if_plain_text_to_chat_model(prompts)
        batch = self._normalize(prompts, max_new_tokens=opts["max_new_tokens"])
        chunk_size = opts["chunk_size"] or request_size(len(batch), most=AUTO_CHUNK_MAX)
        max_in_flight = opts["max_in_flight"]
        if max_in_flight is None:
            max_in_flight = chunks_to_fill(_server_info.running_capacity(self._server_info), chunk_size, opts["n"])
        batch.data = prompt_data(opts["data"], len(batch), reserved=RESERVED_DATA_NAMES)
        adapters = self._adapter_names(opts["adapter"], len(batch))
        job = GenerateJob(
            prompt_ids=batch.ids, sampling=_options.to_sglang(opts), n=opts["n"], logprobs=opts["logprobs"],
            top_logprobs=opts["top_logprobs"], stream=opts["stream"], chunk_size=chunk_size,
            max_in_flight=max_in_flight, per_prompt={} if adapters is None else {"lora_path": adapters},
        )
        call = _Call(batch=batch, job=job, progress=opts["progress"], started=started,
                     sent=list(range(len(batch.ids))), adapters=adapters)
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
        if digest is None and self._weights_pushed is not None:
            raise EngineError("the completion cache keys completions by the served weights' content hash, and the "
                              "weights pushed with update_weights() have none: pass cache=False, or save them and "
                              "load them with update_weights_from_disk(path)")
        if digest is None:
            raise EngineError("the completion cache needs the served weights on this machine (their content hash is "
                              f"part of every key), and {self._weights.path or self.model_path!r} is not a local "
                              "checkout: pass cache=False")
        if self._completions is None:
            self._completions = CompletionCache()
        job = call.job
        # The weight version as this Engine last set or read it: a lookup makes no request, so it
        # trusts that the served weights change only through this Engine.
        adapters = call.adapters or [None] * len(job.prompt_ids)
        shas = {name: self._adapter_sha256(name) for name in set(adapters)}
        call.keys = [cache_key(weights_sha256=digest, weight_version=self._weight_version, prompt_ids=ids, sampling=job.sampling,
                               n=job.n, logprobs=job.logprobs, top_logprobs=job.top_logprobs,
                               adapter_sha256=shas[adapter])
                     for ids, adapter in zip(job.prompt_ids, adapters)]
        for i, key in enumerate(call.keys):
            answers = self._completions.get(key, n=job.n)
            if answers is not None:
                call.hits[i] = answers
        call.sent = [i for i in range(len(call.keys)) if i not in call.hits]
        job.prompt_ids = [job.prompt_ids[i] for i in call.sent]
        job.per_prompt = {name: [values[i] for i in call.sent] for name, values in job.per_prompt.items()}

    def _warn_if_plain_text_to_chat_model(self, prompts: Prompts) -> None:
        """Once per Engine: plain-text prompts to a model with a chat template. A chat model given
        raw text often answers nothing (an immediate EOS: empty completions marked 'stop')."""
        if getattr(self, "_warned_plain_text", False):
            return
        texts = [prompts] if isinstance(prompts, str) else prompts
        if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(p, str) for p in texts):
            return
        if not getattr(getattr(self, "tokenizer", None), "chat_template", None):
            return
        self._warned_plain_text = True
        warnings.warn(
            "these prompts are plain text, but this model has a chat template: it is sent the text as it is, "
            "without the template, and a chat model often answers that with an empty completion ('stop'). "
            'To chat, send messages: eng.generate([[{"role": "user", "content": text}] for text in prompts])',
            stacklevel=4,
        )

    def _warn_if_seed_ignored(self, opts: Mapping[str, Any]) -> None:
        if opts["seed"] is not None and not _server_info.honours_seed(self._server_info):
            warnings.warn(
                "seed= will not make sampling reproducible on this SGLang server: it honours sampling_seed only "
                "in deterministic mode; start the Engine with server_args={'enable_deterministic_inference': True}",
                stacklevel=4,
            )

    def _rollouts(self, call: _Call, *, failed: bool = False) -> Rollouts:
        from ..rollouts._build import rollouts_from_responses

        job, batch, n = call.job, call.batch, call.job.n
        sent: list[dict[str, Any] | None] = list(job.results) or [None] * job.n_samples
        if call.keys is not None and self._completions is not None and not failed:
            for j, i in enumerate(call.sent):  # store each prompt whose n samples all finished
                answers = sent[j * n:(j + 1) * n]
                if all(a is not None and read_answer(a).finished for a in answers):
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
        if self.serves_lora or call.adapters is not None:  # base rows too: None
            extra["adapter"] = [a for a in (call.adapters or [None] * len(batch.ids)) for _ in range(n)]
        extra.update({name: [v for v in values for _ in range(n)] for name, values in batch.data.items()})
        if call.keys is not None:
            extra["cached"] = [i in call.hits for i in range(len(batch.ids)) for _ in range(n)]
        sampling = {**job.sampling, "n": n}
        return rollouts_from_responses(
            responses, prompt_ids=batch.ids, prompt_texts=batch.texts, n=job.n,
            pad_token_id=pad_id(self.tokenizer), extra=extra, model=self.model, sampling=sampling,
            decode=self._token_text, record=self._record(call, sampling, responses),
        )

    def _record(self, call: _Call, sampling: dict[str, Any], responses: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
        """`Rollouts.record`: what made this call's rows."""
        versions = [(r.get("meta_info") or {}).get("weight_version") for r in responses if r is not None]
        cache = None if call.keys is None else {"hits": len(call.hits), "sent": len(call.sent)}
        return self._run_record(started=call.started, sampling=sampling, weight_versions=versions, cache=cache,
                                adapters=call.adapters)

    def _run_record(self, *, started: float, sampling: dict[str, Any], weight_versions: Sequence[Any],
                    cache: dict[str, int] | None, adapters: Sequence[str | None] | None = None) -> dict[str, Any]:
        """What made a call's rows (`Rollouts.record`), for generate() and episodes() alike."""
        from .._version import __version__

        versions = sorted({str(v) for v in weight_versions if v is not None})
        return {
            "rlgen_version": __version__,
            "server_version": self._server_info.get("version"),
            "backend": self.backend,
            "model": self.model,
            "model_path": self.model_path,
            # None for weights pushed from tensors (update_weights): they are on no disk
            "weights_path": None if self._weights_pushed is not None else self._weights_path or self.model_path,
            "weights_sha256": self._weights.result(),
            "weight_versions": versions,
            "server_args": self._command(),
            "sampling": sampling,
            "seed": sampling.get("sampling_seed"),
            "started_utc": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "gpu": self._gpu(),
            "cache": cache,
            "adapters": self._adapter_record(adapters),  # name -> source, rank, sha256, load; None: base model only
        }

    def _gpu(self) -> str | None:
        """The GPU's name where the server is on this machine and has one (nvidia-smi, read once)."""
        if self._gpu_name is None and self.backend == "sglang":
            from ..server._process_tree import gpu_name

            self._gpu_name = gpu_name() or ""
        return self._gpu_name or None


def _load_note(line: ProgressLine) -> Callable[[int, int], None] | None:
    """What a shown progress line says while requests run: the server's own count of running
    requests and the tokens they hold (prompt + generated so far), so a call made of one large
    request still moves. None (no polling) when the line is never shown."""
    if not line.enabled:
        return None

    def note(running: int, used: int) -> None:
        line.set_note(f"{running:,} running · {used:,} tokens in use" if running else "")

    return note
