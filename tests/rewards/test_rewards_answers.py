"""rlgen.rewards answer extraction and matching: what each method finds, and the answer_match reward."""

from __future__ import annotations

import pytest

from rlgen.rewards import answer_match, answers_match, extract_answer, parse_number


@pytest.mark.parametrize("text, expected", [
    ("<answer>7</answer>", "7"),
    ("<answer>1</answer> no wait <answer> 2 </answer>", "2"),              # the last tag wins
    ("<answer>\n  multi\n  line\n</answer>", "multi\n  line"),
    ("<answer>  </answer>", None),                                       # an empty answer is none
    ("<answer>7", None),                                                 # unclosed
    ("no tags here 42", None),
])
def test_answer_tag_takes_the_last_non_empty_tag(text, expected) -> None:
    assert extract_answer(text, "answer_tag") == expected


@pytest.mark.parametrize("text, expected", [
    (r"so \boxed{42}.", "42"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),                            # nested braces
    (r"\boxed{\frac{\sqrt{2}}{2}} is it", r"\frac{\sqrt{2}}{2}"),
    (r"first \boxed{1} then \boxed{ 2 }", "2"),                          # the last one wins
    (r"\boxed {3}", "3"),
    (r"\boxed{1} and \boxed{unbalanced", "1"),                           # an unclosed box is skipped
    ("no box", None),
])
def test_boxed_reads_the_last_balanced_box(text, expected) -> None:
    assert extract_answer(text, "boxed") == expected


@pytest.mark.parametrize("text, expected", [
    ("Natalia sold 48 clips... #### 72", "72"),
    ("#### 1,000\n", "1,000"),
    ("#### 3\nmore text\n####  5 ", "5"),
    ("####", None),
    ("no hash 4", None),
])
def test_hash_reads_gsm8k_final_answers(text, expected) -> None:
    assert extract_answer(text, "hash") == expected


@pytest.mark.parametrize("text, expected", [
    ("The answer is 7.", "7"),
    ("It costs -3 dollars", "-3"),
    ("x = -3.5", "-3.5"),
    ("about .5 of it", ".5"),
    ("2.5 then 3", "3"),
    ("total: 1,234,567.89", "1,234,567.89"),
    ("1,2,3", "3"),                                                       # a list, not thousands
    ("3-4", "4"),                                                         # a binary minus is no sign
    ("2+2=4", "4"),
    ("= −7", "−7"),                                                       # Unicode minus
    ("no digits at all", None),
    ("", None),
])
def test_last_number_finds_signed_decimal_and_grouped_numbers(text, expected) -> None:
    assert extract_answer(text, "last_number") == expected


@pytest.mark.parametrize("text, expected", [
    (r"<answer>5</answer> \boxed{6} #### 7 and 8", "5"),
    (r"\boxed{6} #### 7 and 8", "6"),
    ("#### 7 and 8", "7 and 8"),
    ("just 8 here", "8"),
    ("<answer> </answer> then 9", "9"),                                    # an empty tag falls through
    ("nothing", None),
])
def test_auto_tries_tag_then_boxed_then_hash_then_last_number(text, expected) -> None:
    assert extract_answer(text, "auto") == expected


def test_an_unknown_extract_method_is_named_with_the_choices() -> None:
    with pytest.raises(ValueError, match="'last_number'"):
        extract_answer("1", "lastnumber")  # type: ignore[arg-type]


@pytest.mark.parametrize("text, expected", [
    ("1,000", 1000.0), ("1000.0", 1000.0), (" 42. ", 42.0), ("-3", -3.0), ("−3", -3.0), ("+2", 2.0),
    ("$5", 5.0), ("50%", 50.0), (".5", 0.5),
    ("1,00", None), ("seven", None), ("", None), ("1e5", None), ("inf", None), ("nan", None), ("3/4", None),
])
def test_parse_number_reads_numbers_as_written_and_nothing_else(text, expected) -> None:
    assert parse_number(text) == expected


@pytest.mark.parametrize("pred, gold, expected", [
    ("1,000", "1000", True),
    ("1000.0", "1,000", True),
    ("1000.0001", "1000", True),      # within 1e-6 relative
    ("1000.01", "1000", False),
    ("-0", "0", True),
    ("0.000001", "0", False),         # relative tolerance: only 0 matches 0
    ("seven", "7", False),            # a non-number prediction is wrong, not an error
])
def test_numeric_matching_ignores_formatting_within_a_relative_tolerance(pred, gold, expected) -> None:
    assert answers_match(pred, gold, compare="numeric") is expected


def test_exact_matching_compares_stripped_strings() -> None:
    assert answers_match(" 7 ", "7", compare="exact")
    assert not answers_match("7.0", "7", compare="exact")


def test_a_non_numeric_gold_answer_cannot_be_compared_numerically() -> None:
    with pytest.raises(ValueError, match="compare='exact'"):
        answers_match("7", "seven", compare="numeric")


def test_answer_match_is_one_zero_or_none_when_no_answer_was_found() -> None:
    f = answer_match(extract="last_number")
    assert f.__name__ == "answer_last_number"
    assert f("so it is 12", "12") == 1.0
    assert f("so it is 1,2", "12") == 0.0
    assert f("I don't know", "12") is None
    assert f("it is 12", 12) == 1.0                               # a gold given as a number
    assert f("it is 72", "She sold 48 + 24 clips.\n#### 72") == 1.0  # GSM8K-style gold


def test_answer_match_names_say_how_it_extracts_and_compares() -> None:
    assert answer_match().__name__ == "answer_auto"
    assert answer_match(extract="boxed", compare="exact").__name__ == "answer_boxed_exact"


def test_answer_match_rejects_unknown_settings_at_once() -> None:
    with pytest.raises(ValueError, match="extract"):
        answer_match(extract="tags")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compare"):
        answer_match(compare="fuzzy")  # type: ignore[arg-type]
