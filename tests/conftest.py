"""Shared fixtures: the test model, GPU detection, and a guard against leftover server processes."""

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
