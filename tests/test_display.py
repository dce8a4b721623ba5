"""Display: the Rollouts HTML table and text repr, progress selection, and the startup PhaseLine."""

from __future__ import annotations

import io
import math
import re

import pytest

from rlgen._display import (
    PhaseLine,
    engine_html,
    in_notebook,
    logprob_color,
    progress_bar,
    progress_enabled,
    rollouts_html,
)
from rlgen._response_arrays import failed_entry
from rlgen._results import Rollouts, rollouts_from_responses


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
    assert "+40 tokens" in page and page.count("title=") == 10
    assert "THE END" in page and "x" * 60 not in page


def test_each_token_is_coloured_by_its_logprob_with_id_and_logprob_on_hover():
    page = make(lp=-1.0)._repr_html_()
    assert f'style="background:{logprob_color(-1.0)}" title="id 5 | logprob -1.0000 (p=0.368)"' in page
    assert f'style="background:{logprob_color(-2.0)}" title="id 6 | logprob -2.0000 (p=0.135)"' in page


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
    assert ">▯</span>" in page and "title=\"id 6 &#x27;&#x27;" in page
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
    tag = re.search(r'<span style="background:(#\w+)" title="id 2[^"]*"><span style="color:#555[^"]*">&lt;\|im_end\|&gt;</span>', page)
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
    assert "<th>reward</th>" in page and "<td>0.25</td>" in page


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


