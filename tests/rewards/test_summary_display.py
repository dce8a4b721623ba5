"""How `reward_summary()` shows: its plain-language flags first, as warnings, then the table."""

from __future__ import annotations

import pandas as pd

from rlgen.rewards._summary import RewardSummary


def summary(flags: list[str]) -> RewardSummary:
    table = pd.DataFrame({"mean": [0.5], "std": [0.1], "frac_ok": [1.0]}, index=pd.Index(["exact"], name="function"))
    return RewardSummary(table, flags)


def test_the_flags_come_first_as_warnings_in_html():
    page = summary(["exact: every scored row got 0: the reward cannot tell samples apart <b>"])._repr_html_()
    flag = page.index("⚠ exact: every scored row got 0")
    assert flag < page.index("<table") and "color:#a35200" in page[:flag]
    assert "&lt;b&gt;" in page  # escaped


def test_the_flags_come_first_in_text_and_no_flags_says_so():
    text = repr(summary(["exact: 40% of rows raised ValueError"]))
    assert text.splitlines()[0] == "⚠ exact: 40% of rows raised ValueError" and "mean" in text.splitlines()[3]
    assert repr(summary([])).startswith("✓ no flags") and summary([])._repr_html_().index("no flags") < summary([])._repr_html_().index("<table")
