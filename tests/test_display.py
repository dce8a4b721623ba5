"""Display: the Rollouts HTML table and text repr, and the Engine card."""

from __future__ import annotations

import html
import math
import re

from rlgen.client._answer import failed_entry
from rlgen.rollouts import Rollouts, rollouts_from_responses
from rlgen.rollouts._display import engine_html, logprob_color, rollouts_html
from rlgen.rollouts._token_text import TokenText


def entry(ids: list[int], *, finish: str = "stop", texts: list[str] | None = None, lp: float = -0.05) -> dict:
    logprobs = [[lp * (j + 1), t, None if texts is None else texts[j]] for j, t in enumerate(ids)]
    meta = {
        "id": "r",
        "finish_reason": {"type": finish, "matched": None},
        "completion_tokens": len(ids),
        "output_token_logprobs": logprobs,
    }
    return {"text": "", "output_ids": ids, "meta_info": meta}


def make(n_rows: int = 2, **kw) -> Rollouts:
    return rollouts_from_responses(
        [entry([5, 6], **kw) for _ in range(n_rows)],
        prompt_ids=[[1, 2]] * n_rows,
        prompt_texts=["say <hi> & bye"] * n_rows,
        pad_token_id=0,
        model="tiny",
    )


def body_rows(page: str) -> int:
    return page.split("<tbody>")[1].count("<tr>")


# -- HTML ------------------------------------------------------------------------------------------


def test_html_escapes_prompt_and_token_text():
    page = make(texts=["<script>", "a&b"])._repr_html_()
    assert "say &lt;hi&gt; &amp; bye" in page
    assert "&lt;script&gt;" in page and "a&amp;b" in page
    assert "<script>" not in page and "<hi>" not in page


def test_html_caps_rows_and_says_how_many_are_hidden():
    page = rollouts_html(make(30), max_rows=20)
    assert body_rows(page) == 20
    assert "showing 20 of 30 rows" in page
    assert "showing" not in rollouts_html(make(3), max_rows=20) and body_rows(rollouts_html(make(3))) == 3


def test_html_cuts_long_token_runs_and_keeps_the_end_of_long_prompts():
    res = rollouts_from_responses(
        [entry(list(range(10, 60)))], prompt_ids=[[1]], prompt_texts=["x" * 500 + "THE END"], pad_token_id=0
    )
    page = rollouts_html(res, max_tokens=10, max_chars=50)
    assert "+40 tokens" in page and page.count('title="response token') == 10
    assert "THE END" in page and "x" * 60 not in page.split("<details>")[0]
    assert "full prompt (507 chars)" in page and "x" * 500 + "THE END" in page  # one click away


def test_each_token_is_coloured_by_its_logprob_with_id_and_logprob_on_hover():
    page = make(lp=-1.0)._repr_html_()
    assert f'style="background:{logprob_color(-1.0)}" title="response token 0: id 5 | logprob -1.0000 (p=0.368)"' in page
    assert f'style="background:{logprob_color(-2.0)}" title="response token 1: id 6 | logprob -2.0000 (p=0.135)"' in page


def test_logprob_colour_runs_from_green_for_likely_to_red_for_unlikely_tokens():
    def rgb(c: str) -> tuple[int, int, int]:
        return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)

    likely, unlikely = rgb(logprob_color(0.0)), rgb(logprob_color(-8.0))
    assert likely[1] > likely[0] and unlikely[0] > unlikely[1]
    assert logprob_color(float("nan")) == "#dddddd"


def test_tokens_show_ids_without_texts_and_decoded_pieces_with_decode():
    res = make()
    assert ">5 </span>" in res._repr_html_()
    res.decode = lambda ids: [f"tok{i}" for i in ids]
    page = res._repr_html_()
    assert ">tok5</span>" in page and ">tok6</span>" in page


def test_a_failing_decode_falls_back_to_ids_instead_of_breaking_the_repr():
    res = make()

    def broken(ids):
        raise RuntimeError("no tokenizer")

    res.decode = broken
    assert ">5 </span>" in res._repr_html_()


