"""LoRA adapters on the client side, without a server: reading an adapter (a PEFT directory, a PEFT
model in memory), the checks the server would make, content hashes, the request body, the
`adapter=` and `lora=` options and the server flags they become."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from rlgen.client import _lora
from rlgen.client._tensors import Transport
from rlgen.core import _options
from rlgen.core._errors import AdapterError
from rlgen.server._command import lora_flags, server_argv

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")


def tiny_peft_model(*, r: int = 4, targets: tuple[str, ...] = ("q_proj", "v_proj"), seed: int = 0, **config: Any) -> Any:
    """A two-layer Llama with a LoRA adapter whose B is not zero (so the adapter changes outputs)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2))
    lora = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(targets), init_lora_weights=False, **config)
    return peft.get_peft_model(base, lora)


def test_an_adapter_in_memory_travels_under_the_names_peft_saves_it(tmp_path: Path) -> None:
    model = tiny_peft_model()
    source = _lora.from_peft_model(model)
    model.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "adapter_model.safetensors")
    assert sorted(n for n, _ in source.tensors) == sorted(saved)
    assert all(torch.equal(t.cpu(), saved[n]) for n, t in source.tensors)
    assert source.rank == 4 and source.target_modules == ("q_proj", "v_proj") and source.path is None
    json.dumps(source.config)  # JSON-safe: sets and enums of PEFT's config converted
    assert source.config["target_modules"] == ["q_proj", "v_proj"]


def test_a_directory_adapter_is_read_from_its_config_and_hashed_from_its_file(tmp_path: Path) -> None:
    tiny_peft_model(r=8).save_pretrained(tmp_path)
    source = _lora.from_directory(tmp_path)
    assert source.path == str(tmp_path.resolve()) and source.rank == 8 and source.tensors == ()
    assert source.target_modules == ("q_proj", "v_proj")


def test_a_directory_without_an_adapter_says_what_to_pass(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(AdapterError, match="holds a model, not an adapter"):
        _lora.from_directory(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(AdapterError, match=r"adapter_model\.safetensors"):
        _lora.from_directory(tmp_path)


def test_the_content_hash_follows_the_tensors_and_the_scaling(tmp_path: Path) -> None:
    a, same, other = tiny_peft_model(seed=0), tiny_peft_model(seed=0), tiny_peft_model(seed=1)
    assert _lora.from_peft_model(a).sha256 == _lora.from_peft_model(same).sha256
    assert _lora.from_peft_model(a).sha256 != _lora.from_peft_model(other).sha256
    with torch.no_grad():  # one training step's worth of change in one tensor
        next(p for n, p in a.named_parameters() if "lora_B" in n).add_(1e-3)
    assert _lora.from_peft_model(a).sha256 != _lora.from_peft_model(same).sha256
    a.peft_config["default"].lora_alpha = 99  # same tensors, another scaling
    assert _lora.from_peft_model(a).sha256 != _lora.from_peft_model(same).sha256
    for i, model in enumerate((same, same)):
        model.save_pretrained(tmp_path / str(i))
    assert _lora.from_directory(tmp_path / "0").sha256 == _lora.from_directory(tmp_path / "1").sha256


def test_the_server_would_refuse_rank_modules_and_dora_and_the_message_says_what_to_start_with() -> None:
    source = _lora.from_peft_model(tiny_peft_model(r=8))
    assert _lora.refusal(source, max_rank=8, served_modules=["q_proj", "v_proj"]) is None
    assert _lora.refusal(source, max_rank=8, served_modules=["all"]) is None
    assert "lora={'max_rank': 8}" in str(_lora.refusal(source, max_rank=4, served_modules=["all"]))
    assert "'v_proj'" in str(_lora.refusal(source, max_rank=8, served_modules=["q_proj"]))
    dora = _lora.from_peft_model(tiny_peft_model(use_dora=True))
    assert "DoRA" in str(_lora.refusal(dora, max_rank=16, served_modules=["all"]))


def test_a_peft_model_without_the_named_adapter_lists_the_ones_it_has() -> None:
    with pytest.raises(AdapterError, match=r"no adapter 'policy'.*\['default'\]"):
        _lora.from_peft_model(tiny_peft_model(), adapter_name="policy")


def test_the_load_from_tensors_body_is_what_sglang_reads_a_dict_of_tensors_per_tp_rank() -> None:
    source = _lora.from_peft_model(tiny_peft_model())
    body = _lora.from_tensors_body("step1", source, transport=Transport.VALUE, tp_size=2, pinned=False)
    assert body["lora_name"] == "step1" and body["load_format"] is None and body["config_dict"] == source.config
    assert len(body["serialized_named_tensors"]) == 2
    tensors = pickle.loads(base64.b64decode(body["serialized_named_tensors"][0]))
    assert isinstance(tensors, dict) and sorted(tensors) == sorted(n for n, _ in source.tensors)


def test_the_adapter_option_takes_one_name_or_one_per_prompt() -> None:
    assert _options.adapters_per_prompt(None, 3) is None
    assert _options.adapters_per_prompt("a", 2) == ["a", "a"]
    assert _options.adapters_per_prompt((None, "a"), 2) == [None, "a"]
    assert _options.adapters_per_prompt((None, None), 2) is None
    with pytest.raises(ValueError, match="one per prompt"):
        _options.adapters_per_prompt(("a",), 2)
    with pytest.raises(TypeError, match="adapter names or None"):
        _options.resolve(_options.GenerateOptions, {"adapter": ["a", 3]})
    with pytest.raises(ValueError, match="non-empty"):
        _options.resolve(_options.GenerateOptions, {"adapter": ""})


def test_lora_options_become_sglangs_flags_on_both_backends() -> None:
    assert _options.lora_options(None) is None and _options.lora_options(False) is None
    assert lora_flags(_options.lora_options(True)) == [
        "--enable-lora", "--max-lora-rank", "16", "--lora-target-modules", "all", "--max-loras-per-batch", "8"]
    lora = _options.lora_options({"max_rank": 8, "target_modules": ["q_proj", "v_proj"], "adapters": {"a": "/x/a"}})
    flags = lora_flags(lora)
    assert flags[flags.index("--lora-target-modules") + 1:][:2] == ["q_proj", "v_proj"]
    assert flags[-2:] == ["--lora-paths", "a=/x/a"]
    for backend in ("cpu", "sglang"):
        argv = server_argv(backend, "/m", gpu_memory_fraction=0.2, fast_start=False, enable_memory_saver=False,
                           enable_metrics=False, server_args=None, lora=lora)
        assert "--enable-lora" in argv
    with pytest.raises(TypeError, match="did you mean 'max_rank'"):
        _options.lora_options({"max_ranks": 8})
    with pytest.raises(ValueError, match="'all' stands alone"):
        _options.lora_options({"target_modules": ["all", "q_proj"]})
