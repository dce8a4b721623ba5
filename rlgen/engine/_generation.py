"""Generation: what `Engine.generate`, `agenerate` and `stream` do, in order: prepare, send, build.

Owns: `Call` (one call: its prompts, the job sent, what the completion cache answered);
`prepare` (the checks and warnings before anything is sent, prompts normalised and their data
joined, each prompt's adapter, the job, the cache's split of the prompts), `send` / `asend` (the
job through the generate core, `client._generate`, on the background loop, with a progress
line), `build` (finished prompts stored in the cache, hits and answers merged, the extra
columns, the `Rollouts` and its provenance); `CachePolicy` (the Engine's `cache=` and the store
it opens at first use); `CallWarnings` (the once-per-Engine hints); and `stream`'s one request.
Knows nothing about server processes, scoring or weights beyond the parts it is handed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..client._answer import read_answer
from ..client._completion_cache import CompletionCache, cache_key, merge, split, store_finished
from ..client._generate import GenerateJob, chunks_to_fill, request_size, run_generate
from ..client._prompts import PromptBatch, prompt_data
from ..client._sender import new_rid
from ..core import _loop, _options
from ..core._columns import RESERVED_DATA_NAMES
from ..core._types import Prompt, Prompts
from ..server import _info as _server_info
from ._adapter_choice import AdapterSet
from ._connection import AUTO_CHUNK_MAX, Connection
from ._provenance import Provenance
from ._served import ServedWeights

if TYPE_CHECKING:
    from ..core._progress import ProgressLine
    from ..rollouts._rollouts import Rollouts

__all__ = [
    "CachePolicy",
    "Call",
    "CallWarnings",
    "asend",
    "build",
    "prepare",
    "send",
    "stream_payload",
    "text_pieces",
]


@dataclass
class Call:
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
    version: int = 0                  # the served weights' version index when the call began


class CachePolicy:
    """The Engine's `cache=` (see `Engine`), and the store, opened at the first call that uses it."""

    def __init__(self, mode: bool | str) -> None:
        self.mode = mode
        self._store: CompletionCache | None = None
        self._warned_unseeded = False

    @property
    def store(self) -> CompletionCache:
        if self._store is None:
            self._store = CompletionCache()
        return self._store

    def applies(self, job: GenerateJob, call_mode: bool | str | None, *, stacklevel: int) -> bool:
        """Whether a call uses the cache: its `cache=` (None: the Engine's), greedy or seeded sampling
        (or "always"), never a streamed call (it is made to time the stream)."""
        mode = self.mode if call_mode is None else call_mode
        if not mode or job.stream:
            return False
        greedy = job.sampling.get("temperature") == 0 or job.sampling.get("top_k") == 1
        if mode == "always" or greedy or job.sampling.get("sampling_seed") is not None:
            return True
        if not self._warned_unseeded:
            self._warned_unseeded = True
            warnings.warn("cache=True leaves unseeded sampling uncached (each call draws new samples): pass seed=... "
                          "to cache it, or cache='always' to replay the first draw", stacklevel=stacklevel)
        return False


class CallWarnings:
    """Hints given once per Engine."""

    def __init__(self) -> None:
        self._plain_text = False

    def plain_text_to_chat_model(self, prompts: Prompts, tokenizer: Any, *, stacklevel: int = 2) -> None:
        """Plain-text prompts to a model with a chat template. A chat model given raw text often
        answers nothing (an immediate EOS: empty completions marked 'stop')."""
        if self._plain_text:
            return
        texts = [prompts] if isinstance(prompts, str) else prompts
        if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(p, str) for p in texts):
            return
        if not getattr(tokenizer, "chat_template", None):
            return
        self._plain_text = True
        warnings.warn(
            "these prompts are plain text, but this model has a chat template: it is sent the text as it is, "
            "without the template, and a chat model often answers that with an empty completion ('stop'). "
            'To chat, send messages: eng.generate([[{"role": "user", "content": text}] for text in prompts])',
            stacklevel=stacklevel,
        )


def warn_if_seed_ignored(conn: Connection, opts: Mapping[str, Any], *, stacklevel: int) -> None:
    if opts["seed"] is not None and not _server_info.honours_seed(conn.server_info):
        warnings.warn(
            "seed= will not make sampling reproducible on this SGLang server: it honours sampling_seed only "
            "in deterministic mode; start the Engine with server_args={'enable_deterministic_inference': True}",
            stacklevel=stacklevel,
        )


