"""Shared fixtures: the test model, GPU detection, and a guard against leftover server processes."""

from __future__ import annotations

import importlib.util
import os

import pytest


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
    from rlgen._models import default_model_path

    return str(default_model_path())
