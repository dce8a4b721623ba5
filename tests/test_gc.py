"""rlgen.core._gc: the cyclic GC paused for stretches that may overlap across threads."""

from __future__ import annotations

import gc
import threading

import pytest

from rlgen.core._gc import gc_paused


@pytest.fixture(autouse=True)
def gc_on():
    gc.enable()
    yield
    gc.enable()


def test_a_pause_stops_the_gc_and_resumes_it_after_the_block_even_when_it_raises() -> None:
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("inside")
    assert gc.isenabled()


def test_overlapping_pauses_in_two_threads_resume_the_gc_once_when_the_last_ends() -> None:
    # The old pattern (each block restores what it saw) left the GC paused for good when the
    # blocks ended in the order they began, and resumed it under the other block otherwise.
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait(5)

    with gc_paused():
        thread = threading.Thread(target=other)
        thread.start()
        assert inside.wait(5)
    assert not gc.isenabled()  # the other thread's block still runs
    leave.set()
    thread.join(5)
    assert gc.isenabled()


def test_a_gc_the_user_had_paused_stays_paused() -> None:
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_it_is_also_a_decorator() -> None:
    @gc_paused()
    def work() -> bool:
        return gc.isenabled()

    assert work() is False and work() is False and gc.isenabled()