def test_an_empty_token_text_stays_visible_as_a_box_and_an_empty_eos_as_its_id():
    page = make(texts=["a", ""])._repr_html_()
    assert ">▯</span>" in page and "title=\"response token 1: id 6 &#x27;&#x27;" in page
    res = rollouts_from_responses(
        [entry([5, 0], texts=["a", ""])], prompt_ids=[[1]], pad_token_id=0
    )  # pad id = EOS id, as for the default model: the EOS is a real response token
    assert "⟨0⟩</span>" in res._repr_html_()


def test_whitespace_is_visible_where_it_would_vanish_and_real_where_text_wraps():
    page = make(texts=[" ", "a b\n"])._repr_html_()
    assert ">·</span>" in page and ">a b↵\n</span>" in page


def test_special_tokens_are_grey_tags_and_the_eos_is_drawn_with_its_colour():
    res = rollouts_from_responses(
        [entry([5, 2], texts=["hi", "<|im_end|>"], lp=-1.0)], prompt_ids=[[1]], pad_token_id=2
    )
    page = res._repr_html_()
    tag = re.search(r'<span style="background:(#\w+)" title="response token 1: id 2[^"]*"><span style="color:#555[^"]*">&lt;\|im_end\|&gt;</span>', page)
    assert tag and tag.group(1) == logprob_color(-2.0)


def test_the_colour_is_on_a_log_scale_so_unlikely_and_very_unlikely_tokens_differ():
    assert logprob_color(math.log(0.05)) != logprob_color(math.log(1e-6))
    assert logprob_color(math.log(1e-6)) == logprob_color(-50.0)  # the scale ends at p = 1e-6
    page = make()._repr_html_()
    assert "rlgen-legend" in page
    for p in (1.0, 0.1, 0.01, 1e-4, 1e-6):
        assert f"background:{logprob_color(math.log(p))}" in page


def test_a_token_tooltip_lists_the_top_k_alternatives_texts_and_probabilities():
    e = entry([5, 6], lp=-0.5)
    e["meta_info"]["output_top_logprobs"] = [[[-0.5, 5, None], [-1.5, 7, None]], [[-1.0, 6, None], [-2.0, 8, None]]]
    res = rollouts_from_responses([e], prompt_ids=[[1]], pad_token_id=0)
    res.decode = lambda ids: [{5: " Paris", 6: "\n", 7: " Lyon", 8: "é"}[i] for i in ids]
    page = res._repr_html_()
    assert "top: &#x27; Paris&#x27; p=0.607, &#x27; Lyon&#x27; p=0.223" in page
    assert "top: &#x27;\\n&#x27; p=0.368, &#x27;é&#x27; p=0.135" in page


def test_jupyterlab_cell_alignment_is_beaten_by_a_more_specific_rlgen_rule():
    page = make()._repr_html_()
    style = page.split("<style>")[1].split("</style>")[0]
    # JupyterLab: `:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td {text-align: right}` is (0,2,1).
    rule = re.search(r"([^{}]*)\{([^}]*text-align:left[^}]*)\}", style)
    assert rule and ".jp-RenderedHTMLCommon .rlgen-rollouts table td" in rule.group(1)
    assert "vertical-align:top" in rule.group(2)


def test_html_shows_finish_reason_errors_and_user_columns():
    res = rollouts_from_responses(
        [entry([5]), failed_entry("server <gone>")], prompt_ids=[[1], [2]], pad_token_id=0
    )
    res.df["reward"] = [0.5, 0.25]
    page = res._repr_html_()
    assert "error: server &lt;gone&gt;" in page and "(empty)" in page
    assert re.search(r"<th(?: [^>]*)?>reward</th>", page) and '<span style="color:#888">reward</span> 0.25</div>' in page


def grouped(n_prompts: int = 2, n: int = 3) -> Rollouts:
    """A chat-style result: n samples per prompt, the system prompt in the templated text."""
    messages = [[{"role": "system", "content": "You are a long system prompt. " * 10},
                 {"role": "user", "content": f"Question {p}?"}] for p in range(n_prompts)]
    res = rollouts_from_responses(
        [entry([5, 6, 0]) for _ in range(n_prompts * n)],
        prompt_ids=[[1, 2, 3, 4]] * n_prompts,
        prompt_texts=[f"<|im_start|>system ... <|im_start|>user Question {p}?<|im_start|>assistant" for p in range(n_prompts)],
        n=n, pad_token_id=0, extra={"prompt_messages": [m for m in messages for _ in range(n)]},
    )
    rewards = ([1.0, 0.0, 1.0] * len(res))[: len(res)]
    return res.with_columns({"answer": ["42"] * len(res), "reward_exact": rewards, "reward_exact_status": ["ok"] * len(res),
                             "reward": rewards, "advantage": [r - 0.5 for r in rewards], "group_mean": [0.7] * len(res)})


