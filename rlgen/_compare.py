"""`compare_logprobs`: how far apart two sets of response logprobs are.

Owns: the comparison over real response positions only (padding never counts; NaN, i.e. "not
returned", is counted apart instead of compared; equal infinities agree) and the check that two
results hold the same response tokens. Knows nothing about servers or how the logprobs were made:
sampled and re-scored (`Engine.check_logprobs`), two engines, or a trainer's own forward pass; a
`Rollouts` is read only through its public tensors (`logprobs`, `response_mask`, `response_ids`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ._results import Rollouts

__all__ = ["compare_logprobs"]


def compare_logprobs(
    a: Rollouts | torch.Tensor,
    b: Rollouts | torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
) -> dict[str, float | int]:
    """Compare two sets of response logprobs over real response positions only.

    Args:
        a, b: Rollouts, or [N, R] logprob tensors. With two Rollouts their response ids must match.
        mask: [N, R] bool; needed only when neither a nor b is a Rollouts.

    Returns:
        dict with max_abs_diff, mean_abs_diff, n_tokens (positions compared),
        first_token_max_abs_diff (position 0 of non-empty rows) and n_missing (masked positions
        skipped because either side is NaN, i.e. not returned).
    """
    import torch

    def unpack(x: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        if not isinstance(x, torch.Tensor) and hasattr(x, "response_mask"):  # a Rollouts
            if x.logprobs is None:
                raise ValueError("this Rollouts has no logprobs; generate with logprobs=True")
            return x.logprobs.cpu(), x.response_mask.cpu(), x.response_ids.cpu()
        if isinstance(x, torch.Tensor):
            return x.detach().cpu(), None, None
        raise TypeError(f"expected Rollouts or a torch.Tensor, got {type(x).__name__}")

    la, ma, ia = unpack(a)
    lb, mb, ib = unpack(b)
    if la.shape != lb.shape:
        raise ValueError(f"logprob shapes differ: {tuple(la.shape)} vs {tuple(lb.shape)}")
    if (ia is not None and ib is not None and ma is not None and mb is not None
            and (not torch.equal(ma, mb) or not torch.equal(ia[ma], ib[mb]))):
        raise ValueError("the two Rollouts have different response tokens; their logprobs are not comparable")
    m = mask if mask is not None else ma if ma is not None else mb
    if m is None:
        raise ValueError("pass mask= (the response mask) when comparing two plain tensors")
    m = m.detach().cpu().bool()
    if m.shape != la.shape:
        raise ValueError(f"mask shape {tuple(m.shape)} differs from logprob shape {tuple(la.shape)}")
    la, lb = la.double(), lb.double()
    missing = m & (la.isnan() | lb.isnan())
    use = m & ~missing
    # Equal infinities (e.g. -inf on both sides) agree; inf - inf would otherwise be NaN.
    diff = torch.where(la == lb, torch.zeros_like(la), (la - lb).abs())
    d = diff[use]
    first = diff[:, :1][use[:, :1]] if diff.shape[1] else d[:0]
    return {
        "max_abs_diff": float(d.max()) if d.numel() else 0.0,
        "mean_abs_diff": float(d.mean()) if d.numel() else 0.0,
        "n_tokens": int(d.numel()),
        "first_token_max_abs_diff": float(first.max()) if first.numel() else 0.0,
        "n_missing": int(missing.sum()),
    }
