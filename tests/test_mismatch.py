"""rlgen.sampler_vs_trainer: the sampler's logprobs against a trainer's forward pass, token by token.

Without a server: the corrections and metrics on hand-computed tensors (k3, TIS, MIS, their clip
shares, verl's chi2 / ESS / off-policy metrics), and the whole recipe on a bigram "model" whose
logprobs are known by hand (alignment, padding, temperature, bins, staleness, refusals, views).
With the CPU backend (a real server process) and SmolLM2-135M in transformers on the CPU: the
trainer scoring the very weights that sampled agrees with the sampled logprobs to float32
rounding, at T = 1 and T = 0.7; a perturbed copy shows a clear mismatch and clips.

The bound asserted for the same weights, max |log r| < 1e-4 and mean |log r| < 1e-5 per token,
comes from a measurement of this test's recipe (2026-12-05, 8 prompts x 4 samples x 128 tokens,
`ignore_eos`, 4,096 tokens per temperature, batch sizes 1, 8 and 32): max 3.3e-5 to 3.7e-5, mean
3.1e-6 (T = 1) and 2.5e-6 (T = 0.7), 9% (T = 1) to 25% (T = 0.7) of tokens bitwise equal. The CPU
backend decodes token by token with a KV cache and the trainer runs one padded forward pass:
the same float32 math in other shapes, so equal to rounding, not bit for bit.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import rlgen
from rlgen.compare import mis, sampler_vs_trainer, tis
from rlgen.compare._mismatch_metrics import (
    bin_index,
    chi2_seq,
    chi2_token,
    eff_sample_size,
    is_metrics,
    k3,
    mis_fraction,
    offpolicy_metrics,
    power_of_two_edges,
    tis_fraction,
)
from rlgen.rollouts import Rollouts, rollouts_from_responses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore:these prompts are plain text")

# The same weights: max and mean |lp_trainer - lp_sampler| per token (see the module docstring).
SAME_MAX, SAME_MEAN = 1e-4, 1e-5
LN = math.log


def tensor(x: Any) -> Any:
    return x.detach().double() if isinstance(x, torch.Tensor) else torch.tensor(np.asarray(x, dtype=np.float64))


def close(actual: Any, expected: Any, tol: float = 1e-9) -> bool:
    a, e = tensor(actual), tensor(expected)
    return bool(a.shape == e.shape and torch.allclose(a, e, rtol=tol, atol=tol))


# -- the corrections and metrics on hand-computed tensors --------------------------------------------
# Row 0: ratios 3, 1/4 and a padded position holding a huge log ratio that must never count;
# row 1: ratio 1.5; row 2: no compared token at all.
LR = torch.tensor([[LN(3.0), LN(0.25), 50.0], [LN(1.5), -50.0, 0.0], [7.0, 0.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])


def test_k3_is_r_minus_1_minus_log_r_and_never_negative() -> None:
    assert close(k3(LR[0, :2]), [3 - 1 - LN(3), 0.25 - 1 - LN(0.25)])
    tiny = torch.tensor([1e-9, -1e-9], dtype=torch.float64)
    assert close(k3(tiny), [0.5e-18, 0.5e-18], tol=1e-24) and bool((k3(torch.linspace(-5, 5, 101)) >= 0).all())


def test_tis_truncates_token_and_sequence_weights_at_the_cap_and_is_0_on_padding() -> None:
    assert close(tis(LR, MASK, cap=2.0), [[2.0, 0.25, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # sequence: the product of the row's ratios (3 x 1/4 = 0.75), on every token of the row
    assert close(tis(LR, MASK, cap=2.0, level="sequence"), [[0.75, 0.75, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert close(tis(LR, MASK, cap=1.2, level="sequence"), [[0.75, 0.75, 0.0], [1.2, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_mis_keeps_weights_inside_the_bounds_and_masks_the_rest_to_0() -> None:
    assert close(mis(LR, MASK, lower=0.5, upper=2.0), [[0.0, 0.0, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert close(mis(LR, MASK, level="sequence"), [[0.75, 0.75, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    geo = math.sqrt(0.75)  # the geometric mean of 3 and 1/4
    assert close(mis(LR, MASK, lower=0.9, upper=1.1, level="geometric"), [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0] * 3])
    assert close(mis(LR, MASK, lower=0.8, upper=1.6, level="geometric"), [[geo, geo, 0.0], [1.5, 0.0, 0.0], [0.0] * 3])
    with pytest.raises(ValueError, match="lower < upper"):
        mis(LR, MASK, lower=2.0, upper=0.5)
    with pytest.raises(ValueError, match="level must be one of 'token', 'sequence'"):
        tis(LR, MASK, level="geometric")  # type: ignore[arg-type]


def test_clip_and_mask_shares_count_compared_tokens_and_rows_only() -> None:
    assert tis_fraction(LR, MASK, cap=2.0) == pytest.approx(1 / 3)        # the 3 of (3, 1/4, 1.5)
    assert tis_fraction(LR, MASK, cap=1.2, level="sequence") == pytest.approx(1 / 2)  # 1.5 of (0.75, 1.5)
    assert mis_fraction(LR, MASK) == pytest.approx(2 / 3)                 # 3 and 1/4 outside [0.5, 2]
    assert mis_fraction(LR, MASK, level="sequence") == 0.0
    empty = torch.zeros_like(MASK)
    assert math.isnan(tis_fraction(LR, empty)) and math.isnan(mis_fraction(LR, empty, level="sequence"))


def test_chi2_and_the_effective_sample_size_follow_verls_formulas() -> None:
    assert chi2_token(LR, MASK) == pytest.approx((9 + 1 / 16 + 2.25) / 3 - 1)
    assert chi2_seq(LR, MASK) == pytest.approx((0.75**2 + 1.5**2) / 2 - 1)
    w = np.array([2.0, 0.5, 1.5])  # the token weights clamped to [1/2, 2]
    assert eff_sample_size(LR, MASK, cap=2.0) == pytest.approx(1 / np.mean((w / w.mean()) ** 2))
    same = torch.zeros_like(LR)
    assert eff_sample_size(same, MASK) == pytest.approx(1.0) and chi2_token(same, MASK) == 0.0


def test_offpolicy_and_is_metrics_use_verls_and_trls_names_and_definitions() -> None:
    trainer = torch.tensor([[-1.0, -2.0, 9.0], [-0.5, 9.0, 9.0]], dtype=torch.float64)
    sampler = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    m = offpolicy_metrics(trainer, sampler, mask)
    lr = np.array([0.5, -1.0, 0.0])  # trainer - sampler, compared tokens only
    assert m["kl"] == pytest.approx(-lr.mean())
    assert m["k3_kl"] == pytest.approx(np.mean(np.exp(lr) - 1 - lr))
    assert m["training_ppl"] == pytest.approx((math.exp(1.5) + math.exp(0.5)) / 2)  # rows' mean lp: -1.5, -0.5
    assert m["rollout_ppl"] == pytest.approx((math.exp(1.25) + math.exp(0.5)) / 2)  # rows' mean lp: -1.25, -0.5
    assert m["log_ppl_diff"] == pytest.approx((0.25 + 0.0) / 2)  # per row: mean sampler - mean trainer
    assert m["log_ppl_diff_max"] == pytest.approx(0.25) and m["log_ppl_diff_min"] == 0.0
    assert m["ppl_ratio"] == pytest.approx((math.exp(0.25) + 1.0) / 2)
    assert m["chi2_seq"] == pytest.approx((math.exp(-1.0) + 1.0) / 2 - 1)
    i = is_metrics(torch.where(mask, trainer - sampler, 0.0), mask, cap=2.0)
    assert i["sampling_logp_difference/mean"] == pytest.approx(0.5)
    assert i["sampling_logp_difference/max"] == pytest.approx(1.0)
    assert i["rollout_is_max"] == pytest.approx(math.exp(0.5)) and i["rollout_is_min"] == pytest.approx(math.exp(-1))
    assert i["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3) and i["rollout_is_ratio_fraction_high"] == 0.0
    assert all(math.isnan(v) for v in offpolicy_metrics(trainer, sampler, torch.zeros_like(mask)).values())


def test_bins_put_each_value_in_one_half_open_bin() -> None:
    assert power_of_two_edges(0, 10) == [0, 1, 2, 4, 8, 16] and power_of_two_edges(1, 10) == [1, 2, 4, 8, 16]
    assert power_of_two_edges(0, 0) == [0, 1]
    positions = np.array([0, 1, 2, 3, 4, 7, 8, 15, 16])
    assert bin_index(positions, [0, 1, 2, 4, 8, 16]).tolist() == [0, 1, 2, 2, 3, 3, 4, 4, -1]
    p = np.array([0.0, 0.0005, 0.5, 0.99, 1.0])
    assert bin_index(p, [0, 0.001, 0.5, 1.0], closed_last=True).tolist() == [0, 0, 2, 2, 2]
    with pytest.raises(ValueError, match="increasing"):
        bin_index(p, [0.5, 0.1])


# -- the recipe on a bigram "model" whose logprobs are known by hand ---------------------------------
V = 12


class Bigram(torch.nn.Module):
    """A causal LM whose logits at a position depend on that position's token only: the logprob of
    token t after token s is log_softmax(table[s])[t], so the right answer is known by hand."""

    def __init__(self, seed: int = 0, vocab: int = V) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 2)
        self.config = SimpleNamespace(vocab_size=vocab)

    def forward(self, input_ids: Any, attention_mask: Any = None, position_ids: Any = None, use_cache: bool = False,
                **_: Any) -> Any:
        assert position_ids is not None and attention_mask is not None
        return SimpleNamespace(logits=self.table[input_ids])


def expected(model: Bigram, prompt: list[int], response: list[int], temperature: float = 1.0) -> list[float]:
    previous = [prompt[-1], *response[:-1]]
    table = torch.log_softmax(model.table.detach().double() / temperature, dim=-1)
    return [float(table[s, t]) for s, t in zip(previous, response)]


def entry(ids: list[int], lps: list[float] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": "r", "finish_reason": {"type": "stop", "matched": None}, "completion_tokens": len(ids)}
    if lps is not None:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, ids)]
    return {"text": "", "output_ids": ids, "meta_info": meta}


PROMPTS = [[1, 2, 3], [4], [5, 6]]
RESPONSES = [[7, 8, 9, 10], [11], [3, 3, 0]]


def bigram_rows(model: Bigram, *, temperature: float = 1.0, lps: list[list[float]] | None = None,
                sampling: dict[str, Any] | None = None, **kw: Any) -> Rollouts:
    """The rows sampled from `model` at `temperature` (their logprobs exact unless `lps` says)."""
    lps = lps if lps is not None else [expected(model, p, r, temperature) for p, r in zip(PROMPTS, RESPONSES)]
    return rollouts_from_responses([entry(r, lp) for r, lp in zip(RESPONSES, lps)], prompt_ids=PROMPTS, pad_token_id=0,
                                   sampling=sampling if sampling is not None else {"temperature": temperature}, **kw)


@pytest.mark.parametrize("batch_size", [1, 2, 8])
def test_logits_at_t_minus_1_score_token_t_for_every_prompt_and_response_length(batch_size: int) -> None:
    model = Bigram()
    mm = sampler_vs_trainer(bigram_rows(model), model, batch_size=batch_size, progress=False)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        assert close(mm.trainer_logprobs[i, :len(r)], expected(model, p, r), tol=1e-5)
        assert not mm.trainer_logprobs[i, len(r):].any()  # padding stays 0.0
    assert mm.summary["sampling_logp_difference/max"] < 1e-5 and mm.summary["tis_token_clip_fraction"] == 0.0


def test_padding_is_never_counted_and_missing_logprobs_are_counted_apart() -> None:
    model = Bigram()
    lps = [expected(model, p, r) for p, r in zip(PROMPTS, RESPONSES)]
    lps[2][1] = math.nan  # a logprob the server did not return
    mm = sampler_vs_trainer(bigram_rows(model, lps=lps), model, progress=False)
    assert mm.mask.sum() == 4 + 1 + 2 and mm.missing == 1 and mm.summary["tokens"] == 7
    assert mm.df["tokens_compared"].tolist() == [4, 1, 2]
    assert mm.by_position()["tokens"].sum() == 7 and mm.by_probability()["tokens"].sum() == 7
    assert not (mm.log_ratio[~mm.mask].any() or mm.ratio[~mm.mask].any() or mm.k3[~mm.mask].any())


def test_the_per_token_numbers_and_the_row_table_follow_the_definitions() -> None:
    sampler, trainer = Bigram(seed=0), Bigram(seed=1)
    mm = sampler_vs_trainer(bigram_rows(sampler), trainer, tis_cap=3.0, mis=(0.25, 4.0), progress=False)
    lr = [np.array(expected(trainer, p, r)) - np.array(expected(sampler, p, r)) for p, r in zip(PROMPTS, RESPONSES)]
    flat = np.concatenate(lr)
    assert close(mm.log_ratio[mm.mask], flat, tol=1e-5) and close(mm.ratio[mm.mask], np.exp(flat), tol=1e-4)
    assert close(mm.k3[mm.mask], np.expm1(flat) - flat, tol=1e-4)
    assert close(mm.df["log_ratio_sum"].to_numpy(), [x.sum() for x in lr], tol=1e-5)
    assert mm.df["tis_clipped"].tolist() == [int((x > LN(3.0)).sum()) for x in lr]
    assert mm.df["mis_masked"].tolist() == [int(((x < LN(0.25)) | (x > LN(4.0))).sum()) for x in lr]
    assert mm.summary["tis_token_clip_fraction"] == pytest.approx((flat > LN(3.0)).mean())
    assert mm.summary["k3_kl"] == pytest.approx(np.mean(np.expm1(flat) - flat), rel=1e-4)
    assert mm.summary["kl"] == pytest.approx(-flat.mean(), rel=1e-4, abs=1e-6)


def test_by_position_and_by_length_bin_the_compared_tokens() -> None:
    sampler, trainer = Bigram(seed=0), Bigram(seed=1)
    mm = sampler_vs_trainer(bigram_rows(sampler), trainer, progress=False)
    pos = mm.by_position()
    # positions 0 (3 rows), 1 (2 rows), 2-3 (rows 0 and 2: 3 tokens)
    assert pos[["position_start", "position_end", "tokens"]].values.tolist() == [[0, 1, 3], [1, 2, 2], [2, 4, 3]]
    first = mm.log_ratio[:, 0].numpy()
    assert pos["log_ratio_mean"][0] == pytest.approx(first.mean()) and pos["abs_log_ratio_mean"][0] == pytest.approx(
        np.abs(first).mean())
    assert mm.by_position([0, 2, 10])["tokens"].tolist() == [5, 3]
    length = mm.by_length()  # lengths 4, 1, 3
    assert length[["length_start", "length_end", "rows", "tokens"]].values.tolist() == [[1, 2, 1, 1], [2, 4, 1, 3],
                                                                                       [4, 8, 1, 4]]
    assert length["seq_log_ratio_mean"][0] == pytest.approx(mm.df["log_ratio_sum"][1])


def test_the_temperature_comes_from_the_recorded_sampling_or_the_argument() -> None:
    model = Bigram()
    warm = bigram_rows(model, temperature=0.7)
    assert sampler_vs_trainer(warm, model, progress=False).summary["sampling_logp_difference/max"] < 1e-5
    with pytest.warns(RuntimeWarning, match="sampled at temperature 0.7 and is scored at temperature=1"):
        wrong = sampler_vs_trainer(warm, model, temperature=1.0, progress=False)
    assert wrong.summary["sampling_logp_difference/mean"] > 0.1 and wrong.notes
    unrecorded = rollouts_from_responses([entry(r, lp) for r, lp in zip(RESPONSES, [
        expected(model, p, r, 0.7) for p, r in zip(PROMPTS, RESPONSES)])], prompt_ids=PROMPTS, pad_token_id=0)
    with pytest.raises(ValueError, match="pass temperature="):
        sampler_vs_trainer(unrecorded, model, progress=False)
    mm = sampler_vs_trainer(unrecorded, model, temperature=0.7, progress=False)
    assert mm.summary["temperature"] == 0.7 and mm.summary["sampling_logp_difference/max"] < 1e-5
    greedy = bigram_rows(model, temperature=1.0, sampling={"temperature": 0.0})  # greedy logprobs are at T = 1
    assert sampler_vs_trainer(greedy, model, progress=False).summary["sampling_logp_difference/max"] < 1e-5


def test_penalties_and_top_p_warn_that_the_two_sides_differ_by_construction() -> None:
    model = Bigram()
    with pytest.warns(RuntimeWarning) as caught:
        sampler_vs_trainer(bigram_rows(model, sampling={"temperature": 1.0, "top_p": 0.9, "top_k": 20,
                                                        "frequency_penalty": 0.5}), model, progress=False)
    messages = [str(w.message) for w in caught]
    assert any("frequency_penalty=0.5" in m for m in messages)
    assert any("top_p=0.9, top_k=20" in m and "before that filter" in m for m in messages)


def test_tokens_by_staleness_count_against_the_current_version() -> None:
    sampler, trainer = Bigram(seed=0), Bigram(seed=1)
    versions = [[0, 0, 1, 1], [1], [0, 2, 2]]
    rows = bigram_rows(sampler, token_versions=versions)
    table = sampler_vs_trainer(rows, trainer, progress=False).by_staleness()  # current: the newest, 2
    assert table[["staleness", "tokens", "rows"]].values.tolist() == [[0, 2, 1], [1, 3, 2], [2, 3, 2]]
    later = sampler_vs_trainer(rows, trainer, current_version=5, progress=False).by_staleness()
    assert later["staleness"].tolist() == [3, 4, 5]
    plain = rollouts_from_responses([entry(r, expected(sampler, p, r)) for p, r in zip(PROMPTS, RESPONSES)],
                                    prompt_ids=PROMPTS, pad_token_id=0, sampling={"temperature": 1.0})
    with pytest.raises(ValueError, match="no per-token weight versions"):
        sampler_vs_trainer(plain, trainer, progress=False).by_staleness()


def test_bad_inputs_are_refused_saying_what_to_do() -> None:
    model = Bigram()
    rows = bigram_rows(model)
    no_logprobs = rollouts_from_responses([entry(r, None) for r in RESPONSES], prompt_ids=PROMPTS, pad_token_id=0,
                                          sampling={"temperature": 1.0})
    with pytest.raises(ValueError, match="logprobs=True"):
        sampler_vs_trainer(no_logprobs, model)
    with pytest.raises(ValueError, match="empty"):
        sampler_vs_trainer(rows[[]], model)
    with pytest.raises(TypeError, match="must be a Rollouts"):
        sampler_vs_trainer(rows.df, model)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        sampler_vs_trainer(rows, "HuggingFaceTB/SmolLM2-135M")
    with pytest.raises(rlgen.ModelError, match="token id 11 is past the model's vocabulary of 10"):
        sampler_vs_trainer(rows, Bigram(vocab=10))
    with pytest.raises(rlgen.ModelError, match="the tokenizer has 151665 tokens"):
        sampler_vs_trainer(rows, model, tokenizer=[0] * 151665)
    with pytest.raises(rlgen.ModelError, match="different models"):
        sampler_vs_trainer(rows, Bigram(vocab=2000), tokenizer=[0] * V)
    for bad, match in (({"batch_size": 0}, "batch_size"), ({"tis_cap": 0.5}, "tis_cap"), ({"mis": (2.0, 0.5)}, "mis"),
                       ({"temperature": -1.0}, "temperature"), ({"current_version": 1.5}, "current_version")):
        with pytest.raises(ValueError, match=match):
            sampler_vs_trainer(rows, model, **bad)


def test_the_model_is_scored_in_eval_mode_and_left_in_its_own_mode() -> None:
    model = Bigram()
    modes: list[bool] = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    model.train()
    sampler_vs_trainer(bigram_rows(model), model, progress=False)
    assert modes and not any(modes) and model.training


def test_the_df_lines_up_with_the_rollouts_and_adds_to_them() -> None:
    model = Bigram()
    rows = bigram_rows(model)[[2, 0]]
    mm = sampler_vs_trainer(rows, model, progress=False)
    assert mm.df.index.equals(rows.df.index) and mm.df["prompt_index"].tolist() == [2, 0]
    assert mm.df["tokens_compared"].tolist() == [3, 4]
    assert "log_ppl_diff" in rows.with_columns({"log_ppl_diff": mm.df["log_ppl_diff"]}).df


def test_the_repr_html_and_figure_show_the_numbers_and_thresholds() -> None:
    pytest.importorskip("matplotlib")
    sampler, trainer = Bigram(seed=0), Bigram(seed=1)
    rows = bigram_rows(sampler, token_versions=[[0, 0, 1, 1], [1], [0, 1, 1]], sampling={"temperature": 1.0, "top_p": 0.5})
    with pytest.warns(RuntimeWarning):
        mm = sampler_vs_trainer(rows, trainer, progress=False)
    text = repr(mm)
    assert text.startswith("<SamplerMismatch: 8 tokens in 3 rows (T=1)") and "\n" not in text and "TIS(2)" in text
    assert "MIS[0.5, 2]" in text and "note: run" in text
    page = mm._repr_html_()
    assert "k3_kl" in page and "rollout_is_eff_sample_size" in page and "sampling_logp_difference/mean" in page
    assert "<script" not in page and "top_p=0.5" in page
    # aligned inline, since JupyterLab strips <style> from an untrusted notebook's outputs: every cell
    import re

    cells = re.findall(r"<t[dh]( [^>]*)?>", page)
    assert cells and all("text-align:" in (attrs or "") for attrs in cells), cells
    fig = mm.plot()
    assert len(fig.axes) == 4  # position, probability, histogram, staleness (two versions)
    labels = {t.get_text() for t in fig.axes[2].get_legend().get_texts()}
    assert labels == {"TIS cap 2", "MIS lower 0.5", "MIS upper 2"}


# -- the CPU backend and SmolLM2-135M in transformers ------------------------------------------------
TEXTS = ["Count from one to twenty:", "Name some colours:", "Tell me a story about a cat:", "Write a poem about the sea."]
SAMPLE = {"n": 2, "max_new_tokens": 40, "ignore_eos": True, "logprobs": True, "seed": 3}


@pytest.fixture(scope="module")
def sampled(model_path: str) -> Iterator[dict[float, Rollouts]]:
    """Rows the CPU backend sampled at T = 1 and at T = 0.7, with their logprobs."""
    with rlgen.Engine(model_path, backend="cpu", progress=False) as eng:
        yield {t: eng.generate(TEXTS, temperature=t, **SAMPLE) for t in (1.0, 0.7)}


@pytest.fixture(scope="module")
def trainer(model_path: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_weights_that_sampled_agree_with_the_sampled_logprobs_to_float32_rounding(
        sampled: dict[float, Rollouts], trainer: Any, tok: Any, temperature: float) -> None:
    res = sampled[temperature]
    mm = sampler_vs_trainer(res, trainer, tokenizer=tok, progress=False)  # T from the recorded sampling
    s = mm.summary
    assert s["temperature"] == temperature and s["tokens"] == int(res.loss_mask.sum()) == 4 * 2 * 40
    assert s["sampling_logp_difference/max"] < SAME_MAX and s["sampling_logp_difference/mean"] < SAME_MEAN
    assert abs(s["kl"]) < SAME_MEAN and s["k3_kl"] < 1e-9 and abs(s["chi2_token"]) < 1e-6
    assert s["tis_token_clip_fraction"] == s["tis_seq_clip_fraction"] == 0.0
    assert s["mis_token_mask_fraction"] == s["mis_seq_mask_fraction"] == 0.0
    assert s["rollout_is_eff_sample_size"] > 1 - 1e-8 and abs(s["ppl_ratio"] - 1) < SAME_MEAN
    assert s["missing"] == 0 and not mm.notes
    assert mm.by_staleness()["staleness"].tolist() == [0]  # one version sampled every token


@pytest.mark.timeout(300)
def test_scoring_at_another_temperature_than_sampled_shows_a_mismatch(sampled: dict[float, Rollouts],
                                                                      trainer: Any) -> None:
    with pytest.warns(RuntimeWarning, match="sampled at temperature 0.7"):
        mm = sampler_vs_trainer(sampled[0.7], trainer, temperature=1.0, progress=False)
    assert mm.summary["sampling_logp_difference/mean"] > 100 * SAME_MEAN


@pytest.mark.timeout(300)
def test_a_perturbed_trainer_shows_a_clear_mismatch_and_corrections_start_to_clip(
        sampled: dict[float, Rollouts], trainer: Any) -> None:
    perturbed = copy.deepcopy(trainer)
    with torch.no_grad():
        weight = perturbed.model.layers[3].mlp.down_proj.weight
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)) * 0.1)
    mm = sampler_vs_trainer(sampled[1.0], perturbed, batch_size=3, progress=False)
    s = mm.summary
    assert s["sampling_logp_difference/mean"] > 1000 * SAME_MEAN and s["k3_kl"] > 1e-3
    # measured (seed 3, noise seed 0): TIS clips 0.9% of tokens, MIS masks 3.4% of tokens and 62% of sequences
    assert s["tis_token_clip_fraction"] > 0 and s["mis_token_mask_fraction"] > 0 and s["mis_seq_mask_fraction"] > 0.2
    assert s["rollout_is_eff_sample_size"] < 0.99
    # the mismatch concentrates on the tokens the sampler found unlikely
    p = mm.by_probability()
    assert p["abs_log_ratio_mean"].iloc[0] > 3 * p["abs_log_ratio_mean"].iloc[-1]
