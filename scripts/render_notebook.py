"""Render an executed notebook as JupyterLab shows it, in headless Chromium, and measure the view.

Exports the notebook with nbconvert's lab template (JupyterLab's stylesheet), renders it in
Debian's Chromium (`bash scripts/browser.sh` installs it) at a 1400 px wide window, and reads back
what a script in the page measured: JupyterLab's styles present, the text of rlgen's response
tokens, the right edge of rlgen's tables, the computed alignment of their cells, the progress
outputs, the rollout browser's text. tests/test_browser_render.py asserts on these; run by hand it
also writes a screenshot:

    python scripts/render_notebook.py executed.ipynb --out DIR   # DIR/<name>.html, .png, .json
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

WIDTH = 1400

# Runs in the rendered page; its result is read back from the DOM Chromium dumps.
MEASURE = """
<script>
window.addEventListener('load', () => {
  const first = document.querySelector('.rlgen-rollouts td');
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
    progress: outputs.filter(t => /(generate|score|rewards)[: ]/.test(t) && !/Rollouts/.test(t)),
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


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def run_chromium(browser: str, page: Path, *args: str, height: int = 3000) -> str:
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={WIDTH},{height}", "--virtual-time-budget=5000", *args, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def render(nb: Any, out: Path, name: str, *, browser: str, screenshot_height: int | None = None) -> dict[str, Any]:
    """Export `nb` (a NotebookNode) to out/<name>.html, measure it in Chromium; with
    `screenshot_height`, also write out/<name>.png (the page without the measuring script)."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    page = out / f"{name}.html"
    page.write_text(body, encoding="utf-8")
    measured = out / f"{name}-measured.html"
    measured.write_text(body.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = run_chromium(browser, measured, "--dump-dom")
    found = re.search(r'<pre id="rlgen-measure">(.*?)</pre>', dom, re.S)
    if not found:
        raise RuntimeError("the measuring script did not run")
    result: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    if screenshot_height:
        run_chromium(browser, page, f"--screenshot={out / (name + '.png')}", height=screenshot_height)
    return result


def main() -> None:
    import nbformat

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebook")
    ap.add_argument("--out", required=True)
    ap.add_argument("--height", type=int, default=3000, help="screenshot height in px")
    args = ap.parse_args()
    browser = find_chromium()
    if browser is None:
        raise SystemExit("no chromium: run `bash scripts/browser.sh`")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = Path(args.notebook).stem
    result = render(nbformat.read(args.notebook, as_version=4), out, name, browser=browser, screenshot_height=args.height)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    summary = {k: v for k, v in result.items() if k not in ("tokens", "browser_text")}
    print(json.dumps(summary, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
