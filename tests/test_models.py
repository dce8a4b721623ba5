"""rlgen.server._models: the default model's conversion and cache, and user-given checkout paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rlgen
from rlgen.server._models import _COMPLETE_MARKER, default_model_path, resolve_model


def test_default_model_resolves_to_a_complete_hf_checkout(model_path: str) -> None:
    resolved = resolve_model(None)
    path = Path(resolved.path)
    assert resolved.name == rlgen.DEFAULT_MODEL
    assert (path / _COMPLETE_MARKER).is_file()
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert config["torch_dtype" if "torch_dtype" in config else "dtype"] == "bfloat16"
    assert list(path.glob("*.safetensors"))
    assert (path / "tokenizer.json").is_file()


def test_default_model_has_a_chat_template_and_the_im_end_eos(model_path: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model("default").path)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2


def test_default_model_is_converted_once_and_reused(model_path: str) -> None:
    first = default_model_path()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert default_model_path() == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_interrupted_conversion_leaves_no_half_written_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlgen.server._models as models

    monkeypatch.setenv("RLGEN_CACHE_DIR", str(tmp_path))

    def interrupted(gguf_dir: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")  # half of a checkout...
        raise KeyboardInterrupt  # ...then Ctrl-C

    monkeypatch.setattr(models, "_convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        default_model_path()
    leftovers = list((tmp_path / "models").iterdir())
    assert [p.name for p in leftovers if not p.name.endswith(".lock")] == []


def test_a_missing_model_path_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(rlgen.ModelError, match=r"does not exist.*local Hugging Face checkout"):
        resolve_model(tmp_path / "nope")


def test_a_directory_without_weights_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(rlgen.ModelError, match=r"missing weights .*tokenizer"):
        resolve_model(tmp_path)


def test_a_local_checkout_path_is_accepted_as_is(model_path: str) -> None:
    resolved = resolve_model(Path(model_path))
    assert resolved.path == str(Path(model_path).resolve())


def test_a_non_path_model_argument_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="model must be a path"):
        resolve_model(123)  # type: ignore[arg-type]


def test_the_default_model_can_point_at_a_ready_checkout(model_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLGEN_DEFAULT_MODEL", model_path)
    resolved = resolve_model(None)
    assert resolved.path == str(Path(model_path).resolve()) and resolved.name == rlgen.DEFAULT_MODEL
    monkeypatch.setenv("RLGEN_DEFAULT_MODEL", "/nonexistent/checkout")
    with pytest.raises(rlgen.ModelError):
        resolve_model(None)
