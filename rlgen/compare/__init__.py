"""The comparison layer: two results, two weight versions, two checkpoints.

Owns: the logprob check of sampled against re-scored tokens (`_logprobs`), the per-token shift
between two results with Schulman's KL estimators and its heatmap (`compare._kl`), the A/B report of
two results on the same prompts with paired intervals over prompts (`compare._ab`), the reward diff
of two versions of a reward over a training log's rows (`reward_diff`, `RewardDiff`:
`compare._reward_diff`), the sampler against the trainer (`sampler_vs_trainer`, `SamplerMismatch`, and
the corrections `tis` and `mis`: `compare._mismatch*`), and the intervals (`compare._intervals`).
Knows nothing about servers or how the results were made: it reads `Rollouts` (and a trainer's
model, which it runs), and the reward diff plain DataFrames.
"""

from __future__ import annotations

from ._ab import ABReport, ab
from ._kl import LogprobShift, compare
from ._logprobs import compare_logprobs
from ._mismatch import SamplerMismatch, sampler_vs_trainer
from ._mismatch_metrics import mis, tis
from ._reward_diff import RewardDiff, reward_diff

__all__ = [
    "ABReport", "LogprobShift", "RewardDiff", "SamplerMismatch", "ab", "compare", "compare_logprobs", "mis",
    "reward_diff", "sampler_vs_trainer", "tis",
]  # fmt: skip