# -- prepare -----------------------------------------------------------------------------------------
def prepare(conn: Connection, adapters: AdapterSet, cache: CachePolicy, weights: ServedWeights,
            hints: CallWarnings, prompts: Prompts, opts: Mapping[str, Any], *, stacklevel: int) -> Call:
    """Check everything, build the job, and leave in it only the prompts the completion cache does
    not answer; raises before anything is sent. `stacklevel`: how many frames up from this one the
    user's line is (1: this function), for warnings; each function here takes it the same way."""
    conn.check_ready()
    started = time.time()
    warn_if_seed_ignored(conn, opts, stacklevel=stacklevel + 1)
    hints.plain_text_to_chat_model(prompts, conn.tokenizer, stacklevel=stacklevel + 1)
    batch = conn.normalize(prompts, max_new_tokens=opts["max_new_tokens"])
    chunk_size = opts["chunk_size"] or request_size(len(batch), most=AUTO_CHUNK_MAX)
    max_in_flight = opts["max_in_flight"]
    if max_in_flight is None:
        max_in_flight = chunks_to_fill(conn.running_capacity(), chunk_size, opts["n"])
    batch.data = prompt_data(opts["data"], len(batch), reserved=RESERVED_DATA_NAMES)
    names = adapters.per_prompt(opts["adapter"], len(batch))
    job = GenerateJob(
        prompt_ids=batch.ids, sampling=_options.to_sglang(opts), n=opts["n"], logprobs=opts["logprobs"],
        top_logprobs=opts["top_logprobs"], stream=opts["stream"], chunk_size=chunk_size,
        max_in_flight=max_in_flight, per_prompt={} if names is None else {"lora_path": names},
    )
    call = Call(batch=batch, job=job, progress=opts["progress"], started=started,
                sent=list(range(len(batch.ids))), adapters=names, version=weights.index)
    if cache.applies(job, opts["cache"], stacklevel=stacklevel + 1):
        call.keys = _cache_keys(job, names, weights, adapters)
        call.hits, call.sent = split(cache.store, call.keys, n=job.n)
        job.prompt_ids = [job.prompt_ids[i] for i in call.sent]
        job.per_prompt = {name: [values[i] for i in call.sent] for name, values in job.per_prompt.items()}
    return call


def _cache_keys(job: GenerateJob, names: Sequence[str | None] | None, weights: ServedWeights,
                adapters: AdapterSet) -> list[str]:
    """Each prompt's completion-cache key. The weight version is the one this Engine last set or
    read: a look-up makes no request, so it trusts that the served weights change only through
    this Engine. An adapter's key carries its content hash (an adapter of unknown content is refused)."""
    digest = weights.cache_digest()
    per_prompt = list(names) if names is not None else [None] * len(job.prompt_ids)
    shas = {name: adapters.cache_sha256(name) for name in set(per_prompt)}
    return [cache_key(weights_sha256=digest, weight_version=weights.version, prompt_ids=ids, sampling=job.sampling,
                      n=job.n, logprobs=job.logprobs, top_logprobs=job.top_logprobs, adapter_sha256=shas[name])
            for ids, name in zip(job.prompt_ids, per_prompt)]


# -- send ----------------------------------------------------------------------------------------------
def send(conn: Connection, call: Call) -> None:
    """Run the call's job (if the cache left any prompt) on the background loop, with its progress line."""
    if not call.job.prompt_ids:
        return
    with conn.progress_line(call.job, call.progress) as line:
        _loop.run_sync(run_generate(conn.client, call.job, on_progress=line.advance, on_load=_load_note(line)),
                       on_wait=line.tick)


async def asend(conn: Connection, call: Call) -> None:
    """`send` for `await`: the progress line is redrawn from the caller's (the notebook's) thread."""
    if not call.job.prompt_ids:
        return
    with conn.progress_line(call.job, call.progress) as line:
        future = asyncio.run_coroutine_threadsafe(
            run_generate(conn.client, call.job, on_progress=line.advance, on_load=_load_note(line)), _loop.get_loop())
        waiting = asyncio.wrap_future(future)
        try:
            while not waiting.done():
                await asyncio.wait({waiting}, timeout=0.25)
                line.tick()
            await waiting
        except BaseException:
            future.cancel()
            raise


