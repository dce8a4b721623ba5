"""`compare`: how far a second weight version moved the logprobs of the same tokens; `LogprobShift`.

Owns: the per-token log-ratio of two sets of logprobs over the same response tokens, Schulman's
three sample estimators of KL(a‖b) built from it ("Approximating KL divergence", 2020), their
per-row sums (sequence-level estimates) and per-prompt means, and `LogprobShift`: those numbers as
tensors, a DataFrame lined up with a's rows, a summary, and an HTML heatmap of the tokens coloured
by how far they moved. Knows nothing about servers, weight updates or how the logprobs were made
(sampled, `eng.score`, a trainer's own forward pass): it reads two `Rollouts` through their public
tensors and df, and draws tokens through `rollouts._display`.

Definitions (the tokens were drawn from a, so these estimate KL(a‖b) = E_a[log p_a - log p_b]):

- log r = lp_b - lp_a, the log importance ratio r = p_b / p_a of each token;
- k1 = -log r: unbiased, but single tokens are often negative and its variance is high;
- k2 = (log r)^2 / 2: never negative, low variance, biased (exact only to second order);
- k3 = (r - 1) - log r: unbiased and never negative (log r <= r - 1), lower variance than k1;
  computed as expm1(log r) - log r, which keeps its precision when r is close to 1.

Only response positions where both logprobs are finite are compared: padding never counts, and a
real token whose logprob is NaN (not returned) or infinite on either side is counted in `missing`.
"""

from __future__ import annotations

import html
import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..rollouts._display import VIEW_STYLE, clip_text, last_user_message, logprob_color, piece_html, token_pieces
from ._logprobs import not_comparable_reason

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from ..rollouts._rollouts import Rollouts

__all__ = ["LogprobShift", "ShiftHeatmap", "compare", "shift_color", "two_labels"]

# What `top` may sort by: the per-row columns that grow with how far a row moved.
_RANKABLE = ("k1", "k2", "k3", "k3_per_token", "diff_mean", "diff_max_abs")
_NEXT_STEP = "score a's rows under the other weights with eng.score(a)"


def compare(a: Rollouts, b: Rollouts, *, labels: Sequence[str] = ("a", "b")) -> LogprobShift:
    """How the logprobs of the same tokens moved from weight version a to version b.

    Args:
        a: rows with the tokens' logprobs under version A (the sampled rows, or `eng.score(res)`
            before a weight update): the tokens were drawn from A.
        b: the same rows (same prompt and response ids, same order) with their logprobs under
            version B, typically `eng.score(a)` after `eng.update_weights_from_disk(...)`.
        labels: names for a and b in reprs, the summary and the heatmap.

    Returns:
        A `LogprobShift` (see there): per-token tensors, per-row `df`, `per_prompt()`, `summary`,
        `top()` and `heatmap()`.

    Raises:
        TypeError: a or b is not a Rollouts, or labels are not two strings.
        ValueError: a side has no logprobs, or b holds other rows or tokens than a.

    Usage::

        before = eng.score(res)                 # or res itself, when sampled at temperature 1
        eng.update_weights_from_disk("ckpt/step_100")
        shift = rlgen.compare(before, eng.score(res), labels=("step 0", "step 100"))
        shift.summary["k3_per_token"], shift.top(5), shift.heatmap()
        res = res.with_columns({"kl_k3": shift.df["k3"]})
    """
    from ..rollouts._rollouts import Rollouts

    # 1) inputs: two Rollouts of the same tokens, each with logprobs
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, Rollouts):
            raise TypeError(f"{name} must be a Rollouts, got {type(value).__name__}")
        if value.logprobs is None:
            raise ValueError(f"{name} has no logprobs: generate with logprobs=True, or score it: eng.score({name})")
    names = two_labels(labels)
    _check_same_tokens(a, b)

    # 2) per-token numbers, in float64 (the estimators subtract nearly equal numbers)
    ta, tb = a.tensors(), b.tensors()
    # The tokens both sides sampled: response tokens, less an episode's environment tokens.
    real = (ta["loss_mask"] & tb["loss_mask"]).cpu().numpy()
    lp_a = _numpy(ta["logprobs"])
    lp_b = _numpy(tb["logprobs"])
    mask = real & np.isfinite(lp_a) & np.isfinite(lp_b)
    missing = int((real & ~mask).sum())
    lp_a, lp_b = np.where(mask, lp_a, 0.0), np.where(mask, lp_b, 0.0)
    log_r = lp_b - lp_a  # exactly 0 where the two logprobs are equal
    tokens = {
        "logprobs_a": lp_a,
        "logprobs_b": lp_b,
        "diff": log_r,
        "ratio": np.where(mask, np.exp(log_r), 0.0),
        "k1": 0.0 - log_r,  # 0.0 - x, not -x: equal logprobs give +0.0, never -0.0
        "k2": 0.5 * log_r * log_r,
        "k3": np.where(mask, np.expm1(log_r) - log_r, 0.0),
    }
    note = _sampling_note(a, b)
    if note is not None:
        warnings.warn(note, RuntimeWarning, stacklevel=2)
    return LogprobShift(tokens=tokens, mask=mask, missing=missing, source=a, labels=names, note=note)


