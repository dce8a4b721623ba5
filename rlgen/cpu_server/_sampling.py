"""Sampling and logprobs for the CPU backend: from logits to tokens, logprobs and top-k lists.

Owns: the output-token penalties (repetition, frequency, presence) and the min_new_tokens ban on
stop tokens, the per-row choice of the next token (greedy, or temperature with top-k, top-p and
min-p, drawn from the row's seeded generator when it has one), logprobs as SGLang's sampler takes
them (after temperature, before filtering, clamped so -inf never reaches JSON), prompt logprobs
in SGLang's shape, and top-k (logprob, token id) lists. Knows nothing about the model (the LM head
comes in as a function), the batch's KV cache, the scheduler, text or HTTP: it reads each row's
`Seq` and returns tensors and lists.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlgen.cpu_server._batch import Seq

__all__ = ["apply_penalties", "choose", "fill_input_logprobs", "top_k"]

# Logprobs are clamped like SGLang's sampler does, so -inf never reaches JSON (orjson writes null).
_LOGPROB_MIN = torch.finfo(torch.float32).min


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, seqs: list[Seq], eos_token_ids: list[int]) -> torch.Tensor:
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
            banned = list(set(eos_token_ids) | seq.job.params.stop_token_ids)
            logits[i, banned] = float("-inf")
    return logits


def choose(logits: torch.Tensor, seqs: list[Seq], rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (tokens [b], logprobs [b, V]).

    Logprobs follow SGLang's sampler: log_softmax(logits / temperature), taken after
    temperature and before top-k/top-p/min-p filtering. Greedy rows use temperature 1. Rows
    without a seeded generator draw from `rng`.
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
        draws = torch.stack([torch.rand((), generator=s.generator or rng) for s in rows])
        # right=True: the first token whose cumulative mass exceeds the draw (never a zero-mass one).
        picks = torch.searchsorted(cdf, (draws * cdf[:, -1])[:, None], right=True).clamp(max=cdf.shape[-1] - 1)
        tokens[sampled] = picks.squeeze(1) if ids is None else ids.gather(1, picks).squeeze(1)
    return tokens, logprobs


def _candidates(probs: torch.Tensor, seqs: list[Seq]) -> tuple[torch.Tensor, torch.Tensor | None]:
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


def fill_input_logprobs(
    seq: Seq, hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], offset: int = 0
) -> None:
    """SGLang's shape: entries for prompt[s:], the first one's logprob always None.

    `hidden[i]` is the hidden state at prompt position `offset + i` (positions before
    `offset` came from the prefix cache, which never covers position s or later); `head` turns
    hidden states into logits.
    """
    ids = seq.job.input_ids
    start = seq.job.logprob_start_len
    entries: list[tuple[float | None, int]] = [(None, ids[start])]
    tops: list[list[tuple[float, int]] | None] = [None]
    if start + 1 < len(ids):
        # Position j predicts token j + 1: positions start .. n-2 give tokens start+1 .. n-1.
        logprobs = torch.log_softmax(head(hidden[start - offset : -1]), dim=-1).clamp(min=_LOGPROB_MIN)
        targets = torch.tensor(ids[start + 1 :], dtype=torch.long)
        picked = logprobs.gather(1, targets[:, None]).squeeze(1).tolist()
        entries.extend(zip(picked, ids[start + 1 :]))
        if seq.job.top_logprobs_num > 0:
            tops.extend(top_k(logprobs, seq.job.top_logprobs_num))
    seq.in_logprobs = entries
    seq.in_top = tops if seq.job.top_logprobs_num > 0 else None


def top_k(logprobs: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    """Top-k (logprob, token id) pairs per row of a [rows, V] logprob matrix, best first."""
    values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)
    return [list(zip(v, i)) for v, i in zip(values.tolist(), ids.tolist())]
