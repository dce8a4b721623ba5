"""The rollout browser: filters, group stepping, the selected sample, its widgets and static HTML."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from rlgen.rollouts import Rollouts, rollouts_from_responses
from rlgen.rollouts._browser import interactive_frontend


def entry(ids: list[int], *, finish: str = "stop", lps: list[float] | None = None, top: bool = True) -> dict:
    lps = lps if lps is not None else [-0.1] * len(ids)
    meta = {
        "id": "r",
        "finish_reason": {"type": finish, "matched": None},
        "completion_tokens": len(ids),
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)],
    }
    if top:
        meta["output_top_logprobs"] = [[[-0.05, 9, None], [-3.0, 8, None]] for _ in ids]
    return {"text": "", "output_ids": ids, "meta_info": meta}


TEXT = {5: " Paris", 6: " Lyon", 7: "!", 8: " Nice", 9: " Rome", 0: "<eos>"}


def browsable() -> Rollouts:
    """3 prompts x 2 samples: rewards 1/0 per group, one 'length' row, completions with words."""
    entries = [
        entry([5, 7, 0]), entry([6, 7], finish="length", lps=[-0.1, -9.0]),
        entry([5, 0]), entry([6, 0]),
        entry([5, 5, 0], lps=[-0.2, -6.0, -0.1]), entry([6, 0]),
    ]
    res = rollouts_from_responses(entries, prompt_ids=[[1], [2], [3]], prompt_texts=["France?", "Italy?", "Spain?"],
                                  n=2, pad_token_id=0, decode=lambda ids: [TEXT.get(i, "?") for i in ids])
    df = res.df
    df["completion"] = ["Paris!", "Lyon!", "Paris", "Lyon", "Paris Paris", "Lyon"]
    res.df = df
    return res.with_columns({"reward": [1.0, 0.0, 1.0, np.nan, 0.5, 0.0]})


def test_without_filters_every_row_matches_and_groups_are_prompts_in_order():
    b = browsable().browse()
    assert b.matching().tolist() == [0, 1, 2, 3, 4, 5]
    assert [g.tolist() for g in b.groups()] == [[0, 1], [2, 3], [4, 5]]
    rows, row = b.selected()
    assert rows.tolist() == [0, 1] and row == 0


def test_filters_by_finish_reason_reward_range_and_text_combine():
    b = browsable().browse()
    b.finish = "length"
    assert b.matching().tolist() == [1]
    b.finish = None
    b.reward_range = (0.5, 1.0)
    assert b.matching().tolist() == [0, 2, 4]  # the NaN reward is outside any range
    b.search = "PARIS PARIS"
    assert b.matching().tolist() == [4]
    b.reward_range = None
    b.search = "spain"  # prompts are searched too
    assert b.matching().tolist() == [4, 5]


def test_stepping_past_either_end_clamps_and_an_empty_selection_says_so():
    b = browsable().browse()
    b.group, b.sample = 99, 99
    rows, row = b.selected()
    assert (b.group, b.sample, rows.tolist(), row) == (2, 1, [4, 5], 5)
    b.search = "no such text"
    assert b.selected()[1] is None and "no rows match these filters" in b.html()


def test_the_html_shows_the_group_then_the_selected_sample_and_its_least_likely_tokens():
    b = browsable().browse()
    b.group, b.sample = 2, 0
    page = b.html()
    assert "group 3 of 3 matching (6 of 6 rows)" in page
    assert page.count("Spain?") >= 1 and "France?" not in page
    surprises = page.split("unlikely tokens (p &lt; 0.5), least likely first")[1]
    found = re.findall(r"<tr><td[^>]*>(\d+)</td><td[^>]*>(.*?)</td><td[^>]*>(.*?)</td>", surprises)
    assert found == [("1", "&#x27; Paris&#x27;", "0.00248")]  # exp(-6); the p = 0.82 and 0.9 tokens are not "unlikely"
    assert "&#x27; Rome&#x27; 0.951, &#x27; Nice&#x27; 0.0498" in surprises  # its alternatives, as text
    assert "top_logprobs=k" not in page  # it was given


def test_the_top_logprobs_hint_shows_only_without_top_logprobs_and_likely_samples_say_so():
    res = rollouts_from_responses([entry([5, 6], lps=[-0.1, -2.0], top=False), entry([5], lps=[-0.01], top=False)],
                                  prompt_ids=[[1], [2]], pad_token_id=0, decode=lambda ids: [TEXT.get(i, "?") for i in ids])
    b = res.browse()
    assert "generate with top_logprobs=k" in b.html() and "&#x27; Lyon&#x27;" in b.html().split("unlikely tokens")[1]
    b.group = 1
    assert "no unlikely tokens: every token of this sample had p ≥ 0.5" in b.html()


def test_each_browser_step_opens_with_one_header_line():
    b = browsable().browse()
    page = b.html()
    before_table = re.sub(r"<style>.*?</style>", "", page.split("<table")[0], flags=re.S)
    line = re.search(r"<summary[^>]*>(.*?)</summary>", before_table, re.S).group(1)
    assert before_table.count("<summary") == 1 and "<div" not in line
    assert "group 1 of 3 matching" in line and "Rollouts 2 rows" in line


def test_a_result_without_a_reward_column_browses_without_a_reward_filter():
    res = browsable()
    res.df = res.df.drop(columns=["reward"])
    b = res.browse()
    b.reward_range = (0.0, 1.0)
    assert b.reward is None and len(b.matching()) == 6


def test_the_widgets_drive_the_same_selection_and_redraw_the_view():
    pytest.importorskip("ipywidgets")
    b = browsable().browse()
    box = b.widget()
    assert b.widget() is box  # built once
    (finish, reward, search), (previous, following, sample), view = (c.children if hasattr(c, "children") else c
                                                                     for c in box.children)
    assert finish.options == ("all", "length", "stop") and reward.description == "reward"
    following.click()
    assert b.group == 1 and "Italy?" in view.value
    finish.value = "length"
    assert b.finish == "length" and b.group == 0 and "1 of 6 rows" in view.value
    finish.value = "all"
    reward.value = (0.5, 1.0)
    assert b.reward_range == (0.5, 1.0) and "3 of 6 rows" in view.value
    reward.value = (reward.min, reward.max)
    assert b.reward_range is None
    search.value = "lyon"
    assert b.search == "lyon" and [label for label, _ in sample.options] == ["1 (row 1)"]
    search.value = ""
    sample.value = 1
    assert b.sample == 1 and "sample 1 (row 1)" in view.value
    previous.click()
    assert b.group == 0


def test_without_a_widget_manager_the_output_is_the_static_html_of_the_selection():
    b = browsable().browse()
    assert b.use_widgets() is False  # pytest is no kernel: nothing could render a widget
    bundle = b._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert bundle["text/html"] == b.html() and bundle["text/plain"].startswith("<RolloutBrowser 3 groups")


def test_auto_mode_sends_the_widget_to_interactive_frontends_only(monkeypatch):
    ipywidgets = pytest.importorskip("ipywidgets")
    monkeypatch.setattr("rlgen.core._progress.in_notebook", lambda: True)
    monkeypatch.setattr(ipywidgets.Widget, "_control_comm", None)
    for name in [k for k in os.environ if k == "JPY_SESSION_NAME" or k.startswith("VSCODE_")]:
        monkeypatch.delenv(name)
    b = browsable().browse()
    assert b.use_widgets() is False  # a kernel nbclient started: static HTML
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/analysis.ipynb")  # jupyter_server started it
    assert b.use_widgets() is True
    monkeypatch.delenv("JPY_SESSION_NAME")
    monkeypatch.setattr(ipywidgets.Widget, "_control_comm", object())  # a widget manager attached
    assert b.use_widgets() is True
    assert browsable().browse(widgets=False).use_widgets() is False
    with pytest.raises(TypeError, match="widgets must be"):
        browsable().browse(widgets="yes")  # type: ignore[arg-type]


def test_interactive_frontends_are_jupyter_server_kernels_and_vs_code_kernels():
    assert interactive_frontend({"JPY_SESSION_NAME": "a.ipynb"}, {}) is True
    assert interactive_frontend({"VSCODE_PID": "12"}, {}) is True
    assert interactive_frontend({}, {"__vsc_ipynb_file__": "/x.ipynb"}) is True
    assert interactive_frontend({"JPY_PARENT_PID": "1"}, {}) is False  # any jupyter_client kernel has this


def test_the_selected_sample_and_the_sample_choices_name_its_adapter_or_the_base_model():
    pytest.importorskip("ipywidgets")
    res = browsable().with_columns({"adapter": [None, "policy"] * 3})  # base rows: NaN in the df
    b = res.browse()
    title = re.search(r'<div style="margin-top:8px;font-family:monospace;color:#333">(.*?)</div>', b.html()).group(1)
    assert title.endswith("mean logprob -0.100 · base model")
    b.sample = 1
    assert "mean logprob -4.550 · LoRA policy</div>" in b.html()
    sample = b.widget().children[1].children[2]
    assert [label for label, _ in sample.options] == ["0 (row 0) base model", "1 (row 1) LoRA policy"]
    plain = browsable().browse()  # no adapter column: nothing said
    assert plain.html().count("base model") == 0 and [label for label, _ in plain.widget().children[1].children[2].options] == [
        "0 (row 0)", "1 (row 1)"]


def test_the_sample_dropdown_is_wide_enough_for_its_adapter_labels():
    pytest.importorskip("ipywidgets")

    def width(res: Rollouts) -> float:
        return float(res.browse().widget().children[1].children[2].layout.width.removesuffix("em"))

    assert width(browsable()) == 16  # "12 (row 345)": no adapter column
    # 16em showed "0 (row 0) base" of "0 (row 0) base model" (JupyterLab, 2026-12-02): ~0.65em a character more
    assert width(browsable().with_columns({"adapter": [None, "policy"] * 3})) >= 16 + 0.65 * len(" base model")
    long_name = "grpo-step-0040-lr5e-5"
    assert width(browsable().with_columns({"adapter": [None, long_name] * 3})) >= 16 + 0.65 * len(" LoRA " + long_name)
    assert width(browsable().with_columns({"adapter": ["x" * 200] * 6})) == 40  # the title line names it whole
