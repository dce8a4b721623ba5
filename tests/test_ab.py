"""rlgen.compare._ab: checkpoint A/B on the same prompts, by a paired t interval over prompts (no server)."""

from __future__ import annotations

import importlib.util
import math
import re

import numpy as np
import pytest

from rlgen.compare._ab import ABReport, _compare_metric, ab
from rlgen.compare._intervals import t_quantile
from rlgen.rewards._group_stats import pass_at_k
from rlgen.rollouts import Rollouts, rollouts_from_responses


def entry(length: int, finish: str) -> dict:
    ids = list(range(3, 3 + length))
    meta = {"id": "r", "finish_reason": {"type": finish, "matched": None}, "completion_tokens": length}
    return {"text": "x" * length, "output_ids": ids, "meta_info": meta}


def make(rewards: list[list[float]] | None, *, finish: list[list[str]] | None = None,
         lengths: list[list[int]] | None = None, prompts: list[list[int]] | None = None) -> Rollouts:
    """One prompt per inner list (any number of samples each), prompt p = ids [10 + p, 11]."""
    shape = rewards if rewards is not None else lengths
    assert shape is not None
    counts = [len(group) for group in shape]
    prompt_ids = prompts if prompts is not None else [[10 + p, 11] for p in range(len(counts))]
    parts = []
    for p, n in enumerate(counts):
        responses = [entry(lengths[p][s] if lengths else 2, finish[p][s] if finish else "stop") for s in range(n)]
        part = rollouts_from_responses(responses, prompt_ids=[prompt_ids[p]], prompt_texts=[f"prompt {p}"], n=n,
                                       pad_token_id=0)
        part.df = part.df.assign(prompt_index=p)
        parts.append(part)
    res = Rollouts.concat(parts, labels=[f"r{p}" for p in range(len(parts))]) if len(parts) > 1 else parts[0]
    if rewards is not None:
        res = res.with_columns({"reward": [r for group in rewards for r in group]})
    return res


def metric(report: ABReport, name: str) -> dict:
    rows = report.df[report.df["metric"] == name]
    assert len(rows) == 1, list(report.df["metric"])
    return rows.iloc[0].to_dict()


REWARDS = [[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0]]


def test_identical_a_and_b_differ_by_zero_on_every_metric_and_are_noise() -> None:
    a = make(REWARDS * 2, finish=[["stop", "length", "stop", "stop"]] * 10)
    report = ab(a, a)
    assert list(report.df.columns) == ["metric", "A", "B", "diff", "low", "high", "verdict", "prompts"]
    assert list(report.df["metric"]) == ["reward", "completion_tokens", "finish: stop", "finish: length",
                                         "pass@1", "pass@4"]
    assert (report.df["diff"] == 0).all() and (report.df["low"] == 0).all() and (report.df["high"] == 0).all()
    assert set(report.df["verdict"]) == {"noise"} and set(report.df["prompts"]) == {10}
    # The same on fewer prompts than the interval can judge: no verdict.
    assert set(ab(a[:20], a[:20]).df["verdict"]) == {"too few prompts"}


def test_b_with_clearly_higher_rewards_on_every_prompt_is_b_higher_with_an_interval_above_zero() -> None:
    rng = np.random.default_rng(3)
    base = [[float(x) for x in rng.uniform(0, 0.5, 4)] for _ in range(20)]
    better = [[r + 0.4 + 0.1 * rng.uniform() for r in group] for group in base]
    report = ab(make(base), make(better), labels=("step 0", "step 100"))
    row = metric(report, "reward")
    assert row["verdict"] == "step 100 higher" and 0 < row["low"] <= row["diff"] <= row["high"]
    assert row["diff"] == pytest.approx(row["B"] - row["A"]) and row["prompts"] == 20
    assert metric(ab(make(better), make(base)), "reward")["verdict"] == "B lower"


def test_a_tiny_difference_is_noise_and_four_prompts_moving_alike_get_no_verdict() -> None:
    a = make([[0.5, 0.6], [0.2, 0.1], [0.9, 0.8]] * 4)
    b = make([[0.6, 0.6], [0.1, 0.1], [0.95, 0.8]] * 4)
    row = metric(ab(a, b), "reward")
    assert row["verdict"] == "noise" and row["low"] < 0 < row["high"]
    # Four prompts that all moved up by the same little: the interval excludes 0, but 4 prompts are
    # too few for it to mean that.
    few = metric(ab(make([[0.1, 0.2]] * 4), make([[0.15, 0.2]] * 4)), "reward")
    assert few["low"] > 0 and few["verdict"] == "too few prompts"


