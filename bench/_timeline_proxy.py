"""A pass-through HTTP proxy that notes when each `/generate` request arrives, for the episodes bench's
timeline runs.

Not a benchmark and not a test double: every request (any path, any method) is forwarded to the
upstream server as it came and its answer streamed back as it comes (a JSON answer or SGLang's
server-sent events alike), so that a client pointed at it behaves as against the server itself, one
localhost hop later. For each `POST /generate` it keeps the time its body had fully arrived
(`time.monotonic()`: CLOCK_MONOTONIC, the clock every process of the machine shares, so it compares
with the bench's own `time.monotonic()` stamps) and the body's bytes; the bodies are read only when
asked for. `GET /_timeline` answers `[[arrived, [rid, ...]], ...]` for the requests noted since the
last call (a batch's rids in order; an item without a rid is null) and forgets them.
`episodes.py` starts it (`start_proxy`) for its timeline runs; it exits when the process that
started it is gone.

    python bench/_timeline_proxy.py UPSTREAM_URL PORT
"""

from __future__ import annotations

import sys
import time
from typing import Any

import aiohttp
import orjson
from _instant_server import exit_with_parent
from aiohttp import web

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def rids_of(body: bytes) -> list[Any]:
    """The rids of a /generate body: one per item of a batch (None where it has none)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    ids, rid = data.get("input_ids"), data.get("rid")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return list(rid) if isinstance(rid, list) else [rid] * len(ids)
    return [rid]


def build(upstream: str) -> web.Application:
    upstream = upstream.rstrip("/")
    noted: list[tuple[float, bytes]] = []
    state: dict[str, aiohttp.ClientSession] = {}

    async def timeline(request: web.Request) -> web.Response:
        taken = noted[:]
        del noted[: len(taken)]
        return web.Response(body=orjson.dumps([[t, rids_of(body)] for t, body in taken]),
                            content_type="application/json")

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "POST" and request.path == "/generate":
            noted.append((time.monotonic(), body))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        session = state["session"]
        async with session.request(request.method, upstream + request.path_qs, data=body or None,
                                   headers=headers) as resp:
            out = web.StreamResponse(status=resp.status, headers={
                k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS})
            await out.prepare(request)
            try:
                async for chunk in resp.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
            except ConnectionResetError:  # the client went away (a stream read to its [DONE], then closed)
                pass
            return out

    async def session_ctx(app: web.Application) -> Any:
        state["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                 timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        yield
        await state["session"].close()

    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/_timeline", timeline)
    app.router.add_route("*", "/{tail:.*}", forward)
    app.cleanup_ctx.extend([session_ctx, exit_with_parent])
    return app


if __name__ == "__main__":
    web.run_app(build(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), access_log=None, print=None)
