"""Screenshots of rlgen's views in real JupyterLab, trusted (run live) and untrusted (opened after nbconvert ran it).

Starts JupyterLab (the .venv's, `bash scripts/lab.sh` installs it) on a scratch folder holding a
notebook that generates on the default model with per-prompt data (a `question` that repeats the
prompt, a long nested `metadata`, an `answer`), scores it with a reward that fails on some rows,
and shows the result, `reward_summary()` and `browse()`. Drives Debian's Chromium through
playwright (a separate environment: `python3 -m venv /tmp/pw && /tmp/pw/bin/pip install playwright`)
at 1,400 x 900, and writes PNGs of each output plus the measured widths (JSON):

    /tmp/pw/bin/python scripts/lab_screenshots.py --out docs/images

`--notebook episodes` runs multi-turn episodes on the CPU backend instead (a user who asks again, a
tool that works, a tool that fails; `check_drift()`), shows them and `browse()`s them; its files are
named `lab-episodes-*`. `--notebook runlog` opens a copy of notebook 08's recorded log, draws its
trend, re-scores and diffs it, and shows the log browser and the diff's browser (`lab-runlog-*`).
`--notebook envs` runs a TRL environment class with a failing tool and SkyRL-gym's GSM8K
environment (one row without a ground truth) unchanged, and browses the failed episodes (`lab-envs-*`).
`--file notebooks/10_off_policy.ipynb` runs one of the tutorials as it is (from a copy of
notebooks/, so its data files are there; outputs cleared first), waiting until every code cell has
run; its files are named `lab-<stem>-*` (e.g. `lab-10_off_policy-trusted-output3.png`).

1. trusted: the notebook is opened in JupyterLab and run there (Run > Run All Cells);
2. untrusted: the same notebook executed by nbconvert first, then opened (JupyterLab does not
   trust outputs it did not produce, and strips <style> blocks from them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv" / "bin" / "python"
CELLS = [
    "import rlgen\nfrom rlgen import rewards\nimport pandas as pd",
    "eng = rlgen.Engine(progress=False)\ntask = rewards.tutorial_task()\n"
    "data = pd.DataFrame({'question': [p[-1]['content'] for p in task.prompts],\n"
    "                     'metadata': [{'source': 'tutorial', 'difficulty': {'level': i % 3, 'notes': 'x' * 120},"
    " 'tags': ['math', 'addition']} for i in range(len(task.prompts))],\n"
    "                     'answer': task.data['answer']})",
    "res = eng.generate(task.prompts[:4], n=4, max_new_tokens=48, temperature=1.0, seed=0, data=data[:4])\n"
    "def fragile(completion, answer):\n    if '7' in completion:\n        raise ValueError('no sevens please')\n"
    "    return float(answer in completion)\n"
    "res = res.add_rewards([rewards.answer_match(extract='last_number'), fragile], mode='thread', progress=False)\nres",
    "res.reward_summary()",
    "res.browse()",
]


EPISODE_CELLS = [
    "import re\nimport rlgen\nfrom rlgen import episodes\neng = rlgen.Engine(progress=False)",
    '''def again(messages, data):
    """A user who asks again until the answer has a number in it."""
    return "done" if re.search(r"\\d", messages[-1]["content"]) else "Are you sure? Answer with a number."

def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b

def divide(a: int, b: int) -> float:
    """Divide a by b.

    Args:
        a: the dividend.
        b: the divisor.
    """
    return a / b

# The 135M model writes no tool calls: these parsers read its turn as one.
def numbers_as_add(text):
    """A turn's first two numbers as add(a, b); no call without two numbers (the episode ends)."""
    nums = [int(x) for x in re.findall(r"\\d+", text)]
    return [("add", {"a": nums[0], "b": nums[1]})] if len(nums) >= 2 else []''',
    '''sampling = dict(max_turns=3, max_new_tokens=24, temperature=1.0, sampling_seed=0)
chat = eng.episodes(["What is 2+3?", "Name a colour."], env=again, n=2, **sampling)
added = eng.episodes(["Add 2 and 3 with the add tool."], env=episodes.tool_env([add], parser=numbers_as_add), n=2, **sampling)
divided = eng.episodes(["Divide 1 by 0."], env=episodes.tool_env([divide], parser=lambda text: [("divide", {"a": 1, "b": 0})]),
                       n=1, **sampling)