class LogprobShift:
    """What `rlgen.compare(a, b)` found: how the logprobs of a's tokens moved from a to b.

    Attributes and methods:

    - `tensors()`: [N, R] float32 `logprobs_a`, `logprobs_b`, `diff` (b - a = log r), `ratio`
      (exp(diff) = p_b / p_a), `k1`, `k2`, `k3` (see the module docstring), all 0.0 where `mask`
      is False, and `mask` [N, R] bool: the response positions where both logprobs are known.
    - `df`: one row per row of a (same index): prompt_index, sample_index, completion_tokens,
      tokens_compared, diff_mean, diff_max_abs, ratio_min, ratio_max, k1, k2, k3 (sums over the
      row's compared tokens: the sequence-level KL estimates) and k3_per_token (their mean). A row
      with no token compared has NaN in every number but tokens_compared.
    - `per_prompt()`, `summary`, `top(k)`, `heatmap(rows)`; `labels`; `missing` (real response
      tokens left out because a logprob is NaN or infinite); `note` (why the two sets of logprobs
      may not be comparable, else None).

    Usage::

        shift = rlgen.compare(before, after)
        res = res.with_columns({"kl_k3": shift.df["k3"], "kl_k3_per_token": shift.df["k3_per_token"]})
        shift.tensors()["k3"].sum() / shift.tensors()["mask"].sum()    # = shift.summary["k3_per_token"]
    """

    def __init__(self, *, tokens: dict[str, np.ndarray], mask: np.ndarray, missing: int, source: Rollouts,
                 labels: tuple[str, str], note: str | None) -> None:
        """Made by `compare`; `tokens` are [N, R] float64 arrays, 0.0 where `mask` is False."""
        self.labels = labels
        self.missing = missing
        self.note = note
        self._tokens, self._mask = tokens, mask
        self._source = source
        # Snapshot of what the df, per_prompt and top read from a: later edits of a.df do not move them.
        keep = ["run", "prompt_index", "prompt", "completion", *(["prompt_messages"] if "prompt_messages" in source.df
                                                                 else [])]
        self._rows = source.df[keep].copy()
        self.df: pd.DataFrame = _row_table(tokens, mask, source.df)
        self.summary: dict[str, Any] = self._summarize()
        self._cached: dict[str, torch.Tensor] | None = None

    # -- numbers ---------------------------------------------------------------------------------
    def tensors(self) -> dict[str, torch.Tensor]:
        """[N, R] float32 per-token tensors (0.0 where `mask` is False) and the bool `mask`, on the CPU."""
        import torch

        if self._cached is None:
            out = {k: torch.from_numpy(v.astype(np.float32)) for k, v in self._tokens.items()}
            out["mask"] = torch.from_numpy(self._mask.copy())
            self._cached = out
        return dict(self._cached)

    def _summarize(self) -> dict[str, Any]:
        mask, t = self._mask, self._tokens
        n = int(mask.sum())
        compared = self.df["tokens_compared"].to_numpy() > 0
        out: dict[str, Any] = {"labels": self.labels, "rows": len(self.df), "rows_compared": int(compared.sum()),
                               "tokens_compared": n, "missing": self.missing}
        for name in ("k1", "k2", "k3"):
            out[f"{name}_per_token"] = float(t[name][mask].mean()) if n else math.nan
        for name in ("k1", "k2", "k3"):
            sums = self.df[name].to_numpy(dtype=np.float64)[compared]
            out[f"{name}_per_sequence"] = float(sums.mean()) if sums.size else math.nan
        out["diff_mean"] = float(t["diff"][mask].mean()) if n else math.nan
        out["diff_max_abs"] = float(np.abs(t["diff"][mask]).max()) if n else math.nan
        return out

    def per_prompt(self) -> pd.DataFrame:
        """One row per prompt group of a (`run`, `prompt_index`): samples, tokens_compared, the mean
        over its rows of the row sums k1, k2, k3 (rows with no token compared left out), and
        diff_mean over all its compared tokens."""
        import pandas as pd

        df = self.df
        diff_sum = np.nan_to_num(df["diff_mean"].to_numpy(dtype=np.float64)) * df["tokens_compared"].to_numpy()
        frame = df[["tokens_compared", "k1", "k2", "k3"]].assign(
            run=self._rows["run"].to_numpy(), prompt_index=df["prompt_index"].to_numpy(), diff_sum=diff_sum)
        groups = frame.groupby(["run", "prompt_index"], sort=False)
        out = pd.DataFrame({"samples": groups.size(), "tokens_compared": groups["tokens_compared"].sum()})
        for name in ("k1", "k2", "k3"):
            out[name] = groups[name].mean()
        with np.errstate(invalid="ignore", divide="ignore"):
            out["diff_mean"] = groups["diff_sum"].sum() / out["tokens_compared"].where(out["tokens_compared"] > 0)
        return out.reset_index()

    def top(self, k: int = 5, *, by: str = "k3") -> pd.DataFrame:
        """The `k` rows whose logprobs moved most: rows of `df` (a's row positions as the index)
        with the largest |`by`| first, rows with nothing compared last, plus their `completion`."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an int >= 0, got {k!r}")
        if by not in _RANKABLE:
            raise ValueError(f"by must be one of {', '.join(map(repr, _RANKABLE))}, got {by!r}")
        key = self.df[by].abs().sort_values(ascending=False, na_position="last", kind="stable")
        picked = key.index[:k]
        return self.df.loc[picked].assign(completion=self._rows["completion"].loc[picked])

    # -- display ---------------------------------------------------------------------------------
    def heatmap(self, rows: int | Sequence[int] | pd.DataFrame | None = None, *, max_rows: int = 8,
                max_tokens: int = 200, scale: float | None = None) -> ShiftHeatmap:
        """The response tokens of `rows` coloured by diff = lp_b - lp_a, with a legend.

        Args:
            rows: row positions in a (an int, a list, or a DataFrame such as `top(...)`, whose index
                is used); default `top(max_rows)`.
            max_rows: at most this many rows are drawn (the rest are counted).
            max_tokens: tokens past this many in a row are cut (and counted).
            scale: the |diff| drawn at full colour; default the largest |diff| among the drawn
                tokens, rounded up to 1, 2 or 5 times a power of ten.

        Each token's tooltip gives both logprobs, the diff and the ratio; tokens lower under b are
        red, higher blue, white near 0, grey where a logprob is missing.
        """
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows must be an int >= 1, got {max_rows!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        picked = self._row_positions(rows, max_rows)
        return ShiftHeatmap(self, picked[:max_rows], hidden=max(0, len(picked) - max_rows),
                            max_tokens=max_tokens, scale=scale)

    def _row_positions(self, rows: int | Sequence[int] | pd.DataFrame | None, max_rows: int) -> list[int]:
        import pandas as pd

        if rows is None:
            return [int(i) for i in self.top(max_rows).index]
        if isinstance(rows, pd.DataFrame):  # e.g. top(...): its index
            values: list[Any] = list(rows.index)
        elif isinstance(rows, (int, np.integer)) and not isinstance(rows, bool):
            values = [rows]
        elif isinstance(rows, Sequence) and not isinstance(rows, str):
            values = list(rows)
        else:
            raise TypeError(f"rows must be an int, a list of ints or a DataFrame, got {type(rows).__name__}")
        n = len(self.df)
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < n:
                raise ValueError(f"rows must be row positions 0..{n - 1} of a, got {value!r}")
        return [int(v) for v in values]

    def _headline(self) -> str:
        s = self.summary
        la, lb = self.labels
        if not s["tokens_compared"]:
            return f"LogprobShift {la} → {lb}: no token compared ({self.missing} missing)"
        missing = f", {self.missing} missing" if self.missing else ""
        return (f"LogprobShift {la} → {lb}: {s['tokens_compared']} tokens in {s['rows_compared']} rows{missing} | "
                f"KL({la}‖{lb}) per token: k1 {s['k1_per_token']:.4g}, k3 {s['k3_per_token']:.4g}; "
                f"per sequence: k3 {s['k3_per_sequence']:.4g} | mean diff {s['diff_mean']:+.4g}, "
                f"max |diff| {s['diff_max_abs']:.4g}")

    def __repr__(self) -> str:
        note = f" | note: {self.note}" if self.note else ""
        return f"<{self._headline()}{note}>"

    def _repr_html_(self) -> str:
        s = self.summary
        la, lb = (html.escape(x) for x in self.labels)
        formulas = {"k1": "−log r", "k2": "(log r)² / 2", "k3": "(r − 1) − log r"}
        body = "".join(
            f"<tr><td>{name}</td><td>{formulas[name]}</td><td class='rlgen-num'>{_number(s[f'{name}_per_token'])}</td>"
            f"<td class='rlgen-num'>{_number(s[f'{name}_per_sequence'])}</td></tr>"
            for name in ("k1", "k2", "k3")
        )
        table = (f"<table><thead><tr><th>estimator</th><th>of KL({la}‖{lb})</th><th>per token (mean)</th>"
                 f"<th>per sequence (mean row sum)</th></tr></thead><tbody>{body}</tbody></table>")
        facts = (f"log r = lp<sub>{lb}</sub> − lp<sub>{la}</sub> over {s['tokens_compared']} tokens in "
                 f"{s['rows_compared']} rows ({self.missing} missing: a logprob NaN or infinite); mean diff "
                 f"{_number(s['diff_mean'], signed=True)}, max |diff| {_number(s['diff_max_abs'])}. The tokens "
                 f"were drawn from {la}.")
        note = f'<div style="color:#c80">{html.escape(self.note)}</div>' if self.note else ""
        heatmap = self.heatmap(max_rows=min(5, max(1, len(self.df))))._inner_html() if len(self.df) else ""
        return (f'<div class="rlgen-rollouts" style="max-width:1000px">{VIEW_STYLE}'
                f'<div style="font-family:monospace;margin-bottom:4px">LogprobShift {la} → {lb}</div>{table}'
                f'<div style="color:#666;font-size:90%;margin:4px 0">{facts}</div>{note}{heatmap}</div>')


class ShiftHeatmap:
    """`LogprobShift.heatmap(...)`: rows of tokens coloured by how far their logprob moved; shows
    itself as HTML in a notebook (`.html` holds the markup)."""

    def __init__(self, shift: LogprobShift, rows: list[int], *, hidden: int, max_tokens: int,
                 scale: float | None) -> None:
        self.rows = rows
        diff, mask = shift._tokens["diff"], shift._mask
        drawn = np.abs(diff[rows, :max_tokens][mask[rows, :max_tokens]]) if rows else np.zeros(0)
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0):
            raise ValueError(f"scale must be a number > 0 (the |diff| drawn at full colour), got {scale!r}")
        self.scale = float(scale) if scale is not None else _nice_ceiling(float(drawn.max()) if drawn.size else 0.0)
        self._shift, self._hidden, self._max_tokens = shift, hidden, max_tokens

    @property
    def html(self) -> str:
        """The heatmap as an HTML fragment (escaped, at most 1,000 px wide)."""
        return f'<div class="rlgen-rollouts" style="max-width:1000px">{VIEW_STYLE}{self._inner_html()}</div>'

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        la, lb = self._shift.labels
        return (f"<ShiftHeatmap of {len(self.rows)} row{'s' if len(self.rows) != 1 else ''}: "
                f"diff = lp {lb} − lp {la}, full colour at ±{self.scale:g}>")

    def _inner_html(self) -> str:
        la, lb = self._shift.labels
        swatches = "".join(
            f'<span style="background:{shift_color(v, self.scale)};color:#111;padding:0 5px">{v:+g}</span>'
            for v in (-self.scale, -self.scale / 2, 0.0, self.scale / 2, self.scale)
        )
        legend = (f'<div class="rlgen-legend" style="margin:4px 0">diff = lp {html.escape(lb)} − lp '
                  f'{html.escape(la)}: {swatches} (red: lower under {html.escape(lb)}, blue: higher; '
                  f'<span style="background:{_MISSING}">grey</span>: a logprob missing). Hover a token for '
                  "both logprobs, the diff and the ratio.</div>")
        parts = [legend, *(self._row_html(i) for i in self.rows)]
        if self._hidden:
            parts.append(f'<div style="color:#888">{self._hidden} more rows not drawn (max_rows)</div>')
        return "".join(parts)

    def _row_html(self, i: int) -> str:
        shift = self._shift
        src, t, mask = shift._source, shift._tokens, shift._mask
        la, lb = shift.labels
        row = shift.df.iloc[i]
        tok = src.tokens(i)
        ids = [int(x) for x in tok["ids"][: self._max_tokens]]
        texts = tok["texts"][: self._max_tokens] if tok["texts"] is not None else None
        pieces = token_pieces(src, ids, texts)
        spans = []
        for j, tid in enumerate(ids):
            body = f"{tid} " if pieces is None else piece_html(pieces[j], tid, src.pad_token_id)
            title = f"token {j}: id {tid}" + ("" if pieces is None else f" {pieces[j]!r}")
            if mask[i, j]:
                title += (f" | lp {la} {t['logprobs_a'][i, j]:.4f} | lp {lb} {t['logprobs_b'][i, j]:.4f} | "
                          f"diff {t['diff'][i, j]:+.4f} | ratio {t['ratio'][i, j]:.4g}")
                color = shift_color(float(t["diff"][i, j]), self.scale)
            else:
                title += f" | a logprob is missing under {la} or {lb}: not compared"
                color = _MISSING
            spans.append(f'<span style="background:{color}" title="{html.escape(title)}">{body}</span>')
        more = len(tok["ids"]) - len(ids)
        if more > 0:
            spans.append(f'<span style="color:#888"> … +{more} tokens</span>')
        if not ids:
            spans.append('<span style="color:#888">(empty)</span>')
        prompt = last_user_message(shift._rows.iloc[i])
        if prompt is None:
            prompt = shift._rows["prompt"].iloc[i]
        head = (f"row {i} · prompt {int(row['prompt_index'])} · sample {int(row['sample_index'])} · "
                f"{int(row['tokens_compared'])} token{'s' if int(row['tokens_compared']) != 1 else ''} compared · k3 {_number(float(row['k3']))} · "
                f"mean diff {_number(float(row['diff_mean']), signed=True)}")
        if isinstance(prompt, str):
            head += f" · prompt: {clip_text(prompt, 80, tail=True)}"
        return (f'<div style="margin:6px 0"><div style="color:#666;font-size:90%">{html.escape(head)}</div>'
                '<div style="white-space:pre-wrap;word-break:break-word;overflow-wrap:anywhere;color:#111;'
                f'line-height:1.5;text-align:left">{"".join(spans)}</div></div>')


# -- helpers ---------------------------------------------------------------------------------------

# The view's grey for a token without a logprob.
_MISSING = logprob_color(math.nan)


def shift_color(diff: float, scale: float) -> str:
    """Background colour for a token whose logprob moved by `diff`: white at 0, red when lower under
    b, blue when higher, at full (light) colour from |diff| >= `scale` on; grey for NaN."""
    import colorsys

    if math.isnan(diff):
        return _MISSING
    t = min(abs(diff) / scale, 1.0) if scale > 0 else 0.0
    # Lightness runs from white down to 0.62, light enough that dark text stays readable.
    r, g, b = colorsys.hls_to_rgb(0.0 if diff < 0 else 0.6, 1.0 - 0.38 * t, 0.8)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is >= value (at least 1e-3)."""
    if not value > 1e-3:
        return 1e-3
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value * (1 - 1e-12))


