"""Scoring given tokens: `Engine.score` and `Engine.check_logprobs`.

Owns: prefill logprobs of given texts or of a result's exact sampled ids (`score`), and the check
that a result's sampled logprobs match a re-score of the same tokens, with its bounds per backend
(`check_logprobs`), as functions of the Engine's connection and adapters. Knows nothing about
sampling, server processes or weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from ..client._generate import GenerateJob, chunks_to_fill, run_generate
from ..core import _loop
from ..core._columns import adapter_of
from ..core._errors import RequestError
from ..core._types import Prompts
from ._adapter_choice import AdapterSet
from ._connection import AUTO_CHUNK_MAX, Connection

if TYPE_CHECKING:

    from ..compare._logprobs import LogprobCheck
    from ..rollouts._rollouts import Rollouts

__all__ = ["check_logprobs", "score"]

# check_logprobs' default bounds on |sampled - re-scored| per response token. float32 on the CPU
# backend: prefill and decode agree to float error. bf16 on SGLang: a logit of ~20 is rounded to
# steps of 0.125, so single tokens differ by a few tenths while the mean stays small; a comparison
# off by one token is off by nats.
_CPU_MAX_DIFF, _CPU_MEAN_DIFF = 1e-3, 1e-4
_BF16_MAX_DIFF, _BF16_MEAN_DIFF = 1.0, 0.05
# Rows per scoring request on the CPU backend (see `_score_ids`).
_CPU_SCORE_CHUNK = 8


def score(conn: Connection, adapters: AdapterSet, prompts: Prompts | Rollouts,
          completions: Sequence[str] | Sequence[Sequence[int]] | None, *, model: str,
          adapter: str | Sequence[str | None] | EllipsisType | None, progress: bool | None) -> Rollouts:
    """`Engine.score`: given completions of given prompts, or (a `Rollouts`) its rows' own ids."""
    from ..rollouts._build import rollouts_from_responses
    from ..rollouts._rollouts import Rollouts

    if isinstance(prompts, Rollouts):
        if completions is not None:
            raise ValueError("score(rollouts) re-scores the rollouts' own tokens; pass no completions")
        return _score_rollouts(conn, adapters, prompts, model=model, adapter=adapter, progress=progress)
    if completions is None:
        raise ValueError("give one completion per prompt, or pass a Rollouts to re-score its sampled tokens")
    batch = conn.normalize(prompts, max_new_tokens=1)
    if isinstance(completions, (str, bytes)) or len(completions) != len(batch):
        raise ValueError(f"give one completion per prompt ({len(batch)} prompts)")
    completion_ids = [list(c) if not isinstance(c, str) else conn.tokenizer(c, add_special_tokens=False)["input_ids"]
                      for c in completions]
    for i, c in enumerate(completion_ids):
        if not c:
            raise ValueError(f"completion {i} is empty; nothing to score")
    names = adapters.per_prompt(None if adapter is ... else adapter, len(batch))
    entries = _score_ids(conn, batch.ids, completion_ids, adapters=names, progress=progress)
    return rollouts_from_responses(entries, prompt_ids=batch.ids, prompt_texts=batch.texts, n=1,
                                   pad_token_id=conn.pad_id, model=model, sampling={"score": True},
                                   decode=conn.token_text, extra=adapters.column(names, len(batch)))


def _score_rollouts(conn: Connection, adapters: AdapterSet, rollouts: Rollouts, *, model: str,
                    adapter: str | Sequence[str | None] | EllipsisType | None, progress: bool | None) -> Rollouts:
    """`score(res)`: every row's prompt + response ids; a row without response tokens stays empty."""
    from ..rollouts._build import rollouts_from_responses

    if len(rollouts) == 0:
        raise ValueError("the rollouts have no rows to re-score")
    prompt_ids = rollouts.id_lists("prompt")
    response_ids = rollouts.id_lists("response")
    if adapter is ...:  # each row under the adapter it was sampled with
        column = rollouts.df["adapter"] if "adapter" in rollouts.df.columns else None
        adapter = None if column is None else [adapter_of(a) for a in column]
    names = adapters.per_prompt(adapter, len(rollouts))
    entries = _score_ids(conn, prompt_ids, response_ids, adapters=names, progress=progress)
    return rollouts_from_responses(entries, prompt_ids=prompt_ids, prompt_texts=rollouts.df["prompt"].tolist(),
                                   n=1, pad_token_id=rollouts.pad_token_id, model=model,
                                   sampling={"score": True}, decode=conn.token_text,
                                   extra=adapters.column(names, len(rollouts)))


