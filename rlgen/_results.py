"""`Rollouts`: the one result object a generation returns.

Owns: turning SGLang `/generate` response entries into rows (a pandas DataFrame) and padded torch
tensors that line up with them, raw `meta_info` per row, selection, concatenation, parquet
round-trips, and `compare_logprobs`. Knows nothing about HTTP, servers or processes: it receives
already-decoded response dicts and the prompt token ids the client sent.

Storage is ragged and flat (CSR-style: one flat numpy array per field plus row offsets), so that
construction, selection and concatenation are a few vectorised numpy calls, not Python loops over
tokens. Padded tensors are built from it once, lazily, and cached.

Tensor conventions (stated once, here; tests check each of them):

- `prompt_ids` [N, P] int64, LEFT-padded with `pad_token_id`; `prompt_mask` [N, P] bool.
- `response_ids` [N, R] int64, RIGHT-padded with `pad_token_id`; `response_mask` [N, R] bool.
- `input_ids` = cat(prompt_ids, response_ids) [N, P+R] and `attention_mask` = cat(prompt_mask,
  response_mask): response token j of row i sits at column P + j, so a training forward on
  `input_ids` predicts it from the logits at column P + j - 1.
- `logprobs` [N, R] float32: `logprobs[i, j]` is the logprob of `response_ids[i, j]`; 0.0 where
  `response_mask` is False; NaN at real positions whose logprob the server did not return.
- `lengths` [N] int64: response lengths (`response_mask.sum(1)`).
- `top_logprobs` [N, R, k] float32 and `top_ids` [N, R, k] int64 (with `top_logprobs_num=k`):
  0.0 / `pad_token_id` where masked.
- `prompt_logprobs` [N, P] float32 (when the server returned `input_token_logprobs`): aligned with
  `prompt_ids`; NaN where the server gave none (always the first prompt token), 0.0 on padding.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import warnings
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import torch

__all__ = ["Rollouts", "compare_logprobs"]

# Built-in DataFrame columns, in order. Extra columns (from the client, or added by users, e.g.
# rewards) come after them.
COLUMNS = (
    "prompt_index", "sample_index", "prompt", "completion", "finish_reason", "matched_stop",
    "prompt_tokens", "completion_tokens", "cached_tokens", "logprob_sum", "logprob_mean",
    "latency_s", "weight_version", "rid", "error",
)  # fmt: skip

# Per-token lists in meta_info: converted into arrays, so they are not kept a second time as
# Python objects (for 4096 x 256 tokens they would hold hundreds of MB).
_PER_TOKEN_KEYS = frozenset({
    "output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "input_top_logprobs",
    "output_token_ids_logprob", "input_token_ids_logprob",
})  # fmt: skip

_PARQUET_KEY = b"rlgen"
_PARQUET_VERSION = 1
# Optional flat per-token fields, and the attribute each lives in.
_FIELDS = ("logprobs", "top_logprobs", "top_ids", "token_texts", "prompt_logprobs")
_ATTR = {
    "logprobs": "_lp", "top_logprobs": "_top_lp", "top_ids": "_top_ids", "token_texts": "_texts",
    "prompt_logprobs": "_p_lp",
}  # fmt: skip


# ----------------------------------------------------------------------------------------------
# ragged (flat values + offsets) helpers


def _offsets(lengths: np.ndarray) -> np.ndarray:
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def _gather(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """New offsets and the flat positions of `rows`' values, in row order (no Python loop)."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    new = _offsets(lengths)
    flat = np.repeat(starts - new[:-1], lengths) + np.arange(new[-1], dtype=np.int64)
    return new, flat


def _pad(values: np.ndarray, lengths: np.ndarray, fill: Any, *, left: bool) -> np.ndarray:
    """Scatter flat `values` into [N, max(lengths), ...], left- or right-aligned."""
    width = int(lengths.max()) if len(lengths) else 0
    out = np.full((len(lengths), width, *values.shape[1:]), fill, dtype=values.dtype)
    cols = np.arange(width)
    mask = cols >= (width - lengths)[:, None] if left else cols < lengths[:, None]
    # Boolean-mask assignment fills row-major, which is exactly the flat (row, then token) order.
    out[mask] = values
    return out


def _flat_floats(rows: list, total: int, col: int = 0) -> np.ndarray:
    # map(itemgetter) + fromiter runs in C; measured ~5x faster than np.asarray per row (see
    # bench/client_overhead.py --options). fromiter turns None into NaN (prompt logprob 0).
    return np.fromiter(map(itemgetter(col), chain.from_iterable(rows)), np.float32, total)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # Building creates no reference cycles, yet the cyclic GC would rescan the millions of freshly
    # parsed response objects each time it runs (measured: ~2x slower construction on 1M tokens).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ----------------------------------------------------------------------------------------------


