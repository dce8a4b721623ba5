"""RolloutLog.rescore: a new reward version appended with its lineage, never overwriting, going on
where it stopped (failed rows retried), refusing a taken name (other functions, options or repeats),
contained like add_rewards (statuses, timeouts, every style), repeated for a stochastic reward, and
two processes scoring one version at once."""

from __future__ import annotations

import functools
import hashlib
import multiprocessing
import random
import re
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _logs import scored

import rlgen

CALLS: list[str] = []


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def strict(completion: str) -> float:
    CALLS.append(completion)
    return float(completion == "yes!")


def _log(tmp_path: Path, steps: int = 2) -> rlgen.RolloutLog:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    for step in range(steps):
        log.append(step, scored([["yes", "yes!"], ["no", "yes!"]]))
    return log


def test_a_rescore_is_a_new_version_beside_the_logged_one_and_the_parts_are_untouched(tmp_path: Path) -> None:
    log = _log(tmp_path)
    parts = _digest(tmp_path / "run" / "parts")
    assert log.rescore(strict, version="strict", mode="inline", progress=False) == "strict"
    assert _digest(tmp_path / "run" / "parts") == parts
    assert log.rewards()["reward"].tolist() == [1, 0, 0, 0] * 2
    again = log.rewards("strict")
    assert again["reward"].tolist() == [0, 1, 0, 1] * 2 and set(again["reward_strict_status"]) == {"ok"}
    assert again["advantage"].round(3).tolist()[:2] == [-0.707, 0.707]
    assert log.versions()["version"].tolist() == ["logged", "strict"]
    lineage = log.lineage("strict")
    (fn,) = lineage["functions"]
    assert fn["name"] == "strict" and "def strict(completion: str)" in fn["source"] and len(fn["source_sha256"]) == 64


