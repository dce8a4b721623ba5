"""The view in a real browser: a notebook is executed, exported with JupyterLab's stylesheet
(nbconvert's lab template) and rendered by headless Chromium; a script in the page measures what a
reader sees.

Chromium comes from Debian's package (`scripts/browser.sh` installs it; CI runs that). Without it
this test skips, unless RLGEN_REQUIRE_BROWSER is set (CI sets it), then it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

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
    "eng.close()",
]



def chromium() -> str:
    path = render_notebook.find_chromium()
    if path is None:
        if os.environ.get("RLGEN_REQUIRE_BROWSER"):
            pytest.fail("RLGEN_REQUIRE_BROWSER is set but chromium is missing: run `bash scripts/browser.sh`")
        pytest.skip("needs Chromium (`bash scripts/browser.sh` installs Debian's package)")
    return path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, model_path: str) -> tuple[dict, Path]:
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
    nbformat.write(nb, out / "view.ipynb")
    shots = os.environ.get("RLGEN_SCREENSHOT_DIR")  # for a person to look at: the same page as a picture
    measure = render_notebook.render(nb, out, "view", browser=browser, screenshot_height=3000 if shots else None)
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        shutil.copy(out / "view.png", Path(shots) / "view.png")
    return measure, out


def test_the_page_is_styled_by_jupyterlab(rendered):
    measure, _ = rendered
    assert measure["lab_styles"] > 0  # otherwise the checks below would not test JupyterLab's rules


def test_tokens_read_as_text_not_byte_level_symbols(rendered):
    tokens = rendered[0]["tokens"]
    assert "café" in tokens or "é" in tokens or "\n" in tokens  # the completions have real text
    for symbol in ("Ġ", "Ċ", "Ã"):
        assert symbol not in tokens


def test_the_view_fits_a_1400_px_viewport(rendered):
    measure, _ = rendered
    assert measure["table_right"] and max(measure["table_right"]) <= WIDTH
    assert measure["doc_width"] <= WIDTH


def test_rlgen_alignment_wins_over_jupyterlabs(rendered):
    measure, _ = rendered
    assert (measure["text_align"], measure["vertical_align"]) == ("left", "top")


def test_a_finished_calls_progress_is_its_totals_not_a_stale_zero(rendered):
    progress = rendered[0]["progress"]
    assert any(re.search(r"✓ generate: 9 samples · [\d,]+ tokens · [\d,]+ tok/s · [\d.]+ s", p) for p in progress), progress
    assert not any("0%" in p or "0/9" in p for p in progress), progress


def test_the_browser_in_an_executed_notebook_is_its_static_html(rendered):
    measure, _ = rendered
    assert measure["browser"] == 1
    assert "group 1 of 3 matching" in measure["browser_text"] and "least likely tokens" in measure["browser_text"]