def test_pass_at_k_is_the_mean_over_prompts_of_the_unbiased_estimator() -> None:
    b_rewards = [[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0],
                 [0.0, 0.0, 0.0, 0.0]]
    report = ab(make(REWARDS), make(b_rewards), k=[1, 2, 4])
    for side, rewards in (("A", REWARDS), ("B", b_rewards)):
        for k in (1, 2, 4):
            expected = np.mean([pass_at_k(4, int(sum(r >= 1.0 for r in group)), k) for group in rewards])
            assert metric(report, f"pass@{k}")[side] == pytest.approx(expected)


def test_a_prompt_with_fewer_samples_than_k_is_left_out_of_pass_at_k_and_the_report_says_so() -> None:
    a = make([[1.0, 0.0, 1.0], [0.0], [1.0, 1.0, 0.0]])
    b = make([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0, 0.0]])
    report = ab(a, b, k=[1, 2])
    assert metric(report, "pass@1")["prompts"] == 3 and metric(report, "pass@2")["prompts"] == 2
    assert any(note.startswith("pass@2: 1 of 3 prompts have fewer than 2 samples") for note in report.notes)
    assert report.samples.loc[1].tolist() == [1, 2]
    # by default k is 1 and the smallest n of any prompt on either side (here 1), so nothing is left out
    assert [m for m in ab(a, b).df["metric"] if m.startswith("pass@")] == ["pass@1"]


def test_finish_shares_are_per_prompt_shares_averaged_over_prompts() -> None:
    a = make([[0.0, 0.0], [0.0, 0.0]], finish=[["stop", "length"], ["stop", "stop"]])
    b = make([[0.0, 0.0, 0.0], [0.0]], finish=[["length", "length", "abort"], ["stop"]])
    report = ab(a, b)
    stop, length, abort = metric(report, "finish: stop"), metric(report, "finish: length"), metric(report, "finish: abort")
    assert (stop["A"], stop["B"]) == pytest.approx((0.75, 0.5))
    assert (length["A"], length["B"]) == pytest.approx((0.25, 1 / 3))
    assert (abort["A"], abort["B"]) == pytest.approx((0.0, 1 / 6))


def test_mean_completion_tokens_is_per_prompt_then_over_prompts() -> None:
    report = ab(make(None, lengths=[[2, 4], [10]]), make(None, lengths=[[3], [10, 20, 30]]))
    row = metric(report, "completion_tokens")
    assert (row["A"], row["B"]) == pytest.approx(((3 + 10) / 2, (3 + 20) / 2))
    assert "reward" not in set(report.df["metric"]) and any("no 'reward' column" in n for n in report.notes)


def test_nan_rewards_are_left_out_per_prompt_and_counted() -> None:
    a = make([[1.0, math.nan], [0.0, 0.0]])
    b = make([[1.0, 1.0], [math.nan, math.nan]])
    report = ab(a, b)
    row = metric(report, "reward")
    assert row["prompts"] == 1 and row["A"] == 1.0 and row["verdict"] == "too few prompts"
    assert any(n.startswith("reward: 1 NaN rewards in A and 2 in B left out") for n in report.notes)


def test_different_prompts_are_refused_naming_the_first() -> None:
    a = make([[1.0], [1.0], [1.0]])
    b = make([[1.0], [1.0], [1.0]], prompts=[[10, 11], [50, 11], [99, 11]])
    with pytest.raises(ValueError, match=r"different prompts at prompt_index 1 \('prompt 1' in a\)"):
        ab(a, b)
    with pytest.raises(ValueError, match="prompt_index 2 is only in a"):
        ab(a, make([[1.0], [1.0]]))


def test_a_reward_column_on_one_side_only_is_refused() -> None:
    with pytest.raises(ValueError, match=r"b has no 'reward' column.*add_rewards"):
        ab(make([[1.0]]), make(None, lengths=[[2]]))


