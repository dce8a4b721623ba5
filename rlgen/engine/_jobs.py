"""Background generation: `Engine.submit` and the `GenerationJob` handle it returns.

Owns: submitting (`submit`: generate()'s options, prompts and checks through `_generation.prepare`,
then the prompts as groups of `n` samples, each a `client._continuation.Continued`; or a
`PartialRollouts` to go on with), the handle (`GenerationJob`: state, progress, `done`, `result`,
`cancel`, `partial`, a text and an HTML repr), the groups a result hands over (whole prompt groups
only: a group's `n` samples together, as GRPO's advantages need them), the groups recycled
(`result(min_done=..., rest="recycle")`: their samples stopped where they are and handed back as a
`PartialRollouts`), and a job's `Rollouts`: its rows built from each sample's entry, `versions` per
token, and the columns of versions (`core._columns.VERSION_COLUMNS`).

Knows nothing about how the job runs on the loop (`_job_run.JobRun`: requests, continuations,
pauses), how weights are pushed (`_weights`), or HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import html
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ..client._answer import seeded_sampling
from ..client._continuation import Continued, StopRules, eos_token_ids
from ..core import _loop, _options
from ..core._options import JobResultOptions
from ..rollouts._runs import new_run_id
from . import _generation
from ._adapter_choice import AdapterSet
from ._connection import Connection
from ._job_run import Group, JobRun
from ._pause import Pauses, shielded
from ._provenance import Provenance
from ._served import ServedWeights

if TYPE_CHECKING:
    from ..rollouts._rollouts import Rollouts

__all__ = ["GenerationJob", "JobParts", "JobProgress", "PartialRollouts", "job_html", "submit"]


@dataclass(frozen=True)
class JobParts:
    """The Engine's parts a job uses (it holds no Engine)."""

    conn: Connection
    adapters: AdapterSet
    pauses: Pauses
    weights: ServedWeights
    provenance: Provenance


@dataclass(frozen=True)
class _Spec:
    """What every request of a job shares, and how many may be in flight."""

    sampling: dict[str, Any]     # SGLang sampling_params, without n (per sample: seeded, reduced)
    n: int
    logprobs: bool
    top_logprobs: int
    max_in_flight: int           # samples in flight at once
    max_batch: int               # samples per batched request
    progress: bool | None


class JobProgress(NamedTuple):
    """A job's progress: its state, samples and prompt groups done, tokens sampled, seconds."""

    state: str
    done: int
    total: int
    groups_done: int
    groups: int
    tokens: int
    elapsed_s: float


class PartialRollouts:
    """Prompt groups a job handed back unfinished (`result(min_done=..., rest="recycle")`): each
    group's `n` samples, the finished ones as they are and the others with every token they had
    sampled (ids, logprobs, versions). `eng.submit(partial)` goes on with them: a sample goes on as
    its sequence (prompt + tokens so far, as token ids) with what is left of its budget. What slime
    calls the partial rollouts of its data buffer (`--partial-rollout`) and APRIL recycles."""

    def __init__(self, groups: list[Group], spec: _Spec) -> None:
        self.groups, self._spec = groups, spec

    def __len__(self) -> int:
        return sum(len(g.samples) for g in self.groups)

    @property
    def tokens(self) -> int:
        """Tokens sampled so far, over every sample."""
        return sum(len(s.ids) for g in self.groups for s in g.samples)

    def __repr__(self) -> str:
        unfinished = sum(not s.done for g in self.groups for s in g.samples)
        return (f"<PartialRollouts {len(self.groups)} prompt groups · {len(self)} samples ({unfinished} unfinished) · "
                f"{self.tokens} tokens so far>")


# -- submitting ---------------------------------------------------------------------------------------
def submit(parts: JobParts, cache: _generation.CachePolicy, hints: _generation.CallWarnings, prompts: Any,
           options: Mapping[str, Any], *, stacklevel: int) -> GenerationJob:
    """`Engine.submit`: checked as generate() checks (nothing sent on a mistake), then started."""
    if isinstance(prompts, PartialRollouts):
        unknown = sorted(set(options) - {"progress"})
        if unknown:
            raise TypeError(f"a PartialRollouts goes on with its own sampling options; {unknown} cannot change now")
        spec = prompts._spec
        if "progress" in options:
            spec = dataclasses.replace(spec, progress=_options.resolve(_options.GenerateOptions, options)["progress"])
        return GenerationJob(parts, [_regroup(g) for g in prompts.groups], spec)
    opts = _options.resolve(_options.GenerateOptions, options)
    if opts["stream"]:
        raise ValueError("submit() streams its requests itself; stream=True is generate()'s timing mode")
    if opts["cache"]:
        raise ValueError("submit() does not use the completion cache (a job's samples may span weight updates): "
                         "leave cache= unset")
    call = _generation.prepare(parts.conn, parts.adapters, cache, parts.weights, hints, prompts,
                               {**opts, "cache": False}, stacklevel=stacklevel + 1)
    job = call.job
    spec = _Spec(sampling=job.sampling, n=job.n, logprobs=job.logprobs, top_logprobs=job.top_logprobs,
                 max_in_flight=job.max_in_flight * job.chunk_size * job.n, max_batch=job.chunk_size * job.n,
                 progress=opts["progress"])
    return GenerationJob(parts, _groups(parts, call, spec), spec)


