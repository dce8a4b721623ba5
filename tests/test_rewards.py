"""Rollouts.add_rewards and what reads its columns: real reward functions over real Rollouts,
in real worker processes (hangs, crashes, bad returns), with group statistics and a summary."""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pandas as pd
import pytest
from _trl_rewards import get_repetition_penalty_reward, get_soft_overlong_punishment

from rlgen.rollouts import Rollouts, rollouts_from_responses

ANSWERS = ["4", "7"]
COMPLETIONS = ["4", "The answer is 4", "five", "", "7", "7", "8", "seven"]


def make_rollouts(completions: list[str] = COMPLETIONS, n: int = 4) -> Rollouts:
    entries = [{"text": c, "output_ids": list(range(1, 2 + i % 3)),
                "meta_info": {"finish_reason": {"type": "length" if i % 4 == 3 else "stop"},
                              "completion_tokens": 1 + i % 3}}
               for i, c in enumerate(completions)]
    res = rollouts_from_responses(entries, prompt_ids=[[1, 2]] * (len(completions) // n), n=n, pad_token_id=0)
    return res.with_columns({"answer": [ANSWERS[i // n % 2] for i in range(len(completions))]})


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def contains(completion: str, answer: str) -> float:
    return float(answer in completion)


def test_a_columns_style_reward_gets_its_columns_the_combined_reward_and_grpo_advantages() -> None:
    res = make_rollouts().add_rewards(exact, mode="inline")
    df = res.df
    assert df["reward_exact"].tolist() == [1, 0, 0, 0, 1, 1, 0, 0]
    assert (df["reward_exact_status"] == "ok").all() and df["reward_exact_error"].isna().all()
    assert df["reward"].tolist() == df["reward_exact"].tolist()
    first = np.array([1, 0, 0, 0], dtype=float)
    np.testing.assert_allclose(df["advantage"][:4], (first - first.mean()) / (first.std(ddof=1) + 1e-4))
    assert not df["group_zero_std"].any()


def test_weights_combine_several_functions_and_advantages_reach_the_tensors() -> None:
    res = make_rollouts().add_rewards({"exact": exact, "contains": contains}, weights={"contains": 0.5},
                                      mode="thread")
    np.testing.assert_allclose(res.df["reward"], res.df["reward_exact"] + 0.5 * res.df["reward_contains"])
    t = res.tensors()
    assert t["advantages"].shape == (8,)
    assert (t["token_advantages"][~t["response_mask"]] == 0).all()
    np.testing.assert_allclose(t["token_advantages"][:, 0].numpy(), res.df["advantage"].to_numpy(), rtol=1e-6)


def test_a_trl_batch_function_runs_unchanged_and_a_wrong_length_is_marked_not_broadcast() -> None:
    def trl_len(prompts, completions, completion_ids, **kwargs):
        return [float(len(c)) for c in completions]

    def trl_short(prompts, completions, **kwargs):
        return [1.0] * (len(completions) - 1)

    res = make_rollouts().add_rewards([trl_len, trl_short], mode="inline", batch_size=3)
    assert res.df["reward_trl_len"].tolist() == [float(len(c)) for c in COMPLETIONS]
    assert (res.df["reward_trl_short_status"] == "bad_return").all()
    assert "returned 2 values for 3 completions" in res.df["reward_trl_short_error"][0]


def test_trls_own_token_id_rewards_taking_only_completion_ids_run_as_trl_would_call_them() -> None:
    ids = [[7] * (2 + 3 * i) if i % 3 == 0 else list(range(1, 2 + 3 * i)) for i in range(16)]
    entries = [{"text": f"c{i}", "output_ids": ids[i],
                "meta_info": {"finish_reason": {"type": "stop"}, "completion_tokens": len(ids[i])}}
               for i in range(16)]
    res = rollouts_from_responses(entries, prompt_ids=[[1, 2]] * 4, n=4, pad_token_id=0)
    overlong = get_soft_overlong_punishment(max_completion_len=30, soft_punish_cache=10)
    repetition = get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)
    out = res.add_rewards([overlong, repetition], mode="thread", batch_size=16)
    for fn in (overlong, repetition):
        name = fn.__name__
        assert (out.df[f"reward_{name}_status"] == "ok").all(), out.df[f"reward_{name}_error"].tolist()
        # As TRL's GRPOTrainer calls it: keywords, the batch's ids, its training hooks.
        expected = fn(prompts=[""] * 16, completions=[f"c{i}" for i in range(16)], completion_ids=ids,
                      trainer_state=None, log_extra=None, log_metric=None)
        assert out.df[f"reward_{name}"].tolist() == expected
    assert len(set(out.df["reward_soft_overlong_punishment_reward"])) > 2  # the test covers each branch


def test_a_batch_function_returning_too_many_values_is_never_cut_to_the_row_count() -> None:
    def trl_long(prompts, completions, **kwargs):
        return [1.0] * (len(completions) + 1)

    with pytest.warns(UserWarning, match="trl_long failed on 8 of 8 rows"):
        res = make_rollouts().add_rewards(trl_long, mode="thread", batch_size=3)
    assert (res.df["reward_trl_long_status"] == "bad_return").all() and res.df["reward_trl_long"].isna().all()
    assert res.df["reward_trl_long_error"].tolist() == [
        "returned 4 values for 3 completions; return one value (or None) per completion"] * 6 + [
        "returned 3 values for 2 completions; return one value (or None) per completion"] * 2


def test_a_verl_compute_score_dict_return_gives_the_score_and_extra_columns() -> None:
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": float(solution_str == ground_truth), "acc": solution_str == ground_truth}

    res = make_rollouts().add_rewards(compute_score, mode="inline")
    assert res.df["reward_compute_score"].tolist() == [1, 0, 0, 0, 1, 1, 0, 0]
    assert res.df["reward_compute_score_acc"].tolist()[:2] == [True, False]


@pytest.mark.timeout(120)
def test_in_the_pool_a_hung_call_times_out_a_crash_is_marked_and_every_other_row_is_scored() -> None:
    def fragile(completion: str, answer: str) -> float | None:
        if completion == "five":
            time.sleep(60)
        if completion == "seven":
            os._exit(3)
        if completion == "":
            raise ValueError("empty completion")
        if completion == "8":
            return None
        return float(completion.strip() == answer)

    res = make_rollouts().add_rewards(fragile, mode="process", timeout=2, workers=2)
    status = res.df["reward_fragile_status"].tolist()
    assert status == ["ok", "ok", "timeout", "error", "ok", "ok", "none", "error"]
    assert res.df["reward_fragile"].tolist()[:2] == [1, 0] and math.isnan(res.df["reward_fragile"][6])
    assert res.df["reward_fragile_error"][3] == "ValueError: empty completion"
    assert "ValueError" in res.df["reward_fragile_traceback"][3]


def test_a_string_or_nan_return_is_a_bad_return_for_that_row_only() -> None:
    def sloppy(completion: str) -> object:
        return {"4": "1.0", "7": float("nan")}.get(completion, 0.0)

    res = make_rollouts().add_rewards(sloppy, mode="inline")
    status = res.df["reward_sloppy_status"].tolist()
    assert status[0] == "bad_return" and status[4] == "bad_return" and status[1] == "ok"
    assert "return a float" in res.df["reward_sloppy_error"][0]


def test_a_reward_returning_torch_scalars_is_scored() -> None:
    import torch

    def tensor_reward(completion: str, answer: str) -> torch.Tensor:
        return torch.tensor(float(completion.strip() == answer))

    res = make_rollouts().add_rewards(tensor_reward, mode="inline")
    assert (res.df["reward_tensor_reward_status"] == "ok").all(), res.df["reward_tensor_reward_error"].tolist()
    assert res.df["reward_tensor_reward"].tolist() == [1, 0, 0, 0, 1, 1, 0, 0]


def notebook_lines(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text/plain of each state of add_rewards' notebook progress line, as it is replaced."""
    import IPython.display

    import rlgen.core._progress as progress

    shown: list[str] = []

    class Handle:
        def update(self, obj, raw=False):
            shown.append(obj["text/plain"])

    def fake_display(obj, raw=False, display_id=False):
        shown.append(obj["text/plain"])
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    return shown


def test_the_totals_line_counts_statuses_and_has_no_tick_when_rows_failed(monkeypatch) -> None:
    shown = notebook_lines(monkeypatch)

    def picky(completion: str) -> float:
        if completion in ("five", "", "seven"):
            raise ValueError("not a number")
        return 1.0

    with pytest.warns(UserWarning, match="picky failed on 3 of 8 rows"):
        make_rollouts().add_rewards([picky, exact], mode="thread", progress=True)
    assert not shown[-1].startswith("✓") and shown[-1].startswith("⚠ rewards: 13 ok · 3 error · ")
    make_rollouts().add_rewards(exact, mode="thread", progress=True)
    assert shown[-1].startswith("✓ rewards: 8 ok · ")


def test_a_function_failing_on_many_rows_warns_with_its_name_and_commonest_error() -> None:
    def mostly_broken(completion: str) -> float:
        if completion != "4":
            raise ValueError(f"cannot parse {completion[:1]!r}" if completion.startswith("7") else "cannot parse")
        return 1.0

    with pytest.warns(UserWarning, match=r"mostly_broken failed on 14 of 16 rows \(14 error\); commonest: "
                                         r"'ValueError: cannot parse' \(10 rows\)"):
        make_rollouts(COMPLETIONS * 2).add_rewards(mostly_broken, mode="thread")

    def rarely_broken(completion: str) -> float:
        if completion == "five":
            raise ValueError("five")
        return 1.0

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 2 of 16 rows: not worth a warning (the summary still says so)
        make_rollouts(COMPLETIONS * 2).add_rewards(rarely_broken, mode="thread")


def test_a_row_where_every_function_failed_has_nan_reward_and_stays_out_of_its_groups_stats() -> None:
    def only_digits(completion: str) -> float | None:
        if not completion.strip().isdigit():
            raise ValueError("no digits")
        return float(completion.strip()) / 10

    def digits_or_none(completion: str) -> float | None:
        return 1.0 if completion.strip().isdigit() else None

    with pytest.warns(UserWarning, match="only_digits failed on 4 of 8 rows"):
        res = make_rollouts().add_rewards([only_digits, digits_or_none], mode="thread")
    df = res.df
    failed = [1, 2, 3, 7]  # "The answer is 4", "five", "", "seven": no function gave a number
    assert df["reward"].isna().tolist() == [i in failed for i in range(8)]
    scored = {0: 1.4, 4: 1.7, 5: 1.7, 6: 1.8}
    assert df["reward"][list(scored)].tolist() == pytest.approx(list(scored.values()))
    # group 0 has one scored row, group 1 three: their means and stds ignore the failed rows
    assert df["group_mean"].tolist()[:4] == pytest.approx([1.4] * 4)
    assert df["group_mean"].tolist()[4:] == pytest.approx([(1.7 + 1.7 + 1.8) / 3] * 4)
    assert df["group_std"][4] == pytest.approx(np.std([1.7, 1.7, 1.8], ddof=1))
    assert df["advantage"][failed].isna().all()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_function_that_hangs_on_every_row_is_called_no_more_after_3_timeouts_in_a_row(monkeypatch, mode) -> None:
    shown = notebook_lines(monkeypatch)

    def hangs(completion: str) -> float:
        time.sleep(3600)
        return 1.0

    started = time.monotonic()
    with pytest.warns(UserWarning, match="hangs failed on .* stopped after 3 timeouts in a row"):
        res = make_rollouts(COMPLETIONS * 2).add_rewards([hangs, exact], mode=mode, timeout=1, workers=2,
                                                         progress=True)
    # Evidence by count, not wall time (a loaded CI machine took 9.2 s here): at most the 3 timeouts
    # and the calls the 2 workers had already started ran; every other row was never called.
    assert time.monotonic() - started < 16  # 16 rows x 1 s / 2 workers would be 8 s plus start-up
    status = res.df["reward_hangs_status"]
    timeouts = (status == "timeout").sum()
    assert 3 <= timeouts <= 5 and (status == "skipped").sum() == 16 - timeouts
    # The rows name the streak that stopped it: 3, or 4 where both workers' calls were found late in
    # one pass (a loaded machine with two test workers saw "after 4" in thread mode).
    assert res.df.loc[status == "skipped", "reward_hangs_error"].eq(f"Skipped: stopped after {timeouts} timeouts in a row").all()
    assert (res.df["reward_exact_status"] == "ok").all() and res.df["reward"].notna().all()
    assert "hangs stopped after 3 timeouts in a row" in shown[-1] and " skipped" in shown[-1]
    flags = "\n".join(res.reward_summary().flags)
    assert f"hangs: stopped after {timeouts} timeouts in a row;" in flags  # the rows' streak, as above


def test_inline_mode_lets_an_exception_raise_where_it_can_be_debugged() -> None:
    def broken(completion: str) -> float:
        raise KeyError("oops")

    with pytest.raises(KeyError, match="oops"):
        make_rollouts().add_rewards(broken, mode="inline")


@pytest.mark.parametrize("kwargs, error, match", [
    ({"funcs": 3}, TypeError, "funcs must be"),
    ({"funcs": [exact, exact]}, ValueError, "two reward functions are named 'exact'"),
    ({"funcs": lambda completion: 1.0}, ValueError, "has no name"),
    ({"funcs": exact, "weights": {"exactt": 1.0}}, ValueError, r"weights name \['exactt'\]"),
    ({"funcs": exact, "style": "openai"}, ValueError, "unknown style 'openai'"),
    ({"funcs": exact, "timeout": 0}, ValueError, "timeout"),
    ({"funcs": exact, "columns": {"answer": "answr"}}, ValueError, "did you mean 'answer'"),
    ({"funcs": {"ok": "not a function"}}, TypeError, r"reward #1 \('ok'\) is a str, not a function"),
    ({"funcs": [exact, 5]}, TypeError, r"reward #2 is a int, not a function"),
    ({"funcs": (exact, None)}, TypeError, r"reward #2 is a NoneType, not a function"),
    ({"funcs": exact, "timout": 5}, TypeError, "did you mean 'timeout'"),
    ({"funcs": exact, "advantage": "ppo"}, ValueError, "advantage must be one of"),
    ({"funcs": exact, "mode": "processes"}, ValueError, "did you mean 'process'"),
])
def test_bad_arguments_fail_before_anything_runs(kwargs, error, match) -> None:
    funcs = kwargs.pop("funcs")
    with pytest.raises(error, match=match):
        make_rollouts().add_rewards(funcs, **{"mode": "thread", **kwargs})


def test_group_stats_and_pass_at_k_follow_the_rewards() -> None:
    res = make_rollouts().add_rewards(exact, mode="inline")
    table = res.group_stats(correct="reward_exact", k=[1, 2])
    assert table["n"].tolist() == [4, 4] and table["correct"].tolist() == [1, 2]
    assert table["pass@1"].tolist() == [0.25, 0.5]
    assert table["pass@2"].tolist() == pytest.approx([1 - 3 / 6, 1 - 1 / 6])
    assert res.pass_at_k([1, 2], correct="reward_exact").tolist() == pytest.approx([0.375, (0.5 + 5 / 6) / 2])


def test_the_summary_flags_errors_constant_rewards_and_truncated_completions_scoring_higher() -> None:
    def raises_on_empty(completion: str) -> float:
        if not completion:
            raise ValueError("no text")
        return 1.0

    def rewards_truncation(completion: str, finish_reason: str) -> float:
        return 1.0 if finish_reason == "length" else 0.0

    res = make_rollouts(COMPLETIONS * 2, n=4).add_rewards([raises_on_empty, rewards_truncation], mode="thread")
    summary = res.reward_summary()
    text = "\n".join(summary.flags)
    assert "raises_on_empty: 12% of rows raised ValueError: no text" in text
    assert "raises_on_empty: every scored row got 1" in text
    assert "rewards_truncation: truncated completions score higher than finished ones" in text
    assert summary.table.loc["raises_on_empty", "frac_error"] == pytest.approx(2 / 16)


def test_reward_columns_survive_selection_concat_and_parquet(tmp_path) -> None:
    res = make_rollouts().add_rewards(exact, mode="inline")
    assert res[2:5].df["reward_exact"].tolist() == [0, 0, 1]
    both = Rollouts.concat([res, res])
    assert len(both.df) == 16 and "advantage" in both.df
    path = tmp_path / "r.parquet"
    res.to_parquet(path)
    back = Rollouts.from_parquet(path)
    pd.testing.assert_series_equal(back.df["reward_exact_status"], res.df["reward_exact_status"],
                                   check_dtype=False)


def test_other_advantage_estimators_come_from_the_reward_column_without_scoring_again() -> None:
    res = make_rollouts().add_rewards(exact, mode="inline")
    np.testing.assert_allclose(res.advantages("grpo"), res.df["advantage"])
    np.testing.assert_allclose(res.advantages("drgrpo")[:4], [0.75, -0.25, -0.25, -0.25])
    np.testing.assert_allclose(res.advantages("rloo")[:4], [1.0, -1 / 3, -1 / 3, -1 / 3])
    with pytest.raises(ValueError, match="method must be one of"):
        res.advantages("ppo")  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_ctrl_c_stops_scoring_keeps_what_was_scored_and_marks_the_rest_cancelled() -> None:
    import signal
    import threading

    def slow(completion: str) -> float:
        time.sleep(0.5)
        return 1.0

    res = make_rollouts(COMPLETIONS * 4, n=4)  # 32 rows, 0.5 s each on 2 workers: about 8 s
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(1.5, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.warns(UserWarning, match="scoring was interrupted"):
        out = res.add_rewards(slow, mode="process", workers=2, timeout=10)
    timer.cancel()
    status = out.df["reward_slow_status"]
    assert time.monotonic() - started < 5
    assert 0 < (status == "ok").sum() < 32 and (status == "cancelled").sum() == 32 - (status == "ok").sum()
    assert out.df.loc[status == "cancelled", "reward_slow"].isna().all()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_an_async_reward_is_awaited_concurrently(mode: str) -> None:
    import asyncio

    async def judge(completion: str, answer: str) -> float:
        await asyncio.sleep(0.2)  # e.g. a call to a judge model's HTTP API
        return float(completion.strip() == answer)

    started = time.monotonic()
    res = make_rollouts().add_rewards(judge, mode=mode, workers=1, timeout=10)
    assert res.df["reward_judge"].tolist() == [1, 0, 0, 0, 1, 1, 0, 0]
    assert time.monotonic() - started < 8 * 0.2  # not one after another
