"""The named tensor properties of a result: `res.prompt_ids`, `res.logprobs`, ... as one mixin.

Owns: one read-only property per tensor of `Rollouts.tensors()` (shapes, dtypes and padding are
stated in `_rollouts`' docstring), each a view of the cached tensors. Knows nothing about how the
tensors are built: the class it is mixed into provides `_required(name)` and `_tensor(name)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["TensorProperties"]


class TensorProperties:
    """`Rollouts`' tensors as properties (mixed into `Rollouts`)."""

    if TYPE_CHECKING:
        def _required(self, name: str) -> torch.Tensor: ...

        def _tensor(self, name: str) -> torch.Tensor | None: ...

    @property
    def prompt_ids(self) -> torch.Tensor:
        """[N, P] int64, left-padded with pad_token_id."""
        return self._required("prompt_ids")

    @property
    def prompt_mask(self) -> torch.Tensor:
        """[N, P] bool, False on padding."""
        return self._required("prompt_mask")

    @property
    def response_ids(self) -> torch.Tensor:
        """[N, R] int64, right-padded with pad_token_id."""
        return self._required("response_ids")

    @property
    def response_mask(self) -> torch.Tensor:
        """[N, R] bool, False on padding."""
        return self._required("response_mask")

    @property
    def input_ids(self) -> torch.Tensor:
        """[N, P+R] int64: cat(prompt_ids, response_ids); response token j is at column P + j."""
        return self._required("input_ids")

    @property
    def attention_mask(self) -> torch.Tensor:
        """[N, P+R] bool: cat(prompt_mask, response_mask)."""
        return self._required("attention_mask")

    @property
    def lengths(self) -> torch.Tensor:
        """[N] int64 response lengths."""
        return self._required("lengths")

    @property
    def logprobs(self) -> torch.Tensor | None:
        """[N, R] float32 logprob of each response token; 0.0 where masked; None without logprobs."""
        return self._tensor("logprobs")

    @property
    def top_logprobs(self) -> torch.Tensor | None:
        """[N, R, k] float32 top-k logprobs per response position (0.0 where masked), or None."""
        return self._tensor("top_logprobs")

    @property
    def top_ids(self) -> torch.Tensor | None:
        """[N, R, k] int64 token ids of the top-k alternatives (pad_token_id where masked), or None."""
        return self._tensor("top_ids")

    @property
    def prompt_logprobs(self) -> torch.Tensor | None:
        """[N, P] float32 prompt logprobs aligned with prompt_ids (NaN where none, 0.0 on padding), or None."""
        return self._tensor("prompt_logprobs")

    @property
    def loss_mask(self) -> torch.Tensor:
        """[N, R] bool: the response tokens the model sampled (its EOS included), False on padding
        and on tokens it did not sample (an episode's environment and tool messages, a closing
        EOS the environment appended); equals response_mask for single-turn samples."""
        return self._required("loss_mask")

    @property
    def turn_ids(self) -> torch.Tensor | None:
        """[N, R] int64: per response token, the episode's assistant turn it belongs to or follows
        (0 for the first turn, 0 on padding); None for single-turn results."""
        return self._tensor("turn_ids")

    @property
    def versions(self) -> torch.Tensor | None:
        """[N, R] int64: per response token, the weight version index that sampled it (the
        Engine's count of weight updates: 0 for the weights it started with, +1 per update), -1
        on padding and where not known; aligned with `logprobs` and `response_ids`. Every
        `generate()` result has it (each row's tokens: the version its answer names) and every
        background job's (`Engine.submit`: per token, across weight updates); None for results
        made without (episodes, hand-built, older files)."""
        return self._tensor("versions")
