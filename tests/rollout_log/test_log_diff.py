"""RolloutLog.diff: the logged reward against a re-score over a log, through rlgen.compare's diff:
changed rows, flipped groups, the step where the two part ways, the browser of the changed rows, and a
version scored in part: only what both scored is compared, the rest named in the notes."""

from __future__ import annotations

import html
from pathlib import Path

import pytest
from _logs import scored

import rlgen


def strict(completion: str) -> float:
    return float(completion == "yes")


def _hacked_log(tmp_path: Path) -> rlgen.RolloutLog:
    """The logged reward pays 'yes' and the loophole 'yes!'; from step 3 on the policy says 'yes!'."""
    log = rlgen.RolloutLog.create(tmp_path / "run")
    honest = [["yes", "no", "yes", "no"]] * 6
    hacked = [["yes!", "yes!", "yes!", "no"]] * 6
    for step in range(6):
        res = scored(honest if step < 3 else hacked)
        loose = [float(c.startswith("yes")) for c in res.df["completion"]]
        log.append(step, res.with_columns({"reward": loose}))
    log.rescore(strict, version="strict", mode="inline", progress=False)
    return log


def test_the_diff_finds_the_step_where_the_logged_reward_and_a_strict_rescore_part_ways(tmp_path: Path) -> None:
    d = _hacked_log(tmp_path).diff("logged", "strict")
    assert isinstance(d, rlgen.RewardDiff) and d.names == ("logged", "strict")
    assert d.diverged_at == 3 and d.sustained_from == 3
    assert set(d.changed["completion"]) == {"yes!"} and (d.changed["delta"] == -1.0).all()
    assert len(d.changed) == 3 * 6 * 3
    # Hacked groups: logged [1, 1, 1, 0] has spread, strict [0, 0, 0, 0] none: no gradient any more.
    assert d.flips["step"].tolist() == [3] * 6 + [4] * 6 + [5] * 6
    assert set(d.flips["flip"]) == {"stops carrying gradient"}
    assert d.per_step.set_index("step").loc[5, "mean_logged"] == 0.75
    assert d.per_step.set_index("step").loc[5, "mean_strict"] == 0.0


def test_the_changed_rows_open_in_the_browser_with_both_scores(tmp_path: Path) -> None:
    d = _hacked_log(tmp_path).diff()  # the newest version against logged
    browser = d.browse(top=5, widgets=False)
    df = browser.rollouts.df
    assert len(df) == 5 and set(df["completion"]) == {"yes!"}
    assert df["logged"].tolist() == [1.0] * 5 and df["strict"].tolist() == [0.0] * 5 and "delta" in df
    assert "strict" in browser.html()


def test_a_diff_needs_a_second_version_and_says_how_to_make_one(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(0, scored([["yes", "no"]]))
    with pytest.raises(rlgen.LogError, match=r"no re-scored version yet: log.rescore"):
        log.diff()
    with pytest.raises(rlgen.LogError, match="no reward version 'nope'"):
        log.diff("logged", "nope")


def test_a_diff_against_a_partly_scored_version_compares_only_what_both_scored_and_says_what_was_left_out(
        tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    for step in range(5):
        log.append(step, scored([["yes", "no", "yes!", "no"]] * 2))  # logged: 'yes' pays, 'yes!' does not
    loose = {"loose": lambda completion: float(completion.startswith("yes"))}
    log.rescore(loose, version="loose", steps=[0, 1, 3], mode="inline", progress=False)
    d = log.diff("logged", "loose")
    assert d.rows == 3 * 8 and d.per_step["step"].tolist() == [0, 1, 3]
    assert d.changed["step"].tolist() == [0, 0, 1, 1, 3, 3] and d.changed["delta"].tolist() == [1.0] * 6
    assert d.flips.empty  # every compared group has spread under both: no flip, however many rows are left out
    note = "left out: 16 rows of steps 2, 4, not scored under 'loose'"
    assert d.notes[0].startswith(note) and "version='loose'" in d.notes[0]
    assert d.summary()["notes"] == list(d.notes) and note in repr(d) and html.escape(note) in d._repr_html_()
    log.rescore(loose, version="loose", mode="inline", progress=False)  # as the note says: the rest is scored
    everything = log.diff("logged", "loose")
    assert everything.rows == 40 and everything.notes == () and len(everything.changed) == 10


def test_a_diff_with_no_step_scored_under_both_versions_says_so(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(0, scored([["yes", "no"]]))
    log.rescore(strict, version="strict", steps=[0], mode="inline", progress=False)
    log.append(1, scored([["yes", "no"]]))
    with pytest.raises(rlgen.LogError, match=r"no row is scored under both 'logged' and 'strict': left out: 2 rows "
                                             r"of step 1"):
        log.diff("logged", "strict", steps=[1])
