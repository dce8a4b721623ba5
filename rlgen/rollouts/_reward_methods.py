"""Scoring a result and reading its rewards: the reward methods of `Rollouts`, as one mixin.

Owns: `add_rewards` (turns the rows into the reward layer's `RowBatch`, with one prompt-group key
per row, shows progress, and adds the columns the reward layer returns), `group_stats`,
`pass_at_k`, `advantages`, and `reward_summary`. Knows nothing about how a
reward function is called or how statistics are computed: `rlgen.rewards` does that on frames
and arrays, and never sees a `Rollouts`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from typing_extensions import Unpack

from ..core._options import RewardOptions, takes_options

if TYPE_CHECKING:
    import pandas as pd
    from typing_extensions import Self

    from ..rewards._group_stats import AdvantageMethod
    from ..rewards._scoring import RewardFunctions
    from ..rewards._summary import RewardSummary

__all__ = ["RewardMethods"]


class RewardMethods:
    """`Rollouts`' reward methods (mixed into `Rollouts`)."""

    if TYPE_CHECKING:
        _df: pd.DataFrame

        def __len__(self) -> int: ...

        def id_lists(self, which: str = "response") -> list[list[int]]: ...

        @property
        def data_columns(self) -> list[str]: ...

        def with_columns(self, columns: Mapping[str, Sequence[Any]]) -> Self: ...

    def _row_objects(self) -> dict[str, list[Any]]:
        """Per-row in-memory objects reward functions may ask for by name besides the columns
        (none here; `Episodes` gives its framework environments as `environments`)."""
        return {}

    @takes_options(RewardOptions)
    def add_rewards(self, funcs: RewardFunctions, /, **options: Unpack[RewardOptions]) -> Self:
        """Score every row with your reward functions; returns a new Rollouts with reward columns.

        `funcs`: a function, a list of them, or a dict name -> function. Each is called in its own
        style, read from its signature (or forced with `style=`): TRL batch functions
        `f(prompts, completions, completion_ids, **columns)`, verl's
        `compute_score(data_source, solution_str, ground_truth, extra_info)`, AReaL's per-sample
        `f(prompt, completions, prompt_ids, completion_ids, **data)`, `f(row)`, or
        `f(completion, answer, ...)` with parameters named after columns; `async def` too.

        Columns added, per function `<name>`: `reward_<name>` (NaN unless ok),
        `reward_<name>_status` (ok / none / error / timeout / bad_return / skipped / cancelled; "skipped":
        the function timed out on 3 calls in a row, none ok in between, and was called no more),
        `reward_<name>_error`, `reward_<name>_traceback` (when something raised),
        `reward_<name>_seconds`; then `reward` (weighted sum, NaN when every function gave NaN),
        `group_mean`, `group_std`, `group_zero_std` and `advantage` per prompt group. Ctrl-C stops
        scoring and keeps what was scored (the rest is marked "cancelled", with a warning).
        Everything is checked before any function runs. The progress line ends with the count of
        each status ("✓ rewards: 128 ok", "⚠ rewards: 119 ok · 9 timeout"), and a function that
        failed on more than a few rows (> 2 and > 5%) gets a warning with its commonest error.
        """
        from ..core._options import resolve
        from ..core._progress import ProgressLine
        from ..rewards._scoring import count_functions, rewards_columns, status_totals, warn_notes
        from ._groups import group_keys, row_batch

        opts = resolve(RewardOptions, options)
        rows = row_batch(self._df, completion_ids=self.id_lists("response"), prompt_ids=self.id_lists("prompt"),
                         data_columns=self.data_columns, objects=self._row_objects())
        with ProgressLine("rewards", total=len(self) * count_functions(funcs), unit="score", show=opts["progress"]) as line:
            cols, notes = rewards_columns(rows, group_keys(self._df), funcs, opts, on_progress=line.advance)
            totals, failed = status_totals(cols)
            line.close(totals=totals, warn=failed)  # "⚠ rewards: 119 ok · 9 timeout · 15.5 s"
        warn_notes(notes)
        return self.with_columns(cols)

    def group_stats(self, *, reward: str = "reward", correct: str | None = None, threshold: float = 1.0,
                    k: int | Sequence[int] = (1,)) -> pd.DataFrame:
        """One row per prompt group: n, mean, std, zero_std (every sample scored the same) and,
        with `correct` (a bool column, or a numeric one where value >= threshold counts), the
        number correct and pass@k for each k (Chen et al., 2021; NaN when k > n)."""
        from ..rewards._summary import group_table
        from ._groups import group_keys

        ks = [k] if isinstance(k, int) else list(k)
        return group_table(self._df, group_keys(self._df), reward=reward, correct=correct, threshold=threshold,
                           ks=ks)

    def pass_at_k(self, k: int | Sequence[int], *, correct: str = "reward", threshold: float = 1.0) -> pd.Series:
        """Mean pass@k over prompt groups, for each k: the unbiased estimator of Chen et al. (2021)
        from each group's n samples and c correct ones (1 when n - c < k). A row is correct when
        the `correct` column is True, or (numeric) at least `threshold`."""
        import pandas as pd

        ks = [k] if isinstance(k, int) else list(k)
        for value in ks:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"k must be ints >= 1, got {value!r}")
        table = self.group_stats(reward=correct if correct in self._df.columns else "reward", correct=correct,
                                 threshold=threshold, k=ks)
        return pd.Series({f"pass@{v}": float(table[f"pass@{v}"].mean()) for v in ks}, name="pass_at_k")

    def advantages(self, method: AdvantageMethod = "grpo", *, reward: str = "reward", eps: float = 1e-4) -> pd.Series:
        """Advantages of the `reward` column by another estimator, without scoring again: "grpo",
        "drgrpo", "rloo" or "batch" (see `add_rewards`). Returns a Series aligned with `df`."""
        import pandas as pd

        from ..rewards._group_stats import advantages
        from ._groups import group_keys

        if reward not in self._df.columns:
            raise ValueError(f"no column {reward!r}; add rewards first: res.add_rewards(...)")
        values = advantages(self._df[reward].to_numpy(dtype=np.float64), group_keys(self._df), method=method, eps=eps)
        return pd.Series(values, index=self._df.index, name=f"advantage_{method}")

    def reward_summary(self) -> RewardSummary:
        """Per reward function: mean and std, how often it was ok / none / error / timeout /
        bad_return (with the commonest error), its p95 call time, the share of prompt groups with
        no spread, its correlation with completion length and its mean by finish reason; and
        flags in plain language for what looks wrong."""
        from ..rewards._summary import summarize
        from ._groups import group_keys

        return summarize(self._df, group_keys(self._df))
