"""A trainer's weights under the checkpoint names a server loads, checked before they are sent.

Owns: reading named tensors from what a notebook holds (a torch module such as a transformers
`PreTrainedModel` or a PEFT model, a state dict, or (name, tensor) pairs); the names trainers wrap
around a checkpoint's (torch.compile's `_orig_mod.`, DDP's `module.`, PEFT's `base_model.model.`,
`base_layer.` and `modules_to_save.<adapter>.`); PEFT's LoRA tensors (dropped once merged into the
base weights, refused before); the tied LM head (not sent when the served model ties it to the
embedding: SGLang's llama and qwen2 loaders skip `lm_head.weight` then); buffers SGLang skips
(`rotary_emb.inv_freq`); and the check against the served checkpoint's tensors (no unknown name,
no other shape, whether every tensor is covered). Messages say what to do. Knows nothing about
servers, HTTP or how tensors travel.

SGLang's loaders take Hugging Face checkpoint names (`model.layers.0.self_attn.q_proj.weight`) and
fuse q/k/v and gate/up themselves; an unknown name is only logged there ("Parameter ... not found
in params_dict") and a shape mismatch fails an assert inside the scheduler, which takes the server
down: hence the check here, before anything is sent.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core._errors import WeightsError

__all__ = ["CheckedWeights", "checked_weights"]

# Checkpoint shapes as the server's checkpoint files give them: name -> (shape, dtype).
Specs = Mapping[str, tuple[tuple[int, ...], str]]

_WRAPPER_PREFIXES = ("_orig_mod.", "module.", "base_model.model.")
_LORA = re.compile(r"\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)(\.|$)")
_SKIPPED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
_HEAD = "lm_head.weight"
_SHOW = 5


@dataclass
class CheckedWeights:
    """What will be sent: (name, tensor) in order, and whether it covers the whole checkpoint."""

    tensors: list[tuple[str, Any]]
    complete: bool
    dropped: list[str]   # names left out on purpose (tied head, merged LoRA, skipped buffers)


def checked_weights(weights: Any, *, checkpoint: Specs | None, tied: bool | None) -> CheckedWeights:
    """`weights` (a module, a state dict or (name, tensor) pairs) under checkpoint names, checked
    against `checkpoint` (None: not readable here, so names and shapes go unchecked).

    `tied`: whether the served model ties its LM head to its embedding (None: unknown; then the
    head is left out when it shares the embedding's storage, as in a tied transformers model).
    """
    module = _module(weights)
    raw = _raw_pairs(weights, module)
    renamed: dict[str, Any] = {}
    dropped: list[str] = []
    lora: list[str] = []
    for original, tensor in raw:
        name = _checkpoint_name(original)
        if _LORA.search(name):
            lora.append(original)
            continue
        if ".original_module." in name or name.endswith(_SKIPPED):
            dropped.append(original)
            continue
        if name in renamed:
            raise WeightsError(f"two tensors map to the checkpoint name {name!r} (one of them {original!r}): pass one "
                               "model's weights once")
        renamed[name] = tensor
    if lora:
        _check_merged(module, lora)
        dropped += lora
    if _HEAD in renamed and _head_is_tied(renamed, tied, checkpoint):
        dropped.append(_HEAD)
        del renamed[_HEAD]
    if not renamed:
        raise WeightsError("no weights to send: pass the model (e.g. a transformers PreTrainedModel), its "
                           "state_dict(), or (name, tensor) pairs")
    complete = False
    if checkpoint is not None:
        _check_names(renamed, checkpoint)
        _check_shapes(renamed, checkpoint)
        needed = {n for n in checkpoint if not n.endswith(_SKIPPED) and not (n == _HEAD and tied)}
        complete = needed <= renamed.keys()
    return CheckedWeights(tensors=list(renamed.items()), complete=complete, dropped=dropped)


# ---- reading what was passed ----------------------------------------------------------------------


def _module(weights: Any) -> Any:
    try:
        import torch
    except ImportError:
        return None
    return weights if isinstance(weights, torch.nn.Module) else None


def _raw_pairs(weights: Any, module: Any) -> list[tuple[str, Any]]:
    if module is not None:
        pairs: Iterable[Any] = module.state_dict().items()
    elif isinstance(weights, Mapping):
        pairs = weights.items()
    elif isinstance(weights, Iterable) and not isinstance(weights, (str, bytes)):
        pairs = weights
    else:
        raise WeightsError(f"update_weights() takes a torch module (e.g. a transformers PreTrainedModel), its "
                           f"state_dict(), or (name, tensor) pairs, not {type(weights).__name__}")
    out = []
    for item in pairs:
        if not (isinstance(item, Sequence) and len(item) == 2 and isinstance(item[0], str) and _is_tensor(item[1])):
            raise WeightsError(f"expected (name, tensor) pairs, got {item!r:.80}: pass model.state_dict() or "
                               "model.named_parameters()")
        out.append((item[0], item[1]))
    return out


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "device") and hasattr(value, "detach")


def _checkpoint_name(name: str) -> str:
    """The checkpoint's name for a trainer's: wrapper prefixes and PEFT's inner wrappers removed."""
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix):], True
    name = name.replace("._orig_mod.", ".").replace(".base_layer.", ".")
    return re.sub(r"\.modules_to_save\.[^.]+\.", ".", name)


