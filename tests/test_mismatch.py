"""rlgen.compare._mismatch_metrics: the sampler against the trainer as pure functions on tensors (k3,
TIS, MIS, their clip shares, verl's chi2 / ESS / off-policy metrics, the bins), hand-computed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from rlgen.compare._mismatch_metrics import (
    bin_index,
    chi2_seq,
    chi2_token,
    eff_sample_size,
    is_metrics,
    k3,
    mis,
    mis_fraction,
    offpolicy_metrics,
    power_of_two_edges,
    tis,
    tis_fraction,
)

torch = pytest.importorskip("torch")

LN = math.log


def tensor(x: Any) -> Any:
    return x.detach().double() if isinstance(x, torch.Tensor) else torch.tensor(np.asarray(x, dtype=np.float64))


def close(actual: Any, expected: Any, tol: float = 1e-9) -> bool:
    a, e = tensor(actual), tensor(expected)
    return bool(a.shape == e.shape and torch.allclose(a, e, rtol=tol, atol=tol))


# -- the corrections and metrics on hand-computed tensors --------------------------------------------
# Row 0: ratios 3, 1/4 and a padded position holding a huge log ratio that must never count;
# row 1: ratio 1.5; row 2: no compared token at all.
LR = torch.tensor([[LN(3.0), LN(0.25), 50.0], [LN(1.5), -50.0, 0.0], [7.0, 0.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])


def test_k3_is_r_minus_1_minus_log_r_and_never_negative() -> None:
    assert close(k3(LR[0, :2]), [3 - 1 - LN(3), 0.25 - 1 - LN(0.25)])
    tiny = torch.tensor([1e-9, -1e-9], dtype=torch.float64)
    assert close(k3(tiny), [0.5e-18, 0.5e-18], tol=1e-24) and bool((k3(torch.linspace(-5, 5, 101)) >= 0).all())


def test_tis_truncates_token_and_sequence_weights_at_the_cap_and_is_0_on_padding() -> None:
    assert close(tis(LR, MASK, cap=2.0), [[2.0, 0.25, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # sequence: the product of the row's ratios (3 x 1/4 = 0.75), on every token of the row
    assert close(tis(LR, MASK, cap=2.0, level="sequence"), [[0.75, 0.75, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert close(tis(LR, MASK, cap=1.2, level="sequence"), [[0.75, 0.75, 0.0], [1.2, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_mis_keeps_weights_inside_the_bounds_and_masks_the_rest_to_0() -> None:
    assert close(mis(LR, MASK, lower=0.5, upper=2.0), [[0.0, 0.0, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert close(mis(LR, MASK, level="sequence"), [[0.75, 0.75, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    geo = math.sqrt(0.75)  # the geometric mean of 3 and 1/4
    assert close(mis(LR, MASK, lower=0.9, upper=1.1, level="geometric"), [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0] * 3])
    assert close(mis(LR, MASK, lower=0.8, upper=1.6, level="geometric"), [[geo, geo, 0.0], [1.5, 0.0, 0.0], [0.0] * 3])
    with pytest.raises(ValueError, match="lower < upper"):
        mis(LR, MASK, lower=2.0, upper=0.5)
    with pytest.raises(ValueError, match="level must be one of 'token', 'sequence'"):
        tis(LR, MASK, level="geometric")  # type: ignore[arg-type]


def test_clip_and_mask_shares_count_compared_tokens_and_rows_only() -> None:
    assert tis_fraction(LR, MASK, cap=2.0) == pytest.approx(1 / 3)        # the 3 of (3, 1/4, 1.5)
    assert tis_fraction(LR, MASK, cap=1.2, level="sequence") == pytest.approx(1 / 2)  # 1.5 of (0.75, 1.5)
    assert mis_fraction(LR, MASK) == pytest.approx(2 / 3)                 # 3 and 1/4 outside [0.5, 2]
    assert mis_fraction(LR, MASK, level="sequence") == 0.0
    empty = torch.zeros_like(MASK)
    assert math.isnan(tis_fraction(LR, empty)) and math.isnan(mis_fraction(LR, empty, level="sequence"))


def test_chi2_and_the_effective_sample_size_follow_verls_formulas() -> None:
    assert chi2_token(LR, MASK) == pytest.approx((9 + 1 / 16 + 2.25) / 3 - 1)
    assert chi2_seq(LR, MASK) == pytest.approx((0.75**2 + 1.5**2) / 2 - 1)
    w = np.array([2.0, 0.5, 1.5])  # the token weights clamped to [1/2, 2]
    assert eff_sample_size(LR, MASK, cap=2.0) == pytest.approx(1 / np.mean((w / w.mean()) ** 2))
    same = torch.zeros_like(LR)
    assert eff_sample_size(same, MASK) == pytest.approx(1.0) and chi2_token(same, MASK) == 0.0


def test_offpolicy_and_is_metrics_use_verls_and_trls_names_and_definitions() -> None:
    trainer = torch.tensor([[-1.0, -2.0, 9.0], [-0.5, 9.0, 9.0]], dtype=torch.float64)
    sampler = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    m = offpolicy_metrics(trainer, sampler, mask)
    lr = np.array([0.5, -1.0, 0.0])  # trainer - sampler, compared tokens only
    assert m["kl"] == pytest.approx(-lr.mean())
    assert m["k3_kl"] == pytest.approx(np.mean(np.exp(lr) - 1 - lr))
    assert m["training_ppl"] == pytest.approx((math.exp(1.5) + math.exp(0.5)) / 2)  # rows' mean lp: -1.5, -0.5
    assert m["rollout_ppl"] == pytest.approx((math.exp(1.25) + math.exp(0.5)) / 2)  # rows' mean lp: -1.25, -0.5
    assert m["log_ppl_diff"] == pytest.approx((0.25 + 0.0) / 2)  # per row: mean sampler - mean trainer
    assert m["log_ppl_diff_max"] == pytest.approx(0.25) and m["log_ppl_diff_min"] == 0.0
    assert m["ppl_ratio"] == pytest.approx((math.exp(0.25) + 1.0) / 2)
    assert m["chi2_seq"] == pytest.approx((math.exp(-1.0) + 1.0) / 2 - 1)
    i = is_metrics(torch.where(mask, trainer - sampler, 0.0), mask, cap=2.0)
    assert i["sampling_logp_difference/mean"] == pytest.approx(0.5)
    assert i["sampling_logp_difference/max"] == pytest.approx(1.0)
    assert i["rollout_is_max"] == pytest.approx(math.exp(0.5)) and i["rollout_is_min"] == pytest.approx(math.exp(-1))
    assert i["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3) and i["rollout_is_ratio_fraction_high"] == 0.0
    assert all(math.isnan(v) for v in offpolicy_metrics(trainer, sampler, torch.zeros_like(mask)).values())


def test_bins_put_each_value_in_one_half_open_bin() -> None:
    assert power_of_two_edges(0, 10) == [0, 1, 2, 4, 8, 16] and power_of_two_edges(1, 10) == [1, 2, 4, 8, 16]
    assert power_of_two_edges(0, 0) == [0, 1]
    positions = np.array([0, 1, 2, 3, 4, 7, 8, 15, 16])
    assert bin_index(positions, [0, 1, 2, 4, 8, 16]).tolist() == [0, 1, 2, 2, 3, 3, 4, 4, -1]
    p = np.array([0.0, 0.0005, 0.5, 0.99, 1.0])
    assert bin_index(p, [0, 0.001, 0.5, 1.0], closed_last=True).tolist() == [0, 0, 2, 2, 2]
    with pytest.raises(ValueError, match="increasing"):
        bin_index(p, [0.5, 0.1])
