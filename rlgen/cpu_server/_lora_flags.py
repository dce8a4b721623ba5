"""SGLang 0.5.17's LoRA flags on the CPU backend's command line, and the reference to one adapter.

Owns: the LoRA arguments (`add_lora_arguments`: SGLang's names, defaults and choices, and its
`LoRAPathAction` for --lora-paths: `NAME=PATH`, `PATH`, or JSON {"lora_name", "lora_path",
"pinned"}), SGLang's `check_lora_server_args` (--lora-paths turns LoRA on, the assertions and their
texts, the adapters of --lora-paths as refs with SGLang's deterministic ids), the LoRA fields of
/server_info as SGLang's ServerArgs shows them, and `LoraRef` (SGLang's LoRARef). Read from
`server_args.py`, `arg_groups/argparse_actions.py` and `lora/lora_registry.py`. Knows nothing
about models, tensors or HTTP, and imports neither torch nor transformers: the flags are checked
before anything heavy loads, as SGLang checks its ServerArgs first.
"""

from __future__ import annotations

import argparse
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LoraRef", "add_lora_arguments", "check_lora_args", "lora_server_args"]

logger = logging.getLogger("rlgen.cpu_server")

# SGLang's SUPPORTED_LORA_TARGET_MODULES (utils/common.py): the choices of --lora-target-modules.
_TARGET_CHOICES = [
    "q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "kv_a_proj_with_mqa", "q_b_proj", "kv_b_proj", "wq_b", "wk",
    "weights_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj", "embed_tokens", "lm_head", "qkvr",
    "wo_ud", "all",
]  # fmt: skip


@dataclass(frozen=True)
class LoraRef:
    """SGLang's LoRARef: one loaded adapter; a fresh `lora_id` for every load unless given."""

    lora_name: str
    lora_path: str
    pinned: bool = False
    lora_id: str = ""

    def __post_init__(self) -> None:
        if not self.lora_id:
            object.__setattr__(self, "lora_id", uuid.uuid4().hex)

    def as_json(self) -> dict[str, Any]:
        """The form /server_info shows (msgspec_to_builtins of a LoRARef)."""
        return {"lora_id": self.lora_id, "lora_name": self.lora_name, "lora_path": self.lora_path, "pinned": self.pinned}


class _LoraPaths(argparse.Action):
    """SGLang's LoRAPathAction: a value that looks like a JSON object is parsed as one."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        paths: list[Any] = []
        for value in values or []:
            value = value.strip()
            if value.startswith("{") and value.endswith("}"):
                obj = json.loads(value)
                if "lora_path" not in obj or "lora_name" not in obj:
                    raise AssertionError(f"{value!r} looks like a JSON str, but it does not contain 'lora_name' and "
                                         "'lora_path' keys.")  # fmt: skip
                paths.append(obj)
            else:
                paths.append(value)
        setattr(namespace, self.dest, paths)


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    """SGLang's LoRA flags, with its defaults (--enable-lora is None when not given)."""
    parser.add_argument("--enable-lora", action="store_true", default=None,
                        help="serve LoRA adapters (implied by --lora-paths)")  # fmt: skip
    parser.add_argument("--max-lora-rank", type=int, default=None)
    parser.add_argument("--lora-target-modules", nargs="*", default=None, choices=_TARGET_CHOICES,
                        help="modules that carry LoRA; the CPU backend serves q/k/v/o/gate/up/down_proj, `all` = those")
    parser.add_argument("--lora-paths", nargs="*", default=None, action=_LoraPaths,
                        help='adapters to load at start: PATH, NAME=PATH or {"lora_name","lora_path","pinned"}')
    parser.add_argument("--max-loaded-loras", type=int, default=None)
    parser.add_argument("--max-loras-per-batch", type=int, default=8,
                        help="adapters in one running batch, the base model included")  # fmt: skip


def check_lora_args(args: argparse.Namespace) -> None:
    """SGLang's check_lora_server_args: sets args.enable_lora from --lora-paths, turns
    args.lora_paths into LoraRefs, and fails with SGLang's AssertionError texts."""
    assert args.max_loras_per_batch > 0, "max_loras_per_batch must be positive"
    if args.lora_paths and args.enable_lora is None:
        args.enable_lora = True
        logger.warning("--enable-lora is set to True because --lora-paths is provided.")
    if not args.enable_lora:
        return
    args.lora_paths = [_ref(item) for item in args.lora_paths or []]
    if args.lora_target_modules and "all" in args.lora_target_modules:
        assert len(set(args.lora_target_modules)) == 1, (
            "If 'all' is specified in --lora-target-modules, it should be the only module specified.")
    assert args.lora_paths or (args.max_lora_rank and args.lora_target_modules), (
        "When no initial --lora-paths is provided, you need to specify both --max-lora-rank and "
        "--lora-target-modules for LoRA initialization.")  # fmt: skip
    if args.max_loaded_loras is not None:
        assert args.max_loaded_loras >= args.max_loras_per_batch, (
            "max_loaded_loras should be greater than or equal to max_loras_per_batch. "
            f"max_loaded_loras={args.max_loaded_loras}, max_loras_per_batch={args.max_loras_per_batch}")
        assert len(args.lora_paths) <= args.max_loaded_loras, (
            "The number of LoRA paths should not exceed max_loaded_loras. "
            f"max_loaded_loras={args.max_loaded_loras}, lora_paths={len(args.lora_paths)}")


def _ref(item: Any) -> LoraRef:
    """One --lora-paths item as SGLang parses it, with LoRARef.deterministic_id."""
    if isinstance(item, str):
        name, path = item.split("=", 1) if "=" in item else (item, item)
        return LoraRef(name, path, False, _deterministic_id(name, path))
    if "lora_name" not in item or "lora_path" not in item:
        raise AssertionError("When providing LoRA paths as a list of dict, each dict should contain 'lora_name' and "
                             f"'lora_path' keys. Got: {item}")  # fmt: skip
    name, path = item["lora_name"], item["lora_path"]
    return LoraRef(name, path, bool(item.get("pinned", False)), _deterministic_id(name, path))


def _deterministic_id(name: str, path: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{name}\0{path}").hex


def lora_server_args(args: argparse.Namespace) -> dict[str, Any]:
    """The LoRA fields of /server_info as SGLang's ServerArgs holds them after its checks (the
    target modules as a set shown as a list, sorted here)."""
    paths: Sequence[Any] | None = args.lora_paths
    return {
        "enable_lora": args.enable_lora,
        "enable_lora_overlap_loading": False if args.enable_lora else None,
        "max_lora_rank": args.max_lora_rank,
        "lora_target_modules": sorted(set(args.lora_target_modules)) if args.lora_target_modules else None,
        "lora_paths": None if paths is None else [p.as_json() if isinstance(p, LoraRef) else p for p in paths],
        "max_loaded_loras": args.max_loaded_loras,
        "max_loras_per_batch": args.max_loras_per_batch,
        "lora_eviction_policy": "lru",
        "lora_backend": "csgmv",
    }
