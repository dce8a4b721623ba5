"""The HTTP side of LoRA serving, as SGLang 0.5.17's tokenizer manager does it: names, in-flight
counts, and the three endpoints.

Owns: the registry of loaded adapters by name (SGLang's `LoRARegistry`: name -> `LoraRef` in
least-recently-used order, in-flight request counts per adapter id) and the cache of every ref
ever loaded (`lora_ref_cache`, from which a /generate naming an unloaded adapter loads it again),
the update lock that serializes loads and unloads, eviction under --max-loaded-loras, the routes
/load_lora_adapter, /load_lora_adapter_from_tensors and /unload_lora_adapter (bodies and
`LoRAUpdateOutput` answers, 200 or 400), and resolving a /generate's `lora_path` to adapter ids
(`acquire`, `release`) with SGLang's error texts (`_validate_and_resolve_lora`,
`_resolve_lora_path`). Read from `managers/tokenizer_control_mixin.py`,
`managers/tokenizer_manager.py` and `lora/lora_registry.py`. Knows nothing about tensors, the
model or batches: loading and unloading run on the scheduler thread through `Runner.call`.

Unloading, as in SGLang: the name leaves the registry at once, then the unload waits until the
requests that use the adapter have finished. A /generate that names it meanwhile or later loads it
again from its path (an adapter loaded from tensors has the path "__tensor__" and cannot be
loaded again that way: that request gets 400 "Failed to implicitly load LoRA adapter ...").
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from aiohttp import web

from rlgen.cpu_server._jobs import on_scheduler
from rlgen.cpu_server._lora_adapter import TENSOR_PATH, update_output
from rlgen.cpu_server._lora_flags import LoraRef
from rlgen.cpu_server._request import RequestValidationError, parse_body, typed
from rlgen.cpu_server._response import json_response, validation_error
from rlgen.cpu_server._runner import Runner

__all__ = ["LoraApi"]

logger = logging.getLogger("rlgen.cpu_server")

_NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."


class LoraApi:
    """SGLang's tokenizer-side LoRA state and routes. Event loop thread only."""

    def __init__(self, runner: Runner, *, enabled: bool, max_loaded_loras: int | None, initial: list[LoraRef]) -> None:
        self.runner = runner
        self.enabled = enabled
        self.max_loaded_loras = max_loaded_loras
        self._registry: OrderedDict[str, LoraRef] = OrderedDict((ref.lora_name, ref) for ref in initial)
        self._ref_cache: dict[str, LoraRef] = {ref.lora_name: ref for ref in initial}
        self._in_flight: dict[str, int] = {ref.lora_id: 0 for ref in initial}
        self._update_lock = asyncio.Lock()
        self._released = asyncio.Event()

    # ---- routes ---------------------------------------------------------------------------------------

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        """LoadLoRAAdapterReqInput {lora_name, lora_path, pinned?}: an adapter from a PEFT directory."""
        try:
            body = parse_body(await request.read())
            ref = LoraRef(_name(body), typed(body, "lora_path", (str,), "a valid string", required=True), _pinned(body))
        except RequestValidationError as e:
            return validation_error(str(e))
        logger.info("Start load Lora adapter. Lora name=%s, path=%s", ref.lora_name, ref.lora_path)
        return _answer(await self.load(ref))

    async def load_lora_adapter_from_tensors(self, request: web.Request) -> web.Response:
        """LoadLoRAAdapterFromTensorsReqInput: the PEFT config as `config_dict`, the tensors by value
        (rank 0's `serialized_named_tensors` entry: base64 of a pickled {name: tensor}, or a
        flattened bucket with `load_format="flattened_bucket"`), optional sha256 `expected_checksums`."""
        try:
            body = parse_body(await request.read())
            name, pinned = _name(body), _pinned(body)
            config = typed(body, "config_dict", (dict,), "a valid dictionary", required=True)
            entries = typed(body, "serialized_named_tensors", (list,), "a list of strings", items=(str,), required=True)
            load_format = typed(body, "load_format", (str, type(None)), "a valid string")
            checksums = typed(body, "expected_checksums", (dict, type(None)), "a valid dictionary")
            added = typed(body, "added_tokens_config", (dict, type(None)), "a valid dictionary")
            if not entries:
                raise RequestValidationError("serialized_named_tensors needs one entry per TP rank (1 here)")
        except RequestValidationError as e:
            return validation_error(str(e))
        logger.info("Start load Lora adapter from tensors. Lora name=%s", name)
        return _answer(await self.load(LoraRef(name, TENSOR_PATH, pinned), entry=entries[0], load_format=load_format,
                                       checksums=checksums, config=config, added_tokens=added))  # fmt: skip

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        """UnloadLoRAAdapterReqInput {lora_name}: waits for the requests that use it, then unloads."""
        try:
            name = _name(parse_body(await request.read()))
        except RequestValidationError as e:
            return validation_error(str(e))
        return _answer(await self.unload(name))

    # ---- loading and unloading --------------------------------------------------------------------------

    async def load(self, ref: LoraRef, **source: Any) -> dict[str, Any]:
        """SGLang's load_lora_adapter(_from_tensors): load on the scheduler, register on success,
        then unload least recently used unpinned adapters beyond --max-loaded-loras."""
        try:
            if not self.enabled:
                raise ValueError(_NOT_ENABLED)
            async with self._update_lock:
                result: dict[str, Any] = await self._on_scheduler(lambda: self.runner.load_adapter(ref, **source))
                if result["success"]:
                    if ref.lora_name in self._registry:
                        raise ValueError(f"LoRA with name {ref.lora_name} already exists. "
                                         f"Loaded LoRAs: {self._registry.keys()}")  # fmt: skip
                    self._registry[ref.lora_name] = ref
                    self._in_flight[ref.lora_id] = 0
                    self._ref_cache[ref.lora_name] = ref
                await self._evict(result)
                return result
        except ValueError as e:
            return update_output(False, str(e), None)

    async def _evict(self, result: dict[str, Any]) -> None:
        while self.max_loaded_loras is not None and len(self._registry) > self.max_loaded_loras:
            lru = next((name for name, ref in self._registry.items() if not ref.pinned), None)
            if lru is None:
                raise ValueError("Didn't find any LoRA adapters when trying to evict LRU LoRA adapter. "
                                 f"LoRA registry is: {self._registry}")  # fmt: skip
            logger.info(f"Unloading least recently used LoRA adapter '{lru}' (current number of adapters: "
                        f"{len(self._registry)}, max allowed: {self.max_loaded_loras})")  # fmt: skip
            unloaded = await self._unload_locked(lru)
            if not unloaded["success"]:
                raise ValueError(f"Error while unloading LRU LoRA adapter '{lru}': {unloaded['error_message']}")
            del result["loaded_adapters"][lru]

    async def unload(self, name: str) -> dict[str, Any]:
        try:
            if not self.enabled:
                raise ValueError(_NOT_ENABLED)
            logger.info("Start unload Lora adapter. Lora name=%s", name)
            async with self._update_lock:
                return await self._unload_locked(name)
        except ValueError as e:
            return update_output(False, str(e), None)

    async def _unload_locked(self, name: str) -> dict[str, Any]:
        ref = self._registry.get(name)
        if ref is None:
            raise ValueError(f"LoRA with name {name} does not exist. Loaded LoRAs: {self._registry.keys()}")
        del self._registry[name]  # new requests naming it load it again (after this unload)
        while self._in_flight.get(ref.lora_id, 0) > 0:
            self._released.clear()
            await self._released.wait()
        self._in_flight.pop(ref.lora_id, None)
        result: dict[str, Any] = await self._on_scheduler(lambda: self.runner.unload_adapter(ref.lora_id))
        return result

    # ---- /generate --------------------------------------------------------------------------------------

    async def acquire(self, lora_path: Any) -> dict[str, str] | None:
        """The adapter id of each name a /generate's `lora_path` holds (a string or a list with
        None for the base), counted as in use until `release`; None when it names none. An
        unloaded name that was loaded before is loaded again from its path. ValueError with
        SGLang's texts; note that SGLang tests the field's truthiness, so `[null, null]` counts as
        asking for LoRA."""
        if not lora_path:
            return None
        if not self.enabled:
            first = lora_path if isinstance(lora_path, str) else next((a for a in lora_path if a), None)
            raise ValueError(f"LoRA adapter '{first}' was requested, but LoRA is not enabled. Please launch the server "
                             "with --enable-lora flag and preload adapters using --lora-paths or /load_lora_adapter "
                             "endpoint.")  # fmt: skip
        names = [lora_path] if isinstance(lora_path, str) else list(dict.fromkeys(lora_path))
        if self.max_loaded_loras is not None and len(names) > self.max_loaded_loras:
            raise ValueError(f"Received request with {len(names)} unique loras requested but max loaded loras is "
                             f"{self.max_loaded_loras}")  # fmt: skip
        for name in [n for n in names if n is not None and n not in self._registry]:
            if name not in self._ref_cache:
                raise ValueError(f"Got LoRA adapter that has never been loaded: {name}\n"
                                 f"All loaded adapters: {self._ref_cache.keys()}.")  # fmt: skip
            logger.info(f"Reloading evicted adapter: {name}")
            cached = self._ref_cache[name]
            result = await self.load(LoraRef(cached.lora_name, cached.lora_path, cached.pinned))
            if not result["success"] and "already loaded" not in (result["error_message"] or ""):
                raise ValueError(f"Failed to implicitly load LoRA adapter {name}: {result['error_message']}")
        ids: dict[str, str] = {}
        for name in names:
            if name is None:
                continue
            ref = self._registry.get(name)
            if ref is None:
                raise ValueError(f"The following requested LoRA adapters are not loaded: {name}\n"
                                 f"Loaded adapters: {self._registry.keys()}.")  # fmt: skip
            self._registry.move_to_end(name)
            ids[name] = ref.lora_id
        for lora_id in ids.values():
            self._in_flight[lora_id] += 1
        return ids

    def release(self, ids: dict[str, str] | None) -> None:
        """The request that `acquire` returned `ids` to has finished (or failed)."""
        for lora_id in (ids or {}).values():
            self._in_flight[lora_id] -= 1
        self._released.set()

    async def _on_scheduler(self, fn: Callable[[], Any]) -> Any:
        """`fn()` on the scheduler thread, between two steps of the running batch."""
        return await on_scheduler(self.runner, fn, barrier=False)

def _name(body: Any) -> str:
    return str(typed(body, "lora_name", (str,), "a valid string", required=True))


def _pinned(body: Any) -> bool:
    return bool(typed(body, "pinned", (bool,), "a valid boolean"))


def _answer(result: dict[str, Any]) -> web.Response:
    return json_response(result, 200 if result["success"] else 400)
