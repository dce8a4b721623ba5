"""rlgen.compare._logprobs's verdict: which sampling parameters make sampled logprobs not comparable with a
re-score, and what a `LogprobCheck` says (no server)."""

from __future__ import annotations

import math

import pytest
import torch

from rlgen.compare._logprobs import check_verdict, compare_logprobs, not_comparable_reason

DIFFS = {"max_abs_diff": 2e-5, "mean_abs_diff": 3e-6, "n_tokens": 40, "first_token_max_abs_diff": 1e-5, "n_missing": 0}


@pytest.mark.parametrize("sampling", [
    None, {}, {"temperature": 1.0}, {"temperature": 0.0}, {"temperature": 0.3, "top_k": 1},
    {"temperature": 1.0, "top_p": 0.9, "top_k": 20, "min_p": 0.1}, {"score": True},
])  # fmt: skip
def test_temperature_1_greedy_and_top_p_or_top_k_filtering_are_comparable(sampling) -> None:
    assert not_comparable_reason(sampling) is None


def test_another_temperature_or_a_penalty_is_not_comparable_and_says_why() -> None:
    assert not_comparable_reason({"temperature": 0.3}) == (
        "not comparable: sampled at temperature 0.3; re-score compares raw logits")
    assert "frequency_penalty=0.5" in str(not_comparable_reason({"frequency_penalty": 0.5}))
    assert "repetition_penalty=1.2" in str(not_comparable_reason({"repetition_penalty": 1.2}))
    assert "logit_bias" in str(not_comparable_reason({"logit_bias": {"3": 1.0}}))


def test_a_check_within_its_bounds_passes_and_says_what_it_cannot_tell() -> None:
    check = check_verdict(DIFFS, reason=None, max_diff=1e-3, mean_diff=1e-4)
    assert check.passed is True and check.aligned is True and check.weights_match is True
    assert repr(check) == ("<LogprobCheck passed: aligned (0 of 40 tokens off by more than 0.001 (max |diff| 2e-05)); "
                           "mean |diff| 3e-06 (noise bound 0.0001): weights that differ by less than the noise "
                           "cannot be told apart>")
    assert "passed" in check._repr_html_()


def test_misaligned_tokens_and_slightly_different_weights_are_told_apart() -> None:
    # Off by one: most tokens are off by nats.
    shifted = check_verdict({**DIFFS, "max_abs_diff": 6.2, "mean_abs_diff": 2.5, "n_off": 31}, reason=None,
                            max_diff=1.0, mean_diff=0.05)
    assert shifted.passed is False and shifted.aligned is False
    assert shifted.verdict.startswith("FAILED: not aligned: 31 of 40 tokens off by more than 1")
    # Stale weights: every token a little off, none by a nat.
    stale = check_verdict({**DIFFS, "max_abs_diff": 0.6, "mean_abs_diff": 0.2, "n_off": 0}, reason=None,
                          max_diff=1.0, mean_diff=0.05)
    assert stale.passed is False and stale.aligned is True and stale.weights_match is False
    assert "aligned" in stale.verdict and "weights that sampled differ" in stale.verdict
    # bf16 rounding on a long rollout: a few single tokens past 1 nat are still aligned (<= 1%).
    long = check_verdict({**DIFFS, "n_tokens": 4000, "max_abs_diff": 1.3, "mean_abs_diff": 0.02, "n_off": 3},
                         reason=None, max_diff=1.0, mean_diff=0.05)
    assert long.passed is True and long.aligned is True
    assert "FAILED" in shifted._repr_html_()


def test_compare_logprobs_counts_the_tokens_off_by_more_than_a_threshold() -> None:
    a = torch.tensor([[0.0, -1.0, -2.0], [-0.5, -0.5, 0.0]])
    b = torch.tensor([[0.0, -1.2, -4.0], [-0.5, -3.5, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    out = compare_logprobs(a, b, mask=mask, off_by=1.0)
    assert out["n_off"] == 2 and out["n_tokens"] == 5


def test_a_check_that_is_not_comparable_has_no_verdict_and_nan_numbers() -> None:
    reason = not_comparable_reason({"temperature": 0.3})
    check = check_verdict(None, reason=reason, max_diff=1e-3, mean_diff=1e-4)
    assert check.passed is None and check.verdict == reason and math.isnan(check.max_abs_diff)
    assert "<" not in str(reason) and "not comparable" in check._repr_html_()