@pytest.fixture(scope="module")
def tok(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def decode_tokens(tok, ids: list[int]) -> list[str]:
    """`Engine._decode_tokens` on an object that has only the tokenizer (no server)."""
    from types import SimpleNamespace

    from rlgen._engine import Engine

    return Engine._decode_tokens(SimpleNamespace(tokenizer=tok), ids)  # type: ignore[arg-type]


COMPLETION = "The capital of France\n\nis Paris. Le café 日本 🙂!"


def test_engine_token_texts_are_real_text_that_concatenates_to_the_completion(tok):
    ids = tok(COMPLETION, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    pieces = decode_tokens(tok, ids)
    assert len(pieces) == len(ids) and "".join(pieces) == COMPLETION + "<|im_end|>"
    assert " capital" in pieces and "\n" in pieces and " café" in pieces and pieces[-1] == "<|im_end|>"
    assert not any(ch in "".join(pieces) for ch in "ĠĊÃ\ufffd")


def test_a_completion_with_spaces_newlines_and_accents_renders_as_readable_text(tok):
    ids = tok(COMPLETION, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    res = rollouts_from_responses([entry(ids)], prompt_ids=[[1]], pad_token_id=tok.eos_token_id)
    res.decode = lambda ids: decode_tokens(tok, ids)
    cell = res._repr_html_().split("<tbody>")[1]
    tokens = "".join(re.findall(r"<span style=\"background[^>]*>(.*?)</span>", cell))
    assert not any(ch in tokens for ch in "ĠĊÃ")
    assert ">The</span>" in cell and "> capital</span>" in cell and "> café</span>" in cell and ">↵\n</span>" in cell
    assert "&lt;|im_end|&gt;</span>" in cell


def test_a_character_split_over_tokens_belongs_to_the_token_that_completes_it(tok):
    ids = tok(" 日本", add_special_tokens=False)["input_ids"]
    assert len(ids) > 2  # byte-level BPE splits these characters into several tokens
    pieces = decode_tokens(tok, ids)
    assert "".join(pieces) == " 日本" and all(p in ("", " 日", "本") for p in pieces)
    assert decode_tokens(tok, ids[:1]) == [""]  # an unfinished character shows as nothing, not mojibake


# -- progress --------------------------------------------------------------------------------------


def test_progress_false_gives_a_silent_bar():
    out = io.StringIO()
    bar = progress_bar(total=3, progress=False, file=out)
    bar.update(3)
    bar.close()
    assert out.getvalue() == "" and bar.disable


def test_progress_true_writes_a_text_bar_to_the_given_file():
    out = io.StringIO()
    with progress_bar(total=3, progress=True, desc="generate", file=out) as bar:
        bar.update(3)
    assert "generate" in out.getvalue() and "3/3" in out.getvalue()


def test_auto_progress_honours_tqdm_disable_but_an_explicit_true_wins(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert progress_enabled(None) is False
    assert progress_enabled(True) is True
    monkeypatch.setenv("TQDM_DISABLE", "0")
    assert progress_enabled(None) is True
    assert progress_enabled(None, environ={}) is True


def test_progress_rejects_values_other_than_bool_or_none():
    with pytest.raises(TypeError, match="progress"):
        progress_enabled("yes")  # type: ignore[arg-type]


def test_pytest_is_not_a_notebook():
    assert in_notebook() is False


# -- PhaseLine ---------------------------------------------------------------------------------------


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_phase_line_in_a_log_file_writes_one_plain_line_per_phase():
    out = io.StringIO()  # not a live terminal: a log file, a pipe, CI output
    line = PhaseLine("sglang", mode="terminal", file=out, show=True)
    for second in range(2000):
        line.update("loading weights" if second < 1000 else "capturing cuda graphs", second / 10)
    line.update("ready", 200)
    line.close(ok=True)  # the same text as the last update: not written twice
    assert out.getvalue().splitlines() == [
        "sglang: loading weights (0s)", "sglang: capturing cuda graphs (100s)", "sglang: ready (200s)"]
    assert "\r" not in out.getvalue()


def test_phase_line_rewrites_a_live_terminal_in_place_and_erases_longer_text():
    out = FakeTTY()
    line = PhaseLine("srv", mode="terminal", file=out, show=True, min_interval_s=0.0)
    line.update("a much longer phase name", 1)
    line.update("short", 2)
    line.update("short", 3)  # elapsed changes are shown on a live terminal
    segments = out.getvalue().split("\r")[1:]
    expected = ["srv: a much longer phase name (1s)", "srv: short (2s)", "srv: short (3s)"]
    assert [s.rstrip() for s in segments] == expected
    assert len(segments[1]) == len(segments[0])  # padded with spaces over the old text
    assert "\n" not in out.getvalue()


def test_phase_line_failure_names_the_phase_it_failed_in():
    out = io.StringIO()
    with pytest.raises(RuntimeError), PhaseLine("srv", mode="terminal", file=out, show=True) as line:  # noqa: PT012 - the failure happens inside the block under test
        line.update("loading weights", 7)
        raise RuntimeError("boom")
    assert out.getvalue().splitlines()[-1] == "srv: failed during 'loading weights' (7s)"
    assert line.closed


def test_phase_line_shows_nothing_when_disabled(monkeypatch):
    out = io.StringIO()
    line = PhaseLine("srv", mode="terminal", file=out, show=False)
    line.update("x", 1)
    line.close(ok=True)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    auto = PhaseLine("srv", mode="terminal", file=out)
    auto.update("x", 1)
    auto.close(ok=False)
    assert out.getvalue() == ""


def test_phase_line_in_a_notebook_updates_one_display_in_place(monkeypatch):
    import IPython.display

    shown: list = []

    class Handle:
        def update(self, obj):
            shown.append(("update", obj.data))

    def fake_display(obj, display_id=False):
        shown.append(("display", obj.data))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    line = PhaseLine("srv", mode="notebook", show=True, min_interval_s=0.0)
    line.update("loading <weights>", 1)
    line.update("capturing graphs", 2)
    line.close(ok=False, message="out of memory")
    assert [kind for kind, _ in shown] == ["display", "update", "update"]
    assert "loading &lt;weights&gt;" in shown[0][1]
    assert "srv: out of memory during &#x27;capturing graphs&#x27; (2s)" in shown[-1][1]


def test_phase_line_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        PhaseLine("srv", mode="html")



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
