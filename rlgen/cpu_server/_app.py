"""The HTTP layer of the CPU backend: aiohttp routes that speak SGLang 0.5.x's native API.

Owns: request parsing and validation (SGLang's `GenerateReqInput` normalization and
`SamplingParams.verify` rules, with its error bodies), turning a /generate request into runner
jobs, shaping `SeqOutput` snapshots into SGLang's response and SSE formats, and the control
endpoints. The shapes follow docs/sglang-api.md; section numbers in comments refer to it.

Threading: everything here runs on the event loop thread, including the tokenizer this module
owns (the runner has its own). Results come back from the scheduler thread through
`loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, cast

import orjson
from aiohttp import web

from rlgen.cpu_server._faults import MidRequestDeath
from rlgen.cpu_server._fields import SAMPLING_FIELDS, FieldTypeError, refusals, sampling_refusals
from rlgen.cpu_server._runner import Job, Runner, SamplingParams, SeqOutput

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


class RequestValidationError(Exception):
    """A wrong field type: SGLang (FastAPI/pydantic) answers 400 with its ErrorResponse body."""


@dataclass
class BackendState:
    """What the routes share: the runner, the app-side tokenizer, and the server's identity."""

    runner: Runner
    tokenizer: Any
    server_args: dict[str, Any]
    model_path: str
    tokenizer_path: str
    served_model_name: str
    weight_version: str = "default"
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

    async def run_jobs(self, jobs: list[Job]) -> list[SeqOutput]:
        """Submit jobs and wait for their final outputs (used by the warm-up and health probes)."""
        collector = _Collector(asyncio.get_running_loop(), len(jobs))
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
        return _json({"object": "error", "message": f"Internal server error: {e!r}", "type": "500", "param": None, "code": 500}, 500)


