"""Display: the Rollouts HTML table and text repr, and the Engine card."""

from __future__ import annotations

import math
import re

from rlgen.rollouts import Rollouts, rollouts_from_responses
from rlgen.rollouts._display import engine_html, logprob_color, rollouts_html
from rlgen.rollouts._response_arrays import failed_entry
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
    assert "<th>reward</th>" in page and '<td class="rlgen-num">0.25</td>' in page


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


def test_finish_tokens_rewards_and_advantage_come_before_the_completion_and_details_stay_in_the_df():
    page = grouped()._repr_html_()
    header = [h.replace("<wbr>", "") for h in re.findall(r"<th>(.*?)</th>", page)]
    assert header == ["row", "prompt", "sample", "finish", "tokens", "mean lp", "reward_exact", "reward",
                      "advantage", "answer", "completion"]
    assert "reward_exact_status" not in header and "group_mean" not in header


def test_too_many_data_columns_are_left_in_the_df_and_named_below_the_table():
    res = make().with_columns({f"col{k}": [k, k] for k in range(6)})
    page = res._repr_html_()
    header = [h.replace("<wbr>", "") for h in re.findall(r"<th>(.*?)</th>", page)]
    assert header[-5:] == ["col0", "col1", "col2", "col3", "completion"]
    assert "more columns in res.df: col4, col5" in page


def test_the_response_starts_after_the_prompts_last_tokens_and_a_boundary_mark():
    res = grouped(1, 1)
    res.decode = lambda ids: [{1: "<|im_start|>", 2: "assistant", 3: "\n", 4: "\n", 5: "Hi", 6: "!", 0: "<eos>"}[i] for i in ids]
    cell = res._repr_html_().split("<tbody>")[1]
    tail, response = cell.split('title="prompt | response"')
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
    summary = r"<div[^>]*>Rollouts 2 rows \(2 prompts x 1\) \| 4 tokens \| finish: stop 2 \| model=tiny"
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
