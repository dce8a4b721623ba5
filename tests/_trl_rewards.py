"""TRL's token-id reward functions, as `trl.rewards` ships them (trl is not a test dependency).

Reference: huggingface/trl, trl/rewards/other_rewards.py (commit
01f8dc59bc8f8d1e5d6e1152b2c628ac920f56df): `get_soft_overlong_punishment` (DAPO, Eq. 13) and
`get_repetition_penalty_reward`. Same shape as there: factories returning callable class instances
with a class-level `__name__`, called as `f(completion_ids, **kwargs) -> list[float]`; the bodies
are written here from their documented formulas, not copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def get_repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> Callable[..., list[float]]:
    if ngram_size <= 0:
        raise ValueError(f"ngram_size must be greater than 0, got {ngram_size}")
    if max_penalty > 0:
        raise ValueError(f"max_penalty {max_penalty} should not be positive")
    return _RepetitionPenalty(ngram_size, max_penalty)


class _RepetitionPenalty:
    __name__ = "repetition_penalty_reward"

    def __init__(self, ngram_size: int, max_penalty: float) -> None:
        self.ngram_size = ngram_size
        self.max_penalty = max_penalty

    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        out = []
        for ids in completion_ids:
            grams = [tuple(ids[i:i + self.ngram_size]) for i in range(len(ids) - self.ngram_size + 1)]
            repeated = 1 - len(set(grams)) / len(grams) if grams else 0.0
            out.append(repeated * self.max_penalty if repeated else 0.0)
        return out


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> Callable[..., list[float]]:
    return _SoftOverlongPunishment(max_completion_len, soft_punish_cache)


class _SoftOverlongPunishment:
    __name__ = "soft_overlong_punishment_reward"

    def __init__(self, max_completion_len: int, soft_punish_cache: int) -> None:
        self.max_completion_len = max_completion_len
        self.soft_punish_cache = soft_punish_cache

    def __call__(self, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        free = self.max_completion_len - self.soft_punish_cache
        out = []
        for ids in completion_ids:
            n = len(ids)
            if n <= free:
                out.append(0.0)
            elif n <= self.max_completion_len:
                out.append((free - n) / self.soft_punish_cache)
            else:
                out.append(-1.0)
        return out