def _number(value: float, *, signed: bool = False) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def two_labels(labels: Sequence[str]) -> tuple[str, str]:
    if isinstance(labels, str) or not isinstance(labels, Sequence) or len(labels) != 2 \
            or not all(isinstance(x, str) for x in labels):
        raise TypeError(f"labels must be two strings, e.g. ('before', 'after'), got {labels!r}")
    if labels[0] == labels[1]:
        raise ValueError(f"labels must differ, got {labels!r}")
    return str(labels[0]), str(labels[1])


def _numpy(t: torch.Tensor) -> np.ndarray:
    return np.asarray(t.detach().cpu().numpy(), dtype=np.float64)


def _check_same_tokens(a: Rollouts, b: Rollouts) -> None:
    """Raise ValueError naming the first row where b's prompt or response ids differ from a's."""
    if len(a) != len(b):
        raise ValueError(f"a has {len(a)} rows and b {len(b)}; compare needs the same rows in the same order: "
                         f"{_NEXT_STEP}")
    ta, tb = a.tensors(), b.tensors()
    for part, what in (("response", "different response tokens"), ("prompt", "a different prompt")):
        ids_a, ids_b = ta[f"{part}_ids"].cpu(), tb[f"{part}_ids"].cpu()
        mask_a, mask_b = ta[f"{part}_mask"].cpu(), tb[f"{part}_mask"].cpu()
        differs = (mask_a.sum(1) != mask_b.sum(1)).numpy()
        if not differs.any() and ids_a.shape == ids_b.shape:
            differs = ((ids_a != ids_b) & mask_a).any(1).numpy()
        if differs.any():
            raise ValueError(f"b holds {what} in row {int(np.flatnonzero(differs)[0])}; {_NEXT_STEP}")


