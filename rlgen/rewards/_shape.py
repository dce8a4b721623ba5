"""Rewards on a completion's shape rather than its content: the think format and length penalties.

Owns: `think_format` (TRL's `think_format_reward`, one row at a time) and `soft_overlong_penalty`
(DAPO's soft overlong punishment, as TRL's `get_soft_overlong_punishment` computes it). Both
reproduce TRL's formulas exactly, so numbers seen here are the numbers a TRL run would see.
Knows nothing about answers, datasets or how rewards are called.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["soft_overlong_penalty", "think_format"]

# TRL's pattern and flags: the completion starts with <think>, holds no second <think>, and closes
# the first with </think>; anything may follow.
_THINK = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL | re.MULTILINE)


def think_format(completion: str) -> float:
    """1.0 when the completion is `<think>...</think>` followed by anything, else 0.0.

    TRL's `think_format_reward` for one row: the completion must start with `<think>` (no
    leading whitespace), contain no second `<think>`, and close it with `</think>`.
    """
    return 1.0 if _THINK.match(completion) else 0.0


def soft_overlong_penalty(*, max_completion_len: int, cache_len: int) -> Callable[[int], float]:
    """A reward (a penalty, <= 0) on a completion's length in tokens, DAPO's Eq. (13).

    With L = `max_completion_len` and C = `cache_len`, a completion of `completion_tokens` = n gets
    0 for n <= L - C, (L - C - n) / C for L - C < n <= L (a linear ramp to -1 at n = L), and -1
    for n > L; exactly TRL's `get_soft_overlong_punishment(L, C)`. With C = 0 it is 0 up to L and
    -1 beyond. Set L to the generation's `max_new_tokens` so that truncated completions get -1.

    The returned function is called per row as `f(completion_tokens)` and is named
    `soft_overlong_<L>_<C>` (column `reward_soft_overlong_<L>_<C>`).

    Raises:
        ValueError: L < 1, C < 0, or C > L (here, at once).
    """
    for name, value in (("max_completion_len", max_completion_len), ("cache_len", cache_len)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if max_completion_len < 1:
        raise ValueError(f"max_completion_len must be >= 1, got {max_completion_len}")
    if not 0 <= cache_len <= max_completion_len:
        raise ValueError(f"cache_len must be between 0 and max_completion_len ({max_completion_len}), got {cache_len}")
    start = max_completion_len - cache_len

    def reward(completion_tokens: int) -> float:
        n = int(completion_tokens)
        if n <= start:
            return 0.0
        if n <= max_completion_len:
            return (start - n) / cache_len
        return -1.0

    reward.__name__ = f"soft_overlong_{max_completion_len}_{cache_len}"
    reward.__doc__ = f"0 up to {start} completion tokens, a linear ramp to -1 at {max_completion_len}, -1 beyond."
    return reward