def _api_key_check(api_key: str) -> Any:
    """SGLang's `--api-key` rule: every route but /health* and /metrics (and OPTIONS) needs
    `Authorization: Bearer <key>`, else 401 {"error": "Unauthorized"}."""
    expected = f"Bearer {api_key}"

    @web.middleware
    async def check(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if request.method == "OPTIONS" or request.path.startswith(("/health", "/metrics")):
            return await handler(request)
        if not hmac.compare_digest(request.headers.get("Authorization", ""), expected):
            return _json({"error": "Unauthorized"}, 401)
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
    for method in ("POST", "PUT"):
        app.router.add_route(method, "/generate", routes.generate)
    app.router.add_post("/abort_request", routes.abort_request)
    app.router.add_post("/update_weights_from_disk", routes.update_weights_from_disk)
    app.router.add_post("/update_weight_version", routes.update_weight_version)
    if state.server_args.get("enable_metrics"):
        app.router.add_get("/metrics", routes.metrics)
    return app


class Routes:
    def __init__(self, state: BackendState) -> None:
        self.state = state

    # ---- /generate ---------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self.state.death.maybe_die()
        started = time.monotonic()
        try:
            body = await _json_body(request)
            fields = _check_generate_types(body)
        except RequestValidationError as e:
            return _validation_error(str(e))
        stream = bool(fields["stream"])
        try:
            plan = _plan_generate(fields, self.state)
        except ValueError as e:
            if stream:  # SGLang validates inside the stream generator: 200 + an error event
                return await _sse_error(request, str(e))
            return _value_error(str(e))
        if stream:
            return await self._stream(request, plan, started)
        return await self._collect(request, plan, started)

    async def _collect(self, request: web.Request, plan: _Plan, started: float) -> web.Response:
        collector = _Collector(asyncio.get_running_loop(), len(plan.jobs))
        self._submit(plan, collector)
        finals = await _wait_or_abort(collector.finals(), request, self.state.runner, plan)
        if finals is None:
            return web.Response(status=499)  # the client left; nobody reads this
        errors = [out.error for out in finals if out.error is not None]
        if errors:
            status, message = errors[0]
            return _json({"object": "error", "message": message, "type": str(status), "param": None, "code": status}, status)
        shaped = [self._shape(out, plan.items[i], started) for i, out in enumerate(finals)]
        return _json(shaped[0] if plan.is_single else shaped)

    async def _stream(self, request: web.Request, plan: _Plan, started: float) -> web.StreamResponse:
        collector = _Collector(asyncio.get_running_loop(), len(plan.jobs))
        self._submit(plan, collector)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            async for index, out in collector.updates():
                if out.error is not None:
                    chunk: dict[str, Any] = {"error": {"message": out.error[1]}}
                else:
                    chunk = self._shape(out, plan.items[index], started)
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

    def _abort_all(self, plan: _Plan) -> None:
        for job in plan.jobs:
            self.state.runner.abort(job.rid)

    def _submit(self, plan: _Plan, collector: _Collector) -> None:
        for index, job in enumerate(plan.jobs):
            job.sink = collector.sink(index)
        self.state.runner.submit(plan.jobs)

    def _shape(self, out: SeqOutput, item: _Item, started: float) -> dict[str, Any]:
        """SGLang's {"text", "output_ids", "meta_info"} for one sequence (1.7)."""
        meta: dict[str, Any] = {
            "id": out.rid,
            "finish_reason": out.finish_reason,
            "prompt_tokens": out.prompt_tokens,
            "weight_version": self.state.weight_version,
            "completion_tokens": len(out.output_ids),
            "cached_tokens": out.cached_tokens,
        }
        if item.return_logprob:
            text = self.state.token_text if item.return_text_in_logprobs else None
            meta["input_token_logprobs"] = _tuples(out.input_token_logprobs or [], text)
            meta["output_token_logprobs"] = _tuples(out.output_token_logprobs or [], text)
            if item.top_logprobs_num > 0:
                meta["input_top_logprobs"] = [
                    None if row is None else _tuples(row, text) for row in out.input_top_logprobs or []
                ]
                meta["output_top_logprobs"] = [_tuples(row, text) for row in out.output_top_logprobs or []]
        if out.finished:
            meta["e2e_latency"] = out.produced_at - started
            if item.log_metrics:
                counters = self.state.counters
                counters["sglang:prompt_tokens_total"] += out.prompt_tokens
                counters["sglang:generation_tokens_total"] += len(out.output_ids)
                counters["sglang:num_requests_total"] += 1
        shaped: dict[str, Any] = {"text": out.text, "output_ids": out.output_ids, "meta_info": meta}
        if item.prompt_token_ids is not None:  # return_prompt_token_ids (TM adds it to every answer)
            shaped["prompt_token_ids"] = item.prompt_token_ids
        return shaped

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
        return _json(
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
            "max_req_input_len": _max_req_input_len(runner),
            "internal_states": [{"num_running_reqs": runner.num_running, "num_waiting_reqs": runner.num_waiting,
                                 "effective_max_running_requests_per_dp": runner.max_running_requests}],
            "version": f"{SGLANG_API_VERSION}+rlgen.cpu",
            "rlgen_backend": "cpu",
        }
        return _json(info)

    async def loads(self, request: web.Request) -> web.Response:
        """SGLang's /v1/loads (core section): requests running and waiting, per DP rank (one here)."""
        runner = self.state.runner
        load = {
            "dp_rank": 0,
            "timestamp": time.time(),
            "num_running_reqs": runner.num_running,
            "num_waiting_reqs": runner.num_waiting,
            "max_running_requests": runner.max_running_requests,
        }
        return _json({"timestamp": datetime.now(timezone.utc).isoformat(), "version": f"{SGLANG_API_VERSION}+rlgen.cpu",
                      "accelerator": None, "num_accelerators": 0, "loads": [load]})  # fmt: skip

    async def weight_version_removed(self, request: web.Request) -> web.Response:
        detail = "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use '/model_info' instead."
        return _json({"detail": detail}, status=404)

    # ---- control -----------------------------------------------------------------------------

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            rid = _typed(body, "rid", (str, type(None)), "a string")
            abort_all = _typed(body, "abort_all", (bool, type(None)), "a boolean")
        except RequestValidationError as e:
            return _validation_error(str(e))
        if abort_all:
            self.state.runner.abort(None)
        elif rid:  # SGLang ignores an empty rid
            self.state.runner.abort(rid)
        return web.Response(status=200)

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

    async def _memory_route(self, request: web.Request, apply: Callable[[list[str] | None], Any]) -> web.Response:
        """Run `apply(tags)` (the body's `tags`; None for all) on the scheduler thread."""
        try:
            tags = _memory_tags_body(await _json_body(request))
        except RequestValidationError as e:
            return _validation_error(str(e))
        await self._on_scheduler(lambda: apply(tags))
        return _json(None)  # SGLang's handler returns None, serialized as `null`

    async def _on_scheduler(self, fn: Callable[[], Any], *, barrier: bool = True) -> Any:
        """Run `fn` on the scheduler thread (see Runner.call) and return its result or raise its error."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        def finish(result: Any, error: BaseException | None) -> None:
            if error is not None:
                loop.call_soon_threadsafe(done.set_exception, error)
            else:
                loop.call_soon_threadsafe(done.set_result, result)

        self.state.runner.call(fn, finish, barrier=barrier)
        return await done

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            path = _typed(body, "model_path", (str,), "a string", required=True)
            version = _typed(body, "weight_version", (str, type(None)), "a string")
            abort_all = _typed(body, "abort_all_requests", (bool, type(None)), "a boolean")
        except RequestValidationError as e:
            return _validation_error(str(e))
        runner = self.state.runner
        if abort_all:
            runner.abort(None)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[bool, str]] = loop.create_future()

        def finish(result: Any, error: BaseException | None) -> None:
            outcome = (False, f"Failed to update weights: {error}") if error else result
            loop.call_soon_threadsafe(done.set_result, outcome)

        # Runs once in-flight requests finish, like SGLang's model_update_lock writer.
        runner.call(lambda: runner.reload_weights(path), finish)
        success, message = await done
        if success:
            self.state.model_path = path
            self.state.served_model_name = path
            if version is not None:
                self.state.weight_version = version
                message += f" Weight version updated to {version}."
        payload = {"success": success, "message": message, "num_paused_requests": 0}
        return _json(payload, 200 if success else 400)

    async def update_weight_version(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            version = _typed(body, "new_version", (str,), "a string", required=True)
            abort_all = _typed(body, "abort_all_requests", (bool, type(None)), "a boolean")
        except RequestValidationError as e:
            return _validation_error(str(e))
        if abort_all:
            self.state.runner.abort(None)
        self.state.weight_version = version
        return _json({"success": True, "message": f"Weight version updated to {version}", "new_version": version})


# ---- /generate planning: SGLang's normalize_batch_and_arguments + per-request validation -------------


@dataclass
class _Item:
    """Per-output settings needed to shape the response."""

    return_logprob: bool
    top_logprobs_num: int
    return_text_in_logprobs: bool
    log_metrics: bool = True
    prompt_token_ids: list[int] | None = None


@dataclass
class _Plan:
    is_single: bool
    jobs: list[Job]
    items: list[_Item]  # aligned with jobs (already expanded for n, grouped by prompt)


def _check_generate_types(body: Any) -> dict[str, Any]:
    """The pydantic type checks FastAPI runs on GenerateReqInput (wrong type: 400), and the fields
    of _fields.GENERATE_FIELDS at a value the CPU backend refuses (reported by _plan_generate)."""
    if not isinstance(body, dict):
        raise RequestValidationError("Input should be a valid dictionary or object: body")
    try:
        refused = refusals(body)
    except FieldTypeError as e:
        raise RequestValidationError(str(e)) from e
    return {
        "refused": refused,
        "text": _typed(body, "text", (str, list, type(None)), "a string or a list of strings", items=(str,)),
        "input_ids": _typed_input_ids(body),
        "sampling_params": _typed(body, "sampling_params", (dict, list, type(None)), "an object or a list", items=(dict,)),
        "rid": _typed(body, "rid", (str, list, type(None)), "a string or a list of strings", items=(str,)),
        "return_logprob": _typed(body, "return_logprob", (bool, list, type(None)), "a boolean", items=(bool,)),
        "logprob_start_len": _typed(body, "logprob_start_len", (int, list, type(None)), "an integer", items=(int,)),
        "top_logprobs_num": _typed(body, "top_logprobs_num", (int, list, type(None)), "an integer", items=(int,)),
        "return_text_in_logprobs": _typed(body, "return_text_in_logprobs", (bool, type(None)), "a boolean") or False,
        "stream": _typed(body, "stream", (bool, type(None)), "a boolean") or False,
        "log_metrics": _typed(body, "log_metrics", (bool, type(None)), "a boolean") is not False,
        "return_prompt_token_ids": _typed(body, "return_prompt_token_ids", (bool, type(None)), "a boolean") or False,
        "routed_dp_rank": _typed(body, "routed_dp_rank", (int, type(None)), "an integer"),
    }


def _plan_generate(fields: dict[str, Any], state: BackendState) -> _Plan:
    """Normalize like GenerateReqInput, tokenize, validate, and expand n (1.2, 1.3)."""
    text, input_ids, sampling = fields["text"], fields["input_ids"], fields["sampling_params"]
    if fields["refused"]:
        raise ValueError("; ".join(fields["refused"]) + ".")
    dp_rank = fields["routed_dp_rank"]
    if dp_rank is not None and dp_rank != 0:  # SGLang's check, with dp_size 1
        raise ValueError(f"routed_dp_rank={dp_rank} out of range [0, 1)")
    if text is None and input_ids is None:
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        is_single = isinstance(text, str)
        batch_size = 1 if is_single else len(text)
    else:
        if len(input_ids) == 0:
            raise ValueError("input_ids cannot be empty.")
        is_single = isinstance(input_ids[0], int)
        batch_size = 1 if is_single else len(input_ids)

    if is_single:
        text = [text] if text is not None else None
        input_ids = [input_ids] if input_ids is not None else None
    n = _parallel_sample_num(sampling)
    if n > 1:
        is_single = False  # a single prompt with n > 1 becomes a batch of one (list response)

    # SGLang tokenizes `text` but generates from `input_ids` when both are given (1.2).
    prompts = input_ids if input_ids is not None else _tokenize(state, text)
    if len(prompts) != batch_size:
        raise ValueError("text and input_ids describe different batch sizes.")
    rids = _per_prompt_rids(fields["rid"], batch_size, is_single)
    sampling_list = _per_prompt(sampling if sampling is not None else {}, batch_size, n, "sampling_params")
    logprob = _per_prompt(fields["return_logprob"], batch_size, n, "return_logprob", False)
    starts = _per_prompt(fields["logprob_start_len"], batch_size, n, "logprob_start_len", -1)
    tops = _per_prompt(fields["top_logprobs_num"], batch_size, n, "top_logprobs_num", 0)

    jobs: list[Job] = []
    items: list[_Item] = []
    for i, prompt in enumerate(prompts):
        prompt = list(prompt)
        params = _sampling_params(sampling_list[i], prompt, state.runner)
        start = _logprob_start(bool(logprob[i]), starts[i], len(prompt))
        if tops[i] < 0:
            raise ValueError(f"top_logprobs_num must be at least 0, got {tops[i]}.")
        for _ in range(n):
            # With n > 1 SGLang gives every sample a fresh rid and drops the caller's (1.2).
            rid = uuid.uuid4().hex if n > 1 else rids[i]
            jobs.append(
                Job(rid=rid, input_ids=prompt, params=params, sink=_no_sink, return_logprob=bool(logprob[i]),
                    logprob_start_len=start, top_logprobs_num=tops[i], stream=fields["stream"])
            )  # fmt: skip
            items.append(_Item(bool(logprob[i]), tops[i], bool(fields["return_text_in_logprobs"]), fields["log_metrics"],
                               prompt if fields["return_prompt_token_ids"] else None))  # fmt: skip
    return _Plan(is_single=is_single, jobs=jobs, items=items)


def _tokenize(state: BackendState, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return [list(ids) for ids in state.tokenizer(texts)["input_ids"]]


def _parallel_sample_num(sampling: Any) -> int:
    if sampling is None:
        return 1
    if isinstance(sampling, dict):
        n = sampling.get("n", 1)
    else:
        if not sampling:
            return 1
        n = sampling[0].get("n", 1)
        if any(sp.get("n", 1) != n for sp in sampling):
            raise ValueError("The parallel_sample_num should be the same for all samples in sample params.")
    n = 1 if n is None else n
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}.")
    return n


def _per_prompt_rids(rid: Any, batch_size: int, is_single: bool) -> list[str]:
    if is_single:
        return [rid if isinstance(rid, str) else uuid.uuid4().hex]
    if rid is None:
        return [uuid.uuid4().hex for _ in range(batch_size)]
    if isinstance(rid, str):  # SGLang 0.5.17 keeps a batch of one's rid as it is
        return [rid] if batch_size == 1 else [f"{rid}_{i}" for i in range(batch_size)]
    if len(rid) != batch_size:
        raise ValueError("The specified rids length mismatch with the batch_size for batch processing.")
    if len(set(rid)) != len(rid):
        duplicates = sorted({r for r in rid if rid.count(r) > 1})
        raise ValueError(f"Duplicate request IDs detected within the request: {duplicates}")
    return list(rid)


def _per_prompt(value: Any, batch_size: int, n: int, name: str, default: Any = None) -> list[Any]:
    """A scalar applies to every prompt; a list gives one value per prompt."""
    if value is None:
        return [default] * batch_size
    if not isinstance(value, list):
        return [value] * batch_size
    if n > 1 and name != "sampling_params":
        raise ValueError(f"Cannot use list {name} with parallel_sample_num > 1")
    if len(value) != batch_size:
        # SGLang fails here with an IndexError (HTTP 500); a clear 400 serves callers better.
        raise ValueError(f"The length of {name} ({len(value)}) should be equal to the batch size ({batch_size}).")
    return value


def _logprob_start(return_logprob: bool, start: int, prompt_len: int) -> int:
    """Resolve logprob_start_len like SGLang's scheduler (1.6)."""
    if start == -1 or not return_logprob:
        return prompt_len - 1
    if start < 0:
        raise ValueError(f"logprob_start_len must be -1 or at least 0, got {start}.")
    if start >= prompt_len:
        raise ValueError(
            f"req.logprob_start_len={start} is higher than the number of input tokens "
            f"len(req.origin_input_ids)={prompt_len}. Please use a smaller logprob_start_len."
        )
    return start


def _max_req_input_len(runner: Runner) -> int:
    # SGLang: max_req_len = context_len - 1, max_req_input_len = max_req_len - 5.
    return runner.context_length - 1 - 5


def _sampling_params(raw: dict[str, Any], prompt: list[int], runner: Runner) -> SamplingParams:
    """SGLang's SamplingParams.__post_init__ + verify(), plus the length checks (1.4)."""
    _check_prompt(prompt, runner)
    unknown = sorted(set(raw) - set(SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"Unknown sampling parameters: {unknown}")
    try:
        refused = sampling_refusals(raw)
    except FieldTypeError as e:  # SGLang: a TypeError in SamplingParams (500); here a ValueError (400)
        raise ValueError(str(e)) from e
    if refused:
        raise ValueError("; ".join(refused) + ".")

    # These raise ValueError, not TypeError: the route turns ValueError into SGLang's 400 body.
    def number(name: str, default: float) -> float:
        value = raw.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"sampling_params.{name} must be a number, got {value!r}.")
        return float(value)

    def integer(name: str, default: int | None) -> int | None:
        value = raw.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"sampling_params.{name} must be an integer, got {value!r}.")
        return value

    def flag(name: str, default: bool) -> bool:
        value = raw.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"sampling_params.{name} must be a boolean, got {value!r}.")
        return value

    temperature = number("temperature", 1.0)
    top_k = integer("top_k", -1)
    assert top_k is not None
    if 0 <= temperature < 1e-6:  # SGLang: near-zero temperature means greedy
        temperature, top_k = 1.0, 1
    # An explicit null max_new_tokens means "up to the context length" (SGLang keeps None).
    max_new_tokens = integer("max_new_tokens", 128) if "max_new_tokens" not in raw or raw["max_new_tokens"] is not None else None
    params = SamplingParams(
        max_new_tokens=max_new_tokens,  # type: ignore[arg-type]  # None is resolved by _fit_context
        temperature=temperature,
        top_p=number("top_p", 1.0),
        top_k=top_k,
        min_p=number("min_p", 0.0),
        frequency_penalty=number("frequency_penalty", 0.0),
        presence_penalty=number("presence_penalty", 0.0),
        repetition_penalty=number("repetition_penalty", 1.0),
        min_new_tokens=integer("min_new_tokens", 0) or 0,
        stop=_stop_strings(raw.get("stop")),
        stop_token_ids=_stop_token_ids(raw.get("stop_token_ids")),
        ignore_eos=flag("ignore_eos", False),
        skip_special_tokens=flag("skip_special_tokens", True),
        no_stop_trim=flag("no_stop_trim", False),
        sampling_seed=integer("sampling_seed", None),
    )
    _verify(params)
    return _fit_context(params, len(prompt), runner)


