"""rlgen.compare._kl: how far the logprobs of the same tokens moved between two weight versions (no server)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlgen.compare._kl import LogprobShift, compare, shift_color
from rlgen.rollouts import Rollouts, rollouts_from_responses

NAN = float("nan")


def entry(ids: list[int], lps: list[float] | None, *, texts: list[str] | None = None) -> dict:
    meta = {"id": "r", "finish_reason": {"type": "stop", "matched": None}, "completion_tokens": len(ids)}
    if lps is not None:
        meta["output_token_logprobs"] = [[lp, t, None if texts is None else texts[j]]
                                         for j, (lp, t) in enumerate(zip(lps, ids))]
    return {"text": "".join(texts or []), "output_ids": ids, "meta_info": meta}


def rows(ids: list[list[int]], lps: list[list[float]] | None, *, n: int = 1, prompts: list[list[int]] | None = None,
         texts: list[list[str]] | None = None, sampling: dict | None = None) -> Rollouts:
    prompts = prompts if prompts is not None else [[1, 2]] * (len(ids) // n)
    return rollouts_from_responses(
        [entry(i, None if lps is None else lp, texts=None if texts is None else texts[r])
         for r, (i, lp) in enumerate(zip(ids, lps or [None] * len(ids)))],
        prompt_ids=prompts, prompt_texts=[f"prompt <{p}> & more" for p in range(len(prompts))], n=n,
        pad_token_id=0, sampling=sampling,
    )


IDS = [[5, 6, 7], [8]]


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # torch.allclose, not torch.testing: its first call imports for seconds.
    assert actual.shape == expected.shape and torch.allclose(actual, expected.to(actual.dtype), rtol=1e-6, atol=1e-7), \
        (actual, expected)


# -- the estimators --------------------------------------------------------------------------------


def test_k1_k2_k3_equal_their_definitions_on_hand_computed_values() -> None:
    shift = compare(rows(IDS, [[-1.0, -0.5, -2.0], [-3.0]]), rows(IDS, [[-1.5, -0.25, -2.0], [-1.0]]))
    t = shift.tensors()
    log_r = torch.tensor([[-0.5, 0.25, 0.0], [2.0, 0.0, 0.0]])
    r = torch.exp(log_r)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert torch.equal(t["mask"], mask)
    assert_close(t["diff"], log_r)
    assert_close(t["ratio"], torch.where(mask, r, 0.0))
    assert_close(t["k1"], -log_r + 0.0)
    assert_close(t["k2"], 0.5 * log_r**2)
    assert_close(t["k3"], torch.where(mask, (r - 1) - log_r, 0.0))
    assert all(t[k].dtype == torch.float32 for k in ("logprobs_a", "logprobs_b", "diff", "ratio", "k1", "k2", "k3"))
    # row sums are the sequence-level estimates; k3_per_token their mean
    row0 = shift.df.iloc[0]
    assert row0["k1"] == pytest.approx(0.25)
    assert row0["k2"] == pytest.approx(0.125 + 0.03125)
    k3 = (math.exp(-0.5) - 1 + 0.5) + (math.exp(0.25) - 1 - 0.25)
    assert row0["k3"] == pytest.approx(k3) and row0["k3_per_token"] == pytest.approx(k3 / 3)
    assert row0["diff_mean"] == pytest.approx(-0.25 / 3) and row0["diff_max_abs"] == pytest.approx(0.5)
    assert row0["ratio_min"] == pytest.approx(math.exp(-0.5)) and row0["ratio_max"] == pytest.approx(math.exp(0.25))
    assert shift.summary["k3_per_token"] == pytest.approx((k3 + math.exp(2.0) - 1 - 2.0) / 4)
    assert shift.summary["k1_per_sequence"] == pytest.approx((0.25 - 2.0) / 2)


def test_k2_and_k3_are_never_negative_while_single_k1_values_can_be() -> None:
    rng = np.random.default_rng(1)
    ids = [[int(x) for x in rng.integers(3, 50, 30)] for _ in range(8)]
    lp_a = [list(-rng.exponential(1.0, 30)) for _ in range(8)]
    lp_b = [list(-rng.exponential(1.0, 30)) for _ in range(8)]
    t = compare(rows(ids, lp_a), rows(ids, lp_b)).tensors()
    assert (t["k2"] >= 0).all() and (t["k3"] >= 0).all()
    assert (t["k1"] < 0).any()


def test_padding_and_missing_logprobs_are_left_out_and_counted() -> None:
    a = rows(IDS, [[-1.0, NAN, -2.0], [-3.0]])
    b = rows(IDS, [[-1.0, -0.5, NAN], [-3.5]])
    shift = compare(a, b)
    t = shift.tensors()
    assert t["mask"].tolist() == [[True, False, False], [True, False, False]]
    assert shift.missing == 2 and shift.summary["missing"] == 2 and shift.summary["tokens_compared"] == 2
    for name in ("logprobs_a", "logprobs_b", "diff", "ratio", "k1", "k2", "k3"):
        assert not t[name].isnan().any() and (t[name][~t["mask"]] == 0).all(), name
    assert shift.df["tokens_compared"].tolist() == [1, 1]
    assert shift.df["completion_tokens"].tolist() == [3, 1]


def test_a_row_with_nothing_compared_has_nan_numbers_and_is_left_out_of_the_means() -> None:
    shift = compare(rows(IDS, [[NAN, NAN, NAN], [-1.0]]), rows(IDS, [[-1.0, -1.0, -1.0], [-2.0]]))
    assert shift.df["tokens_compared"].tolist() == [0, 1]
    assert math.isnan(shift.df["k3"].iloc[0]) and math.isnan(shift.df["diff_mean"].iloc[0])
    assert shift.summary["k1_per_sequence"] == pytest.approx(1.0) and shift.summary["rows_compared"] == 1


def test_identical_a_and_b_give_exactly_zero_everywhere() -> None:
    a = rows(IDS, [[-1.0, -0.5, -2.0], [-3.0]])
    shift = compare(a, a)
    t = shift.tensors()
    for name in ("diff", "k1", "k2", "k3"):
        assert (t[name] == 0).all() and not t[name].signbit().any(), name
    assert (t["ratio"][t["mask"]] == 1).all()
    s = shift.summary
    assert s["k1_per_token"] == s["k2_per_token"] == s["k3_per_token"] == s["diff_max_abs"] == 0.0
    assert (shift.df[["k1", "k2", "k3", "diff_mean", "diff_max_abs"]] == 0).all().all()


def test_k1_and_k3_estimate_the_true_kl_and_k3_varies_less_than_k1() -> None:
    # Tokens drawn from P over a 20-token vocabulary; a holds log P of each, b log Q.
    rng = np.random.default_rng(0)
    logits_p = rng.normal(0.0, 1.0, 20)
    logits_q = logits_p + rng.normal(0.0, 0.3, 20)
    log_p = logits_p - np.logaddexp.reduce(logits_p)
    log_q = logits_q - np.logaddexp.reduce(logits_q)
    true_kl = float(np.sum(np.exp(log_p) * (log_p - log_q)))
    tokens = rng.choice(20, size=(100, 200), p=np.exp(log_p))
    ids = [[int(x) + 3 for x in row] for row in tokens]
    a = rows(ids, [[float(log_p[x]) for x in row] for row in tokens])
    b = rows(ids, [[float(log_q[x]) for x in row] for row in tokens])
    t = compare(a, b).tensors()
    k1, k3 = t["k1"][t["mask"]].double(), t["k3"][t["mask"]].double()
    assert k1.numel() == 20_000 and true_kl > 0.02
    for estimate in (k1, k3):
        stderr = float(estimate.std()) / math.sqrt(estimate.numel())
        assert abs(float(estimate.mean()) - true_kl) < 4 * stderr + 1e-4
    assert float(k3.var()) < float(k1.var())


# -- refusals --------------------------------------------------------------------------------------


def test_b_with_other_response_tokens_is_refused_naming_the_row() -> None:
    a = rows([[5], [6], [7, 8]], [[-1.0], [-1.0], [-1.0, -1.0]], prompts=[[1], [2], [3]])
    b = rows([[5], [6], [7, 9]], [[-1.0], [-1.0], [-1.0, -1.0]], prompts=[[1], [2], [3]])
    with pytest.raises(ValueError, match=r"^b holds different response tokens in row 2; score a's rows under the "
                                         r"other weights with eng.score\(a\)$"):
        compare(a, b)
    longer = rows([[5], [6, 1], [7, 8]], [[-1.0], [-1.0, -1.0], [-1.0, -1.0]], prompts=[[1], [2], [3]])
    with pytest.raises(ValueError, match="different response tokens in row 1"):
        compare(a, longer)


def test_other_rows_or_prompts_are_refused() -> None:
    a = rows(IDS, [[-1.0] * 3, [-1.0]])
    with pytest.raises(ValueError, match="a has 2 rows and b 1"):
        compare(a, a[[0]])
    other_prompt = rows(IDS, [[-1.0] * 3, [-1.0]], prompts=[[1, 2], [1, 3]])
    with pytest.raises(ValueError, match="b holds a different prompt in row 1"):
        compare(a, other_prompt)


def test_a_side_without_logprobs_or_a_non_rollouts_is_refused() -> None:
    a = rows(IDS, [[-1.0] * 3, [-1.0]])
    with pytest.raises(ValueError, match=r"b has no logprobs.*eng.score\(b\)"):
        compare(a, rows(IDS, None))
    with pytest.raises(TypeError, match="b must be a Rollouts"):
        compare(a, a.tensors())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="labels must be two strings"):
        compare(a, a, labels="ab")
    with pytest.raises(ValueError, match="labels must differ"):
        compare(a, a, labels=("x", "x"))


def test_sampled_at_another_temperature_against_a_rescore_warns_and_says_why() -> None:
    a = rows(IDS, [[-1.0] * 3, [-1.0]], sampling={"temperature": 0.7})
    b = rows(IDS, [[-1.0] * 3, [-1.0]], sampling={"score": True})
    with pytest.warns(RuntimeWarning, match="temperature 0.7"):
        shift = compare(a, b)
    assert shift.note is not None and "temperature 0.7" in repr(shift)
    assert compare(b, b).note is None


# -- tables ----------------------------------------------------------------------------------------


def two_prompts_by_two() -> tuple[Rollouts, Rollouts]:
    ids = [[5, 6], [5], [7, 7, 7], [8]]
    a = rows(ids, [[-1.0, -1.0], [-1.0], [-1.0, -1.0, -1.0], [-1.0]], n=2, prompts=[[1], [2]],
             texts=[["a", "b"], ["a"], ["c", "c", "c"], ["d"]])
    b = rows(ids, [[-1.1, -1.0], [-1.0], [-2.0, -1.0, -1.0], [-0.5]], n=2, prompts=[[1], [2]])
    return a, b


def test_the_df_lines_up_with_a_and_adds_to_it_with_with_columns() -> None:
    a, b = two_prompts_by_two()
    shift = compare(a, b)
    assert list(shift.df.columns) == ["prompt_index", "sample_index", "completion_tokens", "tokens_compared",
                                      "diff_mean", "diff_max_abs", "ratio_min", "ratio_max", "k1", "k2", "k3",
                                      "k3_per_token"]
    assert shift.df.index.equals(a.df.index)
    res = a.with_columns({"kl_k3": shift.df["k3"]})
    assert res.df["kl_k3"].tolist() == shift.df["k3"].tolist()


def test_per_prompt_averages_the_row_sums_of_each_prompt_group() -> None:
    a, b = two_prompts_by_two()
    shift = compare(a, b)
    table = shift.per_prompt()
    assert table["prompt_index"].tolist() == [0, 1] and table["samples"].tolist() == [2, 2]
    assert table["k1"].tolist() == pytest.approx([(0.1 + 0.0) / 2, (1.0 - 0.5) / 2])
    assert table["diff_mean"].iloc[1] == pytest.approx((-1.0 + 0.5) / 4)
    assert table["tokens_compared"].tolist() == [3, 4]


def test_top_gives_the_rows_that_moved_most_with_their_completion() -> None:
    a, b = two_prompts_by_two()
    shift = compare(a, b)
    top = shift.top(2)
    k3 = shift.df["k3"]
    assert list(top.index) == list(k3.sort_values(ascending=False).index[:2])
    assert top["completion"].iloc[0] == "ccc" and "k3" in top.columns
    assert list(shift.top(4, by="diff_mean").index)[:2] == [3, 2]  # |+0.5| before |-1/3|
    with pytest.raises(ValueError, match="by must be one of"):
        shift.top(by="ratio_min")


# -- display ---------------------------------------------------------------------------------------


def test_the_html_shows_the_summary_and_escaped_rows_with_a_legend() -> None:
    ids = [[5, 6, 7]]
    texts = [["<script>", " a&b", "\n"]]
    shift = compare(rows(ids, [[-1.0, -1.0, -1.0]], texts=texts), rows(ids, [[-1.5, -0.5, NAN]], texts=texts),
                    labels=("step <0>", "step 1"))
    page = shift._repr_html_()
    assert "&lt;script&gt;" in page and " a&amp;b" in page and "<script>" not in page
    assert "step &lt;0&gt;" in page and "step <0>" not in page
    assert "rlgen-legend" in page and "red: lower under step 1" in page
    assert "prompt &lt;0&gt; &amp; more" in page
    assert "lp step &lt;0&gt; -1.0000 | lp step 1 -1.5000 | diff -0.5000 | ratio 0.6065" in page
    assert "max-width:1000px" in page and "k3" in page


def test_the_heatmap_draws_chosen_rows_and_colours_by_the_sign_of_the_diff() -> None:
    a, b = two_prompts_by_two()
    shift = compare(a, b)
    heat = shift.heatmap([2, 3])
    assert heat.rows == [2, 3] and heat.scale == 1.0
    assert repr(heat) == "<ShiftHeatmap of 2 rows: diff = lp b − lp a, full colour at ±1>"
    assert heat._repr_html_() == heat.html and "row 2 · prompt 1" in heat.html
    assert shift.heatmap(shift.top(1)).rows == [2]
    assert shift.heatmap(max_rows=1).rows == [2] and "3 more rows" in shift.heatmap(list(range(4)), max_rows=1).html
    with pytest.raises(ValueError, match=r"row positions 0\.\.3"):
        shift.heatmap([4])
    assert shift_color(0.0, 1.0) == "#ffffff"
    lower, higher = shift_color(-1.0, 1.0), shift_color(1.0, 1.0)
    assert int(lower[1:3], 16) > int(lower[5:7], 16) and int(higher[5:7], 16) > int(higher[1:3], 16)


def test_the_repr_is_one_readable_line() -> None:
    a, b = two_prompts_by_two()
    text = repr(compare(a, b, labels=("old", "new")))
    assert text.startswith("<LogprobShift old → new: 7 tokens in 4 rows | KL(old‖new) per token: k1 ")
    assert "\n" not in text and isinstance(compare(a, b), LogprobShift)
