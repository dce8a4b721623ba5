"""Where a log lives and what survives: a writer SIGKILLed while appending (a real subprocess) leaves
every completed part and no partial one; a log at an s3:// URL on a real S3 API (moto's server mode,
started here: no mock of the filesystem layer) is written, read by another reader and re-scored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _logs import moto_s3, says_yes, scored

import rlgen

HERE = Path(__file__).resolve().parent
WRITER = """
import sys
sys.path.insert(0, {here!r})
from _logs import scored
import rlgen
log = rlgen.RolloutLog.create({path!r}, exist_ok=True)
big = scored([["yes", "no"] * 500] * 40)   # 40,000 rows: a part takes a while to write
step = len(log.steps)
while True:
    print("writing", step, flush=True)
    log.append(step, big)
    print("wrote", step, flush=True)
    step += 1
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("delay", [0.0, 0.15, 0.4])
def test_a_writer_killed_while_appending_leaves_every_completed_part_and_no_partial_one(tmp_path: Path,
                                                                                         delay: float) -> None:
    path = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", WRITER.format(here=str(HERE), path=str(path))],
                             stdout=subprocess.PIPE, text=True)
    try:
        wrote = []
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("wrote"):
                wrote.append(int(line.split()[1]))
            if line.startswith("writing") and len(wrote) >= 2:
                time.sleep(delay)  # somewhere inside the next append
                child.send_signal(signal.SIGKILL)
                break
    finally:
        child.kill()
        child.wait(30)
    log = rlgen.RolloutLog(path)
    # Every append the writer reported is there, and nothing else but whole later appends (it may
    # finish one or two more between our read of its output and the signal).
    assert set(wrote) <= set(log.steps) and log.steps == list(range(len(log.steps)))
    for step in log.steps:  # every part there is whole
        assert len(log.load(step)) == 40_000
    assert len(log.rows(columns=["reward"])) == 40_000 * len(log.steps)


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    with moto_s3(["-m", "moto.server", "-p"]) as options:
        yield options


@pytest.mark.timeout(180)
def test_a_log_at_an_s3_url_is_written_read_by_another_reader_and_rescored(s3: dict[str, str]) -> None:
    url = "s3://runs/exp1"
    log = rlgen.RolloutLog.create(url, storage_options=s3)
    log.append(0, scored([["yes", "no"], ["no", "no"]]))
    reader = rlgen.RolloutLog(url, storage_options=s3)
    assert reader.steps == [0]
    log.append(1, scored([["yes", "yes"], ["no", "yes"]]))
    assert reader.steps == [0, 1] and reader.trend()["reward"].tolist() == [0.25, 0.75]
    assert reader.load(1).df["completion"].tolist() == ["yes", "yes", "no", "yes"]
    with pytest.raises(rlgen.LogError, match="already has a part"):
        log.append(1, scored([["yes", "yes"]]))
    reader.rescore({"no": lambda completion: 1.0 - says_yes(completion)}, version="inverse", mode="inline",
                   progress=False)
    assert log.rewards("inverse")["reward"].tolist() == [0, 1, 1, 1, 0, 0, 1, 0]
    with pytest.raises(rlgen.LogError, match="nothing is there"):
        rlgen.RolloutLog("s3://runs/missing", storage_options=s3)


def test_a_second_writer_of_one_name_never_replaces_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlgen.rollout_log._store import open_store

    store = open_store(tmp_path)
    store.write_new(b"first", "parts", "a.parquet")
    monkeypatch.setattr(store, "exists", lambda *names: False)  # the other writer checked before the first wrote
    with pytest.raises(rlgen.LogError, match="never replaces"):
        store.write_new(b"second", "parts", "a.parquet")
    assert (tmp_path / "parts" / "a.parquet").read_bytes() == b"first"
    assert sorted(os.listdir(tmp_path / "parts")) == ["a.parquet"]  # no temporary file left


@pytest.mark.timeout(180)
def test_on_s3_the_trend_reads_summaries_and_an_index_and_a_step_is_listed_by_its_prefix(s3: dict[str, str]) -> None:
    import pandas as pd

    from rlgen.rollout_log._store import Store
    from rlgen.rollout_log._views import trend_table

    url = "s3://runs/summaries"
    log = rlgen.RolloutLog.create(url, storage_options=s3)
    for step in range(4):
        log.append(step, scored([["yes", "no"], ["no", "no"]] if step % 2 else [["yes", "yes"], ["no", "yes"]]))
    rows = log.rows(columns=["prompt_index", "completion_tokens", "finish_reason", "reward"])
    expected = trend_table(rows, rows["reward"].to_numpy(dtype=float), threshold=1.0)
    reader = rlgen.RolloutLog(url, storage_options=s3)
    pd.testing.assert_frame_equal(reader.trend(), expected, check_exact=False, rtol=1e-12)
    assert reader._cache.columns == {}
    assert log.write_summaries() == 0
    assert len([f for f in log._store.list("summaries") if f.startswith("index-")]) == 1
    pd.testing.assert_frame_equal(rlgen.RolloutLog(url, storage_options=s3).trend(), expected, check_exact=False, rtol=1e-12)
    listed: list[str] = []
    real = reader._store._fs.find

    def spy(path: str, prefix: str = "", **kwargs: object) -> object:
        listed.append(prefix)
        return real(path, prefix=prefix, **kwargs)

    reader._store._fs.find = spy
    try:
        assert reader.rows(steps=2, columns=["reward"])["reward"].tolist() == [1.0, 1.0, 0.0, 1.0]
    finally:
        del reader._store._fs.find
    assert listed == ["step-000000002."] and isinstance(reader._store, Store)