def test_each_prompt_group_shows_its_last_user_message_once_with_the_full_prompt_on_demand():
    page = grouped()._repr_html_()
    body = page.split("<tbody>")[1]
    assert body.count('rowspan="3"') == 2 and body.count("<tr>") == 6
    assert body.count("Question 0?") == 2  # the user's message, and once more in the full prompt
    assert "long system prompt" not in body.split("<details>")[0]  # the system prompt is not in the way
    assert "full prompt (" in body


def headers(page: str) -> list[str]:
    return re.findall(r"<th(?: [^>]*)?>(.*?)</th>", page)


def test_finish_tokens_rewards_and_advantage_come_before_the_completion_and_details_stay_in_the_df():
    page = grouped()._repr_html_()
    assert headers(page) == ["prompt", "sample", "reward", "data", "completion"]
    cell = page.split("<tbody>")[1].split("</tr>")[0]
    for shown in (">#0 ", ">stop</span>", ">3 tok</span>", ">exact</span> 1<", ">reward</span> 1<", ">adv</span> 0.5<",
                  ">answer</span> 42<"):
        assert shown in cell, shown
    assert "exact_status" not in page.split("<tbody>")[1] and "group_mean" not in page.split("<tbody>")[1]


def test_too_many_data_columns_are_left_in_the_df_and_named_below_the_table():
    res = make().with_columns({f"col{k}": [k, k] for k in range(6)})
    page = res._repr_html_()
    assert headers(page)[-2:] == ["data", "completion"]
    assert all(f">col{k}</span>" in page for k in range(4)) and ">col4</span>" not in page
    assert "more columns in res.df: col4, col5" in page


def widths(page: str) -> dict[str, int]:
    cols = [int(w) for w in re.findall(r'<col style="width:(\d+)%">', page)]
    return dict(zip(headers(page), cols))


def with_data(n_data: int = 4) -> Rollouts:
    """Rows as a reward tutorial makes them: a question equal to the prompt, a long JSON metadata."""
    res = grouped()
    data = {"question": [f"Question {p}?" for p in res.df["prompt_index"]],
            "metadata": [{"source": "gsm8k", "steps": list(range(40)), "notes": "x" * 300}] * len(res),
            "answer_key": ["42"] * len(res), "difficulty": [0.5] * len(res), "topic": ["arithmetic"] * len(res)}
    return res.with_columns(dict(list(data.items())[: n_data + 1]))


def test_the_completion_gets_at_least_half_the_width_at_any_number_of_data_columns():
    for n_data in range(5):
        page = with_data(n_data)._repr_html_()
        assert "table-layout:fixed;width:100%" in page  # the <col> widths hold whatever the content
        w = widths(page)
        assert sum(w.values()) == 100 and w["completion"] >= 50, (n_data, w)


def test_long_or_nested_data_values_are_shortened_with_the_full_value_on_hover():
    page = with_data()._repr_html_()
    body = page.split("<tbody>")[1]
    shown = re.search(r'<div title="metadata: ([^"]*)"><span style="color:#888">metadata</span> ([^<]*)</div>', body)
    assert shown, body[:2000]
    assert "x" * 300 in shown.group(1) and len(html.unescape(shown.group(2))) <= 50 and shown.group(2).endswith("…")
    assert "&quot;steps&quot;: [0, 1, 2" in shown.group(1)  # nested values as JSON


def test_a_data_column_that_repeats_the_prompt_is_left_out_and_said_so():
    page = with_data()._repr_html_()
    assert ">question</span>" not in page and "not shown: question (the same text as the prompt)" in page
    res = grouped().with_columns({"question": ["Question 0?"] * len(grouped())})  # differs for prompt 1
    assert ">question</span>" in res._repr_html_()


