"""rlgen.rewards math_verify_reward: math-verify's equality, None for no answer, loud timeouts and threads."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from rlgen.rewards import math_verify_match, math_verify_reward

mv = pytest.importorskip("math_verify", reason="math-verify is not installed (pip install 'rlgen[rewards]')")


@pytest.mark.parametrize("completion, answer, expected", [
    (r"so the answer is \boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    ("The total is 1,000.", "1000", 1.0),
    (r"$x + 1$", "$1 + x$", 1.0),
    (r"$x + 1$", "1 + x", 1.0),                 # a gold answer is read as LaTeX math
    (r"\boxed{1024}", "2^{10}", 1.0),
    (r"\boxed{\sqrt{2}}", r"\sqrt{2}", 1.0),
    (r"\boxed{3}", "4", 0.0),
    ("I cannot solve this.", "4", None),       # no parseable answer: cannot judge
    ("", "4", None),
])
def test_math_verify_reward_judges_mathematical_equality(completion, answer, expected) -> None:
    assert math_verify_reward(completion, answer) == expected


def test_a_gold_answer_math_verify_cannot_read_is_an_error_not_a_zero() -> None:
    for gold in ("", "$$"):
        with pytest.raises(ValueError, match="gold answer"):
            math_verify_reward(r"\boxed{3}", gold)


def _on_a_thread(fn: Any, *args: Any) -> Any:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # carried back to the test thread
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    return out


def test_off_the_main_thread_timeouts_raise_a_clear_error_instead_of_scoring() -> None:
    out = _on_a_thread(math_verify_reward, r"\boxed{3}", "3")
    assert isinstance(out.get("error"), RuntimeError)
    assert "process" in str(out["error"]) and "timeout_seconds=None" in str(out["error"])


def test_without_timeouts_it_runs_on_any_thread() -> None:
    f = math_verify_match(timeout_seconds=None)
    assert f.__name__ == "math_verify_no_timeout"
    assert _on_a_thread(f, r"\boxed{3}", "3") == {"value": 1.0}


def test_a_timeout_raises_timeout_error_rather_than_reading_as_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    from math_verify.errors import TimeoutException

    def slow_verify(*args: Any, **kwargs: Any) -> bool:
        raise TimeoutException("Timeout during comparison")

    monkeypatch.setattr(mv, "verify", slow_verify)
    with pytest.raises(TimeoutError, match="5 s"):
        math_verify_reward(r"\boxed{3}", "3")


def test_math_verify_match_checks_its_timeout() -> None:
    assert math_verify_match(timeout_seconds=2).__name__ == "math_verify"
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError):
            math_verify_match(timeout_seconds=bad)  # type: ignore[arg-type]