def _sampling_note(a: Rollouts, b: Rollouts) -> str | None:
    """Why a's and b's logprobs measure different distributions (one sampled at a temperature or
    with penalties, the other not), or None."""
    if a.sampling == b.sampling:
        return None
    for name, side in (("a", a), ("b", b)):
        reason = not_comparable_reason(side.sampling)
        if reason is not None:
            return (f"{name}'s logprobs are not those of the raw logits ({reason.removeprefix('not comparable: ')}): "
                    "the shift mixes that with the weight change; compare re-scores of the same rows under "
                    "each version instead: compare(eng.score(res), ...)")
    return None


def _row_table(tokens: dict[str, np.ndarray], mask: np.ndarray, df: pd.DataFrame) -> pd.DataFrame:
    """The per-row DataFrame of `LogprobShift.df`, on a's index."""
    import pandas as pd

    n = mask.sum(axis=1)
    has = n > 0
    d = tokens["diff"]

    def where_compared(values: np.ndarray) -> np.ndarray:
        return np.where(has, values, np.nan)

    with np.errstate(invalid="ignore", divide="ignore"):
        out = {
            "prompt_index": df["prompt_index"].to_numpy(),
            "sample_index": df["sample_index"].to_numpy(),
            "completion_tokens": df["completion_tokens"].to_numpy(),
            "tokens_compared": n.astype(np.int64),
            "diff_mean": where_compared(d.sum(axis=1) / n),
            "diff_max_abs": where_compared(np.where(mask, np.abs(d), -np.inf).max(axis=1, initial=-np.inf)),
            "ratio_min": where_compared(np.where(mask, tokens["ratio"], np.inf).min(axis=1, initial=np.inf)),
            "ratio_max": where_compared(np.where(mask, tokens["ratio"], -np.inf).max(axis=1, initial=-np.inf)),
            "k1": where_compared(tokens["k1"].sum(axis=1)),
            "k2": where_compared(tokens["k2"].sum(axis=1)),
            "k3": where_compared(tokens["k3"].sum(axis=1)),
            "k3_per_token": where_compared(tokens["k3"].sum(axis=1) / n),
        }
    return pd.DataFrame(out, index=df.index)
