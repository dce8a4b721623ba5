"""The view in a real browser: a notebook is executed, exported with JupyterLab's stylesheet
(nbconvert's lab template) and rendered by headless Chromium; a script in the page measures what a
reader sees.

Chromium comes from Debian's package (`scripts/browser.sh` installs it; CI runs that). Without it
this test skips, unless RLGEN_REQUIRE_BROWSER is set (CI sets it), then it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
WIDTH = 1400

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

# Runs in the rendered page; its result is read back from the DOM Chromium dumps.
MEASURE = """
<script>
window.addEventListener('load', () => {
  const cells = [...document.querySelectorAll('.rlgen-rollouts td')];
  const first = cells[0];
  const tokens = [...document.querySelectorAll('.rlgen-rollouts span[title^="response token"]')].map(s => s.innerText).join('');
  const outputs = [...document.querySelectorAll('.jp-OutputArea-output')].map(o => o.innerText);
  const tables = [...document.querySelectorAll('.rlgen-rollouts table')].map(t => Math.round(t.getBoundingClientRect().right));
  const result = {
    lab_styles: document.querySelectorAll('.jp-RenderedHTMLCommon').length,
    doc_width: document.documentElement.scrollWidth,
    table_right: tables,
    text_align: first ? getComputedStyle(first).textAlign : null,
    vertical_align: first ? getComputedStyle(first).verticalAlign : null,
    tokens: tokens,
    progress: outputs.filter(t => /generate/.test(t) && !/Rollouts/.test(t)),
    browser: document.querySelectorAll('.rlgen-browser').length,
    browser_text: [...document.querySelectorAll('.rlgen-browser')].map(b => b.innerText).join(''),
  };
  const pre = document.createElement('pre');
  pre.id = 'rlgen-measure';
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
});
</script>
"""


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("RLGEN_REQUIRE_BROWSER"):
            pytest.fail("RLGEN_REQUIRE_BROWSER is set but chromium is missing: run `bash scripts/browser.sh`")
        pytest.skip("needs Chromium (`bash scripts/browser.sh` installs Debian's package)")
    return path


def run_chromium(browser: str, page: Path, *args: str) -> str:
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={WIDTH},3000", "--virtual-time-budget=5000", *args, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, model_path: str) -> tuple[dict, Path]:
    browser = chromium()
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nbconvert = pytest.importorskip("nbconvert")
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
    body, _ = nbconvert.HTMLExporter(template_name="lab").from_notebook_node(nb)
    (out / "view.html").write_text(body, encoding="utf-8")
    page = out / "measured.html"
    page.write_text(body.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = run_chromium(browser, page, "--dump-dom")
    found = re.search(r'<pre id="rlgen-measure">(.*?)</pre>', dom, re.S)
    assert found, "the measuring script did not run"
    shots = os.environ.get("RLGEN_SCREENSHOT_DIR")
    if shots:  # for a person to look at: the same page as a picture
        Path(shots).mkdir(parents=True, exist_ok=True)
        run_chromium(browser, out / "view.html", f"--screenshot={Path(shots) / 'view.png'}")
    import html

    return json.loads(html.unescape(found.group(1))), out


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