def _check_prompt(prompt: list[int], runner: Runner) -> None:
    if not prompt:
        raise ValueError("The input is empty: the prompt has no tokens.")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 or t >= runner.vocab_size for t in prompt):
        raise ValueError(f"The input_ids {prompt} contains values greater than the vocab size ({runner.vocab_size}).")


def _verify(p: SamplingParams) -> None:
    """SGLang's SamplingParams.verify(), same checks and messages."""
    if not math.isfinite(p.temperature) or p.temperature < 0.0:
        raise ValueError(f"temperature must be a non-negative finite number, got {p.temperature}.")
    if not 0.0 < p.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p.top_p}.")
    if not 0.0 <= p.min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {p.min_p}.")
    if p.top_k < 1 and p.top_k != -1:
        raise ValueError(f"top_k must be -1 (disable) or at least 1, got {p.top_k}.")
    if not -2.0 <= p.frequency_penalty <= 2.0:
        raise ValueError(f"frequency_penalty must be in [-2, 2], got {p.frequency_penalty}.")
    if not -2.0 <= p.presence_penalty <= 2.0:
        raise ValueError(f"presence_penalty must be in [-2, 2], got {p.presence_penalty}.")
    if not 0.0 < p.repetition_penalty <= 2.0:
        raise ValueError(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {p.repetition_penalty}.")
    if not p.min_new_tokens >= 0:
        raise ValueError(f"min_new_tokens must be in [0, max_new_tokens], got {p.min_new_tokens}.")
    if p.max_new_tokens is not None:
        if p.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {p.max_new_tokens}.")
        if not p.min_new_tokens <= p.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens({p.max_new_tokens})], got {p.min_new_tokens}."
            )


