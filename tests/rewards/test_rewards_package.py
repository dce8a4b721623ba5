"""rlgen.rewards as a package: a light import, literal public names, picklable rewards, helpful missing-extra errors."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlgen.rewards
from rlgen import rewards

REPO_ROOT = str(Path(__file__).resolve().parents[2])
HAS_EXTRA = all(importlib.util.find_spec(m) for m in ("math_verify", "reasoning_gym"))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))}


@pytest.mark.timeout(120)
def test_import_rlgen_rewards_loads_neither_the_extra_nor_pandas() -> None:
    code = ("import sys, rlgen.rewards; print(sorted(m for m in ('reasoning_gym', 'math_verify', 'sympy', "
            "'latex2sympy2_extended', 'matplotlib', 'pandas', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, env=_env())
    assert out.stdout.strip() == "[]"


def test_the_public_names_are_a_literal_list_and_all_exist() -> None:
    tree = ast.parse(Path(rlgen.rewards.__file__).read_text())
    (value,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__all__"]
    names = ast.literal_eval(value)
    assert names == rewards.__all__ and len(set(names)) == len(names)
    assert all(hasattr(rewards, name) for name in names)


def _builtins() -> dict[str, object]:
    fns: dict[str, object] = {
        "answer_auto": rewards.answer_match(),
        "answer_last_number": rewards.answer_match(extract="last_number"),
        "think_format": rewards.think_format,
        "soft_overlong_32_8": rewards.soft_overlong_penalty(max_completion_len=32, cache_len=8),
        "math_verify_reward": rewards.math_verify_reward,
        "math_verify": rewards.math_verify_match(),
    }
    return fns


def test_every_builtin_reward_is_named_for_its_column() -> None:
    for name, fn in _builtins().items():
        assert fn.__name__ == name  # type: ignore[attr-defined]


@pytest.mark.timeout(180)
def test_every_builtin_reward_pickles_with_cloudpickle_and_runs_in_a_fresh_process(tmp_path: Path) -> None:
    cloudpickle = pytest.importorskip("cloudpickle")
    calls = {
        "answer_auto": ("so 7", "7"),
        "answer_last_number": ("so 7", "7"),
        "think_format": ("<think>x</think>y",),
        "soft_overlong_32_8": (30,),
    }
    expected = {"answer_auto": 1.0, "answer_last_number": 1.0, "think_format": 1.0, "soft_overlong_32_8": -0.75}
    fns = _builtins()
    if HAS_EXTRA:
        task = rewards.tutorial_task(size=2)
        row = next(task.data.itertuples())
        fns["task"], fns["task_extract"], fns["task_object"] = task.reward, task.extract_reward, task
        calls.update({"math_verify_reward": (r"\boxed{7}", "7"), "math_verify": (r"\boxed{7}", "7"),
                      "task": (f"<answer>{row.answer}</answer>", row.answer, row.metadata),
                      "task_extract": (f"= {row.answer}", row.answer)})
        expected.update({"math_verify_reward": 1.0, "math_verify": 1.0, "task": 1.0, "task_extract": 1.0})
    for fn in fns.values():
        assert cloudpickle.loads(cloudpickle.dumps(fn)) is not None
    payload = tmp_path / "fns.pkl"
    payload.write_bytes(cloudpickle.dumps({name: (fns[name], args) for name, args in calls.items()}))
    code = ("import pickle, sys, json; fns = pickle.load(open(sys.argv[1], 'rb')); "
            "print(json.dumps({k: f(*a) for k, (f, a) in fns.items()}))")
    out = subprocess.run([sys.executable, "-c", code, str(payload)], capture_output=True, text=True, timeout=150,
                         env=_env())
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    assert json.loads(out.stdout.strip().splitlines()[-1]) == expected


@pytest.mark.parametrize("module, call", [
    ("math_verify", lambda: rewards.math_verify_reward("1", "1")),
    ("reasoning_gym", lambda: rewards.reasoning_gym_task("basic_arithmetic", size=1)),
    ("reasoning_gym", lambda: rewards.tutorial_task()),
])
def test_a_missing_extra_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, module, call) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import <module>` fail
    with pytest.raises(ImportError, match=r"pip install 'rlgen\[rewards\]'"):
        call()
