"""The CPU backend's prefix cache: the KV of prompts already prefilled, for reuse by later prompts.

Owns: storing one prompt's keys and values per layer under a namespace (the LoRA adapter id the
KV was computed with, None for the base model: a lookup never crosses namespaces, as SGLang's
radix cache keys a request's prefix by its lora_id), finding the longest cached prefix of a new
prompt, least-recently-used eviction under a byte budget, and clearing (flush, weight changes,
memory release; one namespace when its adapter is unloaded or loaded again). Knows nothing about batching, padding, models or HTTP: the runner decides what to
insert and how to splice a hit into its batch.

Like SGLang's radix cache with page size 1, a hit can be any common prefix of a cached prompt,
down to one token: the keys and values of positions 0..m-1 depend only on tokens 0..m-1. Unlike
SGLang, only prompts are cached (not the generated tokens), and entries are whole sequences in a
list rather than a tree; the budget keeps that list short.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

__all__ = ["PrefixCache"]

# Per layer: (keys, values), each [kv_heads, tokens, head_dim].
Layers = list[tuple[torch.Tensor, torch.Tensor]]
# An entry's key: (namespace, prompt token ids).
_Key = tuple[str | None, tuple[int, ...]]


class PrefixCache:
    """Cached prompts (namespace, token tuple) with their per-layer KV, least recently used first.

    Not thread-safe: the runner's scheduler thread is its only user.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[_Key, Layers] = OrderedDict()
        self._bytes: dict[_Key, int] = {}
        self._total_bytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def num_tokens(self) -> int:
        return sum(len(ids) for _, ids in self._entries)

    @property
    def num_bytes(self) -> int:
        return self._total_bytes

    def match(self, ids: Sequence[int], limit: int, namespace: str | None = None) -> tuple[int, Layers | None]:
        """The longest prefix of `ids` cached in `namespace`, at most `limit` tokens: (length,
        per-layer KV views).

        Returns (0, None) on a miss. The views are [kv_heads, length, head_dim] slices of the
        entry; the entry counts as used.
        """
        if limit <= 0 or not self._entries:
            return 0, None
        wanted = tuple(ids[:limit])
        best_len, best_key = 0, None
        for key in self._entries:
            if key[0] != namespace:
                continue
            common = _common_prefix_len(key[1], wanted)
            if common > best_len:
                best_len, best_key = common, key
                if common == len(wanted):
                    break
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        layers = self._entries[best_key]
        return best_len, [(k[:, :best_len], v[:, :best_len]) for k, v in layers]

    def contains(self, ids: Sequence[int], namespace: str | None = None) -> bool:
        """True if `ids` is a prefix of a prompt cached in `namespace` (inserting it would add nothing)."""
        wanted = tuple(ids)
        return any(ns == namespace and other[: len(wanted)] == wanted for ns, other in self._entries)

    def insert(self, ids: Sequence[int], layers: Layers, namespace: str | None = None) -> None:
        """Cache the KV of prompt `ids` (all its positions) in `namespace`; evicts the least recently used."""
        wanted = tuple(ids)
        key = (namespace, wanted)
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if not wanted or size > self.max_bytes:
            return
        mine = [other for other in self._entries if other[0] == namespace]
        covering = next((other for other in mine if other[1][: len(wanted)] == wanted), None)
        if covering is not None:  # `ids` is already cached, maybe as the prefix of a longer prompt
            self._entries.move_to_end(covering)
            return
        # Entries that are prefixes of this prompt are covered by it from now on.
        for other in [other for other in mine if wanted[: len(other[1])] == other[1]]:
            self._drop(other)
        self._entries[key] = layers
        self._bytes[key] = size
        self._total_bytes += size
        while self._total_bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._bytes.clear()
        self._total_bytes = 0

    def drop_namespace(self, namespace: str | None) -> None:
        """Forget every entry of `namespace`."""
        for key in [key for key in self._entries if key[0] == namespace]:
            self._drop(key)

    def _drop(self, key: _Key) -> None:
        del self._entries[key]
        self._total_bytes -= self._bytes.pop(key)


def _common_prefix_len(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the longest common prefix, by bisection on tuple-slice equality (compared in C)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi + 1) // 2
        if mid == hi:
            break
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
