"""Rollouts: rows, padded tensors and their alignment, selection, concat, parquet (pure CPU)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from rlgen import compare_logprobs
from rlgen.client._answer import failed_entry
from rlgen.rollouts import Rollouts, rollouts_from_responses

PAD = 0


def lp_of(token_id: int, position: int) -> float:
    """A logprob that encodes its token id and position, so misalignment shows up as a wrong value."""
    return -(token_id + position / 1000) / 100


def entry(
    ids: list[int],
    *,
    finish: str = "stop",
    matched: int | str | None = None,
    logprobs: bool = True,
    top_k: int = 0,
    text_in_logprobs: bool = False,
    input_ids: list[int] | None = None,
    rid: str = "rid",
) -> dict:
    meta: dict = {
        "id": rid,
        "finish_reason": {"type": finish, "matched": matched},
        "prompt_tokens": 0 if input_ids is None else len(input_ids),
        "completion_tokens": len(ids),
        "cached_tokens": 1,
        "e2e_latency": 0.25,
        "weight_version": "v1",
    }
    if logprobs:
        meta["output_token_logprobs"] = [
            [lp_of(t, j), t, f"<{t}>" if text_in_logprobs else None] for j, t in enumerate(ids)
        ]
    if top_k:
        meta["output_top_logprobs"] = [
            [[lp_of(t, j) - a, t + a, None] for a in range(top_k)] for j, t in enumerate(ids)
        ]
    if input_ids is not None:
        meta["input_token_logprobs"] = [[None if j == 0 else lp_of(t, j), t, None] for j, t in enumerate(input_ids)]
    return {"text": " ".join(map(str, ids)), "output_ids": ids, "meta_info": meta}


PROMPTS = [[101, 102, 103], [201]]


def two_by_two(*, sampling: dict | None = None, **kw) -> Rollouts:
    """2 prompts x n=2: lengths 3, 1, 0 (aborted), 4; prompt lengths 3 and 1."""
    responses = [
        entry([5, 6, 7], matched=7, **kw),
        entry([9], finish="length", **kw),
        entry([], finish="abort", **kw),
        entry([1, 2, 3, 4], matched="###", **kw),
    ]
    return rollouts_from_responses(
        responses, prompt_ids=PROMPTS, prompt_texts=["first <b>", None], n=2, pad_token_id=PAD, model="tiny",
        sampling=sampling,
    )


# -- padding, dtypes, alignment ------------------------------------------------------------------


def test_prompt_ids_are_left_padded_with_the_pad_token_and_masked():
    res = rollouts_from_responses([entry([1]), entry([2])], prompt_ids=[[7, 8, 9], [4]], n=1, pad_token_id=-1)
    assert res.prompt_ids.tolist() == [[7, 8, 9], [-1, -1, 4]]
    assert res.prompt_mask.tolist() == [[True, True, True], [False, False, True]]


def test_response_ids_are_right_padded_with_the_pad_token_and_masked():
    res = rollouts_from_responses([entry([1, 2, 3]), entry([4])], prompt_ids=[[7], [8]], n=1, pad_token_id=-1)
    assert res.response_ids.tolist() == [[1, 2, 3], [4, -1, -1]]
    assert res.response_mask.tolist() == [[True, True, True], [True, False, False]]


def test_tensors_have_the_documented_dtypes_and_shapes():
    res = two_by_two(top_k=2)
    t = res.tensors()
    expected = {
        "prompt_ids": (torch.int64, (4, 3)),
        "prompt_mask": (torch.bool, (4, 3)),
        "response_ids": (torch.int64, (4, 4)),
        "response_mask": (torch.bool, (4, 4)),
        "input_ids": (torch.int64, (4, 7)),
        "attention_mask": (torch.bool, (4, 7)),
        "logprobs": (torch.float32, (4, 4)),
        "lengths": (torch.int64, (4,)),
        "top_logprobs": (torch.float32, (4, 4, 2)),
        "top_ids": (torch.int64, (4, 4, 2)),
        "loss_mask": (torch.bool, (4, 4)),
    }
    assert torch.equal(t["loss_mask"], t["response_mask"])  # single-turn: every response token was sampled
    assert {k: (v.dtype, tuple(v.shape)) for k, v in t.items()} == expected


def test_input_ids_put_response_token_j_at_column_p_plus_j():
    res = two_by_two()
    p = res.prompt_ids.shape[1]
    assert torch.equal(res.input_ids[:, p:], res.response_ids)
    assert torch.equal(res.input_ids[:, :p], res.prompt_ids)
    assert torch.equal(res.attention_mask, torch.cat([res.prompt_mask, res.response_mask], dim=1))
    assert res.input_ids[3, p:].tolist() == [1, 2, 3, 4]


def test_each_logprob_belongs_to_the_response_token_at_the_same_position():
    res = two_by_two()
    for i in range(len(res)):
        for j in range(int(res.lengths[i])):
            expected = lp_of(int(res.response_ids[i, j]), j)
            assert res.logprobs[i, j].item() == pytest.approx(expected, abs=1e-6), (i, j)


def test_masked_positions_hold_zero_logprobs_and_pad_in_top_k():
    res = two_by_two(top_k=3)
    off = ~res.response_mask
    assert off.any()
    assert (res.logprobs[off] == 0.0).all()
    assert (res.top_logprobs[off] == 0.0).all()
    assert (res.top_ids[off] == PAD).all()
    assert (res.response_ids[off] == PAD).all()


def test_top_k_alternatives_line_up_with_their_token_position():
    res = two_by_two(top_k=3)
    # row 3, position 2 is token 3: alternatives are ids 3, 4, 5 with logprobs lp - 0, -1, -2
    assert res.top_ids[3, 2].tolist() == [3, 4, 5]
    assert res.top_logprobs[3, 2].tolist() == pytest.approx([lp_of(3, 2) - a for a in range(3)], abs=1e-6)


def test_lengths_equal_completion_tokens_and_the_mask_sums():
    res = two_by_two()
    assert res.lengths.tolist() == [3, 1, 0, 4]
    assert res.lengths.tolist() == res.df.completion_tokens.tolist()
    assert res.response_mask.sum(1).tolist() == res.lengths.tolist()


def test_rows_are_grouped_prompt_major_with_n_samples_per_prompt():
    res = two_by_two()
    assert res.df.prompt_index.tolist() == [0, 0, 1, 1]
    assert res.df.sample_index.tolist() == [0, 1, 0, 1]
    assert res.prompt_ids[:, -1].tolist() == [103, 103, 201, 201]
    assert res.df.prompt.iloc[0] == "first <b>" and pd.isna(res.df.prompt.iloc[2])


def test_rows_record_finish_reason_matched_stop_and_server_fields():
    res = two_by_two()
    df = res.df
    assert df.finish_reason.tolist() == ["stop", "length", "abort", "stop"]
    assert df.matched_stop.tolist() == [7, None, None, "###"]
    assert df.request_latency_s.tolist() == [0.25] * 4
    assert df.weight_version.tolist() == ["v1"] * 4
    assert df.cached_tokens.tolist() == [1] * 4
    assert df.completion.iloc[0] == "5 6 7"
    assert list(df.columns[:4]) == ["prompt_index", "sample_index", "prompt", "completion"]


def test_failed_and_aborted_samples_keep_a_row_with_empty_output():
    responses = [
        entry([5]),
        None,
        failed_entry("client timeout", reason="abort", rid="r-3"),
        {"error": {"message": "bad request"}},
    ]
    res = rollouts_from_responses(responses, prompt_ids=[[1, 2], [3]], n=2, pad_token_id=PAD)
    assert len(res) == 4
    assert res.df.finish_reason.tolist() == ["stop", "error", "abort", "error"]
    assert res.df.error.iloc[2] == "client timeout" and res.df.error.iloc[3] == "bad request"
    assert res.df.rid.iloc[2] == "r-3"
    assert res.lengths.tolist() == [1, 0, 0, 0]
    assert res.df.prompt_tokens.tolist() == [0, 2, 1, 1]  # from the client's ids when the server gave none
    assert math.isnan(res.df.logprob_sum.iloc[1])


def test_failed_response_rejects_an_unknown_reason():
    with pytest.raises(ValueError, match="reason"):
        failed_entry("x", reason="stop")


def test_logprob_sum_and_mean_are_computed_per_row_and_nan_without_logprobs():
    res = two_by_two()
    expected = sum(lp_of(t, j) for j, t in enumerate([5, 6, 7]))
    assert res.df.logprob_sum.iloc[0] == pytest.approx(expected, abs=1e-5)
    assert res.df.logprob_mean.iloc[0] == pytest.approx(expected / 3, abs=1e-5)
    assert res.df.logprob_sum.iloc[2] == 0.0 and math.isnan(res.df.logprob_mean.iloc[2])  # empty row
    none = two_by_two(logprobs=False)
    assert none.df.logprob_sum.isna().all() and none.df.logprob_mean.isna().all()
    assert none.logprobs is None and "logprobs" not in none.tensors()


def test_rows_without_logprobs_among_rows_with_them_get_nan_at_real_positions_only():
    responses = [entry([4, 5]), entry([6, 7, 8], logprobs=False)]
    res = rollouts_from_responses(responses, prompt_ids=[[1], [2]], pad_token_id=PAD)
    assert torch.isnan(res.logprobs[1]).tolist() == [True, True, True]
    assert not torch.isnan(res.logprobs[0]).any() and res.logprobs[0, 2].item() == 0.0
    assert math.isnan(res.df.logprob_sum.iloc[1]) and not math.isnan(res.df.logprob_sum.iloc[0])


def test_output_ids_fall_back_to_the_logprob_token_ids():
    e = entry([4, 5, 6])
    del e["output_ids"]
    res = rollouts_from_responses([e], prompt_ids=[[1]], pad_token_id=PAD)
    assert res.response_ids.tolist() == [[4, 5, 6]]


def test_misaligned_logprobs_become_nan_with_a_warning_and_an_error_note():
    short = entry([4, 5, 6])
    short["meta_info"]["output_token_logprobs"].pop()
    shifted = entry([7, 8])
    shifted["meta_info"]["output_token_logprobs"][0][1] = 99
    with pytest.warns(RuntimeWarning, match="do not line up"):
        res = rollouts_from_responses([short, shifted, entry([3])], prompt_ids=[[1], [2], [3]], pad_token_id=PAD)
    assert torch.isnan(res.logprobs[0, :3]).all() and torch.isnan(res.logprobs[1, :2]).all()
    assert not torch.isnan(res.logprobs[2]).any()
    assert "2 output logprobs for 3 output ids" in res.df.error.iloc[0]
    assert "differ" in res.df.error.iloc[1]
    assert pd.isna(res.df.error.iloc[2])


def test_prompt_logprobs_align_to_the_end_of_the_prompt_with_nan_first():
    full = entry([5], input_ids=[11, 12, 13])
    tail = entry([6], input_ids=[22, 23])  # logprob_start_len=1: the server skipped the first token
    tail["meta_info"]["input_token_logprobs"][0][0] = lp_of(22, 1)
    res = rollouts_from_responses([full, tail], prompt_ids=[[11, 12, 13], [21, 22, 23, 24][:3]], pad_token_id=PAD)
    pl = res.prompt_logprobs
    assert math.isnan(pl[0, 0]) and pl[0, 1].item() == pytest.approx(lp_of(12, 1), abs=1e-6)
    assert math.isnan(pl[1, 0]) and pl[1, 1].item() == pytest.approx(lp_of(22, 1), abs=1e-6)


def test_meta_info_is_kept_per_row_without_the_per_token_lists():
    res = two_by_two(top_k=2)
    assert res.meta_info[3]["finish_reason"]["matched"] == "###"
    assert "output_token_logprobs" not in res.meta_info[0] and "output_top_logprobs" not in res.meta_info[0]
    assert res.meta_info[0]["weight_version"] == "v1"


def test_token_texts_from_the_server_are_kept_for_display():
    res = two_by_two(text_in_logprobs=True)
    assert res.tokens(3)["texts"] == ["<1>", "<2>", "<3>", "<4>"]
    assert two_by_two().tokens(3)["texts"] is None


# -- input validation ----------------------------------------------------------------------------


def test_from_responses_rejects_a_response_count_that_is_not_prompts_times_n():
    with pytest.raises(ValueError, match="2 prompts x n=2"):
        rollouts_from_responses([entry([1])] * 3, prompt_ids=PROMPTS, n=2, pad_token_id=PAD)


@pytest.mark.parametrize("bad", [{"n": 0}, {"n": True}, {"pad_token_id": 1.5}, {"prompt_texts": ["only one"]}])
def test_from_responses_rejects_bad_options(bad):
    kwargs = {"prompt_ids": PROMPTS, "n": 1, "pad_token_id": PAD, **bad}
    n = kwargs["n"] if isinstance(kwargs["n"], int) and kwargs["n"] > 0 else 1
    with pytest.raises((ValueError, TypeError)):
        rollouts_from_responses([entry([1])] * (2 * n), **kwargs)


def test_from_responses_rejects_non_dict_entries():
    with pytest.raises(TypeError, match="response 1"):
        rollouts_from_responses([entry([1]), "oops"], prompt_ids=[[1], [2]], pad_token_id=PAD)


def test_extra_columns_are_added_after_the_built_in_ones_and_validated():
    responses = [entry([1]), entry([2])]
    res = rollouts_from_responses(responses, prompt_ids=[[1], [2]], pad_token_id=PAD, extra={"ttft_s": [0.1, 0.2]})
    assert res.df.columns[-1] == "ttft_s" and res.df.ttft_s.tolist() == [0.1, 0.2]
    with pytest.raises(ValueError, match="1 values for 2 rows"):
        rollouts_from_responses([entry([1]), entry([2])], prompt_ids=[[1], [2]], pad_token_id=PAD, extra={"x": [1]})
    with pytest.raises(ValueError, match="clashes"):
        rollouts_from_responses([entry([1])], prompt_ids=[[1]], pad_token_id=PAD, extra={"rid": ["a"]})


# -- selection -----------------------------------------------------------------------------------


def assert_same_rows(sub: Rollouts, full: Rollouts, rows: list[int]) -> None:
    """`sub` holds exactly `rows` of `full`: df, meta_info and every real token and logprob."""
    assert len(sub) == len(rows)
    expected = full.df.iloc[rows].reset_index(drop=True)
    pd.testing.assert_frame_equal(sub.df, expected)
    assert sub.meta_info == [full.meta_info[i] for i in rows]
    for k, i in enumerate(rows):
        n_tok = int(full.lengths[i])
        assert int(sub.lengths[k]) == n_tok
        assert sub.response_ids[k, :n_tok].tolist() == full.response_ids[i, :n_tok].tolist()
        assert sub.logprobs[k, :n_tok].tolist() == full.logprobs[i, :n_tok].tolist()
        p_len = int(full.prompt_mask[i].sum())
        assert sub.prompt_ids[k, sub.prompt_ids.shape[1] - p_len :].tolist() == full.prompt_ids[i, -p_len:].tolist()


def test_integer_slice_list_and_mask_selection_keep_tensors_aligned():
    res = two_by_two()
    assert_same_rows(res[3], res, [3])
    assert_same_rows(res[-1], res, [3])
    assert_same_rows(res[1:3], res, [1, 2])
    assert_same_rows(res[[3, 0]], res, [3, 0])
    assert_same_rows(res[np.array([False, True, False, True])], res, [1, 3])
    assert_same_rows(res[torch.tensor([True, False, False, True])], res, [0, 3])


def test_a_selection_repads_to_its_own_longest_rows():
    res = two_by_two()
    sub = res[[1, 2]]  # responses of length 1 and 0, prompts of length 3 and 1
    assert sub.response_ids.shape == (2, 1) and sub.prompt_ids.shape == (2, 3)
    assert res[[2]].response_ids.shape == (1, 0)


def test_where_accepts_a_callable_or_a_boolean_series():
    res = two_by_two()
    assert_same_rows(res.where(lambda df: df.finish_reason == "stop"), res, [0, 3])
    assert_same_rows(res.where(res.df.completion_tokens > 1), res, [0, 3])
    assert len(res.where(lambda df: df.completion_tokens > 100)) == 0


@pytest.mark.parametrize(
    "key, error",
    [(4, IndexError), ([0, 7], IndexError), ("a", TypeError), ([True, False], ValueError), (1.5, TypeError)],
)
def test_selection_rejects_bad_keys(key, error):
    with pytest.raises(error):
        two_by_two()[key]


def test_where_rejects_integer_indices():
    with pytest.raises(TypeError, match="boolean"):
        two_by_two().where([0, 1])


def test_user_columns_follow_selection():
    res = two_by_two()
    res.df["reward"] = [1.0, 2.0, 3.0, 4.0]
    assert res[[3, 1]].df.reward.tolist() == [4.0, 2.0]


def test_assigning_a_reordered_df_is_refused():
    res = two_by_two()
    with pytest.raises(ValueError, match="row"):
        res.df = res.df.sort_values("completion_tokens")
    res.df = res.df.assign(reward=1.0)  # same rows, new column: fine
    assert "reward" in res.df


def test_a_fresh_result_numbers_its_rows_in_row_id():
    res = two_by_two()
    assert res.df.row_id.tolist() == [0, 1, 2, 3] and res.df.row_id.dtype == np.int64


def test_rows_selected_with_where_keep_their_row_id_and_are_found_in_the_source_by_it():
    res = two_by_two()
    res.df["score"] = [0.5, 0.1, 0.9, 0.7]
    sel = res.where(lambda df: df.score > 0.6)
    assert sel.df.index.tolist() == [0, 1]  # the df is renumbered, to line up with the tensors
    assert sel.df.row_id.tolist() == [2, 3]
    back = res.where(res.df.row_id.isin(sel.df.row_id))
    assert_same_rows(back, res, [2, 3])
    assert res[[3, 1]][[1]].df.row_id.tolist() == [1]  # a selection of a selection still points back


def test_an_in_place_reorder_of_df_is_detected_before_it_misaligns_a_selection():
    res = two_by_two()
    res.df.index = res.df.index[::-1]  # e.g. a stray in-place edit
    with pytest.raises(ValueError, match="no longer lines up"):
        res[0:2]


# -- concat --------------------------------------------------------------------------------------


def test_concat_repads_and_keeps_prompt_index_unless_renumbered():
    a = two_by_two()
    b = rollouts_from_responses([entry(list(range(1, 7)))], prompt_ids=[[1, 2, 3, 4, 5]], pad_token_id=PAD)
    both = Rollouts.concat([a, b])
    assert len(both) == 5
    assert both.response_ids.shape == (5, 6) and both.prompt_ids.shape == (5, 5)
    assert both.df.prompt_index.tolist() == [0, 0, 1, 1, 0]
    assert Rollouts.concat([a, b], renumber=True).df.prompt_index.tolist() == [0, 0, 1, 1, 2]
    assert_same_rows(both[[0, 1, 2, 3]], a, [0, 1, 2, 3])
    assert_same_rows(both[[4]], b, [0])


def test_each_result_is_one_run_with_its_own_short_id_and_sampling():
    a, b = two_by_two(sampling={"temperature": 0.0}), two_by_two()
    assert a.df.run.nunique() == 1 and len(a.df.run.iloc[0]) == 8
    assert a.df.run.iloc[0] != b.df.run.iloc[0]
    assert a.run_sampling == {a.df.run.iloc[0]: {"temperature": 0.0}} and a.sampling == {"temperature": 0.0}
    assert a[[]].sampling == {"temperature": 0.0}


def test_concat_keeps_each_rows_run_and_the_sampling_of_each_run():
    hot, cold = two_by_two(sampling={"temperature": 1.0}), two_by_two(sampling={"temperature": 0.0})
    both = Rollouts.concat([hot, cold])
    assert both.df.run.tolist() == hot.df.run.tolist() + cold.df.run.tolist()
    assert both.df.row_id.tolist() == [0, 1, 2, 3] * 2
    assert both.df.run.map(both.run_sampling).tolist() == [{"temperature": 1.0}] * 4 + [{"temperature": 0.0}] * 4
    assert both.sampling is None  # the runs disagree; per run in run_sampling
    assert both[:4].sampling == {"temperature": 1.0}  # a selection forgets the runs it dropped
    named = Rollouts.concat([hot, cold], labels=["hot", "cold"])
    assert named.df.run.tolist() == ["hot"] * 4 + ["cold"] * 4
    assert named.run_sampling == {"hot": {"temperature": 1.0}, "cold": {"temperature": 0.0}}
    again = Rollouts.concat([named, two_by_two()], labels=["x", "y"])  # an input of several runs
    assert again.df.run.tolist()[::4] == ["x/hot", "x/cold", "y"]


def test_concat_of_one_result_with_itself_renames_the_repeat_so_row_ids_stay_unique_per_run():
    res = two_by_two()
    run = res.df.run.iloc[0]
    assert Rollouts.concat([res[:2], res[2:]]).df.run.tolist() == [run] * 4  # pieces of one run stay one run
    both = Rollouts.concat([res, res])
    assert both.df.run.tolist() == [run] * 4 + [f"{run}#1"] * 4
    assert not both.df.duplicated(["run", "row_id"]).any()
    with pytest.raises(ValueError, match="labels that tell"):
        Rollouts.concat([res, res], labels=["a", "a"])
    with pytest.raises(ValueError, match="one per input"):
        Rollouts.concat([res, res], labels=["a"])


def test_rewards_and_group_stats_of_two_runs_with_the_same_prompt_indices_never_mix_the_runs():
    def target(target: float) -> float:
        return float(target)

    a = two_by_two().with_columns({"target": [1.0] * 4})
    b = two_by_two().with_columns({"target": [0.0] * 4})
    both = Rollouts.concat([a, b], labels=["a", "b"]).add_rewards(target, mode="inline")
    stats = both.group_stats()
    assert list(zip(stats.run, stats.prompt_index)) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert stats["mean"].tolist() == [1.0, 1.0, 0.0, 0.0] and stats.zero_std.all()
    assert both.df.group_mean.tolist() == [1.0] * 4 + [0.0] * 4
    assert (both.df.advantage == 0).all()  # mixed, each group would be half 1 and half 0


def test_concat_fills_fields_missing_from_one_input_with_nan():
    a = two_by_two(top_k=2)
    b = two_by_two(logprobs=False)
    both = Rollouts.concat([a, b])
    assert torch.isnan(both.logprobs[4:][both.response_mask[4:]]).all()
    assert torch.equal(both.logprobs[:4], a.logprobs)
    assert (both.top_ids[4:][both.response_mask[4:]] == PAD).all()


def test_concat_refuses_different_pad_ids_and_top_k_sizes():
    a = two_by_two()
    b = rollouts_from_responses([entry([1])], prompt_ids=[[1]], pad_token_id=5)
    with pytest.raises(ValueError, match="pad_token_id"):
        Rollouts.concat([a, b])
    with pytest.raises(ValueError, match="top-k"):
        Rollouts.concat([two_by_two(top_k=2), two_by_two(top_k=3)])
    with pytest.raises(TypeError):
        Rollouts.concat([])


# -- parquet -------------------------------------------------------------------------------------


def assert_identical(a: Rollouts, b: Rollouts) -> None:
    pd.testing.assert_frame_equal(a.df, b.df)
    ta, tb = a.tensors(), b.tensors()
    assert ta.keys() == tb.keys()
    for k in ta:
        assert ta[k].dtype == tb[k].dtype, k
        torch.testing.assert_close(ta[k], tb[k], rtol=0, atol=0, equal_nan=True, msg=k)
    assert a.meta_info == b.meta_info
    assert (a.pad_token_id, a.model, a.sampling, a.run_sampling) == (b.pad_token_id, b.model, b.sampling, b.run_sampling)
    assert [a.tokens(i)["texts"] for i in range(len(a))] == [b.tokens(i)["texts"] for i in range(len(b))]


def test_parquet_round_trip_is_exact(tmp_path):
    responses = [
        entry([5, 6, 7], matched=7, top_k=2, text_in_logprobs=True, input_ids=[101, 102, 103]),
        entry([9], finish="length", top_k=2, text_in_logprobs=True, input_ids=[101, 102, 103]),
        failed_entry("boom"),
        entry([1, 2, 3, 4], matched="###", top_k=2, text_in_logprobs=True, input_ids=[201]),
    ]
    res = rollouts_from_responses(
        responses,
        prompt_ids=PROMPTS,
        prompt_texts=["first <b>", None],
        n=2,
        pad_token_id=-7,
        extra={"ttft_s": [0.1, 0.2, float("nan"), 0.4]},
        model="tiny",
        sampling={"temperature": 0.7, "max_new_tokens": 4},
    )
    res.df["reward"] = [1, 0, 0, 1]
    res.to_parquet(tmp_path / "r.parquet")
    back = Rollouts.from_parquet(tmp_path / "r.parquet")
    assert_identical(res, back)
    assert back.df.matched_stop.tolist() == [7, None, None, "###"]
    assert back.prompt_logprobs is not None and back.top_logprobs is not None


def test_parquet_round_trip_of_a_selection_and_of_an_empty_result(tmp_path):
    res = two_by_two()
    res[[3, 1]].to_parquet(tmp_path / "sel.parquet")
    assert_identical(Rollouts.from_parquet(tmp_path / "sel.parquet"), res[[3, 1]])
    empty = res.where(lambda df: df.completion_tokens > 100)
    empty.to_parquet(tmp_path / "empty.parquet")
    assert len(Rollouts.from_parquet(tmp_path / "empty.parquet")) == 0


def test_the_view_after_a_parquet_round_trip_shows_the_same_token_text(tmp_path, tok):
    from rlgen.rollouts._token_text import TokenText

    ids = tok("The café\nis open", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    res = rollouts_from_responses([entry(ids)], prompt_ids=[[1, 2]], pad_token_id=tok.eos_token_id,
                                  decode=TokenText(tok))
    res.to_parquet(tmp_path / "r.parquet")
    back = Rollouts.from_parquet(tmp_path / "r.parquet")
    assert back.decode is not None and back.decode.source == tok.name_or_path
    body = back._repr_html_()
    assert "> café</span>" in body and ">↵\n</span>" in body and "&lt;|im_end|&gt;" in body
    assert body == res._repr_html_().replace(f"run {res.df.run[0]}", f"run {back.df.run[0]}")


def test_after_parquet_without_its_tokenizer_the_view_shows_ids_and_says_how_to_get_text(tmp_path, model_path):
    from rlgen.rollouts._token_text import TokenText

    res = rollouts_from_responses([entry([5, 6, 7])], prompt_ids=[[1]], pad_token_id=2,
                                  decode=TokenText.load(str(tmp_path / "moved-away")))
    res.to_parquet(tmp_path / "r.parquet")
    body = Rollouts.from_parquet(tmp_path / "r.parquet")._repr_html_()
    assert ">5 </span>" in body and "from_parquet(path, tokenizer=...)" in body
    given = Rollouts.from_parquet(tmp_path / "r.parquet", tokenizer=model_path)
    assert given.decode is not None and given.decode([5, 6, 7]) and ">5 </span>" not in given._repr_html_()


def test_a_file_written_before_the_rename_reads_its_latency_s_as_request_latency_s(tmp_path):
    res = two_by_two()
    old = res[:]
    old.df = old.df.rename(columns={"request_latency_s": "latency_s"})  # the column as older files have it
    old.to_parquet(tmp_path / "old.parquet")
    back = Rollouts.from_parquet(tmp_path / "old.parquet")
    assert "latency_s" not in back.df.columns
    pd.testing.assert_frame_equal(back.df, res.df)


def test_parquet_keeps_the_row_ids_of_a_selection_and_gives_a_file_without_them_positions(tmp_path):
    res = two_by_two()
    res[[3, 1]].to_parquet(tmp_path / "sel.parquet")
    assert Rollouts.from_parquet(tmp_path / "sel.parquet").df.row_id.tolist() == [3, 1]
    old = res[[3, 1]]
    old.df = old.df.drop(columns="row_id")  # the columns as older files have them
    old.to_parquet(tmp_path / "old.parquet")
    assert Rollouts.from_parquet(tmp_path / "old.parquet").df.row_id.tolist() == [0, 1]


def test_parquet_keeps_the_runs_and_each_runs_sampling_of_a_concat(tmp_path):
    both = Rollouts.concat([two_by_two(sampling={"temperature": 1.0}), two_by_two(sampling={"top_k": 5})],
                           labels=["hot", "top"])
    both.to_parquet(tmp_path / "both.parquet")
    back = Rollouts.from_parquet(tmp_path / "both.parquet")
    assert_identical(back, both)
    assert back.run_sampling == {"hot": {"temperature": 1.0}, "top": {"top_k": 5}}


def test_a_file_without_runs_reads_as_one_run_with_the_files_sampling(tmp_path):
    res = two_by_two(sampling={"temperature": 0.5})
    old = res[:]
    old.df = old.df.drop(columns="run")  # the columns as older files have them
    old.to_parquet(tmp_path / "old.parquet")
    back = Rollouts.from_parquet(tmp_path / "old.parquet")
    assert back.df.run.nunique() == 1 and back.sampling == {"temperature": 0.5}


def test_from_parquet_refuses_a_file_rollouts_did_not_write(tmp_path):
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "plain.parquet")
    with pytest.raises(ValueError, match="not written by Rollouts"):
        Rollouts.from_parquet(tmp_path / "plain.parquet")


# -- tensors lifecycle, repr, compare_logprobs ----------------------------------------------------


def test_tensors_are_built_once_and_cached():
    res = two_by_two()
    assert res.response_ids is res.response_ids
    assert res.tensors()["logprobs"] is res.logprobs


def test_to_returns_a_copy_with_tensors_on_the_new_device():
    res = two_by_two()
    moved = res.to("meta")  # a device every CPU machine has
    assert moved.response_ids.device.type == "meta" and moved.logprobs.device.type == "meta"
    assert res.response_ids.device.type == "cpu"
    assert moved[[0]].lengths.device.type == "meta"  # selections stay on the device
    pd.testing.assert_frame_equal(moved.df, res.df)


def test_repr_is_one_line_with_rows_prompts_tokens_finish_counts_and_model():
    res = two_by_two()
    assert repr(res) == "<Rollouts 4 rows (2 prompts x 2) | 8 tokens | finish: stop 2, abort 1, length 1 | model=tiny>"
    assert repr(res[[0, 1, 2]]) == (
        "<Rollouts 3 rows (2 prompts) | 4 tokens | finish: abort 1, length 1, stop 1 | model=tiny>"
    )


def test_compare_logprobs_reports_differences_over_response_positions_only():
    res = two_by_two()
    other = res.logprobs.clone()
    other[0, 0] += 0.5
    other[3, 2] += 0.25
    other[~res.response_mask] = 123.0  # padding must not count
    out = compare_logprobs(res, other)
    assert out["n_tokens"] == 8 and out["n_missing"] == 0
    assert out["max_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    assert out["mean_abs_diff"] == pytest.approx(0.75 / 8, abs=1e-6)
    assert out["first_token_max_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    assert compare_logprobs(res, res)["max_abs_diff"] == 0.0


def test_compare_logprobs_needs_a_mask_for_plain_tensors_and_the_same_tokens_for_two_results():
    res = two_by_two()
    with pytest.raises(ValueError, match="mask"):
        compare_logprobs(res.logprobs, res.logprobs)
    assert compare_logprobs(res.logprobs, res.logprobs, mask=res.response_mask)["n_tokens"] == 8
    other = rollouts_from_responses(
        [entry([5, 6, 8]), entry([9]), entry([]), entry([1, 2, 3, 4])], prompt_ids=PROMPTS, n=2, pad_token_id=PAD
    )
    with pytest.raises(ValueError, match="different response tokens"):
        compare_logprobs(res, other)


def test_importing_results_and_display_does_not_import_torch_or_pandas():
    code = "import sys, rlgen.rollouts._rollouts, rlgen.rollouts._display; print([m for m in ('torch', 'pandas') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_data_columns_are_the_users_extra_columns_not_the_clients_own() -> None:
    res = rollouts_from_responses([entry([1]), entry([2])], prompt_ids=[[1], [2]], pad_token_id=PAD,
                                  extra={"ttft_s": [0.1, 0.2], "prompt_messages": [[], []]})
    res = res.with_columns({"answer": ["4", "7"]})
    assert res.extra_columns == ["ttft_s", "prompt_messages", "answer"]
    assert res.data_columns == ["answer"]