# What JupyterLab's sanitizer (packages/apputils/src/sanitizer.ts) keeps of the inline styles the
# view uses in an untrusted notebook: values outside these are dropped, one declaration at a time.
SANITIZER_VALUES = {
    "overflow-wrap": r"normal|break-word", "word-break": r"normal|keep-all|break-all",
    "white-space": r"normal|pre|nowrap|pre-wrap|pre-line", "table-layout": r"auto|fixed",
    "text-align": r"left|right|center|justify", "width": r"[\d.]+(px|em|%)|auto", "max-width": r"[\d.]+(px|em|%)|none|auto",
    "display": r"inline|block|inline-block", "border-collapse": r"collapse|separate",
}


def test_every_inline_layout_rule_is_one_that_an_untrusted_notebook_keeps():
    res = with_data()
    res.decode = lambda ids: [f"t{i}" for i in ids]
    page = res._repr_html_()
    without_style = re.sub(r"<style>.*?</style>", "", page, flags=re.S)
    for style in re.findall(r'style="([^"]*)"', without_style):
        for decl in filter(None, style.split(";")):
            prop, value = (x.strip() for x in decl.split(":", 1))
            if prop in SANITIZER_VALUES:
                assert re.fullmatch(SANITIZER_VALUES[prop], value), decl
    assert '<table style="table-layout:fixed;width:100%' in without_style
    assert re.search(r'<td style="text-align:left;vertical-align:top', without_style)


def test_the_view_opens_with_one_header_line_and_folds_the_notes():
    page = grouped()._repr_html_()
    before_table = page.split("<table")[0].split("</style>")[1]
    assert before_table.startswith("<details") and before_table.endswith("</details>")  # one line, notes under it
    line = re.search(r"<summary[^>]*>(.*?)</summary>", before_table, re.S).group(1)
    assert "<div" not in line and "Rollouts 6 rows" in line and "⚠ pad id 0 = EOS: mask with response_mask" in line
    assert "Coloured tokens are" not in line and "Coloured tokens are" in before_table  # folded, shown once


def test_the_prompts_last_tokens_show_once_per_group():
    res = grouped(2, 3)
    res.decode = lambda ids: [{1: "<|im_start|>", 2: "assistant", 3: "\n", 4: "\n", 5: "Hi", 6: "!", 0: "<eos>"}[i] for i in ids]
    page = res._repr_html_()
    assert page.count('title="prompt token') == 2 * 3  # 2 groups x 3 tail tokens, not once per row
    assert page.count('title="prompt | response"') == 2 + 6  # after each tail, and where each response starts


def test_the_record_line_reads_utc_not_u_c():
    res = make()
    res.run_records[next(iter(res.run_records))] = {"backend": "cpu", "server_version": "1", "started_utc": "2026-12-01T21:05:26+00:00"}
    page = res._repr_html_()
    assert "2026-12-01 21:05:26 UTC" in page and "U C" not in page


def test_a_stop_token_in_the_finish_column_says_what_it_means_on_hover():
    e = entry([5, 2])
    e["meta_info"]["finish_reason"]["matched"] = 2
    page = rollouts_from_responses([e], prompt_ids=[[1]], pad_token_id=2)._repr_html_()
    assert 'title="stop: stopped at token id 2 (a stop token, e.g. the EOS)">stop ⟨2⟩</span>' in page
    e = entry([5])
    e["meta_info"]["finish_reason"]["matched"] = "END"
    page = rollouts_from_responses([e], prompt_ids=[[1]], pad_token_id=2)._repr_html_()
    assert "stopped at the stop string &#x27;END&#x27;" in page


def test_the_response_starts_after_the_prompts_last_tokens_and_a_boundary_mark():
    res = grouped(1, 1)
    res.decode = lambda ids: [{1: "<|im_start|>", 2: "assistant", 3: "\n", 4: "\n", 5: "Hi", 6: "!", 0: "<eos>"}[i] for i in ids]
    cell = res._repr_html_().split("<tbody>")[1]
    tail, _, response = cell.split('title="prompt | response"')  # the tail once (prompt cell), then the response
    assert tail.count('title="prompt token') == 3 and "assistant" in tail and "<|im_start|>" not in tail
    assert re.search(r"response token 0: id 5 &#x27;Hi&#x27;", response)


