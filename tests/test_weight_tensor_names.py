"""Weights pushed from tensors, without a server: a trainer's names under the checkpoint's
(wrappers, PEFT, tied head), the checks against the served checkpoint, buckets, and the request
bodies as the CPU backend and SGLang read them (SafeUnpickler's allow-list, both load formats)."""

from __future__ import annotations

import base64
import io
import pickle
from pathlib import Path

import pytest
import torch

from rlgen import WeightsError
from rlgen.client._state_dict import checked_weights
from rlgen.client._tensors import Transport, _ipc_dumps, bucket_body, buckets
from rlgen.cpu_server._tensors import TensorPayloadError, decode_payload, load_named_tensors, named_tensors
from rlgen.server._weights import checkpoint_tensors, ties_word_embeddings

pytestmark = pytest.mark.timeout(60)

CHECKPOINT = {
    "model.embed_tokens.weight": ((10, 4), "BF16"),
    "model.layers.0.self_attn.q_proj.weight": ((4, 4), "BF16"),
    "model.layers.0.input_layernorm.weight": ((4,), "BF16"),
    "model.norm.weight": ((4,), "BF16"),
}


def _full() -> dict[str, torch.Tensor]:
    return {name: torch.randn(shape) for name, (shape, _) in CHECKPOINT.items()}


def test_a_plain_state_dict_keeps_its_names_and_covers_the_checkpoint() -> None:
    checked = checked_weights(_full(), checkpoint=CHECKPOINT, tied=True)
    assert [n for n, _ in checked.tensors] == list(CHECKPOINT) and checked.complete and not checked.dropped
    part = checked_weights({"model.norm.weight": torch.ones(4)}, checkpoint=CHECKPOINT, tied=True)
    assert not part.complete and [n for n, _ in part.tensors] == ["model.norm.weight"]


def test_wrapper_prefixes_and_peft_names_map_to_the_checkpoint_names() -> None:
    full = _full()
    wrapped = {
        "_orig_mod.module.model.embed_tokens.weight": full["model.embed_tokens.weight"],
        "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight": full["model.layers.0.self_attn.q_proj.weight"],
        "base_model.model.model.layers.0.input_layernorm.weight": full["model.layers.0.input_layernorm.weight"],
        "base_model.model.model.norm.modules_to_save.default.weight": full["model.norm.weight"],
        "base_model.model.model.norm.original_module.weight": torch.zeros(4),
        "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(2),
    }
    checked = checked_weights(wrapped, checkpoint=CHECKPOINT, tied=True)
    assert dict(checked.tensors).keys() == full.keys() and checked.complete
    assert torch.equal(dict(checked.tensors)["model.norm.weight"], full["model.norm.weight"])


def test_unmerged_lora_is_refused_with_what_to_do_and_a_merged_peft_model_drops_it() -> None:
    lora = {**_full(), "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight": torch.zeros(2, 4)}
    with pytest.raises(WeightsError, match=r"LoRA tensors not merged.*merge_adapter\(\)"):
        checked_weights(lora, checkpoint=CHECKPOINT, tied=True)

    class Lora(torch.nn.Module):  # a PEFT LoRA layer as far as the check looks: lora_A and `merged`
        def __init__(self, merged: bool) -> None:
            super().__init__()
            self.base_layer = torch.nn.Linear(4, 4, bias=False)
            self.lora_A = torch.nn.ModuleDict({"default": torch.nn.Linear(4, 2, bias=False)})
            self.merged = merged

    for merged in (False, True):
        model = torch.nn.Module()
        model.q_proj = Lora(merged)
        if merged:
            checked = checked_weights(model, checkpoint=None, tied=None)
            assert [n for n, _ in checked.tensors] == ["q_proj.weight"]
            assert checked.dropped == ["q_proj.lora_A.default.weight"]
        else:
            with pytest.raises(WeightsError, match="not merged"):
                checked_weights(model, checkpoint=None, tied=None)


