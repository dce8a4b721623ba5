"""The work that passes between the CPU backend's HTTP layer and its scheduler, as plain data.

Owns: `SamplingParams` (one sequence's validated sampling parameters), `Job` (one sequence to
generate, with the `sink` its results go to), `SeqOutput` (a cumulative snapshot of one
sequence, the only thing that comes back), and `on_scheduler` (how the HTTP layer awaits a call
that runs on the scheduler thread). Knows nothing about HTTP, JSON, tensors, the model or
the scheduler: the HTTP layer builds jobs from requests (`_request`), the runner turns them into
outputs (`_runner`, `_outputs`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Job", "SamplingParams", "SeqOutput", "on_scheduler"]


class _Scheduler(Protocol):
    def call(self, fn: Callable[[], Any], finish: Callable[[Any, BaseException | None], None], *,
             barrier: bool = True) -> None: ...


async def on_scheduler(runner: _Scheduler, fn: Callable[[], Any], *, barrier: bool = True) -> Any:
    """Run `fn` on the scheduler thread (`Runner.call`: with `barrier`, once the running requests have
    finished; else between two steps) and return its result or raise its error, on this event loop."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def finish(result: Any, error: BaseException | None) -> None:
        if error is not None:
            loop.call_soon_threadsafe(done.set_exception, error)
        else:
            loop.call_soon_threadsafe(done.set_result, result)

    runner.call(fn, finish, barrier=barrier)
    return await done

# SGLang rewrites temperatures below this to greedy (sampling_params.py, _SAMPLING_EPS).
_GREEDY_EPS = 1e-6


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
    # A streamed sequence sends a chunk when its output length % stream_interval == 1 (every token
    # at 1, the server's default), and when it finishes: SGLang's OutputStreamer rule.
    stream_interval: int = 1

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
    # Times the sequence lost its KV and went back to the queue (a pause in "retract" mode): SGLang's
    # meta_info.num_retractions.
    num_retractions: int = 0
    # Aborted while in the scheduler's waiting queue: SGLang's tokenizer manager answers these itself
    # (_handle_abort_req), with a shorter meta_info.
    queue_abort: bool = False
    # The server's weight version when the snapshot reached the event loop (the HTTP layer stamps it
    # there, as SGLang's tokenizer manager labels each output message it builds).
    weight_version: str | None = None

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
    # The LoRA adapter this sequence runs under (its lora_id), None for the base model.
    lora_id: str | None = None