def _groups(parts: JobParts, call: _generation.Call, spec: _Spec) -> list[Group]:
    """A group of `n` fresh samples per prompt of the call."""
    batch, names = call.batch, call.adapters
    sent = dict(spec.sampling)
    if "stream_interval" not in sent:  # two chunks per sample (its first token and its end), as the sender's
        sent["stream_interval"] = int(sent.get("max_new_tokens") or 1 << 20) + 1
    rules = StopRules.of(sent, eos_ids=eos_token_ids(parts.conn.tokenizer, parts.weights.disk_path),
                         context_length=parts.conn.context_length)
    seeded = spec.n > 1 and sent.get("sampling_seed") is not None
    groups = []
    for i, ids in enumerate(batch.ids):
        adapter = names[i] if names is not None else None
        extra = {"lora_path": adapter} if adapter is not None else {}
        samples = [Continued(list(ids), seeded_sampling(sent, j) if seeded else sent, rules, extra=extra,
                             logprobs_wanted=spec.logprobs, top_wanted=spec.top_logprobs > 0) for j in range(spec.n)]
        groups.append(Group(prompt_ids=list(ids), samples=samples, text=batch.texts[i],
                            chat=batch.chats[i] if batch.chats is not None else None,
                            data={name: values[i] for name, values in batch.data.items()}, adapter=adapter))
    return groups


def _regroup(group: Group) -> Group:
    """A recycled group for a new job (not taken there yet)."""
    return Group(prompt_ids=group.prompt_ids, samples=group.samples, text=group.text, chat=group.chat,
                 data=group.data, adapter=group.adapter)


