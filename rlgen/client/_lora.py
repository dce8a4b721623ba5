"""LoRA adapters as SGLang takes them: a PEFT directory or a PEFT model in memory, checked, hashed, as request bodies.

Owns: reading an adapter (a directory PEFT's `save_pretrained` wrote: `adapter_config.json` and
`adapter_model.safetensors`/`.bin`; or a `peft.PeftModel` in memory: its config as JSON and its
tensors under the names PEFT saves, `...q_proj.lora_A.weight`, through
`peft.get_peft_model_state_dict`), what the server checks before it loads one (rank within
`--max-lora-rank`, modules within `--lora-target-modules`, no DoRA), its content hash (the
completion cache's key and the rows' record: the same adapter loaded twice hashes the same, a
trained step does not), and the bodies of SGLang 0.5.17's `/load_lora_adapter` and
`/load_lora_adapter_from_tensors` (`LoadLoRAAdapterFromTensorsReqInput`: `config_dict`,
`serialized_named_tensors` one per TP rank, the tensors as a dict, by CUDA IPC or by value as
`client._tensors` serializes them). Knows nothing about servers, HTTP or Engines.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core._errors import AdapterError
from ._tensors import NamedTensor, Transport, serialized_per_rank

__all__ = ["AdapterSource", "from_directory", "from_peft_model", "from_tensors_body", "is_peft_model",
           "refusal"]

# What SGLang 0.5.17's `--lora-target-modules all` stands for on a Llama/Qwen-style model.
_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass(frozen=True)
class AdapterSource:
    """An adapter ready to send: from a directory (`path`) or from memory (`tensors`)."""

    config: dict[str, Any]               # adapter_config.json's content (JSON-safe)
    rank: int                            # the largest rank of its modules
    target_modules: tuple[str, ...]      # the module names it adapts
    sha256: str                          # the content hash of its tensors (and rank/alpha)
    path: str | None = None              # an absolute directory, or None (in memory)
    tensors: tuple[NamedTensor, ...] = ()  # (PEFT name, tensor), for an adapter in memory


def is_peft_model(obj: Any) -> bool:
    """A PEFT model (or anything that holds a PEFT config per adapter name, as PeftModel does)."""
    return isinstance(getattr(obj, "peft_config", None), Mapping)


def from_directory(path: str | os.PathLike[str]) -> AdapterSource:
    """An adapter directory as PEFT's `save_pretrained` writes it; AdapterError with what is missing."""
    root = Path(path).expanduser().resolve()
    config_file = root / "adapter_config.json"
    if not config_file.is_file():
        hint = (" (it holds a model, not an adapter: load it with update_weights_from_disk)"
                if (root / "config.json").is_file() else "")
        raise AdapterError(f"{str(root)!r} has no adapter_config.json{hint}: pass the directory a PEFT model's "
                           "save_pretrained() wrote, or the PEFT model itself")
    weights = next((root / f for f in _WEIGHT_FILES if (root / f).is_file()), None)
    if weights is None:
        raise AdapterError(f"{str(root)!r} has adapter_config.json but no {' or '.join(_WEIGHT_FILES)}")
    config = json.loads(config_file.read_text())
    digest = hashlib.sha256()
    digest.update(_config_material(config))
    with open(weights, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return AdapterSource(config=config, rank=_rank(config), target_modules=_targets(config),
                         sha256=digest.hexdigest(), path=str(root))


def from_peft_model(model: Any, *, adapter_name: str = "default") -> AdapterSource:
    """One adapter of a PEFT model in memory, under the names PEFT saves it (adapter name removed)."""
    configs = model.peft_config
    if adapter_name not in configs:
        raise AdapterError(f"this PEFT model has no adapter {adapter_name!r}; it has {sorted(configs)}: pass "
                           "adapter_name=")
    from peft import get_peft_model_state_dict  # the user's PEFT: only reached with a PEFT model in hand

    config = _json_safe(configs[adapter_name].to_dict())
    state = get_peft_model_state_dict(model, adapter_name=adapter_name)
    tensors = tuple((name, tensor.detach()) for name, tensor in state.items())
    if not tensors:
        raise AdapterError(f"adapter {adapter_name!r} of this PEFT model has no tensors")
    return AdapterSource(config=config, rank=_rank(config), target_modules=_targets(config),
                         sha256=_tensors_sha256(config, tensors), tensors=tensors)


def refusal(source: AdapterSource, *, max_rank: int | None, served_modules: Iterable[str] | None) -> str | None:
    """Why a server started with these LoRA settings would refuse the adapter (None: it takes it)."""
    config = source.config
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        return f"it is a {peft_type} adapter; SGLang serves LoRA adapters only"
    if config.get("use_dora"):
        return "it uses DoRA (use_dora=True), which SGLang does not serve: train it with use_dora=False"
    if config.get("modules_to_save"):
        return (f"it trains whole modules too (modules_to_save={config['modules_to_save']}), which an adapter server "
                "does not take: merge it and push the weights with update_weights(), or train without them")
    if max_rank is not None and source.rank > max_rank:
        return (f"its rank is {source.rank}, above the server's largest ({max_rank}): start the Engine with "
                f"lora={{'max_rank': {source.rank}}} (or more)")
    served = set(served_modules or ())
    if served and "all" not in served:
        missing = sorted(set(source.target_modules) - served)
        if missing:
            return (f"it adapts {missing}, which the server was not started for (target modules {sorted(served)}): "
                    f"start the Engine with lora={{'target_modules': {sorted(served | set(missing))}}} or 'all'")
    elif "all" in served:
        unknown = sorted(set(source.target_modules) - set(_ALL_LINEAR))
        if unknown:
            return f"it adapts {unknown}; SGLang's 'all' covers the linear layers {list(_ALL_LINEAR)} only"
    return None


def from_tensors_body(name: str, source: AdapterSource, *, transport: Transport, tp_size: int,
                      pinned: bool) -> dict[str, Any]:
    """The `/load_lora_adapter_from_tensors` body for an adapter in memory (serialized once per TP
    rank: build it again for a retry)."""
    tensors = dict(source.tensors)
    return {"lora_name": name, "config_dict": source.config, "pinned": pinned, "load_format": None,
            "serialized_named_tensors": serialized_per_rank(tensors, transport=transport, tp_size=tp_size)}


# ---- reading a config -------------------------------------------------------------------------------


def _rank(config: Mapping[str, Any]) -> int:
    ranks = [int(config.get("r", 8))]
    pattern = config.get("rank_pattern") or {}
    if isinstance(pattern, Mapping):
        ranks += [int(v) for v in pattern.values()]
    return max(ranks)


def _targets(config: Mapping[str, Any]) -> tuple[str, ...]:
    modules = config.get("target_modules") or ()
    if isinstance(modules, str):  # a regex, or PEFT's "all-linear"
        return _ALL_LINEAR if modules == "all-linear" else tuple(m for m in _ALL_LINEAR if m in modules)
    return tuple(sorted(str(m) for m in modules))


def _config_material(config: Mapping[str, Any]) -> bytes:
    """What of a config changes the adapter's outputs (its scaling and shape), for the hash."""
    keys = ("r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "target_modules")
    return json.dumps({k: config.get(k) for k in keys}, sort_keys=True, default=str).encode()


def _tensors_sha256(config: Mapping[str, Any], tensors: Sequence[NamedTensor]) -> str:
    """SHA-256 of the config's scaling and the tensors' names, dtypes, shapes and bytes (copied to the
    CPU one at a time: an adapter is small)."""
    digest = hashlib.sha256(_config_material(config))
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        cpu = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{cpu.dtype}|{tuple(cpu.shape)}|".encode())
        digest.update(cpu.view(-1).view(_uint8()).numpy().tobytes())
    return digest.hexdigest()


def _uint8() -> Any:
    import torch

    return torch.uint8


def _json_safe(value: Any) -> Any:
    """A PEFT config's `to_dict()` as JSON: sets as sorted lists, enums as their values."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_json_safe(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, enum.Enum):
        return _json_safe(value.value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
