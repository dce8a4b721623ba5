"""`Rollouts`: the one result object a generation returns.

Owns: the rows (a pandas DataFrame) and the padded torch tensors that line up with them, raw
`meta_info` per row, construction (from SGLang `/generate` entries with
`rollouts_from_responses`, parquet, or flat arrays), selection, concatenation and display hooks. Knows nothing about HTTP, servers or processes: it
receives already-decoded response dicts and the prompt token ids the client sent.

Delegates: parsing response entries into flat arrays to `rollouts/_response_arrays.py`, the ragged
(values + offsets) primitives to `core/_ragged.py`, the file format to `rollouts/_parquet.py`.

Storage is ragged and flat (CSR-style: one flat numpy array per field plus row offsets), so that
construction, selection and concatenation are a few vectorised numpy calls, not Python loops over
tokens. Padded tensors are built from it once, lazily, and cached.

Tensor conventions are stated once, in the class docstring's table; tests check each of them.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import numpy as np

from ..core._columns import CLIENT_COLUMNS, COLUMNS, EPISODE_COLUMNS
from ..core._ragged import gather_rows, pad_rows
from ._fields import FIELDS
from ._flat import FlatRollouts, concat_flat
from ._parquet import read_parquet, register_result_class, result_class, write_parquet
from ._reward_methods import RewardMethods
from ._runs import new_run_id, text_series
from ._tensor_properties import TensorProperties
from ._token_text import TokenText

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from typing_extensions import Self

    from ._browser import RolloutBrowser
    from ._display import HTMLView
    from ._plots import RolloutPlots

__all__ = ["Rollouts"]

R = TypeVar("R", bound="Rollouts")

class Rollouts(TensorProperties, RewardMethods):
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
    loss_mask                 [N, R]        bool     False on padding and on tokens the model did
                                                     not sample (an episode's environment turns);
                                                     = response_mask for single-turn samples
    turn_ids (optional)       [N, R]        int64    0; an episode's assistant turn per token
    versions (optional)       [N, R]        int64    -1; the weight version index that sampled
                                                     each token (`Engine.submit`; generate(): the
                                                     version its answer names); -1 = not known
    ========================  ============  =======  ==============================================

    `logprobs[i, j]` belongs to `response_ids[i, j]`; in `input_ids` that token is at column
    `P + j`. Optional tensors are None when the server did not return them (`logprobs` is None
    when no row has logprobs).

    DataFrame columns: prompt_index, sample_index, prompt, completion, finish_reason ("stop",
    "length", "abort", "error"; "unknown" if the server gave none), matched_stop (token id or stop
    string), prompt_tokens, completion_tokens, cached_tokens, logprob_sum, logprob_mean (NaN
    without logprobs), request_latency_s, weight_version, rid, error (message for aborted/failed
    rows), run, row_id, then extra columns. `run` (str) names the generation a row came from: a
    fresh short id per result, kept by selection and parquet and by `concat`, which can relabel
    (`labels=`); prompt groups (rewards, advantages, `group_stats`) are (run, prompt_index), so
    concatenated runs never mix. `run_sampling` maps each run to its sampling parameters
    (`res.df.run.map(res.run_sampling)` gives each row's). `row_id` (int64) is the row's position in the result it was
    generated in (0..N-1): selection, concat and parquet keep it, so the rows of `res.where(...)`
    are found in `res` with `res.df.row_id.isin(sel.df.row_id)`. `request_latency_s` is the server's end-to-end time (`e2e_latency`)
    of the batched `/generate` request the row was sent in, not the sample's own time: SGLang
    gives most rows of one request the same value (this column was called `latency_s` before; `from_parquet`
    renames it in older files). Per-sample timing exists only when streaming: `ttft_s` (time to
    first token) and `itl_s` (mean inter-token latency), extra columns of `stream=True` results.

    Usage::

        res = engine.generate(prompts, n=4)
        res.df.groupby("prompt_index").completion_tokens.mean()
        long = res.where(lambda df: df.finish_reason == "length")
        batch = res.to("cuda").tensors()
        res.to_parquet("run.parquet"); same = Rollouts.from_parquet("run.parquet")
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass (`Episodes`) is registered for `from_parquet`: its files read back as it."""
        super().__init_subclass__(**kwargs)
        register_result_class(cls)

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
        loss_mask: np.ndarray | None = None,
        turn_ids: np.ndarray | None = None,
        versions: np.ndarray | None = None,
        model: str = "",
        sampling: dict[str, Any] | None = None,
        run_sampling: Mapping[str, dict[str, Any] | None] | None = None,
        decode: Callable[[list[int]], list[str]] | None = None,
        run_records: Mapping[str, dict[str, Any] | None] | None = None,
    ) -> None:
        """Low-level constructor from flat arrays; results come from `Engine.generate`, `from_parquet`, `concat`.

        Each run in `df` gets its entry of `run_sampling`, else `sampling`; a df without a `run`
        column is one new run."""
        n_rows = len(prompt_offsets) - 1
        if len(df) != n_rows or len(response_offsets) != n_rows + 1 or len(meta_info) != n_rows:
            raise ValueError("df, offsets and meta_info must describe the same number of rows")
        if "row_id" not in df.columns:
            # Data from before row ids (an older parquet file, a hand-built df): their order is all
            # that is known, so the ids are the positions, as a fresh result's are.
            df = df.assign(row_id=np.arange(n_rows, dtype=np.int64))
        if "run" not in df.columns:
            df = df.assign(run=text_series([new_run_id()] * n_rows))
        given = dict(run_sampling or {})
        runs = [str(r) for r in df["run"].unique()]
        # One entry per run present (so a selection forgets the runs it dropped); an empty result
        # keeps what it was given, so that res[[]] still tells its sampling.
        self.run_sampling: dict[str, dict[str, Any] | None] = (
            {r: given.get(r, sampling) for r in runs} if runs else given
        )
        # What made each run (see `record`); None for runs of unknown origin (hand-built, old files).
        records = dict(run_records or {})
        self.run_records: dict[str, dict[str, Any] | None] = {r: records.get(r) for r in runs} if runs else records
        self._df = df
        self._p_ids, self._p_off = prompt_ids, prompt_offsets
        self._r_ids, self._r_off = response_ids, response_offsets
        # The optional per-token fields (`_fields.FIELDS`), flat like the ids; None where absent.
        self._f: dict[str, np.ndarray | None] = {
            "logprobs": logprobs, "top_logprobs": top_logprobs, "top_ids": top_ids, "token_texts": token_texts,
            "prompt_logprobs": prompt_logprobs, "loss_mask": loss_mask, "turn_ids": turn_ids,
            "versions": versions,
        }  # fmt: skip
        self.meta_info: list[dict[str, Any]] = meta_info
        self.pad_token_id = int(pad_token_id)
        self.model = model
        # Display only: maps a list of token ids to one text piece per id, for the view and the
        # browser. Parquet keeps its `source` (a TokenText's tokenizer path), so a file read back
        # draws the same text.
        self.decode = decode
        self._cache: dict[str, torch.Tensor] | None = None
        self._device: Any = None

    @property
    def sampling(self) -> dict[str, Any] | None:
        """The sampling parameters of every run when they agree (one run: its own), else None;
        per run in `run_sampling`."""
        values = list(self.run_sampling.values())
        return values[0] if values and all(v == values[0] for v in values) else None

    @sampling.setter
    def sampling(self, value: dict[str, Any] | None) -> None:
        # A new dict, so that copies sharing the old one (`to`, `with_columns`) keep theirs.
        self.run_sampling = dict.fromkeys(self.run_sampling, value)

    @property
    def record(self) -> dict[str, Any] | None:
        """What made this result, for reproducing it: rlgen and server versions, backend, model
        path and the SHA-256 of its weights (`weights_sha256`, None where the weights are not on
        this machine or were pushed from tensors by `Engine.update_weights`, whose records have
        `weights_path` None: they are on no disk), the server's command line (API key redacted), sampling parameters with `n`
        and `seed`, the weight versions of its rows, the call's start time (UTC), the GPU, and the
        completion cache's hits. Kept by selection, `concat` and parquet. None when the result was
        not made by `Engine.generate` (hand-built, an older file); per run in `run_records` when it
        joins several runs (then this raises)."""
        records = list(self.run_records.values())
        if len(records) > 1:
            raise ValueError(f"this result joins {len(records)} runs; read res.run_records (run -> record)")
        return records[0] if records else None

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

    def __getitem__(self, key: Any) -> Self:
        """`res[3]`, `res[2:5]`, `res[[0, 3]]`, `res[bool_mask]`: a Rollouts of those rows."""
        return self._take(self._index(key))

    def where(self, condition: Any) -> Self:
        """The rows where `condition` holds: a callable `df -> bool mask`, or a bool mask/Series.

        The result's df is numbered 0..M-1 (so that it lines up with its tensors); its `row_id`
        column keeps each row's id in the source."""
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

    def _take(self, rows: np.ndarray) -> Self:
        p_off, p_take = gather_rows(self._p_off, rows)
        r_off, r_take = gather_rows(self._r_off, rows)
        fields = {name: None if a is None else a[p_take if FIELDS[name].side == "prompt" else r_take]
                  for name, a in self._f.items()}
        out = type(self)(**FlatRollouts(
            df=self._checked_df().iloc[rows].reset_index(drop=True),
            prompt_ids=self._p_ids[p_take], prompt_offsets=p_off,
            response_ids=self._r_ids[r_take], response_offsets=r_off,
            meta_info=[self.meta_info[i] for i in rows], pad_token_id=self.pad_token_id, fields=fields,
            model=self.model, run_sampling=self.run_sampling, run_records=self.run_records, decode=self.decode,
        ).kwargs())
        out._device = self._device
        return out

    def flat(self) -> FlatRollouts:
        """This result's contents as flat arrays (no copy): `type(res)(**res.flat().kwargs())` is
        the same result. For code that builds results from others (`concat`, subclasses)."""
        return FlatRollouts(
            df=self._checked_df(), prompt_ids=self._p_ids, prompt_offsets=self._p_off, response_ids=self._r_ids,
            response_offsets=self._r_off, meta_info=self.meta_info, pad_token_id=self.pad_token_id,
            fields=dict(self._f), model=self.model, run_sampling=self.run_sampling, run_records=self.run_records,
            decode=self.decode,
        )

    @classmethod
    def concat(cls, items: Iterable[Rollouts], *, labels: Sequence[str] | None = None,
               renumber: bool = False) -> Self:
        """Stack results row-wise and re-pad, keeping which run each row came from.

        Each row keeps its `run` and `row_id`, so prompt groups (`run`, `prompt_index`) never mix
        runs and `run_sampling` keeps each run's parameters. `labels` (one per input) renames the
        inputs' runs: an input of one run gets its label, one of several runs `"<label>/<run>"`.
        Without labels, an input whose rows repeat an earlier input's (`run`, `row_id`) (e.g. the
        same result twice) gets its runs renamed `"<run>#<position>"`. `prompt_index` is kept as
        it is (so rows of the same prompt still match up across runs by prompt_index alone),
        unless `renumber=True`, which shifts each input's prompt_index past the previous ones.
        Optional fields missing from some inputs become NaN / pad there; `model` is kept when all
        agree (else joined with ", ").

        Raises:
            ValueError: `labels` has the wrong length, or leaves two rows with the same (`run`,
                `row_id`), or one run with two different samplings.
        """
        items = list(items)
        if not items or not all(isinstance(r, Rollouts) for r in items):
            raise TypeError("concat needs a non-empty list of Rollouts")
        return cls(**concat_flat([r.flat() for r in items], labels=labels, renumber=renumber).kwargs())

    # -- tensors ---------------------------------------------------------------------------------
    def tensors(self) -> dict[str, torch.Tensor]:
        """All tensors by name (optional ones only when present); see the class docstring.

        With an `advantage` column (`add_rewards`), also `advantages` [N] float32 and
        `token_advantages` [N, R] float32: each row's advantage on the tokens of `loss_mask`, 0.0
        elsewhere (padding, an episode's environment tokens) and for rows whose advantage is NaN (their reward failed), read from the df on
        every call so that they follow edits of the column.
        """
        import torch

        if self._cache is None:
            cache = {k: torch.from_numpy(v) for k, v in self._build_arrays().items()}
            if self._device is not None:
                cache = {k: v.to(self._device) for k, v in cache.items()}
            self._cache = cache
        out = dict(self._cache)
        if "advantage" in self._df.columns:
            adv = np.nan_to_num(self._df["advantage"].to_numpy(dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
            per_row = torch.from_numpy(adv).to(out["response_mask"].device)
            out["advantages"] = per_row
            out["token_advantages"] = per_row[:, None] * out["loss_mask"].to(per_row.dtype)
        return out

    def _build_arrays(self) -> dict[str, np.ndarray]:
        p_len, r_len = np.diff(self._p_off), np.diff(self._r_off)
        pad = self.pad_token_id
        prompt_ids = pad_rows(self._p_ids, p_len, pad, left=True)
        response_ids = pad_rows(self._r_ids, r_len, pad, left=False)
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
        for name, values in self._f.items():
            spec = FIELDS[name]
            if values is None or spec.tensor_pad is None:
                continue
            if name in ("top_ids", "top_logprobs") and (self._f["top_ids"] is None or self._f["top_logprobs"] is None):
                continue
            lengths, left = (p_len, True) if spec.side == "prompt" else (r_len, False)
            out[name] = pad_rows(values, lengths, spec.tensor_pad(pad), left=left)
        for name in ("turn_ids", "versions"):
            if name in out:
                out[name] = out[name].astype(np.int64)
        if "loss_mask" not in out:
            out["loss_mask"] = response_mask
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

    def to(self, device: Any) -> Self:
        """A copy whose tensors live on `device` (rows, meta_info and flat data are shared)."""
        import torch

        out = self._shallow_copy()
        out._device = torch.device(device)
        out._cache = {k: v.to(out._device) for k, v in self.tensors().items()}
        return out

    def _shallow_copy(self) -> Self:
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out._df = self._df.copy(deep=False)
        out.meta_info = list(self.meta_info)
        return out

    # -- columns and rewards ---------------------------------------------------------------------
    def with_columns(self, columns: Mapping[str, Sequence[Any]]) -> Self:
        """A new Rollouts with the same rows and tensors plus (or replacing) these df columns,
        one value per row. rlgen's own columns (`prompt_index`, `completion`, ...) cannot be replaced."""
        clash = sorted(set(columns) & set(COLUMNS))
        if clash:
            raise ValueError(f"{clash} are rlgen's own columns and cannot be replaced; use other names")
        for name, values in columns.items():
            if len(values) != len(self):
                raise ValueError(f"column {name!r} has {len(values)} values for {len(self)} rows")
        out = self._shallow_copy()
        out._df = self._df.assign(**{name: list(v) if not hasattr(v, "dtype") else v for name, v in columns.items()})
        return out

    @property
    def plot(self) -> RolloutPlots:
        """Plots of the rewards, drawn with matplotlib (imported only then; `pip install 'rlgen[plots]'`):
        `res.plot.rewards()`, `.reward_vs_length()`, `.groups()`, `.advantages()`, `.pass_at_k()`."""
        from ._plots import RolloutPlots

        return RolloutPlots(self)

    # -- summaries and per-row token access (for display and debugging) --------------------------
    def id_lists(self, which: str = "response", *, rows: Sequence[int] | None = None) -> list[list[int]]:
        """Each row's token ids as a plain list: "response" (the completion's) or "prompt"; only
        `rows` (positions) when given, without converting the other rows."""
        if which not in ("response", "prompt"):
            raise ValueError(f"which must be 'response' or 'prompt', got {which!r}")
        ids, off = (self._r_ids, self._r_off) if which == "response" else (self._p_ids, self._p_off)
        if rows is not None:
            return [ids[off[i]:off[i + 1]].tolist() for i in self._index(list(rows))]
        flat = ids.tolist()
        bounds = off.tolist()
        return [flat[a:b] for a, b in itertools.pairwise(bounds)]

    @property
    def n_tokens(self) -> int:
        """Response tokens over all rows."""
        return int(self._r_off[-1])

    @property
    def has_logprobs(self) -> bool:
        """Whether any row has response logprobs."""
        return self._f["logprobs"] is not None

    @property
    def data_columns(self) -> list[str]:
        """The df's columns that are the user's: per-prompt data and added columns (the extra
        columns less the client's own (streaming timings, chat messages) and an episode's)."""
        return [c for c in self.extra_columns if c not in CLIENT_COLUMNS and c not in EPISODE_COLUMNS]

    @property
    def extra_columns(self) -> list[str]:
        """The df's columns beyond the built-in ones (added by the client or by you), in order."""
        return [c for c in self._df.columns if c not in COLUMNS]

    def tokens(self, i: int) -> dict[str, Any]:
        """Row i's response tokens: ids, logprobs, token texts, top-k (None where absent).

        `loss_mask` and `turn_ids` are an episode's (None for single-turn results); `versions` the
        weight version index of each token (None where the result has none). Reads the flat CPU
        data, never the (possibly on-GPU) tensors.
        """
        i = int(self._index(i)[0])
        a, b = int(self._r_off[i]), int(self._r_off[i + 1])

        def sl(name: str) -> np.ndarray | None:
            x = self._f[name]
            return None if x is None else x[a:b]

        texts = sl("token_texts")
        return {
            "ids": self._r_ids[a:b],
            "logprobs": sl("logprobs"),
            "texts": None if texts is None else list(texts),
            "top_logprobs": sl("top_logprobs"),
            "top_ids": sl("top_ids"),
            "loss_mask": sl("loss_mask"),
            "turn_ids": sl("turn_ids"),
            "versions": sl("versions"),
        }

    # -- parquet ---------------------------------------------------------------------------------
    def to_parquet(self, path: str | os.PathLike[str] | BinaryIO) -> None:
        """Write rows, token ids, logprobs, top-k, meta_info, pad id, model and sampling to one file.

        `path`: a file name, or a binary file object open for writing.
        Token data are list columns named `_rlgen_*` beside the df's own columns (so the file also
        opens as a plain table); meta_info is stored as JSON text, pad id, model, sampling (which
        must be JSON-able) and the tokenizer's source (path or name, for the token text of the
        view) in the file's metadata.
        """
        df = self._checked_df()
        fields = {name: (values, self._p_off if FIELDS[name].side == "prompt" else self._r_off)
                  for name, values in self._f.items() if values is not None}
        write_parquet(
            path,
            df,
            prompt=(self._p_ids, self._p_off),
            response=(self._r_ids, self._r_off),
            meta_info=self.meta_info,
            fields=fields,
            header={"pad_token_id": self.pad_token_id, "model": self.model, "sampling": self.sampling,
                    "run_sampling": self.run_sampling, "tokenizer": getattr(self.decode, "source", None),
                    "run_records": self.run_records, "result_class": type(self).__qualname__},
        )

    @classmethod
    def from_parquet(cls, path: str | os.PathLike[str] | BinaryIO, *, tokenizer: Any = None) -> Self:
        """Read a file written by `to_parquet` (a name, or a binary file object).

        The view draws token text with `tokenizer` (an object, or a local path or name), else with
        the tokenizer the file names, loaded from local files when first needed; where neither can
        be had, it shows token ids and says why.

        The result is the class that wrote the file where that is `cls` or a subclass of it
        (`rlgen.Rollouts.from_parquet` on an episodes file gives `Episodes`); a file of a class
        that is not imported reads as `cls`, with a warning.

        Raises:
            TypeError: the file holds a plainer result than `cls` (e.g. `Episodes.from_parquet` on
                a `generate()` result's file): read it with the class that wrote it.
        """
        stored = read_parquet(path, tuple(FIELDS))
        made = _class_to_read(cls, stored.header.get("result_class"), path)
        fields, header = stored.fields, stored.header
        if "latency_s" in stored.df.columns and "request_latency_s" not in stored.df.columns:
            # Files written before the rename: the same value (the batched request's time), new name.
            stored.df = stored.df.rename(columns={"latency_s": "request_latency_s"})
        texts = fields["token_texts"]
        return made(
            df=stored.df,
            prompt_ids=stored.prompt[0],
            prompt_offsets=stored.prompt[1],
            response_ids=stored.response[0],
            response_offsets=stored.response[1],
            meta_info=stored.meta_info,
            pad_token_id=int(header["pad_token_id"]),
            model=header.get("model", ""),
            sampling=header.get("sampling"),
            run_sampling=header.get("run_sampling"),
            run_records=header.get("run_records"),
            **{**fields, "token_texts": None if texts is None else texts.astype(object)},
            decode=_token_text_for(tokenizer if tokenizer is not None else header.get("tokenizer")),
        )

    # -- display ---------------------------------------------------------------------------------
    def view(self, *, color: str = "logprob", max_rows: int = 20, max_tokens: int = 200,
             max_chars: int = 200) -> HTMLView:
        """The notebook view (what `res` shows), with choices: `color` "logprob" (each token by
        p = exp(logprob), the default view) or "version" (each token by the weight version index
        that sampled it: a background job's rows that span a weight update show where it fell);
        the first `max_rows` rows, `max_tokens` tokens per row, `max_chars` of each prompt.

        Raises:
            ValueError: an unknown colour, or "version" for a result without versions (hand-built,
                older files).
        """
        from ._display import COLORS, HTMLView, rollouts_html, short_repr

        if color not in COLORS:
            raise ValueError(f"color must be one of {', '.join(map(repr, COLORS))}, got {color!r}")
        if color == "version" and self._f["versions"] is None:
            raise ValueError("this result has no weight versions (res.versions is None): color='version' needs a "
                             "result of Engine.generate, submit, episodes or submit_episodes")
        return HTMLView(rollouts_html(self, max_rows=max_rows, max_tokens=max_tokens, max_chars=max_chars,
                                      color=color), short_repr(self))

    def browse(self, *, reward: str = "reward", widgets: bool | None = None) -> RolloutBrowser:
        """A browser over these rows for a notebook: filter by finish reason, `reward` range and
        text, step through prompt groups, read the selected sample's token heatmap and its least
        likely tokens with their top-k alternatives.

        `widgets`: None (auto) shows ipywidgets controls where a frontend widget manager is
        attached (JupyterLab, VS Code) and the static HTML of the selection elsewhere (nbconvert,
        a plain terminal); True or False forces either. The selection is also settable from code
        (see `RolloutBrowser`)."""
        from ._browser import RolloutBrowser

        return RolloutBrowser(self, reward=reward, widgets=widgets)

    def __repr__(self) -> str:
        from ._display import short_repr

        return short_repr(self)

    def _repr_html_(self) -> str:
        from ._display import rollouts_html

        return rollouts_html(self)


register_result_class(Rollouts)


def _class_to_read(cls: type[R], name: str | None, path: str | os.PathLike[str] | BinaryIO) -> type[R]:
    """The class a file is read as: the one that wrote it (`name`) where that is `cls` or a
    subclass of it; `cls` for files written before the name was kept."""
    if name is None or name == cls.__qualname__:
        return cls
    wrote = result_class(name)
    if wrote is None:
        warnings.warn(f"{_source_name(path)} was written by {name}, a class not imported here: read as {cls.__qualname__} "
                      f"(import the module that defines {name}, then read it again)", stacklevel=3)
        return cls
    if issubclass(wrote, cls):
        return wrote
    if issubclass(cls, wrote):
        raise TypeError(f"{_source_name(path)} holds a {name}, not {cls.__qualname__}: read it with "
                        f"{name}.from_parquet(...)")
    return cls


def _source_name(path: str | os.PathLike[str] | BinaryIO) -> str:
    return os.fspath(path) if isinstance(path, (str, os.PathLike)) else "this file"


def _token_text_for(tokenizer: Any) -> TokenText | None:
    """A TokenText for a tokenizer object or source; None for None."""
    if tokenizer is None:
        return None
    if isinstance(tokenizer, (str, os.PathLike)):
        return TokenText.load(str(tokenizer))
    return TokenText(tokenizer)
