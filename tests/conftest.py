"""Shared fixtures: the test model, GPU detection, and a guard against leftover server processes.

`scripts/test.sh` runs the suite on two pytest-xdist workers (`--dist loadfile`: a module, and its
module-scoped servers, stays on one worker). What two workers share is made safe here and in the
helpers: `isolated` finds a test's processes by a marker of its own (never by name, so the other
worker's live servers are never seen) and gives the test a private cache dir (registry, kept
servers, completions); test_engine's guard gets a session marker per worker (RLGEN_TEST_SESSION,
below); the test helpers pick ports below the kernel's ephemeral range
(`_cpu_server_process.free_port`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from _processes import MARKER_VAR, REPO_ROOT, cmdline, wait_for_no_marked_processes


def _has_gpu_sglang() -> bool:
    if importlib.util.find_spec("sglang") is None:
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_GPU_SGLANG = _has_gpu_sglang()
# The cache dir the session started with: `model_path` resolves the default model there even when
# the first test to ask for it is an `isolated` one (whose private cache would convert it again).
_SESSION_CACHE_DIR = os.environ.get("RLGEN_CACHE_DIR")
# tests/test_engine.py's guard finds the servers of its process by RLGEN_TEST_SESSION, which servers
# inherit (it keeps a value set before it). An xdist worker gets one of its own even where the run
# inherited one: with a shared value, a worker would count the other's new servers as its leftovers.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["RLGEN_TEST_SESSION"] = f"{uuid.uuid4().hex}-{os.environ['PYTEST_XDIST_WORKER']}"


def _longest_first(items: list[pytest.Item]) -> None:
    """Under xdist, the files that take longest go out first, so that the last ones handed to a
    worker are short and the two workers finish together: the notebooks (50-160 s each under
    nbmake), then the modules with `slow` tests, then the rest, each group in collection order.
    A stable sort on a key per file: a file's tests stay together and in order (`--dist loadfile`
    with `--no-loadscope-reorder` keeps this order; xdist's default reorders by test count)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: 0 if item.path.suffix == ".ipynb" else 1 if item.path in slow_files else 2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker collects, and sorts, the same list
        _longest_first(items)
    if HAS_GPU_SGLANG:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and sglang (pip install 'rlgen[sglang]')")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_path() -> str:
    """The test model as a local HF checkout: $RLGEN_TEST_MODEL, else rlgen's default model."""
    path = os.environ.get("RLGEN_TEST_MODEL")
    if path:
        return path
    from rlgen.server._models import default_model_path

    with pytest.MonkeyPatch.context() as mp:  # the session's cache dir, not an `isolated` test's
        if _SESSION_CACHE_DIR is None:
            mp.delenv("RLGEN_CACHE_DIR", raising=False)
        else:
            mp.setenv("RLGEN_CACHE_DIR", _SESSION_CACHE_DIR)
        return str(default_model_path())


@pytest.fixture(scope="session")
def tok(model_path: str) -> Any:
    """The test model's tokenizer (transformers), loaded once."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private cache dir, and a marker env var to find every process this test started."""
    marker = uuid.uuid4().hex
    monkeypatch.setenv("RLGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(MARKER_VAR, marker)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
    yield marker
    leftovers = wait_for_no_marked_processes(marker, timeout=5.0)
    for proc in leftovers:  # clean up before failing, so one failure does not poison the next test
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not leftovers, f"processes left behind: {[(p.pid, cmdline(p)) for p in leftovers]}"
