"""Final answers in free text: finding them and comparing them with a gold answer.

Owns: the extraction methods (`<answer>` tags, `\\boxed{}`, GSM8K's `####`, the last number, and
"auto", which tries them in that order), exact and numeric comparison, and the `answer_match`
reward factory built on both. Pure standard library, so it is cheap to import and to ship to
worker processes. Knows nothing about how rewards are called, about models, or about datasets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Literal, get_args

__all__ = ["COMPARE_METHODS", "EXTRACT_METHODS", "CompareMethod", "ExtractMethod", "answer_match",
           "answers_match", "extract_answer", "parse_number"]

ExtractMethod = Literal["auto", "answer_tag", "boxed", "hash", "last_number"]
CompareMethod = Literal["exact", "numeric"]
EXTRACT_METHODS: tuple[str, ...] = get_args(ExtractMethod)
COMPARE_METHODS: tuple[str, ...] = get_args(CompareMethod)

# The text between the tags, across lines; stripped afterwards (reasoning-gym's `extract_answer`
# reads the same span and strips it too).
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\s*\{")
_HASH = re.compile(r"####[ \t]*([^\n]*)")
# A number as people write it: an optional sign, then digits with comma thousands separators
# (1,234,567) or plain digits, then an optional decimal part; or a bare decimal (.5). The sign
# counts only where it cannot be a binary minus ("3-4" ends in 4, not -4).
_NUMBER = re.compile(
    r"(?:(?<![\w.)\]])[-−+])?"
    r"(?:\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|(?<!\d)\.\d+)"
)
_WHOLE_NUMBER = re.compile(r"[-−+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)")


def _last_tag(text: str) -> str | None:
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


def _last_boxed(text: str) -> str | None:
    """The contents of the last balanced `\\boxed{...}`; braces inside it may nest."""
    result: str | None = None
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            char = text[i]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    result = text[start:i].strip()
                    break
    return result


def _last_hash(text: str) -> str | None:
    found = _HASH.findall(text)
    return found[-1].strip() if found else None


def _last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


_EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "answer_tag": _last_tag,
    "boxed": _last_boxed,
    "hash": _last_hash,
    "last_number": _last_number,
}


def extract_answer(text: str, method: ExtractMethod = "auto") -> str | None:
    """The final answer written in `text`, or None when `method` finds none.

    Methods (each takes the *last* occurrence, where models put their final answer):

    - "answer_tag": between `<answer>` and `</answer>` (reasoning-gym's format), stripped.
    - "boxed": inside `\\boxed{...}`, nested braces included (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`).
    - "hash": after GSM8K's `####`, to the end of that line.
    - "last_number": the last number: `-3`, `2.5`, `.5`, `1,234` (returned as written).
    - "auto": the first of answer_tag, boxed, hash, last_number that finds something.

    An empty answer (`<answer> </answer>`) counts as none found.

    Raises:
        ValueError: an unknown method.
    """
    if method == "auto":
        for extract in _EXTRACTORS.values():
            found = extract(text)
            if found:
                return found
        return None
    try:
        extract = _EXTRACTORS[method]
    except KeyError:
        raise ValueError(f"unknown extract method {method!r}; use one of {', '.join(map(repr, EXTRACT_METHODS))}") from None
    return extract(text) or None


def parse_number(text: str) -> float | None:
    """`text` as a number, or None when it is not one number.

    Accepts what `extract_answer` returns and what gold answers look like: surrounding spaces, a
    sign (also the Unicode minus), thousands separators (`1,000`), a decimal part, a trailing
    period, a leading `$` or a trailing `%` (kept as written: `50%` is 50). Never returns NaN or
    infinity.
    """
    s = text.strip().rstrip(".").strip()
    s = s.removeprefix("$").removesuffix("%").strip()
    if not _WHOLE_NUMBER.fullmatch(s):
        return None
    value = float(s.replace(",", "").replace("−", "-"))
    return value if math.isfinite(value) else None


def answers_match(pred: str, gold: str, *, compare: CompareMethod = "numeric") -> bool:
    """Whether the answer `pred` equals the gold answer `gold`.

    - "exact": equal after stripping surrounding whitespace.
    - "numeric": both parse as numbers (`parse_number`: `1,000` == `1000` == `1000.0`) and agree
      within a relative tolerance of 1e-6. A `pred` that is not a number does not match. A `gold`
      that is not a number raises, since no prediction could ever match it.

    Raises:
        ValueError: an unknown compare method, or a non-numeric gold answer with compare="numeric".
    """
    if compare == "exact":
        return pred.strip() == gold.strip()
    if compare != "numeric":
        raise ValueError(f"unknown compare method {compare!r}; use one of {', '.join(map(repr, COMPARE_METHODS))}")
    gold_value = parse_number(gold)
    if gold_value is None:
        raise ValueError(
            f"the gold answer {gold!r} is not a number, so compare='numeric' can never match it; "
            "pass the final numeric answer, or use compare='exact'"
        )
    pred_value = parse_number(pred)
    return pred_value is not None and math.isclose(pred_value, gold_value, rel_tol=1e-6, abs_tol=0.0)


def answer_match(*, extract: ExtractMethod = "auto", compare: CompareMethod = "numeric") -> Callable[[str, str], float | None]:
    """A reward: 1.0 when the completion's extracted answer matches the row's `answer`, else 0.0.

    The returned function is called once per row as `f(completion, answer)` (`answer` is the
    per-prompt gold answer you pass with the prompts). Its `__name__` is `answer_<extract>` (plus
    `_exact` for exact comparison), so its column is e.g. `reward_answer_last_number`.

    It returns None, not 0.0, when the completion holds no answer that `extract` can find: "no
    answer found" is a format problem, not a wrong answer, and keeping it apart shows it (it is
    counted as "none" in the reward summary). A gold answer written GSM8K-style (a solution ending
    in `#### 42`) is reduced to what follows the `####`.

    Raises:
        ValueError: an unknown extract or compare method (here, at once).
    """
    if extract not in EXTRACT_METHODS:
        raise ValueError(f"unknown extract method {extract!r}; use one of {', '.join(map(repr, EXTRACT_METHODS))}")
    if compare not in COMPARE_METHODS:
        raise ValueError(f"unknown compare method {compare!r}; use one of {', '.join(map(repr, COMPARE_METHODS))}")

    def reward(completion: str, answer: str) -> float | None:
        pred = extract_answer(completion, extract)
        if pred is None:
            return None
        gold = str(answer)
        if "####" in gold:
            gold = _last_hash(gold) or gold
        return 1.0 if answers_match(pred, gold, compare=compare) else 0.0

    name = f"answer_{extract}" + ("_exact" if compare == "exact" else "")
    reward.__name__ = name
    reward.__doc__ = f"1.0 when the answer found by extract={extract!r} matches `answer` ({compare}), 0.0 if not, None if none found."
    return reward
