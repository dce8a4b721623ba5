"""The CPU model runner: a scheduler thread that owns a transformers causal LM.

Owns: the scheduler thread and its loop, the inbox through which the HTTP layer submits work
(jobs, aborts, control calls), the waiting queue and admission under the running-request and
prefill-token budgets, aborts, the one running batch and its prefill and decode steps, the
prefix cache (`_prefix_cache`: what a prompt may reuse, what is stored after a prefill, both under
the row's LoRA adapter), LoRA adapters (`_lora`: loaded and unloaded here, at most
--max-loras-per-batch of them in the running batch, each row's set around every forward), when
the weights are reloaded (from disk, or from tensors a request carries), released and resumed,
the way SGLang's memory saver does, and SGLang's scheduler pause (`pause`: "in_place" stops
stepping and keeps every sequence's state; "retract" also drops the running sequences' KV and puts
them back at the front of the queue, to be prefilled again over prompt + output so far). It
composes the parts that know less: `_model` (the forward pass, the LM head, the weights),
`_tensors` (weights sent as tensors), `_batch` (the batch's tensors and their surgery),
`_sampling` (penalties, token choice, logprobs) and `_outputs` (stops, text, snapshots). It knows
nothing about HTTP or JSON: results leave as `SeqOutput` snapshots through each job's `sink`
callback, called on the scheduler thread.

Batching works like a small continuous-batching engine. Waiting jobs are prefilled together as
one padded batch and merged into the running batch (both are padded on the left to a common
length). Every decode step then runs all running rows through the model at once. Finished or
aborted rows leave at step boundaries; as in SGLang, a row aborted while it runs still samples
one more token first (`Seq.to_finish`). Position ids are tracked per row, so the left padding does
not change results beyond float rounding. A prompt whose prefix is cached is prefilled from the
cached keys and values plus its remaining tokens; in the batch that prefix sits left of the new
tokens, with padding between them where rows differ (masked like the left padding).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import AutoTokenizer, DynamicCache

from rlgen.cpu_server import _faults
from rlgen.cpu_server._batch import Batch, Seq, kv, merge_batches, new_cache, prefix_layers, select_rows
from rlgen.cpu_server._jobs import Job, SeqOutput
from rlgen.cpu_server._lora import LoraLayers, LoraSpec
from rlgen.cpu_server._lora_adapter import payload_tensors
from rlgen.cpu_server._lora_flags import LoraRef
from rlgen.cpu_server._model import (
    ParamShapes,
    eos_token_ids,
    forward,
    free_weights,
    lm_logits,
    load_model,
    load_weights,
    restore_weights,
)
from rlgen.cpu_server._outputs import check_finished, deliver, ends_with_stop_prefix, error_output, snapshot, stop_tail
from rlgen.cpu_server._prefix_cache import PrefixCache
from rlgen.cpu_server._sampling import apply_penalties, choose, fill_input_logprobs, top_k
from rlgen.cpu_server._tensors import decode_payload, load_named_tensors, named_tensors

__all__ = ["DEFAULT_PREFIX_CACHE_BYTES", "MEMORY_TAGS", "Runner"]

logger = logging.getLogger("rlgen.cpu_server")

# Every this many decode steps, log a "Decode batch" line (SGLang's decode_log_interval).
_DECODE_LOG_INTERVAL = 40
# The prefix cache's default size: a bound on the memory it holds, whatever the traffic.
DEFAULT_PREFIX_CACHE_BYTES = 256 << 20
# The memory tags of SGLang's memory saver (constants.py: GPU_MEMORY_ALL_TYPES).
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


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


# SGLang's FINISH_ABORT().to_json(): a running request that was aborted.
_ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
# SGLang's tokenizer manager, for a request the scheduler took out of its waiting queue.
_ABORTED_WAITING = {"type": "abort", "message": "Abort in waiting queue"}
# The modes in which the scheduler itself pauses (an "abort" pause happens in the HTTP layer).
_SCHEDULER_PAUSE_MODES = ("in_place", "retract")


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
        lora: LoraSpec | None = None,
    ) -> None:
        self.model_path = model_path
        # The scheduler thread has its own tokenizer: HF fast tokenizers are not safe to share
        # across threads (concurrent calls can fail with "Already borrowed").
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = load_model(model_path)
        self.model_type = type(self.model).__name__
        self.lora = LoraLayers(self.model, lora) if lora is not None else None
        config: Any = self.model.config
        self.vocab_size = int(config.vocab_size)
        self.context_length: int = context_length or int(getattr(config, "max_position_embeddings", 4096))
        self.eos_token_ids = eos_token_ids(self.model, self.tokenizer)
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.rng = torch.Generator().manual_seed(random_seed if random_seed is not None else 0)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        # Memory tags released and not yet resumed (scheduler thread; read by others for display).
        self.released: frozenset[str] = frozenset()
        # Shapes of the released parameters, to take their memory back on resume.
        self._released_shapes: ParamShapes = {}

        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Jobs not started yet, sequences retracted by a pause (with their output so far), and
        # barrier calls, in order.
        self._waiting: deque[Job | Seq | _Call] = deque()
        # SGLang's scheduler pause: None, "in_place" or "retract" (scheduler thread; read by others).
        self.paused: str | None = None
        self._batch: Batch | None = None
        self._thread = threading.Thread(target=self._loop, name="rlgen-cpu-scheduler", daemon=True)
        self._step_delay = _faults.step_delay()
        # Read by other threads (health checks, logs); plain attribute writes are atomic enough.
        self.last_progress = time.monotonic()
        self.num_running = 0
        self.num_waiting = 0
        self.num_used_tokens = 0  # tokens of the running sequences (prompt + output), as SGLang's /v1/loads
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

    def reload_weights(self, model_path: str, *, flush_cache: bool = True) -> tuple[bool, str]:
        """Load weights from `model_path` into the live model (scheduler thread; use `call`). The
        prefix cache, computed with the old weights, is emptied only with `flush_cache` (SGLang's
        field, default true), which is refused while a pause holds sequences (`_flush_refusal`)."""
        if "weights" in self.released:
            # On SGLang this would write into unmapped GPU memory; here it is refused instead.
            return False, "Failed to update weights: the weights are released; resume_memory_occupation first."
        refusal = self._flush_refusal(flush_cache)
        if refusal:
            return False, refusal
        success, message = load_weights(self.model, model_path)
        if success:
            self.model_path = model_path
            if flush_cache:
                self.prefix_cache.clear()
        return success, message

    def load_tensors(self, entry: str, load_format: str | None, *, flush_cache: bool) -> tuple[bool, str]:
        """Load weights sent as tensors (one rank's `serialized_named_tensors` entry) into the live
        model (scheduler thread; use `call`). Decoded here, not on the event loop: a large bucket
        takes a while. The prefix cache is emptied only with `flush_cache` (SGLang's field: a
        client sending several buckets flushes with the last)."""
        if "weights" in self.released:
            return False, "Failed to update weights: the weights are released; resume_memory_occupation first."
        refusal = self._flush_refusal(flush_cache)
        if refusal:
            return False, refusal
        success, message = load_named_tensors(self.model, named_tensors(decode_payload(entry), load_format))
        if success and flush_cache:
            self.prefix_cache.clear()
        return success, message

    def load_adapter(self, ref: LoraRef, entry: str | None = None, load_format: str | None = None,
                     checksums: dict[str, str] | None = None, **source: Any) -> dict[str, Any]:
        """Load a LoRA adapter from `ref.lora_path`, or from one rank's tensors (`entry`) and the
        `config` in `source`; SGLang's LoRAUpdateOutput (scheduler thread; use `call`)."""
        assert self.lora is not None, "LoRA is not enabled"
        self.prefix_cache.drop_namespace(ref.lora_id)
        if entry is not None:
            try:
                source["tensors"] = payload_tensors(entry, load_format, checksums)
            except ValueError as e:  # SGLang's scheduler would raise (and die) here
                return self.lora.failure(str(e))
        return self.lora.load(ref, **source)

    def unload_adapter(self, lora_id: str) -> dict[str, Any]:
        """Unload a LoRA adapter and forget the prefixes cached under it (scheduler thread)."""
        assert self.lora is not None, "LoRA is not enabled"
        self.prefix_cache.drop_namespace(lora_id)
        return self.lora.unload(lora_id)

    def flush_cache(self) -> bool:
        """Empty the prefix cache; refused (False) while requests run or wait, as in SGLang.

        Scheduler thread: use `call(..., barrier=False)`.
        """
        if self._num_pending():
            return False
        self.prefix_cache.clear()
        return True

    def pause(self, mode: str | None) -> int:
        """SGLang's scheduler pause (`Scheduler.pause_generation` / `continue_generation`); None
        resumes. "in_place": no more steps, every sequence keeps its state and KV. "retract": the
        running sequences also lose their KV and go back to the front of the queue, keeping their
        output, to be prefilled again over prompt + output on resume (each counts a retraction).
        Returns the number retracted. Scheduler thread: use `call(..., barrier=False)`."""
        assert mode is None or mode in _SCHEDULER_PAUSE_MODES, mode
        retracted = self._retract_all() if mode == "retract" else 0
        if mode != self.paused:
            logger.info(f"Generation {'continued' if mode is None else f'paused (mode={mode})'}. "
                        f"#running-req: {len(self._batch.seqs) if self._batch else 0}, #retracted-req: {retracted}, "
                        f"#queue-req: {len(self._waiting)}")  # fmt: skip
        self.paused = mode
        return retracted

    def _retract_all(self) -> int:
        batch = self._batch
        seqs = [seq for seq in batch.seqs if seq.finish_reason is None] if batch is not None else []
        for seq in seqs:
            seq.num_retractions += 1
        self._batch = None  # their keys and values go with it
        self._waiting.extendleft(reversed(seqs))
        return len(seqs)

    def _num_pending(self) -> int:
        """Sequences running or waiting (SGLang's scheduler is not `is_fully_idle`)."""
        running = len(self._batch.seqs) if self._batch is not None else 0
        return running + sum(isinstance(item, (Job, Seq)) for item in self._waiting)

    def _flush_refusal(self, flush_cache: bool) -> str | None:
        """Why a weight update that asks for a cache flush is refused, or None. SGLang 0.5.17 loads
        the weights, then asserts that the flush succeeded: with sequences held by an "in_place" or
        "retract" pause the assertion fails and its scheduler process dies. Here the update is
        refused before anything changes."""
        pending = self._num_pending() if self.paused is not None else 0
        if not flush_cache or not pending:
            return None
        return (f"Failed to update weights: flush_cache=True needs an idle scheduler, but generation is paused "
                f"(mode={self.paused}) with {pending} request(s) kept in the scheduler, whose cache cannot be "
                "flushed (SGLang 0.5.17's scheduler dies here: 'Cache flush failed after updating weights'). "
                "Pass flush_cache=false while paused with mode retract or in_place, or pause with mode abort.")

    def release_memory(self, tags: list[str] | None) -> None:
        """Free the memory of `tags` (all if None or empty), like SGLang with --enable-memory-saver.

        "weights": every parameter's storage is freed (the tensors become empty); "kv_cache": the
        prefix cache is emptied (the running batch's cache is already gone: this is a barrier
        call). Generation fails until the tags are resumed. Unknown tags change nothing.
        Scheduler thread: use `call`.
        """
        releasing = _memory_tags(tags)
        if "weights" in releasing and "weights" not in self.released:
            self._released_shapes.update(free_weights(self.model))
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
            restore_weights(self.model, self._released_shapes)
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
                self.num_used_tokens = sum(len(s.job.input_ids) + len(s.output_ids)
                                           for s in self._batch.seqs) if self._batch else 0

    def _iterate(self) -> None:
        """One scheduler step: take new work, then run a control call, a prefill or a decode step.
        While paused, only the inbox (aborts, control calls) and barrier calls with nothing
        ahead of them are served."""
        # Sleep in the inbox only when there is nothing at all to do.
        idle = self._batch is None and not self._waiting
        self._take_inbox(block=idle or (self.paused is not None and not self._barrier_call_ready()))
        if self._run_barrier_call() or self.paused is not None:
            return
        jobs = self._admit()
        if jobs and self.released:
            self._refuse_while_released(jobs)
        elif jobs:
            self._prefill_and_merge(jobs)
        elif self._batch is not None:
            self._decode_step()

    def _refuse_while_released(self, jobs: list[Job | Seq]) -> None:
        # SGLang has no such check (its kernels would read unmapped memory); a clear error is kinder.
        message = (
            f"Cannot generate: memory is released ({', '.join(sorted(self.released))}); call "
            "/resume_memory_occupation, and reload the weights with /update_weights_from_disk, first."
        )
        for item in jobs:
            seq = item if isinstance(item, Seq) else Seq(item, None)
            deliver(seq.job.sink, error_output(seq, message, status=503))

    def _fail_running(self, message: str) -> None:
        if self._batch is not None:
            for seq in self._batch.seqs:
                deliver(seq.job.sink, error_output(seq, message))
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

        # Waiting sequences answer at once, as SGLang's "Abort in waiting queue" (a retracted one
        # with its output so far).
        kept: deque[Job | Seq | _Call] = deque()
        for item in self._waiting:
            if isinstance(item, Job) and hit(item):
                aborted = SeqOutput(item.rid, len(item.input_ids), [], "", dict(_ABORTED_WAITING), queue_abort=True)
                deliver(item.sink, aborted)
            elif isinstance(item, Seq) and hit(item.job):
                item.finish_reason = dict(_ABORTED_WAITING)
                deliver(item.job.sink, replace(snapshot(item, self.tokenizer), queue_abort=True))
            else:
                kept.append(item)
        self._waiting = kept
        # Running rows still sample one more token, then finish with abort (SGLang's to_finish);
        # while the scheduler is paused that step waits for the resume.
        for seq in self._batch.seqs if self._batch is not None else []:
            if hit(seq.job) and seq.finish_reason is None:
                seq.to_finish = dict(_ABORTED)

    def _barrier_call_ready(self) -> bool:
        return bool(self._waiting) and isinstance(self._waiting[0], _Call) and self._batch is None

    def _run_barrier_call(self) -> bool:
        """Run a control call at the front of the queue once the batch has drained."""
        if not self._barrier_call_ready():
            return False
        call = self._waiting.popleft()
        assert isinstance(call, _Call)
        _run_call(call)
        return True

    def _admit(self) -> list[Job | Seq]:
        """Take waiting jobs (and retracted sequences) that fit the running and prefill-token
        budgets (at least one).

        A job whose LoRA adapter would take the running batch past --max-loras-per-batch stays in
        the queue and the jobs behind it are still considered, as SGLang's scheduler skips it.
        """
        running = len(self._batch.seqs) if self._batch else 0
        adapters: set[str | None] = {s.job.lora_id for s in self._batch.seqs} if self._batch else set()
        jobs: list[Job | Seq] = []
        skipped: list[Job | Seq] = []
        longest = 0
        while self._waiting and isinstance(self._waiting[0], (Job, Seq)):
            item = self._waiting[0]
            job = item.job if isinstance(item, Seq) else item
            if running + len(jobs) >= self.max_running_requests:
                break
            if self.lora is not None and not self.lora.fits(adapters | {job.lora_id}):
                skipped.append(item)
                self._waiting.popleft()
                continue
            longest_if_added = max(longest, len(item.fill_ids if isinstance(item, Seq) else job.input_ids))
            # Prefill cost is rows x longest prompt (left padding); one long prompt always fits.
            if jobs and longest_if_added * (len(jobs) + 1) > self.max_prefill_tokens:
                break
            jobs.append(item)
            adapters.add(job.lora_id)
            longest = longest_if_added
            self._waiting.popleft()
        self._waiting.extendleft(reversed(skipped))
        return jobs

    # ---- prefill -------------------------------------------------------------------------------

    def _prefill_and_merge(self, jobs: list[Job | Seq]) -> None:
        """Prefill new jobs, and retracted sequences over prompt + output so far, as one batch."""
        started = time.monotonic()
        seqs = [item if isinstance(item, Seq) else Seq(item, _seeded_generator(item.params.sampling_seed),
                                                        stop_tail_tokens=stop_tail(self.tokenizer, item))
                for item in jobs]  # fmt: skip
        try:
            batch, num_cached = self._prefill(seqs)
        except Exception as e:
            logger.exception("Prefill failed")
            for seq in seqs:
                deliver(seq.job.sink, error_output(seq, f"Prefill failed: {e!r}"))
            return
        num_tokens = sum(len(seq.fill_ids) for seq in seqs) - num_cached
        self._batch = batch if self._batch is None else merge_batches(self._batch, batch)
        self._drop_finished()
        self.last_progress = time.monotonic()
        logger.info(
            f"Prefill batch. #new-seq: {len(jobs)}, #new-token: {num_tokens}, #cached-token: {num_cached}, "
            f"#running-req: {len(self._batch.seqs) if self._batch else 0}, #queue-req: {len(self._waiting)}, "
            f"time: {time.monotonic() - started:.3f}s"
        )

    def _prefill(self, seqs: list[Seq]) -> tuple[Batch, int]:
        """Prefill `seqs` as one batch: cached prefixes (right-aligned) then the new tokens; returns
        the batch and the number of tokens taken from the prefix cache.

        Row r's columns are [padding][cached prefix m_r][padding][new tokens s_r], the prefix part
        P = max m_r wide and the new part S = max s_r wide; the mask hides the padding. A retracted
        sequence runs over its prompt and output so far; its prompt logprobs and cached_tokens
        stay those of its first prefill, as in SGLang.
        """
        hits = [self._match_prefix(seq) for seq in seqs]
        fills = [seq.fill_ids for seq in seqs]
        for seq, (cached, _) in zip(seqs, hits):
            if not seq.output_ids:
                seq.cached_tokens = cached
        lengths = [len(ids) for ids in fills]
        cached_lens = [cached for cached, _ in hits]
        new_lens = [n - m for n, m in zip(lengths, cached_lens)]
        width, prefix_width = max(new_lens), max(cached_lens)
        pad_id = self.eos_token_ids[0] if self.eos_token_ids else 0
        input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        new_mask = torch.zeros((len(seqs), width), dtype=torch.long)
        prefix_mask = torch.zeros((len(seqs), prefix_width), dtype=torch.long)
        for row, ids in enumerate(fills):
            m, s = cached_lens[row], new_lens[row]
            input_ids[row, width - s :] = torch.tensor(ids[m:], dtype=torch.long)
            new_mask[row, width - s :] = 1
            prefix_mask[row, prefix_width - m :] = 1
        positions = (new_mask.cumsum(-1) - 1).clamp(min=0) + torch.tensor(cached_lens)[:, None]
        cache = new_cache(prefix_layers(hits, prefix_width) if prefix_width else [])
        mask = torch.cat([prefix_mask, new_mask], dim=1)
        with self._adapters(seqs):
            hidden = forward(self.model, input_ids, mask, positions, cache)  # [B, S, H]

        # Prompt logprobs only where asked, position by position (never the full [B, T, V]).
        for row, seq in enumerate(seqs):
            if seq.job.return_logprob and not seq.output_ids:
                fill_input_logprobs(seq, hidden[row, width - new_lens[row] :], self._logits, offset=cached_lens[row])
        self._cache_prompts(seqs, cache, cached_lens, new_lens)

        logits = self._logits(hidden[:, -1, :])  # [B, V]
        batch = Batch(
            seqs=seqs,
            cache=cache,
            mask=mask,
            next_pos=torch.tensor(lengths, dtype=torch.long),
            last_tokens=torch.zeros(len(seqs), dtype=torch.long),
            counts=_output_counts(seqs, logits.shape[-1]),
        )
        # max_new_tokens == 0 is prefill only: nothing is sampled (SGLang reports length 0).
        for seq in seqs:
            if seq.job.params.max_new_tokens == 0:
                seq.finish_reason = {"type": "length", "length": 0}
                self._emit(seq)
        self._sample_and_append(batch, logits)
        return batch, sum(cached_lens)

    def _match_prefix(self, seq: Seq) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The cached prefix this sequence may reuse: at least its last token is computed (its
        logits pick the next output token), and none of the positions whose prompt logprobs it
        asked for (their hidden states are needed), as SGLang limits its prefix match. A retracted
        sequence may reuse a cached prompt computed under earlier weights when the update that came
        between kept the cache (flush_cache=false), as in SGLang."""
        if not self.prefix_cache.enabled:
            return 0, None
        job, ids = seq.job, seq.fill_ids
        limit = len(ids) - 1
        if job.return_logprob and not seq.output_ids:
            limit = min(limit, job.logprob_start_len)
        return self.prefix_cache.match(ids, limit, job.lora_id)

    def _cache_prompts(self, seqs: list[Seq], cache: DynamicCache, cached_lens: list[int], new_lens: list[int]) -> None:
        """Insert each prompt's keys and values (cached prefix + new part) into the prefix cache."""
        if not self.prefix_cache.enabled:
            return
        layers = kv(cache)
        total = layers[0][0].shape[2] if layers else 0
        prefix_width = total - max(new_lens, default=0)
        for row, seq in enumerate(seqs):
            ids = seq.job.input_ids
            if seq.output_ids or self.prefix_cache.contains(ids, seq.job.lora_id):
                continue  # a retracted sequence's row holds more than its prompt
            m, s = cached_lens[row], new_lens[row]
            parts = [slice(prefix_width - m, prefix_width), slice(total - s, total)]
            # torch.cat copies: the entry must not keep the batch's growing buffers alive.
            self.prefix_cache.insert(ids, [
                (torch.cat([k[row, :, p] for p in parts], dim=1), torch.cat([v[row, :, p] for p in parts], dim=1))
                for k, v in layers
            ], seq.job.lora_id)  # fmt: skip

    # ---- decode --------------------------------------------------------------------------------

    def _decode_step(self) -> None:
        batch = self._batch
        assert batch is not None
        if self._step_delay:
            time.sleep(self._step_delay)
        try:
            batch.mask = torch.cat([batch.mask, torch.ones((len(batch.seqs), 1), dtype=torch.long)], dim=1)
            with self._adapters(batch.seqs):
                hidden = forward(self.model, batch.last_tokens[:, None], batch.mask, batch.next_pos[:, None], batch.cache)
            batch.next_pos += 1
            logits = self._logits(hidden[:, -1, :])
            self._sample_and_append(batch, logits)
        except Exception as e:
            logger.exception("Decode step failed")
            for seq in batch.seqs:
                deliver(seq.job.sink, error_output(seq, f"Decode step failed: {e!r}"))
            self._batch = None
            return
        self._drop_finished()
        self.last_progress = time.monotonic()
        self._log_decode(len(batch.seqs))

    def _adapters(self, seqs: list[Seq]) -> contextlib.AbstractContextManager[None]:
        """Each row's LoRA adapter for the forward passes inside the block."""
        return self.lora.rows([s.job.lora_id for s in seqs]) if self.lora else contextlib.nullcontext()

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return lm_logits(self.model, hidden)

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

    def _sample_and_append(self, batch: Batch, logits: torch.Tensor) -> None:
        """Pick each live row's next token, record logprobs, append it and check stops."""
        live = [row for row, seq in enumerate(batch.seqs) if seq.finish_reason is None]
        if not live:
            return
        index = torch.tensor(live, dtype=torch.long)
        seqs = [batch.seqs[row] for row in live]
        logits = apply_penalties(logits[index], batch.counts[index], seqs, self.eos_token_ids)
        tokens, logprobs = choose(logits, seqs, self.rng)
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
                    seq.out_top.append(top_k(logprobs[i : i + 1], seq.job.top_logprobs_num)[0])
            # An abort wins over length and stops, for the token sampled in its last pass too (SGLang's
            # Req.update_finish_state checks to_finish first).
            seq.finish_reason = seq.to_finish or check_finished(seq, self.tokenizer, self.eos_token_ids)
            if seq.finish_reason is not None:
                self._emit(seq)
            elif seq.job.stream and _stream_due(len(seq.output_ids), seq.job.params.stream_interval):
                chunk = snapshot(seq, self.tokenizer)
                # Like SGLang, skip a chunk whose text may be the start of a stop string.
                if not ends_with_stop_prefix(chunk.text, seq.job.params.stop):
                    deliver(seq.job.sink, chunk)

    # ---- results ---------------------------------------------------------------------------------

    def _emit(self, seq: Seq) -> None:
        deliver(seq.job.sink, snapshot(seq, self.tokenizer))

    def _drop_finished(self) -> None:
        batch = self._batch
        if batch is None:
            return
        keep = [row for row, seq in enumerate(batch.seqs) if seq.finish_reason is None]
        if len(keep) == len(batch.seqs):
            return
        self._batch = select_rows(batch, keep) if keep else None


# ---- small helpers -------------------------------------------------------------------------------------


def _stream_due(n_out: int, interval: int) -> bool:
    """Whether an unfinished streamed sequence of `n_out` output tokens sends a chunk now (SGLang's
    OutputStreamer: every token at interval 1, else when n_out % interval == 1, so the first token
    always goes out at once)."""
    return interval <= 1 or n_out % interval == 1


def _output_counts(seqs: list[Seq], vocab: int) -> torch.Tensor:
    """[B, V] counts of each row's output tokens so far (for penalties): zeros for a new sequence."""
    counts = torch.zeros((len(seqs), vocab), dtype=torch.float32)
    for row, seq in enumerate(seqs):
        if seq.output_ids:
            counts[row].index_add_(0, torch.tensor(seq.output_ids), torch.ones(len(seq.output_ids)))
    return counts


def _seeded_generator(seed: int | None) -> torch.Generator | None:
    return None if seed is None else torch.Generator().manual_seed(seed)


def _run_call(call: _Call) -> None:
    try:
        result, error = call.fn(), None
    except Exception as e:
        result, error = None, e
    call.done(result, error)


def _memory_tags(tags: list[str] | None) -> frozenset[str]:
    """The known memory tags among `tags`; None or empty means all of them (as in SGLang)."""
    return frozenset(MEMORY_TAGS) if not tags else frozenset(tags) & frozenset(MEMORY_TAGS)
