"""rlgen.rewards.sanity_check: a reward must rank the oracle answer highest and empty or garbage lowest."""

from __future__ import annotations

import itertools

import pytest

from rlgen.rewards import answer_match, sanity_check

DATA = {"question": ["2+2?", "3+4?"], "answer": ["4", "7"]}


def test_a_sound_reward_passes_every_check() -> None:
    report = sanity_check(answer_match(extract="last_number"), DATA, mode="thread")
    assert report.passed and bool(report)
    assert set(report.table["check"]) == {"oracle scores highest", "empty scores lowest", "garbage scores lowest",
                                          "same value when repeated", "no errors"}
    assert len(report.scores) == 2 * (3 + 1 + 2)


def test_a_reward_that_likes_any_text_fails_the_garbage_check() -> None:
    def nonempty(completion: str) -> float:
        return float(bool(completion))

    report = sanity_check(nonempty, DATA, mode="thread")
    assert not report.passed
    assert set(report.failures()["check"]) == {"oracle scores highest", "garbage scores lowest"}


def test_a_reward_that_cannot_judge_the_oracle_fails_and_says_why() -> None:
    tagged = answer_match(extract="answer_tag")  # the oracle "4" has no <answer> tag: None
    report = sanity_check(tagged, DATA, mode="thread")
    oracle_rows = report.table[report.table["check"] == "oracle scores highest"]
    assert not oracle_rows["ok"].any() and "oracle got no value (none" in oracle_rows["detail"].iloc[0]
    fixed = sanity_check(tagged, DATA, oracle=lambda row: f"<answer>{row['answer']}</answer>", mode="thread")
    assert fixed.table.set_index("check").loc["oracle scores highest", "ok"].all()


def test_a_nondeterministic_reward_fails_the_repeat_check() -> None:
    counter = itertools.count()

    def drifting(completion: str, answer: str) -> float:
        return float(completion == answer) + 0.01 * next(counter)

    report = sanity_check(drifting, DATA, mode="inline")
    assert "same value when repeated" in set(report.failures()["check"])


@pytest.mark.timeout(60)
def test_a_crashing_reward_is_reported_in_the_pool_not_raised() -> None:
    def crashes_on_empty(completion: str) -> float:
        return 1.0 / len(completion)

    report = sanity_check(crashes_on_empty, DATA, mode="process", timeout=10)
    errors = report.failures()
    assert "no errors" in set(errors["check"]) and "ZeroDivisionError" in errors["detail"].str.cat()


def test_an_oracle_column_that_is_not_there_is_refused() -> None:
    with pytest.raises(ValueError, match="no column 'solution'"):
        sanity_check(answer_match(), DATA, oracle="solution")


def test_a_trl_function_for_chat_data_gets_chat_completions_when_given_the_chats() -> None:
    def trl_correct(prompts, completions, answer, **kwargs):
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

    chats = [[{"role": "user", "content": q}] for q in DATA["question"]]
    assert sanity_check(trl_correct, DATA, prompts=chats, mode="thread").passed


def test_an_oracle_that_scores_no_better_than_garbage_does_not_score_highest() -> None:
    def always_zero(completion: str) -> float:
        return 0.0

    report = sanity_check(always_zero, DATA, mode="thread")
    assert "oracle scores highest" in set(report.failures()["check"])


def test_the_headline_counts_the_checks_that_failed_not_those_that_passed() -> None:
    def nonempty(completion: str) -> float:
        return float(bool(completion))

    report = sanity_check(nonempty, DATA, mode="thread")
    n, failed = len(report.table), int((~report.table["ok"]).sum())
    assert repr(report).splitlines()[0] == (f"sanity_check: FAILED ({failed} of {n} checks failed, {n - failed} passed, "
                                            f"over {report.table['case'].nunique()} cases)")
    good = sanity_check(answer_match(extract="last_number"), DATA, mode="thread")
    assert repr(good).startswith(f"sanity_check: PASSED ({len(good.table)} of {len(good.table)} checks passed")