class Rollouts:
    """Generated samples as one DataFrame row each, plus padded tensors aligned with the rows.

    Row order is prompt-major: the `n` samples of prompt 0, then those of prompt 1, ...
    `df.iloc[i]`, `meta_info[i]` and row i of every tensor describe the same sample. You may add
    columns to `df` (rewards, labels), but keep its row order and index: reorder or filter with
    `res[...]` / `res.where(...)`, which keep the tensors in step.

    Tensors (torch, built lazily on first access and cached):

    ========================  ============  =======  ==============================================
    name                      shape         dtype    padding
    ========================  ============  =======  ==============================================
    prompt_ids                [N, P]        int64    LEFT, pad_token_id
    prompt_mask               [N, P]        bool     False on padding
    response_ids              [N, R]        int64    RIGHT, pad_token_id
    response_mask             [N, R]        bool     False on padding
    input_ids                 [N, P+R]      int64    cat(prompt_ids, response_ids)
    attention_mask            [N, P+R]      bool     cat(prompt_mask, response_mask)
    logprobs                  [N, R]        float32  0.0; NaN = real token, logprob not returned
    lengths                   [N]           int64    response lengths
    top_logprobs (optional)   [N, R, k]     float32  0.0
    top_ids (optional)        [N, R, k]     int64    pad_token_id
    prompt_logprobs (opt.)    [N, P]        float32  0.0; NaN where none (first prompt token)
    ========================  ============  =======  ==============================================

    `logprobs[i, j]` belongs to `response_ids[i, j]`; in `input_ids` that token is at column
    `P + j`. Optional tensors are None when the server did not return them (`logprobs` is None
    when no row has logprobs).

    DataFrame columns: prompt_index, sample_index, prompt, completion, finish_reason ("stop",
    "length", "abort", "error"; "unknown" if the server gave none), matched_stop (token id or stop
    string), prompt_tokens, completion_tokens, cached_tokens, logprob_sum, logprob_mean (NaN
    without logprobs), latency_s (server end-to-end), weight_version, rid, error (message for
    aborted/failed rows), then extra columns.

    Usage::

        res = engine.generate(prompts, n=4)
        res.df.groupby("prompt_index").completion_tokens.mean()
        long = res.where(lambda df: df.finish_reason == "length")
        batch = res.to("cuda").tensors()
        res.to_parquet("run.parquet"); same = Rollouts.from_parquet("run.parquet")
    """

    def __init__(
        self,
        *,
        df: pd.DataFrame,
        prompt_ids: np.ndarray,
        prompt_offsets: np.ndarray,
        response_ids: np.ndarray,
        response_offsets: np.ndarray,
        meta_info: list[dict[str, Any]],
        pad_token_id: int,
        logprobs: np.ndarray | None = None,
        top_logprobs: np.ndarray | None = None,
        top_ids: np.ndarray | None = None,
        token_texts: np.ndarray | None = None,
        prompt_logprobs: np.ndarray | None = None,
        model: str = "",
        sampling: dict[str, Any] | None = None,
        decode: Callable[[list[int]], list[str]] | None = None,
    ) -> None:
        """Low-level constructor from flat arrays; use `from_responses`, `from_parquet`, `concat`."""
        n_rows = len(prompt_offsets) - 1
        if len(df) != n_rows or len(response_offsets) != n_rows + 1 or len(meta_info) != n_rows:
            raise ValueError("df, offsets and meta_info must describe the same number of rows")
        self._df = df
        self._p_ids, self._p_off = prompt_ids, prompt_offsets
        self._r_ids, self._r_off = response_ids, response_offsets
        self._lp, self._top_lp, self._top_ids = logprobs, top_logprobs, top_ids
        self._texts, self._p_lp = token_texts, prompt_logprobs
        self.meta_info: list[dict[str, Any]] = meta_info
        self.pad_token_id = int(pad_token_id)
        self.model = model
        self.sampling = sampling
        # Display only: maps a list of token ids to per-token strings for the HTML heatmap
        # (e.g. tokenizer.convert_ids_to_tokens). Not saved to parquet.
        self.decode = decode
        self._cache: dict[str, torch.Tensor] | None = None
        self._device: Any = None

    # -- construction from SGLang responses ------------------------------------------------------
    @classmethod
    @_gc_paused()
    def from_responses(
        cls,
        responses: Sequence[dict[str, Any] | None],
        *,
        prompt_ids: Sequence[Sequence[int]],
        prompt_texts: Sequence[str | None] | None = None,
        n: int = 1,
        pad_token_id: int,
        extra: dict[str, Sequence[Any]] | None = None,
        model: str = "",
        sampling: dict[str, Any] | None = None,
        decode: Callable[[list[int]], list[str]] | None = None,
    ) -> Rollouts:
        """Build from SGLang `/generate` entries, `n` per prompt, prompt-major.

        Args:
            responses: one decoded entry per sample (`{"text", "output_ids", "meta_info"}`), in
                prompt-major order. A failed sample is None or `Rollouts.failed_response(...)`;
                it still gets a row (finish_reason "error"/"abort", empty output).
            prompt_ids: token ids of each prompt (len = number of prompts).
            prompt_texts: each prompt's text (None for prompts given as ids).
            n: samples per prompt.
            pad_token_id: the value used to pad id tensors.
            extra: per-row columns to add (e.g. "ttft_s"), each of length len(responses).
            model, sampling: recorded on the result (and in parquet).
            decode: optional display helper, ids -> per-token strings.

        Raises:
            ValueError / TypeError: inconsistent counts or malformed input.
        """
        import pandas as pd

        # 1) validate the shape of the input
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, (int, np.integer)):
            raise TypeError(f"pad_token_id must be an int, got {pad_token_id!r}")
        n_prompts, n_rows = len(prompt_ids), len(responses)
        if n_rows != n_prompts * n:
            raise ValueError(f"expected {n_prompts} prompts x n={n} = {n_prompts * n} responses, got {n_rows}")
        if prompt_texts is not None and len(prompt_texts) != n_prompts:
            raise ValueError(f"prompt_texts has {len(prompt_texts)} entries for {n_prompts} prompts")
        extra = dict(extra or {})
        for name, values in extra.items():
            if name in COLUMNS:
                raise ValueError(f"extra column {name!r} clashes with a built-in column")
            if len(values) != n_rows:
                raise ValueError(f"extra column {name!r} has {len(values)} values for {n_rows} rows")

        # 2) one Python pass over rows (not tokens): pick out fields and the per-token lists
        cols: dict[str, list[Any]] = {c: [] for c in COLUMNS[4:] if c not in ("logprob_sum", "logprob_mean")}
        id_rows, lp_rows, top_rows, in_rows, metas, completions = [], [], [], [], [], []
        for i, entry in enumerate(responses):
            entry = _normalise_entry(entry, i)
            meta = entry.get("meta_info") or {}
            out_lp = meta.get("output_token_logprobs")
            ids = entry.get("output_ids")
            if ids is None:
                ids = [t[1] for t in out_lp] if out_lp else []
            id_rows.append(ids)
            lp_rows.append(out_lp)
            top_rows.append(meta.get("output_top_logprobs"))
            in_rows.append(meta.get("input_token_logprobs"))
            completions.append(entry.get("text") or "")
            fr = meta.get("finish_reason")
            fr = fr if isinstance(fr, dict) else ({"type": fr} if isinstance(fr, str) else {})
            kind = fr.get("type") or "unknown"
            cols["finish_reason"].append(str(kind))
            cols["matched_stop"].append(fr.get("matched"))
            prompt_tokens, completion_tokens = meta.get("prompt_tokens"), meta.get("completion_tokens")
            cols["prompt_tokens"].append(len(prompt_ids[i // n]) if prompt_tokens is None else prompt_tokens)
            cols["completion_tokens"].append(len(ids) if completion_tokens is None else completion_tokens)
            cols["cached_tokens"].append(meta.get("cached_tokens") or 0)
            cols["latency_s"].append(meta.get("e2e_latency", np.nan))
            cols["weight_version"].append(meta.get("weight_version"))
            cols["rid"].append(meta.get("id"))
            cols["error"].append((fr.get("message") or None) if kind in ("abort", "error") else None)
            metas.append({k: v for k, v in meta.items() if k not in _PER_TOKEN_KEYS})

        # 3) flat token arrays, built in C (fromiter over chained lists)
        p_len = np.fromiter(map(len, prompt_ids), np.int64, n_prompts)
        p_flat = np.fromiter(chain.from_iterable(prompt_ids), np.int64, int(p_len.sum()))
        rows = np.arange(n_rows, dtype=np.int64)
        p_off, p_take = _gather(_offsets(p_len), rows // n)  # each prompt repeated for its n rows
        r_len = np.fromiter(map(len, id_rows), np.int64, n_rows)
        r_off = _offsets(r_len)
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
        if bad:
            warnings.warn(
                f"{len(bad)} row(s) had logprobs that do not line up with their tokens; their logprobs "
                f"are NaN and the reason is in the 'error' column (first: row {min(bad)}: {bad[min(bad)]})",
                RuntimeWarning,
                stacklevel=3,
            )

        # 4) the DataFrame
        lp_sum, lp_mean = _row_sums(lp, lp_ok, r_off, r_len)
        # Text columns get pandas' own text dtype explicitly: an all-None column would otherwise be
        # inferred as object, and concat / parquet would then change dtypes between results.
        text = "str" if int(pd.__version__.split(".")[0]) >= 3 else object
        prompts = [prompt_texts[p] for p in rows // n] if prompt_texts is not None else [None] * n_rows
        data: dict[str, Any] = {
            "prompt_index": rows // n,
            "sample_index": rows % n,
            "prompt": pd.Series(prompts, dtype=text),
            "completion": pd.Series(completions, dtype=text),
            "finish_reason": pd.Series(cols["finish_reason"], dtype=text),
            "matched_stop": pd.Series(cols["matched_stop"], dtype=object),
            "prompt_tokens": np.asarray(cols["prompt_tokens"], np.int64),
            "completion_tokens": np.asarray(cols["completion_tokens"], np.int64),
            "cached_tokens": np.asarray(cols["cached_tokens"], np.int64),
            "logprob_sum": lp_sum,
            "logprob_mean": lp_mean,
            "latency_s": np.asarray(cols["latency_s"], np.float64),
            "weight_version": pd.Series(cols["weight_version"], dtype=text),
            "rid": pd.Series(cols["rid"], dtype=text),
            "error": pd.Series(cols["error"], dtype=text),
        }
        data.update({k: list(v) for k, v in extra.items()})
        return cls(
            df=pd.DataFrame(data),
            prompt_ids=p_flat[p_take],
            prompt_offsets=p_off,
            response_ids=r_ids,
            response_offsets=r_off,
            meta_info=metas,
            pad_token_id=int(pad_token_id),
            logprobs=lp,
            top_logprobs=top_lp,
            top_ids=top_id,
            token_texts=texts,
            prompt_logprobs=p_lp,
            model=model,
            sampling=sampling,
            decode=decode,
        )

    @staticmethod
    def failed_response(message: str, *, reason: str = "error", rid: str | None = None) -> dict[str, Any]:
        """A response entry for a sample that failed or was aborted before the server answered.

        Pass it to `from_responses` in the sample's place: the row is kept, with empty output,
        finish_reason `reason` ("error" or "abort") and `message` in the `error` column.
        """
        if reason not in ("error", "abort"):
            raise ValueError(f"reason must be 'error' or 'abort', got {reason!r}")
        finish = {"type": reason, "message": str(message)}
        return {"text": "", "output_ids": [], "meta_info": {"id": rid, "finish_reason": finish, "completion_tokens": 0}}

    # -- rows and selection ----------------------------------------------------------------------
    @property
    def df(self) -> pd.DataFrame:
        """One row per sample (see the class docstring); add columns freely, keep the row order."""
        return self._df

    @df.setter
    def df(self, value: pd.DataFrame) -> None:
        import pandas as pd

        if not isinstance(value, pd.DataFrame):
            raise TypeError(f"df must be a pandas DataFrame, got {type(value).__name__}")
        if len(value) != len(self) or not value.index.equals(pd.RangeIndex(len(self))):
            raise ValueError(
                "the new df must keep the rows in order (index 0..N-1) so the tensors stay aligned; "
                "to filter or reorder, use res[...] or res.where(...)"
            )
        self._df = value

    def __len__(self) -> int:
        return len(self._r_off) - 1

    def __getitem__(self, key: Any) -> Rollouts:
        """`res[3]`, `res[2:5]`, `res[[0, 3]]`, `res[bool_mask]`: a Rollouts of those rows."""
        return self._take(self._index(key))

    def where(self, condition: Any) -> Rollouts:
        """The rows where `condition` holds: a callable `df -> bool mask`, or a bool mask/Series."""
        mask = condition(self._df) if callable(condition) else condition
        return self._take(self._index(mask, boolean_only=True))

    def _index(self, key: Any, *, boolean_only: bool = False) -> np.ndarray:
        import pandas as pd

        n = len(self)
        if isinstance(key, pd.Series):
            if not key.index.equals(self._df.index):
                raise ValueError("a Series mask must have the same index as res.df")
            key = key.to_numpy()
        elif type(key).__module__.startswith("torch"):
            key = key.detach().cpu().numpy()
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool) and not boolean_only:
            if not -n <= key < n:
                raise IndexError(f"row {key} out of range for {n} rows")
            return np.array([key % n], dtype=np.int64)
        if isinstance(key, slice) and not boolean_only:
            return np.arange(n, dtype=np.int64)[key]
        arr = np.asarray(key)
        if arr.dtype == bool:
            if arr.shape != (n,):
                raise ValueError(f"boolean mask has shape {arr.shape}, expected ({n},)")
            return np.flatnonzero(arr).astype(np.int64)
        if boolean_only:
            raise TypeError(f"where() needs a boolean mask or a callable returning one, got dtype {arr.dtype}")
        if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
            raise TypeError(
                f"cannot index Rollouts with {type(key).__name__}; use an int, slice, int list or bool mask"
            )
        arr = arr.astype(np.int64)
        if arr.size and (arr.min() < -n or arr.max() >= n):
            raise IndexError(f"row index out of range for {n} rows")
        return arr % n if n else arr

    def _checked_df(self) -> pd.DataFrame:
        import pandas as pd

        if not self._df.index.equals(pd.RangeIndex(len(self))):
            raise ValueError(
                "res.df was reordered or filtered in place, so it no longer lines up with the tensors; "
                "use res[...] / res.where(...) instead"
            )
        return self._df

    def _take(self, rows: np.ndarray) -> Rollouts:
        p_off, p_take = _gather(self._p_off, rows)
        r_off, r_take = _gather(self._r_off, rows)
        pick = lambda a, take: None if a is None else a[take]  # noqa: E731
        out = type(self)(
            df=self._checked_df().iloc[rows].reset_index(drop=True),
            prompt_ids=self._p_ids[p_take],
            prompt_offsets=p_off,
            response_ids=self._r_ids[r_take],
            response_offsets=r_off,
            meta_info=[self.meta_info[i] for i in rows],
            pad_token_id=self.pad_token_id,
            logprobs=pick(self._lp, r_take),
            top_logprobs=pick(self._top_lp, r_take),
            top_ids=pick(self._top_ids, r_take),
            token_texts=pick(self._texts, r_take),
            prompt_logprobs=pick(self._p_lp, p_take),
            model=self.model,
            sampling=self.sampling,
            decode=self.decode,
        )
        out._device = self._device
        return out

    @classmethod
    def concat(cls, items: Iterable[Rollouts], *, renumber: bool = False) -> Rollouts:
        """Stack results row-wise and re-pad.

        `prompt_index` is kept as it is in each input (so rows of the same prompt generated twice
        still match up), unless `renumber=True`, which shifts each input's prompt_index past the
        previous ones. Optional fields missing from some inputs become NaN / pad there; `model`
        is kept when all agree (else joined with ", "), `sampling` when all agree (else None).
        """
        import pandas as pd

        items = list(items)
        if not items or not all(isinstance(r, Rollouts) for r in items):
            raise TypeError("concat needs a non-empty list of Rollouts")
        if len({r.pad_token_id for r in items}) != 1:
            pads = sorted({r.pad_token_id for r in items})
            raise ValueError(f"cannot concat results with different pad_token_id: {pads}")
        ks = {r._top_lp.shape[1] for r in items if r._top_lp is not None}
        if len(ks) > 1:
            raise ValueError(f"cannot concat results with different top-k sizes: {sorted(ks)}")
        dfs = [r._checked_df() for r in items]
        if renumber:
            shifted, start = [], 0
            for d in dfs:
                d = d.copy()
                d["prompt_index"] = d["prompt_index"] + start
                start = int(d["prompt_index"].max()) + 1 if len(d) else start
                shifted.append(d)
            dfs = shifted
        k = ks.pop() if ks else 0
        fills = {  # what a row without the field gets: NaN means "not returned"
            "logprobs": lambda t: np.full(t, np.nan, np.float32),
            "top_logprobs": lambda t: np.full((t, k), np.nan, np.float32),
            "top_ids": lambda t: np.full((t, k), items[0].pad_token_id, np.int64),
            "token_texts": lambda t: np.full(t, None, object),
            "prompt_logprobs": lambda t: np.full(t, np.nan, np.float32),
        }
        fields: dict[str, np.ndarray | None] = {}
        for name in _FIELDS:
            own = [getattr(r, _ATTR[name]) for r in items]
            if all(a is None for a in own):
                fields[name] = None
                continue
            sizes = [len(r._p_ids) if name == "prompt_logprobs" else len(r._r_ids) for r in items]
            fields[name] = np.concatenate([a if a is not None else fills[name](s) for a, s in zip(own, sizes)])
        models = list(dict.fromkeys(r.model for r in items if r.model))
        same_sampling = all(r.sampling == items[0].sampling for r in items)
        out = cls(
            df=pd.concat(dfs, ignore_index=True),
            prompt_ids=np.concatenate([r._p_ids for r in items]),
            prompt_offsets=_offsets(np.concatenate([np.diff(r._p_off) for r in items])),
            response_ids=np.concatenate([r._r_ids for r in items]),
            response_offsets=_offsets(np.concatenate([np.diff(r._r_off) for r in items])),
            meta_info=[m for r in items for m in r.meta_info],
            pad_token_id=items[0].pad_token_id,
            logprobs=fields["logprobs"],
            top_logprobs=fields["top_logprobs"],
            top_ids=fields["top_ids"],
            token_texts=fields["token_texts"],
            prompt_logprobs=fields["prompt_logprobs"],
            model=", ".join(models),
            sampling=items[0].sampling if same_sampling else None,
            decode=next((r.decode for r in items if r.decode is not None), None),
        )
        return out

    # -- tensors ---------------------------------------------------------------------------------
    def tensors(self) -> dict[str, torch.Tensor]:
        """All tensors by name (optional ones only when present); see the class docstring."""
        if self._cache is None:
            import torch

            cache = {k: torch.from_numpy(v) for k, v in self._build_arrays().items()}
            if self._device is not None:
                cache = {k: v.to(self._device) for k, v in cache.items()}
            self._cache = cache
        return dict(self._cache)

    def _build_arrays(self) -> dict[str, np.ndarray]:
        p_len, r_len = np.diff(self._p_off), np.diff(self._r_off)
        pad = self.pad_token_id
        prompt_ids = _pad(self._p_ids, p_len, pad, left=True)
        response_ids = _pad(self._r_ids, r_len, pad, left=False)
        prompt_mask = np.arange(prompt_ids.shape[1]) >= (prompt_ids.shape[1] - p_len)[:, None]
        response_mask = np.arange(response_ids.shape[1]) < r_len[:, None]
        out = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "input_ids": np.concatenate([prompt_ids, response_ids], axis=1),
            "attention_mask": np.concatenate([prompt_mask, response_mask], axis=1),
            "lengths": r_len.astype(np.int64),
        }
        if self._lp is not None:
            out["logprobs"] = _pad(self._lp, r_len, 0.0, left=False)
        if self._top_lp is not None and self._top_ids is not None:
            out["top_logprobs"] = _pad(self._top_lp, r_len, 0.0, left=False)
            out["top_ids"] = _pad(self._top_ids, r_len, pad, left=False)
        if self._p_lp is not None:
            out["prompt_logprobs"] = _pad(self._p_lp, p_len, 0.0, left=True)
        return out

    def _tensor(self, name: str) -> torch.Tensor | None:
        if self._cache is None:
            self.tensors()
        assert self._cache is not None
        return self._cache.get(name)

    def _required(self, name: str) -> torch.Tensor:
        tensor = self._tensor(name)
        assert tensor is not None
        return tensor

    @property
    def prompt_ids(self) -> torch.Tensor:
        """[N, P] int64, left-padded with pad_token_id."""
        return self._required("prompt_ids")

    @property
    def prompt_mask(self) -> torch.Tensor:
        """[N, P] bool, False on padding."""
        return self._required("prompt_mask")

    @property
    def response_ids(self) -> torch.Tensor:
        """[N, R] int64, right-padded with pad_token_id."""
        return self._required("response_ids")

    @property
    def response_mask(self) -> torch.Tensor:
        """[N, R] bool, False on padding."""
        return self._required("response_mask")

    @property
    def input_ids(self) -> torch.Tensor:
        """[N, P+R] int64: cat(prompt_ids, response_ids); response token j is at column P + j."""
        return self._required("input_ids")

    @property
    def attention_mask(self) -> torch.Tensor:
        """[N, P+R] bool: cat(prompt_mask, response_mask)."""
        return self._required("attention_mask")

    @property
    def lengths(self) -> torch.Tensor:
        """[N] int64 response lengths."""
        return self._required("lengths")

    @property
    def logprobs(self) -> torch.Tensor | None:
        """[N, R] float32 logprob of each response token; 0.0 where masked; None without logprobs."""
        return self._tensor("logprobs")

    @property
    def top_logprobs(self) -> torch.Tensor | None:
        """[N, R, k] float32 top-k logprobs per response position (0.0 where masked), or None."""
        return self._tensor("top_logprobs")

    @property
    def top_ids(self) -> torch.Tensor | None:
        """[N, R, k] int64 token ids of the top-k alternatives (pad_token_id where masked), or None."""
        return self._tensor("top_ids")

    @property
    def prompt_logprobs(self) -> torch.Tensor | None:
        """[N, P] float32 prompt logprobs aligned with prompt_ids (NaN where none, 0.0 on padding), or None."""
        return self._tensor("prompt_logprobs")

    def to(self, device: Any) -> Rollouts:
        """A copy whose tensors live on `device` (rows, meta_info and flat data are shared)."""
        import torch

        out = self._shallow_copy()
        out._device = torch.device(device)
        out._cache = {k: v.to(out._device) for k, v in self.tensors().items()}
        return out

    def _shallow_copy(self) -> Rollouts:
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out._df = self._df.copy(deep=False)
        out.meta_info = list(self.meta_info)
        return out

    # -- per-row token access (for display and debugging) ----------------------------------------
    def tokens(self, i: int) -> dict[str, Any]:
        """Row i's response tokens: ids, logprobs, token texts, top-k (None where absent).

        Reads the flat CPU data, never the (possibly on-GPU) tensors.
        """
        i = int(self._index(i)[0])
        a, b = int(self._r_off[i]), int(self._r_off[i + 1])
        sl = lambda x: None if x is None else x[a:b]  # noqa: E731
        return {
            "ids": self._r_ids[a:b],
            "logprobs": sl(self._lp),
            "texts": None if self._texts is None else list(self._texts[a:b]),
            "top_logprobs": sl(self._top_lp),
            "top_ids": sl(self._top_ids),
        }

    # -- parquet ---------------------------------------------------------------------------------
    def to_parquet(self, path: str | os.PathLike[str]) -> None:
        """Write rows, token ids, logprobs, top-k, meta_info, pad id, model and sampling to one file.

        Token data are list columns named `_rlgen_*` beside the df's own columns (so the file also
        opens as a plain table); meta_info is stored as JSON text, pad id, model and sampling
        (which must be JSON-able) in the file's metadata. `decode` is not saved.
        """
        import orjson
        import pyarrow as pa
        import pyarrow.parquet as pq

        df = self._checked_df()
        clash = [c for c in df.columns if str(c).startswith("_rlgen_")]
        if clash:
            raise ValueError(f"column names starting with '_rlgen_' are reserved: {clash}")
        # matched_stop mixes token ids and stop strings, which parquet cannot hold in one column.
        if "matched_stop" in df:
            df = df.assign(matched_stop=[json.dumps(m) for m in df["matched_stop"]])
        try:
            table = pa.Table.from_pandas(df, preserve_index=False)
        except (pa.ArrowException, TypeError, ValueError) as err:
            raise TypeError(f"a df column cannot be written to parquet ({err}); convert it to a plain type") from err

        def ragged(values: np.ndarray, offsets: np.ndarray) -> pa.Array:
            if values.ndim == 2:  # [T, k] -> list<fixed_size_list<k>>
                inner = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
            else:
                inner = pa.array(values, type=pa.string()) if values.dtype == object else pa.array(values)
            return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), inner)

        arrays = {
            "prompt_ids": ragged(self._p_ids, self._p_off),
            "response_ids": ragged(self._r_ids, self._r_off),
            "meta_info": pa.array([orjson.dumps(m).decode() for m in self.meta_info], pa.string()),
        }
        for name in _FIELDS:
            values = getattr(self, _ATTR[name])
            if values is not None:
                arrays[name] = ragged(values, self._p_off if name == "prompt_logprobs" else self._r_off)
        for name, arr in arrays.items():
            table = table.append_column(f"_rlgen_{name}", arr)
        meta = {
            "version": _PARQUET_VERSION,
            "pad_token_id": self.pad_token_id,
            "model": self.model,
            "sampling": self.sampling,
        }
        schema_meta = {**(table.schema.metadata or {}), _PARQUET_KEY: json.dumps(meta).encode()}
        table = table.replace_schema_metadata(schema_meta)
        pq.write_table(table, os.fspath(path))

    @classmethod
    def from_parquet(cls, path: str | os.PathLike[str]) -> Rollouts:
        """Read a file written by `to_parquet`."""
        import orjson
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(os.fspath(path))
        raw = (table.schema.metadata or {}).get(_PARQUET_KEY)
        if raw is None:
            raise ValueError(f"{path} was not written by Rollouts.to_parquet (no rlgen metadata)")
        meta = json.loads(raw)
        if meta.get("version") != _PARQUET_VERSION:
            raise ValueError(f"{path} has rlgen parquet version {meta.get('version')}, expected {_PARQUET_VERSION}")

        def ragged(name: str) -> tuple[np.ndarray, np.ndarray] | None:
            if f"_rlgen_{name}" not in table.column_names:
                return None
            arr = table.column(f"_rlgen_{name}").combine_chunks()
            offsets = arr.offsets.to_numpy().astype(np.int64)
            values = arr.flatten()
            if pa.types.is_fixed_size_list(values.type):  # [T, k]
                k = values.type.list_size
                values = values.flatten().to_numpy(zero_copy_only=False).reshape(-1, k)
            else:
                values = values.to_numpy(zero_copy_only=False)
            return values, offsets - offsets[0]

        p_ids, p_off = ragged("prompt_ids")  # type: ignore[misc]
        r_ids, r_off = ragged("response_ids")  # type: ignore[misc]
        fields = {name: ragged(name) for name in _FIELDS}
        metas = [orjson.loads(s) for s in table.column("_rlgen_meta_info").to_pylist()]
        df = table.drop_columns([c for c in table.column_names if c.startswith("_rlgen_")]).to_pandas()
        if "matched_stop" in df:
            # An object Series: a plain list of strings and None would become pandas' str dtype.
            df["matched_stop"] = pd.Series([json.loads(m) for m in df["matched_stop"]], dtype=object, index=df.index)
        texts = fields["token_texts"]
        return cls(
            df=df,
            prompt_ids=p_ids,
            prompt_offsets=p_off,
            response_ids=r_ids,
            response_offsets=r_off,
            meta_info=metas,
            pad_token_id=int(meta["pad_token_id"]),
            logprobs=None if fields["logprobs"] is None else fields["logprobs"][0],
            top_logprobs=None if fields["top_logprobs"] is None else fields["top_logprobs"][0],
            top_ids=None if fields["top_ids"] is None else fields["top_ids"][0],
            token_texts=None if texts is None else texts[0].astype(object),
            prompt_logprobs=None if fields["prompt_logprobs"] is None else fields["prompt_logprobs"][0],
            model=meta.get("model", ""),
            sampling=meta.get("sampling"),
        )

    # -- display ---------------------------------------------------------------------------------
    def __repr__(self) -> str:
        from ._display import short_repr

        return short_repr(self)

    def _repr_html_(self) -> str:
        from ._display import rollouts_html

        return rollouts_html(self)


# ----------------------------------------------------------------------------------------------
# parsing helpers for from_responses (each handles one per-token field, vectorised)


def _normalise_entry(entry: Any, i: int) -> dict[str, Any]:
    if entry is None:
        return Rollouts.failed_response("no response for this sample")
    if not isinstance(entry, dict):
        raise TypeError(f"response {i} must be a dict (an SGLang /generate entry) or None, got {type(entry).__name__}")
    if "meta_info" not in entry and "error" in entry:  # an error object in place of an entry
        err = entry["error"]
        return Rollouts.failed_response(err.get("message", str(err)) if isinstance(err, dict) else str(err))
    return entry


def _output_logprobs(
    lp_rows: list, r_len: np.ndarray, r_off: np.ndarray, r_ids: np.ndarray, bad: dict[int, str]
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
    top_rows: list, r_len: np.ndarray, r_off: np.ndarray, pad: int, bad: dict[int, str]
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


def _token_texts(lp_rows: list, r_len: np.ndarray, r_off: np.ndarray, bad: dict[int, str]) -> np.ndarray | None:
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
    in_rows: list, p_len: np.ndarray, p_off: np.ndarray, p_ids: np.ndarray, bad: dict[int, str]
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


# ----------------------------------------------------------------------------------------------


def compare_logprobs(
    a: Rollouts | torch.Tensor,
    b: Rollouts | torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
) -> dict[str, float | int]:
    """Compare two sets of response logprobs over real response positions only.

    Args:
        a, b: Rollouts, or [N, R] logprob tensors. With two Rollouts their response ids must match.
        mask: [N, R] bool; needed only when neither a nor b is a Rollouts.

    Returns:
        dict with max_abs_diff, mean_abs_diff, n_tokens (positions compared),
        first_token_max_abs_diff (position 0 of non-empty rows) and n_missing (masked positions
        skipped because either side is NaN, i.e. not returned).
    """
    import torch

    def unpack(x: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        if isinstance(x, Rollouts):
            if x.logprobs is None:
                raise ValueError("this Rollouts has no logprobs; generate with return_logprob=True")
            return x.logprobs.cpu(), x.response_mask.cpu(), x.response_ids.cpu()
        if isinstance(x, torch.Tensor):
            return x.detach().cpu(), None, None
        raise TypeError(f"expected Rollouts or a torch.Tensor, got {type(x).__name__}")

    la, ma, ia = unpack(a)
    lb, mb, ib = unpack(b)
    if la.shape != lb.shape:
        raise ValueError(f"logprob shapes differ: {tuple(la.shape)} vs {tuple(lb.shape)}")
    if ia is not None and ib is not None and (not torch.equal(ma, mb) or not torch.equal(ia[ma], ib[mb])):
        raise ValueError("the two Rollouts have different response tokens; their logprobs are not comparable")
    m = mask if mask is not None else ma if ma is not None else mb
    if m is None:
        raise ValueError("pass mask= (the response mask) when comparing two plain tensors")
    m = m.detach().cpu().bool()
    if m.shape != la.shape:
        raise ValueError(f"mask shape {tuple(m.shape)} differs from logprob shape {tuple(la.shape)}")
    la, lb = la.double(), lb.double()
    missing = m & (la.isnan() | lb.isnan())
    use = m & ~missing
    # Equal infinities (e.g. -inf on both sides) agree; inf - inf would otherwise be NaN.
    diff = torch.where(la == lb, torch.zeros_like(la), (la - lb).abs())
    d = diff[use]
    first = diff[:, :1][use[:, :1]] if diff.shape[1] else d[:0]
    return {
        "max_abs_diff": float(d.max()) if d.numel() else 0.0,
        "mean_abs_diff": float(d.mean()) if d.numel() else 0.0,
        "n_tokens": int(d.numel()),
        "first_token_max_abs_diff": float(first.max()) if first.numel() else 0.0,
        "n_missing": int(missing.sum()),
    }
