"""The sampler against the trainer as pure functions: log-ratios in, corrections and metrics out.

Owns: the per-token numbers of a sampler/trainer comparison and their aggregates, each a pure
function of [N, R] tensors (a log-ratio `log π_trainer − log π_sampler` and a bool mask of the
tokens compared): k3; the two corrections a trainer applies, truncated importance sampling
(`tis`: the weights clipped at a cap) and masked importance sampling (`mis`: the weights outside
[lower, upper] set to 0), at token or sequence level; the share of tokens and sequences each would
clip or mask; verl's off-policy and IS metrics under verl's names (`offpolicy_metrics`,
`is_metrics`) and TRL's `sampling_logp_difference`; and the binned statistics the result's tables
are made of (`bin_index`, `token_stats`). Knows nothing about models, servers or `Rollouts`: it
never sees a token id.

Conventions (verl's `rollout_corr_helper.py` and TRL's `grpo_trainer.py`, read at HEAD in 2026):
- log r = lp_trainer − lp_sampler per token, r = π_trainer / π_sampler the importance ratio.
- "sequence" is the product of a row's token ratios (exp of the sum of log r), as in verl and TRL;
  "geometric" (masked IS only) is their geometric mean (exp of the mean: verl's `seq_mean_k1`).
- Exponentials clamp log r to ±20 first (verl's SAFETY_BOUND), so no weight overflows.
- A weight past a bound is clipped (TIS) or masked (MIS) when strictly outside: r > cap, r < lower.
- Rows without a compared token count in no sequence-level number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "SAFETY_BOUND", "bin_index", "chi2_seq", "chi2_token", "eff_sample_size", "is_metrics", "k3", "mis",
    "mis_fraction", "offpolicy_metrics", "power_of_two_edges", "tis", "tis_fraction", "token_stats",
]  # fmt: skip

SAFETY_BOUND = 20.0
TisLevel = Literal["token", "sequence"]
MisLevel = Literal["token", "sequence", "geometric"]


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 = (r − 1) − log r per token, never negative; as expm1(log r) − log r, which
    keeps its precision when r is near 1 (verl's `k3_kl` is its masked mean)."""
    import torch

    return torch.expm1(log_ratio) - log_ratio


def _row_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """Each row's log weight at `level`, as an [N, 1] column: the sum (sequence) or the mean
    (geometric) of its masked log-ratios; the tokens themselves at "token"."""
    masked = log_ratio.masked_fill(~mask, 0.0)
    if level == "token":
        return masked
    if level == "sequence":
        return masked.sum(-1, keepdim=True)
    if level == "geometric":
        return masked.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    raise ValueError(f"level must be 'token', 'sequence' or 'geometric', got {level!r}")


def _check_level(level: str, allowed: Sequence[str]) -> None:
    if level not in allowed:
        raise ValueError(f"level must be one of {', '.join(map(repr, allowed))}, got {level!r}")


def tis(log_ratio: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0, level: TisLevel = "token") -> torch.Tensor:
    """Truncated importance sampling: the weights min(r, cap), 0.0 where `mask` is False.

    `level="token"` weighs each token by its own ratio; `"sequence"` gives every token of a row
    the row's product of ratios (verl's `rollout_is="sequence"`, TRL's `sequence_truncate`).
    verl's default cap is 2.0 (`rollout_is_threshold`), TRL's 3.0 (`vllm_importance_sampling_clip_max`).
    """
    import torch

    _check_level(level, ("token", "sequence"))
    _check_cap(cap)
    weights = _safe_exp(_row_log_ratio(log_ratio, mask, level))
    return torch.where(mask, weights.expand_as(log_ratio), 0.0).clamp(max=cap)


def mis(log_ratio: torch.Tensor, mask: torch.Tensor, *, lower: float = 0.5, upper: float = 2.0,
        level: MisLevel = "token") -> torch.Tensor:
    """Masked importance sampling: the weights r where lower <= r <= upper, 0.0 outside and where
    `mask` is False (TRL's `*_mask` modes; verl's rejection sampling drops the same tokens).

    `level`: "token" (each token's ratio), "sequence" (the row's product of ratios: verl's
    Seq-MIS preset uses [0.5, 2.0]), or "geometric" (their geometric mean: verl's `seq_mean_k1`).
    """
    import torch

    _check_level(level, ("token", "sequence", "geometric"))
    _check_bounds(lower, upper)
    row = _row_log_ratio(log_ratio, mask, level)
    weights = _safe_exp(row).expand_as(log_ratio)
    inside = (row >= math.log(lower)) & (row <= math.log(upper))
    return torch.where(mask & inside.expand_as(mask), weights, 0.0)


