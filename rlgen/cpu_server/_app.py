"""The HTTP layer of the CPU backend: aiohttp routes that speak SGLang 0.5.x's native API.

Owns: the aiohttp application (routes, the `--api-key` rule, a handler's bug answered as SGLang's
500 body), what the routes share (`BackendState`: the runner, the event loop's tokenizer, the
server's identity, weight version, pause gate, readiness and metrics counters), /generate's flow
(wait at the pause gate, submit the planned jobs, answer whole or as an SSE stream, abort the jobs
when the client leaves), health, info, loads and metrics, and the control endpoints (abort,
pause and continue, flush, memory release and resume, weight updates, which run on the scheduler
thread through `Runner.call`: at once while paused, else once running requests have finished, as
SGLang's model_update_lock; the GC freeze, which is the whole process's). It composes what knows
less: `_request` parses and validates bodies, `_response` shapes results and error bodies,
`_pause` holds requests while paused and marks the aborted ones, `_lora_api` serves the LoRA
endpoints and resolves a /generate's `lora_path` (the adapters stay in use until the request has
finished). The shapes follow docs/sglang-api.md; section numbers in comments refer to it. Knows
nothing about tensors, batching or sampling: the runner is reached only through its thread-safe API.

Threading: everything here runs on the event loop thread, including the tokenizer this module
owns (the runner has its own). Results come back from the scheduler thread through
`loop.call_soon_threadsafe` (`_response.Collector`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

import orjson
from aiohttp import web

from rlgen.cpu_server._faults import MidRequestDeath
from rlgen.cpu_server._jobs import Job, SamplingParams, SeqOutput, on_scheduler
from rlgen.cpu_server._lora_api import LoraApi
from rlgen.cpu_server._pause import PauseGate, RequestAborted
from rlgen.cpu_server._request import (
    Item,
    Plan,
    RequestValidationError,
    check_generate_types,
    continue_body,
    max_req_input_len,
    memory_tags_body,
    parse_body,
    pause_body,
    plan_generate,
    typed,
)
from rlgen.cpu_server._response import (
    Collector,
    json_response,
    open_sse,
    shape_output,
    validation_error,
    value_error,
    write_sse_error,
)
from rlgen.cpu_server._runner import Runner
from rlgen.cpu_server._tool_parsers import ToolParserError, parse_function_call

__all__ = ["SGLANG_API_VERSION", "BackendState", "build_app"]

logger = logging.getLogger("rlgen.cpu_server")

# The SGLang version whose API this backend speaks; `/server_info` reports it with a marker.
SGLANG_API_VERSION = "0.5.17"

# /health: SGLang gives up after 20 s without any scheduler output (HEALTH_CHECK_TIMEOUT).
_HEALTH_TIMEOUT_S = 20.0
# A running batch that stepped this recently counts as healthy without queueing a probe.
_RECENT_PROGRESS_S = 1.0
# How often a waiting /generate checks whether its client left: SGLang's tokenizer manager wakes
# every 4 s to ask (TokenizerManager._wait_one_response). A client that leaves should abort its
# requests itself (rlgen does) rather than rely on this.
_DISCONNECT_CHECK_S = 4.0
_FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, "
    "the operation will not be performed.)\n"
)


@dataclass
class BackendState:
    """What the routes share: the runner, the app-side tokenizer, and the server's identity."""

    runner: Runner
    tokenizer: Any
    server_args: dict[str, Any]
    model_path: str
    tokenizer_path: str
    served_model_name: str
    lora: LoraApi
    weight_version: str = "default"
    gate: PauseGate = field(default_factory=PauseGate)
    ready: bool = False
    death: MidRequestDeath = field(default_factory=MidRequestDeath)
    # Prometheus counters under SGLang's metric names (served at /metrics with --enable-metrics)
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total"), 0.0))
    _token_texts: dict[int, str] = field(default_factory=dict)

    def token_text(self, token_id: int) -> str:
        """One token decoded alone, as SGLang's return_text_in_logprobs does (cached)."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id])
        return text

    def collector(self, count: int) -> Collector:
        """A Collector for `count` sequences, stamping each snapshot with the weight version."""
        return Collector(asyncio.get_running_loop(), count, version=lambda: self.weight_version)

    async def run_jobs(self, jobs: list[Job]) -> list[SeqOutput]:
        """Submit jobs and wait for their final outputs (used by the warm-up and health probes)."""
        collector = self.collector(len(jobs))
        for index, job in enumerate(jobs):
            job.sink = collector.sink(index)
        self.runner.submit(jobs)
        return await collector.finals()


@web.middleware
async def _internal_errors(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """A bug in a handler answers 500 with SGLang's HTTPException body; the server keeps serving."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as e:
        logger.exception("Error handling %s %s", request.method, request.path)
        return json_response({"object": "error", "message": f"Internal server error: {e!r}", "type": "500", "param": None, "code": 500}, 500)


