"""The CPU model runner: a scheduler thread that owns a transformers causal LM.

Owns: loading (and reloading) the weights, releasing and resuming memory (weights, KV cache) the
way SGLang's memory saver does, the one running batch (left-padded, with a KV cache), prefill with
prompt logprobs and prefix-cache hits (`_prefix_cache`), the manual decode loop, per-row sampling
(temperature, top-k/top-p/min-p, penalties, seeds), stop conditions, aborts, and the inbox through
which the HTTP layer submits work. It knows nothing about HTTP or JSON: results leave as
`SeqOutput` snapshots through each job's `sink` callback, called on the scheduler thread.

Batching works like a small continuous-batching engine. Waiting jobs are prefilled together as
one padded batch and merged into the running batch (both are padded on the left to a common
length). Every decode step then runs all running rows through the model at once. Finished or
aborted rows leave at step boundaries. Position ids are tracked per row, so the left padding does
not change results beyond float rounding. A prompt whose prefix is cached is prefilled from the
cached keys and values plus its remaining tokens; in the batch that prefix sits left of the new
tokens, with padding between them where rows differ (masked like the left padding).
"""

from __future__ import annotations

import inspect
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from rlgen.cpu_server import _faults
from rlgen.cpu_server._prefix_cache import PrefixCache

logger = logging.getLogger("rlgen.cpu_server")

# SGLang rewrites temperatures below this to greedy (sampling_params.py, _SAMPLING_EPS).
_GREEDY_EPS = 1e-6
# Logprobs are clamped like SGLang's sampler does, so -inf never reaches JSON (orjson writes null).
_LOGPROB_MIN = torch.finfo(torch.float32).min
# Every this many decode steps, log a "Decode batch" line (SGLang's decode_log_interval).
_DECODE_LOG_INTERVAL = 40
# The prefix cache's default size: a bound on the memory it holds, whatever the traffic.
DEFAULT_PREFIX_CACHE_BYTES = 256 << 20
# The memory tags of SGLang's memory saver (constants.py: GPU_MEMORY_ALL_TYPES).
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling parameters of one sequence (the HTTP layer builds these)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1


@dataclass
class SeqOutput:
    """A snapshot of one sequence, handed to the HTTP layer (cumulative, never a delta)."""

    rid: str
    prompt_tokens: int
    output_ids: list[int]
    text: str
    finish_reason: dict[str, Any] | None
    input_token_logprobs: list[tuple[float | None, int]] | None = None
    input_top_logprobs: list[list[tuple[float, int]] | None] | None = None
    output_token_logprobs: list[tuple[float, int]] | None = None
    output_top_logprobs: list[list[tuple[float, int]]] | None = None
    # (HTTP status, message) when the scheduler failed this sequence.
    error: tuple[int, str] | None = None
    # Prompt tokens whose keys and values came from the prefix cache (SGLang's cached_tokens).
    cached_tokens: int = 0
    # time.monotonic() when the scheduler took this snapshot: a finished sequence's finish time, so
    # that each row of a batch gets its own e2e_latency, as in SGLang
    produced_at: float = field(default_factory=time.monotonic)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass
class Job:
    """One sequence to generate: a prompt, or one of its n samples."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    sink: Callable[[SeqOutput], None]
    return_logprob: bool = False
    # Already resolved by the HTTP layer: 0 <= logprob_start_len < len(input_ids).
    logprob_start_len: int = 0
    top_logprobs_num: int = 0
    stream: bool = False


@dataclass
class _Seq:
    """The scheduler's mutable state of one running sequence."""

    job: Job
    generator: torch.Generator | None
    output_ids: list[int] = field(default_factory=list)
    out_logprobs: list[tuple[float, int]] = field(default_factory=list)
    out_top: list[list[tuple[float, int]]] = field(default_factory=list)
    in_logprobs: list[tuple[float | None, int]] | None = None
    in_top: list[list[tuple[float, int]] | None] | None = None
    finish_reason: dict[str, Any] | None = None
    # How many trailing output tokens to decode when looking for stop strings.
    stop_tail_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class _Batch:
    """The running rows: KV cache, attention mask and per-row decode state, all row-aligned."""

    seqs: list[_Seq]
    cache: DynamicCache
    mask: torch.Tensor  # [B, T] int64, 0 on left padding; T == cache length
    next_pos: torch.Tensor  # [B] position id of the token fed next
    last_tokens: torch.Tensor  # [B] the token fed next
    counts: torch.Tensor  # [B, V] float32 counts of output tokens (for penalties)


@dataclass
class _Call:
    """A control operation run on the scheduler thread.

    A barrier call runs once the work submitted before it has finished; an immediate one runs as
    soon as the scheduler takes it from the inbox (between two steps).
    """

    fn: Callable[[], Any]
    done: Callable[[Any, BaseException | None], None]
    barrier: bool = True


