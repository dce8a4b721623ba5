"""One PEFT LoRA adapter as the CPU backend reads it, and SGLang 0.5.17's rules for accepting it.

Owns: the LoRA settings of the server (`LoraSettings`: largest rank, target modules, adapters per
batch), SGLang's normalization of target-module names (`normalized_modules`: q/k/v_proj count as qkv_proj,
gate/up_proj as gate_up_proj, as `lora/utils.get_normalized_target_modules`), reading an adapter
(adapter_config.json and adapter_model.safetensors or .bin, as PEFT's `save_pretrained` writes
them, without importing peft; or tensors sent by value in a /load_lora_adapter_from_tensors body),
the checks an adapter must pass with SGLang's messages (`check_adapter`, from
`lora_manager.validate_new_adapter` and `mem_pool.can_support`) and the CPU backend's refusals of
what it does not compute, the per-module weights and scaling PEFT would apply (`module_weights`),
and SGLang's `LoRAUpdateOutput` body. Knows nothing about the model's forward pass, the batch, the
scheduler thread or HTTP: `_lora` applies the weights, the registry in `_lora_api` names them.

Scaling is PEFT's: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora, per module through
rank_pattern and alpha_pattern. SGLang 0.5.17 applies lora_alpha / r to every module whatever the
config says (`lora/lora.py`, `LoRAAdapter.__init__`), so it computes other outputs than PEFT for
rslora or pattern adapters (docs/sglang-api.md, section 7).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlgen.cpu_server._lora_flags import LoraRef
from rlgen.cpu_server._tensors import decode_payload, named_tensors

__all__ = [
    "SUPPORTED_MODULES", "TENSOR_PATH", "AdapterWeights", "LoraSettings", "check_adapter", "module_weights",
    "normalized_modules", "payload_tensors", "read_adapter_dir", "served_leaves", "update_output",
]  # fmt: skip

# The linear layers the CPU backend can put LoRA on (what `--lora-target-modules all` means here).
SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# SGLang's get_normalized_target_modules mapping (lora/utils.py); other names map to themselves.
_NORMALIZED = {
    "q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj", "out_proj": "out_proj", "embed_tokens": "embed_tokens", "vocab_emb": "embed_tokens",
    "embeddings": "embed_tokens", "word_embeddings": "embed_tokens", "lm_head": "lm_head", "output": "lm_head",
    "unembed_tokens": "lm_head", "q_a_proj": "fused_qkv_a_proj_with_mqa",
    "kv_a_proj_with_mqa": "fused_qkv_a_proj_with_mqa", "wq_b": "indexer.wq_b", "wk": "indexer.wk",
    "weights_proj": "indexer.weights_proj",
}  # fmt: skip
# The linear layers a normalized name stands for on the CPU (SGLang stacks each group into one layer).
_LEAVES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",), "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}  # fmt: skip
_EMBEDDINGS = {"embed_tokens", "lm_head"}
# `lora_path` of an adapter loaded from tensors (io_struct.LoadLoRAAdapterFromTensorsReqInput.to_ref).
TENSOR_PATH = "__tensor__"
_TENSOR_NAME = re.compile(r"(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight")


@dataclass(frozen=True)
class LoraSettings:
    """The server's LoRA limits: `target_modules` normalized as SGLang normalizes them."""

    max_lora_rank: int
    target_modules: frozenset[str]
    max_loras_per_batch: int = 8


def normalized_modules(target_modules: Any) -> set[str]:
    """SGLang's get_normalized_target_modules: {"all"} for PEFT's shorthands, else each name's
    last component mapped (q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj)."""
    if isinstance(target_modules, str):
        if target_modules not in ("all", "all-linear"):
            raise ValueError("Only 'all' or 'all-linear' can be used as the string for target module")
        return {"all"}
    names = {str(name).split(".")[-1] for name in target_modules}
    return {_NORMALIZED.get(name, name) for name in names}


def served_leaves(normalized: set[str] | frozenset[str]) -> tuple[str, ...]:
    """The linear layers (leaf names) that carry LoRA for a server's normalized target modules."""
    if "all" in normalized:
        return SUPPORTED_MODULES
    unsupported = sorted(normalized - set(_LEAVES))
    if unsupported:
        raise ValueError(f"--lora-target-modules {unsupported} are not served by the rlgen CPU backend; it puts LoRA "
                         f"on {', '.join(SUPPORTED_MODULES)} (or `all` of them)")  # fmt: skip
    return tuple(leaf for leaf in SUPPORTED_MODULES if any(leaf in _LEAVES[n] for n in normalized))


# ---- reading an adapter ---------------------------------------------------------------------------------


