"""The CPU backend's running batch: per-sequence decode state and the row-aligned tensors.

Owns: `Seq` (the scheduler's mutable state of one sequence, kept whole while it waits to be
prefilled again after a retraction), `Batch` (KV cache, attention mask, positions, last tokens and
output-token counts, all row-aligned), the KV cache whose layers append into spare capacity
(`_GrowingLayer`), and the surgery on batches: keeping some rows, merging two batches, and laying
cached prefixes out as batch tensors. Knows nothing about the model, sampling,
text, the scheduler's queue or HTTP: these are pure functions on tensors, called by `_runner`.

Layout: rows are padded on the left to a common length; the mask is 0 on padding, and the cache
is as long as the mask. A cached prompt prefix sits right-aligned left of the new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlgen.cpu_server._jobs import Job

__all__ = ["Batch", "Seq", "kv", "merge_batches", "new_cache", "prefix_layers", "select_rows"]


@dataclass
class Seq:
    """The scheduler's mutable state of one running sequence."""

    job: Job
    generator: torch.Generator | None
    output_ids: list[int] = field(default_factory=list)
    out_logprobs: list[tuple[float, int]] = field(default_factory=list)
    out_top: list[list[tuple[float, int]]] = field(default_factory=list)
    in_logprobs: list[tuple[float | None, int]] | None = None
    in_top: list[list[tuple[float, int]] | None] | None = None
    finish_reason: dict[str, Any] | None = None
    # How many trailing output tokens to decode when looking for stop strings.
    stop_tail_tokens: int = 0
    cached_tokens: int = 0
    # An abort that reached the sequence while it ran (SGLang's `Req.to_finish`): the next step still
    # samples a token, then the sequence finishes with this reason, before any length or stop check.
    to_finish: dict[str, Any] | None = None
    # Times it lost its KV and went back to the queue (a pause in "retract" mode).
    num_retractions: int = 0

    @property
    def fill_ids(self) -> list[int]:
        """The tokens a prefill runs over: the prompt, and after a retraction the output so far."""
        return self.job.input_ids + self.output_ids if self.output_ids else self.job.input_ids


@dataclass
class Batch:
    """The running rows: KV cache, attention mask and per-row decode state, all row-aligned."""

    seqs: list[Seq]
    cache: DynamicCache
    mask: torch.Tensor  # [B, T] int64, 0 on left padding; T == cache length
    next_pos: torch.Tensor  # [B] position id of the token fed next
    last_tokens: torch.Tensor  # [B] the token fed next
    counts: torch.Tensor  # [B, V] float32 counts of output tokens (for penalties)


def select_rows(batch: Batch, rows: list[int]) -> Batch:
    """Keep `rows`, then drop leading columns that are padding in every remaining row."""
    index = torch.tensor(rows, dtype=torch.long)
    mask = batch.mask[index]
    first_real = int((mask.sum(0) > 0).nonzero()[0])
    layers = [(k[index, :, first_real:, :], v[index, :, first_real:, :]) for k, v in kv(batch.cache)]
    return Batch(
        seqs=[batch.seqs[r] for r in rows],
        cache=new_cache(layers),
        mask=mask[:, first_real:],
        next_pos=batch.next_pos[index],
        last_tokens=batch.last_tokens[index],
        counts=batch.counts[index],
    )


def merge_batches(a: Batch, b: Batch) -> Batch:
    """Stack two batches, left-padding the shorter one's cache and mask with masked zeros."""
    width = max(a.mask.shape[1], b.mask.shape[1])

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - t.shape[dim]
        if missing == 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    layers = [
        (torch.cat([pad(ka, 2), pad(kb, 2)]), torch.cat([pad(va, 2), pad(vb, 2)]))
        for (ka, va), (kb, vb) in zip(kv(a.cache), kv(b.cache))
    ]
    return Batch(
        seqs=a.seqs + b.seqs,
        cache=new_cache(layers),
        mask=torch.cat([pad(a.mask, 1), pad(b.mask, 1)]),
        next_pos=torch.cat([a.next_pos, b.next_pos]),
        last_tokens=torch.cat([a.last_tokens, b.last_tokens]),
        counts=torch.cat([a.counts, b.counts]),
    )


class _GrowingLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A DynamicLayer that appends into spare capacity instead of re-concatenating every step.

    DynamicLayer copies the whole cache on every decode step (torch.cat), so a step slows down as
    the sequence grows. Here the keys/values are views into buffers that grow by half their length
    when full, so a step appends in place (docs/decisions.md has the measurement).
    """

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._key_buffer = self._value_buffer = key_states[:, :, :0]
        old = self.get_seq_length()
        new = old + key_states.shape[-2]
        if new > self._key_buffer.shape[-2]:
            self._key_buffer = _grown(self._key_buffer, old, new)
            self._value_buffer = _grown(self._value_buffer, old, new)
        self._key_buffer[:, :, old:new] = key_states
        self._value_buffer[:, :, old:new] = value_states
        self.keys = self._key_buffer[:, :, :new]
        self.values = self._value_buffer[:, :, :new]
        return self.keys, self.values


def _grown(buffer: torch.Tensor, used: int, needed: int) -> torch.Tensor:
    shape = list(buffer.shape)
    shape[-2] = needed + max(64, needed // 2)
    grown = buffer.new_zeros(shape)
    grown[:, :, :used] = buffer[:, :, :used]
    return grown


def new_cache(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A cache of _GrowingLayers, empty or filled with (keys, values) per layer."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = _GrowingLayer  # layers are created on first use
    for keys, values in layers:
        layer = _GrowingLayer()  # type: ignore[no-untyped-call]
        layer.update(keys, values)
        cache.layers.append(layer)
    return cache


def prefix_layers(
    hits: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]], width: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the rows' cached prefixes as [B, kv_heads, width, head_dim], right-aligned (zeros on the left)."""
    template = next(layers for _, layers in hits if layers is not None)
    out = []
    for index, (k0, v0) in enumerate(template):
        keys = k0.new_zeros((len(hits), k0.shape[0], width, k0.shape[2]))
        values = v0.new_zeros((len(hits), v0.shape[0], width, v0.shape[2]))
        for row, (m, layers) in enumerate(hits):
            if layers is not None:
                keys[row, :, width - m :] = layers[index][0]
                values[row, :, width - m :] = layers[index][1]
        out.append((keys, values))
    return out


def kv(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the cache's (keys, values), each [B, kv_heads, T, head_dim]."""
    layers = [cast(DynamicLayer, layer) for layer in cache.layers]
    return [(cast(torch.Tensor, layer.keys), cast(torch.Tensor, layer.values)) for layer in layers]
