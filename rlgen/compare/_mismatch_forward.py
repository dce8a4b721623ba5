"""The trainer's logprobs of sampled tokens: batched forward passes of a transformers causal LM.

Owns: scoring given response tokens under a model as a trainer does (verl's and TRL's recipe):
the rows batched (longest first, each batch cut to its own longest prompt and response), prompts
left-padded and responses right-padded so that every response starts at one column, position ids
counted from each row's first real token, `torch.no_grad()`, the model in eval mode for the call
(its mode restored after), inputs on the model's own device, the logits at position t − 1 scoring
token t, divided by each row's temperature and turned into float32 `log_softmax` (clamped at
float32's lowest value, as SGLang's sampler clamps), and a progress line per row. Also the model's
vocabulary size and its input device. Knows nothing about servers, `Rollouts`, sampled logprobs
or what the numbers are compared with: padded id and mask tensors in, an [N, R] tensor out.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from ..core._progress import ProgressLine

if TYPE_CHECKING:
    import torch

__all__ = ["input_device", "trainer_logprobs", "vocab_size"]


def trainer_logprobs(model: Any, *, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
                     response_mask: torch.Tensor, temperatures: torch.Tensor, batch_size: int,
                     progress: bool | None) -> torch.Tensor:
    """[N, R] float32: log_softmax(logits / T)[token] of every real response token under `model`;
    0.0 on padding, NaN where a token has nothing before it to predict it (an empty prompt's first
    response token).

    Args:
        prompt_ids, prompt_mask: [N, P], left-padded (real tokens at the right).
        response_ids, response_mask: [N, R], right-padded (real tokens at the left).
        temperatures: [N], each row's temperature (> 0).
        batch_size: rows per forward pass.
        progress: a progress line (True, False, None = once the call has run a second).
    """
    import torch

    n, width = response_ids.shape
    out = torch.zeros((n, width), dtype=torch.float32)
    prompt_len, response_len = prompt_mask.sum(-1), response_mask.sum(-1)
    order = torch.argsort(prompt_len + response_len, descending=True, stable=True).tolist()
    device = input_device(model)
    keep = _logits_to_keep_name(model)
    was_training = bool(getattr(model, "training", False))
    with ProgressLine("sampler_vs_trainer", total=n, unit="row", show=progress) as line, torch.no_grad():
        model.eval()
        try:
            for start in range(0, n, batch_size):
                rows = order[start:start + batch_size]
                p, r = int(prompt_len[rows].max()), int(response_len[rows].max())
                if r:
                    ids = torch.cat([prompt_ids[rows, prompt_ids.shape[1] - p:], response_ids[rows, :r]], dim=1)
                    mask = torch.cat([prompt_mask[rows, prompt_mask.shape[1] - p:], response_mask[rows, :r]], dim=1)
                    out[rows, :r] = _score_batch(model, ids, mask, prompt_width=p, temperatures=temperatures[rows],
                                                 device=device, keep=keep)
                line.advance(len(rows), tokens=int(response_len[rows].sum()))
        finally:
            model.train(was_training)
    out[(prompt_len == 0) & (response_len > 0), 0] = float("nan")
    return out.masked_fill(~response_mask, 0.0)


def _score_batch(model: Any, ids: torch.Tensor, mask: torch.Tensor, *, prompt_width: int, temperatures: torch.Tensor,
                 device: torch.device, keep: str | None) -> torch.Tensor:
    """One forward pass: [B, r] logprobs of ids[:, prompt_width:] (prompts end at `prompt_width`)."""
    import torch

    if prompt_width == 0:  # no prompt in the batch: one pad column, so every token has a position before it
        ids, mask = torch.nn.functional.pad(ids, (1, 0)), torch.nn.functional.pad(mask, (1, 0))
        prompt_width = 1
    r = ids.shape[1] - prompt_width
    ids, mask = ids.to(device), mask.to(device=device, dtype=torch.long)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    kwargs = {keep: r + 1} if keep is not None else {}
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, **kwargs).logits
    # The logits at position t − 1 score token t: columns prompt_width − 1 .. end − 2 score the response.
    scoring = logits[:, -(r + 1):-1].float() / temperatures.to(device=device, dtype=torch.float32)[:, None, None]
    logprobs = torch.log_softmax(scoring, dim=-1)
    picked = logprobs.gather(-1, ids[:, prompt_width:, None]).squeeze(-1)
    return picked.clamp(min=torch.finfo(torch.float32).min).cpu()


def _logits_to_keep_name(model: Any) -> str | None:
    """The forward argument that computes logits for the last k positions only (transformers 4.50+:
    `logits_to_keep`; earlier `num_logits_to_keep`), or None when the model takes neither (a
    wrapper: then all logits are computed and sliced)."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return None
    return next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in parameters), None)


def input_device(model: Any) -> torch.device:
    """Where the model reads its input ids: its input embeddings' device (the first device of a
    model spread over several), else its first parameter's."""
    import torch

    embeddings = getattr(model, "get_input_embeddings", None)
    weight = getattr(embeddings(), "weight", None) if callable(embeddings) else None
    if isinstance(weight, torch.Tensor):
        return weight.device
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def vocab_size(model: Any) -> int | None:
    """The number of token ids the model scores: its LM head's rows, else its (text) config's
    `vocab_size`; None when neither is known."""
    import torch

    head = getattr(model, "get_output_embeddings", None)
    weight = getattr(head(), "weight", None) if callable(head) else None
    if isinstance(weight, torch.Tensor) and weight.ndim == 2:
        return int(weight.shape[0])
    config = getattr(model, "config", None)
    text_config = getattr(config, "get_text_config", None)
    text = text_config() if callable(text_config) else config
    size = getattr(text, "vocab_size", None)
    return int(size) if isinstance(size, int) else None
