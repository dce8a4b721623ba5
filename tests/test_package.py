"""The package as a whole: its public surface, its import graph, and what `import rlgen` loads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rlgen

PACKAGE = Path(rlgen.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _runtime_imports(path: Path, modules: set[str], name: str | None = None) -> set[str]:
    """The rlgen modules `path` (module `name`) imports when it runs, at module level or inside
    functions, leaving out `if TYPE_CHECKING:` blocks, which never run."""
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _is_type_checking_block(node):
            return
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
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != name}


def test_no_module_of_rlgen_imports_itself_back_through_others() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in files}
    graph = {_module_name(p): _runtime_imports(p, modules) for p in files}
    cycles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in done:
                walk(nxt, [*path, nxt])
        done.add(node)

    done: set[str] = set()
    for start in sorted(graph):
        if start not in done:
            walk(start, [start])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_cycle_made_inside_a_function(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from rlgen import _results\n")
    assert _runtime_imports(a, {"rlgen._results"}, "rlgen._display") == {"rlgen._results"}
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlgen import _results\n")
    assert _runtime_imports(a, {"rlgen._results"}, "rlgen._display") == set()


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
