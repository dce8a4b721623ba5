"""rlgen.rollouts._groups: what the reward layer reads of a result (the rows, the user's data columns)
and how rows group, without a server."""

from __future__ import annotations

from pathlib import Path

from rlgen.rollouts import Rollouts, rollouts_from_responses
from rlgen.rollouts._groups import group_keys, row_batch


def verl_rows() -> Rollouts:
    """Two prompts x 2 samples with a verl dataset's columns: `data_source` and `reward_model`."""
    entries = [{"text": t, "output_ids": [5], "meta_info": {"finish_reason": {"type": "stop"}}}
               for t in ("4", "5", "9", "9")]
    res = rollouts_from_responses(entries, prompt_ids=[[1], [2]], n=2, pad_token_id=0)
    return res.with_columns({"data_source": ["gsm8k"] * 4,
                             "reward_model": [{"style": "rule", "ground_truth": "4"}] * 2
                             + [{"style": "rule", "ground_truth": "9"}] * 2})


def test_a_verl_reward_model_column_reaches_kwargs_and_extra_info_and_rlgen_s_reward_columns_do_not() -> None:
    def verl_score(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str == extra_info["reward_model"]["ground_truth"])

    def from_kwargs(completion, **kwargs):
        return float(completion == kwargs["reward_model"]["ground_truth"])

    # verl's own signature: ground_truth comes from the reward_model column's dict via columns=
    res = verl_rows().with_columns({"ground_truth": ["4", "4", "9", "9"]})
    first = res.add_rewards({"verl": verl_score}, mode="inline", progress=False)
    assert first.df["reward_verl"].tolist() == [1.0, 0.0, 1.0, 1.0]
    second = first.add_rewards({"kw": from_kwargs}, mode="inline", progress=False)
    assert second.df["reward_kw"].tolist() == [1.0, 0.0, 1.0, 1.0]
    rows = row_batch(second.df, completion_ids=second.id_lists(), prompt_ids=second.id_lists("prompt"),
                     data_columns=second.data_columns)
    assert "reward_model" in rows.data_columns and "data_source" in rows.data_columns
    assert not [c for c in rows.data_columns if c.startswith("reward_verl") or c == "reward"]


def test_rows_group_by_prompt_within_their_run() -> None:
    a, b = verl_rows(), verl_rows()
    both = Rollouts.concat([a, b], labels=["a", "b"])
    keys = group_keys(both.df)
    assert len(set(keys.tolist())) == 4 and len(set(group_keys(a.df).tolist())) == 2


def test_group_keys_are_integers_that_any_pandas_groups_right() -> None:
    # Joined strings such as "run\x000" were one group under pandas 3.0.6 (it cut them at the NUL).
    both = Rollouts.concat([verl_rows(), verl_rows()], labels=["a", "b"])
    keys = group_keys(both.df)
    assert keys.dtype.kind == "i" and keys.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_parquet_file_written_before_the_layout_change_still_loads() -> None:
    # Written by rlgen at 641880a (the flat package) with rewards, logprobs and data columns.
    path = Path(__file__).parent / "data" / "rollouts-641880a.parquet"
    res = Rollouts.from_parquet(path)
    assert res.df["completion"].tolist() == ["4", "5", "nine", "9"]
    assert res.df["reward"].tolist() == [1.0, 0.0, 0.0, 1.0] and res.data_columns[0] == "answer"
    assert res.model == "old-model" and res.run_sampling[res.df["run"][0]] == {"temperature": 1.0}
    assert res.tensors()["response_ids"].tolist()[2] == [21, 22, 2]
    assert res.logprobs is not None and res.logprobs[2, 1].item() == -1.5
    rescored = res.add_rewards({"again": lambda completion, answer: float(completion == answer)}, mode="inline",
                               progress=False)
    assert rescored.df["advantage"].round(6).tolist() == [0.707007, -0.707007, -0.707007, 0.707007]
