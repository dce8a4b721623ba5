"""`sanity_check`: does a reward function rank an ideal answer above empty and garbage ones?

Owns: building, from per-case data with a ground truth, the completions whose rewards are known in
advance (the oracle answer, an empty completion, garbage), scoring them with the user's function
through the same scoring code as `Rollouts.add_rewards` (`_scoring.rewards_columns`: same style
detection, same worker processes), and the table of checks. Knows nothing about servers, models
or the result object: no generation happens, and the rows are built here as columns.

The checks, per case:
- "oracle scores highest": the oracle completion's reward is finite, not below any other, and
  above every empty or garbage completion's value.
- "empty scores lowest", "garbage scores lowest": not above any other and below the oracle, or
  None (the function cannot judge it: such rows add nothing to the combined reward).
- "same value when repeated": the oracle, scored `repeats` times, gets one value every time.
- "no errors": no call raised, timed out or returned something unusable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GARBAGE", "SanityReport", "sanity_check"]

GARBAGE: tuple[str, ...] = ("I do not know.", "zxqv lorem ipsum 42 banana")
_CHECKS = ("oracle scores highest", "empty scores lowest", "garbage scores lowest", "same value when repeated",
           "no errors")


@dataclass
class SanityReport:
    """The checks (`table`: a row per case and check, with `ok` and what was seen) and `passed`."""

    table: pd.DataFrame
    scores: pd.DataFrame  # every scored completion: case, kind, completion, reward, status, error

    @property
    def passed(self) -> bool:
        return bool(self.table["ok"].all())

    def failures(self) -> pd.DataFrame:
        return self.table[~self.table["ok"]]

    def by_check(self) -> pd.DataFrame:
        """One row per check: cases passed, cases failed, and the first failure's detail."""
        import pandas as pd

        rows = []
        for check, group in self.table.groupby("check", sort=False):
            failed = group[~group["ok"]]
            first = "" if failed.empty else f"case {failed['case'].iloc[0]}: {failed['detail'].iloc[0]}"
            rows.append({"check": check, "passed": len(group) - len(failed), "failed": len(failed),
                         "first failure": first})
        return pd.DataFrame(rows).set_index("check")

    def _headline(self) -> str:
        n_failed = int((~self.table["ok"]).sum())
        cases = self.table["case"].nunique()
        if self.passed:
            return f"sanity_check: PASSED ({len(self.table)} of {len(self.table)} checks passed over {cases} cases)"
        # Count what failed: "32 of 80 checks" after FAILED read as 32 failures when 32 had passed.
        return (f"sanity_check: FAILED ({n_failed} of {len(self.table)} checks failed, "
                f"{len(self.table) - n_failed} passed, over {cases} cases)")

    def __repr__(self) -> str:
        return self._headline() if self.passed else self._headline() + "\n" + self.by_check().to_string()

    def _repr_html_(self) -> str:
        colour = "#2a7" if self.passed else "#c33"
        head = f'<div style="font-family:monospace;color:{colour}">{self._headline()}</div>'
        return f"<div>{head}{'' if self.passed else self.by_check().to_html()}</div>"

    def __bool__(self) -> bool:
        return self.passed


