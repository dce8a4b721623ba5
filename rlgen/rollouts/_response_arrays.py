"""SGLang `/generate` response entries, parsed into per-row values and flat numpy token arrays.

Owns: turning decoded entries (`{"text", "output_ids", "meta_info"}`, None, or an error object),
each read by `client._answer.read_answer`, into columns in one Python pass over rows, never over
tokens; the per-token lists of `meta_info` (output logprobs,
top-k, token texts, prompt logprobs) as flat arrays built in C (`np.fromiter` over chained lists);
the alignment guard (each logprob names its token id, which must match the ids it belongs to: rows
where it does not get NaN logprobs and a note); per-row logprob sums; and the entry that stands in
for a scored completion. Knows nothing about pandas, torch, HTTP or `Rollouts`: `Rollouts.from_responses`
(`rollouts/_rollouts.py`) validates its arguments, calls `parse_responses` and builds the DataFrame.

Flat arrays follow `core/_ragged.py`'s layout (values plus row offsets); missing values are NaN (floats),
`pad_token_id` (ids) or None (texts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from ..client._answer import read_answer
from ..core._ragged import gather_rows, row_offsets

__all__ = ["ParsedResponses", "parse_responses", "scored_entry"]

# Per-row values read from each entry, named as the DataFrame columns they become.
ROW_FIELDS = (
    "finish_reason", "matched_stop", "prompt_tokens", "completion_tokens", "cached_tokens",
    "request_latency_s", "weight_version", "rid", "error",
)  # fmt: skip

# Per-token lists in meta_info: converted into arrays, so they are not kept a second time as
# Python objects (for 4096 x 256 tokens they would hold hundreds of MB).
_PER_TOKEN_KEYS = frozenset({
    "output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "input_top_logprobs",
    "output_token_ids_logprob", "input_token_ids_logprob",
})  # fmt: skip


@dataclass
class ParsedResponses:
    """What `parse_responses` returns: per-row values and flat token arrays, in row order."""

    rows: dict[str, list[Any]]  # ROW_FIELDS -> one value per row (`error` includes alignment notes)
    completions: list[str]
    meta_info: list[dict[str, Any]]  # without the per-token lists
    prompt_ids: np.ndarray  # each prompt once per sample row
    prompt_offsets: np.ndarray
    response_ids: np.ndarray
    response_offsets: np.ndarray
    logprobs: np.ndarray | None
    top_logprobs: np.ndarray | None
    top_ids: np.ndarray | None
    token_texts: np.ndarray | None
    prompt_logprobs: np.ndarray | None
    logprob_sum: np.ndarray  # float64 per row; NaN without (aligned) logprobs
    logprob_mean: np.ndarray
    bad: dict[int, str]  # row -> why its logprobs do not line up with its tokens


def scored_entry(entry: dict[str, Any], *, prompt_len: int, completion_ids: list[int], text: str) -> dict[str, Any]:
    """A scoring answer reshaped as if its completion had been sampled.

    `entry` answers a one-token /generate of prompt + completion with `return_logprob` and
    `logprob_start_len = prompt_len - 1`: its `input_token_logprobs` start at the last prompt token
    (whose own logprob is None) and then hold each completion token's. Those become the entry's
    `output_token_logprobs`, so that the completion parses exactly like a sampled response, with
    finish_reason "score".
    """
    meta = dict(entry["meta_info"])
    scored = meta.pop("input_token_logprobs")[1:]
    meta.pop("input_top_logprobs", None)
    meta.pop("output_top_logprobs", None)
    meta["output_token_logprobs"] = scored
    meta["completion_tokens"] = len(completion_ids)
    meta["prompt_tokens"] = prompt_len
    meta["finish_reason"] = {"type": "score"}
    return {"text": text, "output_ids": completion_ids, "meta_info": meta}


def parse_responses(
    responses: Sequence[dict[str, Any] | None],
    prompt_ids: Sequence[Sequence[int]],
    n: int,
    pad_token_id: int,
) -> ParsedResponses:
    """Parse `n` entries per prompt, prompt-major (counts already checked by the caller).

    Raises:
        TypeError: an entry that is neither a dict nor None.
    """
    # 1) one Python pass over rows (not tokens): pick out fields and the per-token lists
    cols: dict[str, list[Any]] = {c: [] for c in ROW_FIELDS}
    id_rows, lp_rows, top_rows, in_rows, metas, completions = [], [], [], [], [], []
    for i, entry in enumerate(responses):
        answer = read_answer(entry, i)
        ids = answer.ids()
        id_rows.append(ids)
        lp_rows.append(answer.output_logprobs)
        top_rows.append(answer.output_top_logprobs)
        in_rows.append(answer.input_logprobs)
        completions.append(answer.text)
        cols["finish_reason"].append(answer.finish)
        cols["matched_stop"].append(answer.matched_stop)
        cols["prompt_tokens"].append(len(prompt_ids[i // n]) if answer.prompt_tokens is None else answer.prompt_tokens)
        cols["completion_tokens"].append(len(ids) if answer.completion_tokens is None else answer.completion_tokens)
        cols["cached_tokens"].append(answer.cached_tokens)
        # e2e_latency is the batched request's time (most rows of one request get the same value).
        cols["request_latency_s"].append(answer.latency_s)
        cols["weight_version"].append(answer.weight_version)
        cols["rid"].append(answer.rid)
        cols["error"].append(answer.message)
        metas.append({k: v for k, v in answer.meta.items() if k not in _PER_TOKEN_KEYS})

    # 2) flat token arrays, built in C (fromiter over chained lists)
    n_prompts, n_rows = len(prompt_ids), len(responses)
    p_len = np.fromiter(map(len, prompt_ids), np.int64, n_prompts)
    p_flat = np.fromiter(chain.from_iterable(prompt_ids), np.int64, int(p_len.sum()))
    rows = np.arange(n_rows, dtype=np.int64)
    p_off, p_take = gather_rows(row_offsets(p_len), rows // n)  # each prompt repeated for its n rows
    r_len = np.fromiter(map(len, id_rows), np.int64, n_rows)
    r_off = row_offsets(r_len)
    r_ids = np.fromiter(chain.from_iterable(id_rows), np.int64, int(r_off[-1]))
    bad: dict[int, str] = {}
    lp, lp_ok = _output_logprobs(lp_rows, r_len, r_off, r_ids, bad)
    top_lp, top_id, texts = None, None, None
    if lp is not None:
        top_lp, top_id = _top_logprobs(top_rows, r_len, r_off, int(pad_token_id), bad)
        texts = _token_texts(lp_rows, r_len, r_off, bad)
    p_lp = _prompt_logprobs(in_rows, p_len[rows // n], p_off, p_flat[p_take], bad)
    for i, why in sorted(bad.items()):
        cols["error"][i] = why if cols["error"][i] is None else f"{cols['error'][i]}; {why}"
    lp_sum, lp_mean = _row_sums(lp, lp_ok, r_off, r_len)
    return ParsedResponses(
        rows=cols,
        completions=completions,
        meta_info=metas,
        prompt_ids=p_flat[p_take],
        prompt_offsets=p_off,
        response_ids=r_ids,
        response_offsets=r_off,
        logprobs=lp,
        top_logprobs=top_lp,
        top_ids=top_id,
        token_texts=texts,
        prompt_logprobs=p_lp,
        logprob_sum=lp_sum,
        logprob_mean=lp_mean,
        bad=bad,
    )


# ----------------------------------------------------------------------------------------------
# one helper per per-token field, vectorised


def _flat_floats(rows: list[Any], total: int, col: int = 0) -> np.ndarray:
    # map(itemgetter) + fromiter runs in C, far faster than np.asarray per row (bench/client_overhead.py
    # --options compares them). fromiter turns None into NaN (prompt logprob 0).
    return np.fromiter(map(itemgetter(col), chain.from_iterable(rows)), np.float32, total)


def _output_logprobs(
    lp_rows: list[Any], r_len: np.ndarray, r_off: np.ndarray, r_ids: np.ndarray, bad: dict[int, str]
) -> tuple[np.ndarray | None, np.ndarray]:
    """Flat [T] float32 logprobs (NaN for rows without, or with misaligned, logprobs) and which rows have them."""
    has = np.fromiter((x is not None for x in lp_rows), bool, len(lp_rows))
    if not has.any():
        return None, has
    lp_len = np.fromiter((len(x) if x is not None else -1 for x in lp_rows), np.int64, len(lp_rows))
    for i in np.flatnonzero(has & (lp_len != r_len)):
        bad[int(i)] = f"{lp_len[i]} output logprobs for {r_len[i]} output ids"
    good = has & (lp_len == r_len)
    tok_good = np.repeat(good, r_len)
    rows = [lp_rows[i] for i in np.flatnonzero(good)] if not good.all() else lp_rows
    total = int(r_len[good].sum())
    out = np.full(len(r_ids), np.nan, np.float32)
    out[tok_good] = _flat_floats(rows, total, 0)
    # The alignment guard: each logprob entry names its token id; it must be the output id at the
    # same position (sglang PR #34627-style bugs shift or drop entries).
    lp_ids = np.fromiter(map(itemgetter(1), chain.from_iterable(rows)), np.int64, total)
    mismatch = lp_ids != r_ids[tok_good]
    if mismatch.any():
        tok_rows = np.repeat(np.arange(len(lp_rows)), r_len)[tok_good]
        for i in np.unique(tok_rows[mismatch]):
            bad[int(i)] = "output logprob token ids differ from output_ids"
            out[r_off[i] : r_off[i + 1]] = np.nan
            good[i] = False
    return out, good


def _top_logprobs(
    top_rows: list[Any], r_len: np.ndarray, r_off: np.ndarray, pad: int, bad: dict[int, str]
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Flat [T, k] top-k logprobs and ids; NaN / pad for rows or tokens without them."""
    first = next((t for row in top_rows if row for t in row if t), None)
    if first is None:
        return None, None
    k, total = len(first), int(r_off[-1])
    lp = np.full((total, k), np.nan, np.float32)
    ids = np.full((total, k), pad, np.int64)
    good = [i for i, row in enumerate(top_rows) if row is not None and len(row) == r_len[i] and i not in bad]
    for i in (i for i, row in enumerate(top_rows) if row is not None and len(row) != r_len[i]):
        bad.setdefault(i, f"{len(top_rows[i])} top-logprob entries for {r_len[i]} output ids")
    rows = [top_rows[i] for i in good]
    tok_good = np.repeat(np.isin(np.arange(len(top_rows)), good), r_len)
    try:  # fast path: every token has exactly k alternatives
        sizes = np.fromiter(map(len, chain.from_iterable(rows)), np.int64)
        if not (sizes == k).all():
            raise ValueError("ragged top-k")
        n = int(tok_good.sum())
        flat = list(chain.from_iterable(rows))
        lp[tok_good] = _flat_floats(flat, n * k, 0).reshape(n, k)
        ids[tok_good] = np.fromiter(map(itemgetter(1), chain.from_iterable(flat)), np.int64, n * k).reshape(n, k)
    except (TypeError, ValueError):  # None entries or fewer than k alternatives: per token
        positions = np.flatnonzero(tok_good)
        for pos, alts in zip(positions, chain.from_iterable(rows)):
            for j, alt in enumerate((alts or [])[:k]):
                lp[pos, j], ids[pos, j] = alt[0], alt[1]
    return lp, ids


