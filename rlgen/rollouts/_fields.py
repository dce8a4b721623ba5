"""The optional per-token fields of a result: which exist, which side they align with, how they fill.

Owns: `FIELDS`, one `Field` per optional flat array a `Rollouts` may carry beside its token ids
(logprobs, top-k, token texts, prompt logprobs, the multi-turn fields `loss_mask` and
`turn_ids`, and `versions`, the weight version index that sampled each token), with the side it lines up with (prompt or response tokens), what a row that lacks it
gets when results are concatenated, and what padding it gets in a tensor. Knows nothing about
`Rollouts` itself, files or torch: selection, `concat`, parquet and the tensors loop over this table,
so a new field is one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["FIELDS", "Field"]


@dataclass(frozen=True)
class Field:
    """One optional per-token field.

    `fill(tokens, k, pad)` makes the values of rows that lack the field when results are joined
    (`k`: the top-k width, `pad`: the pad token id); `tensor_pad(pad)` is what padding positions
    of its tensor hold (None: the field has no tensor)."""

    side: Literal["prompt", "response"]
    fill: Callable[[int, int, int], np.ndarray]
    tensor_pad: Callable[[int], Any] | None


# A row without logprobs gets NaN ("not returned"); a row without a loss mask is a single-turn
# sample, every response token of which the model sampled (1); without turn ids, turn 0; without
# versions (a result made before them, or by hand), -1 ("not known"), as on padding.
FIELDS: dict[str, Field] = {
    "logprobs": Field("response", lambda t, k, pad: np.full(t, np.nan, np.float32), lambda pad: 0.0),
    "top_logprobs": Field("response", lambda t, k, pad: np.full((t, k), np.nan, np.float32), lambda pad: 0.0),
    "top_ids": Field("response", lambda t, k, pad: np.full((t, k), pad, np.int64), lambda pad: pad),
    "token_texts": Field("response", lambda t, k, pad: np.full(t, None, object), None),
    "prompt_logprobs": Field("prompt", lambda t, k, pad: np.full(t, np.nan, np.float32), lambda pad: 0.0),
    "loss_mask": Field("response", lambda t, k, pad: np.ones(t, np.bool_), lambda pad: False),
    "turn_ids": Field("response", lambda t, k, pad: np.zeros(t, np.int32), lambda pad: 0),
    "versions": Field("response", lambda t, k, pad: np.full(t, -1, np.int32), lambda pad: -1),
}  # fmt: skip