# -- the handle ---------------------------------------------------------------------------------------
class GenerationJob:
    """Generation running in the background (`eng.submit(...)`): the cell returns at once, and
    other calls (`eng.update_weights(...)`, another generate()) run while it works.

    Usage::

        job = eng.submit(prompts, n=8, max_new_tokens=512)
        eng.update_weights(model)               # pauses the server, pushes, continues: the job goes on
        res = job.result()                      # every row; res.versions: the version of each token
        res = job.result(min_done=0.8)          # once 80% of the prompt groups are done; the rest run on
        res = job.result(min_done=0.8, rest="recycle")  # ... and the rest stopped: job.partial
        next_job = eng.submit(job.partial)      # goes on with them (e.g. after the next update)

    A sample a weight update's pause ended goes on as the same sequence in a new request (its
    tokens so far as ids, the rest of its budget): nothing sampled is lost, no token is sampled
    twice. Each row says how: `n_segments` (requests), `version_min` / `version_max` (the version
    indices that sampled its tokens: 0 for the weights the Engine started with, +1 per update),
    `staleness` (the Engine's version index when the result was built minus `version_min`),
    `kv_staleness` and `num_retractions`; `res.versions` [N, R] holds each token's version.
    docs/generation.md ("Jobs that span a weight update") has what each pause mode guarantees.
    """

    def __init__(self, parts: JobParts, groups: list[Group], spec: _Spec) -> None:
        self._parts, self._groups, self._spec = parts, groups, spec
        self._run = JobRun(groups, client=parts.conn.client, pauses=parts.pauses, weights=parts.weights,
                           decode=_decoder(parts.conn), max_in_flight=spec.max_in_flight, max_batch=spec.max_batch,
                           logprobs=spec.logprobs, top_logprobs=spec.top_logprobs)
        self._started = time.time()
        self._t0 = time.perf_counter()
        self._run_id = new_run_id()
        self.partial: PartialRollouts | None = None  # the groups `result(rest="recycle")` handed back
        self._future = asyncio.run_coroutine_threadsafe(self._run.main(), _loop.get_loop())

    # -- state ----------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """"running", "paused" (a weight update's pause holds it), "done", "cancelled" or "failed"."""
        if self._run.failure is not None:
            return "failed"
        if self._run.finished:
            return "cancelled" if self._run.cancelled else "done"
        return "paused" if self._parts.pauses.paused else "running"

    @property
    def progress(self) -> JobProgress:
        """Samples and prompt groups done out of the total, tokens sampled so far, seconds."""
        run = self._run
        return JobProgress(self.state, run.done, len(run.samples), run.groups_done, len(self._groups), run.tokens,
                           time.perf_counter() - self._t0)

    def done(self) -> bool:
        """Whether every sample has finished (or was stopped)."""
        return self._run.finished

    def cancel(self) -> None:
        """Stop the job: requests in flight are aborted on the server; every sample keeps what it
        sampled (the unfinished ones end as "abort"), and `result()` returns them."""
        if self._run.finished:
            return
        shielded(self._run.cancel("the job was cancelled"))
        self._wait_finished(10.0)

    # -- results ------------------------------------------------------------------------------------
    def result(self, timeout: float | None = None, *, min_done: float | None = None, rest: str = "keep") -> Rollouts:
        """The rows of the prompt groups that are done and not handed over before, once the job is
        done (or `min_done` of its prompt groups are); prompt-major, with the job's prompt_index.

        Args:
            timeout: seconds to wait at most (TimeoutError; the job goes on); None: no limit.
            min_done: return once this share of the job's prompt groups (all `n` samples of a prompt)
                is done, in (0, 1]; the groups done by then are returned, whole.
            rest: with `min_done`, the groups not done: "keep" (they run on: a later `result()`
                returns them) or "recycle" (their requests aborted now, their tokens kept, and the
                groups handed back in `job.partial` for `eng.submit(job.partial)`).

        Ctrl-C while waiting stops the wait only: the job goes on (`job.cancel()` stops it).

        Raises:
            ValueError / TypeError: bad options (refused before anything is sent or stopped).
            TimeoutError: not done within `timeout`. The job's own failure, if it failed.
        """
        opts = _options.resolve(JobResultOptions, {"timeout": timeout, "min_done": min_done, "rest": rest})
        if opts["rest"] == "recycle" and opts["min_done"] is None:
            raise ValueError("rest='recycle' stops the groups not done once min_done of them are: give min_done")
        wanted = len(self._groups) if opts["min_done"] is None else math.ceil(opts["min_done"] * len(self._groups))
        self._wait(wanted, opts["timeout"], whole=opts["min_done"] is None)
        if self._run.failure is not None:
            raise self._run.failure
        if opts["rest"] == "recycle":
            self._recycle()
        ready = [g for g in self._groups if g.done and not g.taken]
        for group in ready:
            group.taken = True
        return self._build(ready)

    def _wait(self, groups: int, timeout: float | None, *, whole: bool) -> None:
        """Wait (with a progress line) until `groups` prompt groups are done or the job has ended;
        `whole`: until the job has ended (its last answer is in a moment before its run ends, and
        `result()` without `min_done` promises `done()` after it)."""
        from ..core._progress import ProgressLine

        run, deadline = self._run, None if timeout is None else time.monotonic() + timeout
        show = self._parts.conn.show(self._spec.progress)
        with ProgressLine("job", total=len(run.samples), unit="sample", show=show) as line:
            while (whole or run.groups_done < groups) and not run.finished and run.failure is None:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"the job has {run.groups_done} of the {groups} prompt groups waited for "
                                       f"done after {timeout} s; it goes on")
                run.changed.clear()
                run.changed.wait(0.25)
                line.advance(run.done - line.done, run.tokens - line.tokens)
            line.advance(run.done - line.done, run.tokens - line.tokens)

    def _wait_finished(self, timeout: float) -> None:
        try:
            self._future.result(timeout=timeout)
        except Exception:  # the failure is the run's, reported by result()
            pass

    def _recycle(self) -> None:
        """Stop the groups not done, and hand them back in `partial` (with the groups of earlier calls)."""
        rest = [g for g in self._groups if not g.done and not g.taken]
        if not rest:
            return
        shielded(self._run.stop([s for g in rest for s in g.samples if not s.done]))
        for group in rest:
            group.taken = True
        earlier = self.partial.groups if self.partial is not None else []
        self.partial = PartialRollouts([*earlier, *rest], self._spec)

    def _build(self, groups: Sequence[Group]) -> Rollouts:
        number = {id(g): i for i, g in enumerate(self._groups)}
        return build(self._parts, groups, self._spec, run=self._run_id, started=self._started,
                     numbers=[number[id(g)] for g in groups])

    # -- display --------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        p = self.progress
        return (f"<GenerationJob {p.state} · {p.done}/{p.total} samples · {p.groups_done}/{p.groups} prompt groups · "
                f"{p.tokens:,} tokens · {p.elapsed_s:.1f} s · version {self._parts.weights.index}>")

    def _repr_html_(self) -> str:
        p = self.progress
        partial = "" if self.partial is None else f" · {self.partial!r}"
        return job_html(p.state, p.done, p.total, f"{p.done:,}/{p.total:,} samples · {p.groups_done:,}/{p.groups:,} "
                        f"prompt groups · {p.tokens:,} tokens · {p.elapsed_s:.1f} s · weight version "
                        f"{self._parts.weights.index}{partial}")