class _Abort:
    def __init__(self, rid: str | None) -> None:
        self.rid = rid  # None means abort everything


class Runner:
    """Owns the model; `start()` runs the scheduler loop on a daemon thread.

    Thread contract: `submit`, `abort`, `call` and the read-only properties may be called from
    any thread; everything else runs on the scheduler thread only.
    """

    def __init__(
        self,
        model_path: str,
        *,
        context_length: int | None = None,
        max_running_requests: int = 64,
        max_prefill_tokens: int = 8192,
        random_seed: int | None = None,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    ) -> None:
        self.model_path = model_path
        # The scheduler thread has its own tokenizer: HF fast tokenizers are not safe to share
        # across threads (concurrent calls can fail with "Already borrowed").
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = _load_model(model_path)
        self.model_type = type(self.model).__name__
        config: Any = self.model.config
        self.vocab_size = int(config.vocab_size)
        self.context_length: int = context_length or int(getattr(config, "max_position_embeddings", 4096))
        self.eos_token_ids = _eos_token_ids(self.model, self.tokenizer)
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.rng = torch.Generator().manual_seed(random_seed if random_seed is not None else 0)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        # Memory tags released and not yet resumed (scheduler thread; read by others for display).
        self.released: frozenset[str] = frozenset()
        # Shapes of the released parameters, to take their memory back on resume.
        self._released_shapes: dict[str, tuple[torch.Size, torch.dtype]] = {}

        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waiting: deque[Job | _Call] = deque()
        self._batch: _Batch | None = None
        self._thread = threading.Thread(target=self._loop, name="rlgen-cpu-scheduler", daemon=True)
        self._step_delay = _faults.step_delay()
        # Read by other threads (health checks, logs); plain attribute writes are atomic enough.
        self.last_progress = time.monotonic()
        self.num_running = 0
        self.num_waiting = 0
        self._decode_steps = 0
        self._decode_tokens = 0
        self._decode_log_start = time.monotonic()

    # ---- API for other threads -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, jobs: list[Job]) -> None:
        """Queue jobs; jobs submitted in one call are prefilled together when they fit."""
        self._inbox.put(list(jobs))

    def abort(self, rid: str | None) -> None:
        """Abort the sequence with this rid (None: all). Unknown rids are ignored."""
        self._inbox.put(_Abort(rid))

    def call(
        self, fn: Callable[[], Any], done: Callable[[Any, BaseException | None], None], *, barrier: bool = True
    ) -> None:
        """Run `fn` on the scheduler thread, then `done(result, error)` there.

        With `barrier`, `fn` waits until the work submitted before it has finished and delays the
        work submitted after it; without, it runs between two steps of the running batch.
        """
        self._inbox.put(_Call(fn, done, barrier))

    @property
    def busy(self) -> bool:
        return self.num_running > 0 or self.num_waiting > 0

    def reload_weights(self, model_path: str) -> tuple[bool, str]:
        """Load weights from `model_path` into the live model (scheduler thread; use `call`)."""
        if "weights" in self.released:
            # On SGLang this would write into unmapped GPU memory; here it is refused instead.
            return False, "Failed to update weights: the weights are released; resume_memory_occupation first."
        try:
            fresh = _load_model(model_path)
        except Exception as e:
            return False, f"Failed to get weights iterator: {e}."
        # Check everything before copying anything, so a failed update leaves the old weights.
        current = self.model.state_dict()
        incoming = fresh.state_dict()
        if type(fresh) is not type(self.model) or current.keys() != incoming.keys():
            problem = f"the checkpoint is a {type(fresh).__name__} with other parameters than this {self.model_type}"
            return False, f"Failed to update weights: {problem}.\nRolling back to original weights."
        mismatched = [name for name, tensor in incoming.items() if tensor.shape != current[name].shape]
        if mismatched:
            problem = f"shape mismatch in {mismatched[:3]}"
            return False, f"Failed to update weights: {problem}.\nRolling back to original weights."
        self.model.load_state_dict(incoming, strict=True)
        self.model_path = model_path
        # Cached keys and values were computed with the old weights (SGLang flushes here too).
        self.prefix_cache.clear()
        return True, "Succeeded to update model weights."

    def flush_cache(self) -> bool:
        """Empty the prefix cache; refused (False) while requests run or wait, as in SGLang.

        Scheduler thread: use `call(..., barrier=False)`.
        """
        if self._batch is not None or any(isinstance(item, Job) for item in self._waiting):
            return False
        self.prefix_cache.clear()
        return True

    def release_memory(self, tags: list[str] | None) -> None:
        """Free the memory of `tags` (all if None or empty), like SGLang with --enable-memory-saver.

        "weights": every parameter's storage is freed (the tensors become empty); "kv_cache": the
        prefix cache is emptied (the running batch's cache is already gone: this is a barrier
        call). Generation fails until the tags are resumed. Unknown tags change nothing.
        Scheduler thread: use `call`.
        """
        releasing = _memory_tags(tags)
        if "weights" in releasing and "weights" not in self.released:
            for name, param in self.model.named_parameters():
                self._released_shapes[name] = (param.shape, param.dtype)
                param.data = torch.empty(0, dtype=param.dtype)
        if releasing & {"weights", "kv_cache"}:
            # SGLang flushes on a kv_cache release; on a weights release the cached keys and
            # values belong to weights that are gone.
            self.prefix_cache.clear()
        self.released = self.released | releasing

    def resume_memory(self, tags: list[str] | None) -> None:
        """Take the memory of `tags` back (all if None or empty).

        As in SGLang 0.5.17, resumed weights get their memory back but not their values: they are
        zeros until `reload_weights` (SGLang's update_weights_from_disk) loads them. Resuming a
        tag that is not released changes nothing (SGLang's scheduler raises KeyError there).
        Scheduler thread: use `call`.
        """
        resuming = _memory_tags(tags) & self.released
        if "weights" in resuming:
            parameters = dict(self.model.named_parameters())
            for name, (shape, dtype) in self._released_shapes.items():
                parameters[name].data = torch.zeros(shape, dtype=dtype)
            self._released_shapes.clear()
        self.released = self.released - resuming

    # ---- the scheduler loop ------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                try:
                    self._iterate()
                except Exception:
                    logger.exception("Scheduler iteration failed; failing the running batch")
                    self._fail_running("Internal scheduler error; see the server log.")
                self.num_running = len(self._batch.seqs) if self._batch else 0
                self.num_waiting = len(self._waiting)

    def _iterate(self) -> None:
        """One scheduler step: take new work, then run a control call, a prefill or a decode step."""
        # Sleep in the inbox only when there is nothing at all to do.
        self._take_inbox(block=self._batch is None and not self._waiting)
        if self._run_barrier_call():
            return
        jobs = self._admit()
        if jobs and self.released:
            self._refuse_while_released(jobs)
        elif jobs:
            self._prefill_and_merge(jobs)
        elif self._batch is not None:
            self._decode_step()

    def _refuse_while_released(self, jobs: list[Job]) -> None:
        # SGLang has no such check (its kernels would read unmapped memory); a clear error is kinder.
        message = (
            f"Cannot generate: memory is released ({', '.join(sorted(self.released))}); call "
            "/resume_memory_occupation, and reload the weights with /update_weights_from_disk, first."
        )
        for job in jobs:
            _deliver(job.sink, _error_output(_Seq(job, None), message, status=503))

    def _fail_running(self, message: str) -> None:
        if self._batch is not None:
            for seq in self._batch.seqs:
                _deliver(seq.job.sink, _error_output(seq, message))
        self._batch = None

    def _take_inbox(self, block: bool) -> None:
        """Move everything from the inbox to the waiting queue; apply aborts at once."""
        items: list[Any] = [self._inbox.get()] if block else []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for item in items:
            if isinstance(item, _Abort):
                self._apply_abort(item.rid)
            elif isinstance(item, _Call) and not item.barrier:
                _run_call(item)
            elif isinstance(item, _Call):
                self._waiting.append(item)
            else:
                self._waiting.extend(item)

    def _apply_abort(self, rid: str | None) -> None:
        def hit(job: Job) -> bool:
            return rid is None or job.rid == rid

        # Waiting jobs answer like SGLang's "Abort in waiting queue".
        kept: deque[Job | _Call] = deque()
        for item in self._waiting:
            if isinstance(item, Job) and hit(item):
                reason = {"type": "abort", "message": "Abort in waiting queue"}
                _deliver(item.sink, SeqOutput(item.rid, len(item.input_ids), [], "", reason))
            else:
                kept.append(item)
        self._waiting = kept
        # Running rows finish now with what they have.
        if self._batch is not None:
            aborted = [s for s in self._batch.seqs if hit(s.job)]
            for seq in aborted:
                seq.finish_reason = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
                self._emit(seq)
            if aborted:
                self._drop_finished()

    def _run_barrier_call(self) -> bool:
        """Run a control call at the front of the queue once the batch has drained."""
        if not self._waiting or not isinstance(self._waiting[0], _Call) or self._batch is not None:
            return False
        call = self._waiting.popleft()
        assert isinstance(call, _Call)
        _run_call(call)
        return True

    def _admit(self) -> list[Job]:
        """Take waiting jobs that fit the running and prefill-token budgets (at least one)."""
        running = len(self._batch.seqs) if self._batch else 0
        jobs: list[Job] = []
        longest = 0
        while self._waiting and isinstance(self._waiting[0], Job):
            job = self._waiting[0]
            if running + len(jobs) >= self.max_running_requests:
                break
            longest_if_added = max(longest, len(job.input_ids))
            # Prefill cost is rows x longest prompt (left padding); one long prompt always fits.
            if jobs and longest_if_added * (len(jobs) + 1) > self.max_prefill_tokens:
                break
            jobs.append(job)
            longest = longest_if_added
            self._waiting.popleft()
        return jobs

    # ---- prefill -------------------------------------------------------------------------------

    def _prefill_and_merge(self, jobs: list[Job]) -> None:
        started = time.monotonic()
        seqs = [_Seq(job, _seeded_generator(job.params.sampling_seed), stop_tail_tokens=self._stop_tail(job)) for job in jobs]
        try:
            batch = self._prefill(seqs)
        except Exception as e:
            logger.exception("Prefill failed")
            for seq in seqs:
                _deliver(seq.job.sink, _error_output(seq, f"Prefill failed: {e!r}"))
            return
        num_cached = sum(seq.cached_tokens for seq in seqs)
        num_tokens = sum(len(job.input_ids) for job in jobs) - num_cached
        self._batch = batch if self._batch is None else _merge(self._batch, batch)
        self._drop_finished()
        self.last_progress = time.monotonic()
        logger.info(
            f"Prefill batch. #new-seq: {len(jobs)}, #new-token: {num_tokens}, #cached-token: {num_cached}, "
            f"#running-req: {len(self._batch.seqs) if self._batch else 0}, #queue-req: {len(self._waiting)}, "
            f"time: {time.monotonic() - started:.3f}s"
        )

    def _prefill(self, seqs: list[_Seq]) -> _Batch:
        """Prefill `seqs` as one batch: cached prefixes (right-aligned) then the new tokens.

        Row r's columns are [padding][cached prefix m_r][padding][new tokens s_r], the prefix part
        P = max m_r wide and the new part S = max s_r wide; the mask hides the padding.
        """
        hits = [self._match_prefix(seq.job) for seq in seqs]
        for seq, (cached, _) in zip(seqs, hits):
            seq.cached_tokens = cached
        lengths = [len(s.job.input_ids) for s in seqs]
        cached_lens = [cached for cached, _ in hits]
        new_lens = [n - m for n, m in zip(lengths, cached_lens)]
        width, prefix_width = max(new_lens), max(cached_lens)
        pad_id = self.eos_token_ids[0] if self.eos_token_ids else 0
        input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        new_mask = torch.zeros((len(seqs), width), dtype=torch.long)
        prefix_mask = torch.zeros((len(seqs), prefix_width), dtype=torch.long)
        for row, seq in enumerate(seqs):
            m, s = cached_lens[row], new_lens[row]
            input_ids[row, width - s :] = torch.tensor(seq.job.input_ids[m:], dtype=torch.long)
            new_mask[row, width - s :] = 1
            prefix_mask[row, prefix_width - m :] = 1
        positions = (new_mask.cumsum(-1) - 1).clamp(min=0) + torch.tensor(cached_lens)[:, None]
        cache = _new_cache(_prefix_layers(hits, prefix_width) if prefix_width else [])
        mask = torch.cat([prefix_mask, new_mask], dim=1)
        hidden = self._forward(input_ids, mask, positions, cache)  # [B, S, H]

        # Prompt logprobs only where asked, position by position (never the full [B, T, V]).
        for row, seq in enumerate(seqs):
            if seq.job.return_logprob:
                self._fill_input_logprobs(seq, hidden[row, width - new_lens[row] :], offset=cached_lens[row])
        self._cache_prompts(seqs, cache, cached_lens, new_lens)

        logits = self._logits(hidden[:, -1, :])  # [B, V]
        batch = _Batch(
            seqs=seqs,
            cache=cache,
            mask=mask,
            next_pos=torch.tensor(lengths, dtype=torch.long),
            last_tokens=torch.zeros(len(seqs), dtype=torch.long),
            counts=torch.zeros((len(seqs), logits.shape[-1]), dtype=torch.float32),
        )
        # max_new_tokens == 0 is prefill only: nothing is sampled (SGLang reports length 0).
        for seq in seqs:
            if seq.job.params.max_new_tokens == 0:
                seq.finish_reason = {"type": "length", "length": 0}
                self._emit(seq)
        self._sample_and_append(batch, logits)
        return batch

    def _match_prefix(self, job: Job) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The cached prefix this job may reuse: at least its last prompt token is computed (its
        logits pick the first output token), and none of the positions whose prompt logprobs it
        asked for (their hidden states are needed), as SGLang limits its prefix match."""
        if not self.prefix_cache.enabled:
            return 0, None
        limit = len(job.input_ids) - 1
        if job.return_logprob:
            limit = min(limit, job.logprob_start_len)
        return self.prefix_cache.match(job.input_ids, limit)

    def _cache_prompts(self, seqs: list[_Seq], cache: DynamicCache, cached_lens: list[int], new_lens: list[int]) -> None:
        """Insert each prompt's keys and values (cached prefix + new part) into the prefix cache."""
        if not self.prefix_cache.enabled:
            return
        layers = _kv(cache)
        total = layers[0][0].shape[2] if layers else 0
        prefix_width = total - max(new_lens, default=0)
        for row, seq in enumerate(seqs):
            ids = seq.job.input_ids
            if self.prefix_cache.contains(ids):
                continue
            m, s = cached_lens[row], new_lens[row]
            parts = [slice(prefix_width - m, prefix_width), slice(total - s, total)]
            # torch.cat copies: the entry must not keep the batch's growing buffers alive.
            self.prefix_cache.insert(ids, [
                (torch.cat([k[row, :, p] for p in parts], dim=1), torch.cat([v[row, :, p] for p in parts], dim=1))
                for k, v in layers
            ])  # fmt: skip

    def _fill_input_logprobs(self, seq: _Seq, hidden: torch.Tensor, offset: int = 0) -> None:
        """SGLang's shape: entries for prompt[s:], the first one's logprob always None.

        `hidden[i]` is the hidden state at prompt position `offset + i` (positions before
        `offset` came from the prefix cache, which never covers position s or later).
        """
        ids = seq.job.input_ids
        start = seq.job.logprob_start_len
        entries: list[tuple[float | None, int]] = [(None, ids[start])]
        tops: list[list[tuple[float, int]] | None] = [None]
        if start + 1 < len(ids):
            # Position j predicts token j + 1: positions start .. n-2 give tokens start+1 .. n-1.
            logprobs = torch.log_softmax(self._logits(hidden[start - offset : -1]), dim=-1).clamp(min=_LOGPROB_MIN)
            targets = torch.tensor(ids[start + 1 :], dtype=torch.long)
            picked = logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
            entries.extend(zip(picked, ids[start + 1 :]))
            if seq.job.top_logprobs_num > 0:
                tops.extend(_top_k(logprobs, seq.job.top_logprobs_num))
        seq.in_logprobs = entries
        seq.in_top = tops if seq.job.top_logprobs_num > 0 else None

    # ---- decode --------------------------------------------------------------------------------

    def _decode_step(self) -> None:
        batch = self._batch
        assert batch is not None
        if self._step_delay:
            time.sleep(self._step_delay)
        try:
            batch.mask = torch.cat([batch.mask, torch.ones((len(batch.seqs), 1), dtype=torch.long)], dim=1)
            hidden = self._forward(batch.last_tokens[:, None], batch.mask, batch.next_pos[:, None], batch.cache)
            batch.next_pos += 1
            logits = self._logits(hidden[:, -1, :])
            self._sample_and_append(batch, logits)
        except Exception as e:
            logger.exception("Decode step failed")
            for seq in batch.seqs:
                _deliver(seq.job.sink, _error_output(seq, f"Decode step failed: {e!r}"))
            self._batch = None
            return
        self._drop_finished()
        self.last_progress = time.monotonic()
        self._log_decode(len(batch.seqs))

    def _forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """Run the decoder (without the LM head) and return the last hidden states."""
        decoder = self.model.get_decoder()  # type: ignore[no-untyped-call]
        kwargs = {_cache_kwarg(decoder): cache}
        out = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **kwargs)
        return cast(torch.Tensor, out.last_hidden_state)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.model.get_output_embeddings()  # type: ignore[no-untyped-call]
        assert head is not None, "a causal LM has an LM head"
        return cast(torch.Tensor, head(hidden).float())

    def _log_decode(self, num_rows: int) -> None:
        self._decode_steps += 1
        self._decode_tokens += num_rows
        if self._decode_steps % _DECODE_LOG_INTERVAL:
            return
        elapsed = max(time.monotonic() - self._decode_log_start, 1e-9)
        num_tokens = int(self._batch.mask.sum()) if self._batch else 0
        logger.info(
            f"Decode batch. #running-req: {num_rows}, #token: {num_tokens}, token usage: 0.00, "
            f"cuda graph: False, gen throughput (token/s): {self._decode_tokens / elapsed:.2f}, "
            f"#queue-req: {len(self._waiting)}"
        )
        self._decode_tokens = 0
        self._decode_log_start = time.monotonic()

    # ---- sampling ------------------------------------------------------------------------------

    def _sample_and_append(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Pick each live row's next token, record logprobs, append it and check stops."""
        live = [row for row, seq in enumerate(batch.seqs) if seq.finish_reason is None]
        if not live:
            return
        index = torch.tensor(live, dtype=torch.long)
        seqs = [batch.seqs[row] for row in live]
        logits = self._apply_penalties(logits[index], batch.counts[index], seqs)
        tokens, logprobs = self._choose(logits, seqs)
        batch.last_tokens[index] = tokens
        batch.counts[index, tokens] += 1.0
        token_list = tokens.tolist()
        want = [i for i, seq in enumerate(seqs) if seq.job.return_logprob]
        picked = logprobs[torch.arange(len(seqs)), tokens].tolist() if want else []
        for i, seq in enumerate(seqs):
            token = token_list[i]
            seq.output_ids.append(token)
            if seq.job.return_logprob:
                seq.out_logprobs.append((picked[i], token))
                if seq.job.top_logprobs_num > 0:
                    seq.out_top.append(_top_k(logprobs[i : i + 1], seq.job.top_logprobs_num)[0])
            seq.finish_reason = self._check_finished(seq)
            if seq.finish_reason is not None:
                self._emit(seq)
            elif seq.job.stream:
                snapshot = self._snapshot(seq)
                # Like SGLang, skip a chunk whose text may be the start of a stop string.
                if not _ends_with_stop_prefix(snapshot.text, seq.job.params.stop):
                    _deliver(seq.job.sink, snapshot)

    def _apply_penalties(self, logits: torch.Tensor, counts: torch.Tensor, seqs: list[_Seq]) -> torch.Tensor:
        """Output-token penalties and the min_new_tokens ban on stop tokens, applied to the logits."""
        rep = torch.tensor([s.job.params.repetition_penalty for s in seqs])
        freq = torch.tensor([s.job.params.frequency_penalty for s in seqs])
        pres = torch.tensor([s.job.params.presence_penalty for s in seqs])
        if bool((rep != 1.0).any() or (freq != 0.0).any() or (pres != 0.0).any()):
            seen = counts > 0
            scaled = torch.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
            logits = torch.where(seen, scaled, logits)
            logits = logits - freq[:, None] * counts - pres[:, None] * seen.float()
        for i, seq in enumerate(seqs):
            if len(seq.output_ids) < seq.job.params.min_new_tokens:
                banned = list(set(self.eos_token_ids) | seq.job.params.stop_token_ids)
                logits[i, banned] = float("-inf")
        return logits

    def _choose(self, logits: torch.Tensor, seqs: list[_Seq]) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (tokens [b], logprobs [b, V]).

        Logprobs follow SGLang's sampler: log_softmax(logits / temperature), taken after
        temperature and before top-k/top-p/min-p filtering. Greedy rows use temperature 1.
        """
        greedy = torch.tensor([s.job.params.greedy for s in seqs])
        temps = torch.tensor([1.0 if s.job.params.greedy else s.job.params.temperature for s in seqs])
        logprobs = torch.log_softmax(logits / temps[:, None], dim=-1).clamp(min=_LOGPROB_MIN)
        tokens = logits.argmax(dim=-1)
        sampled = (~greedy).nonzero().flatten().tolist()
        if sampled:
            rows = [seqs[i] for i in sampled]
            probs, ids = _candidates(logprobs[sampled].exp(), rows)
            cdf = probs.cumsum(dim=-1)
            # One uniform draw per row, from the row's own seeded generator when it has one, so a
            # seeded sequence does not depend on what else is in the batch.
            draws = torch.stack([torch.rand((), generator=s.generator or self.rng) for s in rows])
            # right=True: the first token whose cumulative mass exceeds the draw (never a zero-mass one).
            picks = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None], right=True).clamp(max=cdf.shape[-1] - 1)
            tokens[sampled] = picks.squeeze(1) if ids is None else ids.gather(1, picks).squeeze(1)
        return tokens, logprobs

    def _stop_tail(self, job: Job) -> int:
        """SGLang decodes the last stop_str_max_len + 1 tokens to look for stop strings."""
        if not job.params.stop:
            return 0
        return max(len(self.tokenizer.encode(s, add_special_tokens=False)) for s in job.params.stop) + 1

    def _check_finished(self, seq: _Seq) -> dict[str, Any] | None:
        """SGLang's Req.check_finished order: length, then stop tokens, then stop strings."""
        params = seq.job.params
        token = seq.output_ids[-1]
        if len(seq.output_ids) >= params.max_new_tokens:
            return {"type": "length", "length": params.max_new_tokens}
        if not params.ignore_eos and (token in params.stop_token_ids or token in self.eos_token_ids):
            return {"type": "stop", "matched": token}
        if params.stop:
            tail = cast(str, self.tokenizer.decode(seq.output_ids[-seq.stop_tail_tokens :]))
            for stop in params.stop:
                if stop in tail:
                    return {"type": "stop", "matched": stop}
        return None

    # ---- results ---------------------------------------------------------------------------------

    def _emit(self, seq: _Seq) -> None:
        _deliver(seq.job.sink, self._snapshot(seq))

    def _snapshot(self, seq: _Seq) -> SeqOutput:
        job = seq.job
        reason = seq.finish_reason
        ids = seq.output_ids
        # The text drops a matched stop token and is cut at a matched stop string (SGLang's
        # detokenizer trim_matched_stop); output_ids keep everything.
        text_ids = ids
        if reason and not job.params.no_stop_trim and isinstance(reason.get("matched"), int) and reason["matched"]:
            text_ids = ids[:-1]
        text = cast(str, self.tokenizer.decode(text_ids, skip_special_tokens=job.params.skip_special_tokens))
        if reason is None:
            text = text.rstrip("\ufffd")  # hold back an incomplete UTF-8 character while streaming
        elif isinstance(reason.get("matched"), str) and not job.params.no_stop_trim:
            cut = text.find(reason["matched"])
            text = text[:cut] if cut != -1 else text
        return SeqOutput(
            rid=job.rid,
            prompt_tokens=len(job.input_ids),
            output_ids=list(ids),
            text=text,
            finish_reason=reason,
            input_token_logprobs=list(seq.in_logprobs) if seq.in_logprobs is not None else None,
            input_top_logprobs=list(seq.in_top) if seq.in_top is not None else None,
            output_token_logprobs=list(seq.out_logprobs) if job.return_logprob else None,
            output_top_logprobs=list(seq.out_top) if job.return_logprob and job.top_logprobs_num > 0 else None,
            cached_tokens=seq.cached_tokens,
        )

    def _drop_finished(self) -> None:
        batch = self._batch
        if batch is None:
            return
        keep = [row for row, seq in enumerate(batch.seqs) if seq.finish_reason is None]
        if len(keep) == len(batch.seqs):
            return
        self._batch = _select(batch, keep) if keep else None


# ---- batch surgery (pure functions on _Batch) ------------------------------------------------------


def _select(batch: _Batch, rows: list[int]) -> _Batch:
    """Keep `rows`, then drop leading columns that are padding in every remaining row."""
    index = torch.tensor(rows, dtype=torch.long)
    mask = batch.mask[index]
    first_real = int((mask.sum(0) > 0).nonzero()[0])
    layers = [(k[index, :, first_real:, :], v[index, :, first_real:, :]) for k, v in _kv(batch.cache)]
    return _Batch(
        seqs=[batch.seqs[r] for r in rows],
        cache=_new_cache(layers),
        mask=mask[:, first_real:],
        next_pos=batch.next_pos[index],
        last_tokens=batch.last_tokens[index],
        counts=batch.counts[index],
    )


def _merge(a: _Batch, b: _Batch) -> _Batch:
    """Stack two batches, left-padding the shorter one's cache and mask with masked zeros."""
    width = max(a.mask.shape[1], b.mask.shape[1])

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - t.shape[dim]
        if missing == 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    layers = [
        (torch.cat([pad(ka, 2), pad(kb, 2)]), torch.cat([pad(va, 2), pad(vb, 2)]))
        for (ka, va), (kb, vb) in zip(_kv(a.cache), _kv(b.cache))
    ]
    return _Batch(
        seqs=a.seqs + b.seqs,
        cache=_new_cache(layers),
        mask=torch.cat([pad(a.mask, 1), pad(b.mask, 1)]),
        next_pos=torch.cat([a.next_pos, b.next_pos]),
        last_tokens=torch.cat([a.last_tokens, b.last_tokens]),
        counts=torch.cat([a.counts, b.counts]),
    )


class _GrowingLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A DynamicLayer that appends into spare capacity instead of re-concatenating every step.

    DynamicLayer copies the whole cache on every decode step (torch.cat), so a step slows down as
    the sequence grows. Here the keys/values are views into buffers that grow by half their length
    when full, so a step appends in place (docs/decisions.md has the measurement).
    """

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._key_buffer = self._value_buffer = key_states[:, :, :0]
        old = self.get_seq_length()
        new = old + key_states.shape[-2]
        if new > self._key_buffer.shape[-2]:
            self._key_buffer = _grown(self._key_buffer, old, new)
            self._value_buffer = _grown(self._value_buffer, old, new)
        self._key_buffer[:, :, old:new] = key_states
        self._value_buffer[:, :, old:new] = value_states
        self.keys = self._key_buffer[:, :, :new]
        self.values = self._value_buffer[:, :, :new]
        return self.keys, self.values


def _grown(buffer: torch.Tensor, used: int, needed: int) -> torch.Tensor:
    shape = list(buffer.shape)
    shape[-2] = needed + max(64, needed // 2)
    grown = buffer.new_zeros(shape)
    grown[:, :, :used] = buffer[:, :, :used]
    return grown


def _new_cache(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A cache of _GrowingLayers, empty or filled with (keys, values) per layer."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = _GrowingLayer  # layers are created on first use
    for keys, values in layers:
        layer = _GrowingLayer()  # type: ignore[no-untyped-call]
        layer.update(keys, values)
        cache.layers.append(layer)
    return cache


def _prefix_layers(
    hits: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]], width: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the rows' cached prefixes as [B, kv_heads, width, head_dim], right-aligned (zeros on the left)."""
    template = next(layers for _, layers in hits if layers is not None)
    out = []
    for index, (k0, v0) in enumerate(template):
        keys = k0.new_zeros((len(hits), k0.shape[0], width, k0.shape[2]))
        values = v0.new_zeros((len(hits), v0.shape[0], width, v0.shape[2]))
        for row, (m, layers) in enumerate(hits):
            if layers is not None:
                keys[row, :, width - m :] = layers[index][0]
                values[row, :, width - m :] = layers[index][1]
        out.append((keys, values))
    return out


def _cache_kwarg(decoder: torch.nn.Module) -> str:
    """transformers 5.x renamed the decoder's `past_key_values` argument to `cache`."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def _kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    layers = [cast(DynamicLayer, layer) for layer in cache.layers]
    return [(cast(torch.Tensor, layer.keys), cast(torch.Tensor, layer.values)) for layer in layers]


# ---- small helpers -------------------------------------------------------------------------------------


def _load_model(path: str) -> PreTrainedModel:
    # float32 on the CPU: bf16 matmuls are slow there, and float32 keeps greedy runs stable.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    return model


def _eos_token_ids(model: PreTrainedModel, tokenizer: Any) -> list[int]:
    """EOS ids from the model config, the generation config and the tokenizer (as SGLang)."""
    found: list[int] = []
    sources = [getattr(model.config, "eos_token_id", None)]
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        sources.append(getattr(generation_config, "eos_token_id", None))
    sources.append(tokenizer.eos_token_id)
    for source in sources:
        for token in source if isinstance(source, (list, tuple)) else [source]:
            if isinstance(token, int) and token not in found:
                found.append(token)
    return found


def _seeded_generator(seed: int | None) -> torch.Generator | None:
    return None if seed is None else torch.Generator().manual_seed(seed)


def _top_k(logprobs: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    """Top-k (logprob, token id) pairs per row of a [rows, V] logprob matrix, best first."""
    values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)
    return [list(zip(v, i)) for v, i in zip(values.tolist(), ids.tolist())]


def _candidates(probs: torch.Tensor, seqs: list[_Seq]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's sampling distribution after top-k, top-p and min-p, as (probs, token ids).

    Returns ids None when the probs are indexed by token id. Sorting the whole vocabulary is the
    slow part on a CPU, so it only happens when top-p or min-p needs it (SGLang's
    "simple sampling case" shortcut, too).
    """
    vocab = probs.shape[-1]
    top_k = torch.tensor([s.job.params.top_k if 0 < s.job.params.top_k < vocab else vocab for s in seqs])
    top_p = torch.tensor([s.job.params.top_p for s in seqs])
    min_p = torch.tensor([s.job.params.min_p for s in seqs])
    if bool((top_p >= 1.0).all() and (min_p <= 0.0).all()):
        if bool((top_k >= vocab).all()):
            return probs, None
        kept, ids = torch.topk(probs, int(top_k.max()), dim=-1)  # sorted, best first
        return kept.masked_fill(torch.arange(kept.shape[-1])[None, :] >= top_k[:, None], 0.0), ids
    kept, ids = probs.sort(dim=-1, descending=True)
    exclusive_cumsum = kept.cumsum(dim=-1) - kept
    drop = (torch.arange(vocab)[None, :] >= top_k[:, None]) | (exclusive_cumsum > top_p[:, None])
    drop |= kept < (kept[:, :1] * min_p[:, None])
    drop[:, 0] = False  # the most likely token always survives
    return kept.masked_fill(drop, 0.0), ids


def _ends_with_stop_prefix(text: str, stops: tuple[str, ...]) -> bool:
    return any(text.endswith(stop[:k]) for stop in stops for k in range(1, len(stop)))


def _error_output(seq: _Seq, message: str, *, status: int = 500) -> SeqOutput:
    return SeqOutput(
        rid=seq.job.rid,
        prompt_tokens=len(seq.job.input_ids),
        output_ids=list(seq.output_ids),
        text="",
        finish_reason=None,
        error=(status, message),
        cached_tokens=seq.cached_tokens,
    )


def _run_call(call: _Call) -> None:
    try:
        result, error = call.fn(), None
    except Exception as e:
        result, error = None, e
    call.done(result, error)


def _memory_tags(tags: list[str] | None) -> frozenset[str]:
    """The known memory tags among `tags`; None or empty means all of them (as in SGLang)."""
    return frozenset(MEMORY_TAGS) if not tags else frozenset(tags) & frozenset(MEMORY_TAGS)


def _deliver(sink: Callable[[SeqOutput], None], output: SeqOutput) -> None:
    """Call a job's sink; a broken sink must not take the scheduler down."""
    try:
        sink(output)
    except Exception:
        logger.exception("Result sink failed for rid=%s", output.rid)


def default_num_threads() -> int:
    """Torch threads for the model: leave a core for the event loop and the client.

    On 2 cores one thread wins: a second torch thread competes with the server's event loop and
    the client for the other core, and decode steps get slower, not faster (docs/decisions.md).
    """
    cores = os.cpu_count() or 1
    return 1 if cores <= 2 else cores - 1
