"""rlgen.RolloutLog: appending parts by step, reading them back lazily, refusing what would merge or
overwrite, reporting what cannot be read, and the views across steps (no server: results built from
SGLang-shaped answers)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from _logs import call, scored

import rlgen


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_appended_steps_read_back_as_rows_and_as_results_with_their_tensors(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    first, second = scored([["yes", "no"], ["no", "no"]]), scored([["yes", "yes"], ["no", "yes"]])
    log.append(0, first)
    log.append(10, second)
    assert log.steps == [0, 10] and len(log) == 8
    rows = log.rows(columns=["completion", "reward"])
    assert list(rows.columns[:2]) == ["part", "row"] and rows["row"].tolist() == [0, 1, 2, 3] * 2
    assert rows["reward"].tolist() == [1, 0, 0, 0, 1, 1, 0, 1]
    back = log.load(10)
    assert isinstance(back, rlgen.Rollouts) and back.df["step"].tolist() == [10] * 4
    assert back.df["completion"].tolist() == second.df["completion"].tolist()
    assert np.array_equal(back.tensors()["response_ids"], second.tensors()["response_ids"])
    assert np.allclose(back.tensors()["logprobs"], second.tensors()["logprobs"])
    both = log.load(range(0, 11))
    assert len(both) == 8 and sorted(set(both.df["step"])) == [0, 10]


def test_the_same_prompt_has_one_key_in_every_step(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(1, scored([["yes", "no"], ["no", "no"]]))
    log.append(2, scored([["no", "no"], ["yes", "yes"]]))
    rows = log.rows(columns=["prompt", "prompt_key"])
    assert rows.groupby("prompt")["prompt_key"].nunique().tolist() == [1, 1]
    assert rows["prompt_key"].nunique() == 2
    one = log.prompt(rows["prompt_key"].iat[0][:6])
    assert one["step"].tolist() == [1, 1, 2, 2] and set(one["prompt"]) == {"question 0"}


def test_a_step_logged_twice_under_one_name_is_refused_and_another_name_is_a_second_part(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(5, scored([["yes", "no"]]))
    before = _digest(tmp_path / "run")
    with pytest.raises(rlgen.LogError, match=r"step 5 already has a part 'main'.*name='eval'"):
        log.append(5, scored([["no", "no"]]))
    assert _digest(tmp_path / "run") == before
    log.append(5, scored([["no", "no"]]), name="eval")
    assert log.parts()["name"].tolist() == ["eval", "main"] and len(log.load(5)) == 4
    assert len(log.load(5, name="eval")) == 2


def test_a_path_that_is_not_a_log_says_what_it_is_and_how_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(rlgen.LogError, match=r"nothing is there.*RolloutLog.create"):
        rlgen.RolloutLog(tmp_path / "missing")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "completions_00010.parquet").write_bytes(b"x")
    with pytest.raises(rlgen.LogError, match=r"not a rollout log: it holds files but no log.json.*from_trl"):
        rlgen.RolloutLog(tmp_path / "other")
    with pytest.raises(rlgen.LogError, match="holds other files"):
        rlgen.RolloutLog.create(tmp_path / "other")
    rlgen.RolloutLog.create(tmp_path / "run")
    with pytest.raises(rlgen.LogError, match="already at"):
        rlgen.RolloutLog.create(tmp_path / "run")
    assert rlgen.RolloutLog.create(tmp_path / "run", exist_ok=True).steps == []
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "log.json").write_text('{"format": "rlgen-rollout-log", "version": 99, "rlgen": "9.0"}')
    with pytest.raises(rlgen.LogError, match=r"not a version-1 rollout log.*9\.0"):
        rlgen.RolloutLog(tmp_path / "old")


def test_a_truncated_part_is_reported_with_its_file_and_the_other_steps_still_read(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    for step in (1, 2, 3):
        log.append(step, scored([["yes", "no"]]))
    broken = tmp_path / "run" / "parts" / log.parts()["file"].iat[1]
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])
    with pytest.warns(UserWarning, match=rf"{broken.name} cannot be read.*left out"):
        rows = rlgen.RolloutLog(tmp_path / "run").rows(columns=["reward"])
    assert sorted(set(rows["step"])) == [1, 3]
    with pytest.raises(rlgen.LogError, match=rf"{broken.name} cannot be read") as err:
        log.load(2)
    assert err.value.path is not None and err.value.path.endswith(broken.name)
    assert len(log.load([1, 3])) == 4


def test_a_reward_that_appears_halfway_through_a_run_is_null_before_it(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(1, call([["yes", "no"]], rewards=[[1.0, 0.0]]))
    log.append(2, call([["yes", "no"]], rewards=[[1.0, 0.0]]).with_columns({"judge": [0.5, 0.25]}))
    rows = log.rows(columns=["reward", "judge"])
    assert rows["judge"].isna().tolist() == [True, True, False, False]
    assert rows["reward"].tolist() == [1.0, 0.0, 1.0, 0.0]


def test_missing_steps_are_named_from_the_stride_and_never_filled_in(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    for step in (10, 20, 40, 50, 70):
        log.append(step, scored([["yes", "no"]]))
    assert log.missing_steps() == [30, 60]
    assert list(log.trend().index) == [10, 20, 40, 50, 70]
    assert "2 missing from the stride: 30, 60" in log._repr_html_()


def test_the_trend_counts_means_pass_rates_finish_reasons_and_zero_variance_groups(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(0, scored([["yes", "no"], ["no", "no"]]))   # one group with spread, one without
    log.append(1, scored([["yes", "yes"], ["yes", "yes"]]))
    trend = log.trend()
    assert trend["rows"].tolist() == [4, 4]
    assert trend["reward"].tolist() == [0.25, 1.0] and trend["pass_rate"].tolist() == [0.25, 1.0]
    assert trend["zero_std_share"].tolist() == [0.5, 1.0]
    assert trend["finish_stop"].tolist() == [1.0, 1.0]
    assert trend["completion_tokens"].tolist() == [2.25, 3.0]  # "yes" is 3 tokens, "no" 2


def test_a_log_another_process_writes_shows_its_new_steps_on_the_next_read(tmp_path: Path) -> None:
    writer = rlgen.RolloutLog.create(tmp_path / "run")
    reader = rlgen.RolloutLog(tmp_path / "run")
    writer.append(0, scored([["yes", "no"]]))
    assert reader.steps == [0] and len(reader.rows()) == 2
    writer.append(1, scored([["yes", "no"]]))
    assert reader.steps == [0, 1] and len(reader.rows()) == 4


def test_temporary_files_of_an_unfinished_write_are_not_parts(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(0, scored([["yes", "no"]]))
    (tmp_path / "run" / "parts" / ".tmp-deadbeef").write_bytes(b"PAR1 half a file")
    assert log.steps == [0] and len(log.rows()) == 2


def test_sql_runs_over_the_rows_and_returns_pandas(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(0, scored([["yes", "no"]]))
    log.append(1, scored([["yes", "yes"]]))
    out = log.sql("select step, avg(reward) as mean from rows group by step order by step")
    assert out["mean"].tolist() == [0.5, 1.0]


def test_append_refuses_what_is_not_a_result_and_steps_a_file_name_cannot_carry(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    with pytest.raises(TypeError, match="append takes a result"):
        log.append(0, {"completion": ["x"]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step must be an int"):
        log.append(-1, scored([["yes"]]))
    with pytest.raises(ValueError, match="a part's name"):
        log.append(0, scored([["yes"]]), name="with space")
    assert os.listdir(tmp_path / "run") == ["log.json"]


def test_the_browser_reads_a_step_only_when_it_is_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    for step in (0, 5, 9):
        log.append(step, scored([["yes", "no"], ["no", "no"]]))
    loaded: list[int] = []
    load = log.load
    monkeypatch.setattr(log, "load", lambda s: loaded.append(s) or load(s))
    b = log.browse(step=5, widgets=False)
    assert loaded == [] and "step 5 (2 of 3 logged steps, 0..9)" in b.html() and loaded == [5]
    b.step = 9
    assert "step 9 (3 of 3" in b.html() and loaded == [5, 9]
    b.step = 5
    assert "step 5" in b.html() and loaded == [5, 9]  # kept: not read again
    with pytest.raises(ValueError, match="step 3 is not in this log"):
        log.browse(step=3)


def test_rows_named_by_part_and_row_load_back_with_the_frames_columns(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(0, scored([["yes", "no"]]))
    log.append(1, scored([["no", "yes"]]))
    rows = log.rows(columns=["completion"]).iloc[[3, 0]].assign(note=["last", "first"])
    res = log.load_rows(rows)
    assert res.df["completion"].tolist() == ["yes", "yes"] and res.df["note"].tolist() == ["last", "first"]
    assert res.df["step"].tolist() == [1, 0] and res.df["log_row"].tolist() == [1, 0]
    mixed = log.rows(columns=["completion"]).iloc[[1, 2, 0, 3]]  # part 0 row 1, part 1 row 0, part 0 row 0, ...
    again = log.load_rows(mixed)
    assert again.df["completion"].tolist() == mixed["completion"].tolist()
    assert list(zip(again.df["step"], again.df["log_row"])) == [(0, 1), (1, 0), (0, 0), (1, 1)]


def test_the_trend_plot_draws_four_panels_across_steps_and_marks_a_step(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    log = rlgen.RolloutLog.create(tmp_path / "run")
    log.append(0, scored([["yes", "no"], ["no", "no"]]))
    log.append(1, scored([["yes", "yes"], ["yes", "yes"]]))
    fig = log.plot.trend(mark=1)
    reward, length, finish, zero = fig.axes[:4]
    assert list(reward.lines[0].get_ydata()) == [0.25, 1.0] and list(reward.lines[1].get_ydata()) == [0.25, 1.0]
    assert list(length.lines[0].get_ydata()) == [2.25, 3.0] and list(zero.lines[0].get_ydata()) == [0.5, 1.0]
    assert [ln.get_label() for ln in finish.lines if not ln.get_label().startswith("_")] == ["stop"]
    assert all(ax.lines[-1].get_xdata()[0] == 1 for ax in (reward, length, finish, zero))  # the marked step
    assert fig._repr_png_()[:4] == b"\x89PNG"
    graded = log.plot.trend(threshold=2.0)  # no row reaches it: no flat pass-rate line, said in the title
    assert len(graded.axes[0].lines) == 1 and "no row reaches 2" in graded.axes[0].get_title()
