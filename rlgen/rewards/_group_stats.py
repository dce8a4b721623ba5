"""Group statistics of rewards: advantages (GRPO, Dr.GRPO, RLOO, batch-normalised) and pass@k.

Owns: the arithmetic of rewards within groups (the n samples of one prompt), stated once with its
conventions, over plain numpy arrays: group means and standard deviations, the zero-variance flag,
the advantage estimators and the unbiased pass@k estimator. Knows nothing about reward functions,
DataFrames or Rollouts: callers pass one reward per row and one group id per row.

Conventions (TRL's GRPOTrainer defaults, so numbers match what a TRL run would log):
- A group's std is the sample standard deviation (Bessel-corrected, ddof=1) of its finite rewards;
  eps = 1e-4 is added to it before dividing.
- Rewards that are NaN (the reward function failed, timed out or returned None) are left out of
  their group's mean and std, and their own advantage is NaN: nothing is invented for them.
- A group with fewer than two finite rewards has std NaN and advantage 0 for its finite rows: with
  one sample there is nothing to compare against.
- A group's std counts as zero (`zero_std`) when its finite rewards are all equal or their std is
  within TRL's tolerance of 0 (`torch.isclose(std, 0)`: std <= 1e-8): floating point gives a
  constant group of 0.1 a std of ~1e-17, not 0. Every row of such a group gets advantage exactly 0,
  under every estimator (each one centres on the group mean, so 0 is their value for a constant
  group), where arithmetic would leave ~1e-12.

Unlike TRL, a NaN reward is not summed as 0 into its group: TRL `nansum`s the reward functions'
outputs, so a row whose every function failed scores 0 and counts in the mean and std.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["ADVANTAGE_METHODS", "DEFAULT_EPS", "GroupArrays", "advantages", "group_arrays", "pass_at_k"]

AdvantageMethod = Literal["grpo", "drgrpo", "rloo", "batch"]
ADVANTAGE_METHODS: tuple[str, ...] = ("grpo", "drgrpo", "rloo", "batch")
DEFAULT_EPS = 1e-4
# TRL's zero-std test, torch.isclose(std, 0) with its defaults: |std| <= atol + rtol * 0 = 1e-8.
ZERO_STD_ATOL = 1e-8


@dataclass(frozen=True)
class GroupArrays:
    """Per-row statistics of the row's group (one value per row, aligned with the rewards)."""

    mean: np.ndarray      # float64: mean of the group's finite rewards (NaN if it has none)
    std: np.ndarray       # float64: their sample std, ddof=1 (NaN below two finite rewards)
    count: np.ndarray     # int64: finite rewards in the group
    zero_std: np.ndarray  # bool: two or more finite rewards, all equal or std <= 1e-8 (no learning signal)


def _check(rewards: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r = np.asarray(rewards, dtype=np.float64)
    g = np.asarray(groups)
    if r.ndim != 1 or g.shape != r.shape:
        raise ValueError(f"rewards and groups must be 1-D and of one length, got {r.shape} and {g.shape}")
    _, inverse = np.unique(g, return_inverse=True)
    return r, inverse.reshape(-1)


def group_arrays(rewards: np.ndarray | Sequence[float], groups: np.ndarray | Sequence[object]) -> GroupArrays:
    """Each row's group mean, std, count of finite rewards and zero-variance flag."""
    r, gid = _check(np.asarray(rewards), np.asarray(groups))
    finite = np.isfinite(r)
    n_groups = int(gid.max()) + 1 if len(gid) else 0
    count = np.bincount(gid, weights=finite, minlength=n_groups)
    total = np.bincount(gid, weights=np.where(finite, r, 0.0), minlength=n_groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
        dev = np.where(finite, r - mean[gid], 0.0)
        sq = np.bincount(gid, weights=dev * dev, minlength=n_groups)
        std = np.sqrt(sq / (count - 1))
    std[count < 2] = np.nan
    # All equal (max == min, exact at any magnitude) or TRL's tolerance on the std.
    high = np.full(n_groups, -np.inf)
    low = np.full(n_groups, np.inf)
    np.maximum.at(high, gid[finite], r[finite])
    np.minimum.at(low, gid[finite], r[finite])
    zero = (count >= 2) & ((high == low) | (std <= ZERO_STD_ATOL))
    return GroupArrays(mean=mean[gid], std=std[gid], count=count[gid].astype(np.int64), zero_std=zero[gid])


def advantages(
    rewards: np.ndarray | Sequence[float],
    groups: np.ndarray | Sequence[object],
    *,
    method: AdvantageMethod = "grpo",
    eps: float = DEFAULT_EPS,
) -> np.ndarray:
    """One advantage per row (float64), NaN where the row's own reward is NaN.

    - "grpo": (r - group mean) / (group std + eps)  (GRPO; TRL `scale_rewards="group"`)
    - "drgrpo": r - group mean  (Dr. GRPO; TRL `scale_rewards="none"`)
    - "rloo": r - mean of the group's other rewards = n / (n - 1) (r - group mean)  (RLOO)
    - "batch": (r - group mean) / (std of all finite rewards + eps)  (TRL `scale_rewards="batch"`)

    A group flagged `zero_std` (all rewards equal, or std <= 1e-8 as TRL's `torch.isclose`) gets
    exactly 0 under every method.

    "drgrpo" is Dr. GRPO's advantage only. Dr. GRPO also changes the loss: it drops GRPO's
    per-sequence 1/|o| length normalisation and divides the summed token losses by a constant (e.g.
    the generation budget), which is the loss's business, not the advantage's. Notebooks 03 and 04
    divide by the batch's token count instead (a token-mean over the batch, DAPO style), so they
    are neither GRPO's per-sequence mean nor Dr. GRPO's constant.
    """
    if method not in ADVANTAGE_METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, ADVANTAGE_METHODS))}, got {method!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    r = np.asarray(rewards, dtype=np.float64)
    stats = group_arrays(r, groups)
    centred = np.where(stats.zero_std, 0.0, r - stats.mean)  # exactly 0 for a constant group
    single = stats.count < 2
    with np.errstate(invalid="ignore", divide="ignore"):
        if method == "grpo":
            out = centred / (stats.std + eps)
        elif method == "drgrpo":
            out = centred
        elif method == "rloo":
            out = centred * stats.count / (stats.count - 1)
        else:
            finite = r[np.isfinite(r)]
            batch_std = float(np.std(finite, ddof=1)) if finite.size >= 2 else np.nan
            out = centred / (batch_std + eps)
    out = np.where(single & np.isfinite(r), 0.0, out)
    return np.where(np.isfinite(r), out, np.nan)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate for `c` correct among `n` samples (Chen et al., 2021):
    1 - C(n - c, k) / C(n, k), computed as a stable product; 1.0 when n - c < k; NaN when k > n."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if c > n:
        raise ValueError(f"c ({c}) must not exceed n ({n})")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        return float("nan")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))
