"""rlgen.episodes._coalesce: turn requests that arrive together sent as one batched /generate."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlgen.core._errors import RequestError
from rlgen.episodes._coalesce import TurnBatcher


class Client:
    """Answers a batch with one entry per prompt (or what `answers` says), keeping each payload."""

    def __init__(self, answers: Any = None) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.answers = answers

    async def generate(self, payload: dict[str, Any]) -> Any:
        self.payloads.append(payload)
        if self.answers is not None:
            return self.answers
        return [{"output_ids": ids[-1:], "meta_info": {"id": rid}} for ids, rid in zip(payload["input_ids"], payload["rid"])]


async def send(batcher: TurnBatcher, requests: list[tuple[list[int], dict[str, Any], str]]) -> list[Any]:
    return await asyncio.gather(*(batcher.generate(ids, params, rid) for ids, params, rid in requests),
                                return_exceptions=True)


def test_requests_sharing_one_parameters_object_send_it_once() -> None:
    client, shared = Client(), {"max_new_tokens": 4}
    batcher = TurnBatcher(client, max_batch=3)  # type: ignore[arg-type]
    got = asyncio.run(send(batcher, [([1], shared, "a"), ([2], shared, "b"), ([3], shared, "c")]))
    assert [g["meta_info"]["id"] for g in got] == ["a", "b", "c"]
    (payload,) = client.payloads
    assert payload["sampling_params"] is shared and payload["rid"] == ["a", "b", "c"]


def test_requests_with_their_own_parameters_send_a_list() -> None:
    client = Client()
    batcher = TurnBatcher(client, max_batch=2)  # type: ignore[arg-type]
    first, second = {"sampling_seed": 1}, {"sampling_seed": 2}
    asyncio.run(send(batcher, [([1], first, "a"), ([2], second, "b")]))
    assert client.payloads[0]["sampling_params"] == [first, second]


def test_read_makes_each_waiters_item_once_per_batch_and_a_bad_entry_fails_its_waiter_only() -> None:
    answers = [{"output_ids": [1]}, "not a sample", {"output_ids": [3]}]
    calls: list[int] = []

    def read(entries: Any) -> list[Any]:
        calls.append(len(entries))
        return [("read", e["output_ids"][0]) for e in entries]

    batcher = TurnBatcher(Client(answers), max_batch=3, read=read)  # type: ignore[arg-type]
    got = asyncio.run(send(batcher, [([1], {}, "a"), ([2], {}, "b"), ([3], {}, "c")]))
    assert calls == [2]  # the two samples, in one call
    assert got[0] == ("read", 1) and got[2] == ("read", 3)
    assert isinstance(got[1], RequestError) and "not one sample" in str(got[1])


def test_a_batch_that_fails_fails_every_waiter() -> None:
    class Failing(Client):
        async def generate(self, payload: dict[str, Any]) -> Any:
            raise RequestError("the server is gone")

    batcher = TurnBatcher(Failing(), max_batch=2)  # type: ignore[arg-type]
    got = asyncio.run(send(batcher, [([1], {}, "a"), ([2], {}, "b")]))
    assert all(isinstance(g, RequestError) for g in got)


@pytest.mark.parametrize("count", [1, 2])
def test_a_batch_that_does_not_fill_leaves_after_its_linger(count: int) -> None:
    client = Client()
    batcher = TurnBatcher(client, max_batch=8, linger_s=0.01)  # type: ignore[arg-type]
    got = asyncio.run(send(batcher, [([i], {}, str(i)) for i in range(count)]))
    assert len(got) == count and batcher.batches == [count]


def test_a_batch_that_every_member_has_joined_leaves_at_once_not_after_its_linger() -> None:
    async def main() -> tuple[list[Any], float]:
        batcher = TurnBatcher(Client(), max_batch=8, linger_s=5.0, max_wait_s=5.0, members=3)  # type: ignore[arg-type]
        t0 = asyncio.get_running_loop().time()
        got = await send(batcher, [([i], {}, str(i)) for i in range(3)])
        return got, asyncio.get_running_loop().time() - t0

    got, seconds = asyncio.run(main())
    assert len(got) == 3 and seconds < 1.0


def test_a_member_that_leaves_sends_the_batch_the_others_have_joined() -> None:
    async def main() -> tuple[list[Any], float]:
        batcher = TurnBatcher(Client(), max_batch=8, linger_s=5.0, max_wait_s=5.0, members=3)  # type: ignore[arg-type]
        t0 = asyncio.get_running_loop().time()
        waiting = asyncio.ensure_future(send(batcher, [([i], {}, str(i)) for i in range(2)]))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the third member may still join
        batcher.leave()
        return await waiting, asyncio.get_running_loop().time() - t0

    got, seconds = asyncio.run(main())
    assert len(got) == 2 and seconds < 1.0


def test_members_waiting_for_a_batch_in_flight_do_not_hold_the_next_one() -> None:
    class Slow(Client):
        async def generate(self, payload: dict[str, Any]) -> Any:
            if len(self.payloads) == 0:
                self.payloads.append(payload)
                await asyncio.sleep(0.5)  # the first batch's answer comes late
                return [{"output_ids": [0], "meta_info": {}} for _ in payload["rid"]]
            return await super().generate(payload)

    async def main() -> float:
        batcher = TurnBatcher(Slow(), max_batch=2, linger_s=5.0, max_wait_s=5.0, members=3)  # type: ignore[arg-type]
        first = asyncio.ensure_future(send(batcher, [([1], {}, "a"), ([2], {}, "b")]))  # full: sent
        await asyncio.sleep(0.01)
        t0 = asyncio.get_running_loop().time()
        await batcher.generate([3], {}, "c")  # the only member not waiting for an answer
        seconds = asyncio.get_running_loop().time() - t0
        await first
        return seconds

    assert asyncio.run(main()) < 0.4


def test_work_handed_over_runs_after_the_request_has_left_and_before_its_answer() -> None:
    order: list[str] = []

    class Logged(Client):
        async def generate(self, payload: dict[str, Any]) -> Any:
            order.append("request")
            await asyncio.sleep(0.01)
            order.append("answer")
            return await super().generate(payload)

    async def main() -> None:
        batcher = TurnBatcher(Logged(), max_batch=2, linger_s=5.0, max_wait_s=5.0)  # type: ignore[arg-type]
        await asyncio.gather(*(batcher.generate([i], {}, str(i), once_sent=lambda i=i: order.append(f"later {i}"))
                               for i in range(2)))

    asyncio.run(main())
    assert order == ["request", "later 0", "later 1", "answer"]


def test_work_handed_over_runs_even_when_every_waiter_gave_up() -> None:
    ran: list[int] = []

    async def main() -> None:
        batcher = TurnBatcher(Client(), max_batch=8, linger_s=0.01, max_wait_s=1.0)  # type: ignore[arg-type]
        waiter = asyncio.ensure_future(batcher.generate([1], {}, "a", once_sent=lambda: ran.append(1)))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0.05)
        await batcher.close()

    asyncio.run(main())
    assert ran == [1]


@pytest.mark.timeout(60)
def test_work_handed_over_waits_until_the_request_body_has_reached_the_server() -> None:
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rlgen.client._http import Client as HttpClient

    seen: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # a kept-alive connection, as SGLang's

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(time.perf_counter())
            answer = json.dumps([{"output_ids": [1], "meta_info": {"id": rid}} for rid in body["rid"]]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def busy() -> None:  # a turn's bookkeeping, made long
        t = time.perf_counter()
        while time.perf_counter() - t < 0.05:
            pass

    async def main() -> list[float]:
        client = HttpClient(f"http://127.0.0.1:{server.server_address[1]}")
        lags = []
        try:
            for _ in range(3):  # the first opens the connection
                batcher = TurnBatcher(client, max_batch=4, members=4)  # type: ignore[arg-type]
                t0 = time.perf_counter()
                await asyncio.gather(*(batcher.generate([i] * 2000, {}, str(i), once_sent=busy) for i in range(4)))
                lags.append(seen[-1] - t0)
        finally:
            await client.aclose()
        return lags

    try:
        lags = asyncio.run(main())
    finally:
        server.shutdown()
    assert min(lags[1:]) < 0.1, f"the server saw the request {lags} s after it was sent: after the 0.2 s of work"
