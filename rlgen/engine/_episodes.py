"""Multi-turn episodes: the body of `Engine.episodes` and `Engine.submit_episodes`.

Owns: running a call's episodes with options already checked against `core._options.EpisodeOptions`
(the Engine's method resolves them, so a mistake raises before anything here runs): the prompts as
chats and the environment, each built once and checked before anything is sent; the episode runner
(`rlgen.episodes.run_episodes`) on the background loop with the Engine's connection (client,
tokenizer or one with another chat template, context length); an environment written for another
framework made into its adapter's (`rlgen.envs.adapt`), and that framework's own rewards added once
the episodes have ended; each sampled token's weight version index (a turn's answer's
`weight_version` mapped as generate()'s rows are, `ServedWeights.index_of` from the call's start;
a continued turn's tokens labelled by their sample); the call's provenance (as generate's), its progress line, and Ctrl-C (every
episode is handed to `keep`, the Engine's `last_episodes`, the unfinished ones aborted on the server
and marked "cancelled"). Also the background form (`submit_episodes` and its handle, `EpisodesJob`:
`done`, `result`, `cancel`, `progress`, a repr): the runner as a task on rlgen's loop, registered
with the Engine's `Pauses` as a job is (so a weight update pauses the server around its push, and
`pause=None` is "abort" while it runs), its turns given `_EpisodePauses` (the pause gate, the epoch,
a turn a pause ended continued as the same sequence: `episodes._episode.TurnPauses`).

Knows nothing about how an episode runs or how its prompts and data are checked (`rlgen.episodes`),
nor about server processes, scoring or how weights are pushed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, NamedTuple

from ..client._continuation import eos_token_ids
from ..core import _loop, _options
from ..core._errors import RequestError
from ..core._gc import gc_paused
from ..core._progress import ProgressLine
from ..envs import adapt
from ..episodes import EpisodeRecord, Episodes, as_environment, episodes_from_records, run_episodes
from ..episodes._runner import episode_prompts
from ._connection import Connection
from ._jobs import JobParts, job_html
from ._pause import Pauses, shielded
from ._provenance import Provenance
from ._served import ServedWeights

__all__ = ["EpisodesJob", "EpisodesProgress", "episodes", "submit_episodes"]


class _Call:
    """One episodes call, checked and ready to run: its chats, tokenizer, environment, sampling,
    the records the runner fills, and how they become `Episodes`."""

    def __init__(self, conn: Connection, provenance: Provenance, weights: ServedWeights, prompts: Any, env: Any,
                 opts: Mapping[str, Any]) -> None:
        conn.check_ready()
        self.conn, self.provenance, self.weights, self.opts = conn, provenance, weights, opts
        self.version = weights.index  # the version index when the call began
        self.chats = episode_prompts(prompts)
        self.template = opts["chat_template"]
        self.tokenizer = conn.tokenizer if self.template is None else _with_template(conn.tokenizer, self.template)
        # built once: checked before anything is sent; another framework's environment through its adapter
        self.environment = as_environment(adapt(env), timeout=opts["env_timeout"])
        self.sampling = _options.to_sglang(opts)
        self.n, self.max_new_tokens = opts["n"], self.sampling.pop("max_new_tokens")
        self.records: list[EpisodeRecord] = []
        self.started = time.time()

    @property
    def total(self) -> int:
        return len(self.chats) * int(self.n)

    def run(self, on_episode: Callable[[EpisodeRecord], None] | None, pauses: Any = None
            ) -> Coroutine[Any, Any, list[EpisodeRecord]]:
        """The runner over this call's records (`pauses`: a background call's `_EpisodePauses`)."""
        opts = self.opts
        return run_episodes(self.conn.client, self.tokenizer, self.chats, env=self.environment, n=self.n,
                            max_turns=opts["max_turns"], max_new_tokens=self.max_new_tokens, sampling=self.sampling,
                            context_length=self.conn.context_length, data=opts["data"],
                            max_in_flight=opts["max_in_flight"], records=self.records, on_episode=on_episode,
                            batch_turns=opts["batch_turns"], pauses=pauses, version_of=self.version_of)

    def version_of(self, weight_version: Any) -> int:
        """The version index a turn's answer's `weight_version` names (from the call's own on, as
        generate()'s rows), else the call's."""
        i = self.weights.index_of(weight_version, at_least=self.version)
        return self.version if i is None else i

    def result(self) -> Episodes:
        """The records as `Episodes`, with the call's provenance."""
        records = self.records
        versions = [t.get("weight_version") for r in records for t in r.assistant_turns]
        sampling = {**self.sampling, "n": self.n, "max_new_tokens": self.max_new_tokens,
                    "max_turns": self.opts["max_turns"]}
        record = self.provenance.of_call(started=self.started, sampling=sampling, weight_versions=versions, cache=None)
        record["weight_version_labels"] = self.weights.labels  # version index -> the server's weight_version
        if self.template is not None:
            record["chat_template"] = self.template
        return episodes_from_records(records, pad_token_id=self.conn.pad_id, tokenizer=self.tokenizer,
                                     model=self.provenance.model, sampling=record["sampling"], run_record=record,
                                     tools=self.environment.tools, framework=self.environment.kind == "framework",
                                     current_version=self.weights.index)

    def scored(self, done: Episodes, keep: Callable[[Episodes], None]) -> Episodes:
        """`done` with the framework's own rewards, if its environment has some (in threads: they
        may read `environments`), kept unscored first: a Ctrl-C while scoring loses no episode."""
        if self.environment.reward_funcs:
            keep(done)
            # one row per call, so that one environment's failing reward is that row's status only
            done = done.add_rewards(dict(self.environment.reward_funcs), mode="thread", batch_size=1,
                                    progress=self.conn.show(self.opts["progress"]))
        keep(done)
        return done


def episodes(conn: Connection, provenance: Provenance, weights: ServedWeights, keep: Callable[[Episodes], None],
             prompts: Any, *, env: Any, opts: Mapping[str, Any]) -> Episodes:
    """`Engine.episodes` over the Engine's connection, provenance and served weights (each token's
    version index), `opts` resolved against `EpisodeOptions`; `keep` receives the result, also the
    partial one of an interrupted call."""
    call = _Call(conn, provenance, weights, prompts, env, opts)
    # The cyclic GC paused while the episodes run and their result is built (core/_gc: each turn
    # of each episode allocates, and a full collection would walk the notebook's whole heap).
    with ProgressLine("episodes", total=call.total, unit="episode", show=conn.show(opts["progress"])) as line, \
            gc_paused():
        def advance(record: EpisodeRecord) -> None:
            line.advance(1, record.sampled_tokens)

        try:
            _loop.run_sync(call.run(advance), on_wait=line.tick)
        except BaseException:
            if call.records:
                keep(call.result())
            raise
        done = call.result()
    return call.scored(done, keep)


def submit_episodes(parts: JobParts, keep: Callable[[Episodes], None], prompts: Any, *, env: Any,
                    opts: Mapping[str, Any]) -> EpisodesJob:
    """`Engine.submit_episodes`: checked as `episodes()` checks (nothing sent on a mistake), then
    started on rlgen's loop."""
    call = _Call(parts.conn, parts.provenance, parts.weights, prompts, env, opts)
    return EpisodesJob(call, parts, keep)


# -- the background form --------------------------------------------------------------------------
class _EpisodePauses:
    """A background episodes call as the Engine's pauses see it (an `UpdateListener`, registered
    while it runs) and as its turns see them (`episodes._episode.TurnPauses`)."""

    def __init__(self, pauses: Pauses, weights: ServedWeights, eos_ids: list[int]) -> None:
        self._pauses, self._weights, self.eos_ids = pauses, weights, eos_ids
        self.updates = 0  # weight updates made while it ran
        self.on_close: Callable[[], Awaitable[None]] | None = None  # the job's cancel, once it runs

    @property
    def epoch(self) -> int:
        return self._pauses.epoch

    @property
    def version(self) -> int:
        return self._weights.index

    async def ready(self) -> None:
        await self._pauses.wait_open()

    async def resend(self, error: RequestError, epoch: int) -> bool:
        return await self._pauses.resend_after(error, epoch)

    def updated(self, version: int, mode: str) -> None:
        """A weight update was made while the episodes run: nothing to record (a turn's request a
        pause aborted is continued by the turn itself)."""
        self.updates += 1

    async def close(self, reason: str) -> None:
        """The Engine closes: the episodes are cancelled (`EpisodesJob.cancel`)."""
        if self.on_close is not None:
            await self.on_close()


class EpisodesProgress(NamedTuple):
    """A background episodes call's progress: its state, episodes done of the total, assistant
    turns and tokens sampled so far, weight updates made while it ran, seconds."""

    state: str
    done: int
    total: int
    turns: int
    tokens: int
    updates: int
    elapsed_s: float


class EpisodesJob:
    """Episodes running in the background (`eng.submit_episodes(...)`): the cell returns at once,
    and other calls (`eng.update_weights(...)`, generate()) run while they work.

    Usage::

        job = eng.submit_episodes(prompts, env=env, n=4, max_turns=3)
        eng.update_weights(model)       # pauses the server, pushes, continues: the episodes go on
        res = job.result()              # Episodes, as eng.episodes(...) returns them

    A weight update while it runs pauses the server's generation around its push as for a
    `GenerationJob` (`pause=None` is "abort" while it runs). A turn whose request the pause ended
    goes on as the same sequence (its tokens so far as ids, the rest of its budget), so no turn is
    cut short and no token is sampled twice; each turn's `weight_version` is its last request's,
    and each of its tokens carries the version index that sampled it (`res.versions`).
    """

    def __init__(self, call: _Call, parts: JobParts, keep: Callable[[Episodes], None]) -> None:
        self._call, self._parts, self._keep = call, parts, keep
        self._listener = _EpisodePauses(parts.pauses, parts.weights,
                                        eos_token_ids(parts.conn.tokenizer, parts.weights.disk_path))
        self._t0 = time.perf_counter()
        self._task: asyncio.Future[list[EpisodeRecord]] | None = None
        self._cancelled = False
        self._listener.on_close = self._cancel
        self._result: Episodes | None = None
        self._future = asyncio.run_coroutine_threadsafe(self._main(), _loop.get_loop())

    async def _main(self) -> None:
        self._parts.pauses.register(self._listener)
        try:
            if self._cancelled:
                return
            self._task = asyncio.ensure_future(self._call.run(None, self._listener))
            await self._task
        except asyncio.CancelledError:  # cancel(): the runner marked the unfinished episodes "cancelled"
            if not self._cancelled:
                raise
        finally:
            self._parts.pauses.unregister(self._listener)

    async def _cancel(self) -> None:
        self._cancelled = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- state --------------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """"running", "paused" (a weight update's pause holds it), "done", "cancelled" or "failed"."""
        if self._future.done():
            if self._cancelled:
                return "cancelled"
            return "failed" if self._future.exception() is not None else "done"
        return "paused" if self._parts.pauses.paused else "running"

    @property
    def progress(self) -> EpisodesProgress:
        """Episodes ended of the total, assistant turns and tokens sampled so far, updates, seconds."""
        records = list(self._call.records)
        return EpisodesProgress(self.state, sum(r.status != "running" for r in records), self._call.total,
                                sum(len(r.assistant_turns) for r in records), sum(r.sampled_tokens for r in records),
                                self._listener.updates, time.perf_counter() - self._t0)

    def done(self) -> bool:
        """Whether every episode has ended (or the call was cancelled or failed)."""
        return self._future.done()

    def cancel(self) -> None:
        """Stop the episodes: requests in flight are aborted on the server; the episodes that had
        ended keep their status, the others end "cancelled"; `result()` returns them all."""
        if self._future.done():
            return
        shielded(self._cancel())
        try:
            self._future.result(timeout=10.0)
        except Exception:  # a failure is the run's, reported by result()
            pass

    def result(self, timeout: float | None = None) -> Episodes:
        """The `Episodes`, once every episode has ended (as `eng.episodes(...)` returns them; the
        framework's own rewards added, and kept as `eng.last_episodes`).

        Args:
            timeout: seconds to wait at most (TimeoutError; the episodes go on); None: no limit.

        Ctrl-C while waiting stops the wait only (`job.cancel()` stops the episodes).

        Raises:
            TimeoutError: not done within `timeout`. The run's own failure, if it failed.
        """
        if self._result is None:
            try:
                self._future.result(timeout=timeout)
            except TimeoutError:
                raise TimeoutError(f"the episodes were not done within {timeout} s: {self!r}") from None
            self._result = self._call.scored(self._call.result(), self._keep)
        return self._result

    def __repr__(self) -> str:
        p = self.progress
        return (f"<EpisodesJob {p.state} · {p.done}/{p.total} episodes · {p.turns} turns · {p.tokens:,} tokens · "
                f"{p.updates} updates · {p.elapsed_s:.1f} s · version {self._parts.weights.index}>")

    def _repr_html_(self) -> str:
        p = self.progress
        return job_html(p.state, p.done, p.total, f"{p.done:,}/{p.total:,} episodes · {p.turns:,} turns · "
                        f"{p.tokens:,} tokens · {p.updates} weight updates · {p.elapsed_s:.1f} s · weight version "
                        f"{self._parts.weights.index}")


def _with_template(tokenizer: Any, template: str) -> Any:
    """A tokenizer like `tokenizer` whose chat template is `template` (loaded anew through
    transformers, so the Engine's own is untouched)."""
    from transformers import AutoTokenizer

    copy = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    copy.chat_template = template
    return copy
