"""rlgen.rewards reasoning-gym tasks: deterministic prompts and data, rewards maximal for the oracle answer."""

from __future__ import annotations

import json

import pytest

rg = pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'rlgen[rewards]')")

from rlgen.rewards import Task, reasoning_gym_task, tutorial_task  # noqa: E402

ARITH = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+"])


@pytest.fixture(scope="module")
def task() -> Task:
    return reasoning_gym_task("basic_arithmetic", size=8, seed=3, **ARITH)


def test_a_task_has_one_chat_and_one_data_row_per_question(task: Task) -> None:
    assert len(task) == len(task.prompts) == len(task.data) == 8
    assert list(task.data.columns) == ["question", "answer", "task", "metadata"]
    assert set(task.data.task) == {"basic_arithmetic"}
    for chat, question in zip(task.prompts, task.data.question):
        assert chat == [{"role": "user", "content": f"{question} Answer with just the number."}]


def test_the_same_seed_gives_the_same_task_and_another_seed_another(task: Task) -> None:
    again = reasoning_gym_task("basic_arithmetic", size=8, seed=3, **ARITH)
    other = reasoning_gym_task("basic_arithmetic", size=8, seed=4, **ARITH)
    assert again.prompts == task.prompts and again.data.equals(task.data)
    assert other.prompts != task.prompts


def test_the_questions_are_reasoning_gyms_own(task: Task) -> None:
    entries = list(rg.create_dataset("basic_arithmetic", size=8, seed=3, **ARITH))
    assert list(task.data.question) == [e["question"] for e in entries]
    assert list(task.data.answer) == [e["answer"] for e in entries]
    assert [json.loads(m) for m in task.data.metadata] == [json.loads(json.dumps(e["metadata"])) for e in entries]


def test_the_oracle_answer_scores_maximal_and_an_empty_completion_minimal(task: Task) -> None:
    assert task.reward.__name__ == "rg_basic_arithmetic"
    for row in task.data.itertuples():
        assert task.reward(f"<answer>{row.answer}</answer>", row.answer, row.metadata) == 1.0
        assert task.reward("", row.answer, row.metadata) == 0.0
        assert task.extract_reward(f"The answer is {row.answer}.", row.answer) == 1.0
        assert task.extract_reward("", row.answer) is None


def test_the_task_reward_reads_only_answer_tags_as_reasoning_gym_does(task: Task) -> None:
    row = next(task.data.itertuples())
    assert task.reward(str(row.answer), row.answer, row.metadata) == 0.0        # a bare number has no tag
    assert task.reward("<answer>-999</answer>", row.answer, row.metadata) == 0.0


def test_metadata_may_be_the_json_string_or_the_dict(task: Task) -> None:
    row = next(task.data.itertuples())
    tagged = f"<answer>{row.answer}</answer>"
    assert task.reward(tagged, row.answer, json.loads(row.metadata)) == 1.0
    with pytest.raises(TypeError, match="per-prompt data"):
        task.reward(tagged, row.answer, 42)


def test_the_data_round_trips_through_parquet(task: Task, tmp_path) -> None:
    import pandas as pd

    task.data.to_parquet(tmp_path / "t.parquet")
    back = pd.read_parquet(tmp_path / "t.parquet")
    assert back.astype(object).equals(task.data.astype(object))
    for row in back.itertuples():
        assert task.reward(f"<answer>{row.answer}</answer>", row.answer, row.metadata) == 1.0


def test_scoring_survives_metadata_that_json_cannot_keep_exactly() -> None:
    # arc_agi compares boards held as tuples in its metadata; JSON makes them lists.
    arc = reasoning_gym_task("arc_agi", size=2, seed=0, prompt_style="default")
    for row in arc.data.itertuples():
        assert arc.reward(f"<answer>{row.answer}</answer>", row.answer, row.metadata) == 1.0


@pytest.mark.parametrize("style", ["user", "system", "default"])
def test_prompt_styles_put_the_instruction_where_they_say(style) -> None:
    t = reasoning_gym_task("basic_arithmetic", size=1, seed=0, prompt_style=style, **ARITH)
    (chat,) = t.prompts
    question = t.data.question[0]
    if style == "user":
        assert chat == [{"role": "user", "content": f"{question} Answer with just the number."}]
    elif style == "system":
        assert chat == [{"role": "system", "content": "Answer with just the number."}, {"role": "user", "content": question}]
    else:
        assert chat[0]["role"] == "system" and "<answer>" in chat[0]["content"]
        assert chat[1] == {"role": "user", "content": question}


def test_a_custom_instruction_replaces_the_default() -> None:
    t = reasoning_gym_task("letter_counting", size=1, seed=0, instruction="Reply with one number.")
    assert t.prompts[0][0]["content"].endswith("Reply with one number.")


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="basic_arithmetik", size=2), "did you mean 'basic_arithmetic'"),
    (dict(name="basic_arithmetic", size=0), "size"),
    (dict(name="basic_arithmetic", size=2, prompt_style="chat"), "prompt_style"),
    (dict(name="basic_arithmetic", size=2, min_terms=0), "rejected the config"),
    (dict(name="basic_arithmetic", size=2, no_such_field=1), "rejected the config"),
])
def test_bad_task_settings_say_what_to_change(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        reasoning_gym_task(**kwargs)


def test_the_tutorial_task_is_a_preset_with_its_measured_sampling() -> None:
    t = tutorial_task(size=4, seed=0)
    assert t.name == "basic_arithmetic" and len(t) == 4 and t.prompt_style == "user"
    assert dict(t.sampling) == {"n": 8, "temperature": 0.7, "max_new_tokens": 32}
    assert all(" + " in q and "-" not in q and "(" not in q for q in t.data.question)
    assert t.prompts == tutorial_task(size=4, seed=0).prompts
    assert repr(t).startswith("Task('basic_arithmetic', size=4, seed=0")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_tutorial_task_generates_and_scores_on_the_cpu_backend(model_path: str, isolated: str) -> None:
    import rlgen

    task = tutorial_task(size=2)
    with rlgen.Engine(model_path, backend="cpu", progress=False) as eng:
        res = eng.generate(task.prompts, **{**task.sampling, "n": 2, "max_new_tokens": 16, "seed": 0})
    df = res.df.join(task.data[["answer", "metadata"]], on="prompt_index")
    extracted = [task.extract_reward(c, a) for c, a in zip(df.completion, df.answer)]
    scored = [task.reward(c, a, m) for c, a, m in zip(df.completion, df.answer, df.metadata)]
    assert len(df) == 4
    assert set(extracted) <= {None, 0.0, 1.0}
    assert all(0.0 <= s <= 1.0 for s in scored)
