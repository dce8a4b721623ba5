"""New weights change outputs: a perturbed checkpoint loaded with `update_weights_from_disk` changes
greedy outputs, loading the original back restores them exactly, and every row and record names
the weights it came from. A real CPU-backend server and real checkpoints on disk."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

import rlgen
from rlgen.server._weights import weights_sha256

pytestmark = pytest.mark.slow
# Also runs on real SGLang on the GPU machine (RLGEN_TEST_BACKEND=sglang).
BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")

PROMPTS = ["What is the capital of France?", "Write a haiku about rain.", "List three fruits.", "What is 7*6?"]


def perturbed_checkpoint(model_path: str, out: Path, *, scale: float = 0.2, seed: int = 0) -> Path:
    """The model with Gaussian noise (`scale` x each tensor's std) added to every weight matrix."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * scale)
    model.to(torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(out)
    return out


@pytest.mark.timeout(300 if BACKEND == "cpu" else 900)
def test_perturbed_weights_change_greedy_outputs_and_the_original_weights_restore_them_exactly(
        model_path: str, tmp_path: Path) -> None:
    changed = perturbed_checkpoint(model_path, tmp_path / "perturbed")
    greedy = {"max_new_tokens": 16, "temperature": 0.0}
    with rlgen.Engine(model_path, backend=BACKEND, progress=False, fast_start=True, enable_memory_saver=True) as eng:
        before = eng.generate(PROMPTS, **greedy)
        assert set(before.df.weight_version) == {"default"}
        version = eng.update_weights_from_disk(changed, weight_version="perturbed-1")
        assert version == "perturbed-1"
        after = eng.generate(PROMPTS, **greedy)
        assert set(after.df.weight_version) == {"perturbed-1"}
        assert after.record["weights_sha256"] == weights_sha256(changed) != before.record["weights_sha256"]
        assert after.record["weights_path"] == str(changed) and after.record["weight_versions"] == ["perturbed-1"]
        moved = [a != b for a, b in zip(before.id_lists("response"), after.id_lists("response"))]
        assert sum(moved) >= 3, f"greedy outputs changed for {sum(moved)} of {len(PROMPTS)} prompts"
        # The same tokens score differently under the new weights.
        assert not torch.allclose(eng.score(before).logprobs, before.logprobs, atol=1e-3)
        eng.update_weights_from_disk(model_path, weight_version="original")
        restored = eng.generate(PROMPTS, **greedy)
        assert restored.id_lists("response") == before.id_lists("response")
        # Logprobs to rounding: the server batches the call's requests as they arrive, and another
        # batch (other padding) moves float32 results by ~1e-6 on the CPU backend (seen in CI), bf16
        # results by more on SGLang.
        assert torch.allclose(restored.logprobs, before.logprobs, atol=1e-4 if BACKEND == "cpu" else 0.05)
        assert set(restored.df.weight_version) == {"original"}
        assert restored.record["weights_sha256"] == before.record["weights_sha256"]
        # paused(load=): leaving the block loads the checkpoint it wrote, once; the weights held
        # before may be gone by then (an RL loop deletes old checkpoints as it goes).
        previous = Path(shutil.copytree(changed, tmp_path / "previous"))
        eng.update_weights_from_disk(previous, weight_version="previous")
        with eng.paused(load=changed, weight_version="perturbed-2"):
            shutil.rmtree(previous)
        again = eng.generate(PROMPTS, **greedy)
        assert again.id_lists("response") == after.id_lists("response")
        assert set(again.df.weight_version) == {"perturbed-2"}
        # A block that raises brings the old weights back and does not load its checkpoint.
        with pytest.raises(RuntimeError, match="training failed"), eng.paused(load=tmp_path / "never-written"):
            raise RuntimeError("training failed")
        failed = eng.generate(PROMPTS, **greedy)
        assert failed.id_lists("response") == after.id_lists("response")
        assert set(failed.df.weight_version) == {"perturbed-2"}
