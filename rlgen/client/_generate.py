"""The generate core: normalised prompts in, SGLang response entries out, batched and abortable.

Owns: splitting the prompts into chunks of batched `/generate` requests, keeping a bounded number
in flight (so huge inputs stream through with bounded memory), reporting progress per answered
request, giving every sample an `rid`, streaming (time to first token, inter-token latencies), and
what happens on Ctrl-C or a failing request: the in-flight rids are aborted on the server, and the
samples that did finish are kept. Behind a router (a client with `one_prompt_per_request`), the
same with one request per prompt. Request bodies, rids, the rids in flight and their abort are the
one sender's (`_sender`), shared with the episodes. Knows nothing about processes or about the
result's tensors.

Runs on rlgen's background loop (`rlgen.core._loop`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core._errors import RequestError, ServerRequestError
from ._answer import completion_tokens, read_answer, seeded_sampling
from ._http import Client
from ._sender import Sender, gather_or_abort, generate_body, new_rid

__all__ = ["FALLBACK_IN_FLIGHT", "REQUESTS_PER_CALL", "GenerateJob", "chunks_to_fill", "request_size", "run_generate"]


@dataclass
class GenerateJob:
    """One generate() call, ready to send (its values already checked by `core._options`)."""

    prompt_ids: list[list[int]]
    sampling: dict[str, Any]              # SGLang sampling_params, without `n`
    n: int                                # samples per prompt
    logprobs: bool
    top_logprobs: int
    stream: bool                          # stream over SSE to measure TTFT / inter-token latency
    chunk_size: int                       # prompts per /generate request
    max_in_flight: int                    # requests in flight at once (see chunks_to_fill)
    per_prompt: dict[str, list[Any]] = field(default_factory=dict)  # one value per prompt, e.g. logprob_start_len

    # filled while running: one entry per sample (prompt-major), None until it arrives
    results: list[dict[str, Any] | None] = field(default_factory=list)
    ttft_s: list[float | None] = field(default_factory=list)
    itl_s: list[float | None] = field(default_factory=list)

    @property
    def n_samples(self) -> int:
        return len(self.prompt_ids) * self.n


# How many requests generate() splits a call into when the caller sets no chunk_size (the progress
# line's steps); docs/decisions.md has why the extra requests cost SGLang nothing measurable.
REQUESTS_PER_CALL = 16

# Chunks in flight when the server does not say how many requests it runs at once (a router, a
# server without /server_info's internal_states).
FALLBACK_IN_FLIGHT = 8


def chunks_to_fill(server_capacity: int | None, chunk_size: int, n: int) -> int:
    """generate()'s default `max_in_flight`: enough chunks to fill the server's running batch, plus
    one waiting in its queue so that it starts the moment a chunk finishes.

    A fixed number would split a large input into waves that each leave the server's batch part
    empty (docs/benchmarks.md has the measurement that led here).
    """
    if server_capacity is None:
        return FALLBACK_IN_FLIGHT
    return -(-server_capacity // (chunk_size * n)) + 1


async def run_generate(client: Client, job: GenerateJob, *,
                       on_progress: Callable[[int, int], object] | None = None,
                       on_load: Callable[[int, int], object] | None = None) -> None:
    """Send `job` and fill `job.results` (prompt-major, n per prompt).

    `on_progress(samples, tokens)` is called (on the loop) as each request is answered.
    `on_load(running_requests, used_tokens)` is called about every `LOAD_POLL_S` while the job
    runs, from the server's `/v1/loads` (SGLang publishes it after every prefill and every 15 decode
    steps): progress inside a request, which answered requests alone cannot show when a call is one
    or a few large requests. Not behind a router (its /v1/loads is 404), and never again after the
    server does not answer it.

    On cancellation (Ctrl-C) or a failing request, the rids still in flight are aborted on the
    server before the exception propagates; finished samples stay in `job.results`.

    A client with `one_prompt_per_request` (a router) gets one request per prompt instead of
    batched chunks (`_single_payload`), with as many prompts in flight as the chunks would hold.
    """
    # 1) Plan the requests: [first, stop) ranges of samples (prompt-major), each one /generate.
    job.results = [None] * job.n_samples
    job.ttft_s = [None] * job.n_samples
    job.itl_s = [None] * job.n_samples
    single = bool(getattr(client, "one_prompt_per_request", False))
    spans, limit = (_single_spans(job) if single else
                    ([(a * job.n, min(a + job.chunk_size, len(job.prompt_ids)) * job.n)
                      for a in range(0, len(job.prompt_ids), job.chunk_size)], job.max_in_flight))
    sender = Sender(client, batch=False)  # its rids in flight: what step 3 aborts
    limiter = asyncio.Semaphore(limit)

    async def one_request(first: int, stop: int) -> None:
        async with limiter:
            payload, rids = _single_payload(job, first, stop) if single else _payload(job, first // job.n, stop // job.n)
            try:
                if job.stream:
                    with sender.tracked(rids):
                        await _send_streamed(client, job, payload, first, stop - first)
                else:
                    entries = await _send_resending(client, sender, job, payload, rids, first, stop, single)
                    _store(job, first, stop, entries if isinstance(entries, list) else [entries])
            except ServerRequestError as err:
                raise ServerRequestError(
                    f"{_prompts(job, first, stop)}: {err}{_dead_note(client)}", status=err.status, body=err.body,
                    prompt_index=first // job.n,
                ) from None
            except RequestError as err:
                if err.prompt_index is None:
                    err.prompt_index = first // job.n
                raise
            if on_progress is not None:
                on_progress(stop - first, sum(completion_tokens(e) for e in job.results[first:stop]))

    # 2) Send them, at most `limit` at a time; the first failure cancels the rest.
    tasks = [asyncio.ensure_future(one_request(a, b)) for a, b in spans]
    poller = asyncio.ensure_future(_poll_loads(client, on_load)) if on_load is not None and not single else None
    try:
        await gather_or_abort(client, tasks, sender.in_flight)  # 3) on Ctrl-C or a failure: abort the rest
    finally:
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)


async def _send_resending(client: Client, sender: Sender, job: GenerateJob, payload: dict[str, Any], rids: list[str],
                          first: int, stop: int, single: bool) -> Any:
    """One request's entries, through `sender`. Behind a router whose worker died and whose own
    retries did not save it, the request goes again (a new rid), after a pause, straight to a live
    worker (the router may still pick the dead one until its health check drops it)."""
    target = client
    for attempt in itertools.count():
        try:
            return await sender.send(payload, rids, client=target)
        except RequestError as err:
            if not (single and await _may_resend(client, err, attempt)):
                raise
        await asyncio.sleep(getattr(client, "resend_backoff_s", 1.0) * attempt)
        live_worker = getattr(client, "live_worker", None)
        target = (live_worker() if live_worker is not None else None) or client
        payload, rids = _single_payload(job, first, stop)
    raise AssertionError("unreachable")  # pragma: no cover


# How often a running job reads the server's load (one small GET; the line redraws at most 4x/s).
LOAD_POLL_S = 1.0


async def _poll_loads(client: Client, on_load: Callable[[int, int], object]) -> None:
    """Call `on_load(running_requests, used_tokens)` every LOAD_POLL_S from GET /v1/loads (summed
    over data-parallel ranks); stop quietly when the server does not serve it."""
    while True:
        await asyncio.sleep(LOAD_POLL_S)
        try:
            body = await client.get("/v1/loads", timeout=5)
        except RequestError:
            return
        loads = body.get("loads") if isinstance(body, dict) else None
        if not isinstance(loads, list):
            return
        running = sum(int(x.get("num_running_reqs") or 0) for x in loads if isinstance(x, dict))
        used = sum(int(x.get("num_used_tokens") or 0) for x in loads if isinstance(x, dict))
        on_load(running, used)


async def _may_resend(client: Client, err: RequestError, attempt: int) -> bool:
    """Behind a router whose workers rlgen owns: whether a request that failed because its worker
    died goes again (`RouterClient.await_may_resend`: bounded, never with no worker left, and
    allowing a moment for a death that does not show yet)."""
    may_resend = getattr(client, "await_may_resend", None)
    return bool(await may_resend(err, attempt)) if may_resend is not None else False


def _dead_note(client: Client) -> str:
    """For an error message: which owned workers have died (none known: empty)."""
    dead_workers = getattr(client, "dead_workers", None)
    dead: list[str] = dead_workers() if dead_workers is not None else []
    if not dead:
        return ""
    alive = getattr(client, "workers_alive", None)
    none_left = alive is not None and not any(alive().values())
    return f" (the worker process of {', '.join(dead)} has died{'; no worker is left' if none_left else ''})"


def _prompts(job: GenerateJob, first: int, stop: int) -> str:
    """The prompts of samples [first, stop), as an error message names them."""
    a, b = first // job.n, (stop - 1) // job.n
    return f"prompt {a}" if a == b else f"prompts {a}..{b}"


def _seeded_copies(job: GenerateJob) -> bool:
    return job.n > 1 and job.sampling.get("sampling_seed") is not None


def _single_spans(job: GenerateJob) -> tuple[list[tuple[int, int]], int]:
    """One request per prompt (its n samples together, so they share one worker's prefix cache),
    and how many may be in flight: the prompts `max_in_flight` chunks would hold.

    A seeded prompt with n > 1 goes as n requests, one sample each: a router takes one
    sampling_params object per request, and one seed for n copies would draw n identical samples.
    """
    prompts_in_flight = max(1, job.max_in_flight * job.chunk_size)
    if _seeded_copies(job):
        return [(s, s + 1) for s in range(job.n_samples)], prompts_in_flight * job.n
    return [(i * job.n, (i + 1) * job.n) for i in range(len(job.prompt_ids))], prompts_in_flight


def request_size(n_prompts: int, *, most: int) -> int:
    """Prompts per /generate request when the caller sets no chunk_size: at most `most`, and small
    enough that a call makes about REQUESTS_PER_CALL requests, so its progress advances in steps
    rather than 0 -> 100% (a request is answered only when all of its samples are done)."""
    return max(1, min(most, -(-n_prompts // REQUESTS_PER_CALL)))


def _payload(job: GenerateJob, start: int, stop: int) -> tuple[dict[str, Any], list[str]]:
    """The /generate body for prompts [start, stop), and the rids it carries."""
    prompts = job.prompt_ids[start:stop]
    # n copies of each prompt, each its own sample with its own rid, rather than SGLang's `n`: for a
    # batch with n > 1, SGLang first prefills the prompts one at a time, each awaited before the
    # next is sent (TokenizerManager._handle_batch_request; its log warns to duplicate instead),
    # which leaves the GPU idle (docs/benchmarks.md).
    ids = [p for p in prompts for _ in range(job.n)]
    rids = [new_rid() for _ in ids]
    sampling: Any = job.sampling
    if _seeded_copies(job):  # one seed for n copies of a prompt would draw n identical samples
        sampling = [seeded_sampling(job.sampling, j) for _ in prompts for j in range(job.n)]
    per_prompt = {name: [v for v in values[start:stop] for _ in range(job.n)] for name, values in job.per_prompt.items()}
    return generate_body(ids, sampling, rids, logprobs=job.logprobs, top_logprobs=job.top_logprobs,
                         per_prompt=per_prompt), rids


def _single_payload(job: GenerateJob, first: int, stop: int) -> tuple[dict[str, Any], list[str]]:
    """The /generate body for samples [first, stop) of one prompt, in the shape a router takes:
    one `rid` string, one `sampling_params` object, per-prompt fields as scalars; and the rids the
    worker gives its samples (SGLang names a batch's items `<rid>_<i>`; a batch of one keeps the rid)."""
    prompt = first // job.n
    ids, count = job.prompt_ids[prompt], stop - first
    rid = new_rid()
    sampling = job.sampling
    if _seeded_copies(job):  # one sample per request: sample j gets seed + j, as in a batched request
        sampling = seeded_sampling(sampling, first % job.n)
    payload = generate_body(ids if count == 1 else [ids] * count, sampling, rid, logprobs=job.logprobs,
                            top_logprobs=job.top_logprobs,
                            per_prompt={name: values[prompt] for name, values in job.per_prompt.items()})
    return payload, [rid] if count == 1 else [f"{rid}_{i}" for i in range(count)]


def _store(job: GenerateJob, first: int, stop: int, entries: list[dict[str, Any]]) -> None:
    if len(entries) != stop - first:
        raise RequestError(f"the server answered {len(entries)} samples for {stop - first}", prompt_index=first // job.n)
    job.results[first:stop] = entries


async def _send_streamed(client: Client, job: GenerateJob, payload: dict[str, Any], first: int, count: int) -> None:
    """Stream one request (samples first..first+count-1): SGLang interleaves the samples' chunks,
    tagged with `index` (cumulative)."""
    t_sent = time.perf_counter()
    last_seen: dict[int, float] = {}
    gaps: dict[int, list[float]] = {}
    finals: dict[int, dict[str, Any]] = {}
    async for chunk in client.generate_stream(payload):
        now = time.perf_counter()
        index = chunk.get("index", 0)
        if index not in last_seen:
            job.ttft_s[first + index] = now - t_sent
        else:
            gaps.setdefault(index, []).append(now - last_seen[index])
        last_seen[index] = now
        if read_answer(chunk).finish != "unknown":  # its last chunk says how it finished
            finals[index] = chunk
    if len(finals) != count:  # a stream that ends early must not leave samples silently unanswered
        raise RequestError(f"the stream ended with {len(finals)} of its {count} samples finished",
                           prompt_index=first // job.n)
    for index, chunk in finals.items():
        chunk.pop("index", None)
        job.results[first + index] = chunk
        intervals = gaps.get(index)
        job.itl_s[first + index] = sum(intervals) / len(intervals) if intervals else None
