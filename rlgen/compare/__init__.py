"""The comparison layer: two results, two weight versions, two checkpoints.

Owns: the logprob check of sampled against re-scored tokens (`_logprobs`), the per-token shift
between two results with Schulman's KL estimators and its heatmap (`compare._kl`), the A/B report of
two results on the same prompts with paired intervals over prompts (`compare._ab`), the reward diff
of two versions of a reward over a training log's rows (`reward_diff`, `RewardDiff`:
`compare._reward_diff`), and the intervals both use (`compare._intervals`). Knows nothing about
servers or how the results were made: it reads `Rollouts`, and the reward diff plain DataFrames.
"""

from __future__ import annotations

from ._ab import ABReport, ab
from ._kl import LogprobShift, compare
from ._logprobs import compare_logprobs
from ._reward_diff import RewardDiff, reward_diff

__all__ = ["ABReport", "LogprobShift", "RewardDiff", "ab", "compare", "compare_logprobs", "reward_diff"]
