"""LoRA on the CPU backend's model: the layers that carry it, the loaded adapters, and which adapter
each row of a forward pass uses.

Owns: SGLang's LoRA start-up (`LoRAManager.init_state`: the adapters of --lora-paths read first,
the largest rank and the target modules taken from the flags or inferred from those adapters), a
forward hook on every served linear layer (the module tree and its parameter names stay as they
are, so weight updates by name are unaffected), the loaded adapters by id with their refs (SGLang's
scheduler-side `lora_refs`: the source of `loaded_adapters` and of "already loaded"), loading and
unloading with SGLang's `LoRAUpdateOutput` answers, the `--max-loras-per-batch` test for a set of
adapters (`validate_lora_batch`, pinned adapters included), and the per-row assignment the hooks
read during one forward (`rows`). Knows nothing about HTTP, names in requests, the queue, the
prefix cache or sampling: the runner says which adapter each row uses and when to load or unload.

Math: for a row using adapter a, every served linear layer with weights in a computes
base(x) + lora_B(lora_A(x)) * scaling, as PEFT's LoRA Linear does in eval mode; rows of one batch
are grouped by adapter, and rows of the base model (None) are left untouched.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from rlgen.cpu_server._lora_adapter import (
    AdapterWeights,
    LoraSettings,
    check_adapter,
    module_weights,
    normalized_modules,
    read_adapter_dir,
    served_leaves,
    update_output,
)
from rlgen.cpu_server._lora_flags import LoraRef

__all__ = ["LoraLayers", "LoraSpec"]

_LAYER = re.compile(r"layers\.(\d+)\.")


@dataclass(frozen=True)
class LoraSpec:
    """The LoRA flags as given (None: infer from the adapters of --lora-paths, as SGLang does)."""

    max_lora_rank: int | None
    target_modules: list[str] | None
    max_loras_per_batch: int = 8
    initial: list[LoraRef] = field(default_factory=list)


class LoraLayers:
    """LoRA hooks on one model and the adapters they apply. Scheduler thread only."""

    def __init__(self, model: Any, spec: LoraSpec) -> None:
        self.vocab_size = int(model.config.vocab_size)
        self._refs: dict[str, LoraRef] = {}
        self._adapters: dict[str, dict[str, AdapterWeights]] = {}
        # (weights by module path, rows that use them or None for every row) during one forward
        self._groups: list[tuple[dict[str, AdapterWeights], torch.Tensor | None]] = []
        initial = [(ref, *_read_initial(ref)) for ref in spec.initial]
        self.settings = _settings(spec, [(ref, config) for ref, config, _, _ in initial])
        leaves = set(served_leaves(self.settings.target_modules))
        self.linears: dict[str, torch.nn.Linear] = {
            path: module for path, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and path.rsplit(".", 1)[-1] in leaves and _LAYER.search(path)
        }  # fmt: skip
        for path, module in self.linears.items():
            module.register_forward_hook(self._hook(path))
        for ref, config, tensors, added in initial:
            result = self.load(ref, config=config, tensors=tensors, added_tokens=added)
            if not result["success"]:
                raise RuntimeError(f"Failed to load LoRA adapter {ref.lora_name}: {result['error_message']}")

    # ---- loading --------------------------------------------------------------------------------------

    def loaded_adapters(self) -> dict[str, str]:
        return {ref.lora_name: ref.lora_path for ref in self._refs.values()}

    def failure(self, message: str) -> dict[str, Any]:
        """A failed load or unload's LoRAUpdateOutput (what is loaded stays)."""
        return update_output(False, message, self.loaded_adapters())

    def load(
        self, ref: LoraRef, *, config: dict[str, Any] | None = None, tensors: dict[str, torch.Tensor] | None = None,
        added_tokens: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """Load an adapter from `ref.lora_path` (a PEFT directory), or from `config` and `tensors`;
        SGLang's LoRAUpdateOutput either way (a failure leaves everything as it was)."""
        try:
            if config is None or tensors is None:
                config, tensors, added_tokens = read_adapter_dir(ref.lora_path)
            check_adapter(config, ref, self.settings, added_tokens=added_tokens, vocab_size=self.vocab_size,
                          loaded=list(self._refs.values()), max_loras_per_batch=self.settings.max_loras_per_batch)
            weights = module_weights(config, tensors, self.linears, ref.lora_name)
        except Exception as e:  # SGLang's _load_lora_adapter answers every failure with str(e)
            return self.failure(str(e))
        self._refs[ref.lora_id] = ref
        self._adapters[ref.lora_id] = weights
        return update_output(True, "", self.loaded_adapters())

    def unload(self, lora_id: str) -> dict[str, Any]:
        if lora_id not in self._refs:
            return self.failure(f"LoRA adapter with ID {lora_id} is not loaded.")
        del self._refs[lora_id], self._adapters[lora_id]
        return update_output(True, "", self.loaded_adapters())

    # ---- batches --------------------------------------------------------------------------------------

    def fits(self, lora_ids: set[str | None]) -> bool:
        """Whether one running batch may hold these adapters (None: the base model), as SGLang's
        validate_lora_batch: at most --max-loras-per-batch, with slots held by pinned adapters."""
        limit = self.settings.max_loras_per_batch
        if len(lora_ids) > limit:
            return False
        num_pinned = sum(ref.pinned for ref in self._refs.values())
        if num_pinned == 0:
            return True
        pinned_here = sum(self._refs[i].pinned for i in lora_ids if i is not None and i in self._refs)
        return len(lora_ids) - pinned_here <= limit - num_pinned

    @contextmanager
    def rows(self, lora_ids: list[str | None]) -> Iterator[None]:
        """During the block, row r of every forward uses adapter `lora_ids[r]` (None: the base)."""
        groups = []
        for lora_id in dict.fromkeys(i for i in lora_ids if i is not None):
            index = None if all(i == lora_id for i in lora_ids) else torch.tensor(
                [row for row, i in enumerate(lora_ids) if i == lora_id], dtype=torch.long)
            groups.append((self._adapters[lora_id], index))
        self._groups = groups
        try:
            yield
        finally:
            self._groups = []

    def _hook(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor | None:
            if not self._groups:
                return None  # the base output unchanged
            x = args[0]
            for weights, index in self._groups:
                w = weights.get(path)
                if w is None:
                    continue
                if index is None:
                    output = output + F.linear(F.linear(x, w.a), w.b) * w.scaling
                else:
                    output = output.index_add(0, index, F.linear(F.linear(x[index], w.a), w.b) * w.scaling)
            return output

        return hook


def _read_initial(ref: LoraRef) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, int] | None]:
    try:
        return read_adapter_dir(ref.lora_path)
    except Exception as e:
        raise RuntimeError(f"Failed to load LoRA adapter {ref.lora_name}: {e}") from e


