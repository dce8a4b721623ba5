"""Named tensors as the bodies of SGLang's `/update_weights_from_tensor`, one bucket per request.

Owns: splitting named tensors into buckets of at most `bucket_bytes` (a tensor larger than that is a
bucket of its own), and one bucket as the request body SGLang 0.5.17 reads
(`UpdateWeightsFromTensorReqInput`: `serialized_named_tensors`, one base64 string per TP rank, each
what `MultiprocessingSerializer.serialize` makes of `[(name, tensor), ...]`; `load_format`,
`flush_cache`, `weight_version`), in two transports:

- CUDA IPC (`Transport.IPC`): torch's `ForkingPickler` writes each CUDA tensor as a handle to its
  GPU memory, which the server maps: nothing is copied. The device goes as its UUID, the form
  SGLang's `monkey_patch_torch_reductions` reads (it patches the receiving side before it
  deserializes), so the server finds the GPU whatever its CUDA_VISIBLE_DEVICES. Only classes under
  `torch.` and builtins travel, which SGLang's SafeUnpickler allows.
- By value (`Transport.VALUE`): CPU copies pickled with their bytes (plain `pickle`, never the
  shared-memory handles ForkingPickler would write for CPU tensors), for a server that cannot map
  this process's memory: the CPU backend.

A bucket goes either as the list of (name, tensor) (`load_format` None) or as one flattened bucket
(`load_format="flattened_bucket"`: one uint8 tensor plus per-tensor metadata, SGLang's
`FlattenedTensorBucket` layout, the metadata as `types.SimpleNamespace` with the same fields since
rlgen does not import sglang): one handle per bucket instead of one per tensor, for one copy of the
bucket. The extra memory a bucket costs is what `bucket_bytes` bounds: the flattened copy, CPU
copies and their pickled and base64 forms (by value), gathered DTensors. Knows nothing about models,
checkpoint names, servers or HTTP.
"""

from __future__ import annotations

import base64
import enum
import io
import pickle
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["NamedTensor", "Transport", "bucket_body", "buckets", "device_uuid", "serialized_per_rank", "tensor_nbytes"]

NamedTensor = tuple[str, Any]  # (checkpoint name, torch.Tensor)

# Where torch's reduce_tensor puts a CUDA tensor's device index among rebuild_cuda_tensor's
# arguments (SGLang's patch_torch._REDUCE_TENSOR_ARG_DEVICE_INDEX: unchanged for years).
_DEVICE_ARG = 6


class Transport(enum.Enum):
    IPC = "cuda-ipc"     # the server maps this process's GPU memory (same machine, its GPU)
    VALUE = "by-value"   # the tensors' bytes travel in the request (the CPU backend)


def tensor_nbytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def buckets(named: Sequence[NamedTensor], bucket_bytes: int) -> list[list[NamedTensor]]:
    """Consecutive runs of `named` of at most `bucket_bytes` each (a larger tensor alone)."""
    out: list[list[NamedTensor]] = []
    current: list[NamedTensor] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor_nbytes(tensor)
        if current and size + nbytes > bucket_bytes:
            out.append(current)
            current, size = [], 0
        current.append((name, tensor))
        size += nbytes
    if current:
        out.append(current)
    return out


def bucket_body(bucket: Sequence[NamedTensor], *, transport: Transport, flatten: bool, tp_size: int,
                flush_cache: bool, weight_version: str | None) -> dict[str, Any]:
    """The JSON body of one `/update_weights_from_tensor` request carrying `bucket`.

    Serialized once per TP rank (each rank opens its own IPC handles, and torch counts each
    serialization as one consumer). Call it again for a retry rather than re-sending a body.
    """
    tensors = [(name, _prepared(tensor, transport)) for name, tensor in bucket]
    payload: Any = _flattened(tensors) if flatten else tensors
    return {
        "serialized_named_tensors": _serialized(payload, transport=transport, tp_size=tp_size),
        "load_format": "flattened_bucket" if flatten else None,
        "flush_cache": flush_cache,
        "weight_version": weight_version,
    }


def serialized_per_rank(tensors: dict[str, Any], *, transport: Transport, tp_size: int) -> list[str]:
    """A dict of named tensors as `serialized_named_tensors` (the form SGLang's
    `/load_lora_adapter_from_tensors` reads): base64, one copy per TP rank."""
    return _serialized({name: _prepared(t, transport) for name, t in tensors.items()}, transport=transport,
                       tp_size=tp_size)


def _serialized(payload: Any, *, transport: Transport, tp_size: int) -> list[str]:
    if transport is Transport.IPC:
        return [_b64(_ipc_dumps(payload)) for _ in range(tp_size)]
    one = _b64(pickle.dumps(payload, protocol=4))
    return [one] * tp_size


def device_uuid(index: int) -> str:
    """A CUDA device's UUID as torch writes it (SGLang matches it against its own devices')."""
    import torch

    return str(torch.cuda.get_device_properties(index).uuid)


# ---- preparing and serializing -------------------------------------------------------------------


def _prepared(tensor: Any, transport: Transport) -> Any:
    """The tensor as it travels: detached, a DTensor gathered; by value, a CPU tensor holding only
    its own bytes (a view of a larger storage would pickle the whole storage)."""
    if hasattr(tensor, "full_tensor"):  # a DTensor (FSDP2): the full tensor, gathered for this bucket
        tensor = tensor.full_tensor()
    tensor = tensor.detach()
    if transport is Transport.VALUE:
        tensor = tensor.to("cpu")
        if not tensor.is_contiguous() or tensor.untyped_storage().nbytes() != tensor_nbytes(tensor):
            tensor = tensor.contiguous().clone()
    return tensor


def _flattened(tensors: Sequence[NamedTensor]) -> dict[str, Any]:
    """SGLang's FlattenedTensorBucket as its deserializer reads it: {"flattened_tensor": uint8,
    "metadata": [name, shape, dtype, start_idx, end_idx, numel (bytes)]}."""
    import torch

    parts, metadata, start = [], [], 0
    for name, tensor in tensors:
        flat = tensor.contiguous().view(-1).view(torch.uint8)
        parts.append(flat)
        metadata.append(types.SimpleNamespace(name=name, shape=tensor.shape, dtype=tensor.dtype, start_idx=start,
                                              end_idx=start + flat.numel(), numel=flat.numel()))
        start += flat.numel()
    return {"flattened_tensor": torch.cat(parts), "metadata": metadata}


def _ipc_dumps(obj: Any) -> bytes:
    """`MultiprocessingSerializer.serialize(obj)` as SGLang makes it (ForkingPickler, torch's
    reducers), each CUDA device written as its UUID."""
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing

    buf = io.BytesIO()
    pickler = ForkingPickler(buf)
    for cls in (torch.Tensor, torch.nn.Parameter):
        pickler.dispatch_table[cls] = _reduce_cuda_tensor
    pickler.dump(obj)
    return buf.getvalue()


def _reduce_cuda_tensor(tensor: Any) -> tuple[Any, tuple[Any, ...]]:
    from torch.multiprocessing import reductions

    if not tensor.is_cuda:  # ForkingPickler would hand a CPU tensor over as a file descriptor
        raise ValueError(f"CUDA IPC carries CUDA tensors only, not one on {tensor.device}")
    rebuild, args = reductions.reduce_tensor(tensor)  # type: ignore[no-untyped-call]
    if isinstance(args[_DEVICE_ARG], int):  # (already a UUID where SGLang's patch runs in this process)
        args = (*args[:_DEVICE_ARG], device_uuid(args[_DEVICE_ARG]), *args[_DEVICE_ARG + 1:])
    return rebuild, args


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")

