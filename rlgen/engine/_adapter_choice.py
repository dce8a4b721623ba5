"""Which LoRA adapter each prompt of a call uses: the adapters an Engine knows, and the checks on a call's `adapter=`.

Owns: `Adapter` (what the Engine knows about an adapter the server holds: where it came from,
its rank and content hash, which load of its name it is), `AdapterSet` (the adapters by name,
whether the server serves LoRA, the count of loads per name), the adapters a server was started
with (`adapters_at_start`, from /server_info), each prompt's adapter from a call's `adapter=`
(LoRA served, names loaded, with "did you mean"), a result's `adapter` column, what a result's
provenance says about its adapters, and an adapter's content hash for the completion cache (never
None for an adapter: one whose content is unknown here is refused).
Generation and scoring send the names as `lora_path`. Knows nothing about loading adapters
(`_adapters`), HTTP or generation.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..client import _lora
from ..core._errors import AdapterError
from ..core._options import adapters_per_prompt

__all__ = ["Adapter", "AdapterSet", "adapters_at_start"]


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter the server holds, as this Engine loaded it (or found it at start)."""

    name: str
    source: str                     # the adapter's directory, or "tensors" (loaded from memory)
    rank: int | None                # None: loaded at start by the server, not read here
    target_modules: tuple[str, ...]
    sha256: str | None              # content hash (tensors and scaling); None where unread
    load: int                       # which load of this name (1, 2, ... after each replacement)
    seconds: float                  # how long the load took, end to end

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "rank": self.rank, "sha256": self.sha256, "load": self.load}


class AdapterSet:
    """The adapters the server holds, as this Engine knows them, and each call's choice among them."""

    def __init__(self, server_info: Mapping[str, Any]) -> None:
        self.serves_lora = bool(server_info.get("enable_lora"))
        self.by_name: dict[str, Adapter] = adapters_at_start(server_info)
        self._loads: dict[str, int] = {}  # this Engine's loads per adapter name

    def next_load(self, name: str) -> int:
        """Count one more load of `name`: which load it is (the loads of other names do not count)."""
        self._loads[name] = self._loads.get(name, 0) + 1
        return self._loads[name]

    # -- for generation and scoring ------------------------------------------------------------------
    def per_prompt(self, adapter: str | Sequence[str | None] | None, n_prompts: int) -> list[str | None] | None:
        """Each prompt's adapter from a call's `adapter=` (checked: LoRA served, names loaded); None
        when every prompt uses the base model."""
        names = adapters_per_prompt(adapter, n_prompts)
        if names is None:
            return None
        self.require_lora("adapter=")
        self.check_names(sorted({n for n in names if n is not None}))
        return names

    def column(self, names: Sequence[str | None] | None, prompts: int, *, n: int = 1) -> dict[str, list[Any]]:
        """A result's `adapter` column (base rows None), written whenever the server serves LoRA."""
        if names is None and not self.serves_lora:
            return {}
        return {"adapter": [a for a in (names if names is not None else [None] * prompts) for _ in range(n)]}

    def provenance(self, names: Sequence[str | None] | None) -> dict[str, Any] | None:
        """What a result records about the adapters a call used (None: the base model only)."""
        if not names:
            return None
        used = sorted({n for n in names if n is not None})
        return {n: self.by_name[n].as_dict() if n in self.by_name else None for n in used}

    def cache_sha256(self, name: str | None) -> str | None:
        """An adapter's content hash for the completion cache (None for the base model, and only for
        it); AdapterError for an adapter whose content is unknown here, so that its prompts are never
        answered with the base model's cached samples."""
        if name is None:
            return None
        known = self.by_name.get(name)
        if known is None or known.sha256 is None:
            where = f" from {known.source!r}" if known is not None else ""
            raise AdapterError(f"the completion cache keys completions by the adapter's content, and adapter {name!r} "
                               f"was loaded by the server at start{where}, unread here: load it with "
                               "eng.load_adapter(), or pass cache=False")
        return known.sha256

    # -- checks --------------------------------------------------------------------------------------
    def require_lora(self, what: str) -> None:
        if not self.serves_lora:
            raise AdapterError(f"{what}: this server serves no LoRA adapters; start the Engine with lora=True "
                               "(or lora={'max_rank': 16, 'target_modules': 'all'}) to serve them")

    def check_names(self, names: Sequence[str]) -> None:
        unknown = [n for n in names if n not in self.by_name]
        if not unknown:
            return
        loaded = sorted(self.by_name)
        guess = difflib.get_close_matches(unknown[0], loaded, n=1)
        hint = f"; did you mean {guess[0]!r}?" if guess else ""
        raise AdapterError(f"no adapter {unknown[0]!r} is loaded (loaded: {loaded or 'none'}){hint} "
                           "Load one with eng.load_adapter(name, peft_model_or_directory)")


def adapters_at_start(server_info: Mapping[str, Any]) -> dict[str, Adapter]:
    """The adapters a server was started with (`--lora-paths`), as its /server_info lists them."""
    found: dict[str, Adapter] = {}
    for item in server_info.get("lora_paths") or ():
        if isinstance(item, Mapping):
            name, path = item.get("lora_name"), item.get("lora_path")
        elif isinstance(item, str):
            name, _, path = item.partition("=") if "=" in item else (item, "", item)
        else:
            continue
        if name:
            try:
                sha = _lora.from_directory(str(path)).sha256
            except (AdapterError, OSError, ValueError):
                sha = None  # not readable here (another machine): usable, not cacheable
            found[str(name)] = Adapter(name=str(name), source=str(path), rank=None, target_modules=(), sha256=sha,
                                       load=0, seconds=0.0)
    return found