def test_the_view_warns_that_the_pad_id_is_the_eos_that_ends_the_responses():
    page = grouped()._repr_html_()
    assert "response_mask is 1 (the EOS included)" in page
    assert "The pad id 0 is also the last token of 6 shown responses" in page
    assert "not response_ids != 0" in page
    assert "(= pad id 0: response_mask keeps it" in page  # on the EOS token's tooltip
    assert "The pad id" not in make()._repr_html_()  # responses that do not end with it: no warning


def test_html_summary_starts_with_the_one_line_repr():
    res = make()
    summary = r"<summary[^>]*>Rollouts 2 rows \(2 prompts x 1\) \| 4 tokens \| finish: stop 2 \| model=tiny"
    assert re.search(summary, res._repr_html_())


def test_the_html_repr_does_not_build_tensors():
    res = make(30)
    res._repr_html_()
    repr(res)
    assert res._cache is None


# -- token texts from a real tokenizer --------------------------------------------------------------


COMPLETION = "The capital of France\n\nis Paris. Le café 日本 🙂!"


def test_a_completion_with_spaces_newlines_and_accents_renders_as_readable_text(tok):
    ids = tok(COMPLETION, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    res = rollouts_from_responses([entry(ids)], prompt_ids=[[1]], pad_token_id=tok.eos_token_id)
    res.decode = TokenText(tok)
    cell = res._repr_html_().split("<tbody>")[1]
    tokens = "".join(re.findall(r"<span style=\"background[^>]*>(.*?)</span>", cell))
    assert not any(ch in tokens for ch in "ĠĊÃ")
    assert ">The</span>" in cell and "> capital</span>" in cell and "> café</span>" in cell and ">↵\n</span>" in cell
    assert "&lt;|im_end|&gt;</span>" in cell


def test_engine_card_shows_cheap_attributes_escaped_and_skips_failing_ones():
    class FakeEngine:
        model = "tiny<1>"
        url = "http://127.0.0.1:1"

        @property
        def log_path(self):
            raise RuntimeError("not started")

        def __repr__(self):
            return "<rlgen.Engine 'tiny<1>'>"

    page = engine_html(FakeEngine())
    assert "&lt;rlgen.Engine &#x27;tiny&lt;1&gt;&#x27;&gt;" in page
    assert "<th>model</th><td>tiny&lt;1&gt;</td>" in page and "<th>url</th>" in page
    assert "log_path" not in page


def test_a_long_reward_name_is_shortened_so_its_value_stays_in_view():
    # In JupyterLab the reward column is ~85 px: "answer_last_number 1" showed as "answer_last".
    res = make().with_columns({"reward_answer_last_number": [1.0, 0.0],
                               "reward_answer_last_number_status": ["ok", "ok"]})
    cell = res._repr_html_().split("<tbody>")[1].split("</tr>")[0]
    assert 'title="reward_answer_last_number"' in cell and ">answer_…</span> 1<" in cell


def test_a_verl_reward_model_data_column_shows_as_data_not_as_a_reward():
    # The view took every reward_* column for a reward; only columns scoring wrote are rewards.
    res = make().with_columns({"reward_model": [{"ground_truth": "4"}, {"ground_truth": "5"}]})
    page = res._repr_html_()
    assert headers(page) == ["prompt", "sample", "data", "completion"]  # no reward column: nothing was scored
    data_cell = page.split("<tbody>")[1].split("</tr>")[0].split("<td")[3]
    assert ">reward_model</span>" in data_cell and "ground_truth" in data_cell


def test_the_record_line_says_where_the_weights_came_from():
    # The record's weights_path is None only for weights pushed from the notebook's tensors
    # (Engine.update_weights): the view says so, not that they are on another machine.
    res = make()
    run = next(iter(res.run_records))
    base = {"backend": "cpu", "server_version": "1", "started_utc": "2026-12-02T05:00:00+00:00"}
    res.run_records[run] = {**base, "weights_path": None, "weights_sha256": None, "weight_versions": ["tensors@1"]}
    line = html.unescape(res._repr_html_()).split("record: ", 1)[1].split("</div>", 1)[0]
    assert "weights pushed from the notebook's tensors (update_weights; on no disk, not hashed)" in line
    assert "not on this machine" not in line and "weight version tensors@1" in line
    # A checkout this machine cannot read (a remote server's path) is still "not on this machine",
    # and a hashed checkout shows its digest.
    res.run_records[run] = {**base, "weights_path": "/remote/ckpt", "weights_sha256": None}
    assert "weights not hashed (not on this machine)" in html.unescape(res._repr_html_())
    res.run_records[run] = {**base, "weights_path": "/ckpt", "weights_sha256": "ab" * 32}
    assert f"weights sha256 {'ab' * 6}" in res._repr_html_()


def with_adapters() -> Rollouts:
    """A mixed batch as generate(..., adapter=[None, "policy"]) makes it: the base row's adapter is None."""
    return rollouts_from_responses([entry([5, 6]), entry([5, 6])], prompt_ids=[[1, 2]] * 2, prompt_texts=["hi"] * 2,
                                   pad_token_id=0, extra={"adapter": [None, "grpo-step-0040-lr5e-5"]})


def test_each_row_names_its_adapter_in_its_sample_cell_and_a_base_row_says_base_model_not_nan():
    res = with_adapters()
    assert math.isnan(res.df["adapter"].iloc[0])  # what pandas makes of the base row's None
    rows = res._repr_html_().split("<tbody>")[1].split("</tr>")
    base, policy = (next(c for c in row.split("<td") if "; row_id " in c) for row in rows[:2])  # the sample cells
    assert ">base model</span>" in base and "NaN" not in rows[0] and "nan" not in rows[0]
    assert ">LoRA</span> grpo-step-0040-lr5e-5</span>" in policy and "base model" not in policy


def test_the_adapter_is_not_a_data_column_and_takes_no_data_columns_place():
    res = with_adapters().with_columns({f"col{k}": [k, k] for k in range(4)})
    page = res._repr_html_()
    assert all(f">col{k}</span>" in page for k in range(4)) and "more columns in res.df" not in page
    data_cells = [r.split("<td")[-2] for r in page.split("<tbody>")[1].split("</tr>")[:2]]
    assert all("adapter" not in cell and "base model" not in cell for cell in data_cells)
    assert headers(with_adapters()._repr_html_()) == ["prompt", "sample", "completion"]  # no data column for it


def test_the_record_line_names_the_adapters_the_rows_used():
    res = with_adapters()
    run = next(iter(res.run_records))
    res.run_records[run] = {"backend": "cpu", "server_version": "1", "weights_sha256": "cd" * 32,
                            "adapters": {"grpo-step-0040-lr5e-5": {"source": "tensors", "rank": 8, "sha256": "ab" * 32, "load": 2},
                                         "sft": {"source": "/ckpt/sft-adapter", "rank": None, "sha256": None, "load": 0}}}
    line = html.unescape(res._repr_html_()).split("record: ", 1)[1].split("</div>", 1)[0]
    assert (f"weights sha256 {'cd' * 6} · adapters grpo-step-0040-lr5e-5 (rank 8, from tensors, sha256 {'ab' * 6}, load 2), "
            "sft (loaded by the server at start, from /ckpt/sft-adapter, not hashed) · ") in line


def test_the_header_line_counts_the_rows_of_each_adapter_and_the_base_model():
    res = rollouts_from_responses([entry([5, 6]) for _ in range(3)], prompt_ids=[[1, 2]] * 3, pad_token_id=0,
                                  model="tiny", extra={"adapter": ["policy", None, "policy"]})
    assert repr(res).endswith("| model=tiny | adapters: policy 2, base model 1>")
    line = re.search(r"<summary[^>]*>(.*?)</summary>", res._repr_html_(), re.S).group(1)
    assert "adapters: policy 2, base model 1" in line
    only_base = rollouts_from_responses([entry([5])], prompt_ids=[[1]], pad_token_id=0, model="tiny", extra={"adapter": [None]})
    assert repr(only_base).endswith("| model=tiny>")  # a LoRA server's base rows: nothing to tell apart
