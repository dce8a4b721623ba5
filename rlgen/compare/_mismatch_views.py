"""How a sampler/trainer comparison shows itself: its figure and its HTML summary.

Owns: the figure of `SamplerMismatch.plot()` (the mismatch by position in the response and by the
token's sampled probability, the histogram of log r with the TIS cap and the MIS bounds drawn in,
and by staleness when there is more than one) and the HTML summary (the headline numbers, each
with what it means, the notes, the table by sampled probability), every text escaped. Knows
nothing about models, rollouts or how the numbers were computed: it draws the tables and arrays it
is handed, with `rollouts._figures`' plumbing and `rollouts._display`'s styles.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["mismatch_figure", "summary_html"]

# The headline numbers of the HTML view, each with what it means.
_MEANINGS = (
    ("kl", "mean of lp_sampler − lp_trainer: KL(sampler‖trainer), k1 estimate (verl)"),
    ("k3_kl", "mean of (r − 1) − log r: the same KL, never negative per token (verl)"),
    ("sampling_logp_difference/mean", "mean |log r| per token (TRL)"),
    ("sampling_logp_difference/max", "largest |log r| of one token (TRL)"),
    ("chi2_token", "E[r²] − 1 per token: the variance of token IS weights (verl)"),
    ("chi2_seq", "E[(Π r)²] − 1 per sequence: the variance of sequence IS weights (verl)"),
    ("training_ppl", "mean over rows of exp(−mean trainer logprob) (verl)"),
    ("rollout_ppl", "mean over rows of exp(−mean sampler logprob) (verl)"),
    ("ppl_ratio", "mean over rows of trainer PPL / sampler PPL (verl)"),
    ("rollout_is_mean", "mean token weight r before truncation (verl)"),
    ("rollout_is_eff_sample_size", "1 / E[(w / E w)²] of the token weights clamped to [1/cap, cap]; 1 = all equal (verl)"),
    ("tis_token_clip_fraction", "share of tokens a token-level TIS clips (r > cap)"),
    ("tis_seq_clip_fraction", "share of sequences a sequence-level TIS clips (Π r > cap)"),
    ("mis_token_mask_fraction", "share of tokens a token-level MIS masks (r outside the bounds)"),
    ("mis_seq_mask_fraction", "share of sequences a sequence-level MIS masks (Π r outside the bounds)"),
)


_LEFT, _RIGHT = "style='text-align:left'", "style='text-align:right'"


def summary_html(summary: dict[str, Any], *, title: str, notes: Sequence[str], missing: int,
                 probability: pd.DataFrame) -> str:
    """The HTML view: a title, the headline numbers with their meaning, notes, and the mismatch by
    sampled probability."""
    from ..rollouts._display import VIEW_STYLE

    # Aligned inline too: JupyterLab strips <style> from outputs it did not make (right-aligning every cell).
    rows = "".join(
        f"<tr><td {_LEFT}><code>{html.escape(name)}</code></td><td class='rlgen-num' {_RIGHT}>"
        f"{_number(summary.get(name))}</td><td {_LEFT}>{html.escape(meaning)}</td></tr>" for name, meaning in _MEANINGS)
    cap, lower, upper = summary["tis_cap"], summary["mis_lower"], summary["mis_upper"]
    facts = (f"log r = lp<sub>trainer</sub> − lp<sub>sampler</sub> over {summary['tokens']} sampled tokens in "
             f"{summary['rows_compared']} of {summary['rows']} rows ({missing} missing: a logprob NaN or infinite); "
             f"TIS cap {cap:g}, MIS bounds [{lower:g}, {upper:g}].")
    warn = "".join(f'<div style="color:#c80">{html.escape(n)}</div>' for n in notes)
    head = "".join(f"<th {_LEFT}>{html.escape(c)}</th>" for c in ("p", "tokens", "mean log r", "mean |log r|", "k3",
                                                                 "TIS clips", "MIS masks"))
    body = "".join(
        f"<tr><td {_LEFT}>[{r.p_start:g}, {r.p_end:g})</td><td class='rlgen-num' {_RIGHT}>{int(r.tokens)}</td>"
        + "".join(f"<td class='rlgen-num' {_RIGHT}>{_number(getattr(r, c))}</td>" for c in (
            "log_ratio_mean", "abs_log_ratio_mean", "k3_mean", "tis_clip_fraction", "mis_mask_fraction")) + "</tr>"
        for r in probability.itertuples())
    table = (f"<div style='margin-top:6px'>by the token's sampled probability p</div>"
             f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>") if len(probability) else ""
    return (f'<div class="rlgen-rollouts" style="max-width:1000px">{VIEW_STYLE}'
            f'<div style="font-family:monospace;margin-bottom:4px">{html.escape(title)}</div>'
            f"<table><thead><tr><th {_LEFT}>metric</th><th {_LEFT}>value</th><th {_LEFT}>meaning</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
            f'<div style="color:#666;font-size:90%;margin:4px 0">{facts}</div>{warn}{table}</div>')


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{float(value):.4g}"


def mismatch_figure(*, position: pd.DataFrame, probability: pd.DataFrame, log_ratio: np.ndarray, tis_cap: float,
                    mis_bounds: tuple[float, float], staleness: pd.DataFrame | None, title: str) -> Figure:
    """The panels: by position, by sampled probability, the log r histogram with the thresholds,
    and by staleness when `staleness` has more than one level."""
    from ..rollouts._figures import panels, require_matplotlib

    require_matplotlib()
    show_staleness = staleness is not None and len(staleness) > 1
    fig, axes = panels(4 if show_staleness else 3)
    _bars(axes[0], [_span(a, b) for a, b in zip(position["position_start"], position["position_end"])],
          position, xlabel="position in the response (token)", title="by position")
    _bars(axes[1], [f"{a:g}–{b:g}" for a, b in zip(probability["p_start"], probability["p_end"])], probability,
          xlabel="sampled probability p of the token", title="by the sampler's probability")
    _histogram(axes[2], log_ratio, tis_cap=tis_cap, mis_bounds=mis_bounds)
    if show_staleness and staleness is not None:
        _bars(axes[3], [str(s) for s in staleness["staleness"]], staleness, xlabel="staleness (versions behind)",
              title="by staleness")
    fig.suptitle(title if len(title) < 120 else title.split(" | ")[0], fontsize="small")
    return fig


def _span(start: float, end: float) -> str:
    """A bin of positions as a label: "3" for [3, 4), "4–7" for [4, 8)."""
    return str(int(start)) if end - start == 1 else f"{int(start)}–{int(end) - 1}"


def _bars(ax: Axes, labels: list[str], table: pd.DataFrame, *, xlabel: str, title: str) -> None:
    """Mean |log r| per bin as bars, labelled with their token counts, and mean log r as a line."""
    from ..rollouts._figures import nothing_scored

    if not len(table):
        nothing_scored(ax)
        return
    x = np.arange(len(table))
    bars = ax.bar(x, table["abs_log_ratio_mean"].to_numpy(dtype=np.float64), color="tab:blue", alpha=0.7,
                  label="mean |log r|")
    ax.bar_label(bars, labels=[f"{int(n)}" for n in table["tokens"]], fontsize="x-small", color="0.4")
    ax.plot(x, table["log_ratio_mean"].to_numpy(dtype=np.float64), color="tab:orange", marker=".",
            label="mean log r")
    ax.axhline(0.0, color="0.5", linewidth=0.8, linestyle=":")
    ax.set_xticks(x, labels, rotation=45 if len(labels) > 6 else 0, fontsize="small")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("log r = lp trainer − lp sampler")
    ax.set_title(f"mismatch {title} (bar labels: tokens)", fontsize="small")
    ax.legend(fontsize="x-small", loc="best", framealpha=0.8)


def _histogram(ax: Axes, log_ratio: np.ndarray, *, tis_cap: float, mis_bounds: tuple[float, float]) -> None:
    """Tokens by log r, log-scaled counts, with the TIS cap and the MIS bounds as vertical lines."""
    lines = {f"TIS cap {tis_cap:g}": (math.log(tis_cap), "tab:red", "-"),
             f"MIS lower {mis_bounds[0]:g}": (math.log(mis_bounds[0]), "tab:purple", "--"),
             f"MIS upper {mis_bounds[1]:g}": (math.log(mis_bounds[1]), "tab:purple", "--")}
    ends = [v for v, _, _ in lines.values()]
    low = min([*ends, float(log_ratio.min())] if log_ratio.size else ends)
    high = max([*ends, float(log_ratio.max())] if log_ratio.size else ends)
    margin = 0.05 * (high - low)
    ax.hist(log_ratio, bins=np.linspace(low - margin, high + margin, 61).tolist(), color="tab:blue", alpha=0.7, log=True)
    for label, (value, color, style) in lines.items():
        ax.axvline(value, color=color, linestyle=style, linewidth=1.2, label=label)
    ax.set_xlabel("log r (per token)")
    ax.set_ylabel("tokens")
    ax.set_title(f"importance ratio r: {log_ratio.size} tokens", fontsize="small")
    ax.legend(fontsize="x-small", loc="best", framealpha=0.8)
