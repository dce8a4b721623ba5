"""Writers racing for one (step, name): processes started together at a barrier, round after round,
locally and on an S3 API; exactly one appends, the others get the documented LogError, and a claim
left by a writer killed mid-append is reported with what to do."""

from __future__ import annotations

import multiprocessing
import os
import queue
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _logs import call, moto_s3

import rlgen

WRITERS = 4
REFUSED = re.compile(r"already has a part 'main'|part 'main' is claimed by pid \d+ on .* and not written yet")


def _appender(path: str, rounds: int, barrier: Any, results: Any, storage_options: dict[str, Any] | None) -> None:
    """One writer: at each round, waits for the others, then appends that round's step."""
    log = rlgen.RolloutLog(path, storage_options=storage_options)
    res = call([["yes", "no"], ["no", "no"]], rewards=[[1.0, 0.0], [0.0, 0.0]])
    for step in range(rounds):
        barrier.wait(timeout=120)
        try:
            log.append(step, res)
            results.put((step, "ok"))
        except rlgen.LogError as err:
            results.put((step, str(err)))
        except Exception as err:  # reported, so that the test says what went wrong
            results.put((step, f"unexpected {type(err).__name__}: {err}"))


def _race(path: str, rounds: int, storage_options: dict[str, Any] | None = None) -> dict[int, list[str]]:
    """`WRITERS` processes append steps 0..rounds-1 of one log, all released together each round;
    what each append said, by step."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(WRITERS), ctx.Queue()
    procs = [ctx.Process(target=_appender, args=(path, rounds, barrier, results, storage_options))
             for _ in range(WRITERS)]
    for p in procs:
        p.start()
    said: dict[int, list[str]] = {}
    try:
        for _ in range(WRITERS * rounds):
            step, outcome = results.get(timeout=180)
            said.setdefault(step, []).append(outcome)
    except queue.Empty:
        pytest.fail(f"the writers stopped answering; heard so far: {said}")
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return said


def _check_one_per_step(log: rlgen.RolloutLog, said: dict[int, list[str]], rounds: int) -> None:
    for step in range(rounds):
        outcomes = said[step]
        assert outcomes.count("ok") == 1, f"step {step}: {outcomes}"
        refused = [o for o in outcomes if o != "ok"]
        assert len(refused) == WRITERS - 1 and all(REFUSED.search(o) for o in refused), f"step {step}: {refused}"
    parts = log.parts()
    assert parts.groupby("step").size().tolist() == [1] * rounds  # one `main` part per step, never two
    assert log.trend()["rows"].tolist() == [4] * rounds


@pytest.mark.timeout(600)
def test_of_four_processes_appending_one_step_together_exactly_one_succeeds_every_round(tmp_path: Path) -> None:
    rounds = 20
    log = rlgen.RolloutLog.create(tmp_path / "run")
    said = _race(str(tmp_path / "run"), rounds)
    _check_one_per_step(log, said, rounds)
    assert sorted(os.listdir(tmp_path / "run" / "claims")) == [f"step-{s:09d}.main.claim" for s in range(rounds)]


def test_a_claim_left_by_a_killed_writer_refuses_the_step_saying_whose_claim_and_what_to_do(tmp_path: Path) -> None:
    from rlgen.rollout_log._parts import CLAIMS, PartName, claim_record

    log = rlgen.RolloutLog.create(tmp_path / "run")
    res = call([["yes", "no"]], rewards=[[1.0, 0.0]])
    log.append(0, res)
    # What a writer killed between its claim and its part leaves behind: the claim alone.
    dead = PartName.new(1, "main")
    assert log._store.claim(claim_record(dead), CLAIMS, dead.claim_file)
    claim = tmp_path / "run" / "claims" / dead.claim_file
    with pytest.raises(rlgen.LogError, match=rf"step 1's part 'main' is claimed by pid {os.getpid()} on .* for "
                       rf"{dead.file} and not written yet: .*killed mid-append.*delete the claim {re.escape(str(claim))}"):
        log.append(1, res)
    assert log.steps == [0]  # the reads never see a claim
    log.append(1, res, name="eval")  # another name at that step is free
    claim.unlink()
    log.append(1, res)
    assert sorted(zip(log.parts()["step"], log.parts()["name"])) == [(0, "main"), (1, "eval"), (1, "main")]


def test_a_result_that_cannot_be_written_leaves_no_claim(tmp_path: Path) -> None:
    log = rlgen.RolloutLog.create(tmp_path / "run")
    res = call([["yes", "no"]], rewards=[[1.0, 0.0]])
    with pytest.raises(rlgen.LogError, match="'step' column"):
        log.append(3, res.with_columns({"step": [7, 7]}))
    log.append(3, res)
    assert log.steps == [3]


SERIAL_MOTO = """
import sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
run_simple("127.0.0.1", int(sys.argv[1]), DomainDispatcherApplication(create_backend_app), threaded=False)
"""


@pytest.fixture(scope="module")
def serial_s3() -> Iterator[dict[str, Any]]:
    """moto's S3 API, serving one request at a time. S3 decides a conditional PUT atomically; moto's
    threaded server checks, then stores, in two steps two threads can interleave: one request at a
    time gives S3's guarantee (and the claims' PUTs race from separate processes as on S3)."""
    with moto_s3(["-c", SERIAL_MOTO]) as options:
        yield options


@pytest.mark.timeout(600)
def test_on_s3_of_four_processes_appending_one_step_together_exactly_one_succeeds_every_round(
        serial_s3: dict[str, Any]) -> None:
    rounds = 10
    url = "s3://runs/race"
    log = rlgen.RolloutLog.create(url, storage_options=serial_s3)
    assert log._store.atomic_create  # the claim is a conditional PUT here, not a check then a PUT
    said = _race(url, rounds, serial_s3)
    _check_one_per_step(log, said, rounds)