def _settings(spec: LoraSpec, initial: list[tuple[LoraRef, dict[str, Any]]]) -> LoraSettings:
    """SGLang's init_lora_shapes: the flags, else what the adapters of --lora-paths need; with
    --lora-target-modules, every such adapter's modules must be among them."""
    targets: set[str] = set()
    if spec.target_modules:
        targets = {"all"} if "all" in spec.target_modules else normalized_modules(spec.target_modules)
    for ref, config in initial:
        wanted = config["target_modules"]
        if isinstance(wanted, str):
            if wanted not in ("all-linear", "all"):
                raise ValueError(f"SGLang does not recognize target_modules='{wanted}'. Please use a list of module name "
                                 "suffixes in the adapter's PEFT config, or explicitly specify --lora-target-modules "
                                 "during server startup.")  # fmt: skip
            if not spec.target_modules:
                targets.add("all")
            continue
        adapter = normalized_modules(wanted)
        if not spec.target_modules:
            targets |= adapter
        elif "all" not in targets and not adapter <= targets:
            raise ValueError(
                f"LoRA adapter '{ref.lora_name}' contains target modules {sorted(adapter - targets)} that are not "
                f"included in the specified --lora-target-modules {sorted(targets)}. Please update "
                f"--lora-target-modules to include all required modules: {sorted(targets | adapter)}, or use 'all' "
                "to enable all supported modules."
            )
    rank = spec.max_lora_rank if spec.max_lora_rank is not None else max((int(c["r"]) for _, c in initial), default=0)
    return LoraSettings(rank, frozenset(targets), spec.max_loras_per_batch)