def test_the_interval_is_the_mean_difference_plus_minus_the_t_quantile_times_its_standard_error() -> None:
    # Known per-prompt differences on 10 prompts: the interval is diff ± t(p, 9) · s / sqrt(10), with
    # t(0.95, 9) = 1.83311293265624 and t(0.90, 9) = 1.38302873839663 (mpmath, 40 digits). A 90%
    # interval computed as an 80% one (or a normal 1.645) would be narrower and fail here.
    diffs = [0.30, -0.10, 0.25, 0.05, 0.40, 0.00, 0.15, -0.05, 0.20, 0.35]
    a, b = make([[0.0]] * 10), make([[d] for d in diffs])
    se = float(np.std(diffs, ddof=1)) / math.sqrt(10)
    for confidence, t in ((0.9, 1.8331129326562365), (0.8, 1.3830287383966324)):
        row = metric(ab(a, b, confidence=confidence), "reward")
        assert row["diff"] == pytest.approx(np.mean(diffs), abs=1e-15)
        assert (row["low"], row["high"]) == pytest.approx((row["diff"] - t * se, row["diff"] + t * se), rel=1e-9)
    # no randomness: the same inputs, the same interval
    assert ab(a, b).df.equals(ab(a, b).df)


@pytest.mark.parametrize("p, df, expected", [
    (0.95, 1, math.tan(math.pi * 0.45)),                      # df = 1 is Cauchy
    (0.975, 1, math.tan(math.pi * 0.475)),
    (0.95, 2, 0.9 / math.sqrt(2 * 0.95 * 0.05)),              # df = 2: (2p - 1) / sqrt(2p(1 - p))
    (0.995, 2, 0.99 / math.sqrt(2 * 0.995 * 0.005)),
    (0.95, 4, 2.1318467863266495), (0.975, 9, 2.262157162798205), (0.95, 19, 1.729132811521369),
    (0.95, 49, 1.6765508926168535),                           # mpmath, 40 digits
])
def test_t_quantile_matches_closed_forms_and_high_precision_values(p: float, df: int, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, rel=1e-9)


