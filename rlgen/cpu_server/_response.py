"""Responses of the CPU backend's routes: results in SGLang 0.5.x's shapes, and its error bodies.

Owns: carrying `SeqOutput` snapshots from the scheduler thread onto the event loop (`Collector`,
through `loop.call_soon_threadsafe`, each stamped there with the weight version of that moment),
shaping one snapshot into SGLang's {"text", "output_ids", "meta_info"} (logprob tuples with
optional token text, cached tokens, retractions, e2e latency; the shorter answer SGLang's tokenizer
manager builds for a request aborted in the waiting queue), JSON responses, the error bodies SGLang
gives a ValueError (with its status: 499 for a request aborted before it reached the scheduler) and
a RequestValidationError, and SSE streams' error events. The shapes follow docs/sglang-api.md;
section numbers in comments refer to it. Knows nothing about parsing requests, routing, the
server's state, the metrics counters or the runner: the routes pass in the weight version and the
token-text lookup.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from rlgen.cpu_server._jobs import SeqOutput
from rlgen.cpu_server._request import Item

__all__ = ["Collector", "json_response", "open_sse", "shape_output", "validation_error", "value_error", "write_sse_error"]


class Collector:
    """Receives SeqOutput snapshots from the scheduler thread for one request.

    `version` gives the server's weight version; each snapshot is stamped with it when it reaches
    the event loop, in the order the scheduler sent them, so a snapshot taken after a weight update
    carries the new version (the update's own answer sets it in a callback queued before them).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int, version: Callable[[], str] | None = None) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[tuple[int, SeqOutput]] = asyncio.Queue()
        self._count = count
        self._version = version

    def sink(self, index: int) -> Callable[[SeqOutput], None]:
        def deliver(out: SeqOutput) -> None:
            self._loop.call_soon_threadsafe(self._arrive, index, out)

        return deliver

    def _arrive(self, index: int, out: SeqOutput) -> None:
        if self._version is not None:
            out.weight_version = self._version()
        self._queue.put_nowait((index, out))

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


def shape_output(
    out: SeqOutput, item: Item, started: float, *, weight_version: str, token_text: Callable[[int], str],
    stream: bool = False,
) -> dict[str, Any]:
    """SGLang's {"text", "output_ids", "meta_info"} for one sequence (1.7). The weight version is
    the one stamped on the snapshot when it arrived, else `weight_version`."""
    version = out.weight_version if out.weight_version is not None else weight_version
    if out.queue_abort:
        return _queue_abort_output(out, item, started, version, token_text, stream=stream)
    meta: dict[str, Any] = {
        "id": out.rid,
        "finish_reason": out.finish_reason,
        "prompt_tokens": out.prompt_tokens,
        "weight_version": version,
        "num_retractions": out.num_retractions,
        "completion_tokens": len(out.output_ids),
        "cached_tokens": out.cached_tokens,
    }
    _add_logprobs(meta, out, item, token_text)
    if out.finished:
        meta["e2e_latency"] = out.produced_at - started
    shaped: dict[str, Any] = {"text": out.text, "output_ids": out.output_ids, "meta_info": meta}
    if item.prompt_token_ids is not None:  # return_prompt_token_ids (TM adds it to every answer)
        shaped["prompt_token_ids"] = item.prompt_token_ids
    return shaped


def _queue_abort_output(out: SeqOutput, item: Item, started: float, version: str,
                        token_text: Callable[[int], str], *, stream: bool) -> dict[str, Any]:
    """The answer SGLang's tokenizer manager builds itself for a request the scheduler aborted in
    its waiting queue (TokenizerManager._handle_abort_req): no prompt_tokens, cached_tokens or
    num_retractions, the output so far (a retracted request's), and in a stream only the last of
    its output ids."""
    meta: dict[str, Any] = {"id": out.rid, "finish_reason": out.finish_reason, "weight_version": version,
                            "e2e_latency": out.produced_at - started}  # fmt: skip
    _add_logprobs(meta, out, item, token_text)
    meta["completion_tokens"] = len(out.output_ids)
    return {"text": out.text, "output_ids": out.output_ids[-1:] if stream else out.output_ids, "meta_info": meta}


def _add_logprobs(meta: dict[str, Any], out: SeqOutput, item: Item, token_text: Callable[[int], str]) -> None:
    if not item.return_logprob:
        return
    text = token_text if item.return_text_in_logprobs else None
    meta["input_token_logprobs"] = _tuples(out.input_token_logprobs or [], text)
    meta["output_token_logprobs"] = _tuples(out.output_token_logprobs or [], text)
    if item.top_logprobs_num > 0:
        meta["input_top_logprobs"] = [None if row is None else _tuples(row, text) for row in out.input_top_logprobs or []]
        meta["output_top_logprobs"] = [_tuples(row, text) for row in out.output_top_logprobs or []]


def _tuples(entries: list[Any], text: Callable[[int], str] | None) -> list[list[Any]]:
    """SGLang's logprob tuples: [logprob, token_id, text or None]."""
    return [[lp, tid, text(tid) if text else None] for lp, tid in entries]


# ---- JSON and error bodies ------------------------------------------------------------------------------


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def value_error(message: str, status: int = 400) -> web.Response:
    """SGLang's _create_error_response: a ValueError becomes {"error": {"message": ...}}, with the
    error's status_code (400 unless it has one: 499 for a request aborted before the scheduler)."""
    return json_response({"error": {"message": message}}, status)


def validation_error(message: str) -> web.Response:
    """SGLang's RequestValidationError handler: 400 with an ErrorResponse body."""
    return json_response({"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}, 400)


async def open_sse(request: web.Request) -> web.StreamResponse:
    """A started event stream: 200 and its headers go out at once, as SGLang's StreamingResponse
    sends them before its generator runs (a stream held by a pause has its headers already)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    return response


async def write_sse_error(response: web.StreamResponse, message: str, code: int = 400) -> web.StreamResponse:
    """End a started stream with SGLang 0.5.17's error event (http_server.generate_request: a
    ValueError while streaming) and [DONE]; `code` is the error's status_code."""
    event = {"error": {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}}
    await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
