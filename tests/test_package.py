"""The package as a whole: its public surface, its import graph, and what `import rlgen` loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import rlgen

PACKAGE = Path(rlgen.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# The layers, top to bottom (docs/architecture.md). A module may import modules of a lower rank, or
# of its own subpackage (acyclically); `|` siblings share a rank and never import each other.
LAYERS: dict[str, int] = {
    "rlgen": 7,                      # the facade: __init__, __main__
    "rlgen.engine": 6,
    "rlgen.rollout_log": 5, "rlgen.envs": 5,
    "rlgen.compare": 4,
    "rlgen.episodes": 4,
    "rlgen.rollouts": 3,
    "rlgen.rewards": 2,
    "rlgen.server": 1, "rlgen.client": 1, "rlgen.cpu_server": 1,
    "rlgen.core": 0, "rlgen._version": 0,
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and ".".join(parts[:2]) in LAYERS else "rlgen"


def _imports(path: Path, modules: set[str], name: str | None = None) -> set[str]:
    """Every rlgen module `path` (module `name`) names in an import, counted the strict way: at
    module level, inside functions, under `if TYPE_CHECKING:` and `if not TYPE_CHECKING:` alike.
    `from . import x` names the module `x`, not the package it sits in."""
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in files}
    return {_module_name(p): _imports(p, modules) for p in files}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in done:
                walk(nxt, [*path, nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            walk(start, [start])
    return cycles


def _upward(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for a, targets in graph.items():
        for b in targets:
            la, lb = _layer(a), _layer(b)
            if la != lb and LAYERS[la] <= LAYERS[lb]:
                bad.append(f"{a} -> {b}")
    return sorted(bad)


def test_no_module_of_rlgen_imports_itself_back_through_others() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_every_import_goes_down_the_layers() -> None:
    graph = _graph()
    assert all(_layer(m) in LAYERS for m in graph)
    assert not _upward(graph), "imports that go up or sideways: " + "; ".join(_upward(graph))


def test_the_import_count_sees_imports_hidden_in_functions_and_type_checking_blocks(tmp_path: Path) -> None:
    mods = {"rlgen.rollouts._rollouts", "rlgen.rollouts._display"}
    a = tmp_path / "a.py"
    for hidden in ("def f():\n    from ._rollouts import Rollouts\n",
                   "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._rollouts import Rollouts\n",
                   "from typing import TYPE_CHECKING\nif not TYPE_CHECKING:\n    from . import _rollouts\n",
                   "try:\n    pass\nfinally:\n    import rlgen.rollouts._rollouts\n"):
        a.write_text(hidden)
        found = _imports(a, mods, "rlgen.rollouts._display")
        assert found == {"rlgen.rollouts._rollouts"}, hidden
        graph = {"rlgen.rollouts._display": found, "rlgen.rollouts._rollouts": {"rlgen.rollouts._display"}}
        assert _cycles(graph), hidden


def test_the_layer_check_refuses_an_import_that_goes_up(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from ..rollouts._rollouts import Rollouts\n")
    mods = {"rlgen.rollouts._rollouts", "rlgen.rewards._scoring"}
    graph = {"rlgen.rewards._scoring": _imports(a, mods, "rlgen.rewards._scoring")}
    assert _upward(graph) == ["rlgen.rewards._scoring -> rlgen.rollouts._rollouts"]
    a.write_text("from ..client import _http\n")  # a sibling of the same rank
    graph = {"rlgen.server._process": _imports(a, {"rlgen.client._http"}, "rlgen.server._process")}
    assert _upward(graph) == ["rlgen.server._process -> rlgen.client._http"]


# The function-size cap, and the functions allowed over it (qualified name -> why).
FUNCTION_CAP = 80
OVER_THE_CAP: dict[str, str] = {}


def _function_sizes(source: str, module: str) -> dict[str, int]:
    """Each function's and method's size in lines, by qualified name (`module.Class.method`): from
    its `def` line (decorators not counted) to its last line, without its docstring, blank lines and
    comments counted as they stand. A nested function counts as part of the function it is in."""
    sizes: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = child.body[0]
                doc = (first.end_lineno or first.lineno) - first.lineno + 1 if (
                    isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)) else 0
                sizes[f"{prefix}.{child.name}"] = (child.end_lineno or child.lineno) - child.lineno + 1 - doc
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}.{child.name}")

    walk(ast.parse(source), module)
    return sizes


def test_no_function_of_rlgen_passes_about_80_lines() -> None:
    """No function or method is longer than `FUNCTION_CAP` lines, its docstring left out (a
    docstring states a contract, and a long contract is no reason to split the code), except the
    ones `OVER_THE_CAP` names with the reason; an exception that is back under the cap, or gone, is
    struck from the list."""
    sizes: dict[str, int] = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        sizes.update(_function_sizes(p.read_text(), _module_name(p)))
    long = {name: n for name, n in sizes.items() if n > FUNCTION_CAP and name not in OVER_THE_CAP}
    assert not long, f"functions over {FUNCTION_CAP} lines (split them by step): {long}"
    stale = sorted(name for name in OVER_THE_CAP if sizes.get(name, 0) <= FUNCTION_CAP)
    assert not stale, f"no longer over the cap (strike them from OVER_THE_CAP): {stale}"


def test_the_function_size_counts_code_not_docstrings_and_names_methods_by_class() -> None:
    source = (
        "def f():\n    \"\"\"A\n    long\n    docstring.\"\"\"\n    x = 1\n    return x\n\n"
        "class C:\n    @property\n    def m(self):\n        def inner():\n            pass\n        return 1\n"
    )
    assert _function_sizes(source, "rlgen.m") == {"rlgen.m.f": 3, "rlgen.m.C.m": 4}


def test_every_module_opens_with_what_it_owns_and_knows_nothing_about() -> None:
    missing = []
    for p in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(p.read_text())) or ""
        if p.name not in {"__main__.py", "_version.py", "py.typed"} and not ("Owns" in doc or "owns" in doc):
            missing.append(str(p.relative_to(PACKAGE)))
    assert not missing, f"modules whose docstring does not say what they own: {missing}"


def test_the_public_names_are_a_literal_list_and_all_exist() -> None:
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    (value,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__all__"]
    names = ast.literal_eval(value)  # a literal: ruff, IDEs and type checkers can read it
    assert names == rlgen.__all__ and len(set(names)) == len(names)
    assert all(hasattr(rlgen, name) for name in names)


def test_import_rlgen_stays_light() -> None:
    code = "import sys, rlgen; print(sorted(m for m in ('torch', 'pandas', 'transformers', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_lab_extra_installs_what_the_tutorials_need_and_no_dev_tools() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = PACKAGE.parent
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    lab = " ".join(extras["lab"])
    assert "jupyterlab" in lab and "ipykernel" in lab and "rlgen[rewards,plots,lora]" in lab  # tutorial 07 trains with peft
    assert not [tool for tool in ("pytest", "ruff", "mypy", "sglang-router", "nbmake") if tool in lab]
    assert "source scripts/venv.sh lab" in (root / "scripts" / "lab.sh").read_text()
