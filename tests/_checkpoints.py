"""Changed checkpoints for weight-update tests: a module of its own (not a test module), so that
tests on any backend can import it without importing another test module's fixtures and skips."""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["perturbed_norms"]


def perturbed_norms(model_path: str, out: Path) -> Path:
    """The checkout with noise on its norm weights, saved to `out`: a changed model in a second
    (test_weight_versions' perturbed_checkpoint noises every matrix, which takes ~15 s on a CPU)."""
    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir()
    for f in Path(model_path).iterdir():
        if f.is_file() and f.name != "model.safetensors" and not f.name.startswith("."):
            shutil.copy(f, out / f.name)
    tensors = load_file(Path(model_path) / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    for name, t in tensors.items():
        if t.ndim == 1 and "norm" in name:
            tensors[name] = t * (1 + 0.3 * torch.randn(t.shape, generator=gen)).to(t.dtype)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out
