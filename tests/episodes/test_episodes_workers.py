"""rlgen.episodes._workers: plain calls on reused daemon threads, a hung call never in the way."""

from __future__ import annotations

import threading
import time

import pytest

from rlgen.episodes import _workers


def call(fn) -> tuple[threading.Event, dict]:
    done, box = threading.Event(), {}

    def job() -> None:
        box["thread"] = threading.get_ident()
        box["value"] = fn()
        done.set()

    _workers.run_in_worker(job)
    return done, box


@pytest.mark.timeout(30)
def test_calls_one_after_another_reuse_one_idle_worker() -> None:
    idle = _workers._idle  # workers earlier calls in this process left idle: any of them may take a call
    threads = set()
    for _ in range(20):
        done, box = call(lambda: 1)
        assert done.wait(5)
        threads.add(box["thread"])
        time.sleep(0.01)  # the worker is idle again before the next call
    assert len(threads) <= idle + 1  # a new thread per call gave 20


@pytest.mark.timeout(30)
def test_a_call_that_hangs_keeps_its_worker_and_never_delays_another_call() -> None:
    release = threading.Event()
    hung, _ = call(lambda: release.wait(20))
    started = time.monotonic()
    quick, box = call(lambda: "quick")
    assert quick.wait(5) and box["value"] == "quick" and time.monotonic() - started < 2
    assert not hung.is_set()
    release.set()
    assert hung.wait(5)


@pytest.mark.timeout(30)
def test_an_idle_worker_exits_after_its_idle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_workers, "IDLE_S", 0.2)
    done, box = call(lambda: 1)
    assert done.wait(5)
    worker = next(t for t in threading.enumerate() if t.ident == box["thread"])
    worker.join(5)
    assert not worker.is_alive()
    again, _ = call(lambda: 2)  # a new worker takes the next call
    assert again.wait(5)