def _check_merged(module: Any, lora: list[str]) -> None:
    """LoRA tensors may be left out only when a PEFT model says they are merged into its weights."""
    layers = [m for m in module.modules() if hasattr(m, "lora_A") and hasattr(m, "merged")] if module is not None else []
    if layers and all(bool(m.merged) for m in layers):
        return
    where = "this model's" if module is not None else "these"
    raise WeightsError(
        f"{where} weights include {len(lora)} LoRA tensors not merged into the base weights (e.g. {lora[0]!r}), "
        "and the server serves the base architecture. Merge them first: call model.merge_adapter() before "
        "eng.update_weights(model) and model.unmerge_adapter() after it to keep training the adapters (or "
        "model.merge_and_unload() for good). A state dict cannot say whether it is merged: pass the model.")


def _head_is_tied(named: Mapping[str, Any], tied: bool | None, checkpoint: Specs | None) -> bool:
    """Whether to leave `lm_head.weight` out: the served model ties it to the embedding."""
    head = named[_HEAD]
    embedding = next((t for n, t in named.items() if n.endswith(("embed_tokens.weight", "wte.weight"))), None)
    shares = embedding is not None and _same_storage(head, embedding)
    if tied is None:
        tied = shares or (checkpoint is not None and _HEAD not in checkpoint)
    if not tied:
        return False
    if not shares and (embedding is None or not _equal(head, embedding)):
        raise WeightsError(
            "the served model ties its LM head to the input embedding (tie_word_embeddings), and this "
            "lm_head.weight differs from the embedding: the server would keep using the embedding for both. "
            "Tie them in the trainer (model.tie_weights()), or serve an untied checkpoint.")
    return True


def _same_storage(a: Any, b: Any) -> bool:
    try:
        return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.device == b.device)
    except (AttributeError, RuntimeError):
        return False


def _equal(a: Any, b: Any) -> bool:
    import torch

    return a.shape == b.shape and a.device == b.device and bool(torch.equal(a.detach(), b.detach()))


# ---- checks against the served checkpoint --------------------------------------------------------------


def _check_names(named: Mapping[str, Any], checkpoint: Specs) -> None:
    unknown = [n for n in named if n not in checkpoint]
    if not unknown:
        return
    shown = []
    for name in unknown[:_SHOW]:
        close = difflib.get_close_matches(name, list(checkpoint), n=1, cutoff=0.8)
        shown.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    more = f" and {len(unknown) - _SHOW} more" if len(unknown) > _SHOW else ""
    example = next(iter(checkpoint), "model.layers.0.self_attn.q_proj.weight")
    raise WeightsError(
        f"{len(unknown)} of {len(named)} tensors have names the served model does not have: {', '.join(shown)}{more}. "
        f"The server takes the Hugging Face checkpoint's names (e.g. {example!r}): pass the model of the "
        "architecture it serves, or its state_dict(). Nothing was sent.")


def _check_shapes(named: Mapping[str, Any], checkpoint: Specs) -> None:
    wrong = [(n, tuple(t.shape), checkpoint[n][0]) for n, t in named.items() if tuple(t.shape) != checkpoint[n][0]]
    if not wrong:
        return
    shown = ", ".join(f"{n!r} is {list(got)}, the server's is {list(want)}" for n, got, want in wrong[:_SHOW])
    more = f" and {len(wrong) - _SHOW} more" if len(wrong) > _SHOW else ""
    raise WeightsError(
        f"{len(wrong)} tensors have other shapes than the served model's: {shown}{more}. Push weights of the model "
        "the server serves (same config), or start an Engine on this model's checkpoint. Nothing was sent "
        "(SGLang would fail an assert in its scheduler and stop).")