def sanity_check(
    fn: Callable[..., Any],
    data: Any,
    *,
    oracle: str | Callable[[Mapping[str, Any]], str] = "answer",
    garbage: Sequence[str] = GARBAGE,
    repeats: int = 3,
    prompts: Sequence[Any] | None = None,
    name: str | None = None,
    style: str | None = None,
    columns: Mapping[str, str] | None = None,
    mode: str = "process",
    timeout: float | None = 10.0,
) -> SanityReport:
    """Score known-good and known-bad completions with `fn` and check that it ranks them right.

    Args:
        fn: a reward function, in any style `Rollouts.add_rewards` takes.
        data: the cases, with whatever columns `fn` needs (a DataFrame, a list of dicts or a dict of
            lists; e.g. `task.data` of a reasoning-gym task). A `question` or `prompt` column
            becomes each case's prompt text.
        oracle: the column holding the ideal completion (default "answer"), or a function
            row -> completion (e.g. `lambda row: f"<answer>{row['answer']}</answer>"`).
        garbage: completions that must score lowest (besides the empty one).
        repeats: how many times the oracle is scored, to check that `fn` is deterministic.
        prompts: each case's chat (e.g. `task.prompts`), for functions that expect chat data: TRL
            batch functions then get `prompts` as messages and `completions` as
            `[{"role": "assistant", "content": ...}]`, as on chat rollouts.
        name, style, columns, mode, timeout: as in `Rollouts.add_rewards`.

    Returns: a `SanityReport`; `bool(report)` is `report.passed`.
    """
    import pandas as pd

    from ..client._prompts import prompt_data
    from ..core._columns import RESERVED_DATA_NAMES
    from ..core._options import RewardOptions, resolve
    from ._scoring import rewards_columns
    from ._styles import RowBatch

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 2:
        raise ValueError(f"repeats must be an int >= 2 (to compare repeated calls), got {repeats!r}")
    if isinstance(garbage, str) or not all(isinstance(g, str) for g in garbage):
        raise TypeError("garbage must be a list of strings")
    n_cases = _count_rows(data)
    cols = prompt_data(data, n_cases, reserved=[c for c in RESERVED_DATA_NAMES if c != "prompt"])
    prompt_texts = cols.pop("prompt", None) or cols.get("question")
    rows = [{c: v[i] for c, v in cols.items()} for i in range(n_cases)]
    if callable(oracle):
        oracles = [str(oracle(row)) for row in rows]
    elif oracle in cols:
        oracles = ["" if v is None else str(v) for v in cols[oracle]]
    else:
        raise ValueError(f"no column {oracle!r} for the oracle completion; pass oracle= a column of data "
                         f"({', '.join(cols) or 'none'}) or a function row -> completion")
    kinds = ["oracle"] * repeats + ["empty"] + [f"garbage {j + 1}" for j in range(len(garbage))]
    texts = [[o] * repeats + ["", *garbage] for o in oracles]
    per_case = len(kinds)
    n_rows = n_cases * per_case
    row_cols: dict[str, list[Any]] = {
        "prompt_index": [c for c in range(n_cases) for _ in kinds],
        "sample_index": list(range(per_case)) * n_cases,
        "prompt": [None if prompt_texts is None else str(prompt_texts[c]) for c in range(n_cases) for _ in kinds],
        "completion": [t for case in texts for t in case],
        "finish_reason": ["stop"] * n_rows,
        "completion_tokens": [0] * n_rows,
    }
    row_cols.update({c: [v for v in values for _ in range(per_case)] for c, values in cols.items()})
    if prompts is not None:
        if isinstance(prompts, str) or len(prompts) != n_cases:
            raise ValueError(f"give one prompt (chat) per case: {n_cases} cases")
        row_cols["prompt_messages"] = [list(p) for p in prompts for _ in range(per_case)]
    batch = RowBatch(columns=row_cols, completion_ids=[[] for _ in range(n_rows)], prompt_ids=[[0]] * n_rows,
                     data_columns=list(cols), chats=row_cols.get("prompt_messages"))
    label = name or getattr(fn, "__name__", None) or "reward"
    label = label if label.isidentifier() else "reward"
    options = resolve(RewardOptions, {"style": style, "columns": columns, "mode": mode, "timeout": timeout,
                                      "progress": False})
    scored, _ = rewards_columns(batch, np.asarray(row_cols["prompt_index"]), {label: fn}, options)
    values = np.asarray(scored[f"reward_{label}"], dtype=float)
    status = [str(x) for x in scored[f"reward_{label}_status"]]
    errors = list(scored[f"reward_{label}_error"])
    table_rows: list[dict[str, Any]] = []
    for case in range(n_cases):
        at = slice(case * per_case, (case + 1) * per_case)
        v, st, err = values[at], status[at], errors[at]
        table_rows += _case_checks(case, v, st, err, kinds, repeats)
    scores = pd.DataFrame({
        "case": [c for c in range(n_cases) for _ in kinds], "kind": kinds * n_cases,
        "completion": [t for case in texts for t in case], "reward": values, "status": status, "error": errors,
    })
    table = pd.DataFrame(table_rows, columns=["case", "check", "ok", "detail"])
    return SanityReport(table=table, scores=scores)


def _count_rows(data: Any) -> int:
    if hasattr(data, "columns") and hasattr(data, "__len__"):
        return len(data)
    if isinstance(data, Mapping):
        lengths = {len(v) for v in data.values() if hasattr(v, "__len__")}
        return lengths.pop() if len(lengths) == 1 else 0
    if isinstance(data, (list, tuple)):
        return len(data)
    raise TypeError(f"data must be a DataFrame, a list of dicts or a dict of lists, got {type(data).__name__}")


def _fmt(x: float, status: str = "ok") -> str:
    if status == "none":
        return "None"
    return "NaN" if math.isnan(x) else f"{x:g}"


def _case_checks(case: int, v: Any, status: list[str], errors: list[Any], kinds: list[str],
                 repeats: int) -> list[dict[str, Any]]:
    """The five checks of one case. An empty or garbage completion passes with a value no higher
    than any other and below the oracle's, or with None ("cannot judge": it adds nothing to the
    combined reward, which the detail shows)."""
    finite = [x for x in v if not math.isnan(x)]
    low = min(finite) if finite else math.nan
    top = max(finite) if finite else math.nan
    oracle = v[0]
    seen = f"oracle={_fmt(oracle, status[0])}, " + ", ".join(
        f"{k}={_fmt(x, s)}" for k, x, s in zip(kinds[repeats:], v[repeats:], status[repeats:]))

    def lowest(i: int) -> bool:
        return status[i] == "none" or (not math.isnan(v[i]) and v[i] <= low and v[i] < oracle)

    bad_values = [x for x in v[repeats:] if not math.isnan(x)]
    beats_bad = all(oracle > x for x in bad_values)
    out = [{"case": case, "check": _CHECKS[0], "ok": not math.isnan(oracle) and oracle >= top and beats_bad,
            "detail": seen if not math.isnan(oracle) else f"oracle got no value ({status[0]}: {errors[0]})"},
           {"case": case, "check": _CHECKS[1], "ok": lowest(repeats), "detail": seen}]
    bad = [kinds[i] for i in range(repeats + 1, len(kinds)) if not lowest(i)]
    out.append({"case": case, "check": _CHECKS[2], "ok": not bad,
                "detail": seen if not bad else f"{', '.join(bad)} not lowest: {seen}"})
    repeated = v[:repeats]
    same = all(x == repeated[0] or (math.isnan(x) and math.isnan(repeated[0])) for x in repeated)
    out.append({"case": case, "check": _CHECKS[3], "ok": same,
                "detail": ", ".join(_fmt(x, s) for x, s in zip(repeated, status))})
    failed = [f"{k}: {e}" for k, s, e in zip(kinds, status, errors) if s in ("error", "timeout", "bad_return")]
    out.append({"case": case, "check": _CHECKS[4], "ok": not failed, "detail": "; ".join(failed)[:200]})
    return out
