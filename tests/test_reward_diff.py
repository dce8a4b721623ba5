"""rlgen.compare._reward_diff: two versions of a reward over a log's rows, on hand-built frames (no server)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pandas as pd
import pytest

from rlgen.compare import RewardDiff, reward_diff
from rlgen.compare._intervals import bootstrap_interval, t_interval
from rlgen.rewards._group_stats import advantages


def log_rows(steps: int, prompts: int, n: int, *, parts_per_step: int = 1) -> pd.DataFrame:
    """`steps` steps of `parts_per_step` parts, each `prompts` prompt groups of `n` samples."""
    records = []
    for step in range(steps):
        for part in range(parts_per_step):
            for p in range(prompts):
                for s in range(n):
                    records.append({"step": step, "part": f"step{step}-call{part}", "row": p * n + s, "prompt_index": p,
                                    "prompt_key": f"key{p}", "prompt": f"question {p}", "completion": f"answer {p}.{s}"})
    return pd.DataFrame(records)


def scores(values: object, rows: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"reward": np.asarray(values, dtype=np.float64)}, index=rows.index)


def test_changed_rows_are_the_ones_whose_score_moved_largest_change_first_and_nan_changes_last() -> None:
    rows = log_rows(1, 2, 3)
    a = [0.0, 1.0, 0.5, 1.0, np.nan, 0.0]
    b = [0.0, 0.2, 1.0, np.nan, np.nan, 3.0]
    diff = reward_diff(rows, scores(a, rows), scores(b, rows))
    changed = diff.changed
    assert changed["row"].tolist() == [5, 1, 2, 3]  # |3.0|, |-0.8|, |0.5|, then NaN vs 1.0
    assert changed["delta"].tolist()[:3] == pytest.approx([3.0, -0.8, 0.5])
    assert math.isnan(changed["delta"].iloc[3])
    assert list(changed.columns) == ["step", "part", "row", "prompt_index", "prompt_key", "prompt", "completion",
                                     "logged", "strict", "delta"]
    assert changed["logged"].tolist()[:3] == [0.0, 1.0, 0.5] and changed["strict"].tolist()[:3] == [3.0, 0.2, 1.0]
    assert changed["completion"].iloc[0] == "answer 1.2"
    assert changed.index.tolist() == [0, 1, 2, 3]


def test_nan_under_both_versions_is_no_change_and_equal_scores_are_none_either() -> None:
    rows = log_rows(1, 1, 4)
    a = scores([np.nan, np.nan, 1.0, 0.0], rows)
    b = pd.DataFrame({"reward": pd.array([None, np.nan, 1.0, 0.0], dtype="Float64")}, index=rows.index)
    diff = reward_diff(rows, a, b)
    assert diff.changed.empty and diff.summary()["changed"] == 0


def test_a_change_of_one_ten_millionth_is_a_change_the_comparison_is_exact_not_within_a_tolerance() -> None:
    rows = log_rows(1, 1, 4)
    a = [0.5, 1.0, np.nan, 1e-9]
    b = [0.5 + 1e-7, 1.0, np.nan, 0.0]
    changed = reward_diff(rows, scores(a, rows), scores(b, rows)).changed
    assert changed["row"].tolist() == [0, 3]
    assert changed["delta"].tolist() == pytest.approx([1e-7, -1e-9], rel=1e-6, abs=0)


def test_notes_of_what_the_caller_left_out_are_kept_and_shown() -> None:
    rows = log_rows(1, 2, 2)
    note = "left out: 4 rows of step 1, not scored under 'strict'"
    diff = reward_diff(rows, scores([1, 0, 1, 0], rows), scores([1, 0, 0, 0], rows), notes=[note])
    assert diff.notes == (note,) and diff.summary()["notes"] == [note]
    assert repr(diff).endswith(f"; {note}>") and "left out: 4 rows of step 1" in diff._repr_html_()
    assert reward_diff(rows, scores([1, 0, 1, 0], rows), scores([1, 0, 0, 0], rows)).notes == ()


def test_a_group_that_becomes_constant_stops_carrying_gradient_and_one_that_spreads_starts() -> None:
    rows = log_rows(1, 3, 4)
    a = [1, 0, 1, 0, 1, 1, 1, 1, 0, 1, 0, 1]  # groups of 4: mixed, constant, mixed
    b = [0, 0, 0, 0, 1, 0, 1, 1, 1, 0, 0, 1]  # constant, mixed, mixed
    diff = reward_diff(rows, scores(a, rows), scores(b, rows), names=("old", "new"))
    groups = diff.groups
    assert groups["flip"].tolist() == ["stops carrying gradient", "starts carrying gradient", ""]
    assert groups["zero_std_old"].tolist() == [False, True, False]
    assert groups["zero_std_new"].tolist() == [True, False, False]
    assert groups["mean_old"].tolist() == [0.5, 1.0, 0.5] and groups["mean_new"].tolist() == [0.0, 0.75, 0.5]
    assert groups["n"].tolist() == [4, 4, 4] and groups["n_old"].tolist() == [4, 4, 4]
    assert diff.flips["prompt_index"].tolist() == [0, 1]
    assert (diff.summary()["starts_gradient"], diff.summary()["stops_gradient"]) == (1, 1)


def test_a_group_left_with_one_scored_row_stops_carrying_gradient_though_it_is_not_zero_std() -> None:
    rows = log_rows(1, 1, 3)
    diff = reward_diff(rows, scores([1, 0, 1], rows), scores([1, np.nan, np.nan], rows))
    assert diff.groups["zero_std_strict"].tolist() == [False]  # group_arrays: under two finite rewards
    assert diff.groups["n_strict"].tolist() == [1]
    assert diff.groups["flip"].tolist() == ["stops carrying gradient"]


def test_advantages_are_group_stats_advantages_over_part_and_prompt_index() -> None:
    # two calls at one step with the same prompt indices: the group key must hold the part
    rows = log_rows(2, 2, 4, parts_per_step=2)
    rng = np.random.default_rng(3)
    a, b = rng.random(len(rows)), rng.integers(0, 2, len(rows)).astype(float)
    a[5] = np.nan
    diff = reward_diff(rows, scores(a, rows), scores(b, rows))
    keys = (rows["part"] + "/" + rows["prompt_index"].astype(str)).to_numpy()
    table = diff.advantages
    assert table.index.equals(rows.index)
    assert list(table.columns) == ["step", "part", "row", "prompt_index", "grpo_logged", "grpo_strict",
                                   "drgrpo_logged", "drgrpo_strict", "rloo_logged", "rloo_strict"]
    for method in ("grpo", "drgrpo", "rloo"):
        np.testing.assert_array_equal(table[f"{method}_logged"], advantages(a, keys, method=method))
        np.testing.assert_array_equal(table[f"{method}_strict"], advantages(b, keys, method=method))


def planted(steps: int, k: int, *, prompts: int = 12, n: int = 4, shift: float = 0.4) -> tuple[pd.DataFrame, ...]:
    """Noisy rewards; from step k on, B is A plus `shift` plus noise."""
    rows = log_rows(steps, prompts, n)
    rng = np.random.default_rng(7)
    a = rng.random(len(rows))
    b = a + rng.normal(0.0, 0.05, len(rows)) * (rows["step"] >= k) + shift * (rows["step"] >= k)
    return rows, scores(a, rows), scores(b, rows)


def test_a_divergence_planted_from_step_k_is_found_at_k_and_sustained_from_k() -> None:
    rows, a, b = planted(8, 5)
    diff = reward_diff(rows, a, b)
    assert diff.diverged_at == 5 and diff.sustained_from == 5
    table = diff.per_step
    assert table["step"].tolist() == list(range(8))
    assert table["diverged"].tolist() == [False] * 5 + [True] * 3
    assert (table["low"].iloc[5:] > 0).all() and table["groups"].tolist() == [12] * 8
    assert list(table.columns) == ["step", "rows", "groups", "mean_logged", "mean_strict", "pass_logged",
                                   "pass_strict", "diff", "low", "high", "diverged"]


def test_a_run_without_difference_never_diverges() -> None:
    rows, a, _ = planted(6, 0)
    diff = reward_diff(rows, a, a.copy())
    assert diff.diverged_at is None and diff.sustained_from is None
    assert not diff.per_step["diverged"].any() and (diff.per_step["diff"] == 0).all()
    assert "no step's interval excludes 0" in repr(diff)


def test_a_divergence_that_ends_or_changes_side_is_not_sustained_from_its_first_step() -> None:
    rows = log_rows(5, 6, 2)
    step = rows["step"].to_numpy()
    rng = np.random.default_rng(1)
    a = rng.random(len(rows))
    ends = a + 0.5 * (step == 1)
    diff = reward_diff(rows, scores(a, rows), scores(ends, rows))
    assert diff.diverged_at == 1 and diff.sustained_from is None
    turns = a + np.where(step >= 3, -0.5, np.where(step >= 1, 0.5, 0.0))
    diff = reward_diff(rows, scores(a, rows), scores(turns, rows))
    assert diff.diverged_at == 1 and diff.sustained_from == 3  # up at 1-2, down from 3 to the end


def test_the_t_interval_is_over_the_groups_mean_differences_not_the_rows() -> None:
    rows = log_rows(1, 4, 2)
    a = [0, 0, 0, 0, 0, 0, 0, 0]
    b = [1, 0, 0.2, 0.2, 0, 0.6, 1, 1]  # group differences 0.5, 0.2, 0.3, 1.0
    diff = reward_diff(rows, scores(a, rows), scores(b, rows), confidence=0.8)
    row = diff.per_step.iloc[0]
    assert row["diff"] == pytest.approx(0.5)
    low, high = t_interval(np.array([0.5, 0.2, 0.3, 1.0]), confidence=0.8)
    assert (row["low"], row["high"]) == pytest.approx((low, high))
    assert row["groups"] == 4 and row["rows"] == 8


def test_the_bootstrap_interval_holds_the_t_centre_and_the_same_seed_gives_the_same_interval() -> None:
    rows, a, b = planted(3, 0, prompts=20, shift=0.1)
    t = reward_diff(rows, a, b)
    boot = reward_diff(rows, a, b, interval="bootstrap", seed=3)
    assert ((boot.per_step["low"] <= t.per_step["diff"]) & (t.per_step["diff"] <= boot.per_step["high"])).all()
    assert boot.per_step["diff"].equals(t.per_step["diff"])
    assert boot.per_step.equals(reward_diff(rows, a, b, interval="bootstrap", seed=3).per_step)
    assert not boot.per_step["low"].equals(reward_diff(rows, a, b, interval="bootstrap", seed=4).per_step["low"])
    # a step's interval is the same whichever other steps are in the call
    alone = rows["step"] == 2
    one = reward_diff(rows[alone], a[alone], b[alone], interval="bootstrap", seed=3).per_step
    assert (one["low"].iloc[0], one["high"].iloc[0]) == (boot.per_step["low"].iloc[2], boot.per_step["high"].iloc[2])
    assert "percentile bootstrap" in boot.interval_note


def test_bootstrap_interval_is_nan_below_two_values_and_a_point_when_all_are_equal() -> None:
    assert all(math.isnan(x) for x in bootstrap_interval(np.array([0.3]), confidence=0.9, seed=0))
    assert bootstrap_interval(np.array([0.3, 0.3, 0.3]), confidence=0.9, seed=0) == (0.3, 0.3)


def test_steps_with_fewer_groups_than_min_prompts_get_no_interval_and_never_diverge() -> None:
    rows = log_rows(2, 3, 2)
    a = np.zeros(len(rows))
    b = a + 1.0
    b[rows["step"].to_numpy() == 1] = np.nan  # step 1: no group scored under B
    diff = reward_diff(rows, scores(a, rows), scores(b, rows), min_prompts=4)
    table = diff.per_step
    assert table["groups"].tolist() == [3, 0]
    assert table["diff"].iloc[0] == 1.0 and math.isnan(table["diff"].iloc[1])
    assert table[["low", "high"]].isna().all().all() and not table["diverged"].any()
    assert diff.diverged_at is None


def test_means_and_pass_rates_per_step_leave_nan_rewards_out() -> None:
    rows = log_rows(2, 1, 4)
    a = [1.0, 0.0, np.nan, 1.0, 0.5, 0.5, 0.5, 0.5]
    b = [1.0, 1.0, 1.0, np.nan, 0.0, 1.0, 2.0, np.nan]
    diff = reward_diff(rows, scores(a, rows), scores(b, rows), threshold=1.0)
    table = diff.per_step
    assert table["mean_logged"].tolist() == pytest.approx([2 / 3, 0.5])
    assert table["mean_strict"].tolist() == pytest.approx([1.0, 1.0])
    assert table["pass_logged"].tolist() == pytest.approx([2 / 3, 0.0])
    assert table["pass_strict"].tolist() == pytest.approx([1.0, 2 / 3])
    assert table["rows"].tolist() == [4, 4]


def test_the_html_view_escapes_a_completion_and_holds_no_script() -> None:
    rows = log_rows(1, 2, 2)
    rows.loc[1, "completion"] = "<script>alert('x')</script>" + "y" * 500
    diff = reward_diff(rows, scores([0, 0, 1, 1], rows), scores([0, 1, 1, 1], rows), names=("v<1>", "v2"))
    page = diff._repr_html_()
    assert "<script" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "y" * 300 not in page  # clipped
    assert "v&lt;1&gt;" in page and "rows changed" in page and "diverged at" in page


def test_repr_is_one_line_with_the_names_and_counts() -> None:
    rows, a, b = planted(4, 2)
    text = repr(reward_diff(rows, a, b))
    assert text.startswith("<RewardDiff logged → strict") and "\n" not in text
    assert "diverged at step 2, sustained from step 2" in text and "192 rows" in text


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_the_plot_draws_two_mean_lines_and_the_band_on_a_twin_axis() -> None:
    from matplotlib.axes import Axes

    rows, a, b = planted(5, 2)
    diff = reward_diff(rows, a, b)
    ax = diff.plot()
    assert isinstance(ax, Axes) and len(ax.get_lines()) == 2
    twin = ax.figure.axes[-1]
    assert twin is not ax and twin.collections  # the shaded interval
    assert any(line.get_xdata()[0] == 2 for line in twin.get_lines())  # the marker at diverged_at
    assert hasattr(ax, "_repr_png_")


@pytest.mark.parametrize("change, message", [
    (dict(a=pd.DataFrame({"reward": [0.0]})), "a has 1 rows and rows has 4"),
    (dict(b=pd.DataFrame({"reward": [0.0] * 4}, index=[9, 8, 7, 6])), "b's index differs"),
    (dict(rows=log_rows(1, 2, 2).drop(columns="prompt_key")), "rows has no column 'prompt_key'"),
    (dict(a=pd.DataFrame({"score": [0.0] * 4})), "a has no column 'reward'"),
    (dict(a=pd.DataFrame({"reward": ["x"] * 4})), "not numbers"),
    (dict(names=("same", "same")), "names must differ"),
    (dict(names=("delta", "b")), "names may not be 'delta'"),
    (dict(names="ab"), "names must be two"),
    (dict(threshold="1"), "threshold must be a number"),
    (dict(threshold=True), "threshold must be a number"),
    (dict(confidence=1.5), "confidence must be"),
    (dict(interval="bca"), "interval must be 't'"),
    (dict(min_prompts=1), "min_prompts must be"),
    (dict(seed=-1), "seed must be"),
])
def test_bad_input_is_refused_with_what_to_pass(change: dict, message: str) -> None:
    rows = log_rows(1, 2, 2)
    args = dict(rows=rows, a=scores([0, 1, 0, 1], rows), b=scores([1, 1, 0, 1], rows))
    args.update(change)
    with pytest.raises(ValueError, match=message):
        reward_diff(**args)


def test_rows_that_are_not_a_dataframe_are_a_type_error_and_empty_rows_a_value_error() -> None:
    rows = log_rows(1, 1, 2)
    with pytest.raises(TypeError, match="rows must be a pandas DataFrame"):
        reward_diff(rows.to_dict(), scores([0, 1], rows), scores([0, 1], rows))  # type: ignore[arg-type]
    empty = rows.iloc[:0]
    with pytest.raises(ValueError, match="rows is empty"):
        reward_diff(empty, scores([], empty), scores([], empty))


def test_the_result_is_a_frozen_reward_diff_with_a_summary() -> None:
    rows, a, b = planted(3, 1)
    diff = reward_diff(rows, a, b, names=("v1", "v2"))
    assert isinstance(diff, RewardDiff)
    with pytest.raises(AttributeError):
        diff.diverged_at = 0  # type: ignore[misc]
    summary = diff.summary()
    assert summary["names"] == ("v1", "v2") and summary["rows"] == len(rows) and summary["steps"] == 3
    assert summary["diverged_at"] == 1 and summary["groups"] == 36