def read_adapter_dir(path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, int] | None]:
    """A PEFT adapter directory: (adapter_config.json, its tensors by name, added_tokens.json or None)."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"LoRA adapter path {path} is not a directory: the rlgen CPU backend loads adapters from a "
                         "local PEFT directory only (no Hugging Face Hub downloads)")  # fmt: skip
    config = json.loads((folder / "adapter_config.json").read_text())
    added_file = folder / "added_tokens.json"
    added = json.loads(added_file.read_text()) if added_file.exists() else None
    if (folder / "adapter_model.safetensors").exists():
        from safetensors.torch import load_file

        return config, load_file(str(folder / "adapter_model.safetensors")), added
    if (folder / "adapter_model.bin").exists():
        return config, torch.load(folder / "adapter_model.bin", map_location="cpu", weights_only=True), added
    raise ValueError(f"LoRA adapter path {path} has no adapter_model.safetensors or adapter_model.bin")


def payload_tensors(entry: str, load_format: str | None, expected_checksums: dict[str, str] | None) -> dict[str, torch.Tensor]:
    """The tensors of one rank's `serialized_named_tensors` entry, as SGLang's
    tp_worker.load_lora_adapter_from_tensors reads it: a dict {name: tensor}, or a flattened
    bucket; the sha256 of each tensor's bytes checked against `expected_checksums` if given."""
    payload = decode_payload(entry)
    if load_format == "flattened_bucket":
        tensors = dict(named_tensors(payload, load_format))
    elif isinstance(payload, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in payload.items()):
        tensors = payload
    else:
        raise ValueError(f"the LoRA payload is a dict {{name: tensor}} (or a flattened bucket), not a {type(payload).__name__}")
    if expected_checksums is not None:
        _check_sums(tensors, expected_checksums)
    return tensors


def _check_sums(tensors: dict[str, torch.Tensor], expected: dict[str, str]) -> None:
    def digest(t: torch.Tensor) -> str:
        return hashlib.sha256(t.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes()).hexdigest()

    missing = [name for name in expected if name not in tensors]
    mismatch = [name for name, want in expected.items() if name in tensors and digest(tensors[name]) != want]
    extra = [name for name in tensors if name not in expected]
    if mismatch or missing or extra:  # SGLang's text (its scheduler raises it)
        raise ValueError(f"[LORA-CHECK] rank0 adapter sync MISMATCH of {len(expected)} expected: "
                         f"{len(mismatch)} value-diff {mismatch[:5]}, {len(missing)} missing {missing[:5]}, "
                         f"{len(extra)} extra {extra[:5]}")  # fmt: skip


# ---- checks ------------------------------------------------------------------------------------------------


def check_adapter(
    config: dict[str, Any], ref: LoraRef, settings: LoraSettings, *, added_tokens: dict[str, int] | None,
    vocab_size: int, loaded: list[LoraRef], max_loras_per_batch: int,
) -> None:
    """SGLang's LoRAConfig + validate_new_adapter, in its order and with its messages, then what the
    CPU backend refuses. Raises ValueError (KeyError for a config without r, lora_alpha or
    target_modules, as SGLang's LoRAConfig does)."""
    target_modules, rank = config["target_modules"], config["r"]
    _ = config["lora_alpha"]  # a KeyError when absent, as in SGLang's LoRAConfig
    name = ref.lora_name
    if any(token_id >= vocab_size for token_id in (added_tokens or {}).values()):
        raise ValueError(f"Failed to load {name} because LoRA serving currently doesn't support adapters that add "
                         "tokens to the vocabulary")  # fmt: skip
    if config.get("use_dora", False):
        raise ValueError(f"Failed to load {name} because LoRA serving currently doesn't support DoRA adapters")
    if any(other.lora_name == name for other in loaded):
        raise ValueError(f"Failed to load LoRA adapter {name} because it is already loaded")
    adapter_modules = normalized_modules(target_modules)
    if adapter_modules & _EMBEDDINGS:
        raise ValueError(f"LoRA adapter {name} targets {sorted(adapter_modules & _EMBEDDINGS)}: the rlgen CPU backend "
                         f"serves LoRA on linear layers only ({', '.join(SUPPORTED_MODULES)})")  # fmt: skip
    max_rank = max([rank, *config.get("rank_pattern", {}).values()])
    fits_modules = "all" in adapter_modules or adapter_modules <= settings.target_modules or "all" in settings.target_modules
    if max_rank > settings.max_lora_rank or not fits_modules:
        raise ValueError(
            f"LoRA adapter {name} with rank {max_rank} is incompatible with the current LoRA memory pool "
            "configuration. Please ensure that the LoRA adapter's rank is within the configured `--max-lora-rank` "
            "and that the target modules are included in `--lora-target-modules`."
        )
    if ref.pinned and sum(other.pinned for other in loaded) >= max_loras_per_batch - 1:
        raise ValueError(
            f"Failed to load LoRA adapter {name} as a pinned adapter. It is not allowed to pin all slots in the LoRA "
            "memory pool to avoid starvation for unpinned adapters and base models. Please increase your "
            "`--max-loras-per-batch` or load it as unpinned LoRA adapters."
        )
    _check_computable(config, name)


