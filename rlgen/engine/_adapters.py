"""Loading LoRA adapters into the server: `Engine.load_adapter` and `unload_adapter`.

Owns, as functions of the Engine's parts: loading an adapter (a PEFT directory through `/load_lora_adapter`, or a PEFT model in memory
through `/load_lora_adapter_from_tensors`: by CUDA IPC when its tensors are on the server's GPU,
else by value; a name already loaded is replaced, also one a kept server held before this Engine
attached), unloading it, the checks before anything is sent (rank and modules within what the
server was started for), and the server's refusals as AdapterError. Knows nothing about how
tensors are serialized or what an adapter's files hold (`client._lora`), or about which adapter a
call's prompts use (`_adapter_choice`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any

from ..client import _lora
from ..client._tensors import Transport, device_uuid
from ..core._errors import AdapterError, ServerRequestError
from ..server._handle import ServerHandle
from ._adapter_choice import Adapter, AdapterSet
from ._connection import Connection
from ._memory import ServerControl
from ._served import ServedWeights
from ._weights import Pausing, collect_ipc, server_gpus, uuid_key

__all__ = ["load_adapter", "unload_adapter"]

# What SGLang 0.5.17 (LoRAManager.validate_new_adapter) and the CPU backend say when a name is taken.
_ALREADY_LOADED = "already loaded"


def load_adapter(conn: Connection, control: ServerControl, adapters: AdapterSet, server: ServerHandle, name: str,
                 adapter: Any, *, adapter_name: str, pinned: bool, weights: ServedWeights | None = None,
                 pausing: Pausing | None = None) -> Adapter:
    """`Engine.load_adapter`: checked, sent (replacing a name already loaded) inside `pausing()`,
    and recorded in `adapters`; replacing one counts one more version index in `weights`."""
    conn.check_ready()
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if not isinstance(pinned, bool):
        raise TypeError(f"pinned must be True or False, got {pinned!r}")
    adapters.require_lora("load_adapter()")
    started = time.perf_counter()
    if isinstance(adapter, (str, os.PathLike)):
        source = _lora.from_directory(adapter)
    elif _lora.is_peft_model(adapter):
        source = _lora.from_peft_model(adapter, adapter_name=adapter_name)
    else:
        raise TypeError(f"adapter must be a PEFT adapter directory or a PEFT model, got {type(adapter).__name__}; "
                        "for a full model's weights use update_weights()")
    reason = _lora.refusal(source, max_rank=conn.server_info.get("max_lora_rank"),
                           served_modules=_served_modules(conn))
    if reason is not None:
        raise AdapterError(f"the server cannot take adapter {name!r}: {reason}")
    replaced = name in adapters.by_name
    with pausing() if pausing is not None else contextlib.nullcontext():
        if replaced:
            unload_adapter(conn, control, adapters, name)
        try:
            _send_adapter(conn, control, server, name, source, pinned=pinned)
        except AdapterError as err:
            if _ALREADY_LOADED not in str(err):
                raise
            # Loaded under this name before this Engine attached (a kept server): replaced, as above.
            _lora_control(control, "/unload_lora_adapter", {"lora_name": name}, what=f"unload_adapter({name!r})")
            _send_adapter(conn, control, server, name, source, pinned=pinned)
            replaced = True
        if replaced and weights is not None:
            weights.advance()  # the adapter's rows are sampled by other weights from here on
    loaded = Adapter(name=name, source=source.path or "tensors", rank=source.rank,
                     target_modules=source.target_modules, sha256=source.sha256,
                     load=adapters.next_load(name), seconds=time.perf_counter() - started)
    adapters.by_name[name] = loaded
    return loaded


def _send_adapter(conn: Connection, control: ServerControl, server: ServerHandle, name: str,
                  source: _lora.AdapterSource, *, pinned: bool) -> None:
    if source.path is not None:
        body: dict[str, Any] = {"lora_name": name, "lora_path": source.path, "pinned": pinned}
        _lora_control(control, "/load_lora_adapter", body, what=f"load_adapter({name!r})")
        return
    transport = _adapter_transport(conn, server, source)
    body = _lora.from_tensors_body(name, source, transport=transport, pinned=pinned,
                                   tp_size=int(conn.server_info.get("tp_size") or 1))
    try:
        _lora_control(control, "/load_lora_adapter_from_tensors", body, what=f"load_adapter({name!r})")
    finally:
        del body
        if transport is Transport.IPC:
            collect_ipc()


def unload_adapter(conn: Connection, control: ServerControl, adapters: AdapterSet, name: str) -> None:
    """`Engine.unload_adapter`: the adapter removed from the server and from `adapters`."""
    conn.check_ready()
    adapters.require_lora("unload_adapter()")
    adapters.check_names([name])
    _lora_control(control, "/unload_lora_adapter", {"lora_name": name}, what=f"unload_adapter({name!r})")
    adapters.by_name.pop(name, None)


def _served_modules(conn: Connection) -> list[str] | None:
    modules = conn.server_info.get("lora_target_modules")
    if isinstance(modules, str):
        return [modules]
    return [str(m) for m in modules] if isinstance(modules, (list, tuple, set)) else None


def _adapter_transport(conn: Connection, server: ServerHandle, source: _lora.AdapterSource) -> Transport:
    """CUDA IPC when SGLang runs on this machine and every tensor is on the server's GPU; by value
    otherwise (the CPU backend, tensors elsewhere, a router, another machine: an adapter is small)."""
    if conn.cpu_backend or conn.behind_router:
        return Transport.VALUE
    devices = {t.device for _, t in source.tensors}
    if any(d.type != "cuda" for d in devices):
        return Transport.VALUE
    gpus = server_gpus(server)
    if gpus is None or any(uuid_key(device_uuid(d.index or 0)) not in gpus for d in devices):
        return Transport.VALUE
    return Transport.IPC


def _lora_control(control: ServerControl, path: str, body: dict[str, Any], *, what: str) -> Any:
    """A LoRA control request; the server's refusal (HTTP 400, `success: false`) as AdapterError."""
    try:
        result = control.post(path, body, what=what)
    except ServerRequestError as err:
        raise AdapterError(f"{what} was refused by the server: {_message(err.body) or err}") from None
    if isinstance(result, Mapping) and result.get("success") is False:
        raise AdapterError(f"{what} was refused by the server: {result.get('error_message')}")
    return result


def _message(body: Any) -> str | None:
    """The `error_message` of a LoRA answer's body (JSON text), else None."""
    import json

    try:
        parsed = json.loads(body) if isinstance(body, (str, bytes)) else body
    except ValueError:
        return str(body) if body else None
    if isinstance(parsed, Mapping):
        return str(parsed.get("error_message") or parsed.get("message") or parsed.get("error") or "") or None
    return None
