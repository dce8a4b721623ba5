"""The CPU backend's model: a transformers causal LM in float32, and what is done to it as a whole.

Owns: loading a checkpoint (float32, eval mode), the EOS token ids (model config, generation
config, tokenizer, as SGLang collects them), one forward pass of the decoder without the LM head
(with transformers 4.x's and 5.x's name for the cache argument), the LM head, loading new weights
into the live model (every check before any copy, so a refused update leaves the old weights),
freeing and re-allocating the parameters' storage, and the number of torch threads. Knows nothing
about sequences, batching, sampling, the scheduler thread, the prefix cache or HTTP: `_runner`
decides when each of these runs and what else changes with it.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

__all__ = [
    "ParamShapes", "default_num_threads", "eos_token_ids", "forward", "free_weights", "lm_logits", "load_model",
    "load_weights", "restore_weights",
]  # fmt: skip

# A released parameter: its shape and dtype, to allocate it again.
ParamShapes = dict[str, tuple[torch.Size, torch.dtype]]


def load_model(path: str) -> PreTrainedModel:
    # float32 on the CPU: bf16 matmuls are slow there, and float32 keeps greedy runs stable.
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    return model


def eos_token_ids(model: PreTrainedModel, tokenizer: Any) -> list[int]:
    """EOS ids from the model config, the generation config and the tokenizer (as SGLang)."""
    found: list[int] = []
    sources = [getattr(model.config, "eos_token_id", None)]
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        sources.append(getattr(generation_config, "eos_token_id", None))
    sources.append(tokenizer.eos_token_id)
    for source in sources:
        for token in source if isinstance(source, (list, tuple)) else [source]:
            if isinstance(token, int) and token not in found:
                found.append(token)
    return found


def forward(
    model: PreTrainedModel, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
) -> torch.Tensor:
    """Run the decoder (without the LM head) and return the last hidden states."""
    decoder = model.get_decoder()  # type: ignore[no-untyped-call]
    kwargs = {_cache_kwarg(decoder): cache}
    out = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **kwargs)
    return cast(torch.Tensor, out.last_hidden_state)


def lm_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on hidden states, as float32 logits."""
    head = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    assert head is not None, "a causal LM has an LM head"
    return cast(torch.Tensor, head(hidden).float())


def _cache_kwarg(decoder: torch.nn.Module) -> str:
    """transformers 5.x renamed the decoder's `past_key_values` argument to `cache`."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def load_weights(model: PreTrainedModel, path: str) -> tuple[bool, str]:
    """Load the checkpoint at `path` into `model` in place: (success, SGLang's message).

    Everything is checked before anything is copied, so a refused update leaves the old weights.
    """
    try:
        fresh = load_model(path)
    except Exception as e:
        return False, f"Failed to get weights iterator: {e}."
    current = model.state_dict()
    incoming = fresh.state_dict()
    if type(fresh) is not type(model) or current.keys() != incoming.keys():
        problem = f"the checkpoint is a {type(fresh).__name__} with other parameters than this {type(model).__name__}"
        return False, f"Failed to update weights: {problem}.\nRolling back to original weights."
    mismatched = [name for name, tensor in incoming.items() if tensor.shape != current[name].shape]
    if mismatched:
        problem = f"shape mismatch in {mismatched[:3]}"
        return False, f"Failed to update weights: {problem}.\nRolling back to original weights."
    model.load_state_dict(incoming, strict=True)
    return True, "Succeeded to update model weights."


def free_weights(model: PreTrainedModel) -> ParamShapes:
    """Free every parameter's storage (the tensors become empty); returns what `restore_weights` needs."""
    shapes: ParamShapes = {}
    for name, param in model.named_parameters():
        shapes[name] = (param.shape, param.dtype)
        param.data = torch.empty(0, dtype=param.dtype)
    return shapes


def restore_weights(model: PreTrainedModel, shapes: ParamShapes) -> None:
    """Give freed parameters their memory back, as zeros (their values are gone)."""
    parameters = dict(model.named_parameters())
    for name, (shape, dtype) in shapes.items():
        parameters[name].data = torch.zeros(shape, dtype=dtype)


def default_num_threads() -> int:
    """Torch threads for the model: leave a core for the event loop and the client.

    On 2 cores one thread wins: a second torch thread competes with the server's event loop and
    the client for the other core, and decode steps get slower, not faster (docs/decisions.md).
    """
    cores = os.cpu_count() or 1
    return 1 if cores <= 2 else cores - 1
