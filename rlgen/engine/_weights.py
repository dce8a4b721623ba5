"""Weights from the notebook: `Engine.update_weights` pushes a trainer's tensors to the server, no disk.

Owns: `update_weights` (the checks before anything is sent: names and shapes against the served
checkpoint, where the tensors are against where the server can read them, a router or data
parallelism refused; the buckets sent one request each with retries and a progress line, the cache
flushed and the version set by the last; inside `paused()`, the weights' memory taken back first
and, when the push does not cover every tensor, the old weights reloaded under it), and the state
a push leaves (the version rows record, no disk path or content hash for records and the cache).
Knows nothing about generation, scoring, checkpoint names or how tensors are serialized:
`client._state_dict` and `client._tensors` do those.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..client._state_dict import checked_weights
from ..client._tensors import NamedTensor, Transport, bucket_body, buckets, device_uuid, tensor_nbytes
from ..core import _loop
from ..core._errors import RequestError, ServerRequestError, WeightsError
from ..server._process_tree import gpu_uuids_of
from ..server._weights import WeightsHash, checkpoint_tensors, ties_word_embeddings
from ._control import ControlMixin
from ._startup import is_loopback

if TYPE_CHECKING:
    import torch

__all__ = ["WeightsMixin", "collect_ipc", "uuid_key"]

_MIB = 1 << 20
# Default bucket sizes. By CUDA IPC a bucket is handles, not bytes: 512 MiB bounds only a flattened
# copy. By value (the CPU backend) every byte is pickled, encoded, sent and parsed, and smaller
# requests cost less CPU in all (docs/decisions.md, "update_weights' buckets by value").
_IPC_BUCKET_MB, _VALUE_BUCKET_MB = 512, 64
_DISK_HINT = ("save the weights where the server can read them and load them from there: "
              "model.save_pretrained(path); eng.update_weights_from_disk(path)")


class WeightsMixin(ControlMixin):
    """`update_weights` of `Engine` (mixed into it)."""

    def update_weights(self, weights: torch.nn.Module | Mapping[str, Any] | Iterable[tuple[str, Any]], *,
                       weight_version: str | None = None, bucket_mb: float | None = None, flatten: bool = False,
                       retries: int = 3, backoff_s: float = 1.0, progress: bool | None = None) -> str:
        """Load the trainer's weights into the server from memory; returns the new weight version.

        `weights`: a transformers `PreTrainedModel` (or any torch module whose `state_dict()` has
        the checkpoint's names), its `state_dict()`, or (name, tensor) pairs; a subset of the
        tensors updates those only. Wrapper names are undone (torch.compile, DDP, PEFT); LoRA
        weights must be merged first (`model.merge_adapter()`); a head tied to the embedding is
        not sent. Names and shapes are checked against the served checkpoint before anything is
        sent (WeightsError: nothing changed).

        On SGLang the tensors stay where they are: the server maps their GPU memory (CUDA IPC),
        so they must be on the server's GPU, in this machine; otherwise save them and use
        `update_weights_from_disk`. The CPU backend gets them by value. Don't change them until
        the call returns.

        `bucket_mb`: tensors per request, by size (None: 512 MiB by CUDA IPC, 64 MiB by value): what
        a request costs in extra memory (by value:
        CPU copies and their encoding; `flatten=True`: one flat copy of the bucket on the GPU,
        SGLang's "flattened_bucket" format, one IPC handle per bucket instead of one per tensor).
        The prefix cache is flushed, and `weight_version` (default "tensors@<n>") set, with the
        last request; rows record it. A failure after some requests leaves a mix of weights (the
        message says so). Retries transient failures (5xx, lost connections) like
        `update_weights_from_disk`. Inside `with eng.paused():` the weights' memory comes back
        first, and the old weights are reloaded from disk under a push that does not cover
        every tensor; the rest of the memory comes back when the block ends.
        """
        self._check_ready()
        _check_options(bucket_mb=bucket_mb, flatten=flatten, retries=retries, backoff_s=backoff_s)
        if self._behind_router:
            raise WeightsError("update_weights() pushes tensors to one server, and this Engine talks to a router: "
                               f"{_DISK_HINT} (every worker loads it)")
        path = self._weights_path or self.model_path
        checked = checked_weights(weights, checkpoint=checkpoint_tensors(path), tied=ties_word_embeddings(path))
        transport = self._transport(checked.tensors, flatten=flatten)
        tp_size = int(self._server_info.get("tp_size") or 1)
        self._weight_updates += 1
        version = weight_version or f"tensors@{self._weight_updates}"

        if "weights" in self._released:  # inside paused(): the memory back first (SGLang would write unmapped memory)
            self._resume(["weights"])
            if not checked.complete:
                self._reload_disk_weights("update_weights() reloading the weights it does not replace")
        # A released KV cache was flushed with it: flushing again would touch released memory.
        flush = "kv_cache" not in self._released
        if bucket_mb is None:
            bucket_mb = _IPC_BUCKET_MB if transport is Transport.IPC else _VALUE_BUCKET_MB
        groups = buckets(checked.tensors, max(1, int(bucket_mb * _MIB)))
        total_mib = sum(tensor_nbytes(t) for _, t in checked.tensors) / _MIB
        from ..core._progress import ProgressLine

        show = self._progress if progress is None else progress
        with ProgressLine("update_weights", total=len(checked.tensors), unit="tensor", show=show) as line:
            for i, group in enumerate(groups):
                last = i == len(groups) - 1
                try:
                    self._send_bucket(group, transport=transport, flatten=flatten, tp_size=tp_size,
                                      flush_cache=flush and last, weight_version=version if last else None,
                                      retries=retries, backoff_s=backoff_s)
                except BaseException as err:  # a request, or making one (memory), or Ctrl-C
                    if i:
                        self._mark_pushed(f"{version} (partial)")
                    if isinstance(err, RequestError):
                        raise _failed_at(err, i, len(groups)) from err
                    raise
                line.advance(len(group))
            line.close(totals=f"{len(checked.tensors):,} tensors · {total_mib:,.0f} MiB · "
                              f"{len(groups)} request{'s' if len(groups) != 1 else ''} ({transport.value})")
        if transport is Transport.IPC:
            collect_ipc()
        self._mark_pushed(version)
        info = _loop.run_sync(self._client.get_info("model", timeout=30))
        self._weight_version = info.get("weight_version", version)
        return str(self._weight_version)

    # -- where the tensors can go --------------------------------------------------------------------
    def _transport(self, tensors: Sequence[NamedTensor], *, flatten: bool) -> Transport:
        """By value to the CPU backend; CUDA IPC to SGLang, once the tensors are where it can map them."""
        devices = sorted({t.device for _, t in tensors}, key=str)
        meta = [d for d in devices if d.type == "meta"]
        if meta:
            raise WeightsError("some tensors are on the meta device and hold no values: load the model's weights "
                               "(e.g. from_pretrained without device_map='meta') before pushing them")
        if self._server_info.get("rlgen_backend") == "cpu":
            return Transport.VALUE
        host = urlsplit(self.url).hostname or ""
        if not _on_this_machine(host):
            raise WeightsError(f"the server at {self.url} is on another machine, and SGLang reads pushed tensors from "
                               f"GPU memory on its own machine (CUDA IPC): {_DISK_HINT}")
        if int(self._server_info.get("dp_size") or 1) > 1 and not self._server_info.get("enable_dp_attention"):
            raise WeightsError("SGLang takes tensors only with dp_size 1 (or DP attention): " + _DISK_HINT)
        elsewhere = [d for d in devices if d.type != "cuda"]
        if elsewhere:
            names = [n for n, t in tensors if t.device.type != "cuda"]
            raise WeightsError(
                f"{len(names)} tensors are on {', '.join(map(str, elsewhere))} (e.g. {names[0]!r}), and SGLang reads "
                "pushed tensors from its GPU's memory (CUDA IPC): move the model to the server's GPU first "
                f"(model.to('cuda')), or {_DISK_HINT}")
        if flatten and len(devices) > 1:
            raise WeightsError(f"flatten=True joins each bucket into one tensor, and these are on {len(devices)} GPUs "
                               f"({', '.join(map(str, devices))}): put them on one, or pass flatten=False")
        server_gpus = self._server_gpus()
        if server_gpus is not None:
            wrong = [d for d in devices if uuid_key(device_uuid(d.index or 0)) not in server_gpus]
            if wrong:
                raise WeightsError(
                    f"the tensors are on {', '.join(map(str, wrong))}, and the server runs on another GPU "
                    f"({_local_names(server_gpus)}): move the model to the server's GPU (model.to(...)), start the "
                    f"Engine on the trainer's GPU, or {_DISK_HINT}")
        return Transport.IPC

    def _server_gpus(self) -> set[str] | None:
        """The UUIDs of the GPUs the server's processes use, where this machine can tell (an owned or
        kept server, a driver that shows processes); None otherwise."""
        if self._server is not None:
            pids = self._server.pids()
        elif self._kept is not None:
            pids = _tree_pids(self._kept.record.pid)
        else:
            return None
        return gpu_uuids_of(pids) if pids else None

    # -- sending ----------------------------------------------------------------------------------
    def _send_bucket(self, group: Sequence[NamedTensor], *, transport: Transport, flatten: bool, tp_size: int,
                     flush_cache: bool, weight_version: str | None, retries: int, backoff_s: float) -> None:
        """One bucket's request, retried on 5xx and lost connections (serialized again each time:
        torch counts each IPC serialization as one consumer)."""
        for attempt in range(retries + 1):
            body = bucket_body(group, transport=transport, flatten=flatten, tp_size=tp_size,
                               flush_cache=flush_cache, weight_version=weight_version)
            try:
                result = _loop.run_sync(self._client.post("/update_weights_from_tensor", body))
            except ServerRequestError as err:
                if err.status < 500 or attempt == retries:
                    raise
            except RequestError:
                if attempt == retries or not self._server_alive():
                    raise
            else:
                if isinstance(result, dict) and result.get("success") is False:
                    raise ServerRequestError(f"/update_weights_from_tensor failed: {result.get('message')}",
                                             status=400, body=str(result.get("message")))
                return
            finally:
                del body
            time.sleep(backoff_s * 2**attempt)

    def _mark_pushed(self, version: str) -> None:
        """The server now serves weights that are on no disk: no path or content hash for records and
        the cache; a later reload from disk brings back the version the disk weights had."""
        if self._weights_pushed is None:
            self._disk_version = self._weight_version
        self._weights_pushed = version
        self._weights = WeightsHash(None)


def _check_options(*, bucket_mb: float | None, flatten: bool, retries: int, backoff_s: float) -> None:
    if bucket_mb is not None and (isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float))
                                  or not bucket_mb > 0):
        raise ValueError(f"bucket_mb must be a number of MiB > 0 or None (by transport), got {bucket_mb!r}")
    if not isinstance(flatten, bool):
        raise TypeError(f"flatten must be True or False, got {flatten!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    if isinstance(backoff_s, bool) or not isinstance(backoff_s, (int, float)) or backoff_s < 0:
        raise ValueError(f"backoff_s must be a number of seconds >= 0, got {backoff_s!r}")


def _failed_at(err: RequestError, index: int, count: int) -> RequestError:
    """`err` with where the push stopped and what the server holds now."""
    where = f"request {index + 1} of {count}" if count > 1 else "its request"
    state = ("nothing was loaded, the server's weights are unchanged" if index == 0 else
             f"{index} of them were loaded, so the server now serves a mix of old and new weights: push them again, "
             "or load a checkpoint with update_weights_from_disk(path)")
    message = f"update_weights() failed at {where} ({err}); {state}"
    if isinstance(err, ServerRequestError):
        return ServerRequestError(message, status=err.status, body=err.body)
    return type(err)(message)


def _on_this_machine(host: str) -> bool:
    """Whether `host` names this machine (loopback, or one of its interfaces' addresses)."""
    if not host or is_loopback(host):
        return True
    import socket

    import psutil

    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False
    local = {a.address.split("%")[0] for nic in psutil.net_if_addrs().values() for a in nic}
    return bool(addresses) and addresses <= local


def _tree_pids(pid: int) -> list[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root.pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []


def _local_names(uuids: set[str]) -> str:
    """The server's GPUs as this process numbers them (cuda:N), or by UUID where it cannot see them."""
    import torch

    visible = {uuid_key(device_uuid(i)): f"cuda:{i}" for i in range(torch.cuda.device_count())}
    return ", ".join(sorted(visible.get(u, f"GPU-{u}") for u in uuids))


def uuid_key(uuid: str) -> str:
    """A GPU UUID as `gpu_uuids_of` gives it: lowercase, without nvidia-smi's "GPU-" prefix."""
    return uuid.lower().removeprefix("gpu-")


def collect_ipc() -> None:
    """Free the memory of IPC-shared copies the server has let go of (torch keeps them until then)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.ipc_collect()  # type: ignore[no-untyped-call]
