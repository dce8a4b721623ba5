"""docs/environments.md as a reader uses it (issue 44, item 8): every Python snippet pastes and runs as
it is, on the CPU backend (its `rlgen.Engine()` is the module's engine, so that one server serves
them all; verl's snippet imports verl's own `function_tool` from the pinned copy, as tests/envs/test_verl.py
does), and the versions the page names are the ones the dev environment holds."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import rlgen

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "environments.md"
VERL_DIR = ROOT / "tests" / "data" / "verl-0.9.1-tools"
BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")
SNIPPET = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def snippets() -> list[str]:
    return SNIPPET.findall(DOC.read_text(encoding="utf-8"))


def framework(code: str) -> str:
    return "verl" if "from verl" in code else "verifiers" if "import verifiers" in code else "trl-skyrl"


@pytest.fixture(scope="module")
def engine(model_path: str):  # type: ignore[no-untyped-def]
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False)
    yield eng
    eng.close()


class _Shared:
    """What a snippet's `with rlgen.Engine() as eng:` gets: the module's engine, not closed at the end."""

    def __init__(self, engine: rlgen.Engine) -> None:
        self.engine = engine

    def __call__(self, *args: Any, **kwargs: Any) -> _Shared:
        return self

    def __enter__(self) -> rlgen.Engine:
        return self.engine

    def __exit__(self, *exc_info: object) -> None:
        return None


def test_the_page_has_a_snippet_for_each_framework() -> None:
    assert sorted(framework(code) for code in snippets()) == ["trl-skyrl", "verifiers", "verl"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("code", snippets(), ids=framework)
def test_each_snippet_pastes_and_runs_as_it_is(code: str, engine: rlgen.Engine, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(rlgen, "Engine", _Shared(engine))
    namespace: dict[str, Any] = {"__name__": "__doc_snippet__"}
    sys.path.insert(0, str(VERL_DIR))  # verl's own function_tool, pinned (verl does not install here)
    try:
        exec(compile(code, f"{DOC.name} ({framework(code)})", "exec"), namespace)
    finally:
        sys.path.remove(str(VERL_DIR))
        registry = getattr(sys.modules.get("verl.tools.function_tool"), "FUNCTION_TOOL_REGISTRY", {})
        registry.pop("current_weather", None)  # verl's registry takes a name once per process
    res = namespace["res"]
    assert isinstance(res, rlgen.Episodes) and len(res) >= 1
    assert set(res.df.status) <= {"done", "max_turns", "bad_tool_call", "context_limit"}, res.df.status.tolist()
    assert "status" in capsys.readouterr().out  # its printed table


def test_the_transformers_the_page_compares_with_verls_pin_is_the_installed_one() -> None:
    import transformers

    text = DOC.read_text(encoding="utf-8")
    near = [m.group(1) for word in re.finditer(r"transformers", text)
            for m in re.finditer(r"(\d+\.\d+(?:\.\d+)?)", text[word.end():word.end() + 40])]
    installed = transformers.__version__
    stale = [v for v in near if v != "5.11" and not installed.startswith(v)]
    assert near and not stale, f"the page names transformers {stale}; the dev environment has {installed}"
    assert tuple(int(x) for x in installed.split(".")[:2]) >= (5, 11), \
        f"verl's pin transformers<5.11 no longer conflicts with {installed}: the page's reason is gone"