def coverage(draw: str, *, prompts: int, comparisons: int, seed: int) -> float:
    """The share of simulated A/B comparisons whose 90% interval holds the true mean difference."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(comparisons):
        if draw == "beta":  # skewed per-prompt differences (skewness 0.6), mean 2/7
            diff, truth = rng.beta(2.0, 5.0, prompts), 2.0 / 7.0
        else:
            diff, truth = rng.normal(0.1, 0.3, prompts), 0.1
        row = _compare_metric("reward", np.zeros(prompts), diff, label_b="B", confidence=0.9)
        hits += row["low"] <= truth <= row["high"]
    return hits / comparisons


def test_the_90_percent_interval_covers_about_90_percent_at_10_prompts() -> None:
    # 2,000 seeded A/B comparisons of 10 prompts each. Over seeds 0-7 the t interval covered
    # 87.8-90.3% (Beta) and 89.6-90.7% (normal); the percentile bootstrap it replaced covered
    # 83.2-85.3% and 84.1-86.7%, and an 80% interval labelled 90% would cover about 80%.
    assert coverage("beta", prompts=10, comparisons=2000, seed=0) >= 0.87
    assert 0.88 <= coverage("normal", prompts=10, comparisons=2000, seed=0) <= 0.92


def test_n_boot_and_seed_are_still_accepted_and_say_they_do_nothing() -> None:
    rng = np.random.default_rng(5)
    a = make([[float(x) for x in rng.uniform(size=3)] for _ in range(10)])
    b = make([[float(x) for x in rng.uniform(size=3)] for _ in range(10)])
    with pytest.warns(DeprecationWarning, match="n_boot and seed do nothing"):
        old_style = ab(a, b, n_boot=500, seed=7)
    assert old_style.df.equals(ab(a, b).df)


def test_bad_options_are_refused_with_what_to_give() -> None:
    a = make([[1.0]])
    with pytest.raises(ValueError, match="confidence must be a number between 0 and 1"):
        ab(a, a, confidence=90)
    with pytest.raises(ValueError, match="k= needs a column"):
        ab(make(None, lengths=[[2]]), make(None, lengths=[[2]]), k=2)


def test_repr_and_html_show_the_table_the_interval_and_coloured_verdicts() -> None:
    rng = np.random.default_rng(3)
    base = [[float(x) for x in rng.uniform(0, 0.5, 2)] for _ in range(10)]
    report = ab(make(base), make([[r + 1 for r in g] for g in base]), labels=("<old>", "new"))
    text = repr(report)
    assert text.splitlines()[0] == ("<ABReport <old> vs new: 90% paired t interval over 10 prompts "
                                    "(mean difference ± t with n − 1 df × standard error)")
    assert "new higher" in text and text.endswith(">")
    page = report._repr_html_()
    assert "90% paired t interval over 10 prompts" in page
    assert "&lt;old&gt;" in page and "<old>" not in page
    assert "color:#1f5fa8;font-weight:bold'>new higher" in page


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot_returns_a_figure_with_a_panel_per_metric() -> None:
    from matplotlib.figure import Figure

    report = ab(make(REWARDS), make([[1.0 - r for r in g] for g in REWARDS]))
    fig = report.plot()
    assert isinstance(fig, Figure) and len(fig.axes) == len(report.df)
    assert [ax.get_ylabel() for ax in fig.axes] == list(report.df["metric"])


def one_call(base: list[list[float]], policy: list[list[float]], *, policy_first: bool = False) -> Rollouts:
    """Base and adapter sampled in one call, as `eng.generate(prompts + prompts, n=n, adapter=[None] * k
    + ["policy"] * k)` returns them: prompt p under prompt_index p and k + p, an `adapter` column
    that is None on base rows (`policy_first`: the adapter's half sent first)."""
    k, n = len(base), len(base[0])
    halves = [(policy, "policy"), (base, None)] if policy_first else [(base, None), (policy, "policy")]
    ids = [[10 + p, 11] for p in range(k)]
    return rollouts_from_responses(
        [entry(2, "stop") for _ in range(2 * k * n)], prompt_ids=ids + ids,
        prompt_texts=[f"prompt {p}" for p in range(k)] * 2, n=n, pad_token_id=0,
        extra={"adapter": [name for _, name in halves for _ in range(k * n)],
               "reward": [r for rewards, _ in halves for group in rewards for r in group]})


def one_run(rewards: list[list[float]]) -> Rollouts:
    """One call's result: prompt p = ids [10 + p, 11] under prompt_index p, rewards per prompt."""
    ids = [[10 + p, 11] for p in range(len(rewards))]
    return rollouts_from_responses([entry(2, "stop") for group in rewards for _ in group], prompt_ids=ids,
                                   prompt_texts=[f"prompt {p}" for p in range(len(ids))], n=len(rewards[0]),
                                   pad_token_id=0, extra={"reward": [r for group in rewards for r in group]})


def shifted(rewards: list[list[float]], by: float, seed: int) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [[r + by + float(rng.uniform(-0.3, 0.3)) for r in group] for group in rewards]


BASE = shifted(REWARDS * 2, 0.0, seed=1)
POLICY = shifted(REWARDS * 2, 0.2, seed=2)


def test_base_and_adapter_rows_of_one_call_are_paired_by_prompt_text_and_the_notes_say_so() -> None:
    res = one_call(BASE, POLICY)
    base, policy = res.where(res.df.adapter.isna()), res.where(res.df.adapter == "policy")
    assert sorted(set(policy.df.prompt_index)) == list(range(10, 20))
    report = ab(base, policy)
    # the same report as two results under the same prompt_index: each prompt paired with itself
    assert report.df.equals(ab(make(BASE), make(POLICY)).df)
    assert report.samples.index.tolist() == list(range(10)) and report.samples["B"].tolist() == [4] * 10
    assert report.notes[0] == ("paired by prompt text, not prompt_index: A's prompt_index 0 is B's 10, 1 is B's 11, "
                               "2 is B's 12, … (B's = A's + 10)")
    # the same prompts in another order, under the same indices: paired by text too
    ids = [[10 + p, 11] for p in range(10)]
    backwards = make(POLICY[::-1], prompts=ids[::-1])
    report = ab(make(BASE), backwards)
    assert report.df.equals(ab(make(BASE), make(POLICY)).df)
    assert report.notes[0] == "paired by prompt text, not prompt_index: A's prompt_index 0 is B's 9, 1 is B's 8, 2 is B's 7, …"
    # the same prompts under the same indices: paired by index, no note
    assert not any(n.startswith("paired") for n in ab(make(BASE), make(POLICY)).notes)


def test_prompts_that_differ_are_refused_under_other_indices_too() -> None:
    res = one_call(BASE, POLICY)
    base, policy = res.where(res.df.adapter.isna()), res.where(res.df.adapter == "policy")
    with pytest.raises(ValueError, match=r"prompt_index 9 is only in a \(10 prompts in a, 9 in b\), and b holds its "
                                         r"prompt 'prompt 9' under no prompt_index.*a\.where\(a\.df\.prompt\.isin"):
        ab(base, policy.where(policy.df.prompt_index != 19))
    with pytest.raises(ValueError, match=r"ab\(res, by='adapter'\) compares a = its 'base' rows and b = its 'policy' "
                                         "rows, and prompt_index 9 is only in a"):
        ab(res.where(res.df.prompt_index != 19), by="adapter")
    other = make(POLICY, prompts=[[10 + p, 11] for p in range(9)] + [[99, 11]])
    with pytest.raises(ValueError, match=r"different prompts at prompt_index 9 \('prompt 9' in a\), and b holds a's "
                                         "under no prompt_index"):
        ab(make(BASE), other)


def test_a_prompt_repeated_under_as_many_indices_on_both_sides_is_paired_in_index_order() -> None:
    # prompts = [p0, p0, p1, ..., p8] sent as prompts + prompts: p0 under 0 and 1 on the base side, 10 and 11 on the adapter's
    ids = [[10, 11]] + [[10 + p, 11] for p in range(9)]
    base = make(BASE, prompts=ids)
    policy = make(POLICY, prompts=ids)
    policy.df = policy.df.assign(prompt_index=policy.df.prompt_index + 10)
    report = ab(base, policy)
    assert report.df.equals(ab(make(BASE, prompts=ids), make(POLICY, prompts=ids)).df)
    assert report.notes[0].endswith("(B's = A's + 10); 1 prompt repeated under several indices, paired in index order")


def test_a_prompt_repeated_more_often_on_one_side_is_refused_as_ambiguous_saying_what_to_select() -> None:
    p = [[10 + i, 11] for i in range(10)]
    base = make(BASE, prompts=[p[0], p[0], *p[1:9]])  # p0 under prompt_index 0 and 1, then p1..p8
    with pytest.raises(ValueError, match=r"different prompts at prompt_index 2 \('prompt 2' in a\)"):
        ab(base, make(POLICY, prompts=[p[0], p[0], *p[2:10]]))  # p0 twice as well, but p9 for p1
    with pytest.raises(ValueError, match=r"a holds the prompt 'prompt 0' under prompt_index \[0, 1\] and b under \[0\]: "
                                         r"pairing by prompt text is ambiguous; .* a\.where\(~a\.df\.prompt_index\.isin\(\[1\]\)\)"):
        ab(base, make(POLICY[:9], prompts=p[:9]))  # p0 once


def test_by_adapter_compares_the_base_and_adapter_rows_of_one_result_labelled_by_their_values() -> None:
    expected = ab(make(BASE), make(POLICY)).df.assign(verdict=lambda d: d.verdict.str.replace("B ", "policy "))
    for res in (one_call(BASE, POLICY), one_call(BASE, POLICY, policy_first=True)):
        report = ab(res, by="adapter")
        assert report.labels == ("base", "policy")  # the base model is A, wherever its rows are
        assert report.df.equals(expected) and report.notes[0].startswith("paired by prompt text")
    assert ab(one_call(BASE, POLICY), by="adapter", labels=("before", "after")).labels == ("before", "after")
    # any column: the runs of two results stacked with labels, paired by prompt_index
    both = Rollouts.concat([one_run(BASE), one_run(POLICY)], labels=["step 0", "step 100"])
    by_run = ab(both, by="run")
    assert by_run.labels == ("step 0", "step 100") and by_run.df.equals(expected.assign(
        verdict=lambda d: d.verdict.str.replace("policy ", "step 100 ")))


def test_by_a_column_without_exactly_two_values_is_refused_listing_them_and_what_to_select() -> None:
    res = one_call(BASE, POLICY)
    third = Rollouts.concat([res, one_call(BASE, POLICY).where(lambda d: d.adapter == "policy")
                             .with_columns({"adapter": ["old"] * 40})])
    with pytest.raises(ValueError, match=re.escape(
            "holds 3: base (missing), 'policy', 'old'; select the rows of two with where first, e.g. "
            "rlgen.ab(res.where(res.df.adapter.isna() | (res.df.adapter == 'policy')), by='adapter')")):
        ab(third, by="adapter")
    with pytest.raises(ValueError, match=r"holds 1: 'policy'; sample both in one call, e\.g\. eng\.generate"):
        ab(res.where(res.df.adapter == "policy"), by="adapter")
    with pytest.raises(ValueError, match=r"res has no 'adapter' column: rows get one from eng\.generate\(\.\.\., adapter="):
        ab(make(BASE), by="adapter")
    with pytest.raises(TypeError, match="ab needs two results, ab\\(a, b\\), or one result and a column"):
        ab(res)
    with pytest.raises(TypeError, match="not both"):
        ab(res, res, by="adapter")