def _fit_context(p: SamplingParams, prompt_len: int, runner: Runner) -> SamplingParams:
    """The tokenizer manager's length checks, then the scheduler's max_new_tokens clamp."""
    context = runner.context_length
    if prompt_len >= context:
        raise ValueError(f"The input ({prompt_len} tokens) is longer than the model's context length ({context} tokens).")
    if p.max_new_tokens is not None and p.max_new_tokens + prompt_len > context:
        raise ValueError(
            f"Requested token count exceeds the model's maximum context length of {context} tokens. "
            f"You requested a total of {p.max_new_tokens + prompt_len} tokens: {prompt_len} tokens from the "
            f"input messages and {p.max_new_tokens} tokens for the completion. Please reduce the number of "
            "tokens in the input messages or the completion to fit within the limit."
        )
    limit = _max_req_input_len(runner)
    if prompt_len >= limit:
        raise ValueError(
            f"Input length ({prompt_len} tokens) exceeds the maximum allowed length ({limit} tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        )
    room = (context - 1) - prompt_len - 1
    wanted = p.max_new_tokens if p.max_new_tokens is not None else room
    return replace(p, max_new_tokens=max(0, min(wanted, room)))


def _stop_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise ValueError(f"sampling_params.stop must be a string or a list of strings, got {value!r}.")


def _stop_token_ids(value: Any) -> frozenset[int]:
    if value is None:
        return frozenset()
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return frozenset(value)
    raise ValueError(f"sampling_params.stop_token_ids must be a list of integers, got {value!r}.")


# ---- result plumbing ---------------------------------------------------------------------------------


class _Collector:
    """Receives SeqOutput snapshots from the scheduler thread for one request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[tuple[int, SeqOutput]] = asyncio.Queue()
        self._count = count

    def sink(self, index: int) -> Callable[[SeqOutput], None]:
        def deliver(out: SeqOutput) -> None:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (index, out))

        return deliver

    async def updates(self) -> Any:
        """Yield (index, snapshot) until every sequence has finished."""
        remaining = self._count
        while remaining:
            index, out = await self._queue.get()
            if out.finished:
                remaining -= 1
            yield index, out

    async def finals(self) -> list[SeqOutput]:
        finals: list[SeqOutput | None] = [None] * self._count
        async for index, out in self.updates():
            if out.finished:
                finals[index] = out
        return [out for out in finals if out is not None]


async def _wait_or_abort(
    finals: Any, request: web.Request, runner: Runner, plan: _Plan
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


def _tuples(entries: list[Any], text: Callable[[int], str] | None) -> list[list[Any]]:
    """SGLang's logprob tuples: [logprob, token_id, text or None]."""
    return [[lp, tid, text(tid) if text else None] for lp, tid in entries]


def _no_sink(_: SeqOutput) -> None:  # replaced before submission
    pass


# ---- body parsing and error bodies ----------------------------------------------------------------------


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RequestValidationError(f"JSON decode error: {e}") from e


def _typed(
    body: dict[str, Any],
    name: str,
    types: tuple[type, ...],
    expected: str,
    *,
    items: tuple[type, ...] | None = None,
    required: bool = False,
) -> Any:
    if not isinstance(body, dict):
        raise RequestValidationError("Input should be a valid dictionary or object: body")
    if name not in body:
        if required:
            raise RequestValidationError(f"Field required: body.{name}")
        return None
    value = body[name]
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if ok and isinstance(value, list) and items is not None:
        ok = all(isinstance(v, items) and not (isinstance(v, bool) and bool not in items) for v in value)
    if not ok:
        raise RequestValidationError(f"Input should be {expected}: body.{name} (got {value!r:.80})")
    return value


def _memory_tags_body(body: Any) -> list[str] | None:
    """The `tags` of a release/resume body (ReleaseMemoryOccupationReqInput); None means all."""
    return cast("list[str] | None", _typed(body, "tags", (list, type(None)), "a list of strings", items=(str,)))


def _typed_input_ids(body: dict[str, Any]) -> list[Any] | None:
    value = body.get("input_ids")
    if value is None:
        return None

    def is_id(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(value, list) and (all(is_id(v) for v in value) or all(
        isinstance(row, list) and all(is_id(v) for v in row) for row in value
    )):  # fmt: skip
        return value
    raise RequestValidationError(f"Input should be a list of integers or a list of lists: body.input_ids (got {value!r:.80})")


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def _value_error(message: str) -> web.Response:
    """SGLang's _create_error_response: a ValueError becomes 400 {"error": {"message": ...}}."""
    return _json({"error": {"message": message}}, 400)


def _validation_error(message: str) -> web.Response:
    """SGLang's RequestValidationError handler: 400 with an ErrorResponse body."""
    return _json({"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}, 400)


async def _sse_error(request: web.Request, message: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: " + orjson.dumps({"error": {"message": message}}) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
