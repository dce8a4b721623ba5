"""The HTTP client against small real socket servers on localhost (no SGLang, no model)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from rlgen.client._http import Client
from rlgen.core._errors import RequestError

BODY = b'{"ok": true}'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found"

# A reply that ends with this is sent without it, and then the connection is closed.
CLOSE = b"<close>"

# Answers one HTTP request: the request's path -> the bytes to send back, or None to close the
# connection without an answer. Called with the connection's number (1, 2, ...) too.
Answer = Callable[[int, bytes], bytes | None]


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    """Read one request (headers + Content-Length body); its path, or None if the client closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return head.split(b" ")[1]


@contextlib.asynccontextmanager
async def _serving(answer: Answer) -> AsyncIterator[tuple[Client, list[tuple[int, bytes]]]]:
    """A keep-alive HTTP server answering with `answer`; yields a Client for it and the log of
    (connection number, path) of every request it read."""
    seen: list[tuple[int, bytes]] = []
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        number = connections
        while (path := await _read_request(reader)) is not None:
            seen.append((number, path))
            reply = answer(number, path)
            if reply is None:
                break
            writer.write(reply.removesuffix(CLOSE))
            await writer.drain()
            if reply.endswith(CLOSE):
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    client = Client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        yield client, seen
    finally:
        await client.aclose()
        server.close()


def _run(main: Callable[[], Awaitable[object]]) -> object:
    return asyncio.run(main())  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_a_request_on_a_keep_alive_connection_the_server_drops_is_sent_again() -> None:
    # As uvicorn does when its keep-alive timer fires just as a request arrives: the first
    # connection answers one request, then closes on the next one without answering it.
    answered: list[int] = []

    def answer(connection: int, path: bytes) -> bytes | None:
        if connection == 1 and answered:
            return None
        answered.append(connection)
        return OK

    async def main() -> tuple[list[object], list[tuple[int, bytes]]]:
        async with _serving(answer) as (client, seen):
            return [await client.post("/generate", {"text": "a"}), await client.post("/generate", {"text": "b"})], seen

    answers, seen = _run(main)  # type: ignore[misc]
    assert answers == [{"ok": True}, {"ok": True}]
    # the second request went out on the kept-alive connection, was dropped, and was sent again
    assert seen == [(1, b"/generate"), (1, b"/generate"), (2, b"/generate")]


@pytest.mark.timeout(30)
def test_a_server_that_keeps_dropping_requests_fails_with_a_request_error() -> None:
    async def main() -> list[tuple[int, bytes]]:
        async with _serving(lambda connection, path: None) as (client, seen):
            with pytest.raises(RequestError, match="cannot reach the server"):
                await client.post("/generate", {"text": "a"})
            return seen

    assert len(_run(main)) == 2  # type: ignore[arg-type]  # sent once more, not forever


@pytest.mark.timeout(30)
def test_info_falls_back_to_the_pre_0_5_17_endpoint_names() -> None:
    async def main() -> tuple[object, list[tuple[int, bytes]]]:
        async with _serving(lambda connection, path: OK if path == b"/get_server_info" else NOT_FOUND) as (client, seen):
            return await client.get_info("server"), seen

    info, seen = _run(main)  # type: ignore[misc]
    assert info == {"ok": True}
    assert [path for _, path in seen] == [b"/server_info", b"/get_server_info"]


@pytest.mark.timeout(30)
def test_a_stream_cut_off_midway_fails_with_a_request_error() -> None:
    # As a router passes on a stream whose worker dies: chunked, one chunk, then the connection closes.
    chunk = b'data: {"text": "a", "meta_info": {"finish_reason": null}}\n\n'
    cut = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"%x\r\n%s\r\n" % (len(chunk), chunk) + CLOSE)

    got: list[object] = []

    async def main() -> None:
        async with _serving(lambda connection, path: cut) as (client, _):
            async for piece in client.generate_stream({"input_ids": [1]}):
                got.append(piece)

    with pytest.raises(RequestError, match="broke off before it finished"):
        _run(main)
    assert len(got) == 1  # the chunk before the cut came through


def test_an_answers_logprobs_read_one_float_per_sampled_id_whatever_the_entries() -> None:
    from rlgen.client._answer import read_answer

    def logprobs(entries: Any, ids: list[int]) -> list[float]:
        return read_answer({"output_ids": ids, "meta_info": {"output_token_logprobs": entries}}).token_logprobs()

    assert logprobs([[-0.5, 7, None], [-1.5, 8, "x"]], [7, 8]) == [-0.5, -1.5]
    assert logprobs([[None, 7, None], [-1, 8]], [7, 8]) == [0.0, -1.0]      # None is 0.0
    assert logprobs([[-0.5, 7], [], None], [7, 8, 9]) == [-0.5, 0.0, 0.0]  # empty or missing entries
    assert logprobs([[-0.5, 7]], [7, 8, 9]) == [-0.5, 0.0, 0.0]           # fewer entries than ids
    assert logprobs([[-0.5, 7], [-0.25, 8]], [7]) == [-0.5]               # more entries than ids
    assert logprobs(None, [7]) == [0.0]


def test_request_ids_are_unique_and_name_this_process() -> None:
    from rlgen.client._sender import new_rid

    rids = [new_rid() for _ in range(1000)]
    assert len(set(rids)) == 1000 and all(r.startswith("rlgen-") for r in rids)
    assert len({r.rsplit("-", 1)[0] for r in rids}) == 1  # one prefix per process


def test_the_light_readers_of_an_answer_agree_with_read_answer() -> None:
    from rlgen.client._answer import failed_entry, finish_kind, read_answer, sampled_ids

    entries: list[dict[str, Any]] = [
        failed_entry("x"), failed_entry("gone", reason="abort"), {"error": "boom"}, {"error": {"message": "m"}},
        {"meta_info": {"finish_reason": "length"}}, {"meta_info": {"finish_reason": ""}}, {"meta_info": {}}, {},
        {"meta_info": {"finish_reason": {"type": "stop", "matched": 2}}}, {"meta_info": {"finish_reason": {"type": None}}},
        {"output_ids": [5, 6], "meta_info": {"output_token_logprobs": [[-1.0, 7, None]]}},
        {"meta_info": {"output_token_logprobs": [[-1.0, 7, None], [-2.0, 8, None]]}},
    ]
    for entry in entries:
        read = read_answer(entry)
        assert (finish_kind(entry), sampled_ids(entry)) == (read.finish, read.ids()), entry
