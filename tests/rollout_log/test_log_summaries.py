"""rlgen.RolloutLog's per-part summaries: the trend from them equals the trend computed from the
rows (failed rows, several parts a step, other finish reasons), a log written without them (before
rlgen kept them) reads the same and gets them from `write_summaries`, and a step's rows are found
by their name prefix, not a listing of every part."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _logs import call, scored

import rlgen
from rlgen.rollout_log._store import Store
from rlgen.rollout_log._views import trend_table

NAN = float("nan")


def _mixed(path: Path) -> rlgen.RolloutLog:
    """Steps 0-3: a main part each (step 2 with failed rows), an eval part at steps 1 and 3 (cut
    rows, a group with one scored row), and step 3's main part with no finite reward at all."""
    log = rlgen.RolloutLog.create(path)
    log.append(0, scored([["yes", "no"], ["no", "no"]]))
    log.append(1, scored([["yes", "yes", "no"], ["yes", "yes", "yes"]]))
    log.append(1, call([["abc", "de"], ["x", "yz"]], rewards=[[0.5, NAN], [2.0, 2.0]], finish="length"), name="eval")
    log.append(2, call([["a", "bb"], ["ccc", "d"]], rewards=[[1.0, NAN], [NAN, 0.0]]))
    log.append(3, call([["a", "bb"]], rewards=[[NAN, NAN]]))
    log.append(3, call([["a", "bb", "c"]], rewards=[[1.0, 1.0, 0.25]], finish="length"), name="eval")
    return log


def _listings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[str, ...], str]]:
    """From now on, every `Store.list` call's (folder names, prefix), in order."""
    listed: list[tuple[tuple[str, ...], str]] = []
    real = Store.list

    def spy(self: Store, *names: str, prefix: str = "") -> list[str]:
        listed.append((names, prefix))
        return real(self, *names, prefix=prefix)

    monkeypatch.setattr(Store, "list", spy)
    return listed


def _from_rows(log: rlgen.RolloutLog, threshold: float = 1.0) -> pd.DataFrame:
    rows = log.rows(columns=["prompt_index", "completion_tokens", "finish_reason", "reward"])
    return trend_table(rows, rows["reward"].to_numpy(dtype=float), threshold=threshold)


def test_the_trend_from_summaries_equals_the_trend_from_the_rows(tmp_path: Path) -> None:
    log = _mixed(tmp_path / "run")
    assert len(list((tmp_path / "run" / "summaries").iterdir())) == 6
    fresh = rlgen.RolloutLog(tmp_path / "run")
    trend = fresh.trend()
    assert fresh._cache.columns == {}  # no part's columns were read: only the summaries
    pd.testing.assert_frame_equal(trend, _from_rows(log), check_exact=False, rtol=1e-12)
    assert trend.loc[3, "rows"] == 5 and trend.loc[3, "scored"] == 3 and trend.loc[2, "scored"] == 2
    assert set(trend.columns) >= {"finish_stop", "finish_length"}
    pd.testing.assert_frame_equal(fresh.trend(steps=[1, 3]), _from_rows(log).loc[[1, 3]], check_exact=False, rtol=1e-12)


def test_another_threshold_or_reward_version_reads_the_rows_and_agrees(tmp_path: Path) -> None:
    log = _mixed(tmp_path / "run")
    pd.testing.assert_frame_equal(log.trend(threshold=0.5), _from_rows(log, 0.5), check_exact=False, rtol=1e-12)
    log.rescore({"reward": lambda completion: float(len(completion))}, version="len", mode="inline", progress=False)
    by_version = log.trend(version="len")
    rows = log.rows(columns=["prompt_index", "completion_tokens", "finish_reason"])
    expected = trend_table(rows, log.rewards("len")["reward"].to_numpy(dtype=float), threshold=1.0)
    pd.testing.assert_frame_equal(by_version, expected)


def test_a_log_without_summaries_reads_the_same_and_write_summaries_adds_them(tmp_path: Path) -> None:
    log = _mixed(tmp_path / "run")
    expected = _from_rows(log)
    shutil.rmtree(tmp_path / "run" / "summaries")  # as rlgen before summaries wrote it
    old = rlgen.RolloutLog(tmp_path / "run")
    pd.testing.assert_frame_equal(old.trend(), expected, check_exact=False, rtol=1e-12)
    (tmp_path / "run" / "summaries").mkdir()
    (tmp_path / "run" / "summaries" / "step-000000000.main.deadbeef.json").write_text("{not json")  # a stray
    assert old.write_summaries() == 6 and old.write_summaries() == 0
    again = rlgen.RolloutLog(tmp_path / "run")
    pd.testing.assert_frame_equal(again.trend(), expected, check_exact=False, rtol=1e-12)
    assert again._cache.columns == {}