def job_html(state: str, done: int, total: int, details: str) -> str:
    """A background job's line in a notebook: its state, coloured, a bar of `done` out of `total`,
    and `details` (plain text, escaped here)."""
    colour = {"running": "#2a7", "paused": "#c80", "done": "#2a7", "cancelled": "#888", "failed": "#c33"}[state]
    bar = f'<progress value="{done}" max="{max(total, 1)}" style="width:12em;vertical-align:middle"></progress>'
    return (f'<div class="rlgen-rollouts" style="font-family:monospace;white-space:normal">'
            f'<span style="color:{colour};font-weight:bold">{state}</span> {bar} {html.escape(details)}</div>')


def _decoder(conn: Connection) -> Any:
    tokenizer = conn.tokenizer

    def decode(ids: list[int], skip_special_tokens: bool) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    return decode


# -- a result -----------------------------------------------------------------------------------------
def build(parts: JobParts, groups: Sequence[Group], spec: _Spec, *, run: str, started: float,
          numbers: Sequence[int]) -> Rollouts:
    """The `Rollouts` of `groups` (whole, in order; `numbers` their prompt_index in the job)."""
    from ..rollouts._build import rollouts_from_responses

    decode = _decoder(parts.conn)
    samples = [s for g in groups for s in g.samples]
    names = [g.adapter for g in groups]
    sampling = {**spec.sampling, "n": spec.n}
    record = parts.provenance.of_call(started=started, sampling=sampling, cache=None,
                                      adapters=names if any(n is not None for n in names) else None,
                                      weight_versions=[seg.weight_version for s in samples for seg in s.segments])
    record["weight_version_labels"] = parts.weights.labels  # version index -> the server's weight_version
    return rollouts_from_responses(
        [s.entry(decode) for s in samples], prompt_ids=[g.prompt_ids for g in groups],
        prompt_texts=[g.text for g in groups], n=spec.n, pad_token_id=parts.conn.pad_id,
        extra=_columns(parts, groups, spec.n), model=parts.provenance.model, sampling=sampling,
        decode=parts.conn.token_text, record=record, token_versions=[s.versions for s in samples],
        prompt_numbers=list(numbers), run=run)


def _columns(parts: JobParts, groups: Sequence[Group], n: int) -> dict[str, list[Any]]:
    """The client's columns (chat messages, adapters, versions) and the prompts' data, per row."""
    current = parts.weights.index
    extra: dict[str, list[Any]] = {}
    if any(g.chat is not None for g in groups):
        extra["prompt_messages"] = [g.chat for g in groups for _ in range(n)]
    names = [g.adapter for g in groups]
    extra.update(parts.adapters.column(names if any(a is not None for a in names) else None, len(groups), n=n))
    for name in dict.fromkeys(k for g in groups for k in g.data):
        extra[name] = [g.data.get(name) for g in groups for _ in range(n)]
    samples = [s for g in groups for s in g.samples]
    low = [min(s.versions) if s.versions else _first_version(s, current) for s in samples]
    extra.update({
        "version_min": low,
        "version_max": [max(s.versions) if s.versions else _first_version(s, current) for s in samples],
        "staleness": [current - v for v in low],
        "n_segments": [len(s.segments) for s in samples],
        "kv_staleness": [s.kv() for s in samples],
        "num_retractions": [sum(seg.retractions for seg in s.segments) for s in samples],
    })
    return extra


def _first_version(sample: Continued, current: int) -> int:
    """The version of a sample without tokens: its first request's, else the current one."""
    return sample.segments[0].sent_version if sample.segments else current