def test_a_tied_head_is_not_sent_and_an_untied_one_for_a_tied_server_is_refused() -> None:
    full = _full()
    tied = {**full, "lm_head.weight": full["model.embed_tokens.weight"]}   # one tensor under two names
    checked = checked_weights(tied, checkpoint=CHECKPOINT, tied=True)
    assert "lm_head.weight" not in dict(checked.tensors) and checked.dropped == ["lm_head.weight"]
    # tied unknown (no config): the checkpoint without lm_head.weight, or shared storage, says so
    assert "lm_head.weight" not in dict(checked_weights(tied, checkpoint=None, tied=None).tensors)
    untied = {**full, "lm_head.weight": torch.randn(10, 4)}
    with pytest.raises(WeightsError, match=r"ties its LM head.*tie_weights\(\)"):
        checked_weights(untied, checkpoint=CHECKPOINT, tied=True)
    with_head = {**CHECKPOINT, "lm_head.weight": ((10, 4), "BF16")}
    assert "lm_head.weight" in dict(checked_weights(untied, checkpoint=with_head, tied=False).tensors)


def test_unknown_names_and_other_shapes_are_refused_before_sending() -> None:
    with pytest.raises(WeightsError, match=r"does not have: 'model.layers.0.self_attn.q_proj.weigth' \(did you mean "
                                           r"'model.layers.0.self_attn.q_proj.weight'\?\).*Nothing was sent"):
        checked_weights({"model.layers.0.self_attn.q_proj.weigth": torch.ones(4, 4)}, checkpoint=CHECKPOINT, tied=True)
    with pytest.raises(WeightsError, match=r"'model.norm.weight' is \[5\], the server's is \[4\]"):
        checked_weights({"model.norm.weight": torch.ones(5)}, checkpoint=CHECKPOINT, tied=True)
    with pytest.raises(WeightsError, match="no weights to send"):
        checked_weights({}, checkpoint=CHECKPOINT, tied=True)
    with pytest.raises(WeightsError, match="takes a torch module"):
        checked_weights(3, checkpoint=CHECKPOINT, tied=True)
    with pytest.raises(WeightsError, match=r"\(name, tensor\) pairs"):
        checked_weights([("model.norm.weight", [1.0, 2.0])], checkpoint=CHECKPOINT, tied=True)


def test_buckets_bound_their_bytes_and_a_large_tensor_goes_alone() -> None:
    named = [("a", torch.zeros(10)), ("b", torch.zeros(10)), ("c", torch.zeros(100)), ("d", torch.zeros(5))]
    assert [[n for n, _ in b] for b in buckets(named, 80)] == [["a", "b"], ["c"], ["d"]]
    assert [[n for n, _ in b] for b in buckets(named, 10_000)] == [["a", "b", "c", "d"]]


@pytest.mark.parametrize("flatten", [False, True])
def test_a_by_value_body_is_sglangs_request_and_decodes_to_the_same_tensors(flatten: bool) -> None:
    big = torch.arange(4000, dtype=torch.float32).reshape(1000, 4)   # 16 kB
    named = [("x", big[1:3]), ("y", torch.tensor([1.5, 2.5], dtype=torch.bfloat16))]   # a view of it: 32 bytes
    body = bucket_body(named, transport=Transport.VALUE, flatten=flatten, tp_size=2, flush_cache=False,
                       weight_version="v")
    assert body.keys() == {"serialized_named_tensors", "load_format", "flush_cache", "weight_version"}
    assert body["load_format"] == ("flattened_bucket" if flatten else None) and body["flush_cache"] is False
    assert len(body["serialized_named_tensors"]) == 2 and all(isinstance(s, str) for s in body["serialized_named_tensors"])
    # by value: only the view's own bytes travel, not its storage
    assert len(base64.b64decode(body["serialized_named_tensors"][0])) < 2000
    decoded = named_tensors(decode_payload(body["serialized_named_tensors"][0]), body["load_format"])
    assert [n for n, _ in decoded] == ["x", "y"]
    assert torch.equal(decoded[0][1], big[1:3]) and decoded[1][1].dtype == torch.bfloat16
    assert torch.equal(decoded[1][1], named[1][1])


