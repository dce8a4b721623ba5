"""The README as the front door, and the docs it leads to: links resolve, named paths exist, numbers trace.

No server, no imports of rlgen: these read Markdown files only. What is checked:
- every relative link in README.md and docs/*.md points to a file that exists, and a link's
  `#anchor` into a Markdown file names one of its headings (GitHub's slugs);
- every repository path the README and docs/*.md name (`rlgen/...`, `scripts/...`, `docs/...`, ...)
  exists, in backticks, links, commands or prose;
- every rlgen module path named in docs/*.md (`rlgen/server/_log.py`, or the short
  `server/_log.py` form) exists, so a renamed module cannot leave a stale path behind;
- the README stays short (at most 170 lines), with one line per tutorial and per feature, each
  feature linking the docs page that holds its detail;
- every number in the README's Performance section occurs in docs/benchmarks.md, and each
  "median [interval]" of its table occurs there verbatim.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "gpu" / "README.md"]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
MAX_README_LINES = 170

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
REPO_PATH = re.compile(r"(?<![\w/.~-])((?:rlgen|scripts|notebooks|docs|bench|tests|\.ci)/[\w./*-]*)")
LAYERS = ("client", "compare", "core", "cpu_server", "engine", "episodes", "rewards", "rollouts", "server")
MODULE = re.compile(r"(?<![\w/.])(rlgen/[\w/]*\w\.py|(?:" + "|".join(LAYERS) + r")/[\w/]*\w\.py)\b")
DECIMAL = re.compile(r"(?<![\d.])\d+\.\d+(?![\d.])")
INTERVAL = re.compile(r"\d+\.\d+x?(?: s)? \[[\d.]+-[\d.]+\]")


def _prose(path: Path) -> str:
    """The file's text without fenced code blocks (a link or path in an example is not a claim)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def _section(text: str, title: str) -> str:
    """The body of the `## title` section of a Markdown text."""
    match = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(_prose(path))}


def _broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(_prose(path)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    return broken


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_and_heading_that_exist(path: Path) -> None:
    broken = _broken_links(path)
    assert not broken, f"{path.relative_to(ROOT)}: broken links: {broken}"


def _missing_paths(text: str) -> tuple[list[str], list[str]]:
    """The repository paths a text names (`scripts/test.sh`, `docs/gpu/`, `docs/gpu/<run>/*.json`),
    and those of them that do not exist. A path counts when it ends in a file suffix or a slash, so
    prose such as "rlgen/raw" is not taken for one."""
    named = sorted({m.rstrip(".,;:") for m in REPO_PATH.findall(text)})
    named = [n for n in named if n.endswith("/") or re.search(r"\.\w+$", n)]
    missing = [n for n in named
               if not (any(ROOT.glob(n.rstrip("/"))) if "*" in n else (ROOT / n.rstrip("/")).exists())]
    return named, missing


def test_every_repository_path_the_readme_names_exists() -> None:
    named, missing = _missing_paths(README.read_text(encoding="utf-8"))
    assert len(named) >= 10, named  # the README does name its scripts, notebooks and docs
    assert not missing, f"README.md names paths that do not exist: {missing}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_the_docs_name_exists(path: Path) -> None:
    _, missing = _missing_paths(path.read_text(encoding="utf-8"))
    assert not missing, f"{path.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_rlgen_module_path_in_the_docs_exists(path: Path) -> None:
    named = set(MODULE.findall(path.read_text(encoding="utf-8")))
    missing = sorted(p for p in named
                     if not (ROOT / p).exists() and not (ROOT / "rlgen" / p).exists())
    assert not missing, f"{path.relative_to(ROOT)} names modules that do not exist: {missing}"


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; the front door keeps to {MAX_README_LINES}"


def _bullets(section: str) -> list[str]:
    """The section's bullets; a bullet continued on a second line fails the one-line rule."""
    lines = section.strip("\n").split("\n")
    bullets = [line for line in lines if line.startswith("- ")]
    continued = [line for line in lines if line.startswith("  ") and line.strip()]
    assert continued == [], f"bullets run over one line: {continued}"
    return bullets


def test_one_line_per_tutorial_naming_each_notebook() -> None:
    bullets = _bullets(_section(README.read_text(encoding="utf-8"), "Tutorials"))
    notebooks = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.ipynb"))
    named = [next((nb for nb in notebooks if nb in b), None) for b in bullets]
    assert sorted(n for n in named if n) == notebooks, (bullets, notebooks)
    assert None not in named, f"a tutorial line names no notebook: {bullets}"


def test_one_line_per_feature_each_linking_its_docs_page() -> None:
    bullets = _bullets(_section(README.read_text(encoding="utf-8"), "What you get"))
    assert len(bullets) >= 10
    no_page = [b for b in bullets if not re.search(r"\]\(docs/[\w/-]+\.md(#[\w-]+)?\)", b)]
    assert no_page == [], f"feature lines without a docs/ page: {no_page}"


def test_every_number_in_the_performance_section_is_in_the_benchmarks() -> None:
    perf = _section(README.read_text(encoding="utf-8"), "Performance")
    benchmarks = BENCHMARKS.read_text(encoding="utf-8")
    rows = [line for line in perf.split("\n") if line.startswith("|") and not line.startswith("|---")][1:]
    assert 4 <= len(rows) <= 7, f"the performance table should have about five rows: {rows}"
    intervals = [m for row in rows for m in INTERVAL.findall(row)]
    assert len(intervals) >= len(rows), f"each row should give a median with its interval: {rows}"
    assert [m for m in intervals if m not in benchmarks] == [], "intervals not in docs/benchmarks.md"
    prose = re.sub(r"SGLang \d+\.\d+\.\d+", "", perf)  # the version is not a measurement
    numbers = sorted(set(DECIMAL.findall(prose)))
    assert [n for n in numbers if n not in benchmarks] == [], "numbers not in docs/benchmarks.md"
