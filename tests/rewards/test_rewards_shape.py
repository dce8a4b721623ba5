"""rlgen.rewards think_format and soft_overlong_penalty: TRL's formulas, row by row."""

from __future__ import annotations

import pytest

from rlgen.rewards import soft_overlong_penalty, think_format


@pytest.mark.parametrize("completion", [
    "<think>\nreasoning\n</think>\nanswer",
    "<think></think>",
    "<think>a</think> b </think> c",                 # a second closing tag is fine
    "<think>line1\nline2</think>",
])
def test_think_format_accepts_one_leading_think_block(completion) -> None:
    assert think_format(completion) == 1.0


@pytest.mark.parametrize("completion", [
    "<think>\nreasoning without the close",
    " <think>x</think>",                             # must start at the very beginning
    "answer first <think>x</think>",
    "<think>a</think><think>b</think>",              # a second <think> anywhere fails
    "<think>a <think> b</think>",
    "",
])
def test_think_format_rejects_everything_else(completion) -> None:
    assert think_format(completion) == 0.0


def _trl_soft_overlong(max_completion_len: int, soft_punish_cache: int, length: int) -> float:
    """TRL's get_soft_overlong_punishment (trl/rewards/other_rewards.py) for one completion length."""
    if length <= max_completion_len - soft_punish_cache:
        return 0.0
    if max_completion_len - soft_punish_cache < length <= max_completion_len:
        return (max_completion_len - soft_punish_cache - length) / soft_punish_cache
    return -1.0


@pytest.mark.parametrize("max_len, cache", [(100, 20), (32, 8), (10, 10), (10, 0), (1, 1)])
def test_soft_overlong_penalty_equals_trls_formula_at_every_length(max_len, cache) -> None:
    f = soft_overlong_penalty(max_completion_len=max_len, cache_len=cache)
    for n in range(0, max_len + 5):
        assert f(n) == _trl_soft_overlong(max_len, cache, n), n


def test_soft_overlong_penalty_boundaries() -> None:
    f = soft_overlong_penalty(max_completion_len=100, cache_len=20)
    assert f.__name__ == "soft_overlong_100_20"
    assert f(80) == 0.0          # the last length without penalty: L - C
    assert f(81) == -0.05
    assert f(90) == -0.5         # TRL's docstring example
    assert f(100) == -1.0        # the ramp reaches -1 at L
    assert f(101) == -1.0


@pytest.mark.parametrize("kwargs, error", [
    (dict(max_completion_len=0, cache_len=0), ValueError),
    (dict(max_completion_len=10, cache_len=11), ValueError),
    (dict(max_completion_len=10, cache_len=-1), ValueError),
    (dict(max_completion_len=10.0, cache_len=2), TypeError),
])
def test_soft_overlong_penalty_rejects_impossible_settings(kwargs, error) -> None:
    with pytest.raises(error):
        soft_overlong_penalty(**kwargs)