def test_scoring_again_with_the_same_function_scores_only_the_parts_not_yet_scored(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.rescore(strict, version="strict", mode="inline", progress=False)
    CALLS.clear()
    before = _digest(tmp_path / "run" / "rewards")
    log.rescore(strict, version="strict", mode="inline", progress=False)
    assert CALLS == [] and _digest(tmp_path / "run" / "rewards") == before
    log.append(7, scored([["yes!", "no"]]))
    log.rescore(strict, version="strict", mode="inline", progress=False)
    assert CALLS == ["yes!", "no"]
    assert log.rewards("strict", steps=7)["reward"].tolist() == [1.0, 0.0]


def test_an_edited_function_under_a_taken_version_name_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.rescore({"strict": strict}, version="v2", mode="inline", progress=False)
    before = _digest(tmp_path / "run")
    edited = {"strict": lambda completion: float(completion.startswith("yes"))}
    with pytest.raises(rlgen.LogError, match=r"reward version 'v2' exists with other functions or options \('strict': its source changed\).*version='v2_2'"):
        log.rescore(edited, version="v2", mode="inline", progress=False)
    with pytest.raises(ValueError, match="not 'logged'"):
        log.rescore(edited, version="logged", mode="inline", progress=False)
    assert _digest(tmp_path / "run") == before


def test_a_partials_parameters_are_its_lineage_and_change_its_hash(tmp_path: Path) -> None:
    def at_least(completion: str, *, length: int) -> float:
        return float(len(completion) >= length)

    log = _log(tmp_path)
    log.rescore({"long": functools.partial(at_least, length=3)}, version="long3", mode="inline", progress=False)
    log.rescore({"long": functools.partial(at_least, length=4)}, version="long4", mode="inline", progress=False)
    three, four = (log.lineage(v)["functions"][0] for v in ("long3", "long4"))
    assert three["params"] == {"length": 3} and four["params"] == {"length": 4}
    assert three["source_sha256"] != four["source_sha256"]
    assert log.rewards("long4")["reward"].tolist() == [0, 1, 0, 1] * 2


def test_failures_are_per_row_statuses_as_in_add_rewards(tmp_path: Path) -> None:
    def picky(completion: str) -> float:
        if completion == "no":
            raise ValueError("cannot judge 'no'")
        return 1.0

    log = _log(tmp_path, steps=1)
    log.rescore(picky, version="picky", mode="thread", progress=False)
    got = log.rewards("picky")
    assert got["reward_picky_status"].tolist() == ["ok", "ok", "error", "ok"]
    assert np.isnan(got["reward"].iat[2]) and "cannot judge" in got["reward_picky_error"].iat[2]


@pytest.mark.timeout(120)
def test_a_slow_row_times_out_in_the_process_pool_and_the_rest_are_scored(tmp_path: Path) -> None:
    def slow_on_no(completion: str) -> float:
        if completion == "no":
            time.sleep(30)
        return 1.0

    log = _log(tmp_path, steps=1)
    log.rescore(slow_on_no, version="slow", mode="process", timeout=2, workers=2, progress=False)
    assert log.rewards("slow")["reward_slow_on_no_status"].tolist() == ["ok", "ok", "timeout", "ok"]


def test_a_trl_style_batch_function_is_scored_with_its_token_ids(tmp_path: Path) -> None:
    def tokens(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        return [float(len(ids)) for ids in completion_ids]

    log = _log(tmp_path, steps=1)
    log.rescore(tokens, version="tokens", mode="inline", progress=False)
    assert log.rewards("tokens")["reward"].tolist() == [3.0, 4.0, 2.0, 4.0]


def test_a_stochastic_reward_repeated_shows_its_spread_per_row(tmp_path: Path) -> None:
    rng = random.Random(0)

    def judge(completion: str) -> float:
        return rng.random() if completion == "no" else 1.0

    log = _log(tmp_path, steps=1)
    log.rescore(judge, version="judge", repeats=5, mode="inline", progress=False)
    got = log.rewards("judge")
    assert got["reward_std"].tolist()[:2] == [0.0, 0.0] and got["reward_std"].iat[2] > 0.05
    assert (got["reward_min"] <= got["reward"]).all() and (got["reward"] <= got["reward_max"]).all()
    assert log.lineage("judge")["repeats"] == 5


def test_a_taken_version_name_with_other_options_or_other_repeats_is_refused_saying_what_differs(tmp_path: Path) -> None:
    log = _log(tmp_path, steps=1)
    log.rescore({"strict": strict}, version="v", mode="inline", progress=False)
    before = _digest(tmp_path / "run")
    with pytest.raises(rlgen.LogError, match=r"'v' exists with other functions or options \(advantage 'grpo' -> 'rloo'\)"):
        log.rescore({"strict": strict}, version="v", advantage="rloo", mode="inline", progress=False)
    with pytest.raises(rlgen.LogError, match=r"'v' exists with other functions or options \(repeats 1 -> 3\)"):
        log.rescore({"strict": strict}, version="v", repeats=3, mode="inline", progress=False)
    assert _digest(tmp_path / "run") == before


SLOW = {"on": True}


def slow_on_no_while_on(completion: str) -> float:
    if completion == "no" and SLOW["on"]:
        time.sleep(3)
    return float(completion == "yes!")


@pytest.mark.timeout(120)
def test_rows_that_timed_out_are_retried_when_the_same_version_is_scored_again(tmp_path: Path) -> None:
    log = _log(tmp_path, steps=2)
    run = dict(version="slow", repeats=2, mode="thread", timeout=1, progress=False)
    SLOW["on"] = True
    with pytest.warns(UserWarning, match=r"4 rows of reward version 'slow' stay failed \(4 timeout\): call rescore "
                                         r"again with the same functions and version to retry them"):
        log.rescore(slow_on_no_while_on, **run)  # type: ignore[arg-type]
    assert log.rewards("slow")["reward_slow_on_no_while_on_status"].tolist() == ["ok", "ok", "timeout", "ok"] * 2
    SLOW["on"] = False
    first = _digest(tmp_path / "run" / "rewards" / "slow")
    log.rescore(slow_on_no_while_on, **run)  # type: ignore[arg-type]
    got = log.rewards("slow")
    assert got["reward_slow_on_no_while_on_status"].tolist() == ["ok"] * 8
    assert got["reward"].tolist() == [0, 1, 0, 1] * 2 and got["reward_std"].tolist() == [0.0] * 8
    # The group columns are those of the rows scored at once: retried rows rejoin their groups.
    log.rescore(slow_on_no_while_on, **{**run, "version": "at_once"})  # type: ignore[arg-type]
    at_once = log.rewards("at_once")
    for column in ("group_mean", "group_std", "group_zero_std", "advantage"):
        assert got[column].tolist() == at_once[column].tolist(), column
    # Append-only: the first files stay as they were; a retry file of each part supersedes them.
    now = _digest(tmp_path / "run" / "rewards" / "slow")
    assert {k: now[k] for k in first} == first
    assert sorted(set(now) - set(first)) == sorted(k.replace(".parquet", ".retry-0001.parquet")
                                                   for k in first if k.endswith(".parquet"))
    CALLS.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing failed is left: silent, nothing scored
        log.rescore(slow_on_no_while_on, **run)  # type: ignore[arg-type]
    assert _digest(tmp_path / "run" / "rewards" / "slow") == now


def slow_strict(completion: str) -> float:
    time.sleep(0.05)
    return float(completion == "yes!")


def _rescorer(path: str, version: str, barrier: Any, results: Any) -> None:
    log = rlgen.RolloutLog(path)
    barrier.wait(timeout=120)
    try:
        log.rescore(slow_strict, version=version, mode="inline", progress=False)
        results.put("ok")
    except Exception as err:  # every outcome reported, to be checked by the test
        results.put(f"{type(err).__name__}: {err}")


@pytest.mark.timeout(300)
def test_a_second_rescore_of_one_version_at_once_is_told_another_process_is_scoring_it(tmp_path: Path) -> None:
    log = _log(tmp_path, steps=4)
    ctx = multiprocessing.get_context("spawn")
    said = []
    for version in ("v1", "v2", "v3"):
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_rescorer, args=(str(tmp_path / "run"), version, barrier, results))
                 for _ in range(2)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(30)
        assert "ok" in outcomes, outcomes
        said += [o for o in outcomes if o != "ok"]
        log.rescore(slow_strict, version=version, mode="inline", progress=False)  # goes on where they stopped
        assert log.rewards(version)["reward"].tolist() == [0, 1, 0, 1] * 4
    assert said, "the two processes never met: nothing was tested"
    for message in said:
        assert re.match(r"LogError: reward version 'v\d' is being scored by another process: it wrote .* while this "
                        r"call was scoring it\. Nothing is lost or doubled .* call rescore again with the same "
                        r"functions and version", message), message