def test_the_cpu_backend_unpickles_only_what_sglangs_safe_unpickler_allows() -> None:
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            import os

            return os.system, ("true",)

    entry = base64.b64encode(pickle.dumps([("x", Evil())])).decode()
    with pytest.raises(TensorPayloadError, match="Blocked unsafe class loading"):
        decode_payload(entry)
    with pytest.raises(TensorPayloadError, match="not base64"):
        decode_payload("not base64 !")
    with pytest.raises(TensorPayloadError, match="Unknown load_format"):
        named_tensors([], "safetensors")
    with pytest.raises(TensorPayloadError, match=r"list of \(name, tensor\) pairs"):
        named_tensors({"x": 1}, None)


def test_ipc_serialization_refuses_cpu_tensors() -> None:
    # CUDA IPC needs CUDA tensors: ForkingPickler would send a CPU tensor as a file descriptor
    with pytest.raises(ValueError, match="CUDA tensors only"):
        _ipc_dumps([("x", torch.zeros(2))])


def test_loading_by_name_skips_unknown_names_like_sglang_and_refuses_other_shapes(
        caplog: pytest.LogCaptureFixture) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    norm = model.model.norm.weight
    ok, message = load_named_tensors(model, [("model.norm.weight", torch.full((8,), 2.0)), ("nope.weight", torch.ones(1)),
                                             ("lm_head.weight", torch.zeros(16, 8))])
    assert (ok, message) == (True, "Success") and torch.equal(norm, torch.full((8,), 2.0))
    assert "Parameter nope.weight not found in params_dict" in caplog.text
    assert not torch.equal(model.lm_head.weight, torch.zeros(16, 8))   # tied: the head is the embedding
    ok, message = load_named_tensors(model, [("model.norm.weight", torch.zeros(8)), ("model.embed_tokens.weight",
                                                                                      torch.zeros(3, 8))])
    assert not ok and "shape mismatch for model.embed_tokens.weight" in message
    assert torch.equal(norm, torch.full((8,), 2.0))   # checked before any copy


def test_checkpoint_tensors_read_the_safetensors_headers(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"a.weight": torch.zeros(2, 3, dtype=torch.bfloat16)}, str(tmp_path / "model-1.safetensors"))
    save_file({"b.bias": torch.zeros(4)}, str(tmp_path / "model-2.safetensors"))
    (tmp_path / "config.json").write_text('{"text_config": {"tie_word_embeddings": false}}')
    assert checkpoint_tensors(tmp_path) == {"a.weight": ((2, 3), "BF16"), "b.bias": ((4,), "F32")}
    assert ties_word_embeddings(tmp_path) is False
    assert checkpoint_tensors(tmp_path / "missing") is None and ties_word_embeddings(tmp_path / "missing") is None
    (tmp_path / "model-3.safetensors").write_bytes(b"\x00" * 4)
    assert checkpoint_tensors(tmp_path) is None


def test_flattened_metadata_travels_as_allowed_classes() -> None:
    """SGLang's SafeUnpickler allows `types.` and `torch.` classes: the flattened bucket's metadata
    (SimpleNamespace, torch.Size, torch.dtype) needs nothing else."""
    body = bucket_body([("x", torch.ones(2, 2))], transport=Transport.VALUE, flatten=True, tp_size=1,
                       flush_cache=True, weight_version=None)
    raw = base64.b64decode(body["serialized_named_tensors"][0])
    classes = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            classes.add(module)
            return super().find_class(module, name)

    Recorder(io.BytesIO(raw)).load()
    assert classes and all(m.split(".")[0] in {"torch", "types", "collections", "builtins"} for m in classes), classes
