"""On the GPU machine: the notebook view and the rollout browser on real SGLang output.

Executes, each in a fresh kernel on SGLang, (1) the notebook of tests/test_browser_render.py (chats
with accents and newlines, n=3, top-k, rewards, res.browse()) and (2) notebooks/01_quickstart.ipynb,
and writes them with their outputs to $OUT. The GPU machine has no browser: back on a CPU machine,
`python scripts/render_notebook.py OUT/view-sglang.ipynb` exports and renders them in Chromium with
the same measurements as the test.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from test_browser_render import CELLS  # noqa: E402


def execute(nb: nbformat.NotebookNode, name: str, out: Path) -> None:
    t0 = time.monotonic()
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(out)}}).execute()
        status = "ok"
    except Exception as err:  # keep the partial notebook: its outputs say where it stopped
        status = f"{type(err).__name__}: {str(err)[:500]}"
    nbformat.write(nb, out / name)
    print(f"{name}: {status} in {time.monotonic() - t0:.0f} s", flush=True)


def main() -> None:
    out = Path(os.environ.get("OUT", "."))
    model = os.environ["RLGEN_TEST_MODEL"]
    view = nbformat.v4.new_notebook()
    view.cells = [nbformat.v4.new_code_cell(c.replace("rlgen.Engine(", f"rlgen.Engine({model!r}, ")) for c in CELLS]
    execute(view, "view-sglang.ipynb", out)
    execute(nbformat.read(REPO / "notebooks" / "01_quickstart.ipynb", as_version=4), "quickstart-sglang.ipynb", out)


if __name__ == "__main__":
    main()