def _check_computable(config: dict[str, Any], name: str) -> None:
    """What PEFT would compute and the CPU backend does not: refused, naming the config field."""
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"LoRA adapter {name} has peft_type={config.get('peft_type')!r}; only LORA adapters load")
    refused = {
        "bias": config.get("bias", "none") != "none", "lora_bias": bool(config.get("lora_bias")),
        "modules_to_save": bool(config.get("modules_to_save")), "fan_in_fan_out": bool(config.get("fan_in_fan_out")),
        "trainable_token_indices": bool(config.get("trainable_token_indices")),
        "target_parameters": bool(config.get("target_parameters")), "use_qalora": bool(config.get("use_qalora")),
        "layer_replication": bool(config.get("layer_replication")), "alora_invocation_tokens": bool(config.get("alora_invocation_tokens")),
    }  # fmt: skip
    fields = [field for field, bad in refused.items() if bad]
    if fields:
        shown = ", ".join(f"{field}={config.get(field)!r}" for field in fields)
        raise ValueError(f"LoRA adapter {name} has {shown}: not supported by the rlgen CPU backend")


# ---- weights -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdapterWeights:
    """One module's LoRA: y += ((x @ a.T) @ b.T) * scaling."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scaling: float


def module_weights(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], linears: dict[str, torch.nn.Linear], name: str
) -> dict[str, AdapterWeights]:
    """Per served module path (a key of `linears`), its A, B and PEFT's scaling.

    Tensor names are PEFT's (`base_model.model.<module>.lora_A[.<adapter>].weight`). A tensor for
    a module the server does not serve, a missing half of a pair, or a shape that does not fit the
    module is refused (ValueError).
    """
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for tensor_name, tensor in tensors.items():
        match = _TENSOR_NAME.fullmatch(tensor_name)
        if match is None:
            raise ValueError(f"LoRA adapter {name}: tensor {tensor_name} is not a PEFT lora_A/lora_B weight")
        module = match["module"]
        if module not in linears:
            raise ValueError(f"LoRA adapter {name}: tensor {tensor_name} is for {module}, which this server does not "
                             "put LoRA on (see --lora-target-modules)")  # fmt: skip
        pairs.setdefault(module, {})[match["part"]] = tensor
    out: dict[str, AdapterWeights] = {}
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {name}: {module} has lora_{''.join(pair)} without its pair")
        a, b = pair["A"].to(torch.float32).contiguous(), pair["B"].to(torch.float32).contiguous()
        rank, alpha = _rank_and_alpha(config, module)
        linear = linears[module]
        if a.shape != (rank, linear.in_features) or b.shape != (linear.out_features, rank):
            raise ValueError(f"LoRA adapter {name}: {module} has lora_A {list(a.shape)} and lora_B {list(b.shape)}; "
                             f"rank {rank} on this layer needs [{rank}, {linear.in_features}] and "
                             f"[{linear.out_features}, {rank}]")  # fmt: skip
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        out[module] = AdapterWeights(a, b, scaling)
    return out


def _rank_and_alpha(config: dict[str, Any], module: str) -> tuple[int, float]:
    """PEFT's per-module rank and alpha: the first rank_pattern / alpha_pattern key that matches
    the module path's end (peft.utils.other.get_pattern_key), else r and lora_alpha."""

    def pattern(table: dict[str, Any], default: Any) -> Any:
        for key, value in table.items():
            if re.match(rf"(.*\.)?({key})$", module):
                return value
        return default

    return int(pattern(config.get("rank_pattern") or {}, config["r"])), float(
        pattern(config.get("alpha_pattern") or {}, config["lora_alpha"]))


def update_output(success: bool, error_message: str | None, loaded_adapters: dict[str, str] | None) -> dict[str, Any]:
    """SGLang's LoRAUpdateOutput as its route serializes it (msgspec_to_builtins: BaseReq's rid and
    http_worker_ipc first)."""
    return {"rid": None, "http_worker_ipc": None, "success": success, "error_message": error_message,
            "loaded_adapters": loaded_adapters}  # fmt: skip
