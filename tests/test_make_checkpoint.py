"""bench/make_checkpoint.py: random-weight checkpoints of real architectures with the default
tokenizer, offline; the CPU backend serves them (the GPU runs the real sizes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import rlgen

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import make_checkpoint  # noqa: E402


def test_the_real_shapes_have_the_parameter_counts_the_docstring_states() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rlgen.resolve_model(None).path)
    counts = {}
    for shape in ("llama-1.7b", "llama-7b", "qwen-1.5b", "qwen-7b"):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(make_checkpoint.config_for(shape, tok))
        counts[shape] = round(sum(p.numel() for p in model.parameters()) / 1e9, 2)
        assert f"{counts[shape]:.2f}B" in make_checkpoint.__doc__, (shape, counts[shape])
    assert counts["llama-1.7b"] == 1.71 and counts["llama-7b"] == 6.88


def test_tied_and_untied_shapes_write_what_their_config_says(tmp_path: Path) -> None:
    path = rlgen.resolve_model(None).path
    for shape, tied in (("tiny-qwen", True), ("tiny-qwen-untied", False)):
        record = make_checkpoint.make(shape, tmp_path / shape, tokenizer_path=path)
        config = json.loads((tmp_path / shape / "config.json").read_text())
        assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is tied and record["tied_embeddings"] is tied
        assert config["vocab_size"] == 49152 and (tmp_path / shape / "tokenizer.json").exists()
    # untied: the output matrix is its own (vocab x hidden more parameters)
    untied = json.loads((tmp_path / "tiny-qwen-untied" / "rlgen_checkpoint.json").read_text())["parameters"]
    tied = json.loads((tmp_path / "tiny-qwen" / "rlgen_checkpoint.json").read_text())["parameters"]
    assert untied - tied == 49152 * 64


@pytest.mark.timeout(240)
def test_the_script_writes_a_checkpoint_the_cpu_backend_serves(tmp_path: Path) -> None:
    out = tmp_path / "tiny-llama"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "make_checkpoint.py"), "--shape", "tiny-llama",
                           "--out", str(out)], capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "tiny-llama: LlamaForCausalLM" in done.stdout
    record = json.loads((out / "rlgen_checkpoint.json").read_text())
    assert record["shape"] == "tiny-llama" and "environment" in record
    with rlgen.Engine(str(out), backend="cpu", progress=False) as eng:
        scored = eng.score([[{"role": "user", "content": "Hi"}]], ["Hello there"])
        assert scored.df.logprob_sum.notna().all() and scored.df.completion_tokens[0] >= 2