res = rlgen.Episodes.concat([chat, added, divided], renumber=True).check_drift()
res''',
    "b = res.browse()\nb.status = 'done'  # the selection can be set from code, as from the controls\n"
    "b.step(3)  # the fourth matching episode\nb",
]
RUN_LOG_CELLS = [
    "import re, shutil, tempfile\nimport rlgen\nfrom rlgen.server._models import default_model_path\n"
    f"run = rlgen.RolloutLog(shutil.copytree({str(ROOT / 'notebooks' / 'data' / '08-run-log')!r}, "
    "tempfile.mkdtemp() + '/log'), tokenizer=str(default_model_path()))\nrun",
    "run.plot.trend(threshold=0.5)",
    '''def brief_sentence(finish_reason, completion_tokens, completion):
    if finish_reason != "stop" or len(re.findall(r"[A-Za-z0-9']+", completion)) < 4:
        return 0.0
    return 1.0 - completion_tokens / 24

run.rescore({"brief": brief_sentence}, version="sentences", progress=False)
d = run.diff("logged", "sentences", threshold=0.5)
d''',
    "b = run.browse(step=20)\nb",
    "d.browse(top=12)",
]
ENV_CELLS = [
    "import rlgen\nfrom skyrl_gym.envs.gsm8k.multi_turn_env import GSM8kMultiTurnEnv\neng = rlgen.Engine(progress=False)",
    '''class CounterEnv:  # a TRL environment_factory class, with a bug: a quoted start from the row
    def reset(self, **row) -> str | None:
        self.counter, self.target = row["start"], row["target"]
        return f"The counter is {self.counter}. Increment it to {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step
        return self.counter

SYSTEM = ('You can call the tool increment. To use it, write <tool_call>{"name": "increment", '
          '"arguments": {"step": ...}}</tool_call> and wait for the result.')
DEMO = [{"role": "user", "content": "Increment the counter by 2."},
        {"role": "assistant", "content": '<tool_call>{"name": "increment", "arguments": {"step": 2}}</tool_call>'},
        {"role": "tool", "name": "increment", "content": "2"}, {"role": "assistant", "content": "Done."}]
rows = [{"start": 0, "target": 2}, {"start": "1", "target": 3}, {"start": 2, "target": 5}, {"start": "0", "target": 4}]
chats = [[{"role": "system", "content": SYSTEM}, *DEMO, {"role": "user", "content": ""}] for _ in rows]
res = eng.episodes(chats, env=CounterEnv, data=rows, n=2, max_turns=3, max_new_tokens=40, temperature=0.7,
                   stop=["</tool_call>"], sampling_seed=0)
res''',
    "b = res.browse()\nb.status = 'tool_error'\nb",
    '''question = [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. "
              "How many in all? End with '#### ANSWER'."}]
gsm = eng.episodes([question] * 2, env=GSM8kMultiTurnEnv, n=2, max_turns=3, max_new_tokens=48, sampling_seed=0,
                   data=[{"reward_spec": {"ground_truth": "72"}, "extra_info": {"max_turns": 3}},
                         {"reward_spec": {}, "extra_info": {}}])
