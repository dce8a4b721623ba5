"""Weights sent as tensors (`/update_weights_from_tensor`): decoding them and loading them by name.

Owns: decoding one TP rank's `serialized_named_tensors` entry as SGLang 0.5.17 does (base64, then
an unpickler that loads only the classes SGLang's `SafeUnpickler` allows: builtins, collections,
copyreg, functools, itertools, operator, types, weakref, torch, multiprocessing's reducers, peft,
transformers, huggingface_hub; `eval`, `exec`, `compile`, `os.system`, `subprocess` and code objects
refused), the load formats (None or "direct": a list of (name, tensor); "flattened_bucket": one
uint8 tensor and per-tensor metadata, SGLang's `FlattenedTensorBucket` layout), and loading the
tensors into a transformers model in place the way SGLang's llama/qwen2 `load_weights` treat
names: `lm_head.weight` skipped when the model ties it to the embedding, rotary buffers skipped, an
unknown name logged ("Parameter ... not found in params_dict") and skipped. Unlike SGLang, whose
scheduler dies on a shape mismatch (an assert in the weight loader), every shape is checked before
anything is copied and a mismatch is refused. Tensors arrive by value: this backend cannot map a
client's CUDA memory. Knows nothing about HTTP, the scheduler thread or the prefix cache.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import pickle
from typing import Any

import torch

__all__ = ["TensorPayloadError", "decode_payload", "load_named_tensors", "named_tensors"]

logger = logging.getLogger("rlgen.cpu_server")

# SGLang's SafeUnpickler (sglang/srt/utils/common.py), the allow-list as module prefixes.
_ALLOWED_PREFIXES = (
    "builtins.", "collections.", "copyreg.", "functools.", "itertools.", "operator.", "types.", "weakref.",
    "torch.", "multiprocessing.resource_sharer.", "multiprocessing.reduction.", "pickletools.",
    "peft.", "transformers.", "huggingface_hub.",
    # SGLang's own classes (not importable here: a payload naming them fails to load)
    "sglang.srt.weight_sync.tensor_bucket.", "sglang.srt.model_executor.model_runner.",
    "sglang.srt.model_executor.model_runner_components.weight_updater.", "sglang.srt.layers.", "sglang.srt.utils.",
    "sglang.srt.disaggregation.", "sglang.srt.managers.", "torch_npu.",
)
_DENIED = {
    ("builtins", "eval"), ("builtins", "exec"), ("builtins", "compile"), ("os", "system"),
    ("subprocess", "Popen"), ("subprocess", "run"), ("codecs", "decode"), ("types", "CodeType"),
    ("types", "FunctionType"),
}
_SKIPPED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


class TensorPayloadError(ValueError):
    """A payload that cannot be decoded or does not have a known load format's shape."""


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _DENIED or not (module + ".").startswith(_ALLOWED_PREFIXES):
            raise pickle.UnpicklingError(
                f"Blocked unsafe class loading ({module}.{name}), to prevent exploitation of CVE-2025-10164")
        return super().find_class(module, name)


def decode_payload(entry: str) -> Any:
    """One rank's entry (base64 of a pickle) as the object it holds."""
    try:
        data = base64.b64decode(entry, validate=True)
    except (binascii.Error, ValueError) as e:
        raise TensorPayloadError(f"serialized_named_tensors is not base64: {e}") from e
    try:
        return _SafeUnpickler(io.BytesIO(data)).load()
    except Exception as e:
        raise TensorPayloadError(f"cannot deserialize the tensors ({type(e).__name__}: {e}); this backend takes "
                                 "CPU tensors pickled by value, not CUDA IPC handles") from e


def named_tensors(payload: Any, load_format: str | None) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of a decoded payload under `load_format`."""
    if load_format == "flattened_bucket":
        if not isinstance(payload, dict) or not {"flattened_tensor", "metadata"} <= payload.keys():
            raise TensorPayloadError("a flattened_bucket payload is {'flattened_tensor': ..., 'metadata': [...]}")
        flat = payload["flattened_tensor"]
        return [(str(m.name), flat[m.start_idx:m.end_idx].view(m.dtype).reshape(m.shape)) for m in payload["metadata"]]
    if load_format not in (None, "direct"):
        raise TensorPayloadError(f"Unknown load_format={load_format}")
    pairs = payload if isinstance(payload, (list, tuple)) else None
    if pairs is None or not all(isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str)
                                and isinstance(p[1], torch.Tensor) for p in pairs):
        raise TensorPayloadError("the payload is a list of (name, tensor) pairs")
    return [(str(name), tensor) for name, tensor in pairs]


def load_named_tensors(model: Any, tensors: list[tuple[str, torch.Tensor]]) -> tuple[bool, str]:
    """Copy `tensors` into `model`'s weights by checkpoint name: (success, message).

    Checked before any copy: a refused update leaves the old weights. Unknown names are skipped
    with a warning in the log, as SGLang does.
    """
    state = model.state_dict(keep_vars=True)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    targets: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name, tensor in tensors:
        if name.endswith(_SKIPPED) or (tied and "lm_head.weight" in name):
            continue
        target = state.get(name)
        if target is None:
            logger.warning(f"Parameter {name} not found in params_dict")
            continue
        if tuple(target.shape) != tuple(tensor.shape):
            return False, (f"Failed to update weights: shape mismatch for {name}: the model's is {list(target.shape)}, "
                           f"the tensor's {list(tensor.shape)}.")
        targets.append((target, tensor))
    with torch.no_grad():
        for target, tensor in targets:
            target.data.copy_(tensor)
    return True, "Success"
