"""Math answers checked by math-verify: LaTeX, fractions, expressions, sets, equal when mathematically equal.

Owns: `math_verify_reward` and the `math_verify_match` factory, and the honest handling of
math-verify's timeouts. math-verify (optional extra `rlgen[rewards]`) is imported on the first
call, never at import. Knows nothing about how rewards are called or scheduled, beyond the one
fact that decides where this reward may run:

math-verify bounds each parse and each comparison with `signal.alarm`, which works only on a
process's main thread. Run these rewards in "process" mode (the reward harness's default: each
call runs on a worker process's main thread, where the alarms work). Off the main thread, with
timeouts on, the reward raises at once instead of letting math-verify fail or score 0; pass
`timeout_seconds=None` to `math_verify_match` to run there without math-verify's own timeouts.
A timeout raises TimeoutError (the row is an error, not a silent 0.0).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

from ._extra import require

__all__ = ["DEFAULT_TIMEOUT_S", "math_verify_match", "math_verify_reward"]

DEFAULT_TIMEOUT_S = 5  # math-verify's own default for parse and verify


def _check_thread(timeout_seconds: int | None, name: str) -> None:
    if timeout_seconds is not None and threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"{name} runs math-verify with timeouts, which use signal.alarm and work only on a process's main "
            f"thread, but it was called on thread {threading.current_thread().name!r}. Run it in 'process' mode "
            "(the reward harness's default), or use rlgen.rewards.math_verify_match(timeout_seconds=None) to run "
            "without math-verify's timeouts (a hung comparison then blocks its thread)."
        )


def _parse(mv: Any, timeout_exc: type[BaseException], text: str, timeout_seconds: int | None) -> list[Any]:
    # As math-verify's parse() with raise_on_error=False (an error means "nothing parsed"), except
    # that a timeout raises instead of reading as "no answer".
    try:
        return list(mv.parse(text, parsing_timeout=timeout_seconds, raise_on_error=True))
    except timeout_exc:
        raise TimeoutError(f"math-verify took more than {timeout_seconds} s to parse an answer") from None
    except Exception:
        return []


def _score(completion: str, answer: str, *, timeout_seconds: int | None, name: str) -> float | None:
    _check_thread(timeout_seconds, name)
    mv = require("math_verify", package="math-verify", needed_by=name)
    timeout_exc: type[BaseException] = require("math_verify.errors", package="math-verify", needed_by=name).TimeoutException

    gold_text = str(answer).strip()
    # The gold answer is read as LaTeX math: undelimited, math-verify would read "2^{10}" as 2 and
    # miss "x+1" and "\sqrt{2}" altogether. One already delimited is read as written.
    delimited = any(d in gold_text for d in ("$", "\\(", "\\[", "\\boxed"))
    gold = _parse(mv, timeout_exc, gold_text if delimited else f"${gold_text}$", timeout_seconds)
    if not gold:
        raise ValueError(
            f"math-verify found no answer in the gold answer {gold_text!r}; pass the final answer itself "
            "as LaTeX math (e.g. '42', '\\frac{1}{2}' or 'x^2+1')"
        )
    pred = _parse(mv, timeout_exc, completion, timeout_seconds)
    if not pred:
        return None
    # Pair by pair, as math-verify's verify() does, so that a comparison error counts as "not
    # equal" exactly as there, while a timeout raises instead of reading as a wrong answer.
    for g, p in itertools.product(gold, pred):
        try:
            if mv.verify(g, p, timeout_seconds=timeout_seconds, raise_on_error=True):
                return 1.0
        except timeout_exc:
            raise TimeoutError(f"math-verify took more than {timeout_seconds} s to compare two answers") from None
        except Exception:
            continue
    return 0.0


def math_verify_reward(completion: str, answer: str) -> float | None:
    """1.0 when math-verify finds the completion's final answer equal to `answer`, else 0.0.

    `answer` is the gold final answer, read as LaTeX math ("42", "\\frac{1}{2}", "x^2+1"; one that
    already has `$` delimiters is read as written). The completion's answer is
    what math-verify's default extraction finds (LaTeX, preferring `\\boxed{}`, or a plain
    expression). Returns None when the completion holds no answer math-verify can parse.
    Timeouts of 5 s per parse and per comparison; see the module doc for where it may run.

    Raises:
        ImportError: math-verify is not installed (pip install 'rlgen[rewards]').
        RuntimeError: called off the main thread (timeouts need it).
        TimeoutError: a parse or comparison took longer than its timeout.
        ValueError: `answer` holds no answer math-verify can parse.
    """
    return _score(completion, answer, timeout_seconds=DEFAULT_TIMEOUT_S, name="math_verify_reward")


def math_verify_match(*, timeout_seconds: int | None = DEFAULT_TIMEOUT_S) -> Callable[[str, str], float | None]:
    """`math_verify_reward` with another timeout; `timeout_seconds=None` runs without timeouts on any thread.

    The returned function is `f(completion, answer)`, named `math_verify` (or
    `math_verify_no_timeout`). Without timeouts a pathological expression can hang its call: use
    None only where something else bounds the call (e.g. the harness's per-call kill timeout).

    Raises:
        ValueError: `timeout_seconds` is not a positive int or None (here, at once).
    """
    if timeout_seconds is not None and (isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int)
                                        or timeout_seconds < 1):
        raise ValueError(f"timeout_seconds must be an int >= 1 (signal.alarm counts whole seconds) or None, got {timeout_seconds!r}")
    name = "math_verify" if timeout_seconds is not None else "math_verify_no_timeout"

    def reward(completion: str, answer: str) -> float | None:
        return _score(completion, answer, timeout_seconds=timeout_seconds, name=name)

    reward.__name__ = name
    reward.__doc__ = f"math-verify equality of the completion's answer and `answer` (timeout {timeout_seconds} s); None if none found."
    return reward