gsm''',
]
NOTEBOOKS = {"view": CELLS, "episodes": EPISODE_CELLS, "runlog": RUN_LOG_CELLS, "envs": ENV_CELLS}
OUTPUTS = {"view": 3, "episodes": 2, "runlog": 5, "envs": 3}  # outputs to wait for in the live run


def notebook(cells: list[str] = CELLS) -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                       "source": src} for i, src in enumerate(cells)],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def cleared(nb: dict) -> dict:
    """`nb` with every code cell's outputs and execution count removed (a fresh run's starting point)."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return nb


VISIBLE = "[...document.querySelectorAll('.jp-Notebook')].find(n => n.checkVisibility())"
# A tutorial has run once every code cell shows its execution count ("[12]:"), none still "[*]:".
ALL_RAN = f"[...{VISIBLE}.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].every(p => /\\[\\d+\\]/.test(p.textContent))"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


MEASURE = """() => {
  const out = {};
  const nb = [...document.querySelectorAll('.jp-Notebook')].find(n => n.checkVisibility());
  const tables = [...nb.querySelectorAll('.jp-OutputArea-output table')];
  out.tables = tables.map(t => {
    const area = t.closest('.jp-OutputArea-output').getBoundingClientRect();
    const r = t.getBoundingClientRect();
    const heads = [...t.querySelectorAll('th')].map(th => [th.textContent.trim(), th.getBoundingClientRect().width]);
    return {area_width: area.width, table_width: r.width, right: r.right, heads: heads.slice(0, 12)};
  });
  return out;
}"""


def shoot(page, out: Path, name: str) -> dict:
    try:  # JupyterLab's question about news covers the bottom right corner
        page.get_by_role("button", name="No", exact=True).click(timeout=2000)
    except Exception:  # not asked this time
        pass
    page.screenshot(path=str(out / f"{name}-page.png"), full_page=False)  # the window, as a user sees it
    # Each output whole: a window tall enough that JupyterLab draws every cell without scrolling.
    page.set_viewport_size({"width": 1400, "height": 4000})
    time.sleep(2)
    outputs = page.locator(".jp-Notebook:visible .jp-OutputArea-output")
    count = outputs.count()
    shots = []
    for i in range(count):
        el = outputs.nth(i)
        path = out / f"{name}-output{i}.png"
        el.scroll_into_view_if_needed()
        el.screenshot(path=str(path))
        shots.append(path.name)
    measured = page.evaluate(MEASURE)
    page.set_viewport_size({"width": 1400, "height": 900})
    return {"outputs": shots, "measure": measured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--notebook", choices=sorted(NOTEBOOKS), default="view")
    parser.add_argument("--file", type=Path, help="a tutorial to run as it is, instead of --notebook's cells")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="rlgen-lab-"))
    if args.file is not None:
        prefix, done = f"lab-{args.file.stem}", ALL_RAN
        shutil.copytree(args.file.resolve().parent, work, dirs_exist_ok=True)
        for name in ("live.ipynb", "executed.ipynb"):
            (work / name).write_text(json.dumps(cleared(json.loads(args.file.read_text()))))
    else:
        cells = NOTEBOOKS[args.notebook]
        prefix = "lab" if args.notebook == "view" else f"lab-{args.notebook}"
        done = f"{VISIBLE}.querySelectorAll('.jp-OutputArea-output').length >= {OUTPUTS[args.notebook]}"
        (work / "live.ipynb").write_text(json.dumps(notebook(cells)))
        (work / "executed.ipynb").write_text(json.dumps(notebook(cells)))
    subprocess.run([str(VENV_PY), "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                    "--ExecutePreprocessor.timeout=600", str(work / "executed.ipynb")], check=True)
    port, token = free_port(), "rlgen-shots"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(work / "cfg"), "JUPYTER_DATA_DIR": str(work / "data")}
    lab = subprocess.Popen([str(VENV_PY), "-m", "jupyterlab", "--no-browser", f"--port={port}",
                            f"--ServerApp.token={token}", f"--notebook-dir={work}", "--ServerApp.ip=127.0.0.1", "--allow-root"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    results = {}
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api?token={token}", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            # Untrusted: outputs made by nbconvert, opened as they are.
            page.goto(f"http://127.0.0.1:{port}/lab/tree/executed.ipynb?token={token}")
            page.wait_for_selector(".jp-OutputArea-output", timeout=120_000)
            time.sleep(3)
            results["untrusted"] = shoot(page, args.out, f"{prefix}-untrusted")
            # Trusted: run live in JupyterLab.
            page.goto(f"http://127.0.0.1:{port}/lab/tree/live.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook", timeout=120_000)
            time.sleep(3)
            page.locator(".jp-Notebook:visible .jp-Cell").first.click()
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_text("Run All Cells", exact=True).click()
            page.wait_for_function(done, timeout=600_000)
            page.wait_for_function(f"[...{VISIBLE}.querySelectorAll('.jp-InputArea-prompt')]"
                                   ".every(p => !p.textContent.includes('*'))", timeout=300_000)
            time.sleep(3)
            results["trusted"] = shoot(page, args.out, f"{prefix}-trusted")
            browser.close()
    finally:
        os.killpg(lab.pid, 15)
    (args.out / f"{prefix}-screenshots.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1)[:4000])


if __name__ == "__main__":
    sys.exit(main())
