"""rlgen.compare._logprobs's verdict: which sampling parameters make sampled logprobs not comparable with a
re-score, and what a `LogprobCheck` says (no server)."""

from __future__ import annotations

import math

import pytest

from rlgen.compare._logprobs import check_verdict, not_comparable_reason

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


def test_a_check_within_its_bounds_passes_and_shows_the_numbers_with_the_bounds() -> None:
    check = check_verdict(DIFFS, reason=None, max_diff=1e-3, mean_diff=1e-4)
    assert check.passed is True
    assert repr(check) == ("<LogprobCheck passed: max |diff| 2e-05 (bound 0.001), "
                           "mean 3e-06 (bound 0.0001) over 40 tokens>")
    assert "passed" in check._repr_html_()


def test_a_check_over_either_bound_fails_and_says_what_it_means() -> None:
    over_max = check_verdict({**DIFFS, "max_abs_diff": 1.49}, reason=None, max_diff=1e-3, mean_diff=1e-4)
    over_mean = check_verdict({**DIFFS, "mean_abs_diff": 0.2}, reason=None, max_diff=1.0, mean_diff=0.05)
    assert over_max.passed is False and over_mean.passed is False
    assert over_max.verdict.startswith("FAILED: max |diff| 1.49 (bound 0.001)")
    assert "FAILED" in over_max._repr_html_()


def test_a_check_that_is_not_comparable_has_no_verdict_and_nan_numbers() -> None:
    reason = not_comparable_reason({"temperature": 0.3})
    check = check_verdict(None, reason=reason, max_diff=1e-3, mean_diff=1e-4)
    assert check.passed is None and check.verdict == reason and math.isnan(check.max_abs_diff)
    assert "<" not in str(reason) and "not comparable" in check._repr_html_()
