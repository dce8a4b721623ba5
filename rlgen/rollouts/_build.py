"""Building a result from a server's answers: `rollouts_from_responses`.

Owns: checking the shape of what the client collected (entries per prompt, prompt texts, extra
columns), the DataFrame of a fresh run (column by column, with pandas' text dtype), and the
`Rollouts` made of it and of the flat token arrays `rollouts._response_arrays` parsed. Knows nothing about
HTTP or servers: it receives already-decoded `/generate` entries and the prompt ids that were sent.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np

from ..core._columns import COLUMNS
from ..core._gc import gc_paused
from ._response_arrays import ParsedResponses, parse_responses
from ._rollouts import Rollouts
from ._runs import new_run_id, text_dtype

__all__ = ["rollouts_from_responses"]


@gc_paused()
def rollouts_from_responses(
    responses: Sequence[dict[str, Any] | None],
    *,
    prompt_ids: Sequence[Sequence[int]],
    prompt_texts: Sequence[str | None] | None = None,
    n: int = 1,
    pad_token_id: int,
    extra: Mapping[str, Sequence[Any]] | None = None,
    model: str = "",
    sampling: dict[str, Any] | None = None,
    decode: Callable[[list[int]], list[str]] | None = None,
    record: dict[str, Any] | None = None,
    row_versions: Sequence[int] | None = None,
    token_versions: Sequence[Sequence[int]] | None = None,
    prompt_numbers: Sequence[int] | None = None,
    run: str | None = None,
) -> Rollouts:
    """Build from SGLang `/generate` entries, `n` per prompt, prompt-major (`record`: see `Rollouts.record`).

    Args:
        responses: one decoded entry per sample (`{"text", "output_ids", "meta_info"}`), in
            prompt-major order. A failed sample is None or `failed_entry(...)` (`client._answer`);
            it still gets a row (finish_reason "error"/"abort", empty output).
        prompt_ids: token ids of each prompt (len = number of prompts).
        prompt_texts: each prompt's text (None for prompts given as ids).
        n: samples per prompt.
        pad_token_id: the value used to pad id tensors.
        extra: per-row columns to add (e.g. "ttft_s"), each of length len(responses).
        model, sampling: recorded on the result (and in parquet).
        decode: optional display helper, ids -> per-token strings.
        row_versions, token_versions: the weight version index of each row (all its tokens), or
            of each token (a list per row, as long as its ids): the result's `versions`.
        prompt_numbers: each prompt's `prompt_index` (default 0..): a part of a larger call (a
            background job's finished groups); `row_id` is then prompt_index x n + sample_index.
        run: the `run` id (default: a new one), so that the parts of one job share it.

    Raises:
        ValueError / TypeError: inconsistent counts or malformed input.
    """
    import pandas as pd

    n_rows = len(responses)
    extra = _checked_extra(n_rows, prompt_ids=prompt_ids, prompt_texts=prompt_texts, n=n, pad_token_id=pad_token_id,
                           extra=extra)

    # per-row values and flat token arrays (rollouts/_response_arrays.py)
    parsed = parse_responses(responses, prompt_ids, n, int(pad_token_id))
    bad, rows = parsed.bad, np.arange(n_rows, dtype=np.int64)
    if bad:
        warnings.warn(
            f"{len(bad)} row(s) had logprobs that do not line up with their tokens; their logprobs "
            f"are NaN and the reason is in the 'error' column (first: row {min(bad)}: {bad[min(bad)]})",
            RuntimeWarning,
            stacklevel=3,
        )

    run = run or new_run_id()
    data = _columns(parsed, rows, n=n, prompt_texts=prompt_texts, run=run)
    if prompt_numbers is not None:
        if len(prompt_numbers) != len(prompt_ids):
            raise ValueError(f"prompt_numbers has {len(prompt_numbers)} entries for {len(prompt_ids)} prompts")
        numbers = np.asarray(prompt_numbers, np.int64)[rows // n]
        data["prompt_index"], data["row_id"] = numbers, numbers * n + rows % n
    versions = _versions(parsed.response_offsets, row_versions, token_versions)
    data.update({k: list(v) for k, v in extra.items()})
    return Rollouts(
        df=pd.DataFrame(data),
        prompt_ids=parsed.prompt_ids,
        prompt_offsets=parsed.prompt_offsets,
        response_ids=parsed.response_ids,
        response_offsets=parsed.response_offsets,
        meta_info=parsed.meta_info,
        pad_token_id=int(pad_token_id),
        logprobs=parsed.logprobs,
        top_logprobs=parsed.top_logprobs,
        top_ids=parsed.top_ids,
        token_texts=parsed.token_texts,
        prompt_logprobs=parsed.prompt_logprobs,
        versions=versions,
        model=model,
        run_sampling={run: sampling},
        decode=decode,
        run_records={run: record},
    )


def _versions(offsets: np.ndarray, row_versions: Sequence[int] | None,
              token_versions: Sequence[Sequence[int]] | None) -> np.ndarray | None:
    """The flat per-token version indices (int32), from one per row or one list per row."""
    lengths = np.diff(offsets)
    if token_versions is not None:
        if len(token_versions) != len(lengths) or any(len(v) != k for v, k in zip(token_versions, lengths)):
            raise ValueError("token_versions must hold one version per response token of every row")
        return np.fromiter(chain.from_iterable(token_versions), np.int32, int(offsets[-1]))
    if row_versions is not None:
        if len(row_versions) != len(lengths):
            raise ValueError(f"row_versions has {len(row_versions)} entries for {len(lengths)} rows")
        return np.repeat(np.asarray(row_versions, np.int32), lengths)
    return None


def _checked_extra(n_rows: int, *, prompt_ids: Sequence[Sequence[int]], prompt_texts: Sequence[str | None] | None,
                   n: int, pad_token_id: int, extra: Mapping[str, Sequence[Any]] | None) -> dict[str, Sequence[Any]]:
    """The input's shape checked (counts, types, extra columns' names and lengths); the extra columns."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, (int, np.integer)):
        raise TypeError(f"pad_token_id must be an int, got {pad_token_id!r}")
    n_prompts = len(prompt_ids)
    if n_rows != n_prompts * n:
        raise ValueError(f"expected {n_prompts} prompts x n={n} = {n_prompts * n} responses, got {n_rows}")
    if prompt_texts is not None and len(prompt_texts) != n_prompts:
        raise ValueError(f"prompt_texts has {len(prompt_texts)} entries for {n_prompts} prompts")
    checked = dict(extra or {})
    for name, values in checked.items():
        if name in COLUMNS:
            raise ValueError(f"extra column {name!r} clashes with a built-in column")
        if len(values) != n_rows:
            raise ValueError(f"extra column {name!r} has {len(values)} values for {n_rows} rows")
    return checked


