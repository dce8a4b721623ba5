"""Responses of the CPU backend's routes: results in SGLang 0.5.x's shapes, and its error bodies.

Owns: carrying `SeqOutput` snapshots from the scheduler thread onto the event loop (`Collector`,
through `loop.call_soon_threadsafe`), shaping one snapshot into SGLang's {"text", "output_ids",
"meta_info"} (logprob tuples with optional token text, cached tokens, e2e latency), JSON
responses, the error bodies SGLang gives a ValueError and a RequestValidationError, and an SSE
stream that holds only an error. The shapes follow docs/sglang-api.md; section numbers in
comments refer to it. Knows nothing about parsing requests, routing, the server's state, the
metrics counters or the runner: the routes pass in the weight version and the token-text lookup.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from rlgen.cpu_server._jobs import SeqOutput
from rlgen.cpu_server._request import Item

__all__ = ["Collector", "json_response", "shape_output", "sse_error", "validation_error", "value_error"]


class Collector:
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


def shape_output(
    out: SeqOutput, item: Item, started: float, *, weight_version: str, token_text: Callable[[int], str]
) -> dict[str, Any]:
    """SGLang's {"text", "output_ids", "meta_info"} for one sequence (1.7)."""
    meta: dict[str, Any] = {
        "id": out.rid,
        "finish_reason": out.finish_reason,
        "prompt_tokens": out.prompt_tokens,
        "weight_version": weight_version,
        "completion_tokens": len(out.output_ids),
        "cached_tokens": out.cached_tokens,
    }
    if item.return_logprob:
        text = token_text if item.return_text_in_logprobs else None
        meta["input_token_logprobs"] = _tuples(out.input_token_logprobs or [], text)
        meta["output_token_logprobs"] = _tuples(out.output_token_logprobs or [], text)
        if item.top_logprobs_num > 0:
            meta["input_top_logprobs"] = [
                None if row is None else _tuples(row, text) for row in out.input_top_logprobs or []
            ]
            meta["output_top_logprobs"] = [_tuples(row, text) for row in out.output_top_logprobs or []]
    if out.finished:
        meta["e2e_latency"] = out.produced_at - started
    shaped: dict[str, Any] = {"text": out.text, "output_ids": out.output_ids, "meta_info": meta}
    if item.prompt_token_ids is not None:  # return_prompt_token_ids (TM adds it to every answer)
        shaped["prompt_token_ids"] = item.prompt_token_ids
    return shaped


def _tuples(entries: list[Any], text: Callable[[int], str] | None) -> list[list[Any]]:
    """SGLang's logprob tuples: [logprob, token_id, text or None]."""
    return [[lp, tid, text(tid) if text else None] for lp, tid in entries]


# ---- JSON and error bodies ------------------------------------------------------------------------------


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def value_error(message: str) -> web.Response:
    """SGLang's _create_error_response: a ValueError becomes 400 {"error": {"message": ...}}."""
    return json_response({"error": {"message": message}}, 400)


def validation_error(message: str) -> web.Response:
    """SGLang's RequestValidationError handler: 400 with an ErrorResponse body."""
    return json_response({"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}, 400)


async def sse_error(request: web.Request, message: str) -> web.StreamResponse:
    """200 and an event stream of one error event, as SGLang answers a stream it could not start."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: " + orjson.dumps({"error": {"message": message}}) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
