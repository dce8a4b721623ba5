"""An SGLang-shaped server that answers `/generate` at once, for measuring what a client costs.

Not a benchmark and not a test double of SGLang's behaviour: it serves the native API's shape only
(`/generate`, one prompt or a batch, `input_ids` in; `output_ids`, `text` and `meta_info` with
`output_token_logprobs`, `finish_reason`, `prompt_tokens`, `cached_tokens`, `e2e_latency` out;
exactly `max_new_tokens` random ids per sample with `ignore_eos`, else (a request that may end at
EOS) a length drawn from 1..`max_new_tokens`, the last id the model's EOS (its config.json's
`eos_token_id`) when shorter; `stream: true` answered as SGLang's server-sent events, each item's
whole answer in one chunk tagged with its `index`; the info, health, flush and abort routes
rlgen's `Engine.connect` and the benchmarks call), so that a client's time against it is the
client's own work and the HTTP round trip, with no model behind it. `episodes_client.py` starts it
(and tests/test_bench.py, for `episodes.py --server`); it exits when the process that started it
is gone.

    python bench/_instant_server.py MODEL_DIR SECONDS_PER_REQUEST PORT
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web


def answer(ids: list[int], sampling: dict[str, Any], rid: Any, rng: random.Random, delay: float,
           eos: int | None = None) -> dict[str, Any]:
    k = int(sampling.get("max_new_tokens", 16))
    finish: dict[str, Any] = {"type": "length", "length": k}
    if eos is not None and not sampling.get("ignore_eos"):
        k = rng.randint(1, k)
        if k < int(sampling.get("max_new_tokens", 16)):
            finish = {"type": "stop", "matched": eos}
    out = [rng.randrange(100, 30000) for _ in range(k)]
    if finish["type"] == "stop":
        out[-1] = eos
    meta = {"id": rid, "finish_reason": finish, "prompt_tokens": len(ids),
            "completion_tokens": k, "cached_tokens": 0, "e2e_latency": delay, "weight_version": "default",
            "output_token_logprobs": [[-1.25, t, None] for t in out]}
    return {"text": "x" * (3 * k), "output_ids": out, "meta_info": meta}


def answers(body: dict[str, Any], rng: random.Random, delay: float, eos: int | None = None) -> Any:
    """What /generate answers to `body`: one entry, or a list for a batch (a list of `input_ids`,
    with one `sampling_params` for all or one each, and a list of rids or none)."""
    ids, sampling, rid = body.get("input_ids"), body.get("sampling_params") or {}, body.get("rid")
    if ids and isinstance(ids[0], list):
        params = sampling if isinstance(sampling, list) else [sampling] * len(ids)
        rids = rid if isinstance(rid, list) else [None] * len(ids)
        return [answer(i, s, r, rng, delay, eos) for i, s, r in zip(ids, params, rids)]
    return answer(ids, sampling, rid, rng, delay, eos)


def eos_id(model: str) -> int | None:
    """The model's EOS id from its config.json (the first, if a list), or None."""
    try:
        found = json.loads((Path(model) / "config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError):
        return None
    found = found[0] if isinstance(found, list) and found else found
    return found if isinstance(found, int) else None


def build(model: str, delay: float) -> web.Application:
    rng = random.Random(0)
    eos = eos_id(model)

    async def generate(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if delay:
            await asyncio.sleep(delay)
        answered = answers(body, rng, delay, eos)
        if not body.get("stream"):
            return web.Response(body=orjson.dumps(answered), content_type="application/json")
        # streamed (SGLang's server-sent events): each item's whole answer in one chunk, tagged with
        # its index in the batch, then [DONE]
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for index, one in enumerate(answered if isinstance(answered, list) else [answered]):
            await out.write(b"data: " + orjson.dumps({**one, "index": index}) + b"\n\n")
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    info = {"model_path": model, "tokenizer_path": model, "served_model_name": model, "is_generation": True,
            "context_length": 32768, "version": "0.5.17+instant", "weight_version": "default",
            "max_total_num_tokens": 10**8, "max_req_input_len": 32000,
            "internal_states": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]}

    async def show(request: web.Request) -> web.Response:
        return web.json_response(info)

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=1 << 30)
    for method in ("POST", "PUT"):
        app.router.add_route(method, "/generate", generate)
    for path in ("/model_info", "/server_info", "/get_model_info", "/get_server_info"):
        app.router.add_get(path, show)
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, ok)
    for method in ("GET", "POST"):
        app.router.add_route(method, "/flush_cache", ok)
    app.router.add_post("/abort_request", ok)

    app.cleanup_ctx.append(exit_with_parent)
    return app


async def exit_with_parent(app: web.Application) -> Any:
    """An app's cleanup context that ends the process once its parent is gone: the bench that
    started it was killed, and nothing else would stop it."""
    parent = os.getppid()

    async def watch() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(0.5)
        os._exit(0)

    task = asyncio.ensure_future(watch())
    yield
    task.cancel()


if __name__ == "__main__":
    web.run_app(build(sys.argv[1], float(sys.argv[2])), host="127.0.0.1", port=int(sys.argv[3]), access_log=None,
                print=None)
