"""rlgen.rewards._group_stats: advantages and pass@k, checked against their definitions written out plainly."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rlgen.rewards._group_stats import advantages, group_arrays, pass_at_k

REWARDS = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 2.0, np.nan, 0.0, 1.0])
GROUPS = np.repeat([0, 1, 2], 4)


def reference(method: str, eps: float = 1e-4) -> np.ndarray:
    df = pd.DataFrame({"r": REWARDS, "g": GROUPS})
    mean = df.groupby("g").r.transform("mean")  # pandas skips NaN
    std = df.groupby("g").r.transform(lambda s: s.std(ddof=1))
    n = df.groupby("g").r.transform("count")
    if method == "grpo":
        return ((df.r - mean) / (std + eps)).to_numpy()
    if method == "drgrpo":
        return (df.r - mean).to_numpy()
    if method == "rloo":
        others = (df.groupby("g").r.transform("sum") - df.r) / (n - 1)
        return (df.r - others).to_numpy()
    return ((df.r - mean) / (np.nanstd(REWARDS, ddof=1) + eps)).to_numpy()


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "rloo", "batch"])
def test_each_advantage_matches_its_definition_and_a_failed_reward_stays_nan(method: str) -> None:
    got = advantages(REWARDS, GROUPS, method=method)
    np.testing.assert_allclose(got, reference(method), rtol=1e-12, equal_nan=True)
    assert math.isnan(got[9]) and np.isfinite(np.delete(got, 9)).all()


def test_a_zero_variance_group_gets_zero_advantage_and_is_flagged() -> None:
    stats = group_arrays(REWARDS, GROUPS)
    assert stats.zero_std.tolist() == [False] * 4 + [True] * 4 + [False] * 4
    assert (advantages(REWARDS, GROUPS)[4:8] == 0).all()
    assert stats.count.tolist() == [4] * 8 + [3] * 4


def test_a_group_with_one_finite_reward_has_no_std_and_advantage_zero() -> None:
    stats = group_arrays([1.0, np.nan, 3.0], [0, 0, 1])
    assert math.isnan(stats.std[0]) and math.isnan(stats.std[2]) and not stats.zero_std.any()
    assert advantages([1.0, np.nan, 3.0], [0, 0, 1]).tolist()[::2] == [0.0, 0.0]


def test_groups_may_be_any_labels_in_any_order() -> None:
    shuffled = np.random.default_rng(0).permutation(len(REWARDS))
    labels = np.array(["a", "b", "c"])[GROUPS]
    np.testing.assert_allclose(advantages(REWARDS[shuffled], labels[shuffled]), reference("grpo")[shuffled],
                               equal_nan=True)


@pytest.mark.parametrize("n, c, k", [(8, 3, 1), (8, 3, 4), (10, 0, 5), (16, 15, 2), (5, 5, 5), (20, 7, 8)])
def test_pass_at_k_is_one_minus_the_chance_that_k_draws_miss_every_correct_sample(n: int, c: int, k: int) -> None:
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12)


def test_pass_at_k_is_nan_when_k_exceeds_the_samples_and_refuses_impossible_counts() -> None:
    assert math.isnan(pass_at_k(4, 1, 8))
    with pytest.raises(ValueError, match="must not exceed n"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_at_k(4, 1, 0)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="method must be one of"):
        advantages(REWARDS, GROUPS, method="ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one length"):
        advantages(REWARDS, GROUPS[:-1])


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "rloo", "batch"])
def test_constant_groups_of_any_two_decimal_reward_are_flagged_and_get_advantage_exactly_zero(method: str) -> None:
    # [0.1] * 8 has a floating-point std of ~1e-17, not 0: an exact `std == 0` test misses such groups
    # and hands their rows advantages of ~1e-12 instead of 0.
    rng = np.random.default_rng(2024)
    values = np.round(rng.uniform(-1.0, 2.0, size=2000), 2)
    rewards = np.repeat(values, 8)
    groups = np.repeat(np.arange(2000), 8)
    stats = group_arrays(rewards, groups)
    assert stats.zero_std.all(), f"{(~stats.zero_std).sum() // 8} of 2000 constant groups not flagged"
    got = advantages(rewards, groups, method=method)
    assert (got == 0).all(), f"largest |advantage| of a constant group: {np.abs(got).max():.3g}"


def test_the_zero_std_flag_has_trl_tolerance_and_stays_off_for_a_real_spread() -> None:
    # TRL flags torch.isclose(std, 0): |std| <= 1e-8. A spread just above that is a real (tiny) signal.
    tiny = group_arrays([0.5, 0.5 + 1e-9, 0.5], [0, 0, 0])
    small = group_arrays([0.5, 0.5 + 1e-7, 0.5], [0, 0, 0])
    assert tiny.zero_std.all() and not small.zero_std.any()
    assert (advantages([0.5, 0.5 + 1e-9, 0.5], [0, 0, 0]) == 0).all()
    assert (advantages([0.5, 0.5 + 1e-7, 0.5], [0, 0, 0], method="drgrpo") != 0).any()
    # a constant group of large rewards (std from rounding above 1e-8) is still constant
    big = np.full(8, 1e9 + 0.3)
    assert group_arrays(big, np.zeros(8)).zero_std.all() and (advantages(big, np.zeros(8)) == 0).all()