def check_logprobs(conn: Connection, adapters: AdapterSet, rollouts: Rollouts, *, model: str,
                   max_diff: float | None, mean_diff: float | None, progress: bool | None) -> LogprobCheck:
    """`Engine.check_logprobs`: the rollouts re-scored and compared, within the backend's bounds."""
    from ..compare._logprobs import check_verdict, compare_logprobs, not_comparable_reason

    if rollouts.logprobs is None:
        raise ValueError("these rollouts have no logprobs; generate with logprobs=True")
    cpu = conn.cpu_backend
    bounds = {"max_diff": _CPU_MAX_DIFF if cpu else _BF16_MAX_DIFF, "mean_diff": _CPU_MEAN_DIFF if cpu else _BF16_MEAN_DIFF}
    if max_diff is not None:
        bounds["max_diff"] = max_diff
    if mean_diff is not None:
        bounds["mean_diff"] = mean_diff
    reason = not_comparable_reason(rollouts.sampling)
    if reason is not None:
        return check_verdict(None, reason=reason, **bounds)
    if not any(rollouts.id_lists("response")):
        raise ValueError("the rollouts have no response tokens to re-score")
    rescored = score(conn, adapters, rollouts, None, model=model, adapter=..., progress=progress)
    return check_verdict(compare_logprobs(rollouts, rescored, off_by=bounds["max_diff"]), reason=None, **bounds)


def _score_ids(conn: Connection, prompt_ids: list[list[int]], completion_ids: list[list[int]], *,
               adapters: Sequence[str | None] | None = None, progress: bool | None) -> list[dict[str, Any]]:
    """Prefill prompt+completion with input logprobs from the last prompt token on (under each
    row's adapter, where `adapters` gives them).

    Identical (prompt, completion, adapter) triples are prefilled once. An empty completion gets
    an entry with no tokens, without a request.
    """
    from ..rollouts._response_arrays import scored_entry

    conn.check_ready()
    row_adapter = list(adapters) if adapters is not None else [None] * len(prompt_ids)
    first: dict[tuple[int, tuple[int, ...], str | None], int] = {}  # distinct (prompt length, ids, adapter) -> row
    keys = [(len(p), tuple(p + c), a) for p, c, a in zip(prompt_ids, completion_ids, row_adapter)]
    for i, c in enumerate(completion_ids):
        if c:
            first.setdefault(keys[i], i)
    # Longest first: rows of similar length share a chunk, and the CPU backend pads a prefill
    # batch to its longest row (SGLang packs rows without padding, so the order costs nothing).
    todo = sorted(first.values(), key=lambda i: len(prompt_ids[i]) + len(completion_ids[i]), reverse=True)
    if conn.cpu_backend:
        # Small chunks, one queued behind the running one: each is prefilled on its own, padded
        # only to its own longest row, and the bar advances per chunk.
        chunk_size, max_in_flight = _CPU_SCORE_CHUNK, 2
    else:
        chunk_size = AUTO_CHUNK_MAX
        max_in_flight = chunks_to_fill(conn.running_capacity(), chunk_size, 1)
    job = GenerateJob(
        prompt_ids=[prompt_ids[i] + completion_ids[i] for i in todo],
        sampling={"max_new_tokens": 1, "temperature": 0.0}, n=1, logprobs=True, top_logprobs=0,
        stream=False, chunk_size=chunk_size, max_in_flight=max_in_flight,
        per_prompt={"logprob_start_len": [len(prompt_ids[i]) - 1 for i in todo]},
    )
    if adapters is not None:
        job.per_prompt["lora_path"] = [row_adapter[i] for i in todo]
    with conn.progress_line(job, progress, label="score", unit="row") as line:
        # A scoring request generates one throwaway token per row: rows are the measure, not tok/s.
        _loop.run_sync(run_generate(conn.client, job, on_progress=lambda rows, _tokens: line.advance(rows)),
                       on_wait=line.tick)
    answers = dict(zip(todo, job.results))
    entries = []
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if not c:
            entries.append(scored_entry({"meta_info": {"input_token_logprobs": [[None, p[-1] if p else 0]]}},
                                        prompt_len=len(p), completion_ids=[], text=""))
            continue
        r = answers[first[keys[i]]]
        if r is None:
            raise RequestError("the server did not answer this scoring request", prompt_index=i)
        entries.append(scored_entry(r, prompt_len=len(p), completion_ids=c,
                                    text=conn.tokenizer.decode(c, skip_special_tokens=True)))
    return entries
