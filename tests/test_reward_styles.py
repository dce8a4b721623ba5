"""rlgen.rewards._styles: reward functions as users write them, called unchanged, their returns read per row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlgen.rewards._styles import RowBatch, build_calls, check_value, check_values, detect_style


def rows(chat: bool = False) -> RowBatch:
    cols = {"prompt_index": [0, 0, 1], "prompt": ["p0", "p0", "p1"], "completion": ["4", "five", "7"],
            "answer": ["4", "4", "7"], "task": ["add", "add", "add"]}
    chats = [[{"role": "user", "content": "p0"}]] * 2 + [[{"role": "user", "content": "p1"}]] if chat else None
    return RowBatch(columns=cols, completion_ids=[[52], [8, 9], [55]], prompt_ids=[[1, 2], [1, 2], [3]],
                    data_columns=["answer", "task"], chats=chats)


def trl_reward(prompts, completions, completion_ids, **kwargs):
    return [1.0] * len(completions)


def trl_completions_only(completions, **kwargs):
    return [1.0] * len(completions)


def trl_ids_only(completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]


def trl_hooks(completion_ids, trainer_state=None, log_metric=None, **kwargs):
    return [0.0] * len(completion_ids)


def columns_with_kwargs(completion, **kwargs):
    return 1.0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


def areal_reward(prompt, completions, prompt_ids, completion_ids, **data):
    return 1.0


def by_row(row):
    return 1.0


def by_columns(completion, answer):
    return float(completion == answer)


@pytest.mark.parametrize("fn, style", [
    (trl_reward, "trl"), (trl_completions_only, "trl"), (trl_ids_only, "trl"), (trl_hooks, "trl"),
    (columns_with_kwargs, "columns"), (lambda completion_ids: 1.0, "columns"), (compute_score, "verl"), (areal_reward, "areal"),
    (by_row, "row"), (by_columns, "columns"), (lambda completion: 1.0, "columns"),
])
def test_the_style_is_read_from_the_parameter_names(fn, style) -> None:
    assert detect_style(fn) == style


def test_trl_functions_get_the_batch_with_chat_completions_as_trl_passes_them() -> None:
    calls = build_calls(trl_reward, "trl", rows(chat=True), columns={}, batch_size=2)
    assert [idx for idx, _, _ in calls] == [[0, 1], [2]]
    kwargs = calls[0][2]
    assert kwargs["completions"] == [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "five"}]]
    assert kwargs["prompts"][0] == [{"role": "user", "content": "p0"}]
    assert kwargs["completion_ids"] == [[52], [8, 9]] and kwargs["answer"] == ["4", "4"]
    assert "prompt_index" not in kwargs  # rlgen's own columns are not dataset columns


def test_a_trl_function_without_kwargs_gets_only_what_it_names() -> None:
    def f(completions, answer):
        return []

    (_, _, kwargs), = build_calls(f, "trl", rows(), columns={}, batch_size=8)
    assert set(kwargs) == {"completions", "answer"} and kwargs["completions"] == ["4", "five", "7"]


def test_verl_gets_one_row_with_the_answer_as_ground_truth_and_the_data_as_extra_info() -> None:
    calls = build_calls(compute_score, "verl", rows(), columns={}, batch_size=8)
    assert len(calls) == 3
    assert calls[1][2] == {"data_source": "add", "solution_str": "five", "ground_truth": "4",
                           "extra_info": {"answer": "4", "task": "add"}}


def test_columns_style_fills_each_parameter_from_its_column_or_the_mapped_one() -> None:
    def f(completion, gold):
        return 0.0

    calls = build_calls(f, "columns", rows(), columns={"gold": "answer"}, batch_size=8)
    assert [c[2] for c in calls][:2] == [{"completion": "4", "gold": "4"}, {"completion": "five", "gold": "4"}]


def test_a_parameter_without_a_column_fails_before_running_with_the_closest_name() -> None:
    def f(completion, answr):
        return 0.0

    with pytest.raises(ValueError, match="no column 'answr'; did you mean 'answer'"):
        build_calls(f, "columns", rows(), columns={}, batch_size=8)


def test_areal_gets_one_sample_with_its_ids() -> None:
    calls = build_calls(areal_reward, "areal", rows(), columns={}, batch_size=8)
    assert calls[2][2] == {"prompt": "p1", "completions": "7", "prompt_ids": [3], "completion_ids": [55],
                           "answer": "7", "task": "add"}


def test_row_style_gets_the_row_as_a_dict() -> None:
    calls = build_calls(by_row, "row", rows(), columns={}, batch_size=8)
    assert calls[0][1][0]["completion"] == "4" and calls[0][1][0]["answer"] == "4"


@pytest.mark.parametrize("value, status, value_out", [
    (1, "ok", 1.0), (True, "ok", 1.0), (np.float32(0.5), "ok", 0.5), (None, "none", math.nan),
    (float("nan"), "bad_return", math.nan), (float("inf"), "bad_return", math.nan), ("0.5", "bad_return", math.nan),
    ({"score": 0.25, "acc": True}, "ok", 0.25), ({"acc": 1}, "bad_return", math.nan),
])
def test_each_returned_value_gets_a_status(value, status, value_out) -> None:
    checked = check_value(value)
    assert checked.status == status
    assert (math.isnan(checked.value) and math.isnan(value_out)) or checked.value == value_out


def test_torch_and_numpy_scalars_are_numbers_per_row_and_inside_a_batch_list() -> None:
    import torch

    for value in (torch.tensor(0.25), torch.tensor([0.25]), torch.tensor(0.25, dtype=torch.float16),
                  np.float64(0.25), np.array(0.25), np.array([0.25]), {"score": torch.tensor(0.25)}):
        checked = check_value(value)
        assert (checked.status, checked.value) == ("ok", 0.25), value
    assert check_value(torch.tensor(True)).value == 1.0
    for wrong in (torch.tensor([0.25, 0.5]), np.array([0.25, 0.5]), torch.tensor(float("nan"))):
        assert check_value(wrong).status == "bad_return"
    batch = check_values([torch.tensor(1.0), np.float32(0.5), torch.tensor(0)], 3)
    assert [(c.status, c.value) for c in batch] == [("ok", 1.0), ("ok", 0.5), ("ok", 0.0)]
    as_tensor = check_values(torch.tensor([1.0, 0.5, 0.0]), 3)
    assert [(c.status, c.value) for c in as_tensor] == [("ok", 1.0), ("ok", 0.5), ("ok", 0.0)]


def test_a_dict_return_keeps_its_other_keys() -> None:
    assert check_value({"score": 1.0, "acc": True}).extra == {"acc": True}


def test_a_wrong_length_or_a_scalar_from_a_batch_function_marks_every_row_never_broadcasts() -> None:
    short = check_values([1.0, 0.0], 3)
    assert [c.status for c in short] == ["bad_return"] * 3 and "returned 2 values for 3" in (short[0].error or "")
    scalar = check_values(1.0, 3)
    assert [c.status for c in scalar] == ["bad_return"] * 3 and "not a list" in (scalar[0].error or "")
    assert [c.value for c in check_values([1, None, 0.5], 3)][::2] == [1.0, 0.5]
