"""The comparison layer: two results, two weight versions, two checkpoints.

Owns: the logprob check of sampled against re-scored tokens (`_logprobs`), the per-token shift
between two results with Schulman's KL estimators and its heatmap (`compare._kl`), and the A/B report of
two results on the same prompts with paired intervals over prompts (`compare._ab`). Knows nothing about
servers or how the results were made: it reads `Rollouts`.
"""

from __future__ import annotations

from ._ab import ABReport, ab
from ._kl import LogprobShift, compare
from ._logprobs import compare_logprobs

__all__ = ["ABReport", "LogprobShift", "ab", "compare", "compare_logprobs"]