def _load_note(line: ProgressLine) -> Callable[[int, int], None] | None:
    """What a shown progress line says while requests run: the server's own count of running
    requests and the tokens they hold (prompt + generated so far), so a call made of one large
    request still moves. None (no polling) when the line is never shown."""
    if not line.enabled:
        return None

    def note(running: int, used: int) -> None:
        line.set_note(f"{running:,} running · {used:,} tokens in use" if running else "")

    return note


# -- build ---------------------------------------------------------------------------------------------
def build(conn: Connection, adapters: AdapterSet, provenance: Provenance, cache: CachePolicy, call: Call, *,
          failed: bool = False, weights: ServedWeights | None = None) -> Rollouts:
    """The call's `Rollouts`: the cache's hits and the server's answers in prompt order (a sample
    without an answer as aborted), each fully finished prompt stored in the cache (not after a
    failure), the extra columns, and the provenance. With `weights`, each row's `versions`: the
    version index its answer's `weight_version` names (from the call's own on), else the call's."""
    from ..rollouts._build import rollouts_from_responses

    job, batch, n = call.job, call.batch, call.job.n
    answers: list[dict[str, Any] | None] = list(job.results) or [None] * job.n_samples
    if call.keys is not None and not failed:
        store_finished(cache.store, call.keys, call.sent, answers, n=n)
    responses = merge(call.hits, call.sent, answers, prompts=len(batch.ids), n=n)
    sampling = {**job.sampling, "n": n}
    cache_counts = None if call.keys is None else {"hits": len(call.hits), "sent": len(call.sent)}
    named = [read_answer(r).weight_version for r in responses]
    record = provenance.of_call(started=call.started, sampling=sampling, cache=cache_counts, adapters=call.adapters,
                                weight_versions=named)
    rows = None
    if weights is not None:
        rows = [call.version if (i := weights.index_of(v, at_least=call.version)) is None else i for v in named]
    return rollouts_from_responses(
        responses, prompt_ids=batch.ids, prompt_texts=batch.texts, n=n, pad_token_id=conn.pad_id,
        extra=_extra_columns(call, adapters), model=provenance.model, sampling=sampling,
        decode=conn.token_text, record=record, row_versions=rows,
    )


def _extra_columns(call: Call, adapters: AdapterSet) -> dict[str, list[Any]]:
    """Columns beside the answers': stream timings, the chats, adapters, the prompts' data, `cached`."""
    job, batch, n = call.job, call.batch, call.job.n
    extra: dict[str, list[Any]] = {"ttft_s": job.ttft_s, "itl_s": job.itl_s} if job.stream else {}
    if batch.chats is not None:
        extra["prompt_messages"] = [chat for chat in batch.chats for _ in range(n)]
    extra.update(adapters.column(call.adapters, len(batch.ids), n=n))  # base rows too: None
    extra.update({name: [v for v in values for _ in range(n)] for name, values in batch.data.items()})
    if call.keys is not None:
        extra["cached"] = [i in call.hits for i in range(len(batch.ids)) for _ in range(n)]
    return extra


# -- stream --------------------------------------------------------------------------------------------
def stream_payload(conn: Connection, adapters: AdapterSet, prompt: Prompt, opts: Mapping[str, Any], *,
                   stacklevel: int) -> dict[str, Any]:
    """The one /generate request of `stream()`: one prompt, one sample; checked before anything is sent."""
    conn.check_ready()
    batch = conn.normalize(prompt, max_new_tokens=opts["max_new_tokens"])
    if len(batch) != 1:
        raise ValueError("stream() takes one prompt; use generate(stream=True) for batches")
    warn_if_seed_ignored(conn, opts, stacklevel=stacklevel + 1)
    names = adapters.per_prompt(opts["adapter"], 1)
    payload: dict[str, Any] = {"input_ids": batch.ids[0], "sampling_params": _options.to_sglang(opts), "rid": new_rid()}
    if names is not None:
        payload["lora_path"] = names[0]
    return payload


async def text_pieces(conn: Connection, payload: dict[str, Any]) -> AsyncIterator[str]:
    """The new text of each streamed chunk; on cancellation the request is aborted on the server."""
    sent = ""
    try:
        async for chunk in conn.client.generate_stream(payload):
            text = chunk.get("text", "")
            if len(text) > len(sent):
                yield text[len(sent):]
                sent = text
    except (asyncio.CancelledError, GeneratorExit):
        with contextlib.suppress(Exception):
            await conn.client.abort([payload["rid"]])
        raise