def _api_key_check(api_key: str) -> Any:
    """SGLang's `--api-key` rule: every route but /health* and /metrics (and OPTIONS) needs
    `Authorization: Bearer <key>`, else 401 {"error": "Unauthorized"}."""
    expected = f"Bearer {api_key}"

    @web.middleware
    async def check(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if request.method == "OPTIONS" or request.path.startswith(("/health", "/metrics")):
            return await handler(request)
        if not hmac.compare_digest(request.headers.get("Authorization", ""), expected):
            return json_response({"error": "Unauthorized"}, 401)
        return await handler(request)

    return check


def build_app(state: BackendState, *, api_key: str | None = None) -> web.Application:
    middlewares = [_internal_errors] if not api_key else [_api_key_check(api_key), _internal_errors]
    app = web.Application(client_max_size=1 << 30, middlewares=middlewares)  # big prompt batches are normal
    routes = Routes(state)
    app.router.add_get("/health", routes.health)
    app.router.add_get("/health_generate", routes.health)
    app.router.add_get("/model_info", routes.get_model_info)
    app.router.add_get("/server_info", routes.get_server_info)
    # The names before SGLang 0.5.17, which still serves them (with a deprecation warning).
    app.router.add_get("/get_model_info", routes.get_model_info)
    app.router.add_get("/get_server_info", routes.get_server_info)
    for path in ("/get_weight_version", "/weight_version"):  # a 404 since SGLang 0.5.17, as there
        app.router.add_route("GET", path, routes.weight_version_removed)
    app.router.add_get("/v1/loads", routes.loads)
    for method in ("GET", "POST"):
        app.router.add_route(method, "/flush_cache", routes.flush_cache)
        app.router.add_route(method, "/release_memory_occupation", routes.release_memory_occupation)
        app.router.add_route(method, "/resume_memory_occupation", routes.resume_memory_occupation)
        app.router.add_route(method, "/freeze_gc", routes.freeze_gc)
    for method in ("POST", "PUT"):
        app.router.add_route(method, "/generate", routes.generate)
    app.router.add_post("/abort_request", routes.abort_request)
    app.router.add_post("/pause_generation", routes.pause_generation)
    app.router.add_post("/continue_generation", routes.continue_generation)
    app.router.add_post("/update_weights_from_disk", routes.update_weights_from_disk)
    app.router.add_post("/update_weights_from_tensor", routes.update_weights_from_tensor)
    app.router.add_post("/update_weight_version", routes.update_weight_version)
    app.router.add_post("/parse_function_call", routes.parse_function_call)
    app.router.add_post("/load_lora_adapter", state.lora.load_lora_adapter)
    app.router.add_post("/load_lora_adapter_from_tensors", state.lora.load_lora_adapter_from_tensors)
    app.router.add_post("/unload_lora_adapter", state.lora.unload_lora_adapter)
    if state.server_args.get("enable_metrics"):
        app.router.add_get("/metrics", routes.metrics)
    return app


class Routes:
    def __init__(self, state: BackendState) -> None:
        self.state = state

    # ---- /generate ---------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's order: the body's types, then (a stream's 200 and headers, then) the pause gate,
        the LoRA adapters, tokenization and validation, the scheduler. A ValueError after the types
        is 400 `{"error": ...}`, or 200 and an error event in a stream; an abort that caught the
        request before the scheduler is 499 (RequestAborted)."""
        self.state.death.maybe_die()
        started = time.monotonic()
        try:
            body = await _json_body(request)
            fields = check_generate_types(body)
        except RequestValidationError as e:
            return validation_error(str(e))
        response = await open_sse(request) if fields["stream"] else None
        runner = self.state.runner
        lora_ids = None  # the request's LoRA adapters, in use until it has finished
        try:
            async with self.state.gate.passage(_logical_rids(fields["rid"])) as ticket:
                try:
                    lora_ids = await self.state.lora.acquire(fields["lora_path"])
                    plan = plan_generate(fields, self.state.tokenizer, vocab_size=runner.vocab_size,
                                         context_length=runner.context_length, lora_ids=lora_ids)  # fmt: skip
                    ticket.check()  # SGLang checks again after tokenizing
                except ValueError as e:
                    return await _failed(e, response)
                if response is not None:
                    return await self._stream(response, plan, started)
                return await self._collect(request, plan, started)
        except RequestAborted as e:  # held at the pause gate when an abort came
            return await _failed(e, response)
        finally:
            self.state.lora.release(lora_ids)

    async def _collect(self, request: web.Request, plan: Plan, started: float) -> web.Response:
        collector = self.state.collector(len(plan.jobs))
        self._submit(plan, collector)
        finals = await _wait_or_abort(collector.finals(), request, self.state.runner, plan)
        if finals is None:
            return web.Response(status=499)  # the client left; nobody reads this
        errors = [out.error for out in finals if out.error is not None]
        if errors:
            status, message = errors[0]
            return json_response({"object": "error", "message": message, "type": str(status), "param": None, "code": status}, status)
        shaped = [self._shape(out, plan.items[i], started) for i, out in enumerate(finals)]
        return json_response(shaped[0] if plan.is_single else shaped)

    async def _stream(self, response: web.StreamResponse, plan: Plan, started: float) -> web.StreamResponse:
        collector = self.state.collector(len(plan.jobs))
        self._submit(plan, collector)
        try:
            async for index, out in collector.updates():
                if out.error is not None:
                    chunk: dict[str, Any] = {"error": {"message": out.error[1]}}
                else:
                    chunk = self._shape(out, plan.items[index], started, stream=True)
                    if not plan.is_single:
                        chunk["index"] = index  # SGLang tags batch stream chunks (1.8)
                await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:  # the client went away: stop generating for it
            self._abort_all(plan)
        except asyncio.CancelledError:
            self._abort_all(plan)
            raise
        return response

    def _abort_all(self, plan: Plan) -> None:
        for job in plan.jobs:
            self.state.runner.abort(job.rid)

    def _submit(self, plan: Plan, collector: Collector) -> None:
        for index, job in enumerate(plan.jobs):
            job.sink = collector.sink(index)
        self.state.runner.submit(plan.jobs)

    def _shape(self, out: SeqOutput, item: Item, started: float, *, stream: bool = False) -> dict[str, Any]:
        """One sequence's answer (1.7); a finished one counts in the metrics unless log_metrics is off."""
        if out.finished and item.log_metrics:
            counters = self.state.counters
            counters["sglang:prompt_tokens_total"] += out.prompt_tokens
            counters["sglang:generation_tokens_total"] += len(out.output_ids)
            counters["sglang:num_requests_total"] += 1
        return shape_output(out, item, started, weight_version=self.state.weight_version,
                            token_text=self.state.token_text, stream=stream)

    # ---- health and info ---------------------------------------------------------------------

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text format, as SGLang's /metrics with --enable-metrics (a small subset)."""
        label = f'{{model_name="{self.state.served_model_name}"}}'
        lines = []
        for name, value in self.state.counters.items():
            lines += [f"# TYPE {name} counter", f"{name}{label} {value}"]
        lines += ["# TYPE sglang:num_running_reqs gauge", f"sglang:num_running_reqs{label} {self.state.runner.num_running}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def health(self, request: web.Request) -> web.Response:
        """200 once the scheduler produces anything (like SGLang's health_generate), else 503."""
        runner = self.state.runner
        if not self.state.ready:
            return web.Response(status=503)
        # SGLang's probe is a /generate: while paused it waits at the gate, and gets no answer in time.
        if not await self.state.gate.wait_open(_HEALTH_TIMEOUT_S):
            return web.Response(status=503)
        tic = time.monotonic()
        if runner.busy:
            if tic - runner.last_progress < _RECENT_PROGRESS_S:
                return web.Response(status=200)
            while time.monotonic() - tic < _HEALTH_TIMEOUT_S:
                await asyncio.sleep(0.05)
                if runner.last_progress > tic:
                    return web.Response(status=200)
            return web.Response(status=503)
        probe = Job(
            rid=f"HEALTH_CHECK_{time.time()}",
            input_ids=[0],
            params=SamplingParams(max_new_tokens=1, temperature=0.0),
            sink=lambda _: None,
        )
        try:
            await asyncio.wait_for(self.state.run_jobs([probe]), _HEALTH_TIMEOUT_S)
        except asyncio.TimeoutError:
            return web.Response(status=503)
        return web.Response(status=200)

    async def get_model_info(self, request: web.Request) -> web.Response:
        state = self.state
        return json_response(
            {
                "model_path": state.model_path,
                "tokenizer_path": state.tokenizer_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": state.weight_version,
            }
        )

    async def get_server_info(self, request: web.Request) -> web.Response:
        state = self.state
        runner = state.runner
        info = {
            **state.server_args,
            "model_path": state.model_path,
            "served_model_name": state.served_model_name,
            "weight_version": state.weight_version,
            "max_total_num_tokens": runner.max_running_requests * runner.context_length,
            "max_req_input_len": max_req_input_len(runner.context_length),
            "internal_states": [{"num_running_reqs": runner.num_running, "num_waiting_reqs": runner.num_waiting,
                                 "effective_max_running_requests_per_dp": runner.max_running_requests}],
            "version": f"{SGLANG_API_VERSION}+rlgen.cpu",
            "rlgen_backend": "cpu",
        }
        return json_response(info)

    async def loads(self, request: web.Request) -> web.Response:
        """SGLang's /v1/loads (core section): requests running and waiting, per DP rank (one here)."""
        runner = self.state.runner
        load = {
            "dp_rank": 0,
            "timestamp": time.time(),
            "num_running_reqs": runner.num_running,
            "num_waiting_reqs": runner.num_waiting,
            "num_used_tokens": runner.num_used_tokens,
            "max_running_requests": runner.max_running_requests,
        }
        return json_response({"timestamp": datetime.now(timezone.utc).isoformat(), "version": f"{SGLANG_API_VERSION}+rlgen.cpu",
                      "accelerator": None, "num_accelerators": 0, "loads": [load]})  # fmt: skip

    async def weight_version_removed(self, request: web.Request) -> web.Response:
        detail = "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use '/model_info' instead."
        return json_response({"detail": detail}, status=404)

    # ---- control -----------------------------------------------------------------------------

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            rid = typed(body, "rid", (str, type(None)), "a string")
            abort_all = typed(body, "abort_all", (bool, type(None)), "a boolean")
        except RequestValidationError as e:
            return validation_error(str(e))
        if abort_all:
            self._abort(None)
        elif rid:  # SGLang ignores an empty rid
            self._abort(rid)
        return web.Response(status=200)

    def _abort(self, rid: str | None) -> None:
        """SGLang's TokenizerManager.abort_request: the requests with this rid (None: all) that
        have not reached the scheduler end with 499 (`_pause`); the scheduler's end with abort."""
        self.state.gate.mark_aborted(rid)
        self.state.runner.abort(rid)

    async def pause_generation(self, request: web.Request) -> web.Response:
        """SGLang's /pause_generation: new requests wait at the gate from now on, in every mode.
        "abort" aborts every request and answers once all have come back; "in_place" stops the
        scheduler's steps; "retract" also sends its running requests back to the queue without
        their KV. The scheduler answers aborts and control calls meanwhile."""
        try:
            mode = pause_body(await request.read())
        except RequestValidationError as e:
            return validation_error(str(e))
        gate, runner = self.state.gate, self.state.runner
        async with gate.lock:
            gate.close(mode)
            if mode == "abort":
                # The aborts go first, so that requests retracted by an earlier pause answer from
                # the queue; then the scheduler steps again (if an earlier pause stopped it) so that
                # running requests can finish their last step: SGLang would wait for them forever.
                self._abort(None)
                await self._on_scheduler(lambda: runner.pause(None), barrier=False)
                await gate.drain(lambda: self._abort(None))
            else:
                await self._on_scheduler(lambda: runner.pause(mode), barrier=False)
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        """SGLang's /continue_generation: the scheduler steps again, then the held requests go on
        (`torch_empty_cache` has nothing to empty on the CPU)."""
        try:
            continue_body(await request.read())
        except RequestValidationError as e:
            return validation_error(str(e))
        gate, runner = self.state.gate, self.state.runner
        async with gate.lock:
            await self._on_scheduler(lambda: runner.pause(None), barrier=False)
            gate.open()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        """Empty the prefix cache; SGLang answers 400 with the same text while requests run or wait."""
        runner = self.state.runner
        flushed = await self._on_scheduler(runner.flush_cache, barrier=False)
        return web.Response(text=_FLUSH_CACHE_TEXT, status=200 if flushed else 400)

    async def release_memory_occupation(self, request: web.Request) -> web.Response:
        """Free the memory of the body's `tags` (all without tags) once running requests finish."""
        return await self._memory_route(request, self.state.runner.release_memory)

    async def resume_memory_occupation(self, request: web.Request) -> web.Response:
        """Take the memory back; released weights stay without their values until a reload."""
        return await self._memory_route(request, self.state.runner.resume_memory)

    async def freeze_gc(self, request: web.Request) -> web.Response:
        """SGLang's /freeze_gc: `gc.freeze()`, logged as SGLang logs it. SGLang freezes each of its
        three processes (tokenizer manager, scheduler, detokenizer); this backend is one process."""
        before = _gc_object_counts()
        gc.freeze()
        after = _gc_object_counts()
        logger.info("Freezing GC in CPU backend process. " + ", ".join(
            f"gen{i}: {b}->{a}" for i, (b, a) in enumerate(zip(before, after))))
        return web.Response(text="Garbage collection frozen.\n")

    async def _memory_route(self, request: web.Request, apply: Callable[[list[str] | None], Any]) -> web.Response:
        """Run `apply(tags)` (the body's `tags`; None for all) on the scheduler thread."""
        try:
            tags = memory_tags_body(await _json_body(request))
        except RequestValidationError as e:
            return validation_error(str(e))
        await self._on_scheduler(lambda: apply(tags))
        return json_response(None)  # SGLang's handler returns None, serialized as `null`

    async def _on_scheduler(self, fn: Callable[[], Any], *, barrier: bool = True) -> Any:
        """Run `fn` on the scheduler thread (see Runner.call) and return its result or raise its error."""
        return await on_scheduler(self.state.runner, fn, barrier=barrier)

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """SGLang's UpdateWeightFromDiskReqInput: `model_path`, `weight_version`, `flush_cache`
        (default true), `abort_all_requests`; 200 or 400 with {"success", "message",
        "num_paused_requests"}. When (`_update_weights`) as in SGLang."""
        try:
            body = await _json_body(request)
            path = typed(body, "model_path", (str,), "a string", required=True)
            version = typed(body, "weight_version", (str, type(None)), "a string")
            abort_all = typed(body, "abort_all_requests", (bool, type(None)), "a boolean")
            flush = typed(body, "flush_cache", (bool, type(None)), "a boolean") is not False
        except RequestValidationError as e:
            return validation_error(str(e))
        runner = self.state.runner
        success, message = await self._update_weights(
            lambda: runner.reload_weights(path, flush_cache=flush), version, abort_all=bool(abort_all))
        if success:
            self.state.model_path = path
            self.state.served_model_name = path
        payload = {"success": success, "message": message, "num_paused_requests": 0}
        return json_response(payload, 200 if success else 400)

    async def _update_weights(self, load: Callable[[], tuple[bool, str]], version: str | None, *,
                              abort_all: bool) -> tuple[bool, str]:
        """A weight update as SGLang's tokenizer manager runs one: with `abort_all`, every request
        is aborted first; while paused it runs at once (the scheduler refuses flush_cache when the
        pause holds requests); else once the running requests have finished, delaying later ones
        (SGLang's model_update_lock writer). A `weight_version` is taken on success, in the same
        event-loop callback that resolves the update, so every output collected after it carries it."""
        if abort_all:
            self._abort(None)
        gate = self.state.gate
        async with gate.lock:  # a continue does not race an update that runs while paused
            if gate.paused:
                return await self._run_update(load, version, barrier=False)
        return await self._run_update(load, version, barrier=True)

    async def _run_update(self, load: Callable[[], tuple[bool, str]], version: str | None, *,
                          barrier: bool) -> tuple[bool, str]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[bool, str]] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:  # on the event loop
            success, message = (False, f"Failed to update weights: {error}") if error is not None else result
            if success and version is not None:
                self.state.weight_version = version
                message += f" Weight version updated to {version}."
            done.set_result((success, message))

        def finish(result: Any, error: BaseException | None) -> None:  # on the scheduler thread
            loop.call_soon_threadsafe(settle, result, error)

        self.state.runner.call(load, finish, barrier=barrier)
        return await done

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        """SGLang's UpdateWeightsFromTensorReqInput, the tensors by value (`_tensors`): rank 0's entry
        is loaded when `_update_weights` says; 200 or 400 with {"success", "message"}. Where SGLang's
        scheduler would die (an undecodable payload, a shape mismatch), this answers 400."""
        try:
            body = await _json_body(request)
            entries = typed(body, "serialized_named_tensors", (list,), "a list of strings", items=(str,), required=True)
            load_format = typed(body, "load_format", (str, type(None)), "a string")
            flush = typed(body, "flush_cache", (bool, type(None)), "a boolean")
            version = typed(body, "weight_version", (str, type(None)), "a string")
            abort_all = typed(body, "abort_all_requests", (bool, type(None)), "a boolean")
            if not entries:
                raise RequestValidationError("serialized_named_tensors needs one entry per TP rank (1 here)")
        except RequestValidationError as e:
            return validation_error(str(e))
        runner = self.state.runner
        # An undecodable payload or an unknown load format is "Failed to update weights: ...".
        success, message = await self._update_weights(
            lambda: runner.load_tensors(entries[0], load_format, flush_cache=flush is not False), version,
            abort_all=bool(abort_all))
        return json_response({"success": success, "message": message}, 200 if success else 400)

    async def update_weight_version(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            version = typed(body, "new_version", (str,), "a string", required=True)
            abort_all = typed(body, "abort_all_requests", (bool, type(None)), "a boolean")
        except RequestValidationError as e:
            return validation_error(str(e))
        if abort_all is not False:  # UpdateWeightVersionReqInput.abort_all_requests defaults to true
            self._abort(None)
        self.state.weight_version = version
        return json_response({"success": True, "message": f"Weight version updated to {version}", "new_version": version})

    async def parse_function_call(self, request: web.Request) -> web.Response:
        """SGLang's tool-call parsing (`_tool_parsers`: "hermes" only); 400 for a parser it lacks."""
        try:
            return json_response(parse_function_call(await _json_body(request)))
        except (RequestValidationError, ToolParserError) as e:
            return validation_error(str(e))


async def _wait_or_abort(
    finals: Any, request: web.Request, runner: Runner, plan: Plan
) -> list[SeqOutput] | None:
    """Await the results; abort the jobs if the client disconnects first (as SGLang does, and as
    seldom: every _DISCONNECT_CHECK_S)."""
    task = asyncio.ensure_future(finals)
    while True:
        done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_CHECK_S)
        if done:
            return cast("list[SeqOutput] | None", task.result())
        transport = request.transport
        if transport is None or transport.is_closing():
            for job in plan.jobs:
                runner.abort(job.rid)
            task.cancel()
            return None


def _logical_rids(rid: Any) -> tuple[str, ...]:
    """The rids a /generate body names (a string or a list), as an abort by rid matches them."""
    if isinstance(rid, str):
        return (rid,)
    return tuple(rid) if isinstance(rid, list) else ()


async def _failed(error: ValueError, response: web.StreamResponse | None) -> web.StreamResponse:
    """A /generate that failed before the scheduler: 400 `{"error": ...}` (499 for an abort), or
    in a started stream the error event and [DONE]."""
    status = int(getattr(error, "status_code", 400))
    if response is None:
        return value_error(str(error), status)
    with contextlib.suppress(ConnectionResetError):  # the client left; nobody reads this
        await write_sse_error(response, str(error), status)
    return response


def _gc_object_counts() -> list[int]:
    """Objects the collector tracks per generation, counted as SGLang's `gc_object_counts`."""
    return [len(gc.get_objects(generation)) for generation in range(3)]


async def _json_body(request: web.Request) -> Any:
    return parse_body(await request.read())
