"""`compare_logprobs`: how far apart two sets of response logprobs are; `LogprobCheck`: a verdict.

Owns: the comparison over real response positions only (padding never counts; NaN, i.e. "not
returned", is counted apart instead of compared; equal infinities agree) and the check that two
results hold the same response tokens; which sampling parameters make sampled logprobs differ from
raw-logit ones (`not_comparable_reason`); and `LogprobCheck`, the verdict of a comparison against
its bounds, with a readable repr and HTML. Knows nothing about servers or how the logprobs were
made: sampled and re-scored (`Engine.check_logprobs`), two engines, or a trainer's own forward
pass; a `Rollouts` is read only through its public tensors (`logprobs`, `response_mask`, `loss_mask`,
`response_ids`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ..rollouts._rollouts import Rollouts

__all__ = ["LogprobCheck", "check_verdict", "compare_logprobs", "not_comparable_reason"]

# SGLang rewrites temperatures below this to greedy (temperature 1, top_k 1).
_GREEDY_EPS = 1e-6


def compare_logprobs(
    a: Rollouts | torch.Tensor,
    b: Rollouts | torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    off_by: float | None = None,
) -> dict[str, float | int]:
    """Compare two sets of response logprobs over real response positions only.

    Args:
        a, b: Rollouts, or [N, R] logprob tensors. With two Rollouts their response ids must match.
        mask: [N, R] bool; needed only when neither a nor b is a Rollouts.
        off_by: also count the tokens whose |diff| exceeds this (`n_off`).

    Returns:
        dict with max_abs_diff, mean_abs_diff, n_tokens (positions compared),
        first_token_max_abs_diff (position 0 of non-empty rows) and n_missing (masked positions
        skipped because either side is NaN, i.e. not returned).
    """
    import torch

    def unpack(x: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        if not isinstance(x, torch.Tensor) and hasattr(x, "response_mask"):  # a Rollouts
            if x.logprobs is None:
                raise ValueError("this Rollouts has no logprobs; generate with logprobs=True")
            return x.logprobs.cpu(), x.response_mask.cpu(), x.response_ids.cpu(), x.loss_mask.cpu()
        if isinstance(x, torch.Tensor):
            return x.detach().cpu(), None, None, None
        raise TypeError(f"expected Rollouts or a torch.Tensor, got {type(x).__name__}")

    la, ma, ia, sa = unpack(a)
    lb, mb, ib, sb = unpack(b)
    if la.shape != lb.shape:
        raise ValueError(f"logprob shapes differ: {tuple(la.shape)} vs {tuple(lb.shape)}")
    if (ia is not None and ib is not None and ma is not None and mb is not None
            and (not torch.equal(ma, mb) or not torch.equal(ia[ma], ib[mb]))):
        raise ValueError("the two Rollouts have different response tokens; their logprobs are not comparable")
    # The sampled tokens of both (an episode's environment tokens have no sampled logprob).
    m = mask if mask is not None else sa & sb if sa is not None and sb is not None else sa if sa is not None else sb
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
        "n_off": int((d > off_by).sum()) if off_by is not None else 0,
    }


def not_comparable_reason(sampling: Mapping[str, Any] | None) -> str | None:
    """Why logprobs sampled with these SGLang sampling parameters differ from raw-logit ones; None
    when they do not (or when `sampling` is unknown, e.g. mixed rollouts: then they are compared).

    SGLang reports `log_softmax(logits / temperature)` after penalties and logit bias, before
    top-p/top-k/min-p filtering; greedy requests run at temperature 1 (docs/sglang-api.md, 1.6).
    """
    if not sampling or sampling.get("score"):
        return None
    temperature = float(sampling.get("temperature", 1.0))
    greedy = temperature < _GREEDY_EPS or sampling.get("top_k") == 1
    if not greedy and abs(temperature - 1.0) > _GREEDY_EPS:
        return f"not comparable: sampled at temperature {temperature:g}; re-score compares raw logits"
    for name, neutral in (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0)):
        value = sampling.get(name, neutral)
        if value != neutral:
            return f"not comparable: sampled with {name}={value:g}, which shifts the sampled logprobs; re-score compares raw logits"
    if sampling.get("logit_bias"):
        return "not comparable: sampled with logit_bias, which shifts the sampled logprobs; re-score compares raw logits"
    return None


# A comparison is "aligned" when at most this share of tokens is off by more than `max_diff`: a
# logprob paired with the wrong token (off by one, another tokenizer, another model) is off by
# nats on most tokens, while rounding moves single tokens by tenths (bf16 on SGLang) and the share
# of such tokens does not grow with the rollout's length, as its maximum does.
MISALIGNED_SHARE = 0.01


@dataclass(frozen=True)
class LogprobCheck:
    """The verdict of `Engine.check_logprobs`: sampled logprobs against a re-score of the same tokens.

    Two questions, answered apart:
    - `aligned`: is each sampled logprob the model's logprob of the token it sits on? False when
      more than 1% of tokens differ by more than `max_diff` (an off-by-one, a different model or
      tokenizer: nats on most tokens). This is what the check catches reliably.
    - `weights_match`: is the mean |diff| within the backend's rounding noise (`mean_diff`)? False
      means the weights that sampled differ from the ones that re-scored. True does NOT prove
      they are equal: weights that differ by less than the noise (one small optimiser step) give
      a mean inside it, and the check cannot tell them apart.
    `passed` is both; None when the two are not comparable (`reason` says why; numbers are NaN).
    """

    passed: bool | None
    reason: str | None            # why the logprobs are not comparable; None when they are
    max_abs_diff: float
    mean_abs_diff: float
    n_tokens: int                 # response tokens compared
    first_token_max_abs_diff: float
    n_missing: int                # response tokens without a logprob on either side
    max_diff: float               # a token off by more than this is "off"
    mean_diff: float              # the bound on mean_abs_diff (the backend's rounding noise)
    n_off: int = 0                # tokens off by more than max_diff
    aligned: bool | None = None
    weights_match: bool | None = None

    @property
    def verdict(self) -> str:
        """One line: passed / FAILED with what failed and the numbers, or why not comparable."""
        if self.passed is None:
            return str(self.reason)
        missing = f", {self.n_missing} without a logprob" if self.n_missing else ""
        off = (f"{self.n_off} of {self.n_tokens} tokens off by more than {self.max_diff:g} "
               f"(max |diff| {self.max_abs_diff:.3g}){missing}")
        mean = f"mean |diff| {self.mean_abs_diff:.3g} (noise bound {self.mean_diff:g})"
        if not self.aligned:
            return (f"FAILED: not aligned: {off}; the sampled logprobs do not belong to these tokens "
                    f"(an off-by-one mask, another model or tokenizer); {mean}")
        if not self.weights_match:
            return (f"FAILED: aligned ({off}), but {mean} is above the noise: the weights that sampled "
                    "differ from the served ones")
        return (f"passed: aligned ({off}); {mean}: weights that differ by less than the noise "
                "cannot be told apart")

    def __repr__(self) -> str:
        return f"<LogprobCheck {self.verdict}>"

    def _repr_html_(self) -> str:
        color = {True: "#1a7f37", False: "#cf222e", None: "#9a6700"}[self.passed]
        head = {True: "passed", False: "FAILED", None: "not comparable"}[self.passed]
        return (f"<div><b style='color:{color}'>check_logprobs: {head}</b> "
                f"<span>{html.escape(self.verdict)}</span></div>")


def check_verdict(diffs: Mapping[str, float | int] | None, *, reason: str | None, max_diff: float,
                  mean_diff: float) -> LogprobCheck:
    """A `LogprobCheck` from `compare_logprobs`' dict (with `n_off` counted at `max_diff`) and the
    bounds; `diffs` None when not comparable."""
    if diffs is None:
        nan = math.nan
        return LogprobCheck(passed=None, reason=reason, max_abs_diff=nan, mean_abs_diff=nan, n_tokens=0,
                            first_token_max_abs_diff=nan, n_missing=0, max_diff=max_diff, mean_diff=mean_diff)
    n_tokens, n_off = int(diffs["n_tokens"]), int(diffs.get("n_off", 0))
    aligned = n_off <= MISALIGNED_SHARE * n_tokens
    weights_match = diffs["mean_abs_diff"] <= mean_diff
    return LogprobCheck(
        passed=bool(aligned and weights_match), reason=reason, max_abs_diff=float(diffs["max_abs_diff"]),
        mean_abs_diff=float(diffs["mean_abs_diff"]), n_tokens=n_tokens,
        first_token_max_abs_diff=float(diffs["first_token_max_abs_diff"]), n_missing=int(diffs["n_missing"]),
        max_diff=max_diff, mean_diff=mean_diff, n_off=n_off, aligned=bool(aligned), weights_match=bool(weights_match),
    )
