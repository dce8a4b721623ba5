"""Loading LoRA adapters into the server: `Engine.load_adapter` and `unload_adapter`.

Owns: loading an adapter (a PEFT directory through `/load_lora_adapter`, or a PEFT model in memory
through `/load_lora_adapter_from_tensors`: by CUDA IPC when its tensors are on the server's GPU,
else by value; a name already loaded is replaced, also one a kept server held before this Engine
attached), unloading it, the checks before anything is sent (rank and modules within what the
server was started for), and the server's refusals as AdapterError. Knows nothing about how
tensors are serialized or what an adapter's files hold (`client._lora`), or about which adapter a
call's prompts use (`_adapter_choice`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from ..client import _lora
from ..client._tensors import Transport, device_uuid
from ..core._errors import AdapterError, ServerRequestError
from ._adapter_choice import Adapter, AdapterChoiceMixin
from ._weights import WeightsMixin, collect_ipc, uuid_key

__all__ = ["AdaptersMixin"]

# What SGLang 0.5.17 (LoRAManager.validate_new_adapter) and the CPU backend say when a name is taken.
_ALREADY_LOADED = "already loaded"


class AdaptersMixin(WeightsMixin, AdapterChoiceMixin):
    """LoRA adapter methods of `Engine` (mixed into it)."""

    _adapter_loads: dict[str, int]

    def load_adapter(self, name: str, adapter: Any, *, adapter_name: str = "default", pinned: bool = False) -> Adapter:
        """Load a LoRA adapter into the server under `name`; `generate(..., adapter=name)` then samples with it.

        `adapter`: a directory PEFT's `save_pretrained` wrote (the server reads it: it must be on the
        server's machine), or a PEFT model in memory (`peft.PeftModel`; `adapter_name` picks one of
        its adapters): its LoRA tensors go to the server without disk, by CUDA IPC when they are on
        the server's GPU, else by value (an adapter is small). A name already loaded is replaced (e.g.
        the adapter after another training step). `pinned`: SGLang keeps it in GPU memory.

        The server must serve LoRA (`Engine(lora=True)` or `lora={...}`), with a `max_rank` and
        `target_modules` that cover the adapter; AdapterError says what to change otherwise, before
        anything is sent. Returns what the Engine records about it (also in `eng.adapters`).
        """
        self._check_ready()
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if not isinstance(pinned, bool):
            raise TypeError(f"pinned must be True or False, got {pinned!r}")
        self._require_lora("load_adapter()")
        started = time.perf_counter()
        if isinstance(adapter, (str, os.PathLike)):
            source = _lora.from_directory(adapter)
        elif _lora.is_peft_model(adapter):
            source = _lora.from_peft_model(adapter, adapter_name=adapter_name)
        else:
            raise TypeError(f"adapter must be a PEFT adapter directory or a PEFT model, got {type(adapter).__name__}; "
                            "for a full model's weights use update_weights()")
        reason = _lora.refusal(source, max_rank=self._server_info.get("max_lora_rank"),
                               served_modules=self._served_modules())
        if reason is not None:
            raise AdapterError(f"the server cannot take adapter {name!r}: {reason}")
        if name in self._adapters:
            self.unload_adapter(name)
        try:
            self._send_adapter(name, source, pinned=pinned)
        except AdapterError as err:
            if _ALREADY_LOADED not in str(err):
                raise
            # Loaded under this name before this Engine attached (a kept server): replaced, as above.
            self._lora_control("/unload_lora_adapter", {"lora_name": name}, what=f"unload_adapter({name!r})")
            self._send_adapter(name, source, pinned=pinned)
        # which load of this name (the Engine's loads of other names do not count)
        self._adapter_loads[name] = self._adapter_loads.get(name, 0) + 1
        loaded = Adapter(name=name, source=source.path or "tensors", rank=source.rank,
                         target_modules=source.target_modules, sha256=source.sha256,
                         load=self._adapter_loads[name], seconds=time.perf_counter() - started)
        self._adapters[name] = loaded
        return loaded

    def _send_adapter(self, name: str, source: _lora.AdapterSource, *, pinned: bool) -> None:
        if source.path is not None:
            body: dict[str, Any] = {"lora_name": name, "lora_path": source.path, "pinned": pinned}
            self._lora_control("/load_lora_adapter", body, what=f"load_adapter({name!r})")
            return
        transport = self._adapter_transport(source)
        body = _lora.from_tensors_body(name, source, transport=transport, pinned=pinned,
                                       tp_size=int(self._server_info.get("tp_size") or 1))
        try:
            self._lora_control("/load_lora_adapter_from_tensors", body, what=f"load_adapter({name!r})")
        finally:
            del body
            if transport is Transport.IPC:
                collect_ipc()

    def unload_adapter(self, name: str) -> None:
        """Remove adapter `name` from the server (SGLang waits for the requests that use it)."""
        self._check_ready()
        self._require_lora("unload_adapter()")
        self._check_names([name])
        self._lora_control("/unload_lora_adapter", {"lora_name": name}, what=f"unload_adapter({name!r})")
        self._adapters.pop(name, None)

    def _served_modules(self) -> list[str] | None:
        modules = self._server_info.get("lora_target_modules")
        if isinstance(modules, str):
            return [modules]
        return [str(m) for m in modules] if isinstance(modules, (list, tuple, set)) else None

    def _adapter_transport(self, source: _lora.AdapterSource) -> Transport:
        """CUDA IPC when SGLang runs on this machine and every tensor is on the server's GPU; by value
        otherwise (the CPU backend, tensors elsewhere, a router, another machine: an adapter is small)."""
        if self._server_info.get("rlgen_backend") == "cpu" or self._behind_router:
            return Transport.VALUE
        devices = {t.device for _, t in source.tensors}
        if any(d.type != "cuda" for d in devices):
            return Transport.VALUE
        server = self._server_gpus()
        if server is None or any(uuid_key(device_uuid(d.index or 0)) not in server for d in devices):
            return Transport.VALUE
        return Transport.IPC

    def _lora_control(self, path: str, body: dict[str, Any], *, what: str) -> Any:
        """A LoRA control request; the server's refusal (HTTP 400, `success: false`) as AdapterError."""
        try:
            result = self._control(path, body, what=what)
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