def _columns(parsed: ParsedResponses, rows: np.ndarray[Any, Any], *, n: int, prompt_texts: Sequence[str | None] | None,
             run: str) -> dict[str, Any]:
    """The built-in columns of a result's DataFrame, from the parsed answers.

    Text columns get pandas' own text dtype explicitly: an all-None column would otherwise be
    inferred as object, and concat / parquet would then change dtypes between results.
    """
    import pandas as pd

    text = text_dtype()
    cols, n_rows = parsed.rows, len(rows)
    prompts = [prompt_texts[int(p)] for p in rows // n] if prompt_texts is not None else [None] * n_rows
    return {
        "prompt_index": rows // n,
        "sample_index": rows % n,
        "prompt": pd.Series(prompts, dtype=text),
        "completion": pd.Series(parsed.completions, dtype=text),
        "finish_reason": pd.Series(cols["finish_reason"], dtype=text),
        "matched_stop": pd.Series(cols["matched_stop"], dtype=object),
        "prompt_tokens": np.asarray(cols["prompt_tokens"], np.int64),
        "completion_tokens": np.asarray(cols["completion_tokens"], np.int64),
        "cached_tokens": np.asarray(cols["cached_tokens"], np.int64),
        "logprob_sum": parsed.logprob_sum,
        "logprob_mean": parsed.logprob_mean,
        "request_latency_s": np.asarray(cols["request_latency_s"], np.float64),
        "weight_version": pd.Series(cols["weight_version"], dtype=text),
        "rid": pd.Series(cols["rid"], dtype=text),
        "error": pd.Series(cols["error"], dtype=text),
        "run": pd.Series([run] * n_rows, dtype=text),
        "row_id": rows,
    }
