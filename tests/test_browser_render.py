"""The view in a real browser: a notebook is executed, exported with JupyterLab's stylesheet
(nbconvert's lab template) and rendered by headless Chromium; a script in the page measures what a
reader sees.

Chromium comes from Debian's package (`scripts/browser.sh` installs it; CI runs that). Without it
this test skips, unless RLGEN_REQUIRE_BROWSER is set (CI sets it), then it fails.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import render_notebook

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
WIDTH = render_notebook.WIDTH

CELLS = [
    "import rlgen\neng = rlgen.Engine(progress=True)",
    # Accents, newlines and a system prompt: what byte-level BPE symbols and wide rows came from.
    '''chats = [[{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
          {"role": "user", "content": q}]
         for q in ["Écris une phrase en français sur le café.", "List three colours, one per line.", "What is 2+2?"]]
res = eng.generate(chats, n=3, max_new_tokens=48, temperature=0.8, top_logprobs=3, seed=1)
res = res.add_rewards({"short": lambda completion: float(len(completion) < 80)})
res''',
    "res.browse()",
    # As a reward tutorial makes them: rows with data, one column a long JSON `metadata`, one a
    # `question` equal to the prompt; long prompts.
    '''import json
system = "You are a careful tutor. Think step by step, show your working, and give the final answer on its own line. " * 3
questions = [f"A train leaves at {h} pm and travels {d} km at 60 km/h along the coast. At what time does it arrive? "
             "Explain your reasoning in full sentences." for h, d in [(1, 120), (3, 90), (5, 240)]]
data = {"question": questions,
        "metadata": [json.dumps({"source": "gsm8k-style", "split": "train", "id": k, "steps": list(range(30)),
                                 "notes": "generated for the rlgen tutorial " * 6}) for k in range(3)],
        "answer": ["3 pm", "4:30 pm", "9 pm"], "difficulty": ["easy", "medium", "hard"], "topic": ["rates"] * 3}
chats_d = [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in questions]
res_d = eng.generate(chats_d, n=2, max_new_tokens=48, temperature=0.8, top_logprobs=3, seed=2, data=data)
res_d = res_d.add_rewards({"has_pm": lambda completion: float("pm" in completion)})
res_d''',
    "res_d.browse()",
    "res_d.reward_summary()",
    "eng.close()",
]
VIEW_CELLS = [0, 1, 2, 6]  # the first notebook: chats, its view and browser
DATA_VIEW, DATA_BROWSE, SUMMARY = 3, 4, 5



def chromium() -> str:
    path = render_notebook.find_chromium()
    if path is None:
        if os.environ.get("RLGEN_REQUIRE_BROWSER"):
            pytest.fail("RLGEN_REQUIRE_BROWSER is set but chromium is missing: run `bash scripts/browser.sh`")
        pytest.skip("needs Chromium (`bash scripts/browser.sh` installs Debian's package)")
    return path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, model_path: str) -> tuple[dict, Path, Any, str]:
    browser = chromium()
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("nbconvert")
    out = tmp_path_factory.mktemp("render")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.replace("rlgen.Engine(", f"rlgen.Engine({model_path!r}, ")) for c in CELLS]
    env_before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env_before]))
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(out)}}).execute()
    finally:
        if env_before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = env_before
    nbformat.write(nb, out / "executed.ipynb")
    full = nb
    nb = nbformat.from_dict({**full, "cells": [full.cells[i] for i in VIEW_CELLS]})
    nbformat.write(nb, out / "view.ipynb")
    shots = os.environ.get("RLGEN_SCREENSHOT_DIR")  # for a person to look at: the same page as a picture
    measure = render_notebook.render(nb, out, "view", browser=browser, screenshot_height=3000 if shots else None)
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        shutil.copy(out / "view.png", Path(shots) / "view.png")
    return measure, out, full, browser


# -- a view with data at JupyterLab's output width, trusted and untrusted -----------------------------

# JupyterLab 4.6 at a 1400 x 900 window gives a cell's output area 968 px.
OUTPUT_WIDTH = 968
# Pins every output area to that width, as a block the way JupyterLab lays it out (the export makes
# it a table cell, whose width follows its content and the window).
PIN = (f"<style>.jp-OutputArea-output {{display:block !important; box-sizing:border-box !important; "
       f"width:{OUTPUT_WIDTH}px !important; max-width:{OUTPUT_WIDTH}px !important; min-width:0 !important; "
       "flex:none !important}</style>")
MEASURE_DATA = """
<script>
window.addEventListener('load', () => {
  const out = [];
  for (const area of document.querySelectorAll('.jp-OutputArea-output')) {
    const a = area.getBoundingClientRect();
    const item = {area_width: Math.round(a.width), area_scroll: area.scrollWidth, tables: [], clipped: []};
    for (const t of area.querySelectorAll('.rlgen-rollouts table')) {
      const r = t.getBoundingClientRect();
      const th = [...t.querySelectorAll('th')].find(h => h.innerText.trim() === 'completion');
      item.tables.push({left: Math.round(r.left - a.left), right: Math.round(r.right - a.left), width: Math.round(r.width),
                        completion: th ? Math.round(th.getBoundingClientRect().width) : null,
                        text_align: getComputedStyle(t.querySelector('td')).textAlign});
    }
    // Text that must never be cut: the legend, the header line's notes, the browser's captions.
    for (const e of area.querySelectorAll('.rlgen-legend, summary, .rlgen-browser > div > div:first-of-type')) {
      const r = e.getBoundingClientRect();
      if (r.right - a.left > a.width + 1 || e.scrollWidth > e.clientWidth + 1) item.clipped.push(e.innerText.slice(0, 80));
    }
    item.text = area.innerText.slice(0, 4000);
    out.push(item);
  }
  const pre = document.createElement('pre');
  pre.id = 'rlgen-measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""

# What JupyterLab's sanitizer keeps of an untrusted output (packages/apputils/src/sanitizer.ts): no
# <style>; inline declarations only with the values it allows (those of the properties rlgen uses).
SANITIZER_VALUES = {
    "overflow-wrap": r"normal|break-word", "word-break": r"normal|keep-all|break-all",
    "white-space": r"normal|pre|nowrap|pre-wrap|pre-line", "table-layout": r"auto|fixed",
}


def untrusted(page: str) -> str:
    page = re.sub(r"<style>.*?</style>", "", page, flags=re.S)

    def keep(match: re.Match) -> str:
        decls = [d for d in match.group(1).split(";") if d.strip()]
        kept = [d for d in decls if (p := d.split(":", 1)[0].strip()) not in SANITIZER_VALUES
                or re.fullmatch(SANITIZER_VALUES[p], d.split(":", 1)[1].strip())]
        return f'style="{";".join(kept)}"'

    return re.sub(r'style="([^"]*)"', keep, page)


def render_cells(rendered, name: str, cells: list[int], *, trusted: bool, shot: str | None = None) -> list[dict]:
    """Export cells of the executed notebook (untrusted: outputs as JupyterLab's sanitizer leaves
    them), pin the output width to 968 px, and measure each output area in Chromium."""
    import json

    import nbformat
    from nbconvert import HTMLExporter

    _, out, full, browser = rendered
    nb = nbformat.from_dict({**full, "cells": [full.cells[i] for i in cells]})
    if not trusted:
        nb = nbformat.from_dict(json.loads(json.dumps(nb)))
        for cell in nb.cells:
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                if "text/html" in data:
                    text = data["text/html"]
                    data["text/html"] = untrusted(text if isinstance(text, str) else "".join(text))
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    body = body.replace("</head>", PIN + "</head>")
    page = out / f"{name}.html"
    page.write_text(body, encoding="utf-8")
    measured = out / f"{name}-measured.html"
    measured.write_text(body.replace("</body>", MEASURE_DATA + "</body>"), encoding="utf-8")
    dom = render_notebook.run_chromium(browser, measured, "--dump-dom")
    found = re.search(r'<pre id="rlgen-measure">(.*?)</pre>', dom, re.S)
    assert found, "the measuring script did not run"
    shots = os.environ.get("RLGEN_SCREENSHOT_DIR")
    if shots and shot:
        Path(shots).mkdir(parents=True, exist_ok=True)
        render_notebook.run_chromium(browser, page, f"--screenshot={Path(shots) / shot}", height=1100)
    return [m for m in json.loads(html.unescape(found.group(1))) if m["tables"] or "reward" in m["text"]]


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
def test_a_view_with_data_fits_968_px_and_the_completion_gets_half(rendered, trusted):
    measures = render_cells(rendered, f"data-{trusted}", [DATA_VIEW], trusted=trusted,
                            shot=f"view-with-data-{'trusted' if trusted else 'untrusted'}.png")
    tables = [t for m in measures for t in m["tables"]]
    assert len(tables) == 1, measures
    table = tables[0]
    assert table["left"] >= 0 and table["right"] <= OUTPUT_WIDTH, table
    assert table["completion"] >= table["width"] / 2, table
    assert table["text_align"] == "left"
    area = measures[0]
    assert area["area_scroll"] <= OUTPUT_WIDTH + 1 and not area["clipped"], area
    text = area["text"]
    assert "metadata" in text and "answer" in text and "question" not in text.split("not shown")[0]


def test_the_browser_with_data_fits_968_px_with_nothing_clipped(rendered):
    for trusted in (True, False):
        measures = render_cells(rendered, f"browse-{trusted}", [DATA_BROWSE], trusted=trusted,
                                shot="browse-with-data.png" if trusted else None)
        area = measures[0]
        assert all(t["right"] <= OUTPUT_WIDTH and (t["completion"] or t["width"]) >= t["width"] / 2 for t in area["tables"]), area
        assert area["area_scroll"] <= OUTPUT_WIDTH + 1 and not area["clipped"], area
        assert "≤1e-6" in area["text"]


def test_the_reward_summary_shows_its_flags_before_its_table(rendered):
    full = rendered[2]
    page = "".join(o.get("data", {}).get("text/html", "") for o in full.cells[SUMMARY].outputs)
    render_cells(rendered, "summary", [SUMMARY], trusted=True, shot="reward-summary.png")
    assert page.index("no flags" if "⚠" not in page else "⚠") < page.index("<table")


def test_the_page_is_styled_by_jupyterlab(rendered):
    measure = rendered[0]
    assert measure["lab_styles"] > 0  # otherwise the checks below would not test JupyterLab's rules


def test_tokens_read_as_text_not_byte_level_symbols(rendered):
    tokens = rendered[0]["tokens"]
    assert "café" in tokens or "é" in tokens or "\n" in tokens  # the completions have real text
    for symbol in ("Ġ", "Ċ", "Ã"):
        assert symbol not in tokens


def test_the_view_fits_a_1400_px_viewport(rendered):
    measure = rendered[0]
    assert measure["table_right"] and max(measure["table_right"]) <= WIDTH
    assert measure["doc_width"] <= WIDTH


def test_rlgen_alignment_wins_over_jupyterlabs(rendered):
    measure = rendered[0]
    assert (measure["text_align"], measure["vertical_align"]) == ("left", "top")


def test_a_finished_calls_progress_is_its_totals_not_a_stale_zero(rendered):
    progress = rendered[0]["progress"]
    assert any(re.search(r"✓ generate: 9 samples · [\d,]+ tokens · [\d,]+ tok/s · [\d.]+ s", p) for p in progress), progress
    assert not any("0%" in p or "0/9" in p for p in progress), progress


def test_the_browser_in_an_executed_notebook_is_its_static_html(rendered):
    measure = rendered[0]
    assert measure["browser"] == 1
    assert "group 1 of 3 matching" in measure["browser_text"] and "unlikely tokens" in measure["browser_text"]
