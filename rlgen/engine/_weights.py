"""Changing the served weights: from a checkout on disk, or from the notebook's tensors.

Owns: `from_disk` (`update_weights_from_disk`: one POST, retried while the server answers 5xx or
drops the connection; behind a router every worker loads it), `reload_from_disk` (the weights
last loaded from disk again, under the version they had: after a resume, or under a push that
does not cover every tensor), and `from_tensors` (`update_weights`: the checks before anything is
sent: names and shapes against the served checkpoint, where the tensors are against where the
server can read them, a router or data parallelism refused; the buckets sent one request each
with retries and a progress line, the prefix cache flushed and the version set by the last;
inside `paused()`, the weights' memory taken back first). The requests that change weights run
inside the `pausing()` context the Engine hands in (`_pause.Pauses.pausing`: the server's
generation paused around them, the prefix cache flushed only where the pause allows it), after
every check. Each tells `ServedWeights` what the server now serves, and counts one more version
index for every change of the served weights. Knows nothing about generation, scoring,
checkpoint names or how tensors are serialized: `client._state_dict` and `client._tensors` do those.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..client._state_dict import checked_weights
from ..client._tensors import NamedTensor, Transport, bucket_body, buckets, device_uuid, tensor_nbytes
from ..core import _loop
from ..core._errors import RequestError, ServerRequestError, WeightsError
from ..server._handle import ServerHandle
from ..server._process_tree import gpu_uuids_of
from ..server._weights import checkpoint_tensors, ties_word_embeddings
from ._connection import Connection
from ._memory import ServerControl
from ._pause import Ticket
from ._served import ServedWeights
from ._startup import is_loopback

if TYPE_CHECKING:
    import torch

__all__ = ["Pausing", "collect_ipc", "from_disk", "from_tensors", "reload_from_disk", "server_gpus", "uuid_key"]

# What an update runs its requests in: `_pause.Pauses.pausing` bound to a mode (or no pause).
Pausing = Callable[[], AbstractContextManager[Ticket]]


def _no_pause() -> AbstractContextManager[Ticket]:
    return contextlib.nullcontext(Ticket(None, flush_cache=True))

_MIB = 1 << 20
# Default bucket sizes. By CUDA IPC a bucket is handles, not bytes: 512 MiB bounds only a flattened
# copy. By value (the CPU backend) every byte is pickled, encoded, sent and parsed, and smaller
# requests cost less CPU in all (docs/decisions.md, "update_weights' buckets by value").
_IPC_BUCKET_MB, _VALUE_BUCKET_MB = 512, 64
_DISK_HINT = ("save the weights where the server can read them and load them from there: "
              "model.save_pretrained(path); eng.update_weights_from_disk(path)")


# -- from disk -----------------------------------------------------------------------------------------
def from_disk(conn: Connection, control: ServerControl, weights: ServedWeights, server: ServerHandle,
              path: str | os.PathLike[str], *, weight_version: str | None, retries: int, backoff_s: float,
              pausing: Pausing = _no_pause) -> str:
    """`Engine.update_weights_from_disk`: the checkout at `path` loaded (inside `pausing()`);
    returns the new weight version, and counts one more version index."""
    conn.check_ready()
    version = weights.next_version(weight_version, prefix=Path(path).name)
    with pausing() as ticket:
        body = {"model_path": str(path), "weight_version": version, "flush_cache": ticket.flush_cache}
        if conn.behind_router:  # every worker, retried per worker; a failure names the worker
            result = control.post("/update_weights_from_disk", body, what=f"update_weights_from_disk({str(path)!r})",
                                  retries=retries, backoff_s=backoff_s)
        else:
            result = _post_retried(conn, server, body, path, retries=retries, backoff_s=backoff_s)
        if isinstance(result, dict) and result.get("success") is False:
            raise ServerRequestError(f"update_weights_from_disk failed: {result.get('message')}", status=400)
        info = _loop.run_sync(conn.client.get_info("model", timeout=30))
        weights.loaded_from_disk(str(path), info.get("weight_version", version))
        weights.advance()
    return str(weights.version)


def _post_retried(conn: Connection, server: ServerHandle, body: dict[str, Any], path: str | os.PathLike[str], *,
                  retries: int, backoff_s: float) -> Any:
    """POST /update_weights_from_disk to the server, retrying transient failures."""
    for attempt in range(retries + 1):
        try:
            return _loop.run_sync(conn.client.post("/update_weights_from_disk", body))
        except ServerRequestError as err:
            if err.status < 500 or attempt == retries:
                raise ServerRequestError(f"update_weights_from_disk({str(path)!r}) failed: {err.body}",
                                         status=err.status, body=err.body) from None
        except RequestError:
            if attempt == retries or not server.alive():
                raise
        time.sleep(backoff_s * 2**attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


def reload_from_disk(control: ServerControl, weights: ServedWeights, what: str, *, flush_cache: bool = True) -> None:
    """Load the weights this Engine last loaded from disk again, under the version they had (one
    more version index: the served weights changed back)."""
    control.post("/update_weights_from_disk",
                 {"model_path": weights.disk_path, "weight_version": weights.restore_version(),
                  "flush_cache": flush_cache}, what=what)
    weights.restored()
    weights.advance()


# -- from tensors --------------------------------------------------------------------------------------
def from_tensors(conn: Connection, control: ServerControl, weights: ServedWeights, server: ServerHandle,
                 tensors: torch.nn.Module | Mapping[str, Any] | Iterable[tuple[str, Any]], *, url: str,
                 weight_version: str | None, bucket_mb: float | None, flatten: bool, retries: int,
                 backoff_s: float, progress: bool | None, pausing: Pausing = _no_pause) -> str:
    """`Engine.update_weights`: the trainer's tensors checked, then pushed inside `pausing()` (a
    refusal pauses nothing); returns the new weight version, and counts one more version index
    (also for a push that failed after some of its requests: the weights changed)."""
    conn.check_ready()
    _check_options(bucket_mb=bucket_mb, flatten=flatten, retries=retries, backoff_s=backoff_s)
    if conn.behind_router:
        raise WeightsError("update_weights() pushes tensors to one server, and this Engine talks to a router: "
                           f"{_DISK_HINT} (every worker loads it)")
    path = weights.disk_path
    checked = checked_weights(tensors, checkpoint=checkpoint_tensors(path), tied=ties_word_embeddings(path))
    transport = _transport(conn, server, checked.tensors, url=url, flatten=flatten)
    version = weights.next_version(weight_version, prefix="tensors")
    if bucket_mb is None:
        bucket_mb = _IPC_BUCKET_MB if transport is Transport.IPC else _VALUE_BUCKET_MB
    with pausing() as ticket:
        if "weights" in control.released:  # inside paused(): the memory back first (SGLang would write unmapped memory)
            control.resume(["weights"])
            if not checked.complete:
                reload_from_disk(control, weights, "update_weights() reloading the weights it does not replace",
                                 flush_cache=ticket.flush_cache)
        # A released KV cache was flushed with it: flushing again would touch released memory.
        flush = "kv_cache" not in control.released and ticket.flush_cache
        _push(conn, weights, server, checked.tensors, transport=transport, flatten=flatten, flush=flush,
              bucket_bytes=max(1, int(bucket_mb * _MIB)), version=version, retries=retries, backoff_s=backoff_s,
              progress=progress)
        if transport is Transport.IPC:
            collect_ipc()
        weights.pushed_tensors(version)
        info = _loop.run_sync(conn.client.get_info("model", timeout=30))
        weights.version = info.get("weight_version", version)
        weights.advance()
    return str(weights.version)


def _push(conn: Connection, weights: ServedWeights, server: ServerHandle, tensors: Sequence[NamedTensor], *,
          transport: Transport, flatten: bool, flush: bool, bucket_bytes: int, version: str, retries: int,
          backoff_s: float, progress: bool | None) -> None:
    """The buckets, one request each, with a progress line; the last flushes the cache and sets the version."""
    from ..core._progress import ProgressLine

    groups = buckets(tensors, bucket_bytes)
    total_mib = sum(tensor_nbytes(t) for _, t in tensors) / _MIB
    tp_size = int(conn.server_info.get("tp_size") or 1)
    with ProgressLine("update_weights", total=len(tensors), unit="tensor", show=conn.show(progress)) as line:
        for i, group in enumerate(groups):
            last = i == len(groups) - 1
            try:
                _send_bucket(conn, server, group, transport=transport, flatten=flatten, tp_size=tp_size,
                             flush_cache=flush and last, weight_version=version if last else None,
                             retries=retries, backoff_s=backoff_s)
            except BaseException as err:  # a request, or making one (memory), or Ctrl-C
                if i:
                    weights.pushed_tensors(f"{version} (partial)")
                    weights.advance()  # some of the weights changed: a version of their own
                if isinstance(err, RequestError):
                    raise _failed_at(err, i, len(groups)) from err
                raise
            line.advance(len(group))
        line.close(totals=f"{len(tensors):,} tensors · {total_mib:,.0f} MiB · "
                          f"{len(groups)} request{'s' if len(groups) != 1 else ''} ({transport.value})")


def _transport(conn: Connection, server: ServerHandle, tensors: Sequence[NamedTensor], *, url: str,
               flatten: bool) -> Transport:
    """By value to the CPU backend; CUDA IPC to SGLang, once the tensors are where it can map them."""
    devices = sorted({t.device for _, t in tensors}, key=str)
    meta = [d for d in devices if d.type == "meta"]
    if meta:
        raise WeightsError("some tensors are on the meta device and hold no values: load the model's weights "
                           "(e.g. from_pretrained without device_map='meta') before pushing them")
    if conn.cpu_backend:
        return Transport.VALUE
    host = urlsplit(url).hostname or ""
    if not _on_this_machine(host):
        raise WeightsError(f"the server at {url} is on another machine, and SGLang reads pushed tensors from "
                           f"GPU memory on its own machine (CUDA IPC): {_DISK_HINT}")
    if int(conn.server_info.get("dp_size") or 1) > 1 and not conn.server_info.get("enable_dp_attention"):
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
    gpus = server_gpus(server)
    if gpus is not None:
        wrong = [d for d in devices if uuid_key(device_uuid(d.index or 0)) not in gpus]
        if wrong:
            raise WeightsError(
                f"the tensors are on {', '.join(map(str, wrong))}, and the server runs on another GPU "
                f"({_local_names(gpus)}): move the model to the server's GPU (model.to(...)), start the "
                f"Engine on the trainer's GPU, or {_DISK_HINT}")
    return Transport.IPC


def server_gpus(server: ServerHandle) -> set[str] | None:
    """The UUIDs of the GPUs the server's processes use, where this machine can tell (an owned or
    kept server, a driver that shows processes); None otherwise."""
    pids = server.pids()
    return gpu_uuids_of(pids) if pids else None


def _send_bucket(conn: Connection, server: ServerHandle, group: Sequence[NamedTensor], *, transport: Transport,
                 flatten: bool, tp_size: int, flush_cache: bool, weight_version: str | None, retries: int,
                 backoff_s: float) -> None:
    """One bucket's request, retried on 5xx and lost connections (serialized again each time:
    torch counts each IPC serialization as one consumer)."""
    for attempt in range(retries + 1):
        body = bucket_body(group, transport=transport, flatten=flatten, tp_size=tp_size,
                           flush_cache=flush_cache, weight_version=weight_version)
        try:
            result = _loop.run_sync(conn.client.post("/update_weights_from_tensor", body))
        except ServerRequestError as err:
            if err.status < 500 or attempt == retries:
                raise
        except RequestError:
            if attempt == retries or not server.alive():
                raise
        else:
            if isinstance(result, dict) and result.get("success") is False:
                raise ServerRequestError(f"/update_weights_from_tensor failed: {result.get('message')}",
                                         status=400, body=str(result.get("message")))
            return
        finally:
            del body
        time.sleep(backoff_s * 2**attempt)


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