def _token_texts(lp_rows: list[Any], r_len: np.ndarray, r_off: np.ndarray, bad: dict[int, str]) -> np.ndarray | None:
    """Per-token strings, when the server sent them (return_text_in_logprobs); else None."""
    first = next((row[0] for row in lp_rows if row), None)
    if first is None or len(first) < 3 or first[2] is None:
        return None
    out = np.full(int(r_off[-1]), None, object)
    for i, row in enumerate(lp_rows):
        if row is not None and i not in bad and len(row) == r_len[i]:
            out[r_off[i] : r_off[i + 1]] = [t[2] for t in row]
    return out


def _prompt_logprobs(
    in_rows: list[Any], p_len: np.ndarray, p_off: np.ndarray, p_ids: np.ndarray, bad: dict[int, str]
) -> np.ndarray | None:
    """Flat prompt logprobs aligned to the END of each prompt (logprob_start_len may skip a head)."""
    if all(x is None for x in in_rows):
        return None
    out = np.full(len(p_ids), np.nan, np.float32)
    for i, row in enumerate(in_rows):
        if not row:
            continue
        if len(row) > p_len[i]:
            bad.setdefault(i, f"{len(row)} input logprobs for a {p_len[i]}-token prompt")
            continue
        start = int(p_off[i + 1]) - len(row)
        seg_ids = np.fromiter(map(itemgetter(1), row), np.int64, len(row))
        if not np.array_equal(seg_ids, p_ids[start : p_off[i + 1]]):
            bad.setdefault(i, "input logprob token ids differ from the prompt ids")
            continue
        out[start : p_off[i + 1]] = np.fromiter(map(itemgetter(0), row), np.float32, len(row))
    return out


def _row_sums(
    lp: np.ndarray | None, ok: np.ndarray, r_off: np.ndarray, r_len: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-row logprob sum and mean in float64; NaN for rows without logprobs (even empty ones)."""
    n = len(r_len)
    if lp is None:
        return np.full(n, np.nan), np.full(n, np.nan)
    vals = lp.astype(np.float64)
    missing = np.isnan(vals)
    # Prefix sums make each row's sum one subtraction; NaNs are zeroed first so one row's missing
    # logprobs cannot poison every later row, then put back per row.
    cs = np.concatenate([[0.0], np.cumsum(np.where(missing, 0.0, vals))])
    sums = cs[r_off[1:]] - cs[r_off[:-1]]
    miss_cs = np.concatenate([[0], np.cumsum(missing)])
    row_missing = (miss_cs[r_off[1:]] - miss_cs[r_off[:-1]]) > 0
    sums[row_missing | ~ok] = np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(r_len > 0, sums / np.maximum(r_len, 1), np.nan)
    return sums, means
