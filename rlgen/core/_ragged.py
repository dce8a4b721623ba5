"""Ragged token data stored flat: one numpy array of values plus row offsets (CSR-style).

Owns: offsets from row lengths, gathering rows (selection, repeating prompts for their samples)
and scattering flat values into padded [N, W, ...] arrays, left- or right-aligned, all without
Python loops over rows or tokens. Knows nothing about tokens, logprobs, torch or pandas: `Rollouts`
(`rollouts/_rollouts.py`) decides what is stored this way and how each field is padded.

Layout: row i's values are `values[offsets[i]:offsets[i + 1]]`; `offsets` is int64, has N + 1
entries and starts at 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["gather_rows", "pad_rows", "row_offsets"]


def row_offsets(lengths: np.ndarray) -> np.ndarray:
    """Row offsets [N + 1] int64 for rows of these lengths."""
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def gather_rows(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """New offsets and the flat positions of `rows`' values, in row order (no Python loop)."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    new = row_offsets(lengths)
    flat = np.repeat(starts - new[:-1], lengths) + np.arange(new[-1], dtype=np.int64)
    return new, flat


def pad_rows(values: np.ndarray, lengths: np.ndarray, fill: Any, *, left: bool) -> np.ndarray:
    """Scatter flat `values` into [N, max(lengths), ...], left- or right-aligned."""
    width = int(lengths.max()) if len(lengths) else 0
    out = np.full((len(lengths), width, *values.shape[1:]), fill, dtype=values.dtype)
    cols = np.arange(width)
    mask = cols >= (width - lengths)[:, None] if left else cols < lengths[:, None]
    # Boolean-mask assignment fills row-major, which is exactly the flat (row, then token) order.
    out[mask] = values
    return out
