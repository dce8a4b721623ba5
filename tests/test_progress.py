"""Progress: when it shows, the start-up PhaseLine, and ProgressLine (a line per call, then its totals)."""

from __future__ import annotations

import io
import threading

import pytest

from rlgen.core._progress import PhaseLine, ProgressLine, in_notebook, progress_enabled


def test_auto_progress_honours_tqdm_disable_but_an_explicit_true_wins(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert progress_enabled(None) is False
    assert progress_enabled(True) is True
    monkeypatch.setenv("TQDM_DISABLE", "0")
    assert progress_enabled(None) is True
    assert progress_enabled(None, environ={}) is True


def test_progress_rejects_values_other_than_bool_or_none():
    with pytest.raises(TypeError, match="progress"):
        progress_enabled("yes")  # type: ignore[arg-type]


def test_pytest_is_not_a_notebook():
    assert in_notebook() is False


# -- PhaseLine ---------------------------------------------------------------------------------------


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_phase_line_in_a_log_file_writes_one_plain_line_per_phase():
    out = io.StringIO()  # not a live terminal: a log file, a pipe, CI output
    line = PhaseLine("sglang", mode="terminal", file=out, show=True)
    for second in range(2000):
        line.update("loading weights" if second < 1000 else "capturing cuda graphs", second / 10)
    line.update("ready", 200)
    line.close(ok=True)  # the same text as the last update: not written twice
    assert out.getvalue().splitlines() == [
        "sglang: loading weights (0s)", "sglang: capturing cuda graphs (100s)", "sglang: ready (200s)"]
    assert "\r" not in out.getvalue()


def test_phase_line_rewrites_a_live_terminal_in_place_and_erases_longer_text():
    out = FakeTTY()
    line = PhaseLine("srv", mode="terminal", file=out, show=True, min_interval_s=0.0)
    line.update("a much longer phase name", 1)
    line.update("short", 2)
    line.update("short", 3)  # elapsed changes are shown on a live terminal
    segments = out.getvalue().split("\r")[1:]
    expected = ["srv: a much longer phase name (1s)", "srv: short (2s)", "srv: short (3s)"]
    assert [s.rstrip() for s in segments] == expected
    assert len(segments[1]) == len(segments[0])  # padded with spaces over the old text
    assert "\n" not in out.getvalue()


def test_phase_line_failure_names_the_phase_it_failed_in():
    out = io.StringIO()
    with pytest.raises(RuntimeError), PhaseLine("srv", mode="terminal", file=out, show=True) as line:  # noqa: PT012 - the failure happens inside the block under test
        line.update("loading weights", 7)
        raise RuntimeError("boom")
    assert out.getvalue().splitlines()[-1] == "srv: failed during 'loading weights' (7s)"
    assert line.closed


def test_phase_line_shows_nothing_when_disabled(monkeypatch):
    out = io.StringIO()
    line = PhaseLine("srv", mode="terminal", file=out, show=False)
    line.update("x", 1)
    line.close(ok=True)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    auto = PhaseLine("srv", mode="terminal", file=out)
    auto.update("x", 1)
    auto.close(ok=False)
    assert out.getvalue() == ""


def test_phase_line_in_a_notebook_updates_one_display_in_place(monkeypatch):
    import IPython.display

    shown: list = []

    class Handle:
        def update(self, obj, raw=False):
            shown.append(("update", obj["text/html"]))

    def fake_display(obj, raw=False, display_id=False):
        shown.append(("display", obj["text/html"]))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    line = PhaseLine("srv", mode="notebook", show=True, min_interval_s=0.0)
    line.update("loading <weights>", 1)
    line.update("capturing graphs", 2)
    line.close(ok=False, message="out of memory")
    assert [kind for kind, _ in shown] == ["display", "update", "update"]
    assert "loading &lt;weights&gt;" in shown[0][1]
    assert "srv: out of memory during &#x27;capturing graphs&#x27; (2s)" in shown[-1][1]


def test_phase_line_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        PhaseLine("srv", mode="html")


# -- ProgressLine ------------------------------------------------------------------------------------


class Clock:
    """A fake perf_counter for ProgressLine."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr("rlgen.core._progress.time.perf_counter", fake)
    return fake


def test_a_fast_call_in_auto_mode_prints_nothing(clock):
    out = FakeTTY()
    with ProgressLine("generate", total=8, mode="terminal", file=out) as line:
        clock.now += 0.5
        line.advance(8, tokens=100)
    assert out.getvalue() == ""


def test_a_slow_call_shows_its_progress_after_a_second_then_one_line_of_totals(clock):
    out = FakeTTY()
    with ProgressLine("generate", total=64, mode="terminal", file=out, min_interval_s=0.0) as line:
        clock.now += 0.5
        line.tick()  # still within the delay: nothing yet
        assert out.getvalue() == ""
        clock.now += 1.0
        line.tick()  # the call has run 1.5 s with nothing finished: the line appears at 0
        line.advance(16, tokens=2000)
        clock.now += 2.5
        line.advance(48, tokens=6000)
    frames = [f.rstrip() for f in out.getvalue().split("\r")[1:]]
    assert frames[0] == "generate 0/64 samples · 1.5 s"
    assert frames[1] == "generate 16/64 samples · 1.5 s"
    assert frames[2] == "generate 64/64 samples · 4.0 s"
    assert frames[-1] == "generate: 64 samples · 8,000 tokens · 2,000 tok/s · 4.0 s"
    assert out.getvalue().endswith("\n")


def test_progress_true_shows_at_once_and_false_never(clock):
    out = FakeTTY()
    with ProgressLine("score", total=2, unit="row", mode="terminal", file=out, show=True) as line:
        line.advance(1)
    assert out.getvalue().split("\r")[1].rstrip() == "score 1/2 rows · 0.0 s"
    silent = FakeTTY()
    with ProgressLine("score", total=2, unit="row", mode="terminal", file=silent, show=False) as line:
        clock.now += 10
        line.advance(2)
    assert silent.getvalue() == ""


def test_an_interrupted_call_says_where_it_stopped(clock):
    out = FakeTTY()
    with pytest.raises(KeyboardInterrupt), ProgressLine("generate", total=64, mode="terminal", file=out) as line:  # noqa: PT012 - the interruption happens inside the block under test
        line.advance(37)
        clock.now += 4.2
        raise KeyboardInterrupt
    assert out.getvalue().split("\r")[-1].strip() == "generate: stopped after 37/64 samples (KeyboardInterrupt) · 4.2 s"


def test_a_log_file_gets_only_the_totals_line(clock):
    out = io.StringIO()
    with ProgressLine("generate", total=4, mode="terminal", file=out, min_interval_s=0.0) as line:
        for _ in range(4):
            clock.now += 1
            line.advance(1, tokens=10)
            line.tick()
    assert out.getvalue() == "generate: 4 samples · 40 tokens · 10 tok/s · 4.0 s\n"


def test_advances_from_another_thread_count_but_draw_only_in_the_owner_thread(clock):
    out = FakeTTY()
    line = ProgressLine("generate", total=10, mode="terminal", file=out, show=True, min_interval_s=0.0)
    worker = threading.Thread(target=lambda: [line.advance(1, tokens=3) for _ in range(10)])
    worker.start()
    worker.join()
    assert out.getvalue() == "" and line.done == 10 and line.tokens == 30
    line.tick()
    assert out.getvalue().split("\r")[-1].rstrip() == "generate 10/10 samples · 0.0 s"


def test_a_saved_notebook_holds_the_final_totals_not_a_stale_zero(monkeypatch, clock):
    import IPython.display

    outputs: dict[str, dict] = {}  # what the notebook holds: one output per display, replaced on update

    class Handle:
        def update(self, obj, raw=False):
            outputs["line"] = obj

    def fake_display(obj, raw=False, display_id=False):
        assert raw and display_id
        outputs["line"] = obj
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    with ProgressLine("generate", total=8, mode="notebook", min_interval_s=0.0) as line:
        clock.now += 2
        line.tick()
        assert "0/8 samples" in outputs["line"]["text/plain"] and "<progress" in outputs["line"]["text/html"]
        line.advance(8, tokens=64)
    assert outputs["line"]["text/plain"] == "✓ generate: 8 samples · 64 tokens · 32 tok/s · 2.0 s"
    assert "0/8" not in outputs["line"]["text/html"] and "<progress" not in outputs["line"]["text/html"]