def tis_fraction(log_ratio: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0,
                 level: TisLevel = "token") -> float:
    """The share of tokens (level "token") or of rows with a compared token ("sequence") whose
    weight TIS clips: r > cap. NaN when there is none to count."""
    _check_level(level, ("token", "sequence"))
    _check_cap(cap)
    row = _row_log_ratio(log_ratio, mask, level)
    return _share(row > math.log(cap), mask, level)


def mis_fraction(log_ratio: torch.Tensor, mask: torch.Tensor, *, lower: float = 0.5, upper: float = 2.0,
                 level: MisLevel = "token") -> float:
    """The share of tokens ("token") or of rows with a compared token ("sequence", "geometric")
    that MIS masks: r < lower or r > upper. NaN when there is none to count."""
    _check_level(level, ("token", "sequence", "geometric"))
    _check_bounds(lower, upper)
    row = _row_log_ratio(log_ratio, mask, level)
    return _share((row < math.log(lower)) | (row > math.log(upper)), mask, level)


def _share(hit: torch.Tensor, mask: torch.Tensor, level: str) -> float:
    if level == "token":
        n = int(mask.sum())
        return float((hit & mask).sum()) / n if n else math.nan
    rows = mask.any(-1)
    n = int(rows.sum())
    return float((hit.squeeze(-1) & rows).sum()) / n if n else math.nan


def _check_cap(cap: float) -> None:
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"cap must be a number > 0, e.g. 2.0 (verl) or 3.0 (TRL), got {cap!r}")


def _check_bounds(lower: float, upper: float) -> None:
    for value in (lower, upper):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"MIS bounds must be numbers > 0, e.g. (0.5, 2.0), got {(lower, upper)!r}")
    if not lower < upper:
        raise ValueError(f"MIS bounds must be lower < upper, e.g. (0.5, 2.0), got {(lower, upper)!r}")


# -- verl's and TRL's metrics ----------------------------------------------------------------------