def test_a_part_some_summaries_lack_is_read_from_its_rows_and_a_summary_without_its_part_is_ignored(tmp_path: Path) -> None:
    log = _mixed(tmp_path / "run")
    expected = _from_rows(log)
    summaries = sorted((tmp_path / "run" / "summaries").iterdir())
    summaries[2].unlink()  # a part appended before summaries, among ones after
    (tmp_path / "run" / "summaries" / "step-000000009.main.0badcafe.json").write_text(summaries[0].read_text())
    fresh = rlgen.RolloutLog(tmp_path / "run")
    pd.testing.assert_frame_equal(fresh.trend(), expected, check_exact=False, rtol=1e-12)
    assert list(fresh._cache.columns) == [summaries[2].name.replace(".json", ".parquet")]


def test_a_failed_part_write_leaves_no_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    real = Store.write_new

    def refuse_parts(self: Store, data: bytes, *names: str) -> str:
        if names[0] == "parts":
            raise OSError("disk full")
        return real(self, data, *names)

    monkeypatch.setattr(Store, "write_new", refuse_parts)
    with pytest.raises(OSError):
        log.append(0, scored([["yes", "no"]]))
    monkeypatch.undo()
    assert list((tmp_path / "run" / "summaries").iterdir()) == [] and log.steps == []
    log.append(0, scored([["yes", "no"]]))
    assert log.trend()["reward"].tolist() == [0.5]


def test_a_steps_rows_are_listed_by_its_prefix_not_the_whole_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    for step in range(12):
        log.append(step, scored([["yes", "no"]]))
    log.append(5, scored([["no", "no"]]), name="eval")
    listed = _listings(monkeypatch)
    rows = log.rows(steps=5, columns=["reward"])
    assert listed == [(("parts",), "step-000000005.")]
    assert sorted(rows["reward"].tolist()) == [0.0, 0.0, 0.0, 1.0] and set(rows["step"]) == {5}
    assert np.array_equal(log.rows(steps=[5, 7])["step"].unique(), [5, 7])
    assert len(log.rows(steps=range(12))) == 26 and log.load(5, name="eval").df["completion"].tolist() == ["no", "no"]


def test_an_index_gathers_the_summaries_into_one_file_and_later_parts_add_to_it(tmp_path: Path) -> None:
    log = _mixed(tmp_path / "run")
    assert log.write_summaries() == 0  # every part has one: only the index is written
    folder = tmp_path / "run" / "summaries"
    indexes = sorted(folder.glob("index-*.json"))
    assert len(indexes) == 1
    for single in folder.glob("step-*.json"):
        single.unlink()  # the index alone is enough
    log.append(4, scored([["yes", "no"]]))
    fresh = rlgen.RolloutLog(tmp_path / "run")
    pd.testing.assert_frame_equal(fresh.trend(), _from_rows(log), check_exact=False, rtol=1e-12)
    assert fresh._cache.columns == {}
    assert log.write_summaries() == 0 and len(list(folder.glob("index-*.json"))) == 2
    assert log.write_summaries() == 0 and len(list(folder.glob("index-*.json"))) == 2  # nothing new: no index


def test_every_256th_append_of_a_log_object_indexes_the_summaries_and_a_reader_then_lists_only_indexes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    res = scored([["yes", "no"]])
    for step in range(255):
        log.append(step, res)
    folder = tmp_path / "run" / "summaries"
    assert list(folder.glob("index-*.json")) == []
    log.append(255, res)  # the 256th part: its summaries and the 255 before go into one index
    assert len(list(folder.glob("index-*.json"))) == 1
    log.append(256, res)  # after the index: read by its name
    listed = _listings(monkeypatch)
    fresh = rlgen.RolloutLog(tmp_path / "run")
    trend = fresh.trend()
    assert len(trend) == 257 and trend["reward"].tolist() == [0.5] * 257
    assert listed == [(("parts",), ""), (("summaries",), "index-")]  # no listing of the single summaries
    assert fresh._cache.columns == {}  # every step from a summary: no part's rows read


def test_a_reader_finds_single_summaries_beyond_the_direct_reads_by_one_listing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlgen.rollout_log._parts as parts

    monkeypatch.setattr(parts, "_DIRECT_READS", 2)
    log = _mixed(tmp_path / "run")
    fresh = rlgen.RolloutLog(tmp_path / "run")
    pd.testing.assert_frame_equal(fresh.trend(), _from_rows(log), check_exact=False, rtol=1e-12)
    assert fresh._cache.columns == {}