def _safe_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(log r) with log r clamped to ±SAFETY_BOUND first, as verl does."""
    return log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()


def chi2_token(log_ratio: torch.Tensor, mask: torch.Tensor) -> float:
    """χ² divergence per token, E[r²] − 1 over the compared tokens (verl's `chi2_token`)."""
    r = _safe_exp(log_ratio[mask])
    return float((r * r).mean() - 1.0) if r.numel() else math.nan


def chi2_seq(log_ratio: torch.Tensor, mask: torch.Tensor) -> float:
    """χ² divergence per sequence, E[(Π r)²] − 1 over rows with a compared token (verl's `chi2_seq`)."""
    total = _row_log_ratio(log_ratio, mask, "sequence").squeeze(-1)[mask.any(-1)]
    return float((2.0 * total.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp().mean() - 1.0) if total.numel() else math.nan


def eff_sample_size(log_ratio: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0) -> float:
    """verl's `rollout_is_eff_sample_size` at token level: the token weights clamped to
    [1/cap, cap], w̃ = w / mean(w), ESS = 1 / mean(w̃²), a share in (0, 1] (1: all weights equal)."""
    _check_cap(cap)
    w = _safe_exp(log_ratio[mask]).clamp(1.0 / cap, cap)
    if not w.numel():
        return math.nan
    normalized = w / w.mean()
    return float(1.0 / (normalized * normalized).mean())


def offpolicy_metrics(trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """verl's `compute_offpolicy_metrics`, under its names, from [N, R] logprobs of the trainer and
    the sampler over the tokens in `mask`: kl (mean of sampler − trainer: KL(sampler‖trainer)),
    k3_kl, training_ppl / rollout_ppl (the mean over rows of each row's exp(−mean logprob)),
    training_log_ppl / rollout_log_ppl, log_ppl_diff (mean over rows of the row's mean sampler
    logprob minus its mean trainer logprob) with log_ppl_abs_diff, log_ppl_diff_max and _min,
    ppl_ratio (mean over rows of exp(log_ppl_diff): trainer PPL over sampler PPL), chi2_token,
    chi2_seq. Every value is NaN when no token is compared."""
    import torch

    names = ("kl", "k3_kl", "training_ppl", "training_log_ppl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff",
             "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq")
    if not bool(mask.any()):
        return dict.fromkeys(names, math.nan)
    log_ratio = torch.where(mask, trainer - sampler, 0.0)
    rows = mask.any(-1)
    count = mask.sum(-1)[rows]
    mean_train = torch.where(mask, trainer, 0.0).sum(-1)[rows] / count
    mean_roll = torch.where(mask, sampler, 0.0).sum(-1)[rows] / count
    diff = mean_roll - mean_train
    return {
        "kl": float((sampler - trainer)[mask].mean()),
        "k3_kl": float(k3(log_ratio)[mask].mean()),
        "training_ppl": float(torch.exp(-mean_train).mean()),
        "training_log_ppl": float((-mean_train).mean()),
        "rollout_ppl": float(torch.exp(-mean_roll).mean()),
        "rollout_log_ppl": float((-mean_roll).mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "log_ppl_diff_max": float(diff.max()),
        "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(torch.exp(diff).mean()),
        "chi2_token": chi2_token(log_ratio, mask),
        "chi2_seq": chi2_seq(log_ratio, mask),
    }


def is_metrics(log_ratio: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0) -> dict[str, float]:
    """verl's token-level `compute_is_metrics` under its names (the weights before truncation):
    rollout_is_mean, _std (of the weights clamped to [1/cap, cap]), _min, _max, _eff_sample_size,
    _ratio_fraction_high (r > cap), _ratio_fraction_low (r < 1/cap); and TRL's
    sampling_logp_difference/mean and /max (of |log r|). NaN when no token is compared."""
    _check_cap(cap)
    names = ("rollout_is_mean", "rollout_is_std", "rollout_is_min", "rollout_is_max", "rollout_is_eff_sample_size",
             "rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low", "sampling_logp_difference/mean",
             "sampling_logp_difference/max")
    lr = log_ratio[mask]
    if not lr.numel():
        return dict.fromkeys(names, math.nan)
    w = _safe_exp(lr)
    clamped = w.clamp(1.0 / cap, cap)
    variance = (clamped * clamped).mean() - clamped.mean() ** 2
    return {
        "rollout_is_mean": float(w.mean()),
        "rollout_is_std": float(variance.clamp(min=0.0).sqrt()) if lr.numel() > 1 else 0.0,
        "rollout_is_min": float(w.min()),
        "rollout_is_max": float(w.max()),
        "rollout_is_eff_sample_size": eff_sample_size(log_ratio, mask, cap=cap),
        "rollout_is_ratio_fraction_high": float((w > cap).double().mean()),
        "rollout_is_ratio_fraction_low": float((w < 1.0 / cap).double().mean()),
        "sampling_logp_difference/mean": float(lr.abs().mean()),
        "sampling_logp_difference/max": float(lr.abs().max()),
    }


# -- binned statistics -----------------------------------------------------------------------------

def power_of_two_edges(start: int, stop: int) -> list[int]:
    """Bin edges start, then powers of two above it, up to the first edge past `stop`:
    (0, 10) -> [0, 1, 2, 4, 8, 16]; (1, 10) -> [1, 2, 4, 8, 16]. Early positions get narrow bins."""
    edges = [start]
    edge = 1
    while edges[-1] <= stop:
        edge = max(edge, start + 1)
        edges.append(edge)
        edge *= 2
    return edges


def bin_index(values: np.ndarray, edges: Sequence[float], *, closed_last: bool = False) -> np.ndarray:
    """Each value's bin: i where edges[i] <= value < edges[i + 1]; -1 outside [edges[0], edges[-1])
    (with `closed_last`, edges[-1] itself falls in the last bin)."""
    e = np.asarray(edges, dtype=np.float64)
    if e.ndim != 1 or e.size < 2 or not np.all(np.diff(e) > 0):
        raise ValueError(f"bin edges must be at least two increasing numbers, got {list(edges)!r}")
    index = np.searchsorted(e, values, side="right") - 1
    if closed_last:
        index = np.where(values == e[-1], e.size - 2, index)
    return np.where((index >= 0) & (index < e.size - 1), index, -1)


def token_stats(groups: np.ndarray, log_ratio: np.ndarray, n: int, *, cap: float, lower: float,
                upper: float) -> dict[str, np.ndarray]:
    """Per group 0..n-1 of compared tokens (`groups[i]` the group of token i; -1: in none):
    tokens, log_ratio_mean, abs_log_ratio_mean, k3_mean, ratio_mean, chi2_token,
    tis_clip_fraction (r > cap) and mis_mask_fraction (r outside [lower, upper]); NaN for a group
    without tokens. Flat float64 arrays in, one array per statistic out."""
    keep = groups >= 0
    g, lr = groups[keep], log_ratio[keep]
    count = np.bincount(g, minlength=n).astype(np.int64)
    ratio = np.exp(np.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))

    def mean(values: np.ndarray) -> np.ndarray:
        sums = np.bincount(g, weights=values.astype(np.float64), minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, sums / np.maximum(count, 1), np.nan)

    return {
        "tokens": count,
        "log_ratio_mean": mean(lr),
        "abs_log_ratio_mean": mean(np.abs(lr)),
        "k3_mean": mean(np.expm1(lr) - lr),
        "ratio_mean": mean(ratio),
        "chi2_token": mean(ratio * ratio) - 1.0,
        "tis_clip_fraction": mean(lr > math.log(cap)),
        "mis_mask_fraction": mean((lr < math.log(lower)) | (lr > math.log(upper))),
    }
